/*
 * krn_ref_kv.c — CPU references of the paged-KV kernels: writing K/V rows into their blocks and
 * copying blocks inside the pool (kernels.h documents the layout, F16, F32 and q8_0), and the
 * host q8_0 quantizer.
 */
#include <string.h>

#include "kernels.h"
#include "krn_hostdev.h"
#include "pc_err.h"

void krn_q8_0_quantize(const float *x, int32_t n, uint8_t *dst)
{
    for (int32_t b = 0; b < n / KRN_QK8_0; b++, x += KRN_QK8_0, dst += KRN_Q8_0_BYTES) {
        float amax = 0.0f;
        for (int32_t i = 0; i < KRN_QK8_0; i++) {
            float a = fabsf(x[i]);
            amax = a > amax ? a : amax;
        }
        float d = krn_q8_0_scale(amax), id = krn_q8_0_inv(d);
        uint16_t bits = krn_q8_0_d_bits(d);
        dst[0] = (uint8_t)(bits & 0xff);
        dst[1] = (uint8_t)(bits >> 8);
        for (int32_t i = 0; i < KRN_QK8_0; i++)
            dst[2 + i] = (uint8_t)krn_q8_0_quant(x[i], id);
    }
}

void krn_q8_0_dequantize(const uint8_t *src, int32_t n, float *y)
{
    for (int32_t b = 0; b < n / KRN_QK8_0; b++, src += KRN_Q8_0_BYTES, y += KRN_QK8_0) {
        float d = krn_q8_0_d_of(src);
        for (int32_t i = 0; i < KRN_QK8_0; i++)
            y[i] = d * (float)(int8_t)src[2 + i];
    }
}

static bool kv_ok(const krn_kv_t *kv)
{
    return kv->n_blocks > 0 && kv->n_layer > 0 && kv->n_head_kv > 0 && kv->head_dim > 0 &&
           kv->block_tokens > 0 &&
           (kv->dtype == KRN_F16 || kv->dtype == KRN_F32 ||
            (kv->dtype == KRN_Q8_0 && kv->head_dim % KRN_QK8_0 == 0));
}

static void store(const krn_kv_t *kv, int64_t off, float v)
{
    if (kv->dtype == KRN_F16)
        ((uint16_t *)kv->base)[off] = krn_f32_to_f16(v);
    else
        ((float *)kv->base)[off] = v;
}

int krn_ref_kv_write(const krn_kv_write_args_t *a)
{
    const krn_kv_t *kv = &a->kv;
    if (!kv_ok(kv) || a->layer < 0 || a->layer >= kv->n_layer || a->n_rows < 0 ||
        a->max_blocks <= 0)
        return PC_ERR_INVAL;
    int32_t hd = kv->head_dim, bt = kv->block_tokens, width = kv->n_head_kv * hd;
    for (int32_t r = 0; r < a->n_rows; r++) {
        int32_t pos = a->row_pos[r], bi = pos / bt;
        if (pos < 0 || bi >= a->max_blocks)
            return PC_ERR_INVAL;
        int32_t block = a->block_tables[(int64_t)a->row_seq[r] * a->max_blocks + bi];
        if (block < 0 || block >= kv->n_blocks)
            return PC_ERR_INVAL;
    }
    for (int32_t r = 0; r < a->n_rows; r++) {
        int32_t pos = a->row_pos[r], slot = pos % bt;
        int32_t block = a->block_tables[(int64_t)a->row_seq[r] * a->max_blocks + pos / bt];
        for (int32_t h = 0; h < kv->n_head_kv; h++) {
            const float *k = a->k + (int64_t)r * width + (int64_t)h * hd;
            const float *v = a->v + (int64_t)r * width + (int64_t)h * hd;
            if (kv->dtype == KRN_Q8_0) {
                uint8_t *slice =
                    (uint8_t *)kv->base + krn_kv_slice_byte_offset(kv, block, a->layer, h);
                size_t rb = krn_kv_row_bytes(kv);
                krn_q8_0_quantize(k, hd, slice + (size_t)slot * rb);
                krn_q8_0_quantize(v, hd, slice + (size_t)(bt + slot) * rb);
                continue;
            }
            int64_t base = krn_kv_slice_offset(kv, block, a->layer, h);
            for (int32_t d = 0; d < hd; d++) {
                store(kv, base + (int64_t)d * bt + slot, k[d]);
                store(kv, base + (int64_t)hd * bt + (int64_t)slot * hd + d, v[d]);
            }
        }
    }
    return 0;
}

int krn_ref_block_copy(const krn_block_copy_args_t *a)
{
    const krn_kv_t *kv = &a->kv;
    if (!kv_ok(kv) || a->n < 0)
        return PC_ERR_INVAL;
    for (int32_t i = 0; i < a->n; i++)
        if (a->src[i] < 0 || a->src[i] >= kv->n_blocks || a->dst[i] < 0 ||
            a->dst[i] >= kv->n_blocks ||
            (a->n_tokens != NULL && (a->n_tokens[i] < 0 || a->n_tokens[i] > kv->block_tokens)))
            return PC_ERR_INVAL;
    size_t e = krn_dtype_size(kv->dtype);
    int32_t hd = kv->head_dim, bt = kv->block_tokens;
    uint8_t *base = kv->base;
    for (int32_t i = 0; i < a->n; i++) {
        int32_t n = a->n_tokens != NULL ? a->n_tokens[i] : bt;
        for (int32_t l = 0; l < kv->n_layer; l++) {
            for (int32_t h = 0; h < kv->n_head_kv; h++) {
                if (kv->dtype == KRN_Q8_0) { /* K rows then V rows, one per slot */
                    size_t rb = krn_kv_row_bytes(kv);
                    uint8_t *d = base + krn_kv_slice_byte_offset(kv, a->dst[i], l, h);
                    const uint8_t *s = base + krn_kv_slice_byte_offset(kv, a->src[i], l, h);
                    memcpy(d, s, (size_t)n * rb);
                    memcpy(d + (size_t)bt * rb, s + (size_t)bt * rb, (size_t)n * rb);
                    continue;
                }
                uint8_t *d = base + krn_kv_slice_offset(kv, a->dst[i], l, h) * (int64_t)e;
                const uint8_t *s = base + krn_kv_slice_offset(kv, a->src[i], l, h) * (int64_t)e;
                for (int32_t r = 0; r < hd; r++) /* K: one row per dimension */
                    memcpy(d + (size_t)r * bt * e, s + (size_t)r * bt * e, (size_t)n * e);
                memcpy(d + (size_t)hd * bt * e, s + (size_t)hd * bt * e, (size_t)n * hd * e);
            }
        }
    }
    return 0;
}
