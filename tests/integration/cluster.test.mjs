// cluster.test.mjs — cluster mode: `kvgw serve` routing to remote `kvgw worker` processes over
// the authenticated worker link. Cache-aware routing sends a repeated prompt to the worker that
// holds its KV; a worker with another secret is refused; a worker killed mid-stream ends the
// stream with an error event (never a hang) and later requests go to the survivor.
//
// Run by CTest (tests/integration/CMakeLists.txt): node --test tests/integration/cluster.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const BIN = process.env.KVGW_BIN ?? 'build/bin/kvgw';
const MODEL = 'kvgw-demo';
const SECRET = 'cluster-test-link-secret-0123456789';
const procs = [];
let dir, base;

function startProc(args, env, pattern) {
  const p = spawn(BIN, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  procs.push(p);
  let err = '';
  p.stderr.on('data', (d) => { err += d; });
  return new Promise((resolve, reject) => {
    let out = '';
    const t = setTimeout(() => reject(new Error(`${args[0]} did not start:\n${err}`)), 60000);
    p.stdout.on('data', (d) => {
      out += d;
      const m = out.match(pattern);
      if (m) { clearTimeout(t); resolve({ p, addr: m[1] }); }
    });
    p.on('exit', (code) => { clearTimeout(t); reject(new Error(`${args[0]} exited ${code}:\n${err}`)); });
  });
}

const startWorker = (secret, name) => startProc(
  ['worker', '--model', 'models/kvgw-demo.gguf', '--listen', '127.0.0.1:0', '--threads', '1', '--name', name],
  { KVGW_LINK_SECRET: secret }, /listening on (127\.0\.0\.1:\d+)/);

let w1, w2, w3;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kvgw-cluster-'));
  [w1, w2, w3] = await Promise.all([startWorker(SECRET, 'w1'), startWorker(SECRET, 'w2'),
    startWorker('another-secret-entirely-0123456789', 'w3')]);
  const cfg = join(dir, 'kvgw.yaml');
  writeFileSync(cfg, `listen: 127.0.0.1:0
models:
  - name: ${MODEL}
    path: models/kvgw-demo.gguf
    min_cache_tokens: 16
    remote: [${w1.addr}, ${w2.addr}, ${w3.addr}]
api_keys:
  - {key: sk-test-a, id: key-a, tenant: tenant-a}
workers:
  link_secret: env:KVGW_TEST_LINK_SECRET
  heartbeat: 200ms
cache:
  namespace_secret: cluster-test-namespace-secret
billing:
  ledger_dir: ${dir}/ledger
log:
  access_log: "off"
`);
  const gw = await startProc(['serve', '--config', cfg], { KVGW_TEST_LINK_SECRET: SECRET },
    /listening on (http:\/\/127\.0\.0\.1:\d+)/);
  base = gw.addr;
  for (let i = 0; i < 100; i++) { // the links come up in the background
    if ((await fetch(base + '/readyz')).status === 200) break;
    await new Promise((r) => setTimeout(r, 100));
  }
});

after(() => {
  for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

function system(tag) {
  let s = `Cluster assistant ${tag}. `;
  for (let i = 0; i < 30; i++) s += `Policy ${i} applies to region ${i % 7}. `;
  return [{ type: 'text', text: s, cache_control: { type: 'ephemeral' } }];
}

async function msg(body) {
  const r = await fetch(base + '/v1/messages', {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': 'sk-test-a', 'anthropic-version': '2023-06-01' },
    body: JSON.stringify(body),
  });
  return { r, json: body.stream ? null : await r.json() };
}

test('a worker with another link secret is refused; the others serve', async () => {
  // The config sets no admin_key: the built-in one reads /metrics.
  const m = await (await fetch(base + '/metrics', { headers: { authorization: 'Bearer sk-kvgw-admin' } })).text();
  assert.match(m, new RegExp(`kvgw_worker_up\\{worker="${w1.addr}"\\} 1`));
  assert.match(m, new RegExp(`kvgw_worker_up\\{worker="${w2.addr}"\\} 1`));
  assert.match(m, new RegExp(`kvgw_worker_up\\{worker="${w3.addr}"\\} 0`));
});

test('a repeated prompt goes to the worker holding its KV', async () => {
  for (let k = 0; k < 3; k++) {
    const body = { model: MODEL, max_tokens: 2, system: system(`route-${k}`), messages: [{ role: 'user', content: 'q' }] };
    const a = await msg(body);
    assert.equal(a.r.status, 200);
    const b = await msg(body);
    assert.equal(b.r.headers.get('kvgw-worker'), a.r.headers.get('kvgw-worker'));
    assert.ok(b.json.usage.cache_read_input_tokens > 0);
    assert.match(b.r.headers.get('kvgw-cache'), /worker_cached=[1-9]/);
  }
});

test('a worker killed mid-stream: error event, no hang, the survivor serves', async () => {
  const body = { model: MODEL, max_tokens: 4000, stream: true, temperature: 1,
    messages: [{ role: 'user', content: 'write a long story' }] };
  const { r } = await msg(body);
  assert.equal(r.status, 200);
  const name = r.headers.get('kvgw-worker');
  const victim = [w1, w2].find((w) => w.addr === name);
  assert.ok(victim, `routed to ${name}`);
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let text = '';
  let killed = false;
  const deadline = Date.now() + 30000;
  for (;;) {
    assert.ok(Date.now() < deadline, 'the stream ended');
    const { value, done } = await reader.read();
    if (done) break;
    text += dec.decode(value);
    if (!killed && text.includes('content_block_delta')) {
      victim.p.kill('SIGKILL');
      killed = true;
    }
  }
  assert.ok(killed);
  assert.match(text, /event: error\ndata: \{"type":"error","error":\{"type":"overloaded_error"/);
  assert.ok(!text.includes('message_stop'));
  const after = await msg({ model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: 'still there?' }] });
  assert.equal(after.r.status, 200);
  assert.notEqual(after.r.headers.get('kvgw-worker'), name);
});
