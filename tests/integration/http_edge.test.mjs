// http_edge.test.mjs — the real `kvgw serve` binary attacked over raw TCP (node:net), the way a
// careless client, a hostile one and a proxy would: pipelining, chunked bodies, Expect:
// 100-continue, request smuggling (CL + TE), header floods, bodies over limits.max_body_bytes,
// a slowloris client, bad JSON and bad types with their exact texts, keep-alive reuse, a client
// that leaves mid-stream (the worker request is cancelled, billed, logged as 499),
// limits.max_connections, pipelined requests whose answers are never read (RSS stays bounded),
// a flood of keyless trickling sockets (keyed requests and /healthz still answered), folded
// header lines, and the request id on every error the server answers itself.
//
// Run: KVGW_BIN=build/bin/kvgw node --test tests/integration/http_edge.test.mjs (from the
// repository root; CTest does this as gateway_http_edge).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  MODEL, KEY, gatewayConfig, startGateway, stopGateway, writeConfig, RawConn, postBytes, metric,
  readLedger, sleep,
} from './harness.mjs';

const MAX_BODY = 4096;
const MAX_HEADERS = 20;
const MAX_HEADER_BYTES = 4096;
const HEADER_TIMEOUT_MS = 600;

let dir, gw;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kvgw-edge-'));
  const cfg = writeConfig(dir, gatewayConfig(dir, {
    limits: `max_body_bytes: ${MAX_BODY}
max_headers: ${MAX_HEADERS}
max_header_bytes: ${MAX_HEADER_BYTES}
header_timeout: ${HEADER_TIMEOUT_MS}ms
body_timeout: 1s`,
  }));
  gw = await startGateway(cfg);
});

after(async () => {
  // A graceful stop after all of the above: exit 0, and under a sanitizer build (KVGW_BIN from
  // a -DKVGW_SANITIZE=ON build) no report of a memory error or a leak.
  if (gw) {
    const { code } = await stopGateway(gw, 'SIGTERM');
    assert.equal(code, 0, gw.stderr());
    assert.doesNotMatch(gw.stderr(), /(Address|Leak|UndefinedBehavior)Sanitizer|runtime error:/);
  }
  rmSync(dir, { recursive: true, force: true });
});

async function conn() {
  const c = new RawConn(gw.port);
  await c.ready;
  return c;
}

const msg = (content, extra = {}) => ({ model: MODEL, max_tokens: 1, messages: [{ role: 'user', content }], ...extra });

// One request on a fresh connection; returns the response.
async function once(bytes, timeoutMs = 15000) {
  const c = await conn();
  c.write(bytes);
  const r = await c.response(timeoutMs);
  c.destroy();
  assert.ok(r, 'a complete response');
  return r;
}

// The server's own errors carry a request id like the handler's: header and body agree.
function assertRequestId(r) {
  assert.match(r.headers['request-id'] ?? '', /^req_[0-9a-f]{24}$/, r.text);
  assert.equal(r.json?.request_id, r.headers['request-id'], r.text);
}

function assertAnthropicError(r, status, type, message) {
  assert.equal(r.status, status, r.text);
  assert.equal(r.json?.type, 'error', r.text);
  assert.equal(r.json.error.type, type, r.text);
  if (message instanceof RegExp) assert.match(r.json.error.message, message);
  else if (message !== undefined) assert.equal(r.json.error.message, message);
}

async function countTokens(content) {
  const r = await once(postBytes('/v1/messages/count_tokens', { model: MODEL, messages: [{ role: 'user', content }] }));
  assert.equal(r.status, 200, r.text);
  return r.json.input_tokens;
}

test('pipelining: three requests in one write, answered in order on one connection', async () => {
  const short = 'hi', long = 'one two three four five six seven eight nine ten eleven twelve';
  const nShort = await countTokens(short), nLong = await countTokens(long);
  assert.ok(nLong > nShort);
  const c = await conn();
  // A generation first (slowest), then two count_tokens that would finish before it if the
  // server answered out of order.
  c.write(Buffer.concat([
    postBytes('/v1/messages', msg(short, { max_tokens: 8 })),
    postBytes('/v1/messages/count_tokens', { model: MODEL, messages: [{ role: 'user', content: long }] }),
    postBytes('/v1/messages/count_tokens', { model: MODEL, messages: [{ role: 'user', content: short }] }),
  ]));
  const a = await c.response(), b = await c.response(), d = await c.response();
  assert.ok(a && b && d, 'three responses');
  assert.equal(a.status, 200, a.text);
  assert.equal(a.json.type, 'message');
  const u = a.json.usage;
  assert.equal(u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens, nShort);
  assert.deepEqual([b.status, b.json], [200, { input_tokens: nLong }]);
  assert.deepEqual([d.status, d.json], [200, { input_tokens: nShort }]);
  const ids = new Set([a, b, d].map((r) => r.headers['request-id']));
  assert.equal(ids.size, 3, 'each response has its own request-id');
  assert.equal(c.closed, false, 'the connection stays open');
  c.destroy();
});

test('chunked request body, split across writes, equals the Content-Length one', async () => {
  const body = JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'chunked bodies arrive in pieces' }] });
  const plain = await once(postBytes('/v1/messages/count_tokens', body));
  assert.equal(plain.status, 200);
  const c = await conn();
  c.write(postBytes('/v1/messages/count_tokens', Buffer.alloc(0), { 'content-length': null, 'transfer-encoding': 'chunked' }));
  const parts = [body.slice(0, 7), body.slice(7, 30), body.slice(30)];
  for (const p of parts) {
    await sleep(30);
    c.write(`${Buffer.byteLength(p).toString(16)}\r\n${p}\r\n`);
  }
  c.write('0\r\n\r\n');
  const r = await c.response();
  c.destroy();
  assert.equal(r.status, 200, r.text);
  assert.deepEqual(r.json, plain.json);
});

test('Expect: 100-continue gets 100 before the body; an oversized one gets 413 instead', async () => {
  const body = Buffer.from(JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'continue?' }] }));
  const c = await conn();
  const head = postBytes('/v1/messages/count_tokens', Buffer.alloc(0), { 'content-length': String(body.length), expect: '100-continue' });
  c.write(head);
  const cont = await c.response(5000);
  assert.ok(cont, 'an interim response before the body was sent');
  assert.equal(cont.status, 100);
  c.write(body);
  const r = await c.response();
  assert.equal(r.status, 200, r.text);
  assert.ok(r.json.input_tokens > 0);
  c.destroy();

  const big = await conn();
  big.write(postBytes('/v1/messages', Buffer.alloc(0), { 'content-length': String(MAX_BODY * 4), expect: '100-continue' }));
  const t = await big.response(5000);
  assert.ok(t, 'a final response without the body');
  assertAnthropicError(t, 413, 'request_too_large', /larger than the limit of 4096 bytes/);
  big.destroy();
});

test('Content-Length with Transfer-Encoding (smuggling) -> 400 in the Anthropic shape, connection closed', async () => {
  const body = '5\r\nhello\r\n0\r\n\r\n';
  const variants = [
    { 'content-length': String(body.length), 'transfer-encoding': 'chunked' },
    { 'transfer-encoding': 'chunked', 'content-length': '3' },
    { 'content-length': String(body.length), 'tRANSFER-ENCODING': 'chunked' },
  ];
  for (const h of variants) {
    const c = await conn();
    c.write(postBytes('/v1/messages', body, h));
    // A second request behind it must never be parsed as its own request.
    c.write(postBytes('/v1/messages/count_tokens', { model: MODEL, messages: [{ role: 'user', content: 'smuggled' }] }));
    const r = await c.response();
    assert.ok(r, 'a response to ' + JSON.stringify(h));
    assertAnthropicError(r, 400, 'invalid_request_error');
    assert.equal(r.headers.connection, 'close');
    assert.ok(await c.waitClosed(5000), 'the connection is closed');
    assert.equal(await c.response(200), null, 'the request behind it got no answer');
    c.destroy();
  }
  // Two different Content-Length values.
  const c = await conn();
  c.write('POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n{}x');
  const r = await c.response();
  assertAnthropicError(r, 400, 'invalid_request_error');
  c.destroy();
});

test('header floods: too many fields and too many bytes -> 431, closed', async () => {
  const many = {};
  for (let i = 0; i < MAX_HEADERS + 5; i++) many[`x-flood-${i}`] = 'v';
  let c = await conn();
  c.write(postBytes('/v1/messages', msg('x'), many));
  let r = await c.response();
  assertAnthropicError(r, 431, 'invalid_request_error', `too many header fields: more than ${MAX_HEADERS}`);
  assert.ok(await c.waitClosed(5000));
  c.destroy();

  c = await conn();
  c.write(postBytes('/v1/messages', msg('x'), { 'x-huge': 'a'.repeat(MAX_HEADER_BYTES * 2) }));
  r = await c.response();
  assertAnthropicError(r, 431, 'invalid_request_error', `request header fields too large: more than ${MAX_HEADER_BYTES} bytes`);
  assert.ok(await c.waitClosed(5000));
  c.destroy();

  // Still serving.
  assert.ok((await countTokens('after the flood')) > 0);
});

test('bodies over limits.max_body_bytes -> 413 request_too_large (Content-Length and chunked)', async () => {
  const pad = 'z'.repeat(MAX_BODY);
  let r = await once(postBytes('/v1/messages', msg(pad)));
  assertAnthropicError(r, 413, 'request_too_large',
    `request body of ${JSON.stringify(msg(pad)).length} bytes is larger than the limit of ${MAX_BODY} bytes`);
  assertRequestId(r);

  // Chunked: no length up front; the limit is counted as the chunks arrive.
  const c = await conn();
  c.write(postBytes('/v1/messages', Buffer.alloc(0), { 'content-length': null, 'transfer-encoding': 'chunked' }));
  for (let i = 0; i < 6; i++) c.write(`400\r\n${'y'.repeat(1024)}\r\n`);
  r = await c.response();
  assert.ok(r, 'an answer before the chunked body ended');
  assertAnthropicError(r, 413, 'request_too_large', `request body larger than the limit of ${MAX_BODY} bytes`);
  c.destroy();

  // Exactly at the limit is accepted as far as the size goes (the JSON is checked next).
  const exact = '{"x":"' + 'a'.repeat(MAX_BODY - 8) + '"}';
  assert.equal(exact.length, MAX_BODY);
  r = await once(postBytes('/v1/messages', exact));
  assertAnthropicError(r, 400, 'invalid_request_error');
});

test('slowloris: headers dribbled past header_timeout -> 408 or close, others unaffected', async () => {
  const c = await conn();
  const t0 = Date.now();
  const line = 'POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-slow: ';
  let i = 0;
  const drip = setInterval(() => { if (!c.closed) c.write(line[i % line.length] ?? 'a'); i++; }, 100);
  try {
    // Meanwhile a normal client is served.
    assert.ok((await countTokens('a normal client')) > 0);
    const closed = await c.waitClosed(HEADER_TIMEOUT_MS + 5000);
    const took = Date.now() - t0;
    assert.ok(closed, 'the dribbling connection was closed');
    assert.ok(took < HEADER_TIMEOUT_MS + 3000, `closed after ${took} ms (header_timeout ${HEADER_TIMEOUT_MS} ms)`);
    const r = c.buf.length ? await c.response(100) : null;
    if (r) assertAnthropicError(r, 408, 'timeout_error');
  } finally {
    clearInterval(drip);
    c.destroy();
  }
  // A body that stops halfway: body_timeout.
  const b = await conn();
  b.write(postBytes('/v1/messages', msg('x')).subarray(0, -5));
  const r = await b.response(5000);
  assert.ok(r, 'a response to the stalled body');
  assertAnthropicError(r, 408, 'timeout_error', 'request body not received in time');
  b.destroy();
});

test('bad JSON, invalid UTF-8 and wrong types -> 400 with exact messages', async () => {
  const cases = [
    ['{"model":"kvgw-demo","max_tokens":5,', /^The request body is not valid JSON: /],
    [Buffer.concat([Buffer.from('{"model":"kvgw-demo","max_tokens":5,"messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xfe]), Buffer.from('"}]}')]),
      /^The request body is not valid JSON: unable to decode byte 0xff/],
    [Buffer.concat([Buffer.from('{"model":"kvgw-demo","max_tokens":5,"messages":[{"role":"user","content":"'), Buffer.from([0xc3, 0x28]), Buffer.from('"}]}')]),
      /^The request body is not valid JSON: unable to decode byte 0xc3/],
    ['{"model":"kvgw-demo","max_tokens":5,"messages":[{"role":"user","content":"\\ud800"}]}', /^The request body is not valid JSON: invalid Unicode '\\uD800'/],
    ['['.repeat(3000), /^The request body is not valid JSON: maximum parsing depth reached/],
    ['[1,2]', 'request body: Input should be an object'],
    [msg('x', { max_tokens: '5' }), 'max_tokens: Input should be a valid integer'],
    [msg('x', { max_tokens: 1.5 }), 'max_tokens: Input should be a valid integer, got a number with a fractional part'],
    [msg('x', { max_tokens: -1 }), 'max_tokens: Input should be greater than or equal to 0'],
    [msg('x', { stream: 'yes' }), 'stream: Input should be a valid boolean'],
    [msg('x', { temperature: 'hot' }), 'temperature: Input should be a valid number'],
    [{ model: MODEL, max_tokens: 5, messages: 'hi' }, 'messages: Input should be a valid list'],
    [{ model: 7, max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }, 'model: Input should be a valid string'],
    [{ max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }, 'model: Field required'],
    [{ model: MODEL, messages: [{ role: 'user', content: 'x' }] }, 'max_tokens: Field required'],
    [{ model: MODEL, max_tokens: 5, messages: [{ role: 'bot', content: 'x' }] }, "messages.0.role: Input should be 'user' or 'assistant'"],
  ];
  for (const [body, want] of cases) {
    const r = await once(postBytes('/v1/messages', typeof body === 'object' && !Buffer.isBuffer(body) ? JSON.stringify(body) : body));
    assertAnthropicError(r, 400, 'invalid_request_error', want);
    assert.equal(r.json.request_id, r.headers['request-id']);
  }
  // The OpenAI endpoint answers in its own shape.
  const o = await once(postBytes('/v1/chat/completions', { model: MODEL, messages: [{ role: 'user', content: 'x' }], temperature: 'hot' }, { authorization: `Bearer ${KEY}`, 'x-api-key': null }));
  assert.equal(o.status, 400);
  assert.deepEqual(o.json, { error: { message: "Invalid type for 'temperature': expected a decimal, but got a string instead.", type: 'invalid_request_error', param: 'temperature', code: 'invalid_type' } });
});

test('keep-alive: many requests reuse one connection; Connection: close ends it', async () => {
  const c = await conn();
  const ids = new Set();
  for (let i = 0; i < 5; i++) {
    c.write(postBytes('/v1/messages/count_tokens', { model: MODEL, messages: [{ role: 'user', content: `turn ${i}` }] }));
    const r = await c.response();
    assert.equal(r.status, 200);
    assert.notEqual(r.headers.connection, 'close');
    ids.add(r.headers['request-id']);
    await sleep(20);
  }
  c.write(postBytes('/v1/messages', msg('bye')));
  const g = await c.response();
  assert.equal(g.status, 200, g.text);
  assert.equal(c.closed, false);
  assert.equal(ids.size, 5);
  c.write(postBytes('/v1/messages/count_tokens', { model: MODEL, messages: [{ role: 'user', content: 'last' }] }, { connection: 'close' }));
  const last = await c.response();
  assert.equal(last.status, 200);
  assert.equal(last.headers.connection, 'close');
  assert.ok(await c.waitClosed(5000), 'closed after Connection: close');
  c.destroy();
});

function accessLog() {
  return readFileSync(join(dir, 'access.log'), 'utf8').trim().split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

test('a client leaving mid-stream: the worker request is cancelled, billed and logged as 499', async () => {
  const c = await conn();
  c.write(postBytes('/v1/messages', msg('tell me a very long story', { max_tokens: 4000, stream: true })));
  await c.until(() => (c.buf.toString('latin1').match(/event: content_block_delta/g) ?? []).length >= 3, 30000);
  const head = c.buf.toString('latin1');
  const rid = head.match(/\r\nrequest-id: (\S+)\r\n/)?.[1];
  assert.ok(rid, 'the stream started: ' + head.slice(0, 300));
  assert.equal(await metric(gw.base, 'kvgw_requests_in_flight'), 1);
  c.destroy();
  const t0 = Date.now();
  let inflight = 1;
  while (Date.now() - t0 < 10000 && (inflight = await metric(gw.base, 'kvgw_requests_in_flight')) !== 0) await sleep(50);
  assert.equal(inflight, 0, 'the worker request was cancelled');
  // 4000 tokens take tens of seconds here: cancelled means it stopped well before.
  let line;
  while (Date.now() - t0 < 10000 && !(line = accessLog().find((l) => l.request_id === rid))) await sleep(50);
  assert.ok(line, 'the request is in the access log');
  assert.equal(line.status, 499);
  // The usage event is in the ledger with the same output.
  let ev;
  while (Date.now() - t0 < 10000 && !(ev = readLedger(join(dir, 'ledger'), { allowTornTail: true }).events.find((e) => e.request_id === rid))) await sleep(50);
  assert.ok(ev, 'the usage event is durable');
  assert.ok(ev.output >= 3 && ev.output < 4000, 'billed what was produced: ' + ev.output);
  assert.equal(ev.status, 4, 'billed as disconnected (BILL_STATUS_DISCONNECTED)');
  assert.equal(ev.uncached + ev.write_5m + ev.write_1h + ev.read, line.input_tokens + line.cache_read + line.cache_write_5m + line.cache_write_1h);
});

test('limits.max_connections: the excess is refused fast, freed slots are reused', async () => {
  const d2 = mkdtempSync(join(tmpdir(), 'kvgw-edge-conn-'));
  const g2 = await startGateway(writeConfig(d2, gatewayConfig(d2, { limits: 'max_connections: 3' })));
  const held = [];
  try {
    for (let i = 0; i < 3; i++) {
      const c = new RawConn(g2.port);
      await c.ready;
      held.push(c);
      // Each one served, so it is surely accepted and counted.
      c.write(postBytes('/v1/messages/count_tokens', { model: MODEL, messages: [{ role: 'user', content: 'x' }] }));
      assert.equal((await c.response()).status, 200);
    }
    const t0 = Date.now();
    const extra = new RawConn(g2.port);
    await extra.ready;
    extra.write(postBytes('/v1/messages/count_tokens', { model: MODEL, messages: [{ role: 'user', content: 'x' }] }));
    const r = await extra.response(5000);
    if (r) assertAnthropicError(r, 503, 'overloaded_error', 'too many connections');
    assert.ok(await extra.waitClosed(5000), 'the excess connection is closed');
    assert.ok(Date.now() - t0 < 2000, 'refused fast');
    extra.destroy();
    // One leaves; a new client gets its slot.
    held.shift().destroy();
    let ok = false;
    for (let i = 0; i < 50 && !ok; i++) {
      const n = new RawConn(g2.port);
      await n.ready;
      n.write(postBytes('/v1/messages/count_tokens', { model: MODEL, messages: [{ role: 'user', content: 'x' }] }));
      const a = await n.response(3000);
      ok = a?.status === 200;
      n.destroy();
      if (!ok) await sleep(100);
    }
    assert.ok(ok, 'a freed slot serves a new client');
  } finally {
    for (const c of held) c.destroy();
    const { code } = await stopGateway(g2, 'SIGTERM');
    assert.equal(code, 0, g2.stderr());
    assert.doesNotMatch(g2.stderr(), /(Address|Leak|UndefinedBehavior)Sanitizer|runtime error:/);
    rmSync(d2, { recursive: true, force: true });
  }
});

test('every error the server answers itself carries request_id (400, 408, 413, 431)', async () => {
  const ids = new Set();
  const cases = [
    [postBytes('/v1/messages', '5\r\nhello\r\n0\r\n\r\n', { 'transfer-encoding': 'chunked' }), 400],
    [postBytes('/v1/messages', msg('x'), Object.fromEntries(Array.from({ length: MAX_HEADERS + 5 }, (_, i) => [`x-f-${i}`, 'v']))), 431],
    [postBytes('/v1/messages', msg('z'.repeat(MAX_BODY))), 413],
    [postBytes('/v1/messages', msg('x')).subarray(0, -5), 408],
  ];
  for (const [bytes, status] of cases) {
    const r = await once(bytes);
    assert.equal(r.status, status, r.text);
    assertRequestId(r);
    ids.add(r.json.request_id);
  }
  assert.equal(ids.size, cases.length, 'each error has its own id');
});

test('folded header lines (obs-fold) -> 400, RFC 9112 §5.2', async () => {
  for (const fold of ['x-a: one\r\n two', 'x-a:\r\n two', 'x-a: one\r\n\ttwo']) {
    const head = `POST /v1/messages/count_tokens HTTP/1.1\r\nhost: x\r\nx-api-key: ${KEY}\r\n${fold}\r\n`;
    const body = JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'fold' }] });
    const r = await once(`${head}content-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`);
    assertAnthropicError(r, 400, 'invalid_request_error', 'folded header lines (obs-fold) are not allowed');
    assertRequestId(r);
  }
});

function vmRssKiB(pid) {
  const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(/^VmRSS:\s+(\d+) kB$/m);
  return Number(m[1]);
}

test('45,000 pipelined GET /dashboard never read: RSS stays bounded, others are served', async () => {
  const N = 45000, BOUND_MIB = 64;
  const rss0 = vmRssKiB(gw.proc.pid);
  const s = net.connect(gw.port, '127.0.0.1');
  await new Promise((res, rej) => { s.once('connect', res); s.once('error', rej); });
  s.on('error', () => {});
  s.pause(); // never read: the answers pile up wherever the gateway keeps them
  const one = Buffer.from('GET /dashboard HTTP/1.1\r\nhost: x\r\n\r\n');
  s.write(Buffer.concat(Array(N).fill(one)));
  let peak = rss0;
  const t0 = Date.now();
  while (Date.now() - t0 < 3000) {
    peak = Math.max(peak, vmRssKiB(gw.proc.pid));
    await sleep(50);
  }
  // Meanwhile (and after) other clients are served.
  assert.ok((await countTokens('while a client does not read')) > 0);
  const h = await once('GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n');
  assert.equal(h.status, 200);
  peak = Math.max(peak, vmRssKiB(gw.proc.pid));
  const grew = (peak - rss0) / 1024;
  console.log(`  pipelined ${N} x GET /dashboard, never read: RSS ${(rss0 / 1024).toFixed(0)} MiB -> peak ${(peak / 1024).toFixed(0)} MiB (+${grew.toFixed(1)} MiB, bound ${BOUND_MIB} MiB)`);
  assert.ok(grew < BOUND_MIB, `RSS grew ${grew.toFixed(1)} MiB`);
  s.destroy();
});

// How many more sockets this process may open (the soft RLIMIT_NOFILE, less what is open).
function fdsLeft() {
  const lim = Number(readFileSync('/proc/self/limits', 'utf8').match(/^Max open files\s+(\d+|unlimited)/m)?.[1] ?? 1024);
  return (Number.isFinite(lim) ? lim : 1 << 20) - 64;
}

test('a flood of keyless trickling sockets: keyed requests and /healthz are still answered', async () => {
  const PER_PEER = 100, PEERS = 12;
  const want = PER_PEER * PEERS; // 1200 sockets: twice max_connections
  const n = Math.min(want, fdsLeft());
  console.log(`  flood: ${n} sockets from ${PEERS} addresses (ulimit -n allows ${fdsLeft() + 64})`);
  const d2 = mkdtempSync(join(tmpdir(), 'kvgw-edge-flood-'));
  const g2 = await startGateway(writeConfig(d2, gatewayConfig(d2, {
    limits: `max_connections: ${want / 2}
reserved_connections: 100
max_connections_per_peer: ${PER_PEER}
header_timeout: 30s
body_timeout: 30s`,
  })));
  const flood = [];
  let drip;
  try {
    for (let i = 0; i < n; i++) {
      // Each from one of 127.0.0.2..13: one attacker host per address, none of them the
      // checker's 127.0.0.1.
      const s = net.connect({ port: g2.port, host: '127.0.0.1', localAddress: `127.0.0.${2 + (i % PEERS)}` });
      s.on('error', () => {});
      s.on('data', () => {});
      flood.push(s);
      s.write(i % 2 ? 'POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\n{' : 'GET /v1/models HTTP/1.1\r\nx-slow: ');
      if (i % 100 === 99) await sleep(20);
    }
    let k = 0;
    drip = setInterval(() => { for (const s of flood) if (!s.destroyed) s.write(k % 2 ? 'a' : 'b'); k++; }, 500);
    await sleep(1500); // every flood socket is connected and trickling
    const alive = flood.filter((s) => !s.destroyed).length;
    // A client with a key, from the gateway's host.
    const r = await postBytesOnce(g2.port, postBytes('/v1/messages/count_tokens', { model: MODEL, messages: [{ role: 'user', content: 'under a flood' }] }));
    assert.equal(r?.status, 200, r?.text);
    const h = await postBytesOnce(g2.port, 'GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n');
    assert.equal(h?.status, 200, h?.text);
    const open = flood.filter((s) => !s.destroyed && !s.readableEnded).length;
    console.log(`  flood of ${n}: ${alive} alive after 1.5 s; keyed count_tokens ${r.status}, /healthz ${h.status}; ${open} flood sockets still open`);
  } finally {
    clearInterval(drip);
    for (const s of flood) s.destroy();
    const { code } = await stopGateway(g2, 'SIGTERM');
    assert.equal(code, 0, g2.stderr().slice(-2000));
    assert.doesNotMatch(g2.stderr(), /(Address|Leak|UndefinedBehavior)Sanitizer|runtime error:/);
    rmSync(d2, { recursive: true, force: true });
  }
});

async function postBytesOnce(port, bytes) {
  const c = new RawConn(port);
  await c.ready;
  c.write(bytes);
  const r = await c.response(10000);
  c.destroy();
  return r;
}
