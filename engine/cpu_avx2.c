/*
 * cpu_avx2.c — the AVX2 + FMA + F16C path of the CPU kernels (see cpu_simd.h): every x86-64 CPU
 * since Haswell and Zen 1. Each function carries the target attribute, so the file builds
 * without -march and the code runs only where eng__cpu_isa_runs(ENG_CPU_ISA_AVX2) said yes. On
 * other architectures the file is empty.
 *
 * Eight-float vectors and sixteen registers: the kernels keep at most eight accumulators live
 * (the AVX-512 versions keep sixteen of sixteen floats).
 */
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu_simd.h"
#include "gguf.h"
#include "half.h"
#include "pc_assert.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
/* 8 halves at p as 8 floats. */
#define HALF8(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))

AVX2 void eng__avx2_f16_to_f32(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_ps(dst + i, HALF8(src + i));
        _mm256_storeu_ps(dst + i + 8, HALF8(src + i + 8));
    }
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, HALF8(src + i));
    for (; i < n; i++)
        dst[i] = _cvtsh_ss(src[i]);
}

AVX2 void eng__avx2_f32_to_f16(const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

AVX2 void eng__avx2_f16_rows_to_f32(const uint16_t *src, size_t ss, float *dst, size_t ds,
                                    uint32_t rows, uint32_t n)
{
    for (uint32_t r = 0; r < rows; r++) {
        const uint16_t *s = src + r * ss;
        float *d = dst + r * ds;
        uint32_t i = 0;
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(d + i, HALF8(s + i));
        for (; i < n; i++)
            d[i] = _cvtsh_ss(s[i]);
    }
}

/* ---------------------------------------------------------------------------------------------
 * GEMV
 * ------------------------------------------------------------------------------------------- */

AVX2 static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Eight weights at k of row w (F16 or F32) as floats. */
#define WLOAD(f16, w, k)                                                                           \
    ((f16) ? HALF8((const uint16_t *)(w) + (k)) : _mm256_loadu_ps((const float *)(w) + (k)))

/* Eight weights at k (a multiple of 8) of a row of type t as floats: F32, F16 (F16C) or BF16 (the
 * 16 bits shifted into the high half of each lane: exact). t is a constant wherever this is
 * inlined. */
AVX2 static inline __attribute__((always_inline)) __m256 wload8(const uint32_t t, const void *w,
                                                                uint32_t k)
{
    switch (t) {
    case ENG_GGML_TYPE_F16:
        return HALF8((const uint16_t *)w + k);
    case ENG_GGML_TYPE_BF16:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(
                                  (const __m128i *)(const void *)((const uint16_t *)w + k))),
                              16));
    default:
        return _mm256_loadu_ps((const float *)w + k);
    }
}

/* Weight k of a row of type t (the scalar tails). */
AVX2 static inline float wload1(uint32_t t, const void *w, uint32_t k)
{
    switch (t) {
    case ENG_GGML_TYPE_F16:
        return _cvtsh_ss(((const uint16_t *)w)[k]);
    case ENG_GGML_TYPE_BF16:
        return eng_bf16_to_f32(((const uint16_t *)w)[k]);
    default:
        return ((const float *)w)[k];
    }
}

/* One weight row (F32, F16 or BF16) against one x row: two cache lines of weights per iteration
 * for 16-bit types (64 elements, eight conversions) into eight accumulators, so the loads of the
 * next lines are in flight while the FMAs of these retire; this streams at the machine's read
 * bandwidth on Zen 4 (bench engine --isa avx2 prints both). */
AVX2 static inline __attribute__((always_inline)) float dot1(const uint32_t t, const void *w,
                                                             const float *x, uint32_t K)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    uint32_t k = 0;
    for (; k + 64 <= K; k += 64) {
        a0 = _mm256_fmadd_ps(wload8(t, w, k), _mm256_loadu_ps(x + k), a0);
        a1 = _mm256_fmadd_ps(wload8(t, w, k + 8), _mm256_loadu_ps(x + k + 8), a1);
        a2 = _mm256_fmadd_ps(wload8(t, w, k + 16), _mm256_loadu_ps(x + k + 16), a2);
        a3 = _mm256_fmadd_ps(wload8(t, w, k + 24), _mm256_loadu_ps(x + k + 24), a3);
        a4 = _mm256_fmadd_ps(wload8(t, w, k + 32), _mm256_loadu_ps(x + k + 32), a4);
        a5 = _mm256_fmadd_ps(wload8(t, w, k + 40), _mm256_loadu_ps(x + k + 40), a5);
        a6 = _mm256_fmadd_ps(wload8(t, w, k + 48), _mm256_loadu_ps(x + k + 48), a6);
        a7 = _mm256_fmadd_ps(wload8(t, w, k + 56), _mm256_loadu_ps(x + k + 56), a7);
    }
    for (; k + 8 <= K; k += 8)
        a0 = _mm256_fmadd_ps(wload8(t, w, k), _mm256_loadu_ps(x + k), a0);
    a0 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a4), _mm256_add_ps(a1, a5)),
                       _mm256_add_ps(_mm256_add_ps(a2, a6), _mm256_add_ps(a3, a7)));
    float s = hsum8(a0);
    for (; k < K; k++)
        s += wload1(t, w, k) * x[k];
    return s;
}

/* One weight row of type t against R <= 4 rows of x (xg, stride K): eight weights converted
 * once, applied to every row; two steps of eight per iteration for eight accumulators. Rows past
 * R repeat row R - 1 (loads from L1) and are not stored. */
AVX2 static inline __attribute__((always_inline)) void
dot4(const uint32_t t, const void *w, const float *xg, uint32_t K, uint32_t R, float *s)
{
    const float *x0 = xg, *x1 = xg + (size_t)PC_MIN(1, R - 1) * K;
    const float *x2 = xg + (size_t)PC_MIN(2, R - 1) * K, *x3 = xg + (size_t)PC_MIN(3, R - 1) * K;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    uint32_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m256 w0 = wload8(t, w, k), w1 = wload8(t, w, k + 8);
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + k), a0);
        a1 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + k), a1);
        a2 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x2 + k), a2);
        a3 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x3 + k), a3);
        b0 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x0 + k + 8), b0);
        b1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x1 + k + 8), b1);
        b2 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x2 + k + 8), b2);
        b3 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x3 + k + 8), b3);
    }
    for (; k + 8 <= K; k += 8) {
        __m256 w0 = wload8(t, w, k);
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + k), a0);
        a1 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + k), a1);
        a2 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x2 + k), a2);
        a3 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x3 + k), a3);
    }
    float v[4] = {hsum8(_mm256_add_ps(a0, b0)), hsum8(_mm256_add_ps(a1, b1)),
                  hsum8(_mm256_add_ps(a2, b2)), hsum8(_mm256_add_ps(a3, b3))};
    const float *xr[4] = {x0, x1, x2, x3};
    for (uint32_t m = 0; m < R; m++) {
        for (uint32_t kk = k; kk < K; kk++)
            v[m] += wload1(t, w, kk) * xr[m][kk];
        s[m] = v[m];
    }
}

/* The GEMV over rows [n0, n1) for one weight type t (a constant after inlining). */
AVX2 static inline __attribute__((always_inline)) void gemv_t(const uint32_t t, const eng_gemv_t *g,
                                                              uint32_t n0, uint32_t n1)
{
    uint32_t K = g->K, M = g->M;
    size_t rb = eng__gemv_row_bytes(t, K);
    for (uint32_t n = n0; n < n1; n++) {
        const void *wr = (const char *)g->w + (size_t)n * rb;
        if (M == 1) {
            float s = dot1(t, wr, g->x, K);
            g->y[n] = g->accumulate ? g->y[n] + s : s;
            continue;
        }
        /* The weight row stays in L1 across the groups of x rows. */
        for (uint32_t m0 = 0; m0 < M; m0 += 4) {
            uint32_t mg = PC_MIN(4, M - m0);
            float s[4];
            dot4(t, wr, g->x + (size_t)m0 * K, K, mg, s);
            for (uint32_t m = 0; m < mg; m++) {
                float *yp = &g->y[(size_t)(m0 + m) * g->ldy + n];
                *yp = g->accumulate ? *yp + s[m] : s[m];
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Quantized rows: integer dot products of Q4_0 / Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K weight rows with
 * one activation row quantized once (Q8_0 for Q4_0, Q5_0 and Q5_1, Q8_K for the K-quants; the
 * block layouts are in
 * quant.h). Each weight byte is loaded once; its nibbles (and high bits) are widened to unsigned
 * bytes and multiplied by the signed activation bytes with VPMADDUBSW (pairs of products stay
 * within int16: at most 2 * 63 * 128), then by the sub-block's scale with VPMADDWD, summed in
 * int32 over the block and scaled into F32 once per block. The offsets of the formats (Q4_0's
 * -8, Q6_K's -32, the K-quants' mins) go through the activation block sums.
 * ------------------------------------------------------------------------------------------- */

#define LOAD256(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))

/* Q4_0 x Q8_0: per block, sum (q - 8) a = sum q a - 8 sum a, both from VPMADDUBSW. */
AVX2 static float dot_q4_0(const eng_block_q4_0_t *w, const eng_block_q8_0_t *x, uint32_t K)
{
    const __m256i lo4 = _mm256_set1_epi8(0x0f), eight = _mm256_set1_epi8(8);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (uint32_t b = 0; b < K / ENG_QK4_0; b++, w++, x++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)w->qs);
        __m256i q = _mm256_and_si256(
            _mm256_insertf128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1), lo4);
        __m256i a = LOAD256(x->qs);
        __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, a), _mm256_maddubs_epi16(eight, a));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(w->d) * _cvtsh_ss(x->d)),
                              _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc);
    }
    return hsum8(acc);
}

/* A Q5_0 / Q5_1 block's 32 levels (0..31) as bytes in element order: the nibbles of qs (low
 * ones elements 0-15, high ones 16-31) with bit j of qh as element j's fifth bit, spread to a
 * byte each as ggml's bytes_from_bits_32 does (each byte of the group of 8 that holds qh's byte
 * k, OR'd with every bit but its own set, is all ones exactly when its bit is). */
AVX2 static inline __m256i q5_levels(const uint8_t qh4[4], const uint8_t *qs)
{
    const __m256i lo4 = _mm256_set1_epi8(0x0f);
    uint32_t qh;
    memcpy(&qh, qh4, sizeof qh);
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)qs);
    __m256i q = _mm256_and_si256(
        _mm256_insertf128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1), lo4);
    __m256i bits = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)qh),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    bits = _mm256_cmpeq_epi8(_mm256_or_si256(bits, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                             _mm256_set1_epi64x(-1));
    return _mm256_or_si256(q, _mm256_and_si256(bits, _mm256_set1_epi8(0x10)));
}

/* Q5_0 x Q8_0: per block, sum (q - 16) a = sum q a - 16 sum a, both from VPMADDUBSW (pairs of
 * products at most 2 * 31 * 128). */
AVX2 static float dot_q5_0(const eng_block_q5_0_t *w, const eng_block_q8_0_t *x, uint32_t K)
{
    const __m256i sixteen = _mm256_set1_epi8(16), ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (uint32_t b = 0; b < K / ENG_QK4_0; b++, w++, x++) {
        __m256i q = q5_levels(w->qh, w->qs), a = LOAD256(x->qs);
        __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, a), _mm256_maddubs_epi16(sixteen, a));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(w->d) * _cvtsh_ss(x->d)),
                              _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc);
    }
    return hsum8(acc);
}

/* Q5_1 x Q8_0: per block d_w d_a sum q a + m_w d_a sum a (quant.h's eng_vec_dot_q5_1_q8_0), the
 * two sums from VPMADDUBSW, each term accumulated in its own vector. */
AVX2 static float dot_q5_1(const eng_block_q5_1_t *w, const eng_block_q8_0_t *x, uint32_t K)
{
    const __m256i one8 = _mm256_set1_epi8(1), ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (uint32_t b = 0; b < K / ENG_QK4_0; b++, w++, x++) {
        __m256i q = q5_levels(w->qh, w->qs), a = LOAD256(x->qs);
        __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), ones);
        __m256i sa = _mm256_madd_epi16(_mm256_maddubs_epi16(one8, a), ones);
        float da = _cvtsh_ss(x->d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(w->d) * da), _mm256_cvtepi32_ps(s), acc);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(w->m) * da), _mm256_cvtepi32_ps(sa), accm);
    }
    return hsum8(_mm256_add_ps(acc, accm));
}

/* Q4_K (hb false) or Q5_K (hb true) x Q8_K. The two blocks share their first fields (d, dmin,
 * scales); Q5_K's qh sits where Q4_K's qs begins. */
AVX2 static inline __attribute__((always_inline)) float
dot_q45_k(const bool hb, const void *wv, const eng_block_q8_k_t *x, uint32_t K)
{
    const __m256i lo4 = _mm256_set1_epi8(0x0f), b16 = _mm256_set1_epi8(0x10);
    const size_t wb = hb ? sizeof(eng_block_q5_k_t) : sizeof(eng_block_q4_k_t);
    const uint8_t *w = wv;
    __m256 acc = _mm256_setzero_ps(), accm = acc;
    for (uint32_t b = 0; b < K / ENG_QK_K; b++, w += wb, x++) {
        const eng_block_q4_k_t *w4 = (const eng_block_q4_k_t *)(const void *)w;
        uint8_t sm[16];
        eng__k4_unpack(w4->scales, sm);
        __m128i s8 = _mm_loadu_si128((const __m128i *)(const void *)sm), m8 = _mm_srli_si128(s8, 8);
        /* The mins' share: sum_j m_j (bsums[2j] + bsums[2j + 1]), each min taken twice. */
        __m256i mq =
            _mm256_madd_epi16(LOAD256(x->bsums), _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)));
        accm = _mm256_fmadd_ps(_mm256_set1_ps(x->d * _cvtsh_ss(w4->dmin)), _mm256_cvtepi32_ps(mq),
                               accm);
        __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(s8)); /* scale j: lane j */
        const uint8_t *qs = hb ? ((const eng_block_q5_k_t *)(const void *)w)->qs : w4->qs;
        const int8_t *a = x->qs;
        __m256i qh =
            hb ? LOAD256(((const eng_block_q5_k_t *)(const void *)w)->qh) : _mm256_setzero_si256();
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i v = LOAD256(qs + 32 * c);
            __m256i lo = _mm256_and_si256(v, lo4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
            if (hb) { /* bit 2c of qh[l] is element l's fifth bit, bit 2c + 1 element 32 + l's */
                __m256i m0 = _mm256_set1_epi8((char)(1 << (2 * c)));
                __m256i m1 = _mm256_set1_epi8((char)(2 << (2 * c)));
                lo = _mm256_or_si256(
                    lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, m0), m0), b16));
                hi = _mm256_or_si256(
                    hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, m1), m1), b16));
            }
            __m256i plo = _mm256_maddubs_epi16(lo, LOAD256(a + 64 * c));
            __m256i phi = _mm256_maddubs_epi16(hi, LOAD256(a + 64 * c + 32));
            /* Scale j broadcast to every int16 lane: bytes 2j, 2j + 1 of each 128-bit half. */
            __m256i s0 =
                _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(0x0100 + 0x0202 * 2 * c)));
            __m256i s1 = _mm256_shuffle_epi8(
                sc16, _mm256_set1_epi16((short)(0x0100 + 0x0202 * (2 * c + 1))));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(plo, s0));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(phi, s1));
        }
        acc =
            _mm256_fmadd_ps(_mm256_set1_ps(x->d * _cvtsh_ss(w4->d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum8(_mm256_sub_ps(acc, accm));
}

/* Q6_K x Q8_K: sum_j sc_j (sum q a - 32 bsum_j) over the sixteen sub-blocks of 16. */
AVX2 static float dot_q6_k(const eng_block_q6_k_t *w, const eng_block_q8_k_t *x, uint32_t K)
{
    const __m256i lo4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    __m256 acc = _mm256_setzero_ps();
    for (uint32_t b = 0; b < K / ENG_QK_K; b++, w++, x++) {
        const int8_t *sc = w->scales, *a = x->qs;
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)sc));
        __m256i off = _mm256_madd_epi16(LOAD256(x->bsums), sc16); /* sum_j sc_j bsum_j */
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w->ql + 64 * h, *qhp = w->qh + 32 * h;
            __m256i l0 = LOAD256(ql), l1 = LOAD256(ql + 32), qh = LOAD256(qhp);
            __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, lo4),
                                _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
                _mm256_or_si256(_mm256_and_si256(l1, lo4),
                                _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), lo4),
                                _mm256_and_si256(qh, m30)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), lo4),
                                _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30)),
            };
            for (int i = 0; i < 4; i++) { /* 32 elements: sub-blocks 8h + 2i and 8h + 2i + 1 */
                int j = 8 * h + 2 * i;
                __m256i s =
                    _mm256_insertf128_si256(_mm256_set1_epi16(sc[j]), _mm_set1_epi16(sc[j + 1]), 1);
                __m256i p = _mm256_maddubs_epi16(q[i], LOAD256(a + 128 * h + 32 * i));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
            }
        }
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(off, 5));
        acc =
            _mm256_fmadd_ps(_mm256_set1_ps(x->d * _cvtsh_ss(w->d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum8(acc);
}

/* Q8_0 x Q8_0 as ggml's: per block, sum w a exact in int32 (VPMADDUBSW on |w| and a with w's
 * sign: pairs of products stay within int16, at most 2 * 128 * 127), scaled by d_w d_a. */
AVX2 static float dot_q8_0(const eng_block_q8_0_t *w, const eng_block_q8_0_t *x, uint32_t K)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    uint32_t nb = K / ENG_QK8_0;
    for (uint32_t b = 0; b < nb; b++) {
        __m256i qw = LOAD256(w[b].qs), qa = LOAD256(x[b].qs);
        __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qa, qw));
        __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
        __m256 d = _mm256_set1_ps(_cvtsh_ss(w[b].d) * _cvtsh_ss(x[b].d));
        if (b % 2)
            acc1 = _mm256_fmadd_ps(d, s, acc1);
        else
            acc0 = _mm256_fmadd_ps(d, s, acc0);
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

AVX2 float eng__avx2_dot_q(uint32_t wtype, const void *w, const void *xq, uint32_t K)
{
    switch (wtype) {
    case ENG_GGML_TYPE_Q8_0:
        return dot_q8_0(w, xq, K);
    case ENG_GGML_TYPE_Q4_0:
        return dot_q4_0(w, xq, K);
    case ENG_GGML_TYPE_Q5_0:
        return dot_q5_0(w, xq, K);
    case ENG_GGML_TYPE_Q5_1:
        return dot_q5_1(w, xq, K);
    case ENG_GGML_TYPE_Q4_K:
        return dot_q45_k(false, w, xq, K);
    case ENG_GGML_TYPE_Q5_K:
        return dot_q45_k(true, w, xq, K);
    case ENG_GGML_TYPE_Q6_K:
        return dot_q6_k(w, xq, K);
    default:
        PC_ABORT("weight type %u has no integer dot product", wtype);
    }
}
#undef LOAD256

/* Activation quantization (quant.h), ggml-cpu's x86 arithmetic instruction for instruction: the
 * block's amax by VMAXPS (exact in any order), q by VROUNDPS (nearest, halves to even) and
 * VCVTPS2DQ, packed to bytes with signed saturation (|q| <= 127 already). */
AVX2 static inline __m256i round_to_i32(__m256 v, __m256 mul)
{
    return _mm256_cvtps_epi32(
        _mm256_round_ps(_mm256_mul_ps(v, mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* Four vectors of eight int32 (each in -128..127) to 32 bytes in order. */
AVX2 static inline __m256i pack_i8x32(__m256i i0, __m256i i1, __m256i i2, __m256i i3)
{
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

AVX2 static inline int hsum_i32x8(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

AVX2 static void act_q8_0(const float *x, eng_block_q8_0_t *y, size_t n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (size_t b = 0; b < n / ENG_QK8_0; b++, x += ENG_QK8_0) {
        __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        __m256 m =
            _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                          _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        y[b].d = (uint16_t)_cvtss_sh(amax / 127.0f, _MM_FROUND_TO_NEAREST_INT);
        __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
        _mm256_storeu_si256((__m256i *)(void *)y[b].qs,
                            pack_i8x32(round_to_i32(v0, id), round_to_i32(v1, id),
                                       round_to_i32(v2, id), round_to_i32(v3, id)));
    }
}

AVX2 static void act_q8_k(const float *x, eng_block_q8_k_t *y, size_t n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (size_t b = 0; b < n / ENG_QK_K; b++, x += ENG_QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < ENG_QK_K; j += 8)
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
        __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        /* max: the first element of magnitude amax, with its sign (quantize_row_q8_K_ref). */
        __m256 am = _mm256_set1_ps(amax);
        int j = 0, bits = 0;
        for (; j < ENG_QK_K; j += 8) {
            bits = _mm256_movemask_ps(
                _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), am, _CMP_EQ_OQ));
            if (bits != 0)
                break;
        }
        float iscale = -127.0f / x[j + __builtin_ctz((unsigned)bits)];
        __m256 is = _mm256_set1_ps(iscale);
        const __m256i top = _mm256_set1_epi32(127);
        for (int c = 0; c < ENG_QK_K; c += 32) {
            __m256i i0 = _mm256_min_epi32(round_to_i32(_mm256_loadu_ps(x + c), is), top);
            __m256i i1 = _mm256_min_epi32(round_to_i32(_mm256_loadu_ps(x + c + 8), is), top);
            __m256i i2 = _mm256_min_epi32(round_to_i32(_mm256_loadu_ps(x + c + 16), is), top);
            __m256i i3 = _mm256_min_epi32(round_to_i32(_mm256_loadu_ps(x + c + 24), is), top);
            _mm256_storeu_si256((__m256i *)(void *)(y[b].qs + c), pack_i8x32(i0, i1, i2, i3));
            y[b].bsums[c / 16] = (int16_t)hsum_i32x8(_mm256_add_epi32(i0, i1));
            y[b].bsums[c / 16 + 1] = (int16_t)hsum_i32x8(_mm256_add_epi32(i2, i3));
        }
        y[b].d = 1.0f / iscale;
    }
}

AVX2 void eng__avx2_quant_act(uint32_t type, const float *x, void *dst, size_t n)
{
    if (type == ENG_GGML_TYPE_Q8_K)
        act_q8_k(x, dst, n);
    else
        act_q8_0(x, dst, n);
}

AVX2 void eng__avx2_gemv(const eng_gemv_t *g, uint32_t n0, uint32_t n1)
{
    PC_ASSERT(g->M <= ENG_GEMV_MAX_M);
    switch (g->wtype) {
    case ENG_GGML_TYPE_Q8_0:
    case ENG_GGML_TYPE_Q4_0:
    case ENG_GGML_TYPE_Q5_0:
    case ENG_GGML_TYPE_Q5_1:
    case ENG_GGML_TYPE_Q4_K:
    case ENG_GGML_TYPE_Q5_K:
    case ENG_GGML_TYPE_Q6_K:
        eng__gemv_q(g, n0, n1, eng__avx2_dot_q);
        return;
    case ENG_GGML_TYPE_F16:
        gemv_t(ENG_GGML_TYPE_F16, g, n0, n1);
        return;
    case ENG_GGML_TYPE_BF16:
        gemv_t(ENG_GGML_TYPE_BF16, g, n0, n1);
        return;
    default:
        PC_ASSERT(g->wtype == ENG_GGML_TYPE_F32);
        gemv_t(ENG_GGML_TYPE_F32, g, n0, n1);
        return;
    }
}

/* ---------------------------------------------------------------------------------------------
 * GEMM (prefill): register tiles of dot products, llamafile's tinyBLAS layout. Both operands stay
 * row-major as stored ([M][K] activations, [N][K] weights), so nothing is packed or transposed:
 * a tile of RM rows of x by RN rows of w keeps RM x RN eight-lane accumulators over K, loads RM
 * vectors of x and converts RN vectors of weights per step of eight (F16 in registers, F16C), and
 * reduces each accumulator once at the end. With RM = 4, RN = 3 that is twelve FMAs for seven
 * loads in sixteen registers: the FMA units, not the loads, bound it.
 * ------------------------------------------------------------------------------------------- */

#define GEMM_RM 4
#define GEMM_RN 3

/* One tile: y[i][j] (+)= x[i] . w[j] for i < rm, j < rn. Inlined with constant rm, rn and f16,
 * so that the loops unroll and acc[][] lives in registers. */
AVX2 static inline __attribute__((always_inline)) void
gemm_tile(const int rm, const int rn, const bool f16, const void *w, size_t ldw, const float *x,
          size_t ldx, uint32_t K, float *y, size_t ldy, bool accumulate)
{
    const size_t es = f16 ? 2 : 4;
    __m256 acc[GEMM_RM][GEMM_RN];
#pragma GCC unroll 4
    for (int i = 0; i < rm; i++)
#pragma GCC unroll 3
        for (int j = 0; j < rn; j++)
            acc[i][j] = _mm256_setzero_ps();
    uint32_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 b[GEMM_RN];
#pragma GCC unroll 3
        for (int j = 0; j < rn; j++)
            b[j] = WLOAD(f16, (const char *)w + (size_t)j * ldw * es, k);
#pragma GCC unroll 4
        for (int i = 0; i < rm; i++) {
            __m256 a = _mm256_loadu_ps(x + (size_t)i * ldx + k);
#pragma GCC unroll 3
            for (int j = 0; j < rn; j++)
                acc[i][j] = _mm256_fmadd_ps(a, b[j], acc[i][j]);
        }
    }
    for (int i = 0; i < rm; i++) {
        const float *xi = x + (size_t)i * ldx;
        for (int j = 0; j < rn; j++) {
            float s = hsum8(acc[i][j]);
            for (uint32_t kk = k; kk < K; kk++) {
                size_t e = (size_t)j * ldw + kk;
                s += (f16 ? _cvtsh_ss(((const uint16_t *)w)[e]) : ((const float *)w)[e]) * xi[kk];
            }
            float *yp = y + (size_t)i * ldy + j;
            *yp = accumulate ? *yp + s : s;
        }
    }
}

/* The tile for any rm <= 4, rn <= 3: a switch to the constant instances. */
AVX2 static void gemm_tile_any(int rm, int rn, bool f16, const void *w, size_t ldw, const float *x,
                               size_t ldx, uint32_t K, float *y, size_t ldy, bool accumulate)
{
#define GEMM_CASE(RM, RN)                                                                          \
    case (RM)*4 + (RN):                                                                            \
        if (f16)                                                                                   \
            gemm_tile(RM, RN, true, w, ldw, x, ldx, K, y, ldy, accumulate);                        \
        else                                                                                       \
            gemm_tile(RM, RN, false, w, ldw, x, ldx, K, y, ldy, accumulate);                       \
        return;
    switch (rm * 4 + rn) {
        GEMM_CASE(4, 3)
        GEMM_CASE(4, 2)
        GEMM_CASE(4, 1)
        GEMM_CASE(3, 3)
        GEMM_CASE(3, 2)
        GEMM_CASE(3, 1)
        GEMM_CASE(2, 3)
        GEMM_CASE(2, 2)
        GEMM_CASE(2, 1)
        GEMM_CASE(1, 3)
        GEMM_CASE(1, 2)
        GEMM_CASE(1, 1)
    default:
        PC_ASSERT(0);
    }
#undef GEMM_CASE
}

AVX2 void eng__avx2_gemm(const eng_gemv_t *g, uint32_t n0, uint32_t n1)
{
    bool f16 = g->wtype == ENG_GGML_TYPE_F16;
    size_t es = f16 ? 2 : 4;
    uint32_t K = g->K, M = g->M;
    /* Rows of x in the outer loop: a group of four (16 KiB at K = 1024) stays in L1 while the
     * weight rows of [n0, n1) (sized by the caller to stay in L2) pass under it. */
    for (uint32_t m = 0; m < M; m += GEMM_RM) {
        int rm = (int)PC_MIN(GEMM_RM, M - m);
        const float *x = g->x + (size_t)m * K;
        float *y = g->y + (size_t)m * g->ldy;
        uint32_t n = n0;
        if (rm == GEMM_RM && f16)
            for (; n + GEMM_RN <= n1; n += GEMM_RN)
                gemm_tile(GEMM_RM, GEMM_RN, true, (const char *)g->w + (size_t)n * K * es, K, x, K,
                          K, y + n, g->ldy, g->accumulate);
        for (; n < n1; n += GEMM_RN)
            gemm_tile_any(rm, (int)PC_MIN(GEMM_RN, n1 - n), f16,
                          (const char *)g->w + (size_t)n * K * es, K, x, K, K, y + n, g->ldy,
                          g->accumulate);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Attention
 * ------------------------------------------------------------------------------------------- */

/* e^x for x in [-87, 88] (lanes below are clamped: callers mask them), relative error ~2e-7:
 * x = n ln2 + r, e^r by its degree-6 Taylor polynomial, 2^n built in the exponent bits. */
AVX2 static inline __m256 exp256(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    /* 2^n in two factors, so that n = 128 (x near 88.7) does not overflow the exponent. */
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i h = _mm256_srai_epi32(ni, 1);
    __m256 f1 =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, _mm256_set1_epi32(127)), 23));
    __m256 f2 = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
}

AVX2 static inline float hmax8(__m256 v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Each row's online-softmax step over the raw scores of a chunk in its p (finite in every
 * lane): m, l, corr, n_valid and the weights p (zero past the row's last visible key; all zero
 * with corr 1 for a row that sees none of the chunk). */
AVX2 static void softmax4(eng_attn_row_t *rows, uint32_t n_rows, uint32_t start, uint32_t n_keys)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (uint32_t r = 0; r < n_rows; r++) {
        eng_attn_row_t *row = &rows[r];
        if (row->pos < start) {
            row->corr = 1.0f;
            row->n_valid = 0;
            memset(row->p, 0, ENG_ATTN_CHUNK * sizeof(float));
            continue;
        }
        uint32_t n_valid = PC_MIN(n_keys, row->pos - start + 1);
        __m256 x[8], mk[8], vmax = ninf;
        for (uint32_t c = 0; c < 8; c++) {
            __m256i lane = _mm256_add_epi32(iota, _mm256_set1_epi32((int)(8 * c)));
            mk[c] = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)n_valid), lane));
            x[c] = _mm256_blendv_ps(ninf, _mm256_loadu_ps(row->p + 8 * c), mk[c]);
            vmax = _mm256_max_ps(vmax, x[c]);
        }
        float bmax = hmax8(vmax);
        float m_new = row->m > bmax ? row->m : bmax;
        __m256 mn = _mm256_set1_ps(m_new), sum = _mm256_setzero_ps();
        for (uint32_t c = 0; c < 8; c++) {
            __m256 pc = _mm256_and_ps(mk[c], exp256(_mm256_sub_ps(x[c], mn)));
            _mm256_storeu_ps(row->p + 8 * c, pc);
            sum = _mm256_add_ps(sum, pc);
        }
        row->corr = expf(row->m - m_new); /* 0 for the first chunk (m = -inf) */
        row->l = row->l * row->corr + hsum8(sum);
        row->m = m_new;
        row->n_valid = n_valid;
    }
}

AVX2 void eng__avx2_attn_scores4(const float *kt, uint32_t hd, eng_attn_row_t *rows,
                                 uint32_t n_rows, uint32_t start, uint32_t n_keys)
{
    const float *q0 = rows[0].q, *q1 = rows[PC_MIN(1, n_rows - 1)].q;
    const float *q2 = rows[PC_MIN(2, n_rows - 1)].q, *q3 = rows[PC_MIN(3, n_rows - 1)].q;
    /* Raw scores into each row's p, sixteen keys at a time (eight accumulators). Rows past n_rows
     * repeat row 0's products but store into row 0 first: their stores come before row 0's. */
    for (uint32_t kb = 0; kb < ENG_ATTN_CHUNK; kb += 16) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (uint32_t d = 0; d < hd; d++) {
            const float *kd = kt + (size_t)d * ENG_ATTN_CHUNK + kb;
            __m256 k0 = _mm256_loadu_ps(kd), k1 = _mm256_loadu_ps(kd + 8);
            __m256 x = _mm256_broadcast_ss(q0 + d);
            a0 = _mm256_fmadd_ps(x, k0, a0);
            b0 = _mm256_fmadd_ps(x, k1, b0);
            x = _mm256_broadcast_ss(q1 + d);
            a1 = _mm256_fmadd_ps(x, k0, a1);
            b1 = _mm256_fmadd_ps(x, k1, b1);
            x = _mm256_broadcast_ss(q2 + d);
            a2 = _mm256_fmadd_ps(x, k0, a2);
            b2 = _mm256_fmadd_ps(x, k1, b2);
            x = _mm256_broadcast_ss(q3 + d);
            a3 = _mm256_fmadd_ps(x, k0, a3);
            b3 = _mm256_fmadd_ps(x, k1, b3);
        }
        __m256 av[4] = {a0, a1, a2, a3}, bv[4] = {b0, b1, b2, b3};
        for (uint32_t r = n_rows; r-- > 0;) {
            _mm256_storeu_ps(rows[r].p + kb, av[r]);
            _mm256_storeu_ps(rows[r].p + kb + 8, bv[r]);
        }
    }
    softmax4(rows, n_rows, start, n_keys);
}

AVX2 void eng__avx2_attn_values4(const float *vb, uint32_t hd, eng_attn_row_t *rows,
                                 uint32_t n_rows)
{
    uint32_t nj = 0;
    for (uint32_t r = 0; r < n_rows; r++)
        nj = PC_MAX(nj, rows[r].n_valid);
    if (nj == 0)
        return; /* corr is 1 for every row: nothing changes */
    eng_attn_row_t *r0 = &rows[0], *r1 = &rows[PC_MIN(1, n_rows - 1)];
    eng_attn_row_t *r2 = &rows[PC_MIN(2, n_rows - 1)], *r3 = &rows[PC_MIN(3, n_rows - 1)];
    const float *p0 = r0->p, *p1 = r1->p, *p2 = r2->p, *p3 = r3->p;
    __m256 f0 = _mm256_set1_ps(r0->corr), f1 = _mm256_set1_ps(r1->corr);
    __m256 f2 = _mm256_set1_ps(r2->corr), f3 = _mm256_set1_ps(r3->corr);
    for (uint32_t c = 0; c < hd; c += 16) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(r0->o + c), f0);
        __m256 b0 = _mm256_mul_ps(_mm256_loadu_ps(r0->o + c + 8), f0);
        __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(r1->o + c), f1);
        __m256 b1 = _mm256_mul_ps(_mm256_loadu_ps(r1->o + c + 8), f1);
        __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(r2->o + c), f2);
        __m256 b2 = _mm256_mul_ps(_mm256_loadu_ps(r2->o + c + 8), f2);
        __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(r3->o + c), f3);
        __m256 b3 = _mm256_mul_ps(_mm256_loadu_ps(r3->o + c + 8), f3);
        for (uint32_t j = 0; j < nj; j++) {
            const float *vj = vb + (size_t)j * hd + c;
            __m256 v0 = _mm256_loadu_ps(vj), v1 = _mm256_loadu_ps(vj + 8);
            __m256 w = _mm256_broadcast_ss(p0 + j);
            a0 = _mm256_fmadd_ps(w, v0, a0);
            b0 = _mm256_fmadd_ps(w, v1, b0);
            w = _mm256_broadcast_ss(p1 + j);
            a1 = _mm256_fmadd_ps(w, v0, a1);
            b1 = _mm256_fmadd_ps(w, v1, b1);
            w = _mm256_broadcast_ss(p2 + j);
            a2 = _mm256_fmadd_ps(w, v0, a2);
            b2 = _mm256_fmadd_ps(w, v1, b2);
            w = _mm256_broadcast_ss(p3 + j);
            a3 = _mm256_fmadd_ps(w, v0, a3);
            b3 = _mm256_fmadd_ps(w, v1, b3);
        }
        /* Stores in reverse: a row repeated past n_rows is row 0, stored last. */
        _mm256_storeu_ps(r3->o + c, a3);
        _mm256_storeu_ps(r3->o + c + 8, b3);
        _mm256_storeu_ps(r2->o + c, a2);
        _mm256_storeu_ps(r2->o + c + 8, b2);
        _mm256_storeu_ps(r1->o + c, a1);
        _mm256_storeu_ps(r1->o + c + 8, b1);
        _mm256_storeu_ps(r0->o + c, a0);
        _mm256_storeu_ps(r0->o + c + 8, b0);
    }
}

/* q8_0 KV (cpu_simd.h). A block's 32 quants are one 256-bit vector: the product with the query's
 * is ggml's sign trick (|k| as unsigned bytes times q with k's sign, VPMADDUBSW, then pairs summed
 * to int32 by VPMADDWD), exact since |q|, |k| <= 127; the int32 lanes are scaled by d_q d_k in
 * F32. Four rows share each key's loads; the four rows' lanes of a key are summed together by
 * three horizontal adds. */
AVX2 void eng__avx2_attn_q8_dots4(const uint8_t *const *krow, uint32_t nb, eng_attn_row_t *rows,
                                  uint32_t n_rows, uint32_t n_keys)
{
    enum { NB_MAX = 32 };
    PC_ASSERT(nb >= 1 && nb <= NB_MAX && n_rows >= 1 && n_rows <= 4);
    const uint8_t *qr[4];
    float dq[4][NB_MAX];
    for (uint32_t r = 0; r < 4; r++) {
        qr[r] = rows[PC_MIN(r, n_rows - 1)].qq;
        for (uint32_t b = 0; b < nb; b++) {
            uint16_t h;
            memcpy(&h, qr[r] + (size_t)b * ENG_Q8_0_BYTES, 2);
            dq[r][b] = _cvtsh_ss(h);
        }
    }
    const __m256i ones = _mm256_set1_epi16(1);
    for (uint32_t j = 0; j < n_keys; j++) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const uint8_t *kr = krow[j];
        for (uint32_t b = 0; b < nb; b++) {
            const uint8_t *kb = kr + (size_t)b * ENG_Q8_0_BYTES;
            uint16_t h;
            memcpy(&h, kb, 2);
            float dk = _cvtsh_ss(h);
            __m256i k = _mm256_loadu_si256((const void *)(kb + 2));
            __m256i ak = _mm256_sign_epi8(k, k);
#define Q8_ROW(r, acc)                                                                             \
    do {                                                                                           \
        __m256i q = _mm256_loadu_si256((const void *)(qr[r] + (size_t)b * ENG_Q8_0_BYTES + 2));    \
        __m256i p16 = _mm256_maddubs_epi16(ak, _mm256_sign_epi8(q, k));                            \
        __m256 pf = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));                              \
        acc = _mm256_fmadd_ps(pf, _mm256_set1_ps(dk * dq[r][b]), acc);                             \
    } while (0)
            Q8_ROW(0, a0);
            Q8_ROW(1, a1);
            Q8_ROW(2, a2);
            Q8_ROW(3, a3);
#undef Q8_ROW
        }
        /* [a0 a1 a2 a3] lanes summed: one score per row. */
        __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        __m128 sc = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        float sv[4];
        _mm_storeu_ps(sv, sc);
        for (uint32_t r = 0; r < n_rows; r++)
            rows[r].p[j] = sv[r];
    }
    for (uint32_t r = 0; r < n_rows; r++)
        for (uint32_t j = n_keys; j < ENG_ATTN_CHUNK; j++)
            rows[r].p[j] = 0;
}

AVX2 void eng__avx2_attn_q8_scores4(const uint8_t *const *krow, uint32_t nb, eng_attn_row_t *rows,
                                    uint32_t n_rows, uint32_t start, uint32_t n_keys)
{
    eng__avx2_attn_q8_dots4(krow, nb, rows, n_rows, n_keys);
    softmax4(rows, n_rows, start, n_keys);
}

/* Sixteen int8 quants at p as eight + eight F32 lanes times d. */
#define Q8_TO_PS(lo, hi, p, dv)                                                                    \
    do {                                                                                           \
        __m128i qv = _mm_loadu_si128((const void *)(p));                                           \
        lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(qv)), dv);                      \
        hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(qv, 8))), dv);   \
    } while (0)

AVX2 void eng__avx2_attn_q8_values4(const uint8_t *const *vrow, uint32_t hd, eng_attn_row_t *rows,
                                    uint32_t n_rows)
{
    uint32_t nj = 0;
    for (uint32_t r = 0; r < n_rows; r++)
        nj = PC_MAX(nj, rows[r].n_valid);
    if (nj == 0)
        return; /* corr is 1 for every row: nothing changes */
    eng_attn_row_t *r0 = &rows[0], *r1 = &rows[PC_MIN(1, n_rows - 1)];
    eng_attn_row_t *r2 = &rows[PC_MIN(2, n_rows - 1)], *r3 = &rows[PC_MIN(3, n_rows - 1)];
    const float *p0 = r0->p, *p1 = r1->p, *p2 = r2->p, *p3 = r3->p;
    __m256 f0 = _mm256_set1_ps(r0->corr), f1 = _mm256_set1_ps(r1->corr);
    __m256 f2 = _mm256_set1_ps(r2->corr), f3 = _mm256_set1_ps(r3->corr);
    for (uint32_t c = 0; c < hd; c += 16) {
        size_t off = (size_t)(c / ENG_QK8_0) * ENG_Q8_0_BYTES; /* the q8_0 block of column c */
        size_t qoff = off + 2 + c % ENG_QK8_0;
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(r0->o + c), f0);
        __m256 b0 = _mm256_mul_ps(_mm256_loadu_ps(r0->o + c + 8), f0);
        __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(r1->o + c), f1);
        __m256 b1 = _mm256_mul_ps(_mm256_loadu_ps(r1->o + c + 8), f1);
        __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(r2->o + c), f2);
        __m256 b2 = _mm256_mul_ps(_mm256_loadu_ps(r2->o + c + 8), f2);
        __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(r3->o + c), f3);
        __m256 b3 = _mm256_mul_ps(_mm256_loadu_ps(r3->o + c + 8), f3);
        for (uint32_t j = 0; j < nj; j++) {
            uint16_t h;
            memcpy(&h, vrow[j] + off, 2);
            __m256 v0, v1;
            Q8_TO_PS(v0, v1, vrow[j] + qoff, _mm256_set1_ps(_cvtsh_ss(h)));
            __m256 w = _mm256_broadcast_ss(p0 + j);
            a0 = _mm256_fmadd_ps(w, v0, a0);
            b0 = _mm256_fmadd_ps(w, v1, b0);
            w = _mm256_broadcast_ss(p1 + j);
            a1 = _mm256_fmadd_ps(w, v0, a1);
            b1 = _mm256_fmadd_ps(w, v1, b1);
            w = _mm256_broadcast_ss(p2 + j);
            a2 = _mm256_fmadd_ps(w, v0, a2);
            b2 = _mm256_fmadd_ps(w, v1, b2);
            w = _mm256_broadcast_ss(p3 + j);
            a3 = _mm256_fmadd_ps(w, v0, a3);
            b3 = _mm256_fmadd_ps(w, v1, b3);
        }
        /* Stores in reverse: a row repeated past n_rows is row 0, stored last. */
        _mm256_storeu_ps(r3->o + c, a3);
        _mm256_storeu_ps(r3->o + c + 8, b3);
        _mm256_storeu_ps(r2->o + c, a2);
        _mm256_storeu_ps(r2->o + c + 8, b2);
        _mm256_storeu_ps(r1->o + c, a1);
        _mm256_storeu_ps(r1->o + c + 8, b1);
        _mm256_storeu_ps(r0->o + c, a0);
        _mm256_storeu_ps(r0->o + c + 8, b0);
    }
}
#undef Q8_TO_PS

/* ---------------------------------------------------------------------------------------------
 * Element-wise
 * ------------------------------------------------------------------------------------------- */

AVX2 void eng__avx2_rmsnorm(const float *x, const float *w, float *y, uint32_t n, float eps)
{
    /* As ggml's rms_norm: each square rounded to F32, summed in double, the mean rounded to F32
     * (the double sums' order changes them by ~1e-16, which the F32 mean almost never sees). */
    __m256d a0 = _mm256_setzero_pd(), a1 = a0;
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i), sq = _mm256_mul_ps(v, v);
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
        a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
    }
    __m256d a = _mm256_add_pd(a0, a1);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    double ss = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    for (; i < n; i++) {
        float sq = x[i] * x[i];
        ss += sq;
    }
    float mean = (float)(ss / n);
    float scale = 1.0f / sqrtf(mean + eps);
    __m256 sv = _mm256_set1_ps(scale);
    i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sv),
                                              _mm256_loadu_ps(w + i)));
    for (; i < n; i++)
        y[i] = x[i] * scale * w[i];
}

/* e^x as ggml's AVX2 ggml_v_expf (llama.cpp's CPU backend on AVX2 CPUs; after ARM's optimized
 * routines: at most 1.5 ulp off, +inf above 88.38, 0 below -103.97), operation for operation, so
 * that the SwiGLU products llama.cpp quantizes are the same floats. */
AVX2 static inline __m256 ggml_expf256(__m256 x)
{
    const __m256 r = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
    const __m256 n = _mm256_sub_ps(z, r);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k =
        _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1))));
    const __m256i c = _mm256_castps_si256(
        _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), n), _mm256_set1_ps(126), _CMP_GT_OQ));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
            _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    if (!_mm256_movemask_ps(_mm256_castsi256_ps(c)))
        return _mm256_fmadd_ps(j, k, k);
    const __m256i g =
        _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                         _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256i d = _mm256_castps_si256(
        _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), n), _mm256_set1_ps(192), _CMP_GT_OQ));
    return _mm256_or_ps(
        _mm256_and_ps(_mm256_castsi256_ps(d), _mm256_mul_ps(s1, s1)),
        _mm256_andnot_ps(
            _mm256_castsi256_ps(d),
            _mm256_or_ps(_mm256_and_ps(_mm256_castsi256_ps(c),
                                       _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                         _mm256_andnot_ps(_mm256_castsi256_ps(c), _mm256_fmadd_ps(k, j, k)))));
}

AVX2 void eng__avx2_swiglu(float *g, const float *u, size_t n)
{
    size_t j = 0;
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; j + 8 <= n; j += 8) {
        __m256 gv = _mm256_loadu_ps(g + j);
        /* silu(g) = g / (1 + e^-g), as ggml_vec_swiglu_f32 computes it. */
        __m256 e = ggml_expf256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
        _mm256_storeu_ps(g + j, _mm256_mul_ps(s, _mm256_loadu_ps(u + j)));
    }
    for (; j < n; j++) {
        float gv = g[j];
        g[j] = gv / (1.0f + expf(-gv)) * u[j];
    }
}

AVX2 void eng__avx2_rope(float *x, const float *cs, const float *sn, uint32_t rope_dim, bool neox)
{
    uint32_t half = rope_dim / 2, i = 0;
    if (neox) {
        float *xa = x, *xb = x + half;
        for (; i + 8 <= half; i += 8) {
            __m256 x0 = _mm256_loadu_ps(xa + i), x1 = _mm256_loadu_ps(xb + i);
            __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_loadu_ps(sn + i);
            _mm256_storeu_ps(xa + i, _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s)));
            _mm256_storeu_ps(xb + i, _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c)));
        }
        for (; i < half; i++) {
            float x0 = xa[i], x1 = xb[i];
            xa[i] = x0 * cs[i] - x1 * sn[i];
            xb[i] = x0 * sn[i] + x1 * cs[i];
        }
        return;
    }
    /* Interleaved pairs: four pairs per vector, (c, c) and (-s, s) per pair, x swapped in pairs. */
    const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    const __m256 sign = _mm256_setr_ps(-1, 1, -1, 1, -1, 1, -1, 1);
    for (; i + 4 <= half; i += 4) {
        __m256 v = _mm256_loadu_ps(x + 2 * i);
        __m256 c = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(cs + i)), dup);
        __m256 s = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sn + i)), dup);
        __m256 sw = _mm256_permute_ps(v, 0xb1); /* (x1, x0) per pair */
        _mm256_storeu_ps(x + 2 * i,
                         _mm256_fmadd_ps(v, c, _mm256_mul_ps(sw, _mm256_mul_ps(s, sign))));
    }
    for (; i < half; i++) {
        float x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = x0 * cs[i] - x1 * sn[i];
        x[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
    }
}

#endif
