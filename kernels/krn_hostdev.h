/*
 * krn_hostdev.h — small pieces of the kernels' arithmetic compiled both by the host C compiler
 * and by nvcc for the device, so that the CUDA kernels, the host code that launches them and
 * the CPU references run the very same code, and the CPU unit tests exercise it:
 *
 *   - the paged attention kernel's tile geometry (rows per CTA, KV slots per chunk) and its
 *     dynamic shared memory size, which krn_attn_plan sizes its tasks by: a task the plan makes
 *     always fits the CTA that runs it;
 *   - the tensor-core prefill kernel's fragment maps (mma.sync m16n8k16, ldmatrix), tile
 *     geometry, shared memory layout, load rules and causal mask (krn_attn_tc.cu), which
 *     test_krn_tc runs in a warp-by-warp emulation of the kernel;
 *   - the sampler's candidate key, whose order is the engine's candidate order (logit
 *     descending, then id ascending; engine/sampling.h), the +inf clamp, and its final pick
 *     (which thread owns the target, and that thread's walk).
 *
 * The online-softmax merge has its own header (krn_softmax_merge.h).
 */
#ifndef KRN_HOSTDEV_H
#define KRN_HOSTDEV_H

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

#ifdef __CUDACC__
#include <cuda_fp16.h>
#endif

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

/* The same for a pool of dtype t: a q8_0 CTA also keeps its query's scales, [r_max][head_dim /
 * 32] floats after pos (its query tile holds the quants as floats, its K tile the chunk's raw
 * q8_0 rows, C x head_dim / 32 x 34 bytes, in the K tile's room). */
KRN_HD size_t krn_attn_smem_bytes_of(int32_t head_dim, enum krn_dtype t)
{
    size_t extra = t == KRN_Q8_0 ? sizeof(float) * (size_t)krn_attn_max_rows(head_dim) *
                                       (size_t)(head_dim / KRN_QK8_0)
                                 : 0;
    return krn_attn_smem_bytes(head_dim) + extra;
}

/*
 * The tensor-core prefill attention kernel (krn_attn_tc.cu): FlashAttention-2's loop on
 * mma.sync.m16n8k16 (F16 inputs, F32 accumulation). A krn_attn_plan task holds at most
 * KRN_TC_ROWS row-heads (tokens x the query heads of the group). A CTA of `warps` warps (4 or
 * 8: krn_attn_tc_warps) runs rows of warps * 16 row-heads (warp w owns rows 16w .. 16w + 15):
 * with 4 warps one task; with 8 warps two consecutive tasks, joined into one of up to 128 rows
 * when krn_tc_pair allows (each K/V tile then serves twice the rows), else one after the
 * other. It walks the KV positions in tiles of krn_tc_tile_kv positions, double buffered in
 * shared memory:
 *
 *   Q [warps * 16][hd_max + KRN_TC_PAD]           halves, row r = row-head r, col = dimension
 *   K [2][hd_max][tile + KRN_TC_PAD]              halves, row = dimension, col = position
 *   V [2][tile][hd_max + KRN_TC_PAD]              halves, row = position, col = dimension
 *
 * K keeps the pool's transposed layout, so both products read their B operand from a [k][n]
 * array whose n is contiguous (ldmatrix .trans); the pad of 8 halves makes the 8 row
 * addresses of every ldmatrix fall on distinct banks. hd_max is the compiled head-dim class
 * (krn_tc_hd_class): 64, 128 or 256; a head_dim below it runs with its k-steps and output
 * tiles cut at head_dim.
 *
 * The fragment maps below are the PTX ISA's ("Matrix Fragments for mma.m16n8k16 with floating
 * point type", "Warp-level matrix load instruction: ldmatrix"); the kernel derives every lane's
 * row, column and address from them, and the host tests emulate one warp with them.
 */
/* Row-heads of one plan task at most (krn_attn_tc_check), and the most warps of a CTA. */
#define KRN_TC_ROWS 64
#define KRN_TC_MAX_WARPS 8
#define KRN_TC_PAD 8
/* KV positions per tile for a head-dim class (a constant expression for the kernel). */
#define KRN_TC_TILE_KV(hd_max) ((hd_max) > 128 ? 32 : 64)

KRN_HD int32_t krn_tc_tile_kv(int32_t hd_max)
{
    return KRN_TC_TILE_KV(hd_max);
}
/* The compiled head-dim class a head_dim (a multiple of 16 up to 256) runs with. */
KRN_HD int32_t krn_tc_hd_class(int32_t head_dim)
{
    return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256;
}
/* Dynamic shared memory of a CTA of class hd_max and `warps` warps (layout above), in bytes. */
KRN_HD size_t krn_tc_smem_bytes(int32_t hd_max, int32_t warps)
{
    size_t bc = (size_t)krn_tc_tile_kv(hd_max), h = (size_t)hd_max;
    return 2 * ((size_t)warps * 16 * (h + KRN_TC_PAD) +
                2 * (h * (bc + KRN_TC_PAD) + bc * (h + KRN_TC_PAD)));
}

/* m16n8k16 fragments: lane l holds, with g = l / 4 and t = l % 4,
 *   A (16 x 16, row major; 8 halves a0..a7 in 4 registers, low half first):
 *     row g for a0, a1, a4, a5, g + 8 for the others; col 2t + (i & 1), + 8 for a4..a7
 *   B (16 x 8, k x n; 4 halves b0..b3 in 2 registers): row (k) 2t + (i & 1), + 8 for b2, b3;
 *     col (n) g
 *   C, D (16 x 8, F32 c0..c3): row g for c0, c1, g + 8 for c2, c3; col 2t + (i & 1). */
KRN_HD int32_t krn_mma_a_row(int32_t lane, int32_t i)
{
    return (lane >> 2) + ((i & 2) ? 8 : 0);
}
KRN_HD int32_t krn_mma_a_col(int32_t lane, int32_t i)
{
    return (lane & 3) * 2 + (i & 1) + ((i & 4) ? 8 : 0);
}
KRN_HD int32_t krn_mma_b_row(int32_t lane, int32_t i)
{
    return (lane & 3) * 2 + (i & 1) + ((i & 2) ? 8 : 0);
}
KRN_HD int32_t krn_mma_b_col(int32_t lane, int32_t i)
{
    (void)i;
    return lane >> 2;
}
KRN_HD int32_t krn_mma_c_row(int32_t lane, int32_t i)
{
    return (lane >> 2) + ((i & 2) ? 8 : 0);
}
KRN_HD int32_t krn_mma_c_col(int32_t lane, int32_t i)
{
    return (lane & 3) * 2 + (i & 1);
}
/* ldmatrix .x4 over a 16 x 16 tile of halves: lane l gives the address of row l % 8 of matrix
 * l / 8, the matrices being (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15)
 * and (rows 8-15, cols 8-15); these are that row's coordinates in the tile. Register j of
 * lane l then receives from matrix j the halves (row l / 4, cols 2(l % 4) and + 1), or with
 * .trans (rows 2(l % 4) and + 1, col l / 4). Without .trans on a row-major A tile the four
 * registers are the A fragment; with .trans on a [k][n] tile, registers 0-1 are the B
 * fragment of columns 0-7 and registers 2-3 that of columns 8-15. */
KRN_HD int32_t krn_ldm_x4_row(int32_t lane)
{
    return (lane & 7) + ((lane & 8) ? 8 : 0);
}
KRN_HD int32_t krn_ldm_x4_col(int32_t lane)
{
    return (lane & 16) ? 8 : 0;
}

/* CTAs of a launch over n_tasks tasks: one per task with 4 warps, one per two with 8. CTA c
 * takes the task(s) counted from the end (the longest first): hi = n_tasks - 1 - c * per and,
 * with 8 warps, lo = hi - 1 when >= 0. */
KRN_HD int32_t krn_tc_ctas(int32_t n_tasks, int32_t warps)
{
    int32_t per = warps / 4;
    return (n_tasks + per - 1) / per;
}
/* Whether an 8-warp CTA runs plan tasks lo and hi as one task of their joined rows: lo's
 * rows come right before hi's in one sequence and KV head, both hold more than one token and
 * write the output directly, both start at the same kv0 and read every position their rows
 * see (kv1 >= last position + 1, given as lo_last_pos / hi_last_pos), and the joined
 * row-heads fit rows_max. Then *out is the joined task (its rows see what they saw). */
KRN_HD bool krn_tc_pair(const krn_attn_task_t *lo, const krn_attn_task_t *hi, int32_t group,
                        int32_t lo_last_pos, int32_t hi_last_pos, int32_t rows_max,
                        krn_attn_task_t *out)
{
    if (lo->seq != hi->seq || lo->kv_head != hi->kv_head || lo->row0 + lo->n_rows != hi->row0 ||
        lo->n_rows <= 1 || hi->n_rows <= 1 || lo->part >= 0 || hi->part >= 0 ||
        lo->kv0 != hi->kv0 || lo->kv1 < lo_last_pos + 1 || hi->kv1 < hi_last_pos + 1 ||
        (int64_t)(lo->n_rows + hi->n_rows) * group > rows_max)
        return false;
    *out = *lo;
    out->n_rows = lo->n_rows + hi->n_rows;
    out->kv1 = lo->kv1 > hi->kv1 ? lo->kv1 : hi->kv1;
    return true;
}

/* The first KV tile of a task's range [kv0, ...): tiles start at multiples of the tile size,
 * so every 8-position chunk of a tile lies in one KV block (block_tokens % 8 == 0). */
KRN_HD int32_t krn_tc_first_tile(int32_t kv0, int32_t tile)
{
    return kv0 / tile * tile;
}
/* The end of the positions a task reads: its KV range cut at its last row's position + 1. */
KRN_HD int32_t krn_tc_kv_end(int32_t kv1, int32_t last_pos)
{
    return kv1 < last_pos + 1 ? kv1 : last_pos + 1;
}
/* Whether a row at position row_pos sees position p of a task reading [kv0, kv_end). A row
 * past the task's rows has row_pos -1 and sees nothing. */
KRN_HD bool krn_tc_visible(int32_t p, int32_t kv0, int32_t kv_end, int32_t row_pos)
{
    return p >= kv0 && p < kv_end && p <= row_pos;
}
/* Whether the 8-position K chunk at p (a multiple of 8) is copied from the pool: it holds a
 * position of [kv0, kv_end). Its other positions (in the same block, maybe unwritten) only
 * reach scores that are masked. Otherwise the chunk is zero-filled. */
KRN_HD bool krn_tc_k_chunk_live(int32_t p, int32_t kv0, int32_t kv_end)
{
    return p < kv_end && p + 8 > kv0;
}
/* Whether the V row of position p is copied: p in [kv0, kv_end). Others are zero-filled, so
 * that a zero weight never meets an unwritten (NaN) slot. */
KRN_HD bool krn_tc_v_row_live(int32_t p, int32_t kv0, int32_t kv_end)
{
    return p >= kv0 && p < kv_end;
}
/* Element offset in the pool of the K chunk (dimension d, positions p .. p + 7) and of the V
 * row piece (position p, dimensions d .. d + 7), in the slice starting at slice_base. */
KRN_HD int64_t krn_tc_k_off(int64_t slice_base, int32_t d, int32_t p, int32_t block_tokens)
{
    return slice_base + (int64_t)d * block_tokens + p % block_tokens;
}
KRN_HD int64_t krn_tc_v_off(int64_t slice_base, int32_t d, int32_t p, int32_t head_dim,
                            int32_t block_tokens)
{
    return slice_base + (int64_t)head_dim * block_tokens + (int64_t)(p % block_tokens) * head_dim +
           d;
}
/* A softmax weight exp(s - m) as exp2 of a scaled difference (one FFMA-friendly exp2 on the
 * device); 0 for a masked score, or when the row has seen nothing (m = -inf). */
KRN_HD float krn_tc_prob(float s, float m)
{
    if (s == -INFINITY || m == -INFINITY)
        return 0.0f;
    return exp2f((s - m) * 1.4426950408889634f);
}

/* The split-KV decode kernel (krn_decode.cu). Bytes of one block's K+V slice of a pool of dtype
 * t (kernels.h's layouts), which a warp stages in shared memory. */
KRN_HD int64_t krn_decode_slice_bytes(int32_t head_dim, int32_t block_tokens, enum krn_dtype t)
{
    if (t == KRN_Q8_0)
        return (int64_t)2 * block_tokens * (head_dim / KRN_QK8_0) * KRN_Q8_0_BYTES;
    return (int64_t)2 * head_dim * block_tokens * (t == KRN_F32 ? 4 : 2);
}
/* 16-byte words of an F16 or F32 slice (elem_bytes 2 or 4). */
KRN_HD int32_t krn_decode_slice_words(int32_t head_dim, int32_t block_tokens, int32_t elem_bytes)
{
    return (int32_t)((int64_t)2 * head_dim * block_tokens * elem_bytes / 16);
}
/* Warps of a decode CTA staging slices of slice_bytes: 4, fewer when 4 slices would not fit 64
 * KiB of staging. */
KRN_HD int32_t krn_decode_warps_of(int64_t slice_bytes)
{
    int64_t w = slice_bytes > 0 ? ((int64_t)64 << 10) / slice_bytes : 0;
    return w >= 4 ? 4 : (int32_t)w;
}
KRN_HD int32_t krn_decode_warps(int32_t head_dim, int32_t block_tokens, int32_t elem_bytes)
{
    return krn_decode_warps_of((int64_t)2 * head_dim * block_tokens * elem_bytes);
}
/* Floats of a q8_0 decode CTA's query scales, [group][head_dim / 32] rounded up to 4 floats
 * (the staging after them stays 16-byte aligned); 0 for other pools. */
KRN_HD int32_t krn_decode_qd_floats(int32_t head_dim, int32_t group, enum krn_dtype t)
{
    return t == KRN_Q8_0 ? (group * (head_dim / KRN_QK8_0) + 3) / 4 * 4 : 0;
}
/* Dynamic shared memory of a decode CTA, laid out as the kernel carves it:
 *   q [group][hd] | q8_0 only: query scales (krn_decode_qd_floats) | stage: max(warps
 *   slices, warps * group * hd floats) | per warp: scores [group][bt], m, l, corr [group]
 *   (floats; a q8_0 CTA keeps its query's quants in q) */
KRN_HD size_t krn_decode_smem_of(int32_t head_dim, int32_t block_tokens, enum krn_dtype t,
                                 int32_t group)
{
    int64_t slice = krn_decode_slice_bytes(head_dim, block_tokens, t);
    size_t w = (size_t)krn_decode_warps_of(slice);
    size_t comb = w * (size_t)group * head_dim * sizeof(float);
    size_t stage = w * (size_t)slice > comb ? w * (size_t)slice : comb;
    return sizeof(float) *
               ((size_t)group * head_dim + (size_t)krn_decode_qd_floats(head_dim, group, t)) +
           stage + sizeof(float) * w * ((size_t)group * block_tokens + 3 * (size_t)group);
}
/* krn_decode_smem_of for an F16 (elem_bytes 2) or F32 (4) pool. */
KRN_HD size_t krn_decode_smem_bytes(int32_t head_dim, int32_t block_tokens, int32_t elem_bytes,
                                    int32_t group)
{
    return krn_decode_smem_of(head_dim, block_tokens, elem_bytes == 4 ? KRN_F32 : KRN_F16, group);
}

/*
 * q8_0 KV (kernels.h): the steps of quantizing one block of 32 values, shared by the host
 * quantizer (krn_q8_0_quantize, the references), the KV write kernels (a warp per block, lane
 * i holding value i) and the attention kernels' query quantization (a thread per block), so
 * every one of them writes the bytes of the engine's eng_kv_q8_0_quantize. The device forms
 * use the _rn intrinsics so that nvcc cannot fuse the product into a neighbouring add.
 */
/* The scale of a block whose largest |value| is amax, as F32 (before its F16 rounding). */
KRN_HD float krn_q8_0_scale(float amax)
{
#ifdef __CUDA_ARCH__
    return __fdiv_rn(amax, 127.0f);
#else
    return amax / 127.0f;
#endif
}
/* The multiplier of the values: 1 / d, 0 for an all-zero block. d is the F32 scale (the
 * quants are computed with it; the block stores its F16 rounding, as ggml does). */
KRN_HD float krn_q8_0_inv(float d)
{
#ifdef __CUDA_ARCH__
    return d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
#else
    return d != 0.0f ? 1.0f / d : 0.0f;
#endif
}
/* The quant of x: round(x * id), halves away from zero; a NaN or out-of-range product is 0. */
KRN_HD int8_t krn_q8_0_quant(float x, float id)
{
#ifdef __CUDA_ARCH__
    float v = __fmul_rn(x, id);
#else
    float v = x * id;
#endif
    v = v >= -128.0f && v <= 128.0f ? v : 0.0f;
    return (int8_t)(int32_t)roundf(v);
}
/* The F16 bits of the stored scale, and the F32 value of stored F16 bits. */
KRN_HD uint16_t krn_q8_0_d_bits(float d)
{
#ifdef __CUDA_ARCH__
    return __half_as_ushort(__float2half_rn(d));
#else
    return krn_f32_to_f16(d);
#endif
}
KRN_HD float krn_hd_f16_to_f32(uint16_t bits)
{
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(bits));
#else
    return krn_f16_to_f32(bits);
#endif
}
/* The stored scale of the q8_0 block at blk (2-byte aligned), as F32. */
KRN_HD float krn_q8_0_d_of(const uint8_t *blk)
{
    return krn_hd_f16_to_f32((uint16_t)(blk[0] | (blk[1] << 8)));
}
/* One block x[32] quantized, with its quants as floats (qf[32], integers in [-128, 127]) and its
 * stored scale as F32 (*d_out): the attention's query, whose products with K's quants are then
 * exact in F32 (|sum| <= 32 x 128 x 128 < 2^24). */
KRN_HD void krn_q8_0_quantize_f(const float *x, float *qf, float *d_out)
{
    float amax = 0.0f;
    for (int32_t i = 0; i < KRN_QK8_0; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    float d = krn_q8_0_scale(amax), id = krn_q8_0_inv(d);
    for (int32_t i = 0; i < KRN_QK8_0; i++)
        qf[i] = (float)krn_q8_0_quant(x[i], id);
    *d_out = krn_hd_f16_to_f32(krn_q8_0_d_bits(d));
}

/* The score of a query head against one q8_0 K row (head_dim / 32 blocks at krow): per block
 * the exact integer dot of the quants (qf holds the query's quants as floats, qd[head_dim /
 * 32] its scales, from krn_q8_0_quantize_f), times d_q * d_k, summed over the blocks in order:
 * the CPU attention's q8_0 score. */
KRN_HD float krn_q8_0_score(const float *qf, const float *qd, const uint8_t *krow, int32_t head_dim)
{
    float acc = 0.0f;
    for (int32_t b = 0; b < head_dim / KRN_QK8_0; b++) {
        const uint8_t *kb = krow + (size_t)b * KRN_Q8_0_BYTES;
        const float *qb = qf + (size_t)b * KRN_QK8_0;
        float s = 0.0f;
        for (int32_t i = 0; i < KRN_QK8_0; i++)
            s += qb[i] * (float)(int8_t)kb[2 + i];
        acc += qd[b] * krn_q8_0_d_of(kb) * s;
    }
    return acc;
}

/* The value of K (is_v false) or V at (slot, dimension d) of a slice (its first byte), any
 * dtype of the pool: what the references and the tests read. */
KRN_HD float krn_kv_value(const krn_kv_t *kv, const uint8_t *slice, bool is_v, int32_t slot,
                          int32_t d)
{
    int32_t hd = kv->head_dim, bt = kv->block_tokens;
    if (kv->dtype == KRN_Q8_0) {
        const uint8_t *blk =
            slice + (size_t)((is_v ? bt : 0) + slot) * (size_t)(hd / KRN_QK8_0) * KRN_Q8_0_BYTES +
            (size_t)(d / KRN_QK8_0) * KRN_Q8_0_BYTES;
        return krn_q8_0_d_of(blk) * (float)(int8_t)blk[2 + d % KRN_QK8_0];
    }
    int64_t e = is_v ? (int64_t)hd * bt + (int64_t)slot * hd + d : (int64_t)d * bt + slot;
    if (kv->dtype == KRN_F16) {
        const uint8_t *p = slice + e * 2;
        return krn_hd_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); /* an F16 value */
    }
    float f;
    memcpy(&f, slice + e * 4, sizeof f);
    return f;
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
