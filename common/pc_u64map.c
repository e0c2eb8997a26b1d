/*
 * pc_u64map.c — see pc_u64map.h.
 */
#include "pc_u64map.h"

#include <stdbool.h>

#include "pc_alloc.h"
#include "pc_err.h"

#define MIN_CAP 16

static size_t home(uint64_t key, size_t cap)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    key *= 0xc4ceb9fe1a85ec53ull;
    key ^= key >> 33;
    return (size_t)key & (cap - 1);
}

void pc_u64map_free(pc_u64map_t *m)
{
    pc_free(m->slots);
    m->slots = NULL;
    m->cap = m->n = 0;
}

void *pc_u64map_get(const pc_u64map_t *m, uint64_t key)
{
    if (m->cap == 0 || key == 0)
        return NULL;
    for (size_t i = home(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (m->slots[i].key == key)
            return m->slots[i].value;
        if (m->slots[i].key == 0)
            return NULL;
    }
}

static void place(pc_u64map_slot_t *slots, size_t cap, uint64_t key, void *value)
{
    size_t i = home(key, cap);
    while (slots[i].key != 0)
        i = (i + 1) & (cap - 1);
    slots[i] = (pc_u64map_slot_t){key, value};
}

static int resize(pc_u64map_t *m, size_t cap)
{
    pc_u64map_slot_t *t = pc_calloc(cap, sizeof *t);
    if (t == NULL)
        return PC_ERR_NOMEM;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].key != 0)
            place(t, cap, m->slots[i].key, m->slots[i].value);
    pc_free(m->slots);
    m->slots = t;
    m->cap = cap;
    return 0;
}

int pc_u64map_reserve(pc_u64map_t *m, size_t n)
{
    size_t cap = pc__map_cap(m->cap, n);
    if (cap == 0)
        return PC_ERR_NOMEM;
    return cap > m->cap ? resize(m, cap) : 0;
}

int pc_u64map_put(pc_u64map_t *m, uint64_t key, void *value)
{
    if (key == 0 || value == NULL)
        return PC_ERR_INVAL;
    if (m->cap > 0) {
        for (size_t i = home(key, m->cap); m->slots[i].key != 0; i = (i + 1) & (m->cap - 1))
            if (m->slots[i].key == key) {
                m->slots[i].value = value;
                return 0;
            }
    }
    if (2 * (m->n + 1) > m->cap) {
        int rc = resize(m, m->cap ? 2 * m->cap : MIN_CAP);
        if (rc != 0)
            return rc;
    }
    place(m->slots, m->cap, key, value);
    m->n++;
    return 0;
}

void *pc_u64map_del(pc_u64map_t *m, uint64_t key)
{
    if (m->cap == 0 || key == 0)
        return NULL;
    size_t i = home(key, m->cap);
    while (m->slots[i].key != key) {
        if (m->slots[i].key == 0)
            return NULL;
        i = (i + 1) & (m->cap - 1);
    }
    void *value = m->slots[i].value;
    /* Backward shift: move each later entry of the run whose home is not in (i, j] into the
     * hole, so every remaining key stays reachable from its home without tombstones. */
    size_t mask = m->cap - 1;
    for (size_t j = (i + 1) & mask; m->slots[j].key != 0; j = (j + 1) & mask) {
        size_t h = home(m->slots[j].key, m->cap);
        bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
        if (stays)
            continue;
        m->slots[i] = m->slots[j];
        i = j;
    }
    m->slots[i] = (pc_u64map_slot_t){0, NULL};
    m->n--;
    if (m->n == 0)
        pc_u64map_free(m);
    else if (m->cap > MIN_CAP && 4 * m->n < m->cap / 2)
        (void)resize(m, m->cap / 2); /* best effort: a failed shrink keeps a valid table */
    return value;
}

size_t pc__map_cap(size_t cap, size_t n)
{
    if (n > SIZE_MAX / 4)
        return 0;
    if (cap == 0)
        cap = MIN_CAP;
    while (cap < 2 * n)
        cap *= 2;
    return cap;
}

size_t pc_u64map_next(const pc_u64map_t *m, size_t i)
{
    while (i < m->cap && m->slots[i].key == 0)
        i++;
    return i < m->cap ? i : m->cap;
}
