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

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ENG_X86 1
#endif

/* The clamps of step 1. */
#define VEXP_LO (-746.0)
#define VEXP_HI 710.0
#define INV_LN2 0x1.71547652b82fep0
/* ln 2 = LN2_HI + LN2_LO to about 106 bits (LN2_HI is ln 2 rounded to double). */
#define LN2_HI 0x1.62e42fefa39efp-1
#define LN2_LO 0x1.abc9e3b39803fp-56
/* n + POW2_BIAS holds n + 1023 in its low 12 mantissa bits (for integer n in [-1023, 1024]);
 * shifted left by 52 they are the exponent field of 2^n. */
#define POW2_BIAS (0x1.8p52 + 1023.0)

/* The Taylor coefficients 1/i! for i = 13 down to 2 (constant-folded, correctly rounded). */
#define C13 (1.0 / 6227020800.0)
#define C12 (1.0 / 479001600.0)
#define C11 (1.0 / 39916800.0)
#define C10 (1.0 / 3628800.0)
#define C9 (1.0 / 362880.0)
#define C8 (1.0 / 40320.0)
#define C7 (1.0 / 5040.0)
#define C6 (1.0 / 720.0)
#define C5 (1.0 / 120.0)
#define C4 (1.0 / 24.0)
#define C3 (1.0 / 6.0)
#define C2 0.5

/* ---- portable ------------------------------------------------------------------------------ */

static inline double pow2_port(double n)
{
    double t = n + POW2_BIAS;
    uint64_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits <<= 52;
    double r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

double eng_vexp(double x)
{
    x = x > VEXP_LO ? x : VEXP_LO; /* NaN fails the comparison: -746 */
    x = x < VEXP_HI ? x : VEXP_HI;
    double k = rint(x * INV_LN2);
    double r = fma(-k, LN2_HI, x);
    r = fma(-k, LN2_LO, r);
    double p = C13;
    p = fma(p, r, C12);
    p = fma(p, r, C11);
    p = fma(p, r, C10);
    p = fma(p, r, C9);
    p = fma(p, r, C8);
    p = fma(p, r, C7);
    p = fma(p, r, C6);
    p = fma(p, r, C5);
    p = fma(p, r, C4);
    p = fma(p, r, C3);
    p = fma(p, r, C2);
    p = fma(p, r, 1.0);
    p = fma(p, r, 1.0);
    double n1 = floor(k * 0.5);
    double n2 = k - n1;
    return p * pow2_port(n1) * pow2_port(n2);
}

/* One logit's weight (see eng_vexp_weights_isa); the scalar definition every path matches. */
static inline double weight_port(float x, double mx, double inv_t, double thr)
{
    x = x > FLT_MAX ? FLT_MAX : x; /* NaN stays NaN */
    double xd = (double)x;
    double e = eng_vexp((xd - mx) * inv_t);
    return xd >= thr ? e : 0.0;
}

static void vexp_row_port(const double *x, double *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = eng_vexp(x[i]);
}

static double weights_port(const float *logits, size_t n, double mx, double inv_t, double thr,
                           double *w, double sum)
{
    for (size_t i = 0; i < n; i++)
        sum += w[i] = weight_port(logits[i], mx, inv_t, thr);
    return sum;
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
                                double *w)
{
    const __m128 fmax = _mm_set1_ps(FLT_MAX);
    const __m256d vmx = _mm256_set1_pd(mx), vit = _mm256_set1_pd(inv_t);
    const __m256d vthr = _mm256_set1_pd(thr);
    double sum = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        /* min(FLT_MAX, x) returns x when x is NaN (the second operand). */
        __m256d xd = _mm256_cvtps_pd(_mm_min_ps(fmax, _mm_loadu_ps(logits + i)));
        __m256d e = vexp_avx2(_mm256_mul_pd(_mm256_sub_pd(xd, vmx), vit));
        e = _mm256_and_pd(e, _mm256_cmp_pd(xd, vthr, _CMP_GE_OQ));
        _mm256_storeu_pd(w + i, e);
        sum += w[i];
        sum += w[i + 1];
        sum += w[i + 2];
        sum += w[i + 3];
    }
    return weights_port(logits + i, n - i, mx, inv_t, thr, w + i, sum);
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
                                    double thr, double *w)
{
    const __m256 fmax = _mm256_set1_ps(FLT_MAX);
    const __m512d vmx = _mm512_set1_pd(mx), vit = _mm512_set1_pd(inv_t);
    const __m512d vthr = _mm512_set1_pd(thr);
    double sum = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        /* min(FLT_MAX, x) returns x when x is NaN (the second operand). */
        __m512d xd = _mm512_cvtps_pd(_mm256_min_ps(fmax, _mm256_loadu_ps(logits + i)));
        __m512d e = vexp_avx512(_mm512_mul_pd(_mm512_sub_pd(xd, vmx), vit));
        __mmask8 keep = _mm512_cmp_pd_mask(xd, vthr, _CMP_GE_OQ);
        _mm512_storeu_pd(w + i, _mm512_maskz_mov_pd(keep, e));
        for (int j = 0; j < 8; j++)
            sum += w[i + j];
    }
    return weights_port(logits + i, n - i, mx, inv_t, thr, w + i, sum);
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
                            double *w, eng_cpu_isa_t isa)
{
    switch (eng__cpu_isa_clamp(isa)) {
#ifdef ENG_X86
    case ENG_CPU_ISA_AVX512:
        return weights_avx512(logits, n, mx, inv_t, thr, w);
    case ENG_CPU_ISA_AVX2:
        return weights_avx2(logits, n, mx, inv_t, thr, w);
#endif
    default:
        return weights_port(logits, n, mx, inv_t, thr, w, 0.0);
    }
}

double eng_vexp_weights(const float *logits, size_t n, double mx, double inv_t, double thr,
                        double *w)
{
    return eng_vexp_weights_isa(logits, n, mx, inv_t, thr, w, ENG_CPU_ISA_AUTO);
}
