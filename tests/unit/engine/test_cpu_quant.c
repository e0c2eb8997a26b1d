/*
 * test_cpu_quant.c — the CPU kernels on quantized weights (Q8_0, Q4_0, Q5_0, Q5_1, Q4_K, Q5_K,
 * Q6_K), on every ISA path this CPU runs (avx512, avx2, portable):
 *   - the integer dot products (eng__*_dot_q) against the portable one (quant.h's reference)
 *     and against a double-precision product of the dequantized weight and activation rows,
 *     over random blocks with scales of every magnitude, all-zero blocks and extreme scales;
 *   - the decode GEMV (x quantized once, odd row counts, a slice of output rows, (+)=) and the
 *     whole product eng__matmul (the GEMV below ENG_GEMV_MAX_M rows, the integer prefill GEMM
 *     from it on, both on x quantized) against double precision over the dequantized weights
 *     and activations;
 *   - the activation quantizers of every path: the same bytes as the portable one, which is
 *     ggml-cpu's x86 arithmetic (transcribed here on its own, from llama.cpp's source);
 *   - the AVX-512 prefill GEMM on packed weight tiles: bit for bit the AVX-512 dot product.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "cpu_kernels.h"
#include "cpu_simd.h"
#include "gguf.h"
#include "half.h"
#include "pc_assert.h"
#include "pc_test.h"
#include "quant.h"

static uint64_t g_rng = 0x2545f4914f6cdd1dull;

static uint32_t rnd(void)
{
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 32);
}

static float unif(void) /* [-1, 1) */
{
    return (float)((double)rnd() * 0x1.0p-31 - 1);
}

static const eng_cpu_isa_t paths[] = {ENG_CPU_ISA_AVX512, ENG_CPU_ISA_AVX2, ENG_CPU_ISA_PORTABLE};
static const uint32_t qtypes[] = {ENG_GGML_TYPE_Q4_0, ENG_GGML_TYPE_Q5_0, ENG_GGML_TYPE_Q5_1,
                                  ENG_GGML_TYPE_Q4_K, ENG_GGML_TYPE_Q5_K, ENG_GGML_TYPE_Q6_K,
                                  ENG_GGML_TYPE_Q8_0};

static float dot_isa(eng_cpu_isa_t isa, uint32_t t, const void *w, const void *xq, uint32_t K)
{
#if defined(__x86_64__) || defined(__i386__)
    if (isa == ENG_CPU_ISA_AVX512)
        return eng__avx512_dot_q(t, w, xq, K);
    if (isa == ENG_CPU_ISA_AVX2)
        return eng__avx2_dot_q(t, w, xq, K);
#endif
    return eng__port_dot_q(t, w, xq, K);
}

static void gemv_isa(eng_cpu_isa_t isa, const eng_gemv_t *g, uint32_t n0, uint32_t n1)
{
#if defined(__x86_64__) || defined(__i386__)
    if (isa == ENG_CPU_ISA_AVX512) {
        eng__avx512_gemv(g, n0, n1);
        return;
    }
    if (isa == ENG_CPU_ISA_AVX2) {
        eng__avx2_gemv(g, n0, n1);
        return;
    }
#endif
    eng__port_gemv(g, n0, n1);
}

/* An F16 scale: mostly ordinary magnitudes, sometimes zero, subnormal or the largest finite
 * half (kind = 0 ordinary, 1 zero, 2 tiny, 3 huge). */
static uint16_t rnd_scale(int kind)
{
    switch (kind) {
    case 1:
        return 0;
    case 2:
        return (uint16_t)(1 + rnd() % 0x3ff); /* subnormal */
    case 3:
        return 0x7bff; /* 65504 */
    default:
        return eng_f32_to_f16((unif() * 0.5f + 1.0f) * ldexpf(1.0f, -(int)(rnd() % 12)));
    }
}

/* n_rows rows of K elements of type t with random bytes and random finite scales: every bit
 * pattern of quants, scales and high bits is a valid block, so only the F16 fields are chosen.
 * Block b of the whole matrix is all zero when b % 7 == 3; its scales are extreme when
 * b % 11 == 5 (with extreme true). */
static void *rnd_rows(uint32_t t, uint32_t n_rows, uint32_t K, bool extreme)
{
    size_t rb = eng_quant_row_bytes(t, K), nb = K / eng_ggml_type_block_size(t) * (size_t)n_rows;
    size_t bb = eng_quant_row_bytes(t, eng_ggml_type_block_size(t));
    uint8_t *w = malloc(rb * n_rows);
    for (size_t i = 0; i < rb * n_rows; i++)
        w[i] = (uint8_t)rnd();
    for (size_t b = 0; b < nb; b++) {
        uint8_t *blk = w + b * bb;
        if (b % 7 == 3) {
            memset(blk, 0, bb);
            continue;
        }
        int kind = extreme && b % 11 == 5 ? 1 + (int)(rnd() % 3) : 0;
        uint16_t d = rnd_scale(kind), dmin = rnd_scale(kind);
        switch (t) {
        case ENG_GGML_TYPE_Q4_0:
            memcpy(blk + offsetof(eng_block_q4_0_t, d), &d, 2);
            break;
        case ENG_GGML_TYPE_Q8_0:
            memcpy(blk + offsetof(eng_block_q8_0_t, d), &d, 2);
            break;
        case ENG_GGML_TYPE_Q5_0:
            memcpy(blk + offsetof(eng_block_q5_0_t, d), &d, 2);
            break;
        case ENG_GGML_TYPE_Q5_1:
            memcpy(blk + offsetof(eng_block_q5_1_t, d), &d, 2);
            memcpy(blk + offsetof(eng_block_q5_1_t, m), &dmin, 2);
            break;
        case ENG_GGML_TYPE_Q4_K:
        case ENG_GGML_TYPE_Q5_K:
            memcpy(blk + offsetof(eng_block_q4_k_t, d), &d, 2);
            memcpy(blk + offsetof(eng_block_q4_k_t, dmin), &dmin, 2);
            break;
        default:
            memcpy(blk + offsetof(eng_block_q6_k_t, d), &d, 2);
            break;
        }
    }
    return w;
}

/* Activation rows: values of mixed magnitudes (and a few all-zero blocks of 256). */
static float *rnd_x(uint32_t M, uint32_t K)
{
    float *x = malloc((size_t)M * K * sizeof *x);
    for (size_t i = 0; i < (size_t)M * K; i++)
        x[i] = (i / 256) % 5 == 4 ? 0.0f : unif() * ldexpf(1.0f, (int)(rnd() % 8) - 4);
    return x;
}

/* x[K] quantized to t's dot type into xq, and that quantized row dequantized into xd[K]. */
static void quant_act(uint32_t t, const float *x, uint32_t K, void *xq, float *xd)
{
    if (eng_quant_dot_type(t) == ENG_GGML_TYPE_Q8_K) {
        eng_quant_act_q8_k(x, xq, K);
        eng_dequant_q8_k(xq, xd, K);
    } else {
        eng_quant_act_q8_0(x, xq, K);
        eng_dequant_q8_0(xq, xd, K);
    }
}

/* sum w[k] x[k] in double, and the sum of the magnitudes of the terms. */
static double dot_ref(const float *w, const float *x, uint32_t K, double *mag)
{
    double s = 0, m = 0;
    for (uint32_t k = 0; k < K; k++) {
        double p = (double)w[k] * x[k];
        s += p;
        m += fabs(p);
    }
    *mag = m;
    return s;
}

/* Every path's dot product equals the double-precision product of the dequantized rows to float
 * rounding (the blocks' integer sums are exact; the scale products and the sum over blocks are
 * float), and the portable reference. */
PC_TEST(dot_q_matches_reference_and_portable)
{
    uint32_t Ks[] = {256, 512, 1024, 2816, 4096};
    enum { ROWS = 37 };
    for (size_t ti = 0; ti < PC_ARRAY_LEN(qtypes); ti++) {
        uint32_t t = qtypes[ti];
        for (size_t ki = 0; ki < PC_ARRAY_LEN(Ks); ki++) {
            uint32_t K = Ks[ki];
            size_t rb = eng_quant_row_bytes(t, K);
            uint8_t *w = rnd_rows(t, ROWS, K, true);
            float *x = rnd_x(1, K), *xd = malloc(K * sizeof *xd), *wd = malloc(K * sizeof *wd);
            void *xq = malloc(eng_quant_row_bytes(eng_quant_dot_type(t), K));
            quant_act(t, x, K, xq, xd);
            for (uint32_t r = 0; r < ROWS; r++) {
                const uint8_t *wr = w + r * rb;
                eng_quant_row_to_f32(t, wr, wd, K);
                double mag, ref = dot_ref(wd, xd, K, &mag);
                float port = eng__port_dot_q(t, wr, xq, K);
                double tol = 1e-5 * mag + 1e-30;
                if (!(fabs(port - ref) <= tol))
                    fprintf(stderr, "  portable %s K=%u row %u: %.9g vs %.9g\n",
                            eng_ggml_type_name(t), K, r, port, ref);
                ASSERT_LE(fabs(port - ref), tol);
                for (size_t pi = 0; pi < PC_ARRAY_LEN(paths); pi++) {
                    if (!eng__cpu_isa_runs(paths[pi]))
                        continue;
                    float v = dot_isa(paths[pi], t, wr, xq, K);
                    if (!(fabs(v - ref) <= tol && fabs(v - port) <= tol))
                        fprintf(stderr, "  %s %s K=%u row %u: %.9g vs ref %.9g, portable %.9g\n",
                                eng__cpu_isa_name(paths[pi]), eng_ggml_type_name(t), K, r, v, ref,
                                port);
                    ASSERT_LE(fabs(v - ref), tol);
                    ASSERT_LE(fabs(v - port), tol);
                }
            }
            free(w), free(x), free(xd), free(wd), free(xq);
        }
    }
}

/* Every single-bit change of a weight row (each quant, scale, min and high bit, one at a time)
 * gives the same result on every path as on the portable reference: a kernel that read a field
 * from the wrong place, or skipped one, would disagree on the flip of that field's bits. */
PC_TEST(dot_q_sees_every_field)
{
    enum { K = 512 };
    for (size_t ti = 0; ti < PC_ARRAY_LEN(qtypes); ti++) {
        uint32_t t = qtypes[ti];
        size_t rb = eng_quant_row_bytes(t, K);
        uint8_t *w = rnd_rows(t, 1, K, false), *w2 = malloc(rb);
        float *x = rnd_x(1, K), *xd = malloc(K * sizeof *xd);
        for (uint32_t k = 0; k < K; k++)
            x[k] = 0.5f + unif() * 0.25f; /* no zero blocks here */
        void *xq = malloc(eng_quant_row_bytes(eng_quant_dot_type(t), K));
        quant_act(t, x, K, xq, xd);
        for (size_t byte = 0; byte < rb; byte++) {
            memcpy(w2, w, rb);
            w2[byte] ^= (uint8_t)(1u << (byte % 8));
            float port = eng__port_dot_q(t, w2, xq, K);
            if (!isfinite(port))
                continue; /* a flipped F16 exponent bit */
            float wd[K];
            eng_quant_row_to_f32(t, w2, wd, K);
            double mag;
            dot_ref(wd, xd, K, &mag);
            for (size_t pi = 0; pi < PC_ARRAY_LEN(paths); pi++) {
                if (!eng__cpu_isa_runs(paths[pi]))
                    continue;
                float v = dot_isa(paths[pi], t, w2, xq, K);
                double tol = 1e-5 * mag + 1e-30;
                if (!(fabs(v - port) <= tol))
                    fprintf(stderr, "  %s %s byte %zu: %.9g vs portable %.9g\n",
                            eng__cpu_isa_name(paths[pi]), eng_ggml_type_name(t), byte, v, port);
                ASSERT_LE(fabs(v - port), tol);
            }
        }
        free(w), free(w2), free(x), free(xd), free(xq);
    }
}

/* The GEMV on a slice [N0, N1) of output rows, odd row counts of x, (+)=, every path, against
 * double precision over the dequantized weights and the quantized-then-dequantized activations;
 * rows outside the slice are never written. */
PC_TEST(gemv_q_matches_reference)
{
    /* Q4_0 only: 32 and 96 (an odd block count: the AVX-512 one-row GEMV's last block alone);
     * 8448 is past that GEMV's prepared pairs (K <= 8192: the plain dot products run), 16640 past
     * the Q4_K / Q5_K one's prepared row (K <= 16384). The AVX-512 GEMV is also bit for bit
     * eng__avx512_dot_q (decode, prefill's GEMM and the dot product agree exactly). */
    uint32_t Ks[] = {32, 96, 256, 768, 1280, 8448, 16640};
    uint32_t Ms[] = {1, 2, 3, 5, 9, 31};
    enum { N = 19, N0 = 2, N1 = 17, MMAX = 31 };
    for (size_t ti = 0; ti < PC_ARRAY_LEN(qtypes); ti++) {
        uint32_t t = qtypes[ti];
        for (size_t ki = 0; ki < PC_ARRAY_LEN(Ks); ki++) {
            uint32_t K = Ks[ki];
            if (K % eng_ggml_type_block_size(t) != 0)
                continue;
            size_t rb = eng_quant_row_bytes(t, K);
            size_t xs = eng_quant_row_bytes(eng_quant_dot_type(t), K);
            uint8_t *w = rnd_rows(t, N, K, false);
            float *wd = malloc((size_t)N * K * sizeof *wd);
            for (uint32_t n = 0; n < N; n++)
                eng_quant_row_to_f32(t, w + n * rb, wd + (size_t)n * K, K);
            float *x = rnd_x(MMAX, K), *xd = malloc((size_t)MMAX * K * sizeof *xd);
            uint8_t *xq = malloc(xs * MMAX);
            for (uint32_t m = 0; m < MMAX; m++)
                quant_act(t, x + (size_t)m * K, K, xq + m * xs, xd + (size_t)m * K);
            for (size_t mi = 0; mi < PC_ARRAY_LEN(Ms); mi++) {
                uint32_t M = Ms[mi];
                float y[MMAX * N], y0[MMAX * N];
                for (size_t i = 0; i < PC_ARRAY_LEN(y0); i++)
                    y0[i] = unif();
                for (int acc = 0; acc < 2; acc++) {
                    for (size_t pi = 0; pi < PC_ARRAY_LEN(paths); pi++) {
                        if (!eng__cpu_isa_runs(paths[pi]))
                            continue;
                        memcpy(y, y0, sizeof y);
                        eng_gemv_t g = {.w = w,
                                        .wtype = t,
                                        .x = x,
                                        .xq = xq,
                                        .xq_stride = xs,
                                        .M = M,
                                        .K = K,
                                        .y = y,
                                        .ldy = N,
                                        .accumulate = acc == 1};
                        gemv_isa(paths[pi], &g, N0, N1);
                        for (uint32_t m = 0; m < M; m++) {
                            for (uint32_t n = 0; n < N; n++) {
                                size_t i = (size_t)m * N + n;
                                if (n < N0 || n >= N1) {
                                    ASSERT_EQ(y[i], y0[i]);
                                    continue;
                                }
                                double mag,
                                    r = dot_ref(wd + (size_t)n * K, xd + (size_t)m * K, K, &mag);
                                r += acc ? y0[i] : 0;
                                double tol = 1e-5 * (mag + (acc ? fabs(y0[i]) : 0)) + 1e-30;
                                if (!(fabs(y[i] - r) <= tol))
                                    fprintf(stderr, "  %s %s K=%u M=%u m=%u n=%u: %g vs %g\n",
                                            eng__cpu_isa_name(paths[pi]), eng_ggml_type_name(t), K,
                                            M, m, n, y[i], r);
                                ASSERT_LE(fabs(y[i] - r), tol);
#if defined(__x86_64__) || defined(__i386__)
                                if (paths[pi] == ENG_CPU_ISA_AVX512) {
                                    float d = eng__avx512_dot_q(t, w + n * rb, xq + m * xs, K);
                                    ASSERT_EQ(y[i], acc ? y0[i] + d : d);
                                }
#endif
                            }
                        }
                        for (size_t i = (size_t)M * N; i < PC_ARRAY_LEN(y); i++)
                            ASSERT_EQ(y[i], y0[i]); /* rows past M untouched */
                    }
                }
            }
            free(w), free(wd), free(x), free(xd), free(xq);
        }
    }
}

/* eng__matmul end to end on quantized weights: below ENG_GEMV_MAX_M rows the GEMV, from it on
 * the prefill GEMM, both on x quantized once (checked against the quantized activations: prefill
 * and decode compute the same products); output counts around the task tiles, row counts around
 * the GEMM's row groups, every path. Two products of different dot types in one run
 * (eng__matmul_n) share x. */
PC_TEST(matmul_q_matches_reference)
{
    uint32_t Ms[] = {1, 7, 31, 32, 45};
    enum { N = 150, K = 512, MMAX = 45 };
    eng_pool_t *pool;
    ASSERT_EQ(eng__pool_init(2, &pool), 0);
    float *t0 = malloc((size_t)ENG_CPU_WTILE * K * 4), *t1 = malloc((size_t)ENG_CPU_WTILE * K * 4);
    float *const tmp[2] = {t0, t1};
    void *xbuf = malloc(eng__matmul_xbuf_bytes(MMAX, K));
    float *x = rnd_x(MMAX, K), *xd = malloc((size_t)MMAX * K * sizeof *xd);
    float *y[2] = {malloc((size_t)MMAX * N * 4), malloc((size_t)MMAX * N * 4)};
    float *y0 = malloc((size_t)MMAX * N * 4), *wd[2];
    eng_weight_t w[2];
    for (size_t i = 0; i < (size_t)MMAX * N; i++)
        y0[i] = unif();
    for (size_t ti = 0; ti < PC_ARRAY_LEN(qtypes); ti++) {
        /* Pairs (Q4_0, Q4_K), (Q4_K, Q5_K), (Q5_K, Q6_K), (Q6_K, Q4_0). */
        uint32_t ts[2] = {qtypes[ti], qtypes[(ti + 1) % PC_ARRAY_LEN(qtypes)]};
        for (int j = 0; j < 2; j++) {
            size_t rb = eng_quant_row_bytes(ts[j], K);
            void *data = rnd_rows(ts[j], N, K, false);
            w[j] = (eng_weight_t){
                .type = ts[j], .file_type = ts[j], .n_in = K, .n_out = N, .data = data};
            wd[j] = malloc((size_t)N * K * sizeof(float));
            for (uint32_t n = 0; n < N; n++)
                eng_quant_row_to_f32(ts[j], (const uint8_t *)data + n * rb, wd[j] + (size_t)n * K,
                                     K);
        }
        for (size_t mi = 0; mi < PC_ARRAY_LEN(Ms); mi++) {
            uint32_t M = Ms[mi];
            for (size_t pi = 0; pi < PC_ARRAY_LEN(paths); pi++) {
                if (!eng__cpu_isa_runs(paths[pi]))
                    continue;
                memcpy(y[0], y0, (size_t)MMAX * N * 4);
                memcpy(y[1], y0, (size_t)MMAX * N * 4);
                const eng_weight_t *wp[2] = {&w[0], &w[1]};
                eng__matmul_n(pool, x, M, wp, NULL, y, 2, true, tmp, xbuf, paths[pi]);
                for (int j = 0; j < 2; j++) {
                    uint8_t xq[2 * K];
                    for (uint32_t m = 0; m < M; m++) {
                        quant_act(ts[j], x + (size_t)m * K, K, xq, xd); /* seen quantized */
                        const float *xr = xd;
                        for (uint32_t n = 0; n < N; n++) {
                            size_t i = (size_t)m * N + n;
                            double mag, r = dot_ref(wd[j] + (size_t)n * K, xr, K, &mag) + y0[i];
                            double tol = 1e-5 * (mag + fabs(y0[i]));
                            if (!(fabs(y[j][i] - r) <= tol))
                                fprintf(stderr, "  %s %s M=%u m=%u n=%u: %g vs %g\n",
                                        eng__cpu_isa_name(paths[pi]), eng_ggml_type_name(ts[j]), M,
                                        m, n, y[j][i], r);
                            ASSERT_LE(fabs(y[j][i] - r), tol);
                        }
                    }
                    for (size_t i = (size_t)M * N; i < (size_t)MMAX * N; i++)
                        ASSERT_EQ(y[j][i], y0[i]);
                }
            }
        }
        for (int j = 0; j < 2; j++)
            free((void *)w[j].data), free(wd[j]);
    }
    free(t0), free(t1), free(x), free(xd), free(y[0]), free(y[1]), free(y0), free(xbuf);
    eng__pool_free(pool);
}

/* ggml-cpu's activation quantizers on x86 (llama.cpp's ggml/src/ggml-cpu/arch/x86/quants.c,
 * quantize_row_q8_0 and quantize_row_q8_K -> quantize_row_q8_K_ref), transcribed as written
 * there: the reference the engine's bytes must equal. nearest_int is ggml's: the float nearest
 * to v + 1.5 * 2^23 (halves to even), read back as an integer. */
static int ggml_nearest_int(float v)
{
    float val = v + 12582912.f;
    int i;
    memcpy(&i, &val, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

static void ggml_q8_0(const float *x, eng_block_q8_0_t *y, uint32_t k)
{
    for (uint32_t i = 0; i < k / 32; i++, x += 32) {
        float maxScalar = 0;
        for (int j = 0; j < 32; j++)
            maxScalar = fmaxf(maxScalar, fabsf(x[j]));
        const float d = maxScalar / 127.f;
        y[i].d = eng_f32_to_f16(d);
        const float id = (maxScalar != 0.0f) ? 127.f / maxScalar : 0.0f;
        for (int j = 0; j < 32; j++)
            y[i].qs[j] = (int8_t)nearbyintf(x[j] * id); /* _mm256_round_ps(_MM_ROUND_NEAREST) */
    }
}

static void ggml_q8_k(const float *x, eng_block_q8_k_t *y, uint32_t k)
{
    for (uint32_t i = 0; i < k / 256; i++, x += 256) {
        float max = 0, amax = 0;
        for (int j = 0; j < 256; ++j) {
            float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        memset(&y[i], 0, sizeof y[i]); /* ggml leaves bsums as they were; the engine zeroes */
        if (!amax)
            continue;
        const float iscale = -127.f / max;
        for (int j = 0; j < 256; ++j) {
            int v = ggml_nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < 16; ++j) {
            int sum = 0;
            for (int ii = 0; ii < 16; ++ii)
                sum += y[i].qs[j * 16 + ii];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

/* Every path's quantized activations are ggml's bytes: random rows of mixed magnitudes, all-zero
 * blocks, ties of +amax and -amax (the first one sets the sign), values exactly halfway between
 * levels (x * id = n + 0.5: halves to even), and one huge or tiny block. */
PC_TEST(quant_act_is_ggml_bytes)
{
    enum { K = 2048 };
    float *x = malloc(K * sizeof *x);
    eng_block_q8_k_t *ref_k = malloc(K / 256 * sizeof *ref_k),
                     *got_k = malloc(K / 256 * sizeof *got_k);
    eng_block_q8_0_t *ref_0 = malloc(K / 32 * sizeof *ref_0),
                     *got_0 = malloc(K / 32 * sizeof *got_0);
    for (int rep = 0; rep < 40; rep++) {
        float *r = rnd_x(1, K);
        memcpy(x, r, K * sizeof *x);
        free(r);
        if (rep % 4 == 1) { /* ties: -amax before +amax in a block, halfway values */
            for (int b = 0; b < K / 256; b++) {
                x[256 * b + 3] = -1.0f;
                x[256 * b + 200] = 1.0f;
            }
            for (int j = 0; j < K; j += 5)
                x[j] = ((float)(int)(rnd() % 200) - 100.0f + 0.5f) / 127.0f;
        }
        if (rep % 4 == 2)
            for (int j = 0; j < 256; j++)
                x[256 + j] *= rep % 8 == 2 ? 1e30f : 1e-30f;
        ggml_q8_k(x, ref_k, K);
        ggml_q8_0(x, ref_0, K);
        eng_quant_act_q8_k(x, got_k, K);
        eng_quant_act_q8_0(x, got_0, K);
        ASSERT_MEM_EQ(got_k, ref_k, K / 256 * sizeof *ref_k);
        ASSERT_MEM_EQ(got_0, ref_0, K / 32 * sizeof *ref_0);
        for (size_t pi = 0; pi < PC_ARRAY_LEN(paths); pi++) {
            if (!eng__cpu_isa_runs(paths[pi]))
                continue;
            memset(got_k, 0x55, K / 256 * sizeof *got_k);
            memset(got_0, 0x55, K / 32 * sizeof *got_0);
            eng__quant_act_isa(ENG_GGML_TYPE_Q8_K, x, got_k, K, paths[pi]);
            eng__quant_act_isa(ENG_GGML_TYPE_Q8_0, x, got_0, K, paths[pi]);
            ASSERT_MEM_EQ(got_k, ref_k, K / 256 * sizeof *ref_k);
            ASSERT_MEM_EQ(got_0, ref_0, K / 32 * sizeof *ref_0);
        }
    }
    free(x), free(ref_k), free(got_k), free(ref_0), free(got_0);
}

/* The AVX-512 prefill GEMM: every output bit for bit eng__avx512_dot_q's (so prefill and decode
 * compute the same products), over random and extreme blocks, row counts around its four-row
 * tiles, odd weight-row ranges (its tiles take two), both y modes; outputs outside the range stay
 * as they were; the types and shapes it does not take, and a buffer too small, return false. */
PC_TEST(qgemm_avx512_is_dot_q_bit_for_bit)
{
    if (!eng__cpu_isa_runs(ENG_CPU_ISA_AVX512) || !eng__cpu_has_avx512_vnni())
        PC_SKIP("no AVX512-VNNI on this CPU");
    enum { N = 37, MMAX = 13 };
    const uint32_t Ks[] = {512, 768};
    const uint32_t Ms[] = {1, 3, 4, 5, 8, 13};
    const uint32_t ranges[][2] = {{0, N}, {5, 36}, {7, 8}};
    const uint32_t types[] = {ENG_GGML_TYPE_Q4_0, ENG_GGML_TYPE_Q4_K, ENG_GGML_TYPE_Q5_K,
                              ENG_GGML_TYPE_Q6_K};
    size_t buf_bytes = (size_t)ENG_CPU_WTILE * 768 * sizeof(float);
    void *buf = malloc(buf_bytes + 1);
    float *y = malloc((size_t)MMAX * N * sizeof *y), *y0 = malloc((size_t)MMAX * N * sizeof *y0);
    for (size_t ki = 0; ki < PC_ARRAY_LEN(Ks); ki++) {
        uint32_t K = Ks[ki];
        float *x = rnd_x(MMAX, K), xd[768];
        for (size_t ti = 0; ti < PC_ARRAY_LEN(types); ti++) {
            uint32_t t = types[ti], dt = eng_quant_dot_type(t);
            size_t rb = eng_quant_row_bytes(t, K), xs = eng_quant_row_bytes(dt, K);
            uint8_t *xq = malloc(xs * MMAX);
            for (uint32_t m = 0; m < MMAX; m++)
                quant_act(t, x + (size_t)m * K, K, xq + m * xs, xd);
            for (int extreme = 0; extreme < 2; extreme++) {
                uint8_t *w = rnd_rows(t, N, K, extreme == 1);
                for (size_t mi = 0; mi < PC_ARRAY_LEN(Ms); mi++) {
                    for (size_t ri = 0; ri < PC_ARRAY_LEN(ranges); ri++) {
                        for (int acc = 0; acc < 2; acc++) {
                            uint32_t M = Ms[mi], n0 = ranges[ri][0], n1 = ranges[ri][1];
                            for (size_t i = 0; i < (size_t)MMAX * N; i++)
                                y[i] = y0[i] = unif();
                            eng_gemv_t g = {.w = w,
                                            .wtype = t,
                                            .xq = xq,
                                            .xq_stride = xs,
                                            .M = M,
                                            .K = K,
                                            .y = y,
                                            .ldy = N,
                                            .accumulate = acc == 1};
                            /* An unaligned buffer: the GEMM aligns it itself. */
                            ASSERT_TRUE(eng__avx512_qgemm(&g, n0, n1, (char *)buf + 1, buf_bytes));
                            for (uint32_t m = 0; m < MMAX; m++) {
                                for (uint32_t n = 0; n < N; n++) {
                                    size_t i = (size_t)m * N + n;
                                    float e = y0[i];
                                    if (m < M && n >= n0 && n < n1) {
                                        float d = eng__avx512_dot_q(t, w + n * rb, xq + m * xs, K);
                                        e = acc ? y0[i] + d : d;
                                    }
                                    if (isnan(e) && isnan(y[i]))
                                        continue;
                                    uint32_t ue, uy;
                                    memcpy(&ue, &e, 4), memcpy(&uy, &y[i], 4);
                                    if (ue != uy)
                                        fprintf(stderr,
                                                "  %s K=%u M=%u [%u, %u) m=%u n=%u: %.9g vs %.9g\n",
                                                eng_ggml_type_name(t), K, M, n0, n1, m, n, y[i], e);
                                    ASSERT_EQ(uy, ue);
                                }
                            }
                        }
                    }
                }
                free(w);
            }
            free(xq);
        }
        free(x);
    }
    /* Not taken: Q8_0, Q4_0 with an odd block count, a buffer too small; nothing written. */
    uint8_t *w8 = rnd_rows(ENG_GGML_TYPE_Q4_0, 4, 544, false);
    uint8_t xq8[4 * 544];
    memset(xq8, 0, sizeof xq8);
    for (size_t i = 0; i < (size_t)MMAX * N; i++)
        y[i] = y0[i] = unif();
    eng_gemv_t g = {.w = w8,
                    .wtype = ENG_GGML_TYPE_Q4_0,
                    .xq = xq8,
                    .xq_stride = eng_quant_row_bytes(ENG_GGML_TYPE_Q8_0, 544),
                    .M = 2,
                    .K = 544,
                    .y = y,
                    .ldy = N};
    ASSERT_FALSE(eng__avx512_qgemm(&g, 0, 4, buf, buf_bytes));
    g.wtype = ENG_GGML_TYPE_Q8_0;
    g.K = 512;
    ASSERT_FALSE(eng__avx512_qgemm(&g, 0, 4, buf, buf_bytes));
    g.wtype = ENG_GGML_TYPE_Q4_0;
    ASSERT_FALSE(eng__avx512_qgemm(&g, 0, 4, buf, 4 * 1024));
    ASSERT_MEM_EQ(y, y0, (size_t)MMAX * N * sizeof *y);
    free(w8), free(buf), free(y), free(y0);
}

PC_TEST_MAIN()
