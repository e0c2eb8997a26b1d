/*
 * vexp.c — the exp() of vexp.h on three paths: portable C (scalar, libm's fma()), AVX2 + FMA
 * (four lanes) and AVX-512F (eight lanes). The SIMD functions carry target attributes, so the
 * file builds without -march and they run only where eng__cpu_isa_runs() said yes.
 *
 * Bit identity between the paths rests on two things: each path performs the same IEEE
 * operations in the same order (the steps in vexp.h, one vector instruction for each scalar
 * operation), and nothing is contracted: engine/CMakeLists.txt compiles this file with
 * -ffp-contract=off, so `a * b + c` written here stays two roundings and every fused
 * multiply-add is an explicit fma.
 */
#include "vexp.h"

#include "pc_exp.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ENG_X86 1
#endif

/* The constants are pc_exp.h's (PC_EXP_*), the scalar definition every path matches. */
#define VEXP_LO PC_EXP_LO
#define VEXP_HI PC_EXP_HI
#define INV_LN2 PC_EXP_INV_LN2
#define LN2_HI PC_EXP_LN2_HI
#define LN2_LO PC_EXP_LN2_LO
#define POW2_BIAS PC_EXP_POW2_BIAS
#define C13 PC_EXP_C13
#define C12 PC_EXP_C12
#define C11 PC_EXP_C11
#define C10 PC_EXP_C10
#define C9 PC_EXP_C9
#define C8 PC_EXP_C8
#define C7 PC_EXP_C7
#define C6 PC_EXP_C6
#define C5 PC_EXP_C5
#define C4 PC_EXP_C4
#define C3 PC_EXP_C3
#define C2 PC_EXP_C2

/* ---- portable ------------------------------------------------------------------------------ */

double eng_vexp(double x)
{
    return pc_exp(x);
}

/* One logit's weight (see eng_vexp_weights_isa); the scalar definition every path matches. */
static inline double weight_port(float x, double mx, double inv_t, double thr)
{
    x = x > FLT_MAX ? FLT_MAX : x; /* NaN stays NaN */
    double xd = (double)x;
    return xd >= thr ? pc_exp((xd - mx) * inv_t) : 0.0; /* NaN fails the comparison */
}

static void vexp_row_port(const double *x, double *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = eng_vexp(x[i]);
}

static double weights_port(const float *logits, size_t n, double mx, double inv_t, double thr,
                           bool prefix, double *w, double sum)
{
    for (size_t i = 0; i < n; i++) {
        double e = weight_port(logits[i], mx, inv_t, thr);
        sum += e;
        w[i] = prefix ? sum : e;
    }
    return sum;
}

/* Adds w[0..m) to sum in order; with prefix, leaves the running sums in w. */
static inline double sum_block(double *w, size_t m, bool prefix, double sum)
{
    if (prefix) {
        for (size_t j = 0; j < m; j++)
            w[j] = sum += w[j];
    } else {
        for (size_t j = 0; j < m; j++)
            sum += w[j];
    }
    return sum;
}

static float logit_max_port(const float *logits, size_t n, float m)
{
    for (size_t i = 0; i < n; i++)
        m = logits[i] > m ? logits[i] : m; /* NaN fails the comparison */
    return m;
}

#ifdef ENG_X86

/* ---- AVX2 + FMA ---------------------------------------------------------------------------- */

#define AVX2 __attribute__((target("avx2,fma")))

AVX2 static inline __m256d pow2_avx2(__m256d n)
{
    __m256i b = _mm256_castpd_si256(_mm256_add_pd(n, _mm256_set1_pd(POW2_BIAS)));
    return _mm256_castsi256_pd(_mm256_slli_epi64(b, 52));
}

AVX2 static inline __m256d vexp_avx2(__m256d x)
{
    x = _mm256_max_pd(x, _mm256_set1_pd(VEXP_LO)); /* NaN: the second operand */
    x = _mm256_min_pd(x, _mm256_set1_pd(VEXP_HI));
    __m256d k = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(INV_LN2)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256d r = _mm256_fnmadd_pd(k, _mm256_set1_pd(LN2_HI), x);
    r = _mm256_fnmadd_pd(k, _mm256_set1_pd(LN2_LO), r);
    __m256d p = _mm256_set1_pd(C13);
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(C12));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(C11));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(C10));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(C9));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(C8));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(C7));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(C6));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(C5));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(C4));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(C3));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(C2));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0));
    __m256d n1 = _mm256_round_pd(_mm256_mul_pd(k, _mm256_set1_pd(0.5)),
                                 _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m256d n2 = _mm256_sub_pd(k, n1);
    return _mm256_mul_pd(_mm256_mul_pd(p, pow2_avx2(n1)), pow2_avx2(n2));
}

AVX2 static void vexp_row_avx2(const double *x, double *y, size_t n)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        _mm256_storeu_pd(y + i, vexp_avx2(_mm256_loadu_pd(x + i)));
    vexp_row_port(x + i, y + i, n - i);
}

AVX2 static double weights_avx2(const float *logits, size_t n, double mx, double inv_t, double thr,
                                bool prefix, double *w)
{
    const __m128 fmax = _mm_set1_ps(FLT_MAX);
    const __m256d vmx = _mm256_set1_pd(mx), vit = _mm256_set1_pd(inv_t);
    const __m256d vthr = _mm256_set1_pd(thr);
    double sum = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        /* min(FLT_MAX, x) returns x when x is NaN (the second operand). */
        __m256d xd = _mm256_cvtps_pd(_mm_min_ps(fmax, _mm_loadu_ps(logits + i)));
        __m256d keep = _mm256_cmp_pd(xd, vthr, _CMP_GE_OQ);
        if (_mm256_movemask_pd(keep) == 0) {
            /* Nothing kept (min_p): four zeros, and the sum does not move. */
            _mm256_storeu_pd(w + i, _mm256_set1_pd(prefix ? sum : 0.0));
            continue;
        }
        __m256d e = vexp_avx2(_mm256_mul_pd(_mm256_sub_pd(xd, vmx), vit));
        _mm256_storeu_pd(w + i, _mm256_and_pd(e, keep));
        sum = sum_block(w + i, 4, prefix, sum);
    }
    return weights_port(logits + i, n - i, mx, inv_t, thr, prefix, w + i, sum);
}

AVX2 static float logit_max_avx2(const float *logits, size_t n)
{
    /* max(x, m) returns m when x is NaN (the second operand). */
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(logits + i), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(logits + i + 8), m1);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_max_ps(m0, m1));
    return logit_max_port(logits + i, n - i, logit_max_port(lanes, 8, -INFINITY));
}

/* ---- AVX-512F ------------------------------------------------------------------------------ */

#define AVX512 __attribute__((target("avx512f,fma")))

AVX512 static inline __m512d pow2_avx512(__m512d n)
{
    __m512i b = _mm512_castpd_si512(_mm512_add_pd(n, _mm512_set1_pd(POW2_BIAS)));
    return _mm512_castsi512_pd(_mm512_slli_epi64(b, 52));
}

AVX512 static inline __m512d vexp_avx512(__m512d x)
{
    x = _mm512_max_pd(x, _mm512_set1_pd(VEXP_LO)); /* NaN: the second operand */
    x = _mm512_min_pd(x, _mm512_set1_pd(VEXP_HI));
    __m512d k = _mm512_roundscale_pd(_mm512_mul_pd(x, _mm512_set1_pd(INV_LN2)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512d r = _mm512_fnmadd_pd(k, _mm512_set1_pd(LN2_HI), x);
    r = _mm512_fnmadd_pd(k, _mm512_set1_pd(LN2_LO), r);
    __m512d p = _mm512_set1_pd(C13);
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(C12));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(C11));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(C10));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(C9));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(C8));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(C7));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(C6));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(C5));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(C4));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(C3));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(C2));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
    __m512d n1 = _mm512_roundscale_pd(_mm512_mul_pd(k, _mm512_set1_pd(0.5)),
                                      _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512d n2 = _mm512_sub_pd(k, n1);
    return _mm512_mul_pd(_mm512_mul_pd(p, pow2_avx512(n1)), pow2_avx512(n2));
}

AVX512 static void vexp_row_avx512(const double *x, double *y, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm512_storeu_pd(y + i, vexp_avx512(_mm512_loadu_pd(x + i)));
    vexp_row_port(x + i, y + i, n - i);
}

AVX512 static double weights_avx512(const float *logits, size_t n, double mx, double inv_t,
                                    double thr, bool prefix, double *w)
{
    const __m256 fmax = _mm256_set1_ps(FLT_MAX);
    const __m512d vmx = _mm512_set1_pd(mx), vit = _mm512_set1_pd(inv_t);
    const __m512d vthr = _mm512_set1_pd(thr);
    double sum = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        /* min(FLT_MAX, x) returns x when x is NaN (the second operand). */
        __m512d xd = _mm512_cvtps_pd(_mm256_min_ps(fmax, _mm256_loadu_ps(logits + i)));
        __mmask8 keep = _mm512_cmp_pd_mask(xd, vthr, _CMP_GE_OQ);
        if (keep == 0) {
            /* Nothing kept (min_p): eight zeros, and the sum does not move. */
            _mm512_storeu_pd(w + i, _mm512_set1_pd(prefix ? sum : 0.0));
            continue;
        }
        __m512d e = vexp_avx512(_mm512_mul_pd(_mm512_sub_pd(xd, vmx), vit));
        _mm512_storeu_pd(w + i, _mm512_maskz_mov_pd(keep, e));
        sum = sum_block(w + i, 8, prefix, sum);
    }
    return weights_port(logits + i, n - i, mx, inv_t, thr, prefix, w + i, sum);
}

AVX512 static float logit_max_avx512(const float *logits, size_t n)
{
    __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        m0 = _mm512_max_ps(_mm512_loadu_ps(logits + i), m0);
        m1 = _mm512_max_ps(_mm512_loadu_ps(logits + i + 16), m1);
    }
    float lanes[16];
    _mm512_storeu_ps(lanes, _mm512_max_ps(m0, m1));
    return logit_max_port(logits + i, n - i, logit_max_port(lanes, 16, -INFINITY));
}

#endif /* ENG_X86 */

/* ---- dispatch ------------------------------------------------------------------------------ */

void eng_vexp_row_isa(const double *x, double *y, size_t n, eng_cpu_isa_t isa)
{
    switch (eng__cpu_isa_clamp(isa)) {
#ifdef ENG_X86
    case ENG_CPU_ISA_AVX512:
        vexp_row_avx512(x, y, n);
        return;
    case ENG_CPU_ISA_AVX2:
        vexp_row_avx2(x, y, n);
        return;
#endif
    default:
        vexp_row_port(x, y, n);
        return;
    }
}

double eng_vexp_weights_isa(const float *logits, size_t n, double mx, double inv_t, double thr,
                            bool prefix, double *w, eng_cpu_isa_t isa)
{
    switch (eng__cpu_isa_clamp(isa)) {
#ifdef ENG_X86
    case ENG_CPU_ISA_AVX512:
        return weights_avx512(logits, n, mx, inv_t, thr, prefix, w);
    case ENG_CPU_ISA_AVX2:
        return weights_avx2(logits, n, mx, inv_t, thr, prefix, w);
#endif
    default:
        return weights_port(logits, n, mx, inv_t, thr, prefix, w, 0.0);
    }
}

double eng_vexp_weights(const float *logits, size_t n, double mx, double inv_t, double thr,
                        bool prefix, double *w)
{
    return eng_vexp_weights_isa(logits, n, mx, inv_t, thr, prefix, w, ENG_CPU_ISA_AUTO);
}

float eng_vexp_logit_max_isa(const float *logits, size_t n, eng_cpu_isa_t isa)
{
    switch (eng__cpu_isa_clamp(isa)) {
#ifdef ENG_X86
    case ENG_CPU_ISA_AVX512:
        return logit_max_avx512(logits, n);
    case ENG_CPU_ISA_AVX2:
        return logit_max_avx2(logits, n);
#endif
    default:
        return logit_max_port(logits, n, -INFINITY);
    }
}

float eng_vexp_logit_max(const float *logits, size_t n)
{
    return eng_vexp_logit_max_isa(logits, n, ENG_CPU_ISA_AUTO);
}
