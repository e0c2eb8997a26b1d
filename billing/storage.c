/*
 * storage.c — cache storage metering: the gateway's per-namespace token-milliseconds of a window,
 * priced and appended as storage events (ledger.h).
 */
#include "common.h"
#include "ledger.h"

#include <inttypes.h>
#include <string.h>

int bill_storage_emit(bill_ledger_t *l, const bill_pricing_t *p, bill_idgen_t *ids,
                      const bill_storage_sample_t *s, size_t n, uint64_t window_start_ms,
                      uint64_t window_end_ms, uint64_t *last_seq, char *err, size_t err_len)
{
    if (last_seq != NULL)
        *last_seq = 0;
    if (window_end_ms < window_start_ms)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "storage: window ends before it starts");
    bill_event_t ev;
    /* Pass 1: every sample must make a valid, priced event; nothing is appended otherwise. */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < n; i++) {
            if (s[i].token_ms == 0)
                continue;
            bill_event_init(&ev, BILL_EVENT_STORAGE);
            if (bill_event_set_str(ev.ns, s[i].ns) != 0 ||
                bill_event_set_str(ev.tenant, s[i].tenant) != 0 ||
                bill_event_set_str(ev.model, s[i].model) != 0 || ev.ns[0] == '\0' ||
                ev.tenant[0] == '\0' || ev.model[0] == '\0')
                return pc_err_setf(err, err_len, PC_ERR_INVAL,
                                   "storage: sample %zu: namespace, tenant and model must be "
                                   "short printable strings",
                                   i);
            ev.start_ms = window_start_ms;
            ev.end_ms = window_end_ms;
            ev.token_ms = s[i].token_ms;
            if (pass == 0) {
                bill_event_set_str(ev.event_id, "check");
            } else {
                bill_idgen_next(ids, ev.event_id);
            }
            int rc = bill_event_price(&ev, p, err, err_len);
            if (rc != 0)
                return rc;
            if (pass == 0)
                continue;
            uint64_t seq;
            rc = bill_ledger_append(l, &ev, &seq);
            if (rc < 0)
                return pc_err_setf(err, err_len, rc, "storage: ledger append failed: %s",
                                   pc_strerror(rc));
            if (last_seq != NULL)
                *last_seq = seq;
        }
    }
    return 0;
}
