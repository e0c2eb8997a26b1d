/*
 * test_krn_sample_radix.c — the multi-pass GPU sampler (kernels/krn_sample_radix.cu) run on the
 * host: its steps are krn_sample_hostdev.h's functions, which the kernels run too; here the
 * CTAs of a row are slices run one after the other (in a shuffled order, since the device adds
 * their histograms with atomics in any order), the block-wide scans are run as the kernel runs
 * them (Hillis-Steele over KRN_SMP_GROUPS groups), and the row's state machine gets exactly as
 * many passes as krn_sample launches. The pick must be krn_ref_sample's on every row: vocab
 * 1..152064, ties, +inf / -inf / NaN logits, all-equal rows, top_k 1..V and beyond, top_p near
 * 0 and 1, min_p, temperatures from 1e-3 to 100, u at 0 and near 1, several slicings.
 */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "krn_sample_hostdev.h"
#include "krn_sample_testrows.h"
#include "krn_testutil.h"
#include "pc_assert.h"
#include "pc_err.h"
#include "pc_test.h"

/* Exclusive suffix sums of v[KRN_SMP_THREADS] as the kernel's smp_suffix_excl computes them. */
static void hs_suffix_excl(const double *v, double *out)
{
    double a[KRN_SMP_THREADS], b[KRN_SMP_THREADS];
    memcpy(a, v, sizeof a);
    for (int off = 1; off < KRN_SMP_THREADS; off *= 2) {
        for (int t = 0; t < KRN_SMP_THREADS; t++)
            b[t] = a[t] + (t + off < KRN_SMP_THREADS ? a[t + off] : 0.0);
        memcpy(a, b, sizeof a);
    }
    for (int t = 0; t < KRN_SMP_THREADS; t++)
        out[t] = t + 1 < KRN_SMP_THREADS ? a[t + 1] : 0.0;
}

static void choose_topk(krn_smp_row_t *R, int32_t V)
{
    int64_t gsum[KRN_SMP_GROUPS], base = 0;
    for (int g = 0; g < KRN_SMP_GROUPS; g++) {
        gsum[g] = 0;
        for (int b = g * KRN_SMP_GROUP_BINS; b < (g + 1) * KRN_SMP_GROUP_BINS; b++)
            gsum[g] += R->cnt[b];
    }
    int32_t best = -1;
    int64_t best_above = 0;
    for (int g = KRN_SMP_GROUPS - 1; g >= 0; g--) { /* base: the groups above g */
        int64_t above;
        int32_t b = krn_smp_walk_cnt(R->cnt, g * KRN_SMP_GROUP_BINS, (g + 1) * KRN_SMP_GROUP_BINS,
                                     base, R->st.need, &above);
        if (b > best) {
            best = b;
            best_above = above;
        }
        base += gsum[g];
    }
    PC_ASSERT(best >= 0); /* need <= the prefix's keys */
    krn_smp_topk_chosen(&R->st, V, best, R->cnt[best], best_above);
}

static void choose_topp(krn_smp_row_t *R, int32_t V)
{
    double g[KRN_SMP_GROUPS], base[KRN_SMP_GROUPS];
    for (int t = 0; t < KRN_SMP_GROUPS; t++) {
        g[t] = 0;
        for (int b = (t + 1) * KRN_SMP_GROUP_BINS - 1; b >= t * KRN_SMP_GROUP_BINS; b--)
            g[t] += R->mass[b];
    }
    hs_suffix_excl(g, base);
    if (R->st.want < 0)
        R->st.want = (double)R->st.top_p * (base[0] + g[0]);
    int32_t best = -1;
    double best_above = 0;
    for (int t = 0; t < KRN_SMP_GROUPS; t++) {
        double above;
        int32_t b =
            krn_smp_walk_mass(R->mass, R->cnt, t * KRN_SMP_GROUP_BINS, (t + 1) * KRN_SMP_GROUP_BINS,
                              R->st.above + base[t], R->st.want, &above);
        if (b > best) {
            best = b;
            best_above = above;
        }
    }
    krn_smp_topp_chosen(&R->st, V, best, best >= 0 ? R->cnt[best] : 0, best_above);
}

/* The pick as the last CTA makes it: slice sums in id order, the owner slice, then the owner's
 * chunks (one per thread), their Hillis-Steele prefix, the owner chunk and its walk. */
static int32_t pick(krn_smp_row_t *R, const float *x, int32_t V, int32_t S, int32_t len)
{
    double total = 0, before = 0, sbefore = 0, target;
    for (int s = 0; s < S; s++)
        total += R->slice[s];
    target = R->st.u * total;
    int owner = -1;
    for (int s = 0; s < S; s++) {
        if (krn_sample_may_own(before, R->slice[s], target)) {
            owner = s;
            sbefore = before;
        }
        before += R->slice[s];
    }
    PC_ASSERT(owner >= 0);
    int32_t s0 = owner * len, s1 = s0 + len < V ? s0 + len : V;
    int32_t chunk = (s1 - s0 + KRN_SMP_THREADS - 1) / KRN_SMP_THREADS;
    double local[KRN_SMP_THREADS], scan[KRN_SMP_THREADS], nxt[KRN_SMP_THREADS];
    for (int t = 0; t < KRN_SMP_THREADS; t++) {
        int32_t i0 = s0 + t * chunk < s1 ? s0 + t * chunk : s1;
        int32_t i1 = i0 + chunk < s1 ? i0 + chunk : s1;
        local[t] = krn_smp_range_mass(&R->st, x, i0, i1);
    }
    memcpy(scan, local, sizeof scan);
    for (int off = 1; off < KRN_SMP_THREADS; off *= 2) {
        for (int t = 0; t < KRN_SMP_THREADS; t++)
            nxt[t] = scan[t] + (t >= off ? scan[t - off] : 0.0);
        memcpy(scan, nxt, sizeof scan);
    }
    int who = -1;
    for (int t = 0; t < KRN_SMP_THREADS; t++)
        if (krn_sample_may_own(sbefore + (t > 0 ? scan[t - 1] : 0.0), local[t], target))
            who = t;
    PC_ASSERT(who >= 0);
    int32_t i0 = s0 + who * chunk < s1 ? s0 + who * chunk : s1;
    int32_t i1 = i0 + chunk < s1 ? i0 + chunk : s1;
    int32_t tok =
        krn_smp_walk_pick(&R->st, x, i0, i1, sbefore + (who > 0 ? scan[who - 1] : 0.0), target);
    PC_ASSERT(tok >= 0);
    return tok;
}

/* One row through krn_sample's launches under plan (krn_sample_args_t.plan) with S slices (0:
 * krn_smp_slices for n_rows rows), the slices of every pass run in a random order. Returns the
 * token. */
static int32_t sim_row(const float *x, int32_t V, const krn_sample_row_t *row, uint32_t plan,
                       int32_t n_rows, int32_t S_want, kt_rng_t *rng, int32_t *passes)
{
    krn_smp_row_t *R = calloc(1, sizeof *R);
    PC_ASSERT(R != NULL);
    int32_t len, S;
    if (S_want <= 0) {
        S = krn_smp_slices(V, n_rows, &len);
    } else {
        len = (V + S_want - 1) / S_want;
        S = (V + len - 1) / len;
    }
    PC_ASSERT(S >= 1 && S <= KRN_SMP_MAX_SLICES && (int64_t)S * len >= V &&
              (int64_t)(S - 1) * len < V);
    int32_t order[KRN_SMP_MAX_SLICES];
    int32_t n_launch = krn_smp_n_launches(V, plan);
    *passes = 0;
    for (int32_t l = 0; l < n_launch; l++) {
        bool stats = l == 0;
        int phase = stats ? -1 : R->st.phase;
        if (phase == KRN_SMP_DONE)
            break;
        (*passes)++;
        for (int s = 0; s < S; s++)
            order[s] = s;
        for (int s = S - 1; s > 0; s--) {
            int j = (int)kt_below(rng, (uint32_t)s + 1), tmp = order[s];
            order[s] = order[j];
            order[j] = tmp;
        }
        int32_t dsh = 53, dwd = 11;
        if (!stats)
            krn_smp_digit(R->st.pass, V, &dsh, &dwd);
        bool hist = !stats || (row->temperature != 0.0f && row->top_k > 1);
        for (int k = 0; k < S; k++) {
            int s = order[k];
            int32_t i0 = s * len, i1 = i0 + len < V ? i0 + len : V;
            if (phase == KRN_SMP_PICK) {
                /* The kernel's strided per-thread sums, then their reduction: any order. */
                double local = 0;
                for (int32_t i = i0; i < i1; i++) {
                    double w = krn_smp_weight(&R->st, x[i], krn_smp_key(x[i], i));
                    if (w > 0)
                        local += w;
                }
                R->slice[s] = local;
                continue;
            }
            static uint32_t cnt[KRN_SMP_BINS];
            static double mass[KRN_SMP_BINS];
            memset(cnt, 0, sizeof cnt);
            memset(mass, 0, sizeof mass);
            for (int32_t i = i0; i < i1; i++) {
                if (stats) {
                    if (x[i] > -INFINITY) {
                        uint64_t key = krn_sample_key(x[i], i);
                        R->best = key > R->best ? key : R->best;
                        R->n_valid++;
                        if (hist)
                            cnt[krn_smp_digit_of(krn_smp_key(x[i], i), 53, 11)]++;
                    }
                    continue;
                }
                uint32_t bin;
                double w;
                if (krn_smp_contrib(&R->st, dsh, dwd, x[i], i, &bin, &w)) {
                    cnt[bin]++;
                    mass[bin] += w;
                }
            }
            for (int b = 0; b < KRN_SMP_BINS; b++) {
                R->cnt[b] += cnt[b];
                if (phase == KRN_SMP_TOPP)
                    R->mass[b] += mass[b];
            }
        }
        /* The last CTA. */
        if (phase == KRN_SMP_PICK) {
            R->st.token = pick(R, x, V, S, len);
            R->st.phase = KRN_SMP_DONE;
        } else {
            if (stats)
                krn_smp_start(&R->st, row, R->best, R->n_valid);
            if (stats ? R->st.phase == KRN_SMP_TOPK : phase == KRN_SMP_TOPK)
                choose_topk(R, V);
            else if (!stats && phase == KRN_SMP_TOPP)
                choose_topp(R, V);
            memset(R->cnt, 0, sizeof R->cnt);
            memset(R->mass, 0, sizeof R->mass);
        }
    }
    /* Every row is done within the launches krn_sample makes. */
    PC_ASSERT(R->st.phase == KRN_SMP_DONE);
    int32_t tok = R->st.token;
    free(R);
    return tok;
}

static int32_t ref_row(const float *x, int32_t V, const krn_sample_row_t *row, double *work)
{
    int32_t tok = -2;
    krn_sample_args_t a = {
        .logits = x, .row = row, .token = &tok, .work = work, .n_rows = 1, .n_vocab = V};
    PC_ASSERT(krn_ref_sample(&a) == 0);
    return tok;
}

PC_TEST(digit_schedule_covers_the_key)
{
    ASSERT_EQ(krn_smp_id_bits(1), 0);
    ASSERT_EQ(krn_smp_id_bits(2), 1);
    ASSERT_EQ(krn_smp_id_bits(3), 2);
    ASSERT_EQ(krn_smp_id_bits(2048), 11);
    ASSERT_EQ(krn_smp_id_bits(2049), 12);
    ASSERT_EQ(krn_smp_id_bits(152064), 18);
    ASSERT_EQ(krn_smp_id_bits(INT32_MAX), 31);
    ASSERT_EQ(krn_smp_n_digits(1), 3);
    ASSERT_EQ(krn_smp_n_digits(152064), 5);
    ASSERT_EQ(krn_smp_n_launches(152064, 0), 11);
    ASSERT_EQ(krn_smp_n_launches(152064, KRN_SAMPLE_GREEDY), 1);
    ASSERT_EQ(krn_smp_n_launches(152064, KRN_SAMPLE_NO_TOPK | KRN_SAMPLE_NO_TOPP), 2);
    ASSERT_EQ(krn_smp_n_launches(152064, KRN_SAMPLE_NO_TOPK), 7);
    ASSERT_EQ(krn_smp_n_launches(152064, KRN_SAMPLE_NO_TOPP), 6);
    const int32_t vs[] = {1, 2, 3, 100, 2048, 2049, 65536, 152064, 1 << 22, INT32_MAX};
    for (size_t k = 0; k < sizeof vs / sizeof vs[0]; k++) {
        int32_t V = vs[k], idb = krn_smp_id_bits(V);
        ASSERT_TRUE((int64_t)(V - 1) < ((int64_t)1 << idb));
        /* The digits cover bits [32, 64) and [0, idb) exactly once, from the top down. */
        uint64_t seen = 0;
        int32_t prev = 64;
        for (int32_t p = 0; p < krn_smp_n_digits(V); p++) {
            int32_t sh, wd;
            krn_smp_digit(p, V, &sh, &wd);
            ASSERT_TRUE(wd >= 1 && wd <= KRN_SMP_BITS);
            ASSERT_EQ(sh + wd, prev);
            prev = sh;
            uint64_t m = (wd == 64 ? ~0ull : ((1ull << wd) - 1)) << sh;
            ASSERT_EQ(seen & m, 0u);
            seen |= m;
            if (p == 2)
                prev = idb;
        }
        uint64_t want = 0xffffffff00000000ull | (idb ? ((1ull << idb) - 1) : 0);
        ASSERT_EQ(seen, want);
        ASSERT_EQ(prev, 0);
    }
}

PC_TEST(slices_cover_the_row)
{
    const int32_t vs[] = {1, 2, 2047, 2048, 2049, 5000, 131072, 152064, 1 << 24};
    const int32_t rows[] = {1, 2, 64, 100, 4096, 65535};
    for (size_t a = 0; a < sizeof vs / sizeof vs[0]; a++)
        for (size_t b = 0; b < sizeof rows / sizeof rows[0]; b++) {
            int32_t len, S = krn_smp_slices(vs[a], rows[b], &len);
            ASSERT_TRUE(S >= 1 && S <= KRN_SMP_MAX_SLICES && S <= KRN_SMP_THREADS);
            ASSERT_TRUE((int64_t)S * len >= vs[a]);
            ASSERT_TRUE((int64_t)(S - 1) * len < vs[a]); /* no empty slice */
            ASSERT_TRUE((int64_t)S * rows[b] <= KRN_SMP_MAX_CTAS || S == 1);
        }
    int32_t len;
    ASSERT_EQ(krn_smp_slices(152064, 1, &len), 64);
    ASSERT_EQ(krn_smp_slices(152064, 16, &len), 64);
    ASSERT_EQ(krn_smp_slices(152064, 64, &len), 16);
    ASSERT_EQ(krn_smp_slices(152064, 128, &len), 8);
}

/* The key's float half decodes to the logit krn_smp_start takes as the maximum. */
PC_TEST(start_reads_the_max_from_the_best_key)
{
    const float xs[] = {0.0f, -0.0f, 1.5f, -3.25f, FLT_MAX, INFINITY, -FLT_MAX, 1e-30f, -1e-30f};
    for (size_t k = 0; k < sizeof xs / sizeof xs[0]; k++) {
        krn_smp_state_t st;
        memset(&st, 0, sizeof st);
        krn_sample_row_t row = {.temperature = 1, .top_k = 0, .top_p = 1, .min_p = 0.5f, .u = 0.5};
        krn_smp_start(&st, &row, krn_sample_key(xs[k], 7), 1);
        ASSERT_EQ(st.phase, KRN_SMP_PICK);
        ASSERT_TRUE(st.mx == (double)krn_sample_clamp(xs[k] == 0.0f ? 0.0f : xs[k]));
        ASSERT_EQ(st.token, 7);
        ASSERT_TRUE(st.thr == st.mx + log(0.5));
    }
    /* Greedy and no candidate end at stats. */
    krn_smp_state_t st;
    memset(&st, 0, sizeof st);
    krn_sample_row_t g = {.temperature = 0, .top_p = 1};
    krn_smp_start(&st, &g, krn_sample_key(2.0f, 3), 10);
    ASSERT_EQ(st.phase, KRN_SMP_DONE);
    ASSERT_EQ(st.token, 3);
    krn_smp_start(&st, &g, 0, 0);
    ASSERT_EQ(st.phase, KRN_SMP_DONE);
    ASSERT_EQ(st.token, -1);
}

static void check_many(const int32_t *vs, size_t n_vs, int rows_per_v, uint64_t seed)
{
    kt_rng_t r = {seed};
    for (size_t a = 0; a < n_vs; a++) {
        int32_t V = vs[a];
        float *x = malloc(sizeof(float) * (size_t)V);
        double *work = malloc(sizeof(double) * (size_t)V);
        PC_ASSERT(x != NULL && work != NULL);
        for (int k = 0; k < rows_per_v; k++) {
            ks_fill_row(x, V, k, &r);
            krn_sample_row_t p;
            ks_rand_params(&p, V, k, &r);
            int32_t want = ref_row(x, V, &p, work);
            const int32_t slicings[] = {0, 1, 3, KRN_SMP_MAX_SLICES};
            for (size_t s = 0; s < 4; s++) {
                /* Every launch, or only those the row's plan needs. */
                uint32_t plan = s % 2 ? krn_sample_plan_of(&p, 1) : 0;
                int32_t passes;
                int32_t got = sim_row(x, V, &p, plan, 1 + (int32_t)kt_below(&r, 64), slicings[s],
                                      &r, &passes);
                if (got != want)
                    fprintf(stderr,
                            "V %d shape %d slicing %d: T %g top_k %d top_p %.9g min_p %g u %.17g:"
                            " got %d want %d\n",
                            V, k % 6, slicings[s], p.temperature, p.top_k, p.top_p, p.min_p, p.u,
                            got, want);
                ASSERT_EQ(got, want);
                ASSERT_TRUE(passes <= krn_smp_n_launches(V, plan));
            }
        }
        free(x);
        free(work);
    }
}

PC_TEST(matches_reference_small_vocabs)
{
    const int32_t vs[] = {1, 2, 3, 5, 17, 100, 257, 1000};
    check_many(vs, sizeof vs / sizeof vs[0], 300, 7);
}

PC_TEST(matches_reference_mid_vocabs)
{
    const int32_t vs[] = {2047, 2048, 2049, 5000, 32768 + 5};
    check_many(vs, sizeof vs / sizeof vs[0], 60, 11);
}

PC_TEST(matches_reference_qwen_vocab)
{
    const int32_t vs[] = {152064};
    check_many(vs, 1, 24, 13);
}

/* top_p whose target mass is exactly a prefix's (equal weights of 1: every sum is exact): the
 * prefix that reaches the target is kept, not one more; u just below 1 picks its last id. */
PC_TEST(exact_top_p_boundaries)
{
    const int32_t vs[] = {4, 1000, 2048, 4100, 152064};
    const float tps[] = {0.25f, 0.5f, 0.75f};
    kt_rng_t r = {17};
    for (size_t a = 0; a < sizeof vs / sizeof vs[0]; a++) {
        int32_t V = vs[a];
        float *x = malloc(sizeof(float) * (size_t)V);
        double *work = malloc(sizeof(double) * (size_t)V);
        for (int32_t i = 0; i < V; i++)
            x[i] = -2.5f;
        for (size_t b = 0; b < 3; b++)
            for (int k = 0; k < 2; k++) {
                krn_sample_row_t p = {.temperature = 0.7f,
                                      .top_k = k ? V / 2 : 0,
                                      .top_p = tps[b],
                                      .u = 1.0 - 0x1.0p-30};
                int32_t kept = (int32_t)ceil((k ? V / 2 : V) * (double)tps[b]), passes;
                int32_t want = ref_row(x, V, &p, work);
                ASSERT_EQ(want, (kept > 1 ? kept : 1) - 1);
                ASSERT_EQ(sim_row(x, V, &p, 0, 1, 0, &r, &passes), want);
                ASSERT_EQ(sim_row(x, V, &p, krn_sample_plan_of(&p, 1), 64, 7, &r, &passes), want);
            }
        free(x);
        free(work);
    }
}

/* Greedy is one pass; top_k/top_p on distinct logits take at most stats + 2 x 3 float digits +
 * pick; tied boundaries go into the id digits and still finish within krn_sample's launches. */
PC_TEST(pass_counts)
{
    enum { V = 152064 };
    kt_rng_t r = {5};
    float *x = malloc(sizeof(float) * V);
    double *work = malloc(sizeof(double) * V);
    for (int32_t i = 0; i < V; i++)
        x[i] = kt_unif(&r) * 8;
    int32_t passes;
    krn_sample_row_t g = {.temperature = 0, .top_p = 1};
    ASSERT_EQ(krn_sample_plan_of(&g, 1),
              KRN_SAMPLE_GREEDY | KRN_SAMPLE_NO_TOPK | KRN_SAMPLE_NO_TOPP);
    ASSERT_EQ(sim_row(x, V, &g, krn_sample_plan_of(&g, 1), 1, 0, &r, &passes),
              ref_row(x, V, &g, work));
    ASSERT_EQ(passes, 1);
    krn_sample_row_t p = {.temperature = 0.8f, .top_k = 50, .top_p = 0.9f, .u = 0.37};
    ASSERT_EQ(krn_sample_plan_of(&p, 1), 0u);
    ASSERT_EQ(sim_row(x, V, &p, 0, 1, 0, &r, &passes), ref_row(x, V, &p, work));
    ASSERT_TRUE(passes <= 1 + 2 + 3 + 1);
    krn_sample_row_t plain = {.temperature = 1, .top_p = 1, .u = 0.5};
    ASSERT_EQ(krn_sample_plan_of(&plain, 1), KRN_SAMPLE_NO_TOPK | KRN_SAMPLE_NO_TOPP);
    ASSERT_EQ(sim_row(x, V, &plain, krn_sample_plan_of(&plain, 1), 1, 0, &r, &passes),
              ref_row(x, V, &plain, work));
    ASSERT_EQ(passes, 2);
    /* A batch's plan is what no row needs: one row with top_k clears NO_TOPK. */
    krn_sample_row_t mix[3] = {g, plain, {.temperature = 0.5f, .top_k = 7, .top_p = 1}};
    ASSERT_EQ(krn_sample_plan_of(mix, 2), KRN_SAMPLE_NO_TOPK | KRN_SAMPLE_NO_TOPP);
    ASSERT_EQ(krn_sample_plan_of(mix, 3), KRN_SAMPLE_NO_TOPP);
    mix[2].top_p = 0.5f;
    ASSERT_EQ(krn_sample_plan_of(mix, 3), 0u);
    mix[2].top_k = 1; /* greedy: needs nothing */
    ASSERT_EQ(krn_sample_plan_of(mix, 3), KRN_SAMPLE_NO_TOPK | KRN_SAMPLE_NO_TOPP);
    /* Every logit equal: top_k's boundary is decided by ids. */
    for (int32_t i = 0; i < V; i++)
        x[i] = 0.5f;
    krn_sample_row_t t = {.temperature = 1, .top_k = 1000, .top_p = 0.3f, .u = 0.999};
    int32_t want = ref_row(x, V, &t, work);
    ASSERT_EQ(sim_row(x, V, &t, 0, 1, 0, &r, &passes), want);
    ASSERT_TRUE(passes <= krn_smp_n_launches(V, 0));
    free(x);
    free(work);
}

PC_TEST_MAIN()
