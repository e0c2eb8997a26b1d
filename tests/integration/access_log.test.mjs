// access_log.test.mjs — regression tests, run by CTest as gateway_regress_access_log. Each check below was a bug
// (found by the hardening tests, since fixed); the text says what it was.
//
// 1. A client that disconnects mid-stream is billed in the ledger for the tokens produced, but
//    its access log line (status 499) is written at abort time, before the worker's usage is
//    known: it shows output_tokens 0 while the ledger bills N > 0. The access log is documented
//    to carry each request's usage (issue 11, "Metrics and logs").
// 2. Duplicate object keys in a request body are accepted (last one wins): json_loadb runs
//    without JSON_REJECT_DUPLICATES, so {"model":"a","model":"b"} is served as model b.
//    reliability-ecosystem.md B11 asks for duplicate keys to be rejected with a 400.
// And one feature check: log rotation. SIGHUP reopens the access log's path, so a file moved
// away keeps the lines written before the signal and the new file gets the ones after.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { MODEL, gatewayConfig, startGateway, stopGateway, writeConfig, RawConn, postBytes, metric, readLedger, sleep } from './harness.mjs';

let dir, gw;
before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kvgw-regress-'));
  gw = await startGateway(writeConfig(dir, gatewayConfig(dir)));
});
after(async () => {
  if (gw) await stopGateway(gw, 'SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

test('the access log line of a 499 carries the usage the ledger billed', async () => {
  const c = new RawConn(gw.port);
  await c.ready;
  c.write(postBytes('/v1/messages', { model: MODEL, max_tokens: 4000, stream: true, messages: [{ role: 'user', content: 'a long story' }] }));
  await c.until(() => (c.buf.toString('latin1').match(/event: content_block_delta/g) ?? []).length >= 3, 30000);
  const rid = c.buf.toString('latin1').match(/\r\nrequest-id: (\S+)\r\n/)[1];
  c.destroy();
  const t0 = Date.now();
  while (Date.now() - t0 < 10000 && (await metric(gw.base, 'kvgw_requests_in_flight')) !== 0) await sleep(50);
  let ev;
  while (Date.now() - t0 < 10000 && !(ev = readLedger(join(dir, 'ledger'), { allowTornTail: true }).events.find((e) => e.request_id === rid))) await sleep(50);
  assert.ok(ev && ev.output >= 3);
  // The gateway flushes the access log every quarter second.
  let line;
  while (Date.now() - t0 < 10000 && !(line = readFileSync(join(dir, 'access.log'), 'utf8').trim().split('\n').filter(Boolean).map((l) => JSON.parse(l)).find((l) => l.request_id === rid))) await sleep(50);
  assert.ok(line, 'the request is in the access log');
  assert.equal(line.status, 499);
  assert.equal(line.output_tokens, ev.output, 'output tokens: access log vs ledger');
  assert.equal(line.input_tokens + line.cache_read + line.cache_write_5m + line.cache_write_1h,
    ev.uncached + ev.read + ev.write_5m + ev.write_1h, 'prompt tokens: access log vs ledger');
});

test('duplicate keys in a request body -> 400', async () => {
  const r = await fetch(gw.base + '/v1/messages', {
    method: 'POST',
    headers: { 'x-api-key': 'sk-test-a', 'content-type': 'application/json' },
    body: `{"model":"no-such-model","model":"${MODEL}","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`,
  });
  const j = await r.json();
  assert.equal(r.status, 400, JSON.stringify(j));
  assert.equal(j.error.type, 'invalid_request_error');
});

test('SIGHUP reopens the access log (rotation)', async () => {
  const logPath = join(dir, 'access.log');
  const lines = (p) => readFileSync(p, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
  const ask = async () => {
    const r = await fetch(gw.base + '/v1/messages/count_tokens', {
      method: 'POST',
      headers: { 'x-api-key': 'sk-test-a', 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'rotate me' }] }),
    });
    assert.equal(r.status, 200);
    return r.headers.get('request-id');
  };
  const waitLine = async (p, rid) => {
    for (const t0 = Date.now(); Date.now() - t0 < 5000; await sleep(50))
      if (lines(p).some((l) => l.request_id === rid)) return true;
    return false;
  };
  const before = await ask();
  assert.ok(await waitLine(logPath, before), 'the first line is in the log');
  renameSync(logPath, logPath + '.1');
  gw.proc.kill('SIGHUP');
  // The reopen is logged once done; wait for it rather than for a fixed time.
  for (const t0 = Date.now(); Date.now() - t0 < 5000 && !/reopened the access log/.test(gw.stderr()); ) await sleep(20);
  assert.match(gw.stderr(), /reopened the access log/);
  const after_ = await ask();
  assert.ok(await waitLine(logPath, after_), 'the line after SIGHUP is in the new file');
  const old = lines(logPath + '.1');
  assert.ok(old.some((l) => l.request_id === before), 'the old file keeps its lines');
  assert.ok(!old.some((l) => l.request_id === after_), 'nothing after SIGHUP goes to the old file');
  assert.equal((await fetch(gw.base + '/healthz')).status, 200, 'the gateway is still up');
});
