/*
 * test_kvpool.c — the paged KV pool: accounting after random mixes of sequences, shared
 * prefixes, copy-on-write, releases and evictions, checked against what the owners hold; and
 * contents: every sequence reads back exactly what it wrote, whatever was shared or copied.
 *
 * Each position's KV is stamped with a value (sequence tag, position) in every layer and head,
 * K and V, so a block shared by mistake, a missed copy-on-write or a copy of the wrong length
 * shows up as a wrong stamp.
 */
#include <stdlib.h>

#include "kvpool.h"
#include "pc_alloc.h"
#include "pc_err.h"
#include "pc_test.h"

enum { N_LAYER = 2, N_HEAD = 2, HEAD_DIM = 4 };

static float stamp(uint32_t tag, uint32_t pos, uint32_t l, uint32_t h, uint32_t d, int v)
{
    return (float)(tag * 100000 + pos * 10 + (l * 7 + h * 3 + d + v) % 10);
}

static void write_pos(eng_kvpool_t *pool, const eng_kvseq_t *s, uint32_t pos, uint32_t tag)
{
    uint32_t bt = eng_kvpool_block_tokens(pool);
    for (uint32_t l = 0; l < N_LAYER; l++)
        for (uint32_t h = 0; h < N_HEAD; h++) {
            float *kv = eng_kvpool_kv(pool, s->blocks[pos / bt], l, h);
            for (uint32_t d = 0; d < HEAD_DIM; d++) {
                kv[d * bt + pos % bt] = stamp(tag, pos, l, h, d, 0);
                kv[HEAD_DIM * bt + (pos % bt) * HEAD_DIM + d] = stamp(tag, pos, l, h, d, 1);
            }
        }
}

static int read_ok(eng_kvpool_t *pool, const eng_kvseq_t *s, uint32_t pos, uint32_t tag)
{
    uint32_t bt = eng_kvpool_block_tokens(pool);
    for (uint32_t l = 0; l < N_LAYER; l++)
        for (uint32_t h = 0; h < N_HEAD; h++) {
            const float *kv = eng_kvpool_kv(pool, s->blocks[pos / bt], l, h);
            for (uint32_t d = 0; d < HEAD_DIM; d++)
                if (kv[d * bt + pos % bt] != stamp(tag, pos, l, h, d, 0) ||
                    kv[HEAD_DIM * bt + (pos % bt) * HEAD_DIM + d] != stamp(tag, pos, l, h, d, 1))
                    return 0;
        }
    return 1;
}

/* The model: each sequence remembers, per position, the tag that wrote it. */
#define MAX_SEQS 12
#define MAX_POS 200
#define MAX_CACHED 16

typedef struct model_seq {
    bool live;
    eng_kvseq_t kv;
    uint32_t tags[MAX_POS];
} model_seq_t;

/* Cached entries: block runs held by a pretend prefix index, evicted LRU through the hook. */
typedef struct cached {
    bool live;
    uint32_t blocks[MAX_POS / 4 + 1];
    uint32_t n_blocks;
    uint32_t n_tokens;
    uint32_t tags[MAX_POS];
    uint64_t last_use;
} cached_t;

typedef struct world {
    eng_kvpool_t *pool;
    model_seq_t seq[MAX_SEQS];
    cached_t cache[MAX_CACHED];
    uint64_t clock;
    uint32_t n_evicted;
} world_t;

static uint32_t evict_lru(void *ud, uint32_t n_blocks)
{
    world_t *w = ud;
    uint32_t freed = 0;
    while (freed < n_blocks) {
        int best = -1;
        for (int i = 0; i < MAX_CACHED; i++)
            if (w->cache[i].live && (best < 0 || w->cache[i].last_use < w->cache[best].last_use))
                best = i;
        if (best < 0)
            break;
        uint32_t before = eng_kvpool_n_free(w->pool);
        for (uint32_t b = 0; b < w->cache[best].n_blocks; b++)
            eng_kvpool_unref(w->pool, w->cache[best].blocks[b]);
        w->cache[best].live = false;
        w->n_evicted++;
        freed += eng_kvpool_n_free(w->pool) - before;
    }
    return freed;
}

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static void check_world(world_t *w)
{
    uint32_t nb = eng_kvpool_n_blocks(w->pool);
    uint32_t *refs = pc_calloc(nb, sizeof *refs);
    for (int i = 0; i < MAX_SEQS; i++)
        if (w->seq[i].live)
            for (uint32_t b = 0; b < w->seq[i].kv.n_blocks; b++)
                refs[w->seq[i].kv.blocks[b]]++;
    for (int i = 0; i < MAX_CACHED; i++)
        if (w->cache[i].live)
            for (uint32_t b = 0; b < w->cache[i].n_blocks; b++)
                refs[w->cache[i].blocks[b]]++;
    char err[256] = "";
    int rc = eng_kvpool_check(w->pool, refs, err, sizeof err);
    pc_free(refs);
    if (rc != 0)
        fprintf(stderr, "  %s\n", err);
    ASSERT_EQ(rc, 0);
    for (int i = 0; i < MAX_SEQS; i++)
        if (w->seq[i].live)
            for (uint32_t p = 0; p < w->seq[i].kv.n_tokens; p++)
                ASSERT_TRUE(read_ok(w->pool, &w->seq[i].kv, p, w->seq[i].tags[p]));
    for (int i = 0; i < MAX_CACHED; i++)
        if (w->cache[i].live) {
            eng_kvseq_t view = {.blocks = w->cache[i].blocks, .n_blocks = w->cache[i].n_blocks};
            for (uint32_t p = 0; p < w->cache[i].n_tokens; p++)
                ASSERT_TRUE(read_ok(w->pool, &view, p, w->cache[i].tags[p]));
        }
}

static void run_mix(uint32_t block_tokens, uint32_t n_blocks, int n_ops)
{
    world_t *w = calloc(1, sizeof *w);
    eng_kvpool_params_t p = eng_kvpool_params_default();
    p.block_tokens = block_tokens;
    p.dtype = ENG_KV_F32;
    p.max_tokens = (uint64_t)n_blocks * block_tokens;
    p.poison = true;
    ASSERT_EQ(eng_kvpool_init(&p, N_LAYER, N_HEAD, HEAD_DIM, &w->pool), 0);
    ASSERT_EQ(eng_kvpool_n_blocks(w->pool), n_blocks);
    eng_kvpool_set_evict(w->pool, evict_lru, w);
    uint32_t bt = block_tokens, next_tag = 1;
    uint32_t n_nospace = 0;
    for (int op = 0; op < n_ops; op++) {
        w->clock++;
        uint32_t i = rnd(MAX_SEQS);
        model_seq_t *s = &w->seq[i];
        switch (rnd(6)) {
        case 0: /* start a sequence, from scratch or from a cached prefix */
            if (s->live)
                break;
            eng_kvseq_init(&s->kv);
            s->live = true;
            uint32_t c = rnd(MAX_CACHED);
            if (w->cache[c].live && rnd(2)) {
                uint32_t n = 1 + rnd(w->cache[c].n_tokens); /* token granular */
                ASSERT_EQ(eng_kvseq_share(&s->kv, w->pool, w->cache[c].blocks, n), 0);
                memcpy(s->tags, w->cache[c].tags, n * sizeof *s->tags);
                w->cache[c].last_use = w->clock;
            }
            break;
        case 1:
        case 2: { /* extend: reserve, write, commit */
            if (!s->live)
                break;
            uint32_t n = 1 + rnd(40);
            if (s->kv.n_tokens + n > MAX_POS)
                break;
            uint32_t before_blocks = s->kv.n_blocks;
            int rc = eng_kvseq_reserve(&s->kv, w->pool, n);
            if (rc == PC_ERR_NOSPACE) {
                n_nospace++;
                ASSERT_EQ(s->kv.n_blocks, before_blocks);
                break;
            }
            ASSERT_EQ(rc, 0);
            uint32_t tag = next_tag++;
            for (uint32_t p0 = s->kv.n_tokens; p0 < s->kv.n_tokens + n; p0++) {
                write_pos(w->pool, &s->kv, p0, tag);
                s->tags[p0] = tag;
            }
            s->kv.n_tokens += n;
            break;
        }
        case 3: /* release */
            if (!s->live)
                break;
            eng_kvseq_close(&s->kv, w->pool);
            s->live = false;
            break;
        case 4: { /* cache the sequence's prefix (the index takes references) */
            if (!s->live || s->kv.n_tokens == 0)
                break;
            cached_t *e = &w->cache[rnd(MAX_CACHED)];
            if (e->live)
                break;
            uint32_t n = 1 + rnd(s->kv.n_tokens);
            e->n_blocks = (n + bt - 1) / bt;
            for (uint32_t b = 0; b < e->n_blocks; b++) {
                e->blocks[b] = s->kv.blocks[b];
                eng_kvpool_ref(w->pool, e->blocks[b]);
            }
            e->n_tokens = n;
            memcpy(e->tags, s->tags, n * sizeof *e->tags);
            e->last_use = w->clock;
            e->live = true;
            break;
        }
        case 5: /* an explicit eviction */
            evict_lru(w, 1 + rnd(3));
            break;
        }
        PC_TEST_CALL(check_world(w));
    }
    fprintf(stderr, "  bt=%u blocks=%u: %u evictions, %u out-of-space refusals\n", bt, n_blocks,
            w->n_evicted, n_nospace);
    ASSERT_TRUE(w->n_evicted > 0);
    for (int i = 0; i < MAX_SEQS; i++)
        if (w->seq[i].live)
            eng_kvseq_close(&w->seq[i].kv, w->pool);
    for (int i = 0; i < MAX_CACHED; i++)
        if (w->cache[i].live)
            for (uint32_t b = 0; b < w->cache[i].n_blocks; b++)
                eng_kvpool_unref(w->pool, w->cache[i].blocks[b]);
    ASSERT_EQ(eng_kvpool_n_free(w->pool), n_blocks);
    eng_kvpool_free(w->pool);
    free(w);
}

PC_TEST(random_mix_bt16)
{
    PC_TEST_CALL(run_mix(16, 60, (int)(4000 * pc_test_scale())));
}
PC_TEST(random_mix_bt4_tight)
{
    PC_TEST_CALL(run_mix(4, 40, (int)(4000 * pc_test_scale())));
}

/* Copy-on-write: a shared partial block is copied before the new owner writes into it, and the
 * original keeps its contents. */
PC_TEST(copy_on_write_partial_block)
{
    eng_kvpool_params_t p = eng_kvpool_params_default();
    p.dtype = ENG_KV_F32;
    p.max_tokens = 16 * 8;
    eng_kvpool_t *pool;
    ASSERT_EQ(eng_kvpool_init(&p, N_LAYER, N_HEAD, HEAD_DIM, &pool), 0);
    eng_kvseq_t a, b;
    eng_kvseq_init(&a);
    eng_kvseq_init(&b);
    ASSERT_EQ(eng_kvseq_reserve(&a, pool, 20), 0);
    for (uint32_t i = 0; i < 20; i++)
        write_pos(pool, &a, i, 1);
    a.n_tokens = 20;
    ASSERT_EQ(eng_kvseq_share(&b, pool, a.blocks, 20), 0);
    ASSERT_EQ(eng_kvpool_refcount(pool, a.blocks[1]), 2);
    ASSERT_EQ(eng_kvseq_share(&b, pool, a.blocks, 20), PC_ERR_STATE);
    ASSERT_EQ(eng_kvseq_reserve(&b, pool, 3), 0);
    ASSERT_NE(b.blocks[1], a.blocks[1]);
    ASSERT_EQ(b.blocks[0], a.blocks[0]); /* the full block stays shared */
    ASSERT_EQ(eng_kvpool_refcount(pool, a.blocks[1]), 1);
    for (uint32_t i = 20; i < 23; i++)
        write_pos(pool, &b, i, 2);
    b.n_tokens = 23;
    for (uint32_t i = 0; i < 20; i++) {
        ASSERT_TRUE(read_ok(pool, &a, i, 1));
        ASSERT_TRUE(read_ok(pool, &b, i, 1));
    }
    ASSERT_TRUE(read_ok(pool, &b, 21, 2));
    /* Out of space: nothing changes. 8 blocks: a 2, b 2 (one shared) -> 5 free. */
    ASSERT_EQ(eng_kvpool_n_free(pool), 5);
    ASSERT_EQ(eng_kvseq_reserve(&a, pool, 16 * 7), PC_ERR_NOSPACE);
    ASSERT_EQ(a.n_blocks, 2);
    ASSERT_EQ(eng_kvpool_n_free(pool), 5);
    eng_kvseq_close(&a, pool);
    eng_kvseq_close(&b, pool);
    ASSERT_EQ(eng_kvpool_n_free(pool), 8);
    eng_kvpool_free(pool);
}

PC_TEST(budget_in_bytes_and_bad_params)
{
    eng_kvpool_params_t p = eng_kvpool_params_default();
    p.max_bytes = 1 << 20;
    eng_kvpool_t *pool;
    ASSERT_EQ(eng_kvpool_init(&p, 8, 4, 64, &pool), 0);
    /* A block: 8 layers * 4 heads * 2 * 64 * 16 * 2 bytes = 128 KiB. */
    ASSERT_EQ(eng_kvpool_block_bytes(pool), 131072);
    ASSERT_EQ(eng_kvpool_n_blocks(pool), 8);
    eng_kvpool_free(pool);
    p.max_tokens = 64; /* the smaller budget wins */
    ASSERT_EQ(eng_kvpool_init(&p, 8, 4, 64, &pool), 0);
    ASSERT_EQ(eng_kvpool_n_blocks(pool), 4);
    eng_kvpool_free(pool);
    p.max_bytes = 1000; /* below one block */
    ASSERT_EQ(eng_kvpool_init(&p, 8, 4, 64, &pool), PC_ERR_INVAL);
    p = eng_kvpool_params_default(); /* no budget at all */
    ASSERT_EQ(eng_kvpool_init(&p, 8, 4, 64, &pool), PC_ERR_INVAL);
    p.max_tokens = 64;
    p.block_tokens = 0;
    ASSERT_EQ(eng_kvpool_init(&p, 8, 4, 64, &pool), PC_ERR_INVAL);
    eng_kvpool_free(NULL);
}

/* An allocator that refuses any single allocation above 1 MiB. */
static void *capped_malloc(size_t n)
{
    return n > (1u << 20) ? NULL : malloc(n);
}
static void *capped_calloc(size_t c, size_t n)
{
    return n != 0 && c > (1u << 20) / n ? NULL : calloc(c, n);
}
static void *capped_realloc(void *p, size_t n)
{
    return n > (1u << 20) ? NULL : realloc(p, n);
}

typedef struct hook_log {
    uint32_t n_alloc, n_copy, last_dst, last_src, last_n;
} hook_log_t;
static void log_alloc(void *ud, uint32_t block)
{
    ((hook_log_t *)ud)->n_alloc++;
    (void)block;
}
static void log_copy(void *ud, uint32_t dst, uint32_t src, uint32_t n_tokens)
{
    hook_log_t *l = ud;
    l->n_copy++;
    l->last_dst = dst;
    l->last_src = src;
    l->last_n = n_tokens;
}

/* A no_storage pool (the cuda backend's: KV lives on the device) allocates no host memory for
 * its blocks, yet does the same accounting and copy-on-write, with copies and allocations
 * reaching only the hooks. */
PC_TEST(no_storage_pool_accounts_without_host_memory)
{
    eng_kvpool_params_t p = eng_kvpool_params_default();
    p.dtype = ENG_KV_F32;
    p.max_tokens = 16 * 4096; /* 4096 blocks of 2 KiB: 8 MiB of storage */
    p.poison = true;
    eng_kvpool_t *pool;
    pc_allocator_t capped = {capped_malloc, capped_calloc, capped_realloc, free};
    pc_allocator_t prev = pc_set_allocator(&capped);
    int rc_storage = eng_kvpool_init(&p, N_LAYER, N_HEAD, HEAD_DIM, &pool);
    p.no_storage = true;
    int rc = eng_kvpool_init(&p, N_LAYER, N_HEAD, HEAD_DIM, &pool);
    pc_set_allocator(&prev);
    ASSERT_EQ(rc_storage, PC_ERR_NOMEM); /* the host copy is what a GPU worker must not hold */
    ASSERT_EQ(rc, 0);
    ASSERT_TRUE(!eng_kvpool_has_storage(pool));
    ASSERT_EQ(eng_kvpool_n_blocks(pool), 4096);
    ASSERT_EQ(eng_kvpool_block_bytes(pool), 2048);
    ASSERT_TRUE(eng_kvpool_kv(pool, 0, 0, 0) == NULL);
    hook_log_t log = {0};
    eng_kvpool_hooks_t hooks = {.on_alloc = log_alloc, .on_copy = log_copy, .ud = &log};
    eng_kvpool_set_hooks(pool, &hooks);
    /* The copy-on-write scenario of copy_on_write_partial_block, accounting only. */
    eng_kvseq_t a, b;
    eng_kvseq_init(&a);
    eng_kvseq_init(&b);
    ASSERT_EQ(eng_kvseq_reserve(&a, pool, 20), 0);
    a.n_tokens = 20;
    ASSERT_EQ(log.n_alloc, 2);
    ASSERT_EQ(eng_kvseq_share(&b, pool, a.blocks, 20), 0);
    ASSERT_EQ(eng_kvseq_reserve(&b, pool, 3), 0);
    ASSERT_NE(b.blocks[1], a.blocks[1]);
    ASSERT_EQ(log.n_alloc, 3);
    ASSERT_EQ(log.n_copy, 1);
    ASSERT_EQ(log.last_dst, b.blocks[1]);
    ASSERT_EQ(log.last_src, a.blocks[1]);
    ASSERT_EQ(log.last_n, 4); /* positions 16..19 of the shared block */
    b.n_tokens = 23;
    uint32_t refs[4096] = {0};
    for (uint32_t i = 0; i < a.n_blocks; i++)
        refs[a.blocks[i]]++;
    for (uint32_t i = 0; i < b.n_blocks; i++)
        refs[b.blocks[i]]++;
    char err[128];
    ASSERT_EQ(eng_kvpool_check(pool, refs, err, sizeof err), 0);
    ASSERT_EQ(eng_kvpool_n_free(pool), 4096 - 3);
    eng_kvpool_copy(pool, b.blocks[1], a.blocks[1], 16); /* a whole-block copy: hook only */
    ASSERT_EQ(log.n_copy, 2);
    eng_kvseq_close(&a, pool);
    eng_kvseq_close(&b, pool);
    ASSERT_EQ(eng_kvpool_n_free(pool), 4096);
    eng_kvpool_free(pool);
    /* The default keeps host storage (the CPU backend's). */
    p = eng_kvpool_params_default();
    p.max_tokens = 64;
    ASSERT_EQ(eng_kvpool_init(&p, N_LAYER, N_HEAD, HEAD_DIM, &pool), 0);
    ASSERT_TRUE(eng_kvpool_has_storage(pool));
    ASSERT_TRUE(eng_kvpool_kv(pool, 3, 1, 1) != NULL);
    eng_kvpool_free(pool);
}

PC_TEST_MAIN()
