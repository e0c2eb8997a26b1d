/*
 * krn_sample_testrows.h — rows and sampling rules the sampler tests draw (the host simulation of
 * the multi-pass sampler, test_krn_sample_radix.c, and the GPU test, test_krn_gpu.c): distinct,
 * heavily tied, all-equal, peaked and few-valued rows with NaN / +inf / -inf / FLT_MAX
 * sprinkled in, and rules at their edges (greedy, top_k 1, 2, V - 1, V, beyond V; top_p near 0
 * and 1; min_p up to 1; temperatures 1e-3 to 100; u 0 and just below 1).
 */
#ifndef KRN_SAMPLE_TESTROWS_H
#define KRN_SAMPLE_TESTROWS_H

#include <float.h>
#include <math.h>

#include "kernels.h"
#include "krn_testutil.h"

/* A random row of shape `shape` (mod 6). */
static inline void ks_fill_row(float *x, int32_t V, int shape, kt_rng_t *r)
{
    float scale = shape % 2 ? 10.0f : 3.0f;
    for (int32_t i = 0; i < V; i++) {
        switch (shape % 6) {
        case 0: /* distinct */
        case 1:
            x[i] = kt_unif(r) * scale;
            break;
        case 2: /* heavy ties */
            x[i] = (float)(int)(kt_unif(r) * 4) * 0.5f;
            break;
        case 3: /* all equal */
            x[i] = 1.25f;
            break;
        case 4: /* a peaked distribution with a long tail and far-below logits */
            x[i] = i % 37 == 0 ? 20.0f + kt_unif(r) : kt_unif(r) * 2 - (i % 5 == 0 ? 1000.0f : 0);
            break;
        default: /* few distinct values, negative and zero of both signs */
            x[i] = (float)((int)kt_below(r, 3) - 2) * 0.0f - (float)kt_below(r, 3);
            break;
        }
    }
    int specials = (int)kt_below(r, 4);
    for (int k = 0; k < specials && V > 1; k++) {
        int32_t i = (int32_t)kt_below(r, (uint32_t)V);
        switch (kt_below(r, 4)) {
        case 0:
            x[i] = NAN;
            break;
        case 1:
            x[i] = INFINITY;
            break;
        case 2:
            x[i] = -INFINITY;
            break;
        default:
            x[i] = FLT_MAX;
            break;
        }
    }
}

static inline void ks_rand_params(krn_sample_row_t *p, int32_t V, int k, kt_rng_t *r)
{
    static const float temps[] = {1.0f, 0.0f, 1e-3f, 0.7f, 2.0f, 100.0f};
    p->temperature = temps[kt_below(r, 6)];
    switch (kt_below(r, 7)) {
    case 0:
        p->top_k = 0;
        break;
    case 1:
        p->top_k = 1;
        break;
    case 2:
        p->top_k = 2;
        break;
    case 3:
        p->top_k = V;
        break;
    case 4:
        p->top_k = V > 1 ? V - 1 : 1;
        break;
    case 5:
        p->top_k = V + 5;
        break;
    default:
        p->top_k = 1 + (int32_t)kt_below(r, (uint32_t)(V < 5000 ? V : 5000));
        break;
    }
    switch (kt_below(r, 6)) {
    case 0:
    case 1:
        p->top_p = 1.0f;
        break;
    case 2:
        p->top_p = 1e-6f;
        break;
    case 3:
        p->top_p = 0.999999f;
        break;
    default:
        p->top_p = 0.05f + 0.9f * (float)kt_below(r, 1000) / 1000;
        break;
    }
    p->min_p = kt_below(r, 3) == 0 ? (float)kt_below(r, 100) / 100 : 0.0f;
    if (kt_below(r, 20) == 0)
        p->min_p = 1.0f;
    switch (k % 4) {
    case 0:
        p->u = 0.0;
        break;
    case 1:
        p->u = 1.0 - 0x1.0p-30;
        break;
    default:
        p->u = (double)(kt_next(r) >> 11) * 0x1.0p-53;
        break;
    }
}

#endif
