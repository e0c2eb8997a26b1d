/*
 * test_pc_vec.c — common/pc_vec.h: push and reserve grow by doubling and keep the contents;
 * a failed growth returns PC_ERR_NOMEM and leaves the vector as it was; a struct element type.
 */
#include <stdlib.h>

#include "common.h"
#include "pc_failalloc.h"
#include "pc_test.h"

typedef struct pair {
    uint32_t a;
    uint64_t b;
} pair_t;
typedef PC_VEC(pair_t) pair_vec_t;

PC_TEST(vec_push_and_reserve)
{
    PC_VEC(uint32_t) v = {0};
    for (uint32_t i = 0; i < 10000; i++) {
        ASSERT_EQ(pc_vec_push(&v, i * 3), 0);
        ASSERT_LE(v.len, v.cap);
    }
    ASSERT_EQ_U64(v.len, 10000);
    ASSERT_EQ_U64(v.cap, 16384); /* 8 doubled */
    for (uint32_t i = 0; i < 10000; i++)
        ASSERT_EQ(v.base[i], i * 3);
    ASSERT_EQ(pc_vec_reserve(&v, 100), 0); /* enough already: nothing moves */
    ASSERT_EQ_U64(v.cap, 16384);
    ASSERT_EQ(pc_vec_reserve(&v, 20000), 0);
    ASSERT_EQ_U64(v.cap, 32768);
    ASSERT_EQ(pc_vec_reserve(&v, SIZE_MAX), PC_ERR_NOMEM);
    ASSERT_EQ_U64(v.cap, 32768);
    pc_vec_free(&v);
    ASSERT_TRUE(v.base == NULL);
    ASSERT_EQ_U64(v.len + v.cap, 0);

    pair_vec_t p = {0};
    for (uint32_t i = 0; i < 100; i++)
        ASSERT_EQ(pc_vec_push(&p, ((pair_t){i, (uint64_t)i << 40})), 0);
    ASSERT_EQ_U64(p.base[99].b, 99ull << 40);
    ASSERT_EQ(p.base[42].a, 42);
    pc_vec_free(&p);
}

PC_TEST(vec_failed_growth_leaves_it_unchanged)
{
    PC_VEC(uint64_t) v = {0};
    for (uint64_t i = 0; i < 8; i++)
        ASSERT_EQ(pc_vec_push(&v, i), 0);
    uint64_t *before = v.base;
    pc_allocator_t fa = pc_failalloc;
    pc_failalloc_left = 0;
    pc_allocator_t prev = pc_set_allocator(&fa);
    int rc = pc_vec_push(&v, 99);
    pc_set_allocator(&prev);
    ASSERT_EQ(rc, PC_ERR_NOMEM);
    ASSERT_EQ_U64(v.len, 8);
    ASSERT_EQ_U64(v.cap, 8);
    ASSERT_TRUE(v.base == before);
    for (uint64_t i = 0; i < 8; i++)
        ASSERT_EQ_U64(v.base[i], i);
    ASSERT_EQ(pc_vec_push(&v, 99), 0);
    ASSERT_EQ_U64(v.base[8], 99);
    pc_vec_free(&v);
}

/* pc_array_reserve: the same growth for a bare array and its owner's capacity field. */
PC_TEST(array_reserve_bare_array)
{
    struct {
        uint64_t a, b;
    } *arr = NULL;
    size_t cap = 0;
    ASSERT_EQ(pc_array_reserve(&arr, &cap, 0), 0);
    ASSERT_TRUE(arr == NULL && cap == 0);
    ASSERT_EQ(pc_array_reserve(&arr, &cap, 5), 0);
    ASSERT_EQ_U64(cap, 8);
    for (uint64_t i = 0; i < 5; i++)
        arr[i].a = i, arr[i].b = ~i;
    ASSERT_EQ(pc_array_reserve(&arr, &cap, 20), 0);
    ASSERT_EQ_U64(cap, 32);
    for (uint64_t i = 0; i < 5; i++)
        ASSERT_TRUE(arr[i].a == i && arr[i].b == ~i);
    void *before = arr;
    pc_failalloc_left = 0;
    pc_allocator_t prev = pc_set_allocator(&pc_failalloc);
    int rc = pc_array_reserve(&arr, &cap, 33);
    pc_set_allocator(&prev);
    ASSERT_EQ(rc, PC_ERR_NOMEM);
    ASSERT_TRUE(arr == before);
    ASSERT_EQ_U64(cap, 32);
    ASSERT_EQ(pc_array_reserve(&arr, &cap, SIZE_MAX), PC_ERR_NOMEM);
    ASSERT_EQ_U64(cap, 32);
    pc_free(arr);
}

PC_TEST_MAIN()
