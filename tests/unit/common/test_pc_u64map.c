/*
 * test_pc_u64map.c — common/pc_u64map.c against a naive array under random insert/delete
 * (clustered keys, so probe runs collide and wrap), iteration, the shrink back to nothing, the
 * refused keys, and a failing allocator (a failed put leaves the map as it was).
 */
#include <stdlib.h>

#include "common.h"
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

PC_TEST(u64map_against_naive)
{
    enum { K = 600 };
    void *naive[K + 1] = {0};
    pc_u64map_t m = {0};
    static int vals[K + 1];
    for (int step = 0; step < 200000; step++) {
        /* Keys clustered (small range) so probe runs collide and wrap. */
        uint64_t key = 1 + rnd(K);
        if (rnd(3) != 0) {
            ASSERT_EQ(pc_u64map_put(&m, key, &vals[key]), 0);
            naive[key] = &vals[key];
        } else {
            ASSERT_TRUE(pc_u64map_del(&m, key) == naive[key]);
            naive[key] = NULL;
        }
        if (step % 997 == 0) {
            size_t n = 0;
            for (uint64_t k = 1; k <= K; k++) {
                ASSERT_TRUE(pc_u64map_get(&m, k) == naive[k]);
                n += naive[k] != NULL;
            }
            ASSERT_EQ_U64(pc_u64map_count(&m), n);
            ASSERT_LE(2 * m.n, m.cap);
        }
    }
    for (uint64_t k = 1; k <= K; k++)
        pc_u64map_del(&m, k);
    ASSERT_EQ_U64(pc_u64map_count(&m), 0);
    ASSERT_EQ_U64(m.cap, 0); /* emptied: nothing allocated */
    ASSERT_EQ(pc_u64map_put(&m, 0, &vals[0]), PC_ERR_INVAL);
    ASSERT_EQ(pc_u64map_put(&m, 1, NULL), PC_ERR_INVAL);
    ASSERT_TRUE(pc_u64map_get(&m, 0) == NULL);
    ASSERT_TRUE(pc_u64map_del(&m, 0) == NULL);
    pc_u64map_free(&m);
}

PC_TEST(u64map_iteration_visits_each_entry_once)
{
    pc_u64map_t m = {0};
    static char vals[1000];
    ASSERT_EQ_U64(pc_u64map_next(&m, 0), 0); /* empty: cap 0 */
    /* Keys that share their low bits (multiples of 2^32) and pointer-like keys. */
    for (uint64_t i = 1; i <= 500; i++)
        ASSERT_EQ(pc_u64map_put(&m, i << 32, &vals[i]), 0);
    for (uint64_t i = 0; i < 300; i++)
        ASSERT_EQ(pc_u64map_put(&m, (uint64_t)(uintptr_t)&vals[600 + i], &vals[600 + i]), 0);
    int seen[1000] = {0};
    size_t n = 0;
    for (size_t i = pc_u64map_next(&m, 0); i < m.cap; i = pc_u64map_next(&m, i + 1)) {
        ASSERT_NE(m.slots[i].key, 0);
        seen[(char *)m.slots[i].value - vals]++;
        n++;
    }
    ASSERT_EQ_U64(n, 800);
    for (int i = 1; i <= 500; i++)
        ASSERT_EQ(seen[i], 1);
    for (int i = 600; i < 900; i++)
        ASSERT_EQ(seen[i], 1);
    pc_u64map_free(&m);
    ASSERT_EQ_U64(pc_u64map_count(&m), 0);
    ASSERT_TRUE(pc_u64map_get(&m, 1ull << 32) == NULL);
}

PC_TEST(u64map_failing_allocator_leaves_map_unchanged)
{
    pc_allocator_t fa = pc_failalloc;
    pc_u64map_t m = {0};
    static int vals[2001];
    pc_allocator_t prev;
    long failures = 0;
    for (uint64_t k = 1; k <= 2000; k++) {
        pc_failalloc_left = 0;
        prev = pc_set_allocator(&fa);
        int rc = pc_u64map_put(&m, k, &vals[k]);
        pc_set_allocator(&prev);
        if (rc == PC_ERR_NOMEM) {
            failures++;
            ASSERT_EQ_U64(pc_u64map_count(&m), k - 1);
            ASSERT_TRUE(pc_u64map_get(&m, k) == NULL);
            ASSERT_EQ(pc_u64map_put(&m, k, &vals[k]), 0);
        } else {
            ASSERT_EQ(rc, 0);
        }
        ASSERT_TRUE(pc_u64map_get(&m, k) == &vals[k]);
    }
    ASSERT_TRUE(failures >= 8); /* every growth 16 -> 4096 failed once */
    /* A reserve that fails changes nothing; one that succeeds makes room without growth. */
    size_t cap = m.cap;
    pc_failalloc_left = 0;
    prev = pc_set_allocator(&fa);
    ASSERT_EQ(pc_u64map_reserve(&m, 100000), PC_ERR_NOMEM);
    pc_set_allocator(&prev);
    ASSERT_EQ_U64(m.cap, cap);
    ASSERT_EQ(pc_u64map_reserve(&m, 100000), 0);
    ASSERT_TRUE(m.cap >= 200000);
    cap = m.cap;
    for (uint64_t k = 2001; k <= 2000 + 90000; k++)
        ASSERT_EQ(pc_u64map_put(&m, k, &vals[k % 2001]), 0);
    ASSERT_EQ_U64(m.cap, cap);
    for (uint64_t k = 1; k <= 2000; k++)
        ASSERT_TRUE(pc_u64map_get(&m, k) == &vals[k]);
    for (uint64_t k = 2001; k <= 2000 + 90000; k++)
        ASSERT_TRUE(pc_u64map_del(&m, k) == &vals[k % 2001]);
    /* Deleting under a failing allocator: a failed shrink keeps a valid map. */
    pc_failalloc_left = 0;
    prev = pc_set_allocator(&fa);
    for (uint64_t k = 1; k <= 1990; k++)
        ASSERT_TRUE(pc_u64map_del(&m, k) == &vals[k]);
    pc_set_allocator(&prev);
    ASSERT_EQ_U64(pc_u64map_count(&m), 10);
    for (uint64_t k = 1991; k <= 2000; k++)
        ASSERT_TRUE(pc_u64map_get(&m, k) == &vals[k]);
    pc_u64map_free(&m);
}

PC_TEST_MAIN()
