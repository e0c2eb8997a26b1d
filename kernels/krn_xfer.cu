/*
 * krn_xfer.cu — KV block transfers between the device pool and pinned host memory on their own
 * stream (kernels.h, krn_xfer_*): the G2 host tier's copies, overlapped with the compute of the
 * context's stream.
 *
 * No kernels here: a block is one contiguous region of block_bytes in the pool (every layer of
 * a block is contiguous, engine/kvpool.h), so a transfer is one cudaMemcpyAsync per block, or
 * per run of consecutive block ids (one DMA descriptor for the run: fewer, larger copies).
 *
 * Fences. Transfer k (k = 1, 2, ...) records event ring[k % KRN_XFER_RING] on the copy stream
 * after its copies. `done` is the highest fence known complete; every fence at or below it is
 * complete, because the copy stream runs transfers in order. Before a slot is reused by
 * fence k, fence k - KRN_XFER_RING (its previous owner) is waited for, so a fence older than the
 * ring is always complete and a query never reads a recycled event.
 */
#include <stdlib.h>

#include "krn_cuda.cuh"

struct krn_xfer {
    krn_ctx_t *ctx;
    cudaStream_t stream;
    cudaEvent_t after_compute; /* recorded on the context's stream before each transfer */
    cudaEvent_t ring[KRN_XFER_RING];
    uint64_t last; /* the last fence issued */
    uint64_t done; /* every fence <= done is complete */
};

static int xfer_setup(krn_xfer_t *x)
{
    KRN_ENTER(x->ctx);
    /* Non-blocking: the copy stream never synchronizes with the legacy default stream. Events
     * without timing are the cheapest to record and query. */
    KRN_CUDA_CHECK(cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking));
    KRN_CUDA_CHECK(cudaEventCreateWithFlags(&x->after_compute, cudaEventDisableTiming));
    for (int i = 0; i < KRN_XFER_RING; i++)
        KRN_CUDA_CHECK(cudaEventCreateWithFlags(&x->ring[i], cudaEventDisableTiming));
    return 0;
}

int krn_xfer_init(krn_ctx_t *c, krn_xfer_t **out)
{
    *out = NULL;
    krn_xfer_t *x = (krn_xfer_t *)calloc(1, sizeof *x);
    if (x == NULL)
        return PC_ERR_NOMEM;
    x->ctx = c;
    int rc = xfer_setup(x);
    if (rc != 0) {
        krn_xfer_free(x);
        return rc;
    }
    *out = x;
    return 0;
}

void krn_xfer_free(krn_xfer_t *x)
{
    if (x == NULL)
        return;
    KRN_CUDA_WARN(cudaSetDevice(x->ctx->dev));
    if (x->stream != NULL)
        KRN_CUDA_WARN(cudaStreamSynchronize(x->stream));
    for (int i = 0; i < KRN_XFER_RING; i++)
        if (x->ring[i] != NULL)
            KRN_CUDA_WARN(cudaEventDestroy(x->ring[i]));
    if (x->after_compute != NULL)
        KRN_CUDA_WARN(cudaEventDestroy(x->after_compute));
    if (x->stream != NULL)
        KRN_CUDA_WARN(cudaStreamDestroy(x->stream));
    free(x);
}

uint64_t krn_xfer_last(const krn_xfer_t *x)
{
    return x->last;
}

static cudaEvent_t slot(krn_xfer_t *x, uint64_t fence)
{
    return x->ring[fence % KRN_XFER_RING];
}

int krn_xfer_blocks(krn_xfer_t *x, const krn_kv_t *kv, const int32_t *ids, int32_t n, void *host,
                    bool to_host, uint64_t *fence)
{
    *fence = x->last;
    if (n < 0 || (n > 0 && host == NULL))
        return PC_ERR_INVAL;
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= kv->n_blocks)
            return PC_ERR_INVAL;
    KRN_ENTER(x->ctx);
    uint64_t f = x->last + 1;
    /* The slot's previous owner must be complete before its event is recorded again. */
    if (f > KRN_XFER_RING && x->done < f - KRN_XFER_RING) {
        KRN_CUDA_CHECK(cudaEventSynchronize(slot(x, f)));
        x->done = f - KRN_XFER_RING;
    }
    KRN_CUDA_CHECK(cudaEventRecord(x->after_compute, x->ctx->stream));
    KRN_CUDA_CHECK(cudaStreamWaitEvent(x->stream, x->after_compute, 0));
    size_t bb = krn_kv_block_bytes(kv);
    cudaMemcpyKind kind = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    for (int32_t i = 0; i < n;) {
        /* A run of consecutive ids is one region on both sides. */
        int32_t j = i + 1;
        while (j < n && ids[j] == ids[j - 1] + 1)
            j++;
        uint8_t *dev = (uint8_t *)kv->base + (int64_t)ids[i] * (int64_t)bb;
        uint8_t *h = (uint8_t *)host + (size_t)i * bb;
        size_t len = (size_t)(j - i) * bb;
        if (to_host)
            KRN_CUDA_CHECK(cudaMemcpyAsync(h, dev, len, kind, x->stream));
        else
            KRN_CUDA_CHECK(cudaMemcpyAsync(dev, h, len, kind, x->stream));
        i = j;
    }
    KRN_CUDA_CHECK(cudaEventRecord(slot(x, f), x->stream));
    x->last = f;
    *fence = f;
    return 0;
}

int krn_xfer_query(krn_xfer_t *x, uint64_t fence)
{
    if (fence > x->last)
        return PC_ERR_INVAL;
    if (fence <= x->done)
        return 1;
    KRN_ENTER(x->ctx);
    cudaError_t e = cudaEventQuery(slot(x, fence));
    if (e == cudaErrorNotReady) {
        cudaGetLastError(); /* not an error: clear it */
        return 0;
    }
    KRN_CUDA_CHECK(e);
    x->done = fence;
    return 1;
}

int krn_xfer_wait(krn_xfer_t *x, uint64_t fence)
{
    if (fence > x->last)
        return PC_ERR_INVAL;
    if (fence <= x->done)
        return 0;
    KRN_ENTER(x->ctx);
    KRN_CUDA_CHECK(cudaEventSynchronize(slot(x, fence)));
    x->done = fence;
    return 0;
}

int krn_xfer_order(krn_xfer_t *x, uint64_t fence)
{
    if (fence > x->last)
        return PC_ERR_INVAL;
    if (fence <= x->done)
        return 0;
    KRN_ENTER(x->ctx);
    KRN_CUDA_CHECK(cudaStreamWaitEvent(x->ctx->stream, slot(x, fence), 0));
    return 0;
}
