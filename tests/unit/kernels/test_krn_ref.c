/*
 * test_krn_ref.c — the CPU references of kernels/ against naive formulas, and against the
 * engine's own CPU code where both compute the same thing:
 *   - half/bfloat16 conversions against the engine's (every half, random floats);
 *   - the online-softmax merge header against a direct softmax, over random splits of the KV
 *     range merged in random orders;
 *   - the paged attention reference against a dense double-precision attention (random shapes,
 *     GQA ratios, block sizes, non-contiguous tables, NaN in unused slots, split and unsplit
 *     plans), and against the engine's CPU attention on the engine's real KV pool;
 *   - kv_write and block_copy against the engine's pool layout and eng_kvpool_copy;
 *   - RMSNorm, RoPE (NORM/NEOX, frequency factors), SwiGLU, adds, embedding, GEMM against
 *     textbook double formulas;
 *   - the sampler against engine/sampling.c: same token for the same uniform draw;
 *   - the fused references against the unfused ones they replace, bit for bit.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "eng_testmodel.h"
#include "engine.h"
#include "engine_internal.h" /* eng_kvpool */
#include "cpu_kernels.h"
#include "kernels.h"
#include "krn_fused_case.h"
#include "krn_hostdev.h"
#include "krn_softmax_merge.h"
#include "krn_testutil.h"
#include "kvpool.h"
#include "mkmodel.h"
#include "pc_assert.h"
#include "pc_err.h"
#include "pc_test.h"
#include "sampling.h"

PC_TEST(half_conversions_match_engine)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = krn_f16_to_f32((uint16_t)h);
        float e = eng_f16_to_f32((uint16_t)h);
        if (isnan(e)) {
            ASSERT_TRUE(isnan(f));
            continue;
        }
        ASSERT_MEM_EQ(&f, &e, sizeof f);
        ASSERT_EQ(krn_f32_to_f16(f), (uint16_t)h == 0x8000 ? 0x8000 : eng_f32_to_f16(f));
    }
    kt_rng_t r = {1};
    for (int i = 0; i < 200000; i++) {
        uint32_t bits = (uint32_t)kt_next(&r);
        float f;
        memcpy(&f, &bits, sizeof f);
        if (isnan(f))
            continue;
        ASSERT_EQ(krn_f32_to_f16(f), eng_f32_to_f16(f));
        ASSERT_EQ(krn_f32_to_bf16(f), eng_f32_to_bf16(f));
        float b = krn_bf16_to_f32(krn_f32_to_bf16(f)), eb = eng_bf16_to_f32(eng_f32_to_bf16(f));
        ASSERT_MEM_EQ(&b, &eb, sizeof b);
    }
    ASSERT_TRUE(isnan(krn_f16_to_f32(krn_f32_to_f16(NAN))));
    ASSERT_TRUE(isnan(krn_bf16_to_f32(krn_f32_to_bf16(NAN))));
}

/* The merge header: a row's scores cut into random ranges, each range run through the tile
 * update in random tiles (some fully masked), the partial states merged in a random order. */
PC_TEST(softmax_merge_matches_direct_softmax)
{
    kt_rng_t r = {7};
    enum { N = 300, D = 8 };
    for (int iter = 0; iter < 300; iter++) {
        int n = 1 + (int)kt_below(&r, N);
        float s[N], v[N][D];
        double scale = iter % 3 == 0 ? 30.0 : 3.0; /* large spreads exercise the rescaling */
        for (int j = 0; j < n; j++) {
            s[j] = (float)(kt_unif(&r) * scale);
            for (int d = 0; d < D; d++)
                v[j][d] = kt_unif(&r);
        }
        int n_masked = iter % 4 == 0 ? (int)kt_below(&r, (uint32_t)n) : 0; /* tail masked */
        /* Direct softmax in double over the unmasked scores. */
        double mx = -INFINITY, sum = 0, want[D] = {0};
        for (int j = 0; j < n - n_masked; j++)
            mx = s[j] > mx ? s[j] : mx;
        for (int j = 0; j < n - n_masked; j++)
            sum += exp(s[j] - mx);
        for (int j = 0; j < n - n_masked; j++)
            for (int d = 0; d < D; d++)
                want[d] += exp(s[j] - mx) / sum * v[j][d];
        /* Random cut points. */
        int cuts[N + 1], n_parts = 0;
        cuts[0] = 0;
        for (int j = 1; j < n; j++)
            if (kt_below(&r, 4) == 0)
                cuts[++n_parts] = j;
        cuts[++n_parts] = n;
        float pm[N], pl[N], po[N][D];
        for (int p = 0; p < n_parts; p++) {
            float m = -INFINITY, l = 0, o[D] = {0};
            for (int j0 = cuts[p]; j0 < cuts[p + 1];) {
                int tn = 1 + (int)kt_below(&r, 16);
                if (tn > cuts[p + 1] - j0)
                    tn = cuts[p + 1] - j0;
                float ts[16], tmax = -INFINITY;
                for (int j = 0; j < tn; j++) {
                    ts[j] = j0 + j < n - n_masked ? s[j0 + j] : -INFINITY;
                    tmax = ts[j] > tmax ? ts[j] : tmax;
                }
                float mn = krn_sm_max(m, tmax), c = krn_sm_scale(m, mn), ls = 0;
                for (int d = 0; d < D; d++)
                    o[d] *= c;
                for (int j = 0; j < tn; j++) {
                    float pj = krn_sm_prob(ts[j], mn);
                    ls += pj;
                    for (int d = 0; d < D; d++)
                        o[d] += pj * v[j0 + j][d];
                }
                l = l * c + ls;
                m = mn;
                j0 += tn;
            }
            pm[p] = m;
            pl[p] = l;
            memcpy(po[p], o, sizeof o);
        }
        int order[N];
        for (int p = 0; p < n_parts; p++)
            order[p] = p;
        for (int p = n_parts - 1; p > 0; p--) {
            int j = (int)kt_below(&r, (uint32_t)p + 1), x = order[p];
            order[p] = order[j];
            order[j] = x;
        }
        float m = -INFINITY, l = 0, o[D] = {0};
        for (int k = 0; k < n_parts; k++) {
            int p = order[k];
            float sa, sb;
            krn_sm_merge(&m, &l, pm[p], pl[p], &sa, &sb);
            for (int d = 0; d < D; d++)
                o[d] = o[d] * sa + po[p][d] * sb;
        }
        float inv = krn_sm_inv(l);
        if (n_masked == n) { /* nothing to attend to: zeros, never NaN */
            for (int d = 0; d < D; d++)
                ASSERT_EQ(o[d] * inv, 0.0f);
            continue;
        }
        for (int d = 0; d < D; d++)
            ASSERT_NEAR(o[d] * inv, want[d], 2e-6 + 2e-6 * fabs(want[d]));
    }
}

typedef struct attn_case {
    int32_t n_head, n_head_kv, head_dim, bt;
    enum krn_dtype dt;
} attn_case_t;

static void check_attention_case(const attn_case_t *c, kt_rng_t *r, int32_t split_kv)
{
    int32_t n_seqs = 1 + (int32_t)kt_below(r, 4), max_blocks = 1 + (int32_t)kt_below(r, 6);
    int32_t ctx[4], nt[4];
    for (int32_t s = 0; s < n_seqs; s++) {
        int32_t cap = max_blocks * c->bt;
        nt[s] = kt_below(r, 2) ? 1 : 1 + (int32_t)kt_below(r, (uint32_t)cap);
        ctx[s] = (int32_t)kt_below(r, (uint32_t)(cap - nt[s] + 1));
        if (s == 0) /* one sequence at the maximum length */
            ctx[s] = cap - nt[s];
    }
    kt_attn_t t;
    ASSERT_EQ(kt_attn_make(&t, r, c->n_head, c->n_head_kv, c->head_dim, c->bt, c->dt, n_seqs, ctx,
                           nt, max_blocks),
              0);
    krn_attn_args_t a;
    ASSERT_EQ(kt_attn_plan(&t, split_kv, &a), 0);
    ASSERT_EQ(krn_ref_attention(&a), 0);
    int64_t n = (int64_t)t.n_rows * t.n_head * c->head_dim;
    double *want = malloc(sizeof *want * (size_t)n);
    kt_attn_dense(&t, want);
    double err = kt_rel_err_d(t.out, want, n);
    free(want);
    kt_attn_plan_free(&a);
    kt_attn_free(&t);
    ASSERT_LE(err, 1e-5);
}

PC_TEST(attention_ref_matches_dense_softmax)
{
    const attn_case_t cases[] = {
        {4, 4, 16, 16, KRN_F32},  {8, 2, 32, 16, KRN_F16},   {6, 1, 8, 4, KRN_F32},
        {16, 4, 64, 32, KRN_F16}, {32, 8, 128, 16, KRN_F16}, {12, 3, 24, 7, KRN_F32},
        {64, 1, 16, 8, KRN_F32},  {8, 8, 256, 16, KRN_F16},
    };
    kt_rng_t r = {11};
    for (size_t i = 0; i < PC_ARRAY_LEN(cases); i++) {
        for (int rep = 0; rep < 3; rep++) {
            PC_TEST_CALL(check_attention_case(&cases[i], &r, 0));
            /* Split plans: decode rows over long contexts become splits + merges. */
            PC_TEST_CALL(check_attention_case(&cases[i], &r, cases[i].bt * (1 + rep)));
            PC_TEST_CALL(check_attention_case(&cases[i], &r, 5));
        }
    }
}

/* The decode kernel's reference against the dense softmax: decode rows (one token each) of
 * random lengths over NaN-poisoned pools, splits from one block to the whole context. */
PC_TEST(decode_ref_matches_dense_softmax)
{
    const attn_case_t cases[] = {
        {8, 1, 32, 16, KRN_F16},   {64, 8, 128, 16, KRN_F16}, {16, 16, 64, 8, KRN_F32},
        {32, 2, 256, 16, KRN_F16}, {4, 4, 32, 5, KRN_F32},    {24, 8, 96, 16, KRN_F16},
        {16, 4, 80, 16, KRN_F16}, /* head_dim not a multiple of 32: krn_attention's */
    };
    kt_rng_t r = {12};
    for (size_t i = 0; i < PC_ARRAY_LEN(cases); i++) {
        const attn_case_t *c = &cases[i];
        krn_kv_t probe = {.n_head_kv = c->n_head_kv,
                          .head_dim = c->head_dim,
                          .block_tokens = c->bt,
                          .dtype = c->dt};
        bool takes = krn_decode_check(&probe, c->n_head) == 0;
        for (int rep = 0; rep < 3; rep++) {
            int32_t n_seqs = 1 + (int32_t)kt_below(&r, 5),
                    max_blocks = 1 + (int32_t)kt_below(&r, 9);
            int32_t ctx[5], nt[5];
            for (int32_t s = 0; s < n_seqs; s++) {
                nt[s] = 1;
                ctx[s] = s == 0 ? max_blocks * c->bt - 1
                                : (int32_t)kt_below(&r, (uint32_t)(max_blocks * c->bt));
            }
            kt_attn_t t;
            ASSERT_EQ(kt_attn_make(&t, &r, c->n_head, c->n_head_kv, c->head_dim, c->bt, c->dt,
                                   n_seqs, ctx, nt, max_blocks),
                      0);
            int64_t n = (int64_t)t.n_rows * t.n_head * c->head_dim;
            double *want = malloc(sizeof *want * (size_t)n);
            kt_attn_dense(&t, want);
            int32_t splits[3] = {c->bt, c->bt * (1 + rep), max_blocks * c->bt};
            for (int k = 0; k < 3; k++) {
                krn_decode_args_t a;
                kt_decode_args(&t, splits[k], &a);
                for (int64_t j = 0; j < n; j++)
                    t.out[j] = NAN;
                int rc = krn_ref_decode_attention(&a);
                double err = kt_rel_err_d(t.out, want, n);
                kt_decode_free(&a);
                if (!takes) {
                    ASSERT_EQ(rc, PC_ERR_INVAL); /* a shape for krn_attention */
                    continue;
                }
                ASSERT_EQ(rc, 0);
                ASSERT_LE(err, 1e-5);
            }
            /* A split that is not a whole number of blocks, and a position past the table. */
            krn_decode_args_t a;
            kt_decode_args(&t, c->bt + 1, &a);
            ASSERT_EQ(krn_ref_decode_attention(&a), PC_ERR_INVAL);
            kt_decode_free(&a);
            kt_decode_args(&t, c->bt, &a);
            a.max_blocks = max_blocks - 1;
            if (max_blocks > 1)
                ASSERT_EQ(krn_ref_decode_attention(&a), PC_ERR_INVAL);
            kt_decode_free(&a);
            free(want);
            kt_attn_free(&t);
        }
    }
}

PC_TEST(plan_covers_every_row_head_once)
{
    krn_plan_seq_t seqs[3] = {{0, 1, 1000}, {1, 70, 5}, {71, 1, 3}};
    krn_plan_params_t p = {.n_head = 8, .n_head_kv = 2, .head_dim = 64, .split_kv = 256};
    int32_t nt, nm, np;
    ASSERT_EQ(krn_attn_plan(&p, seqs, 3, NULL, &nt, NULL, &nm, &np), 0);
    krn_attn_task_t tasks[64];
    krn_attn_merge_t merges[8];
    ASSERT_TRUE(nt <= 64 && nm <= 8);
    ASSERT_EQ(krn_attn_plan(&p, seqs, 3, tasks, &nt, merges, &nm, &np), 0);
    /* Seq 0: 1001 positions in 4 splits x 2 heads; seq 1: 70 tokens in 16-token tasks. */
    ASSERT_EQ(nm, 2);
    ASSERT_EQ(np, 2 * 4 * 4);
    ASSERT_EQ(nt, 8 + 2 * 5 + 2);
    int cover[72][2] = {{0}};
    for (int32_t i = 0; i < nt; i++) {
        ASSERT_TRUE(tasks[i].n_rows * 4 <= KRN_ATTN_MAX_ROWS);
        ASSERT_TRUE(tasks[i].kv1 <= seqs[tasks[i].seq].pos0 +
                                        (tasks[i].row0 - seqs[tasks[i].seq].row0) +
                                        tasks[i].n_rows);
        if (tasks[i].part < 0)
            for (int32_t j = 0; j < tasks[i].n_rows; j++)
                cover[tasks[i].row0 + j][tasks[i].kv_head]++;
    }
    for (int32_t i = 0; i < nm; i++)
        for (int32_t j = 0; j < merges[i].n_rows; j++)
            cover[merges[i].row0 + j][merges[i].kv_head]++;
    for (int i = 0; i < 72; i++)
        for (int h = 0; h < 2; h++)
            ASSERT_EQ(cover[i][h], 1);
    p.n_head = 256; /* group 128 > KRN_ATTN_MAX_ROWS */
    ASSERT_EQ(krn_attn_plan(&p, seqs, 3, NULL, &nt, NULL, &nm, &np), PC_ERR_INVAL);
    p = (krn_plan_params_t){.n_head = 8, .n_head_kv = 3, .head_dim = 64};
    ASSERT_EQ(krn_attn_plan(&p, seqs, 3, NULL, &nt, NULL, &nm, &np), PC_ERR_INVAL);
}

/* The plan's invariants over random shapes and batches: the counting pass agrees with the
 * filling pass; every task fits the CTA that runs it (krn_attn_max_rows, the kernel's own
 * geometry); every (row, KV head) is produced exactly once, by a direct task or a merge; an
 * unsplit task attends over [0, its last position + 1); the splits of a merge are single-row
 * tasks that tile [0, kv_len) in order, at most split_kv each, writing consecutive partial
 * slots that no other unit uses, all below n_parts. */
static void check_plan(const krn_plan_params_t *p, const krn_plan_seq_t *seqs, int32_t n_seqs,
                       int32_t n_rows)
{
    int32_t nt = -1, nm = -1, np = -1;
    ASSERT_EQ(krn_attn_plan(p, seqs, n_seqs, NULL, &nt, NULL, &nm, &np), 0);
    krn_attn_task_t *tasks = malloc(sizeof *tasks * ((size_t)nt + 1));
    krn_attn_merge_t *merges = malloc(sizeof *merges * ((size_t)nm + 1));
    int32_t nt2, nm2, np2;
    ASSERT_EQ(krn_attn_plan(p, seqs, n_seqs, tasks, &nt2, merges, &nm2, &np2), 0);
    ASSERT_EQ(nt2, nt);
    ASSERT_EQ(nm2, nm);
    ASSERT_EQ(np2, np);
    int32_t group = p->n_head / p->n_head_kv, r_max = krn_attn_max_rows(p->head_dim);
    int32_t *cover = calloc((size_t)n_rows * p->n_head_kv, sizeof *cover);
    uint8_t *part_used = calloc((size_t)np + 1, 1);
    int32_t *row_seq = malloc(sizeof *row_seq * (size_t)n_rows);
    for (int32_t s = 0; s < n_seqs; s++)
        for (int32_t j = 0; j < seqs[s].n_tokens; j++)
            row_seq[seqs[s].row0 + j] = s;
    int32_t n_split_tasks = 0;
    int32_t *task_of_part = malloc(sizeof *task_of_part * ((size_t)np + 1));
    for (int32_t i = 0; i < np; i++)
        task_of_part[i] = -1;
    for (int32_t i = 0; i < nt; i++) {
        const krn_attn_task_t *t = &tasks[i];
        ASSERT_TRUE(t->n_rows >= 1 && t->n_rows * group <= r_max);
        ASSERT_TRUE(t->n_rows * group * p->head_dim <= KRN_ATTN_MAX_TILE);
        ASSERT_TRUE(t->seq >= 0 && t->seq < n_seqs && t->kv_head >= 0 && t->kv_head < p->n_head_kv);
        const krn_plan_seq_t *sq = &seqs[t->seq];
        ASSERT_TRUE(t->row0 >= sq->row0 && t->row0 + t->n_rows <= sq->row0 + sq->n_tokens);
        int32_t last_pos = sq->pos0 + (t->row0 - sq->row0) + t->n_rows - 1;
        if (t->part < 0) {
            ASSERT_EQ(t->kv0, 0);
            ASSERT_EQ(t->kv1, last_pos + 1);
            for (int32_t j = 0; j < t->n_rows; j++)
                cover[(int64_t)(t->row0 + j) * p->n_head_kv + t->kv_head]++;
        } else {
            n_split_tasks++;
            ASSERT_EQ(t->n_rows, 1);
            ASSERT_TRUE(t->kv0 >= 0 && t->kv0 < t->kv1 && t->kv1 <= last_pos + 1);
            ASSERT_TRUE(t->kv1 - t->kv0 <= p->split_kv);
            ASSERT_TRUE(t->part >= 0 && t->part + group <= np);
            ASSERT_EQ(task_of_part[t->part], -1);
            task_of_part[t->part] = i;
        }
    }
    for (int32_t i = 0; i < nm; i++) {
        const krn_attn_merge_t *m = &merges[i];
        ASSERT_EQ(m->n_rows, 1);
        ASSERT_TRUE(m->n_splits >= 2);
        int32_t s = row_seq[m->row0];
        int32_t kv_len = seqs[s].pos0 + (m->row0 - seqs[s].row0) + 1;
        ASSERT_TRUE(kv_len > p->split_kv);
        ASSERT_EQ(m->n_splits, (kv_len + p->split_kv - 1) / p->split_kv);
        cover[(int64_t)m->row0 * p->n_head_kv + m->kv_head]++;
        /* Its splits, in order: the task writing slot part0 + k * group. */
        int32_t want_kv0 = 0;
        for (int32_t k = 0; k < m->n_splits; k++) {
            int32_t part = m->part0 + k * group;
            ASSERT_TRUE(part >= 0 && part < np);
            int32_t found = task_of_part[part];
            ASSERT_TRUE(found >= 0);
            const krn_attn_task_t *t = &tasks[found];
            ASSERT_EQ(t->row0, m->row0);
            ASSERT_EQ(t->kv_head, m->kv_head);
            ASSERT_EQ(t->kv0, want_kv0);
            want_kv0 = t->kv1;
            for (int32_t g = 0; g < group; g++) {
                ASSERT_EQ(part_used[part + g], 0);
                part_used[part + g] = 1;
            }
        }
        ASSERT_EQ(want_kv0, kv_len);
    }
    int32_t parts_seen = 0;
    for (int32_t i = 0; i < np; i++)
        parts_seen += part_used[i];
    ASSERT_EQ(parts_seen, np);
    ASSERT_EQ(n_split_tasks * group, np);
    for (int64_t i = 0; i < (int64_t)n_rows * p->n_head_kv; i++)
        ASSERT_EQ(cover[i], 1);
    free(tasks);
    free(merges);
    free(cover);
    free(part_used);
    free(row_seq);
    free(task_of_part);
}

PC_TEST(plan_invariants_on_random_batches)
{
    kt_rng_t r = {13};
    for (int iter = 0; iter < 400; iter++) {
        int32_t n_head_kv = 1 + (int32_t)kt_below(&r, 8);
        int32_t group = 1 + (int32_t)kt_below(&r, iter % 4 == 0 ? 64 : 8);
        int32_t hd = 2 * (1 + (int32_t)kt_below(&r, KRN_ATTN_MAX_HEAD_DIM / 2));
        if (krn_attn_max_rows(hd) < group)
            hd = 2 * (1 + (int32_t)kt_below(&r, KRN_ATTN_MAX_TILE / (2 * group)));
        krn_plan_params_t p = {.n_head = n_head_kv * group,
                               .n_head_kv = n_head_kv,
                               .head_dim = hd,
                               .split_kv = iter % 3 == 0 ? 0 : 1 + (int32_t)kt_below(&r, 600)};
        enum { MAX_SEQS = 6 };
        krn_plan_seq_t seqs[MAX_SEQS];
        int32_t n_seqs = 1 + (int32_t)kt_below(&r, MAX_SEQS), row = 0;
        for (int32_t s = 0; s < n_seqs; s++) {
            int32_t n = kt_below(&r, 2) ? 1 : 1 + (int32_t)kt_below(&r, 300);
            seqs[s] =
                (krn_plan_seq_t){.row0 = row, .n_tokens = n, .pos0 = (int32_t)kt_below(&r, 5000)};
            row += n;
        }
        PC_TEST_CALL(check_plan(&p, seqs, n_seqs, row));
    }
}

PC_TEST(plan_refuses_what_the_kernel_cannot_take)
{
    krn_plan_seq_t one = {0, 1, 0};
    int32_t nt, nm, np;
    krn_plan_params_t p = {.n_head = 8, .n_head_kv = 2, .head_dim = 64, .split_kv = 0};
    ASSERT_EQ(krn_attn_plan(&p, &one, 1, NULL, &nt, NULL, &nm, &np), 0);
    const krn_plan_params_t bad[] = {
        {.n_head = 8, .n_head_kv = 3, .head_dim = 64},  /* heads not a multiple of KV heads */
        {.n_head = 8, .n_head_kv = 2, .head_dim = 63},  /* odd head_dim */
        {.n_head = 8, .n_head_kv = 2, .head_dim = 258}, /* head_dim > 256 */
        {.n_head = 8, .n_head_kv = 2, .head_dim = 0},
        {.n_head = 130, .n_head_kv = 2, .head_dim = 64},      /* group 65 > KRN_ATTN_MAX_ROWS */
        {.n_head = 64, .n_head_kv = 1, .head_dim = 256},      /* group 64 x 256 > the tile */
        {.n_head = 1 << 30, .n_head_kv = 1, .head_dim = 256}, /* group * head_dim overflows */
        {.n_head = 8, .n_head_kv = 2, .head_dim = 64, .split_kv = -1},
    };
    for (size_t i = 0; i < PC_ARRAY_LEN(bad); i++) {
        nt = nm = np = 7;
        ASSERT_EQ(krn_attn_plan(&bad[i], &one, 1, NULL, &nt, NULL, &nm, &np), PC_ERR_INVAL);
        ASSERT_EQ(nt + nm + np, 0);
    }
    /* group 32 with head_dim 256: exactly the tile (32 x 256 = 8192), one token per task. */
    p = (krn_plan_params_t){.n_head = 32, .n_head_kv = 1, .head_dim = 256};
    krn_plan_seq_t three = {0, 3, 0};
    ASSERT_EQ(krn_attn_plan(&p, &three, 1, NULL, &nt, NULL, &nm, &np), 0);
    ASSERT_EQ(nt, 3);
    /* Positions near INT32_MAX: the last position + 1 must fit. */
    p = (krn_plan_params_t){.n_head = 8, .n_head_kv = 2, .head_dim = 64, .split_kv = 1 << 24};
    krn_plan_seq_t far = {0, 2, INT32_MAX - 2};
    ASSERT_EQ(krn_attn_plan(&p, &far, 1, NULL, &nt, NULL, &nm, &np), 0);
    far.pos0 = INT32_MAX - 1;
    ASSERT_EQ(krn_attn_plan(&p, &far, 1, NULL, &nt, NULL, &nm, &np), PC_ERR_INVAL);
    /* A decode token at position INT32_MAX - 1 splits into ceil(2^31 - 1 / split) ranges whose
     * ends never overflow: the last split ends exactly at kv_len. */
    far = (krn_plan_seq_t){0, 1, INT32_MAX - 1};
    ASSERT_EQ(krn_attn_plan(&p, &far, 1, NULL, &nt, NULL, &nm, &np), 0);
    ASSERT_EQ(nm, 2);
    ASSERT_EQ(nt, 2 * 128);
    krn_attn_task_t *tasks = malloc(sizeof *tasks * (size_t)nt);
    krn_attn_merge_t merges[2];
    ASSERT_EQ(krn_attn_plan(&p, &far, 1, tasks, &nt, merges, &nm, &np), 0);
    for (int32_t i = 0; i < nt; i++) {
        ASSERT_TRUE(tasks[i].kv0 < tasks[i].kv1);
        ASSERT_EQ(tasks[i].kv0, (i % 128) << 24);
        if (i % 128 == 127)
            ASSERT_EQ(tasks[i].kv1, INT32_MAX);
    }
    free(tasks);
}

/* The attention CTA's geometry for every head_dim the kernels take: the chunk is a warp's
 * lanes at most and its K/V tiles fit 4096 elements, the row tile fits KRN_ATTN_MAX_TILE, and
 * the dynamic shared memory (which needs the opt-in attribute above 48 KiB) stays within what
 * sm_80 allows a CTA (163 KiB), at most 73 KiB. */
/* The cuda backend's attention for one step, composed from the references as the backend
 * composes the kernels (engine/cuda/backend_cuda.c, cuda_step and layer_attention): the
 * leading single-token rows on the decode kernel with krn_step_decode_shape's split and grid
 * (krn_decode_step_plan; partials sized by krn_decode_part_slots), the sequences after them on
 * krn_attn_plan's tasks made over those sequences alone, task seq indices shifted back. Decode
 * steps, mixed steps (decode rows, then prefill chunks, single-token chunks among them) and
 * prefill steps, on a 132-SM and an 8-SM device (many splits), against the dense softmax. */
PC_TEST(step_attention_composition_matches_dense)
{
    const attn_case_t cases[] = {{8, 2, 32, 8, KRN_F16},
                                 {16, 4, 64, 16, KRN_F32},
                                 {32, 8, 128, 16, KRN_F16},
                                 {8, 2, 16, 8, KRN_F16}}; /* head_dim 16: the plan only */
    static const int32_t sms[2] = {132, 8};
    kt_rng_t r = {13};
    for (size_t ci = 0; ci < PC_ARRAY_LEN(cases); ci++) {
        const attn_case_t *c = &cases[ci];
        for (int rep = 0; rep < 8; rep++) {
            int32_t n_sm = sms[rep % 2], n_seqs = 1 + (int32_t)kt_below(&r, 6);
            int32_t n_dec = rep % 4 == 0 ? n_seqs : (int32_t)kt_below(&r, (uint32_t)n_seqs + 1);
            int32_t max_blocks = 4 + (int32_t)kt_below(&r, 40), cap = max_blocks * c->bt;
            int32_t ctx[6], nt[6];
            for (int32_t s = 0; s < n_seqs; s++) {
                nt[s] = s < n_dec || kt_below(&r, 4) == 0 ? 1 : 2 + (int32_t)kt_below(&r, 40);
                nt[s] = nt[s] > cap ? cap : nt[s];
                ctx[s] = s == 0 ? cap - nt[s] : (int32_t)kt_below(&r, (uint32_t)(cap - nt[s] + 1));
            }
            kt_attn_t t;
            ASSERT_EQ(kt_attn_make(&t, &r, c->n_head, c->n_head_kv, c->head_dim, c->bt, c->dt,
                                   n_seqs, ctx, nt, max_blocks),
                      0);
            int64_t n = (int64_t)t.n_rows * t.n_head * c->head_dim;
            for (int64_t j = 0; j < n; j++)
                t.out[j] = NAN;
            int32_t n_lead = 0;
            while (n_lead < n_seqs && nt[n_lead] == 1)
                n_lead++;
            bool use = krn_decode_use(&t.kv, t.n_head, NULL);
            int64_t slots = krn_decode_part_slots(n_sm, t.n_rows, t.n_head, c->n_head_kv);
            krn_step_shape_t sh = {.n_rows = t.n_rows, .n_seqs = n_seqs, .max_blocks = max_blocks};
            bool dec = krn_step_decode_shape(&sh, t.row_pos, n_lead, use, n_sm, t.n_head,
                                             c->n_head_kv, c->bt, slots);
            ASSERT_EQ(dec, use && n_lead > 0); /* the partials always fit the allocation */
            if (dec) {
                krn_decode_args_t da = {
                    .kv = t.kv,
                    .layer = t.layer,
                    .n_head = t.n_head,
                    .q = t.q,
                    .out = t.out,
                    .row_seq = t.row_seq,
                    .row_pos = t.row_pos,
                    .block_tables = t.tables,
                    .max_blocks = max_blocks,
                    .n_rows = sh.dec_rows,
                    .split_tokens = sh.dec_split,
                    .max_splits = sh.dec_splits,
                    .part_o = malloc(sizeof(float) * ((size_t)slots * c->head_dim + 1)),
                    .part_ml = malloc(sizeof(float) * ((size_t)slots * 2 + 1))};
                int rc = krn_ref_decode_attention(&da);
                free(da.part_o);
                free(da.part_ml);
                ASSERT_EQ(rc, 0);
            }
            int32_t plan0 = sh.dec_rows, plan_n = n_seqs - plan0;
            if (plan_n > 0) {
                krn_plan_params_t pp = {.n_head = t.n_head,
                                        .n_head_kv = c->n_head_kv,
                                        .head_dim = c->head_dim,
                                        .split_kv = c->bt * 2};
                int32_t nts, nms, nps;
                ASSERT_EQ(krn_attn_plan(&pp, t.seqs + plan0, plan_n, NULL, &nts, NULL, &nms, &nps),
                          0);
                krn_attn_task_t *tasks = malloc(sizeof *tasks * (size_t)nts);
                krn_attn_merge_t *merges = malloc(sizeof *merges * ((size_t)nms + 1));
                ASSERT_EQ(
                    krn_attn_plan(&pp, t.seqs + plan0, plan_n, tasks, &nts, merges, &nms, &nps), 0);
                for (int32_t i = 0; i < nts; i++)
                    tasks[i].seq += plan0;
                krn_attn_args_t aa = {.kv = t.kv,
                                      .layer = t.layer,
                                      .n_head = t.n_head,
                                      .q = t.q,
                                      .out = t.out,
                                      .row_pos = t.row_pos,
                                      .block_tables = t.tables,
                                      .max_blocks = max_blocks,
                                      .tasks = tasks,
                                      .n_tasks = nts,
                                      .merges = merges,
                                      .n_merges = nms,
                                      .part_o =
                                          malloc(sizeof(float) * ((size_t)nps * c->head_dim + 1)),
                                      .part_ml = malloc(sizeof(float) * ((size_t)nps * 2 + 1))};
                int rc = krn_ref_attention(&aa);
                free(aa.part_o);
                free(aa.part_ml);
                free(tasks);
                free(merges);
                ASSERT_EQ(rc, 0);
            }
            double *want = malloc(sizeof *want * (size_t)n);
            kt_attn_dense(&t, want);
            double err = kt_rel_err_d(t.out, want, n);
            free(want);
            kt_attn_free(&t);
            if (!(err <= 1e-5))
                PC_TEST__FAIL("case %zu rep %d (%d sequences, %d decode rows leading, %d on the "
                              "decode kernel, split %d x %d): relative error %g (> 1e-5)",
                              ci, rep, n_seqs, n_lead, sh.dec_rows, sh.dec_split, sh.dec_splits,
                              err);
        }
    }
}

PC_TEST(attention_geometry_fits_the_cta)
{
    size_t max_smem = 0;
    for (int32_t hd = 2; hd <= KRN_ATTN_MAX_HEAD_DIM; hd += 2) {
        int32_t c = krn_attn_chunk(hd), r = krn_attn_max_rows(hd);
        ASSERT_TRUE(c >= 1 && c <= 32 && c * hd <= 4096);
        ASSERT_TRUE(r >= 1 && r <= KRN_ATTN_MAX_ROWS && r * hd <= KRN_ATTN_MAX_TILE);
        /* Every element of the R x hd tile has a register slot in some thread. */
        ASSERT_TRUE(r * hd <= KRN_ATTN_THREADS * (KRN_ATTN_MAX_TILE / KRN_ATTN_THREADS));
        size_t smem = krn_attn_smem_bytes(hd);
        size_t want = 4 * ((size_t)r * hd + 2 * (size_t)c * hd + (size_t)r * c + 3 * (size_t)r) +
                      4 * (size_t)r;
        ASSERT_EQ(smem, want);
        max_smem = smem > max_smem ? smem : max_smem;
    }
    ASSERT_EQ(krn_attn_smem_bytes(128), (size_t)74752); /* the common shape: needs the opt-in */
    ASSERT_TRUE(krn_attn_smem_bytes(128) > 48 * 1024);
    ASSERT_TRUE(max_smem <= 73 * 1024 && max_smem <= 163 * 1024);
}

/* The KV index helpers in int64 for pools far past 2^31 elements. */
PC_TEST(kv_index_math_is_64_bit)
{
    krn_kv_t kv = {.n_blocks = INT32_MAX,
                   .n_layer = 80,
                   .n_head_kv = 8,
                   .head_dim = 128,
                   .block_tokens = 16,
                   .dtype = KRN_F16};
    ASSERT_EQ(krn_kv_slice_elems(&kv), (int64_t)4096);
    ASSERT_EQ(krn_kv_block_bytes(&kv), (size_t)80 * 8 * 4096 * 2);
    int32_t b = INT32_MAX - 1, l = 79, h = 7;
    uint64_t want = (((uint64_t)b * 80 + 79) * 8 + 7) * 4096;
    ASSERT_EQ((uint64_t)krn_kv_slice_offset(&kv, b, l, h), want);
    ASSERT_TRUE(krn_kv_slice_offset(&kv, b, l, h) > (int64_t)INT32_MAX * 4096);
    /* Slice offsets step by slices, blocks by a whole block's elements. */
    ASSERT_EQ(krn_kv_slice_offset(&kv, 5, 0, 1) - krn_kv_slice_offset(&kv, 5, 0, 0), 4096);
    ASSERT_EQ((size_t)(krn_kv_slice_offset(&kv, 6, 0, 0) - krn_kv_slice_offset(&kv, 5, 0, 0)) * 2,
              krn_kv_block_bytes(&kv));
}

/* kv_write into the engine's real pool (its memory as krn_kv_t), then the engine's CPU
 * attention and the reference over the same blocks; eng_kvpool_copy vs krn_ref_block_copy. */
static void check_vs_engine(uint32_t n_head, uint32_t n_head_kv, uint32_t hd, uint32_t bt,
                            enum eng_kv_dtype edt, kt_rng_t *r)
{
    uint32_t n_layer = 2, layer = 1;
    eng_kvpool_params_t kp = eng_kvpool_params_default();
    kp.block_tokens = bt;
    kp.dtype = edt;
    kp.max_tokens = 64 * bt;
    kp.poison = true;
    eng_kvpool_t *pool;
    ASSERT_EQ(eng_kvpool_init(&kp, n_layer, n_head_kv, hd, &pool), 0);
    uint32_t nb = eng_kvpool_n_blocks(pool);
    krn_kv_t kv = {.base = eng_kvpool_kv(pool, 0, 0, 0),
                   .n_blocks = (int32_t)nb,
                   .n_layer = (int32_t)n_layer,
                   .n_head_kv = (int32_t)n_head_kv,
                   .head_dim = (int32_t)hd,
                   .block_tokens = (int32_t)bt,
                   .dtype = edt == ENG_KV_F16 ? KRN_F16 : KRN_F32};
    ASSERT_EQ((size_t)krn_kv_block_bytes(&kv), eng_kvpool_block_bytes(pool));
    /* Allocate every block (poisoning them), then use a shuffled subset as two tables. */
    uint32_t ids[64];
    for (uint32_t i = 0; i < nb; i++)
        ASSERT_EQ(eng_kvpool_alloc(pool, &ids[i]), 0);
    for (uint32_t i = nb - 1; i > 0; i--) {
        uint32_t j = kt_below(r, i + 1), x = ids[i];
        ids[i] = ids[j];
        ids[j] = x;
    }
    enum { MAXB = 8 };
    int32_t tables[2 * MAXB];
    for (int i = 0; i < 2 * MAXB; i++)
        tables[i] = (int32_t)ids[i];
    int32_t len[2] = {MAXB * (int32_t)bt, 1 + (int32_t)kt_below(r, MAXB * bt)};
    int32_t n_rows = len[0] + len[1];
    int32_t wk = (int32_t)(n_head_kv * hd), wq = (int32_t)(n_head * hd);
    float *k = malloc(sizeof *k * (size_t)n_rows * wk),
          *v = malloc(sizeof *v * (size_t)n_rows * wk);
    float *q = malloc(sizeof *q * (size_t)n_rows * wq);
    float *o1 = malloc(sizeof *o1 * (size_t)n_rows * wq),
          *o2 = malloc(sizeof *o2 * (size_t)n_rows * wq);
    int32_t *pos = malloc(sizeof *pos * (size_t)n_rows),
            *seq = malloc(sizeof *seq * (size_t)n_rows);
    uint32_t *upos = malloc(sizeof *upos * (size_t)n_rows);
    for (int64_t i = 0; i < (int64_t)n_rows * wk; i++) {
        k[i] = kt_unif(r);
        v[i] = kt_unif(r);
    }
    for (int64_t i = 0; i < (int64_t)n_rows * wq; i++)
        q[i] = kt_unif(r) * 0.5f;
    for (int32_t i = 0; i < n_rows; i++) {
        seq[i] = i < len[0] ? 0 : 1;
        pos[i] = i < len[0] ? i : i - len[0];
        upos[i] = (uint32_t)pos[i];
    }
    krn_kv_write_args_t w = {.kv = kv,
                             .layer = (int32_t)layer,
                             .k = k,
                             .v = v,
                             .row_seq = seq,
                             .row_pos = pos,
                             .block_tables = tables,
                             .n_rows = n_rows,
                             .max_blocks = MAXB};
    ASSERT_EQ(krn_ref_kv_write(&w), 0);
    /* The layout, read back through the engine's accessor. */
    for (int32_t i = 0; i < n_rows; i += 3) {
        uint32_t b = (uint32_t)tables[seq[i] * MAXB + pos[i] / (int32_t)bt],
                 slot = (uint32_t)pos[i] % bt;
        for (uint32_t h = 0; h < n_head_kv; h++) {
            const void *s = eng_kvpool_kv(pool, b, layer, h);
            for (uint32_t d = 0; d < hd; d++) {
                float kk = edt == ENG_KV_F16 ? eng_f16_to_f32(((const uint16_t *)s)[d * bt + slot])
                                             : ((const float *)s)[d * bt + slot];
                float vv = edt == ENG_KV_F16
                               ? eng_f16_to_f32(((const uint16_t *)s)[hd * bt + slot * hd + d])
                               : ((const float *)s)[hd * bt + slot * hd + d];
                ASSERT_NEAR(kk, k[(int64_t)i * wk + h * hd + d], 1e-3);
                ASSERT_NEAR(vv, v[(int64_t)i * wk + h * hd + d], 1e-3);
            }
        }
    }
    /* The engine's attention, every row: the AVX-512 path (where the CPU has it) and the
     * portable one, each against the reference. */
    for (int simd = 1; simd >= 0; simd--) {
        const uint32_t *eng_tables[2] = {(const uint32_t *)&tables[0],
                                         (const uint32_t *)&tables[MAXB]};
        eng_attn_args_t ea = {.q = q,
                              .out = o1,
                              .pos = upos,
                              .blocks = eng_tables,
                              .kvpool = pool,
                              .layer = layer,
                              .n_head = n_head,
                              .n_head_kv = n_head_kv,
                              .head_dim = hd,
                              .block_tokens = bt,
                              .kv_f16 = edt == ENG_KV_F16,
                              .simd = simd == 1};
        uint32_t group = n_head / n_head_kv, per = 64 / group > 16 ? 16 : 64 / group;
        float *scratch = malloc(sizeof(float) * eng__attention_scratch_floats(hd, bt, 64));
        for (int32_t s = 0; s < 2; s++) {
            int32_t r0 = s == 0 ? 0 : len[0];
            for (uint32_t h = 0; h < n_head_kv; h++)
                for (int32_t t0 = 0; t0 < len[s]; t0 += (int32_t)per) {
                    eng_attn_task_t task = {
                        .seq = (uint32_t)s,
                        .kv_head = h,
                        .t0 = (uint32_t)(r0 + t0),
                        .t1 = (uint32_t)(r0 + (t0 + (int32_t)per < len[s] ? t0 + (int32_t)per
                                                                          : len[s]))};
                    eng__attention(&ea, &task, scratch);
                }
        }
        free(scratch);
        kt_attn_t t = {.kv = kv,
                       .layer = (int32_t)layer,
                       .n_head = (int32_t)n_head,
                       .n_seqs = 2,
                       .max_blocks = MAXB,
                       .n_rows = n_rows,
                       .tables = tables,
                       .row_pos = pos,
                       .row_seq = seq,
                       .q = q,
                       .out = o2};
        krn_plan_seq_t ps[2] = {{0, len[0], 0}, {len[0], len[1], 0}};
        t.seqs = ps;
        krn_attn_args_t a;
        ASSERT_EQ(kt_attn_plan(&t, 0, &a), 0);
        ASSERT_EQ(krn_ref_attention(&a), 0);
        double err = kt_rel_err_f(o2, o1, (int64_t)n_rows * wq);
        kt_attn_plan_free(&a);
        ASSERT_LE(err, 1e-5);
    }

    /* Block copies: the engine's (poisoned pools copy only the valid slots) vs the reference
     * on a byte copy of the pool. */
    size_t bytes = (size_t)nb * eng_kvpool_block_bytes(pool);
    uint8_t *shadow = malloc(bytes);
    memcpy(shadow, kv.base, bytes);
    krn_kv_t kv2 = kv;
    kv2.base = shadow;
    int32_t src[3] = {tables[0], tables[1], tables[MAXB]},
            dst[3] = {tables[2], tables[MAXB + 1], tables[3]};
    int32_t ntok[3] = {(int32_t)bt, (int32_t)kt_below(r, bt), 1};
    for (int i = 0; i < 3; i++)
        eng_kvpool_copy(pool, (uint32_t)dst[i], (uint32_t)src[i], (uint32_t)ntok[i]);
    krn_block_copy_args_t bc = {.kv = kv2, .src = src, .dst = dst, .n_tokens = ntok, .n = 3};
    ASSERT_EQ(krn_ref_block_copy(&bc), 0);
    int same = memcmp(shadow, kv.base, bytes) == 0;
    free(shadow);
    free(k);
    free(v);
    free(q);
    free(o1);
    free(o2);
    free(pos);
    free(seq);
    free(upos);
    for (uint32_t i = 0; i < nb; i++)
        eng_kvpool_unref(pool, i);
    eng_kvpool_free(pool);
    ASSERT_TRUE(same);
}

PC_TEST(reference_matches_engine_cpu_attention_and_pool)
{
    kt_rng_t r = {5};
    PC_TEST_CALL(check_vs_engine(4, 2, 16, 16, ENG_KV_F16, &r));
    PC_TEST_CALL(check_vs_engine(8, 8, 32, 16, ENG_KV_F32, &r));
    PC_TEST_CALL(check_vs_engine(12, 2, 8, 4, ENG_KV_F16, &r));
    PC_TEST_CALL(check_vs_engine(4, 1, 64, 8, ENG_KV_F32, &r));
}

PC_TEST(elementwise_refs_match_formulas)
{
    kt_rng_t r = {3};
    enum { R = 5, W = 48, H = 3, HD = 16 };
    float x[R * W], y[R * W], w[W], u[R * W], x0[R * W];
    for (int i = 0; i < R * W; i++) {
        x[i] = x0[i] = kt_unif(&r) * 3;
        u[i] = kt_unif(&r);
    }
    for (int i = 0; i < W; i++)
        w[i] = kt_unif(&r);
    krn_rmsnorm_args_t rn = {.x = x, .w = w, .y = y, .n_rows = R, .width = W, .eps = 1e-5f};
    ASSERT_EQ(krn_ref_rmsnorm(&rn), 0);
    for (int i = 0; i < R; i++) {
        double ss = 0;
        for (int j = 0; j < W; j++)
            ss += (double)x[i * W + j] * x[i * W + j];
        for (int j = 0; j < W; j++)
            ASSERT_NEAR(y[i * W + j], x[i * W + j] / sqrt(ss / W + 1e-5) * w[j], 1e-5);
    }
    /* RoPE: NORM and NEOX, partial rope_dim, frequency factors, post scale. */
    for (int style = 0; style < 2; style++) {
        float rx[R * H * HD], inv[HD / 2], fac[HD / 2];
        int32_t pos[R] = {0, 1, 17, 4095, 131071};
        int rope_dim = style ? HD : HD - 4;
        for (int i = 0; i < rope_dim / 2; i++) {
            fac[i] = 1.0f + (float)i / 3;
            inv[i] = (float)(pow(500000.0, -2.0 * i / rope_dim) / fac[i]);
        }
        for (int i = 0; i < R * H * HD; i++)
            rx[i] = kt_unif(&r);
        float orig[R * H * HD];
        memcpy(orig, rx, sizeof rx);
        krn_rope_args_t ra = {.x = rx,
                              .pos = pos,
                              .inv_freq = inv,
                              .n_rows = R,
                              .n_heads = H,
                              .head_dim = HD,
                              .rope_dim = rope_dim,
                              .style = style ? KRN_ROPE_NEOX : KRN_ROPE_NORM,
                              .post_scale = 0.25f};
        ASSERT_EQ(krn_ref_rope(&ra), 0);
        for (int i = 0; i < R; i++)
            for (int h = 0; h < H; h++) {
                const float *o = orig + (i * H + h) * HD;
                const float *g = rx + (i * H + h) * HD;
                for (int k = 0; k < rope_dim / 2; k++) {
                    double th = pos[i] * pow(500000.0, -2.0 * k / rope_dim) / fac[k];
                    int a = style ? k : 2 * k, b = style ? k + rope_dim / 2 : 2 * k + 1;
                    ASSERT_NEAR(g[a], 0.25 * (o[a] * cos(th) - o[b] * sin(th)), 2e-4);
                    ASSERT_NEAR(g[b], 0.25 * (o[a] * sin(th) + o[b] * cos(th)), 2e-4);
                }
                for (int d = rope_dim; d < HD; d++)
                    ASSERT_NEAR(g[d], 0.25 * o[d], 1e-7);
            }
    }
    krn_rope_args_t bad = {.x = x, .n_rows = 1, .n_heads = 1, .head_dim = 4, .rope_dim = 6};
    ASSERT_EQ(krn_ref_rope(&bad), PC_ERR_INVAL);
    /* SwiGLU, add, bias add. */
    krn_swiglu_args_t sg = {.g = x, .u = u, .n = R * W};
    ASSERT_EQ(krn_ref_swiglu(&sg), 0);
    for (int i = 0; i < R * W; i++)
        ASSERT_NEAR(x[i], x0[i] / (1 + exp(-x0[i])) * u[i], 1e-6);
    memcpy(x, x0, sizeof x);
    krn_add_args_t ad = {.x = x, .y = u, .n = R * W};
    ASSERT_EQ(krn_ref_add(&ad), 0);
    krn_bias_add_args_t ba = {.x = x, .b = w, .n_rows = R, .width = W};
    ASSERT_EQ(krn_ref_bias_add(&ba), 0);
    for (int i = 0; i < R * W; i++)
        ASSERT_NEAR(x[i], (double)x0[i] + u[i] + w[i % W], 1e-6);
    /* Embedding gather from F16, BF16 and F32 tables. */
    float table[10 * W];
    uint16_t t16[10 * W];
    for (int i = 0; i < 10 * W; i++)
        table[i] = kt_unif(&r);
    int32_t ids[4] = {9, 0, 3, 9};
    for (int dt = 0; dt < 3; dt++) {
        for (int i = 0; i < 10 * W; i++)
            t16[i] = dt == 1 ? krn_f32_to_f16(table[i]) : krn_f32_to_bf16(table[i]);
        krn_embed_args_t ea = {.table = dt == 0 ? (const void *)table : t16,
                               .ids = ids,
                               .out = y,
                               .n_rows = 4,
                               .width = W,
                               .n_vocab = 10,
                               .table_dtype = (enum krn_dtype)dt};
        ASSERT_EQ(krn_ref_embed(&ea), 0);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < W; j++)
                ASSERT_NEAR(y[i * W + j], table[ids[i] * W + j], dt == 0 ? 0 : 1e-2);
        ids[1] = 10;
        ASSERT_EQ(krn_ref_embed(&ea), PC_ERR_INVAL);
        ids[1] = 0;
    }
    /* GEMM in F16 and BF16 against a float matmul of the unrounded inputs. */
    enum { M = 7, N = 9, K = 33 };
    float a[M * K], b[N * K], c[M * N];
    uint16_t a16[M * K], b16[N * K];
    for (int i = 0; i < M * K; i++)
        a[i] = kt_unif(&r);
    for (int i = 0; i < N * K; i++)
        b[i] = kt_unif(&r);
    for (int dt = 1; dt < 3; dt++) {
        krn_convert_args_t ca = {.x = a, .y = a16, .n = M * K, .dtype = (enum krn_dtype)dt};
        ASSERT_EQ(krn_ref_convert(&ca), 0);
        ca = (krn_convert_args_t){.x = b, .y = b16, .n = N * K, .dtype = (enum krn_dtype)dt};
        ASSERT_EQ(krn_ref_convert(&ca), 0);
        for (int i = 0; i < M * N; i++)
            c[i] = 1.0f;
        krn_gemm_args_t ga = {.x = a16,
                              .w = b16,
                              .y = c,
                              .M = M,
                              .N = N,
                              .K = K,
                              .dtype = (enum krn_dtype)dt,
                              .accumulate = true};
        ASSERT_EQ(krn_ref_gemm(&ga), 0);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double s = 1;
                for (int k = 0; k < K; k++)
                    s += (double)a[i * K + k] * b[j * K + k];
                ASSERT_NEAR(c[i * N + j], s, dt == 1 ? 1e-2 : 6e-2);
            }
    }
}

/* The reference sampler picks what engine/sampling.c picks for the same uniform draw. */
PC_TEST(sampler_ref_matches_engine_sampler)
{
    kt_rng_t r = {9};
    enum { V = 700 };
    eng_sample_ws_t *ws;
    ASSERT_EQ(eng_sample_ws_init(V, &ws), 0);
    float logits[V];
    double work[V];
    int checked = 0;
    for (int iter = 0; iter < 160; iter++) {
        int32_t n = 1 + (int32_t)kt_below(&r, V);
        for (int32_t i = 0; i < n; i++) {
            logits[i] = kt_unif(&r) * (iter % 2 ? 8.0f : 2.0f);
            if (iter % 5 == 0) /* ties */
                logits[i] = (float)(int)(logits[i] * 2);
        }
        if (iter % 7 == 1)
            for (int j = 0; j < 5; j++)
                logits[kt_below(&r, (uint32_t)n)] = NAN;
        if (iter % 7 == 2)
            for (int j = 0; j < 5; j++)
                logits[kt_below(&r, (uint32_t)n)] = -INFINITY;
        if (iter % 11 == 3) {
            logits[kt_below(&r, (uint32_t)n)] = INFINITY;
            logits[kt_below(&r, (uint32_t)n)] = FLT_MAX;
        }
        eng_sampling_params_t sp = eng_sampling_params_default();
        sp.temperature = iter % 9 == 0 ? 0.0f : 0.3f + (float)kt_below(&r, 20) / 10;
        sp.top_k = iter % 3 == 0 ? 0 : kt_below(&r, (uint32_t)n + 2);
        sp.top_p = iter % 4 == 0 ? 1.0f : 0.05f + 0.9f * (float)kt_below(&r, 100) / 100;
        sp.min_p = iter % 5 == 1 ? 0.05f * (float)kt_below(&r, 10) : 0.0f;
        sp.seed = (uint64_t)iter;
        eng_sampler_t s;
        ASSERT_EQ(eng_sampler_init(&s, &sp, NULL, 0), 0);
        for (int draw = 0; draw < 40; draw++) {
            eng_rng_t peek = s.rng;
            double u = eng_rng_uniform(&peek);
            if (draw == 0)
                u = 0;
            uint32_t want;
            int rc = eng_sampler_sample(&s, ws, logits, (uint32_t)n, &want);
            krn_sample_row_t row = {.temperature = sp.temperature,
                                    .top_k = (int32_t)sp.top_k,
                                    .top_p = sp.top_p,
                                    .min_p = sp.min_p,
                                    .u = u};
            int32_t got = -2;
            krn_sample_args_t sa = {.logits = logits,
                                    .row = &row,
                                    .token = &got,
                                    .work = work,
                                    .n_rows = 1,
                                    .n_vocab = n};
            ASSERT_EQ(krn_ref_sample(&sa), 0);
            if (rc != 0) {
                ASSERT_EQ(got, -1);
                break;
            }
            if (draw == 0 && sp.temperature != 0 && sp.top_k != 1)
                continue; /* u = 0 was not the engine's draw */
            ASSERT_EQ(got, (int32_t)want);
            checked++;
        }
    }
    /* No candidate at all. */
    for (int i = 0; i < 10; i++)
        logits[i] = i % 2 ? NAN : -INFINITY;
    krn_sample_row_t row = {.temperature = 1, .top_p = 1, .u = 0.5};
    int32_t got = 0;
    krn_sample_args_t sa = {
        .logits = logits, .row = &row, .token = &got, .work = work, .n_rows = 1, .n_vocab = 10};
    ASSERT_EQ(krn_ref_sample(&sa), 0);
    ASSERT_EQ(got, -1);
    eng_sample_ws_free(ws);
    ASSERT_TRUE(checked > 3000);
}

/* The engine's candidate order: a before b when a's logit is higher, or equal (as floats:
 * -0 == +0) with a lower id. */
static bool engine_before(float a, int32_t ia, float b, int32_t ib)
{
    return a > b || (a == b && ia < ib);
}

/* The sampler's key (shared by the kernel and the reference) orders candidates exactly as the
 * engine does, over random floats of every class and the special values. */
PC_TEST(sample_key_orders_like_the_engine)
{
    kt_rng_t r = {17};
    const float special[] = {0.0f,     -0.0f,    1.0f,   -1.0f,   FLT_MAX, -FLT_MAX,
                             FLT_MIN,  -FLT_MIN, 1e-45f, -1e-45f, 3.0f,    3.0f,
                             INFINITY, 0.5f,     -0.5f,  1e30f,   -1e30f,  2.0f};
    enum { NS = PC_ARRAY_LEN(special) };
    for (int iter = 0; iter < 200000; iter++) {
        float a, b;
        if (iter % 3 == 0) {
            a = special[kt_below(&r, NS)];
            b = special[kt_below(&r, NS)];
        } else {
            uint32_t ba = (uint32_t)kt_next(&r), bb = (uint32_t)kt_next(&r);
            if (iter % 3 == 1)
                bb = ba ^ (uint32_t)kt_below(&r, 4); /* near neighbours, sign flips */
            memcpy(&a, &ba, sizeof a);
            memcpy(&b, &bb, sizeof b);
            if (!(a > -INFINITY) || !(b > -INFINITY))
                continue; /* NaN and -inf are never candidates */
            a = krn_sample_clamp(a);
            b = krn_sample_clamp(b);
        }
        int32_t ia = (int32_t)kt_below(&r, 1u << 31), ib = (int32_t)kt_below(&r, 8);
        if (ia == ib)
            ib++;
        uint64_t ka = krn_sample_key(a, ia), kb = krn_sample_key(b, ib);
        ASSERT_TRUE(ka != 0 && kb != 0);
        ASSERT_EQ(krn_sample_key_id(ka), ia);
        ASSERT_EQ(ka > kb, engine_before(a, ia, b, ib));
        ASSERT_EQ(kb > ka, engine_before(b, ib, a, ia));
    }
    ASSERT_TRUE(krn_sample_clamp(INFINITY) == FLT_MAX);
    ASSERT_TRUE(krn_sample_clamp(-INFINITY) == -INFINITY);
    ASSERT_TRUE(krn_sample_clamp(FLT_MAX) == FLT_MAX);
    /* -0 and +0 tie: the lower id first, whichever sign it carries. */
    ASSERT_TRUE(krn_sample_key(-0.0f, 3) > krn_sample_key(0.0f, 7));
    ASSERT_TRUE(krn_sample_key(0.0f, 3) > krn_sample_key(-0.0f, 7));
}

/* One draw through eng_sampler_peek: the reference sampler given the peeked row picks what
 * eng_sampler_sample picks, and eng_sampler_advance leaves the PRNG where the sample did. */
static void check_peek_draws(const float *logits, int32_t n, const eng_sampling_params_t *sp,
                             eng_sample_ws_t *ws, int draws)
{
    eng_sampler_t host, dev;
    ASSERT_EQ(eng_sampler_init(&host, sp, NULL, 0), 0);
    dev = host;
    double *work = malloc(sizeof *work * (size_t)n);
    for (int d = 0; d < draws; d++) {
        eng_sample_row_t row;
        eng_sampler_peek(&dev, &row);
        eng_sample_row_t again;
        eng_sampler_peek(&dev, &again); /* peeking consumes nothing */
        ASSERT_MEM_EQ(&row, &again, sizeof row);
        krn_sample_row_t kr = {.temperature = row.temperature,
                               .top_k = (int32_t)row.top_k,
                               .top_p = row.top_p,
                               .min_p = row.min_p,
                               .u = row.u};
        int32_t got = -2;
        krn_sample_args_t sa = {
            .logits = logits, .row = &kr, .token = &got, .work = work, .n_rows = 1, .n_vocab = n};
        ASSERT_EQ(krn_ref_sample(&sa), 0);
        eng_sampler_advance(&dev);
        uint32_t want;
        ASSERT_EQ(eng_sampler_sample(&host, ws, logits, (uint32_t)n, &want), 0);
        ASSERT_EQ(got, (int32_t)want);
        ASSERT_MEM_EQ(&dev.rng, &host.rng, sizeof dev.rng);
    }
    free(work);
}

/* The cut logic at its edges, through the peek path a device sampler uses: top_k boundaries
 * inside runs of tied logits (and of -0/+0 ties), top_p boundaries that fall exactly on a
 * candidate's cumulative mass, min_p, +inf, and random mixes. */
PC_TEST(sampler_cuts_at_ties_match_engine_through_peek)
{
    enum { V = 64 };
    eng_sample_ws_t *ws;
    ASSERT_EQ(eng_sample_ws_init(V, &ws), 0);
    float logits[V];
    /* Ties: four logits of 2.0 at ids 40, 9, 33, 2 (unordered), the rest lower. top_k 1..6
     * cuts inside the run: the lowest ids go first. */
    for (int i = 0; i < V; i++)
        logits[i] = -1.0f - (float)(i % 7) * 0.25f;
    logits[40] = logits[9] = logits[33] = logits[2] = 2.0f;
    for (uint32_t k = 1; k <= 6; k++) {
        eng_sampling_params_t sp = eng_sampling_params_default();
        sp.top_k = k;
        sp.seed = 100 + k;
        PC_TEST_CALL(check_peek_draws(logits, V, &sp, ws, 200));
    }
    /* Signed zeros: the max is a -0/+0 tie; greedy and top_k 1 and 2 must take ids in order. */
    for (int i = 0; i < V; i++)
        logits[i] = -3.0f;
    logits[5] = -0.0f;
    logits[11] = 0.0f;
    logits[20] = -0.0f;
    for (int t = 0; t < 4; t++) {
        eng_sampling_params_t sp = eng_sampling_params_default();
        sp.temperature = t == 0 ? 0.0f : 1.0f;
        sp.top_k = t == 0 ? 0 : (uint32_t)t;
        sp.seed = 7 + (uint64_t)t;
        PC_TEST_CALL(check_peek_draws(logits, V, &sp, ws, 100));
    }
    double work[V];
    krn_sample_row_t greedy = {.temperature = 0, .top_p = 1};
    int32_t got = -2;
    krn_sample_args_t sa = {
        .logits = logits, .row = &greedy, .token = &got, .work = work, .n_rows = 1, .n_vocab = V};
    ASSERT_EQ(krn_ref_sample(&sa), 0);
    ASSERT_EQ(got, 5); /* -0 at id 5 ties +0 at id 11: the lower id */
    /* top_p on equal weights: n equal logits have mass i/n after i candidates, so top_p = i/n
     * (as a float) sits on a boundary; both sides must keep the same prefix. */
    for (int i = 0; i < V; i++)
        logits[i] = i < 10 ? 1.0f : -30.0f;
    for (int i = 1; i <= 10; i++) {
        eng_sampling_params_t sp = eng_sampling_params_default();
        sp.top_p = (float)i / 10.0f;
        sp.top_k = i % 2 ? 0 : 12; /* the bucket path and the top_k path */
        sp.seed = 1000 + (uint64_t)i;
        PC_TEST_CALL(check_peek_draws(logits, V, &sp, ws, 200));
    }
    /* min_p, +inf among finite logits, and random mixes of everything. */
    kt_rng_t r = {19};
    for (int iter = 0; iter < 300; iter++) {
        for (int i = 0; i < V; i++) {
            logits[i] = kt_unif(&r) * 6.0f;
            if (iter % 3 == 0)
                logits[i] = (float)(int)logits[i]; /* many ties, and -0 from (int) of -0.x */
        }
        if (iter % 5 == 0)
            logits[kt_below(&r, V)] = INFINITY;
        if (iter % 7 == 0)
            logits[kt_below(&r, V)] = NAN;
        eng_sampling_params_t sp = eng_sampling_params_default();
        sp.temperature = iter % 10 == 0 ? 0.0f : 0.2f + (float)kt_below(&r, 20) / 10;
        sp.top_k = iter % 2 ? 0 : kt_below(&r, V + 4);
        sp.top_p = iter % 3 == 1 ? 1.0f : 0.05f + 0.95f * (float)kt_below(&r, 100) / 100;
        sp.min_p = iter % 4 == 2 ? 0.1f * (float)kt_below(&r, 10) : 0.0f;
        sp.seed = (uint64_t)iter * 31;
        PC_TEST_CALL(check_peek_draws(logits, V, &sp, ws, 20));
    }
    eng_sample_ws_free(ws);
}

/* The engine's backend choice: "cuda" on a build without CUDA, or on a machine without a
 * device, fails with a reason; "auto" picks cuda exactly when a device is usable; an unknown
 * name is refused. */
PC_TEST(engine_backend_selection)
{
    eng_mkmodel_params_t mp = eng_mkmodel_params_default();
    mp.n_layer = 1;
    mp.n_embd = 64;
    mp.n_head = 4;
    mp.n_head_kv = 2;
    mp.n_ff = 128;
    char path[256], err[256];
    ASSERT_EQ(tm_make(&mp, 100, path, sizeof path, err, sizeof err), 0);
    eng_params_t p = eng_params_default();
    p.model_path = path;
    p.kv_max_tokens = 1024;
    eng_t *e = NULL;
    ASSERT_EQ(eng_init(&p, &e, err, sizeof err), 0);
    ASSERT_STR_EQ(eng_backend_name_of(e), "cpu"); /* the default */
    eng_free(e);
    p.backend = "tpu";
    ASSERT_EQ(eng_init(&p, &e, err, sizeof err), PC_ERR_INVAL);
    ASSERT_TRUE(strstr(err, "unknown backend") != NULL);
#ifdef KVGW_HAVE_CUDA
    bool have_gpu = krn_device_count() > 0;
#else
    bool have_gpu = false;
#endif
    /* The CPU backend: host KV storage, host sampling only (eng_forward_sample refused,
     * nothing changed). */
    p.backend = "cpu";
    ASSERT_EQ(eng_init(&p, &e, err, sizeof err), 0);
    ASSERT_TRUE(eng_kvpool_has_storage(eng_kvpool(e)));
    ASSERT_TRUE(!eng_samples_on_device(e));
    ASSERT_STR_EQ(eng_backend_note_of(e), ""); /* asked for, not a fallback */
    eng_seq_t *s;
    ASSERT_EQ(eng_seq_create(e, &s), 0);
    int32_t toks[5] = {1, 2, 3, 4, 5};
    eng_batch_item_t it = {.seq = s, .tokens = toks, .n_tokens = 5, .logits = ENG_LOGITS_LAST};
    eng_sample_row_t srow = {.temperature = 0, .top_p = 1};
    int32_t tok = -2;
    ASSERT_EQ(eng_forward_sample(e, &it, 1, &srow, &tok), PC_ERR_UNSUPPORTED);
    ASSERT_EQ(tok, -2);
    ASSERT_EQ(eng_seq_n_tokens(s), 0u);
    float *want = malloc(sizeof(float) * eng_n_vocab(e)), *got = malloc(sizeof(float) * 100);
    ASSERT_EQ(eng_forward(e, &it, 1, want), 0);
    eng_seq_free(e, s);
    eng_free(e);
    /* auto: cuda with its KV on the device (no host copy of the pool) where a GPU is usable;
     * else the CPU backend, whose pool got its host storage back, and computes as "cpu". */
    p.backend = "auto";
    ASSERT_EQ(eng_init(&p, &e, err, sizeof err), 0);
    ASSERT_STR_EQ(eng_backend_name_of(e), have_gpu ? "cuda" : "cpu");
    /* Why it fell back, for the worker and the CLI to print: the CUDA reason itself. */
    if (have_gpu) {
        ASSERT_STR_EQ(eng_backend_note_of(e), "");
    } else {
        ASSERT_TRUE(strncmp(eng_backend_note_of(e), "cuda unavailable: ", 18) == 0);
#ifdef KVGW_HAVE_CUDA
        ASSERT_TRUE(strstr(eng_backend_note_of(e), "no CUDA device 0: ") != NULL);
#else
        ASSERT_TRUE(strstr(eng_backend_note_of(e), "no CUDA support") != NULL);
#endif
    }
    ASSERT_EQ(eng_kvpool_has_storage(eng_kvpool(e)), !have_gpu);
    ASSERT_EQ(eng_samples_on_device(e), have_gpu);
    ASSERT_EQ(eng_seq_create(e, &s), 0);
    it.seq = s;
    ASSERT_EQ(eng_forward(e, &it, 1, got), 0);
    eng_seq_free(e, s);
    char msg[256];
    ASSERT_EQ(eng_check(e, msg, sizeof msg), 0);
    eng_free(e);
    if (!have_gpu)
        ASSERT_MEM_EQ(got, want, sizeof(float) * 100);
    free(want);
    free(got);
    p.backend = "cuda";
    int rc = eng_init(&p, &e, err, sizeof err);
    if (have_gpu) {
        ASSERT_EQ(rc, 0);
        ASSERT_STR_EQ(eng_backend_name_of(e), "cuda");
        ASSERT_TRUE(!eng_kvpool_has_storage(eng_kvpool(e)));
        eng_free(e);
    } else {
        ASSERT_EQ(rc, PC_ERR_UNSUPPORTED);
        ASSERT_TRUE(e == NULL);
#ifdef KVGW_HAVE_CUDA
        ASSERT_TRUE(strstr(err, "no CUDA device") != NULL);
#else
        ASSERT_TRUE(strstr(err, "no CUDA support") != NULL);
#endif
    }
    unlink(path);
}

/* The fused references (kernels.h, "Fused kernels") against the unfused references applied in
 * turn to whole arrays: the QKV epilogue against column copies, bias adds, q/k norms, RoPE and
 * kv_write; rmsnorm_convert against a row gather, rmsnorm and convert; swiglu_convert against a
 * strided copy, swiglu and convert. Bit for bit: the same F32 operations in the same order. */
PC_TEST(fused_refs_match_unfused_references)
{
    kt_rng_t r = {41};
    const struct {
        int32_t nh, nkv, hd, bt, rope_dim;
        enum krn_dtype kv;
        bool bias, norm;
        enum krn_rope_style style;
    } cases[] = {{8, 2, 64, 16, 64, KRN_F16, false, false, KRN_ROPE_NORM},
                 {8, 2, 64, 16, 64, KRN_F32, true, false, KRN_ROPE_NEOX},
                 {16, 4, 128, 16, 128, KRN_F16, false, true, KRN_ROPE_NEOX},
                 {6, 6, 32, 5, 24, KRN_F32, true, true, KRN_ROPE_NORM},
                 {4, 1, 256, 32, 256, KRN_F16, true, true, KRN_ROPE_NEOX}};
    for (size_t ci = 0; ci < PC_ARRAY_LEN(cases); ci++) {
        kf_case_t c;
        int32_t R = 37, hd = cases[ci].hd, nh = cases[ci].nh, nkv = cases[ci].nkv;
        kf_make(&c, &r, R, nh, nkv, hd, cases[ci].bt, cases[ci].kv, cases[ci].bias, cases[ci].norm,
                cases[ci].style, cases[ci].rope_dim);
        int32_t nq = nh * hd, nk = nkv * hd;
        size_t pool_bytes = kf_pool_bytes(&c);
        float *q_f = malloc(sizeof(float) * (size_t)R * nq);
        krn_qkv_rope_kv_args_t a = kf_args(&c, q_f);
        ASSERT_EQ(krn_ref_qkv_rope_kv(&a), 0);
        /* The unfused chain over copies of the three column ranges and a second pool. */
        float *q = malloc(sizeof(float) * (size_t)R * nq),
              *k = malloc(sizeof(float) * (size_t)R * nk),
              *v = malloc(sizeof(float) * (size_t)R * nk);
        for (int32_t i = 0; i < R; i++) {
            memcpy(q + (size_t)i * nq, c.qkv + i * c.ld, sizeof(float) * (size_t)nq);
            memcpy(k + (size_t)i * nk, c.qkv + i * c.ld + nq, sizeof(float) * (size_t)nk);
            memcpy(v + (size_t)i * nk, c.qkv + i * c.ld + nq + nk, sizeof(float) * (size_t)nk);
        }
        krn_kv_t kv2 = c.kv;
        kv2.base = malloc(pool_bytes);
        memset(kv2.base, 0xff, pool_bytes);
        if (c.bq != NULL) {
            krn_bias_add_args_t b1 = {.x = q, .b = c.bq, .n_rows = R, .width = nq};
            krn_bias_add_args_t b2 = {.x = k, .b = c.bk, .n_rows = R, .width = nk};
            krn_bias_add_args_t b3 = {.x = v, .b = c.bv, .n_rows = R, .width = nk};
            ASSERT_EQ(krn_ref_bias_add(&b1), 0);
            ASSERT_EQ(krn_ref_bias_add(&b2), 0);
            ASSERT_EQ(krn_ref_bias_add(&b3), 0);
        }
        if (c.q_norm != NULL) {
            krn_rmsnorm_args_t n1 = {
                .x = q, .w = c.q_norm, .y = q, .n_rows = R * nh, .width = hd, .eps = 1e-6f};
            krn_rmsnorm_args_t n2 = {
                .x = k, .w = c.k_norm, .y = k, .n_rows = R * nkv, .width = hd, .eps = 1e-6f};
            ASSERT_EQ(krn_ref_qk_norm(&n1), 0);
            ASSERT_EQ(krn_ref_qk_norm(&n2), 0);
        }
        krn_rope_args_t r1 = {.x = q,
                              .pos = c.pos,
                              .inv_freq = c.inv_freq,
                              .n_rows = R,
                              .n_heads = nh,
                              .head_dim = hd,
                              .rope_dim = c.rope_dim,
                              .style = c.style,
                              .post_scale = a.q_scale};
        krn_rope_args_t r2 = r1;
        r2.x = k;
        r2.n_heads = nkv;
        r2.post_scale = 1.0f;
        ASSERT_EQ(krn_ref_rope(&r1), 0);
        ASSERT_EQ(krn_ref_rope(&r2), 0);
        krn_kv_write_args_t kw = {.kv = kv2,
                                  .layer = 1,
                                  .k = k,
                                  .v = v,
                                  .row_seq = c.seq,
                                  .row_pos = c.pos,
                                  .block_tables = c.tables,
                                  .n_rows = R,
                                  .max_blocks = c.max_blocks};
        ASSERT_EQ(krn_ref_kv_write(&kw), 0);
        ASSERT_MEM_EQ(q_f, q, sizeof(float) * (size_t)R * nq);
        ASSERT_MEM_EQ(c.kv.base, kv2.base, pool_bytes);
        /* In place over separate q/k/v arrays (the unfused GEMMs' outputs): the same q. */
        krn_qkv_rope_kv_args_t b = a;
        float *q2 = malloc(sizeof(float) * (size_t)R * nq);
        for (int32_t i = 0; i < R; i++)
            memcpy(q2 + (size_t)i * nq, c.qkv + i * c.ld, sizeof(float) * (size_t)nq);
        b.q_in = b.q_out = q2;
        b.ld_q = nq;
        ASSERT_EQ(krn_ref_qkv_rope_kv(&b), 0);
        ASSERT_MEM_EQ(q2, q, sizeof(float) * (size_t)R * nq);
        /* Bad calls write nothing: a row without a block, odd or too wide heads, short
         * strides. */
        memcpy(q2, q_f, sizeof(float) * (size_t)R * nq);
        memset(kv2.base, 0x5a, pool_bytes);
        b = a;
        b.kv = kv2;
        b.q_out = q2;
        int32_t saved = c.tables[c.seq[R - 1] * c.max_blocks + c.pos[R - 1] / cases[ci].bt];
        c.tables[c.seq[R - 1] * c.max_blocks + c.pos[R - 1] / cases[ci].bt] = -1;
        ASSERT_EQ(krn_ref_qkv_rope_kv(&b), PC_ERR_INVAL);
        c.tables[c.seq[R - 1] * c.max_blocks + c.pos[R - 1] / cases[ci].bt] = saved;
        b.ld_kv = nk - 1;
        ASSERT_EQ(krn_ref_qkv_rope_kv(&b), PC_ERR_INVAL);
        b = a;
        b.kv = kv2;
        b.q_out = q2;
        b.rope_dim = hd + 2;
        ASSERT_EQ(krn_ref_qkv_rope_kv(&b), PC_ERR_INVAL);
        ASSERT_MEM_EQ(q2, q_f, sizeof(float) * (size_t)R * nq);
        for (size_t i = 0; i < pool_bytes; i++)
            ASSERT_EQ(((uint8_t *)kv2.base)[i], 0x5a);
        free(q_f);
        free(q);
        free(q2);
        free(k);
        free(v);
        free(kv2.base);
        kf_free(&c);
    }

    /* rmsnorm_convert with and without a row gather, swiglu_convert over strided halves, in
     * each output type. */
    enum { R = 23, W = 300, N_SRC = 40 };
    float *x = kf_rand(&r, (size_t)N_SRC * W, 4.0f), *w = kf_rand(&r, W, 1.0f);
    float *gu = kf_rand(&r, (size_t)R * 2 * W, 6.0f);
    float *tmp = malloc(sizeof(float) * R * 2 * W);
    uint8_t *want = malloc(sizeof(float) * R * W), *got = malloc(sizeof(float) * R * W);
    int32_t rows[R];
    for (int i = 0; i < R; i++)
        rows[i] = (int32_t)kt_below(&r, N_SRC);
    for (int dt = 0; dt < 3; dt++) {
        enum krn_dtype t = (enum krn_dtype)dt;
        size_t out_bytes = krn_dtype_size(t) * R * W;
        for (int gather = 0; gather < 2; gather++) {
            for (int i = 0; i < R; i++)
                memcpy(tmp + (size_t)i * W, x + (size_t)(gather ? rows[i] : i) * W,
                       sizeof(float) * W);
            krn_rmsnorm_args_t rn = {
                .x = tmp, .w = w, .y = tmp, .n_rows = R, .width = W, .eps = 1e-5f};
            ASSERT_EQ(krn_ref_rmsnorm(&rn), 0);
            if (t == KRN_F32) {
                memcpy(want, tmp, out_bytes);
            } else {
                krn_convert_args_t cv = {.x = tmp, .y = want, .n = R * W, .dtype = t};
                ASSERT_EQ(krn_ref_convert(&cv), 0);
            }
            krn_rmsnorm_convert_args_t a = {.x = x,
                                            .rows = gather ? rows : NULL,
                                            .w = w,
                                            .y = got,
                                            .n_rows = R,
                                            .n_src = N_SRC,
                                            .width = W,
                                            .eps = 1e-5f,
                                            .dtype = t};
            ASSERT_EQ(krn_ref_rmsnorm_convert(&a), 0);
            ASSERT_MEM_EQ(got, want, out_bytes);
        }
        for (int i = 0; i < R; i++) {
            memcpy(tmp + (size_t)i * W, gu + (size_t)i * 2 * W, sizeof(float) * W);
            memcpy(tmp + (size_t)(R + i) * W, gu + (size_t)i * 2 * W + W, sizeof(float) * W);
        }
        krn_swiglu_args_t sg = {.g = tmp, .u = tmp + (size_t)R * W, .n = R * W};
        ASSERT_EQ(krn_ref_swiglu(&sg), 0);
        if (t == KRN_F32) {
            memcpy(want, tmp, out_bytes);
        } else {
            krn_convert_args_t cv = {.x = tmp, .y = want, .n = R * W, .dtype = t};
            ASSERT_EQ(krn_ref_convert(&cv), 0);
        }
        krn_swiglu_convert_args_t s = {
            .g = gu, .u = gu + W, .ld = 2 * W, .y = got, .n_rows = R, .width = W, .dtype = t};
        ASSERT_EQ(krn_ref_swiglu_convert(&s), 0);
        ASSERT_MEM_EQ(got, want, out_bytes);
    }
    /* Bad calls: a gathered row out of range, a stride below the width, an unknown type. */
    rows[3] = N_SRC;
    krn_rmsnorm_convert_args_t bad = {.x = x,
                                      .rows = rows,
                                      .w = w,
                                      .y = got,
                                      .n_rows = R,
                                      .n_src = N_SRC,
                                      .width = W,
                                      .eps = 1e-5f,
                                      .dtype = KRN_F16};
    ASSERT_EQ(krn_ref_rmsnorm_convert(&bad), PC_ERR_INVAL);
    bad.rows = NULL;
    bad.n_src = R - 1;
    ASSERT_EQ(krn_ref_rmsnorm_convert(&bad), PC_ERR_INVAL);
    krn_swiglu_convert_args_t bs = {
        .g = gu, .u = gu + W, .ld = W - 1, .y = got, .n_rows = R, .width = W, .dtype = KRN_F16};
    ASSERT_EQ(krn_ref_swiglu_convert(&bs), PC_ERR_INVAL);
    bs.ld = 2 * W;
    bs.dtype = (enum krn_dtype)7;
    ASSERT_EQ(krn_ref_swiglu_convert(&bs), PC_ERR_INVAL);
    free(x);
    free(w);
    free(gu);
    free(tmp);
    free(want);
    free(got);
}

/* The packed upload's sections: aligned, in order, never overlapping, empty ones allowed. */
PC_TEST(pack_sections_are_aligned_and_disjoint)
{
    size_t cur = 0, prev_end = 0;
    const size_t sizes[] = {4, 0, 12, 28, 1, 16, 0, 33, 4096, 3};
    for (size_t i = 0; i < PC_ARRAY_LEN(sizes); i++) {
        size_t off = krn_pack_take(&cur, sizes[i]);
        ASSERT_EQ(off % KRN_PACK_ALIGN, 0);
        ASSERT_TRUE(off >= prev_end);
        ASSERT_TRUE(off - prev_end < KRN_PACK_ALIGN);
        ASSERT_EQ(cur, off + sizes[i]);
        prev_end = cur;
    }
    /* Section alignment serves the widest member of the structs packed. */
    ASSERT_EQ(KRN_PACK_ALIGN % _Alignof(krn_sample_row_t), 0);
    ASSERT_EQ(KRN_PACK_ALIGN % _Alignof(krn_attn_task_t), 0);
}

PC_TEST_MAIN()
