/*
 * radix_model.h — a naive reference for radix/ and a random-operation driver that runs the
 * real tree and the reference side by side, shared by the differential test (test_radix.c)
 * and the libFuzzer target (tests/fuzz/fuzz_radix.c).
 *
 * The reference is a plain list of stored positions: (namespace, token sequence, own expiry,
 * entry mark, pin count). Its semantics are the tree's contract stated without any tree:
 *   - the tree holds exactly the prefixes of the listed sequences (terminal or pinned);
 *   - match = the longest common prefix with any listed sequence (linear scan);
 *   - covered = the longest common prefix with any listed entry;
 *   - expire(now) clears the lifetime and entry mark of every sequence whose expiry passed
 *     and drops it from the list unless pinned;
 *   - evict is structure-dependent (which leaf is least recently used), so the reference is
 *     told what the tree freed through on_free, and checks that each freed terminal was an
 *     unpinned, maximal sequence; LRU order itself is covered by the heap invariants that
 *     rdx_tree_check verifies and by the unit tests.
 * After each operation the driver compares return codes, matches of several queries, token
 * counts per namespace (the number of distinct prefixes) and, optionally, runs
 * rdx_tree_check and verifies that every payload covers exactly its node's edge.
 *
 * The driver draws every decision from a byte source, so a fuzzer's input or a PRNG can
 * drive it. When oom is set, every allocating mutation is first run with an allocator that
 * fails the k-th allocation, for k = 0, 1, ... until it succeeds; each failure must return
 * PC_ERR_NOMEM (or the split callback's error) and leave the dump and the invariants
 * unchanged; mutations that must not allocate run with an allocator that always fails.
 */
#ifndef RADIX_MODEL_H
#define RADIX_MODEL_H

#define _GNU_SOURCE
#include "common.h"
#include "pc_failalloc.h"
#include "radix.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- byte source ---- */

typedef struct mdl_src {
    const uint8_t *data; /* fuzzer bytes, or NULL for the PRNG */
    size_t len, pos;
    uint64_t rng;
    int exhausted;
} mdl_src_t;

static inline uint32_t mdl_next(mdl_src_t *s, uint32_t bound)
{
    uint32_t v;
    if (s->data != NULL) {
        /* One byte per decision when it has at most 256 outcomes, else two. */
        size_t k = bound != 0 && bound <= 256 ? 1 : 2;
        if (s->pos + k > s->len) {
            s->exhausted = 1;
            return 0;
        }
        v = k == 1 ? s->data[s->pos]
                   : (uint32_t)s->data[s->pos] | (uint32_t)s->data[s->pos + 1] << 8;
        s->pos += k;
    } else {
        s->rng ^= s->rng << 13;
        s->rng ^= s->rng >> 7;
        s->rng ^= s->rng << 17;
        v = (uint32_t)(s->rng >> 16);
    }
    return bound ? v % bound : v;
}

/* ---- the reference ---- */

typedef struct ref_elem {
    uint64_t ns;
    uint32_t *tok;
    uint32_t n;
    uint64_t expiry; /* 0: no own lifetime (kept only by pins) */
    int entry;
    uint32_t pins;
} ref_elem_t;

typedef struct ref {
    ref_elem_t *e;
    size_t n, cap;
} ref_t;

static size_t ref_lcp(const uint32_t *a, size_t na, const uint32_t *b, size_t nb)
{
    size_t i = 0, n = na < nb ? na : nb;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

static long ref_find(const ref_t *r, uint64_t ns, const uint32_t *tok, size_t n)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->e[i].ns == ns && r->e[i].n == n && memcmp(r->e[i].tok, tok, n * 4) == 0)
            return (long)i;
    return -1;
}

static ref_elem_t *ref_get(ref_t *r, uint64_t ns, const uint32_t *tok, size_t n)
{
    long i = ref_find(r, ns, tok, n);
    if (i >= 0)
        return &r->e[i];
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 64;
        r->e = realloc(r->e, r->cap * sizeof *r->e);
    }
    ref_elem_t *e = &r->e[r->n++];
    memset(e, 0, sizeof *e);
    e->ns = ns;
    e->n = (uint32_t)n;
    e->tok = malloc(n * 4 + 4);
    memcpy(e->tok, tok, n * 4);
    return e;
}

static void ref_del(ref_t *r, size_t i)
{
    free(r->e[i].tok);
    r->e[i] = r->e[--r->n];
}

static void ref_match(const ref_t *r, uint64_t ns, const uint32_t *q, size_t n, size_t *matched,
                      size_t *covered, size_t *entry_len)
{
    *matched = *covered = *entry_len = 0;
    for (size_t i = 0; i < r->n; i++) {
        const ref_elem_t *e = &r->e[i];
        if (e->ns != ns)
            continue;
        size_t l = ref_lcp(e->tok, e->n, q, n);
        if (l > *matched)
            *matched = l;
        if (e->entry && l > *covered)
            *covered = l;
        if (e->entry && l == e->n && e->n > *entry_len)
            *entry_len = e->n;
    }
}

static int ref_cmp_seq(const void *a, const void *b)
{
    const ref_elem_t *x = *(const ref_elem_t *const *)a, *y = *(const ref_elem_t *const *)b;
    size_t l = ref_lcp(x->tok, x->n, y->tok, y->n);
    if (l < x->n && l < y->n)
        return x->tok[l] < y->tok[l] ? -1 : 1;
    return x->n < y->n ? -1 : x->n > y->n;
}

/* Distinct non-empty prefixes of the sequences of ns = tokens a compressed trie holds. */
static uint64_t ref_tokens(const ref_t *r, uint64_t ns)
{
    const ref_elem_t **v = malloc((r->n + 1) * sizeof *v);
    size_t k = 0;
    for (size_t i = 0; i < r->n; i++)
        if (r->e[i].ns == ns)
            v[k++] = &r->e[i];
    qsort(v, k, sizeof *v, ref_cmp_seq);
    uint64_t sum = 0;
    for (size_t i = 0; i < k; i++)
        sum += v[i]->n - (i ? ref_lcp(v[i]->tok, v[i]->n, v[i - 1]->tok, v[i - 1]->n) : 0);
    free(v);
    return sum;
}

/* ---- payloads: each covers its node's edge as [start, start + len) of the sequence ---- */

typedef struct mdl_payload {
    uint32_t start, len;
} mdl_payload_t;

static long mdl_payloads_live;

static void mdl_payload_free(void *p, void *ud)
{
    (void)ud;
    mdl_payloads_live--;
    pc_free(p);
}

static int mdl_payload_split(void *p, uint32_t at, void **tail, void *ud)
{
    (void)ud;
    mdl_payload_t *h = p;
    if (at == 0 || at >= h->len)
        return PC_ERR_INTERNAL;
    mdl_payload_t *t = pc_malloc(sizeof *t);
    if (t == NULL)
        return PC_ERR_NOMEM;
    t->start = h->start + at;
    t->len = h->len - at;
    h->len = at;
    mdl_payloads_live++;
    *tail = t;
    return 0;
}

/* ---- the driver ---- */

#define MDL_MAX_PINS 32
#define MDL_MAX_LEN 96

typedef struct mdl {
    rdx_tree_t *t;
    ref_t ref;
    mdl_src_t src; /* the operations' decisions (fuzzer bytes or PRNG) */
    mdl_src_t aux; /* always a PRNG: base prefixes and the comparison queries */
    uint64_t vocab;
    uint64_t now;
    int check;    /* run rdx_tree_check + payload check after every operation */
    int oom;      /* failing-allocator mode for mutations */
    int in_evict; /* on_free is checking evictions */
    int failed;
    char why[512];
    uint32_t bases[6][MDL_MAX_LEN];
    uint32_t base_len[6];
    struct {
        rdx_node_t *node;
    } pins[MDL_MAX_PINS];
    int n_pins;
    uint64_t ops, n_freed_events;
    uint32_t buf[4 * MDL_MAX_LEN];
} mdl_t;

#define MDL_FAIL(m, ...)                                                                           \
    do {                                                                                           \
        if (!(m)->failed) {                                                                        \
            snprintf((m)->why, sizeof(m)->why, __VA_ARGS__);                                       \
            (m)->failed = 1;                                                                       \
        }                                                                                          \
    } while (0)

/* Token for alphabet letter a, spread over the tree's token range. */
static uint32_t mdl_tok(const mdl_t *m, uint32_t a)
{
    if (m->vocab == 0)
        return a * 0x9E3779B1u + 7u;
    return (uint32_t)(((uint64_t)a * 40503u + 11u) % m->vocab);
}

static void mdl_on_free(const rdx_free_event_t *ev, void *ud)
{
    mdl_t *m = ud;
    m->n_freed_events++;
    if (ev->reason != RDX_FREE_EVICT || !m->in_evict)
        return;
    /* An evicted terminal must be an unpinned sequence that nothing extends. */
    uint32_t *p = m->buf;
    size_t n = rdx_node_prefix(m->t, ev->node, p);
    long i = ref_find(&m->ref, ev->ns, p, n);
    if (i < 0) {
        if (rdx_node_expiry(ev->node) != 0)
            MDL_FAIL(m, "evicted terminal node (depth %zu) unknown to the reference", n);
        return;
    }
    if (m->ref.e[i].pins != 0)
        MDL_FAIL(m, "evicted a pinned sequence");
    for (size_t j = 0; j < m->ref.n; j++)
        if ((long)j != (long)i && m->ref.e[j].ns == ev->ns && m->ref.e[j].n > n &&
            ref_lcp(m->ref.e[j].tok, m->ref.e[j].n, p, n) == n)
            MDL_FAIL(m, "evicted a sequence that another one extends");
    ref_del(&m->ref, (size_t)i);
}

static int mdl_init(mdl_t *m, uint64_t vocab, const uint8_t *data, size_t len, uint64_t seed)
{
    memset(m, 0, sizeof *m);
    m->vocab = vocab;
    m->src.data = data;
    m->src.len = len;
    m->src.rng = seed | 1;
    m->aux.rng = (seed * 0x9E3779B97F4A7C15ull) | 1;
    rdx_tree_params_t p = rdx_tree_params_default();
    p.vocab_size = vocab;
    p.max_owners = 200;
    p.payload_free = mdl_payload_free;
    p.payload_split = mdl_payload_split;
    p.on_free = mdl_on_free;
    p.ud = m;
    if (rdx_tree_init(&p, &m->t) != 0)
        return -1;
    for (int b = 0; b < 6; b++) {
        m->base_len[b] = 1 + mdl_next(&m->aux, MDL_MAX_LEN / 2);
        for (uint32_t i = 0; i < m->base_len[b]; i++)
            m->bases[b][i] = mdl_tok(m, mdl_next(&m->aux, 6));
    }
    return 0;
}

static void mdl_free(mdl_t *m)
{
    rdx_tree_free(m->t);
    m->t = NULL;
    while (m->ref.n > 0)
        ref_del(&m->ref, m->ref.n - 1);
    free(m->ref.e);
    m->ref.e = NULL;
}

/* A query with skewed shared prefixes: a base (low indices favoured), cut, plus a tail. */
static size_t mdl_seq_from(mdl_t *m, mdl_src_t *src, uint32_t *q)
{
    uint32_t b = mdl_next(src, 6), b2 = mdl_next(src, 6);
    b = b < b2 ? b : b2;
    size_t n = mdl_next(src, m->base_len[b] + 1);
    memcpy(q, m->bases[b], n * 4);
    size_t tail = mdl_next(src, 4) == 0 ? mdl_next(src, 24) : mdl_next(src, 4);
    /* Now and then a wide alphabet right after the base, for nodes with many children (hash
     * child tables). */
    uint32_t wide = mdl_next(src, 8) == 0 ? 48 : 3;
    for (size_t i = 0; i < tail; i++)
        q[n++] = mdl_tok(m, mdl_next(src, i < 2 ? wide : 8));
    if (n == 0)
        q[n++] = mdl_tok(m, mdl_next(src, 3));
    return n;
}

static size_t mdl_seq(mdl_t *m, uint32_t *q)
{
    return mdl_seq_from(m, &m->src, q);
}

/* The OOM checks use tests/pc_failalloc.h's "left" rule: it fails the k-th allocation and
 * every one after it, so a mutation that ignores a failure and allocates again is caught too. */
static char *mdl_dump(const mdl_t *m)
{
    char *s = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&s, &n);
    rdx_tree_dump(m->t, f);
    fclose(f);
    return s;
}

static void mdl_check(mdl_t *m)
{
    char err[256];
    if (rdx_tree_check(m->t, err, sizeof err) != 0) {
        MDL_FAIL(m, "invariant: %s", err);
        return;
    }
    for (int k = 1; k <= 3; k++) {
        rdx_iter_t it;
        rdx_iter_init(&it, m->t, (uint64_t)k);
        for (rdx_node_t *x; (x = rdx_iter_next(&it)) != NULL;) {
            const mdl_payload_t *p = rdx_node_payload(x);
            if (p != NULL &&
                (p->start != rdx_node_depth(x) - rdx_node_len(x) || p->len != rdx_node_len(x)))
                MDL_FAIL(m, "payload [%u,+%u) on node [%zu,+%u)", p->start, p->len,
                         rdx_node_depth(x) - rdx_node_len(x), rdx_node_len(x));
        }
    }
}

/* Compares the tree with the reference on a few queries and on token counts. */
static void mdl_compare(mdl_t *m, int full)
{
    uint32_t q[2 * MDL_MAX_LEN + 64];
    for (int i = 0; i < 3 && !m->failed; i++) {
        uint64_t ns = 1 + mdl_next(&m->aux, 3);
        size_t n = mdl_seq_from(m, &m->aux, q);
        rdx_match_t mt;
        size_t em, ec, el;
        rdx_tree_match(m->t, ns, q, n, &mt);
        ref_match(&m->ref, ns, q, n, &em, &ec, &el);
        if (mt.n_matched != em || mt.n_covered != ec || mt.entry_len != el)
            MDL_FAIL(m,
                     "op %" PRIu64 ": match ns %" PRIu64 " n=%zu: tree %zu/%zu/%zu, reference "
                     "%zu/%zu/%zu (matched/covered/entry)",
                     m->ops, ns, n, mt.n_matched, mt.n_covered, mt.entry_len, em, ec, el);
        if (mt.node != NULL &&
            rdx_node_depth(mt.node) - rdx_node_len(mt.node) + mt.edge_offset != mt.n_matched)
            MDL_FAIL(m, "match node/offset inconsistent with n_matched");
        if ((mt.node == NULL) != (mt.n_matched == 0))
            MDL_FAIL(m, "match node NULL iff nothing matched");
    }
    if (full)
        for (uint64_t ns = 1; ns <= 3 && !m->failed; ns++) {
            rdx_stats_t st;
            rdx_tree_ns_stats(m->t, ns, &st);
            uint64_t want = ref_tokens(&m->ref, ns);
            if (st.n_tokens != want)
                MDL_FAIL(m,
                         "op %" PRIu64 ": ns %" PRIu64 " holds %" PRIu64 " tokens, reference "
                         "%" PRIu64,
                         m->ops, ns, st.n_tokens, want);
        }
}

static int mdl_is_pinned_handle(const mdl_t *m, const rdx_node_t *x)
{
    for (int i = 0; i < m->n_pins; i++)
        if (m->pins[i].node == x)
            return 1;
    return 0;
}

/* Runs an allocating mutation under the failing allocator, k = 0, 1, ... (see header). */
#define MDL_MUTATE(m, rc, expr)                                                                    \
    do {                                                                                           \
        if (!(m)->oom) {                                                                           \
            rc = (expr);                                                                           \
            break;                                                                                 \
        }                                                                                          \
        for (long k_ = 0;; k_++) {                                                                 \
            char *before_ = mdl_dump(m);                                                           \
            long live_ = mdl_payloads_live;                                                        \
            pc_allocator_t fa_ = pc_failalloc;                                                     \
            pc_failalloc_left = k_;                                                                \
            pc_allocator_t prev_ = pc_set_allocator(&fa_);                                         \
            rc = (expr);                                                                           \
            pc_set_allocator(&prev_);                                                              \
            if (rc != PC_ERR_NOMEM) {                                                              \
                free(before_);                                                                     \
                break;                                                                             \
            }                                                                                      \
            char *after_ = mdl_dump(m);                                                            \
            if (strcmp(before_, after_) != 0 || live_ != mdl_payloads_live)                        \
                MDL_FAIL(m,                                                                        \
                         "op %" PRIu64 ": failed allocation %ld changed the tree:\n%s\n---\n%s",   \
                         (m)->ops, k_, before_, after_);                                           \
            free(before_);                                                                         \
            free(after_);                                                                          \
            mdl_check(m);                                                                          \
            if ((m)->failed || k_ > 64)                                                            \
                break;                                                                             \
        }                                                                                          \
    } while (0)

/* Runs a mutation that must not allocate with an allocator that always fails. */
#define MDL_NOALLOC(m, stmt)                                                                       \
    do {                                                                                           \
        if (!(m)->oom) {                                                                           \
            stmt;                                                                                  \
            break;                                                                                 \
        }                                                                                          \
        pc_allocator_t fa_ = pc_failalloc;                                                         \
        pc_failalloc_left = 0;                                                                     \
        pc_allocator_t prev_ = pc_set_allocator(&fa_);                                             \
        stmt;                                                                                      \
        pc_set_allocator(&prev_);                                                                  \
    } while (0)

/* One random operation on both sides; returns 0 when the byte source ran dry. */
static int mdl_step(mdl_t *m, int compare_full)
{
    uint32_t q[2 * MDL_MAX_LEN + 64];
    uint32_t op = mdl_next(&m->src, 100);
    if (m->src.exhausted)
        return 0;
    m->ops++;
    uint64_t ns = 1 + mdl_next(&m->src, 3) / 2; /* namespaces 1 and 2 mostly */
    if (mdl_next(&m->src, 16) == 0)
        ns = 3;
    int rc = 0;
    if (op < 40) { /* insert */
        size_t n = mdl_seq(m, q);
        uint64_t exp =
            mdl_next(&m->src, 10) == 0 ? RDX_EXPIRY_NEVER : m->now + 1 + mdl_next(&m->src, 1500);
        unsigned fl = mdl_next(&m->src, 2) ? RDX_INSERT_ENTRY : 0;
        size_t em, ec, el;
        ref_match(&m->ref, ns, q, n, &em, &ec, &el);
        rdx_node_t *nd = NULL;
        MDL_MUTATE(m, rc, rdx_tree_insert(m->t, ns, q, n, m->now, exp, fl, &nd));
        if (rc != (em < n ? 0 : 1))
            MDL_FAIL(m, "op %" PRIu64 ": insert n=%zu returned %d, expected %d", m->ops, n, rc,
                     em < n ? 0 : 1);
        if (rc >= 0) {
            ref_elem_t *e = ref_get(&m->ref, ns, q, n);
            if (exp > e->expiry)
                e->expiry = exp;
            e->entry |= fl != 0;
            if (nd == NULL || rdx_node_depth(nd) != n)
                MDL_FAIL(m, "insert returned a node that does not end at %zu", n);
            else if (rdx_node_payload(nd) == NULL && mdl_next(&m->src, 2) == 0) {
                /* Payload memory comes from the hooks so the destructor can use pc_free. */
                mdl_payload_t *pp = pc_malloc(sizeof *pp);
                PC_ASSERT(pp != NULL);
                pp->start = (uint32_t)(n - rdx_node_len(nd));
                pp->len = rdx_node_len(nd);
                mdl_payloads_live++;
                rdx_tree_set_payload(m->t, nd, pp);
            }
        }
    } else if (op < 50) { /* touch a matched node, maybe extending its lifetime */
        size_t n = mdl_seq(m, q);
        rdx_match_t mt;
        rdx_tree_match(m->t, ns, q, n, &mt);
        m->now += mdl_next(&m->src, 3);
        if (mt.node != NULL) {
            uint64_t exp = mdl_next(&m->src, 3) == 0 ? m->now + 1 + mdl_next(&m->src, 60) : 0;
            size_t d = rdx_node_prefix(m->t, mt.node, m->buf);
            MDL_NOALLOC(m, rc = rdx_tree_touch(m->t, mt.node, m->now, exp));
            if (rc != 0)
                MDL_FAIL(m, "touch returned %d", rc);
            if (exp != 0) {
                ref_elem_t *e = ref_get(&m->ref, ns, m->buf, d);
                if (exp > e->expiry)
                    e->expiry = exp;
            }
        }
    } else if (op < 62) { /* time passes, expire */
        m->now += mdl_next(&m->src, 25);
        size_t freed = 0;
        MDL_NOALLOC(m, rdx_tree_expire(m->t, m->now, &freed));
        for (size_t i = 0; i < m->ref.n;) {
            ref_elem_t *e = &m->ref.e[i];
            if (e->expiry != 0 && e->expiry <= m->now) {
                e->expiry = 0;
                e->entry = 0;
                if (e->pins == 0) {
                    ref_del(&m->ref, i);
                    continue;
                }
            }
            i++;
        }
    } else if (op < 68) { /* evict */
        size_t want = 1 + mdl_next(&m->src, 30), freed = 0;
        rdx_stats_t before, after;
        rdx_tree_stats(m->t, &before);
        m->in_evict = 1;
        MDL_NOALLOC(m, rdx_tree_evict(m->t, want, &freed));
        m->in_evict = 0;
        rdx_tree_stats(m->t, &after);
        if (before.n_tokens - after.n_tokens != freed)
            MDL_FAIL(m, "evict reports %zu tokens freed, stats say %" PRIu64, freed,
                     before.n_tokens - after.n_tokens);
        if (freed < want) {
            /* Short: nothing evictable may be left, i.e. every leaf is pinned. */
            for (size_t i = 0; i < m->ref.n; i++) {
                const ref_elem_t *e = &m->ref.e[i];
                int extended = 0;
                for (size_t j = 0; j < m->ref.n && !extended; j++)
                    extended = j != i && m->ref.e[j].ns == e->ns && m->ref.e[j].n > e->n &&
                               ref_lcp(m->ref.e[j].tok, m->ref.e[j].n, e->tok, e->n) == e->n;
                if (!extended && e->pins == 0)
                    MDL_FAIL(m, "evict stopped short with an unpinned leaf left");
            }
        }
    } else if (op < 74) { /* remove a prefix */
        size_t n = mdl_seq(m, q);
        if (mdl_next(&m->src, 40) == 0)
            n = 0;
        else if (n > 1)
            n = 1 + mdl_next(&m->src, (uint32_t)n);
        int want = 0, any = 0;
        for (size_t i = 0; i < m->ref.n; i++) {
            const ref_elem_t *e = &m->ref.e[i];
            if (e->ns == ns && e->n >= n && ref_lcp(e->tok, e->n, q, n) == n) {
                any = 1;
                if (e->pins)
                    want = PC_ERR_BUSY;
            }
        }
        if (!any)
            want = PC_ERR_NOTFOUND;
        MDL_NOALLOC(m, rc = rdx_tree_remove_prefix(m->t, ns, q, n));
        if (rc != want)
            MDL_FAIL(m, "op %" PRIu64 ": remove_prefix n=%zu returned %d, expected %d", m->ops, n,
                     rc, want);
        if (rc == 0)
            for (size_t i = 0; i < m->ref.n;) {
                const ref_elem_t *e = &m->ref.e[i];
                if (e->ns == ns && e->n >= n && ref_lcp(e->tok, e->n, q, n) == n)
                    ref_del(&m->ref, i);
                else
                    i++;
            }
    } else if (op < 82) { /* pin a matched node */
        size_t n = mdl_seq(m, q);
        rdx_match_t mt;
        rdx_tree_match(m->t, ns, q, n, &mt);
        if (mt.node != NULL && m->n_pins < MDL_MAX_PINS) {
            MDL_NOALLOC(m, rc = rdx_tree_pin(m->t, mt.node));
            if (rc != 0)
                MDL_FAIL(m, "pin returned %d", rc);
            size_t d = rdx_node_prefix(m->t, mt.node, m->buf);
            ref_get(&m->ref, ns, m->buf, d)->pins++;
            m->pins[m->n_pins++].node = mt.node;
        }
    } else if (op < 90) { /* unpin */
        if (m->n_pins > 0) {
            int i = (int)mdl_next(&m->src, (uint32_t)m->n_pins);
            rdx_node_t *x = m->pins[i].node;
            m->pins[i] = m->pins[--m->n_pins];
            size_t d = rdx_node_prefix(m->t, x, m->buf);
            uint64_t xns = rdx_node_ns(x);
            long ri = ref_find(&m->ref, xns, m->buf, d);
            MDL_NOALLOC(m, rc = rdx_tree_unpin(m->t, x));
            if (rc < 0 || ri < 0)
                MDL_FAIL(m, "unpin returned %d (reference has it: %d)", rc, ri >= 0);
            else {
                ref_elem_t *e = &m->ref.e[ri];
                e->pins--;
                if (e->pins == 0 && e->expiry == 0)
                    ref_del(&m->ref, (size_t)ri);
                if (rc == 1 && mdl_is_pinned_handle(m, x))
                    MDL_FAIL(m, "unpin freed a node that is still pinned");
            }
        }
    } else if (op < 97) { /* owners */
        size_t n = mdl_seq(m, q);
        rdx_match_t mt;
        rdx_tree_match(m->t, ns, q, n, &mt);
        if (mt.node != NULL) {
            uint32_t o =
                mdl_next(&m->src, 4) == 0 ? mdl_next(&m->src, 200) : mdl_next(&m->src, 3) * 70;
            uint32_t what = mdl_next(&m->src, 3);
            if (what == 0)
                MDL_MUTATE(m, rc, rdx_tree_owner_add(m->t, mt.node, o));
            else if (what == 1)
                MDL_MUTATE(m, rc, rdx_tree_owner_add_path(m->t, mt.node, o));
            else
                MDL_NOALLOC(m, rc = rdx_tree_owner_del(m->t, mt.node, o));
            if (rc != 0)
                MDL_FAIL(m, "owner op %u returned %d", what, rc);
            else if (rdx_tree_owner_has(m->t, mt.node, o) != (what != 2))
                MDL_FAIL(m, "owner %u membership wrong after op %u", o, what);
        }
    } else { /* an out-of-range token must be refused and change nothing */
        size_t n = mdl_seq(m, q);
        if (m->vocab != 0) {
            q[n++] = (uint32_t)m->vocab + mdl_next(&m->src, 5);
            char *before = mdl_dump(m);
            rc = rdx_tree_insert(m->t, ns, q, n, m->now, m->now + 5, 0, NULL);
            char *after = mdl_dump(m);
            if (rc != PC_ERR_RANGE || strcmp(before, after) != 0)
                MDL_FAIL(m, "out-of-range insert returned %d or changed the tree", rc);
            free(before);
            free(after);
        }
    }
    if (m->check)
        mdl_check(m);
    mdl_compare(m, compare_full);
    return !m->failed;
}

#endif
