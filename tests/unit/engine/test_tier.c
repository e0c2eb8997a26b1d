/*
 * test_tier.c — the engine's KV tiers (engine/tier.h) over a real disk store: a prefix evicted
 * from a small pool comes back from the disk tier with the logits of a cold prefill; a hole
 * (one middle block in no tier) is recomputed exactly and alone; a corrupt record is deleted,
 * counted and recomputed; a fresh engine on the same directory (a restart) hits and lists the
 * prefix; two namespaces never share a record; retained prefixes are written through; a
 * prefetch stages the blocks so the start only copies; the cost model picks the cheaper side.
 * The KV accounting (eng_check) holds after every step. Runs on a llama and a qwen3 model.
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

/* An engine whose pool holds 256 tokens (16 blocks), with a disk tier in dir. */
static eng_t *open_engine(const char *model, const char *dir, bool load_always)
{
    eng_params_t p = eng_params_default();
    p.model_path = model;
    p.kv_dtype = ENG_KV_F32;
    p.kv_block_tokens = BT;
    p.kv_max_tokens = 256;
    p.kv_poison = true;
    p.tier.dir = dir;
    p.tier.min_tokens = 32;
    p.tier.load_always = load_always;
    eng_t *e = NULL;
    char err[256];
    if (eng_init(&p, &e, err, sizeof err) != 0)
        fprintf(stderr, "eng_init: %s\n", err);
    return e;
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
        for (uint32_t i = 0; i < N_PROMPT; i++)
            tok[i] = (int32_t)rnd(N_VOCAB);
        static float ref[N_PROMPT * N_VOCAB];
        cold(model, tok, N_PROMPT, ref);
        cache(e, 7, tok, N_PROMPT, false);
        evict_all(e);
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
        for (uint32_t i = 0; i < N_PROMPT; i++)
            tok[i] = (int32_t)rnd(N_VOCAB);
        static float ref[N_PROMPT * N_VOCAB];
        cold(model, tok, N_PROMPT, ref);
        cache(e, 7, tok, N_PROMPT, false);
        evict_all(e);
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
    for (uint32_t i = 0; i < N_PROMPT; i++)
        tok[i] = (int32_t)rnd(N_VOCAB);
    static float ref[N_PROMPT * N_VOCAB];
    cold(model, tok, N_PROMPT, ref);
    cache(e, 7, tok, N_PROMPT, false);
    evict_all(e);
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
    bool same;
    const int32_t *want;
} listed_t;

static void on_prefix(const eng_tier_prefix_t *p, void *ud)
{
    listed_t *l = ud;
    l->n++;
    l->ns = p->ns;
    l->n_tokens = p->n_tokens;
    l->same = p->tier == ENG_TIER_G3 &&
              memcmp(p->tokens, l->want, (size_t)p->n_tokens * sizeof(int32_t)) == 0;
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
        for (uint32_t i = 0; i < N_PROMPT; i++)
            tok[i] = (int32_t)rnd(N_VOCAB);
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

PC_TEST(namespaces_never_share_a_record)
{
    char model[256], dir[300];
    make_model(ENG_ARCH_LLAMA, model, sizeof model);
    new_dir(dir, sizeof dir);
    eng_t *e = open_engine(model, dir, true);
    ASSERT_TRUE(e != NULL);
    int32_t tok[N_PROMPT];
    for (uint32_t i = 0; i < N_PROMPT; i++)
        tok[i] = (int32_t)rnd(N_VOCAB);
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
    for (uint32_t i = 0; i < N_PROMPT; i++)
        tok[i] = (int32_t)rnd(N_VOCAB);
    static float ref[N_PROMPT * N_VOCAB];
    cold(model, tok, N_PROMPT, ref);
    cache(e, 7, tok, N_PROMPT, false);
    evict_all(e);
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
    cache(e, 7, tok, 24, false);
    evict_all(e);
    eng_tier_stats_t st;
    eng_tier_stats(e, &st);
    ASSERT_EQ(st.write_blocks, 0);
    ASSERT_EQ(st.write_filtered, 1);
    eng_free(e);
    unlink(model);
}

PC_TEST(cost_model)
{
    /* 1 ms per block against 1000 tokens/s: 16 tokens take 16 ms, loading wins. */
    ASSERT_TRUE(eng__tier_load_wins(1e6, 1000, 1, 16));
    /* 1 ms per block against 1e6 tokens/s: 16 tokens take 16 us, recomputing wins. */
    ASSERT_FALSE(eng__tier_load_wins(1e6, 1e6, 1, 16));
    /* Unknown figures: load (it measures them). */
    ASSERT_TRUE(eng__tier_load_wins(0, 1e6, 1, 16));
    ASSERT_TRUE(eng__tier_load_wins(1e6, 0, 1, 16));
}

PC_TEST_MAIN()
