/*
 * prefix.c — the worker-local prefix index: token prefixes -> KV blocks, per namespace, over a
 * radix tree (radix/radix.h). See engine.h for the contract.
 *
 * Payloads. Each tree node carries a payload for the positions of its edge,
 * [pos0, pos0 + n_tokens), holding one reference to each KV block those positions fall in
 * (block indices pos0 / bt .. (pos0 + n_tokens - 1) / bt). The blocks come from the sequence
 * that inserted the node, and since KV depends only on the tokens before a position, a node's
 * block for index i also holds valid KV for every earlier position of block i on the node's
 * path. So a match of k tokens takes, for each block index below ceil(k / bt), the block of the
 * deepest path node that covers any position of it. Two siblings that diverge inside a block
 * hold different blocks for that index (one of them was copied on write), each valid for its
 * own branch. A split divides a payload at the split point; a block straddling the point is
 * referenced by both halves.
 *
 * Lifetimes. Everything is inserted with RDX_EXPIRY_NEVER: the radix LRU evicts unpinned
 * leaves when the pool needs blocks (the pool's eviction hook). Retention (prefix.h's state
 * machine) is a px_pin_t per retained prefix: its node, its expiry and its positions in two
 * min-heaps by expiry, `all` (every pin) and `held` (the PINNED ones, which hold one radix pin
 * on the node). The node's payload points back at its pin, so a release finds the pin with one
 * match and an eviction with none; a split hands the pointer to the tail payload, which stays
 * with the node object (the node that ends where the pin does). eng_prefix_expire pops `all`;
 * under hard pressure (no unpinned leaf left) the hook pops `held`, drops that radix pin and
 * leaves the pin LAPSED in `all`, until its expiry, a release, or its node's removal
 * (payload_free ends it). The radix tree's own expiry is not used: an expired pin leaves the
 * prefix as ordinary LRU cache, where a radix expiry would remove it.
 *
 * Accounting: every live payload is on a list, so eng_check can count the references the
 * index holds.
 */
#include <stdio.h>
#include <string.h>

#include "engine_internal.h"
#include "pc_alloc.h"
#include "pc_assert.h"
#include "pc_err.h"
#include "pc_vec.h"
#include "radix.h"

/* The links of the live-payload list; the list's sentinel is a bare link (a payload has a
 * flexible array, so it cannot be a member of another struct). */
typedef struct px_link {
    struct px_link *prev, *next;
} px_link_t;

typedef struct px_pin px_pin_t;

typedef struct px_payload {
    px_link_t link; /* first member: a link pointer converts to its payload */
    px_pin_t *pin;  /* the pin of the node that holds this payload, or NULL */
    uint32_t pos0, n_tokens;
    uint32_t n_blocks;
    uint32_t blocks[]; /* [n_blocks] */
} px_payload_t;

/* The two heaps a pin can sit in (prefix.h: `all` holds PINNED and LAPSED, `held` PINNED). */
enum { PX_ALL = 0, PX_HELD = 1, PX_N_HEAPS = 2 };

#define PX_NOWHERE UINT32_MAX

struct px_pin {
    rdx_node_t *node;
    uint64_t expiry;
    uint32_t at[PX_N_HEAPS]; /* position in each heap, or PX_NOWHERE */
    px_pin_t *next_out;      /* eng_prefix_release_ns's list of pins to end */
};

/* A binary min-heap of pins by expiry; each pin records its position (at[which]). */
typedef struct px_heap {
    px_pin_t **v; /* [cap] */
    uint32_t n;
    size_t cap;
} px_heap_t;

struct eng_prefix {
    eng_t *e;
    rdx_tree_t *tree;
    px_link_t list;              /* sentinel of the live payloads */
    px_heap_t heaps[PX_N_HEAPS]; /* pins by expiry: all, and the held ones */
    uint32_t *pin_path;          /* [pin_path_cap] a pin's tokens for reports */
    uint32_t pin_path_cap;       /* >= every pin's length (grown by retain) */
    uint64_t clock;              /* logical time for the LRU */
    int reason_now;              /* the reason reported for nodes freed now; 0 = report nothing */
    uint32_t *path_buf;          /* block table scratch */
    uint32_t path_cap;
    uint32_t *evict_path; /* token path scratch for eviction events */
    size_t evict_cap;
    eng_evict_fn cb;
    void *cb_ud;
    eng_prefix_stats_t stats;
};

static uint32_t bt_of(const struct eng_prefix *px)
{
    return eng_kvpool_block_tokens(px->e->kv);
}

/* Grows a scratch array to hold n entries. Returns 0 or PC_ERR_NOMEM (unchanged). */
static int scratch_reserve(uint32_t **buf, uint32_t *cap, uint32_t n)
{
    if (n <= *cap)
        return 0;
    uint32_t *b = pc_reallocarray(*buf, n, sizeof *b);
    if (b == NULL)
        return PC_ERR_NOMEM;
    *buf = b;
    *cap = n;
    return 0;
}

/* ---- pins ---- */

static void heap_put(px_heap_t *h, int which, uint32_t i, px_pin_t *pin)
{
    h->v[i] = pin;
    pin->at[which] = i;
}

/* Moves the pin at position i up or down until the heap is ordered again. */
static void heap_settle(px_heap_t *h, int which, uint32_t i)
{
    px_pin_t *pin = h->v[i];
    while (i > 0 && pin->expiry < h->v[(i - 1) / 2]->expiry) {
        heap_put(h, which, i, h->v[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    for (uint32_t c; (c = 2 * i + 1) < h->n; i = c) {
        if (c + 1 < h->n && h->v[c + 1]->expiry < h->v[c]->expiry)
            c++;
        if (h->v[c]->expiry >= pin->expiry)
            break;
        heap_put(h, which, i, h->v[c]);
    }
    heap_put(h, which, i, pin);
}

/* Room for one more pin; the push that follows cannot fail. */
static int heap_reserve(px_heap_t *h)
{
    return pc_array_reserve(&h->v, &h->cap, (size_t)h->n + 1);
}

static void heap_push(px_heap_t *h, int which, px_pin_t *pin)
{
    PC_ASSERT(h->n < h->cap && pin->at[which] == PX_NOWHERE);
    heap_put(h, which, h->n++, pin);
    heap_settle(h, which, pin->at[which]);
}

static void heap_remove(px_heap_t *h, int which, px_pin_t *pin)
{
    uint32_t i = pin->at[which];
    if (i == PX_NOWHERE)
        return;
    pin->at[which] = PX_NOWHERE;
    px_pin_t *last = h->v[--h->n];
    if (last != pin) {
        heap_put(h, which, i, last);
        heap_settle(h, which, i);
    }
}

static bool pin_held(const px_pin_t *pin)
{
    return pin->at[PX_HELD] != PX_NOWHERE;
}

/* Takes the pin out of both heaps and frees it; the radix pin and the payload's pointer are
 * the caller's business. */
static void pin_forget(struct eng_prefix *px, px_pin_t *pin)
{
    for (int h = 0; h < PX_N_HEAPS; h++)
        heap_remove(&px->heaps[h], h, pin);
    pc_free(pin);
}

/* Ends a pin: its radix pin goes (when held), the node stays cached. Fills *rep for the report
 * (tokens in pin_path, which retain sized for every pin). */
static void pin_end(struct eng_prefix *px, px_pin_t *pin, eng_prefix_pin_t *rep)
{
    rdx_node_t *node = pin->node;
    size_t n = rdx_node_depth(node);
    PC_ASSERT(n <= px->pin_path_cap);
    rdx_node_prefix(px->tree, node, px->pin_path);
    *rep = (eng_prefix_pin_t){.ns = rdx_node_ns(node),
                              .expiry = pin->expiry,
                              .n_tokens = (uint32_t)n,
                              .held = pin_held(pin),
                              .tokens = (const int32_t *)px->pin_path};
    px_payload_t *p = rdx_node_payload(node);
    PC_ASSERT(p != NULL && p->pin == pin);
    p->pin = NULL;
    pin_forget(px, pin);
    /* Inserted with RDX_EXPIRY_NEVER, the node outlives its last pin. */
    if (rep->held)
        rdx_tree_unpin(px->tree, node);
}

/* A payload for positions [pos0, pos0 + n), referencing the blocks of their block indices;
 * table[j] holds the block of index table_first + j. */
static px_payload_t *payload_new(struct eng_prefix *px, uint32_t pos0, uint32_t n,
                                 const uint32_t *table, uint32_t table_first)
{
    uint32_t bt = bt_of(px), first = pos0 / bt, last = (pos0 + n - 1) / bt;
    px_payload_t *p = pc_malloc(sizeof *p + (size_t)(last - first + 1) * sizeof(uint32_t));
    if (p == NULL)
        return NULL;
    p->pin = NULL;
    p->pos0 = pos0;
    p->n_tokens = n;
    p->n_blocks = last - first + 1;
    for (uint32_t i = 0; i < p->n_blocks; i++) {
        p->blocks[i] = table[first + i - table_first];
        eng_kvpool_ref(px->e->kv, p->blocks[i]);
    }
    p->link.next = px->list.next;
    p->link.prev = &px->list;
    px->list.next->prev = &p->link;
    px->list.next = &p->link;
    return p;
}

static void payload_free(void *payload, void *ud)
{
    struct eng_prefix *px = ud;
    px_payload_t *p = payload;
    if (p == NULL)
        return;
    for (uint32_t i = 0; i < p->n_blocks; i++)
        eng_kvpool_unref(px->e->kv, p->blocks[i]);
    /* A node goes with its pin only when the pin had lapsed (or the tree is destroyed). */
    if (p->pin != NULL)
        pin_forget(px, p->pin);
    p->link.prev->next = p->link.next;
    p->link.next->prev = p->link.prev;
    pc_free(p);
}

static int payload_split(void *payload, uint32_t at, void **tail_out, void *ud)
{
    struct eng_prefix *px = ud;
    px_payload_t *p = payload;
    uint32_t bt = bt_of(px), first = p->pos0 / bt;
    PC_ASSERT(at > 0 && at < p->n_tokens);
    /* The tail's blocks, as a table indexed from block `first`. */
    px_payload_t *tail = payload_new(px, p->pos0 + at, p->n_tokens - at, p->blocks, first);
    if (tail == NULL)
        return PC_ERR_NOMEM;
    uint32_t head_blocks = (p->pos0 + at - 1) / bt - first + 1;
    for (uint32_t i = head_blocks; i < p->n_blocks; i++)
        eng_kvpool_unref(px->e->kv, p->blocks[i]);
    p->n_blocks = head_blocks;
    p->n_tokens = at;
    /* The node object keeps its end and takes the tail; the head goes to the new upper node. */
    tail->pin = p->pin;
    p->pin = NULL;
    *tail_out = tail;
    return 0;
}

static void on_free(const rdx_free_event_t *ev, void *ud)
{
    struct eng_prefix *px = ud;
    if (px->reason_now == 0 || ev->reason == RDX_FREE_DESTROY)
        return;
    px->stats.n_evicted++;
    bool write_back =
        px->e->tier != NULL && px->reason_now != ENG_EVICT_REMOVED && ev->payload != NULL;
    if (px->cb == NULL && !write_back)
        return;
    eng_evict_event_t e = {.ns = ev->ns,
                           .n_tokens = (uint32_t)(ev->depth - ev->len),
                           .n_dropped = ev->len,
                           .reason = px->reason_now,
                           .tier = ENG_TIER_NONE};
    /* The node and its ancestors are still linked (removal is bottom-up), so its path can be
     * read; without memory for it the event goes out without the path. */
    if (ev->depth > px->evict_cap) {
        uint32_t *b = pc_reallocarray(px->evict_path, ev->depth, sizeof *b);
        if (b != NULL) {
            px->evict_path = b;
            px->evict_cap = ev->depth;
        }
    }
    if (ev->depth <= px->evict_cap && ev->node != NULL &&
        rdx_node_prefix(px->tree, ev->node, px->evict_path) == ev->depth)
        e.tokens = (const int32_t *)px->evict_path;
    /* Write-back: the payload's blocks still hold the node's KV (they are unreferenced after
     * this callback), so the tiers copy the whole ones before the pool reuses them. */
    if (write_back && e.tokens != NULL) {
        const px_payload_t *p = ev->payload;
        e.tier = eng__tier_write(px->e, ev->ns, e.tokens, (uint32_t)ev->depth, p->blocks,
                                 p->pos0 / bt_of(px), true);
    }
    if (px->cb != NULL)
        px->cb(&e, px->cb_ud);
}

/* The KV pool's eviction hook: LRU leaves first, then, under hard pressure, pins. */
static uint32_t evict_hook(void *ud, uint32_t n_blocks)
{
    struct eng_prefix *px = ud;
    eng_kvpool_t *kv = px->e->kv;
    uint32_t before = eng_kvpool_n_free(kv);
    int reason = ENG_EVICT_LRU;
    while (eng_kvpool_n_free(kv) < before + n_blocks) {
        size_t freed = 0;
        px->reason_now = reason;
        rdx_tree_evict(px->tree, bt_of(px), &freed);
        px->reason_now = 0;
        if (freed > 0)
            continue;
        px_heap_t *held = &px->heaps[PX_HELD];
        if (held->n == 0)
            break;
        /* The pin expiring first lapses: O(log pins), and it stays a pin until its node goes. */
        px_pin_t *pin = held->v[0];
        heap_remove(held, PX_HELD, pin);
        px->reason_now = ENG_EVICT_PRESSURE;
        rdx_tree_unpin(px->tree, pin->node);
        px->reason_now = 0;
        reason = ENG_EVICT_PRESSURE;
    }
    return eng_kvpool_n_free(kv) - before;
}

int eng__prefix_init(eng_t *e, struct eng_prefix **out)
{
    *out = NULL;
    struct eng_prefix *px = pc_calloc(1, sizeof *px);
    if (px == NULL)
        return PC_ERR_NOMEM;
    px->e = e;
    px->list.next = px->list.prev = &px->list;
    rdx_tree_params_t rp = rdx_tree_params_default();
    rp.vocab_size = e->model->hp.n_vocab;
    rp.max_owners = 1;
    rp.payload_free = payload_free;
    rp.payload_split = payload_split;
    rp.on_free = on_free;
    rp.ud = px;
    int rc = rdx_tree_init(&rp, &px->tree);
    if (rc != 0) {
        pc_free(px);
        return rc;
    }
    eng_kvpool_set_evict(e->kv, evict_hook, px);
    *out = px;
    return 0;
}

void eng__prefix_shutdown(eng_t *e)
{
    struct eng_prefix *px = e->prefix;
    if (px == NULL || e->tier == NULL)
        return;
    px->cb = NULL; /* the engine is going away: nobody to tell */
    eng__tier_drain_begin(e);
    while (eng__tier_drain_more(e)) {
        size_t freed = 0;
        px->reason_now = ENG_EVICT_LRU;
        rdx_tree_evict(px->tree, bt_of(px), &freed);
        px->reason_now = 0;
        if (freed == 0)
            break;
    }
    eng__tier_drain_end(e);
}

void eng__prefix_free(struct eng_prefix *px)
{
    if (px == NULL)
        return;
    eng_kvpool_set_evict(px->e->kv, NULL, NULL);
    px->reason_now = 0;
    rdx_tree_free(px->tree);
    PC_ASSERT(px->list.next == &px->list);
    PC_ASSERT(px->heaps[PX_ALL].n == 0 && px->heaps[PX_HELD].n == 0);
    for (int h = 0; h < PX_N_HEAPS; h++)
        pc_free(px->heaps[h].v);
    pc_free(px->pin_path);
    pc_free(px->path_buf);
    pc_free(px->evict_path);
    pc_free(px);
}

void eng__prefix_count_refs(const struct eng_prefix *px, uint32_t *refs)
{
    for (const px_link_t *l = px->list.next; l != &px->list; l = l->next) {
        const px_payload_t *p = (const px_payload_t *)l;
        for (uint32_t i = 0; i < p->n_blocks; i++)
            refs[p->blocks[i]]++;
    }
}

int eng__prefix_check(const struct eng_prefix *px, char *err, size_t err_len)
{
    return rdx_tree_check(px->tree, err, err_len);
}

void eng_set_evict_callback(eng_t *e, eng_evict_fn fn, void *ud)
{
    e->prefix->cb = fn;
    e->prefix->cb_ud = ud;
}

uint32_t eng__prefix_match_len(eng_t *e, uint64_t ns, const int32_t *tokens, uint32_t n)
{
    rdx_match_t m;
    rdx_tree_match(e->prefix->tree, ns, (const uint32_t *)tokens, n, &m);
    return (uint32_t)m.n_matched;
}

/* Shares the longest G1 match of tokens[0..n - 1) with the empty sequence s. Returns 0 or
 * PC_ERR_NOMEM (s stays empty). */
static int start_g1(eng_t *e, eng_seq_t *s, uint64_t ns, const int32_t *tokens, uint32_t n)
{
    struct eng_prefix *px = e->prefix;
    rdx_match_t m;
    rdx_tree_match(px->tree, ns, (const uint32_t *)tokens, n - 1, &m);
    uint32_t k = (uint32_t)m.n_matched;
    if (k == 0)
        return 0;
    uint32_t bt = bt_of(px), nb = (k + bt - 1) / bt;
    if (scratch_reserve(&px->path_buf, &px->path_cap, nb) != 0)
        return PC_ERR_NOMEM;
    /* Deepest node first: the first payload to cover a block index supplies its block. */
    uint32_t *table = px->path_buf;
    for (uint32_t i = 0; i < nb; i++)
        table[i] = UINT32_MAX;
    for (rdx_node_t *node = m.node; node != NULL; node = rdx_node_parent(node)) {
        const px_payload_t *p = rdx_node_payload(node);
        PC_ASSERT(p != NULL);
        uint32_t first = p->pos0 / bt;
        for (uint32_t i = 0; i < p->n_blocks && first + i < nb; i++)
            if (table[first + i] == UINT32_MAX)
                table[first + i] = p->blocks[i];
    }
    for (uint32_t i = 0; i < nb; i++)
        PC_ASSERT(table[i] != UINT32_MAX);
    int rc = eng__seq_tokens_reserve(s, k);
    if (rc != 0)
        return rc;
    rc = eng_kvseq_share(&s->kv, e->kv, table, k);
    if (rc != 0)
        return rc;
    memcpy(s->tokens, tokens, k * sizeof *tokens);
    rdx_tree_touch(px->tree, m.node, ++px->clock, 0);
    px->stats.n_hit_tokens += k;
    s->origin.g1_tokens = k;
    return 0;
}

int eng_seq_start_cached(eng_t *e, eng_seq_t *s, uint64_t ns, const int32_t *tokens, uint32_t n,
                         uint32_t *n_reused)
{
    struct eng_prefix *px = e->prefix;
    *n_reused = 0;
    if (s->kv.n_tokens != 0 || s->kv.n_blocks != 0)
        return PC_ERR_STATE;
    s->origin = (eng_seq_origin_t){0};
    px->stats.n_lookups++;
    if (n < 2)
        return 0;
    int rc = start_g1(e, s, ns, tokens, n);
    if (rc != 0)
        return rc;
    if (e->tier != NULL)
        eng__tier_continue(e, s, ns, tokens, n);
    *n_reused = s->kv.n_tokens;
    return 0;
}

/* Inserts s's first n positions; *node_out gets the node ending at n. */
static int prefix_insert(eng_t *e, eng_seq_t *s, uint64_t ns, uint32_t n, rdx_node_t **node_out)
{
    struct eng_prefix *px = e->prefix;
    if (n == 0 || n > s->kv.n_tokens)
        return PC_ERR_INVAL;
    const uint32_t *tok = (const uint32_t *)s->tokens;
    rdx_match_t m;
    rdx_tree_match(px->tree, ns, tok, n, &m);
    px_payload_t *p = NULL;
    if (m.n_matched < n) {
        p = payload_new(px, (uint32_t)m.n_matched, n - (uint32_t)m.n_matched, s->kv.blocks, 0);
        if (p == NULL)
            return PC_ERR_NOMEM;
    }
    rdx_node_t *node = NULL;
    int rc = rdx_tree_insert(px->tree, ns, tok, n, ++px->clock, RDX_EXPIRY_NEVER, RDX_INSERT_ENTRY,
                             &node);
    if (rc < 0) {
        payload_free(p, px);
        return rc;
    }
    if (rc == 0) {
        PC_ASSERT(p != NULL && rdx_node_payload(node) == NULL &&
                  rdx_node_depth(node) - rdx_node_len(node) == m.n_matched);
        rdx_tree_set_payload(px->tree, node, p);
    } else {
        PC_ASSERT(p == NULL);
    }
    *node_out = node;
    return 0;
}

int eng_prefix_insert(eng_t *e, eng_seq_t *s, uint64_t ns, uint32_t n)
{
    rdx_node_t *node;
    return prefix_insert(e, s, ns, n, &node);
}

int eng_prefix_retain(eng_t *e, eng_seq_t *s, uint64_t ns, uint32_t n, uint64_t expiry,
                      uint64_t *until)
{
    struct eng_prefix *px = e->prefix;
    /* Everything a new pin needs, first: from the insert on, nothing below fails. */
    for (int h = 0; h < PX_N_HEAPS; h++)
        if (heap_reserve(&px->heaps[h]) != 0)
            return PC_ERR_NOMEM;
    if (scratch_reserve(&px->pin_path, &px->pin_path_cap, n) != 0)
        return PC_ERR_NOMEM;
    px_pin_t *fresh = pc_malloc(sizeof *fresh);
    if (fresh == NULL)
        return PC_ERR_NOMEM;
    rdx_node_t *node;
    int rc = prefix_insert(e, s, ns, n, &node);
    if (rc != 0) {
        pc_free(fresh);
        return rc;
    }
    px_payload_t *p = rdx_node_payload(node);
    px_pin_t *pin = p->pin;
    if (pin == NULL) {
        *fresh = (px_pin_t){.node = node, .expiry = expiry, .at = {PX_NOWHERE, PX_NOWHERE}};
        pin = p->pin = fresh;
        heap_push(&px->heaps[PX_ALL], PX_ALL, pin);
    } else {
        /* One pin per prefix: retaining it again moves its expiry (a TTL refresh), so pins do
         * not grow with traffic. Only ever later: the pin moves down its heaps. */
        pc_free(fresh);
        if (expiry > pin->expiry) {
            pin->expiry = expiry;
            for (int h = 0; h < PX_N_HEAPS; h++)
                if (pin->at[h] != PX_NOWHERE)
                    heap_settle(&px->heaps[h], h, pin->at[h]);
        }
    }
    if (!pin_held(pin)) {
        /* One radix pin per node, held by this pin alone: the count cannot overflow. */
        rc = rdx_tree_pin(px->tree, node);
        PC_ASSERT(rc == 0);
        heap_push(&px->heaps[PX_HELD], PX_HELD, pin);
    }
    if (until != NULL)
        *until = pin->expiry;
    /* Write-through: what a customer pays to keep survives the pool and the process (blocks a
     * tier holds already are skipped). */
    if (e->tier != NULL && e->p.tier.write_through)
        eng__tier_write(e, ns, s->tokens, n, s->kv.blocks, 0, false);
    return 0;
}

int eng_prefix_release(eng_t *e, uint64_t ns, const int32_t *tokens, uint32_t n)
{
    struct eng_prefix *px = e->prefix;
    if (n == 0)
        return PC_ERR_NOTFOUND;
    rdx_match_t m;
    rdx_tree_match(px->tree, ns, (const uint32_t *)tokens, n, &m);
    if (m.n_matched != n || m.edge_offset != rdx_node_len(m.node))
        return PC_ERR_NOTFOUND;
    const px_payload_t *p = rdx_node_payload(m.node);
    if (p == NULL || p->pin == NULL)
        return PC_ERR_NOTFOUND;
    eng_prefix_pin_t rep;
    pin_end(px, p->pin, &rep);
    return 0;
}

uint32_t eng_prefix_expire(eng_t *e, uint64_t now, eng_prefix_pin_fn fn, void *ud)
{
    struct eng_prefix *px = e->prefix;
    px_heap_t *all = &px->heaps[PX_ALL];
    uint32_t n = 0;
    while (all->n > 0 && all->v[0]->expiry <= now) {
        eng_prefix_pin_t rep;
        pin_end(px, all->v[0], &rep);
        if (fn != NULL)
            fn(&rep, ud);
        n++;
    }
    return n;
}

uint64_t eng_prefix_next_expiry(const eng_t *e)
{
    const px_heap_t *all = &e->prefix->heaps[PX_ALL];
    return all->n > 0 ? all->v[0]->expiry : UINT64_MAX;
}

uint32_t eng_prefix_release_ns(eng_t *e, uint64_t ns, eng_prefix_pin_fn fn, void *ud)
{
    struct eng_prefix *px = e->prefix;
    px_heap_t *all = &px->heaps[PX_ALL];
    /* Collect first: ending a pin reorders the heap under the scan. */
    px_pin_t *out = NULL;
    for (uint32_t i = all->n; i-- > 0;)
        if (rdx_node_ns(all->v[i]->node) == ns) {
            all->v[i]->next_out = out;
            out = all->v[i];
        }
    uint32_t n = 0;
    while (out != NULL) {
        px_pin_t *next = out->next_out;
        eng_prefix_pin_t rep;
        pin_end(px, out, &rep);
        if (fn != NULL)
            fn(&rep, ud);
        out = next;
        n++;
    }
    return n;
}

uint32_t eng_prefix_n_pins(const eng_t *e)
{
    return e->prefix->heaps[PX_ALL].n;
}

void eng_prefix_pin_at(const eng_t *e, uint32_t i, eng_prefix_pin_t *out, int32_t *tokens)
{
    const struct eng_prefix *px = e->prefix;
    PC_ASSERT(i < px->heaps[PX_ALL].n);
    const px_pin_t *pin = px->heaps[PX_ALL].v[i];
    *out = (eng_prefix_pin_t){.ns = rdx_node_ns(pin->node),
                              .expiry = pin->expiry,
                              .n_tokens = (uint32_t)rdx_node_depth(pin->node),
                              .held = pin_held(pin),
                              .tokens = NULL};
    if (tokens != NULL) {
        rdx_node_prefix(px->tree, pin->node, (uint32_t *)tokens);
        out->tokens = tokens;
    }
}

int eng_prefix_drop(eng_t *e, uint64_t ns, const int32_t *tokens, uint32_t n)
{
    struct eng_prefix *px = e->prefix;
    px->reason_now = ENG_EVICT_REMOVED;
    int rc = rdx_tree_remove_prefix(px->tree, ns, (const uint32_t *)tokens, n);
    px->reason_now = 0;
    /* The dropped prompts leave the tiers too, so that a tenant's dropped KV never comes back
     * from disk (a pinned prefix keeps everything, as above). */
    if (e->tier != NULL && rc != PC_ERR_BUSY) {
        int trc = n == 0 ? eng__tier_drop_ns(e, ns) : eng__tier_drop_prefix(e, ns, tokens, n);
        if (trc != 0)
            return trc;
    }
    return rc;
}

void eng_prefix_stats(const eng_t *e, eng_prefix_stats_t *out)
{
    const struct eng_prefix *px = e->prefix;
    *out = px->stats;
    rdx_stats_t rs;
    rdx_tree_stats(px->tree, &rs);
    out->n_tokens = rs.n_tokens;
    out->n_nodes = rs.n_nodes;
    out->n_retained = px->heaps[PX_HELD].n;
}
