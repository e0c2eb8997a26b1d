/*
 * krn_fused.cu — the fused kernels of the cuda backend's step (kernels.h, "Fused kernels"):
 * RMSNorm straight into a GEMM's input type (with an optional row gather), the QKV GEMM's
 * epilogue (bias, per-head norm, RoPE, q scale, K/V store) and SwiGLU into the down
 * projection's input type. Each computes the F32 formulas of the kernels it replaces
 * (krn_elementwise.cu, krn_kv.cu) in the same order, then rounds once as krn_convert does.
 *
 * Launch geometry:
 *   rmsnorm_convert   grid n_rows, 256 threads: the block reduction of krn_rmsnorm, then the
 *                     scaled row stored as dtype
 *   qkv_rope_kv       grid (n_rows, n_head + n_head_kv), KRN_QKV_THREADS threads: a CTA loads
 *                     one head of one row into shared memory (+ bias), normalizes it (block
 *                     reduction), rotates pairs i, i + threads, ... (angles in double, as
 *                     krn_rope), scales, then stores: q heads to q_out, KV heads to the pool
 *                     with their V row (a q8_0 pool: quantized a warp per 32-value block,
 *                     krn_q8_0_store_warp, the bytes of krn_q8_0_quantize)
 *   swiglu_convert    grid-stride over n_rows * width, 256 threads
 */
#include "krn_cuda.cuh"

#define KRN_QKV_THREADS 128

template <typename T> __device__ __forceinline__ void st_conv(T *y, int64_t i, float v);
template <> __device__ __forceinline__ void st_conv<float>(float *y, int64_t i, float v)
{
    y[i] = v;
}
template <> __device__ __forceinline__ void st_conv<__half>(__half *y, int64_t i, float v)
{
    y[i] = __float2half_rn(v);
}
template <>
__device__ __forceinline__ void st_conv<__nv_bfloat16>(__nv_bfloat16 *y, int64_t i, float v)
{
    y[i] = __float2bfloat16_rn(v);
}

template <typename T>
__global__ void rmsnorm_convert_kernel(const float *x,      // [n_src][width]
                                       const int32_t *rows, // [n_rows] or NULL
                                       const float *w,      // [width]
                                       T *y,                // [n_rows][width]
                                       int32_t n_src, int32_t width, float eps)
{
    __shared__ float sh[32];
    int64_t r = blockIdx.x;
    int64_t src = rows != NULL ? rows[r] : r;
    T *yr = y + r * width;
    if (src < 0 || src >= n_src) { /* the host checked; NaN rather than a stray read */
        for (int32_t j = threadIdx.x; j < width; j += blockDim.x)
            st_conv<T>(yr, j, __int_as_float(0x7fc00000));
        return;
    }
    const float *xr = x + src * width;
    float ss = 0;
    for (int32_t j = threadIdx.x; j < width; j += blockDim.x)
        ss += xr[j] * xr[j];
    ss = krn_block_reduce(ss, krn_op_add(), sh);
    float scale = rsqrtf(ss / (float)width + eps);
    for (int32_t j = threadIdx.x; j < width; j += blockDim.x)
        st_conv<T>(yr, j, xr[j] * scale * w[j]);
}

int krn_rmsnorm_convert(krn_ctx_t *c, const krn_rmsnorm_convert_args_t *a)
{
    if (a->n_rows < 0 || a->n_src < 0 || a->width <= 0 || (a->rows == NULL && a->n_rows > a->n_src))
        return PC_ERR_INVAL;
    if (a->n_rows == 0)
        return 0;
    KRN_ENTER(c);
    switch (a->dtype) {
    case KRN_F32:
        rmsnorm_convert_kernel<float><<<a->n_rows, 256, 0, c->stream>>>(
            a->x, a->rows, a->w, (float *)a->y, a->n_src, a->width, a->eps);
        break;
    case KRN_F16:
        rmsnorm_convert_kernel<__half><<<a->n_rows, 256, 0, c->stream>>>(
            a->x, a->rows, a->w, (__half *)a->y, a->n_src, a->width, a->eps);
        break;
    case KRN_BF16:
        rmsnorm_convert_kernel<__nv_bfloat16><<<a->n_rows, 256, 0, c->stream>>>(
            a->x, a->rows, a->w, (__nv_bfloat16 *)a->y, a->n_src, a->width, a->eps);
        break;
    default:
        return PC_ERR_INVAL;
    }
    KRN_CUDA_CHECK(cudaGetLastError());
    return 0;
}

struct qkv_params {
    const float *q_in, *k_in, *v_in;
    int64_t ld_q, ld_kv;
    float *q_out;
    const float *bq, *bk, *bv, *q_norm, *k_norm;
    float eps;
    const float *inv_freq;
    int32_t rope_dim;
    bool neox;
    float q_scale;
    const int32_t *row_pos, *row_seq, *block_tables;
    int32_t max_blocks, n_head, n_head_kv, head_dim, n_blocks, n_layer, layer, bt;
};

template <typename KT> __global__ void qkv_rope_kv_kernel(KT *base, qkv_params p)
{
    __shared__ float xs[KRN_ATTN_MAX_HEAD_DIM];
    __shared__ float sh[32];
    int64_t r = blockIdx.x;
    int32_t hh = blockIdx.y, hd = p.head_dim;
    bool is_q = hh < p.n_head;
    int32_t h = is_q ? hh : hh - p.n_head;
    const float *src =
        is_q ? p.q_in + r * p.ld_q + (int64_t)h * hd : p.k_in + r * p.ld_kv + (int64_t)h * hd;
    const float *bias = is_q ? p.bq : p.bk;
    const float *nw = is_q ? p.q_norm : p.k_norm;
    for (int32_t d = threadIdx.x; d < hd; d += blockDim.x)
        xs[d] = bias != NULL ? src[d] + bias[(int64_t)h * hd + d] : src[d];
    __syncthreads();
    if (nw != NULL) { /* krn_qk_norm over this head */
        float ss = 0;
        for (int32_t d = threadIdx.x; d < hd; d += blockDim.x)
            ss += xs[d] * xs[d];
        ss = krn_block_reduce(ss, krn_op_add(), sh);
        float scale = rsqrtf(ss / (float)hd + p.eps);
        for (int32_t d = threadIdx.x; d < hd; d += blockDim.x)
            xs[d] = xs[d] * scale * nw[d];
        __syncthreads();
    }
    /* krn_rope: each pair belongs to one thread, the tail past rope_dim is only scaled. */
    float post = is_q ? p.q_scale : 1.0f;
    int32_t half = p.rope_dim / 2;
    double pos = (double)p.row_pos[r];
    for (int32_t i = threadIdx.x; i < half; i += blockDim.x) {
        double sn, cs;
        sincos(pos * (double)p.inv_freq[i], &sn, &cs);
        float fs = (float)sn, fc = (float)cs;
        int32_t i0 = p.neox ? i : 2 * i, i1 = p.neox ? i + half : 2 * i + 1;
        float x0 = xs[i0], x1 = xs[i1];
        xs[i0] = (x0 * fc - x1 * fs) * post;
        xs[i1] = (x0 * fs + x1 * fc) * post;
    }
    for (int32_t d = p.rope_dim + threadIdx.x; d < hd; d += blockDim.x)
        xs[d] *= post;
    __syncthreads();
    if (is_q) {
        float *dst = p.q_out + (r * p.n_head + h) * hd;
        for (int32_t d = threadIdx.x; d < hd; d += blockDim.x)
            dst[d] = xs[d];
        return;
    }
    /* krn_kv_write of this KV head, with its V row (+ bias). */
    int32_t ps = p.row_pos[r];
    int32_t bi = ps / p.bt, slot = ps % p.bt;
    if (ps < 0 || bi >= p.max_blocks)
        return;
    int32_t block = p.block_tables[(int64_t)p.row_seq[r] * p.max_blocks + bi];
    if (block < 0 || block >= p.n_blocks)
        return;
    const float *vs = p.v_in + r * p.ld_kv + (int64_t)h * hd;
    if constexpr (sizeof(KT) == 1) {
        /* q8_0: d = tid + 128 i, so a warp holds one 32-value block of K and of V (hd is a
         * multiple of 32: whole warps leave the loop together). */
        int64_t rb = (int64_t)(hd / KRN_QK8_0) * KRN_Q8_0_BYTES;
        uint8_t *sl = (uint8_t *)base +
                      (((int64_t)block * p.n_layer + p.layer) * p.n_head_kv + h) * 2 * p.bt * rb;
        for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) {
            float v = p.bv != NULL ? vs[d] + p.bv[(int64_t)h * hd + d] : vs[d];
            int64_t off = (int64_t)(d / KRN_QK8_0) * KRN_Q8_0_BYTES;
            krn_q8_0_store_warp(sl + (int64_t)slot * rb + off, xs[d]);
            krn_q8_0_store_warp(sl + (int64_t)(p.bt + slot) * rb + off, v);
        }
    } else {
        int64_t slice = (((int64_t)block * p.n_layer + p.layer) * p.n_head_kv + h) * 2 * hd * p.bt;
        for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) {
            float v = p.bv != NULL ? vs[d] + p.bv[(int64_t)h * hd + d] : vs[d];
            krn_st(base, slice + (int64_t)d * p.bt + slot, xs[d]);
            krn_st(base, slice + (int64_t)hd * p.bt + (int64_t)slot * hd + d, v);
        }
    }
}

int krn_qkv_rope_kv(krn_ctx_t *c, const krn_qkv_rope_kv_args_t *a)
{
    const krn_kv_t *kv = &a->kv;
    int32_t hd = kv->head_dim;
    if (a->n_rows < 0 || a->n_head <= 0 || kv->n_head_kv <= 0 || hd <= 0 || hd % 2 != 0 ||
        hd > KRN_ATTN_MAX_HEAD_DIM || a->layer < 0 || a->layer >= kv->n_layer ||
        kv->block_tokens <= 0 || a->max_blocks <= 0 || a->rope_dim <= 0 || a->rope_dim % 2 != 0 ||
        a->rope_dim > hd || a->ld_q < (int64_t)a->n_head * hd ||
        a->ld_kv < (int64_t)kv->n_head_kv * hd || (int64_t)a->n_head + kv->n_head_kv > 65535 ||
        (a->style != KRN_ROPE_NORM && a->style != KRN_ROPE_NEOX))
        return PC_ERR_INVAL;
    if (a->n_rows == 0)
        return 0;
    KRN_ENTER(c);
    qkv_params p = {
        a->q_in,    a->k_in,         a->v_in,     a->ld_q,         a->ld_kv,
        a->q_out,   a->bq,           a->bk,       a->bv,           a->q_norm,
        a->k_norm,  a->eps,          a->inv_freq, a->rope_dim,     a->style == KRN_ROPE_NEOX,
        a->q_scale, a->row_pos,      a->row_seq,  a->block_tables, a->max_blocks,
        a->n_head,  kv->n_head_kv,   hd,          kv->n_blocks,    kv->n_layer,
        a->layer,   kv->block_tokens};
    dim3 grid((unsigned)a->n_rows, (unsigned)(a->n_head + kv->n_head_kv));
    if (kv->dtype == KRN_Q8_0) {
        if (hd % KRN_QK8_0 != 0)
            return PC_ERR_INVAL;
        qkv_rope_kv_kernel<uint8_t>
            <<<grid, KRN_QKV_THREADS, 0, c->stream>>>((uint8_t *)kv->base, p);
    } else if (kv->dtype == KRN_F16)
        qkv_rope_kv_kernel<__half><<<grid, KRN_QKV_THREADS, 0, c->stream>>>((__half *)kv->base, p);
    else if (kv->dtype == KRN_F32)
        qkv_rope_kv_kernel<float><<<grid, KRN_QKV_THREADS, 0, c->stream>>>((float *)kv->base, p);
    else
        return PC_ERR_INVAL;
    KRN_CUDA_CHECK(cudaGetLastError());
    return 0;
}

template <typename T>
__global__ void swiglu_convert_kernel(const float *g, const float *u, // row r at + r * ld
                                      int64_t ld, T *y,               // [n_rows][width]
                                      int32_t width, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / width, j = i % width;
        float gv = g[r * ld + j];
        st_conv<T>(y, i, gv / (1.0f + expf(-gv)) * u[r * ld + j]);
    }
}

int krn_swiglu_convert(krn_ctx_t *c, const krn_swiglu_convert_args_t *a)
{
    if (a->n_rows < 0 || a->width <= 0 || a->ld < a->width)
        return PC_ERR_INVAL;
    int64_t n = (int64_t)a->n_rows * a->width;
    if (n == 0)
        return 0;
    KRN_ENTER(c);
    unsigned grid = krn_grid_for(n, 256);
    switch (a->dtype) {
    case KRN_F32:
        swiglu_convert_kernel<float>
            <<<grid, 256, 0, c->stream>>>(a->g, a->u, a->ld, (float *)a->y, a->width, n);
        break;
    case KRN_F16:
        swiglu_convert_kernel<__half>
            <<<grid, 256, 0, c->stream>>>(a->g, a->u, a->ld, (__half *)a->y, a->width, n);
        break;
    case KRN_BF16:
        swiglu_convert_kernel<__nv_bfloat16>
            <<<grid, 256, 0, c->stream>>>(a->g, a->u, a->ld, (__nv_bfloat16 *)a->y, a->width, n);
        break;
    default:
        return PC_ERR_INVAL;
    }
    KRN_CUDA_CHECK(cudaGetLastError());
    return 0;
}
