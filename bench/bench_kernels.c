/*
 * bench_kernels.c — `kvgw bench kernels`: the CUDA backend's kernels and cuBLAS GEMMs, and the
 * engine end to end on the cuda backend (models/kvgw-bench.gguf).
 *
 * Figures (GPU builds on a machine with a CUDA device):
 *   device_peak_gb_per_s        the card's DRAM bandwidth (memory clock x bus width)
 *   decode_attn_gb_per_s        paged decode attention, batch 32 x 8192 context, 32 query / 8 KV
 *                               heads, head_dim 128, F16 KV in 16-token blocks (split-K + merge):
 *                               KV bytes read per second
 *                               (compare with the card's ~3.3 TB/s H100, ~4.8 TB/s H200)
 *   decode_attn_b{1,64}_ctx{4k,32k}_gb_per_s and _pct_peak
 *                               the decode grid: batch 1 and 64, context 4096 and 32768,
 *                               64 query / 8 KV heads (GQA 8:1), head_dim 128; the target is
 *                               >= 70% of the card's peak
 *   decode_splitkv_b{1,64}_ctx{4k,32k}_gb_per_s and _pct_peak
 *                               the same grid on the split-KV decode kernel (krn_decode.cu,
 *                               splits planned for twice the SM count)
 *   decode_splitkv_q8_0_b{1,64}_ctx{4k,32k}_{gb_per_s,pct_peak,speedup_vs_f16}
 *                               the same grid on a q8_0 KV pool (issue 23: the kernel reads the
 *                               34-byte blocks in place): KV bytes moved per second, and the
 *                               F16 kernel's time over the q8_0 one's (bytes alone: 64/34)
 *   sample_b{1,64}_us           krn_sample over a 152064-token vocabulary (Qwen's), top_k 50,
 *                               top_p 0.9, temperature 0.8: microseconds per step (the
 *                               multi-pass kernel, krn_sample_radix)
 *   sample_topp_b{1,64}_us      the same with top_k off (top_p 0.9 over the whole vocabulary)
 *   sample_greedy_b{1,64}_us    the same rows greedy (temperature 0)
 *   sample_bitwise_{b1,b64,greedy_b1,greedy_b64}_us
 *                               the previous one-CTA-per-row kernel (krn_sample_bitwise), for
 *                               comparison
 *   sample_{greedy,topp}_noplan_b{1,64}_us
 *                               the multi-pass kernel given no plan (every launch: 11 at this
 *                               vocab), as a caller that does not pass krn_sample_plan_of gets
 *   prefill_attn_tflop_per_s    causal prefill attention, 4 x 2048 tokens, same heads: 4 * heads
 *                               * head_dim * causal pairs per second
 *   prefill_attn_{tc,tc64,simt}_{4k,4k_cached4k}_tflop_per_s
 *                               causal prefill attention of one 4096-token prompt (and of 4096
 *                               tokens after 4096 cached), 32 query / 4 KV heads (GQA 8:1),
 *                               head_dim 128: the tensor-core kernel (8-warp CTAs, the default;
 *                               tc64: 4-warp CTAs) and the SIMT one
 *   gemm_{f16,bf16}_tflop_per_s cuBLAS at a prefill shape, M 4096 x N 4096 x K 4096 (and N 14336)
 *   qgemv_{q4_0,q8_0,q4_k,q5_k,q6_k}_b{1,8}_gb_per_s and _pct_peak
 *                               krn_qmatmul's GEMV over a quantized 14336 x 4096 matrix (an
 *                               8B-class FFN's gate) with 1 and 8 activation rows: the matrix's
 *                               bytes (at the type's bits per weight) read per second; decode is
 *                               memory-bound, so the target is near the card's peak
 *   qgemm_q4_k_m512_tflop_per_s krn_qmatmul's GEMM path at M 512 (dequantize 64 MiB chunks to
 *                               F16, then cuBLAS), same matrix
 *   e2e_prefill_tokens_per_s    the engine, 2048-token prompt
 *   e2e_decode_b{1,16,64}_tokens_per_s
 *                               the engine, decode steps of 1, 16 and 64 sequences after
 *                               512-token prompts, sampled on the device (e2e_decode_tokens_per_s:
 *                               batch 1, the earlier name)
 *   e2e_decode_b1_ctx4k_tokens_per_s
 *                               the same at batch 1 after a 4096-token prompt (the decode
 *                               attention's share of a step grows with the context)
 *   e2e_{prefill,decode_b*}_{launches,device_ops,host_us}_per_step, _graph_replay_pct,
 *   _decode_kernel_pct          the cuda backend's counters (eng_cuda_stats_get): launches the
 *                               host made, kernels / graph nodes the device ran, host time from
 *                               a step's start to its last enqueue, steps replayed as graphs,
 *                               steps whose attention ran the split-KV decode kernel (0 with
 *                               KVGW_CUDA_DECODE=attn: krn_attention's plan, the previous path)
 *   ttft_ms_cold / ttft_ms_cached   4096-token prompt, cold and with 4032 tokens cached
 *   e2e_load_s                  eng_init with the weights' upload
 *   --model FILE picks the model (default models/kvgw-bench.gguf); --tag T names its figures
 *   e2e_T_... and ttft_T_...; --kv-dtype q8_0 (with --tag q8_0) runs the end-to-end engine on
 *   a q8_0 KV pool (issue 23), its figures beside the F16 run's; --e2e-only skips the kernel
 * benchmarks; --e2e-decode runs only the end-to-end decode figures (load, decode), for quick
 * comparison runs of the step's paths (scripts/gpu-check.sh: KVGW_CUDA_DECODE=attn, tag decattn).
 * Without CUDA in the build, or without a device, it says so on stderr and prints the JSON line
 * with no figures, exit status 0 (nothing to measure is not a failure of the benchmark).
 */
#include "bench.h"
#include "common.h"
#include "engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVGW_HAVE_CUDA
#include "kernels.h"
#include "sampling.h"
#endif

static void usage(FILE *f)
{
    fprintf(f, "usage: kvgw bench kernels [--model FILE] [--iters N] [--no-e2e | --e2e-only] "
               "[--e2e-decode] [--tag NAME] [--kv-dtype f16|f32|q8_0]\n");
}

#ifdef KVGW_HAVE_CUDA

#define BK_CHECK(x)                                                                                \
    do {                                                                                           \
        int bk_rc_ = (x);                                                                          \
        if (bk_rc_ != 0) {                                                                         \
            fprintf(stderr, "kvgw bench kernels: %s failed: %s\n", #x, pc_strerror(bk_rc_));       \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

/* Seconds per call of `call` (a krn_ function returning 0 or an error): one warm-up call, then
 * iters calls between two syncs. Jumps to fail like BK_CHECK. */
#define BK_TIME(call, iters, sec_out)                                                              \
    do {                                                                                           \
        BK_CHECK(call); /* warm-up */                                                              \
        BK_CHECK(krn_ctx_sync(c));                                                                 \
        double bk_t0_ = bench_now_s();                                                             \
        for (int bk_i_ = 0; bk_i_ < (iters); bk_i_++)                                              \
            BK_CHECK(call);                                                                        \
        BK_CHECK(krn_ctx_sync(c));                                                                 \
        (sec_out) = (bench_now_s() - bk_t0_) / (iters);                                            \
    } while (0)

static uint64_t bk_rng = 88172645463325252ull;
static float bk_unif(void)
{
    bk_rng ^= bk_rng << 13;
    bk_rng ^= bk_rng >> 7;
    bk_rng ^= bk_rng << 17;
    return (float)((double)(bk_rng >> 11) * 0x1.0p-53 * 2 - 1);
}

/* Random F16 device memory of n elements. */
static int dev_random_f16(krn_ctx_t *c, size_t n, void **out)
{
    uint16_t *h = malloc(n * 2);
    if (h == NULL)
        return PC_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        h[i] = krn_f32_to_f16(bk_unif() * 0.5f);
    int rc = krn_dev_alloc(c, n * 2, out);
    if (rc == 0)
        rc = krn_copy_h2d(c, *out, h, n * 2);
    if (rc == 0)
        rc = krn_ctx_sync(c);
    free(h);
    return rc;
}

/* Attention over n_seqs sequences of ctx positions each with n_new new rows per sequence;
 * returns seconds per call (mean of iters), or -1. *bytes and *flops describe one call. */
static double bench_attention(krn_ctx_t *c, int32_t nh, int32_t nkv, int32_t n_seqs, int32_t ctx,
                              int32_t n_new, int iters, double *bytes, double *flops)
{
    const int32_t hd = 128, bt = 16;
    int32_t max_blocks = (ctx + bt - 1) / bt;
    krn_kv_t kv = {.n_blocks = n_seqs * max_blocks,
                   .n_layer = 1,
                   .n_head_kv = nkv,
                   .head_dim = hd,
                   .block_tokens = bt,
                   .dtype = KRN_F16};
    size_t pool_elems = krn_kv_block_bytes(&kv) / 2 * (size_t)kv.n_blocks;
    int32_t T = n_seqs * n_new, width = nh * hd;
    int32_t *tables = malloc(sizeof *tables * (size_t)n_seqs * max_blocks);
    int32_t *pos = malloc(sizeof *pos * (size_t)T);
    krn_plan_seq_t *seqs = malloc(sizeof *seqs * (size_t)n_seqs);
    float *q = malloc(sizeof *q * (size_t)T * width);
    krn_attn_task_t *tasks = NULL;
    krn_attn_merge_t *merges = NULL;
    void *d_pool = NULL, *d_tables = NULL, *d_pos = NULL, *d_q = NULL, *d_out = NULL;
    void *d_tasks = NULL, *d_merges = NULL, *d_po = NULL, *d_pml = NULL;
    double sec = -1;
    if (!tables || !pos || !seqs || !q)
        goto fail;
    /* Blocks of each sequence strided over the pool, as a long-running server's would be. */
    for (int32_t s = 0; s < n_seqs; s++)
        for (int32_t b = 0; b < max_blocks; b++)
            tables[(size_t)s * max_blocks + b] = b * n_seqs + s;
    for (int32_t s = 0; s < n_seqs; s++) {
        seqs[s] = (krn_plan_seq_t){.row0 = s * n_new, .n_tokens = n_new, .pos0 = ctx - n_new};
        for (int32_t j = 0; j < n_new; j++)
            pos[s * n_new + j] = ctx - n_new + j;
    }
    for (size_t i = 0; i < (size_t)T * width; i++)
        q[i] = bk_unif() * 0.1f;
    krn_plan_params_t pp = {.n_head = nh, .n_head_kv = nkv, .head_dim = hd, .split_kv = 512};
    int32_t nt, nm, np;
    BK_CHECK(krn_attn_plan(&pp, seqs, n_seqs, NULL, &nt, NULL, &nm, &np));
    tasks = malloc(sizeof *tasks * ((size_t)nt + 1));
    merges = malloc(sizeof *merges * ((size_t)nm + 1));
    if (!tasks || !merges)
        goto fail;
    BK_CHECK(krn_attn_plan(&pp, seqs, n_seqs, tasks, &nt, merges, &nm, &np));
    /* Random KV up to 256 MiB; larger pools (batch 64 x 32K is 8 GiB) are filled on the
     * device with one finite F16 value (0x2e2e, about 0.1): attention's speed does not depend
     * on the values, and the host would take minutes to draw them. */
    if (pool_elems * 2 <= ((size_t)256 << 20)) {
        BK_CHECK(dev_random_f16(c, pool_elems, &d_pool));
    } else {
        BK_CHECK(krn_dev_alloc(c, pool_elems * 2, &d_pool));
        BK_CHECK(krn_memset(c, d_pool, 0x2e, pool_elems * 2));
    }
    kv.base = d_pool;
    BK_CHECK(krn_dev_alloc(c, sizeof *tables * (size_t)n_seqs * max_blocks, &d_tables));
    BK_CHECK(krn_dev_alloc(c, sizeof *pos * (size_t)T, &d_pos));
    BK_CHECK(krn_dev_alloc(c, sizeof *q * (size_t)T * width, &d_q));
    BK_CHECK(krn_dev_alloc(c, sizeof *q * (size_t)T * width, &d_out));
    BK_CHECK(krn_dev_alloc(c, sizeof *tasks * ((size_t)nt + 1), &d_tasks));
    BK_CHECK(krn_dev_alloc(c, sizeof *merges * ((size_t)nm + 1), &d_merges));
    BK_CHECK(krn_dev_alloc(c, sizeof(float) * ((size_t)np * hd + 1), &d_po));
    BK_CHECK(krn_dev_alloc(c, sizeof(float) * ((size_t)np * 2 + 1), &d_pml));
    BK_CHECK(krn_copy_h2d(c, d_tables, tables, sizeof *tables * (size_t)n_seqs * max_blocks));
    BK_CHECK(krn_copy_h2d(c, d_pos, pos, sizeof *pos * (size_t)T));
    BK_CHECK(krn_copy_h2d(c, d_q, q, sizeof *q * (size_t)T * width));
    BK_CHECK(krn_copy_h2d(c, d_tasks, tasks, sizeof *tasks * (size_t)nt));
    BK_CHECK(krn_copy_h2d(c, d_merges, merges, sizeof *merges * (size_t)nm));
    krn_attn_args_t a = {.kv = kv,
                         .layer = 0,
                         .n_head = nh,
                         .q = d_q,
                         .out = d_out,
                         .row_pos = d_pos,
                         .block_tables = d_tables,
                         .max_blocks = max_blocks,
                         .tasks = d_tasks,
                         .n_tasks = nt,
                         .merges = d_merges,
                         .n_merges = nm,
                         .part_o = d_po,
                         .part_ml = d_pml};
    BK_TIME(krn_attention(c, &a), iters, sec);
    *bytes = (double)n_seqs * ctx * nkv * 2 * (double)krn_kv_row_bytes(&kv);
    double pairs = 0; /* causal (query, key) pairs per head */
    for (int32_t j = 0; j < n_new; j++)
        pairs += ctx - n_new + j + 1;
    *flops = 4.0 * nh * hd * pairs * n_seqs;
fail:
    free(tables);
    free(pos);
    free(seqs);
    free(q);
    free(tasks);
    free(merges);
    void *ds[] = {d_pool, d_tables, d_pos, d_q, d_out, d_tasks, d_merges, d_po, d_pml};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++)
        krn_dev_free(c, ds[i]);
    return sec;
}

/* The split-KV decode kernel (krn_decode_attention) over n_seqs single-token rows at
 * context ctx on a pool of dtype (KRN_F16 or KRN_Q8_0), splits planned for n_sm SMs; seconds
 * per call (kernel and merge), or -1. *bytes is the KV it must read. */
static double bench_decode(krn_ctx_t *c, enum krn_dtype dtype, int32_t nh, int32_t nkv,
                           int32_t n_seqs, int32_t ctx, int32_t n_sm, int iters, double *bytes)
{
    const int32_t hd = 128, bt = 16;
    int32_t max_blocks = (ctx + bt - 1) / bt, width = nh * hd;
    krn_kv_t kv = {.n_blocks = n_seqs * max_blocks,
                   .n_layer = 1,
                   .n_head_kv = nkv,
                   .head_dim = hd,
                   .block_tokens = bt,
                   .dtype = dtype};
    size_t pool_bytes = krn_kv_block_bytes(&kv) * (size_t)kv.n_blocks;
    int32_t split = krn_decode_split_tokens(n_sm, n_seqs, nkv, bt, ctx, 0);
    int32_t max_splits = split > 0 ? (ctx - 1) / split + 1 : 0;
    size_t slots = (size_t)n_seqs * nh * (size_t)max_splits;
    int32_t *tables = malloc(sizeof *tables * (size_t)n_seqs * max_blocks);
    int32_t *pos = malloc(sizeof *pos * (size_t)n_seqs),
            *seq = malloc(sizeof *seq * (size_t)n_seqs);
    float *q = malloc(sizeof *q * (size_t)n_seqs * width);
    void *d_pool = NULL, *d_tables = NULL, *d_pos = NULL, *d_seq = NULL, *d_q = NULL;
    void *d_out = NULL, *d_po = NULL, *d_pml = NULL;
    double sec = -1;
    if (!tables || !pos || !seq || !q || split <= 0)
        goto fail;
    for (int32_t s = 0; s < n_seqs; s++) {
        for (int32_t b = 0; b < max_blocks; b++)
            tables[(size_t)s * max_blocks + b] = b * n_seqs + s;
        pos[s] = ctx - 1;
        seq[s] = s;
    }
    for (size_t i = 0; i < (size_t)n_seqs * width; i++)
        q[i] = bk_unif() * 0.1f;
    BK_CHECK(krn_dev_alloc(c, pool_bytes, &d_pool));
    /* finite F16 0x2e2e (q8_0: that scale, quants 46) */
    BK_CHECK(krn_memset(c, d_pool, 0x2e, pool_bytes));
    BK_CHECK(krn_dev_alloc(c, sizeof *tables * (size_t)n_seqs * max_blocks, &d_tables));
    BK_CHECK(krn_dev_alloc(c, sizeof *pos * (size_t)n_seqs, &d_pos));
    BK_CHECK(krn_dev_alloc(c, sizeof *seq * (size_t)n_seqs, &d_seq));
    BK_CHECK(krn_dev_alloc(c, sizeof *q * (size_t)n_seqs * width, &d_q));
    BK_CHECK(krn_dev_alloc(c, sizeof *q * (size_t)n_seqs * width, &d_out));
    BK_CHECK(krn_dev_alloc(c, sizeof(float) * (slots * hd + 1), &d_po));
    BK_CHECK(krn_dev_alloc(c, sizeof(float) * (slots * 2 + 1), &d_pml));
    BK_CHECK(krn_copy_h2d(c, d_tables, tables, sizeof *tables * (size_t)n_seqs * max_blocks));
    BK_CHECK(krn_copy_h2d(c, d_pos, pos, sizeof *pos * (size_t)n_seqs));
    BK_CHECK(krn_copy_h2d(c, d_seq, seq, sizeof *seq * (size_t)n_seqs));
    BK_CHECK(krn_copy_h2d(c, d_q, q, sizeof *q * (size_t)n_seqs * width));
    kv.base = d_pool;
    krn_decode_args_t a = {.kv = kv,
                           .layer = 0,
                           .n_head = nh,
                           .q = d_q,
                           .out = d_out,
                           .row_seq = d_seq,
                           .row_pos = d_pos,
                           .block_tables = d_tables,
                           .max_blocks = max_blocks,
                           .n_rows = n_seqs,
                           .split_tokens = split,
                           .max_splits = max_splits,
                           .part_o = d_po,
                           .part_ml = d_pml};
    BK_TIME(krn_decode_attention(c, &a), iters, sec);
    *bytes = (double)n_seqs * ctx * nkv * 2 * (double)krn_kv_row_bytes(&kv);
fail:
    free(tables);
    free(pos);
    free(seq);
    free(q);
    void *ds[] = {d_pool, d_tables, d_pos, d_seq, d_q, d_out, d_po, d_pml};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++)
        krn_dev_free(c, ds[i]);
    return sec;
}

/* A sampler entry point (krn_sample_radix, krn_sample_bitwise). */
typedef int (*bench_sampler_fn)(krn_ctx_t *, const krn_sample_args_t *);

/* fn over n_rows rows of V random logits under mode 0 (temperature 0.8, top_k 50, top_p 0.9),
 * 1 (greedy) or 2 (temperature 0.8, top_p 0.9, top_k off), with the rows' plan
 * (krn_sample_plan_of, as the cuda backend passes it) or none; seconds per call, or -1. */
static double bench_sample(krn_ctx_t *c, bench_sampler_fn fn, int mode, bool plan, int32_t n_rows,
                           int32_t V, int iters)
{
    size_t n = (size_t)n_rows * V;
    float *h = malloc(n * sizeof *h);
    krn_sample_row_t *rows = malloc(sizeof *rows * (size_t)n_rows);
    void *d_logits = NULL, *d_rows = NULL, *d_tok = NULL, *d_work = NULL;
    double sec = -1;
    if (h == NULL || rows == NULL)
        goto fail;
    for (size_t i = 0; i < n; i++)
        h[i] = bk_unif() * 8.0f;
    for (int32_t r = 0; r < n_rows; r++)
        rows[r] = (krn_sample_row_t){.temperature = mode == 1 ? 0.0f : 0.8f,
                                     .top_k = mode == 0 ? 50 : 0,
                                     .top_p = 0.9f,
                                     .min_p = 0.0f,
                                     .u = 0.37};
    BK_CHECK(krn_dev_alloc(c, n * sizeof *h, &d_logits));
    BK_CHECK(krn_dev_alloc(c, sizeof *rows * (size_t)n_rows, &d_rows));
    BK_CHECK(krn_dev_alloc(c, sizeof(int32_t) * (size_t)n_rows, &d_tok));
    BK_CHECK(krn_dev_alloc(c, sizeof(double) * n, &d_work));
    BK_CHECK(krn_copy_h2d(c, d_logits, h, n * sizeof *h));
    BK_CHECK(krn_copy_h2d(c, d_rows, rows, sizeof *rows * (size_t)n_rows));
    krn_sample_args_t a = {.logits = d_logits,
                           .row = d_rows,
                           .token = d_tok,
                           .work = d_work,
                           .n_rows = n_rows,
                           .n_vocab = V,
                           .plan = plan ? krn_sample_plan_of(rows, n_rows) : 0};
    BK_TIME(fn(c, &a), iters, sec);
fail:
    free(h);
    free(rows);
    krn_dev_free(c, d_logits);
    krn_dev_free(c, d_rows);
    krn_dev_free(c, d_tok);
    krn_dev_free(c, d_work);
    return sec;
}

static double bench_gemm(krn_ctx_t *c, enum krn_dtype dt, int32_t M, int32_t N, int32_t K,
                         int iters)
{
    void *x = NULL, *w = NULL, *y = NULL;
    double tf = -1;
    BK_CHECK(dev_random_f16(c, (size_t)M * K, &x)); /* F16 bits read as BF16 are still finite */
    BK_CHECK(dev_random_f16(c, (size_t)N * K, &w));
    BK_CHECK(krn_dev_alloc(c, (size_t)M * N * 4, &y));
    krn_gemm_args_t g = {.x = x, .w = w, .y = y, .M = M, .N = N, .K = K, .dtype = dt};
    double sec;
    BK_TIME(krn_gemm(c, &g), iters, sec);
    tf = 2.0 * M * N * K / sec * 1e-12;
fail:
    krn_dev_free(c, x);
    krn_dev_free(c, w);
    krn_dev_free(c, y);
    return tf;
}

/* krn_qmatmul over an N x K matrix of qtype (random blocks: their values do not change the
 * speed) with M rows of F16 activations; seconds per call, -1 on failure. */
static double bench_qmatmul(krn_ctx_t *c, enum krn_qtype t, int32_t M, int32_t N, int32_t K,
                            int iters)
{
    size_t wb = (size_t)krn_qtype_row_bytes(t, K) * (size_t)N, sb = (size_t)64 << 20;
    uint8_t *h = malloc(wb);
    void *w = NULL, *x = NULL, *y = NULL, *scratch = NULL;
    double sec = -1;
    if (h == NULL)
        return -1;
    for (size_t i = 0; i < wb; i++)
        h[i] = (uint8_t)(bk_unif() * 127.0f + 128.0f);
    BK_CHECK(krn_dev_alloc(c, wb, &w));
    BK_CHECK(krn_copy_h2d(c, w, h, wb));
    BK_CHECK(dev_random_f16(c, (size_t)M * K, &x));
    BK_CHECK(krn_dev_alloc(c, (size_t)M * N * 4, &y));
    if (M > KRN_QGEMV_MAX_ROWS)
        BK_CHECK(krn_dev_alloc(c, sb, &scratch));
    krn_qmatmul_args_t a = {.w = w,
                            .qtype = t,
                            .x = x,
                            .x_dtype = KRN_F16,
                            .y = y,
                            .M = M,
                            .N = N,
                            .K = K,
                            .scratch = scratch,
                            .scratch_bytes = scratch != NULL ? sb : 0};
    BK_TIME(krn_qmatmul(c, &a), iters, sec);
fail:
    free(h);
    krn_dev_free(c, w);
    krn_dev_free(c, x);
    krn_dev_free(c, y);
    krn_dev_free(c, scratch);
    return sec;
}

/* Figure names of the end-to-end part: "e2e_" (or "ttft_") then the tag, if any, then rest. */
static void e2e_key(char *buf, size_t len, const char *head, const char *tag, const char *rest)
{
    snprintf(buf, len, "%s%s%s%s", head, tag[0] ? tag : "", tag[0] ? "_" : "", rest);
}

static void e2e_add(bench_report_t *rep, const char *head, const char *tag, const char *rest,
                    double v, const char *note)
{
    char key[96];
    e2e_key(key, sizeof key, head, tag, rest);
    bench_report_add(rep, key, v, note);
}

/* The cuda backend's counters over a phase of `steps` steps: launches the host made, device
 * operations, host microseconds per step and the share of steps replayed as graphs. */
static void e2e_add_stats(bench_report_t *rep, const char *tag, const char *phase,
                          const eng_cuda_stats_t *a, const eng_cuda_stats_t *b)
{
    uint64_t steps = b->steps - a->steps;
    if (steps == 0)
        return;
    char rest[64], note[128];
    double launches = (double)(b->launches - a->launches) / steps;
    double ops = (double)(b->device_ops - a->device_ops) / steps;
    double host_us = (double)(b->host_ns - a->host_ns) / steps * 1e-3;
    double replay = 100.0 * (double)(b->graph_replays - a->graph_replays) / steps;
    snprintf(note, sizeof note, "%llu steps, %.0f%% graph replays, %.1f uploads/step",
             (unsigned long long)steps, replay, (double)(b->uploads - a->uploads) / steps);
    snprintf(rest, sizeof rest, "%s_launches_per_step", phase);
    e2e_add(rep, "e2e_", tag, rest, launches, note);
    snprintf(rest, sizeof rest, "%s_device_ops_per_step", phase);
    e2e_add(rep, "e2e_", tag, rest, ops, "kernels, cuBLAS calls and graph nodes run");
    snprintf(rest, sizeof rest, "%s_host_us_per_step", phase);
    e2e_add(rep, "e2e_", tag, rest, host_us, "step start to last enqueue");
    snprintf(rest, sizeof rest, "%s_graph_replay_pct", phase);
    e2e_add(rep, "e2e_", tag, rest, replay, NULL);
    snprintf(rest, sizeof rest, "%s_decode_kernel_pct", phase);
    e2e_add(rep, "e2e_", tag, rest, 100.0 * (double)(b->decode_steps - a->decode_steps) / steps,
            "steps on the split-KV decode kernel");
}

/* n sequences of `prompt` tokens each (prefilled in steps of the engine's batch), then `steps`
 * decode steps of all n together, sampled on the device (as the worker does); decode tokens per
 * second into *tok_s, the backend's counters over the decode steps into *a, *b. */
static int e2e_decode(eng_t *e, const int32_t *toks, int n, uint32_t prompt, int steps,
                      double *tok_s, eng_cuda_stats_t *a, eng_cuda_stats_t *b)
{
    eng_seq_t **s = calloc((size_t)n, sizeof *s);
    eng_batch_item_t *it = calloc((size_t)n, sizeof *it);
    eng_sample_row_t *rows = calloc((size_t)n, sizeof *rows);
    int32_t *next = calloc((size_t)n, sizeof *next);
    int rc = PC_ERR_NOMEM;
    if (!s || !it || !rows || !next)
        goto done;
    rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        rc = eng_seq_create(e, &s[i]);
    for (int i = 0; i < n && rc == 0; i++) { /* distinct prompts: no shared prefix blocks */
        it[i] = (eng_batch_item_t){
            .seq = s[i], .tokens = toks + i, .n_tokens = prompt, .logits = ENG_LOGITS_LAST};
        rows[i] = (eng_sample_row_t){.temperature = 0.8f, .top_k = 50, .top_p = 0.9f, .u = 0.5};
        rc = eng_forward_sample(e, &it[i], 1, &rows[i], &next[i]);
    }
    for (int k = 0; k < 4 + steps && rc == 0; k++) { /* 4 warm-up steps (graph captures) */
        if (k == 4) {
            eng_cuda_stats_get(a);
            *tok_s = bench_now_s();
        }
        for (int i = 0; i < n; i++) {
            next[i] = next[i] < 0 ? 0 : next[i];
            it[i] = (eng_batch_item_t){
                .seq = s[i], .tokens = &next[i], .n_tokens = 1, .logits = ENG_LOGITS_LAST};
            rows[i].u = (double)((k * 7919 + i * 104729) % 1000) / 1000.0;
        }
        rc = eng_forward_sample(e, it, (uint32_t)n, rows, next);
    }
    if (rc == 0) {
        eng_cuda_stats_get(b);
        *tok_s = (double)n * steps / (bench_now_s() - *tok_s);
    }
done:
    for (int i = 0; s != NULL && i < n; i++)
        if (s[i] != NULL)
            eng_seq_free(e, s[i]);
    free(s);
    free(it);
    free(rows);
    free(next);
    return rc;
}

/* The engine on the cuda backend: prefill, decode at batch 1, 16 and 64, TTFT cold vs
 * cached, with the backend's launches and host time per step. Figures are named e2e_<tag>_...
 * and ttft_<tag>_... (no tag: e2e_..., ttft_ms_...). */
static int bench_e2e(const char *model, const char *tag, bool decode_only,
                     enum eng_kv_dtype kv_dtype, bench_report_t *rep)
{
    eng_params_t p = eng_params_default();
    p.model_path = model;
    p.backend = "cuda";
    p.kv_dtype = kv_dtype;
    p.kv_max_tokens = 65536; /* 64 sequences of 512 + decode, and the 4096-token TTFT prompt */
    p.max_batch_tokens = 2048;
    eng_t *e = NULL;
    char err[256];
    double t_load = bench_now_s();
    int rc = eng_init(&p, &e, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "kvgw bench kernels: %s: %s\n", model, err);
        return rc;
    }
    t_load = bench_now_s() - t_load;
    printf("end to end: %s (%s), KV %s, loaded in %.1f s; step path: KVGW_CUDA_FUSED=%s "
           "KVGW_CUDA_PACKED=%s KVGW_CUDA_GRAPHS=%s KVGW_CUDA_DECODE=%s\n",
           model, tag[0] ? tag : "default tag", eng_kv_dtype_name(kv_dtype), t_load,
           getenv("KVGW_CUDA_FUSED") ? getenv("KVGW_CUDA_FUSED") : "1",
           getenv("KVGW_CUDA_PACKED") ? getenv("KVGW_CUDA_PACKED") : "1",
           getenv("KVGW_CUDA_GRAPHS") ? getenv("KVGW_CUDA_GRAPHS") : "1",
           getenv("KVGW_CUDA_DECODE") ? getenv("KVGW_CUDA_DECODE") : "kernel");
    e2e_add(rep, "e2e_", tag, "load_s", t_load, model);
    uint32_t V = eng_n_vocab(e);
    enum { N_TOK = 8192 };
    int32_t *toks = malloc(sizeof *toks * N_TOK);
    float *logits = malloc(sizeof *logits * V);
    eng_seq_t *s = NULL;
    eng_cuda_stats_t a, b;
    rc = PC_ERR_NOMEM;
    if (!toks || !logits)
        goto done;
    for (int i = 0; i < N_TOK; i++)
        toks[i] = (int32_t)(((uint64_t)i * 2654435761u) % V);
    /* Prefill 2048 (after a warm-up of 512). */
    for (int pass = 0; pass < 2 && !decode_only; pass++) {
        uint32_t n = pass == 0 ? 512 : 2048;
        if ((rc = eng_seq_create(e, &s)) != 0)
            goto done;
        eng_batch_item_t it = {.seq = s, .tokens = toks, .n_tokens = n, .logits = ENG_LOGITS_LAST};
        eng_cuda_stats_get(&a);
        double t0 = bench_now_s();
        if ((rc = eng_forward(e, &it, 1, logits)) < 0)
            goto done;
        double dt = bench_now_s() - t0;
        eng_cuda_stats_get(&b);
        if (pass == 1) {
            e2e_add(rep, "e2e_", tag, "prefill_tokens_per_s", n / dt, "2048-token prompt");
            e2e_add_stats(rep, tag, "prefill", &a, &b);
        }
        eng_seq_free(e, s);
        s = NULL;
    }
    /* Decode at batch 1, 16 and 64 after 512-token prompts, sampled on the device. */
    static const int batches[3] = {1, 16, 64};
    for (int bi = 0; bi < 3; bi++) {
        double tok_s = 0;
        int steps = batches[bi] == 1 ? 128 : 64;
        if ((rc = e2e_decode(e, toks, batches[bi], 512, steps, &tok_s, &a, &b)) != 0)
            goto done;
        char rest[64], note[96];
        snprintf(rest, sizeof rest, "decode_b%d_tokens_per_s", batches[bi]);
        snprintf(note, sizeof note, "batch %d after 512-token prompts, %d steps", batches[bi],
                 steps);
        e2e_add(rep, "e2e_", tag, rest, tok_s, note);
        if (batches[bi] == 1) /* the name earlier sessions reported */
            e2e_add(rep, "e2e_", tag, "decode_tokens_per_s", tok_s, "batch 1 after 512");
        snprintf(rest, sizeof rest, "decode_b%d", batches[bi]);
        e2e_add_stats(rep, tag, rest, &a, &b);
    }
    /* Batch 1 after a 4096-token prompt: more of the step is attention. */
    {
        double tok_s = 0;
        if ((rc = e2e_decode(e, toks, 1, 4096, 128, &tok_s, &a, &b)) != 0)
            goto done;
        e2e_add(rep, "e2e_", tag, "decode_b1_ctx4k_tokens_per_s", tok_s,
                "batch 1 after a 4096-token prompt, 128 steps");
        e2e_add_stats(rep, tag, "decode_b1_ctx4k", &a, &b);
    }
    if (decode_only) {
        rc = 0;
        goto done;
    }
    /* TTFT: 4096 tokens cold (caching 4032), then the same prompt from the cache. */
    for (int pass = 0; pass < 2; pass++) {
        if ((rc = eng_seq_create(e, &s)) != 0)
            goto done;
        double t0 = bench_now_s();
        uint32_t reused = 0;
        if (pass == 1 && (rc = eng_seq_start_cached(e, s, 42, toks, 4096, &reused)) != 0)
            goto done;
        eng_batch_item_t it = {.seq = s,
                               .tokens = toks + reused,
                               .n_tokens = 4096 - reused,
                               .logits = ENG_LOGITS_LAST};
        if ((rc = eng_forward(e, &it, 1, logits)) < 0)
            goto done;
        double ms = (bench_now_s() - t0) * 1e3;
        if (pass == 0 && (rc = eng_prefix_insert(e, s, 42, 4032)) != 0)
            goto done;
        e2e_add(rep, "ttft_", tag, pass == 0 ? "ms_cold" : "ms_cached", ms,
                pass == 0 ? "4096 tokens" : "4032 of 4096 cached");
        eng_seq_free(e, s);
        s = NULL;
    }
    rc = 0;
done:
    if (s != NULL)
        eng_seq_free(e, s);
    free(toks);
    free(logits);
    eng_free(e);
    return rc > 0 ? PC_ERR_NOSPACE : rc;
}
#endif

int bench_kernels_main(int argc, char **argv)
{
    const char *model = "models/kvgw-bench.gguf";
    int iters = 20;
    bool e2e = true, e2e_only = false, e2e_decode = false;
    const char *tag = "";
    enum eng_kv_dtype kv_dtype = ENG_KV_F16; /* the end-to-end engine's KV */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
            model = argv[++i];
        } else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
            iters = atoi(argv[++i]);
            if (iters < 1 || iters > 100000) {
                fprintf(stderr, "kvgw bench kernels: --iters must be 1..100000\n");
                usage(stderr);
                return 2;
            }
        } else if (strcmp(argv[i], "--e2e-only") == 0) {
            e2e_only = true;
        } else if (strcmp(argv[i], "--e2e-decode") == 0) {
            e2e_decode = true;
        } else if (strcmp(argv[i], "--tag") == 0 && i + 1 < argc) {
            tag = argv[++i];
            for (const char *t = tag; *t; t++)
                if (!((*t >= 'a' && *t <= 'z') || (*t >= '0' && *t <= '9') || *t == '_')) {
                    fprintf(stderr, "kvgw bench kernels: --tag takes [a-z0-9_]\n");
                    usage(stderr);
                    return 2;
                }
        } else if (strcmp(argv[i], "--kv-dtype") == 0 && i + 1 < argc) {
            if (eng_kv_dtype_parse(argv[++i], &kv_dtype) != 0) {
                fprintf(stderr, "kvgw bench kernels: --kv-dtype: '%s' is not f16, f32 or q8_0\n",
                        argv[i]);
                usage(stderr);
                return 2;
            }
        } else if (strcmp(argv[i], "--no-e2e") == 0) {
            e2e = false;
        } else {
            fprintf(stderr, "kvgw bench kernels: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    bench_report_t rep;
    bench_report_init(&rep, "kernels");
#ifdef KVGW_HAVE_CUDA
    char why[256];
    if (krn_device_probe(why, sizeof why) == 0) {
        fprintf(stderr, "kvgw bench kernels: no usable CUDA device (%s); nothing measured\n", why);
        bench_report_print(&rep);
        return 0;
    }
    char desc[256];
    krn_device_describe(0, desc, sizeof desc);
    printf("device: %s\n", desc);
    krn_device_info_t info;
    double peak = krn_device_info(0, &info) == 0 ? info.peak_gb_per_s : 0;
    if (peak > 0)
        bench_report_add(&rep, "device_peak_gb_per_s", peak, info.name);
    if (e2e_only) {
        if (!e2e || bench_e2e(model, tag, e2e_decode, kv_dtype, &rep) != 0)
            fprintf(stderr, "kvgw bench kernels: end-to-end part skipped\n");
        bench_report_print(&rep);
        return 0;
    }
    krn_ctx_t *c = NULL;
    if (krn_ctx_init(0, &c) != 0) {
        fprintf(stderr, "kvgw bench kernels: cannot create a CUDA context\n");
        return 1;
    }
    double bytes = 0, flops = 0;
    double s = bench_attention(c, 32, 8, 32, 8192, 1, iters, &bytes, &flops);
    if (s > 0) {
        double gbs = bytes / s * 1e-9;
        bench_report_add(&rep, "decode_attn_gb_per_s", gbs, "batch 32 x 8K, F16 KV");
        bench_report_add(&rep, "decode_attn_us", s * 1e6, NULL);
    }
    /* The decode grid of the bandwidth target: GQA 8:1, batch 1 and 64, 4K and 32K. */
    const int32_t grid_b[2] = {1, 64}, grid_ctx[2] = {4096, 32768};
    for (int bi = 0; bi < 2; bi++)
        for (int ci = 0; ci < 2; ci++) {
            s = bench_attention(c, 64, 8, grid_b[bi], grid_ctx[ci], 1, iters, &bytes, &flops);
            if (s <= 0)
                continue;
            char key[64], note[96];
            double gbs = bytes / s * 1e-9;
            snprintf(note, sizeof note, "batch %d x %dK, 64/8 heads, %.1f us", grid_b[bi],
                     grid_ctx[ci] / 1024, s * 1e6);
            snprintf(key, sizeof key, "decode_attn_b%d_ctx%dk_gb_per_s", grid_b[bi],
                     grid_ctx[ci] / 1024);
            bench_report_add(&rep, key, gbs, note);
            if (peak > 0) {
                snprintf(key, sizeof key, "decode_attn_b%d_ctx%dk_pct_peak", grid_b[bi],
                         grid_ctx[ci] / 1024);
                bench_report_add(&rep, key, 100.0 * gbs / peak, "target >= 70");
            }
        }
    /* The same grid on the split-KV decode kernel (krn_decode.cu), F16 then q8_0 KV. */
    double f16_s[2][2] = {{0}};
    for (int bi = 0; bi < 2; bi++)
        for (int ci = 0; ci < 2; ci++) {
            s = bench_decode(c, KRN_F16, 64, 8, grid_b[bi], grid_ctx[ci],
                             info.n_sm > 0 ? info.n_sm : 1, iters, &bytes);
            if (s <= 0)
                continue;
            f16_s[bi][ci] = s;
            char key[64], note[96];
            double gbs = bytes / s * 1e-9;
            snprintf(note, sizeof note, "split-KV kernel, batch %d x %dK, %.1f us", grid_b[bi],
                     grid_ctx[ci] / 1024, s * 1e6);
            snprintf(key, sizeof key, "decode_splitkv_b%d_ctx%dk_gb_per_s", grid_b[bi],
                     grid_ctx[ci] / 1024);
            bench_report_add(&rep, key, gbs, note);
            if (peak > 0) {
                snprintf(key, sizeof key, "decode_splitkv_b%d_ctx%dk_pct_peak", grid_b[bi],
                         grid_ctx[ci] / 1024);
                bench_report_add(&rep, key, 100.0 * gbs / peak, "target >= 70");
            }
        }
    for (int bi = 0; bi < 2; bi++)
        for (int ci = 0; ci < 2; ci++) {
            s = bench_decode(c, KRN_Q8_0, 64, 8, grid_b[bi], grid_ctx[ci],
                             info.n_sm > 0 ? info.n_sm : 1, iters, &bytes);
            if (s <= 0)
                continue;
            char key[64], note[112];
            double gbs = bytes / s * 1e-9;
            snprintf(note, sizeof note,
                     "split-KV kernel, q8_0 KV (34/64 of F16's bytes), %.0f MB, %.1f us",
                     bytes * 1e-6, s * 1e6);
            snprintf(key, sizeof key, "decode_splitkv_q8_0_b%d_ctx%dk_gb_per_s", grid_b[bi],
                     grid_ctx[ci] / 1024);
            bench_report_add(&rep, key, gbs, note);
            if (peak > 0) {
                snprintf(key, sizeof key, "decode_splitkv_q8_0_b%d_ctx%dk_pct_peak", grid_b[bi],
                         grid_ctx[ci] / 1024);
                bench_report_add(&rep, key, 100.0 * gbs / peak, "KV bytes moved / peak");
            }
            if (f16_s[bi][ci] > 0) {
                snprintf(key, sizeof key, "decode_splitkv_q8_0_b%d_ctx%dk_speedup_vs_f16",
                         grid_b[bi], grid_ctx[ci] / 1024);
                bench_report_add(&rep, key, f16_s[bi][ci] / s,
                                 "F16 time / q8_0 time, same shape (ideal 64/34 = 1.88)");
            }
        }
    for (int bi = 0; bi < 2; bi++) {
        static const char *const names[3] = {"", "greedy_", "topp_"};
        static const char *const notes[3] = {"V 152064, top_k 50, top_p 0.9", "V 152064, greedy",
                                             "V 152064, top_p 0.9, top_k off"};
        for (int impl = 0; impl < 3; impl++) /* radix, bitwise, radix without the plan */
            for (int mode = 0; mode < 3; mode++) {
                if ((impl == 1 && mode == 2) || (impl == 2 && mode == 0))
                    continue;
                s = bench_sample(c, impl == 1 ? krn_sample_bitwise : krn_sample_radix, mode,
                                 impl == 0, grid_b[bi], 152064, impl == 1 ? iters / 4 + 1 : iters);
                if (s <= 0)
                    continue;
                char key[64], note[96];
                snprintf(key, sizeof key, "sample_%s%s%sb%d_us", impl == 1 ? "bitwise_" : "",
                         names[mode], impl == 2 ? "noplan_" : "", grid_b[bi]);
                snprintf(note, sizeof note, "%s%s", notes[mode],
                         impl == 1   ? ", one-CTA-per-row kernel"
                         : impl == 2 ? ", multi-pass kernel, every launch (no plan)"
                                     : ", multi-pass kernel");
                bench_report_add(&rep, key, s * 1e6, note);
            }
    }
    s = bench_attention(c, 32, 8, 4, 2048, 2048, iters / 4 + 1, &bytes, &flops);
    if (s > 0)
        bench_report_add(&rep, "prefill_attn_tflop_per_s", flops / s * 1e-12, "4 x 2048 causal");
    /* Prefill attention on tensor cores (krn_attn_tc.cu) and on the SIMT kernel
     * (KVGW_CUDA_ATTN=simt): a 4K prompt, and 4K new tokens after 4K cached, 32 query / 4 KV
     * heads (GQA 8:1), head_dim 128, F16 KV; causal FLOPs only (4 * heads * head_dim per
     * (query, key) pair a row sees). */
    {
        const char *old = getenv("KVGW_CUDA_ATTN");
        char saved[32] = "";
        if (old != NULL)
            snprintf(saved, sizeof saved, "%s", old);
        /* tc: 8-warp CTAs (the default); tc64: 4-warp CTAs of one task each. */
        const char *kname[3] = {"tc", "tc64", "simt"};
        const char *knote[3] = {"tensor cores, 8 warps", "tensor cores, 4 warps", "SIMT"};
        const int32_t pctx[2] = {4096, 8192};
        for (int k = 0; k < 3; k++)
            for (int ci = 0; ci < 2; ci++) {
                if (k > 0)
                    setenv("KVGW_CUDA_ATTN", kname[k], 1);
                else
                    unsetenv("KVGW_CUDA_ATTN");
                s = bench_attention(c, 32, 4, 1, pctx[ci], 4096, iters / 4 + 1, &bytes, &flops);
                if (s <= 0)
                    continue;
                char key[64], note[96];
                snprintf(key, sizeof key, "prefill_attn_%s_%s_tflop_per_s", kname[k],
                         ci ? "4k_cached4k" : "4k");
                snprintf(note, sizeof note, "%s, 4096 new after %d cached, 32/4 heads, %.2f ms",
                         knote[k], pctx[ci] - 4096, s * 1e3);
                bench_report_add(&rep, key, flops / s * 1e-12, note);
            }
        if (old != NULL)
            setenv("KVGW_CUDA_ATTN", saved, 1);
        else
            unsetenv("KVGW_CUDA_ATTN");
    }
    double tf = bench_gemm(c, KRN_F16, 4096, 4096, 4096, iters);
    if (tf > 0)
        bench_report_add(&rep, "gemm_f16_tflop_per_s", tf, "4096^3");
    tf = bench_gemm(c, KRN_BF16, 4096, 4096, 4096, iters);
    if (tf > 0)
        bench_report_add(&rep, "gemm_bf16_tflop_per_s", tf, "4096^3");
    tf = bench_gemm(c, KRN_BF16, 4096, 14336, 4096, iters);
    if (tf > 0)
        bench_report_add(&rep, "gemm_bf16_ffn_tflop_per_s", tf, "4096 x 14336 x 4096");
    const enum krn_qtype qts[] = {KRN_QT_Q4_0, KRN_QT_Q8_0, KRN_QT_Q4_K, KRN_QT_Q5_K, KRN_QT_Q6_K};
    const char *const qnames[] = {"q4_0", "q8_0", "q4_k", "q5_k", "q6_k"};
    for (size_t qi = 0; qi < sizeof qts / sizeof *qts; qi++) {
        for (int32_t m = 1; m <= KRN_QGEMV_MAX_ROWS; m += KRN_QGEMV_MAX_ROWS - 1) {
            double qsec = bench_qmatmul(c, qts[qi], m, 14336, 4096, iters);
            if (qsec <= 0)
                continue;
            double qbytes = (double)krn_qtype_row_bytes(qts[qi], 4096) * 14336;
            char key[96], note[96];
            snprintf(key, sizeof key, "qgemv_%s_b%d_gb_per_s", qnames[qi], (int)m);
            snprintf(note, sizeof note, "14336 x 4096, %.2f bits/weight, %.1f us",
                     qbytes * 8 / (14336.0 * 4096), qsec * 1e6);
            bench_report_add(&rep, key, qbytes / qsec * 1e-9, note);
            if (peak > 0) {
                snprintf(key, sizeof key, "qgemv_%s_b%d_pct_peak", qnames[qi], (int)m);
                bench_report_add(&rep, key, 100.0 * qbytes / qsec * 1e-9 / peak, NULL);
            }
        }
    }
    double qs = bench_qmatmul(c, KRN_QT_Q4_K, 512, 14336, 4096, iters);
    if (qs > 0)
        bench_report_add(&rep, "qgemm_q4_k_m512_tflop_per_s", 2.0 * 512 * 14336 * 4096 / qs * 1e-12,
                         "dequantize to F16 in 64 MiB chunks + cuBLAS");
    krn_ctx_free(c);
    if (e2e && bench_e2e(model, tag, e2e_decode, kv_dtype, &rep) != 0)
        fprintf(stderr, "kvgw bench kernels: end-to-end part skipped\n");
#else
    (void)model;
    (void)iters;
    (void)e2e;
    (void)e2e_only;
    (void)e2e_decode;
    (void)tag;
    fprintf(stderr, "kvgw bench kernels: built without CUDA; no GPU to measure\n");
#endif
    bench_report_print(&rep);
    return 0;
}
