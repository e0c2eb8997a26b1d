/*
 * pc_heap.c — see pc_heap.h.
 */
#include "pc_heap.h"

#include "pc_alloc.h"
#include "pc_assert.h"
#include "pc_err.h"

static inline uint32_t *idx_of(const pc_heap_t *h, void *item)
{
    return (uint32_t *)(void *)((char *)item + h->idx_off);
}

/* Stores an entry at i and tells its item where it is. */
static inline void set(pc_heap_t *h, uint32_t i, pc_heap_ent_t e)
{
    h->a[i] = e;
    *idx_of(h, e.item) = i;
}

/* Moves the entry at i towards the root while it is smaller than its parent (hole technique:
 * one store per level, the entry written once at the end). */
static void up(pc_heap_t *h, uint32_t i)
{
    pc_heap_ent_t e = h->a[i];
    while (i > 0) {
        uint32_t p = (i - 1) / PC_HEAP_D;
        if (h->a[p].key <= e.key)
            break;
        set(h, i, h->a[p]);
        i = p;
    }
    set(h, i, e);
}

/* Moves the entry at i towards the leaves while a child is smaller (the smallest of up to
 * PC_HEAP_D children, which sit next to each other in the array). */
static void down(pc_heap_t *h, uint32_t i)
{
    pc_heap_ent_t e = h->a[i];
    for (;;) {
        uint32_t c = PC_HEAP_D * i + 1;
        if (c >= h->n)
            break;
        uint32_t end = c + PC_HEAP_D < h->n ? c + PC_HEAP_D : h->n;
        for (uint32_t k = c + 1; k < end; k++)
            if (h->a[k].key < h->a[c].key)
                c = k;
        if (e.key <= h->a[c].key)
            break;
        set(h, i, h->a[c]);
        i = c;
    }
    set(h, i, e);
}

void pc_heap_free(pc_heap_t *h)
{
    pc_free(h->a);
    h->a = NULL;
    h->n = h->cap = 0;
}

int pc_heap_reserve(pc_heap_t *h, uint64_t want)
{
    if (want <= h->cap)
        return 0;
    if (want > PC_HEAP_NOIDX - 1)
        return PC_ERR_RANGE;
    uint64_t cap = h->cap ? h->cap : 64;
    while (cap < want)
        cap *= 2;
    if (cap > PC_HEAP_NOIDX - 1)
        cap = PC_HEAP_NOIDX - 1;
    pc_heap_ent_t *a = pc_reallocarray(h->a, (size_t)cap, sizeof *a);
    if (a == NULL)
        return PC_ERR_NOMEM;
    h->a = a;
    h->cap = (uint32_t)cap;
    return 0;
}

void pc_heap_push(pc_heap_t *h, void *item, uint64_t key)
{
    PC_ASSERT(h->n < h->cap && *idx_of(h, item) == PC_HEAP_NOIDX);
    h->a[h->n] = (pc_heap_ent_t){key, item};
    up(h, h->n++);
}

/* The last entry fills the hole and moves up or down, whichever restores the order. */
void pc_heap_del(pc_heap_t *h, void *item)
{
    uint32_t i = *idx_of(h, item);
    PC_ASSERT(i < h->n && h->a[i].item == item);
    *idx_of(h, item) = PC_HEAP_NOIDX;
    if (i == --h->n)
        return;
    pc_heap_ent_t e = h->a[h->n];
    set(h, i, e);
    if (i > 0 && e.key < h->a[(i - 1) / PC_HEAP_D].key)
        up(h, i);
    else
        down(h, i);
}

void pc_heap_replace(pc_heap_t *h, void *item, void *with)
{
    uint32_t i = *idx_of(h, item);
    PC_ASSERT(i < h->n && h->a[i].item == item && *idx_of(h, with) == PC_HEAP_NOIDX);
    *idx_of(h, item) = PC_HEAP_NOIDX;
    h->a[i].item = with;
    *idx_of(h, with) = i;
}

void pc_heap_update(pc_heap_t *h, void *item, uint64_t key)
{
    uint32_t i = *idx_of(h, item);
    PC_ASSERT(i < h->n && h->a[i].item == item);
    uint64_t old = h->a[i].key;
    h->a[i].key = key;
    if (key < old)
        up(h, i);
    else
        down(h, i);
}
