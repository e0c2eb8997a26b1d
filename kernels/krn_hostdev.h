/*
 * krn_hostdev.h — small pieces of the kernels' arithmetic compiled both by the host C compiler
 * and by nvcc for the device, so that the CUDA kernels, the host code that launches them and
 * the CPU references run the very same code, and the CPU unit tests exercise it:
 *
 *   - the paged attention kernel's tile geometry (rows per CTA, KV slots per chunk) and its
 *     dynamic shared memory size, which krn_attn_plan sizes its tasks by: a task the plan makes
 *     always fits the CTA that runs it;
 *   - the sampler's candidate key, whose order is the engine's candidate order (logit
 *     descending, then id ascending; engine/sampling.h), the +inf clamp, and its final pick
 *     (which thread owns the target, and that thread's walk).
 *
 * The online-softmax merge has its own header (krn_softmax_merge.h).
 */
#ifndef KRN_HOSTDEV_H
#define KRN_HOSTDEV_H

#include <float.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

#ifndef KRN_HD
#ifdef __CUDACC__
#define KRN_HD __host__ __device__ __forceinline__
#else
#define KRN_HD static inline
#endif
#endif

/* Threads of one attention CTA. */
#define KRN_ATTN_THREADS 128

/* KV slots of one attention chunk for head_dim (even, in [2, KRN_ATTN_MAX_HEAD_DIM]): at most
 * 32 (one per lane of the warp that runs a row's softmax update) and chunk * head_dim <= 4096
 * (the K and V tiles in shared memory). */
KRN_HD int32_t krn_attn_chunk(int32_t head_dim)
{
    int32_t c = 4096 / head_dim;
    return c > 32 ? 32 : c;
}

/* The most row-heads (tokens x query heads of a group) one CTA holds: KRN_ATTN_MAX_ROWS, and
 * rows * head_dim <= KRN_ATTN_MAX_TILE (the query tile and the per-thread accumulators). */
KRN_HD int32_t krn_attn_max_rows(int32_t head_dim)
{
    int32_t r = KRN_ATTN_MAX_TILE / head_dim;
    return r < KRN_ATTN_MAX_ROWS ? r : KRN_ATTN_MAX_ROWS;
}

/* Dynamic shared memory of an attention CTA, laid out as the kernel carves it:
 *   Q [r_max][hd] | K [hd][C] | V [C][hd] | S [r_max][C] | m, l, c [r_max] each   (floats)
 *   | pos [r_max]                                                                (int32)  */
KRN_HD size_t krn_attn_smem_bytes(int32_t head_dim)
{
    size_t r = (size_t)krn_attn_max_rows(head_dim), c = (size_t)krn_attn_chunk(head_dim);
    size_t hd = (size_t)head_dim;
    return sizeof(float) * (r * hd + 2 * c * hd + r * c + 3 * r) + sizeof(int32_t) * r;
}

/* The split-KV decode kernel (krn_decode.cu): 16-byte words of one block's K+V slice, which a
 * warp stages in shared memory. */
KRN_HD int32_t krn_decode_slice_words(int32_t head_dim, int32_t block_tokens, int32_t elem_bytes)
{
    return (int32_t)((int64_t)2 * head_dim * block_tokens * elem_bytes / 16);
}
/* Warps of a decode CTA: 4, fewer when 4 block slices would not fit 64 KiB of staging. */
KRN_HD int32_t krn_decode_warps(int32_t head_dim, int32_t block_tokens, int32_t elem_bytes)
{
    int64_t slice = (int64_t)2 * head_dim * block_tokens * elem_bytes;
    int64_t w = slice > 0 ? ((int64_t)64 << 10) / slice : 0;
    return w >= 4 ? 4 : (int32_t)w;
}
/* Dynamic shared memory of a decode CTA, laid out as the kernel carves it:
 *   q [group][hd] | stage: max(warps slices, warps * group * hd floats) | per warp:
 *   scores [group][bt], m, l, corr [group]                                     (floats) */
KRN_HD size_t krn_decode_smem_bytes(int32_t head_dim, int32_t block_tokens, int32_t elem_bytes,
                                    int32_t group)
{
    size_t w = (size_t)krn_decode_warps(head_dim, block_tokens, elem_bytes);
    size_t slice = (size_t)2 * head_dim * block_tokens * elem_bytes;
    size_t comb = w * (size_t)group * head_dim * sizeof(float);
    size_t stage = w * slice > comb ? w * slice : comb;
    return sizeof(float) * (size_t)group * head_dim + stage +
           sizeof(float) * w * ((size_t)group * block_tokens + 3 * (size_t)group);
}

/* A logit as a candidate's weight sees it: +inf counts as the largest finite float. */
KRN_HD float krn_sample_clamp(float x)
{
    return x > FLT_MAX ? FLT_MAX : x;
}

/* The 64-bit key of candidate (x, id): a larger key comes first in the engine's order (higher
 * logit, then lower id). The high half maps the float's bits to an unsigned order-preserving
 * integer (negative floats reversed); -0 is taken as +0 first, since the engine compares logits
 * as floats (-0 == +0: a tie, broken by id). The low half is 0xffffffff - id. Never 0 for an id
 * in [0, 2^31), so 0 can mean "no candidate". */
KRN_HD uint64_t krn_sample_key(float x, int32_t id)
{
    float xc = x == 0.0f ? 0.0f : x;
    uint32_t u;
#ifdef __CUDA_ARCH__
    u = __float_as_uint(xc);
#else
    memcpy(&u, &xc, sizeof u);
#endif
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)u << 32) | (uint64_t)(0xffffffffu - (uint32_t)id);
}

/* The id of a key made by krn_sample_key. */
KRN_HD int32_t krn_sample_key_id(uint64_t key)
{
    return (int32_t)(0xffffffffu - (uint32_t)(key & 0xffffffffu));
}

/*
 * The sampler's final pick over the kept candidates (weight w[i] > 0 and key >= lo), cut into
 * contiguous id ranges ("chunks", one per CUDA thread): chunk t holds the sum `local` of its
 * weights and `before`, the sum of the chunks before it as a parallel scan computed it. The
 * target is u times the scan's total. A scan in floating point need not be monotone across
 * chunks, so "the chunk whose [before, before + local) holds the target" may be no chunk or
 * two. Instead the owner is the LAST chunk with positive mass whose start is <= target: a
 * unique chunk (a maximum over chunk indices), and one always exists when any chunk has
 * positive mass, since the first such chunk starts at exactly 0 (a sum of zeros) and the
 * target is >= 0.
 */
KRN_HD bool krn_sample_may_own(double before, double local, double target)
{
    return local > 0.0 && before <= target;
}

/* The owner's walk over its chunk [i0, i1): the first kept id whose running sum from `before`
 * exceeds the target, else the chunk's last kept id (the sums rounded below the target).
 * Never -1 when the chunk has a kept positive weight; -1 only for a chunk without one. x and
 * w are the row's logits and weights (host or device memory, as the caller runs). */
KRN_HD int32_t krn_sample_walk(const float *x, const double *w, int32_t i0, int32_t i1, uint64_t lo,
                               double before, double target)
{
    double cum = before;
    int32_t last = -1;
    for (int32_t i = i0; i < i1; i++) {
        if (w[i] > 0.0 && krn_sample_key(krn_sample_clamp(x[i]), i) >= lo) {
            cum += w[i];
            last = i;
            if (target < cum)
                return i;
        }
    }
    return last;
}

#endif
