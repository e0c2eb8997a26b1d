/*
 * quant.c — the type table and the reference (portable) arithmetic of the quantized formats
 * (quant.h says the layouts and the contract).
 *
 * The dequantizers reproduce ggml's dequantize_row_* expression by expression (the same float
 * operations in the same order), so their results are bit-identical to ggml's and gguf-py's; the
 * file is compiled with -ffp-contract=off (CMakeLists.txt) so that no multiply and add are fused
 * behind our back.
 */
#include "quant.h"

#include "common.h"
#include "cpu_simd.h" /* eng__port_f16_to_f32, eng__port_bf16_to_f32 */
#include "half.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Type table
 * ------------------------------------------------------------------------------------------- */

typedef struct type_info {
    const char *name;
    uint32_t block_size;
    uint32_t block_bytes;
} type_info_t;

/* ggml's type traits (ggml.c type_traits[]): elements per block and bytes per block. The types
 * quant.h defines take their sizes from its structs. */
static const type_info_t types[ENG_GGML_TYPE_COUNT] = {
    [ENG_GGML_TYPE_F32] = {"F32", 1, 4},
    [ENG_GGML_TYPE_F16] = {"F16", 1, 2},
    [ENG_GGML_TYPE_Q4_0] = {"Q4_0", ENG_QK4_0, sizeof(eng_block_q4_0_t)},
    [ENG_GGML_TYPE_Q4_1] = {"Q4_1", 32, 20},
    [ENG_GGML_TYPE_Q5_0] = {"Q5_0", ENG_QK4_0, sizeof(eng_block_q5_0_t)},
    [ENG_GGML_TYPE_Q5_1] = {"Q5_1", ENG_QK4_0, sizeof(eng_block_q5_1_t)},
    [ENG_GGML_TYPE_Q8_0] = {"Q8_0", ENG_QK8_0, sizeof(eng_block_q8_0_t)},
    [ENG_GGML_TYPE_Q8_1] = {"Q8_1", 32, 36},
    [ENG_GGML_TYPE_Q2_K] = {"Q2_K", 256, 84},
    [ENG_GGML_TYPE_Q3_K] = {"Q3_K", 256, 110},
    [ENG_GGML_TYPE_Q4_K] = {"Q4_K", ENG_QK_K, sizeof(eng_block_q4_k_t)},
    [ENG_GGML_TYPE_Q5_K] = {"Q5_K", ENG_QK_K, sizeof(eng_block_q5_k_t)},
    [ENG_GGML_TYPE_Q6_K] = {"Q6_K", ENG_QK_K, sizeof(eng_block_q6_k_t)},
    [ENG_GGML_TYPE_Q8_K] = {"Q8_K", ENG_QK_K, sizeof(eng_block_q8_k_t)},
    [ENG_GGML_TYPE_IQ2_XXS] = {"IQ2_XXS", 256, 66},
    [ENG_GGML_TYPE_IQ2_XS] = {"IQ2_XS", 256, 74},
    [ENG_GGML_TYPE_IQ3_XXS] = {"IQ3_XXS", 256, 98},
    [ENG_GGML_TYPE_IQ1_S] = {"IQ1_S", 256, 50},
    [ENG_GGML_TYPE_IQ4_NL] = {"IQ4_NL", 32, 18},
    [ENG_GGML_TYPE_IQ3_S] = {"IQ3_S", 256, 110},
    [ENG_GGML_TYPE_IQ2_S] = {"IQ2_S", 256, 82},
    [ENG_GGML_TYPE_IQ4_XS] = {"IQ4_XS", 256, 136},
    [ENG_GGML_TYPE_I8] = {"I8", 1, 1},
    [ENG_GGML_TYPE_I16] = {"I16", 1, 2},
    [ENG_GGML_TYPE_I32] = {"I32", 1, 4},
    [ENG_GGML_TYPE_I64] = {"I64", 1, 8},
    [ENG_GGML_TYPE_F64] = {"F64", 1, 8},
    [ENG_GGML_TYPE_IQ1_M] = {"IQ1_M", 256, 56},
    [ENG_GGML_TYPE_BF16] = {"BF16", 1, 2},
    [ENG_GGML_TYPE_TQ1_0] = {"TQ1_0", 256, 54},
    [ENG_GGML_TYPE_TQ2_0] = {"TQ2_0", 256, 66},
    [ENG_GGML_TYPE_MXFP4] = {"MXFP4", 32, 17},
};

const char *eng_ggml_type_name(uint32_t type)
{
    return type < ENG_GGML_TYPE_COUNT ? types[type].name : NULL;
}

uint32_t eng_ggml_type_block_size(uint32_t type)
{
    return type < ENG_GGML_TYPE_COUNT ? types[type].block_size : 0;
}

uint32_t eng_ggml_type_block_bytes(uint32_t type)
{
    return type < ENG_GGML_TYPE_COUNT ? types[type].block_bytes : 0;
}

bool eng_ggml_type_supported(uint32_t type)
{
    return eng_quant_type_computed(type);
}

size_t eng_quant_row_bytes(uint32_t type, uint64_t n)
{
    if (type >= ENG_GGML_TYPE_COUNT || types[type].block_size == 0)
        return 0;
    return (size_t)(n / types[type].block_size) * types[type].block_bytes;
}

bool eng_quant_type_is_quant(uint32_t type)
{
    return type == ENG_GGML_TYPE_Q8_0 || type == ENG_GGML_TYPE_Q4_0 || type == ENG_GGML_TYPE_Q5_0 ||
           type == ENG_GGML_TYPE_Q5_1 || type == ENG_GGML_TYPE_Q4_K || type == ENG_GGML_TYPE_Q5_K ||
           type == ENG_GGML_TYPE_Q6_K;
}

bool eng_quant_type_computed(uint32_t type)
{
    return type == ENG_GGML_TYPE_F32 || type == ENG_GGML_TYPE_F16 || type == ENG_GGML_TYPE_BF16 ||
           eng_quant_type_is_quant(type);
}

uint32_t eng_quant_dot_type(uint32_t type)
{
    switch (type) {
    case ENG_GGML_TYPE_Q4_0:
    case ENG_GGML_TYPE_Q5_0:
    case ENG_GGML_TYPE_Q5_1:
    case ENG_GGML_TYPE_Q8_0:
        return ENG_GGML_TYPE_Q8_0;
    case ENG_GGML_TYPE_Q4_K:
    case ENG_GGML_TYPE_Q5_K:
    case ENG_GGML_TYPE_Q6_K:
        return ENG_GGML_TYPE_Q8_K;
    default:
        return ENG_GGML_TYPE_F32;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Dequantization (ggml's dequantize_row_*)
 * ------------------------------------------------------------------------------------------- */

void eng_dequant_q4_0(const eng_block_q4_0_t *src, float *dst, size_t n)
{
    PC_ASSERT(n % ENG_QK4_0 == 0);
    for (size_t b = 0; b < n / ENG_QK4_0; b++, dst += ENG_QK4_0) {
        float d = eng_f16_to_f32(src[b].d);
        for (int j = 0; j < ENG_QK4_0 / 2; j++) {
            dst[j] = (float)((src[b].qs[j] & 0xF) - 8) * d;
            dst[j + ENG_QK4_0 / 2] = (float)((src[b].qs[j] >> 4) - 8) * d;
        }
    }
}

/* Q5_0 / Q5_1's 5-bit level of element j < 16 (hi: element j + 16) from a block's qh and qs. */
static inline int q5_level(const uint8_t qh4[4], const uint8_t *qs, int j, bool hi)
{
    uint32_t qh;
    memcpy(&qh, qh4, sizeof qh);
    return hi ? (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)
              : (qs[j] & 0xF) | (((qh >> j) << 4) & 0x10);
}

void eng_dequant_q5_0(const eng_block_q5_0_t *src, float *dst, size_t n)
{
    PC_ASSERT(n % ENG_QK4_0 == 0);
    for (size_t b = 0; b < n / ENG_QK4_0; b++, dst += ENG_QK4_0) {
        float d = eng_f16_to_f32(src[b].d);
        for (int j = 0; j < ENG_QK4_0 / 2; j++) {
            dst[j] = (float)(q5_level(src[b].qh, src[b].qs, j, false) - 16) * d;
            dst[j + ENG_QK4_0 / 2] = (float)(q5_level(src[b].qh, src[b].qs, j, true) - 16) * d;
        }
    }
}

void eng_dequant_q5_1(const eng_block_q5_1_t *src, float *dst, size_t n)
{
    PC_ASSERT(n % ENG_QK4_0 == 0);
    for (size_t b = 0; b < n / ENG_QK4_0; b++, dst += ENG_QK4_0) {
        float d = eng_f16_to_f32(src[b].d), m = eng_f16_to_f32(src[b].m);
        for (int j = 0; j < ENG_QK4_0 / 2; j++) {
            dst[j] = (float)q5_level(src[b].qh, src[b].qs, j, false) * d + m;
            dst[j + ENG_QK4_0 / 2] = (float)q5_level(src[b].qh, src[b].qs, j, true) * d + m;
        }
    }
}

void eng_dequant_q8_0(const eng_block_q8_0_t *src, float *dst, size_t n)
{
    PC_ASSERT(n % ENG_QK8_0 == 0);
    for (size_t b = 0; b < n / ENG_QK8_0; b++, dst += ENG_QK8_0) {
        float d = eng_f16_to_f32(src[b].d);
        for (int j = 0; j < ENG_QK8_0; j++)
            dst[j] = (float)src[b].qs[j] * d;
    }
}

/* One Q4_K or Q5_K super-block (qh NULL for Q4_K: no fifth bits) into dst[256], ggml's
 * dequantize_row_q4_K / _q5_K arithmetic. */
static void dequant_k45(uint16_t d16, uint16_t dmin16, const uint8_t *scales, const uint8_t *ql,
                        const uint8_t *qh, float *dst)
{
    float d = eng_f16_to_f32(d16), dmin = eng_f16_to_f32(dmin16);
    unsigned u1 = 1, u2 = 2;
    for (int j = 0; j < 8; j += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
        uint8_t sc, m;
        eng_quant_k4_scale_min(scales, j, &sc, &m);
        float d1 = d * sc, m1 = dmin * m;
        eng_quant_k4_scale_min(scales, j + 1, &sc, &m);
        float d2 = d * sc, m2 = dmin * m;
        for (int l = 0; l < 32; l++)
            *dst++ = d1 * (float)((ql[l] & 0xF) + (qh != NULL && (qh[l] & u1) ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++)
            *dst++ = d2 * (float)((ql[l] >> 4) + (qh != NULL && (qh[l] & u2) ? 16 : 0)) - m2;
    }
}

void eng_dequant_q4_k(const eng_block_q4_k_t *src, float *dst, size_t n)
{
    PC_ASSERT(n % ENG_QK_K == 0);
    for (size_t b = 0; b < n / ENG_QK_K; b++, dst += ENG_QK_K)
        dequant_k45(src[b].d, src[b].dmin, src[b].scales, src[b].qs, NULL, dst);
}

void eng_dequant_q5_k(const eng_block_q5_k_t *src, float *dst, size_t n)
{
    PC_ASSERT(n % ENG_QK_K == 0);
    for (size_t b = 0; b < n / ENG_QK_K; b++, dst += ENG_QK_K)
        dequant_k45(src[b].d, src[b].dmin, src[b].scales, src[b].qs, src[b].qh, dst);
}

void eng_dequant_q6_k(const eng_block_q6_k_t *src, float *dst, size_t n)
{
    PC_ASSERT(n % ENG_QK_K == 0);
    for (size_t b = 0; b < n / ENG_QK_K; b++) {
        const eng_block_q6_k_t *x = &src[b];
        float d = eng_f16_to_f32(x->d);
        const uint8_t *ql = x->ql, *qh = x->qh;
        const int8_t *sc = x->scales;
        for (int half = 0; half < 2; half++, dst += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                dst[l] = d * sc[is + 0] * (float)q1;
                dst[l + 32] = d * sc[is + 2] * (float)q2;
                dst[l + 64] = d * sc[is + 4] * (float)q3;
                dst[l + 96] = d * sc[is + 6] * (float)q4;
            }
        }
    }
}

void eng_dequant_q8_k(const eng_block_q8_k_t *src, float *dst, size_t n)
{
    PC_ASSERT(n % ENG_QK_K == 0);
    for (size_t b = 0; b < n / ENG_QK_K; b++, dst += ENG_QK_K)
        for (int j = 0; j < ENG_QK_K; j++)
            dst[j] = src[b].d * (float)src[b].qs[j];
}

void eng_quant_row_to_f32(uint32_t type, const void *src, float *dst, size_t n)
{
    switch (type) {
    case ENG_GGML_TYPE_F32:
        memcpy(dst, src, n * sizeof(float));
        break;
    case ENG_GGML_TYPE_F16:
        eng__port_f16_to_f32(src, dst, n);
        break;
    case ENG_GGML_TYPE_BF16:
        eng__port_bf16_to_f32(src, dst, n);
        break;
    case ENG_GGML_TYPE_Q8_0:
        eng_dequant_q8_0(src, dst, n);
        break;
    case ENG_GGML_TYPE_Q4_0:
        eng_dequant_q4_0(src, dst, n);
        break;
    case ENG_GGML_TYPE_Q5_0:
        eng_dequant_q5_0(src, dst, n);
        break;
    case ENG_GGML_TYPE_Q5_1:
        eng_dequant_q5_1(src, dst, n);
        break;
    case ENG_GGML_TYPE_Q4_K:
        eng_dequant_q4_k(src, dst, n);
        break;
    case ENG_GGML_TYPE_Q5_K:
        eng_dequant_q5_k(src, dst, n);
        break;
    case ENG_GGML_TYPE_Q6_K:
        eng_dequant_q6_k(src, dst, n);
        break;
    default:
        PC_ASSERT(!"eng_quant_row_to_f32: type not computed");
    }
}

/* ---------------------------------------------------------------------------------------------
 * Activation quantization
 * ------------------------------------------------------------------------------------------- */

void eng_quant_act_q8_0(const float *x, eng_block_q8_0_t *dst, size_t n)
{
    PC_ASSERT(n % ENG_QK8_0 == 0);
    for (size_t b = 0; b < n / ENG_QK8_0; b++, x += ENG_QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < ENG_QK8_0; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        dst[b].d = eng_f32_to_f16(amax / 127.0f);
        for (int j = 0; j < ENG_QK8_0; j++)
            dst[b].qs[j] = (int8_t)lrintf(x[j] * id);
    }
}

void eng_quant_act_q8_k(const float *x, eng_block_q8_k_t *dst, size_t n)
{
    PC_ASSERT(n % ENG_QK_K == 0);
    for (size_t b = 0; b < n / ENG_QK_K; b++, x += ENG_QK_K) {
        eng_block_q8_k_t *y = &dst[b];
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < ENG_QK_K; j++) {
            float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (amax == 0.0f) {
            memset(y, 0, sizeof *y);
            continue;
        }
        float iscale = -127.0f / max;
        for (int j = 0; j < ENG_QK_K; j++) {
            int v = (int)lrintf(iscale * x[j]);
            y->qs[j] = (int8_t)(v > 127 ? 127 : v);
        }
        for (int j = 0; j < ENG_QK_K / 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++)
                s += y->qs[16 * j + l];
            y->bsums[j] = (int16_t)s;
        }
        y->d = 1.0f / iscale;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Dot products: int32 sums per block, scaled and accumulated in float in block order
 * ------------------------------------------------------------------------------------------- */

float eng_vec_dot_q4_0_q8_0(const eng_block_q4_0_t *w, const eng_block_q8_0_t *a, size_t n)
{
    PC_ASSERT(n % ENG_QK4_0 == 0);
    float sum = 0.0f;
    for (size_t b = 0; b < n / ENG_QK4_0; b++) {
        int32_t s = 0;
        for (int j = 0; j < ENG_QK4_0 / 2; j++) {
            s += ((w[b].qs[j] & 0xF) - 8) * a[b].qs[j];
            s += ((w[b].qs[j] >> 4) - 8) * a[b].qs[j + ENG_QK4_0 / 2];
        }
        sum += (float)s * (eng_f16_to_f32(w[b].d) * eng_f16_to_f32(a[b].d));
    }
    return sum;
}

float eng_vec_dot_q5_0_q8_0(const eng_block_q5_0_t *w, const eng_block_q8_0_t *a, size_t n)
{
    PC_ASSERT(n % ENG_QK4_0 == 0);
    float sum = 0.0f;
    for (size_t b = 0; b < n / ENG_QK4_0; b++) {
        int32_t s = 0;
        for (int j = 0; j < ENG_QK4_0 / 2; j++) {
            s += (q5_level(w[b].qh, w[b].qs, j, false) - 16) * a[b].qs[j];
            s += (q5_level(w[b].qh, w[b].qs, j, true) - 16) * a[b].qs[j + ENG_QK4_0 / 2];
        }
        sum += (float)s * (eng_f16_to_f32(w[b].d) * eng_f16_to_f32(a[b].d));
    }
    return sum;
}

/* d_w d_a <q_w, q_a> + m_w d_a sum(q_a) per block (ggml takes the second term's d_a sum(q_a)
 * from Q8_1's precomputed s; here it is summed beside the product). */
float eng_vec_dot_q5_1_q8_0(const eng_block_q5_1_t *w, const eng_block_q8_0_t *a, size_t n)
{
    PC_ASSERT(n % ENG_QK4_0 == 0);
    float sum = 0.0f;
    for (size_t b = 0; b < n / ENG_QK4_0; b++) {
        int32_t s = 0, sa = 0;
        for (int j = 0; j < ENG_QK4_0 / 2; j++) {
            s += q5_level(w[b].qh, w[b].qs, j, false) * a[b].qs[j];
            s += q5_level(w[b].qh, w[b].qs, j, true) * a[b].qs[j + ENG_QK4_0 / 2];
            sa += a[b].qs[j] + a[b].qs[j + ENG_QK4_0 / 2];
        }
        float da = eng_f16_to_f32(a[b].d);
        sum += (float)s * (eng_f16_to_f32(w[b].d) * da) + eng_f16_to_f32(w[b].m) * (da * (float)sa);
    }
    return sum;
}

float eng_vec_dot_q8_0_q8_0(const eng_block_q8_0_t *w, const eng_block_q8_0_t *a, size_t n)
{
    PC_ASSERT(n % ENG_QK8_0 == 0);
    float sum = 0.0f;
    for (size_t b = 0; b < n / ENG_QK8_0; b++) {
        int32_t s = 0;
        for (int j = 0; j < ENG_QK8_0; j++)
            s += w[b].qs[j] * a[b].qs[j];
        sum += (float)s * (eng_f16_to_f32(w[b].d) * eng_f16_to_f32(a[b].d));
    }
    return sum;
}

/* The K-quants: sum_j sc_j * <q_w, q_a>_j in int32 (scaled levels), the mins through the
 * activation's bsums, then d * d_a * sumi - dmin * d_a * summ per super-block. */
/* One Q4_K or Q5_K super-block (qh NULL for Q4_K) against its Q8_K activation block. */
static float dot_k45(uint16_t d, uint16_t dmin, const uint8_t *scales, const uint8_t *q4,
                     const uint8_t *qh, const eng_block_q8_k_t *a)
{
    const int8_t *q8 = a->qs;
    int32_t sumi = 0, summ = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        eng_quant_k4_scale_min(scales, j, &sc, &m);
        const uint8_t *q = q4 + 32 * (j / 2);
        int shift = 4 * (j & 1);
        int32_t s = 0;
        for (int l = 0; l < 32; l++) {
            int v = ((q[l] >> shift) & 0xF) | (qh != NULL ? ((qh[l] >> j) & 1) << 4 : 0);
            s += v * q8[32 * j + l];
        }
        sumi += sc * s;
        summ += m * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
    }
    float da = a->d;
    return eng_f16_to_f32(d) * da * (float)sumi - eng_f16_to_f32(dmin) * da * (float)summ;
}

float eng_vec_dot_q4_k_q8_k(const eng_block_q4_k_t *w, const eng_block_q8_k_t *a, size_t n)
{
    PC_ASSERT(n % ENG_QK_K == 0);
    float sum = 0.0f;
    for (size_t b = 0; b < n / ENG_QK_K; b++)
        sum += dot_k45(w[b].d, w[b].dmin, w[b].scales, w[b].qs, NULL, &a[b]);
    return sum;
}

float eng_vec_dot_q5_k_q8_k(const eng_block_q5_k_t *w, const eng_block_q8_k_t *a, size_t n)
{
    PC_ASSERT(n % ENG_QK_K == 0);
    float sum = 0.0f;
    for (size_t b = 0; b < n / ENG_QK_K; b++)
        sum += dot_k45(w[b].d, w[b].dmin, w[b].scales, w[b].qs, w[b].qh, &a[b]);
    return sum;
}

float eng_vec_dot_q6_k_q8_k(const eng_block_q6_k_t *w, const eng_block_q8_k_t *a, size_t n)
{
    PC_ASSERT(n % ENG_QK_K == 0);
    float sum = 0.0f;
    for (size_t b = 0; b < n / ENG_QK_K; b++) {
        const eng_block_q6_k_t *x = &w[b];
        int32_t sumi = 0;
        for (int e0 = 0; e0 < ENG_QK_K; e0 += 16) {
            /* Element e = 128 h + 32 s + l (l < 32) of sub-block e / 16. */
            int h = e0 / 128, s = (e0 % 128) / 32;
            const uint8_t *ql = x->ql + 64 * h + 32 * (s & 1), *qh = x->qh + 32 * h;
            int32_t t = 0;
            for (int i = 0; i < 16; i++) {
                int l = e0 % 32 + i;
                int q =
                    (int)(((ql[l] >> (4 * (s >> 1))) & 0xF) | (((qh[l] >> (2 * s)) & 3) << 4)) - 32;
                t += q * a[b].qs[e0 + i];
            }
            sumi += x->scales[e0 / 16] * t;
        }
        sum += eng_f16_to_f32(x->d) * a[b].d * (float)sumi;
    }
    return sum;
}

float eng_quant_vec_dot(uint32_t type, const void *w, const void *a, size_t n)
{
    switch (type) {
    case ENG_GGML_TYPE_Q4_0:
        return eng_vec_dot_q4_0_q8_0(w, a, n);
    case ENG_GGML_TYPE_Q5_0:
        return eng_vec_dot_q5_0_q8_0(w, a, n);
    case ENG_GGML_TYPE_Q5_1:
        return eng_vec_dot_q5_1_q8_0(w, a, n);
    case ENG_GGML_TYPE_Q8_0:
        return eng_vec_dot_q8_0_q8_0(w, a, n);
    case ENG_GGML_TYPE_Q4_K:
        return eng_vec_dot_q4_k_q8_k(w, a, n);
    case ENG_GGML_TYPE_Q5_K:
        return eng_vec_dot_q5_k_q8_k(w, a, n);
    case ENG_GGML_TYPE_Q6_K:
        return eng_vec_dot_q6_k_q8_k(w, a, n);
    default:
        PC_ASSERT(!"eng_quant_vec_dot: not a quantized type");
        return 0.0f;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Weight quantizers
 * ------------------------------------------------------------------------------------------- */

/* The F16 nearest to v >= 0 that is not below it (so a scale never shrinks a range); returns
 * false when v does not fit. */
static bool f16_up(float v, uint16_t *out, float *back)
{
    uint16_t h = eng_f32_to_f16(v);
    if (eng_f16_to_f32(h) < v)
        h++;
    float f = eng_f16_to_f32(h);
    if (!isfinite(f))
        return false;
    *out = h;
    *back = f;
    return true;
}

static bool all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return false;
    return true;
}

static int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* Q4_0: d = max / -8 (max the element of largest magnitude, sign kept; rounded away from zero in
 * F16), q = round(x / d) + 8 clamped to 15: every element but those at -max is within d / 2. */
static int quantize_q4_0(const float *x, eng_block_q4_0_t *y, size_t n)
{
    for (size_t b = 0; b < n / ENG_QK4_0; b++, x += ENG_QK4_0) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < ENG_QK4_0; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        uint16_t dh;
        float d;
        if (!f16_up(amax / 8.0f, &dh, &d))
            return PC_ERR_RANGE;
        if (max > 0.0f) {
            dh |= 0x8000; /* d negative: max maps to level -8 */
            d = -d;
        }
        y[b].d = dh;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < ENG_QK4_0 / 2; j++) {
            int q0 = clampi((int)lrintf(x[j] * id) + 8, 0, 15);
            int q1 = clampi((int)lrintf(x[j + ENG_QK4_0 / 2] * id) + 8, 0, 15);
            y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
    return 0;
}

/* Q5_0 / Q5_1's packing of 32 levels (0..31) into qh and qs. */
static void q5_pack(const int q[ENG_QK4_0], uint8_t qh4[4], uint8_t *qs)
{
    uint32_t qh = 0;
    for (int j = 0; j < ENG_QK4_0 / 2; j++) {
        qs[j] = (uint8_t)((q[j] & 0xF) | ((q[j + ENG_QK4_0 / 2] & 0xF) << 4));
        qh |= (uint32_t)(q[j] >> 4) << j;
        qh |= (uint32_t)(q[j + ENG_QK4_0 / 2] >> 4) << (j + ENG_QK4_0 / 2);
    }
    memcpy(qh4, &qh, sizeof qh);
}

/* As Q4_0, with 32 levels: d = amax / 16 rounded up, negative when the largest magnitude is
 * positive (it maps to level -16). */
static int quantize_q5_0(const float *x, eng_block_q5_0_t *y, size_t n)
{
    for (size_t b = 0; b < n / ENG_QK4_0; b++, x += ENG_QK4_0) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < ENG_QK4_0; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        uint16_t dh;
        float d;
        if (!f16_up(amax / 16.0f, &dh, &d))
            return PC_ERR_RANGE;
        if (max > 0.0f) {
            dh |= 0x8000;
            d = -d;
        }
        y[b].d = dh;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[ENG_QK4_0];
        for (int j = 0; j < ENG_QK4_0; j++)
            q[j] = clampi((int)lrintf(x[j] * id) + 16, 0, 31);
        q5_pack(q, y[b].qh, y[b].qs);
    }
    return 0;
}

/* The F16 nearest to v that is not above it (so a min never rises above the block's minimum). */
static bool f16_down(float v, uint16_t *out, float *back)
{
    uint16_t h = eng_f32_to_f16(v);
    if (eng_f16_to_f32(h) > v)
        h = (h & 0x8000) ? (uint16_t)(h + 1) : (uint16_t)(h - 1);
    float f = eng_f16_to_f32(h);
    if (!isfinite(f))
        return false;
    *out = h;
    *back = f;
    return true;
}

/* m = the block's minimum rounded down in F16, d = (max - m) / 31 rounded up; levels to nearest.
 */
static int quantize_q5_1(const float *x, eng_block_q5_1_t *y, size_t n)
{
    for (size_t b = 0; b < n / ENG_QK4_0; b++, x += ENG_QK4_0) {
        float mn = x[0], mx = x[0];
        for (int j = 1; j < ENG_QK4_0; j++) {
            mn = fminf(mn, x[j]);
            mx = fmaxf(mx, x[j]);
        }
        float m, d;
        if (!f16_down(mn, &y[b].m, &m) || !f16_up((mx - m) / 31.0f, &y[b].d, &d))
            return PC_ERR_RANGE;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[ENG_QK4_0];
        for (int j = 0; j < ENG_QK4_0; j++)
            q[j] = clampi((int)lrintf((x[j] - m) * id), 0, 31);
        q5_pack(q, y[b].qh, y[b].qs);
    }
    return 0;
}

/* The K-quants' sub-block ranges: for each of n_sub sub-blocks of `len` elements, its minimum
 * clamped to at most 0 (the format subtracts mins) and its maximum clamped to at least 0. */
static void sub_ranges(const float *x, int n_sub, int len, float *lo, float *hi)
{
    for (int j = 0; j < n_sub; j++) {
        float mn = 0.0f, mx = 0.0f;
        for (int l = 0; l < len; l++) {
            mn = fminf(mn, x[j * len + l]);
            mx = fmaxf(mx, x[j * len + l]);
        }
        lo[j] = mn;
        hi[j] = mx;
    }
}

/* Packs 6-bit scales and mins of 8 sub-blocks into Q4_K's scales[12] (the inverse of
 * eng_quant_k4_scale_min). */
static void pack_k4_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t out[12])
{
    for (int j = 0; j < 4; j++) {
        out[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        out[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        out[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
    }
}

/* One Q4_K / Q5_K super-block with `levels` - 1 as the top quant (15 or 31): the mins rounded up
 * first (dmin and each m), then each sub-block's span from its stored min to its max gives the
 * scale, rounded up the same way. Writes d, dmin, the packed scales and q[256] (the levels). */
static int quantize_k_superblock(const float *x, int top, uint16_t *dh, uint16_t *dminh,
                                 uint8_t scales[12], uint8_t q[ENG_QK_K])
{
    float lo[8], hi[8], span[8];
    sub_ranges(x, 8, 32, lo, hi);
    float mmax = 0.0f;
    for (int j = 0; j < 8; j++)
        mmax = fmaxf(mmax, -lo[j]);
    float dmin, d;
    if (!f16_up(mmax / 63.0f, dminh, &dmin))
        return PC_ERR_RANGE;
    uint8_t sc[8], m[8];
    float smax = 0.0f;
    for (int j = 0; j < 8; j++) {
        m[j] = dmin != 0.0f ? (uint8_t)clampi((int)ceilf(-lo[j] / dmin), 0, 63) : 0;
        span[j] = hi[j] + dmin * m[j];
        smax = fmaxf(smax, span[j]);
    }
    if (!f16_up(smax / (63.0f * (float)top), dh, &d))
        return PC_ERR_RANGE;
    for (int j = 0; j < 8; j++) {
        sc[j] = d != 0.0f ? (uint8_t)clampi((int)ceilf(span[j] / ((float)top * d)), 0, 63) : 0;
        float step = d * sc[j], off = dmin * m[j];
        float istep = step != 0.0f ? 1.0f / step : 0.0f;
        for (int l = 0; l < 32; l++)
            q[32 * j + l] = (uint8_t)clampi((int)lrintf((x[32 * j + l] + off) * istep), 0, top);
    }
    pack_k4_scales(sc, m, scales);
    return 0;
}

static int quantize_q4_k(const float *x, eng_block_q4_k_t *y, size_t n)
{
    for (size_t b = 0; b < n / ENG_QK_K; b++, x += ENG_QK_K) {
        uint8_t q[ENG_QK_K];
        int rc = quantize_k_superblock(x, 15, &y[b].d, &y[b].dmin, y[b].scales, q);
        if (rc != 0)
            return rc;
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                y[b].qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    }
    return 0;
}

static int quantize_q5_k(const float *x, eng_block_q5_k_t *y, size_t n)
{
    for (size_t b = 0; b < n / ENG_QK_K; b++, x += ENG_QK_K) {
        uint8_t q[ENG_QK_K];
        int rc = quantize_k_superblock(x, 31, &y[b].d, &y[b].dmin, y[b].scales, q);
        if (rc != 0)
            return rc;
        memset(y[b].qh, 0, sizeof y[b].qh);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
                y[b].qs[32 * c + l] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
                y[b].qh[l] |= (uint8_t)(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
            }
    }
    return 0;
}

/* Q6_K: symmetric sub-blocks of 16; a sub-block's step s_j = amax_j / 31 (levels -31..31 of the
 * format's -32..31), the int8 scales sc_j = ceil(s_j / d) with d = max s_j / 127 rounded up. */
static int quantize_q6_k(const float *x, eng_block_q6_k_t *y, size_t n)
{
    for (size_t b = 0; b < n / ENG_QK_K; b++, x += ENG_QK_K) {
        float s[16], smax = 0.0f, d;
        for (int j = 0; j < 16; j++) {
            float amax = 0.0f;
            for (int l = 0; l < 16; l++)
                amax = fmaxf(amax, fabsf(x[16 * j + l]));
            s[j] = amax / 31.0f;
            smax = fmaxf(smax, s[j]);
        }
        if (!f16_up(smax / 127.0f, &y[b].d, &d))
            return PC_ERR_RANGE;
        uint8_t q[ENG_QK_K];
        for (int j = 0; j < 16; j++) {
            int sc = d != 0.0f ? clampi((int)ceilf(s[j] / d), 0, 127) : 0;
            y[b].scales[j] = (int8_t)sc;
            float step = d * (float)sc, istep = step != 0.0f ? 1.0f / step : 0.0f;
            for (int l = 0; l < 16; l++)
                q[16 * j + l] = (uint8_t)(clampi((int)lrintf(x[16 * j + l] * istep), -32, 31) + 32);
        }
        memset(y[b].qh, 0, sizeof y[b].qh);
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *qq = q + 128 * h;
                y[b].ql[64 * h + l] = (uint8_t)((qq[l] & 0xF) | ((qq[l + 64] & 0xF) << 4));
                y[b].ql[64 * h + l + 32] =
                    (uint8_t)((qq[l + 32] & 0xF) | ((qq[l + 96] & 0xF) << 4));
                y[b].qh[32 * h + l] =
                    (uint8_t)((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) | ((qq[l + 64] >> 4) << 4) |
                              ((qq[l + 96] >> 4) << 6));
            }
    }
    return 0;
}

/* ggml's quantize_row_q8_0_ref, what llama-quantize writes: q = roundf(x * (1 / d)) (halves away
 * from zero; the activation quantizer above rounds as ggml's x86 CPU one does). */
static int quantize_q8_0(const float *x, eng_block_q8_0_t *y, size_t n)
{
    for (size_t b = 0; b < n / ENG_QK8_0; b++, x += ENG_QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < ENG_QK8_0; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = eng_f32_to_f16(d);
        if (!isfinite(eng_f16_to_f32(y[b].d)))
            return PC_ERR_RANGE;
        for (int j = 0; j < ENG_QK8_0; j++)
            y[b].qs[j] = (int8_t)roundf(x[j] * id);
    }
    return 0;
}

int eng_quantize_row(uint32_t type, const float *x, void *dst, size_t n)
{
    uint32_t bs = eng_ggml_type_block_size(type);
    PC_ASSERT(bs != 0 && n % bs == 0);
    if (!all_finite(x, n))
        return PC_ERR_RANGE;
    switch (type) {
    case ENG_GGML_TYPE_Q4_0:
        return quantize_q4_0(x, dst, n);
    case ENG_GGML_TYPE_Q5_0:
        return quantize_q5_0(x, dst, n);
    case ENG_GGML_TYPE_Q5_1:
        return quantize_q5_1(x, dst, n);
    case ENG_GGML_TYPE_Q8_0:
        return quantize_q8_0(x, dst, n);
    case ENG_GGML_TYPE_Q4_K:
        return quantize_q4_k(x, dst, n);
    case ENG_GGML_TYPE_Q5_K:
        return quantize_q5_k(x, dst, n);
    case ENG_GGML_TYPE_Q6_K:
        return quantize_q6_k(x, dst, n);
    default:
        PC_ASSERT(!"eng_quantize_row: not a quantized weight type");
        return PC_ERR_INVAL;
    }
}

/* ---------------------------------------------------------------------------------------------
 * The Q4_K_M / Q5_K_M mixes (llama.cpp's llama_tensor_get_type for LLAMA_FTYPE_MOSTLY_Q4_K_M
 * and _Q5_K_M)
 * ------------------------------------------------------------------------------------------- */

/* llama.cpp's use_more_bits: the first and last eighth of the layers, and every third between. */
static bool use_more_bits(uint32_t i, uint32_t n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

uint32_t eng_quant_mix_type(uint32_t mix, const char *name, uint32_t n_layer, bool tied)
{
    if (mix != ENG_QUANT_MIX_Q4_K_M && mix != ENG_QUANT_MIX_Q5_K_M)
        return mix;
    if (strcmp(name, "output.weight") == 0 || (tied && strcmp(name, "token_embd.weight") == 0))
        return ENG_GGML_TYPE_Q6_K;
    unsigned layer;
    char rest[48];
    if (sscanf(name, "blk.%u.%47s", &layer, rest) == 2 &&
        (strcmp(rest, "attn_v.weight") == 0 || strcmp(rest, "ffn_down.weight") == 0) &&
        use_more_bits(layer, n_layer))
        return ENG_GGML_TYPE_Q6_K;
    return mix == ENG_QUANT_MIX_Q5_K_M ? ENG_GGML_TYPE_Q5_K : ENG_GGML_TYPE_Q4_K;
}

uint32_t eng_quant_mix_tensor_type(uint32_t mix, const char *name, uint32_t n_layer, bool tied,
                                   uint64_t n_in)
{
    uint32_t t = eng_quant_mix_type(mix, name, n_layer, tied);
    if (n_in % ENG_QK_K == 0)
        return t;
    switch (t) {
    case ENG_GGML_TYPE_Q4_K:
        return ENG_GGML_TYPE_Q5_0;
    case ENG_GGML_TYPE_Q5_K:
        return ENG_GGML_TYPE_Q5_1;
    case ENG_GGML_TYPE_Q6_K:
        return ENG_GGML_TYPE_Q8_0;
    default:
        return t;
    }
}
