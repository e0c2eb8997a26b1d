/*
 * fuzz_ledger.c — libFuzzer target for ledger replay (billing/ledger_*.c): the bytes become a
 * segment file, then a reader replays it and the ledger's recovery opens it.
 *
 * Byte 0 picks the mode: even, the rest follows a valid segment header (records only; bit 1
 * picks the header's version, 1 or 2: the format before the registry field and the current one,
 * so old and new records are read in both); odd, the rest is the whole file, header included.
 * Properties: every record the reader returns has a payload that re-encodes to a decodable, equal
 * event; the reader ends with "end of data" or a FORMAT error with a reason; recovery either
 * refuses with PC_ERR_FORMAT or opens, after which a reader returns the same records and ends
 * cleanly (a torn tail was cut, never a good record). Anything else (a crash, a sanitizer report, a
 * broken property) aborts.
 */
#include "common.h"
#include "ledger.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

__attribute__((destructor)) static void remove_dir(void)
{
    char cmd[600];
    if (dir[0] != '\0') {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "fuzz_ledger: cannot remove %s\n", dir);
    }
}

static void write_segment(const uint8_t *data, size_t size, int with_header, uint8_t version)
{
    char path[400];
    snprintf(path, sizeof path, "%s/ledger-00000000000000000001.seg", dir);
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        abort();
    if (with_header) {
        uint8_t h[16];
        memcpy(h, "KVGWLEDG", 8);
        h[8] = version, h[9] = h[10] = h[11] = 0;
        uint32_t crc = bill_crc32c(0, h, 12);
        for (int i = 0; i < 4; i++)
            h[12 + i] = (uint8_t)(crc >> (8 * i));
        fwrite(h, 1, 16, f);
    }
    fwrite(data, 1, size, f);
    fclose(f);
}

/* Replays the ledger; returns the number of records, -1 on a FORMAT error. */
static long replay(void)
{
    bill_ledger_reader_t *r;
    char err[256] = "";
    if (bill_ledger_reader_open(dir, 1, &r, err, sizeof err) != 0)
        abort();
    long n = 0;
    bill_event_t ev, back;
    uint64_t seq;
    int rc;
    uint8_t buf[BILL_EVENT_MAX_ENCODED];
    while ((rc = bill_ledger_reader_next(r, &ev, &seq, err, sizeof err)) == 0) {
        size_t len = bill_event_encode(&ev, buf);
        if (bill_event_decode(buf, len, &back) != 0 || memcmp(&back, &ev, sizeof ev) != 0)
            abort();
        if (seq != (uint64_t)n + 1)
            abort();
        n++;
    }
    bill_ledger_reader_free(r);
    if (rc < 0 && (rc != PC_ERR_FORMAT || err[0] == '\0'))
        abort();
    return rc == 1 ? n : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (dir[0] == '\0') {
        snprintf(dir, sizeof dir, "/tmp/kvgw_fuzz_ledger.%d", (int)getpid());
        mkdir(dir, 0700);
        pc_log_set_level(PC_LOG_OFF);
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -f %s/ledger-* %s/INSTANCE %s/LOCK", dir, dir, dir);
    if (system(cmd) != 0)
        abort();
    write_segment(data + 1, size - 1, !(data[0] & 1), (data[0] & 2) ? 2 : 1);
    long before = replay();
    bill_ledger_params_t p = bill_ledger_params_default();
    p.dir = dir;
    p.fsync = BILL_FSYNC_OFF;
    bill_ledger_t *l;
    char err[256] = "";
    int rc = bill_ledger_open(&p, &l, err, sizeof err);
    if (rc != 0) {
        if (rc != PC_ERR_FORMAT || err[0] == '\0')
            abort();
        return 0;
    }
    bill_ledger_stats_t st;
    bill_ledger_stats(l, &st);
    if (bill_ledger_close(l) != 0)
        abort();
    long after = replay();
    /* Recovery keeps exactly the records a reader saw before the first bad byte. */
    if (after < 0 || (before >= 0 && after != before) || st.next_seq != (uint64_t)after + 1)
        abort();
    return 0;
}
