/*
 * krn_cuda.cuh — what the .cu files of kernels/ share: the context struct, the checking macros
 * and small device helpers (loads and stores of KV elements, block-wide reductions).
 *
 * KRN_CUDA_CHECK / KRN_CUBLAS_CHECK wrap every CUDA runtime and cuBLAS call: on failure they
 * print the call, the file and the line and the library's message on stderr, and make the
 * enclosing function return PC_ERR_INTERNAL. A kernel launch is followed by
 * KRN_CUDA_CHECK(cudaGetLastError()) (launch configuration errors); faults inside a kernel
 * surface at the next synchronizing call (krn_ctx_sync), which is checked the same way.
 * KRN_CUDA_WARN / KRN_CUBLAS_WARN log the same way for calls on release paths that cannot
 * return an error.
 */
#ifndef KRN_CUDA_CUH
#define KRN_CUDA_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>

#include "kernels.h"
#include "krn_hostdev.h"
#include "pc_err.h"

struct krn_ctx {
    int dev;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws; /* the handle's workspace (cublasSetWorkspace), owned by the context */
    size_t blas_ws_bytes;
    void *smp_scratch; /* krn_sample's per-row state and histograms (krn_sample_radix.cu) */
    size_t smp_rows;   /* rows smp_scratch holds */
    int smp_impl;      /* 0 not read yet, 1 multi-pass, 2 bitwise (KVGW_CUDA_SAMPLER) */
};

#define KRN_CUDA_CHECK(call)                                                                       \
    do {                                                                                           \
        cudaError_t krn_e_ = (call);                                                               \
        if (krn_e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "kernels: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,                 \
                    cudaGetErrorString(krn_e_));                                                   \
            return PC_ERR_INTERNAL;                                                                \
        }                                                                                          \
    } while (0)

#define KRN_CUBLAS_CHECK(call)                                                                     \
    do {                                                                                           \
        cublasStatus_t krn_s_ = (call);                                                            \
        if (krn_s_ != CUBLAS_STATUS_SUCCESS) {                                                     \
            fprintf(stderr, "kernels: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,                 \
                    cublasGetStatusString(krn_s_));                                                \
            return PC_ERR_INTERNAL;                                                                \
        }                                                                                          \
    } while (0)

/* For calls whose failure cannot be returned (release paths): logged the same way. */
#define KRN_CUDA_WARN(call)                                                                        \
    do {                                                                                           \
        cudaError_t krn_e_ = (call);                                                               \
        if (krn_e_ != cudaSuccess)                                                                 \
            fprintf(stderr, "kernels: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,                 \
                    cudaGetErrorString(krn_e_));                                                   \
    } while (0)

#define KRN_CUBLAS_WARN(call)                                                                      \
    do {                                                                                           \
        cublasStatus_t krn_s_ = (call);                                                            \
        if (krn_s_ != CUBLAS_STATUS_SUCCESS)                                                       \
            fprintf(stderr, "kernels: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,                 \
                    cublasGetStatusString(krn_s_));                                                \
    } while (0)

/* Makes the context's device current (a no-op when it already is). */
#define KRN_ENTER(ctx) KRN_CUDA_CHECK(cudaSetDevice((ctx)->dev))

/* Launch geometry of grid-stride element-wise loops. */
static inline unsigned krn_grid_for(int64_t n, unsigned threads)
{
    int64_t g = (n + threads - 1) / threads;
    if (g < 1)
        g = 1;
    return g > 65535 * 16 ? 65535 * 16 : (unsigned)g;
}

/* KV element loads and stores (F16 or F32 pools). */
__device__ __forceinline__ float krn_ld(const __half *p, int64_t i)
{
    return __half2float(p[i]);
}
__device__ __forceinline__ float krn_ld(const float *p, int64_t i)
{
    return p[i];
}
__device__ __forceinline__ void krn_st(__half *p, int64_t i, float v)
{
    p[i] = __float2half_rn(v);
}
__device__ __forceinline__ void krn_st(float *p, int64_t i, float v)
{
    p[i] = v;
}

/* Stores one q8_0 block (34 bytes at dst, 2-byte aligned) from a whole warp, lane i holding
 * value i: the steps of krn_q8_0_quantize (krn_hostdev.h), so the bytes are the host's. The
 * block's |max| skips NaN as the host's does (a NaN lane counts as 0). */
__device__ __forceinline__ void krn_q8_0_store_warp(uint8_t *dst, float x)
{
    const int lane = threadIdx.x % 32;
    float amax = fabsf(x) > 0.0f ? fabsf(x) : 0.0f;
    for (int off = 16; off > 0; off /= 2)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const float d = krn_q8_0_scale(amax), id = krn_q8_0_inv(d);
    dst[2 + lane] = (uint8_t)krn_q8_0_quant(x, id);
    if (lane == 0) {
        const uint16_t bits = krn_q8_0_d_bits(d);
        dst[0] = (uint8_t)(bits & 0xff);
        dst[1] = (uint8_t)(bits >> 8);
    }
}

/* Block-wide reductions for blocks of up to 1024 threads (a multiple of 32). Every thread gets
 * the result. `sh` is shared scratch of 32 elements; the functions synchronize. */
template <typename T, typename Op> __device__ __forceinline__ T krn_block_reduce(T v, Op op, T *sh)
{
    unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    for (int o = 16; o > 0; o /= 2)
        v = op(v, __shfl_down_sync(0xffffffffu, v, o));
    __syncthreads(); /* sh may still be read by a previous reduction */
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    T r = sh[0];
    for (unsigned w = 1; w < n_warps; w++)
        r = op(r, sh[w]);
    return r;
}

struct krn_op_add {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct krn_op_max {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const
    {
        return a > b ? a : b;
    }
};

#endif
