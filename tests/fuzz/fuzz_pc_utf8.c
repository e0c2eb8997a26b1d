/*
 * fuzz_pc_utf8.c — bytes -> common/pc_utf8.c against a naive decoder (bit patterns, then the
 * value's range): the length at every position, decode + encode round trip, the valid prefix,
 * the incomplete-prefix test and the trimmed length (never more than n, never inside a valid
 * character).
 */
#include <stdint.h>
#include <string.h>

#include "common.h"
#include "utf8_ref.h"

int LLVMFuzzerTestOneInput(const uint8_t *s, size_t n)
{
    size_t i = 0, prefix = SIZE_MAX;
    while (i < n) {
        uint32_t want = 0, got = 0;
        size_t k = utf8_ref_len(s + i, n - i, &want);
        PC_ASSERT(pc_utf8_seq_len(s + i, n - i) == k);
        PC_ASSERT(pc_utf8_decode(s + i, n - i, &got) == k);
        if (k > 0) {
            unsigned char b[4];
            PC_ASSERT(got == want);
            PC_ASSERT(pc_utf8_encode(got, b) == k && memcmp(b, s + i, k) == 0);
            PC_ASSERT(pc_utf8_need(s[i]) == k);
            i += k;
            continue;
        }
        if (prefix == SIZE_MAX)
            prefix = i;
        /* Incomplete: some extension of the tail by continuation bytes is valid. */
        bool can_finish = false;
        size_t need = pc_utf8_need(s[i]);
        if (need > n - i && need > 1) {
            unsigned char b[4];
            memcpy(b, s + i, n - i);
            for (unsigned x = 0x80; x <= 0xBF && !can_finish; x++) {
                for (size_t j = n - i; j < need; j++)
                    b[j] = (unsigned char)x;
                uint32_t cp;
                can_finish = utf8_ref_len(b, need, &cp) == need;
            }
        }
        PC_ASSERT(pc_utf8_incomplete(s + i, n - i) == can_finish);
        i++;
    }
    if (prefix == SIZE_MAX)
        prefix = n;
    PC_ASSERT(pc_utf8_valid_prefix(s, n) == prefix);
    PC_ASSERT(pc_utf8_valid(s, n) == (prefix == n));
    size_t t = pc_utf8_trim_partial(s, n);
    PC_ASSERT(t <= n);
    if (prefix == n && n > 0) /* valid text: never trimmed */
        PC_ASSERT(t == n);
    for (size_t cut = 0; cut <= n && prefix == n && n <= 256; cut++) {
        size_t tc = pc_utf8_trim_partial(s, cut);
        PC_ASSERT(tc <= cut && pc_utf8_valid(s, tc)); /* a cut valid text stays valid */
    }
    return 0;
}
