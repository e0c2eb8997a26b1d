/*
 * test_tier.c — the engine's KV tiers (engine/tier.h) over a real disk store: a prefix evicted
 * from a small pool comes back from the disk tier with the logits of a cold prefill; a hole
 * (one middle block in no tier) is recomputed exactly and alone; a corrupt record is deleted,
 * counted and recomputed; a fresh engine on the same directory (a restart) hits and lists the
 * prefix; two namespaces never share a record; retained prefixes are written through; a
 * prefetch stages the blocks so the start only copies; the cost model picks the cheaper side.
 * The host-memory tier G2 (allowed on the CPU backend when configured, which is what makes it
 * testable here): an evicted prefix lands in G2 and comes back from there with cold logits and
 * no disk read; G2 over its budget spills its oldest blocks to the disk, where a later read
 * finds them; a hole in G2 with the later blocks on disk is recomputed alone; a restart lists
 * nothing from G2 (the shutdown wrote it down). The KV accounting (eng_check) holds after
 * every step. Runs on a llama and a qwen3 model.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"
#include "engine_internal.h"
#include "eng_testmodel.h"
#include "kvtier.h"
#include "pc_assert.h"
#include "pc_err.h"
#include "pc_test.h"

#define N_VOCAB 256
#define BT 16
#define N_PROMPT 200 /* 12 whole blocks reusable ((200 - 1) / 16), 8 tokens after */
#define N_WHOLE ((N_PROMPT - 1) / BT)

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static char g_dir[256];

__attribute__((destructor)) static void remove_dir(void)
{
    if (g_dir[0] != '\0') {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
        if (system(cmd) != 0)
            fprintf(stderr, "cannot remove %s\n", g_dir);
    }
}

/* A fresh, empty tier directory under g_dir. */
static void new_dir(char *out, size_t len)
{
    static int n;
    if (g_dir[0] == '\0') {
        snprintf(g_dir, sizeof g_dir, "/tmp/kvgw-tier-test.XXXXXX");
        PC_ASSERT(mkdtemp(g_dir) != NULL);
    }
    snprintf(out, len, "%s/t%d", g_dir, n++);
}

static void make_model(enum eng_arch arch, char *path, size_t len)
{
    eng_mkmodel_params_t p = eng_mkmodel_params_default();
    p.arch = arch;
    p.n_layer = 2;
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 128;
    p.n_ctx = 4096;
    p.rope_theta = 10000.0f;
    p.seed = 5;
    char err[256];
    if (tm_make(&p, N_VOCAB, path, len, err, sizeof err) != 0) {
        fprintf(stderr, "mkmodel: %s\n", err);
        abort();
    }
}

/* The tests' engine parameters: model, F32 KV in 16-token blocks, a pool of 256 tokens (16
 * blocks), the disk tier in dir for prefixes of 32 tokens and more. */
static eng_params_t tier_params(const char *model, const char *dir)
{
    eng_params_t p = eng_params_default();
    p.model_path = model;
    p.kv_dtype = ENG_KV_F32;
    p.kv_block_tokens = BT;
    p.kv_max_tokens = 256;
    p.tier.dir = dir;
    p.tier.min_tokens = 32;
    return p;
}

/* eng_init on p; NULL (with the reason on stderr) when it fails. */
static eng_t *open_params(const eng_params_t *p)
{
    eng_t *e = NULL;
    char err[256];
    if (eng_init(p, &e, err, sizeof err) != 0)
        fprintf(stderr, "eng_init: %s\n", err);
    return e;
}

/* A poisoning engine (tier_params) with a disk budget of max_bytes (0: the default). */
static eng_t *open_engine_budget(const char *model, const char *dir, bool load_always,
                                 uint64_t max_bytes)
{
    eng_params_t p = tier_params(model, dir);
    p.kv_poison = true;
    p.tier.load_always = load_always;
    p.tier.max_bytes = max_bytes;
    return open_params(&p);
}

static eng_t *open_engine(const char *model, const char *dir, bool load_always)
{
    return open_engine_budget(model, dir, load_always, 0);
}

/* As open_engine (load_always), with a G2 tier of g2_bytes. */
static eng_t *open_engine_g2(const char *model, const char *dir, uint64_t g2_bytes)
{
    eng_params_t p = tier_params(model, dir);
    p.kv_poison = true;
    p.tier.load_always = true;
    p.tier.g2_bytes = g2_bytes;
    return open_params(&p);
}

/* As open_engine, with a staging queue of queue_bytes. */
static eng_t *open_engine_queue(const char *model, const char *dir, uint64_t queue_bytes)
{
    eng_params_t p = tier_params(model, dir);
    p.tier.queue_bytes = queue_bytes;
    return open_params(&p);
}

/* The eviction callback: the tier of the last event that dropped whole blocks of ns 7. */
static void on_evict(const eng_evict_event_t *ev, void *ud)
{
    if (ev->ns == 7 && ev->n_tokens + ev->n_dropped >= BT)
        *(int *)ud = ev->tier;
}

static void check(eng_t *e)
{
    char err[256];
    int rc = eng_check(e, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  %s\n", err);
    ASSERT_EQ(rc, 0);
}

/* Every position's logits of tokens[0..n) computed cold, by the naive reference (no cache, no
 * KV): lg[n][V]. */
static void cold(const char *model, const int32_t *tokens, uint32_t n, float *lg)
{
    ASSERT_EQ(tm_reference(model, tokens, (int)n, lg), 0);
}

/* Caches tokens[0..n) in ns (computed here), retained or not. */
static void cache(eng_t *e, uint64_t ns, const int32_t *tokens, uint32_t n, bool retain)
{
    eng_seq_t *s;
    ASSERT_EQ(eng_seq_create(e, &s), 0);
    eng_batch_item_t it = {.seq = s, .tokens = tokens, .n_tokens = n, .logits = ENG_LOGITS_NONE};
    ASSERT_EQ(eng_forward(e, &it, 1, NULL), 0);
    if (retain)
        ASSERT_EQ(eng_prefix_retain(e, s, ns, n, 1000, NULL), 0);
    else
        ASSERT_EQ(eng_prefix_insert(e, s, ns, n), 0);
    eng_seq_free(e, s);
    check(e);
}

/* Pushes everything cached out of the pool: a sequence of 240 other tokens needs 15 of the 16
 * blocks. */
static void evict_all(eng_t *e)
{
    int32_t other[240];
    for (int i = 0; i < 240; i++)
        other[i] = (int32_t)rnd(N_VOCAB);
    eng_seq_t *s;
    ASSERT_EQ(eng_seq_create(e, &s), 0);
    eng_batch_item_t it = {.seq = s, .tokens = other, .n_tokens = 240, .logits = ENG_LOGITS_NONE};
    ASSERT_EQ(eng_forward(e, &it, 1, NULL), 0);
    eng_seq_free(e, s);
    check(e);
    eng_tier_flush(e);
}

/* tokens[0..n) drawn at random. */
static void random_tokens(int32_t *tokens, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        tokens[i] = (int32_t)rnd(N_VOCAB);
}

/* Caches tokens[0..n) in ns 7 (unpinned), then pushes everything out of the pool (evict_all).
 * Returns the tier the eviction of whole blocks of ns 7 reported (on_evict), or -1. */
static int cache_and_evict(eng_t *e, const int32_t *tokens, uint32_t n)
{
    int tier = -1;
    cache(e, 7, tokens, n, false);
    eng_set_evict_callback(e, on_evict, &tier);
    evict_all(e);
    eng_set_evict_callback(e, NULL, NULL);
    return tier;
}

/* Starts tokens[0..n) from the cache and tiers in ns, computes the rest with every row's
 * logits, compares the rows past the reused positions with ref; *o gets the origin. */
static void run_check(eng_t *e, uint64_t ns, const int32_t *tokens, uint32_t n, const float *ref,
                      eng_seq_origin_t *o)
{
    static float lg[N_PROMPT * N_VOCAB];
    eng_seq_t *s;
    uint32_t reused = 0;
    ASSERT_EQ(eng_seq_create(e, &s), 0);
    ASSERT_EQ(eng_seq_start_cached(e, s, ns, tokens, n, &reused), 0);
    eng_seq_origin(s, o);
    ASSERT_EQ(reused, o->g1_tokens + o->g2_tokens + o->g3_tokens + o->recomputed_tokens);
    ASSERT_EQ(eng_seq_n_tokens(s), reused);
    ASSERT_TRUE(reused < n);
    check(e);
    eng_batch_item_t it = {
        .seq = s, .tokens = tokens + reused, .n_tokens = n - reused, .logits = ENG_LOGITS_ALL};
    ASSERT_EQ(eng_forward(e, &it, 1, lg), 0);
    for (uint32_t i = reused; i < n; i++) {
        double err =
            tm_rel_err(lg + (size_t)(i - reused) * N_VOCAB, ref + (size_t)i * N_VOCAB, 1, N_VOCAB);
        if (!(err <= 1e-4))
            fprintf(stderr, "  position %u: rel err %g\n", i, err);
        ASSERT_LE(err, 1e-4);
    }
    eng_seq_free(e, s);
    check(e);
}

/* The record file of block i of tokens in ns. */
static void record_path(eng_t *e, const char *dir, uint64_t ns, const int32_t *tokens, uint32_t i,
                        char *out, size_t len)
{
    eng_kvtier_name_t nm;
    eng__tier_block_name(e, ns, tokens, i, &nm);
    char hex[65];
    eng_kvtier_name_hex(&nm, hex);
    snprintf(out, len, "%s/%.2s/%s.kvb", dir, hex, hex);
}

static const enum eng_arch archs[] = {ENG_ARCH_LLAMA, ENG_ARCH_QWEN3};

PC_TEST(evicted_prefix_comes_back_from_disk_with_cold_logits)
{
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        char model[256], dir[300];
        make_model(archs[a], model, sizeof model);
        new_dir(dir, sizeof dir);
        eng_t *e = open_engine(model, dir, true);
        ASSERT_TRUE(e != NULL);
        int32_t tok[N_PROMPT];
        random_tokens(tok, N_PROMPT);
        static float ref[N_PROMPT * N_VOCAB];
        cold(model, tok, N_PROMPT, ref);
        int tier = cache_and_evict(e, tok, N_PROMPT);
        ASSERT_EQ(tier, ENG_TIER_G3); /* reported as gone down to the disk */
        eng_tier_stats_t st;
        eng_tier_stats(e, &st);
        ASSERT_EQ(st.write_blocks, (uint64_t)N_WHOLE);
        ASSERT_EQ(st.g3_blocks, (uint64_t)N_WHOLE);
        ASSERT_EQ(st.write_dropped, 0);
        eng_seq_origin_t o;
        run_check(e, 7, tok, N_PROMPT, ref, &o);
        ASSERT_EQ(o.g1_tokens, 0);
        ASSERT_EQ(o.g3_tokens, (uint32_t)N_WHOLE * BT);
        ASSERT_EQ(o.recomputed_tokens, 0);
        eng_tier_stats(e, &st);
        ASSERT_EQ(st.hit_blocks_g3, (uint64_t)N_WHOLE);
        ASSERT_EQ(st.load_blocks, (uint64_t)N_WHOLE);
        ASSERT_EQ(st.recompute_avoided_tokens, (uint64_t)N_WHOLE * BT);
        ASSERT_TRUE(st.load_bytes_per_s > 0);
        /* The cost model's attention term: its inputs are exported, and a position deep in
         * the context is dearer to recompute than the measured rate's. */
        ASSERT_TRUE(st.attn_per_pos > 0 && st.prefill_mean_pos > 0);
        ASSERT_TRUE(eng__tier_recompute_scale(e, 4096) > eng__tier_recompute_scale(e, 0));
        /* Another namespace never sees it. */
        static float ref2[N_PROMPT * N_VOCAB];
        memcpy(ref2, ref, sizeof ref2);
        run_check(e, 8, tok, N_PROMPT, ref2, &o);
        ASSERT_EQ(o.g3_tokens, 0);
        eng_free(e);
        unlink(model);
    }
}

PC_TEST(hole_is_recomputed_exactly_and_alone)
{
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        char model[256], dir[300];
        make_model(archs[a], model, sizeof model);
        new_dir(dir, sizeof dir);
        eng_t *e = open_engine(model, dir, true);
        ASSERT_TRUE(e != NULL);
        int32_t tok[N_PROMPT];
        random_tokens(tok, N_PROMPT);
        static float ref[N_PROMPT * N_VOCAB];
        cold(model, tok, N_PROMPT, ref);
        cache_and_evict(e, tok, N_PROMPT);
        /* Block 5 leaves every tier: a hole between blocks 0..4 and 6..11. */
        eng_kvtier_name_t nm;
        eng__tier_block_name(e, 7, tok, 5, &nm);
        ASSERT_EQ(eng_kvtier_remove(eng__tier_store(e), &nm), 0);
        eng_seq_origin_t o;
        run_check(e, 7, tok, N_PROMPT, ref, &o);
        ASSERT_EQ(o.recomputed_tokens, (uint32_t)BT);
        ASSERT_EQ(o.g3_tokens, (uint32_t)(N_WHOLE - 1) * BT);
        eng_tier_stats_t st;
        eng_tier_stats(e, &st);
        ASSERT_EQ(st.recomputed_tokens, (uint64_t)BT);
        ASSERT_EQ(st.miss_blocks, 1);
        /* A hole at the end is no hole: the last block missing leaves it to the caller. */
        eng_kvtier_name_t last;
        eng__tier_block_name(e, 7, tok, N_WHOLE - 1, &last);
        evict_all(e);
        ASSERT_EQ(eng_kvtier_remove(eng__tier_store(e), &last), 0);
        run_check(e, 7, tok, N_PROMPT, ref, &o);
        ASSERT_EQ(o.recomputed_tokens, (uint32_t)BT); /* block 5 again (it was recomputed, and
                                                          written back since) */
        eng_free(e);
        unlink(model);
    }
}

PC_TEST(corrupt_record_is_recomputed_and_counted)
{
    char model[256], dir[300];
    make_model(ENG_ARCH_LLAMA, model, sizeof model);
    new_dir(dir, sizeof dir);
    eng_t *e = open_engine(model, dir, true);
    ASSERT_TRUE(e != NULL);
    int32_t tok[N_PROMPT];
    random_tokens(tok, N_PROMPT);
    static float ref[N_PROMPT * N_VOCAB];
    cold(model, tok, N_PROMPT, ref);
    cache_and_evict(e, tok, N_PROMPT);
    /* One payload byte of block 3 flips on disk. */
    char path[512];
    record_path(e, dir, 7, tok, 3, path, sizeof path);
    int fd = open(path, O_RDWR);
    ASSERT_TRUE(fd >= 0);
    uint8_t b;
    ASSERT_EQ(pread(fd, &b, 1, 4096 + 100), 1);
    b ^= 0x40;
    ASSERT_EQ(pwrite(fd, &b, 1, 4096 + 100), 1);
    close(fd);
    eng_seq_origin_t o;
    run_check(e, 7, tok, N_PROMPT, ref, &o);
    ASSERT_EQ(o.recomputed_tokens, (uint32_t)BT);
    ASSERT_EQ(o.g3_tokens, (uint32_t)(N_WHOLE - 1) * BT);
    eng_tier_stats_t st;
    eng_tier_stats(e, &st);
    ASSERT_EQ(st.corrupt, 1);
    ASSERT_TRUE(access(path, F_OK) != 0); /* deleted */
    eng_free(e);
    unlink(model);
}

typedef struct listed {
    int n;
    uint64_t ns;
    uint32_t n_tokens;
    bool same;      /* the path is want's and the tier G3 */
    bool path_same; /* the path is want's */
    uint8_t tier;
    const int32_t *want;
} listed_t;

static void on_prefix(const eng_tier_prefix_t *p, void *ud)
{
    listed_t *l = ud;
    l->n++;
    l->ns = p->ns;
    l->n_tokens = p->n_tokens;
    l->tier = p->tier;
    l->path_same = memcmp(p->tokens, l->want, (size_t)p->n_tokens * sizeof(int32_t)) == 0;
    l->same = p->tier == ENG_TIER_G3 && l->path_same;
}

PC_TEST(restart_hits_and_lists_the_prefix)
{
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        char model[256], dir[300];
        make_model(archs[a], model, sizeof model);
        new_dir(dir, sizeof dir);
        eng_t *e = open_engine(model, dir, true);
        ASSERT_TRUE(e != NULL);
        int32_t tok[N_PROMPT];
        random_tokens(tok, N_PROMPT);
        static float ref[N_PROMPT * N_VOCAB];
        cold(model, tok, N_PROMPT, ref);
        /* Retained: written through at once, no eviction needed. */
        cache(e, 9, tok, N_PROMPT, true);
        eng_tier_flush(e);
        eng_tier_stats_t st;
        eng_tier_stats(e, &st);
        ASSERT_EQ(st.write_blocks, (uint64_t)N_WHOLE);
        ASSERT_EQ(eng_prefix_release(e, 9, tok, N_PROMPT), 0);
        eng_free(e);

        e = open_engine(model, dir, true);
        ASSERT_TRUE(e != NULL);
        eng_tier_stats(e, &st);
        ASSERT_EQ(st.g3_blocks, (uint64_t)N_WHOLE);
        listed_t l = {.want = tok};
        ASSERT_EQ(eng_tier_prefixes(e, on_prefix, &l), 1);
        ASSERT_EQ(l.n, 1);
        ASSERT_EQ(l.ns, 9);
        ASSERT_EQ(l.n_tokens, (uint32_t)N_WHOLE * BT);
        ASSERT_TRUE(l.same);
        eng_seq_origin_t o;
        run_check(e, 9, tok, N_PROMPT, ref, &o);
        ASSERT_EQ(o.g3_tokens, (uint32_t)N_WHOLE * BT);
        eng_free(e);
        unlink(model);
    }
}

static int count_rec(void *ud, const eng_kvtier_rec_t *rec)
{
    (void)rec;
    (*(int *)ud)++;
    return 0;
}

typedef struct chains {
    int n, whole; /* chains listed; of them, equal to p or q */
    const int32_t *p, *q;
} chains_t;

static void on_chain(const eng_tier_prefix_t *pr, void *ud)
{
    chains_t *c = ud;
    c->n++;
    size_t bytes = (size_t)pr->n_tokens * sizeof(int32_t);
    if (pr->n_tokens == (uint32_t)N_WHOLE * BT &&
        (memcmp(pr->tokens, c->p, bytes) == 0 || memcmp(pr->tokens, c->q, bytes) == 0))
        c->whole++;
}

PC_TEST(child_written_before_its_parent_is_linked)
{
    char model[256], dir[300];
    make_model(ENG_ARCH_QWEN3, model, sizeof model);
    new_dir(dir, sizeof dir);
    eng_t *e = open_engine(model, dir, true);
    ASSERT_TRUE(e != NULL);
    /* p and q share 64 tokens: the prefix index splits them into a node of 4 blocks and two
     * leaves; the leaves leave the pool first, so p's block 4 lands before its parent. */
    int32_t p[N_PROMPT], q[N_PROMPT];
    for (uint32_t i = 0; i < N_PROMPT; i++) {
        p[i] = (int32_t)rnd(N_VOCAB);
        q[i] = i < 64 ? p[i] : (int32_t)rnd(N_VOCAB);
    }
    q[64] = (p[64] + 1) % N_VOCAB;
    cache(e, 5, p, N_PROMPT, false);
    cache(e, 5, q, N_PROMPT, false);
    evict_all(e);
    chains_t c = {.p = p, .q = q};
    ASSERT_EQ(eng_tier_prefixes(e, on_chain, &c), 2);
    ASSERT_EQ(c.whole, 2);
    /* The same after a restart (the index is rebuilt in LRU order: children first), and
     * without their shared block 3 the two chains are still known whole (a read recomputes
     * the hole). */
    eng_free(e);
    e = open_engine(model, dir, true);
    ASSERT_TRUE(e != NULL);
    c = (chains_t){.p = p, .q = q};
    ASSERT_EQ(eng_tier_prefixes(e, on_chain, &c), 2);
    ASSERT_EQ(c.whole, 2);
    eng_kvtier_name_t nm;
    eng__tier_block_name(e, 5, p, 3, &nm);
    ASSERT_EQ(eng_kvtier_remove(eng__tier_store(e), &nm), 0);
    c = (chains_t){.p = p, .q = q};
    ASSERT_EQ(eng_tier_prefixes(e, on_chain, &c), 2);
    ASSERT_EQ(c.whole, 2);
    eng_free(e);
    unlink(model);
}

PC_TEST(namespaces_never_share_a_record)
{
    char model[256], dir[300];
    make_model(ENG_ARCH_LLAMA, model, sizeof model);
    new_dir(dir, sizeof dir);
    eng_t *e = open_engine(model, dir, true);
    ASSERT_TRUE(e != NULL);
    int32_t tok[N_PROMPT];
    random_tokens(tok, N_PROMPT);
    /* Retained in ns 1, then in ns 2 (whose prefill pushes ns 1's pin out of the small pool:
     * its blocks are on disk already). */
    cache(e, 1, tok, N_PROMPT, true);
    cache(e, 2, tok, N_PROMPT, true);
    eng_tier_flush(e);
    int n = 0;
    ASSERT_EQ(eng_kvtier_foreach(eng__tier_store(e), count_rec, &n), 0);
    ASSERT_EQ(n, 2 * N_WHOLE);
    for (uint32_t i = 0; i < N_WHOLE; i++) {
        eng_kvtier_name_t a, b;
        eng__tier_block_name(e, 1, tok, i, &a);
        eng__tier_block_name(e, 2, tok, i, &b);
        ASSERT_TRUE(memcmp(a.b, b.b, sizeof a.b) != 0);
        ASSERT_EQ(eng_kvtier_contains(eng__tier_store(e), &a), 1);
        ASSERT_EQ(eng_kvtier_contains(eng__tier_store(e), &b), 1);
    }
    /* Dropping ns 1 (the gateway forgot it) removes its records, and only those. */
    ASSERT_EQ(eng_prefix_release(e, 2, tok, N_PROMPT), 0);
    int rc = eng_prefix_drop(e, 1, tok, 0);
    ASSERT_TRUE(rc == 0 || rc == PC_ERR_NOTFOUND);
    n = 0;
    ASSERT_EQ(eng_kvtier_foreach(eng__tier_store(e), count_rec, &n), 0);
    ASSERT_EQ(n, N_WHOLE);
    for (uint32_t i = 0; i < N_WHOLE; i++) {
        eng_kvtier_name_t b;
        eng__tier_block_name(e, 2, tok, i, &b);
        ASSERT_EQ(eng_kvtier_contains(eng__tier_store(e), &b), 1);
    }
    eng_free(e);
    unlink(model);
}

PC_TEST(dropping_a_prefix_removes_its_records)
{
    char model[256], dir[300];
    make_model(ENG_ARCH_QWEN3, model, sizeof model);
    new_dir(dir, sizeof dir);
    eng_t *e = open_engine(model, dir, true);
    ASSERT_TRUE(e != NULL);
    /* p and q share their first 40 tokens (blocks 0 and 1 whole); p is also cached in ns 2. */
    int32_t p[N_PROMPT], q[N_PROMPT];
    for (uint32_t i = 0; i < N_PROMPT; i++) {
        p[i] = (int32_t)rnd(N_VOCAB);
        q[i] = i < 40 ? p[i] : (int32_t)rnd(N_VOCAB);
    }
    q[40] = (p[40] + 1) % N_VOCAB;
    static float ref_p[N_PROMPT * N_VOCAB], ref_q[N_PROMPT * N_VOCAB];
    cold(model, p, N_PROMPT, ref_p);
    cold(model, q, N_PROMPT, ref_q);
    cache(e, 1, p, N_PROMPT, false);
    cache(e, 1, q, N_PROMPT, false);
    cache(e, 2, p, N_PROMPT, false);
    evict_all(e);
    int n = 0;
    ASSERT_EQ(eng_kvtier_foreach(eng__tier_store(e), count_rec, &n), 0);
    ASSERT_EQ(n, 3 * N_WHOLE - 2);
    /* Dropping what starts with p[0..100) in ns 1 removes p's blocks 6.. (they end past 100)
     * and 2..5 (nothing else continues them), keeps 0 and 1 (q continues them) and ns 2. */
    int rc = eng_prefix_drop(e, 1, p, 100);
    ASSERT_TRUE(rc == 0 || rc == PC_ERR_NOTFOUND);
    n = 0;
    ASSERT_EQ(eng_kvtier_foreach(eng__tier_store(e), count_rec, &n), 0);
    ASSERT_EQ(n, 2 * N_WHOLE);
    for (uint32_t i = 2; i < N_WHOLE; i++) {
        eng_kvtier_name_t nm;
        eng__tier_block_name(e, 1, p, i, &nm);
        ASSERT_EQ(eng_kvtier_contains(eng__tier_store(e), &nm), 0);
    }
    eng_seq_origin_t o;
    run_check(e, 1, p, N_PROMPT, ref_p, &o);
    ASSERT_EQ(o.g3_tokens, 2u * BT); /* only what q shares comes back */
    static float ref2[N_PROMPT * N_VOCAB];
    memcpy(ref2, ref_p, sizeof ref2);
    run_check(e, 2, p, N_PROMPT, ref2, &o);
    ASSERT_EQ(o.g3_tokens, (uint32_t)N_WHOLE * BT);
    run_check(e, 1, q, N_PROMPT, ref_q, &o);
    ASSERT_EQ(o.g3_tokens + o.g1_tokens, (uint32_t)N_WHOLE * BT);
    eng_free(e);
    unlink(model);
}

/* As open_engine, with the shutdown write-back's bounds. */
static eng_t *open_engine_shutdown(const char *model, const char *dir, uint32_t ms, uint64_t bytes)
{
    eng_params_t p = tier_params(model, dir);
    p.tier.load_always = true;
    p.tier.shutdown_ms = ms;
    p.tier.shutdown_bytes = bytes;
    return open_params(&p);
}

PC_TEST(shutdown_writes_the_pool_back)
{
    char model[256], dir[300], dir0[300], dir5[300];
    make_model(ENG_ARCH_QWEN3, model, sizeof model);
    new_dir(dir, sizeof dir);
    new_dir(dir0, sizeof dir0);
    new_dir(dir5, sizeof dir5);
    int32_t tok[N_PROMPT], small[20];
    random_tokens(tok, N_PROMPT);
    for (uint32_t i = 0; i < 20; i++)
        small[i] = (int32_t)rnd(N_VOCAB);
    static float ref[N_PROMPT * N_VOCAB];
    cold(model, tok, N_PROMPT, ref);
    /* Cached in the pool only (unpinned, never evicted), plus one prompt below min_tokens. */
    eng_t *e = open_engine_shutdown(model, dir, 3000, 0);
    ASSERT_TRUE(e != NULL);
    cache(e, 3, tok, N_PROMPT, false);
    cache(e, 3, small, 20, false);
    eng_tier_stats_t st;
    eng_tier_flush(e);
    eng_tier_stats(e, &st);
    ASSERT_EQ(st.g3_blocks, 0);
    size_t bb = eng_kvpool_block_bytes(eng_kvpool(e));
    eng_free(e);
    /* A clean restart hits all of it from the disk, with cold logits; the short one is not
     * there (the filter). */
    e = open_engine_shutdown(model, dir, 3000, 0);
    ASSERT_TRUE(e != NULL);
    eng_tier_stats(e, &st);
    ASSERT_EQ(st.g3_blocks, (uint64_t)N_WHOLE);
    eng_seq_origin_t o;
    run_check(e, 3, tok, N_PROMPT, ref, &o);
    ASSERT_EQ(o.g3_tokens, (uint32_t)N_WHOLE * BT);
    eng_free(e);
    /* The bounds: no time writes nothing; five blocks' bytes write five blocks. */
    e = open_engine_shutdown(model, dir0, 0, 0);
    ASSERT_TRUE(e != NULL);
    cache(e, 3, tok, N_PROMPT, false);
    eng_free(e);
    e = open_engine_shutdown(model, dir0, 0, 0);
    ASSERT_TRUE(e != NULL);
    eng_tier_stats(e, &st);
    ASSERT_EQ(st.g3_blocks, 0);
    eng_free(e);
    e = open_engine_shutdown(model, dir5, 3000, 5 * bb);
    ASSERT_TRUE(e != NULL);
    cache(e, 3, tok, N_PROMPT, false);
    eng_free(e);
    e = open_engine_shutdown(model, dir5, 3000, 0);
    ASSERT_TRUE(e != NULL);
    eng_tier_stats(e, &st);
    ASSERT_EQ(st.g3_blocks, 5);
    check(e);
    eng_free(e);
    unlink(model);
}

PC_TEST(prefetch_stages_the_blocks)
{
    char model[256], dir[300];
    make_model(ENG_ARCH_QWEN3, model, sizeof model);
    new_dir(dir, sizeof dir);
    eng_t *e = open_engine(model, dir, true);
    ASSERT_TRUE(e != NULL);
    int32_t tok[N_PROMPT];
    random_tokens(tok, N_PROMPT);
    static float ref[N_PROMPT * N_VOCAB];
    cold(model, tok, N_PROMPT, ref);
    cache_and_evict(e, tok, N_PROMPT);
    eng_tier_ticket_t *k = NULL;
    ASSERT_EQ(eng_tier_prefetch(e, 7, tok, N_PROMPT, &k), 0);
    ASSERT_TRUE(k != NULL);
    for (int i = 0; i < 100000 && !eng_tier_ready(k); i++)
        usleep(100);
    ASSERT_TRUE(eng_tier_ready(k));
    eng_tier_stats_t st;
    eng_tier_stats(e, &st);
    uint64_t loads = st.load_blocks;
    ASSERT_EQ(loads, (uint64_t)N_WHOLE);
    eng_seq_origin_t o;
    run_check(e, 7, tok, N_PROMPT, ref, &o);
    ASSERT_EQ(o.g3_tokens, (uint32_t)N_WHOLE * BT);
    eng_tier_stats(e, &st);
    ASSERT_EQ(st.load_blocks, loads); /* only copies from the staged buffers */
    eng_tier_ticket_free(e, k);
    eng_tier_stats(e, &st);
    ASSERT_EQ(st.queue_bytes, 0);
    /* Nothing to read: no ticket. */
    ASSERT_EQ(eng_tier_prefetch(e, 99, tok, N_PROMPT, &k), 0);
    ASSERT_TRUE(k == NULL);
    eng_free(e);
    unlink(model);
}

PC_TEST(short_prefixes_are_filtered)
{
    char model[256], dir[300];
    make_model(ENG_ARCH_LLAMA, model, sizeof model);
    new_dir(dir, sizeof dir);
    eng_t *e = open_engine(model, dir, true); /* min_tokens 32 */
    ASSERT_TRUE(e != NULL);
    int32_t tok[24];
    for (int i = 0; i < 24; i++)
        tok[i] = (int32_t)rnd(N_VOCAB);
    cache_and_evict(e, tok, 24);
    eng_tier_stats_t st;
    eng_tier_stats(e, &st);
    ASSERT_EQ(st.write_blocks, 0);
    ASSERT_EQ(st.write_filtered, 1);
    eng_free(e);
    unlink(model);
}

/* The last row's logits of tokens[0..n) in ns: started from the cache and tiers (cached) or
 * from scratch; *o gets the origin. lg[V]. */
static void last_logits(eng_t *e, uint64_t ns, const int32_t *tokens, uint32_t n, bool cached,
                        float *lg, eng_seq_origin_t *o)
{
    eng_seq_t *s;
    uint32_t reused = 0;
    ASSERT_EQ(eng_seq_create(e, &s), 0);
    if (cached)
        ASSERT_EQ(eng_seq_start_cached(e, s, ns, tokens, n, &reused), 0);
    eng_seq_origin(s, o);
    check(e);
    eng_batch_item_t it = {
        .seq = s, .tokens = tokens + reused, .n_tokens = n - reused, .logits = ENG_LOGITS_LAST};
    ASSERT_EQ(eng_forward(e, &it, 1, lg), 0);
    if (!cached)
        ASSERT_EQ(eng_prefix_insert(e, s, ns, n), 0);
    eng_seq_free(e, s);
    check(e);
}

/* The shipped models (models/, generated by the build): the demo model (llama) and the qwen
 * test model, F16 weights, through the disk tier with a hole, against their own cold prefill
 * (F32 GEMMs, so both paths round alike). */
PC_TEST(real_models_through_a_hole)
{
    static const char *models[] = {"models/kvgw-demo.gguf", "models/kvgw-qwen-test.gguf"};
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        if (access(models[mi], R_OK) != 0)
            PC_SKIP("the models/ directory has no generated models");
        char dir[300];
        new_dir(dir, sizeof dir);
        eng_params_t p = eng_params_default();
        p.model_path = models[mi];
        p.kv_dtype = ENG_KV_F32;
        p.kv_block_tokens = BT;
        p.kv_max_tokens = 512;
        p.gemm = ENG_GEMM_F32;
        p.tier.dir = dir;
        p.tier.load_always = true;
        eng_t *e = NULL;
        char err[256];
        ASSERT_EQ(eng_init(&p, &e, err, sizeof err), 0);
        uint32_t nv = eng_n_vocab(e);
        float *ref = malloc((size_t)nv * sizeof *ref), *lg = malloc((size_t)nv * sizeof *lg);
        enum { N = 300 };
        int32_t tok[N], other[480];
        for (uint32_t i = 0; i < N; i++)
            tok[i] = (int32_t)(100 + rnd(1000));
        for (uint32_t i = 0; i < 480; i++)
            other[i] = (int32_t)(100 + rnd(1000));
        eng_seq_origin_t o;
        last_logits(e, 3, tok, N, false, ref, &o);    /* cold, then cached in the pool */
        last_logits(e, 4, other, 480, false, lg, &o); /* pushes it out to disk */
        eng_tier_flush(e);
        eng_kvtier_name_t nm;
        eng__tier_block_name(e, 3, tok, 9, &nm);
        ASSERT_EQ(eng_kvtier_remove(eng__tier_store(e), &nm), 0);
        last_logits(e, 3, tok, N, true, lg, &o);
        ASSERT_EQ(o.g3_tokens, (uint32_t)((N - 1) / BT - 1) * BT);
        ASSERT_EQ(o.recomputed_tokens, (uint32_t)BT);
        double rel = tm_rel_err(lg, ref, 1, nv);
        printf("  %s: hole recomputed, %u tokens loaded, last-row rel err %.2g\n", models[mi],
               o.g3_tokens, rel);
        ASSERT_LE(rel, 1e-3);
        /* The cost model's inputs as measured here, and what they say about one block (the
         * min_tokens rule in tier.h rests on these figures). */
        eng_tier_stats_t st;
        eng_tier_stats(e, &st);
        ASSERT_TRUE(st.load_blocks > 0 && st.prefill_tokens_per_s > 0);
        printf("  %s: load %.1f us/block (%.2f GB/s, %zu-byte blocks), prefill %.0f tokens/s "
               "(%.1f us/block)\n",
               models[mi], (double)st.load_ns / (double)st.load_blocks / 1e3,
               st.load_bytes_per_s / 1e9, eng_kvpool_block_bytes(eng_kvpool(e)),
               st.prefill_tokens_per_s, BT / st.prefill_tokens_per_s * 1e6);
        free(ref);
        free(lg);
        eng_free(e);
    }
}

typedef struct evs {
    int n, with_path;
    const int32_t *want;
} evs_t;

static void on_tier_event(const eng_tier_event_t *ev, void *ud)
{
    evs_t *v = ud;
    v->n++;
    if (ev->tier == ENG_TIER_NONE && ev->ns == 7 && ev->tokens != NULL &&
        memcmp(ev->tokens, v->want, (size_t)ev->n_tokens * sizeof(int32_t)) == 0)
        v->with_path++;
}

PC_TEST(disk_budget_evicts_reports_and_leaves_holes)
{
    char model[256], dir[300];
    make_model(ENG_ARCH_LLAMA, model, sizeof model);
    new_dir(dir, sizeof dir);
    eng_t *e = open_engine(model, dir, true);
    ASSERT_TRUE(e != NULL);
    uint64_t rec = eng_kvtier_record_bytes(eng__tier_store(e), BT);
    eng_free(e);
    /* Room for 6 of the 12 blocks: the first 6 written go (LRU). */
    e = open_engine_budget(model, dir, true, 6 * rec);
    ASSERT_TRUE(e != NULL);
    int32_t tok[N_PROMPT];
    random_tokens(tok, N_PROMPT);
    static float ref[N_PROMPT * N_VOCAB];
    cold(model, tok, N_PROMPT, ref);
    cache_and_evict(e, tok, N_PROMPT);
    eng_tier_stats_t st;
    eng_tier_stats(e, &st);
    ASSERT_EQ(st.write_blocks, (uint64_t)N_WHOLE);
    ASSERT_EQ(st.g3_blocks, 6);
    ASSERT_EQ(st.evictions, 6);
    /* Each dropped block is an event naming its whole prefix, gone from every tier. */
    evs_t v = {.want = tok};
    ASSERT_EQ(eng_tier_poll(e, on_tier_event, &v), 6);
    ASSERT_EQ(v.with_path, 6);
    ASSERT_EQ(eng_tier_poll(e, on_tier_event, &v), 0);
    /* The chain is still listed whole (its first 6 blocks are a hole a read recomputes). */
    listed_t l = {.want = tok};
    ASSERT_EQ(eng_tier_prefixes(e, on_prefix, &l), 1);
    ASSERT_EQ(l.n_tokens, (uint32_t)N_WHOLE * BT);
    ASSERT_TRUE(l.same);
    eng_seq_origin_t o;
    run_check(e, 7, tok, N_PROMPT, ref, &o);
    ASSERT_EQ(o.recomputed_tokens, 6u * BT);
    ASSERT_EQ(o.g3_tokens, 6u * BT);
    eng_free(e);
    unlink(model);
}

PC_TEST(full_staging_queue_drops_and_counts)
{
    char model[256], dir[300];
    make_model(ENG_ARCH_LLAMA, model, sizeof model);
    new_dir(dir, sizeof dir);
    /* Below one block: refused with the reason. */
    ASSERT_TRUE(open_engine_queue(model, dir, 100) == NULL);
    eng_t *e = open_engine_queue(model, dir, 8192); /* one block of this model */
    ASSERT_TRUE(e != NULL);
    int32_t tok[N_PROMPT];
    random_tokens(tok, N_PROMPT);
    int tier = cache_and_evict(e, tok, N_PROMPT); /* 12 blocks leave at once into a queue of one */
    eng_tier_stats_t st;
    eng_tier_stats(e, &st);
    /* Every block was either written or dropped and counted; the queue is empty again. */
    ASSERT_EQ(st.write_blocks + st.write_dropped, (uint64_t)N_WHOLE);
    ASSERT_TRUE(st.write_blocks >= 1);
    ASSERT_EQ(st.queue_bytes, 0);
    ASSERT_EQ(st.g3_blocks, st.write_blocks);
    /* The event says G3 only when nothing was dropped. */
    ASSERT_EQ(tier, st.write_dropped == 0 ? ENG_TIER_G3 : ENG_TIER_NONE);
    eng_free(e);
    unlink(model);
}

#define G2_BLOCK 8192 /* a KV block of the test models (F32, 2 layers) */

typedef struct g2evs {
    int n, g3, none; /* events; of them, with the prefix's path and tier G3 / none */
    const int32_t *want;
} g2evs_t;

static void on_g2_event(const eng_tier_event_t *ev, void *ud)
{
    g2evs_t *v = ud;
    v->n++;
    if (ev->ns != 7 || ev->tokens == NULL ||
        memcmp(ev->tokens, v->want, (size_t)ev->n_tokens * sizeof(int32_t)) != 0)
        return;
    v->g3 += ev->tier == ENG_TIER_G3;
    v->none += ev->tier == ENG_TIER_NONE;
}

PC_TEST(g2_needs_the_disk_tier_and_one_block)
{
    char model[256], dir[300];
    make_model(ENG_ARCH_LLAMA, model, sizeof model);
    new_dir(dir, sizeof dir);
    ASSERT_TRUE(open_engine_g2(model, NULL, 64 * G2_BLOCK) == NULL);
    ASSERT_TRUE(open_engine_g2(model, dir, G2_BLOCK - 1) == NULL);
    eng_t *e = open_engine_g2(model, dir, G2_BLOCK);
    ASSERT_TRUE(e != NULL);
    eng_tier_stats_t st;
    eng_tier_stats(e, &st);
    ASSERT_EQ(st.g2_max_bytes, (uint64_t)G2_BLOCK);
    eng_free(e);
    unlink(model);
}

PC_TEST(evicted_prefix_comes_back_from_g2_with_cold_logits)
{
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        char model[256], dir[300];
        make_model(archs[a], model, sizeof model);
        new_dir(dir, sizeof dir);
        eng_t *e = open_engine_g2(model, dir, 64 * G2_BLOCK);
        ASSERT_TRUE(e != NULL);
        ASSERT_EQ(eng_kvpool_block_bytes(e->kv), (size_t)G2_BLOCK);
        int32_t tok[N_PROMPT];
        random_tokens(tok, N_PROMPT);
        static float ref[N_PROMPT * N_VOCAB];
        cold(model, tok, N_PROMPT, ref);
        int tier = cache_and_evict(e, tok, N_PROMPT);
        ASSERT_EQ(tier, ENG_TIER_G2); /* reported as gone down to host memory */
        eng_tier_stats_t st;
        eng_tier_stats(e, &st);
        ASSERT_EQ(st.g2_write_blocks, (uint64_t)N_WHOLE);
        ASSERT_EQ(st.g2_blocks, (uint64_t)N_WHOLE);
        ASSERT_EQ(st.g2_bytes, (uint64_t)N_WHOLE * G2_BLOCK);
        ASSERT_EQ(st.write_blocks, 0); /* nothing went to the disk */
        ASSERT_EQ(st.g3_blocks, 0);
        /* Listed as held in G2; nothing to read ahead from the disk. */
        listed_t l = {.want = tok};
        ASSERT_EQ(eng_tier_prefixes(e, on_prefix, &l), 1);
        ASSERT_EQ(l.tier, ENG_TIER_G2);
        ASSERT_EQ(l.n_tokens, (uint32_t)N_WHOLE * BT);
        ASSERT_TRUE(l.path_same);
        eng_tier_ticket_t *k = NULL;
        ASSERT_EQ(eng_tier_prefetch(e, 7, tok, N_PROMPT, &k), 0);
        ASSERT_TRUE(k == NULL);
        eng_seq_origin_t o;
        run_check(e, 7, tok, N_PROMPT, ref, &o);
        ASSERT_EQ(o.g1_tokens, 0);
        ASSERT_EQ(o.g2_tokens, (uint32_t)N_WHOLE * BT);
        ASSERT_EQ(o.g3_tokens, 0);
        ASSERT_EQ(o.recomputed_tokens, 0);
        eng_tier_stats(e, &st);
        ASSERT_EQ(st.hit_blocks_g2, (uint64_t)N_WHOLE);
        ASSERT_EQ(st.g2_load_blocks, (uint64_t)N_WHOLE);
        ASSERT_EQ(st.g2_load_bytes, (uint64_t)N_WHOLE * G2_BLOCK);
        ASSERT_EQ(st.load_blocks, 0); /* no disk read */
        ASSERT_TRUE(st.g2_load_bytes_per_s > 0);
        ASSERT_EQ(st.g2_blocks, (uint64_t)N_WHOLE); /* still held, given back after the copy */
        ASSERT_EQ(st.g2_evictions, 0);
        /* Every record was given back: G2 can drop them all. */
        eng_kvtier_name_t nm;
        for (uint32_t i = 0; i < N_WHOLE; i++) {
            eng__tier_block_name(e, 7, tok, i, &nm);
            ASSERT_EQ(eng_kvtier_remove(eng__tier_store_g2(e), &nm), 0);
        }
        g2evs_t v = {.want = tok};
        ASSERT_EQ(eng_tier_poll(e, on_g2_event, &v), N_WHOLE);
        ASSERT_EQ(v.none, N_WHOLE); /* gone from every tier, each with its path */
        eng_free(e);
        unlink(model);
    }
}

PC_TEST(g2_over_budget_spills_to_disk_and_a_later_read_comes_from_there)
{
    char model[256], dir[300];
    make_model(ENG_ARCH_LLAMA, model, sizeof model);
    new_dir(dir, sizeof dir);
    eng_t *e = open_engine_g2(model, dir, 6 * G2_BLOCK); /* room for 6 of the 12 blocks */
    ASSERT_TRUE(e != NULL);
    int32_t tok[N_PROMPT];
    random_tokens(tok, N_PROMPT);
    static float ref[N_PROMPT * N_VOCAB];
    cold(model, tok, N_PROMPT, ref);
    cache_and_evict(e, tok, N_PROMPT);
    eng_tier_stats_t st;
    eng_tier_stats(e, &st);
    ASSERT_EQ(st.g2_write_blocks, (uint64_t)N_WHOLE);
    ASSERT_EQ(st.g2_blocks, 6);
    ASSERT_EQ(st.g2_evictions, 6);
    ASSERT_EQ(st.g2_spilled, 6);
    ASSERT_EQ(st.write_blocks, 6); /* the 6 oldest went down to the disk */
    ASSERT_EQ(st.g3_blocks, 6);
    /* Each block G2 dropped is an event naming its whole prefix, now in G3. */
    g2evs_t v = {.want = tok};
    ASSERT_EQ(eng_tier_poll(e, on_g2_event, &v), 6);
    ASSERT_EQ(v.g3, 6);
    listed_t l = {.want = tok};
    ASSERT_EQ(eng_tier_prefixes(e, on_prefix, &l), 1);
    ASSERT_EQ(l.tier, ENG_TIER_G3); /* not every block in G2 */
    ASSERT_TRUE(l.path_same);
    eng_seq_origin_t o;
    run_check(e, 7, tok, N_PROMPT, ref, &o);
    ASSERT_EQ(o.g3_tokens, 6u * BT); /* blocks 0..5 from the disk */
    ASSERT_EQ(o.g2_tokens, 6u * BT); /* blocks 6..11 from G2 */
    ASSERT_EQ(o.recomputed_tokens, 0);
    eng_tier_stats(e, &st);
    ASSERT_EQ(st.load_blocks, 6);
    ASSERT_EQ(st.hit_blocks_g3, 6);
    ASSERT_EQ(st.hit_blocks_g2, 6);
    eng_free(e);
    unlink(model);
}

PC_TEST(g2_hole_with_later_blocks_on_disk_is_recomputed_alone)
{
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        char model[256], dir[300];
        make_model(archs[a], model, sizeof model);
        new_dir(dir, sizeof dir);
        eng_t *e = open_engine_g2(model, dir, 64 * G2_BLOCK);
        ASSERT_TRUE(e != NULL);
        int32_t tok[N_PROMPT];
        random_tokens(tok, N_PROMPT);
        static float ref[N_PROMPT * N_VOCAB];
        cold(model, tok, N_PROMPT, ref);
        /* Retained: written through to the disk; released and evicted: into G2 as well. */
        cache(e, 7, tok, N_PROMPT, true);
        ASSERT_EQ(eng_prefix_release(e, 7, tok, N_PROMPT), 0);
        evict_all(e);
        eng_tier_stats_t st;
        eng_tier_stats(e, &st);
        ASSERT_EQ(st.g2_blocks, (uint64_t)N_WHOLE);
        ASSERT_EQ(st.g3_blocks, (uint64_t)N_WHOLE);
        /* Blocks 0..4 in G2 only, block 5 in no tier, blocks 6..11 on disk only. */
        eng_kvtier_name_t nm;
        for (uint32_t i = 0; i < N_WHOLE; i++) {
            eng__tier_block_name(e, 7, tok, i, &nm);
            if (i >= 5)
                ASSERT_EQ(eng_kvtier_remove(eng__tier_store_g2(e), &nm), 0);
            if (i <= 5)
                ASSERT_EQ(eng_kvtier_remove(eng__tier_store(e), &nm), 0);
        }
        eng_seq_origin_t o;
        run_check(e, 7, tok, N_PROMPT, ref, &o);
        ASSERT_EQ(o.g2_tokens, 5u * BT);
        ASSERT_EQ(o.recomputed_tokens, (uint32_t)BT);
        ASSERT_EQ(o.g3_tokens, 6u * BT);
        eng_tier_stats(e, &st);
        ASSERT_EQ(st.recomputed_tokens, (uint64_t)BT);
        ASSERT_EQ(st.load_blocks, 6);
        eng_free(e);
        unlink(model);
    }
}

PC_TEST(g2_is_written_down_at_shutdown_and_a_restart_lists_nothing_from_it)
{
    char model[256], dir[300];
    make_model(ENG_ARCH_QWEN3, model, sizeof model);
    new_dir(dir, sizeof dir);
    eng_t *e = open_engine_g2(model, dir, 64 * G2_BLOCK);
    ASSERT_TRUE(e != NULL);
    int32_t tok[N_PROMPT];
    random_tokens(tok, N_PROMPT);
    static float ref[N_PROMPT * N_VOCAB];
    cold(model, tok, N_PROMPT, ref);
    cache_and_evict(e, tok, N_PROMPT);
    eng_tier_stats_t st;
    eng_tier_stats(e, &st);
    ASSERT_EQ(st.g2_blocks, (uint64_t)N_WHOLE);
    ASSERT_EQ(st.g3_blocks, 0);
    eng_free(e); /* the orderly shutdown writes G2's blocks to the disk */

    e = open_engine_g2(model, dir, 64 * G2_BLOCK);
    ASSERT_TRUE(e != NULL);
    eng_tier_stats(e, &st);
    ASSERT_EQ(st.g2_blocks, 0);
    ASSERT_EQ(st.g3_blocks, (uint64_t)N_WHOLE);
    listed_t l = {.want = tok};
    ASSERT_EQ(eng_tier_prefixes(e, on_prefix, &l), 1);
    ASSERT_TRUE(l.same); /* tier G3 */
    eng_seq_origin_t o;
    run_check(e, 7, tok, N_PROMPT, ref, &o);
    ASSERT_EQ(o.g3_tokens, (uint32_t)N_WHOLE * BT);
    ASSERT_EQ(o.g2_tokens, 0);
    eng_free(e);
    unlink(model);
}

PC_TEST(cost_model)
{
    /* 1 ms per block against 1000 tokens/s: 16 tokens take 16 ms, loading wins. */
    ASSERT_TRUE(eng__tier_load_wins(1e6, 1000, 1, 16, 1.0));
    /* 1 ms per block against 1e6 tokens/s: 16 tokens take 16 us, recomputing wins. */
    ASSERT_FALSE(eng__tier_load_wins(1e6, 1e6, 1, 16, 1.0));
    /* Unknown figures: load (it measures them). */
    ASSERT_TRUE(eng__tier_load_wins(0, 1e6, 1, 16, 1.0));
    ASSERT_TRUE(eng__tier_load_wins(1e6, 0, 1, 16, 1.0));
    /* The attention term: the same 16 tokens deep in a long prompt cost ten times the
     * measured rate's; loading wins again. */
    ASSERT_FALSE(eng__tier_load_wins(1e6, 1e5, 1, 16, 1.0));
    ASSERT_TRUE(eng__tier_load_wins(1e6, 1e5, 1, 16, 10.0));
}

PC_TEST_MAIN()
