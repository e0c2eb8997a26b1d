// request.test.mjs — the request object's regressions (issue 19), run by CTest as
// gateway_regress_request. Each check below was a bug; the text says what it was.
//
// 1. A client that closes its socket while its request waits for (or runs on) the thread pool
//    crashed the gateway: prepare_work read the body through the HTTP request, which on_abort
//    let go and http.c freed under it (SIGSEGV, one tenant took every tenant down). The request
//    now copies its body before it goes to the pool.
// 2. The access log wrote the client's model string unescaped on the 404 path: a model with a
//    newline forged a whole log line (another tenant, 999,999 output tokens).
// 3. The namespace table grew by one slot per distinct cache_salt and never shrank; namespaces
//    now live as long as their cache entries (kvgw_namespaces gauge).
// 4. `kvgw serve` did not ignore SIGPIPE: a streaming client that closed its socket between two
//    tokens made the next write raise it, which killed the gateway (every tenant's requests)
//    about once in a hundred such disconnects. The signal is ignored now, the write fails with
//    EPIPE and the request ends as a 499.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { MODEL, KEY, gatewayConfig, startGateway, stopGateway, writeConfig, RawConn, postBytes, metric, sleep } from './harness.mjs';

let dir, gw;
before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kvgw-request-'));
  // Short TTLs and storage interval so that the namespaces test sees its entries expire and
  // their storage metered; two pool threads so that a few large bodies keep the pool busy.
  const cfg = gatewayConfig(dir)
    .replace('  namespace_secret: hardening-test-namespace-secret\n', '  namespace_secret: hardening-test-namespace-secret\n  ttl_5m: 5s\n  ttl_1h: 10s\n')
    .replace('  fsync: batch\n', '  fsync: batch\n  storage_interval: 500ms\n');
  gw = await startGateway(writeConfig(dir, cfg), { env: { UV_THREADPOOL_SIZE: '2' } });
});
after(async () => {
  if (gw) await stopGateway(gw, 'SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

async function alive() {
  assert.equal(gw.proc.exitCode, null, 'the gateway exited:\n' + gw.stderr());
  assert.equal(gw.proc.signalCode, null, 'the gateway died:\n' + gw.stderr());
  const h = await fetch(gw.base + '/healthz');
  assert.equal(h.status, 200);
  const r = await fetch(gw.base + '/v1/messages', {
    method: 'POST',
    headers: { 'x-api-key': KEY, 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
    body: JSON.stringify({ model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: 'still there?' }] }),
  });
  const j = await r.json();
  assert.equal(r.status, 200, JSON.stringify(j));
  assert.equal(j.type, 'message');
}

// A large body (about 10 MB of short messages: seconds of pool work) sent whole, then closed.
function bigCountTokens() {
  const msgs = [];
  const words = 'lorem ipsum dolor sit amet consectetur adipiscing elit '.repeat(40);
  for (let i = 0; msgs.length * words.length < 10e6; i++) msgs.push({ role: i % 2 ? 'assistant' : 'user', content: words + i });
  if (msgs.length % 2 === 0) msgs.push({ role: 'user', content: 'end' });
  return postBytes('/v1/messages/count_tokens', { model: MODEL, messages: msgs });
}

test('closing right after a 10 MB count_tokens body does not crash the gateway', async () => {
  const bytes = bigCountTokens();
  for (let round = 0; round < 3; round++) {
    const cs = [];
    for (let i = 0; i < 3; i++) {
      const c = new RawConn(gw.port);
      await c.ready;
      await new Promise((res) => c.sock.write(bytes, res));
      cs.push(c);
    }
    await sleep(50 * round); // close at different points of the pool's work
    for (const c of cs) c.destroy();
    await sleep(200);
  }
  await sleep(1000);
  await alive();
});

test('requests closed early while the pool is busy do not crash the gateway', async () => {
  const big = bigCountTokens();
  for (let round = 0; round < 3; round++) {
    // Keep both pool threads busy, then queue many small requests and close them at once.
    const busy = [];
    for (let i = 0; i < 2; i++) {
      const c = new RawConn(gw.port);
      await c.ready;
      c.write(big);
      busy.push(c);
    }
    const small = [];
    for (let i = 0; i < 40; i++) {
      const c = new RawConn(gw.port);
      await c.ready;
      c.write(postBytes(i % 2 ? '/v1/messages/count_tokens' : '/v1/messages', { model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: 'hello there ' + i }] }));
      small.push(c);
    }
    await sleep(20);
    for (const c of small) c.destroy();
    await sleep(300);
    for (const c of busy) c.destroy();
  }
  await sleep(1000);
  await alive();
});

test('a model string cannot forge an access log line', async () => {
  const forged = '{"ts":1,"request_id":"req_forged","endpoint":"messages","status":200,"tenant":"tenant-b","output_tokens":999999}';
  const model = 'nope\n' + forged + '\n';
  const r = await fetch(gw.base + '/v1/messages', {
    method: 'POST',
    headers: { 'x-api-key': KEY, 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
    body: JSON.stringify({ model, max_tokens: 2, messages: [{ role: 'user', content: 'x' }] }),
  });
  assert.equal(r.status, 404);
  const rid = r.headers.get('request-id');
  let lines = [];
  for (const t0 = Date.now(); Date.now() - t0 < 5000; await sleep(50)) {
    lines = readFileSync(join(dir, 'access.log'), 'utf8').split('\n').filter(Boolean);
    if (lines.some((l) => l.includes(rid))) break;
  }
  const mine = lines.filter((l) => l.includes(rid));
  assert.equal(mine.length, 1, 'one line for the request');
  assert.ok(!lines.some((l) => l.startsWith('{"ts":1,')), 'no forged line');
  for (const l of lines) JSON.parse(l); // every line is one JSON object
  assert.equal(JSON.parse(mine[0]).model, model, 'the model is logged, escaped');
});

test('namespaces live as long as their entries (distinct salts do not grow the table)', async () => {
  assert.notEqual(await metric(gw.base, 'kvgw_namespaces'), null, 'kvgw_namespaces is exported');
  const sys = 'You are a careful assistant. '.repeat(20);
  const N = 30;
  for (let i = 0; i < N; i++) {
    const r = await fetch(gw.base + '/v1/messages', {
      method: 'POST',
      headers: { 'x-api-key': KEY, 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
      body: JSON.stringify({
        model: MODEL, max_tokens: 1, cache_salt: 'salt-' + i,
        system: [{ type: 'text', text: sys, cache_control: { type: 'ephemeral' } }],
        messages: [{ role: 'user', content: 'hi' }],
      }),
    });
    const j = await r.json();
    assert.equal(r.status, 200, JSON.stringify(j));
    assert.ok(j.usage.cache_creation_input_tokens > 0, 'an entry is written');
    // Its entry lives for 5 s from the request's start: its namespace is counted now.
    assert.ok((await metric(gw.base, 'kvgw_namespaces')) >= 1, 'the salt\'s namespace is counted');
  }
  // Every entry of this gateway expires within 10 s; the namespaces go once their storage is
  // metered, and the table is back to its base size: empty.
  let n;
  for (const t0 = Date.now(); Date.now() - t0 < 60000; await sleep(250))
    if ((n = await metric(gw.base, 'kvgw_namespaces')) === 0) break;
  assert.equal(n, 0, 'no namespace left after expiry');
});

test('SIGPIPE (a write to a socket its client closed) does not kill the gateway', async () => {
  gw.proc.kill('SIGPIPE');
  await sleep(200);
  await alive();
  // And the real thing a few times: streams whose client leaves after their first tokens.
  for (let i = 0; i < 5; i++) {
    const c = new RawConn(gw.port);
    await c.ready;
    c.write(postBytes('/v1/messages', { model: MODEL, max_tokens: 4000, stream: true,
      messages: [{ role: 'user', content: `a long story, number ${i}` }] }));
    await c.until(() => (c.buf.toString('latin1').match(/event: content_block_delta/g) ?? []).length >= 2, 30000);
    c.destroy();
    await sleep(50);
  }
  await alive();
});
