/* bench.c — report printing shared by the benchmarks (see bench.h). */
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

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
