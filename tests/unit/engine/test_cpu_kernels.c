/*
 * test_cpu_kernels.c — the CPU kernels of every ISA path this CPU runs (avx512, avx2, portable;
 * cpu.h) against naive references: half-precision rows bit for bit against the scalar
 * conversions of half.h (rounding ties, subnormals, infinities, NaN), the decode GEMV and the
 * whole matrix product (eng__matmul: GEMV, AVX2 GEMM, converted tiles and sgemm) on F32, F16
 * and BF16 weights against a double-precision product (Q8_0 and the other quantized types, whose
 * products take x quantized, are test_cpu_quant's) (row counts around every tile,
 * lengths with every tail), and the element-wise kernels (RMS norm, SwiGLU, both RoPE layouts).
 * Also the path selection: names, parsing, KVGW_CPU_ISA and refusals, and the thread pool
 * (every task of every run once, before the run returns).
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu.h"
#include "cpu_kernels.h"
#include "cpu_simd.h"
#include "gguf.h"
#include "half.h"
#include "pc_assert.h"
#include "pc_err.h"
#include "pc_test.h"

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static float unif(void)
{
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) * 0x1.0p-53 * 2 - 1);
}

static const eng_cpu_isa_t paths[] = {ENG_CPU_ISA_AVX512, ENG_CPU_ISA_AVX2, ENG_CPU_ISA_PORTABLE};

static void gemv_isa(eng_cpu_isa_t isa, const eng_gemv_t *g, uint32_t n0, uint32_t n1)
{
#if defined(__x86_64__) || defined(__i386__)
    if (isa == ENG_CPU_ISA_AVX512) {
        eng__avx512_gemv(g, n0, n1);
        return;
    }
    if (isa == ENG_CPU_ISA_AVX2) {
        eng__avx2_gemv(g, n0, n1);
        return;
    }
#endif
    eng__port_gemv(g, n0, n1);
}

/* The weight types the kernels read, and their names. */
static const uint32_t wtypes[] = {ENG_GGML_TYPE_F32, ENG_GGML_TYPE_F16, ENG_GGML_TYPE_BF16};

static const char *wtype_name(uint32_t t)
{
    return eng_ggml_type_name(t);
}

/* N rows of K random weights of type t (malloc'ed, K a multiple of 32 for Q8_0), and the same
 * values exactly as F32 in w32[N][K]: each type's rounding is applied before the reference sees
 * them. Q8_0 blocks get scales of different magnitudes and quants over the whole int8 range. */
static void *make_weights(uint32_t t, uint32_t N, uint32_t K, float *w32)
{
    size_t n = (size_t)N * K;
    void *w = malloc(eng__gemv_row_bytes(t, K) * N + 1);
    switch (t) {
    case ENG_GGML_TYPE_F16:
    case ENG_GGML_TYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = t == ENG_GGML_TYPE_F16 ? eng_f32_to_f16(unif()) : eng_f32_to_bf16(unif());
            ((uint16_t *)w)[i] = h;
            w32[i] = t == ENG_GGML_TYPE_F16 ? eng_f16_to_f32(h) : eng_bf16_to_f32(h);
        }
        break;
    case ENG_GGML_TYPE_Q8_0:
        for (size_t b = 0; b < n / ENG_QK8_0; b++) {
            uint8_t *blk = (uint8_t *)w + b * ENG_Q8_0_BYTES;
            uint16_t d = eng_f32_to_f16((unif() + 1.5f) * (b % 3 == 0 ? 1e-3f : 1e-2f));
            memcpy(blk, &d, 2);
            for (uint32_t j = 0; j < ENG_QK8_0; j++) {
                int8_t q = (int8_t)(int)(unif() * 127.5f);
                blk[2 + j] = (uint8_t)q;
                w32[b * ENG_QK8_0 + j] = eng_f16_to_f32(d) * (float)q;
            }
        }
        break;
    default:
        for (size_t i = 0; i < n; i++)
            ((float *)w)[i] = w32[i] = unif();
        break;
    }
    return w;
}

PC_TEST(isa_selection)
{
    eng_cpu_isa_t best = eng__cpu_isa_best(), v = ENG_CPU_ISA_AUTO;
    ASSERT_TRUE(best != ENG_CPU_ISA_AUTO);
    ASSERT_TRUE(eng__cpu_isa_runs(ENG_CPU_ISA_PORTABLE));
    ASSERT_TRUE(eng__cpu_isa_runs(best));
    if (eng__cpu_isa_runs(ENG_CPU_ISA_AVX512))
        ASSERT_TRUE(eng__cpu_isa_runs(ENG_CPU_ISA_AVX2)); /* the ladder has no holes */
    ASSERT_EQ(eng__cpu_isa_parse("avx2", &v), 0);
    ASSERT_EQ(v, ENG_CPU_ISA_AVX2);
    ASSERT_EQ(eng__cpu_isa_parse("AVX2", &v), PC_ERR_INVAL);
    ASSERT_EQ(v, ENG_CPU_ISA_AVX2);
    ASSERT_STR_EQ(eng__cpu_isa_name(ENG_CPU_ISA_AVX512), "avx512");
    ASSERT_STR_EQ(eng__cpu_isa_name(ENG_CPU_ISA_PORTABLE), "portable");
    char err[160];
    unsetenv("KVGW_CPU_ISA");
    ASSERT_EQ(eng__cpu_isa_resolve(NULL, &v, err, sizeof err), 0);
    ASSERT_EQ(v, best);
    setenv("KVGW_CPU_ISA", "portable", 1);
    ASSERT_EQ(eng__cpu_isa_resolve("", &v, err, sizeof err), 0);
    ASSERT_EQ(v, ENG_CPU_ISA_PORTABLE);
    ASSERT_EQ(eng__cpu_isa_resolve("auto", &v, err, sizeof err), 0); /* the request wins */
    ASSERT_EQ(v, best);
    setenv("KVGW_CPU_ISA", "avx1024", 1);
    v = ENG_CPU_ISA_AVX2;
    ASSERT_EQ(eng__cpu_isa_resolve(NULL, &v, err, sizeof err), PC_ERR_INVAL);
    ASSERT_EQ(v, ENG_CPU_ISA_AVX2);
    ASSERT_TRUE(strstr(err, "KVGW_CPU_ISA") != NULL && strstr(err, "avx1024") != NULL);
    unsetenv("KVGW_CPU_ISA");
    for (size_t i = 0; i < PC_ARRAY_LEN(paths); i++) {
        int rc = eng__cpu_isa_resolve(eng__cpu_isa_name(paths[i]), &v, err, sizeof err);
        if (eng__cpu_isa_runs(paths[i])) {
            ASSERT_EQ(rc, 0);
            ASSERT_EQ(v, paths[i]);
        } else {
            ASSERT_EQ(rc, PC_ERR_UNSUPPORTED);
            ASSERT_TRUE(strstr(err, "cannot run on this CPU") != NULL);
            ASSERT_EQ(eng__cpu_isa_clamp(paths[i]), best); /* kernels never run it */
        }
    }
}

/* Every path converts exactly as the scalar reference, both ways. */
PC_TEST(half_rows_bit_exact)
{
    enum { N = 4099 };
    uint16_t *h = malloc(N * sizeof *h), *h2 = malloc(N * sizeof *h2);
    float *f = malloc(N * sizeof *f), *f2 = malloc(N * sizeof *f2);
    for (uint32_t i = 0; i < N; i++)
        h[i] = (uint16_t)(i * 16u + (i >> 8)); /* every exponent, subnormals, inf, NaN */
    float special[] = {0.0f,
                       -0.0f,
                       65504.0f,
                       65520.0f,
                       1e-8f,
                       5.96e-8f,
                       2.98e-8f,
                       1e30f,
                       -INFINITY,
                       INFINITY,
                       1.0009765625f + 0x1p-11f,
                       0.33333334f};
    for (uint32_t i = 0; i < N; i++)
        f[i] = i < PC_ARRAY_LEN(special) ? special[i] : unif() * (float)(1u << (i % 20)) * 0.01f;
    for (size_t pi = 0; pi < PC_ARRAY_LEN(paths); pi++) {
        if (!eng__cpu_isa_runs(paths[pi]))
            continue;
        for (size_t n = 0; n <= 40; n += 1 + n / 8) { /* lengths around the vector widths */
            eng__f16_to_f32_row_isa(h, f2, n, paths[pi]);
            for (size_t i = 0; i < n; i++) {
                float r = eng_f16_to_f32(h[i]);
                ASSERT_TRUE(memcmp(&r, &f2[i], 4) == 0 || (isnan(r) && isnan(f2[i])));
            }
        }
        eng__f16_to_f32_row_isa(h, f2, N, paths[pi]);
        for (size_t i = 0; i < N; i++) {
            float r = eng_f16_to_f32(h[i]);
            if (!(memcmp(&r, &f2[i], 4) == 0 || (isnan(r) && isnan(f2[i]))))
                fprintf(stderr, "  %s: half %04x -> %g, want %g\n", eng__cpu_isa_name(paths[pi]),
                        h[i], f2[i], r);
            ASSERT_TRUE(memcmp(&r, &f2[i], 4) == 0 || (isnan(r) && isnan(f2[i])));
        }
        eng__f32_to_f16_row_isa(f, h2, N, paths[pi]);
        for (size_t i = 0; i < N; i++) {
            uint16_t r = eng_f32_to_f16(f[i]);
            if (r != h2[i])
                fprintf(stderr, "  %s: %a -> %04x, want %04x\n", eng__cpu_isa_name(paths[pi]), f[i],
                        h2[i], r);
            ASSERT_EQ(h2[i], r);
        }
    }
    free(h), free(h2), free(f), free(f2);
}

/* y = x . w^T on a slice of output rows, (+)=, against double precision, for F32, F16 and BF16
 * weights; the rows outside the slice are never written. */
PC_TEST(gemv_matches_double_reference)
{
    uint32_t Ks[] = {1, 7, 8, 32, 37, 64, 96, 129, 200, 1024, 1030};
    uint32_t Ms[] = {1, 2, 3, 4, 5, 8, 9, 17, 31};
    enum { N = 23, N0 = 3, N1 = 21 };
    for (size_t ki = 0; ki < PC_ARRAY_LEN(Ks); ki++) {
        uint32_t K = Ks[ki];
        float *w32 = malloc((size_t)N * K * 4), *x = malloc((size_t)31 * K * 4);
        for (size_t i = 0; i < (size_t)31 * K; i++)
            x[i] = unif();
        for (size_t ti = 0; ti < PC_ARRAY_LEN(wtypes); ti++) {
            uint32_t t = wtypes[ti];
            if (t == ENG_GGML_TYPE_Q8_0 && K % ENG_QK8_0 != 0)
                continue;
            void *w = make_weights(t, N, K, w32);
            for (size_t mi = 0; mi < PC_ARRAY_LEN(Ms); mi++) {
                uint32_t M = Ms[mi];
                float y[31 * N], y0[31 * N];
                for (size_t i = 0; i < PC_ARRAY_LEN(y0); i++)
                    y0[i] = unif();
                for (int acc = 0; acc < 2; acc++) {
                    for (size_t pi = 0; pi < PC_ARRAY_LEN(paths); pi++) {
                        if (!eng__cpu_isa_runs(paths[pi]))
                            continue;
                        memcpy(y, y0, sizeof y);
                        eng_gemv_t g = {.w = w,
                                        .wtype = t,
                                        .x = x,
                                        .M = M,
                                        .K = K,
                                        .y = y,
                                        .ldy = N,
                                        .accumulate = acc == 1};
                        gemv_isa(paths[pi], &g, N0, N1);
                        for (uint32_t m = 0; m < M; m++) {
                            for (uint32_t n = 0; n < N; n++) {
                                size_t i = (size_t)m * N + n;
                                if (n < N0 || n >= N1) {
                                    ASSERT_EQ(y[i], y0[i]);
                                    continue;
                                }
                                double r = acc ? y0[i] : 0, mag = acc ? fabs(y0[i]) : 0;
                                for (uint32_t k = 0; k < K; k++) {
                                    double pr =
                                        (double)w32[(size_t)n * K + k] * x[(size_t)m * K + k];
                                    r += pr;
                                    mag += fabs(pr);
                                }
                                double tol = 1e-6 * (mag + 1) + 1e-6;
                                if (!(fabs(y[i] - r) <= tol))
                                    fprintf(stderr, "  %s %s K=%u M=%u m=%u n=%u: %g vs %g\n",
                                            eng__cpu_isa_name(paths[pi]), wtype_name(t), K, M, m, n,
                                            y[i], r);
                                ASSERT_LE(fabs(y[i] - r), tol);
                            }
                        }
                    }
                }
            }
            free(w);
        }
        free(w32), free(x);
    }
}

/* eng__matmul end to end (the pool, the tiles, the GEMV below ENG_GEMV_MAX_M rows, the AVX2
 * register-tile GEMM, or the tiles converted to F32 and sgemm from it on) on every path and
 * weight type, against double precision: row counts around the 4-row tiles, output counts
 * around the 3-row tiles and the task tiles, lengths with every tail. */
PC_TEST(matmul_matches_double_reference)
{
    uint32_t Ks[] = {8, 37, 256, 1030, 1056};
    uint32_t Ms[] = {1, 5, 32, 33, 34, 35, 64};
    enum { N = 200, MMAX = 64 };
    eng_pool_t *pool;
    ASSERT_EQ(eng__pool_init(2, &pool), 0);
    for (size_t ki = 0; ki < PC_ARRAY_LEN(Ks); ki++) {
        uint32_t K = Ks[ki];
        float *w32 = malloc((size_t)N * K * 4), *x = malloc((size_t)MMAX * K * 4);
        float *y = malloc((size_t)MMAX * N * 4), *y0 = malloc((size_t)MMAX * N * 4);
        float *t0 = malloc((size_t)ENG_CPU_WTILE * K * 4);
        float *t1 = malloc((size_t)ENG_CPU_WTILE * K * 4);
        float *const tmp[2] = {t0, t1};
        for (size_t i = 0; i < (size_t)MMAX * K; i++)
            x[i] = unif();
        for (size_t i = 0; i < (size_t)MMAX * N; i++)
            y0[i] = unif();
        for (size_t ti = 0; ti < PC_ARRAY_LEN(wtypes); ti++) {
            uint32_t t = wtypes[ti];
            if (t == ENG_GGML_TYPE_Q8_0 && K % ENG_QK8_0 != 0)
                continue;
            void *wd = make_weights(t, N, K, w32);
            eng_weight_t w = {.type = t, .file_type = t, .n_in = K, .n_out = N, .data = wd};
            for (size_t mi = 0; mi < PC_ARRAY_LEN(Ms); mi++) {
                uint32_t M = Ms[mi];
                for (int acc = 0; acc < 2; acc++) {
                    for (size_t pi = 0; pi < PC_ARRAY_LEN(paths); pi++) {
                        if (!eng__cpu_isa_runs(paths[pi]))
                            continue;
                        memcpy(y, y0, (size_t)MMAX * N * 4);
                        eng__matmul(pool, x, M, &w, NULL, y, acc == 1, tmp, NULL, paths[pi]);
                        for (uint32_t m = 0; m < M; m++) {
                            for (uint32_t n = 0; n < N; n++) {
                                size_t i = (size_t)m * N + n;
                                double r = acc ? y0[i] : 0, mag = acc ? fabs(y0[i]) : 0;
                                for (uint32_t k = 0; k < K; k++) {
                                    double pr =
                                        (double)w32[(size_t)n * K + k] * x[(size_t)m * K + k];
                                    r += pr;
                                    mag += fabs(pr);
                                }
                                double tol = 2e-6 * (mag + 1);
                                if (!(fabs(y[i] - r) <= tol))
                                    fprintf(stderr, "  %s %s K=%u M=%u m=%u n=%u: %g vs %g\n",
                                            eng__cpu_isa_name(paths[pi]), wtype_name(t), K, M, m, n,
                                            y[i], r);
                                ASSERT_LE(fabs(y[i] - r), tol);
                            }
                        }
                        for (size_t i = (size_t)M * N; i < (size_t)MMAX * N; i++)
                            ASSERT_EQ(y[i], y0[i]); /* rows past M untouched */
                    }
                }
            }
            free(wd);
        }
        free(w32), free(x), free(y), free(y0), free(t0), free(t1);
    }
    eng__pool_free(pool);
}

/* RMS norm, SwiGLU and RoPE (both layouts) on the SIMD path against the portable one. */
PC_TEST(elementwise_match_portable)
{
#if defined(__x86_64__) || defined(__i386__)
    if (!eng__cpu_isa_runs(ENG_CPU_ISA_AVX2)) {
        PC_SKIP("this CPU has no AVX2");
    }
    uint32_t ns[] = {1, 7, 8, 15, 16, 33, 64, 100, 1024};
    for (size_t ni = 0; ni < PC_ARRAY_LEN(ns); ni++) {
        uint32_t n = ns[ni];
        float *x = malloc(n * 4), *w = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
        float *u = malloc(n * 4);
        for (uint32_t i = 0; i < n; i++) {
            x[i] = unif() * 3, w[i] = unif(), u[i] = unif();
        }
        x[0] = ni % 2 ? -95.0f : 95.0f; /* saturating exponentials in SwiGLU */
        eng__port_rmsnorm(x, w, a, n, 1e-5f);
        eng__avx2_rmsnorm(x, w, b, n, 1e-5f);
        for (uint32_t i = 0; i < n; i++)
            ASSERT_LE(fabsf(a[i] - b[i]), 1e-5f * (fabsf(a[i]) + 1e-3f));
        memcpy(a, x, n * 4), memcpy(b, x, n * 4);
        eng__port_swiglu(a, u, n);
        eng__avx2_swiglu(b, u, n);
        for (uint32_t i = 0; i < n; i++) {
            if (!(fabsf(a[i] - b[i]) <= 1e-6f * (fabsf(a[i]) + 1e-6f)))
                fprintf(stderr, "  swiglu n=%u i=%u x=%g: %g vs %g\n", n, i, x[i], b[i], a[i]);
            ASSERT_LE(fabsf(a[i] - b[i]), 1e-6f * (fabsf(a[i]) + 1e-6f));
        }
        if (n % 2 == 0) {
            float *cs = malloc(n / 2 * 4), *sn = malloc(n / 2 * 4);
            for (uint32_t i = 0; i < n / 2; i++) {
                double t = unif() * 10;
                cs[i] = (float)cos(t), sn[i] = (float)sin(t);
            }
            for (int neox = 0; neox < 2; neox++) {
                memcpy(a, x, n * 4), memcpy(b, x, n * 4);
                eng__port_rope(a, cs, sn, n, neox);
                eng__avx2_rope(b, cs, sn, n, neox);
                for (uint32_t i = 0; i < n; i++)
                    ASSERT_LE(fabsf(a[i] - b[i]), 1e-5f * (fabsf(x[i]) + 1.0f));
            }
            free(cs), free(sn);
        }
        free(x), free(w), free(a), free(b), free(u);
    }
#else
    PC_SKIP("no SIMD path on this architecture");
#endif
}

/* The pool: every task of every run runs exactly once, on a valid thread index, before the run
 * returns; runs follow each other with their context on the caller's stack (a worker late for
 * one run must neither run its tasks after it returned nor touch the next run's context with the
 * old function). Some tasks sleep, so that workers fall behind the caller. */
typedef struct pool_case {
    uint32_t run; /* the run this context belongs to */
    uint32_t n_threads;
    _Atomic uint32_t *count;    /* [n_tasks] */
    _Atomic uint32_t bad;       /* calls with a wrong run id or thread index */
    _Atomic uint32_t *done_run; /* the run the caller last finished */
} pool_case_t;

static void pool_task(void *ctx, uint32_t task, uint32_t thread)
{
    pool_case_t *c = ctx;
    if (thread >= c->n_threads || atomic_load(c->done_run) >= c->run)
        atomic_fetch_add(&c->bad, 1);
    if (task % 61 == 7) { /* a slow task now and then */
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    atomic_fetch_add(&c->count[task], 1);
}

PC_TEST(pool_runs_every_task_once)
{
    for (uint32_t nt = 2; nt <= 4; nt++) {
        eng_pool_t *pool;
        ASSERT_EQ(eng__pool_init(nt, &pool), 0);
        _Atomic uint32_t count[300];
        _Atomic uint32_t done_run = 0;
        for (uint32_t run = 1; run <= 400; run++) {
            uint32_t n_tasks = 1 + (run * 37) % 300;
            for (uint32_t t = 0; t < n_tasks; t++)
                atomic_store(&count[t], 0);
            pool_case_t c = {.run = run, .n_threads = nt, .count = count, .done_run = &done_run};
            eng__pool_run(pool, pool_task, &c, n_tasks);
            atomic_store(&done_run, run);
            uint32_t wrong = 0;
            for (uint32_t t = 0; t < n_tasks; t++)
                wrong += atomic_load(&count[t]) != 1;
            ASSERT_EQ(wrong, 0);
            ASSERT_EQ(atomic_load(&c.bad), 0);
        }
        eng__pool_free(pool);
    }
}

PC_TEST_MAIN()
