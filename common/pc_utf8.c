/*
 * pc_utf8.c — see pc_utf8.h.
 */
#include "pc_utf8.h"

size_t pc_utf8_need(unsigned char c)
{
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return 2;
    if (c >= 0xE0 && c <= 0xEF)
        return 3;
    if (c >= 0xF0 && c <= 0xF4)
        return 4;
    return 0;
}

/* The allowed range of the second byte after lead byte c (the first continuation byte is
 * where overlong forms, surrogates and values above U+10FFFF show). */
static void second_range(unsigned char c, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c == 0xE0)
        *lo = 0xA0; /* overlong */
    else if (c == 0xED)
        *hi = 0x9F; /* surrogates */
    else if (c == 0xF0)
        *lo = 0x90; /* overlong */
    else if (c == 0xF4)
        *hi = 0x8F; /* above U+10FFFF */
}

size_t pc_utf8_seq_len(const void *p, size_t n)
{
    const unsigned char *s = p;
    if (n == 0)
        return 0;
    size_t need = pc_utf8_need(s[0]);
    if (need <= 1 || n < need)
        return need == 1 ? 1 : 0;
    unsigned char lo, hi;
    second_range(s[0], &lo, &hi);
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t k = 2; k < need; k++)
        if ((s[k] & 0xC0) != 0x80)
            return 0;
    return need;
}

size_t pc_utf8_decode(const void *p, size_t n, uint32_t *cp)
{
    const unsigned char *s = p;
    size_t len = pc_utf8_seq_len(s, n);
    if (len == 0)
        return 0;
    static const unsigned char lead_mask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
    uint32_t v = s[0] & lead_mask[len];
    for (size_t k = 1; k < len; k++)
        v = v << 6 | (s[k] & 0x3F);
    *cp = v;
    return len;
}

size_t pc_utf8_encode(uint32_t cp, unsigned char out[4])
{
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | cp >> 6);
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp >= 0xD800 && cp <= 0xDFFF)
        return 0;
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | cp >> 12);
        out[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp > 0x10FFFF)
        return 0;
    out[0] = (unsigned char)(0xF0 | cp >> 18);
    out[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t pc_utf8_valid_prefix(const void *p, size_t n)
{
    const unsigned char *s = p;
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = pc_utf8_seq_len(s + i, n - i);
        if (k == 0)
            break;
        i += k;
    }
    return i;
}

bool pc_utf8_incomplete(const void *p, size_t m)
{
    const unsigned char *s = p;
    if (m == 0)
        return false;
    size_t need = pc_utf8_need(s[0]);
    if (need <= 1 || m >= need)
        return false;
    if (m >= 2) {
        unsigned char lo, hi;
        second_range(s[0], &lo, &hi);
        if (s[1] < lo || s[1] > hi)
            return false;
    }
    for (size_t k = 2; k < m; k++)
        if ((s[k] & 0xC0) != 0x80)
            return false;
    return true;
}

size_t pc_utf8_trim_partial(const void *p, size_t n)
{
    const unsigned char *s = p;
    size_t start = n, back = 0;
    while (start > 0 && back < 4 && (s[start - 1] & 0xC0) == 0x80) {
        start--;
        back++;
    }
    if (start > 0 && s[start - 1] >= 0xC0) { /* the lead byte of the last character */
        size_t want = s[start - 1] >= 0xF0 ? 4 : s[start - 1] >= 0xE0 ? 3 : 2;
        if (n - (start - 1) < want)
            return start - 1;
    }
    return n;
}
