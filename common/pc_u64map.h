/*
 * pc_u64map.h — a hash map from non-zero uint64_t keys to pointers, with deletion.
 *
 * Open addressing with linear probing in a power-of-two table kept at most half full; deletion
 * shifts the following entries of the probe run back (no tombstones), so a table that saw any
 * number of insertions and deletions costs what its live entries cost, and it shrinks again
 * (to a quarter full at most) as entries go. The slot is the key through a 64-bit finalizer
 * (murmur3's fmix64), so counters, hash outputs and pointers all spread. Key 0 marks an empty
 * slot and cannot be stored; neither can a NULL value. Not thread-safe; no allocation on
 * lookups. OOM policy: a failed put returns PC_ERR_NOMEM and leaves the map as it was.
 *
 * Iteration: for (size_t i = pc_u64map_next(m, 0); i < m->cap; i = pc_u64map_next(m, i + 1))
 * visits m->slots[i] in slot order; the map must not change during it.
 */
#ifndef PC_U64MAP_H
#define PC_U64MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct pc_u64map_slot {
    uint64_t key; /* 0 = empty */
    void *value;
} pc_u64map_slot_t;

typedef struct pc_u64map {
    pc_u64map_slot_t *slots; /* [cap], NULL while empty */
    size_t cap, n;
} pc_u64map_t;

/* An empty map needs no allocation: zero-initialise it ({0}). Frees the slots (not the
 * values); the map is empty and usable afterwards. */
void pc_u64map_free(pc_u64map_t *m);

/* Room for n entries in all without growing the table: 0 or PC_ERR_NOMEM (nothing changed).
 * A later deletion may shrink the table again. */
int pc_u64map_reserve(pc_u64map_t *m, size_t n);

/* The value stored under key, or NULL. */
void *pc_u64map_get(const pc_u64map_t *m, uint64_t key);

/* Stores value under key (replacing a previous value). Returns 0, PC_ERR_INVAL (key 0 or a
 * NULL value) or PC_ERR_NOMEM (the map is unchanged). */
int pc_u64map_put(pc_u64map_t *m, uint64_t key, void *value);

/* Removes key; returns its value, or NULL when it was not there. May shrink the table (a
 * failed shrink leaves it as it was). */
void *pc_u64map_del(pc_u64map_t *m, uint64_t key);

/* The first occupied slot at or after i, or m->cap when there is none. */
size_t pc_u64map_next(const pc_u64map_t *m, size_t i);

/* The power-of-two table size, at least cap (16 when cap is 0), that holds n entries at most
 * half full; 0 when n is too large. Shared by pc_u64map and pc_strmap. */
size_t pc__map_cap(size_t cap, size_t n);

static inline size_t pc_u64map_count(const pc_u64map_t *m)
{
    return m->n;
}

#endif
