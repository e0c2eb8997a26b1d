/*
 * krn_elementwise.cu — embedding gather, RMSNorm (and the per-head q/k norm), RoPE, SwiGLU,
 * residual add, bias add and F32 -> F16/BF16 conversion.
 *
 * Launch geometry:
 *   embed     grid n_rows, 256 threads striding over the row's width
 *   rmsnorm   grid n_rows, 256 threads: a block reduction of the squares, then the scaled row
 *   rope      grid n_rows * n_heads, 128 threads: thread i takes rotation pairs i, i + 128, ...
 *             then the unrotated tail; angles in double (sincos), as the CPU backend
 *   swiglu, add, bias_add, convert   grid-stride loops, 256 threads per block
 */
#include "krn_cuda.cuh"

template <typename T> __device__ __forceinline__ float to_f32(T v);
template <> __device__ __forceinline__ float to_f32<float>(float v)
{
    return v;
}
template <> __device__ __forceinline__ float to_f32<__half>(__half v)
{
    return __half2float(v);
}
template <> __device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}

template <typename T>
__global__ void embed_kernel(const T *table,     // [n_vocab][width]
                             const int32_t *ids, // [n_rows]
                             float *out,         // [n_rows][width]
                             int32_t width, int32_t n_vocab)
{
    int64_t r = blockIdx.x;
    int32_t id = ids[r];
    if (id < 0 || id >= n_vocab) { /* the host checked; NaN rather than a stray read */
        for (int32_t j = threadIdx.x; j < width; j += blockDim.x)
            out[r * width + j] = __int_as_float(0x7fc00000);
        return;
    }
    const T *src = table + (int64_t)id * width;
    for (int32_t j = threadIdx.x; j < width; j += blockDim.x)
        out[r * width + j] = to_f32<T>(src[j]);
}

int krn_embed(krn_ctx_t *c, const krn_embed_args_t *a)
{
    if (a->n_rows < 0 || a->width <= 0 || a->n_vocab <= 0)
        return PC_ERR_INVAL;
    if (a->n_rows == 0)
        return 0;
    KRN_ENTER(c);
    switch (a->table_dtype) {
    case KRN_F32:
        embed_kernel<float><<<a->n_rows, 256, 0, c->stream>>>((const float *)a->table, a->ids,
                                                              a->out, a->width, a->n_vocab);
        break;
    case KRN_F16:
        embed_kernel<__half><<<a->n_rows, 256, 0, c->stream>>>((const __half *)a->table, a->ids,
                                                               a->out, a->width, a->n_vocab);
        break;
    case KRN_BF16:
        embed_kernel<__nv_bfloat16><<<a->n_rows, 256, 0, c->stream>>>(
            (const __nv_bfloat16 *)a->table, a->ids, a->out, a->width, a->n_vocab);
        break;
    default:
        return PC_ERR_INVAL;
    }
    KRN_CUDA_CHECK(cudaGetLastError());
    return 0;
}

__global__ void rmsnorm_kernel(const float *x, // [n_rows][width]
                               const float *w, // [width]
                               float *y,       // [n_rows][width]
                               int32_t width, float eps)
{
    __shared__ float sh[32];
    int64_t r = blockIdx.x;
    const float *xr = x + r * width;
    float ss = 0;
    for (int32_t j = threadIdx.x; j < width; j += blockDim.x)
        ss += xr[j] * xr[j];
    ss = krn_block_reduce(ss, krn_op_add(), sh);
    float scale = rsqrtf(ss / (float)width + eps);
    float *yr = y + r * width;
    for (int32_t j = threadIdx.x; j < width; j += blockDim.x)
        yr[j] = xr[j] * scale * w[j];
}

int krn_rmsnorm(krn_ctx_t *c, const krn_rmsnorm_args_t *a)
{
    if (a->n_rows < 0 || a->width <= 0)
        return PC_ERR_INVAL;
    if (a->n_rows == 0)
        return 0;
    KRN_ENTER(c);
    rmsnorm_kernel<<<a->n_rows, 256, 0, c->stream>>>(a->x, a->w, a->y, a->width, a->eps);
    KRN_CUDA_CHECK(cudaGetLastError());
    return 0;
}

int krn_qk_norm(krn_ctx_t *c, const krn_rmsnorm_args_t *a)
{
    return krn_rmsnorm(c, a);
}

__global__ void rope_kernel(float *x,              // [n_rows][n_heads * head_dim]
                            const int32_t *pos,    // [n_rows]
                            const float *inv_freq, // [rope_dim / 2]
                            int32_t n_heads, int32_t head_dim, int32_t rope_dim, bool neox,
                            float post_scale)
{
    int64_t rh = blockIdx.x; /* (row, head) */
    int64_t r = rh / n_heads;
    float *xh = x + rh * head_dim;
    int32_t half = rope_dim / 2;
    double p = (double)pos[r];
    for (int32_t i = threadIdx.x; i < half; i += blockDim.x) {
        double sn, cs;
        sincos(p * (double)inv_freq[i], &sn, &cs);
        float fs = (float)sn, fc = (float)cs;
        int32_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        float x0 = xh[i0], x1 = xh[i1];
        xh[i0] = (x0 * fc - x1 * fs) * post_scale;
        xh[i1] = (x0 * fs + x1 * fc) * post_scale;
    }
    for (int32_t d = rope_dim + threadIdx.x; d < head_dim; d += blockDim.x)
        xh[d] *= post_scale;
}

int krn_rope(krn_ctx_t *c, const krn_rope_args_t *a)
{
    if (a->n_rows < 0 || a->n_heads <= 0 || a->head_dim <= 0 || a->rope_dim <= 0 ||
        a->rope_dim % 2 != 0 || a->rope_dim > a->head_dim ||
        (a->style != KRN_ROPE_NORM && a->style != KRN_ROPE_NEOX))
        return PC_ERR_INVAL;
    if (a->n_rows == 0)
        return 0;
    KRN_ENTER(c);
    int64_t n_blocks = (int64_t)a->n_rows * a->n_heads;
    if (n_blocks > INT32_MAX)
        return PC_ERR_INVAL;
    rope_kernel<<<(unsigned)n_blocks, 128, 0, c->stream>>>(
        a->x, a->pos, a->inv_freq, a->n_heads, a->head_dim, a->rope_dim, a->style == KRN_ROPE_NEOX,
        a->post_scale);
    KRN_CUDA_CHECK(cudaGetLastError());
    return 0;
}

__global__ void swiglu_kernel(float *g, const float *u, int64_t n) // g, u: [n]
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float gv = g[i];
        g[i] = gv / (1.0f + expf(-gv)) * u[i];
    }
}

int krn_swiglu(krn_ctx_t *c, const krn_swiglu_args_t *a)
{
    if (a->n < 0)
        return PC_ERR_INVAL;
    if (a->n == 0)
        return 0;
    KRN_ENTER(c);
    swiglu_kernel<<<krn_grid_for(a->n, 256), 256, 0, c->stream>>>(a->g, a->u, a->n);
    KRN_CUDA_CHECK(cudaGetLastError());
    return 0;
}

__global__ void add_kernel(float *x, const float *y, int64_t n) // x, y: [n]
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

int krn_add(krn_ctx_t *c, const krn_add_args_t *a)
{
    if (a->n < 0)
        return PC_ERR_INVAL;
    if (a->n == 0)
        return 0;
    KRN_ENTER(c);
    add_kernel<<<krn_grid_for(a->n, 256), 256, 0, c->stream>>>(a->x, a->y, a->n);
    KRN_CUDA_CHECK(cudaGetLastError());
    return 0;
}

__global__ void bias_add_kernel(float *x,       // [n_rows][width]
                                const float *b, // [width]
                                int64_t n, int32_t width)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] += b[i % width];
}

int krn_bias_add(krn_ctx_t *c, const krn_bias_add_args_t *a)
{
    if (a->n_rows < 0 || a->width <= 0)
        return PC_ERR_INVAL;
    int64_t n = (int64_t)a->n_rows * a->width;
    if (n == 0)
        return 0;
    KRN_ENTER(c);
    bias_add_kernel<<<krn_grid_for(n, 256), 256, 0, c->stream>>>(a->x, a->b, n, a->width);
    KRN_CUDA_CHECK(cudaGetLastError());
    return 0;
}

__global__ void to_f16_kernel(const float *x, __half *y, int64_t n) // [n]
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2half_rn(x[i]);
}

__global__ void to_bf16_kernel(const float *x, __nv_bfloat16 *y, int64_t n) // [n]
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

int krn_convert(krn_ctx_t *c, const krn_convert_args_t *a)
{
    if (a->n < 0 || (a->dtype != KRN_F16 && a->dtype != KRN_BF16))
        return PC_ERR_INVAL;
    if (a->n == 0)
        return 0;
    KRN_ENTER(c);
    if (a->dtype == KRN_F16)
        to_f16_kernel<<<krn_grid_for(a->n, 256), 256, 0, c->stream>>>(a->x, (__half *)a->y, a->n);
    else
        to_bf16_kernel<<<krn_grid_for(a->n, 256), 256, 0, c->stream>>>(a->x, (__nv_bfloat16 *)a->y,
                                                                       a->n);
    KRN_CUDA_CHECK(cudaGetLastError());
    return 0;
}
