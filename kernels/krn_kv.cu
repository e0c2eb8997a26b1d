/*
 * krn_kv.cu — writing new K/V rows into their paged blocks, and copying blocks inside the
 * device pool (copy-on-write of a shared partial block, defragmentation, tiering staging).
 *
 * Launch geometry:
 *   kv_write     grid (n_rows, n_head_kv), head_dim threads (at most 256, one per dimension):
 *                thread d stores K[d][slot] and V[slot][d] of its (row, head)
 *                (q8_0: warp w quantizes q8_0 block w of the K row and of the V row, a
 *                whole warp per block, krn_q8_0_store_warp)
 *   block_copy   grid (n, min(n_layer * n_head_kv, 65535)), 256 threads striding over the
 *                (block, layer, head) slices (a CTA takes slices y, y + gridDim.y, ...); element
 *                e of a slice is copied only when its slot is below the pair's n_tokens
 */
#include "krn_cuda.cuh"

template <typename KT>
__global__ void kv_write_kernel(KT *base,                    // the pool (kernels.h layout)
                                const float *k,              // [n_rows][n_head_kv * head_dim]
                                const float *v,              // [n_rows][n_head_kv * head_dim]
                                const int32_t *row_seq,      // [n_rows]
                                const int32_t *row_pos,      // [n_rows]
                                const int32_t *block_tables, // [n_seqs][max_blocks]
                                int32_t max_blocks, int32_t n_blocks, int32_t n_layer,
                                int32_t layer, int32_t n_head_kv, int32_t head_dim, int32_t bt)
{
    int64_t r = blockIdx.x;
    int32_t h = blockIdx.y, d = threadIdx.x;
    if (d >= head_dim)
        return;
    int32_t pos = row_pos[r];
    int32_t bi = pos / bt, slot = pos % bt;
    if (pos < 0 || bi >= max_blocks)
        return;
    int32_t block = block_tables[(int64_t)row_seq[r] * max_blocks + bi];
    if (block < 0 || block >= n_blocks)
        return;
    int64_t slice = (((int64_t)block * n_layer + layer) * n_head_kv + h) * 2 * head_dim * bt;
    int64_t src = r * n_head_kv * head_dim + (int64_t)h * head_dim + d;
    krn_st(base, slice + (int64_t)d * bt + slot, k[src]);
    krn_st(base, slice + (int64_t)head_dim * bt + (int64_t)slot * head_dim + d, v[src]);
}

/* q8_0 (kernels.h): warp w quantizes dimensions 32w .. 32w + 31 (one q8_0 block) of the row's
 * K and of its V into the slot's K and V rows. */
__global__ void kv_write_q8_0_kernel(uint8_t *base,               // the pool (kernels.h layout)
                                     const float *k,              // [n_rows][n_head_kv * head_dim]
                                     const float *v,              // [n_rows][n_head_kv * head_dim]
                                     const int32_t *row_seq,      // [n_rows]
                                     const int32_t *row_pos,      // [n_rows]
                                     const int32_t *block_tables, // [n_seqs][max_blocks]
                                     int32_t max_blocks, int32_t n_blocks, int32_t n_layer,
                                     int32_t layer, int32_t n_head_kv, int32_t head_dim, int32_t bt)
{
    int64_t r = blockIdx.x;
    int32_t h = blockIdx.y, d = threadIdx.x;
    int32_t pos = row_pos[r];
    int32_t bi = pos / bt, slot = pos % bt;
    if (pos < 0 || bi >= max_blocks)
        return; /* the whole CTA: the warps' shuffles stay whole */
    int32_t block = block_tables[(int64_t)row_seq[r] * max_blocks + bi];
    if (block < 0 || block >= n_blocks)
        return;
    int64_t rb = (int64_t)(head_dim / KRN_QK8_0) * KRN_Q8_0_BYTES;
    uint8_t *slice = base + (((int64_t)block * n_layer + layer) * n_head_kv + h) * 2 * bt * rb;
    int64_t src = r * n_head_kv * head_dim + (int64_t)h * head_dim + d;
    int64_t off = (int64_t)(d / KRN_QK8_0) * KRN_Q8_0_BYTES;
    krn_q8_0_store_warp(slice + (int64_t)slot * rb + off, k[src]);
    krn_q8_0_store_warp(slice + (int64_t)(bt + slot) * rb + off, v[src]);
}

int krn_kv_write(krn_ctx_t *c, const krn_kv_write_args_t *a)
{
    const krn_kv_t *kv = &a->kv;
    if (a->n_rows < 0 || a->layer < 0 || a->layer >= kv->n_layer || kv->head_dim <= 0 ||
        kv->head_dim > 1024 || kv->n_head_kv <= 0 || kv->n_head_kv > 65535 ||
        kv->block_tokens <= 0 || a->max_blocks <= 0)
        return PC_ERR_INVAL;
    if (a->n_rows == 0)
        return 0;
    KRN_ENTER(c);
    dim3 grid((unsigned)a->n_rows, (unsigned)kv->n_head_kv);
    unsigned threads = (unsigned)((kv->head_dim + 31) / 32 * 32);
    if (kv->dtype == KRN_Q8_0) {
        if (kv->head_dim % KRN_QK8_0 != 0)
            return PC_ERR_INVAL;
        kv_write_q8_0_kernel<<<grid, threads, 0, c->stream>>>(
            (uint8_t *)kv->base, a->k, a->v, a->row_seq, a->row_pos, a->block_tables, a->max_blocks,
            kv->n_blocks, kv->n_layer, a->layer, kv->n_head_kv, kv->head_dim, kv->block_tokens);
    } else if (kv->dtype == KRN_F16)
        kv_write_kernel<__half><<<grid, threads, 0, c->stream>>>(
            (__half *)kv->base, a->k, a->v, a->row_seq, a->row_pos, a->block_tables, a->max_blocks,
            kv->n_blocks, kv->n_layer, a->layer, kv->n_head_kv, kv->head_dim, kv->block_tokens);
    else if (kv->dtype == KRN_F32)
        kv_write_kernel<float><<<grid, threads, 0, c->stream>>>(
            (float *)kv->base, a->k, a->v, a->row_seq, a->row_pos, a->block_tables, a->max_blocks,
            kv->n_blocks, kv->n_layer, a->layer, kv->n_head_kv, kv->head_dim, kv->block_tokens);
    else
        return PC_ERR_INVAL;
    KRN_CUDA_CHECK(cudaGetLastError());
    return 0;
}

template <typename E>
__global__ void block_copy_kernel(E *base,                 // the pool, as elements of its size
                                  const int32_t *src,      // [n]
                                  const int32_t *dst,      // [n]
                                  const int32_t *n_tokens, // [n] or NULL
                                  int32_t n_blocks, int32_t n_lh, int32_t head_dim, int32_t bt)
{
    int32_t i = blockIdx.x;
    int32_t s = src[i], d = dst[i];
    if (s < 0 || s >= n_blocks || d < 0 || d >= n_blocks)
        return;
    int32_t n = n_tokens != NULL ? n_tokens[i] : bt;
    int64_t slice = (int64_t)2 * head_dim * bt, per_block = (int64_t)n_lh * slice;
    int64_t k_elems = (int64_t)head_dim * bt;
    /* gridDim.y is capped at 65535: a CTA strides over the (layer, head) slices. */
    for (int32_t lh = blockIdx.y; lh < n_lh; lh += gridDim.y) { /* layer * n_head_kv + head */
        const E *sp = base + (int64_t)s * per_block + (int64_t)lh * slice;
        E *dp = base + (int64_t)d * per_block + (int64_t)lh * slice;
        for (int64_t e = threadIdx.x; e < slice; e += blockDim.x) {
            int32_t slot = e < k_elems ? (int32_t)(e % bt) : (int32_t)((e - k_elems) / head_dim);
            if (slot < n)
                dp[e] = sp[e];
        }
    }
}

/* q8_0 (kernels.h): a slice is 2 * bt rows of row_words 2-byte words (K rows, then V rows);
 * word e belongs to slot (e / row_words) % bt. */
__global__ void block_copy_rows_kernel(uint16_t *base,          // the pool, as 2-byte words
                                       const int32_t *src,      // [n]
                                       const int32_t *dst,      // [n]
                                       const int32_t *n_tokens, // [n] or NULL
                                       int32_t n_blocks, int32_t n_lh, int32_t row_words,
                                       int32_t bt)
{
    int32_t i = blockIdx.x;
    int32_t s = src[i], d = dst[i];
    if (s < 0 || s >= n_blocks || d < 0 || d >= n_blocks)
        return;
    int32_t n = n_tokens != NULL ? n_tokens[i] : bt;
    int64_t slice = (int64_t)2 * bt * row_words, per_block = (int64_t)n_lh * slice;
    for (int32_t lh = blockIdx.y; lh < n_lh; lh += gridDim.y) {
        const uint16_t *sp = base + (int64_t)s * per_block + (int64_t)lh * slice;
        uint16_t *dp = base + (int64_t)d * per_block + (int64_t)lh * slice;
        for (int64_t e = threadIdx.x; e < slice; e += blockDim.x)
            if ((int32_t)(e / row_words) % bt < n)
                dp[e] = sp[e];
    }
}

int krn_block_copy(krn_ctx_t *c, const krn_block_copy_args_t *a)
{
    const krn_kv_t *kv = &a->kv;
    if (a->n < 0 || kv->n_layer <= 0 || kv->n_head_kv <= 0 ||
        (int64_t)kv->n_layer * kv->n_head_kv > INT32_MAX || kv->head_dim <= 0 ||
        kv->block_tokens <= 0)
        return PC_ERR_INVAL;
    if (a->n == 0)
        return 0;
    KRN_ENTER(c);
    int32_t n_lh = kv->n_layer * kv->n_head_kv;
    dim3 grid((unsigned)a->n, (unsigned)(n_lh < 65535 ? n_lh : 65535));
    if (kv->dtype == KRN_Q8_0) {
        if (kv->head_dim % KRN_QK8_0 != 0)
            return PC_ERR_INVAL;
        block_copy_rows_kernel<<<grid, 256, 0, c->stream>>>(
            (uint16_t *)kv->base, a->src, a->dst, a->n_tokens, kv->n_blocks, n_lh,
            (int32_t)(krn_kv_row_bytes(kv) / 2), kv->block_tokens);
    } else if (kv->dtype == KRN_F16)
        block_copy_kernel<uint16_t>
            <<<grid, 256, 0, c->stream>>>((uint16_t *)kv->base, a->src, a->dst, a->n_tokens,
                                          kv->n_blocks, n_lh, kv->head_dim, kv->block_tokens);
    else if (kv->dtype == KRN_F32)
        block_copy_kernel<uint32_t>
            <<<grid, 256, 0, c->stream>>>((uint32_t *)kv->base, a->src, a->dst, a->n_tokens,
                                          kv->n_blocks, n_lh, kv->head_dim, kv->block_tokens);
    else
        return PC_ERR_INVAL;
    KRN_CUDA_CHECK(cudaGetLastError());
    return 0;
}
