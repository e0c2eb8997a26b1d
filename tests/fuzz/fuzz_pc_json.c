/*
 * fuzz_pc_json.c — bytes -> common/pc_json.c: the escaped literal (with and without
 * PC_JSON_UTF8) must parse back with jansson (NULs allowed) to the input — exactly when the
 * input is valid UTF-8, and to the input with U+FFFD per invalid byte with the flag; the output
 * holds no raw control character. Byte 0 picks the flags.
 */
#include <jansson.h>
#include <stdint.h>
#include <string.h>

#include "common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    unsigned flags = data[0] & 1 ? PC_JSON_UTF8 : 0;
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    pc_buf_t b = PC_BUF_INIT;
    PC_ASSERT(pc_buf_append(&b, "x", 1) == 0);
    PC_ASSERT(pc_json_string(&b, s, n, flags) == 0);
    for (size_t i = 1; i < b.len; i++)
        PC_ASSERT((unsigned char)b.base[i] >= 0x20);
    bool valid = pc_utf8_valid(s, n);
    if (valid || flags) {
        json_error_t err;
        json_t *v = json_loadb(b.base + 1, b.len - 1, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
        PC_ASSERT(v != NULL && json_is_string(v));
        const char *got = json_string_value(v);
        size_t got_n = json_string_length(v);
        if (valid) {
            PC_ASSERT(got_n == n && memcmp(got, s, n) == 0);
        } else {
            /* The expected text: valid sequences copied, one U+FFFD per invalid byte. */
            pc_buf_t want = PC_BUF_INIT;
            for (size_t i = 0; i < n;) {
                size_t k = pc_utf8_seq_len(s + i, n - i);
                PC_ASSERT(k > 0 ? pc_buf_append(&want, s + i, k) == 0
                                : pc_buf_append(&want, "\xEF\xBF\xBD", 3) == 0);
                i += k > 0 ? k : 1;
            }
            PC_ASSERT(got_n == want.len && memcmp(got, want.base, want.len) == 0);
            pc_buf_free(&want);
        }
        json_decref(v);
    }
    pc_buf_free(&b);
    return 0;
}
