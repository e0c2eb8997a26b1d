/*
 * krn_decode.cu — split-KV decode attention (FlashDecoding-style; kernels.h, "Split-KV decode
 * attention"): rows of one token over a paged KV cache, every query head of a GQA group served
 * by one read of each KV block, the KV range split over CTAs so a small batch still fills the
 * GPU, and a small merge. Untested on a GPU as of this writing (issue 14): the gpu tests compare
 * it with krn_ref_decode_attention (kernels/ref/krn_ref_decode.c).
 *
 * Launch geometry:
 *   decode  grid (n_rows * max_splits, n_head_kv), krn_decode_warps warps (at most 4). CTA
 *           (row, split, KV head) loads the group's queries to shared memory, then warp w takes
 *           the split's blocks w, w + warps, ...: it copies the block's whole K+V slice
 *           (2 * head_dim * block_tokens elements, contiguous in the pool) to its staging area
 *           with 16-byte loads, computes the group x slots scores (lanes over pairs), runs the
 *           online-softmax update of each head with warp shuffles (no CTA barrier), and
 *           accumulates o: lane l owns dimensions l, l + 32, ... of every head of the group
 *           (group * head_dim / 32 <= 64 registers). The warps' states are merged through
 *           shared memory at the end, into the output (max_splits 1) or the split's partial
 *           slot. Dynamic shared memory: krn_decode_smem_bytes (krn_hostdev.h).
 *   merge   grid (n_rows, n_head), 128 threads over head_dim: the row's splits in order.
 *
 * A q8_0 pool (kernels.h) is staged the same way (its slice is K's rows then V's, 34-byte
 * blocks): the CTA quantizes its group's queries once (a thread per 32-value block, the quants
 * kept as floats with their scales), a score is krn_q8_0_score over the staged K row (exact
 * integer dots of the quants, scaled per block), and lane l reads value l of each V block.
 *
 * Only the slots of positions <= the row's position are used: a block's slice is copied whole
 * (slots past the written positions may hold anything, NaN in tests), but masked slots get a
 * score of -inf and are skipped in the V sum, so they never reach the output.
 */
#include "krn_cuda.cuh"
#include "krn_hostdev.h"
#include "krn_softmax_merge.h"

#define DEC_MAX_O 64 /* accumulators per lane: group * head_dim / 32 */

/* KT: __half or float elements, or uint8_t for a q8_0 pool (rows of 34-byte blocks, read in
 * place: scores by krn_q8_0_score against the query quantized once per CTA, V as d * q). */
template <typename KT>
__global__ void __launch_bounds__(128) decode_kernel(krn_decode_args_t a, int32_t n_warps)
{
    constexpr bool Q8 = sizeof(KT) == 1;
    constexpr enum krn_dtype DT = Q8 ? KRN_Q8_0 : sizeof(KT) == 4 ? KRN_F32 : KRN_F16;
    extern __shared__ uint4 dsm[];
    const int32_t hd = a.kv.head_dim, bt = a.kv.block_tokens;
    const int32_t group = a.n_head / a.kv.n_head_kv, kh = blockIdx.y;
    const int32_t r = (int32_t)(blockIdx.x / (unsigned)a.max_splits);
    const int32_t split = (int32_t)(blockIdx.x % (unsigned)a.max_splits);
    const int32_t pos = a.row_pos[r];
    if (pos < 0 || pos >= a.max_blocks * bt || pos / a.split_tokens >= a.max_splits)
        return; /* not a valid row: the host sized max_splits from the positions */
    const int32_t p0 = split * a.split_tokens;
    if (p0 > pos)
        return; /* this row has fewer splits */
    const int32_t p1 = min(p0 + a.split_tokens, pos + 1);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int32_t words = (int32_t)(krn_decode_slice_bytes(hd, bt, DT) / 16);
    const int32_t qw = a.n_head * hd, KD = hd / 32;
    const size_t rb = (size_t)KD * KRN_Q8_0_BYTES; /* q8_0: bytes of a K or V row */

    /* Shared memory (krn_decode_smem_of): q, (q8_0) its scales, the staging (later the warps'
     * o), per warp the scores and m, l, corr. */
    float *sq = (float *)dsm;     /* [group][hd] (q8_0: the quants) */
    float *sqd = sq + group * hd; /* q8_0: [group][hd / 32] the query's scales */
    uint4 *stage = (uint4 *)(sqd + krn_decode_qd_floats(hd, group, DT));
    size_t stage_bytes = (size_t)n_warps * words * 16;
    size_t comb_bytes = (size_t)n_warps * group * hd * sizeof(float);
    float *wsm = (float *)((char *)stage + (stage_bytes > comb_bytes ? stage_bytes : comb_bytes));
    const int32_t wstride = group * bt + 3 * group;
    float *ssc = wsm + warp * wstride; /* [group][bt] */
    float *s_m = ssc + group * bt, *s_l = s_m + group, *s_c = s_l + group;

    for (int32_t i = tid; i < group * hd; i += blockDim.x)
        sq[i] = a.q[(int64_t)r * qw + (int64_t)kh * group * hd + i];
    if constexpr (Q8) { /* each 32-value block of the group's queries, quantized in place */
        __syncthreads();
        for (int32_t b = tid; b < group * KD; b += blockDim.x)
            krn_q8_0_quantize_f(sq + b * KRN_QK8_0, sq + b * KRN_QK8_0, &sqd[b]);
    }
    for (int32_t g = lane; g < group; g += 32) {
        s_m[g] = -INFINITY;
        s_l[g] = 0.0f;
    }
    float o[DEC_MAX_O];
#pragma unroll
    for (int i = 0; i < DEC_MAX_O; i++)
        o[i] = 0.0f;
    __syncthreads();

    const int32_t *table = a.block_tables + (int64_t)a.row_seq[r] * a.max_blocks;
    uint4 *wst = stage + (size_t)warp * words;
    const KT *kst = (const KT *)wst;            /* K [hd][bt] */
    const KT *vst = kst + (size_t)hd * bt;      /* V [bt][hd] */
    const int32_t nb = (p1 - p0 + bt - 1) / bt; /* p0 is a multiple of bt */
    for (int32_t b = warp; b < nb; b += n_warps) {
        const int32_t pb = p0 + b * bt, n = min(bt, p1 - pb);
        const int32_t block = table[pb / bt];
        if (block < 0 || block >= a.kv.n_blocks)
            continue; /* the host checked its tables; never a stray read */
        const int64_t base = (((int64_t)block * a.kv.n_layer + a.layer) * a.kv.n_head_kv + kh) *
                             (int64_t)words * 16; /* bytes */
        const uint4 *src = (const uint4 *)((const uint8_t *)a.kv.base + base);
        __syncwarp(); /* the previous block is done with the staging */
        for (int32_t i = lane; i < words; i += 32)
            wst[i] = src[i];
        __syncwarp();
        for (int32_t i = lane; i < group * bt; i += 32) {
            int32_t g = i / bt, j = i % bt;
            float s = -INFINITY;
            if (j < n) {
                const float *qg = sq + g * hd;
                float acc = 0.0f;
                if constexpr (Q8)
                    acc = krn_q8_0_score(qg, sqd + g * KD, (const uint8_t *)wst + j * rb, hd);
                else
                    for (int32_t d = 0; d < hd; d++)
                        acc = fmaf(qg[d], krn_ld(kst, (int64_t)d * bt + j), acc);
                s = acc;
            }
            ssc[i] = s;
        }
        __syncwarp();
        for (int32_t g = 0; g < group; g++) {
            float tmax = -INFINITY;
            for (int32_t j = lane; j < n; j += 32)
                tmax = fmaxf(tmax, ssc[g * bt + j]);
            for (int off = 16; off > 0; off /= 2)
                tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
            const float m_old = s_m[g];
            const float mn = krn_sm_max(m_old, tmax), c = krn_sm_scale(m_old, mn);
            float sum = 0.0f;
            for (int32_t j = lane; j < n; j += 32) {
                float p = krn_sm_prob(ssc[g * bt + j], mn);
                ssc[g * bt + j] = p;
                sum += p;
            }
            for (int off = 16; off > 0; off /= 2)
                sum += __shfl_xor_sync(0xffffffffu, sum, off);
            __syncwarp(); /* every lane has read s_m[g] */
            if (lane == 0) {
                s_l[g] = s_l[g] * c + sum;
                s_m[g] = mn;
                s_c[g] = c;
            }
        }
        __syncwarp();
#pragma unroll
        for (int i = 0; i < DEC_MAX_O; i++) {
            const int32_t g = i / KD, d = lane + 32 * (i % KD);
            if (g < group) {
                const float *pg = ssc + g * bt;
                float acc = o[i] * s_c[g];
                if constexpr (Q8) {
                    /* Lane l reads quant l of block i % KD of each V row (d = that block's
                     * lane-th value). */
                    const uint8_t *vb =
                        (const uint8_t *)wst + (size_t)bt * rb + (size_t)(i % KD) * KRN_Q8_0_BYTES;
                    for (int32_t j = 0; j < n; j++, vb += rb)
                        acc = fmaf(pg[j], krn_q8_0_d_of(vb) * (float)(int8_t)vb[2 + lane], acc);
                } else {
                    for (int32_t j = 0; j < n; j++)
                        acc = fmaf(pg[j], krn_ld(vst, (int64_t)j * hd + d), acc);
                }
                o[i] = acc;
            }
        }
    }

    /* The warps' states, merged in warp order. */
    __syncthreads();              /* every warp is done with the staging */
    float *comb = (float *)stage; /* [n_warps][group][hd] */
#pragma unroll
    for (int i = 0; i < DEC_MAX_O; i++) {
        const int32_t g = i / KD, d = lane + 32 * (i % KD);
        if (g < group)
            comb[((size_t)warp * group + g) * hd + d] = o[i];
    }
    __syncthreads();
    for (int32_t i = tid; i < group * hd; i += blockDim.x) {
        const int32_t g = i / hd, d = i % hd;
        float m = -INFINITY, l = 0.0f, acc = 0.0f;
        for (int32_t w = 0; w < n_warps; w++) {
            const float *ws = wsm + w * wstride + group * bt;
            float sa, sb;
            krn_sm_merge(&m, &l, ws[g], ws[group + g], &sa, &sb);
            acc = acc * sa + comb[((size_t)w * group + g) * hd + d] * sb;
        }
        const int64_t head = (int64_t)kh * group + g;
        if (a.max_splits == 1) {
            a.out[(int64_t)r * qw + head * hd + d] = acc * krn_sm_inv(l);
        } else {
            const int64_t slot = ((int64_t)r * a.n_head + head) * a.max_splits + split;
            a.part_o[slot * hd + d] = acc;
            if (d == 0) {
                a.part_ml[2 * slot] = m;
                a.part_ml[2 * slot + 1] = l;
            }
        }
    }
}

__global__ void __launch_bounds__(128) decode_merge_kernel(krn_decode_args_t a)
{
    const int32_t r = blockIdx.x, h = blockIdx.y, hd = a.kv.head_dim;
    const int32_t pos = a.row_pos[r];
    if (pos < 0 || pos >= a.max_blocks * a.kv.block_tokens || pos / a.split_tokens >= a.max_splits)
        return;
    const int32_t n_splits = pos / a.split_tokens + 1;
    const int64_t slot0 = ((int64_t)r * a.n_head + h) * a.max_splits;
    for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float m = -INFINITY, l = 0.0f, o = 0.0f;
        for (int32_t s = 0; s < n_splits; s++) {
            float sa, sb;
            krn_sm_merge(&m, &l, a.part_ml[2 * (slot0 + s)], a.part_ml[2 * (slot0 + s) + 1], &sa,
                         &sb);
            o = o * sa + a.part_o[(slot0 + s) * hd + d] * sb;
        }
        a.out[(int64_t)r * a.n_head * hd + (int64_t)h * hd + d] = o * krn_sm_inv(l);
    }
}

int krn_decode_attention(krn_ctx_t *c, const krn_decode_args_t *a)
{
    const krn_kv_t *kv = &a->kv;
    if (krn_decode_check(kv, a->n_head) != 0 || a->layer < 0 || a->layer >= kv->n_layer ||
        a->n_rows < 0 || a->max_blocks <= 0 || a->split_tokens <= 0 ||
        a->split_tokens % kv->block_tokens != 0 || a->max_splits <= 0 ||
        (int64_t)a->n_rows * a->max_splits > INT32_MAX || kv->n_head_kv > 65535 ||
        a->n_head > 65535 || (a->max_splits > 1 && (a->part_o == NULL || a->part_ml == NULL)))
        return PC_ERR_INVAL;
    if (a->n_rows == 0)
        return 0;
    KRN_ENTER(c);
    const int32_t group = a->n_head / kv->n_head_kv;
    const int32_t warps =
        krn_decode_warps_of(krn_decode_slice_bytes(kv->head_dim, kv->block_tokens, kv->dtype));
    const size_t smem = krn_decode_smem_of(kv->head_dim, kv->block_tokens, kv->dtype, group);
    dim3 grid((unsigned)((int64_t)a->n_rows * a->max_splits), (unsigned)kv->n_head_kv);
    if (kv->dtype == KRN_Q8_0) {
        KRN_CUDA_CHECK(cudaFuncSetAttribute(
            decode_kernel<uint8_t>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        decode_kernel<uint8_t><<<grid, (unsigned)warps * 32, smem, c->stream>>>(*a, warps);
    } else if (kv->dtype == KRN_F16) {
        KRN_CUDA_CHECK(cudaFuncSetAttribute(
            decode_kernel<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        decode_kernel<__half><<<grid, (unsigned)warps * 32, smem, c->stream>>>(*a, warps);
    } else {
        KRN_CUDA_CHECK(cudaFuncSetAttribute(
            decode_kernel<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        decode_kernel<float><<<grid, (unsigned)warps * 32, smem, c->stream>>>(*a, warps);
    }
    KRN_CUDA_CHECK(cudaGetLastError());
    if (a->max_splits > 1) {
        decode_merge_kernel<<<dim3((unsigned)a->n_rows, (unsigned)a->n_head), 128, 0, c->stream>>>(
            *a);
        KRN_CUDA_CHECK(cudaGetLastError());
    }
    return 0;
}
