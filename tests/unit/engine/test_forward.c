/*
 * test_forward.c — the engine's forward pass against a naive double-precision reference
 * (eng_testmodel.h), per architecture: llama (Llama 3.1 rope factors, separate output head),
 * qwen2 (q/k/v biases, NEOX rope, tied embeddings, no GQA) and qwen3 (per-head q/k norms).
 *
 * With F32 weights and F32 KV the logits of every position match within 1e-4 relative, on the
 * SIMD and the portable kernels, with KV blocks of 16 and of 8 tokens, in one prefill or in
 * chunks and single decode tokens, and for a batch of sequences mixed in one step (each equal to
 * the same sequence run alone). Unwritten KV slots are NaN (kv_poison), so a stray read fails.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "engine.h"
#include "engine_internal.h" /* eng_kvpool */
#include "model.h"
#include "pc_pages.h"
#include "eng_testmodel.h"
#include "pc_err.h"
#include "pc_test.h"

#define N_VOCAB 300

typedef struct arch_case {
    const char *name;
    enum eng_arch arch;
    uint32_t n_embd, n_head, n_head_kv, n_ff;
    bool tied, rope_freqs;
} arch_case_t;

static const arch_case_t cases[] = {
    {"llama", ENG_ARCH_LLAMA, 128, 4, 2, 200, false, true},
    {"qwen2", ENG_ARCH_QWEN2, 64, 4, 4, 160, true, false},
    {"qwen3", ENG_ARCH_QWEN3, 128, 8, 2, 192, false, false},
};

static uint32_t rng_state = 12345;
static int32_t rnd_token(void)
{
    rng_state = rng_state * 1103515245u + 12345u;
    return (int32_t)((rng_state >> 8) % N_VOCAB);
}

static void make_model(const arch_case_t *c, uint32_t dtype, char *path, size_t len)
{
    eng_mkmodel_params_t p = eng_mkmodel_params_default();
    p.arch = c->arch;
    p.n_layer = 2;
    p.n_embd = c->n_embd;
    p.n_head = c->n_head;
    p.n_head_kv = c->n_head_kv;
    p.n_ff = c->n_ff;
    p.n_ctx = 4096;
    p.dtype = dtype;
    p.tied = c->tied;
    p.rope_freqs = c->rope_freqs;
    p.rope_theta = 10000.0f;
    p.seed = 7;
    char err[256];
    int rc = tm_make(&p, N_VOCAB, path, len, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "mkmodel failed: %s\n", err);
        abort();
    }
}

/* The CPU kernel paths, highest first; tests run each one this CPU runs. */
static const char *const isas[] = {"avx512", "avx2", "portable"};
#define N_ISAS 3

static bool isa_runs(const char *isa)
{
    eng_cpu_isa_t v;
    return eng__cpu_isa_parse(isa, &v) == 0 && eng__cpu_isa_runs(v);
}

static eng_t *open_engine(const char *path, enum eng_kv_dtype kv, uint32_t bt, uint32_t batch,
                          const char *isa)
{
    eng_params_t p = eng_params_default();
    p.model_path = path;
    p.kv_dtype = kv;
    p.kv_block_tokens = bt;
    p.kv_max_tokens = 4096;
    p.max_batch_tokens = batch;
    p.kv_poison = true;
    p.cpu_isa = isa;
    eng_t *e = NULL;
    char err[256];
    int rc = eng_init(&p, &e, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "eng_init: %s\n", err);
    else if (strcmp(eng_cpu_isa_name_of(e), isa) != 0)
        fprintf(stderr, "eng_init: path %s, not %s\n", eng_cpu_isa_name_of(e), isa);
    return e != NULL && strcmp(eng_cpu_isa_name_of(e), isa) == 0 ? e : NULL;
}

/* One prefill of n tokens with every position's logits, against the reference. */
static void check_prefill(const char *path, const float *ref, const int32_t *toks, uint32_t n,
                          uint32_t bt, uint32_t batch, const char *isa)
{
    eng_t *e = open_engine(path, ENG_KV_F32, bt, batch, isa);
    ASSERT_TRUE(e != NULL);
    uint32_t V = eng_n_vocab(e);
    float *lg = malloc((size_t)n * V * sizeof *lg);
    eng_seq_t *s;
    ASSERT_EQ(eng_seq_create(e, &s), 0);
    eng_batch_item_t it = {.seq = s, .tokens = toks, .n_tokens = n, .logits = ENG_LOGITS_ALL};
    ASSERT_EQ(eng_forward(e, &it, 1, lg), 0);
    ASSERT_EQ(eng_seq_n_tokens(s), n);
    double err = tm_rel_err(lg, ref, n, V);
    if (!(err <= 1e-4))
        fprintf(stderr, "  bt=%u batch=%u isa=%s: rel err %g\n", bt, batch, isa, err);
    ASSERT_LE(err, 1e-4);
    char msg[256];
    ASSERT_EQ(eng_check(e, msg, sizeof msg), 0);
    eng_seq_free(e, s);
    ASSERT_EQ(eng_check(e, msg, sizeof msg), 0);
    ASSERT_EQ(eng_kvpool_n_free(eng_kvpool(e)), eng_kvpool_n_blocks(eng_kvpool(e)));
    eng_free(e);
    free(lg);
}

/* Prefill in two chunks (LAST logits only), then one decode token at a time. */
static void check_decode(const char *path, const float *ref, const int32_t *toks, uint32_t n,
                         const char *isa)
{
    eng_t *e = open_engine(path, ENG_KV_F32, 16, 512, isa);
    ASSERT_TRUE(e != NULL);
    uint32_t V = eng_n_vocab(e);
    float *lg = malloc((size_t)V * sizeof *lg);
    eng_seq_t *s;
    ASSERT_EQ(eng_seq_create(e, &s), 0);
    uint32_t p1 = 13, p2 = 21;
    eng_batch_item_t it = {.seq = s, .tokens = toks, .n_tokens = p1, .logits = ENG_LOGITS_LAST};
    ASSERT_EQ(eng_forward(e, &it, 1, lg), 0);
    ASSERT_LE(tm_rel_err(lg, ref + (size_t)(p1 - 1) * V, 1, V), 1e-4);
    it = (eng_batch_item_t){
        .seq = s, .tokens = toks + p1, .n_tokens = p2 - p1, .logits = ENG_LOGITS_LAST};
    ASSERT_EQ(eng_forward(e, &it, 1, lg), 0);
    ASSERT_LE(tm_rel_err(lg, ref + (size_t)(p2 - 1) * V, 1, V), 1e-4);
    for (uint32_t i = p2; i < n; i++) {
        it = (eng_batch_item_t){
            .seq = s, .tokens = toks + i, .n_tokens = 1, .logits = ENG_LOGITS_LAST};
        ASSERT_EQ(eng_forward(e, &it, 1, lg), 0);
        ASSERT_LE(tm_rel_err(lg, ref + (size_t)i * V, 1, V), 1e-4);
    }
    eng_seq_free(e, s);
    eng_free(e);
    free(lg);
}

static void run_arch(const arch_case_t *c)
{
    char path[256];
    make_model(c, ENG_GGML_TYPE_F32, path, sizeof path);
    enum { N = 45 };
    int32_t toks[N];
    for (int i = 0; i < N; i++)
        toks[i] = rnd_token();
    float *ref = malloc((size_t)N * N_VOCAB * sizeof *ref);
    ASSERT_EQ(tm_reference(path, toks, N, ref), 0);
    for (int i = 0; i < N_ISAS; i++) {
        if (!isa_runs(isas[i])) {
            fprintf(stderr, "  isa %s: not run (this CPU cannot)\n", isas[i]);
            continue;
        }
        PC_TEST_CALL(check_prefill(path, ref, toks, N, 16, 512, isas[i]));
        PC_TEST_CALL(check_prefill(path, ref, toks, N, 8, 512, isas[i]));
        PC_TEST_CALL(check_prefill(path, ref, toks, N, 16, 7, isas[i])); /* steps of <= 7 */
        PC_TEST_CALL(check_decode(path, ref, toks, N, isas[i]));
    }
    free(ref);
    unlink(path);
}

PC_TEST(reference_llama)
{
    PC_TEST_CALL(run_arch(&cases[0]));
}
PC_TEST(reference_qwen2)
{
    PC_TEST_CALL(run_arch(&cases[1]));
}
PC_TEST(reference_qwen3)
{
    PC_TEST_CALL(run_arch(&cases[2]));
}

/* A batch of N different sequences in one step equals each sequence alone. */
PC_TEST(batch_equals_alone)
{
    char path[256];
    make_model(&cases[0], ENG_GGML_TYPE_F32, path, sizeof path);
    enum { NS = 4, LEN = 40 };
    int32_t toks[NS][LEN];
    float *ref[NS];
    for (int s = 0; s < NS; s++) {
        for (int i = 0; i < LEN; i++)
            toks[s][i] = rnd_token();
        ref[s] = malloc((size_t)LEN * N_VOCAB * sizeof(float));
        ASSERT_EQ(tm_reference(path, toks[s], LEN, ref[s]), 0);
    }
    eng_t *e = open_engine(path, ENG_KV_F32, 16, 64, eng__cpu_isa_name(eng__cpu_isa_best()));
    ASSERT_TRUE(e != NULL);
    eng_seq_t *seq[NS];
    for (int s = 0; s < NS; s++)
        ASSERT_EQ(eng_seq_create(e, &seq[s]), 0);
    /* Three rounds of mixed items: (start, length) per sequence and round; 0 = absent. */
    static const uint32_t plan[3][NS][2] = {
        {{0, 20}, {0, 7}, {0, 0}, {0, 1}},
        {{20, 1}, {7, 10}, {0, 33}, {1, 1}},
        {{21, 19}, {17, 23}, {33, 7}, {2, 38}},
    };
    float *lg = malloc((size_t)NS * LEN * N_VOCAB * sizeof *lg);
    for (int round = 0; round < 3; round++) {
        eng_batch_item_t items[NS];
        uint32_t n = 0;
        for (int s = 0; s < NS; s++) {
            if (plan[round][s][1] == 0)
                continue;
            items[n++] = (eng_batch_item_t){.seq = seq[s],
                                            .tokens = toks[s] + plan[round][s][0],
                                            .n_tokens = plan[round][s][1],
                                            .logits = ENG_LOGITS_ALL};
        }
        ASSERT_EQ(eng_forward(e, items, n, lg), 0);
        size_t row = 0;
        for (int s = 0; s < NS; s++) {
            for (uint32_t j = 0; j < plan[round][s][1]; j++, row++) {
                uint32_t pos = plan[round][s][0] + j;
                double err =
                    tm_rel_err(lg + row * N_VOCAB, ref[s] + (size_t)pos * N_VOCAB, 1, N_VOCAB);
                if (!(err <= 1e-4))
                    fprintf(stderr, "  round %d seq %d pos %u: %g\n", round, s, pos, err);
                ASSERT_LE(err, 1e-4);
            }
        }
        char msg[256];
        ASSERT_EQ(eng_check(e, msg, sizeof msg), 0);
    }
    for (int s = 0; s < NS; s++) {
        ASSERT_EQ(eng_seq_n_tokens(seq[s]), LEN);
        eng_seq_free(e, seq[s]);
        free(ref[s]);
    }
    eng_free(e);
    free(lg);
    unlink(path);
}

/* F16 weights and F16 KV (the defaults) stay close to the F32 reference of the same weights,
 * and converting F16 weights to F32 at load changes nothing beyond rounding. */
PC_TEST(f16_weights_and_kv)
{
    char p32[256], p16[256];
    make_model(&cases[2], ENG_GGML_TYPE_F32, p32, sizeof p32);
    make_model(&cases[2], ENG_GGML_TYPE_F16, p16, sizeof p16);
    enum { N = 60 };
    int32_t toks[N];
    for (int i = 0; i < N; i++)
        toks[i] = rnd_token();
    float *ref = malloc((size_t)N * N_VOCAB * sizeof *ref);
    ASSERT_EQ(tm_reference(p32, toks, N, ref), 0);
    for (int ii = 0; ii < N_ISAS; ii++) {
        if (!isa_runs(isas[ii]))
            continue;
        float *lg[2];
        for (int conv = 0; conv < 2; conv++) {
            eng_params_t p = eng_params_default();
            p.model_path = p16;
            p.cpu_isa = isas[ii];
            p.weights_f32 = conv == 1;
            p.gemm = ENG_GEMM_F32; /* exact products: only the conversion differs */
            p.kv_poison = true;
            eng_t *e = NULL;
            char err[256];
            ASSERT_EQ(eng_init(&p, &e, err, sizeof err), 0);
            eng_seq_t *s;
            ASSERT_EQ(eng_seq_create(e, &s), 0);
            lg[conv] = malloc((size_t)N * N_VOCAB * sizeof(float));
            /* Prefill 33 (through the converted-tile sgemm), a chunk of 17 (the F16 GEMV on row
             * groups of 8, 8 and 1), then decode (the F16 GEMV on one row). */
            eng_batch_item_t it = {
                .seq = s, .tokens = toks, .n_tokens = 33, .logits = ENG_LOGITS_ALL};
            ASSERT_EQ(eng_forward(e, &it, 1, lg[conv]), 0);
            it = (eng_batch_item_t){
                .seq = s, .tokens = toks + 33, .n_tokens = 17, .logits = ENG_LOGITS_ALL};
            ASSERT_EQ(eng_forward(e, &it, 1, lg[conv] + (size_t)33 * N_VOCAB), 0);
            for (int i = 50; i < N; i++) {
                it = (eng_batch_item_t){
                    .seq = s, .tokens = toks + i, .n_tokens = 1, .logits = ENG_LOGITS_ALL};
                ASSERT_EQ(eng_forward(e, &it, 1, lg[conv] + (size_t)i * N_VOCAB), 0);
            }
            double rel = tm_rel_err(lg[conv], ref, N, N_VOCAB);
            fprintf(stderr, "  f16 %s (weights_f32=%d): rel err vs f32 reference %g\n", isas[ii],
                    conv, rel);
            ASSERT_LE(rel, 2e-2);
            eng_seq_free(e, s);
            eng_free(e);
        }
        ASSERT_LE(tm_rel_err(lg[0], lg[1], N, N_VOCAB), 1e-4);
        free(lg[0]), free(lg[1]);
    }
    free(ref);
    unlink(p32);
    unlink(p16);
}

/* BF16 and Q8_0 weights are kept as stored (decode reads 2 and 1.06 bytes per weight) and give
 * the logits of the same model converted to F32 at load (weights_f32) on every path: prefill 33
 * (tiles converted to F32; Q8_0: the integer GEMM), a chunk of 17 (the GEMV on row groups), then
 * decode (the GEMV on one row): BF16 within the products' rounding, Q8_0 within the rounding of
 * its activations to Q8_0 blocks (as llama.cpp's products take them; test_forward_quant.c derives
 * 0.06 for it). */
PC_TEST(bf16_and_q8_0_weights_native)
{
    const uint32_t types[] = {ENG_GGML_TYPE_BF16, ENG_GGML_TYPE_Q8_0};
    enum { N = 60 };
    int32_t toks[N];
    for (int i = 0; i < N; i++)
        toks[i] = rnd_token();
    for (size_t ti = 0; ti < 2; ti++) {
        char path[256];
        make_model(&cases[2], types[ti], path, sizeof path);
        eng_model_params_t mp = eng_model_params_default();
        eng_model_t *m;
        char err[256];
        for (int conv = 0; conv < 2; conv++) {
            mp.weights_f32 = conv == 1;
            ASSERT_EQ(eng_model_load(path, &mp, &m, err, sizeof err), 0);
            ASSERT_EQ(m->layers[1].w_down.type, conv ? ENG_GGML_TYPE_F32 : types[ti]);
            ASSERT_EQ(m->layers[1].w_down.file_type, types[ti]);
            eng_model_free(m);
        }
        for (int ii = 0; ii < N_ISAS; ii++) {
            if (!isa_runs(isas[ii]))
                continue;
            float *lg[2];
            for (int conv = 0; conv < 2; conv++) {
                eng_params_t p = eng_params_default();
                p.model_path = path;
                p.cpu_isa = isas[ii];
                p.weights_f32 = conv == 1;
                p.gemm = ENG_GEMM_F32;
                p.kv_dtype = ENG_KV_F32;
                p.kv_poison = true;
                eng_t *e = NULL;
                ASSERT_EQ(eng_init(&p, &e, err, sizeof err), 0);
                eng_seq_t *s;
                ASSERT_EQ(eng_seq_create(e, &s), 0);
                lg[conv] = malloc((size_t)N * N_VOCAB * sizeof(float));
                eng_batch_item_t it = {
                    .seq = s, .tokens = toks, .n_tokens = 33, .logits = ENG_LOGITS_ALL};
                ASSERT_EQ(eng_forward(e, &it, 1, lg[conv]), 0);
                it = (eng_batch_item_t){
                    .seq = s, .tokens = toks + 33, .n_tokens = 17, .logits = ENG_LOGITS_ALL};
                ASSERT_EQ(eng_forward(e, &it, 1, lg[conv] + (size_t)33 * N_VOCAB), 0);
                for (int i = 50; i < N; i++) {
                    it = (eng_batch_item_t){
                        .seq = s, .tokens = toks + i, .n_tokens = 1, .logits = ENG_LOGITS_ALL};
                    ASSERT_EQ(eng_forward(e, &it, 1, lg[conv] + (size_t)i * N_VOCAB), 0);
                }
                eng_seq_free(e, s);
                eng_free(e);
            }
            double rel = tm_rel_err(lg[0], lg[1], N, N_VOCAB);
            fprintf(stderr, "  %s %s: native vs converted rel err %g\n",
                    eng_ggml_type_name(types[ti]), isas[ii], rel);
            ASSERT_LE(rel, types[ti] == ENG_GGML_TYPE_Q8_0 ? 0.06 : 1e-4);
            free(lg[0]), free(lg[1]);
        }
        unlink(path);
    }
}

/* copy_weights: the matrices read whole per token live in copies equal to the file's bytes (on
 * huge pages), the untied embedding table stays in the mapping; forward results are the same
 * (the F16 test above and the reference tests run with copies, the default). */
PC_TEST(weight_copies_equal_the_file)
{
    char path[256];
    make_model(&cases[0], ENG_GGML_TYPE_F16, path, sizeof path); /* llama: untied head */
    eng_model_params_t mp[2] = {eng_model_params_default(), eng_model_params_default()};
    mp[0].copy_weights = false;
    mp[1].copy_weights = true;
    eng_model_t *m[2];
    char err[256];
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(eng_model_load(path, &mp[i], &m[i], err, sizeof err), 0);
    bool copies = pc_pages_huge_available();
    const eng_gguf_tensor_t *emb = eng_gguf_tensor_find(m[1]->_gguf, "token_embd.weight");
    const eng_gguf_tensor_t *out = eng_gguf_tensor_find(m[1]->_gguf, "output.weight");
    ASSERT_TRUE(emb != NULL && out != NULL);
    ASSERT_TRUE(m[1]->tok_embd.data == emb->data); /* gathered by row: never copied */
    ASSERT_EQ(m[1]->output.data == out->data, !copies);
    ASSERT_TRUE(m[0]->output.data == eng_gguf_tensor_find(m[0]->_gguf, "output.weight")->data);
    for (uint32_t l = 0; l < m[0]->hp.n_layer; l++) {
        const eng_weight_t *a[] = {&m[0]->layers[l].wq,     &m[0]->layers[l].wk,
                                   &m[0]->layers[l].wv,     &m[0]->layers[l].wo,
                                   &m[0]->layers[l].w_gate, &m[0]->layers[l].w_up,
                                   &m[0]->layers[l].w_down, &m[0]->output};
        const eng_weight_t *b[] = {&m[1]->layers[l].wq,     &m[1]->layers[l].wk,
                                   &m[1]->layers[l].wv,     &m[1]->layers[l].wo,
                                   &m[1]->layers[l].w_gate, &m[1]->layers[l].w_up,
                                   &m[1]->layers[l].w_down, &m[1]->output};
        for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) {
            ASSERT_EQ(a[i]->type, ENG_GGML_TYPE_F16);
            ASSERT_EQ(b[i]->type, a[i]->type);
            ASSERT_EQ(b[i]->n_in, a[i]->n_in);
            ASSERT_EQ(b[i]->n_out, a[i]->n_out);
            if (copies)
                ASSERT_EQ((uintptr_t)b[i]->data % 64, 0);
            ASSERT_MEM_EQ(a[i]->data, b[i]->data, (size_t)a[i]->n_in * a[i]->n_out * 2);
        }
    }
    ASSERT_EQ(eng_model_weight_bytes(m[0]), eng_model_weight_bytes(m[1]));
    eng_model_free(m[0]);
    eng_model_free(m[1]);
    unlink(path);
}

/* The BF16 GEMM (prefill on CPUs with AVX512-BF16) stays close to the reference, and a step
 * computed in BF16 then continued in F32 (decode rows) is consistent. */
PC_TEST(bf16_gemm)
{
    char path[256];
    make_model(&cases[0], ENG_GGML_TYPE_F16, path, sizeof path);
    char p32[256];
    make_model(&cases[0], ENG_GGML_TYPE_F32, p32, sizeof p32);
    enum { N = 40 };
    int32_t toks[N];
    for (int i = 0; i < N; i++)
        toks[i] = rnd_token();
    float *ref = malloc((size_t)N * N_VOCAB * sizeof *ref);
    ASSERT_EQ(tm_reference(p32, toks, N, ref), 0);
    eng_params_t p = eng_params_default();
    p.model_path = path;
    p.gemm = ENG_GEMM_BF16;
    p.kv_poison = true;
    eng_t *e = NULL;
    char err[256];
    ASSERT_EQ(eng_init(&p, &e, err, sizeof err), 0);
    eng_seq_t *s;
    ASSERT_EQ(eng_seq_create(e, &s), 0);
    float *lg = malloc((size_t)N * N_VOCAB * sizeof *lg);
    eng_batch_item_t it = {.seq = s, .tokens = toks, .n_tokens = 33, .logits = ENG_LOGITS_ALL};
    ASSERT_EQ(eng_forward(e, &it, 1, lg), 0);
    for (int i = 33; i < N; i++) {
        it = (eng_batch_item_t){
            .seq = s, .tokens = toks + i, .n_tokens = 1, .logits = ENG_LOGITS_ALL};
        ASSERT_EQ(eng_forward(e, &it, 1, lg + (size_t)i * N_VOCAB), 0);
    }
    double rel = tm_rel_err(lg, ref, N, N_VOCAB);
    fprintf(stderr, "  bf16 GEMM (%s): rel err vs f32 reference %g\n",
            eng__cpu_has_bf16() ? "avx512-bf16" : "not available: f32 path", rel);
    ASSERT_LE(rel, 5e-2);
    eng_seq_free(e, s);
    eng_free(e);
    free(lg), free(ref);
    unlink(path);
    unlink(p32);
}

/* The default GEMM mode (auto): BF16 for F16 weights where the CPU has AVX512-BF16, within the
 * BF16 tolerance of the reference; F32 weights keep the exact F32 path (the reference tests
 * above run with the default too, at 1e-4); an unknown mode is refused. */
PC_TEST(gemm_auto)
{
    char p16[256], p32[256];
    make_model(&cases[0], ENG_GGML_TYPE_F16, p16, sizeof p16);
    make_model(&cases[0], ENG_GGML_TYPE_F32, p32, sizeof p32);
    enum { N = 40 };
    int32_t toks[N];
    for (int i = 0; i < N; i++)
        toks[i] = rnd_token();
    float *ref = malloc((size_t)N * N_VOCAB * sizeof *ref);
    float *lg = malloc((size_t)N * N_VOCAB * sizeof *lg);
    ASSERT_EQ(tm_reference(p32, toks, N, ref), 0);
    const char *paths[2] = {p16, p32};
    for (int f32 = 0; f32 < 2; f32++) {
        eng_params_t p = eng_params_default();
        ASSERT_EQ(p.gemm, ENG_GEMM_AUTO);
        p.model_path = paths[f32];
        p.kv_dtype = ENG_KV_F32;
        p.kv_poison = true;
        eng_t *e = NULL;
        char err[256];
        ASSERT_EQ(eng_init(&p, &e, err, sizeof err), 0);
        const char *want =
            !f32 && eng__cpu_has_bf16() && strcmp(eng_cpu_isa_name_of(e), "avx512") == 0 ? "bf16"
                                                                                         : "f32";
        ASSERT_STR_EQ(eng_gemm_name_of(e), want);
        eng_seq_t *s;
        ASSERT_EQ(eng_seq_create(e, &s), 0);
        eng_batch_item_t it = {.seq = s, .tokens = toks, .n_tokens = N, .logits = ENG_LOGITS_ALL};
        ASSERT_EQ(eng_forward(e, &it, 1, lg), 0);
        double rel = tm_rel_err(lg, ref, N, N_VOCAB);
        fprintf(stderr, "  auto GEMM on %s weights (%s): rel err vs f32 reference %g\n",
                f32 ? "f32" : "f16", want, rel);
        ASSERT_LE(rel, f32 ? 1e-4 : 5e-2);
        eng_seq_free(e, s);
        eng_free(e);
    }
    enum eng_gemm_mode m = ENG_GEMM_F32;
    ASSERT_EQ(eng_gemm_mode_parse("bf16", &m), 0);
    ASSERT_EQ(m, ENG_GEMM_BF16);
    ASSERT_EQ(eng_gemm_mode_parse("fp8", &m), PC_ERR_INVAL);
    ASSERT_EQ(m, ENG_GEMM_BF16);
    eng_params_t p = eng_params_default();
    p.model_path = p16;
    p.gemm = (enum eng_gemm_mode)7;
    eng_t *e = NULL;
    char err[256];
    ASSERT_EQ(eng_init(&p, &e, err, sizeof err), PC_ERR_INVAL);
    ASSERT_TRUE(e == NULL && strstr(err, "GEMM mode") != NULL);
    free(lg), free(ref);
    unlink(p16);
    unlink(p32);
}

/* The CPU path: KVGW_CPU_ISA and eng_params.cpu_isa pick it, an unknown name is refused with a
 * clear error, a path the CPU cannot run is refused (where this CPU lacks one), and the parameter
 * wins over the environment. */
PC_TEST(cpu_isa_override)
{
    char path[256];
    make_model(&cases[1], ENG_GGML_TYPE_F16, path, sizeof path);
    eng_params_t p = eng_params_default();
    p.model_path = path;
    eng_t *e = NULL;
    char err[256];
    p.cpu_isa = "sse9";
    ASSERT_EQ(eng_init(&p, &e, err, sizeof err), PC_ERR_INVAL);
    ASSERT_TRUE(e == NULL && strstr(err, "sse9") != NULL && strstr(err, "avx2") != NULL);
    p.cpu_isa = NULL;
    setenv("KVGW_CPU_ISA", "neon9", 1);
    ASSERT_EQ(eng_init(&p, &e, err, sizeof err), PC_ERR_INVAL);
    ASSERT_TRUE(e == NULL && strstr(err, "KVGW_CPU_ISA") != NULL);
    setenv("KVGW_CPU_ISA", "portable", 1);
    ASSERT_EQ(eng_init(&p, &e, err, sizeof err), 0);
    ASSERT_STR_EQ(eng_cpu_isa_name_of(e), "portable");
    eng_free(e);
    p.cpu_isa = "auto"; /* the parameter wins over the environment */
    ASSERT_EQ(eng_init(&p, &e, err, sizeof err), 0);
    ASSERT_STR_EQ(eng_cpu_isa_name_of(e), eng__cpu_isa_name(eng__cpu_isa_best()));
    eng_free(e);
    unsetenv("KVGW_CPU_ISA");
    for (int i = 0; i < N_ISAS; i++) {
        p.cpu_isa = isas[i];
        int rc = eng_init(&p, &e, err, sizeof err);
        if (isa_runs(isas[i])) {
            ASSERT_EQ(rc, 0);
            ASSERT_STR_EQ(eng_cpu_isa_name_of(e), isas[i]);
            eng_free(e);
        } else {
            ASSERT_EQ(rc, PC_ERR_UNSUPPORTED);
            ASSERT_TRUE(e == NULL && strstr(err, "cannot run on this CPU") != NULL);
        }
    }
    unlink(path);
}

/* Bad input is rejected and changes nothing; a full KV pool gives 1 and changes nothing. */
PC_TEST(rejects_and_rolls_back)
{
    char path[256];
    make_model(&cases[1], ENG_GGML_TYPE_F32, path, sizeof path);
    eng_params_t p = eng_params_default();
    p.model_path = path;
    p.kv_max_tokens = 64; /* 4 blocks */
    eng_t *e = NULL;
    char err[256];
    ASSERT_EQ(eng_init(&p, &e, err, sizeof err), 0);
    eng_seq_t *a, *b;
    ASSERT_EQ(eng_seq_create(e, &a), 0);
    ASSERT_EQ(eng_seq_create(e, &b), 0);
    int32_t toks[64];
    for (int i = 0; i < 64; i++)
        toks[i] = rnd_token();
    float *lg = malloc((size_t)2 * N_VOCAB * sizeof *lg);
    eng_batch_item_t it = {.seq = a, .tokens = toks, .n_tokens = 40, .logits = ENG_LOGITS_LAST};
    ASSERT_EQ(eng_forward(e, &it, 1, lg), 0);
    ASSERT_EQ(eng_kvpool_n_free(eng_kvpool(e)), 1);

    int32_t bad[2] = {1, N_VOCAB};
    it = (eng_batch_item_t){.seq = a, .tokens = bad, .n_tokens = 2, .logits = ENG_LOGITS_LAST};
    ASSERT_EQ(eng_forward(e, &it, 1, lg), PC_ERR_INVAL);
    bad[1] = -1;
    ASSERT_EQ(eng_forward(e, &it, 1, lg), PC_ERR_INVAL);
    it.n_tokens = 0;
    ASSERT_EQ(eng_forward(e, &it, 1, lg), PC_ERR_INVAL);
    eng_batch_item_t dup[2] = {{.seq = a, .tokens = toks, .n_tokens = 1},
                               {.seq = a, .tokens = toks, .n_tokens = 1}};
    ASSERT_EQ(eng_forward(e, dup, 2, lg), PC_ERR_INVAL);
    it = (eng_batch_item_t){.seq = a, .tokens = toks, .n_tokens = 1, .logits = ENG_LOGITS_LAST};
    ASSERT_EQ(eng_forward(e, &it, 1, NULL), PC_ERR_INVAL);
    ASSERT_EQ(eng_seq_n_tokens(a), 40);

    /* b needs 2 blocks, 1 is free; a needs none more (40 -> 41 fits its third block). */
    eng_batch_item_t two[2] = {
        {.seq = a, .tokens = toks + 40, .n_tokens = 1, .logits = ENG_LOGITS_LAST},
        {.seq = b, .tokens = toks, .n_tokens = 20, .logits = ENG_LOGITS_LAST}};
    ASSERT_EQ(eng_forward(e, two, 2, lg), 1);
    ASSERT_EQ(eng_seq_n_tokens(a), 40);
    ASSERT_EQ(eng_seq_n_tokens(b), 0);
    ASSERT_EQ(eng_kvpool_n_free(eng_kvpool(e)), 1);
    ASSERT_EQ(eng_check(e, err, sizeof err), 0);
    two[1].n_tokens = 16;
    ASSERT_EQ(eng_forward(e, two, 2, lg), 0);
    ASSERT_EQ(eng_seq_n_tokens(a), 41);
    ASSERT_EQ(eng_seq_n_tokens(b), 16);
    ASSERT_EQ(eng_kvpool_n_free(eng_kvpool(e)), 0);
    ASSERT_EQ(eng_check(e, err, sizeof err), 0);
    eng_seq_free(e, a);
    eng_seq_free(e, b);
    ASSERT_EQ(eng_check(e, err, sizeof err), 0);
    eng_free(e);
    free(lg);

    /* A missing file and an impossible budget fail with a reason. */
    p.model_path = "/nonexistent/model.gguf";
    ASSERT_TRUE(eng_init(&p, &e, err, sizeof err) < 0);
    ASSERT_TRUE(err[0] != '\0');
    p.model_path = path;
    p.kv_max_tokens = 8; /* less than a block */
    ASSERT_EQ(eng_init(&p, &e, err, sizeof err), PC_ERR_INVAL);
    unlink(path);
}

PC_TEST_MAIN()
