/*
 * pc_strmap.h — a hash map from byte strings to uint64_t values (an index, an id, or a pointer
 * through uintptr_t), for tables that are built and then looked up: names in a file, token
 * texts, label values, (tenant, model, day) groups.
 *
 * The map keeps its own copy of every key in one growing byte array, so a caller may look up
 * and insert keys it built on the stack (a composite key is its parts joined with lengths or a
 * separator byte that cannot occur in them). Open addressing with linear probing in a
 * power-of-two table kept at most half full; a slot keeps the key's full hash, so growing never
 * re-reads keys and most probes of other keys stop at the hash compare. Any bytes are a key,
 * the empty string included, and keys up to 4 GiB in all. There is no deletion: every user
 * builds its table and frees it whole. Not thread-safe; lookups do not allocate. OOM policy:
 * a failed insert returns PC_ERR_NOMEM and leaves the map's contents as they were.
 */
#ifndef PC_STRMAP_H
#define PC_STRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pc_strmap_slot {
    uint64_t hash;
    uint64_t value;
    uint32_t off;  /* the key's first byte in keys */
    uint32_t len1; /* the key's length + 1; 0 = an empty slot */
} pc_strmap_slot_t;

typedef struct pc_strmap {
    pc_strmap_slot_t *slots; /* [cap], NULL while empty */
    size_t cap, n;
    char *keys; /* [keys_cap]: every key, back to back */
    size_t keys_len, keys_cap;
} pc_strmap_t;

/* A 64-bit hash of n bytes (not keyed: tables fed by untrusted input bound their own size). */
uint64_t pc_hash_bytes(const void *p, size_t n);

/* An empty map needs no allocation: zero-initialise it ({0}). Frees the slots and the keys;
 * the map is empty and usable afterwards. */
void pc_strmap_free(pc_strmap_t *m);

/* Room for n keys in all without growing the table: 0 or PC_ERR_NOMEM (nothing changed). */
int pc_strmap_reserve(pc_strmap_t *m, size_t n);

/* Whether key (len bytes; key may be NULL when len is 0) is in the map; when it is, *value
 * (if value is not NULL) is what is stored under it. */
bool pc_strmap_get(const pc_strmap_t *m, const void *key, size_t len, uint64_t *value);

/* Inserts key with value unless the key is there already. Returns 0 (inserted), 1 (the key was
 * there: its value is unchanged), PC_ERR_NOMEM or PC_ERR_RANGE (the keys would pass 4 GiB):
 * the map unchanged. On 0 and 1, *at (if at is not NULL) points at the stored value, which the
 * caller may change; the pointer is valid until the next insert. */
int pc_strmap_insert(pc_strmap_t *m, const void *key, size_t len, uint64_t value, uint64_t **at);

/* Stores value under key, replacing a previous value: 0, PC_ERR_NOMEM or PC_ERR_RANGE. */
int pc_strmap_put(pc_strmap_t *m, const void *key, size_t len, uint64_t value);

static inline size_t pc_strmap_count(const pc_strmap_t *m)
{
    return m->n;
}

#endif
