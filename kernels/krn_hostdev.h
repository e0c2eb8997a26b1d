/*
 * krn_hostdev.h — small pieces of the kernels' arithmetic compiled both by the host C compiler
 * and by nvcc for the device, so that the CUDA kernels, the host code that launches them and
 * the CPU references run the very same code, and the CPU unit tests exercise it:
 *
 *   - the paged attention kernel's tile geometry (rows per CTA, KV slots per chunk) and its
 *     dynamic shared memory size, which krn_attn_plan sizes its tasks by: a task the plan makes
 *     always fits the CTA that runs it;
 *   - the sampler's candidate key, whose order is the engine's candidate order (logit
 *     descending, then id ascending; engine/sampling.h), and the +inf clamp.
 *
 * The online-softmax merge has its own header (krn_softmax_merge.h).
 */
#ifndef KRN_HOSTDEV_H
#define KRN_HOSTDEV_H

#include <float.h>
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

#endif
