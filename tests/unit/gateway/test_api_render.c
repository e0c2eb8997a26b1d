/*
 * test_api_render.c — tests gateway/api_render.c: the exact bytes of Anthropic messages,
 * count_tokens, the SSE sequence, OpenAI completions and chunk streams, and error bodies; the
 * state machines' order rules; JSON string escaping (every output parses back with jansson);
 * rollback on allocation failure.
 *
 * With an argument `--write DIR` the binary instead writes one file per shape into DIR, for
 * tests/node/sdk_shapes.mjs (the official SDKs parse them).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "common.h"
#include "pc_json.h"
#include "pc_failalloc.h"
#include "pc_test.h"

static const gw_api_resp_t *anth_resp(void)
{
    static gw_api_resp_t r;
    r = (gw_api_resp_t){0};
    r.id = "msg_01XFDUDYJgAACzvnptvVoYEL";
    r.model = PC_SLICE_LIT("claude-sonnet-4-6");
    r.text = PC_SLICE_LIT("Hello!");
    r.stop_reason = GW_STOP_END_TURN;
    r.usage = (gw_usage_t){50, 1800, 148, 100, 503};
    return &r;
}

static const gw_api_resp_t *oai_resp(void)
{
    static gw_api_resp_t r;
    r = (gw_api_resp_t){0};
    r.id = "chatcmpl-abc123";
    r.model = PC_SLICE_LIT("kvgw-demo");
    r.created = 1761564674;
    r.text = PC_SLICE_LIT("Hi \"there\"\n");
    r.stop_reason = GW_STOP_MAX_TOKENS;
    r.usage = (gw_usage_t){6, 1920, 80, 0, 300};
    return &r;
}

static bool valid_json(const char *s, size_t n)
{
    json_t *v = json_loadb(s, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    json_decref(v);
    return v != NULL;
}

/* Every "data: " payload of an SSE text is JSON (or [DONE]). */
static bool sse_payloads_valid(const pc_buf_t *b)
{
    const char *p = b->base, *end = b->base + b->len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL)
            return false;
        if (nl - p >= 6 && memcmp(p, "data: ", 6) == 0 &&
            !(nl - p == 12 && memcmp(p + 6, "[DONE]", 6) == 0) &&
            !valid_json(p + 6, (size_t)(nl - p - 6)))
            return false;
        p = nl + 1;
    }
    return true;
}

#define ASSERT_BUF(b, expected)                                                                    \
    do {                                                                                           \
        ASSERT_EQ(pc_buf_terminate(&(b)), 0);                                                      \
        ASSERT_STR_EQ((b).base, expected);                                                         \
    } while (0)

/* ---- Anthropic ------------------------------------------------------------------------------ */

PC_TEST(anthropic_message_bytes)
{
    pc_buf_t b = PC_BUF_INIT;
    ASSERT_EQ(gw_anthropic_message_render(anth_resp(), &b), 0);
    ASSERT_BUF(b, "{\"id\":\"msg_01XFDUDYJgAACzvnptvVoYEL\",\"type\":\"message\",\"role\":"
                  "\"assistant\",\"model\":\"claude-sonnet-4-6\",\"content\":[{\"type\":\"text\","
                  "\"text\":\"Hello!\"}],\"stop_reason\":\"end_turn\",\"stop_sequence\":null,"
                  "\"usage\":{\"input_tokens\":50,\"cache_creation_input_tokens\":248,"
                  "\"cache_read_input_tokens\":1800,\"cache_creation\":{"
                  "\"ephemeral_5m_input_tokens\":148,\"ephemeral_1h_input_tokens\":100},"
                  "\"output_tokens\":503,\"service_tier\":\"standard\"}}");
    /* Stop sequence; pre-warm (content [], max_tokens, no output). */
    gw_api_resp_t r = *anth_resp();
    r.stop_reason = GW_STOP_STOP_SEQUENCE;
    r.stop_sequence = PC_SLICE_LIT("\n\nHuman:");
    b.len = 0;
    ASSERT_EQ(gw_anthropic_message_render(&r, &b), 0);
    ASSERT_EQ(pc_buf_terminate(&b), 0);
    ASSERT_TRUE(strstr(b.base, "\"stop_reason\":\"stop_sequence\",\"stop_sequence\":"
                               "\"\\n\\nHuman:\"") != NULL);
    r = *anth_resp();
    r.prewarm = true;
    r.stop_reason = GW_STOP_MAX_TOKENS;
    r.usage = (gw_usage_t){3, 0, 4096, 0, 0};
    b.len = 0;
    ASSERT_EQ(gw_anthropic_message_render(&r, &b), 0);
    ASSERT_EQ(pc_buf_terminate(&b), 0);
    ASSERT_TRUE(strstr(b.base, "\"content\":[],\"stop_reason\":\"max_tokens\"") != NULL);
    ASSERT_TRUE(strstr(b.base, "\"output_tokens\":0,") != NULL);
    b.len = 0;
    ASSERT_EQ(gw_anthropic_count_tokens_render(1234, &b), 0);
    ASSERT_BUF(b, "{\"input_tokens\":1234}");
    pc_buf_free(&b);
}

PC_TEST(anthropic_sse_sequence)
{
    pc_buf_t b = PC_BUF_INIT;
    gw_anthropic_sse_t s;
    gw_api_resp_t r = *anth_resp();
    r.id = "msg_1";
    r.usage = (gw_usage_t){12, 4096, 0, 0, 0};
    gw_anthropic_sse_init(&s);
    ASSERT_EQ(gw_anthropic_sse_text(&s, "x", 1, &b), PC_ERR_STATE); /* before start */
    ASSERT_EQ(gw_anthropic_sse_start(&s, &r, &b), 0);
    ASSERT_EQ(gw_anthropic_sse_start(&s, &r, &b), PC_ERR_STATE);
    ASSERT_EQ(gw_anthropic_sse_text(&s, "Hi", 2, &b), 0);
    ASSERT_EQ(gw_anthropic_sse_text(&s, "", 0, &b), 0); /* nothing */
    ASSERT_EQ(gw_anthropic_sse_ping(&s, &b), 0);
    ASSERT_EQ(gw_anthropic_sse_text(&s, " \xF0\x9F\x98\x80", 5, &b), 0);
    r.usage.output_tokens = 6;
    ASSERT_EQ(gw_anthropic_sse_finish(&s, &r, &b), 0);
    ASSERT_EQ(gw_anthropic_sse_text(&s, "x", 1, &b), PC_ERR_STATE); /* after the end */
    ASSERT_EQ(gw_anthropic_sse_finish(&s, &r, &b), PC_ERR_STATE);
    ASSERT_TRUE(sse_payloads_valid(&b));
    ASSERT_BUF(
        b, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\","
           "\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-6\","
           "\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{"
           "\"input_tokens\":12,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":4096,"
           "\"cache_creation\":{\"ephemeral_5m_input_tokens\":0,\"ephemeral_1h_input_tokens\":0},"
           "\"output_tokens\":1,\"service_tier\":\"standard\"}}}\n\n"
           "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,"
           "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
           "event: ping\ndata: {\"type\":\"ping\"}\n\n"
           "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
           "\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n"
           "event: ping\ndata: {\"type\":\"ping\"}\n\n"
           "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
           "\"delta\":{\"type\":\"text_delta\",\"text\":\" \xF0\x9F\x98\x80\"}}\n\n"
           "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
           "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":"
           "\"end_turn\",\"stop_sequence\":null},\"usage\":{\"input_tokens\":12,"
           "\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":4096,"
           "\"output_tokens\":6}}\n\n"
           "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    pc_buf_free(&b);
}

PC_TEST(anthropic_sse_error_after_200)
{
    pc_buf_t b = PC_BUF_INIT;
    gw_anthropic_sse_t s;
    gw_api_error_t e;
    gw_api_error_set(&e, GW_API_ANTHROPIC_MESSAGES, 529, "Overloaded");
    gw_anthropic_sse_init(&s);
    ASSERT_EQ(gw_anthropic_sse_error(&s, &e, &b), PC_ERR_STATE); /* before the 200: a body */
    ASSERT_EQ(gw_anthropic_sse_start(&s, anth_resp(), &b), 0);
    ASSERT_EQ(gw_anthropic_sse_text(&s, "par", 3, &b), 0);
    size_t before = b.len;
    ASSERT_EQ(gw_anthropic_sse_error(&s, &e, &b), 0);
    ASSERT_EQ(gw_anthropic_sse_finish(&s, anth_resp(), &b), PC_ERR_STATE);
    ASSERT_EQ(pc_buf_terminate(&b), 0);
    ASSERT_STR_EQ(b.base + before, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":"
                                   "\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n");
    pc_buf_free(&b);
}

/* ---- OpenAI --------------------------------------------------------------------------------- */

PC_TEST(openai_completion_bytes)
{
    pc_buf_t b = PC_BUF_INIT;
    ASSERT_EQ(gw_openai_completion_render(oai_resp(), &b), 0);
    ASSERT_BUF(b,
               "{\"id\":\"chatcmpl-abc123\",\"object\":\"chat.completion\",\"created\":1761564674,"
               "\"model\":\"kvgw-demo\",\"choices\":[{\"index\":0,\"message\":{\"role\":"
               "\"assistant\",\"content\":\"Hi \\\"there\\\"\\n\",\"refusal\":null},"
               "\"logprobs\":null,\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":"
               "2006,\"completion_tokens\":300,\"total_tokens\":2306,\"prompt_tokens_details\":"
               "{\"cached_tokens\":1920,\"audio_tokens\":0},\"completion_tokens_details\":{"
               "\"reasoning_tokens\":0,\"audio_tokens\":0,\"accepted_prediction_tokens\":0,"
               "\"rejected_prediction_tokens\":0}},\"system_fingerprint\":null}");
    pc_buf_free(&b);
}

PC_TEST(openai_stream_bytes)
{
    pc_buf_t b = PC_BUF_INIT;
    gw_openai_sse_t s;
    gw_api_resp_t r = *oai_resp();
    r.stop_reason = GW_STOP_END_TURN;
    r.usage = (gw_usage_t){10, 0, 0, 0, 5};
    gw_openai_sse_init(&s, true);
    ASSERT_EQ(gw_openai_sse_start(&s, &r, &b), 0);
    ASSERT_EQ(gw_openai_sse_text(&s, &r, "Hel", 3, &b), 0);
    ASSERT_EQ(gw_openai_sse_text(&s, &r, "lo", 2, &b), 0);
    ASSERT_EQ(gw_openai_sse_finish(&s, &r, &b), 0);
    ASSERT_EQ(gw_openai_sse_text(&s, &r, "x", 1, &b), PC_ERR_STATE);
    ASSERT_TRUE(sse_payloads_valid(&b));
#define CH                                                                                         \
    "data: {\"id\":\"chatcmpl-abc123\",\"object\":\"chat.completion.chunk\",\"created\":"          \
    "1761564674,\"model\":\"kvgw-demo\",\"system_fingerprint\":null,\"choices\":"
    ASSERT_BUF(b,
               CH "[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\","
                  "\"refusal\":null},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}"
                  "\n\n" CH "[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"logprobs\":null,"
                  "\"finish_reason\":null}],\"usage\":null}\n\n" CH "[{\"index\":0,\"delta\":{"
                  "\"content\":\"lo\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}"
                  "\n\n" CH "[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":"
                  "\"stop\"}],\"usage\":null}\n\n" CH "[],\"usage\":{\"prompt_tokens\":10,"
                  "\"completion_tokens\":5,\"total_tokens\":15,\"prompt_tokens_details\":{"
                  "\"cached_tokens\":0,\"audio_tokens\":0},\"completion_tokens_details\":{"
                  "\"reasoning_tokens\":0,\"audio_tokens\":0,\"accepted_prediction_tokens\":0,"
                  "\"rejected_prediction_tokens\":0}}}\n\ndata: [DONE]\n\n");
    /* Without include_usage: no usage fields, no usage chunk. */
    b.len = 0;
    gw_openai_sse_init(&s, false);
    ASSERT_EQ(gw_openai_sse_start(&s, &r, &b), 0);
    ASSERT_EQ(gw_openai_sse_finish(&s, &r, &b), 0);
    ASSERT_BUF(b, CH "[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\","
                     "\"refusal\":null},\"logprobs\":null,\"finish_reason\":null}]}\n\n" CH
                     "[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}]}"
                     "\n\ndata: [DONE]\n\n");
#undef CH
    /* An error after the 200. */
    b.len = 0;
    gw_api_error_t e;
    gw_api_error_set(&e, GW_API_OPENAI_CHAT, 503, "The worker stopped answering.");
    gw_openai_sse_init(&s, false);
    ASSERT_EQ(gw_openai_sse_start(&s, &r, &b), 0);
    size_t before = b.len;
    ASSERT_EQ(gw_openai_sse_error(&s, &e, &b), 0);
    ASSERT_EQ(gw_openai_sse_finish(&s, &r, &b), PC_ERR_STATE);
    ASSERT_EQ(pc_buf_terminate(&b), 0);
    ASSERT_STR_EQ(b.base + before,
                  "data: {\"error\":{\"message\":\"The worker stopped answering.\","
                  "\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n");
    pc_buf_free(&b);
}

/* ---- errors ------------------------------------------------------------------------------ */

PC_TEST(error_bodies)
{
    pc_buf_t b = PC_BUF_INIT;
    gw_api_error_t e;
    gw_api_error_set(&e, GW_API_ANTHROPIC_MESSAGES, 400,
                     "A maximum of 4 blocks with cache_control may be provided. Found 5.");
    ASSERT_EQ(
        gw_api_error_render(GW_API_ANTHROPIC_MESSAGES, &e, "req_011CZ1ufEBB1WxzQ4yXpYpTU", &b), 0);
    ASSERT_BUF(b, "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":"
                  "\"A maximum of 4 blocks with cache_control may be provided. Found 5.\"},"
                  "\"request_id\":\"req_011CZ1ufEBB1WxzQ4yXpYpTU\"}");
    b.len = 0;
    ASSERT_EQ(gw_api_error_render(GW_API_ANTHROPIC_MESSAGES, &e, NULL, &b), 0);
    ASSERT_BUF(b, "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":"
                  "\"A maximum of 4 blocks with cache_control may be provided. Found 5.\"}}");
    /* OpenAI: param and code from a parse error. */
    pc_arena_t arena;
    gw_api_req_t *r = NULL;
    const char *body = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
                       "\"temperature\":3}";
    pc_arena_init(&arena, 0);
    ASSERT_EQ(gw_api_parse(GW_API_OPENAI_CHAT, body, strlen(body), &arena, &r, &e), PC_ERR_INVAL);
    pc_arena_close(&arena);
    b.len = 0;
    ASSERT_EQ(gw_api_error_render(GW_API_OPENAI_CHAT, &e, "ignored", &b), 0);
    ASSERT_BUF(b, "{\"error\":{\"message\":\"Invalid 'temperature': decimal above maximum value. "
                  "Expected a value <= 2, but got 3 instead.\",\"type\":\"invalid_request_error\","
                  "\"param\":\"temperature\",\"code\":\"decimal_above_max_value\"}}");
    gw_api_error_set(&e, GW_API_OPENAI_CHAT, 401, "Incorrect API key provided.");
    b.len = 0;
    ASSERT_EQ(gw_api_error_render(GW_API_OPENAI_CHAT, &e, NULL, &b), 0);
    ASSERT_BUF(b, "{\"error\":{\"message\":\"Incorrect API key provided.\",\"type\":"
                  "\"invalid_request_error\",\"param\":null,\"code\":null}}");
    pc_buf_free(&b);
}

/* ---- JSON strings ---------------------------------------------------------------------------- */

PC_TEST(json_string_escaping)
{
    pc_buf_t b = PC_BUF_INIT;
    static const struct {
        const char *in;
        size_t len;
        const char *out;
    } cases[] = {
        {"plain", 5, "\"plain\""},
        {"q\"b\\s/", 6, "\"q\\\"b\\\\s/\""},
        {"\n\r\t\b\f\x01\x1f", 7, "\"\\n\\r\\t\\b\\f\\u0001\\u001f\""},
        {"a\0b", 3, "\"a\\u0000b\""},
        {"\xC3\xA9\xE2\x80\xA8\xF0\x9F\x98\x80", 9, "\"\xC3\xA9\xE2\x80\xA8\xF0\x9F\x98\x80\""},
        /* invalid: lone continuation, truncated sequence, overlong, surrogate, > U+10FFFF */
        {"a\x80z", 3, "\"a\xEF\xBF\xBDz\""},
        {"\xE2\x82", 2, "\"\xEF\xBF\xBD\xEF\xBF\xBD\""},
        {"\xC0\xAF", 2, "\"\xEF\xBF\xBD\xEF\xBF\xBD\""},
        {"\xED\xA0\x80", 3, "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\""},
        {"\xF4\x90\x80\x80", 4, "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\""},
    };
    for (size_t i = 0; i < PC_ARRAY_LEN(cases); i++) {
        b.len = 0;
        ASSERT_EQ(pc_json_string(&b, cases[i].in, cases[i].len, PC_JSON_UTF8), 0);
        ASSERT_EQ(b.len, strlen(cases[i].out));
        ASSERT_MEM_EQ(b.base, cases[i].out, b.len);
        ASSERT_TRUE(valid_json(b.base, b.len));
    }
    /* Random bytes always give valid JSON that decodes back for valid input. */
    uint64_t rng = 99;
    char in[64];
    for (int it = 0; it < 20000; it++) {
        size_t n = (size_t)(it % 64);
        for (size_t i = 0; i < n; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            in[i] = (char)(rng >> 56);
        }
        b.len = 0;
        ASSERT_EQ(pc_json_string(&b, in, n, PC_JSON_UTF8), 0);
        json_t *v = json_loadb(b.base, b.len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        ASSERT_TRUE(v != NULL && json_is_string(v));
        json_decref(v);
    }
    pc_buf_free(&b);
}

/* ---- allocation failure: the buffer is left as it was ------------------------------------- */

PC_TEST(rollback_on_allocation_failure)
{
    for (int which = 0; which < 4; which++) {
        int rc = -1;
        for (pc_failalloc_at = 1; rc != 0 && pc_failalloc_at < 100; pc_failalloc_at++) {
            pc_buf_t b = PC_BUF_INIT;
            gw_anthropic_sse_t s;
            ASSERT_EQ(pc_buf_append_cstr(&b, "prefix"), 0); /* then every reserve grows */
            gw_anthropic_sse_init(&s);
            pc_failalloc_count = 0;
            pc_allocator_t prev = pc_set_allocator(&pc_failalloc);
            if (which == 0)
                rc = gw_anthropic_message_render(anth_resp(), &b);
            else if (which == 1)
                rc = gw_openai_completion_render(oai_resp(), &b);
            else if (which == 2)
                rc = gw_anthropic_sse_start(&s, anth_resp(), &b);
            else {
                gw_openai_sse_t o;
                gw_openai_sse_init(&o, true);
                o.state = 1; /* open */
                rc = gw_openai_sse_finish(&o, oai_resp(), &b);
            }
            pc_set_allocator(&prev);
            if (rc != 0) {
                ASSERT_EQ(rc, PC_ERR_NOMEM);
                ASSERT_EQ(b.len, 6);
                if (which == 2)
                    ASSERT_EQ(s.state, 0);
            }
            pc_buf_free(&b);
        }
        ASSERT_EQ(rc, 0);
    }
}

/* ---- shapes for the SDK check ---------------------------------------------------------------- */

static int write_file(const char *dir, const char *name, const pc_buf_t *b)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(b->base, 1, b->len, f) != b->len) {
        fprintf(stderr, "cannot write %s\n", path);
        if (f != NULL)
            fclose(f);
        return 1;
    }
    return fclose(f) != 0;
}

/* Writes the shapes sdk_shapes.mjs serves to the SDKs. */
static int write_shapes(const char *dir)
{
    pc_buf_t b = PC_BUF_INIT;
    int bad = 0;
    gw_api_error_t e;
    gw_anthropic_sse_t as;
    gw_openai_sse_t os;
    gw_api_resp_t r = *anth_resp();

    bad |= gw_anthropic_message_render(&r, &b) || write_file(dir, "anthropic_message.json", &b);
    b.len = 0;
    bad |=
        gw_anthropic_count_tokens_render(2098, &b) || write_file(dir, "anthropic_count.json", &b);
    b.len = 0;
    gw_anthropic_sse_init(&as);
    r.usage.output_tokens = 0;
    bad |= gw_anthropic_sse_start(&as, &r, &b) || gw_anthropic_sse_text(&as, "Hel", 3, &b) ||
           gw_anthropic_sse_ping(&as, &b) || gw_anthropic_sse_text(&as, "lo!", 3, &b);
    r.usage.output_tokens = 503;
    bad |= gw_anthropic_sse_finish(&as, &r, &b) || write_file(dir, "anthropic_stream.sse", &b);
    b.len = 0;
    gw_anthropic_sse_init(&as);
    gw_api_error_set(&e, GW_API_ANTHROPIC_MESSAGES, 529, "Overloaded");
    bad |= gw_anthropic_sse_start(&as, &r, &b) || gw_anthropic_sse_text(&as, "Hel", 3, &b) ||
           gw_anthropic_sse_error(&as, &e, &b) || write_file(dir, "anthropic_stream_error.sse", &b);
    b.len = 0;
    gw_api_error_set(&e, GW_API_ANTHROPIC_MESSAGES, 400,
                     "A maximum of 4 blocks with cache_control may be provided. Found 5.");
    bad |= gw_api_error_render(GW_API_ANTHROPIC_MESSAGES, &e, "req_0123", &b) ||
           write_file(dir, "anthropic_error_400.json", &b);

    const gw_api_resp_t *o = oai_resp();
    b.len = 0;
    bad |= gw_openai_completion_render(o, &b) || write_file(dir, "openai_completion.json", &b);
    b.len = 0;
    gw_openai_sse_init(&os, true);
    bad |= gw_openai_sse_start(&os, o, &b) || gw_openai_sse_text(&os, o, "Hel", 3, &b) ||
           gw_openai_sse_text(&os, o, "lo!", 3, &b) || gw_openai_sse_finish(&os, o, &b) ||
           write_file(dir, "openai_stream.sse", &b);
    b.len = 0;
    gw_openai_sse_init(&os, false);
    gw_api_error_set(&e, GW_API_OPENAI_CHAT, 503, "The worker stopped answering.");
    bad |= gw_openai_sse_start(&os, o, &b) || gw_openai_sse_text(&os, o, "Hel", 3, &b) ||
           gw_openai_sse_error(&os, &e, &b) || write_file(dir, "openai_stream_error.sse", &b);
    b.len = 0;
    gw_api_error_set(&e, GW_API_OPENAI_CHAT, 400,
                     "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, "
                     "but got 3 instead.");
    snprintf(e.param, sizeof e.param, "temperature");
    e.code = "decimal_above_max_value";
    bad |= gw_api_error_render(GW_API_OPENAI_CHAT, &e, NULL, &b) ||
           write_file(dir, "openai_error_400.json", &b);
    pc_buf_free(&b);
    return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--write") == 0)
        return write_shapes(argv[2]);
    return pc_test__main(argc, argv);
}
