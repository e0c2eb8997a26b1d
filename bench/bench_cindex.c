/*
 * bench_cindex.c — `kvgw bench cindex`: the gateway's cache index (gateway/cindex.c) under the
 * request path's workload.
 *
 * Workload (defaults): 100 namespaces; 1000 shared prefixes of 2000 tokens (10 per namespace,
 * each an entry with the 1h TTL) owned by 8 workers; 100,000 requests, each one prefix (picked
 * at random) plus 200 unique tokens, written as a 5m entry and owned by one worker. Then, 100,000
 * each, timed separately: match of the exact request (2200 tokens, with per-worker held
 * lengths), read (TTL refresh of the request's entries), entry_live probes at the request's end
 * (Anthropic lookback), and a match of an 8000-token prompt of which 8000 are cached. Finally
 * one storage take and one expire call that retires all 101,000 entries.
 *
 * Every match is checked against the workload (a wrong hit length fails the benchmark). Query
 * arrays are built outside the timed regions. Deterministic: a seeded xorshift generator.
 */
#include "bench.h"

#include "cindex.h"
#include "common.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_NS 100
#define N_PREFIX 1000
#define PREFIX_LEN 2000
#define TAIL_LEN 200
#define REQ_LEN (PREFIX_LEN + TAIL_LEN)
#define LONG_LEN 8000

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static uint32_t rnd32(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 11);
}

static void fill(uint32_t *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        t[i] = rnd32() % 128256u;
}

static size_t n_dropped;
static void on_drop(const gw_cindex_drop_t *ev, void *ud)
{
    (void)ev;
    (void)ud;
    n_dropped++;
}

static void on_take(uint64_t ns, uint64_t token_ms, void *ud)
{
    (void)ns;
    *(uint64_t *)ud += token_ms;
}

int bench_cindex_main(int argc, char **argv)
{
    size_t n_req = 100000;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--requests") == 0 && i + 1 < argc) {
            n_req = (size_t)strtoull(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--help") == 0) {
            printf("usage: kvgw bench cindex [--requests N]\n");
            return 0;
        } else {
            fprintf(stderr, "usage: kvgw bench cindex [--requests N]\n");
            return 2;
        }
    }
    if (n_req == 0)
        n_req = 1;
    int rc = 1;
    uint32_t *prefixes = malloc((size_t)N_PREFIX * PREFIX_LEN * sizeof *prefixes);
    uint32_t *tails = malloc(n_req * TAIL_LEN * sizeof *tails);
    uint32_t *which = malloc(n_req * sizeof *which);
    uint32_t *q = malloc((size_t)LONG_LEN * sizeof *q);
    gw_cindex_t *ix = NULL;
    gw_cindex_params_t p = gw_cindex_params_default();
    p.vocab_size = 128256;
    p.n_workers = 8;
    p.on_drop = on_drop;
    if (prefixes == NULL || tails == NULL || which == NULL || q == NULL ||
        gw_cindex_init(&p, &ix) != 0) {
        fprintf(stderr, "kvgw bench cindex: out of memory\n");
        goto done;
    }
    fill(prefixes, (size_t)N_PREFIX * PREFIX_LEN);
    fill(tails, n_req * TAIL_LEN);
    for (size_t i = 0; i < n_req; i++)
        which[i] = rnd32() % N_PREFIX;

    bench_report_t rep;
    bench_report_init(&rep, "cindex");
    uint64_t now = 1000;

    /* Shared prefixes: 1h entries, every worker holds them. */
    for (uint32_t k = 0; k < N_PREFIX; k++) {
        const uint32_t *pre = prefixes + (size_t)k * PREFIX_LEN;
        if (gw_cindex_insert(ix, k % N_NS, pre, PREFIX_LEN, GW_CINDEX_TTL_1H, now, now) < 0)
            goto oom;
        for (uint32_t w = 0; w < 8; w++)
            gw_cindex_owner_add(ix, k % N_NS, pre, PREFIX_LEN, w, NULL);
    }
    /* Requests: 5m entries, one worker each. */
    double t0 = bench_now_s();
    for (size_t i = 0; i < n_req; i++) {
        uint32_t k = which[i];
        memcpy(q, prefixes + (size_t)k * PREFIX_LEN, PREFIX_LEN * sizeof *q);
        memcpy(q + PREFIX_LEN, tails + i * TAIL_LEN, TAIL_LEN * sizeof *q);
        if (gw_cindex_insert(ix, k % N_NS, q, REQ_LEN, GW_CINDEX_TTL_5M, now, now) < 0)
            goto oom;
        gw_cindex_owner_add(ix, k % N_NS, q, REQ_LEN, (uint32_t)(i % 8), NULL);
    }
    double t_ins = bench_now_s() - t0;

    /* Build the request queries once (2200 tokens each) into one array, outside the timing. */
    uint32_t *reqs = malloc(n_req * REQ_LEN * sizeof *reqs);
    if (reqs == NULL)
        goto oom;
    for (size_t i = 0; i < n_req; i++) {
        memcpy(reqs + i * REQ_LEN, prefixes + (size_t)which[i] * PREFIX_LEN,
               PREFIX_LEN * sizeof *q);
        memcpy(reqs + i * REQ_LEN + PREFIX_LEN, tails + i * TAIL_LEN, TAIL_LEN * sizeof *q);
    }
    now += 10;
    gw_cindex_match_t m;
    size_t bad = 0;
    t0 = bench_now_s();
    for (size_t i = 0; i < n_req; i++) {
        gw_cindex_match(ix, which[i] % N_NS, reqs + i * REQ_LEN, REQ_LEN, now, &m);
        bad += m.n_hit != REQ_LEN || m.held[i % 8] != REQ_LEN || m.held[(i + 1) % 8] < PREFIX_LEN;
    }
    double t_match = bench_now_s() - t0;
    t0 = bench_now_s();
    size_t refreshed = 0;
    for (size_t i = 0; i < n_req; i++) {
        size_t k = 0;
        gw_cindex_read(ix, which[i] % N_NS, reqs + i * REQ_LEN, REQ_LEN, now + 1, &k);
        refreshed += k;
    }
    double t_read = bench_now_s() - t0;
    bad += refreshed != 2 * n_req;
    t0 = bench_now_s();
    size_t live = 0;
    for (size_t i = 0; i < n_req; i++)
        live += gw_cindex_entry_live(ix, which[i] % N_NS, reqs + i * REQ_LEN, REQ_LEN, now + 1);
    double t_live = bench_now_s() - t0;
    bad += live != n_req;
    free(reqs);

    /* One 8000-token cached prompt (an 8,000-token system prompt), matched n_req times. */
    fill(q, LONG_LEN);
    if (gw_cindex_insert(ix, 4242, q, LONG_LEN, GW_CINDEX_TTL_1H, now, now) < 0)
        goto oom;
    t0 = bench_now_s();
    for (size_t i = 0; i < n_req; i++) {
        gw_cindex_match(ix, 4242, q, LONG_LEN, now + 2, &m);
        bad += m.n_hit != LONG_LEN;
    }
    double t_long = bench_now_s() - t0;

    gw_cindex_stats_t st;
    gw_cindex_stats(ix, &st);
    uint64_t token_ms = 0;
    t0 = bench_now_s();
    gw_cindex_storage_take(ix, now + 3, on_take, &token_ms);
    double t_take = bench_now_s() - t0;
    size_t entries = (size_t)st.n_entries;
    t0 = bench_now_s();
    size_t expired = gw_cindex_expire(ix, UINT64_MAX - 1);
    double t_exp = bench_now_s() - t0;
    bad += expired != entries || n_dropped != entries;
    if (bad != 0) {
        fprintf(stderr, "kvgw bench cindex: %zu wrong results\n", bad);
        goto done;
    }

    printf("cindex: %zu requests of %d tokens over %d shared prefixes of %d in %d namespaces\n",
           n_req, REQ_LEN, N_PREFIX, PREFIX_LEN, N_NS);
    printf("  %-34s %12.0f /s\n", "insert + owner_add (2200 tokens)", n_req / t_ins);
    printf("  %-34s %12.0f /s\n", "match (2200 tokens, 8 workers)", n_req / t_match);
    printf("  %-34s %12.0f /s\n", "read (TTL refresh of 2 entries)", n_req / t_read);
    printf("  %-34s %12.0f /s\n", "entry_live probe", n_req / t_live);
    printf("  %-34s %12.2f us\n", "match of an 8000-token prompt", t_long / n_req * 1e6);
    printf("  %-34s %12.3f ms (%zu namespaces)\n", "storage take", t_take * 1e3, (size_t)N_NS + 1);
    printf("  %-34s %12.0f ns/entry (%zu entries)\n", "expire all", t_exp / entries * 1e9, entries);
    printf("  %-34s %12.1f (%" PRIu64 " bytes, %" PRIu64 " tokens)\n", "bytes per stored token",
           (double)st.n_bytes / (double)st.n_tokens, st.n_bytes, st.n_tokens);
    bench_report_add(&rep, "inserts_per_s", n_req / t_ins, NULL);
    bench_report_add(&rep, "matches_per_s_2200_tokens", n_req / t_match, NULL);
    bench_report_add(&rep, "reads_per_s", n_req / t_read, NULL);
    bench_report_add(&rep, "entry_live_per_s", n_req / t_live, NULL);
    bench_report_add(&rep, "match_us_8000_tokens", t_long / n_req * 1e6, NULL);
    bench_report_add(&rep, "storage_take_ms", t_take * 1e3, NULL);
    bench_report_add(&rep, "expire_ns_per_entry", t_exp / entries * 1e9, NULL);
    bench_report_add(&rep, "bytes_per_token", (double)st.n_bytes / (double)st.n_tokens, NULL);
    bench_report_print(&rep);
    rc = 0;
    goto done;
oom:
    fprintf(stderr, "kvgw bench cindex: out of memory\n");
done:
    gw_cindex_free(ix);
    free(prefixes);
    free(tails);
    free(which);
    free(q);
    return rc;
}
