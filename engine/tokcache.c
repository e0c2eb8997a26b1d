/*
 * tokcache.c — the segment token cache (see tokcache.h for the contract).
 *
 * One hash table (common/pc_u64map keyed by 64 bits of the text's 128-bit hash; entries whose
 * keys collide are chained from the map's value) and one doubly linked LRU list, most recent
 * first, both under one mutex. An entry is a single
 * allocation: the header, then its ids, then its text (kept to confirm hits exactly). Its cost
 * is the allocation's size; the sum of the costs never exceeds max_bytes.
 *
 * Lock discipline: the mutex covers lookups (hash compare, text compare, copying the ids out),
 * LRU moves, linking and unlinking. Tokenizing, allocating and freeing entries and growing the
 * caller's id array happen outside it; only the rare table growth allocates under it (and a
 * failed growth fails that insert: the cache misses, nothing else changes).
 */
#include "tokcache.h"

#include <pthread.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "pc_alloc.h"
#include "pc_err.h"
#include "pc_u64map.h"

typedef struct entry {
    XXH128_hash_t h;
    uint64_t scope;
    struct entry *chain;       /* next with the same map key */
    struct entry *prev, *next; /* LRU: prev is more recent */
    size_t text_len, n_ids, cost;
    /* followed by uint32_t ids[n_ids], then char text[text_len] */
} entry_t;

struct eng_tokcache {
    const eng_tok_t *tok;
    size_t max_bytes, min_text_bytes;
    pthread_mutex_t mu;
    pc_u64map_t map; /* key_of(h) -> the first entry of its chain */
    size_t n_entries, bytes;
    entry_t *lru_head, *lru_tail;
    uint64_t hits, misses, inserts, evictions;
    uint64_t bypassed, insert_failures; /* atomics: counted without the lock */
};

static uint32_t *entry_ids(entry_t *e)
{
    return (uint32_t *)(e + 1);
}

static char *entry_text(entry_t *e)
{
    return (char *)(entry_ids(e) + e->n_ids);
}

eng_tokcache_params_t eng_tokcache_params_default(void)
{
    return (eng_tokcache_params_t){.max_bytes = (size_t)64 << 20, .min_text_bytes = 256};
}

int eng_tokcache_init(const eng_tok_t *tok, const eng_tokcache_params_t *p, eng_tokcache_t **out)
{
    eng_tokcache_params_t d = eng_tokcache_params_default();
    if (p == NULL)
        p = &d;
    if (tok == NULL || p->max_bytes == 0)
        return PC_ERR_INVAL;
    eng_tokcache_t *c = pc_calloc(1, sizeof *c);
    if (c == NULL)
        return PC_ERR_NOMEM;
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        pc_free(c);
        return PC_ERR_NOMEM;
    }
    c->tok = tok;
    c->max_bytes = p->max_bytes;
    c->min_text_bytes = p->min_text_bytes;
    *out = c;
    return 0;
}

void eng_tokcache_free(eng_tokcache_t *c)
{
    if (c == NULL)
        return;
    for (entry_t *e = c->lru_head, *next; e != NULL; e = next) {
        next = e->next;
        pc_free(e);
    }
    pthread_mutex_destroy(&c->mu);
    pc_u64map_free(&c->map);
    pc_free(c);
}

const eng_tok_t *eng_tokcache_tok(const eng_tokcache_t *c)
{
    return c->tok;
}

/* ---- table and LRU (caller holds the mutex) --------------------------------------------- */

/* The map key of a hash: its low 64 bits (pc_u64map refuses 0; 0 and 1 share a chain). */
static inline uint64_t key_of(XXH128_hash_t h)
{
    return h.low64 != 0 ? h.low64 : 1;
}

static entry_t *find(eng_tokcache_t *c, XXH128_hash_t h, uint64_t scope, const char *text,
                     size_t len)
{
    for (entry_t *e = pc_u64map_get(&c->map, key_of(h)); e != NULL; e = e->chain)
        if (XXH128_isEqual(e->h, h) && e->scope == scope && e->text_len == len &&
            (len == 0 || memcmp(entry_text(e), text, len) == 0))
            return e;
    return NULL;
}

static void lru_unlink(eng_tokcache_t *c, entry_t *e)
{
    if (e->prev != NULL)
        e->prev->next = e->next;
    else
        c->lru_head = e->next;
    if (e->next != NULL)
        e->next->prev = e->prev;
    else
        c->lru_tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push_front(eng_tokcache_t *c, entry_t *e)
{
    e->prev = NULL;
    e->next = c->lru_head;
    if (c->lru_head != NULL)
        c->lru_head->prev = e;
    c->lru_head = e;
    if (c->lru_tail == NULL)
        c->lru_tail = e;
}

/* Unlinks e from its chain and the LRU; the caller frees it (after unlocking). Never fails:
 * replacing a chain's head does not allocate, and a deletion's shrink is best effort. */
static void unlink_entry(eng_tokcache_t *c, entry_t *e)
{
    uint64_t k = key_of(e->h);
    entry_t *head = pc_u64map_get(&c->map, k);
    if (head == e) {
        if (e->chain != NULL)
            (void)pc_u64map_put(&c->map, k, e->chain);
        else
            (void)pc_u64map_del(&c->map, k);
    } else {
        entry_t *p = head;
        while (p->chain != e)
            p = p->chain;
        p->chain = e->chain;
    }
    lru_unlink(c, e);
    c->n_entries--;
    c->bytes -= e->cost;
}

/* ---- encode ----------------------------------------------------------------------------- */

static int grow_ids(uint32_t **ids, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap != 0 ? *cap : 256;
    while (nc < need)
        nc = nc > SIZE_MAX / 2 ? need : nc * 2;
    uint32_t *p = pc_reallocarray(*ids, nc, sizeof *p);
    if (p == NULL)
        return PC_ERR_NOMEM;
    *ids = p;
    *cap = nc;
    return 0;
}

/* Under the mutex: copies a hit into the caller's array and sets *need to the ids copied.
 * Returns 1 on a hit, 0 on a miss, 2 on a hit that does not fit (*need = the array size it
 * needs; nothing copied). */
static int lookup_locked(eng_tokcache_t *c, XXH128_hash_t h, uint64_t scope, const char *text,
                         size_t len, uint32_t *ids, size_t n_ids, size_t cap, size_t *need)
{
    entry_t *e = find(c, h, scope, text, len);
    if (e == NULL)
        return 0;
    if (n_ids + e->n_ids > cap) {
        *need = n_ids + e->n_ids;
        return 2;
    }
    if (e->n_ids > 0)
        memcpy(ids + n_ids, entry_ids(e), e->n_ids * sizeof *ids);
    *need = e->n_ids;
    if (c->lru_head != e) {
        lru_unlink(c, e);
        lru_push_front(c, e);
    }
    return 1;
}

/* Keeps ids[0 .. n_ids) as the entry of (scope, text) unless it is already there or can never
 * fit. Evicts from the LRU tail to stay within the budget. */
static void insert(eng_tokcache_t *c, XXH128_hash_t h, uint64_t scope, const char *text, size_t len,
                   const uint32_t *ids, size_t n_ids)
{
    size_t hdr_ids = sizeof(entry_t) + n_ids * sizeof(uint32_t);
    if (n_ids > (SIZE_MAX - sizeof(entry_t)) / sizeof(uint32_t) || len > SIZE_MAX - hdr_ids ||
        hdr_ids + len > c->max_bytes)
        return;
    size_t cost = hdr_ids + len;
    entry_t *e = pc_malloc(cost);
    if (e == NULL) {
        __atomic_fetch_add(&c->insert_failures, 1, __ATOMIC_RELAXED);
        return;
    }
    *e = (entry_t){.h = h, .scope = scope, .text_len = len, .n_ids = n_ids, .cost = cost};
    if (n_ids > 0)
        memcpy(entry_ids(e), ids, n_ids * sizeof *ids);
    if (len > 0)
        memcpy(entry_text(e), text, len);

    entry_t *dead = NULL; /* freed after unlocking, chained through ->chain */
    pthread_mutex_lock(&c->mu);
    e->chain = pc_u64map_get(&c->map, key_of(h));
    if (find(c, h, scope, text, len) != NULL) {
        dead = e; /* another thread inserted it meanwhile */
        dead->chain = NULL;
    } else if (pc_u64map_put(&c->map, key_of(h), e) != 0) {
        dead = e; /* the table could not grow */
        dead->chain = NULL;
        __atomic_fetch_add(&c->insert_failures, 1, __ATOMIC_RELAXED);
    } else {
        while (c->bytes + cost > c->max_bytes && c->lru_tail != NULL) {
            entry_t *v = c->lru_tail;
            unlink_entry(c, v);
            v->chain = dead;
            dead = v;
            c->evictions++;
        }
        c->n_entries++;
        c->bytes += cost;
        lru_push_front(c, e);
        c->inserts++;
    }
    pthread_mutex_unlock(&c->mu);
    while (dead != NULL) {
        entry_t *next = dead->chain;
        pc_free(dead);
        dead = next;
    }
}

int eng_tokcache_encode(eng_tokcache_t *c, uint64_t scope, const char *text, size_t len,
                        uint32_t **ids, size_t *n_ids, size_t *cap)
{
    if (len < c->min_text_bytes) {
        __atomic_fetch_add(&c->bypassed, 1, __ATOMIC_RELAXED);
        return eng_tok_encode(c->tok, text, len, ids, n_ids, cap);
    }
    XXH128_hash_t h = XXH3_128bits_withSeed(text, len, scope);
    /* A hit whose ids do not fit: grow the array unlocked and look again (the entry may have
     * gone meanwhile, then it is a miss). Twice at most: the second need is the same entry's. */
    for (int attempt = 0; attempt < 2; attempt++) {
        size_t need = 0;
        pthread_mutex_lock(&c->mu);
        int hit = lookup_locked(c, h, scope, text, len, *ids, *n_ids, *cap, &need);
        if (hit == 1)
            c->hits++;
        else if (hit == 0 || attempt == 1)
            c->misses++;
        pthread_mutex_unlock(&c->mu);
        if (hit == 1) {
            *n_ids += need;
            return 0;
        }
        if (hit == 0)
            break;
        if (attempt == 0 && grow_ids(ids, cap, need) != 0)
            return PC_ERR_NOMEM;
    }
    size_t before = *n_ids;
    int rc = eng_tok_encode(c->tok, text, len, ids, n_ids, cap);
    if (rc != 0)
        return rc;
    insert(c, h, scope, text, len, *n_ids > before ? *ids + before : NULL, *n_ids - before);
    return 0;
}

eng_tokcache_stats_t eng_tokcache_stats(eng_tokcache_t *c)
{
    eng_tokcache_stats_t s;
    pthread_mutex_lock(&c->mu);
    s = (eng_tokcache_stats_t){
        .hits = c->hits,
        .misses = c->misses,
        .inserts = c->inserts,
        .evictions = c->evictions,
        .n_entries = c->n_entries,
        .bytes = c->bytes,
        .max_bytes = c->max_bytes,
    };
    pthread_mutex_unlock(&c->mu);
    s.bypassed = __atomic_load_n(&c->bypassed, __ATOMIC_RELAXED);
    s.insert_failures = __atomic_load_n(&c->insert_failures, __ATOMIC_RELAXED);
    return s;
}
