// registry_smoke.test.mjs — many gateways, one cache (issue 22), the quick check: a real
// redis-server (a temporary directory, a random port), one `kvgw worker`, two `kvgw serve` (A
// and B) with the registry on. A prompt written through A is billed as a read through B with
// the exact token counts (the response, the kvgw-cache header, the access log and B's ledger),
// both decisions say registry=shared; the same new prompt sent to A and B at once bills one
// write and one read of it; a third gateway whose namespace secret differs, and one
// that reuses A's live instance id, are refused at start with a clear message; with Redis
// stopped A keeps serving, its decisions marked registry: local (header, ledger). The big suite
// (three gateways, both SDKs, races, failures) is scaleout*.test.mjs.
//
// Run: KVGW_BIN=build/bin/kvgw node --test tests/integration/registry_smoke.test.mjs (repository
// root; CTest does this as gateway_registry_smoke).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, readFileSync, existsSync } from 'node:fs';
import { createConnection } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BIN, MODEL, KEY, startGateway, stopGateway, writeConfig, exportJsonl, sleep } from './harness.mjs';

const SECRET = 'registry-smoke-namespace-secret';
const procs = [];
let dir, redisPort, workerPort, gwA, gwB;

// A real redis-server on a random free port (it picks none itself: try a few).
async function startRedis() {
  for (let attempt = 0; attempt < 20; attempt++) {
    const port = 20000 + Math.floor(Math.random() * 30000);
    const p = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir,
      '--save', '', '--appendonly', 'no', '--maxmemory-policy', 'noeviction'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    p.stdout.on('data', (d) => { out += d; });
    const ok = await new Promise((resolve) => {
      p.on('exit', () => resolve(false));
      const t = setInterval(() => {
        if (/Ready to accept connections/.test(out)) { clearInterval(t); resolve(true); }
      }, 50);
    });
    if (ok) { procs.push(p); return port; }
  }
  throw new Error('no redis-server started');
}

// One command over RESP (for the test's own look at Redis); resolves to the raw reply text.
function redis(...args) {
  return new Promise((resolve, reject) => {
    const s = createConnection(redisPort, '127.0.0.1');
    let buf = '';
    s.on('data', (d) => { buf += d; if (buf.endsWith('\r\n')) { s.end(); resolve(buf); } });
    s.on('error', reject);
    s.write(`*${args.length}\r\n` + args.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join(''));
  });
}

function startWorker() {
  const p = spawn(BIN, ['worker', '--model', 'models/kvgw-demo.gguf', '--listen', '127.0.0.1:0', '--threads', '1', '--name', 'smoke-w1'],
    { stdio: ['ignore', 'pipe', 'pipe'] });
  procs.push(p);
  let err = '';
  p.stderr.on('data', (d) => { err += d; });
  return new Promise((resolve, reject) => {
    let out = '';
    p.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on 127\.0\.0\.1:(\d+)/);
      if (m) resolve(Number(m[1]));
    });
    p.on('exit', (code) => reject(new Error(`worker exited ${code}:\n${err}`)));
  });
}

// registry.timeout is generous here: a claim past it is decided locally (and may bill a second
// write), which a loaded 2-core CI machine must not turn into a flaky race below.
function config(name, { secret = SECRET, lease = '3s', instance = name, accounting = 'token' } = {}) {
  return writeConfig(dir, `listen: 127.0.0.1:0
models:
  - name: ${MODEL}
    path: models/kvgw-demo.gguf
    min_cache_tokens: 16
    remote: ['127.0.0.1:${workerPort}']
api_keys:
  - {key: ${KEY}, id: key-a, tenant: tenant-a}
admin_key: sk-test-admin
workers:
  heartbeat: 200ms
cache:
  namespace_secret: ${secret}
  accounting: ${accounting}
billing:
  ledger_dir: ${dir}/ledger-${name}
  instance_id: ${instance}
  fsync: batch
  storage_interval: 200ms
redis:
  address: 127.0.0.1:${redisPort}
  prefix: smoke
registry:
  enabled: true
  lease: ${lease}
  timeout: 2s
log:
  access_log: ${dir}/access-${name}.log
`, `${name}.yaml`);
}

async function waitFor(what, fn) {
  for (let i = 0; ; i++) {
    if (await fn()) return;
    if (i > 600) throw new Error(`gave up waiting for ${what}`);
    await sleep(100);
  }
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kvgw-regsmoke-'));
  redisPort = await startRedis();
  workerPort = await startWorker();
  gwA = await startGateway(config('gw-a'));
  gwB = await startGateway(config('gw-b'));
  for (const g of [gwA, gwB])
    await waitFor('/readyz', async () => (await fetch(g.base + '/readyz')).status === 200);
});

after(async () => {
  for (const g of [gwA, gwB]) if (g && g.proc.exitCode === null) await stopGateway(g);
  for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

function system(tag) {
  let s = `You are the registry smoke assistant ${tag}. `;
  for (let i = 0; i < 30; i++) s += `Rule ${i}: answer briefly and cite section ${i}. `;
  return [{ type: 'text', text: s, cache_control: { type: 'ephemeral' } }];
}

async function ask(gw, sys, salt) {
  const r = await fetch(gw.base + '/v1/messages', {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': KEY, 'anthropic-version': '2023-06-01' },
    body: JSON.stringify({ model: MODEL, max_tokens: 3, system: sys, messages: [{ role: 'user', content: 'What is rule 3?' }],
      ...(salt !== undefined ? { cache_salt: salt } : {}) }),
  });
  const j = await r.json();
  assert.equal(r.status, 200, JSON.stringify(j));
  return { j, cache: r.headers.get('kvgw-cache'), id: r.headers.get('request-id') };
}

const metricsOf = async (gw) => (await fetch(gw.base + '/metrics', { headers: { authorization: 'Bearer sk-test-admin' } })).text();
// The registry ops Redis answered (kvgw_registry_op_seconds_count by op), once nothing is
// queued any more (commits and reads are fire-and-forget: a request's are queued by its end).
async function regOps(gw) {
  let m;
  await waitFor('an empty registry queue', async () => /^kvgw_registry_replay_pending 0$/m.test(m = await metricsOf(gw)));
  const n = (op) => Number((m.match(new RegExp(`^kvgw_registry_op_seconds_count\\{op="${op}"\\} (\\d+)$`, 'm')) || [0, 0])[1]);
  return { claim: n('claim'), commit: n('commit'), read: n('read'), release: n('release') };
}
const feedWrites = async (gw) => Number(((await metricsOf(gw)).match(/^kvgw_registry_feed_events_total\{type="w",result="applied"\} (\d+)$/m) || [0, 0])[1]);

const ownLedger = async (gw) => (await (await fetch(gw.base + '/admin/v1/usage?scope=local&format=jsonl',
  { headers: { 'x-api-key': 'sk-test-admin' } })).text()).split('\n').filter(Boolean).map((l) => JSON.parse(l));

test('storage: the meter\'s holder bills a salted namespace written only through the other gateway, once', async () => {
  // Exactly one of A and B holds the storage meter; the other one writes.
  let holder, writer;
  await waitFor('one storage meter', async () => {
    const held = [];
    for (const g of [gwA, gwB]) if (/^kvgw_registry_storage_meter 1$/m.test(await metricsOf(g))) held.push(g);
    if (held.length !== 1) return false;
    holder = held[0];
    writer = holder === gwA ? gwB : gwA;
    return true;
  });
  // A salted namespace: the holder cannot derive it from its configuration, only the feed's
  // t=w event (tenant, model) names its owner.
  const x = await ask(writer, system('salted storage'), 'smoke-salt-storage');
  assert.ok(x.j.usage.cache_creation_input_tokens > 100, JSON.stringify(x.j.usage));
  let ns;
  await waitFor('the writer\'s usage event', async () => {
    const ev = (await ownLedger(writer)).find((r) => r.request_id === x.id);
    ns = ev && ev.namespace;
    return !!ns;
  });
  let st;
  await waitFor('the holder\'s storage events of the salted namespace', async () => {
    st = (await ownLedger(holder)).filter((r) => r.kind === 'storage' && r.namespace === ns);
    return st.length > 0;
  });
  for (const e of st) {
    assert.equal(e.tenant, 'tenant-a');
    assert.equal(e.model, MODEL);
    assert.equal(e.registry, 'shared');
    assert.ok(e.usage.storage_token_ms > 0);
  }
  assert.ok(!(await ownLedger(holder)).some((r) => r.request_id === x.id), 'the holder never served it');
  // Exactly once: the writer holds the entry too, but does not bill its storage.
  assert.deepEqual((await ownLedger(writer)).filter((r) => r.kind === 'storage' && r.namespace === ns), []);
});

test('the same new prompt on A and B at once: exactly one write, the other a read of it', async () => {
  for (let round = 0; round < 3; round++) {
    const sys = system(`race ${round}`);
    const [a, b] = await Promise.all([ask(gwA, sys), ask(gwB, sys)]);
    const w = [a, b].map((x) => x.j.usage.cache_creation_input_tokens);
    const r = [a, b].map((x) => x.j.usage.cache_read_input_tokens);
    const writer = w[0] > 0 ? 0 : 1;
    assert.ok(w[writer] > 100, JSON.stringify([a.j.usage, b.j.usage]));
    assert.equal(w[1 - writer], 0, 'one write only: ' + JSON.stringify([a.j.usage, b.j.usage]));
    assert.equal(r[writer], 0);
    assert.equal(r[1 - writer], w[writer], 'the other reads exactly what was written');
    for (const x of [a, b]) assert.match(x.cache, /registry=shared/);
  }
});

test('written through A, billed as a read through B, exactly; both decisions shared', async () => {
  const sys = system('one');
  const fedB = await feedWrites(gwB);
  const opsA0 = await regOps(gwA);
  const a = await ask(gwA, sys);
  const written = a.j.usage.cache_creation_input_tokens;
  assert.ok(written > 100, JSON.stringify(a.j.usage));
  assert.equal(a.j.usage.cache_read_input_tokens, 0);
  assert.match(a.cache, /outcome=write; .*registry=shared/);
  // A write costs two registry ops: the claim and the commit.
  const opsA1 = await regOps(gwA);
  assert.deepEqual([opsA1.claim - opsA0.claim, opsA1.commit - opsA0.commit, opsA1.read - opsA0.read], [1, 1, 0]);

  // B's replica has it from the feed: the cached read there costs one op (the read), no claim
  // and no commit of the entry it merely extended.
  await waitFor('A\'s write on B\'s feed', async () => (await feedWrites(gwB)) > fedB);
  const opsB0 = await regOps(gwB);
  const b = await ask(gwB, sys);
  const opsB1 = await regOps(gwB);
  assert.deepEqual([opsB1.claim - opsB0.claim, opsB1.commit - opsB0.commit, opsB1.read - opsB0.read], [0, 0, 1]);
  // The same on A, which wrote it.
  await ask(gwA, sys);
  const opsA2 = await regOps(gwA);
  assert.deepEqual([opsA2.claim - opsA1.claim, opsA2.commit - opsA1.commit, opsA2.read - opsA1.read], [0, 0, 1]);
  assert.equal(b.j.usage.cache_read_input_tokens, written, JSON.stringify(b.j.usage));
  assert.equal(b.j.usage.cache_creation_input_tokens, 0);
  assert.equal(b.j.usage.input_tokens, a.j.usage.input_tokens);
  assert.match(b.cache, new RegExp(`outcome=hit; read=${written}; write=0; .*registry=shared`));

  // Redis holds the entry under the configured prefix; B's access log says how it decided.
  assert.match(await redis('KEYS', 'smoke:e:*'), /smoke:e:[0-9a-f]{16}:[0-9a-f]{32}/);
  const logB = join(dir, 'access-gw-b.log');
  // The log is written in blocks: wait for B's whole line (its newline), not just its start.
  const lineOf = () => existsSync(logB) && readFileSync(logB, 'utf8').split('\n').slice(0, -1).find((l) => l.includes(b.id));
  await waitFor('B\'s access log line', () => !!lineOf());
  const line = JSON.parse(lineOf());
  assert.equal(line.registry, 'shared');
  assert.equal(line.cache_read, written);

  const m = await metricsOf(gwB);
  assert.match(m, /^kvgw_registry_up 1$/m);
  assert.match(m, /^kvgw_registry_decisions_total\{registry="shared"\} [1-9]/m);
  assert.match(m, /^kvgw_gateway_info\{instance_id="gw-b"\} 1$/m);
  assert.deepEqual(await (await fetch(gwB.base + '/healthz')).json(), { status: 'ok', registry: 'up' });

  // B's ledger: the read, exact, once.
  const { code } = await stopGateway(gwB);
  assert.equal(code, 0, gwB.stderr());
  const rows = exportJsonl(join(dir, 'ledger-gw-b'));
  assert.ok(rows !== null, 'kvgw billing export is built');
  const ev = rows.filter((r) => r.request_id === b.id);
  assert.equal(ev.length, 1, JSON.stringify(rows));
  assert.equal(ev[0].usage.cache_read_tokens, written);
  assert.equal(ev[0].usage.cache_write_5m_tokens, 0);
  assert.equal(ev[0].registry, 'shared');
});

test('a gateway with another namespace secret is refused at start', () => {
  const r = spawnSync(BIN, ['serve', '--config', config('gw-c', { secret: 'another-namespace-secret-entirely' })],
    { encoding: 'utf8', timeout: 60000 });
  assert.equal(r.status, 1, r.stderr);
  assert.match(r.stderr, /kvgw serve: refusing to start: registry: .*cache\.namespace_secret must be the same on every gateway that shares redis\.prefix smoke/);
  assert.doesNotMatch(r.stdout, /listening on/);
});

test('a gateway that would bill otherwise (another cache.accounting) is refused at start', () => {
  const r = spawnSync(BIN, ['serve', '--config', config('gw-s', { accounting: 'anthropic' })], { encoding: 'utf8', timeout: 60000 });
  assert.equal(r.status, 1, r.stderr);
  assert.match(r.stderr, /kvgw serve: refusing to start: registry: setting cache\.accounting is 'anthropic' here but 'token' in smoke:settings .*every gateway that shares redis\.prefix smoke must have the same billing settings/);
  assert.doesNotMatch(r.stdout, /listening on/);
});

test('a second gateway with a live gateway\'s instance id is refused at start', () => {
  const r = spawnSync(BIN, ['serve', '--config', config('gw-a2', { instance: 'gw-a' })], { encoding: 'utf8', timeout: 60000 });
  assert.equal(r.status, 1, r.stderr);
  assert.match(r.stderr, /kvgw serve: refusing to start: registry: .*billing\.instance_id gw-a is in use by a live gateway/);
  assert.doesNotMatch(r.stdout, /listening on/);
  assert.equal(gwA.proc.exitCode, null, 'A keeps serving');
});

test('Redis stopped: A keeps serving from its own view, its decisions marked local', async () => {
  const redisProc = procs.find((p) => p.spawnfile === 'redis-server');
  redisProc.kill('SIGTERM');
  await new Promise((r) => redisProc.once('exit', r));
  await waitFor('A to see Redis down', async () => (await (await fetch(gwA.base + '/healthz')).json()).registry === 'down');
  const x = await ask(gwA, system('while redis is down'));
  assert.ok(x.j.usage.cache_creation_input_tokens > 100, JSON.stringify(x.j.usage));
  assert.match(x.cache, /outcome=write; .*registry=local/);
  const y = await ask(gwA, system('while redis is down')); // the replica still serves its own write
  assert.equal(y.j.usage.cache_read_input_tokens, x.j.usage.cache_creation_input_tokens);
  assert.match(y.cache, /registry=local/);
  const m = await metricsOf(gwA);
  assert.match(m, /^kvgw_registry_up 0$/m);
  assert.match(m, /^kvgw_registry_decisions_total\{registry="local"\} [2-9]/m);
  const { code } = await stopGateway(gwA);
  assert.equal(code, 0, gwA.stderr());
  const rows = exportJsonl(join(dir, 'ledger-gw-a')).filter((r) => r.request_id === x.id || r.request_id === y.id);
  assert.deepEqual(rows.map((r) => r.registry), ['local', 'local']);
});
