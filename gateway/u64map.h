/*
 * u64map.h — a hash map from non-zero uint64_t keys to pointers, with deletion.
 *
 * Open addressing with linear probing in a power-of-two table kept at most half full; deletion
 * shifts the following entries of the probe run back (no tombstones), so a table that saw any
 * number of insertions and deletions costs what its live entries cost, and it shrinks again
 * (to a quarter full at most) as entries go. Keys are well-mixed ids (namespaces are hash
 * outputs, wire ids are a counter): the slot is a multiplicative hash of the key. Key 0 marks
 * an empty slot and cannot be stored. Used on one thread; no allocation on lookups.
 */
#ifndef GW_U64MAP_H
#define GW_U64MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct gw_u64map_slot {
    uint64_t key; /* 0 = empty */
    void *value;
} gw_u64map_slot_t;

typedef struct gw_u64map {
    gw_u64map_slot_t *slots; /* [cap], NULL while empty */
    size_t cap, n;
} gw_u64map_t;

/* An empty map needs no allocation: zero-initialise it ({0}). Frees the slots (not the
 * values); the map is empty and usable afterwards. */
void gw_u64map_free(gw_u64map_t *m);

/* The value stored under key, or NULL. */
void *gw_u64map_get(const gw_u64map_t *m, uint64_t key);

/* Stores value under key (replacing a previous value). Returns 0, PC_ERR_INVAL (key 0 or a
 * NULL value) or PC_ERR_NOMEM (the map is unchanged). */
int gw_u64map_put(gw_u64map_t *m, uint64_t key, void *value);

/* Removes key; returns its value, or NULL when it was not there. May shrink the table (a
 * failed shrink leaves it as it was). */
void *gw_u64map_del(gw_u64map_t *m, uint64_t key);

static inline size_t gw_u64map_count(const gw_u64map_t *m)
{
    return m->n;
}

#endif
