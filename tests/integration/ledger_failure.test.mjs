// ledger_failure.test.mjs — regression tests, run by CTest as gateway_regress_ledger_failure. Each check below was a bug
// (found by the hardening tests, since fixed); the text says what it was.
//
// After the ledger fails (fsync EIO or disk full, injected with the fail_fsync.c LD_PRELOAD
// shim), later billable requests are refused with 503 as they should be, but:
// 1. the request whose usage event met the failure never gets an answer: it waits in the
//    durable queue (wait_durable) and on_ledger_wake only finishes requests whose seq became
//    durable, so neither a response nor an error is ever sent (the client hangs until its own
//    timeout, the connection and the request stay allocated). Expected: a prompt error (e.g.
//    500/503 "the usage of this request could not be recorded"), never a 200.
// 2. GET /readyz stays 200 while billing is down; reliability-ecosystem.md F6: "Readiness goes
//    false".
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { MODEL, KEY, gatewayConfig, startGateway, stopGateway, writeConfig } from './harness.mjs';

test('after an fsync failure: the in-flight request gets an error, readyz goes 503', async () => {
  const d = mkdtempSync(join(tmpdir(), 'kvgw-regress-ledger-'));
  const so = join(d, 'fail_fsync.so');
  const cc = spawnSync('cc', ['-shared', '-fPIC', '-o', so, 'tests/integration/fail_fsync.c', '-ldl'], { encoding: 'utf8' });
  assert.equal(cc.status, 0, cc.stderr);
  const trigger = join(d, 'FAIL');
  const gw = await startGateway(writeConfig(d, gatewayConfig(d, { fsync: 'always' })), { env: { LD_PRELOAD: so, KVGW_FAIL_TRIGGER: trigger } });
  try {
    writeFileSync(trigger, 'eio');
    let status;
    try {
      const r = await fetch(gw.base + '/v1/messages', {
        method: 'POST', signal: AbortSignal.timeout(5000),
        headers: { 'content-type': 'application/json', 'x-api-key': KEY },
        body: JSON.stringify({ model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: 'x' }] }),
      });
      status = r.status;
      await r.text();
    } catch (e) {
      status = String(e);
    }
    assert.ok(status === 500 || status === 503, 'the request whose event failed gets a prompt error, got: ' + status);
    assert.equal((await fetch(gw.base + '/readyz')).status, 503, 'readyz while billing is down');
  } finally {
    await stopGateway(gw, 'SIGKILL');
    rmSync(d, { recursive: true, force: true });
  }
});
