/*
 * tier.c — the KV tiers below the pool (see tier.h): write-back and write-through through a
 * bounded staging queue and the engine's I/O thread, the continuation of a G1 match into the
 * disk tier (loads, exact hole recompute, the load-vs-recompute cost model), prefetch tickets,
 * and what the tiers hold, over the tier store (kvtier.h).
 *
 * Threads. The engine's thread calls everything here; the I/O thread runs io_main. They share,
 * under t->mu: the write queue and the in-flight names (so a block is queued once), the read
 * queue of tickets, the staging byte count and the counters the I/O thread updates. The store
 * has its own lock; the chain map (t->chains: what the store holds, for events and listings)
 * has t->map_mu, taken by the store's eviction callback on whatever thread evicts, so it never
 * nests inside t->mu.
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
    uint8_t *plan; /* [cap] */
} names_t;

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
    bool queued;       /* in the read queue, not yet taken */
    tent_t ent[];      /* [n] */
};

/* What the store holds, by name: one per record (built from the store's index at open, kept by
 * puts and the store's eviction callback). */
typedef struct chain {
    name_t name, parent;
    uint64_t ns;
    uint32_t block_index;
    uint32_t n_tokens;
    bool has_child; /* scratch of eng_tier_prefixes */
    int32_t tokens[];
} chain_t;

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
    pthread_t thread;
    bool thread_started, stop;
    wjob_t *wq_head, *wq_tail; /* writes, FIFO */
    bool writing;              /* the I/O thread holds a write job */
    eng_tier_ticket_t *rq_head, *rq_tail;
    eng_tier_ticket_t *reading; /* the ticket the I/O thread reads now */
    eng_tier_ticket_t *tickets; /* live tickets */
    pc_u64map_t inflight;       /* name key -> wjob_t queued or being written */
    uint64_t staged_bytes;
    uint64_t load_blocks, load_bytes, load_ns; /* by this file's reads (gets) */
    double ns_per_block;                       /* EWMA of a disk load's time per block */

    pthread_mutex_t map_mu;
    pc_u64map_t chains; /* name key -> chain_t */
    tev_t *ev_head, *ev_tail;

    eng_tier_stats_t st; /* this file's counters (store's are merged in eng_tier_stats) */
};

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

/* Adds a record to the chain map (map_mu held). Out of memory only loses the listing. */
static void chain_add(struct eng_tiers *t, const eng_kvtier_rec_t *rec)
{
    uint64_t k = name_key(&rec->name);
    chain_t *c = pc_u64map_get(&t->chains, k);
    if (c != NULL)
        return;
    c = pc_malloc(sizeof *c + (size_t)rec->n_tokens * sizeof(int32_t));
    if (c == NULL)
        return;
    *c = (chain_t){.name = rec->name,
                   .parent = rec->parent,
                   .ns = rec->ns,
                   .block_index = rec->block_index,
                   .n_tokens = rec->n_tokens};
    memcpy(c->tokens, rec->tokens, (size_t)rec->n_tokens * sizeof(int32_t));
    if (pc_u64map_put(&t->chains, k, c) != 0)
        pc_free(c);
}

/* The path of chain c from block 0 into out[(c->block_index + 1) * bt] (map_mu held). Returns
 * true when every ancestor is still known. */
static bool chain_path(struct eng_tiers *t, const chain_t *c, int32_t *out)
{
    for (;;) {
        memcpy(out + (size_t)c->block_index * t->bt, c->tokens, (size_t)t->bt * sizeof(int32_t));
        if (c->block_index == 0)
            return true;
        const chain_t *p = pc_u64map_get(&t->chains, name_key(&c->parent));
        if (p == NULL || p->block_index + 1 != c->block_index ||
            memcmp(p->name.b, c->parent.b, sizeof p->name.b) != 0)
            return false;
        c = p;
    }
}

/* The store dropped a record (any thread, the store's lock held): forget it and queue the event
 * (gone from every tier: the disk is the lowest). */
static void on_store_evict(void *ud, const eng_kvtier_rec_t *rec, int reason)
{
    (void)reason;
    struct eng_tiers *t = ud;
    pthread_mutex_lock(&t->map_mu);
    uint64_t k = name_key(&rec->name);
    chain_t *c = pc_u64map_get(&t->chains, k);
    uint32_t n = (rec->block_index + 1) * t->bt;
    tev_t *ev = pc_malloc(sizeof *ev + (size_t)n * sizeof(int32_t));
    if (ev != NULL) {
        *ev = (tev_t){.ns = rec->ns, .n_tokens = n, .tier = ENG_TIER_NONE};
        ev->has_path = c != NULL && chain_path(t, c, ev->tokens);
        if (t->ev_tail != NULL)
            t->ev_tail->next = ev;
        else
            t->ev_head = ev;
        t->ev_tail = ev;
    }
    if (c != NULL) {
        pc_u64map_del(&t->chains, k);
        pc_free(c);
    }
    pthread_mutex_unlock(&t->map_mu);
}

static int on_store_rec(void *ud, const eng_kvtier_rec_t *rec)
{
    chain_add(ud, rec);
    return 0;
}

uint32_t eng_tier_poll(eng_t *e, eng_tier_event_fn fn, void *ud)
{
    struct eng_tiers *t = e->tier;
    if (t == NULL)
        return 0;
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
    for (size_t i = pc_u64map_next(m, 0); i < m->cap; i = pc_u64map_next(m, i + 1)) {
        const chain_t *c = m->slots[i].value;
        if (c->block_index == 0)
            continue;
        chain_t *p = pc_u64map_get(m, name_key(&c->parent));
        if (p != NULL && memcmp(p->name.b, c->parent.b, sizeof p->name.b) == 0)
            p->has_child = true;
    }
    for (size_t i = pc_u64map_next(m, 0); i < m->cap; i = pc_u64map_next(m, i + 1)) {
        const chain_t *c = m->slots[i].value;
        if (c->has_child)
            continue;
        uint32_t len = (c->block_index + 1) * t->bt;
        if (pc_array_reserve(&path, &path_cap, len) != 0) {
            rc = PC_ERR_NOMEM;
            break;
        }
        /* A chain with a missing ancestor (a hole) is listed from block 0 to the hole. */
        if (!chain_path(t, c, path))
            continue;
        eng_tier_prefix_t out = {.ns = c->ns, .n_tokens = len, .tier = ENG_TIER_G3, .tokens = path};
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
        chain_add(t, &j->rec);
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
    t->writing = false;
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

static void io_read(struct eng_tiers *t, eng_tier_ticket_t *k)
{
    for (uint32_t i = 0; i < k->n; i++) {
        tent_t *en = &k->ent[i];
        if (en->state != ENT_PENDING)
            continue;
        const int32_t *tok = k->tokens + (size_t)(k->first + i) * t->bt;
        en->state = load_block(t, &en->name, tok, en->buf) == 0 ? ENT_OK : ENT_FAIL;
        __atomic_sub_fetch(&k->pending, 1, __ATOMIC_RELEASE);
    }
}

static void *io_main(void *arg)
{
    struct eng_tiers *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        if (t->rq_head != NULL) { /* reads first: a request waits on them */
            eng_tier_ticket_t *k = t->rq_head;
            t->rq_head = k->rnext;
            if (t->rq_head == NULL)
                t->rq_tail = NULL;
            k->queued = false;
            t->reading = k;
            pthread_mutex_unlock(&t->mu);
            io_read(t, k);
            pthread_mutex_lock(&t->mu);
            t->reading = NULL;
            pthread_cond_broadcast(&t->cv_done);
            continue;
        }
        if (t->wq_head != NULL) {
            wjob_t *j = t->wq_head;
            t->wq_head = j->next;
            if (t->wq_head == NULL)
                t->wq_tail = NULL;
            t->writing = true;
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
    rc = eng_kvtier_foreach(t->g3, on_store_rec, t);
    pthread_mutex_unlock(&t->map_mu);
    eng_kvtier_set_evict_cb(t->g3, on_store_evict, t);
    if (pthread_create(&t->thread, NULL, io_main, t) != 0) {
        rc = PC_ERR_NOMEM;
        snprintf(err, err_len, "engine: cannot start the tier I/O thread");
        goto fail;
    }
    t->thread_started = true;
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
    if (t->thread_started) {
        pthread_mutex_lock(&t->mu);
        t->stop = true;
        pthread_cond_signal(&t->cv_work);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->thread, NULL);
    }
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
    pc_free(t->wr.v);
    pc_free(t->wr.plan);
    pc_free(t);
}

struct eng_kvtier *eng__tier_store(eng_t *e)
{
    return e->tier != NULL ? e->tier->g3 : NULL;
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

bool eng_tier_enabled(const eng_t *e)
{
    return e->tier != NULL;
}

void eng_tier_flush(eng_t *e)
{
    struct eng_tiers *t = e->tier;
    if (t == NULL)
        return;
    pthread_mutex_lock(&t->mu);
    while (t->wq_head != NULL || t->writing)
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
    out->load_bytes_per_s =
        t->ns_per_block > 0 ? (double)t->block_bytes * 1e9 / t->ns_per_block : 0;
    pthread_mutex_unlock(&t->mu);
    out->g3_bytes = ks.bytes;
    out->g3_blocks = ks.records;
    out->g3_max_bytes = ks.max_bytes;
    out->evictions = ks.evictions;
    out->corrupt = ks.corrupt;
    out->prefill_tokens_per_s = e->prefill_tps;
}

/* ---- writes ---- */

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
    bool all_held = true;
    for (uint32_t i = table_first; i < end; i++) {
        const name_t *nm = &t->wr.v[i];
        if (eng_kvtier_contains(t->g3, nm) == 1)
            continue;
        pthread_mutex_lock(&t->mu);
        bool queued = pc_u64map_get(&t->inflight, name_key(nm)) != NULL;
        bool room = t->staged_bytes + t->block_bytes <= t->queue_bytes;
        pthread_mutex_unlock(&t->mu);
        if (queued)
            continue;
        wjob_t *j = NULL;
        void *payload = NULL;
        if (room) {
            j = pc_malloc(sizeof *j + (size_t)bt * sizeof(int32_t));
            payload = pc_malloc(t->block_bytes);
        }
        if (j == NULL || payload == NULL ||
            eng_kvpool_block_read(e->kv, table[i - table_first], payload) != 0) {
            pc_free(j);
            pc_free(payload);
            t->st.write_dropped++;
            all_held = false;
            continue;
        }
        j->next = NULL;
        j->payload = payload;
        memcpy(j->tokens, path + (size_t)i * bt, (size_t)bt * sizeof(int32_t));
        j->rec = (eng_kvtier_rec_t){
            .name = *nm, .ns = ns, .block_index = i, .n_tokens = bt, .tokens = j->tokens};
        if (i > 0)
            j->rec.parent = t->wr.v[i - 1];
        pthread_mutex_lock(&t->mu);
        if (pc_u64map_put(&t->inflight, name_key(nm), j) != 0) {
            pthread_mutex_unlock(&t->mu);
            pc_free(payload);
            pc_free(j);
            t->st.write_dropped++;
            all_held = false;
            continue;
        }
        t->staged_bytes += t->block_bytes;
        if (t->wq_tail != NULL)
            t->wq_tail->next = j;
        else
            t->wq_head = j;
        t->wq_tail = j;
        pthread_cond_signal(&t->cv_work);
        pthread_mutex_unlock(&t->mu);
    }
    return all_held ? ENG_TIER_G3 : ENG_TIER_NONE;
}

/* ---- reads ---- */

/* The staged copy of block i (name nm) in a live ticket of ns, or NULL. */
static const void *staged(struct eng_tiers *t, uint64_t ns, uint32_t i, const name_t *nm)
{
    for (eng_tier_ticket_t *k = t->tickets; k != NULL; k = k->next) {
        if (k->ns != ns || i < k->first || i >= k->first + k->n)
            continue;
        const tent_t *en = &k->ent[i - k->first];
        if (__atomic_load_n(&en->state, __ATOMIC_ACQUIRE) == ENT_OK &&
            memcmp(en->name.b, nm->b, sizeof nm->b) == 0)
            return en->buf;
    }
    return NULL;
}

enum { PL_NONE = 0, PL_STAGED = 1, PL_DISK = 2, PL_RECOMPUTE = 3 };

/* The cost model: true when loading `blocks` blocks from disk is expected to be faster than
 * recomputing their tokens. Unknown figures favour the load (a first load measures them). */
bool eng__tier_load_wins(double ns_per_block, double prefill_tps, uint32_t blocks, uint32_t tokens)
{
    if (ns_per_block <= 0 || prefill_tps <= 0)
        return true;
    return ns_per_block * blocks < (double)tokens / prefill_tps * 1e9;
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

/* Loads block i (plan how: staged src, or the disk) into a fresh pool block at the end of s,
 * which holds i * bt positions. Returns true when s then holds (i + 1) * bt. */
static bool load_into(eng_t *e, eng_seq_t *s, const int32_t *tokens, uint32_t i, const void *src)
{
    struct eng_tiers *t = e->tier;
    uint32_t bt = t->bt;
    PC_ASSERT(s->kv.n_tokens == i * bt && s->kv.n_blocks == i);
    if (eng__seq_tokens_reserve(s, (i + 1) * bt) != 0 || eng_kvseq_reserve(&s->kv, e->kv, bt) != 0)
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
        eng_kvseq_trim(&s->kv, e->kv);
        return false;
    }
    memcpy(s->tokens + (size_t)i * bt, tok, (size_t)bt * sizeof *tok);
    s->kv.n_tokens += bt;
    s->origin.g3_tokens += bt;
    t->st.hit_blocks_g3++;
    t->st.recompute_avoided_tokens += bt;
    return true;
}

void eng__tier_continue(eng_t *e, eng_seq_t *s, uint64_t ns, const int32_t *tokens, uint32_t n)
{
    struct eng_tiers *t = e->tier;
    uint32_t bt = t->bt, m = (n - 1) / bt; /* whole blocks the sequence may reuse */
    uint32_t kb = s->kv.n_tokens / bt;     /* the first block past the G1 match's whole ones */
    if (kb >= m || chain_names(t, &t->rd, ns, tokens, m) != 0)
        return;
    /* What each block past the match would come from; last: the last one a tier holds. */
    uint32_t last = UINT32_MAX;
    for (uint32_t i = kb; i < m; i++) {
        t->rd.plan[i] = staged(t, ns, i, &t->rd.v[i]) != NULL          ? PL_STAGED
                        : eng_kvtier_contains(t->g3, &t->rd.v[i]) == 1 ? PL_DISK
                                                                       : PL_NONE;
        if (t->rd.plan[i] != PL_NONE)
            last = i;
        else
            t->st.miss_blocks++;
    }
    if (last == UINT32_MAX)
        return;
    /* The cost model, per run of disk blocks: recompute the run when that is cheaper. */
    pthread_mutex_lock(&t->mu);
    double npb = t->ns_per_block;
    pthread_mutex_unlock(&t->mu);
    for (uint32_t i = kb; i <= last;) {
        if (t->rd.plan[i] != PL_DISK) {
            i++;
            continue;
        }
        uint32_t j = i;
        while (j <= last && t->rd.plan[j] == PL_DISK)
            j++;
        if (!e->p.tier.load_always &&
            !eng__tier_load_wins(npb, e->prefill_tps, j - i, (j - i) * bt))
            memset(t->rd.plan + i, PL_RECOMPUTE, j - i);
        i = j;
    }
    while (last >= kb && last != UINT32_MAX && t->rd.plan[last] != PL_STAGED &&
           t->rd.plan[last] != PL_DISK)
        last = last > kb ? last - 1 : UINT32_MAX;
    if (last == UINT32_MAX)
        return;
    /* Holes are recomputed (attending to everything before them), loads fill fresh blocks; a
     * failed load becomes part of the next hole, and whatever fails last ends the start: the
     * caller computes the rest. */
    for (uint32_t i = kb; i <= last; i++) {
        if (t->rd.plan[i] != PL_STAGED && t->rd.plan[i] != PL_DISK)
            continue;
        if (s->kv.n_tokens > i * bt) {
            /* The G1 match ends inside block i, which a tier holds whole: take that instead. */
            s->origin.g1_tokens = i * bt;
            s->kv.n_tokens = i * bt;
            eng_kvseq_trim(&s->kv, e->kv);
        }
        if (!recompute(e, s, tokens, i * bt))
            return;
        const void *src = t->rd.plan[i] == PL_STAGED ? staged(t, ns, i, &t->rd.v[i]) : NULL;
        if (!load_into(e, s, tokens, i, src) && s->kv.n_tokens != i * bt)
            return;
    }
}

/* ---- prefetch tickets ---- */

int eng_tier_prefetch(eng_t *e, uint64_t ns, const int32_t *tokens, uint32_t n,
                      eng_tier_ticket_t **out)
{
    *out = NULL;
    struct eng_tiers *t = e->tier;
    if (t == NULL || n < 2)
        return 0;
    uint32_t bt = t->bt, m = (n - 1) / bt;
    uint32_t kb = eng__prefix_match_len(e, ns, tokens, n - 1) / bt;
    if (kb >= m)
        return 0;
    int rc = chain_names(t, &t->rd, ns, tokens, m);
    if (rc != 0)
        return rc;
    uint32_t first = UINT32_MAX, last = 0, count = 0;
    for (uint32_t i = kb; i < m; i++) {
        t->rd.plan[i] =
            eng_kvtier_contains(t->g3, &t->rd.v[i]) == 1 && staged(t, ns, i, &t->rd.v[i]) == NULL;
        if (t->rd.plan[i]) {
            first = PC_MIN(first, i);
            last = i;
            count++;
        }
    }
    if (count == 0)
        return 0;
    uint64_t need = (uint64_t)count * t->block_bytes;
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
    rc = k == NULL || tok == NULL ? PC_ERR_NOMEM : 0;
    for (uint32_t i = 0; rc == 0 && i < nb; i++) {
        tent_t *en = &k->ent[i];
        en->name = t->rd.v[first + i];
        en->state = t->rd.plan[first + i] ? ENT_PENDING : ENT_SKIP;
        if (en->state == ENT_PENDING && (en->buf = pc_malloc(t->block_bytes)) == NULL)
            rc = PC_ERR_NOMEM;
    }
    if (rc != 0) {
        for (uint32_t i = 0; k != NULL && i < nb; i++)
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
    pthread_cond_signal(&t->cv_work);
    pthread_mutex_unlock(&t->mu);
    *out = k;
    return 0;
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
    while (t->reading == k)
        pthread_cond_wait(&t->cv_done, &t->mu);
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < k->n; i++)
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
