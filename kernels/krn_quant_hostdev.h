/*
 * krn_quant_hostdev.h — the block decoders of the quantized weight types (kernels.h, "Quantized
 * weights"), compiled both by the host C compiler and by nvcc for the device, so that the CUDA
 * kernels (krn_quant.cu) and their CPU references (kernels/ref/krn_ref_quant.c) decode with the
 * very same code, and the CPU unit tests check it against ggml's reference values.
 *
 * The unit of decoding is a group of 8 consecutive elements of a row (elements 8g .. 8g + 7):
 * 8 divides every block (32 or 256 elements) and every sub-block that shares a scale (16 or
 * 32), so a group needs one block's header and one scale. A warp of the GEMV kernel takes 32
 * consecutive groups: one K-quant super-block, or 8 Q4_0 / Q5_0 / Q5_1 / Q8_0 blocks, read
 * together.
 *
 * Bit exactness: each element is the F32 expression of ggml's dequantize_row_* (and gguf-py's
 * dequantize), operation by operation. Products and differences go through krn_q_mul and
 * krn_q_sub, which are __fmul_rn / __fsub_rn on the device (nvcc would otherwise fuse d * q - m
 * into one FMA, a different rounding); the host library is compiled with -ffp-contract=off for
 * the same reason (kernels/CMakeLists.txt).
 */
#ifndef KRN_QUANT_HOSTDEV_H
#define KRN_QUANT_HOSTDEV_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels.h"
#include "krn_hostdev.h" /* KRN_HD */

#ifdef __cplusplus
extern "C" {
#endif
/* The argument checks krn_ref_quant.c and krn_quant.cu share: 0 or PC_ERR_INVAL (kernels.h
 * lists the conditions). */
int krn__dequant_check(const krn_dequant_args_t *a);
int krn__qmatmul_check(const krn_qmatmul_args_t *a);
#ifdef __cplusplus
}
#endif

/* Block geometry (ggml's QK4_0, QK8_0, QK_K and sizeof of each block struct; KRN_QK8_0 and
 * KRN_Q8_0_BYTES are kernels.h's, shared with the q8_0 KV pool). */
#define KRN_QK4_0 32
#define KRN_QK_K 256
#define KRN_Q4_0_BYTES 18
#define KRN_Q5_0_BYTES 22
#define KRN_Q5_1_BYTES 24
#define KRN_Q4_K_BYTES 144
#define KRN_Q5_K_BYTES 176
#define KRN_Q6_K_BYTES 210

KRN_HD int32_t krn_q_block_elems(int32_t t)
{
    switch (t) {
    case KRN_QT_Q4_0:
    case KRN_QT_Q5_0:
    case KRN_QT_Q5_1:
        return KRN_QK4_0;
    case KRN_QT_Q8_0:
        return KRN_QK8_0;
    case KRN_QT_Q4_K:
    case KRN_QT_Q5_K:
    case KRN_QT_Q6_K:
        return KRN_QK_K;
    default:
        return 0;
    }
}

KRN_HD int32_t krn_q_block_bytes(int32_t t)
{
    switch (t) {
    case KRN_QT_Q4_0:
        return KRN_Q4_0_BYTES;
    case KRN_QT_Q5_0:
        return KRN_Q5_0_BYTES;
    case KRN_QT_Q5_1:
        return KRN_Q5_1_BYTES;
    case KRN_QT_Q8_0:
        return KRN_Q8_0_BYTES;
    case KRN_QT_Q4_K:
        return KRN_Q4_K_BYTES;
    case KRN_QT_Q5_K:
        return KRN_Q5_K_BYTES;
    case KRN_QT_Q6_K:
        return KRN_Q6_K_BYTES;
    default:
        return 0;
    }
}

/* The little-endian F16 at p, as F32 (exact). */
KRN_HD float krn_q_half(const uint8_t *p)
{
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(h));
#else
    return krn_f16_to_f32(h);
#endif
}

/* a * b and a - b, each rounded once (never fused). */
KRN_HD float krn_q_mul(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
KRN_HD float krn_q_sub(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block from its 12 scale bytes
 * (ggml's get_scale_min_k4): j < 4 in the low 6 bits of bytes j and j + 4; j >= 4 in the
 * nibbles of byte j + 4 with their high 2 bits in the top bits of bytes j - 4 and j. */
KRN_HD void krn_q_scale_min_k4(int32_t j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* v - bias as F32, exactly, for a small unsigned v and bias (both < 2^16): on the device one OR
 * and one full-rate add (the float 2^23 + v, less 2^23 + bias) instead of a quarter-rate
 * integer conversion. */
KRN_HD float krn_q_i2f(uint32_t v, uint32_t bias)
{
#ifdef __CUDA_ARCH__
    return __int_as_float((int)(0x4B000000u | v)) - (8388608.0f + (float)bias);
#else
    return (float)((int32_t)v - (int32_t)bias);
#endif
}

/*
 * Elements 8g .. 8g + 7 of a row of type t in affine form, for the GEMV: element i is
 * scale * q[i] - offset with q[i] the format's signed integer, exact in F32, so a dot product
 * with x is scale * sum(q x) - offset * sum(x): the scale (and the K-quants' min) applied once
 * per group instead of once per element.
 *   Q4_0  q = nibble - 8, scale d, offset 0
 *   Q5_0  q = nibble | qh bit << 4, - 16, scale d, offset 0
 *   Q5_1  q = nibble | qh bit << 4 (0..31), scale d, offset -m (d * q - (-m) is d * q + m,
 *         exactly: IEEE defines a - b as a + (-b))
 *   Q8_0  q = the int8 quant, scale d, offset 0
 *   Q4_K, Q5_K  q = 0..15 / 0..31, scale d * sc, offset dmin * m (krn_q_group8's d1, m1)
 *   Q6_K  q = 0..63 - 32, scale d * scales[e / 16] (krn_q_group8's ds), offset 0
 * krn_q_group8 is krn_q_sub(krn_q_mul(scale, q[i]), offset). An unknown t gives zeros.
 */
KRN_HD void krn_q_group8_affine(int32_t t, const uint8_t *row, int64_t g, float *q, float *scale,
                                float *offset)
{
    *scale = *offset = 0.0f; /* an unknown t: zeros (and gcc sees both always set) */
    switch (t) {
    case KRN_QT_Q4_0: {
        const uint8_t *b = row + (g / 4) * KRN_Q4_0_BYTES;
        const int32_t e0 = (int32_t)(g % 4) * 8, sh = e0 >= 16 ? 4 : 0;
        const uint8_t *qs = b + 2 + (e0 & 15);
        *scale = krn_q_half(b);
        *offset = 0.0f;
        for (int i = 0; i < 8; i++)
            q[i] = krn_q_i2f((uint32_t)(qs[i] >> sh) & 15, 8);
        break;
    }
    case KRN_QT_Q5_0:
    case KRN_QT_Q5_1: {
        const bool q51 = t == KRN_QT_Q5_1;
        const uint8_t *b = row + (g / 4) * (q51 ? KRN_Q5_1_BYTES : KRN_Q5_0_BYTES);
        const int32_t e0 = (int32_t)(g % 4) * 8, sh = e0 >= 16 ? 4 : 0, h0 = q51 ? 4 : 2;
        const uint32_t qh = (uint32_t)b[h0] | (uint32_t)b[h0 + 1] << 8 | (uint32_t)b[h0 + 2] << 16 |
                            (uint32_t)b[h0 + 3] << 24;
        const uint8_t *qs = b + h0 + 4 + (e0 & 15);
        *scale = krn_q_half(b);
        *offset = q51 ? -krn_q_half(b + 2) : 0.0f;
        for (int i = 0; i < 8; i++)
            q[i] = krn_q_i2f(((uint32_t)(qs[i] >> sh) & 15) | ((qh >> (e0 + i)) & 1) << 4,
                             q51 ? 0 : 16);
        break;
    }
    case KRN_QT_Q8_0: {
        const uint8_t *b = row + (g / 4) * KRN_Q8_0_BYTES;
        const uint8_t *qs = b + 2 + (g % 4) * 8;
        *scale = krn_q_half(b);
        *offset = 0.0f;
        for (int i = 0; i < 8; i++)
            q[i] = krn_q_i2f((uint32_t)(qs[i] ^ 0x80), 128); /* (int8 + 128) - 128 */
        break;
    }
    case KRN_QT_Q4_K:
    case KRN_QT_Q5_K: {
        const int32_t bytes = t == KRN_QT_Q4_K ? KRN_Q4_K_BYTES : KRN_Q5_K_BYTES;
        const uint8_t *b = row + (g / 32) * bytes;
        const int32_t e0 = (int32_t)(g % 32) * 8, s = e0 / 32, l0 = e0 % 32, sh = (s & 1) * 4;
        uint8_t sc, m;
        krn_q_scale_min_k4(s, b + 4, &sc, &m);
        *scale = krn_q_mul(krn_q_half(b), (float)sc);
        *offset = krn_q_mul(krn_q_half(b + 2), (float)m);
        const uint8_t *qh = b + 16 + l0;
        const uint8_t *qs = b + (t == KRN_QT_Q4_K ? 16 : 48) + 32 * (s / 2) + l0;
        for (int i = 0; i < 8; i++) {
            uint32_t v = (uint32_t)(qs[i] >> sh) & 15;
            if (t == KRN_QT_Q5_K)
                v |= ((uint32_t)(qh[i] >> s) & 1) << 4;
            q[i] = krn_q_i2f(v, 0);
        }
        break;
    }
    case KRN_QT_Q6_K: {
        const uint8_t *b = row + (g / 32) * KRN_Q6_K_BYTES;
        const int32_t e0 = (int32_t)(g % 32) * 8;
        const int32_t n = e0 / 128, k = (e0 % 128) / 32, l0 = e0 % 32;
        const uint8_t *ql = b + n * 64 + (k & 1) * 32 + l0;
        const uint8_t *qh = b + 128 + n * 32 + l0;
        *scale = krn_q_mul(krn_q_half(b + 208), (float)(int8_t)b[192 + e0 / 16]);
        *offset = 0.0f;
        const int32_t lsh = k >= 2 ? 4 : 0, hsh = 2 * k;
        for (int i = 0; i < 8; i++)
            q[i] = krn_q_i2f(
                ((uint32_t)(ql[i] >> lsh) & 15) | (((uint32_t)(qh[i] >> hsh) & 3) << 4), 32);
        break;
    }
    default:
        for (int i = 0; i < 8; i++)
            q[i] = 0.0f;
        break;
    }
}

/* Elements 8g .. 8g + 7 of a row of type t (row: its first block; g < n_in / 8) into out[8],
 * ggml's values bit for bit: scale * q - offset of the affine form, the very F32 operations of
 * dequantize_row_* (d * q for Q4_0, Q5_0 and Q8_0, d * q + m for Q5_1, d1 * q - m1 for the
 * K-quants' mins, (d * sc) * q for Q6_K; x - 0 is x, -0 included). t must be a krn_qtype (callers
 * check; an unknown one gives zeros). A kernel instantiated for one type passes a constant, and the
 * switch folds away. */
KRN_HD void krn_q_group8(int32_t t, const uint8_t *row, int64_t g, float *out)
{
    float q[8], scale, offset;
    krn_q_group8_affine(t, row, g, q, &scale, &offset);
    for (int i = 0; i < 8; i++)
        out[i] = krn_q_sub(krn_q_mul(scale, q[i]), offset);
}

/* One group's contribution to a GEMV row: acc + scale * sum(q x) - offset * sum(x) over the 8
 * elements (krn_q_group8_affine's q, scale, offset; x the activations as F32), F32 with FMAs.
 * The kernel and the host emulation in the unit tests run this very code. */
KRN_HD float krn_q_dot8(int32_t t, const float *q, float scale, float offset, const float *x,
                        float acc)
{
    /* The only types with an offset. */
    const bool mins = t == KRN_QT_Q4_K || t == KRN_QT_Q5_K || t == KRN_QT_Q5_1;
    float sq = 0.0f, sx = 0.0f;
    for (int k = 0; k < 8; k++) {
        sq = fmaf(q[k], x[k], sq);
        if (mins)
            sx += x[k];
    }
    acc = fmaf(scale, sq, acc);
    return mins ? fmaf(-offset, sx, acc) : acc;
}

#endif
