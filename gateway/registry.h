/*
 * registry.h — the shared cache registry (issue 22): many gateways, one view of cache entries and
 * claims in Redis, a change feed that keeps each gateway's gw_cindex replica in step, fencing,
 * and degraded mode when Redis is away. Design: docs/ARCHITECTURE.md, "Scale-out".
 *
 * The registry owns the Redis keys, the Lua scripts, the leases, the feed consumer and the replay
 * queue. It never touches the index or a request: results and feed events come back through
 * callbacks on the loop; the gateway (request.c, serve.c) applies them. Loop thread only.
 *
 * Keys (PREFIX = params.prefix, NS = 16 lower-case hex digits of the namespace id, H = 32 hex
 * digits of XXH3-128 (high half first) over (ns as 8 little-endian bytes, tokens[0..n) as 4
 * little-endian bytes each); the registry hashes: O(longest point) per call, one streaming state
 * digested at each point):
 *   PREFIX:e:NS:H     entry: "n_tokens ttl_class created_wall_ms writer_instance", PEXPIREAT = its
 *                     expiry (start + TTL on write; max(old, now + TTL) on read; never shortened;
 *                     the longer TTL class wins)
 *   PREFIX:c:NS:H     claim: "fence instance worker", PX claim_ttl; deleted by commit or release
 *                     of the same fence and instance
 *   PREFIX:gw:INST    registration: this process's random 128-bit nonce (hex), PX lease
 *   PREFIX:gws        set of every instance id ever registered
 *   PREFIX:fence      INCR counter: a claim's fencing value
 *   PREFIX:nssecret   hex of the namespace-secret check (SET NX by the first gateway)
 *   PREFIX:settings   hash: the settings that change what is billed for the same prompt
 *                     (params.settings: name -> value), each field HSETNX by the first gateway
 *                     that has it; a gateway whose value of a field differs is refused
 *   PREFIX:meter      storage-meter lease: the holder's nonce, PX lease
 *   PREFIX:feed       change feed stream, XADD MAXLEN ~ feed_maxlen; fields:
 *                       t=w o=ORIGIN ns=NS tok=<u32 LE tokens up to the longest point>
 *                           pts="len:ttl:expiry_wall_ms,..." st=start_wall_ms wk=WORKER
 *                           tn=TENANT md=MODEL (the namespace's owner: whoever meters storage
 *                           bills it, even for a salted namespace it never served; both or
 *                           neither, absent in events of gateways older than these fields)
 *                       t=r o=ORIGIN ns=NS tok=<u32 LE tokens[0..n)> n=N now=now_wall_ms
 * Every mutating script first checks PREFIX:gw:INST == our nonce and otherwise answers the error
 * KVGWFENCED without changing anything. Redis 7.0 or later (PEXPIRETIME, PEXPIREAT GT).
 *
 * Start (gw_registry_start, blocking, before the loop serves): one blocking connect bounded by the
 * redis timeout (sentinel-aware), then
 *   - the secret check: SET NX PREFIX:nssecret; a different stored value refuses the start
 *     (PC_ERR_PERM): gateways with different namespace secrets would silently isolate tenants;
 *   - the settings check: every setting of params.settings against PREFIX:settings; a field
 *     stored with another value refuses the start (PC_ERR_STATE, the reason names the setting,
 *     both values and how to change it for the whole cluster): gateways that share a registry
 *     must bill the same prompt alike. Fields absent are added (HSETNX), so a gateway may have
 *     settings the others lack (a model only it serves). Both checks run before anything is
 *     written: a refused gateway changes nothing;
 *   - the registration: PREFIX:gw:INST absent -> ours. Held by another nonce -> the start watches
 *     it for up to one lease: renewed by its holder (its TTL went up) -> refused (PC_ERR_EXISTS,
 *     a live gateway has this instance id); expired -> ours (a crashed predecessor);
 *   - Redis unreachable -> the start succeeds in state DOWN (degraded) and both checks run on the
 *     first connect (and on every renewal); a mismatch found then puts the registry in FENCED
 *     with the reason logged and on_state called, and it stays refusing (never mutates) until
 *     stopped.
 *
 * States (gw_registry_state_t, on_state on every change, with a reason):
 *   UP      connected, registered, scripts loaded: claims go to Redis.
 *   DOWN    no usable connection (connecting, lost, timed out): claims are refused at once
 *           (gw_registry_claim returns GW_REGISTRY_REFUSED_DOWN), commits/reads/releases queue for
 * replay. FENCED  our registration is not ours (a mutation answered KVGWFENCED, a renew found
 * another nonce, or the start checks failed on a late first connect): nothing mutates; the registry
 * re-registers when the key is absent again (never after a secret or settings mismatch). The lease
 * is renewed every lease/4; a renewal that fails (Redis down) leaves the state DOWN.
 *
 * Claims. gw_registry_claim sends one script for a request's points (its own deadline,
 * params.timeout_ms, default 50 ms, one timer for all claims: deadlines are FIFO). Per point:
 *   LIVE   a live entry: its expiry (wall ms) and TTL class (insert it into the replica)
 *   OTHER  claimed by another request (of any gateway, this one included): that request's worker
 *   MINE   claimed by us now (only a write point that was neither live nor claimed): commit it at
 *          the first token with the fence, or release it if the request fails before
 *   ABSENT not a write point, neither live nor claimed
 * The callback runs exactly once, on the loop, never inside gw_registry_claim: ST_OK with points,
 * or ST_TIMEOUT (the deadline passed: decide locally), ST_FENCED, ST_ERROR — unless the op is
 * cancelled first (gw_registry_cancel: no callback). A reply that arrives after the deadline or
 * after a cancel is ignored, except that claims it won are released (fire-and-forget).
 *
 * Commit, read, release are fire-and-forget and idempotent (expiries are maxima, claims are
 * fence-checked): they go through one FIFO queue bounded by replay_max ops and
 * replay_max_bytes (the oldest dropped and counted). While UP the queue drains at once (a few
 * ops pipelined); an op leaves it when Redis answered it (a lost reply resends it: idempotent).
 * While DOWN or FENCED it waits and is replayed in order after the next registration.
 * Failover: commits and reads that Redis acknowledged in the last failover_replay_ms are kept
 * (bounded like the queue) and go back in front of the queue when the main connection comes up
 * on another primary: what the old primary accepted and never replicated is restored.
 *
 * Feed. A second connection reads PREFIX:feed with XREAD BLOCK (COUNT feed_count), each XREAD
 * preceded on the same connection by XINFO STREAM so that entries trimmed before we read them
 * are counted as a gap (max-deleted-entry-id beyond our last id). The feed starts at the stream's
 * end at the first connect and resumes from the last id read after a reconnect or a failover.
 * Every field is checked (type, origin, namespace, tokens a multiple of 4 bytes and at most
 * max_event_tokens, points strictly increasing with the last at the token count, at most
 * GW_REGISTRY_MAX_POINTS, TTL classes, numbers, tenant and model as GW_REGISTRY_LABEL_MAX says,
 * both or neither); a bad event is counted as rejected and skipped,
 * never crashes. Events of our own origin are skipped. on_feed gets the others.
 *
 * Storage meter. Exactly one gateway holds PREFIX:meter (taken and renewed with the lease);
 * gw_registry_meter says whether this one meters: SHARED (held, last renewal confirmed), LOCAL
 * (Redis is down but our lease, counted from the renewal's send time, has not run out: keep
 * metering, mark the events `registry: local`), NONE (another holds it, or ours ran out).
 *
 * Time: every time that crosses to Redis or the feed is wall-clock ms since the epoch (*_wall_ms);
 * the caller converts from its monotonic clock. Redis's own expiry is authoritative.
 *
 * Memory and trust: everything Redis or the feed sends is bounded (event sizes by
 * max_event_tokens, names by GW_REGISTRY_NAME_MAX, XREAD by feed_count); the queue by
 * replay_max / replay_max_bytes. Pointers passed in are copied before a call returns.
 */
#ifndef GW_REGISTRY_H
#define GW_REGISTRY_H

#include "redisconn.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct gw_registry gw_registry_t;
typedef struct gw_registry_op gw_registry_op_t;

/* Points per call (claim, commit, read, release) and per feed event. */
#define GW_REGISTRY_MAX_POINTS 64
/* Longest instance id / worker name / prefix, in bytes, without the NUL. Instance ids and
 * prefixes are printable ASCII without spaces; worker names printable without spaces. */
#define GW_REGISTRY_NAME_MAX 127
/* Longest tenant / model name in a t=w event, in bytes: what the ledger stores (billing.h's
 * BILL_STR_MAX - 1). 1 or more bytes, none a control character (< 0x20 or 0x7f); spaces and
 * UTF-8 allowed, as in the configuration's tenants and model names. */
#define GW_REGISTRY_LABEL_MAX 63
/* Settings compared across gateways (params.settings). */
#define GW_REGISTRY_MAX_SETTINGS 32
/* Bytes of the namespace-secret check (params.secret_check). */
#define GW_REGISTRY_SECRET_CHECK_BYTES 32

typedef enum gw_registry_state {
    GW_REGISTRY_DOWN = 0,
    GW_REGISTRY_UP = 1,
    GW_REGISTRY_FENCED = 2,
} gw_registry_state_t;

/* The ops, for stats and the latency callback (metrics: op="claim|commit|read|release|lease"). */
typedef enum gw_registry_opkind {
    GW_REGISTRY_OP_CLAIM = 0,
    GW_REGISTRY_OP_COMMIT = 1,
    GW_REGISTRY_OP_READ = 2,
    GW_REGISTRY_OP_RELEASE = 3,
    GW_REGISTRY_OP_LEASE = 4, /* registration, renewal and the meter lease */
} gw_registry_opkind_t;
#define GW_REGISTRY_OPS 5

/* Error kinds (metrics: kind="timeout|error|fenced"). */
enum { GW_REGISTRY_ERR_TIMEOUT = 0, GW_REGISTRY_ERR_ERROR = 1, GW_REGISTRY_ERR_FENCED = 2 };
#define GW_REGISTRY_ERR_KINDS 3

/* Claim outcomes per claim op (metrics: result="won|waited|live|timeout|error"): won = at least
 * one MINE; waited = no MINE, at least one OTHER; live = neither; timeout = its deadline passed;
 * error = error reply, FENCED, or the connection lost before the deadline. */
enum {
    GW_REGISTRY_CLAIM_WON = 0,
    GW_REGISTRY_CLAIM_WAITED = 1,
    GW_REGISTRY_CLAIM_LIVE = 2,
    GW_REGISTRY_CLAIM_TIMEOUT = 3,
    GW_REGISTRY_CLAIM_ERROR = 4,
};
#define GW_REGISTRY_CLAIM_RESULTS 5

/* One point of a request's plan: the prefix tokens[0..n_tokens). Points of a call are strictly
 * increasing in n_tokens. */
typedef struct gw_registry_point {
    uint32_t n_tokens;
    uint8_t ttl; /* a gw_cindex_ttl_t value: 0 = 5m, 1 = 1h */
    bool write;  /* claim: the plan writes this point (only write points can be MINE) */
} gw_registry_point_t;

/* A feed event (w or r) as given to on_feed. Pointers are valid during the callback only. */
typedef struct gw_registry_feed_point {
    uint32_t n_tokens;
    uint8_t ttl;
    uint64_t expiry_wall_ms;
} gw_registry_feed_point_t;

typedef struct gw_registry_feed_event {
    char type;          /* 'w' (entries written) or 'r' (a read) */
    const char *origin; /* the instance id that wrote it (never ours) */
    uint64_t ns;
    const uint32_t *tokens; /* [n_tokens]: w: up to the longest point; r: the n_read tokens */
    size_t n_tokens;
    /* w: */
    const gw_registry_feed_point_t *points; /* [n_points] strictly increasing, last = n_tokens */
    size_t n_points;
    uint64_t start_wall_ms; /* the writing request's start */
    const char *worker;     /* the worker that holds the KV (its name) */
    const char *tenant;     /* the namespace's owner: tenant and model name ("" for both when */
    const char *model;      /* the writer was a gateway older than these fields) */
    /* r: */
    uint64_t now_wall_ms; /* when the read happened */
    /* both: the stream id's time (Redis's clock when the event was added) */
    uint64_t event_wall_ms;
} gw_registry_feed_event_t;

/* One setting compared across the gateways of a registry (PREFIX:settings): name and value,
 * each 1-GW_REGISTRY_NAME_MAX bytes without control characters, names distinct. */
typedef struct gw_registry_setting {
    const char *name;
    const char *value;
} gw_registry_setting_t;

typedef struct gw_registry_params {
    /* The connection (fixed address or sentinels; copied). Its timeout_ms is redis.timeout: the
     * start's blocking connect and every command's reply deadline (default 500 ms here). Its
     * callbacks are the registry's own: leave them NULL. */
    bill_redis_params_t redis;
    const char *prefix;   /* default "kvgw" */
    const char *instance; /* required: billing.instance_id, unique per gateway */
    /* keyed BLAKE2b(namespace secret, "kvgw-registry-secret-check"), computed by the caller
     * (gateway/ns.c owns the secret); stored and compared as hex. */
    uint8_t secret_check[GW_REGISTRY_SECRET_CHECK_BYTES];
    /* What every gateway of the registry must agree on (see the top; copied at start). */
    const gw_registry_setting_t *settings;
    size_t n_settings;         /* at most GW_REGISTRY_MAX_SETTINGS */
    uint32_t timeout_ms;       /* a claim's deadline, default 50 */
    uint64_t claim_ttl_ms;     /* default 30000; > timeout_ms */
    uint64_t lease_ms;         /* registration and meter lease, default 10000, renewed every /4 */
    uint64_t feed_maxlen;      /* XADD MAXLEN ~, default 100000 */
    uint32_t replay_max;       /* queued commits/reads/releases, default 65536 */
    uint64_t replay_max_bytes; /* and their bytes, default 64 MiB */
    /* Commits and reads acknowledged this recently (bounded by replay_max and replay_max_bytes
     * too) are sent again to a new primary after a Sentinel failover; default 30000, 0: off. */
    uint64_t failover_replay_ms;
    uint32_t max_event_tokens; /* tokens in a call or a feed event, default 1 << 20; serve
                                  passes its models' largest context (a longer prompt is
                                  refused), so one XREAD buffers at most feed_count x that */
    uint32_t feed_count;       /* XREAD COUNT, default 256 */
    uint32_t feed_block_ms;    /* XREAD BLOCK, default 1000 */
    uint64_t ttl_ms[2];        /* TTL of each class (the cindex's), default 300000, 3600000 */
    bool meter;                /* compete for the storage-meter lease (default true) */

    /* Callbacks on the loop (all may be NULL); ud is passed back. */
    /* A feed event of another gateway. Return 0 when applied, negative when the caller rejects
     * it (a token id out of the model's vocabulary, out of memory): counted as rejected. */
    int (*on_feed)(const gw_registry_feed_event_t *ev, void *ud);
    /* Every state change, with a one-line reason (valid during the call). */
    void (*on_state)(gw_registry_state_t state, const char *reason, void *ud);
    /* Every op that got an answer from Redis (or timed out): its kind and its latency in seconds
     * from send to reply (a timed-out claim: its deadline). For the op_seconds histogram. */
    void (*on_op)(gw_registry_opkind_t op, double seconds, void *ud);
    void *ud;
} gw_registry_params_t;

/* Defaults as above; redis = bill_redis_params_default() with timeout_ms 500. */
gw_registry_params_t gw_registry_params_default(void);

/* ---- lifecycle ------------------------------------------------------------------------------ */

/* The blocking start-up step (see the top), then the background connections on loop. Returns 0
 * and *out (state UP, or DOWN when Redis was unreachable), PC_ERR_PERM (namespace secret
 * mismatch), PC_ERR_STATE (a setting differs from PREFIX:settings), PC_ERR_EXISTS (the instance
 * id is held by a live gateway), PC_ERR_INVAL (bad params) or PC_ERR_NOMEM, with the reason in
 * err. Loop thread (the loop need not run yet). */
int gw_registry_start(uv_loop_t *loop, const gw_registry_params_t *p, gw_registry_t **out,
                      char *err, size_t err_len);

/* Stops: waiting claims are answered ERROR (their callbacks run inside this call), queued ops not
 * yet sent are dropped (counted), our registration and meter lease are deleted when Redis answers
 * in time (best effort, bounded by the redis timeout; a crash leaves them to expire), the
 * connections are closed, and on_closed(ud) runs on the loop once r is freed. NULL is a no-op. */
void gw_registry_stop(gw_registry_t *r, void (*on_closed)(void *ud), void *ud);

/* ---- claims --------------------------------------------------------------------------------- */

/* gw_registry_claim's soft outcome: not UP, decide locally (no callback). */
#define GW_REGISTRY_REFUSED_DOWN 1

typedef enum gw_registry_status {
    GW_REGISTRY_ST_OK = 0,
    GW_REGISTRY_ST_TIMEOUT = 1, /* the deadline passed first */
    GW_REGISTRY_ST_FENCED = 2,  /* the registry is fenced (the script answered KVGWFENCED) */
    GW_REGISTRY_ST_ERROR = 3,   /* an error reply or a malformed one, or the connection lost */
} gw_registry_status_t;

typedef enum gw_registry_point_state {
    GW_REGISTRY_PT_ABSENT = 0,
    GW_REGISTRY_PT_LIVE = 1,
    GW_REGISTRY_PT_OTHER = 2,
    GW_REGISTRY_PT_MINE = 3,
} gw_registry_point_state_t;

typedef struct gw_registry_point_result {
    gw_registry_point_state_t state;
    uint8_t ttl;             /* LIVE: the entry's TTL class */
    uint32_t n_tokens;       /* the point's length (as asked) */
    uint64_t expiry_wall_ms; /* LIVE: the entry's expiry */
    const char *worker;      /* OTHER: the claimant's worker name ("" otherwise) */
    const char *instance;    /* OTHER: the claimant's gateway instance id ("" otherwise) */
} gw_registry_point_result_t;

typedef struct gw_registry_claim_result {
    gw_registry_status_t status;
    size_t n_points;                          /* OK: as asked; else 0 */
    const gw_registry_point_result_t *points; /* [n_points] in the order asked */
    uint64_t fence;                           /* OK with a MINE: our fence (commit/release) */
    double seconds;                           /* send to answer (TIMEOUT: the deadline) */
} gw_registry_claim_result_t;

/* The result and every pointer in it are valid during the callback only. */
typedef void (*gw_registry_claim_cb)(const gw_registry_claim_result_t *res, void *ud);

/* Asks Redis about the points of tokens (n_tokens >= the longest point) in namespace ns for a
 * request that would run on `worker` (its name, see ARCHITECTURE: the worker's HELLO_ACK name or
 * its address). Returns 0 and *op (cb runs exactly once unless gw_registry_cancel(op) first; op
 * is valid until then), GW_REGISTRY_REFUSED_DOWN as a positive soft outcome (state not UP, or
 * the connection between a drop and its scripts' reload, or stopping: decide
 * locally, no callback; counted), PC_ERR_INVAL (no points, more than GW_REGISTRY_MAX_POINTS, not
 * increasing, beyond n_tokens or max_event_tokens, a bad TTL class, a bad worker name) or
 * PC_ERR_NOMEM (no callback for these). */
int gw_registry_claim(gw_registry_t *r, uint64_t ns, const uint32_t *tokens, size_t n_tokens,
                      const gw_registry_point_t *points, size_t n_points, const char *worker,
                      gw_registry_claim_cb cb, void *ud, gw_registry_op_t **op);

/* Cancels a claim whose callback has not run (the client left): no callback; if Redis's answer
 * (later) says we won points, they are released. */
void gw_registry_cancel(gw_registry_t *r, gw_registry_op_t *op);

/* ---- fire-and-forget ------------------------------------------------------------------------ */

/* Writes the entries tokens[0..points[i].n_tokens) of ns (the request's prefill is done): expiry
 * start_wall_ms + ttl_ms[ttl] each, max with what Redis holds; deletes our claims of fence (0: a
 * local decision, no claims); XADDs t=w with worker and the namespace's owner (tenant, model
 * name: GW_REGISTRY_LABEL_MAX). Queued (see the top). Returns 0, PC_ERR_INVAL (as claim, or a bad
 * tenant or model) or PC_ERR_NOMEM; when the queue is full the oldest op is dropped (counted). */
int gw_registry_commit(gw_registry_t *r, uint64_t ns, const char *tenant, const char *model,
                       const uint32_t *tokens, const gw_registry_point_t *points, size_t n_points,
                       uint64_t fence, uint64_t start_wall_ms, const char *worker);

/* Refreshes the live entries read by a request (points: their lengths and TTL classes, each <=
 * n_read): PEXPIREAT GT max(old, now_wall_ms + ttl_ms[max(class, stored class)]) on each entry
 * that exists; XADDs t=r with tokens[0..n_read). Queued. Returns as commit. */
int gw_registry_read(gw_registry_t *r, uint64_t ns, const uint32_t *tokens, size_t n_read,
                     const gw_registry_point_t *points, size_t n_points, uint64_t now_wall_ms);

/* Deletes our claims (fence and instance checked) of the points of a request that failed before
 * its prefill. Queued. Returns as commit. */
int gw_registry_release(gw_registry_t *r, uint64_t ns, const uint32_t *tokens,
                        const gw_registry_point_t *points, size_t n_points, uint64_t fence);

/* ---- state, meter, stats -------------------------------------------------------------------- */

gw_registry_state_t gw_registry_state(const gw_registry_t *r);

typedef enum gw_registry_meter {
    GW_REGISTRY_METER_NONE = 0,
    GW_REGISTRY_METER_SHARED = 1,
    GW_REGISTRY_METER_LOCAL = 2,
} gw_registry_meter_t;

/* Whether this gateway emits storage events now (see the top). */
gw_registry_meter_t gw_registry_meter(const gw_registry_t *r);

typedef struct gw_registry_stats {
    gw_registry_state_t state;
    char nonce[33];       /* our registration nonce (hex) */
    uint64_t degraded_ms; /* total time not UP since start (including now, if not UP) */
    uint64_t claims[GW_REGISTRY_CLAIM_RESULTS];
    uint64_t claims_refused_down;  /* claims answered GW_REGISTRY_REFUSED_DOWN */
    uint64_t ops[GW_REGISTRY_OPS]; /* ops answered by Redis */
    uint64_t errors[GW_REGISTRY_OPS][GW_REGISTRY_ERR_KINDS];
    uint64_t feed[2][3];              /* [w, r][applied, skipped (own origin), rejected] */
    uint64_t feed_rejected_other;     /* rejected before the type was known (no valid t, a
                                         duplicated field, a bad id): type="unknown" */
    uint64_t feed_last_event_wall_ms; /* the last applied event's stream time; 0: none */
    uint64_t feed_gaps;               /* trims past our last id */
    uint64_t replay_pending;          /* queued ops (not yet answered) */
    uint64_t replay_bytes;
    uint64_t replay_dropped;  /* dropped for the bounds, or at stop */
    uint64_t replayed;        /* ops sent after having waited through DOWN/FENCED */
    uint64_t failover_resent; /* recent commits/reads sent again after a failover */
    uint64_t late_releases;   /* claims won after their deadline or cancel, released */
    uint64_t failovers;       /* primary changes (redisconn n_failovers, both connections) */
    uint64_t n_registrations; /* successful registrations (first and after a fence) */
    bool meter_held;
} gw_registry_stats_t;

void gw_registry_stats(const gw_registry_t *r, gw_registry_stats_t *out);

/* The XXH3-128 key of the prefix tokens[0..n) of ns as 32 lower-case hex digits + NUL (what the
 * keys use); for tests and tools. */
void gw_registry_key_hex(uint64_t ns, const uint32_t *tokens, size_t n, char out[33]);

#endif
