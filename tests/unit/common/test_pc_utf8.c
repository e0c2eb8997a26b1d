/*
 * test_pc_utf8.c — common/pc_utf8.c: every code point round-trips through encode and decode;
 * the RFC 3629 boundaries (overlong forms, surrogates, above U+10FFFF, truncation, stray
 * continuation bytes) are refused; pc_utf8_seq_len agrees with a naive decoder on every
 * sequence of up to four bytes drawn from the bytes that matter; incomplete prefixes and
 * trimming a cut character.
 */
#include <string.h>

#include "common.h"
#include "utf8_ref.h"
#include "pc_test.h"

PC_TEST(utf8_every_code_point_round_trips)
{
    for (uint32_t cp = 0; cp <= 0x10FFFF + 5; cp++) {
        unsigned char b[4];
        size_t k = pc_utf8_encode(cp, b);
        bool valid = !(cp >= 0xD800 && cp <= 0xDFFF) && cp <= 0x10FFFF;
        if (!valid) {
            ASSERT_EQ_U64(k, 0);
            continue;
        }
        ASSERT_EQ_U64(k, cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4);
        uint32_t back = 0;
        ASSERT_EQ_U64(pc_utf8_decode(b, k, &back), k);
        ASSERT_EQ_U64(back, cp);
        ASSERT_EQ_U64(pc_utf8_need(b[0]), k);
        ASSERT_TRUE(pc_utf8_valid(b, k));
        ASSERT_EQ_U64(pc_utf8_seq_len(b, k - 1), 0); /* truncated */
        for (size_t m = 1; m < k; m++)
            ASSERT_TRUE(pc_utf8_incomplete(b, m));
        ASSERT_FALSE(pc_utf8_incomplete(b, k));
        ASSERT_EQ_U64(pc_utf8_trim_partial(b, k), k);
        for (size_t m = 1; m < k; m++)
            ASSERT_EQ_U64(pc_utf8_trim_partial(b, m), 0);
    }
}

PC_TEST(utf8_seq_len_matches_naive_decoder)
{
    static const unsigned char interesting[] = {
        0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0,
        0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xF8, 0xFE, 0xFF};
    enum { K = sizeof interesting };
    unsigned char s[4];
    for (size_t a = 0; a < K; a++)
        for (size_t b = 0; b < K; b++)
            for (size_t c = 0; c < K; c++)
                for (size_t d = 0; d < K; d++) {
                    s[0] = interesting[a];
                    s[1] = interesting[b];
                    s[2] = interesting[c];
                    s[3] = interesting[d];
                    for (size_t n = 1; n <= 4; n++) {
                        size_t want = utf8_ref_len(s, n, NULL);
                        ASSERT_EQ_U64(pc_utf8_seq_len(s, n), want);
                        uint32_t cp;
                        ASSERT_EQ_U64(pc_utf8_decode(s, n, &cp), want);
                    }
                }
}

PC_TEST(utf8_boundaries)
{
    struct {
        const char *s;
        bool valid;
    } cases[] = {
        {"", true},
        {"plain ascii", true},
        {"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80", true},
        {"\xC0\x80", false},         /* overlong NUL */
        {"\xC1\xBF", false},         /* overlong */
        {"\xE0\x9F\xBF", false},     /* overlong 3-byte */
        {"\xE0\xA0\x80", true},      /* U+0800 */
        {"\xED\x9F\xBF", true},      /* U+D7FF */
        {"\xED\xA0\x80", false},     /* U+D800 */
        {"\xED\xBF\xBF", false},     /* U+DFFF */
        {"\xEE\x80\x80", true},      /* U+E000 */
        {"\xF0\x8F\xBF\xBF", false}, /* overlong 4-byte */
        {"\xF4\x8F\xBF\xBF", true},  /* U+10FFFF */
        {"\xF4\x90\x80\x80", false}, /* U+110000 */
        {"\xF5\x80\x80\x80", false},
        {"\x80", false},
        {"a\xBF", false},
        {"\xE2\x82", false}, /* truncated */
        {"\xE2\x28\xA1", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = strlen(cases[i].s);
        if (pc_utf8_valid(cases[i].s, n) != cases[i].valid)
            fprintf(stderr, "  case %zu\n", i);
        ASSERT_EQ(pc_utf8_valid(cases[i].s, n), cases[i].valid);
    }
    ASSERT_EQ_U64(pc_utf8_valid_prefix("ab\xE2\x82\xAC\xFF"
                                       "cd",
                                       8),
                  5);
    ASSERT_EQ_U64(pc_utf8_need(0x80), 0);
    ASSERT_EQ_U64(pc_utf8_need(0xC1), 0);
    ASSERT_EQ_U64(pc_utf8_need(0xF5), 0);
    ASSERT_EQ_U64(pc_utf8_seq_len("x", 0), 0);
    ASSERT_FALSE(pc_utf8_incomplete("\xE0\x80", 2)); /* can never become valid */
    ASSERT_FALSE(pc_utf8_incomplete("\xED\xA0", 2));
    ASSERT_TRUE(pc_utf8_incomplete("\xED\x9F", 2));
    ASSERT_FALSE(pc_utf8_incomplete("a", 1));
    /* Trimming: "ab€" cut after 1 or 2 bytes of the euro sign loses it; ASCII stays. */
    ASSERT_EQ_U64(pc_utf8_trim_partial("ab\xE2\x82\xAC", 5), 5);
    ASSERT_EQ_U64(pc_utf8_trim_partial("ab\xE2\x82\xAC", 4), 2);
    ASSERT_EQ_U64(pc_utf8_trim_partial("ab\xE2\x82\xAC", 3), 2);
    ASSERT_EQ_U64(pc_utf8_trim_partial("ab", 2), 2);
    ASSERT_EQ_U64(pc_utf8_trim_partial("", 0), 0);
}

PC_TEST_MAIN()
