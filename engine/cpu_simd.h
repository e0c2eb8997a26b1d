/*
 * cpu_simd.h — the per-ISA kernels behind the CPU backend's dispatch (engine-internal; see the
 * ISA paths in cpu.h). Each function exists once per path: eng__avx512_* (cpu_kernels.c),
 * eng__avx2_* (cpu_avx2.c, x86 only) and eng__port_* (cpu_portable.c, every architecture).
 * Callers pick one through eng__cpu_isa_clamp(); an eng__avx* function must never be called on
 * a CPU that eng__cpu_isa_runs() says cannot run its path.
 */
#ifndef ENG_CPU_SIMD_H
#define ENG_CPU_SIMD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gguf.h"
#include "quant.h"

/* Half rows: src[n] -> dst[n]. */
void eng__avx512_f16_to_f32(const uint16_t *src, float *dst, size_t n);
void eng__avx512_f32_to_f16(const float *src, uint16_t *dst, size_t n);
void eng__avx2_f16_to_f32(const uint16_t *src, float *dst, size_t n);
void eng__avx2_f32_to_f16(const float *src, uint16_t *dst, size_t n);
void eng__port_f16_to_f32(const uint16_t *src, float *dst, size_t n);
void eng__port_f32_to_f16(const float *src, uint16_t *dst, size_t n);
/* BF16 values src[n] -> dst[n] (exact): the portable loop every path uses for the prefill's
 * weight tiles and the model's row reads (the GEMVs convert in registers). Quantized rows go
 * through quant.h's eng_quant_row_to_f32. */
void eng__port_bf16_to_f32(const uint16_t *src, float *dst, size_t n);

/* rows x n halves (row strides ss and ds elements) to F32: the keys of a KV block, one short
 * row per head dimension, converted without a call per row. */
void eng__avx512_f16_rows_to_f32(const uint16_t *src, size_t ss, float *dst, size_t ds,
                                 uint32_t rows, uint32_t n);
void eng__avx2_f16_rows_to_f32(const uint16_t *src, size_t ss, float *dst, size_t ds, uint32_t rows,
                               uint32_t n);

/* The most rows of x the GEMV takes (ENG_GEMV_MAX_M); more go to a GEMM. */
#define ENG_GEMV_MAX_M 32

/* A small product y[m][n] (+)= x[m] . w[n] for the rows n in [n0, n1) of w and every m < M:
 * memory bound, one pass over those weight rows, each converted once in registers and applied to
 * the rows of x in groups. w is stored as the model keeps it (wtype, an enum eng_ggml_type; rows
 * of eng__gemv_row_bytes() bytes): F32, F16 and BF16 rows meet x in F32; Q8_0, Q4_0, Q5_0, Q5_1,
 * Q4_K, Q5_K and Q6_K rows (eng__gemv_int8) meet xq, the rows of x quantized once to the weight
 * type's dot type (quant.h: Q8_0 for Q8_0 / Q4_0 / Q5_0 / Q5_1, Q8_K for the K-quants), in
 * integer dot products. K is a multiple of the type's block (32 for Q8_0, Q4_0, Q5_0 and Q5_1, 256
 * for the K-quants). */
typedef struct eng_gemv {
    const void *w;    /* [N] rows of K elements of wtype */
    uint32_t wtype;   /* ENG_GGML_TYPE_F32, _F16, _BF16 or an eng__gemv_int8 type */
    const float *x;   /* [M][K] */
    const void *xq;   /* [M] rows of xq_stride bytes: x quantized, for the eng__gemv_int8 types */
    size_t xq_stride; /* eng_quant_row_bytes(eng_quant_dot_type(wtype), K) */
    uint32_t M, K;    /* M <= ENG_GEMV_MAX_M (the GEMVs; the GEMMs take any M) */
    float *y;         /* [M][ldy] */
    uint32_t ldy;
    bool accumulate;
} eng_gemv_t;

/* Bytes of a Q8_0 block (an F16 scale and 32 int8 quants). */
#define ENG_Q8_0_BYTES ((uint32_t)sizeof(eng_block_q8_0_t))

/* Bytes of one weight row of K elements of wtype (quant.h's table). */
static inline size_t eng__gemv_row_bytes(uint32_t wtype, uint32_t K)
{
    return eng_quant_row_bytes(wtype, K);
}

/* True for the weight types whose products take x quantized (eng_gemv_t.xq), as llama.cpp's
 * CPU backend quantizes it for them: Q8_0, Q4_0, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K. */
static inline bool eng__gemv_int8(uint32_t wtype)
{
    return wtype == ENG_GGML_TYPE_Q8_0 || wtype == ENG_GGML_TYPE_Q4_0 ||
           wtype == ENG_GGML_TYPE_Q5_0 || wtype == ENG_GGML_TYPE_Q5_1 ||
           wtype == ENG_GGML_TYPE_Q4_K || wtype == ENG_GGML_TYPE_Q5_K ||
           wtype == ENG_GGML_TYPE_Q6_K;
}

void eng__avx512_gemv(const eng_gemv_t *g, uint32_t n0, uint32_t n1);
void eng__avx2_gemv(const eng_gemv_t *g, uint32_t n0, uint32_t n1);
void eng__port_gemv(const eng_gemv_t *g, uint32_t n0, uint32_t n1);

/* One weight row w of an eng__gemv_int8 type (K elements) times one activation row xq (its dot
 * type): integer products per block, scaled into F32 once per block. The AVX-512 one uses
 * AVX512-BW and VNNI (VPDPBUSD, VPDPWSSD) and falls back to the AVX2 one on CPUs without them;
 * the portable one is quant.h's reference (eng_quant_vec_dot). The paths sum the blocks in
 * different orders: they agree to float rounding, not bit for bit. */
float eng__avx512_dot_q(uint32_t wtype, const void *w, const void *xq, uint32_t K);
float eng__avx2_dot_q(uint32_t wtype, const void *w, const void *xq, uint32_t K);
float eng__port_dot_q(uint32_t wtype, const void *w, const void *xq, uint32_t K);

/* The prefill GEMM of an eng__gemv_int8 type on the AVX-512 path (any M): y[m][n] (+)= the
 * product of xq's row m and w's row n for n in [n0, n1), bit for bit eng__avx512_dot_q's result for
 * each (m, n). The weight rows are decoded once into buf (buf_bytes, any alignment: about
 * 2.25 bytes per weight plus 12 K for Q4_0's prepared rows of x) and every row of x passes over
 * them, four rows by two weight rows per register tile. Returns false, writing nothing, for a type
 * it does not take (Q4_0 with K a multiple of 64, Q4_K, Q5_K and Q6_K), a CPU without AVX512-BW
 * and VNNI, or a buf too small. */
bool eng__avx512_qgemm(const eng_gemv_t *g, uint32_t n0, uint32_t n1, void *buf, size_t buf_bytes);

/* How far ahead of the weight row being multiplied the GEMVs prefetch, in bytes. A quantized row
 * is short (576 bytes for Q4_K at K 1024) and its dot product does enough work per byte that the
 * hardware prefetcher alone leaves the loads waiting: on the Zen 5 test machine the Q4_0 and Q6_K
 * rows' first loads took most of the GEMV's samples. With 256-row tasks, 4 KiB ahead brought one
 * decode token's Q4_K_M matrices from 0.87 to 0.96-0.98 of a plain read loop's bandwidth (2 KiB:
 * 0.91; 8 KiB was not better than 4 in end-to-end runs). */
#define ENG_GEMV_PREFETCH_BYTES 4096

/* Prefetches the rb bytes that lie ENG_GEMV_PREFETCH_BYTES past the weight row wr (rb bytes):
 * called once per row of a run of consecutive rows, it touches every cache line of the stream
 * once, ahead of its use. The lines past the task's last row (or the matrix's end) are only
 * hinted: a prefetch never faults. */
static inline void eng__gemv_prefetch_row(const void *wr, size_t rb)
{
    const char *p = (const char *)wr + ENG_GEMV_PREFETCH_BYTES;
    for (size_t o = 0; o < rb; o += 64)
        __builtin_prefetch(p + o, 0, 3);
}

/* The GEMV of an eng__gemv_int8 type through one path's dot product: row by row of w, each row
 * (L1-resident after its first use) against every row of xq, the rows ahead prefetched. */
static inline void eng__gemv_q(const eng_gemv_t *g, uint32_t n0, uint32_t n1,
                               float (*dot)(uint32_t, const void *, const void *, uint32_t))
{
    size_t rb = eng__gemv_row_bytes(g->wtype, g->K);
    for (uint32_t n = n0; n < n1; n++) {
        const void *wr = (const char *)g->w + (size_t)n * rb;
        eng__gemv_prefetch_row(wr, rb);
        for (uint32_t m = 0; m < g->M; m++) {
            float s = dot(g->wtype, wr, (const char *)g->xq + (size_t)m * g->xq_stride, g->K);
            float *yp = &g->y[(size_t)m * g->ldy + n];
            *yp = g->accumulate ? *yp + s : s;
        }
    }
}

/* A Q4_K / Q5_K block's packed scales[12] as out[16]: the eight 6-bit scales, then the eight
 * mins (eng_quant_k4_scale_min for j = 0..7, four bytes at a time). */
static inline void eng__k4_unpack(const uint8_t *scales, uint8_t out[16])
{
    uint32_t u[3], v[4];
    memcpy(u, scales, 12);
    v[0] = u[0] & 0x3f3f3f3fu;
    v[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    v[2] = u[1] & 0x3f3f3f3fu;
    v[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    memcpy(out, v, 16);
}

/* quant.h's activation quantization (eng_quant_act_q8_0 / eng_quant_act_q8_k, by type: Q8_0 or
 * Q8_K) with AVX2, byte for byte the same blocks; the AVX-512 path uses it too (it is a few
 * percent of a product). */
void eng__avx2_quant_act(uint32_t type, const float *x, void *dst, size_t n);

/* True when the CPU has AVX512-BW and AVX512-VNNI (the AVX-512 integer dot products). */
bool eng__cpu_has_avx512_vnni(void);
/* True when the CPU also has AVX512-VBMI (VPERMB): the Q4_0 GEMV's one-load block pairs. */
bool eng__cpu_has_avx512_vbmi(void);

/* The same product for any M (prefill) on the AVX2 path: register tiles of four rows of x by
 * three weight rows, F16 converted in registers, no packing. The caller keeps [n0, n1) small
 * enough for those weight rows to stay in L2. */
void eng__avx2_gemm(const eng_gemv_t *g, uint32_t n0, uint32_t n1);

/* The BF16 GEMM (AVX512-BF16 only; the panel layout is in cpu_kernels.h): x[M][K] as BF16 rows
 * of ceil(K / 2) pairs (zero padded), and C[M][32 columns of a panel pair] (+)= A . B for the
 * 8-row block at m0 (rows past M repeat the last one and are not stored; n_valid <= 32 columns
 * from n0 are stored). */
void eng__avx512_to_bf16_rows(const float *x, uint32_t M, uint32_t K, uint16_t *dst);
/* One BF16 panel (cpu_kernels.h's layout: [kp][16 rows][2]) from 16 F32 rows of 2 kp floats
 * (NULL: a row of zeros); kp a multiple of 16. AVX512-BF16 only. */
void eng__avx512_bf16_panel(const float *const rows[16], uint32_t kp, uint16_t *panel);
void eng__avx512_gemm_bf16_block(const uint32_t *a /* [M][kp] pairs */, uint32_t M, uint32_t m0,
                                 uint32_t kp, const uint16_t *b0, const uint16_t *b1, float *y,
                                 uint32_t ldy, uint32_t n0, uint32_t n_valid, bool accumulate);

/* Attention: keys per chunk on the SIMD paths (four 16-slot blocks). */
#define ENG_ATTN_CHUNK 64

/* The running state of one query row: max score m, normalizer l, unnormalized output o, the
 * current chunk's weights p[ENG_ATTN_CHUNK], the factor corr the previous output is scaled by,
 * and n_valid, the chunk's keys the row sees. */
typedef struct eng_attn_row {
    const float *q;
    const uint8_t *qq; /* q as head_dim / 32 q8_0 blocks (the q8_0 KV path only) */
    float *o;
    float *p;
    float m, l, corr;
    uint32_t pos, n_valid;
} eng_attn_row_t;

/* Scores of up to four rows against a chunk's keys (kt [hd][ENG_ATTN_CHUNK], F32, finite in
 * every lane; the chunk's first key is at position start, n_keys valid), then each row's
 * online-softmax step: m, l, corr, n_valid and the weights p (zero past the row's last visible
 * key; all zero with corr 1 for a row that sees none of the chunk). hd is a multiple of 16. */
void eng__avx512_attn_scores4(const float *kt, uint32_t hd, eng_attn_row_t *rows, uint32_t n_rows,
                              uint32_t start, uint32_t n_keys);
void eng__avx2_attn_scores4(const float *kt, uint32_t hd, eng_attn_row_t *rows, uint32_t n_rows,
                            uint32_t start, uint32_t n_keys);
/* o = o * corr + p . V for up to four rows (vb [ENG_ATTN_CHUNK][hd], F32; only the first
 * max(n_valid) rows of vb are read). hd is a multiple of 16. */
void eng__avx512_attn_values4(const float *vb, uint32_t hd, eng_attn_row_t *rows, uint32_t n_rows);
void eng__avx2_attn_values4(const float *vb, uint32_t hd, eng_attn_row_t *rows, uint32_t n_rows);
/* The same two on a whole chunk of an F16 KV cache in blocks of 16 slots, read in place: kb[i]
 * and vb[i] are block i's K ([hd][16]) and V ([16][hd]), every slot written (n_keys is
 * ENG_ATTN_CHUNK). Bit for bit the F32 kernels on the chunk converted (the conversion is exact):
 * decode skips a pass over the KV through a scratch tile. */
void eng__avx512_attn_scores4_f16(const uint16_t *const kb[4], uint32_t hd, eng_attn_row_t *rows,
                                  uint32_t n_rows, uint32_t start);
void eng__avx512_attn_values4_f16(const uint16_t *const vb[4], uint32_t hd, eng_attn_row_t *rows,
                                  uint32_t n_rows);
/* One KV block (kt [hd][bt], vb [bt][hd], F32, block_start the position of its first slot,
 * n_slots valid) against one row: the portable path, for any block size. */
void eng__port_attn_block(const float *kt, const float *vb, uint32_t hd, uint32_t bt,
                          eng_attn_row_t *row, uint32_t block_start, uint32_t n_slots);

/* q8_0 KV (kvpool.h): krow[j] / vrow[j] point at key j's K / V row of nb = head_dim / 32 q8_0
 * blocks, for j < n_keys <= ENG_ATTN_CHUNK (the keys of a chunk may lie in several KV blocks:
 * one pointer per key, so any block size works). Each row's query is rows[r].qq (q8_0, quantized
 * once per step); a score is sum over blocks of d_q d_k (q . k), the int8 dot product exact in
 * int32, like ggml's vec_dot_q8_0_q8_0. */
/* Raw scores of up to four rows (rows past n_rows repeat row 0 and store first) into p[0,
 * n_keys), zero past n_keys. The AVX-512 path uses it too: a q8_0 block is 256 bits, and
 * AVX-512F (the path's feature set) has no 512-bit byte products (those are AVX512-BW/VNNI). */
void eng__avx2_attn_q8_dots4(const uint8_t *const *krow, uint32_t nb, eng_attn_row_t *rows,
                             uint32_t n_rows, uint32_t n_keys);
/* The scores and the online-softmax step, as eng__avx2_attn_scores4 / eng__avx512_attn_scores4
 * do for F32 keys. */
void eng__avx2_attn_q8_scores4(const uint8_t *const *krow, uint32_t nb, eng_attn_row_t *rows,
                               uint32_t n_rows, uint32_t start, uint32_t n_keys);
void eng__avx512_attn_q8_scores4(const uint8_t *const *krow, uint32_t nb, eng_attn_row_t *rows,
                                 uint32_t n_rows, uint32_t start, uint32_t n_keys);
/* o = o * corr + p . V for up to four rows, V read as q8_0 (d * q converted in registers; only
 * the first max(n_valid) rows are read). */
void eng__avx2_attn_q8_values4(const uint8_t *const *vrow, uint32_t hd, eng_attn_row_t *rows,
                               uint32_t n_rows);
void eng__avx512_attn_q8_values4(const uint8_t *const *vrow, uint32_t hd, eng_attn_row_t *rows,
                                 uint32_t n_rows);
/* One row against a chunk of n_keys q8_0 keys starting at position start: the portable path. */
void eng__port_attn_q8_chunk(const uint8_t *const *krow, const uint8_t *const *vrow, uint32_t hd,
                             eng_attn_row_t *row, uint32_t start, uint32_t n_keys);

/* eng_kv_q8_0_quantize (kvpool.h) on the AVX-512 path: the same bytes for every input. */
void eng__avx512_q8_0_quantize(const float *x, uint32_t n, uint8_t *dst);

/* Element-wise rows: y = x / rms(x) * w (y may be x), and g = silu(g) * u. */
void eng__avx2_rmsnorm(const float *x, const float *w, float *y, uint32_t n, float eps);
void eng__port_rmsnorm(const float *x, const float *w, float *y, uint32_t n, float eps);
/* The SwiGLU of the SIMD paths is llama.cpp's on that ISA (ggml's vector e^x), operation for
 * operation; the portable one takes libm's expf. */
void eng__avx2_swiglu(float *g, const float *u, size_t n);
void eng__avx512_swiglu(float *g, const float *u, size_t n);
void eng__port_swiglu(float *g, const float *u, size_t n);

/* RoPE on one head: the pairs (x[a], x[b]) with a = i, b = i + rope_dim / 2 (neox) or a = 2i,
 * b = 2i + 1, rotated by (cs[i], sn[i]), for i < rope_dim / 2. */
void eng__avx2_rope(float *x, const float *cs, const float *sn, uint32_t rope_dim, bool neox);
void eng__port_rope(float *x, const float *cs, const float *sn, uint32_t rope_dim, bool neox);

#endif
