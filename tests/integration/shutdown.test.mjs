// shutdown.test.mjs — regression tests, run by CTest as gateway_regress_shutdown. Each check below was a bug
// (found by the hardening tests, since fixed); the text says what it was.
//
// `kvgw serve` dies with SIGSEGV on SIGTERM when a storage event is written at shutdown (any
// live cache entry): the teardown calls meter_storage, then bill_ledger_close (whose writer
// thread wakes the loop through ledger_wake after the final sync) and sets s->ledger = NULL;
// the following uv_run(&loop, UV_RUN_NOWAIT) runs on_ledger_wake, which calls
// bill_ledger_durable_seq(NULL). Core backtrace: bill_ledger_durable_seq <- on_ledger_wake <-
// uv_run <- kvgw_cmd_serve. It fails crash_loop's clean stop in about 2 of 3 runs. A fix: close
// (or ignore, when s->ledger is NULL) the ledger_wake handle before the ledger is closed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { MODEL, KEY, gatewayConfig, startGateway, stopGateway, writeConfig } from './harness.mjs';

test('SIGTERM with a live cache entry exits 0 (10 tries)', async () => {
  const d = mkdtempSync(join(tmpdir(), 'kvgw-regress-stop-'));
  try {
    const cfg = writeConfig(d, gatewayConfig(d));
    for (let i = 0; i < 10; i++) {
      const gw = await startGateway(cfg);
      const r = await fetch(gw.base + '/v1/messages', {
        method: 'POST', headers: { 'content-type': 'application/json', 'x-api-key': KEY },
        body: JSON.stringify({ model: MODEL, max_tokens: 2, system: [{ type: 'text', text: 'Be terse. '.repeat(30), cache_control: { type: 'ephemeral' } }], messages: [{ role: 'user', content: 'x' }] }),
      });
      assert.equal(r.status, 200);
      await r.text();
      const e = await stopGateway(gw, 'SIGTERM');
      assert.deepEqual(e, { code: 0, signal: null }, `try ${i}: ${gw.stderr()}`);
    }
  } finally {
    rmSync(d, { recursive: true, force: true });
  }
});
