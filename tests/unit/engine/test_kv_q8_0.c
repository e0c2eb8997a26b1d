/*
 * test_kv_q8_0.c — the engine with a q8_0 KV cache (kvpool.h's q8_0 layout; the kernels are
 * tested alone in test_attention.c):
 *
 *   - the pool sizes itself from a byte budget with q8_0's bytes per token (34/64 of F16's), and
 *     eng_kv_stats says the tokens it holds; a head size q8_0 cannot hold is refused;
 *   - cached equals cold: a prompt served from a cached prefix (split into other steps, with a
 *     copy-on-write of a partial block) gives bit for bit the KV bytes and the logits of a cold
 *     prefill of the same prompt, on every ISA path this CPU runs;
 *   - each SIMD path's logits against the portable path's, and every path against the F32-KV
 *     reference within the quantization's error (printed).
 *
 * The engine runs F16 weights (the reference the same model in F32) and steps stay under 32 rows
 * and above 1: every product is the same GEMV kernel, whose rows do not depend on the step's
 * other rows, so equal inputs give equal bits whatever the step split.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "engine.h"
#include "engine_internal.h" /* eng_kvpool */
#include "eng_testmodel.h"
#include "kvpool.h"
#include "pc_assert.h"
#include "pc_err.h"
#include "pc_test.h"

#define N_VOCAB 300

static uint32_t rng_state = 777;
static int32_t rnd_token(void)
{
    rng_state = rng_state * 1103515245u + 12345u;
    return (int32_t)((rng_state >> 8) % N_VOCAB);
}

/* llama with head size 32 (GQA 4/2) or qwen2 with head size 64 (biases, NEOX rope). */
static void make_model_t(enum eng_arch arch, uint32_t head_dim, uint32_t dtype, char *path,
                         size_t len)
{
    eng_mkmodel_params_t p = eng_mkmodel_params_default();
    p.arch = arch;
    p.n_layer = 2;
    p.n_embd = 128;
    p.n_head = 128 / head_dim;
    p.n_head_kv = arch == ENG_ARCH_LLAMA ? p.n_head / 2 : p.n_head;
    p.n_ff = 192;
    p.n_ctx = 4096;
    p.dtype = dtype;
    p.tied = arch != ENG_ARCH_LLAMA;
    p.rope_theta = 10000.0f;
    p.seed = 11;
    char err[256];
    if (tm_make(&p, N_VOCAB, path, len, err, sizeof err) != 0) {
        fprintf(stderr, "mkmodel: %s\n", err);
        abort();
    }
}

static void make_model(enum eng_arch arch, uint32_t head_dim, char *path, size_t len)
{
    make_model_t(arch, head_dim, ENG_GGML_TYPE_F32, path, len);
}

static eng_t *open_engine(const char *path, enum eng_kv_dtype kv, const char *isa)
{
    eng_params_t p = eng_params_default();
    p.model_path = path;
    p.kv_dtype = kv;
    p.kv_max_tokens = 1024;
    p.max_batch_tokens = 16; /* every step through the GEMV (below 32 rows) */
    p.kv_poison = true;
    p.cpu_isa = isa;
    p.gemm = ENG_GEMM_F32;
    eng_t *e = NULL;
    char err[256];
    if (eng_init(&p, &e, err, sizeof err) != 0)
        fprintf(stderr, "eng_init: %s\n", err);
    return e;
}

/* Runs toks[0..n) in steps of `step` tokens (ALL logits) on a new sequence started from the
 * cache of ns; *reused gets what the cache gave. The sequence is returned (caller frees). */
static eng_seq_t *run(eng_t *e, uint64_t ns, const int32_t *toks, uint32_t n, uint32_t step,
                      float *lg, uint32_t *reused)
{
    eng_seq_t *s = NULL;
    if (eng_seq_create(e, &s) != 0)
        return NULL;
    uint32_t r = 0;
    if (ns != 0 && eng_seq_start_cached(e, s, ns, toks, n, &r) != 0)
        return NULL;
    for (uint32_t i = r; i < n; i += step) {
        uint32_t k = PC_MIN(step, n - i);
        if (k == 1 && i > r) /* never a one-row step: M = 1 has its own GEMV kernel */
            k = 2, i--;
        eng_batch_item_t it = {
            .seq = s, .tokens = toks + i, .n_tokens = k, .logits = ENG_LOGITS_ALL};
        if (eng_forward(e, &it, 1, lg + (size_t)i * N_VOCAB) != 0)
            return NULL;
    }
    *reused = r;
    return s;
}

/* The first n positions' K and V bytes of two sequences, every layer and KV head. */
static void same_kv_bytes(eng_t *e, const eng_seq_t *a, const eng_seq_t *b, uint32_t n)
{
    eng_kvpool_t *pool = eng_kvpool(e);
    const eng_hparams_t *hp = eng_hparams(e);
    uint32_t bt = eng_kvpool_block_tokens(pool);
    size_t rb = eng_kvpool_row_bytes(pool);
    for (uint32_t p = 0; p < n; p++)
        for (uint32_t l = 0; l < hp->n_layer; l++)
            for (uint32_t h = 0; h < hp->n_head_kv; h++) {
                const uint8_t *ka = eng_kvpool_kv(pool, a->kv.blocks[p / bt], l, h);
                const uint8_t *kb = eng_kvpool_kv(pool, b->kv.blocks[p / bt], l, h);
                uint32_t slot = p % bt;
                if (memcmp(ka + slot * rb, kb + slot * rb, rb) != 0 ||
                    memcmp(ka + (bt + slot) * rb, kb + (bt + slot) * rb, rb) != 0)
                    fprintf(stderr, "  KV of position %u layer %u head %u differs\n", p, l, h);
                ASSERT_TRUE(memcmp(ka + slot * rb, kb + slot * rb, rb) == 0);
                ASSERT_TRUE(memcmp(ka + (bt + slot) * rb, kb + (bt + slot) * rb, rb) == 0);
            }
}

PC_TEST(pool_sizes_itself_from_bytes)
{
    /* 34/64 of F16's bytes per token: a byte budget holds 64/34 as many positions. */
    eng_kvpool_params_t kp = eng_kvpool_params_default();
    kp.max_bytes = 64u << 20;
    eng_kvpool_t *f16 = NULL, *q8 = NULL;
    ASSERT_EQ(eng_kvpool_init(&kp, 8, 4, 128, &f16), 0);
    kp.dtype = ENG_KV_Q8_0;
    ASSERT_EQ(eng_kvpool_init(&kp, 8, 4, 128, &q8), 0);
    size_t b16 = eng_kvpool_block_bytes(f16), b8 = eng_kvpool_block_bytes(q8);
    ASSERT_EQ(b16, (size_t)8 * 4 * 2 * 16 * 128 * 2);
    ASSERT_EQ(b8 * 64, b16 * 34);
    ASSERT_EQ(eng_kvpool_row_bytes(q8), 4 * 34);
    ASSERT_EQ(eng_kvpool_n_blocks(f16), (64u << 20) / b16);
    ASSERT_EQ(eng_kvpool_n_blocks(q8), (64u << 20) / b8);
    ASSERT_TRUE(eng_kvpool_n_blocks(q8) * 34 >= eng_kvpool_n_blocks(f16) * 64 - 64);
    ASSERT_EQ(eng_kvpool_block_bytes_for(ENG_KV_Q8_0, 16, 8, 4, 128), b8);
    eng_kvpool_free(f16);
    eng_kvpool_free(q8);
    /* A head size that is not a multiple of 32, an unknown dtype: refused, nothing made. */
    eng_kvpool_t *bad = NULL;
    ASSERT_EQ(eng_kvpool_init(&kp, 8, 4, 48, &bad), PC_ERR_INVAL);
    ASSERT_TRUE(bad == NULL);
    ASSERT_EQ(eng_kvpool_block_bytes_for(ENG_KV_Q8_0, 16, 8, 4, 48), 0);
    kp.dtype = (enum eng_kv_dtype)7;
    ASSERT_EQ(eng_kvpool_init(&kp, 8, 4, 128, &bad), PC_ERR_INVAL);

    /* The engine: bytes per token and the tokens the pool holds, from a byte budget. */
    char path[256];
    make_model(ENG_ARCH_LLAMA, 32, path, sizeof path);
    eng_kv_stats_t st[2];
    for (size_t i = 0; i < 2; i++) {
        eng_params_t p = eng_params_default();
        p.model_path = path;
        p.kv_dtype = i == 0 ? ENG_KV_F16 : ENG_KV_Q8_0;
        p.kv_max_tokens = 0;
        p.kv_max_bytes = 1u << 20;
        eng_t *e = NULL;
        char err[256];
        ASSERT_EQ(eng_init(&p, &e, err, sizeof err), 0);
        eng_kv_stats(e, &st[i]);
        ASSERT_EQ(st[i].dtype, p.kv_dtype);
        ASSERT_EQ(st[i].capacity_tokens, (uint64_t)st[i].n_blocks * st[i].block_tokens);
        ASSERT_EQ(st[i].bytes_per_token, st[i].block_bytes / st[i].block_tokens);
        eng_free(e);
    }
    ASSERT_EQ(st[0].bytes_per_token, 2u * 2 * 2 * 32 * 2); /* 2 layers, 2 KV heads, hd 32 */
    ASSERT_EQ(st[1].bytes_per_token * 64, st[0].bytes_per_token * 34);
    fprintf(stderr, "  1 MiB holds %llu f16 positions, %llu q8_0 positions\n",
            (unsigned long long)st[0].capacity_tokens, (unsigned long long)st[1].capacity_tokens);
    ASSERT_TRUE(st[1].capacity_tokens * 34 >= st[0].capacity_tokens * 64 - 64 * 16);
    unlink(path);

    /* A model whose head size q8_0 cannot hold is refused with the reason. */
    eng_mkmodel_params_t mp = eng_mkmodel_params_default();
    mp.n_layer = 1, mp.n_embd = 96, mp.n_head = 2, mp.n_head_kv = 2, mp.n_ff = 64, mp.seed = 3;
    char err[256];
    ASSERT_EQ(tm_make(&mp, N_VOCAB, path, sizeof path, err, sizeof err), 0);
    eng_params_t p = eng_params_default();
    p.model_path = path;
    p.kv_dtype = ENG_KV_Q8_0;
    eng_t *e = NULL;
    ASSERT_EQ(eng_init(&p, &e, err, sizeof err), PC_ERR_UNSUPPORTED);
    ASSERT_TRUE(e == NULL && strstr(err, "multiple of 32") != NULL);
    p.kv_dtype = (enum eng_kv_dtype)9;
    ASSERT_EQ(eng_init(&p, &e, err, sizeof err), PC_ERR_INVAL);
    unlink(path);
}

PC_TEST(kv_dtype_names)
{
    static const char *const names[] = {"f16", "f32", "q8_0"};
    for (size_t i = 0; i < PC_ARRAY_LEN(names); i++) {
        enum eng_kv_dtype t = ENG_KV_F32;
        ASSERT_EQ(eng_kv_dtype_parse(names[i], &t), 0);
        ASSERT_STR_EQ(eng_kv_dtype_name(t), names[i]);
    }
    enum eng_kv_dtype t = ENG_KV_F32;
    ASSERT_EQ(eng_kv_dtype_parse("q8", &t), PC_ERR_INVAL);
    ASSERT_EQ(eng_kv_dtype_parse("Q8_0", &t), PC_ERR_INVAL);
    ASSERT_EQ(eng_kv_dtype_parse(NULL, &t), PC_ERR_INVAL);
    ASSERT_EQ(t, ENG_KV_F32);
}

PC_TEST(cached_equals_cold)
{
    static const char *const isas[] = {"portable", "avx512", "avx2"}; /* portable first */
    static const struct {
        enum eng_arch arch;
        uint32_t hd;
    } models[] = {{ENG_ARCH_LLAMA, 32}, {ENG_ARCH_QWEN2, 64}};
    enum { N = 90, CACHED = 41 };
    int32_t toks[N];
    for (int i = 0; i < N; i++)
        toks[i] = rnd_token();
    for (size_t m = 0; m < PC_ARRAY_LEN(models); m++) {
        char path[256], p32[256];
        make_model(models[m].arch, models[m].hd, p32, sizeof p32);
        make_model_t(models[m].arch, models[m].hd, ENG_GGML_TYPE_F16, path, sizeof path);
        float *ref = malloc((size_t)N * N_VOCAB * sizeof *ref);
        ASSERT_EQ(tm_reference(p32, toks, N, ref), 0);
        float *port = NULL;
        for (size_t ii = 0; ii < PC_ARRAY_LEN(isas); ii++) {
            eng_cpu_isa_t v;
            if (eng__cpu_isa_parse(isas[ii], &v) != 0 || !eng__cpu_isa_runs(v))
                continue;
            eng_t *e = open_engine(path, ENG_KV_Q8_0, isas[ii]);
            ASSERT_TRUE(e != NULL);
            float *cold = malloc((size_t)N * N_VOCAB * sizeof *cold);
            float *warm = malloc((size_t)N * N_VOCAB * sizeof *warm);
            uint32_t reused;
            /* Cold: the whole prompt in steps of 16. */
            eng_seq_t *a = run(e, 0, toks, N, 16, cold, &reused);
            ASSERT_TRUE(a != NULL);
            /* The prefix in steps of 7 (other step boundaries), cached mid-block. */
            eng_seq_t *b = run(e, 0, toks, CACHED, 7, warm, &reused);
            ASSERT_TRUE(b != NULL);
            ASSERT_EQ(eng_prefix_insert(e, b, 5, CACHED), 0);
            eng_seq_free(e, b);
            /* Warm: from the cache (a copy-on-write of the partial block), the rest in 13s. */
            eng_seq_t *c = run(e, 5, toks, N, 13, warm, &reused);
            ASSERT_TRUE(c != NULL);
            ASSERT_EQ(reused, CACHED);
            PC_TEST_CALL(same_kv_bytes(e, a, c, N));
            ASSERT_TRUE(memcmp(cold + (size_t)CACHED * N_VOCAB, warm + (size_t)CACHED * N_VOCAB,
                               (size_t)(N - CACHED) * N_VOCAB * sizeof(float)) == 0);
            double rel = tm_rel_err(cold, ref, N, N_VOCAB);
            fprintf(stderr, "  %s hd %u %s: q8_0 KV vs the F32 reference: rel err %g\n",
                    models[m].arch == ENG_ARCH_LLAMA ? "llama" : "qwen2", models[m].hd, isas[ii],
                    rel);
            ASSERT_LE(rel, 5e-2);
            if (port != NULL) {
                double d = tm_rel_err(cold, port, N, N_VOCAB);
                fprintf(stderr, "    vs portable: rel %g\n", d);
                ASSERT_LE(d, 5e-3);
            }
            char err[256];
            eng_seq_free(e, a);
            eng_seq_free(e, c);
            ASSERT_EQ(eng_check(e, err, sizeof err), 0);
            eng_free(e);
            free(warm);
            if (port == NULL)
                port = cold; /* the portable run's: the SIMD paths are compared with it */
            else
                free(cold);
        }
        free(port);
        free(ref);
        unlink(path);
        unlink(p32);
    }
}

PC_TEST_MAIN()
