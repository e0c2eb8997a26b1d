/*
 * ledger_testutil.h — what the ledger tests share: per-test ledger directories under the test's
 * temporary directory (removed at exit, subdirectories included), and a deterministic usage
 * event numbered n.
 */
#ifndef BILL_LEDGER_TESTUTIL_H
#define BILL_LEDGER_TESTUTIL_H

#include "billing.h"
#include "pc_testutil.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

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

#endif
