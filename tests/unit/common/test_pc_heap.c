/*
 * test_pc_heap.c — common/pc_heap.c against a naive array (the minimum key, every item's
 * position field) under random push / del-from-anywhere / update / pop, equal keys included;
 * reserve's range and failure leave the heap as it was.
 */
#include <stdlib.h>

#include "common.h"
#include "pc_failalloc.h"
#include "pc_test.h"

typedef struct item {
    uint64_t key;
    uint32_t hidx;
    bool in;
} item_t;

static uint64_t rng = 7;
static uint64_t rnd(uint64_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng % n;
}

/* Every entry's item points back at it, the order holds, the count matches. */
static int heap_ok(const pc_heap_t *h, const item_t *items, size_t n_items)
{
    size_t n_in = 0;
    for (size_t i = 0; i < n_items; i++) {
        if (!items[i].in) {
            if (items[i].hidx != PC_HEAP_NOIDX)
                return 0;
            continue;
        }
        n_in++;
        if (items[i].hidx >= h->n || h->a[items[i].hidx].item != &items[i] ||
            h->a[items[i].hidx].key != items[i].key)
            return 0;
    }
    for (uint32_t i = 1; i < h->n; i++)
        if (h->a[(i - 1) / PC_HEAP_D].key > h->a[i].key)
            return 0;
    return n_in == h->n;
}

PC_TEST(heap_against_naive)
{
    enum { N = 500 };
    static item_t items[N];
    pc_heap_t h = pc_heap_make(offsetof(item_t, hidx));
    for (size_t i = 0; i < N; i++)
        items[i] = (item_t){0, PC_HEAP_NOIDX, false};
    ASSERT_EQ(pc_heap_reserve(&h, N), 0);
    ASSERT_TRUE(pc_heap_top(&h) == NULL);
    for (int step = 0; step < 200000; step++) {
        item_t *it = &items[rnd(N)];
        uint64_t key = rnd(64); /* few distinct keys: many ties */
        switch (rnd(4)) {
        case 0:
        case 1:
            if (!it->in) {
                pc_heap_push(&h, it, key);
                it->in = true;
                it->key = key;
            } else {
                pc_heap_update(&h, it, key);
                it->key = key;
            }
            break;
        case 2:
            if (it->in) {
                pc_heap_del(&h, it);
                it->in = false;
            }
            break;
        default:
            if (h.n > 0) {
                const pc_heap_ent_t *top = pc_heap_top(&h);
                uint64_t min = UINT64_MAX;
                for (size_t i = 0; i < N; i++)
                    if (items[i].in && items[i].key < min)
                        min = items[i].key;
                ASSERT_EQ_U64(top->key, min);
                item_t *t = top->item;
                ASSERT_EQ_U64(t->key, min);
                pc_heap_del(&h, t);
                t->in = false;
            }
            break;
        }
        if (step % 331 == 0)
            ASSERT_TRUE(heap_ok(&h, items, N));
    }
    ASSERT_TRUE(heap_ok(&h, items, N));
    /* Drain: keys come out in order. */
    uint64_t last = 0;
    while (h.n > 0) {
        const pc_heap_ent_t *top = pc_heap_top(&h);
        ASSERT_LE(last, top->key);
        last = top->key;
        item_t *t = top->item;
        pc_heap_del(&h, t);
        t->in = false;
    }
    ASSERT_TRUE(heap_ok(&h, items, N));
    pc_heap_free(&h);
    ASSERT_EQ(h.cap, 0);
}

PC_TEST(heap_reserve_range_and_failure)
{
    static item_t items[100];
    pc_heap_t h = pc_heap_make(offsetof(item_t, hidx));
    ASSERT_EQ(pc_heap_reserve(&h, (uint64_t)PC_HEAP_NOIDX), PC_ERR_RANGE);
    ASSERT_EQ(h.cap, 0);
    ASSERT_EQ(pc_heap_reserve(&h, 64), 0);
    ASSERT_EQ(h.cap, 64);
    for (uint32_t i = 0; i < 64; i++) {
        items[i] = (item_t){100 - i, PC_HEAP_NOIDX, true};
        pc_heap_push(&h, &items[i], items[i].key);
    }
    pc_allocator_t fa = pc_failalloc;
    pc_failalloc_left = 0;
    pc_allocator_t prev = pc_set_allocator(&fa);
    int rc = pc_heap_reserve(&h, 65);
    pc_set_allocator(&prev);
    ASSERT_EQ(rc, PC_ERR_NOMEM);
    ASSERT_EQ(h.cap, 64);
    ASSERT_EQ(h.n, 64);
    ASSERT_TRUE(heap_ok(&h, items, 64));
    ASSERT_EQ_U64(pc_heap_top(&h)->key, 37);
    ASSERT_EQ(pc_heap_reserve(&h, 65), 0);
    ASSERT_EQ(h.cap, 128);
    pc_heap_free(&h);
}

/* replace hands an item's place to another: same key, same position, the order unchanged; the
 * old item is out (PC_HEAP_NOIDX) and can be pushed again. */
PC_TEST(heap_replace_keeps_place_and_order)
{
    enum { N = 300 };
    static item_t items[2 * N]; /* [N, 2N): the replacements */
    pc_heap_t h = pc_heap_make(offsetof(item_t, hidx));
    for (size_t i = 0; i < 2 * N; i++)
        items[i] = (item_t){0, PC_HEAP_NOIDX, false};
    ASSERT_EQ(pc_heap_reserve(&h, 2 * N), 0);
    for (size_t i = 0; i < N; i++) {
        items[i].key = rnd(50);
        items[i].in = true;
        pc_heap_push(&h, &items[i], items[i].key);
    }
    for (size_t i = 0; i < N; i += 3) {
        uint32_t at = items[i].hidx;
        items[N + i].key = items[i].key;
        pc_heap_replace(&h, &items[i], &items[N + i]);
        ASSERT_EQ(items[N + i].hidx, at);
        ASSERT_EQ(items[i].hidx, PC_HEAP_NOIDX);
        items[N + i].in = true;
        items[i].in = false;
        ASSERT_TRUE(heap_ok(&h, items, 2 * N));
    }
    for (size_t i = 0; i < N; i += 3) { /* the replaced items go back in */
        pc_heap_push(&h, &items[i], items[i].key);
        items[i].in = true;
    }
    ASSERT_TRUE(heap_ok(&h, items, 2 * N));
    uint64_t last = 0;
    size_t popped = 0;
    for (const pc_heap_ent_t *top; (top = pc_heap_top(&h)) != NULL; popped++) {
        ASSERT_LE(last, top->key);
        last = top->key;
        item_t *it = top->item;
        ASSERT_EQ_U64(it->key, top->key);
        pc_heap_del(&h, it);
        it->in = false;
    }
    ASSERT_EQ_U64(popped, N + (N + 2) / 3);
    pc_heap_free(&h);
}

PC_TEST_MAIN()
