/*
 * ledger_writer.c — the ledger's writer: open (lock, INSTANCE, recovery), append and the writer
 * thread, close (format, durability and recovery in ledger.h; the bytes in ledger_format.c).
 *
 * Threads: appenders (the gateway's loop) encode and frame a record, then under the mutex check
 * the duplicate set, take the next seq and add the record to the pending buffer. The one writer
 * thread swaps the pending buffer for an empty one, writes it with one write(2), syncs, publishes
 * durable_seq and calls wake. Only the writer touches the segment file descriptor.
 */
#include "ledger_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

int bill_fsync_parse(const char *s)
{
    if (s == NULL)
        return -1;
    if (strcmp(s, "always") == 0)
        return BILL_FSYNC_ALWAYS;
    if (strcmp(s, "batch") == 0)
        return BILL_FSYNC_BATCH;
    if (strcmp(s, "off") == 0)
        return BILL_FSYNC_OFF;
    return -1;
}

const char *bill_fsync_name(int mode)
{
    switch (mode) {
    case BILL_FSYNC_ALWAYS:
        return "always";
    case BILL_FSYNC_BATCH:
        return "batch";
    case BILL_FSYNC_OFF:
        return "off";
    default:
        return "?";
    }
}

int bill_open_check_parse(const char *s)
{
    if (s == NULL)
        return -1;
    if (strcmp(s, "index") == 0)
        return BILL_OPEN_CHECK_INDEX;
    if (strcmp(s, "full") == 0)
        return BILL_OPEN_CHECK_FULL;
    return -1;
}

const char *bill_open_check_name(int mode)
{
    switch (mode) {
    case BILL_OPEN_CHECK_INDEX:
        return "index";
    case BILL_OPEN_CHECK_FULL:
        return "full";
    default:
        return "?";
    }
}

bill_ledger_params_t bill_ledger_params_default(void)
{
    return (bill_ledger_params_t){
        .dir = "var/ledger",
        .fsync = BILL_FSYNC_BATCH,
        .batch_window_us = 500,
        .segment_bytes = 64u << 20,
        .dedup_window = 1u << 20,
        .max_pending_bytes = 64u << 20,
        .open_check = BILL_OPEN_CHECK_INDEX,
    };
}

/* ---------------------------------------------------------------------------------------------
 * The duplicate set: 128-bit hashes of event ids -> seq, in two generations. Inserts go to the
 * current generation; when it holds dedup_window / 2 ids it becomes the old one and the previous
 * old one is dropped. So at least the last dedup_window / 2 ... dedup_window ids are remembered.
 * (A 128-bit hash collision among a million ids has probability about 2^-88.)
 *
 * Kept specialised rather than a common/pc_u64map: an entry is three words (the 128-bit key and
 * the seq a duplicate reports back), and the map holds one word per key. Keying it by 64 bits
 * would let a false positive (about 2^-25 over a million ids) refuse a real event, and keeping
 * the other words beside it costs an allocation per id or a second array: this flat table of
 * triples is both exact and smaller.
 * ------------------------------------------------------------------------------------------- */

typedef struct idset {
    uint64_t *slots; /* [cap][3]: hash low, hash high, seq; an all-zero hash is an empty slot */
    size_t cap;
    size_t n;
} idset_t;

typedef struct idkey {
    uint64_t lo, hi;
} idkey_t;

static idkey_t id_hash(const char *id)
{
    XXH128_hash_t h = XXH3_128bits(id, strlen(id));
    idkey_t k = {h.low64, h.high64};
    if (k.lo == 0 && k.hi == 0)
        k.lo = 1;
    return k;
}

static uint64_t idset_find(const idset_t *s, idkey_t k)
{
    if (s->cap == 0)
        return 0;
    size_t mask = s->cap - 1;
    for (size_t i = (size_t)k.lo & mask;; i = (i + 1) & mask) {
        const uint64_t *e = &s->slots[i * 3];
        if (e[0] == 0 && e[1] == 0)
            return 0;
        if (e[0] == k.lo && e[1] == k.hi)
            return e[2];
    }
}

static void idset_put(idset_t *s, idkey_t k, uint64_t seq)
{
    size_t mask = s->cap - 1;
    size_t i = (size_t)k.lo & mask;
    while (s->slots[i * 3] != 0 || s->slots[i * 3 + 1] != 0)
        i = (i + 1) & mask;
    s->slots[i * 3] = k.lo;
    s->slots[i * 3 + 1] = k.hi;
    s->slots[i * 3 + 2] = seq;
    s->n++;
}

/* Makes room for one more id (load factor <= 1/2). 0 or PC_ERR_NOMEM (s unchanged). */
static int idset_reserve(idset_t *s)
{
    if ((s->n + 1) * 2 <= s->cap)
        return 0;
    size_t nc = s->cap ? s->cap * 2 : 1024;
    uint64_t *ns = pc_calloc(nc * 3, sizeof *ns);
    if (ns == NULL)
        return PC_ERR_NOMEM;
    idset_t t = {ns, nc, 0};
    for (size_t i = 0; i < s->cap; i++) {
        const uint64_t *e = &s->slots[i * 3];
        if (e[0] != 0 || e[1] != 0)
            idset_put(&t, (idkey_t){e[0], e[1]}, e[2]);
    }
    pc_free(s->slots);
    *s = t;
    return 0;
}

static void idset_free(idset_t *s)
{
    pc_free(s->slots);
    *s = (idset_t){0};
}

/* ---------------------------------------------------------------------------------------------
 * The ledger
 * ------------------------------------------------------------------------------------------- */

struct bill_ledger {
    bill_ledger_params_t p;
    bill_ledger_io_t io;
    char *dir;
    char instance[BILL_STR_MAX];
    char ledger_id[BILL_LEDGER_ID_LEN + 1];
    int dir_fd;
    int lock_fd;
    int seg_fd;
    uint64_t seg_bytes;         /* current segment's size (written and good) */
    uint32_t seg_version;       /* the open segment's header version, at open */
    bill_ledger_index_t cur_ix; /* the current segment's time index so far (writer thread) */
    bool cur_ix_ok;             /* false if a record could not be indexed: write no sidecar */

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* writer: records pending or stop */
    pthread_cond_t done_cv; /* waiters: durable_seq moved or failure */

    /* Under mu. */
    pc_buf_t pending;
    uint64_t pending_last_seq;
    uint64_t pending_since_ns;
    uint64_t next_seq;
    bool stop;
    idset_t ids_cur, ids_old;
    bill_ledger_stats_t st;

    _Atomic uint64_t durable_seq;
    _Atomic int status;
};

static int fsync_dir(bill_ledger_t *l)
{
    return fsync(l->dir_fd) == 0 ? 0 : bill__ledger_err_from_errno(errno);
}

/* Creates the segment whose first record will be first_seq, header synced, and makes it the
 * current one. Called at open and by the writer thread. */
static int create_segment(bill_ledger_t *l, uint64_t first_seq)
{
    char name[64];
    bill__seg_name(name, sizeof name, first_seq);
    int fd = openat(l->dir_fd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return bill__ledger_err_from_errno(errno);
    uint8_t h[BILL_LEDGER_SEGMENT_HEADER];
    bill__seg_header(h);
    size_t off = 0;
    while (off < sizeof h) {
        ssize_t w = l->io.write(l->io.ud, fd, h + off, sizeof h - off);
        if (w <= 0) {
            int e = w < 0 ? bill__ledger_err_from_errno(errno) : PC_ERR_NOSPACE;
            close(fd);
            return e;
        }
        off += (size_t)w;
    }
    if (l->p.fsync != BILL_FSYNC_OFF && l->io.fsync(l->io.ud, fd) != 0) {
        int e = bill__ledger_err_from_errno(errno);
        close(fd);
        return e;
    }
    if (l->p.fsync != BILL_FSYNC_OFF) {
        int rc = fsync_dir(l);
        if (rc != 0) {
            close(fd);
            return rc;
        }
    }
    if (l->seg_fd >= 0)
        close(l->seg_fd);
    l->seg_fd = fd;
    l->seg_bytes = BILL_LEDGER_SEGMENT_HEADER;
    bill__idx_init(&l->cur_ix, first_seq);
    l->cur_ix_ok = true;
    l->st.n_segments++;
    return 0;
}

/* Remembers id -> seq; mu held (or single-threaded at open). */
static int remember_id(bill_ledger_t *l, idkey_t k, uint64_t seq)
{
    if (l->ids_cur.n >= (l->p.dedup_window + 1) / 2) {
        idset_free(&l->ids_old);
        l->ids_old = l->ids_cur;
        l->ids_cur = (idset_t){0};
    }
    int rc = idset_reserve(&l->ids_cur);
    if (rc != 0)
        return rc;
    idset_put(&l->ids_cur, k, seq);
    return 0;
}

static uint64_t lookup_id(const bill_ledger_t *l, idkey_t k)
{
    uint64_t s = idset_find(&l->ids_cur, k);
    return s != 0 ? s : idset_find(&l->ids_old, k);
}

/* The ids of the last segment's records, read before the sealed segments (the duplicate set must
 * get them after the older ones, in seq order). */
typedef struct idvec {
    uint64_t *v; /* [n][3]: hash low, hash high, seq */
    size_t n, cap;
} idvec_t;

static int idvec_push(idvec_t *iv, idkey_t k, uint64_t seq)
{
    if (iv->n == iv->cap) {
        size_t nc = iv->cap ? iv->cap * 2 : 1024;
        uint64_t *nv = pc_reallocarray(iv->v, nc * 3, sizeof *nv);
        if (nv == NULL)
            return PC_ERR_NOMEM;
        iv->v = nv;
        iv->cap = nc;
    }
    iv->v[iv->n * 3] = k.lo;
    iv->v[iv->n * 3 + 1] = k.hi;
    iv->v[iv->n * 3 + 2] = seq;
    iv->n++;
    return 0;
}

/* Scans one segment at open: checks it and rebuilds the segment's time index (*ix, from its good
 * records). The ids of records with seq >= remember_from go into the duplicate set, or into
 * *collect when it is not NULL. *next_seq is the seq the segment's first record must have, and
 * becomes the one after its last. For the last segment a torn tail is truncated; elsewhere it is
 * an error. */
static int recover_segment(bill_ledger_t *l, uint64_t first, bool last, uint64_t *next_seq,
                           uint64_t remember_from, idvec_t *collect, bill_ledger_index_t *ix,
                           char *err, size_t err_len)
{
    bill__idx_init(ix, first);
    char name[64];
    bill__seg_name(name, sizeof name, first);
    int fd = openat(l->dir_fd, name, (last ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (fd < 0)
        return pc_err_setf(err, err_len, pc_err_from_errno(errno), "ledger: cannot open %s/%s: %s",
                           l->dir, name, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return pc_err_setf(err, err_len, PC_ERR_IO, "ledger: cannot stat %s/%s", l->dir, name);
    }
    if (first != *next_seq) {
        close(fd);
        return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                           "ledger: segment %s/%s should start at seq %" PRIu64, l->dir, name,
                           *next_seq);
    }
    int dfd = dup(fd);
    FILE *f = dfd >= 0 ? fdopen(dfd, "rb") : NULL;
    if (f == NULL) {
        if (dfd >= 0)
            close(dfd);
        close(fd);
        return PC_ERR_NOMEM;
    }
    int rc = 0;
    uint8_t h[BILL_LEDGER_SEGMENT_HEADER];
    uint64_t good = 0; /* bytes of the file known good */
    size_t got = fread(h, 1, sizeof h, f);
    if (got < sizeof h || !bill__seg_header_ok(h)) {
        /* A header is synced before any record is written, so a bad header with nothing after it
         * is a crash during creation: rewrite it. With data after it, it is damage. */
        if (!last || sb.st_size > BILL_LEDGER_SEGMENT_HEADER) {
            rc = pc_err_setf(err, err_len, PC_ERR_FORMAT, "ledger: %s/%s: bad segment header",
                             l->dir, name);
            goto done;
        }
        bill__seg_header(h);
        if (ftruncate(fd, 0) != 0 || pwrite(fd, h, sizeof h, 0) != (ssize_t)sizeof h ||
            fdatasync(fd) != 0) {
            rc = pc_err_setf(err, err_len, bill__ledger_err_from_errno(errno),
                             "ledger: cannot rewrite the header of %s/%s: %s", l->dir, name,
                             strerror(errno));
            goto done;
        }
        l->st.torn_bytes_truncated += (uint64_t)sb.st_size;
        l->seg_version = BILL__SEG_VERSION;
        good = sizeof h;
        goto done;
    }
    good = sizeof h;
    if (last)
        l->seg_version = bill__seg_header_version(h);
    bill_event_t ev;
    for (;;) {
        uint64_t seq;
        size_t len;
        bool bad_payload;
        const uint8_t *frame;
        int r = bill__record_read(f, &ev, &seq, &len, &bad_payload, &frame);
        if (r == BILL__REC_END)
            break;
        if (r == BILL__REC_TORN || seq != *next_seq) {
            if (!last || bad_payload || r == BILL__REC_OK) {
                rc = pc_err_setf(err, err_len, PC_ERR_FORMAT,
                                 "ledger: %s/%s is damaged at byte %" PRIu64 " (seq %" PRIu64
                                 "); not a torn tail, refusing to guess",
                                 l->dir, name, good, *next_seq);
                goto done;
            }
            /* The torn tail of a crash: cut it off. */
            if (ftruncate(fd, (off_t)good) != 0 || fdatasync(fd) != 0) {
                rc = pc_err_setf(err, err_len, bill__ledger_err_from_errno(errno),
                                 "ledger: cannot truncate the torn tail of %s/%s: %s", l->dir, name,
                                 strerror(errno));
                goto done;
            }
            l->st.torn_bytes_truncated += (uint64_t)sb.st_size - good;
            PC_LOG(PC_LOG_WARN, "ledger",
                   "%s/%s: truncated a torn tail of %" PRIu64 " bytes after seq %" PRIu64, l->dir,
                   name, (uint64_t)sb.st_size - good, *next_seq - 1);
            break;
        }
        bill__idx_add(ix, frame, len, ev.start_ms);
        if (collect != NULL)
            rc = idvec_push(collect, id_hash(ev.event_id), seq);
        else if (seq >= remember_from)
            rc = remember_id(l, id_hash(ev.event_id), seq);
        if (rc != 0)
            goto done;
        good += len;
        (*next_seq)++;
    }
done:
    fclose(f);
    l->st.open_bytes_read += good;
    l->st.open_segments_read++;
    if (rc == 0 && last) {
        if (lseek(fd, (off_t)good, SEEK_SET) < 0) {
            rc = PC_ERR_IO;
        } else {
            l->seg_fd = fd;
            l->seg_bytes = good;
            fd = -1;
        }
    }
    if (fd >= 0)
        close(fd);
    return rc;
}

/* Writes INSTANCE (the given id, or 16 random hex digits) atomically: temp file, sync, rename. */
static int write_instance(bill_ledger_t *l, const char *want)
{
    char txt[BILL_STR_MAX + 1];
    if (want != NULL) {
        snprintf(txt, sizeof txt, "%s\n", want);
    } else {
        uint64_t r;
        if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
            return PC_ERR_IO;
        snprintf(txt, sizeof txt, "%016" PRIx64 "\n", r);
    }
    size_t n = strlen(txt);
    int fd = openat(l->dir_fd, "INSTANCE.tmp", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return bill__ledger_err_from_errno(errno);
    bool ok = write(fd, txt, n) == (ssize_t)n && fsync(fd) == 0;
    close(fd);
    if (!ok || renameat(l->dir_fd, "INSTANCE.tmp", l->dir_fd, "INSTANCE") != 0)
        return bill__ledger_err_from_errno(errno);
    memcpy(l->instance, txt, n - 1);
    l->instance[n - 1] = '\0';
    return fsync_dir(l);
}

/* Writes LEDGER_ID (32 random hex digits) atomically, as INSTANCE. */
static int write_ledger_id(bill_ledger_t *l)
{
    uint8_t b[BILL_LEDGER_ID_LEN / 2];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b)
        return PC_ERR_IO;
    char txt[BILL_LEDGER_ID_LEN + 2];
    for (size_t i = 0; i < sizeof b; i++)
        snprintf(txt + 2 * i, 3, "%02x", b[i]);
    txt[BILL_LEDGER_ID_LEN] = '\n';
    txt[BILL_LEDGER_ID_LEN + 1] = '\0';
    int fd = openat(l->dir_fd, "LEDGER_ID.tmp", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return bill__ledger_err_from_errno(errno);
    bool ok = write(fd, txt, BILL_LEDGER_ID_LEN + 1) == BILL_LEDGER_ID_LEN + 1 && fsync(fd) == 0;
    close(fd);
    if (!ok || renameat(l->dir_fd, "LEDGER_ID.tmp", l->dir_fd, "LEDGER_ID") != 0)
        return bill__ledger_err_from_errno(errno);
    memcpy(l->ledger_id, txt, BILL_LEDGER_ID_LEN);
    l->ledger_id[BILL_LEDGER_ID_LEN] = '\0';
    return fsync_dir(l);
}

int bill_ledger_read_id(const char *dir, char out[BILL_LEDGER_ID_LEN + 1])
{
    char path[4096];
    snprintf(path, sizeof path, "%s/LEDGER_ID", dir);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return PC_ERR_NOTFOUND;
    char buf[BILL_LEDGER_ID_LEN + 4] = "";
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    if (n != BILL_LEDGER_ID_LEN + 1 || buf[BILL_LEDGER_ID_LEN] != '\n')
        return PC_ERR_FORMAT;
    for (size_t i = 0; i < BILL_LEDGER_ID_LEN; i++)
        if (!((buf[i] >= '0' && buf[i] <= '9') || (buf[i] >= 'a' && buf[i] <= 'f')))
            return PC_ERR_FORMAT;
    memcpy(out, buf, BILL_LEDGER_ID_LEN);
    out[BILL_LEDGER_ID_LEN] = '\0';
    return 0;
}

int bill_ledger_read_instance(const char *dir, char out[BILL_STR_MAX])
{
    char path[4096];
    snprintf(path, sizeof path, "%s/INSTANCE", dir);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return PC_ERR_NOTFOUND;
    char buf[BILL_STR_MAX + 2] = "";
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    if (n > 0 && buf[n - 1] == '\n')
        buf[--n] = '\0';
    if (!bill__instance_ok(buf))
        return PC_ERR_FORMAT;
    memcpy(out, buf, n + 1);
    return 0;
}

/* After the recovery read segment ix->first_seq: a sealed segment gets its sidecar written when
 * it is missing or says anything else than the data (the data wins); the last segment, which
 * appends continue, must have none (one left there would go stale at the next append). Failures
 * only log: exports then scan that segment, and the next open tries again. Returns true when it
 * renamed a sidecar into place (the caller syncs the directory once for all of them). */
static bool reconcile_index(bill_ledger_t *l, const bill_ledger_index_t *ix, bool last)
{
    char name[64];
    bill__idx_name(name, sizeof name, ix->first_seq);
    if (last) {
        if (unlinkat(l->dir_fd, name, 0) == 0)
            PC_LOG(PC_LOG_INFO, "ledger", "%s/%s: removed the sidecar of the open segment", l->dir,
                   name);
        return false;
    }
    bill_ledger_index_t disk;
    int rc = bill_ledger_index_load(l->dir, ix->first_seq, &disk);
    if (rc == 0 && bill__idx_equal(&disk, ix))
        return false;
    if (rc != PC_ERR_NOTFOUND)
        PC_LOG(PC_LOG_WARN, "ledger", "%s/%s is %s; rewriting it from the segment's data", l->dir,
               name, rc == 0 ? "wrong" : "corrupt");
    rc = bill__idx_write(l->dir_fd, &l->io, ix, false);
    if (rc != 0)
        PC_LOG(PC_LOG_WARN, "ledger",
               "cannot write %s/%s (%s); exports will read that whole segment", l->dir, name,
               pc_strerror(rc));
    return rc == 0;
}

/* Removes the temporary sidecars a crash left behind (never renamed: nothing refers to them). */
static void remove_index_temps(bill_ledger_t *l)
{
    DIR *d = opendir(l->dir);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (bill__idx_is_temp(e->d_name))
            (void)unlinkat(l->dir_fd, e->d_name, 0);
    closedir(d);
}

/* The recovery at open (Recovery on open and Duplicates in ledger.h): reads the last segment
 * (truncating a torn tail), then the sealed segments that have no valid sidecar or hold a record
 * the duplicate set is rebuilt from, in seq order; skips the others. *next_out gets the seq the
 * next record will have. segs: the segments' first seqs, ascending (n > 0). */
static int recover_segments(bill_ledger_t *l, const uint64_t *segs, size_t n, uint64_t *next_out,
                            char *err, size_t err_len)
{
    bool full = l->p.open_check == BILL_OPEN_CHECK_FULL;
    idvec_t tail = {0};
    bool *indexed = pc_calloc(n, sizeof *indexed);
    if (indexed == NULL)
        return PC_ERR_NOMEM;
    /* Which sealed segments their sidecar can stand for (a small read and a stat each). */
    for (size_t i = 0; !full && i + 1 < n; i++) {
        bill_ledger_index_t ix;
        indexed[i] = bill_ledger_index_load(l->dir, segs[i], &ix) == 0 &&
                     bill__idx_matches(l->dir, segs[i], segs[i + 1], &ix);
        if (!indexed[i])
            l->st.open_index_bad++;
    }
    /* The last segment first: its end says how many records the ledger holds, hence where the
     * duplicate set's records start. Its ids wait in tail until the older ones are in. */
    bill_ledger_index_t ix;
    uint64_t next_last = segs[n - 1];
    int rc = recover_segment(l, segs[n - 1], true, &next_last, 0, &tail, &ix, err, err_len);
    if (rc != 0)
        goto out;
    (void)reconcile_index(l, &ix, true);
    l->cur_ix = ix;
    l->cur_ix_ok = true;
    /* A recovery inserting every record from segs[0] on would end with the generations holding
     * records [K h, N) and [(K - 1) h, K h) (K = (N - 1) / h): start there with empty sets. */
    uint64_t h = (l->p.dedup_window + 1) / 2, total = next_last - segs[0], from = segs[0];
    if (total > 0 && (total - 1) / h >= 1)
        from = segs[0] + ((total - 1) / h - 1) * h;
    if (full)
        from = segs[0]; /* every record, as the recovery always did: the reference */
    l->st.open_dedup_from = from;
    uint64_t next = segs[0];
    bool sidecars_written = false;
    for (size_t i = 0; i + 1 < n; i++) {
        if (indexed[i] && segs[i] == next && segs[i + 1] <= from) {
            next = segs[i + 1]; /* bill__idx_matches checked the count against the names */
            l->st.open_segments_skipped++;
            continue;
        }
        rc = recover_segment(l, segs[i], false, &next, from, NULL, &ix, err, err_len);
        if (rc != 0)
            goto out;
        sidecars_written |= reconcile_index(l, &ix, false);
    }
    if (sidecars_written && l->io.fsync(l->io.ud, l->dir_fd) != 0)
        PC_LOG(PC_LOG_WARN, "ledger", "cannot sync %s after writing time-index sidecars: %s",
               l->dir, strerror(errno));
    if (next != segs[n - 1]) {
        char name[64];
        bill__seg_name(name, sizeof name, segs[n - 1]);
        rc = pc_err_setf(err, err_len, PC_ERR_FORMAT,
                         "ledger: segment %s/%s should start at seq %" PRIu64, l->dir, name, next);
        goto out;
    }
    for (size_t i = 0; i < tail.n; i++) {
        if (tail.v[i * 3 + 2] < from)
            continue; /* the window starts inside the last segment */
        rc = remember_id(l, (idkey_t){tail.v[i * 3], tail.v[i * 3 + 1]}, tail.v[i * 3 + 2]);
        if (rc != 0)
            goto out;
    }
    *next_out = next_last;
out:
    pc_free(tail.v);
    pc_free(indexed);
    return rc;
}

static void *writer_main(void *arg);
static void seal_index(bill_ledger_t *l, const bill_ledger_index_t *ix);

int bill_ledger_open(const bill_ledger_params_t *p, bill_ledger_t **out, char *err, size_t err_len)
{
    *out = NULL;
    if (p == NULL || p->dir == NULL || p->dir[0] == '\0' || p->fsync > BILL_FSYNC_OFF ||
        p->open_check > BILL_OPEN_CHECK_FULL || p->segment_bytes < 4096 || p->dedup_window == 0 ||
        p->max_pending_bytes < 65536)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "ledger: bad parameters (dir required, segment_bytes >= 4096, "
                           "max_pending_bytes >= 65536)");
    bill_ledger_t *l = pc_calloc(1, sizeof *l);
    if (l == NULL)
        return PC_ERR_NOMEM;
    uint64_t *segs = NULL;
    size_t n_segs = 0;
    int rc = 0;
    l->p = *p;
    l->io = p->io != NULL ? *p->io : bill__ledger_default_io;
    l->dir_fd = l->lock_fd = l->seg_fd = -1;
    l->dir = pc_strdup(p->dir);
    l->p.dir = l->dir;
    l->p.io = NULL;
    if (l->dir == NULL) {
        rc = PC_ERR_NOMEM;
        goto fail;
    }
    pthread_mutex_init(&l->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->cv, &ca);
    pthread_cond_init(&l->done_cv, &ca);
    pthread_condattr_destroy(&ca);

    if (mkdir(l->dir, 0755) != 0 && errno != EEXIST) {
        rc = pc_err_setf(err, err_len, pc_err_from_errno(errno), "ledger: cannot create %s: %s",
                         l->dir, strerror(errno));
        goto fail;
    }
    l->dir_fd = open(l->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (l->dir_fd < 0) {
        rc = pc_err_setf(err, err_len, pc_err_from_errno(errno), "ledger: cannot open %s: %s",
                         l->dir, strerror(errno));
        goto fail;
    }
    l->lock_fd = openat(l->dir_fd, "LOCK", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (l->lock_fd < 0 || flock(l->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        rc = pc_err_setf(err, err_len, e == EWOULDBLOCK ? PC_ERR_BUSY : pc_err_from_errno(e),
                         "ledger: %s is in use by another process (%s)", l->dir, strerror(e));
        goto fail;
    }
    if (p->instance != NULL && !bill__instance_ok(p->instance)) {
        rc = pc_err_setf(err, err_len, PC_ERR_INVAL,
                         "ledger: instance id '%s' must be 1-63 characters of A-Z a-z 0-9 _ . -",
                         p->instance);
        goto fail;
    }
    rc = bill_ledger_read_instance(l->dir, l->instance);
    if (rc == PC_ERR_NOTFOUND)
        rc = write_instance(l, p->instance);
    if (rc != 0) {
        rc = pc_err_setf(err, err_len, rc, "ledger: bad or unwritable %s/INSTANCE", l->dir);
        goto fail;
    }
    if (p->instance != NULL && strcmp(p->instance, l->instance) != 0) {
        rc = pc_err_setf(err, err_len, PC_ERR_STATE,
                         "ledger: %s belongs to instance '%s', not '%s' (each gateway instance "
                         "needs its own ledger directory)",
                         l->dir, l->instance, p->instance);
        goto fail;
    }
    rc = bill_ledger_read_id(l->dir, l->ledger_id);
    if (rc == PC_ERR_NOTFOUND) /* a new ledger, or one made before LEDGER_ID existed */
        rc = write_ledger_id(l);
    if (rc != 0) {
        rc = pc_err_setf(err, err_len, rc, "ledger: bad or unwritable %s/LEDGER_ID", l->dir);
        goto fail;
    }
    rc = bill__seg_list(l->dir, &segs, &n_segs);
    if (rc != 0) {
        rc = pc_err_setf(err, err_len, rc, "ledger: cannot list %s", l->dir);
        goto fail;
    }
    uint64_t next = 1;
    remove_index_temps(l);
    if (n_segs > 0) {
        rc = recover_segments(l, segs, n_segs, &next, err, err_len);
        if (rc != 0)
            goto fail;
    }
    l->st.n_segments = n_segs;
    if (n_segs == 0) {
        rc = create_segment(l, 1);
        if (rc != 0) {
            rc = pc_err_setf(err, err_len, rc, "ledger: cannot create the first segment in %s",
                             l->dir);
            goto fail;
        }
    } else if (l->seg_version < BILL__SEG_VERSION) {
        /* An older format's open segment: seal it and go on in a current one (ledger.h,
         * Versions). One without records is rewritten under its own name. */
        bool has_records = next > segs[n_segs - 1];
        bill_ledger_index_t sealed = l->cur_ix;
        bool sealed_ok = has_records && l->cur_ix_ok && sealed.seg_bytes == l->seg_bytes;
        rc = create_segment(l, next);
        if (rc != 0) {
            rc = pc_err_setf(err, err_len, rc,
                             "ledger: cannot start a version-%d segment in %s after the older "
                             "format's segment",
                             BILL__SEG_VERSION, l->dir);
            goto fail;
        }
        if (!has_records)
            l->st.n_segments--; /* the same file, rewritten */
        if (sealed_ok)
            seal_index(l, &sealed);
        PC_LOG(PC_LOG_INFO, "ledger",
               "%s: segment format %u sealed, appending to a version-%d "
               "segment from seq %" PRIu64,
               l->dir, l->seg_version, BILL__SEG_VERSION, next);
        l->seg_version = BILL__SEG_VERSION;
    }
    l->next_seq = next;
    atomic_store(&l->durable_seq, next - 1);
    if (pthread_create(&l->thread, NULL, writer_main, l) != 0) {
        rc = pc_err_setf(err, err_len, PC_ERR_NOMEM, "ledger: cannot start the writer thread");
        goto fail;
    }
    l->thread_started = true;
    pc_free(segs);
    *out = l;
    return 0;
fail:
    pc_free(segs);
    bill_ledger_close(l);
    return rc;
}

int bill_ledger_append(bill_ledger_t *l, const bill_event_t *ev, uint64_t *seq_out)
{
    uint8_t rec[BILL_LEDGER_RECORD_HEADER + BILL_EVENT_MAX_ENCODED];
    if (bill_event_validate(ev, NULL, 0) != 0)
        return PC_ERR_INVAL;
    size_t n = bill_event_encode(ev, rec + BILL_LEDGER_RECORD_HEADER);
    size_t rec_len = BILL_LEDGER_RECORD_HEADER + n;
    put_u32(rec, (uint32_t)n);
    rec[8] = BILL__REC_VERSION;
    rec[9] = ev->kind;
    rec[10] = rec[11] = 0;
    idkey_t k = id_hash(ev->event_id);
    bool zero_cost = ev->kind == BILL_EVENT_USAGE && bill_event_quantity(ev) > 0 &&
                     bill_event_total_nusd(ev) == 0;

    pthread_mutex_lock(&l->mu);
    int rc = atomic_load(&l->status);
    if (rc != 0)
        goto out;
    if (l->stop) {
        rc = PC_ERR_STATE;
        goto out;
    }
    uint64_t prev = lookup_id(l, k);
    if (prev != 0) {
        l->st.n_duplicates++;
        *seq_out = prev;
        rc = 1;
        goto out;
    }
    if (l->pending.len + rec_len > l->p.max_pending_bytes) {
        rc = PC_ERR_OVERLOADED;
        goto out;
    }
    uint64_t seq = l->next_seq;
    put_u64le(rec + 12, seq);
    put_u32(rec + 4, bill_crc32c(0, rec + 8, 12 + n));
    bool was_empty = l->pending.len == 0;
    rc = pc_buf_append(&l->pending, rec, rec_len);
    if (rc != 0)
        goto out;
    rc = remember_id(l, k, seq);
    if (rc != 0) {
        l->pending.len -= rec_len; /* roll back: nothing appended */
        goto out;
    }
    l->next_seq++;
    l->pending_last_seq = seq;
    l->st.n_appended++;
    if (zero_cost)
        l->st.n_zero_cost++;
    if (was_empty) {
        l->pending_since_ns = pc_time_mono_ns();
        pthread_cond_signal(&l->cv);
    }
    *seq_out = seq;
out:
    pthread_mutex_unlock(&l->mu);
    if (zero_cost && rc == 0)
        PC_LOG(PC_LOG_WARN, "ledger",
               "event %s (tenant %s, model %s) has tokens but costs 0: check the price table",
               ev->event_id, ev->tenant, ev->model);
    return rc;
}

/* Writes buf to the current segment. 0 or the error (the segment is cut back to its last good
 * size, best effort, so a later reopen finds no partial batch either way). */
static int write_batch(bill_ledger_t *l, const char *buf, size_t len)
{
    size_t off = 0;
    while (off < len) {
        ssize_t w = l->io.write(l->io.ud, l->seg_fd, buf + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            PC_LOG(PC_LOG_ERROR, "ledger", "write to %s failed: %s; the ledger stops accepting",
                   l->dir, strerror(e));
            if (ftruncate(l->seg_fd, (off_t)l->seg_bytes) == 0)
                (void)lseek(l->seg_fd, (off_t)l->seg_bytes, SEEK_SET);
            return bill__ledger_err_from_errno(e);
        }
        off += (size_t)w;
    }
    if (l->p.fsync != BILL_FSYNC_OFF && l->io.fsync(l->io.ud, l->seg_fd) != 0) {
        /* After a failed fsync the page cache may have dropped the dirty pages: never retry and
         * pretend (PostgreSQL's fsyncgate); the ledger is failed until reopened. */
        int e = errno;
        PC_LOG(PC_LOG_ERROR, "ledger", "fsync of %s failed: %s; the ledger stops accepting", l->dir,
               strerror(e));
        return bill__ledger_err_from_errno(e);
    }
    l->seg_bytes += len;
    return 0;
}

/* Folds the records of a batch just written into the current segment's index (writer thread). */
static void index_batch(bill_ledger_t *l, const uint8_t *p, size_t len)
{
    size_t off = 0;
    while (l->cur_ix_ok && off + BILL_LEDGER_RECORD_HEADER <= len) {
        size_t n = get_u32(p + off);
        uint64_t start_ms;
        if (off + BILL_LEDGER_RECORD_HEADER + n > len ||
            !bill__payload_start_ms(p + off + BILL_LEDGER_RECORD_HEADER, n, &start_ms)) {
            l->cur_ix_ok = false; /* cannot happen: the appenders framed it */
            break;
        }
        bill__idx_add(&l->cur_ix, p + off, BILL_LEDGER_RECORD_HEADER + n, start_ms);
        off += BILL_LEDGER_RECORD_HEADER + n;
    }
}

/* Writes the sidecar of a segment just sealed by rotation. The ledger does not depend on it: a
 * failure (disk full) only logs, exports then read that segment whole, and the next open or an
 * export that reads it writes it again. */
static void seal_index(bill_ledger_t *l, const bill_ledger_index_t *ix)
{
    int rc = bill__idx_write(l->dir_fd, &l->io, ix, true);
    if (rc != 0) {
        char name[64];
        bill__idx_name(name, sizeof name, ix->first_seq);
        PC_LOG(PC_LOG_WARN, "ledger", "cannot write %s/%s (%s); exports will read that segment",
               l->dir, name, pc_strerror(rc));
    }
}

static void *writer_main(void *arg)
{
    bill_ledger_t *l = arg;
    pc_buf_t batch = PC_BUF_INIT;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (l->pending.len == 0 && !l->stop)
            pthread_cond_wait(&l->cv, &l->mu);
        if (l->pending.len == 0)
            break; /* stopping, nothing left */
        if (l->p.fsync == BILL_FSYNC_BATCH && !l->stop) {
            uint64_t deadline = l->pending_since_ns + (uint64_t)l->p.batch_window_us * 1000u;
            struct timespec ts = {(time_t)(deadline / 1000000000u), (long)(deadline % 1000000000u)};
            while (!l->stop && pc_time_mono_ns() < deadline)
                if (pthread_cond_timedwait(&l->cv, &l->mu, &ts) == ETIMEDOUT)
                    break;
        }
        pc_buf_t t = l->pending;
        l->pending = batch;
        l->pending.len = 0;
        batch = t;
        uint64_t last = l->pending_last_seq;
        pthread_mutex_unlock(&l->mu);

        size_t n_bytes = batch.len;
        int rc = write_batch(l, batch.base, n_bytes);
        if (rc == 0)
            index_batch(l, (const uint8_t *)batch.base, n_bytes);
        batch.len = 0;
        if (rc == 0) {
            atomic_store(&l->durable_seq, last);
            if (l->seg_bytes >= l->p.segment_bytes) {
                bill_ledger_index_t sealed = l->cur_ix;
                bool sealed_ok = l->cur_ix_ok && sealed.seg_bytes == l->seg_bytes;
                rc = create_segment(l, last + 1);
                if (rc == 0 && sealed_ok)
                    seal_index(l, &sealed);
            }
        }
        pthread_mutex_lock(&l->mu);
        if (rc == 0) {
            l->st.bytes_written += n_bytes;
            if (l->p.fsync != BILL_FSYNC_OFF)
                l->st.n_syncs++;
        } else {
            atomic_store(&l->status, rc);
        }
        pthread_cond_broadcast(&l->done_cv);
        pthread_mutex_unlock(&l->mu);
        if (l->p.wake != NULL)
            l->p.wake(l->p.wake_ud);
        pthread_mutex_lock(&l->mu);
        if (rc != 0)
            break;
    }
    pthread_mutex_unlock(&l->mu);
    pc_buf_free(&batch);
    return NULL;
}

uint64_t bill_ledger_durable_seq(bill_ledger_t *l)
{
    return atomic_load(&l->durable_seq);
}

int bill_ledger_status(bill_ledger_t *l)
{
    return atomic_load(&l->status);
}

int bill_ledger_wait_durable(bill_ledger_t *l, uint64_t seq)
{
    pthread_mutex_lock(&l->mu);
    while (atomic_load(&l->durable_seq) < seq && atomic_load(&l->status) == 0)
        pthread_cond_wait(&l->done_cv, &l->mu);
    int rc = atomic_load(&l->durable_seq) >= seq ? 0 : atomic_load(&l->status);
    pthread_mutex_unlock(&l->mu);
    return rc;
}

const char *bill_ledger_instance(const bill_ledger_t *l)
{
    return l->instance;
}

void bill_ledger_stats(bill_ledger_t *l, bill_ledger_stats_t *out)
{
    pthread_mutex_lock(&l->mu);
    *out = l->st;
    out->next_seq = l->next_seq;
    out->durable_seq = atomic_load(&l->durable_seq);
    out->status = atomic_load(&l->status);
    pthread_mutex_unlock(&l->mu);
}

int bill_ledger_close(bill_ledger_t *l)
{
    if (l == NULL)
        return 0;
    int rc = 0;
    if (l->thread_started) {
        pthread_mutex_lock(&l->mu);
        l->stop = true;
        pthread_cond_signal(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
        rc = atomic_load(&l->status);
        if (rc == 0 && atomic_load(&l->durable_seq) + 1 < l->next_seq)
            rc = PC_ERR_IO;
    }
    if (l->seg_fd >= 0)
        close(l->seg_fd);
    if (l->lock_fd >= 0)
        close(l->lock_fd); /* releases the flock */
    if (l->dir_fd >= 0)
        close(l->dir_fd);
    if (l->dir != NULL) {
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv);
        pthread_cond_destroy(&l->done_cv);
    }
    idset_free(&l->ids_cur);
    idset_free(&l->ids_old);
    pc_buf_free(&l->pending);
    pc_free(l->dir);
    pc_free(l);
    return rc;
}
