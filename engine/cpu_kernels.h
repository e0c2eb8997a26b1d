/*
 * cpu_kernels.h — the CPU backend's compute kernels (engine-internal).
 *
 * Weights are F32, F16, BF16 or quantized (quant.h), as the model stores them. Below ENG_GEMV_MAX_M
 * rows of x (decode) every type is multiplied directly by the path's GEMV kernel, which reads each
 * weight once in its own format. From it on (prefill), on the AVX2 path F16 weights go to the AVX2
 * register-tile GEMM as stored; otherwise F16 and BF16 weights are converted tile by tile into a
 * per-thread F32 buffer, multiplied by that GEMM (AVX2) or by OpenBLAS sgemm (one
 * single-threaded call per slice of output columns on each pool thread; OpenBLAS is set to one
 * thread). The quantized weight types (eng__gemv_int8: Q8_0, Q4_0, Q5_0, Q5_1 and the K-quants)
 * take x quantized at every row count, as llama.cpp's CPU backend does (to
 * Q8_0 or Q8_K blocks, byte for byte its rounding, quant.h): prefill computes the decode GEMV's
 * integer dot products on every row of x, a tile of weight rows at a time (read from memory
 * once, in cache while every row group of x passes over them): on the AVX-512 path by a
 * register-tiled GEMM on the tile decoded once into a packed form (eng__avx512_qgemm, bit for bit
 * the dot product's results), on the others by the dot product itself, row by row. So prefill and
 * decode compute the same products, and llama.cpp's logits on the same file are matched to float
 * rounding. Every
 * function takes the ISA path (cpu.h) to run; AUTO is the best the CPU runs, and a path the CPU
 * cannot run is lowered to the best it can.
 *
 * Attention runs over the paged KV cache, one task per (sequence, KV head, run of query
 * tokens), block by block with an online softmax (FlashAttention's recurrence), so no score
 * matrix is ever materialized and unused KV slots are never read.
 */
#ifndef ENG_CPU_KERNELS_H
#define ENG_CPU_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu.h"
#include "model.h"

/* Rows of a weight tile converted at once for the F16 x sgemm path. */
#define ENG_CPU_WTILE 128

/* y[M][N] = x[M][K] . w^T, or y += that with accumulate. tmp[thread] points at
 * ENG_CPU_WTILE * K floats per pool thread. xbuf is NULL or room for eng__matmul_xbuf_bytes(M, K)
 * bytes: x converted once for the products that take it converted (BF16 rows, quantized rows);
 * it must be set for an eng__gemv_int8 w from ENG_GEMV_MAX_M rows on. With xbuf and w_bf16 (w's
 * BF16 panels, eng__bf16_pack; the backend's own layout, not the model's) set, products of at
 * least 32 rows (prefill) run as BF16 dot products with F32 accumulation (x rounded to BF16):
 * twice the FMA rate of F32 on CPUs with AVX512-BF16. Fewer rows (decode) take the GEMV on the
 * weights as stored. */
void eng__matmul(eng_pool_t *pool, const float *x, uint32_t M, const eng_weight_t *w,
                 const uint16_t *w_bf16, float *y, bool accumulate, float *const *tmp, void *xbuf,
                 eng_cpu_isa_t isa);

/* Bytes of the xbuf eng__matmul takes for M rows of K (K a multiple of 32 for quantized
 * weights). */
size_t eng__matmul_xbuf_bytes(uint32_t M, uint32_t K);

/* x[K] quantized to type (ENG_GGML_TYPE_Q8_0 or _Q8_K; quant.h's eng_quant_act_q8_0 / _q8_k) on
 * the fastest kernel of isa: the same bytes on every path. */
void eng__quant_act_isa(uint32_t type, const float *x, void *dst, uint32_t K, eng_cpu_isa_t isa);

/* y[i] = x . w[i]^T (or +=) for i < n <= ENG_MATMUL_MAX, the same x (all w[i]->n_in equal), in
 * one pool run: the q/k/v and the gate/up projections of a layer. w_bf16 is NULL or [n] (each
 * NULL or w[i]'s panels). */
#define ENG_MATMUL_MAX 4
void eng__matmul_n(eng_pool_t *pool, const float *x, uint32_t M, const eng_weight_t *const *w,
                   const uint16_t *const *w_bf16, float *const *y, uint32_t n, bool accumulate,
                   float *const *tmp, void *xbuf, eng_cpu_isa_t isa);

/*
 * BF16 panels. A weight matrix [n_out][n_in] is stored as ceil(n_out / 16) panels of 16 output
 * rows; a panel is ceil(n_in / 2) pairs of input columns, each pair 16 lanes of two BF16 values:
 *   panel[p][j][lane][e] = bf16(w[16 p + lane][2 j + e])   (zero past n_out or n_in)
 * so one 64-byte load feeds VDPBF16PS with 16 outputs x 2 inputs. The panel count is rounded up
 * to an even number (the kernel works on 32 outputs at a time).
 */
size_t eng__bf16_packed_elems(uint32_t n_in, uint32_t n_out);
void eng__bf16_pack(const eng_weight_t *w, uint16_t *dst);
/* True when the CPU has AVX512-BF16. */
bool eng__cpu_has_bf16(void);

/* eng_kv_q8_0_quantize (kvpool.h) on the fastest kernel of isa: the same bytes on every path. */
void eng__q8_0_quantize_isa(const float *x, uint32_t n, uint8_t *dst, eng_cpu_isa_t isa);

/* One attention task's geometry. */
typedef struct eng_attn_task {
    uint32_t seq; /* index into the seqs of the batch */
    uint32_t kv_head;
    uint32_t t0, t1; /* batch rows [t0, t1) of the sequence (same sequence, ascending pos) */
} eng_attn_task_t;

typedef struct eng_attn_args {
    const float *q;      /* [T][n_head * head_dim], roped and scaled by 1/sqrt(head_dim) */
    float *out;          /* [T][n_head * head_dim] */
    const uint32_t *pos; /* [T] position of each batch row */
    const uint32_t *const *blocks; /* [n_seqs] -> block table of each sequence */
    const void *kvpool;            /* struct eng_kvpool * */
    uint32_t layer;
    uint32_t n_head, n_head_kv, head_dim, block_tokens;
    bool kv_f16;
    bool kv_q8_0;      /* q8_0 K and V (kvpool.h), read as stored: the query is quantized once
                          per task row, scores are integer dot products; kv_f16 is then false */
    bool simd;         /* false: the portable path whatever isa says */
    eng_cpu_isa_t isa; /* with simd: the path (AUTO, the zero value, is the best one) */
} eng_attn_args_t;

/* The most query rows one attention task may have: tokens of the task x heads per KV head. */
#define ENG_ATTN_MAX_ROWS 64

/* Floats of per-thread scratch eng__attention needs for tasks of at most max_rows rows
 * (max_rows <= ENG_ATTN_MAX_ROWS). */
size_t eng__attention_scratch_floats(uint32_t head_dim, uint32_t block_tokens, uint32_t max_rows);

/* The attention of one task's rows over positions [0, pos] of each row, into a->out. scratch
 * holds eng__attention_scratch_floats() floats. The AVX-512 and AVX2 paths take 64 keys (whole
 * blocks) at a time; the portable path one block at a time (and any block size). q8_0 KV is
 * never converted to a copy: every path reads the blocks 64 keys at a time through one pointer
 * per key (any block size). */
void eng__attention(const eng_attn_args_t *a, const eng_attn_task_t *task, float *scratch);

#endif
