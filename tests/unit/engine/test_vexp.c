/*
 * test_vexp.c — engine/vexp.c: the exp() every sampler weight uses. Within 1 ulp of libm's
 * exp() on millions of points (the whole range the sampler uses, subnormal results and the edges
 * included), and the same bits on every ISA path this CPU runs (AVX-512, AVX2 + FMA, portable),
 * for the plain row and for the sampler's weight pass with its sum.
 */
#include "pc_test.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "common.h"
#include "sampling.h"
#include "vexp.h"

static const eng_cpu_isa_t isas[] = {ENG_CPU_ISA_PORTABLE, ENG_CPU_ISA_AVX2, ENG_CPU_ISA_AVX512};

/* A double's position on the number line in units of ulps (monotone for all non-NaN doubles,
 * -0 and +0 the same point). */
static int64_t ordered(double x)
{
    int64_t i;
    memcpy(&i, &x, sizeof i);
    return i < 0 ? INT64_MIN - i : i;
}

static int64_t ulp_diff(double a, double b)
{
    int64_t d = ordered(a) - ordered(b);
    return d < 0 ? -d : d;
}

static uint64_t bits(double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static double uniform(eng_rng_t *r, double lo, double hi)
{
    return lo + (hi - lo) * eng_rng_uniform(r);
}

/* The test points: the edges, then n_random drawn from several distributions. Returns the
 * count written to x (which has room for n_random + 256). */
static size_t make_points(double *x, size_t n_random, uint64_t seed)
{
    static const double edges[] = {0.0,
                                   -0.0,
                                   -0x1p-1074,
                                   -0x1p-1022,
                                   -1e-300,
                                   -1e-20,
                                   -0x1p-54,
                                   -0x1p-53,
                                   -1e-10,
                                   -0.34657359027997264,
                                   -0.3465735902799727,
                                   -0.5,
                                   -1.0,
                                   -2.0,
                                   -10.0,
                                   -87.0,
                                   -103.0,
                                   -700.0,
                                   -708.0,
                                   -708.3964185322641,
                                   -708.39641853226419,
                                   -708.4,
                                   -709.0,
                                   -709.78,
                                   -720.0,
                                   -730.0,
                                   -740.0,
                                   -744.0,
                                   -744.44007192138122,
                                   -745.0,
                                   -745.1332191019411,
                                   -745.13321910194111,
                                   -745.1332191019412,
                                   -745.14,
                                   -745.2,
                                   -745.9,
                                   -746.0,
                                   -746.1,
                                   -750.0,
                                   -1000.0,
                                   -1e10,
                                   -1e300,
                                   -DBL_MAX,
                                   -INFINITY,
                                   0x1p-1074,
                                   1e-10,
                                   0.5,
                                   1.0,
                                   10.0,
                                   88.7,
                                   700.0,
                                   709.0,
                                   709.78,
                                   709.782712893384,
                                   709.7827128933841,
                                   709.79,
                                   710.0,
                                   711.0,
                                   1e300,
                                   INFINITY};
    size_t n = 0;
    for (size_t i = 0; i < PC_ARRAY_LEN(edges); i++)
        x[n++] = edges[i];
    /* Around every reduction boundary (k + 1/2) ln 2 near the subnormal range and near 0. */
    for (int k = 0; k < 40; k++) {
        double b = -(k + 0.5) * 0.6931471805599453;
        x[n++] = nextafter(b, 0);
        x[n++] = nextafter(b, -INFINITY);
    }
    eng_rng_t r;
    eng_rng_seed(&r, seed);
    for (size_t i = 0; i < n_random; i++) {
        switch (i % 6) {
        case 0: /* the sampler's usual range */
            x[n++] = uniform(&r, -60.0, 0.0);
            break;
        case 1: /* everything down to total underflow */
            x[n++] = uniform(&r, -750.0, 0.0);
            break;
        case 2: /* subnormal results */
            x[n++] = uniform(&r, -746.0, -708.0);
            break;
        case 3: /* magnitudes spread over many binades, 2^-60 .. 2^10 */
            x[n++] = -exp2(uniform(&r, -60.0, 10.0));
            break;
        case 4: /* tiny reduced arguments: near a multiple of ln 2 */
            x[n++] =
                -(double)(eng_rng_next(&r) % 1075) * 0.6931471805599453 + uniform(&r, -1e-6, 1e-6);
            break;
        default: /* positive arguments (not the sampler's, but the function is defined there) */
            x[n++] = uniform(&r, 0.0, 709.7);
            break;
        }
    }
    return n;
}

PC_TEST(edges_exact)
{
    ASSERT_TRUE(eng_vexp(0.0) == 1.0);
    ASSERT_TRUE(eng_vexp(-0.0) == 1.0);
    ASSERT_TRUE(eng_vexp(-INFINITY) == 0.0);
    ASSERT_TRUE(eng_vexp(-1e300) == 0.0);
    ASSERT_TRUE(eng_vexp(-745.2) == 0.0);
    /* exp(-745.1332) is just above half the smallest subnormal: it rounds up to it. */
    ASSERT_TRUE(eng_vexp(-745.1332191019411) == 0x1p-1074);
    ASSERT_TRUE(eng_vexp(-745.1332191019412) == 0.0);
    ASSERT_TRUE(eng_vexp(INFINITY) == INFINITY);
    ASSERT_TRUE(eng_vexp(709.79) == INFINITY);
    ASSERT_TRUE(eng_vexp(709.78) < INFINITY);
    /* NaN is clamped like -inf (the sampler never passes one; the paths agree on it). */
    ASSERT_TRUE(eng_vexp(NAN) == 0.0);
    ASSERT_TRUE(eng_vexp(1.0) == exp(1.0) || ulp_diff(eng_vexp(1.0), exp(1.0)) == 1);
}

PC_TEST(within_one_ulp_of_libm)
{
    size_t n_random = (size_t)(6e6 * pc_test_scale());
    double *x = malloc((n_random + 256) * sizeof *x);
    ASSERT_TRUE(x != NULL);
    size_t n = make_points(x, n_random, 11);
    int64_t worst = 0;
    double worst_x = 0;
    size_t off_by_one = 0, subnormal = 0;
    for (size_t i = 0; i < n; i++) {
        double a = eng_vexp(x[i]), b = exp(x[i]);
        int64_t d = ulp_diff(a, b);
        if (b != 0 && b < DBL_MIN)
            subnormal++;
        off_by_one += d == 1;
        if (d > worst) {
            worst = d;
            worst_x = x[i];
        }
        if (d > 1) {
            fprintf(stderr, "  x = %a: vexp %a, libm exp %a (%lld ulp)\n", x[i], a, b,
                    (long long)d);
            ASSERT_LE(d, 1);
        }
    }
    printf("  %zu points (%zu subnormal results): worst %lld ulp (x = %.17g), %zu differ by 1 "
           "ulp (%.4f%%)\n",
           n, subnormal, (long long)worst, worst_x, off_by_one, 100.0 * off_by_one / n);
    ASSERT_TRUE(subnormal > 100000);
    free(x);
}

PC_TEST(every_path_same_bits)
{
    size_t n_random = (size_t)(2e6 * pc_test_scale()) + 13; /* a tail on every path */
    double *x = malloc((n_random + 256) * sizeof *x);
    double *want = malloc((n_random + 256) * sizeof *want);
    double *got = malloc((n_random + 256) * sizeof *got);
    ASSERT_TRUE(x != NULL && want != NULL && got != NULL);
    size_t n = make_points(x, n_random, 12);
    x[n++] = NAN;
    x[n++] = -NAN;
    for (size_t i = 0; i < n; i++)
        want[i] = eng_vexp(x[i]);
    int ran = 0;
    for (size_t a = 0; a < PC_ARRAY_LEN(isas); a++) {
        if (!eng__cpu_isa_runs(isas[a]))
            continue;
        ran++;
        /* Every offset, so each point is in a vector body once and in a tail once. */
        for (size_t off = 0; off < 9; off += 3) {
            memset(got, 0xff, n * sizeof *got);
            eng_vexp_row_isa(x + off, got + off, n - off, isas[a]);
            for (size_t i = off; i < n; i++) {
                if (bits(got[i]) != bits(want[i])) {
                    fprintf(stderr, "  %s: x = %a gives %a, scalar %a\n",
                            eng__cpu_isa_name(isas[a]), x[i], got[i], want[i]);
                    ASSERT_EQ_U64(bits(got[i]), bits(want[i]));
                }
            }
        }
    }
    printf("  %zu points, %d paths agree bit for bit (best path here: %s)\n", n, ran,
           eng__cpu_isa_name(eng__cpu_isa_best()));
    free(x);
    free(want);
    free(got);
}

static float randn(eng_rng_t *r)
{
    double u1 = eng_rng_uniform(r), u2 = eng_rng_uniform(r);
    return (float)(sqrt(-2.0 * log(u1 + 1e-300)) * cos(6.283185307179586 * u2));
}

/* The weight pass: the same weights and the same sum on every path as a scalar loop. */
PC_TEST(weights_every_path_same_bits)
{
    enum { N = 4099 };
    float *l = malloc(N * sizeof *l);
    double *want = malloc(N * sizeof *want), *got = malloc(N * sizeof *got);
    ASSERT_TRUE(l != NULL && want != NULL && got != NULL);
    eng_rng_t r;
    eng_rng_seed(&r, 13);
    for (int round = 0; round < 60; round++) {
        float scale = (float)uniform(&r, 0.5, 40.0);
        for (uint32_t i = 0; i < N; i++) {
            l[i] = randn(&r) * scale;
            uint64_t o = eng_rng_next(&r) % 64;
            if (o == 0)
                l[i] = NAN;
            else if (o == 1)
                l[i] = -INFINITY;
            else if (o == 2 && round % 3 == 0)
                l[i] = INFINITY;
        }
        float maxv = -INFINITY;
        for (uint32_t i = 0; i < N; i++) {
            float v = l[i] > FLT_MAX ? FLT_MAX : l[i];
            if (v > maxv)
                maxv = v;
        }
        double mx = maxv;
        double t = round % 4 == 0 ? 1.0 : uniform(&r, 0.05, 3.0);
        double inv_t = 1.0 / (double)(float)t;
        double thr =
            round % 2 == 0 ? -INFINITY : mx + (double)(float)t * log(uniform(&r, 1e-6, 0.3));
        double sum = 0;
        for (uint32_t i = 0; i < N; i++) {
            float v = l[i] > FLT_MAX ? FLT_MAX : l[i];
            want[i] = !isnan(v) && (double)v >= thr ? eng_vexp(((double)v - mx) * inv_t) : 0.0;
            sum += want[i];
        }
        for (size_t a = 0; a < PC_ARRAY_LEN(isas); a++) {
            if (!eng__cpu_isa_runs(isas[a]))
                continue;
            size_t n = N - (size_t)round % 9; /* varying tails */
            double s = 0;
            for (size_t i = 0; i < n; i++)
                s += want[i];
            if (n == N)
                ASSERT_EQ_U64(bits(s), bits(sum));
            double got_sum = eng_vexp_weights_isa(l, n, mx, inv_t, thr, false, got, isas[a]);
            ASSERT_EQ_U64(bits(got_sum), bits(s));
            for (size_t i = 0; i < n; i++)
                ASSERT_EQ_U64(bits(got[i]), bits(want[i]));
            /* Prefix mode: the running sums, the last one the returned sum. */
            got_sum = eng_vexp_weights_isa(l, n, mx, inv_t, thr, true, got, isas[a]);
            ASSERT_EQ_U64(bits(got_sum), bits(s));
            double run = 0;
            for (size_t i = 0; i < n; i++) {
                run += want[i];
                ASSERT_EQ_U64(bits(got[i]), bits(run));
            }
        }
    }
    free(l);
    free(want);
    free(got);
}

/* Figures: the row kernel's speed on each path and libm's, over a 152k row (not pass/fail). */
PC_TEST(timing)
{
    enum { N = 152064, REPS = 50 };
    double *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    ASSERT_TRUE(x != NULL && y != NULL);
    eng_rng_t r;
    eng_rng_seed(&r, 14);
    for (size_t i = 0; i < N; i++)
        x[i] = uniform(&r, -30.0, 0.0);
    double acc = 0;
    uint64_t t0 = pc_time_mono_ns();
    for (int k = 0; k < REPS; k++) {
        for (size_t i = 0; i < N; i++)
            y[i] = exp(x[i]);
        acc += y[k];
    }
    printf("  libm exp           %8.2f ns/value\n",
           (double)(pc_time_mono_ns() - t0) / ((double)N * REPS));
    for (size_t a = 0; a < PC_ARRAY_LEN(isas); a++) {
        if (!eng__cpu_isa_runs(isas[a]))
            continue;
        t0 = pc_time_mono_ns();
        for (int k = 0; k < REPS; k++) {
            eng_vexp_row_isa(x, y, N, isas[a]);
            acc += y[k];
        }
        printf("  vexp %-13s %8.2f ns/value\n", eng__cpu_isa_name(isas[a]),
               (double)(pc_time_mono_ns() - t0) / ((double)N * REPS));
    }
    ASSERT_TRUE(acc > 0);
    free(x);
    free(y);
}

PC_TEST_MAIN()
