/*
 * utf8_ref.h — the naive UTF-8 decoder the tests and the fuzzer hold common/pc_utf8.c against:
 * decode by the bit patterns, then reject by value (overlong forms, surrogates, above
 * U+10FFFF). Returns the sequence's length at s (1..4) and its code point in *out (out may be
 * NULL), or 0 for an invalid or truncated sequence.
 */
#ifndef KVGW_TEST_UTF8_REF_H
#define KVGW_TEST_UTF8_REF_H

#include <stddef.h>
#include <stdint.h>

static inline size_t utf8_ref_len(const unsigned char *s, size_t n, uint32_t *out)
{
    if (n == 0)
        return 0;
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || n < len)
        return 0;
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
        return 0;
    if (out != NULL)
        *out = cp;
    return len;
}

#endif
