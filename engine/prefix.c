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
 * leaves when the pool needs blocks (the pool's eviction hook), and retention is a pin whose
 * expiry this file keeps (pins[]); eng_prefix_expire drops the pins that ran out, leaving the
 * prefix as ordinary LRU cache. Under hard pressure (no unpinned leaf left) the pin expiring
 * first is dropped and eviction goes on.
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
#include "radix.h"

/* The links of the live-payload list; the list's sentinel is a bare link (a payload has a
 * flexible array, so it cannot be a member of another struct). */
typedef struct px_link {
    struct px_link *prev, *next;
} px_link_t;

typedef struct px_payload {
    px_link_t link; /* first member: a link pointer converts to its payload */
    uint32_t pos0, n_tokens;
    uint32_t n_blocks;
    uint32_t blocks[]; /* [n_blocks] */
} px_payload_t;

typedef struct px_pin {
    rdx_node_t *node;
    uint64_t expiry;
} px_pin_t;

struct eng_prefix {
    eng_t *e;
    rdx_tree_t *tree;
    px_link_t list; /* sentinel of the live payloads */
    px_pin_t *pins;
    uint32_t n_pins, pins_cap;
    uint64_t clock;     /* logical time for the LRU */
    int reason_now;     /* the reason reported for nodes freed now; 0 = report nothing */
    uint32_t *path_buf; /* block table scratch */
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

/* A payload for positions [pos0, pos0 + n), referencing the blocks of their block indices;
 * table[j] holds the block of index table_first + j. */
static px_payload_t *payload_new(struct eng_prefix *px, uint32_t pos0, uint32_t n,
                                 const uint32_t *table, uint32_t table_first)
{
    uint32_t bt = bt_of(px), first = pos0 / bt, last = (pos0 + n - 1) / bt;
    px_payload_t *p = pc_malloc(sizeof *p + (size_t)(last - first + 1) * sizeof(uint32_t));
    if (p == NULL)
        return NULL;
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
    *tail_out = tail;
    return 0;
}

static void on_free(const rdx_free_event_t *ev, void *ud)
{
    struct eng_prefix *px = ud;
    if (px->reason_now == 0 || ev->reason == RDX_FREE_DESTROY)
        return;
    px->stats.n_evicted++;
    if (px->cb == NULL)
        return;
    eng_evict_event_t e = {.ns = ev->ns,
                           .n_tokens = (uint32_t)(ev->depth - ev->len),
                           .n_dropped = ev->len,
                           .reason = px->reason_now};
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
    px->cb(&e, px->cb_ud);
}

static void pin_remove(struct eng_prefix *px, uint32_t i)
{
    px->pins[i] = px->pins[--px->n_pins];
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
        if (px->n_pins == 0)
            break;
        uint32_t best = 0;
        for (uint32_t i = 1; i < px->n_pins; i++)
            if (px->pins[i].expiry < px->pins[best].expiry)
                best = i;
        rdx_node_t *node = px->pins[best].node;
        pin_remove(px, best);
        px->reason_now = ENG_EVICT_PRESSURE;
        rdx_tree_unpin(px->tree, node);
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

void eng__prefix_free(struct eng_prefix *px)
{
    if (px == NULL)
        return;
    eng_kvpool_set_evict(px->e->kv, NULL, NULL);
    px->reason_now = 0;
    rdx_tree_free(px->tree);
    PC_ASSERT(px->list.next == &px->list);
    pc_free(px->pins);
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

int eng_seq_start_cached(eng_t *e, eng_seq_t *s, uint64_t ns, const int32_t *tokens, uint32_t n,
                         uint32_t *n_reused)
{
    struct eng_prefix *px = e->prefix;
    *n_reused = 0;
    if (s->kv.n_tokens != 0 || s->kv.n_blocks != 0)
        return PC_ERR_STATE;
    px->stats.n_lookups++;
    if (n < 2)
        return 0;
    rdx_match_t m;
    rdx_tree_match(px->tree, ns, (const uint32_t *)tokens, n - 1, &m);
    uint32_t k = (uint32_t)m.n_matched;
    if (k == 0)
        return 0;
    uint32_t bt = bt_of(px), nb = (k + bt - 1) / bt;
    if (nb > px->path_cap) {
        uint32_t *b = pc_reallocarray(px->path_buf, nb, sizeof *b);
        if (b == NULL)
            return PC_ERR_NOMEM;
        px->path_buf = b;
        px->path_cap = nb;
    }
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
    *n_reused = k;
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

int eng_prefix_retain(eng_t *e, eng_seq_t *s, uint64_t ns, uint32_t n, uint64_t expiry)
{
    struct eng_prefix *px = e->prefix;
    if (px->n_pins == px->pins_cap) {
        uint32_t cap = px->pins_cap ? px->pins_cap * 2 : 16;
        px_pin_t *p = pc_reallocarray(px->pins, cap, sizeof *p);
        if (p == NULL)
            return PC_ERR_NOMEM;
        px->pins = p;
        px->pins_cap = cap;
    }
    rdx_node_t *node;
    int rc = prefix_insert(e, s, ns, n, &node);
    if (rc != 0)
        return rc;
    /* One pin per prefix: retaining it again moves the pin's expiry (a TTL refresh), so pins
     * do not grow with traffic. */
    if (rdx_node_pins(node) > 0)
        for (uint32_t i = 0; i < px->n_pins; i++)
            if (px->pins[i].node == node) {
                px->pins[i].expiry = PC_MAX(px->pins[i].expiry, expiry);
                return 0;
            }
    rc = rdx_tree_pin(px->tree, node);
    if (rc != 0)
        return rc;
    px->pins[px->n_pins++] = (px_pin_t){.node = node, .expiry = expiry};
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
    uint32_t best = UINT32_MAX;
    for (uint32_t i = 0; i < px->n_pins; i++)
        if (px->pins[i].node == m.node &&
            (best == UINT32_MAX || px->pins[i].expiry < px->pins[best].expiry))
            best = i;
    if (best == UINT32_MAX)
        return PC_ERR_NOTFOUND;
    pin_remove(px, best);
    rdx_tree_unpin(px->tree, m.node);
    return 0;
}

uint32_t eng_prefix_expire(eng_t *e, uint64_t now)
{
    struct eng_prefix *px = e->prefix;
    uint32_t n = 0;
    for (uint32_t i = 0; i < px->n_pins;) {
        if (px->pins[i].expiry <= now) {
            rdx_node_t *node = px->pins[i].node;
            pin_remove(px, i);
            rdx_tree_unpin(px->tree, node);
            n++;
        } else {
            i++;
        }
    }
    return n;
}

int eng_prefix_drop(eng_t *e, uint64_t ns, const int32_t *tokens, uint32_t n)
{
    struct eng_prefix *px = e->prefix;
    px->reason_now = ENG_EVICT_REMOVED;
    int rc = rdx_tree_remove_prefix(px->tree, ns, (const uint32_t *)tokens, n);
    px->reason_now = 0;
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
    out->n_retained = px->n_pins;
}
