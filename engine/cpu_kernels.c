/*
 * cpu_kernels.c — half-precision row conversion, matrix products and paged attention for the CPU
 * backend (see cpu.h and cpu_kernels.h).
 *
 * Every kernel has a portable C path; the AVX-512 paths are compiled with target attributes
 * (the build does not assume -march) and chosen at run time.
 */
#include "cpu_kernels.h"

#include <cblas.h>
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kvpool.h"
#include "pc_alloc.h"
#include "pc_assert.h"

#define AVX512 __attribute__((target("avx512f,f16c,fma")))
/* 16 halves at p as 16 floats. */
#define HALF16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(p)))

/* CPU features from cpuid (gcc's and clang's __builtin_cpu_supports disagree on the feature
 * names, and clang 14 knows neither "f16c" nor "avx512bf16"). AVX-512 also needs the OS to save
 * the opmask and ZMM state: XCR0 bits 1, 2 (SSE, AVX) and 5, 6, 7 (opmask, ZMM halves). */
static unsigned cpu_features(void)
{
    enum { F_AVX512 = 1, F_BF16 = 2 };
    unsigned a, b, c, d, f = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    bool fma = c & (1u << 12), f16c = c & (1u << 29), osxsave = c & (1u << 27);
    if (!fma || !f16c || !osxsave)
        return 0;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 0xe6) != 0xe6 || __get_cpuid_max(0, NULL) < 7)
        return 0;
    __cpuid_count(7, 0, a, b, c, d);
    if (b & (1u << 16)) /* AVX512F */
        f |= F_AVX512;
    __cpuid_count(7, 1, a, b, c, d);
    if ((f & F_AVX512) && (a & (1u << 5))) /* AVX512_BF16 */
        f |= F_BF16;
    return f;
}

bool eng__cpu_has_avx512(void)
{
    static int cached = -1; /* racing threads compute the same value */
    if (cached < 0)
        cached = (cpu_features() & 1) != 0;
    return cached;
}

/* ---------------------------------------------------------------------------------------------
 * Half precision
 * ------------------------------------------------------------------------------------------- */

AVX512 static void f16_to_f32_avx512(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(src + i))));
    for (; i < n; i++)
        dst[i] = _cvtsh_ss(src[i]);
}

/* rows x n halves (row strides ss and ds) to F32: the K of a KV block, one short row per head
 * dimension, converted without a call per row. */
AVX512 static void f16_rows_to_f32_avx512(const uint16_t *src, size_t ss, float *dst, size_t ds,
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

AVX512 static void f32_to_f16_avx512(const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((void *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

void eng__f16_to_f32_row(const uint16_t *src, float *dst, size_t n, bool simd)
{
    if (simd && eng__cpu_has_avx512()) {
        f16_to_f32_avx512(src, dst, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        dst[i] = eng_f16_to_f32(src[i]);
}

void eng__f32_to_f16_row(const float *src, uint16_t *dst, size_t n, bool simd)
{
    if (simd && eng__cpu_has_avx512()) {
        f32_to_f16_avx512(src, dst, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        dst[i] = eng_f32_to_f16(src[i]);
}

/* ---------------------------------------------------------------------------------------------
 * Matrix products
 * ------------------------------------------------------------------------------------------- */

/* Below GEMV_F16_MAX_ROWS rows of x the BF16 GEMM is not used (a batch of decode rows keeps
 * the weights' own precision, and N sequences decoded together match each run alone as they
 * did before BF16). Below GEMV_F16_MAX_ROWS rows, F16
 * weights are multiplied directly, GEMV-like: one pass over the weights, each weight row
 * converted once (in registers) and applied to the rows of x in groups of GEMV_MAX_ROWS; from
 * it on, they are converted to F32 tiles for sgemm, whose cost the rows then amortize. A batch
 * of decode tokens (one row per running sequence) stays on the direct path. */
#define GEMV_MAX_ROWS 8
#define GEMV_F16_MAX_ROWS 32
#define GEMV_TILE 64

/* ---------------------------------------------------------------------------------------------
 * BF16 GEMM
 * ------------------------------------------------------------------------------------------- */

#define AVX512BF16 __attribute__((target("avx512f,avx512bf16,f16c,fma")))

bool eng__cpu_has_bf16(void)
{
    static int cached = -1;
    if (cached < 0)
        cached = (cpu_features() & 2) != 0;
    return cached;
}

static uint32_t bf16_panels(uint32_t n_out)
{
    return ((n_out + 31) / 32) * 2;
}

size_t eng__bf16_packed_elems(uint32_t n_in, uint32_t n_out)
{
    return (size_t)bf16_panels(n_out) * ((n_in + 1) / 2) * 32;
}

void eng__bf16_pack(const eng_weight_t *w, uint16_t *dst)
{
    uint32_t kp = (w->n_in + 1) / 2;
    float *row = pc_xmalloc(((size_t)w->n_in + 1) * sizeof *row); /* load time: dies on OOM */
    memset(dst, 0, eng__bf16_packed_elems(w->n_in, w->n_out) * sizeof *dst);
    for (uint32_t n = 0; n < w->n_out; n++) {
        eng_weight_row_f32(w, n, row);
        row[w->n_in] = 0;
        uint16_t *panel = dst + (size_t)(n / 16) * kp * 32;
        for (uint32_t j = 0; j < kp; j++) {
            panel[(size_t)j * 32 + (n % 16) * 2] = eng_f32_to_bf16(row[2 * j]);
            panel[(size_t)j * 32 + (n % 16) * 2 + 1] = eng_f32_to_bf16(row[2 * j + 1]);
        }
    }
    pc_free(row);
}

/* x[M][K] -> BF16 rows of kp pairs (K rounded up to even, zero padded). */
AVX512BF16 static void to_bf16_rows(const float *x, uint32_t M, uint32_t K, uint16_t *dst)
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

/* C[M][32 columns of panel pair pp] (+)= A . B for an 8-row block (rows past M repeat the last
 * one and are not stored). */
AVX512BF16 static void gemm_bf16_block(const uint32_t *a /* [M][kp] pairs */, uint32_t M,
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

typedef struct matmul_ctx {
    const float *x;
    uint32_t M, K, N;
    const eng_weight_t *w;
    float *y;
    bool accumulate;
    float *const *tmp;
    const uint16_t *a_bf16; /* x as BF16 rows, when the BF16 path runs */
    bool simd;
    uint32_t tile; /* output columns per task */
} matmul_ctx_t;

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
 * threads: this one-row-at-a-time loop streams at the machine's read bandwidth (`kvgw bench
 * engine` prints both); software prefetch (T0/T1/T2, 1-16 KiB ahead, with 4 KiB
 * and with 2 MiB pages) and four interleaved weight rows were all slower or no faster, since the
 * hardware prefetcher follows a single stream per thread best. */
AVX512 static void gemv_f16_avx512(const matmul_ctx_t *c, uint32_t n0, uint32_t n1)
{
    const uint16_t *w = c->w->data;
    const float *x = c->x;
    uint32_t K = c->K, M = c->M, K16 = K & ~15u;
    uint32_t n = n0;
    if (M == 1) {
        for (; n < n1; n++) {
            const uint16_t *wr = w + (size_t)n * K;
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
        for (uint32_t m0 = 0; m0 < M; m0 += GEMV_MAX_ROWS) {
            uint32_t mg = PC_MIN(GEMV_MAX_ROWS, M - m0);
            const float *xg = x + (size_t)m0 * K;
            float s[GEMV_MAX_ROWS];
            if (mg <= 4)
                gemv_f16_rows4(wr, xg, K, K16, mg, s);
            else
                gemv_f16_rows8(wr, xg, K, K16, mg, s);
            for (uint32_t m = 0; m < mg; m++) {
                float *yp = &c->y[(size_t)(m0 + m) * c->N + n];
                *yp = c->accumulate ? *yp + s[m] : s[m];
            }
        }
    }
}

static void gemv_f16_scalar(const matmul_ctx_t *c, uint32_t n0, uint32_t n1, float *tmp)
{
    for (uint32_t n = n0; n < n1; n++) {
        eng_weight_row_f32(c->w, n, tmp);
        for (uint32_t m = 0; m < c->M; m++) {
            const float *xr = c->x + (size_t)m * c->K;
            float s = 0;
            for (uint32_t k = 0; k < c->K; k++)
                s += tmp[k] * xr[k];
            float *yp = &c->y[(size_t)m * c->N + n];
            *yp = c->accumulate ? *yp + s : s;
        }
    }
}

static void matmul_task(void *ctx, uint32_t task, uint32_t thread)
{
    const matmul_ctx_t *c = ctx;
    uint32_t n0 = task * c->tile;
    uint32_t n1 = PC_MIN(c->N, n0 + c->tile);
    if (n0 >= n1)
        return;
    float beta = c->accumulate ? 1.0f : 0.0f;
    if (c->a_bf16 != NULL) {
        /* Tiles are whole panel pairs: n0 is a multiple of 32. */
        uint32_t kp = (c->K + 1) / 2;
        for (uint32_t n = n0; n < n1; n += 32) {
            const uint16_t *b0 = c->w->bf16 + (size_t)(n / 16) * kp * 32;
            for (uint32_t m0 = 0; m0 < c->M; m0 += 8)
                gemm_bf16_block((const uint32_t *)c->a_bf16, c->M, m0, kp, b0, b0 + (size_t)kp * 32,
                                c->y, c->N, n, PC_MIN(32, n1 - n), c->accumulate);
        }
        return;
    }
    if (c->w->type == ENG_GGML_TYPE_F32) {
        const float *wp = (const float *)c->w->data + (size_t)n0 * c->K;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)c->M, (int)(n1 - n0), (int)c->K,
                    1.0f, c->x, (int)c->K, wp, (int)c->K, beta, c->y + n0, (int)c->N);
        return;
    }
    if (c->M < GEMV_F16_MAX_ROWS) {
        if (c->simd)
            gemv_f16_avx512(c, n0, n1);
        else
            gemv_f16_scalar(c, n0, n1, c->tmp[thread]);
        return;
    }
    float *t = c->tmp[thread];
    const uint16_t *wp = (const uint16_t *)c->w->data + (size_t)n0 * c->K;
    eng__f16_to_f32_row(wp, t, (size_t)(n1 - n0) * c->K, c->simd);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)c->M, (int)(n1 - n0), (int)c->K, 1.0f,
                c->x, (int)c->K, t, (int)c->K, beta, c->y + n0, (int)c->N);
}

/* Sets up c for y = x . w^T: the path, and the output columns per task. */
static void matmul_setup(matmul_ctx_t *c, uint32_t n_threads, const float *x, uint32_t M,
                         const eng_weight_t *w, float *y, bool accumulate, float *const *tmp,
                         const uint16_t *a_bf16, bool simd)
{
    *c = (matmul_ctx_t){.x = x,
                        .M = M,
                        .K = w->n_in,
                        .N = w->n_out,
                        .w = w,
                        .y = y,
                        .accumulate = accumulate,
                        .tmp = tmp,
                        .simd = simd};
    if (a_bf16 != NULL && w->bf16 != NULL) {
        c->a_bf16 = a_bf16;
        c->tile = 128;
    } else if (w->type == ENG_GGML_TYPE_F32) {
        /* One contiguous slice per thread (rounded to 16 columns) keeps sgemm's blocks big;
         * small products run on the caller alone. */
        uint64_t flops = (uint64_t)M * c->N * c->K;
        uint32_t parts = flops < (1u << 18) ? 1 : n_threads;
        c->tile = ((c->N + parts - 1) / parts + 15) & ~15u;
    } else {
        c->tile = M < GEMV_F16_MAX_ROWS ? GEMV_TILE : ENG_CPU_WTILE;
    }
    if (c->tile == 0)
        c->tile = 16;
}

/* Several products over one pool run: task t belongs to the first product whose task range
 * holds it. One run instead of several saves a synchronization per product and lets the
 * threads that finish one product's last tiles go on with the next product's. */
typedef struct matmul_multi {
    matmul_ctx_t c[ENG_MATMUL_MAX];
    uint32_t task0[ENG_MATMUL_MAX + 1];
    uint32_t n;
} matmul_multi_t;

static void matmul_multi_task(void *ctx, uint32_t task, uint32_t thread)
{
    const matmul_multi_t *mm = ctx;
    uint32_t i = 0;
    while (task >= mm->task0[i + 1])
        i++;
    matmul_task((void *)&mm->c[i], task - mm->task0[i], thread);
}

void eng__matmul_n(eng_pool_t *pool, const float *x, uint32_t M, const eng_weight_t *const *w,
                   float *const *y, uint32_t n, bool accumulate, float *const *tmp,
                   uint16_t *a_bf16, bool simd)
{
    PC_ASSERT(n >= 1 && n <= ENG_MATMUL_MAX);
    simd = simd && eng__cpu_has_avx512();
    bool bf16 = a_bf16 != NULL && M >= GEMV_F16_MAX_ROWS && simd && eng__cpu_has_bf16();
    bool x_bf16 = false;
    matmul_multi_t mm = {.n = n};
    for (uint32_t i = 0; i < n; i++) {
        bool use_bf16 = bf16 && w[i]->bf16 != NULL;
        if (use_bf16 && !x_bf16) { /* x is the same for every product: convert it once */
            to_bf16_rows(x, M, w[i]->n_in, a_bf16);
            x_bf16 = true;
        }
        matmul_setup(&mm.c[i], eng__pool_n_threads(pool), x, M, w[i], y[i], accumulate, tmp,
                     use_bf16 ? a_bf16 : NULL, simd);
        mm.task0[i + 1] = mm.task0[i] + (mm.c[i].N + mm.c[i].tile - 1) / mm.c[i].tile;
    }
    if (n == 1)
        eng__pool_run(pool, matmul_task, &mm.c[0], mm.task0[1]);
    else
        eng__pool_run(pool, matmul_multi_task, &mm, mm.task0[n]);
}

void eng__matmul(eng_pool_t *pool, const float *x, uint32_t M, const eng_weight_t *w, float *y,
                 bool accumulate, float *const *tmp, uint16_t *a_bf16, bool simd)
{
    eng__matmul_n(pool, x, M, &w, &y, 1, accumulate, tmp, a_bf16, simd);
}

/* ---------------------------------------------------------------------------------------------
 * Attention
 * ------------------------------------------------------------------------------------------- */

/* Keys per attention chunk on the AVX-512 path: four blocks of 16 (the row state and the
 * softmax reductions are paid once per chunk, the products run on 16 accumulators). */
#define ATTN_CHUNK 64

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

/* The running state of one query row: max score m, normalizer l, unnormalized output o; on
 * the AVX-512 path also the current chunk's weights p[ATTN_CHUNK], the factor corr the
 * previous output is scaled by, and n_valid, the chunk's keys the row sees. */
typedef struct attn_row {
    const float *q;
    float *o;
    float *p;
    float m, l, corr;
    uint32_t pos, n_valid;
} attn_row_t;

/* Scores of up to four rows against a chunk's keys (kt [hd][ATTN_CHUNK], F32, finite in every
 * lane), then each row's online-softmax step: m, l, corr, n_valid and the weights p (zero past
 * the row's last visible key, and all zero for a row that sees none of the chunk, with corr 1).
 * Rows past n_rows repeat row 0 in the products and are not updated. */
AVX512 static void attn_scores4(const float *kt, uint32_t hd, attn_row_t *rows, uint32_t n_rows,
                                uint32_t start, uint32_t n_keys)
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
        const float *kd = kt + (size_t)d * ATTN_CHUNK;
        __m512 k0 = _mm512_loadu_ps(kd), k1 = _mm512_loadu_ps(kd + 16);
        __m512 k2 = _mm512_loadu_ps(kd + 32), k3 = _mm512_loadu_ps(kd + 48);
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
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (uint32_t r = 0; r < n_rows; r++) {
        attn_row_t *row = &rows[r];
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

/* o = o * corr + p . V for up to four rows (vb [ATTN_CHUNK][hd], F32; only the first
 * max(n_valid) rows are read, so unwritten slots past them are never touched). Columns go 32
 * at a time (eight accumulators), then 16. */
AVX512 static void attn_values4(const float *vb, uint32_t hd, attn_row_t *rows, uint32_t n_rows)
{
    uint32_t nj = 0;
    for (uint32_t r = 0; r < n_rows; r++)
        nj = PC_MAX(nj, rows[r].n_valid);
    if (nj == 0)
        return; /* corr is 1 for every row: nothing changes */
    attn_row_t *r0 = &rows[0], *r1 = &rows[PC_MIN(1, n_rows - 1)];
    attn_row_t *r2 = &rows[PC_MIN(2, n_rows - 1)], *r3 = &rows[PC_MIN(3, n_rows - 1)];
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
            const float *vj = vb + (size_t)j * hd + c;
            __m512 v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + 16);
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
            __m512 v0 = _mm512_loadu_ps(vb + (size_t)j * hd + c);
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

/* One KV block (kt [hd][bt], vb [bt][hd], F32) against one row; block_start is the position
 * of the block's first slot, n_slots its valid slots. The portable path, and the reference
 * the AVX-512 chunks are tested against. */
static void attn_block_scalar(const float *kt, const float *vb, uint32_t hd, uint32_t bt,
                              attn_row_t *row, uint32_t block_start, uint32_t n_slots)
{
    if (row->pos < block_start)
        return;
    uint32_t n_valid = PC_MIN(n_slots, row->pos - block_start + 1);
    float s[4096];
    float bmax = -INFINITY;
    for (uint32_t j = 0; j < n_valid; j++) {
        float acc = 0;
        for (uint32_t d = 0; d < hd; d++)
            acc += row->q[d] * kt[(size_t)d * bt + j];
        s[j] = acc;
        bmax = acc > bmax ? acc : bmax;
    }
    float m_new = row->m > bmax ? row->m : bmax;
    float corr = expf(row->m - m_new);
    float sum = 0;
    for (uint32_t j = 0; j < n_valid; j++) {
        s[j] = expf(s[j] - m_new);
        sum += s[j];
    }
    row->l = row->l * corr + sum;
    row->m = m_new;
    for (uint32_t d = 0; d < hd; d++) {
        float o = row->o[d] * corr;
        for (uint32_t j = 0; j < n_valid; j++)
            o += s[j] * vb[(size_t)j * hd + d];
        row->o[d] = o;
    }
}

/* Block bi of the sequence's KV for one KV head, its first n_slots slots, into kt (row stride
 * ldk floats, columns [col, col + n_slots)) and vb (rows [col, col + n_slots), stride hd), as
 * F32. Only the valid slots are read: unwritten ones may hold anything (NaN in tests). */
static void attn_load_block(const eng_attn_args_t *a, const void *kv, uint32_t n_slots, float *kt,
                            uint32_t ldk, float *vb, uint32_t col)
{
    uint32_t hd = a->head_dim, bt = a->block_tokens;
    if (a->kv_f16) {
        const uint16_t *k16 = kv;
        if (a->simd && eng__cpu_has_avx512())
            f16_rows_to_f32_avx512(k16, bt, kt + col, ldk, hd, n_slots);
        else
            for (uint32_t d = 0; d < hd; d++)
                eng__f16_to_f32_row(k16 + (size_t)d * bt, kt + (size_t)d * ldk + col, n_slots,
                                    false);
        eng__f16_to_f32_row(k16 + (size_t)hd * bt, vb + (size_t)col * hd, (size_t)n_slots * hd,
                            a->simd);
    } else {
        const float *k32 = kv;
        for (uint32_t d = 0; d < hd; d++)
            memcpy(kt + (size_t)d * ldk + col, k32 + (size_t)d * bt, n_slots * sizeof(float));
        memcpy(vb + (size_t)col * hd, k32 + (size_t)hd * bt, (size_t)n_slots * hd * sizeof(float));
    }
}

size_t eng__attention_scratch_floats(uint32_t head_dim, uint32_t block_tokens, uint32_t max_rows)
{
    size_t keys = PC_MAX(block_tokens, ATTN_CHUNK);
    return 2 * keys * head_dim + (size_t)max_rows * (head_dim + ATTN_CHUNK);
}

void eng__attention(const eng_attn_args_t *a, const eng_attn_task_t *task, float *scratch)
{
    const eng_kvpool_t *pool = a->kvpool;
    uint32_t hd = a->head_dim, bt = a->block_tokens;
    uint32_t group = a->n_head / a->n_head_kv;
    uint32_t q_stride = a->n_head * hd;
    /* The AVX-512 path takes the keys ATTN_CHUNK at a time (whole blocks); the portable one
     * block by block. */
    bool simd = a->simd && eng__cpu_has_avx512() && ATTN_CHUNK % bt == 0 && hd % 16 == 0;
    uint32_t keys = simd ? ATTN_CHUNK : bt;                 /* columns of kt, rows of vb */
    float *kt = scratch;                                    /* [hd][keys] */
    float *vb = kt + (size_t)hd * PC_MAX(bt, ATTN_CHUNK);   /* [keys][hd] */
    float *obuf = vb + (size_t)hd * PC_MAX(bt, ATTN_CHUNK); /* [n_rows][hd] */
    uint32_t n_rows = (task->t1 - task->t0) * group;
    attn_row_t rows_fixed[ENG_ATTN_MAX_ROWS];
    PC_ASSERT(n_rows <= PC_ARRAY_LEN(rows_fixed));
    float *pbuf = obuf + (size_t)n_rows * hd; /* [n_rows][ATTN_CHUNK] */
    attn_row_t *rows = rows_fixed;
    uint32_t max_pos = 0;
    for (uint32_t t = task->t0, r = 0; t < task->t1; t++) {
        for (uint32_t g = 0; g < group; g++, r++) {
            uint32_t h = task->kv_head * group + g;
            rows[r].q = a->q + (size_t)t * q_stride + (size_t)h * hd;
            rows[r].o = obuf + (size_t)r * hd;
            rows[r].p = pbuf + (size_t)r * ATTN_CHUNK;
            rows[r].m = -INFINITY;
            rows[r].l = 0;
            rows[r].pos = a->pos[t];
            memset(rows[r].o, 0, hd * sizeof(float));
        }
        max_pos = PC_MAX(max_pos, a->pos[t]);
    }
    const uint32_t *blocks = a->blocks[task->seq];
    uint32_t n_keys_total = max_pos + 1;
    for (uint32_t start = 0; start < n_keys_total; start += keys) {
        uint32_t n_keys = PC_MIN(keys, n_keys_total - start);
        for (uint32_t col = 0; col < n_keys; col += bt) {
            const void *kv =
                eng_kvpool_kv(pool, blocks[(start + col) / bt], a->layer, task->kv_head);
            attn_load_block(a, kv, PC_MIN(bt, n_keys - col), kt, keys, vb, col);
        }
        if (n_keys < keys) /* lanes past the valid keys are masked, but keep them finite */
            for (uint32_t d = 0; d < hd; d++)
                memset(kt + (size_t)d * keys + n_keys, 0, (keys - n_keys) * sizeof(float));
        if (simd) {
            for (uint32_t r = 0; r < n_rows; r += 4)
                attn_scores4(kt, hd, rows + r, PC_MIN(4, n_rows - r), start, n_keys);
            for (uint32_t r = 0; r < n_rows; r += 4)
                attn_values4(vb, hd, rows + r, PC_MIN(4, n_rows - r));
        } else {
            for (uint32_t r = 0; r < n_rows; r++)
                attn_block_scalar(kt, vb, hd, bt, &rows[r], start, n_keys);
        }
    }
    for (uint32_t t = task->t0, r = 0; t < task->t1; t++) {
        for (uint32_t g = 0; g < group; g++, r++) {
            uint32_t h = task->kv_head * group + g;
            float *out = a->out + (size_t)t * q_stride + (size_t)h * hd;
            float inv = 1.0f / rows[r].l;
            for (uint32_t d = 0; d < hd; d++)
                out[d] = rows[r].o[d] * inv;
        }
    }
}
