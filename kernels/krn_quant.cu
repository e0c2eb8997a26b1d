/*
 * krn_quant.cu — quantized weights on the device (kernels.h, "Quantized weights"): the
 * dequantization of rows (the embedding gather of a quantized table, the GEMM path's chunks)
 * and the matrix product krn_qmatmul, a GEMV kernel for decode and dequantize-then-cuBLAS for
 * more rows. Every block is decoded by krn_q_group8 (krn_quant_hostdev.h), the references' own
 * decoder. Untested on a GPU as of this writing (issue 25): the gpu tests compare these with
 * krn_ref_dequant (bit for bit) and krn_ref_qmatmul.
 *
 * Launch geometry:
 *   dequant  grid-stride over (row, group of 8): thread i decodes one group and writes its 8
 *            elements (16-byte stores when y is 16-byte aligned); 256 threads per block
 *   qgemv    grid ceil(N / 4), 4 warps: warp w owns weight row n = 4 * blockIdx.x + w; lane l
 *            takes groups l, l + 32, ... of the row (so a warp reads one K-quant super-block,
 *            or 8 Q4_0 / Q5_0 / Q5_1 / Q8_0 blocks, per iteration, every weight byte once from
 * DRAM), decodes the group's 8 quants in affine form (krn_q_group8_affine: small integers, one
 * scale and one offset) and adds scale * sum(q x) - offset * sum(x) for each of the M activation
 * rows (F32 accumulators per row, x read through L1/L2: it is small and every warp reads it); a
 * warp-shuffle sum, then lane 0 writes y[m][n] for every m. Per weight: the bit extraction, an OR
 * and an add for its float (krn_q_i2f) and an FMA per row (and an add for the K-quants' mins),
 * meant to keep decode memory-bound at 4 bits per weight; unmeasured as of this writing (`kvgw
 * bench kernels`' qgemv figures measure it). qmatmul  M <= KRN_QGEMV_MAX_ROWS: qgemv; else per
 * chunk of krn_qmatmul_chunk_rows rows, dequant into the caller's scratch as x's type, then
 * krn_gemm into y's columns.
 */
#include "krn_cuda.cuh"
#include "krn_quant_hostdev.h"

template <typename T> __device__ __forceinline__ float q_ld(const T *p, int64_t i);
template <> __device__ __forceinline__ float q_ld<float>(const float *p, int64_t i)
{
    return p[i];
}
template <> __device__ __forceinline__ float q_ld<__half>(const __half *p, int64_t i)
{
    return __half2float(p[i]);
}
template <> __device__ __forceinline__ float q_ld<__nv_bfloat16>(const __nv_bfloat16 *p, int64_t i)
{
    return __bfloat162float(p[i]);
}

/* y[i .. i + 7] = v[0 .. 7] converted (round to nearest even): one or two 16-byte stores when
 * vec (y 16-byte aligned: i is a multiple of 8), else element by element. */
__device__ __forceinline__ void q_st8(float *y, int64_t i, const float *v, bool vec)
{
    if (vec) {
        reinterpret_cast<float4 *>(y + i)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4 *>(y + i)[1] = make_float4(v[4], v[5], v[6], v[7]);
        return;
    }
    for (int k = 0; k < 8; k++)
        y[i + k] = v[k];
}
__device__ __forceinline__ void q_st8(__half *y, int64_t i, const float *v, bool vec)
{
    if (vec) {
        __half2 h[4];
        for (int k = 0; k < 4; k++)
            h[k] = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
        *reinterpret_cast<uint4 *>(y + i) = *reinterpret_cast<const uint4 *>(h);
        return;
    }
    for (int k = 0; k < 8; k++)
        y[i + k] = __float2half_rn(v[k]);
}
__device__ __forceinline__ void q_st8(__nv_bfloat16 *y, int64_t i, const float *v, bool vec)
{
    if (vec) {
        __nv_bfloat162 h[4];
        for (int k = 0; k < 4; k++)
            h[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
        *reinterpret_cast<uint4 *>(y + i) = *reinterpret_cast<const uint4 *>(h);
        return;
    }
    for (int k = 0; k < 8; k++)
        y[i + k] = __float2bfloat16_rn(v[k]);
}

template <int QT, typename YT>
__global__ void dequant_kernel(const uint8_t *w,    // [n_wrows][row_bytes]
                               const int32_t *rows, // [n_rows] or NULL
                               YT *y,               // [n_rows][n_in]
                               int32_t n_rows, int32_t n_wrows, int32_t n_in, int64_t row_bytes,
                               bool vec)
{
    const int64_t per_row = n_in / 8, total = (int64_t)n_rows * per_row;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / per_row, g = i % per_row;
        const int64_t src = rows != NULL ? rows[r] : r;
        float v[8];
        if (src < 0 || src >= n_wrows) { /* the host checked its ids; NaN, never a stray read */
            for (int k = 0; k < 8; k++)
                v[k] = __int_as_float(0x7fc00000);
        } else {
            krn_q_group8(QT, w + src * row_bytes, g, v);
        }
        q_st8(y, r * n_in + g * 8, v, vec);
    }
}

template <int QT, typename XT>
__global__ void __launch_bounds__(128) qgemv_kernel(krn_qmatmul_args_t a, int64_t row_bytes)
{
    const int32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t n = (int64_t)blockIdx.x * 4 + warp;
    if (n >= a.N)
        return; /* the whole warp */
    const uint8_t *row = (const uint8_t *)a.w + n * row_bytes;
    const XT *x = (const XT *)a.x;
    const int64_t n_groups = a.K / 8;
    float acc[KRN_QGEMV_MAX_ROWS];
#pragma unroll
    for (int m = 0; m < KRN_QGEMV_MAX_ROWS; m++)
        acc[m] = 0.0f;
    for (int64_t g = lane; g < n_groups; g += 32) {
        float q[8], scale, offset;
        krn_q_group8_affine(QT, row, g, q, &scale, &offset);
#pragma unroll
        for (int m = 0; m < KRN_QGEMV_MAX_ROWS; m++) {
            if (m < a.M) {
                const int64_t x0 = (int64_t)m * a.K + g * 8;
                float xv[8];
#pragma unroll
                for (int k = 0; k < 8; k++)
                    xv[k] = q_ld<XT>(x, x0 + k);
                acc[m] = krn_q_dot8(QT, q, scale, offset, xv, acc[m]);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < KRN_QGEMV_MAX_ROWS; m++) {
        if (m < a.M) {
            float s = acc[m];
            for (int off = 16; off > 0; off /= 2)
                s += __shfl_xor_sync(0xffffffffu, s, off);
            if (lane == 0) {
                float *y = a.y + (int64_t)m * a.N + n;
                *y = a.accumulate ? *y + s : s;
            }
        }
    }
}

template <int QT>
static int dequant_launch(krn_ctx_t *c, const krn_dequant_args_t *a, int64_t rb, unsigned grid)
{
    const uint8_t *w = (const uint8_t *)a->w;
    const bool vec = (uintptr_t)a->y % 16 == 0; /* n_in is a multiple of 32: every group too */
    switch (a->dtype) {
    case KRN_F32:
        dequant_kernel<QT, float><<<grid, 256, 0, c->stream>>>(w, a->rows, (float *)a->y, a->n_rows,
                                                               a->n_wrows, a->n_in, rb, vec);
        break;
    case KRN_F16:
        dequant_kernel<QT, __half><<<grid, 256, 0, c->stream>>>(
            w, a->rows, (__half *)a->y, a->n_rows, a->n_wrows, a->n_in, rb, vec);
        break;
    default:
        dequant_kernel<QT, __nv_bfloat16><<<grid, 256, 0, c->stream>>>(
            w, a->rows, (__nv_bfloat16 *)a->y, a->n_rows, a->n_wrows, a->n_in, rb, vec);
        break;
    }
    KRN_CUDA_CHECK(cudaGetLastError());
    return 0;
}

int krn_dequant(krn_ctx_t *c, const krn_dequant_args_t *a)
{
    if (krn__dequant_check(a) != 0)
        return PC_ERR_INVAL;
    if (a->n_rows == 0)
        return 0;
    KRN_ENTER(c);
    const int64_t rb = krn_qtype_row_bytes(a->qtype, a->n_in);
    const unsigned grid = krn_grid_for((int64_t)a->n_rows * (a->n_in / 8), 256);
    switch (a->qtype) {
    case KRN_QT_Q4_0:
        return dequant_launch<KRN_QT_Q4_0>(c, a, rb, grid);
    case KRN_QT_Q5_0:
        return dequant_launch<KRN_QT_Q5_0>(c, a, rb, grid);
    case KRN_QT_Q5_1:
        return dequant_launch<KRN_QT_Q5_1>(c, a, rb, grid);
    case KRN_QT_Q8_0:
        return dequant_launch<KRN_QT_Q8_0>(c, a, rb, grid);
    case KRN_QT_Q4_K:
        return dequant_launch<KRN_QT_Q4_K>(c, a, rb, grid);
    case KRN_QT_Q5_K:
        return dequant_launch<KRN_QT_Q5_K>(c, a, rb, grid);
    case KRN_QT_Q6_K:
        return dequant_launch<KRN_QT_Q6_K>(c, a, rb, grid);
    }
    return PC_ERR_INVAL;
}

template <int QT> static int qgemv_launch(krn_ctx_t *c, const krn_qmatmul_args_t *a, int64_t rb)
{
    const unsigned grid = (unsigned)((a->N + 3) / 4);
    switch (a->x_dtype) {
    case KRN_F32:
        qgemv_kernel<QT, float><<<grid, 128, 0, c->stream>>>(*a, rb);
        break;
    case KRN_F16:
        qgemv_kernel<QT, __half><<<grid, 128, 0, c->stream>>>(*a, rb);
        break;
    default:
        qgemv_kernel<QT, __nv_bfloat16><<<grid, 128, 0, c->stream>>>(*a, rb);
        break;
    }
    KRN_CUDA_CHECK(cudaGetLastError());
    return 0;
}

int krn_qgemv(krn_ctx_t *c, const krn_qmatmul_args_t *a)
{
    if (krn__qmatmul_check(a) != 0 || a->M > KRN_QGEMV_MAX_ROWS)
        return PC_ERR_INVAL;
    if (a->M == 0)
        return 0;
    KRN_ENTER(c);
    const int64_t rb = krn_qtype_row_bytes(a->qtype, a->K);
    switch (a->qtype) {
    case KRN_QT_Q4_0:
        return qgemv_launch<KRN_QT_Q4_0>(c, a, rb);
    case KRN_QT_Q5_0:
        return qgemv_launch<KRN_QT_Q5_0>(c, a, rb);
    case KRN_QT_Q5_1:
        return qgemv_launch<KRN_QT_Q5_1>(c, a, rb);
    case KRN_QT_Q8_0:
        return qgemv_launch<KRN_QT_Q8_0>(c, a, rb);
    case KRN_QT_Q4_K:
        return qgemv_launch<KRN_QT_Q4_K>(c, a, rb);
    case KRN_QT_Q5_K:
        return qgemv_launch<KRN_QT_Q5_K>(c, a, rb);
    case KRN_QT_Q6_K:
        return qgemv_launch<KRN_QT_Q6_K>(c, a, rb);
    }
    return PC_ERR_INVAL;
}

int krn_qmatmul(krn_ctx_t *c, const krn_qmatmul_args_t *a)
{
    if (krn__qmatmul_check(a) != 0)
        return PC_ERR_INVAL;
    if (a->M <= KRN_QGEMV_MAX_ROWS)
        return krn_qgemv(c, a);
    if (a->x_dtype == KRN_F32)
        return PC_ERR_INVAL; /* cuBLAS takes F16 or BF16 */
    const int32_t chunk = krn_qmatmul_chunk_rows(a->N, a->K, 2, a->scratch_bytes);
    if (chunk == 0 || a->scratch == NULL)
        return PC_ERR_INVAL;
    const int64_t rb = krn_qtype_row_bytes(a->qtype, a->K);
    for (int32_t n0 = 0; n0 < a->N; n0 += chunk) {
        const int32_t nr = a->N - n0 < chunk ? a->N - n0 : chunk;
        krn_dequant_args_t d = {.w = (const uint8_t *)a->w + (int64_t)n0 * rb,
                                .rows = NULL,
                                .y = a->scratch,
                                .n_rows = nr,
                                .n_wrows = nr,
                                .n_in = a->K,
                                .qtype = a->qtype,
                                .dtype = a->x_dtype};
        krn_gemm_args_t g = {.x = a->x,
                             .w = a->scratch,
                             .y = a->y + n0,
                             .M = a->M,
                             .N = nr,
                             .K = a->K,
                             .dtype = a->x_dtype,
                             .accumulate = a->accumulate,
                             .ldy = a->N};
        int rc = krn_dequant(c, &d);
        if (rc != 0 || (rc = krn_gemm(c, &g)) != 0)
            return rc;
    }
    return 0;
}
