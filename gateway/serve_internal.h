/*
 * serve_internal.h — what the files of `kvgw serve` share: the gateway's state (struct serve)
 * and the functions one file offers the others.
 *
 *   serve.c    the wiring: startup, dispatch of HTTP requests to endpoints, signals, teardown
 *   request.c  the request object (request.h): its body, lifecycle, worker events, billing
 *   admin.c    GET /admin/v1/usage, the ledger export streamed from the thread pool
 *   observe.c  metrics, gauges, the access log, the tick (expiry, storage metering)
 *
 * Everything here runs on the loop thread, except what request.h says runs on the pool.
 */
#ifndef GW_SERVE_INTERNAL_H
#define GW_SERVE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <uv.h>

#include "billing.h"
#include "cindex.h"
#include "common.h"
#include "config.h"
#include "http.h"
#include "ledger.h"
#include "metrics.h"
#include "ns.h"
#include "pool.h"
#include "registry.h"
#include "render.h"
#include "router.h"
#include "shipper.h"
#include "tokenizer.h"
#include "pc_strmap.h"
#include "pc_u64map.h"

#define GW_SERVE_MAX_MODELS 16
/* Tenants not in this configuration that the change feed may name (serve_t.feed_tenants). */
#define GW_SERVE_MAX_FEED_TENANTS 4096
#define GW_SERVE_TICK_MS 250
#define GW_OBS_TIER_COUNTERS 9

typedef struct gw_model_rt {
    const gw_cfg_model_t *cfg;
    uint32_t index;
    eng_tok_t *tok;
    eng_render_t *render;
    eng_tokcache_t *tokcache; /* segment -> ids, per namespace; NULL when the config says 0 */
    uint32_t n_ctx;
} gw_model_rt_t;

typedef struct gw_req gw_req_t;

/* Who owns a namespace that was derived without a cache_salt (tenant x model, precomputed at
 * start when a registry is configured): the change feed names namespaces only, and an entry
 * needs its owner in the namespace table (storage billing). */
typedef struct gw_ns_owner {
    const char *tenant; /* the configuration's string */
    uint32_t model;
} gw_ns_owner_t;

typedef struct serve {
    uv_loop_t *loop;
    gw_config_t cfg;
    gw_model_rt_t models[GW_SERVE_MAX_MODELS];
    size_t n_models;
    gw_http_server_t *http;
    gw_pool_t *pool;
    gw_cindex_t *ix;
    gw_router_t router;
    bill_pricing_t *pricing;
    bill_ledger_t *ledger;
    bill_shipper_t *shipper; /* NULL without Redis */
    /* GET /admin/v1/usage (admin.c): whether ?scope=cluster is the default (gw_serve sets it
     * when a registry is configured; else the default is local). */
    bool usage_cluster_default;
    bill_idgen_t idgen;
    uv_async_t ledger_wake;
    uv_timer_t tick;
    uv_signal_t sig_int, sig_term, sig_hup;
    uint64_t next_wire_id;
    gw_req_t *live;       /* requests on a worker (iteration: worker down, gauges) */
    pc_u64map_t live_map; /* the same requests by wire id (worker events) */
    gw_req_t *durable_head, *durable_tail;
    FILE *access_log;          /* lines are buffered and flushed by the tick, not per request */
    bool access_log_dirty;     /* a line was written since the last flush */
    size_t access_log_pending; /* bytes handed to stdio since its last flush */
    size_t freed_large;        /* body bytes of large requests freed since the last malloc_trim */
    bool stopping;
    bool http_closed;
    int exit_code;
    uint64_t last_storage_ms;
    gw_ns_tab_t ns; /* namespaces with cache entries (storage billing's owners) */
    /* The registry (many gateways, one cache): NULL without `registry: enabled`. */
    gw_registry_t *reg;
    gw_registry_state_t reg_state; /* the latest on_state */
    size_t n_claiming;             /* requests in CLAIMING (the loop runs until they end) */
    gw_registry_stats_t reg_seen;  /* its counters as last added to the metrics */
    pc_u64map_t ns_owners;         /* unsalted ns -> gw_ns_owner_t* (ns_owner_tab) */
    gw_ns_owner_t *ns_owner_tab;
    /* Tenants that other gateways' t=w events name (the owner of every namespace, salted ones
     * included): name -> const char * (the configuration's string, or a copy in feed_tenant_copy
     * for a tenant this configuration lacks, at most GW_SERVE_MAX_FEED_TENANTS of them). The
     * namespace table borrows these strings; they live until the end. */
    pc_strmap_t feed_tenants;
    char **feed_tenant_copy;
    size_t n_feed_tenant_copy;
    bool warned_feed_model; /* a t=w event of a model not configured here was logged */
    /* metrics (observe.c) */
    gw_metrics_t *m;
    gw_metric_t *m_requests, *m_duration, *m_ttft, *m_tokens, *m_hit_tokens, *m_lookups;
    gw_metric_t *m_entries, *m_entry_tokens, *m_expired, *m_worker_up, *m_worker_queue,
        *m_worker_free, *m_worker_kv_tokens, *m_worker_kv_dtype, *m_routes, *m_billing, *m_inflight,
        *m_build, *m_ship_lag, *m_ship_refused;
    gw_metric_t *m_internal_errors, *m_namespaces;
    gw_metric_t *m_tenant_tokens; /* metrics.per_tenant only: bounded by the configured tenants */
    /* KV tiers per worker and tier (observe.c): gauges from the latest LOAD, counters fed by
     * the growth of the worker's own counters since the previous update (tier_seen). */
    gw_metric_t *m_tier_max_bytes, *m_tier_bytes, *m_tier_blocks, *m_tier_bandwidth,
        *m_tier_indexed_tokens, *m_recomputed, *m_prefill_rate, *m_prompt_sources;
    gw_metric_t *m_tier_counters[GW_OBS_TIER_COUNTERS]; /* observe.c's tier_counters */
    /* the registry (observe.c; the names are fixed for Grafana) */
    gw_metric_t *m_gw_info, *m_reg_up, *m_reg_degraded, *m_reg_decisions, *m_reg_claims, *m_reg_op,
        *m_reg_errors, *m_reg_feed, *m_reg_feed_lag, *m_reg_feed_gaps, *m_reg_replay_pending,
        *m_reg_replay_dropped, *m_reg_failovers, *m_reg_failover_resent, *m_reg_meter;
    eng_wire_load_t tier_seen[GW_POOL_MAX_WORKERS];
} serve_t;

/* ---- serve.c: the registry's side of the wiring ------------------------------------------ */

/* Worker i's identity across gateways (what claims and the feed name it by): its own name from
 * HELLO_ACK when it gave a usable one (printable, no spaces, at most GW_REGISTRY_NAME_MAX bytes)
 * that no other worker of this gateway also gives, else its address as configured. In-process
 * workers are this gateway's alone: "INSTANCE/local-N", which no other gateway matches. Written
 * to buf (cap bytes); returns buf. */
const char *gw__serve_worker_id(const serve_t *s, uint32_t i, char *buf, size_t cap);

/* The worker of model `model` whose identity is id, or -1 (this gateway is not connected to it). */
int gw__serve_worker_by_id(const serve_t *s, const char *id, uint32_t model);

/* The config's Redis (an address or Sentinel) as redisconn's params; sent is the room for the
 * sentinels' addresses, which p points into (it must live as long as p). Returns 0, or
 * PC_ERR_INVAL with the reason in err (a sentinel address that does not parse: config.c refuses
 * it first). */
int gw__serve_redis_params(const gw_config_t *c, bill_redis_params_t *p,
                           bill_redis_addr_t sent[BILL_REDIS_MAX_SENTINELS], char *err,
                           size_t err_len);

/* The owner (tenant, model) of ns: the namespace table's record, else the unsalted namespaces of
 * the configuration. Returns false when unknown (a salted namespace this gateway never served). */
bool gw__serve_ns_owner(const serve_t *s, uint64_t ns, const char **tenant, uint32_t *model);

/* The monotonic time (the index's clock) of a wall-clock time (Redis's and the feed's), converted
 * at the boundary with wall_now - mono_now; 0 when it lies before the monotonic epoch. */
static inline uint64_t gw__mono_of_wall(uint64_t wall_ms)
{
    uint64_t wall = pc_time_wall_ms(), mono = pc_time_mono_ms();
    if (wall_ms >= wall)
        return mono + (wall_ms - wall);
    return wall - wall_ms < mono ? mono - (wall - wall_ms) : 0;
}

/* Writes the entries points[0..n) (strictly increasing lengths, expiries in wall-clock ms) of
 * the prefix tokens of ns, owned by (tenant, model), into the index as the registry knows them:
 * each with the expiry Redis gave it (never beyond now + its TTL class), and counted in the
 * namespace table. Points already past are skipped. Returns 0 or the first error (a token out of
 * the vocabulary, out of memory); what was written before it stays. */
int gw__serve_replica_write(serve_t *s, uint64_t ns, const char *tenant, uint32_t model,
                            const uint32_t *tokens, const gw_registry_feed_point_t *points,
                            size_t n_points, uint64_t now_ms);

/* ---- observe.c --------------------------------------------------------------------------- */

void gw__obs_setup_metrics(serve_t *s);
void gw__obs_update_gauges(serve_t *s);
/* A PREFILL frame: the prompt tokens of its request by where their KV came from
 * (kvgw_prompt_tokens_by_source_total). */
void gw__obs_count_prefill(serve_t *s, uint32_t worker, const eng_wire_prefill_t *pf);
/* Counts q's request (status) in the metrics and writes its access log line, once. */
void gw__obs_count_request(gw_req_t *q, int status);
/* An internal failure that changed what a request delivered or billed: counted in
 * kvgw_internal_errors_total{site} and logged (fmt: printf; client strings escaped by the
 * caller). */
void gw__obs_internal_error(serve_t *s, const char *site, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A request body at least this large counts towards the next malloc_trim when freed, which
 * the tick runs once GW_OBS_TRIM_AFTER bytes of them were freed (observe.c). */
#define GW_OBS_LARGE_BODY ((size_t)1 << 20)
#define GW_OBS_TRIM_AFTER ((size_t)32 << 20)
void gw__obs_on_tick(uv_timer_t *t);
/* Bills the storage of the cache since the previous call; then forgets the namespaces left
 * without entries. */
void gw__obs_meter_storage(serve_t *s);
/* cindex params.on_drop: metrics, the workers' pins, the namespace's entry count. */
void gw__obs_on_entry_drop(const gw_cindex_drop_t *ev, void *ud);
/* The access log's stdio buffer: lines are flushed by the tick, or before a line that would
 * not fit (so the file only ever holds whole lines). */
#define GW_ACCESS_LOG_BUF (64u << 10)
FILE *gw__obs_open_access_log(const char *path);
/* registry params.on_op: the op_seconds histogram. */
void gw__obs_registry_op(gw_registry_opkind_t op, double seconds, void *ud);
/* One billing decision of a request with a registry (registry: shared or local). */
void gw__obs_registry_decision(serve_t *s, bool shared);
void gw__obs_on_sighup(uv_signal_t *h, int sig);

/* ---- admin.c ----------------------------------------------------------------------------- */

/* GET /admin/v1/usage. Returns true when the export started (q is then owned by the export);
 * false when it answered q (an error), which the caller then frees. */
bool gw__admin_usage(gw_req_t *q, const char *query);

#endif
