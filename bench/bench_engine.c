/*
 * bench_engine.c — `kvgw bench engine`: the engine core on the generated benchmark model
 * (models/kvgw-bench.gguf: 8 layers, width 1024, 16 heads, 4 KV heads, FFN 2816, F16, Llama 3
 * vocabulary), 2 threads by default.
 *
 * Figures: prefill tokens/s at 512 and 2048 tokens (fresh sequences, logits of the last token
 * only), decode tokens/s (single tokens after a 512-token prompt), and the time to first token
 * of a 4096-token prompt cold and with its first 4032 tokens cached (the cached run reuses the
 * cold run's KV through the prefix index and computes the last 64 tokens).
 *
 * --isa picks the CPU kernels' path (avx512, avx2, portable; default: KVGW_CPU_ISA, else the best
 * this CPU runs); --isa all measures every path the CPU runs in the same process, alternating
 * the paths round by round (--rounds N), and prints each figure per path (suffix _avx2, ...) as
 * the best round, with the range over the rounds beside it: on a shared machine the rounds see
 * different loads, and alternating puts every path under the same ones. The roofline is
 * measured in the same run, with the same threads, on the same kind of memory (the weights are
 * copied to huge pages at load, the stream's buffer is on huge pages too), at the bytes a decoded
 * token must read: the matrices at the types the model holds (eng_decode_weight_bytes: a Q4_K_M
 * or Q4_0 file's blocks, F16, or F32 with --weights-f32) and the K and V of its context (at the
 * decode's mean context; the norms and the one embedding row are left out, well under 0.1%).
 * decode_roofline_fraction compares each 8-token chunk of the decode with stream passes run
 * right before and after it (the faster of the two) over a buffer of the decode's bytes per
 * token, read again and again as the decode reads its weights (see stream_roof), and takes the
 * median over the chunks of every round: this machine's read bandwidth moves by 2x within seconds
 * with its neighbours' load, so a roofline taken at another moment compares two different
 * machines. stream_read_gb_s (the best of ten passes over 512 MiB at the end, which no cache
 * helps) is kept for reference.
 *
 * OpenBLAS picks its own kernels by cpuid when it loads: the F32 sgemm of the prefill path runs
 * its AVX-512 kernels on an AVX-512 machine whatever --isa says. To measure an AVX2-only
 * machine's prefill on an AVX-512 one, run with OPENBLAS_CORETYPE=Haswell as well.
 *
 * --kv-dtype q8_0 (or f32) measures that KV dtype beside F16 in the same process, alternating
 * the two engines round by round like --isa all: every figure gets the suffix _f16 or _q8_0,
 * with the KV figures (kv_bytes_per_token, pool_tokens_per_gib: what 1 GiB of pool holds) and
 * decode_tokens_per_s_ctx8192 (the --decode single tokens that end at position 8191, where
 * attention reads the most KV), and the ratios of the two (q8_0 over f16).
 *
 * For comparison, llama.cpp measured on the same shape and machine: prefill ~1,350 tokens/s
 * (512) and ~930 (2048), decode ~90 tokens/s; its server with the prompt cache: cold 4096-token
 * TTFT ~5.5-6.0 s, cached-4032 TTFT ~140-160 ms.
 */
#include "bench.h"
#include "common.h"
#include "engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: kvgw bench engine [--model FILE] [--threads N] [--kv-dtype f16|f32|q8_0] "
               "[--weights-f32] [--gemm auto|f32|bf16] [--bf16] [--decode N] [--quick]\n"
               "                         [--isa avx512|avx2|portable|auto|all] [--rounds N]\n");
    fprintf(f, "  --isa    the CPU kernels' path (default: KVGW_CPU_ISA, else the best this CPU\n"
               "           runs); all: every path this CPU runs, side by side, alternating\n"
               "  --rounds rounds per path (default 1, 2 with --isa all)\n");
    fprintf(f,
            "  --gemm   prefill GEMM precision (default auto: BF16 for F16/BF16 weights on CPUs\n"
            "           with AVX512-BF16; logits move by ~1e-2; quantized weights take integer\n"
            "           products on 8-bit x in every mode); --bf16 is --gemm bf16\n");
    fprintf(f, "  --quick  prefill 512 and decode only (no 2048 prefill, no TTFT)\n");
    fprintf(f, "  --kv-dtype  f32 or q8_0: that KV dtype beside f16 in the same run (suffixes\n"
               "           _f16 and _q8_0), with decode at context 8192; f16 alone by default\n");
}

/* Computes tokens[0..n) in a new sequence (LAST logits); returns seconds, or -1. With ns != 0,
 * starts from the cache of ns and leaves the first cache_n tokens cached there afterwards. */
static double prefill(eng_t *e, const int32_t *tokens, uint32_t n, float *logits, uint64_t ns,
                      uint32_t cache_n, uint32_t *reused, eng_seq_t **keep)
{
    eng_seq_t *s;
    if (eng_seq_create(e, &s) != 0)
        return -1;
    double t0 = bench_now_s();
    uint32_t r = 0;
    if (ns != 0 && eng_seq_start_cached(e, s, ns, tokens, n, &r) != 0) {
        eng_seq_free(e, s);
        return -1;
    }
    eng_batch_item_t it = {
        .seq = s, .tokens = tokens + r, .n_tokens = n - r, .logits = ENG_LOGITS_LAST};
    int rc = eng_forward(e, &it, 1, logits);
    double dt = bench_now_s() - t0;
    if (rc == 0 && ns != 0 && cache_n > 0)
        rc = eng_prefix_insert(e, s, ns, cache_n);
    if (reused != NULL)
        *reused = r;
    if (keep != NULL && rc == 0)
        *keep = s;
    else
        eng_seq_free(e, s);
    return rc == 0 ? dt : -1;
}

/* Figures of one path over the rounds: the best and the worst. */
enum { F_P512, F_CPU512, F_P2048, F_DEC, F_DEC_GB, F_COLD, F_WARM, F_DEC8K, F_N };

/* The context of decode_tokens_per_s_ctx8192. */
#define CTX_LONG 8192

/* Tokens per decode chunk, between two passes of the in-run stream (decode_roofline_fraction). */
#define DEC_CHUNK 8
/* The in-run stream reads a buffer of the decode's bytes per token, over and over like the decode
 * reads its weights: the 32 MiB L3 of the test machine keeps part of a buffer read cyclically
 * (two threads read 50 GB/s over 512 MiB, 54 over 160 MiB, 56 over 128 MiB, 70 over 64 MiB), and
 * the decode has that share too. Each measurement is the second of two passes, so the cache holds
 * the stream's lines as it would in a steady stream, not the decode's. */
static double stream_roof(bench_stream_t *st, bool prefetch)
{
    (void)bench_stream_pass(st, prefetch);
    return bench_stream_pass(st, prefetch);
}

typedef struct isa_run {
    const char *isa; /* its name: the figures' suffix, or the KV dtype's name in a KV run */
    eng_t *e;
    double lo[F_N], hi[F_N];
    bool have[F_N];
    double decode_bytes; /* bytes a decoded token reads: weights and the KV of its context */
    /* Per decode chunk (every round): its bytes per second over the stream passes' around it
     * (the faster of the two), and those passes' GB/s. */
    double *frac, *stream;
    uint32_t n_frac, n_stream, cap;
} isa_run_t;

static void fig_add(isa_run_t *r, int f, double v)
{
    if (!r->have[f] || v < r->lo[f])
        r->lo[f] = v;
    if (!r->have[f] || v > r->hi[f])
        r->hi[f] = v;
    r->have[f] = true;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n) (sorted in place); -1 for none. */
static double median(double *v, uint32_t n)
{
    if (n == 0)
        return -1;
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Single tokens after an n_ctx-token prompt: tokens/s, or -1. With st, the tokens run in chunks
 * of DEC_CHUNK with a pass of st before, between and after them, and each chunk's fraction of
 * the read bandwidth goes to run (the memory of this machine is shared with other machines' and
 * its read bandwidth swings by 2x within seconds: a roofline measured at another moment than the
 * decode would compare two loads). The stream's time is not the decode's. */
static double decode_after(eng_t *e, const int32_t *tok, uint32_t n_ctx, uint32_t n_decode,
                           float *logits, bench_stream_t *st, isa_run_t *run)
{
    eng_seq_t *s = NULL;
    if (prefill(e, tok, n_ctx, logits, 0, 0, NULL, &s) < 0)
        return -1;
    double td = 0, g_prev = st != NULL ? stream_roof(st, false) : -1;
    for (uint32_t i0 = 0, k = 0; i0 < n_decode; i0 += DEC_CHUNK, k++) {
        uint32_t n = n_decode - i0 < DEC_CHUNK ? n_decode - i0 : DEC_CHUNK;
        double t0 = bench_now_s();
        for (uint32_t i = i0; i < i0 + n; i++) {
            eng_batch_item_t it = {
                .seq = s, .tokens = tok + n_ctx + i, .n_tokens = 1, .logits = ENG_LOGITS_LAST};
            if (eng_forward(e, &it, 1, logits) != 0) {
                eng_seq_free(e, s);
                return -1;
            }
        }
        double dt = bench_now_s() - t0;
        td += dt;
        if (st == NULL)
            continue;
        double g = stream_roof(st, k % 2 == 0); /* plain and prefetching, alternated */
        double roof = g > g_prev ? g : g_prev;
        if (roof > 0 && run->n_frac < run->cap) {
            run->frac[run->n_frac++] = run->decode_bytes * n / dt / 1e9 / roof;
            run->stream[run->n_stream++] = g;
        }
        g_prev = g;
    }
    eng_seq_free(e, s);
    return n_decode / td;
}

static int measure(isa_run_t *run, const int32_t *tok, float *logits, uint32_t n_decode, bool quick,
                   bool long_ctx, bench_stream_t *st, uint64_t ns)
{
    eng_t *e = run->e;
    enum { N_MAX = 4096, N_CACHED = 4032 };
    double c0 = bench_cpu_s();
    double t512 = prefill(e, tok, 512, logits, 0, 0, NULL, NULL);
    double c512 = bench_cpu_s() - c0;
    if (t512 < 0)
        return -1;
    fig_add(run, F_P512, 512 / t512);
    fig_add(run, F_CPU512, c512);
    if (!quick) {
        double t2048 = prefill(e, tok, 2048, logits, 0, 0, NULL, NULL);
        if (t2048 < 0)
            return -1;
        fig_add(run, F_P2048, 2048 / t2048);
    }
    double dec = decode_after(e, tok, 512, n_decode, logits, st, run);
    if (dec < 0)
        return -1;
    fig_add(run, F_DEC, dec);
    fig_add(run, F_DEC_GB, run->decode_bytes * dec / 1e9);
    if (long_ctx) {
        /* The prompt stops n_decode short of 8192, so the last token decoded sits at position
         * 8191 (the bench model's context is 8192). */
        double dec8k = decode_after(e, tok, CTX_LONG - n_decode, n_decode, logits, NULL, NULL);
        if (dec8k < 0)
            return -1;
        fig_add(run, F_DEC8K, dec8k);
    }
    if (quick)
        return 0;
    /* TTFT: cold (nothing cached; the run caches its first 4032 tokens), then the same prompt
     * again through the cache. A namespace per round and path, so every cold run is cold. */
    uint32_t reused = 0;
    double cold = prefill(e, tok, N_MAX, logits, ns, N_CACHED, &reused, NULL);
    if (cold < 0 || reused != 0)
        return -1;
    double warm = prefill(e, tok, N_MAX, logits, ns, 0, &reused, NULL);
    if (warm < 0 || reused != N_CACHED) {
        fprintf(stderr, "kvgw bench engine: the cached run reused %u tokens, not %u\n", reused,
                N_CACHED);
        return -1;
    }
    fig_add(run, F_COLD, cold * 1e3);
    fig_add(run, F_WARM, warm * 1e3);
    return 0;
}

static void report_fig(bench_report_t *r, const isa_run_t *run, bool suffix, int f,
                       const char *name, const char *note, bool lower_is_better, int rounds)
{
    if (!run->have[f])
        return;
    char key[64], text[96];
    snprintf(key, sizeof key, "%s%s%s", name, suffix ? "_" : "", suffix ? run->isa : "");
    double best = lower_is_better ? run->lo[f] : run->hi[f];
    if (rounds > 1)
        snprintf(text, sizeof text, "%.4g..%.4g over %d rounds; %s", run->lo[f], run->hi[f], rounds,
                 note);
    else
        snprintf(text, sizeof text, "%s", note);
    bench_report_add(r, key, best, text);
}

int bench_engine_main(int argc, char **argv)
{
    const char *model = "models/kvgw-bench.gguf";
    const char *isa_arg = NULL;
    uint32_t threads = 2, n_decode = 64;
    int rounds = 0;
    bool quick = false;
    eng_params_t p = eng_params_default();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--weights-f32") == 0) {
            p.weights_f32 = true;
            continue;
        }
        if (strcmp(a, "--bf16") == 0) {
            p.gemm = ENG_GEMM_BF16;
            continue;
        }
        if (strcmp(a, "--quick") == 0) {
            quick = true;
            continue;
        }
        if (i + 1 >= argc) {
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        if (strcmp(a, "--model") == 0) {
            model = v;
        } else if (strcmp(a, "--threads") == 0) {
            threads = (uint32_t)atoi(v);
            if (threads == 0 || threads > 256) {
                fprintf(stderr, "kvgw bench engine: --threads: '%s' is not in 1..256\n", v);
                return 2;
            }
        } else if (strcmp(a, "--gemm") == 0) {
            if (eng_gemm_mode_parse(v, &p.gemm) != 0) {
                fprintf(stderr, "kvgw bench engine: --gemm: '%s' is not auto, f32 or bf16\n", v);
                return 2;
            }
        } else if (strcmp(a, "--decode") == 0) {
            n_decode = (uint32_t)atoi(v);
            if (n_decode == 0 || n_decode > 1024) {
                fprintf(stderr, "kvgw bench engine: --decode: '%s' is not in 1..1024\n", v);
                return 2;
            }
        } else if (strcmp(a, "--rounds") == 0) {
            rounds = atoi(v);
            if (rounds < 1 || rounds > 100) {
                fprintf(stderr, "kvgw bench engine: --rounds: '%s' is not in 1..100\n", v);
                return 2;
            }
        } else if (strcmp(a, "--isa") == 0) {
            if (strcmp(v, "avx512") != 0 && strcmp(v, "avx2") != 0 && strcmp(v, "portable") != 0 &&
                strcmp(v, "auto") != 0 && strcmp(v, "all") != 0) {
                fprintf(stderr,
                        "kvgw bench engine: --isa: '%s' is not avx512, avx2, portable, auto or "
                        "all\n",
                        v);
                return 2;
            }
            isa_arg = v;
        } else if (strcmp(a, "--kv-dtype") == 0) {
            if (eng_kv_dtype_parse(v, &p.kv_dtype) != 0) {
                fprintf(stderr, "kvgw bench engine: --kv-dtype: '%s' is not f16, f32 or q8_0\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "kvgw bench engine: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    p.model_path = model;
    p.n_threads = threads;
    p.kv_max_tokens = 16384;
    p.max_batch_tokens = 512;
    bool all = isa_arg != NULL && strcmp(isa_arg, "all") == 0;
    /* A KV run: f16 and the dtype asked for, as two runs of the same path. */
    bool kv_cmp = p.kv_dtype != ENG_KV_F16;
    enum eng_kv_dtype kv_dt[2] = {ENG_KV_F16, p.kv_dtype};
    if (all && kv_cmp) {
        fprintf(stderr, "kvgw bench engine: --isa all measures one KV dtype (f16)\n");
        return 2;
    }
    if (rounds == 0)
        rounds = all || kv_cmp ? 2 : 1;
    if (kv_cmp && n_decode >= CTX_LONG / 2) {
        fprintf(stderr, "kvgw bench engine: --decode must stay below %u with --kv-dtype\n",
                CTX_LONG / 2);
        return 2;
    }

    /* The paths to run: one engine each, all loaded before the first round. */
    static const char *const ladder[] = {"avx512", "avx2", "portable"};
    isa_run_t runs[3];
    uint32_t n_runs = 0;
    memset(runs, 0, sizeof runs);
    char err[512];
    int ret = 1;
    bench_stream_t *st = NULL;
    double load_s = 0;
    for (uint32_t i = 0; i < (all || kv_cmp ? (kv_cmp ? 2u : 3u) : 1u); i++) {
        p.cpu_isa = all ? ladder[i] : isa_arg;
        if (kv_cmp)
            p.kv_dtype = kv_dt[i];
        eng_t *e = NULL;
        double t0 = bench_now_s();
        int rc = eng_init(&p, &e, err, sizeof err);
        if (rc == PC_ERR_UNSUPPORTED && all) {
            printf("isa %s: not run (%s)\n", ladder[i], err);
            continue;
        }
        if (rc != 0) {
            fprintf(stderr, "kvgw bench engine: %s%s\n", err,
                    rc == PC_ERR_UNSUPPORTED ? "" : " (generate the model with scripts/models.sh)");
            goto fail;
        }
        if (n_runs == 0)
            load_s = bench_now_s() - t0;
        runs[n_runs].e = e;
        runs[n_runs].isa = kv_cmp ? eng_kv_dtype_name(kv_dt[i]) : eng_cpu_isa_name_of(e);
        n_runs++;
    }
    if (n_runs == 0)
        goto fail;
    const eng_hparams_t *hp = eng_hparams(runs[0].e);
    printf("engine: %s, %u layers, width %u, %u/%u heads, FFN %u, vocab %u; %u threads, KV %s%s\n",
           model, hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->n_ff, hp->n_vocab,
           threads, kv_cmp ? "f16 and " : "", eng_kv_dtype_name(p.kv_dtype));
    for (uint32_t i = 0; i < n_runs; i++)
        printf("%s %s: path %s, GEMM %s\n", kv_cmp ? "kv" : "isa", runs[i].isa,
               eng_cpu_isa_name_of(runs[i].e), eng_gemm_name_of(runs[i].e));

    enum { N_MAX = CTX_LONG + 1024 };
    int32_t *tok = pc_xmalloc(N_MAX * sizeof *tok);
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (uint32_t i = 0; i < N_MAX; i++)
        tok[i] = (int32_t)(bench_rand(&x) % hp->n_vocab);
    float *logits = pc_xmalloc((size_t)hp->n_vocab * sizeof *logits);
    bench_report_t r;
    bench_report_init(&r, "engine");
    bench_report_add(&r, "model_load_s", load_s, "mmap + checks (+ conversions)");
    /* Decode is bound by streaming the weights once per token (at the bytes per weight of the
     * types the model holds) and the KV of the token's context (512 + 1 .. 512 + n_decode
     * positions, at the mean): the roofline beside it. */
    double decode_bytes = eng_decode_weight_bytes(runs[0].e);
    double ctx_mean = 512 + (n_decode + 1) / 2.0;
    uint32_t n_chunks = (n_decode + DEC_CHUNK - 1) / DEC_CHUNK;
    for (uint32_t i = 0; i < n_runs; i++) {
        eng_kv_stats_t kv;
        eng_kv_stats(runs[i].e, &kv);
        runs[i].decode_bytes = decode_bytes + (double)kv.bytes_per_token * ctx_mean;
        runs[i].cap = n_chunks * (uint32_t)rounds;
        runs[i].frac = pc_xmalloc(runs[i].cap * sizeof *runs[i].frac);
        runs[i].stream = pc_xmalloc(runs[i].cap * sizeof *runs[i].stream);
    }

    /* Warm-up: touches the weights once so the first figure does not pay the page faults. */
    for (uint32_t i = 0; i < n_runs; i++)
        if (prefill(runs[i].e, tok, 64, logits, 0, 0, NULL, NULL) < 0)
            goto fail_run;
    /* The in-run stream's buffer is resident from here to the end of the rounds: the peak RSS
     * figure takes it out again (the larger of the peak before it and the peak during it, less
     * its bytes). */
    size_t rss_before = pc_rss_peak_bytes();
    st = bench_stream_new(threads, ((size_t)runs[0].decode_bytes + (2u << 20) - 1) &
                                       ~(size_t)((2u << 20) - 1));
    if (st == NULL) {
        fprintf(stderr, "kvgw bench engine: no memory or threads for the stream passes\n");
        goto fail_run;
    }
    for (int round = 0; round < rounds; round++)
        for (uint32_t i = 0; i < n_runs; i++)
            if (measure(&runs[i], tok, logits, n_decode, quick, kv_cmp, st,
                        42 + (uint64_t)round * 8 + i) != 0)
                goto fail_run;
    size_t rss_during = pc_rss_peak_bytes() - bench_stream_bytes(st);
    bench_stream_free(st);
    st = NULL;

    bool sfx = n_runs > 1 || kv_cmp;
    if (!sfx)
        printf("isa: %s\n", runs[0].isa);
    for (uint32_t i = 0; i < n_runs; i++) {
        const isa_run_t *u = &runs[i];
        report_fig(&r, u, sfx, F_P512, "prefill_tokens_per_s_512", "llama.cpp ~1350", false,
                   rounds);
        report_fig(&r, u, sfx, F_CPU512, "prefill_cpu_s_512", "CPU seconds used (all threads)",
                   true, rounds);
        report_fig(&r, u, sfx, F_P2048, "prefill_tokens_per_s_2048", "llama.cpp ~930", false,
                   rounds);
        report_fig(&r, u, sfx, F_DEC, "decode_tokens_per_s", "after 512 tokens; llama.cpp ~90",
                   false, rounds);
        report_fig(&r, u, sfx, F_DEC_GB, "decode_gb_s", "weights and KV streamed", false, rounds);
        report_fig(&r, u, sfx, F_DEC8K, "decode_tokens_per_s_ctx8192",
                   "single tokens ending at context 8192", false, rounds);
        report_fig(&r, u, sfx, F_COLD, "ttft_ms_cold_4096", "llama.cpp ~5500-6000", true, rounds);
        report_fig(&r, u, sfx, F_WARM, "ttft_ms_cached_4032_of_4096", "llama.cpp ~140-160", true,
                   rounds);
        if (u->have[F_COLD] && u->have[F_WARM]) {
            char key[64];
            snprintf(key, sizeof key, "ttft_speedup_cached%s%s", sfx ? "_" : "", sfx ? u->isa : "");
            bench_report_add(&r, key, u->lo[F_COLD] / u->lo[F_WARM], "llama.cpp 36-39x");
        }
    }
    bench_report_add(&r, "decode_weight_mb_per_token", decode_bytes / 1e6,
                     "the matrices at the model's types");
    bench_report_add(&r, "decode_kv_mb_per_token", (runs[0].decode_bytes - decode_bytes) / 1e6,
                     "K and V read at the decode's mean context");
    for (uint32_t i = 0; i < (kv_cmp ? n_runs : 1u); i++) {
        eng_kv_stats_t kv;
        eng_kv_stats(runs[i].e, &kv);
        char key[64];
        snprintf(key, sizeof key, "kv_bytes_per_token%s%s", kv_cmp ? "_" : "",
                 kv_cmp ? runs[i].isa : "");
        bench_report_add(&r, key, (double)kv.bytes_per_token, "K and V, every layer");
        snprintf(key, sizeof key, "pool_tokens_per_gib%s%s", kv_cmp ? "_" : "",
                 kv_cmp ? runs[i].isa : "");
        bench_report_add(&r, key, (double)(1u << 30) / (double)kv.bytes_per_token,
                         "positions 1 GiB of KV pool holds");
    }
    if (kv_cmp && n_runs == 2) {
        /* The targets of issue 23 for q8_0: bytes 34/64 (0.531), decode at 8192 >= 1.2x,
         * prefill >= 0.95x. Ratios of the best rounds. */
        eng_kv_stats_t k0, k1;
        eng_kv_stats(runs[0].e, &k0);
        eng_kv_stats(runs[1].e, &k1);
        char key[64];
        snprintf(key, sizeof key, "kv_bytes_ratio_%s_f16", runs[1].isa);
        bench_report_add(&r, key, (double)k1.bytes_per_token / (double)k0.bytes_per_token,
                         "q8_0 target 34/64 = 0.531");
        snprintf(key, sizeof key, "decode_ctx8192_ratio_%s_f16", runs[1].isa);
        bench_report_add(&r, key, runs[1].hi[F_DEC8K] / runs[0].hi[F_DEC8K], "target >= 1.2");
        snprintf(key, sizeof key, "decode_ratio_%s_f16", runs[1].isa);
        bench_report_add(&r, key, runs[1].hi[F_DEC] / runs[0].hi[F_DEC], "context 512");
        snprintf(key, sizeof key, "prefill_512_ratio_%s_f16", runs[1].isa);
        bench_report_add(&r, key, runs[1].hi[F_P512] / runs[0].hi[F_P512], "target >= 0.95");
    }
    size_t rss = rss_during > rss_before ? rss_during : rss_before;
    bench_report_add(&r, "peak_rss_mib", (double)rss / (1 << 20), NULL);
    /* Last, so that its buffer stays out of the peak RSS above. */
    double stream = bench_stream_read_gb_s(threads, (size_t)512 << 20);
    bench_report_add(&r, "stream_read_gb_s", stream, "this machine now, same threads");
    bench_report_add(&r, "decode_tokens_per_s_roofline", stream * 1e9 / runs[0].decode_bytes,
                     "stream_read_gb_s / bytes per token");
    for (uint32_t i = 0; i < n_runs; i++) {
        char key[64];
        snprintf(key, sizeof key, "decode_stream_read_gb_s%s%s", sfx ? "_" : "",
                 sfx ? runs[i].isa : "");
        bench_report_add(&r, key, median(runs[i].stream, runs[i].n_stream),
                         "median of the passes between the decode's chunks");
        snprintf(key, sizeof key, "decode_roofline_fraction%s%s", sfx ? "_" : "",
                 sfx ? runs[i].isa : "");
        bench_report_add(&r, key, median(runs[i].frac, runs[i].n_frac),
                         "median over 8-token chunks: GB/s / the stream around");
    }
    bench_report_print(&r);
    ret = 0;
fail_run:
    if (ret != 0)
        fprintf(stderr, "kvgw bench engine: a forward step failed\n");
    bench_stream_free(st);
    pc_free(tok);
    pc_free(logits);
fail:
    for (uint32_t i = 0; i < n_runs; i++) {
        eng_free(runs[i].e);
        pc_free(runs[i].frac);
        pc_free(runs[i].stream);
    }
    return ret;
}
