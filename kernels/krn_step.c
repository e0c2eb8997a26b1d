/*
 * krn_step.c — the cuda backend's per-step host decisions that concern the device's view of a
 * step (kernels.h, "Step lists and graphs"): where each list lies in the one staging copy, and
 * which steps may replay a captured CUDA graph. Plain C, every build, so CPU-only machines test
 * what a GPU session would otherwise be the first to run.
 */
#include "kernels.h"
#include "pc_err.h"

int krn_step_layout(const krn_step_shape_t *s, krn_step_layout_t *out)
{
    if (s->n_rows < 0 || s->n_seqs < 0 || s->max_blocks < 0 || s->n_tasks < 0 || s->n_merges < 0 ||
        s->n_parts < 0 || s->n_logits < 0 || s->n_logits > s->n_rows ||
        (int64_t)s->n_seqs * s->max_blocks > INT32_MAX)
        return PC_ERR_INVAL;
    size_t cur = 0, rows = (size_t)s->n_rows * sizeof(int32_t);
    out->tokens = krn_pack_take(&cur, rows);
    out->pos = krn_pack_take(&cur, rows);
    out->row_seq = krn_pack_take(&cur, rows);
    out->logit_rows = krn_pack_take(&cur, (size_t)s->n_logits * sizeof(int32_t));
    out->tables = krn_pack_take(&cur, (size_t)s->n_seqs * (size_t)s->max_blocks * sizeof(int32_t));
    out->tasks = krn_pack_take(&cur, (size_t)s->n_tasks * sizeof(krn_attn_task_t));
    out->merges = krn_pack_take(&cur, (size_t)s->n_merges * sizeof(krn_attn_merge_t));
    out->srows =
        krn_pack_take(&cur, s->sample ? (size_t)s->n_logits * sizeof(krn_sample_row_t) : 0);
    out->bytes = cur;
    return 0;
}

bool krn_step_same_shape(const krn_step_shape_t *a, const krn_step_shape_t *b)
{
    return a->n_rows == b->n_rows && a->n_seqs == b->n_seqs && a->max_blocks == b->max_blocks &&
           a->n_tasks == b->n_tasks && a->n_merges == b->n_merges && a->n_parts == b->n_parts &&
           a->n_logits == b->n_logits && a->sample == b->sample && a->sample_plan == b->sample_plan;
}

bool krn_step_graphable(const krn_step_shape_t *s, const krn_step_graph_params_t *p)
{
    if (!p->graphs || !p->packed || !p->decode || s->n_rows < 1 || s->n_rows > KRN_GRAPH_MAX_ROWS ||
        s->n_seqs != s->n_rows)
        return false;
    if (!s->sample && s->n_logits > p->logits_rows)
        return false; /* the head's chunks are copied out between GEMMs */
    return p->fused_head || p->logit_rows_identity;
}
