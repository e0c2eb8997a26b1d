/*
 * bench_worker.c — `kvgw bench worker`: the worker's continuous-batching scheduler under
 * concurrent load, on the generated benchmark model (models/kvgw-bench.gguf), 2 threads by
 * default, driven in-process through the worker API exactly as the gateway drives it.
 *
 * Workload 1 (llama.cpp's server anchor, `-np N`, continuous batching, same model and
 * machine): N concurrent requests (N = 1, 4, 16), distinct random 256-token prompts, 64
 * generated tokens each, greedy (end-of-generation ignored, so every request makes 64
 * tokens), all submitted at once. Figures: aggregate generated tokens/s = N * 64 / the wall
 * time from the submits to the last DONE; median time to first token. llama.cpp's server:
 * 73 / 107 / 97 tokens/s, median TTFT 0.17 / 0.78 / 3.3 s at N = 1 / 4 / 16.
 *
 * Workload 2 (mixed): a 4032-token prefix is cached (a max_tokens 0 pre-warm); a request with
 * that prefix plus 64 new tokens measures its TTFT alone, then again submitted together with a
 * cold 4096-token request (submitted first). llama.cpp's server: ~1.0 s alone, 26 s beside the
 * cold one. Target: beside <= 2x alone.
 *
 * --kv-dtype q8_0 (or f32) runs workload 3 instead, for f16 and that dtype one after the other
 * in the same process: a worker whose KV pool has a fixed byte budget (--kv-budget, default
 * 96 MiB: 12,288 f16 positions of the bench model) and N = 16 requests of --kv-prompt tokens
 * (default 1024) + --gen tokens (default 128 here: decode-heavy, so the batch the pool admits
 * matters), more than f16's pool holds at once (10 requests; q8_0's holds all 16), so the budget
 * binds.
 * Figures per dtype (suffix _f16, _q8_0): kv_bytes_per_token, pool_tokens_per_gib, the pool's
 * tokens, tokens_per_s_aggregate_n16_kv_bound, the median TTFT, preemptions; and the ratios.
 */
#include "bench.h"
#include "common.h"
#include "worker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: kvgw bench worker [--model FILE] [--threads N] [--concurrency N[,N...]] "
               "[--prompt N] [--gen N] [--step-tokens N] [--gemm auto|f32|bf16] [--bf16] "
               "[--no-mixed] [--temperature T] [--kv-dtype f16|f32|q8_0] [--kv-budget MIB] "
               "[--kv-prompt N]\n");
    fprintf(f, "  --concurrency  request counts to run (default 1,4,16)\n");
    fprintf(f, "  --step-tokens  the scheduler's tokens per step (default: the worker's)\n");
    fprintf(
        f, "  --gemm         prefill GEMM precision (default auto: BF16 for F16 weights on\n"
           "                 CPUs with AVX512-BF16; logits move by ~1e-2); --bf16 = --gemm bf16\n");
    fprintf(f, "  --no-mixed     skip the cached-prefix-beside-a-cold-prefill case\n");
    fprintf(f, "  --kv-dtype     f32 or q8_0: the KV-bound workload (N=16) for f16 and that dtype\n"
               "                 under one KV byte budget (--kv-budget MiB, default 96;\n"
               "                 --kv-prompt N tokens per request, default 1024)\n");
    fprintf(f,
            "  --temperature  sampling temperature of every request (default 0: greedy; 1 shows\n"
            "                 what the CPU sampler costs per token, kvgw bench sampler)\n");
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static void random_tokens(uint32_t *t, uint32_t n, uint32_t n_vocab)
{
    for (uint32_t i = 0; i < n; i++)
        t[i] = (uint32_t)(bench_rand(&g_rng) % n_vocab);
}

typedef struct track {
    uint64_t id;
    double t_submit, t_first, t_done;
    uint32_t n_out;
    bool done, failed;
    eng_wire_usage_t usage;
} track_t;

/* Polls until every tracked request ended; returns 0, or -1 on an ERROR event. */
static int wait_all(eng_worker_t *w, track_t *t, uint32_t n)
{
    eng_worker_event_t ev[64];
    uint32_t left = n;
    while (left > 0) {
        size_t k = eng_worker_poll_wait(w, ev, PC_ARRAY_LEN(ev), 1000);
        double now = bench_now_s();
        for (size_t i = 0; i < k; i++) {
            uint64_t id = ev[i].type == ENG_WIRE_TOKEN   ? ev[i].u.token.request_id
                          : ev[i].type == ENG_WIRE_DONE  ? ev[i].u.done.request_id
                          : ev[i].type == ENG_WIRE_ERROR ? ev[i].u.error.request_id
                                                         : 0;
            track_t *r = NULL;
            for (uint32_t j = 0; j < n && id != 0; j++)
                if (t[j].id == id)
                    r = &t[j];
            if (r == NULL)
                continue;
            if (ev[i].type == ENG_WIRE_TOKEN) {
                if (r->n_out++ == 0)
                    r->t_first = now;
            } else if (ev[i].type == ENG_WIRE_DONE) {
                r->done = true;
                r->t_done = now;
                r->usage = ev[i].u.done.usage;
                if (r->t_first == 0) /* max_tokens 0 */
                    r->t_first = now;
                left--;
            } else {
                fprintf(stderr, "kvgw bench worker: request %llu failed: %.*s\n",
                        (unsigned long long)id, (int)ev[i].u.error.message.len,
                        ev[i].u.error.message.base);
                r->failed = true;
                left--;
            }
        }
    }
    for (uint32_t j = 0; j < n; j++)
        if (t[j].failed)
            return -1;
    return 0;
}

static int submit(eng_worker_t *w, float temperature, track_t *t, uint64_t id, uint64_t ns,
                  const uint32_t *tokens, uint32_t n, uint32_t max_tokens)
{
    eng_wire_submit_t q = {.request_id = id,
                           .ns = ns,
                           .max_tokens = max_tokens,
                           .flags = ENG_WIRE_SUBMIT_IGNORE_EOG,
                           .tokens = tokens,
                           .n_tokens = n};
    q.sampling = eng_sampling_params_default();
    q.sampling.temperature = temperature;
    *t = (track_t){.id = id, .t_submit = bench_now_s()};
    char err[256];
    int rc = eng_worker_submit(w, &q, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "kvgw bench worker: submit: %s\n", err);
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, uint32_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Parses "1,4,16" into c[]; returns the count or -1. */
static int parse_list(const char *s, uint32_t *c, int max)
{
    int n = 0;
    while (*s != '\0') {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 256 || n == max)
            return -1;
        c[n++] = (uint32_t)v;
        s = end;
        if (*s == ',')
            s++;
        else if (*s != '\0')
            return -1;
    }
    return n;
}

/* Workload 3 for one KV dtype: a worker with a KV pool of budget bytes, n requests of n_prompt
 * + n_gen tokens submitted at once. Adds the figures with the dtype's suffix; *tps gets the
 * aggregate tokens/s. Returns 0 or -1. */
static int kv_bound_run(eng_worker_params_t p, enum eng_kv_dtype dt, uint64_t budget, uint32_t n,
                        uint32_t n_prompt, uint32_t n_gen, float temperature, bench_report_t *r,
                        double *tps, double *ttft_med, uint64_t *cap)
{
    p.engine.kv_dtype = dt;
    p.engine.kv_max_tokens = 0;
    p.engine.kv_max_bytes = budget;
    char err[512];
    eng_worker_t *w = NULL;
    if (eng_worker_init(&p, &w, err, sizeof err) != 0) {
        fprintf(stderr, "kvgw bench worker: %s\n", err);
        return -1;
    }
    eng_worker_info_t info;
    eng_worker_info(w, &info);
    const char *dn = info.kv_dtype;
    printf("kv %s: %llu bytes per token, pool %llu tokens in %.0f MiB; %u x (%u + %u) tokens\n", dn,
           (unsigned long long)info.kv_bytes_per_token, (unsigned long long)info.kv_capacity_tokens,
           (double)budget / (1 << 20), n, n_prompt, n_gen);
    uint32_t *tok = pc_xmalloc((size_t)n * n_prompt * sizeof *tok);
    track_t *t = pc_xcalloc(n, sizeof *t);
    double *ttft = pc_xcalloc(n, sizeof *ttft);
    int ret = -1;
    g_rng = 0x5DEECE66Dull; /* the same prompts for every dtype */
    random_tokens(tok, n * n_prompt, info.n_vocab);
    uint64_t id = 1;
    for (uint32_t i = 0; i < n; i++)
        if (submit(w, temperature, &t[i], id++, 100 + i, tok + (size_t)i * n_prompt, n_prompt,
                   n_gen) != 0)
            goto done;
    if (wait_all(w, t, n) != 0)
        goto done;
    double t_end = 0;
    for (uint32_t i = 0; i < n; i++) {
        t_end = PC_MAX(t_end, t[i].t_done);
        ttft[i] = t[i].t_first - t[i].t_submit;
    }
    *tps = (double)n * n_gen / (t_end - t[0].t_submit);
    *ttft_med = median(ttft, n) * 1e3;
    *cap = info.kv_capacity_tokens;
    eng_worker_stats_t st;
    eng_worker_stats(w, &st);
    char key[80];
    snprintf(key, sizeof key, "kv_bytes_per_token_%s", dn);
    bench_report_add(r, key, (double)info.kv_bytes_per_token, "K and V, every layer");
    snprintf(key, sizeof key, "pool_tokens_per_gib_%s", dn);
    bench_report_add(r, key, (double)(1u << 30) / (double)info.kv_bytes_per_token, NULL);
    snprintf(key, sizeof key, "pool_tokens_%s", dn);
    bench_report_add(r, key, (double)info.kv_capacity_tokens, "the budget's positions");
    snprintf(key, sizeof key, "tokens_per_s_aggregate_n%u_kv_bound_%s", n, dn);
    bench_report_add(r, key, *tps, "generated tokens / wall time");
    snprintf(key, sizeof key, "ttft_ms_median_n%u_kv_bound_%s", n, dn);
    bench_report_add(r, key, *ttft_med, NULL);
    snprintf(key, sizeof key, "preemptions_%s", dn);
    bench_report_add(r, key, (double)st.n_preempted, NULL);
    ret = 0;
done:
    pc_free(tok);
    pc_free(t);
    pc_free(ttft);
    eng_worker_free(w);
    return ret;
}

int bench_worker_main(int argc, char **argv)
{
    const char *model = "models/kvgw-bench.gguf";
    uint32_t threads = 2, n_prompt = 256, n_gen = 64, step_tokens = 0;
    float temperature = 0;
    uint32_t conc[8] = {1, 4, 16};
    int n_conc = 3;
    bool mixed = true;
    enum eng_gemm_mode gemm = ENG_GEMM_AUTO;
    const char *gemm_name = "auto";
    enum eng_kv_dtype kv_dt = ENG_KV_F16;
    uint64_t kv_budget_mib = 96;
    uint32_t kv_prompt = 1024;
    bool gen_set = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--bf16") == 0) {
            gemm = ENG_GEMM_BF16;
            gemm_name = "bf16";
            continue;
        }
        if (strcmp(a, "--no-mixed") == 0) {
            mixed = false;
            continue;
        }
        if (i + 1 >= argc) {
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        long n = strtol(v, NULL, 10);
        if (strcmp(a, "--model") == 0) {
            model = v;
        } else if (strcmp(a, "--concurrency") == 0) {
            n_conc = parse_list(v, conc, (int)PC_ARRAY_LEN(conc));
            if (n_conc < 0) {
                fprintf(stderr, "kvgw bench worker: --concurrency: '%s' is not a list of 1..256\n",
                        v);
                return 2;
            }
        } else if (strcmp(a, "--gemm") == 0 && eng_gemm_mode_parse(v, &gemm) == 0) {
            gemm_name = v;
        } else if (strcmp(a, "--threads") == 0 && n >= 1 && n <= 256) {
            threads = (uint32_t)n;
        } else if (strcmp(a, "--prompt") == 0 && n >= 1 && n <= 8192) {
            n_prompt = (uint32_t)n;
        } else if (strcmp(a, "--gen") == 0 && n >= 1 && n <= 4096) {
            n_gen = (uint32_t)n;
            gen_set = true;
        } else if (strcmp(a, "--kv-dtype") == 0 && eng_kv_dtype_parse(v, &kv_dt) == 0) {
        } else if (strcmp(a, "--kv-budget") == 0 && n >= 1 && n <= (1 << 20)) {
            kv_budget_mib = (uint64_t)n;
        } else if (strcmp(a, "--kv-prompt") == 0 && n >= 1 && n <= 8192) {
            kv_prompt = (uint32_t)n;
        } else if (strcmp(a, "--step-tokens") == 0 && n >= 1 && n <= 65536) {
            step_tokens = (uint32_t)n;
        } else if (strcmp(a, "--temperature") == 0 && strtof(v, NULL) >= 0 &&
                   strtof(v, NULL) <= 2) {
            temperature = strtof(v, NULL);
        } else {
            fprintf(stderr, "kvgw bench worker: bad option or value '%s %s'\n", a, v);
            usage(stderr);
            return 2;
        }
    }

    eng_worker_params_t p = eng_worker_params_default();
    p.engine.model_path = model;
    p.engine.n_threads = threads;
    p.engine.gemm = gemm;
    p.engine.kv_max_tokens = 32768;
    p.load_interval_ms = 0;
    if (step_tokens > 0)
        p.step_tokens = step_tokens;
    if (kv_dt != ENG_KV_F16) {
        /* Workload 3: f16 then the dtype asked for, under the same byte budget. */
        bench_report_t kr;
        bench_report_init(&kr, "worker");
        double tps[2], ttft_med[2];
        uint64_t cap[2];
        enum eng_kv_dtype dts[2] = {ENG_KV_F16, kv_dt};
        for (int i = 0; i < 2; i++)
            if (kv_bound_run(p, dts[i], kv_budget_mib << 20, 16, kv_prompt, gen_set ? n_gen : 128,
                             temperature, &kr, &tps[i], &ttft_med[i], &cap[i]) != 0)
                return 1;
        char key[80];
        snprintf(key, sizeof key, "pool_tokens_ratio_%s_f16", eng_kv_dtype_name(kv_dt));
        bench_report_add(&kr, key, (double)cap[1] / (double)cap[0], "q8_0: 64/34 = 1.88");
        snprintf(key, sizeof key, "tokens_per_s_n16_kv_bound_ratio_%s_f16",
                 eng_kv_dtype_name(kv_dt));
        bench_report_add(&kr, key, tps[1] / tps[0], NULL);
        bench_report_add(&kr, "peak_rss_mib", (double)pc_rss_peak_bytes() / (1 << 20), NULL);
        bench_report_print(&kr);
        return 0;
    }
    char err[512];
    eng_worker_t *w = NULL;
    if (eng_worker_init(&p, &w, err, sizeof err) != 0) {
        fprintf(stderr, "kvgw bench worker: %s (generate it with scripts/models.sh)\n", err);
        return 1;
    }
    eng_worker_info_t info;
    eng_worker_info(w, &info);
    printf("worker: %s (%s), vocab %u, %u threads, step %u tokens, KV %u blocks of %u, GEMM %s\n",
           model, info.model_name, info.n_vocab, threads, p.step_tokens, info.total_blocks,
           info.block_tokens, gemm_name);

    enum { MIX_PREFIX = 4032, MIX_TOTAL = 4096 };
    uint32_t max_n = 0;
    for (int i = 0; i < n_conc; i++)
        max_n = PC_MAX(max_n, conc[i]);
    uint32_t *tok = pc_xmalloc((size_t)PC_MAX(max_n * n_prompt, 3 * MIX_TOTAL) * sizeof *tok);
    track_t *t = pc_xcalloc(PC_MAX(max_n, 2), sizeof *t);
    double *ttft = pc_xcalloc(max_n, sizeof *ttft), *tpot = pc_xcalloc(max_n, sizeof *tpot);
    bench_report_t r;
    bench_report_init(&r, "worker");
    int ret = 1;
    uint64_t id = 1, ns = 1000;
    static const char *const anchor_tps[] = {
        [1] = "llama.cpp 73", [4] = "llama.cpp 107", [16] = "llama.cpp 97"};
    static const char *const anchor_ttft[] = {
        [1] = "llama.cpp 170", [4] = "llama.cpp 780", [16] = "llama.cpp 3300"};

    /* Warm-up: pages the weights in. */
    random_tokens(tok, 64, info.n_vocab);
    if (submit(w, temperature, t, id++, ns++, tok, 64, 4) != 0 || wait_all(w, t, 1) != 0)
        goto done;

    for (int c = 0; c < n_conc; c++) {
        uint32_t n = conc[c];
        random_tokens(tok, n * n_prompt, info.n_vocab);
        double c0 = bench_cpu_s();
        for (uint32_t i = 0; i < n; i++)
            if (submit(w, temperature, &t[i], id++, ns++, tok + (size_t)i * n_prompt, n_prompt,
                       n_gen) != 0)
                goto done;
        double t0 = t[0].t_submit;
        if (wait_all(w, t, n) != 0)
            goto done;
        double t_end = 0;
        for (uint32_t i = 0; i < n; i++) {
            t_end = PC_MAX(t_end, t[i].t_done);
            ttft[i] = t[i].t_first - t[i].t_submit;
            tpot[i] = n_gen > 1 ? (t[i].t_done - t[i].t_first) / (n_gen - 1) : 0;
        }
        double tps = (double)n * n_gen / (t_end - t0);
        double busy = (bench_cpu_s() - c0) / ((t_end - t0) * threads);
        char key[64], note[96];
        snprintf(note, sizeof note, "%u x (%u prompt + %u gen)%s%s", n, n_prompt, n_gen,
                 n < PC_ARRAY_LEN(anchor_tps) && anchor_tps[n] ? "; " : "",
                 n < PC_ARRAY_LEN(anchor_tps) && anchor_tps[n] ? anchor_tps[n] : "");
        snprintf(key, sizeof key, "tokens_per_s_aggregate_n%u", n);
        bench_report_add(&r, key, tps, note);
        snprintf(key, sizeof key, "ttft_ms_median_n%u", n);
        snprintf(note, sizeof note, "%s",
                 n < PC_ARRAY_LEN(anchor_ttft) && anchor_ttft[n] ? anchor_ttft[n] : "");
        bench_report_add(&r, key, median(ttft, n) * 1e3, note);
        snprintf(key, sizeof key, "tpot_ms_median_n%u", n);
        bench_report_add(&r, key, median(tpot, n) * 1e3, "time per output token after the first");
        snprintf(key, sizeof key, "cpu_share_n%u", n);
        bench_report_add(&r, key, busy, "CPU time / (wall x threads): < 1 = cores shared");
    }

    if (mixed) {
        /* The cached prefix, pre-warmed with max_tokens 0. */
        uint32_t *prefix = tok, *cold = tok + MIX_TOTAL, *hot = tok + 2 * MIX_TOTAL;
        random_tokens(prefix, MIX_TOTAL, info.n_vocab);
        random_tokens(cold, MIX_TOTAL, info.n_vocab);
        uint64_t mix_ns = ns++;
        if (submit(w, temperature, t, id++, mix_ns, prefix, MIX_PREFIX, 0) != 0 ||
            wait_all(w, t, 1) != 0)
            goto done;
        /* Alone: the prefix plus 64 new tokens. */
        memcpy(hot, prefix, MIX_PREFIX * sizeof *hot);
        random_tokens(hot + MIX_PREFIX, MIX_TOTAL - MIX_PREFIX, info.n_vocab);
        if (submit(w, temperature, t, id++, mix_ns, hot, MIX_TOTAL, 1) != 0 ||
            wait_all(w, t, 1) != 0)
            goto done;
        double alone = t[0].t_first - t[0].t_submit;
        uint32_t reused_alone = t[0].usage.tokens_reused;
        /* Beside a cold 4096-token request submitted just before it (new suffix, so the reuse
         * is the same 4032 tokens). */
        random_tokens(hot + MIX_PREFIX, MIX_TOTAL - MIX_PREFIX, info.n_vocab);
        if (submit(w, temperature, &t[0], id++, ns++, cold, MIX_TOTAL, 1) != 0 ||
            submit(w, temperature, &t[1], id++, mix_ns, hot, MIX_TOTAL, 1) != 0 ||
            wait_all(w, t, 2) != 0)
            goto done;
        double beside = t[1].t_first - t[1].t_submit, cold_ttft = t[0].t_first - t[0].t_submit;
        if (reused_alone != MIX_PREFIX || t[1].usage.tokens_reused != MIX_PREFIX)
            fprintf(stderr,
                    "kvgw bench worker: the cached request reused %u and %u tokens, not %u\n",
                    reused_alone, t[1].usage.tokens_reused, MIX_PREFIX);
        bench_report_add(&r, "ttft_ms_cached_4032_alone", alone * 1e3, "llama.cpp ~1000");
        bench_report_add(&r, "ttft_ms_cached_4032_beside_cold_4096", beside * 1e3,
                         "llama.cpp ~26000");
        bench_report_add(&r, "ttft_ratio_beside_over_alone", beside / alone, "target <= 2");
        bench_report_add(&r, "ttft_ms_cold_4096_beside_cached", cold_ttft * 1e3, NULL);
    }
    eng_worker_stats_t st;
    eng_worker_stats(w, &st);
    bench_report_add(&r, "scheduler_steps", (double)st.n_steps, NULL);
    bench_report_add(&r, "preemptions", (double)st.n_preempted, NULL);
    bench_report_add(&r, "peak_rss_mib", (double)pc_rss_peak_bytes() / (1 << 20), NULL);
    /* Decode steps are bound by memory bandwidth, which varies on a shared machine: the
     * bandwidth of this moment beside the figures (after the peak RSS: its buffer is 512 MiB). */
    bench_report_add(&r, "stream_read_gb_s", bench_stream_read_gb_s(threads, (size_t)512 << 20),
                     "this machine now, same threads");
    bench_report_print(&r);
    ret = 0;
done:
    pc_free(tok);
    pc_free(t);
    pc_free(ttft);
    pc_free(tpot);
    eng_worker_free(w);
    return ret;
}
