/*
 * backend_cpu.c — the CPU backend: a Llama-family decoder's forward step over a batch of
 * sequences on the paged KV cache (see backend.h).
 *
 * One step, for T batch rows (the new tokens of every sequence, in batch order):
 *
 *   x = embed(tokens)                                     [T][n_embd]
 *   per layer:  h = rmsnorm(x) * attn_norm
 *               q, k, v = h.Wq^T (+bq), h.Wk^T (+bk), h.Wv^T (+bv)
 *               q, k = rmsnorm per head (qwen3); rope(q, k) at each row's position
 *               k, v -> the sequence's KV blocks; att = attention(q, KV[0 .. pos])
 *               x += att.Wo^T
 *               h = rmsnorm(x) * ffn_norm;  x += (silu(h.Wg^T) * h.Wu^T).Wd^T
 *   logits = (rmsnorm(x) * output_norm).Wout^T, only for the rows asked for
 *
 * GEMMs run on the pool through eng__matmul; the element-wise stages run on the pool over row
 * ranges. Every kernel runs on the ISA path chosen at init (eng_cpu_params_t.isa, cpu.h): the
 * element-wise ones use the AVX2 kernels on both SIMD paths (they are a few percent of a step),
 * but SwiGLU, which is llama.cpp's own per ISA. RoPE's angles, RMSNorm's sum and SwiGLU's e^x
 * follow llama.cpp's CPU backend operation for operation: its products quantize x to 8 bits, where
 * a last-bit difference before the rounding can move a quant by one step. All scratch is
 * allocated at init for max_tokens rows, so a step allocates nothing.
 */
#include "backend.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "cpu_kernels.h"
#include "cpu_simd.h"
#include "kvpool.h"
#include "model.h"
#include "pc_alloc.h"
#include "pc_assert.h"
#include "pc_err.h"
#include "pc_pages.h"
#include "pc_vec.h"

/* OpenBLAS's own setter (not in every cblas.h). */
void openblas_set_num_threads(int num_threads);

/* The matrices of a layer the BF16 GEMM can take, in the order of cpu_be_t.panels. */
#define ENG_CPU_LAYER_MATS 7
static void layer_mats(const eng_layer_t *L, const eng_weight_t *out[ENG_CPU_LAYER_MATS])
{
    const eng_weight_t *ws[ENG_CPU_LAYER_MATS] = {&L->wq,     &L->wk,   &L->wv,    &L->wo,
                                                  &L->w_gate, &L->w_up, &L->w_down};
    memcpy(out, ws, sizeof ws);
}

typedef struct cpu_be {
    eng_backend_t base;
    const eng_model_t *model;
    eng_cpu_params_t p;
    eng_pool_t *pool;
    eng_cpu_isa_t isa;          /* the kernels' path: resolved, one this CPU runs */
    uint32_t max_rows_per_task; /* query tokens per attention task */
    /* Scratch, [max_tokens] rows each. */
    float *x, *h, *q, *k, *v, *att, *g, *u;
    float *rope_cos, *rope_sin; /* [max_tokens][rope_dim / 2] */
    uint32_t *pos;              /* [max_tokens] */
    uint32_t *row_seq;          /* [max_tokens] */
    float **wtmp;               /* [n_threads] -> ENG_CPU_WTILE * max K */
    void *xbuf; /* eng__matmul's x converted (BF16 or quantized rows) for max_tokens x max K */
    /* The BF16 GEMM's weight layout, prepared at init (the model stays as the file has it):
     * each layer matrix's BF16 panels (cpu_kernels.h), [n_layer][ENG_CPU_LAYER_MATS] in
     * layer_mats() order, NULL where not packed; the panels live on panel_mem. */
    const uint16_t **panels;
    pc_pages_t panel_mem;
    bool has_bf16;          /* the BF16 GEMM runs: a matrix has panels */
    float **attn_scratch;   /* [n_threads] */
    eng_attn_task_t *tasks; /* attention tasks, grown on demand */
    size_t tasks_cap;
    const uint32_t **blocks; /* [n_seqs] */
    size_t blocks_cap;
    uint32_t *logit_rows; /* [max_tokens] */
} cpu_be_t;

static const char *cpu_name(const eng_backend_t *be)
{
    return "cpu";
}

static void cpu_free(eng_backend_t *be)
{
    cpu_be_t *c = be->ctx;
    if (c == NULL)
        return;
    eng__pool_free(c->pool);
    float **bufs[] = {&c->x,   &c->h, &c->q, &c->k,        &c->v,
                      &c->att, &c->g, &c->u, &c->rope_cos, &c->rope_sin};
    for (size_t i = 0; i < PC_ARRAY_LEN(bufs); i++)
        pc_free(*bufs[i]);
    for (uint32_t t = 0; t < c->p.n_threads; t++) {
        if (c->wtmp != NULL)
            pc_free(c->wtmp[t]);
        if (c->attn_scratch != NULL)
            pc_free(c->attn_scratch[t]);
    }
    pc_free(c->wtmp);
    pc_free(c->xbuf);
    pc_free((void *)c->panels);
    pc_pages_release(&c->panel_mem);
    pc_free(c->attn_scratch);
    pc_free(c->pos);
    pc_free(c->row_seq);
    pc_free(c->tasks);
    pc_free((void *)c->blocks);
    pc_free(c->logit_rows);
    pc_free(c);
}

static bool cpu_supports(const eng_backend_t *be, enum eng_backend_op op, uint32_t type)
{
    switch (op) {
    case ENG_BACKEND_OP_FORWARD:
    case ENG_BACKEND_OP_MATMUL:
        return eng_quant_type_computed(type);
    case ENG_BACKEND_OP_KV:
        return type == ENG_KV_F16 || type == ENG_KV_F32 || type == ENG_KV_Q8_0;
    }
    return false;
}

static int cpu_buf_alloc(eng_backend_t *be, size_t n_bytes, void **out)
{
    *out = pc_malloc(n_bytes ? n_bytes : 1);
    return *out != NULL ? 0 : PC_ERR_NOMEM;
}

static void cpu_buf_free(eng_backend_t *be, void *buf)
{
    pc_free(buf);
}

/* ---------------------------------------------------------------------------------------------
 * Element-wise stages, parallel over row ranges.
 * ------------------------------------------------------------------------------------------- */

typedef struct rows_ctx {
    cpu_be_t *c;
    uint32_t n_rows;
    uint32_t rows_per_task;
    uint32_t layer;
    const float *src;
    float *dst;
    const float *weight;
    const eng_fwd_seq_t *seqs;
    const eng_kvpool_t *kv;
} rows_ctx_t;

typedef void (*rows_fn)(const rows_ctx_t *r, uint32_t i0, uint32_t i1);

static void rows_task(void *ctx, uint32_t task, uint32_t thread);

typedef struct rows_run {
    rows_ctx_t r;
    rows_fn fn;
} rows_run_t;

static void rows_task(void *ctx, uint32_t task, uint32_t thread)
{
    rows_run_t *run = ctx;
    uint32_t i0 = task * run->r.rows_per_task;
    uint32_t i1 = PC_MIN(run->r.n_rows, i0 + run->r.rows_per_task);
    if (i0 < i1)
        run->fn(&run->r, i0, i1);
}

static void run_rows(cpu_be_t *c, rows_fn fn, rows_ctx_t *r, uint32_t n_rows)
{
    rows_run_t run = {.r = *r, .fn = fn};
    run.r.c = c;
    run.r.n_rows = n_rows;
    uint32_t nt = eng__pool_n_threads(c->pool);
    uint32_t n_tasks = n_rows < 4 ? 1 : PC_MIN(n_rows, nt * 4);
    run.r.rows_per_task = (n_rows + n_tasks - 1) / n_tasks;
    eng__pool_run(c->pool, rows_task, &run, n_tasks);
}

static void rmsnorm_row(eng_cpu_isa_t isa, const float *x, const float *w, float *y, uint32_t n,
                        float eps)
{
#if defined(__x86_64__) || defined(__i386__)
    if (isa != ENG_CPU_ISA_PORTABLE) {
        eng__avx2_rmsnorm(x, w, y, n, eps);
        return;
    }
#endif
    eng__port_rmsnorm(x, w, y, n, eps);
}

/* dst = rmsnorm(src) * weight over n_embd-wide rows. */
static void stage_rmsnorm(const rows_ctx_t *r, uint32_t i0, uint32_t i1)
{
    const eng_hparams_t *hp = &r->c->model->hp;
    for (uint32_t i = i0; i < i1; i++)
        rmsnorm_row(r->c->isa, r->src + (size_t)i * hp->n_embd, r->weight,
                    r->dst + (size_t)i * hp->n_embd, hp->n_embd, hp->rms_eps);
}

static void rope_head(eng_cpu_isa_t isa, float *x, const float *cs, const float *sn,
                      uint32_t rope_dim, bool neox)
{
#if defined(__x86_64__) || defined(__i386__)
    if (isa != ENG_CPU_ISA_PORTABLE) {
        eng__avx2_rope(x, cs, sn, rope_dim, neox);
        return;
    }
#endif
    eng__port_rope(x, cs, sn, rope_dim, neox);
}

/* Biases, per-head q/k norms, RoPE, the 1/sqrt(head_dim) scale of q, and the store of k and v
 * into the KV blocks, for rows [i0, i1). */
static void stage_qkv(const rows_ctx_t *r, uint32_t i0, uint32_t i1)
{
    cpu_be_t *c = r->c;
    const eng_hparams_t *hp = &c->model->hp;
    const eng_layer_t *L = &c->model->layers[r->layer];
    uint32_t hd = hp->head_dim, nq = hp->n_head * hd, nk = hp->n_head_kv * hd;
    uint32_t half = hp->rope_dim / 2, bt = eng_kvpool_block_tokens(r->kv);
    bool neox = hp->rope_style == ENG_ROPE_NEOX;
    enum eng_kv_dtype kvt = eng_kvpool_dtype(r->kv);
    size_t rb = eng_kvpool_row_bytes(r->kv);
    float scale = 1.0f / sqrtf((float)hd);
    for (uint32_t i = i0; i < i1; i++) {
        float *q = c->q + (size_t)i * nq, *k = c->k + (size_t)i * nk, *v = c->v + (size_t)i * nk;
        if (L->bq != NULL) {
            for (uint32_t j = 0; j < nq; j++)
                q[j] += L->bq[j];
            for (uint32_t j = 0; j < nk; j++) {
                k[j] += L->bk[j];
                v[j] += L->bv[j];
            }
        }
        const float *cs = c->rope_cos + (size_t)i * half, *sn = c->rope_sin + (size_t)i * half;
        for (uint32_t h = 0; h < hp->n_head; h++) {
            float *qh = q + (size_t)h * hd;
            if (L->q_norm != NULL)
                rmsnorm_row(c->isa, qh, L->q_norm, qh, hd, hp->rms_eps);
            rope_head(c->isa, qh, cs, sn, hp->rope_dim, neox);
            for (uint32_t d = 0; d < hd; d++)
                qh[d] *= scale;
        }
        const eng_fwd_seq_t *s = &r->seqs[c->row_seq[i]];
        uint32_t pos = c->pos[i];
        uint32_t block = s->blocks[pos / bt], slot = pos % bt;
        for (uint32_t h = 0; h < hp->n_head_kv; h++) {
            float *kh = k + (size_t)h * hd, *vh = v + (size_t)h * hd;
            if (L->k_norm != NULL)
                rmsnorm_row(c->isa, kh, L->k_norm, kh, hd, hp->rms_eps);
            rope_head(c->isa, kh, cs, sn, hp->rope_dim, neox);
            void *dst = eng_kvpool_kv(r->kv, block, r->layer, h);
            if (kvt == ENG_KV_Q8_0) {
                /* Quantized in the same pass, per position: the bytes depend only on this row. */
                uint8_t *kd = dst;
                eng__q8_0_quantize_isa(kh, hd, kd + (size_t)slot * rb, c->isa);
                eng__q8_0_quantize_isa(vh, hd, kd + (size_t)(bt + slot) * rb, c->isa);
            } else if (kvt == ENG_KV_F16) {
                /* K is stored transposed ([hd][bt]): converted in pieces, then scattered. */
                uint16_t *kd = dst, kh16[64];
                for (uint32_t d0 = 0; d0 < hd; d0 += 64) {
                    uint32_t dn = PC_MIN(64, hd - d0);
                    eng__f32_to_f16_row_isa(kh + d0, kh16, dn, c->isa);
                    for (uint32_t d = 0; d < dn; d++)
                        kd[(size_t)(d0 + d) * bt + slot] = kh16[d];
                }
                eng__f32_to_f16_row_isa(vh, kd + (size_t)hd * bt + (size_t)slot * hd, hd, c->isa);
            } else {
                float *kd = dst;
                for (uint32_t d = 0; d < hd; d++)
                    kd[(size_t)d * bt + slot] = kh[d];
                memcpy(kd + (size_t)hd * bt + (size_t)slot * hd, vh, hd * sizeof(float));
            }
        }
    }
}

/* g = silu(g) * u over n_ff-wide rows. */
static void stage_swiglu(const rows_ctx_t *r, uint32_t i0, uint32_t i1)
{
    cpu_be_t *c = r->c;
    size_t ff = c->model->hp.n_ff, j0 = (size_t)i0 * ff, n = (size_t)(i1 - i0) * ff;
#if defined(__x86_64__) || defined(__i386__)
    if (c->isa == ENG_CPU_ISA_AVX512) {
        eng__avx512_swiglu(c->g + j0, c->u + j0, n);
        return;
    }
    if (c->isa == ENG_CPU_ISA_AVX2) {
        eng__avx2_swiglu(c->g + j0, c->u + j0, n);
        return;
    }
#endif
    eng__port_swiglu(c->g + j0, c->u + j0, n);
}

typedef struct attn_run {
    cpu_be_t *c;
    eng_attn_args_t args;
} attn_run_t;

static void attn_task(void *ctx, uint32_t task, uint32_t thread)
{
    attn_run_t *run = ctx;
    eng__attention(&run->args, &run->c->tasks[task], run->c->attn_scratch[thread]);
}

/* ---------------------------------------------------------------------------------------------
 * The step
 * ------------------------------------------------------------------------------------------- */

static int cpu_forward(eng_backend_t *be, const eng_model_t *model, eng_kvpool_t *kv,
                       const eng_fwd_seq_t *seqs, uint32_t n_seqs, float *logits)
{
    cpu_be_t *c = be->ctx;
    const eng_hparams_t *hp = &model->hp;
    uint32_t bt = eng_kvpool_block_tokens(kv);
    if (model != c->model || n_seqs == 0 || bt != c->p.block_tokens)
        return PC_ERR_INVAL;
    uint32_t D = hp->n_embd, hd = hp->head_dim;

    /* Rows, positions, the attention tasks and the logit rows. */
    uint32_t T = 0, n_tasks = 0, n_logits = 0;
    for (uint32_t s = 0; s < n_seqs; s++) {
        const eng_fwd_seq_t *sq = &seqs[s];
        if (sq->n_tokens == 0 || T + sq->n_tokens > c->p.max_tokens ||
            (uint64_t)sq->pos0 + sq->n_tokens > (uint64_t)sq->n_blocks * bt)
            return PC_ERR_INVAL;
        T += sq->n_tokens;
        n_tasks +=
            hp->n_head_kv * ((sq->n_tokens + c->max_rows_per_task - 1) / c->max_rows_per_task);
    }
    /* The arrays grow the way pc_vec does (common/pc_vec.h). */
    if (pc_array_reserve(&c->tasks, &c->tasks_cap, n_tasks) != 0 ||
        pc_array_reserve(&c->blocks, &c->blocks_cap, n_seqs) != 0)
        return PC_ERR_NOMEM;
    uint32_t row = 0, ti = 0;
    for (uint32_t s = 0; s < n_seqs; s++) {
        const eng_fwd_seq_t *sq = &seqs[s];
        c->blocks[s] = sq->blocks;
        for (uint32_t j = 0; j < sq->n_tokens; j++) {
            if (sq->tokens[j] < 0 || (uint32_t)sq->tokens[j] >= hp->n_vocab)
                return PC_ERR_INVAL;
            c->pos[row + j] = sq->pos0 + j;
            c->row_seq[row + j] = s;
            if (sq->logits == ENG_LOGITS_ALL ||
                (sq->logits == ENG_LOGITS_LAST && j + 1 == sq->n_tokens))
                c->logit_rows[n_logits++] = row + j;
        }
        /* Tasks take the latest rows first: they have the most blocks to read. */
        for (uint32_t h = 0; h < hp->n_head_kv; h++)
            for (uint32_t t0 = 0; t0 < sq->n_tokens; t0 += c->max_rows_per_task)
                c->tasks[ti++] =
                    (eng_attn_task_t){.seq = s,
                                      .kv_head = h,
                                      .t0 = row + t0,
                                      .t1 = row + PC_MIN(sq->n_tokens, t0 + c->max_rows_per_task)};
        row += sq->n_tokens;
    }
    PC_ASSERT(ti == n_tasks);
    /* Longest tasks first (the ones ending at the highest positions), for load balance. */
    for (uint32_t i = 0; i < n_tasks / 2; i++) {
        eng_attn_task_t t = c->tasks[i];
        c->tasks[i] = c->tasks[n_tasks - 1 - i];
        c->tasks[n_tasks - 1 - i] = t;
    }

    /* RoPE's angles in F32 as llama.cpp computes them (model.h): against angles in double (a few
     * 1e-6 relative apart, ~1e-3 rad at position 1000), the max top-10 log-prob difference to
     * llama.cpp on the demo Q4_K_M went from 0.140 to 0.096. */
    uint32_t half = hp->rope_dim / 2;
    const float *ff = model->rope_freq_factors;
    for (uint32_t i = 0; i < T; i++) {
        float theta = (float)c->pos[i];
        for (uint32_t f = 0; f < half; f++) {
            float a = ff != NULL ? theta / ff[f] : theta;
            c->rope_cos[(size_t)i * half + f] = cosf(a);
            c->rope_sin[(size_t)i * half + f] = sinf(a);
            theta *= model->rope_theta_scale;
        }
    }
    row = 0;
    for (uint32_t s = 0; s < n_seqs; s++)
        for (uint32_t j = 0; j < seqs[s].n_tokens; j++, row++)
            eng_weight_row_f32(&model->tok_embd, (uint32_t)seqs[s].tokens[j],
                               c->x + (size_t)row * D);

    float *const *tmp = c->wtmp;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const eng_layer_t *L = &model->layers[l];
        rows_ctx_t r = {
            .src = c->x, .dst = c->h, .weight = L->attn_norm, .layer = l, .seqs = seqs, .kv = kv};
        run_rows(c, stage_rmsnorm, &r, T);
        const eng_weight_t *wqkv[] = {&L->wq, &L->wk, &L->wv};
        float *const yqkv[] = {c->q, c->k, c->v};
        const uint16_t *const *pl = c->panels != NULL ? c->panels + (size_t)l * ENG_CPU_LAYER_MATS
                                                      : NULL; /* wq wk wv wo w_gate w_up w_down */
        eng__matmul_n(c->pool, c->h, T, wqkv, pl, yqkv, 3, false, tmp, c->xbuf, c->isa);
        run_rows(c, stage_qkv, &r, T);
        attn_run_t ar = {.c = c,
                         .args = {.q = c->q,
                                  .out = c->att,
                                  .pos = c->pos,
                                  .blocks = c->blocks,
                                  .kvpool = kv,
                                  .layer = l,
                                  .n_head = hp->n_head,
                                  .n_head_kv = hp->n_head_kv,
                                  .head_dim = hd,
                                  .block_tokens = bt,
                                  .kv_f16 = eng_kvpool_dtype(kv) == ENG_KV_F16,
                                  .kv_q8_0 = eng_kvpool_dtype(kv) == ENG_KV_Q8_0,
                                  .simd = true,
                                  .isa = c->isa}};
        eng__pool_run(c->pool, attn_task, &ar, n_tasks);
        eng__matmul(c->pool, c->att, T, &L->wo, pl ? pl[3] : NULL, c->x, true, tmp, c->xbuf,
                    c->isa);
        r.weight = L->ffn_norm;
        run_rows(c, stage_rmsnorm, &r, T);
        const eng_weight_t *wgu[] = {&L->w_gate, &L->w_up};
        float *const ygu[] = {c->g, c->u};
        eng__matmul_n(c->pool, c->h, T, wgu, pl ? pl + 4 : NULL, ygu, 2, false, tmp, c->xbuf,
                      c->isa);
        run_rows(c, stage_swiglu, &r, T);
        eng__matmul(c->pool, c->g, T, &L->w_down, pl ? pl[6] : NULL, c->x, true, tmp, c->xbuf,
                    c->isa);
    }

    if (n_logits > 0) {
        PC_ASSERT(logits != NULL);
        for (uint32_t i = 0; i < n_logits; i++) /* gather: rows only move down (i <= row) */
            memmove(c->q + (size_t)i * D, c->x + (size_t)c->logit_rows[i] * D, D * sizeof(float));
        rows_ctx_t r = {.src = c->q, .dst = c->h, .weight = model->out_norm};
        run_rows(c, stage_rmsnorm, &r, n_logits);
        eng__matmul(c->pool, c->h, n_logits, &model->output, NULL, logits, false, tmp, c->xbuf,
                    c->isa);
    }
    return 0;
}

static const eng_backend_i cpu_iface = {
    .name = cpu_name,
    .free = cpu_free,
    .supports = cpu_supports,
    .buf_alloc = cpu_buf_alloc,
    .buf_free = cpu_buf_free,
    .forward = cpu_forward,
    .synchronize = NULL,
};

/* Packs the layer matrices as BF16 panels (the output head runs on few rows and keeps the
 * F32 path), on huge pages where the kernel has them: prefill streams them like the weights. */
static int pack_panels(cpu_be_t *c, bool skip_f32)
{
    const eng_model_t *m = c->model;
    c->panels = pc_calloc((size_t)m->hp.n_layer * ENG_CPU_LAYER_MATS, sizeof *c->panels);
    if (c->panels == NULL)
        return PC_ERR_NOMEM;
    pc_pages_init(&c->panel_mem, pc_pages_huge_available());
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        const eng_weight_t *ws[ENG_CPU_LAYER_MATS];
        layer_mats(&m->layers[l], ws);
        for (size_t i = 0; i < ENG_CPU_LAYER_MATS; i++) {
            if (skip_f32 && ws[i]->file_type == ENG_GGML_TYPE_F32)
                continue;
            /* Q4_0, Q5_0, Q5_1 and the K-quants keep their blocks and their integer products
             * on x quantized as llama.cpp quantizes it (cpu_kernels.h), in prefill too. */
            if (eng__gemv_int8(ws[i]->type))
                continue;
            size_t n = eng__bf16_packed_elems(ws[i]->n_in, ws[i]->n_out);
            uint16_t *dst = pc_pages_alloc(&c->panel_mem, n * sizeof *dst);
            if (dst == NULL)
                return PC_ERR_NOMEM;
            eng__bf16_pack(ws[i], dst);
            c->panels[(size_t)l * ENG_CPU_LAYER_MATS + i] = dst;
            c->has_bf16 = true;
        }
    }
    return 0;
}

bool eng_backend_cpu_gemm_bf16(const eng_backend_t *be)
{
    return ((const cpu_be_t *)be->ctx)->has_bf16;
}

int eng_backend_cpu_init(const eng_model_t *model, const eng_cpu_params_t *p, eng_backend_t **out)
{
    *out = NULL;
    const eng_hparams_t *hp = &model->hp;
    if (p->n_threads == 0 || p->n_threads > 256 || p->max_tokens == 0 || p->block_tokens == 0 ||
        hp->n_head / hp->n_head_kv > ENG_ATTN_MAX_ROWS)
        return PC_ERR_INVAL;
    cpu_be_t *c = pc_calloc(1, sizeof *c);
    if (c == NULL)
        return PC_ERR_NOMEM;
    c->base.iface = &cpu_iface;
    c->base.ctx = c;
    c->model = model;
    c->p = *p;
    c->isa = p->no_simd ? ENG_CPU_ISA_PORTABLE : eng__cpu_isa_clamp((eng_cpu_isa_t)p->isa);
    c->max_rows_per_task = PC_MAX(1, ENG_ATTN_MAX_ROWS / (hp->n_head / hp->n_head_kv));
    c->max_rows_per_task = PC_MIN(c->max_rows_per_task, 16);
    /* The backend parallelizes GEMMs itself; OpenBLAS threads would only oversubscribe. */
    openblas_set_num_threads(1);
    int rc = eng__pool_init(p->n_threads, &c->pool);
    if (rc != 0)
        goto fail;
    size_t T = p->max_tokens, D = hp->n_embd, nq = (size_t)hp->n_head * hp->head_dim;
    size_t nk = (size_t)hp->n_head_kv * hp->head_dim, ff = hp->n_ff;
    size_t wide = PC_MAX(D, nq);
    c->x = pc_malloc(T * D * sizeof(float));
    c->h = pc_malloc(T * wide * sizeof(float));
    c->q = pc_malloc(T * wide * sizeof(float));
    c->k = pc_malloc(T * nk * sizeof(float));
    c->v = pc_malloc(T * nk * sizeof(float));
    c->att = pc_malloc(T * nq * sizeof(float));
    c->g = pc_malloc(T * ff * sizeof(float));
    c->u = pc_malloc(T * ff * sizeof(float));
    c->rope_cos = pc_malloc(T * (hp->rope_dim / 2 + 1) * sizeof(float));
    c->rope_sin = pc_malloc(T * (hp->rope_dim / 2 + 1) * sizeof(float));
    c->pos = pc_malloc(T * sizeof *c->pos);
    c->row_seq = pc_malloc(T * sizeof *c->row_seq);
    c->logit_rows = pc_malloc(T * sizeof *c->logit_rows);
    c->wtmp = pc_calloc(p->n_threads, sizeof *c->wtmp);
    c->attn_scratch = pc_calloc(p->n_threads, sizeof *c->attn_scratch);
    if (!c->x || !c->h || !c->q || !c->k || !c->v || !c->att || !c->g || !c->u || !c->rope_cos ||
        !c->rope_sin || !c->pos || !c->row_seq || !c->logit_rows || !c->wtmp || !c->attn_scratch) {
        rc = PC_ERR_NOMEM;
        goto fail;
    }
    size_t max_k = PC_MAX(PC_MAX(D, nq), ff);
    if (p->bf16 && c->isa == ENG_CPU_ISA_AVX512 && eng__cpu_has_bf16() &&
        (rc = pack_panels(c, p->bf16_skip_f32)) != 0)
        goto fail;
    c->xbuf = pc_malloc(eng__matmul_xbuf_bytes((uint32_t)T, (uint32_t)max_k));
    if (c->xbuf == NULL) {
        rc = PC_ERR_NOMEM;
        goto fail;
    }
    size_t attn_floats =
        eng__attention_scratch_floats(hp->head_dim, p->block_tokens, ENG_ATTN_MAX_ROWS);
    for (uint32_t t = 0; t < p->n_threads; t++) {
        c->wtmp[t] = pc_malloc(ENG_CPU_WTILE * max_k * sizeof(float));
        c->attn_scratch[t] = pc_malloc(attn_floats * sizeof(float));
        if (c->wtmp[t] == NULL || c->attn_scratch[t] == NULL) {
            rc = PC_ERR_NOMEM;
            goto fail;
        }
    }
    *out = &c->base;
    return 0;

fail:
    cpu_free(&c->base);
    return rc;
}
