/*
 * pc_exp.c — the scalar definition of pc_exp.h's exp(), step by step. Compiled with
 * -ffp-contract=off (common/CMakeLists.txt): every multiply-add below is one of the explicit
 * fma() calls, nothing else is fused.
 */
#include "pc_exp.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline double pow2(double n)
{
    double t = n + PC_EXP_POW2_BIAS;
    uint64_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits <<= 52;
    double r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

double pc_exp(double x)
{
    x = x > PC_EXP_LO ? x : PC_EXP_LO; /* NaN fails the comparison: -746 */
    x = x < PC_EXP_HI ? x : PC_EXP_HI;
    double k = rint(x * PC_EXP_INV_LN2);
    double r = fma(-k, PC_EXP_LN2_HI, x);
    r = fma(-k, PC_EXP_LN2_LO, r);
    double p = PC_EXP_C13;
    p = fma(p, r, PC_EXP_C12);
    p = fma(p, r, PC_EXP_C11);
    p = fma(p, r, PC_EXP_C10);
    p = fma(p, r, PC_EXP_C9);
    p = fma(p, r, PC_EXP_C8);
    p = fma(p, r, PC_EXP_C7);
    p = fma(p, r, PC_EXP_C6);
    p = fma(p, r, PC_EXP_C5);
    p = fma(p, r, PC_EXP_C4);
    p = fma(p, r, PC_EXP_C3);
    p = fma(p, r, PC_EXP_C2);
    p = fma(p, r, 1.0);
    p = fma(p, r, 1.0);
    double n1 = floor(k * 0.5);
    double n2 = k - n1;
    return p * pow2(n1) * pow2(n2);
}
