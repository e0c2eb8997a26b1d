/*
 * admin.c — GET /admin/v1/usage: the usage exported, streamed (serve_internal.h).
 */
#include <string.h>

#include "redisconn.h"
#include "request.h"

/* ---- GET /admin/v1/usage: the usage exported, streamed ------------------------------------
 *
 * Query: from, to (RFC 3339 or epoch ms; [from, to) by event start), tenant, format (csv, jsonl,
 * focus; default csv), group (none, day), scope (local, cluster). scope=local is this gateway's
 * ledger. scope=cluster (the default when a registry is configured, s->usage_cluster_default;
 * needs Redis) is the merged view of every gateway (billing.h, Sources): this gateway's own
 * events from its ledger (the record, shipped or not, so none is missing or doubled) and every
 * other instance's from the stream it shipped to Redis, merged by end time.
 *
 * Opening the export (listing the ledger, connecting to Redis and listing its instances) and
 * each step run on the thread pool, never on the loop: the response's head is sent when the open
 * succeeded (else an error: 502 when Redis cannot be read), its output goes to the client between
 * steps, and the next step waits while the client does not read (on_drain). Memory stays bounded
 * by one step's output and one pending event (one Redis page) per source. */

typedef struct export_job {
    gw_req_t *q;
    bill_export_t *x;
    bill_export_params_t xp;
    char tenant[128];
    bool cluster;
    bill_redis_params_t rp; /* scope=cluster: the Redis of the shipper */
    bill_redis_addr_t sentinels[BILL_REDIS_MAX_SENTINELS]; /* rp's, with Sentinel */
    uv_work_t work;
    pc_buf_t out; /* filled by the step (thread pool), sent on the loop */
    int rc;
    char err[256];
    bool waiting_drain;
} export_job_t;

static int export_chunk(void *ud, const char *data, size_t len)
{
    export_job_t *j = ud;
    return pc_buf_append(&j->out, data, len) == 0 ? 0 : 1;
}

static void export_work(uv_work_t *w)
{
    export_job_t *j = w->data;
    j->rc = bill_export_step(j->x, 4096, j->err, sizeof j->err);
}

static void export_job_free(export_job_t *j)
{
    bill_export_free(j->x);
    pc_buf_free(&j->out);
    gw__req_free(j->q);
    pc_free(j);
}

static void export_step_done(uv_work_t *w, int status);

static void export_next(export_job_t *j)
{
    j->waiting_drain = false;
    uv_queue_work(j->q->s->loop, &j->work, export_work, export_step_done);
}

static void export_drain(gw_http_req_t *r, void *data)
{
    (void)r;
    gw_req_t *q = data;
    export_job_t *j = q->job;
    if (j->waiting_drain)
        export_next(j);
}

static void export_abort(gw_http_req_t *r, void *data)
{
    (void)r;
    gw_req_t *q = data;
    q->http = NULL;
    q->client_gone = true;
    export_job_t *j = q->job;
    if (j->waiting_drain) /* no work in flight: free now; else its done callback frees it */
        export_job_free(j);
}

static void export_step_done(uv_work_t *w, int status)
{
    (void)status;
    export_job_t *j = w->data;
    gw_req_t *q = j->q;
    if (q->http == NULL) {
        export_job_free(j);
        return;
    }
    if (j->out.len)
        gw_http_stream_write(q->http, j->out.base, j->out.len);
    j->out.len = 0;
    if (j->rc == 0) {
        if (gw_http_stream_queued(q->http) >= q->s->cfg.stream_high_water)
            j->waiting_drain = true;
        else
            export_next(j);
        return;
    }
    if (j->rc < 0) {
        /* The status line is gone: say it in the body and end it, so the export is visibly
         * incomplete. */
        pc_buf_t b = {0};
        pc_buf_printf(&b, "\n# export failed: %s\n", j->err[0] ? j->err : pc_strerror(j->rc));
        gw_http_stream_write(q->http, b.base, b.len);
        pc_buf_free(&b);
        PC_LOG(PC_LOG_ERROR, "admin", "usage export failed: %s", j->err);
    }
    gw_http_req_on_abort(q->http, NULL);
    gw_http_req_on_drain(q->http, NULL);
    gw__obs_count_request(q, 200);
    gw_http_stream_end(q->http);
    q->http = NULL;
    export_job_free(j);
}

/* Thread pool: opens the export (ledger listing, Redis connect and instance listing). */
static void open_work(uv_work_t *w)
{
    export_job_t *j = w->data;
    const char *dir = j->q->s->cfg.ledger_dir;
    bill_export_sources_t src = {
        .ledger_dirs = &dir,
        .n_ledgers = 1,
        .redis = j->cluster ? &j->rp : NULL,
        .redis_prefix = j->q->s->cfg.redis_prefix, /* the shipper's (redis.prefix) */
    };
    j->rc = bill_export_open_sources(&src, &j->xp, &j->x, j->err, sizeof j->err);
}

static void open_done(uv_work_t *w, int status)
{
    (void)status;
    export_job_t *j = w->data;
    gw_req_t *q = j->q;
    if (q->http == NULL) { /* the client left while it opened */
        export_job_free(j);
        return;
    }
    if (j->rc != 0) {
        int code = j->rc == PC_ERR_UPSTREAM || j->rc == PC_ERR_PERM || j->rc == PC_ERR_FORMAT ? 502
                   : j->rc == PC_ERR_NOMEM                                                    ? 500
                                                                                              : 400;
        if (code == 502)
            PC_LOG(PC_LOG_WARN, "admin", "usage export (scope=cluster): %s", j->err);
        gw__req_respond_errorf(q, code, "%s", j->err[0] ? j->err : pc_strerror(j->rc));
        export_job_free(j);
        return;
    }
    gw_http_header_t h[4];
    size_t n = 0;
    h[n++] = (gw_http_header_t){"content-type", j->xp.format == BILL_EXPORT_JSONL
                                                    ? "application/x-ndjson"
                                                    : "text/csv; charset=utf-8"};
    h[n++] = (gw_http_header_t){"request-id", q->id};
    h[n++] = (gw_http_header_t){"kvgw-usage-scope", j->cluster ? "cluster" : "local"};
    if (gw_http_stream_begin(q->http, 200, h, n) != 0) {
        gw_http_req_on_abort(q->http, NULL);
        gw_http_req_on_drain(q->http, NULL);
        q->http = NULL;
        q->client_gone = true;
        export_job_free(j);
        return;
    }
    export_next(j);
}

/* Copies query parameter name's (undecoded) value into out; false when absent. */
static bool query_param(const char *query, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *p = query; p && *p;) {
        const char *amp = strchr(p, '&');
        size_t len = amp ? (size_t)(amp - p) : strlen(p);
        if (len > nl && strncmp(p, name, nl) == 0 && p[nl] == '=') {
            size_t vl = len - nl - 1;
            if (vl >= cap)
                vl = cap - 1;
            memcpy(out, p + nl + 1, vl);
            out[vl] = '\0';
            return true;
        }
        p = amp ? amp + 1 : NULL;
    }
    return false;
}

bool gw__admin_usage(gw_req_t *q, const char *query)
{
    serve_t *s = q->s;
    bill_export_params_t xp = bill_export_params_default();
    char v[128], tenant[128];
    uint64_t ms;
    if (query_param(query, "from", v, sizeof v)) {
        if (bill_parse_time_ms(v, &ms) != 0) {
            gw__req_respond_errorf(q, 400, "from: not a time (RFC 3339 or epoch ms): %s", v);
            return false;
        }
        xp.from_ms = ms;
    }
    if (query_param(query, "to", v, sizeof v)) {
        if (bill_parse_time_ms(v, &ms) != 0) {
            gw__req_respond_errorf(q, 400, "to: not a time (RFC 3339 or epoch ms): %s", v);
            return false;
        }
        xp.to_ms = ms;
    }
    bool has_tenant = query_param(query, "tenant", tenant, sizeof tenant);
    if (query_param(query, "format", v, sizeof v) &&
        (xp.format = bill_export_format_parse(v)) < 0) {
        gw__req_respond_errorf(q, 400, "format: expected csv, jsonl or focus, got %s", v);
        return false;
    }
    if (query_param(query, "group", v, sizeof v) && (xp.group = bill_export_group_parse(v)) < 0) {
        gw__req_respond_errorf(q, 400, "group: expected none or day, got %s", v);
        return false;
    }
    bool cluster = s->usage_cluster_default;
    if (query_param(query, "scope", v, sizeof v)) {
        if (strcmp(v, "cluster") != 0 && strcmp(v, "local") != 0) {
            gw__req_respond_errorf(q, 400, "scope: expected local or cluster, got %s", v);
            return false;
        }
        cluster = v[0] == 'c';
    }
    if (cluster && !gw_config_has_redis(&s->cfg)) {
        gw__req_respond_errorf(q, 400, "%s",
                               "scope=cluster needs Redis (redis: in the config); scope=local is "
                               "this gateway's ledger");
        return false;
    }
    if (xp.from_ms > xp.to_ms) {
        gw__req_respond_errorf(q, 400, "%s", "from is after to");
        return false;
    }
    export_job_t *j = pc_calloc(1, sizeof *j);
    if (j == NULL) {
        gw__req_respond_errorf(q, 500, "%s", "out of memory");
        return false;
    }
    if (has_tenant) {
        memcpy(j->tenant, tenant, sizeof j->tenant);
        xp.tenant = j->tenant;
    }
    xp.pricing = s->pricing;
    xp.chunk = export_chunk;
    xp.ud = j;
    j->xp = xp;
    j->cluster = cluster;
    if (cluster &&
        gw__serve_redis_params(&s->cfg, &j->rp, j->sentinels, j->err, sizeof j->err) != 0) {
        gw__req_respond_errorf(q, 500, "redis: %s", j->err);
        pc_free(j);
        return false;
    }
    j->q = q;
    j->work.data = j;
    q->job = j;
    gw__req_set_state(q, GW_REQ_EXPORTING);
    gw_http_req_on_abort(q->http, export_abort);
    gw_http_req_on_drain(q->http, export_drain);
    uv_queue_work(s->loop, &j->work, open_work, open_done);
    return true;
}
