/*
 * ledger_testutil.h — what the ledger tests share: per-test ledger directories under the test's
 * temporary directory (removed at exit, subdirectories included), a deterministic usage event
 * numbered n, file names of segments and sidecars, a sidecar written from ledger.h's format, and
 * one round of a SIGKILL crash loop.
 */
#ifndef BILL_LEDGER_TESTUTIL_H
#define BILL_LEDGER_TESTUTIL_H

#include "billing.h"
#include "pc_testutil.h"

#include "ledger.h"

#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static inline void rm_dir(const char *dir)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "  rm failed\n");
}

/* The ledgers live in subdirectories of the per-process directory, which pc_testutil.h removes
 * only when flat: remove them first. */
__attribute__((destructor)) static void remove_ledgers(void)
{
    if (pc_test__tmp_dir[0] != '\0')
        rm_dir(pc_test__tmp_dir);
}

/* An empty directory `name` of this test process (removed first when it exists). */
static inline const char *fresh_dir(const char *name)
{
    const char *d = pc_test_tmp_path(name);
    rm_dir(d);
    return d;
}

/* Usage event n: ids ev-n / req-n, tenants acme and globex, one second apart from 2023-11-14,
 * token counts and costs that grow with n. */
static inline void ledger_test_event(bill_event_t *ev, uint64_t n)
{
    bill_event_init(ev, BILL_EVENT_USAGE);
    snprintf(ev->event_id, BILL_STR_MAX, "ev-%" PRIu64, n);
    snprintf(ev->request_id, BILL_STR_MAX, "req-%" PRIu64, n);
    bill_event_set_str(ev->tenant, n % 3 ? "acme" : "globex");
    bill_event_set_str(ev->api_key_id, "key-1");
    bill_event_set_str(ev->model, "kvgw-demo");
    ev->start_ms = 1700000000000ull + n * 1000;
    ev->end_ms = ev->start_ms + 250;
    ev->usage = (bill_usage_t){.n_uncached = 10 + n, .n_read = n, .n_output = 5};
    ev->n_hit_logical = n;
    ev->n_hit_physical = n / 2;
    ev->cost_nusd[BILL_BUCKET_UNCACHED] = 3000 * (10 + n);
    ev->cost_nusd[BILL_BUCKET_READ] = 300 * n;
    ev->cost_nusd[BILL_BUCKET_OUTPUT] = 75000;
}

/* dir/ledger-<first, 20 digits>.<ext>: ext "seg" for a segment, "idx" for its sidecar. */
static inline void seg_path(char *buf, size_t n, const char *dir, uint64_t first, const char *ext)
{
    snprintf(buf, n, "%s/ledger-%020" PRIu64 ".%s", dir, first, ext);
}

/* The sidecar format, written from ledger.h's description (not from ledger_format.c's code). */
static inline void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Writes ix as the sidecar of its segment; a wrong own CRC unless good_crc. 0 or -1. */
static inline int write_sidecar(const char *dir, const bill_ledger_index_t *ix, bool good_crc)
{
    uint8_t b[BILL_LEDGER_INDEX_BYTES] = {0};
    memcpy(b, "KVGWLIDX", 8);
    put32(b + 8, 1);
    put64(b + 16, ix->seg_bytes);
    put64(b + 24, ix->first_seq);
    put64(b + 32, ix->n_records);
    put64(b + 40, ix->min_start_ms);
    put64(b + 48, ix->max_start_ms);
    put64(b + 56, ix->last_off);
    put32(b + 64, ix->last_crc);
    put32(b + 68, ix->seg_crc);
    put32(b + 72, bill_crc32c(0, b, 72) ^ (good_crc ? 0 : 1));
    char path[600];
    seg_path(path, sizeof path, dir, ix->first_seq, "idx");
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    size_t w = fwrite(b, 1, sizeof b, f);
    return fclose(f) == 0 && w == sizeof b ? 0 : -1;
}

/* A crash-loop child: appends to the ledger in dir from event `first` on and writes the number of
 * each event it saw durable to wfd, until it is killed. Never returns. */
typedef void (*ledger_crash_child_fn)(const char *dir, uint64_t first, int wfd, unsigned seed);

/* One round of a crash loop: forks child(dir, first, pipe, seed), kills it with SIGKILL after
 * 2 ms plus up to max_jitter_us, and reads the last event it reported durable into *acked (*any
 * false when it reported none). Returns the child's wait status, or -1 when the pipe or the fork
 * failed. */
static inline int ledger_crash_round(ledger_crash_child_fn child, const char *dir, uint64_t first,
                                     unsigned seed, int max_jitter_us, uint64_t *acked, bool *any)
{
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        close(fds[0]);
        child(dir, first, fds[1], seed);
        _exit(9);
    }
    close(fds[1]);
    usleep((useconds_t)(2000 + rand() % max_jitter_us));
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    uint64_t v;
    *acked = 0;
    *any = false;
    while (read(fds[0], &v, sizeof v) == (ssize_t)sizeof v) {
        *acked = v;
        *any = true;
    }
    close(fds[0]);
    return status;
}

#endif
