// usage_cluster.test.mjs — the merged usage view of several gateways (issue 22): two real `kvgw
// serve` processes with their own ledgers ship to one real redis-server (started here on a free
// loopback port in a temporary directory); GET /admin/v1/usage?scope=cluster on either gives
// every event of both exactly once (its own from its ledger, the other's from Redis), equal to
// `kvgw billing export` over both ledgers and to `--redis`; scope=local gives its own ledger;
// with Redis gone, scope=cluster is a clear 502 and scope=local still works.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import net from 'node:net';
import { BIN, KEY, MODEL, gatewayConfig, startGateway, stopGateway, exited, sleep, writeConfig } from './harness.mjs';

const REDIS = '/usr/bin/redis-server';
const ADMIN = { 'x-api-key': 'sk-test-admin' };
const haveRedis = spawnSync(REDIS, ['--version']).status === 0;

function freePort() {
  return new Promise((res, rej) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => res(p)); });
    s.on('error', rej);
  });
}

async function startRedis(dir, port) {
  const proc = spawn(REDIS, ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--save', '',
    '--appendonly', 'no', '--protected-mode', 'no'], { stdio: 'ignore' });
  for (;;) { // until it answers (the test's timeout bounds this)
    const ok = await new Promise((res) => {
      const c = net.connect(port, '127.0.0.1');
      c.on('connect', () => { c.write('PING\r\n'); });
      c.on('data', (d) => { c.destroy(); res(String(d).startsWith('+PONG')); });
      c.on('error', () => res(false));
    });
    if (ok) return proc;
    if (proc.exitCode !== null) throw new Error('redis-server exited');
    await sleep(50);
  }
}

const dir = mkdtempSync(join(tmpdir(), 'kvgw-usage-cluster-'));
let redis, gwA, gwB;
after(async () => {
  await stopGateway(gwA);
  await stopGateway(gwB);
  if (redis && redis.exitCode === null) { redis.kill('SIGKILL'); await exited(redis); }
  rmSync(dir, { recursive: true, force: true });
});

function config(name, redisPort) {
  const d = join(dir, name);
  spawnSync('mkdir', ['-p', d]);
  const text = gatewayConfig(d, { extra: `redis:\n  address: 127.0.0.1:${redisPort}\n` })
    .replace('billing:\n', `billing:\n  instance_id: ${name}\n`);
  return { path: writeConfig(d, text), ledger: join(d, 'ledger') };
}

async function ask(base, text) {
  const r = await fetch(`${base}/v1/messages`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': KEY, 'anthropic-version': '2023-06-01' },
    body: JSON.stringify({ model: MODEL, max_tokens: 3, messages: [{ role: 'user', content: text }] }),
  });
  assert.equal(r.status, 200, await r.clone().text());
  return r.json();
}

async function usage(base, query) {
  const r = await fetch(`${base}/admin/v1/usage?${query}`, { headers: ADMIN });
  return { status: r.status, scope: r.headers.get('kvgw-usage-scope'), text: await r.text() };
}

const rows = (text) => text.split('\n').filter(Boolean).map((l) => JSON.parse(l));

test('admin usage: scope=cluster merges every gateway exactly once, scope=local is the own ledger', { skip: !haveRedis && 'redis-server not installed' }, async () => {
  const rport = await freePort();
  redis = await startRedis(dir, rport);
  const a = config('gw-a', rport), b = config('gw-b', rport);
  gwA = await startGateway(a.path);
  gwB = await startGateway(b.path);
  for (let i = 0; i < 3; i++) await ask(gwA.base, `gateway a question ${i}`);
  for (let i = 0; i < 2; i++) await ask(gwB.base, `gateway b question ${i}`);

  // B's events reach Redis through its shipper; until then A's cluster view has fewer rows.
  let cluster;
  for (;;) {
    cluster = await usage(gwA.base, 'scope=cluster&format=jsonl');
    assert.equal(cluster.status, 200, cluster.text);
    if (rows(cluster.text).length >= 5) break;
    await sleep(50);
  }
  assert.equal(cluster.scope, 'cluster');
  const got = rows(cluster.text);
  assert.equal(got.length, 5, 'every event of both gateways, once');
  assert.equal(new Set(got.map((r) => r.event_id)).size, 5);
  assert.deepEqual(got.map((r) => r.instance).sort(), ['gw-a', 'gw-a', 'gw-a', 'gw-b', 'gw-b']);
  for (const r of got) assert.equal(r.registry, 'none', 'no registry configured: decisions are none');
  for (let i = 1; i < got.length; i++) assert.ok(got[i - 1].end <= got[i].end, 'ordered by end time');

  // The same bytes as the CLI's merge of both ledgers and as the CLI over Redis alone (B's view).
  const cli = spawnSync(BIN, ['billing', 'export', '--ledger', a.ledger, '--ledger', b.ledger, '--format', 'jsonl'], { encoding: 'utf8' });
  assert.equal(cli.status, 0, cli.stderr);
  assert.equal(cluster.text, cli.stdout);
  for (;;) { // A's events reach Redis too
    const viaRedis = spawnSync(BIN, ['billing', 'export', '--redis', `127.0.0.1:${rport}`, '--format', 'jsonl'], { encoding: 'utf8' });
    assert.equal(viaRedis.status, 0, viaRedis.stderr);
    if (rows(viaRedis.stdout).length === 5) { assert.equal(viaRedis.stdout, cli.stdout); break; }
    await sleep(50);
  }
  const fromB = await usage(gwB.base, 'scope=cluster&format=jsonl');
  assert.equal(fromB.text, cli.stdout, 'either gateway gives the same merged view');

  // scope=local: this gateway's ledger only; it is the default without a registry.
  const local = await usage(gwA.base, 'scope=local&format=jsonl');
  assert.equal(local.status, 200);
  assert.equal(local.scope, 'local');
  assert.deepEqual(rows(local.text).map((r) => r.instance), ['gw-a', 'gw-a', 'gw-a']);
  const dflt = await usage(gwA.base, 'format=jsonl');
  assert.equal(dflt.text, local.text);
  const csv = await usage(gwA.base, 'scope=cluster');
  assert.ok(csv.text.split('\n')[0].endsWith(',registry,instance'));

  // verify over both ledgers: nothing missing; over one: the other instance is MISSING.
  const v1 = spawnSync(BIN, ['billing', 'verify', '--ledger', a.ledger, '--redis', `127.0.0.1:${rport}`], { encoding: 'utf8' });
  assert.equal(v1.status, 1);
  assert.match(v1.stdout, /MISSING instance gw-b: Redis holds 2 shipped events/);
  const v2 = spawnSync(BIN, ['billing', 'verify', '--ledger', a.ledger, '--ledger', b.ledger, '--redis', `127.0.0.1:${rport}`], { encoding: 'utf8' });
  assert.equal(v2.status, 0, v2.stdout + v2.stderr);
  assert.match(v2.stdout, /registry decisions: 5 none, 0 shared, 0 local/);

  // Bad input: a clear 400, nothing started.
  assert.equal((await usage(gwA.base, 'scope=everything')).status, 400);
  assert.equal((await fetch(`${gwA.base}/admin/v1/usage?scope=cluster`, { headers: { 'x-api-key': KEY } })).status, 403);

  // Redis gone: the cluster view says so (502); the local view is unaffected.
  redis.kill('SIGKILL');
  await exited(redis);
  const down = await usage(gwA.base, 'scope=cluster&format=jsonl');
  assert.equal(down.status, 502, down.text);
  assert.match(down.text, /redis|Redis/);
  const stillLocal = await usage(gwA.base, 'scope=local&format=jsonl');
  assert.equal(stillLocal.status, 200);
  assert.equal(rows(stillLocal.text).length, 3);
});
