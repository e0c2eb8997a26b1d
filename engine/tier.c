/*
 * tier.c — the KV tiers below the pool (see tier.h): write-back and write-through through a
 * bounded staging queue and the engine's I/O thread, the host-memory tier G2 in front of the
 * disk (copies on the backend's copy stream, inserted when their fence is done, its evictions
 * written down to the disk), the continuation of a G1 match into G2 and the disk tier (copies,
 * loads, exact hole recompute, the load-vs-recompute cost model), prefetch tickets, and what
 * the tiers hold, over the tier store (kvtier.h).
 *
 * Threads. The engine's thread calls everything here; the I/O thread runs io_main. They share,
 * under t->mu: the write queue and the in-flight names (so a block is queued once), the read
 * queue of tickets, the staging byte count and the counters the I/O thread updates. The store
 * has its own lock; the chain map (t->chains: what the store holds, for events and listings)
 * has t->map_mu, taken by the store's eviction callback on whatever thread evicts, so it never
 * nests inside t->mu.
 *
 * G2 lives on the engine's thread alone: its copies out of the pool waiting for their fence
 * (g2q), its records lent to copies into the pool (lent), its puts, spills and removals. Its
 * store's eviction callback so also runs on the engine's thread.
 *
 * Staging. A queued write owns a copy of its block (taken on the engine's thread when the
 * block leaves the pool); a ticket owns one buffer per block it reads. Both count against
 * queue_bytes; a write that does not fit is dropped and counted, a ticket that does not fit is
 * refused (PC_ERR_BUSY).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "engine_internal.h"
#include "kvtier.h"
#include "pc_alloc.h"
#include "pc_assert.h"
#include "pc_err.h"
#include "pc_log.h"
#include "pc_time.h"
#include "pc_u64map.h"
#include "pc_vec.h"

/* The pool's block layout (kvpool.h); part of every record's name. */
#define TIER_LAYOUT_VERSION 1

typedef eng_kvtier_name_t name_t;

/* Scratch: the chain of names of a prompt's blocks and a plan byte per block. */
typedef struct names {
    name_t *v; /* [cap] */
    size_t cap;
    uint8_t *plan;    /* [cap] */
    const void **src; /* [cap] reads: the G2 payload lent for block i, or NULL */
} names_t;

/* A block copied out of the pool into a staging piece, waiting for its fence to go into G2. */
typedef struct g2job {
    struct g2job *next;
    eng_kvtier_rec_t rec; /* rec.tokens points at tokens[] */
    void *piece;          /* [block_bytes] a slab piece */
    uint64_t fence;
    int32_t tokens[]; /* [rec.n_tokens] */
} g2job_t;

/* A G2 record lent to a copy into the pool, until the copy's fence is done. */
typedef struct g2lend {
    name_t name;
    uint64_t fence;
} g2lend_t;

/* Which lower tiers hold a chain entry's block (chain_t.held). */
enum { HELD_G2 = 1, HELD_G3 = 2 };

/* A block waiting to be written. */
typedef struct wjob {
    struct wjob *next;
    eng_kvtier_rec_t rec; /* rec.tokens points at tokens[] */
    void *payload;        /* [block_bytes] */
    int32_t tokens[];     /* [rec.n_tokens] */
} wjob_t;

enum { ENT_SKIP = 0, ENT_PENDING = 1, ENT_OK = 2, ENT_FAIL = 3 };

/* One block of a ticket: block index first + its position. */
typedef struct tent {
    name_t name;
    void *buf; /* [block_bytes] for PENDING/OK, NULL for SKIP */
    int state;
} tent_t;

struct eng_tier_ticket {
    eng_tier_ticket_t *prev, *next; /* t->tickets */
    eng_tier_ticket_t *rnext;       /* the read queue */
    uint64_t ns;
    uint32_t first, n; /* block indices [first, first + n) */
    int32_t *tokens;   /* [(first + n) * bt] */
    int pending;       /* reads not finished; read with atomics */
    bool queued;       /* in the read queue: some entry not yet taken */
    uint32_t cursor;   /* the next entry an I/O thread takes (t->mu) */
    uint32_t active;   /* entries I/O threads are reading now (t->mu) */
    bool borrowed;     /* the buffers are the sequence's pool blocks (eng_seq_start_cached's own
                          loads): not staged for others, not owned, not in queue_bytes */
    uint64_t t0_ns;    /* when it was queued: its reads' wall time feeds the bandwidth figure */
    int ok;            /* entries read and verified (atomics) */
    tent_t ent[];      /* [n] */
};

/* What the stores hold, by name: one per block G2 or G3 holds (built from the disk store's
 * index at open, kept by puts and the stores' eviction callbacks), plus "gone" entries (held
 * 0): blocks no tier holds that are still the ancestor of a held one, kept so that every held
 * block's whole token path can be named (in events and listings) while a block before it is in
 * no tier (a hole). An entry counts the entries linked to it as their parent and goes when it
 * is gone and has none. */
typedef struct chain {
    name_t name, parent;
    uint64_t ns;
    uint32_t block_index;
    uint32_t n_tokens;
    uint32_t n_children; /* entries linked to this one as their parent */
    uint8_t held;        /* HELD_G2 | HELD_G3: the tiers holding it; 0: gone */
    bool linked;         /* counted in its parent's n_children */
    bool orphan;         /* not linked, waiting in t->orphans for its parent to arrive */
    bool has_child;      /* scratch of eng_tier_prefixes */
    struct chain *onext; /* the next orphan waiting for the same parent */
    int32_t tokens[];
} chain_t;

/* An I/O thread's argument: reads first, then (thread 0 alone, so records land parent first,
 * in the order they were queued) writes. */
typedef struct io_arg {
    struct eng_tiers *t;
    bool writer;
} io_arg_t;

/* A tier event waiting for eng_tier_poll. */
typedef struct tev {
    struct tev *next;
    uint64_t ns;
    uint32_t n_tokens; /* of tokens, or the prefix length when has_path is false */
    uint8_t tier;
    bool has_path;
    int32_t tokens[];
} tev_t;

struct eng_tiers {
    eng_t *e;
    eng_kvtier_t *g3;
    /* G2 (NULL without it): its store over a slab of pinned pieces, the copies out of the pool
     * waiting for their fence (FIFO: fences complete in order), the records lent to copies into
     * the pool, and what its eviction callback reports for a removal (set around spills). */
    eng_kvtier_t *g2;
    eng_host_slab_t *slab;
    g2job_t *g2q_head, *g2q_tail;
    uint32_t g2_staging, g2_stage_max; /* staging pieces in use, and their bound */
    g2lend_t *lent;
    size_t n_lent, cap_lent;
    uint8_t g2_gone_tier;
    double g2_ns_per_block; /* EWMA of a G2 copy's time per block */
    /* A start's asynchronous G2 copies: when the first was enqueued, how many, the last fence. */
    uint64_t g2_batch_t0, g2_batch_fence;
    uint32_t g2_batch_n;
    eng_kvtier_ident_t ident; /* .ns set per call */
    uint32_t bt;
    size_t block_bytes;
    uint32_t min_tokens;
    uint64_t queue_bytes;
    void *load_buf; /* [block_bytes] a load's bounce buffer (no_storage pools) */
    /* A prompt's chain of names and a plan per block: one for reads (continue, prefetch) and
     * one for writes, which run inside a read's loads and recomputes (their evictions). */
    names_t rd, wr;

    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    pthread_t *threads;  /* [n_threads] */
    io_arg_t io_args[2]; /* thread 0's (the writer), the others' */
    uint32_t n_threads, n_started;
    void (*before_read)(void *ud); /* eng_tier_params.before_read (tests) */
    void *before_read_ud;
    bool stop;
    wjob_t *wq_head, *wq_tail; /* writes, FIFO */
    uint32_t writing;          /* write jobs I/O threads hold */
    eng_tier_ticket_t *rq_head, *rq_tail;
    eng_tier_ticket_t *tickets; /* live tickets */
    pc_u64map_t inflight;       /* name key -> wjob_t queued or being written */
    uint64_t staged_bytes;
    uint64_t load_blocks, load_bytes, load_ns; /* by this file's reads (gets) */
    double ns_per_block;                       /* EWMA of a disk load's time per block */
    double bytes_per_s; /* EWMA of a ticket's bytes over its reads' wall time (in parallel) */
    /* The shutdown drain (eng__tier_drain_begin): writes wait for room until drain_until_ns,
     * and queue at most drain_left bytes. */
    uint64_t drain_until_ns, drain_left;

    pthread_mutex_t map_mu;
    pc_u64map_t chains;  /* name key -> chain_t */
    pc_u64map_t orphans; /* parent's name key -> chain_t list (onext) of entries written before
                            their parent (a leaf of the prefix index leaves the pool first) */
    tev_t *ev_head, *ev_tail;

    eng_tier_stats_t st; /* this file's counters (store's are merged in eng_tier_stats) */
};

static void g2_poll(struct eng_tiers *t, bool wait);
static void g2_drain(struct eng_tiers *t);

static uint64_t name_key(const name_t *n)
{
    uint64_t k;
    memcpy(&k, n->b, sizeof k);
    return k != 0 ? k : 1;
}

/* The chain's names of blocks 0 .. nb - 1 (>= 1) of tokens, into c->v. */
static int chain_names(struct eng_tiers *t, names_t *c, uint64_t ns, const int32_t *tokens,
                       uint32_t nb)
{
    if (nb > c->cap) {
        name_t *v = pc_reallocarray(c->v, nb, sizeof *v);
        if (v == NULL)
            return PC_ERR_NOMEM;
        c->v = v;
        uint8_t *pl = pc_realloc(c->plan, nb);
        if (pl == NULL)
            return PC_ERR_NOMEM; /* cap unchanged: the plan is still the old size */
        c->plan = pl;
        const void **src = pc_reallocarray(c->src, nb, sizeof *src);
        if (src == NULL)
            return PC_ERR_NOMEM;
        c->src = src;
        c->cap = nb;
    }
    eng_kvtier_ident_t id = t->ident;
    id.ns = ns;
    name_t prev;
    eng_kvtier_seed(&id, &prev);
    for (uint32_t i = 0; i < nb; i++) {
        eng_kvtier_name_next(&prev, tokens + (size_t)i * t->bt, t->bt, &c->v[i]);
        prev = c->v[i];
    }
    return 0;
}

/* ---- the chain map and events ---- */

static bool is_parent(const chain_t *p, const chain_t *c)
{
    return p->block_index + 1 == c->block_index &&
           memcmp(p->name.b, c->parent.b, sizeof p->name.b) == 0;
}

/* Takes c out of the orphans waiting for its parent (map_mu held). */
static void orphan_del(struct eng_tiers *t, chain_t *c)
{
    uint64_t k = name_key(&c->parent);
    chain_t *head = pc_u64map_get(&t->orphans, k), **pp = &head;
    while (*pp != NULL && *pp != c)
        pp = &(*pp)->onext;
    if (*pp == c)
        *pp = c->onext;
    if (head == NULL)
        pc_u64map_del(&t->orphans, k);
    else
        (void)pc_u64map_put(&t->orphans, k, head); /* replaces a value: no allocation */
    c->orphan = false;
    c->onext = NULL;
}

/* Counts c in its parent's children when the parent is known, else leaves it with the orphans
 * until the parent arrives (map_mu held). Out of memory only loses the link (the listing then
 * shows the chain's two parts apart). */
static void chain_link(struct eng_tiers *t, chain_t *c)
{
    if (c->linked || c->block_index == 0)
        return;
    chain_t *p = pc_u64map_get(&t->chains, name_key(&c->parent));
    if (p != NULL && is_parent(p, c)) {
        if (c->orphan)
            orphan_del(t, c);
        p->n_children++;
        c->linked = true;
        return;
    }
    if (!c->orphan) {
        uint64_t k = name_key(&c->parent);
        chain_t *head = pc_u64map_get(&t->orphans, k);
        c->onext = head;
        if (pc_u64map_put(&t->orphans, k, c) == 0)
            c->orphan = true;
        else
            c->onext = NULL;
    }
}

/* A new entry p adopts the orphans that wait for it (map_mu held). */
static void chain_adopt(struct eng_tiers *t, chain_t *p)
{
    chain_t *o = pc_u64map_get(&t->orphans, name_key(&p->name));
    while (o != NULL) {
        chain_t *next = o->onext;
        if (is_parent(p, o))
            chain_link(t, o);
        o = next;
    }
}

/* Adds a record tier `held` (HELD_G2 or HELD_G3) holds to the chain map (map_mu held). Out of
 * memory only loses the listing. */
static void chain_add(struct eng_tiers *t, const eng_kvtier_rec_t *rec, uint8_t held)
{
    uint64_t k = name_key(&rec->name);
    chain_t *c = pc_u64map_get(&t->chains, k);
    if (c != NULL) {
        c->held |= held;
        return;
    }
    c = pc_malloc(sizeof *c + (size_t)rec->n_tokens * sizeof(int32_t));
    if (c == NULL)
        return;
    *c = (chain_t){.name = rec->name,
                   .parent = rec->parent,
                   .ns = rec->ns,
                   .block_index = rec->block_index,
                   .n_tokens = rec->n_tokens,
                   .held = held};
    memcpy(c->tokens, rec->tokens, (size_t)rec->n_tokens * sizeof(int32_t));
    if (pc_u64map_put(&t->chains, k, c) != 0) {
        pc_free(c);
        return;
    }
    chain_link(t, c);
    chain_adopt(t, c);
}

/* Tier `held` dropped c's record: when no tier holds it any more, c goes, and so do its gone
 * ancestors no entry needs any more (map_mu held). */
static void chain_forget(struct eng_tiers *t, chain_t *c, uint8_t held)
{
    c->held &= (uint8_t)~held;
    while (c != NULL && c->held == 0 && c->n_children == 0) {
        chain_t *p = c->linked ? pc_u64map_get(&t->chains, name_key(&c->parent)) : NULL;
        if (c->orphan)
            orphan_del(t, c);
        pc_u64map_del(&t->chains, name_key(&c->name));
        pc_free(c);
        if (p != NULL)
            p->n_children--;
        c = p;
    }
}

/* The path of chain c from block 0 into out[(c->block_index + 1) * bt] (map_mu held). Returns
 * true when every ancestor is still known; *all_g2 (when not NULL) says whether G2 holds every
 * block of it. */
static bool chain_path_g2(struct eng_tiers *t, const chain_t *c, int32_t *out, bool *all_g2)
{
    bool g2 = true;
    for (;;) {
        memcpy(out + (size_t)c->block_index * t->bt, c->tokens, (size_t)t->bt * sizeof(int32_t));
        g2 = g2 && (c->held & HELD_G2) != 0;
        if (all_g2 != NULL)
            *all_g2 = g2;
        if (c->block_index == 0)
            return true;
        const chain_t *p = pc_u64map_get(&t->chains, name_key(&c->parent));
        if (p == NULL || p->block_index + 1 != c->block_index ||
            memcmp(p->name.b, c->parent.b, sizeof p->name.b) != 0)
            return false;
        c = p;
    }
}

static bool chain_path(struct eng_tiers *t, const chain_t *c, int32_t *out)
{
    return chain_path_g2(t, c, out, NULL);
}

/* Queues an event: rec's block is now in `tier` (map_mu held); its path from the chain map. */
static void event_push(struct eng_tiers *t, const eng_kvtier_rec_t *rec, const chain_t *c,
                       uint8_t tier)
{
    uint32_t n = (rec->block_index + 1) * t->bt;
    tev_t *ev = pc_malloc(sizeof *ev + (size_t)n * sizeof(int32_t));
    if (ev == NULL)
        return;
    *ev = (tev_t){.ns = rec->ns, .n_tokens = n, .tier = tier};
    if (c != NULL) {
        ev->has_path = chain_path(t, c, ev->tokens);
    } else {
        /* A block with no entry (G2 never took it): its parent's path and its own tokens. */
        const chain_t *p =
            rec->block_index > 0 ? pc_u64map_get(&t->chains, name_key(&rec->parent)) : NULL;
        ev->has_path =
            rec->block_index == 0 || (p != NULL && p->block_index + 1 == rec->block_index &&
                                      memcmp(p->name.b, rec->parent.b, sizeof p->name.b) == 0 &&
                                      chain_path(t, p, ev->tokens));
        if (ev->has_path)
            memcpy(ev->tokens + (size_t)rec->block_index * t->bt, rec->tokens,
                   (size_t)t->bt * sizeof(int32_t));
    }
    if (t->ev_tail != NULL)
        t->ev_tail->next = ev;
    else
        t->ev_head = ev;
    t->ev_tail = ev;
}

/* The disk store dropped a record (any thread, the store's lock held): forget it and queue the
 * event (the block is now in G2 when G2 holds it, else in no tier: the disk is the lowest). */
static void on_store_evict(void *ud, const eng_kvtier_rec_t *rec, int reason)
{
    (void)reason;
    struct eng_tiers *t = ud;
    pthread_mutex_lock(&t->map_mu);
    chain_t *c = pc_u64map_get(&t->chains, name_key(&rec->name));
    event_push(t, rec, c, c != NULL && (c->held & HELD_G2) != 0 ? ENG_TIER_G2 : ENG_TIER_NONE);
    if (c != NULL)
        chain_forget(t, c, HELD_G3);
    pthread_mutex_unlock(&t->map_mu);
}

/* G2 dropped a record (the engine's thread: its put, or a removal): forget it and queue the
 * event. A spill sets g2_gone_tier to where the block went; a budget eviction the store made
 * on its own (room it could not make otherwise) leaves the block in G3 only when G3 has it. */
static void on_g2_evict(void *ud, const eng_kvtier_rec_t *rec, int reason)
{
    struct eng_tiers *t = ud;
    if (reason == 1)
        t->st.g2_evictions++;
    pthread_mutex_lock(&t->map_mu);
    chain_t *c = pc_u64map_get(&t->chains, name_key(&rec->name));
    uint8_t tier = t->g2_gone_tier;
    if (tier == ENG_TIER_NONE && c != NULL && (c->held & HELD_G3) != 0)
        tier = ENG_TIER_G3;
    event_push(t, rec, c, tier);
    if (c != NULL)
        chain_forget(t, c, HELD_G2);
    pthread_mutex_unlock(&t->map_mu);
}

static int on_store_rec(void *ud, const eng_kvtier_rec_t *rec)
{
    chain_add(ud, rec, HELD_G3);
    return 0;
}

uint32_t eng_tier_poll(eng_t *e, eng_tier_event_fn fn, void *ud)
{
    struct eng_tiers *t = e->tier;
    if (t == NULL)
        return 0;
    g2_poll(t, false); /* G2's finished copies (and what they evict) report here too */
    pthread_mutex_lock(&t->map_mu);
    tev_t *ev = t->ev_head;
    t->ev_head = t->ev_tail = NULL;
    pthread_mutex_unlock(&t->map_mu);
    uint32_t n = 0;
    while (ev != NULL) {
        tev_t *next = ev->next;
        eng_tier_event_t out = {.ns = ev->ns,
                                .n_tokens = ev->n_tokens,
                                .tier = ev->tier,
                                .tokens = ev->has_path ? ev->tokens : NULL};
        if (fn != NULL)
            fn(&out, ud);
        pc_free(ev);
        ev = next;
        n++;
    }
    return n;
}

int eng_tier_prefixes(eng_t *e, eng_tier_prefix_fn fn, void *ud)
{
    struct eng_tiers *t = e->tier;
    if (t == NULL)
        return 0;
    int rc = 0, n = 0;
    int32_t *path = NULL;
    size_t path_cap = 0;
    pthread_mutex_lock(&t->map_mu);
    pc_u64map_t *m = &t->chains;
    for (size_t i = pc_u64map_next(m, 0); i < m->cap; i = pc_u64map_next(m, i + 1))
        ((chain_t *)m->slots[i].value)->has_child = false;
    /* Every ancestor of a held entry (through gone ones) has a child: only the ends remain. */
    for (size_t i = pc_u64map_next(m, 0); i < m->cap; i = pc_u64map_next(m, i + 1)) {
        const chain_t *c = m->slots[i].value;
        if (c->held == 0)
            continue;
        while (c->linked) {
            chain_t *p = pc_u64map_get(m, name_key(&c->parent));
            if (p == NULL || p->has_child)
                break;
            p->has_child = true;
            c = p;
        }
    }
    for (size_t i = pc_u64map_next(m, 0); i < m->cap; i = pc_u64map_next(m, i + 1)) {
        const chain_t *c = m->slots[i].value;
        if (c->has_child || c->held == 0)
            continue;
        uint32_t len = (c->block_index + 1) * t->bt;
        if (pc_array_reserve(&path, &path_cap, len) != 0) {
            rc = PC_ERR_NOMEM;
            break;
        }
        /* A chain whose path is no longer known (an ancestor gone before it was linked) is not
         * listed; holes whose tokens are known are (a read recomputes them). */
        bool all_g2;
        if (!chain_path_g2(t, c, path, &all_g2))
            continue;
        eng_tier_prefix_t out = {.ns = c->ns,
                                 .n_tokens = len,
                                 .tier = all_g2 ? ENG_TIER_G2 : ENG_TIER_G3,
                                 .tokens = path};
        fn(&out, ud);
        n++;
    }
    pthread_mutex_unlock(&t->map_mu);
    pc_free(path);
    return rc != 0 ? rc : n;
}

/* ---- the I/O thread ---- */

static void io_write(struct eng_tiers *t, wjob_t *j)
{
    uint64_t t0 = pc_time_mono_ns();
    int rc = eng_kvtier_put(t->g3, &j->rec, j->payload, t->block_bytes);
    uint64_t dt = pc_time_mono_ns() - t0;
    if (rc >= 0) {
        pthread_mutex_lock(&t->map_mu);
        chain_add(t, &j->rec, HELD_G3);
        pthread_mutex_unlock(&t->map_mu);
    }
    pthread_mutex_lock(&t->mu);
    if (rc == 0) {
        t->st.write_blocks++;
        t->st.write_bytes += t->block_bytes;
        t->st.write_ns += dt;
    } else if (rc < 0) {
        t->st.write_errors++;
    }
    pc_u64map_del(&t->inflight, name_key(&j->rec.name));
    t->staged_bytes -= t->block_bytes;
    t->writing--;
    pthread_cond_broadcast(&t->cv_done);
    pthread_mutex_unlock(&t->mu);
    if (rc < 0)
        PC_LOG(PC_LOG_WARN, "tier", "writing a KV block: %s", pc_strerror(rc));
    pc_free(j->payload);
    pc_free(j);
}

/* One disk load with its time in the cost model's figures. Returns the store's answer. */
static int load_block(struct eng_tiers *t, const name_t *name, const int32_t *tokens, void *dst)
{
    if (t->before_read != NULL)
        t->before_read(t->before_read_ud);
    uint64_t t0 = pc_time_mono_ns();
    int rc = eng_kvtier_get(t->g3, name, tokens, t->bt, dst, t->block_bytes);
    if (rc == 0) {
        double dt = (double)(pc_time_mono_ns() - t0);
        pthread_mutex_lock(&t->mu);
        t->load_blocks++;
        t->load_bytes += t->block_bytes;
        t->load_ns += (uint64_t)dt;
        t->ns_per_block = t->ns_per_block > 0 ? 0.9 * t->ns_per_block + 0.1 * dt : dt;
        pthread_mutex_unlock(&t->mu);
    }
    return rc;
}

/* Takes the next block to read (t->mu held): its ticket and entry, or false. A ticket leaves
 * the queue when its last entry is taken. */
static bool take_read(struct eng_tiers *t, eng_tier_ticket_t **kout, uint32_t *iout)
{
    while (t->rq_head != NULL) {
        eng_tier_ticket_t *k = t->rq_head;
        while (k->cursor < k->n && k->ent[k->cursor].state != ENT_PENDING)
            k->cursor++;
        if (k->cursor < k->n) {
            *kout = k;
            *iout = k->cursor++;
            k->active++;
            return true;
        }
        t->rq_head = k->rnext;
        if (t->rq_head == NULL)
            t->rq_tail = NULL;
        k->queued = false;
    }
    return false;
}

static void *io_main(void *arg)
{
    struct eng_tiers *t = ((io_arg_t *)arg)->t;
    bool writer = ((io_arg_t *)arg)->writer;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        eng_tier_ticket_t *k;
        uint32_t i;
        if (take_read(t, &k, &i)) { /* reads first: a request waits on them */
            pthread_mutex_unlock(&t->mu);
            tent_t *en = &k->ent[i];
            const int32_t *tok = k->tokens + (size_t)(k->first + i) * t->bt;
            int st = load_block(t, &en->name, tok, en->buf) == 0 ? ENT_OK : ENT_FAIL;
            if (st == ENT_OK)
                __atomic_add_fetch(&k->ok, 1, __ATOMIC_RELAXED);
            __atomic_store_n(&en->state, st, __ATOMIC_RELEASE);
            bool last = __atomic_sub_fetch(&k->pending, 1, __ATOMIC_ACQ_REL) == 0;
            uint64_t now = pc_time_mono_ns();
            pthread_mutex_lock(&t->mu);
            int ok = __atomic_load_n(&k->ok, __ATOMIC_RELAXED);
            if (last && ok > 0 && now > k->t0_ns) {
                double bw = (double)ok * (double)t->block_bytes * 1e9 / (double)(now - k->t0_ns);
                t->bytes_per_s = t->bytes_per_s > 0 ? 0.8 * t->bytes_per_s + 0.2 * bw : bw;
            }
            k->active--;
            pthread_cond_broadcast(&t->cv_done);
            continue;
        }
        if (writer && t->wq_head != NULL) {
            wjob_t *j = t->wq_head;
            t->wq_head = j->next;
            if (t->wq_head == NULL)
                t->wq_tail = NULL;
            t->writing++;
            pthread_mutex_unlock(&t->mu);
            io_write(t, j);
            pthread_mutex_lock(&t->mu);
            continue;
        }
        if (t->stop)
            break;
        pthread_cond_wait(&t->cv_work, &t->mu);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* ---- lifecycle ---- */

/* G2: a store of p->g2_bytes over a slab of the backend's host memory, with room for its
 * records, the one a put takes before it evicts, and the staging pieces of copies in flight. */
static int g2_open(struct eng_tiers *t, const eng_tier_params_t *p, char *err, size_t err_len)
{
    size_t bb = t->block_bytes, piece = (bb + 4095) & ~(size_t)4095;
    uint64_t cap = p->g2_bytes / bb;
    if (cap == 0) {
        snprintf(err, err_len,
                 "engine: the host-memory tier's budget (%llu bytes) is below one KV block (%zu)",
                 (unsigned long long)p->g2_bytes, bb);
        return PC_ERR_INVAL;
    }
    t->g2_stage_max = (uint32_t)PC_MAX(1, PC_MIN(p->queue_bytes / piece, 1024));
    if (cap > (UINT64_MAX / piece) - 1 - t->g2_stage_max) {
        snprintf(err, err_len, "engine: the host-memory tier's budget is too large");
        return PC_ERR_INVAL;
    }
    int rc = eng_host_slab_init(t->e->be, bb, (cap + 1 + t->g2_stage_max) * piece, &t->slab);
    if (rc != 0) {
        snprintf(err, err_len, "engine: the host-memory tier: %s", pc_strerror(rc));
        return rc;
    }
    eng_kvtier_params_t kp = eng_kvtier_params_default();
    kp.kind = ENG_KVTIER_HOST;
    kp.max_bytes = p->g2_bytes;
    kp.payload_bytes = (uint32_t)bb;
    kp.block_tokens = t->bt;
    kp.host_alloc = eng_host_slab_alloc;
    kp.host_free = eng_host_slab_release;
    kp.host_ud = t->slab;
    rc = eng_kvtier_open(&kp, &t->g2, err, err_len);
    if (rc != 0)
        return rc;
    eng_kvtier_set_evict_cb(t->g2, on_g2_evict, t);
    PC_LOG(PC_LOG_INFO, "tier", "host-memory tier: %llu blocks (%.1f MiB)%s",
           (unsigned long long)cap, (double)p->g2_bytes / (1 << 20),
           eng_backend_has_kv_xfer(t->e->be) ? ", pinned, on the copy stream"
                                             : " (the pool is host memory already)");
    return 0;
}

/* Frees G2: waits for its copies in flight, drops what they carried, gives lent records back. */
static void g2_close(struct eng_tiers *t)
{
    eng_backend_t *be = t->e->be;
    while (t->g2q_head != NULL) {
        g2job_t *j = t->g2q_head;
        t->g2q_head = j->next;
        (void)eng_backend_kv_fence(be, j->fence, true);
        eng_host_slab_release(t->slab, j->piece, t->block_bytes);
        pc_free(j);
    }
    t->g2q_tail = NULL;
    t->g2_staging = 0;
    for (size_t i = 0; i < t->n_lent; i++) {
        (void)eng_backend_kv_fence(be, t->lent[i].fence, true);
        eng_kvtier_host_unref(t->g2, &t->lent[i].name);
    }
    t->n_lent = 0;
    if (t->g2 != NULL)
        eng_kvtier_set_evict_cb(t->g2, NULL, NULL);
    eng_kvtier_free(t->g2); /* its records' pieces go back to the slab */
    t->g2 = NULL;
    eng_host_slab_free(t->slab);
    t->slab = NULL;
    pc_free(t->lent);
    t->lent = NULL;
}

int eng__tier_init(eng_t *e, const eng_tier_params_t *p, struct eng_tiers **out, char *err,
                   size_t err_len)
{
    *out = NULL;
    eng_kvpool_t *pool = e->kv;
    size_t bb = eng_kvpool_block_bytes(pool);
    if (bb > ENG_KVTIER_MAX_PAYLOAD || eng_kvpool_block_tokens(pool) > ENG_KVTIER_MAX_TOKENS) {
        snprintf(err, err_len, "engine: a KV block of %zu bytes is too large for the tier store",
                 bb);
        return PC_ERR_INVAL;
    }
    if (p->queue_bytes < bb) {
        snprintf(err, err_len,
                 "engine: the tier staging budget (%llu bytes) is below one KV block (%zu)",
                 (unsigned long long)p->queue_bytes, bb);
        return PC_ERR_INVAL;
    }
    struct eng_tiers *t = pc_calloc(1, sizeof *t);
    if (t == NULL)
        return PC_ERR_NOMEM;
    t->e = e;
    t->bt = eng_kvpool_block_tokens(pool);
    t->block_bytes = bb;
    t->min_tokens = p->min_tokens;
    t->queue_bytes = p->queue_bytes;
    t->ident = (eng_kvtier_ident_t){.model_fp = e->model_fp,
                                    .kv_dtype = (uint32_t)eng_kvpool_dtype(pool),
                                    .layout_version = TIER_LAYOUT_VERSION,
                                    .block_tokens = t->bt};
    pthread_mutex_init(&t->mu, NULL);
    pthread_mutex_init(&t->map_mu, NULL);
    pthread_cond_init(&t->cv_work, NULL);
    pthread_cond_init(&t->cv_done, NULL);
    int rc;
    t->load_buf = pc_malloc(bb);
    if (t->load_buf == NULL) {
        rc = PC_ERR_NOMEM;
        snprintf(err, err_len, "engine: out of memory");
        goto fail;
    }
    eng_kvtier_params_t kp = eng_kvtier_params_default();
    kp.kind = ENG_KVTIER_DISK;
    kp.dir = p->dir;
    if (p->max_bytes > 0)
        kp.max_bytes = p->max_bytes;
    kp.payload_bytes = (uint32_t)bb;
    kp.block_tokens = t->bt;
    kp.key = p->key;
    rc = eng_kvtier_open(&kp, &t->g3, err, err_len);
    if (rc != 0)
        goto fail;
    /* The chains the disk holds (after a restart), then every later change through the
     * callback. */
    pthread_mutex_lock(&t->map_mu);
    rc = eng_kvtier_foreach(t->g3, on_store_rec, t); /* LRU first: a parent adopts children */
    pthread_mutex_unlock(&t->map_mu);
    eng_kvtier_set_evict_cb(t->g3, on_store_evict, t);
    t->before_read = p->before_read;
    t->before_read_ud = p->before_read_ud;
    if (p->g2_bytes > 0 && (rc = g2_open(t, p, err, err_len)) != 0)
        goto fail;
    t->n_threads = p->io_threads > 0 ? PC_MIN(p->io_threads, 64u) : 8;
    t->threads = pc_calloc(t->n_threads, sizeof *t->threads);
    if (t->threads == NULL) {
        rc = PC_ERR_NOMEM;
        snprintf(err, err_len, "engine: out of memory");
        goto fail;
    }
    for (; t->n_started < t->n_threads; t->n_started++) {
        io_arg_t *a = &t->io_args[t->n_started == 0 ? 0 : 1];
        *a = (io_arg_t){.t = t, .writer = t->n_started == 0};
        if (pthread_create(&t->threads[t->n_started], NULL, io_main, a) != 0) {
            rc = PC_ERR_NOMEM;
            snprintf(err, err_len, "engine: cannot start the tier I/O threads");
            goto fail;
        }
    }
    eng_kvtier_stats_t ks;
    eng_kvtier_stats(t->g3, &ks);
    PC_LOG(PC_LOG_INFO, "tier",
           "disk tier %s: %llu blocks (%.1f MiB of %.1f MiB), %s reads%s, %llu corrupt and %llu "
           "stale records removed",
           p->dir, (unsigned long long)ks.records, (double)ks.bytes / (1 << 20),
           (double)ks.max_bytes / (1 << 20), ks.direct_io ? "O_DIRECT" : "buffered",
           ks.encrypted ? ", encrypted" : "", (unsigned long long)ks.corrupt,
           (unsigned long long)ks.stale);
    *out = t;
    return 0;
fail:
    eng__tier_free(t);
    return rc;
}

void eng__tier_free(struct eng_tiers *t)
{
    if (t == NULL)
        return;
    if (t->n_started > 0) {
        pthread_mutex_lock(&t->mu);
        t->stop = true;
        pthread_cond_broadcast(&t->cv_work);
        pthread_mutex_unlock(&t->mu);
        for (uint32_t i = 0; i < t->n_started; i++)
            pthread_join(t->threads[i], NULL);
    }
    pc_free(t->threads);
    g2_close(t);
    PC_ASSERT(t->wq_head == NULL && t->rq_head == NULL);
    while (t->tickets != NULL)
        eng_tier_ticket_free(t->e, t->tickets);
    if (t->g3 != NULL)
        eng_kvtier_set_evict_cb(t->g3, NULL, NULL);
    eng_kvtier_free(t->g3);
    pc_u64map_t *m = &t->chains;
    for (size_t i = pc_u64map_next(m, 0); i < m->cap; i = pc_u64map_next(m, i + 1))
        pc_free(m->slots[i].value);
    pc_u64map_free(m);
    pc_u64map_free(&t->orphans);
    pc_u64map_free(&t->inflight);
    while (t->ev_head != NULL) {
        tev_t *n = t->ev_head->next;
        pc_free(t->ev_head);
        t->ev_head = n;
    }
    pthread_mutex_destroy(&t->mu);
    pthread_mutex_destroy(&t->map_mu);
    pthread_cond_destroy(&t->cv_work);
    pthread_cond_destroy(&t->cv_done);
    pc_free(t->load_buf);
    pc_free(t->rd.v);
    pc_free(t->rd.plan);
    pc_free(t->rd.src);
    pc_free(t->wr.v);
    pc_free(t->wr.plan);
    pc_free(t->wr.src);
    pc_free(t);
}

struct eng_kvtier *eng__tier_store(eng_t *e)
{
    return e->tier != NULL ? e->tier->g3 : NULL;
}

struct eng_kvtier *eng__tier_store_g2(eng_t *e)
{
    return e->tier != NULL ? e->tier->g2 : NULL;
}

void eng__tier_block_name(eng_t *e, uint64_t ns, const int32_t *tokens, uint32_t i, name_t *out)
{
    struct eng_tiers *t = e->tier;
    eng_kvtier_ident_t id = t->ident;
    id.ns = ns;
    eng_kvtier_seed(&id, out);
    for (uint32_t j = 0; j <= i; j++)
        eng_kvtier_name_next(out, tokens + (size_t)j * t->bt, t->bt, out);
}

/* Removes a block from every tier (a drop, after eng_tier_flush: no G2 record is lent): the
 * disk first, then G2. */
static void tier_remove(struct eng_tiers *t, const name_t *nm)
{
    (void)eng_kvtier_remove(t->g3, nm);
    if (t->g2 != NULL) {
        t->g2_gone_tier = ENG_TIER_NONE;
        (void)eng_kvtier_remove(t->g2, nm);
    }
}

int eng__tier_drop_ns(eng_t *e, uint64_t ns)
{
    struct eng_tiers *t = e->tier;
    eng_tier_flush(e); /* a queued write of ns must not land after the drop */
    name_t *v = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    pthread_mutex_lock(&t->map_mu);
    pc_u64map_t *m = &t->chains;
    for (size_t i = pc_u64map_next(m, 0); i < m->cap; i = pc_u64map_next(m, i + 1)) {
        const chain_t *c = m->slots[i].value;
        if (c->ns != ns || c->held == 0)
            continue;
        if ((rc = pc_array_reserve(&v, &cap, n + 1)) != 0)
            break;
        v[n++] = c->name;
    }
    pthread_mutex_unlock(&t->map_mu);
    /* Outside map_mu: each removal reports through the eviction callbacks, which take it. */
    for (size_t i = 0; rc == 0 && i < n; i++)
        tier_remove(t, &v[i]);
    pc_free(v);
    return rc;
}

/* Whether held entry c's path starts with tokens[0..n), n <= c's path length (map_mu held). */
static bool chain_starts_with(struct eng_tiers *t, const chain_t *c, const int32_t *tokens,
                              uint32_t n, int32_t *path)
{
    return chain_path(t, c, path) && memcmp(path, tokens, (size_t)n * sizeof *tokens) == 0;
}

int eng__tier_drop_prefix(eng_t *e, uint64_t ns, const int32_t *tokens, uint32_t n)
{
    struct eng_tiers *t = e->tier;
    uint32_t bt = t->bt;
    eng_tier_flush(e); /* a queued write of the prefix must not land after the drop */
    /* The records holding KV of a prompt that starts with tokens[0..n): every block whose end
     * is at or past n on such a path. */
    uint32_t from = (n + bt - 1) / bt - 1; /* the first block index ending at or past n */
    name_t *v = NULL;
    int32_t *path = NULL;
    size_t nv = 0, cap = 0, path_cap = 0;
    int rc = 0;
    pthread_mutex_lock(&t->map_mu);
    pc_u64map_t *m = &t->chains;
    for (size_t i = pc_u64map_next(m, 0); rc == 0 && i < m->cap; i = pc_u64map_next(m, i + 1)) {
        const chain_t *c = m->slots[i].value;
        if (c->ns != ns || c->held == 0 || c->block_index < from)
            continue;
        if ((rc = pc_array_reserve(&path, &path_cap, (size_t)(c->block_index + 1) * bt)) != 0)
            break;
        if (!chain_starts_with(t, c, tokens, n, path))
            continue;
        if ((rc = pc_array_reserve(&v, &cap, nv + 1)) == 0)
            v[nv++] = c->name;
    }
    pthread_mutex_unlock(&t->map_mu);
    /* Outside map_mu: each removal reports through the eviction callbacks, which take it. */
    for (size_t i = 0; rc == 0 && i < nv; i++)
        tier_remove(t, &v[i]);
    pc_free(v);
    pc_free(path);
    if (rc != 0 || from == 0)
        return rc;
    /* Then the blocks before `from` on the dropped path that nothing held continues any more,
     * deepest first (the pool drops the ancestors a removal leaves empty, too). */
    names_t anc = {0};
    if ((rc = chain_names(t, &anc, ns, tokens, from)) == 0) {
        for (uint32_t i = from; i-- > 0;) {
            pthread_mutex_lock(&t->map_mu);
            const chain_t *c = pc_u64map_get(&t->chains, name_key(&anc.v[i]));
            bool leaf = c != NULL && c->held != 0 && c->n_children == 0 &&
                        memcmp(c->name.b, anc.v[i].b, sizeof c->name.b) == 0;
            pthread_mutex_unlock(&t->map_mu);
            if (!leaf)
                break;
            tier_remove(t, &anc.v[i]);
        }
    }
    pc_free(anc.v);
    pc_free(anc.plan);
    pc_free(anc.src);
    return rc;
}

void eng__tier_drain_begin(eng_t *e)
{
    struct eng_tiers *t = e->tier;
    const eng_tier_params_t *p = &e->p.tier;
    eng_kvtier_stats_t ks;
    eng_kvtier_stats(t->g3, &ks);
    pthread_mutex_lock(&t->mu);
    t->drain_until_ns = p->shutdown_ms > 0 ? pc_time_mono_ns() + p->shutdown_ms * 1000000ull : 0;
    t->drain_left = p->shutdown_bytes > 0 ? p->shutdown_bytes : ks.max_bytes;
    pthread_mutex_unlock(&t->mu);
}

bool eng__tier_drain_more(eng_t *e)
{
    struct eng_tiers *t = e->tier;
    pthread_mutex_lock(&t->mu);
    bool more = t->drain_until_ns != 0 && pc_time_mono_ns() < t->drain_until_ns &&
                t->drain_left >= t->block_bytes;
    pthread_mutex_unlock(&t->mu);
    return more;
}

void eng__tier_drain_end(eng_t *e)
{
    struct eng_tiers *t = e->tier;
    if (t->g2 != NULL)
        g2_drain(t);
    pthread_mutex_lock(&t->mu);
    t->drain_until_ns = 0;
    t->drain_left = 0;
    pthread_mutex_unlock(&t->mu);
}

bool eng_tier_enabled(const eng_t *e)
{
    return e->tier != NULL;
}

void eng_tier_flush(eng_t *e)
{
    struct eng_tiers *t = e->tier;
    if (t == NULL)
        return;
    g2_poll(t, true); /* G2's copies first: inserting can queue disk writes */
    pthread_mutex_lock(&t->mu);
    while (t->wq_head != NULL || t->writing > 0)
        pthread_cond_wait(&t->cv_done, &t->mu);
    pthread_mutex_unlock(&t->mu);
}

void eng_tier_stats(eng_t *e, eng_tier_stats_t *out)
{
    *out = (eng_tier_stats_t){0};
    struct eng_tiers *t = e->tier;
    if (t == NULL)
        return;
    eng_kvtier_stats_t ks;
    eng_kvtier_stats(t->g3, &ks);
    pthread_mutex_lock(&t->mu);
    *out = t->st;
    out->load_blocks = t->load_blocks;
    out->load_bytes = t->load_bytes;
    out->load_ns = t->load_ns;
    out->queue_bytes = t->staged_bytes;
    out->load_bytes_per_s = t->bytes_per_s > 0    ? t->bytes_per_s
                            : t->ns_per_block > 0 ? (double)t->block_bytes * 1e9 / t->ns_per_block
                                                  : 0;
    pthread_mutex_unlock(&t->mu);
    out->g3_bytes = ks.bytes;
    out->g3_blocks = ks.records;
    out->g3_max_bytes = ks.max_bytes;
    out->evictions = ks.evictions;
    out->corrupt = ks.corrupt;
    if (t->g2 != NULL) {
        eng_kvtier_stats(t->g2, &ks);
        out->g2_bytes = ks.bytes;
        out->g2_blocks = ks.records;
        out->g2_max_bytes = ks.max_bytes;
        out->g2_load_bytes_per_s =
            t->g2_ns_per_block > 0 ? (double)t->block_bytes * 1e9 / t->g2_ns_per_block : 0;
    }
    out->prefill_tokens_per_s = e->prefill_tps;
    out->prefill_mean_pos = e->prefill_pos;
    out->attn_per_pos = eng__tier_attn_ratio(e);
}

/* ---- writes ---- */

/* Queues the disk write of block rec, its payload pool block `block` (host NULL) or
 * host[block_bytes], unless the disk holds it or it is queued already. Returns true when the
 * disk holds it or will (queued), false when it was dropped (counted: the staging queue is
 * full, or out of memory). */
static bool g3_enqueue(struct eng_tiers *t, const eng_kvtier_rec_t *rec, uint32_t block,
                       const void *host)
{
    const name_t *nm = &rec->name;
    if (eng_kvtier_contains(t->g3, nm) == 1)
        return true;
    pthread_mutex_lock(&t->mu);
    bool queued = pc_u64map_get(&t->inflight, name_key(nm)) != NULL;
    bool room = t->staged_bytes + t->block_bytes <= t->queue_bytes;
    /* Draining at shutdown: wait for a queued write to make room (one write's time). */
    while (!queued && !room && t->drain_until_ns != 0 && t->drain_left >= t->block_bytes &&
           (t->wq_head != NULL || t->writing > 0) && pc_time_mono_ns() < t->drain_until_ns) {
        pthread_cond_wait(&t->cv_done, &t->mu);
        room = t->staged_bytes + t->block_bytes <= t->queue_bytes;
    }
    if (t->drain_until_ns != 0) {
        room = room && t->drain_left >= t->block_bytes;
        if (room && !queued)
            t->drain_left -= t->block_bytes;
    }
    pthread_mutex_unlock(&t->mu);
    if (queued)
        return true;
    wjob_t *j = NULL;
    void *payload = NULL;
    if (room) {
        j = pc_malloc(sizeof *j + (size_t)rec->n_tokens * sizeof(int32_t));
        payload = pc_malloc(t->block_bytes);
    }
    int rc = j == NULL || payload == NULL ? PC_ERR_NOMEM : 0;
    if (rc == 0 && host != NULL)
        memcpy(payload, host, t->block_bytes);
    else if (rc == 0)
        rc = eng_kvpool_block_read(t->e->kv, block, payload);
    if (rc != 0) {
        pc_free(j);
        pc_free(payload);
        t->st.write_dropped++;
        return false;
    }
    j->next = NULL;
    j->payload = payload;
    j->rec = *rec;
    memcpy(j->tokens, rec->tokens, (size_t)rec->n_tokens * sizeof(int32_t));
    j->rec.tokens = j->tokens;
    pthread_mutex_lock(&t->mu);
    if (pc_u64map_put(&t->inflight, name_key(nm), j) != 0) {
        pthread_mutex_unlock(&t->mu);
        pc_free(payload);
        pc_free(j);
        t->st.write_dropped++;
        return false;
    }
    t->staged_bytes += t->block_bytes;
    if (t->wq_tail != NULL)
        t->wq_tail->next = j;
    else
        t->wq_head = j;
    t->wq_tail = j;
    pthread_cond_broadcast(&t->cv_work);
    pthread_mutex_unlock(&t->mu);
    return true;
}

/* ---- G2 ---- */

/* Whether a G2 record is lent to a copy into the pool. */
static bool g2_is_lent(const struct eng_tiers *t, const name_t *nm)
{
    for (size_t i = 0; i < t->n_lent; i++)
        if (memcmp(t->lent[i].name.b, nm->b, sizeof nm->b) == 0)
            return true;
    return false;
}

/* The time dt of n blocks' G2 copies into the pool, into the cost model's figures. */
static void g2_timed(struct eng_tiers *t, uint64_t dt, uint32_t n)
{
    double per = (double)dt / n;
    t->st.g2_load_ns += dt;
    t->g2_ns_per_block = t->g2_ns_per_block > 0 ? 0.9 * t->g2_ns_per_block + 0.1 * per : per;
}

/* Records of G2 taken least recently used first (eng_kvtier_foreach), their tokens copied. */
typedef struct g2recs {
    struct eng_tiers *t;
    eng_kvtier_rec_t *v; /* [want] */
    int32_t *tok;        /* [want * bt] */
    uint32_t n, want;
} g2recs_t;

static int g2_collect(void *ud, const eng_kvtier_rec_t *rec)
{
    g2recs_t *g = ud;
    if (g2_is_lent(g->t, &rec->name))
        return 0;
    int32_t *tok = g->tok + (size_t)g->n * g->t->bt;
    memcpy(tok, rec->tokens, (size_t)rec->n_tokens * sizeof *tok);
    g->v[g->n] = *rec;
    g->v[g->n].tokens = tok;
    return ++g->n == g->want;
}

/* Up to want G2 records, least recently used first; 0 or PC_ERR_NOMEM. Free with g2recs_free. */
static int g2recs_take(struct eng_tiers *t, uint32_t want, g2recs_t *g)
{
    *g = (g2recs_t){.t = t, .want = want};
    if (want == 0)
        return 0;
    g->v = pc_calloc(want, sizeof *g->v);
    g->tok = pc_calloc((size_t)want * t->bt, sizeof *g->tok);
    if (g->v == NULL || g->tok == NULL)
        return PC_ERR_NOMEM;
    (void)eng_kvtier_foreach(t->g2, g2_collect, g);
    return 0;
}

static void g2recs_free(g2recs_t *g)
{
    pc_free(g->v);
    pc_free(g->tok);
}

/* Moves G2 record r down a tier: its write to the disk is queued (unless the disk holds it),
 * then it leaves G2, reported as now in G3, or in no tier when the queue was full. Returns
 * false when G2 keeps it (lent to a copy in flight). */
static bool g2_spill(struct eng_tiers *t, const eng_kvtier_rec_t *r)
{
    const void *p;
    bool down = false;
    if (eng_kvtier_host_ref(t->g2, &r->name, r->tokens, r->n_tokens, &p) != 0)
        return false;
    down = g3_enqueue(t, r, 0, p);
    eng_kvtier_host_unref(t->g2, &r->name);
    t->g2_gone_tier = down ? ENG_TIER_G3 : ENG_TIER_NONE;
    bool gone = eng_kvtier_remove(t->g2, &r->name) == 0;
    t->g2_gone_tier = ENG_TIER_NONE;
    if (gone) {
        t->st.g2_evictions++;
        t->st.g2_spilled += down;
    }
    return gone;
}

/* Makes room in G2 for one more record by spilling its least recently used ones to the disk
 * (the store would otherwise evict them itself, and their KV would be lost). */
static void g2_make_room(struct eng_tiers *t)
{
    eng_kvtier_stats_t ks;
    eng_kvtier_stats(t->g2, &ks);
    uint64_t rb = eng_kvtier_record_bytes(t->g2, t->bt);
    if (ks.bytes + rb <= ks.max_bytes)
        return;
    uint32_t need = (uint32_t)((ks.bytes + rb - ks.max_bytes + rb - 1) / rb);
    g2recs_t g;
    /* Records the current read holds lent are skipped by the removal (busy): take a few more. */
    if (g2recs_take(t, need + 4, &g) == 0)
        for (uint32_t i = 0; i < g.n && need > 0; i++)
            need -= g2_spill(t, &g.v[i]);
    g2recs_free(&g);
}

/* A copy out of the pool is done: the block goes into G2 (or, when G2 cannot take it, down to
 * the disk, reported). */
static void g2_insert(struct eng_tiers *t, g2job_t *j)
{
    if (eng_kvtier_contains(t->g2, &j->rec.name) != 1)
        g2_make_room(t);
    int rc = eng_kvtier_put(t->g2, &j->rec, j->piece, t->block_bytes);
    if (rc >= 0) {
        pthread_mutex_lock(&t->map_mu);
        chain_add(t, &j->rec, HELD_G2);
        pthread_mutex_unlock(&t->map_mu);
        t->st.g2_write_blocks += rc == 0;
        return;
    }
    t->st.g2_write_dropped++;
    bool down = g3_enqueue(t, &j->rec, 0, j->piece);
    pthread_mutex_lock(&t->map_mu);
    event_push(t, &j->rec, pc_u64map_get(&t->chains, name_key(&j->rec.name)),
               down ? ENG_TIER_G3 : ENG_TIER_NONE);
    pthread_mutex_unlock(&t->map_mu);
}

/* Finishes what G2's copies allow, without waiting (wait: waits for every one): copies out of
 * the pool whose fence is done go into G2; records lent to copies into the pool whose fence is
 * done are given back (and the copies timed). The engine's thread. */
static void g2_poll(struct eng_tiers *t, bool wait)
{
    if (t->g2 == NULL)
        return;
    eng_backend_t *be = t->e->be;
    while (t->g2q_head != NULL) {
        g2job_t *j = t->g2q_head;
        int r = eng_backend_kv_fence(be, j->fence, wait);
        if (r == 0)
            break; /* fences complete in order: the later ones are in flight too */
        t->g2q_head = j->next;
        if (t->g2q_head == NULL)
            t->g2q_tail = NULL;
        if (r == 1) {
            g2_insert(t, j);
        } else {
            PC_LOG(PC_LOG_WARN, "tier", "copying a KV block to host memory: %s", pc_strerror(r));
            t->st.g2_write_dropped++;
            pthread_mutex_lock(&t->map_mu);
            event_push(t, &j->rec, NULL, ENG_TIER_NONE);
            pthread_mutex_unlock(&t->map_mu);
        }
        eng_host_slab_release(t->slab, j->piece, t->block_bytes);
        t->g2_staging--;
        pc_free(j);
    }
    size_t k = 0;
    for (size_t i = 0; i < t->n_lent; i++) {
        g2lend_t *l = &t->lent[i];
        int r = eng_backend_kv_fence(be, l->fence, wait);
        if (r == 0) {
            t->lent[k++] = *l;
            continue;
        }
        if (r < 0)
            PC_LOG(PC_LOG_ERROR, "tier", "copying a KV block from host memory: %s", pc_strerror(r));
        eng_kvtier_host_unref(t->g2, &l->name);
    }
    t->n_lent = k;
}

/* Starts copying pool block `block` (record rec) out to a staging piece for G2. Returns true
 * when the copy is under way or G2 holds the block already; false when there is no staging
 * piece or the copy cannot start (the caller writes the block to the disk instead). */
static bool g2_stage(struct eng_tiers *t, const eng_kvtier_rec_t *rec, uint32_t block)
{
    if (eng_kvtier_contains(t->g2, &rec->name) == 1)
        return true;
    if (t->g2_staging >= t->g2_stage_max)
        g2_poll(t, false);
    if (t->g2_staging >= t->g2_stage_max)
        return false;
    void *piece = eng_host_slab_alloc(t->slab, t->block_bytes);
    g2job_t *j =
        piece != NULL ? pc_malloc(sizeof *j + (size_t)rec->n_tokens * sizeof(int32_t)) : NULL;
    uint64_t fence = 0;
    if (j == NULL || eng_backend_kv_to_host(t->e->be, t->e->kv, &block, 1, piece, &fence) != 0) {
        pc_free(j);
        eng_host_slab_release(t->slab, piece, t->block_bytes);
        return false;
    }
    j->next = NULL;
    j->piece = piece;
    j->fence = fence;
    j->rec = *rec;
    memcpy(j->tokens, rec->tokens, (size_t)rec->n_tokens * sizeof(int32_t));
    j->rec.tokens = j->tokens;
    if (t->g2q_tail != NULL)
        t->g2q_tail->next = j;
    else
        t->g2q_head = j;
    t->g2q_tail = j;
    t->g2_staging++;
    return true;
}

/* The shutdown drain's second part: G2's blocks (memory, lost at exit) are written down to the
 * disk, most recently used first, within the drain's bounds. */
static void g2_drain(struct eng_tiers *t)
{
    g2_poll(t, true);
    eng_kvtier_stats_t ks;
    eng_kvtier_stats(t->g2, &ks);
    g2recs_t g;
    if (g2recs_take(t, (uint32_t)PC_MIN(ks.records, UINT32_MAX), &g) == 0) {
        for (uint32_t i = g.n; i-- > 0 && eng__tier_drain_more(t->e);) {
            const void *p;
            if (eng_kvtier_host_ref(t->g2, &g.v[i].name, g.v[i].tokens, g.v[i].n_tokens, &p) != 0)
                continue;
            (void)g3_enqueue(t, &g.v[i], 0, p);
            eng_kvtier_host_unref(t->g2, &g.v[i].name);
        }
    }
    g2recs_free(&g);
}

uint8_t eng__tier_write(eng_t *e, uint64_t ns, const int32_t *path, uint32_t depth,
                        const uint32_t *table, uint32_t table_first, bool filter)
{
    struct eng_tiers *t = e->tier;
    uint32_t bt = t->bt, end = depth / bt; /* whole blocks [table_first, end) */
    if (end <= table_first)
        return ENG_TIER_NONE;
    if (filter && depth < t->min_tokens) {
        t->st.write_filtered += end - table_first;
        return ENG_TIER_NONE;
    }
    if (chain_names(t, &t->wr, ns, path, end) != 0) {
        t->st.write_dropped += end - table_first;
        return ENG_TIER_NONE;
    }
    /* Evictions go to G2 first; write-through and the shutdown drain to the disk (durable). */
    bool to_g2 = t->g2 != NULL && filter && t->drain_until_ns == 0;
    bool all_g2 = to_g2, all_held = true;
    for (uint32_t i = table_first; i < end; i++) {
        eng_kvtier_rec_t rec = {.name = t->wr.v[i],
                                .ns = ns,
                                .block_index = i,
                                .n_tokens = bt,
                                .tokens = path + (size_t)i * bt};
        if (i > 0)
            rec.parent = t->wr.v[i - 1];
        uint32_t block = table[i - table_first];
        if (to_g2 && g2_stage(t, &rec, block))
            continue;
        if (to_g2)
            t->st.g2_write_dropped++;
        all_g2 = false;
        all_held = g3_enqueue(t, &rec, block, NULL) && all_held;
    }
    g2_poll(t, false); /* the copies already done (all of them on the CPU) go into G2 */
    return all_g2 ? ENG_TIER_G2 : all_held ? ENG_TIER_G3 : ENG_TIER_NONE;
}

/* ---- reads ---- */

/* The staged copy of block i (name nm) in a live ticket of ns, or NULL. */
static const void *staged(struct eng_tiers *t, uint64_t ns, uint32_t i, const name_t *nm)
{
    for (eng_tier_ticket_t *k = t->tickets; k != NULL; k = k->next) {
        if (k->borrowed || k->ns != ns || i < k->first || i >= k->first + k->n)
            continue;
        const tent_t *en = &k->ent[i - k->first];
        if (__atomic_load_n(&en->state, __ATOMIC_ACQUIRE) == ENT_OK &&
            memcmp(en->name.b, nm->b, sizeof nm->b) == 0)
            return en->buf;
    }
    return NULL;
}

enum { PL_NONE = 0, PL_STAGED = 1, PL_DISK = 2, PL_RECOMPUTE = 3, PL_G2 = 4 };

/* The cost model: true when loading `blocks` blocks from disk is expected to be faster than
 * recomputing their tokens (at the measured rate, times recompute_scale for their positions).
 * Unknown figures favour the load (a first load measures them). */
bool eng__tier_load_wins(double ns_per_block, double prefill_tps, uint32_t blocks, uint32_t tokens,
                         double recompute_scale)
{
    if (ns_per_block <= 0 || prefill_tps <= 0)
        return true;
    return ns_per_block * blocks < (double)tokens / prefill_tps * 1e9 * recompute_scale;
}

double eng__tier_attn_ratio(const eng_t *e)
{
    const eng_hparams_t *hp = &e->model->hp;
    double q = (double)hp->n_head * hp->head_dim, kv = (double)hp->n_head_kv * hp->head_dim;
    /* Per layer and token: the matrices (q, k, v, o, and the gated MLP's three) against QK and
     * PV over each earlier position. */
    double mats = (double)hp->n_embd * (2 * q + 2 * kv) + 3.0 * hp->n_embd * hp->n_ff;
    return mats > 0 ? 2 * q / mats : 0;
}

double eng__tier_recompute_scale(const eng_t *e, double pos)
{
    double r = eng__tier_attn_ratio(e);
    return (1 + r * pos) / (1 + r * e->prefill_pos);
}

/* Computes tokens[from, to) of s (a hole) with no logits. Returns true when done. */
static bool recompute(eng_t *e, eng_seq_t *s, const int32_t *tokens, uint32_t to)
{
    uint32_t from = s->kv.n_tokens;
    if (to <= from)
        return true;
    eng_batch_item_t it = {
        .seq = s, .tokens = tokens + from, .n_tokens = to - from, .logits = ENG_LOGITS_NONE};
    if (eng_forward(e, &it, 1, NULL) != 0)
        return false;
    s->origin.recomputed_tokens += to - from;
    e->tier->st.recomputed_tokens += to - from;
    return true;
}

/* Block i (its KV now in s's pool block i, from tier ENG_TIER_G2 or G3) is the sequence's:
 * its tokens and counts. */
static void commit_block(struct eng_tiers *t, eng_seq_t *s, const int32_t *tokens, uint32_t i,
                         uint8_t tier)
{
    uint32_t bt = t->bt;
    memcpy(s->tokens + (size_t)i * bt, tokens + (size_t)i * bt, (size_t)bt * sizeof *tokens);
    s->kv.n_tokens += bt;
    if (tier == ENG_TIER_G2) {
        s->origin.g2_tokens += bt;
        t->st.hit_blocks_g2++;
    } else {
        s->origin.g3_tokens += bt;
        t->st.hit_blocks_g3++;
    }
    t->st.recompute_avoided_tokens += bt;
}

/* Loads block i (plan how: staged src, or the disk) into pool block i of s, which holds i * bt
 * positions and either i blocks (a fresh one is added) or more (reserved ahead by the caller,
 * whose reads may still be landing in the later ones: nothing is trimmed here then). Returns
 * true when s then holds (i + 1) * bt. */
static bool load_into(eng_t *e, eng_seq_t *s, const int32_t *tokens, uint32_t i, const void *src)
{
    struct eng_tiers *t = e->tier;
    uint32_t bt = t->bt;
    PC_ASSERT(s->kv.n_tokens == i * bt && s->kv.n_blocks >= i);
    bool fresh = s->kv.n_blocks == i;
    if (eng__seq_tokens_reserve(s, (i + 1) * bt) != 0 ||
        (fresh && eng_kvseq_reserve(&s->kv, e->kv, bt) != 0))
        return false;
    uint32_t b = s->kv.blocks[i];
    const int32_t *tok = tokens + (size_t)i * bt;
    int rc;
    if (src != NULL) {
        rc = eng_kvpool_block_write(e->kv, b, src);
    } else if (eng_kvpool_has_storage(e->kv)) {
        rc = load_block(t, &t->rd.v[i], tok, eng_kvpool_kv(e->kv, b, 0, 0));
    } else {
        rc = load_block(t, &t->rd.v[i], tok, t->load_buf);
        if (rc == 0)
            rc = eng_kvpool_block_write(e->kv, b, t->load_buf);
    }
    if (rc != 0) {
        if (fresh)
            eng_kvseq_trim(&s->kv, e->kv);
        return false;
    }
    commit_block(t, s, tokens, i, ENG_TIER_G3);
    return true;
}

/* Copies block i from G2 (its record lent in t->rd.src[i], which this takes over) into pool
 * block i of s, as load_into. The record goes back once the copy's fence is done (g2_poll); the
 * backend orders the sequence's later steps after the copy. Returns true when s then holds
 * (i + 1) * bt. */
static bool g2_into(eng_t *e, eng_seq_t *s, const int32_t *tokens, uint32_t i)
{
    struct eng_tiers *t = e->tier;
    uint32_t bt = t->bt;
    PC_ASSERT(s->kv.n_tokens == i * bt && s->kv.n_blocks >= i);
    const void *src = t->rd.src[i];
    const name_t *nm = &t->rd.v[i];
    t->rd.src[i] = NULL;
    bool fresh = s->kv.n_blocks == i;
    if (pc_array_reserve(&t->lent, &t->cap_lent, t->n_lent + 1) != 0 ||
        eng__seq_tokens_reserve(s, (i + 1) * bt) != 0 ||
        (fresh && eng_kvseq_reserve(&s->kv, e->kv, bt) != 0)) {
        eng_kvtier_host_unref(t->g2, nm);
        return false;
    }
    uint32_t b = s->kv.blocks[i];
    uint64_t fence, t0 = pc_time_mono_ns();
    if (eng_backend_kv_from_host(e->be, e->kv, &b, 1, src, &fence) != 0) {
        eng_kvtier_host_unref(t->g2, nm);
        if (fresh)
            eng_kvseq_trim(&s->kv, e->kv);
        return false;
    }
    /* A copy done on return (the CPU backend's memcpy) is timed now; those on a copy stream
     * together at the end of the start (g2_batch_timed). */
    if (fence == 0) {
        g2_timed(t, pc_time_mono_ns() - t0, 1);
    } else {
        if (t->g2_batch_n++ == 0)
            t->g2_batch_t0 = t0;
        t->g2_batch_fence = fence;
    }
    t->lent[t->n_lent++] = (g2lend_t){.name = *nm, .fence = fence};
    t->st.g2_load_blocks++;
    t->st.g2_load_bytes += t->block_bytes;
    commit_block(t, s, tokens, i, ENG_TIER_G2);
    return true;
}

/* A start's copies on a copy stream are timed only when they are done by the end of the start
 * (from the first one's enqueue: an upper bound); a fence seen done later, after other steps,
 * would time those steps instead, so such a batch is not timed, and a G2 never timed counts as
 * unknown in the cost model, which then loads. */
static void g2_batch_timed(struct eng_tiers *t)
{
    if (t->g2_batch_n > 0 && eng_backend_kv_fence(t->e->be, t->g2_batch_fence, false) == 1)
        g2_timed(t, pc_time_mono_ns() - t->g2_batch_t0, t->g2_batch_n);
    t->g2_batch_n = 0;
}

/* Waits for entry en of ticket k to be read; returns its state (ENT_OK or ENT_FAIL). */
static int ent_wait(struct eng_tiers *t, const tent_t *en)
{
    pthread_mutex_lock(&t->mu);
    int st;
    while ((st = __atomic_load_n(&en->state, __ATOMIC_ACQUIRE)) == ENT_PENDING)
        pthread_cond_wait(&t->cv_done, &t->mu);
    pthread_mutex_unlock(&t->mu);
    return st;
}

/* A ticket reading, on the I/O threads, the blocks i in [kb, m) of t->rd whose plan byte is
 * `want` (t->rd holds the names). into NULL: into staging buffers of its own; else block i is
 * read straight into pool block into[i] (a sequence's table, reserved through m). *out NULL
 * when there are none. Returns 0, PC_ERR_BUSY (the staging budget) or PC_ERR_NOMEM. */
static int ticket_new(struct eng_tiers *t, uint64_t ns, const int32_t *tokens, uint32_t kb,
                      uint32_t m, uint8_t want, const uint32_t *into, eng_tier_ticket_t **out)
{
    *out = NULL;
    uint32_t bt = t->bt, first = UINT32_MAX, last = 0, count = 0;
    for (uint32_t i = kb; i < m; i++) {
        if (t->rd.plan[i] == want) {
            first = PC_MIN(first, i);
            last = i;
            count++;
        }
    }
    if (count == 0)
        return 0;
    uint64_t need = into != NULL ? 0 : (uint64_t)count * t->block_bytes;
    pthread_mutex_lock(&t->mu);
    bool room = t->staged_bytes + need <= t->queue_bytes;
    if (room)
        t->staged_bytes += need; /* reserved now, so two tickets never overshoot */
    pthread_mutex_unlock(&t->mu);
    if (!room)
        return PC_ERR_BUSY;
    uint32_t nb = last - first + 1;
    eng_tier_ticket_t *k = pc_calloc(1, sizeof *k + (size_t)nb * sizeof(tent_t));
    int32_t *tok = pc_malloc((size_t)(last + 1) * bt * sizeof *tok);
    int rc = k == NULL || tok == NULL ? PC_ERR_NOMEM : 0;
    for (uint32_t i = 0; rc == 0 && i < nb; i++) {
        tent_t *en = &k->ent[i];
        en->name = t->rd.v[first + i];
        en->state = t->rd.plan[first + i] == want ? ENT_PENDING : ENT_SKIP;
        if (en->state != ENT_PENDING)
            continue;
        if (into != NULL)
            en->buf = eng_kvpool_kv(t->e->kv, into[first + i], 0, 0);
        else if ((en->buf = pc_malloc(t->block_bytes)) == NULL)
            rc = PC_ERR_NOMEM;
    }
    if (rc != 0) {
        for (uint32_t i = 0; k != NULL && into == NULL && i < nb; i++)
            pc_free(k->ent[i].buf);
        pc_free(k);
        pc_free(tok);
        pthread_mutex_lock(&t->mu);
        t->staged_bytes -= need;
        pthread_mutex_unlock(&t->mu);
        return rc;
    }
    memcpy(tok, tokens, (size_t)(last + 1) * bt * sizeof *tok);
    k->ns = ns;
    k->first = first;
    k->n = nb;
    k->tokens = tok;
    k->pending = (int)count;
    k->borrowed = into != NULL;
    k->t0_ns = pc_time_mono_ns();
    k->next = t->tickets;
    if (t->tickets != NULL)
        t->tickets->prev = k;
    t->tickets = k;
    pthread_mutex_lock(&t->mu);
    k->queued = true;
    if (t->rq_tail != NULL)
        t->rq_tail->rnext = k;
    else
        t->rq_head = k;
    t->rq_tail = k;
    pthread_cond_broadcast(&t->cv_work);
    pthread_mutex_unlock(&t->mu);
    *out = k;
    return 0;
}

void eng__tier_continue(eng_t *e, eng_seq_t *s, uint64_t ns, const int32_t *tokens, uint32_t n)
{
    struct eng_tiers *t = e->tier;
    uint32_t bt = t->bt, m = (n - 1) / bt; /* whole blocks the sequence may reuse */
    uint32_t kb = s->kv.n_tokens / bt;     /* the first block past the G1 match's whole ones */
    if (kb >= m || chain_names(t, &t->rd, ns, tokens, m) != 0)
        return;
    g2_poll(t, false); /* copies into G2 that are done by now can serve this read */
    /* What each block past the match would come from (staged, G2, the disk); last: the last one
     * a tier holds. */
    uint32_t last = UINT32_MAX;
    for (uint32_t i = kb; i < m; i++) {
        const name_t *nm = &t->rd.v[i];
        t->rd.src[i] = NULL;
        t->rd.plan[i] = staged(t, ns, i, nm) != NULL                           ? PL_STAGED
                        : t->g2 != NULL && eng_kvtier_contains(t->g2, nm) == 1 ? PL_G2
                        : eng_kvtier_contains(t->g3, nm) == 1                  ? PL_DISK
                                                                               : PL_NONE;
        if (t->rd.plan[i] != PL_NONE)
            last = i;
        else
            t->st.miss_blocks++;
    }
    if (last == UINT32_MAX)
        return;
    /* The cost model, per run of disk or G2 blocks: recompute the run when that is cheaper. */
    pthread_mutex_lock(&t->mu);
    double npb = t->ns_per_block;
    pthread_mutex_unlock(&t->mu);
    for (uint32_t i = kb; i <= last;) {
        uint8_t kind = t->rd.plan[i];
        if (kind != PL_DISK && kind != PL_G2) {
            i++;
            continue;
        }
        uint32_t j = i;
        while (j <= last && t->rd.plan[j] == kind)
            j++;
        /* The I/O threads read a disk run's blocks in parallel; G2's copies run one after
         * another. */
        uint32_t rounds = kind == PL_G2 ? j - i : (j - i + t->n_threads - 1) / t->n_threads;
        if (!e->p.tier.load_always &&
            !eng__tier_load_wins(kind == PL_G2 ? t->g2_ns_per_block : npb, e->prefill_tps, rounds,
                                 (j - i) * bt,
                                 eng__tier_recompute_scale(e, (double)(i + j) * bt / 2)))
            memset(t->rd.plan + i, PL_RECOMPUTE, j - i);
        i = j;
    }
    /* G2's blocks are lent now, so that the evictions this read causes cannot drop them (one
     * gone meanwhile comes from the disk, or joins a hole). */
    for (uint32_t i = kb; i <= last; i++) {
        if (t->rd.plan[i] != PL_G2 ||
            eng_kvtier_host_ref(t->g2, &t->rd.v[i], tokens + (size_t)i * bt, bt, &t->rd.src[i]) ==
                0)
            continue;
        t->rd.src[i] = NULL;
        t->rd.plan[i] = eng_kvtier_contains(t->g3, &t->rd.v[i]) == 1 ? PL_DISK : PL_NONE;
    }
    while (last >= kb && last != UINT32_MAX && t->rd.plan[last] != PL_STAGED &&
           t->rd.plan[last] != PL_DISK && t->rd.plan[last] != PL_G2)
        last = last > kb ? last - 1 : UINT32_MAX;
    if (last == UINT32_MAX)
        return;
    /* The disk blocks are read by the I/O threads in parallel. On a pool with host storage they
     * land straight in the sequence's blocks (reserved here through the last one) while this
     * thread recomputes the holes before them; otherwise into staging buffers, then copied
     * (without staging room, or reserving fails: read here, one by one). */
    uint32_t first = kb;
    while (t->rd.plan[first] != PL_STAGED && t->rd.plan[first] != PL_DISK &&
           t->rd.plan[first] != PL_G2)
        first++;
    if (s->kv.n_tokens > first * bt) {
        /* The G1 match ends inside block `first`, which a tier holds whole: take that instead. */
        s->origin.g1_tokens = first * bt;
        s->kv.n_tokens = first * bt;
        eng_kvseq_trim(&s->kv, e->kv);
    }
    eng_tier_ticket_t *k = NULL;
    uint32_t end = (last + 1) * bt;
    if (eng_kvpool_has_storage(e->kv) && eng__seq_tokens_reserve(s, end) == 0 &&
        eng_kvseq_reserve(&s->kv, e->kv, end - s->kv.n_tokens) == 0) {
        (void)ticket_new(t, ns, tokens, kb, last + 1, PL_DISK, s->kv.blocks, &k);
    } else if (ticket_new(t, ns, tokens, kb, last + 1, PL_DISK, NULL, &k) == 0 && k != NULL) {
        pthread_mutex_lock(&t->mu);
        while (!eng_tier_ready(k))
            pthread_cond_wait(&t->cv_done, &t->mu);
        pthread_mutex_unlock(&t->mu);
        for (uint32_t i = kb; i <= last; i++)
            if (t->rd.plan[i] == PL_DISK)
                t->rd.plan[i] = PL_STAGED;
    }
    /* Holes are recomputed (attending to everything before them), loads fill the blocks; a
     * failed load becomes part of the next hole, and whatever fails last ends the start: the
     * caller computes the rest. */
    for (uint32_t i = kb; i <= last; i++) {
        if (t->rd.plan[i] != PL_STAGED && t->rd.plan[i] != PL_DISK && t->rd.plan[i] != PL_G2)
            continue;
        if (!recompute(e, s, tokens, i * bt))
            break;
        if (t->rd.plan[i] == PL_G2) {
            /* A copy that cannot start is tried from the disk (the block joins the next hole
             * when the disk does not hold it). */
            if (!g2_into(e, s, tokens, i) && !load_into(e, s, tokens, i, NULL) &&
                s->kv.n_tokens != i * bt)
                break;
            continue;
        }
        if (k != NULL && k->borrowed && t->rd.plan[i] == PL_DISK) {
            /* Read into pool block i by an I/O thread: wait for it; a failed read is tried
             * once more here (a bad record is gone by now: the block joins the next hole). */
            if (ent_wait(t, &k->ent[i - k->first]) == ENT_OK)
                commit_block(t, s, tokens, i, ENG_TIER_G3);
            else if (!load_into(e, s, tokens, i, NULL) && s->kv.n_tokens != i * bt)
                break;
            continue;
        }
        /* A staged block whose read failed is tried once more from the disk. */
        const void *src = t->rd.plan[i] == PL_STAGED ? staged(t, ns, i, &t->rd.v[i]) : NULL;
        if (!load_into(e, s, tokens, i, src) && s->kv.n_tokens != i * bt)
            break;
    }
    /* G2 records lent for copies that never started (the start ended early) go back. */
    for (uint32_t i = kb; i <= last; i++)
        if (t->rd.plan[i] == PL_G2 && t->rd.src[i] != NULL) {
            eng_kvtier_host_unref(t->g2, &t->rd.v[i]);
            t->rd.src[i] = NULL;
        }
    /* Reads still landing in reserved blocks finish before those blocks are given back. */
    eng_tier_ticket_free(e, k);
    eng_kvseq_trim(&s->kv, e->kv);
    g2_batch_timed(t);
    g2_poll(t, false); /* copies done on return (the CPU backend's) give their records back */
}

/* ---- prefetch tickets ---- */

int eng_tier_prefetch(eng_t *e, uint64_t ns, const int32_t *tokens, uint32_t n,
                      eng_tier_ticket_t **out)
{
    *out = NULL;
    struct eng_tiers *t = e->tier;
    if (t == NULL || n < 2)
        return 0;
    uint32_t m = (n - 1) / t->bt;
    uint32_t kb = eng__prefix_match_len(e, ns, tokens, n - 1) / t->bt;
    if (kb >= m)
        return 0;
    int rc = chain_names(t, &t->rd, ns, tokens, m);
    if (rc != 0)
        return rc;
    /* Blocks G2 holds are in host memory already: only the disk's are read ahead. */
    for (uint32_t i = kb; i < m; i++)
        t->rd.plan[i] = eng_kvtier_contains(t->g3, &t->rd.v[i]) == 1 &&
                                staged(t, ns, i, &t->rd.v[i]) == NULL &&
                                (t->g2 == NULL || eng_kvtier_contains(t->g2, &t->rd.v[i]) != 1)
                            ? PL_DISK
                            : PL_NONE;
    return ticket_new(t, ns, tokens, kb, m, PL_DISK, NULL, out);
}

bool eng_tier_ready(const eng_tier_ticket_t *k)
{
    return k == NULL || __atomic_load_n(&k->pending, __ATOMIC_ACQUIRE) == 0;
}

void eng_tier_ticket_free(eng_t *e, eng_tier_ticket_t *k)
{
    if (k == NULL)
        return;
    struct eng_tiers *t = e->tier;
    pthread_mutex_lock(&t->mu);
    if (k->queued) { /* not started: out of the read queue */
        eng_tier_ticket_t **pp = &t->rq_head, *prev = NULL;
        while (*pp != k) {
            prev = *pp;
            pp = &(*pp)->rnext;
        }
        *pp = k->rnext;
        if (t->rq_tail == k)
            t->rq_tail = prev;
        k->queued = false;
    }
    while (k->active > 0)
        pthread_cond_wait(&t->cv_done, &t->mu);
    uint64_t bytes = 0;
    for (uint32_t i = 0; !k->borrowed && i < k->n; i++)
        if (k->ent[i].buf != NULL) {
            bytes += t->block_bytes;
            pc_free(k->ent[i].buf);
        }
    t->staged_bytes -= bytes;
    pthread_mutex_unlock(&t->mu);
    if (k->prev != NULL)
        k->prev->next = k->next;
    else
        t->tickets = k->next;
    if (k->next != NULL)
        k->next->prev = k->prev;
    pc_free(k->tokens);
    pc_free(k);
}
