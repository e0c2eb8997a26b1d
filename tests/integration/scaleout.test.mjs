// scaleout.test.mjs — many gateways, one cache (issue 22): three real `kvgw serve` (A, B, C) with
// the registry on one real redis-server, sharing two real `kvgw worker` processes.
//   - a prefix written through A is read through B and C with exact usage (both SDKs, streamed
//     and not), every decision `registry: shared` in the merged export;
//   - the identical prompt fired at A, B and C at the same moment, 20 rounds with a fresh prefix
//     each: exactly one write per round, the two others reads of it;
//   - a short TTL: the entries expire in Redis, and every gateway then writes them again;
//   - tenant isolation across gateways; a gateway with another namespace secret, or with the
//     instance id of a live gateway, is refused at start with a clear message;
//   - malformed change-feed events (written into the stream with redis-cli) are rejected and
//     counted by every gateway, and the feed flows on;
//   - fencing: A frozen past its lease and replaced under its instance id, then resumed, is
//     fenced (its decisions local, nothing committed) and registers again once the id is free;
//   - SIGKILL of C mid-load: the clients retry on A and B, every response received in full is
//     billed exactly once in `kvgw billing export --ledger A --ledger B --ledger C`, C's claims and
//     registration expire, C restarts on its ledger and rejoins.
// Redis paused, stopped and failed over: scaleout_redis.test.mjs.
//
// Run by CTest (tests/integration/CMakeLists.txt): KVGW_BIN=build/bin/kvgw node --test
// tests/integration/scaleout.test.mjs from the repository root.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import {
  Cluster, MODEL, KEYS, PREFIX, NS_SECRET, message, system, metrics, mergedExport, usageMismatch, waitFor, kill,
} from './cluster_harness.mjs';

const require = createRequire(join(process.cwd(), 'tests/node/package.json'));
const Anthropic = require('@anthropic-ai/sdk').default ?? require('@anthropic-ai/sdk');
const OpenAIMod = require('openai');
const OpenAI = OpenAIMod.default ?? OpenAIMod.OpenAI ?? OpenAIMod;

// The "5m" TTL class, shortened so that the expiry test waits seconds, not minutes. It must
// outlast a write followed by two reads on a loaded 2-core machine (each read refreshes it).
const TTL_5M_MS = 5000;
const ROUNDS = Number(process.env.KVGW_RACE_ROUNDS ?? 20);

const cluster = new Cluster('main', { ttl5mMs: TTL_5M_MS });
let A, B, C;
const sharedRids = new Set(); // requests whose decisions needed Redis while it was up

before(async () => {
  await cluster.start();
  [A, B, C] = cluster.gws;
});

after(async () => { await cluster.stop(); });

const anthropic = (g, key = KEYS.a) => new Anthropic({ apiKey: key, baseURL: g.base, maxRetries: 0 });
const openai = (g, key = KEYS.a) => new OpenAI({ apiKey: key, baseURL: g.base + '/v1', maxRetries: 0 });
const ledgers = () => [A.ledger, B.ledger, C.ledger];

test('gateways: one registration per instance in Redis, the same namespace secret check', async () => {
  for (const g of cluster.gws) {
    const m = await metrics(g);
    assert.equal(m.value('kvgw_registry_up'), 1, `${g.name} registry up`);
    assert.equal(m.value(`kvgw_gateway_info{instance_id="${g.instance}"}`), 1, `${g.name} gateway_info`);
    assert.ok(await cluster.redis.cli('GET', `${PREFIX}:gw:${g.instance}`), `${PREFIX}:gw:${g.instance} registered`);
  }
  const seen = (await cluster.redis.cli('SMEMBERS', `${PREFIX}:gws`)).split('\n').sort();
  assert.deepEqual(seen, ['gw-a', 'gw-b', 'gw-c']);
  assert.match(await cluster.redis.cli('GET', `${PREFIX}:nssecret`), /^[0-9a-f]{32,}$/);
});

test('anthropic SDK: written on A, read on B (streamed) and C with exact usage', async () => {
  const sys = system('sdk-anthropic');
  const messages = [{ role: 'user', content: 'Which rule applies?' }];
  const count = await anthropic(B).messages.countTokens({ model: MODEL, system: sys, messages });

  const w = await anthropic(A).messages.create({ model: MODEL, max_tokens: 4, temperature: 0, system: sys, messages }).withResponse();
  const uw = w.data.usage;
  assert.equal(uw.cache_read_input_tokens, 0);
  assert.ok(uw.cache_creation_input_tokens > 16, JSON.stringify(uw));
  assert.equal(uw.input_tokens + uw.cache_creation_input_tokens, count.input_tokens);

  const s = await anthropic(B).messages.create({ model: MODEL, max_tokens: 4, temperature: 0, system: sys, messages, stream: true }).withResponse();
  let start = null, delta = null;
  for await (const ev of s.data) {
    if (ev.type === 'message_start') start = ev.message.usage;
    if (ev.type === 'message_delta') delta = ev.usage;
  }
  assert.equal(start.cache_read_input_tokens, uw.cache_creation_input_tokens, 'B reads the whole entry A wrote');
  assert.equal(start.cache_creation_input_tokens, 0, 'B writes nothing');
  assert.equal(start.input_tokens, uw.input_tokens);
  assert.ok(delta.output_tokens >= 1);

  const r = await anthropic(C).messages.create({ model: MODEL, max_tokens: 4, temperature: 0, system: sys, messages }).withResponse();
  assert.equal(r.data.usage.cache_read_input_tokens, uw.cache_creation_input_tokens, 'C reads the whole entry A wrote');
  assert.equal(r.data.usage.cache_creation_input_tokens, 0);
  assert.equal(r.data.usage.input_tokens, uw.input_tokens);
  assert.match(r.response.headers.get('kvgw-cache'), /outcome=hit/);

  const rows = new Map(mergedExport(ledgers()).map((x) => [x.request_id, x]));
  const got = [[w, uw], [s, { ...start, output_tokens: delta.output_tokens }], [r, r.data.usage]];
  for (const [resp, u] of got) {
    const rid = resp.response.headers.get('request-id');
    const row = rows.get(rid);
    assert.ok(row, `${rid} in the merged export`);
    assert.equal(usageMismatch(row, u), null, rid);
    assert.equal(row.registry, 'shared', `${rid}: decided with Redis`);
    sharedRids.add(rid);
  }
});

test('openai SDK: written on B, read on C (streamed) and A with exact usage', async () => {
  const messages = [{ role: 'system', content: system('sdk-openai', 8)[0].text }, { role: 'user', content: 'Summarize rule 3.' }];
  const w = await openai(B).chat.completions.create({ model: MODEL, messages, max_tokens: 4, temperature: 0 }).withResponse();
  assert.equal(w.data.usage.prompt_tokens_details.cached_tokens, 0);

  const s = await openai(C).chat.completions.create({
    model: MODEL, messages, max_tokens: 4, temperature: 0, stream: true, stream_options: { include_usage: true },
  }).withResponse();
  let su = null;
  for await (const chunk of s.data) if (chunk.usage) su = chunk.usage;
  const r = await openai(A).chat.completions.create({ model: MODEL, messages, max_tokens: 4, temperature: 0 }).withResponse();

  const rows = new Map(mergedExport(ledgers()).map((x) => [x.request_id, x]));
  const rid = (x) => x.response.headers.get('request-id');
  const wrow = rows.get(rid(w));
  assert.ok(wrow, 'B\'s write in the merged export');
  const written = wrow.usage.cache_write_5m_tokens + wrow.usage.cache_write_1h_tokens;
  assert.ok(written > 16, `B wrote the automatic prefix: ${JSON.stringify(wrow.usage)}`);
  for (const [name, u, x] of [['C', su, s], ['A', r.data.usage, r]]) {
    assert.equal(u.prompt_tokens, w.data.usage.prompt_tokens, `${name}: prompt_tokens includes the cached tokens`);
    assert.equal(u.prompt_tokens_details.cached_tokens, written, `${name} reads exactly what B wrote`);
    const row = rows.get(rid(x));
    assert.ok(row, `${name}'s request in the merged export`);
    assert.equal(row.usage.cache_read_tokens, written);
    assert.equal(row.usage.cache_write_5m_tokens + row.usage.cache_write_1h_tokens, 0, `${name} is billed no write`);
    assert.equal(row.usage.output_tokens, u.completion_tokens);
  }
  for (const x of [w, s, r]) {
    assert.equal(rows.get(rid(x)).registry, 'shared');
    sharedRids.add(rid(x));
  }
});

test(`the identical prompt at A, B and C at the same moment, ${ROUNDS} rounds: exactly one write each`, async () => {
  const gws = [A, B, C];
  let sameWorker = 0;
  const writers = { A: 0, B: 0, C: 0 };
  for (let round = 0; round < ROUNDS; round++) {
    const body = {
      model: MODEL, max_tokens: 2, temperature: 0, stream: round % 2 === 1,
      system: system(`race-${round}-${process.pid}`), messages: [{ role: 'user', content: 'go' }],
    };
    const res = await Promise.all(gws.map((g) => message(g, body)));
    for (const x of res) assert.ok(x.complete, `round ${round}: ${x.gw} answered in full: ${x.status} ${JSON.stringify(x.json ?? x.error)}`);
    const w = res.filter((x) => x.usage.cache_creation_input_tokens > 0);
    const desc = res.map((x) => `${x.gw}: write ${x.usage.cache_creation_input_tokens} read ${x.usage.cache_read_input_tokens} via ${x.headers.get('kvgw-worker')}`).join(', ');
    assert.equal(w.length, 1, `round ${round}: exactly one write (${desc})`);
    const n = w[0].usage.cache_creation_input_tokens;
    for (const x of res) {
      if (x === w[0]) continue;
      assert.equal(x.usage.cache_read_input_tokens, n, `round ${round}: ${x.gw} reads the whole write (${desc})`);
      assert.equal(x.usage.cache_creation_input_tokens, 0);
      assert.equal(x.usage.input_tokens, w[0].usage.input_tokens);
    }
    writers[w[0].gw]++;
    if (new Set(res.map((x) => x.headers.get('kvgw-worker'))).size === 1) sameWorker++;
    for (const x of res) sharedRids.add(x.rid);
  }
  console.log(`race: writers by gateway ${JSON.stringify(writers)}; all three on one worker in ${sameWorker}/${ROUNDS} rounds`);
  const rows = mergedExport(ledgers());
  const byRid = new Map(rows.map((x) => [x.request_id, x]));
  for (const rid of sharedRids) assert.equal(byRid.get(rid)?.registry, 'shared', `${rid} decided with Redis`);
});

test('TTL expiry is seen by every gateway', async () => {
  // Three prefixes, each written on one gateway and read on the two others (each gateway's
  // replica holds all three); once Redis has expired them, each gateway writes one again.
  const before = new Set((await cluster.redis.cli('KEYS', `${PREFIX}:e:*`)).split('\n').filter(Boolean));
  const gws = [A, B, C];
  const bodies = gws.map((g, i) => ({
    model: MODEL, max_tokens: 1, system: system(`ttl-${i}-${process.pid}`), messages: [{ role: 'user', content: 'x' }],
  }));
  const written = [];
  for (let i = 0; i < 3; i++) {
    const w = await message(gws[i], bodies[i]);
    assert.ok(w.complete && w.usage.cache_creation_input_tokens > 0, JSON.stringify(w.usage));
    written.push(w.usage.cache_creation_input_tokens);
    for (const g of gws) {
      if (g === gws[i]) continue;
      const r = await message(g, bodies[i]);
      assert.equal(r.usage.cache_read_input_tokens, written[i], `${g.name} reads prefix ${i} before it expires`);
    }
  }
  const keys = (await cluster.redis.cli('KEYS', `${PREFIX}:e:*`)).split('\n').filter((k) => k && !before.has(k));
  assert.ok(keys.length >= 3, `the entries are in Redis: ${keys}`);
  for (const k of keys) {
    const pttl = Number(await cluster.redis.cli('PTTL', k));
    assert.ok(pttl > 0 && pttl <= TTL_5M_MS, `${k}: Redis expires the entry within the TTL (PTTL ${pttl})`);
  }
  // Redis's expiry is the authority: wait until it has dropped them (bounded: a hang guard).
  await waitFor('Redis to expire the entries', async () => {
    for (const k of keys) if (Number(await cluster.redis.cli('EXISTS', k)) !== 0) return false;
    return true;
  }, { timeoutMs: 4 * TTL_5M_MS, stepMs: 100 });
  // Each gateway sends the prefix another gateway wrote: expired everywhere, so written again.
  for (let i = 0; i < 3; i++) {
    const g = gws[(i + 1) % 3];
    const e = await message(g, bodies[i]);
    assert.equal(e.usage.cache_read_input_tokens, 0, `${g.name}: prefix ${i} expired, not read`);
    assert.equal(e.usage.cache_creation_input_tokens, written[i], `${g.name}: prefix ${i} written again`);
  }
});

test('tenant isolation across gateways', async () => {
  const body = { model: MODEL, max_tokens: 1, system: system(`tenants-${process.pid}`), messages: [{ role: 'user', content: 'x' }] };
  const wa = await message(A, body, { key: KEYS.a });
  assert.ok(wa.usage.cache_creation_input_tokens > 0);
  const b1 = await message(B, body, { key: KEYS.b });
  assert.equal(b1.usage.cache_read_input_tokens, 0, 'tenant b on B does not read tenant a\'s prefix written on A');
  assert.equal(b1.usage.cache_creation_input_tokens, wa.usage.cache_creation_input_tokens, 'tenant b writes its own');
  const a2 = await message(C, body, { key: KEYS.a });
  assert.equal(a2.usage.cache_read_input_tokens, wa.usage.cache_creation_input_tokens, 'tenant a reads its own on C');
  const b2 = await message(A, body, { key: KEYS.b });
  assert.equal(b2.usage.cache_read_input_tokens, b1.usage.cache_creation_input_tokens, 'tenant b reads its own (written on B) on A');
  // Two namespaces in Redis for the one prompt.
  const ns = new Set((await cluster.redis.cli('KEYS', `${PREFIX}:e:*`)).split('\n').filter(Boolean).map((k) => k.split(':')[2]));
  assert.ok(ns.size >= 2, `entries of both tenants' namespaces: ${[...ns]}`);
});

test('a gateway with another namespace secret is refused at start, the cluster unchanged', async () => {
  const check = await cluster.redis.cli('GET', `${PREFIX}:nssecret`);
  const r = await cluster.startGateway('x', { nsSecret: 'a-different-namespace-secret-0123456789', expectRefusal: true });
  assert.notEqual(r.code, 0);
  assert.match(r.err, /namespace.?secret/i, 'the message names the namespace secret');
  assert.doesNotMatch(r.err, new RegExp(NS_SECRET), 'the message does not print the secret');
  assert.equal(await cluster.redis.cli('GET', `${PREFIX}:nssecret`), check);
  assert.equal(await cluster.redis.cli('EXISTS', `${PREFIX}:gw:gw-x`), '0', 'the refused gateway did not register');
  // The same secret with the instance id of a live gateway: refused too, naming the id.
  const d = await cluster.startGateway('dup', { instance: 'gw-a', expectRefusal: true });
  assert.notEqual(d.code, 0);
  assert.match(d.err, /gw-a/, 'the message names the instance id');
  assert.equal((await message(A, { model: MODEL, max_tokens: 1, messages: [{ role: 'user', content: 'still A' }] })).status, 200, 'A still serves');
});

test('malformed change-feed events are rejected and counted by every gateway, the feed flows on', async () => {
  const feed = `${PREFIX}:feed`;
  const ns = '0123456789abcdef';
  const tok = (n) => Buffer.alloc(4 * n, 1); // token id 0x01010101: the checks come first
  const w = (fields) => ['t', 'w', 'o', 'gw-evil', 'ns', ns, 'st', '1', 'wk', 'w-evil', ...fields];
  // Counted under kvgw_registry_feed_events_total's type label; an entry rejected before its
  // type is read (a duplicated field) under type="unknown". tok goes last, as redis-cli -x's
  // stdin (no argument size limit).
  const bad = [
    [...w(['pts', '16:0:1'])].map((x) => (x === ns ? 'not-hex-at-all!!' : x)), // ns not hex
    [...w(['pts', '16:0:1'])], // tok of 3 bytes (below)
    [...w(['pts', '16:0:1,8:0:2'])], // points not increasing
    [...w(['pts', '8:0:1'])], // the last point is not the token count
    [...w(['pts', '16:7:1'])], // TTL class 7
    [...w(['pts', '16:0:1,'])], // a trailing comma
    [...w(['pts', `${(1 << 20) + 1}:0:1`])], // over max_event_tokens (4 MiB of tokens)
    ['t', 'r', 'o', 'gw-evil', 'ns', ns, 'n', '15', 'now', '1'], // n is not the token count
    ['t', 'r', 'o', 'gw-evil', 'ns', ns, 'n', '16'], // no now
    ['t', 'w', 'o', 'gw-evil', 'ns', ns, 'ns', ns, 'st', '1', 'wk', 'w-evil', 'pts', '16:0:1'], // ns twice
    ['t', 'r', 'o', 'gw-evil', 'ns', ns, 'n', '8193', 'now', '1'], // valid tokens, beyond the model's 8192 context
  ];
  const ones = (n) => { const b = Buffer.alloc(4 * n); for (let i = 0; i < n; i++) b[4 * i] = 1; return b; }; // token id 1
  const toks = [tok(16), Buffer.alloc(3), tok(16), tok(16), tok(16), tok(16), tok((1 << 20) + 1), tok(16), tok(16), tok(16), ones(8193)];
  const rejected = async (g) => {
    let n = 0;
    for (const l of (await metrics(g)).text.split('\n')) if (/^kvgw_registry_feed_events_total\{.*result="rejected"/.test(l)) n += Number(l.split(' ').pop());
    return n;
  };
  const applied = async (g) => (await metrics(g)).value('kvgw_registry_feed_events_total{type="w",result="applied"}');
  const before = await Promise.all([A, B, C].map(rejected));
  for (const [i, fields] of bad.entries()) {
    const r = spawnSync('redis-cli', ['-p', String(cluster.redis.port), '-x', 'XADD', feed, '*', ...fields, 'tok'], { input: toks[i], encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^\d+-\d+/, `XADD ${i}: ${r.stdout}`);
  }
  for (const [k, g] of [A, B, C].entries()) {
    await waitFor(`${g.name} to reject the ${bad.length} events`, async () => (await rejected(g)) - before[k] >= bad.length, { timeoutMs: 30000, stepMs: 100 });
    assert.equal((await rejected(g)) - before[k], bad.length, `${g.name}: each malformed event rejected once`);
    assert.ok((await metrics(g)).value('kvgw_registry_feed_events_total{type="unknown",result="rejected"}') >= 1, `${g.name}: the duplicated field counted as type unknown`);
  }
  // Still serving, and the feed still applies A's writes on B and C.
  const appliedBefore = await Promise.all([B, C].map(applied));
  const body = { model: MODEL, max_tokens: 1, system: system(`after-garbage-${process.pid}`), messages: [{ role: 'user', content: 'x' }] };
  const wa = await message(A, body);
  assert.ok(wa.complete && wa.usage.cache_creation_input_tokens > 0);
  for (const [k, g] of [B, C].entries()) {
    await waitFor(`${g.name} to apply A's write from the feed`, async () => (await applied(g)) > appliedBefore[k], { timeoutMs: 30000, stepMs: 50 });
    assert.equal((await message(g, body)).usage.cache_read_input_tokens, wa.usage.cache_creation_input_tokens);
  }
});

test('a stale gateway is fenced: A frozen past its lease, replaced, then resumed, mutates nothing', async () => {
  const reg = `${PREFIX}:gw:gw-a`;
  const fenced = async (g) => {
    const m = await metrics(g);
    let n = 0;
    for (const line of m.text.split('\n')) if (/^kvgw_registry_errors_total\{.*kind="fenced"/.test(line)) n += Number(line.split(' ').pop());
    return { up: m.value('kvgw_registry_up'), fenced: n };
  };
  A.proc.kill('SIGSTOP'); // a partition or a VM freeze: A can neither renew nor notice
  let A2;
  try {
    await waitFor('A\'s registration to lapse', async () => (await cluster.redis.cli('EXISTS', reg)) === '0', { timeoutMs: 30000, stepMs: 100 });
    // Its replacement takes the instance id (its own ledger directory: the old one is locked).
    A2 = await cluster.startGateway('a2', { instance: 'gw-a' });
    cluster.gws.push(A2);
    await cluster.ready(A2);
  } finally {
    A.proc.kill('SIGCONT');
  }
  const nonce = await cluster.redis.cli('GET', reg);
  assert.ok(nonce);
  await waitFor('the resumed A to find itself fenced', async () => { const f = await fenced(A); return f.up === 0 && f.fenced > 0; }, { timeoutMs: 30000, stepMs: 100 });
  assert.equal(await cluster.redis.cli('GET', reg), nonce, 'the replacement\'s registration stands');
  // A still serves, deciding locally, and writes nothing to Redis: B does not read its prefix.
  await waitFor('A ready again (its worker links)', async () => (await fetch(A.base + '/readyz')).status === 200, { stepMs: 100 });
  const body = { model: MODEL, max_tokens: 1, system: system(`fenced-${process.pid}`), messages: [{ role: 'user', content: 'x' }] };
  const wa = await message(A, body);
  assert.ok(wa.complete && wa.usage.cache_creation_input_tokens > 0);
  const rows = new Map(mergedExport(ledgers()).map((x) => [x.request_id, x]));
  assert.equal(rows.get(wa.rid)?.registry, 'local', 'a fenced gateway\'s decision is local');
  const wb = await message(B, body);
  assert.equal(wb.usage.cache_read_input_tokens, 0, 'the fenced A committed nothing that B could read');
  assert.equal(wb.usage.cache_creation_input_tokens, wa.usage.cache_creation_input_tokens);
  // The replacement leaves; once its registration is gone A registers again and is up.
  await kill(A2.proc, 'SIGTERM');
  cluster.gws.splice(cluster.gws.indexOf(A2), 1);
  await waitFor('A to register again', async () => (await fenced(A)).up === 1, { timeoutMs: 30000, stepMs: 100 });
  assert.notEqual(await cluster.redis.cli('GET', reg), nonce, 'A\'s own registration');
  const again = await message(C, body);
  assert.equal(again.usage.cache_creation_input_tokens, 0, 'C reads the prefix B wrote');
});

// A long stream on g; resolves once its first text delta arrived (so it is surely in flight),
// with done: a promise of whether it reached message_stop.
async function longStream(g) {
  const r = await fetch(g.base + '/v1/messages', {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': KEYS.a, 'anthropic-version': '2023-06-01' },
    body: JSON.stringify({ model: MODEL, max_tokens: 4000, stream: true, temperature: 1, messages: [{ role: 'user', content: 'write a long story' }] }),
  });
  assert.equal(r.status, 200);
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let text = '';
  while (!text.includes('content_block_delta')) {
    const { value, done } = await reader.read();
    if (done) break;
    text += dec.decode(value);
  }
  const done = (async () => {
    try {
      for (;;) {
        const { value, done: end } = await reader.read();
        if (end) break;
        text += dec.decode(value);
      }
    } catch { /* cut */ }
    return text.includes('event: message_stop');
  })();
  return { rid: r.headers.get('request-id'), done };
}

test('SIGKILL of a gateway mid-load: every response received in full billed once in the merged export', async () => {
  const CLIENTS = 3;
  const results = [];
  const issued = new Set();
  const live = [A, B, C];
  let stop = false, n = 0, cKilled = false, failure = null;
  const prefixes = [0, 1, 2].map((i) => system(`kill-shared-${i}-${process.pid}`));
  const body = (i) => ({
    model: MODEL, max_tokens: 1 + (i % 6), stream: i % 2 === 0, temperature: 0,
    system: i % 3 === 0 ? system(`kill-fresh-${i}-${process.pid}`) : prefixes[i % prefixes.length],
    messages: [{ role: 'user', content: `load ${i % 4}` }],
  });
  const before = new Set(mergedExport(ledgers()).map((x) => x.request_id));
  const loops = Array.from({ length: CLIENTS }, (_, c) => (async () => {
    let k = c;
    while (!stop) {
      const i = n++;
      // Round robin over the gateways still up; a request cut by the kill is retried on the next.
      const g = live[k++ % live.length];
      const r = await message(g, body(i));
      if (r.rid) issued.add(r.rid);
      results.push(r);
      if (!r.complete && !(g === C && cKilled)) {
        failure = `${g.name} failed a request: ${r.status} ${r.error ?? JSON.stringify(r.json)}`;
        stop = true;
      }
    }
  })());
  const completeCount = () => results.filter((r) => r.complete).length;
  await waitFor('12 responses', () => completeCount() >= 12 || failure, { timeoutMs: 60000, stepMs: 10 });
  const cut = await longStream(C);
  issued.add(cut.rid);
  cKilled = true;
  await kill(C.proc, 'SIGKILL');
  live.splice(live.indexOf(C), 1);
  assert.equal(await cut.done, false, 'the long stream on C was cut by the kill');
  const atKill = completeCount();
  await waitFor('12 more responses from A and B', () => completeCount() >= atKill + 12 || failure, { timeoutMs: 60000, stepMs: 20 });
  stop = true;
  await Promise.all(loops);
  assert.equal(failure, null);

  const complete = results.filter((r) => r.complete);
  console.log(`sigkill: ${results.length} requests, ${complete.length} received in full (${complete.filter((r) => r.gw === 'C').length} from C), ` +
    `${results.length - complete.length} cut by the kill`);
  assert.ok(complete.some((r) => r.gw === 'C'), 'C answered before the kill');

  const check = (rows, what) => {
    const byRid = new Map(), byEvent = new Set();
    const cutUnseen = results.filter((r) => r.gw === 'C' && !r.complete && !r.rid).length;
    let unseen = 0;
    for (const r of rows.filter((x) => x.kind === undefined || x.kind === 'usage')) {
      assert.ok(!byEvent.has(r.event_id), `${what}: event ${r.event_id} twice`);
      byEvent.add(r.event_id);
      assert.ok(!byRid.has(r.request_id), `${what}: request ${r.request_id} billed twice`);
      byRid.set(r.request_id, r);
      // Every billed request is one a client sent: one whose id it saw, or one cut by the kill
      // before its headers arrived (billed before it was sent: the gateway never answers unbilled).
      if (!before.has(r.request_id) && !issued.has(r.request_id)) {
        assert.equal(r.instance, 'gw-c', `${what}: ${r.request_id} billed by ${r.instance}, never sent`);
        unseen++;
      }
    }
    assert.ok(unseen <= cutUnseen, `${what}: ${unseen} events of C for requests whose id no client saw, ${cutUnseen} requests cut before their headers`);
    for (const r of complete) {
      const row = byRid.get(r.rid);
      assert.ok(row, `${what}: ${r.rid} (${r.gw}, ${r.stream ? 'stream' : 'message'}) received in full, not billed`);
      assert.equal(usageMismatch(row, r.usage), null, `${what}: ${r.rid}`);
      assert.ok(['shared', 'local'].includes(row.registry), `${what}: ${r.rid} registry ${row.registry}`);
    }
    return byRid;
  };
  // The merged export over the three ledgers, C's as the kill left it.
  const crashed = check(mergedExport(ledgers()), 'merged export (C killed)');

  // C's claims and its registration expire (claim_ttl 5 s, lease 5 s in the harness).
  await waitFor('C\'s claims to expire', async () => {
    const claims = (await cluster.redis.cli('KEYS', `${PREFIX}:c:*`)).split('\n').filter(Boolean);
    for (const k of claims) if ((await cluster.redis.cli('GET', k).catch(() => '')).includes(' gw-c ')) return false;
    return true;
  }, { timeoutMs: 30000, stepMs: 200 });
  await waitFor('C\'s registration to expire', async () => (await cluster.redis.cli('EXISTS', `${PREFIX}:gw:gw-c`)) === '0', { timeoutMs: 30000, stepMs: 200 });

  // C restarts on its ledger (the recovery cuts only a torn tail) and rejoins: it reads what A
  // writes.
  const c2 = await cluster.startGateway('c');
  cluster.gws.push(c2);
  await cluster.ready(c2);
  const rejoin = { model: MODEL, max_tokens: 1, system: system(`rejoin-${process.pid}`), messages: [{ role: 'user', content: 'x' }] };
  const wa = await message(A, rejoin);
  const again = await message(c2, rejoin);
  assert.ok(again.complete, 'C serves again');
  assert.equal(again.usage.cache_read_input_tokens, wa.usage.cache_creation_input_tokens, 'C reads what A wrote');
  await Promise.all([A, B, c2].map((g) => kill(g.proc, 'SIGTERM')));
  issued.add(wa.rid).add(again.rid);
  const clean = check(mergedExport(ledgers()), 'merged export (after C\'s recovery)');
  for (const [rid, row] of crashed) assert.deepEqual(clean.get(rid), row, `${rid}: the same row after the recovery`);
  assert.ok(clean.has(again.rid) && clean.has(wa.rid));
  assert.equal(clean.size, crashed.size + 2);
});
