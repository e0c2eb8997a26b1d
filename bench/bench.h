/*
 * bench.h — shared plumbing for `kvgw bench NAME`: every benchmark prints a readable table,
 * then one JSON object on its last line: {"bench": NAME, "figures": {...}}. Figure names
 * carry their unit (lookups_per_s_full_hit, bytes_per_token, ttft_ms_cached).
 */
#ifndef KVGW_BENCH_H
#define KVGW_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BENCH_MAX_FIGURES 64

typedef struct bench_report {
    const char *name;
    int n;
    struct {
        char key[64];
        double value;
        char note[96];
    } fig[BENCH_MAX_FIGURES];
} bench_report_t;

void bench_report_init(bench_report_t *r, const char *name);
/* Adds a figure; note is free text for the table (may be NULL). */
void bench_report_add(bench_report_t *r, const char *key, double value, const char *note);
/* Prints the table and then the JSON line to stdout. */
void bench_report_print(const bench_report_t *r);

/* xorshift64: the next pseudo-random value of *state (never 0). The benchmarks' token ids come
 * from it (deterministic across runs). */
static inline uint64_t bench_rand(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return *state = x;
}

/* Monotonic wall time and the process's CPU time (all threads), in seconds. On a shared machine
 * wall time alone hides how much of the cores a benchmark actually got: benchmarks report
 * cpu / (wall x threads) as cpu_share beside their figures. */
double bench_now_s(void);
double bench_cpu_s(void);

/* The p-quantile (0..1, nearest rank) of v[0..n), which it sorts in place; NAN when n <= 0. */
double bench_percentile(double *v, int n, double p);

/* Streaming reads: `threads` threads each summing its share of an n_bytes buffer (on huge pages
 * where the kernel has them) in 16-byte vectors, optionally with the lines 4 KiB ahead
 * prefetched: the most a memory-bound kernel can stream on this machine right now. Benchmarks of
 * such kernels report their own GB/s beside it. bench_stream_new allocates and fills the buffer
 * (NULL when it or the arguments cannot be had); bench_stream_pass reads it once and returns
 * GB/s, timed from the first thread's start to the last one's end (-1 when the threads cannot
 * be had); bench_stream_free(NULL) is a no-op. bench_stream_read_gb_s is the best of ten passes
 * of a new buffer, alternately plain and prefetching (-1 on failure). */
typedef struct bench_stream bench_stream_t;
bench_stream_t *bench_stream_new(unsigned threads, size_t n_bytes);
double bench_stream_pass(bench_stream_t *s, bool prefetch);
size_t bench_stream_bytes(const bench_stream_t *s);
void bench_stream_free(bench_stream_t *s);
double bench_stream_read_gb_s(unsigned threads, size_t n_bytes);

/* The benchmarks, each a subcommand main: argv[0] is the benchmark's name. */
int bench_radix_main(int argc, char **argv);
int bench_cindex_main(int argc, char **argv);
int bench_tokenizer_main(int argc, char **argv);
int bench_engine_main(int argc, char **argv);
int bench_sampler_main(int argc, char **argv);
int bench_kernels_main(int argc, char **argv);
int bench_worker_main(int argc, char **argv);
int bench_ledger_main(int argc, char **argv);
int bench_gateway_main(int argc, char **argv);
int bench_link_main(int argc, char **argv);
int bench_tiers_main(int argc, char **argv);
int bench_cluster_main(int argc, char **argv);

/* ns per TOKEN frame of the sealed worker link (encode, seal, open, decode; the best of five
 * passes of n_frames), or -1 on a failure: kvgw bench link's headline, also printed by kvgw
 * bench gateway. */
double bench_link_token_frame_ns(uint32_t n_frames);

#endif
