// bad_config.test.mjs — an operator's broken configs against the real binary: `kvgw
// check-config FILE` and `kvgw serve --config FILE` on an unknown key, bad values, a missing
// environment secret and a missing model file each exit 1 with one line naming file:line: key;
// `kvgw serve` with no price for its model warns at start and refuses that model's requests with
// a clear error (never serving them unbilled).
//
// Run: KVGW_BIN=build/bin/kvgw node --test tests/integration/bad_config.test.mjs (repository
// root; CTest does this as gateway_bad_config).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BIN, MODEL, KEY, gatewayConfig, startGateway, stopGateway, writeConfig, readLedger } from './harness.mjs';

let dir;
before(() => { dir = mkdtempSync(join(tmpdir(), 'kvgw-badcfg-')); });
after(() => { rmSync(dir, { recursive: true, force: true }); });

const ENV_SECRET = 'KVGW_TEST_SECRET_THAT_IS_NOT_SET';

function run(args, env = {}) {
  const e = { ...process.env, ...env };
  delete e[ENV_SECRET];
  return spawnSync(BIN, args, { encoding: 'utf8', env: e, timeout: 60000 });
}

// The config of the tests, with one line replaced or added; returns the path and the 1-based
// line number of the broken line.
function broken(name, mutate) {
  const lines = gatewayConfig(dir).trimEnd().split('\n');
  const line = mutate(lines);
  const p = join(dir, name + '.yaml');
  writeFileSync(p, lines.join('\n') + '\n');
  return { path: p, line };
}

const cases = [
  {
    name: 'unknown top-level key',
    make: (l) => { l.splice(1, 0, 'listen_backlog: 128'); return 2; },
    key: 'listen_backlog', why: /unknown key/,
  },
  {
    name: 'unknown nested key',
    make: (l) => { const i = l.indexOf('  fsync: batch'); l.splice(i + 1, 0, '  fsync_mode: always'); return i + 2; },
    key: 'billing.fsync_mode', why: /unknown key/,
  },
  {
    name: 'bad enum value',
    make: (l) => { const i = l.indexOf('  fsync: batch'); l[i] = '  fsync: sometimes'; return i + 1; },
    key: 'billing.fsync', why: /expected always, batch or off/,
  },
  {
    name: 'kv_tiers without dir',
    make: (l) => { l.push('kv_tiers:', '  max_bytes: 1GiB'); return l.length - 1; },
    key: 'kv_tiers', why: /needs dir/,
  },
  {
    name: 'kv_tiers budget too small',
    make: (l) => { l.push('kv_tiers:', '  dir: var/t', '  max_bytes: 1KiB'); return l.length; },
    key: 'kv_tiers.max_bytes', why: /out of range/,
  },
  {
    name: 'bad integer',
    make: (l) => { l.push('limits:', '  max_connections: lots'); return l.length; },
    key: 'limits.max_connections', why: /expected an integer/,
  },
  {
    name: 'bad duration',
    make: (l) => { l.push('limits:', '  header_timeout: 5 parsecs'); return l.length; },
    key: 'limits.header_timeout', why: /expected a duration/,
  },
  {
    name: 'missing environment secret',
    make: (l) => { const i = l.findIndex((x) => x.startsWith('  namespace_secret:')); l[i] = `  namespace_secret: env:${ENV_SECRET}`; return i + 1; },
    key: 'cache.namespace_secret', why: new RegExp(`environment variable ${ENV_SECRET} is not set`),
  },
  {
    name: 'unknown key in a list item',
    make: (l) => { const i = l.findIndex((x) => x.includes('{key: sk-test-a')); l[i] = '  - {key: sk-test-a, id: key-a, tenant: tenant-a, colour: red}'; return i + 1; },
    key: 'api_keys[0].colour', why: /unknown key/,
  },
  // Issue 19 item 8: values the billing ledger cannot store (63-byte fields, no control
  // characters). They passed check-config, then every event of the tenant failed to record.
  {
    name: 'tenant longer than the ledger stores',
    make: (l) => { const i = l.findIndex((x) => x.includes('{key: sk-test-a')); l[i] = `  - {key: sk-test-a, id: key-a, tenant: ${'t'.repeat(64)}}`; return i + 1; },
    key: 'api_keys[0].tenant', why: /is 64 bytes; the billing ledger stores at most 63/,
  },
  {
    name: 'key id longer than the ledger stores',
    make: (l) => { const i = l.findIndex((x) => x.includes('{key: sk-test-a')); l[i] = `  - {key: sk-test-a, id: ${'k'.repeat(80)}, tenant: tenant-a}`; return i + 1; },
    key: 'api_keys[0].id', why: /is 80 bytes; the billing ledger stores at most 63/,
  },
  {
    name: 'tenant with a control character',
    make: (l) => { const i = l.findIndex((x) => x.includes('{key: sk-test-a')); l[i] = '  - {key: sk-test-a, id: key-a, tenant: "tenant\\na"}'; return i + 1; },
    key: 'api_keys[0].tenant', why: /holds a control character \(byte 0x0a\)/,
  },
  {
    name: 'model name longer than the ledger stores',
    make: (l) => { const i = l.findIndex((x) => x.startsWith('  - name: ')); l[i] = `  - name: ${'m'.repeat(70)}`; return i + 1; },
    key: 'models[0].name', why: /is 70 bytes; the billing ledger stores at most 63/,
  },
  {
    name: 'instance id the ledger refuses',
    make: (l) => { const i = l.indexOf('  fsync: batch'); l.splice(i + 1, 0, '  instance_id: gw/one'); return i + 2; },
    key: 'billing.instance_id', why: /expected 1-63 characters of A-Z a-z 0-9 _ \. -/,
  },
  // Issue 22: the cluster settings that only make sense together (many gateways, one cache).
  {
    name: 'registry without redis',
    make: (l) => { inst(l); l.push('registry:', '  enabled: true'); return l.length; },
    key: 'registry.enabled', why: /the registry lives in Redis: set redis\.address or redis\.sentinels/,
  },
  {
    name: 'registry with the demo namespace secret',
    make: (l) => { inst(l); l[l.findIndex((x) => x.startsWith('  namespace_secret:'))] = '  accounting: token'; l.push('redis:', '  address: 127.0.0.1:1', 'registry:', '  enabled: true'); return l.length; },
    key: 'registry.enabled', why: /needs cache\.namespace_secret \(the built-in demo secret is refused with a registry/,
  },
  {
    name: 'registry without an explicit instance id',
    make: (l) => { l.push('redis:', '  address: 127.0.0.1:1', 'registry:', '  enabled: true'); return l.length; },
    key: 'registry.enabled', why: /needs an explicit billing\.instance_id, unique per gateway/,
  },
  {
    name: 'registry timeout not below claim_ttl',
    make: (l) => { inst(l); l.push('redis:', '  address: 127.0.0.1:1', 'registry:', '  enabled: true', '  claim_ttl: 2s', '  timeout: 5s'); return l.length; },
    key: 'registry.timeout', why: /5000ms must be below registry\.claim_ttl \(2000ms\)/,
  },
  {
    name: 'redis address and sentinels both',
    make: (l) => { l.push('redis:', '  address: 127.0.0.1:1', '  sentinels: [127.0.0.1:26379]', '  master_name: kvgw'); return l.length - 1; },
    key: 'redis.sentinels', why: /give either redis\.address \(one server\) or redis\.sentinels/,
  },
  {
    name: 'sentinels without master_name',
    make: (l) => { l.push('redis:', '  sentinels: [127.0.0.1:26379, 127.0.0.1:26380]'); return l.length; },
    key: 'redis.sentinels', why: /needs redis\.master_name/,
  },
  {
    name: 'redis prefix with a colon',
    make: (l) => { l.push('redis:', '  address: 127.0.0.1:1', '  prefix: "kv:gw"'); return l.length; },
    key: 'redis.prefix', why: /expected 1-32 characters of A-Z a-z 0-9 _ \. -/,
  },
];

// billing.instance_id, which the registry needs (the harness's config leaves the default).
function inst(l) {
  const i = l.indexOf('  fsync: batch');
  l.splice(i + 1, 0, '  instance_id: gw-test-a');
}

for (const c of cases) {
  test(`${c.name}: check-config and serve exit 1 with file:line: key`, () => {
    const { path, line } = broken(c.name.replace(/\W+/g, '_'), c.make);
    const want = `${path}:${line}: ${c.key}: `;
    const cc = run(['check-config', path]);
    assert.equal(cc.status, 1, cc.stderr);
    assert.equal(cc.stdout, '', 'nothing on stdout for an invalid config');
    const lines = cc.stderr.trimEnd().split('\n');
    assert.equal(lines.length, 1, 'one line: ' + cc.stderr);
    assert.ok(lines[0].startsWith('kvgw check-config: ' + want), `"${lines[0]}" names ${want}`);
    assert.match(lines[0], c.why);

    const sv = run(['serve', '--config', path]);
    assert.equal(sv.status, 1, sv.stderr);
    const sl = sv.stderr.trimEnd().split('\n');
    assert.equal(sl.length, 1, 'one line: ' + sv.stderr);
    assert.ok(sl[0].startsWith('kvgw serve: ' + want), `"${sl[0]}" names ${want}`);
    assert.ok(!existsSync(join(dir, 'ledger')), 'a refused config creates no ledger');
  });
}

test('the same secret, once set, is accepted (the failure above was the missing variable)', () => {
  const { path } = broken('env_set', (l) => { const i = l.findIndex((x) => x.startsWith('  namespace_secret:')); l[i] = `  namespace_secret: env:${ENV_SECRET}`; return i + 1; });
  const e = { ...process.env, [ENV_SECRET]: 'a-real-secret-from-the-environment' };
  const cc = spawnSync(BIN, ['check-config', path], { encoding: 'utf8', env: e });
  assert.equal(cc.status, 0, cc.stderr);
  assert.match(cc.stdout, /namespace_secret: <set>/);
  assert.doesNotMatch(cc.stdout, /a-real-secret/);
});

test('a missing model file: serve exits 1 naming the path, without starting', () => {
  const { path } = broken('no_model', (l) => { const i = l.findIndex((x) => x.includes('path: models/kvgw-demo.gguf')); l[i] = `    path: ${dir}/no-such-model.gguf`; return i + 1; });
  const sv = run(['serve', '--config', path]);
  assert.equal(sv.status, 1, sv.stderr);
  assert.match(sv.stderr, new RegExp(`${dir}/no-such-model\\.gguf`));
  assert.doesNotMatch(sv.stdout, /listening on/);
});

test('no price for the model: serve warns, refuses its requests with a clear error, bills nothing', async () => {
  const pricing = join(dir, 'pricing-without-demo.yaml');
  writeFileSync(pricing, `currency: USD
models:
  some-other-model:
    effective: 2024-01-01
    input_usd_per_mtok: "3"
    output_usd_per_mtok: "15"
`);
  const d = mkdtempSync(join(dir, 'noprice-'));
  const cfg = writeConfig(d, gatewayConfig(d, { pricing }));
  const gw = await startGateway(cfg);
  try {
    assert.match(gw.stderr(), new RegExp(`warning: ${pricing.replace(/[.]/g, '\\.')} has no price for model ${MODEL}: its requests will be refused`));
    for (const stream of [false, true]) {
      const r = await fetch(gw.base + '/v1/messages', {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-api-key': KEY, 'anthropic-version': '2023-06-01' },
        body: JSON.stringify({ model: MODEL, max_tokens: 2, stream, messages: [{ role: 'user', content: 'x' }] }),
      });
      const j = await r.json();
      assert.equal(r.status, 500, JSON.stringify(j));
      assert.equal(j.type, 'error');
      assert.equal(j.error.type, 'api_error');
      assert.equal(j.error.message, `no price is configured for model ${MODEL}: the request is refused, never served unbilled`);
      assert.equal(j.request_id, r.headers.get('request-id'));
    }
    const o = await fetch(gw.base + '/v1/chat/completions', {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
      body: JSON.stringify({ model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: 'x' }] }),
    });
    const oj = await o.json();
    assert.equal(o.status, 500);
    assert.match(oj.error.message, /no price is configured for model kvgw-demo/);
    // Not billable: counting tokens still works.
    const ct = await fetch(gw.base + '/v1/messages/count_tokens', {
      method: 'POST', headers: { 'content-type': 'application/json', 'x-api-key': KEY },
      body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'x' }] }),
    });
    assert.equal(ct.status, 200);
  } finally {
    const { code } = await stopGateway(gw, 'SIGTERM');
    assert.equal(code, 0, gw.stderr());
  }
  assert.equal(readLedger(join(d, 'ledger')).events.filter((e) => e.kind === 1).length, 0, 'nothing was billed (at 0 or otherwise)');
});

// Issue 19 item 14, protected mode: the built-in demo secrets (namespace secret, demo API keys,
// demo admin key) are public; a gateway that uses them refuses to listen beyond loopback unless
// server.allow_demo_secrets_on_public: true says so. --listen overrides the config's address.
function demoConfig(d, { listen = '127.0.0.1:0', allow = false } = {}) {
  return writeConfig(d, `listen: ${listen}
models:
  - {name: ${MODEL}, path: models/kvgw-demo.gguf, min_cache_tokens: 16, workers: 1, threads: 1}
api_keys:
  - {key: sk-kvgw-demo, id: demo-key, tenant: demo}
admin_key: sk-kvgw-admin
billing:
  ledger_dir: ${d}/ledger
  pricing: conf/pricing.yaml
log:
  access_log: off
${allow ? 'server:\n  allow_demo_secrets_on_public: true\n' : ''}`);
}

test('demo secrets on a public address: serve and check-config refuse, naming the fix', () => {
  const d = mkdtempSync(join(dir, 'demo-'));
  const want = /refusing to listen on 0\.0\.0\.0, which is not a loopback address, with the built-in cache\.namespace_secret, the demo API key sk-kvgw-demo, the demo admin_key sk-kvgw-admin: .*server\.allow_demo_secrets_on_public: true/;
  // --listen on the command line, over a loopback config.
  const sv = run(['serve', '--config', demoConfig(d), '--listen', '0.0.0.0:0']);
  assert.equal(sv.status, 1, sv.stderr);
  assert.match(sv.stderr, want);
  assert.doesNotMatch(sv.stdout, /listening on/);
  assert.ok(!existsSync(join(d, 'ledger')), 'refused before opening the ledger');
  // The config's own address; check-config says the same.
  const cfg = demoConfig(d, { listen: '0.0.0.0:0' });
  const sv2 = run(['serve', '--config', cfg]);
  assert.equal(sv2.status, 1, sv2.stderr);
  assert.match(sv2.stderr, want);
  const cc = run(['check-config', cfg]);
  assert.equal(cc.status, 1, cc.stderr);
  assert.match(cc.stderr, new RegExp(`^kvgw check-config: ${cfg.replace(/[.]/g, '\\.')}: listen: refusing to listen on 0\\.0\\.0\\.0`));
  assert.equal(cc.stdout, '');
  // The embedded default (conf/kvgw.yaml) is the demo itself.
  const def = run(['check-config', 'conf/kvgw.yaml']);
  assert.equal(def.status, 0, def.stderr);
});

test('demo secrets: loopback always starts, a public address with the explicit flag starts', async () => {
  const d1 = mkdtempSync(join(dir, 'demo-loop-'));
  const gw1 = await startGateway(demoConfig(d1));
  try {
    const r = await fetch(gw1.base + '/healthz');
    assert.equal(r.status, 200);
  } finally {
    await stopGateway(gw1);
  }
  const d2 = mkdtempSync(join(dir, 'demo-public-'));
  const cfg = demoConfig(d2, { listen: '0.0.0.0:0', allow: true });
  assert.equal(run(['check-config', cfg]).status, 0);
  const gw2 = await startGateway(cfg);
  try {
    assert.equal(gw2.host, '0.0.0.0');
    const r = await fetch(`http://127.0.0.1:${gw2.port}/healthz`);
    assert.equal(r.status, 200);
  } finally {
    const { code } = await stopGateway(gw2);
    assert.equal(code, 0, gw2.stderr());
  }
});
