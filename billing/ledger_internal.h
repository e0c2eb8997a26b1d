/*
 * ledger_internal.h — what the ledger's three files share, and nothing else includes: the on-disk
 * format's encoders and decoders (ledger_format.c) used by the writer (ledger_writer.c: open,
 * recovery, append, the writer thread) and by the readers (ledger_reader.c: reader, index scan,
 * check). The format itself is documented byte by byte in ledger.h.
 */
#ifndef BILL_LEDGER_INTERNAL_H
#define BILL_LEDGER_INTERNAL_H

#include "common.h"
#include "ledger.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* The record frame's format version (byte 8 of a record header): the payload's event format
 * (BILL_EVENT_FORMAT). Appends write the current one; readers accept every version from 1 on. */
#define BILL__REC_VERSION BILL_EVENT_FORMAT

/* The segment header's format version: 2 for segments that may hold version-2 records. Readers
 * accept 1 and 2; the writer creates version 2 and never appends to a version-1 segment (an
 * older kvgw refuses a version-2 segment instead of cutting its new records as a torn tail). */
#define BILL__SEG_VERSION 2

/* Little-endian integers, as every field on disk is. */
static inline void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void put_u64le(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t get_u64le(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* An instance id: 1..63 characters of [A-Za-z0-9_.-] (it becomes part of Redis key names). */
bool bill__instance_ok(const char *s);

/* write(2) and fdatasync(2): the hooks a ledger uses when its params give none. */
extern const bill_ledger_io_t bill__ledger_default_io;

/* PC_ERR_NOSPACE for ENOSPC and EDQUOT, PC_ERR_IO for any other errno of a failed write. */
int bill__ledger_err_from_errno(int e);

/* Segments: "ledger-<first seq, 20 digits>.seg" into buf[n]; the first seqs of every segment in
 * dir, ascending (*out owned by the caller, pc_free); a fresh segment header (the current
 * version); its check. */
void bill__seg_name(char *buf, size_t n, uint64_t first_seq);
int bill__seg_list(const char *dir, uint64_t **out, size_t *n_out);
void bill__seg_header(uint8_t h[BILL_LEDGER_SEGMENT_HEADER]);
bool bill__seg_header_ok(const uint8_t h[BILL_LEDGER_SEGMENT_HEADER]);
/* The version of a header that passed bill__seg_header_ok. */
uint32_t bill__seg_header_version(const uint8_t h[BILL_LEDGER_SEGMENT_HEADER]);

/* The time index of one segment: start it empty, fold one record frame in, compare two. */
void bill__idx_init(bill_ledger_index_t *ix, uint64_t first_seq);
void bill__idx_add(bill_ledger_index_t *ix, const uint8_t *frame, size_t len, uint64_t start_ms);
bool bill__idx_equal(const bill_ledger_index_t *a, const bill_ledger_index_t *b);

/* The sidecar's name "ledger-<20 digits>.idx" into buf[n]; whether a directory entry is a
 * temporary sidecar a crash left; writing one crash-safely into dir_fd (0 or the error); whether
 * one describes segment first_seq as it is on disk now (next_first: the next segment's name). */
void bill__idx_name(char *buf, size_t n, uint64_t first_seq);
bool bill__idx_is_temp(const char *name);
int bill__idx_write(int dir_fd, const bill_ledger_io_t *io, const bill_ledger_index_t *ix,
                    bool sync_dir);
bool bill__idx_matches(const char *dir, uint64_t first_seq, uint64_t next_first,
                       const bill_ledger_index_t *ix);

/* The start_ms of an encoded event payload; false when it is too short. */
bool bill__payload_start_ms(const uint8_t *p, size_t len, uint64_t *out);

/* bill__record_read's results. */
enum {
    BILL__REC_OK = 0,
    BILL__REC_END = 1,  /* clean end of data: no byte of a next record */
    BILL__REC_TORN = 2, /* a partial or bad record: a torn tail, or damage */
};

/* Reads one record at f's position (details at the definition). *frame, when frame is not NULL,
 * points into a thread-local buffer valid until this thread's next call. */
int bill__record_read(FILE *f, bill_event_t *ev, uint64_t *seq, size_t *rec_len, bool *bad_payload,
                      const uint8_t **frame);

#endif
