/*
 * krn_ref_fused.c — CPU references of the fused kernels (kernels.h, "Fused kernels"): each is
 * the unfused references it replaces applied in order, one row (and head) at a time, so a
 * fused kernel that matches it matches the unfused path, and test_krn_ref checks the reference
 * against the whole-array composition bit for bit.
 */
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "pc_err.h"

/* Stores v into element i of a [n][...] array of dtype t (F32, or F16/BF16 rounded to nearest
 * even, as krn_ref_convert). */
static void store_elem(void *y, int64_t i, float v, enum krn_dtype t)
{
    if (t == KRN_F32)
        ((float *)y)[i] = v;
    else
        ((uint16_t *)y)[i] = t == KRN_F16 ? krn_f32_to_f16(v) : krn_f32_to_bf16(v);
}

static bool dtype_ok(enum krn_dtype t)
{
    return t == KRN_F32 || t == KRN_F16 || t == KRN_BF16;
}

int krn_ref_rmsnorm_convert(const krn_rmsnorm_convert_args_t *a)
{
    if (a->n_rows < 0 || a->n_src < 0 || a->width <= 0 || !dtype_ok(a->dtype) ||
        (a->rows == NULL && a->n_rows > a->n_src))
        return PC_ERR_INVAL;
    for (int32_t r = 0; a->rows != NULL && r < a->n_rows; r++)
        if (a->rows[r] < 0 || a->rows[r] >= a->n_src)
            return PC_ERR_INVAL;
    for (int32_t r = 0; r < a->n_rows; r++) {
        const float *x = a->x + (int64_t)(a->rows != NULL ? a->rows[r] : r) * a->width;
        float ss = 0;
        for (int32_t j = 0; j < a->width; j++)
            ss += x[j] * x[j];
        float scale = 1.0f / sqrtf(ss / (float)a->width + a->eps);
        for (int32_t j = 0; j < a->width; j++)
            store_elem(a->y, (int64_t)r * a->width + j, x[j] * scale * a->w[j], a->dtype);
    }
    return 0;
}

int krn_ref_qkv_rope_kv(const krn_qkv_rope_kv_args_t *a)
{
    const krn_kv_t *kv = &a->kv;
    int32_t hd = kv->head_dim, nkv = kv->n_head_kv;
    if (a->n_rows < 0 || a->n_head <= 0 || nkv <= 0 || hd <= 0 || hd % 2 != 0 ||
        hd > KRN_ATTN_MAX_HEAD_DIM || a->layer < 0 || a->layer >= kv->n_layer ||
        kv->block_tokens <= 0 || a->max_blocks <= 0 || a->rope_dim <= 0 || a->rope_dim % 2 != 0 ||
        a->rope_dim > hd || a->ld_q < (int64_t)a->n_head * hd || a->ld_kv < (int64_t)nkv * hd ||
        (kv->dtype != KRN_F32 && kv->dtype != KRN_F16 && kv->dtype != KRN_Q8_0) ||
        (kv->dtype == KRN_Q8_0 && hd % KRN_QK8_0 != 0) ||
        (a->style != KRN_ROPE_NORM && a->style != KRN_ROPE_NEOX))
        return PC_ERR_INVAL;
    float x[KRN_ATTN_MAX_HEAD_DIM];
    int32_t bt = kv->block_tokens;
    for (int32_t r = 0; r < a->n_rows; r++) { /* every row has its slot, as krn_ref_kv_write */
        int32_t pos = a->row_pos[r];
        if (pos < 0 || pos / bt >= a->max_blocks)
            return PC_ERR_INVAL;
        int32_t block = a->block_tables[(int64_t)a->row_seq[r] * a->max_blocks + pos / bt];
        if (block < 0 || block >= kv->n_blocks)
            return PC_ERR_INVAL;
    }
    for (int32_t r = 0; r < a->n_rows; r++) {
        /* One head at a time through the unfused references: bias, norm, rope (+ scale). */
        krn_rmsnorm_args_t nrm = {.x = x, .y = x, .n_rows = 1, .width = hd, .eps = a->eps};
        krn_rope_args_t rp = {.x = x,
                              .pos = &a->row_pos[r],
                              .inv_freq = a->inv_freq,
                              .n_rows = 1,
                              .n_heads = 1,
                              .head_dim = hd,
                              .rope_dim = a->rope_dim,
                              .style = a->style};
        for (int32_t h = 0; h < a->n_head; h++) {
            const float *src = a->q_in + (int64_t)r * a->ld_q + (int64_t)h * hd;
            for (int32_t d = 0; d < hd; d++)
                x[d] = a->bq != NULL ? src[d] + a->bq[(int64_t)h * hd + d] : src[d];
            nrm.w = a->q_norm;
            if (a->q_norm != NULL)
                krn_ref_qk_norm(&nrm);
            rp.post_scale = a->q_scale;
            krn_ref_rope(&rp);
            memcpy(a->q_out + ((int64_t)r * a->n_head + h) * hd, x, sizeof(float) * (size_t)hd);
        }
        int32_t pos = a->row_pos[r], slot = pos % bt;
        int32_t block = a->block_tables[(int64_t)a->row_seq[r] * a->max_blocks + pos / bt];
        for (int32_t h = 0; h < nkv; h++) {
            const float *src = a->k_in + (int64_t)r * a->ld_kv + (int64_t)h * hd;
            const float *vs = a->v_in + (int64_t)r * a->ld_kv + (int64_t)h * hd;
            for (int32_t d = 0; d < hd; d++)
                x[d] = a->bk != NULL ? src[d] + a->bk[(int64_t)h * hd + d] : src[d];
            nrm.w = a->k_norm;
            if (a->k_norm != NULL)
                krn_ref_qk_norm(&nrm);
            rp.post_scale = 1.0f;
            krn_ref_rope(&rp);
            if (kv->dtype == KRN_Q8_0) { /* the rows quantized, as krn_ref_kv_write */
                float vq[KRN_ATTN_MAX_HEAD_DIM];
                for (int32_t d = 0; d < hd; d++)
                    vq[d] = a->bv != NULL ? vs[d] + a->bv[(int64_t)h * hd + d] : vs[d];
                uint8_t *sl =
                    (uint8_t *)kv->base + krn_kv_slice_byte_offset(kv, block, a->layer, h);
                size_t rb = krn_kv_row_bytes(kv);
                krn_q8_0_quantize(x, hd, sl + (size_t)slot * rb);
                krn_q8_0_quantize(vq, hd, sl + (size_t)(bt + slot) * rb);
                continue;
            }
            int64_t slice = krn_kv_slice_offset(kv, block, a->layer, h);
            for (int32_t d = 0; d < hd; d++) {
                float v = a->bv != NULL ? vs[d] + a->bv[(int64_t)h * hd + d] : vs[d];
                store_elem(kv->base, slice + (int64_t)d * bt + slot, x[d], kv->dtype);
                store_elem(kv->base, slice + (int64_t)hd * bt + (int64_t)slot * hd + d, v,
                           kv->dtype);
            }
        }
    }
    return 0;
}

int krn_ref_swiglu_convert(const krn_swiglu_convert_args_t *a)
{
    if (a->n_rows < 0 || a->width <= 0 || a->ld < a->width || !dtype_ok(a->dtype))
        return PC_ERR_INVAL;
    for (int32_t r = 0; r < a->n_rows; r++)
        for (int32_t j = 0; j < a->width; j++) {
            float g = a->g[(int64_t)r * a->ld + j], u = a->u[(int64_t)r * a->ld + j];
            store_elem(a->y, (int64_t)r * a->width + j, g / (1.0f + expf(-g)) * u, a->dtype);
        }
    return 0;
}
