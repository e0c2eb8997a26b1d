/*
 * krn_graph.cu — what the cuda backend needs to cut its host time per step: pinned host memory
 * for its one staging copy per step, and CUDA graphs of the context's stream (capture, update
 * in place, replay) for decode steps.
 *
 * No kernels here. A graph records what the context enqueues between krn_graph_begin and
 * krn_graph_end, with every argument as it was then: device addresses, sizes, cuBLAS's choice
 * of kernel. The caller keeps those fixed for as long as it replays the graph (kernels.h).
 * cuBLAS takes part because the context gave its handle a fixed workspace (krn_ctx.cu).
 */
#include "krn_cuda.cuh"

struct krn_graph {
    cudaGraphExec_t exec;
};

int krn_host_alloc(krn_ctx_t *c, size_t n_bytes, void **out)
{
    *out = NULL;
    KRN_ENTER(c);
    if (cudaMallocHost(out, n_bytes ? n_bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        *out = NULL;
        return PC_ERR_NOMEM;
    }
    return 0;
}

void krn_host_free(krn_ctx_t *c, void *p)
{
    if (p == NULL)
        return;
    KRN_CUDA_WARN(cudaSetDevice(c->dev));
    KRN_CUDA_WARN(cudaFreeHost(p));
}

int krn_graph_begin(krn_ctx_t *c)
{
    KRN_ENTER(c);
    /* Thread-local: another thread's unsafe call (a cudaMalloc of another engine) does not
     * invalidate this capture, and this thread cannot make one unnoticed. */
    KRN_CUDA_CHECK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    return 0;
}

void krn_graph_abort(krn_ctx_t *c)
{
    cudaGraph_t g = NULL;
    KRN_CUDA_WARN(cudaSetDevice(c->dev));
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(c->stream, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone &&
        cudaStreamEndCapture(c->stream, &g) == cudaSuccess && g != NULL)
        cudaGraphDestroy(g);
    cudaGetLastError(); /* an invalidated capture's error is not the next call's */
}

int krn_graph_end(krn_ctx_t *c, krn_graph_t **gp, int32_t *n_nodes, bool *updated)
{
    *n_nodes = 0;
    *updated = false;
    KRN_ENTER(c);
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (e != cudaSuccess || g == NULL) {
        fprintf(stderr, "kernels: graph capture failed: %s\n", cudaGetErrorString(e));
        cudaGetLastError();
        if (g != NULL)
            cudaGraphDestroy(g);
        return PC_ERR_UNSUPPORTED;
    }
    size_t n = 0;
    if (cudaGraphGetNodes(g, NULL, &n) != cudaSuccess) {
        cudaGetLastError();
        n = 0;
    }
    *n_nodes = (int32_t)n;
    int rc = 0;
    if (*gp != NULL) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate((*gp)->exec, g, &info) == cudaSuccess) {
            *updated = true;
            goto done;
        }
        cudaGetLastError(); /* refused (another topology): rebuilt below */
        KRN_CUDA_WARN(cudaGraphExecDestroy((*gp)->exec));
        (*gp)->exec = NULL;
    } else {
        *gp = (krn_graph_t *)calloc(1, sizeof **gp);
        if (*gp == NULL) {
            rc = PC_ERR_NOMEM;
            goto done;
        }
    }
    e = cudaGraphInstantiate(&(*gp)->exec, g, 0);
    if (e != cudaSuccess) {
        fprintf(stderr, "kernels: cudaGraphInstantiate: %s\n", cudaGetErrorString(e));
        cudaGetLastError();
        free(*gp);
        *gp = NULL;
        rc = PC_ERR_UNSUPPORTED;
    }
done:
    KRN_CUDA_WARN(cudaGraphDestroy(g));
    return rc;
}

int krn_graph_launch(krn_ctx_t *c, krn_graph_t *g)
{
    if (g == NULL || g->exec == NULL)
        return PC_ERR_INVAL;
    KRN_ENTER(c);
    KRN_CUDA_CHECK(cudaGraphLaunch(g->exec, c->stream));
    return 0;
}

void krn_graph_free(krn_ctx_t *c, krn_graph_t *g)
{
    if (g == NULL)
        return;
    KRN_CUDA_WARN(cudaSetDevice(c->dev));
    if (g->exec != NULL)
        KRN_CUDA_WARN(cudaGraphExecDestroy(g->exec));
    free(g);
}
