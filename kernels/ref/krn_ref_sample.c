/*
 * krn_ref_sample.c — the CPU reference of the GPU sampler (kernels.h), written as the kernel
 * computes it: no sort, but thresholds on a 64-bit key that orders candidates exactly as the
 * engine's sampler does (logit descending, then id ascending):
 *
 *   key(x, id) = (order-preserving bits of x) << 32 | (0xffffffff - id)   (krn_hostdev.h,
 *                                                                          shared with the kernel)
 *
 * A filter that keeps a prefix of the order keeps exactly the candidates with key >= K for one
 * K, found bit by bit from the top (64 passes): top_k takes the largest K with at least k
 * candidates at or above it; top_p the largest K whose kept mass reaches top_p of the total.
 * tests/unit/kernels checks this against engine/sampling.c.
 */
#include <float.h>
#include <math.h>

#include "kernels.h"
#include "krn_hostdev.h"
#include "pc_err.h"
#include "pc_exp.h"

static int32_t sample_row(const float *x, int32_t n, const krn_sample_row_t *p, double *w)
{
    bool greedy = p->temperature == 0 || p->top_k == 1;
    uint64_t best = 0;
    int32_t best_id = -1;
    float maxv = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        if (!(x[i] > -INFINITY))
            continue;
        uint64_t k = krn_sample_key(x[i], i); /* +inf above FLT_MAX: greedy's raw order */
        if (best_id < 0 || k > best) {
            best = k;
            best_id = i;
        }
        float xc = krn_sample_clamp(x[i]);
        maxv = xc > maxv ? xc : maxv;
    }
    if (best_id < 0 || greedy)
        return best_id;

    double inv_t = 1.0 / (double)p->temperature, mx = (double)maxv;
    double thr = p->min_p > 0 ? mx + (double)p->temperature * log((double)p->min_p) : -INFINITY;
    int64_t n_cand = 0;
    for (int32_t i = 0; i < n; i++) {
        float xc = krn_sample_clamp(x[i]);
        if (x[i] > -INFINITY && (double)xc >= thr) {
            w[i] = pc_exp(((double)xc - mx) * inv_t); /* the engine sampler's exp */
            n_cand++;
        } else {
            w[i] = -1.0; /* not a candidate */
        }
    }
    /* Keys use the clamped logit from here on (+inf counts as FLT_MAX). */
    uint64_t lo = 0;
    if (p->top_k > 0 && p->top_k < n_cand) {
        for (int b = 63; b >= 0; b--) {
            uint64_t c = lo | ((uint64_t)1 << b);
            int64_t cnt = 0;
            for (int32_t i = 0; i < n; i++)
                cnt += w[i] >= 0 && krn_sample_key(krn_sample_clamp(x[i]), i) >= c;
            if (cnt >= p->top_k)
                lo = c;
        }
    }
    if (p->top_p < 1.0f) {
        double mass = 0;
        for (int32_t i = 0; i < n; i++)
            if (w[i] >= 0 && krn_sample_key(krn_sample_clamp(x[i]), i) >= lo)
                mass += w[i];
        double want = (double)p->top_p * mass;
        /* The largest v with mass(key >= max(v, lo)) >= want; it is >= lo since v = lo
         * qualifies, and bits are decided from the top as for top_k. */
        uint64_t v = 0;
        for (int b = 63; b >= 0; b--) {
            uint64_t c = v | ((uint64_t)1 << b), cc = c > lo ? c : lo;
            double ms = 0;
            for (int32_t i = 0; i < n; i++)
                if (w[i] >= 0 && krn_sample_key(krn_sample_clamp(x[i]), i) >= cc)
                    ms += w[i];
            if (ms >= want)
                v = c;
        }
        lo = v > lo ? v : lo;
    }
    double total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (w[i] >= 0 && krn_sample_key(krn_sample_clamp(x[i]), i) < lo)
            w[i] = -1.0; /* filtered out */
        if (w[i] > 0)
            total += w[i];
    }
    double target = p->u * total, cum = 0;
    int32_t last = -1;
    for (int32_t i = 0; i < n; i++) {
        if (!(w[i] > 0))
            continue;
        cum += w[i];
        last = i;
        if (target < cum)
            return i;
    }
    return last >= 0 ? last : best_id; /* the running sum rounded below the target */
}

int krn_ref_sample(const krn_sample_args_t *a)
{
    if (a->n_rows < 0 || a->n_vocab <= 0)
        return PC_ERR_INVAL;
    for (int32_t r = 0; r < a->n_rows; r++)
        a->token[r] = sample_row(a->logits + (int64_t)r * a->n_vocab, a->n_vocab, &a->row[r],
                                 a->work + (int64_t)r * a->n_vocab);
    return 0;
}
