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
];

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
