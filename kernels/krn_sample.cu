/*
 * krn_sample.cu — token sampling on the GPU with the engine's exact rules (kernels.h,
 * engine/sampling.h), computed as kernels/ref/krn_ref_sample.c documents: thresholds on a
 * 64-bit key that orders candidates by (logit descending, id ascending), found bit by bit with
 * block-wide counts and sums instead of a sort, then the pick by a prefix sum in id order.
 *
 * Launch geometry: grid n_rows, 1024 threads; one CTA samples one row. Thread t strides over
 * the vocabulary for counts and sums; for the final pick it owns the contiguous id range
 * [t * chunk, (t + 1) * chunk), and a block scan of the range sums (double) decides which one
 * thread writes the token (krn_sample_may_own, krn_sample_walk: shared with the host tests).
 * Weights are kept in the caller's `work` array (double, one per logit).
 *
 * This is krn_sample_bitwise: 128 passes over the vocabulary for top_k plus top_p, kept as the
 * fallback (KVGW_CUDA_SAMPLER=bitwise) of the multi-pass sampler, krn_sample_radix.cu.
 */
#include <float.h>

#include "krn_cuda.cuh"
#include "krn_hostdev.h"

#define SAMPLE_THREADS 1024

__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(const float *logits,          // [n_rows][n_vocab]
                  const krn_sample_row_t *rows, // [n_rows]
                  int32_t *token,               // [n_rows]
                  double *work,                 // [n_rows][n_vocab]
                  int32_t n_vocab)
{
    __shared__ unsigned long long sh_u[32];
    __shared__ float sh_f[32];
    __shared__ double sh_d[32];
    __shared__ long long sh_i[32];
    __shared__ double scan[SAMPLE_THREADS];
    const int64_t r = blockIdx.x;
    const float *x = logits + r * n_vocab;
    double *w = work + r * n_vocab;
    const krn_sample_row_t p = rows[r];
    const int tid = threadIdx.x;

    unsigned long long best = 0;
    float maxv = -INFINITY;
    for (int32_t i = tid; i < n_vocab; i += SAMPLE_THREADS) {
        float v = x[i];
        if (v > -INFINITY) {
            unsigned long long k = krn_sample_key(v, i);
            best = k > best ? k : best;
            maxv = fmaxf(maxv, krn_sample_clamp(v));
        }
    }
    best = krn_block_reduce(best, krn_op_max(), sh_u);
    maxv = krn_block_reduce(maxv, krn_op_max(), sh_f);
    if (best == 0 || p.temperature == 0.0f || p.top_k == 1) {
        if (tid == 0)
            token[r] = best == 0 ? -1 : krn_sample_key_id(best);
        return;
    }

    const double inv_t = 1.0 / (double)p.temperature, mx = (double)maxv;
    const double thr =
        p.min_p > 0.0f ? mx + (double)p.temperature * log((double)p.min_p) : -INFINITY;
    long long n_cand = 0;
    for (int32_t i = tid; i < n_vocab; i += SAMPLE_THREADS) {
        float v = x[i], vc = krn_sample_clamp(v);
        if (v > -INFINITY && (double)vc >= thr) {
            w[i] = exp(((double)vc - mx) * inv_t);
            n_cand++;
        } else {
            w[i] = -1.0;
        }
    }
    n_cand = krn_block_reduce(n_cand, krn_op_add(), sh_i);

    unsigned long long lo = 0;
    if (p.top_k > 0 && p.top_k < n_cand) {
        for (int b = 63; b >= 0; b--) {
            unsigned long long c = lo | (1ull << b);
            long long cnt = 0;
            for (int32_t i = tid; i < n_vocab; i += SAMPLE_THREADS)
                cnt += w[i] >= 0.0 && krn_sample_key(krn_sample_clamp(x[i]), i) >= c;
            cnt = krn_block_reduce(cnt, krn_op_add(), sh_i);
            if (cnt >= p.top_k)
                lo = c;
        }
    }
    if (p.top_p < 1.0f) {
        double mass = 0;
        for (int32_t i = tid; i < n_vocab; i += SAMPLE_THREADS)
            if (w[i] >= 0.0 && krn_sample_key(krn_sample_clamp(x[i]), i) >= lo)
                mass += w[i];
        mass = krn_block_reduce(mass, krn_op_add(), sh_d);
        const double want = (double)p.top_p * mass;
        unsigned long long v = 0;
        for (int b = 63; b >= 0; b--) {
            unsigned long long c = v | (1ull << b), cc = c > lo ? c : lo;
            double ms = 0;
            for (int32_t i = tid; i < n_vocab; i += SAMPLE_THREADS)
                if (w[i] >= 0.0 && krn_sample_key(krn_sample_clamp(x[i]), i) >= cc)
                    ms += w[i];
            ms = krn_block_reduce(ms, krn_op_add(), sh_d);
            if (ms >= want)
                v = c;
        }
        lo = v > lo ? v : lo;
    }

    /* The kept set's weights in id order: this thread's contiguous range, a block scan of
     * the range sums, and the pick by the unique owner of the target (krn_hostdev.h). */
    const int32_t chunk = (n_vocab + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int32_t i0 = tid * chunk < n_vocab ? tid * chunk : n_vocab;
    const int32_t i1 = i0 + chunk < n_vocab ? i0 + chunk : n_vocab;
    double local = 0;
    for (int32_t i = i0; i < i1; i++)
        if (w[i] > 0.0 && krn_sample_key(krn_sample_clamp(x[i]), i) >= lo)
            local += w[i];
    /* Inclusive scan of the range sums (Hillis-Steele). */
    scan[tid] = local;
    __syncthreads();
    for (int off = 1; off < SAMPLE_THREADS; off *= 2) {
        double add = tid >= off ? scan[tid - off] : 0.0;
        __syncthreads();
        scan[tid] += add;
        __syncthreads();
    }
    const double target = p.u * scan[SAMPLE_THREADS - 1];
    const double before = tid > 0 ? scan[tid - 1] : 0.0;
    long long owner = krn_sample_may_own(before, local, target) ? (long long)tid : -1;
    owner = krn_block_reduce(owner, krn_op_max(), sh_i);
    if (owner < 0) {
        /* No kept weight is positive (it cannot happen: the largest candidate weighs
         * exp(0) = 1 and every filter keeps it), so the argmax rather than -1. */
        if (tid == 0)
            token[r] = krn_sample_key_id(best);
    } else if (tid == owner) {
        token[r] = krn_sample_walk(x, w, i0, i1, lo, before, target);
    }
}

int krn_sample_bitwise(krn_ctx_t *c, const krn_sample_args_t *a)
{
    if (a->n_rows < 0 || a->n_vocab <= 0)
        return PC_ERR_INVAL;
    if (a->n_rows == 0)
        return 0;
    KRN_ENTER(c);
    sample_kernel<<<(unsigned)a->n_rows, SAMPLE_THREADS, 0, c->stream>>>(
        a->logits, a->row, a->token, a->work, a->n_vocab);
    KRN_CUDA_CHECK(cudaGetLastError());
    return 0;
}
