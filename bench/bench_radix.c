/*
 * bench_radix.c — `kvgw bench radix`: the token radix tree under the gateway's workload.
 *
 * Workload (defaults): 1000 shared prefixes of 2000 tokens; 100,000 requests, each one prefix
 * (picked at random) plus 200 unique tokens; vocabulary 128,256 (3-byte packed tokens). Every
 * request is inserted as an entry with its own expiry. Then four kinds of lookups, 100,000 each:
 *   full hit     the exact request (2200 tokens matched),
 *   prefix hit   the prefix plus 200 fresh tokens (2000 matched),
 *   partial hit  the prefix cut at a random point, then fresh tokens (diverges mid-prefix),
 *   miss         fresh tokens whose first token starts no prefix.
 * Finally one rdx_tree_expire call expires all 100,000 entries (and the emptied prefixes).
 *
 * Queries are built in batches outside the timed regions; only the tree calls are timed.
 * Memory: a counting allocator (malloc_usable_size of every block the tree allocates through
 * the pc_ hooks) gives bytes per stored token; peak RSS is the whole process (workload arrays
 * included). Deterministic: a seeded xorshift generator. Every lookup's matched length is
 * verified against the workload; a wrong one fails the benchmark (exit 1).
 */
#include "bench.h"

#include "common.h"
#include "radix.h"

#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- a counting allocator over the C library's ---- */

static size_t live_bytes, peak_bytes;

static void *cnt_malloc(size_t n)
{
    void *p = malloc(n);
    if (p != NULL) {
        live_bytes += malloc_usable_size(p);
        if (live_bytes > peak_bytes)
            peak_bytes = live_bytes;
    }
    return p;
}

static void *cnt_calloc(size_t c, size_t n)
{
    void *p = calloc(c, n);
    if (p != NULL) {
        live_bytes += malloc_usable_size(p);
        if (live_bytes > peak_bytes)
            peak_bytes = live_bytes;
    }
    return p;
}

static void *cnt_realloc(void *old, size_t n)
{
    size_t before = old != NULL ? malloc_usable_size(old) : 0;
    void *p = realloc(old, n);
    if (p != NULL) {
        live_bytes += malloc_usable_size(p) - before;
        if (live_bytes > peak_bytes)
            peak_bytes = live_bytes;
    }
    return p;
}

static void cnt_free(void *p)
{
    if (p != NULL)
        live_bytes -= malloc_usable_size(p);
    free(p);
}

/* Thread CPU time: on a shared machine the wall-clock figures include time this thread was
 * not running; the *_cpu figures exclude it (cache interference from others remains). */
static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t wall_total, cpu_total;

/* ---- workload ---- */

typedef struct wl {
    size_t n_prefixes, prefix_len, n_requests, n_unique;
    uint32_t vocab;
    uint64_t seed;
    uint32_t *prefixes;   /* [n_prefixes][prefix_len] */
    uint32_t *req_prefix; /* [n_requests] */
    uint8_t *first_used;  /* [vocab]: 1 if some prefix starts with this token */
} wl_t;

static inline uint64_t xs(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static inline uint32_t rtok(uint64_t *s, uint32_t vocab)
{
    return (uint32_t)(xs(s) % vocab);
}

/* The unique tail of request i, regenerated from its own seed. */
static void req_tail(const wl_t *w, size_t i, uint32_t *dst)
{
    uint64_t s = (w->seed ^ 0xA5A5A5A5u) * 0x9E3779B97F4A7C15ull + i * 2654435761u + 1;
    for (size_t k = 0; k < w->n_unique; k++)
        dst[k] = rtok(&s, w->vocab);
}

enum { Q_FULL, Q_PREFIX, Q_PARTIAL, Q_MISS, Q_KINDS };
static const char *const q_name[Q_KINDS] = {"full_hit", "prefix_hit", "partial_hit", "miss"};

/* Builds query i of a kind into dst (len = prefix_len + n_unique) and returns the expected
 * match length. */
static size_t build_query(const wl_t *w, int kind, size_t i, uint64_t *rng, uint32_t *dst)
{
    size_t L = w->prefix_len, n = L + w->n_unique;
    const uint32_t *pre = w->prefixes + (size_t)w->req_prefix[i] * L;
    switch (kind) {
    case Q_FULL:
        memcpy(dst, pre, L * 4);
        req_tail(w, i, dst + L);
        return n;
    case Q_PREFIX:
        memcpy(dst, pre, L * 4);
        for (size_t k = L; k < n; k++)
            dst[k] = rtok(rng, w->vocab);
        /* The first fresh token must continue no stored request. Token ids equal to vocab
         * (out of the vocabulary) are never stored. */
        dst[L] = w->vocab;
        return L;
    case Q_PARTIAL: {
        size_t d = 1 + (size_t)(xs(rng) % (L - 1));
        memcpy(dst, pre, d * 4);
        for (size_t k = d; k < n; k++)
            dst[k] = rtok(rng, w->vocab);
        /* Inside the prefix's edge the only continuation is pre[d]: diverge from it. */
        dst[d] = (pre[d] + 1) % w->vocab;
        return d;
    }
    default:
        for (size_t k = 0; k < n; k++)
            dst[k] = rtok(rng, w->vocab);
        while (w->first_used[dst[0]])
            dst[0] = rtok(rng, w->vocab);
        return 0;
    }
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kvgw bench radix [--prefixes N] [--prefix-len N] [--requests N] "
               "[--unique N] [--vocab N (1024..67108864)] [--seed N]\n");
}

static int parse_size(const char *s, size_t lo, size_t hi, size_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = (size_t)v;
    return 0;
}

int bench_radix_main(int argc, char **argv)
{
    wl_t w = {1000, 2000, 100000, 200, 128256, 42, NULL, NULL, NULL};
    for (int i = 1; i < argc; i++) {
        size_t v = 0;
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        int ok = i + 1 < argc;
        if (ok && strcmp(a, "--prefixes") == 0)
            ok = parse_size(argv[++i], 1, 1000000, &w.n_prefixes) == 0;
        else if (ok && strcmp(a, "--prefix-len") == 0)
            ok = parse_size(argv[++i], 2, 1000000, &w.prefix_len) == 0;
        else if (ok && strcmp(a, "--requests") == 0)
            ok = parse_size(argv[++i], 1, 10000000, &w.n_requests) == 0;
        else if (ok && strcmp(a, "--unique") == 0)
            ok = parse_size(argv[++i], 1, 1000000, &w.n_unique) == 0;
        else if (ok && strcmp(a, "--vocab") == 0 && parse_size(argv[++i], 1024, 1u << 26, &v) == 0)
            w.vocab = (uint32_t)v;
        else if (ok && strcmp(a, "--seed") == 0 && parse_size(argv[++i], 0, SIZE_MAX, &v) == 0)
            w.seed = v;
        else
            ok = 0;
        if (!ok) {
            fprintf(stderr, "kvgw bench radix: bad or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }

    if (w.n_prefixes > w.vocab / 2) {
        /* Prefixes get distinct first tokens (and misses need unused ones). */
        fprintf(stderr, "kvgw bench radix: --prefixes must be at most half of --vocab\n");
        usage(stderr);
        return 2;
    }

    int rc = 1;
    rdx_tree_t *t = NULL;
    uint32_t *qbuf = NULL;
    size_t *qexp = NULL;
    const size_t L = w.prefix_len, N = L + w.n_unique, B = 64;
    uint64_t rng = w.seed * 0x2545F4914F6CDD1Dull + 7;
    w.prefixes = malloc(w.n_prefixes * L * 4);
    w.req_prefix = malloc(w.n_requests * 4);
    w.first_used = calloc(w.vocab + 1, 1);
    qbuf = malloc(B * N * 4);
    qexp = malloc(B * sizeof *qexp);
    if (!w.prefixes || !w.req_prefix || !w.first_used || !qbuf || !qexp) {
        fprintf(stderr, "kvgw bench radix: out of memory for the workload\n");
        goto out;
    }
    for (size_t p = 0; p < w.n_prefixes; p++) {
        uint32_t *pre = w.prefixes + p * L;
        /* Distinct first tokens, so prefixes share nothing with each other. */
        do
            pre[0] = rtok(&rng, w.vocab);
        while (w.first_used[pre[0]]);
        w.first_used[pre[0]] = 1;
        for (size_t k = 1; k < L; k++)
            pre[k] = rtok(&rng, w.vocab);
    }
    for (size_t i = 0; i < w.n_requests; i++)
        w.req_prefix[i] = (uint32_t)(xs(&rng) % w.n_prefixes);

    pc_allocator_t counting = {cnt_malloc, cnt_calloc, cnt_realloc, cnt_free};
    pc_allocator_t prev = pc_set_allocator(&counting);
    rdx_tree_params_t params = rdx_tree_params_default();
    params.vocab_size = w.vocab;
    if (rdx_tree_init(&params, &t) != 0) {
        fprintf(stderr, "kvgw bench radix: cannot create the tree\n");
        goto out_alloc;
    }

    printf("radix bench: %zu prefixes x %zu tokens, %zu requests (+%zu unique tokens), vocab "
           "%" PRIu32 ", %d-byte tokens\n",
           w.n_prefixes, L, w.n_requests, w.n_unique, w.vocab, rdx_tree_token_width(t));

    /* Inserts: each request is an entry expiring at 1e9 + i (distinct expiries). */
    uint64_t ns_insert = 0, cpu_insert = 0;
    for (size_t b0 = 0; b0 < w.n_requests; b0 += B) {
        size_t nb = PC_MIN(B, w.n_requests - b0);
        for (size_t j = 0; j < nb; j++)
            build_query(&w, Q_FULL, b0 + j, &rng, qbuf + j * N);
        uint64_t t0 = pc_time_mono_ns(), c0 = cpu_ns();
        for (size_t j = 0; j < nb; j++) {
            int r = rdx_tree_insert(t, 1, qbuf + j * N, N, b0 + j, 1000000000ull + b0 + j,
                                    RDX_INSERT_ENTRY, NULL);
            if (r < 0) {
                fprintf(stderr, "kvgw bench radix: insert failed: %s\n", pc_strerror(r));
                goto out_alloc;
            }
        }
        ns_insert += pc_time_mono_ns() - t0;
        cpu_insert += cpu_ns() - c0;
    }
    wall_total += ns_insert;
    cpu_total += cpu_insert;
    rdx_stats_t st;
    rdx_tree_stats(t, &st);
    size_t tree_bytes = live_bytes;

    bench_report_t rep;
    bench_report_init(&rep, "radix");
    double ins_s = (double)w.n_requests / ((double)ns_insert / 1e9);
    bench_report_add(&rep, "inserts_per_s", ins_s, "target >= 500000 (2x rax)");
    bench_report_add(&rep, "inserts_per_s_cpu", (double)w.n_requests / ((double)cpu_insert / 1e9),
                     "per thread CPU second");

    /* Lookups of each kind. */
    for (int kind = 0; kind < Q_KINDS; kind++) {
        uint64_t ns = 0, cpu = 0, matched = 0, bad = 0;
        uint64_t qrng = w.seed + 1000 + (uint64_t)kind;
        for (size_t b0 = 0; b0 < w.n_requests; b0 += B) {
            size_t nb = PC_MIN(B, w.n_requests - b0);
            for (size_t j = 0; j < nb; j++)
                qexp[j] = build_query(&w, kind, b0 + j, &qrng, qbuf + j * N);
            uint64_t t0 = pc_time_mono_ns(), c0 = cpu_ns(), got = 0;
            for (size_t j = 0; j < nb; j++) {
                rdx_match_t m;
                rdx_tree_match(t, 1, qbuf + j * N, N, &m);
                got += m.n_matched;
                bad += m.n_matched != qexp[j];
            }
            ns += pc_time_mono_ns() - t0;
            cpu += cpu_ns() - c0;
            matched += got;
        }
        if (bad != 0) {
            fprintf(stderr, "kvgw bench radix: %" PRIu64 " %s lookups matched a wrong length\n",
                    bad, q_name[kind]);
            goto out_alloc;
        }
        char key[64], note[96];
        double secs = (double)ns / 1e9;
        snprintf(key, sizeof key, "lookups_per_s_%s", q_name[kind]);
        snprintf(note, sizeof note, "%s", kind == Q_FULL ? "target >= 800000 (4x rax)" : "");
        bench_report_add(&rep, key, (double)w.n_requests / secs, note);
        snprintf(key, sizeof key, "matched_tokens_per_s_%s", q_name[kind]);
        bench_report_add(&rep, key, (double)matched / secs, NULL);
        if (kind == Q_FULL)
            bench_report_add(&rep, "lookups_per_s_full_hit_cpu",
                             (double)w.n_requests / ((double)cpu / 1e9), "per thread CPU second");
        wall_total += ns;
        cpu_total += cpu;
    }

    bench_report_add(&rep, "stored_tokens", (double)st.n_tokens, NULL);
    bench_report_add(&rep, "nodes", (double)st.n_nodes, NULL);
    bench_report_add(&rep, "bytes_per_token", (double)tree_bytes / (double)st.n_tokens,
                     "allocator-counted; target <= 4.5 (rax 4.3)");
    bench_report_add(&rep, "bytes_per_token_accounted", (double)st.n_bytes / (double)st.n_tokens,
                     "the tree's own accounting");

    /* Expire every entry at once. */
    size_t freed = 0;
    uint64_t t0 = pc_time_mono_ns(), c0 = cpu_ns();
    rdx_tree_expire(t, UINT64_MAX - 1, &freed);
    uint64_t exp_wall = pc_time_mono_ns() - t0, exp_cpu = cpu_ns() - c0;
    double exp_ms = (double)exp_wall / 1e6;
    wall_total += exp_wall;
    cpu_total += exp_cpu;
    if (freed != st.n_tokens || rdx_tree_ns_count(t) != 0) {
        fprintf(stderr, "kvgw bench radix: expire freed %zu of %" PRIu64 " tokens\n", freed,
                st.n_tokens);
        goto out_alloc;
    }
    char note[96];
    snprintf(note, sizeof note, "%zu entries; target <= 50 ms", w.n_requests);
    bench_report_add(&rep, "expire_ms_100k_entries", exp_ms, note);
    bench_report_add(&rep, "expire_ms_100k_entries_cpu", (double)exp_cpu / 1e6, "thread CPU time");
    bench_report_add(&rep, "cpu_share", (double)cpu_total / (double)wall_total,
                     "CPU / wall over the timed regions (< 1: the machine was shared)");
    bench_report_add(&rep, "peak_rss_bytes", (double)pc_rss_peak_bytes(), "whole process");
    bench_report_add(&rep, "peak_tree_bytes", (double)peak_bytes, "allocator-counted");
    bench_report_print(&rep);
    rc = 0;

out_alloc:
    rdx_tree_free(t);
    pc_set_allocator(&prev);
out:
    free(w.prefixes);
    free(w.req_prefix);
    free(w.first_used);
    free(qbuf);
    free(qexp);
    return rc;
}
