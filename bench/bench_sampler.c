/*
 * bench_sampler.c — `kvgw bench sampler`: the CPU sampler's time per sampled token
 * (engine/sampling.h) at the vocabularies of Llama 3 (128256) and Qwen 2 (152064), for greedy,
 * plain sampling at temperature 1, top_p 0.9, top_k 40 + top_p 0.9 and min_p 0.05: the median of
 * many samples, each timed on its own, over fixed pseudo-random logits (normal, sd 2.5, the
 * same every run). Also the exp pass alone: ns per value of pc_exp on the best ISA path
 * (eng_sample_exp_row, engine/vexp.h) beside libm's exp().
 *
 * Figures on the 2-core dev VM (AMD EPYC, AVX-512) are in the README. Logits like these (a
 * broad distribution) are the slow case for top_p, whose kept set is then large; a real model's
 * peaked logits keep few tokens.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "engine.h"
#include "pc_time.h"
#include "sampling.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvgw bench sampler [--reps N]\n");
    fprintf(f, "  --reps N  samples timed per case (default 301; the median is reported)\n");
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static float randn(eng_rng_t *r)
{
    double u1 = eng_rng_uniform(r), u2 = eng_rng_uniform(r);
    return (float)(sqrt(-2.0 * log(u1 + 1e-300)) * cos(6.283185307179586 * u2));
}

/* The median time of one eng_sampler_sample in us, or -1 on an error. */
static double time_case(const eng_sampling_params_t *p, eng_sample_ws_t *ws, const float *l,
                        uint32_t n, int reps, uint64_t *ns)
{
    eng_sampler_t s;
    if (eng_sampler_init(&s, p, NULL, 0) != 0)
        return -1;
    uint32_t tok;
    for (int i = 0; i < 3; i++) /* warm the scratch and caches */
        if (eng_sampler_sample(&s, ws, l, n, &tok) != 0)
            return -1;
    for (int i = 0; i < reps; i++) {
        uint64_t t0 = pc_time_mono_ns();
        if (eng_sampler_sample(&s, ws, l, n, &tok) != 0)
            return -1;
        ns[i] = pc_time_mono_ns() - t0;
    }
    qsort(ns, (size_t)reps, sizeof *ns, cmp_u64);
    return (double)ns[reps / 2] / 1e3;
}

int bench_sampler_main(int argc, char **argv)
{
    int reps = 301;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
            if (reps < 1 || reps > 100000) {
                fprintf(stderr, "kvgw bench sampler: --reps: '%s' is not in 1..100000\n", argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "kvgw bench sampler: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    static const uint32_t vocabs[] = {128256, 152064};
    static const struct {
        const char *key;
        eng_sampling_params_t p;
    } cases[] = {
        {"greedy", {0.0f, 0, 1.0f, 0.0f, 1}},
        {"plain_t1", {1.0f, 0, 1.0f, 0.0f, 1}},
        {"top_p_0_9", {1.0f, 0, 0.9f, 0.0f, 1}},
        {"top_k_40_top_p_0_9", {1.0f, 40, 0.9f, 0.0f, 1}},
        {"min_p_0_05", {1.0f, 0, 1.0f, 0.05f, 1}},
    };
    uint32_t vmax = 152064;
    float *l = malloc(sizeof(float) * vmax);
    double *x = malloc(sizeof(double) * vmax), *y = malloc(sizeof(double) * vmax);
    uint64_t *ns = malloc(sizeof(uint64_t) * (size_t)reps);
    eng_sample_ws_t *ws = NULL;
    int rc = 1;
    if (l == NULL || x == NULL || y == NULL || ns == NULL || eng_sample_ws_init(vmax, &ws) != 0) {
        fprintf(stderr, "kvgw bench sampler: out of memory\n");
        goto done;
    }
    eng_rng_t r;
    eng_rng_seed(&r, 5);
    for (uint32_t i = 0; i < vmax; i++)
        l[i] = randn(&r) * 2.5f;

    bench_report_t rep;
    bench_report_init(&rep, "sampler");
    for (size_t v = 0; v < sizeof vocabs / sizeof vocabs[0]; v++) {
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            double us = time_case(&cases[c].p, ws, l, vocabs[v], reps, ns);
            if (us < 0) {
                fprintf(stderr, "kvgw bench sampler: sampling failed\n");
                goto done;
            }
            char key[64];
            snprintf(key, sizeof key, "sample_us_v%u_%s", vocabs[v], cases[c].key);
            bench_report_add(&rep, key, us, "median per sampled token");
        }
    }
    /* The exp pass alone over a 152064 row of arguments in [-30, 0]. */
    for (uint32_t i = 0; i < vmax; i++)
        x[i] = -30.0 * eng_rng_uniform(&r);
    double sink = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < 21; i++) {
            uint64_t t0 = pc_time_mono_ns();
            if (pass == 0) {
                eng_sample_exp_row(x, y, vmax);
            } else {
                for (uint32_t j = 0; j < vmax; j++)
                    y[j] = exp(x[j]);
            }
            ns[i] = pc_time_mono_ns() - t0;
            sink += y[i];
        }
        qsort(ns, 21, sizeof *ns, cmp_u64);
        bench_report_add(&rep, pass == 0 ? "pc_exp_ns_per_value" : "libm_exp_ns_per_value",
                         (double)ns[10] / vmax,
                         pass == 0 ? eng_cpu_isa_best_name() : "for comparison");
    }
    if (!(sink > 0)) /* keeps the exp loops from being optimized away */
        fprintf(stderr, "kvgw bench sampler: unexpected exp results\n");
    bench_report_print(&rep);
    rc = 0;
done:
    eng_sample_ws_free(ws);
    free(l);
    free(x);
    free(y);
    free(ns);
    return rc;
}
