/*
 * cpu_avx512.c — the AVX-512 path of the CPU kernels (see cpu_simd.h): AVX-512F with F16C and
 * FMA, and the BF16 GEMM on CPUs with AVX512-BF16. Each function carries the target attribute,
 * so the file builds without -march and the code runs only where eng__cpu_isa_runs() said yes.
 * On other architectures the file is empty.
 */
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "cpu_simd.h"
#include "gguf.h"
#include "half.h"
#include "pc_assert.h"

#define AVX512 __attribute__((target("avx512f,f16c,fma")))
#define AVX512BF16 __attribute__((target("avx512f,avx512bf16,f16c,fma")))
#define AVX512VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))
/* 16 halves at p as 16 floats. */
#define HALF16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(p)))
/* Rows of x per group in the GEMV. */
#define GEMV_MAX_ROWS 8

/* ---------------------------------------------------------------------------------------------
 * Half precision
 * ------------------------------------------------------------------------------------------- */

AVX512 void eng__avx512_f16_to_f32(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(src + i))));
    for (; i < n; i++)
        dst[i] = _cvtsh_ss(src[i]);
}

/* rows x n halves (row strides ss and ds) to F32: the K of a KV block, one short row per head
 * dimension, converted without a call per row. */
AVX512 void eng__avx512_f16_rows_to_f32(const uint16_t *src, size_t ss, float *dst, size_t ds,
                                        uint32_t rows, uint32_t n)
{
    for (uint32_t r = 0; r < rows; r++) {
        const uint16_t *s = src + r * ss;
        float *d = dst + r * ds;
        uint32_t i = 0;
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(s + i))));
        for (; i < n; i++)
            d[i] = _cvtsh_ss(s[i]);
    }
}

AVX512 void eng__avx512_f32_to_f16(const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((void *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

/* ---------------------------------------------------------------------------------------------
 * BF16 GEMM
 * ------------------------------------------------------------------------------------------- */

/* x[M][K] -> BF16 rows of kp pairs (K rounded up to even, zero padded). */
AVX512BF16 void eng__avx512_to_bf16_rows(const float *x, uint32_t M, uint32_t K, uint16_t *dst)
{
    uint32_t kp = (K + 1) / 2;
    for (uint32_t m = 0; m < M; m++) {
        const float *src = x + (size_t)m * K;
        uint16_t *d = dst + (size_t)m * kp * 2;
        uint32_t k = 0;
        for (; k + 32 <= K; k += 32) {
            __m512bh v =
                _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + k + 16), _mm512_loadu_ps(src + k));
            _mm512_storeu_si512((void *)(d + k), (__m512i)v);
        }
        for (; k < K; k++)
            d[k] = eng_f32_to_bf16(src[k]);
        if (K % 2)
            d[K] = 0;
    }
}

/* One BF16 panel (cpu_kernels.h) from 16 F32 rows of 2 kp floats (rows[i] NULL: zeros), kp a
 * multiple of 16: per 16 pairs, each row's pairs converted into one register, the 16 x 16 words
 * transposed in registers (32-bit, then 64-bit unpacks, then 128-bit lane shuffles), one 64-byte
 * store per pair of columns. */
AVX512BF16 void eng__avx512_bf16_panel(const float *const rows[16], uint32_t kp, uint16_t *panel)
{
    for (uint32_t j = 0; j < kp; j += 16) {
        __m512i r[16], t[16];
        for (int i = 0; i < 16; i++)
            r[i] = rows[i] == NULL
                       ? _mm512_setzero_si512()
                       : (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(rows[i] + 2 * j + 16),
                                                      _mm512_loadu_ps(rows[i] + 2 * j));
        for (int i = 0; i < 16; i += 2) {
            t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
            t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
        }
        /* Group g (rows 4g .. 4g + 3): r[4g + c], lane L = their words 4L + c. */
        for (int g = 0; g < 4; g++) {
            r[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
            r[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
            r[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
            r[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
        }
        for (int c = 0; c < 4; c++) { /* word 4L + c of every row: lane L of the four groups */
            __m512i v0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44);
            __m512i v1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xee);
            __m512i v2 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44);
            __m512i v3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xee);
            uint16_t *o = panel + (size_t)(j + c) * 32;
            _mm512_storeu_si512((void *)o, _mm512_shuffle_i32x4(v0, v2, 0x88));
            _mm512_storeu_si512((void *)(o + 4 * 32), _mm512_shuffle_i32x4(v0, v2, 0xdd));
            _mm512_storeu_si512((void *)(o + 8 * 32), _mm512_shuffle_i32x4(v1, v3, 0x88));
            _mm512_storeu_si512((void *)(o + 12 * 32), _mm512_shuffle_i32x4(v1, v3, 0xdd));
        }
    }
}

/* C[M][32 columns of panel pair pp] (+)= A . B for an 8-row block (rows past M repeat the last
 * one and are not stored). */
AVX512BF16 void eng__avx512_gemm_bf16_block(const uint32_t *a /* [M][kp] pairs */, uint32_t M,
                                            uint32_t m0, uint32_t kp, const uint16_t *b0,
                                            const uint16_t *b1, float *y, uint32_t ldy, uint32_t n0,
                                            uint32_t n_valid, bool accumulate)
{
    const uint32_t *ar[8];
    for (uint32_t r = 0; r < 8; r++)
        ar[r] = a + (size_t)PC_MIN(m0 + r, M - 1) * kp;
    /* Sixteen named accumulators: an array of vectors would live on the stack. */
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m512 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    __m512 c60 = c00, c61 = c00, c70 = c00, c71 = c00;
    const uint32_t *a0 = ar[0], *a1 = ar[1], *a2 = ar[2], *a3 = ar[3];
    const uint32_t *a4 = ar[4], *a5 = ar[5], *a6 = ar[6], *a7 = ar[7];
    for (uint32_t j = 0; j < kp; j++) {
        __m512bh w0 = (__m512bh)_mm512_loadu_si512((const void *)(b0 + (size_t)j * 32));
        __m512bh w1 = (__m512bh)_mm512_loadu_si512((const void *)(b1 + (size_t)j * 32));
#define BF16_ROW(ap, x0, x1)                                                                       \
    do {                                                                                           \
        __m512bh av = (__m512bh)_mm512_set1_epi32((int)(ap)[j]);                                   \
        x0 = _mm512_dpbf16_ps(x0, av, w0);                                                         \
        x1 = _mm512_dpbf16_ps(x1, av, w1);                                                         \
    } while (0)
        BF16_ROW(a0, c00, c01);
        BF16_ROW(a1, c10, c11);
        BF16_ROW(a2, c20, c21);
        BF16_ROW(a3, c30, c31);
        BF16_ROW(a4, c40, c41);
        BF16_ROW(a5, c50, c51);
        BF16_ROW(a6, c60, c61);
        BF16_ROW(a7, c70, c71);
#undef BF16_ROW
    }
    __m512 c[8][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31},
                      {c40, c41}, {c50, c51}, {c60, c61}, {c70, c71}};
    for (uint32_t r = 0; r < 8 && m0 + r < M; r++) {
        float *yr = y + (size_t)(m0 + r) * ldy + n0;
        float tmp[32];
        _mm512_storeu_ps(tmp, c[r][0]);
        _mm512_storeu_ps(tmp + 16, c[r][1]);
        for (uint32_t i = 0; i < n_valid; i++)
            yr[i] = accumulate ? yr[i] + tmp[i] : tmp[i];
    }
}

/* ---------------------------------------------------------------------------------------------
 * GEMV
 * ------------------------------------------------------------------------------------------- */

/* s[0..R) = the dot products of one F16 weight row with rows 0..R) of xg (1 <= R <= 4, or
 * <= 8 for the 8-row version). The accumulators are named so that they stay in registers;
 * rows past R repeat row R - 1 (loads from L1) and are not stored. */
#define GEMV_ROW_PTRS(N)                                                                           \
    const float *xr[N];                                                                            \
    for (uint32_t m = 0; m < N; m++)                                                               \
        xr[m] = xg + (size_t)PC_MIN(m, R - 1) * K;
#define GEMV_FMA(a, m) a = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xr[m] + k), a)
#define GEMV_STORE(a, m)                                                                           \
    if (m < R) {                                                                                   \
        float v = _mm512_reduce_add_ps(a);                                                         \
        for (uint32_t kk = K16; kk < K; kk++)                                                      \
            v += _cvtsh_ss(wr[kk]) * xr[m][kk];                                                    \
        s[m] = v;                                                                                  \
    }

AVX512 static void gemv_f16_rows4(const uint16_t *wr, const float *xg, uint32_t K, uint32_t K16,
                                  uint32_t R, float *s)
{
    GEMV_ROW_PTRS(4)
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (uint32_t k = 0; k < K16; k += 16) {
        __m512 wv = HALF16(wr + k);
        GEMV_FMA(a0, 0);
        GEMV_FMA(a1, 1);
        GEMV_FMA(a2, 2);
        GEMV_FMA(a3, 3);
    }
    GEMV_STORE(a0, 0)
    GEMV_STORE(a1, 1)
    GEMV_STORE(a2, 2)
    GEMV_STORE(a3, 3)
}

AVX512 static void gemv_f16_rows8(const uint16_t *wr, const float *xg, uint32_t K, uint32_t K16,
                                  uint32_t R, float *s)
{
    GEMV_ROW_PTRS(8)
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (uint32_t k = 0; k < K16; k += 16) {
        __m512 wv = HALF16(wr + k);
        GEMV_FMA(a0, 0);
        GEMV_FMA(a1, 1);
        GEMV_FMA(a2, 2);
        GEMV_FMA(a3, 3);
        GEMV_FMA(a4, 4);
        GEMV_FMA(a5, 5);
        GEMV_FMA(a6, 6);
        GEMV_FMA(a7, 7);
    }
    GEMV_STORE(a0, 0)
    GEMV_STORE(a1, 1)
    GEMV_STORE(a2, 2)
    GEMV_STORE(a3, 3)
    GEMV_STORE(a4, 4)
    GEMV_STORE(a5, 5)
    GEMV_STORE(a6, 6)
    GEMV_STORE(a7, 7)
}
#undef GEMV_ROW_PTRS
#undef GEMV_FMA
#undef GEMV_STORE

/* x[M][K] . w[n0..n1)^T into y[:, n0..n1) for small M, F16 weights: memory bound, one pass over
 * the weight rows (four accumulators per row for a single x row). Measured on Zen 4 with two
 * threads and 64-row tasks: software prefetch (T0/T1/T2, 1-16 KiB ahead, with 4 KiB and with
 * 2 MiB pages) and four interleaved weight rows were all slower or no faster. With the GEMV's
 * tasks of ~256 KiB (cpu_kernels.c) on the Zen 5 test machine, the rows prefetched
 * ENG_GEMV_PREFETCH_BYTES ahead read one token's matrices of the F16 bench model at 0.82-0.91 of
 * the read bandwidth against 0.72-0.82 without. */
static bool q4_0_gemv_vbmi(const eng_gemv_t *g, uint32_t n0, uint32_t n1);
static bool gemv_q_vnni(const eng_gemv_t *g, uint32_t n0, uint32_t n1);

AVX512 void eng__avx512_gemv(const eng_gemv_t *c, uint32_t n0, uint32_t n1)
{
    if (eng__gemv_int8(c->wtype)) {
        if ((c->wtype == ENG_GGML_TYPE_Q4_0 && q4_0_gemv_vbmi(c, n0, n1)) || gemv_q_vnni(c, n0, n1))
            return;
        eng__gemv_q(c, n0, n1, eng__avx512_dot_q);
        return;
    }
    if (c->wtype != ENG_GGML_TYPE_F16) { /* F32 and BF16 weights: the AVX2 kernels
                                            (every AVX-512 CPU runs them) already stream at the
                                            read bandwidth */
        eng__avx2_gemv(c, n0, n1);
        return;
    }
    const uint16_t *w = c->w;
    const float *x = c->x;
    uint32_t K = c->K, M = c->M, K16 = K & ~15u;
    uint32_t n = n0;
    if (M == 1) {
        for (; n < n1; n++) {
            const uint16_t *wr = w + (size_t)n * K;
            eng__gemv_prefetch_row(wr, (size_t)K * sizeof *wr);
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            __m512 a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            uint32_t k = 0;
            /* Two cache lines of weights per iteration, each one 64-byte load split in two
             * conversions, eight accumulators: in an A/B micro-benchmark this matched a pure
             * read loop's bandwidth (55 GB/s when the machine had it), where 32-byte loads
             * and four accumulators reached 44. */
#define GEMV_LINE(l, off, lo, hi)                                                                  \
    do {                                                                                           \
        lo = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(l)),                           \
                             _mm512_loadu_ps(x + k + (off)), lo);                                  \
        hi = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(l, 1)),                     \
                             _mm512_loadu_ps(x + k + (off) + 16), hi);                             \
    } while (0)
            for (; k + 128 <= K; k += 128) {
                __m512i l0 = _mm512_loadu_si512((const void *)(wr + k));
                __m512i l1 = _mm512_loadu_si512((const void *)(wr + k + 32));
                __m512i l2 = _mm512_loadu_si512((const void *)(wr + k + 64));
                __m512i l3 = _mm512_loadu_si512((const void *)(wr + k + 96));
                GEMV_LINE(l0, 0, a0, a1);
                GEMV_LINE(l1, 32, a2, a3);
                GEMV_LINE(l2, 64, a4, a5);
                GEMV_LINE(l3, 96, a6, a7);
            }
            for (; k + 32 <= K; k += 32) {
                __m512i l0 = _mm512_loadu_si512((const void *)(wr + k));
                GEMV_LINE(l0, 0, a0, a1);
            }
#undef GEMV_LINE
            a0 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a4), _mm512_add_ps(a1, a5)),
                               _mm512_add_ps(_mm512_add_ps(a2, a6), _mm512_add_ps(a3, a7)));
            for (; k < K16; k += 16)
                a0 = _mm512_fmadd_ps(HALF16(wr + k), _mm512_loadu_ps(x + k), a0);
            float s = _mm512_reduce_add_ps(a0);
            for (; k < K; k++)
                s += _cvtsh_ss(wr[k]) * x[k];
            c->y[n] = c->accumulate ? c->y[n] + s : s;
        }
        return;
    }
    for (; n < n1; n++) {
        const uint16_t *wr = w + (size_t)n * K; /* stays in L1 across the row groups */
        eng__gemv_prefetch_row(wr, (size_t)K * sizeof *wr);
        for (uint32_t m0 = 0; m0 < M; m0 += GEMV_MAX_ROWS) {
            uint32_t mg = PC_MIN(GEMV_MAX_ROWS, M - m0);
            const float *xg = x + (size_t)m0 * K;
            float s[GEMV_MAX_ROWS];
            if (mg <= 4)
                gemv_f16_rows4(wr, xg, K, K16, mg, s);
            else
                gemv_f16_rows8(wr, xg, K, K16, mg, s);
            for (uint32_t m = 0; m < mg; m++) {
                float *yp = &c->y[(size_t)(m0 + m) * c->ldy + n];
                *yp = c->accumulate ? *yp + s[m] : s[m];
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Quantized rows (the integer dot products of cpu_avx2.c, 64 bytes at a time): Q4_0 with
 * VPDPBUSD (unsigned quants times signed activation bytes, four products per int32 lane); the
 * K-quants with VPMADDUBSW and VPDPWSSD, which multiplies each pair's int16 sum by its
 * sub-block's scale and accumulates in int32 in one instruction.
 * ------------------------------------------------------------------------------------------- */

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c,fma")))
#define LOAD256(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define LOAD512(p) _mm512_loadu_si512((const void *)(p))
/* A 512-bit vector of two 256-bit halves. */
#define HALVES(lo, hi) _mm512_inserti64x4(_mm512_castsi256_si512(lo), (hi), 1)

/* Q4_0 x Q8_0, two blocks per 512-bit step: q = [low nibbles, high nibbles] of each block's 16
 * bytes (elements 0-15, 16-31), sum q a - 8 sum a by VPDPBUSD (lanes 0-7 block 0, 8-15 block 1),
 * both blocks' scales d_w d_x converted together and spread over their lanes by VPERMPS. Two
 * accumulators: one FMA chain would bound the loop. */
VNNI static inline __m512 q4_0_pair(const eng_block_q4_0_t *w, const eng_block_q8_0_t *x,
                                    __m512 acc)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0f), eight = _mm512_set1_epi8(8);
    const __m512i z = _mm512_setzero_si512();
    __m256i v = _mm256_loadu2_m128i((const __m128i *)(const void *)w[1].qs,
                                    (const __m128i *)(const void *)w[0].qs);
    __m512i t = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
    __m512i q = _mm512_and_si512(_mm512_shuffle_i64x2(t, t, _MM_SHUFFLE(3, 1, 2, 0)), lo4);
    __m512i a = HALVES(LOAD256(x[0].qs), LOAD256(x[1].qs));
    __m512i s = _mm512_sub_epi32(_mm512_dpbusd_epi32(z, q, a), _mm512_dpbusd_epi32(z, eight, a));
    uint64_t h = (uint64_t)w[0].d | (uint64_t)w[1].d << 16 | (uint64_t)x[0].d << 32 |
                 (uint64_t)x[1].d << 48; /* in integer registers: no store to reload */
    __m128 f = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)h));
    __m128 d = _mm_mul_ps(f, _mm_movehl_ps(f, f)); /* d_w0 d_x0, d_w1 d_x1 */
    __m512 dv =
        _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                              _mm512_castps128_ps512(d));
    return _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(s), acc);
}

VNNI static inline __attribute__((always_inline)) float
dot512_q4_0(const eng_block_q4_0_t *w, const eng_block_q8_0_t *x, uint32_t K)
{
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    uint32_t nb = K / ENG_QK4_0, b = 0;
    for (; b + 4 <= nb; b += 4) {
        acc0 = q4_0_pair(w + b, x + b, acc0);
        acc1 = q4_0_pair(w + b + 2, x + b + 2, acc1);
    }
    if (b + 2 <= nb) {
        acc0 = q4_0_pair(w + b, x + b, acc0);
        b += 2;
    }
    float r = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    if (b < nb) /* an odd block count: the last one alone */
        r += eng__avx2_dot_q(ENG_GGML_TYPE_Q4_0, w + b, x + b, ENG_QK4_0);
    return r;
}

/* The Q4_0 GEMV of one activation row (decode), with AVX512-VBMI: x is prepared once per call,
 * per pair of blocks, as VPDPBUSD takes it (the 64 activation bytes, the -8 sum a share as the
 * accumulator's start, d_x spread over each block's lanes), and each weight pair is one masked
 * 36-byte load, its nibbles and scales placed by VPERMB / VPERMW: four vector operations per pair
 * fewer than q4_0_pair, which works on one row alone. */
#define VBMI                                                                                       \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,f16c,fma")))
#define Q40_MAX_PAIRS 128 /* K <= 8192: 24 KiB of prepared x on the stack */
typedef struct q40_pair {
    int8_t a[64];     /* blocks 2p, 2p + 1 */
    int32_t init[16]; /* -8 (sum of a[4i .. 4i + 3]) */
    float dx[16];     /* lanes 0-7: block 2p's d, 8-15: block 2p + 1's */
} q40_pair_t;

/* The np block pairs of a Q8_0 activation row x prepared as q40_pair_t (xp 64-byte aligned). */
VNNI static void q40_prep_x(const eng_block_q8_0_t *x, uint32_t np, q40_pair_t *xp)
{
    const __m512i z = _mm512_setzero_si512(), ones = _mm512_set1_epi8(1);
    const __m512i two = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    for (uint32_t p = 0; p < np; p++) {
        __m512i a = HALVES(LOAD256(x[2 * p].qs), LOAD256(x[2 * p + 1].qs));
        _mm512_store_si512(xp[p].a, a);
        _mm512_store_si512(
            xp[p].init, _mm512_sub_epi32(z, _mm512_slli_epi32(_mm512_dpbusd_epi32(z, ones, a), 3)));
        __m128 d =
            _mm_cvtph_ps(_mm_cvtsi32_si128((int)(x[2 * p].d | (uint32_t)x[2 * p + 1].d << 16)));
        _mm512_store_ps(xp[p].dx, _mm512_permutexvar_ps(two, _mm512_castps128_ps512(d)));
    }
}

/* acc + one weight pair (36 bytes at w) times its prepared activations. */
VBMI static inline __m512 q4_0_pair_x(const uint8_t *w, const q40_pair_t *xp, __m512i qidx,
                                      __m512i didx, __mmask32 hi_words, __m512 acc)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    __m512i v = _mm512_maskz_loadu_epi8((1ull << 36) - 1, w);
    __m512i t = _mm512_permutexvar_epi8(qidx, v);
    __m512i q = _mm512_and_si512(_mm512_mask_srli_epi16(t, hi_words, t, 4), lo4);
    __m512i s = _mm512_dpbusd_epi32(_mm512_load_si512(xp->init), q, _mm512_load_si512(xp->a));
    __m512 d =
        _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(didx, v))),
                      _mm512_load_ps(xp->dx));
    return _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc);
}

VBMI static bool q4_0_gemv_vbmi(const eng_gemv_t *g, uint32_t n0, uint32_t n1)
{
    uint32_t nb = g->K / ENG_QK4_0, np = nb / 2;
    if (g->M != 1 || np == 0 || np > Q40_MAX_PAIRS || !eng__cpu_has_avx512_vbmi())
        return false;
    _Alignas(64) q40_pair_t xp[Q40_MAX_PAIRS];
    const eng_block_q8_0_t *x = g->xq;
    q40_prep_x(x, np, xp);
    /* Pair bytes: d0 (0-1), qs0 (2-17), d1 (18-19), qs1 (20-35). q: qs0 twice, then qs1 twice,
     * every second copy shifted down 4 bits: low and high nibbles in element order. */
    uint8_t qi[64];
    uint16_t di[32];
    for (int i = 0; i < 64; i++)
        qi[i] = (uint8_t)((i < 32 ? 2 : 20) + i % 16);
    for (int i = 0; i < 32; i++)
        di[i] = i < 8 ? 0 : 9; /* d0 is word 0, d1 word 9 */
    const __m512i qidx = LOAD512(qi), didx = LOAD512(di);
    const __mmask32 hi_words = 0xff00ff00u; /* words 8-15 and 24-31: the high nibbles */
    size_t rb = eng__gemv_row_bytes(g->wtype, g->K);
    for (uint32_t n = n0; n < n1; n++) {
        const uint8_t *w = (const uint8_t *)g->w + (size_t)n * rb;
        eng__gemv_prefetch_row(w, rb);
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
        uint32_t p = 0;
        for (; p + 2 <= np; p += 2) { /* two chains, in registers (an indexed pair spills) */
            acc0 = q4_0_pair_x(w + 36 * (size_t)p, &xp[p], qidx, didx, hi_words, acc0);
            acc1 = q4_0_pair_x(w + 36 * (size_t)p + 36, &xp[p + 1], qidx, didx, hi_words, acc1);
        }
        if (p < np)
            acc0 = q4_0_pair_x(w + 36 * (size_t)p, &xp[p], qidx, didx, hi_words, acc0);
        float r = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
        if (nb % 2) /* an odd block count: the last one alone */
            r += eng__avx2_dot_q(ENG_GGML_TYPE_Q4_0, w + 36 * (size_t)np, x + 2 * np, ENG_QK4_0);
        g->y[n] = g->accumulate ? g->y[n] + r : r;
    }
    return true;
}
#undef VBMI

/* eng__k4_unpack in a register (bytes 0-7 the scales, 8-15 the mins): the 12 scale bytes as
 * dwords u0 u1 u2 rearranged, shifted and masked per dword lane, no store and reload. */
VNNI static inline __m128i k4_unpack128(const uint8_t *scales)
{
    /* 16 bytes: the 4 past the scales (the block's qh or qs) land in dword 3, which no shuffle
     * below takes. A plain load: the masked byte load was slower. */
    __m128i u = _mm_loadu_si128((const __m128i *)(const void *)scales);
    __m128i s = _mm_shuffle_epi32(u, _MM_SHUFFLE(2, 1, 2, 0)); /* u0 u2 u1 u2 */
    __m128i lo = _mm_and_si128(_mm_srlv_epi32(s, _mm_setr_epi32(0, 0, 0, 4)),
                               _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    __m128i t = _mm_shuffle_epi32(u, _MM_SHUFFLE(1, 1, 0, 0)); /* u0 u0 u1 u1 */
    __m128i hi = _mm_and_si128(_mm_srli_epi32(t, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

/* The sum of a Q4_K / Q5_K product's eight lanes (acc - accm), in the order the GEMM repeats. */
VNNI static inline float hsum8_q45(__m256 r)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Q4_K (hb false) or Q5_K (hb true) x Q8_K, two 32-byte chunks of quants (c = 2h, 2h + 1) per
 * 512-bit step: the low nibbles (sub-blocks 2c) and high ones (2c + 1) times their activations by
 * VPMADDUBSW (each half of the vector takes its chunk's activations), times their scales and
 * summed in int32 by VPDPWSSD (two chains). Int32 lane l of the lower half sums the products that
 * lane l sums in a 256-bit step over chunk 2h, the upper half's lane l those of chunk 2h + 1; the
 * two halves added give each super-block's eight lane sums of a 256-bit kernel exactly (integer
 * sums: their order does not matter), and from there on the float operations are the 256-bit
 * ones: eng__avx512_qgemm repeats them. On the Zen 5 test machine (full-width 512-bit units), one
 * core's GEMV with the weights in L2 ran at 27 / 35 GB/s (K 1024 / 2816) where the 256-bit kernel
 * ran at 23 / 24, compute bound and so under the read bandwidth in a Q4_K_M decode. */
VNNI static inline __attribute__((always_inline)) float
dot512_q45_k(const bool hb, const void *wv, const eng_block_q8_k_t *x, const int8_t *xp, uint32_t K)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0f), b16 = _mm512_set1_epi8(0x10);
    /* VPSHUFB indices spreading scale word j over the int16 lanes of a 128-bit lane, for the
     * products of step h: the lower half (lanes 0-1) takes sub-block 4h (low nibbles) or 4h + 1
     * (high), the upper half 4h + 2 or 4h + 3. */
#define K45_SC(j0, j1)                                                                             \
    _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)(0x0100 + 0x0202 * (j0)))), \
                       _mm256_set1_epi16((short)(0x0100 + 0x0202 * (j1))), 1)
    const __m512i sc_lo[2] = {K45_SC(0, 2), K45_SC(4, 6)}, sc_hi[2] = {K45_SC(1, 3), K45_SC(5, 7)};
#undef K45_SC
    const size_t wb = hb ? sizeof(eng_block_q5_k_t) : sizeof(eng_block_q4_k_t);
    const uint8_t *w = wv;
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (uint32_t b = 0; b < K / ENG_QK_K; b++, w += wb, x++) {
        const eng_block_q4_k_t *w4 = (const eng_block_q4_k_t *)(const void *)w;
        __m128i sm = k4_unpack128(w4->scales);
        /* d_x d and d_x dmin (lanes 0 and 1), both halves converted at once: the same products. */
        uint32_t dd16;
        memcpy(&dd16, &w4->d, sizeof dd16);
        __m128 dd = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128((int)dd16)), _mm_set1_ps(x->d));
        /* The mins' share: sum_j m_j (bsums[2j] + bsums[2j + 1]), each min taken twice. */
        __m256i mq =
            _mm256_madd_epi16(LOAD256(x->bsums), _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm)));
        accm = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dd)), _mm256_cvtepi32_ps(mq),
                               accm);
        __m512i sc16 = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(sm)); /* scale j: word j */
        const uint8_t *qs = hb ? ((const eng_block_q5_k_t *)(const void *)w)->qs : w4->qs;
        const int8_t *a = x->qs;
        __m512i qh =
            hb ? _mm512_broadcast_i64x4(LOAD256(((const eng_block_q5_k_t *)(const void *)w)->qh))
               : _mm512_setzero_si512();
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            __m512i v = LOAD512(qs + 64 * h);
            __m512i lo = _mm512_and_si512(v, lo4);
            __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
            if (hb) { /* bit 2c of qh[l] is chunk c's element l's fifth bit, 2c + 1 element 32 + l's
                       */
                __m512i blo = HALVES(_mm256_set1_epi8((char)(1 << (4 * h))),
                                     _mm256_set1_epi8((char)(1 << (4 * h + 2))));
                lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, blo), lo, b16);
                hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(qh, _mm512_add_epi8(blo, blo)),
                                          hi, b16);
            }
            __m512i alo, ahi;
            if (xp != NULL) { /* prepared by q45_prep_x: one load each */
                alo = LOAD512(xp + 256 * (size_t)b + 128 * h);
                ahi = LOAD512(xp + 256 * (size_t)b + 128 * h + 64);
            } else {
                alo = HALVES(LOAD256(a + 128 * h), LOAD256(a + 128 * h + 64));
                ahi = HALVES(LOAD256(a + 128 * h + 32), LOAD256(a + 128 * h + 96));
            }
            s0 = _mm512_dpwssd_epi32(s0, _mm512_maddubs_epi16(lo, alo),
                                     _mm512_shuffle_epi8(sc16, sc_lo[h]));
            s1 = _mm512_dpwssd_epi32(s1, _mm512_maddubs_epi16(hi, ahi),
                                     _mm512_shuffle_epi8(sc16, sc_hi[h]));
        }
        __m512i s = _mm512_add_epi32(s0, s1);
        __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(s8), acc);
    }
    return hsum8_q45(_mm256_sub_ps(acc, accm));
}

/* The activations of a Q8_K row (nsb super-blocks) as dot512_q45_k's steps take them: per
 * super-block and step h, the 64 bytes facing the low nibbles (elements 128h .. + 32 and
 * 128h + 64 .. + 32), then the 64 facing the high ones (128h + 32 .., 128h + 96 ..). A GEMV
 * prepares its row once for every weight row: two loads per step instead of four and two
 * inserts. */
#define Q45_MAX_K 16384 /* 16 KiB of prepared x on the stack */
VNNI static void q45_prep_x(const eng_block_q8_k_t *x, uint32_t nsb, int8_t *xp)
{
    for (uint32_t b = 0; b < nsb; b++, x++)
        for (int h = 0; h < 2; h++) {
            const int8_t *a = x->qs + 128 * h;
            int8_t *o = xp + 256 * (size_t)b + 128 * h;
            _mm512_store_si512(o, HALVES(LOAD256(a), LOAD256(a + 64)));
            _mm512_store_si512(o + 64, HALVES(LOAD256(a + 32), LOAD256(a + 96)));
        }
}

/* Q6_K x Q8_K: 64 elements per product (a 64-byte load of ql gives 64 low nibbles, its high
 * nibbles the next 64), the two high bits of each from qh shifted per half, the scales of the
 * four sub-blocks of 16 spread over the int16 lanes by VPERMW. */
/* Lane l of product s (of the four 64-element products of a super-block) takes the scale of
 * sub-block 4 s + l / 8. */
#define Q6_LANES(s)                                                                                \
    {                                                                                              \
        4 * (s), 4 * (s), 4 * (s), 4 * (s), 4 * (s), 4 * (s), 4 * (s), 4 * (s), 4 * (s) + 1,       \
            4 * (s) + 1, 4 * (s) + 1, 4 * (s) + 1, 4 * (s) + 1, 4 * (s) + 1, 4 * (s) + 1,          \
            4 * (s) + 1, 4 * (s) + 2, 4 * (s) + 2, 4 * (s) + 2, 4 * (s) + 2, 4 * (s) + 2,          \
            4 * (s) + 2, 4 * (s) + 2, 4 * (s) + 2, 4 * (s) + 3, 4 * (s) + 3, 4 * (s) + 3,          \
            4 * (s) + 3, 4 * (s) + 3, 4 * (s) + 3, 4 * (s) + 3, 4 * (s) + 3                        \
    }
static const int16_t q6_lanes[4][32] = {Q6_LANES(0), Q6_LANES(1), Q6_LANES(2), Q6_LANES(3)};
#undef Q6_LANES

/* Half h (quants 128h .. 128h + 127) of a Q6_K super-block, each 6-bit quant (0..63) widened to a
 * byte in element order: the first 64 in *qa, the next 64 in *qb. */
VNNI static inline __attribute__((always_inline)) void q6_half(const eng_block_q6_k_t *w, int h,
                                                               __m512i *qa, __m512i *qb)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m512i shl = HALVES(_mm256_set1_epi16(4), _mm256_set1_epi16(2));
    const __m512i shr = HALVES(_mm256_setzero_si256(), _mm256_set1_epi16(2));
    __m512i l = LOAD512(w->ql + 64 * h);
    __m512i qh = _mm512_broadcast_i64x4(LOAD256(w->qh + 32 * h));
    *qa = _mm512_or_si512(_mm512_and_si512(l, lo4),
                          _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30));
    *qb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), lo4),
                          _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30));
}

VNNI static inline __attribute__((always_inline)) float
dot512_q6_k(const eng_block_q6_k_t *w, const eng_block_q8_k_t *x, uint32_t K)
{
    __m512i idx[4] = {LOAD512(q6_lanes[0]), LOAD512(q6_lanes[1]), LOAD512(q6_lanes[2]),
                      LOAD512(q6_lanes[3])};
    __m512 acc = _mm512_setzero_ps();
    for (uint32_t b = 0; b < K / ENG_QK_K; b++, w++, x++) {
        __m256i sc16 =
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)w->scales));
        __m512i sc = _mm512_castsi256_si512(sc16);
        __m256i off = _mm256_madd_epi16(LOAD256(x->bsums), sc16); /* sum_j sc_j bsum_j */
        __m512i sumi = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            __m512i qa, qb;
            q6_half(w, h, &qa, &qb);
            __m512i pa = _mm512_maddubs_epi16(qa, LOAD512(x->qs + 128 * h));
            __m512i pb = _mm512_maddubs_epi16(qb, LOAD512(x->qs + 128 * h + 64));
            sumi = _mm512_dpwssd_epi32(sumi, pa, _mm512_permutexvar_epi16(idx[2 * h], sc));
            sumi = _mm512_dpwssd_epi32(sumi, pb, _mm512_permutexvar_epi16(idx[2 * h + 1], sc));
        }
        __m512i offv = _mm512_castsi256_si512(_mm256_slli_epi32(off, 5));
        offv = _mm512_inserti64x4(offv, _mm256_setzero_si256(), 1);
        sumi = _mm512_sub_epi32(sumi, offv);
        acc =
            _mm512_fmadd_ps(_mm512_set1_ps(x->d * _cvtsh_ss(w->d)), _mm512_cvtepi32_ps(sumi), acc);
    }
    return _mm512_reduce_add_ps(acc);
}
#undef LOAD256
#undef LOAD512
#undef HALVES

VNNI static float dot512_q(uint32_t wtype, const void *w, const void *xq, uint32_t K)
{
    switch (wtype) {
    case ENG_GGML_TYPE_Q4_0:
        return dot512_q4_0(w, xq, K);
    case ENG_GGML_TYPE_Q4_K:
        return dot512_q45_k(false, w, xq, NULL, K);
    case ENG_GGML_TYPE_Q5_K:
        return dot512_q45_k(true, w, xq, NULL, K);
    case ENG_GGML_TYPE_Q6_K:
        return dot512_q6_k(w, xq, K);
    case ENG_GGML_TYPE_Q8_0: /* 256-bit blocks: the AVX2 product */
    case ENG_GGML_TYPE_Q5_0:
    case ENG_GGML_TYPE_Q5_1:
        return eng__avx2_dot_q(wtype, w, xq, K);
    default:
        PC_ABORT("weight type %u has no integer dot product", wtype);
    }
}

/* The GEMV on Q4_0 and the K-quants: eng__gemv_q's loop with the type's dot product
 * inlined (no call and no type switch per row; at K 1024 a Q4_K row is only four super-blocks)
 * and two weight rows per step, whose products the core overlaps. Each row's sum is the dot
 * product's, operation for operation. */
VNNI static inline __attribute__((always_inline)) void
gemv_q_rows(const uint32_t t, const eng_gemv_t *g, uint32_t n0, uint32_t n1)
{
    size_t rb = eng__gemv_row_bytes(t, g->K);
    /* One row of x (decode): Q4_K / Q5_K take it prepared. */
    _Alignas(64) int8_t xp_buf[Q45_MAX_K];
    const int8_t *xp = NULL;
    if ((t == ENG_GGML_TYPE_Q4_K || t == ENG_GGML_TYPE_Q5_K) && g->M == 1 && g->K <= Q45_MAX_K) {
        q45_prep_x(g->xq, g->K / ENG_QK_K, xp_buf);
        xp = xp_buf;
    }
#define GEMV_Q_DOT(wr, xr)                                                                         \
    (t == ENG_GGML_TYPE_Q4_0 ? dot512_q4_0((const void *)(wr), (const void *)(xr), g->K)           \
     : t == ENG_GGML_TYPE_Q6_K                                                                     \
         ? dot512_q6_k((const void *)(wr), (const void *)(xr), g->K)                               \
         : dot512_q45_k(t == ENG_GGML_TYPE_Q5_K, (wr), (const void *)(xr), xp, g->K))
    uint32_t n = n0;
    for (; n + 2 <= n1; n += 2) {
        const char *w0 = (const char *)g->w + (size_t)n * rb, *w1 = w0 + rb;
        eng__gemv_prefetch_row(w0, 2 * rb);
        for (uint32_t m = 0; m < g->M; m++) {
            const char *xr = (const char *)g->xq + (size_t)m * g->xq_stride;
            float s0 = GEMV_Q_DOT(w0, xr), s1 = GEMV_Q_DOT(w1, xr);
            float *yp = &g->y[(size_t)m * g->ldy + n];
            yp[0] = g->accumulate ? yp[0] + s0 : s0;
            yp[1] = g->accumulate ? yp[1] + s1 : s1;
        }
    }
    if (n < n1) {
        const char *w0 = (const char *)g->w + (size_t)n * rb;
        for (uint32_t m = 0; m < g->M; m++) {
            float s0 = GEMV_Q_DOT(w0, (const char *)g->xq + (size_t)m * g->xq_stride);
            float *yp = &g->y[(size_t)m * g->ldy + n];
            *yp = g->accumulate ? *yp + s0 : s0;
        }
    }
#undef GEMV_Q_DOT
}

/* The GEMV of a Q4_0 or K-quant weight on a CPU with AVX512-VNNI: returns false, writing
 * nothing, for another type or CPU. */
VNNI static bool gemv_q_vnni(const eng_gemv_t *g, uint32_t n0, uint32_t n1)
{
    if (!eng__cpu_has_avx512_vnni())
        return false;
    switch (g->wtype) {
    case ENG_GGML_TYPE_Q4_0:
        gemv_q_rows(ENG_GGML_TYPE_Q4_0, g, n0, n1);
        return true;
    case ENG_GGML_TYPE_Q4_K:
        gemv_q_rows(ENG_GGML_TYPE_Q4_K, g, n0, n1);
        return true;
    case ENG_GGML_TYPE_Q5_K:
        gemv_q_rows(ENG_GGML_TYPE_Q5_K, g, n0, n1);
        return true;
    case ENG_GGML_TYPE_Q6_K:
        gemv_q_rows(ENG_GGML_TYPE_Q6_K, g, n0, n1);
        return true;
    default:
        return false;
    }
}

float eng__avx512_dot_q(uint32_t wtype, const void *w, const void *xq, uint32_t K)
{
    if (!eng__cpu_has_avx512_vnni())
        return eng__avx2_dot_q(wtype, w, xq, K);
    return dot512_q(wtype, w, xq, K);
}

/* ---------------------------------------------------------------------------------------------
 * The quantized prefill GEMM: eng__avx512_dot_q's arithmetic for QG_ROWS rows of x and two weight
 * rows per micro-kernel. The task's weight rows are first decoded once into a packed form (every
 * quant widened to a byte in x's element order, the scales spread over the lanes that take them),
 * which stays in L2 while the row groups of x pass over it; the micro-kernel holds its rows'
 * activations and every accumulator in registers. Each int32 lane sums the same products times
 * the same scales as the dot product's lane (exact: no intermediate leaves int16 where it is
 * packed there, and the order of integer additions does not matter), and every float operation is
 * the dot product's, on the same values in the same order (two outputs' 8-lane K-quant
 * accumulators share a 512-bit register, lane for lane), so each output is bit for bit
 * eng__avx512_dot_q's.
 * ------------------------------------------------------------------------------------------- */

#define LOAD256(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define LOAD512(p) _mm512_loadu_si512((const void *)(p))
#define QG_ROWS 4 /* rows of x per micro-kernel */
#define QG_ALIGN 64
/* The tiles' loops over rows, weight rows and chunks run unrolled: their vectors live in registers.
 */
#define QG_UNROLL _Pragma("GCC unroll 16")

/* One K-quant super-block of a weight row, packed. q[e]: element e's unsigned quant (Q4_K 0..15,
 * Q5_K 0..31, Q6_K 0..63), the one the dot product multiplies by x's byte e; sc[h][2 l + i]: the
 * scale of int32 lane l (four elements) of chunk 2 h + i (elements 64 (2 h + i) ..); m: Q4_K /
 * Q5_K's mins, min j in lanes 2j and 2j + 1 (VPMADDWD with bsums), Q6_K's -32 sc_j (its offset
 * through bsums); d, dmin the F16 scales in F32. */
typedef struct qk_pack {
    uint8_t q[ENG_QK_K];
    int16_t sc[2][32];
    int16_t m[16];
    float d, dmin;
    uint8_t pad[24];
} qk_pack_t;
_Static_assert(sizeof(qk_pack_t) % QG_ALIGN == 0, "packed super-blocks stay aligned");

/* A Q4_0 block pair of a weight row, packed: the 64 quants (0..15) in element order, and the two
 * scales in F32 over their lanes (0-7 the first block's, 8-15 the second's). */
typedef struct q40_wpack {
    uint8_t q[64];
    float dw[16];
} q40_wpack_t;

/* n super-blocks of a Q4_K (hb false) or Q5_K row, packed. */
VNNI static inline __attribute__((always_inline)) void qk_pack_q45(const bool hb, const void *src,
                                                                   uint32_t n, qk_pack_t *p)
{
    const __m256i lo4 = _mm256_set1_epi8(0x0f), b16 = _mm256_set1_epi8(0x10);
    const size_t wb = hb ? sizeof(eng_block_q5_k_t) : sizeof(eng_block_q4_k_t);
    const uint8_t *w = src;
    for (uint32_t b = 0; b < n; b++, w += wb, p++) {
        const eng_block_q4_k_t *w4 = (const eng_block_q4_k_t *)(const void *)w;
        __m128i sm = k4_unpack128(w4->scales);
        const uint8_t *qs = hb ? ((const eng_block_q5_k_t *)(const void *)w)->qs : w4->qs;
        __m256i qh =
            hb ? LOAD256(((const eng_block_q5_k_t *)(const void *)w)->qh) : _mm256_setzero_si256();
        uint8_t s8[16];
        _mm_storeu_si128((__m128i *)(void *)s8, sm);
        for (int c = 0; c < 4; c++) {
            __m256i v = LOAD256(qs + 32 * c);
            __m256i lo = _mm256_and_si256(v, lo4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
            if (hb) {
                lo = _mm256_mask_add_epi8(
                    lo, _mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(1 << (2 * c)))), lo, b16);
                hi = _mm256_mask_add_epi8(
                    hi, _mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(2 << (2 * c)))), hi, b16);
            }
            _mm256_storeu_si256((__m256i *)(void *)(p->q + 64 * c), lo);
            _mm256_storeu_si256((__m256i *)(void *)(p->q + 64 * c + 32), hi);
        }
        for (int c = 0; c < 4; c++) /* chunk c's lane l: sub-block 2c (l < 8) or 2c + 1 */
            for (int l = 0; l < 16; l++)
                p->sc[c / 2][2 * l + c % 2] = s8[2 * c + l / 8];
        _mm256_storeu_si256((__m256i *)(void *)p->m,
                            _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm)));
        p->d = _cvtsh_ss(w4->d);
        p->dmin = _cvtsh_ss(w4->dmin);
    }
}

/* n super-blocks of a Q6_K row, packed (dot512_q6_k's quants and lane scales). */
VNNI static void qk_pack_q6(const eng_block_q6_k_t *w, uint32_t n, qk_pack_t *p)
{
    for (uint32_t b = 0; b < n; b++, w++, p++) {
        __m256i sc16 =
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)w->scales));
        for (int h = 0; h < 2; h++) {
            __m512i qa, qb;
            q6_half(w, h, &qa, &qb);
            _mm512_storeu_si512((void *)(p->q + 128 * h), qa);
            _mm512_storeu_si512((void *)(p->q + 128 * h + 64), qb);
        }
        for (int c = 0; c < 4; c++) /* chunk c's lane l: sub-block 4c + l / 4 */
            for (int l = 0; l < 16; l++)
                p->sc[c / 2][2 * l + c % 2] = w->scales[4 * c + l / 4];
        _mm256_storeu_si256((__m256i *)(void *)p->m,
                            _mm256_mullo_epi16(sc16, _mm256_set1_epi16(-32)));
        p->d = _cvtsh_ss(w->d);
        p->dmin = 0;
    }
}

/* np block pairs of a Q4_0 row, packed (q4_0_pair's quants and scales). */
VNNI static void q40_pack(const eng_block_q4_0_t *w, uint32_t np, q40_wpack_t *p)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    for (uint32_t i = 0; i < np; i++, w += 2, p++) {
        __m256i v = _mm256_loadu2_m128i((const __m128i *)(const void *)w[1].qs,
                                        (const __m128i *)(const void *)w[0].qs);
        __m512i t = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
        _mm512_storeu_si512(
            (void *)p->q,
            _mm512_and_si512(_mm512_shuffle_i64x2(t, t, _MM_SHUFFLE(3, 1, 2, 0)), lo4));
        _mm512_storeu_ps(p->dw, _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(_cvtsh_ss(w[0].d)),
                                                     _mm512_set1_ps(_cvtsh_ss(w[1].d))));
    }
}

/* Two F32 values spread over a 512-bit register: lanes 0-7 a, 8-15 b. */
VNNI static inline __m512 qg_pair_ps(float a, float b)
{
    return _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(a), _mm512_set1_ps(b));
}

/* R rows of Q8_K activations (xr[r], nsb blocks each) times two packed K-quant weight rows p0, p1
 * (Q6_K with q6, else Q4_K / Q5_K): out[r][j] = eng__avx512_dot_q of row r and weight row j. */
VNNI static inline __attribute__((always_inline)) void
qk_tile(const int R, const bool q6, const qk_pack_t *p0, const qk_pack_t *p1, uint32_t nsb,
        const eng_block_q8_k_t *const *xr, float out[QG_ROWS][2])
{
    /* K-quants: lanes 0-7 weight row 0's 8-lane accumulator, 8-15 row 1's (acc, accm); Q6_K:
     * acc[r] the 16 lanes of weight row 0, accm[r] those of weight row 1. */
    __m512 acc[QG_ROWS], accm[QG_ROWS];
    QG_UNROLL
    for (int r = 0; r < R; r++)
        acc[r] = accm[r] = _mm512_setzero_ps();
    for (uint32_t b = 0; b < nsb; b++, p0++, p1++) {
        __m512i si[QG_ROWS][2];
        QG_UNROLL
        for (int r = 0; r < R; r++) {
            if (q6) { /* the offset -32 sum_j sc_j bsum_j, in lanes 0-7 as dot512_q6_k has it */
                __m256i bs = LOAD256(xr[r][b].bsums);
                si[r][0] = _mm512_zextsi256_si512(_mm256_madd_epi16(bs, LOAD256(p0->m)));
                si[r][1] = _mm512_zextsi256_si512(_mm256_madd_epi16(bs, LOAD256(p1->m)));
            } else {
                si[r][0] = si[r][1] = _mm512_setzero_si512();
            }
        }
        /* Chunk pairs (2h, 2h + 1): per weight row and row of x, each chunk's 16 lanes of four
         * products by VPDPBUSD (exact, within int16: at most 4 * 63 * 127), the two chunks' lane
         * sums as the int16 pairs of one register, times their sub-blocks' scales by VPDPWSSD. */
        QG_UNROLL
        for (int h = 0; h < 2; h++) {
            QG_UNROLL
            for (int j = 0; j < 2; j++) {
                const qk_pack_t *pj = j ? p1 : p0;
                __m512i w0 = LOAD512(pj->q + 128 * h), w1 = LOAD512(pj->q + 128 * h + 64);
                __m512i sc = LOAD512(pj->sc[h]);
                QG_UNROLL
                for (int r = 0; r < R; r++) {
                    const int8_t *a = xr[r][b].qs + 128 * h;
                    __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w0, LOAD512(a));
                    __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w1, LOAD512(a + 64));
                    __m512i t = _mm512_mask_blend_epi16(0xaaaaaaaau, s0, _mm512_slli_epi32(s1, 16));
                    si[r][j] = _mm512_dpwssd_epi32(si[r][j], t, sc);
                }
            }
        }
        if (q6) {
            QG_UNROLL
            for (int r = 0; r < R; r++) {
                float xd = xr[r][b].d;
                acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(xd * p0->d), _mm512_cvtepi32_ps(si[r][0]),
                                         acc[r]);
                accm[r] = _mm512_fmadd_ps(_mm512_set1_ps(xd * p1->d), _mm512_cvtepi32_ps(si[r][1]),
                                          accm[r]);
            }
            continue;
        }
        __m512 wd = qg_pair_ps(p0->d, p1->d), wm = qg_pair_ps(p0->dmin, p1->dmin);
        __m512i mins =
            _mm512_inserti64x4(_mm512_castsi256_si512(LOAD256(p0->m)), LOAD256(p1->m), 1);
        QG_UNROLL
        for (int r = 0; r < R; r++) {
            /* Lanes 0-7: s0 + s1 of weight row 0 (dot512_q45_k's two halves), 8-15 row 1's. */
            __m512i s = _mm512_add_epi32(_mm512_shuffle_i64x2(si[r][0], si[r][1], 0x44),
                                         _mm512_shuffle_i64x2(si[r][0], si[r][1], 0xee));
            __m512 xd = _mm512_set1_ps(xr[r][b].d);
            __m512i mq = _mm512_madd_epi16(_mm512_broadcast_i64x4(LOAD256(xr[r][b].bsums)), mins);
            accm[r] = _mm512_fmadd_ps(_mm512_mul_ps(xd, wm), _mm512_cvtepi32_ps(mq), accm[r]);
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(xd, wd), _mm512_cvtepi32_ps(s), acc[r]);
        }
    }
    QG_UNROLL
    for (int r = 0; r < R; r++) {
        if (q6) {
            out[r][0] = _mm512_reduce_add_ps(acc[r]);
            out[r][1] = _mm512_reduce_add_ps(accm[r]);
        } else {
            __m512d v = _mm512_castps_pd(_mm512_sub_ps(acc[r], accm[r]));
            out[r][0] = hsum8_q45(_mm256_castpd_ps(_mm512_castpd512_pd256(v)));
            out[r][1] = hsum8_q45(_mm256_castpd_ps(_mm512_extractf64x4_pd(v, 1)));
        }
    }
}

/* R prepared Q4_0 activation rows (xr[r], np pairs each) times two packed Q4_0 weight rows:
 * out[r][j] as dot512_q4_0 (pair p into accumulator p % 2, whole pairs only). */
VNNI static inline __attribute__((always_inline)) void q40_tile(const int R, const q40_wpack_t *w0,
                                                                const q40_wpack_t *w1, uint32_t np,
                                                                const q40_pair_t *const *xr,
                                                                float out[QG_ROWS][2])
{
    __m512 acc[QG_ROWS][2][2]; /* [row][weight row][chain] */
    QG_UNROLL
    for (int r = 0; r < R; r++)
        QG_UNROLL
    for (int j = 0; j < 2; j++)
        acc[r][j][0] = acc[r][j][1] = _mm512_setzero_ps();
#define Q40_STEP(p, ch)                                                                            \
    do {                                                                                           \
        QG_UNROLL                                                                                  \
        for (int j = 0; j < 2; j++) {                                                              \
            const q40_wpack_t *wp = (j ? w1 : w0) + (p);                                           \
            __m512i q = LOAD512(wp->q);                                                            \
            __m512 dw = _mm512_loadu_ps(wp->dw);                                                   \
            QG_UNROLL                                                                              \
            for (int r = 0; r < R; r++) {                                                          \
                const q40_pair_t *xp = xr[r] + (p);                                                \
                __m512i s =                                                                        \
                    _mm512_dpbusd_epi32(_mm512_load_si512(xp->init), q, _mm512_load_si512(xp->a)); \
                acc[r][j][ch] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_load_ps(xp->dx)),         \
                                                _mm512_cvtepi32_ps(s), acc[r][j][ch]);             \
            }                                                                                      \
        }                                                                                          \
    } while (0)
    uint32_t p = 0;
    for (; p + 2 <= np; p += 2) {
        Q40_STEP(p, 0);
        Q40_STEP(p + 1, 1);
    }
    if (p < np)
        Q40_STEP(p, 0);
#undef Q40_STEP
    QG_UNROLL
    for (int r = 0; r < R; r++)
        QG_UNROLL
    for (int j = 0; j < 2; j++)
        out[r][j] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][j][0], acc[r][j][1]));
}

/* One micro-kernel call of R (1..QG_ROWS) rows: the tile functions instantiated per row count. */
#define QG_BY_ROWS(R, call)                                                                        \
    switch (R) {                                                                                   \
    case 1:                                                                                        \
        call(1);                                                                                   \
        break;                                                                                     \
    case 2:                                                                                        \
        call(2);                                                                                   \
        break;                                                                                     \
    case 3:                                                                                        \
        call(3);                                                                                   \
        break;                                                                                     \
    default:                                                                                       \
        call(QG_ROWS);                                                                             \
        break;                                                                                     \
    }

VNNI static void qk_tiles(bool q6, int R, const qk_pack_t *p0, const qk_pack_t *p1, uint32_t nsb,
                          const eng_block_q8_k_t *const *xr, float out[QG_ROWS][2])
{
#define QK_CALL(n) qk_tile(n, true, p0, p1, nsb, xr, out)
#define QK_CALL45(n) qk_tile(n, false, p0, p1, nsb, xr, out)
    if (q6) {
        QG_BY_ROWS(R, QK_CALL)
    } else {
        QG_BY_ROWS(R, QK_CALL45)
    }
#undef QK_CALL
#undef QK_CALL45
}

VNNI static void q40_tiles(int R, const q40_wpack_t *w0, const q40_wpack_t *w1, uint32_t np,
                           const q40_pair_t *const *xr, float out[QG_ROWS][2]){
#define Q40_CALL(n) q40_tile(n, w0, w1, np, xr, out)
    QG_BY_ROWS(R, Q40_CALL)
#undef Q40_CALL
}
#undef QG_BY_ROWS

VNNI static bool qgemm(const eng_gemv_t *g, uint32_t n0, uint32_t n1, void *buf, size_t buf_bytes)
{
    uint32_t t = g->wtype, K = g->K;
    bool q40 = t == ENG_GGML_TYPE_Q4_0;
    uint32_t nc = n1 - n0, ncp = (nc + 1) & ~1u; /* an odd last row is packed twice */
    uint32_t nblk = q40 ? K / 64 : K / ENG_QK_K; /* packed units per weight row */
    size_t unit = q40 ? sizeof(q40_wpack_t) : sizeof(qk_pack_t);
    size_t wbytes = (size_t)ncp * nblk * unit;
    size_t xbytes = q40 ? (size_t)QG_ROWS * nblk * sizeof(q40_pair_t) : 0;
    uintptr_t base = ((uintptr_t)buf + QG_ALIGN - 1) & ~(uintptr_t)(QG_ALIGN - 1);
    if (base - (uintptr_t)buf + wbytes + xbytes > buf_bytes)
        return false;
    char *wpk = (char *)base;
    q40_pair_t *xprep = (q40_pair_t *)(void *)(wpk + wbytes);
    size_t rb = eng__gemv_row_bytes(t, K);
    for (uint32_t i = 0; i < ncp; i++) {
        const char *src = (const char *)g->w + (size_t)(n0 + PC_MIN(i, nc - 1)) * rb;
        void *dst = wpk + (size_t)i * nblk * unit;
        switch (t) {
        case ENG_GGML_TYPE_Q4_0:
            q40_pack((const eng_block_q4_0_t *)(const void *)src, nblk, dst);
            break;
        case ENG_GGML_TYPE_Q4_K:
            qk_pack_q45(false, src, nblk, dst);
            break;
        case ENG_GGML_TYPE_Q5_K:
            qk_pack_q45(true, src, nblk, dst);
            break;
        default:
            qk_pack_q6((const eng_block_q6_k_t *)(const void *)src, nblk, dst);
            break;
        }
    }
    for (uint32_t m0 = 0; m0 < g->M; m0 += QG_ROWS) {
        int R = (int)PC_MIN(QG_ROWS, g->M - m0);
        const void *xr[QG_ROWS];
        for (int r = 0; r < R; r++) {
            const void *xq = (const char *)g->xq + (size_t)(m0 + r) * g->xq_stride;
            if (q40) {
                q40_prep_x(xq, nblk, xprep + (size_t)r * nblk);
                xr[r] = xprep + (size_t)r * nblk;
            } else {
                xr[r] = xq;
            }
        }
        for (uint32_t i = 0; i < ncp; i += 2) {
            const char *p0 = wpk + (size_t)i * nblk * unit, *p1 = p0 + (size_t)nblk * unit;
            float out[QG_ROWS][2];
            if (q40)
                q40_tiles(R, (const void *)p0, (const void *)p1, nblk,
                          (const q40_pair_t *const *)xr, out);
            else
                qk_tiles(t == ENG_GGML_TYPE_Q6_K, R, (const void *)p0, (const void *)p1, nblk,
                         (const eng_block_q8_k_t *const *)xr, out);
            for (int r = 0; r < R; r++) {
                float *yr = g->y + (size_t)(m0 + r) * g->ldy + n0 + i;
                for (uint32_t j = 0; j < 2 && i + j < nc; j++)
                    yr[j] = g->accumulate ? yr[j] + out[r][j] : out[r][j];
            }
        }
    }
    return true;
}

bool eng__avx512_qgemm(const eng_gemv_t *g, uint32_t n0, uint32_t n1, void *buf, size_t buf_bytes)
{
    uint32_t t = g->wtype;
    if (!eng__cpu_has_avx512_vnni() || n1 <= n0 ||
        !(t == ENG_GGML_TYPE_Q4_K || t == ENG_GGML_TYPE_Q5_K || t == ENG_GGML_TYPE_Q6_K ||
          (t == ENG_GGML_TYPE_Q4_0 && g->K % 64 == 0))) /* Q4_0: whole block pairs (dot512_q4_0
                                                            ends an odd block count alone) */
        return false;
    return qgemm(g, n0, n1, buf, buf_bytes);
}
#undef QG_UNROLL
#undef LOAD256
#undef LOAD512
#undef VNNI

/* ---------------------------------------------------------------------------------------------
 * SwiGLU as llama.cpp's CPU backend computes it on AVX-512 CPUs (ggml_vec_swiglu_f32 with
 * ggml_v_silu and the AVX-512 ggml_v_expf, operation for operation), so that the products it
 * then quantizes are the same floats.
 * ------------------------------------------------------------------------------------------- */

AVX512 static inline __m512 ggml_expf512(__m512 x)
{
    const __m512 r = _mm512_set1_ps(0x1.8p23f);
    const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), r);
    const __m512 n = _mm512_sub_ps(z, r);
    const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                      _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
    const __mmask16 d = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192), _CMP_GT_OQ);
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(
            _mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
            _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f))),
        u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
    const __m512 res = _mm512_scalef_ps(j, n);
    if (_mm512_kortestz(d, d))
        return res;
    const __m512 alt = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ),
                                            _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
    return _mm512_mask_blend_ps(d, res, alt);
}

AVX512 void eng__avx512_swiglu(float *g, const float *u, size_t n)
{
    size_t j = 0;
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; j + 16 <= n; j += 16) {
        __m512 gv = _mm512_loadu_ps(g + j);
        __m512 e = ggml_expf512(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, e));
        _mm512_storeu_ps(g + j, _mm512_mul_ps(s, _mm512_loadu_ps(u + j)));
    }
    for (; j < n; j++) {
        float gv = g[j];
        g[j] = gv / (1.0f + expf(-gv)) * u[j];
    }
}

/* ---------------------------------------------------------------------------------------------
 * Attention
 * ------------------------------------------------------------------------------------------- */

/* e^x for x <= 0 .. 88, relative error ~2e-7: x = n ln2 + r, |r| <= ln2/2, e^r by its degree-6
 * Taylor polynomial, scaled by 2^n with scalef. Lanes at -inf give 0 (callers mask anyway). */
AVX512 static inline __m512 exp512(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-103.0f));
    x = _mm512_min_ps(x, _mm512_set1_ps(88.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* Each row's online-softmax step over its chunk's raw scores sv[r] (16 keys per vector, finite
 * in every lane): m, l, corr, n_valid and the weights p (zero past the row's last visible key;
 * all zero with corr 1 for a row that sees none of the chunk). */
AVX512 static inline void softmax4(__m512 sv[4][4], eng_attn_row_t *rows, uint32_t n_rows,
                                   uint32_t start, uint32_t n_keys)
{
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (uint32_t r = 0; r < n_rows; r++) {
        eng_attn_row_t *row = &rows[r];
        if (row->pos < start) {
            row->corr = 1.0f;
            row->n_valid = 0;
            for (uint32_t c = 0; c < 4; c++)
                _mm512_storeu_ps(row->p + 16 * c, _mm512_setzero_ps());
            continue;
        }
        uint32_t n_valid = PC_MIN(n_keys, row->pos - start + 1);
        __mmask16 mk[4];
        __m512 x[4], vmax = ninf;
        for (uint32_t c = 0; c < 4; c++) {
            uint32_t nv = n_valid > 16 * c ? PC_MIN(16, n_valid - 16 * c) : 0;
            mk[c] = (__mmask16)(nv >= 16 ? 0xffff : (1u << nv) - 1);
            x[c] = _mm512_mask_mov_ps(ninf, mk[c], sv[r][c]);
            vmax = _mm512_max_ps(vmax, x[c]);
        }
        float bmax = _mm512_reduce_max_ps(vmax);
        float m_new = row->m > bmax ? row->m : bmax;
        __m512 mn = _mm512_set1_ps(m_new), sum = _mm512_setzero_ps();
        for (uint32_t c = 0; c < 4; c++) {
            __m512 pc = _mm512_maskz_mov_ps(mk[c], exp512(_mm512_sub_ps(x[c], mn)));
            _mm512_storeu_ps(row->p + 16 * c, pc);
            sum = _mm512_add_ps(sum, pc);
        }
        row->corr = expf(row->m - m_new); /* 0 for the first chunk (m = -inf) */
        row->l = row->l * row->corr + _mm512_reduce_add_ps(sum);
        row->m = m_new;
        row->n_valid = n_valid;
    }
}

/* Scores of up to four rows against a chunk's keys (kt [hd][ENG_ATTN_CHUNK], F32, finite in every
 * lane), then each row's online-softmax step: m, l, corr, n_valid and the weights p (zero past
 * the row's last visible key, and all zero for a row that sees none of the chunk, with corr 1).
 * Rows past n_rows repeat row 0 in the products and are not updated. */
/* With kb (f16): the chunk's keys straight from four F16 KV blocks of 16 slots (K [hd][16]
 * each), converted in registers: the same values as the F32 tile, in the same operations. */
AVX512 static inline __attribute__((always_inline)) void
attn_scores4(const bool f16, const float *kt, const uint16_t *const *kb, uint32_t hd,
             eng_attn_row_t *rows, uint32_t n_rows, uint32_t start, uint32_t n_keys)
{
    const float *q0 = rows[0].q;
    const float *q1 = rows[PC_MIN(1, n_rows - 1)].q;
    const float *q2 = rows[PC_MIN(2, n_rows - 1)].q;
    const float *q3 = rows[PC_MIN(3, n_rows - 1)].q;
    /* Sixteen named accumulators (row x 16 keys): an array of vectors would live on the
     * stack. */
    __m512 s00 = _mm512_setzero_ps(), s01 = s00, s02 = s00, s03 = s00, s10 = s00, s11 = s00;
    __m512 s12 = s00, s13 = s00, s20 = s00, s21 = s00, s22 = s00, s23 = s00, s30 = s00;
    __m512 s31 = s00, s32 = s00, s33 = s00;
    for (uint32_t d = 0; d < hd; d++) {
        __m512 k0, k1, k2, k3;
        if (f16) {
            k0 = HALF16(kb[0] + (size_t)d * 16), k1 = HALF16(kb[1] + (size_t)d * 16);
            k2 = HALF16(kb[2] + (size_t)d * 16), k3 = HALF16(kb[3] + (size_t)d * 16);
        } else {
            const float *kd = kt + (size_t)d * ENG_ATTN_CHUNK;
            k0 = _mm512_loadu_ps(kd), k1 = _mm512_loadu_ps(kd + 16);
            k2 = _mm512_loadu_ps(kd + 32), k3 = _mm512_loadu_ps(kd + 48);
        }
#define ATTN_QK(qp, a0, a1, a2, a3)                                                                \
    do {                                                                                           \
        __m512 qb = _mm512_set1_ps((qp)[d]);                                                       \
        a0 = _mm512_fmadd_ps(qb, k0, a0);                                                          \
        a1 = _mm512_fmadd_ps(qb, k1, a1);                                                          \
        a2 = _mm512_fmadd_ps(qb, k2, a2);                                                          \
        a3 = _mm512_fmadd_ps(qb, k3, a3);                                                          \
    } while (0)
        ATTN_QK(q0, s00, s01, s02, s03);
        ATTN_QK(q1, s10, s11, s12, s13);
        ATTN_QK(q2, s20, s21, s22, s23);
        ATTN_QK(q3, s30, s31, s32, s33);
#undef ATTN_QK
    }
    __m512 sv[4][4] = {
        {s00, s01, s02, s03}, {s10, s11, s12, s13}, {s20, s21, s22, s23}, {s30, s31, s32, s33}};
    softmax4(sv, rows, n_rows, start, n_keys);
}

AVX512 void eng__avx512_attn_scores4(const float *kt, uint32_t hd, eng_attn_row_t *rows,
                                     uint32_t n_rows, uint32_t start, uint32_t n_keys)
{
    attn_scores4(false, kt, NULL, hd, rows, n_rows, start, n_keys);
}

AVX512 void eng__avx512_attn_scores4_f16(const uint16_t *const kb[4], uint32_t hd,
                                         eng_attn_row_t *rows, uint32_t n_rows, uint32_t start)
{
    attn_scores4(true, NULL, kb, hd, rows, n_rows, start, ENG_ATTN_CHUNK);
}

/* o = o * corr + p . V for up to four rows (vb [ENG_ATTN_CHUNK][hd], F32; only the first
 * max(n_valid) rows are read, so unwritten slots past them are never touched). Columns go 32
 * at a time (eight accumulators), then 16. */
/* With f16: V row j straight from vblk[j / 16] (V [16][hd] of an F16 KV block), converted in
 * registers. */
AVX512 static inline __attribute__((always_inline)) void
attn_values4(const bool f16, const float *vb, const uint16_t *const *vblk, uint32_t hd,
             eng_attn_row_t *rows, uint32_t n_rows)
{
    uint32_t nj = 0;
    for (uint32_t r = 0; r < n_rows; r++)
        nj = PC_MAX(nj, rows[r].n_valid);
    if (nj == 0)
        return; /* corr is 1 for every row: nothing changes */
    eng_attn_row_t *r0 = &rows[0], *r1 = &rows[PC_MIN(1, n_rows - 1)];
    eng_attn_row_t *r2 = &rows[PC_MIN(2, n_rows - 1)], *r3 = &rows[PC_MIN(3, n_rows - 1)];
    const float *p0 = r0->p, *p1 = r1->p, *p2 = r2->p, *p3 = r3->p;
    __m512 f0 = _mm512_set1_ps(r0->corr), f1 = _mm512_set1_ps(r1->corr);
    __m512 f2 = _mm512_set1_ps(r2->corr), f3 = _mm512_set1_ps(r3->corr);
    uint32_t c = 0;
    for (; c + 32 <= hd; c += 32) {
        __m512 a0 = _mm512_mul_ps(_mm512_loadu_ps(r0->o + c), f0);
        __m512 b0 = _mm512_mul_ps(_mm512_loadu_ps(r0->o + c + 16), f0);
        __m512 a1 = _mm512_mul_ps(_mm512_loadu_ps(r1->o + c), f1);
        __m512 b1 = _mm512_mul_ps(_mm512_loadu_ps(r1->o + c + 16), f1);
        __m512 a2 = _mm512_mul_ps(_mm512_loadu_ps(r2->o + c), f2);
        __m512 b2 = _mm512_mul_ps(_mm512_loadu_ps(r2->o + c + 16), f2);
        __m512 a3 = _mm512_mul_ps(_mm512_loadu_ps(r3->o + c), f3);
        __m512 b3 = _mm512_mul_ps(_mm512_loadu_ps(r3->o + c + 16), f3);
        for (uint32_t j = 0; j < nj; j++) {
            __m512 v0, v1;
            if (f16) {
                const uint16_t *vj = vblk[j / 16] + (size_t)(j % 16) * hd + c;
                v0 = HALF16(vj), v1 = HALF16(vj + 16);
            } else {
                const float *vj = vb + (size_t)j * hd + c;
                v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + 16);
            }
            __m512 w0 = _mm512_set1_ps(p0[j]), w1 = _mm512_set1_ps(p1[j]);
            __m512 w2 = _mm512_set1_ps(p2[j]), w3 = _mm512_set1_ps(p3[j]);
            a0 = _mm512_fmadd_ps(w0, v0, a0);
            b0 = _mm512_fmadd_ps(w0, v1, b0);
            a1 = _mm512_fmadd_ps(w1, v0, a1);
            b1 = _mm512_fmadd_ps(w1, v1, b1);
            a2 = _mm512_fmadd_ps(w2, v0, a2);
            b2 = _mm512_fmadd_ps(w2, v1, b2);
            a3 = _mm512_fmadd_ps(w3, v0, a3);
            b3 = _mm512_fmadd_ps(w3, v1, b3);
        }
        /* Stores in reverse: a row repeated past n_rows is row 0, stored last. */
        _mm512_storeu_ps(r3->o + c, a3);
        _mm512_storeu_ps(r3->o + c + 16, b3);
        _mm512_storeu_ps(r2->o + c, a2);
        _mm512_storeu_ps(r2->o + c + 16, b2);
        _mm512_storeu_ps(r1->o + c, a1);
        _mm512_storeu_ps(r1->o + c + 16, b1);
        _mm512_storeu_ps(r0->o + c, a0);
        _mm512_storeu_ps(r0->o + c + 16, b0);
    }
    for (; c < hd; c += 16) {
        __m512 a0 = _mm512_mul_ps(_mm512_loadu_ps(r0->o + c), f0);
        __m512 a1 = _mm512_mul_ps(_mm512_loadu_ps(r1->o + c), f1);
        __m512 a2 = _mm512_mul_ps(_mm512_loadu_ps(r2->o + c), f2);
        __m512 a3 = _mm512_mul_ps(_mm512_loadu_ps(r3->o + c), f3);
        for (uint32_t j = 0; j < nj; j++) {
            __m512 v0 = f16 ? HALF16(vblk[j / 16] + (size_t)(j % 16) * hd + c)
                            : _mm512_loadu_ps(vb + (size_t)j * hd + c);
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(p0[j]), v0, a0);
            a1 = _mm512_fmadd_ps(_mm512_set1_ps(p1[j]), v0, a1);
            a2 = _mm512_fmadd_ps(_mm512_set1_ps(p2[j]), v0, a2);
            a3 = _mm512_fmadd_ps(_mm512_set1_ps(p3[j]), v0, a3);
        }
        _mm512_storeu_ps(r3->o + c, a3);
        _mm512_storeu_ps(r2->o + c, a2);
        _mm512_storeu_ps(r1->o + c, a1);
        _mm512_storeu_ps(r0->o + c, a0);
    }
}

AVX512 void eng__avx512_attn_values4(const float *vb, uint32_t hd, eng_attn_row_t *rows,
                                     uint32_t n_rows)
{
    attn_values4(false, vb, NULL, hd, rows, n_rows);
}

AVX512 void eng__avx512_attn_values4_f16(const uint16_t *const vblk[4], uint32_t hd,
                                         eng_attn_row_t *rows, uint32_t n_rows)
{
    attn_values4(true, NULL, vblk, hd, rows, n_rows);
}

/* The four rows' sums of one key pair's lanes (lanes 0-7 key j, 8-15 key j + 1) into p. */
AVX512VNNI static inline void q8_pair_store(__m512 a0, __m512 a1, __m512 a2, __m512 a3,
                                            eng_attn_row_t *rows, uint32_t n_rows, uint32_t j,
                                            bool two)
{
#define LO(a) _mm512_castps512_ps256(a)
#define HI(a) _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1))
    __m256 l = _mm256_hadd_ps(_mm256_hadd_ps(LO(a0), LO(a1)), _mm256_hadd_ps(LO(a2), LO(a3)));
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(HI(a0), HI(a1)), _mm256_hadd_ps(HI(a2), HI(a3)));
#undef LO
#undef HI
    float sl[4], sh[4];
    _mm_storeu_ps(sl, _mm_add_ps(_mm256_castps256_ps128(l), _mm256_extractf128_ps(l, 1)));
    _mm_storeu_ps(sh, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
    for (uint32_t r = 0; r < n_rows; r++) {
        rows[r].p[j] = sl[r];
        if (two)
            rows[r].p[j + 1] = sh[r];
    }
}

/* eng__avx2_attn_q8_dots4 with AVX512-VNNI: two keys' blocks in one vector against the query's
 * block in both halves, VPDPBUSD on k + 128 (unsigned) times q, started from -128 * (q's groups of
 * four) so each int32 lane is exactly its four q . k products; then scaled by d_q d_k in F32. A
 * third of the AVX2 kernel's instructions per product (measured: prefill 512 attention). */
AVX512VNNI static void q8_dots4_vnni(const uint8_t *const *krow, uint32_t nb, eng_attn_row_t *rows,
                                     uint32_t n_rows, uint32_t n_keys)
{
    enum { NB_MAX = 16 };
    __m512i qz[4][NB_MAX], cz[4][NB_MAX];
    __m512 dqv[4][NB_MAX];
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (uint32_t r = 0; r < 4; r++) {
        const uint8_t *qr = rows[PC_MIN(r, n_rows - 1)].qq;
        for (uint32_t b = 0; b < nb; b++) {
            const uint8_t *qb = qr + (size_t)b * ENG_Q8_0_BYTES;
            uint16_t h;
            memcpy(&h, qb, 2);
            dqv[r][b] = _mm512_set1_ps(_cvtsh_ss(h));
            qz[r][b] = _mm512_broadcast_i64x4(_mm256_loadu_si256((const void *)(qb + 2)));
            cz[r][b] =
                _mm512_sub_epi32(_mm512_setzero_si512(),
                                 _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, qz[r][b]));
        }
    }
    for (uint32_t j = 0; j < n_keys; j += 2) {
        bool two = j + 1 < n_keys;
        const uint8_t *k0 = krow[j], *k1 = krow[two ? j + 1 : j];
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (uint32_t b = 0; b < nb; b++) {
            const uint8_t *b0 = k0 + (size_t)b * ENG_Q8_0_BYTES,
                          *b1 = k1 + (size_t)b * ENG_Q8_0_BYTES;
            uint16_t h0, h1;
            memcpy(&h0, b0, 2);
            memcpy(&h1, b1, 2);
            __m512i ku =
                _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(
                                                        _mm256_loadu_si256((const void *)(b0 + 2))),
                                                    _mm256_loadu_si256((const void *)(b1 + 2)), 1),
                                 bias);
            __m512 dk = _mm512_castpd_ps(_mm512_insertf64x4(
                _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_set1_ps(_cvtsh_ss(h0)))),
                _mm256_castps_pd(_mm256_set1_ps(_cvtsh_ss(h1))), 1));
#define VNNI_ROW(r, acc)                                                                           \
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(cz[r][b], ku, qz[r][b])),         \
                          _mm512_mul_ps(dk, dqv[r][b]), acc)
            VNNI_ROW(0, a0);
            VNNI_ROW(1, a1);
            VNNI_ROW(2, a2);
            VNNI_ROW(3, a3);
#undef VNNI_ROW
        }
        q8_pair_store(a0, a1, a2, a3, rows, n_rows, j, two);
    }
    for (uint32_t r = 0; r < n_rows; r++)
        for (uint32_t j = n_keys; j < ENG_ATTN_CHUNK; j++)
            rows[r].p[j] = 0;
}

/* q8_0 KV (cpu_simd.h): the integer dot products (VPDPBUSD where the CPU has AVX512-VNNI, else
 * the AVX2 path's: AVX-512F alone has no 512-bit byte products), then the 512-bit softmax
 * step. */
AVX512 void eng__avx512_attn_q8_scores4(const uint8_t *const *krow, uint32_t nb,
                                        eng_attn_row_t *rows, uint32_t n_rows, uint32_t start,
                                        uint32_t n_keys)
{
    if (nb <= 16 && eng__cpu_has_avx512_vnni())
        q8_dots4_vnni(krow, nb, rows, n_rows, n_keys);
    else
        eng__avx2_attn_q8_dots4(krow, nb, rows, n_rows, n_keys);
    __m512 sv[4][4];
    for (uint32_t r = 0; r < 4; r++)
        for (uint32_t c = 0; c < 4; c++)
            sv[r][c] = _mm512_loadu_ps(rows[PC_MIN(r, n_rows - 1)].p + 16 * c);
    softmax4(sv, rows, n_rows, start, n_keys);
}

/* o = o * corr + p . V with V as q8_0: one q8_0 block (32 columns, two vectors) at a time, each
 * key's block converted once in registers (VPMOVSXBD, VCVTDQ2PS, times d) for the four rows. */
AVX512 void eng__avx512_attn_q8_values4(const uint8_t *const *vrow, uint32_t hd,
                                        eng_attn_row_t *rows, uint32_t n_rows)
{
    uint32_t nj = 0;
    for (uint32_t r = 0; r < n_rows; r++)
        nj = PC_MAX(nj, rows[r].n_valid);
    if (nj == 0)
        return; /* corr is 1 for every row: nothing changes */
    eng_attn_row_t *r0 = &rows[0], *r1 = &rows[PC_MIN(1, n_rows - 1)];
    eng_attn_row_t *r2 = &rows[PC_MIN(2, n_rows - 1)], *r3 = &rows[PC_MIN(3, n_rows - 1)];
    const float *p0 = r0->p, *p1 = r1->p, *p2 = r2->p, *p3 = r3->p;
    __m512 f0 = _mm512_set1_ps(r0->corr), f1 = _mm512_set1_ps(r1->corr);
    __m512 f2 = _mm512_set1_ps(r2->corr), f3 = _mm512_set1_ps(r3->corr);
    for (uint32_t c = 0; c < hd; c += ENG_QK8_0) {
        size_t off = (size_t)(c / ENG_QK8_0) * ENG_Q8_0_BYTES;
        __m512 a0 = _mm512_mul_ps(_mm512_loadu_ps(r0->o + c), f0);
        __m512 b0 = _mm512_mul_ps(_mm512_loadu_ps(r0->o + c + 16), f0);
        __m512 a1 = _mm512_mul_ps(_mm512_loadu_ps(r1->o + c), f1);
        __m512 b1 = _mm512_mul_ps(_mm512_loadu_ps(r1->o + c + 16), f1);
        __m512 a2 = _mm512_mul_ps(_mm512_loadu_ps(r2->o + c), f2);
        __m512 b2 = _mm512_mul_ps(_mm512_loadu_ps(r2->o + c + 16), f2);
        __m512 a3 = _mm512_mul_ps(_mm512_loadu_ps(r3->o + c), f3);
        __m512 b3 = _mm512_mul_ps(_mm512_loadu_ps(r3->o + c + 16), f3);
        for (uint32_t j = 0; j < nj; j++) {
            const uint8_t *vb = vrow[j] + off;
            uint16_t h;
            memcpy(&h, vb, 2);
            __m512 dv = _mm512_set1_ps(_cvtsh_ss(h));
            __m512 v0 = _mm512_mul_ps(
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)(vb + 2)))),
                dv);
            __m512 v1 = _mm512_mul_ps(
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)(vb + 18)))),
                dv);
            __m512 w0 = _mm512_set1_ps(p0[j]), w1 = _mm512_set1_ps(p1[j]);
            __m512 w2 = _mm512_set1_ps(p2[j]), w3 = _mm512_set1_ps(p3[j]);
            a0 = _mm512_fmadd_ps(w0, v0, a0);
            b0 = _mm512_fmadd_ps(w0, v1, b0);
            a1 = _mm512_fmadd_ps(w1, v0, a1);
            b1 = _mm512_fmadd_ps(w1, v1, b1);
            a2 = _mm512_fmadd_ps(w2, v0, a2);
            b2 = _mm512_fmadd_ps(w2, v1, b2);
            a3 = _mm512_fmadd_ps(w3, v0, a3);
            b3 = _mm512_fmadd_ps(w3, v1, b3);
        }
        /* Stores in reverse: a row repeated past n_rows is row 0, stored last. */
        _mm512_storeu_ps(r3->o + c, a3);
        _mm512_storeu_ps(r3->o + c + 16, b3);
        _mm512_storeu_ps(r2->o + c, a2);
        _mm512_storeu_ps(r2->o + c + 16, b2);
        _mm512_storeu_ps(r1->o + c, a1);
        _mm512_storeu_ps(r1->o + c + 16, b1);
        _mm512_storeu_ps(r0->o + c, a0);
        _mm512_storeu_ps(r0->o + c + 16, b0);
    }
}

/* eng_kv_q8_0_quantize (kvpool.h) in vectors, with the same bytes: the same IEEE operations
 * on each element (|x| max, x * id, truncation and its exact remainder), only side by side. */
AVX512 void eng__avx512_q8_0_quantize(const float *x, uint32_t n, uint8_t *dst)
{
    const __m512 lim = _mm512_set1_ps(128.0f), half = _mm512_set1_ps(0.5f);
    for (uint32_t b = 0; b < n / ENG_QK8_0; b++, x += ENG_QK8_0, dst += ENG_Q8_0_BYTES) {
        __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
        /* NaN lanes count as 0, as the scalar loop's comparison skips them. */
        __m512 a0 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x0, x0, _CMP_ORD_Q), _mm512_abs_ps(x0));
        __m512 a1 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x1, x1, _CMP_ORD_Q), _mm512_abs_ps(x1));
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = eng_f32_to_f16(d);
        memcpy(dst, &dh, 2);
        __m512 idv = _mm512_set1_ps(id);
        __m128i q[2];
        for (int h = 0; h < 2; h++) {
            __m512 v = _mm512_mul_ps(h ? x1 : x0, idv);
            __mmask16 ok = _mm512_cmp_ps_mask(_mm512_abs_ps(v), lim, _CMP_LE_OQ); /* NaN: 0 */
            v = _mm512_maskz_mov_ps(ok, v);
            __m512i t = _mm512_cvttps_epi32(v);
            __m512 fr = _mm512_sub_ps(v, _mm512_cvtepi32_ps(t));
            __mmask16 up = _mm512_cmp_ps_mask(fr, half, _CMP_GE_OQ);
            __mmask16 dn =
                _mm512_cmp_ps_mask(fr, _mm512_sub_ps(_mm512_setzero_ps(), half), _CMP_LE_OQ);
            t = _mm512_mask_add_epi32(t, up, t, _mm512_set1_epi32(1));
            t = _mm512_mask_sub_epi32(t, dn, t, _mm512_set1_epi32(1));
            q[h] = _mm512_cvtepi32_epi8(t);
        }
        _mm_storeu_si128((void *)(dst + 2), q[0]);
        _mm_storeu_si128((void *)(dst + 18), q[1]);
    }
}

#endif
