/*
 * krn_ref_attention.c — the CPU reference of the paged attention kernel: it runs the same task
 * and merge lists (krn_attn_plan) with the same online-softmax arithmetic
 * (krn_softmax_merge.h), one position at a time, so the kernel's tiling is the only thing it
 * does not share. The tests check it against a dense double-precision softmax attention.
 *
 * Only positions [kv0, kv1) of a task are read: slots past the written positions may hold NaN.
 * A q8_0 pool is read in place: each query head quantized once (krn_q8_0_quantize_f), scores
 * by krn_q8_0_score, V as d * q.
 */
#include <math.h>

#include "kernels.h"
#include "krn_hostdev.h"
#include "krn_softmax_merge.h"
#include "pc_alloc.h"
#include "pc_err.h"

/* One row-head's running state over [kv0, kv1). */
static void run_row(const krn_attn_args_t *a, const krn_attn_task_t *t, const float *q, int32_t pos,
                    float *o, float *m_out, float *l_out)
{
    const krn_kv_t *kv = &a->kv;
    int32_t hd = kv->head_dim, bt = kv->block_tokens;
    float m = -INFINITY, l = 0;
    for (int32_t d = 0; d < hd; d++)
        o[d] = 0;
    const int32_t *table = a->block_tables + (int64_t)t->seq * a->max_blocks;
    float qf[KRN_ATTN_MAX_HEAD_DIM], qd[KRN_ATTN_MAX_HEAD_DIM / KRN_QK8_0];
    bool q8 = kv->dtype == KRN_Q8_0;
    for (int32_t b = 0; q8 && b < hd / KRN_QK8_0; b++) /* the query, quantized once */
        krn_q8_0_quantize_f(q + b * KRN_QK8_0, qf + b * KRN_QK8_0, &qd[b]);
    /* One block at a time, as a tile: the scores of the tile, then one update. */
    for (int32_t p0 = t->kv0; p0 < t->kv1;) {
        int32_t slot0 = p0 % bt, n = bt - slot0;
        if (n > t->kv1 - p0)
            n = t->kv1 - p0;
        const uint8_t *slice = (const uint8_t *)kv->base +
                               krn_kv_slice_byte_offset(kv, table[p0 / bt], a->layer, t->kv_head);
        float s[4096];
        float tmax = -INFINITY;
        for (int32_t j = 0; j < n; j++) {
            s[j] = -INFINITY;
            if (p0 + j > pos)
                continue; /* causal: never read */
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
        float mn = krn_sm_max(m, tmax), c = krn_sm_scale(m, mn);
        float sum = 0;
        for (int32_t d = 0; d < hd; d++)
            o[d] *= c;
        for (int32_t j = 0; j < n; j++) {
            float p = krn_sm_prob(s[j], mn);
            if (p == 0)
                continue;
            sum += p;
            for (int32_t d = 0; d < hd; d++)
                o[d] += p * krn_kv_value(kv, slice, true, slot0 + j, d);
        }
        l = l * c + sum;
        m = mn;
        p0 += n;
    }
    *m_out = m;
    *l_out = l;
}

int krn_ref_attention(const krn_attn_args_t *a)
{
    const krn_kv_t *kv = &a->kv;
    if (kv->n_head_kv <= 0 || a->n_head <= 0 || a->n_head % kv->n_head_kv != 0 ||
        kv->head_dim <= 0 || kv->head_dim > KRN_ATTN_MAX_HEAD_DIM || kv->block_tokens <= 0 ||
        kv->block_tokens > 4096 || a->layer < 0 || a->layer >= kv->n_layer ||
        (kv->dtype != KRN_F16 && kv->dtype != KRN_F32 && kv->dtype != KRN_Q8_0) ||
        (kv->dtype == KRN_Q8_0 && kv->head_dim % KRN_QK8_0 != 0))
        return PC_ERR_INVAL;
    int32_t hd = kv->head_dim, group = a->n_head / kv->n_head_kv, width = a->n_head * hd;
    float o[KRN_ATTN_MAX_HEAD_DIM];
    for (int32_t ti = 0; ti < a->n_tasks; ti++) {
        const krn_attn_task_t *t = &a->tasks[ti];
        if (t->n_rows * group > KRN_ATTN_MAX_ROWS || t->kv0 < 0 || t->kv1 < t->kv0 ||
            t->kv1 > a->max_blocks * kv->block_tokens)
            return PC_ERR_INVAL;
        for (int32_t tr = 0; tr < t->n_rows; tr++) {
            int32_t row = t->row0 + tr, pos = a->row_pos[row];
            for (int32_t g = 0; g < group; g++) {
                int32_t head = t->kv_head * group + g;
                const float *q = a->q + (int64_t)row * width + (int64_t)head * hd;
                float m, l;
                run_row(a, t, q, pos, o, &m, &l);
                if (t->part < 0) {
                    float inv = krn_sm_inv(l);
                    float *out = a->out + (int64_t)row * width + (int64_t)head * hd;
                    for (int32_t d = 0; d < hd; d++)
                        out[d] = o[d] * inv;
                } else {
                    int64_t slot = (int64_t)t->part + (int64_t)tr * group + g;
                    for (int32_t d = 0; d < hd; d++)
                        a->part_o[slot * hd + d] = o[d];
                    a->part_ml[2 * slot] = m;
                    a->part_ml[2 * slot + 1] = l;
                }
            }
        }
    }
    for (int32_t mi = 0; mi < a->n_merges; mi++) {
        const krn_attn_merge_t *mg = &a->merges[mi];
        int32_t w = mg->n_rows * group;
        for (int32_t i = 0; i < w; i++) {
            int32_t row = mg->row0 + i / group, head = mg->kv_head * group + i % group;
            float m = -INFINITY, l = 0;
            for (int32_t d = 0; d < hd; d++)
                o[d] = 0;
            for (int32_t s = 0; s < mg->n_splits; s++) {
                int64_t slot = (int64_t)mg->part0 + (int64_t)s * w + i;
                float sa, sb;
                krn_sm_merge(&m, &l, a->part_ml[2 * slot], a->part_ml[2 * slot + 1], &sa, &sb);
                for (int32_t d = 0; d < hd; d++)
                    o[d] = o[d] * sa + a->part_o[slot * hd + d] * sb;
            }
            float inv = krn_sm_inv(l);
            float *out = a->out + (int64_t)row * width + (int64_t)head * hd;
            for (int32_t d = 0; d < hd; d++)
                out[d] = o[d] * inv;
        }
    }
    return 0;
}
