/*
 * vexp.h — a double-precision exp() whose every bit is defined by this file, and the sampler's
 * weight pass built on it (engine-internal). The sampler (sampling.h) weighs tokens with it so
 * that the same seed and logits give the same tokens on every machine, with no dependence on the
 * platform's libm.
 *
 * The function, eng_vexp(x), for any double x:
 *
 *   1. x is clamped to [-746, 710] (NaN becomes -746): below -746 exp() is 0 after rounding,
 *      above 710 it is +inf, and the steps below give exactly those results at the clamps.
 *   2. k = rint(x * (1 / ln 2)), round to nearest, ties to even (one multiply, one rounding).
 *   3. r = fma(-k, LN2_HI, x), then r = fma(-k, LN2_LO, r) (LN2_HI + LN2_LO is ln 2 to 106 bits;
 *      the first fma is exact).
 *   4. p = the Taylor polynomial of exp of degree 13 at r, by Horner's rule with one fma per
 *      coefficient, from 1/13! down to 1 (the coefficients are 1/i! rounded to double).
 *   5. n1 = floor(k / 2), n2 = k - n1; the result is (p * 2^n1) * 2^n2 (two multiplies; the
 *      first is exact, so a subnormal result is rounded once).
 *
 * Every step is a correctly rounded IEEE double operation in a fixed order, so each ISA path
 * (AVX-512, AVX2 + FMA, portable C with libm's fma(), which IEEE 754 and C require to be
 * correctly rounded) returns the same bits; the file is compiled with -ffp-contract=off so the
 * compiler fuses nothing else. Accuracy: within 1 ulp of the exact exp (tested against libm on
 * millions of points, subnormal results included). An x87 build (FLT_EVAL_METHOD != 0) is not
 * supported; every 64-bit target rounds doubles as IEEE says.
 */
#ifndef ENG_VEXP_H
#define ENG_VEXP_H

#include <stddef.h>

#include "cpu.h"

/* exp(x) as defined above (the scalar portable path). */
double eng_vexp(double x);

/* y[i] = eng_vexp(x[i]) for i < n on the given path (AUTO: the best this CPU runs; a path it
 * cannot run is lowered, see eng__cpu_isa_clamp). x and y may be the same array. */
void eng_vexp_row_isa(const double *x, double *y, size_t n, eng_cpu_isa_t isa);

/* The sampler's weight pass over logits[n] (float; +inf counts as FLT_MAX): for each i,
 * w[i] = eng_vexp(((double)logits[i] - mx) * inv_t) when logits[i] is not NaN and
 * (double)logits[i] >= thr, else 0 (so -inf and NaN get 0). Returns the sum of w[0..n) added in
 * increasing i, one double addition at a time, starting from 0 (the same bits on every path).
 * thr = -INFINITY keeps every non-NaN logit. */
double eng_vexp_weights_isa(const float *logits, size_t n, double mx, double inv_t, double thr,
                            double *w, eng_cpu_isa_t isa);
/* The same on the best path this CPU runs. */
double eng_vexp_weights(const float *logits, size_t n, double mx, double inv_t, double thr,
                        double *w);

#endif
