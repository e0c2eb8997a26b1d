/*
 * quant.h — the quantized weight formats of GGUF (ggml's block layouts), their reference
 * arithmetic, and the one table of type sizes (engine-internal; the CPU kernels, the model
 * loader, the model generator and the cuda backend use it).
 *
 * A quantized row of n elements is n / block_size blocks laid end to end; a block is the packed
 * struct below, byte for byte as ggml writes it (little-endian, no padding: each struct's size is
 * asserted). F16 fields are IEEE halves stored as uint16_t (half.h converts them).
 *
 *   Q4_0  (32 elements, 18 bytes)   u16 d | u8 qs[16]
 *         element j < 16 = d * ((qs[j] & 15) - 8), element j + 16 = d * ((qs[j] >> 4) - 8)
 *   Q5_0  (32 elements, 22 bytes)   u16 d | u8 qh[4] | u8 qs[16]
 *         as Q4_0 with a fifth bit: bit j of qh (read as a little-endian u32) is the high bit of
 *         element j; element = d * (q - 16), q in 0..31.
 *   Q5_1  (32 elements, 24 bytes)   u16 d | u16 m | u8 qh[4] | u8 qs[16]
 *         as Q5_0 with a min instead of the offset: element = d * q + m.
 *   Q8_0  (32 elements, 34 bytes)   u16 d | i8 qs[32]                element j = d * qs[j]
 *   Q4_K  (256 elements, 144 bytes) u16 d | u16 dmin | u8 scales[12] | u8 qs[128]
 *         8 sub-blocks of 32, each with a 6-bit scale sc and a 6-bit min m packed in scales[]
 *         (eng_quant_k4_scale_min); 64 elements share 32 bytes of qs: sub-block 2i takes the low
 *         nibbles, 2i + 1 the high ones. element = (d * sc) * q - (dmin * m), q in 0..15.
 *   Q5_K  (256 elements, 176 bytes) u16 d | u16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]
 *         as Q4_K with a fifth bit: bit 2i of qh[l] is the high bit of sub-block 2i's element l,
 *         bit 2i + 1 that of sub-block 2i + 1's. q in 0..31.
 *   Q6_K  (256 elements, 210 bytes) u8 ql[128] | u8 qh[64] | i8 scales[16] | u16 d
 *         16 sub-blocks of 16 with int8 scales; each half of 128 elements takes 64 bytes of ql
 *         and 32 of qh: element l + 32 s (s < 4, l < 32) has its low nibble from ql[l + 32 (s & 1)]
 *         (low for s < 2, high otherwise) and its top two bits from bits 2s..2s+1 of qh[l].
 *         element = (d * scales[sub-block]) * (q - 32), q in 0..63.
 *   Q8_K  (256 elements, 292 bytes) f32 d | i8 qs[256] | i16 bsums[16]
 *         the activation format of the K-quant dot products (never stored in a file): element
 *         j = d * qs[j]; bsums[i] = the sum of qs[16 i .. 16 i + 15].
 *
 * Products. A quantized weight row is multiplied by an activation row quantized once to its
 * "dot type" (eng_quant_dot_type: Q8_0 for Q4_0, Q5_0, Q5_1 and Q8_0, Q8_K for the K-quants)
 * with integer arithmetic like ggml's: per block, the weight's and the activation's quants are
 * multiplied and summed in int32 (the K-quants' mins through bsums, Q5_1's min through the sum
 * of the activation's quants: ggml's Q8_1 carries that sum), then scaled by the two blocks'
 * scales in float and accumulated in float in block order. The reference functions here (portable
 * C) are the oracle the SIMD and CUDA paths are tested against.
 *
 * Every function takes n as a multiple of the type's block size (asserted) and reads or writes
 * exactly eng_quant_row_bytes(type, n) bytes; pointers need no alignment beyond a byte. No state:
 * any thread may call anything at any time.
 */
#ifndef ENG_QUANT_H
#define ENG_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h" /* enum eng_ggml_type, ENG_QK8_0 */

#define ENG_QK4_0 32
#define ENG_QK_K 256        /* elements of a K-quant super-block */
#define ENG_K_SCALE_SIZE 12 /* bytes of Q4_K / Q5_K packed 6-bit scales and mins */

typedef struct eng_block_q4_0 {
    uint16_t d; /* F16 */
    uint8_t qs[ENG_QK4_0 / 2];
} eng_block_q4_0_t;

/* Q5_0 and Q5_1 are what llama.cpp's quantizer writes instead of Q4_K and Q5_K for a tensor
 * whose rows are not whole super-blocks of 256 (llama_tensor_get_type's fallback). */
typedef struct eng_block_q5_0 {
    uint16_t d; /* F16 */
    uint8_t qh[4];
    uint8_t qs[ENG_QK4_0 / 2];
} eng_block_q5_0_t;

typedef struct eng_block_q5_1 {
    uint16_t d; /* F16 */
    uint16_t m; /* F16 */
    uint8_t qh[4];
    uint8_t qs[ENG_QK4_0 / 2];
} eng_block_q5_1_t;

typedef struct eng_block_q8_0 {
    uint16_t d; /* F16 */
    int8_t qs[ENG_QK8_0];
} eng_block_q8_0_t;

typedef struct eng_block_q4_k {
    uint16_t d;    /* F16: super-block scale of the sub-block scales */
    uint16_t dmin; /* F16: super-block scale of the sub-block mins */
    uint8_t scales[ENG_K_SCALE_SIZE];
    uint8_t qs[ENG_QK_K / 2];
} eng_block_q4_k_t;

typedef struct eng_block_q5_k {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[ENG_K_SCALE_SIZE];
    uint8_t qh[ENG_QK_K / 8];
    uint8_t qs[ENG_QK_K / 2];
} eng_block_q5_k_t;

typedef struct eng_block_q6_k {
    uint8_t ql[ENG_QK_K / 2];
    uint8_t qh[ENG_QK_K / 4];
    int8_t scales[ENG_QK_K / 16];
    uint16_t d; /* F16 */
} eng_block_q6_k_t;

typedef struct eng_block_q8_k {
    float d;
    int8_t qs[ENG_QK_K];
    int16_t bsums[ENG_QK_K / 16];
} eng_block_q8_k_t;

_Static_assert(sizeof(eng_block_q4_0_t) == 18, "Q4_0 block is 18 bytes");
_Static_assert(sizeof(eng_block_q5_0_t) == 22, "Q5_0 block is 22 bytes");
_Static_assert(sizeof(eng_block_q5_1_t) == 24, "Q5_1 block is 24 bytes");
_Static_assert(sizeof(eng_block_q8_0_t) == 34, "Q8_0 block is 34 bytes");
_Static_assert(sizeof(eng_block_q4_k_t) == 144, "Q4_K block is 144 bytes");
_Static_assert(sizeof(eng_block_q5_k_t) == 176, "Q5_K block is 176 bytes");
_Static_assert(sizeof(eng_block_q6_k_t) == 210, "Q6_K block is 210 bytes");
_Static_assert(sizeof(eng_block_q8_k_t) == 292, "Q8_K block is 292 bytes");

/* ---------------------------------------------------------------------------------------------
 * The type table (every ggml type id: name, elements and bytes per block; gguf.h's
 * eng_ggml_type_name / _block_size / _block_bytes read it too)
 * ------------------------------------------------------------------------------------------- */

/* Bytes of a row of n elements of `type` (n a multiple of the block size), 0 for an unknown id.
 */
size_t eng_quant_row_bytes(uint32_t type, uint64_t n);

/* True for the weight types the engine computes with: F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q5_1,
 * Q4_K, Q5_K, Q6_K (gguf.h's eng_ggml_type_supported). */
bool eng_quant_type_computed(uint32_t type);

/* True for the block-quantized ones among them (Q8_0, Q4_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K). */
bool eng_quant_type_is_quant(uint32_t type);

/* The activation format a weight type's integer dot product takes: ENG_GGML_TYPE_Q8_0 for Q4_0,
 * Q5_0, Q5_1 and Q8_0, ENG_GGML_TYPE_Q8_K for Q4_K, Q5_K and Q6_K; 0 (F32) for the others. */
uint32_t eng_quant_dot_type(uint32_t type);

/* ---------------------------------------------------------------------------------------------
 * Reference dequantization: n elements of a row of `type` at src -> dst[n] in F32, exactly as
 * ggml's dequantize_row_* (and gguf-py) compute them, bit for bit. eng_quant_row_to_f32 takes
 * any computed type (F32 copies, F16 and BF16 widen exactly).
 * ------------------------------------------------------------------------------------------- */

void eng_quant_row_to_f32(uint32_t type, const void *src, float *dst, size_t n);
void eng_dequant_q4_0(const eng_block_q4_0_t *src, float *dst, size_t n);
void eng_dequant_q5_0(const eng_block_q5_0_t *src, float *dst, size_t n);
void eng_dequant_q5_1(const eng_block_q5_1_t *src, float *dst, size_t n);
void eng_dequant_q8_0(const eng_block_q8_0_t *src, float *dst, size_t n);
void eng_dequant_q4_k(const eng_block_q4_k_t *src, float *dst, size_t n);
void eng_dequant_q5_k(const eng_block_q5_k_t *src, float *dst, size_t n);
void eng_dequant_q6_k(const eng_block_q6_k_t *src, float *dst, size_t n);
void eng_dequant_q8_k(const eng_block_q8_k_t *src, float *dst, size_t n);

/* Sub-block j's (0..7) 6-bit scale and min of a Q4_K / Q5_K block's packed scales[12]: for j < 4
 * the low 6 bits of scales[j] and scales[j + 4]; for j >= 4 the nibbles of scales[j + 4] with
 * the top two bits of scales[j - 4] (scale) and scales[j] (min) above them. */
static inline void eng_quant_k4_scale_min(const uint8_t *scales, int j, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = scales[j] & 63;
        *m = scales[j + 4] & 63;
    } else {
        *sc = (uint8_t)((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
        *m = (uint8_t)((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
    }
}

/* ---------------------------------------------------------------------------------------------
 * Activation quantization, byte for byte what llama.cpp's CPU backend computes on x86 (ggml-cpu's
 * quantize_row_q8_0 of arch/x86/quants.c, quantize_row_q8_K = quantize_row_q8_K_ref), so that
 * products over the same weights see the same rounded activations: x[n] -> dst blocks.
 *   Q8_0: per 32, d = amax / 127 stored as F16 (the product uses the F16 d), q = rint(x * id)
 *         with id = 127 / amax (0 for an all-zero block), rint rounding halves to even.
 *   Q8_K: per 256, max = the first element of largest magnitude (its sign kept), iscale =
 *         -127 / max, q = min(127, rint(iscale * x)) (never -128: a quant can be negated), d =
 *         1 / iscale, bsums filled; an all-zero block has d = 0 and zero quants.
 * (The weight quantizer's Q8_0, eng_quantize_row, is ggml's quantize_row_q8_0_ref instead: 1 / d
 * and halves away from zero, as llama-quantize writes.) x must be finite. The SIMD paths
 * (cpu_simd.h) give the same bytes.
 * ------------------------------------------------------------------------------------------- */

void eng_quant_act_q8_0(const float *x, eng_block_q8_0_t *dst, size_t n);
void eng_quant_act_q8_k(const float *x, eng_block_q8_k_t *dst, size_t n);

/* ---------------------------------------------------------------------------------------------
 * Reference dot products: a weight row w (n elements of the named type) with an activation row a
 * (n elements of its dot type), integer products per block as described at the top.
 * ------------------------------------------------------------------------------------------- */

float eng_vec_dot_q4_0_q8_0(const eng_block_q4_0_t *w, const eng_block_q8_0_t *a, size_t n);
float eng_vec_dot_q5_0_q8_0(const eng_block_q5_0_t *w, const eng_block_q8_0_t *a, size_t n);
float eng_vec_dot_q5_1_q8_0(const eng_block_q5_1_t *w, const eng_block_q8_0_t *a, size_t n);
float eng_vec_dot_q8_0_q8_0(const eng_block_q8_0_t *w, const eng_block_q8_0_t *a, size_t n);
float eng_vec_dot_q4_k_q8_k(const eng_block_q4_k_t *w, const eng_block_q8_k_t *a, size_t n);
float eng_vec_dot_q5_k_q8_k(const eng_block_q5_k_t *w, const eng_block_q8_k_t *a, size_t n);
float eng_vec_dot_q6_k_q8_k(const eng_block_q6_k_t *w, const eng_block_q8_k_t *a, size_t n);

/* Any quantized weight type: a is its eng_quant_dot_type blocks. */
float eng_quant_vec_dot(uint32_t type, const void *w, const void *a, size_t n);

/* ---------------------------------------------------------------------------------------------
 * Weight quantizers (kvgw's own, following the formats' definitions): x[n] -> dst. Each block's
 * scales are rounded up in F16 / 6 bits / int8 so that every element lies inside its sub-block's
 * representable range, then each element is rounded to the nearest level: the error of an
 * element is at most half its sub-block's step (Q4_0 and Q5_0: the step, for the one level their
 * signed range lacks; Q5_1's min is rounded down in F16 so that no element lies below it).
 * Returns 0, or PC_ERR_RANGE (dst unspecified) when an element is not finite or a scale does not
 * fit F16. Q8_0 is ggml's quantize_row_q8_0_ref.
 * ------------------------------------------------------------------------------------------- */

int eng_quantize_row(uint32_t type, const float *x, void *dst, size_t n);

/* The type of tensor `name` (GGUF naming: "blk.3.attn_v.weight", "output.weight") in a file of
 * the mix `mix` for a model of n_layer layers (tied: token_embd.weight is also the output head):
 * for ENG_QUANT_MIX_Q4_K_M, llama.cpp's Q4_K_M rule (llama_tensor_get_type): the output head
 * (output.weight, or token_embd.weight when tied) Q6_K; attn_v and ffn_down Q6_K in the first and
 * last eighth of the layers and every third layer between (use_more_bits), Q4_K elsewhere;
 * ENG_QUANT_MIX_Q5_K_M the same with Q5_K for Q4_K. For a plain weight type, that type. */
#define ENG_QUANT_MIX_Q4_K_M 0x10000u
#define ENG_QUANT_MIX_Q5_K_M 0x10001u
uint32_t eng_quant_mix_type(uint32_t mix, const char *name, uint32_t n_layer, bool tied);

/* eng_quant_mix_type for a tensor whose rows hold n_in elements, with llama.cpp's fallback for
 * rows that are not whole super-blocks of 256 (llama_tensor_get_type): Q4_K becomes Q5_0, Q5_K
 * Q5_1 and Q6_K Q8_0 (blocks of 32). So a small model of llama.cpp's shapes (FF 352, dim 128)
 * gets the very types llama-quantize gives it. */
uint32_t eng_quant_mix_tensor_type(uint32_t mix, const char *name, uint32_t n_layer, bool tied,
                                   uint64_t n_in);

#endif
