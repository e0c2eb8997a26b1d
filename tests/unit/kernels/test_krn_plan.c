/*
 * test_krn_plan.c — the cuda backend's host-side decisions, on any machine (label unit): the
 * reason a CUDA device is unusable, each GEMM's input type and the activation bounds behind it,
 * the device memory plan of the KV pool, and the sampler's final pick as the CUDA kernel splits
 * it over threads (krn_hostdev.h: the very code the kernel runs), including scans that are
 * not monotone and targets on a boundary; the cuda step's packed layout, graph keys and the
 * split-KV decode kernel's step plan (which path a step takes, split sizing, partials).
 */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "krn_hostdev.h"
#include "krn_testutil.h"
#include "pc_assert.h"
#include "pc_err.h"
#include "pc_test.h"

PC_TEST(cuda_failure_reasons_name_the_cause)
{
    char b[256];
    /* cudaErrorInsufficientDriver (35) with a driver older than the runtime. */
    krn_describe_cuda_failure(35, "cudaErrorInsufficientDriver",
                              "CUDA driver version is insufficient for CUDA runtime version", 12040,
                              13000, b, sizeof b);
    ASSERT_TRUE(strstr(b, "supports CUDA 12.4 but this build needs CUDA 13.0") != NULL);
    ASSERT_TRUE(strstr(b, "update the driver") != NULL);
    ASSERT_TRUE(strstr(b, "cudaErrorInsufficientDriver") != NULL);
    /* No driver at all. */
    krn_describe_cuda_failure(35, "cudaErrorInsufficientDriver", "insufficient", 0, 13000, b,
                              sizeof b);
    ASSERT_TRUE(strncmp(b, "no NVIDIA driver", 16) == 0);
    /* Success with zero devices, and any other error with both versions. */
    krn_describe_cuda_failure(0, "cudaSuccess", "no error", 13000, 13000, b, sizeof b);
    ASSERT_TRUE(strstr(b, "no CUDA device") != NULL);
    krn_describe_cuda_failure(100, "cudaErrorNoDevice", "no CUDA-capable device is detected", 13000,
                              13000, b, sizeof b);
    ASSERT_TRUE(strstr(b, "cudaErrorNoDevice") != NULL);
    ASSERT_TRUE(strstr(b, "driver CUDA 13.0, runtime CUDA 13.0") != NULL);
    /* A short buffer is truncated, never overrun. */
    char small[8];
    memset(small, 'x', sizeof small);
    krn_describe_cuda_failure(0, "cudaSuccess", "no error", 13000, 13000, small, sizeof small);
    ASSERT_EQ(strlen(small), 7u);
}

PC_TEST(gemm_dtype_keeps_activations_in_range)
{
    krn_gemm_dtype_params_t p = {
        .file_dtype = KRN_F16, .weight_amax = 3.0f, .act_bound = 100.0, .act_amax_measured = -1};
    ASSERT_EQ(krn_gemm_dtype(&p), KRN_F16);
    /* BF16 in the file: BF16 whatever the ranges. */
    p.file_dtype = KRN_BF16;
    ASSERT_EQ(krn_gemm_dtype(&p), KRN_BF16);
    /* F32 weights, small activations: F16 (more significant bits). */
    p.file_dtype = KRN_F32;
    ASSERT_EQ(krn_gemm_dtype(&p), KRN_F16);
    /* A weight past F16's range, or a NaN amax. */
    p.weight_amax = 70000.0f;
    ASSERT_EQ(krn_gemm_dtype(&p), KRN_BF16);
    p.weight_amax = NAN;
    ASSERT_EQ(krn_gemm_dtype(&p), KRN_BF16);
    p.weight_amax = 3.0f;
    /* The bound exactly at the limit is fine; above it, and unbounded, is not. */
    p.act_bound = KRN_F16_MAX;
    ASSERT_EQ(krn_gemm_dtype(&p), KRN_F16);
    p.act_bound = nextafter(KRN_F16_MAX, INFINITY);
    ASSERT_EQ(krn_gemm_dtype(&p), KRN_BF16);
    p.act_bound = INFINITY;
    ASSERT_EQ(krn_gemm_dtype(&p), KRN_BF16);
    p.act_bound = NAN;
    ASSERT_EQ(krn_gemm_dtype(&p), KRN_BF16);
    /* A measured amax allows F16 only with its headroom. */
    p.act_bound = INFINITY;
    p.act_amax_measured = KRN_F16_MAX / KRN_F16_MEASURED_HEADROOM;
    ASSERT_EQ(krn_gemm_dtype(&p), KRN_F16);
    p.act_amax_measured = KRN_F16_MAX / KRN_F16_MEASURED_HEADROOM * 1.01;
    ASSERT_EQ(krn_gemm_dtype(&p), KRN_BF16);
    p.act_amax_measured = 0.0;
    ASSERT_EQ(krn_gemm_dtype(&p), KRN_F16);
}

/* y = rmsnorm(x) * w, as the backend computes it (F32 in, double here). */
static void normed(const float *x, const float *w, int32_t n, double *y)
{
    double ss = 0;
    for (int32_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    double sc = 1.0 / sqrt(ss / n + 1e-6);
    for (int32_t i = 0; i < n; i++)
        y[i] = x[i] * sc * w[i];
}

PC_TEST(activation_bounds_hold_and_are_tight)
{
    enum { D = 256, NO = 64 };
    kt_rng_t r = {41};
    float x[D], w[D], W[NO * D], Wu[NO * D], b[NO];
    double y[D];
    float wmax = 0, bmax = 0;
    for (int i = 0; i < D; i++) {
        w[i] = kt_unif(&r) * 3;
        wmax = fabsf(w[i]) > wmax ? fabsf(w[i]) : wmax;
    }
    double rn = 0, rnu = 0;
    for (int j = 0; j < NO; j++) {
        double s = 0, su = 0;
        for (int i = 0; i < D; i++) {
            W[j * D + i] = kt_unif(&r);
            Wu[j * D + i] = kt_unif(&r) * 0.5f;
            s += (double)W[j * D + i] * W[j * D + i];
            su += (double)Wu[j * D + i] * Wu[j * D + i];
        }
        rn = sqrt(s) > rn ? sqrt(s) : rn;
        rnu = sqrt(su) > rnu ? sqrt(su) : rnu;
        b[j] = kt_unif(&r);
        bmax = fabsf(b[j]) > bmax ? fabsf(b[j]) : bmax;
    }
    double bn = krn_act_bound_normed(D, wmax), bp = krn_act_bound_proj(D, wmax, rn, bmax);
    double bg = krn_act_bound_proj(D, wmax, rn, 0), bu = krn_act_bound_proj(D, wmax, rnu, 0);
    double bs = krn_act_bound_swiglu(bg, bu);
    ASSERT_NEAR(bn, 16.0 * wmax, 1e-4);
    double seen_n = 0;
    for (int trial = 0; trial < 200; trial++) {
        /* Random rows, rows with one huge outlier ("massive activations"), and one-hot rows,
         * which reach the normed bound. */
        for (int i = 0; i < D; i++)
            x[i] = trial % 3 == 0 ? kt_unif(&r) : trial % 3 == 1 ? kt_unif(&r) * 1e-3f : 0.0f;
        x[kt_below(&r, D)] = trial % 3 == 0 ? 1.0f : 3e4f;
        normed(x, w, D, y);
        for (int i = 0; i < D; i++) {
            ASSERT_LE(fabs(y[i]), bn);
            seen_n = fabs(y[i]) > seen_n ? fabs(y[i]) : seen_n;
        }
        for (int j = 0; j < NO; j++) {
            double z = b[j], g = 0, u = 0;
            for (int i = 0; i < D; i++) {
                z += y[i] * W[j * D + i];
                g += y[i] * W[j * D + i];
                u += y[i] * Wu[j * D + i];
            }
            ASSERT_LE(fabs(z), bp);
            double sw = g / (1 + exp(-g)) * u;
            ASSERT_LE(fabs(sw), bs);
        }
    }
    ASSERT_LE(bn * 0.999, seen_n); /* reached by a one-hot row at the largest norm weight */
    /* Unknown inputs give no bound. */
    ASSERT_TRUE(isinf(krn_act_bound_normed(0, 1.0f)));
    ASSERT_TRUE(isinf(krn_act_bound_proj(D, NAN, 1.0, 0)));
    ASSERT_TRUE(isinf(krn_act_bound_swiglu(NAN, 1.0)));
    /* Llama-like scales: the normed inputs fit F16 by proof, the down projection's input does
     * not (so it runs in BF16 unless a measured amax allows F16). */
    double llama_g = krn_act_bound_proj(4096, 2.0f, 4.0, 0);
    krn_gemm_dtype_params_t dp = {.file_dtype = KRN_F16,
                                  .weight_amax = 1.0f,
                                  .act_bound = krn_act_bound_normed(4096, 2.0f),
                                  .act_amax_measured = -1};
    ASSERT_EQ(krn_gemm_dtype(&dp), KRN_F16);
    dp.act_bound = krn_act_bound_swiglu(llama_g, llama_g);
    ASSERT_EQ(krn_gemm_dtype(&dp), KRN_BF16);
}

PC_TEST(kv_memory_plan_keeps_headroom)
{
    const size_t GiB = (size_t)1 << 30, MiB = (size_t)1 << 20;
    krn_mem_plan_params_t p = krn_mem_plan_params_default();
    ASSERT_NEAR(p.headroom_frac, 0.05, 1e-12);
    ASSERT_EQ(p.headroom_min_bytes, 512 * MiB);
    p.total_bytes = 80 * GiB;
    p.free_bytes = 79 * GiB;
    p.other_bytes = 20 * GiB;
    p.block_bytes = MiB;
    p.want_blocks = 1000;
    krn_mem_plan_t m;
    ASSERT_EQ(krn_mem_plan(&p, &m), 0);
    ASSERT_EQ(m.headroom_bytes, 4 * GiB); /* 5% of 80 GiB */
    ASSERT_EQ(m.max_blocks, (int64_t)((79 - 20 - 4) * 1024));
    ASSERT_EQ(m.kv_bytes, 1000 * MiB);
    p.want_blocks = m.max_blocks;
    ASSERT_EQ(krn_mem_plan(&p, &m), 0);
    p.want_blocks = m.max_blocks + 1;
    ASSERT_EQ(krn_mem_plan(&p, &m), PC_ERR_NOMEM);
    ASSERT_EQ(m.max_blocks, (int64_t)((79 - 20 - 4) * 1024)); /* still says what would fit */
    /* A small card: the minimum headroom wins. */
    p.total_bytes = 8 * GiB;
    p.free_bytes = 7 * GiB;
    p.other_bytes = GiB;
    p.want_blocks = 1;
    ASSERT_EQ(krn_mem_plan(&p, &m), 0);
    ASSERT_EQ(m.headroom_bytes, 512 * MiB);
    ASSERT_EQ(m.max_blocks, (int64_t)(5 * 1024 + 512));
    /* Nothing left: 0 blocks, never a wrapped-around count. */
    p.other_bytes = 7 * GiB;
    ASSERT_EQ(krn_mem_plan(&p, &m), PC_ERR_NOMEM);
    ASSERT_EQ(m.max_blocks, 0);
    p.want_blocks = 0;
    ASSERT_EQ(krn_mem_plan(&p, &m), 0);
    /* A pool whose byte size overflows, bad parameters. */
    p.want_blocks = INT64_MAX;
    ASSERT_EQ(krn_mem_plan(&p, &m), PC_ERR_NOMEM);
    p.want_blocks = -1;
    ASSERT_EQ(krn_mem_plan(&p, &m), PC_ERR_INVAL);
    p.want_blocks = 1;
    p.block_bytes = 0;
    ASSERT_EQ(krn_mem_plan(&p, &m), PC_ERR_INVAL);
    p.block_bytes = MiB;
    p.headroom_frac = -0.1;
    ASSERT_EQ(krn_mem_plan(&p, &m), PC_ERR_INVAL);
}

/* The kernel's final pick simulated on the host with its own code (krn_sample_may_own,
 * krn_sample_walk) over n_chunks thread ranges, with the chunk starts `before` perturbed by
 * up to `jitter` ulps each (a scan's rounding; jitter 0: exact serial prefix sums). u < 0
 * puts the target adversarially within `jitter` ulps of a random chunk's start instead of at
 * u times the total. Returns the pick and the number of chunks that may own the target. */
static int32_t sim_pick(const float *x, const double *w, int32_t V, uint64_t lo, double u,
                        int32_t n_chunks, int jitter, kt_rng_t *r, int *n_owners)
{
    if (u < 0 && jitter == 0)
        return -2;
    int32_t chunk = (V + n_chunks - 1) / n_chunks;
    double *local = calloc((size_t)n_chunks, sizeof *local);
    double *before = calloc((size_t)n_chunks, sizeof *before);
    double run = 0;
    for (int32_t t = 0; t < n_chunks; t++) {
        int32_t i0 = t * chunk < V ? t * chunk : V, i1 = i0 + chunk < V ? i0 + chunk : V;
        for (int32_t i = i0; i < i1; i++)
            if (w[i] > 0 && krn_sample_key(krn_sample_clamp(x[i]), i) >= lo)
                local[t] += w[i];
        before[t] = run;
        if (t > 0 && run > 0)
            for (int k = (int)kt_below(r, (uint32_t)(2 * jitter + 1)) - jitter; k != 0;
                 k += k > 0 ? -1 : 1)
                before[t] = nextafter(before[t], k > 0 ? INFINITY : 0.0);
        run += local[t];
    }
    double target = u * run;
    if (u < 0) {
        int32_t tc = (int32_t)kt_below(r, (uint32_t)n_chunks);
        target = before[tc];
        for (int k = (int)kt_below(r, (uint32_t)(2 * jitter + 1)) - jitter; k != 0;
             k += k > 0 ? -1 : 1)
            target = nextafter(target, k > 0 ? INFINITY : 0.0);
    }
    int owner = -1;
    *n_owners = 0;
    for (int32_t t = 0; t < n_chunks; t++)
        if (krn_sample_may_own(before[t], local[t], target)) {
            owner = t; /* the kernel takes the maximum index */
            (*n_owners)++;
        }
    int32_t pick = -1;
    if (owner >= 0) {
        int32_t i0 = owner * chunk < V ? owner * chunk : V;
        int32_t i1 = i0 + chunk < V ? i0 + chunk : V;
        pick = krn_sample_walk(x, w, i0, i1, lo, before[owner], target);
    }
    free(local);
    free(before);
    return pick;
}

PC_TEST(sampler_pick_has_one_owner_and_never_misses)
{
    enum { V = 5000, NC = 1024 };
    kt_rng_t r = {42};
    float *x = malloc(sizeof(float) * V);
    double *w = malloc(sizeof(double) * V), *work = malloc(sizeof(double) * V);
    for (int iter = 0; iter < 60; iter++) {
        /* Quantized logits (many ties), some far below the max (weights that underflow to 0),
         * NaN and -inf (never candidates). */
        float mx = -INFINITY;
        for (int i = 0; i < V; i++) {
            x[i] = (float)(int)(kt_unif(&r) * 8) * 0.5f;
            if (i % 97 == 5)
                x[i] = -2000.0f;
            if (i % 211 == 7)
                x[i] = NAN;
            if (i % 307 == 9)
                x[i] = -INFINITY;
            if (x[i] > mx)
                mx = x[i];
        }
        double total = 0;
        for (int i = 0; i < V; i++) {
            w[i] = x[i] > -INFINITY ? exp((double)x[i] - mx) : -1.0;
            total += w[i] > 0 ? w[i] : 0;
        }
        (void)total;
        /* Targets: random, and exactly on the serial prefix sums (and one ulp to each side). */
        for (int k = 0; k < 40; k++) {
            double u;
            if (k < 20) {
                u = (double)(kt_next(&r) >> 11) * 0x1.0p-53;
            } else {
                int32_t cut = (int32_t)kt_below(&r, V);
                double c = 0, t = 0;
                for (int i = 0; i < V; i++)
                    if (w[i] > 0) {
                        t += w[i];
                        if (i < cut)
                            c += w[i];
                    }
                u = c / t;
                u = k % 3 == 0 ? u : k % 3 == 1 ? nextafter(u, 0.0) : nextafter(u, 1.0);
                if (u >= 1.0)
                    u = nextafter(1.0, 0.0);
            }
            for (int jitter = 0; jitter <= 4; jitter += 4) {
                int owners;
                int32_t pick = sim_pick(x, w, V, 0, u, NC, jitter, &r, &owners);
                ASSERT_TRUE(owners >= 1);
                ASSERT_TRUE(pick >= 0 && pick < V);
                ASSERT_TRUE(w[pick] > 0);
                /* Away from a boundary the pick is the reference's (engine/sampling.c's rules,
                 * summed in id order). */
                if (k < 20) {
                    krn_sample_row_t row = {.temperature = 1, .top_p = 1, .u = u};
                    int32_t want = -2;
                    krn_sample_args_t a = {.logits = x,
                                           .row = &row,
                                           .token = &want,
                                           .work = work,
                                           .n_rows = 1,
                                           .n_vocab = V};
                    ASSERT_EQ(krn_ref_sample(&a), 0);
                    ASSERT_EQ(pick, want);
                }
            }
        }
    }
    /* Targets within a few ulps of a chunk's start while the starts themselves are off by a
     * few ulps (non-monotone): the old "the chunk whose interval holds the target" rule finds
     * no chunk or two there; the maximum index over may-own finds one, with a kept pick. */
    for (int k = 0; k < 2000; k++) {
        int owners;
        int32_t pick = sim_pick(x, w, V, 0, -1.0, NC, 8, &r, &owners);
        ASSERT_TRUE(owners >= 1);
        ASSERT_TRUE(pick >= 0 && pick < V);
        ASSERT_TRUE(w[pick] > 0);
    }
    /* u just below 1: the last positive weight, never -1. */
    int owners;
    int32_t pick = sim_pick(x, w, V, 0, nextafter(1.0, 0.0), NC, 4, &r, &owners);
    int32_t last = V - 1;
    while (!(w[last] > 0))
        last--;
    ASSERT_EQ(pick, last);
    /* Only chunk 700 has mass, and the perturbed starts of the chunks after it lie below the
     * target: the maximum index still lands on the one chunk with mass. */
    for (int i = 0; i < V; i++)
        w[i] = -1.0;
    w[700 * 5 + 2] = 1.0;
    pick = sim_pick(x, w, V, 0, 0.5, NC, 0, &r, &owners);
    ASSERT_EQ(owners, 1);
    ASSERT_EQ(pick, 700 * 5 + 2);
    /* No positive mass: no owner (the kernel then writes the argmax, not -1). */
    w[700 * 5 + 2] = 0.0;
    pick = sim_pick(x, w, V, 0, 0.5, NC, 0, &r, &owners);
    ASSERT_EQ(owners, 0);
    ASSERT_EQ(pick, -1);
    free(x);
    free(w);
    free(work);
}

/* The reference on targets that land exactly on a prefix sum: equal logits give weights of
 * exactly 1, so u = k / n puts the target on the boundary after id k - 1, and the pick is id k
 * (the first whose running sum exceeds the target); never -1, whatever u in [0, 1). */
PC_TEST(reference_sampler_on_exact_boundaries)
{
    enum { V = 64 };
    float x[V];
    double work[V];
    for (int i = 0; i < V; i++)
        x[i] = 1.5f;
    for (int k = 0; k <= V; k++) {
        double u = k < V ? (double)k / V : nextafter(1.0, 0.0);
        krn_sample_row_t row = {.temperature = 0.7f, .top_p = 1, .u = u};
        int32_t tok = -2;
        krn_sample_args_t a = {
            .logits = x, .row = &row, .token = &tok, .work = work, .n_rows = 1, .n_vocab = V};
        ASSERT_EQ(krn_ref_sample(&a), 0);
        ASSERT_EQ(tok, k < V ? k : V - 1);
        /* The kernel's split gives the same on these exact sums. */
        for (int i = 0; i < V; i++)
            work[i] = 1.0;
        int owners;
        kt_rng_t r = {43};
        ASSERT_EQ(sim_pick(x, work, V, 0, u, 16, 0, &r, &owners), k < V ? k : V - 1);
        ASSERT_EQ(owners >= 1, true);
    }
    /* A tiny temperature: every weight but the maximum's underflows to 0; the pick is the
     * maximum (positive mass), for any draw. */
    x[37] = 2.0f;
    for (int k = 0; k < 8; k++) {
        krn_sample_row_t row = {.temperature = 1e-30f, .top_p = 1, .u = k / 8.0};
        int32_t tok = -2;
        krn_sample_args_t a = {
            .logits = x, .row = &row, .token = &tok, .work = work, .n_rows = 1, .n_vocab = V};
        ASSERT_EQ(krn_ref_sample(&a), 0);
        ASSERT_EQ(tok, 37);
    }
}

PC_TEST(decode_kernel_shapes_and_split_plan)
{
    krn_kv_t kv = {.n_blocks = 1,
                   .n_layer = 1,
                   .n_head_kv = 8,
                   .head_dim = 128,
                   .block_tokens = 16,
                   .dtype = KRN_F16};
    ASSERT_EQ(krn_decode_check(&kv, 64), 0); /* GQA 8:1, head_dim 128: the target shape */
    ASSERT_EQ(krn_decode_warps(128, 16, 2), 4);
    ASSERT_EQ(krn_decode_slice_words(128, 16, 2), 512); /* 8 KiB of K+V per block */
    /* Shared memory: q (4 KiB) + 4 slices (32 KiB) + 4 x (8 x 16 + 24) floats. */
    ASSERT_EQ(krn_decode_smem_bytes(128, 16, 2, 8), 4096u + 32768u + 4u * 4u * (128u + 24u));
    ASSERT_EQ(krn_decode_check(&kv, 63), PC_ERR_INVAL);  /* not a multiple of the KV heads */
    ASSERT_EQ(krn_decode_check(&kv, 256), PC_ERR_INVAL); /* group 32 > 16 */
    kv.head_dim = 80;
    ASSERT_EQ(krn_decode_check(&kv, 64), PC_ERR_INVAL); /* not a multiple of 32 */
    kv.head_dim = 96;
    ASSERT_EQ(krn_decode_check(&kv, 64), 0);
    kv.head_dim = 256;
    ASSERT_EQ(krn_decode_check(&kv, 64), 0); /* group 8 x 256 = 2048 */
    ASSERT_EQ(krn_decode_check(&kv, 128), PC_ERR_INVAL);
    kv.dtype = KRN_F32;
    kv.block_tokens = 64;
    ASSERT_EQ(krn_decode_check(&kv, 8), PC_ERR_INVAL); /* a 128 KiB slice */
    kv.block_tokens = 32;
    ASSERT_EQ(krn_decode_check(&kv, 8), 0); /* 64 KiB: one warp */
    ASSERT_EQ(krn_decode_warps(256, 32, 4), 1);
    kv.block_tokens = 5;
    kv.head_dim = 32;
    kv.dtype = KRN_F16;
    ASSERT_EQ(krn_decode_check(&kv, 8), 0); /* any block size: head_dim % 32 makes 16-byte words */
    kv.dtype = KRN_BF16;
    kv.block_tokens = 16;
    ASSERT_EQ(krn_decode_check(&kv, 8), PC_ERR_INVAL); /* KV pools are F16 or F32 */

    /* Splits: whole blocks, about 2 x SMs CTAs, never slivers, never past the context. */
    const int32_t sms[] = {108, 132}, rows[] = {1, 8, 64, 256}, ctxs[] = {100, 4096, 32768};
    for (size_t a = 0; a < PC_ARRAY_LEN(sms); a++)
        for (size_t b = 0; b < PC_ARRAY_LEN(rows); b++)
            for (size_t c = 0; c < PC_ARRAY_LEN(ctxs); c++) {
                int32_t sp = krn_decode_split_tokens(sms[a], rows[b], 8, 16, ctxs[c], 0);
                ASSERT_TRUE(sp > 0 && sp % 16 == 0);
                int32_t blocks = (ctxs[c] + 15) / 16;
                ASSERT_LE(sp, blocks * 16);
                ASSERT_TRUE(sp >= 64 || sp == blocks * 16); /* at least 4 blocks */
                int64_t ctas = (int64_t)rows[b] * 8 * ((ctxs[c] + sp - 1) / sp);
                /* Enough CTAs wherever the context allows, and not many more than needed. */
                if (sp > 64) /* (whole blocks per split round the count a little down) */
                    ASSERT_TRUE(ctas * 10 >= 2 * sms[a] * 9 || sp == blocks * 16);
                if (rows[b] * 8 < 2 * sms[a] && sp > 64)
                    ASSERT_LE(ctas, 2 * sms[a] + rows[b] * 8);
            }
    /* Batch 1 at 32K on 132 SMs: 264 CTAs over 8 KV heads = 33 splits of 63 blocks. */
    ASSERT_EQ(krn_decode_split_tokens(132, 1, 8, 16, 32768, 0), 63 * 16);
    /* Batch 64: already 512 CTAs, so one split per row (the 4-block floor is moot). */
    ASSERT_EQ(krn_decode_split_tokens(132, 64, 8, 16, 4096, 0), 4096);
    ASSERT_EQ(krn_decode_split_tokens(0, 1, 8, 16, 4096, 0), 0);
    ASSERT_EQ(krn_decode_split_tokens(132, 1, 8, 16, 0, 0), 0);
}

/* The cuda step's packed lists (krn_step_layout): every section aligned, in order, of its
 * list's size and disjoint from the next; the sampling rules only when sampling; the same
 * shape gives the same layout (a replayed graph's addresses); bad counts are refused. */
PC_TEST(step_layout_is_aligned_ordered_and_a_function_of_the_shape)
{
    kt_rng_t r = {61};
    for (int it = 0; it < 500; it++) {
        krn_step_shape_t s = {.n_rows = 1 + (int32_t)kt_below(&r, 300),
                              .n_seqs = 1 + (int32_t)kt_below(&r, 70),
                              .max_blocks = (int32_t)kt_below(&r, 600),
                              .n_tasks = (int32_t)kt_below(&r, 2000),
                              .n_merges = (int32_t)kt_below(&r, 100),
                              .n_parts = (int32_t)kt_below(&r, 5000),
                              .sample = kt_below(&r, 2) == 1};
        s.n_logits = (int32_t)kt_below(&r, (uint32_t)s.n_rows + 1);
        krn_step_layout_t a, b;
        ASSERT_EQ(krn_step_layout(&s, &a), 0);
        const size_t off[8] = {a.tokens, a.pos,   a.row_seq, a.logit_rows,
                               a.tables, a.tasks, a.merges,  a.srows};
        const size_t len[8] = {(size_t)s.n_rows * 4,
                               (size_t)s.n_rows * 4,
                               (size_t)s.n_rows * 4,
                               (size_t)s.n_logits * 4,
                               (size_t)s.n_seqs * (size_t)s.max_blocks * 4,
                               (size_t)s.n_tasks * sizeof(krn_attn_task_t),
                               (size_t)s.n_merges * sizeof(krn_attn_merge_t),
                               s.sample ? (size_t)s.n_logits * sizeof(krn_sample_row_t) : 0};
        for (int i = 0; i < 8; i++) {
            ASSERT_EQ(off[i] % KRN_PACK_ALIGN, 0);
            size_t next = i < 7 ? off[i + 1] : a.bytes;
            if (i < 7)
                ASSERT_TRUE(off[i] + len[i] <= next);
            else
                ASSERT_EQ(off[i] + len[i], a.bytes);
            ASSERT_TRUE(next - (off[i] + len[i]) < KRN_PACK_ALIGN);
        }
        s.sample_plan = 0x5u; /* not a size: the layout ignores it */
        ASSERT_EQ(krn_step_layout(&s, &b), 0);
        ASSERT_MEM_EQ(&a, &b, sizeof a);
    }
    krn_step_shape_t bad = {.n_rows = 4, .n_seqs = 4, .max_blocks = 1, .n_logits = 5};
    krn_step_layout_t l;
    ASSERT_EQ(krn_step_layout(&bad, &l), PC_ERR_INVAL);
    bad.n_logits = 4;
    bad.n_tasks = -1;
    ASSERT_EQ(krn_step_layout(&bad, &l), PC_ERR_INVAL);
    bad.n_tasks = 0;
    bad.n_seqs = 1 << 20;
    bad.max_blocks = 1 << 12;
    ASSERT_EQ(krn_step_layout(&bad, &l), PC_ERR_INVAL);
}

/* A graph replays only for an equal shape (every field counts: each one changed alone makes
 * another shape), and only decode steps that the graph can carry whole are graphable. */
PC_TEST(step_graph_policy)
{
    const krn_step_shape_t base = {.n_rows = 16,
                                   .n_seqs = 16,
                                   .max_blocks = 40,
                                   .n_tasks = 64,
                                   .n_merges = 3,
                                   .n_parts = 96,
                                   .n_logits = 16,
                                   .sample = true,
                                   .sample_plan = 3,
                                   .dec_rows = 16,
                                   .dec_split = 64,
                                   .dec_splits = 17};
    ASSERT_TRUE(krn_step_same_shape(&base, &base));
    for (int f = 0; f < 12; f++) {
        krn_step_shape_t s = base;
        switch (f) {
        case 0:
            s.n_rows++;
            break;
        case 1:
            s.n_seqs++;
            break;
        case 2:
            s.max_blocks++;
            break;
        case 3:
            s.n_tasks++;
            break;
        case 4:
            s.n_merges++;
            break;
        case 5:
            s.n_parts++;
            break;
        case 6:
            s.n_logits--;
            break;
        case 7:
            s.sample = false;
            break;
        case 8:
            s.sample_plan ^= 1u;
            break;
        case 9:
            s.dec_split += 16; /* a launch argument of the decode kernel */
            break;
        case 10:
            s.dec_rows--; /* its rows */
            break;
        default:
            s.dec_splits++; /* its grid and the partials' stride */
            break;
        }
        if (krn_step_same_shape(&s, &base) || krn_step_same_shape(&base, &s))
            PC_TEST__FAIL("field %d changed, yet the same shape", f);
    }
    const krn_step_graph_params_t on = {.graphs = true,
                                        .packed = true,
                                        .decode = true,
                                        .fused_head = true,
                                        .logit_rows_identity = false,
                                        .logits_rows = 64};
    ASSERT_TRUE(krn_step_graphable(&base, &on));
    krn_step_graph_params_t p = on;
    p.graphs = false;
    ASSERT_FALSE(krn_step_graphable(&base, &p));
    p = on;
    p.packed = false; /* the graph reads the staging buffer's device twin */
    ASSERT_FALSE(krn_step_graphable(&base, &p));
    p = on;
    p.decode = false;
    ASSERT_FALSE(krn_step_graphable(&base, &p));
    p = on;
    p.fused_head = false; /* the unfused head's per-row copies: only rows 0, 1, .. */
    ASSERT_FALSE(krn_step_graphable(&base, &p));
    p.logit_rows_identity = true;
    ASSERT_TRUE(krn_step_graphable(&base, &p));
    krn_step_shape_t s = base;
    s.n_rows = s.n_seqs = KRN_GRAPH_MAX_ROWS + 1;
    s.n_logits = 1;
    ASSERT_FALSE(krn_step_graphable(&s, &on));
    s.n_rows = s.n_seqs = KRN_GRAPH_MAX_ROWS;
    ASSERT_TRUE(krn_step_graphable(&s, &on));
    s.n_seqs = s.n_rows - 1; /* not one row per sequence */
    ASSERT_FALSE(krn_step_graphable(&s, &on));
    /* Logits to the host: at most one head chunk (copied out after the replay); sampled rows
     * any number. */
    s = base;
    s.n_rows = s.n_seqs = s.n_logits = 100;
    ASSERT_TRUE(krn_step_graphable(&s, &on));
    s.sample = false;
    ASSERT_FALSE(krn_step_graphable(&s, &on));
    s.n_logits = 64;
    ASSERT_TRUE(krn_step_graphable(&s, &on));
    s.n_rows = s.n_seqs = 0;
    s.n_logits = 0;
    ASSERT_FALSE(krn_step_graphable(&s, &on));
}

/* Splits per row krn_decode_split_tokens aims at (about 2 * n_sm CTAs). */
static int64_t want_splits(int32_t n_sm, int32_t n_rows, int32_t n_head_kv)
{
    int64_t u = (int64_t)n_rows * n_head_kv;
    return (2 * (int64_t)n_sm + u - 1) / u;
}

/* The decode kernel's launch for a decode step (krn_decode_step_plan), over random step shapes:
 * the split is whole blocks, at least krn_decode_split_tokens's and at most 25% more, covers the
 * longest context in at most max_splits pieces; max_splits is the planned split count (about
 * 2 * n_sm CTAs) or 1 with the one-split constant; the partials fit krn_decode_part_slots for any
 * row count up to the allocation's; the kernel's own argument checks (krn_decode_attention)
 * hold; every row position maps to a split below max_splits. */
PC_TEST(decode_step_plan_sizes_splits_and_partials)
{
    kt_rng_t r = {71};
    static const int32_t sms[4] = {132, 114, 78, 8};
    static const int32_t hkvs[4] = {1, 2, 4, 8};
    static const int32_t bts[4] = {4, 8, 16, 32};
    for (int it = 0; it < 20000; it++) {
        int32_t n_sm = sms[kt_below(&r, 4)], hkv = hkvs[kt_below(&r, 4)];
        int32_t bt = bts[kt_below(&r, 4)], group = 1 + (int32_t)kt_below(&r, 8);
        int32_t n_rows = 1 + (int32_t)kt_below(&r, it % 3 == 0 ? 600 : 40);
        int32_t max_len = 1 + (int32_t)kt_below(&r, it % 5 == 0 ? 200000 : 9000);
        int32_t split, splits;
        ASSERT_EQ(krn_decode_step_plan(n_sm, n_rows, hkv, bt, max_len, &split, &splits), 0);
        int32_t base = krn_decode_split_tokens(n_sm, n_rows, hkv, bt, max_len, 0);
        ASSERT_TRUE(base > 0);
        ASSERT_TRUE(split > 0 && split % bt == 0);
        ASSERT_TRUE(splits >= 1);
        if (splits == 1) {
            ASSERT_EQ(split, KRN_DECODE_ONE_SPLIT / bt * bt);
            ASSERT_TRUE(split >= max_len);
        } else {
            ASSERT_EQ(splits, want_splits(n_sm, n_rows, hkv));
            ASSERT_TRUE(split >= base && (int64_t)split * 4 <= (int64_t)base * 5);
            ASSERT_TRUE((int64_t)split * splits >= max_len); /* every position has a split */
            ASSERT_TRUE(split < max_len);                    /* more than one is used */
            /* The grid: about twice the SM count, never more than one extra row's worth. */
            int64_t ctas = (int64_t)n_rows * hkv * splits;
            ASSERT_TRUE(ctas >= 2 * (int64_t)n_sm && ctas < 2 * (int64_t)n_sm + n_rows * hkv);
            int32_t n_head = hkv * group;
            int32_t max_rows = n_rows + (int32_t)kt_below(&r, 3000);
            int64_t slots = krn_decode_part_slots(n_sm, max_rows, n_head, hkv);
            ASSERT_TRUE((int64_t)n_rows * n_head * splits <= slots);
        }
        /* What krn_decode_attention checks before launching, and the kernel's row test. */
        ASSERT_TRUE((int64_t)n_rows * splits <= INT32_MAX);
        ASSERT_TRUE((max_len - 1) / split < splits);
    }
    /* Bad arguments. */
    int32_t sp, ns;
    ASSERT_EQ(krn_decode_step_plan(0, 1, 8, 16, 100, &sp, &ns), PC_ERR_INVAL);
    ASSERT_EQ(krn_decode_step_plan(132, 0, 8, 16, 100, &sp, &ns), PC_ERR_INVAL);
    ASSERT_EQ(krn_decode_step_plan(132, 1, 0, 16, 100, &sp, &ns), PC_ERR_INVAL);
    ASSERT_EQ(krn_decode_step_plan(132, 1, 8, 0, 100, &sp, &ns), PC_ERR_INVAL);
    ASSERT_EQ(krn_decode_step_plan(132, 1, 8, 16, 0, &sp, &ns), PC_ERR_INVAL);
    ASSERT_EQ(krn_decode_step_plan(132, 1, 8, 16, KRN_DECODE_ONE_SPLIT, &sp, &ns), PC_ERR_INVAL);
    ASSERT_TRUE(sp == 0 && ns == 0);
    /* H100 (132 SMs), GQA 8:1, 16-token blocks: batch 1 at 4k is 32 splits of 128 positions on
     * a grid of 33; batch 64 never splits. */
    ASSERT_EQ(krn_decode_step_plan(132, 1, 8, 16, 4096, &sp, &ns), 0);
    ASSERT_TRUE(sp == 128 && ns == 33);
    ASSERT_EQ(krn_decode_step_plan(132, 64, 8, 16, 32768, &sp, &ns), 0);
    ASSERT_TRUE(ns == 1);
    /* krn_decode_part_slots: the brute-force maximum over row counts, and small. */
    ASSERT_EQ(krn_decode_part_slots(0, 1, 8, 8), -1);
    ASSERT_EQ(krn_decode_part_slots(132, 0, 8, 8), -1);
    ASSERT_EQ(krn_decode_part_slots(132, 4, 0, 8), -1);
    ASSERT_EQ(krn_decode_part_slots(132, 4, 8, 0), -1);
    for (int32_t max_rows = 1; max_rows <= 700; max_rows += 37) {
        int64_t most = 0;
        for (int32_t n = 1; n <= max_rows; n++) {
            int64_t w = want_splits(132, n, 8);
            most = w > 1 && n * 64 * w > most ? n * 64 * w : most;
        }
        ASSERT_EQ(krn_decode_part_slots(132, max_rows, 64, 8), most);
    }
    /* 2048 rows, 64 heads, GQA 8:1: at most 2 x 64 x 33 slots (about 1 MiB of partials). */
    ASSERT_TRUE(krn_decode_part_slots(132, 2048, 64, 8) <= 2 * 64 * 33);
    /* One KV head: 263 rows of 2 splits each is the worst. */
    ASSERT_EQ(krn_decode_part_slots(132, 2048, 8, 1), 8 * 263 * 2);
}

/* A decode batch's shape (hence its graph) stays put while its contexts grow: over 4096 decode
 * steps from 512 positions, the split changes at most a dozen times at batch 1 and 16, never at
 * batch 64 (one split per row). */
PC_TEST(decode_step_plan_is_stable_as_contexts_grow)
{
    static const int32_t batches[3] = {1, 16, 64};
    static const int max_changes[3] = {12, 12, 0};
    for (int bi = 0; bi < 3; bi++) {
        int32_t prev_split = -1, prev_splits = -1;
        int changes = -1;
        for (int32_t len = 513; len <= 512 + 4096; len++) {
            int32_t sp, ns;
            ASSERT_EQ(krn_decode_step_plan(132, batches[bi], 8, 16, len, &sp, &ns), 0);
            if (sp != prev_split || ns != prev_splits)
                changes++;
            prev_split = sp;
            prev_splits = ns;
        }
        if (changes > max_changes[bi])
            PC_TEST__FAIL("batch %d: the decode plan changed %d times over 4096 steps (> %d)",
                          batches[bi], changes, max_changes[bi]);
    }
}

/* Which path a step takes (krn_step_decode_shape, as the backend calls it): the decode kernel
 * for the leading single-token rows (all of a decode step's, the decode rows before a mixed
 * step's prefill chunks) when the kernel is in use (KVGW_CUDA_DECODE not "attn",
 * krn_decode_use) and its partials fit; otherwise krn_attention's plan with the decode fields
 * 0, so such shapes differ from decode-kernel shapes. */
PC_TEST(step_decode_path_choice)
{
    krn_kv_t kv = {.n_blocks = 64,
                   .n_layer = 2,
                   .n_head_kv = 2,
                   .head_dim = 64,
                   .block_tokens = 8,
                   .dtype = KRN_F16};
    ASSERT_TRUE(krn_decode_use(&kv, 8, NULL));
    ASSERT_TRUE(krn_decode_use(&kv, 8, "kernel"));
    ASSERT_FALSE(krn_decode_use(&kv, 8, "attn"));
    kv.head_dim = 16; /* the decode kernel takes multiples of 32 */
    ASSERT_FALSE(krn_decode_use(&kv, 8, NULL));
    int32_t pos[5] = {7, 3000, 15, 32, 128};
    int64_t slots = krn_decode_part_slots(132, 256, 8, 2);
    /* A decode step: every row. */
    krn_step_shape_t s = {.n_rows = 5, .n_seqs = 5, .max_blocks = 400, .n_logits = 5};
    ASSERT_TRUE(krn_step_decode_shape(&s, pos, 5, true, 132, 8, 2, 8, slots));
    int32_t sp, ns;
    ASSERT_EQ(krn_decode_step_plan(132, 5, 2, 8, 3001, &sp, &ns), 0);
    ASSERT_TRUE(s.dec_rows == 5 && s.dec_split == sp && s.dec_splits == ns && ns > 1);
    krn_step_shape_t t = s;
    ASSERT_FALSE(krn_step_decode_shape(&t, pos, 0, true, 132, 8, 2, 8, slots)); /* prefill */
    ASSERT_TRUE(t.dec_rows == 0 && t.dec_split == 0 && t.dec_splits == 0);
    ASSERT_FALSE(krn_step_same_shape(&s, &t));
    t = s;
    ASSERT_FALSE(krn_step_decode_shape(&t, pos, 5, false, 132, 8, 2, 8, slots)); /* attn */
    ASSERT_TRUE(t.dec_rows == 0 && t.dec_split == 0 && t.dec_splits == 0);
    /* A mixed step: 2 decode rows, then a 100-row prefill chunk of a third sequence. Only the
     * decode rows' positions size the split (the 3000 of row 1 here). */
    int32_t mpos[102];
    mpos[0] = 40;
    mpos[1] = 3000;
    for (int i = 0; i < 100; i++)
        mpos[2 + i] = 5000 + i;
    krn_step_shape_t m = {.n_rows = 102, .n_seqs = 3, .max_blocks = 700, .n_logits = 3};
    ASSERT_TRUE(krn_step_decode_shape(&m, mpos, 2, true, 132, 8, 2, 8, slots));
    ASSERT_EQ(krn_decode_step_plan(132, 2, 2, 8, 3001, &sp, &ns), 0);
    ASSERT_TRUE(m.dec_rows == 2 && m.dec_split == sp && m.dec_splits == ns);
    t = m;
    ASSERT_FALSE(krn_step_decode_shape(&t, mpos, 4, true, 132, 8, 2, 8, slots));   /* > n_seqs */
    ASSERT_FALSE(krn_step_decode_shape(&t, mpos, 103, true, 132, 8, 2, 8, slots)); /* > rows */
    /* Partials that do not fit, no SM count, a bad position: krn_attention's plan. */
    t = s;
    ASSERT_EQ(krn_decode_step_plan(132, 5, 2, 8, 3001, &sp, &ns), 0);
    ASSERT_FALSE(krn_step_decode_shape(&t, pos, 5, true, 132, 8, 2, 8, (int64_t)5 * 8 * ns - 1));
    ASSERT_TRUE(krn_step_decode_shape(&t, pos, 5, true, 132, 8, 2, 8, (int64_t)5 * 8 * ns));
    ASSERT_FALSE(krn_step_decode_shape(&t, pos, 5, true, 0, 8, 2, 8, slots));
    int32_t bad[5] = {7, -1, 15, 32, 128};
    ASSERT_FALSE(krn_step_decode_shape(&t, bad, 5, true, 132, 8, 2, 8, slots));
    ASSERT_TRUE(t.dec_rows == 0 && t.dec_split == 0 && t.dec_splits == 0);
    /* One split (short contexts): no partials needed, any part_slots. */
    int32_t shortp[5] = {1, 2, 3, 4, 5};
    ASSERT_TRUE(krn_step_decode_shape(&t, shortp, 5, true, 132, 8, 2, 8, 0));
    ASSERT_TRUE(t.dec_splits == 1 && t.dec_split == KRN_DECODE_ONE_SPLIT / 8 * 8);
    /* The layout of a decode-kernel step carries no task or merge lists. */
    krn_step_layout_t lay;
    ASSERT_EQ(krn_step_layout(&s, &lay), 0);
    ASSERT_EQ(lay.tasks, lay.merges);
}

/* A mixed step's plan for the rows after the decode rows (as the backend makes it: over the
 * remaining sequences alone, task seq indices shifted back by the decode rows): together with
 * the decode rows it covers every row of the step exactly once for every KV head, each task's
 * table row is its own sequence's, and no task covers a decode row. */
PC_TEST(mixed_step_plan_covers_the_rows_after_the_decode_rows)
{
    enum { NS = 6, DEC = 3, HKV = 2 };
    const int32_t ntok[NS] = {1, 1, 1, 100, 1, 37}; /* a single-token chunk after a prefill */
    krn_plan_seq_t seqs[NS];
    int32_t row = 0;
    for (int s = 0; s < NS; s++) {
        seqs[s] = (krn_plan_seq_t){.row0 = row, .n_tokens = ntok[s], .pos0 = 700 * s};
        row += ntok[s];
    }
    int32_t n_lead = 0;
    while (n_lead < NS && seqs[n_lead].n_tokens == 1)
        n_lead++;
    ASSERT_EQ(n_lead, DEC);
    krn_plan_params_t pp = {.n_head = 8, .n_head_kv = HKV, .head_dim = 64, .split_kv = 512};
    int32_t nt, nm, np;
    ASSERT_EQ(krn_attn_plan(&pp, seqs + n_lead, NS - n_lead, NULL, &nt, NULL, &nm, &np), 0);
    krn_attn_task_t *tasks = calloc((size_t)nt, sizeof *tasks);
    krn_attn_merge_t *merges = calloc((size_t)nm + 1, sizeof *merges);
    ASSERT_EQ(krn_attn_plan(&pp, seqs + n_lead, NS - n_lead, tasks, &nt, merges, &nm, &np), 0);
    int32_t seen[HKV][200] = {{0}};
    for (int32_t i = 0; i < nt; i++) {
        tasks[i].seq += n_lead;
        const krn_attn_task_t *t = &tasks[i];
        ASSERT_TRUE(t->seq >= n_lead && t->seq < NS);
        ASSERT_TRUE(t->row0 >= seqs[t->seq].row0 &&
                    t->row0 + t->n_rows <= seqs[t->seq].row0 + seqs[t->seq].n_tokens);
        if (t->kv0 == 0) /* the first split (or the whole range) of these rows */
            for (int32_t r = t->row0; r < t->row0 + t->n_rows; r++)
                seen[t->kv_head][r]++;
    }
    for (int h = 0; h < HKV; h++)
        for (int32_t r = 0; r < row; r++)
            if (seen[h][r] != (r < DEC ? 0 : 1))
                PC_TEST__FAIL("KV head %d, row %d: %d tasks (want %d)", h, r, seen[h][r],
                              r < DEC ? 0 : 1);
    free(tasks);
    free(merges);
}

PC_TEST_MAIN()
