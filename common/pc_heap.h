/*
 * pc_heap.h — an indexed min-heap of items keyed by uint64_t.
 *
 * Each item records its own position in the heap in a uint32_t field at a fixed offset
 * (idx_off, from offsetof), so an item can leave the heap or change its key from anywhere in
 * O(log n) — what expiry and LRU queues need. An entry carries its key, so sifting compares
 * within the heap array instead of dereferencing scattered items. The heap is 4-ary: half the
 * depth of a binary heap, and an entry's children share one or two cache lines.
 *
 * Memory: the array grows only through pc_heap_reserve (0, PC_ERR_NOMEM or PC_ERR_RANGE, the
 * heap unchanged on failure); push, del and update never allocate, so a caller reserves before
 * the mutation it must not roll back. An item not in the heap has PC_HEAP_NOIDX in its field
 * (the caller sets it when it creates the item; del sets it again). Equal keys leave in an
 * order fixed by the operations, the same on every run. Not thread-safe.
 */
#ifndef PC_HEAP_H
#define PC_HEAP_H

#include <stddef.h>
#include <stdint.h>

#define PC_HEAP_NOIDX UINT32_MAX
#define PC_HEAP_D 4 /* children per entry: entry i's parent is (i - 1) / PC_HEAP_D */

typedef struct pc_heap_ent {
    uint64_t key;
    void *item;
} pc_heap_ent_t;

typedef struct pc_heap {
    pc_heap_ent_t *a; /* [cap]; a[0] is the smallest key */
    uint32_t n, cap;
    size_t idx_off; /* offsetof(item type, its uint32_t index field) */
} pc_heap_t;

/* An empty heap whose items keep their position at idx_off; no allocation. */
static inline pc_heap_t pc_heap_make(size_t idx_off)
{
    return (pc_heap_t){NULL, 0, 0, idx_off};
}

/* Frees the array (not the items); the heap is empty and usable afterwards. */
void pc_heap_free(pc_heap_t *h);

/* Grows the array to hold at least want entries. Returns 0, PC_ERR_RANGE (want above
 * PC_HEAP_NOIDX - 1) or PC_ERR_NOMEM; the contents do not change. */
int pc_heap_reserve(pc_heap_t *h, uint64_t want);

/* Adds item (not in the heap) with key; room was reserved (asserted). */
void pc_heap_push(pc_heap_t *h, void *item, uint64_t key);

/* Removes item (in the heap, asserted) from wherever it is. */
void pc_heap_del(pc_heap_t *h, void *item);

/* Changes the key of item (in the heap) in place. */
void pc_heap_update(pc_heap_t *h, void *item, uint64_t key);

/* Puts with (not in the heap, asserted) in the place of item (in the heap), under the same key;
 * item leaves the heap. For an owner that moves an item to a new address (a split that hands
 * the entry to a fresh object): the order does not change. */
void pc_heap_replace(pc_heap_t *h, void *item, void *with);

/* The position of item in h, or PC_HEAP_NOIDX. */
static inline uint32_t pc_heap_idx(const pc_heap_t *h, const void *item)
{
    return *(const uint32_t *)(const void *)((const char *)item + h->idx_off);
}

/* The entry with the smallest key, or NULL when the heap is empty; valid until the next
 * mutation. */
static inline const pc_heap_ent_t *pc_heap_top(const pc_heap_t *h)
{
    return h->n > 0 ? &h->a[0] : NULL;
}

#endif
