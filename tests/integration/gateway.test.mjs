// gateway.test.mjs — the real `kvgw serve` binary on loopback, spoken to with curl-like fetch
// calls and the official SDKs (@anthropic-ai/sdk, openai): prompt caching usage with exact
// token arithmetic, streaming, errors in each API's shape, TTL expiry, tenant isolation,
// metrics, graceful shutdown and the ledger it leaves behind.
//
// Run by CTest (tests/integration/CMakeLists.txt) as: node --test tests/integration/gateway.test.mjs
// with KVGW_BIN (the kvgw binary) and the repository root as the working directory.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createRequire } from 'node:module';

const require = createRequire(join(process.cwd(), 'tests/node/package.json'));
const Anthropic = require('@anthropic-ai/sdk').default ?? require('@anthropic-ai/sdk');
const OpenAIMod = require('openai');
const OpenAI = OpenAIMod.default ?? OpenAIMod.OpenAI ?? OpenAIMod;

const BIN = process.env.KVGW_BIN ?? 'build/bin/kvgw';
const MODEL = 'kvgw-demo';
// The "5m" class, shortened for the expiry test. TTLs run from a request's start, so it must
// outlast the slowest write-then-read pair: the ASan+UBSan binary on a loaded 2-core machine
// took over 2.5 s for one 500-token prefill, and its entries had expired when read.
const TTL_5M_MS = 6000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

let dir, gw, base, stderrText = '';
const pairs = []; // [non-streamed request id, streamed request id] that must bill the same

function config(extra = '') {
  return `listen: 127.0.0.1:0
models:
  - name: ${MODEL}
    path: models/kvgw-demo.gguf
    min_cache_tokens: 16
    workers: 2
    threads: 1
api_keys:
  - {key: sk-test-a, id: key-a, tenant: tenant-a}
  - {key: sk-test-b, id: key-b, tenant: tenant-b}
admin_key: sk-test-admin
cache:
  ttl_5m: ${TTL_5M_MS}ms
  namespace_secret: integration-test-namespace-secret
billing:
  ledger_dir: ${dir}/var/ledger   # var/ does not exist yet, as on a fresh checkout
  pricing: conf/pricing.yaml
  fsync: batch
log:
  access_log: ${dir}/access.log
metrics:
  per_tenant: true
${extra}`;
}

async function startGateway() {
  const cfg = join(dir, 'kvgw.yaml');
  writeFileSync(cfg, config());
  gw = spawn(BIN, ['serve', '--config', cfg], { stdio: ['ignore', 'pipe', 'pipe'] });
  gw.stderr.on('data', (d) => { stderrText += d; });
  base = await new Promise((resolve, reject) => {
    let out = '';
    const t = setTimeout(() => reject(new Error('gateway did not start:\n' + stderrText)), 60000);
    gw.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/[0-9.]+:\d+)/);
      if (m) { clearTimeout(t); resolve(m[1]); }
    });
    gw.on('exit', (code) => { clearTimeout(t); reject(new Error(`gateway exited ${code}:\n${stderrText}`)); });
  });
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kvgw-it-'));
  await startGateway();
});

after(async () => {
  if (gw && gw.exitCode === null) gw.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

// A long shared system prompt (well over min_cache_tokens) that differs per test.
function longSystem(tag) {
  let s = `You are assistant ${tag}. `;
  for (let i = 0; i < 40; i++) s += `Rule ${i}: answer briefly and cite section ${i}. `;
  return s;
}

const anthropic = (key = 'sk-test-a') => new Anthropic({ apiKey: key, baseURL: base, maxRetries: 0 });
const openai = (key = 'sk-test-a') => new OpenAI({ apiKey: key, baseURL: base + '/v1', maxRetries: 0 });

async function post(path, body, headers = {}) {
  const r = await fetch(base + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': 'sk-test-a', 'anthropic-version': '2023-06-01', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  return { status: r.status, headers: r.headers, json: await r.json().catch(() => null) };
}

// /metrics needs the admin key (metrics.require_key, on by default).
const ADMIN = 'sk-test-admin';
const metricsText = async () => (await fetch(base + '/metrics', { headers: { authorization: `Bearer ${ADMIN}` } })).text();
const metricValue = (text, series) => {
  const line = text.split('\n').find((l) => l.startsWith(series + ' '));
  return line ? Number(line.slice(series.length + 1)) : 0;
};

function bucketsSum(u) {
  return u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens;
}

test('anthropic SDK: write then read with exact token arithmetic', async () => {
  const client = anthropic();
  const system = [{ type: 'text', text: longSystem('write-read'), cache_control: { type: 'ephemeral' } }];
  const messages = [{ role: 'user', content: 'What is rule 3?' }];
  const count = await client.messages.countTokens({ model: MODEL, system, messages });
  assert.ok(count.input_tokens > 100);

  const first = await client.messages.create({ model: MODEL, max_tokens: 8, system, messages, temperature: 0 });
  assert.equal(first.type, 'message');
  assert.equal(first.role, 'assistant');
  assert.ok(['end_turn', 'max_tokens'].includes(first.stop_reason));
  const u1 = first.usage;
  assert.equal(bucketsSum(u1), count.input_tokens, 'the buckets sum to the prompt');
  assert.equal(u1.cache_read_input_tokens, 0);
  assert.ok(u1.cache_creation_input_tokens > 100);
  assert.equal(u1.cache_creation.ephemeral_5m_input_tokens, u1.cache_creation_input_tokens);
  assert.equal(u1.cache_creation.ephemeral_1h_input_tokens, 0);
  assert.ok(u1.output_tokens >= 1 && u1.output_tokens <= 8);

  const second = await client.messages.create({ model: MODEL, max_tokens: 8, system, messages, temperature: 0 });
  const u2 = second.usage;
  assert.equal(u2.cache_read_input_tokens, u1.cache_creation_input_tokens, 'the whole entry is read');
  assert.equal(u2.cache_creation_input_tokens, 0);
  assert.equal(u2.input_tokens, u1.input_tokens);
  assert.equal(bucketsSum(u2), count.input_tokens);
  // Greedy decoding over the cached prefix gives the same text as the cold run.
  assert.deepEqual(second.content, first.content);
});

test('anthropic streaming: exact event sequence and usage', async () => {
  const client = anthropic();
  const system = [{ type: 'text', text: longSystem('stream'), cache_control: { type: 'ephemeral', ttl: '1h' } }];
  const stream = await client.messages.create({
    model: MODEL, max_tokens: 6, stream: true, system, messages: [{ role: 'user', content: 'hi' }],
  });
  const types = [];
  let text = '', start, delta;
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'message_start') start = ev.message;
    if (ev.type === 'content_block_delta') text += ev.delta.text;
    if (ev.type === 'message_delta') delta = ev;
  }
  assert.equal(types[0], 'message_start');
  assert.equal(types[1], 'content_block_start');
  assert.deepEqual(types.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
  assert.ok(start.usage.cache_creation_input_tokens > 100);
  assert.equal(start.usage.cache_creation.ephemeral_1h_input_tokens, start.usage.cache_creation_input_tokens);
  assert.ok(['end_turn', 'max_tokens'].includes(delta.delta.stop_reason));
  assert.ok(delta.usage.output_tokens >= 1);
  assert.equal(typeof text, 'string');
});

test('raw SSE bytes: ping after content_block_start, blank-line framing', async () => {
  const r = await fetch(base + '/v1/messages', {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': 'sk-test-a', 'anthropic-version': '2023-06-01' },
    body: JSON.stringify({ model: MODEL, max_tokens: 2, stream: true, messages: [{ role: 'user', content: 'hi' }] }),
  });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /^text\/event-stream/);
  const text = await r.text();
  const events = [...text.matchAll(/^event: (\w+)\ndata: (.*)\n\n/gm)].map((m) => m[1]);
  assert.deepEqual(events.slice(0, 3), ['message_start', 'content_block_start', 'ping']);
  assert.equal(events.at(-1), 'message_stop');
});

test('openai SDK: automatic caching, inclusive prompt_tokens, streaming with usage', async () => {
  const client = openai();
  const messages = [
    { role: 'system', content: longSystem('openai') },
    { role: 'user', content: 'Summarize rule 7.' },
  ];
  const a = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 5, temperature: 0 });
  assert.equal(a.object, 'chat.completion');
  assert.equal(a.choices[0].message.role, 'assistant');
  assert.equal(a.usage.prompt_tokens_details.cached_tokens, 0);
  const b = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 5, temperature: 0 });
  assert.equal(b.usage.prompt_tokens, a.usage.prompt_tokens, 'prompt_tokens includes cached tokens');
  assert.ok(b.usage.prompt_tokens_details.cached_tokens > 100);
  assert.ok(b.usage.prompt_tokens_details.cached_tokens < b.usage.prompt_tokens);
  assert.equal(b.choices[0].message.content, a.choices[0].message.content);

  const stream = await client.chat.completions.create({
    model: MODEL, messages, max_tokens: 5, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = '', usage = null, finish = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta?.content) text += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.ok(['stop', 'length'].includes(finish));
  assert.equal(usage.prompt_tokens, a.usage.prompt_tokens);
  assert.ok(usage.prompt_tokens_details.cached_tokens > 100);
  assert.equal(text, a.choices[0].message.content);
});

test('errors: exact status and shape for each API', async () => {
  // Five breakpoints.
  const blocks = [];
  for (let i = 0; i < 5; i++) blocks.push({ type: 'text', text: `part ${i}`, cache_control: { type: 'ephemeral' } });
  let r = await post('/v1/messages', { model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: blocks }] });
  assert.equal(r.status, 400);
  assert.equal(r.json.type, 'error');
  assert.equal(r.json.error.type, 'invalid_request_error');
  assert.equal(r.json.error.message, 'A maximum of 4 blocks with cache_control may be provided. Found 5.');
  assert.ok(r.headers.get('request-id'));

  r = await post('/v1/messages', '{"model": "x", ');
  assert.equal(r.status, 400);
  assert.equal(r.json.error.type, 'invalid_request_error');

  r = await post('/v1/messages', { model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: 'x' }] }, { 'x-api-key': 'sk-wrong' });
  assert.equal(r.status, 401);
  assert.equal(r.json.error.type, 'authentication_error');

  r = await post('/v1/messages', { model: 'no-such-model', max_tokens: 4, messages: [{ role: 'user', content: 'x' }] });
  assert.equal(r.status, 404);
  assert.equal(r.json.error.type, 'not_found_error');

  r = await post('/v1/chat/completions', { model: MODEL, messages: [{ role: 'user', content: 'x' }], temperature: 7 }, { authorization: 'Bearer sk-test-a' });
  assert.equal(r.status, 400);
  assert.equal(r.json.error.type, 'invalid_request_error');
  assert.ok('param' in r.json.error);

  await assert.rejects(
    anthropic('sk-nope').messages.create({ model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e.status === 401);
});

test('tenants never share cache entries; kvgw-cache explains hits and misses', async () => {
  const body = {
    model: MODEL, max_tokens: 2,
    system: [{ type: 'text', text: longSystem('tenants'), cache_control: { type: 'ephemeral' } }],
    messages: [{ role: 'user', content: 'hello' }],
  };
  const a1 = await post('/v1/messages', body);
  assert.equal(a1.status, 200);
  // Outcomes (README "Outcomes"): nothing read, the system prompt written -> write.
  assert.match(a1.headers.get('kvgw-cache'), /outcome=write; read=0; write=[1-9]/);
  const b1 = await post('/v1/messages', body, { 'x-api-key': 'sk-test-b' });
  assert.equal(b1.json.usage.cache_read_input_tokens, 0, 'tenant b does not read tenant a\'s entry');
  assert.ok(b1.json.usage.cache_creation_input_tokens > 0);
  const a2 = await post('/v1/messages', body);
  // The cached system prompt read, only the new turn uncached: a hit (was "partial").
  assert.match(a2.headers.get('kvgw-cache'), /outcome=hit; read=[1-9]\d*; write=0/);
  assert.ok(a2.json.usage.cache_read_input_tokens > 0);
  // A different last message diverges after the system prompt.
  const a3 = await post('/v1/messages', { ...body, messages: [{ role: 'user', content: 'goodbye now' }] });
  assert.match(a3.headers.get('kvgw-cache'), /diverged=messages\.0\.content\.0\+/);
  // A salt separates a tenant's own requests.
  const s1 = await post('/v1/messages', { ...body, cache_salt: 'user-42' });
  assert.equal(s1.json.usage.cache_read_input_tokens, 0);
});

// The access log's line of a request, by its request-id. The gateway flushes the log every
// quarter second, so the line may take that long to appear.
async function logLine(rid) {
  for (const t0 = Date.now(); Date.now() - t0 < 5000; await sleep(50)) {
    for (const l of readFileSync(join(dir, 'access.log'), 'utf8').trim().split('\n').filter(Boolean)) {
      const j = JSON.parse(l);
      if (j.request_id === rid) return j;
    }
  }
  return null;
}

test('another tenant\'s cache is invisible, in KV reuse and in time', async () => {
  const big = (tag) => { let s = `Tenant timing ${tag}. `; for (let i = 0; i < 120; i++) s += `Clause ${i} of contract ${tag}. `; return s; };
  const req = (tag, key) => post('/v1/messages', {
    model: MODEL, max_tokens: 1, temperature: 0,
    system: [{ type: 'text', text: big(tag), cache_control: { type: 'ephemeral', ttl: '1h' } }],
    messages: [{ role: 'user', content: 'x' }],
  }, { 'x-api-key': key });
  const other = [], nobody = [], same = [];
  for (let i = 0; i < 5; i++) {
    await req(`shared-${i}`, 'sk-test-a');                // tenant a caches it
    const b = await req(`shared-${i}`, 'sk-test-b');      // tenant b: "another tenant cached it"
    const n = await req(`fresh-${i}`, 'sk-test-b');       // tenant b: nobody cached it
    const a = await req(`shared-${i}`, 'sk-test-a');      // control: tenant a reads its own
    const lb = await logLine(b.headers.get('request-id')), ln = await logLine(n.headers.get('request-id')),
      la = await logLine(a.headers.get('request-id'));
    assert.equal(b.json.usage.cache_read_input_tokens, 0);
    // Tenant b reuses only its own chat-template opening (a few tokens), never tenant a's prompt.
    assert.ok(lb.physical_hit < 32, 'no KV of tenant a is reused for tenant b: ' + lb.physical_hit);
    assert.ok(la.physical_hit > 500, 'the control reuses its own KV: ' + JSON.stringify(la) + ' ' + a.headers.get('kvgw-cache'));
    other.push(lb.worker_ttft_us); nobody.push(ln.worker_ttft_us); same.push(la.worker_ttft_us);
  }
  const med = (v) => [...v].sort((x, y) => x - y)[Math.floor(v.length / 2)];
  // Same work, same time: "another tenant cached it" looks like "nobody cached it", while a
  // real hit is far faster (the signal an attacker would look for).
  assert.ok(med(other) > 0.5 * med(nobody), `other ${med(other)}us vs nobody ${med(nobody)}us`);
  assert.ok(med(same) < 0.5 * med(nobody), `own hit ${med(same)}us vs nobody ${med(nobody)}us`);
});

test('entries expire after their TTL', async () => {
  const body = {
    model: MODEL, max_tokens: 1,
    system: [{ type: 'text', text: longSystem('ttl'), cache_control: { type: 'ephemeral' } }],
    messages: [{ role: 'user', content: 'x' }],
  };
  const w = await post('/v1/messages', body);
  const r = await post('/v1/messages', body);
  assert.ok(r.json.usage.cache_read_input_tokens > 0);
  await new Promise((res) => setTimeout(res, TTL_5M_MS + 1500));
  const e = await post('/v1/messages', body);
  assert.equal(e.json.usage.cache_read_input_tokens, 0, 'expired: written again');
  assert.equal(e.json.usage.cache_creation_input_tokens, w.json.usage.cache_creation_input_tokens);
});

test('pre-warm with max_tokens 0, count_tokens, models, health and metrics', async () => {
  const body = {
    model: MODEL, max_tokens: 0,
    system: [{ type: 'text', text: longSystem('prewarm'), cache_control: { type: 'ephemeral' } }],
    messages: [{ role: 'user', content: 'x' }],
  };
  const p = await post('/v1/messages', body);
  assert.equal(p.status, 200);
  assert.deepEqual(p.json.content, []);
  assert.equal(p.json.stop_reason, 'max_tokens');
  assert.equal(p.json.usage.output_tokens, 0);
  const r = await post('/v1/messages', { ...body, max_tokens: 1 });
  assert.equal(r.json.usage.cache_read_input_tokens, p.json.usage.cache_creation_input_tokens);

  const models = await (await fetch(base + '/v1/models', { headers: { authorization: 'Bearer sk-test-a' } })).json();
  assert.equal(models.object, 'list');
  assert.equal(models.data[0].id, MODEL);
  assert.equal((await fetch(base + '/healthz')).status, 200);
  assert.equal((await fetch(base + '/readyz')).status, 200);
  const m = await metricsText();
  assert.match(m, /^kvgw_requests_total\{endpoint="messages",code="200"\} \d+/m);
  assert.match(m, /^kvgw_tokens_total\{type="cache_read"\} [1-9]/m);
  assert.match(m, /^# TYPE kvgw_time_to_first_token_seconds histogram/m);
});

// Issue 19 item 10: /metrics lists every tenant's name and volumes (per_tenant is on here): it
// answers only to the admin key, given as x-api-key or as a bearer token (Prometheus).
test('/metrics needs the admin key, in the API error shape otherwise', async () => {
  const none = await fetch(base + '/metrics');
  assert.equal(none.status, 401);
  const nj = await none.json();
  assert.equal(nj.type, 'error');
  assert.equal(nj.error.type, 'authentication_error');
  assert.match(nj.error.message, /admin key/);
  assert.equal(nj.request_id, none.headers.get('request-id'));
  assert.doesNotMatch(JSON.stringify(nj), /tenant-a/);
  for (const headers of [{ 'x-api-key': 'sk-test-a' }, { authorization: 'Bearer sk-test-a' }, { authorization: 'Bearer nope' }]) {
    const r = await fetch(base + '/metrics', { headers });
    assert.equal(r.status, 403, JSON.stringify(headers));
    const j = await r.json();
    assert.equal(j.error.type, 'permission_error');
    assert.doesNotMatch(JSON.stringify(j), /tenant-a/);
  }
  for (const headers of [{ 'x-api-key': ADMIN }, { authorization: `Bearer ${ADMIN}` }]) {
    const r = await fetch(base + '/metrics', { headers });
    assert.equal(r.status, 200, JSON.stringify(headers));
    assert.match(r.headers.get('content-type'), /^text\/plain; version=0\.0\.4/);
    assert.match(await r.text(), /^kvgw_tenant_tokens_total\{tenant="tenant-a"/m);
  }
});

// Issue 19 item 9: a prompt longer than any worker of the model accepts is the client's error,
// 400 invalid_request_error in each API's shape (it was 529 overloaded_error, which the SDKs
// retried), and the SDKs do not retry it. count_tokens still counts it.
test('a prompt longer than the context: 400 in both APIs, not retried', async () => {
  const long = 'lorem ipsum dolor sit amet '.repeat(2500); // about 12,500 tokens > the 8192 context
  const messages = [{ role: 'user', content: long }];
  const ct = await post('/v1/messages/count_tokens', { model: MODEL, messages });
  assert.equal(ct.status, 200, JSON.stringify(ct.json));
  const n = ct.json.input_tokens;
  assert.ok(n > 8192, `${n} tokens`);

  const r = await post('/v1/messages', { model: MODEL, max_tokens: 4, messages });
  assert.equal(r.status, 400, JSON.stringify(r.json));
  assert.equal(r.json.type, 'error');
  assert.equal(r.json.error.type, 'invalid_request_error');
  const mm = /^prompt is too long: (\d+) tokens > (\d+) maximum$/.exec(r.json.error.message);
  assert.ok(mm, r.json.error.message);
  assert.ok(Number(mm[1]) > Number(mm[2]) && Number(mm[2]) > 0 && Number(mm[2]) <= 8192, r.json.error.message);
  assert.equal(r.json.request_id, r.headers.get('request-id'));

  const o = await post('/v1/chat/completions', { model: MODEL, max_tokens: 4, messages }, { authorization: 'Bearer sk-test-a' });
  assert.equal(o.status, 400, JSON.stringify(o.json));
  assert.equal(o.json.error.type, 'invalid_request_error');
  assert.equal(o.json.error.code, 'context_length_exceeded');
  assert.equal(o.json.error.param, 'messages');
  assert.match(o.json.error.message, /^prompt is too long: \d+ tokens > \d+ maximum$/);

  // The SDKs with their default retries (2): one request each reaches the gateway.
  const before = await metricsText();
  await assert.rejects(
    new Anthropic({ apiKey: 'sk-test-a', baseURL: base, maxRetries: 2 }).messages.create({ model: MODEL, max_tokens: 4, messages }),
    (e) => e.status === 400 && e.error?.error?.type === 'invalid_request_error' && /^prompt is too long: /.test(e.error.error.message));
  await assert.rejects(
    new OpenAI({ apiKey: 'sk-test-a', baseURL: base + '/v1', maxRetries: 2 }).chat.completions.create({ model: MODEL, max_tokens: 4, messages }),
    (e) => e.status === 400 && e.code === 'context_length_exceeded' && e.type === 'invalid_request_error');
  const after = await metricsText();
  for (const ep of ['messages', 'chat_completions']) {
    const series = `kvgw_requests_total{endpoint="${ep}",code="400"}`;
    assert.equal(metricValue(after, series) - metricValue(before, series), 1, `${series}: one request, no retry`);
    const over = `kvgw_requests_total{endpoint="${ep}",code="529"}`;
    assert.equal(metricValue(after, over), 0, `${over}: nothing was overloaded`);
  }
});

test('streamed and non-streamed versions of a request bill the same', async () => {
  const body = {
    model: MODEL, max_tokens: 6, temperature: 0,
    system: [{ type: 'text', text: longSystem('stream-vs-json'), cache_control: { type: 'ephemeral' } }],
    messages: [{ role: 'user', content: 'same request twice' }],
  };
  await post('/v1/messages', { ...body, max_tokens: 0 }); // pre-warm: both below read the entry
  const a = await post('/v1/messages', body);
  const r = await fetch(base + '/v1/messages', {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': 'sk-test-a', 'anthropic-version': '2023-06-01' },
    body: JSON.stringify({ ...body, stream: true }),
  });
  await r.text();
  pairs.push([a.headers.get('request-id'), r.headers.get('request-id')]);
});

test('per-tenant series when metrics.per_tenant is on', async () => {
  const m = await metricsText();
  assert.match(m, /^kvgw_tenant_tokens_total\{tenant="tenant-a",type="cache_read"\} [1-9]/m);
  assert.match(m, /^kvgw_tenant_tokens_total\{tenant="tenant-b",type="cache_write_5m"\} [1-9]/m);
});

test('SIGTERM: graceful exit 0, and the ledger holds one event per request', async () => {
  const exited = new Promise((res) => gw.on('exit', (code, sig) => res({ code, sig })));
  gw.kill('SIGTERM');
  const { code } = await exited;
  assert.equal(code, 0, stderrText);
  const out = spawnSync(BIN, ['billing', 'export', '--ledger', join(dir, 'var', 'ledger'), '--format', 'jsonl'], { encoding: 'utf8' });
  assert.equal(out.status, 0, out.stderr);
  const rows = out.stdout.trim().split('\n').filter(Boolean).map((l) => JSON.parse(l));
  const usage = rows.filter((r) => r.kind === undefined || r.kind === 'usage');
  const ids = new Set(usage.map((r) => r.request_id));
  assert.equal(ids.size, usage.length, 'no request billed twice');
  const log = readFileSync(join(dir, 'access.log'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
  const ran = log.filter((l) => l.worker >= 0);
  assert.equal(usage.length, ran.length, 'one usage event per request that reached a worker');
  const byId = new Map(usage.map((r) => [r.request_id, r]));
  const strip = (r) => { const { event_id, seq, request_id, start, end, ...rest } = r; return rest; };
  for (const [a, b] of pairs) assert.deepEqual(strip(byId.get(b)), strip(byId.get(a)), 'same ledger row');
});
