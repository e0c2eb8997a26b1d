/*
 * dashboard.h — the gateway's built-in live dashboard (GET /dashboard).
 *
 * One self-contained HTML page: inline CSS and JavaScript, no external assets, so it works on
 * a machine with no network beyond the gateway. The page reads the admin key from the URL
 * fragment (/dashboard#key=sk-...) or asks for it with a prompt, keeps it in the page only
 * (the fragment never reaches the server), fetches GET /metrics every 2 seconds with the key
 * as a bearer token and x-api-key, parses the Prometheus text exposition and shows the key
 * figures with small charts drawn on <canvas>: cache hit ratio (logical and physical), tokens
 * by bucket, time to first token by cache outcome, live entries and expirations, per-worker
 * queue and free KV blocks, requests by status code, where the prompts' KV came from (pool,
 * host memory, disk, hole recompute, prefill) and each worker's KV tiers (bytes and blocks
 * held, hits, loads and their bandwidth, writes, evictions, corrupt records, recomputes avoided).
 *
 * The page itself holds no secret and no per-request data, so serving it needs no key; the
 * figures come from /metrics. The metric names the page parses are listed by
 * gw_dashboard_metric_names: the unit test checks that the page names each of them and no
 * other, and tests/integration/dashboard.test.mjs that a running gateway exposes each.
 */
#ifndef GW_DASHBOARD_H
#define GW_DASHBOARD_H

#include <stddef.h>

#include "pc_buf.h"

/* Appends the dashboard page (UTF-8 HTML, Content-Type "text/html; charset=utf-8") to out.
 * Returns 0, or PC_ERR_NOMEM with out unchanged. The page is the same bytes on every call. */
int gw_dashboard_page(pc_buf_t *out);

/* The Prometheus metric families the page reads, as a NULL-terminated array of static
 * strings (valid for the life of the process). */
const char *const *gw_dashboard_metric_names(void);

#endif
