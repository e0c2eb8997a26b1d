/*
 * test_json_fast.c — tests gateway/json_fast.c against jansson itself: for generated
 * documents (every value type, escapes, surrogate pairs, raw UTF-8, numbers at the edges of
 * their ranges, odd whitespace) and for random byte mutations of them, gw_json_loadb must give
 * exactly json_loadb's result: the same tree (types, values, key order) or the same error.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "json_fast.h"
#include "pc_test.h"

#define FLAGS (JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES)

static uint64_t g_rng;
static uint32_t rnd(uint32_t n)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng % n);
}

static const char *const g_ws[] = {"", "", "", " ", "\n", "\t", "\r\n  ", " \f", "\v"};
static const char *const g_str_parts[] = {
    "plain",
    " text ",
    "\\\"",
    "\\\\",
    "\\/",
    "\\b\\f\\n\\r\\t",
    "\\u0041",
    "\\u00e9",
    "\\u20AC",
    "\\ud83d\\ude00",
    "\\u0000",
    "é",
    "日本",
    "😀",
    "\\ud83d",
    "\\ude00",
    "\\x",
    "\\u12",
    "\t",
    "\x01",
    "\xc3",
    "\xed\xa0\x80",
    "\xc0\x80",
    "\xf4\x90\x80\x80",
    "\xef\xbf\xbf",
    "\xf0\x9f\x98\x80",
    "'",
    "<|eot_id|>",
    "\\uD800\\uDC00",
    "\\uDBFF\\uDFFF",
};
static const char *const g_numbers[] = {
    "0",
    "-0",
    "1",
    "-1",
    "42",
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
    "-9223372036854775809",
    "0.5",
    "-0.25",
    "1e3",
    "1E-3",
    "1e+3",
    "2.5e10",
    "1e400",
    "-1e400",
    "1e-400",
    "01",
    "1.",
    ".5",
    "-",
    "1e",
    "1e+",
    "0.0000001",
    "3.141592653589793238462643383279",
    "123456789012345678901234567890",
    "1.5x",
    "-a",
};

static void ws(pc_buf_t *b)
{
    pc_buf_append_cstr(b, g_ws[rnd(PC_ARRAY_LEN(g_ws))]);
}

static void gen_string(pc_buf_t *b)
{
    pc_buf_append_cstr(b, "\"");
    size_t n = rnd(6);
    for (size_t i = 0; i < n; i++)
        pc_buf_append_cstr(b, g_str_parts[rnd(PC_ARRAY_LEN(g_str_parts))]);
    if (rnd(20) == 0) { /* a long plain run, as in a system prompt */
        for (int i = 0; i < 200; i++)
            pc_buf_append_cstr(b, "Section: the ledger bills cached tokens. ");
    }
    pc_buf_append_cstr(b, "\"");
}

static void gen_value(pc_buf_t *b, int depth)
{
    uint32_t k = depth > 5 ? 2 + rnd(5) : rnd(7);
    ws(b);
    switch (k) {
    case 0: {
        size_t n = rnd(5);
        pc_buf_append_cstr(b, "{");
        for (size_t i = 0; i < n; i++) {
            if (i > 0)
                pc_buf_append_cstr(b, ",");
            ws(b);
            if (rnd(4) == 0)
                gen_string(b);
            else
                pc_buf_printf(b, "\"k%u\"", rnd(6)); /* duplicates now and then */
            ws(b);
            pc_buf_append_cstr(b, ":");
            gen_value(b, depth + 1);
        }
        ws(b);
        pc_buf_append_cstr(b, "}");
        break;
    }
    case 1: {
        size_t n = rnd(5);
        pc_buf_append_cstr(b, "[");
        for (size_t i = 0; i < n; i++) {
            if (i > 0)
                pc_buf_append_cstr(b, ",");
            gen_value(b, depth + 1);
        }
        ws(b);
        pc_buf_append_cstr(b, "]");
        break;
    }
    case 2:
    case 3:
        gen_string(b);
        break;
    case 4:
        pc_buf_append_cstr(b, g_numbers[rnd(PC_ARRAY_LEN(g_numbers))]);
        break;
    case 5:
        pc_buf_append_cstr(b, rnd(2) ? "true" : "false");
        break;
    default:
        pc_buf_append_cstr(b, rnd(8) == 0 ? "nul" : "null");
        break;
    }
    ws(b);
}

static long g_n_same_tree, g_n_same_error, g_n_fast;

/* jansson's tree with the values of the top-level keys other than keep[] set to null. */
static void null_unkept(json_t *a, const char *const *keep, size_t n_keep)
{
    if (!json_is_object(a))
        return;
    for (void *it = json_object_iter(a); it != NULL; it = json_object_iter_next(a, it)) {
        bool k = false;
        for (size_t i = 0; i < n_keep; i++)
            k = k || strcmp(json_object_iter_key(it), keep[i]) == 0;
        if (!k)
            json_object_iter_set_new(a, it, json_null());
    }
}

static void same_dump(const json_t *a, const json_t *b)
{
    char *da = json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY);
    char *db = json_dumps(b, JSON_COMPACT | JSON_ENCODE_ANY);
    ASSERT_TRUE(da != NULL && db != NULL);
    if (strcmp(da, db) != 0)
        fprintf(stderr, "  trees differ:\n  %s\n  %s\n", da, db);
    ASSERT_STR_EQ(da, db);
    free(da);
    free(db);
}

static long g_n_keep_fast;

/* gw_json_loadb_keep (top-level "k" skipped, "a" kept) against jansson: jansson's tree with the
 * skipped values null, or the same error. */
static void compare_keep(const char *s, size_t n, size_t flags)
{
    static const char *const keep[] = {"a", "model"};
    json_error_t e1, e2;
    json_t *a = json_loadb(s, n, flags, &e1);
    json_t *b = gw_json_loadb_keep(s, n, flags, keep, 2, &e2);
    json_t *f = gw__json_fast_only_keep(s, n, flags, keep, 2);
    if ((a == NULL) != (b == NULL))
        fprintf(stderr, "  keep: jansson %s, fast %s on: %.*s\n", a ? "accepts" : e1.text,
                b ? "accepts" : e2.text, (int)(n < 300 ? n : 300), s);
    ASSERT_EQ(a == NULL, b == NULL);
    if (f != NULL) {
        ASSERT_TRUE(a != NULL);
        g_n_keep_fast++;
    }
    if (a == NULL) {
        ASSERT_STR_EQ(e1.text, e2.text);
        ASSERT_EQ(e1.position, e2.position);
    } else {
        null_unkept(a, keep, 2);
        PC_TEST_CALL(same_dump(a, b));
        if (f != NULL)
            PC_TEST_CALL(same_dump(a, f));
    }
    json_decref(a);
    json_decref(b);
    json_decref(f);
}

/* Both parsers on the same bytes: the same tree or the same error. */
static void compare(const char *s, size_t n, size_t flags)
{
    PC_TEST_CALL(compare_keep(s, n, flags));
    json_error_t e1, e2;
    json_t *a = json_loadb(s, n, flags, &e1);
    json_t *b = gw_json_loadb(s, n, flags, &e2);
    /* Whatever the fast path accepts on its own, jansson accepts with the same tree. */
    json_t *f = gw__json_fast_only(s, n, flags);
    if (f != NULL) {
        ASSERT_TRUE(a != NULL);
        ASSERT_TRUE(json_equal(a, f));
        char *da = json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY);
        char *df = json_dumps(f, JSON_COMPACT | JSON_ENCODE_ANY);
        ASSERT_TRUE(da != NULL && df != NULL);
        ASSERT_STR_EQ(da, df);
        free(da);
        free(df);
        json_decref(f);
        g_n_fast++;
    }
    if ((a == NULL) != (b == NULL))
        fprintf(stderr, "  jansson %s, fast %s on: %.*s\n", a ? "accepts" : e1.text,
                b ? "accepts" : e2.text, (int)(n < 300 ? n : 300), s);
    ASSERT_EQ(a == NULL, b == NULL);
    if (a == NULL) {
        ASSERT_STR_EQ(e1.text, e2.text);
        ASSERT_EQ(e1.line, e2.line);
        ASSERT_EQ(e1.column, e2.column);
        ASSERT_EQ(e1.position, e2.position);
        g_n_same_error++;
        return;
    }
    ASSERT_TRUE(json_equal(a, b));
    char *da = json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY);
    char *db = json_dumps(b, JSON_COMPACT | JSON_ENCODE_ANY);
    ASSERT_TRUE(da != NULL && db != NULL);
    if (strcmp(da, db) != 0)
        fprintf(stderr, "  trees differ:\n  %s\n  %s\n", da, db);
    ASSERT_STR_EQ(da, db); /* key order included */
    free(da);
    free(db);
    json_decref(a);
    json_decref(b);
    g_n_same_tree++;
}

PC_TEST(fixed_cases)
{
    static const char *const cases[] = {
        "{}",
        "[]",
        " {} ",
        "{\"a\":1}",
        "{\"a\":1,}",
        "[1,]",
        "[1 2]",
        "{\"a\" 1}",
        "{1:2}",
        "{\"a\":1,\"a\":2}",
        "{\"a\\u0000b\":1}",
        "[\"a\\u0000b\"]",
        "[\"\\ud800\"]",
        "[\"\\udc00\"]",
        "[\"\\ud800\\u0041\"]",
        "[truex]",
        "[true1]",
        "[nul]",
        "[-]",
        "[01]",
        "[1.]",
        "[1e]",
        "[.5]",
        "[1e400]",
        "[1e-400]",
        "[9223372036854775808]",
        "\"top\"",
        "1",
        "",
        "   ",
        "{",
        "[",
        "{\"a\":",
        "[\"abc",
        "[\"\\",
        "[\"\\u12\"]",
        "{} x",
        "{}\0",
        "[\"a\tb\"]",
        "[\"\xc3\xa9\"]",
        "[\"\xc3\"]",
        "[\"\xed\xa0\x80\"]",
        "[\"\xf4\x90\x80\x80\"]",
        "[\"\xe0\x80\x80\"]",
        "[\"\xf0\x80\x80\x80\"]",
        "[0.1,1.7976931348623157e308,5e-324]",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":1}",
    };
    for (size_t i = 0; i < PC_ARRAY_LEN(cases); i++) {
        size_t n = strlen(cases[i]);
        PC_TEST_CALL(compare(cases[i], n, FLAGS));
        PC_TEST_CALL(compare(cases[i], n, JSON_REJECT_DUPLICATES));
        PC_TEST_CALL(compare(cases[i], n, 0));
        PC_TEST_CALL(compare(cases[i], n, JSON_DECODE_ANY)); /* straight to jansson */
    }
    PC_TEST_CALL(compare("{}\0", 3, FLAGS));
    PC_TEST_CALL(compare("[\"a\0b\"]", 7, FLAGS));
    json_error_t e;
    ASSERT_TRUE(gw_json_loadb(NULL, 0, FLAGS, &e) == NULL);
    /* Deep nesting: beyond the fast path's depth jansson decides, both under and over its own
     * limit. */
    for (int depth = 200; depth <= 2100; depth += 950) {
        pc_buf_t b = PC_BUF_INIT;
        for (int i = 0; i < depth; i++)
            pc_buf_append_cstr(&b, "[");
        for (int i = 0; i < depth; i++)
            pc_buf_append_cstr(&b, "]");
        PC_TEST_CALL(compare(b.base, b.len, FLAGS));
        pc_buf_free(&b);
    }
}

PC_TEST(generated_documents_and_mutations)
{
    static const char mut[] = {'\0',       '"',        '\\',       ',',        ':',   '{', '}',
                               '[',        ']',        ' ',        '0',        'e',   '-', 'u',
                               (char)0xC0, (char)0xED, (char)0x80, (char)0xFF, '\x1f'};
    pc_buf_t b = PC_BUF_INIT, m = PC_BUF_INIT;
    g_rng = 0xC0FFEE;
    int n = (int)(4000 * pc_test_scale());
    for (int it = 0; it < n; it++) {
        b.len = 0;
        ws(&b);
        bool obj = rnd(2);
        pc_buf_append_cstr(&b, obj ? "{\"k\":" : "[");
        gen_value(&b, 0);
        pc_buf_append_cstr(&b, obj ? "}" : "]");
        ws(&b);
        PC_TEST_CALL(compare(b.base, b.len, FLAGS));
        PC_TEST_CALL(compare(b.base, b.len, 0));
        /* Mutations: replace, insert or delete a byte, or cut the document short. */
        for (int k = 0; k < 4; k++) {
            m.len = 0;
            pc_buf_append(&m, b.base, b.len);
            size_t at = rnd((uint32_t)m.len);
            switch (rnd(4)) {
            case 0:
                m.base[at] = mut[rnd(sizeof mut)];
                break;
            case 1:
                memmove(m.base + at, m.base + at + 1, m.len - at - 1);
                m.len--;
                break;
            case 2:
                m.len = at;
                break;
            default: {
                char c = mut[rnd(sizeof mut)];
                pc_buf_append(&m, "", 1);
                memmove(m.base + at + 1, m.base + at, m.len - at - 1);
                m.base[at] = c;
                break;
            }
            }
            PC_TEST_CALL(compare(m.base, m.len, FLAGS));
        }
    }
    printf("  %ld identical trees (%ld by the fast path alone), %ld identical errors; %ld "
           "skipping fast\n",
           g_n_same_tree, g_n_fast, g_n_same_error, g_n_keep_fast);
    ASSERT_TRUE(g_n_keep_fast > g_n_fast / 2); /* skipping mostly decides on its own */
    ASSERT_TRUE(g_n_same_tree > n / 4);
    ASSERT_TRUE(g_n_fast > g_n_same_tree / 2); /* the fast path does the work */
    ASSERT_TRUE(g_n_same_error > n / 4);
    pc_buf_free(&b);
    pc_buf_free(&m);
}

PC_TEST_MAIN()
