/*
 * krn_plan.c — the attention work list of a batch (krn_attn_plan, kernels.h): host code shared
 * by the cuda backend and the tests, built with or without CUDA.
 *
 * A sequence's rows are cut, per KV head, into tasks of at most krn_attn_max_rows row-heads
 * (tokens x the query heads of the group: at most KRN_ATTN_MAX_ROWS, and KRN_ATTN_MAX_TILE
 * query elements), the rows one attention CTA holds (krn_hostdev.h). A single-token task
 * (decode) over more than split_kv positions is split over the KV length into tasks of split_kv
 * positions writing partial states, plus one merge.
 */
#include "kernels.h"
#include "krn_hostdev.h"
#include "pc_err.h"

int krn_attn_plan(const krn_plan_params_t *p, const krn_plan_seq_t *seqs, int32_t n_seqs,
                  krn_attn_task_t *tasks, int32_t *n_tasks, krn_attn_merge_t *merges,
                  int32_t *n_merges, int32_t *n_parts)
{
    *n_tasks = *n_merges = *n_parts = 0;
    if (p->n_head_kv <= 0 || p->n_head <= 0 || p->n_head % p->n_head_kv != 0 || p->head_dim <= 0 ||
        p->head_dim % 2 != 0 || p->head_dim > KRN_ATTN_MAX_HEAD_DIM || p->split_kv < 0 ||
        n_seqs < 0)
        return PC_ERR_INVAL;
    int32_t group = p->n_head / p->n_head_kv;
    /* Tokens per task: the kernel's CTA holds krn_attn_max_rows row-heads. */
    int32_t per_task = krn_attn_max_rows(p->head_dim) / group;
    if (per_task < 1)
        return PC_ERR_INVAL;
    int64_t nt = 0, nm = 0, np = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        const krn_plan_seq_t *sq = &seqs[s];
        if (sq->n_tokens <= 0 || sq->pos0 < 0 || sq->row0 < 0 ||
            sq->pos0 > INT32_MAX - sq->n_tokens || sq->row0 > INT32_MAX - sq->n_tokens)
            return PC_ERR_INVAL; /* last position + 1 and last row + 1 must fit in int32 */
        for (int32_t h = 0; h < p->n_head_kv; h++) {
            for (int64_t t0 = 0; t0 < sq->n_tokens; t0 += per_task) {
                int32_t nr = sq->n_tokens - t0 < per_task ? (int32_t)(sq->n_tokens - t0) : per_task;
                int32_t kv_len = (int32_t)(sq->pos0 + t0 + nr); /* last position + 1 */
                krn_attn_task_t t = {.seq = s,
                                     .kv_head = h,
                                     .row0 = (int32_t)(sq->row0 + t0),
                                     .n_rows = nr,
                                     .kv0 = 0,
                                     .kv1 = kv_len,
                                     .part = -1};
                if (nr == 1 && p->split_kv > 0 && kv_len > p->split_kv) {
                    int32_t n_splits = (int32_t)(((int64_t)kv_len + p->split_kv - 1) / p->split_kv);
                    int32_t w = nr * group;
                    if (merges != NULL)
                        merges[nm] = (krn_attn_merge_t){.row0 = t.row0,
                                                        .n_rows = nr,
                                                        .kv_head = h,
                                                        .part0 = (int32_t)np,
                                                        .n_splits = n_splits};
                    for (int32_t k = 0; k < n_splits; k++) {
                        int64_t end = (int64_t)(k + 1) * p->split_kv;
                        t.kv0 = k * p->split_kv; /* < kv_len */
                        t.kv1 = end < kv_len ? (int32_t)end : kv_len;
                        t.part = (int32_t)(np + (int64_t)k * w);
                        if (tasks != NULL)
                            tasks[nt] = t;
                        nt++;
                    }
                    nm++;
                    np += (int64_t)n_splits * w;
                } else {
                    if (tasks != NULL)
                        tasks[nt] = t;
                    nt++;
                }
                if (nt > INT32_MAX / 2 || np > INT32_MAX / 2)
                    return PC_ERR_INVAL;
            }
        }
    }
    *n_tasks = (int32_t)nt;
    *n_merges = (int32_t)nm;
    *n_parts = (int32_t)np;
    return 0;
}
