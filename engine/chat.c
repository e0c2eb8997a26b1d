/*
 * chat.c — helpers of the neutral chat model (see chat.h) and the Python-compatible JSON writer
 * the renderer uses for tool definitions and calls. The Anthropic and OpenAI JSON adapters that
 * fill an eng_chat_t live in the gateway (gateway/api_chat.c): API field names and API error
 * texts are the gateway's business.
 */
#include "chat.h"
#include "chat_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pc_alloc.h"
#include "pc_err.h"
#include "pc_json.h"

const char *eng_chat_ttl_name(eng_chat_ttl_t ttl)
{
    switch (ttl) {
    case ENG_CHAT_TTL_5M:
        return "5m";
    case ENG_CHAT_TTL_1H:
        return "1h";
    default:
        return "none";
    }
}

size_t eng_chat_n_blocks(const eng_chat_t *c)
{
    size_t n = 0;
    for (size_t i = 0; i < c->n_messages; i++)
        n += c->messages[i].n_blocks;
    return n;
}

/* ---- JSON writer ---------------------------------------------------------------------- */

static int put(pc_buf_t *b, const char *s, size_t n)
{
    return pc_buf_append(b, s, n);
}
#define PUTS(b, lit) put((b), (lit), sizeof(lit) - 1)

/* Python's repr(float): the shortest digit string that reads back to the same double, in
 * fixed notation when the decimal exponent is in [-4, 16), else d.ddde+XX. */
static int write_real(pc_buf_t *b, double v)
{
    char tmp[40], digits[24], out[64];
    int prec, exp10 = 0;
    if (!isfinite(v)) /* jansson cannot hold these; written as Python would */
        return pc_buf_append_cstr(b, isnan(v) ? "NaN" : (v < 0 ? "-Infinity" : "Infinity"));
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, v);
        if (strtod(tmp, NULL) == v)
            break;
    }
    /* tmp = [-]d[.ddd]e[+-]XX */
    const char *p = tmp;
    bool neg = *p == '-';
    if (neg)
        p++;
    size_t nd = 0;
    for (; *p != 'e'; p++)
        if (*p != '.')
            digits[nd++] = *p;
    exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    int decpt = exp10 + 1; /* digits d1d2... = 0.d1d2... x 10^decpt */
    size_t o = 0;
    if (neg)
        out[o++] = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -decpt; i++)
                out[o++] = '0';
            memcpy(out + o, digits, nd);
            o += nd;
        } else {
            for (int i = 0; i < decpt; i++)
                out[o++] = (size_t)i < nd ? digits[i] : '0';
            out[o++] = '.';
            if ((size_t)decpt < nd) {
                memcpy(out + o, digits + decpt, nd - (size_t)decpt);
                o += nd - (size_t)decpt;
            } else {
                out[o++] = '0';
            }
        }
        out[o] = '\0';
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            memcpy(out + o, digits + 1, nd - 1);
            o += nd - 1;
        }
        snprintf(out + o, sizeof out - o, "e%c%02d", decpt - 1 < 0 ? '-' : '+', abs(decpt - 1));
    }
    return pc_buf_append_cstr(b, out);
}

static int write_indent(pc_buf_t *b, int depth)
{
    if (PUTS(b, "\n") != 0)
        return PC_ERR_NOMEM;
    for (int i = 0; i < depth; i++)
        if (PUTS(b, "    ") != 0)
            return PC_ERR_NOMEM;
    return 0;
}

static int write_value(pc_buf_t *b, const json_t *v, enum eng__json_style style, int depth)
{
    const char *item_sep = style == ENG__JSON_PY ? ", " : ",";
    const char *key_sep = style == ENG__JSON_COMPACT ? ":" : ": ";
    bool indent = style == ENG__JSON_PY_INDENT4;
    if (depth > 512)
        return PC_ERR_RANGE;
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *key;
        json_t *val;
        size_t i = 0;
        if (json_object_size(v) == 0)
            return PUTS(b, "{}");
        if (PUTS(b, "{") != 0)
            return PC_ERR_NOMEM;
        json_object_foreach((json_t *)v, key, val)
        {
            int rc;
            if (i++ > 0 && pc_buf_append_cstr(b, item_sep) != 0)
                return PC_ERR_NOMEM;
            if (indent && write_indent(b, depth + 1) != 0)
                return PC_ERR_NOMEM;
            if (pc_json_string(b, key, strlen(key), 0) != 0 || pc_buf_append_cstr(b, key_sep) != 0)
                return PC_ERR_NOMEM;
            if ((rc = write_value(b, val, style, depth + 1)) != 0)
                return rc;
        }
        if (indent && write_indent(b, depth) != 0)
            return PC_ERR_NOMEM;
        return PUTS(b, "}");
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(v);
        if (n == 0)
            return PUTS(b, "[]");
        if (PUTS(b, "[") != 0)
            return PC_ERR_NOMEM;
        for (size_t i = 0; i < n; i++) {
            int rc;
            if (i > 0 && pc_buf_append_cstr(b, item_sep) != 0)
                return PC_ERR_NOMEM;
            if (indent && write_indent(b, depth + 1) != 0)
                return PC_ERR_NOMEM;
            if ((rc = write_value(b, json_array_get(v, i), style, depth + 1)) != 0)
                return rc;
        }
        if (indent && write_indent(b, depth) != 0)
            return PC_ERR_NOMEM;
        return PUTS(b, "]");
    }
    case JSON_STRING:
        return pc_json_string(b, json_string_value(v), json_string_length(v), 0);
    case JSON_INTEGER:
        return pc_buf_printf(b, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    case JSON_REAL:
        return write_real(b, json_real_value(v));
    case JSON_TRUE:
        return PUTS(b, "true");
    case JSON_FALSE:
        return PUTS(b, "false");
    case JSON_NULL:
        return PUTS(b, "null");
    }
    return PC_ERR_INVAL;
}

int eng__json_write(pc_buf_t *b, const json_t *v, enum eng__json_style style)
{
    return write_value(b, v, style, 0);
}

int eng_chat_json_compact(pc_buf_t *b, const json_t *v)
{
    return write_value(b, v, ENG__JSON_COMPACT, 0);
}
