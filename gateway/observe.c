/*
 * observe.c — what `kvgw serve` shows of itself (serve_internal.h): the metrics and their
 * gauges, the access log, internal errors, and the tick (expiry, storage metering).
 *
 * Every client-controlled string in a log line is escaped: the access log is one JSON object per
 * line (pc_json_string with PC_JSON_UTF8), so a model name with a newline cannot forge a line.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "outcome.h"
#include "pc_json.h"
#include "request.h"

/* The tiers' counters: each the growth of one of the worker's own counters in its LOAD's tier
 * figures (update_tier), in s->m_tier_counters by position. */
static const struct tier_counter {
    size_t field; /* offsetof(eng_wire_tier_load_t, the u64 counter) */
    double scale; /* to base units */
    const char *name, *help;
} tier_counters[GW_OBS_TIER_COUNTERS] = {
    {offsetof(eng_wire_tier_load_t, hits), 1, "kvgw_worker_tier_hits_total",
     "KV blocks a lookup found in a worker's tier."},
    {offsetof(eng_wire_tier_load_t, loads), 1, "kvgw_worker_tier_loads_total",
     "KV blocks loaded from a tier into the pool."},
    {offsetof(eng_wire_tier_load_t, load_bytes), 1, "kvgw_worker_tier_load_bytes_total",
     "Bytes loaded from a tier into the pool."},
    {offsetof(eng_wire_tier_load_t, load_us), 1e-6, "kvgw_worker_tier_load_seconds_total",
     "Time the loads from a tier took."},
    {offsetof(eng_wire_tier_load_t, tokens_loaded), 1,
     "kvgw_worker_tier_recomputes_avoided_tokens_total",
     "Prompt tokens loaded from a tier instead of prefilled."},
    {offsetof(eng_wire_tier_load_t, writes), 1, "kvgw_worker_tier_writes_total",
     "KV blocks written to a tier."},
    {offsetof(eng_wire_tier_load_t, writes_dropped), 1, "kvgw_worker_tier_writes_dropped_total",
     "KV blocks not written to a tier because its write-behind queue was full."},
    {offsetof(eng_wire_tier_load_t, evictions), 1, "kvgw_worker_tier_evictions_total",
     "KV blocks a tier's byte budget dropped."},
    {offsetof(eng_wire_tier_load_t, corrupt), 1, "kvgw_worker_tier_corrupt_records_total",
     "Tier records that failed their checks: deleted, never served."},
};

static uint64_t tier_field(const eng_wire_tier_load_t *t, size_t field)
{
    uint64_t v;
    memcpy(&v, (const char *)t + field, sizeof v);
    return v;
}

void gw__obs_setup_metrics(serve_t *s)
{
    static const double dur[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                 1,     2.5,  5,     10,   30,  60,   120};
    const char *ep_code[] = {"endpoint", "code"}, *ep[] = {"endpoint"}, *outc[] = {"cache"},
               *typ[] = {"type"}, *kind[] = {"kind"}, *res[] = {"result"}, *wk[] = {"worker"},
               *rea[] = {"reason"}, *state[] = {"state"}, *ver[] = {"version"}, *site[] = {"site"};
    s->m = gw_metrics_new();
    s->m_build = gw_metrics_gauge(s->m, "kvgw_build_info", "Build information.", 1, ver);
    s->m_requests = gw_metrics_counter(s->m, "kvgw_requests_total",
                                       "HTTP requests by endpoint and status code.", 2, ep_code);
    s->m_duration = gw_metrics_histogram(s->m, "kvgw_request_duration_seconds",
                                         "Request duration, first byte to last byte.", 1, ep, dur,
                                         PC_ARRAY_LEN(dur));
    s->m_ttft =
        gw_metrics_histogram(s->m, "kvgw_time_to_first_token_seconds",
                             "Time to first token by cache outcome (hit, partial, write, miss).", 1,
                             outc, dur, PC_ARRAY_LEN(dur));
    s->m_tokens =
        gw_metrics_counter(s->m, "kvgw_tokens_total",
                           "Billed tokens by bucket (prompt buckets are disjoint).", 1, typ);
    s->m_hit_tokens = gw_metrics_counter(
        s->m, "kvgw_cache_hit_tokens_total",
        "Prompt tokens read from the cache: logical (billed) and physical (KV reused).", 1, kind);
    s->m_lookups =
        gw_metrics_counter(s->m, "kvgw_cache_lookups_total",
                           "Cache lookups by outcome (hit, partial, write, miss).", 1, res);
    s->m_entries = gw_metrics_gauge(s->m, "kvgw_cache_entries", "Live cache entries.", 0, NULL);
    s->m_entry_tokens =
        gw_metrics_gauge(s->m, "kvgw_cache_tokens", "Tokens held by live cache entries.", 0, NULL);
    s->m_namespaces =
        gw_metrics_gauge(s->m, "kvgw_namespaces",
                         "Cache namespaces with entries (or storage not yet metered).", 0, NULL);
    s->m_expired = gw_metrics_counter(s->m, "kvgw_cache_expirations_total",
                                      "Cache entries removed, by reason.", 1, rea);
    s->m_worker_up =
        gw_metrics_gauge(s->m, "kvgw_worker_up", "1 when the worker is usable.", 1, wk);
    s->m_worker_queue = gw_metrics_gauge(s->m, "kvgw_worker_queued_requests",
                                         "Requests waiting for admission on the worker.", 1, wk);
    s->m_worker_free = gw_metrics_gauge(s->m, "kvgw_worker_free_kv_blocks",
                                        "Free KV blocks on the worker.", 1, wk);
    s->m_worker_kv_tokens =
        gw_metrics_gauge(s->m, "kvgw_worker_kv_capacity_tokens",
                         "Tokens the worker's KV pool holds (its blocks x block size).", 1, wk);
    const char *wk_dt[] = {"worker", "dtype"};
    s->m_worker_kv_dtype =
        gw_metrics_gauge(s->m, "kvgw_worker_kv_dtype",
                         "1 for the KV cache element type an in-process worker runs.", 2, wk_dt);
    s->m_routes = gw_metrics_counter(s->m, "kvgw_routing_decisions_total",
                                     "Routing decisions by reason.", 1, rea);
    s->m_billing = gw_metrics_counter(s->m, "kvgw_billing_events_total",
                                      "Usage events by ledger outcome.", 1, state);
    s->m_internal_errors = gw_metrics_counter(
        s->m, "kvgw_internal_errors_total",
        "Internal failures that changed what a request delivered or what was billed, by site.", 1,
        site);
    s->m_inflight =
        gw_metrics_gauge(s->m, "kvgw_requests_in_flight", "Requests running on a worker.", 0, NULL);
    if (s->cfg.per_tenant_metrics) {
        const char *tt[] = {"tenant", "type"};
        s->m_tenant_tokens = gw_metrics_counter(s->m, "kvgw_tenant_tokens_total",
                                                "Billed tokens by tenant and bucket.", 2, tt);
    }
    s->m_ship_lag = gw_metrics_gauge(s->m, "kvgw_billing_shipper_lag_events",
                                     "Durable ledger records not yet shipped to Redis.", 0, NULL);
    s->m_ship_refused = gw_metrics_gauge(
        s->m, "kvgw_billing_shipper_refused",
        "1 when the shipper refuses to ship: the Redis cursor of this instance id belongs to "
        "another ledger (a new billing.instance_id is needed).",
        0, NULL);
    /* KV tiers (issue 21): G2 host memory, G3 local disk, per worker. */
    const char *wt[] = {"worker", "tier"}, *ws[] = {"worker", "source"};
    s->m_tier_max_bytes = gw_metrics_gauge(s->m, "kvgw_worker_tier_max_bytes",
                                           "Byte budget of a worker's KV tier.", 2, wt);
    s->m_tier_bytes = gw_metrics_gauge(s->m, "kvgw_worker_tier_bytes",
                                       "Bytes of KV blocks a worker's tier holds.", 2, wt);
    s->m_tier_blocks = gw_metrics_gauge(s->m, "kvgw_worker_tier_blocks",
                                        "KV blocks a worker's tier holds.", 2, wt);
    s->m_tier_bandwidth = gw_metrics_gauge(
        s->m, "kvgw_worker_tier_load_bytes_per_second",
        "Moving average of a tier's load bandwidth (the load-or-recompute cost model's input).", 2,
        wt);
    s->m_tier_indexed_tokens = gw_metrics_gauge(
        s->m, "kvgw_worker_indexed_tokens",
        "Tokens of live cache entries the gateway believes a worker holds, by tier (g1: pool).", 2,
        wt);
    for (size_t i = 0; i < PC_ARRAY_LEN(tier_counters); i++)
        s->m_tier_counters[i] =
            gw_metrics_counter(s->m, tier_counters[i].name, tier_counters[i].help, 2, wt);
    s->m_recomputed = gw_metrics_counter(
        s->m, "kvgw_worker_hole_recomputed_tokens_total",
        "Prompt tokens of holes (blocks in no tier between loaded ones) recomputed.", 1, wk);
    s->m_prefill_rate = gw_metrics_gauge(
        s->m, "kvgw_worker_prefill_tokens_per_second",
        "Moving average of a worker's prefill rate (the cost model's other input).", 1, wk);
    s->m_prompt_sources = gw_metrics_counter(
        s->m, "kvgw_prompt_tokens_by_source_total",
        "Prompt tokens by where the worker took their KV: g1 (its pool), g2, g3 (loaded from a "
        "tier), recompute (a hole recomputed between loaded blocks), prefill (computed).",
        2, ws);
    const char *v[] = {KVGW_VERSION};
    gw_metric_set(s->m_build, v, 1);
    /* Many gateways, one cache (issue 22): every gateway names itself; the registry's series
     * exist only with a registry. */
    const char *inst[] = {"instance_id"};
    s->m_gw_info = gw_metrics_gauge(s->m, "kvgw_gateway_info",
                                    "This gateway's billing.instance_id (value 1).", 1, inst);
    const char *iv[] = {s->cfg.instance_id};
    gw_metric_set(s->m_gw_info, iv, 1);
    if (!s->cfg.registry_enabled)
        return;
    static const double opb[] = {0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01,
                                 0.025,  0.05,   0.1,   0.25,  0.5,   1};
    const char *reg[] = {"registry"}, *op[] = {"op"}, *opk[] = {"op", "kind"},
               *tr[] = {"type", "result"};
    s->m_reg_up =
        gw_metrics_gauge(s->m, "kvgw_registry_up",
                         "1 when the registry is connected, registered and not fenced.", 0, NULL);
    s->m_reg_degraded = gw_metrics_counter(s->m, "kvgw_registry_degraded_seconds_total",
                                           "Time spent without the registry (Redis down or "
                                           "fenced): decisions were local.",
                                           0, NULL);
    s->m_reg_decisions = gw_metrics_counter(
        s->m, "kvgw_registry_decisions_total",
        "Billing decisions by how they were made: shared (with Redis) or local (without).", 1, reg);
    s->m_reg_claims =
        gw_metrics_counter(s->m, "kvgw_registry_claims_total",
                           "Claims by result (won, waited, live, timeout, error).", 1, res);
    s->m_reg_op = gw_metrics_histogram(s->m, "kvgw_registry_op_seconds",
                                       "Registry operations' latency, send to answer.", 1, op, opb,
                                       PC_ARRAY_LEN(opb));
    s->m_reg_errors = gw_metrics_counter(s->m, "kvgw_registry_errors_total",
                                         "Registry operations that failed, by op and kind "
                                         "(timeout, error, fenced).",
                                         2, opk);
    s->m_reg_feed = gw_metrics_counter(s->m, "kvgw_registry_feed_events_total",
                                       "Change feed events by type (w: written, r: read, "
                                       "unknown: rejected before its type was read) and "
                                       "result (applied, skipped: our own, rejected).",
                                       2, tr);
    s->m_reg_feed_lag =
        gw_metrics_gauge(s->m, "kvgw_registry_feed_lag_seconds",
                         "Now minus the time of the last applied feed event.", 0, NULL);
    s->m_reg_feed_gaps = gw_metrics_counter(
        s->m, "kvgw_registry_feed_gaps_total",
        "Feed entries trimmed before this gateway read them (hits lost, never bills).", 0, NULL);
    s->m_reg_replay_pending =
        gw_metrics_gauge(s->m, "kvgw_registry_replay_pending",
                         "Commits, reads and releases queued for Redis (replayed after an "
                         "outage).",
                         0, NULL);
    s->m_reg_replay_dropped =
        gw_metrics_counter(s->m, "kvgw_registry_replay_dropped_total",
                           "Queued registry operations dropped for registry.replay_max.", 0, NULL);
    s->m_reg_failovers =
        gw_metrics_counter(s->m, "kvgw_registry_failovers_total",
                           "Redis primary changes followed through Sentinel.", 0, NULL);
    s->m_reg_failover_resent =
        gw_metrics_counter(s->m, "kvgw_registry_failover_resent_total",
                           "Recent commits and reads sent again to a new primary after a failover "
                           "(registry.failover_replay).",
                           0, NULL);
    s->m_reg_meter = gw_metrics_gauge(
        s->m, "kvgw_registry_storage_meter",
        "1 on the gateway that holds the storage-meter lease (it bills cache storage).", 0, NULL);
}

static const char *const reg_op_names[GW_REGISTRY_OPS] = {"claim", "commit", "read", "release",
                                                          "lease"};

void gw__obs_registry_op(gw_registry_opkind_t op, double seconds, void *ud)
{
    serve_t *s = ud;
    if (s->m_reg_op == NULL || (unsigned)op >= GW_REGISTRY_OPS || !(seconds >= 0))
        return;
    const char *lv[] = {reg_op_names[op]};
    gw_metric_observe(s->m_reg_op, lv, seconds);
}

void gw__obs_registry_decision(serve_t *s, bool shared)
{
    const char *lv[] = {shared ? "shared" : "local"};
    if (s->m_reg_decisions != NULL)
        gw_metric_add(s->m_reg_decisions, lv, 1);
}

/* Adds what a worker's counter grew by since it was last seen (a smaller value: the worker
 * restarted, and counts from zero again). */
static void add_growth(gw_metric_t *f, const char *const *lv, uint64_t now, uint64_t seen,
                       double scale)
{
    uint64_t d = now >= seen ? now - seen : now;
    if (d > 0)
        gw_metric_add(f, lv, (double)d * scale);
}

/* One tier of one worker: its gauges and counters, from the latest LOAD. A tier that is off
 * (no budget) has no series. */
static void update_tier(serve_t *s, const char *worker, const char *tier,
                        const eng_wire_tier_load_t *t, const eng_wire_tier_load_t *seen)
{
    if (t->max_bytes == 0 && seen->max_bytes == 0)
        return;
    const char *lv[] = {worker, tier};
    gw_metric_set(s->m_tier_max_bytes, lv, (double)t->max_bytes);
    gw_metric_set(s->m_tier_bytes, lv, (double)t->bytes);
    gw_metric_set(s->m_tier_blocks, lv, t->blocks);
    gw_metric_set(s->m_tier_bandwidth, lv, t->load_bytes_per_s);
    for (size_t i = 0; i < PC_ARRAY_LEN(tier_counters); i++) {
        const struct tier_counter *c = &tier_counters[i];
        add_growth(s->m_tier_counters[i], lv, tier_field(t, c->field), tier_field(seen, c->field),
                   c->scale);
    }
}

void gw__obs_count_prefill(serve_t *s, uint32_t worker, const eng_wire_prefill_t *pf)
{
    const gw_pool_worker_t *w = gw_pool_worker(s->pool, worker);
    if (w == NULL)
        return;
    uint64_t taken =
        (uint64_t)pf->tokens_g1 + pf->tokens_g2 + pf->tokens_g3 + pf->tokens_recomputed;
    const char *src[] = {"g1", "g2", "g3", "recompute", "prefill"};
    uint64_t n[] = {pf->tokens_g1, pf->tokens_g2, pf->tokens_g3, pf->tokens_recomputed,
                    pf->prompt_tokens > taken ? pf->prompt_tokens - taken : 0};
    for (size_t i = 0; i < PC_ARRAY_LEN(src); i++) {
        const char *lv[] = {w->name, src[i]};
        gw_metric_add(s->m_prompt_sources, lv, (double)n[i]);
    }
}

/* The registry's figures: its counters by their growth since the last update (reg_seen). */
static void update_registry(serve_t *s)
{
    static const char *const claim_res[GW_REGISTRY_CLAIM_RESULTS] = {"won", "waited", "live",
                                                                     "timeout", "error"};
    static const char *const err_kind[GW_REGISTRY_ERR_KINDS] = {"timeout", "error", "fenced"};
    static const char *const feed_t[2] = {"w", "r"}, *const feed_r[3] = {"applied", "skipped",
                                                                         "rejected"};
    gw_registry_stats_t st;
    gw_registry_stats(s->reg, &st);
    gw_registry_stats_t *seen = &s->reg_seen;
    gw_metric_set(s->m_reg_up, NULL, st.state == GW_REGISTRY_UP ? 1 : 0);
    add_growth(s->m_reg_degraded, NULL, st.degraded_ms, seen->degraded_ms, 1e-3);
    for (int i = 0; i < GW_REGISTRY_CLAIM_RESULTS; i++) {
        const char *lv[] = {claim_res[i]};
        add_growth(s->m_reg_claims, lv, st.claims[i], seen->claims[i], 1);
    }
    for (int o = 0; o < GW_REGISTRY_OPS; o++)
        for (int k = 0; k < GW_REGISTRY_ERR_KINDS; k++) {
            const char *lv[] = {reg_op_names[o], err_kind[k]};
            add_growth(s->m_reg_errors, lv, st.errors[o][k], seen->errors[o][k], 1);
        }
    for (int t = 0; t < 2; t++)
        for (int r = 0; r < 3; r++) {
            const char *lv[] = {feed_t[t], feed_r[r]};
            add_growth(s->m_reg_feed, lv, st.feed[t][r], seen->feed[t][r], 1);
        }
    /* Entries rejected before their type was known (no or a bad t, a duplicated field, a bad
     * stream id): type "unknown". */
    const char *unknown[] = {"unknown", "rejected"};
    add_growth(s->m_reg_feed, unknown, st.feed_rejected_other, seen->feed_rejected_other, 1);
    uint64_t wall = pc_time_wall_ms();
    gw_metric_set(s->m_reg_feed_lag, NULL,
                  st.feed_last_event_wall_ms != 0 && wall > st.feed_last_event_wall_ms
                      ? (double)(wall - st.feed_last_event_wall_ms) / 1000.0
                      : 0);
    add_growth(s->m_reg_feed_gaps, NULL, st.feed_gaps, seen->feed_gaps, 1);
    gw_metric_set(s->m_reg_replay_pending, NULL, (double)st.replay_pending);
    add_growth(s->m_reg_replay_dropped, NULL, st.replay_dropped, seen->replay_dropped, 1);
    add_growth(s->m_reg_failovers, NULL, st.failovers, seen->failovers, 1);
    add_growth(s->m_reg_failover_resent, NULL, st.failover_resent, seen->failover_resent, 1);
    gw_metric_set(s->m_reg_meter, NULL,
                  gw_registry_meter(s->reg) != GW_REGISTRY_METER_NONE ? 1 : 0);
    *seen = st;
}

void gw__obs_update_gauges(serve_t *s)
{
    gw_cindex_stats_t st;
    gw_cindex_stats(s->ix, &st);
    gw_metric_set(s->m_entries, NULL, (double)st.n_entries);
    gw_metric_set(s->m_entry_tokens, NULL, (double)st.n_tokens);
    gw_metric_set(s->m_namespaces, NULL, (double)gw_ns_tab_count(&s->ns));
    for (uint32_t i = 0; i < gw_pool_n_workers(s->pool); i++) {
        const gw_pool_worker_t *w = gw_pool_worker(s->pool, i);
        const char *lv[] = {w->name};
        gw_metric_set(s->m_worker_up, lv, w->up ? 1 : 0);
        gw_metric_set(s->m_worker_queue, lv, w->load.queued_requests);
        gw_metric_set(s->m_worker_free, lv, w->load.free_blocks);
        gw_metric_set(s->m_prefill_rate, lv, w->prefill_tok_s);
        eng_wire_load_t *seen = &s->tier_seen[i];
        update_tier(s, w->name, "g2", &w->load.g2, &seen->g2);
        update_tier(s, w->name, "g3", &w->load.g3, &seen->g3);
        add_growth(s->m_recomputed, lv, w->load.tokens_recomputed, seen->tokens_recomputed, 1);
        *seen = w->load;
        static const char *const tiers[] = {"g1", "g2", "g3"};
        for (int t = GW_CINDEX_TIER_G1; t <= GW_CINDEX_TIER_G3; t++) {
            const char *tv[] = {w->name, tiers[t - 1]};
            gw_metric_set(s->m_tier_indexed_tokens, tv,
                          (double)gw_cindex_worker_tier_tokens(s->ix, i, (gw_cindex_tier_t)t));
        }
        gw_metric_set(s->m_worker_kv_tokens, lv, (double)w->total_blocks * w->block_tokens);
        if (w->kv_dtype[0] != '\0') {
            const char *dv[] = {w->name, w->kv_dtype};
            gw_metric_set(s->m_worker_kv_dtype, dv, 1);
        }
    }
    gw_metric_set(s->m_inflight, NULL, (double)gw__req_n_live(s));
    if (s->reg != NULL)
        update_registry(s);
    if (s->shipper != NULL) {
        bill_shipper_stats_t ss;
        bill_shipper_stats(s->shipper, &ss);
        uint64_t durable = bill_ledger_durable_seq(s->ledger);
        gw_metric_set(s->m_ship_lag, NULL,
                      durable > ss.shipped_seq ? (double)(durable - ss.shipped_seq) : 0);
        gw_metric_set(s->m_ship_refused, NULL, ss.refused ? 1 : 0);
    }
}

void gw__obs_internal_error(serve_t *s, const char *site, const char *fmt, ...)
{
    const char *lv[] = {site};
    if (s->m_internal_errors != NULL)
        gw_metric_add(s->m_internal_errors, lv, 1);
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    PC_LOG(PC_LOG_ERROR, "serve", "internal error at %s: %s", site, msg);
}

/* One JSON object per line; the strings a client chose (the model) and the configuration's
 * (the tenant) are JSON-escaped, so no byte of theirs can end the line. A line reaches the file
 * whole: it is formatted first, and the stdio buffer is flushed before a line that would not fit
 * in what is left of it (stdio would otherwise write the part that fits, and a reader tailing
 * the file would see half a line until the next tick). */
static void access_log(gw_req_t *q, int status)
{
    serve_t *s = q->s;
    if (s->access_log == NULL)
        return;
    uint64_t now = pc_time_mono_ms();
    pc_buf_t tenant = {0}, model = {0};
    const char *t = q->key ? q->key->tenant : "";
    int rc = pc_json_string(&tenant, t, strlen(t), PC_JSON_UTF8);
    if (rc == 0)
        rc = q->api ? pc_json_string(&model, q->api->model.base, q->api->model.len, PC_JSON_UTF8)
                    : pc_json_string(&model, "", 0, PC_JSON_UTF8);
    if (rc != 0) {
        pc_buf_free(&tenant);
        pc_buf_free(&model);
        gw__obs_internal_error(s, "access_log", "request %s: access log line not written", q->id);
        return;
    }
    pc_buf_t line = {0};
    rc = pc_buf_printf(
        &line,
        "{\"ts\":%" PRIu64 ",\"request_id\":\"%s\",\"endpoint\":\"%s\",\"status\":%d,"
        "\"tenant\":%.*s,\"model\":%.*s,\"input_tokens\":%u,\"cache_read\":%u,"
        "\"cache_write_5m\":%u,\"cache_write_1h\":%u,\"output_tokens\":%u,"
        "\"outcome\":\"%s\",\"cache\":\"%s\",\"worker\":%d,\"ttft_ms\":%" PRId64
        ",\"duration_ms\":%" PRIu64 ",\"worker_ttft_us\":%" PRIu64 ",\"worker_total_us\":%" PRIu64
        ",\"physical_hit\":%u,\"kv_g1\":%u,\"kv_g2\":%u,"
        "\"kv_g3\":%u,\"kv_recomputed\":%u%s%s%s}\n",
        pc_time_wall_ms(), q->id, q->endpoint, status, (int)tenant.len, tenant.base, (int)model.len,
        model.base, q->usage.input_tokens, q->usage.cache_read, q->usage.cache_write_5m,
        q->usage.cache_write_1h, q->usage.output_tokens,
        q->has_outcome ? gw_outcome_name((gw_outcome_t)q->outcome) : "", q->cache_hdr,
        q->routed ? (int)q->worker : -1,
        q->t_first_ms ? (int64_t)(q->t_first_ms - q->t0_ms) : (int64_t)-1, now - q->t0_ms,
        q->worker_ttft_us, q->worker_total_us, q->tokens_reused, q->prefill.tokens_g1,
        q->prefill.tokens_g2, q->prefill.tokens_g3, q->prefill.tokens_recomputed,
        q->registry != BILL_REGISTRY_NONE ? ",\"registry\":\"" : "",
        q->registry != BILL_REGISTRY_NONE ? bill_registry_name(q->registry) : "",
        q->registry != BILL_REGISTRY_NONE ? "\"" : "");
    pc_buf_free(&tenant);
    pc_buf_free(&model);
    if (rc != 0) {
        pc_buf_free(&line);
        gw__obs_internal_error(s, "access_log", "request %s: access log line not written", q->id);
        return;
    }
    size_t cap = __fbufsize(s->access_log); /* stdout's may be smaller than ours */
    if (s->access_log_pending + line.len > (cap > 0 ? cap : GW_ACCESS_LOG_BUF)) {
        fflush(s->access_log);
        s->access_log_pending = 0;
    }
    fwrite(line.base, 1, line.len, s->access_log);
    s->access_log_pending += line.len;
    pc_buf_free(&line);
    s->access_log_dirty = true;
}

void gw__obs_count_request(gw_req_t *q, int status)
{
    if (q->counted)
        return;
    q->counted = true;
    char code[8];
    snprintf(code, sizeof code, "%d", status);
    const char *lv[] = {q->endpoint, code};
    gw_metric_add(q->s->m_requests, lv, 1);
    const char *lv2[] = {q->endpoint};
    gw_metric_observe(q->s->m_duration, lv2, (double)(pc_time_mono_ms() - q->t0_ms) / 1000.0);
    access_log(q, status);
}

/* ---- the cache: drops, storage ----------------------------------------------------------- */

void gw__obs_on_entry_drop(const gw_cindex_drop_t *ev, void *ud)
{
    serve_t *s = ud;
    static const char *const reasons[] = {"ttl", "capacity", "capacity", "removed"};
    const char *lv[] = {reasons[ev->reason & 3]};
    if (s->m_expired)
        gw_metric_add(s->m_expired, lv, 1);
    gw_ns_tab_unref(&s->ns, ev->ns); /* the record stays until its storage is metered */
    if (s->pool == NULL)
        return;
    /* The workers pinning it may let it go. */
    for (uint32_t w = 0; w < GW_POOL_MAX_WORKERS; w++)
        if (ev->owners & (1ull << w))
            gw_pool_release(s->pool, w, ev->ns, ev->tokens, (uint32_t)ev->n_tokens);
}

typedef struct storage_ctx {
    serve_t *s;
    uint64_t from, to;
    uint8_t registry; /* enum bill_registry of the events */
} storage_ctx_t;

static void storage_cb(uint64_t ns, uint64_t token_ms, void *ud)
{
    storage_ctx_t *c = ud;
    serve_t *s = c->s;
    if (token_ms == 0)
        return;
    const gw_ns_info_t *info = gw_ns_tab_lookup(&s->ns, ns);
    if (info == NULL) {
        gw__obs_internal_error(s, "storage_owner",
                               "namespace %016" PRIx64 ": %" PRIu64
                               " token-ms of storage without an owner: not billed",
                               ns, token_ms);
        return;
    }
    const char *tenant = info->tenant, *model = s->models[info->model].cfg->name;
    bill_event_t ev;
    bill_event_init(&ev, BILL_EVENT_STORAGE);
    ev.registry = c->registry;
    bill_idgen_next(&s->idgen, ev.event_id);
    snprintf(ev.ns, sizeof ev.ns, "%016" PRIx64, ns);
    bill_event_set_str(ev.tenant, tenant);
    bill_event_set_str(ev.model, model);
    ev.start_ms = c->from;
    ev.end_ms = c->to;
    ev.token_ms = token_ms;
    char err[256];
    uint64_t seq;
    int rc = bill_event_price(&ev, s->pricing, err, sizeof err);
    if (rc != 0) {
        gw__obs_internal_error(s, "storage_price",
                               "namespace %016" PRIx64 ": storage of %" PRIu64
                               " token-ms not priced: %s",
                               ns, token_ms, rc == PC_ERR_NOTFOUND ? err : pc_strerror(rc));
        return;
    }
    rc = bill_ledger_append(s->ledger, &ev, &seq);
    const char *lv[] = {rc >= 0 ? "appended" : "failed"};
    gw_metric_add(s->m_billing, lv, 1);
    if (rc < 0)
        gw__obs_internal_error(s, "storage_ledger",
                               "namespace %016" PRIx64 ": storage event not written: %s", ns,
                               pc_strerror(rc));
}

/* Not the meter's holder: the integral is taken and dropped (another gateway bills it). */
static void storage_discard(uint64_t ns, uint64_t token_ms, void *ud)
{
    (void)ns;
    (void)token_ms;
    (void)ud;
}

void gw__obs_meter_storage(serve_t *s)
{
    uint64_t now = pc_time_wall_ms();
    storage_ctx_t c = {s, s->last_storage_ms, now, BILL_REGISTRY_NONE};
    /* With a registry every replica holds every gateway's entries: exactly one gateway, the
     * holder of the meter lease, bills their storage (registry: local while it keeps metering
     * through a Redis outage within its lease). */
    gw_registry_meter_t meter = s->reg != NULL ? gw_registry_meter(s->reg) : GW_REGISTRY_METER_NONE;
    if (s->reg != NULL)
        c.registry = meter == GW_REGISTRY_METER_LOCAL ? BILL_REGISTRY_LOCAL : BILL_REGISTRY_SHARED;
    gw_cindex_storage_take(
        s->ix, pc_time_mono_ms(),
        s->reg == NULL || meter != GW_REGISTRY_METER_NONE ? storage_cb : storage_discard, &c);
    s->last_storage_ms = now;
    gw_ns_tab_sweep(&s->ns); /* their last storage is taken: nothing accrues without entries */
}

void gw__obs_on_tick(uv_timer_t *t)
{
    serve_t *s = t->data;
    uint64_t now = pc_time_mono_ms();
    gw_cindex_expire(s->ix, now);
    /* One write per tick instead of one per request on the loop; a crash loses at most the
     * last tick's lines of the access log (never billing data: that is the ledger's). */
    if (s->access_log_dirty) {
        s->access_log_dirty = false;
        fflush(s->access_log);
        s->access_log_pending = 0;
    }
    if (pc_time_wall_ms() - s->last_storage_ms >= s->cfg.storage_interval_ms)
        gw__obs_meter_storage(s);
    /* A large body costs up to GW_API_JSON_MEM_PER_BYTE times its size while it is parsed and
     * rendered, much of it in the thread pool's malloc arenas, which glibc keeps after free
     * until malloc_trim: give it back once enough was freed, so a burst of big requests does
     * not leave the gateway's RSS at its peak. At most once a tick. */
    if (s->freed_large >= GW_OBS_TRIM_AFTER) {
        s->freed_large = 0;
#ifdef __GLIBC__
        malloc_trim(0);
#endif
    }
}

/* ---- the access log file ----------------------------------------------------------------- */

FILE *gw__obs_open_access_log(const char *path)
{
    FILE *f = fopen(path, "a");
    if (f != NULL)
        setvbuf(f, NULL, _IOFBF, GW_ACCESS_LOG_BUF);
    return f;
}

/* SIGHUP reopens the access log file (log rotation: move the file away, then send SIGHUP).
 * The old file gets every line written before the signal; when the path cannot be opened the
 * old file is kept and the error is logged. stdout and "off" are left as they are. */
void gw__obs_on_sighup(uv_signal_t *h, int sig)
{
    (void)sig;
    serve_t *s = h->data;
    if (s->access_log == NULL || s->access_log == stdout)
        return;
    FILE *f = gw__obs_open_access_log(s->cfg.access_log);
    if (f == NULL) {
        PC_LOG(PC_LOG_ERROR, "serve",
               "SIGHUP: cannot reopen the access log %s: %s; still writing "
               "to the old file",
               s->cfg.access_log, strerror(errno));
        return;
    }
    fclose(s->access_log); /* flushes the lines written so far into the old file */
    s->access_log = f;
    s->access_log_dirty = false;
    s->access_log_pending = 0;
    PC_LOG(PC_LOG_INFO, "serve", "SIGHUP: reopened the access log %s", s->cfg.access_log);
}
