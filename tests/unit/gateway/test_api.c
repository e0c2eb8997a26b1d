/*
 * test_api.c — tests gateway/api_chat.c and gateway/api_parse.c: request bodies in, validated
 * requests or errors (status, type, exact message, OpenAI param and code) out. The adapter
 * tests moved here from tests/unit/engine/test_render.c with the adapters.
 */
#include <jansson.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "api_internal.h"
#include "common.h"
#include "pc_failalloc.h"
#include "pc_test.h"

static char g_err[512];
static gw_api_error_t g_e;

/* Parses body as an Anthropic count_tokens request (no max_tokens needed) or an OpenAI chat
 * request; returns gw_api_parse's code and the chat in *out. */
static int adapt(bool openai, const char *body, pc_arena_t *arena, eng_chat_t **out)
{
    gw_api_req_t *r = NULL;
    g_err[0] = '\0';
    int rc = gw_api_parse(openai ? GW_API_OPENAI_CHAT : GW_API_ANTHROPIC_COUNT_TOKENS, body,
                          strlen(body), arena, &r, &g_e);
    if (rc == 0)
        *out = r->chat;
    else
        snprintf(g_err, sizeof g_err, "%s", g_e.message);
    return rc;
}

/* ---- Anthropic adapter ---------------------------------------------------------------- */

PC_TEST(anthropic_basic_merge_prefill)
{
    pc_arena_t arena;
    eng_chat_t *c = NULL;
    pc_arena_init(&arena, 0);
    int rc = adapt(false,
                   "{\"model\":\"m\",\"system\":[{\"type\":\"text\",\"text\":\"S1\"},"
                   "{\"type\":\"text\",\"text\":\"S2\",\"cache_control\":{\"type\":\"ephemeral\","
                   "\"ttl\":\"1h\"}}],"
                   "\"tools\":[{\"name\":\"get_w\",\"description\":\"d\",\"input_schema\":"
                   "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"}}},"
                   "\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"1h\"}}],"
                   "\"cache_control\":{\"type\":\"ephemeral\"},"
                   "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
                   "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"again\"}]},"
                   "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t1\","
                   "\"name\":\"get_w\",\"input\":{\"x\": 1.5}}]},"
                   "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":"
                   "\"t1\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\","
                   "\"text\":\"b\"}],\"is_error\":true}]},"
                   "{\"role\":\"assistant\",\"content\":\"The answer\"}]}",
                   &arena, &c);
    if (rc != 0)
        fprintf(stderr, "%s\n", g_err);
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(c->api, ENG_CHAT_API_ANTHROPIC);
    ASSERT_TRUE(pc_slice_eq_cstr(c->model, "m"));
    ASSERT_EQ(c->n_tools, 1);
    ASSERT_TRUE(
        pc_slice_eq_cstr(c->tools[0].input_schema,
                         "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"}}}"));
    ASSERT_EQ(c->tools[0].cache_ttl, ENG_CHAT_TTL_1H);
    ASSERT_EQ(c->n_system, 2);
    ASSERT_EQ(c->system[0].cache_ttl, ENG_CHAT_TTL_NONE);
    ASSERT_EQ(c->system[1].cache_ttl, ENG_CHAT_TTL_1H);
    ASSERT_EQ(c->auto_cache_ttl, ENG_CHAT_TTL_5M);
    ASSERT_EQ(c->n_messages, 4); /* the two user messages merge */
    ASSERT_EQ(c->messages[0].n_blocks, 2);
    ASSERT_EQ(c->messages[0].blocks[1].src_msg, 1);
    ASSERT_TRUE(pc_slice_eq_cstr(c->messages[0].blocks[1].text, "again"));
    ASSERT_EQ(c->messages[1].blocks[0].kind, ENG_CHAT_BLOCK_TOOL_USE);
    ASSERT_TRUE(pc_slice_eq_cstr(c->messages[1].blocks[0].input, "{\"x\":1.5}"));
    ASSERT_FALSE(c->messages[1].blocks[0].input_raw);
    ASSERT_EQ(c->messages[2].blocks[0].kind, ENG_CHAT_BLOCK_TOOL_RESULT);
    ASSERT_TRUE(pc_slice_eq_cstr(c->messages[2].blocks[0].text, "a\nb"));
    ASSERT_TRUE(c->messages[2].blocks[0].is_error);
    ASSERT_TRUE(c->prefill);
    ASSERT_EQ(eng_chat_n_blocks(c), 5);
    pc_arena_close(&arena);
}

typedef struct bad_case {
    const char *body;
    int code;
    const char *err;
} bad_case_t;

static void check_bad(bool openai, const bad_case_t *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        pc_arena_t arena;
        eng_chat_t *c = (eng_chat_t *)&arena; /* must stay untouched */
        pc_arena_init(&arena, 0);
        int rc = adapt(openai, cases[i].body, &arena, &c);
        pc_arena_close(&arena);
        if (rc != cases[i].code || strcmp(g_err, cases[i].err) != 0)
            fprintf(stderr, "  case %zu: %s\n", i, cases[i].body);
        ASSERT_EQ(rc, cases[i].code);
        ASSERT_STR_EQ(g_err, cases[i].err);
        ASSERT_TRUE(c == (eng_chat_t *)&arena);
    }
}

#define M "\"model\":\"kvgw-demo\","
#define U(content) "{\"role\":\"user\",\"content\":" content "}"

PC_TEST(anthropic_errors)
{
    static const bad_case_t cases[] = {
        {"[]", PC_ERR_INVAL, "request body: Input should be an object"},
        {"{\"messages\":[]}", PC_ERR_INVAL, "model: Field required"},
        {"{" M "\"messages\":[]}", PC_ERR_INVAL, "messages: at least one message is required"},
        {"{" M "\"messages\":{}}", PC_ERR_INVAL, "messages: Input should be a valid list"},
        {"{" M "\"messages\":[{\"role\":\"bot\",\"content\":\"x\"}]}", PC_ERR_INVAL,
         "messages.0.role: Input should be 'user' or 'assistant'"},
        {"{" M "\"messages\":[" U("[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"foo\"}]") "]}",
         PC_ERR_INVAL,
         "messages.0.content.1.type: Input tag 'foo' found using 'type' does not match any of "
         "the expected tags: 'text', 'image', 'tool_use', 'tool_result'"},
        {"{" M "\"messages\":[" U("[{\"type\":\"image\",\"source\":{}}]") "]}", PC_ERR_UNSUPPORTED,
         "messages.0.content.0: image content is not supported by model "
         "kvgw-demo"},
        {"{" M "\"messages\":[" U("[{\"type\":\"text\",\"text\":\"a\",\"cache_control\":{\"type"
                                  "\":\"ephemeral\",\"ttl\":\"2h\"}}]") "]}",
         PC_ERR_INVAL, "messages.0.content.0.cache_control.ttl: Input should be '5m' or '1h'"},
        {"{" M "\"messages\":[" U("[{\"type\":\"text\",\"text\":\"a\",\"cache_control\":{\"type"
                                  "\":\"persistent\"}}]") "]}",
         PC_ERR_INVAL, "messages.0.content.0.cache_control.type: Input should be 'ephemeral'"},
        {"{" M "\"messages\":[" U("[{\"type\":\"text\",\"text\":\"\"}]") "]}", PC_ERR_INVAL,
         "messages.0.content.0: text content blocks must be non-empty"},
        {"{" M "\"messages\":[" U("[{\"type\":\"text\",\"text\":\" \\n\"}]") "]}", PC_ERR_INVAL,
         "messages.0.content.0: text content blocks must contain non-whitespace text"},
        {"{" M "\"messages\":[" U("[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\","
                                  "\"input\":{}}]") "]}",
         PC_ERR_INVAL,
         "messages.0.content.0: tool_use blocks are only allowed in assistant "
         "messages"},
        {"{" M
         "\"messages\":[" U("\"q\"") ",{\"role\":\"assistant\",\"content\":[{\"type\":"
                                     "\"tool_use\",\"id\":\"a\",\"name\":\"f\",\"input\":[]}]}]}",
         PC_ERR_INVAL, "messages.1.content.0.input: Input should be a valid dictionary"},
        {"{" M "\"messages\":[" U("\"q\"") ",{\"role\":\"assistant\",\"content\":\"a \"}]}",
         PC_ERR_INVAL, "messages: final assistant content cannot end with trailing whitespace"},
        {"{" M "\"messages\":[" U("\"\"") "," U("\"x\"") "]}", PC_ERR_INVAL,
         "messages.0: all messages must have non-empty content except for the optional final "
         "assistant message"},
        {"{" M
         "\"tools\":[{\"name\":\"bad name\",\"input_schema\":{}}],\"messages\":[" U("\"q\"") "]}",
         PC_ERR_INVAL, "tools.0.name: String should match pattern '^[a-zA-Z0-9_-]{1,64}$'"},
        {"{" M "\"tools\":[{\"name\":\"f\"}],\"messages\":[" U("\"q\"") "]}", PC_ERR_INVAL,
         "tools.0.input_schema: Field required"},
        {"{" M "\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}],"
         "\"messages\":[" U("\"q\"") "]}",
         PC_ERR_UNSUPPORTED,
         "tools.0.type: tool type 'web_search_20250305' is not supported by "
         "model kvgw-demo (only custom tools are)"},
        {"{" M "\"system\":7,\"messages\":[" U("\"q\"") "]}", PC_ERR_INVAL,
         "system: Input should be a valid string or a list of text blocks"},
        {"{" M "\"system\":[{\"type\":\"image\"}],\"messages\":[" U("\"q\"") "]}", PC_ERR_INVAL,
         "system.0.type: Input should be 'text'"},
        {"{" M "\"messages\":[" U("[{\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"content\":"
                                  "[{\"type\":\"image\"}]}]") "]}",
         PC_ERR_UNSUPPORTED,
         "messages.0.content.0.content.0: image content is not supported by "
         "model kvgw-demo"},
        {"{" M
         "\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":5},\"messages\":[" U("\"q\"") "]}",
         PC_ERR_INVAL, "cache_control.ttl: Input should be '5m' or '1h'"},
    };
    PC_TEST_CALL(check_bad(false, cases, PC_ARRAY_LEN(cases)));
}

PC_TEST(anthropic_empty_prefill_dropped)
{
    pc_arena_t arena;
    eng_chat_t *c = NULL;
    pc_arena_init(&arena, 0);
    ASSERT_EQ(adapt(false,
                    "{" M "\"messages\":[" U("\"q\"") ",{\"role\":\"assistant\",\"content\":[]}]}",
                    &arena, &c),
              0);
    ASSERT_EQ(c->n_messages, 1);
    ASSERT_FALSE(c->prefill);
    pc_arena_close(&arena);
}

/* ---- OpenAI adapter ------------------------------------------------------------------- */

PC_TEST(openai_basic)
{
    pc_arena_t arena;
    eng_chat_t *c = NULL;
    pc_arena_init(&arena, 0);
    int rc = adapt(true,
                   "{\"model\":\"m\",\"messages\":["
                   "{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"D\"}]},"
                   "{\"role\":\"user\",\"content\":\"u\"},"
                   "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\","
                   "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
                   "\"{\\\"a\\\":1}\"}}]},"
                   "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"},"
                   "{\"role\":\"system\",\"content\":\"late\"},"
                   "{\"role\":\"assistant\",\"content\":\"done\"}],"
                   "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                   "\"parameters\":{\"type\":\"object\"}}}]}",
                   &arena, &c);
    if (rc != 0)
        fprintf(stderr, "%s\n", g_err);
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(c->api, ENG_CHAT_API_OPENAI);
    ASSERT_EQ(c->n_system, 1);
    ASSERT_TRUE(pc_slice_eq_cstr(c->system[0].text, "D"));
    ASSERT_EQ(c->n_messages, 5);
    ASSERT_EQ(c->messages[1].role, ENG_CHAT_ROLE_ASSISTANT);
    ASSERT_EQ(c->messages[1].n_blocks, 1);
    ASSERT_TRUE(c->messages[1].blocks[0].input_raw);
    ASSERT_TRUE(pc_slice_eq_cstr(c->messages[1].blocks[0].input, "{\"a\":1}"));
    ASSERT_EQ(c->messages[2].role, ENG_CHAT_ROLE_TOOL);
    ASSERT_TRUE(pc_slice_eq_cstr(c->messages[2].blocks[0].id, "c1"));
    ASSERT_EQ(c->messages[3].role, ENG_CHAT_ROLE_SYSTEM);
    ASSERT_FALSE(c->prefill);
    ASSERT_EQ(c->n_tools, 1);
    ASSERT_FALSE(c->tools[0].has_description);
    pc_arena_close(&arena);
}

PC_TEST(openai_errors)
{
    static const bad_case_t cases[] = {
        {"{" M "\"messages\":[{\"role\":\"function\",\"content\":\"x\"}]}", PC_ERR_INVAL,
         "messages.0.role: Invalid value 'function'; supported: 'system', 'developer', 'user', "
         "'assistant', 'tool'"},
        {"{" M "\"messages\":[" U("[{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]") "]}",
         PC_ERR_UNSUPPORTED,
         "messages.0.content.0: image_url content is not supported by model "
         "kvgw-demo"},
        {"{" M "\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\",\"function\":"
         "{\"name\":\"f\",\"arguments\":\"{oops\"}}]}]}",
         PC_ERR_INVAL,
         "messages.0.tool_calls.0.function.arguments: must be a JSON-encoded "
         "object"},
        {"{" M "\"messages\":[{\"role\":\"tool\",\"content\":\"r\"}]}", PC_ERR_INVAL,
         "messages.0.tool_call_id: Field required"},
        {"{" M "\"messages\":[{\"role\":\"assistant\"}]}", PC_ERR_INVAL,
         "messages.0: assistant messages need content or tool_calls"},
        {"{" M "\"messages\":[{\"role\":\"system\",\"content\":\"s\"}]}", PC_ERR_INVAL,
         "messages: at least one message besides the system message is required"},
        {"{" M "\"tools\":[{\"type\":\"code_interpreter\"}],\"messages\":[" U("\"q\"") "]}",
         PC_ERR_UNSUPPORTED,
         "tools.0.type: tool type 'code_interpreter' is not supported by "
         "model kvgw-demo"},
        {"{" M "\"messages\":[" U("7") "]}", PC_ERR_INVAL,
         "messages.0.content: Input should be a string or an array of content parts"},
    };
    PC_TEST_CALL(check_bad(true, cases, PC_ARRAY_LEN(cases)));
}

/* ---- request fields -------------------------------------------------------------------- */

typedef struct req_case {
    gw_api_kind_t kind;
    const char *body;
    int rc;
    int status;
    const char *type;
    const char *message;
    const char *param; /* OpenAI; NULL = not checked */
    const char *code;  /* OpenAI; NULL = null */
} req_case_t;

#define AM GW_API_ANTHROPIC_MESSAGES
#define AC GW_API_ANTHROPIC_COUNT_TOKENS
#define OC GW_API_OPENAI_CHAT
#define Q "\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]"
#define INV "invalid_request_error"

static void check_req_cases(const req_case_t *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const req_case_t *c = &cases[i];
        pc_arena_t arena;
        gw_api_req_t *r = (gw_api_req_t *)&arena; /* must stay untouched */
        pc_arena_init(&arena, 0);
        int rc = gw_api_parse(c->kind, c->body, strlen(c->body), &arena, &r, &g_e);
        pc_arena_close(&arena);
        if (rc != c->rc || strcmp(g_e.message, c->message) != 0)
            fprintf(stderr, "  case %zu: %s\n", i, c->body);
        ASSERT_EQ(rc, c->rc);
        ASSERT_STR_EQ(g_e.message, c->message);
        ASSERT_EQ(g_e.status, c->status);
        ASSERT_STR_EQ(g_e.type, c->type);
        ASSERT_TRUE(r == (gw_api_req_t *)&arena);
        if (c->kind == OC && c->param != NULL)
            ASSERT_STR_EQ(g_e.param, c->param);
        if (c->kind == OC && c->param != NULL)
            ASSERT_STR_EQ(g_e.code != NULL ? g_e.code : "(null)",
                          c->code != NULL ? c->code : "(null)");
    }
}

PC_TEST(anthropic_request_field_errors)
{
    static const req_case_t cases[] = {
        {AM, "{" M Q "}", PC_ERR_INVAL, 400, INV, "max_tokens: Field required", NULL, NULL},
        {AM, "{" M Q ",\"max_tokens\":\"5\"}", PC_ERR_INVAL, 400, INV,
         "max_tokens: Input should be a valid integer", NULL, NULL},
        {AM, "{" M Q ",\"max_tokens\":null}", PC_ERR_INVAL, 400, INV,
         "max_tokens: Input should be a valid integer", NULL, NULL},
        {AM, "{" M Q ",\"max_tokens\":1.5}", PC_ERR_INVAL, 400, INV,
         "max_tokens: Input should be a valid integer, got a number with a fractional part", NULL,
         NULL},
        {AM, "{" M Q ",\"max_tokens\":-1}", PC_ERR_INVAL, 400, INV,
         "max_tokens: Input should be greater than or equal to 0", NULL, NULL},
        {AM, "{" M Q ",\"max_tokens\":5,\"temperature\":1.5}", PC_ERR_INVAL, 400, INV,
         "temperature: Input should be less than or equal to 1", NULL, NULL},
        {AM, "{" M Q ",\"max_tokens\":5,\"temperature\":\"hot\"}", PC_ERR_INVAL, 400, INV,
         "temperature: Input should be a valid number", NULL, NULL},
        {AM, "{" M Q ",\"max_tokens\":5,\"top_p\":-0.5}", PC_ERR_INVAL, 400, INV,
         "top_p: Input should be greater than or equal to 0", NULL, NULL},
        {AM, "{" M Q ",\"max_tokens\":5,\"top_k\":-2}", PC_ERR_INVAL, 400, INV,
         "top_k: Input should be greater than or equal to 0", NULL, NULL},
        {AM, "{" M Q ",\"max_tokens\":5,\"stream\":\"yes\"}", PC_ERR_INVAL, 400, INV,
         "stream: Input should be a valid boolean", NULL, NULL},
        {AM, "{" M Q ",\"max_tokens\":5,\"stop_sequences\":\"x\"}", PC_ERR_INVAL, 400, INV,
         "stop_sequences: Input should be a valid list", NULL, NULL},
        {AM, "{" M Q ",\"max_tokens\":5,\"stop_sequences\":[\"a\",\"\"]}", PC_ERR_INVAL, 400, INV,
         "stop_sequences.1: stop sequences must be non-empty", NULL, NULL},
        {AM, "{" M Q ",\"max_tokens\":5,\"stop_sequences\":[1]}", PC_ERR_INVAL, 400, INV,
         "stop_sequences.0: Input should be a valid string", NULL, NULL},
        {AM, "{" M Q ",\"max_tokens\":5,\"metadata\":[]}", PC_ERR_INVAL, 400, INV,
         "metadata: Input should be a valid dictionary", NULL, NULL},
        {AM, "{" M Q ",\"max_tokens\":5,\"metadata\":{\"user_id\":3}}", PC_ERR_INVAL, 400, INV,
         "metadata.user_id: Input should be a valid string", NULL, NULL},
        {AM, "{" M Q ",\"max_tokens\":5,\"tool_choice\":{\"type\":\"some\"}}", PC_ERR_INVAL, 400,
         INV,
         "tool_choice.type: Input tag 'some' found using 'type' does not match any of the "
         "expected tags: 'auto', 'any', 'tool', 'none'",
         NULL, NULL},
        {AM, "{" M Q ",\"max_tokens\":5,\"tool_choice\":{\"type\":\"any\"}}", PC_ERR_INVAL, 400,
         INV, "tool_choice may only be specified while providing tools.", NULL, NULL},
        {AM,
         "{" M Q ",\"max_tokens\":5,\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],"
         "\"tool_choice\":{\"type\":\"tool\",\"name\":\"g\"}}",
         PC_ERR_INVAL, 400, INV, "tool_choice.name: tool 'g' is not one of the request's tools",
         NULL, NULL},
        {AM, "{" M Q ",\"max_tokens\":0,\"stream\":true}", PC_ERR_INVAL, 400, INV,
         "max_tokens: 0 (cache pre-warming) cannot be combined with stream: true", NULL, NULL},
        {AM,
         "{" M Q ",\"max_tokens\":0,\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],"
         "\"tool_choice\":{\"type\":\"any\"}}",
         PC_ERR_INVAL, 400, INV,
         "max_tokens: 0 (cache pre-warming) cannot be combined with tool_choice type 'any'", NULL,
         NULL},
        {AM, "{" M Q ",\"max_tokens\":0,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":9}}",
         PC_ERR_INVAL, 400, INV,
         "max_tokens: 0 (cache pre-warming) cannot be combined with thinking", NULL, NULL},
        {AM, "{" M Q ",\"max_tokens\":5,\"cache_salt\":\"\"}", PC_ERR_INVAL, 400, INV,
         "cache_salt: must be a string of 1 to 256 bytes without control characters", NULL, NULL},
        {AM, "{" M Q ",\"max_tokens\":5,\"cache_salt\":\"a\\nb\"}", PC_ERR_INVAL, 400, INV,
         "cache_salt: must be a string of 1 to 256 bytes without control characters", NULL, NULL},
        {AM, "{" M Q ",\"max_tokens\":5,\"cache_salt\":7}", PC_ERR_INVAL, 400, INV,
         "cache_salt: Input should be a valid string", NULL, NULL},
        /* Malformed JSON, Anthropic's wording with jansson's reason and position. */
        {AM, "{\"model\": ", PC_ERR_INVAL, 400, INV,
         "The request body is not valid JSON: unexpected token near end of file: line 1 column 10 "
         "(char 10)",
         NULL, NULL},
        {AM, "{\"model\":\"\xff\"}", PC_ERR_INVAL, 400, INV,
         "The request body is not valid JSON: unable to decode byte 0xff near '\"': line 1 column "
         "10 (char 10)",
         NULL, NULL},
        {AM, "", PC_ERR_INVAL, 400, INV,
         "The request body is not valid JSON: '[' or '{' expected near end of file: line 1 column "
         "0 (char 0)",
         NULL, NULL},
        {AM, "[1]", PC_ERR_INVAL, 400, INV, "request body: Input should be an object", NULL, NULL},
        /* count_tokens ignores generation fields */
    };
    PC_TEST_CALL(check_req_cases(cases, PC_ARRAY_LEN(cases)));
}

PC_TEST(openai_request_field_errors)
{
    static const char *hint =
        "We could not parse the JSON body of your request. (HINT: This likely means you aren't "
        "using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was "
        "sent was not valid JSON. If you have trouble figuring out how to fix this, please "
        "contact us through our help center at help.openai.com.)";
    const req_case_t cases[] = {
        {OC, "{\"model\":", PC_ERR_INVAL, 400, INV, hint, "", NULL},
        {OC, "{" Q "}", PC_ERR_INVAL, 400, INV, "Missing required parameter: 'model'.", "model",
         "missing_required_parameter"},
        {OC, "{\"model\":5," Q "}", PC_ERR_INVAL, 400, INV,
         "Invalid type for 'model': expected a string, but got an integer instead.", "model",
         "invalid_type"},
        {OC, "{" M "\"messages\":\"hi\"}", PC_ERR_INVAL, 400, INV,
         "Invalid type for 'messages': expected an array, but got a string instead.", "messages",
         "invalid_type"},
        {OC, "{" M "\"messages\":[]}", PC_ERR_INVAL, 400, INV,
         "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an "
         "empty array instead.",
         "messages", "empty_array"},
        {OC, "{" M "\"messages\":[{\"role\":\"bot\",\"content\":\"x\"}]}", PC_ERR_INVAL, 400, INV,
         "messages.0.role: Invalid value 'bot'; supported: 'system', 'developer', 'user', "
         "'assistant', 'tool'",
         "messages[0].role", "invalid_value"},
        {OC, "{" M Q ",\"temperature\":3}", PC_ERR_INVAL, 400, INV,
         "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 3 "
         "instead.",
         "temperature", "decimal_above_max_value"},
        {OC, "{" M Q ",\"temperature\":\"x\"}", PC_ERR_INVAL, 400, INV,
         "Invalid type for 'temperature': expected a decimal, but got a string instead.",
         "temperature", "invalid_type"},
        {OC, "{" M Q ",\"max_tokens\":0}", PC_ERR_INVAL, 400, INV,
         "Invalid 'max_tokens': integer below minimum value. Expected a value >= 1, but got 0 "
         "instead.",
         "max_tokens", "integer_below_min_value"},
        {OC, "{" M Q ",\"n\":2}", PC_ERR_UNSUPPORTED, 400, INV,
         "Invalid 'n': kvgw serves one choice per request (n = 1), got 2.", "n", "invalid_value"},
        {OC, "{" M Q ",\"n\":0}", PC_ERR_INVAL, 400, INV,
         "Invalid 'n': integer below minimum value. Expected a value >= 1, but got 0 instead.", "n",
         "integer_below_min_value"},
        {OC, "{" M Q ",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", PC_ERR_INVAL, 400, INV,
         "Invalid 'stop': array too long. Expected an array with maximum length 4, but got an "
         "array with length 5 instead.",
         "stop", "array_above_max_length"},
        {OC, "{" M Q ",\"stop\":7}", PC_ERR_INVAL, 400, INV,
         "Invalid type for 'stop': expected a string or an array, but got an integer instead.",
         "stop", "invalid_type"},
        {OC, "{" M Q ",\"stream_options\":{\"include_usage\":true}}", PC_ERR_INVAL, 400, INV,
         "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
         "stream_options", "invalid_value"},
        {OC, "{" M Q ",\"tool_choice\":\"required\"}", PC_ERR_INVAL, 400, INV,
         "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are "
         "specified.",
         "tool_choice", NULL},
        {OC, "{" M Q ",\"tool_choice\":\"sometimes\"}", PC_ERR_INVAL, 400, INV,
         "Invalid value: 'sometimes'. Supported values are: 'none', 'auto', and 'required'.",
         "tool_choice", "invalid_value"},
        {OC, "{" M Q ",\"seed\":1.5}", PC_ERR_INVAL, 400, INV,
         "Invalid type for 'seed': expected an integer, but got a decimal instead.", "seed",
         "invalid_type"},
        {OC, "{" M Q ",\"user\":[]}", PC_ERR_INVAL, 400, INV,
         "Invalid type for 'user': expected a string, but got an array instead.", "user",
         "invalid_type"},
        {OC, "{" M Q ",\"cache_salt\":\"\"}", PC_ERR_INVAL, 400, INV,
         "cache_salt: must be a string of 1 to 256 bytes without control characters", "cache_salt",
         "invalid_value"},
    };
    PC_TEST_CALL(check_req_cases(cases, PC_ARRAY_LEN(cases)));
}

PC_TEST(anthropic_request_fields)
{
    pc_arena_t arena;
    gw_api_req_t *r = NULL;
    pc_arena_init(&arena, 0);
    const char *body =
        "{" M Q ",\"max_tokens\":1024.0,\"stream\":true,\"temperature\":0.25,\"top_p\":0.5,"
        "\"top_k\":40,\"stop_sequences\":[\"END\",\"\\n\\nHuman:\"],\"metadata\":{\"user_id\":"
        "\"u-1\"},\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],\"tool_choice\":{\"type\":"
        "\"tool\",\"name\":\"f\",\"disable_parallel_tool_use\":true},\"cache_salt\":\"team-a\","
        "\"thinking\":null,\"unknown_future_field\":{\"x\":1}}";
    ASSERT_EQ(gw_api_parse(AM, body, strlen(body), &arena, &r, &g_e), 0);
    ASSERT_EQ(r->kind, AM);
    ASSERT_TRUE(pc_slice_eq_cstr(r->model, "kvgw-demo"));
    ASSERT_EQ(r->max_tokens, 1024);
    ASSERT_TRUE(r->has_max_tokens);
    ASSERT_TRUE(r->stream);
    ASSERT_NEAR(r->sampling.temperature, 0.25, 1e-7);
    ASSERT_NEAR(r->sampling.top_p, 0.5, 1e-7);
    ASSERT_EQ(r->sampling.top_k, 40);
    ASSERT_TRUE(r->has_temperature && r->has_top_p && r->has_top_k && !r->has_seed);
    ASSERT_EQ(r->n_stop, 2);
    ASSERT_TRUE(pc_slice_eq_cstr(r->stop[1], "\n\nHuman:"));
    ASSERT_TRUE(pc_slice_eq_cstr(r->user_id, "u-1"));
    ASSERT_EQ(r->tool_choice, GW_TOOL_CHOICE_TOOL);
    ASSERT_TRUE(pc_slice_eq_cstr(r->tool_choice_name, "f"));
    ASSERT_TRUE(r->disable_parallel_tool_use);
    ASSERT_TRUE(r->has_cache_salt);
    ASSERT_TRUE(pc_slice_eq_cstr(r->cache_salt, "team-a"));
    pc_arena_clear(&arena);

    /* Defaults; pre-warm; count_tokens needs no max_tokens and ignores generation fields. */
    body = "{" M Q ",\"max_tokens\":0}";
    ASSERT_EQ(gw_api_parse(AM, body, strlen(body), &arena, &r, &g_e), 0);
    ASSERT_EQ(r->max_tokens, 0);
    ASSERT_FALSE(r->stream);
    ASSERT_NEAR(r->sampling.temperature, 1.0, 0);
    ASSERT_NEAR(r->sampling.top_p, 1.0, 0);
    ASSERT_EQ(r->sampling.top_k, 0);
    ASSERT_EQ(r->n_stop, 0);
    ASSERT_EQ(r->tool_choice, GW_TOOL_CHOICE_DEFAULT);
    ASSERT_FALSE(r->has_cache_salt);
    body = "{" M Q ",\"max_tokens\":\"ignored\",\"stream\":7}";
    ASSERT_EQ(gw_api_parse(AC, body, strlen(body), &arena, &r, &g_e), 0);
    ASSERT_FALSE(r->has_max_tokens);
    ASSERT_NEAR(r->sampling.temperature, 1.0, 0); /* defaults even without sampling fields */
    ASSERT_NEAR(r->sampling.top_p, 1.0, 0);
    /* top_p 0 keeps only the most likely token. */
    body = "{" M Q ",\"max_tokens\":3,\"top_p\":0}";
    ASSERT_EQ(gw_api_parse(AM, body, strlen(body), &arena, &r, &g_e), 0);
    ASSERT_EQ(r->sampling.top_k, 1);
    pc_arena_close(&arena);
}

PC_TEST(openai_request_fields)
{
    pc_arena_t arena;
    gw_api_req_t *r = NULL;
    pc_arena_init(&arena, 0);
    const char *body =
        "{" M Q ",\"max_tokens\":50,\"max_completion_tokens\":20,\"n\":1,\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true},\"temperature\":1.5,\"top_p\":0.9,"
        "\"seed\":-3,\"stop\":\"###\",\"user\":\"u\",\"prompt_cache_key\":\"k1\","
        "\"parallel_tool_calls\":false,\"tools\":[{\"type\":\"function\",\"function\":"
        "{\"name\":\"f\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
        "\"cache_salt\":\"s\"}";
    ASSERT_EQ(gw_api_parse(OC, body, strlen(body), &arena, &r, &g_e), 0);
    ASSERT_EQ(r->max_tokens, 20); /* max_completion_tokens wins */
    ASSERT_TRUE(r->stream && r->include_usage);
    ASSERT_NEAR(r->sampling.temperature, 1.5, 1e-7);
    ASSERT_TRUE(r->has_seed);
    ASSERT_EQ_U64(r->sampling.seed, (uint64_t)-3);
    ASSERT_EQ(r->n_stop, 1);
    ASSERT_TRUE(pc_slice_eq_cstr(r->stop[0], "###"));
    ASSERT_TRUE(pc_slice_eq_cstr(r->user_id, "u"));
    ASSERT_TRUE(pc_slice_eq_cstr(r->prompt_cache_key, "k1"));
    ASSERT_EQ(r->tool_choice, GW_TOOL_CHOICE_TOOL);
    ASSERT_TRUE(r->disable_parallel_tool_use);
    ASSERT_TRUE(pc_slice_eq_cstr(r->cache_salt, "s"));
    ASSERT_EQ(r->chat->auto_cache_ttl, ENG_CHAT_TTL_NONE);
    pc_arena_clear(&arena);
    body = "{" M Q "}";
    ASSERT_EQ(gw_api_parse(OC, body, strlen(body), &arena, &r, &g_e), 0);
    ASSERT_FALSE(r->has_max_tokens);
    ASSERT_FALSE(r->stream || r->include_usage);
    pc_arena_close(&arena);
}

/* ---- cache_control rules --------------------------------------------------------------- */

#define CC5 ",\"cache_control\":{\"type\":\"ephemeral\"}"
#define CC1H ",\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"1h\"}"
#define TXT(t, cc) "{\"type\":\"text\",\"text\":\"" t "\"" cc "}"

PC_TEST(cache_control_rules)
{
    static const req_case_t cases[] = {
        /* Five explicit breakpoints. */
        {AM,
         "{" M "\"max_tokens\":5,\"system\":[" TXT("a", CC5) "," TXT(
             "b", CC5) "],\"messages\":["
                       "{\"role\":\"user\",\"content\":[" TXT("c", CC5) "," TXT("d", CC5) "," TXT(
                           "e", CC5) "]}]}",
         PC_ERR_INVAL, 400, INV,
         "A maximum of 4 blocks with cache_control may be provided. Found 5.", NULL, NULL},
        /* Four explicit + the automatic one on a block without a marker. */
        {AM,
         "{" M "\"max_tokens\":5,\"cache_control\":{\"type\":\"ephemeral\"},\"system\":[" TXT(
             "a", CC5) "," TXT("b", CC5) "],\"messages\":[{\"role\":\"user\",\"content\":"
                                         "[" TXT("c", CC5) "," TXT("d", CC5) "," TXT("e",
                                                                                     "") "]}]}",
         PC_ERR_INVAL, 400, INV,
         "A maximum of 4 blocks with cache_control may be provided. Found 5.", NULL, NULL},
        /* Empty text block with cache_control: Anthropic's exact text, in system and messages.
         */
        {AM,
         "{" M "\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},"
         "{\"role\":\"assistant\",\"content\":\"y\"},{\"role\":\"user\",\"content\":[" TXT(
             "z", "") "," TXT("", CC5) "]}]}",
         PC_ERR_INVAL, 400, INV,
         "messages.2.content.1.text: cache_control cannot be set for empty text blocks", NULL,
         NULL},
        {AM, "{" M "\"max_tokens\":5,\"system\":[" TXT("", CC1H) "]," Q "}", PC_ERR_INVAL, 400, INV,
         "system.0.text: cache_control cannot be set for empty text blocks", NULL, NULL},
        /* 1h after 5m (tools -> system -> messages order). */
        {AM,
         "{" M "\"max_tokens\":5,\"tools\":[{\"name\":\"f\",\"input_schema\":{}" CC5 "}],"
         "\"system\":[" TXT("s", CC1H) "]," Q "}",
         PC_ERR_INVAL, 400, INV,
         "system.0.cache_control: a cache_control with ttl '1h' cannot come after one with ttl "
         "'5m' (tools.0.cache_control); longer TTLs must come first in the order tools, "
         "system, "
         "messages",
         NULL, NULL},
        /* The automatic one counts in the order too. */
        {AM,
         "{" M "\"max_tokens\":5,\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"1h\"},"
         "\"system\":[" TXT("s", CC5) "]," Q "}",
         PC_ERR_INVAL, 400, INV,
         "cache_control (automatic, on messages.0.content.0): a cache_control with ttl '1h' "
         "cannot "
         "come after one with ttl '5m' (system.0.cache_control); longer TTLs must come first "
         "in "
         "the order tools, system, messages",
         NULL, NULL},
        /* Automatic vs explicit TTL on the last block. */
        {AM,
         "{" M "\"max_tokens\":5,\"cache_control\":{\"type\":\"ephemeral\"},\"messages\":["
         "{\"role\":\"user\",\"content\":[" TXT("a", "") "," TXT("b", CC1H) "]}]}",
         PC_ERR_INVAL, 400, INV,
         "cache_control: the top-level (automatic) cache_control has ttl '5m' but the last "
         "block, "
         "messages.0.content.1, where it applies, has cache_control with ttl '1h'; use the "
         "same "
         "ttl or remove one of them",
         NULL, NULL},
        {AM, "{" M "\"max_tokens\":5," Q ",\"cache_control\":{\"type\":\"persistent\"}}",
         PC_ERR_INVAL, 400, INV, "cache_control.type: Input should be 'ephemeral'", NULL, NULL},
        {AM, "{" M "\"max_tokens\":5," Q ",\"cache_control\":{}}", PC_ERR_INVAL, 400, INV,
         "cache_control.type: Field required", NULL, NULL},
        {AM, "{" M "\"max_tokens\":5," Q ",\"cache_control\":\"on\"}", PC_ERR_INVAL, 400, INV,
         "cache_control: Input should be an object, not a string", NULL, NULL},
    };
    PC_TEST_CALL(check_req_cases(cases, PC_ARRAY_LEN(cases)));
}

static int parse_ok(gw_api_kind_t k, const char *body, pc_arena_t *a, gw_api_req_t **r)
{
    int rc = gw_api_parse(k, body, strlen(body), a, r, &g_e);
    if (rc != 0)
        fprintf(stderr, "  unexpected error: %s\n", g_e.message);
    return rc;
}

PC_TEST(cache_control_accepted)
{
    pc_arena_t arena;
    gw_api_req_t *r = NULL;
    pc_arena_init(&arena, 0);
    /* Four explicit (1h first) + automatic merging into the last block's same TTL: no 5th. */
    ASSERT_EQ(parse_ok(AM,
                       "{" M "\"max_tokens\":5,\"cache_control\":{\"type\":\"ephemeral\"},"
                       "\"tools\":[{\"name\":\"f\",\"input_schema\":{}" CC1H "}],"
                       "\"system\":[" TXT("s", CC1H) "],\"messages\":[{\"role\":\"user\","
                                                     "\"content\":[" TXT("a", CC5) "," TXT(
                                                         "b", CC5) "]}]}",
                       &arena, &r),
              0);
    ASSERT_EQ(r->chat->auto_cache_ttl, ENG_CHAT_TTL_5M);
    /* cache_control null = none, ttl null = 5m; both on count_tokens too. */
    ASSERT_EQ(parse_ok(AC,
                       "{" M "\"cache_control\":null,\"system\":[{\"type\":\"text\",\"text\":\"s\","
                       "\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":null}}]," Q "}",
                       &arena, &r),
              0);
    ASSERT_EQ(r->chat->system[0].cache_ttl, ENG_CHAT_TTL_5M);
    ASSERT_EQ(r->chat->auto_cache_ttl, ENG_CHAT_TTL_NONE);
    /* Automatic 1h after explicit 1h; and on a plain-string message. */
    ASSERT_EQ(parse_ok(AM,
                       "{" M "\"max_tokens\":5,\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":"
                       "\"1h\"},\"system\":[" TXT("s", CC1H) "]," Q "}",
                       &arena, &r),
              0);
    /* Empty text without cache_control is still the ordinary error. */
    ASSERT_EQ(gw_api_parse(AM,
                           "{" M
                           "\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[" TXT(
                               "", "") "]}]}",
                           strlen("{" M "\"max_tokens\":5,\"messages\":[{\"role\":\"user\","
                                  "\"content\":[" TXT("", "") "]}]}"),
                           &arena, &r, &g_e),
              PC_ERR_INVAL);
    ASSERT_STR_EQ(g_e.message, "messages.0.content.0: text content blocks must be non-empty");
    pc_arena_close(&arena);
}

/* ---- helpers ---------------------------------------------------------------------------- */

PC_TEST(openai_param_paths)
{
    char p[64];
    gw__openai_param("messages.0.content.12.text: x", p, sizeof p);
    ASSERT_STR_EQ(p, "messages[0].content[12].text");
    gw__openai_param("tools.3.function.name: String should match", p, sizeof p);
    ASSERT_STR_EQ(p, "tools[3].function.name");
    gw__openai_param("request body: Input should be an object", p, sizeof p);
    ASSERT_STR_EQ(p, "");
    gw__openai_param("no path here", p, sizeof p);
    ASSERT_STR_EQ(p, "");
    gw__openai_param("messages.0.content.12.text: x", p, 12);
    ASSERT_TRUE(strlen(p) < 12);
}

PC_TEST(error_types)
{
    ASSERT_STR_EQ(gw_api_error_type(AM, 400), "invalid_request_error");
    ASSERT_STR_EQ(gw_api_error_type(AM, 401), "authentication_error");
    ASSERT_STR_EQ(gw_api_error_type(AM, 403), "permission_error");
    ASSERT_STR_EQ(gw_api_error_type(AM, 404), "not_found_error");
    ASSERT_STR_EQ(gw_api_error_type(AM, 413), "request_too_large");
    ASSERT_STR_EQ(gw_api_error_type(AM, 429), "rate_limit_error");
    ASSERT_STR_EQ(gw_api_error_type(AM, 500), "api_error");
    ASSERT_STR_EQ(gw_api_error_type(AM, 529), "overloaded_error");
    ASSERT_STR_EQ(gw_api_error_type(AM, 504), "timeout_error");
    ASSERT_STR_EQ(gw_api_error_type(OC, 401), "invalid_request_error");
    ASSERT_STR_EQ(gw_api_error_type(OC, 429), "rate_limit_error");
    ASSERT_STR_EQ(gw_api_error_type(OC, 503), "server_error");
    gw_api_error_t e;
    gw_api_error_set(&e, AC, 404, "model: %s not found", "x");
    ASSERT_EQ(e.status, 404);
    ASSERT_STR_EQ(e.type, "not_found_error");
    ASSERT_STR_EQ(e.message, "model: x not found");
    ASSERT_STR_EQ(e.param, "");
    ASSERT_TRUE(e.code == NULL);
}

/* ---- memory a body can cost ----------------------------------------------------------------- */

/* A counting allocator: bytes held (malloc_usable_size) and their peak. Installed both as the
 * project's hooks and, when jansson still has its own allocator, as jansson's: it sees the
 * whole JSON tree either way. */
static size_t g_live, g_peak;
static void count_add(void *p)
{
    if (p != NULL && (g_live += malloc_usable_size(p)) > g_peak)
        g_peak = g_live;
}
static void *count_malloc(size_t n)
{
    void *p = malloc(n);
    count_add(p);
    return p;
}
static void *count_calloc(size_t c, size_t n)
{
    void *p = calloc(c, n);
    count_add(p);
    return p;
}
static void *count_realloc(void *p, size_t n)
{
    size_t old = p != NULL ? malloc_usable_size(p) : 0;
    void *q = realloc(p, n);
    if (q != NULL) {
        g_live -= old;
        count_add(q);
    }
    return q;
}
static void count_free(void *p)
{
    if (p != NULL)
        g_live -= malloc_usable_size(p);
    free(p);
}

/* body = prefix + 2.5M "{}," (7.5 MB) + suffix. */
static char *empties_body(const char *prefix, const char *suffix, size_t *len)
{
    pc_buf_t b = PC_BUF_INIT;
    size_t n = 2500000;
    pc_buf_append_cstr(&b, prefix);
    char *w = pc_buf_reserve(&b, 3 * n);
    for (size_t i = 0; i < n; i++)
        memcpy(w + 3 * i, i + 1 < n ? "{}," : "{} ", 3);
    pc_buf_commit(&b, 3 * n);
    pc_buf_append_cstr(&b, suffix);
    *len = b.len;
    return b.base;
}

/* Parses body under the counting allocator; returns the peak of bytes held during the call
 * (the arena included). */
static size_t parse_peak(gw_api_kind_t kind, const char *body, size_t len, int *rc)
{
    static const pc_allocator_t counting = {count_malloc, count_calloc, count_realloc, count_free};
    pc_arena_t arena;
    gw_api_req_t *r = NULL;
    json_malloc_t jm;
    json_free_t jf;
    json_get_alloc_funcs(&jm, &jf);
    if (jm == malloc) /* jansson on its own: count it too (gw_api_parse installs its hooks) */
        json_set_alloc_funcs(count_malloc, count_free);
    pc_allocator_t prev = pc_set_allocator(&counting);
    g_live = g_peak = 0;
    pc_arena_init(&arena, 0);
    *rc = gw_api_parse(kind, body, len, &arena, &r, &g_e);
    pc_arena_close(&arena);
    pc_set_allocator(&prev);
    return g_peak;
}

/* Issue 19 item 4: 7.5 MB of [{},{},...] in a field kvgw ignores cost 560 MB of jansson tree
 * (75 times the body). Skipped unbuilt now: the parse holds at most k = 1 times the body. */
PC_TEST(ignored_field_is_not_built)
{
    size_t len;
    char *body = empties_body("{" M "\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":"
                              "\"hi\"}],\"junk\":[",
                              "]}", &len);
    for (int k = 0; k < 2; k++) {
        int rc;
        size_t peak = parse_peak(k == 0 ? AM : OC, body, len, &rc);
        printf("%s: a %.1f MB body of [{},{},...] in an ignored field: parse peak %zu bytes "
               "(%.3f x the body)\n",
               k == 0 ? "anthropic" : "openai", (double)len / 1e6, peak,
               (double)peak / (double)len);
        ASSERT_EQ(rc, 0);
        ASSERT_TRUE(peak <= len); /* k = 1 */
    }
    pc_free(body);
}

/* The same elements inside a field kvgw reads (unknown keys inside known objects are built):
 * over GW_API_JSON_MEM_PER_BYTE, the API's 413 in its own shape. */
PC_TEST(json_over_memory_budget_is_413)
{
    size_t len;
    char *body = empties_body("{" M "\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":"
                              "\"hi\",\"junk\":[",
                              "]}]}", &len);
    for (int k = 0; k < 2; k++) {
        int rc;
        size_t peak = parse_peak(k == 0 ? AM : OC, body, len, &rc);
        printf("%s: the same inside a message: %d, parse peak %zu bytes (%.2f x the body)\n",
               k == 0 ? "anthropic" : "openai", g_e.status, peak, (double)peak / (double)len);
        ASSERT_EQ(rc, PC_ERR_NOSPACE);
        ASSERT_EQ(g_e.status, 413);
        ASSERT_TRUE(peak <= GW_API_JSON_MEM_BASE + (size_t)GW_API_JSON_MEM_PER_BYTE * len);
        pc_buf_t out = PC_BUF_INIT;
        ASSERT_EQ(gw_api_error_render(k == 0 ? AM : OC, &g_e, "req_1", &out), 0);
        ASSERT_EQ(pc_buf_terminate(&out), 0);
        ASSERT_TRUE(strstr(out.base, k == 0
                                         ? "{\"type\":\"error\",\"error\":{\"type\":"
                                           "\"request_too_large\",\"message\":\"request body: "
                                         : "{\"error\":{\"message\":\"request body: ") == out.base);
        pc_buf_free(&out);
    }
    pc_free(body);
    /* An ignored field whose skipping jansson must decide (an escaped key inside) is built by
     * jansson, under the same budget. */
    body = empties_body("{" M "\"max_tokens\":5," Q ",\"junk\":{\"\\u0061\":[", "]}}", &len);
    int rc;
    parse_peak(AM, body, len, &rc);
    ASSERT_EQ(rc, PC_ERR_NOSPACE);
    pc_free(body);
    /* Ordinary bodies are far below it; the ignored fields still read as absent. */
    const char *ok = "{" M "\"max_tokens\":5," Q ",\"junk\":{\"a\":[1,{\"b\":null}]},\"x\":\"y\"}";
    parse_peak(AM, ok, strlen(ok), &rc);
    ASSERT_EQ(rc, 0);
    /* A duplicate key inside an ignored field is still refused, with jansson's text. */
    const char *dup = "{" M "\"max_tokens\":5," Q ",\"junk\":{\"a\":1,\"a\":2}}";
    pc_arena_t arena;
    gw_api_req_t *r = NULL;
    pc_arena_init(&arena, 0);
    ASSERT_EQ(gw_api_parse(AM, dup, strlen(dup), &arena, &r, &g_e), PC_ERR_INVAL);
    ASSERT_TRUE(strstr(g_e.message, "duplicate object key") != NULL);
    pc_arena_close(&arena);
}

/* ---- allocation failure -------------------------------------------------------------------- */

PC_TEST(allocation_failures_are_clean)
{
    static const char *const bodies[] = {
        "{" M "\"max_tokens\":5,\"stop_sequences\":[\"a\",\"b\"],\"metadata\":{\"user_id\":\"u\"},"
        "\"cache_salt\":\"s\",\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],"
        "\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"},\"system\":\"S\",\"messages\":["
        "{\"role\":\"user\",\"content\":[" TXT(
            "hi",
            CC5) "]},{\"role\":\"assistant\",\"content\":"
                 "[{\"type\":\"tool_use\",\"id\":\"1\",\"name\":\"f\",\"input\":{\"a\":1.5}}]},"
                 "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"1\","
                 "\"content\":[" TXT("x", "") "," TXT("y", "") "]}]}]}",
        "{" M "\"stop\":[\"a\"],\"user\":\"u\",\"prompt_cache_key\":\"k\",\"tools\":[{\"type\":"
        "\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}],\"tool_choice\":{\"type\":"
        "\"function\",\"function\":{\"name\":\"f\"}},\"messages\":[{\"role\":\"system\","
        "\"content\":\"s\"},{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"assistant\","
        "\"content\":null,\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\",\"function\":"
        "{\"name\":\"f\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c\","
        "\"content\":[" TXT("a", "") "," TXT("b", "") "]}]}",
    };
    for (size_t bi = 0; bi < PC_ARRAY_LEN(bodies); bi++) {
        gw_api_kind_t kind = bi == 0 ? AM : OC;
        int rc = -1;
        for (pc_failalloc_at = 1; rc != 0 && pc_failalloc_at < 10000; pc_failalloc_at++) {
            pc_arena_t arena;
            gw_api_req_t *r = NULL;
            pc_failalloc_count = 0;
            pc_arena_init(&arena, 64);
            pc_allocator_t prev = pc_set_allocator(&pc_failalloc);
            rc = gw_api_parse(kind, bodies[bi], strlen(bodies[bi]), &arena, &r, &g_e);
            pc_set_allocator(&prev);
            pc_arena_close(&arena);
            if (rc != 0 && rc != PC_ERR_NOMEM)
                fprintf(stderr, "  fail_at %ld: %s\n", pc_failalloc_at, g_e.message);
            if (rc != 0) {
                ASSERT_EQ(rc, PC_ERR_NOMEM);
                ASSERT_EQ(g_e.status, 500);
                ASSERT_TRUE(r == NULL);
            }
        }
        ASSERT_EQ(rc, 0);
        ASSERT_TRUE(pc_failalloc_at > 5);
    }
}

PC_TEST_MAIN()
