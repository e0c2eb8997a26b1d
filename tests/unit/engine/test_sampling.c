/*
 * test_sampling.c — the sampler (engine/sampling.c) against naive references: a full sort of
 * the candidates, the filters applied one by one, a softmax. Every weight is pc_exp() (the
 * sampler's exp, common/pc_exp.h), so the references and the sampler agree to the bit wherever
 * they add in the same order:
 *   - ref_probs computes the weights its own way (dividing by T, min_p as a comparison of
 *     weights): the kept set must be identical and the probabilities equal within 1e-6. That
 *     tolerance is about 1e9 times the rounding differences of the two orders of operations, and
 *     it cannot hide a wrong kept set, which the support comparison checks exactly;
 *   - ref_pick is the plain scalar loop of sampling.h's rules (weights in id order, one walk):
 *     eng_sampler_sample must pick exactly its token, and eng_sample_probs give exactly its
 *     probabilities, on thousands of random rows and parameters.
 * Draws with a fixed seed must follow the distribution (a chi-square bound that is deterministic
 * for the seed, so it cannot flake). Prints timings on a 152k vocabulary (figures, not
 * pass/fail).
 */
#include "pc_test.h"

#include <float.h>
#include <math.h>

#include "common.h"
#include "pc_exp.h"
#include "sampling.h"

/* ---- naive reference ----------------------------------------------------------------------- */

typedef struct ref_cand {
    float logit;
    uint32_t id;
} ref_cand_t;

static int ref_cmp(const void *pa, const void *pb)
{
    const ref_cand_t *a = pa, *b = pb;
    if (a->logit != b->logit)
        return a->logit > b->logit ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id ? 1 : 0;
}

/* Writes the reference distribution to probs[n]; returns the kept count (0: no candidate). */
static size_t ref_probs(const eng_sampling_params_t *p, const float *logits, uint32_t n,
                        double *probs)
{
    ref_cand_t *c = malloc(n * sizeof *c);
    size_t m = 0;
    for (uint32_t i = 0; i < n; i++) {
        probs[i] = 0;
        if (isnan(logits[i]) || logits[i] == -INFINITY)
            continue;
        c[m++] = (ref_cand_t){logits[i] == INFINITY ? FLT_MAX : logits[i], i};
    }
    if (m == 0) {
        free(c);
        return 0;
    }
    qsort(c, m, sizeof *c, ref_cmp);
    if (p->temperature == 0 || p->top_k == 1) {
        probs[c[0].id] = 1;
        free(c);
        return 1;
    }
    size_t keep = m;
    if (p->top_k != 0 && p->top_k < keep)
        keep = p->top_k;
    double mx = c[0].logit, t = p->temperature;
    if (p->min_p > 0) {
        size_t j = 0;
        while (j < keep && pc_exp(((double)c[j].logit - mx) / t) >= p->min_p)
            j++;
        keep = j;
    }
    if (p->top_p < 1) {
        double mass = 0, cum = 0;
        for (size_t j = 0; j < keep; j++)
            mass += pc_exp(((double)c[j].logit - mx) / t);
        size_t j = 0;
        while (j < keep) {
            cum += pc_exp(((double)c[j].logit - mx) / t);
            j++;
            if (cum >= p->top_p * mass)
                break;
        }
        keep = j;
    }
    double z = 0;
    for (size_t j = 0; j < keep; j++)
        z += pc_exp(((double)c[j].logit - mx) / t);
    for (size_t j = 0; j < keep; j++)
        probs[c[j].id] = pc_exp(((double)c[j].logit - mx) / t) / z;
    free(c);
    return keep;
}

/* The plain scalar loop of sampling.h's rules with the sampler's arithmetic: candidates sorted,
 * min_p (as the threshold x >= max + T ln(min_p)), top_k, top_p (mass and running mass in
 * candidate order), then weights pc_exp((x - max) * (1 / T)) of the kept tokens added in id
 * order, and the first kept token whose running weight exceeds u * total (the last one with a
 * weight when rounding leaves none). Writes the kept tokens' probabilities w / total to
 * probs[n] (0 elsewhere) and returns the token, or UINT32_MAX when there is no candidate. */
static uint32_t ref_pick(const eng_sampling_params_t *p, const float *logits, uint32_t n, double u,
                         float *probs)
{
    ref_cand_t *c = malloc(n * sizeof *c);
    double *w = malloc(n * sizeof *w);
    uint8_t *kept = calloc(n, 1);
    size_t m = 0;
    for (uint32_t i = 0; i < n; i++) {
        probs[i] = 0;
        if (!isnan(logits[i]) && logits[i] != -INFINITY)
            c[m++] = (ref_cand_t){logits[i] == INFINITY ? FLT_MAX : logits[i], i};
    }
    uint32_t tok = UINT32_MAX;
    if (m == 0)
        goto done;
    qsort(c, m, sizeof *c, ref_cmp);
    if (p->temperature == 0 || p->top_k == 1) {
        /* Greedy: the raw argmax (+inf above FLT_MAX), lowest id among ties. */
        tok = 0;
        while (isnan(logits[tok]) || logits[tok] == -INFINITY)
            tok++;
        for (uint32_t i = tok + 1; i < n; i++)
            if (logits[i] > logits[tok])
                tok = i;
        probs[tok] = 1;
        goto done;
    }
    double mx = c[0].logit, inv_t = 1.0 / (double)p->temperature;
    double thr = p->min_p > 0 ? mx + (double)p->temperature * log((double)p->min_p) : -INFINITY;
    size_t keep = 0;
    while (keep < m && (double)c[keep].logit >= thr)
        keep++;
    if (p->top_k != 0 && p->top_k < keep)
        keep = p->top_k;
    if (p->top_p < 1) {
        double mass = 0, cum = 0;
        for (size_t j = 0; j < keep; j++)
            mass += pc_exp(((double)c[j].logit - mx) * inv_t);
        size_t j = 0;
        while (j < keep) {
            cum += pc_exp(((double)c[j].logit - mx) * inv_t);
            j++;
            if (cum >= (double)p->top_p * mass)
                break;
        }
        keep = j;
    }
    for (size_t j = 0; j < keep; j++) {
        kept[c[j].id] = 1;
        w[c[j].id] = pc_exp(((double)c[j].logit - mx) * inv_t);
    }
    double total = 0;
    for (uint32_t i = 0; i < n; i++)
        if (kept[i])
            total += w[i];
    double target = u * total, cum = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!kept[i] || w[i] <= 0)
            continue;
        cum += w[i];
        tok = i;
        if (target < cum)
            break;
    }
    for (uint32_t i = 0; i < n; i++)
        if (kept[i])
            probs[i] = (float)(w[i] / total);
done:
    free(c);
    free(w);
    free(kept);
    return tok;
}

/* Compares the sampler's distribution with the reference: same support, close values. */
static void check_probs(const eng_sampling_params_t *p, eng_sample_ws_t *ws, const float *logits,
                        uint32_t n)
{
    float *got = malloc(n * sizeof *got);
    double *want = malloc(n * sizeof *want);
    size_t kept = ref_probs(p, logits, n, want);
    int rc = eng_sample_probs(p, ws, logits, n, got);
    int ok = 1;
    if (kept == 0) {
        ok = rc == PC_ERR_INVAL;
    } else if (rc != 0) {
        ok = 0;
    } else {
        for (uint32_t i = 0; i < n && ok; i++) {
            if ((got[i] > 0) != (want[i] > 0) || fabs(got[i] - want[i]) > 1e-6) {
                fprintf(stderr, "  token %u: got %.9g want %.9g (T %g k %u p %g minp %g)\n", i,
                        got[i], want[i], p->temperature, p->top_k, p->top_p, p->min_p);
                ok = 0;
            }
        }
    }
    free(got);
    free(want);
    ASSERT_TRUE(ok);
}

static float randn(eng_rng_t *r)
{
    double u1 = eng_rng_uniform(r), u2 = eng_rng_uniform(r);
    return (float)(sqrt(-2 * log(u1 + 1e-300)) * cos(6.283185307179586 * u2));
}

/* ---- tests --------------------------------------------------------------------------------- */

PC_TEST(rng_reference_stream)
{
    /* xoshiro256** seeded by splitmix64, computed by an independent implementation. */
    static const uint64_t want0[4] = {0x99ec5f36cb75f2b4ull, 0xbf6e1f784956452aull,
                                      0x1a5f849d4933e6e0ull, 0x6aa594f1262d2d2cull};
    static const uint64_t want42[4] = {0x15780b2e0c2ec716ull, 0x6104d9866d113a7eull,
                                       0xae17533239e499a1ull, 0xecb8ad4703b360a1ull};
    eng_rng_t r;
    eng_rng_seed(&r, 0);
    for (int i = 0; i < 4; i++)
        ASSERT_EQ_U64(eng_rng_next(&r), want0[i]);
    eng_rng_seed(&r, 42);
    for (int i = 0; i < 4; i++)
        ASSERT_EQ_U64(eng_rng_next(&r), want42[i]);
    for (int i = 0; i < 100000; i++) {
        double u = eng_rng_uniform(&r);
        ASSERT_TRUE(u >= 0 && u < 1);
    }
}

PC_TEST(params_check)
{
    eng_sampling_params_t p = eng_sampling_params_default();
    char err[128];
    ASSERT_EQ(eng_sampling_params_check(&p, err, sizeof err), 0);
    p.temperature = -1;
    ASSERT_EQ(eng_sampling_params_check(&p, err, sizeof err), PC_ERR_INVAL);
    ASSERT_TRUE(strstr(err, "temperature") != NULL);
    p.temperature = NAN;
    ASSERT_EQ(eng_sampling_params_check(&p, NULL, 0), PC_ERR_INVAL);
    p = eng_sampling_params_default();
    p.top_p = 0;
    ASSERT_EQ(eng_sampling_params_check(&p, err, sizeof err), PC_ERR_INVAL);
    ASSERT_TRUE(strstr(err, "top_p") != NULL);
    p.top_p = 1.5f;
    ASSERT_EQ(eng_sampling_params_check(&p, err, sizeof err), PC_ERR_INVAL);
    p = eng_sampling_params_default();
    p.min_p = -0.1f;
    ASSERT_EQ(eng_sampling_params_check(&p, err, sizeof err), PC_ERR_INVAL);
    p.min_p = INFINITY;
    ASSERT_EQ(eng_sampling_params_check(&p, err, sizeof err), PC_ERR_INVAL);
    /* A rejected init leaves the sampler untouched. */
    eng_sampler_t s;
    memset(&s, 0xAB, sizeof s);
    ASSERT_EQ(eng_sampler_init(&s, &p, err, sizeof err), PC_ERR_INVAL);
    ASSERT_EQ(s.params.top_k, 0xABABABABu);
}

PC_TEST(greedy_is_argmax)
{
    eng_rng_t r;
    eng_rng_seed(&r, 7);
    enum { N = 1000 };
    float logits[N];
    eng_sample_ws_t *ws;
    ASSERT_EQ(eng_sample_ws_init(N, &ws), 0);
    for (int iter = 0; iter < 200; iter++) {
        uint32_t best = 0;
        for (uint32_t i = 0; i < N; i++) {
            /* Coarse values so that ties happen; the lowest id must win them. */
            logits[i] = (float)(int)(randn(&r) * 4);
            if (logits[i] > logits[best])
                best = i;
        }
        uint32_t tok = UINT32_MAX;
        ASSERT_EQ(eng_sample_greedy(logits, N, &tok), 0);
        ASSERT_EQ(tok, best);
        eng_sampling_params_t p = eng_sampling_params_default();
        p.temperature = 0;
        p.seed = (uint64_t)iter;
        eng_sampler_t s;
        ASSERT_EQ(eng_sampler_init(&s, &p, NULL, 0), 0);
        eng_rng_t before = s.rng;
        ASSERT_EQ(eng_sampler_sample(&s, ws, logits, N, &tok), 0);
        ASSERT_EQ(tok, best);
        ASSERT_MEM_EQ(&before, &s.rng, sizeof before); /* greedy draws nothing */
        p.temperature = 1;
        p.top_k = 1;
        ASSERT_EQ(eng_sampler_init(&s, &p, NULL, 0), 0);
        ASSERT_EQ(eng_sampler_sample(&s, ws, logits, N, &tok), 0);
        ASSERT_EQ(tok, best);
    }
    eng_sample_ws_free(ws);
}

PC_TEST(nan_and_inf)
{
    float l[6] = {NAN, -INFINITY, 2.0f, NAN, 5.0f, -INFINITY};
    uint32_t tok;
    eng_sample_ws_t *ws;
    ASSERT_EQ(eng_sample_ws_init(6, &ws), 0);
    ASSERT_EQ(eng_sample_greedy(l, 6, &tok), 0);
    ASSERT_EQ(tok, 4);
    eng_sampling_params_t p = eng_sampling_params_default();
    eng_sampler_t s;
    ASSERT_EQ(eng_sampler_init(&s, &p, NULL, 0), 0);
    for (int i = 0; i < 2000; i++) {
        ASSERT_EQ(eng_sampler_sample(&s, ws, l, 6, &tok), 0);
        ASSERT_TRUE(tok == 2 || tok == 4); /* never NaN, never -inf */
    }
    PC_TEST_CALL(check_probs(&p, ws, l, 6));
    /* +inf tokens share everything equally; the finite ones get nothing. */
    float inf2[5] = {1.0f, INFINITY, 3.0f, INFINITY, NAN};
    float probs[5];
    ASSERT_EQ(eng_sample_probs(&p, ws, inf2, 5, probs), 0);
    ASSERT_NEAR(probs[1], 0.5, 1e-7);
    ASSERT_NEAR(probs[3], 0.5, 1e-7);
    ASSERT_EQ(probs[0] + probs[2] + probs[4], 0);
    ASSERT_EQ(eng_sample_greedy(inf2, 5, &tok), 0);
    ASSERT_EQ(tok, 1);
    /* No candidate: a clear error, and the PRNG did not move. */
    float bad[4] = {NAN, NAN, -INFINITY, NAN};
    eng_rng_t before = s.rng;
    tok = 77;
    ASSERT_EQ(eng_sampler_sample(&s, ws, bad, 4, &tok), PC_ERR_INVAL);
    ASSERT_EQ(tok, 77);
    ASSERT_MEM_EQ(&before, &s.rng, sizeof before);
    ASSERT_EQ(eng_sample_greedy(bad, 4, &tok), PC_ERR_INVAL);
    ASSERT_EQ(eng_sample_probs(&p, ws, bad, 4, probs), PC_ERR_INVAL);
    /* n_vocab beyond the scratch is refused, not overrun. */
    float big[7] = {0};
    ASSERT_EQ(eng_sampler_sample(&s, ws, big, 7, &tok), PC_ERR_INVAL);
    ASSERT_EQ(eng_sampler_sample(&s, ws, big, 0, &tok), PC_ERR_INVAL);
    eng_sample_ws_free(ws);
}

PC_TEST(support_sets_exact)
{
    /* logits 10, 9, ..., 1: every filter keeps a known prefix. */
    float l[10];
    for (int i = 0; i < 10; i++)
        l[i] = (float)(10 - i);
    eng_sample_ws_t *ws;
    ASSERT_EQ(eng_sample_ws_init(10, &ws), 0);
    float probs[10];
    eng_sampling_params_t p = eng_sampling_params_default();
    p.top_k = 3;
    ASSERT_EQ(eng_sample_probs(&p, ws, l, 10, probs), 0);
    for (int i = 0; i < 10; i++)
        ASSERT_EQ(probs[i] > 0, i < 3);
    /* softmax of 10..1 at T=1: p0 = 0.6321, p0+p1 = 0.8647, p0+p1+p2 = 0.9502. */
    p.top_k = 0;
    p.top_p = 0.86f;
    ASSERT_EQ(eng_sample_probs(&p, ws, l, 10, probs), 0);
    for (int i = 0; i < 10; i++)
        ASSERT_EQ(probs[i] > 0, i < 2);
    p.top_p = 0.87f;
    ASSERT_EQ(eng_sample_probs(&p, ws, l, 10, probs), 0);
    for (int i = 0; i < 10; i++)
        ASSERT_EQ(probs[i] > 0, i < 3);
    ASSERT_NEAR(probs[0], exp(10) / (exp(10) + exp(9) + exp(8)), 1e-6);
    /* min_p 0.1: exp(-2) = 0.135 >= 0.1 > exp(-3) = 0.0498, so three tokens. */
    p.top_p = 1;
    p.min_p = 0.1f;
    ASSERT_EQ(eng_sample_probs(&p, ws, l, 10, probs), 0);
    for (int i = 0; i < 10; i++)
        ASSERT_EQ(probs[i] > 0, i < 3);
    /* Ties at the top-k boundary go to the lowest ids. */
    float tie[6] = {1, 5, 3, 5, 5, 0};
    p = eng_sampling_params_default();
    p.top_k = 2;
    ASSERT_EQ(eng_sample_probs(&p, ws, tie, 6, probs), 0);
    ASSERT_NEAR(probs[1], 0.5, 1e-7);
    ASSERT_NEAR(probs[3], 0.5, 1e-7);
    ASSERT_EQ(probs[4], 0);
    eng_sample_ws_free(ws);
}

PC_TEST(matches_reference_random)
{
    eng_rng_t r;
    eng_rng_seed(&r, 1234);
    enum { NMAX = 6000 };
    float *l = malloc(NMAX * sizeof *l);
    eng_sample_ws_t *ws;
    ASSERT_EQ(eng_sample_ws_init(NMAX, &ws), 0);
    int iters = (int)(300 * pc_test_scale());
    for (int it = 0; it < iters; it++) {
        uint32_t n = 1 + (uint32_t)(eng_rng_next(&r) % NMAX);
        int shape = (int)(eng_rng_next(&r) % 4);
        for (uint32_t i = 0; i < n; i++) {
            float x = randn(&r) * 3;
            if (shape == 1)
                x = (float)(int)x; /* many ties */
            else if (shape == 2)
                x = (float)i * 0.001f; /* ascending: a bad case for naive pivots */
            else if (shape == 3)
                x = -(float)i * 0.001f;
            uint64_t u = eng_rng_next(&r) % 100;
            if (u == 0)
                x = NAN;
            else if (u == 1)
                x = -INFINITY;
            l[i] = x;
        }
        eng_sampling_params_t p = eng_sampling_params_default();
        p.temperature = (float)(0.3 + 1.5 * eng_rng_uniform(&r));
        uint64_t k = eng_rng_next(&r) % 4;
        p.top_k = k == 0   ? 0
                  : k == 1 ? 1 + (uint32_t)(eng_rng_next(&r) % 50)
                  : k == 2 ? 200 + (uint32_t)(eng_rng_next(&r) % 2000)
                           : 0;
        if (eng_rng_next(&r) % 2)
            p.top_p = (float)(0.05 + 0.94 * eng_rng_uniform(&r));
        if (eng_rng_next(&r) % 3 == 0)
            p.min_p = (float)(0.3 * eng_rng_uniform(&r));
        PC_TEST_CALL(check_probs(&p, ws, l, n));
    }
    free(l);
    eng_sample_ws_free(ws);
}

/* eng_sampler_sample and eng_sample_probs against ref_pick: the same token and the same
 * probabilities to the bit, over random rows (ties, NaN, +-inf, one-hot rows) and parameters. */
static void check_picks(const eng_sampling_params_t *p, eng_sample_ws_t *ws, const float *l,
                        uint32_t n, int draws)
{
    float *want_p = malloc(n * sizeof *want_p), *got_p = malloc(n * sizeof *got_p);
    eng_sampler_t s;
    ASSERT_EQ(eng_sampler_init(&s, p, NULL, 0), 0);
    for (int d = 0; d < draws; d++) {
        eng_rng_t next = s.rng;
        bool greedy = p->temperature == 0 || p->top_k == 1;
        double u = greedy ? 0 : eng_rng_uniform(&next);
        uint32_t want = ref_pick(p, l, n, u, want_p), got = UINT32_MAX;
        int rc = eng_sampler_sample(&s, ws, l, n, &got);
        if (want == UINT32_MAX) {
            ASSERT_EQ(rc, PC_ERR_INVAL);
            break;
        }
        ASSERT_EQ(rc, 0);
        if (got != want)
            fprintf(stderr, "  n %u T %g k %u p %.9g minp %g u %.17g: got %u want %u\n", n,
                    p->temperature, p->top_k, p->top_p, p->min_p, u, got, want);
        ASSERT_EQ(got, want);
        if (d == 0) {
            ASSERT_EQ(eng_sample_probs(p, ws, l, n, got_p), 0);
            ASSERT_MEM_EQ(got_p, want_p, n * sizeof *got_p);
        }
    }
    free(want_p);
    free(got_p);
}

PC_TEST(picks_match_scalar_loop)
{
    eng_rng_t r;
    eng_rng_seed(&r, 4321);
    enum { NMAX = 5000 };
    float *l = malloc(NMAX * sizeof *l);
    eng_sample_ws_t *ws;
    ASSERT_EQ(eng_sample_ws_init(NMAX, &ws), 0);
    int iters = (int)(1500 * pc_test_scale());
    for (int it = 0; it < iters; it++) {
        uint32_t n = 1 + (uint32_t)(eng_rng_next(&r) % NMAX);
        int shape = (int)(eng_rng_next(&r) % 5);
        float scale = (float)(0.5 + 20 * eng_rng_uniform(&r));
        for (uint32_t i = 0; i < n; i++) {
            float x = randn(&r) * scale;
            if (shape == 1)
                x = (float)(int)x; /* many ties */
            else if (shape == 2)
                x = (float)i * 0.001f;
            else if (shape == 3 && i % 97 != 5)
                x = -1e30f; /* nearly one-hot: most weights underflow to 0 */
            uint64_t o = eng_rng_next(&r) % 100;
            if (o == 0)
                x = NAN;
            else if (o == 1)
                x = -INFINITY;
            else if (o == 2 && shape == 4)
                x = INFINITY;
            l[i] = x;
        }
        eng_sampling_params_t p = eng_sampling_params_default();
        uint64_t t = eng_rng_next(&r) % 8;
        p.temperature = t == 0 ? 1.0f : t == 1 ? 0.0f : (float)(0.02 + 3 * eng_rng_uniform(&r));
        uint64_t k = eng_rng_next(&r) % 4;
        p.top_k = k == 0 ? 0 : (uint32_t)(1 + eng_rng_next(&r) % (k == 1 ? 50 : n + 10));
        if (eng_rng_next(&r) % 2)
            p.top_p = (float)(0.02 + 0.97 * eng_rng_uniform(&r));
        if (eng_rng_next(&r) % 3 == 0)
            p.min_p = (float)(0.3 * eng_rng_uniform(&r));
        p.seed = eng_rng_next(&r);
        PC_TEST_CALL(check_picks(&p, ws, l, n, 6));
    }
    free(l);
    eng_sample_ws_free(ws);
}

PC_TEST(draws_follow_distribution)
{
    /* Chi-square of 200000 draws against eng_sample_probs. The seed is fixed, so the statistic
     * is a fixed number: the bound (about the 99.999% quantile for <= 7 degrees of freedom) can
     * only fail if the draw does not follow the distribution. */
    static const float l[8] = {1.0f, 2.5f, 0.3f, 2.5f, -1.0f, 1.7f, 0.0f, 3.0f};
    static const eng_sampling_params_t cases[] = {
        {1.0f, 0, 1.0f, 0.0f, 11},  {0.7f, 5, 1.0f, 0.0f, 12}, {1.3f, 0, 0.8f, 0.0f, 13},
        {1.0f, 6, 0.9f, 0.05f, 14}, {2.0f, 0, 1.0f, 0.2f, 15},
    };
    eng_sample_ws_t *ws;
    ASSERT_EQ(eng_sample_ws_init(8, &ws), 0);
    for (size_t c = 0; c < PC_ARRAY_LEN(cases); c++) {
        float probs[8];
        ASSERT_EQ(eng_sample_probs(&cases[c], ws, l, 8, probs), 0);
        eng_sampler_t s;
        ASSERT_EQ(eng_sampler_init(&s, &cases[c], NULL, 0), 0);
        enum { DRAWS = 200000 };
        uint32_t count[8] = {0};
        for (int i = 0; i < DRAWS; i++) {
            uint32_t tok;
            ASSERT_EQ(eng_sampler_sample(&s, ws, l, 8, &tok), 0);
            ASSERT_TRUE(tok < 8 && probs[tok] > 0); /* never outside the support */
            count[tok]++;
        }
        double chi2 = 0;
        int df = -1;
        for (int i = 0; i < 8; i++) {
            if (probs[i] == 0)
                continue;
            double e = probs[i] * DRAWS;
            chi2 += (count[i] - e) * (count[i] - e) / e;
            df++;
        }
        printf("  case %zu: chi2 %.2f, %d degrees of freedom\n", c, chi2, df);
        ASSERT_LE(chi2, 35.0);
    }
    eng_sample_ws_free(ws);
}

PC_TEST(same_seed_same_tokens)
{
    enum { N = 5000, STEPS = 64 };
    float *l = malloc((size_t)STEPS * N * sizeof *l);
    eng_rng_t r;
    eng_rng_seed(&r, 99);
    for (size_t i = 0; i < (size_t)STEPS * N; i++)
        l[i] = randn(&r) * 2;
    eng_sample_ws_t *ws;
    ASSERT_EQ(eng_sample_ws_init(N, &ws), 0);
    eng_sampling_params_t p = eng_sampling_params_default();
    p.temperature = 0.9f;
    p.top_p = 0.95f;
    p.seed = 2024;
    uint32_t a[STEPS], b[STEPS], c[STEPS];
    eng_sampler_t s1, s2, s3;
    ASSERT_EQ(eng_sampler_init(&s1, &p, NULL, 0), 0);
    ASSERT_EQ(eng_sampler_init(&s2, &p, NULL, 0), 0);
    p.seed = 2025;
    ASSERT_EQ(eng_sampler_init(&s3, &p, NULL, 0), 0);
    for (int t = 0; t < STEPS; t++) {
        ASSERT_EQ(eng_sampler_sample(&s1, ws, l + (size_t)t * N, N, &a[t]), 0);
        ASSERT_EQ(eng_sampler_sample(&s3, ws, l + (size_t)t * N, N, &c[t]), 0);
        ASSERT_EQ(eng_sampler_sample(&s2, ws, l + (size_t)t * N, N, &b[t]), 0);
    }
    ASSERT_MEM_EQ(a, b, sizeof a);
    int differ = 0;
    for (int t = 0; t < STEPS; t++)
        differ += a[t] != c[t];
    ASSERT_TRUE(differ > 0);
    free(l);
    eng_sample_ws_free(ws);
}

PC_TEST(large_vocab_reference_and_timing)
{
    enum { N = 152064 };
    float *l = malloc(N * sizeof *l);
    eng_rng_t r;
    eng_rng_seed(&r, 5);
    for (uint32_t i = 0; i < N; i++)
        l[i] = randn(&r) * 2.5f;
    eng_sample_ws_t *ws;
    ASSERT_EQ(eng_sample_ws_init(N, &ws), 0);
    static const struct {
        const char *name;
        eng_sampling_params_t p;
    } cases[] = {
        {"greedy", {0.0f, 0, 1.0f, 0.0f, 1}},
        {"temperature 0.8", {0.8f, 0, 1.0f, 0.0f, 1}},
        {"top_k 40", {0.8f, 40, 1.0f, 0.0f, 1}},
        {"top_p 0.95", {0.8f, 0, 0.95f, 0.0f, 1}},
        {"top_k 40 + top_p 0.95", {0.8f, 40, 0.95f, 0.0f, 1}},
        {"top_k 1000", {0.8f, 1000, 1.0f, 0.0f, 1}},
        {"min_p 0.05", {0.8f, 0, 1.0f, 0.05f, 1}},
    };
    for (size_t c = 0; c < PC_ARRAY_LEN(cases); c++) {
        PC_TEST_CALL(check_probs(&cases[c].p, ws, l, N));
        PC_TEST_CALL(check_picks(&cases[c].p, ws, l, N, 3));
        eng_sampler_t s;
        ASSERT_EQ(eng_sampler_init(&s, &cases[c].p, NULL, 0), 0);
        int reps = 200;
        uint64_t t0 = pc_time_mono_ns();
        uint64_t acc = 0;
        for (int i = 0; i < reps; i++) {
            uint32_t tok;
            ASSERT_EQ(eng_sampler_sample(&s, ws, l, N, &tok), 0);
            acc += tok;
        }
        double us = (double)(pc_time_mono_ns() - t0) / 1e3 / reps;
        printf("  timing: %-24s %8.1f us/token over %u logits (sum %llu)\n", cases[c].name, us,
               (unsigned)N, (unsigned long long)acc);
    }
    free(l);
    eng_sample_ws_free(ws);
}

PC_TEST_MAIN()
