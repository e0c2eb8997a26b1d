/*
 * json_fast.c — gw_json_loadb (see json_fast.h): a recursive-descent parser for the JSON that
 * jansson accepts, building jansson values, falling back to json_loadb on anything else.
 *
 * The grammar is jansson 2.14's exactly (RFC 8259 with its choices): whitespace is space, tab,
 * LF and CR; the top level is an object or an array (no JSON_DECODE_ANY); strings are strict
 * UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF) with raw bytes below 0x20
 * refused; escapes are \" \\ \/ \b \f \n \r \t and \uXXXX, a high surrogate must be followed by
 * an escaped low one, \u0000 only with JSON_ALLOW_NUL; numbers are -?(0|[1-9][0-9]*) with
 * optional fraction and exponent, integers (no '.', 'e', 'E') through strtoll and reals through
 * strtod (the C locale: kvgw never calls setlocale), exactly as jansson converts them. Where
 * jansson would report an error or where this code prefers not to decide (a number out of
 * range, nesting deeper than FAST_MAX_DEPTH, a duplicate key, a NUL in a key), the fast path
 * gives up and json_loadb parses the body from the start.
 *
 * Skipping (gw_json_loadb_keep). The values of top-level keys the caller does not read are
 * checked against the same grammar by the skip_* functions, which build nothing: their only
 * memory is the scratch for escaped strings and, with JSON_REJECT_DUPLICATES, the spans of the
 * keys of the objects being skipped (16 bytes a key, sorted when the object closes to find a
 * duplicate). Where skipping cannot decide as jansson would (an escaped key inside a skipped
 * value, a duplicate, anything the fast path gives up on) the whole body goes to json_loadb.
 *
 * Budget. Every jansson allocation goes through j_malloc (installed once, see
 * gw_json_hooks_install); while a thread has a budget (gw_json_budget_begin), it goes through
 * the project's hooks and each allocation of jansson and of this file is taken from the
 * budget: one that does not fit fails (and every later one: the budget is spent). The budget counts
 * bytes requested, not bytes held, so it bounds the peak from above.
 */
#include "json_fast.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pc_alloc.h"
#include "pc_utf8.h"

#define FAST_MAX_DEPTH 256 /* deeper documents go to jansson (its own limit is 2048) */
#define FAST_MAX_NUMBER 64 /* longer number lexemes go to jansson */

typedef struct skey {
    const char *s; /* a span of the input (keys with escapes are never stored) */
    size_t n;
} skey_t;

typedef struct fast {
    const unsigned char *p, *end;
    size_t flags;
    int depth;
    char *scratch; /* decoded strings with escapes */
    size_t scratch_len, scratch_cap;
    /* gw_json_loadb_keep: the top-level keys whose values are built ([n_keep]; NULL = all). */
    const char *const *keep;
    size_t n_keep;
    skey_t *keys; /* keys of the objects being skipped, innermost last */
    size_t n_keys, cap_keys;
} fast_t;

/* ---- allocation budget ----------------------------------------------------------------------- */

static _Thread_local gw_json_budget_t *tl_budget;
static _Thread_local bool tl_oom; /* an allocation failed since gw_json_loadb_keep started */
static pthread_once_t g_hooks_once = PTHREAD_ONCE_INIT;

/* Takes n bytes from this thread's budget, if it has one; false (and the budget is spent)
 * when they do not fit. */
static bool budget_take(size_t n)
{
    gw_json_budget_t *b = tl_budget;
    if (b == NULL)
        return true;
    if (b->over || n > b->max_bytes - b->used) {
        b->over = true;
        return false;
    }
    b->used += n;
    return true;
}

/* jansson's allocator. Outside a budget it is the C library's, as jansson's own default
 * (callers such as engine/render.c read a failed json_loadb as "not JSON"); inside one it is
 * the project's hooks, so gw_api_parse's tests see and fail its allocations. j_free serves both:
 * the project's default allocator is the C library's, and test allocators wrap it. */
static void *j_malloc(size_t n)
{
    if (tl_budget == NULL)
        return malloc(n);
    if (!budget_take(n))
        return NULL;
    void *p = pc_malloc(n);
    if (p == NULL) {
        tl_oom = true;
        if (tl_budget != NULL)
            tl_budget->oom = true;
    }
    return p;
}

static void j_free(void *p)
{
    pc_free(p);
}

static void hooks_install(void)
{
    json_set_alloc_funcs(j_malloc, j_free);
}

void gw_json_hooks_install(void)
{
    pthread_once(&g_hooks_once, hooks_install);
}

/* Installed before main: json_set_alloc_funcs is not thread-safe against other threads in
 * jansson, and the first gw_json_loadb runs on a pool thread. */
__attribute__((constructor)) static void hooks_at_start(void)
{
    gw_json_hooks_install();
}

void gw_json_budget_begin(gw_json_budget_t *b, size_t max_bytes)
{
    gw_json_hooks_install();
    memset(b, 0, sizeof *b);
    b->max_bytes = max_bytes;
    tl_budget = b;
}

void gw_json_budget_end(gw_json_budget_t *b)
{
    if (tl_budget == b)
        tl_budget = NULL;
}

/* pc_realloc through the budget (counting the new size: the old block is freed). */
static void *f_realloc(void *p, size_t n)
{
    if (!budget_take(n))
        return NULL;
    void *q = pc_realloc(p, n);
    if (q == NULL) {
        tl_oom = true;
        if (tl_budget != NULL)
            tl_budget->oom = true;
    }
    return q;
}

static void skip_ws(fast_t *f)
{
    while (f->p < f->end && (*f->p == ' ' || *f->p == '\t' || *f->p == '\n' || *f->p == '\r'))
        f->p++;
}

static int scratch_put(fast_t *f, const void *b, size_t n)
{
    if (n == 0)
        return 0;
    if (f->scratch_len + n > f->scratch_cap) {
        size_t cap = f->scratch_cap != 0 ? f->scratch_cap : 256;
        while (cap < f->scratch_len + n)
            cap *= 2;
        char *p = f_realloc(f->scratch, cap);
        if (p == NULL)
            return -1;
        f->scratch = p;
        f->scratch_cap = cap;
    }
    memcpy(f->scratch + f->scratch_len, b, n);
    f->scratch_len += n;
    return 0;
}

static int hex4(const unsigned char *s, const unsigned char *end, uint32_t *out)
{
    uint32_t v = 0;
    if (end - s < 4)
        return -1;
    for (int i = 0; i < 4; i++) {
        unsigned c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if (c >= 'a' && c <= 'f')
            v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v |= c - 'A' + 10;
        else
            return -1;
    }
    *out = v;
    return 0;
}

/* cp is neither a surrogate nor above U+10FFFF (escape() checked). */
static int put_utf8(fast_t *f, uint32_t cp)
{
    unsigned char b[4];
    return scratch_put(f, b, pc_utf8_encode(cp, b));
}

/* One escape after the backslash at f->p[-1], decoded into the scratch. */
static int escape(fast_t *f)
{
    if (f->p >= f->end)
        return -1;
    unsigned c = *f->p++;
    char e;
    switch (c) {
    case '"':
    case '\\':
    case '/':
        e = (char)c;
        return scratch_put(f, &e, 1);
    case 'b':
        return scratch_put(f, "\b", 1);
    case 'f':
        return scratch_put(f, "\f", 1);
    case 'n':
        return scratch_put(f, "\n", 1);
    case 'r':
        return scratch_put(f, "\r", 1);
    case 't':
        return scratch_put(f, "\t", 1);
    case 'u':
        break;
    default:
        return -1;
    }
    uint32_t cp, lo;
    if (hex4(f->p, f->end, &cp) != 0)
        return -1;
    f->p += 4;
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        if (f->end - f->p < 6 || f->p[0] != '\\' || f->p[1] != 'u' ||
            hex4(f->p + 2, f->end, &lo) != 0 || lo < 0xDC00 || lo > 0xDFFF)
            return -1;
        f->p += 6;
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
        return -1;
    } else if (cp == 0 && !(f->flags & JSON_ALLOW_NUL)) {
        return -1;
    }
    return put_utf8(f, cp);
}

/* A string after its opening quote. On success *s, *n is its decoded text: a span of the input
 * when it has no escapes, else the scratch (valid until the next string). */
static int string(fast_t *f, const char **s, size_t *n)
{
    const unsigned char *start = f->p;
    bool escaped = false;
    for (;;) {
        while (f->p < f->end && *f->p >= 0x20 && *f->p < 0x80 && *f->p != '"' && *f->p != '\\')
            f->p++;
        if (f->p >= f->end)
            return -1;
        unsigned c = *f->p;
        if (c == '"') {
            if (!escaped) {
                *s = (const char *)start;
                *n = (size_t)(f->p - start);
            } else {
                if (scratch_put(f, start, (size_t)(f->p - start)) != 0)
                    return -1;
                *s = f->scratch;
                *n = f->scratch_len;
            }
            f->p++;
            return 0;
        }
        if (c < 0x20)
            return -1;
        if (c >= 0x80) {
            size_t k = pc_utf8_seq_len(f->p, (size_t)(f->end - f->p));
            if (k == 0)
                return -1;
            f->p += k;
            continue;
        }
        /* A backslash: from here on the string is built in the scratch. */
        if (!escaped) {
            escaped = true;
            f->scratch_len = 0;
        }
        if (scratch_put(f, start, (size_t)(f->p - start)) != 0)
            return -1;
        f->p++;
        if (escape(f) != 0)
            return -1;
        start = f->p;
    }
}

/* Lexes a number: *real says which of *iv, *dv holds it. -1: give up (bad syntax, too long, out
 * of range). */
static int lex_number(fast_t *f, bool *real_out, long long *iv, double *dv)
{
    const unsigned char *s = f->p;
    bool real = false;
    if (f->p < f->end && *f->p == '-')
        f->p++;
    if (f->p < f->end && *f->p == '0') {
        f->p++;
        if (f->p < f->end && *f->p >= '0' && *f->p <= '9')
            return -1;
    } else if (f->p < f->end && *f->p >= '1' && *f->p <= '9') {
        while (f->p < f->end && *f->p >= '0' && *f->p <= '9')
            f->p++;
    } else {
        return -1;
    }
    if (f->p < f->end && *f->p == '.') {
        real = true;
        f->p++;
        if (f->p >= f->end || *f->p < '0' || *f->p > '9')
            return -1;
        while (f->p < f->end && *f->p >= '0' && *f->p <= '9')
            f->p++;
    }
    if (f->p < f->end && (*f->p == 'e' || *f->p == 'E')) {
        real = true;
        f->p++;
        if (f->p < f->end && (*f->p == '+' || *f->p == '-'))
            f->p++;
        if (f->p >= f->end || *f->p < '0' || *f->p > '9')
            return -1;
        while (f->p < f->end && *f->p >= '0' && *f->p <= '9')
            f->p++;
    }
    size_t n = (size_t)(f->p - s);
    char buf[FAST_MAX_NUMBER];
    if (n >= sizeof buf)
        return -1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    errno = 0;
    *real_out = real;
    if (!real)
        *iv = strtoll(buf, NULL, 10);
    else
        *dv = strtod(buf, NULL);
    return errno == ERANGE ? -1 : 0;
}

static json_t *number(fast_t *f)
{
    bool real;
    long long iv = 0;
    double dv = 0;
    if (lex_number(f, &real, &iv, &dv) != 0)
        return NULL;
    return real ? json_real(dv) : json_integer(iv);
}

static json_t *value(fast_t *f);
static int skip_value(fast_t *f);

static bool kept(const fast_t *f, const char *k, size_t kn)
{
    for (size_t i = 0; i < f->n_keep; i++)
        if (strlen(f->keep[i]) == kn && memcmp(f->keep[i], k, kn) == 0)
            return true;
    return false;
}

static json_t *object(fast_t *f)
{
    json_t *o = json_object();
    if (o == NULL)
        return NULL;
    skip_ws(f);
    if (f->p < f->end && *f->p == '}') {
        f->p++;
        return o;
    }
    for (;;) {
        const char *k;
        size_t kn;
        char *kcopy = NULL;
        if (f->p >= f->end || *f->p != '"')
            goto fail;
        f->p++;
        if (string(f, &k, &kn) != 0 || memchr(k, '\0', kn) != NULL)
            goto fail;
        if (k == f->scratch) { /* the value's strings reuse the scratch */
            if ((kcopy = f_realloc(NULL, kn + 1)) == NULL)
                goto fail;
            memcpy(kcopy, k, kn);
            k = kcopy;
        }
        skip_ws(f);
        json_t *v = NULL;
        if (f->p < f->end && *f->p == ':') {
            f->p++;
            if (f->depth == 1 && f->keep != NULL && !kept(f, k, kn))
                v = skip_value(f) == 0 ? json_null() : NULL;
            else
                v = value(f);
        }
        /* A duplicate key: jansson refuses it or keeps the last; let it decide. */
        if (v == NULL || json_object_getn(o, k, kn) != NULL) {
            json_decref(v);
            pc_free(kcopy);
            goto fail;
        }
        if (json_object_setn_new_nocheck(o, k, kn, v) != 0) { /* it released v */
            pc_free(kcopy);
            goto fail;
        }
        pc_free(kcopy);
        skip_ws(f);
        if (f->p >= f->end)
            goto fail;
        if (*f->p == '}') {
            f->p++;
            return o;
        }
        if (*f->p != ',')
            goto fail;
        f->p++;
        skip_ws(f);
    }
fail:
    json_decref(o);
    return NULL;
}

static json_t *array(fast_t *f)
{
    json_t *a = json_array();
    if (a == NULL)
        return NULL;
    skip_ws(f);
    if (f->p < f->end && *f->p == ']') {
        f->p++;
        return a;
    }
    for (;;) {
        if (json_array_append_new(a, value(f)) != 0)
            goto fail;
        skip_ws(f);
        if (f->p >= f->end)
            goto fail;
        if (*f->p == ']') {
            f->p++;
            return a;
        }
        if (*f->p != ',')
            goto fail;
        f->p++;
    }
fail:
    json_decref(a);
    return NULL;
}

static bool word(fast_t *f, const char *w, size_t n)
{
    if ((size_t)(f->end - f->p) < n || memcmp(f->p, w, n) != 0)
        return false;
    f->p += n;
    /* jansson reads a whole run of letters as one word. */
    return f->p >= f->end || !((*f->p >= 'a' && *f->p <= 'z') || (*f->p >= 'A' && *f->p <= 'Z'));
}

/* Any value, after leading whitespace. NULL: give up. */
static json_t *value(fast_t *f)
{
    skip_ws(f);
    if (f->p >= f->end)
        return NULL;
    json_t *v = NULL;
    switch (*f->p) {
    case '{':
    case '[':
        if (++f->depth > FAST_MAX_DEPTH)
            return NULL;
        f->p++;
        v = f->p[-1] == '{' ? object(f) : array(f);
        f->depth--;
        return v;
    case '"': {
        const char *s;
        size_t n;
        f->p++;
        return string(f, &s, &n) == 0 ? json_stringn_nocheck(s, n) : NULL;
    }
    case 't':
        return word(f, "true", 4) ? json_true() : NULL;
    case 'f':
        return word(f, "false", 5) ? json_false() : NULL;
    case 'n':
        return word(f, "null", 4) ? json_null() : NULL;
    default:
        return number(f);
    }
}

/* ---- skipping ---------------------------------------------------------------------------------
 */

static int skey_cmp(const void *a, const void *b)
{
    const skey_t *x = a, *y = b;
    if (x->n != y->n)
        return x->n < y->n ? -1 : 1;
    return memcmp(x->s, y->s, x->n);
}

/* An object after its '{', built nowhere. */
static int skip_object(fast_t *f)
{
    size_t base = f->n_keys;
    bool dups = (f->flags & JSON_REJECT_DUPLICATES) != 0;
    skip_ws(f);
    if (f->p < f->end && *f->p == '}') {
        f->p++;
        return 0;
    }
    for (;;) {
        const char *k;
        size_t kn;
        if (f->p >= f->end || *f->p != '"')
            return -1;
        f->p++;
        if (string(f, &k, &kn) != 0 || k == f->scratch) /* an escaped key: jansson decides */
            return -1;
        if (dups) {
            if (f->n_keys == f->cap_keys) {
                size_t cap = f->cap_keys != 0 ? 2 * f->cap_keys : 64;
                skey_t *a = f_realloc(f->keys, cap * sizeof *a);
                if (a == NULL)
                    return -1;
                f->keys = a;
                f->cap_keys = cap;
            }
            f->keys[f->n_keys++] = (skey_t){k, kn};
        }
        skip_ws(f);
        if (f->p >= f->end || *f->p != ':')
            return -1;
        f->p++;
        if (skip_value(f) != 0)
            return -1;
        skip_ws(f);
        if (f->p >= f->end)
            return -1;
        if (*f->p == '}') {
            f->p++;
            break;
        }
        if (*f->p != ',')
            return -1;
        f->p++;
        skip_ws(f);
    }
    /* A duplicate key: let jansson report it. */
    size_t n = f->n_keys - base;
    if (n > 1) {
        qsort(f->keys + base, n, sizeof *f->keys, skey_cmp);
        for (size_t i = base + 1; i < f->n_keys; i++)
            if (skey_cmp(&f->keys[i - 1], &f->keys[i]) == 0)
                return -1;
    }
    f->n_keys = base;
    return 0;
}

static int skip_array(fast_t *f)
{
    skip_ws(f);
    if (f->p < f->end && *f->p == ']') {
        f->p++;
        return 0;
    }
    for (;;) {
        if (skip_value(f) != 0)
            return -1;
        skip_ws(f);
        if (f->p >= f->end)
            return -1;
        if (*f->p == ']') {
            f->p++;
            return 0;
        }
        if (*f->p != ',')
            return -1;
        f->p++;
    }
}

/* Any value, after leading whitespace, checked as value() would parse it; 0 or -1 (give up). */
static int skip_value(fast_t *f)
{
    skip_ws(f);
    if (f->p >= f->end)
        return -1;
    switch (*f->p) {
    case '{':
    case '[': {
        if (++f->depth > FAST_MAX_DEPTH)
            return -1;
        f->p++;
        int rc = f->p[-1] == '{' ? skip_object(f) : skip_array(f);
        f->depth--;
        return rc;
    }
    case '"': {
        const char *s;
        size_t n;
        f->p++;
        return string(f, &s, &n);
    }
    case 't':
        return word(f, "true", 4) ? 0 : -1;
    case 'f':
        return word(f, "false", 5) ? 0 : -1;
    case 'n':
        return word(f, "null", 4) ? 0 : -1;
    default: {
        bool real;
        long long iv;
        double dv;
        return lex_number(f, &real, &iv, &dv);
    }
    }
}

/* ---- entry points ------------------------------------------------------------------------------
 */

static json_t *fast_only(const char *buf, size_t len, size_t flags, const char *const *keep,
                         size_t n_keep)
{
    if (buf == NULL || (flags & ~(size_t)(JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES)) != 0)
        return NULL;
    fast_t f = {(const unsigned char *)buf,
                (const unsigned char *)buf + len,
                flags,
                0,
                NULL,
                0,
                0,
                keep,
                n_keep,
                NULL,
                0,
                0};
    json_t *j = NULL;
    skip_ws(&f);
    if (f.p < f.end && (*f.p == '{' || *f.p == '[')) {
        j = value(&f);
        skip_ws(&f);
        if (j != NULL && f.p != f.end) {
            json_decref(j);
            j = NULL;
        }
    }
    pc_free(f.scratch);
    pc_free(f.keys);
    return j;
}

json_t *gw__json_fast_only(const char *buf, size_t len, size_t flags)
{
    return fast_only(buf, len, flags, NULL, 0);
}

json_t *gw__json_fast_only_keep(const char *buf, size_t len, size_t flags, const char *const *keep,
                                size_t n_keep)
{
    return fast_only(buf, len, flags, keep, n_keep);
}

json_t *gw_json_loadb(const char *buf, size_t len, size_t flags, json_error_t *err)
{
    return gw_json_loadb_keep(buf, len, flags, NULL, 0, err);
}

json_t *gw_json_loadb_keep(const char *buf, size_t len, size_t flags, const char *const *keep,
                           size_t n_keep, json_error_t *err)
{
    gw_json_hooks_install();
    tl_oom = false;
    json_t *j = fast_only(buf, len, flags, keep, n_keep);
    if (j == NULL && (tl_oom || (tl_budget != NULL && tl_budget->over))) {
        /* Out of memory (or budget): jansson would fail the same way, after more work. */
        if (err != NULL) {
            memset(err, 0, sizeof *err);
            err->line = err->column = -1;
            snprintf(err->source, sizeof err->source, "%s", "<buffer>");
            snprintf(err->text, sizeof err->text, "%s", "out of memory");
        }
        return NULL;
    }
    if (j == NULL) {
        j = json_loadb(buf, len, flags, err);
        if (j != NULL && keep != NULL && json_is_object(j)) {
            /* The same tree the fast path gives: unkept top-level values are null. */
            for (void *it = json_object_iter(j); it != NULL; it = json_object_iter_next(j, it)) {
                const char *k = json_object_iter_key(it);
                fast_t f = {.keep = keep, .n_keep = n_keep};
                if (!kept(&f, k, json_object_iter_key_len(it)))
                    json_object_iter_set_new(j, it, json_null());
            }
        }
        return j;
    }
    if (err != NULL) { /* what json_loadb leaves in it on success */
        memset(err, 0, sizeof *err);
        err->line = -1;
        err->column = -1;
        snprintf(err->source, sizeof err->source, "%s", "<buffer>");
    }
    return j;
}
