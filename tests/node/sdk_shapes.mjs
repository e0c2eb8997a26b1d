// sdk_shapes.mjs — the official SDKs (@anthropic-ai/sdk, openai) parse the gateway's response,
// stream and error bytes exactly as the gateway's API layer renders them.
//
// The shapes come from the C renderer itself: `test_api_render --write DIR` (path in
// KVGW_SHAPES_BIN) writes one file per shape; a local HTTP server serves them to the SDKs, which
// then must see the same ids, text, stop reasons and usage numbers, and raise the right error
// classes with the right messages. Run: KVGW_SHAPES_BIN=build/tests/test_api_render
// node tests/node/sdk_shapes.mjs (exit 77 = skipped: tests/node not installed).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
for (const pkg of ['@anthropic-ai/sdk', 'openai']) {
  if (!existsSync(join(here, 'node_modules', pkg, 'package.json'))) {
    console.log(`SKIP: ${pkg} is not installed in tests/node (npm ci there)`);
    process.exit(77);
  }
}
const { default: Anthropic } = await import('@anthropic-ai/sdk');
const { default: OpenAI } = await import('openai');

const bin = process.env.KVGW_SHAPES_BIN;
if (!bin) throw new Error('KVGW_SHAPES_BIN (the test_api_render binary) is not set');

let dir, server, baseURL;
let route = {}; // "METHOD path" -> {status, type, file}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'kvgw-shapes-'));
  execFileSync(bin, ['--write', dir]);
  server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const r = route[req.url.replace(/\?.*$/, '')];
      if (!r) {
        res.writeHead(404).end();
        return;
      }
      res.writeHead(r.status, { 'content-type': r.type, 'request-id': 'req_0123' });
      res.end(readFileSync(join(dir, r.file)));
    });
  });
  await new Promise((ok) => server.listen(0, '127.0.0.1', ok));
  baseURL = `http://127.0.0.1:${server.address().port}`;
});

after(() => {
  server?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const json = 'application/json';
const sse = 'text/event-stream';
const anthropic = () => new Anthropic({ apiKey: 'sk-test', baseURL, maxRetries: 0 });
const openai = () => new OpenAI({ apiKey: 'sk-test', baseURL: `${baseURL}/v1`, maxRetries: 0 });
const anthReq = { model: 'claude-sonnet-4-6', max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] };
const oaiReq = { model: 'kvgw-demo', messages: [{ role: 'user', content: 'hi' }] };

test('anthropic message with cache usage', async () => {
  route = { '/v1/messages': { status: 200, type: json, file: 'anthropic_message.json' } };
  const m = await anthropic().messages.create(anthReq);
  assert.equal(m.id, 'msg_01XFDUDYJgAACzvnptvVoYEL');
  assert.equal(m.content[0].text, 'Hello!');
  assert.equal(m.stop_reason, 'end_turn');
  assert.equal(m.stop_sequence, null);
  assert.deepEqual(
    [m.usage.input_tokens, m.usage.cache_creation_input_tokens, m.usage.cache_read_input_tokens,
      m.usage.cache_creation.ephemeral_5m_input_tokens, m.usage.cache_creation.ephemeral_1h_input_tokens,
      m.usage.output_tokens],
    [50, 248, 1800, 148, 100, 503]);
});

test('anthropic count_tokens', async () => {
  route = { '/v1/messages/count_tokens': { status: 200, type: json, file: 'anthropic_count.json' } };
  const c = await anthropic().messages.countTokens({ model: 'm', messages: anthReq.messages });
  assert.equal(c.input_tokens, 2098);
});

test('anthropic stream: text, usage merged from message_start and message_delta', async () => {
  route = { '/v1/messages': { status: 200, type: sse, file: 'anthropic_stream.sse' } };
  const s = anthropic().messages.stream(anthReq);
  let text = '';
  s.on('text', (t) => { text += t; });
  const m = await s.finalMessage();
  assert.equal(text, 'Hello!');
  assert.equal(m.content[0].text, 'Hello!');
  assert.equal(m.stop_reason, 'end_turn');
  assert.equal(m.usage.input_tokens, 50);
  assert.equal(m.usage.cache_read_input_tokens, 1800);
  assert.equal(m.usage.cache_creation_input_tokens, 248);
  assert.equal(m.usage.cache_creation.ephemeral_1h_input_tokens, 100);
  assert.equal(m.usage.output_tokens, 503);
});

test('anthropic stream error after the 200', async () => {
  route = { '/v1/messages': { status: 200, type: sse, file: 'anthropic_stream_error.sse' } };
  const s = anthropic().messages.stream(anthReq);
  await assert.rejects(s.finalMessage(), (e) => {
    assert.ok(e instanceof Anthropic.APIError, `got ${e}`);
    assert.match(String(e.message), /Overloaded/);
    return true;
  });
});

test('anthropic 400 error body', async () => {
  route = { '/v1/messages': { status: 400, type: json, file: 'anthropic_error_400.json' } };
  await assert.rejects(anthropic().messages.create(anthReq), (e) => {
    assert.ok(e instanceof Anthropic.BadRequestError);
    assert.equal(e.status, 400);
    assert.equal(e.error.type, 'error');
    assert.equal(e.error.error.type, 'invalid_request_error');
    assert.equal(e.error.error.message, 'A maximum of 4 blocks with cache_control may be provided. Found 5.');
    assert.equal(e.error.request_id, 'req_0123');
    return true;
  });
});

test('openai chat completion with cached tokens', async () => {
  route = { '/v1/chat/completions': { status: 200, type: json, file: 'openai_completion.json' } };
  const c = await openai().chat.completions.create(oaiReq);
  assert.equal(c.id, 'chatcmpl-abc123');
  assert.equal(c.choices[0].message.content, 'Hi "there"\n');
  assert.equal(c.choices[0].finish_reason, 'length');
  assert.equal(c.usage.prompt_tokens, 2006);
  assert.equal(c.usage.prompt_tokens_details.cached_tokens, 1920);
  assert.equal(c.usage.total_tokens, 2306);
});

test('openai stream with include_usage', async () => {
  route = { '/v1/chat/completions': { status: 200, type: sse, file: 'openai_stream.sse' } };
  const stream = await openai().chat.completions.create({ ...oaiReq, stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, n = 0;
  for await (const chunk of stream) {
    n++;
    if (chunk.choices.length > 0) {
      text += chunk.choices[0].delta.content ?? '';
      finish = chunk.choices[0].finish_reason ?? finish;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(n, 5);
  assert.equal(text, 'Hello!');
  assert.equal(finish, 'length');
  assert.equal(usage.prompt_tokens, 2006);
  assert.equal(usage.prompt_tokens_details.cached_tokens, 1920);
});

test('openai stream error after the 200', async () => {
  route = { '/v1/chat/completions': { status: 200, type: sse, file: 'openai_stream_error.sse' } };
  const stream = await openai().chat.completions.create({ ...oaiReq, stream: true });
  await assert.rejects(async () => { for await (const _ of stream); }, (e) => {
    assert.ok(e instanceof OpenAI.APIError, `got ${e}`);
    assert.match(String(e.message), /The worker stopped answering/);
    return true;
  });
});

test('openai 400 error body', async () => {
  route = { '/v1/chat/completions': { status: 400, type: json, file: 'openai_error_400.json' } };
  await assert.rejects(openai().chat.completions.create(oaiReq), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.status, 400);
    assert.equal(e.param, 'temperature');
    assert.equal(e.code, 'decimal_above_max_value');
    assert.equal(e.type, 'invalid_request_error');
    assert.match(e.message, /Expected a value <= 2, but got 3 instead/);
    return true;
  });
});
