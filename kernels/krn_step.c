/*
 * krn_step.c — the cuda backend's per-step host decisions that concern the device's view of a
 * step (kernels.h, "Step lists and graphs"): where each list lies in the one staging copy, and
 * which steps may replay a captured CUDA graph. Plain C, every build, so CPU-only machines test
 * what a GPU session would otherwise be the first to run.
 */
#include <string.h>

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
           a->n_logits == b->n_logits && a->sample == b->sample &&
           a->sample_plan == b->sample_plan && a->dec_rows == b->dec_rows &&
           a->dec_split == b->dec_split && a->dec_splits == b->dec_splits;
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

bool krn_decode_use(const krn_kv_t *kv, int32_t n_head, const char *env)
{
    if (env != NULL && strcmp(env, "attn") == 0)
        return false;
    return krn_decode_check(kv, n_head) == 0;
}

/* Splits per row that krn_decode_split_tokens aims at: about 2 * n_sm CTAs over the rows' KV
 * heads. */
static int64_t decode_want_splits(int32_t n_sm, int32_t n_rows, int32_t n_head_kv)
{
    int64_t units = (int64_t)n_rows * n_head_kv;
    return ((int64_t)2 * n_sm + units - 1) / units;
}

/* n rounded up to a value whose binary form has at most 3 significant bits (n >= 1). */
static int64_t round_3bits(int64_t n)
{
    int64_t step = 1;
    while ((n >> 3) >= step)
        step <<= 1; /* n < 8 * step */
    return (n + step - 1) / step * step;
}

int krn_decode_step_plan(int32_t n_sm, int32_t n_rows, int32_t n_head_kv, int32_t block_tokens,
                         int32_t max_kv_len, int32_t *split_tokens, int32_t *max_splits)
{
    *split_tokens = *max_splits = 0;
    if (n_sm <= 0 || n_rows <= 0 || n_head_kv <= 0 || block_tokens <= 0 || max_kv_len <= 0 ||
        block_tokens > KRN_DECODE_ONE_SPLIT ||
        (int64_t)max_kv_len + block_tokens - 1 > KRN_DECODE_ONE_SPLIT)
        return PC_ERR_INVAL;
    int32_t split = krn_decode_split_tokens(n_sm, n_rows, n_head_kv, block_tokens, max_kv_len, 0);
    if (split <= 0)
        return PC_ERR_INVAL;
    int64_t per = round_3bits(split / block_tokens) * block_tokens;
    int64_t n_splits = ((int64_t)max_kv_len + per - 1) / per;
    if (n_splits <= 1) {
        *split_tokens = KRN_DECODE_ONE_SPLIT / block_tokens * block_tokens;
        *max_splits = 1;
        return 0;
    }
    int64_t want = decode_want_splits(n_sm, n_rows, n_head_kv);
    if (n_splits > want || per > INT32_MAX || want > INT32_MAX)
        return PC_ERR_INVAL; /* never: the split covers the context in at most want pieces */
    *split_tokens = (int32_t)per;
    *max_splits = (int32_t)want;
    return 0;
}

int64_t krn_decode_part_slots(int32_t n_sm, int32_t max_rows, int32_t n_head, int32_t n_head_kv)
{
    if (n_sm <= 0 || max_rows <= 0 || n_head <= 0 || n_head_kv <= 0)
        return -1;
    int64_t most = 0;
    /* Past 2 * n_sm rows every step has one split per row: the loop stops there. */
    for (int32_t n = 1; n <= max_rows && n <= 2 * n_sm; n++) {
        int64_t want = decode_want_splits(n_sm, n, n_head_kv);
        int64_t slots = want > 1 ? (int64_t)n * n_head * want : 0;
        most = slots > most ? slots : most;
    }
    return most;
}

bool krn_step_decode_shape(krn_step_shape_t *s, const int32_t *row_pos, int32_t n_lead, bool use,
                           int32_t n_sm, int32_t n_head, int32_t n_head_kv, int32_t block_tokens,
                           int64_t part_slots)
{
    s->dec_rows = s->dec_split = s->dec_splits = 0;
    if (!use || n_lead <= 0 || n_lead > s->n_rows || n_lead > s->n_seqs || n_head <= 0)
        return false;
    int32_t max_len = 0;
    for (int32_t i = 0; i < n_lead; i++) {
        if (row_pos[i] < 0 || row_pos[i] == INT32_MAX)
            return false;
        max_len = row_pos[i] + 1 > max_len ? row_pos[i] + 1 : max_len;
    }
    int32_t split, splits;
    if (krn_decode_step_plan(n_sm, n_lead, n_head_kv, block_tokens, max_len, &split, &splits) != 0)
        return false;
    if (splits > 1 && (int64_t)n_lead * n_head * splits > part_slots)
        return false;
    s->dec_rows = n_lead;
    s->dec_split = split;
    s->dec_splits = splits;
    return true;
}
