/*
 * krn_ctx.cu — the CUDA context of the cuda backend (one stream and one cuBLAS handle per
 * krn_ctx, never globals), device memory and copies, KV block transfers to and from the host,
 * and the cuBLAS GEMM.
 *
 * Launch geometry: no kernels here. Copies are cudaMemcpyAsync on the context's stream; the
 * GEMM is one cublasGemmEx call on the handle bound to that stream:
 *   y[M][N] (row-major) is, column-major, the N x M matrix op(W) . op(X) with W = w viewed as
 *   K x N (lda = K, transposed) and X = x viewed as K x M (ldb = K), ldc = N.
 */
#include <string.h>

#include "krn_cuda.cuh"

int krn_device_probe(char *why, size_t why_len)
{
    if (why != NULL && why_len > 0)
        why[0] = '\0';
    int n = 0, drv = 0, rt = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess && n > 0)
        return n;
    /* Both version queries work without a device; the driver's reports 0 without a driver. */
    if (cudaDriverGetVersion(&drv) != cudaSuccess)
        drv = 0;
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess)
        rt = CUDART_VERSION;
    cudaGetLastError(); /* clear the sticky "no driver" error */
    if (why != NULL && why_len > 0)
        krn_describe_cuda_failure(
            e == cudaSuccess ? 0 : (int)e, e == cudaSuccess ? "cudaSuccess" : cudaGetErrorName(e),
            e == cudaSuccess ? "no error" : cudaGetErrorString(e), drv, rt, why, why_len);
    return 0;
}

int krn_device_count(void)
{
    return krn_device_probe(NULL, 0);
}

void krn_device_describe(int dev, char *buf, size_t len)
{
    krn_device_info_t d;
    if (krn_device_info(dev, &d) != 0) {
        snprintf(buf, len, "CUDA device %d: unavailable", dev);
        return;
    }
    snprintf(buf, len, "%s, sm_%d%d, %d SMs, %.1f GiB, %.0f GB/s peak", d.name, d.sm_major,
             d.sm_minor, d.n_sm, (double)d.total_bytes / (1024.0 * 1024 * 1024), d.peak_gb_per_s);
}

int krn_device_info(int dev, krn_device_info_t *out)
{
    memset(out, 0, sizeof *out);
    cudaDeviceProp p;
    if (dev < 0 || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
        cudaGetLastError();
        return PC_ERR_UNSUPPORTED;
    }
    size_t nl = strnlen(p.name, sizeof p.name);
    nl = nl < sizeof out->name - 1 ? nl : sizeof out->name - 1;
    memcpy(out->name, p.name, nl);
    out->name[nl] = '\0';
    out->sm_major = p.major;
    out->sm_minor = p.minor;
    out->n_sm = p.multiProcessorCount;
    out->total_bytes = p.totalGlobalMem;
    /* Peak DRAM bandwidth: two transfers per memory clock over the bus (the figure NVIDIA's
     * data sheets quote: 3.35 TB/s for an H100 SXM). */
    int clock_khz = 0, bus_bits = 0;
    if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev) != cudaSuccess) {
        cudaGetLastError();
        clock_khz = bus_bits = 0;
    }
    out->peak_gb_per_s = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) * 1e-9;
    return 0;
}

int krn_mem_info(krn_ctx_t *c, size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = *total_bytes = 0;
    KRN_ENTER(c);
    KRN_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
    return 0;
}

/* cuBLAS workspace per handle: NVIDIA's recommended sizes, 32 MiB on Hopper (sm_90) and newer,
 * 4 MiB before. */
static size_t blas_ws_bytes(int major)
{
    return major >= 9 ? (size_t)32 << 20 : (size_t)4 << 20;
}

static int ctx_setup(krn_ctx_t *c)
{
    KRN_CUDA_CHECK(cudaSetDevice(c->dev));
    int major = 0;
    KRN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->dev));
    KRN_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    KRN_CUBLAS_CHECK(cublasCreate(&c->blas));
    KRN_CUBLAS_CHECK(cublasSetStream(c->blas, c->stream));
    /* The context owns the handle's workspace, so GEMMs never allocate behind our back (and a
     * later CUDA graph capture sees fixed memory). Set after cublasSetStream, which resets the
     * workspace to the library's default pool. */
    c->blas_ws_bytes = blas_ws_bytes(major);
    KRN_CUDA_CHECK(cudaMalloc(&c->blas_ws, c->blas_ws_bytes));
    KRN_CUBLAS_CHECK(cublasSetWorkspace(c->blas, c->blas_ws, c->blas_ws_bytes));
    /* F16/BF16 inputs with F32 accumulation and output; tensor cores as the library sees fit. */
    KRN_CUBLAS_CHECK(cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH));
    return 0;
}

int krn_ctx_init(int dev, krn_ctx_t **out)
{
    *out = NULL;
    if (dev < 0 || dev >= krn_device_count())
        return PC_ERR_UNSUPPORTED;
    krn_ctx_t *c = (krn_ctx_t *)calloc(1, sizeof *c);
    if (c == NULL)
        return PC_ERR_NOMEM;
    c->dev = dev;
    int rc = ctx_setup(c);
    if (rc != 0) {
        krn_ctx_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void krn_ctx_free(krn_ctx_t *c)
{
    if (c == NULL)
        return;
    KRN_CUDA_WARN(cudaSetDevice(c->dev));
    if (c->stream != NULL)
        KRN_CUDA_WARN(cudaStreamSynchronize(c->stream));
    if (c->blas != NULL)
        KRN_CUBLAS_WARN(cublasDestroy(c->blas));
    if (c->blas_ws != NULL)
        KRN_CUDA_WARN(cudaFree(c->blas_ws));
    if (c->smp_scratch != NULL)
        KRN_CUDA_WARN(cudaFree(c->smp_scratch));
    if (c->stream != NULL)
        KRN_CUDA_WARN(cudaStreamDestroy(c->stream));
    free(c);
}

int krn_ctx_sync(krn_ctx_t *c)
{
    KRN_ENTER(c);
    KRN_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return 0;
}

int krn_dev_alloc(krn_ctx_t *c, size_t n_bytes, void **out)
{
    *out = NULL;
    KRN_ENTER(c);
    cudaError_t e = cudaMalloc(out, n_bytes ? n_bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *out = NULL;
        return PC_ERR_NOMEM;
    }
    return 0;
}

void krn_dev_free(krn_ctx_t *c, void *p)
{
    if (p == NULL)
        return;
    KRN_CUDA_WARN(cudaSetDevice(c->dev));
    KRN_CUDA_WARN(cudaFree(p));
}

int krn_copy_h2d(krn_ctx_t *c, void *dst, const void *src, size_t n)
{
    KRN_ENTER(c);
    if (n > 0)
        KRN_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c->stream));
    return 0;
}

int krn_copy_d2h(krn_ctx_t *c, void *dst, const void *src, size_t n)
{
    KRN_ENTER(c);
    if (n > 0)
        KRN_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, c->stream));
    return 0;
}

int krn_copy_d2d(krn_ctx_t *c, void *dst, const void *src, size_t n)
{
    KRN_ENTER(c);
    if (n > 0)
        KRN_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, c->stream));
    return 0;
}

int krn_memset(krn_ctx_t *c, void *dst, int value, size_t n)
{
    KRN_ENTER(c);
    if (n > 0)
        KRN_CUDA_CHECK(cudaMemsetAsync(dst, value, n, c->stream));
    return 0;
}

static int blocks_xfer(krn_ctx_t *c, const krn_kv_t *kv, const int32_t *ids, int32_t n, void *host,
                       bool to_host)
{
    if (n < 0)
        return PC_ERR_INVAL;
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= kv->n_blocks)
            return PC_ERR_INVAL;
    KRN_ENTER(c);
    size_t bb = krn_kv_block_bytes(kv);
    for (int32_t i = 0; i < n; i++) {
        uint8_t *dev = (uint8_t *)kv->base + (int64_t)ids[i] * (int64_t)bb;
        uint8_t *h = (uint8_t *)host + (size_t)i * bb;
        if (to_host)
            KRN_CUDA_CHECK(cudaMemcpyAsync(h, dev, bb, cudaMemcpyDeviceToHost, c->stream));
        else
            KRN_CUDA_CHECK(cudaMemcpyAsync(dev, h, bb, cudaMemcpyHostToDevice, c->stream));
    }
    return 0;
}

int krn_blocks_to_host(krn_ctx_t *c, const krn_kv_t *kv, const int32_t *ids, int32_t n, void *host)
{
    return blocks_xfer(c, kv, ids, n, host, true);
}

int krn_blocks_from_host(krn_ctx_t *c, const krn_kv_t *kv, const int32_t *ids, int32_t n,
                         const void *host)
{
    return blocks_xfer(c, kv, ids, n, (void *)host, false);
}

/*
 * The GEMM in cuBLAS's column-major terms. A row-major array A[r][c] is, read column-major, the
 * c x r matrix A^T with leading dimension c. So:
 *
 *   w  row-major [N][K] (weights [n_out][n_in])  = column-major K x N  = W^T,  ld K
 *   x  row-major [M][K] (activations)            = column-major K x M  = X^T,  ld K
 *   y  row-major [M][N] (output), wanted y = X.W^T, column-major N x M = Y^T = (X.W^T)^T
 *                                                                       = W.X^T,  ld N
 *
 * cublasGemmEx computes C (m x n) = op(A) (m x k) . op(B) (k x n). With A = the w buffer
 * (K x N), op(A) = A^T = W is N x K; with B = the x buffer (K x M), op(B) = B = X^T is K x M;
 * so C = W.X^T = Y^T, which is N x M column-major, ld N: exactly y row-major [M][N]. Hence
 * transa = T, transb = N, m = N, n = M, k = K, lda = K, ldb = K, ldc = N. beta = 1 adds to y
 * (the residual stream), beta = 0 overwrites it.
 */
int krn_gemm(krn_ctx_t *c, const krn_gemm_args_t *a)
{
    if (a->M < 0 || a->N <= 0 || a->K <= 0 || (a->dtype != KRN_F16 && a->dtype != KRN_BF16) ||
        (a->ldy != 0 && a->ldy < a->N))
        return PC_ERR_INVAL;
    if (a->M == 0)
        return 0;
    KRN_ENTER(c);
    cudaDataType_t t = a->dtype == KRN_F16 ? CUDA_R_16F : CUDA_R_16BF;
    const float alpha = 1.0f, beta = a->accumulate ? 1.0f : 0.0f;
    KRN_CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, a->N, a->M, a->K, &alpha, a->w,
                                  t, a->K, a->x, t, a->K, &beta, a->y, CUDA_R_32F,
                                  a->ldy ? a->ldy : a->N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}
