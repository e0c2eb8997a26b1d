/*
 * test_pc_json.c — common/pc_json.c: the escapes byte by byte (short forms, \u00XX, DEL and
 * non-ASCII copied), U+FFFD for invalid UTF-8 only with PC_JSON_UTF8, embedded NULs, and the
 * OOM policy: every failing allocation returns PC_ERR_NOMEM with the buffer as it was.
 */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "pc_failalloc.h"
#include "pc_test.h"

static char out[4096];

static const char *esc(const char *s, size_t n, unsigned flags)
{
    pc_buf_t b = PC_BUF_INIT;
    if (pc_json_string(&b, s, n, flags) != 0) {
        pc_buf_free(&b);
        return "(failed)";
    }
    snprintf(out, sizeof out, "%.*s", (int)b.len, b.base);
    pc_buf_free(&b);
    return out;
}
#define ESC(lit, flags) esc((lit), sizeof(lit) - 1, (flags))

PC_TEST(json_escapes)
{
    ASSERT_STR_EQ(ESC("", 0), "\"\"");
    ASSERT_STR_EQ(esc(NULL, 0, 0), "\"\"");
    ASSERT_STR_EQ(ESC("plain", 0), "\"plain\"");
    ASSERT_STR_EQ(ESC("q\"b\\s/", 0), "\"q\\\"b\\\\s/\"");
    ASSERT_STR_EQ(ESC("\n\r\t\b\f", 0), "\"\\n\\r\\t\\b\\f\"");
    ASSERT_STR_EQ(ESC("\x01\x1f\x7f", 0), "\"\\u0001\\u001f\x7f\"");
    ASSERT_STR_EQ(ESC("a\0b", 0), "\"a\\u0000b\"");
    ASSERT_STR_EQ(ESC("caf\xC3\xA9", 0), "\"caf\xC3\xA9\"");
    ASSERT_STR_EQ(ESC("caf\xC3\xA9", PC_JSON_UTF8), "\"caf\xC3\xA9\"");
    /* Invalid UTF-8: copied without the flag, one U+FFFD per bad byte with it. */
    ASSERT_STR_EQ(ESC("x\xFFy", 0), "\"x\xFFy\"");
    ASSERT_STR_EQ(ESC("x\xFFy", PC_JSON_UTF8), "\"x\xEF\xBF\xBDy\"");
    ASSERT_STR_EQ(ESC("\xE2\x82", PC_JSON_UTF8), "\"\xEF\xBF\xBD\xEF\xBF\xBD\"");
    ASSERT_STR_EQ(ESC("\xED\xA0\x80", PC_JSON_UTF8), "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\"");
    ASSERT_STR_EQ(ESC("\xF0\x9F\x98\x80\"", PC_JSON_UTF8), "\"\xF0\x9F\x98\x80\\\"\"");
    pc_buf_t b = PC_BUF_INIT;
    ASSERT_EQ(pc_json_cstr(&b, NULL, 0), 0);
    ASSERT_EQ(pc_json_cstr(&b, "a\"", 0), 0);
    ASSERT_EQ_U64(b.len, 7);
    ASSERT_MEM_EQ(b.base, "\"\"\"a\\\"\"", 7);
    pc_buf_free(&b);
}

PC_TEST(json_nomem_rolls_back)
{
    /* A long string with escapes everywhere, appended after existing content, so the buffer
     * grows several times inside one call. */
    char s[3000];
    for (size_t i = 0; i < sizeof s; i++)
        s[i] = "ab\n\"\x01\xC3\xA9\xFF"[i % 8];
    pc_allocator_t fa = pc_failalloc;
    long failures = 0;
    for (long k = 0;; k++) {
        pc_buf_t b = PC_BUF_INIT;
        ASSERT_EQ(pc_buf_append(&b, "prefix", 6), 0);
        pc_failalloc_left = k;
        pc_allocator_t prev = pc_set_allocator(&fa);
        int rc = pc_json_string(&b, s, sizeof s, PC_JSON_UTF8);
        pc_set_allocator(&prev);
        if (rc == 0) {
            ASSERT_TRUE(b.len > sizeof s);
            pc_buf_free(&b);
            break;
        }
        failures++;
        ASSERT_EQ(rc, PC_ERR_NOMEM);
        ASSERT_EQ_U64(b.len, 6);
        ASSERT_MEM_EQ(b.base, "prefix", 6);
        pc_buf_free(&b);
    }
    ASSERT_TRUE(failures >= 2);
}

PC_TEST_MAIN()
