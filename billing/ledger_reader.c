/*
 * ledger_reader.c — reading a ledger directory without owning it: the reader (from a seq, and over
 * a time range with the sidecars' help), the index scan of one segment and the whole-directory
 * check (format in ledger.h; the bytes in ledger_format.c). A reader runs beside the writer, in
 * the same process or another: it treats a bad record at the end of the last segment as the tail
 * being written, and anything else as damage.
 */
#include "ledger_internal.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct bill_ledger_reader {
    char *dir;
    FILE *f;
    uint64_t next_seq;  /* seq of the next record in f */
    uint64_t cur_first; /* first seq of the segment f reads */
    uint64_t from_seq;
    bool ranged; /* set_time_range: skip sealed segments outside [from_ms, to_ms) */
    uint64_t from_ms, to_ms;
    bill_ledger_index_t acc; /* the index of f's segment, from its records read so far */
    bill_ledger_reader_stats_t st;
    uint64_t *segs; /* ranged: the segments listed last time, ascending */
    size_t n_segs;
    bool reread; /* f's end was read again once after a later segment appeared */
};

static FILE *open_segment(const char *dir, uint64_t first, bool *bad_header)
{
    char path[4096], name[64];
    bill__seg_name(name, sizeof name, first);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    *bad_header = false;
    FILE *f = fopen(path, "rbe");
    if (f == NULL)
        return NULL;
    uint8_t h[BILL_LEDGER_SEGMENT_HEADER];
    if (fread(h, 1, sizeof h, f) != sizeof h || !bill__seg_header_ok(h)) {
        *bad_header = true;
        fclose(f);
        return NULL;
    }
    return f;
}

int bill_ledger_reader_open(const char *dir, uint64_t from_seq, bill_ledger_reader_t **out,
                            char *err, size_t err_len)
{
    *out = NULL;
    uint64_t *segs;
    size_t n;
    int rc = bill__seg_list(dir, &segs, &n);
    if (rc != 0)
        return pc_err_setf(err, err_len, rc, "ledger: cannot read %s: %s", dir, pc_strerror(rc));
    bill_ledger_reader_t *r = pc_calloc(1, sizeof *r);
    if (r == NULL || (r->dir = pc_strdup(dir)) == NULL) {
        pc_free(r);
        pc_free(segs);
        return PC_ERR_NOMEM;
    }
    r->from_seq = from_seq;
    /* Start in the last segment that begins at or before from_seq (or the oldest one). */
    r->next_seq = n > 0 ? segs[0] : 1;
    for (size_t i = 0; i < n; i++)
        if (segs[i] <= from_seq)
            r->next_seq = segs[i];
    pc_free(segs);
    *out = r;
    return 0;
}

int bill_ledger_reader_set_time_range(bill_ledger_reader_t *r, uint64_t from_ms, uint64_t to_ms)
{
    if (from_ms > to_ms || r->f != NULL)
        return PC_ERR_INVAL;
    r->ranged = true;
    r->from_ms = from_ms;
    r->to_ms = to_ms;
    return 0;
}

void bill_ledger_reader_stats(const bill_ledger_reader_t *r, bill_ledger_reader_stats_t *out)
{
    *out = r->st;
    out->next_seq = r->next_seq;
}

/* Before the reader opens segment next_seq: skips it, and the sealed ones after it, while each
 * one's sidecar is valid for the segment as it is on disk (bill__idx_matches) and proves that no
 * event in it starts in [from_ms, to_ms). Stops at the first segment that may hold such an event,
 * whose sidecar is missing or invalid, or that is the last one (the open segment: always read). Any
 * doubt means reading the segment, which is always correct. */
/* The index of the first of segs[0..n) that is >= seq (n when none). */
static size_t lower_bound(const uint64_t *segs, size_t n, uint64_t seq)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (segs[mid] < seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void reader_skip(bill_ledger_reader_t *r)
{
    /* The directory is listed again only when next_seq is not in the last listing or is its last
     * segment (which may have been sealed since): once per read stretch, not per segment. */
    size_t i = lower_bound(r->segs, r->n_segs, r->next_seq);
    if (i + 1 >= r->n_segs || r->segs[i] != r->next_seq) {
        uint64_t *segs;
        size_t n;
        if (bill__seg_list(r->dir, &segs, &n) != 0)
            return;
        pc_free(r->segs);
        r->segs = segs;
        r->n_segs = n;
        i = lower_bound(segs, n, r->next_seq);
    }
    const uint64_t *segs = r->segs;
    size_t n = r->n_segs;
    for (; i + 1 < n && segs[i] == r->next_seq; i++) {
        bill_ledger_index_t ix;
        if (bill_ledger_index_load(r->dir, segs[i], &ix) != 0 ||
            !bill__idx_matches(r->dir, segs[i], segs[i + 1], &ix)) {
            r->st.n_index_bad++;
            break;
        }
        if (ix.n_records > 0 && ix.max_start_ms >= r->from_ms && ix.min_start_ms < r->to_ms)
            break;
        r->st.n_segments_skipped++;
        r->next_seq = segs[i + 1];
    }
}

/* After a ranged reader read a sealed segment whole: the index built from its records is the
 * truth. A missing sidecar is written, and one that says anything else is rewritten (with a
 * warning: the cheap checks of bill__idx_matches did not catch it). Best effort: a reader without
 * write access to the directory just reads the segment again next time. */
static void reader_check_index(bill_ledger_reader_t *r)
{
    bill_ledger_index_t disk;
    int rc = bill_ledger_index_load(r->dir, r->cur_first, &disk);
    if (rc == 0 && bill__idx_equal(&disk, &r->acc))
        return;
    char name[64];
    bill__idx_name(name, sizeof name, r->cur_first);
    if (rc == 0)
        PC_LOG(PC_LOG_WARN, "ledger", "%s/%s disagrees with its segment's data; rewriting it",
               r->dir, name);
    int dfd = open(r->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return;
    if (bill__idx_write(dfd, &bill__ledger_default_io, &r->acc, true) == 0)
        r->st.n_index_written++;
    close(dfd);
}

/* True when a segment starting at seq exists (the current one then ended for good). */
static bool segment_exists(const char *dir, uint64_t seq)
{
    char path[4096], name[64];
    bill__seg_name(name, sizeof name, seq);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* True when a segment after the one starting at first exists: a bad record in it is damage,
 * not the tail being written. */
static bool later_segment_exists(const char *dir, uint64_t first)
{
    uint64_t *segs;
    size_t n;
    if (bill__seg_list(dir, &segs, &n) != 0)
        return false;
    bool later = n > 0 && segs[n - 1] > first;
    pc_free(segs);
    return later;
}

int bill_ledger_reader_next(bill_ledger_reader_t *r, bill_event_t *ev, uint64_t *seq, char *err,
                            size_t err_len)
{
    for (;;) {
        if (r->f == NULL) {
            if (r->ranged)
                reader_skip(r);
            bool bad;
            r->f = open_segment(r->dir, r->next_seq, &bad);
            r->cur_first = r->next_seq;
            bill__idx_init(&r->acc, r->cur_first);
            if (r->f != NULL)
                r->st.n_segments_read++;
            if (r->f == NULL) {
                /* A half-created segment (header not yet written) is the end for now, unless a
                 * later one exists. */
                if (bad && later_segment_exists(r->dir, r->next_seq)) {
                    char name[64];
                    bill__seg_name(name, sizeof name, r->next_seq);
                    return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                                       "ledger: %s/%s: bad segment header (seq %" PRIu64
                                       " expected)",
                                       r->dir, name, r->next_seq);
                }
                return 1;
            }
        }
        long pos = ftell(r->f);
        uint64_t s;
        size_t len;
        bool bad_payload;
        const uint8_t *frame;
        int rr = bill__record_read(r->f, ev, &s, &len, &bad_payload, &frame);
        if (rr == BILL__REC_OK && s == r->next_seq) {
            r->reread = false;
            bill__idx_add(&r->acc, frame, len, ev->start_ms);
            r->next_seq++;
            if (s < r->from_seq)
                continue;
            *seq = s;
            return 0;
        }
        char name[64];
        bill__seg_name(name, sizeof name, r->cur_first);
        if (rr == BILL__REC_OK || bad_payload)
            return pc_err_setf(
                err, err_len, PC_ERR_FORMAT,
                "ledger: %s/%s: damaged record at byte %ld (seq %" PRIu64 " expected, %s)", r->dir,
                name, pos, r->next_seq,
                rr == BILL__REC_OK ? "another seq found" : "its payload does not decode");
        /* The end of the data written so far, or of this segment. */
        clearerr(r->f);
        fseek(r->f, pos, SEEK_SET);
        if (rr != BILL__REC_TORN && r->next_seq != r->cur_first &&
            segment_exists(r->dir, r->next_seq)) {
            if (r->ranged)
                reader_check_index(r);
            fclose(r->f);
            r->f = NULL;
            r->reread = false;
            continue;
        }
        if (!later_segment_exists(r->dir, r->cur_first))
            return 1; /* the live end: a later call reads what is appended meanwhile */
        /* A later segment exists, so the writer sealed this one (synced, complete) before it
         * created that one: records it wrote after the read above are there now. Read the end
         * once more; still no next record means damage or a missing segment, never the end. */
        if (!r->reread) {
            r->reread = true;
            continue;
        }
        if (rr == BILL__REC_TORN)
            return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                               "ledger: %s/%s: damaged record at byte %ld (seq %" PRIu64
                               ") before a later segment",
                               r->dir, name, pos, r->next_seq);
        return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                           "ledger: %s: no segment holds seq %" PRIu64
                           " (%s ends before it and a later segment exists): a segment is missing",
                           r->dir, r->next_seq, name);
    }
}

int bill_ledger_index_scan(const char *dir, uint64_t first_seq, bill_ledger_index_t *out, char *err,
                           size_t err_len)
{
    bool bad;
    FILE *f = open_segment(dir, first_seq, &bad);
    if (f == NULL)
        return pc_err_setf(err, err_len, bad ? PC_ERR_FORMAT : PC_ERR_NOTFOUND,
                           "ledger: %s: %s the segment of seq %" PRIu64, dir,
                           bad ? "bad header in" : "no", first_seq);
    bill__idx_init(out, first_seq);
    int rc = 0;
    for (;;) {
        bill_event_t ev;
        uint64_t seq;
        size_t len;
        bool bad_payload;
        const uint8_t *frame;
        int rr = bill__record_read(f, &ev, &seq, &len, &bad_payload, &frame);
        if (rr == BILL__REC_END)
            break;
        if (rr != BILL__REC_OK || seq != first_seq + out->n_records) {
            rc = pc_err_setf(err, err_len, PC_ERR_FORMAT,
                             "ledger: %s: the segment of seq %" PRIu64
                             " is damaged at byte %" PRIu64,
                             dir, first_seq, out->seg_bytes);
            break;
        }
        bill__idx_add(out, frame, len, ev.start_ms);
    }
    fclose(f);
    return rc;
}

int bill_ledger_check_all(const char *dir, FILE *out, bill_ledger_check_t *res, char *err,
                          size_t err_len)
{
    *res = (bill_ledger_check_t){0};
    uint64_t *segs;
    size_t n;
    int rc = bill__seg_list(dir, &segs, &n);
    if (rc != 0)
        return pc_err_setf(err, err_len, rc, "ledger: cannot read %s: %s", dir, pc_strerror(rc));
    uint64_t expected = n > 0 ? segs[0] : 1;
    for (size_t i = 0; i < n; i++) {
        bool last = i + 1 == n;
        char path[4096], name[64], why[512] = "";
        bill__seg_name(name, sizeof name, segs[i]);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        res->n_segments++;
        if (segs[i] != expected) {
            res->n_problems++;
            if (out != NULL)
                fprintf(out,
                        "GAP %s: starts at seq %" PRIu64 ", the segments before it end at seq "
                        "%" PRIu64 "\n",
                        path, segs[i], expected - 1);
        }
        struct stat sb;
        uint64_t size = stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
        bill_ledger_index_t ix = {0}; /* first_seq stays 0 when the header is bad */
        rc = bill_ledger_index_scan(dir, segs[i], &ix, why, sizeof why);
        bool header_bad = rc != 0 && ix.first_seq != segs[i];
        res->n_records += rc == 0 || !header_bad ? ix.n_records : 0;
        res->n_bytes += rc == 0 || !header_bad ? ix.seg_bytes : 0;
        if (rc != 0 && rc != PC_ERR_FORMAT) {
            pc_free(segs);
            return pc_err_setf(err, err_len, rc, "ledger: cannot read %s: %s", path,
                               pc_strerror(rc));
        }
        if (rc != 0 && last && (!header_bad || size <= BILL_LEDGER_SEGMENT_HEADER)) {
            /* The open segment's tail: a record being written, or a crash's torn tail. */
            res->tail_bytes += size - (header_bad ? 0 : ix.seg_bytes);
            rc = 0;
        } else if (rc != 0) {
            res->n_problems++;
            if (out != NULL) {
                if (header_bad)
                    fprintf(out, "DAMAGE %s: bad segment header (seq %" PRIu64 " on)\n", path,
                            segs[i]);
                else
                    fprintf(out,
                            "DAMAGE %s: bad record at byte %" PRIu64 " (seq %" PRIu64
                            " expected); %" PRIu64 " bytes after it unchecked\n",
                            path, ix.seg_bytes, segs[i] + ix.n_records, size - ix.seg_bytes);
            }
        }
        /* Where the next segment must start: after this one's records, or (damaged) its name. */
        expected = rc == 0 ? segs[i] + ix.n_records : last ? expected : segs[i + 1];
        if (last || rc != 0)
            continue;
        bill_ledger_index_t disk;
        int lr = bill_ledger_index_load(dir, segs[i], &disk);
        if (lr == 0 && bill__idx_equal(&disk, &ix))
            continue;
        if (lr == 0 && segs[i] + ix.n_records == segs[i + 1] &&
            bill__idx_matches(dir, segs[i], segs[i + 1], &disk)) {
            res->n_problems++;
            if (out != NULL)
                fprintf(out,
                        "INDEX %s/ledger-%020" PRIu64 ".idx: passes the length and last-record "
                        "checks but differs from the segment's data\n",
                        dir, segs[i]);
            continue;
        }
        res->n_index_rebuilt++;
    }
    pc_free(segs);
    return 0;
}

void bill_ledger_reader_free(bill_ledger_reader_t *r)
{
    if (r == NULL)
        return;
    if (r->f != NULL)
        fclose(r->f);
    pc_free(r->segs);
    pc_free(r->dir);
    pc_free(r);
}
