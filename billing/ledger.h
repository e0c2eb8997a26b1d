/*
 * ledger.h — the usage ledger: an append-only, crash-safe log of billing events (a WAL).
 *
 * The ledger is the source of truth for money: Redis and every export are views of it. The
 * gateway's event loop appends (a copy, never a wait on disk); one writer thread per ledger does
 * all I/O with group commit; the loop learns what is durable through a wake callback and
 * bill_ledger_durable_seq, and sends a response's final bytes only after its event is durable.
 *
 *   bill_ledger_params_t lp = bill_ledger_params_default();
 *   lp.dir = "var/ledger"; lp.fsync = BILL_FSYNC_BATCH; lp.wake = on_wake; lp.wake_ud = async;
 *   bill_ledger_t *l;  bill_ledger_open(&lp, &l, err, sizeof err);   // recovers, then starts
 *   uint64_t seq;      rc = bill_ledger_append(l, &ev, &seq);         // loop thread
 *   ... on wake: if (bill_ledger_durable_seq(l) >= seq) send the final bytes;
 *                if (bill_ledger_status(l) != 0) stop accepting billable work.
 *   bill_ledger_close(l);                                             // flushes, joins
 *
 * The code is in three files that change for different reasons: ledger_format.c (the bytes
 * documented below), ledger_writer.c (open and recovery, append, the writer thread) and
 * ledger_reader.c (the reader, the index scan, the check); ledger_internal.h is what they share.
 *
 * Directory layout: <dir>/ledger-<first seq, 20 decimal digits>.seg segment files, <dir>/LOCK
 * (flock'ed by the one process that has the ledger open), <dir>/INSTANCE (the instance id,
 * written once: names this ledger's Redis stream and cursor) and <dir>/LEDGER_ID (32 random hex
 * digits written when the ledger is created, or at the first open of a ledger made before it
 * existed: this ledger's identity, which the shipper ties its Redis cursor to, so that a new
 * ledger under an old instance id is never mistaken for the one that shipped).
 *
 * Sequence numbers. Every record has a seq: 1 for the first record ever, then +1 per record,
 * across segments, never reused. It is the record's ledger position (Redis stream ids and the
 * shipper's cursor are derived from it). A segment's name is the seq of its first record.
 *
 * Segment file format (all integers little-endian):
 *
 *   segment header, 16 bytes:
 *     0   8  magic "KVGWLEDG"
 *     8   4  segment format version: 2 (1 in ledgers written before the registry field)
 *     12  4  CRC32C of bytes 0..12
 *   then records, back to back until the end of the file:
 *     0   4  payload length N (1 .. BILL_LEDGER_MAX_PAYLOAD)
 *     4   4  CRC32C of bytes 8 .. 20+N (version, kind, reserved, seq and payload)
 *     8   1  record format version: the payload's format (BILL_EVENT_FORMAT), 2; 1 in older
 *              records (their payload lacks the last byte below and reads as registry none)
 *     9   1  record kind: 1 usage event, 2 storage event (the same as payload byte 0)
 *     10  2  reserved, 0
 *     12  8  seq
 *     20  N  payload: the event (bill_event_encode):
 *              0  1  kind (enum bill_event_kind)
 *              1  1  status (enum bill_status; 0 for storage)
 *              2  .  six strings, each a 1-byte length L (0..63) then L bytes, no NUL:
 *                    event_id, request_id, tenant, api_key_id, model, ns
 *              .  8  start_ms (UTC ms; storage: window start)
 *              .  8  end_ms (UTC ms; storage: window end)
 *              .  8  tokens uncached input
 *              .  8  tokens cache write 5m
 *              .  8  tokens cache write 1h
 *              .  8  tokens cache read
 *              .  8  tokens output
 *              .  8  logical hit tokens
 *              .  8  physical hit tokens
 *              .  8  token_ms (storage)
 *              .  48 cost in nano-USD of each bucket: uncached, write 5m, write 1h, read,
 *                    output, storage (6 x 8)
 *              .  1  registry (enum bill_registry), record format 2 only
 *
 * Versions. Readers (this code) read both record formats, in segments of either version. The
 * writer appends format-2 records only to a version-2 segment: at open, when the last segment is
 * a version-1 one, it is sealed and a new segment starts (an empty one is rewritten in place).
 * So a ledger that holds a format-2 record has a version-2 segment after it, which an older kvgw
 * refuses to open ("bad segment header") instead of taking the records it cannot read for a
 * torn tail and cutting them; downgrading after an upgrade needs the ledger exported first.
 *
 * Time index: one sidecar file <dir>/ledger-<first seq, 20 digits>.idx per sealed segment (one
 * that a later segment follows), so an export over [from, to) reads only the segments that can
 * hold an event whose start_ms is in the range. 76 bytes, little-endian:
 *     0   8  magic "KVGWLIDX"
 *     8   4  index format version, 1
 *     12  4  reserved, 0
 *     16  8  the segment's length in bytes when indexed (header included)
 *     24  8  the segment's first seq (its name)
 *     32  8  record count
 *     40  8  smallest start_ms of its events (UINT64_MAX when it has none)
 *     48  8  largest start_ms of its events (0 when none)
 *     56  8  offset of its last record (0 when none)
 *     64  4  that record's CRC32C (its frame bytes 4..8)
 *     68  4  CRC32C of its records' CRCs (record bytes 4..8) concatenated in order, 0 when none:
 *            a checksum of the segment's contents that hashes 4 bytes per record
 *     72  4  CRC32C of bytes 0..72
 * Events are not ordered by time across threads and instances, so these are the minimum and
 * maximum, never the first and last. The writer writes the sidecar when it seals a segment by
 * rotation: a temporary file ledger-<seq>.idx.tmp-<pid>-<n>, synced, renamed over the sidecar's
 * name, then the directory synced; a crash at any step leaves no sidecar or a correct one. The
 * open segment has none and is always read (its appends would make one stale at once; for the
 * same reason none is written at shutdown: the segment stays open after a restart).
 *
 * A sidecar is a hint, never trusted over the data. A reader skips a sealed segment only when its
 * sidecar passes its own CRC and matches the segment on disk: the file's length, the record
 * count implied by the next segment's name, and the last record's frame (length, CRC, seq) read
 * at the stored offset. Otherwise (missing, stale, corrupt) the segment is read whole. A segment
 * read whole, by the recovery at open or by a ranged reader (an export), has its index
 * rebuilt from its records; when the sidecar is missing or says anything else, it is (re)written.
 * Temporary files left by a crash are removed at open.
 *
 * Durability. Under BILL_FSYNC_ALWAYS the writer fdatasyncs every batch it writes, at once (the
 * records that arrived while the previous sync ran form the next batch: group commit without a
 * wait). Under BILL_FSYNC_BATCH it first waits up to batch_window_us after the oldest pending
 * record for more to arrive, then writes and syncs them together. Under both, durable_seq moves
 * only after the sync returned: a power loss keeps every event at or below it. Under
 * BILL_FSYNC_OFF durable_seq moves when write() returned: a process kill (kill -9) loses
 * nothing, a power loss may lose what the kernel had not flushed yet.
 *
 * Recovery on open reads only what a restart needs, so its time does not grow with the ledger's
 * age. The segments are listed; the last one (the open segment) is always read whole. A sealed
 * segment is read whole when its sidecar is missing or does not match it on disk (the checks a
 * ranged reader makes, under Time index), or when it holds one of the records the duplicate set
 * is rebuilt from (see Duplicates); every other sealed segment is skipped: its sidecar stands for
 * it, and the seq continuity across it comes from the segment names and the sidecar's record
 * count. A segment read is checked record by record (CRC, version, seq order). In the last
 * segment, the first bad or incomplete record and everything after it is a torn tail of a crash:
 * it is truncated away (and counted) and appending continues after the last good record. Damage
 * in any other segment read is not a crash artifact and fails the open (PC_ERR_FORMAT), as does a
 * gap or reorder in seq (between the records read, or between the names and counts of the
 * segments). A segment is rotated when it passes segment_bytes; the old one is synced first, so
 * only the last segment can have a torn tail. bill_ledger_stats says what the open read.
 *
 * What open no longer finds: damage inside a sealed segment that open skips (its sidecar valid,
 * the segment older than the duplicate window), such as a flipped bit in a record's payload, a
 * damaged segment header or a damaged record other than the last. The sidecar's checks cover the
 * file's length and the last record's frame only. That damage is found, and reported with the
 * segment file, byte offset and seq, by whatever reads the segment: `kvgw billing verify` over
 * the whole ledger (it reads every record of every segment), an export or reader that reads it,
 * or an open with open_check BILL_OPEN_CHECK_FULL (config billing.verify_on_open: full), which
 * reads every segment as before and refuses to open on it.
 *
 * Duplicates. The event ids of the last records are kept in memory, in two generations of
 * h = (dedup_window + 1) / 2 ids each: inserts go to the current one, and when it is full it
 * becomes the old one and the previous old one is dropped. So the last h ids at least, and 2h
 * (dedup_window, rounded up to even) at most, are remembered. Appending an id that is there writes
 * nothing, counts a duplicate and returns 1 with the first record's seq. A retried request that
 * reuses its event id is therefore billed once. The set is rebuilt at open from the records of the
 * two generations that a recovery reading the whole ledger from its first segment would end with:
 * the records from seq first + (K - 1) h on, where first is the first segment's name, N the number
 * of records from there on and K = (N - 1) / h (all records when K is 0). Every segment holding one
 * of them is read, even when its sidecar is valid, so the set after a restart is exactly the one a
 * full read builds.
 *
 * Failure. A write or sync error (disk full, EIO) puts the ledger in a failed state for good:
 * durable_seq stops, the wake callback fires, and every later append returns the error
 * (PC_ERR_NOSPACE or PC_ERR_IO), so the gateway stops accepting billable work instead of serving
 * unbilled. Events appended but not durable at that moment were never acknowledged. After the
 * operator fixes the disk, reopening the ledger recovers it as after a crash.
 */
#ifndef BILL_LEDGER_H
#define BILL_LEDGER_H

#include "billing.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define BILL_LEDGER_MAX_PAYLOAD 65536
#define BILL_LEDGER_RECORD_HEADER 20
#define BILL_LEDGER_SEGMENT_HEADER 16
#define BILL_LEDGER_INDEX_BYTES 76

typedef enum bill_fsync {
    BILL_FSYNC_ALWAYS = 0,
    BILL_FSYNC_BATCH = 1,
    BILL_FSYNC_OFF = 2,
} bill_fsync_t;

/* "always" | "batch" | "off" -> mode; -1 when unknown. */
int bill_fsync_parse(const char *s);
const char *bill_fsync_name(int mode);

/* The writer's I/O, replaceable so tests can inject disk-full and fsync failures. Each returns
 * what the libc call returns (-1 with errno set on failure); write may write less than asked. */
typedef struct bill_ledger_io {
    ssize_t (*write)(void *ud, int fd, const void *buf, size_t len);
    int (*fsync)(void *ud, int fd);
    void *ud;
} bill_ledger_io_t;

/* Called on the writer thread after durable_seq advanced or the ledger failed. It must be cheap
 * and thread-safe (uv_async_send is). Calls may be coalesced; spurious calls can happen. */
typedef void (*bill_ledger_wake_fn)(void *ud);

/* What the recovery at open reads (see Recovery on open). */
typedef enum bill_open_check {
    BILL_OPEN_CHECK_INDEX = 0, /* skip the sealed segments the index stands for (the default) */
    BILL_OPEN_CHECK_FULL = 1,  /* read and check every record of every segment */
} bill_open_check_t;

/* "index" | "full" -> mode; -1 when unknown. */
int bill_open_check_parse(const char *s);
const char *bill_open_check_name(int mode);

typedef struct bill_ledger_params {
    const char *dir;          /* created if missing (one level) */
    const char *instance;     /* this gateway's instance id (1-63 of [A-Za-z0-9_.-]), stored in
                                 INSTANCE at creation and checked on every open; NULL: keep the
                                 stored one, or 16 random hex digits for a new ledger */
    bill_fsync_t fsync;       /* default BILL_FSYNC_BATCH */
    uint32_t batch_window_us; /* BILL_FSYNC_BATCH: wait for more records, default 500 */
    uint64_t segment_bytes;   /* rotate after this many bytes, default 64 MiB */
    uint64_t dedup_window;    /* event ids remembered, default 1 << 20 */
    size_t max_pending_bytes; /* appended but not written yet; beyond: PC_ERR_OVERLOADED,
                                 default 64 MiB */
    bill_ledger_wake_fn wake; /* may be NULL */
    void *wake_ud;
    const bill_ledger_io_t *io;   /* NULL: write(2) and fdatasync(2) */
    bill_open_check_t open_check; /* default BILL_OPEN_CHECK_INDEX */
} bill_ledger_params_t;

bill_ledger_params_t bill_ledger_params_default(void);

typedef struct bill_ledger bill_ledger_t;

/* Opens (creating when empty) the ledger in p->dir, recovers it as described above and starts its
 * writer thread. PC_ERR_BUSY when another process holds it, PC_ERR_FORMAT on damage that is not a
 * torn tail, PC_ERR_IO and others with a one-line reason in err. */
int bill_ledger_open(const bill_ledger_params_t *p, bill_ledger_t **out, char *err, size_t err_len);

/* Appends a copy of ev (validated first) and returns at once; *seq_out is its seq, durable when
 * bill_ledger_durable_seq reaches it. Thread-safe, never waits on disk. Returns 0; 1 when ev's
 * event id is already in the ledger's window (nothing written; *seq_out is the first record's
 * seq); PC_ERR_INVAL for a bad event; PC_ERR_NOSPACE / PC_ERR_IO when the ledger has failed;
 * PC_ERR_OVERLOADED when max_pending_bytes are waiting for the disk; PC_ERR_NOMEM. On any error
 * nothing was appended. */
int bill_ledger_append(bill_ledger_t *l, const bill_event_t *ev, uint64_t *seq_out);

/* The highest seq such that every record at or below it is durable (see Durability). Any thread. */
uint64_t bill_ledger_durable_seq(bill_ledger_t *l);

/* Blocks the calling thread (never the loop) until seq is durable or the ledger failed; 0 or the
 * failure. For CLIs, tests and shutdown. */
int bill_ledger_wait_durable(bill_ledger_t *l, uint64_t seq);

/* 0 while healthy; the error that failed the ledger (PC_ERR_NOSPACE, PC_ERR_IO) after. */
int bill_ledger_status(bill_ledger_t *l);

/* The INSTANCE id; valid while l is open. */
const char *bill_ledger_instance(const bill_ledger_t *l);

typedef struct bill_ledger_stats {
    uint64_t next_seq; /* seq the next new record will get */
    uint64_t durable_seq;
    uint64_t n_appended;   /* records appended since open */
    uint64_t n_duplicates; /* appends refused as duplicate event ids since open */
    uint64_t n_zero_cost;  /* usage events with tokens > 0 and cost 0 (an alert, LiteLLM
                              #37923); they are still written */
    uint64_t n_syncs;
    uint64_t bytes_written;
    uint64_t n_segments;
    uint64_t torn_bytes_truncated; /* by the recovery at open */
    /* What the recovery at open read. Every segment is read or skipped; open_index_bad counts
       the sealed segments read because their sidecar was missing, stale or corrupt. */
    uint64_t open_segments_read;
    uint64_t open_segments_skipped;
    uint64_t open_index_bad;
    uint64_t open_bytes_read; /* segment bytes read and checked */
    uint64_t open_dedup_from; /* the first seq the duplicate set was rebuilt from */
    int status;
} bill_ledger_stats_t;

void bill_ledger_stats(bill_ledger_t *l, bill_ledger_stats_t *out);

/* Writes and syncs everything appended, stops the writer and frees l. Returns 0, or the error
 * that kept some appended records from becoming durable. NULL is a no-op. */
int bill_ledger_close(bill_ledger_t *l);

/* ---------------------------------------------------------------------------------------------
 * Reader: the ledger's records in seq order, for exports, verify and the Redis shipper. A reader
 * reads the files on its own (any process, any thread, while a writer appends); it never sees a
 * record that fails its CRC. At the end of the data written so far, next returns 1; a later call
 * continues from there (new records and new segments included).
 * ------------------------------------------------------------------------------------------- */

typedef struct bill_ledger_reader bill_ledger_reader_t;

/* Opens a reader positioned at the first record with seq >= from_seq (1 = the beginning). */
int bill_ledger_reader_open(const char *dir, uint64_t from_seq, bill_ledger_reader_t **out,
                            char *err, size_t err_len);

/* The next record: 0 with *ev and *seq filled, 1 at the end of the data for now, PC_ERR_FORMAT
 * on damage before the end (with the reason in err). A segment that ends before the next seq
 * while a later segment exists is damage too (a segment is missing), never the end. */
int bill_ledger_reader_next(bill_ledger_reader_t *r, bill_event_t *ev, uint64_t *seq, char *err,
                            size_t err_len);

void bill_ledger_reader_free(bill_ledger_reader_t *r);

/* Restricts what a reader must read to the records whose event starts in [from_ms, to_ms): it
 * then skips every sealed segment whose time index (see Time index) proves it holds none. It
 * still returns the other records of the segments it reads (the caller filters). Call before the
 * first next; 0, or PC_ERR_INVAL when from_ms > to_ms or after next. A ranged reader also writes
 * the sidecar of each sealed segment it read whole when it was missing or wrong (best effort). */
int bill_ledger_reader_set_time_range(bill_ledger_reader_t *r, uint64_t from_ms, uint64_t to_ms);

typedef struct bill_ledger_reader_stats {
    uint64_t n_segments_read;    /* segment files opened and read */
    uint64_t n_segments_skipped; /* sealed segments skipped by their time index */
    uint64_t n_index_bad;        /* sidecars found missing, stale or corrupt (segment read) */
    uint64_t n_index_written;    /* sidecars this reader (re)wrote */
    uint64_t next_seq;           /* the seq the next record will have: at the end of the data,
                                    one past the last record, even if skipped segments hold it */
} bill_ledger_reader_stats_t;

void bill_ledger_reader_stats(const bill_ledger_reader_t *r, bill_ledger_reader_stats_t *out);

/* One segment's time index: the decoded sidecar (format under Time index above). */
typedef struct bill_ledger_index {
    uint64_t seg_bytes;
    uint64_t first_seq;
    uint64_t n_records;
    uint64_t min_start_ms; /* UINT64_MAX when n_records is 0 */
    uint64_t max_start_ms; /* 0 when n_records is 0 */
    uint64_t last_off;
    uint32_t last_crc;
    uint32_t seg_crc;
} bill_ledger_index_t;

/* Reads the sidecar of segment first_seq in dir: 0 with *out filled, PC_ERR_NOTFOUND when there is
 * none, PC_ERR_FORMAT when it is corrupt (size, magic, version, CRC or a different first seq).
 * It does not check the sidecar against the segment. */
int bill_ledger_index_load(const char *dir, uint64_t first_seq, bill_ledger_index_t *out);

/* Computes the index of segment first_seq by reading it whole, to its end: 0, PC_ERR_NOTFOUND, or
 * PC_ERR_FORMAT at a bad or torn record (the open segment's torn tail included). */
int bill_ledger_index_scan(const char *dir, uint64_t first_seq, bill_ledger_index_t *out, char *err,
                           size_t err_len);

/* What bill_ledger_check_all found. */
typedef struct bill_ledger_check {
    uint64_t n_segments;
    uint64_t n_records;       /* good records read */
    uint64_t n_bytes;         /* segment bytes read */
    uint64_t n_problems;      /* damage, gaps and trusted-but-wrong sidecars: one line each */
    uint64_t n_index_rebuilt; /* sealed segments whose sidecar is missing, or that a reader or an
                                 open would see is stale or corrupt and rebuild (not a problem) */
    uint64_t tail_bytes;      /* bytes after the open segment's last good record: a write in
                                 progress or a crash's torn tail, cut by the next open */
} bill_ledger_check_t;

/* Reads and checks every record of every segment of the ledger in dir (CRC, version, payload,
 * seq order), that the segments' names and record counts leave no gap, and every sealed
 * segment's sidecar against the segment's data; read only, safe beside a running gateway. Each
 * problem is one line on out (may be NULL) naming the file, the byte offset and the seq:
 *   DAMAGE <path>: ...   a bad segment header or record (the rest of that segment is unchecked)
 *   GAP <path>: ...      the segment does not start where the previous one ended
 *   INDEX <path>: ...    a sidecar that passes the checks readers trust yet differs from the data
 *                        (exports could skip events with it; any open or export reading the
 *                        segment rewrites it)
 * Returns 0 with *res filled (n_problems says whether the ledger is sound), or an error that kept
 * it from checking (PC_ERR_NOTFOUND: no such directory) with the reason in err. */
int bill_ledger_check_all(const char *dir, FILE *out, bill_ledger_check_t *res, char *err,
                          size_t err_len);

/* Reads the INSTANCE id of a ledger directory. PC_ERR_NOTFOUND if absent, PC_ERR_FORMAT if bad. */
int bill_ledger_read_instance(const char *dir, char out[BILL_STR_MAX]);

/* Hex digits of a ledger's LEDGER_ID. */
#define BILL_LEDGER_ID_LEN 32

/* Reads the LEDGER_ID of a ledger directory (NUL-terminated). PC_ERR_NOTFOUND if absent (a ledger
 * never opened by this version), PC_ERR_FORMAT if bad. */
int bill_ledger_read_id(const char *dir, char out[BILL_LEDGER_ID_LEN + 1]);

/* ---------------------------------------------------------------------------------------------
 * Storage metering. The gateway's cache index integrates, per namespace, cached tokens x time
 * (token-milliseconds, on the monotonic clock) and calls this every storage interval (e.g. a
 * minute) and at shutdown with the window's samples. Each sample with token_ms > 0 becomes one
 * storage event, priced at the model's storage price in effect at window_start_ms, with an id from
 * ids, appended to l.
 * ------------------------------------------------------------------------------------------- */

typedef struct bill_storage_sample {
    const char *ns;     /* namespace id (hex) */
    const char *tenant; /* the namespace's tenant */
    const char *model;
    uint64_t token_ms; /* cached tokens x milliseconds over the window */
} bill_storage_sample_t;

/* Checks and prices every sample first; on any bad sample (unknown model, bad string, window
 * end before start) returns PC_ERR_NOTFOUND / PC_ERR_INVAL with the reason and appends nothing.
 * Then appends them in order; *last_seq (may be NULL) gets the last seq appended (0 if none).
 * A ledger failure midway returns that error (the samples before it were appended). Loop thread
 * safe like bill_ledger_append: it never waits on disk. */
int bill_storage_emit(bill_ledger_t *l, const bill_pricing_t *p, bill_idgen_t *ids,
                      const bill_storage_sample_t *s, size_t n, uint64_t window_start_ms,
                      uint64_t window_end_ms, uint64_t *last_seq, char *err, size_t err_len);

#endif
