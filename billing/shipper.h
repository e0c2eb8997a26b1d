/*
 * shipper.h — ships the ledger to Redis (hiredis async on the gateway's libuv loop), and
 * `kvgw billing verify`'s reconciliation of ledgers against Redis.
 *
 * Redis is a view, never the record (Jepsen lost acknowledged Redis writes): the shipper reads
 * the ledger from a cursor kept in Redis and, for each record, runs one Lua script that
 * atomically (1) checks the record's seq against the cursor and does nothing when it is already
 * shipped, (2) XADDs the event to the instance's stream with the explicit id "<seq>-0", (3)
 * HINCRBYs the tenant's per-day counters, (4) records the counter key in a key set, and (5) moves
 * the cursor. A timeout or a lost reply makes the shipper reconnect and re-read the cursor; a
 * replayed record is then a no-op, so nothing is ever applied twice (LiteLLM #30460) and the
 * counters always equal the stream. Counters are only ever incremented by events, never seeded
 * or overwritten (LiteLLM #28247's re-seed inflation cannot happen); several gateway instances
 * keep separate streams and cursors and share exact counters.
 *
 * Keys (PREFIX default "kvgw", INSTANCE = the ledger's INSTANCE id or the configured one):
 *   PREFIX:ledger:INSTANCE           stream; fields event_id kind status tenant model day
 *                                    request_id api_key_id start_ms end_ms, the six bucket
 *                                    quantities by bucket name, cost_nusd (total), registry
 *                                    (none|shared|local), ns, hit_logical, hit_physical and
 *                                    cost_<bucket>_nusd for each bucket (entries shipped by
 *                                    kvgw before the registry field lack these last ones)
 *   PREFIX:cursor:INSTANCE           string: "SEQ LEDGER_ID", the last seq shipped and the
 *                                    ledger it came from (ledger.h's LEDGER_ID); "SEQ" alone
 *                                    from before ledger ids (bound to the first ledger that
 *                                    ships on it)
 *   PREFIX:usage:TENANT:YYYY-MM-DD   hash: events, cost_nusd, <bucket> (quantity) and
 *                                    cost_<bucket>_nusd for each of the six buckets
 *   PREFIX:usage_keys                set of every usage hash key written
 *   PREFIX:gws                       set of every instance that ships (or registers: the
 *                                    registry's gateways): the shipper SADDs its INSTANCE at each
 *                                    connect, before it ships anything, so the merged export and
 *                                    verify list instances from this set, never by a SCAN
 *
 * Redis down or slow: every command batch has a deadline (timeout_ms); past it the connection is
 * dropped and retried with backoff. The connection is redisconn.h's: with Sentinel it follows a
 * failover to the new primary (and the cursor is re-read there). The gateway keeps serving, the
 * ledger keeps growing, and the shipper catches up from the cursor once Redis answers again. Ledger
 * reads run on the libuv thread pool, never on the loop.
 */
#ifndef BILL_SHIPPER_H
#define BILL_SHIPPER_H

#include "billing.h"
#include "redisconn.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <uv.h>

typedef struct bill_shipper_params {
    const char *ledger_dir;
    const char *instance;  /* NULL: the ledger's INSTANCE id */
    const char *host;      /* default 127.0.0.1 */
    int port;              /* default 6379 */
    const char *password;  /* NULL: no AUTH */
    const char *prefix;    /* default "kvgw" */
    uint32_t timeout_ms;   /* deadline of a connect or a batch of commands, default 2000 */
    uint32_t batch;        /* records per batch (pipelined), default 256 */
    uint32_t poll_ms;      /* when caught up, look at the ledger again after this, default 100 */
    uint32_t retry_min_ms; /* reconnect backoff, default 100, doubling to retry_max_ms */
    uint32_t retry_max_ms; /* default 5000 */
    /* Optional: the connection (a fixed address or Sentinel, redisconn.h), copied at start.
     * When set it replaces host, port, password and timeout_ms above (its timeout_ms is then the
     * batch deadline); its callbacks are the shipper's own: leave them NULL. */
    const bill_redis_params_t *conn;
    /* Optional: the highest seq that may be shipped (the ledger's durable seq), so Redis never
     * holds an event that a power loss could take out of the ledger. Called on the loop. */
    uint64_t (*durable_seq)(void *ud);
    void *durable_ud;
} bill_shipper_params_t;

bill_shipper_params_t bill_shipper_params_default(void);

typedef struct bill_shipper bill_shipper_t;

typedef struct bill_shipper_stats {
    uint64_t shipped_seq; /* the cursor as last confirmed by Redis */
    uint64_t n_shipped;   /* records applied since start (replays that were no-ops excluded) */
    uint64_t n_replayed;  /* records Redis already had */
    uint64_t n_timeouts;
    uint64_t n_errors; /* connection errors and error replies */
    uint64_t n_connects;
    bool connected;
    /* The cursor in Redis belongs to another ledger (its LEDGER_ID differs: a gateway replaced on
     * a fresh disk under the same instance id), or is beyond this ledger's durable end: nothing
     * is shipped (never a record skipped or shipped twice), an error is logged, and the cursor is
     * read again every retry_max_ms. The operator gives the gateway a new billing.instance_id. */
    bool refused;
} bill_shipper_stats_t;

/* Starts shipping on loop (the caller's thread must be the loop's). Strings are copied. Returns
 * at once; connecting happens in the background (Redis need not be up). PC_ERR_INVAL / NOTFOUND
 * (no INSTANCE) with a reason in err. */
int bill_shipper_start(uv_loop_t *loop, const bill_shipper_params_t *p, bill_shipper_t **out,
                       char *err, size_t err_len);

/* Hints that new records are durable: ship now rather than at the next poll. Loop thread. */
void bill_shipper_kick(bill_shipper_t *s);

void bill_shipper_stats(const bill_shipper_t *s, bill_shipper_stats_t *out);

/* Stops: drops the connection, closes every handle; on_closed(ud) runs on the loop when s is
 * freed. Loop thread. */
void bill_shipper_stop(bill_shipper_t *s, void (*on_closed)(void *ud), void *ud);

/* ---------------------------------------------------------------------------------------------
 * Verify
 * ------------------------------------------------------------------------------------------- */

typedef struct bill_verify_params {
    char host[256];
    int port;
    const char *password;
    const char *prefix;
    uint32_t timeout_ms;
    uint64_t from_ms;  /* reconcile only the UTC days in [from_ms, to_ms): whole days (multiples */
    uint64_t to_ms;    /* of 86400000, to_ms may be UINT64_MAX); default 0 .. UINT64_MAX: all */
    bool scan_streams; /* instances: PREFIX:gws, and also a SCAN for PREFIX:ledger:* streams
                          (those of a kvgw older than the shipper's SADD); default false */
} bill_verify_params_t;

bill_verify_params_t bill_verify_params_default(void);

typedef struct bill_verify_report {
    uint64_t n_events;      /* ledger records read */
    uint64_t n_shipped;     /* of those, at or below their instance's cursor */
    uint64_t n_pending;     /* above the cursor: not shipped yet (not a difference) */
    uint64_t n_differences; /* each printed to out */
    uint64_t n_segments_read;
    uint64_t n_segments_skipped;              /* by the ledgers' time index (a day range only) */
    uint64_t n_registry[BILL_REGISTRY_COUNT]; /* ledger events by their registry decision */
    uint64_t n_instances_missing;             /* instances in Redis whose ledger was not given */
} bill_verify_report_t;

/* Reconciles n ledgers (one per gateway instance sharing the Redis) with Redis: each stream
 * against its ledger up to the cursor (every entry, id and event id and cost), and every
 * per-tenant per-day counter against the sum over all ledgers of the shipped events, plus counter
 * keys that no ledger explains. With a day range (from_ms/to_ms), only the counters of those days
 * are compared (and only their unexplained keys reported), and each stream only against the
 * ledger segments read: those that the time index says can hold events of those days (ledger.h),
 * so verifying a day costs about a day of ledger. PC_ERR_INVAL for a range that is not whole days.
 * Differences are printed one per line to out. Instances that shipped to Redis (PREFIX:gws, and
 * with scan_streams the PREFIX:ledger:* streams) but whose ledger was not given are printed as
 * MISSING lines and counted apart (their counters then show as differences too). Returns 0 when the
 * comparison ran (differences or not), an error when it could not (Redis unreachable, damaged
 * ledger, a bad instance id in Redis) with the reason in err. */
int bill_verify(const char *const *ledger_dirs, size_t n, const bill_verify_params_t *p, FILE *out,
                bill_verify_report_t *rep, char *err, size_t err_len);

#endif
