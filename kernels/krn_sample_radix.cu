/*
 * krn_sample_radix.cu — the multi-pass sampler (krn_sample): radix select over histograms of
 * the candidate key with several CTAs per row, then the pick by a prefix sum of the kept
 * weights in id order. The algorithm, the row's state machine and every per-element and
 * per-bucket step are in krn_sample_hostdev.h (shared with the host unit test); this file
 * holds the launch geometry, the shared-memory histograms and the block-wide scans.
 *
 * Launch geometry: krn_smp_n_launches(n_vocab, plan) launches of one kernel (11 at V = 152064
 * without a plan; 1 when the plan says every row is greedy, 2 without top_k or top_p), each
 * grid (slices, n_rows) x KRN_SMP_THREADS threads; CTA (s, r) handles ids [s * len, (s + 1) *
 * len) of row r (krn_smp_slices: about 2048 logits per CTA, at most 64 CTAs per row and 1024
 * in all). The first launch is the stats pass; every later one advances each row by one pass
 * of its state machine, and rows already done return at once. Each CTA adds its shared-memory
 * histogram (or its slice's kept mass) to the row's global scratch and counts itself in; the last
 * CTA of the row to arrive (threadfence + counter) merges, chooses the bucket with a block-wide
 * suffix scan over KRN_SMP_GROUPS groups of bins, moves the row's state on, and zeroes the
 * histogram for the next pass.
 *
 * Scratch: krn_smp_row_t per row (about 25 KB), owned by the krn_ctx (krn_sample_reserve, or
 * grown on the first call that needs more rows; never while the stream is being captured) and
 * zeroed at the start of each call. `work` is not used (the bitwise kernel uses it).
 *
 * Counts are exact in any order; masses are summed with double atomics, so their rounding may
 * differ run to run by an ulp, which can move a cut only when top_p times the mass falls
 * within an ulp of a boundary. KVGW_CUDA_SAMPLER=bitwise selects the previous one-CTA-per-row
 * kernel (krn_sample.cu) instead.
 */
#include <stdlib.h>
#include <string.h>

#include "krn_cuda.cuh"
#include "krn_sample_hostdev.h"

/* Block-wide exclusive suffix sum of one value per thread (Hillis-Steele over `sh`, which holds
 * KRN_SMP_THREADS elements): thread t gets the sum of the values of threads > t. */
template <typename T> __device__ __forceinline__ T smp_suffix_excl(T v, T *sh)
{
    const int t = threadIdx.x;
    __syncthreads();
    sh[t] = v;
    __syncthreads();
    for (int off = 1; off < KRN_SMP_THREADS; off *= 2) {
        T add = t + off < KRN_SMP_THREADS ? sh[t + off] : (T)0;
        __syncthreads();
        sh[t] += add;
        __syncthreads();
    }
    T excl = t + 1 < KRN_SMP_THREADS ? sh[t + 1] : (T)0;
    __syncthreads();
    return excl;
}

/* Shared memory of one CTA. */
struct smp_smem {
    uint32_t cnt[KRN_SMP_BINS];
    double mass[KRN_SMP_BINS];
    double scan_d[KRN_SMP_THREADS];
    long long scan_i[KRN_SMP_THREADS];
    unsigned long long red_u[32];
    long long red_i[32];
    double red_d[32];
    krn_smp_state_t st;
    krn_sample_row_t row;
    long long choice_b, choice_cnt, choice_above_i;
    double choice_above_d;
    int last;
};

/* The last CTA of a row: the bucket of a TOPK pass. */
__device__ static void smp_choose_topk(smp_smem &sm, int32_t n_vocab)
{
    const int t = threadIdx.x, b0 = t * KRN_SMP_GROUP_BINS, b1 = b0 + KRN_SMP_GROUP_BINS;
    long long g = 0;
    for (int b = b0; b < b1; b++)
        g += sm.cnt[b];
    long long base = smp_suffix_excl(g, sm.scan_i);
    int64_t above = 0;
    long long b = krn_smp_walk_cnt(sm.cnt, b0, b1, base, sm.st.need, &above);
    long long bmax = krn_block_reduce(b, krn_op_max(), sm.red_i);
    if (b >= 0 && b == bmax) {
        sm.choice_b = b;
        sm.choice_cnt = sm.cnt[b];
        sm.choice_above_i = above;
    }
    __syncthreads();
    if (t == 0) {
        /* A bin always qualifies: need <= the prefix's count (the keys are all counted). */
        if (bmax >= 0)
            krn_smp_topk_chosen(&sm.st, n_vocab, (int32_t)sm.choice_b, (uint32_t)sm.choice_cnt,
                                sm.choice_above_i);
        else
            krn_smp_topk_chosen(&sm.st, n_vocab, 0, 0, 0); /* unreachable: keeps going */
    }
    __syncthreads();
}

/* The last CTA of a row: the bucket of a TOPP pass (the first one also sets the target). */
__device__ static void smp_choose_topp(smp_smem &sm, int32_t n_vocab)
{
    const int t = threadIdx.x, b0 = t * KRN_SMP_GROUP_BINS, b1 = b0 + KRN_SMP_GROUP_BINS;
    double g = 0.0;
    for (int b = b1 - 1; b >= b0; b--)
        g += sm.mass[b];
    double base = smp_suffix_excl(g, sm.scan_d);
    if (sm.st.want < 0.0) {
        /* Thread 0's base + its group is the whole kept mass (above is 0 on the first pass). */
        if (t == 0)
            sm.choice_above_d = base + g;
        __syncthreads();
        if (t == 0)
            sm.st.want = (double)sm.st.top_p * sm.choice_above_d;
        __syncthreads();
    }
    double above = 0.0;
    long long b =
        krn_smp_walk_mass(sm.mass, sm.cnt, b0, b1, sm.st.above + base, sm.st.want, &above);
    long long bmax = krn_block_reduce(b, krn_op_max(), sm.red_i);
    if (b >= 0 && b == bmax) {
        sm.choice_b = b;
        sm.choice_cnt = sm.cnt[b];
        sm.choice_above_d = above;
    }
    __syncthreads();
    if (t == 0)
        krn_smp_topp_chosen(&sm.st, n_vocab, bmax >= 0 ? (int32_t)sm.choice_b : -1,
                            bmax >= 0 ? (uint32_t)sm.choice_cnt : 0u,
                            bmax >= 0 ? sm.choice_above_d : 0.0);
    __syncthreads();
}

/* The last CTA of a row: the pick from the slice sums, then inside the owner slice. */
__device__ static void smp_pick(smp_smem &sm, const float *x, const krn_smp_row_t *R,
                                int32_t n_vocab, int32_t n_slices, int32_t slice_len)
{
    const int t = threadIdx.x;
    if (t < n_slices)
        sm.scan_d[t] = __ldcg(&R->slice[t]);
    __syncthreads();
    if (t == 0) {
        double total = 0.0;
        for (int s = 0; s < n_slices; s++)
            total += sm.scan_d[s];
        double target = sm.st.u * total, before = 0.0, owner_before = 0.0;
        long long owner = -1;
        for (int s = 0; s < n_slices; s++) {
            if (krn_sample_may_own(before, sm.scan_d[s], target)) {
                owner = s;
                owner_before = before;
            }
            before += sm.scan_d[s];
        }
        sm.choice_b = owner;
        sm.choice_above_d = owner_before;
        sm.red_d[0] = target;
    }
    __syncthreads();
    const long long owner = sm.choice_b;
    if (owner < 0) {
        /* No kept positive weight: impossible (the largest candidate weighs exp(0) = 1 and
         * every filter keeps it), so the argmax rather than -1. */
        if (t == 0) {
            sm.st.token = krn_sample_key_id(sm.st.best);
            sm.st.phase = KRN_SMP_DONE;
        }
        __syncthreads();
        return;
    }
    const double target = sm.red_d[0], sbefore = sm.choice_above_d;
    __syncthreads();
    const int32_t s0 = (int32_t)owner * slice_len;
    const int32_t s1 = s0 + slice_len < n_vocab ? s0 + slice_len : n_vocab;
    const int32_t chunk = (s1 - s0 + KRN_SMP_THREADS - 1) / KRN_SMP_THREADS;
    const int32_t i0 = s0 + t * chunk < s1 ? s0 + t * chunk : s1;
    const int32_t i1 = i0 + chunk < s1 ? i0 + chunk : s1;
    krn_smp_state_t st = sm.st;
    double local = krn_smp_range_mass(&st, x, i0, i1);
    /* Inclusive prefix (Hillis-Steele) of the chunk sums, then each chunk's start. */
    sm.scan_d[t] = local;
    __syncthreads();
    for (int off = 1; off < KRN_SMP_THREADS; off *= 2) {
        double add = t >= off ? sm.scan_d[t - off] : 0.0;
        __syncthreads();
        sm.scan_d[t] += add;
        __syncthreads();
    }
    const double before = sbefore + (t > 0 ? sm.scan_d[t - 1] : 0.0);
    long long mine = krn_sample_may_own(before, local, target) ? (long long)t : -1;
    long long who = krn_block_reduce(mine, krn_op_max(), sm.red_i);
    if (who < 0) {
        /* The owner slice has positive mass, and its first chunk with mass starts at exactly
         * sbefore <= target: unreachable. */
        if (t == 0)
            sm.st.token = krn_sample_key_id(sm.st.best);
    } else if (t == who) {
        sm.st.token = krn_smp_walk_pick(&st, x, i0, i1, before, target);
    }
    __syncthreads();
    if (t == 0)
        sm.st.phase = KRN_SMP_DONE;
    __syncthreads();
}

__global__ void __launch_bounds__(KRN_SMP_THREADS)
    smp_kernel(const float *logits,          // [n_rows][n_vocab]
               const krn_sample_row_t *rows, // [n_rows]
               int32_t *token,               // [n_rows]
               krn_smp_row_t *scr,           // [n_rows]
               int32_t n_vocab, int32_t n_slices, int32_t slice_len, int stats)
{
    __shared__ smp_smem sm;
    const int t = threadIdx.x, s = blockIdx.x;
    const int64_t r = blockIdx.y;
    krn_smp_row_t *R = scr + r;
    const float *x = logits + r * n_vocab;
    const int32_t i0 = s * slice_len, i1 = i0 + slice_len < n_vocab ? i0 + slice_len : n_vocab;

    if (t == 0) {
        sm.row = rows[r];
        if (!stats)
            sm.st = R->st;
    }
    __syncthreads();
    const int phase = stats ? -1 : sm.st.phase;
    if (phase == KRN_SMP_DONE)
        return;
    int32_t dsh = 53, dwd = 11; /* the digit of this pass (stats: top_k's digit 0) */
    if (!stats)
        krn_smp_digit(sm.st.pass, n_vocab, &dsh, &dwd);

    if (phase == KRN_SMP_PICK) {
        double local = 0.0;
        for (int32_t i = i0 + t; i < i1; i += KRN_SMP_THREADS) {
            double w = krn_smp_weight(&sm.st, x[i], krn_smp_key(x[i], i));
            if (w > 0.0)
                local += w;
        }
        local = krn_block_reduce(local, krn_op_add(), sm.red_d);
        if (t == 0)
            R->slice[s] = local;
    } else {
        const bool topp = phase == KRN_SMP_TOPP;
        const bool hist = !stats || (sm.row.temperature != 0.0f && sm.row.top_k > 1);
        for (int b = t; b < KRN_SMP_BINS; b += KRN_SMP_THREADS) {
            sm.cnt[b] = 0;
            sm.mass[b] = 0.0;
        }
        __syncthreads();
        unsigned long long best = 0;
        long long nv = 0;
        for (int32_t i = i0 + t; i < i1; i += KRN_SMP_THREADS) {
            const float v = x[i];
            if (stats) {
                if (v > -INFINITY) {
                    unsigned long long k = krn_sample_key(v, i);
                    best = k > best ? k : best;
                    nv++;
                    if (hist)
                        atomicAdd(&sm.cnt[krn_smp_digit_of(krn_smp_key(v, i), 53, 11)], 1u);
                }
                continue;
            }
            uint32_t bin;
            double w;
            if (krn_smp_contrib(&sm.st, dsh, dwd, v, i, &bin, &w)) {
                atomicAdd(&sm.cnt[bin], 1u);
                if (topp)
                    atomicAdd(&sm.mass[bin], w);
            }
        }
        if (stats) {
            best = krn_block_reduce(best, krn_op_max(), sm.red_u);
            nv = krn_block_reduce(nv, krn_op_add(), sm.red_i);
            if (t == 0) {
                atomicMax(&R->best, best);
                atomicAdd(&R->n_valid, (uint32_t)nv);
            }
        }
        __syncthreads();
        if (hist)
            for (int b = t; b < KRN_SMP_BINS; b += KRN_SMP_THREADS) {
                if (sm.cnt[b] != 0) {
                    atomicAdd(&R->cnt[b], sm.cnt[b]);
                    if (topp)
                        atomicAdd(&R->mass[b], sm.mass[b]);
                }
            }
    }

    /* Arrive; the last CTA of the row finishes the pass. */
    __threadfence();
    __syncthreads();
    if (t == 0)
        sm.last = atomicAdd(&R->arrive, 1u) == (uint32_t)n_slices - 1;
    __syncthreads();
    if (!sm.last)
        return;
    __threadfence();

    if (phase == KRN_SMP_PICK) {
        smp_pick(sm, x, R, n_vocab, n_slices, slice_len);
    } else {
        if (stats && t == 0)
            krn_smp_start(&sm.st, &sm.row, __ldcg(&R->best), __ldcg(&R->n_valid));
        __syncthreads();
        if (sm.st.phase == KRN_SMP_TOPK || sm.st.phase == KRN_SMP_TOPP) {
            for (int b = t; b < KRN_SMP_BINS; b += KRN_SMP_THREADS) {
                sm.cnt[b] = __ldcg(&R->cnt[b]);
                sm.mass[b] = __ldcg(&R->mass[b]);
                R->cnt[b] = 0;
                R->mass[b] = 0.0;
            }
            __syncthreads();
            /* A row that just entered TOPP from stats has no histogram yet: its first TOPP
             * pass is the next launch. */
            if (stats ? sm.st.phase == KRN_SMP_TOPK : phase == KRN_SMP_TOPK)
                smp_choose_topk(sm, n_vocab);
            else if (!stats && phase == KRN_SMP_TOPP)
                smp_choose_topp(sm, n_vocab);
        }
    }
    if (t == 0) {
        R->arrive = 0;
        R->st = sm.st;
        /* Stats writes every row's token (-1 until it is done), so a row that a wrong plan left
         * unfinished reports no token rather than a previous call's. */
        if (sm.st.phase == KRN_SMP_DONE || stats)
            token[r] = sm.st.phase == KRN_SMP_DONE ? sm.st.token : -1;
    }
}

int krn_sample_reserve(krn_ctx_t *c, int32_t max_rows)
{
    if (max_rows < 0)
        return PC_ERR_INVAL;
    if ((size_t)max_rows <= c->smp_rows)
        return 0;
    KRN_ENTER(c);
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    KRN_CUDA_CHECK(cudaStreamIsCapturing(c->stream, &cs));
    if (cs != cudaStreamCaptureStatusNone) {
        fprintf(stderr,
                "kernels: krn_sample needs scratch for %d rows (has %zu) while the "
                "stream is being captured: call krn_sample_reserve before capturing\n",
                (int)max_rows, c->smp_rows);
        return PC_ERR_INVAL;
    }
    if (c->smp_scratch != NULL) {
        KRN_CUDA_CHECK(cudaStreamSynchronize(c->stream));
        KRN_CUDA_CHECK(cudaFree(c->smp_scratch));
        c->smp_scratch = NULL;
        c->smp_rows = 0;
    }
    void *p = NULL;
    if (cudaMalloc(&p, (size_t)max_rows * sizeof(krn_smp_row_t)) != cudaSuccess) {
        cudaGetLastError();
        return PC_ERR_NOMEM;
    }
    c->smp_scratch = p;
    c->smp_rows = (size_t)max_rows;
    return 0;
}

/* KVGW_CUDA_SAMPLER=bitwise: the previous kernel; anything else (or unset): this one. */
static bool use_bitwise(krn_ctx_t *c)
{
    if (c->smp_impl == 0) {
        const char *v = getenv("KVGW_CUDA_SAMPLER");
        c->smp_impl = v != NULL && strcmp(v, "bitwise") == 0 ? 2 : 1;
    }
    return c->smp_impl == 2;
}

int krn_sample_radix(krn_ctx_t *c, const krn_sample_args_t *a)
{
    if (a->n_rows < 0 || a->n_vocab <= 0)
        return PC_ERR_INVAL;
    if (a->n_rows == 0)
        return 0;
    if (a->n_rows > 65535)
        return PC_ERR_INVAL;
    int rc = krn_sample_reserve(c, a->n_rows);
    if (rc != 0)
        return rc;
    KRN_ENTER(c);
    int32_t len = 0;
    const int32_t slices = krn_smp_slices(a->n_vocab, a->n_rows, &len);
    KRN_CUDA_CHECK(
        cudaMemsetAsync(c->smp_scratch, 0, (size_t)a->n_rows * sizeof(krn_smp_row_t), c->stream));
    const dim3 grid((unsigned)slices, (unsigned)a->n_rows);
    const int32_t n = krn_smp_n_launches(a->n_vocab, a->plan);
    for (int32_t l = 0; l < n; l++) {
        smp_kernel<<<grid, KRN_SMP_THREADS, 0, c->stream>>>(a->logits, a->row, a->token,
                                                            (krn_smp_row_t *)c->smp_scratch,
                                                            a->n_vocab, slices, len, l == 0);
        KRN_CUDA_CHECK(cudaGetLastError());
    }
    return 0;
}

int krn_sample(krn_ctx_t *c, const krn_sample_args_t *a)
{
    return use_bitwise(c) ? krn_sample_bitwise(c, a) : krn_sample_radix(c, a);
}
