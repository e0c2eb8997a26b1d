/*
 * pc_strmap.c — see pc_strmap.h.
 */
#include "pc_strmap.h"

#include <string.h>

#include "pc_alloc.h"
#include "pc_err.h"
#include "pc_u64map.h"

#define MIN_CAP 16

uint64_t pc_hash_bytes(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
    while (n >= 8) {
        uint64_t x;
        memcpy(&x, s, 8);
        h = (h ^ x) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t x = 0;
    if (n > 0)
        memcpy(&x, s, n);
    h = (h ^ x) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
    return h;
}

void pc_strmap_free(pc_strmap_t *m)
{
    pc_free(m->slots);
    pc_free(m->keys);
    *m = (pc_strmap_t){0};
}

/* The slot holding key, or the empty slot where it would go. */
static pc_strmap_slot_t *probe(const pc_strmap_t *m, uint64_t h, const void *key, size_t len)
{
    size_t mask = m->cap - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        pc_strmap_slot_t *s = &m->slots[i];
        if (s->len1 == 0)
            return s;
        if (s->hash == h && s->len1 - 1 == len &&
            (len == 0 || memcmp(m->keys + s->off, key, len) == 0))
            return s;
    }
}

static int resize(pc_strmap_t *m, size_t cap)
{
    pc_strmap_slot_t *t = pc_calloc(cap, sizeof *t);
    if (t == NULL)
        return PC_ERR_NOMEM;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].len1 == 0)
            continue;
        size_t j = (size_t)m->slots[i].hash & (cap - 1);
        while (t[j].len1 != 0)
            j = (j + 1) & (cap - 1);
        t[j] = m->slots[i];
    }
    pc_free(m->slots);
    m->slots = t;
    m->cap = cap;
    return 0;
}

int pc_strmap_reserve(pc_strmap_t *m, size_t n)
{
    size_t cap = pc__map_cap(m->cap, n);
    if (cap == 0)
        return PC_ERR_NOMEM;
    return cap > m->cap ? resize(m, cap) : 0;
}

bool pc_strmap_get(const pc_strmap_t *m, const void *key, size_t len, uint64_t *value)
{
    if (m->n == 0)
        return false;
    const pc_strmap_slot_t *s = probe(m, pc_hash_bytes(key, len), key, len);
    if (s->len1 == 0)
        return false;
    if (value != NULL)
        *value = s->value;
    return true;
}

int pc_strmap_insert(pc_strmap_t *m, const void *key, size_t len, uint64_t value, uint64_t **at)
{
    uint64_t h = pc_hash_bytes(key, len);
    if (m->n > 0) {
        pc_strmap_slot_t *s = probe(m, h, key, len);
        if (s->len1 != 0) {
            if (at != NULL)
                *at = &s->value;
            return 1;
        }
    }
    if (len >= UINT32_MAX - m->keys_len)
        return PC_ERR_RANGE;
    /* The keys first: a table that grew but holds the same entries is an unchanged map. */
    if (m->keys_len + len > m->keys_cap) {
        size_t c = m->keys_cap ? m->keys_cap : 256;
        while (c < m->keys_len + len)
            c *= 2;
        char *k = pc_realloc(m->keys, c);
        if (k == NULL)
            return PC_ERR_NOMEM;
        m->keys = k;
        m->keys_cap = c;
    }
    if (2 * (m->n + 1) > m->cap) {
        int rc = resize(m, m->cap ? 2 * m->cap : MIN_CAP);
        if (rc != 0)
            return rc;
    }
    pc_strmap_slot_t *s = probe(m, h, key, len);
    if (len > 0)
        memcpy(m->keys + m->keys_len, key, len);
    *s = (pc_strmap_slot_t){h, value, (uint32_t)m->keys_len, (uint32_t)len + 1};
    m->keys_len += len;
    m->n++;
    if (at != NULL)
        *at = &s->value;
    return 0;
}

int pc_strmap_put(pc_strmap_t *m, const void *key, size_t len, uint64_t value)
{
    uint64_t *at;
    int rc = pc_strmap_insert(m, key, len, value, &at);
    if (rc == 1)
        *at = value;
    return rc < 0 ? rc : 0;
}
