/*
 * backend_cuda.c — the CUDA backend: the forward step of backend_cpu.c on the GPU, through the
 * kernels of kernels/ (plain C ABI) and cuBLAS (see backend.h, kernels/kernels.h).
 *
 * One step, for T batch rows, on the context's stream (one stream and one cuBLAS handle per
 * backend object):
 *
 *   x = embed(tokens)                                        krn_embed
 *   per layer:  h = rmsnorm(x) * attn_norm                   krn_rmsnorm
 *               q, k, v = h.Wq^T, h.Wk^T, h.Wv^T (+ biases)  krn_convert + krn_gemm, krn_bias_add
 *               q/k head norms (qwen3); rope; q *= 1/sqrt(d) krn_qk_norm, krn_rope
 *               k, v -> KV blocks; att = paged attention     krn_kv_write, krn_attention
 *               x += att.Wo^T                                krn_gemm (beta = 1)
 *               h = rmsnorm(x) * ffn_norm; x += (silu(h.Wg^T) * h.Wu^T).Wd^T
 *   logits = (rmsnorm(x) * output_norm).Wout^T for the rows asked for, copied to the host
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
 * KV: a device pool mirrors the engine's host pool block for block (same ids, same layout); the
 * engine keeps doing the accounting on the host pool, and its hooks forward copy-on-write copies
 * and poisoning here. The host pool's memory is not used by this backend: the engine creates it
 * without storage (kvpool.h no_storage), so no host copy of the KV budget exists.
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
#include <string.h>

#include "backend.h"
#include "kernels.h"
#include "kvpool.h"
#include "model.h"
#include "pc_alloc.h"
#include "pc_assert.h"
#include "pc_err.h"
#include "pc_log.h"
#include "sampling.h"

#define CUDA_SPLIT_KV_DEFAULT 512
/* Rows sampled per krn_sample launch: its scratch is [rows][n_vocab] doubles, so the chunk
 * bounds that memory (64 x 152k vocab = 78 MB) whatever the batch. It is the logits chunk:
 * each chunk of logits rows is sampled by one launch. */
#define CUDA_SAMPLE_CHUNK KRN_LOGITS_CHUNK_ROWS

typedef struct cw {
    void *d; /* [n_out][n_in] of dt */
    enum krn_dtype dt;
    int32_t n_in, n_out;
} cw_t;

typedef struct cl {
    float *attn_norm, *ffn_norm, *bq, *bk, *bv, *q_norm, *k_norm;
    cw_t wq, wk, wv, wo, gate, up, down;
} cl_t;

typedef struct cuda_be {
    eng_backend_t base;
    const eng_model_t *model;
    eng_kvpool_t *pool;
    eng_cuda_params_t p;
    krn_ctx_t *ctx;
    int err;           /* a hook's failure, reported by the next step */
    int n_f16, n_bf16; /* matrices uploaded as each GEMM type (krn_gemm_dtype) */
    void **allocs;     /* every device allocation made at init */
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
    int32_t *d_tokens, *d_pos, *d_row_seq, *d_copy;
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
    /* Device sampling (forward_sample), grown on first use. */
    krn_sample_row_t *srows, *d_srows; /* [rows] */
    size_t srows_cap, d_srows_cap;
    int32_t *d_stok; /* [rows] */
    size_t d_stok_cap;
    double *d_swork; /* [CUDA_SAMPLE_CHUNK][n_vocab] */
    size_t d_swork_cap;
} cuda_be_t;

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
        krn_ctx_sync(c->ctx);
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
    pc_free(c);
}

static bool cuda_supports(const eng_backend_t *be, enum eng_backend_op op, uint32_t type)
{
    switch (op) {
    case ENG_BACKEND_OP_FORWARD:
    case ENG_BACKEND_OP_MATMUL:
        return type == ENG_GGML_TYPE_F32 || type == ENG_GGML_TYPE_F16;
    case ENG_BACKEND_OP_KV:
        return type == ENG_KV_F16 || type == ENG_KV_F32;
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

static void hook_alloc(void *ud, uint32_t block)
{
    cuda_be_t *c = ud;
    if (!c->p.kv_poison)
        return;
    size_t bb = krn_kv_block_bytes(&c->kv);
    if (krn_memset(c->ctx, (uint8_t *)c->kv.base + (size_t)block * bb, 0xff, bb) != 0)
        c->err = PC_ERR_INTERNAL;
}

static void hook_copy(void *ud, uint32_t dst, uint32_t src, uint32_t n_tokens)
{
    cuda_be_t *c = ud;
    int32_t h[3] = {(int32_t)src, (int32_t)dst, (int32_t)n_tokens};
    krn_block_copy_args_t a = {
        .kv = c->kv, .src = c->d_copy, .dst = c->d_copy + 1, .n_tokens = c->d_copy + 2, .n = 1};
    /* The host array lives on this stack frame: wait for the copy before returning. */
    if (krn_copy_h2d(c->ctx, c->d_copy, h, sizeof h) != 0 || krn_block_copy(c->ctx, &a) != 0 ||
        krn_ctx_sync(c->ctx) != 0)
        c->err = PC_ERR_INTERNAL;
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

/* max |w| over a weight matrix and max_j ||W_j||_2 over its rows (F16 or F32 storage). */
static void weight_stats(const eng_weight_t *w, float *amax, double *row_norm_max)
{
    float am = 0;
    double rn = 0;
    if (w->type != ENG_GGML_TYPE_F16 && w->type != ENG_GGML_TYPE_F32) {
        *amax = INFINITY; /* not read: upload_weight_as refuses the type */
        *row_norm_max = INFINITY;
        return;
    }
    for (uint32_t j = 0; j < w->n_out; j++) {
        double ss = 0;
        for (uint32_t i = 0; i < w->n_in; i++) {
            size_t k = (size_t)j * w->n_in + i;
            float v = w->type == ENG_GGML_TYPE_F16 ? krn_f16_to_f32(((const uint16_t *)w->data)[k])
                                                   : ((const float *)w->data)[k];
            float a = fabsf(v);
            am = a > am || isnan(a) ? a : am;
            ss += (double)v * v;
        }
        rn = sqrt(ss) > rn || isnan(ss) ? sqrt(ss) : rn;
    }
    *amax = am;
    *row_norm_max = rn;
}

/* max |v| over n floats (0 for NULL: a missing bias adds nothing). */
static float vec_amax(const float *v, size_t n)
{
    float am = 0;
    for (size_t i = 0; v != NULL && i < n; i++)
        am = fabsf(v[i]) > am || isnan(v[i]) ? fabsf(v[i]) : am;
    return am;
}

/* Uploads a weight matrix as `dt` (F16 or BF16), converting from its host type. */
static int upload_weight_as(cuda_be_t *c, const eng_weight_t *w, enum krn_dtype dt, cw_t *out)
{
    size_t n = (size_t)w->n_out * w->n_in;
    out->n_in = (int32_t)w->n_in;
    out->n_out = (int32_t)w->n_out;
    out->dt = dt;
    if (w->type != ENG_GGML_TYPE_F16 && w->type != ENG_GGML_TYPE_F32)
        return PC_ERR_UNSUPPORTED;
    int rc = dalloc(c, n * 2, &out->d);
    if (rc != 0)
        return rc;
    if (w->type == ENG_GGML_TYPE_F16 && dt == KRN_F16) {
        rc = krn_copy_h2d(c->ctx, out->d, w->data, n * 2);
        return rc == 0 ? krn_ctx_sync(c->ctx) : rc;
    }
    uint16_t *tmp = pc_malloc(n * 2);
    if (tmp == NULL)
        return PC_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        float f = w->type == ENG_GGML_TYPE_F16 ? krn_f16_to_f32(((const uint16_t *)w->data)[i])
                                               : ((const float *)w->data)[i];
        tmp[i] = dt == KRN_F16 ? krn_f32_to_f16(f) : krn_f32_to_bf16(f);
    }
    rc = krn_copy_h2d(c->ctx, out->d, tmp, n * 2);
    if (rc == 0)
        rc = krn_ctx_sync(c->ctx); /* tmp is freed below */
    pc_free(tmp);
    return rc;
}

/* The GEMM input type of a matrix whose activations are bounded by act_bound (krn_gemm_dtype:
 * BF16 for BF16 files, F16 only where the activations provably fit), then the upload. */
static int upload_weight(cuda_be_t *c, const eng_weight_t *w, double act_bound, cw_t *out)
{
    float amax;
    double rn;
    weight_stats(w, &amax, &rn);
    krn_gemm_dtype_params_t dp = {.file_dtype = w->file_type == ENG_GGML_TYPE_BF16  ? KRN_BF16
                                                : w->file_type == ENG_GGML_TYPE_F16 ? KRN_F16
                                                                                    : KRN_F32,
                                  .weight_amax = amax,
                                  .act_bound = act_bound,
                                  .act_amax_measured = -1.0}; /* no calibration pass yet */
    enum krn_dtype dt = krn_gemm_dtype(&dp);
    c->n_bf16 += dt == KRN_BF16;
    c->n_f16 += dt == KRN_F16;
    return upload_weight_as(c, w, dt, out);
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
        weight_stats(&L->wv, &wam, &wv_rn);
        weight_stats(&L->w_gate, &wam, &wg_rn);
        weight_stats(&L->w_up, &wam, &wu_rn);
        double b_attn = krn_act_bound_normed(D, an), b_ffn = krn_act_bound_normed(D, fn);
        double b_o = krn_act_bound_proj(D, an, wv_rn, vec_amax(L->bv, nk));
        double b_down = krn_act_bound_swiglu(krn_act_bound_proj(D, fn, wg_rn, 0),
                                             krn_act_bound_proj(D, fn, wu_rn, 0));
        if ((rc = upload_weight(c, &L->wq, b_attn, &d->wq)) != 0 ||
            (rc = upload_weight(c, &L->wk, b_attn, &d->wk)) != 0 ||
            (rc = upload_weight(c, &L->wv, b_attn, &d->wv)) != 0 ||
            (rc = upload_weight(c, &L->wo, b_o, &d->wo)) != 0 ||
            (rc = upload_weight(c, &L->w_gate, b_ffn, &d->gate)) != 0 ||
            (rc = upload_weight(c, &L->w_up, b_ffn, &d->up)) != 0 ||
            (rc = upload_weight(c, &L->w_down, b_down, &d->down)) != 0)
            return rc;
    }
    return krn_ctx_sync(c->ctx);
}

/* ---------------------------------------------------------------------------------------------
 * The step
 * ------------------------------------------------------------------------------------------- */

/* y[M][n_out] (+)= x[M][n_in] . W^T: x converted to W's type, then cuBLAS. */
static int gemm(cuda_be_t *c, const float *x, int32_t M, const cw_t *w, float *y, bool acc)
{
    krn_convert_args_t cv = {.x = x, .y = c->xa, .n = (int64_t)M * w->n_in, .dtype = w->dt};
    int rc = krn_convert(c->ctx, &cv);
    if (rc != 0)
        return rc;
    krn_gemm_args_t g = {.x = c->xa,
                         .w = w->d,
                         .y = y,
                         .M = M,
                         .N = w->n_out,
                         .K = w->n_in,
                         .dtype = w->dt,
                         .accumulate = acc};
    return krn_gemm(c->ctx, &g);
}

/* Grows a host array to n elements. */
static int grow_host(void **p, size_t *cap, size_t n, size_t elem)
{
    if (n <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < n)
        nc *= 2;
    void *np = pc_reallocarray(*p, nc, elem);
    if (np == NULL)
        return PC_ERR_NOMEM;
    *p = np;
    *cap = nc;
    return 0;
}

/* Grows a device array to n elements (contents are not kept). */
static int grow_dev(cuda_be_t *c, void **p, size_t *cap, size_t n, size_t elem)
{
    if (n <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < n)
        nc *= 2;
    krn_dev_free(c->ctx, *p);
    *p = NULL;
    *cap = 0;
    int rc = krn_dev_alloc(c->ctx, nc * elem, p);
    if (rc != 0)
        return rc;
    *cap = nc;
    return 0;
}

/* Stages the sampling rules of the step's n logits rows on the device (rows[n] host) and
 * grows the sampler's output and scratch; sample_chunk then samples each chunk of logits. */
static int sample_prepare(cuda_be_t *c, const eng_sample_row_t *rows, int32_t n)
{
    int32_t V = (int32_t)c->model->hp.n_vocab;
    int32_t chunk = n < CUDA_SAMPLE_CHUNK ? n : CUDA_SAMPLE_CHUNK;
    int rc;
    if ((rc = grow_host((void **)&c->srows, &c->srows_cap, (size_t)n, sizeof *c->srows)) != 0 ||
        (rc = grow_dev(c, (void **)&c->d_srows, &c->d_srows_cap, (size_t)n,
                       sizeof(krn_sample_row_t))) != 0 ||
        (rc = grow_dev(c, (void **)&c->d_stok, &c->d_stok_cap, (size_t)n, sizeof(int32_t))) != 0 ||
        (rc = grow_dev(c, (void **)&c->d_swork, &c->d_swork_cap, (size_t)chunk * V,
                       sizeof(double))) != 0)
        return rc;
    for (int32_t i = 0; i < n; i++)
        c->srows[i] = (krn_sample_row_t){
            .temperature = rows[i].temperature,
            .top_k = rows[i].top_k > INT32_MAX ? INT32_MAX : (int32_t)rows[i].top_k,
            .top_p = rows[i].top_p,
            .min_p = rows[i].min_p,
            .u = rows[i].u};
    return krn_copy_h2d(c->ctx, c->d_srows, c->srows, (size_t)n * sizeof *c->srows);
}

/* Samples logits rows r0 .. r0 + n - 1 of the step, which c->logits holds from its row 0
 * (n <= CUDA_SAMPLE_CHUNK: the scratch's rows; launches on one stream run in order, so the
 * next chunk reuses it). */
static int sample_chunk(cuda_be_t *c, int32_t r0, int32_t n)
{
    krn_sample_args_t sa = {.logits = c->logits,
                            .row = c->d_srows + r0,
                            .token = c->d_stok + r0,
                            .work = c->d_swork,
                            .n_rows = n,
                            .n_vocab = (int32_t)c->model->hp.n_vocab};
    return krn_sample(c->ctx, &sa);
}

/* One forward step. The logits rows go to the host (logits), or are sampled on the device
 * under srows with only the tokens coming back (tokens; logits NULL). */
static int cuda_step(cuda_be_t *c, const eng_fwd_seq_t *seqs, uint32_t n_seqs, float *logits,
                     const eng_sample_row_t *srows, int32_t *tokens)
{
    const eng_model_t *model = c->model;
    const eng_hparams_t *hp = &model->hp;
    int32_t bt = (int32_t)c->p.block_tokens, D = (int32_t)hp->n_embd, hd = (int32_t)hp->head_dim;
    int32_t nq = (int32_t)(hp->n_head * hp->head_dim), nk = (int32_t)(hp->n_head_kv * hp->head_dim);
    int32_t ff = (int32_t)hp->n_ff, V = (int32_t)hp->n_vocab;

    /* Rows, positions, tables, the logit rows and the attention plan. */
    int32_t T = 0, n_logits = 0, max_blocks = 1;
    for (uint32_t s = 0; s < n_seqs; s++) {
        const eng_fwd_seq_t *sq = &seqs[s];
        if (sq->n_tokens == 0 || (uint64_t)T + sq->n_tokens > c->p.max_tokens ||
            (uint64_t)sq->pos0 + sq->n_tokens > (uint64_t)sq->n_blocks * (uint32_t)bt ||
            sq->pos0 + sq->n_tokens > INT32_MAX / 2)
            return PC_ERR_INVAL;
        for (uint32_t i = 0; i < sq->n_blocks; i++)
            if (sq->blocks[i] >= (uint32_t)c->kv.n_blocks)
                return PC_ERR_INVAL;
        T += (int32_t)sq->n_tokens;
        max_blocks = PC_MAX(max_blocks, (int32_t)sq->n_blocks);
    }
    int rc;
    if ((rc = grow_host((void **)&c->tables, &c->tables_cap, (size_t)n_seqs * max_blocks,
                        sizeof *c->tables)) != 0 ||
        (rc = grow_host((void **)&c->pseqs, &c->pseqs_cap, n_seqs, sizeof *c->pseqs)) != 0)
        return rc;
    int32_t row = 0;
    for (uint32_t s = 0; s < n_seqs; s++) {
        const eng_fwd_seq_t *sq = &seqs[s];
        for (int32_t i = 0; i < max_blocks; i++)
            c->tables[(size_t)s * max_blocks + i] =
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
                c->logit_rows[n_logits++] = row;
        }
    }
    krn_plan_params_t pp = {.n_head = (int32_t)hp->n_head,
                            .n_head_kv = (int32_t)hp->n_head_kv,
                            .head_dim = hd,
                            .split_kv = (int32_t)c->p.split_kv};
    int32_t n_tasks, n_merges, n_parts;
    if ((rc = krn_attn_plan(&pp, c->pseqs, (int32_t)n_seqs, NULL, &n_tasks, NULL, &n_merges,
                            &n_parts)) != 0)
        return rc;
    if ((rc = grow_host((void **)&c->tasks, &c->tasks_cap, (size_t)n_tasks + 1,
                        sizeof *c->tasks)) != 0 ||
        (rc = grow_host((void **)&c->merges, &c->merges_cap, (size_t)n_merges + 1,
                        sizeof *c->merges)) != 0)
        return rc;
    if ((rc = krn_attn_plan(&pp, c->pseqs, (int32_t)n_seqs, c->tasks, &n_tasks, c->merges,
                            &n_merges, &n_parts)) != 0)
        return rc;
    if ((rc = grow_dev(c, (void **)&c->d_tables, &c->d_tables_cap, (size_t)n_seqs * max_blocks,
                       sizeof(int32_t))) != 0 ||
        (rc = grow_dev(c, (void **)&c->d_tasks, &c->d_tasks_cap, (size_t)n_tasks + 1,
                       sizeof(krn_attn_task_t))) != 0 ||
        (rc = grow_dev(c, (void **)&c->d_merges, &c->d_merges_cap, (size_t)n_merges + 1,
                       sizeof(krn_attn_merge_t))) != 0 ||
        (rc = grow_dev(c, (void **)&c->d_part_o, &c->part_o_cap, (size_t)n_parts * hd + 1,
                       sizeof(float))) != 0 ||
        (rc = grow_dev(c, (void **)&c->d_part_ml, &c->part_ml_cap, (size_t)n_parts * 2 + 1,
                       sizeof(float))) != 0)
        return rc;
    if ((rc = krn_copy_h2d(c->ctx, c->d_tokens, c->tokens, (size_t)T * 4)) != 0 ||
        (rc = krn_copy_h2d(c->ctx, c->d_pos, c->pos, (size_t)T * 4)) != 0 ||
        (rc = krn_copy_h2d(c->ctx, c->d_row_seq, c->row_seq, (size_t)T * 4)) != 0 ||
        (rc = krn_copy_h2d(c->ctx, c->d_tables, c->tables, (size_t)n_seqs * max_blocks * 4)) != 0 ||
        (rc = krn_copy_h2d(c->ctx, c->d_tasks, c->tasks, (size_t)n_tasks * sizeof *c->tasks)) !=
            0 ||
        (rc = krn_copy_h2d(c->ctx, c->d_merges, c->merges, (size_t)n_merges * sizeof *c->merges)) !=
            0)
        return rc;

    krn_embed_args_t ea = {.table = c->tok_embd.d,
                           .ids = c->d_tokens,
                           .out = c->x,
                           .n_rows = T,
                           .width = D,
                           .n_vocab = V,
                           .table_dtype = c->tok_embd.dt};
    if ((rc = krn_embed(c->ctx, &ea)) != 0)
        return rc;
    krn_kv_t kv = c->kv;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const cl_t *L = &c->layers[l];
        krn_rmsnorm_args_t rn = {
            .x = c->x, .w = L->attn_norm, .y = c->h, .n_rows = T, .width = D, .eps = hp->rms_eps};
        if ((rc = krn_rmsnorm(c->ctx, &rn)) != 0 || (rc = gemm(c, c->h, T, &L->wq, c->q, false)) ||
            (rc = gemm(c, c->h, T, &L->wk, c->k, false)) ||
            (rc = gemm(c, c->h, T, &L->wv, c->v, false)))
            return rc;
        if (L->bq != NULL) {
            krn_bias_add_args_t b1 = {.x = c->q, .b = L->bq, .n_rows = T, .width = nq};
            krn_bias_add_args_t b2 = {.x = c->k, .b = L->bk, .n_rows = T, .width = nk};
            krn_bias_add_args_t b3 = {.x = c->v, .b = L->bv, .n_rows = T, .width = nk};
            if ((rc = krn_bias_add(c->ctx, &b1)) || (rc = krn_bias_add(c->ctx, &b2)) ||
                (rc = krn_bias_add(c->ctx, &b3)))
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
            if ((rc = krn_qk_norm(c->ctx, &n1)) || (rc = krn_qk_norm(c->ctx, &n2)))
                return rc;
        }
        krn_rope_args_t r1 = {.x = c->q,
                              .pos = c->d_pos,
                              .inv_freq = c->inv_freq,
                              .n_rows = T,
                              .n_heads = (int32_t)hp->n_head,
                              .head_dim = hd,
                              .rope_dim = (int32_t)hp->rope_dim,
                              .style =
                                  hp->rope_style == ENG_ROPE_NEOX ? KRN_ROPE_NEOX : KRN_ROPE_NORM,
                              .post_scale = 1.0f / sqrtf((float)hd)};
        krn_rope_args_t r2 = r1;
        r2.x = c->k;
        r2.n_heads = (int32_t)hp->n_head_kv;
        r2.post_scale = 1.0f;
        krn_kv_write_args_t kw = {.kv = kv,
                                  .layer = (int32_t)l,
                                  .k = c->k,
                                  .v = c->v,
                                  .row_seq = c->d_row_seq,
                                  .row_pos = c->d_pos,
                                  .block_tables = c->d_tables,
                                  .n_rows = T,
                                  .max_blocks = max_blocks};
        krn_attn_args_t at = {.kv = kv,
                              .layer = (int32_t)l,
                              .n_head = (int32_t)hp->n_head,
                              .q = c->q,
                              .out = c->att,
                              .row_pos = c->d_pos,
                              .block_tables = c->d_tables,
                              .max_blocks = max_blocks,
                              .tasks = c->d_tasks,
                              .n_tasks = n_tasks,
                              .merges = c->d_merges,
                              .n_merges = n_merges,
                              .part_o = c->d_part_o,
                              .part_ml = c->d_part_ml};
        if ((rc = krn_rope(c->ctx, &r1)) || (rc = krn_rope(c->ctx, &r2)) ||
            (rc = krn_kv_write(c->ctx, &kw)) || (rc = krn_attention(c->ctx, &at)) ||
            (rc = gemm(c, c->att, T, &L->wo, c->x, true)))
            return rc;
        rn.w = L->ffn_norm;
        krn_swiglu_args_t sg = {.g = c->g, .u = c->u, .n = (int64_t)T * ff};
        if ((rc = krn_rmsnorm(c->ctx, &rn)) || (rc = gemm(c, c->h, T, &L->gate, c->g, false)) ||
            (rc = gemm(c, c->h, T, &L->up, c->u, false)) || (rc = krn_swiglu(c->ctx, &sg)) ||
            (rc = gemm(c, c->g, T, &L->down, c->x, true)))
            return rc;
    }
    if (n_logits > 0) {
        PC_ASSERT(logits != NULL || (srows != NULL && tokens != NULL));
        for (int32_t i = 0; i < n_logits; i++)
            if ((rc = krn_copy_d2d(c->ctx, c->q + (size_t)i * D,
                                   c->x + (size_t)c->logit_rows[i] * D, (size_t)D * 4)) != 0)
                return rc;
        krn_rmsnorm_args_t rn = {.x = c->q,
                                 .w = c->out_norm,
                                 .y = c->h,
                                 .n_rows = n_logits,
                                 .width = D,
                                 .eps = hp->rms_eps};
        if ((rc = krn_rmsnorm(c->ctx, &rn)) != 0)
            return rc;
        if (logits == NULL && (rc = sample_prepare(c, srows, n_logits)) != 0)
            return rc;
        /* The output head in chunks of logits_rows rows through the [logits_rows][V] buffer:
         * each chunk is copied out (or sampled) before the next GEMM overwrites it, in stream
         * order. */
        for (int32_t r0 = 0; r0 < n_logits; r0 += c->logits_rows) {
            int32_t nr = PC_MIN(c->logits_rows, n_logits - r0);
            if ((rc = gemm(c, c->h + (size_t)r0 * D, nr, &c->output, c->logits, false)) != 0)
                return rc;
            if (logits != NULL)
                rc = krn_copy_d2h(c->ctx, logits + (size_t)r0 * V, c->logits, (size_t)nr * V * 4);
            else
                rc = sample_chunk(c, r0, nr);
            if (rc != 0)
                return rc;
        }
        if (logits == NULL &&
            (rc = krn_copy_d2h(c->ctx, tokens, c->d_stok, (size_t)n_logits * sizeof(int32_t))) != 0)
            return rc;
    }
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

static const eng_backend_i cuda_iface = {
    .name = cuda_name,
    .free = cuda_free,
    .supports = cuda_supports,
    .buf_alloc = cuda_buf_alloc,
    .buf_free = cuda_buf_free,
    .forward = cuda_forward,
    .forward_sample = cuda_forward_sample,
    .synchronize = cuda_synchronize,
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
    int rc = krn_ctx_init(p->device, &c->ctx);
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
                       .dtype = eng_kvpool_dtype(kv) == ENG_KV_F16 ? KRN_F16 : KRN_F32};
    PC_ASSERT(krn_kv_block_bytes(&c->kv) == eng_kvpool_block_bytes(kv));
    size_t block_bytes = krn_kv_block_bytes(&c->kv);
    size_t pool_bytes = block_bytes * (size_t)c->kv.n_blocks;
    size_t T = p->max_tokens, D = hp->n_embd, nq = (size_t)hp->n_head * hp->head_dim;
    size_t nk = (size_t)hp->n_head_kv * hp->head_dim, ff = hp->n_ff;
    size_t wide = PC_MAX(D, nq), max_k = PC_MAX(PC_MAX(D, nq), ff);
    c->logits_rows = (int32_t)PC_MIN(T, (size_t)KRN_LOGITS_CHUNK_ROWS);
    if ((rc = dalloc(c, T * D * 4, (void **)&c->x)) != 0 ||
        (rc = dalloc(c, T * wide * 4, (void **)&c->h)) != 0 ||
        (rc = dalloc(c, T * wide * 4, (void **)&c->q)) != 0 ||
        (rc = dalloc(c, T * nk * 4, (void **)&c->k)) != 0 ||
        (rc = dalloc(c, T * nk * 4, (void **)&c->v)) != 0 ||
        (rc = dalloc(c, T * nq * 4, (void **)&c->att)) != 0 ||
        (rc = dalloc(c, T * ff * 4, (void **)&c->g)) != 0 ||
        (rc = dalloc(c, T * ff * 4, (void **)&c->u)) != 0 ||
        (rc = dalloc(c, (size_t)c->logits_rows * hp->n_vocab * 4, (void **)&c->logits)) != 0 ||
        (rc = dalloc(c, T * max_k * 2, &c->xa)) != 0 ||
        (rc = dalloc(c, T * 4, (void **)&c->d_tokens)) != 0 ||
        (rc = dalloc(c, T * 4, (void **)&c->d_pos)) != 0 ||
        (rc = dalloc(c, T * 4, (void **)&c->d_row_seq)) != 0 ||
        (rc = dalloc(c, 3 * 4, (void **)&c->d_copy)) != 0) {
        snprintf(err, err_len, "cuda backend: cannot allocate the step's scratch: %s",
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
    PC_LOG(PC_LOG_INFO, "cuda",
           "device %d: %d F16 and %d BF16 weight matrices; KV pool %d blocks (%zu MiB) of %zu "
           "MiB free, headroom %zu MiB, room for %lld blocks",
           p->device, c->n_f16, c->n_bf16, c->kv.n_blocks, pool_bytes >> 20, free_b >> 20,
           plan.headroom_bytes >> 20, (long long)plan.max_blocks);
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
    eng_kvpool_hooks_t hooks = {.on_alloc = hook_alloc, .on_copy = hook_copy, .ud = c};
    eng_kvpool_set_hooks(kv, &hooks);
    *out = &c->base;
    return 0;

fail:
    cuda_free(&c->base);
    return rc == PC_ERR_INTERNAL ? PC_ERR_UNSUPPORTED : rc;
}
