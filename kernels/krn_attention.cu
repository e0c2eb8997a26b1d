/*
 * krn_attention.cu — paged attention over the KV pool, prefill and decode, with an online
 * softmax (FlashAttention's recurrence, krn_softmax_merge.h) so no score matrix is
 * materialized, and a split-K merge for long decode contexts.
 *
 * Launch geometry:
 *   attention  grid n_tasks (one CTA per krn_attn_task from krn_attn_plan), 128 threads.
 *              The CTA keeps its query tile Q [R][head_dim] (R = tokens x heads of the group,
 *              <= KRN_ATTN_MAX_ROWS, R * head_dim <= KRN_ATTN_MAX_TILE) in shared memory and
 *              its output accumulators in registers (thread t owns elements t, t + 128, ... of
 *              the R x head_dim tile). It walks the task's KV range [kv0, kv1) in chunks of
 *              C <= 32 slots inside one block (C * head_dim <= 4096): the chunk's K and V are
 *              loaded to shared memory (only slots < kv1: never an unwritten slot), scores
 *              S [R][C] are computed one (row, slot) per thread, each warp runs the softmax
 *              update of its rows (lanes = slots), then every thread updates its accumulators.
 *              Dynamic shared memory: krn_attn_smem_bytes (krn_hostdev.h), at most 73 KiB (the
 *              opt-in attribute is set before every launch; sm_80 allows 163 KiB).
 *              When krn_attn_use_tc holds (F16 pool, head_dim a multiple of 16, ...), this
 *              kernel skips the tasks of more than one token and krn_attention_tc
 *              (krn_attn_tc.cu) runs them on tensor cores; KVGW_CUDA_ATTN=simt keeps them here.
 *              A q8_0 pool (kernels.h) runs on this kernel for every task (the tensor-core one
 *              takes F16 pools only): the CTA quantizes its queries once (krn_q8_0_quantize_f,
 *              the quants kept as floats in Q, the scales after pos), stages each chunk's K as
 *              its raw q8_0 rows in K's room and its V as d * q, and a score is
 *              krn_q8_0_score (exact integer dots of the quants, scaled per block), as the CPU
 *              attention computes it. Shared memory: krn_attn_smem_bytes_of.
 *   merge      grid n_merges, 128 threads: thread d merges dimension d (strided) of every
 *              row-head of the unit across its splits, in split order.
 */
#include <stdlib.h>

#include "krn_cuda.cuh"
#include "krn_hostdev.h"
#include "krn_softmax_merge.h"

#define ATT_THREADS KRN_ATTN_THREADS
#define ATT_OREG (KRN_ATTN_MAX_TILE / ATT_THREADS)

/* skip_multi: leave the tasks of more than one token to the tensor-core kernel. KT: __half or
 * float, or uint8_t for a q8_0 pool (see the file's comment). */
template <typename KT>
__global__ void __launch_bounds__(ATT_THREADS) attn_kernel(krn_attn_args_t a, int skip_multi)
{
    constexpr bool Q8 = sizeof(KT) == 1;
    extern __shared__ float smem[];
    const krn_attn_task_t t = a.tasks[blockIdx.x];
    if (skip_multi && t.n_rows > 1)
        return;
    const int32_t hd = a.kv.head_dim, bt = a.kv.block_tokens;
    const int32_t group = a.n_head / a.kv.n_head_kv, qw = a.n_head * hd;
    /* The geometry krn_attention sized the shared memory for (krn_hostdev.h). */
    const int32_t C = krn_attn_chunk(hd);
    const int32_t R = t.n_rows * group;
    const int32_t r_max = krn_attn_max_rows(hd);
    if (R > r_max || R <= 0)
        return;                              /* not a krn_attn_plan task */
    float *sq = smem;                        /* [r_max][hd] */
    float *sk = sq + r_max * hd;             /* [hd][C] */
    float *sv = sk + C * hd;                 /* [C][hd] */
    float *ss = sv + C * hd;                 /* [r_max][C] scores, then weights */
    float *sm = ss + r_max * C;              /* [r_max] running max */
    float *sl = sm + r_max;                  /* [r_max] running sum */
    float *sc = sl + r_max;                  /* [r_max] this chunk's rescale factor */
    int32_t *spos = (int32_t *)(sc + r_max); /* [r_max] each row's position */
    /* q8_0: [r_max][hd / 32] the query's scales (sq holds its quants, sk the chunk's raw K
     * rows, sv its V dequantized) */
    float *sqd = (float *)(spos + r_max);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const KT *kvb = (const KT *)a.kv.base;
    const int32_t KD = hd / KRN_QK8_0;
    const int32_t rb = KD * KRN_Q8_0_BYTES; /* q8_0: bytes of a K or V row */

    for (int32_t i = tid; i < R * hd; i += ATT_THREADS) {
        int32_t rr = i / hd, d = i % hd;
        int64_t row = t.row0 + rr / group, head = (int64_t)t.kv_head * group + rr % group;
        sq[i] = a.q[row * qw + head * hd + d];
    }
    if constexpr (Q8) { /* each 32-value block of the queries, quantized in place */
        __syncthreads();
        for (int32_t b = tid; b < R * KD; b += ATT_THREADS)
            krn_q8_0_quantize_f(sq + b * KRN_QK8_0, sq + b * KRN_QK8_0, &sqd[b]);
    }
    for (int32_t rr = tid; rr < R; rr += ATT_THREADS) {
        sm[rr] = -INFINITY;
        sl[rr] = 0.0f;
        spos[rr] = a.row_pos[t.row0 + rr / group];
    }
    float o[ATT_OREG];
#pragma unroll
    for (int i = 0; i < ATT_OREG; i++)
        o[i] = 0.0f;

    const int32_t *table = a.block_tables + (int64_t)t.seq * a.max_blocks;
    for (int32_t p0 = t.kv0; p0 < t.kv1;) {
        const int32_t slot0 = p0 % bt;
        int32_t n = bt - slot0;
        n = n < C ? n : C;
        n = n < t.kv1 - p0 ? n : t.kv1 - p0;
        const int64_t slice =
            ((int64_t)table[p0 / bt] * a.kv.n_layer + a.layer) * a.kv.n_head_kv + t.kv_head;
        __syncthreads(); /* the previous chunk is done with sk, sv, ss; sq and spos are ready */
        if constexpr (Q8) {
            /* The chunk's K rows, raw (2-byte words: the blocks are 2-byte aligned), and its V
             * as d * q; only slots < n are read. */
            const uint8_t *sb = (const uint8_t *)kvb + slice * 2 * bt * rb;
            const uint16_t *kr = (const uint16_t *)(sb + (int64_t)slot0 * rb);
            uint16_t *skw = (uint16_t *)sk;
            for (int32_t i = tid; i < n * rb / 2; i += ATT_THREADS)
                skw[i] = kr[i];
            for (int32_t i = tid; i < C * hd; i += ATT_THREADS) {
                int32_t j = i / hd, d = i % hd;
                const uint8_t *vb =
                    sb + (int64_t)(bt + slot0 + j) * rb + (int64_t)(d / KRN_QK8_0) * KRN_Q8_0_BYTES;
                sv[i] = j < n ? krn_q8_0_d_of(vb) * (float)(int8_t)vb[2 + d % KRN_QK8_0] : 0.0f;
            }
        } else {
            const int64_t base = slice * (2 * (int64_t)hd * bt);
            for (int32_t i = tid; i < hd * C; i += ATT_THREADS) {
                int32_t d = i / C, j = i % C;
                sk[i] = j < n ? krn_ld(kvb, base + (int64_t)d * bt + slot0 + j) : 0.0f;
            }
            for (int32_t i = tid; i < C * hd; i += ATT_THREADS) {
                int32_t j = i / hd, d = i % hd;
                sv[i] = j < n ? krn_ld(kvb, base + (int64_t)hd * bt + (int64_t)(slot0 + j) * hd + d)
                              : 0.0f;
            }
        }
        __syncthreads();
        for (int32_t i = tid; i < R * C; i += ATT_THREADS) {
            int32_t rr = i / C, j = i % C;
            float s = -INFINITY;
            if (j < n && p0 + j <= spos[rr]) {
                const float *qr = sq + rr * hd;
                float acc = 0.0f;
                if constexpr (Q8)
                    acc = krn_q8_0_score(qr, sqd + rr * KD, (const uint8_t *)sk + j * rb, hd);
                else
                    for (int32_t d = 0; d < hd; d++)
                        acc = fmaf(qr[d], sk[d * C + j], acc);
                s = acc;
            }
            ss[i] = s;
        }
        __syncthreads();
        for (int32_t rr = warp; rr < R; rr += ATT_THREADS / 32) {
            float s = lane < C ? ss[rr * C + lane] : -INFINITY;
            float tmax = s;
            for (int off = 16; off > 0; off /= 2)
                tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
            float m_old = sm[rr];
            float mn = krn_sm_max(m_old, tmax), corr = krn_sm_scale(m_old, mn);
            float p = krn_sm_prob(s, mn);
            float sum = p;
            for (int off = 16; off > 0; off /= 2)
                sum += __shfl_xor_sync(0xffffffffu, sum, off);
            if (lane < C)
                ss[rr * C + lane] = p;
            __syncwarp();
            if (lane == 0) {
                sl[rr] = sl[rr] * corr + sum;
                sm[rr] = mn;
                sc[rr] = corr;
            }
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ATT_OREG; i++) {
            int32_t idx = tid + i * ATT_THREADS;
            if (idx < R * hd) {
                int32_t rr = idx / hd, d = idx % hd;
                float acc = o[i] * sc[rr];
                const float *pr = ss + rr * C;
                /* A masked slot (weight 0) is skipped as the reference skips it: its V may be
                 * a future position's, and 0 * inf would poison the row. */
                for (int32_t j = 0; j < n; j++) {
                    float pj = pr[j];
                    if (pj != 0.0f)
                        acc = fmaf(pj, sv[j * hd + d], acc);
                }
                o[i] = acc;
            }
        }
        p0 += n;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < ATT_OREG; i++) {
        int32_t idx = tid + i * ATT_THREADS;
        if (idx < R * hd) {
            int32_t rr = idx / hd, d = idx % hd;
            if (t.part < 0) {
                int64_t row = t.row0 + rr / group, head = (int64_t)t.kv_head * group + rr % group;
                a.out[row * qw + head * hd + d] = o[i] * krn_sm_inv(sl[rr]);
            } else {
                int64_t slot = (int64_t)t.part + rr;
                a.part_o[slot * hd + d] = o[i];
                if (d == 0) {
                    a.part_ml[2 * slot] = sm[rr];
                    a.part_ml[2 * slot + 1] = sl[rr];
                }
            }
        }
    }
}

__global__ void __launch_bounds__(ATT_THREADS) attn_merge_kernel(krn_attn_args_t a)
{
    const krn_attn_merge_t mg = a.merges[blockIdx.x];
    const int32_t hd = a.kv.head_dim, group = a.n_head / a.kv.n_head_kv, qw = a.n_head * hd;
    const int32_t w = mg.n_rows * group;
    for (int32_t i = 0; i < w; i++) {
        int64_t row = mg.row0 + i / group, head = (int64_t)mg.kv_head * group + i % group;
        for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) {
            float m = -INFINITY, l = 0.0f, o = 0.0f;
            for (int32_t s = 0; s < mg.n_splits; s++) {
                int64_t slot = (int64_t)mg.part0 + (int64_t)s * w + i;
                float sa, sb;
                krn_sm_merge(&m, &l, a.part_ml[2 * slot], a.part_ml[2 * slot + 1], &sa, &sb);
                o = o * sa + a.part_o[slot * hd + d] * sb;
            }
            a.out[row * qw + head * hd + d] = o * krn_sm_inv(l);
        }
    }
}

int krn_attention(krn_ctx_t *c, const krn_attn_args_t *a)
{
    const krn_kv_t *kv = &a->kv;
    if (kv->n_head_kv <= 0 || a->n_head <= 0 || a->n_head % kv->n_head_kv != 0 ||
        kv->head_dim <= 0 || kv->head_dim % 2 != 0 || kv->head_dim > KRN_ATTN_MAX_HEAD_DIM ||
        kv->block_tokens <= 0 || a->layer < 0 || a->layer >= kv->n_layer || a->n_tasks < 0 ||
        a->n_merges < 0 ||
        (kv->dtype != KRN_F16 && kv->dtype != KRN_F32 && kv->dtype != KRN_Q8_0) ||
        (kv->dtype == KRN_Q8_0 && kv->head_dim % KRN_QK8_0 != 0))
        return PC_ERR_INVAL;
    KRN_ENTER(c);
    /* The multi-token tasks go to the tensor-core kernel when it takes the shape (and
     * KVGW_CUDA_ATTN is not "simt"); this kernel skips them then. */
    const bool tc = krn_attn_use_tc(kv, a->n_head, getenv("KVGW_CUDA_ATTN"));
    /* Above 48 KiB of dynamic shared memory (head_dim 64 and up) a kernel must opt in, for
     * every instantiation, before its launch; the attribute is per function, so it is set on
     * each call (cheap) rather than cached in a global. */
    size_t smem = krn_attn_smem_bytes_of(kv->head_dim, kv->dtype);
    if (a->n_tasks > 0) {
        if (kv->dtype == KRN_Q8_0) {
            KRN_CUDA_CHECK(cudaFuncSetAttribute(
                attn_kernel<uint8_t>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            attn_kernel<uint8_t>
                <<<(unsigned)a->n_tasks, ATT_THREADS, smem, c->stream>>>(*a, tc ? 1 : 0);
        } else if (kv->dtype == KRN_F16) {
            KRN_CUDA_CHECK(cudaFuncSetAttribute(
                attn_kernel<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            attn_kernel<__half>
                <<<(unsigned)a->n_tasks, ATT_THREADS, smem, c->stream>>>(*a, tc ? 1 : 0);
        } else {
            KRN_CUDA_CHECK(cudaFuncSetAttribute(
                attn_kernel<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            attn_kernel<float>
                <<<(unsigned)a->n_tasks, ATT_THREADS, smem, c->stream>>>(*a, tc ? 1 : 0);
        }
        KRN_CUDA_CHECK(cudaGetLastError());
        if (tc) {
            int rc = krn_attention_tc(c, a);
            if (rc != 0)
                return rc;
        }
    }
    if (a->n_merges > 0) {
        attn_merge_kernel<<<(unsigned)a->n_merges, ATT_THREADS, 0, c->stream>>>(*a);
        KRN_CUDA_CHECK(cudaGetLastError());
    }
    return 0;
}
