/*
 * krn_ref_decode.c — the CPU reference of the split-KV decode kernel (krn_decode.cu): for each
 * row and query head, the online softmax over each split's positions one block at a time (the
 * arithmetic of krn_softmax_merge.h), then the splits merged in order, as the merge kernel does.
 * The kernel also splits a split's blocks over warps, which only changes rounding.
 *
 * Only positions [0, pos] of a row are read: slots past the written positions may hold NaN.
 * A q8_0 pool is read in place as krn_ref_attention reads it (query quantized once per head,
 * krn_q8_0_score, V as d * q).
 */
#include <math.h>

#include "kernels.h"
#include "krn_hostdev.h"
#include "krn_softmax_merge.h"
#include "pc_err.h"

/* The state (o, m, l) of one query head over positions [p0, p1). */
static void run_split(const krn_decode_args_t *a, const int32_t *table, int32_t kv_head,
                      const float *q, int32_t p0, int32_t p1, float *o, float *m_out, float *l_out)
{
    const krn_kv_t *kv = &a->kv;
    int32_t hd = kv->head_dim, bt = kv->block_tokens;
    float m = -INFINITY, l = 0;
    for (int32_t d = 0; d < hd; d++)
        o[d] = 0;
    float qf[KRN_ATTN_MAX_HEAD_DIM], qd[KRN_ATTN_MAX_HEAD_DIM / KRN_QK8_0];
    bool q8 = kv->dtype == KRN_Q8_0;
    for (int32_t b = 0; q8 && b < hd / KRN_QK8_0; b++) /* the query, quantized once */
        krn_q8_0_quantize_f(q + b * KRN_QK8_0, qf + b * KRN_QK8_0, &qd[b]);
    for (int32_t p = p0; p < p1;) {
        int32_t slot0 = p % bt, n = bt - slot0;
        n = n < p1 - p ? n : p1 - p;
        const uint8_t *slice = (const uint8_t *)kv->base +
                               krn_kv_slice_byte_offset(kv, table[p / bt], a->layer, kv_head);
        float s[4096];
        float tmax = -INFINITY;
        for (int32_t j = 0; j < n; j++) {
            float acc = 0;
            if (q8)
                acc =
                    krn_q8_0_score(qf, qd, slice + (size_t)(slot0 + j) * krn_kv_row_bytes(kv), hd);
            else
                for (int32_t d = 0; d < hd; d++)
                    acc += q[d] * krn_kv_value(kv, slice, false, slot0 + j, d);
            s[j] = acc;
            tmax = acc > tmax ? acc : tmax;
        }
        float mn = krn_sm_max(m, tmax), c = krn_sm_scale(m, mn), sum = 0;
        for (int32_t d = 0; d < hd; d++)
            o[d] *= c;
        for (int32_t j = 0; j < n; j++) {
            float pj = krn_sm_prob(s[j], mn);
            sum += pj;
            for (int32_t d = 0; d < hd; d++)
                o[d] += pj * krn_kv_value(kv, slice, true, slot0 + j, d);
        }
        l = l * c + sum;
        m = mn;
        p += n;
    }
    *m_out = m;
    *l_out = l;
}

int krn_ref_decode_attention(const krn_decode_args_t *a)
{
    const krn_kv_t *kv = &a->kv;
    if (krn_decode_check(kv, a->n_head) != 0 || a->layer < 0 || a->layer >= kv->n_layer ||
        a->n_rows < 0 || a->max_blocks <= 0 || a->split_tokens <= 0 ||
        a->split_tokens % kv->block_tokens != 0 || a->max_splits <= 0 || kv->block_tokens > 4096)
        return PC_ERR_INVAL;
    int32_t hd = kv->head_dim, group = a->n_head / kv->n_head_kv, qw = a->n_head * hd;
    for (int32_t r = 0; r < a->n_rows; r++) {
        int32_t pos = a->row_pos[r];
        if (pos < 0 || pos >= a->max_blocks * kv->block_tokens ||
            pos / a->split_tokens >= a->max_splits)
            return PC_ERR_INVAL;
    }
    float o[KRN_ATTN_MAX_HEAD_DIM], acc[KRN_ATTN_MAX_HEAD_DIM];
    for (int32_t r = 0; r < a->n_rows; r++) {
        int32_t pos = a->row_pos[r], n_splits = pos / a->split_tokens + 1;
        const int32_t *table = a->block_tables + (int64_t)a->row_seq[r] * a->max_blocks;
        for (int32_t h = 0; h < a->n_head; h++) {
            const float *q = a->q + (int64_t)r * qw + (int64_t)h * hd;
            float m = -INFINITY, l = 0;
            for (int32_t d = 0; d < hd; d++)
                acc[d] = 0;
            for (int32_t s = 0; s < n_splits; s++) {
                int32_t p0 = s * a->split_tokens, p1 = p0 + a->split_tokens;
                p1 = p1 < pos + 1 ? p1 : pos + 1;
                float ms, ls, sa, sb;
                run_split(a, table, h / group, q, p0, p1, o, &ms, &ls);
                krn_sm_merge(&m, &l, ms, ls, &sa, &sb);
                for (int32_t d = 0; d < hd; d++)
                    acc[d] = acc[d] * sa + o[d] * sb;
            }
            float inv = krn_sm_inv(l);
            for (int32_t d = 0; d < hd; d++)
                a->out[(int64_t)r * qw + (int64_t)h * hd + d] = acc[d] * inv;
        }
    }
    return 0;
}
