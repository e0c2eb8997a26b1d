// harness.mjs — shared helpers of the hardening tests (http_edge, crash_loop, bad_config): start
// the real `kvgw serve` binary on a temp config with `listen: 127.0.0.1:0`, talk raw HTTP over
// node:net, and read the usage ledger independently of the gateway (its byte format is
// documented in billing/ledger.h; reading it here checks that documentation, too).
//
// Nothing here replaces a component of kvgw: the gateway, its workers and its ledger are the
// real ones; this file only drives them and reads what they leave behind.
import { spawn, spawnSync } from 'node:child_process';
import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import net from 'node:net';

export const BIN = process.env.KVGW_BIN ?? 'build/bin/kvgw';
export const MODEL = 'kvgw-demo';
export const KEY = 'sk-test-a';

// A config for the demo model; `extra` is appended verbatim (top-level sections), `limits` is
// the body of the limits: section (YAML lines without indentation).
export function gatewayConfig(dir, { extra = '', limits = '', fsync = 'batch', workers = 1, pricing = 'conf/pricing.yaml' } = {}) {
  const lim = limits ? 'limits:\n' + limits.trim().split('\n').map((l) => '  ' + l).join('\n') + '\n' : '';
  return `listen: 127.0.0.1:0
models:
  - name: ${MODEL}
    path: models/kvgw-demo.gguf
    min_cache_tokens: 16
    workers: ${workers}
    threads: 1
api_keys:
  - {key: ${KEY}, id: key-a, tenant: tenant-a}
admin_key: sk-test-admin
cache:
  namespace_secret: hardening-test-namespace-secret
billing:
  ledger_dir: ${dir}/ledger
  pricing: ${pricing}
  fsync: ${fsync}
log:
  access_log: ${dir}/access.log
${lim}${extra}`;
}

// Starts `kvgw serve --config cfgPath`; resolves to {proc, base, host, port, stderr()} once the
// gateway prints "listening on http://HOST:PORT". Rejects if it exits first.
export function startGateway(cfgPath, { env = {}, timeoutMs = 60000 } = {}) {
  const proc = spawn(BIN, ['serve', '--config', cfgPath], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ...env },
  });
  let err = '';
  proc.stderr.on('data', (d) => { err += d; });
  return new Promise((resolve, reject) => {
    let out = '';
    const t = setTimeout(() => { proc.kill('SIGKILL'); reject(new Error('gateway did not start:\n' + err)); }, timeoutMs);
    const onExit = (code, sig) => { clearTimeout(t); reject(new Error(`gateway exited ${code ?? sig}:\n${err}`)); };
    proc.on('exit', onExit);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on http:\/\/([0-9.]+):(\d+)/);
      if (m) {
        clearTimeout(t);
        proc.off('exit', onExit);
        proc.stdout.resume();
        resolve({ proc, base: `http://${m[1]}:${m[2]}`, host: m[1], port: Number(m[2]), stderr: () => err });
      }
    });
  });
}

// Resolves with {code, signal} when proc has exited (at once if it already has).
export function exited(proc) {
  if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve({ code: proc.exitCode, signal: proc.signalCode });
  return new Promise((res) => proc.once('exit', (code, signal) => res({ code, signal })));
}

export async function stopGateway(gw, signal = 'SIGTERM') {
  if (!gw || gw.proc.exitCode !== null || gw.proc.signalCode !== null) return;
  const done = exited(gw.proc);
  gw.proc.kill(signal);
  return done;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---- raw HTTP over node:net ------------------------------------------------------------------

// A raw client connection: write bytes, read responses as they come (parsed incrementally,
// Content-Length and chunked response bodies), see when the server closes.
export class RawConn {
  constructor(port, host = '127.0.0.1') {
    this.buf = Buffer.alloc(0);
    this.closed = false;
    this.waiters = [];
    this.sock = net.connect(port, host);
    this.sock.setNoDelay(true);
    this.ready = new Promise((res, rej) => { this.sock.once('connect', res); this.sock.once('error', rej); });
    this.sock.on('data', (d) => { this.buf = Buffer.concat([this.buf, d]); this.kick(); });
    this.sock.on('error', () => {});
    this.sock.on('close', () => { this.closed = true; this.kick(); });
  }
  kick() { const w = this.waiters; this.waiters = []; for (const f of w) f(); }
  write(data) { this.sock.write(data); }
  end() { this.sock.end(); }
  destroy() { this.sock.destroy(); }
  // Waits until pred() is true, the socket closes or timeoutMs passes; returns pred()'s value.
  async until(pred, timeoutMs = 10000) {
    const t0 = Date.now();
    for (;;) {
      const v = pred();
      if (v || this.closed) return v;
      const left = timeoutMs - (Date.now() - t0);
      if (left <= 0) return v;
      await new Promise((res) => { const t = setTimeout(res, left); this.waiters.push(() => { clearTimeout(t); res(); }); });
    }
  }
  // Reads one full response (an interim 1xx is returned as its own response). Returns null if
  // the connection closed (or the time ran out) before a whole response arrived.
  async response(timeoutMs = 10000) {
    let r = null;
    await this.until(() => (r = parseResponse(this.buf)) !== null, timeoutMs);
    if (r === null) r = parseResponse(this.buf);
    if (r === null) return null;
    this.buf = this.buf.subarray(r.consumed);
    return r;
  }
  async waitClosed(timeoutMs = 10000) {
    await this.until(() => this.closed, timeoutMs);
    return this.closed;
  }
}

// Parses one HTTP response at the start of buf; null if incomplete.
export function parseResponse(buf) {
  const he = buf.indexOf('\r\n\r\n');
  if (he < 0) return null;
  const head = buf.subarray(0, he).toString('latin1').split('\r\n');
  const m = head[0].match(/^HTTP\/1\.([01]) (\d{3}) ?(.*)$/);
  if (!m) throw new Error('not an HTTP response: ' + JSON.stringify(head[0]));
  const headers = {};
  for (const l of head.slice(1)) {
    const i = l.indexOf(':');
    headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
  }
  const status = Number(m[2]);
  let pos = he + 4;
  let body = Buffer.alloc(0);
  if (status >= 100 && status < 200) return { status, headers, body, consumed: pos, text: '' };
  if (headers['transfer-encoding'] && /chunked/i.test(headers['transfer-encoding'])) {
    const parts = [];
    for (;;) {
      const le = buf.indexOf('\r\n', pos);
      if (le < 0) return null;
      const size = parseInt(buf.subarray(pos, le).toString('latin1'), 16);
      if (buf.length < le + 2 + size + 2) return null;
      parts.push(buf.subarray(le + 2, le + 2 + size));
      pos = le + 2 + size + 2;
      if (size === 0) break;
    }
    body = Buffer.concat(parts);
  } else if (headers['content-length'] !== undefined) {
    const n = Number(headers['content-length']);
    if (buf.length < pos + n) return null;
    body = buf.subarray(pos, pos + n);
    pos += n;
  } else {
    return null; // read-until-close bodies are not used by kvgw
  }
  const text = body.toString('utf8');
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status, headers, body, text, json, consumed: pos };
}

// A POST request's bytes with a JSON (or raw) body and Content-Length.
export function postBytes(path, body, headers = {}) {
  const b = Buffer.isBuffer(body) ? body : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
  const h = { host: '127.0.0.1', 'content-type': 'application/json', 'x-api-key': KEY, 'anthropic-version': '2023-06-01', 'content-length': String(b.length), ...headers };
  let s = `POST ${path} HTTP/1.1\r\n`;
  for (const [k, v] of Object.entries(h)) if (v !== null) s += `${k}: ${v}\r\n`;
  return Buffer.concat([Buffer.from(s + '\r\n', 'latin1'), b]);
}

// ---- metrics ---------------------------------------------------------------------------------

export async function metric(base, name) {
  // /metrics answers to the admin key of gatewayConfig (metrics.require_key).
  const text = await (await fetch(base + '/metrics', { headers: { authorization: 'Bearer sk-test-admin' } })).text();
  const m = text.match(new RegExp('^' + name + '(?:\\{\\})? ([0-9.e+-]+)$', 'm'));
  return m ? Number(m[1]) : null;
}

// ---- the ledger, read independently ----------------------------------------------------------

const CRC32C_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    let c = i;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
    t[i] = c >>> 0;
  }
  return t;
})();

export function crc32c(buf) {
  let c = 0xffffffff;
  for (let i = 0; i < buf.length; i++) c = CRC32C_TABLE[(c ^ buf[i]) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

// A record's payload; version 2 (billing/ledger.h) adds the registry byte after the costs,
// version 1 reads as registry 0 (none).
function decodeEvent(p, version = 2) {
  let o = 0;
  const ev = { kind: p[o++], status: p[o++] };
  for (const name of ['event_id', 'request_id', 'tenant', 'api_key_id', 'model', 'ns']) {
    const n = p[o++];
    if (n > 63 || o + n > p.length) throw new Error('bad string length');
    ev[name] = p.subarray(o, o + n).toString('latin1');
    o += n;
  }
  const tail = 16 * 8 + (version >= 2 ? 1 : 0);
  if (p.length - o !== tail) throw new Error(`payload tail is ${p.length - o} bytes, not ${tail}`);
  const f = ['start_ms', 'end_ms', 'uncached', 'write_5m', 'write_1h', 'read', 'output', 'hit_logical', 'hit_physical', 'token_ms'];
  for (const name of f) { ev[name] = Number(p.readBigUInt64LE(o)); o += 8; }
  ev.cost_nusd = [];
  for (let i = 0; i < 6; i++) { ev.cost_nusd.push(p.readBigUInt64LE(o)); o += 8; }
  ev.registry = version >= 2 ? p[o] : 0;
  if (ev.registry > 2) throw new Error('bad registry ' + ev.registry);
  return ev;
}

// Reads every segment of a ledger directory strictly: every header and record CRC, version,
// kind and seq order must check out to the last byte of the last segment (no torn tail: call it
// on a ledger whose writer exited cleanly or was recovered by a restart). Returns {events,
// lastSeq}; throws on the first problem, naming the file and offset.
export function readLedger(dir, { allowTornTail = false } = {}) {
  const segs = readdirSync(dir).filter((f) => /^ledger-\d{20}\.seg$/.test(f)).sort();
  const events = [];
  let expect = null;
  let torn = 0;
  for (const [si, name] of segs.entries()) {
    const b = readFileSync(join(dir, name));
    const where = (o) => `${name}@${o}`;
    if (b.length < 16 || b.subarray(0, 8).toString('latin1') !== 'KVGWLEDG') throw new Error(where(0) + ': bad segment header');
    const segVersion = b.readUInt32LE(8);
    if (segVersion !== 1 && segVersion !== 2) throw new Error(where(8) + ': segment version ' + segVersion);
    if (crc32c(b.subarray(0, 12)) !== b.readUInt32LE(12)) throw new Error(where(12) + ': segment header CRC');
    const first = BigInt(name.slice(7, 27));
    if (expect !== null && first !== expect) throw new Error(`${name}: starts at seq ${first}, expected ${expect}`);
    let o = 16;
    while (o < b.length) {
      const last = si === segs.length - 1;
      const bad = (why) => {
        if (allowTornTail && last) { torn = b.length - o; o = b.length; return true; }
        throw new Error(where(o) + ': ' + why);
      };
      if (b.length - o < 20) { if (bad('incomplete record header')) break; }
      const n = b.readUInt32LE(o);
      if (n < 1 || n > 65536 || b.length - o < 20 + n) { if (bad(`record length ${n} past the end`)) break; }
      if (crc32c(b.subarray(o + 8, o + 20 + n)) !== b.readUInt32LE(o + 4)) { if (bad('record CRC')) break; }
      if (b[o + 8] !== 1 && b[o + 8] !== 2) throw new Error(where(o) + ': record version ' + b[o + 8]);
      const seq = b.readBigUInt64LE(o + 12);
      if (expect === null) expect = seq;
      if (seq !== expect) throw new Error(where(o) + `: seq ${seq}, expected ${expect}`);
      expect = seq + 1n;
      const ev = decodeEvent(b.subarray(o + 20, o + 20 + n), b[o + 8]);
      if (ev.kind !== b[o + 9]) throw new Error(where(o) + ': record kind differs from the payload');
      ev.seq = seq;
      events.push(ev);
      o += 20 + n;
    }
  }
  return { events, lastSeq: expect === null ? 0n : expect - 1n, torn };
}

// `kvgw billing export --ledger DIR --format jsonl` as parsed rows, or null when this build has
// no billing CLI yet (the caller then relies on readLedger alone and says so).
export function exportJsonl(ledgerDir) {
  const out = spawnSync(BIN, ['billing', 'export', '--ledger', ledgerDir, '--format', 'jsonl'], { encoding: 'utf8', maxBuffer: 256 << 20 });
  if (out.status !== 0 && /unknown command 'billing'/.test(out.stderr)) return null;
  if (out.status !== 0) throw new Error(`kvgw billing export exited ${out.status}: ${out.stderr}`);
  return out.stdout.split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

export function writeConfig(dir, text, name = 'kvgw.yaml') {
  const p = join(dir, name);
  writeFileSync(p, text);
  return p;
}
