/*
 * test_forward_quant.c — models with quantized weights (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K and the Q4_K_M
 * mix, written by kvgw's own quantizer) load and compute end to end: the engine's logits on
 * every CPU path, in prefill and in decode, against a float64 forward pass over the same weights
 * dequantized (eng_testmodel.h's tm_reference over the file's exact values).
 *
 * The tolerance comes from the activation rounding the integer products use: activations are
 * quantized to 8 bits per block before each product (Q8_K blocks of 256 for the K-quants, Q8_0
 * blocks of 32 for Q8_0, Q4_0, Q5_0 and Q5_1), d = amax / 127, so each element is off by at most d
 * / 2, uniformly: rms d / sqrt(12). For Gaussian-like activations a block's amax is about 3 sigma
 * (256 values; 2.1 sigma for 32), so each product's output carries a relative rms noise of about 3
 * / (127 sqrt(12)) = 0.0068 (the errors are independent and see the same weights as the signal). A
 * layer has four products in series on the residual stream (q/k/v, output, gate/up, down) and the
 * head one more: 2 layers give 9, whose noises add in quadrature, sqrt(9) x 0.0068 = 0.020 of the
 * logits' rms. The check is the worst row's max |difference| over its max |logit|; over 300 logits
 * both maxima sit near 3 rms, so the expected figure is about 0.02, and the tolerance QUANT_TOL is
 * three times that. Prefill rounds the activations the same way (the same integer products as
 * decode, as llama.cpp does), so one tolerance covers both; the Q8_0 fallback matrices of the
 * llama.cpp mixes too. A top-1 token must agree wherever the reference's top-2 gap exceeds twice
 * the allowed logit error.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "engine.h"
#include "gguf.h"
#include "eng_testmodel.h"
#include "model.h"
#include "pc_err.h"
#include "pc_test.h"

#define N_VOCAB 300
#define QUANT_TOL 0.06

static uint32_t rng_state = 4242;
static int32_t rnd_token(void)
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return (int32_t)((rng_state >> 8) % N_VOCAB);
}

static void make_model_ff(uint32_t dtype, bool tied, uint32_t n_ff, char *path, size_t len)
{
    eng_mkmodel_params_t p = eng_mkmodel_params_default();
    p.arch = ENG_ARCH_LLAMA;
    p.n_layer = 2;
    p.n_embd = 256;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = n_ff;
    p.n_ctx = 4096;
    p.dtype = dtype;
    p.tied = tied;
    p.rope_theta = 10000.0f;
    p.seed = 11;
    char err[256];
    int rc = tm_make(&p, N_VOCAB, path, len, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "mkmodel failed: %s\n", err);
        abort();
    }
}

static void make_model(uint32_t dtype, bool tied, char *path, size_t len)
{
    make_model_ff(dtype, tied, 512, path, len);
}

static const char *const isas[] = {"avx512", "avx2", "portable"};

static bool isa_runs(const char *isa)
{
    eng_cpu_isa_t v;
    return eng__cpu_isa_parse(isa, &v) == 0 && eng__cpu_isa_runs(v);
}

/* Same top-1 wherever the reference's top-2 gap exceeds 2 x the allowed logit error. */
static void check_top1(const float *got, const float *ref, uint32_t n_rows)
{
    for (uint32_t r = 0; r < n_rows; r++) {
        const float *g = got + (size_t)r * N_VOCAB, *w = ref + (size_t)r * N_VOCAB;
        uint32_t a = 0, b = 0;
        double mx = 0, second = -INFINITY;
        for (uint32_t i = 0; i < N_VOCAB; i++) {
            mx = fmax(mx, fabs((double)w[i]));
            a = w[i] > w[a] ? i : a;
            b = g[i] > g[b] ? i : b;
        }
        for (uint32_t i = 0; i < N_VOCAB; i++)
            if (i != a)
                second = fmax(second, (double)w[i]);
        if ((double)w[a] - second > 2 * QUANT_TOL * mx)
            ASSERT_EQ(a, b);
    }
}

/* Prefill N tokens (every position's logits), then a chunk and single decode tokens. */
static void run_model(uint32_t dtype, bool tied, uint32_t n_ff)
{
    char path[256];
    make_model_ff(dtype, tied, n_ff, path, sizeof path);
    enum { N = 52, P = 36 }; /* P >= 32: prefill takes the GEMM (BF16 where the CPU has it) */
    int32_t toks[N];
    for (int i = 0; i < N; i++)
        toks[i] = rnd_token();
    float *ref = malloc((size_t)N * N_VOCAB * sizeof *ref);
    ASSERT_EQ(tm_reference(path, toks, N, ref), 0);
    float *lg = malloc((size_t)N * N_VOCAB * sizeof *lg);
    for (size_t ii = 0; ii < 3; ii++) {
        if (!isa_runs(isas[ii]))
            continue;
        for (int gemm = 0; gemm < 2; gemm++) {
            eng_params_t p = eng_params_default();
            p.model_path = path;
            p.cpu_isa = isas[ii];
            p.gemm = gemm == 0 ? ENG_GEMM_AUTO : ENG_GEMM_F32;
            p.kv_dtype = ENG_KV_F32;
            p.kv_poison = true;
            eng_t *e = NULL;
            char err[256];
            ASSERT_EQ(eng_init(&p, &e, err, sizeof err), 0);
            eng_seq_t *s;
            ASSERT_EQ(eng_seq_create(e, &s), 0);
            eng_batch_item_t it = {
                .seq = s, .tokens = toks, .n_tokens = P, .logits = ENG_LOGITS_ALL};
            ASSERT_EQ(eng_forward(e, &it, 1, lg), 0);
            it = (eng_batch_item_t){
                .seq = s, .tokens = toks + P, .n_tokens = 8, .logits = ENG_LOGITS_ALL};
            ASSERT_EQ(eng_forward(e, &it, 1, lg + (size_t)P * N_VOCAB), 0);
            for (int i = P + 8; i < N; i++) {
                it = (eng_batch_item_t){
                    .seq = s, .tokens = toks + i, .n_tokens = 1, .logits = ENG_LOGITS_ALL};
                ASSERT_EQ(eng_forward(e, &it, 1, lg + (size_t)i * N_VOCAB), 0);
            }
            double prefill = tm_rel_err(lg, ref, P, N_VOCAB);
            double decode =
                tm_rel_err(lg + (size_t)P * N_VOCAB, ref + (size_t)P * N_VOCAB, N - P, N_VOCAB);
            fprintf(stderr, "  %s %s gemm %s: rel err prefill %.2e, chunk and decode %.2e\n",
                    eng_mkmodel_dtype_name(dtype), isas[ii], eng_gemm_name_of(e), prefill, decode);
            ASSERT_LE(prefill, QUANT_TOL);
            ASSERT_LE(decode, QUANT_TOL);
            PC_TEST_CALL(check_top1(lg, ref, N));
            eng_seq_free(e, s);
            eng_free(e);
        }
    }
    free(lg);
    free(ref);
    unlink(path);
}

static void run_type(uint32_t dtype, bool tied)
{
    run_model(dtype, tied, 512);
}

/* The matrices are kept as stored, at the file's bytes per weight. */
PC_TEST(weights_kept_quantized)
{
    char path[256];
    make_model(ENG_MKMODEL_Q4_K_M, false, path, sizeof path);
    eng_model_params_t mp = eng_model_params_default();
    eng_model_t *m;
    char err[256];
    ASSERT_EQ(eng_model_load(path, &mp, &m, err, sizeof err), 0);
    ASSERT_EQ(m->layers[0].wq.type, ENG_GGML_TYPE_Q4_K);
    ASSERT_EQ(m->layers[0].wv.type, ENG_GGML_TYPE_Q4_K); /* use_more_bits(0, 2) is false */
    ASSERT_EQ(m->layers[1].wv.type, ENG_GGML_TYPE_Q6_K); /* 1 >= 7 * 2 / 8 */
    ASSERT_EQ(m->layers[1].w_down.type, ENG_GGML_TYPE_Q6_K);
    ASSERT_EQ(m->output.type, ENG_GGML_TYPE_Q6_K);
    ASSERT_EQ(m->tok_embd.type, ENG_GGML_TYPE_Q4_K);
    eng_model_free(m);
    mp.weights_f32 = true;
    ASSERT_EQ(eng_model_load(path, &mp, &m, err, sizeof err), 0);
    ASSERT_EQ(m->layers[0].wq.type, ENG_GGML_TYPE_F32);
    ASSERT_EQ(m->layers[0].wq.file_type, ENG_GGML_TYPE_Q4_K);
    eng_model_free(m);
    unlink(path);
}

/* eng_decode_weight_bytes: the file's bytes of the matrices one decode step reads (every blk.*
 * matrix and the head: output.weight, or token_embd.weight when tied), or 4 bytes per weight
 * when the engine holds them as F32 (weights_f32). */
static void check_decode_bytes(uint32_t dtype, bool tied)
{
    char path[256];
    make_model(dtype, tied, path, sizeof path);
    for (int f32 = 0; f32 < 2; f32++) {
        eng_params_t p = eng_params_default();
        p.model_path = path;
        p.weights_f32 = f32 == 1;
        eng_t *e = NULL;
        char err[256];
        ASSERT_EQ(eng_init(&p, &e, err, sizeof err), 0);
        const eng_gguf_t *g = eng_model_gguf(e);
        double want = 0;
        for (uint64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
            const eng_gguf_tensor_t *t = eng_gguf_tensor_at(g, i);
            bool head = strcmp(t->name, tied ? "token_embd.weight" : "output.weight") == 0;
            if (t->n_dims == 2 && (head || strncmp(t->name, "blk.", 4) == 0))
                want += f32 == 1 ? 4.0 * (double)t->n_elements : (double)t->n_bytes;
        }
        ASSERT_TRUE(want > 0);
        ASSERT_EQ(eng_decode_weight_bytes(e), want);
        eng_free(e);
    }
    unlink(path);
}

PC_TEST(decode_weight_bytes_at_file_types)
{
    PC_TEST_CALL(check_decode_bytes(ENG_MKMODEL_Q4_K_M, false));
    PC_TEST_CALL(check_decode_bytes(ENG_GGML_TYPE_Q4_0, true));
    PC_TEST_CALL(check_decode_bytes(ENG_GGML_TYPE_F16, false));
}

PC_TEST(q4_0_vs_float64)
{
    run_type(ENG_GGML_TYPE_Q4_0, false);
}

PC_TEST(q4_k_vs_float64)
{
    run_type(ENG_GGML_TYPE_Q4_K, true);
}

PC_TEST(q5_k_vs_float64)
{
    run_type(ENG_GGML_TYPE_Q5_K, false);
}

PC_TEST(q6_k_vs_float64)
{
    run_type(ENG_GGML_TYPE_Q6_K, false);
}

PC_TEST(q4_k_m_vs_float64)
{
    run_type(ENG_MKMODEL_Q4_K_M, false);
}

PC_TEST(q8_0_vs_float64)
{
    run_type(ENG_GGML_TYPE_Q8_0, false);
}

PC_TEST(q5_0_vs_float64)
{
    run_type(ENG_GGML_TYPE_Q5_0, true);
}

PC_TEST(q5_1_vs_float64)
{
    run_type(ENG_GGML_TYPE_Q5_1, false);
}

/* The types llama.cpp's quantizer gives this shape (FF 352: ffn_down's rows are not whole
 * super-blocks), as its Q4_K_M and Q5_K_M files of our demo and qwen test models have them: a
 * quantized token embedding (Q6_K, tied: also the output head), Q4_K / Q5_K, Q6_K, and the
 * fallbacks Q5_0 / Q5_1 and Q8_0 in one model. */
PC_TEST(llama_cpp_mixes_vs_float64)
{
    char path[256];
    make_model_ff(ENG_MKMODEL_Q4_K_M, true, 352, path, sizeof path);
    eng_model_params_t mp = eng_model_params_default();
    eng_model_t *m;
    char err[256];
    ASSERT_EQ(eng_model_load(path, &mp, &m, err, sizeof err), 0);
    ASSERT_EQ(m->tok_embd.type, ENG_GGML_TYPE_Q6_K);
    ASSERT_EQ(m->output.data, m->tok_embd.data);
    ASSERT_EQ(m->layers[0].w_down.type, ENG_GGML_TYPE_Q5_0);
    ASSERT_EQ(m->layers[1].w_down.type, ENG_GGML_TYPE_Q8_0);
    ASSERT_EQ(m->layers[1].wv.type, ENG_GGML_TYPE_Q6_K);
    ASSERT_EQ(m->layers[0].w_up.type, ENG_GGML_TYPE_Q4_K);
    eng_model_free(m);
    unlink(path);
    run_model(ENG_MKMODEL_Q4_K_M, true, 352);
    run_model(ENG_MKMODEL_Q5_K_M, true, 352);
}

PC_TEST_MAIN()
