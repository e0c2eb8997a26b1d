/*
 * pc_exp.h — exp() with every bit defined here, so that whatever weighs tokens with it (the
 * engine's sampler, engine/vexp.h, and the GPU sampler's CPU reference, kernels/ref) picks the
 * same token on every machine, with no dependence on the platform's libm.
 *
 * The function, pc_exp(x), for any double x:
 *
 *   1. x is clamped to [PC_EXP_LO, PC_EXP_HI] = [-746, 710] (NaN becomes -746): below -746 exp()
 *      is 0 after rounding, above 710 it is +inf, and the steps below give exactly those
 *      results at the clamps.
 *   2. k = rint(x * PC_EXP_INV_LN2): round to nearest, ties to even, of one rounded product.
 *   3. r = fma(-k, PC_EXP_LN2_HI, x), then r = fma(-k, PC_EXP_LN2_LO, r) (LN2_HI + LN2_LO is
 *      ln 2 to about 106 bits; the first fma is exact).
 *   4. p = the Taylor polynomial of exp at r of degree 13 by Horner's rule, one fma per
 *      coefficient: p = C13, then p = fma(p, r, c) for c = C12, ..., C2, 1, 1 (Ci = 1/i!
 *      rounded to double).
 *   5. n1 = floor(k * 0.5), n2 = k - n1; the result is (p * 2^n1) * 2^n2, two rounded
 *      multiplies, the first exact (so a subnormal result is rounded once). 2^n is built from
 *      its bits: n + PC_EXP_POW2_BIAS holds n + 1023 in its low 12 bits, which shifted left by
 *      52 are the exponent field.
 *
 * Every step is a correctly rounded IEEE double operation, so any implementation doing them in
 * this order returns the same bits: pc_exp.c (scalar, libm's fma(), which C requires to be
 * correctly rounded) and engine/vexp.c's AVX2 and AVX-512 lanes are tested to agree bit for bit.
 * Both files are compiled with -ffp-contract=off, so the compiler fuses nothing else. Accuracy:
 * within 1 ulp of the exact exp (tested against glibc's on millions of points, subnormal
 * results included). Targets whose doubles are not IEEE binary64 with round-to-nearest (x87's
 * FLT_EVAL_METHOD 2) are not supported.
 */
#ifndef PC_EXP_H
#define PC_EXP_H

#define PC_EXP_LO (-746.0)
#define PC_EXP_HI 710.0
#define PC_EXP_INV_LN2 0x1.71547652b82fep0
#define PC_EXP_LN2_HI 0x1.62e42fefa39efp-1
#define PC_EXP_LN2_LO 0x1.abc9e3b39803fp-56
#define PC_EXP_POW2_BIAS (0x1.8p52 + 1023.0)
/* 1/i! (the divisions are constant-folded, correctly rounded: every i! here is exact). */
#define PC_EXP_C13 (1.0 / 6227020800.0)
#define PC_EXP_C12 (1.0 / 479001600.0)
#define PC_EXP_C11 (1.0 / 39916800.0)
#define PC_EXP_C10 (1.0 / 3628800.0)
#define PC_EXP_C9 (1.0 / 362880.0)
#define PC_EXP_C8 (1.0 / 40320.0)
#define PC_EXP_C7 (1.0 / 5040.0)
#define PC_EXP_C6 (1.0 / 720.0)
#define PC_EXP_C5 (1.0 / 120.0)
#define PC_EXP_C4 (1.0 / 24.0)
#define PC_EXP_C3 (1.0 / 6.0)
#define PC_EXP_C2 0.5

/* exp(x) as defined above. Out of line on purpose: a caller's `sum += pc_exp(x)` can never be
 * fused with the function's last multiply. */
double pc_exp(double x);

#endif
