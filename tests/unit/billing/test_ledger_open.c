/*
 * test_ledger_open.c — the recovery at open reads only the last segment, the sealed segments
 * without a valid sidecar and those holding the duplicate window's records (ledger.h, Recovery on
 * open). Checked: which segments a reopen reads (bill_ledger_stats), appends continue at the
 * right seq, the duplicate set after an indexed open is exactly the one a full open builds (the
 * same probe sequence gives the same answers on two copies of a ledger), missing, stale and
 * corrupt sidecars make open read their segment and are rewritten, a gap in the segment names
 * fails the open, damage in a skipped segment is found by `kvgw billing verify`'s whole-ledger
 * check (bill_ledger_check_all), by a reader of the whole ledger and by a full open, and a SIGKILL
 * crash loop with a small window.
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
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Copies the ledger directory src to dst (fresh). */
static int copy_dir(const char *src, const char *dst)
{
    char cmd[2048];
    rm_dir(dst);
    snprintf(cmd, sizeof cmd, "cp -a '%s' '%s'", src, dst);
    return system(cmd) == 0 ? 0 : -1;
}

static bill_ledger_t *open_mode(const char *dir, uint64_t window, bill_open_check_t check,
                                int *rc_out, char *err, size_t err_len)
{
    bill_ledger_params_t p = bill_ledger_params_default();
    p.dir = dir;
    p.fsync = BILL_FSYNC_OFF;
    p.segment_bytes = 4096;
    p.dedup_window = window;
    p.open_check = check;
    bill_ledger_t *l = NULL;
    char e[256] = "";
    int rc = bill_ledger_open(&p, &l, e, sizeof e);
    if (rc != 0 && rc_out == NULL)
        fprintf(stderr, "  open %s: %s (%s)\n", dir, e, pc_strerror(rc));
    if (rc_out != NULL)
        *rc_out = rc;
    if (err != NULL)
        snprintf(err, err_len, "%s", e);
    return l;
}

/* Appends events first .. first+n-1 (event i gets seq i + 1 in these ledgers), waiting for the
 * disk every 4 events so that segments rotate at about 4 KiB (about 25 events each). */
static int append_events(bill_ledger_t *l, uint64_t first, uint64_t n)
{
    bill_event_t ev;
    uint64_t seq = 0;
    for (uint64_t i = first; i < first + n; i++) {
        ledger_test_event(&ev, i);
        int rc = bill_ledger_append(l, &ev, &seq);
        if (rc != 0)
            return rc;
        if (seq != i + 1)
            return PC_ERR_STATE;
        if (i % 4 == 3 && (rc = bill_ledger_wait_durable(l, seq)) != 0)
            return rc;
    }
    return seq ? bill_ledger_wait_durable(l, seq) : 0;
}

/* The first seqs of the ledger's segments, ascending (at most max). */
static size_t segments(const char *dir, uint64_t *out, size_t max)
{
    size_t n = 0;
    DIR *d = opendir(dir);
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

/* Builds a closed ledger of n events (every sealed segment has its sidecar). */
static const char *build(const char *name, uint64_t n)
{
    const char *dir = fresh_dir(name);
    bill_ledger_t *l = open_mode(dir, 1u << 20, BILL_OPEN_CHECK_INDEX, NULL, NULL, 0);
    if (l == NULL)
        return NULL;
    int rc = append_events(l, 0, n);
    if (bill_ledger_close(l) != 0 || rc != 0)
        return NULL;
    return dir;
}

/* Where the duplicate set of a ledger of n_records records from first_seq on starts (ledger.h,
 * Duplicates), computed here from the documented rule. */
static uint64_t dedup_from(uint64_t first_seq, uint64_t n_records, uint64_t window)
{
    uint64_t h = (window + 1) / 2;
    if (n_records == 0 || (n_records - 1) / h == 0)
        return first_seq;
    return first_seq + ((n_records - 1) / h - 1) * h;
}

/* The segments an indexed open must read when every sidecar is valid: the last one and every
 * sealed one holding a seq >= from. */
static uint64_t expected_reads(const uint64_t *segs, size_t n, uint64_t from)
{
    uint64_t r = 1;
    for (size_t i = 0; i + 1 < n; i++)
        if (segs[i + 1] > from)
            r++;
    return r;
}

/* Reads the whole ledger as `kvgw billing verify`'s Redis reconciliation does (a reader from seq
 * 1, no time range):
 * 1 at the end, or the error with its message in err; *n gets the records read. */
static int read_whole(const char *dir, uint64_t *n, char *err, size_t err_len)
{
    bill_ledger_reader_t *r;
    int rc = bill_ledger_reader_open(dir, 1, &r, err, err_len);
    if (rc != 0)
        return rc;
    bill_event_t ev;
    uint64_t seq;
    *n = 0;
    while ((rc = bill_ledger_reader_next(r, &ev, &seq, err, err_len)) == 0) {
        if (seq != *n + 1) {
            rc = PC_ERR_STATE;
            break;
        }
        (*n)++;
    }
    bill_ledger_reader_free(r);
    return rc;
}

/* Runs bill_ledger_check_all on dir, its report lines in buf. */
static int check_all(const char *dir, bill_ledger_check_t *ck, char *buf, size_t n)
{
    FILE *f = fmemopen(buf, n, "w");
    if (f == NULL)
        return -1;
    char err[256] = "";
    int rc = bill_ledger_check_all(dir, f, ck, err, sizeof err);
    fclose(f);
    return rc;
}

PC_TEST(open_parse_names)
{
    ASSERT_EQ(bill_open_check_parse("index"), BILL_OPEN_CHECK_INDEX);
    ASSERT_EQ(bill_open_check_parse("full"), BILL_OPEN_CHECK_FULL);
    ASSERT_EQ(bill_open_check_parse("Full"), -1);
    ASSERT_EQ(bill_open_check_parse(NULL), -1);
    ASSERT_STR_EQ(bill_open_check_name(BILL_OPEN_CHECK_FULL), "full");
    ASSERT_EQ(bill_ledger_params_default().open_check, BILL_OPEN_CHECK_INDEX);
    bill_ledger_params_t p = bill_ledger_params_default();
    p.dir = fresh_dir("badmode");
    p.open_check = (bill_open_check_t)7;
    bill_ledger_t *l = NULL;
    ASSERT_EQ(bill_ledger_open(&p, &l, NULL, 0), PC_ERR_INVAL);
    ASSERT_TRUE(l == NULL);
}

PC_TEST(open_reads_the_tail_and_the_window_only)
{
    const uint64_t n_events = 2000;
    const char *dir = build("skip", n_events);
    ASSERT_TRUE(dir != NULL);
    uint64_t segs[4096];
    size_t n = segments(dir, segs, 4096);
    ASSERT_TRUE(n > 40);
    /* Windows: inside the last segment, across several segments, starting mid-segment, bigger
     * than the ledger. */
    const uint64_t windows[] = {1, 8, 64, 150, 333, 1000, 5000};
    for (size_t w = 0; w < sizeof windows / sizeof *windows; w++) {
        bill_ledger_t *l = open_mode(dir, windows[w], BILL_OPEN_CHECK_INDEX, NULL, NULL, 0);
        ASSERT_TRUE(l != NULL);
        bill_ledger_stats_t st;
        bill_ledger_stats(l, &st);
        uint64_t from = dedup_from(1, n_events, windows[w]);
        ASSERT_EQ_U64(st.open_dedup_from, from);
        ASSERT_EQ_U64(st.next_seq, n_events + 1);
        ASSERT_EQ_U64(st.open_index_bad, 0);
        ASSERT_EQ_U64(st.open_segments_read, expected_reads(segs, n, from));
        ASSERT_EQ_U64(st.open_segments_read + st.open_segments_skipped, n);
        if (windows[w] <= 150)
            ASSERT_TRUE(st.open_segments_skipped > n / 2);
        /* The window's records are refused: the first of them and the last one. */
        bill_event_t ev;
        uint64_t seq;
        ledger_test_event(&ev, from - 1);
        ASSERT_EQ(bill_ledger_append(l, &ev, &seq), 1);
        ASSERT_EQ_U64(seq, from);
        ledger_test_event(&ev, n_events - 1);
        ASSERT_EQ(bill_ledger_append(l, &ev, &seq), 1);
        ASSERT_EQ_U64(seq, n_events);
        ASSERT_EQ(bill_ledger_close(l), 0);
    }
    /* The full mode reads every segment; the ledger is unchanged by all of the above. */
    bill_ledger_t *l = open_mode(dir, 64, BILL_OPEN_CHECK_FULL, NULL, NULL, 0);
    ASSERT_TRUE(l != NULL);
    bill_ledger_stats_t st;
    bill_ledger_stats(l, &st);
    ASSERT_EQ_U64(st.open_segments_read, n);
    ASSERT_EQ_U64(st.open_segments_skipped, 0);
    ASSERT_EQ_U64(st.next_seq, n_events + 1);
    /* Appends continue at the right seq, across a rotation, and read back in order. */
    ASSERT_EQ(append_events(l, n_events, 100), 0);
    ASSERT_EQ(bill_ledger_close(l), 0);
    l = open_mode(dir, 64, BILL_OPEN_CHECK_INDEX, NULL, NULL, 0);
    ASSERT_TRUE(l != NULL);
    bill_ledger_stats(l, &st);
    ASSERT_EQ_U64(st.next_seq, n_events + 101);
    ASSERT_EQ(append_events(l, n_events + 100, 50), 0);
    ASSERT_EQ(bill_ledger_close(l), 0);
    uint64_t got;
    char err[256] = "";
    ASSERT_EQ(read_whole(dir, &got, err, sizeof err), 1);
    ASSERT_EQ_U64(got, n_events + 150);
    /* verify's whole-ledger check finds nothing wrong. */
    bill_ledger_check_t ck;
    static char rep[4096];
    ASSERT_EQ(check_all(dir, &ck, rep, sizeof rep), 0);
    ASSERT_EQ_U64(ck.n_problems, 0);
    ASSERT_EQ_U64(ck.n_records, n_events + 150);
    ASSERT_EQ_U64(ck.n_segments, segments(dir, segs, 4096));
    ASSERT_EQ_U64(ck.n_index_rebuilt, 0);
    ASSERT_EQ_U64(ck.tail_bytes, 0);
    ASSERT_STR_EQ(rep, "");
}

/* Appends the probe sequence to l, recording each answer: first every id from the newest back
 * to past the window's oldest (retries in the window change nothing, so each one the two sets
 * disagree on shows), then retries of old ids (some in the window, some just out of it) and new
 * ids, interleaved, so that generations turn over. */
static void probe(bill_ledger_t *l, uint64_t n_events, uint64_t window, uint64_t *out, size_t n_out)
{
    uint64_t x = 12345 + window;
    for (size_t k = 0; k < n_out; k++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        bill_event_t ev;
        uint64_t back = k < window + 3 ? k : (x >> 33) % (2 * window + 4);
        bool fresh = (k >= window + 3 && k % 3 == 2) || back >= n_events;
        uint64_t id = fresh ? 1000000 + k : n_events - 1 - back;
        ledger_test_event(&ev, id);
        uint64_t seq = 0;
        int rc = bill_ledger_append(l, &ev, &seq);
        out[k] = (uint64_t)rc << 60 | seq;
    }
}

PC_TEST(indexed_open_builds_the_same_duplicate_set_as_a_full_open)
{
    /* Two copies of one ledger, one opened each way: the same probes get the same answers. The
     * last segment holds 200 records (appended with big segments), so that small windows start
     * inside it, windows of 2-64 across it and the sealed ones before, bigger ones further. */
    const uint64_t n_events = 1700;
    const char *dir = build("same", 1500);
    ASSERT_TRUE(dir != NULL);
    bill_ledger_params_t p = bill_ledger_params_default();
    p.dir = dir;
    p.fsync = BILL_FSYNC_OFF;
    p.segment_bytes = 1u << 20;
    bill_ledger_t *l = NULL;
    ASSERT_EQ(bill_ledger_open(&p, &l, NULL, 0), 0);
    ASSERT_EQ(append_events(l, 1500, 200), 0);
    ASSERT_EQ(bill_ledger_close(l), 0);
    uint64_t segs[4096];
    size_t n = segments(dir, segs, 4096);
    ASSERT_TRUE(n > 2 && segs[n - 1] <= 1501);
    const char *a = pc_test_tmp_path("same-a"), *b = pc_test_tmp_path("same-b");
    uint64_t windows[64 + 9] = {128, 300, 399, 400, 401, 500, 1699, 1700, 3401};
    for (uint64_t w = 2; w <= 65; w++)
        windows[9 + w - 2] = w;
    enum { N_PROBES = 1500 };
    static uint64_t ra[N_PROBES], rb[N_PROBES];
    int inside = 0;
    for (size_t w = 0; w < sizeof windows / sizeof *windows; w++) {
        inside += dedup_from(1, n_events, windows[w]) > segs[n - 1];
        ASSERT_EQ(copy_dir(dir, a), 0);
        ASSERT_EQ(copy_dir(dir, b), 0);
        bill_ledger_t *la = open_mode(a, windows[w], BILL_OPEN_CHECK_INDEX, NULL, NULL, 0);
        bill_ledger_t *lb = open_mode(b, windows[w], BILL_OPEN_CHECK_FULL, NULL, NULL, 0);
        ASSERT_TRUE(la != NULL && lb != NULL);
        probe(la, n_events, windows[w], ra, N_PROBES);
        probe(lb, n_events, windows[w], rb, N_PROBES);
        int dups = 0;
        for (int k = 0; k < N_PROBES; k++) {
            ASSERT_EQ_U64(ra[k], rb[k]);
            dups += ra[k] >> 60 == 1;
        }
        ASSERT_TRUE(dups > 0);
        ASSERT_EQ(bill_ledger_close(la), 0);
        ASSERT_EQ(bill_ledger_close(lb), 0);
    }
    ASSERT_TRUE(inside > 30); /* windows that start inside the last segment */
}

PC_TEST(bad_sidecars_make_open_read_their_segment)
{
    const uint64_t n_events = 1200, window = 16;
    const char *dir = build("bad", n_events);
    ASSERT_TRUE(dir != NULL);
    uint64_t segs[4096];
    size_t n = segments(dir, segs, 4096);
    ASSERT_TRUE(n > 20);
    uint64_t from = dedup_from(1, n_events, window);
    uint64_t base = expected_reads(segs, n, from);
    /* 0 missing, 1 corrupt (CRC), 2 stale (an older, shorter state of the segment), 3 of another
     * segment, 4 a count that the next segment's name contradicts, 5 a wrong last-record CRC. */
    for (int how = 0; how < 6; how++) {
        uint64_t s = segs[3 + (size_t)how];
        bill_ledger_index_t real, ix;
        ASSERT_EQ(bill_ledger_index_scan(dir, s, &real, NULL, 0), 0);
        ix = real;
        char path[600];
        seg_path(path, sizeof path, dir, s, "idx");
        if (how == 0) {
            ASSERT_EQ(unlink(path), 0);
        } else {
            if (how == 2) {
                ix.n_records--;
                ix.seg_bytes = ix.last_off;
            } else if (how == 3) {
                ASSERT_EQ(bill_ledger_index_scan(dir, segs[20], &ix, NULL, 0), 0);
                ix.first_seq = s;
            } else if (how == 4) {
                ix.n_records++;
            } else if (how == 5) {
                ix.last_crc ^= 1;
            }
            ASSERT_EQ(write_sidecar(dir, &ix, how != 1), 0);
        }
        bill_ledger_t *l = open_mode(dir, window, BILL_OPEN_CHECK_INDEX, NULL, NULL, 0);
        ASSERT_TRUE(l != NULL);
        bill_ledger_stats_t st;
        bill_ledger_stats(l, &st);
        ASSERT_EQ_U64(st.open_index_bad, 1);
        ASSERT_EQ_U64(st.open_segments_read, base + 1);
        ASSERT_EQ_U64(st.next_seq, n_events + 1);
        ASSERT_EQ(bill_ledger_close(l), 0);
        /* Rewritten from the data: the next open skips it again. */
        bill_ledger_index_t disk;
        ASSERT_EQ(bill_ledger_index_load(dir, s, &disk), 0);
        ASSERT_MEM_EQ(&disk, &real, sizeof disk);
        l = open_mode(dir, window, BILL_OPEN_CHECK_INDEX, NULL, NULL, 0);
        ASSERT_TRUE(l != NULL);
        bill_ledger_stats(l, &st);
        ASSERT_EQ_U64(st.open_index_bad, 0);
        ASSERT_EQ_U64(st.open_segments_read, base);
        ASSERT_EQ(bill_ledger_close(l), 0);
    }
    /* A sidecar on the open segment is removed (it would go stale at the next append). */
    bill_ledger_index_t ix;
    ASSERT_EQ(bill_ledger_index_scan(dir, segs[n - 1], &ix, NULL, 0), 0);
    ASSERT_EQ(write_sidecar(dir, &ix, true), 0);
    bill_ledger_t *l = open_mode(dir, window, BILL_OPEN_CHECK_INDEX, NULL, NULL, 0);
    ASSERT_TRUE(l != NULL);
    ASSERT_EQ(bill_ledger_close(l), 0);
    ASSERT_EQ(bill_ledger_index_load(dir, segs[n - 1], &ix), PC_ERR_NOTFOUND);
}

PC_TEST(a_gap_in_the_segments_fails_the_open)
{
    const char *dir = build("gap", 800);
    ASSERT_TRUE(dir != NULL);
    uint64_t segs[4096];
    size_t n = segments(dir, segs, 4096);
    ASSERT_TRUE(n > 10);
    /* A whole old segment (and its sidecar) gone: the names and counts do not add up. */
    char path[600];
    seg_path(path, sizeof path, dir, segs[4], "seg");
    ASSERT_EQ(unlink(path), 0);
    seg_path(path, sizeof path, dir, segs[4], "idx");
    ASSERT_EQ(unlink(path), 0);
    int rc;
    char err[256];
    bill_ledger_t *l = open_mode(dir, 8, BILL_OPEN_CHECK_INDEX, &rc, err, sizeof err);
    ASSERT_TRUE(l == NULL);
    ASSERT_EQ(rc, PC_ERR_FORMAT);
    ASSERT_TRUE(strstr(err, "should start at seq") != NULL);
    bill_ledger_check_t ck;
    static char rep[4096];
    ASSERT_EQ(check_all(dir, &ck, rep, sizeof rep), 0);
    printf("  check: %s", rep);
    ASSERT_EQ_U64(ck.n_problems, 1);
    char name[64];
    snprintf(name, sizeof name, "GAP %s/ledger-%020" PRIu64 ".seg", dir, segs[5]);
    ASSERT_TRUE(strstr(rep, name) != NULL);
    /* A reader (an export) stops with the error at the gap, never quietly as at the end. */
    uint64_t got;
    ASSERT_EQ(read_whole(dir, &got, err, sizeof err), PC_ERR_FORMAT);
    printf("  reader: %s\n", err);
    ASSERT_EQ_U64(got, segs[4] - 1);
    ASSERT_TRUE(strstr(err, "a segment is missing") != NULL);
    /* The last sealed segment gone: the open segment's name is not where the others end. */
    const char *dir2 = build("gap2", 800);
    n = segments(dir2, segs, 4096);
    seg_path(path, sizeof path, dir2, segs[n - 2], "seg");
    ASSERT_EQ(unlink(path), 0);
    seg_path(path, sizeof path, dir2, segs[n - 2], "idx");
    ASSERT_EQ(unlink(path), 0);
    l = open_mode(dir2, 8, BILL_OPEN_CHECK_INDEX, &rc, err, sizeof err);
    ASSERT_TRUE(l == NULL);
    ASSERT_EQ(rc, PC_ERR_FORMAT);
}

PC_TEST(check_all_reports_forged_sidecars_and_tolerates_the_tail)
{
    const char *dir = build("forged", 600);
    ASSERT_TRUE(dir != NULL);
    uint64_t segs[4096];
    size_t n = segments(dir, segs, 4096);
    ASSERT_TRUE(n > 10);
    /* A sidecar that passes every cheap check but lies about the times: trusted by readers. */
    bill_ledger_index_t ix;
    ASSERT_EQ(bill_ledger_index_scan(dir, segs[3], &ix, NULL, 0), 0);
    ix.max_start_ms = ix.min_start_ms;
    ASSERT_EQ(write_sidecar(dir, &ix, true), 0);
    /* A corrupt one (readers would not trust it): to rebuild, not a problem. */
    ASSERT_EQ(bill_ledger_index_scan(dir, segs[5], &ix, NULL, 0), 0);
    ASSERT_EQ(write_sidecar(dir, &ix, false), 0);
    /* A partial record at the end of the open segment. */
    char path[600];
    seg_path(path, sizeof path, dir, segs[n - 1], "seg");
    FILE *f = fopen(path, "ab");
    ASSERT_TRUE(f != NULL);
    ASSERT_EQ(fwrite("\x40\x00\x00\x00partial", 1, 11, f), 11);
    ASSERT_EQ(fclose(f), 0);
    bill_ledger_check_t ck;
    static char rep[4096];
    ASSERT_EQ(check_all(dir, &ck, rep, sizeof rep), 0);
    printf("  check: %s", rep);
    ASSERT_EQ_U64(ck.n_problems, 1);
    ASSERT_EQ_U64(ck.n_index_rebuilt, 1);
    ASSERT_EQ_U64(ck.tail_bytes, 11);
    ASSERT_EQ_U64(ck.n_records, 600);
    char name[64];
    snprintf(name, sizeof name, "INDEX %s/ledger-%020" PRIu64 ".idx", dir, segs[3]);
    ASSERT_TRUE(strstr(rep, name) != NULL);
    /* No directory: an error, not a report. */
    char err[256] = "";
    ASSERT_EQ(bill_ledger_check_all(pc_test_tmp_path("nope"), NULL, &ck, err, sizeof err),
              PC_ERR_NOTFOUND);
    ASSERT_TRUE(strstr(err, "nope") != NULL);
}

/* Flips one byte at offset off of segment s's file. */
static void flip(const char *dir, uint64_t s, long off)
{
    char path[600];
    seg_path(path, sizeof path, dir, s, "seg");
    FILE *f = fopen(path, "r+b");
    ASSERT_TRUE(f != NULL);
    ASSERT_EQ(fseek(f, off, SEEK_SET), 0);
    int c = fgetc(f);
    ASSERT_TRUE(c != EOF);
    ASSERT_EQ(fseek(f, off, SEEK_SET), 0);
    ASSERT_EQ(fputc(c ^ 0x20, f), c ^ 0x20);
    ASSERT_EQ(fclose(f), 0);
}

PC_TEST(damage_in_a_skipped_segment_is_found_by_verify_and_full_open)
{
    const uint64_t n_events = 800;
    /* 0: a payload byte of the segment's second record; 1: its header. */
    for (int how = 0; how < 2; how++) {
        const char *dir = build(how ? "dmg1" : "dmg0", n_events);
        ASSERT_TRUE(dir != NULL);
        uint64_t segs[4096];
        size_t n = segments(dir, segs, 4096);
        ASSERT_TRUE(n > 10);
        uint64_t s = segs[2];
        bill_ledger_index_t ix;
        ASSERT_EQ(bill_ledger_index_scan(dir, s, &ix, NULL, 0), 0);
        ASSERT_TRUE(ix.n_records > 3);
        /* The second record starts after the header and the first one; its payload 20 on. */
        char path[600];
        seg_path(path, sizeof path, dir, s, "seg");
        size_t len;
        uint8_t *data = pc_test_slurp(path, &len);
        ASSERT_TRUE(data != NULL);
        uint32_t first_len = (uint32_t)data[16] | (uint32_t)data[17] << 8 |
                             (uint32_t)data[18] << 16 | (uint32_t)data[19] << 24;
        free(data);
        flip(dir, s, how ? 3 : (long)(16 + 20 + first_len + 20 + 5));
        /* Open by the index skips it (documented): it opens and appends continue. */
        bill_ledger_t *l = open_mode(dir, 8, BILL_OPEN_CHECK_INDEX, NULL, NULL, 0);
        ASSERT_TRUE(l != NULL);
        bill_ledger_stats_t st;
        bill_ledger_stats(l, &st);
        ASSERT_TRUE(st.open_segments_skipped > 0);
        ASSERT_EQ_U64(st.next_seq, n_events + 1);
        ASSERT_EQ(bill_ledger_close(l), 0);
        /* Reading the whole ledger (verify) reports it, naming the segment file. */
        char err[512] = "", name[64];
        uint64_t got;
        ASSERT_EQ(read_whole(dir, &got, err, sizeof err), PC_ERR_FORMAT);
        snprintf(name, sizeof name, "ledger-%020" PRIu64 ".seg", s);
        printf("  verify's reader: %s\n", err);
        ASSERT_TRUE(strstr(err, name) != NULL);
        ASSERT_EQ_U64(got, how ? s - 1 : s);
        /* verify's whole-ledger check reports it, and only it. */
        bill_ledger_check_t ck;
        static char rep[4096];
        ASSERT_EQ(check_all(dir, &ck, rep, sizeof rep), 0);
        printf("  check: %s", rep);
        ASSERT_EQ_U64(ck.n_problems, 1);
        ASSERT_TRUE(strncmp(rep, "DAMAGE ", 7) == 0 && strstr(rep, name) != NULL);
        ASSERT_TRUE(strchr(rep, '\n') == rep + strlen(rep) - 1);
        /* A full open refuses it. */
        int rc;
        l = open_mode(dir, 8, BILL_OPEN_CHECK_FULL, &rc, err, sizeof err);
        ASSERT_TRUE(l == NULL);
        ASSERT_EQ(rc, PC_ERR_FORMAT);
        ASSERT_TRUE(strstr(err, name) != NULL);
    }
}

/* ---------------------------------------------------------------------------------------------
 * The crash loop with a window small enough that opens skip segments: a child appends under
 * fsync=batch and retries ids of the previous runs that are among the last window/2 records (which
 * must be refused with their seq); it is SIGKILLed at random moments; after each kill the ledger
 * must reopen by the index with every acknowledged event exactly once, in order.
 * ------------------------------------------------------------------------------------------- */

#define CRASH_WINDOW 64

static void crash_child(const char *dir, uint64_t first, int wfd, unsigned seed)
{
    bill_ledger_params_t p = bill_ledger_params_default();
    p.dir = dir;
    p.fsync = BILL_FSYNC_BATCH;
    p.segment_bytes = 4096;
    p.dedup_window = CRASH_WINDOW;
    bill_ledger_t *l;
    if (bill_ledger_open(&p, &l, NULL, 0) != 0)
        _exit(3);
    srand(seed);
    bill_event_t ev;
    for (uint64_t n = first;; n++) {
        uint64_t seq;
        ledger_test_event(&ev, n);
        int rc = bill_ledger_append(l, &ev, &seq);
        if (rc != 0 || seq != n + 1)
            _exit(4);
        if (n < first + 8 && first >= CRASH_WINDOW / 2) {
            /* Before the window turns over: the last window/2 ids of the previous run. */
            uint64_t old = first - 1 - (uint64_t)rand() % (CRASH_WINDOW / 2 - 1 - (n - first));
            ledger_test_event(&ev, old);
            uint64_t s2;
            if (bill_ledger_append(l, &ev, &s2) != 1 || s2 != old + 1)
                _exit(5);
        }
        if (n % 8 == 7) {
            if (bill_ledger_wait_durable(l, seq) != 0)
                _exit(6);
            if (write(wfd, &n, sizeof n) != (ssize_t)sizeof n)
                _exit(7);
        }
    }
}

PC_TEST(crash_loop_with_indexed_opens)
{
    const char *dir = fresh_dir("crash");
    int rounds = (int)(120 * pc_test_scale());
    uint64_t total = 0, skipped = 0;
    unsigned seed = (unsigned)time(NULL);
    printf("  crash loop seed %u, %d rounds\n", seed, rounds);
    srand(seed);
    for (int round = 0; round < rounds; round++) {
        uint64_t acked;
        bool any;
        int status = ledger_crash_round(crash_child, dir, total, seed + (unsigned)round, 30000,
                                        &acked, &any);
        ASSERT_TRUE(status != -1);
        ASSERT_TRUE(WIFSIGNALED(status)); /* the child never failed on its own */
        bill_ledger_t *l = open_mode(dir, CRASH_WINDOW, BILL_OPEN_CHECK_INDEX, NULL, NULL, 0);
        ASSERT_TRUE(l != NULL);
        bill_ledger_stats_t st;
        bill_ledger_stats(l, &st);
        ASSERT_EQ(bill_ledger_close(l), 0);
        skipped += st.open_segments_skipped;
        uint64_t n = 0;
        char err[256] = "";
        ASSERT_EQ(read_whole(dir, &n, err, sizeof err), 1); /* in order, to the end */
        ASSERT_EQ_U64(n, st.next_seq - 1);
        if (any)
            ASSERT_TRUE(n > acked);
        ASSERT_TRUE(n >= total);
        total = n;
    }
    printf("  %" PRIu64 " events after %d kills; %" PRIu64 " segment skips by reopens\n", total,
           rounds, skipped);
    if (rounds >= 20)
        ASSERT_TRUE(skipped > 0);
}

PC_TEST_MAIN()
