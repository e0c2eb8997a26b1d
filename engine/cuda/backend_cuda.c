/*
 * backend_cuda.c — the CUDA backend: the forward step of backend_cpu.c on the GPU, through the
 * kernels of kernels/ (plain C ABI) and cuBLAS (see backend.h, kernels/kernels.h).
 *
 * One step, for T batch rows, on the context's stream (one stream and one cuBLAS handle per
 * backend object):
 *
 *   x = embed(tokens)                                        krn_embed
 *   per layer:  xa = rmsnorm(x) * attn_norm, in the GEMM type krn_rmsnorm_convert
 *               qkv = xa.[Wq|Wk|Wv]^T  (one GEMM)             krn_gemm
 *               q, k, v (+ biases); q/k head norms (qwen3);  krn_qkv_rope_kv (one kernel,
 *               rope; q *= 1/sqrt(d); k, v -> KV blocks       strided views of qkv)
 *               att = paged attention                        krn_attention, or in a decode
 *                                                            step krn_decode_attention
 *               x += att.Wo^T                                krn_convert + krn_gemm (beta = 1)
 *               xa = rmsnorm(x) * ffn_norm; gu = xa.[Wg|Wu]^T krn_rmsnorm_convert, krn_gemm
 *               xa = silu(g) * u; x += xa.Wd^T               krn_swiglu_convert, krn_gemm
 *   logits = (rmsnorm(x[rows]) * output_norm).Wout^T for the rows asked for (one gather +
 *            norm + convert kernel, then the GEMM per chunk), copied to the host or sampled
 *
 * That is 10 launches per layer where the unfused path takes 21 to 26. The fused GEMMs need
 * their members to share a GEMM input type (krn_gemm_dtype); where they do not, the members
 * run as separate GEMMs and the fused kernels read their outputs as they are.
 *
 * Host overhead. A step's lists (token ids, positions, row -> sequence, logits rows, block
 * tables, attention tasks and merges, sampling rules) are packed into one pinned staging
 * buffer and uploaded with one copy. Decode steps (one token per sequence, at most
 * KRN_GRAPH_MAX_ROWS rows) run as CUDA graphs, one per row count: captured on first use,
 * replayed while the step's shape (krn_step_shape_t) is unchanged, updated in place
 * (cudaGraphExecUpdate) when it changes; every device buffer a graph reads is allocated
 * before capture and dropping a buffer drops the graphs. A failed capture turns graphs off
 * for the backend (logged) and the step runs call by call. eng_cuda_stats_get (backend.h)
 * counts launches, device operations and host time per step.
 *
 * Decode attention. A step whose rows are all one token of their own sequence runs its
 * attention with the split-KV decode kernel (krn_decode_attention: GQA heads sharing each K/V
 * read, the KV range split over about twice the SM count of CTAs, a merge) when
 * krn_decode_use accepts the shape; its split and grid come from krn_decode_step_plan (the
 * device's SM count and the step's longest context) and are part of the step's shape, so a
 * captured graph replays only with the arguments it baked in; its partials are allocated once
 * at init for the worst decode step (krn_decode_part_slots). In a mixed step the leading
 * single-token rows (the worker puts every decode before the prefill chunks) take the decode
 * kernel, and the rows after them krn_attention's task plan (tensor cores for multi-token
 * tasks), planned over those sequences alone; a prefill step runs the plan only.
 *
 * Bisecting on a GPU: KVGW_CUDA_FUSED=0 runs the unfused kernels and separate GEMMs (the
 * weights stay concatenated; the GEMMs read views), KVGW_CUDA_PACKED=0 uploads each list with
 * its own copy (and so turns graphs off), KVGW_CUDA_GRAPHS=0 runs every step call by call,
 * KVGW_CUDA_DECODE=attn runs decode steps on krn_attention's plan (the previous decode path).
 * Read when the backend is created.
 *
 * Weights live on the device as F16 or BF16, one type per matrix (krn_gemm_dtype, kernels.h),
 * and each GEMM converts its activations to that type and accumulates in F32. BF16 when the
 * file stores the matrix as BF16, when a weight exceeds F16's range, or when the GEMM's input
 * may: F16 only where a bound proven from the weights (krn_act_bound_*: normed rows for q/k/v,
 * gate/up and the output head, the V rows' range for Wo, silu(g) * u for down) stays within
 * 65504, since real models' down-projection inputs exceed it (inf, then NaN logits). F16
 * elsewhere, for its 11 significant bits. So logits match the CPU backend to about 1e-2
 * relative (F16/BF16 rounding of activations), not bit for bit.
 *
 * Quantized matrices (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K; kernels.h, "Quantized weights") stay
 * quantized on the device: their blocks are copied up as the file has them (same-type members
 * of Wq|Wk|Wv and Wg|Wu still concatenated, row after row of blocks) and never widened. The GEMM
 * type above still decides the activations' type (from the dequantized weights' range), and
 * krn_qmatmul multiplies: GEMV on the blocks for steps of up to KRN_QGEMV_MAX_ROWS rows (decode
 * reads each weight byte once), else the matrix dequantized to that type in chunks through one
 * scratch (CUDA_QSCRATCH_BYTES at most, allocated at init so a graph replays the same address)
 * and cuBLAS. A quantized embedding table is gathered with krn_dequant. The CPU backend
 * quantizes activations to 8 bits before its integer dot products (quant.h); this backend does
 * not (F32, F16 or BF16 activations against the same dequantized weights), so their logits
 * differ by the CPU side's activation rounding as well.
 *
 * KV: a device pool mirrors the engine's host pool block for block (same ids, same layout); the
 * engine keeps doing the accounting on the host pool, and its hooks forward copy-on-write copies
 * and poisoning here. The host pool's memory is not used by this backend: the engine creates it
 * without storage (kvpool.h no_storage), so no host copy of the KV budget exists.
 *
 * KV tiers (G2, the host tier): kv_to_host / kv_from_host move whole blocks between the device
 * pool and pinned host memory (host_alloc) on a copy stream of their own (krn_xfer, created on
 * first use), each transfer ordered after the compute enqueued before it and marked by a fence.
 * blk_fence[b] is the last fence that touched block b; a step, a copy-on-write copy or a
 * poisoning that touches a block whose fence is not done first makes the compute stream wait
 * for it on the device (krn_xfer_order): a block being saved is not overwritten by its next
 * owner, a block being loaded is not read early. Everything else overlaps: the host enqueues and
 * returns, steps of other sequences run while the copies do.
 *
 * Sampling: forward_sample keeps the logits on the device and runs krn_sample over them (the
 * engine's exact rules, the request's PRNG draw passed in), so only token ids cross to the
 * host; forward copies the logits for host sampling.
 *
 * Device memory: scratch is sized at init for max_tokens rows, except the logits, which the
 * output head computes in chunks of KRN_LOGITS_CHUNK_ROWS rows (a prefill asking for every
 * row's logits no longer needs max_tokens x n_vocab floats); per-step lists (block tables,
 * attention tasks) grow on demand. The KV pool is allocated last, after krn_mem_plan checked
 * against cudaMemGetInfo that it fits with a headroom (logged at info level; an error naming
 * how many tokens would fit otherwise). A failed CUDA call makes the step return
 * PC_ERR_INTERNAL.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "kernels.h"
#include "kvpool.h"
#include "model.h"
#include "pc_alloc.h"
#include "pc_assert.h"
#include "pc_err.h"
#include "pc_log.h"
#include "pc_time.h"
#include "pc_vec.h"
#include "quant.h"
#include "sampling.h"

#define CUDA_SPLIT_KV_DEFAULT 512
/* Rows sampled per krn_sample launch: its scratch is [rows][n_vocab] doubles, so the chunk
 * bounds that memory (64 x 152k vocab = 78 MB) whatever the batch. It is the logits chunk:
 * each chunk of logits rows is sampled by one launch. */
#define CUDA_SAMPLE_CHUNK KRN_LOGITS_CHUNK_ROWS
/* The most device memory the GEMM path of quantized matrices dequantizes into at once: a
 * chunk of rows of one matrix (krn_qmatmul_chunk_rows), at least one row. */
#define CUDA_QSCRATCH_BYTES ((size_t)64 << 20)

typedef struct cw {
    void *d;           /* [n_out][n_in] of dt, or [n_out][row_bytes] blocks of qtype */
    enum krn_dtype dt; /* the GEMM's input type (krn_gemm_dtype) */
    int32_t qtype;     /* a krn_qtype when the matrix stays quantized, else 0 */
    int32_t n_in, n_out;
} cw_t;

typedef struct cl {
    float *attn_norm, *ffn_norm, *bq, *bk, *bv, *q_norm, *k_norm;
    cw_t wq, wk, wv, wo, gate, up, down;
    /* Wq|Wk|Wv as one [nq + 2 nk][D] matrix and Wg|Wu as one [2 ff][D] when the members share
     * a GEMM input type (d NULL otherwise); wq .. up are views into them then. */
    cw_t wqkv, wgu;
} cl_t;

/* A captured decode graph and the step shape it baked in (krn_step_same_shape decides a
 * replay; the device addresses it used are fixed until graphs_reset). */
typedef struct graph_slot {
    krn_step_shape_t key;
    krn_graph_t *g;
    int32_t n_nodes;
    bool warm; /* a step of this row count ran eagerly: its kernels are loaded */
} graph_slot_t;

/* The device lists of one step: sections of the packed staging buffer, or separate arrays. */
typedef struct step_dev {
    int32_t *tokens, *pos, *row_seq, *logit_rows, *tables;
    krn_attn_task_t *tasks;
    krn_attn_merge_t *merges;
    krn_sample_row_t *srows;
} step_dev_t;

typedef struct cuda_be {
    eng_backend_t base;
    const eng_model_t *model;
    eng_kvpool_t *pool;
    eng_cuda_params_t p;
    krn_ctx_t *ctx;
    int err;           /* a hook's failure, reported by the next step */
    bool fuse;         /* fused kernels and GEMMs (KVGW_CUDA_FUSED != 0) */
    bool packed;       /* one staging copy per step (KVGW_CUDA_PACKED != 0) */
    bool graphs;       /* CUDA graphs for decode steps (KVGW_CUDA_GRAPHS != 0, packed) */
    bool dec_kernel;   /* decode steps on krn_decode_attention (krn_decode_use) */
    int32_t n_sm;      /* the device's SMs: the decode kernel's split sizing */
    uint64_t n_calls;  /* launches enqueued (or recorded) by this step so far */
    int n_f16, n_bf16; /* matrices uploaded as each GEMM type (krn_gemm_dtype) */
    int n_quant;       /* of which kept quantized */
    size_t quant_bytes;
    int64_t qscratch_elems; /* the largest quantized matrix's elements */
    int32_t qscratch_k;     /* its widest row */
    void *qscratch;         /* the GEMM path's dequantized chunk (krn_qmatmul) */
    size_t qscratch_bytes;
    void **allocs; /* every device allocation made at init */
    size_t n_allocs, cap_allocs;
    /* Model. */
    cw_t tok_embd, output;
    float *out_norm, *inv_freq;
    cl_t *layers;
    /* KV pool mirror. */
    krn_kv_t kv;
    /* Scratch [max_tokens] rows. */
    float *x, *h, *q, *k, *v, *att, *g, *u;
    float *logits;       /* [logits_rows][n_vocab]: one chunk of the output head's rows */
    int32_t logits_rows; /* min(max_tokens, KRN_LOGITS_CHUNK_ROWS) */
    void *xa;            /* activations converted for a GEMM: [max_tokens][max K] halves */
    int32_t *d_tokens, *d_pos, *d_row_seq, *d_logit_rows, *d_copy;
    /* Per-step lists, grown on demand (host and device). */
    int32_t *tokens, *pos, *row_seq, *logit_rows;
    int32_t *tables, *d_tables;
    size_t tables_cap, d_tables_cap;
    krn_attn_task_t *tasks, *d_tasks;
    size_t tasks_cap, d_tasks_cap;
    krn_attn_merge_t *merges, *d_merges;
    size_t merges_cap, d_merges_cap;
    krn_plan_seq_t *pseqs;
    size_t pseqs_cap;
    float *d_part_o, *d_part_ml;
    size_t part_o_cap, part_ml_cap;
    /* The decode kernel's partials, [dec_slots][head_dim] and [dec_slots][2], allocated at init
     * for the worst decode step (krn_decode_part_slots). */
    float *d_dec_part_o, *d_dec_part_ml;
    int64_t dec_slots;
    /* Device sampling (forward_sample), grown on first use. */
    krn_sample_row_t *srows, *d_srows; /* [rows] */
    size_t srows_cap, d_srows_cap;
    int32_t *d_stok; /* [rows] */
    size_t d_stok_cap;
    double *d_swork; /* [CUDA_SAMPLE_CHUNK][n_vocab] */
    size_t d_swork_cap;
    uint32_t splan; /* krn_sample_plan_of the step's rows (sample_prepare): the launches needed */
    /* The packed upload: pinned host staging and its device twin, grown on demand. */
    uint8_t *stage;
    size_t stage_cap;
    void *d_stage;
    size_t d_stage_cap;
    step_dev_t dev; /* this step's device lists */
    /* Decode graphs by row count (1 .. KRN_GRAPH_MAX_ROWS). */
    graph_slot_t *graph_slots;
    /* KV tier transfers: the copy stream (NULL until the first) and the last fence per block,
     * [n_blocks]. */
    krn_xfer_t *xfer;
    uint64_t *blk_fence;
} cuda_be_t;

/* The process-wide counters (eng_cuda_stats_get), added to with atomic adds. */
static eng_cuda_stats_t g_stats;

static void stat_add(uint64_t *counter, uint64_t n)
{
    __atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
}

void eng_cuda_stats_get(eng_cuda_stats_t *out)
{
    uint64_t *src = (uint64_t *)&g_stats, *dst = (uint64_t *)out;
    for (size_t i = 0; i < sizeof g_stats / sizeof(uint64_t); i++)
        dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}

/* Counts one launch of the step, then evaluates the launching call. */
#define LAUNCH(c, call) ((c)->n_calls++, (call))

/* An environment switch: on unless set to "0". */
static bool env_on(const char *name)
{
    const char *v = getenv(name);
    return v == NULL || strcmp(v, "0") != 0;
}

/* Destroys every captured graph: device addresses they baked in are about to change. */
static void graphs_reset(cuda_be_t *c)
{
    for (int32_t i = 0; c->graph_slots != NULL && i <= KRN_GRAPH_MAX_ROWS; i++) {
        krn_graph_free(c->ctx, c->graph_slots[i].g);
        c->graph_slots[i].g = NULL;
    }
}

static const char *cuda_name(const eng_backend_t *be)
{
    return "cuda";
}

static int dalloc(cuda_be_t *c, size_t n_bytes, void **out)
{
    if (c->n_allocs == c->cap_allocs) {
        size_t nc = c->cap_allocs ? 2 * c->cap_allocs : 64;
        void **na = pc_reallocarray(c->allocs, nc, sizeof *na);
        if (na == NULL)
            return PC_ERR_NOMEM;
        c->allocs = na;
        c->cap_allocs = nc;
    }
    int rc = krn_dev_alloc(c->ctx, n_bytes, out);
    if (rc != 0)
        return rc;
    c->allocs[c->n_allocs++] = *out;
    return 0;
}

static void cuda_free(eng_backend_t *be)
{
    cuda_be_t *c = be->ctx;
    if (c == NULL)
        return;
    if (c->pool != NULL)
        eng_kvpool_set_hooks(c->pool, NULL);
    if (c->ctx != NULL) {
        krn_xfer_free(c->xfer);
        krn_ctx_sync(c->ctx);
        graphs_reset(c);
        krn_host_free(c->ctx, c->stage);
        krn_dev_free(c->ctx, c->d_stage);
        for (size_t i = 0; i < c->n_allocs; i++)
            krn_dev_free(c->ctx, c->allocs[i]);
        krn_dev_free(c->ctx, c->d_tables);
        krn_dev_free(c->ctx, c->d_tasks);
        krn_dev_free(c->ctx, c->d_merges);
        krn_dev_free(c->ctx, c->d_part_o);
        krn_dev_free(c->ctx, c->d_part_ml);
        krn_dev_free(c->ctx, c->d_srows);
        krn_dev_free(c->ctx, c->d_stok);
        krn_dev_free(c->ctx, c->d_swork);
        krn_ctx_free(c->ctx);
    }
    pc_free(c->allocs);
    pc_free(c->layers);
    pc_free(c->tokens);
    pc_free(c->pos);
    pc_free(c->row_seq);
    pc_free(c->logit_rows);
    pc_free(c->tables);
    pc_free(c->tasks);
    pc_free(c->merges);
    pc_free(c->pseqs);
    pc_free(c->srows);
    pc_free(c->graph_slots);
    pc_free(c->blk_fence);
    pc_free(c);
}

/* The krn_qtype of a quantized weight type the kernels take (the same ggml ids), else 0. */
static int32_t qtype_of(uint32_t type)
{
    switch (type) {
    case ENG_GGML_TYPE_Q4_0:
        return KRN_QT_Q4_0;
    case ENG_GGML_TYPE_Q5_0:
        return KRN_QT_Q5_0;
    case ENG_GGML_TYPE_Q5_1:
        return KRN_QT_Q5_1;
    case ENG_GGML_TYPE_Q8_0:
        return KRN_QT_Q8_0;
    case ENG_GGML_TYPE_Q4_K:
        return KRN_QT_Q4_K;
    case ENG_GGML_TYPE_Q5_K:
        return KRN_QT_Q5_K;
    case ENG_GGML_TYPE_Q6_K:
        return KRN_QT_Q6_K;
    default:
        return 0;
    }
}

static bool cuda_supports(const eng_backend_t *be, enum eng_backend_op op, uint32_t type)
{
    switch (op) {
    case ENG_BACKEND_OP_FORWARD:
    case ENG_BACKEND_OP_MATMUL: /* F16/BF16 widened at upload, quantized kept (qtype_of) */
        return type == ENG_GGML_TYPE_F32 || type == ENG_GGML_TYPE_F16 ||
               type == ENG_GGML_TYPE_BF16 || qtype_of(type) != 0;
    case ENG_BACKEND_OP_KV:
        /* q8_0: the engine's blocks, written and read in place by the kernels (kernels.h). */
        return type == ENG_KV_F16 || type == ENG_KV_F32 || type == ENG_KV_Q8_0;
    }
    return false;
}

static int cuda_buf_alloc(eng_backend_t *be, size_t n_bytes, void **out)
{
    cuda_be_t *c = be->ctx;
    return krn_dev_alloc(c->ctx, n_bytes, out);
}

static void cuda_buf_free(eng_backend_t *be, void *buf)
{
    cuda_be_t *c = be->ctx;
    krn_dev_free(c->ctx, buf);
}

static void cuda_synchronize(eng_backend_t *be)
{
    cuda_be_t *c = be->ctx;
    if (krn_ctx_sync(c->ctx) != 0 && c->err == 0)
        c->err = PC_ERR_INTERNAL;
}

/* ---------------------------------------------------------------------------------------------
 * The KV pool mirror's hooks
 * ------------------------------------------------------------------------------------------- */

/* Makes the compute stream wait for the transfers still touching blocks[n] (see the top). */
static int order_blocks(cuda_be_t *c, const uint32_t *blocks, uint32_t n)
{
    if (c->xfer == NULL)
        return 0;
    uint64_t f = 0;
    for (uint32_t i = 0; i < n; i++)
        f = PC_MAX(f, c->blk_fence[blocks[i]]);
    return f == 0 ? 0 : krn_xfer_order(c->xfer, f);
}

static void hook_alloc(void *ud, uint32_t block)
{
    cuda_be_t *c = ud;
    if (!c->p.kv_poison)
        return;
    if (order_blocks(c, &block, 1) != 0)
        c->err = PC_ERR_INTERNAL;
    size_t bb = krn_kv_block_bytes(&c->kv);
    if (krn_memset(c->ctx, (uint8_t *)c->kv.base + (size_t)block * bb, 0xff, bb) != 0)
        c->err = PC_ERR_INTERNAL;
}

static void hook_copy(void *ud, uint32_t dst, uint32_t src, uint32_t n_tokens)
{
    cuda_be_t *c = ud;
    int32_t h[3] = {(int32_t)src, (int32_t)dst, (int32_t)n_tokens};
    uint32_t both[2] = {src, dst};
    if (order_blocks(c, both, 2) != 0)
        c->err = PC_ERR_INTERNAL;
    krn_block_copy_args_t a = {
        .kv = c->kv, .src = c->d_copy, .dst = c->d_copy + 1, .n_tokens = c->d_copy + 2, .n = 1};
    /* The host array lives on this stack frame: wait for the copy before returning. */
    if (krn_copy_h2d(c->ctx, c->d_copy, h, sizeof h) != 0 || krn_block_copy(c->ctx, &a) != 0 ||
        krn_ctx_sync(c->ctx) != 0)
        c->err = PC_ERR_INTERNAL;
}

/* The KV tiers' block transfers (kvpool.h read_block / write_block): one whole block between
 * the device pool and host memory, synchronously on the compute stream (the CUDA G2 tier brings
 * its own overlapped path). */
static int hook_read_block(void *ud, uint32_t block, void *dst)
{
    cuda_be_t *c = ud;
    size_t bb = krn_kv_block_bytes(&c->kv);
    if (order_blocks(c, &block, 1) != 0 ||
        krn_copy_d2h(c->ctx, dst, (const uint8_t *)c->kv.base + (size_t)block * bb, bb) != 0 ||
        krn_ctx_sync(c->ctx) != 0)
        return PC_ERR_INTERNAL;
    return 0;
}

static int hook_write_block(void *ud, uint32_t block, const void *src)
{
    cuda_be_t *c = ud;
    size_t bb = krn_kv_block_bytes(&c->kv);
    if (order_blocks(c, &block, 1) != 0 ||
        krn_copy_h2d(c->ctx, (uint8_t *)c->kv.base + (size_t)block * bb, src, bb) != 0 ||
        krn_ctx_sync(c->ctx) != 0)
        return PC_ERR_INTERNAL;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Weights
 * ------------------------------------------------------------------------------------------- */

static int upload_f32(cuda_be_t *c, const float *src, size_t n, float **out)
{
    *out = NULL;
    if (src == NULL)
        return 0;
    int rc = dalloc(c, n * sizeof(float), (void **)out);
    if (rc == 0)
        rc = krn_copy_h2d(c->ctx, *out, src, n * sizeof(float));
    return rc;
}

/* Row j of w's [n_out][n_in] values as F32 into row[n_in]: the values the CPU backend computes
 * with (eng_quant_row_to_f32: exact for F16 and BF16, ggml's dequantization for the quantized
 * types, which the kernels' decoder reproduces bit for bit). */
static void weight_row(const eng_weight_t *w, uint32_t j, float *row)
{
    size_t rb = eng_quant_row_bytes(w->type, w->n_in);
    eng_quant_row_to_f32(w->type, (const uint8_t *)w->data + (size_t)j * rb, row, w->n_in);
}

/* Device bytes of w as the backend stores it: its blocks, or n_out * n_in halves. */
static size_t weight_dev_bytes(const eng_weight_t *w)
{
    return qtype_of(w->type) != 0 ? eng_quant_row_bytes(w->type, w->n_in) * w->n_out
                                  : (size_t)w->n_out * w->n_in * 2;
}

/* max |w| over a weight matrix and max_j ||W_j||_2 over its rows. */
static int weight_stats(const eng_weight_t *w, float *amax, double *row_norm_max)
{
    float am = 0, *row = pc_malloc((size_t)w->n_in * sizeof(float));
    double rn = 0;
    if (row == NULL)
        return PC_ERR_NOMEM;
    for (uint32_t j = 0; j < w->n_out; j++) {
        double ss = 0;
        weight_row(w, j, row);
        for (uint32_t i = 0; i < w->n_in; i++) {
            float a = fabsf(row[i]);
            am = a > am || isnan(a) ? a : am;
            ss += (double)row[i] * row[i];
        }
        rn = sqrt(ss) > rn || isnan(ss) ? sqrt(ss) : rn;
    }
    pc_free(row);
    *amax = am;
    *row_norm_max = rn;
    return 0;
}

/* max |v| over n floats (0 for NULL: a missing bias adds nothing). */
static float vec_amax(const float *v, size_t n)
{
    float am = 0;
    for (size_t i = 0; v != NULL && i < n; i++)
        am = fabsf(v[i]) > am || isnan(v[i]) ? fabsf(v[i]) : am;
    return am;
}

/* Uploads a weight matrix to dst (device memory of weight_dev_bytes(w)); *out describes it.
 * A quantized matrix is copied as its blocks (dt is its GEMM input type); any other is
 * converted to `dt` (F16 or BF16) from its host type. */
static int upload_weight_to(cuda_be_t *c, const eng_weight_t *w, enum krn_dtype dt, void *dst,
                            cw_t *out)
{
    size_t n = (size_t)w->n_out * w->n_in;
    *out = (cw_t){.d = dst,
                  .dt = dt,
                  .qtype = qtype_of(w->type),
                  .n_in = (int32_t)w->n_in,
                  .n_out = (int32_t)w->n_out};
    if (out->qtype != 0) {
        size_t bytes = weight_dev_bytes(w);
        c->n_quant++;
        c->quant_bytes += bytes;
        c->qscratch_elems = PC_MAX(c->qscratch_elems, (int64_t)n);
        c->qscratch_k = PC_MAX(c->qscratch_k, out->n_in);
        stat_add(&g_stats.weight_bytes_quant, bytes);
        int rc = krn_copy_h2d(c->ctx, dst, w->data, bytes);
        return rc == 0 ? krn_ctx_sync(c->ctx) : rc;
    }
    stat_add(&g_stats.weight_bytes_wide, n * 2);
    if (w->type == ENG_GGML_TYPE_F16 && dt == KRN_F16) {
        int rc = krn_copy_h2d(c->ctx, dst, w->data, n * 2);
        return rc == 0 ? krn_ctx_sync(c->ctx) : rc;
    }
    uint16_t *tmp = pc_malloc(n * 2);
    float *row = pc_malloc((size_t)w->n_in * sizeof(float));
    int rc = PC_ERR_NOMEM;
    if (tmp != NULL && row != NULL) {
        for (uint32_t j = 0; j < w->n_out; j++) {
            weight_row(w, j, row);
            for (uint32_t i = 0; i < w->n_in; i++)
                tmp[(size_t)j * w->n_in + i] =
                    dt == KRN_F16 ? krn_f32_to_f16(row[i]) : krn_f32_to_bf16(row[i]);
        }
        rc = krn_copy_h2d(c->ctx, dst, tmp, n * 2);
        if (rc == 0)
            rc = krn_ctx_sync(c->ctx); /* tmp is freed below */
    }
    pc_free(tmp);
    pc_free(row);
    return rc;
}

/* The GEMM input type of a matrix whose activations are bounded by act_bound (krn_gemm_dtype:
 * BF16 for BF16 files, F16 only where the activations provably fit) into *dt. Returns 0 or
 * PC_ERR_NOMEM. */
static int weight_dtype(cuda_be_t *c, const eng_weight_t *w, double act_bound, enum krn_dtype *dt)
{
    float amax;
    double rn;
    int rc = weight_stats(w, &amax, &rn);
    if (rc != 0)
        return rc;
    krn_gemm_dtype_params_t dp = {.file_dtype = w->file_type == ENG_GGML_TYPE_BF16  ? KRN_BF16
                                                : w->file_type == ENG_GGML_TYPE_F16 ? KRN_F16
                                                                                    : KRN_F32,
                                  .weight_amax = amax,
                                  .act_bound = act_bound,
                                  .act_amax_measured = -1.0}; /* no calibration pass yet */
    *dt = krn_gemm_dtype(&dp);
    c->n_bf16 += *dt == KRN_BF16;
    c->n_f16 += *dt == KRN_F16;
    return 0;
}

/* weight_dtype, then the upload into a device allocation of its own. */
static int upload_weight(cuda_be_t *c, const eng_weight_t *w, double act_bound, cw_t *out)
{
    enum krn_dtype dt;
    void *d;
    int rc = weight_dtype(c, w, act_bound, &dt);
    if (rc == 0)
        rc = dalloc(c, weight_dev_bytes(w), &d);
    return rc != 0 ? rc : upload_weight_to(c, w, dt, d, out);
}

/* Matrices that share their input (Wq, Wk, Wv; Wg, Wu): when their GEMM input types and their
 * storage (the same quantized type, or all widened) agree they are uploaded back to back as one
 * [sum n_out][n_in] matrix (rows of halves or of blocks), *fused describes it and outs[i] are
 * views into it, so one GEMM computes them all; otherwise each gets its own allocation and
 * fused->d is NULL (the step runs one GEMM per matrix). */
static int upload_group(cuda_be_t *c, const eng_weight_t *const *ws, const double *bounds, int n,
                        cw_t *const *outs, cw_t *fused)
{
    enum krn_dtype dt[3];
    bool same = true;
    size_t rows = 0, bytes = 0;
    int rc;
    PC_ASSERT(n <= 3);
    for (int i = 0; i < n; i++) {
        if ((rc = weight_dtype(c, ws[i], bounds[i], &dt[i])) != 0)
            return rc;
        same = same && dt[i] == dt[0] && ws[i]->n_in == ws[0]->n_in &&
               qtype_of(ws[i]->type) == qtype_of(ws[0]->type);
        rows += ws[i]->n_out;
        bytes += weight_dev_bytes(ws[i]);
    }
    memset(fused, 0, sizeof *fused);
    if (!same) {
        for (int i = 0; i < n; i++) {
            void *d;
            if ((rc = dalloc(c, weight_dev_bytes(ws[i]), &d)) != 0 ||
                (rc = upload_weight_to(c, ws[i], dt[i], d, outs[i])) != 0)
                return rc;
        }
        return 0;
    }
    uint8_t *base;
    if ((rc = dalloc(c, bytes, (void **)&base)) != 0)
        return rc;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if ((rc = upload_weight_to(c, ws[i], dt[0], base + off, outs[i])) != 0)
            return rc;
        off += weight_dev_bytes(ws[i]);
    }
    *fused = (cw_t){.d = base,
                    .dt = dt[0],
                    .qtype = qtype_of(ws[0]->type),
                    .n_in = (int32_t)ws[0]->n_in,
                    .n_out = (int32_t)rows};
    if (fused->qtype != 0) /* the GEMM path dequantizes chunks of the fused matrix */
        c->qscratch_elems = PC_MAX(c->qscratch_elems, (int64_t)rows * ws[0]->n_in);
    return 0;
}

static int upload_model(cuda_be_t *c)
{
    const eng_model_t *m = c->model;
    const eng_hparams_t *hp = &m->hp;
    int32_t D = (int32_t)hp->n_embd;
    size_t nq = (size_t)hp->n_head * hp->head_dim, nk = (size_t)hp->n_head_kv * hp->head_dim;
    /* The output head's input is rmsnorm(x) * out_norm; a tied embedding table takes the
     * head's type (the gather reads either). */
    int rc =
        upload_weight(c, &m->output, krn_act_bound_normed(D, vec_amax(m->out_norm, D)), &c->output);
    if (rc != 0)
        return rc;
    if (m->output.data == m->tok_embd.data)
        c->tok_embd = c->output;
    else if ((rc = upload_weight(c, &m->tok_embd, 0.0, &c->tok_embd)) != 0)
        return rc; /* never a GEMM input: the range of its weights alone decides */
    if ((rc = upload_f32(c, m->out_norm, hp->n_embd, &c->out_norm)) != 0 ||
        (rc = upload_f32(c, m->rope_inv_freq, hp->rope_dim / 2, &c->inv_freq)) != 0)
        return rc;
    c->layers = pc_calloc(hp->n_layer, sizeof *c->layers);
    if (c->layers == NULL)
        return PC_ERR_NOMEM;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const eng_layer_t *L = &m->layers[l];
        cl_t *d = &c->layers[l];
        if ((rc = upload_f32(c, L->attn_norm, hp->n_embd, &d->attn_norm)) != 0 ||
            (rc = upload_f32(c, L->ffn_norm, hp->n_embd, &d->ffn_norm)) != 0 ||
            (rc = upload_f32(c, L->bq, nq, &d->bq)) != 0 ||
            (rc = upload_f32(c, L->bk, nk, &d->bk)) != 0 ||
            (rc = upload_f32(c, L->bv, nk, &d->bv)) != 0 ||
            (rc = upload_f32(c, L->q_norm, hp->head_dim, &d->q_norm)) != 0 ||
            (rc = upload_f32(c, L->k_norm, hp->head_dim, &d->k_norm)) != 0)
            return rc;
        /* Activation bounds (kernels.h): q/k/v and gate/up take normed rows; Wo takes the
         * attention output, a convex combination of V rows (h . Wv^T + bv); down takes
         * silu(h . Wg^T) * (h . Wu^T). */
        float an = vec_amax(L->attn_norm, D), fn = vec_amax(L->ffn_norm, D), wam;
        double wv_rn, wg_rn, wu_rn;
        if ((rc = weight_stats(&L->wv, &wam, &wv_rn)) != 0 ||
            (rc = weight_stats(&L->w_gate, &wam, &wg_rn)) != 0 ||
            (rc = weight_stats(&L->w_up, &wam, &wu_rn)) != 0)
            return rc;
        double b_attn = krn_act_bound_normed(D, an), b_ffn = krn_act_bound_normed(D, fn);
        double b_o = krn_act_bound_proj(D, an, wv_rn, vec_amax(L->bv, nk));
        double b_down = krn_act_bound_swiglu(krn_act_bound_proj(D, fn, wg_rn, 0),
                                             krn_act_bound_proj(D, fn, wu_rn, 0));
        const eng_weight_t *qkv[3] = {&L->wq, &L->wk, &L->wv}, *gu[2] = {&L->w_gate, &L->w_up};
        cw_t *qkv_out[3] = {&d->wq, &d->wk, &d->wv}, *gu_out[2] = {&d->gate, &d->up};
        const double qkv_b[3] = {b_attn, b_attn, b_attn}, gu_b[2] = {b_ffn, b_ffn};
        if ((rc = upload_group(c, qkv, qkv_b, 3, qkv_out, &d->wqkv)) != 0 ||
            (rc = upload_weight(c, &L->wo, b_o, &d->wo)) != 0 ||
            (rc = upload_group(c, gu, gu_b, 2, gu_out, &d->wgu)) != 0 ||
            (rc = upload_weight(c, &L->w_down, b_down, &d->down)) != 0)
            return rc;
    }
    return krn_ctx_sync(c->ctx);
}

/* ---------------------------------------------------------------------------------------------
 * The step
 * ------------------------------------------------------------------------------------------- */

/* y[M][n_out] (+)= xa[M][n_in] . W^T with xa already of W's GEMM type: cuBLAS, or for a
 * quantized W krn_qmatmul (its GEMV, or its chunks through c->qscratch). */
static int gemm_raw(cuda_be_t *c, const void *xa, int32_t M, const cw_t *w, float *y, bool acc)
{
    if (w->qtype != 0) {
        krn_qmatmul_args_t q = {.w = w->d,
                                .qtype = (enum krn_qtype)w->qtype,
                                .x = xa,
                                .x_dtype = w->dt,
                                .y = y,
                                .M = M,
                                .N = w->n_out,
                                .K = w->n_in,
                                .accumulate = acc,
                                .scratch = c->qscratch,
                                .scratch_bytes = c->qscratch_bytes};
        /* The GEMM path is a dequantization and a GEMM per chunk. */
        if (M > KRN_QGEMV_MAX_ROWS) {
            int32_t chunk = krn_qmatmul_chunk_rows(w->n_out, w->n_in, 2, c->qscratch_bytes);
            c->n_calls += chunk > 0 ? 2 * (uint64_t)((w->n_out + chunk - 1) / chunk) - 1 : 0;
        }
        return LAUNCH(c, krn_qmatmul(c->ctx, &q));
    }
    krn_gemm_args_t g = {.x = xa,
                         .w = w->d,
                         .y = y,
                         .M = M,
                         .N = w->n_out,
                         .K = w->n_in,
                         .dtype = w->dt,
                         .accumulate = acc};
    return LAUNCH(c, krn_gemm(c->ctx, &g));
}

/* y[M][n_out] (+)= x[M][n_in] . W^T: x converted to W's type, then cuBLAS. */
static int gemm(cuda_be_t *c, const float *x, int32_t M, const cw_t *w, float *y, bool acc)
{
    krn_convert_args_t cv = {.x = x, .y = c->xa, .n = (int64_t)M * w->n_in, .dtype = w->dt};
    int rc = LAUNCH(c, krn_convert(c->ctx, &cv));
    return rc != 0 ? rc : gemm_raw(c, c->xa, M, w, y, acc);
}

/* Grows a device array to n elements (contents are not kept). A new address invalidates every
 * captured graph, which are dropped. */
static int grow_dev(cuda_be_t *c, void **p, size_t *cap, size_t n, size_t elem)
{
    if (n <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < n)
        nc *= 2;
    graphs_reset(c);
    krn_dev_free(c->ctx, *p);
    *p = NULL;
    *cap = 0;
    int rc = krn_dev_alloc(c->ctx, nc * elem, p);
    if (rc != 0)
        return rc;
    *cap = nc;
    return 0;
}

/* Grows the sampler's output and scratch for n logits rows, and writes the sampling rules of
 * the rows (rows[n] host) to dst (host: the staging buffer or c->srows). Nothing is enqueued:
 * this runs before a step's first launch, so a captured step allocates nothing. */
static int sample_prepare(cuda_be_t *c, const eng_sample_row_t *rows, int32_t n,
                          krn_sample_row_t *dst)
{
    int32_t V = (int32_t)c->model->hp.n_vocab;
    int32_t chunk = n < CUDA_SAMPLE_CHUNK ? n : CUDA_SAMPLE_CHUNK;
    int rc;
    /* krn_sample's own scratch at its largest (a chunk) once, so it never moves under a graph. */
    if ((rc = grow_dev(c, (void **)&c->d_stok, &c->d_stok_cap, (size_t)n, sizeof(int32_t))) != 0 ||
        (rc = grow_dev(c, (void **)&c->d_swork, &c->d_swork_cap, (size_t)chunk * V,
                       sizeof(double))) != 0 ||
        (rc = krn_sample_reserve(c->ctx, CUDA_SAMPLE_CHUNK)) != 0)
        return rc;
    for (int32_t i = 0; i < n; i++)
        dst[i] = (krn_sample_row_t){.temperature = rows[i].temperature,
                                    .top_k = rows[i].top_k > INT32_MAX ? INT32_MAX
                                                                       : (int32_t)rows[i].top_k,
                                    .top_p = rows[i].top_p,
                                    .min_p = rows[i].min_p,
                                    .u = rows[i].u};
    c->splan = krn_sample_plan_of(dst, n);
    return 0;
}

/* Samples logits rows r0 .. r0 + n - 1 of the step, which c->logits holds from its row 0
 * (n <= CUDA_SAMPLE_CHUNK: the scratch's rows; launches on one stream run in order, so the
 * next chunk reuses it). */
static int sample_chunk(cuda_be_t *c, int32_t r0, int32_t n)
{
    krn_sample_args_t sa = {.logits = c->logits,
                            .row = c->dev.srows + r0,
                            .token = c->d_stok + r0,
                            .work = c->d_swork,
                            .n_rows = n,
                            .n_vocab = (int32_t)c->model->hp.n_vocab,
                            .plan = c->splan};
    return LAUNCH(c, krn_sample(c->ctx, &sa));
}

/* One layer's attention half: x -> q (roped, scaled), K/V stored, att, x += att . Wo^T. */
static int layer_attention(cuda_be_t *c, const cl_t *L, int32_t l, const krn_step_shape_t *sh)
{
    const eng_hparams_t *hp = &c->model->hp;
    int32_t D = (int32_t)hp->n_embd, hd = (int32_t)hp->head_dim, T = sh->n_rows;
    int32_t nq = (int32_t)(hp->n_head * hp->head_dim), nk = (int32_t)(hp->n_head_kv * hp->head_dim);
    const step_dev_t *dv = &c->dev;
    int rc;
    krn_qkv_rope_kv_args_t qa = {.kv = c->kv,
                                 .layer = l,
                                 .n_head = (int32_t)hp->n_head,
                                 .q_out = c->q,
                                 .bq = L->bq,
                                 .bk = L->bk,
                                 .bv = L->bv,
                                 .q_norm = L->q_norm,
                                 .k_norm = L->k_norm,
                                 .eps = hp->rms_eps,
                                 .inv_freq = c->inv_freq,
                                 .rope_dim = (int32_t)hp->rope_dim,
                                 .style = hp->rope_style == ENG_ROPE_NEOX ? KRN_ROPE_NEOX
                                                                          : KRN_ROPE_NORM,
                                 .q_scale = 1.0f / sqrtf((float)hd),
                                 .row_pos = dv->pos,
                                 .row_seq = dv->row_seq,
                                 .block_tables = dv->tables,
                                 .n_rows = T,
                                 .max_blocks = sh->max_blocks};
    if (c->fuse && L->wqkv.d != NULL) {
        /* rmsnorm straight to the GEMM's type, one GEMM into [T][nq + 2 nk] (c->h), then the
         * epilogue reads its three column ranges. */
        krn_rmsnorm_convert_args_t rn = {.x = c->x,
                                         .w = L->attn_norm,
                                         .y = c->xa,
                                         .n_rows = T,
                                         .n_src = T,
                                         .width = D,
                                         .eps = hp->rms_eps,
                                         .dtype = L->wqkv.dt};
        qa.q_in = c->h;
        qa.k_in = c->h + nq;
        qa.v_in = c->h + nq + nk;
        qa.ld_q = qa.ld_kv = nq + 2 * nk;
        if ((rc = LAUNCH(c, krn_rmsnorm_convert(c->ctx, &rn))) != 0 ||
            (rc = gemm_raw(c, c->xa, T, &L->wqkv, c->h, false)) != 0 ||
            (rc = LAUNCH(c, krn_qkv_rope_kv(c->ctx, &qa))) != 0)
            return rc;
    } else {
        krn_rmsnorm_args_t rn = {
            .x = c->x, .w = L->attn_norm, .y = c->h, .n_rows = T, .width = D, .eps = hp->rms_eps};
        if ((rc = LAUNCH(c, krn_rmsnorm(c->ctx, &rn))) != 0 ||
            (rc = gemm(c, c->h, T, &L->wq, c->q, false)) ||
            (rc = gemm(c, c->h, T, &L->wk, c->k, false)) ||
            (rc = gemm(c, c->h, T, &L->wv, c->v, false)))
            return rc;
        if (c->fuse) {
            qa.q_in = c->q;
            qa.k_in = c->k;
            qa.v_in = c->v;
            qa.ld_q = nq;
            qa.ld_kv = nk;
            if ((rc = LAUNCH(c, krn_qkv_rope_kv(c->ctx, &qa))) != 0)
                return rc;
        } else {
            if (L->bq != NULL) {
                krn_bias_add_args_t b1 = {.x = c->q, .b = L->bq, .n_rows = T, .width = nq};
                krn_bias_add_args_t b2 = {.x = c->k, .b = L->bk, .n_rows = T, .width = nk};
                krn_bias_add_args_t b3 = {.x = c->v, .b = L->bv, .n_rows = T, .width = nk};
                if ((rc = LAUNCH(c, krn_bias_add(c->ctx, &b1))) ||
                    (rc = LAUNCH(c, krn_bias_add(c->ctx, &b2))) ||
                    (rc = LAUNCH(c, krn_bias_add(c->ctx, &b3))))
                    return rc;
            }
            if (L->q_norm != NULL) {
                krn_rmsnorm_args_t n1 = {.x = c->q,
                                         .w = L->q_norm,
                                         .y = c->q,
                                         .n_rows = T * (int32_t)hp->n_head,
                                         .width = hd,
                                         .eps = hp->rms_eps};
                krn_rmsnorm_args_t n2 = {.x = c->k,
                                         .w = L->k_norm,
                                         .y = c->k,
                                         .n_rows = T * (int32_t)hp->n_head_kv,
                                         .width = hd,
                                         .eps = hp->rms_eps};
                if ((rc = LAUNCH(c, krn_qk_norm(c->ctx, &n1))) ||
                    (rc = LAUNCH(c, krn_qk_norm(c->ctx, &n2))))
                    return rc;
            }
            krn_rope_args_t r1 = {.x = c->q,
                                  .pos = dv->pos,
                                  .inv_freq = c->inv_freq,
                                  .n_rows = T,
                                  .n_heads = (int32_t)hp->n_head,
                                  .head_dim = hd,
                                  .rope_dim = (int32_t)hp->rope_dim,
                                  .style = qa.style,
                                  .post_scale = qa.q_scale};
            krn_rope_args_t r2 = r1;
            r2.x = c->k;
            r2.n_heads = (int32_t)hp->n_head_kv;
            r2.post_scale = 1.0f;
            krn_kv_write_args_t kw = {.kv = c->kv,
                                      .layer = l,
                                      .k = c->k,
                                      .v = c->v,
                                      .row_seq = dv->row_seq,
                                      .row_pos = dv->pos,
                                      .block_tables = dv->tables,
                                      .n_rows = T,
                                      .max_blocks = sh->max_blocks};
            if ((rc = LAUNCH(c, krn_rope(c->ctx, &r1))) ||
                (rc = LAUNCH(c, krn_rope(c->ctx, &r2))) ||
                (rc = LAUNCH(c, krn_kv_write(c->ctx, &kw))))
                return rc;
        }
    }
    if (sh->dec_rows > 0) {
        /* The leading decode rows on the split-KV kernel (krn_decode_step_plan). */
        krn_decode_args_t da = {.kv = c->kv,
                                .layer = l,
                                .n_head = (int32_t)hp->n_head,
                                .q = c->q,
                                .out = c->att,
                                .row_seq = dv->row_seq,
                                .row_pos = dv->pos,
                                .block_tables = dv->tables,
                                .max_blocks = sh->max_blocks,
                                .n_rows = sh->dec_rows,
                                .split_tokens = sh->dec_split,
                                .max_splits = sh->dec_splits,
                                .part_o = c->d_dec_part_o,
                                .part_ml = c->d_dec_part_ml};
        if ((rc = LAUNCH(c, krn_decode_attention(c->ctx, &da))) != 0)
            return rc;
        if (sh->n_tasks == 0) /* a decode step: no other rows */
            return gemm(c, c->att, T, &L->wo, c->x, true);
    }
    krn_attn_args_t at = {.kv = c->kv,
                          .layer = l,
                          .n_head = (int32_t)hp->n_head,
                          .q = c->q,
                          .out = c->att,
                          .row_pos = dv->pos,
                          .block_tables = dv->tables,
                          .max_blocks = sh->max_blocks,
                          .tasks = dv->tasks,
                          .n_tasks = sh->n_tasks,
                          .merges = dv->merges,
                          .n_merges = sh->n_merges,
                          .part_o = c->d_part_o,
                          .part_ml = c->d_part_ml};
    if ((rc = LAUNCH(c, krn_attention(c->ctx, &at))) != 0)
        return rc;
    return gemm(c, c->att, T, &L->wo, c->x, true);
}

/* One layer's feed-forward half: x += (silu(h . Wg^T) * (h . Wu^T)) . Wd^T, h = rmsnorm(x). */
static int layer_ffn(cuda_be_t *c, const cl_t *L, const krn_step_shape_t *sh)
{
    const eng_hparams_t *hp = &c->model->hp;
    int32_t D = (int32_t)hp->n_embd, ff = (int32_t)hp->n_ff, T = sh->n_rows;
    int rc;
    if (c->fuse && L->wgu.d != NULL) {
        /* One GEMM into [T][2 ff] (c->g's allocation), SwiGLU over its halves straight into
         * the down projection's type. */
        krn_rmsnorm_convert_args_t rn = {.x = c->x,
                                         .w = L->ffn_norm,
                                         .y = c->xa,
                                         .n_rows = T,
                                         .n_src = T,
                                         .width = D,
                                         .eps = hp->rms_eps,
                                         .dtype = L->wgu.dt};
        krn_swiglu_convert_args_t sg = {.g = c->g,
                                        .u = c->g + ff,
                                        .ld = 2 * ff,
                                        .y = c->xa,
                                        .n_rows = T,
                                        .width = ff,
                                        .dtype = L->down.dt};
        if ((rc = LAUNCH(c, krn_rmsnorm_convert(c->ctx, &rn))) != 0 ||
            (rc = gemm_raw(c, c->xa, T, &L->wgu, c->g, false)) != 0 ||
            (rc = LAUNCH(c, krn_swiglu_convert(c->ctx, &sg))) != 0)
            return rc;
        return gemm_raw(c, c->xa, T, &L->down, c->x, true);
    }
    krn_rmsnorm_args_t rn = {
        .x = c->x, .w = L->ffn_norm, .y = c->h, .n_rows = T, .width = D, .eps = hp->rms_eps};
    if ((rc = LAUNCH(c, krn_rmsnorm(c->ctx, &rn))) ||
        (rc = gemm(c, c->h, T, &L->gate, c->g, false)) ||
        (rc = gemm(c, c->h, T, &L->up, c->u, false)))
        return rc;
    if (c->fuse) {
        krn_swiglu_convert_args_t sg = {.g = c->g,
                                        .u = c->u,
                                        .ld = ff,
                                        .y = c->xa,
                                        .n_rows = T,
                                        .width = ff,
                                        .dtype = L->down.dt};
        if ((rc = LAUNCH(c, krn_swiglu_convert(c->ctx, &sg))) != 0)
            return rc;
        return gemm_raw(c, c->xa, T, &L->down, c->x, true);
    }
    krn_swiglu_args_t sg = {.g = c->g, .u = c->u, .n = (int64_t)T * ff};
    if ((rc = LAUNCH(c, krn_swiglu(c->ctx, &sg))) != 0)
        return rc;
    return gemm(c, c->g, T, &L->down, c->x, true);
}

/* Everything a step runs on the device after its lists are uploaded: the embedding, the
 * layers, the output head over the logits rows. The head's chunks are copied to `logits` (host)
 * as they come when logits is not NULL, sampled when sh->sample is set, or left in c->logits for
 * the caller (a captured step, whose n_logits fits one chunk). */
static int step_enqueue(cuda_be_t *c, const krn_step_shape_t *sh, float *logits)
{
    const eng_hparams_t *hp = &c->model->hp;
    int32_t D = (int32_t)hp->n_embd, V = (int32_t)hp->n_vocab, T = sh->n_rows;
    int32_t n_logits = sh->n_logits;
    int rc;
    if (c->tok_embd.qtype != 0) { /* a quantized table: its rows dequantized to F32 */
        krn_dequant_args_t da = {.w = c->tok_embd.d,
                                 .rows = c->dev.tokens,
                                 .y = c->x,
                                 .n_rows = T,
                                 .n_wrows = V,
                                 .n_in = D,
                                 .qtype = (enum krn_qtype)c->tok_embd.qtype,
                                 .dtype = KRN_F32};
        rc = LAUNCH(c, krn_dequant(c->ctx, &da));
    } else {
        krn_embed_args_t ea = {.table = c->tok_embd.d,
                               .ids = c->dev.tokens,
                               .out = c->x,
                               .n_rows = T,
                               .width = D,
                               .n_vocab = V,
                               .table_dtype = c->tok_embd.dt};
        rc = LAUNCH(c, krn_embed(c->ctx, &ea));
    }
    if (rc != 0)
        return rc;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const cl_t *L = &c->layers[l];
        if ((rc = layer_attention(c, L, (int32_t)l, sh)) != 0 || (rc = layer_ffn(c, L, sh)) != 0)
            return rc;
    }
    if (n_logits == 0)
        return 0;
    /* The logits rows, normalized, in the output GEMM's type in c->xa: gathered by the fused
     * kernel, or copied row by row into c->q, normalized into c->h, converted per chunk. */
    size_t esz = krn_dtype_size(c->output.dt);
    if (c->fuse) {
        krn_rmsnorm_convert_args_t rn = {.x = c->x,
                                         .rows = c->dev.logit_rows,
                                         .w = c->out_norm,
                                         .y = c->xa,
                                         .n_rows = n_logits,
                                         .n_src = T,
                                         .width = D,
                                         .eps = hp->rms_eps,
                                         .dtype = c->output.dt};
        if ((rc = LAUNCH(c, krn_rmsnorm_convert(c->ctx, &rn))) != 0)
            return rc;
    } else {
        for (int32_t i = 0; i < n_logits; i++)
            if ((rc = LAUNCH(c, krn_copy_d2d(c->ctx, c->q + (size_t)i * D,
                                             c->x + (size_t)c->logit_rows[i] * D,
                                             (size_t)D * 4))) != 0)
                return rc;
        krn_rmsnorm_args_t rn = {.x = c->q,
                                 .w = c->out_norm,
                                 .y = c->h,
                                 .n_rows = n_logits,
                                 .width = D,
                                 .eps = hp->rms_eps};
        if ((rc = LAUNCH(c, krn_rmsnorm(c->ctx, &rn))) != 0)
            return rc;
    }
    /* The output head in chunks of logits_rows rows through the [logits_rows][V] buffer: each
     * chunk is copied out (or sampled) before the next GEMM overwrites it, in stream order. */
    for (int32_t r0 = 0; r0 < n_logits; r0 += c->logits_rows) {
        int32_t nr = PC_MIN(c->logits_rows, n_logits - r0);
        if (c->fuse)
            rc = gemm_raw(c, (const uint8_t *)c->xa + (size_t)r0 * D * esz, nr, &c->output,
                          c->logits, false);
        else
            rc = gemm(c, c->h + (size_t)r0 * D, nr, &c->output, c->logits, false);
        if (rc != 0)
            return rc;
        if (sh->sample)
            rc = sample_chunk(c, r0, nr);
        else if (logits != NULL)
            rc = krn_copy_d2h(c->ctx, logits + (size_t)r0 * V, c->logits, (size_t)nr * V * 4);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Uploads the step's lists (host arrays of c) and points c->dev at their device copies: one
 * copy of the pinned staging buffer (packed), or one copy per list. */
static int step_upload(cuda_be_t *c, const krn_step_shape_t *sh, const eng_sample_row_t *srows)
{
    int32_t T = sh->n_rows, nl = sh->n_logits;
    size_t n_tab = (size_t)sh->n_seqs * sh->max_blocks;
    bool sample = srows != NULL;
    int rc;
    if (!c->packed) {
        if ((rc = grow_dev(c, (void **)&c->d_tables, &c->d_tables_cap, n_tab, sizeof(int32_t))) !=
                0 ||
            (rc = grow_dev(c, (void **)&c->d_tasks, &c->d_tasks_cap, (size_t)sh->n_tasks + 1,
                           sizeof(krn_attn_task_t))) != 0 ||
            (rc = grow_dev(c, (void **)&c->d_merges, &c->d_merges_cap, (size_t)sh->n_merges + 1,
                           sizeof(krn_attn_merge_t))) != 0)
            return rc;
        if (sample && ((rc = pc_array_reserve(&c->srows, &c->srows_cap, (size_t)nl)) != 0 ||
                       (rc = grow_dev(c, (void **)&c->d_srows, &c->d_srows_cap, (size_t)nl,
                                      sizeof(krn_sample_row_t))) != 0 ||
                       (rc = sample_prepare(c, srows, nl, c->srows)) != 0))
            return rc;
        c->dev = (step_dev_t){.tokens = c->d_tokens,
                              .pos = c->d_pos,
                              .row_seq = c->d_row_seq,
                              .logit_rows = c->d_logit_rows,
                              .tables = c->d_tables,
                              .tasks = c->d_tasks,
                              .merges = c->d_merges,
                              .srows = c->d_srows};
        const struct {
            void *dst;
            const void *src;
            size_t n;
        } cp[] = {{c->d_tokens, c->tokens, (size_t)T * 4},
                  {c->d_pos, c->pos, (size_t)T * 4},
                  {c->d_row_seq, c->row_seq, (size_t)T * 4},
                  {c->d_logit_rows, c->logit_rows, (size_t)nl * 4},
                  {c->d_tables, c->tables, n_tab * 4},
                  {c->d_tasks, c->tasks, (size_t)sh->n_tasks * sizeof *c->tasks},
                  {c->d_merges, c->merges, (size_t)sh->n_merges * sizeof *c->merges},
                  {c->d_srows, c->srows, sample ? (size_t)nl * sizeof *c->srows : 0}};
        for (size_t i = 0; i < PC_ARRAY_LEN(cp); i++) {
            if (cp[i].n == 0)
                continue;
            if ((rc = krn_copy_h2d(c->ctx, cp[i].dst, cp[i].src, cp[i].n)) != 0)
                return rc;
            stat_add(&g_stats.uploads, 1);
        }
        return 0;
    }
    /* The layout is a function of the shape alone, so a graph captured for a shape reads its
     * lists at the same device addresses on every replay. */
    krn_step_layout_t lay;
    if ((rc = krn_step_layout(sh, &lay)) != 0)
        return rc;
    size_t bytes = lay.bytes;
    if (bytes > c->stage_cap) {
        size_t nc = c->stage_cap ? c->stage_cap : 4096;
        while (nc < bytes)
            nc *= 2;
        krn_host_free(c->ctx, c->stage);
        c->stage = NULL;
        c->stage_cap = 0;
        if ((rc = krn_host_alloc(c->ctx, nc, (void **)&c->stage)) != 0)
            return rc;
        c->stage_cap = nc;
    }
    if ((rc = grow_dev(c, &c->d_stage, &c->d_stage_cap, bytes, 1)) != 0)
        return rc;
    uint8_t *h = c->stage, *d = c->d_stage;
    memcpy(h + lay.tokens, c->tokens, (size_t)T * 4);
    memcpy(h + lay.pos, c->pos, (size_t)T * 4);
    memcpy(h + lay.row_seq, c->row_seq, (size_t)T * 4);
    memcpy(h + lay.logit_rows, c->logit_rows, (size_t)nl * 4);
    memcpy(h + lay.tables, c->tables, n_tab * 4);
    memcpy(h + lay.tasks, c->tasks, (size_t)sh->n_tasks * sizeof(krn_attn_task_t));
    memcpy(h + lay.merges, c->merges, (size_t)sh->n_merges * sizeof(krn_attn_merge_t));
    if (sample && (rc = sample_prepare(c, srows, nl, (krn_sample_row_t *)(h + lay.srows))) != 0)
        return rc;
    c->dev = (step_dev_t){.tokens = (int32_t *)(d + lay.tokens),
                          .pos = (int32_t *)(d + lay.pos),
                          .row_seq = (int32_t *)(d + lay.row_seq),
                          .logit_rows = (int32_t *)(d + lay.logit_rows),
                          .tables = (int32_t *)(d + lay.tables),
                          .tasks = (krn_attn_task_t *)(d + lay.tasks),
                          .merges = (krn_attn_merge_t *)(d + lay.merges),
                          .srows = (krn_sample_row_t *)(d + lay.srows)};
    stat_add(&g_stats.uploads, 1);
    return krn_copy_h2d(c->ctx, c->d_stage, c->stage, bytes);
}

/* Runs the step's device work as a graph: replays the one captured for this row count when the
 * shape matches, else captures it (updating the slot's graph in place when it can) and
 * launches it. Returns 0, 1 when the caller must run the step eagerly (nothing enqueued: the
 * first step of this row count, or a failed capture, after which graphs are off for this
 * backend), or an error. */
static int step_graph(cuda_be_t *c, const krn_step_shape_t *sh)
{
    graph_slot_t *slot = &c->graph_slots[sh->n_rows];
    int rc;
    if (!slot->warm) {
        /* The first step of a row count runs eagerly: every kernel it takes (cuBLAS's for this
         * M included) is loaded outside a capture, where lazy module loading may not work. */
        slot->warm = true;
        return 1;
    }
    if (slot->g == NULL || !krn_step_same_shape(&slot->key, sh)) {
        if ((rc = krn_graph_begin(c->ctx)) != 0)
            goto off;
        if ((rc = step_enqueue(c, sh, NULL)) != 0) {
            krn_graph_abort(c->ctx);
            goto off;
        }
        bool updated;
        if ((rc = krn_graph_end(c->ctx, &slot->g, &slot->n_nodes, &updated)) != 0)
            goto off;
        slot->key = *sh;
        stat_add(&g_stats.graph_captures, 1);
        stat_add(&g_stats.graph_updates, updated);
    } else {
        stat_add(&g_stats.graph_replays, 1);
    }
    c->n_calls = 1; /* the graph launch; what was recorded ran nowhere */
    stat_add(&g_stats.device_ops, (uint64_t)slot->n_nodes);
    return krn_graph_launch(c->ctx, slot->g);
off:
    PC_LOG(PC_LOG_WARN, "cuda",
           "CUDA graph capture failed (%s); decode steps run without graphs from now on",
           pc_strerror(rc));
    stat_add(&g_stats.graph_failures, 1);
    c->graphs = false;
    graphs_reset(c);
    c->n_calls = 0;
    return 1;
}

/* One forward step. The logits rows go to the host (logits), or are sampled on the device
 * under srows with only the tokens coming back (tokens; logits NULL). */
static int cuda_step(cuda_be_t *c, const eng_fwd_seq_t *seqs, uint32_t n_seqs, float *logits,
                     const eng_sample_row_t *srows, int32_t *tokens)
{
    uint64_t t0 = pc_time_mono_ns();
    const eng_hparams_t *hp = &c->model->hp;
    int32_t bt = (int32_t)c->p.block_tokens, hd = (int32_t)hp->head_dim;
    int32_t V = (int32_t)hp->n_vocab;
    c->n_calls = 0;

    /* Rows, positions, tables, the logit rows and the attention plan. */
    krn_step_shape_t sh = {.n_seqs = (int32_t)n_seqs, .max_blocks = 1};
    bool decode = true; /* one token per sequence */
    for (uint32_t s = 0; s < n_seqs; s++) {
        const eng_fwd_seq_t *sq = &seqs[s];
        if (sq->n_tokens == 0 || (uint64_t)sh.n_rows + sq->n_tokens > c->p.max_tokens ||
            (uint64_t)sq->pos0 + sq->n_tokens > (uint64_t)sq->n_blocks * (uint32_t)bt ||
            sq->pos0 + sq->n_tokens > INT32_MAX / 2)
            return PC_ERR_INVAL;
        for (uint32_t i = 0; i < sq->n_blocks; i++)
            if (sq->blocks[i] >= (uint32_t)c->kv.n_blocks)
                return PC_ERR_INVAL;
        sh.n_rows += (int32_t)sq->n_tokens;
        sh.max_blocks = PC_MAX(sh.max_blocks, (int32_t)sq->n_blocks);
        decode = decode && sq->n_tokens == 1;
    }
    int rc;
    for (uint32_t s = 0; s < n_seqs; s++)
        if ((rc = order_blocks(c, seqs[s].blocks, seqs[s].n_blocks)) != 0)
            return rc;
    if ((rc = pc_array_reserve(&c->tables, &c->tables_cap, (size_t)n_seqs * sh.max_blocks)) != 0 ||
        (rc = pc_array_reserve(&c->pseqs, &c->pseqs_cap, n_seqs)) != 0)
        return rc;
    int32_t row = 0;
    for (uint32_t s = 0; s < n_seqs; s++) {
        const eng_fwd_seq_t *sq = &seqs[s];
        for (int32_t i = 0; i < sh.max_blocks; i++)
            c->tables[(size_t)s * sh.max_blocks + i] =
                i < (int32_t)sq->n_blocks ? (int32_t)sq->blocks[i] : -1;
        c->pseqs[s] = (krn_plan_seq_t){
            .row0 = row, .n_tokens = (int32_t)sq->n_tokens, .pos0 = (int32_t)sq->pos0};
        for (uint32_t j = 0; j < sq->n_tokens; j++, row++) {
            if (sq->tokens[j] < 0 || (uint32_t)sq->tokens[j] >= hp->n_vocab)
                return PC_ERR_INVAL;
            c->tokens[row] = sq->tokens[j];
            c->pos[row] = (int32_t)(sq->pos0 + j);
            c->row_seq[row] = (int32_t)s;
            if (sq->logits == ENG_LOGITS_ALL ||
                (sq->logits == ENG_LOGITS_LAST && j + 1 == sq->n_tokens))
                c->logit_rows[sh.n_logits++] = row;
        }
    }
    /* The leading single-token rows (all of a decode step's; the decode rows the worker puts
     * before a mixed step's prefill chunks) take the split-KV decode kernel, whose launch
     * depends only on dec_rows, dec_split and dec_splits (part of the shape); the sequences
     * after them krn_attention's plan, made over them alone (task seq indices shifted back). */
    int32_t n_lead = 0;
    while (n_lead < (int32_t)n_seqs && seqs[n_lead].n_tokens == 1)
        n_lead++;
    krn_step_decode_shape(&sh, c->pos, n_lead, c->dec_kernel, c->n_sm, (int32_t)hp->n_head,
                          (int32_t)hp->n_head_kv, bt, c->dec_slots);
    /* Decode rows 0 .. plan0 - 1 are sequences 0 .. plan0 - 1; the plan takes the rest. */
    int32_t plan0 = sh.dec_rows, plan_n = (int32_t)n_seqs - plan0;
    krn_plan_params_t pp = {.n_head = (int32_t)hp->n_head,
                            .n_head_kv = (int32_t)hp->n_head_kv,
                            .head_dim = hd,
                            .split_kv = (int32_t)c->p.split_kv};
    if (plan_n > 0 && (rc = krn_attn_plan(&pp, c->pseqs + plan0, plan_n, NULL, &sh.n_tasks, NULL,
                                          &sh.n_merges, &sh.n_parts)) != 0)
        return rc;
    if ((rc = pc_array_reserve(&c->tasks, &c->tasks_cap, (size_t)sh.n_tasks + 1)) != 0 ||
        (rc = pc_array_reserve(&c->merges, &c->merges_cap, (size_t)sh.n_merges + 1)) != 0)
        return rc;
    if (plan_n > 0 && (rc = krn_attn_plan(&pp, c->pseqs + plan0, plan_n, c->tasks, &sh.n_tasks,
                                          c->merges, &sh.n_merges, &sh.n_parts)) != 0)
        return rc;
    for (int32_t i = 0; i < sh.n_tasks; i++)
        c->tasks[i].seq += plan0; /* the row of the step's block tables */
    /* Every allocation before the first enqueue: a captured step allocates nothing. */
    if ((rc = grow_dev(c, (void **)&c->d_part_o, &c->part_o_cap, (size_t)sh.n_parts * hd + 1,
                       sizeof(float))) != 0 ||
        (rc = grow_dev(c, (void **)&c->d_part_ml, &c->part_ml_cap, (size_t)sh.n_parts * 2 + 1,
                       sizeof(float))) != 0)
        return rc;
    sh.sample = logits == NULL && sh.n_logits > 0;
    PC_ASSERT(sh.n_logits == 0 || logits != NULL || (srows != NULL && tokens != NULL));
    if ((rc = step_upload(c, &sh, sh.sample ? srows : NULL)) != 0)
        return rc;
    sh.sample_plan = sh.sample ? c->splan : 0; /* sample_prepare's */

    /* Decode steps whose logits fit one chunk run as a graph (krn_step_graphable; the chunk
     * is copied out after it); everything else, and every step once a capture failed, is
     * enqueued call by call. */
    krn_step_graph_params_t gp = {.graphs = c->graphs,
                                  .packed = c->packed,
                                  .decode = decode,
                                  .fused_head = c->fuse,
                                  .logit_rows_identity = true,
                                  .logits_rows = c->logits_rows};
    for (int32_t i = 0; i < sh.n_logits; i++)
        gp.logit_rows_identity = gp.logit_rows_identity && c->logit_rows[i] == i;
    bool graph = krn_step_graphable(&sh, &gp);
    rc = graph ? step_graph(c, &sh) : 1;
    if (rc == 1) {
        graph = false;
        uint64_t calls0 = c->n_calls;
        rc = step_enqueue(c, &sh, logits);
        stat_add(&g_stats.device_ops, c->n_calls - calls0);
    }
    if (rc != 0)
        return rc;
    if (graph && !sh.sample && sh.n_logits > 0 &&
        (rc = krn_copy_d2h(c->ctx, logits, c->logits, (size_t)sh.n_logits * V * 4)) != 0)
        return rc;
    if (sh.sample &&
        (rc = krn_copy_d2h(c->ctx, tokens, c->d_stok, (size_t)sh.n_logits * sizeof(int32_t))) != 0)
        return rc;
    stat_add(&g_stats.steps, 1);
    stat_add(&g_stats.decode_steps, sh.dec_rows > 0);
    stat_add(&g_stats.launches, c->n_calls);
    stat_add(&g_stats.host_ns, pc_time_mono_ns() - t0);
    return krn_ctx_sync(c->ctx);
}

static int cuda_forward(eng_backend_t *be, const eng_model_t *model, eng_kvpool_t *kv,
                        const eng_fwd_seq_t *seqs, uint32_t n_seqs, float *logits)
{
    cuda_be_t *c = be->ctx;
    if (model != c->model || kv != c->pool || n_seqs == 0 ||
        eng_kvpool_block_tokens(kv) != c->p.block_tokens)
        return PC_ERR_INVAL;
    if (c->err != 0)
        return c->err; /* a hook failed: the device pool may not match the host's */
    int rc = cuda_step(c, seqs, n_seqs, logits, NULL, NULL);
    return rc == PC_ERR_UNSUPPORTED ? PC_ERR_INTERNAL : rc;
}

static int cuda_forward_sample(eng_backend_t *be, const eng_model_t *model, eng_kvpool_t *kv,
                               const eng_fwd_seq_t *seqs, uint32_t n_seqs,
                               const eng_sample_row_t *rows, int32_t *tokens)
{
    cuda_be_t *c = be->ctx;
    if (model != c->model || kv != c->pool || n_seqs == 0 || rows == NULL || tokens == NULL ||
        eng_kvpool_block_tokens(kv) != c->p.block_tokens)
        return PC_ERR_INVAL;
    if (c->err != 0)
        return c->err;
    int rc = cuda_step(c, seqs, n_seqs, NULL, rows, tokens);
    return rc == PC_ERR_UNSUPPORTED ? PC_ERR_INTERNAL : rc;
}

/* ---------------------------------------------------------------------------------------------
 * KV tier transfers (G2)
 * ------------------------------------------------------------------------------------------- */

enum { XFER_IDS_CHUNK = 256 }; /* block ids converted per krn_xfer_blocks call */

static int cuda_kv_xfer(cuda_be_t *c, const uint32_t *blocks, uint32_t n, void *host, bool to_host,
                        uint64_t *fence)
{
    *fence = 0;
    for (uint32_t i = 0; i < n; i++)
        if (blocks[i] >= (uint32_t)c->kv.n_blocks)
            return PC_ERR_INVAL;
    if (c->err != 0)
        return c->err;
    int rc;
    if (c->xfer == NULL) {
        uint64_t *bf = pc_calloc((size_t)c->kv.n_blocks, sizeof *bf);
        if (bf == NULL)
            return PC_ERR_NOMEM;
        if ((rc = krn_xfer_init(c->ctx, &c->xfer)) != 0) {
            pc_free(bf);
            return rc;
        }
        c->blk_fence = bf;
    }
    /* A transfer into the device also waits for transfers still reading its blocks (a block
     * saved, then freed and reused for a load): one copy stream runs them in order. */
    size_t bb = krn_kv_block_bytes(&c->kv);
    int32_t ids[XFER_IDS_CHUNK];
    for (uint32_t i0 = 0; i0 < n; i0 += XFER_IDS_CHUNK) {
        uint32_t m = PC_MIN((uint32_t)XFER_IDS_CHUNK, n - i0);
        for (uint32_t i = 0; i < m; i++)
            ids[i] = (int32_t)blocks[i0 + i];
        uint64_t f;
        rc = krn_xfer_blocks(c->xfer, &c->kv, ids, (int32_t)m, (uint8_t *)host + (size_t)i0 * bb,
                             to_host, &f);
        if (rc != 0)
            return rc;
        for (uint32_t i = 0; i < m; i++)
            c->blk_fence[blocks[i0 + i]] = f;
        *fence = f;
    }
    return 0;
}

static int cuda_kv_to_host(eng_backend_t *be, const uint32_t *blocks, uint32_t n, void *host,
                           uint64_t *fence)
{
    return cuda_kv_xfer(be->ctx, blocks, n, host, true, fence);
}

static int cuda_kv_from_host(eng_backend_t *be, const uint32_t *blocks, uint32_t n,
                             const void *host, uint64_t *fence)
{
    return cuda_kv_xfer(be->ctx, blocks, n, (void *)host, false, fence);
}

static int cuda_kv_fence(eng_backend_t *be, uint64_t fence, bool wait)
{
    cuda_be_t *c = be->ctx;
    if (fence == 0)
        return 1;
    if (c->xfer == NULL)
        return PC_ERR_INVAL;
    if (!wait)
        return krn_xfer_query(c->xfer, fence);
    int rc = krn_xfer_wait(c->xfer, fence);
    return rc == 0 ? 1 : rc;
}

static int cuda_host_alloc(eng_backend_t *be, size_t n_bytes, void **out)
{
    cuda_be_t *c = be->ctx;
    return krn_host_alloc(c->ctx, n_bytes, out);
}

static void cuda_host_free(eng_backend_t *be, void *p)
{
    cuda_be_t *c = be->ctx;
    krn_host_free(c->ctx, p);
}

static const eng_backend_i cuda_iface = {
    .name = cuda_name,
    .free = cuda_free,
    .supports = cuda_supports,
    .buf_alloc = cuda_buf_alloc,
    .buf_free = cuda_buf_free,
    .forward = cuda_forward,
    .forward_sample = cuda_forward_sample,
    .synchronize = cuda_synchronize,
    .kv_to_host = cuda_kv_to_host,
    .kv_from_host = cuda_kv_from_host,
    .kv_fence = cuda_kv_fence,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
};

int eng_backend_cuda_init(const eng_model_t *model, eng_kvpool_t *kv, const eng_cuda_params_t *p,
                          eng_backend_t **out, char *err, size_t err_len)
{
    *out = NULL;
    const eng_hparams_t *hp = &model->hp;
    if (p->max_tokens == 0 || p->max_tokens > (1u << 20) || p->block_tokens == 0 ||
        p->block_tokens != eng_kvpool_block_tokens(kv)) {
        snprintf(err, err_len, "cuda backend: invalid parameters");
        return PC_ERR_INVAL;
    }
    if (!cuda_supports(NULL, ENG_BACKEND_OP_KV, (uint32_t)eng_kvpool_dtype(kv))) {
        snprintf(err, err_len, "cuda backend: KV dtype %s is not supported (f16, f32 or q8_0)",
                 eng_kv_dtype_name(eng_kvpool_dtype(kv)));
        return PC_ERR_UNSUPPORTED;
    }
    krn_plan_params_t pp = {.n_head = (int32_t)hp->n_head,
                            .n_head_kv = (int32_t)hp->n_head_kv,
                            .head_dim = (int32_t)hp->head_dim};
    int32_t nt, nm, np;
    krn_plan_seq_t one = {0, 1, 0};
    if (krn_attn_plan(&pp, &one, 1, NULL, &nt, NULL, &nm, &np) != 0) {
        snprintf(err, err_len,
                 "cuda backend: attention shape not supported (%u heads, %u KV heads, head "
                 "dim %u)",
                 hp->n_head, hp->n_head_kv, hp->head_dim);
        return PC_ERR_UNSUPPORTED;
    }
    char why[200];
    int n_dev = krn_device_probe(why, sizeof why);
    if (n_dev == 0) {
        snprintf(err, err_len, "cuda backend: no CUDA device %d: %s", p->device, why);
        return PC_ERR_UNSUPPORTED;
    }
    if (p->device < 0 || p->device >= n_dev) {
        snprintf(err, err_len, "cuda backend: no CUDA device %d (%d found)", p->device, n_dev);
        return PC_ERR_UNSUPPORTED;
    }
    cuda_be_t *c = pc_calloc(1, sizeof *c);
    if (c == NULL)
        return PC_ERR_NOMEM;
    c->base.iface = &cuda_iface;
    c->base.ctx = c;
    c->model = model;
    c->p = *p;
    if (c->p.split_kv == 0)
        c->p.split_kv = CUDA_SPLIT_KV_DEFAULT;
    c->fuse = env_on("KVGW_CUDA_FUSED");
    c->packed = env_on("KVGW_CUDA_PACKED");
    c->graphs = c->packed && env_on("KVGW_CUDA_GRAPHS");
    int rc = PC_ERR_NOMEM;
    c->graph_slots = pc_calloc(KRN_GRAPH_MAX_ROWS + 1, sizeof *c->graph_slots);
    if (c->graph_slots == NULL) {
        snprintf(err, err_len, "cuda backend: out of memory");
        goto fail;
    }
    rc = krn_ctx_init(p->device, &c->ctx);
    if (rc != 0) {
        snprintf(err, err_len, "cuda backend: cannot create a CUDA context on device %d",
                 p->device);
        goto fail;
    }
    rc = upload_model(c);
    if (rc != 0) {
        snprintf(err, err_len, "cuda backend: cannot load the weights to the GPU: %s",
                 pc_strerror(rc));
        goto fail;
    }
    c->kv = (krn_kv_t){.n_blocks = (int32_t)eng_kvpool_n_blocks(kv),
                       .n_layer = (int32_t)hp->n_layer,
                       .n_head_kv = (int32_t)hp->n_head_kv,
                       .head_dim = (int32_t)hp->head_dim,
                       .block_tokens = (int32_t)p->block_tokens,
                       .dtype = eng_kvpool_dtype(kv) == ENG_KV_F16    ? KRN_F16
                                : eng_kvpool_dtype(kv) == ENG_KV_Q8_0 ? KRN_Q8_0
                                                                      : KRN_F32};
    PC_ASSERT(krn_kv_block_bytes(&c->kv) == eng_kvpool_block_bytes(kv));
    size_t block_bytes = krn_kv_block_bytes(&c->kv);
    size_t pool_bytes = block_bytes * (size_t)c->kv.n_blocks;
    size_t T = p->max_tokens, D = hp->n_embd, nq = (size_t)hp->n_head * hp->head_dim;
    size_t nk = (size_t)hp->n_head_kv * hp->head_dim, ff = hp->n_ff;
    /* h is also the fused QKV GEMM's [T][nq + 2 nk] output; g holds [T][2 ff] (the fused
     * gate/up output) and u is its second half when the GEMMs run apart. */
    size_t wide = PC_MAX(D, nq), max_k = PC_MAX(PC_MAX(D, nq), ff);
    size_t h_width = PC_MAX(wide, nq + 2 * nk);
    c->logits_rows = (int32_t)PC_MIN(T, (size_t)KRN_LOGITS_CHUNK_ROWS);
    if ((rc = dalloc(c, T * D * 4, (void **)&c->x)) != 0 ||
        (rc = dalloc(c, T * h_width * 4, (void **)&c->h)) != 0 ||
        (rc = dalloc(c, T * wide * 4, (void **)&c->q)) != 0 ||
        (rc = dalloc(c, T * nk * 4, (void **)&c->k)) != 0 ||
        (rc = dalloc(c, T * nk * 4, (void **)&c->v)) != 0 ||
        (rc = dalloc(c, T * nq * 4, (void **)&c->att)) != 0 ||
        (rc = dalloc(c, T * ff * 2 * 4, (void **)&c->g)) != 0 ||
        (rc = dalloc(c, (size_t)c->logits_rows * hp->n_vocab * 4, (void **)&c->logits)) != 0 ||
        (rc = dalloc(c, T * max_k * 2, &c->xa)) != 0 ||
        (rc = dalloc(c, T * 4, (void **)&c->d_tokens)) != 0 ||
        (rc = dalloc(c, T * 4, (void **)&c->d_pos)) != 0 ||
        (rc = dalloc(c, T * 4, (void **)&c->d_row_seq)) != 0 ||
        (rc = dalloc(c, T * 4, (void **)&c->d_logit_rows)) != 0 ||
        (rc = dalloc(c, 3 * 4, (void **)&c->d_copy)) != 0) {
        snprintf(err, err_len, "cuda backend: cannot allocate the step's scratch: %s",
                 pc_strerror(rc));
        goto fail;
    }
    c->u = c->g + T * ff;
    /* The GEMM path's scratch for quantized matrices (steps of more than KRN_QGEMV_MAX_ROWS
     * rows): the largest such matrix as halves, at most CUDA_QSCRATCH_BYTES, at least a row. */
    if (c->n_quant > 0 && T > KRN_QGEMV_MAX_ROWS) {
        c->qscratch_bytes = PC_MAX(PC_MIN((size_t)c->qscratch_elems * 2, CUDA_QSCRATCH_BYTES),
                                   (size_t)c->qscratch_k * 2);
        if ((rc = dalloc(c, c->qscratch_bytes, &c->qscratch)) != 0) {
            snprintf(err, err_len, "cuda backend: cannot allocate the quantized GEMM scratch: %s",
                     pc_strerror(rc));
            goto fail;
        }
    }
    /* The split-KV decode kernel for decode steps (KVGW_CUDA_DECODE=attn: krn_attention's plan),
     * with its partials for the worst decode step of up to max_tokens rows allocated now. */
    krn_device_info_t di;
    const char *dec_env = getenv("KVGW_CUDA_DECODE");
    c->dec_kernel = krn_decode_use(&c->kv, (int32_t)hp->n_head, dec_env);
    if (c->dec_kernel && (krn_device_info(p->device, &di) != 0 || di.n_sm <= 0)) {
        PC_LOG(PC_LOG_WARN, "cuda", "device %d: SM count unknown; decode steps use krn_attention",
               p->device);
        c->dec_kernel = false;
    }
    if (c->dec_kernel) {
        c->n_sm = di.n_sm;
        c->dec_slots =
            krn_decode_part_slots(c->n_sm, (int32_t)T, (int32_t)hp->n_head, (int32_t)hp->n_head_kv);
        if (c->dec_slots < 0 ||
            (rc = dalloc(c, ((size_t)c->dec_slots * hp->head_dim + 1) * 4,
                         (void **)&c->d_dec_part_o)) != 0 ||
            (rc = dalloc(c, ((size_t)c->dec_slots * 2 + 1) * 4, (void **)&c->d_dec_part_ml)) != 0) {
            rc = c->dec_slots < 0 ? PC_ERR_INVAL : rc;
            snprintf(err, err_len, "cuda backend: cannot allocate the decode partials: %s",
                     pc_strerror(rc));
            goto fail;
        }
    }
    /* The multi-pass sampler's scratch for the most rows one krn_sample call takes, now: a
     * captured step must not allocate. */
    if ((rc = krn_sample_reserve(c->ctx, CUDA_SAMPLE_CHUNK)) != 0) {
        snprintf(err, err_len, "cuda backend: cannot allocate the sampler's scratch: %s",
                 pc_strerror(rc));
        goto fail;
    }
    /* The pool, last, where it fits: what is free now, less what steps grow later (the
     * sampler's scratch; attention partials for max_tokens decode rows of 16 splits each,
     * 8K positions at the default split: longer contexts take from the headroom) and a
     * headroom. */
    size_t free_b, total_b;
    if ((rc = krn_mem_info(c->ctx, &free_b, &total_b)) != 0) {
        snprintf(err, err_len, "cuda backend: cudaMemGetInfo failed");
        goto fail;
    }
    krn_mem_plan_params_t mp = krn_mem_plan_params_default();
    mp.free_bytes = free_b;
    mp.total_bytes = total_b;
    mp.other_bytes = (size_t)CUDA_SAMPLE_CHUNK * hp->n_vocab * 8 +
                     T * hp->n_head * ((size_t)hp->head_dim + 2) * 4 * 16;
    mp.block_bytes = block_bytes;
    mp.want_blocks = c->kv.n_blocks;
    krn_mem_plan_t plan;
    rc = krn_mem_plan(&mp, &plan);
    if (rc != 0) {
        snprintf(err, err_len,
                 "cuda backend: a KV pool of %d blocks (%zu MiB) does not fit on device %d: "
                 "%zu MiB free after weights and scratch, %zu MiB kept for steps and %zu MiB "
                 "headroom; at most %lld blocks (%lld tokens) fit",
                 c->kv.n_blocks, pool_bytes >> 20, p->device, free_b >> 20, mp.other_bytes >> 20,
                 plan.headroom_bytes >> 20, (long long)plan.max_blocks,
                 (long long)plan.max_blocks * (long long)p->block_tokens);
        rc = PC_ERR_NOMEM;
        goto fail;
    }
    if ((rc = dalloc(c, pool_bytes, &c->kv.base)) != 0) {
        snprintf(err, err_len, "cuda backend: cannot allocate %zu MiB of KV: %s", pool_bytes >> 20,
                 pc_strerror(rc));
        goto fail;
    }
    PC_LOG(
        PC_LOG_INFO, "cuda",
        "device %d: %d F16 and %d BF16 weight matrices (%d kept quantized: %zu MiB, GEMM "
        "scratch %zu MiB); KV pool %d blocks (%zu MiB) of %zu MiB free, headroom %zu MiB, "
        "room for %lld blocks; step: %s kernels, %s upload, graphs %s, decode attention %s",
        p->device, c->n_f16, c->n_bf16, c->n_quant, c->quant_bytes >> 20, c->qscratch_bytes >> 20,
        c->kv.n_blocks, pool_bytes >> 20, free_b >> 20, plan.headroom_bytes >> 20,
        (long long)plan.max_blocks, c->fuse ? "fused" : "unfused (KVGW_CUDA_FUSED=0)",
        c->packed ? "packed" : "per-list (KVGW_CUDA_PACKED=0)", c->graphs ? "on" : "off",
        c->dec_kernel                                     ? "split-KV kernel"
        : dec_env != NULL && strcmp(dec_env, "attn") == 0 ? "krn_attention (KVGW_CUDA_DECODE=attn)"
                                                          : "krn_attention (shape)");
    /* Unwritten slots are NaN in tests (kv_poison), zeros otherwise. */
    if ((rc = krn_memset(c->ctx, c->kv.base, p->kv_poison ? 0xff : 0, pool_bytes)) != 0 ||
        (rc = krn_ctx_sync(c->ctx)) != 0) {
        snprintf(err, err_len, "cuda backend: cannot clear the device KV pool");
        goto fail;
    }
    c->tokens = pc_malloc(T * sizeof *c->tokens);
    c->pos = pc_malloc(T * sizeof *c->pos);
    c->row_seq = pc_malloc(T * sizeof *c->row_seq);
    c->logit_rows = pc_malloc(T * sizeof *c->logit_rows);
    if (!c->tokens || !c->pos || !c->row_seq || !c->logit_rows) {
        rc = PC_ERR_NOMEM;
        goto fail;
    }
    c->pool = kv;
    eng_kvpool_hooks_t hooks = {.on_alloc = hook_alloc,
                                .on_copy = hook_copy,
                                .read_block = hook_read_block,
                                .write_block = hook_write_block,
                                .ud = c};
    eng_kvpool_set_hooks(kv, &hooks);
    *out = &c->base;
    return 0;

fail:
    cuda_free(&c->base);
    return rc == PC_ERR_INTERNAL ? PC_ERR_UNSUPPORTED : rc;
}
