/* bench.c — report printing shared by the benchmarks (see bench.h). */
#include "bench.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

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

/* ---------------------------------------------------------------------------------------------
 * Streaming read bandwidth: the roofline of every memory-bound figure
 * ------------------------------------------------------------------------------------------- */

typedef struct stream_arg {
    const uint64_t *p;
    size_t n_words;
    uint64_t sum; /* kept so the loads are not optimized away */
} stream_arg_t;

static void *stream_main(void *arg)
{
    stream_arg_t *a = arg;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= a->n_words; i += 4) {
        s0 += a->p[i];
        s1 += a->p[i + 1];
        s2 += a->p[i + 2];
        s3 += a->p[i + 3];
    }
    a->sum = s0 + s1 + s2 + s3;
    return NULL;
}

double bench_stream_read_gb_s(unsigned threads, size_t n_bytes)
{
    if (threads == 0 || threads > 64 || n_bytes < 64 * threads)
        return -1;
    pc_pages_t pages;
    pc_pages_init(&pages, pc_pages_huge_available());
    uint64_t *buf = pc_pages_alloc(&pages, n_bytes);
    if (buf == NULL)
        return -1;
    size_t n_words = n_bytes / 8;
    for (size_t i = 0; i < n_words; i++)
        buf[i] = i;
    double best = -1;
    for (int rep = 0; rep < 5; rep++) {
        pthread_t th[64];
        stream_arg_t args[64];
        size_t per = n_words / threads;
        double t0 = bench_now_s();
        unsigned started = 0;
        for (unsigned t = 0; t < threads; t++) {
            args[t] = (stream_arg_t){.p = buf + t * per, .n_words = per};
            if (t == 0 || pthread_create(&th[t], NULL, stream_main, &args[t]) == 0)
                started = t + 1;
            else
                break;
        }
        stream_main(&args[0]);
        for (unsigned t = 1; t < started; t++)
            pthread_join(th[t], NULL);
        double dt = bench_now_s() - t0;
        double gbs = dt > 0 ? (double)(per * threads * 8) / dt / 1e9 : -1;
        if (started == threads && gbs > best)
            best = gbs;
    }
    pc_pages_release(&pages);
    return best;
}
