// cluster_harness.mjs — the scale-out tests' cluster (issue 22): a real redis-server (temporary
// directory, free port; optionally a replica and three redis-sentinel), real `kvgw worker`
// processes and several real `kvgw serve` gateways sharing them through the registry, each with
// its own generated config (its own billing.instance_id, ledger and access log; the same
// namespace secret, link secret and Redis).
//
// Nothing here replaces a component of kvgw or Redis: every process is the real binary; this file
// starts them, talks to them (HTTP, redis-cli) and kills every one of them at the end, also when a
// test fails or the test process exits early (a process 'exit' hook SIGKILLs whatever is left).
//
// Conditions are waited for with bounded polling (waitFor), never with fixed sleeps standing in
// for "long enough".
import { spawn, spawnSync, execFile } from 'node:child_process';
import { createWriteStream, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import net from 'node:net';

export const BIN = process.env.KVGW_BIN ?? 'build/bin/kvgw';
export const MODEL = 'kvgw-demo';
export const ADMIN = 'sk-test-admin';
export const KEYS = { a: 'sk-test-a', b: 'sk-test-b' };
export const NS_SECRET = 'scaleout-test-namespace-secret-0123456789';
export const LINK_SECRET = 'scaleout-test-link-secret-0123456789';
export const MASTER = 'kvgw-test';
export const PREFIX = 'kvgwtest';

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Every process started here, SIGKILLed on exit whatever happened.
const live = new Set();
process.on('exit', () => {
  for (const p of live) try { p.kill('SIGKILL'); } catch { /* gone */ }
});

// Polls fn() (sync or async) until it returns a truthy value, every stepMs, for at most
// timeoutMs; returns that value or throws naming what was waited for (with the last value or
// error). The bound is a hang guard, never the thing tested.
export async function waitFor(what, fn, { timeoutMs = 30000, stepMs = 50 } = {}) {
  const t0 = Date.now();
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() - t0 > timeoutMs) throw new Error(`timed out waiting for ${what} (last: ${last instanceof Error ? last.message : JSON.stringify(last)})`);
    await sleep(stepMs);
  }
}

// A TCP port that was free a moment ago (the caller retries if someone took it since).
export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
  });
}

// Spawns cmd and resolves {proc, match, out(), err()} once stdout (or stderr) matches pattern;
// rejects if the process exits first or timeoutMs passes (then it is killed).
// With log, everything the process writes is appended to that file as well (the cluster's
// directory keeps each process's log: KVGW_KEEP_TEST_DIR=1 keeps the directory).
export function spawnUntil(cmd, args, pattern, { env = {}, timeoutMs = 60000, cwd, log = null } = {}) {
  const proc = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env }, cwd });
  if (log) {
    const f = createWriteStream(log, { flags: 'a' });
    proc.stdout.on('data', (d) => f.write(d));
    proc.stderr.on('data', (d) => f.write(d));
    proc.once('close', () => f.end());
  }
  live.add(proc);
  proc.once('exit', () => live.delete(proc));
  let out = '', err = '';
  return new Promise((resolve, reject) => {
    let done = false;
    const check = () => {
      if (done) return;
      const m = (out + '\n' + err).match(pattern);
      if (m) {
        done = true;
        clearTimeout(t);
        proc.off('exit', onExit);
        resolve({ proc, match: m, out: () => out, err: () => err });
      }
    };
    proc.stdout.on('data', (d) => { out += d; if (out.length > 1 << 20) out = out.slice(-(1 << 19)); check(); });
    proc.stderr.on('data', (d) => { err += d; if (err.length > 1 << 20) err = err.slice(-(1 << 19)); check(); });
    const onExit = (code, sig) => {
      if (done) return;
      done = true;
      clearTimeout(t);
      reject(Object.assign(new Error(`${cmd} ${args.join(' ')} exited ${code ?? sig} before it was ready:\n${out}\n${err}`), { code, out, err }));
    };
    proc.on('exit', onExit);
    proc.on('error', (e) => {
      if (done) return;
      done = true;
      clearTimeout(t);
      reject(new Error(`cannot run ${cmd}: ${e.message}${e.code === 'ENOENT' ? ' (not installed? scripts/setup.sh installs redis-server and redis-sentinel)' : ''}`));
    });
    const t = setTimeout(() => {
      if (done) return;
      done = true;
      proc.kill('SIGKILL');
      reject(new Error(`${cmd} ${args.join(' ')} not ready after ${timeoutMs} ms:\n${out}\n${err}`));
    }, timeoutMs);
  });
}

export function exited(proc) {
  if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve({ code: proc.exitCode, signal: proc.signalCode });
  return new Promise((res) => proc.once('exit', (code, signal) => res({ code, signal })));
}

export async function kill(proc, signal = 'SIGKILL') {
  if (!proc || proc.exitCode !== null || proc.signalCode !== null) return { code: proc?.exitCode, signal: proc?.signalCode };
  const done = exited(proc);
  proc.kill(signal);
  return done;
}

// ---- Redis -----------------------------------------------------------------------------------

// redis-cli -p PORT ARGS... (--raw); resolves to its stdout without the trailing newline.
// Rejects when redis-cli fails or answers an error (ERR ..., READONLY ...).
export function redisCli(port, ...args) {
  return new Promise((resolve, reject) => {
    execFile('redis-cli', ['-h', '127.0.0.1', '-p', String(port), '--raw', ...args.map(String)], { timeout: 10000 }, (e, stdout, stderr) => {
      if (e) return reject(new Error(`redis-cli -p ${port} ${args.join(' ')}: ${e.message} ${stderr}`));
      const s = stdout.replace(/\n$/, '');
      if (/^(ERR|WRONGTYPE|READONLY|LOADING|MASTERDOWN|NOSCRIPT|Could not connect)/.test(s)) return reject(new Error(`redis-cli -p ${port} ${args.join(' ')}: ${s}`));
      resolve(s);
    });
  });
}

// A redis-server: `start()` on a free port in dir (AOF on, noeviction: the authoritative role of
// the design), `stop()` (SHUTDOWN: a real stop, the data kept), `restart()` on the same port and
// dir, `pause()`/`resume()` (SIGSTOP/SIGCONT), `kill()`.
export class RedisServer {
  constructor(dir, { replicaOf = null } = {}) {
    this.dir = dir;
    this.replicaOf = replicaOf;
    this.port = 0;
    this.proc = null;
    mkdirSync(dir, { recursive: true });
  }

  args() {
    const a = ['--port', String(this.port), '--bind', '127.0.0.1', '--dir', this.dir, '--daemonize', 'no',
      '--save', '', '--appendonly', 'yes', '--appendfsync', 'everysec', '--maxmemory-policy', 'noeviction',
      '--repl-diskless-sync-delay', '0', '--protected-mode', 'no', '--logfile', '', '--loglevel', 'notice'];
    if (this.replicaOf) a.push('--replicaof', '127.0.0.1', String(this.replicaOf));
    return a;
  }

  async start() {
    for (let attempt = 0; ; attempt++) {
      if (!this.port || attempt > 0) this.port = await freePort();
      try {
        await this.spawn();
        return this;
      } catch (e) {
        if (attempt >= 4 || !/Address already in use/.test(String(e.message))) throw e;
      }
    }
  }

  async spawn() {
    const r = await spawnUntil('redis-server', this.args(), /Ready to accept connections/, { timeoutMs: 30000, log: join(this.dir, 'redis.log') });
    this.proc = r.proc;
    this.proc.stdout.resume();
  }

  cli(...args) { return redisCli(this.port, ...args); }

  async stop() {
    const done = exited(this.proc);
    await this.cli('SHUTDOWN').catch(() => {}); // the connection closes under redis-cli
    return done;
  }

  async restart() {
    if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) await this.stop();
    await this.spawn();
  }

  pause() { this.proc.kill('SIGSTOP'); }
  resume() { this.proc.kill('SIGCONT'); }
  async kill() { if (this.proc) { this.proc.kill('SIGCONT'); await kill(this.proc); } }
}

// Three redis-sentinel watching `master` under the name MASTER. Automatic failover is slow on
// purpose (down-after 60 s): the tests stop and pause the primary without the sentinels moving
// it; SENTINEL FAILOVER moves it when a test asks.
export class Sentinels {
  constructor(dir, masterPort, n = 3) {
    this.dir = dir;
    this.masterPort = masterPort;
    this.n = n;
    this.ports = [];
    this.procs = [];
  }

  async start() {
    for (let i = 0; i < this.n; i++) {
      const d = join(this.dir, `sentinel-${i}`);
      mkdirSync(d, { recursive: true });
      for (let attempt = 0; ; attempt++) {
        const port = await freePort();
        const conf = join(d, 'sentinel.conf');
        writeFileSync(conf, `port ${port}
bind 127.0.0.1
daemonize no
protected-mode no
dir ${d}
logfile ""
sentinel monitor ${MASTER} 127.0.0.1 ${this.masterPort} 2
sentinel down-after-milliseconds ${MASTER} 60000
sentinel failover-timeout ${MASTER} 20000
sentinel parallel-syncs ${MASTER} 1
`);
        try {
          const r = await spawnUntil('redis-sentinel', [conf], /\+monitor master/, { timeoutMs: 30000, log: join(d, 'sentinel.log') });
          r.proc.stdout.resume();
          this.procs.push(r.proc);
          this.ports.push(port);
          break;
        } catch (e) {
          if (attempt >= 4 || !/Address already in use/.test(String(e.message))) throw e;
        }
      }
    }
    return this;
  }

  addresses() { return this.ports.map((p) => `127.0.0.1:${p}`); }

  async currentMaster() {
    const a = (await redisCli(this.ports[0], 'SENTINEL', 'get-master-addr-by-name', MASTER)).split('\n');
    return Number(a[1]);
  }

  // Resolves once every sentinel knows the replica (and the other sentinels): SENTINEL FAILOVER
  // needs a replica to promote.
  async ready(replicaPort) {
    for (const p of this.ports) {
      await waitFor(`sentinel ${p} to see the replica ${replicaPort}`, async () => {
        const r = await redisCli(p, 'SENTINEL', 'replicas', MASTER);
        return r.includes(String(replicaPort)) && !/s_down|disconnected/.test(r);
      }, { timeoutMs: 30000, stepMs: 200 });
    }
  }

  async failover() { return redisCli(this.ports[0], 'SENTINEL', 'FAILOVER', MASTER); }

  async stop() { await Promise.all(this.procs.map((p) => kill(p))); }
}

// ---- kvgw ------------------------------------------------------------------------------------

export async function startWorker(name, { threads = 1, log = null } = {}) {
  const r = await spawnUntil(BIN, ['worker', '--model', 'models/kvgw-demo.gguf', '--listen', '127.0.0.1:0',
    '--threads', String(threads), '--name', name], /listening on (127\.0\.0\.1:\d+)/, { env: { KVGW_LINK_SECRET: LINK_SECRET }, log });
  r.proc.stdout.resume();
  return { name, proc: r.proc, addr: r.match[1], err: r.err };
}

// The config of one gateway of the cluster. redis: {address} or {sentinels, master_name}.
// The registry's times are the tests': a claim's deadline of 2 s (decisions stay shared on a
// loaded 2-core machine; the design's 50 ms is a latency target, not a correctness one), claims
// and registrations that lapse in 5 s (the SIGKILL and fencing tests wait for them).
export function gatewayConfig({ dir, instance, workers, redis, nsSecret = NS_SECRET, ttl5mMs = null, registry = {}, extra = '' }) {
  const reg = { enabled: true, timeout: '2s', claim_ttl: '5s', lease: '5s', ...registry };
  const redisLines = redis.sentinels
    ? `  sentinels: [${redis.sentinels.join(', ')}]\n  master_name: ${redis.master_name ?? MASTER}\n`
    : `  address: ${redis.address}\n`;
  return `listen: 127.0.0.1:0
models:
  - name: ${MODEL}
    path: models/kvgw-demo.gguf
    min_cache_tokens: 16
    remote: [${workers.map((w) => w.addr).join(', ')}]
api_keys:
  - {key: ${KEYS.a}, id: key-a, tenant: tenant-a}
  - {key: ${KEYS.b}, id: key-b, tenant: tenant-b}
admin_key: ${ADMIN}
workers:
  link_secret: env:KVGW_TEST_LINK_SECRET
  heartbeat: 200ms
cache:
  namespace_secret: ${nsSecret}
${ttl5mMs ? `  ttl_5m: ${ttl5mMs}ms\n` : ''}billing:
  instance_id: ${instance}
  ledger_dir: ${dir}/ledger
  pricing: conf/pricing.yaml
  fsync: batch
log:
  access_log: ${dir}/access.log
redis:
${redisLines}  prefix: ${PREFIX}
  timeout: 2s
registry:
${Object.entries(reg).map(([k, v]) => `  ${k}: ${v}`).join('\n')}
${extra}`;
}

// Starts `kvgw serve` on cfgPath; resolves to a gateway handle once it listens.
export async function startGateway(name, cfgPath, { env = {}, log = null } = {}) {
  const r = await spawnUntil(BIN, ['serve', '--config', cfgPath], /listening on (http:\/\/127\.0\.0\.1:\d+)/,
    { env: { KVGW_TEST_LINK_SECRET: LINK_SECRET, ...env }, log });
  r.proc.stdout.resume();
  return { name, proc: r.proc, base: r.match[1], err: r.err, cfgPath };
}

// `kvgw serve` expected to refuse to start: resolves {code, out, err} once it exits (rejects if
// it starts listening instead, after killing it).
export async function refusedGateway(cfgPath, { env = {} } = {}) {
  try {
    const g = await spawnUntil(BIN, ['serve', '--config', cfgPath], /listening on (http:\/\/127\.0\.0\.1:\d+)/,
      { env: { KVGW_TEST_LINK_SECRET: LINK_SECRET, ...env } });
    await kill(g.proc);
  } catch (e) {
    if (e.code !== undefined) return { code: e.code, out: e.out, err: e.err };
    throw e;
  }
  throw new Error(`${cfgPath}: the gateway started; it should have been refused`);
}

// The cluster: Redis (+ replica and sentinels with sentinel: true), `workers` kvgw workers and
// `gateways` gateways named A, B, C... (instance ids gw-a, gw-b, ...).
export class Cluster {
  constructor(tag, { gateways = 3, workers = 2, sentinel = false, ttl5mMs = null, registry = {} } = {}) {
    this.tag = tag;
    this.nGateways = gateways;
    this.nWorkers = workers;
    this.sentinel = sentinel;
    this.ttl5mMs = ttl5mMs;
    this.registry = registry;
    this.gws = [];
    this.workers = [];
  }

  async start() {
    this.dir = mkdtempSync(join(tmpdir(), `kvgw-scaleout-${this.tag}-`));
    if (process.env.KVGW_KEEP_TEST_DIR) console.log(`cluster ${this.tag}: ${this.dir} (kept)`);
    this.redis = await new RedisServer(join(this.dir, 'redis')).start();
    const workers = Promise.all(Array.from({ length: this.nWorkers }, (_, i) => startWorker(`${this.tag}-w${i + 1}`, { log: join(this.dir, `worker-${i + 1}.log`) })));
    if (this.sentinel) {
      this.replica = await new RedisServer(join(this.dir, 'replica'), { replicaOf: this.redis.port }).start();
      await waitFor('the replica to sync', async () => /master_link_status:up/.test(await this.replica.cli('INFO', 'replication')));
      this.sentinels = await new Sentinels(join(this.dir, 'sentinels'), this.redis.port).start();
      await this.sentinels.ready(this.replica.port);
    }
    this.workers = await workers;
    const names = 'abcdefgh';
    this.gws = await Promise.all(Array.from({ length: this.nGateways }, (_, i) => this.startGateway(names[i])));
    await Promise.all(this.gws.map((g) => this.ready(g)));
    return this;
  }

  redisSpec() {
    return this.sentinel ? { sentinels: this.sentinels.addresses(), master_name: MASTER } : { address: `127.0.0.1:${this.redis.port}` };
  }

  // Writes gw-NAME's config (opts override the cluster's) and starts it.
  async startGateway(name, opts = {}) {
    const d = join(this.dir, `gw-${name}`);
    mkdirSync(d, { recursive: true });
    const cfg = join(d, opts.file ?? 'kvgw.yaml');
    writeFileSync(cfg, gatewayConfig({
      dir: d, instance: `gw-${name}`, workers: this.workers, redis: this.redisSpec(),
      ttl5mMs: this.ttl5mMs, registry: this.registry, ...opts,
    }));
    if (opts.expectRefusal) return refusedGateway(cfg);
    const g = await startGateway(name.toUpperCase(), cfg, { log: join(d, 'kvgw.log') });
    g.instance = `gw-${name}`;
    g.ledger = join(d, 'ledger');
    g.dir = d;
    return g;
  }

  // Waits until gateway g serves (/readyz: its worker links are up) and its registry is up.
  async ready(g) {
    await waitFor(`${g.name} /readyz`, async () => (await fetch(g.base + '/readyz')).status === 200, { stepMs: 100 });
    await waitFor(`${g.name} kvgw_registry_up 1`, async () => (await metrics(g)).value('kvgw_registry_up') === 1, { stepMs: 100 });
  }

  async stop() {
    await Promise.all(this.gws.map((g) => kill(g.proc)));
    await Promise.all(this.workers.map((w) => kill(w.proc)));
    if (this.sentinels) await this.sentinels.stop();
    if (this.replica) await this.replica.kill();
    if (this.redis) await this.redis.kill();
    if (this.dir && !process.env.KVGW_KEEP_TEST_DIR) rmSync(this.dir, { recursive: true, force: true });
  }
}

// ---- HTTP, metrics, billing ------------------------------------------------------------------

// /metrics of gateway g parsed: value(series) with or without labels; 0 when absent,
// sum(name) over every label set.
export async function metrics(g) {
  const text = await (await fetch(g.base + '/metrics', { headers: { authorization: `Bearer ${ADMIN}` } })).text();
  const map = new Map();
  for (const l of text.split('\n')) {
    if (!l || l.startsWith('#')) continue;
    const i = l.lastIndexOf(' ');
    map.set(l.slice(0, i), Number(l.slice(i + 1)));
  }
  return {
    text,
    has: (series) => map.has(series),
    value: (series) => map.get(series) ?? 0,
    sum: (name) => { let s = 0; for (const [k, v] of map) if (k === name || k.startsWith(name + '{')) s += v; return s; },
  };
}

// One Anthropic-shaped request to gateway g with fetch; resolves to {status, rid, headers, json,
// usage, stream, complete} and never rejects (a gateway killed mid-request gives complete:
// false). Streamed responses count as complete only with their message_stop.
export async function message(g, body, { key = KEYS.a, signal } = {}) {
  let rid = null, status = 0, headers = null;
  try {
    const r = await fetch(g.base + '/v1/messages', {
      method: 'POST', signal,
      headers: { 'content-type': 'application/json', 'x-api-key': key, 'anthropic-version': '2023-06-01' },
      body: JSON.stringify(body),
    });
    rid = r.headers.get('request-id');
    status = r.status;
    headers = r.headers;
    const text = await r.text();
    if (status !== 200) {
      let json = null;
      try { json = JSON.parse(text); } catch { /* not JSON */ }
      return { status, rid, headers, json, complete: false, stream: !!body.stream, gw: g.name };
    }
    if (body.stream) {
      const complete = /\nevent: message_stop\ndata: \{"type":"message_stop"\}\n\n$/.test('\n' + text);
      if (!complete) return { status, rid, headers, complete, stream: true, gw: g.name };
      const start = JSON.parse(text.match(/event: message_start\ndata: (.*)\n/)[1]).message.usage;
      const delta = JSON.parse(text.match(/event: message_delta\ndata: (.*)\n/)[1]).usage;
      return { status, rid, headers, complete, stream: true, usage: { ...start, output_tokens: delta.output_tokens }, gw: g.name };
    }
    const json = JSON.parse(text);
    return { status, rid, headers, json, usage: json.usage, complete: json.type === 'message', stream: false, gw: g.name };
  } catch (e) {
    return { status, rid, headers, complete: false, stream: !!body.stream, error: String(e), gw: g.name };
  }
}

// A system prompt of about 20 * lines tokens (well over min_cache_tokens), unique to tag.
export function system(tag, lines = 6, ttl = null) {
  let s = `Scale-out assistant ${tag}. `;
  for (let i = 0; i < lines; i++) s += `Rule ${i} of ${tag}: answer in one word. `;
  return [{ type: 'text', text: s, cache_control: ttl ? { type: 'ephemeral', ttl } : { type: 'ephemeral' } }];
}

// `kvgw billing ARGS...` (synchronous: called between loads); resolves {code, stdout, stderr}.
export function kvgw(args, { env = {} } = {}) {
  const r = spawnSync(BIN, args, { encoding: 'utf8', maxBuffer: 256 << 20, env: { ...process.env, ...env }, timeout: 60000 });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

// The merged export of several ledgers, parsed: `kvgw billing export --ledger A --ledger B ...
// --format jsonl`. Throws with kvgw's stderr when it fails.
export function mergedExport(ledgers, extra = []) {
  const args = ['billing', 'export'];
  for (const l of ledgers) args.push('--ledger', l);
  const r = kvgw([...args, '--format', 'jsonl', ...extra]);
  if (r.code !== 0) throw new Error(`kvgw ${args.join(' ')} exited ${r.code}: ${r.stderr}`);
  return r.stdout.split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

// Asserts-friendly comparison: the export row's usage against what the client received.
export function usageMismatch(row, u) {
  const got = row.usage;
  const want = {
    uncached_input_tokens: u.input_tokens,
    cache_write: u.cache_creation_input_tokens,
    cache_read_tokens: u.cache_read_input_tokens,
    output_tokens: u.output_tokens,
  };
  const have = {
    uncached_input_tokens: got.uncached_input_tokens,
    cache_write: got.cache_write_5m_tokens + got.cache_write_1h_tokens,
    cache_read_tokens: got.cache_read_tokens,
    output_tokens: got.output_tokens,
  };
  return JSON.stringify(have) === JSON.stringify(want) ? null : `billed ${JSON.stringify(have)}, the client received ${JSON.stringify(want)}`;
}
