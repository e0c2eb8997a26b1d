/*
 * test_ledger_index.c — the ledger's per-segment time index (ledger.h, "Time index"): exports
 * that use it are byte-identical to exports that read every segment, over many random ranges of
 * a multi-segment ledger whose event times are out of order; the writer's sidecars equal what a
 * full scan of their segment computes; missing, corrupt, stale and narrower-than-the-data
 * sidecars never drop an event and get rebuilt; and a crash or an I/O failure at every step of
 * writing a sidecar leaves no sidecar or a correct one (forked children killed at each step
 * through the ledger's I/O hooks).
 */
#include "common.h"
#include "ledger.h"
#include "pc_test.h"
#include "pc_testutil.h"
#include "ledger_testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DAY_MS 86400000ull
#define T0 1750000000000ull /* 2025-06-15 */

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Event i of a ledger spanning n_days: its time runs forward with i, but one event in 5 is late
 * (written up to 3 days after it started, as from another instance or a slow request) and one in
 * 50 is from the future by up to a day (a skewed clock): times are out of order within and
 * across segments. */
static void make_event(bill_event_t *ev, uint64_t i, uint64_t n, uint64_t n_days)
{
    bill_event_init(ev, i % 7 == 3 ? BILL_EVENT_STORAGE : BILL_EVENT_USAGE);
    snprintf(ev->event_id, BILL_STR_MAX, "ev-%" PRIu64, i);
    snprintf(ev->request_id, BILL_STR_MAX, "req-%" PRIu64, i);
    bill_event_set_str(ev->tenant, i % 3 ? "acme" : "globex");
    bill_event_set_str(ev->api_key_id, "key-1");
    bill_event_set_str(ev->model, i % 2 ? "kvgw-demo" : "kvgw-big");
    uint64_t t = T0 + i * (n_days * DAY_MS / n) + rnd() % 60000;
    uint64_t r = rnd() % 100;
    if (r < 20)
        t -= rnd() % (3 * DAY_MS);
    else if (r < 22)
        t += rnd() % DAY_MS;
    ev->start_ms = t;
    ev->end_ms = t + 250;
    if (ev->kind == BILL_EVENT_STORAGE) {
        bill_event_set_str(ev->ns, "00ff00ff");
        ev->token_ms = 1000 + i;
        ev->cost_nusd[BILL_BUCKET_STORAGE] = 7 + i;
    } else {
        ev->usage = (bill_usage_t){.n_uncached = 10 + i, .n_read = i, .n_output = 5};
        ev->n_hit_logical = i;
        ev->cost_nusd[BILL_BUCKET_UNCACHED] = 3000 * (10 + i);
        ev->cost_nusd[BILL_BUCKET_READ] = 300 * i;
        ev->cost_nusd[BILL_BUCKET_OUTPUT] = 75000;
    }
}

static bill_ledger_t *open_ledger(const char *dir, const bill_ledger_io_t *io)
{
    bill_ledger_params_t p = bill_ledger_params_default();
    p.dir = dir;
    p.fsync = BILL_FSYNC_OFF;
    p.segment_bytes = 4096;
    p.io = io;
    bill_ledger_t *l = NULL;
    char err[256] = "";
    int rc = bill_ledger_open(&p, &l, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  open %s: %s (%s)\n", dir, err, pc_strerror(rc));
    return l;
}

/* Appends events first .. first+n-1 of a ledger of `total` events over n_days, waiting for the
 * disk every 4 events so that segments rotate at about segment_bytes (about 25 events each). */
static int append_events(bill_ledger_t *l, uint64_t first, uint64_t n, uint64_t total,
                         uint64_t n_days)
{
    bill_event_t ev;
    uint64_t seq = 0;
    for (uint64_t i = first; i < first + n; i++) {
        make_event(&ev, i, total, n_days);
        int rc = bill_ledger_append(l, &ev, &seq);
        if (rc != 0)
            return rc;
        if (i % 4 == 3 && (rc = bill_ledger_wait_durable(l, seq)) != 0)
            return rc;
    }
    return seq ? bill_ledger_wait_durable(l, seq) : 0;
}

/* The first seqs of the ledger's segments, ascending (at most max). */
static size_t segments(const char *dir, uint64_t *out, size_t max)
{
    DIR *d = opendir(dir);
    size_t n = 0;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        uint64_t s;
        char tail[8];
        if (sscanf(e->d_name, "ledger-%20" SCNu64 ".%4s", &s, tail) == 2 &&
            strcmp(tail, "seg") == 0 && n < max)
            out[n++] = s;
    }
    if (d != NULL)
        closedir(d);
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && out[j - 1] > out[j]; j--) {
            uint64_t t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    return n;
}

/* Directory entries whose name contains sub. */
static int count_entries(const char *dir, const char *sub)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL)
        n += strstr(e->d_name, sub) != NULL;
    if (d != NULL)
        closedir(d);
    return n;
}

static int on_chunk(void *ud, const char *data, size_t len)
{
    return pc_buf_append(ud, data, len);
}

typedef struct xres {
    pc_buf_t out;
    uint64_t n_read, n_skipped;
    int rc;
} xres_t;

static void export_range(const char *dir, uint64_t from, uint64_t to, int format, int group,
                         bool scan_all, xres_t *r)
{
    memset(r, 0, sizeof *r);
    bill_export_params_t xp = bill_export_params_default();
    xp.from_ms = from;
    xp.to_ms = to;
    xp.format = format;
    xp.group = group;
    xp.scan_all = scan_all;
    xp.chunk = on_chunk;
    xp.ud = &r->out;
    xp.chunk_bytes = 1000;
    char err[256] = "";
    bill_export_t *x;
    r->rc = bill_export_open(dir, &xp, &x, err, sizeof err);
    if (r->rc != 0)
        return;
    while ((r->rc = bill_export_step(x, 97, err, sizeof err)) == 0)
        ;
    bill_export_segments(x, &r->n_read, &r->n_skipped);
    bill_export_free(x);
    if (r->rc != 1)
        fprintf(stderr, "  export: %s\n", err);
    pc_buf_terminate(&r->out);
}

/* Exports [from, to) with the index and without it; the outputs must be byte-identical.
 * *n_read and *n_skipped (may be NULL): the segments the indexed export read and skipped. */
static void same_export(const char *dir, uint64_t from, uint64_t to, int format, int group,
                        uint64_t *n_read, uint64_t *n_skipped)
{
    xres_t a, b;
    export_range(dir, from, to, format, group, false, &a);
    export_range(dir, from, to, format, group, true, &b);
    ASSERT_EQ(a.rc, 1);
    ASSERT_EQ(b.rc, 1);
    ASSERT_EQ_U64(b.n_skipped, 0);
    if (a.out.len != b.out.len || memcmp(a.out.base, b.out.base, a.out.len) != 0) {
        fprintf(stderr,
                "  range [%" PRIu64 ", %" PRIu64 ") format %d group %d: %zu bytes with "
                "the index, %zu without\n",
                from, to, format, group, a.out.len, b.out.len);
        ASSERT_TRUE(!"indexed export differs");
    }
    if (n_read != NULL)
        *n_read = a.n_read;
    if (n_skipped != NULL)
        *n_skipped = a.n_skipped;
    pc_buf_free(&a.out);
    pc_buf_free(&b.out);
}

/* The number of events with start_ms in [from, to), by reading every record. */
static uint64_t count_in_range(const char *dir, uint64_t from, uint64_t to)
{
    bill_ledger_reader_t *r;
    if (bill_ledger_reader_open(dir, 1, &r, NULL, 0) != 0)
        return UINT64_MAX;
    bill_event_t ev;
    uint64_t seq, n = 0;
    while (bill_ledger_reader_next(r, &ev, &seq, NULL, 0) == 0)
        n += ev.start_ms >= from && ev.start_ms < to;
    bill_ledger_reader_free(r);
    return n;
}

/* Every sealed segment has a sidecar equal to what a full scan of it computes; the last (open)
 * segment has none. */
static void check_sidecars(const char *dir, bool all_present)
{
    uint64_t segs[4096];
    size_t n = segments(dir, segs, 4096);
    ASSERT_TRUE(n > 1);
    for (size_t i = 0; i < n; i++) {
        bill_ledger_index_t disk, scan;
        int rc = bill_ledger_index_load(dir, segs[i], &disk);
        if (i + 1 == n) {
            ASSERT_EQ(rc, PC_ERR_NOTFOUND);
            continue;
        }
        if (!all_present && rc == PC_ERR_NOTFOUND)
            continue;
        ASSERT_EQ(rc, 0);
        char err[256] = "";
        ASSERT_EQ(bill_ledger_index_scan(dir, segs[i], &scan, err, sizeof err), 0);
        ASSERT_EQ_U64(disk.seg_bytes, scan.seg_bytes);
        ASSERT_EQ_U64(disk.first_seq, segs[i]);
        ASSERT_EQ_U64(disk.n_records, segs[i + 1] - segs[i]);
        ASSERT_EQ_U64(disk.n_records, scan.n_records);
        ASSERT_EQ_U64(disk.min_start_ms, scan.min_start_ms);
        ASSERT_EQ_U64(disk.max_start_ms, scan.max_start_ms);
        ASSERT_EQ_U64(disk.last_off, scan.last_off);
        ASSERT_EQ_U64(disk.last_crc, scan.last_crc);
        ASSERT_EQ_U64(disk.seg_crc, scan.seg_crc);
        struct stat sb;
        char path[600];
        snprintf(path, sizeof path, "%s/ledger-%020" PRIu64 ".seg", dir, segs[i]);
        ASSERT_EQ(stat(path, &sb), 0);
        ASSERT_EQ_U64((uint64_t)sb.st_size, disk.seg_bytes);
    }
}

#define N_EVENTS 3000
#define N_DAYS 30

static const char *build_ledger(const char *name)
{
    const char *dir = fresh_dir(name);
    rng_state = 88172645463325252ull;
    bill_ledger_t *l = open_ledger(dir, NULL);
    if (l == NULL)
        return NULL;
    int rc = append_events(l, 0, N_EVENTS, N_EVENTS, N_DAYS);
    if (bill_ledger_close(l) != 0 || rc != 0)
        return NULL;
    return dir;
}

PC_TEST(writer_sidecars_equal_a_full_scan)
{
    const char *dir = fresh_dir("w");
    rng_state = 1;
    bill_ledger_t *l = open_ledger(dir, NULL);
    ASSERT_TRUE(l != NULL);
    ASSERT_EQ(append_events(l, 0, 1000, 1000, 10), 0);
    ASSERT_EQ(bill_ledger_close(l), 0);
    /* Closed, not reopened: these are the sidecars the writer wrote at each rotation (close
     * writes none, and only the recovery at open or an export rewrites them). */
    PC_TEST_CALL(check_sidecars(dir, true));
    uint64_t segs[4096];
    size_t n = segments(dir, segs, 4096);
    printf("  %zu segments, %d sidecars\n", n, count_entries(dir, ".idx"));
    ASSERT_EQ(count_entries(dir, ".idx"), (int)n - 1);
    ASSERT_EQ(count_entries(dir, ".tmp"), 0);
    /* Reopened and appended to: the open segment still has none, the new sealed ones do. */
    l = open_ledger(dir, NULL);
    ASSERT_TRUE(l != NULL);
    ASSERT_EQ(append_events(l, 1000, 300, 1300, 13), 0);
    ASSERT_EQ(bill_ledger_close(l), 0);
    PC_TEST_CALL(check_sidecars(dir, true));
}

PC_TEST(random_ranges_are_byte_identical)
{
    const char *dir = build_ledger("r");
    ASSERT_TRUE(dir != NULL);
    PC_TEST_CALL(check_sidecars(dir, true));
    uint64_t segs[4096];
    size_t n_segs = segments(dir, segs, 4096);
    uint64_t span = (N_DAYS + 2) * DAY_MS, skipped = 0, read = 0, n_ranges = 0;
    int rounds = (int)(300 * pc_test_scale());
    for (int k = 0; k < rounds; k++) {
        uint64_t from, to;
        switch (k % 5) {
        case 0: /* a UTC day */
            from = (T0 / DAY_MS + rnd() % (N_DAYS + 2)) * DAY_MS - 3 * DAY_MS;
            to = from + DAY_MS;
            break;
        case 1: /* anything, maybe empty */
            from = T0 - 4 * DAY_MS + rnd() % span;
            to = from + rnd() % (rnd() % 4 == 0 ? 1 : span / 4);
            break;
        case 2: /* an hour */
            from = T0 + rnd() % span;
            to = from + 3600000;
            break;
        case 3: /* open-ended */
            from = rnd() % 2 ? 0 : T0 + rnd() % span;
            to = rnd() % 2 ? UINT64_MAX : T0 + rnd() % span;
            if (from > to)
                from = to;
            break;
        default: /* outside the ledger, or everything */
            from = rnd() % 2 ? T0 + 40 * DAY_MS : 0;
            to = from == 0 ? (rnd() % 2 ? T0 - 5 * DAY_MS : UINT64_MAX) : UINT64_MAX;
            break;
        }
        uint64_t nr, ns;
        PC_TEST_CALL(same_export(dir, from, to, (int)(rnd() % 3), (int)(rnd() % 2), &nr, &ns));
        read += nr;
        skipped += ns;
        n_ranges++;
        if (k % 25 == 0) { /* the export's rows are the events in the range, no more, no less */
            xres_t a;
            export_range(dir, from, to, BILL_EXPORT_JSONL, BILL_GROUP_NONE, false, &a);
            uint64_t lines = 0;
            for (size_t i = 0; i < a.out.len; i++)
                lines += a.out.base[i] == '\n';
            ASSERT_EQ_U64(lines, count_in_range(dir, from, to));
            pc_buf_free(&a.out);
        }
    }
    printf("  %zu segments; %" PRIu64 " ranges read %.1f segments and skipped %.1f on average\n",
           n_segs, n_ranges, (double)read / (double)n_ranges, (double)skipped / (double)n_ranges);
    ASSERT_TRUE(skipped > n_ranges * (n_segs / 2)); /* the index does skip */
    /* A one-day export reads a few segments of the many. */
    uint64_t nr, sk;
    PC_TEST_CALL(same_export(dir, T0 + 10 * DAY_MS, T0 + 11 * DAY_MS, BILL_EXPORT_CSV,
                             BILL_GROUP_NONE, &nr, &sk));
    printf("  one day: read %" PRIu64 ", skipped %" PRIu64 " of %zu\n", nr, sk, n_segs);
    ASSERT_TRUE(nr < n_segs / 4);
}

PC_TEST(live_ledger_open_segment_always_read)
{
    const char *dir = fresh_dir("live");
    rng_state = 7;
    bill_ledger_t *l = open_ledger(dir, NULL);
    ASSERT_TRUE(l != NULL);
    ASSERT_EQ(append_events(l, 0, 600, 1000, 10), 0);
    /* Events in the open segment far outside any sealed segment's range. */
    bill_event_t ev;
    uint64_t seq;
    make_event(&ev, 5000, 1000, 10);
    ev.start_ms = T0 + 500 * DAY_MS;
    ev.end_ms = ev.start_ms + 250;
    ASSERT_EQ(bill_ledger_append(l, &ev, &seq), 0);
    ASSERT_EQ(bill_ledger_wait_durable(l, seq), 0);
    for (int k = 0; k < 40; k++) {
        uint64_t from = T0 + rnd() % (12 * DAY_MS), to = from + rnd() % (3 * DAY_MS);
        PC_TEST_CALL(same_export(dir, from, to, BILL_EXPORT_CSV, (int)(rnd() % 2), NULL, NULL));
    }
    xres_t a;
    export_range(dir, T0 + 500 * DAY_MS, T0 + 501 * DAY_MS, BILL_EXPORT_JSONL, BILL_GROUP_NONE,
                 false, &a);
    ASSERT_TRUE(strstr(a.out.base, "\"ev-5000\"") != NULL);
    /* Only the open segment, or also the one sealed by the batch that held ev-5000. */
    ASSERT_TRUE(a.n_read <= 2);
    pc_buf_free(&a.out);
    ASSERT_EQ(bill_ledger_close(l), 0);
}

typedef struct appender {
    bill_ledger_t *l;
    atomic_bool stop;
    _Atomic uint64_t n; /* events appended so far */
} appender_t;

/* Appends events of a far-away day (outside every range the test exports), rotating segments. */
static void *append_main(void *arg)
{
    appender_t *a = arg;
    bill_event_t ev;
    uint64_t seq;
    for (uint64_t i = 100000; !atomic_load(&a->stop); i++) {
        make_event(&ev, i, 1, 1);
        ev.start_ms = T0 + 1000 * DAY_MS + i;
        ev.end_ms = ev.start_ms + 1;
        if (bill_ledger_append(a->l, &ev, &seq) != 0 || bill_ledger_wait_durable(a->l, seq) != 0)
            break;
        a->n++;
    }
    return NULL;
}

PC_TEST(exports_while_the_writer_rotates)
{
    /* The writer seals segments (and writes their sidecars) while ranged exports read: each
     * export must still hold exactly the events of its range, all written before it started. */
    const char *dir = fresh_dir("conc");
    rng_state = 11;
    bill_ledger_t *l = open_ledger(dir, NULL);
    ASSERT_TRUE(l != NULL);
    ASSERT_EQ(append_events(l, 0, 1500, 1500, 15), 0);
    uint64_t from[8], to[8];
    xres_t ref[8];
    for (int k = 0; k < 8; k++) {
        from[k] = T0 + (uint64_t)k * 2 * DAY_MS + rnd() % DAY_MS;
        to[k] = from[k] + DAY_MS / 2 + rnd() % DAY_MS;
        export_range(dir, from[k], to[k], BILL_EXPORT_CSV, BILL_GROUP_NONE, true, &ref[k]);
        ASSERT_EQ(ref[k].rc, 1);
    }
    appender_t a = {.l = l};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, append_main, &a), 0);
    /* At least `rounds` exports, and on until the appender has rotated through some segments
     * (a scaled-down run is otherwise over before it appended anything). */
    int rounds = (int)(40 * pc_test_scale()), n_exports;
    for (n_exports = 0; n_exports < rounds || (atomic_load(&a.n) <= 100 && n_exports < 100000);
         n_exports++) {
        int k = n_exports;
        xres_t x;
        export_range(dir, from[k % 8], to[k % 8], BILL_EXPORT_CSV, BILL_GROUP_NONE, false, &x);
        bool same = x.rc == 1 && x.out.len == ref[k % 8].out.len &&
                    memcmp(x.out.base, ref[k % 8].out.base, x.out.len) == 0;
        pc_buf_free(&x.out);
        if (!same) {
            atomic_store(&a.stop, true);
            pthread_join(th, NULL);
            bill_ledger_close(l);
            ASSERT_TRUE(!"an export during rotations differs");
        }
    }
    atomic_store(&a.stop, true);
    pthread_join(th, NULL);
    uint64_t n_appended = atomic_load(&a.n);
    printf("  %d exports while %" PRIu64 " events were appended\n", n_exports, n_appended);
    ASSERT_TRUE(n_appended > 100);
    for (int k = 0; k < 8; k++)
        pc_buf_free(&ref[k].out);
    ASSERT_EQ(bill_ledger_close(l), 0);
    PC_TEST_CALL(check_sidecars(dir, true));
}

PC_TEST(reader_range_arguments)
{
    const char *dir = build_ledger("args");
    ASSERT_TRUE(dir != NULL);
    bill_ledger_reader_t *r;
    ASSERT_EQ(bill_ledger_reader_open(dir, 1, &r, NULL, 0), 0);
    ASSERT_EQ(bill_ledger_reader_set_time_range(r, 10, 9), PC_ERR_INVAL);
    ASSERT_EQ(bill_ledger_reader_set_time_range(r, 10, 10), 0);
    bill_event_t ev;
    uint64_t seq;
    /* An empty range still reads the open segment; it returns its records, the caller filters. */
    int rc;
    while ((rc = bill_ledger_reader_next(r, &ev, &seq, NULL, 0)) == 0)
        ;
    ASSERT_EQ(rc, 1);
    ASSERT_EQ(bill_ledger_reader_set_time_range(r, 0, 10), PC_ERR_INVAL); /* after next */
    bill_ledger_reader_stats_t st;
    bill_ledger_reader_stats(r, &st);
    ASSERT_EQ_U64(st.n_segments_read, 1);
    ASSERT_TRUE(st.n_segments_skipped > 10);
    bill_ledger_reader_free(r);
    /* A reader from a seq in the middle, with a range, still returns only seqs >= from_seq. */
    ASSERT_EQ(bill_ledger_reader_open(dir, 1500, &r, NULL, 0), 0);
    ASSERT_EQ(bill_ledger_reader_set_time_range(r, 0, UINT64_MAX), 0);
    uint64_t want = 1500;
    while ((rc = bill_ledger_reader_next(r, &ev, &seq, NULL, 0)) == 0)
        ASSERT_EQ_U64(seq, want++);
    ASSERT_EQ(rc, 1);
    ASSERT_EQ_U64(want, N_EVENTS + 1);
    bill_ledger_reader_free(r);
}

PC_TEST(missing_sidecars_are_rebuilt_by_exports)
{
    const char *dir = build_ledger("miss");
    ASSERT_TRUE(dir != NULL);
    uint64_t segs[4096];
    size_t n = segments(dir, segs, 4096);
    char path[600];
    for (size_t i = 0; i < n; i++) {
        seg_path(path, sizeof path, dir, segs[i], "idx");
        (void)unlink(path);
    }
    ASSERT_EQ(count_entries(dir, ".idx"), 0);
    /* Without sidecars every segment is read; the output is the same. */
    uint64_t nr, ns;
    PC_TEST_CALL(same_export(dir, T0 + 3 * DAY_MS, T0 + 4 * DAY_MS, BILL_EXPORT_CSV, BILL_GROUP_DAY,
                             &nr, &ns));
    ASSERT_EQ_U64(ns, 0);
    ASSERT_EQ_U64(nr, n);
    /* That export wrote them back: correct, and the next export skips. */
    PC_TEST_CALL(check_sidecars(dir, true));
    ASSERT_EQ(count_entries(dir, ".tmp"), 0);
    PC_TEST_CALL(same_export(dir, T0 + 3 * DAY_MS, T0 + 4 * DAY_MS, BILL_EXPORT_CSV, BILL_GROUP_DAY,
                             NULL, &ns));
    ASSERT_TRUE(ns > n / 2);
    /* The recovery at open writes them too. */
    for (size_t i = 0; i < n; i++) {
        seg_path(path, sizeof path, dir, segs[i], "idx");
        (void)unlink(path);
    }
    bill_ledger_t *l = open_ledger(dir, NULL);
    ASSERT_TRUE(l != NULL);
    PC_TEST_CALL(check_sidecars(dir, true));
    ASSERT_EQ(bill_ledger_close(l), 0);
}

/* The day (UTC) after the one of ms. */
static uint64_t next_day(uint64_t ms)
{
    return (ms / DAY_MS + 1) * DAY_MS;
}

/* Replaces the sidecar of a middle segment by a wrong one that claims its events all start in a
 * day far from the data; then the export of the day its events really start in must still hold
 * every one of them, equal to the full scan, and the sidecar must come back right. */
static void narrow_case(const char *dir, int how)
{
    uint64_t segs[4096];
    size_t n = segments(dir, segs, 4096);
    ASSERT_TRUE(n > 10);
    uint64_t s = segs[n / 2];
    bill_ledger_index_t ix, real;
    ASSERT_EQ(bill_ledger_index_scan(dir, s, &real, NULL, 0), 0);
    ix = real;
    ix.min_start_ms = ix.max_start_ms = T0 + 400 * DAY_MS; /* narrower, and elsewhere */
    switch (how) {
    case 0: /* a stale sidecar: written when the segment was shorter */
        ix.seg_bytes -= 100;
        break;
    case 1: /* one bit flipped: its own CRC fails */
        break;
    case 2: /* a sidecar of another segment's length and tail, renamed over this one */
        ix.last_off -= 8;
        break;
    case 3: /* a record count that the next segment's name contradicts */
        ix.n_records += 1;
        break;
    default: /* the right length but another last record (a segment replaced by other data) */
        ix.last_crc ^= 0x10;
        break;
    }
    ASSERT_EQ(write_sidecar(dir, &ix, how != 1), 0);
    if (how == 1)
        ASSERT_EQ(bill_ledger_index_load(dir, s, &ix), PC_ERR_FORMAT);
    /* Every day that the segment's events start in. */
    for (uint64_t d = real.min_start_ms / DAY_MS * DAY_MS; d <= real.max_start_ms;
         d = next_day(d)) {
        uint64_t nr;
        PC_TEST_CALL(same_export(dir, d, d + DAY_MS, BILL_EXPORT_CSV, BILL_GROUP_NONE, &nr, NULL));
        ASSERT_TRUE(nr > 1);
    }
    bill_ledger_index_t disk;
    ASSERT_EQ(bill_ledger_index_load(dir, s, &disk), 0);
    ASSERT_EQ_U64(disk.min_start_ms, real.min_start_ms);
    ASSERT_EQ_U64(disk.max_start_ms, real.max_start_ms);
    ASSERT_EQ_U64(disk.seg_bytes, real.seg_bytes);
    ASSERT_EQ_U64(disk.seg_crc, real.seg_crc);
}

PC_TEST(wrong_sidecars_never_drop_events)
{
    const char *dir = build_ledger("wrong");
    ASSERT_TRUE(dir != NULL);
    for (int how = 0; how < 5; how++)
        PC_TEST_CALL(narrow_case(dir, how));
    /* Garbage, a truncated sidecar and an empty one: corrupt, read around, rewritten. */
    uint64_t segs[4096];
    size_t n = segments(dir, segs, 4096);
    const char *bodies[3] = {"garbage garbage garbage", "KVGWLIDX\1\0\0\0", ""};
    for (int k = 0; k < 3; k++) {
        char path[600];
        seg_path(path, sizeof path, dir, segs[3 + k], "idx");
        FILE *f = fopen(path, "wb");
        ASSERT_TRUE(f != NULL);
        fputs(bodies[k], f);
        fclose(f);
        bill_ledger_index_t ix;
        ASSERT_EQ(bill_ledger_index_load(dir, segs[3 + k], &ix), PC_ERR_FORMAT);
    }
    /* (A bounded range: an unbounded export does not look at the index at all.) */
    PC_TEST_CALL(same_export(dir, 1, UINT64_MAX, BILL_EXPORT_FOCUS, BILL_GROUP_NONE, NULL, NULL));
    PC_TEST_CALL(check_sidecars(dir, true));
    /* A sidecar on the open segment is never used, and the recovery removes it. */
    bill_ledger_index_t last;
    ASSERT_EQ(bill_ledger_index_scan(dir, segs[n - 1], &last, NULL, 0), 0);
    last.min_start_ms = last.max_start_ms = 1;
    ASSERT_EQ(write_sidecar(dir, &last, true), 0);
    PC_TEST_CALL(same_export(dir, T0 + 29 * DAY_MS, T0 + 30 * DAY_MS, BILL_EXPORT_CSV,
                             BILL_GROUP_NONE, NULL, NULL));
    bill_ledger_t *l = open_ledger(dir, NULL);
    ASSERT_TRUE(l != NULL);
    ASSERT_EQ(bill_ledger_close(l), 0);
    PC_TEST_CALL(check_sidecars(dir, true));
}

PC_TEST(forged_sidecar_is_fixed_by_the_recovery)
{
    /* A sidecar that is wrong yet passes every cheap check (valid CRC, the segment's length and
     * last record) cannot be told from a right one without reading the segment: only a software
     * bug or a deliberate edit makes one. An open that reads the segment (here: the default
     * duplicate window of 1 Mi records covers this whole ledger; billing.verify_on_open: full
     * reads every segment) rewrites it; an export that reads the segment rewrites it too. */
    const char *dir = build_ledger("forged");
    ASSERT_TRUE(dir != NULL);
    uint64_t segs[4096];
    size_t n = segments(dir, segs, 4096);
    bill_ledger_index_t real, ix;
    ASSERT_EQ(bill_ledger_index_scan(dir, segs[n / 2], &real, NULL, 0), 0);
    ix = real;
    ix.max_start_ms = ix.min_start_ms; /* narrower */
    ASSERT_EQ(write_sidecar(dir, &ix, true), 0);
    bill_ledger_t *l = open_ledger(dir, NULL);
    ASSERT_TRUE(l != NULL);
    ASSERT_EQ(bill_ledger_close(l), 0);
    PC_TEST_CALL(check_sidecars(dir, true));
    /* The same forgery, found by an export over a range the forged sidecar still overlaps. */
    ASSERT_EQ(write_sidecar(dir, &ix, true), 0);
    PC_TEST_CALL(
        same_export(dir, ix.min_start_ms, ix.min_start_ms + 1, BILL_EXPORT_CSV, 0, NULL, NULL));
    PC_TEST_CALL(check_sidecars(dir, true));
}

/* ---------------------------------------------------------------------------------------------
 * Crash and failure at every step of writing a sidecar. The ledger's I/O hooks see the sidecar's
 * writes and syncs (temporary file, then directory); at step k of the first sidecar the child
 * dies (_exit: a kill, nothing flushed by the process) or the call fails.
 * ------------------------------------------------------------------------------------------- */

typedef struct crashio {
    int step;     /* sidecar I/O calls so far */
    int kill_at;  /* die at this call (-1 never) */
    int fail_at;  /* fail this call (-1 never) */
    bool partial; /* at kill_at on a write: write half, then die */
} crashio_t;

/* The I/O targets a sidecar: its temporary file, or the directory (synced after the rename). */
static bool sidecar_io(int fd)
{
    char link[64], target[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0)
        return false;
    target[n] = '\0';
    struct stat sb;
    return strstr(target, ".idx.tmp") != NULL || (fstat(fd, &sb) == 0 && S_ISDIR(sb.st_mode));
}

static ssize_t crash_write(void *ud, int fd, const void *buf, size_t len)
{
    crashio_t *c = ud;
    if (sidecar_io(fd)) {
        int k = c->step++;
        if (k == c->kill_at) {
            if (c->partial)
                (void)write(fd, buf, len / 2);
            _exit(0);
        }
        if (k == c->fail_at) {
            errno = ENOSPC;
            return -1;
        }
    }
    return write(fd, buf, len);
}

static int crash_fsync(void *ud, int fd)
{
    crashio_t *c = ud;
    if (sidecar_io(fd)) {
        int k = c->step++;
        if (k == c->kill_at)
            _exit(0);
        if (k == c->fail_at) {
            errno = EIO;
            return -1;
        }
    }
    return fdatasync(fd);
}

/* After a crash or failure: no temporary file is mistaken for a sidecar, every sidecar present is
 * correct, and after the recovery every sealed segment has a correct one and exports agree. */
static void check_after(const char *dir)
{
    PC_TEST_CALL(check_sidecars(dir, false));
    bill_ledger_t *l = open_ledger(dir, NULL);
    ASSERT_TRUE(l != NULL);
    ASSERT_EQ(bill_ledger_close(l), 0);
    ASSERT_EQ(count_entries(dir, ".tmp"), 0);
    PC_TEST_CALL(check_sidecars(dir, true));
    PC_TEST_CALL(same_export(dir, T0 + DAY_MS, T0 + 2 * DAY_MS, BILL_EXPORT_CSV, 0, NULL, NULL));
}

PC_TEST(crash_at_each_step_of_sealing)
{
    /* Steps of one sidecar: 0 write of the temporary file, 1 its sync, 2 the directory's sync
     * (after the rename). Killed before each, in the middle of the write, and never. */
    struct {
        int kill_at;
        bool partial;
    } cases[] = {{0, false}, {0, true}, {1, false}, {2, false}, {-1, false}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char name[32];
        snprintf(name, sizeof name, "crash%zu", c);
        const char *dir = fresh_dir(name);
        /* A few sealed segments first, then a child seals the next one and dies doing it. */
        bill_ledger_t *l = open_ledger(dir, NULL);
        ASSERT_TRUE(l != NULL);
        rng_state = 99;
        ASSERT_EQ(append_events(l, 0, 200, 400, 4), 0);
        ASSERT_EQ(bill_ledger_close(l), 0);
        int before = count_entries(dir, ".idx");
        pid_t pid = fork();
        ASSERT_TRUE(pid >= 0);
        if (pid == 0) {
            crashio_t ci = {
                .kill_at = cases[c].kill_at, .fail_at = -1, .partial = cases[c].partial};
            bill_ledger_io_t io = {crash_write, crash_fsync, &ci};
            bill_ledger_t *cl = open_ledger(dir, &io);
            if (cl == NULL)
                _exit(3);
            int rc = append_events(cl, 200, 200, 400, 4);
            _exit(rc == 0 && bill_ledger_close(cl) == 0 ? 42 : 4);
        }
        int status;
        waitpid(pid, &status, 0);
        ASSERT_TRUE(WIFEXITED(status));
        ASSERT_EQ(WEXITSTATUS(status), cases[c].kill_at < 0 ? 42 : 0);
        int after = count_entries(dir, ".idx");
        if (cases[c].kill_at >= 0 && cases[c].kill_at < 2) /* died before the rename */
            ASSERT_EQ(after - count_entries(dir, ".idx.tmp"), before);
        else
            ASSERT_TRUE(after > before);
        PC_TEST_CALL(check_after(dir));
    }
}

PC_TEST(io_failure_at_each_step_of_sealing)
{
    for (int fail_at = 0; fail_at < 3; fail_at++) {
        char name[32];
        snprintf(name, sizeof name, "fail%d", fail_at);
        const char *dir = fresh_dir(name);
        crashio_t ci = {.kill_at = -1, .fail_at = fail_at};
        bill_ledger_io_t io = {crash_write, crash_fsync, &ci};
        rng_state = 5;
        bill_ledger_t *l = open_ledger(dir, &io);
        ASSERT_TRUE(l != NULL);
        /* The failed sidecar costs the ledger nothing: it stays healthy and appends go on. */
        ASSERT_EQ(append_events(l, 0, 300, 300, 3), 0);
        ASSERT_EQ(bill_ledger_status(l), 0);
        ASSERT_EQ(bill_ledger_close(l), 0);
        ASSERT_EQ(count_entries(dir, ".tmp"), 0); /* removed on failure */
        uint64_t segs[4096];
        size_t n = segments(dir, segs, 4096);
        ASSERT_TRUE(n > 3);
        bill_ledger_index_t ix;
        int rc = bill_ledger_index_load(dir, segs[0], &ix);
        /* A failed write or sync of the temporary file: no sidecar. A failed directory sync:
         * the sidecar is there (renamed) and right, it only may not survive a power loss. */
        ASSERT_EQ(rc, fail_at < 2 ? PC_ERR_NOTFOUND : 0);
        PC_TEST_CALL(check_sidecars(dir, false));
        PC_TEST_CALL(check_after(dir));
    }
}

PC_TEST_MAIN()
