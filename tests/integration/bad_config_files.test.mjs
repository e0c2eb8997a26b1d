// bad_config_files.test.mjs — regression tests, run by CTest as gateway_regress_bad_config_files. Each check below was a bug
// (found by the hardening tests, since fixed); the text says what it was.
//
// A config whose models[0].path names a file that does not exist:
// 1. `kvgw check-config FILE` prints the config and exits 0 ("is valid"), although `kvgw serve`
//    on the same file cannot start. Expected: exit 1, one line "FILE:LINE: models[0].path: ...".
// 2. `kvgw serve --config FILE` exits 1 with two lines ("kvgw serve: gguf: cannot open '...'"
//    and a hint about scripts/models.sh) that do not name the config file, line or key.
//    (A missing billing.pricing file behaves the same way: check-config says valid, serve says
//    "kvgw serve: pricing: pricing: cannot open ...", with "pricing:" twice and no file:line.)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BIN, gatewayConfig, writeConfig } from './harness.mjs';

for (const [what, from, to, key] of [
  ['model file', 'path: models/kvgw-demo.gguf', 'path: /nonexistent/kvgw-missing.gguf', 'models[0].path'],
  ['pricing file', 'pricing: conf/pricing.yaml', 'pricing: /nonexistent/pricing.yaml', 'billing.pricing'],
]) {
  test(`a missing ${what}: check-config and serve exit 1 with file:line: key`, () => {
    const d = mkdtempSync(join(tmpdir(), 'kvgw-regress-cfg-'));
    try {
      const text = gatewayConfig(d);
      const line = text.split('\n').findIndex((l) => l.includes(from)) + 1;
      const p = writeConfig(d, text.replace(from, to));
      for (const args of [['check-config', p], ['serve', '--config', p]]) {
        const r = spawnSync(BIN, args, { encoding: 'utf8', timeout: 60000 });
        assert.equal(r.status, 1, `${args[0]}: exit ${r.status}, ${r.stderr}`);
        const lines = r.stderr.trimEnd().split('\n');
        assert.equal(lines.length, 1, `${args[0]}: one line: ${r.stderr}`);
        assert.ok(lines[0].includes(`${p}:${line}: ${key}: `), `${args[0]}: "${lines[0]}" names ${p}:${line}: ${key}`);
      }
    } finally {
      rmSync(d, { recursive: true, force: true });
    }
  });
}
