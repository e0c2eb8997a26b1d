// tiers.test.mjs — the KV tiers through the gateway (issue 21): a worker whose pool holds about
// two prompts keeps the blocks that leave it on its local disk (G3), and a prompt evicted from
// the pool is read back from the disk instead of being recomputed:
//   - in process (`kvgw serve` with a 512 KiB pool and `kv_tiers` on): a long prompt is answered,
//     evicted by two others, asked again: its `kvgw-cache` header says `worker_tiers=...g3:N`
//     with N > 0, the answer is the first one's (temperature 0), a streamed answer's head carries
//     worker_tiers as well (it waits for the worker's PREFILL), and the tier metrics count the
//     writes, the loads and the tokens loaded instead of prefilled;
//   - in process, with cache_control: a retained prompt pushed out of the pool by another is
//     demoted to G3 in the gateway's index (KV_EVENT EVICTED's tier), so the router still counts
//     the worker as its holder, and a read brings it back to G1;
//   - cluster mode: a remote `kvgw worker --kv-tier-dir` that cached a prompt is killed (SIGKILL)
//     and started again on the same directory; its SNAPSHOT lists what its disk kept, so the
//     gateway knows it holds the prompt in G3 (`kvgw_worker_indexed_tokens{tier="g3"}`), routes
//     the prompt back to it rather than to the other, empty worker, and the answer is again a G3
//     read and the same text.
//
// Run by CTest (tests/integration/CMakeLists.txt) with KVGW_BIN, the repository root as the
// working directory: node --test tests/integration/tiers.test.mjs
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BIN, MODEL, KEY, startGateway, stopGateway, exited, sleep, writeConfig } from './harness.mjs';

const ADMIN = 'sk-test-admin';
const dirs = [];
const procs = [];

after(() => {
  for (const p of procs) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

function tempDir() {
  const d = mkdtempSync(join(tmpdir(), 'kvgw-tiers-'));
  dirs.push(d);
  return d;
}

// The gateway's config: the demo model with its workers (model, YAML lines of the model's
// mapping), then extra top-level sections.
function config(dir, model, extra) {
  return `listen: 127.0.0.1:0
models:
  - name: ${MODEL}
    path: models/kvgw-demo.gguf
    min_cache_tokens: 16
    ${model}
api_keys:
  - {key: ${KEY}, id: key-a, tenant: tenant-a}
admin_key: ${ADMIN}
cache:
  namespace_secret: tiers-test-namespace-secret
billing:
  ledger_dir: ${dir}/ledger
  pricing: conf/pricing.yaml
log:
  access_log: "off"
${extra}`;
}

// A system prompt of about 500 tokens, different from the first token on for every tag.
function system(tag, cache) {
  let s = `${tag}: you are the archivist of ${tag}. `;
  for (let i = 0; i < 45; i++) s += `Record ${i} of ${tag} is filed under shelf ${(i * 7) % 13}. `;
  const block = { type: 'text', text: s };
  if (cache) block.cache_control = { type: 'ephemeral' };
  return [block];
}

function body(tag, cache = false) {
  return { model: MODEL, max_tokens: 8, temperature: 0, system: system(tag, cache),
    messages: [{ role: 'user', content: 'Which shelf holds record 12?' }] };
}

async function ask(base, b) {
  const r = await fetch(base + '/v1/messages', {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': KEY, 'anthropic-version': '2023-06-01' },
    body: JSON.stringify(b),
  });
  const json = await r.json();
  assert.equal(r.status, 200, JSON.stringify(json));
  const cache = r.headers.get('kvgw-cache') ?? '';
  const m = /worker_tiers=g1:(\d+),g2:(\d+),g3:(\d+),recompute:(\d+)/.exec(cache);
  assert.ok(m, `kvgw-cache has worker_tiers: ${cache}`);
  const held = /worker_cached=(\d+)/.exec(cache);
  return { cache, worker: r.headers.get('kvgw-worker'), rid: r.headers.get('request-id'), text: json.content.map((c) => c.text).join(''),
    usage: json.usage, g1: Number(m[1]), g2: Number(m[2]), g3: Number(m[3]), recompute: Number(m[4]),
    workerCached: Number(held[1]) };
}

async function metrics(base) {
  const text = await (await fetch(base + '/metrics', { headers: { authorization: `Bearer ${ADMIN}` } })).text();
  const out = new Map();
  for (const line of text.split('\n')) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$/.exec(line);
    if (m) out.set(m[1] + (m[2] ?? ''), Number(m[3]));
  }
  return out;
}
const sumOf = (mm, name, ...parts) => [...mm].filter(([k]) => k.startsWith(name + '{') && parts.every((p) => k.includes(p)))
  .reduce((a, [, v]) => a + v, 0);

// Polls /metrics until pred(metrics) holds; fails with the worker and tier series it saw last
// after timeoutMs.
async function until(base, what, pred, timeoutMs = 30000) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const mm = await metrics(base);
    if (pred(mm)) return mm;
    if (Date.now() >= end) {
      const seen = [...mm].filter(([k]) => /^kvgw_(worker|prompt)/.test(k)).map(([k, v]) => `${k} ${v}`);
      assert.fail(`timed out waiting for ${what}; /metrics had:\n${seen.join('\n')}`);
    }
    await sleep(100);
  }
}

test('in process: a prompt evicted from a tiny pool is read back from the disk tier', async () => {
  const dir = tempDir();
  const cfg = writeConfig(dir, config(dir, 'workers: 1\n    threads: 1\n    kv_cache: 512KiB',
    `kv_tiers:\n  dir: ${dir}/kv-tiers\n  max_bytes: 64MiB\n`).replace('access_log: "off"', `access_log: ${dir}/access.log`));
  const gw = await startGateway(cfg);
  procs.push(gw.proc);
  try {
    const first = await ask(gw.base, body('alpha'));
    assert.equal(first.g3, 0, `a cold prompt: ${first.cache}`);
    // Two other prompts of the same size push alpha out of the ~1,024-token pool; its blocks
    // go to the disk on the way out. The write-behind queue writes them a moment later, so a
    // read that comes too soon finds a part in no tier and recomputes it: then evict again.
    let again;
    for (let round = 0; round < 5; round++) {
      await ask(gw.base, body(`beta-${round}`));
      await ask(gw.base, body(`gamma-${round}`));
      await sleep(300);
      again = await ask(gw.base, body('alpha'));
      if (again.g3 > 0) break;
    }
    assert.ok(again.g3 >= 256, `read back from the disk tier: ${again.cache}`);
    assert.equal(again.g3 % 16, 0, 'whole 16-token blocks');
    assert.ok(again.g1 + again.g2 + again.g3 + again.recompute <= again.usage.input_tokens +
      again.usage.cache_read_input_tokens + again.usage.cache_creation_input_tokens, again.cache);
    assert.equal(again.text, first.text, 'the same answer from loaded KV as from a cold prefill');
    // The access log says the same (written out by the gateway's 250 ms tick).
    let line;
    for (let i = 0; i < 50 && !line; i++, await sleep(100))
      line = readFileSync(join(dir, 'access.log'), 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l))
        .find((l) => l.request_id === again.rid);
    assert.ok(line, 'the g3 read is in the access log');
    assert.deepEqual([line.kv_g1, line.kv_g2, line.kv_g3, line.kv_recomputed], [again.g1, again.g2, again.g3, again.recompute]);
    // A stream's head waits for the worker's PREFILL report, so its kvgw-cache is complete too.
    const r = await fetch(gw.base + '/v1/messages', {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-api-key': KEY, 'anthropic-version': '2023-06-01' },
      body: JSON.stringify({ ...body('alpha'), stream: true }),
    });
    assert.equal(r.status, 200);
    assert.match(r.headers.get('kvgw-cache') ?? '', /; worker_tiers=g1:\d+,g2:0,g3:\d+,recompute:\d+$/);
    const sse = await r.text();
    assert.match(sse, /event: message_stop/);
    const mm = await until(gw.base, 'the worker\'s tier counters', (m) =>
      sumOf(m, 'kvgw_worker_tier_loads_total', 'tier="g3"') > 0);
    assert.ok(sumOf(mm, 'kvgw_worker_tier_max_bytes', 'tier="g3"') === 64 * 1024 * 1024, 'the budget');
    assert.ok(sumOf(mm, 'kvgw_worker_tier_writes_total', 'tier="g3"') >= again.g3 / 16, 'written blocks');
    assert.ok(sumOf(mm, 'kvgw_worker_tier_recomputes_avoided_tokens_total', 'tier="g3"') >= again.g3);
    assert.ok(sumOf(mm, 'kvgw_prompt_tokens_by_source_total', 'source="g3"') >= again.g3);
    assert.equal(sumOf(mm, 'kvgw_worker_tier_corrupt_records_total'), 0);
    // A CPU worker has no host-memory tier: no g2 series.
    assert.equal([...mm.keys()].filter((k) => k.includes('tier="g2"') && k.startsWith('kvgw_worker_tier_')).length, 0);
  } finally {
    await stopGateway(gw);
  }
});

test('in process: retained prompts pushed out of the pool go down to G3 in the gateway\'s index', async () => {
  const dir = tempDir();
  const cfg = writeConfig(dir, config(dir, 'workers: 1\n    threads: 1\n    kv_cache: 512KiB',
    `kv_tiers:\n  dir: ${dir}/kv-tiers\n  max_bytes: 64MiB\n`));
  const gw = await startGateway(cfg);
  procs.push(gw.proc);
  try {
    const w = 'worker="local-0"';
    const first = await ask(gw.base, body('epsilon', true));
    const entry = first.usage.cache_creation_input_tokens;
    assert.ok(entry > 256, JSON.stringify(first.usage));
    await until(gw.base, 'epsilon in the pool', (m) => sumOf(m, 'kvgw_worker_indexed_tokens', w, 'tier="g1"') >= entry);
    // The pool holds one such prompt: zeta's prefill pushes epsilon out (its pin lapses under
    // the pressure); the worker's EVICTED event says it went to G3, and the index keeps the
    // worker as its holder there instead of forgetting it.
    await ask(gw.base, body('zeta', true));
    // (Counted once per token of the index: the few tokens epsilon shares with zeta, the chat
    // template's, stay in the pool.)
    const demoted = await until(gw.base, 'epsilon demoted to G3', (m) =>
      sumOf(m, 'kvgw_worker_indexed_tokens', w, 'tier="g3"') > entry - 32);
    const zeta = sumOf(demoted, 'kvgw_worker_indexed_tokens', w, 'tier="g1"');
    assert.ok(zeta > 256, 'zeta in the pool');
    const again = await ask(gw.base, body('epsilon', true));
    assert.match(again.cache, /^outcome=hit; /);
    assert.equal(again.workerCached, entry, `the router knew the worker held it: ${again.cache}`);
    // Some of it from the disk: how much is the cost model's choice from the speeds it measured
    // (a loaded machine's slow reads against its prefill rate can make it recompute the tail).
    assert.ok(again.g3 >= 16, `read from the disk: ${again.cache}`);
    assert.equal(again.text, first.text);
    // Read back into the pool: it is in G1 again (and zeta went down in its place).
    await until(gw.base, 'epsilon back in G1, zeta in G3', (m) =>
      sumOf(m, 'kvgw_worker_indexed_tokens', w, 'tier="g1"') >= entry &&
      sumOf(m, 'kvgw_worker_indexed_tokens', w, 'tier="g3"') > zeta - 32);
  } finally {
    await stopGateway(gw);
  }
});

// A TCP port nobody listens on right now (the restarted worker must come back on the same one).
function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
  });
}

function startWorker(port, tierDir, name) {
  const p = spawn(BIN, ['worker', '--model', 'models/kvgw-demo.gguf', '--listen', `127.0.0.1:${port}`, '--threads', '1',
    '--name', name, '--kv-tokens', '1024', '--kv-tier-dir', tierDir, '--kv-tier-bytes', '64MiB'],
  { stdio: ['ignore', 'pipe', 'pipe'] });
  procs.push(p);
  let err = '';
  p.stderr.on('data', (d) => { err += d; });
  return new Promise((resolve, reject) => {
    let out = '';
    const t = setTimeout(() => reject(new Error(`worker ${name} did not start:\n${err}`)), 60000);
    p.stdout.on('data', (d) => {
      out += d;
      if (/listening on 127\.0\.0\.1:\d+/.test(out)) { clearTimeout(t); resolve({ p, addr: `127.0.0.1:${port}` }); }
    });
    p.on('exit', (code) => { clearTimeout(t); reject(new Error(`worker ${name} exited ${code}:\n${err}`)); });
  });
}

test('cluster: a remote worker killed and restarted on its disk tier still serves a G3 hit', async () => {
  const dir = tempDir();
  const ports = [await freePort(), await freePort()];
  const tierDirs = [join(dir, 'w0-tiers'), join(dir, 'w1-tiers')];
  let ws = [await startWorker(ports[0], tierDirs[0], 'w0'), await startWorker(ports[1], tierDirs[1], 'w1')];
  const cfg = writeConfig(dir, config(dir, `remote: [${ws[0].addr}, ${ws[1].addr}]`, 'workers:\n  heartbeat: 200ms\n'));
  const gw = await startGateway(cfg);
  procs.push(gw.proc);
  try {
    await until(gw.base, 'both workers up', (m) => sumOf(m, 'kvgw_worker_up') === 2);
    // A retained prompt (cache_control): written through to the disk when it is pinned.
    const first = await ask(gw.base, body('delta', true));
    assert.ok(first.usage.cache_creation_input_tokens > 256, JSON.stringify(first.usage));
    const v = ws.findIndex((w) => w.addr === first.worker);
    assert.ok(v >= 0, `routed to ${first.worker}`);
    const victim = `worker="${ws[v].addr}"`;
    // Written through by the worker's write-behind queue: wait for every whole block of the
    // retained prefix (on a loaded machine a kill after the first few found only part of it on
    // disk, and the SNAPSHOT then lists a chain shorter than the gateway's entry).
    const blocks = Math.floor(first.usage.cache_creation_input_tokens / 16);
    await until(gw.base, 'the prompt on the victim\'s disk', (m) =>
      sumOf(m, 'kvgw_worker_tier_blocks', victim, 'tier="g3"') >= blocks);

    ws[v].p.kill('SIGKILL');
    await exited(ws[v].p);
    await until(gw.base, 'the victim down', (m) => sumOf(m, 'kvgw_worker_up', victim) === 0);
    ws[v] = await startWorker(ports[v], tierDirs[v], `w${v}-again`);
    // Back up, with its SNAPSHOT: the gateway's index has it holding the prompt in G3.
    const mm = await until(gw.base, 'the victim\'s disk in the index', (m) =>
      sumOf(m, 'kvgw_worker_up', victim) === 1 && sumOf(m, 'kvgw_worker_indexed_tokens', victim, 'tier="g3"') > 256);
    assert.equal(sumOf(mm, 'kvgw_worker_indexed_tokens', victim, 'tier="g1"'), 0, 'nothing in its new pool');

    const again = await ask(gw.base, body('delta', true));
    assert.equal(again.worker, ws[v].addr, 'routed to the worker whose disk holds the prompt');
    assert.ok(again.workerCached > 256, `the router knew: ${again.cache}`);
    assert.ok(again.g3 >= 256, `read back from the disk after the restart: ${again.cache}`);
    assert.equal(again.text, first.text, 'the same answer after the restart');
    assert.ok(again.usage.cache_read_input_tokens > 256, 'billed as a read, as before tiers');
  } finally {
    await stopGateway(gw);
  }
});
