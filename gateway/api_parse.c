/*
 * api_parse.c — gw_api_parse: body bytes -> validated gw_api_req_t, and the error helpers.
 *
 * The chat itself (model, system, tools, messages, cache_control objects) is converted by the
 * adapters in api_chat.c; this file checks the JSON, the request fields around the chat with
 * each API's wording, and Anthropic's cache_control count and order rules. See api.h for the
 * contract and the error texts.
 */
#include "api_internal.h"
#include "cacheplan.h"
#include "json_fast.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "pc_assert.h"
#include "pc_err.h"

_Thread_local uint64_t gw__work;

/* ---- errors ------------------------------------------------------------------------------ */

const char *gw_api_error_type(gw_api_kind_t kind, int status)
{
    if (!gw_api_is_anthropic(kind)) {
        if (status == 429)
            return "rate_limit_error";
        if (status >= 500)
            return "server_error";
        return "invalid_request_error";
    }
    switch (status) {
    case 401:
        return "authentication_error";
    case 402:
        return "billing_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 408:
    case 504:
        return "timeout_error";
    case 413:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 503:
    case 529:
        return "overloaded_error";
    default:
        return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

static void error_vset(gw_api_error_t *e, gw_api_kind_t kind, int status, const char *fmt,
                       va_list ap)
{
    e->status = status;
    e->type = gw_api_error_type(kind, status);
    e->param[0] = '\0';
    e->code = NULL;
    vsnprintf(e->message, sizeof e->message, fmt, ap);
}

void gw_api_error_set(gw_api_error_t *e, gw_api_kind_t kind, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_vset(e, kind, status, fmt, ap);
    va_end(ap);
}

void gw__openai_param(const char *msg, char *param, size_t param_len)
{
    size_t o = 0, i = 0;
    const char *end = strstr(msg, ": ");
    param[0] = '\0';
    if (end == NULL || param_len == 0)
        return;
    /* A path is identifiers and numbers separated by dots, nothing else before ": ". */
    for (const char *c = msg; c < end; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_' || *c == '.'))
            return;
    while (msg + i < end && o + 1 < param_len) {
        size_t j = i;
        while (msg + j < end && msg[j] != '.')
            j++;
        bool num = j > i;
        for (size_t k = i; k < j; k++)
            num = num && msg[k] >= '0' && msg[k] <= '9';
        int n = num ? snprintf(param + o, param_len - o, "[%.*s]", (int)(j - i), msg + i)
                    : snprintf(param + o, param_len - o, "%s%.*s", o > 0 ? "." : "", (int)(j - i),
                               msg + i);
        if (n < 0 || (size_t)n >= param_len - o) {
            param[o] = '\0';
            return;
        }
        o += (size_t)n;
        i = msg + j < end ? j + 1 : j;
    }
}

/* ---- parse context --------------------------------------------------------------------------- */

typedef struct pctx {
    gw_api_kind_t kind;
    bool oai;
    gw_api_error_t *err;
} pctx_t;

/* A 400 invalid_request_error with an OpenAI param and code (ignored for Anthropic). */
static int bad(pctx_t *p, const char *param, const char *code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
static int bad(pctx_t *p, const char *param, const char *code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_vset(p->err, p->kind, 400, fmt, ap);
    va_end(ap);
    if (p->oai) {
        snprintf(p->err->param, sizeof p->err->param, "%s", param != NULL ? param : "");
        p->err->code = code;
    }
    return PC_ERR_INVAL;
}

const char *gw__json_type_name(const json_t *v, bool oai)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return oai ? "an integer" : "a number";
    case JSON_REAL:
        return oai ? "a decimal" : "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

static int bad_type(pctx_t *p, const char *key, const json_t *v, const char *oai_expected,
                    const char *anth_text)
{
    if (p->oai)
        return bad(p, key, "invalid_type",
                   "Invalid type for '%s': expected %s, but got %s instead.", key, oai_expected,
                   gw__json_type_name(v, true));
    return bad(p, key, NULL, "%s: %s", key, anth_text);
}

/* Optional boolean; null = absent. */
static int get_bool(pctx_t *p, const json_t *obj, const char *key, bool *val, bool *has)
{
    const json_t *v = json_object_get(obj, key);
    if (has != NULL)
        *has = false;
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return bad_type(p, key, v, "a boolean", "Input should be a valid boolean");
    *val = json_is_true(v);
    if (has != NULL)
        *has = true;
    return 0;
}

static int range_error(pctx_t *p, const char *key, bool integer, bool above, double limit,
                       double got, bool limit_inclusive)
{
    if (p->oai) {
        const char *kind = integer ? "integer" : "decimal";
        return bad(p, key,
                   integer ? (above ? "integer_above_max_value" : "integer_below_min_value")
                           : (above ? "decimal_above_max_value" : "decimal_below_min_value"),
                   "Invalid '%s': %s %s %s value. Expected a value %s %.17g, but got %.17g "
                   "instead.",
                   key, kind, above ? "above" : "below", above ? "maximum" : "minimum",
                   above ? "<=" : (limit_inclusive ? ">=" : ">"), limit, got);
    }
    return bad(p, key, NULL, "%s: Input should be %s %.17g", key,
               above ? "less than or equal to"
                     : (limit_inclusive ? "greater than or equal to" : "greater than"),
               limit);
}

/* Optional number in [lo, hi]; null = absent. */
static int get_number(pctx_t *p, const json_t *obj, const char *key, double lo, double hi,
                      double *val, bool *has)
{
    const json_t *v = json_object_get(obj, key);
    *has = false;
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_number(v))
        return bad_type(p, key, v, "a decimal", "Input should be a valid number");
    double d = json_number_value(v);
    if (d < lo)
        return range_error(p, key, false, false, lo, d, true);
    if (d > hi)
        return range_error(p, key, false, true, hi, d, true);
    *val = d;
    *has = true;
    return 0;
}

/* Optional integer in [lo, hi] (an integral real such as 5.0 counts); null = absent. */
static int get_int(pctx_t *p, const json_t *obj, const char *key, int64_t lo, int64_t hi,
                   int64_t *val, bool *has)
{
    const json_t *v = json_object_get(obj, key);
    int64_t n;
    *has = false;
    if (v == NULL || json_is_null(v))
        return 0;
    if (json_is_integer(v)) {
        n = (int64_t)json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d != floor(d) || fabs(d) > 9.0e18) {
            if (p->oai)
                return bad_type(p, key, v, "an integer", "");
            return bad(p, key, NULL,
                       "%s: Input should be a valid integer, got a number with a fractional "
                       "part",
                       key);
        }
        n = (int64_t)d;
    } else {
        return bad_type(p, key, v, "an integer", "Input should be a valid integer");
    }
    if (n < lo)
        return range_error(p, key, true, false, (double)lo, (double)n, true);
    if (n > hi)
        return range_error(p, key, true, true, (double)hi, (double)n, true);
    *val = n;
    *has = true;
    return 0;
}

static int copy_str(pc_arena_t *a, const json_t *s, pc_slice_t *out)
{
    char *c = pc_arena_strndup(a, json_string_value(s), json_string_length(s));
    if (c == NULL)
        return PC_ERR_NOMEM;
    *out = pc_slice(c, json_string_length(s));
    return 0;
}

/* Optional string (null = absent) copied into the arena; max_len 0 = no limit. */
static int get_str(pctx_t *p, pc_arena_t *a, const json_t *obj, const char *key, const char *path,
                   size_t max_len, pc_slice_t *out, bool *has)
{
    const json_t *v = json_object_get(obj, key);
    if (has != NULL)
        *has = false;
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return bad_type(p, path, v, "a string", "Input should be a valid string");
    if (max_len > 0 && json_string_length(v) > max_len) {
        if (p->oai)
            return bad(p, path, "string_above_max_length",
                       "Invalid '%s': string too long. Expected a string with maximum length "
                       "%zu, but got a string with length %zu instead.",
                       path, max_len, json_string_length(v));
        return bad(p, path, NULL, "%s: String should have at most %zu characters", path, max_len);
    }
    if (has != NULL)
        *has = true;
    return copy_str(a, v, out);
}

/* ---- stop sequences ------------------------------------------------------------------------- */

static int check_stop_string(pctx_t *p, const json_t *s, const char *path)
{
    if (!json_is_string(s))
        return bad_type(p, path, s, "a string", "Input should be a valid string");
    size_t n = json_string_length(s);
    if (n == 0)
        return bad(p, path, "invalid_value", "%s: stop sequences must be non-empty", path);
    if (n > GW_API_MAX_STOP_BYTES)
        return bad(p, path, "string_above_max_length",
                   "%s: a stop sequence may be at most %d bytes long (got %zu)", path,
                   GW_API_MAX_STOP_BYTES, n);
    if (memchr(json_string_value(s), '\0', n) != NULL)
        return bad(p, path, "invalid_value", "%s: stop sequences cannot contain NUL characters",
                   path);
    return 0;
}

static int parse_stop(pctx_t *p, pc_arena_t *a, const json_t *body, gw_api_req_t *r)
{
    const char *key = p->oai ? "stop" : "stop_sequences";
    const json_t *v = json_object_get(body, key);
    size_t max = p->oai ? 4 : GW_API_MAX_STOP;
    char path[64];
    int rc;
    if (v == NULL || json_is_null(v))
        return 0;
    if (p->oai && json_is_string(v)) {
        if ((rc = check_stop_string(p, v, key)) != 0)
            return rc;
        if ((r->stop = pc_arena_new(a, pc_slice_t, 1)) == NULL)
            return PC_ERR_NOMEM;
        r->n_stop = 1;
        return copy_str(a, v, &r->stop[0]);
    }
    if (!json_is_array(v))
        return p->oai ? bad_type(p, key, v, "a string or an array", "")
                      : bad(p, key, NULL, "%s: Input should be a valid list", key);
    size_t n = json_array_size(v);
    if (n > max) {
        if (p->oai)
            return bad(p, key, "array_above_max_length",
                       "Invalid '%s': array too long. Expected an array with maximum length %zu, "
                       "but got an array with length %zu instead.",
                       key, max, n);
        return bad(p, key, NULL, "%s: List should have at most %zu items after validation, not %zu",
                   key, max, n);
    }
    for (size_t i = 0; i < n; i++) {
        snprintf(path, sizeof path, p->oai ? "%s[%zu]" : "%s.%zu", key, i);
        if ((rc = check_stop_string(p, json_array_get(v, i), path)) != 0)
            return rc;
    }
    if (n > 0 && (r->stop = pc_arena_new(a, pc_slice_t, n)) == NULL)
        return PC_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        if ((rc = copy_str(a, json_array_get(v, i), &r->stop[i])) != 0)
            return rc;
    r->n_stop = n;
    return 0;
}

/* ---- tool_choice ------------------------------------------------------------------------------
 */

static bool has_tool(const eng_chat_t *c, const char *name, size_t len)
{
    for (size_t i = 0; i < c->n_tools; i++)
        if (pc_slice_eq(c->tools[i].name, pc_slice(name, len)))
            return true;
    return false;
}

static int anth_tool_choice(pctx_t *p, pc_arena_t *a, const json_t *body, gw_api_req_t *r)
{
    const json_t *tc = json_object_get(body, "tool_choice"), *type, *name;
    bool dp = false, has_dp = false;
    int rc;
    if (tc == NULL || json_is_null(tc))
        return 0;
    if (!json_is_object(tc))
        return bad(p, "tool_choice", NULL, "tool_choice: Input should be a valid dictionary");
    type = json_object_get(tc, "type");
    if (type == NULL)
        return bad(p, "tool_choice", NULL, "tool_choice.type: Field required");
    const char *ts = json_is_string(type) ? json_string_value(type) : "";
    if (strcmp(ts, "auto") == 0)
        r->tool_choice = GW_TOOL_CHOICE_AUTO;
    else if (strcmp(ts, "any") == 0)
        r->tool_choice = GW_TOOL_CHOICE_ANY;
    else if (strcmp(ts, "tool") == 0)
        r->tool_choice = GW_TOOL_CHOICE_TOOL;
    else if (strcmp(ts, "none") == 0)
        r->tool_choice = GW_TOOL_CHOICE_NONE;
    else
        return bad(p, "tool_choice", NULL,
                   "tool_choice.type: Input tag '%s' found using 'type' does not match any of the "
                   "expected tags: 'auto', 'any', 'tool', 'none'",
                   json_is_string(type) ? ts : "(not a string)");
    if ((rc = get_bool(p, tc, "disable_parallel_tool_use", &dp, &has_dp)) != 0) {
        snprintf(p->err->message, sizeof p->err->message,
                 "tool_choice.disable_parallel_tool_use: Input should be a valid boolean");
        return rc;
    }
    r->disable_parallel_tool_use = has_dp && dp;
    if ((r->tool_choice == GW_TOOL_CHOICE_ANY || r->tool_choice == GW_TOOL_CHOICE_TOOL) &&
        r->chat->n_tools == 0)
        return bad(p, "tool_choice", NULL,
                   "tool_choice may only be specified while providing tools.");
    if (r->tool_choice == GW_TOOL_CHOICE_TOOL) {
        name = json_object_get(tc, "name");
        if (name == NULL)
            return bad(p, "tool_choice", NULL, "tool_choice.name: Field required");
        if (!json_is_string(name))
            return bad(p, "tool_choice", NULL, "tool_choice.name: Input should be a valid string");
        if (!has_tool(r->chat, json_string_value(name), json_string_length(name)))
            return bad(p, "tool_choice", NULL,
                       "tool_choice.name: tool '%s' is not one of the request's tools",
                       json_string_value(name));
        return copy_str(a, name, &r->tool_choice_name);
    }
    return 0;
}

static int oai_tool_choice(pctx_t *p, pc_arena_t *a, const json_t *body, gw_api_req_t *r)
{
    const json_t *tc = json_object_get(body, "tool_choice"), *fn, *name;
    bool ptc = true, has_ptc = false;
    int rc;
    if ((rc = get_bool(p, body, "parallel_tool_calls", &ptc, &has_ptc)) != 0)
        return rc;
    r->disable_parallel_tool_use = has_ptc && !ptc;
    if (tc == NULL || json_is_null(tc))
        return 0;
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        if (strcmp(s, "auto") == 0)
            r->tool_choice = GW_TOOL_CHOICE_AUTO;
        else if (strcmp(s, "required") == 0)
            r->tool_choice = GW_TOOL_CHOICE_ANY;
        else if (strcmp(s, "none") == 0)
            r->tool_choice = GW_TOOL_CHOICE_NONE;
        else
            return bad(p, "tool_choice", "invalid_value",
                       "Invalid value: '%s'. Supported values are: 'none', 'auto', and "
                       "'required'.",
                       s);
    } else if (json_is_object(tc)) {
        const json_t *type = json_object_get(tc, "type");
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0)
            return bad(p, "tool_choice.type", "invalid_value",
                       "Invalid value for 'tool_choice.type': expected 'function'.");
        fn = json_object_get(tc, "function");
        name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
        if (!json_is_string(name))
            return bad(p, "tool_choice.function.name", "missing_required_parameter",
                       "Missing required parameter: 'tool_choice.function.name'.");
        r->tool_choice = GW_TOOL_CHOICE_TOOL;
        if ((rc = copy_str(a, name, &r->tool_choice_name)) != 0)
            return rc;
    } else {
        return bad_type(p, "tool_choice", tc, "a string or an object", "");
    }
    if (r->tool_choice != GW_TOOL_CHOICE_NONE && r->tool_choice != GW_TOOL_CHOICE_AUTO &&
        r->chat->n_tools == 0)
        return bad(p, "tool_choice", NULL,
                   "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' "
                   "are specified.");
    if (r->tool_choice == GW_TOOL_CHOICE_TOOL &&
        !has_tool(r->chat, r->tool_choice_name.base, r->tool_choice_name.len))
        return bad(p, "tool_choice", "invalid_value",
                   "Invalid value for 'tool_choice': no function named '%s' was specified in the "
                   "'tools' parameter.",
                   r->tool_choice_name.base);
    return 0;
}

/* ---- cache_control rules (Anthropic) ----------------------------------------------------------
 */

typedef struct elem {
    eng_chat_ttl_t ttl;
    char path[64];
} elem_t;

/* The path of element k (tools, system blocks, message blocks in order). */
static void elem_path(const eng_chat_t *c, size_t k, char *path, size_t len)
{
    if (k < c->n_tools) {
        snprintf(path, len, "tools.%zu", k);
        return;
    }
    k -= c->n_tools;
    if (k < c->n_system) {
        snprintf(path, len, "system.%u", c->system[k].src_block);
        return;
    }
    k -= c->n_system;
    for (size_t m = 0; m < c->n_messages; m++) {
        if (k < c->messages[m].n_blocks) {
            const eng_chat_block_t *b = &c->messages[m].blocks[k];
            snprintf(path, len, "messages.%u.content.%u", b->src_msg, b->src_block);
            return;
        }
        k -= c->messages[m].n_blocks;
    }
    snprintf(path, len, "?");
}

/* A cursor over the elements (tools, system blocks, message blocks) in order: each step is
 * O(1) amortized, so a whole pass is linear. (Finding element k from the start each time was
 * O(messages) per element: 160k one-character messages took 19 s here.) */
typedef struct elem_cur {
    size_t k, m, b; /* element index; message and block of the next message block */
} elem_cur_t;

/* The TTL of the next element, or false past the last one. */
static bool elem_next(const eng_chat_t *c, elem_cur_t *it, eng_chat_ttl_t *ttl)
{
    gw__work++;
    if (it->k < c->n_tools) {
        *ttl = c->tools[it->k++].cache_ttl;
        return true;
    }
    if (it->k < c->n_tools + c->n_system) {
        *ttl = c->system[it->k++ - c->n_tools].cache_ttl;
        return true;
    }
    while (it->m < c->n_messages && it->b >= c->messages[it->m].n_blocks) {
        gw__work++;
        it->m++;
        it->b = 0;
    }
    if (it->m >= c->n_messages)
        return false;
    *ttl = c->messages[it->m].blocks[it->b++].cache_ttl;
    it->k++;
    return true;
}

/* The TTL of the last element (where the automatic breakpoint lands), NONE when none. */
static eng_chat_ttl_t last_elem_ttl(const eng_chat_t *c)
{
    for (size_t m = c->n_messages; m-- > 0;)
        if (c->messages[m].n_blocks > 0)
            return c->messages[m].blocks[c->messages[m].n_blocks - 1].cache_ttl;
    if (c->n_system > 0)
        return c->system[c->n_system - 1].cache_ttl;
    return c->n_tools > 0 ? c->tools[c->n_tools - 1].cache_ttl : ENG_CHAT_TTL_NONE;
}

static int check_cache_control(pctx_t *p, const eng_chat_t *c)
{
    long auto_k = c->auto_cache_ttl != ENG_CHAT_TTL_NONE ? gw_cacheplan_auto_mark(c) : -1;
    eng_chat_ttl_t auto_elem_ttl = auto_k >= 0 ? last_elem_ttl(c) : ENG_CHAT_TTL_NONE;
    size_t n_found = 0;
    char path[64], prev_path[64] = "";
    elem_cur_t it = {0};
    eng_chat_ttl_t t;
    while (elem_next(c, &it, &t))
        n_found += t != ENG_CHAT_TTL_NONE;
    if (auto_k >= 0 && auto_elem_ttl != c->auto_cache_ttl)
        n_found++; /* a separate breakpoint, unless it merges into the same TTL */
    if (n_found > GW_API_MAX_BREAKPOINTS)
        return bad(p, NULL, NULL,
                   "A maximum of %d blocks with cache_control may be provided. Found %zu.",
                   GW_API_MAX_BREAKPOINTS, n_found);
    if (auto_k >= 0) {
        if (auto_elem_ttl != ENG_CHAT_TTL_NONE && auto_elem_ttl != c->auto_cache_ttl) {
            elem_path(c, (size_t)auto_k, path, sizeof path);
            return bad(p, "cache_control", NULL,
                       "cache_control: the top-level (automatic) cache_control has ttl '%s' but "
                       "the last block, %s, where it applies, has cache_control with ttl '%s'; "
                       "use the same ttl or remove one of them",
                       eng_chat_ttl_name(c->auto_cache_ttl), path,
                       eng_chat_ttl_name(auto_elem_ttl));
        }
    }
    /* 1h before 5m, in tools -> system -> messages order, the automatic one included. With at
     * most 4 breakpoints (checked above), the element scan is the only per-element work;
     * elem_path runs only for the (at most two) elements named in an error. */
    it = (elem_cur_t){0};
    for (size_t k = 0; elem_next(c, &it, &t); k++) {
        eng_chat_ttl_t own = t;
        if ((long)k == auto_k && t == ENG_CHAT_TTL_NONE)
            t = c->auto_cache_ttl;
        if (t == ENG_CHAT_TTL_5M && prev_path[0] == '\0')
            elem_path(c, k, prev_path, sizeof prev_path);
        if (t == ENG_CHAT_TTL_1H && prev_path[0] != '\0') {
            elem_path(c, k, path, sizeof path);
            bool automatic = (long)k == auto_k && own == ENG_CHAT_TTL_NONE;
            return bad(p, automatic ? "cache_control" : NULL, NULL,
                       "%s%s%s: a cache_control with ttl '1h' cannot come after one with ttl "
                       "'5m' (%s.cache_control); longer TTLs must come first in the order tools, "
                       "system, messages",
                       automatic ? "cache_control (automatic, on " : path,
                       automatic ? path : ".cache_control", automatic ? ")" : "", prev_path);
        }
    }
    return 0;
}

/* ---- gw_api_parse ------------------------------------------------------------------------------
 */

static int json_error(pctx_t *p, const json_error_t *je)
{
    if (p->oai)
        return bad(p, NULL, NULL,
                   "We could not parse the JSON body of your request. (HINT: This likely means "
                   "you aren't using your HTTP library correctly. The OpenAI API expects a JSON "
                   "payload, but what was sent was not valid JSON. If you have trouble figuring "
                   "out how to fix this, please contact us through our help center at "
                   "help.openai.com.)");
    return bad(p, NULL, NULL, "The request body is not valid JSON: %s: line %d column %d (char %d)",
               je->text, je->line, je->column, je->position);
}

/* OpenAI's own wording for the top-level shape, before the adapter sees the body. */
static int oai_precheck(pctx_t *p, const json_t *body)
{
    const json_t *model = json_object_get(body, "model"), *msgs = json_object_get(body, "messages");
    if (model == NULL || json_is_null(model))
        return bad(p, "model", "missing_required_parameter",
                   "Missing required parameter: 'model'.");
    if (!json_is_string(model))
        return bad_type(p, "model", model, "a string", "");
    if (msgs == NULL || json_is_null(msgs))
        return bad(p, "messages", "missing_required_parameter",
                   "Missing required parameter: 'messages'.");
    if (!json_is_array(msgs))
        return bad_type(p, "messages", msgs, "an array", "");
    if (json_array_size(msgs) == 0)
        return bad(p, "messages", "empty_array",
                   "Invalid 'messages': empty array. Expected an array with minimum length 1, but "
                   "got an empty array instead.");
    return 0;
}

static int parse_salt(pctx_t *p, pc_arena_t *a, const json_t *body, gw_api_req_t *r)
{
    const json_t *v = json_object_get(body, "cache_salt");
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return bad_type(p, "cache_salt", v, "a string", "Input should be a valid string");
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    bool ok = n >= 1 && n <= GW_API_MAX_SALT_BYTES;
    for (size_t i = 0; ok && i < n; i++)
        ok = (unsigned char)s[i] >= 0x20 && s[i] != 0x7f;
    if (!ok)
        return bad(p, "cache_salt", "invalid_value",
                   "cache_salt: must be a string of 1 to %d bytes without control characters",
                   GW_API_MAX_SALT_BYTES);
    r->has_cache_salt = true;
    return copy_str(a, v, &r->cache_salt);
}

static int parse_sampling(pctx_t *p, const json_t *body, gw_api_req_t *r)
{
    double d;
    int64_t n;
    bool has;
    int rc;
    r->sampling = eng_sampling_params_default();
    if ((rc = get_number(p, body, "temperature", 0.0, p->oai ? 2.0 : 1.0, &d, &has)) != 0)
        return rc;
    if (has) {
        r->sampling.temperature = (float)d;
        r->has_temperature = true;
    }
    if (!p->oai) {
        if ((rc = get_int(p, body, "top_k", 0, UINT32_MAX, &n, &has)) != 0)
            return rc;
        if (has) {
            r->has_top_k = true;
            r->sampling.top_k = (uint32_t)n;
        }
    }
    if ((rc = get_number(p, body, "top_p", 0.0, 1.0, &d, &has)) != 0)
        return rc;
    if (has) {
        r->has_top_p = true;
        if (d > 0.0)
            r->sampling.top_p = (float)d;
        else
            r->sampling.top_k = 1; /* top_p 0 keeps only the most likely token */
    }
    if (p->oai) {
        if ((rc = get_int(p, body, "seed", INT64_MIN, INT64_MAX, &n, &has)) != 0)
            return rc;
        if (has) {
            r->has_seed = true;
            r->sampling.seed = (uint64_t)n;
        }
    }
    char why[256];
    if (eng_sampling_params_check(&r->sampling, why, sizeof why) != 0)
        return bad(p, NULL, NULL, "sampling parameters: %s", why);
    return 0;
}

static int parse_anthropic(pctx_t *p, pc_arena_t *a, const json_t *body, gw_api_req_t *r)
{
    int64_t n;
    bool has;
    int rc;
    if (r->kind == GW_API_ANTHROPIC_MESSAGES) {
        const json_t *mt = json_object_get(body, "max_tokens");
        if (mt == NULL)
            return bad(p, "max_tokens", NULL, "max_tokens: Field required");
        if ((rc = get_int(p, body, "max_tokens", 0, UINT32_MAX, &n, &has)) != 0)
            return rc;
        if (!has)
            return bad(p, "max_tokens", NULL, "max_tokens: Input should be a valid integer");
        r->max_tokens = (uint32_t)n;
        r->has_max_tokens = true;
        if ((rc = get_bool(p, body, "stream", &r->stream, NULL)) != 0 ||
            (rc = parse_sampling(p, body, r)) != 0 || (rc = parse_stop(p, a, body, r)) != 0)
            return rc;
        const json_t *md = json_object_get(body, "metadata");
        if (md != NULL && !json_is_null(md)) {
            if (!json_is_object(md))
                return bad(p, "metadata", NULL, "metadata: Input should be a valid dictionary");
            if ((rc = get_str(p, a, md, "user_id", "metadata.user_id", 256, &r->user_id, NULL)) !=
                0)
                return rc;
        }
    }
    if ((rc = anth_tool_choice(p, a, body, r)) != 0)
        return rc;
    if (r->kind == GW_API_ANTHROPIC_MESSAGES && r->max_tokens == 0) {
        if (r->stream)
            return bad(p, "max_tokens", NULL,
                       "max_tokens: 0 (cache pre-warming) cannot be combined with stream: true");
        if (r->tool_choice == GW_TOOL_CHOICE_ANY || r->tool_choice == GW_TOOL_CHOICE_TOOL)
            return bad(p, "max_tokens", NULL,
                       "max_tokens: 0 (cache pre-warming) cannot be combined with tool_choice "
                       "type '%s'",
                       r->tool_choice == GW_TOOL_CHOICE_ANY ? "any" : "tool");
        const json_t *th = json_object_get(body, "thinking"), *tt;
        if (json_is_object(th) && json_is_string(tt = json_object_get(th, "type")) &&
            strcmp(json_string_value(tt), "enabled") == 0)
            return bad(p, "max_tokens", NULL,
                       "max_tokens: 0 (cache pre-warming) cannot be combined with thinking");
    }
    return check_cache_control(p, r->chat);
}

static int parse_openai(pctx_t *p, pc_arena_t *a, const json_t *body, gw_api_req_t *r)
{
    int64_t n;
    bool has;
    int rc;
    if ((rc = get_int(p, body, "max_completion_tokens", 1, UINT32_MAX, &n, &has)) != 0)
        return rc;
    if (!has && (rc = get_int(p, body, "max_tokens", 1, UINT32_MAX, &n, &has)) != 0)
        return rc;
    if (has) {
        r->max_tokens = (uint32_t)n;
        r->has_max_tokens = true;
    }
    if ((rc = get_int(p, body, "n", 1, INT64_MAX, &n, &has)) != 0)
        return rc;
    if (has && n != 1) {
        bad(p, "n", "invalid_value",
            "Invalid 'n': kvgw serves one choice per request (n = 1), got %lld.", (long long)n);
        return PC_ERR_UNSUPPORTED;
    }
    if ((rc = get_bool(p, body, "stream", &r->stream, NULL)) != 0)
        return rc;
    const json_t *so = json_object_get(body, "stream_options");
    if (so != NULL && !json_is_null(so)) {
        if (!r->stream)
            return bad(p, "stream_options", "invalid_value",
                       "The 'stream_options' parameter is only allowed when 'stream' is "
                       "enabled.");
        if (!json_is_object(so))
            return bad_type(p, "stream_options", so, "an object", "");
        const json_t *iu = json_object_get(so, "include_usage");
        if (iu != NULL && !json_is_null(iu)) {
            if (!json_is_boolean(iu))
                return bad_type(p, "stream_options.include_usage", iu, "a boolean", "");
            r->include_usage = json_is_true(iu);
        }
    }
    if ((rc = parse_sampling(p, body, r)) != 0 || (rc = parse_stop(p, a, body, r)) != 0 ||
        (rc = oai_tool_choice(p, a, body, r)) != 0 ||
        (rc = get_str(p, a, body, "user", "user", 0, &r->user_id, NULL)) != 0 ||
        (rc = get_str(p, a, body, "prompt_cache_key", "prompt_cache_key", 0, &r->prompt_cache_key,
                      NULL)) != 0)
        return rc;
    return 0;
}

/* Every top-level field either API reads (api_parse.c and api_chat.c); the values of all
 * others are skipped unbuilt. A field read here but missing from this list would read as null:
 * test_api's known_fields_are_kept sends each one. */
static const char *const g_read_fields[] = {
    "cache_control",
    "cache_salt",
    "max_completion_tokens",
    "max_tokens",
    "messages",
    "metadata",
    "model",
    "n",
    "parallel_tool_calls",
    "prompt_cache_key",
    "seed",
    "stop",
    "stop_sequences",
    "stream",
    "stream_options",
    "system",
    "temperature",
    "thinking",
    "tool_choice",
    "tools",
    "top_k",
    "top_p",
    "user",
};

int gw_api_parse(gw_api_kind_t kind, const void *body, size_t len, pc_arena_t *arena,
                 gw_api_req_t **out, gw_api_error_t *err)
{
    pctx_t p = {kind, !gw_api_is_anthropic(kind), err};
    json_error_t je;
    json_t *j = NULL;
    gw_api_req_t *r = NULL;
    gw_json_budget_t budget;
    size_t max_mem = len > (SIZE_MAX - GW_API_JSON_MEM_BASE) / GW_API_JSON_MEM_PER_BYTE
                         ? SIZE_MAX
                         : GW_API_JSON_MEM_BASE + len * GW_API_JSON_MEM_PER_BYTE;
    int rc;

    memset(err, 0, sizeof *err);
    gw_json_budget_begin(&budget, max_mem);
    /* Duplicate keys are refused: a body must mean one thing ("model" twice is not "the last
     * one wins"). */
    j = gw_json_loadb_keep(body != NULL ? body : "", len, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES,
                           g_read_fields, PC_ARRAY_LEN(g_read_fields), &je);
    if (j == NULL) {
        rc = budget.oom ? PC_ERR_NOMEM : budget.over ? PC_ERR_NOSPACE : json_error(&p, &je);
        goto done;
    }
    if (!json_is_object(j)) {
        rc = p.oai ? bad(&p, NULL, "invalid_type",
                         "Invalid type for request body: expected an object, but got %s instead.",
                         gw__json_type_name(j, true))
                   : bad(&p, NULL, NULL, "request body: Input should be an object");
        goto done;
    }
    if (p.oai && (rc = oai_precheck(&p, j)) != 0)
        goto done;
    rc = PC_ERR_NOMEM;
    if ((r = pc_arena_new(arena, gw_api_req_t, 1)) == NULL)
        goto done;
    r->kind = kind;
    r->sampling = eng_sampling_params_default(); /* count_tokens has no sampling fields */
    rc = p.oai ? gw__chat_from_openai(j, arena, &r->chat, err->message, sizeof err->message)
               : gw__chat_from_anthropic(j, arena, &r->chat, err->message, sizeof err->message);
    if (rc == PC_ERR_INVAL || rc == PC_ERR_UNSUPPORTED) {
        err->status = 400;
        err->type = gw_api_error_type(kind, 400);
        if (p.oai) {
            gw__openai_param(err->message, err->param, sizeof err->param);
            err->code = rc == PC_ERR_UNSUPPORTED ? "unsupported_value" : "invalid_value";
        }
        goto done;
    }
    if (rc != 0)
        goto done;
    r->model = r->chat->model;
    rc = p.oai ? parse_openai(&p, arena, j, r) : parse_anthropic(&p, arena, j, r);
    if (rc == 0)
        rc = parse_salt(&p, arena, j, r);
done:
    gw_json_budget_end(&budget);
    /* Whatever failed after the budget ran out (or the allocator failed) failed because of it. */
    if (budget.over) {
        rc = PC_ERR_NOSPACE;
        gw_api_error_set(err, kind, 413,
                         "request body: its JSON needs more than %zu bytes of memory to parse "
                         "(%d per byte of its %zu bytes, plus %u); send fewer or smaller "
                         "elements",
                         max_mem, GW_API_JSON_MEM_PER_BYTE, len, GW_API_JSON_MEM_BASE);
    } else if (rc == PC_ERR_NOMEM || (rc != 0 && budget.oom)) {
        rc = PC_ERR_NOMEM;
        gw_api_error_set(err, kind, 500,
                         p.oai ? "The server had an error while processing your "
                                 "request (out of memory)."
                               : "Internal server error (out of memory)");
    }
    json_decref(j);
    if (rc == 0)
        *out = r;
    return rc;
}
