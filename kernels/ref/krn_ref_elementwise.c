/*
 * krn_ref_elementwise.c — CPU references of the element-wise kernels (kernels.h): embedding
 * gather, RMSNorm and q/k norm, RoPE, SwiGLU, residual add, bias add, F32 -> F16/BF16, and the
 * host half/bfloat16 conversions.
 *
 * Each follows the formula in kernels.h literally, one element at a time in F32 (RoPE angles in
 * double, as the CPU backend computes them), so a kernel that agrees with it to rounding is
 * right.
 */
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "pc_err.h"

float krn_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while ((man & 0x400) == 0);
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t krn_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: keep it a (quiet) NaN */
        return (uint16_t)(sign | 0x7e00 | ((ax >> 13) & 0x3ff));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: infinity */
        return (uint16_t)(sign | 0x7c00);
    if (ax < 0x38800000u) {   /* below the smallest normal half: subnormal or zero */
        if (ax < 0x33000000u) /* below half the smallest subnormal */
            return sign;
        uint32_t e = ax >> 23, man = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14 .. 24 */
        uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (q & 1)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = ax + 0xfff + ((ax >> 13) & 1); /* round to nearest even on bit 13 */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

float krn_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t krn_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

static float load_elem(const void *base, int64_t i, enum krn_dtype t)
{
    switch (t) {
    case KRN_F16:
        return krn_f16_to_f32(((const uint16_t *)base)[i]);
    case KRN_BF16:
        return krn_bf16_to_f32(((const uint16_t *)base)[i]);
    default:
        return ((const float *)base)[i];
    }
}

int krn_ref_embed(const krn_embed_args_t *a)
{
    if (a->n_rows < 0 || a->width <= 0 || a->n_vocab <= 0)
        return PC_ERR_INVAL;
    for (int32_t r = 0; r < a->n_rows; r++)
        if (a->ids[r] < 0 || a->ids[r] >= a->n_vocab)
            return PC_ERR_INVAL;
    for (int32_t r = 0; r < a->n_rows; r++)
        for (int32_t j = 0; j < a->width; j++)
            a->out[(int64_t)r * a->width + j] =
                load_elem(a->table, (int64_t)a->ids[r] * a->width + j, a->table_dtype);
    return 0;
}

int krn_ref_rmsnorm(const krn_rmsnorm_args_t *a)
{
    if (a->n_rows < 0 || a->width <= 0)
        return PC_ERR_INVAL;
    for (int32_t r = 0; r < a->n_rows; r++) {
        const float *x = a->x + (int64_t)r * a->width;
        float *y = a->y + (int64_t)r * a->width;
        float ss = 0;
        for (int32_t j = 0; j < a->width; j++)
            ss += x[j] * x[j];
        float scale = 1.0f / sqrtf(ss / (float)a->width + a->eps);
        for (int32_t j = 0; j < a->width; j++)
            y[j] = x[j] * scale * a->w[j];
    }
    return 0;
}

int krn_ref_qk_norm(const krn_rmsnorm_args_t *a)
{
    return krn_ref_rmsnorm(a);
}

int krn_ref_rope(const krn_rope_args_t *a)
{
    if (a->n_rows < 0 || a->n_heads <= 0 || a->head_dim <= 0 || a->rope_dim <= 0 ||
        a->rope_dim % 2 != 0 || a->rope_dim > a->head_dim ||
        (a->style != KRN_ROPE_NORM && a->style != KRN_ROPE_NEOX))
        return PC_ERR_INVAL;
    int32_t half = a->rope_dim / 2;
    bool neox = a->style == KRN_ROPE_NEOX;
    for (int32_t r = 0; r < a->n_rows; r++) {
        for (int32_t h = 0; h < a->n_heads; h++) {
            float *x = a->x + ((int64_t)r * a->n_heads + h) * a->head_dim;
            for (int32_t i = 0; i < half; i++) {
                double ang = (double)a->pos[r] * a->inv_freq[i];
                float cs = (float)cos(ang), sn = (float)sin(ang);
                int32_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
                float x0 = x[i0], x1 = x[i1];
                x[i0] = x0 * cs - x1 * sn;
                x[i1] = x0 * sn + x1 * cs;
            }
            for (int32_t d = 0; d < a->head_dim; d++)
                x[d] *= a->post_scale;
        }
    }
    return 0;
}

int krn_ref_swiglu(const krn_swiglu_args_t *a)
{
    if (a->n < 0)
        return PC_ERR_INVAL;
    for (int64_t i = 0; i < a->n; i++) {
        float g = a->g[i];
        a->g[i] = g / (1.0f + expf(-g)) * a->u[i];
    }
    return 0;
}

int krn_ref_add(const krn_add_args_t *a)
{
    if (a->n < 0)
        return PC_ERR_INVAL;
    for (int64_t i = 0; i < a->n; i++)
        a->x[i] += a->y[i];
    return 0;
}

int krn_ref_bias_add(const krn_bias_add_args_t *a)
{
    if (a->n_rows < 0 || a->width <= 0)
        return PC_ERR_INVAL;
    for (int32_t r = 0; r < a->n_rows; r++)
        for (int32_t j = 0; j < a->width; j++)
            a->x[(int64_t)r * a->width + j] += a->b[j];
    return 0;
}

int krn_ref_convert(const krn_convert_args_t *a)
{
    if (a->n < 0 || (a->dtype != KRN_F16 && a->dtype != KRN_BF16))
        return PC_ERR_INVAL;
    uint16_t *y = a->y;
    for (int64_t i = 0; i < a->n; i++)
        y[i] = a->dtype == KRN_F16 ? krn_f32_to_f16(a->x[i]) : krn_f32_to_bf16(a->x[i]);
    return 0;
}

int krn_ref_gemm(const krn_gemm_args_t *a)
{
    if (a->M < 0 || a->N <= 0 || a->K <= 0 || (a->dtype != KRN_F16 && a->dtype != KRN_BF16) ||
        (a->ldy != 0 && a->ldy < a->N))
        return PC_ERR_INVAL;
    int64_t ldy = a->ldy ? a->ldy : a->N;
    for (int32_t m = 0; m < a->M; m++) {
        for (int32_t n = 0; n < a->N; n++) {
            double acc = 0;
            for (int32_t k = 0; k < a->K; k++)
                acc += (double)load_elem(a->x, (int64_t)m * a->K + k, a->dtype) *
                       (double)load_elem(a->w, (int64_t)n * a->K + k, a->dtype);
            float *y = &a->y[(int64_t)m * ldy + n];
            *y = a->accumulate ? *y + (float)acc : (float)acc;
        }
    }
    return 0;
}
