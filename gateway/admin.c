/*
 * admin.c — GET /admin/v1/usage: the ledger exported, streamed (serve_internal.h).
 */
#include <string.h>

#include "request.h"

/* ---- GET /admin/v1/usage: the ledger exported, streamed ------------------------------------
 *
 * Query: from, to (RFC 3339 or epoch ms; [from, to) by event start), tenant, format (csv, jsonl,
 * focus; default csv), group (none, day). The export reads ledger files, so each step runs on
 * the thread pool; its output goes to the client between steps, and the next step waits while
 * the client does not read (on_drain). Memory stays bounded by one step's output. */

typedef struct export_job {
    gw_req_t *q;
    bill_export_t *x;
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
    if (j->waiting_drain) /* no step in flight: free now; else export_step_done frees it */
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
    if (query_param(query, "tenant", tenant, sizeof tenant))
        xp.tenant = tenant;
    if (query_param(query, "format", v, sizeof v) &&
        (xp.format = bill_export_format_parse(v)) < 0) {
        gw__req_respond_errorf(q, 400, "format: expected csv, jsonl or focus, got %s", v);
        return false;
    }
    if (query_param(query, "group", v, sizeof v) && (xp.group = bill_export_group_parse(v)) < 0) {
        gw__req_respond_errorf(q, 400, "group: expected none or day, got %s", v);
        return false;
    }
    export_job_t *j = pc_calloc(1, sizeof *j);
    if (j == NULL) {
        gw__req_respond_errorf(q, 500, "%s", "out of memory");
        return false;
    }
    xp.pricing = s->pricing;
    xp.chunk = export_chunk;
    xp.ud = j;
    char err[256];
    if (bill_export_open(s->cfg.ledger_dir, &xp, &j->x, err, sizeof err) != 0) {
        pc_free(j);
        gw__req_respond_errorf(q, 400, "%s", err);
        return false;
    }
    j->q = q;
    j->work.data = j;
    q->job = j;
    gw__req_set_state(q, GW_REQ_EXPORTING);
    gw_http_header_t h[4];
    size_t n = 0;
    h[n++] = (gw_http_header_t){"content-type", xp.format == BILL_EXPORT_JSONL
                                                    ? "application/x-ndjson"
                                                    : "text/csv; charset=utf-8"};
    h[n++] = (gw_http_header_t){"request-id", q->id};
    gw_http_req_on_abort(q->http, export_abort);
    gw_http_req_on_drain(q->http, export_drain);
    if (gw_http_stream_begin(q->http, 200, h, n) != 0) {
        gw_http_req_on_abort(q->http, NULL);
        gw_http_req_on_drain(q->http, NULL);
        bill_export_free(j->x);
        pc_free(j);
        q->job = NULL;
        return false;
    }
    export_next(j);
    return true;
}
