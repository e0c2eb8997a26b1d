/*
 * cpu_kernels.c — half-precision row conversion, matrix products and paged attention for the CPU
 * backend (see cpu.h and cpu_kernels.h).
 *
 * Every kernel has a portable C path (cpu_portable.c), an AVX2 path (cpu_avx2.c) and an AVX-512
 * path (here, in the ENG_X86 section); the SIMD paths are compiled with target attributes (the
 * build does not assume -march) and chosen at run time (eng_cpu_isa, cpu.h). This file holds the
 * dispatch, the OpenBLAS products, the AVX-512 kernels and the attention driver.
 */
#include "cpu_kernels.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "cpu_simd.h"
#include "kvpool.h"
#include "pc_alloc.h"
#include "pc_assert.h"

/* ---------------------------------------------------------------------------------------------
 * Matrix products
 * ------------------------------------------------------------------------------------------- */

/* Below ENG_GEMV_MAX_M rows of x the BF16 GEMM is not used (a batch of decode rows keeps the
 * weights' own precision, and N sequences decoded together match each run alone). Below it F16
 * weights are multiplied directly, GEMV-like: one pass over the weights, each weight row
 * converted once (in registers) and applied to the rows of x in groups; from it on, they are
 * converted to F32 tiles for sgemm, whose cost the rows then amortize. F32 weights take the GEMV
 * for at most GEMV_F32_MAX_M rows on the SIMD paths (decode), else sgemm. */
#define GEMV_F32_MAX_M 4
/* The GEMV's tasks: runs of weight rows of at most about GEMV_TASK_BYTES (at least GEMV_TILE
 * rows), the same number for every thread. Each task is one sequential stream, which the hardware
 * prefetcher takes some kilobytes to follow at full speed; the threads take tasks in turn, so
 * each thread's stream restarts at every task. Measured on the 2-core Zen 5 machine with two
 * threads: the Q4_0 bench model's output head, read with the arithmetic removed, streamed at
 * 0.69-0.74 of a plain read loop's bandwidth in 64-row tasks (36 KiB) and at the loop's own in
 * 256-row ones; one decode token's matrices of the Q4_K_M / Q4_0 files, arithmetic and row
 * prefetch (eng__gemv_prefetch_row) in, at 0.87 / 0.80 in 64 KiB tasks, 0.94 / 0.86 in 128 KiB,
 * 0.96 / 0.89 in 256 KiB, 0.92-0.99 / 0.86-0.93 in 512 KiB to 1 MiB. Tasks stay many on the big
 * matrices (the output head: hundreds), so a thread that the machine's other load delays holds
 * up little. */
#define GEMV_TILE 64
#define GEMV_TASK_BYTES ((size_t)256 << 10)

/* ---------------------------------------------------------------------------------------------
 * BF16 GEMM
 * ------------------------------------------------------------------------------------------- */

static uint32_t bf16_panels(uint32_t n_out)
{
    return ((n_out + 31) / 32) * 2;
}

size_t eng__bf16_packed_elems(uint32_t n_in, uint32_t n_out)
{
    return (size_t)bf16_panels(n_out) * ((n_in + 1) / 2) * 32;
}

void eng__bf16_pack(const eng_weight_t *w, uint16_t *dst)
{
    uint32_t kp = (w->n_in + 1) / 2;
    float *row = pc_xmalloc(((size_t)w->n_in + 1) * sizeof *row); /* load time: dies on OOM */
    memset(dst, 0, eng__bf16_packed_elems(w->n_in, w->n_out) * sizeof *dst);
    for (uint32_t n = 0; n < w->n_out; n++) {
        eng_weight_row_f32(w, n, row);
        row[w->n_in] = 0;
        uint16_t *panel = dst + (size_t)(n / 16) * kp * 32;
        for (uint32_t j = 0; j < kp; j++) {
            panel[(size_t)j * 32 + (n % 16) * 2] = eng_f32_to_bf16(row[2 * j]);
            panel[(size_t)j * 32 + (n % 16) * 2 + 1] = eng_f32_to_bf16(row[2 * j + 1]);
        }
    }
    pc_free(row);
}

typedef struct matmul_ctx {
    const float *x;
    uint32_t M, K, N;
    const eng_weight_t *w;
    const uint16_t *w_bf16; /* w's BF16 panels, when the BF16 path runs */
    float *y;
    bool accumulate;
    float *const *tmp;
    const uint16_t *a_bf16; /* x as BF16 rows, when the BF16 path runs */
    eng_cpu_isa_t isa;      /* resolved: never AUTO, always one the CPU runs */
    bool gemv;              /* the GEMV kernel of isa, not sgemm */
    bool qgemm;             /* an eng__gemv_int8 type from ENG_GEMV_MAX_M rows on (qgemm_run) */
    const void *xq;         /* with gemv or qgemm: x quantized (quantize_x) */
    size_t xq_stride;
    bool gemm;     /* the AVX2 register-tile GEMM, not F32 tiles and sgemm */
    uint32_t tile; /* output columns per task */
} matmul_ctx_t;

/* The GEMV / register-tile GEMM arguments of the whole product (the kernels take the column
 * range apart). */
static eng_gemv_t gemv_args(const matmul_ctx_t *c)
{
    return (eng_gemv_t){.w = c->w->data,
                        .wtype = c->w->type,
                        .x = c->x,
                        .xq = c->xq,
                        .xq_stride = c->xq_stride,
                        .M = c->M,
                        .K = c->K,
                        .y = c->y,
                        .ldy = c->N,
                        .accumulate = c->accumulate};
}

/* The integer dot product of c's path for its weight type. */
static float (*dot_q_of(const matmul_ctx_t *c))(uint32_t, const void *, const void *, uint32_t)
{
    switch (c->isa) {
#if defined(__x86_64__) || defined(__i386__)
    case ENG_CPU_ISA_AVX512:
        return eng__avx512_dot_q;
    case ENG_CPU_ISA_AVX2:
        return eng__avx2_dot_q;
#endif
    default:
        return eng__port_dot_q;
    }
}

/* Rows of x per pass of the quantized prefill GEMM over a tile of weight rows: their quantized
 * rows (about 1.1 K bytes each) stay in L1 while the tile's weight rows pass by. */
#define QGEMM_ROWS 16

/* Prefill on quantized weights where eng__avx512_qgemm does not run (the AVX2 and portable paths,
 * the types it does not take): the decode GEMV's integer dot products (x quantized once, as
 * llama.cpp quantizes it) for every row of x, QGEMM_ROWS rows at a time over the task's weight
 * rows, which stay in L2 while every row group passes over them. */
static void qgemm_run(const matmul_ctx_t *c, uint32_t n0, uint32_t n1)
{
    float (*dot)(uint32_t, const void *, const void *, uint32_t) = dot_q_of(c);
    eng_gemv_t g = gemv_args(c);
    for (uint32_t m0 = 0; m0 < c->M; m0 += QGEMM_ROWS) {
        g.M = PC_MIN(QGEMM_ROWS, c->M - m0);
        g.xq = (const char *)c->xq + (size_t)m0 * c->xq_stride;
        g.y = c->y + (size_t)m0 * c->N;
        eng__gemv_q(&g, n0, n1, dot);
    }
}

static void gemv_run(const matmul_ctx_t *c, uint32_t n0, uint32_t n1)
{
    eng_gemv_t g = gemv_args(c);
    switch (c->isa) {
#if defined(__x86_64__) || defined(__i386__)
    case ENG_CPU_ISA_AVX512:
        eng__avx512_gemv(&g, n0, n1);
        return;
    case ENG_CPU_ISA_AVX2:
        eng__avx2_gemv(&g, n0, n1);
        return;
#endif
    default:
        eng__port_gemv(&g, n0, n1);
        return;
    }
}

/* Rows [n0, n1) of w (F16 or BF16) as F32 rows into dst. */
static void weight_rows_to_f32(const eng_weight_t *w, uint32_t n0, uint32_t n1, float *dst,
                               eng_cpu_isa_t isa)
{
    size_t K = w->n_in, n = (size_t)(n1 - n0) * K;
    const uint16_t *src =
        (const uint16_t *)((const char *)w->data + n0 * eng__gemv_row_bytes(w->type, w->n_in));
    if (w->type == ENG_GGML_TYPE_F16) {
        eng__f16_to_f32_row_isa(src, dst, n, isa);
        return;
    }
    PC_ASSERT(w->type == ENG_GGML_TYPE_BF16);
    eng__port_bf16_to_f32(src, dst, n);
}

static void matmul_task(void *ctx, uint32_t task, uint32_t thread)
{
    const matmul_ctx_t *c = ctx;
    uint32_t n0 = task * c->tile;
    uint32_t n1 = PC_MIN(c->N, n0 + c->tile);
    if (n0 >= n1)
        return;
    float beta = c->accumulate ? 1.0f : 0.0f;
    if (c->qgemm) {
#if defined(__x86_64__) || defined(__i386__)
        eng_gemv_t g = gemv_args(c);
        if (c->isa == ENG_CPU_ISA_AVX512 &&
            eng__avx512_qgemm(&g, n0, n1, c->tmp[thread],
                              (size_t)ENG_CPU_WTILE * c->K * sizeof(float)))
            return;
#endif
        qgemm_run(c, n0, n1);
        return;
    }
#if defined(__x86_64__) || defined(__i386__)
    if (c->a_bf16 != NULL) {
        /* Tiles are whole panel pairs: n0 is a multiple of 32. */
        uint32_t kp = (c->K + 1) / 2;
        for (uint32_t n = n0; n < n1; n += 32) {
            const uint16_t *b0 = c->w_bf16 + (size_t)(n / 16) * kp * 32;
            for (uint32_t m0 = 0; m0 < c->M; m0 += 8)
                eng__avx512_gemm_bf16_block((const uint32_t *)c->a_bf16, c->M, m0, kp, b0,
                                            b0 + (size_t)kp * 32, c->y, c->N, n, PC_MIN(32, n1 - n),
                                            c->accumulate);
        }
        return;
    }
#endif
    if (c->gemv) {
        gemv_run(c, n0, n1);
        return;
    }
#if defined(__x86_64__) || defined(__i386__)
    if (c->gemm) {
        eng_gemv_t g = gemv_args(c);
        eng__avx2_gemm(&g, n0, n1);
        return;
    }
#endif
    if (c->w->type == ENG_GGML_TYPE_F32) {
        const float *wp = (const float *)c->w->data + (size_t)n0 * c->K;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)c->M, (int)(n1 - n0), (int)c->K,
                    1.0f, c->x, (int)c->K, wp, (int)c->K, beta, c->y + n0, (int)c->N);
        return;
    }
    /* F16 on the other paths and BF16 on every path: the tile's rows converted to F32, then the
     * AVX2 GEMM or sgemm over them. */
    float *t = c->tmp[thread];
    weight_rows_to_f32(c->w, n0, n1, t, c->isa);
#if defined(__x86_64__) || defined(__i386__)
    if (c->isa == ENG_CPU_ISA_AVX2) {
        eng_gemv_t g = {.w = t,
                        .wtype = ENG_GGML_TYPE_F32,
                        .x = c->x,
                        .M = c->M,
                        .K = c->K,
                        .y = c->y + n0,
                        .ldy = c->N,
                        .accumulate = c->accumulate};
        eng__avx2_gemm(&g, 0, n1 - n0);
        return;
    }
#endif
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)c->M, (int)(n1 - n0), (int)c->K, 1.0f,
                c->x, (int)c->K, t, (int)c->K, beta, c->y + n0, (int)c->N);
}

/* Sets up c for y = x . w^T: the path, and the output columns per task. */
static void matmul_setup(matmul_ctx_t *c, uint32_t n_threads, const float *x, uint32_t M,
                         const eng_weight_t *w, const uint16_t *w_bf16, float *y, bool accumulate,
                         float *const *tmp, const uint16_t *a_bf16, eng_cpu_isa_t isa)
{
    *c = (matmul_ctx_t){.x = x,
                        .M = M,
                        .K = w->n_in,
                        .N = w->n_out,
                        .w = w,
                        .y = y,
                        .accumulate = accumulate,
                        .tmp = tmp,
                        .isa = isa};
    if (a_bf16 != NULL && w_bf16 != NULL) {
        c->a_bf16 = a_bf16;
        c->w_bf16 = w_bf16;
        c->tile = 128;
    } else if (eng__gemv_int8(w->type) && M >= ENG_GEMV_MAX_M) {
        c->qgemm = true;
        c->tile = 64;
    } else if (w->type == ENG_GGML_TYPE_F32 &&
               (M > GEMV_F32_MAX_M || isa == ENG_CPU_ISA_PORTABLE)) {
        /* One contiguous slice per thread (rounded to 16 columns) keeps sgemm's blocks big;
         * small products run on the caller alone. */
        uint64_t flops = (uint64_t)M * c->N * c->K;
        uint32_t parts = flops < (1u << 18) ? 1 : n_threads;
        c->tile = ((c->N + parts - 1) / parts + 15) & ~15u;
    } else if (M < ENG_GEMV_MAX_M) {
        c->gemv = true;
        /* A whole number of tasks per thread, each at most about GEMV_TASK_BYTES: a matrix of
         * 2.25 tasks' bytes (the bench model's wq) runs as 4 even tasks, not 2 full and a
         * quarter one that a thread does alone while the other waits. */
        size_t bytes = eng__gemv_row_bytes(w->type, w->n_in) * c->N;
        size_t n_tasks = (bytes + GEMV_TASK_BYTES - 1) / GEMV_TASK_BYTES;
        n_tasks = (n_tasks + n_threads - 1) / n_threads * n_threads;
        uint32_t rows = (uint32_t)((c->N + n_tasks - 1) / n_tasks);
        c->tile = PC_MIN(PC_MAX(rows, GEMV_TILE), c->N);
    } else if (isa == ENG_CPU_ISA_AVX2 && w->type == ENG_GGML_TYPE_F16) {
        /* F16 prefill on AVX2: the register-tile GEMM on the weights as stored. Measured against
         * F16C-converted F32 tiles and OpenBLAS's Haswell sgemm (OPENBLAS_CORETYPE=Haswell) on
         * the bench model's shapes (M 512; N x K 1024 x 1024, 256 x 1024, 2816 x 1024,
         * 1024 x 2816), one thread on Zen 4: 105-109 GFLOP/s against 102-105, with no
         * conversion buffer and no repacking of x per tile. About 256 KiB of weight rows per
         * task (they stay in L2 while every row group of x passes over them), a multiple of
         * the tile's three rows. */
        uint32_t rows = (uint32_t)((256u << 10) / ((size_t)c->K * 2));
        rows = PC_MAX(12, PC_MIN(192, rows)) / 3 * 3;
        c->gemm = true;
        c->tile = rows;
    } else {
        c->tile = ENG_CPU_WTILE;
    }
    if (c->tile == 0)
        c->tile = 16;
}

/* Bytes of x[M][K] in each quantized activation format (K a multiple of 32; Q8_K rows exist
 * for K a multiple of 256 only and take 0 bytes otherwise). */
static size_t xq_bytes(uint32_t type, uint32_t M, uint32_t K)
{
    uint32_t bs = eng_ggml_type_block_size(type);
    return K % bs != 0 ? 0 : (size_t)M * eng_quant_row_bytes(type, K);
}

size_t eng__matmul_xbuf_bytes(uint32_t M, uint32_t K)
{
    size_t bf16 = (size_t)M * (K + 2) * sizeof(uint16_t);
    return bf16 + xq_bytes(ENG_GGML_TYPE_Q8_K, M, K) + xq_bytes(ENG_GGML_TYPE_Q8_0, M, K);
}

/* x[M][K] quantized once for the integer products (GEMV or prefill GEMM) of the products in
 * c[0..n) that take it, into buf (room for M rows of both dot types: Q8_K rows first, then
 * Q8_0 ones); each product's xq points at its dot type's rows. */
static void quantize_x(matmul_ctx_t *c, uint32_t n, const float *x, uint32_t M, uint32_t K,
                       void *buf)
{
    char *q8k = buf, *q80 = q8k + xq_bytes(ENG_GGML_TYPE_Q8_K, M, K);
    bool done_k = false, done_0 = false;
    for (uint32_t i = 0; i < n; i++) {
        if (!(c[i].gemv || c[i].qgemm) || !eng__gemv_int8(c[i].w->type))
            continue;
        uint32_t t = eng_quant_dot_type(c[i].w->type);
        bool *done = t == ENG_GGML_TYPE_Q8_K ? &done_k : &done_0;
        char *dst = t == ENG_GGML_TYPE_Q8_K ? q8k : q80;
        size_t stride = eng_quant_row_bytes(t, K);
        for (uint32_t m = 0; m < M && !*done; m++)
            eng__quant_act_isa(t, x + (size_t)m * K, dst + m * stride, K, c[i].isa);
        *done = true;
        c[i].xq = dst;
        c[i].xq_stride = stride;
    }
}

void eng__quant_act_isa(uint32_t type, const float *x, void *dst, uint32_t K, eng_cpu_isa_t isa)
{
    PC_ASSERT(type == ENG_GGML_TYPE_Q8_K || type == ENG_GGML_TYPE_Q8_0);
#if defined(__x86_64__) || defined(__i386__)
    if (eng__cpu_isa_clamp(isa) != ENG_CPU_ISA_PORTABLE) {
        eng__avx2_quant_act(type, x, dst, K);
        return;
    }
#endif
    if (type == ENG_GGML_TYPE_Q8_K)
        eng_quant_act_q8_k(x, dst, K);
    else
        eng_quant_act_q8_0(x, dst, K);
}

/* Several products over one pool run: task t belongs to the first product whose task range
 * holds it. One run instead of several saves a synchronization per product and lets the
 * threads that finish one product's last tiles go on with the next product's. */
typedef struct matmul_multi {
    matmul_ctx_t c[ENG_MATMUL_MAX];
    uint32_t task0[ENG_MATMUL_MAX + 1];
    uint32_t n;
} matmul_multi_t;

static void matmul_multi_task(void *ctx, uint32_t task, uint32_t thread)
{
    const matmul_multi_t *mm = ctx;
    uint32_t i = 0;
    while (task >= mm->task0[i + 1])
        i++;
    matmul_task((void *)&mm->c[i], task - mm->task0[i], thread);
}

void eng__matmul_n(eng_pool_t *pool, const float *x, uint32_t M, const eng_weight_t *const *w,
                   const uint16_t *const *w_bf16, float *const *y, uint32_t n, bool accumulate,
                   float *const *tmp, void *xbuf, eng_cpu_isa_t isa)
{
    PC_ASSERT(n >= 1 && n <= ENG_MATMUL_MAX);
    isa = eng__cpu_isa_clamp(isa);
    uint32_t K = w[0]->n_in;
    uint16_t *a_bf16 = xbuf;
    bool bf16 =
        xbuf != NULL && M >= ENG_GEMV_MAX_M && isa == ENG_CPU_ISA_AVX512 && eng__cpu_has_bf16();
    bool x_bf16 = false, quant = false;
    matmul_multi_t mm = {.n = n};
    for (uint32_t i = 0; i < n; i++) {
        const uint16_t *panels = w_bf16 != NULL ? w_bf16[i] : NULL;
        bool use_bf16 = bf16 && panels != NULL;
        quant = quant || eng__gemv_int8(w[i]->type);
        if (use_bf16 && !x_bf16) { /* x is the same for every product: convert it once */
#if defined(__x86_64__) || defined(__i386__)
            eng__avx512_to_bf16_rows(x, M, w[i]->n_in, a_bf16);
#endif
            x_bf16 = true;
        }
        matmul_setup(&mm.c[i], eng__pool_n_threads(pool), x, M, w[i], panels, y[i], accumulate, tmp,
                     use_bf16 ? a_bf16 : NULL, isa);
        mm.task0[i + 1] = mm.task0[i] + (mm.c[i].N + mm.c[i].tile - 1) / mm.c[i].tile;
    }
    /* x quantized: below ENG_GEMV_MAX_M rows into tmp[0] (no task converts tiles into it then;
     * the two formats take at most 292 / 256 + 34 / 32 bytes per element, well within its
     * ENG_CPU_WTILE floats per element), from it on into xbuf past the BF16 rows. */
    if (quant && M < ENG_GEMV_MAX_M) {
        quantize_x(mm.c, n, x, M, K, tmp[0]);
    } else if (quant) {
        PC_ASSERT(xbuf != NULL);
        quantize_x(mm.c, n, x, M, K, a_bf16 + (size_t)M * (K + 2));
    }
    if (n == 1)
        eng__pool_run(pool, matmul_task, &mm.c[0], mm.task0[1]);
    else
        eng__pool_run(pool, matmul_multi_task, &mm, mm.task0[n]);
}

void eng__matmul(eng_pool_t *pool, const float *x, uint32_t M, const eng_weight_t *w,
                 const uint16_t *w_bf16, float *y, bool accumulate, float *const *tmp, void *xbuf,
                 eng_cpu_isa_t isa)
{
    eng__matmul_n(pool, x, M, &w, &w_bf16, &y, 1, accumulate, tmp, xbuf, isa);
}

/* ---------------------------------------------------------------------------------------------
 * Attention
 * ------------------------------------------------------------------------------------------- */

/* Block bi of the sequence's KV for one KV head, its first n_slots slots, into kt (row stride
 * ldk floats, columns [col, col + n_slots)) and vb (rows [col, col + n_slots), stride hd), as
 * F32. Only the valid slots are read: unwritten ones may hold anything (NaN in tests). */
static void attn_load_block(const eng_attn_args_t *a, eng_cpu_isa_t isa, const void *kv,
                            uint32_t n_slots, float *kt, uint32_t ldk, float *vb, uint32_t col)
{
    uint32_t hd = a->head_dim, bt = a->block_tokens;
    if (a->kv_f16) {
        const uint16_t *k16 = kv;
        switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
        case ENG_CPU_ISA_AVX512:
            eng__avx512_f16_rows_to_f32(k16, bt, kt + col, ldk, hd, n_slots);
            break;
        case ENG_CPU_ISA_AVX2:
            eng__avx2_f16_rows_to_f32(k16, bt, kt + col, ldk, hd, n_slots);
            break;
#endif
        default:
            for (uint32_t d = 0; d < hd; d++)
                eng__port_f16_to_f32(k16 + (size_t)d * bt, kt + (size_t)d * ldk + col, n_slots);
            break;
        }
        eng__f16_to_f32_row_isa(k16 + (size_t)hd * bt, vb + (size_t)col * hd, (size_t)n_slots * hd,
                                isa);
    } else {
        const float *k32 = kv;
        for (uint32_t d = 0; d < hd; d++)
            memcpy(kt + (size_t)d * ldk + col, k32 + (size_t)d * bt, n_slots * sizeof(float));
        memcpy(vb + (size_t)col * hd, k32 + (size_t)hd * bt, (size_t)n_slots * hd * sizeof(float));
    }
}

size_t eng__attention_scratch_floats(uint32_t head_dim, uint32_t block_tokens, uint32_t max_rows)
{
    size_t keys = PC_MAX(block_tokens, ENG_ATTN_CHUNK);
    return 2 * keys * head_dim + (size_t)max_rows * (head_dim + ENG_ATTN_CHUNK);
}

void eng__q8_0_quantize_isa(const float *x, uint32_t n, uint8_t *dst, eng_cpu_isa_t isa)
{
#if defined(__x86_64__) || defined(__i386__)
    if (eng__cpu_isa_clamp(isa) == ENG_CPU_ISA_AVX512) {
        eng__avx512_q8_0_quantize(x, n, dst);
        return;
    }
#endif
    eng_kv_q8_0_quantize(x, n, dst);
}

/* The q8_0 KV path of eng__attention over the task's rows (set up, o zeroed): each row's query
 * quantized once into qbuf, then the keys ENG_ATTN_CHUNK at a time on every path, read in place
 * through per-key row pointers. */
static void attention_q8_0(const eng_attn_args_t *a, const eng_attn_task_t *task,
                           eng_attn_row_t *rows, uint32_t n_rows, uint32_t n_keys_total,
                           uint8_t *qbuf, float *vtile, eng_cpu_isa_t isa)
{
    const eng_kvpool_t *pool = a->kvpool;
    uint32_t hd = a->head_dim, bt = a->block_tokens, nb = hd / ENG_QK8_0;
    size_t rb = eng_kvpool_row_bytes(pool);
    (void)nb; /* the SIMD paths' */
    for (uint32_t r = 0; r < n_rows; r++) {
        eng__q8_0_quantize_isa(rows[r].q, hd, qbuf + (size_t)r * rb, isa);
        rows[r].qq = qbuf + (size_t)r * rb;
    }
    const uint32_t *blocks = a->blocks[task->seq];
    const uint8_t *krow[ENG_ATTN_CHUNK], *vrow[ENG_ATTN_CHUNK];
    for (uint32_t start = 0; start < n_keys_total; start += ENG_ATTN_CHUNK) {
        uint32_t n_keys = PC_MIN(ENG_ATTN_CHUNK, n_keys_total - start);
        const uint8_t *base = NULL;
        for (uint32_t j = 0; j < n_keys; j++) {
            uint32_t pos = start + j, slot = pos % bt;
            if (j == 0 || slot == 0)
                base = eng_kvpool_kv(pool, blocks[pos / bt], a->layer, task->kv_head);
            krow[j] = base + (size_t)slot * rb;
            vrow[j] = base + (size_t)(bt + slot) * rb;
        }
        if (isa == ENG_CPU_ISA_PORTABLE) {
            for (uint32_t r = 0; r < n_rows; r++)
                eng__port_attn_q8_chunk(krow, vrow, hd, &rows[r], start, n_keys);
            continue;
        }
#if defined(__x86_64__) || defined(__i386__)
        /* Several row groups (prefill): the chunk's V converted once (d * q, exact in F32) for
         * all of them, and the F32 value kernel, whose products and sums are then those of the
         * q8_0 value kernel bit for bit (same values, same order): a task's result does not
         * depend on how many rows it has. */
        bool stage_v = n_rows > 4;
        if (stage_v)
            for (uint32_t j = 0; j < n_keys; j++)
                eng_kv_q8_0_dequantize(vrow[j], hd, vtile + (size_t)j * hd);
        for (uint32_t r = 0; r < n_rows; r += 4) {
            uint32_t nr = PC_MIN(4, n_rows - r);
            if (isa == ENG_CPU_ISA_AVX512) {
                eng__avx512_attn_q8_scores4(krow, nb, rows + r, nr, start, n_keys);
                if (stage_v)
                    eng__avx512_attn_values4(vtile, hd, rows + r, nr);
                else
                    eng__avx512_attn_q8_values4(vrow, hd, rows + r, nr);
            } else {
                eng__avx2_attn_q8_scores4(krow, nb, rows + r, nr, start, n_keys);
                if (stage_v)
                    eng__avx2_attn_values4(vtile, hd, rows + r, nr);
                else
                    eng__avx2_attn_q8_values4(vrow, hd, rows + r, nr);
            }
        }
#else
        (void)vtile;
#endif
    }
}

void eng__attention(const eng_attn_args_t *a, const eng_attn_task_t *task, float *scratch)
{
    const eng_kvpool_t *pool = a->kvpool;
    uint32_t hd = a->head_dim, bt = a->block_tokens;
    uint32_t group = a->n_head / a->n_head_kv;
    uint32_t q_stride = a->n_head * hd;
    /* The SIMD paths take the keys ENG_ATTN_CHUNK at a time (whole blocks); the portable one
     * (and any block size the chunk is not a multiple of) block by block. */
    eng_cpu_isa_t isa = a->simd ? eng__cpu_isa_clamp(a->isa) : ENG_CPU_ISA_PORTABLE;
    bool chunks = isa != ENG_CPU_ISA_PORTABLE && ENG_ATTN_CHUNK % bt == 0 && hd % 16 == 0;
    uint32_t keys = chunks ? ENG_ATTN_CHUNK : bt;               /* columns of kt, rows of vb */
    float *kt = scratch;                                        /* [hd][keys] */
    float *vb = kt + (size_t)hd * PC_MAX(bt, ENG_ATTN_CHUNK);   /* [keys][hd] */
    float *obuf = vb + (size_t)hd * PC_MAX(bt, ENG_ATTN_CHUNK); /* [n_rows][hd] */
    uint32_t n_rows = (task->t1 - task->t0) * group;
    eng_attn_row_t rows_fixed[ENG_ATTN_MAX_ROWS];
    PC_ASSERT(n_rows <= PC_ARRAY_LEN(rows_fixed));
    float *pbuf = obuf + (size_t)n_rows * hd; /* [n_rows][ENG_ATTN_CHUNK] */
    eng_attn_row_t *rows = rows_fixed;
    uint32_t max_pos = 0;
    for (uint32_t t = task->t0, r = 0; t < task->t1; t++) {
        for (uint32_t g = 0; g < group; g++, r++) {
            uint32_t h = task->kv_head * group + g;
            rows[r].q = a->q + (size_t)t * q_stride + (size_t)h * hd;
            rows[r].qq = NULL;
            rows[r].o = obuf + (size_t)r * hd;
            rows[r].p = pbuf + (size_t)r * ENG_ATTN_CHUNK;
            rows[r].m = -INFINITY;
            rows[r].l = 0;
            rows[r].pos = a->pos[t];
            memset(rows[r].o, 0, hd * sizeof(float));
        }
        max_pos = PC_MAX(max_pos, a->pos[t]);
    }
    const uint32_t *blocks = a->blocks[task->seq];
    uint32_t n_keys_total = max_pos + 1;
    if (a->kv_q8_0) {
        /* The queries' q8_0 blocks take the place of the F32 key tile (n_rows x hd x 34/32
         * bytes, well within hd x 64 floats); the value tile is V's, as for F16. */
        attention_q8_0(a, task, rows, n_rows, n_keys_total, (uint8_t *)kt, vb, isa);
        goto normalize;
    }
    for (uint32_t start = 0; start < n_keys_total; start += keys) {
        uint32_t n_keys = PC_MIN(keys, n_keys_total - start);
#if defined(__x86_64__) || defined(__i386__)
        if (isa == ENG_CPU_ISA_AVX512 && a->kv_f16 && chunks && bt == 16 &&
            n_keys == ENG_ATTN_CHUNK && ENG_ATTN_CHUNK == 4 * 16) {
            /* A whole chunk of F16 blocks: read in place (cpu_simd.h). */
            const uint16_t *kb[4], *vb4[4];
            for (uint32_t i = 0; i < 4; i++) {
                kb[i] = eng_kvpool_kv(pool, blocks[start / bt + i], a->layer, task->kv_head);
                vb4[i] = kb[i] + (size_t)hd * bt;
            }
            for (uint32_t r = 0; r < n_rows; r += 4) {
                uint32_t nr = PC_MIN(4, n_rows - r);
                eng__avx512_attn_scores4_f16(kb, hd, rows + r, nr, start);
                eng__avx512_attn_values4_f16(vb4, hd, rows + r, nr);
            }
            continue;
        }
#endif
        for (uint32_t col = 0; col < n_keys; col += bt) {
            const void *kv =
                eng_kvpool_kv(pool, blocks[(start + col) / bt], a->layer, task->kv_head);
            attn_load_block(a, isa, kv, PC_MIN(bt, n_keys - col), kt, keys, vb, col);
        }
        if (n_keys < keys) /* lanes past the valid keys are masked, but keep them finite */
            for (uint32_t d = 0; d < hd; d++)
                memset(kt + (size_t)d * keys + n_keys, 0, (keys - n_keys) * sizeof(float));
        if (!chunks) {
            for (uint32_t r = 0; r < n_rows; r++)
                eng__port_attn_block(kt, vb, hd, bt, &rows[r], start, n_keys);
            continue;
        }
#if defined(__x86_64__) || defined(__i386__)
        for (uint32_t r = 0; r < n_rows; r += 4) {
            uint32_t nr = PC_MIN(4, n_rows - r);
            if (isa == ENG_CPU_ISA_AVX512) {
                eng__avx512_attn_scores4(kt, hd, rows + r, nr, start, n_keys);
                eng__avx512_attn_values4(vb, hd, rows + r, nr);
            } else {
                eng__avx2_attn_scores4(kt, hd, rows + r, nr, start, n_keys);
                eng__avx2_attn_values4(vb, hd, rows + r, nr);
            }
        }
#endif
    }
normalize:
    for (uint32_t t = task->t0, r = 0; t < task->t1; t++) {
        for (uint32_t g = 0; g < group; g++, r++) {
            uint32_t h = task->kv_head * group + g;
            float *out = a->out + (size_t)t * q_stride + (size_t)h * hd;
            float inv = 1.0f / rows[r].l;
            for (uint32_t d = 0; d < hd; d++)
                out[d] = rows[r].o[d] * inv;
        }
    }
}
