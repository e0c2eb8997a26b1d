/* bench.c — report printing shared by the benchmarks (see bench.h). */
#include "bench.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pc_alloc.h"
#include "pc_pages.h"
#include "pc_time.h"

void bench_report_init(bench_report_t *r, const char *name)
{
    memset(r, 0, sizeof *r);
    r->name = name;
}

void bench_report_add(bench_report_t *r, const char *key, double value, const char *note)
{
    if (r->n >= BENCH_MAX_FIGURES)
        return;
    snprintf(r->fig[r->n].key, sizeof r->fig[r->n].key, "%s", key);
    r->fig[r->n].value = value;
    snprintf(r->fig[r->n].note, sizeof r->fig[r->n].note, "%s", note != NULL ? note : "");
    r->n++;
}

static void print_value(double v)
{
    if (!isfinite(v))
        printf("null");
    else if (v == (double)(long long)v && fabs(v) < 1e15)
        printf("%lld", (long long)v);
    else if (fabs(v) >= 1000 && fabs(v) < 1e15)
        printf("%.1f", v);
    else
        printf("%.6g", v);
}

void bench_report_print(const bench_report_t *r)
{
    printf("\n%-40s %18s  %s\n", "figure", "value", "");
    for (int i = 0; i < r->n; i++) {
        double v = r->fig[i].value;
        if (isfinite(v) && fabs(v) >= 1000 && fabs(v) < 1e15)
            printf("%-40s %18.0f  %s\n", r->fig[i].key, v, r->fig[i].note);
        else
            printf("%-40s %18.6g  %s\n", r->fig[i].key, v, r->fig[i].note);
    }
    printf("{\"bench\": \"%s\", \"figures\": {", r->name);
    for (int i = 0; i < r->n; i++) {
        printf("%s\"%s\": ", i ? ", " : "", r->fig[i].key);
        print_value(r->fig[i].value);
    }
    printf("}}\n");
    fflush(stdout);
}

double bench_now_s(void)
{
    return (double)pc_time_mono_ns() * 1e-9;
}

double bench_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_percentile(double *v, int n, double p)
{
    if (n <= 0)
        return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

/* ---------------------------------------------------------------------------------------------
 * Streaming read bandwidth: the roofline of every memory-bound figure
 * ------------------------------------------------------------------------------------------- */

/* 16-byte vectors (SSE2 on x86-64, NEON on aarch64): a loop of 8-byte loads is bound by the core
 * before the memory when the machine is quiet (on the 2-core Zen 5 test machine two threads of it
 * read 64-68 GB/s where these loads read 76-80), which would put the roofline under what a
 * kernel can reach. */
typedef uint64_t stream_vec_t __attribute__((vector_size(16)));

struct bench_stream {
    pc_pages_t pages;
    const stream_vec_t *buf;
    unsigned threads;
    size_t per; /* vectors per thread: a whole number of 256-byte steps */
};

typedef struct stream_arg {
    const stream_vec_t *p;
    size_t n_vecs;
    bool prefetch;   /* also hint the lines 4 KiB ahead (as the decode GEMVs do) */
    atomic_bool *go; /* set once every thread of the pass exists */
    double t0, t1;
    stream_vec_t sum; /* kept so the loads are not optimized away */
} stream_arg_t;

static void *stream_main(void *arg)
{
    stream_arg_t *a = arg;
    stream_vec_t s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    while (!atomic_load_explicit(a->go, memory_order_acquire))
        sched_yield();
    a->t0 = bench_now_s();
    for (size_t i = 0; i + 16 <= a->n_vecs; i += 16) { /* four cache lines per step */
        const stream_vec_t *v = a->p + i;
        if (a->prefetch)
            for (int l = 0; l < 4; l++)
                __builtin_prefetch((const char *)(v + 4 * l) + 4096, 0, 3);
        s0 += v[0] + v[1] + v[2] + v[3];
        s1 += v[4] + v[5] + v[6] + v[7];
        s2 += v[8] + v[9] + v[10] + v[11];
        s3 += v[12] + v[13] + v[14] + v[15];
    }
    a->t1 = bench_now_s();
    a->sum = s0 + s1 + s2 + s3;
    return NULL;
}

bench_stream_t *bench_stream_new(unsigned threads, size_t n_bytes)
{
    if (threads == 0 || threads > 64 || n_bytes < 256 * threads)
        return NULL;
    bench_stream_t *s = pc_calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    pc_pages_init(&s->pages, pc_pages_huge_available());
    uint64_t *buf = pc_pages_alloc(&s->pages, n_bytes);
    if (buf == NULL) {
        pc_free(s);
        return NULL;
    }
    for (size_t i = 0; i < n_bytes / 8; i++) /* resident, and not the zero page */
        buf[i] = i;
    s->buf = (const stream_vec_t *)(const void *)buf;
    s->threads = threads;
    s->per = n_bytes / threads / 256 * 256 / sizeof(stream_vec_t);
    return s;
}

size_t bench_stream_bytes(const bench_stream_t *s)
{
    return s->per * s->threads * sizeof(stream_vec_t);
}

double bench_stream_pass(bench_stream_t *s, bool prefetch)
{
    pthread_t th[64];
    stream_arg_t args[64];
    atomic_bool go = false;
    unsigned started = 1;
    for (unsigned t = 0; t < s->threads; t++) {
        args[t] = (stream_arg_t){
            .p = s->buf + t * s->per, .n_vecs = s->per, .prefetch = prefetch, .go = &go};
        if (t > 0 && pthread_create(&th[t], NULL, stream_main, &args[t]) != 0)
            break;
        started = t + 1;
    }
    atomic_store_explicit(&go, true, memory_order_release);
    stream_main(&args[0]);
    for (unsigned t = 1; t < started; t++)
        pthread_join(th[t], NULL);
    if (started < s->threads)
        return -1;
    /* From the first thread's start to the last one's end: thread creation is not counted. */
    double t0 = args[0].t0, t1 = args[0].t1;
    for (unsigned t = 1; t < s->threads; t++) {
        t0 = args[t].t0 < t0 ? args[t].t0 : t0;
        t1 = args[t].t1 > t1 ? args[t].t1 : t1;
    }
    return t1 > t0 ? (double)bench_stream_bytes(s) / (t1 - t0) / 1e9 : -1;
}

void bench_stream_free(bench_stream_t *s)
{
    if (s == NULL)
        return;
    pc_pages_release(&s->pages);
    pc_free(s);
}

double bench_stream_read_gb_s(unsigned threads, size_t n_bytes)
{
    bench_stream_t *s = bench_stream_new(threads, n_bytes);
    if (s == NULL)
        return -1;
    double best = -1;
    for (int rep = 0; rep < 10; rep++) { /* five passes plain, five prefetching, alternated */
        double g = bench_stream_pass(s, rep % 2);
        best = g > best ? g : best;
    }
    bench_stream_free(s);
    return best;
}
