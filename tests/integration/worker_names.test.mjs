// worker_names.test.mjs — remote workers named by host name (link/worker_client.h): the gateway
// is configured with `localhost:PORT` (a real `kvgw worker` that itself listens on a name,
// `localhost:0`) next to `no-such-host.invalid:7001` (.invalid never resolves, RFC 6761).
// Requests are served by the working worker; the bad one is reported in the log (once, not at
// every retry) and in /metrics as down; the gateway stays up. A worker restarted on the same
// name is found again (the name is resolved afresh at every reconnect). `kvgw check-config`
// accepts host names and refuses broken addresses with file:line.
//
// Run by CTest (tests/integration/CMakeLists.txt): node --test tests/integration/worker_names.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BIN, MODEL, KEY, startGateway, stopGateway, exited, sleep } from './harness.mjs';

const SECRET = 'worker-names-test-link-secret-0123';
const BAD = 'no-such-host.invalid:7001';
const procs = [];
let dir, gw, worker, port;

function startWorker(listen) {
  const p = spawn(BIN, ['worker', '--model', 'models/kvgw-demo.gguf', '--listen', listen, '--threads', '1', '--name', 'wn'],
    { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, KVGW_LINK_SECRET: SECRET } });
  procs.push(p);
  let err = '';
  p.stderr.on('data', (d) => { err += d; });
  return new Promise((resolve, reject) => {
    let out = '';
    const t = setTimeout(() => reject(new Error(`worker did not start:\n${err}`)), 60000);
    p.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (127\.0\.0\.1):(\d+)/);
      if (m) { clearTimeout(t); resolve({ p, port: Number(m[2]) }); }
    });
    p.on('exit', (code) => { clearTimeout(t); reject(new Error(`worker exited ${code}:\n${err}`)); });
  });
}

function config(remote) {
  return `listen: 127.0.0.1:0
models:
  - name: ${MODEL}
    path: models/kvgw-demo.gguf
    min_cache_tokens: 16
    remote:
${remote.map((r) => `      - '${r}'`).join('\n')}
api_keys:
  - {key: ${KEY}, id: key-a, tenant: tenant-a}
workers:
  link_secret: env:KVGW_TEST_LINK_SECRET
  heartbeat: 200ms
  connect_timeout: 1s
cache:
  namespace_secret: worker-names-test-namespace-secret
billing:
  ledger_dir: ${dir}/ledger
log:
  access_log: "off"
`;
}

async function waitFor(what, fn, ms = 20000) {
  const end = Date.now() + ms;
  for (;;) {
    if (await fn()) return;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

// The config sets no admin_key: the built-in one reads /metrics (metrics.require_key).
const metrics = async () => (await fetch(gw.base + '/metrics', { headers: { authorization: 'Bearer sk-kvgw-admin' } })).text();
const up = (m, name) => {
  const x = m.match(new RegExp(`^kvgw_worker_up\\{worker="${name.replace(/[.]/g, '\\.')}"\\} (\\d)$`, 'm'));
  return x ? Number(x[1]) : null;
};

async function ask(i) {
  return fetch(gw.base + '/v1/messages', {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': KEY, 'anthropic-version': '2023-06-01' },
    body: JSON.stringify({ model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: `hello ${i}` }] }),
  });
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kvgw-names-'));
  worker = await startWorker('localhost:0'); // a name at bind: localhost is 127.0.0.1
  port = worker.port;
  const cfg = join(dir, 'kvgw.yaml');
  writeFileSync(cfg, config([`localhost:${port}`, BAD]));
  gw = await startGateway(cfg, { env: { KVGW_TEST_LINK_SECRET: SECRET } });
  await waitFor('/readyz', async () => (await fetch(gw.base + '/readyz')).status === 200);
});

after(async () => {
  await stopGateway(gw);
  for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

test('requests go to the worker found by name; the unresolvable one is down', async () => {
  for (let i = 0; i < 4; i++) {
    const r = await ask(i);
    const body = await r.text();
    assert.equal(r.status, 200, body);
    assert.equal(r.headers.get('kvgw-worker'), `localhost:${port}`);
    assert.equal(JSON.parse(body).type, 'message');
  }
  const m = await metrics();
  assert.equal(up(m, `localhost:${port}`), 1);
  assert.equal(up(m, BAD), 0);
  assert.equal(gw.proc.exitCode, null);
  assert.equal((await fetch(gw.base + '/healthz')).status, 200);
});

test('the log names the configured name and the address; the bad name is logged once, rate-limited', async () => {
  // Retries run at 250 ms, 500 ms, 1 s, 2 s, ...: wait for several of them.
  await sleep(4000);
  const log = gw.stderr();
  assert.match(log, new RegExp(`worker localhost:${port} up at 127\\.0\\.0\\.1:${port}`));
  const lines = log.split('\n').filter((l) => l.includes(`worker ${BAD} unreachable`));
  assert.equal(lines.length, 1, `expected one line, got:\n${lines.join('\n')}`);
  assert.match(lines[0], /cannot resolve worker host 'no-such-host\.invalid': \S/);
  assert.equal(gw.proc.exitCode, null);
  assert.equal(up(await metrics(), BAD), 0);
});

test('a worker restarted under the same name is found again', async () => {
  worker.p.kill('SIGKILL');
  await exited(worker.p);
  await waitFor('the worker to be down', async () => up(await metrics(), `localhost:${port}`) === 0);
  // No worker up: the existing overloaded answer, never a hang.
  const r = await ask(100);
  assert.ok(r.status >= 500, `status ${r.status}`);
  await r.text();
  worker = await startWorker(`localhost:${port}`);
  await waitFor('the worker to be up again', async () => up(await metrics(), `localhost:${port}`) === 1);
  const r2 = await ask(101);
  const body = await r2.text();
  assert.equal(r2.status, 200, body);
  assert.equal(r2.headers.get('kvgw-worker'), `localhost:${port}`);
  assert.equal(JSON.parse(body).type, 'message');
});

test('check-config accepts host names and refuses broken addresses with file:line', () => {
  const env = { ...process.env, KVGW_TEST_LINK_SECRET: SECRET };
  const check = (remote) => {
    const f = join(dir, 'check.yaml');
    writeFileSync(f, config(remote));
    const r = spawnSync(BIN, ['check-config', f], { env, encoding: 'utf8' });
    return { code: r.status, out: r.stdout + r.stderr, f };
  };
  let r = check(['worker-1:7001', 'kvgw-worker.prod.svc.cluster.local:7001', '[::1]:7001', '10.0.0.5:7001']);
  assert.equal(r.code, 0, r.out);
  assert.match(r.out, /worker-1:7001, kvgw-worker\.prod\.svc\.cluster\.local:7001/);
  // Line 8 is the second remote entry.
  for (const [bad, why] of [
    ['bad_host:7001', "character '_' is not allowed"],
    ['worker:0', "bad port '0'"],
    ['worker:99999', "bad port '99999'"],
    ['-worker:7001', "starts or ends with '-'"],
    ['::1:7001', 'an IPv6 address goes in brackets'],
    ['256.1.1.1:7001', 'neither an IPv4 address nor a host name'],
    [`${'a'.repeat(64)}.example:7001`, 'a label of 64 characters'],
  ]) {
    r = check(['worker-1:7001', bad]);
    assert.equal(r.code, 1, `${bad}: ${r.out}`);
    assert.ok(r.out.includes(`${r.f}:8: models[0].remote`), `${bad}: ${r.out}`);
    assert.ok(r.out.includes(why), `${bad}: ${r.out}`);
  }
});
