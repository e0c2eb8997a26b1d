/*
 * usage_internal.h — reading the usage the shipper wrote to Redis (shipper.h's key layout), for
 * the merged export (export.c) and verify (verify.c), over a blocking connection
 * (bill_redis_connect_sync) whose every command has a timeout: CLIs and the admin export's
 * thread-pool steps, never the gateway's loop.
 *
 * Bounds: instance ids are checked (1-63 of [A-Za-z0-9_.-], as the ledger's INSTANCE) and at most
 * BILL__MAX_INSTANCES are listed; a stream is read BILL__STREAM_PAGE entries per XRANGE, so an
 * export holds one page per instance; every field of an entry is checked as a ledger record is
 * (bill_event_validate, exact integers, costs adding up to the shipped total).
 */
#ifndef BILL_USAGE_INTERNAL_H
#define BILL_USAGE_INTERNAL_H

#include "billing.h"
#include "redisconn.h"

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BILL__MAX_INSTANCES 4096
#define BILL__STREAM_PAGE 128

/* Every instance that shipped usage under prefix: the members of PREFIX:gws (every shipper adds
 * its instance there at each connect, before it ships anything; the registry's gateways too),
 * each once, sorted. scan_streams also adds the INSTANCE of every PREFIX:ledger:INSTANCE stream
 * (a SCAN of the whole keyspace, cache entries included: only for streams shipped by a kvgw
 * older than that SADD and never shipped to since). *out (pc_free) holds *n ids of BILL_STR_MAX
 * bytes. PC_ERR_UPSTREAM on a Redis error, PC_ERR_FORMAT for an id that is not an instance id,
 * PC_ERR_RANGE beyond BILL__MAX_INSTANCES. */
int bill__redis_instances(redisContext *c, const char *prefix, bool scan_streams,
                          char (**out)[BILL_STR_MAX], size_t *n, char *err, size_t err_len);

/* One instance's stream PREFIX:ledger:INSTANCE, read in id (seq) order page by page. */
typedef struct bill__stream {
    redisContext *c;
    char key[320];
    redisReply *page;
    size_t idx;
    uint64_t last_seq; /* of the last entry returned */
    bool end;
} bill__stream_t;

void bill__stream_init(bill__stream_t *s, redisContext *c, const char *prefix,
                       const char *instance);

/* The next entry as the event the ledger holds: 0 with *ev and *seq, 1 at the end,
 * PC_ERR_UPSTREAM (Redis) or PC_ERR_FORMAT (an entry that is not a shipped event, with its id). */
int bill__stream_next(bill__stream_t *s, bill_event_t *ev, uint64_t *seq, char *err,
                      size_t err_len);

void bill__stream_free(bill__stream_t *s);

#endif
