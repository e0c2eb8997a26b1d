/*
 * dashboard.c — the /dashboard page (dashboard.h). The page's source is gateway/dashboard.html;
 * the build embeds its bytes (gateway/embed.cmake writes dashboard_html.inc), so the binary
 * serves it with no file on disk and the HTML stays editable as HTML.
 */
#include "dashboard.h"

#include "common.h"

static const unsigned char page[] = {
#include "dashboard_html.inc"
};

/* Keep in step with the families the page's script reads (its header comment lists them). */
static const char *const metric_names[] = {
    "kvgw_requests_total",
    "kvgw_requests_in_flight",
    "kvgw_tokens_total",
    "kvgw_cache_hit_tokens_total",
    "kvgw_cache_lookups_total",
    "kvgw_time_to_first_token_seconds",
    "kvgw_cache_entries",
    "kvgw_cache_tokens",
    "kvgw_cache_expirations_total",
    "kvgw_worker_up",
    "kvgw_worker_queued_requests",
    "kvgw_worker_free_kv_blocks",
    "kvgw_routing_decisions_total",
    "kvgw_billing_events_total",
    "kvgw_build_info",
    "kvgw_prompt_tokens_by_source_total",
    "kvgw_worker_tier_max_bytes",
    "kvgw_worker_tier_bytes",
    "kvgw_worker_tier_blocks",
    "kvgw_worker_tier_hits_total",
    "kvgw_worker_tier_loads_total",
    "kvgw_worker_tier_load_bytes_per_second",
    "kvgw_worker_tier_writes_total",
    "kvgw_worker_tier_evictions_total",
    "kvgw_worker_tier_corrupt_records_total",
    "kvgw_worker_tier_recomputes_avoided_tokens_total",
    "kvgw_worker_hole_recomputed_tokens_total",
    "kvgw_registry_up",
    "kvgw_registry_decisions_total",
    "kvgw_registry_feed_lag_seconds",
    NULL,
};

int gw_dashboard_page(pc_buf_t *out)
{
    return pc_buf_append(out, page, sizeof page);
}

const char *const *gw_dashboard_metric_names(void)
{
    return metric_names;
}
