/*
 * test_ledger.c — the usage ledger: append/durable/reopen, duplicates (also across restarts),
 * torn tails, damage, rotation and the reader across segments, disk-full and fsync failures
 * injected through the I/O hooks, a failing allocator, and the crash loop: a child appending
 * under fsync=batch is SIGKILLed at random moments many times; after each kill the ledger must
 * recover with every acknowledged-durable event present exactly once and parse to the end, and
 * every time-index sidecar left by the kill must be correct.
 */
#include "common.h"
#include "ledger.h"
#include "pc_failalloc.h"
#include "pc_test.h"
#include "pc_testutil.h"
#include "ledger_testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static bill_ledger_t *open_ledger(const char *dir, bill_fsync_t mode, uint64_t seg_bytes)
{
    bill_ledger_params_t p = bill_ledger_params_default();
    p.dir = dir;
    p.fsync = mode;
    if (seg_bytes)
        p.segment_bytes = seg_bytes;
    bill_ledger_t *l = NULL;
    char err[256] = "";
    int rc = bill_ledger_open(&p, &l, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  open %s: %s (%s)\n", dir, err, pc_strerror(rc));
    return l;
}

/* Reads every record; checks seqs are 1, 2, 3... and returns how many, or -1 on error. */
static long read_all(const char *dir, bill_event_t *evs, long max)
{
    bill_ledger_reader_t *r;
    char err[256];
    if (bill_ledger_reader_open(dir, 1, &r, err, sizeof err) != 0)
        return -1;
    long n = 0;
    bill_event_t ev;
    uint64_t seq;
    int rc;
    while ((rc = bill_ledger_reader_next(r, &ev, &seq, err, sizeof err)) == 0) {
        if (seq != (uint64_t)n + 1) {
            fprintf(stderr, "  seq %" PRIu64 " at position %ld\n", seq, n);
            n = -1;
            break;
        }
        if (evs != NULL && n < max)
            evs[n] = ev;
        n++;
    }
    if (rc < 0) {
        fprintf(stderr, "  reader: %s\n", err);
        n = -1;
    }
    bill_ledger_reader_free(r);
    return n;
}

static atomic_int wakes;
static void on_wake(void *ud)
{
    atomic_fetch_add(&wakes, 1);
}

PC_TEST(append_durable_reopen)
{
    const char *dir = fresh_dir("l1");
    bill_ledger_params_t p = bill_ledger_params_default();
    p.dir = dir;
    p.wake = on_wake;
    bill_ledger_t *l;
    char err[256];
    ASSERT_EQ(bill_ledger_open(&p, &l, err, sizeof err), 0);
    char inst[BILL_STR_MAX];
    ASSERT_EQ(bill_ledger_read_instance(dir, inst), 0);
    ASSERT_STR_EQ(inst, bill_ledger_instance(l));
    /* A second process (here: a second open) cannot take the same ledger. */
    bill_ledger_t *l2 = NULL;
    ASSERT_EQ(bill_ledger_open(&p, &l2, err, sizeof err), PC_ERR_BUSY);
    bill_event_t ev;
    uint64_t seq = 0;
    for (uint64_t i = 0; i < 100; i++) {
        ledger_test_event(&ev, i);
        ASSERT_EQ(bill_ledger_append(l, &ev, &seq), 0);
        ASSERT_EQ_U64(seq, i + 1);
    }
    ASSERT_EQ(bill_ledger_wait_durable(l, seq), 0);
    ASSERT_TRUE(bill_ledger_durable_seq(l) >= 100);
    /* The writer wakes the consumer right after it advanced durable_seq: allow it that moment. */
    for (int i = 0; i < 1000 && atomic_load(&wakes) == 0; i++)
        usleep(1000);
    ASSERT_TRUE(atomic_load(&wakes) > 0);
    /* A bad event is refused and changes nothing. */
    ledger_test_event(&ev, 1000);
    ev.tenant[0] = '\0';
    ASSERT_EQ(bill_ledger_append(l, &ev, &seq), PC_ERR_INVAL);
    bill_ledger_stats_t st;
    bill_ledger_stats(l, &st);
    ASSERT_EQ_U64(st.next_seq, 101);
    ASSERT_EQ(bill_ledger_close(l), 0);

    static bill_event_t back[200];
    ASSERT_EQ(read_all(dir, back, 200), 100);
    ledger_test_event(&ev, 42);
    ASSERT_MEM_EQ(&back[42], &ev, sizeof ev);

    l = open_ledger(dir, BILL_FSYNC_ALWAYS, 0);
    ASSERT_TRUE(l != NULL);
    ASSERT_STR_EQ(inst, bill_ledger_instance(l)); /* the instance id is kept */
    ASSERT_EQ(bill_ledger_close(l), 0);
    /* A configured instance id must match the stored one. */
    p.instance = "gw-other";
    ASSERT_EQ(bill_ledger_open(&p, &l, err, sizeof err), PC_ERR_STATE);
    ASSERT_TRUE(strstr(err, "gw-other") != NULL);
    p.instance = "bad id!";
    ASSERT_EQ(bill_ledger_open(&p, &l, err, sizeof err), PC_ERR_INVAL);
    p.instance = inst;
    p.fsync = BILL_FSYNC_ALWAYS;
    ASSERT_EQ(bill_ledger_open(&p, &l, err, sizeof err), 0);
    /* A new ledger takes the configured id. */
    bill_ledger_params_t p2 = bill_ledger_params_default();
    p2.dir = fresh_dir("l1b");
    p2.instance = "gw1";
    bill_ledger_t *l4;
    ASSERT_EQ(bill_ledger_open(&p2, &l4, err, sizeof err), 0);
    ASSERT_STR_EQ(bill_ledger_instance(l4), "gw1");
    ASSERT_EQ(bill_ledger_close(l4), 0);
    ASSERT_EQ(bill_ledger_read_instance(p2.dir, inst), 0);
    ASSERT_STR_EQ(inst, "gw1");
    ledger_test_event(&ev, 100);
    ASSERT_EQ(bill_ledger_append(l, &ev, &seq), 0);
    ASSERT_EQ_U64(seq, 101);
    ASSERT_EQ(bill_ledger_close(l), 0);
    ASSERT_EQ(read_all(dir, NULL, 0), 101);
}

PC_TEST(duplicate_event_ids_written_once)
{
    const char *dir = fresh_dir("l2");
    bill_ledger_t *l = open_ledger(dir, BILL_FSYNC_OFF, 0);
    ASSERT_TRUE(l != NULL);
    bill_event_t ev;
    uint64_t seq, seq2;
    ledger_test_event(&ev, 1);
    ASSERT_EQ(bill_ledger_append(l, &ev, &seq), 0);
    /* The same id again, before and after it is durable: written once, same seq back. */
    ASSERT_EQ(bill_ledger_append(l, &ev, &seq2), 1);
    ASSERT_EQ_U64(seq2, seq);
    bill_ledger_wait_durable(l, seq);
    ev.usage.n_output = 999; /* a retry with different numbers is still the same event */
    ASSERT_EQ(bill_ledger_append(l, &ev, &seq2), 1);
    ASSERT_EQ_U64(seq2, seq);
    /* Tokens but no cost (LiteLLM #37923's streamed spend = 0): written, and counted as an alert.
     */
    ledger_test_event(&ev, 7);
    memset(ev.cost_nusd, 0, sizeof ev.cost_nusd);
    ASSERT_EQ(bill_ledger_append(l, &ev, &seq2), 0);
    bill_ledger_stats_t st;
    bill_ledger_stats(l, &st);
    ASSERT_EQ_U64(st.n_duplicates, 2);
    ASSERT_EQ_U64(st.n_zero_cost, 1);
    ASSERT_EQ(bill_ledger_close(l), 0);
    /* And after a restart: the set is rebuilt from the ledger. */
    l = open_ledger(dir, BILL_FSYNC_OFF, 0);
    ledger_test_event(&ev, 1);
    ASSERT_EQ(bill_ledger_append(l, &ev, &seq2), 1);
    ASSERT_EQ_U64(seq2, seq);
    ledger_test_event(&ev, 2);
    ASSERT_EQ(bill_ledger_append(l, &ev, &seq2), 0);
    ASSERT_EQ(bill_ledger_close(l), 0);
    ASSERT_EQ(read_all(dir, NULL, 0), 3);
}

PC_TEST(dedup_window_generations)
{
    const char *dir = fresh_dir("l2w");
    bill_ledger_params_t p = bill_ledger_params_default();
    p.dir = dir;
    p.fsync = BILL_FSYNC_OFF;
    p.dedup_window = 100;
    bill_ledger_t *l;
    ASSERT_EQ(bill_ledger_open(&p, &l, NULL, 0), 0);
    bill_event_t ev;
    uint64_t seq;
    for (uint64_t i = 0; i < 1000; i++) {
        ledger_test_event(&ev, i);
        ASSERT_EQ(bill_ledger_append(l, &ev, &seq), 0);
    }
    /* The last dedup_window / 2 ids at least are remembered. */
    for (uint64_t i = 950; i < 1000; i++) {
        ledger_test_event(&ev, i);
        ASSERT_EQ(bill_ledger_append(l, &ev, &seq), 1);
    }
    ASSERT_EQ(bill_ledger_close(l), 0);
}

PC_TEST(torn_tail_truncated_and_appending_continues)
{
    const char *dir = fresh_dir("l3");
    bill_ledger_t *l = open_ledger(dir, BILL_FSYNC_ALWAYS, 0);
    bill_event_t ev;
    uint64_t seq;
    for (uint64_t i = 0; i < 10; i++) {
        ledger_test_event(&ev, i);
        bill_ledger_append(l, &ev, &seq);
    }
    ASSERT_EQ(bill_ledger_close(l), 0);
    char path[600];
    snprintf(path, sizeof path, "%s/ledger-00000000000000000001.seg", dir);
    struct stat sb;
    ASSERT_EQ(stat(path, &sb), 0);
    off_t full = sb.st_size;
    /* Every possible tear of the last record: cut at each byte inside it. */
    size_t len;
    uint8_t *orig = pc_test_slurp(path, &len);
    ASSERT_TRUE(orig != NULL);
    size_t rec = 0;
    {
        /* The last record's length: total minus the offset after 9 records. */
        long n = read_all(dir, NULL, 0);
        ASSERT_EQ(n, 10);
    }
    for (off_t cut = full - 1; cut > full - 40; cut--) {
        FILE *f = fopen(path, "wb");
        fwrite(orig, 1, (size_t)cut, f);
        fclose(f);
        ASSERT_EQ(read_all(dir, NULL, 0), 9); /* a reader stops before the torn record */
        l = open_ledger(dir, BILL_FSYNC_ALWAYS, 0);
        ASSERT_TRUE(l != NULL);
        bill_ledger_stats_t st;
        bill_ledger_stats(l, &st);
        ASSERT_EQ_U64(st.next_seq, 10);
        ASSERT_TRUE(st.torn_bytes_truncated > 0);
        ledger_test_event(&ev, 9); /* the torn event was never acknowledged: it may come again */
        ASSERT_EQ(bill_ledger_append(l, &ev, &seq), 0);
        ASSERT_EQ_U64(seq, 10);
        ASSERT_EQ(bill_ledger_close(l), 0);
        ASSERT_EQ(read_all(dir, NULL, 0), 10);
        rec++;
    }
    /* Garbage appended after good records (a torn write of junk) is cut too. */
    FILE *f = fopen(path, "ab");
    fwrite("\x30\x00\x00\x00garbage-garbage-garbage", 1, 27, f);
    fclose(f);
    l = open_ledger(dir, BILL_FSYNC_ALWAYS, 0);
    ASSERT_TRUE(l != NULL);
    ASSERT_EQ(bill_ledger_close(l), 0);
    ASSERT_EQ(stat(path, &sb), 0);
    ASSERT_EQ(sb.st_size, full);
    free(orig);
}

PC_TEST(damage_before_the_tail_refuses_to_open)
{
    const char *dir = fresh_dir("l4");
    bill_ledger_t *l = open_ledger(dir, BILL_FSYNC_OFF, 4096);
    bill_event_t ev;
    uint64_t seq;
    for (uint64_t i = 0; i < 200; i++) {
        ledger_test_event(&ev, i);
        bill_ledger_append(l, &ev, &seq);
        if (i % 7 == 0)
            bill_ledger_wait_durable(l, seq);
    }
    ASSERT_EQ(bill_ledger_close(l), 0);
    ASSERT_EQ(read_all(dir, NULL, 0), 200);
    bill_ledger_stats_t st;
    l = open_ledger(dir, BILL_FSYNC_OFF, 4096);
    bill_ledger_stats(l, &st);
    ASSERT_TRUE(st.n_segments > 3); /* rotated */
    ASSERT_EQ(bill_ledger_close(l), 0);
    /* Reader from the middle. */
    bill_ledger_reader_t *r;
    ASSERT_EQ(bill_ledger_reader_open(dir, 150, &r, NULL, 0), 0);
    ASSERT_EQ(bill_ledger_reader_next(r, &ev, &seq, NULL, 0), 0);
    ASSERT_EQ_U64(seq, 150);
    ASSERT_STR_EQ(ev.event_id, "ev-149");
    bill_ledger_reader_free(r);
    /* Flip one byte in the middle of the first segment. */
    char path[600];
    snprintf(path, sizeof path, "%s/ledger-00000000000000000001.seg", dir);
    int fd = open(path, O_RDWR);
    uint8_t b;
    ASSERT_EQ(pread(fd, &b, 1, 100), 1);
    b ^= 0x40;
    ASSERT_EQ(pwrite(fd, &b, 1, 100), 1);
    close(fd);
    bill_ledger_params_t p = bill_ledger_params_default();
    p.dir = dir;
    char err[256] = "";
    ASSERT_EQ(bill_ledger_open(&p, &l, err, sizeof err), PC_ERR_FORMAT);
    ASSERT_TRUE(strstr(err, "damaged") != NULL);
    ASSERT_EQ(read_all(dir, NULL, 0), -1); /* the reader reports it too */
}

/* I/O hooks that fail: disk full after a byte budget, or fsync errors. */
typedef struct faulty {
    long write_budget; /* bytes before ENOSPC; -1: unlimited */
    int fail_fsync;    /* fail every fsync */
} faulty_t;

static ssize_t faulty_write(void *ud, int fd, const void *buf, size_t len)
{
    faulty_t *f = ud;
    if (f->write_budget >= 0) {
        if (f->write_budget == 0) {
            errno = ENOSPC;
            return -1;
        }
        if ((long)len > f->write_budget)
            len = (size_t)f->write_budget; /* a short write, then ENOSPC */
        f->write_budget -= (long)len;
    }
    return write(fd, buf, len);
}

static int faulty_fsync(void *ud, int fd)
{
    faulty_t *f = ud;
    if (f->fail_fsync) {
        errno = EIO;
        return -1;
    }
    return fdatasync(fd);
}

static void fault_run(const char *name, faulty_t *fs, int want_err)
{
    const char *dir = fresh_dir(name);
    bill_ledger_io_t io = {faulty_write, faulty_fsync, fs};
    bill_ledger_params_t p = bill_ledger_params_default();
    p.dir = dir;
    p.io = &io;
    p.fsync = BILL_FSYNC_ALWAYS;
    p.wake = on_wake;
    bill_ledger_t *l;
    char err[256];
    ASSERT_EQ(bill_ledger_open(&p, &l, err, sizeof err), 0);
    bill_event_t ev;
    uint64_t seq = 0, acked = 0;
    int rc = 0;
    for (uint64_t i = 0; i < 1000 && rc >= 0; i++) {
        ledger_test_event(&ev, i);
        rc = bill_ledger_append(l, &ev, &seq);
        if (rc == 0 && bill_ledger_wait_durable(l, seq) == 0)
            acked = seq;
    }
    ASSERT_EQ(rc, want_err);
    ASSERT_EQ(bill_ledger_status(l), want_err);
    ASSERT_TRUE(bill_ledger_durable_seq(l) == acked);
    ledger_test_event(&ev, 5000);
    ASSERT_EQ(bill_ledger_append(l, &ev, &seq), want_err); /* stays failed */
    bill_ledger_close(l);
    /* Everything acknowledged is there after a reopen on a healthy disk, nothing more that
     * could be half-written. */
    long n = read_all(dir, NULL, 0);
    ASSERT_TRUE(n >= (long)acked);
    l = open_ledger(dir, BILL_FSYNC_ALWAYS, 0);
    ASSERT_TRUE(l != NULL);
    ASSERT_EQ(bill_ledger_close(l), 0);
    ASSERT_TRUE(read_all(dir, NULL, 0) >= (long)acked);
}

PC_TEST(disk_full_fails_the_ledger)
{
    faulty_t fs = {.write_budget = 16 + 20000, .fail_fsync = 0};
    PC_TEST_CALL(fault_run("l5", &fs, PC_ERR_NOSPACE));
}

PC_TEST(fsync_failure_fails_the_ledger)
{
    /* The segment header's sync at creation passes; the first batch's sync fails. */
    faulty_t fs = {.write_budget = -1, .fail_fsync = 0};
    const char *dir = fresh_dir("l6");
    bill_ledger_io_t io = {faulty_write, faulty_fsync, &fs};
    bill_ledger_params_t p = bill_ledger_params_default();
    p.dir = dir;
    p.io = &io;
    p.fsync = BILL_FSYNC_BATCH;
    bill_ledger_t *l;
    ASSERT_EQ(bill_ledger_open(&p, &l, NULL, 0), 0);
    bill_event_t ev;
    uint64_t seq;
    ledger_test_event(&ev, 1);
    ASSERT_EQ(bill_ledger_append(l, &ev, &seq), 0);
    ASSERT_EQ(bill_ledger_wait_durable(l, seq), 0);
    fs.fail_fsync = 1;
    ledger_test_event(&ev, 2);
    ASSERT_EQ(bill_ledger_append(l, &ev, &seq), 0);
    ASSERT_EQ(bill_ledger_wait_durable(l, seq), PC_ERR_IO);
    ASSERT_EQ_U64(bill_ledger_durable_seq(l), 1);
    ledger_test_event(&ev, 3);
    ASSERT_EQ(bill_ledger_append(l, &ev, &seq), PC_ERR_IO);
    ASSERT_EQ(bill_ledger_close(l), PC_ERR_IO);
}

PC_TEST(out_of_memory_appends_nothing)
{
    const char *dir = fresh_dir("l7");
    bill_ledger_t *l = open_ledger(dir, BILL_FSYNC_OFF, 0);
    ASSERT_TRUE(l != NULL);
    pc_allocator_t a = pc_failalloc;
    pc_allocator_t old = pc_set_allocator(&a);
    bill_event_t ev;
    uint64_t seq;
    uint64_t ok = 0, nomem = 0;
    for (uint64_t i = 0; i < 3000; i++) {
        pc_failalloc_left = (int)(i % 3); /* fail the first, second or third allocation */
        ledger_test_event(&ev, i);
        int rc = bill_ledger_append(l, &ev, &seq);
        pc_failalloc_left = -1;
        if (rc == 0)
            ok++;
        else if (rc == PC_ERR_NOMEM)
            nomem++;
        else
            ASSERT_EQ(rc, 0);
        if (rc == PC_ERR_NOMEM) { /* rolled back: the same id goes in on a retry */
            ASSERT_EQ(bill_ledger_append(l, &ev, &seq), 0);
            ok++;
        }
    }
    pc_set_allocator(&old);
    ASSERT_EQ(bill_ledger_close(l), 0);
    ASSERT_EQ_U64(ok, 3000);
    ASSERT_EQ(read_all(dir, NULL, 0), 3000);
    (void)nomem;
}

/* ---------------------------------------------------------------------------------------------
 * Crash loop
 * ------------------------------------------------------------------------------------------- */

/* The child: appends events first, first+1, ... and, after each group is durable, writes the
 * highest acknowledged event number to the pipe. It also retries a few ids already in the
 * ledger (which must be refused as duplicates). Never returns. */
static void crash_child(const char *dir, uint64_t first, int wfd, unsigned seed)
{
    bill_ledger_params_t p = bill_ledger_params_default();
    p.dir = dir;
    p.fsync = BILL_FSYNC_BATCH;
    p.segment_bytes = 16384;
    bill_ledger_t *l;
    if (bill_ledger_open(&p, &l, NULL, 0) != 0)
        _exit(3);
    srand(seed);
    bill_event_t ev;
    for (uint64_t n = first;; n++) {
        uint64_t seq;
        ledger_test_event(&ev, n);
        int rc = bill_ledger_append(l, &ev, &seq);
        if (rc != 0)
            _exit(4);
        if (first > 0 && rand() % 4 == 0) {
            uint64_t old = (uint64_t)rand() % first;
            ledger_test_event(&ev, old);
            uint64_t s2;
            if (bill_ledger_append(l, &ev, &s2) != 1 || s2 != old + 1)
                _exit(5); /* event n has seq n + 1 */
        }
        if (n % 8 == 7) {
            if (bill_ledger_wait_durable(l, seq) != 0)
                _exit(6);
            if (write(wfd, &n, sizeof n) != (ssize_t)sizeof n)
                _exit(7);
        }
    }
}

/* After a kill, before any recovery: every time-index sidecar in dir belongs to a sealed segment
 * and equals what a full scan of that segment computes (a kill while sealing leaves none or a
 * correct one, never a partial or stale one). Returns the number of sidecars. */
static int check_sidecars_after_kill(const char *dir)
{
    uint64_t segs[4096];
    size_t n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        uint64_t s;
        char tail[8];
        if (sscanf(e->d_name, "ledger-%20" SCNu64 ".%4s", &s, tail) == 2 &&
            strcmp(tail, "seg") == 0 && n < 4096)
            segs[n++] = s;
    }
    if (d != NULL)
        closedir(d);
    uint64_t last = 0;
    for (size_t i = 0; i < n; i++)
        last = segs[i] > last ? segs[i] : last;
    int found = 0;
    for (size_t i = 0; i < n; i++) {
        bill_ledger_index_t disk, scan;
        int rc = bill_ledger_index_load(dir, segs[i], &disk);
        if (rc == PC_ERR_NOTFOUND)
            continue;
        if (rc != 0 || segs[i] == last) {
            fprintf(stderr, "  sidecar of segment %" PRIu64 ": %s%s\n", segs[i], pc_strerror(rc),
                    segs[i] == last ? " (on the open segment)" : "");
            return -1;
        }
        if (bill_ledger_index_scan(dir, segs[i], &scan, NULL, 0) != 0 ||
            memcmp(&disk, &scan, sizeof disk) != 0) {
            fprintf(stderr, "  sidecar of segment %" PRIu64 " differs from its data\n", segs[i]);
            return -1;
        }
        found++;
    }
    return found;
}

PC_TEST(crash_loop_sigkill)
{
    const char *dir = fresh_dir("crash");
    int rounds = (int)(300 * pc_test_scale());
    uint64_t total = 0; /* events in the ledger after recovery */
    long sidecars_seen = 0;
    unsigned seed = (unsigned)time(NULL);
    printf("  crash loop seed %u, %d rounds\n", seed, rounds);
    srand(seed);
    char *seen = calloc(1u << 22, 1);
    for (int round = 0; round < rounds; round++) {
        uint64_t acked;
        bool any;
        int status = ledger_crash_round(crash_child, dir, total, seed + (unsigned)round, 40000,
                                        &acked, &any);
        ASSERT_TRUE(status != -1);
        ASSERT_TRUE(WIFSIGNALED(status)); /* the child never failed on its own */

        int n_sidecars = check_sidecars_after_kill(dir);
        ASSERT_TRUE(n_sidecars >= 0);
        sidecars_seen += n_sidecars;

        /* Recovery: open (truncates a torn tail), then read it all back. */
        bill_ledger_t *l = open_ledger(dir, BILL_FSYNC_BATCH, 16384);
        ASSERT_TRUE(l != NULL);
        bill_ledger_stats_t st;
        bill_ledger_stats(l, &st);
        ASSERT_EQ(bill_ledger_close(l), 0);
        bill_ledger_reader_t *r;
        ASSERT_EQ(bill_ledger_reader_open(dir, 1, &r, NULL, 0), 0);
        memset(seen, 0, 1u << 22);
        bill_event_t ev;
        uint64_t seq, n = 0;
        int rc;
        char err[256];
        while ((rc = bill_ledger_reader_next(r, &ev, &seq, err, sizeof err)) == 0) {
            uint64_t id = strtoull(ev.event_id + 3, NULL, 10);
            ASSERT_TRUE(id < (1u << 22));
            ASSERT_EQ(seen[id], 0); /* never twice */
            seen[id] = 1;
            ASSERT_EQ_U64(id, n); /* event n is record n + 1: nothing lost in between */
            n++;
        }
        bill_ledger_reader_free(r);
        ASSERT_EQ(rc, 1); /* parses to the end */
        ASSERT_EQ_U64(n, st.next_seq - 1);
        if (any)
            ASSERT_TRUE(n > acked); /* every acknowledged event is there */
        ASSERT_TRUE(n >= total);
        total = n;
    }
    free(seen);
    printf("  %" PRIu64 " events after %d kills; %ld time-index sidecars checked\n", total, rounds,
           sidecars_seen);
    ASSERT_TRUE(sidecars_seen > 0);
}

/* Writes the fuzz_ledger seed corpus into KVGW_LEDGER_CORPUS (see tests/fuzz/ledger.cmake), or,
 * without it, into the per-process temporary directory, so the generation is still checked. */
PC_TEST(corpus_seeds)
{
    const char *out = getenv("KVGW_LEDGER_CORPUS");
    char tmp[512];
    if (out == NULL) {
        snprintf(tmp, sizeof tmp, "%s", pc_test_tmp_path("."));
        out = tmp;
    }
    const char *dir = fresh_dir("seeds");
    bill_ledger_t *l = open_ledger(dir, BILL_FSYNC_OFF, 0);
    bill_event_t ev;
    uint64_t seq;
    for (uint64_t i = 0; i < 3; i++) {
        ledger_test_event(&ev, i);
        if (i == 2) {
            bill_event_init(&ev, BILL_EVENT_STORAGE);
            bill_event_set_str(ev.event_id, "st-1");
            bill_event_set_str(ev.tenant, "acme");
            bill_event_set_str(ev.model, "kvgw-demo");
            bill_event_set_str(ev.ns, "00ff");
            ev.end_ms = 60000;
            ev.token_ms = 123456;
            ev.cost_nusd[BILL_BUCKET_STORAGE] = 17;
        }
        ASSERT_EQ(bill_ledger_append(l, &ev, &seq), 0);
    }
    ASSERT_EQ(bill_ledger_close(l), 0);
    char path[600];
    snprintf(path, sizeof path, "%s/ledger-00000000000000000001.seg", dir);
    size_t len;
    uint8_t *seg = pc_test_slurp(path, &len);
    ASSERT_TRUE(seg != NULL && len > 100);
    struct {
        const char *name;
        uint8_t mode;
        size_t off, n;
        long flip; /* byte of the written input to flip, -1 none */
    } seeds[] = {
        {"records", 0, 16, len - 16, -1},  {"torn_tail", 0, 16, len - 16 - 9, -1},
        {"flipped", 0, 16, len - 16, 200}, {"whole_file", 1, 0, len, -1},
        {"bad_magic", 1, 0, len, 2},       {"empty", 0, 16, 0, -1},
        {"header_only", 1, 0, 16, -1},     {"short_header", 1, 0, 9, -1},
    };
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        char sp[700];
        snprintf(sp, sizeof sp, "%s/%s", out, seeds[i].name);
        FILE *f = fopen(sp, "wb");
        ASSERT_TRUE(f != NULL);
        uint8_t *b = malloc(seeds[i].n + 1);
        b[0] = seeds[i].mode;
        memcpy(b + 1, seg + seeds[i].off, seeds[i].n);
        if (seeds[i].flip >= 0 && (size_t)seeds[i].flip < seeds[i].n)
            b[1 + seeds[i].flip] ^= 0x20;
        fwrite(b, 1, seeds[i].n + 1, f);
        fclose(f);
        free(b);
    }
    free(seg);
}

PC_TEST_MAIN()
