/*
 * krn_plan.c — the attention work list of a batch (krn_attn_plan, kernels.h): host code shared
 * by the cuda backend and the tests, built with or without CUDA.
 *
 * A sequence's rows are cut, per KV head, into tasks of at most krn_attn_max_rows row-heads
 * (tokens x the query heads of the group: at most KRN_ATTN_MAX_ROWS, and KRN_ATTN_MAX_TILE
 * query elements), the rows one attention CTA holds (krn_hostdev.h). A single-token task
 * (decode) over more than split_kv positions is split over the KV length into tasks of split_kv
 * positions writing partial states, plus one merge.
 *
 * krn_attn_tc_check / krn_attn_use_tc decide which kernel runs the multi-token tasks (the
 * tensor-core kernel or the SIMT one); the plan is the same for both.
 *
 * Also the backend's other host-side decisions (kernels.h, "Host-side planning"): the reason a
 * CUDA device is not usable, each GEMM's input type, and the device memory for the KV pool.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

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

int krn_attn_tc_check(const krn_kv_t *kv, int32_t n_head)
{
    if (kv->n_head_kv <= 0 || n_head <= 0 || n_head % kv->n_head_kv != 0 || kv->head_dim <= 0 ||
        kv->head_dim % 16 != 0 || kv->head_dim > KRN_ATTN_MAX_HEAD_DIM || kv->block_tokens <= 0 ||
        kv->block_tokens % 8 != 0 || kv->dtype != KRN_F16)
        return PC_ERR_INVAL;
    /* Every task krn_attn_plan makes fits one CTA: at most KRN_TC_ROWS row-heads. */
    if (krn_attn_max_rows(kv->head_dim) > KRN_TC_ROWS)
        return PC_ERR_INVAL;
    return 0;
}

bool krn_attn_use_tc(const krn_kv_t *kv, int32_t n_head, const char *env)
{
    if (env != NULL && strcmp(env, "simt") == 0)
        return false;
    return krn_attn_tc_check(kv, n_head) == 0;
}

int32_t krn_attn_tc_warps(const char *env)
{
    return env != NULL && strcmp(env, "tc64") == 0 ? 4 : KRN_TC_MAX_WARPS;
}

void krn_describe_cuda_failure(int err_code, const char *err_name, const char *err_string,
                               int driver_version, int runtime_version, char *buf, size_t len)
{
    if (buf == NULL || len == 0)
        return;
    int dmaj = driver_version / 1000, dmin = driver_version % 1000 / 10;
    int rmaj = runtime_version / 1000, rmin = runtime_version % 1000 / 10;
    if (err_code == 0)
        snprintf(buf, len, "no CUDA device (driver CUDA %d.%d, runtime CUDA %d.%d)", dmaj, dmin,
                 rmaj, rmin);
    else if (driver_version == 0)
        snprintf(buf, len, "no NVIDIA driver: cudaGetDeviceCount: %s (%s)", err_string, err_name);
    else if (driver_version < runtime_version)
        snprintf(
            buf, len,
            "the NVIDIA driver supports CUDA %d.%d but this build needs CUDA %d.%d: update the "
            "driver (cudaGetDeviceCount: %s (%s))",
            dmaj, dmin, rmaj, rmin, err_string, err_name);
    else
        snprintf(buf, len, "cudaGetDeviceCount: %s (%s); driver CUDA %d.%d, runtime CUDA %d.%d",
                 err_string, err_name, dmaj, dmin, rmaj, rmin);
}

enum krn_dtype krn_gemm_dtype(const krn_gemm_dtype_params_t *p)
{
    if (p->file_dtype == KRN_BF16 || !(p->weight_amax <= (float)KRN_F16_MAX))
        return KRN_BF16;
    if (p->act_bound <= KRN_F16_MAX)
        return KRN_F16;
    if (p->act_amax_measured >= 0 &&
        p->act_amax_measured * KRN_F16_MEASURED_HEADROOM <= KRN_F16_MAX)
        return KRN_F16;
    return KRN_BF16;
}

double krn_act_bound_normed(int32_t width, float norm_amax)
{
    if (width <= 0 || !(norm_amax >= 0))
        return INFINITY;
    return sqrt((double)width) * (double)norm_amax;
}

double krn_act_bound_proj(int32_t width, float norm_amax, double w_row_norm_max, float b_amax)
{
    if (!(w_row_norm_max >= 0) || !(b_amax >= 0))
        return INFINITY;
    return krn_act_bound_normed(width, norm_amax) * w_row_norm_max + (double)b_amax;
}

double krn_act_bound_swiglu(double g_bound, double u_bound)
{
    if (!(g_bound >= 0) || !(u_bound >= 0))
        return INFINITY;
    return g_bound * u_bound;
}

krn_mem_plan_params_t krn_mem_plan_params_default(void)
{
    return (krn_mem_plan_params_t){.headroom_frac = 0.05, .headroom_min_bytes = (size_t)512 << 20};
}

int krn_mem_plan(const krn_mem_plan_params_t *p, krn_mem_plan_t *out)
{
    *out = (krn_mem_plan_t){0};
    if (p->block_bytes == 0 || p->want_blocks < 0 || !(p->headroom_frac >= 0) ||
        p->headroom_frac > 1)
        return PC_ERR_INVAL;
    double frac = p->headroom_frac * (double)p->total_bytes;
    size_t head = frac > (double)p->headroom_min_bytes ? (size_t)frac : p->headroom_min_bytes;
    out->headroom_bytes = head;
    size_t used = p->other_bytes + head;
    size_t avail = p->free_bytes > used ? p->free_bytes - used : 0;
    out->max_blocks = (int64_t)(avail / p->block_bytes);
    if ((uint64_t)p->want_blocks > SIZE_MAX / p->block_bytes) {
        out->kv_bytes = SIZE_MAX;
        return PC_ERR_NOMEM;
    }
    out->kv_bytes = (size_t)p->want_blocks * p->block_bytes;
    return p->want_blocks <= out->max_blocks ? 0 : PC_ERR_NOMEM;
}

int krn_decode_check(const krn_kv_t *kv, int32_t n_head)
{
    if (kv->n_head_kv <= 0 || n_head <= 0 || n_head % kv->n_head_kv != 0 || kv->head_dim <= 0 ||
        kv->head_dim % 32 != 0 || kv->head_dim > KRN_ATTN_MAX_HEAD_DIM || kv->block_tokens <= 0 ||
        (kv->dtype != KRN_F16 && kv->dtype != KRN_F32 && kv->dtype != KRN_Q8_0))
        return PC_ERR_INVAL;
    int32_t group = n_head / kv->n_head_kv;
    int64_t slice = krn_decode_slice_bytes(kv->head_dim, kv->block_tokens, kv->dtype);
    if (group > 16 || group * kv->head_dim > 2048 || slice % 16 != 0 || slice > (64 << 10) ||
        krn_decode_warps_of(slice) < 1)
        return PC_ERR_INVAL;
    return 0;
}

int32_t krn_decode_split_tokens(int32_t n_sm, int32_t n_rows, int32_t n_head_kv,
                                int32_t block_tokens, int32_t max_kv_len, int32_t min_blocks)
{
    if (n_sm <= 0 || n_rows <= 0 || n_head_kv <= 0 || block_tokens <= 0 || max_kv_len <= 0 ||
        min_blocks < 0)
        return 0;
    if (min_blocks == 0)
        min_blocks = 4;
    int64_t blocks = ((int64_t)max_kv_len + block_tokens - 1) / block_tokens;
    int64_t units = (int64_t)n_rows * n_head_kv;
    int64_t want = ((int64_t)2 * n_sm + units - 1) / units; /* splits per unit */
    int64_t per = (blocks + want - 1) / want;               /* blocks per split */
    if (per < min_blocks)
        per = min_blocks;
    if (per > blocks)
        per = blocks;
    if (per * block_tokens > INT32_MAX)
        return 0;
    return (int32_t)(per * block_tokens);
}
