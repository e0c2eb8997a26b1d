/*
 * krn_ref_kv.c — CPU references of the paged-KV kernels: writing K/V rows into their blocks and
 * copying blocks inside the pool (kernels.h documents the layout).
 */
#include <string.h>

#include "kernels.h"
#include "pc_err.h"

static bool kv_ok(const krn_kv_t *kv)
{
    return kv->n_blocks > 0 && kv->n_layer > 0 && kv->n_head_kv > 0 && kv->head_dim > 0 &&
           kv->block_tokens > 0 && (kv->dtype == KRN_F16 || kv->dtype == KRN_F32);
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
            int64_t base = krn_kv_slice_offset(kv, block, a->layer, h);
            const float *k = a->k + (int64_t)r * width + (int64_t)h * hd;
            const float *v = a->v + (int64_t)r * width + (int64_t)h * hd;
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
