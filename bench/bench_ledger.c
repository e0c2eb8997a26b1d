/*
 * bench_ledger.c — `kvgw bench ledger`: how many usage events per second the ledger makes
 * durable under fsync=batch on this machine's disk, and the latency it adds to a request (append
 * to durable, the wait before a response's final bytes).
 *
 *   kvgw bench ledger [--dir DIR] [--events N] [--rate R] [--fsync always|batch|off]
 *                     [--window-us U] [--export-days D] [--events-per-day E] [--segment-mib S]
 *                     [--open-window W]
 *
 * Three phases: (1) throughput: one appender thread (the gateway's loop) appends N events as fast
 * as the ledger takes them while a waiter follows durable_seq; (2) latency: events at a steady
 * rate R per second (like requests finishing), each one's append-to-durable time recorded
 * (p50/p99/max); (3) export: a second ledger of D days x E events a day (segments of S MiB, one
 * event in ten arriving up to an hour late, so times are out of order), then the CSV export of
 * one day in the middle, timed with the time index and reading every segment (best of 3 each,
 * warm page cache), after the restart figures: the ledger's open (its recovery) reading every
 * segment (open_check full, what every open did before the time index was used by it), by the
 * index with the default duplicate window (1 Mi ids: the segments of the last 0.5-1 Mi records
 * are read) and with a window of W ids (--open-window, default 65536), best of 3 each, warm page
 * cache. D = 0 skips it. The ledger directories are created fresh and removed afterwards.
 */
#include "bench.h"
#include "billing.h"
#include "common.h"
#include "ledger.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: kvgw bench ledger [--dir DIR] [--events N] [--rate R] "
               "[--fsync always|batch|off] [--window-us U]\n"
               "                         [--export-days D] [--events-per-day E] "
               "[--segment-mib S] [--open-window W]\n");
}

static void make_event(bill_event_t *ev, bill_idgen_t *ids, uint64_t i)
{
    bill_event_init(ev, BILL_EVENT_USAGE);
    bill_idgen_next(ids, ev->event_id);
    snprintf(ev->request_id, BILL_STR_MAX, "msg_bench_%016" PRIx64, i);
    bill_event_set_str(ev->tenant, i % 4 ? "demo" : "demo2");
    bill_event_set_str(ev->api_key_id, "key-demo");
    bill_event_set_str(ev->model, "kvgw-bench");
    ev->start_ms = pc_time_wall_ms();
    ev->end_ms = ev->start_ms + 120;
    ev->usage =
        (bill_usage_t){.n_uncached = 120, .n_write_5m = 800, .n_read = 2048, .n_output = 64};
    ev->n_hit_logical = 2048;
    ev->n_hit_physical = 2048;
    ev->cost_nusd[BILL_BUCKET_UNCACHED] = 360000;
    ev->cost_nusd[BILL_BUCKET_WRITE_5M] = 3000000;
    ev->cost_nusd[BILL_BUCKET_READ] = 614400;
    ev->cost_nusd[BILL_BUCKET_OUTPUT] = 960000;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Latency phase: the waiter thread stamps each seq when it becomes durable. */
typedef struct lat {
    bill_ledger_t *l;
    uint64_t base; /* seqs base+1 .. base+n are measured */
    uint64_t n;
    uint64_t *t_append; /* [n] mono ns at append, by seq - 1 */
    uint64_t *t_durable;
    atomic_uint_fast64_t appended; /* highest seq appended */
    atomic_bool done;              /* set by the appender when it appends no more */
} lat_t;

static void *waiter_main(void *arg)
{
    lat_t *w = arg;
    uint64_t seen = w->base;
    while (seen < w->base + w->n && bill_ledger_status(w->l) == 0) {
        uint64_t target = atomic_load(&w->appended);
        if (target <= seen) {
            if (atomic_load(&w->done))
                break; /* the appender stopped early */
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
            continue;
        }
        bill_ledger_wait_durable(w->l, seen + 1);
        uint64_t d = bill_ledger_durable_seq(w->l), now = pc_time_mono_ns();
        if (d > target)
            d = target;
        for (uint64_t s = seen + 1; s <= d; s++)
            w->t_durable[s - w->base - 1] = now;
        seen = d > seen ? d : seen;
    }
    return NULL;
}

/* Export phase. */
#define DAY_MS 86400000ull

static int count_chunk(void *ud, const char *data, size_t len)
{
    (void)data;
    *(uint64_t *)ud += len;
    return 0;
}

/* Best-of-3 wall time of the CSV export of [from, to), and what it read. */
static int time_export(const char *dir, uint64_t from, uint64_t to, bool scan_all, double *best_s,
                       uint64_t *bytes, uint64_t *n_read, uint64_t *n_skipped)
{
    *best_s = 1e30;
    for (int k = 0; k < 3; k++) {
        bill_export_params_t xp = bill_export_params_default();
        xp.from_ms = from;
        xp.to_ms = to;
        xp.scan_all = scan_all;
        xp.chunk = count_chunk;
        xp.ud = bytes;
        *bytes = 0;
        char err[256] = "";
        bill_export_t *x;
        double t0 = bench_now_s();
        int rc = bill_export_open(dir, &xp, &x, err, sizeof err);
        if (rc != 0) {
            fprintf(stderr, "kvgw bench ledger: export: %s\n", err);
            return rc;
        }
        while ((rc = bill_export_step(x, 4096, err, sizeof err)) == 0)
            ;
        double t = bench_now_s() - t0;
        bill_export_segments(x, n_read, n_skipped);
        bill_export_free(x);
        if (rc != 1) {
            fprintf(stderr, "kvgw bench ledger: export: %s\n", err);
            return rc;
        }
        if (t < *best_s)
            *best_s = t;
    }
    return 0;
}

/* Times the ledger's open (the recovery) and close, best of 3, warm page cache: 0 or 1. */
static int time_open(const char *dir, bill_open_check_t check, uint64_t window, double *best_s,
                     bill_ledger_stats_t *st)
{
    *best_s = 1e30;
    for (int k = 0; k < 3; k++) {
        bill_ledger_params_t lp = bill_ledger_params_default();
        lp.dir = dir;
        lp.fsync = BILL_FSYNC_OFF;
        lp.open_check = check;
        lp.dedup_window = window;
        bill_ledger_t *l;
        char err[256];
        double a = bench_now_s();
        if (bill_ledger_open(&lp, &l, err, sizeof err) != 0) {
            fprintf(stderr, "kvgw bench ledger: open: %s\n", err);
            return 1;
        }
        double b = bench_now_s() - a;
        bill_ledger_stats(l, st);
        if (bill_ledger_close(l) != 0)
            return 1;
        if (b < *best_s)
            *best_s = b;
    }
    return 0;
}

/* Opens the ledger lp describes for writing; NULL with the reason on stderr. */
static bill_ledger_t *open_ledger(const bill_ledger_params_t *lp)
{
    bill_ledger_t *l;
    char err[256];
    if (bill_ledger_open(lp, &l, err, sizeof err) != 0) {
        fprintf(stderr, "kvgw bench ledger: %s\n", err);
        return NULL;
    }
    return l;
}

/* Reports the open of dir in mode check with duplicate window `window`. */
static int open_figure(const char *dir, bill_open_check_t check, uint64_t window, const char *key,
                       bench_report_t *r, double *t_out)
{
    bill_ledger_stats_t st;
    if (time_open(dir, check, window, t_out, &st) != 0)
        return 1;
    char note[160];
    snprintf(note, sizeof note,
             "%s, window %" PRIu64 ": %" PRIu64 " of %" PRIu64 " segments read, %.0f MiB",
             bill_open_check_name(check), window, st.open_segments_read,
             st.open_segments_read + st.open_segments_skipped,
             (double)st.open_bytes_read / 1048576.0);
    bench_report_add(r, key, *t_out * 1e3, note);
    return 0;
}

static int export_phase(const char *base, uint64_t days, uint64_t per_day, uint64_t seg_mib,
                        uint64_t open_window, bench_report_t *r)
{
    char dir[600], cmd[700];
    snprintf(dir, sizeof dir, "%s.export", base);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        return 1;
    bill_ledger_params_t lp = bill_ledger_params_default();
    lp.dir = dir;
    lp.fsync = BILL_FSYNC_OFF; /* building the data set, not measuring the disk */
    lp.segment_bytes = seg_mib << 20;
    bill_ledger_t *l = open_ledger(&lp);
    if (l == NULL)
        return 1;
    bill_idgen_t ids;
    bill_idgen_init(&ids);
    uint64_t t0 = 1735689600000ull; /* 2025-01-01 */
    uint64_t rng = 0x9e3779b97f4a7c15ull, seq = 0;
    bill_event_t ev;
    double b0 = bench_now_s();
    for (uint64_t d = 0; d < days; d++) {
        for (uint64_t j = 0; j < per_day; j++) {
            make_event(&ev, &ids, d * per_day + j);
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            uint64_t t = t0 + d * DAY_MS + j * (DAY_MS / per_day);
            if (rng % 10 == 0) /* late: from another instance or a long request */
                t = t > (rng >> 8) % 3600000 ? t - (rng >> 8) % 3600000 : t;
            ev.start_ms = t;
            ev.end_ms = t + 120;
            int rc;
            while ((rc = bill_ledger_append(l, &ev, &seq)) == PC_ERR_OVERLOADED)
                usleep(100);
            if (rc != 0) {
                fprintf(stderr, "kvgw bench ledger: append failed: %s\n", pc_strerror(rc));
                bill_ledger_close(l);
                return 1;
            }
        }
        /* Let the writer keep up so that segments rotate near their size. */
        if (bill_ledger_wait_durable(l, seq) != 0)
            break;
    }
    bill_ledger_stats_t st;
    bill_ledger_stats(l, &st);
    int rc = bill_ledger_close(l);
    double build_s = bench_now_s() - b0;
    if (rc != 0) {
        fprintf(stderr, "kvgw bench ledger: ledger failed: %s\n", pc_strerror(rc));
        return 1;
    }
    /* Restart: open (the recovery) reading every segment, then by the index with the default
     * duplicate window and with the --open-window one. */
    double o_full, o_idx, o_small;
    uint64_t def_window = bill_ledger_params_default().dedup_window;
    if (open_figure(dir, BILL_OPEN_CHECK_FULL, def_window, "open_ms_full_check", r, &o_full) != 0 ||
        open_figure(dir, BILL_OPEN_CHECK_INDEX, def_window, "open_ms_indexed", r, &o_idx) != 0 ||
        open_figure(dir, BILL_OPEN_CHECK_INDEX, open_window, "open_ms_indexed_small_window", r,
                    &o_small) != 0) {
        if (system(cmd) != 0)
            fprintf(stderr, "kvgw bench ledger: could not remove %s\n", dir);
        return 1;
    }
    bench_report_add(r, "open_speedup", o_full / o_idx, "full check / indexed, default window");
    uint64_t from = t0 + (days / 2) * DAY_MS, to = from + DAY_MS;
    double t_idx, t_all;
    uint64_t bytes_idx, bytes_all, read_idx, skip_idx, read_all, skip_all;
    rc = time_export(dir, from, to, false, &t_idx, &bytes_idx, &read_idx, &skip_idx);
    if (rc == 0)
        rc = time_export(dir, from, to, true, &t_all, &bytes_all, &read_all, &skip_all);
    if (system(cmd) != 0)
        fprintf(stderr, "kvgw bench ledger: could not remove %s\n", dir);
    if (rc != 0)
        return 1;
    if (bytes_idx != bytes_all) {
        fprintf(stderr,
                "kvgw bench ledger: the indexed export wrote %" PRIu64
                " bytes, the full scan %" PRIu64 "\n",
                bytes_idx, bytes_all);
        return 1;
    }
    char note[96];
    snprintf(note, sizeof note,
             "%" PRIu64 " days x %" PRIu64 " events, %" PRIu64 " segments of %" PRIu64 " MiB", days,
             per_day, st.n_segments, seg_mib);
    bench_report_add(r, "export_ledger_mib", (double)st.bytes_written / 1048576.0, note);
    bench_report_add(r, "export_ledger_build_s", build_s, "fsync=off, sidecars at each rotation");
    snprintf(note, sizeof note, "one-day CSV, %" PRIu64 " of %" PRIu64 " segments read", read_idx,
             read_idx + skip_idx);
    bench_report_add(r, "export_day_ms_indexed", t_idx * 1e3, note);
    snprintf(note, sizeof note, "same export, all %" PRIu64 " segments read", read_all);
    bench_report_add(r, "export_day_ms_full_scan", t_all * 1e3, note);
    bench_report_add(r, "export_day_speedup", t_all / t_idx, "full scan / indexed, warm cache");
    bench_report_add(r, "export_day_output_kib", (double)bytes_idx / 1024.0,
                     "identical with and without the index");
    return 0;
}

int bench_ledger_main(int argc, char **argv)
{
    char dir[512];
    snprintf(dir, sizeof dir, "/tmp/kvgw_bench_ledger.%d", (int)getpid());
    uint64_t n_events = 200000, rate = 5000, x_days = 60, x_per_day = 10000, x_seg_mib = 4;
    uint64_t open_window = 65536;
    int mode = BILL_FSYNC_BATCH;
    uint32_t window_us = 500;
    for (int i = 1; i < argc; i += 2) { /* --option value */
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (v == NULL) {
            usage(stderr);
            return 2;
        }
        if (strcmp(argv[i], "--dir") == 0)
            snprintf(dir, sizeof dir, "%s", v);
        else if (strcmp(argv[i], "--events") == 0)
            n_events = strtoull(v, NULL, 10);
        else if (strcmp(argv[i], "--rate") == 0)
            rate = strtoull(v, NULL, 10);
        else if (strcmp(argv[i], "--window-us") == 0)
            window_us = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(argv[i], "--export-days") == 0)
            x_days = strtoull(v, NULL, 10);
        else if (strcmp(argv[i], "--events-per-day") == 0)
            x_per_day = strtoull(v, NULL, 10);
        else if (strcmp(argv[i], "--segment-mib") == 0)
            x_seg_mib = strtoull(v, NULL, 10);
        else if (strcmp(argv[i], "--open-window") == 0)
            open_window = strtoull(v, NULL, 10);
        else if (strcmp(argv[i], "--fsync") == 0 && (mode = bill_fsync_parse(v)) >= 0)
            ;
        else {
            usage(stderr);
            return 2;
        }
    }
    if (n_events == 0 || rate == 0 || x_per_day == 0 || x_per_day > DAY_MS || x_seg_mib == 0 ||
        x_seg_mib > 4096 || open_window == 0) {
        usage(stderr);
        return 2;
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        return 1;
    bill_ledger_params_t lp = bill_ledger_params_default();
    lp.dir = dir;
    lp.fsync = (bill_fsync_t)mode;
    lp.batch_window_us = window_us;
    bill_ledger_t *l = open_ledger(&lp);
    if (l == NULL)
        return 1;
    bill_idgen_t ids;
    bill_idgen_init(&ids);
    printf("ledger benchmark: dir %s, fsync=%s, batch window %u us\n", dir, bill_fsync_name(mode),
           window_us);

    /* Phase 1: throughput. */
    bill_event_t ev;
    double t0 = bench_now_s(), c0 = bench_cpu_s();
    uint64_t seq = 0, retries = 0;
    for (uint64_t i = 0; i < n_events; i++) {
        make_event(&ev, &ids, i);
        int rc;
        while ((rc = bill_ledger_append(l, &ev, &seq)) == PC_ERR_OVERLOADED) {
            retries++;
            usleep(100);
        }
        if (rc != 0) {
            fprintf(stderr, "kvgw bench ledger: append failed: %s\n", pc_strerror(rc));
            bill_ledger_close(l);
            return 1;
        }
    }
    double t_appended = bench_now_s();
    int rc = bill_ledger_wait_durable(l, seq);
    double t1 = bench_now_s(), c1 = bench_cpu_s();
    if (rc != 0) {
        fprintf(stderr, "kvgw bench ledger: ledger failed: %s\n", pc_strerror(rc));
        bill_ledger_close(l);
        return 1;
    }
    bill_ledger_stats_t st0;
    bill_ledger_stats(l, &st0);
    double eps = (double)n_events / (t1 - t0);
    double append_ns = (t_appended - t0) * 1e9 / (double)n_events;

    /* Phase 2: latency at a steady rate. */
    uint64_t n_lat = rate * 3; /* three seconds */
    lat_t w = {.l = l, .n = n_lat};
    w.t_append = calloc(n_lat, sizeof *w.t_append);
    w.t_durable = calloc(n_lat, sizeof *w.t_durable);
    w.base = seq;
    atomic_store(&w.appended, seq);
    pthread_t th;
    uint64_t *lat_ns = calloc(n_lat, sizeof *lat_ns);
    if (w.t_append == NULL || w.t_durable == NULL || lat_ns == NULL ||
        pthread_create(&th, NULL, waiter_main, &w) != 0) {
        bill_ledger_close(l);
        return 1;
    }
    uint64_t start = pc_time_mono_ns(), period = 1000000000u / rate;
    for (uint64_t i = 0; i < n_lat; i++) {
        uint64_t due = start + i * period;
        while (pc_time_mono_ns() < due) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
        make_event(&ev, &ids, n_events + i);
        w.t_append[i] = pc_time_mono_ns();
        if (bill_ledger_append(l, &ev, &seq) != 0)
            break;
        atomic_store(&w.appended, seq);
    }
    atomic_store(&w.done, true);
    pthread_join(th, NULL);
    size_t n_ok = 0;
    for (uint64_t i = 0; i < n_lat; i++)
        if (w.t_durable[i] >= w.t_append[i] && w.t_append[i] != 0)
            lat_ns[n_ok++] = w.t_durable[i] - w.t_append[i];
    qsort(lat_ns, n_ok, sizeof *lat_ns, cmp_u64);
    double p50 = n_ok ? (double)lat_ns[n_ok / 2] / 1e6 : -1;
    double p99 = n_ok ? (double)lat_ns[(size_t)((double)n_ok * 0.99)] / 1e6 : -1;
    double pmax = n_ok ? (double)lat_ns[n_ok - 1] / 1e6 : -1;
    bill_ledger_stats_t st;
    bill_ledger_stats(l, &st);
    bill_ledger_close(l);
    if (system(cmd) != 0)
        fprintf(stderr, "kvgw bench ledger: could not remove %s\n", dir);

    bench_report_t r;
    bench_report_init(&r, "ledger");
    bench_report_add(&r, "events_per_s_durable", eps, "append -> durable, one appender");
    bench_report_add(&r, "append_ns_per_event", append_ns, "loop-side cost of one append");
    bench_report_add(&r, "events_per_sync",
                     st0.n_syncs ? (double)n_events / (double)st0.n_syncs : 0,
                     "group commit batch size (phase 1)");
    bench_report_add(&r, "bytes_per_event", (double)st0.bytes_written / (double)n_events, NULL);
    bench_report_add(&r, "cpu_share", (c1 - c0) / (t1 - t0), "process CPU / wall (phase 1)");
    bench_report_add(&r, "latency_rate_per_s", (double)rate, "phase 2 steady append rate");
    bench_report_add(&r, "added_latency_ms_p50", p50, "append -> durable");
    bench_report_add(&r, "added_latency_ms_p99", p99, "target < 2 ms");
    bench_report_add(&r, "added_latency_ms_max", pmax, NULL);
    bench_report_add(&r, "overloaded_retries", (double)retries, "appends refused: pending full");
    int xrc = x_days > 0 ? export_phase(dir, x_days, x_per_day, x_seg_mib, open_window, &r) : 0;
    bench_report_print(&r);
    free(lat_ns);
    free(w.t_append);
    free(w.t_durable);
    return xrc != 0 ? 1 : 0;
}
