/*
 * api_chat.c — the Anthropic and OpenAI JSON adapters: a parsed request body into the engine's
 * neutral chat model (engine/chat.h). Moved here from engine/chat.c: API field names and API
 * error texts belong to the gateway.
 *
 * Validation mirrors the APIs' own messages where it matters to clients (paths such as
 * "messages.1.content.0.type", Pydantic-style wording); unknown keys are ignored rather than
 * rejected. Every error leaves *out untouched. The request fields around the chat (max_tokens,
 * sampling, tool_choice, ...) and the cache_control count/order rules are api_parse.c's.
 */
#include "api_internal.h"
#include "json_fast.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pc_err.h"

#define CHAT_PATH_MAX 96
/* "." after a non-empty path prefix; top-level fields have the empty path. */
#define DOT(path) ((path)[0] != '\0' ? "." : "")

static int put(pc_buf_t *b, const char *s, size_t n)
{
    return pc_buf_append(b, s, n);
}
#define PUTS(b, lit) put((b), (lit), sizeof(lit) - 1)

/* ---- shared adapter helpers ----------------------------------------------------------- */

typedef struct adapter {
    pc_arena_t *arena;
    char *err;
    size_t err_len;
    const char *model; /* for "not supported by model M" */
    pc_buf_t scratch;  /* JSON text before it is copied into the arena */
} adapter_t;

static int copy_slice(adapter_t *a, const char *s, size_t n, pc_slice_t *out)
{
    char *p = pc_arena_strndup(a->arena, s, n);
    if (p == NULL) /* copies all n bytes, NULs included */
        return PC_ERR_NOMEM;
    *out = pc_slice(p, n);
    return 0;
}

static int copy_jstring(adapter_t *a, const json_t *s, pc_slice_t *out)
{
    return copy_slice(a, json_string_value(s), json_string_length(s), out);
}

/* Compact JSON text of v, copied into the arena. */
static int copy_json_text(adapter_t *a, const json_t *v, pc_slice_t *out)
{
    a->scratch.len = 0;
    int rc = eng_chat_json_compact(&a->scratch, v);
    if (rc == PC_ERR_RANGE)
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL, "JSON nested too deeply");
    if (rc != 0)
        return rc;
    return copy_slice(a, a->scratch.base != NULL ? a->scratch.base : "", a->scratch.len, out);
}

/* Anthropic cache_control: absent/null = none; {"type":"ephemeral","ttl"?: "5m"|"1h"}. */
static int parse_cache_control(adapter_t *a, const json_t *cc, const char *path,
                               eng_chat_ttl_t *ttl)
{
    *ttl = ENG_CHAT_TTL_NONE;
    if (cc == NULL || json_is_null(cc))
        return 0;
    if (!json_is_object(cc))
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                           "%s%scache_control: Input should be an object, not %s", path, DOT(path),
                           gw__json_type_name(cc, false));
    const json_t *type = json_object_get(cc, "type");
    if (type == NULL)
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                           "%s%scache_control.type: Field required", path, DOT(path));
    if (!json_is_string(type) || strcmp(json_string_value(type), "ephemeral") != 0)
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                           "%s%scache_control.type: Input should be 'ephemeral'", path, DOT(path));
    const json_t *t = json_object_get(cc, "ttl");
    if (t == NULL || json_is_null(t)) {
        *ttl = ENG_CHAT_TTL_5M;
        return 0;
    }
    if (json_is_string(t) && strcmp(json_string_value(t), "5m") == 0)
        *ttl = ENG_CHAT_TTL_5M;
    else if (json_is_string(t) && strcmp(json_string_value(t), "1h") == 0)
        *ttl = ENG_CHAT_TTL_1H;
    else
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                           "%s%scache_control.ttl: Input should be '5m' or '1h'", path, DOT(path));
    return 0;
}

/* A required string field; empty allowed unless nonempty. */
static int get_string(adapter_t *a, const json_t *obj, const char *key, const char *path,
                      bool required, const json_t **out)
{
    const json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (v == NULL || (json_is_null(v) && !required)) {
        if (required)
            return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL, "%s%s%s: Field required", path,
                               DOT(path), key);
        return 0;
    }
    if (!json_is_string(v))
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                           "%s%s%s: Input should be a valid string", path, DOT(path), key);
    *out = v;
    return 0;
}

/* Tool names: ^[a-zA-Z0-9_-]{1,64}$ in both APIs. */
static int check_tool_name(adapter_t *a, const json_t *name, const char *path)
{
    const char *s = json_string_value(name);
    size_t n = json_string_length(name);
    bool ok = n >= 1 && n <= 64;
    for (size_t i = 0; ok && i < n; i++) {
        char c = s[i];
        ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '_' || c == '-';
    }
    if (!ok)
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                           "%s.name: String should match pattern '^[a-zA-Z0-9_-]{1,64}$'", path);
    return 0;
}

static bool is_ws_only(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r')
            return false;
    return true;
}

/* ---- Anthropic ------------------------------------------------------------------------ */

static int anth_tool(adapter_t *a, const json_t *t, size_t i, eng_chat_tool_t *out)
{
    char path[CHAT_PATH_MAX];
    const json_t *name, *desc, *type;
    int rc;
    snprintf(path, sizeof path, "tools.%zu", i);
    if (!json_is_object(t))
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL, "%s: Input should be an object", path);
    if ((rc = get_string(a, t, "type", path, false, &type)) != 0)
        return rc;
    if (type != NULL && strcmp(json_string_value(type), "custom") != 0)
        return pc_err_setf(
            a->err, a->err_len, PC_ERR_UNSUPPORTED,
            "%s.type: tool type '%s' is not supported by model %s (only custom tools are)", path,
            json_string_value(type), a->model);
    if ((rc = get_string(a, t, "name", path, true, &name)) != 0 ||
        (rc = check_tool_name(a, name, path)) != 0 ||
        (rc = get_string(a, t, "description", path, false, &desc)) != 0)
        return rc;
    const json_t *schema = json_object_get(t, "input_schema");
    if (schema == NULL)
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL, "%s.input_schema: Field required",
                           path);
    if (!json_is_object(schema))
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                           "%s.input_schema: Input should be a valid dictionary", path);
    if ((rc = copy_jstring(a, name, &out->name)) != 0 ||
        (rc = copy_json_text(a, schema, &out->input_schema)) != 0)
        return rc;
    if (desc != NULL) {
        out->has_description = true;
        if ((rc = copy_jstring(a, desc, &out->description)) != 0)
            return rc;
    }
    return parse_cache_control(a, json_object_get(t, "cache_control"), path, &out->cache_ttl);
}

/* A text block {"type":"text","text":...,"cache_control"?}; used by system and messages. */
static int anth_text_block(adapter_t *a, const json_t *blk, const char *path, eng_chat_block_t *out)
{
    const json_t *text;
    int rc;
    if ((rc = get_string(a, blk, "text", path, true, &text)) != 0)
        return rc;
    const json_t *cc = json_object_get(blk, "cache_control");
    if (json_string_length(text) == 0 && cc != NULL && !json_is_null(cc))
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                           "%s.text: cache_control cannot be set for empty text blocks", path);
    if (json_string_length(text) == 0)
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                           "%s: text content blocks must be non-empty", path);
    if (is_ws_only(json_string_value(text), json_string_length(text)))
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                           "%s: text content blocks must contain non-whitespace text", path);
    out->kind = ENG_CHAT_BLOCK_TEXT;
    if ((rc = copy_jstring(a, text, &out->text)) != 0)
        return rc;
    return parse_cache_control(a, json_object_get(blk, "cache_control"), path, &out->cache_ttl);
}

/* tool_result content: a string, or an array of text (and image) blocks joined by "\n". */
static int anth_tool_result_content(adapter_t *a, const json_t *c, const char *path,
                                    eng_chat_block_t *out)
{
    if (c == NULL || json_is_null(c))
        return copy_slice(a, "", 0, &out->text);
    if (json_is_string(c))
        return copy_jstring(a, c, &out->text);
    if (!json_is_array(c))
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                           "%s.content: Input should be a valid string or a list of blocks", path);
    a->scratch.len = 0;
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *blk = json_array_get(c, i), *type, *text;
        char sub[CHAT_PATH_MAX + 32];
        int rc;
        snprintf(sub, sizeof sub, "%s.content.%zu", path, i);
        if (!json_is_object(blk))
            return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL, "%s: Input should be an object",
                               sub);
        if ((rc = get_string(a, blk, "type", sub, true, &type)) != 0)
            return rc;
        const char *ts = json_string_value(type);
        if (strcmp(ts, "image") == 0 || strcmp(ts, "document") == 0)
            return pc_err_setf(a->err, a->err_len, PC_ERR_UNSUPPORTED,
                               "%s: %s content is not supported by model %s", sub, ts, a->model);
        if (strcmp(ts, "text") != 0)
            return pc_err_setf(
                a->err, a->err_len, PC_ERR_INVAL,
                "%s.type: Input tag '%s' found using 'type' does not match any of the "
                "expected tags: 'text', 'image'",
                sub, ts);
        if ((rc = get_string(a, blk, "text", sub, true, &text)) != 0)
            return rc;
        if ((i > 0 && PUTS(&a->scratch, "\n") != 0) ||
            pc_buf_append(&a->scratch, json_string_value(text), json_string_length(text)) != 0)
            return PC_ERR_NOMEM;
    }
    return copy_slice(a, a->scratch.base != NULL ? a->scratch.base : "", a->scratch.len,
                      &out->text);
}

static int anth_block(adapter_t *a, const json_t *blk, eng_chat_role_t role, size_t mi, size_t bi,
                      eng_chat_block_t *out)
{
    char path[CHAT_PATH_MAX];
    const json_t *type;
    int rc;
    snprintf(path, sizeof path, "messages.%zu.content.%zu", mi, bi);
    out->src_msg = (uint32_t)mi;
    out->src_block = (uint32_t)bi;
    if (!json_is_object(blk))
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL, "%s: Input should be an object", path);
    if ((rc = get_string(a, blk, "type", path, true, &type)) != 0)
        return rc;
    const char *ts = json_string_value(type);
    if (strcmp(ts, "text") == 0)
        return anth_text_block(a, blk, path, out);
    if (strcmp(ts, "image") == 0 || strcmp(ts, "document") == 0)
        return pc_err_setf(a->err, a->err_len, PC_ERR_UNSUPPORTED,
                           "%s: %s content is not supported by model %s", path, ts, a->model);
    if (strcmp(ts, "tool_use") == 0) {
        const json_t *id, *name, *input = json_object_get(blk, "input");
        if (role != ENG_CHAT_ROLE_ASSISTANT)
            return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                               "%s: tool_use blocks are only allowed in assistant messages", path);
        if ((rc = get_string(a, blk, "id", path, true, &id)) != 0 ||
            (rc = get_string(a, blk, "name", path, true, &name)) != 0 ||
            (rc = check_tool_name(a, name, path)) != 0)
            return rc;
        if (input == NULL)
            return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL, "%s.input: Field required", path);
        if (!json_is_object(input))
            return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                               "%s.input: Input should be a valid dictionary", path);
        out->kind = ENG_CHAT_BLOCK_TOOL_USE;
        if ((rc = copy_jstring(a, id, &out->id)) != 0 ||
            (rc = copy_jstring(a, name, &out->name)) != 0 ||
            (rc = copy_json_text(a, input, &out->input)) != 0)
            return rc;
        return parse_cache_control(a, json_object_get(blk, "cache_control"), path, &out->cache_ttl);
    }
    if (strcmp(ts, "tool_result") == 0) {
        const json_t *id, *is_err = json_object_get(blk, "is_error");
        if (role != ENG_CHAT_ROLE_USER)
            return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                               "%s: tool_result blocks are only allowed in user messages", path);
        if ((rc = get_string(a, blk, "tool_use_id", path, true, &id)) != 0)
            return rc;
        if (is_err != NULL && !json_is_boolean(is_err) && !json_is_null(is_err))
            return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                               "%s.is_error: Input should be a valid boolean", path);
        out->kind = ENG_CHAT_BLOCK_TOOL_RESULT;
        out->is_error = json_is_true(is_err);
        if ((rc = copy_jstring(a, id, &out->id)) != 0 ||
            (rc = anth_tool_result_content(a, json_object_get(blk, "content"), path, out)) != 0)
            return rc;
        return parse_cache_control(a, json_object_get(blk, "cache_control"), path, &out->cache_ttl);
    }
    return pc_err_setf(
        a->err, a->err_len, PC_ERR_INVAL,
        "%s.type: Input tag '%s' found using 'type' does not match any of the expected "
        "tags: 'text', 'image', 'tool_use', 'tool_result'",
        path, ts);
}

/* Number of blocks message m contributes (string content = 1 block). Validates the shape. */
static int anth_msg_shape(adapter_t *a, const json_t *m, size_t mi, eng_chat_role_t *role,
                          size_t *n_blocks)
{
    const json_t *r, *c;
    char path[CHAT_PATH_MAX];
    int rc;
    snprintf(path, sizeof path, "messages.%zu", mi);
    if (!json_is_object(m))
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL, "%s: Input should be an object", path);
    if ((rc = get_string(a, m, "role", path, true, &r)) != 0)
        return rc;
    if (strcmp(json_string_value(r), "user") == 0)
        *role = ENG_CHAT_ROLE_USER;
    else if (strcmp(json_string_value(r), "assistant") == 0)
        *role = ENG_CHAT_ROLE_ASSISTANT;
    else
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                           "%s.role: Input should be 'user' or 'assistant'", path);
    c = json_object_get(m, "content");
    if (c == NULL)
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL, "%s.content: Field required", path);
    if (json_is_string(c))
        *n_blocks = json_string_length(c) > 0 ? 1 : 0;
    else if (json_is_array(c))
        *n_blocks = json_array_size(c);
    else
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                           "%s.content: Input should be a valid string or a list of blocks", path);
    return 0;
}

static int oai_tool(adapter_t *a, const json_t *t, size_t i, eng_chat_tool_t *out);

/* What both adapters do first: the body is an object with a string "model" and a non-empty
 * "messages" list; the chat is allocated and its tools (if any) parsed with tool_fn. Sets *out
 * (in the arena) and *msgs_out. Returns 0 or the error, with the reason in a->err. */
static int chat_begin(adapter_t *a, const json_t *body, eng_chat_api_t api,
                      int (*tool_fn)(adapter_t *, const json_t *, size_t, eng_chat_tool_t *),
                      eng_chat_t **out, const json_t **msgs_out)
{
    const json_t *model, *msgs, *tools;
    eng_chat_t *c;
    int rc;
    if (!json_is_object(body))
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                           "request body: Input should be an object");
    if ((rc = get_string(a, body, "model", "", true, &model)) != 0)
        return rc;
    a->model = json_string_value(model);
    msgs = json_object_get(body, "messages");
    if (msgs == NULL || !json_is_array(msgs))
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                           msgs == NULL ? "messages: Field required"
                                        : "messages: Input should be a valid list");
    if (json_array_size(msgs) == 0)
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                           "messages: at least one message is required");
    if ((c = pc_arena_new(a->arena, *c, 1)) == NULL)
        return PC_ERR_NOMEM;
    c->api = api;
    if ((rc = copy_jstring(a, model, &c->model)) != 0)
        return rc;
    tools = json_object_get(body, "tools");
    if (tools != NULL && !json_is_null(tools)) {
        if (!json_is_array(tools))
            return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                               "tools: Input should be a valid list");
        c->n_tools = json_array_size(tools);
        if (c->n_tools > 0 && (c->tools = pc_arena_new(a->arena, *c->tools, c->n_tools)) == NULL)
            return PC_ERR_NOMEM;
        for (size_t i = 0; i < c->n_tools; i++)
            if ((rc = tool_fn(a, json_array_get(tools, i), i, &c->tools[i])) != 0)
                return rc;
    }
    *out = c;
    *msgs_out = msgs;
    return 0;
}

int gw__chat_from_anthropic(const json_t *body, pc_arena_t *arena, eng_chat_t **out, char *err,
                            size_t err_len)
{
    adapter_t a = {arena, err, err_len, "?", PC_BUF_INIT};
    eng_chat_t *c = NULL;
    const json_t *system, *msgs;
    size_t n_msgs, n_turns = 0;
    int rc;

    if ((rc = chat_begin(&a, body, ENG_CHAT_API_ANTHROPIC, anth_tool, &c, &msgs)) != 0)
        goto fail;
    n_msgs = json_array_size(msgs);

    system = json_object_get(body, "system");
    if (system != NULL && !json_is_null(system)) {
        if (json_is_string(system)) {
            if (json_string_length(system) > 0) {
                rc = PC_ERR_NOMEM;
                if ((c->system = pc_arena_new(arena, *c->system, 1)) == NULL)
                    goto fail;
                c->n_system = 1;
                if ((rc = copy_jstring(&a, system, &c->system[0].text)) != 0)
                    goto fail;
            }
        } else if (json_is_array(system)) {
            c->n_system = json_array_size(system);
            rc = PC_ERR_NOMEM;
            if (c->n_system > 0 &&
                (c->system = pc_arena_new(arena, *c->system, c->n_system)) == NULL)
                goto fail;
            for (size_t i = 0; i < c->n_system; i++) {
                const json_t *blk = json_array_get(system, i), *type;
                char path[CHAT_PATH_MAX];
                snprintf(path, sizeof path, "system.%zu", i);
                c->system[i].src_block = (uint32_t)i;
                if (!json_is_object(blk)) {
                    rc = pc_err_setf(err, err_len, PC_ERR_INVAL, "%s: Input should be an object",
                                     path);
                    goto fail;
                }
                if ((rc = get_string(&a, blk, "type", path, true, &type)) != 0)
                    goto fail;
                if (strcmp(json_string_value(type), "text") != 0) {
                    rc = pc_err_setf(err, err_len, PC_ERR_INVAL, "%s.type: Input should be 'text'",
                                     path);
                    goto fail;
                }
                if ((rc = anth_text_block(&a, blk, path, &c->system[i])) != 0)
                    goto fail;
            }
        } else {
            rc = pc_err_setf(err, err_len, PC_ERR_INVAL,
                             "system: Input should be a valid string or a list of text blocks");
            goto fail;
        }
    }

    /* Pass 1: shapes, roles and the number of merged turns. */
    eng_chat_role_t prev = ENG_CHAT_ROLE_SYSTEM;
    for (size_t i = 0; i < n_msgs; i++) {
        eng_chat_role_t role;
        size_t nb;
        gw__work++;
        if ((rc = anth_msg_shape(&a, json_array_get(msgs, i), i, &role, &nb)) != 0)
            goto fail;
        if (nb == 0 && !(i == n_msgs - 1 && role == ENG_CHAT_ROLE_ASSISTANT)) {
            rc =
                pc_err_setf(err, err_len, PC_ERR_INVAL,
                            "messages.%zu: all messages must have non-empty content except for the "
                            "optional final assistant message",
                            i);
            goto fail;
        }
        if (i == 0 || role != prev)
            n_turns++;
        prev = role;
    }
    rc = PC_ERR_NOMEM;
    if ((c->messages = pc_arena_new(arena, *c->messages, n_turns)) == NULL)
        goto fail;

    /* Pass 2: blocks, merged into turns. Each turn's block array is sized by a look-ahead. */
    for (size_t i = 0, t = (size_t)-1; i < n_msgs; i++) {
        const json_t *m = json_array_get(msgs, i), *content = json_object_get(m, "content");
        eng_chat_role_t role;
        size_t nb;
        anth_msg_shape(&a, m, i, &role, &nb); /* validated in pass 1 */
        gw__work++;
        if (t == (size_t)-1 || c->messages[t].role != role) {
            size_t total = 0;
            for (size_t j = i; j < n_msgs; j++) {
                eng_chat_role_t rj;
                size_t nj;
                gw__work++;
                anth_msg_shape(&a, json_array_get(msgs, j), j, &rj, &nj);
                if (rj != role)
                    break;
                total += nj;
            }
            t++;
            c->messages[t].role = role;
            rc = PC_ERR_NOMEM;
            if (total > 0 &&
                (c->messages[t].blocks = pc_arena_new(arena, eng_chat_block_t, total)) == NULL)
                goto fail;
        }
        eng_chat_msg_t *turn = &c->messages[t];
        if (json_is_string(content)) {
            if (nb == 1) {
                eng_chat_block_t *b = &turn->blocks[turn->n_blocks++];
                b->kind = ENG_CHAT_BLOCK_TEXT;
                b->src_msg = (uint32_t)i;
                if ((rc = copy_jstring(&a, content, &b->text)) != 0)
                    goto fail;
            }
        } else {
            for (size_t k = 0; k < nb; k++) {
                eng_chat_block_t *b = &turn->blocks[turn->n_blocks++];
                if ((rc = anth_block(&a, json_array_get(content, k), role, i, k, b)) != 0)
                    goto fail;
            }
        }
    }
    c->n_messages = n_turns;

    /* A final assistant turn is a prefill. */
    eng_chat_msg_t *last = &c->messages[c->n_messages - 1];
    if (last->role == ENG_CHAT_ROLE_ASSISTANT) {
        if (last->n_blocks == 0) {
            c->n_messages--; /* an empty prefill is the plain generation prompt */
            if (c->n_messages == 0) {
                rc = pc_err_setf(err, err_len, PC_ERR_INVAL,
                                 "messages: at least one non-empty message is required");
                goto fail;
            }
        } else {
            const eng_chat_block_t *lb = &last->blocks[last->n_blocks - 1];
            if (lb->kind == ENG_CHAT_BLOCK_TEXT && lb->text.len > 0 &&
                is_ws_only(lb->text.base + lb->text.len - 1, 1)) {
                rc = pc_err_setf(err, err_len, PC_ERR_INVAL,
                                 "messages: final assistant content cannot end with trailing "
                                 "whitespace");
                goto fail;
            }
            c->prefill = true;
        }
    }
    if ((rc = parse_cache_control(&a, json_object_get(body, "cache_control"), "",
                                  &c->auto_cache_ttl)) != 0)
        goto fail;
    pc_buf_free(&a.scratch);
    *out = c;
    return 0;
fail:
    pc_buf_free(&a.scratch);
    return rc;
}

/* ---- OpenAI --------------------------------------------------------------------------- */

/* OpenAI message content: a string, null, or an array of {"type":"text","text"} parts. Fills
 * blocks[] (NULL = count only) and returns the number of blocks through *n. */
static int oai_content(adapter_t *a, const json_t *c, const char *path, bool null_ok,
                       eng_chat_block_t *blocks, size_t *n)
{
    int rc;
    *n = 0;
    if (c == NULL || json_is_null(c)) {
        if (!null_ok)
            return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL, "%s.content: Field required",
                               path);
        return 0;
    }
    if (json_is_string(c)) {
        *n = 1;
        if (blocks != NULL) {
            blocks[0].kind = ENG_CHAT_BLOCK_TEXT;
            return copy_jstring(a, c, &blocks[0].text);
        }
        return 0;
    }
    if (!json_is_array(c))
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                           "%s.content: Input should be a string or an array of content parts",
                           path);
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *p = json_array_get(c, i), *type, *text;
        char sub[CHAT_PATH_MAX + 32];
        snprintf(sub, sizeof sub, "%s.content.%zu", path, i);
        if (!json_is_object(p))
            return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL, "%s: Input should be an object",
                               sub);
        if ((rc = get_string(a, p, "type", sub, true, &type)) != 0)
            return rc;
        const char *ts = json_string_value(type);
        if (strcmp(ts, "image_url") == 0 || strcmp(ts, "input_audio") == 0 ||
            strcmp(ts, "file") == 0)
            return pc_err_setf(a->err, a->err_len, PC_ERR_UNSUPPORTED,
                               "%s: %s content is not supported by model %s", sub, ts, a->model);
        const char *field = strcmp(ts, "refusal") == 0 ? "refusal" : "text";
        if (strcmp(ts, "text") != 0 && strcmp(ts, "refusal") != 0)
            return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                               "%s.type: Invalid value '%s'; supported: 'text', 'image_url', "
                               "'input_audio', 'file', 'refusal'",
                               sub, ts);
        if ((rc = get_string(a, p, field, sub, true, &text)) != 0)
            return rc;
        if (blocks != NULL) {
            blocks[*n].kind = ENG_CHAT_BLOCK_TEXT;
            blocks[*n].src_block = (uint32_t)i;
            if ((rc = copy_jstring(a, text, &blocks[*n].text)) != 0)
                return rc;
        }
        (*n)++;
    }
    return 0;
}

/* Tool message content as one string (parts joined by "\n"). */
static int oai_tool_content(adapter_t *a, const json_t *c, const char *path, eng_chat_block_t *out)
{
    size_t n;
    int rc = oai_content(a, c, path, false, NULL, &n);
    if (rc != 0)
        return rc;
    if (json_is_string(c))
        return copy_jstring(a, c, &out->text);
    a->scratch.len = 0;
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *text = json_object_get(json_array_get(c, i), "text");
        if ((i > 0 && PUTS(&a->scratch, "\n") != 0) ||
            pc_buf_append(&a->scratch, json_string_value(text), json_string_length(text)) != 0)
            return PC_ERR_NOMEM;
    }
    return copy_slice(a, a->scratch.base != NULL ? a->scratch.base : "", a->scratch.len,
                      &out->text);
}

/* The "function" member of obj (an OpenAI tool or tool call) at fpath: it must be an object
 * whose "name" is a valid tool name. *fn and *name borrow from obj. */
static int get_function(adapter_t *a, const json_t *obj, const char *fpath, const json_t **fn,
                        const json_t **name)
{
    int rc;
    *fn = json_object_get(obj, "function");
    if (!json_is_object(*fn))
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                           *fn == NULL ? "%s: Field required" : "%s: Input should be an object",
                           fpath);
    if ((rc = get_string(a, *fn, "name", fpath, true, name)) != 0 ||
        (rc = check_tool_name(a, *name, fpath)) != 0)
        return rc;
    return 0;
}

static int oai_tool_call(adapter_t *a, const json_t *tc, const char *mpath, size_t k,
                         eng_chat_block_t *out)
{
    char path[CHAT_PATH_MAX + 32], fpath[CHAT_PATH_MAX + 48];
    const json_t *id, *type, *fn, *name, *args;
    int rc;
    snprintf(path, sizeof path, "%s.tool_calls.%zu", mpath, k);
    snprintf(fpath, sizeof fpath, "%s.function", path);
    if (!json_is_object(tc))
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL, "%s: Input should be an object", path);
    if ((rc = get_string(a, tc, "id", path, true, &id)) != 0 ||
        (rc = get_string(a, tc, "type", path, false, &type)) != 0)
        return rc;
    if (type != NULL && strcmp(json_string_value(type), "function") != 0)
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL, "%s.type: Input should be 'function'",
                           path);
    if ((rc = get_function(a, tc, fpath, &fn, &name)) != 0 ||
        (rc = get_string(a, fn, "arguments", fpath, true, &args)) != 0)
        return rc;
    /* Only "is it an object" matters (the text is kept verbatim): its members are checked as
     * JSON without building them. */
    static const char *const keep_none[1] = {NULL};
    json_t *parsed = gw_json_loadb_keep(json_string_value(args), json_string_length(args),
                                        JSON_ALLOW_NUL, keep_none, 0, NULL);
    bool is_obj = json_is_object(parsed);
    json_decref(parsed);
    if (!is_obj)
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                           "%s.arguments: must be a JSON-encoded object", fpath);
    out->kind = ENG_CHAT_BLOCK_TOOL_USE;
    out->input_raw = true;
    out->src_block = (uint32_t)k;
    if ((rc = copy_jstring(a, id, &out->id)) != 0 ||
        (rc = copy_jstring(a, name, &out->name)) != 0 ||
        (rc = copy_jstring(a, args, &out->input)) != 0)
        return rc;
    return 0;
}

static int oai_tool(adapter_t *a, const json_t *t, size_t i, eng_chat_tool_t *out)
{
    char path[CHAT_PATH_MAX], fpath[CHAT_PATH_MAX + 16];
    const json_t *type, *fn, *name, *desc, *params;
    int rc;
    snprintf(path, sizeof path, "tools.%zu", i);
    snprintf(fpath, sizeof fpath, "%s.function", path);
    if (!json_is_object(t))
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL, "%s: Input should be an object", path);
    if ((rc = get_string(a, t, "type", path, true, &type)) != 0)
        return rc;
    if (strcmp(json_string_value(type), "function") != 0)
        return pc_err_setf(a->err, a->err_len, PC_ERR_UNSUPPORTED,
                           "%s.type: tool type '%s' is not supported by model %s", path,
                           json_string_value(type), a->model);
    if ((rc = get_function(a, t, fpath, &fn, &name)) != 0 ||
        (rc = get_string(a, fn, "description", fpath, false, &desc)) != 0)
        return rc;
    params = json_object_get(fn, "parameters");
    if (params != NULL && !json_is_null(params) && !json_is_object(params))
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                           "%s.parameters: Input should be an object", fpath);
    if ((rc = copy_jstring(a, name, &out->name)) != 0)
        return rc;
    if (desc != NULL) {
        out->has_description = true;
        if ((rc = copy_jstring(a, desc, &out->description)) != 0)
            return rc;
    }
    if (json_is_object(params) && (rc = copy_json_text(a, params, &out->input_schema)) != 0)
        return rc;
    return 0;
}

/* Parses message i; with blocks == NULL only validates and counts. */
static int oai_message(adapter_t *a, const json_t *m, size_t i, eng_chat_msg_t *out, bool fill)
{
    char path[CHAT_PATH_MAX];
    const json_t *r, *content, *calls;
    size_t n_text = 0, n_calls = 0;
    int rc;
    snprintf(path, sizeof path, "messages.%zu", i);
    if (!json_is_object(m))
        return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL, "%s: Input should be an object", path);
    if ((rc = get_string(a, m, "role", path, true, &r)) != 0)
        return rc;
    const char *rs = json_string_value(r);
    content = json_object_get(m, "content");
    if (strcmp(rs, "system") == 0 || strcmp(rs, "developer") == 0 || strcmp(rs, "user") == 0) {
        out->role = rs[0] == 'u' ? ENG_CHAT_ROLE_USER : ENG_CHAT_ROLE_SYSTEM;
        if ((rc = oai_content(a, content, path, false, NULL, &n_text)) != 0)
            return rc;
        out->n_blocks = n_text;
        if (!fill)
            return 0;
        if (n_text > 0 && (out->blocks = pc_arena_new(a->arena, eng_chat_block_t, n_text)) == NULL)
            return PC_ERR_NOMEM;
        return oai_content(a, content, path, false, out->blocks, &n_text);
    }
    if (strcmp(rs, "assistant") == 0) {
        out->role = ENG_CHAT_ROLE_ASSISTANT;
        calls = json_object_get(m, "tool_calls");
        if (calls != NULL && !json_is_null(calls) && !json_is_array(calls))
            return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                               "%s.tool_calls: Input should be a valid list", path);
        n_calls = json_array_size(calls);
        if ((rc = oai_content(a, content, path, true, NULL, &n_text)) != 0)
            return rc;
        if (n_text + n_calls == 0 && (content == NULL || json_is_null(content)))
            return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                               "%s: assistant messages need content or tool_calls", path);
        out->n_blocks = n_text + n_calls;
        if (fill && out->n_blocks > 0 &&
            (out->blocks = pc_arena_new(a->arena, eng_chat_block_t, out->n_blocks)) == NULL)
            return PC_ERR_NOMEM;
        if (fill && (rc = oai_content(a, content, path, true, out->blocks, &n_text)) != 0)
            return rc;
        for (size_t k = 0; k < n_calls; k++) {
            eng_chat_block_t tmp = {0}, *b = fill ? &out->blocks[n_text + k] : &tmp;
            if ((rc = oai_tool_call(a, json_array_get(calls, k), path, k, b)) != 0)
                return rc;
        }
        return 0;
    }
    if (strcmp(rs, "tool") == 0) {
        const json_t *id;
        out->role = ENG_CHAT_ROLE_TOOL;
        out->n_blocks = 1;
        if ((rc = get_string(a, m, "tool_call_id", path, true, &id)) != 0)
            return rc;
        if (!fill)
            return oai_content(a, content, path, false, NULL, &n_text);
        if ((out->blocks = pc_arena_new(a->arena, eng_chat_block_t, 1)) == NULL)
            return PC_ERR_NOMEM;
        out->blocks[0].kind = ENG_CHAT_BLOCK_TOOL_RESULT;
        if ((rc = copy_jstring(a, id, &out->blocks[0].id)) != 0)
            return rc;
        return oai_tool_content(a, content, path, &out->blocks[0]);
    }
    return pc_err_setf(a->err, a->err_len, PC_ERR_INVAL,
                       "%s.role: Invalid value '%s'; supported: 'system', 'developer', 'user', "
                       "'assistant', 'tool'",
                       path, rs);
}

int gw__chat_from_openai(const json_t *body, pc_arena_t *arena, eng_chat_t **out, char *err,
                         size_t err_len)
{
    adapter_t a = {arena, err, err_len, "?", PC_BUF_INIT};
    eng_chat_t *c = NULL;
    const json_t *msgs;
    size_t n_msgs, first = 0;
    int rc;

    if ((rc = chat_begin(&a, body, ENG_CHAT_API_OPENAI, oai_tool, &c, &msgs)) != 0)
        goto fail;
    n_msgs = json_array_size(msgs);

    /* Validate everything before allocating, so a bad request costs little arena. */
    for (size_t i = 0; i < n_msgs; i++) {
        eng_chat_msg_t tmp = {0};
        gw__work++;
        if ((rc = oai_message(&a, json_array_get(msgs, i), i, &tmp, false)) != 0)
            goto fail;
        if (i == 0 && tmp.role == ENG_CHAT_ROLE_SYSTEM)
            first = 1;
    }
    if (first == 1) {
        eng_chat_msg_t sys = {0};
        if ((rc = oai_message(&a, json_array_get(msgs, 0), 0, &sys, true)) != 0)
            goto fail;
        c->system = sys.blocks;
        c->n_system = sys.n_blocks;
    }
    c->n_messages = n_msgs - first;
    if (c->n_messages == 0) {
        rc = pc_err_setf(err, err_len, PC_ERR_INVAL,
                         "messages: at least one message besides the system message is required");
        goto fail;
    }
    rc = PC_ERR_NOMEM;
    if ((c->messages = pc_arena_new(arena, eng_chat_msg_t, c->n_messages)) == NULL)
        goto fail;
    for (size_t i = first; i < n_msgs; i++) {
        eng_chat_msg_t *m = &c->messages[i - first];
        gw__work++;
        if ((rc = oai_message(&a, json_array_get(msgs, i), i, m, true)) != 0)
            goto fail;
        for (size_t k = 0; k < m->n_blocks; k++)
            m->blocks[k].src_msg = (uint32_t)i;
    }
    pc_buf_free(&a.scratch);
    *out = c;
    return 0;
fail:
    pc_buf_free(&a.scratch);
    return rc;
}
