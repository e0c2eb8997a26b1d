/*
 * test_ledger_format.c — the ledger's format versions (ledger.h, Versions): a segment written by
 * kvgw before the registry field (its bytes below, produced by that code) still reads, as registry
 * none; opening it seals it and appends to a version-2 segment; the event payload's formats
 * decode only as themselves.
 */
#include "common.h"
#include "ledger_testutil.h"
#include "pc_test.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ledger-00000000000000000001.seg of a ledger written by the format-1 code (segment header
 * version 1, two records of record format 1): a usage event "old-1" and a storage event "old-2"
 * of instance gw-old. */
static const char old_segment_hex[] = "4b5647574c45444701000000f2b425d4ae000000181bb1db010100000100"
                                      "0000000000000100056f6c642d3109726571"
                                      "5f6f6c645f310461636d65026b31026d3110303031313232333361616262"
                                      "63636464007c291f94010000d280291f9401"
                                      "00000a000000000000000008000000000000000000000000000000040000"
                                      "000000004d00000000000000000400000000"
                                      "000000020000000000000000000000000000307500000000000000307500"
                                      "00000000000000000000000000b004000000"
                                      "0000b89f1100000000000000000000000000a3000000644fe86d01020000"
                                      "02000000000000000200056f6c642d320004"
                                      "61636d6500026d321030303131323233336161626263636464007c291f94"
                                      "01000060662a1f9401000000000000000000"
                                      "000000000000000000000000000000000000000000000000000000000000"
                                      "000000000000000000000000000000000000"
                                      "0015cd5b0700000000000000000000000000000000000000000000000000"
                                      "000000000000000000000000000000000000"
                                      "00fb42000000000000";

static size_t unhex(const char *h, uint8_t *out)
{
    size_t n = strlen(h) / 2;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        out[i] = (uint8_t)v;
    }
    return n;
}

static uint8_t old_seg[512];
static size_t old_len;

/* A ledger directory holding the old segment (and, with records false, only its header). */
static const char *old_ledger(const char *name, bool records)
{
    old_len = unhex(old_segment_hex, old_seg);
    const char *dir = fresh_dir(name);
    if (mkdir(dir, 0755) != 0)
        return NULL;
    char path[600];
    seg_path(path, sizeof path, dir, 1, "seg");
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return NULL;
    fwrite(old_seg, 1, records ? old_len : BILL_LEDGER_SEGMENT_HEADER, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/INSTANCE", dir);
    if ((f = fopen(path, "wb")) == NULL)
        return NULL;
    fputs("gw-old\n", f);
    fclose(f);
    return dir;
}

/* Opens the ledger in dir (fsync off) and reads its stats. */
static int open_ledger(const char *dir, bill_ledger_t **l, bill_ledger_stats_t *st)
{
    bill_ledger_params_t lp = bill_ledger_params_default();
    lp.dir = dir;
    lp.fsync = BILL_FSYNC_OFF;
    char err[256] = "";
    int rc = bill_ledger_open(&lp, l, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  open %s: %s\n", dir, err);
    else
        bill_ledger_stats(*l, st);
    return rc;
}

/* The bytes of dir's segment starting at seq first (free them), NULL when unreadable. */
static uint8_t *read_segment(const char *dir, uint64_t first, size_t *len)
{
    char path[600];
    seg_path(path, sizeof path, dir, first, "seg");
    return pc_test_slurp(path, len);
}

static void check_old_events(bill_ledger_reader_t *r)
{
    bill_event_t ev;
    uint64_t seq;
    ASSERT_EQ(bill_ledger_reader_next(r, &ev, &seq, NULL, 0), 0);
    ASSERT_EQ_U64(seq, 1);
    ASSERT_STR_EQ(ev.event_id, "old-1");
    ASSERT_EQ(ev.kind, BILL_EVENT_USAGE);
    ASSERT_EQ(ev.registry, BILL_REGISTRY_NONE);
    ASSERT_STR_EQ(ev.request_id, "req_old_1");
    ASSERT_STR_EQ(ev.ns, "00112233aabbccdd");
    ASSERT_EQ_U64(ev.end_ms, 1735689601234ull);
    ASSERT_EQ_U64(ev.usage.n_write_5m, 2048);
    ASSERT_EQ_U64(ev.usage.n_read, 1024);
    ASSERT_EQ_U64(ev.n_hit_physical, 512);
    ASSERT_EQ_U64(ev.cost_nusd[BILL_BUCKET_OUTPUT], 1155000);
    ASSERT_EQ(bill_ledger_reader_next(r, &ev, &seq, NULL, 0), 0);
    ASSERT_EQ_U64(seq, 2);
    ASSERT_STR_EQ(ev.event_id, "old-2");
    ASSERT_EQ(ev.kind, BILL_EVENT_STORAGE);
    ASSERT_EQ(ev.registry, BILL_REGISTRY_NONE);
    ASSERT_EQ_U64(ev.token_ms, 123456789);
    ASSERT_EQ_U64(ev.cost_nusd[BILL_BUCKET_STORAGE], 17147);
}

PC_TEST(old_segment_reads_as_registry_none)
{
    const char *dir = old_ledger("old_read", true);
    ASSERT_TRUE(dir != NULL);
    bill_ledger_reader_t *r;
    ASSERT_EQ(bill_ledger_reader_open(dir, 1, &r, NULL, 0), 0);
    check_old_events(r);
    bill_event_t ev;
    uint64_t seq;
    ASSERT_EQ(bill_ledger_reader_next(r, &ev, &seq, NULL, 0), 1);
    bill_ledger_reader_free(r);
    bill_ledger_check_t ck;
    char err[256];
    ASSERT_EQ(bill_ledger_check_all(dir, NULL, &ck, err, sizeof err), 0);
    ASSERT_EQ_U64(ck.n_records, 2);
    ASSERT_EQ_U64(ck.n_problems, 0);
}

PC_TEST(open_seals_old_segment_and_appends_in_a_new_one)
{
    const char *dir = old_ledger("old_open", true);
    ASSERT_TRUE(dir != NULL);
    bill_ledger_t *l;
    bill_ledger_stats_t st;
    ASSERT_EQ(open_ledger(dir, &l, &st), 0);
    ASSERT_EQ_U64(st.next_seq, 3);
    ASSERT_EQ_U64(st.n_segments, 2);
    ASSERT_EQ_U64(st.torn_bytes_truncated, 0);
    bill_event_t ev;
    ledger_test_event(&ev, 3);
    ev.registry = BILL_REGISTRY_LOCAL;
    uint64_t seq;
    ASSERT_EQ(bill_ledger_append(l, &ev, &seq), 0);
    ASSERT_EQ_U64(seq, 3);
    ASSERT_EQ(bill_ledger_append(l, &(bill_event_t){0}, &seq), PC_ERR_INVAL);
    bill_event_t bad = ev;
    bill_event_set_str(bad.event_id, "bad-registry");
    bad.registry = BILL_REGISTRY_COUNT;
    ASSERT_EQ(bill_ledger_append(l, &bad, &seq), PC_ERR_INVAL);
    ASSERT_EQ(bill_ledger_close(l), 0);

    /* The old segment is untouched (sealed, with a sidecar); the new one is version 2. */
    size_t len;
    uint8_t *b = read_segment(dir, 1, &len);
    ASSERT_TRUE(b != NULL);
    ASSERT_EQ_U64(len, old_len);
    ASSERT_MEM_EQ(b, old_seg, old_len);
    free(b);
    bill_ledger_index_t ix;
    ASSERT_EQ(bill_ledger_index_load(dir, 1, &ix), 0);
    ASSERT_EQ_U64(ix.n_records, 2);
    b = read_segment(dir, 3, &len);
    ASSERT_TRUE(b != NULL && len > BILL_LEDGER_SEGMENT_HEADER);
    ASSERT_EQ(b[8], 2);                         /* segment format version */
    ASSERT_EQ(b[16 + 8], 2);                    /* record format version */
    ASSERT_EQ(b[len - 1], BILL_REGISTRY_LOCAL); /* the payload's last byte */
    free(b);

    bill_ledger_reader_t *r;
    ASSERT_EQ(bill_ledger_reader_open(dir, 1, &r, NULL, 0), 0);
    check_old_events(r);
    bill_event_t back;
    ASSERT_EQ(bill_ledger_reader_next(r, &back, &seq, NULL, 0), 0);
    ASSERT_EQ_U64(seq, 3);
    ASSERT_EQ(back.registry, BILL_REGISTRY_LOCAL);
    ASSERT_MEM_EQ(&back, &ev, sizeof ev);
    ASSERT_EQ(bill_ledger_reader_next(r, &back, &seq, NULL, 0), 1);
    bill_ledger_reader_free(r);

    /* A second open finds a current segment: nothing more to rotate. */
    ASSERT_EQ(open_ledger(dir, &l, &st), 0);
    ASSERT_EQ_U64(st.n_segments, 2);
    ASSERT_EQ_U64(st.next_seq, 4);
    ASSERT_EQ(bill_ledger_close(l), 0);
    bill_ledger_check_t ck;
    char err[256];
    ASSERT_EQ(bill_ledger_check_all(dir, NULL, &ck, err, sizeof err), 0);
    ASSERT_EQ_U64(ck.n_records, 3);
    ASSERT_EQ_U64(ck.n_problems, 0);
}

PC_TEST(empty_old_segment_is_rewritten_in_place)
{
    const char *dir = old_ledger("old_empty", false);
    ASSERT_TRUE(dir != NULL);
    bill_ledger_t *l;
    bill_ledger_stats_t st;
    ASSERT_EQ(open_ledger(dir, &l, &st), 0);
    ASSERT_EQ_U64(st.n_segments, 1);
    ASSERT_EQ_U64(st.next_seq, 1);
    ASSERT_EQ(bill_ledger_close(l), 0);
    size_t len;
    uint8_t *b = read_segment(dir, 1, &len);
    ASSERT_TRUE(b != NULL);
    ASSERT_EQ_U64(len, BILL_LEDGER_SEGMENT_HEADER);
    ASSERT_EQ(b[8], 2);
    free(b);
}

PC_TEST(payload_formats_decode_only_as_themselves)
{
    old_len = unhex(old_segment_hex, old_seg);
    /* The first record's payload, format 1. */
    const uint8_t *p1 = old_seg + BILL_LEDGER_SEGMENT_HEADER + BILL_LEDGER_RECORD_HEADER;
    size_t n1 = old_seg[BILL_LEDGER_SEGMENT_HEADER] | (size_t)old_seg[17] << 8;
    bill_event_t ev, ev2;
    ASSERT_EQ(bill_event_decode_format(p1, n1, 1, &ev), 0);
    ASSERT_EQ(bill_event_decode(p1, n1, &ev2), PC_ERR_FORMAT); /* too short for format 2 */
    ASSERT_EQ(bill_event_decode_format(p1, n1, 0, &ev2), PC_ERR_FORMAT);
    ASSERT_EQ(bill_event_decode_format(p1, n1, 3, &ev2), PC_ERR_FORMAT);
    uint8_t buf[BILL_EVENT_MAX_ENCODED];
    for (int reg = 0; reg < BILL_REGISTRY_COUNT; reg++) {
        ev.registry = (uint8_t)reg;
        size_t n = bill_event_encode(&ev, buf);
        ASSERT_EQ_U64(n, n1 + 1);
        ASSERT_EQ(buf[n - 1], reg);
        ASSERT_EQ(bill_event_decode(buf, n, &ev2), 0);
        ASSERT_MEM_EQ(&ev2, &ev, sizeof ev);
        ASSERT_EQ(bill_event_decode_format(buf, n, 1, &ev2), PC_ERR_FORMAT); /* one byte too many */
        buf[n - 1] = BILL_REGISTRY_COUNT;
        ASSERT_EQ(bill_event_decode(buf, n, &ev2), PC_ERR_FORMAT);
    }
    ASSERT_STR_EQ(bill_registry_name(BILL_REGISTRY_SHARED), "shared");
    ASSERT_TRUE(bill_registry_name(BILL_REGISTRY_COUNT) == NULL);
    ASSERT_EQ(bill_registry_parse("local"), BILL_REGISTRY_LOCAL);
    ASSERT_EQ(bill_registry_parse("Local"), -1);
}

PC_TEST_MAIN()
