/*
 * ledger_format.c — the ledger's bytes on disk (format documented byte by byte in ledger.h):
 * segment names and headers, record frames, the time-index sidecars, and the default I/O hooks.
 * The writer (ledger_writer.c) and the readers (ledger_reader.c) both go through these functions,
 * so a format change is made here and in ledger.h only.
 */
#include "ledger_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SEG_MAGIC "KVGWLEDG"

static ssize_t io_write(void *ud, int fd, const void *buf, size_t len)
{
    return write(fd, buf, len);
}

static int io_fsync(void *ud, int fd)
{
    return fdatasync(fd);
}
const bill_ledger_io_t bill__ledger_default_io = {io_write, io_fsync, NULL};

int bill__ledger_err_from_errno(int e)
{
    return e == ENOSPC || e == EDQUOT ? PC_ERR_NOSPACE : PC_ERR_IO;
}
bool bill__instance_ok(const char *s)
{
    size_t n = strnlen(s, BILL_STR_MAX);
    if (n == 0 || n >= BILL_STR_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '.' || s[i] == '-'))
            return false;
    return true;
}

void bill__seg_name(char *buf, size_t n, uint64_t first_seq)
{
    snprintf(buf, n, "ledger-%020" PRIu64 ".seg", first_seq);
}

static bool parse_seg_name(const char *name, uint64_t *seq)
{
    if (strlen(name) != 7 + 20 + 4 || strncmp(name, "ledger-", 7) != 0 ||
        strcmp(name + 27, ".seg") != 0)
        return false;
    uint64_t v = 0;
    for (int i = 7; i < 27; i++) {
        if (name[i] < '0' || name[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(name[i] - '0');
    }
    *seq = v;
    return v > 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The first seqs of every segment in dir, ascending. */
int bill__seg_list(const char *dir, uint64_t **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    DIR *d = opendir(dir);
    if (d == NULL)
        return pc_err_from_errno(errno);
    uint64_t *v = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL) {
        uint64_t s;
        if (!parse_seg_name(e->d_name, &s))
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            uint64_t *nv = pc_reallocarray(v, nc, sizeof *nv);
            if (nv == NULL) {
                rc = PC_ERR_NOMEM;
                break;
            }
            v = nv;
            cap = nc;
        }
        v[n++] = s;
    }
    closedir(d);
    if (rc != 0) {
        pc_free(v);
        return rc;
    }
    if (n > 1)
        qsort(v, n, sizeof *v, cmp_u64);
    *out = v;
    *n_out = n;
    return 0;
}
void bill__seg_header(uint8_t h[BILL_LEDGER_SEGMENT_HEADER])
{
    memcpy(h, SEG_MAGIC, 8);
    put_u32(h + 8, BILL__SEG_VERSION);
    put_u32(h + 12, bill_crc32c(0, h, 12));
}

bool bill__seg_header_ok(const uint8_t h[BILL_LEDGER_SEGMENT_HEADER])
{
    uint32_t v = get_u32(h + 8);
    return memcmp(h, SEG_MAGIC, 8) == 0 && v >= 1 && v <= BILL__SEG_VERSION &&
           get_u32(h + 12) == bill_crc32c(0, h, 12);
}

uint32_t bill__seg_header_version(const uint8_t h[BILL_LEDGER_SEGMENT_HEADER])
{
    return get_u32(h + 8);
}

/* ---------------------------------------------------------------------------------------------
 * The time index: one sidecar per sealed segment (format in ledger.h). bill__idx_add folds one
 * record frame into a segment's running index; the writer, the recovery at open and every reader
 * that reads a whole segment build the same one from the same bytes.
 * ------------------------------------------------------------------------------------------- */

#define IDX_MAGIC "KVGWLIDX"
#define IDX_VERSION 1

void bill__idx_init(bill_ledger_index_t *ix, uint64_t first_seq)
{
    *ix = (bill_ledger_index_t){
        .seg_bytes = BILL_LEDGER_SEGMENT_HEADER,
        .first_seq = first_seq,
        .min_start_ms = UINT64_MAX,
    };
}

void bill__idx_add(bill_ledger_index_t *ix, const uint8_t *frame, size_t len, uint64_t start_ms)
{
    /* The records' own CRCs chained: a checksum of every record (each CRC covers its record)
     * at 4 bytes of hashing per record, so the writer and readers do not hash the data twice. */
    ix->seg_crc = bill_crc32c(ix->seg_crc, frame + 4, 4);
    ix->last_off = ix->seg_bytes;
    ix->last_crc = get_u32(frame + 4);
    ix->seg_bytes += len;
    ix->n_records++;
    if (start_ms < ix->min_start_ms)
        ix->min_start_ms = start_ms;
    if (start_ms > ix->max_start_ms)
        ix->max_start_ms = start_ms;
}

bool bill__idx_equal(const bill_ledger_index_t *a, const bill_ledger_index_t *b)
{
    return a->seg_bytes == b->seg_bytes && a->first_seq == b->first_seq &&
           a->n_records == b->n_records && a->min_start_ms == b->min_start_ms &&
           a->max_start_ms == b->max_start_ms && a->last_off == b->last_off &&
           a->last_crc == b->last_crc && a->seg_crc == b->seg_crc;
}

static void idx_encode(const bill_ledger_index_t *ix, uint8_t b[BILL_LEDGER_INDEX_BYTES])
{
    memset(b, 0, BILL_LEDGER_INDEX_BYTES);
    memcpy(b, IDX_MAGIC, 8);
    put_u32(b + 8, IDX_VERSION);
    put_u64le(b + 16, ix->seg_bytes);
    put_u64le(b + 24, ix->first_seq);
    put_u64le(b + 32, ix->n_records);
    put_u64le(b + 40, ix->min_start_ms);
    put_u64le(b + 48, ix->max_start_ms);
    put_u64le(b + 56, ix->last_off);
    put_u32(b + 64, ix->last_crc);
    put_u32(b + 68, ix->seg_crc);
    put_u32(b + 72, bill_crc32c(0, b, 72));
}

static bool idx_decode(const uint8_t b[BILL_LEDGER_INDEX_BYTES], bill_ledger_index_t *ix)
{
    if (memcmp(b, IDX_MAGIC, 8) != 0 || get_u32(b + 8) != IDX_VERSION || get_u32(b + 12) != 0 ||
        get_u32(b + 72) != bill_crc32c(0, b, 72))
        return false;
    *ix = (bill_ledger_index_t){
        .seg_bytes = get_u64le(b + 16),
        .first_seq = get_u64le(b + 24),
        .n_records = get_u64le(b + 32),
        .min_start_ms = get_u64le(b + 40),
        .max_start_ms = get_u64le(b + 48),
        .last_off = get_u64le(b + 56),
        .last_crc = get_u32(b + 64),
        .seg_crc = get_u32(b + 68),
    };
    return true;
}

void bill__idx_name(char *buf, size_t n, uint64_t first_seq)
{
    snprintf(buf, n, "ledger-%020" PRIu64 ".idx", first_seq);
}

/* A temporary sidecar left by a crash: "ledger-<20 digits>.idx.tmp-...". */
bool bill__idx_is_temp(const char *name)
{
    return strncmp(name, "ledger-", 7) == 0 && strlen(name) > 27 + 8 &&
           strncmp(name + 27, ".idx.tmp", 8) == 0;
}

/* Writes the sidecar of segment ix->first_seq into the directory dir_fd, crash-safely: a temporary
 * file with a name of its own (so concurrent writers of the same sidecar never share one) is
 * written and synced, renamed over the sidecar's name, then the directory is synced. A crash at
 * any point leaves the previous sidecar (or none) or the new one, never a partial one: the rename
 * is atomic and only renames synced bytes. On failure the temporary file is removed. io: the
 * ledger's hooks (tests inject failures and crashes there). sync_dir false leaves the directory's
 * sync to the caller (the recovery writes many sidecars, then syncs the directory once). */
int bill__idx_write(int dir_fd, const bill_ledger_io_t *io, const bill_ledger_index_t *ix,
                    bool sync_dir)
{
    static _Atomic unsigned counter;
    char name[64], tmp[128];
    bill__idx_name(name, sizeof name, ix->first_seq);
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld-%u", name, (long)getpid(), atomic_fetch_add(&counter, 1));
    uint8_t b[BILL_LEDGER_INDEX_BYTES];
    idx_encode(ix, b);
    int fd = openat(dir_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return bill__ledger_err_from_errno(errno);
    int rc = 0;
    size_t off = 0;
    while (off < sizeof b) {
        ssize_t w = io->write(io->ud, fd, b + off, sizeof b - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            rc = w < 0 ? bill__ledger_err_from_errno(errno) : PC_ERR_NOSPACE;
            break;
        }
        off += (size_t)w;
    }
    if (rc == 0 && io->fsync(io->ud, fd) != 0)
        rc = bill__ledger_err_from_errno(errno);
    if (close(fd) != 0 && rc == 0)
        rc = bill__ledger_err_from_errno(errno);
    if (rc == 0 && renameat(dir_fd, tmp, dir_fd, name) != 0)
        rc = bill__ledger_err_from_errno(errno);
    if (rc != 0) {
        (void)unlinkat(dir_fd, tmp, 0);
        return rc;
    }
    if (!sync_dir)
        return 0;
    return io->fsync(io->ud, dir_fd) == 0 ? 0 : bill__ledger_err_from_errno(errno);
}

int bill_ledger_index_load(const char *dir, uint64_t first_seq, bill_ledger_index_t *out)
{
    char path[4096], name[64];
    bill__idx_name(name, sizeof name, first_seq);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? PC_ERR_NOTFOUND : pc_err_from_errno(errno);
    uint8_t b[BILL_LEDGER_INDEX_BYTES + 1];
    ssize_t n = read(fd, b, sizeof b);
    close(fd);
    if (n != BILL_LEDGER_INDEX_BYTES || !idx_decode(b, out) || out->first_seq != first_seq)
        return PC_ERR_FORMAT;
    return 0;
}

/* True when ix describes the segment first_seq as it is on disk now, checked without reading the
 * segment: the file's length is ix's, the record count is what the next segment's name says
 * (next_first - first_seq), and the last record's frame header at last_off holds the CRC, the
 * length that ends it exactly at the end of the file and the seq that ix says. A sidecar of an
 * older state of the segment, of another segment, or with a flipped bit fails one of these. */
bool bill__idx_matches(const char *dir, uint64_t first_seq, uint64_t next_first,
                       const bill_ledger_index_t *ix)
{
    if (ix->first_seq != first_seq || next_first < first_seq ||
        ix->n_records != next_first - first_seq)
        return false;
    char path[4096], name[64];
    bill__seg_name(name, sizeof name, first_seq);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    struct stat sb;
    bool ok = fstat(fd, &sb) == 0 && (uint64_t)sb.st_size == ix->seg_bytes;
    if (ok && ix->n_records == 0) {
        ok = ix->seg_bytes == BILL_LEDGER_SEGMENT_HEADER;
    } else if (ok) {
        uint8_t h[BILL_LEDGER_RECORD_HEADER];
        ok = ix->last_off >= BILL_LEDGER_SEGMENT_HEADER &&
             pread(fd, h, sizeof h, (off_t)ix->last_off) == (ssize_t)sizeof h &&
             ix->last_off + BILL_LEDGER_RECORD_HEADER + get_u32(h) == ix->seg_bytes &&
             get_u32(h + 4) == ix->last_crc && get_u64le(h + 12) == next_first - 1;
    }
    close(fd);
    return ok;
}

/* The start_ms of an encoded event (payload layout in ledger.h): after kind, status and the six
 * length-prefixed strings. False when the payload is too short. */
bool bill__payload_start_ms(const uint8_t *p, size_t len, uint64_t *out)
{
    size_t off = 2;
    for (int i = 0; i < 6; i++) {
        if (off >= len)
            return false;
        off += 1 + (size_t)p[off];
    }
    if (off + 8 > len)
        return false;
    *out = get_u64le(p + off);
    return true;
}

/* Reads one record at the stream's position; on BILL__REC_OK fills ev and seq and *rec_len. A
 * record whose CRC matches but whose payload does not decode counts as TORN too (with *bad_payload
 * set): the caller decides whether that is a tail or damage. */
int bill__record_read(FILE *f, bill_event_t *ev, uint64_t *seq, size_t *rec_len, bool *bad_payload,
                      const uint8_t **frame)
{
    static _Thread_local uint8_t buf[BILL_LEDGER_RECORD_HEADER + BILL_LEDGER_MAX_PAYLOAD];
    *bad_payload = false;
    size_t got = fread(buf, 1, BILL_LEDGER_RECORD_HEADER, f);
    if (got == 0)
        return BILL__REC_END;
    if (got < BILL_LEDGER_RECORD_HEADER)
        return BILL__REC_TORN;
    uint32_t len = get_u32(buf);
    if (len == 0 || len > BILL_LEDGER_MAX_PAYLOAD || buf[8] < 1 || buf[8] > BILL__REC_VERSION)
        return BILL__REC_TORN;
    if (fread(buf + BILL_LEDGER_RECORD_HEADER, 1, len, f) != len)
        return BILL__REC_TORN;
    if (get_u32(buf + 4) != bill_crc32c(0, buf + 8, 12 + (size_t)len))
        return BILL__REC_TORN;
    if (bill_event_decode_format(buf + BILL_LEDGER_RECORD_HEADER, len, buf[8], ev) != 0 ||
        buf[9] != ev->kind) {
        *bad_payload = true;
        return BILL__REC_TORN;
    }
    *seq = get_u64le(buf + 12);
    *rec_len = BILL_LEDGER_RECORD_HEADER + len;
    if (frame != NULL)
        *frame = buf;
    return BILL__REC_OK;
}
