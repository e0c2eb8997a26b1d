// dashboard.test.mjs — the built-in /dashboard page in a real browser: `kvgw serve` on a temp
// config, a few real requests (cache write, cache read, an OpenAI request, a refused one), then
// headless Chromium (Debian's `chromium`, installed by scripts/setup.sh) loads
// /dashboard#key=<admin key>, lets the page poll /metrics, and the DOM it leaves is compared,
// figure by figure, with /metrics itself. A screenshot goes to $KVGW_BUILD_DIR/dashboard.png.
//
// Run by CTest (tests/integration/CMakeLists.txt) with KVGW_BIN (the kvgw binary),
// KVGW_DASHBOARD_WRITER (test_dashboard, whose --write FILE mode writes the page's bytes) and
// KVGW_BUILD_DIR, the repository root as the working directory.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, readFileSync, rmSync, statSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const BIN = process.env.KVGW_BIN ?? 'build/bin/kvgw';
const WRITER = process.env.KVGW_DASHBOARD_WRITER ?? 'build/tests/test_dashboard';
const BUILD_DIR = process.env.KVGW_BUILD_DIR ?? 'build';
const MODEL = 'kvgw-demo';
const ADMIN = 'sk-test-admin';

let dir, gw, base, stderrText = '', pageBytes, proxy = null;

// Runs chromium without blocking this process's event loop (the fallback page server lives
// here). Resolves {status, stdout, stderr}.
function runChromium(bin, args) {
  return new Promise((resolve) => {
    const p = spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '', stderr = '';
    p.stdout.on('data', (d) => { stdout += d; });
    p.stderr.on('data', (d) => { stderr += d; });
    const t = setTimeout(() => p.kill('SIGKILL'), 120000);
    p.on('close', (status) => { clearTimeout(t); resolve({ status, stdout, stderr }); });
  });
}

function chromiumPath() {
  for (const c of ['chromium', 'chromium-browser', 'google-chrome']) {
    const r = spawnSync('sh', ['-c', `command -v ${c}`], { encoding: 'utf8' });
    if (r.status === 0 && r.stdout.trim()) return r.stdout.trim();
  }
  throw new Error('no chromium: scripts/setup.sh installs the Debian package chromium');
}

async function startGateway() {
  const cfg = join(dir, 'kvgw.yaml');
  writeFileSync(cfg, `listen: 127.0.0.1:0
models:
  - name: ${MODEL}
    path: models/kvgw-demo.gguf
    min_cache_tokens: 16
    workers: 2
    threads: 1
api_keys:
  - {key: sk-test-a, id: key-a, tenant: tenant-a}
admin_key: ${ADMIN}
cache:
  namespace_secret: dashboard-test-namespace-secret
kv_tiers:
  dir: ${dir}/kv-tiers
  max_bytes: 64MiB
billing:
  ledger_dir: ${dir}/ledger
  pricing: conf/pricing.yaml
log:
  access_log: off
`);
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

// Until the gateway serves GET /dashboard itself, the same bytes (from test_dashboard --write)
// are served by a small local server that passes /metrics through to the gateway unchanged.
async function startProxy() {
  const server = createServer(async (req, res) => {
    if (req.url === '/dashboard') {
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
      res.end(pageBytes);
      return;
    }
    const r = await fetch(base + req.url, { headers: { authorization: req.headers.authorization ?? '' } });
    res.writeHead(r.status, { 'content-type': r.headers.get('content-type') ?? 'text/plain' });
    res.end(Buffer.from(await r.arrayBuffer()));
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return server;
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kvgw-dash-'));
  const pagePath = join(dir, 'page.html');
  const w = spawnSync(WRITER, ['--write', pagePath], { encoding: 'utf8' });
  assert.equal(w.status, 0, `${WRITER} --write failed: ${w.stderr}`);
  pageBytes = readFileSync(pagePath);
  await startGateway();
});

after(async () => {
  if (gw && gw.exitCode === null) gw.kill('SIGKILL');
  if (proxy) proxy.close();
  rmSync(dir, { recursive: true, force: true });
});

function longSystem(tag) {
  let s = `You are assistant ${tag}. `;
  for (let i = 0; i < 40; i++) s += `Rule ${i}: answer briefly and cite section ${i}. `;
  return s;
}

async function post(path, body) {
  const r = await fetch(base + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': 'sk-test-a', 'anthropic-version': '2023-06-01' },
    body: JSON.stringify(body),
  });
  return { status: r.status, json: await r.json().catch(() => null) };
}

const metricsText = async () => (await fetch(base + '/metrics', { headers: { authorization: `Bearer ${ADMIN}` } })).text();

// Prometheus text -> Map "name{k="v",...}" -> value, labels sorted by name.
function parseMetrics(text) {
  const out = new Map();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    assert.ok(m, `bad exposition line: ${line}`);
    const labels = [...(m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)]
      .map((x) => [x[1], x[2]]).sort((a, b) => a[0].localeCompare(b[0]));
    out.set(m[1] + '{' + labels.map(([k, v]) => `${k}="${v}"`).join(',') + '}', Number(m[3]));
  }
  return out;
}
const val = (mm, key) => mm.get(key) ?? 0;
function sumOf(mm, name, pred = () => true) {
  let s = 0;
  for (const [k, v] of mm) if (k.startsWith(name + '{') && pred(k)) s += v;
  return s;
}

// The figures the page shows: data-key -> data-value (its raw number), from the dumped DOM.
function pageFigures(dom) {
  const out = new Map();
  for (const m of dom.matchAll(/<[^>]*\bdata-key="([^"]+)"[^>]*\bdata-value="([^"]*)"[^>]*>/g))
    out.set(m[1], m[2] === '' ? NaN : Number(m[2]));
  return out;
}

function near(a, b, what) {
  assert.ok(Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(b)), `${what}: the page shows ${a}, /metrics says ${b}`);
}

test('the dashboard shows the figures of /metrics and draws its charts', { timeout: 300000 }, async () => {
  // Traffic: a cache write then a read of the same prefix, an OpenAI request, a refused request.
  const system = [{ type: 'text', text: longSystem('dash'), cache_control: { type: 'ephemeral' } }];
  const messages = [{ role: 'user', content: 'What is rule 3?' }];
  const a = await post('/v1/messages', { model: MODEL, max_tokens: 6, system, messages });
  assert.equal(a.status, 200, JSON.stringify(a.json));
  assert.ok(a.json.usage.cache_creation_input_tokens > 100);
  const b = await post('/v1/messages', { model: MODEL, max_tokens: 6, system, messages });
  assert.equal(b.status, 200);
  assert.ok(b.json.usage.cache_read_input_tokens > 100);
  const c = await post('/v1/chat/completions', { model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: 'hello' }] });
  assert.equal(c.status, 200, JSON.stringify(c.json));
  const d = await post('/v1/messages', { model: MODEL, messages });
  assert.equal(d.status, 400, 'max_tokens is required');

  // The page the gateway serves, or the same bytes from a local server until it does.
  let origin = base;
  const r = await fetch(base + '/dashboard');
  if (r.status === 404) {
    proxy = await startProxy();
    origin = `http://127.0.0.1:${proxy.address().port}`;
  } else {
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /^text\/html/);
    assert.deepEqual(Buffer.from(await r.arrayBuffer()), pageBytes, 'GET /dashboard serves gw_dashboard_page');
  }

  // Every family the page reads is one the gateway exposes.
  // /metrics answers to the admin key only (metrics.require_key), as the page sends it.
  const noKey = await fetch(base + '/metrics');
  assert.equal(noKey.status, 401);
  assert.equal((await noKey.json()).error.type, 'authentication_error');
  const before = await metricsText();
  // (Histogram series are read by family name plus _count, _sum or _bucket.)
  const names = new Set([...pageBytes.toString('utf8').matchAll(/"(kvgw_[a-z_]+?)(?:_count|_sum|_bucket)?"/g)]
    .map((m) => m[1]));
  assert.equal(names.size, 30);
  // The registry's families (kvgw_registry_*) exist only on a gateway with a registry, which
  // this one is not: the page shows its registry card only when they are there.
  for (const n of names) {
    if (n.startsWith('kvgw_registry_')) {
      assert.ok(!new RegExp(`^# TYPE ${n} `, 'm').test(before), `${n} without a registry`);
      continue;
    }
    assert.ok(new RegExp(`^# TYPE ${n} `, 'm').test(before), `/metrics has no family ${n}`);
  }
  // So does every family the Grafana dashboard queries, but for the Redis shipper's lag, which
  // the panel names ahead of the billing module exporting it (conf/README.md says so).
  const grafana = readFileSync('conf/grafana/kvgw-dashboard.json', 'utf8');
  const gnames = new Set([...grafana.matchAll(/\b(kvgw_[a-z_]+?)(?:_count|_sum|_bucket)?\b/g)].map((m) => m[1]));
  assert.ok(gnames.size >= 14);
  for (const n of gnames) {
    if (n === 'kvgw_billing_shipper_lag_events' || n.startsWith('kvgw_registry_')) continue;
    assert.ok(new RegExp(`^# TYPE ${n} `, 'm').test(before), `conf/grafana/kvgw-dashboard.json queries ${n}, which /metrics lacks`);
  }

  const chromium = chromiumPath();
  const url = `${origin}/dashboard#key=${ADMIN}`;
  const flags = ['--headless', '--no-sandbox', '--disable-gpu', '--hide-scrollbars', '--no-first-run',
                 `--user-data-dir=${join(dir, 'chromium')}`, '--window-size=1400,1500',
                 '--virtual-time-budget=7000'];
  const dump = await runChromium(chromium, [...flags, '--dump-dom', url]);
  assert.equal(dump.status, 0, `chromium --dump-dom failed: ${dump.stderr}`);
  const dom = dump.stdout;
  const after = parseMetrics(await metricsText());

  const scrapes = Number(/<body[^>]*data-scrapes="(\d+)"/.exec(dom)?.[1] ?? 0);
  assert.ok(scrapes >= 2, `the page scraped /metrics ${scrapes} times (want at least 2)`);
  assert.match(dom, /id="status"[^>]*>live, updated/, 'the status line says live');
  const fig = pageFigures(dom);

  // Request counters. Every response of the gateway is counted, /metrics scrapes too (as
  // endpoint "metrics", code 200), and a scrape is counted after its text was rendered: the
  // series that holds the scrapes may be ahead by exactly the page's last scrape.
  const reqKeys = [...after.keys()].filter((k) => k.startsWith('kvgw_requests_total{'));
  assert.ok(reqKeys.length >= 3);
  let total = 0;
  for (const k of reqKeys) {
    const code = /code="(\d+)"/.exec(k)[1], ep = /endpoint="([^"]+)"/.exec(k)[1];
    const shown = fig.get(`requests.${ep}.${code}`);
    assert.ok(Number.isFinite(shown), `the page shows no figure for ${k}`);
    const lag = after.get(k) - shown;
    if (ep === 'metrics' && code === '200') assert.ok(lag === 0 || lag === 1, `${k}: page ${shown}, /metrics ${after.get(k)}`);
    else near(shown, after.get(k), k);
    total += shown;
  }
  near(fig.get('requests'), total, 'requests (sum over endpoint and code)');
  // No registry here: its card stays hidden and its figures unset.
  assert.match(dom, /<div class="card" id="card-registry" hidden="">/);
  assert.ok(Number.isNaN(fig.get('registry.up')), 'no registry figure without a registry');
  near(fig.get('requests.messages.400'), 1, 'the refused request');
  near(fig.get('requests.chat_completions.200'), 1, 'the OpenAI request');

  // Tokens by bucket and the hit ratios derived from them.
  let prompt = 0;
  for (const bucket of ['uncached', 'cache_write_5m', 'cache_write_1h', 'cache_read', 'output']) {
    const v = val(after, `kvgw_tokens_total{type="${bucket}"}`);
    near(fig.get(`tokens.${bucket}`), v, `tokens ${bucket}`);
    if (bucket !== 'output') prompt += v;
  }
  assert.ok(fig.get('tokens.cache_read') > 100);
  const logical = val(after, 'kvgw_cache_hit_tokens_total{kind="logical"}');
  const physical = val(after, 'kvgw_cache_hit_tokens_total{kind="physical"}');
  near(fig.get('hit_ratio.logical'), logical / prompt, 'logical hit ratio');
  near(fig.get('hit_ratio.physical'), physical / prompt, 'physical hit ratio');
  assert.ok(fig.get('hit_ratio.logical') > 0.2 && fig.get('hit_ratio.logical') < 1);

  // TTFT by cache outcome: count and mean per outcome.
  for (const o of ['hit', 'miss']) {
    const n = val(after, `kvgw_time_to_first_token_seconds_count{cache="${o}"}`);
    const s = val(after, `kvgw_time_to_first_token_seconds_sum{cache="${o}"}`);
    assert.ok(n >= 1, `a ${o} was observed`);
    near(fig.get(`ttft_count.${o}`), n, `ttft count ${o}`);
    near(fig.get(`ttft_mean.${o}`), s / n, `ttft mean ${o}`);
  }

  // Cache entries, expirations, workers, lookups.
  near(fig.get('entries'), val(after, 'kvgw_cache_entries{}'), 'entries');
  assert.ok(fig.get('entries') >= 1);
  near(fig.get('entry_tokens'), val(after, 'kvgw_cache_tokens{}'), 'entry tokens');
  near(fig.get('expirations'), sumOf(after, 'kvgw_cache_expirations_total'), 'expirations');
  near(fig.get('in_flight'), val(after, 'kvgw_requests_in_flight{}'), 'in flight');
  const workers = [...after.keys()].filter((k) => k.startsWith('kvgw_worker_up{')).map((k) => /worker="([^"]+)"/.exec(k)[1]);
  assert.equal(workers.length, 2);
  for (const w of workers) {
    near(fig.get(`worker_up.${w}`), val(after, `kvgw_worker_up{worker="${w}"}`), `worker ${w} up`);
    near(fig.get(`worker_queued.${w}`), val(after, `kvgw_worker_queued_requests{worker="${w}"}`), `worker ${w} queue`);
    near(fig.get(`worker_free_blocks.${w}`), val(after, `kvgw_worker_free_kv_blocks{worker="${w}"}`), `worker ${w} free blocks`);
    assert.ok(fig.get(`worker_free_blocks.${w}`) > 0);
  }
  const lookups = [...after.keys()].filter((k) => k.startsWith('kvgw_cache_lookups_total{'));
  assert.ok(lookups.length >= 2);
  for (const k of lookups) near(fig.get(`lookups.${/result="([^"]+)"/.exec(k)[1]}`), after.get(k), k);
  near(fig.get('billing.appended'), val(after, 'kvgw_billing_events_total{state="appended"}'), 'billing events');

  // Where the prompts' KV came from (the workers' PREFILL frames), and the KV tiers: the disk
  // tier is on (kv_tiers above), so a worker that reported its load since it worked has its g3
  // row, its budget and its counters (an in-process worker reports them after its first step).
  let sources = 0;
  for (const src of ['g1', 'g2', 'g3', 'recompute', 'prefill']) {
    const v = sumOf(after, 'kvgw_prompt_tokens_by_source_total', (k) => k.includes(`source="${src}"`));
    near(fig.get(`sources.${src}`), v, `prompt tokens from ${src}`);
    sources += v;
  }
  assert.ok(sources >= prompt, `every prompt token has a source: ${sources} of ${prompt}`);
  assert.ok(fig.get('sources.g1') > 100, 'cache reads came from the pool');
  const tiered = workers.filter((w) => val(after, `kvgw_worker_tier_max_bytes{tier="g3",worker="${w}"}`) > 0);
  assert.ok(tiered.length >= 1, 'a worker shows its disk tier');
  for (const w of tiered) {
    const t = `tier="g3",worker="${w}"`, k = `${w}.g3`;
    assert.equal(val(after, `kvgw_worker_tier_max_bytes{${t}}`), 64 * 1024 * 1024, 'the budget');
    near(fig.get(`tier_bytes.${k}`), val(after, `kvgw_worker_tier_bytes{${t}}`), `${k} bytes`);
    near(fig.get(`tier_blocks.${k}`), val(after, `kvgw_worker_tier_blocks{${t}}`), `${k} blocks`);
    for (const [key, name] of [['hits', 'hits'], ['loads', 'loads'], ['writes', 'writes'], ['evictions', 'evictions'],
                               ['corrupt', 'corrupt_records'], ['tokens_loaded', 'recomputes_avoided_tokens']])
      near(fig.get(`tier_${key}.${k}`), val(after, `kvgw_worker_tier_${name}_total{${t}}`), `${k} ${key}`);
  }
  near(fig.get('tiers.hole_tokens'), sumOf(after, 'kvgw_worker_hole_recomputed_tokens_total'), 'hole tokens');

  // A screenshot for people (and a check that the charts were drawn: a PNG of real size).
  const png = join(BUILD_DIR, 'dashboard.png');
  const shot = await runChromium(chromium, [...flags, `--screenshot=${png}`, url]);
  assert.equal(shot.status, 0, `chromium --screenshot failed: ${shot.stderr}`);
  const head = readFileSync(png).subarray(0, 8);
  assert.deepEqual([...head], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], 'a PNG file');
  assert.ok(statSync(png).size > 30000, `the screenshot is ${statSync(png).size} bytes`);

  // Without a key, or with a wrong one, the page shows no figure: it asks for the key in its form.
  for (const [hash, want] of [['', /id="status" class="err">\/metrics needs the admin key: enter it</],
                              ['#key=sk-test-a', /id="status" class="err">the admin key was refused \(HTTP 403\): enter it again</]]) {
    const r2 = await runChromium(chromium, [...flags, '--dump-dom', `${origin}/dashboard${hash}`]);
    assert.equal(r2.status, 0, `chromium --dump-dom failed: ${r2.stderr}`);
    assert.match(r2.stdout, want, `the status line for "${hash}"`);
    assert.match(r2.stdout, /<body[^>]*data-scrapes="0"/);
    assert.match(r2.stdout, /<form id="keyform">/, 'the key form is shown');
    assert.match(r2.stdout, /data-key="requests" data-value="">/, 'no figure');
  }
});
