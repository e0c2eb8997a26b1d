/*
 * test_pc_strmap.c — common/pc_strmap.c against a naive array under random inserts, puts and
 * lookups (short keys from a small alphabet, so hashes spread but keys share prefixes and
 * lengths), keys with NUL bytes and the empty key, and a failing allocator (a failed insert
 * leaves the map as it was).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "pc_strmap.h"
#include "pc_failalloc.h"
#include "pc_test.h"

static uint64_t rng = 1;
static uint64_t rnd(uint64_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng % n;
}

/* Key k (0 <= k < 4096) as bytes: its base-3 digits over {'a', '\0', 'b'}, k's length varying,
 * so that keys embed NUL bytes and key 0 is the empty string. */
static size_t key_of(unsigned k, char *out)
{
    size_t n = 0;
    static const char alpha[3] = {'a', '\0', 'b'};
    for (unsigned x = k; x > 0; x /= 3)
        out[n++] = alpha[x % 3];
    return n;
}

PC_TEST(strmap_against_naive)
{
    enum { K = 3000 };
    static uint64_t naive[K];
    static bool have[K];
    pc_strmap_t m = {0};
    char key[16];
    for (int step = 0; step < 200000; step++) {
        unsigned k = (unsigned)rnd(K);
        size_t len = key_of(k, key);
        uint64_t v = rnd(1u << 30), got = 0;
        switch (rnd(3)) {
        case 0: {
            uint64_t *at = NULL;
            int rc = pc_strmap_insert(&m, key, len, v, &at);
            ASSERT_EQ(rc, have[k] ? 1 : 0);
            if (!have[k])
                naive[k] = v;
            have[k] = true;
            ASSERT_EQ_U64(*at, naive[k]);
            break;
        }
        case 1:
            ASSERT_EQ(pc_strmap_put(&m, key, len, v), 0);
            naive[k] = v;
            have[k] = true;
            break;
        default:
            ASSERT_EQ(pc_strmap_get(&m, key, len, &got), have[k]);
            if (have[k])
                ASSERT_EQ_U64(got, naive[k]);
        }
        if (step % 4999 == 0) {
            size_t n = 0;
            for (unsigned i = 0; i < K; i++) {
                len = key_of(i, key);
                ASSERT_EQ(pc_strmap_get(&m, key, len, &got), have[i]);
                if (have[i])
                    ASSERT_EQ_U64(got, naive[i]);
                n += have[i];
            }
            ASSERT_EQ_U64(pc_strmap_count(&m), n);
            ASSERT_LE(2 * m.n, m.cap);
        }
    }
    pc_strmap_free(&m);
    ASSERT_EQ_U64(pc_strmap_count(&m), 0);
    ASSERT_FALSE(pc_strmap_get(&m, "a", 1, NULL));
}

PC_TEST(strmap_empty_key_prefixes_and_reserve)
{
    pc_strmap_t m = {0};
    ASSERT_FALSE(pc_strmap_get(&m, NULL, 0, NULL));
    ASSERT_EQ(pc_strmap_reserve(&m, 1000), 0);
    size_t cap = m.cap;
    ASSERT_TRUE(cap >= 2000);
    ASSERT_EQ(pc_strmap_insert(&m, NULL, 0, 7, NULL), 0);
    ASSERT_EQ(pc_strmap_insert(&m, "", 0, 8, NULL), 1);
    /* "ab" and "ab\0": one is a prefix of the other; "a" and "b" share length. */
    ASSERT_EQ(pc_strmap_put(&m, "ab", 2, 1), 0);
    ASSERT_EQ(pc_strmap_put(&m, "ab\0", 3, 2), 0);
    ASSERT_EQ(pc_strmap_put(&m, "a", 1, 3), 0);
    ASSERT_EQ(pc_strmap_put(&m, "b", 1, 4), 0);
    char name[32];
    for (int i = 0; i < 990; i++) {
        int n = snprintf(name, sizeof name, "tensor.%d.weight", i);
        ASSERT_EQ(pc_strmap_insert(&m, name, (size_t)n, (uint64_t)i, NULL), 0);
    }
    ASSERT_EQ_U64(m.cap, cap); /* reserved: no growth */
    uint64_t v = 0;
    ASSERT_TRUE(pc_strmap_get(&m, "", 0, &v));
    ASSERT_EQ_U64(v, 7);
    ASSERT_TRUE(pc_strmap_get(&m, "ab", 2, &v));
    ASSERT_EQ_U64(v, 1);
    ASSERT_TRUE(pc_strmap_get(&m, "ab\0", 3, &v));
    ASSERT_EQ_U64(v, 2);
    ASSERT_TRUE(pc_strmap_get(&m, "b", 1, &v));
    ASSERT_EQ_U64(v, 4);
    ASSERT_FALSE(pc_strmap_get(&m, "ab\0\0", 4, NULL));
    ASSERT_TRUE(pc_strmap_get(&m, "tensor.989.weight", 17, &v));
    ASSERT_EQ_U64(v, 989);
    ASSERT_FALSE(pc_strmap_get(&m, "tensor.990.weight", 17, NULL));
    ASSERT_EQ_U64(pc_strmap_count(&m), 995);
    pc_strmap_free(&m);
}

PC_TEST(strmap_failing_allocator_leaves_map_unchanged)
{
    pc_allocator_t fa = pc_failalloc;
    pc_strmap_t m = {0};
    char key[32];
    long failures = 0;
    for (unsigned k = 0; k < 3000; k++) {
        size_t len = (size_t)snprintf(key, sizeof key, "key-%u", k);
        for (long budget = 0;; budget++) {
            pc_failalloc_left = budget;
            pc_allocator_t prev = pc_set_allocator(&fa);
            int rc = pc_strmap_insert(&m, key, len, k, NULL);
            pc_set_allocator(&prev);
            if (rc == 0)
                break;
            ASSERT_EQ(rc, PC_ERR_NOMEM);
            failures++;
            ASSERT_EQ_U64(pc_strmap_count(&m), k);
            ASSERT_FALSE(pc_strmap_get(&m, key, len, NULL));
        }
        uint64_t v = 0;
        ASSERT_TRUE(pc_strmap_get(&m, key, len, &v));
        ASSERT_EQ_U64(v, k);
    }
    ASSERT_TRUE(failures >= 16); /* each growth of the table and of the keys failed once */
    for (unsigned k = 0; k < 3000; k++) {
        size_t len = (size_t)snprintf(key, sizeof key, "key-%u", k);
        uint64_t v = 0;
        ASSERT_TRUE(pc_strmap_get(&m, key, len, &v));
        ASSERT_EQ_U64(v, k);
    }
    pc_strmap_free(&m);
}

PC_TEST_MAIN()
