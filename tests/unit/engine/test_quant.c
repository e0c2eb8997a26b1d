/*
 * test_quant.c — engine/quant.c: the quantized formats' reference arithmetic.
 *
 * - quant_vectors: every tensor of ../shared/testdata/quant-vectors.gguf (written by llama.cpp's
 *   llama-quantize, with gguf-py's dequantization next to it) dequantizes to its ".f32" tensor
 *   bit for bit, and the dot products over its rows agree with a float64 reference. SKIPPED with
 *   the reason when the file is absent (a fresh clone without ../shared).
 * - Dequantization of random blocks (random bytes for every quant and scale byte, F16 scales
 *   from subnormal to 65504 and both signs, all-zero blocks) against a float64 evaluation of the
 *   format's definition written independently here (element by element, not block by block).
 * - Activation quantization (Q8_0, Q8_K): the bound |x - d q| <= |d| / 2, bsums, zero blocks.
 * - Dot products against float64 over random weights and activations.
 * - Quantize -> dequantize round trips within the bound each format implies, bad input refused.
 * - The Q4_K_M mix and the type table.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "half.h"
#include "pc_err.h"
#include "pc_test.h"
#include "quant.h"

static const uint32_t qtypes[] = {ENG_GGML_TYPE_Q4_0, ENG_GGML_TYPE_Q5_0, ENG_GGML_TYPE_Q5_1,
                                  ENG_GGML_TYPE_Q8_0, ENG_GGML_TYPE_Q4_K, ENG_GGML_TYPE_Q5_K,
                                  ENG_GGML_TYPE_Q6_K};
#define N_QTYPES (sizeof qtypes / sizeof qtypes[0])

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static double rnd_unit(void) /* [0, 1) */
{
    return (rnd() & 0xFFFFFF) / 16777216.0;
}
static double rnd_normal(void)
{
    double u = rnd_unit() + 1e-12, v = rnd_unit();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* A random finite F16: any sign and exponent (subnormals and 65504 included), or one of the
 * extremes. */
static uint16_t rnd_f16(void)
{
    static const uint16_t edges[] = {0x0000, 0x8000, 0x0001, 0x8001,
                                     0x03FF, 0x7BFF, 0xFBFF, 0x3C00};
    if (rnd() % 4 == 0)
        return edges[rnd() % 8];
    for (;;) {
        uint16_t h = (uint16_t)rnd();
        if ((h & 0x7C00) != 0x7C00)
            return h;
    }
}

/* ---------------------------------------------------------------------------------------------
 * The format's definition, element by element, in float64 (independent of quant.c's loops)
 * ------------------------------------------------------------------------------------------- */

static double f16(uint16_t h)
{
    return (double)eng_f16_to_f32(h);
}

/* 6-bit scale (what 0) or min (what 1) of K-quant sub-block j: the bit layout of ggml's
 * get_scale_min_k4, as bit fields. */
static int k4_field(const uint8_t *s, int j, int what)
{
    if (j < 4)
        return s[j + 4 * what] & 63;
    int low4 = what == 0 ? s[j + 4] & 15 : s[j + 4] >> 4;
    int high2 = s[j - 4 + 4 * what] >> 6;
    return low4 | high2 << 4;
}

/* Element e of a row of blocks of type t, in float64. */
static double ref_elem(uint32_t t, const void *row, size_t e)
{
    switch (t) {
    case ENG_GGML_TYPE_Q4_0: {
        const eng_block_q4_0_t *b = (const eng_block_q4_0_t *)row + e / 32;
        size_t i = e % 32;
        int q = i < 16 ? b->qs[i] & 15 : b->qs[i - 16] >> 4;
        return f16(b->d) * (q - 8);
    }
    case ENG_GGML_TYPE_Q5_0:
    case ENG_GGML_TYPE_Q5_1: {
        /* Element i: nibble i % 16 (low for i < 16) with bit i of qh (as a u32) on top. */
        bool one = t == ENG_GGML_TYPE_Q5_1;
        const uint8_t *b = (const uint8_t *)row + e / 32 * (one ? 24 : 22);
        uint16_t d, m = 0;
        memcpy(&d, b, 2);
        if (one)
            memcpy(&m, b + 2, 2);
        const uint8_t *qh = b + (one ? 4 : 2), *qs = qh + 4;
        size_t i = e % 32;
        int q = (i < 16 ? qs[i] & 15 : qs[i - 16] >> 4) | (((qh[i / 8] >> (i % 8)) & 1) << 4);
        return one ? f16(d) * q + f16(m) : f16(d) * (q - 16);
    }
    case ENG_GGML_TYPE_Q8_0: {
        const eng_block_q8_0_t *b = (const eng_block_q8_0_t *)row + e / 32;
        return f16(b->d) * b->qs[e % 32];
    }
    case ENG_GGML_TYPE_Q4_K:
    case ENG_GGML_TYPE_Q5_K: {
        size_t i = e % 256;
        int j = (int)(i / 32), l = (int)(i % 32);
        const uint8_t *scales, *qs;
        uint16_t d, dmin;
        int hbit = 0;
        if (t == ENG_GGML_TYPE_Q4_K) {
            const eng_block_q4_k_t *b = (const eng_block_q4_k_t *)row + e / 256;
            scales = b->scales, qs = b->qs, d = b->d, dmin = b->dmin;
        } else {
            const eng_block_q5_k_t *b = (const eng_block_q5_k_t *)row + e / 256;
            scales = b->scales, qs = b->qs, d = b->d, dmin = b->dmin;
            hbit = (b->qh[l] >> j) & 1;
        }
        int byte = qs[32 * (j / 2) + l];
        int q = ((j % 2 == 0) ? byte & 15 : byte >> 4) + 16 * hbit;
        return f16(d) * k4_field(scales, j, 0) * q - f16(dmin) * k4_field(scales, j, 1);
    }
    case ENG_GGML_TYPE_Q6_K: {
        const eng_block_q6_k_t *b = (const eng_block_q6_k_t *)row + e / 256;
        size_t i = e % 256;
        int h = (int)(i / 128), s = (int)(i % 128 / 32), l = (int)(i % 32);
        int lo = b->ql[64 * h + 32 * (s % 2) + l];
        lo = s < 2 ? lo & 15 : lo >> 4;
        int hi = (b->qh[32 * h + l] >> (2 * s)) & 3;
        return f16(b->d) * b->scales[i / 16] * ((lo | hi << 4) - 32);
    }
    case ENG_GGML_TYPE_Q8_K: {
        const eng_block_q8_k_t *b = (const eng_block_q8_k_t *)row + e / 256;
        return (double)b->d * b->qs[e % 256];
    }
    }
    abort();
}

/* Random blocks of type t for n elements: random bytes, random finite F16 scales, and every
 * fourth block all zero. */
static void *rnd_blocks(uint32_t t, size_t n)
{
    size_t bytes = eng_quant_row_bytes(t, n);
    uint8_t *p = malloc(bytes);
    for (size_t i = 0; i < bytes; i++)
        p[i] = (uint8_t)rnd();
    size_t bb = eng_ggml_type_block_bytes(t), nb = bytes / bb;
    for (size_t b = 0; b < nb; b++) {
        uint8_t *blk = p + b * bb;
        if (b % 4 == 3) {
            memset(blk, 0, bb);
            continue;
        }
        uint16_t d = rnd_f16(), dmin = rnd_f16();
        switch (t) {
        case ENG_GGML_TYPE_Q6_K:
            memcpy(blk + 208, &d, 2);
            break;
        case ENG_GGML_TYPE_Q4_K:
        case ENG_GGML_TYPE_Q5_K:
        case ENG_GGML_TYPE_Q5_1:
            memcpy(blk + 2, &dmin, 2);
            memcpy(blk, &d, 2);
            break;
        default:
            memcpy(blk, &d, 2);
        }
    }
    return p;
}

PC_TEST(type_table)
{
    ASSERT_EQ(eng_ggml_type_block_bytes(ENG_GGML_TYPE_Q4_0), 18);
    ASSERT_EQ(eng_ggml_type_block_bytes(ENG_GGML_TYPE_Q5_0), 22);
    ASSERT_EQ(eng_ggml_type_block_bytes(ENG_GGML_TYPE_Q5_1), 24);
    ASSERT_EQ(eng_quant_dot_type(ENG_GGML_TYPE_Q5_1), ENG_GGML_TYPE_Q8_0);
    ASSERT_EQ(eng_ggml_type_block_bytes(ENG_GGML_TYPE_Q4_K), 144);
    ASSERT_EQ(eng_ggml_type_block_bytes(ENG_GGML_TYPE_Q5_K), 176);
    ASSERT_EQ(eng_ggml_type_block_bytes(ENG_GGML_TYPE_Q6_K), 210);
    ASSERT_EQ(eng_ggml_type_block_bytes(ENG_GGML_TYPE_Q8_K), 292);
    ASSERT_EQ(eng_ggml_type_block_size(ENG_GGML_TYPE_Q6_K), 256);
    ASSERT_EQ(eng_quant_row_bytes(ENG_GGML_TYPE_Q4_K, 1024), 4 * 144);
    ASSERT_EQ(eng_quant_row_bytes(ENG_GGML_TYPE_Q4_0, 64), 36);
    ASSERT_EQ(eng_quant_row_bytes(ENG_GGML_TYPE_F16, 10), 20);
    ASSERT_EQ(eng_quant_row_bytes(ENG_GGML_TYPE_BF16, 10), 20);
    ASSERT_EQ(eng_quant_row_bytes(ENG_GGML_TYPE_F32, 10), 40);
    ASSERT_EQ(eng_quant_row_bytes(999, 256), 0);
    ASSERT_STR_EQ(eng_ggml_type_name(ENG_GGML_TYPE_Q5_K), "Q5_K");
    for (size_t i = 0; i < N_QTYPES; i++) {
        ASSERT_TRUE(eng_ggml_type_supported(qtypes[i]));
        ASSERT_TRUE(eng_quant_type_is_quant(qtypes[i]));
    }
    ASSERT_FALSE(eng_ggml_type_supported(ENG_GGML_TYPE_Q2_K));
    ASSERT_FALSE(eng_ggml_type_supported(ENG_GGML_TYPE_Q8_K)); /* activations only */
    ASSERT_EQ(eng_quant_dot_type(ENG_GGML_TYPE_Q4_0), ENG_GGML_TYPE_Q8_0);
    ASSERT_EQ(eng_quant_dot_type(ENG_GGML_TYPE_Q5_K), ENG_GGML_TYPE_Q8_K);
    ASSERT_EQ(eng_quant_dot_type(ENG_GGML_TYPE_F16), ENG_GGML_TYPE_F32);
}

/* Dequantized value vs the float64 definition: the float result is the exact value rounded
 * once or twice (the K-quants' d * sc * q - dmin * m), so within 2^-22 of the larger term. */
PC_TEST(dequant_random_blocks_vs_float64)
{
    const size_t n = 256 * 16;
    float *out = malloc(n * sizeof *out);
    for (int rep = 0; rep < 20; rep++)
        for (size_t ti = 0; ti < N_QTYPES; ti++) {
            uint32_t t = qtypes[ti];
            void *blocks = rnd_blocks(t, n);
            eng_quant_row_to_f32(t, blocks, out, n);
            for (size_t e = 0; e < n; e++) {
                double want = ref_elem(t, blocks, e);
                double tol = ldexp(fabs(want), -22);
                if (t == ENG_GGML_TYPE_Q4_K || t == ENG_GGML_TYPE_Q5_K) {
                    /* |d sc q| and |dmin m| bound the terms; the float difference rounds each. */
                    const uint8_t *blk =
                        (const uint8_t *)blocks + e / 256 * eng_ggml_type_block_bytes(t);
                    uint16_t d, dm;
                    memcpy(&d, blk, 2);
                    memcpy(&dm, blk + 2, 2);
                    tol = ldexp(fabs(f16(d)) * 63 * 31 + fabs(f16(dm)) * 63, -23);
                }
                if (t == ENG_GGML_TYPE_Q5_1) { /* d q + m: two roundings of terms up to 31 |d| */
                    const uint8_t *blk = (const uint8_t *)blocks + e / 32 * 24;
                    uint16_t d, m;
                    memcpy(&d, blk, 2);
                    memcpy(&m, blk + 2, 2);
                    tol = ldexp(fabs(f16(d)) * 31 + fabs(f16(m)), -23);
                }
                if (!(fabs((double)out[e] - want) <= tol)) {
                    fprintf(stderr, "  %s element %zu: got %.9g, float64 %.9g\n",
                            eng_ggml_type_name(t), e, (double)out[e], want);
                    ASSERT_TRUE(fabs((double)out[e] - want) <= tol);
                }
                if (e / eng_ggml_type_block_size(t) % 4 == 3)
                    ASSERT_TRUE(out[e] == 0.0f);
            }
            free(blocks);
        }
    free(out);
}

/* Rows of Gaussian values with outliers, constant rows, tiny and large magnitudes, zeros. */
static void rnd_row(float *x, size_t n, int kind)
{
    double scale = kind == 3 ? 1e-6 : kind == 4 ? 1e3 : 1.0;
    for (size_t i = 0; i < n; i++) {
        switch (kind) {
        case 1:
            x[i] = 0.0f;
            break;
        case 2:
            x[i] = -0.75f;
            break;
        case 5:
            x[i] = (float)fabs(rnd_normal()); /* all positive */
            break;
        default:
            x[i] = (float)(scale * rnd_normal());
        }
    }
    if (kind == 0)
        x[rnd() % n] = 40.0f; /* an outlier */
}

PC_TEST(activation_quantization)
{
    const size_t n = 1024;
    float x[1024];
    eng_block_q8_k_t ak[4];
    eng_block_q8_0_t a0[32];
    for (int kind = 0; kind < 6; kind++) {
        rnd_row(x, n, kind);
        eng_quant_act_q8_k(x, ak, n);
        eng_quant_act_q8_0(x, a0, n);
        for (size_t b = 0; b < 4; b++) {
            for (int j = 0; j < 16; j++) {
                int s = 0;
                for (int l = 0; l < 16; l++)
                    s += ak[b].qs[16 * j + l];
                ASSERT_EQ(ak[b].bsums[j], s);
            }
            for (int l = 0; l < 256; l++) {
                ASSERT_TRUE(ak[b].qs[l] >= -127);
                double err = fabs((double)x[256 * b + l] - (double)ak[b].d * ak[b].qs[l]);
                ASSERT_LE(err, fabs((double)ak[b].d) * 0.5 * (1 + 1e-6) + 1e-30);
            }
        }
        /* Q8_0 quantizes with the unrounded d = amax / 127 and stores it in F16: the error grows
         * by |q| <= 127 times the F16 rounding of d (which flushes d below 2^-25 to zero). */
        for (size_t b = 0; b < 32; b++) {
            double amax = 0;
            for (int l = 0; l < 32; l++)
                amax = fmax(amax, fabs((double)x[32 * b + l]));
            double d0 = (double)((float)amax / 127.0f), d = f16(a0[b].d);
            for (int l = 0; l < 32; l++) {
                double err = fabs((double)x[32 * b + l] - d * a0[b].qs[l]);
                ASSERT_LE(err, (d0 / 2 + 127 * fabs(d - d0)) * (1 + 1e-6) + 1e-30);
            }
        }
    }
    rnd_row(x, n, 1);
    eng_quant_act_q8_k(x, ak, n);
    ASSERT_TRUE(ak[0].d == 0.0f && ak[0].qs[7] == 0 && ak[0].bsums[3] == 0);
}

/* float64 product of a weight row's exact values with the activation row's exact values. */
static double ref_dot(uint32_t t, const void *w, const void *a, size_t n)
{
    double s = 0;
    uint32_t at = eng_quant_dot_type(t);
    for (size_t e = 0; e < n; e++)
        s += ref_elem(t, w, e) * ref_elem(at, a, e);
    return s;
}

/* The integer products are exact; what remains is float scaling and accumulation per block:
 * a few roundings per block of at most the block's |d_w d_a sumi| (bounded by the sum of the
 * absolute products). */
static double dot_tol(uint32_t t, const void *w, const void *a, size_t n)
{
    double abs = 0;
    uint32_t at = eng_quant_dot_type(t);
    for (size_t e = 0; e < n; e++)
        abs += fabs(ref_elem(t, w, e) * ref_elem(at, a, e));
    /* K-quants: the scaled sums and mins are each up to 2^8 x the per-element terms. */
    return ldexp(abs, -20) * (double)(n / 32 + 4) + 1e-30;
}

static void *act_quant(uint32_t t, const float *x, size_t n)
{
    uint32_t at = eng_quant_dot_type(t);
    void *a = malloc(eng_quant_row_bytes(at, n));
    if (at == ENG_GGML_TYPE_Q8_K)
        eng_quant_act_q8_k(x, a, n);
    else
        eng_quant_act_q8_0(x, a, n);
    return a;
}

PC_TEST(dot_products_vs_float64)
{
    const size_t n = 256 * 8;
    float *x = malloc(n * sizeof *x);
    for (int rep = 0; rep < 30; rep++)
        for (size_t ti = 0; ti < N_QTYPES; ti++) {
            uint32_t t = qtypes[ti];
            /* Random bytes with moderate scales (the F16 extremes would overflow the sum) */
            void *w = rnd_blocks(t, n);
            size_t bb = eng_ggml_type_block_bytes(t), nb = eng_quant_row_bytes(t, n) / bb;
            for (size_t b = 0; b < nb; b++) {
                uint16_t d = eng_f32_to_f16((float)(rnd_unit() * 0.02 - 0.01));
                memcpy((uint8_t *)w + b * bb + (t == ENG_GGML_TYPE_Q6_K ? 208 : 0), &d, 2);
                if (t == ENG_GGML_TYPE_Q4_K || t == ENG_GGML_TYPE_Q5_K || t == ENG_GGML_TYPE_Q5_1) {
                    uint16_t dm = eng_f32_to_f16((float)(rnd_unit() * 0.01));
                    memcpy((uint8_t *)w + b * bb + 2, &dm, 2);
                }
            }
            rnd_row(x, n, rep % 6);
            void *a = act_quant(t, x, n);
            double got = eng_quant_vec_dot(t, w, a, n), want = ref_dot(t, w, a, n);
            double tol = dot_tol(t, w, a, n);
            if (!(fabs(got - want) <= tol))
                fprintf(stderr, "  %s rep %d: got %.9g, float64 %.9g, tol %g\n",
                        eng_ggml_type_name(t), rep, got, want, tol);
            ASSERT_TRUE(fabs(got - want) <= tol);
            free(a);
            free(w);
        }
    free(x);
}

/* The bound each quantizer's format implies, per element: half a step of its sub-block (the
 * step read back from the stored scales), and the step itself within what the format's scale
 * granularity allows for the sub-block's range. */
static void check_round_trip(uint32_t t, const float *x, size_t n)
{
    void *q = malloc(eng_quant_row_bytes(t, n));
    float *y = malloc(n * sizeof *y);
    ASSERT_EQ(eng_quantize_row(t, x, q, n), 0);
    eng_quant_row_to_f32(t, q, y, n);
    size_t bs = eng_ggml_type_block_size(t), bb = eng_ggml_type_block_bytes(t);
    for (size_t e = 0; e < n; e++) {
        const uint8_t *blk = (const uint8_t *)q + e / bs * bb;
        const float *xb = x + e / bs * bs;
        double step, bound;
        switch (t) {
        case ENG_GGML_TYPE_Q4_0: {
            uint16_t d;
            memcpy(&d, blk, 2);
            step = fabs(f16(d));
            double amax = 0;
            for (size_t i = 0; i < bs; i++)
                amax = fmax(amax, fabs((double)xb[i]));
            /* Half a step, or a whole one for the level the signed range lacks (x at -max). */
            bound = fabs(x[e]) > amax * (7.5 / 8) ? step : step / 2;
            /* d rounded up in F16: one unit in the last place (2^-24 among subnormals). */
            ASSERT_LE(step, amax / 8 * (1 + ldexp(1, -10)) + ldexp(1, -24));
            break;
        }
        case ENG_GGML_TYPE_Q5_0: {
            uint16_t d;
            memcpy(&d, blk, 2);
            step = fabs(f16(d));
            double amax = 0;
            for (size_t i = 0; i < bs; i++)
                amax = fmax(amax, fabs((double)xb[i]));
            bound = fabs(x[e]) > amax * (15.5 / 16) ? step : step / 2;
            ASSERT_LE(step, amax / 16 * (1 + ldexp(1, -10)) + ldexp(1, -24));
            break;
        }
        case ENG_GGML_TYPE_Q5_1: {
            const eng_block_q5_1_t *b = (const eng_block_q5_1_t *)blk;
            step = f16(b->d);
            bound = step / 2;
            double lo = INFINITY, hi = -INFINITY;
            for (size_t i = 0; i < bs; i++) {
                lo = fmin(lo, (double)xb[i]);
                hi = fmax(hi, (double)xb[i]);
            }
            /* m at most one F16 unit below the minimum; d rounded up by one unit. */
            ASSERT_LE(f16(b->m), lo);
            ASSERT_LE(lo - f16(b->m), fabs(lo) * ldexp(1, -10) + ldexp(1, -24));
            ASSERT_LE(step, (hi - f16(b->m)) / 31 * (1 + ldexp(1, -10)) + ldexp(1, -24));
            break;
        }
        case ENG_GGML_TYPE_Q8_0: {
            uint16_t d;
            memcpy(&d, blk, 2);
            step = fabs(f16(d));
            double amax = 0;
            for (size_t i = 0; i < bs; i++)
                amax = fmax(amax, fabs((double)xb[i]));
            double d0 = (double)((float)amax / 127.0f);
            bound = d0 / 2 + 127 * fabs(step - d0);
            break;
        }
        case ENG_GGML_TYPE_Q4_K:
        case ENG_GGML_TYPE_Q5_K: {
            const eng_block_q4_k_t *b = (const eng_block_q4_k_t *)blk; /* same head */
            int j = (int)(e % 256 / 32), top = t == ENG_GGML_TYPE_Q4_K ? 15 : 31;
            step = f16(b->d) * k4_field(b->scales, j, 0);
            bound = step / 2;
            double lo = 0, hi = 0;
            for (int l = 0; l < 32; l++) {
                lo = fmin(lo, (double)xb[32 * j + l]);
                hi = fmax(hi, (double)xb[32 * j + l]);
            }
            /* The 6-bit scale is at most one unit of d above the sub-block's need. */
            ASSERT_LE(step, (hi - lo + f16(b->dmin)) / top + f16(b->d) + 1e-30);
            break;
        }
        default: { /* Q6_K */
            const eng_block_q6_k_t *b = (const eng_block_q6_k_t *)blk;
            int j = (int)(e % 256 / 16);
            step = f16(b->d) * b->scales[j];
            bound = step / 2;
            double amax = 0;
            for (int l = 0; l < 16; l++)
                amax = fmax(amax, fabs((double)xb[16 * j + l]));
            ASSERT_LE(step, amax / 31 + f16(b->d) + 1e-30);
        }
        }
        double err = fabs((double)y[e] - (double)x[e]);
        if (!(err <= bound * (1 + 1e-5) + ldexp(fabs((double)x[e]), -21) + 1e-30)) {
            fprintf(stderr, "  %s element %zu: x %.9g -> %.9g, step %g\n", eng_ggml_type_name(t), e,
                    (double)x[e], (double)y[e], step);
            ASSERT_TRUE(false);
        }
    }
    free(q);
    free(y);
}

PC_TEST(quantize_round_trip_bounds)
{
    const size_t n = 256 * 4;
    float x[256 * 4];
    for (int rep = 0; rep < 12; rep++)
        for (size_t ti = 0; ti < N_QTYPES; ti++) {
            rnd_row(x, n, rep % 6);
            PC_TEST_CALL(check_round_trip(qtypes[ti], x, n));
        }
    /* Gaussian weights like a model's: the rms error per type, for the record. */
    for (size_t ti = 0; ti < N_QTYPES; ti++) {
        uint32_t t = qtypes[ti];
        double se = 0, sx = 0;
        void *q = malloc(eng_quant_row_bytes(t, n));
        float y[256 * 4];
        for (int rep = 0; rep < 8; rep++) {
            rnd_row(x, n, 6);
            ASSERT_EQ(eng_quantize_row(t, x, q, n), 0);
            eng_quant_row_to_f32(t, q, y, n);
            for (size_t i = 0; i < n; i++) {
                se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
                sx += (double)x[i] * x[i];
            }
        }
        fprintf(stderr, "  %s: %.3f bits per weight, relative rms error %.4f\n",
                eng_ggml_type_name(t),
                8.0 * eng_ggml_type_block_bytes(t) / eng_ggml_type_block_size(t), sqrt(se / sx));
        free(q);
    }
}

PC_TEST(quantize_refuses_what_does_not_fit)
{
    float x[256];
    unsigned char q[256 * 2];
    for (size_t ti = 0; ti < N_QTYPES; ti++) {
        rnd_row(x, 256, 6);
        x[100] = NAN;
        ASSERT_EQ(eng_quantize_row(qtypes[ti], x, q, 256), PC_ERR_RANGE);
        x[100] = INFINITY;
        ASSERT_EQ(eng_quantize_row(qtypes[ti], x, q, 256), PC_ERR_RANGE);
        x[100] = 3e38f; /* the scale would not fit F16 */
        ASSERT_EQ(eng_quantize_row(qtypes[ti], x, q, 256), PC_ERR_RANGE);
    }
}

PC_TEST(q4_k_m_mix)
{
    const uint32_t M = ENG_QUANT_MIX_Q4_K_M, Q4 = ENG_GGML_TYPE_Q4_K, Q6 = ENG_GGML_TYPE_Q6_K;
    ASSERT_EQ(eng_quant_mix_type(M, "output.weight", 8, false), Q6);
    ASSERT_EQ(eng_quant_mix_type(M, "token_embd.weight", 8, false), Q4);
    ASSERT_EQ(eng_quant_mix_type(M, "token_embd.weight", 8, true), Q6);
    /* use_more_bits(i, 8): i < 1, i >= 7, (i - 1) % 3 == 2 -> layers 0, 3, 6, 7. */
    const uint32_t want[8] = {Q6, Q4, Q4, Q6, Q4, Q4, Q6, Q6};
    for (uint32_t l = 0; l < 8; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%u.attn_v.weight", l);
        ASSERT_EQ(eng_quant_mix_type(M, name, 8, false), want[l]);
        snprintf(name, sizeof name, "blk.%u.ffn_down.weight", l);
        ASSERT_EQ(eng_quant_mix_type(M, name, 8, false), want[l]);
        snprintf(name, sizeof name, "blk.%u.attn_q.weight", l);
        ASSERT_EQ(eng_quant_mix_type(M, name, 8, false), Q4);
    }
    ASSERT_EQ(eng_quant_mix_type(ENG_GGML_TYPE_Q5_K, "output.weight", 8, false),
              ENG_GGML_TYPE_Q5_K);
    /* Q5_K_M: Q5_K for Q4_K. llama.cpp's fallback for rows that are not whole 256s, as its
     * quantizer wrote a 2-layer model of dim 256, FF 704, tied (layer 0's ffn_down Q5_0 and
     * layer 1's Q8_0; token_embd Q6_K). */
    const uint32_t M5 = ENG_QUANT_MIX_Q5_K_M;
    ASSERT_EQ(eng_quant_mix_type(M5, "blk.1.attn_q.weight", 8, false), ENG_GGML_TYPE_Q5_K);
    ASSERT_EQ(eng_quant_mix_type(M5, "blk.0.ffn_down.weight", 8, false), Q6);
    ASSERT_EQ(eng_quant_mix_tensor_type(M, "blk.0.ffn_down.weight", 2, true, 704),
              ENG_GGML_TYPE_Q5_0);
    ASSERT_EQ(eng_quant_mix_tensor_type(M, "blk.1.ffn_down.weight", 2, true, 704),
              ENG_GGML_TYPE_Q8_0);
    ASSERT_EQ(eng_quant_mix_tensor_type(M5, "blk.0.ffn_down.weight", 2, true, 704),
              ENG_GGML_TYPE_Q5_1);
    ASSERT_EQ(eng_quant_mix_tensor_type(M, "token_embd.weight", 2, true, 256), Q6);
    ASSERT_EQ(eng_quant_mix_tensor_type(M, "blk.0.ffn_up.weight", 2, true, 256), Q4);
    ASSERT_EQ(eng_quant_mix_tensor_type(ENG_GGML_TYPE_Q4_K, "blk.0.ffn_down.weight", 2, true, 704),
              ENG_GGML_TYPE_Q5_0);
}

/* ---------------------------------------------------------------------------------------------
 * llama.cpp's own vectors
 * ------------------------------------------------------------------------------------------- */

#define QUANT_VECTORS "../shared/testdata/quant-vectors.gguf"

PC_TEST(quant_vectors)
{
    const char *path =
        getenv("KVGW_QUANT_VECTORS") != NULL ? getenv("KVGW_QUANT_VECTORS") : QUANT_VECTORS;
    eng_gguf_t *g;
    char err[256];
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        PC_SKIP(QUANT_VECTORS " is absent (llama.cpp's reference vectors live outside the repo)");
    fclose(f);
    ASSERT_EQ(eng_gguf_open(path, &g, err, sizeof err), 0);
    int n_checked = 0, seen[ENG_GGML_TYPE_COUNT] = {0};
    for (uint64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor_t *t = eng_gguf_tensor_at(g, i);
        if (t->type == ENG_GGML_TYPE_F32)
            continue;
        char name[ENG_GGUF_MAX_NAME + 8];
        snprintf(name, sizeof name, "%s.f32", t->name);
        const eng_gguf_tensor_t *r = eng_gguf_tensor_find(g, name);
        ASSERT_TRUE(r != NULL);
        ASSERT_TRUE(eng_quant_type_is_quant(t->type));
        ASSERT_EQ(r->n_elements, t->n_elements);
        size_t n = (size_t)t->n_elements, K = (size_t)t->ne[0];
        float *y = malloc(n * sizeof *y);
        eng_quant_row_to_f32(t->type, t->data, y, n);
        if (memcmp(y, r->data, n * sizeof *y) != 0) {
            const float *want = r->data;
            for (size_t e = 0; e < n; e++)
                if (memcmp(&y[e], &want[e], 4) != 0) {
                    fprintf(stderr, "  %s element %zu: got %.9g, gguf-py %.9g\n", t->name, e,
                            (double)y[e], (double)want[e]);
                    break;
                }
            ASSERT_TRUE(false);
        }
        /* Dot products of a few rows with a random activation row, against float64 over the
         * dequantized values. */
        float *x = malloc(K * sizeof *x);
        rnd_row(x, K, 6);
        void *a = act_quant(t->type, x, K);
        size_t rb = eng_quant_row_bytes(t->type, K);
        for (int64_t row = 0; row < t->ne[1]; row += 7) {
            const void *w = (const uint8_t *)t->data + (size_t)row * rb;
            double got = eng_quant_vec_dot(t->type, w, a, K), want = ref_dot(t->type, w, a, K);
            ASSERT_TRUE(fabs(got - want) <= dot_tol(t->type, w, a, K));
        }
        free(a);
        free(x);
        free(y);
        seen[t->type]++;
        n_checked++;
    }
    /* The file holds every type but Q5_0 / Q5_1 (llama.cpp writes those only where rows are not
     * whole super-blocks: test_forward_quant's llama_cpp_mixes). */
    for (size_t ti = 0; ti < N_QTYPES; ti++)
        if (qtypes[ti] != ENG_GGML_TYPE_Q5_0 && qtypes[ti] != ENG_GGML_TYPE_Q5_1)
            ASSERT_TRUE(seen[qtypes[ti]] > 0);
    fprintf(stderr, "  %d llama.cpp tensors dequantized bit for bit\n", n_checked);
    eng_gguf_free(g);
}

PC_TEST_MAIN()
