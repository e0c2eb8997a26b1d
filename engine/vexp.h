/*
 * vexp.h — pc_exp() (common/pc_exp.h, an exp() whose every bit is defined) on the CPU's vector
 * paths, and the sampler's passes built on it: the maximum and the weights with their sum
 * (engine-internal). The sampler (sampling.h) weighs tokens with it so
 * that the same seed and logits give the same tokens on every machine, with no dependence on the
 * platform's libm.
 *
 * The function is pc_exp() (common/pc_exp.h, which defines every step): this file adds the
 * vectorized paths, AVX2 + FMA (four lanes) and AVX-512F (eight lanes), which perform the same
 * IEEE operations in the same order, so every path (portable = pc_exp itself) returns the same
 * bits; test_vexp checks it on every path the test machine runs, and checks the 1 ulp bound
 * against libm.
 */
#ifndef ENG_VEXP_H
#define ENG_VEXP_H

#include <stdbool.h>
#include <stddef.h>

#include "cpu.h"

/* pc_exp(x): the scalar portable path. */
double eng_vexp(double x);

/* y[i] = eng_vexp(x[i]) for i < n on the given path (AUTO: the best this CPU runs; a path it
 * cannot run is lowered, see eng__cpu_isa_clamp). x and y may be the same array. */
void eng_vexp_row_isa(const double *x, double *y, size_t n, eng_cpu_isa_t isa);

/* The sampler's weight pass over logits[n] (float; +inf counts as FLT_MAX): for each i,
 * w[i] = eng_vexp(((double)logits[i] - mx) * inv_t) when logits[i] is not NaN and
 * (double)logits[i] >= thr, else 0 (so -inf and NaN get 0). Returns the sum of w[0..n) added in
 * increasing i, one double addition at a time, starting from 0 (the same bits on every path).
 * thr = -INFINITY keeps every non-NaN logit. With prefix, w[i] is instead that running sum
 * after adding weight i (nondecreasing; w[n - 1] is the returned sum): the sampler's draw then
 * finds its token by binary search. */
double eng_vexp_weights_isa(const float *logits, size_t n, double mx, double inv_t, double thr,
                            bool prefix, double *w, eng_cpu_isa_t isa);
/* The same on the best path this CPU runs. */
double eng_vexp_weights(const float *logits, size_t n, double mx, double inv_t, double thr,
                        bool prefix, double *w);

/* The largest of logits[n] ignoring NaN (+inf counts), or -INFINITY when n is 0 or every logit
 * is NaN or -inf: the sampler's first pass. Exact, so every path returns the same value. */
float eng_vexp_logit_max_isa(const float *logits, size_t n, eng_cpu_isa_t isa);
float eng_vexp_logit_max(const float *logits, size_t n);

#endif
