/*
 * cindex.c — the gateway's cache index on top of radix/ (see cindex.h for the contract).
 *
 * Invariants (checked by gw_cindex_check):
 *   - An entry is a payload (cix_entry_t) on the radix node where it ends; that node carries
 *     the radix entry mark and an own expiry equal to the entry's. The radix tree's own
 *     lifetime rules then give "a token lives as long as its longest-lived entry".
 *   - Every entry is in the expiry heap (ix->heap, a pc_heap keyed by expiry, e->hidx its
 *     slot),
 *     and after any call that carries a time every entry in it is live (expiry > ix->now).
 *   - Every namespace with stored tokens has a cix_ns_t whose n_tokens equals the radix
 *     namespace's token count and whose n_entries counts its entries.
 *   - Storage integral: ns->acc holds the token-milliseconds from the previous take up to
 *     ns->last_t; the token count is constant between two changes, and every change happens at
 *     a known time (an insert at ix->now, an eviction at ix->now, a lifetime end at the expiry
 *     being retired), so the integral is exact.
 *
 * Retiring. advance(now) pops the heap one expiry time te at a time: every entry due at te is
 * reported and detached from its node, then rdx_tree_expire(te) frees the nodes left with no
 * live entry below them; the on_free hook charges each namespace's integral up to te before
 * taking the tokens off.
 *
 * Splits. When an insert splits the edge of a node that ends an entry, the radix tree gives
 * the payload's head to the new upper node and asks for a tail for the lower node (the one that
 * still ends the entry). split_payload moves the entry to a fresh tail and leaves a hollow head,
 * which insert removes as soon as the radix insert returns: outside an insert no hollow payload
 * exists.
 */
#include "cindex.h"

#include <stddef.h>
#include <string.h>

#include "common.h"
#include "radix.h"

typedef struct cix_entry {
    rdx_node_t *node;
    uint64_t expiry;
    uint64_t created;
    uint32_t hidx; /* slot in ix->heap, PC_HEAP_NOIDX when hollow */
    uint8_t ttl;
    uint8_t hollow; /* a split's head, about to be removed (see the file header) */
} cix_entry_t;

typedef struct cix_ns {
    uint64_t id;
    uint64_t n_tokens;
    uint64_t n_entries;
    uint64_t last_t; /* the integral is charged up to here */
    uint64_t acc;    /* token-ms since the previous take */
} cix_ns_t;

struct gw_cindex {
    gw_cindex_params_t p;
    rdx_tree_t *t;
    uint64_t now;
    uint64_t wmask; /* bits of the valid workers */

    pc_heap_t heap; /* every entry by expiry */

    /* Namespaces: a dense array (iteration, swap-remove) and an index from id to dense
     * position + 1 (see "namespaces" below). */
    cix_ns_t *ns;
    uint32_t ns_n, ns_cap;
    pc_u64map_t idx;
    uint32_t ns0; /* position + 1 of namespace 0, 0 = none */

    /* Room for the longest stored prefix (drop reports copy prefixes here). */
    uint32_t *scratch;
    size_t scratch_cap;

    /* Context of the radix callbacks. */
    uint64_t cur_t;
    int cur_reason;
    int destroying;
    cix_entry_t *split_tail;

    gw_cindex_stats_t st;
};

/* ---- namespaces ------------------------------------------------------------------------- */

/* The dense array stays (rather than values of the map) because storage_take walks it and
 * removes namespaces as it goes, which a pc_u64map cannot do during its iteration, and
 * worker_down and check walk it without the empty slots. The index maps an id to its dense
 * position + 1; pc_u64map cannot store key 0, so namespace 0 has its own field. */
static uint32_t idx_get(const gw_cindex_t *ix, uint64_t id)
{
    if (id == 0)
        return ix->ns0;
    return (uint32_t)(uintptr_t)pc_u64map_get(&ix->idx, id);
}

/* Sets the position + 1 of id: 0 or PC_ERR_NOMEM (nothing changed). Replacing the position
 * of an id already there never allocates. */
static int idx_put(gw_cindex_t *ix, uint64_t id, uint32_t v)
{
    if (id == 0) {
        ix->ns0 = v;
        return 0;
    }
    return pc_u64map_put(&ix->idx, id, (void *)(uintptr_t)v);
}

static void idx_del(gw_cindex_t *ix, uint64_t id)
{
    if (id == 0)
        ix->ns0 = 0;
    else
        (void)pc_u64map_del(&ix->idx, id);
}

static cix_ns_t *ns_find(const gw_cindex_t *ix, uint64_t id)
{
    uint32_t v = idx_get(ix, id);
    return v != 0 ? &ix->ns[v - 1] : NULL;
}

/* Finds or creates the state of namespace id; *created says which. PC_ERR_NOMEM leaves
 * everything as it was (growing the array is not a visible change). */
static int ns_get(gw_cindex_t *ix, uint64_t id, cix_ns_t **out, int *created)
{
    *created = 0;
    *out = ns_find(ix, id);
    if (*out != NULL)
        return 0;
    if (ix->ns_n == ix->ns_cap) {
        uint32_t cap = ix->ns_cap ? ix->ns_cap * 2 : 8;
        cix_ns_t *a = pc_reallocarray(ix->ns, cap, sizeof *a);
        if (a == NULL)
            return PC_ERR_NOMEM;
        ix->ns = a;
        ix->ns_cap = cap;
    }
    int rc = idx_put(ix, id, ix->ns_n + 1);
    if (rc != 0)
        return rc;
    cix_ns_t *s = &ix->ns[ix->ns_n++];
    memset(s, 0, sizeof *s);
    s->id = id;
    s->last_t = ix->now;
    *out = s;
    *created = 1;
    return 0;
}

/* Removes namespace state d: out of the index, swap-remove in the dense array. Never fails
 * (a deletion may try to shrink the map; a failed shrink keeps it as it was). */
static void ns_remove(gw_cindex_t *ix, uint32_t d)
{
    idx_del(ix, ix->ns[d].id);
    uint32_t last = ix->ns_n - 1;
    if (d != last) {
        ix->ns[d] = ix->ns[last];
        int rc = idx_put(ix, ix->ns[d].id, d + 1); /* a replacement: no allocation */
        PC_ASSERT(rc == 0);
    }
    ix->ns_n--;
}

/* Charges the storage integral of s up to time t. */
static inline void ns_charge(cix_ns_t *s, uint64_t t)
{
    if (t > s->last_t) {
        s->acc += s->n_tokens * (t - s->last_t);
        s->last_t = t;
    }
}

/* ---- radix callbacks -------------------------------------------------------------------- */

/* Tier marks (cindex.h, Tiers): radix owner 64 + w says w holds the node in G2 only, 128 + w
 * in G3 only; neither: in G1. */
#define MARK_G2 64u
#define MARK_G3 128u
#define MAX_OWNERS (MARK_G3 + GW_CINDEX_MAX_WORKERS)

static uint32_t mark_of(uint32_t w, int tier)
{
    return (tier == GW_CINDEX_TIER_G2 ? MARK_G2 : MARK_G3) + w;
}

/* The tier w holds node x in (w must own it). */
static int node_tier(const gw_cindex_t *ix, const rdx_node_t *x, uint32_t w)
{
    if (rdx_tree_owner_has(ix->t, x, MARK_G2 + w))
        return GW_CINDEX_TIER_G2;
    if (rdx_tree_owner_has(ix->t, x, MARK_G3 + w))
        return GW_CINDEX_TIER_G3;
    return GW_CINDEX_TIER_G1;
}

/* Owner bits of a node among the valid workers. */
static uint64_t node_owners(const gw_cindex_t *ix, const rdx_node_t *x)
{
    uint64_t m = 0;
    for (int64_t o = rdx_tree_owner_next(ix->t, x, 0); o >= 0 && o < GW_CINDEX_MAX_WORKERS;
         o = rdx_tree_owner_next(ix->t, x, (uint32_t)o + 1))
        m |= 1ull << o;
    return m & ix->wmask;
}

/* Workers that hold the whole prefix ending at node x: the owners of every node up to the
 * root. */
static uint64_t path_owners(const gw_cindex_t *ix, const rdx_node_t *x)
{
    uint64_t m = ix->wmask;
    for (; x != NULL && m != 0; x = rdx_node_parent(x))
        m &= node_owners(ix, x);
    return m;
}

/* Reports entry e (still attached to its live node) through on_drop and counts it. */
static void report_drop(gw_cindex_t *ix, const cix_entry_t *e, int reason)
{
    ix->st.entries_dropped[reason]++;
    if (ix->p.on_drop == NULL)
        return;
    size_t n = rdx_node_prefix(ix->t, e->node, ix->scratch);
    gw_cindex_drop_t ev = {
        .ns = rdx_node_ns(e->node),
        .tokens = ix->scratch,
        .n_tokens = n,
        .owners = path_owners(ix, e->node),
        .expiry_ms = e->expiry,
        .created_ms = e->created,
        .ttl = (gw_cindex_ttl_t)e->ttl,
        .reason = reason,
    };
    ix->p.on_drop(&ev, ix->p.ud);
}

/* Every freed node: charge its namespace's integral up to the time of the removal, take its
 * tokens off, and report an entry that goes with it (eviction, namespace drop; retired entries
 * were detached before their nodes were freed). The payload is freed by payload_free next. */
static void on_free(const rdx_free_event_t *ev, void *ud)
{
    gw_cindex_t *ix = ud;
    if (ix->destroying)
        return;
    cix_ns_t *s = ns_find(ix, ev->ns);
    PC_ASSERT(s != NULL && s->n_tokens >= ev->len);
    ns_charge(s, ix->cur_t);
    s->n_tokens -= ev->len;
    ix->st.tokens_freed[ix->cur_reason] += ev->len;
    cix_entry_t *e = ev->payload;
    if (e != NULL && !e->hollow) {
        report_drop(ix, e, ix->cur_reason);
        pc_heap_del(&ix->heap, e);
        s->n_entries--;
        ix->st.n_entries--;
    }
}

static void payload_free(void *payload, void *ud)
{
    (void)ud;
    pc_free(payload);
}

/* The entry moves to a new tail (it still ends at the lower node); the head stays behind,
 * hollow, on the new upper node until insert removes it. */
static int payload_split(void *payload, uint32_t at, void **tail_out, void *ud)
{
    (void)at;
    gw_cindex_t *ix = ud;
    cix_entry_t *head = payload;
    PC_ASSERT(!head->hollow);
    cix_entry_t *tail = pc_malloc(sizeof *tail);
    if (tail == NULL)
        return PC_ERR_NOMEM;
    *tail = *head;
    tail->hidx = PC_HEAP_NOIDX;
    pc_heap_replace(&ix->heap, head, tail);
    head->hollow = 1;
    ix->split_tail = tail;
    *tail_out = tail;
    return 0;
}

/* After an insert: removes the hollow head a split left on the upper node (payload_split), if
 * the insert split an entry's edge. When the inserted entry ends exactly at the split, that
 * upper node is the entry's own node, which then gets the new payload. */
static void drop_split_head(gw_cindex_t *ix)
{
    if (ix->split_tail == NULL)
        return;
    rdx_node_t *up = rdx_node_parent(ix->split_tail->node);
    cix_entry_t *head = rdx_tree_set_payload(ix->t, up, NULL);
    PC_ASSERT(head != NULL && head->hollow);
    pc_free(head);
    ix->split_tail = NULL;
}

/* ---- lifecycle -------------------------------------------------------------------------- */

gw_cindex_params_t gw_cindex_params_default(void)
{
    gw_cindex_params_t p;
    memset(&p, 0, sizeof p);
    p.n_workers = GW_CINDEX_MAX_WORKERS;
    p.ttl_ms[GW_CINDEX_TTL_5M] = 5 * 60 * 1000;
    p.ttl_ms[GW_CINDEX_TTL_1H] = 60 * 60 * 1000;
    return p;
}

int gw_cindex_init(const gw_cindex_params_t *params, gw_cindex_t **out)
{
    if (out == NULL)
        return PC_ERR_INVAL;
    *out = NULL;
    gw_cindex_params_t p = params != NULL ? *params : gw_cindex_params_default();
    if (p.n_workers == 0 || p.n_workers > GW_CINDEX_MAX_WORKERS || p.vocab_size > (1ull << 32))
        return PC_ERR_INVAL;
    for (int i = 0; i < GW_CINDEX_TTL_COUNT; i++)
        if (p.ttl_ms[i] == 0 || p.ttl_ms[i] >= RDX_EXPIRY_NEVER / 2)
            return PC_ERR_INVAL;
    gw_cindex_t *ix = pc_calloc(1, sizeof *ix);
    if (ix == NULL)
        return PC_ERR_NOMEM;
    ix->p = p;
    ix->heap = pc_heap_make(offsetof(cix_entry_t, hidx));
    ix->wmask = p.n_workers == 64 ? ~0ull : (1ull << p.n_workers) - 1;
    rdx_tree_params_t rp = rdx_tree_params_default();
    rp.vocab_size = p.vocab_size;
    rp.max_owners = MAX_OWNERS;
    rp.payload_free = payload_free;
    rp.payload_split = payload_split;
    rp.on_free = on_free;
    rp.ud = ix;
    int rc = rdx_tree_init(&rp, &ix->t);
    if (rc != 0) {
        pc_free(ix);
        return rc;
    }
    *out = ix;
    return 0;
}

void gw_cindex_free(gw_cindex_t *ix)
{
    if (ix == NULL)
        return;
    ix->destroying = 1;
    rdx_tree_free(ix->t);
    pc_heap_free(&ix->heap);
    pc_free(ix->ns);
    pc_u64map_free(&ix->idx);
    pc_free(ix->scratch);
    pc_free(ix);
}

/* ---- retiring --------------------------------------------------------------------------- */

/* Moves the index to time now (never backwards), retiring every entry due by then in order of
 * expiry. Returns the number of entries retired. */
static size_t advance(gw_cindex_t *ix, uint64_t now)
{
    size_t n = 0;
    if (now < ix->now)
        now = ix->now;
    const pc_heap_ent_t *top;
    while ((top = pc_heap_top(&ix->heap)) != NULL && top->key <= now) {
        uint64_t te = top->key;
        while ((top = pc_heap_top(&ix->heap)) != NULL && top->key == te) {
            cix_entry_t *e = top->item;
            report_drop(ix, e, GW_CINDEX_DROP_EXPIRE);
            pc_heap_del(&ix->heap, e);
            cix_ns_t *s = ns_find(ix, rdx_node_ns(e->node));
            s->n_entries--;
            ix->st.n_entries--;
            void *old = rdx_tree_set_payload(ix->t, e->node, NULL);
            PC_ASSERT(old == e);
            pc_free(e);
            n++;
        }
        ix->cur_t = te;
        ix->cur_reason = GW_CINDEX_DROP_EXPIRE;
        rdx_tree_expire(ix->t, te, NULL);
    }
    ix->now = now;
    return n;
}

size_t gw_cindex_expire(gw_cindex_t *ix, uint64_t now_ms)
{
    return ix != NULL ? advance(ix, now_ms) : 0;
}

/* Evicts least-recently-used entries while a cap is exceeded. */
static void enforce_caps(gw_cindex_t *ix)
{
    rdx_stats_t rs;
    ix->cur_t = ix->now;
    rdx_tree_stats(ix->t, &rs);
    if (ix->p.max_tokens != 0 && rs.n_tokens > ix->p.max_tokens) {
        ix->cur_reason = GW_CINDEX_DROP_EVICT_TOKENS;
        rdx_tree_evict(ix->t, (size_t)(rs.n_tokens - ix->p.max_tokens), NULL);
    }
    ix->cur_reason = GW_CINDEX_DROP_EVICT_NODES;
    while (ix->p.max_nodes != 0) {
        rdx_tree_stats(ix->t, &rs);
        if (rs.n_nodes <= ix->p.max_nodes)
            break;
        size_t freed = 0;
        rdx_tree_evict(ix->t, 1, &freed);
        if (freed == 0)
            break;
    }
}

/* ---- entries ---------------------------------------------------------------------------- */

/* The entry ending exactly at tokens[0..n), or NULL. */
static cix_entry_t *entry_at(const gw_cindex_t *ix, uint64_t ns, const uint32_t *tokens, size_t n)
{
    rdx_match_t m;
    if (n == 0 || rdx_tree_match(ix->t, ns, tokens, n, &m) != 0 || m.n_matched != n ||
        m.edge_offset != rdx_node_len(m.node))
        return NULL;
    cix_entry_t *e = rdx_node_payload(m.node);
    return e != NULL && !e->hollow ? e : NULL;
}

int gw_cindex_insert(gw_cindex_t *ix, uint64_t ns, const uint32_t *tokens, size_t n,
                     gw_cindex_ttl_t ttl, uint64_t start_ms, uint64_t now_ms)
{
    if (ix == NULL || tokens == NULL || n == 0 || (unsigned)ttl >= GW_CINDEX_TTL_COUNT)
        return PC_ERR_INVAL;
    if (n > RDX_MAX_SEQ_TOKENS)
        return PC_ERR_RANGE;
    advance(ix, now_ms);
    uint64_t now = ix->now;
    uint64_t start = PC_MIN(start_ms, now);
    uint64_t expiry = start + ix->p.ttl_ms[ttl]; /* ttl < 2^63 and start <= now: no wrap */
    if (expiry <= now)
        return 2;
    if (ix->p.max_tokens != 0 && n > ix->p.max_tokens)
        return PC_ERR_NOSPACE;

    /* Allocate first: namespace state, scratch room, heap room, the entry. */
    ix->st.n_walk_tokens += n;
    cix_entry_t *e = entry_at(ix, ns, tokens, n), *fresh = NULL;
    cix_ns_t *s = NULL;
    int created = 0, rc;
    if (n > ix->scratch_cap) {
        uint32_t *sc = pc_reallocarray(ix->scratch, n, sizeof *sc);
        if (sc == NULL)
            return PC_ERR_NOMEM;
        ix->scratch = sc;
        ix->scratch_cap = n;
    }
    if ((rc = pc_heap_reserve(&ix->heap, (uint64_t)ix->heap.n + 1)) != 0)
        return rc;
    if (e == NULL && (fresh = pc_calloc(1, sizeof *fresh)) == NULL)
        return PC_ERR_NOMEM;
    if ((rc = ns_get(ix, ns, &s, &created)) != 0)
        goto fail;

    rdx_stats_t before, after;
    rdx_tree_ns_stats(ix->t, ns, &before);
    rdx_node_t *node = NULL;
    ix->split_tail = NULL;
    rc = rdx_tree_insert(ix->t, ns, tokens, n, now, expiry, RDX_INSERT_ENTRY, &node);
    ix->st.n_walk_tokens += n;
    if (rc < 0) {
        if (created)
            ns_remove(ix, (uint32_t)(s - ix->ns));
        goto fail;
    }
    drop_split_head(ix);
    rdx_tree_ns_stats(ix->t, ns, &after);
    ns_charge(s, now);
    s->n_tokens += after.n_tokens - before.n_tokens;

    if (e != NULL) {
        if (expiry > e->expiry) {
            e->expiry = expiry;
            pc_heap_update(&ix->heap, e, expiry);
        }
        if (ttl > e->ttl)
            e->ttl = (uint8_t)ttl;
        ix->st.n_extends++;
        rc = 1;
    } else {
        fresh->node = node;
        fresh->expiry = expiry;
        fresh->created = now;
        fresh->ttl = (uint8_t)ttl;
        void *old = rdx_tree_set_payload(ix->t, node, fresh);
        PC_ASSERT(old == NULL);
        fresh->hidx = PC_HEAP_NOIDX;
        pc_heap_push(&ix->heap, fresh, expiry);
        s->n_entries++;
        ix->st.n_entries++;
        ix->st.n_inserts++;
        rc = 0;
    }
    PC_ASSERT(rdx_node_expiry(node) == (e != NULL ? e : fresh)->expiry);
    enforce_caps(ix);
    return rc;

fail:
    pc_free(fresh);
    return rc;
}

int gw_cindex_insert_path(gw_cindex_t *ix, uint64_t ns, const uint32_t *tokens,
                          const gw_cindex_point_t *pts, size_t n_pts, uint64_t start_ms,
                          uint64_t now_ms, int *results)
{
    if (ix == NULL || (n_pts > 0 && (tokens == NULL || pts == NULL)))
        return PC_ERR_INVAL;
    for (size_t i = 0; i < n_pts; i++)
        if (pts[i].n_tokens == 0 || (i > 0 && pts[i].n_tokens <= pts[i - 1].n_tokens) ||
            (unsigned)pts[i].ttl >= GW_CINDEX_TTL_COUNT)
            return PC_ERR_INVAL;
    if (n_pts == 0)
        return 0;
    size_t n_max = pts[n_pts - 1].n_tokens;
    if (n_max > RDX_MAX_SEQ_TOKENS)
        return PC_ERR_RANGE;
    advance(ix, now_ms);
    uint64_t now = ix->now;
    uint64_t start = PC_MIN(start_ms, now);
    int rc = 0;
    size_t i = 0;
    /* Room for every point first: scratch for the longest prefix, heap slots for all. */
    if (n_max > ix->scratch_cap) {
        uint32_t *sc = pc_reallocarray(ix->scratch, n_max, sizeof *sc);
        if (sc == NULL) {
            rc = PC_ERR_NOMEM;
            goto out;
        }
        ix->scratch = sc;
        ix->scratch_cap = n_max;
    }
    if ((rc = pc_heap_reserve(&ix->heap, (uint64_t)ix->heap.n + n_pts)) != 0)
        goto out;

    /* Shortest first, each walk starting where the previous entry ends: the path is read
     * once. A node never moves or changes depth by an insert below it, so `from` stays the
     * end of the previous entry. */
    rdx_node_t *from = NULL;
    for (; i < n_pts; i++) {
        size_t n = pts[i].n_tokens;
        uint64_t expiry = start + ix->p.ttl_ms[pts[i].ttl];
        if (expiry <= now) {
            if (results != NULL)
                results[i] = 2;
            continue;
        }
        if (ix->p.max_tokens != 0 && n > ix->p.max_tokens) {
            if (results != NULL)
                results[i] = PC_ERR_NOSPACE;
            continue;
        }
        cix_entry_t *fresh = pc_calloc(1, sizeof *fresh), *e;
        cix_ns_t *s = NULL;
        int created = 0;
        if (fresh == NULL) {
            rc = PC_ERR_NOMEM;
            goto out;
        }
        if ((rc = ns_get(ix, ns, &s, &created)) != 0) {
            pc_free(fresh);
            goto out;
        }
        rdx_stats_t before, after;
        rdx_tree_ns_stats(ix->t, ns, &before);
        rdx_node_t *node = NULL;
        ix->split_tail = NULL;
        ix->st.n_walk_tokens += n - (from != NULL ? rdx_node_depth(from) : 0);
        rc = rdx_tree_insert_from(ix->t, ns, from, tokens, n, now, expiry, RDX_INSERT_ENTRY, &node);
        if (rc < 0) {
            if (created)
                ns_remove(ix, (uint32_t)(s - ix->ns));
            pc_free(fresh);
            goto out;
        }
        drop_split_head(ix);
        rdx_tree_ns_stats(ix->t, ns, &after);
        ns_charge(s, now);
        s->n_tokens += after.n_tokens - before.n_tokens;
        if ((e = rdx_node_payload(node)) != NULL) {
            PC_ASSERT(!e->hollow);
            pc_free(fresh);
            if (expiry > e->expiry) {
                e->expiry = expiry;
                pc_heap_update(&ix->heap, e, expiry);
            }
            if (pts[i].ttl > e->ttl)
                e->ttl = (uint8_t)pts[i].ttl;
            ix->st.n_extends++;
            rc = 1;
        } else {
            e = fresh;
            e->node = node;
            e->expiry = expiry;
            e->created = now;
            e->ttl = (uint8_t)pts[i].ttl;
            rdx_tree_set_payload(ix->t, node, e);
            e->hidx = PC_HEAP_NOIDX;
            pc_heap_push(&ix->heap, e, expiry);
            s->n_entries++;
            ix->st.n_entries++;
            ix->st.n_inserts++;
            rc = 0;
        }
        PC_ASSERT(rdx_node_expiry(node) == e->expiry);
        if (results != NULL)
            results[i] = rc;
        from = node;
    }
    rc = 0;
out:
    if (rc < 0 && results != NULL)
        for (size_t j = i; j < n_pts; j++)
            results[j] = rc;
    if (i > 0)
        enforce_caps(ix);
    return rc;
}

int gw_cindex_match(gw_cindex_t *ix, uint64_t ns, const uint32_t *tokens, size_t n, uint64_t now_ms,
                    gw_cindex_match_t *out)
{
    if (ix == NULL || out == NULL || (tokens == NULL && n > 0))
        return PC_ERR_INVAL;
    memset(out, 0, sizeof *out);
    advance(ix, now_ms);
    rdx_match_t m;
    int rc = rdx_tree_match(ix->t, ns, tokens, n, &m);
    if (rc != 0 || m.node == NULL)
        return rc;
    out->n_matched = (uint32_t)m.n_matched;
    out->n_hit = (uint32_t)m.n_covered;
    /* Walk up from the deepest matched node: entries fully inside the match, deepest first,
     * and for each worker the start of the shallowest node it does not own. */
    uint32_t deep[GW_CINDEX_MATCH_ENTRIES];
    uint32_t held_end[GW_CINDEX_MAX_WORKERS];
    for (uint32_t w = 0; w < GW_CINDEX_MAX_WORKERS; w++)
        held_end[w] = out->n_matched;
    uint32_t k = 0;
    for (const rdx_node_t *x = m.node; x != NULL; x = rdx_node_parent(x)) {
        size_t depth = rdx_node_depth(x);
        size_t start = depth - rdx_node_len(x);
        const cix_entry_t *e = rdx_node_payload(x);
        if (e != NULL && depth <= m.n_matched) {
            if (k < GW_CINDEX_MATCH_ENTRIES)
                deep[k++] = (uint32_t)depth;
            out->n_entries++;
        }
        /* A worker missing here holds nothing of what lies below: its tier counts restart. */
        uint64_t missing = ~node_owners(ix, x) & ix->wmask;
        for (; missing != 0; missing &= missing - 1) {
            int w = __builtin_ctzll(missing);
            held_end[w] = (uint32_t)start;
            out->held_g2[w] = out->held_g3[w] = 0;
        }
        uint32_t in_match = (uint32_t)(PC_MIN(depth, (size_t)m.n_matched) - start);
        for (int64_t o = rdx_tree_owner_next(ix->t, x, MARK_G2); o >= 0 && o < MAX_OWNERS;
             o = rdx_tree_owner_next(ix->t, x, (uint32_t)o + 1)) {
            uint32_t w = (uint32_t)o % GW_CINDEX_MAX_WORKERS;
            if (w < ix->p.n_workers)
                *(o < MARK_G3 ? &out->held_g2[w] : &out->held_g3[w]) += in_match;
        }
    }
    for (uint32_t i = 0; i < k; i++)
        out->entry_len[i] = deep[k - 1 - i];
    for (uint32_t w = 0; w < ix->p.n_workers; w++) {
        out->held[w] = held_end[w];
        if (held_end[w] > 0)
            out->holders |= 1ull << w;
    }
    return 0;
}

int gw_cindex_read(gw_cindex_t *ix, uint64_t ns, const uint32_t *tokens, size_t n_read,
                   uint64_t now_ms, size_t *n_refreshed)
{
    if (n_refreshed != NULL)
        *n_refreshed = 0;
    if (ix == NULL || (tokens == NULL && n_read > 0))
        return PC_ERR_INVAL;
    advance(ix, now_ms);
    rdx_match_t m;
    int rc = rdx_tree_match(ix->t, ns, tokens, n_read, &m);
    if (rc != 0)
        return rc;
    size_t k = 0;
    for (rdx_node_t *x = m.node; x != NULL; x = rdx_node_parent(x)) {
        cix_entry_t *e = rdx_node_payload(x);
        if (e == NULL || rdx_node_depth(x) > m.n_matched)
            continue;
        uint64_t expiry = ix->now + ix->p.ttl_ms[e->ttl];
        if (expiry > e->expiry) {
            e->expiry = expiry;
            pc_heap_update(&ix->heap, e, expiry);
            rdx_tree_touch(ix->t, x, ix->now, expiry);
        } else {
            rdx_tree_touch(ix->t, x, ix->now, 0);
        }
        ix->st.n_extends++;
        k++;
    }
    if (n_refreshed != NULL)
        *n_refreshed = k;
    return 0;
}

bool gw_cindex_entry_live(const gw_cindex_t *ix, uint64_t ns, const uint32_t *tokens, size_t n,
                          uint64_t now_ms)
{
    if (ix == NULL || tokens == NULL)
        return false;
    const cix_entry_t *e = entry_at(ix, ns, tokens, n);
    return e != NULL && e->expiry > now_ms;
}

size_t gw_cindex_path_entries(const gw_cindex_t *ix, uint64_t ns, const uint32_t *tokens, size_t n,
                              uint64_t now_ms, uint32_t *lens, size_t cap)
{
    rdx_match_t m;
    if (ix == NULL || (tokens == NULL && n > 0) || rdx_tree_match(ix->t, ns, tokens, n, &m) != 0 ||
        m.node == NULL)
        return 0;
    /* Up from the deepest matched node: entries fully inside the match, deepest first. */
    size_t count = 0;
    for (const rdx_node_t *x = m.node; x != NULL; x = rdx_node_parent(x)) {
        const cix_entry_t *e = rdx_node_payload(x);
        count += e != NULL && !e->hollow && e->expiry > now_ms && rdx_node_depth(x) <= m.n_matched;
    }
    size_t k = count;
    for (const rdx_node_t *x = m.node; x != NULL && k > 0; x = rdx_node_parent(x)) {
        const cix_entry_t *e = rdx_node_payload(x);
        if (e != NULL && !e->hollow && e->expiry > now_ms && rdx_node_depth(x) <= m.n_matched &&
            --k < cap)
            lens[k] = (uint32_t)rdx_node_depth(x);
    }
    return count;
}

size_t gw_cindex_drop_ns(gw_cindex_t *ix, uint64_t ns)
{
    if (ix == NULL)
        return 0;
    uint64_t before = ix->st.entries_dropped[GW_CINDEX_DROP_REMOVE];
    ix->cur_t = ix->now;
    ix->cur_reason = GW_CINDEX_DROP_REMOVE;
    rdx_tree_remove_prefix(ix->t, ns, NULL, 0); /* no pins: cannot be BUSY */
    return (size_t)(ix->st.entries_dropped[GW_CINDEX_DROP_REMOVE] - before);
}

/* ---- physical owners -------------------------------------------------------------------- */

/* The deepest entry node on the stored path of tokens[0..n) that ends within it, or NULL. */
static rdx_node_t *deepest_entry(const gw_cindex_t *ix, uint64_t ns, const uint32_t *tokens,
                                 size_t n)
{
    rdx_match_t m;
    if (rdx_tree_match(ix->t, ns, tokens, n, &m) != 0)
        return NULL;
    return m.last_entry;
}

/* The tier w holds node x in after an add (the better tier wins) or a demotion (the worse
 * wins) in tier t; 0: a demotion of a node w does not own, which stays unowned. */
static int merged_tier(const gw_cindex_t *ix, const rdx_node_t *x, uint32_t w, int t, bool demote)
{
    if (!rdx_tree_owner_has(ix->t, x, w))
        return demote ? 0 : t;
    int cur = node_tier(ix, x, w);
    return demote ? PC_MAX(cur, t) : PC_MIN(cur, t);
}

/* Applies merged_tier to w on the nodes from x up to the first one of depth <= stop. All or
 * nothing: a first pass gives every node that gets a new mark its owner bitmap (setting and
 * clearing the mark: the bitmap stays, which is no visible change), the only step that may
 * allocate; the second sets owner bits and marks, which then never allocates. Returns 0 or
 * PC_ERR_NOMEM (nothing changed). */
static int set_tiers(gw_cindex_t *ix, rdx_node_t *x, size_t stop, uint32_t w, int t, bool demote)
{
    for (rdx_node_t *y = x; y != NULL && rdx_node_depth(y) > stop; y = rdx_node_parent(y)) {
        int to = merged_tier(ix, y, w, t, demote);
        if (to <= GW_CINDEX_TIER_G1 || rdx_tree_owner_has(ix->t, y, mark_of(w, to)))
            continue;
        if (rdx_tree_owner_add(ix->t, y, mark_of(w, to)) != 0)
            return PC_ERR_NOMEM;
        rdx_tree_owner_del(ix->t, y, mark_of(w, to));
    }
    for (rdx_node_t *y = x; y != NULL && rdx_node_depth(y) > stop; y = rdx_node_parent(y)) {
        int to = merged_tier(ix, y, w, t, demote);
        if (to == 0)
            continue;
        int rc = rdx_tree_owner_add(ix->t, y, w);
        rc |= rdx_tree_owner_del(ix->t, y, MARK_G2 + w);
        rc |= rdx_tree_owner_del(ix->t, y, MARK_G3 + w);
        if (to > GW_CINDEX_TIER_G1)
            rc |= rdx_tree_owner_add(ix->t, y, mark_of(w, to));
        PC_ASSERT(rc == 0);
    }
    return 0;
}

int gw_cindex_owner_add(gw_cindex_t *ix, uint64_t ns, const uint32_t *tokens, size_t n, uint32_t w,
                        uint32_t *n_held)
{
    return gw_cindex_owner_add_tier(ix, ns, tokens, n, w, GW_CINDEX_TIER_G1, 0, n_held);
}

/* deepest_entry, or with block_tokens > 0 the entry whose edge holds tokens[n - 1] when every
 * whole block of it lies within tokens[0..n): a tier keeps whole blocks only, and what its
 * holder lacks of such an entry is a partial last block, which it recomputes anyway. */
static rdx_node_t *deepest_entry_blocks(const gw_cindex_t *ix, uint64_t ns, const uint32_t *tokens,
                                        size_t n, uint32_t block_tokens)
{
    rdx_match_t m;
    if (rdx_tree_match(ix->t, ns, tokens, n, &m) != 0)
        return NULL;
    if (block_tokens > 0 && m.node != NULL && m.n_matched == n && n > 0) {
        size_t d = rdx_node_depth(m.node);
        if (d > n && rdx_node_payload(m.node) != NULL && d / block_tokens * block_tokens <= n)
            return m.node;
    }
    return m.last_entry;
}

int gw_cindex_owner_add_tier(gw_cindex_t *ix, uint64_t ns, const uint32_t *tokens, size_t n,
                             uint32_t w, gw_cindex_tier_t tier, uint32_t block_tokens,
                             uint32_t *n_held)
{
    if (n_held != NULL)
        *n_held = 0;
    if (ix == NULL || (tokens == NULL && n > 0) || tier < GW_CINDEX_TIER_G1 ||
        tier > GW_CINDEX_TIER_G3)
        return PC_ERR_INVAL;
    if (w >= ix->p.n_workers)
        return PC_ERR_RANGE;
    rdx_node_t *x = deepest_entry_blocks(ix, ns, tokens, n, block_tokens);
    if (x == NULL)
        return 0;
    int rc = set_tiers(ix, x, 0, w, tier, false);
    if (rc == 0 && n_held != NULL)
        *n_held = (uint32_t)rdx_node_depth(x);
    return rc;
}

int gw_cindex_owner_evicted(gw_cindex_t *ix, uint32_t w, uint64_t ns, const uint32_t *tokens,
                            size_t n_kept, size_t n_tokens)
{
    if (ix == NULL || n_kept > n_tokens || (tokens == NULL && n_tokens > 0))
        return PC_ERR_INVAL;
    if (w >= ix->p.n_workers)
        return PC_ERR_RANGE;
    return gw_cindex_owner_demoted(ix, w, ns, tokens, n_kept, n_tokens, 0);
}

int gw_cindex_owner_demoted(gw_cindex_t *ix, uint32_t w, uint64_t ns, const uint32_t *tokens,
                            size_t n_kept, size_t n_tokens, int tier)
{
    if (ix == NULL || n_kept > n_tokens || (tokens == NULL && n_tokens > 0) ||
        (tier != 0 && tier != GW_CINDEX_TIER_G2 && tier != GW_CINDEX_TIER_G3))
        return PC_ERR_INVAL;
    if (w >= ix->p.n_workers)
        return PC_ERR_RANGE;
    rdx_node_t *top = deepest_entry(ix, ns, tokens, n_tokens);
    if (top == NULL)
        return 0;
    size_t keep = 0;
    for (const rdx_node_t *x = top; x != NULL; x = rdx_node_parent(x))
        if (rdx_node_depth(x) <= n_kept && rdx_node_payload(x) != NULL) {
            keep = rdx_node_depth(x);
            break;
        }
    if (tier != 0)
        return set_tiers(ix, top, keep, w, tier, true);
    for (rdx_node_t *x = top; x != NULL && rdx_node_depth(x) > keep; x = rdx_node_parent(x)) {
        rdx_tree_owner_del(ix->t, x, w);
        rdx_tree_owner_del(ix->t, x, MARK_G2 + w);
        rdx_tree_owner_del(ix->t, x, MARK_G3 + w);
    }
    return 0;
}

int gw_cindex_worker_down(gw_cindex_t *ix, uint32_t w)
{
    if (ix == NULL)
        return PC_ERR_INVAL;
    if (w >= ix->p.n_workers)
        return PC_ERR_RANGE;
    /* Clearing an owner bit does not change the tree's structure, so the iterator stays on
     * track. */
    for (uint32_t d = 0; d < ix->ns_n; d++) {
        rdx_iter_t it;
        rdx_iter_init(&it, ix->t, ix->ns[d].id);
        for (rdx_node_t *x; (x = rdx_iter_next(&it)) != NULL;) {
            rdx_tree_owner_del(ix->t, x, w);
            rdx_tree_owner_del(ix->t, x, MARK_G2 + w);
            rdx_tree_owner_del(ix->t, x, MARK_G3 + w);
        }
    }
    return 0;
}

/* ---- metering and stats ----------------------------------------------------------------- */

size_t gw_cindex_storage_take(gw_cindex_t *ix, uint64_t now_ms,
                              void (*cb)(uint64_t ns, uint64_t token_ms, void *ud), void *ud)
{
    if (ix == NULL)
        return 0;
    advance(ix, now_ms);
    size_t calls = 0;
    /* Backwards, so that a swap-remove only moves an already visited namespace. */
    for (uint32_t d = ix->ns_n; d-- > 0;) {
        cix_ns_t *s = &ix->ns[d];
        ns_charge(s, ix->now);
        if (s->acc != 0) {
            if (cb != NULL)
                cb(s->id, s->acc, ud);
            s->acc = 0;
            calls++;
        }
        if (s->n_tokens == 0)
            ns_remove(ix, d);
    }
    return calls;
}

void gw_cindex_stats(const gw_cindex_t *ix, gw_cindex_stats_t *out)
{
    memset(out, 0, sizeof *out);
    if (ix == NULL)
        return;
    *out = ix->st;
    rdx_stats_t rs;
    rdx_tree_stats(ix->t, &rs);
    out->n_tokens = rs.n_tokens;
    out->n_nodes = rs.n_nodes;
    out->n_bytes =
        rs.n_bytes + sizeof *ix + (uint64_t)ix->heap.cap * sizeof *ix->heap.a +
        (uint64_t)ix->ns_cap * sizeof *ix->ns + (uint64_t)ix->idx.cap * sizeof *ix->idx.slots +
        (uint64_t)ix->scratch_cap * sizeof *ix->scratch + ix->st.n_entries * sizeof(cix_entry_t);
    out->n_namespaces = rdx_tree_ns_count(ix->t);
}

int gw_cindex_ns_stats(const gw_cindex_t *ix, uint64_t ns, gw_cindex_ns_stats_t *out)
{
    memset(out, 0, sizeof *out);
    if (ix == NULL)
        return PC_ERR_INVAL;
    const cix_ns_t *s = ns_find(ix, ns);
    rdx_stats_t rs;
    if (s == NULL || rdx_tree_ns_stats(ix->t, ns, &rs) != 0)
        return PC_ERR_NOTFOUND;
    out->n_entries = s->n_entries;
    out->n_tokens = rs.n_tokens;
    out->n_nodes = rs.n_nodes;
    return 0;
}

uint64_t gw_cindex_worker_tokens(const gw_cindex_t *ix, uint32_t w)
{
    rdx_stats_t rs;
    if (ix == NULL || w >= ix->p.n_workers || rdx_tree_owner_stats(ix->t, w, &rs) != 0)
        return 0;
    return rs.n_tokens;
}

uint64_t gw_cindex_worker_tier_tokens(const gw_cindex_t *ix, uint32_t w, gw_cindex_tier_t tier)
{
    rdx_stats_t g2, g3;
    if (ix == NULL || w >= ix->p.n_workers || rdx_tree_owner_stats(ix->t, MARK_G2 + w, &g2) != 0 ||
        rdx_tree_owner_stats(ix->t, MARK_G3 + w, &g3) != 0)
        return 0;
    switch (tier) {
    case GW_CINDEX_TIER_G1:
        return gw_cindex_worker_tokens(ix, w) - g2.n_tokens - g3.n_tokens;
    case GW_CINDEX_TIER_G2:
        return g2.n_tokens;
    case GW_CINDEX_TIER_G3:
        return g3.n_tokens;
    }
    return 0;
}

int gw_cindex_check(const gw_cindex_t *ix, char *err, size_t len)
{
    if (ix == NULL)
        return pc_err_setf(err, len, PC_ERR_INTERNAL, "cindex: NULL");
    int rc = rdx_tree_check(ix->t, err, len);
    if (rc != 0)
        return rc;
    for (uint32_t i = 0; i < ix->heap.n; i++) {
        const cix_entry_t *e = ix->heap.a[i].item;
        if (e->hidx != i || e->hollow || ix->heap.a[i].key != e->expiry)
            return pc_err_setf(err, len, PC_ERR_INTERNAL, "cindex: heap slot %u", i);
        if (i > 0 && ix->heap.a[(i - 1) / PC_HEAP_D].key > e->expiry)
            return pc_err_setf(err, len, PC_ERR_INTERNAL, "cindex: heap order at %u", i);
        if (e->expiry <= ix->now)
            return pc_err_setf(err, len, PC_ERR_INTERNAL, "cindex: entry due but not retired");
        if (rdx_node_payload(e->node) != e || !rdx_node_is_entry(e->node) ||
            rdx_node_expiry(e->node) != e->expiry)
            return pc_err_setf(
                err, len, PC_ERR_INTERNAL, "cindex: entry and node disagree (expiry %llu vs %llu)",
                (unsigned long long)e->expiry, (unsigned long long)rdx_node_expiry(e->node));
    }
    uint64_t entries = 0;
    for (uint32_t d = 0; d < ix->ns_n; d++) {
        const cix_ns_t *s = &ix->ns[d];
        if (ns_find(ix, s->id) != s)
            return pc_err_setf(err, len, PC_ERR_INTERNAL, "cindex: namespace table");
        rdx_stats_t rs = {0};
        rdx_tree_ns_stats(ix->t, s->id, &rs);
        if (rs.n_tokens != s->n_tokens)
            return pc_err_setf(err, len, PC_ERR_INTERNAL,
                               "cindex: namespace %llu tokens %llu, tree has %llu",
                               (unsigned long long)s->id, (unsigned long long)s->n_tokens,
                               (unsigned long long)rs.n_tokens);
        uint64_t k = 0;
        rdx_iter_t it;
        rdx_iter_init(&it, ix->t, s->id);
        for (const rdx_node_t *x; (x = rdx_iter_next(&it)) != NULL;) {
            const cix_entry_t *e = rdx_node_payload(x);
            if ((e != NULL) != (rdx_node_is_entry(x) != 0) || (e != NULL && e->node != x))
                return pc_err_setf(err, len, PC_ERR_INTERNAL,
                                   "cindex: entry mark without payload or the reverse");
            for (int64_t o = rdx_tree_owner_next(ix->t, x, MARK_G2); o >= 0 && o < MAX_OWNERS;
                 o = rdx_tree_owner_next(ix->t, x, (uint32_t)o + 1)) {
                uint32_t w = (uint32_t)o % GW_CINDEX_MAX_WORKERS;
                if (!rdx_tree_owner_has(ix->t, x, w) ||
                    (o < MARK_G3 && rdx_tree_owner_has(ix->t, x, MARK_G3 + w)))
                    return pc_err_setf(err, len, PC_ERR_INTERNAL,
                                       "cindex: worker %u's tier mark on a node it does not own, "
                                       "or in two tiers",
                                       w);
            }
            k += e != NULL;
        }
        if (k != s->n_entries)
            return pc_err_setf(err, len, PC_ERR_INTERNAL, "cindex: namespace entry count");
        entries += k;
    }
    if (entries != ix->heap.n || entries != ix->st.n_entries)
        return pc_err_setf(err, len, PC_ERR_INTERNAL, "cindex: entry totals");
    if ((uint64_t)rdx_tree_ns_count(ix->t) > ix->ns_n)
        return pc_err_setf(err, len, PC_ERR_INTERNAL, "cindex: a stored namespace has no state");
    return 0;
}
