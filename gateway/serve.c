/*
 * serve.c — `kvgw serve` (serve.h): the endpoints and the request state machine.
 */
#include "serve.h"

#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <errno.h>
#include <sys/stat.h>
#include <uv.h>

#include "api.h"
#include "billing.h"
#include "cacheplan.h"
#include "cindex.h"
#include "cli.h"
#include "common.h"
#include "config.h"
#include "dashboard.h"
#include "gguf.h"
#include "hparams.h"
#include "http.h"
#include "ledger.h"
#include "shipper.h"
#include "metrics.h"
#include "pool.h"
#include "render.h"
#include "router.h"
#include "tokenizer.h"
#include "vocab.h"

#define MAX_MODELS 16
#define TICK_MS 250

/* ---- state ------------------------------------------------------------------------------- */

typedef struct model_rt {
    const gw_cfg_model_t *cfg;
    uint32_t index;
    eng_tok_t *tok;
    eng_render_t *render;
    eng_tokcache_t *tokcache; /* segment -> ids, per namespace; NULL when the config says 0 */
    uint32_t n_ctx;
} model_rt_t;

typedef struct serve serve_t;

/* Who a namespace belongs to (for storage events): the workers and the index only know ids. */
typedef struct ns_info {
    uint64_t ns; /* 0 = empty slot */
    const char *tenant;
    uint32_t model;
} ns_info_t;

typedef enum req_phase {
    PH_PREPARE = 0, /* on the thread pool */
    PH_RUNNING,     /* submitted to a worker */
    PH_DURABLE,     /* usage event appended; waiting for the ledger to make it durable */
    PH_FINISHED,
} req_phase_t;

typedef struct req {
    serve_t *s;
    gw_http_req_t *http; /* NULL once the client is gone */
    pc_arena_t arena;
    gw_api_kind_t kind;
    char id[48];      /* request-id header and ledger request id: "req_<hex>" */
    char resp_id[48]; /* "msg_<hex>" / "chatcmpl-<hex>" */
    const gw_cfg_key_t *key;
    uint64_t t0_ms;    /* monotonic, the request's first byte */
    uint64_t wall0_ms; /* wall clock at arrival */
    req_phase_t phase;
    /* prepare (thread pool) */
    uv_work_t work;
    int prep_rc;
    gw_api_error_t err;
    gw_api_req_t *api;
    model_rt_t *model;
    eng_render_out_t r;
    gw_cacheplan_t plan;
    uint64_t ns;
    /* routing and the worker */
    uint32_t worker;
    uint64_t wire_id;
    uint32_t read_tokens; /* logical hit (A) */
    uint32_t path_tokens; /* longest prefix found in the index (live or not) */
    uint32_t phys_tokens; /* what the chosen worker was believed to hold */
    gw_usage_t usage;
    bool entries_inserted;
    uint32_t n_tokens_out;
    uint32_t tokens_reused;   /* the worker's physical hit (DONE) */
    uint64_t t_first_ms;      /* first token (monotonic) */
    uint64_t worker_ttft_us;  /* the worker's own queue + prefill time (DONE timings) */
    uint64_t worker_total_us; /* queue + prefill + decode */
    /* output */
    bool streaming_started;
    gw_anthropic_sse_t asse;
    gw_openai_sse_t osse;
    gw_anthropic_sse_t asse_pre; /* the streams' states before their finish events, so an */
    gw_openai_sse_t osse_pre;    /* error can still replace them (fail_undurable) */
    pc_buf_t text;               /* whole output (non-streaming) */
    pc_buf_t pending;            /* SSE bytes held back while the client does not read */
    gw_stop_reason_t stop;
    pc_slice_t stop_seq;
    int bill_status;
    uint64_t ledger_seq;
    pc_buf_t final; /* bytes sent once the usage event is durable */
    bool final_is_stream;
    int final_status;
    char cache_hdr[256];
    bool counted;         /* its metrics and access log line are written */
    bool client_gone;     /* the client left before the response ended (499) */
    const char *endpoint; /* the metrics/log label: messages, count_tokens, chat_completions,
                             models, health, metrics, dashboard, admin_usage, other */
    void *job;            /* GET /admin/v1/usage: its export job */
    struct req *next_live, *prev_live; /* the live list (events are dispatched by wire_id) */
    struct req *next_durable;          /* FIFO of requests waiting for the ledger */
} req_t;

struct serve {
    uv_loop_t *loop;
    gw_config_t cfg;
    model_rt_t models[MAX_MODELS];
    size_t n_models;
    gw_http_server_t *http;
    gw_pool_t *pool;
    gw_cindex_t *ix;
    gw_router_t router;
    bill_pricing_t *pricing;
    bill_ledger_t *ledger;
    bill_shipper_t *shipper; /* NULL without Redis */
    bill_idgen_t idgen;
    uv_async_t ledger_wake;
    uv_timer_t tick;
    uv_signal_t sig_int, sig_term, sig_hup;
    uint64_t next_wire_id;
    req_t *live;
    req_t *durable_head, *durable_tail;
    FILE *access_log;      /* lines are buffered and flushed by the tick, not per request */
    bool access_log_dirty; /* a line was written since the last flush */
    bool stopping;
    bool http_closed;
    int exit_code;
    uint64_t last_storage_ms;
    ns_info_t *ns_tab; /* open addressing, ns_cap slots (a power of two) */
    size_t ns_cap, ns_n;
    /* metrics */
    gw_metrics_t *m;
    gw_metric_t *m_requests, *m_duration, *m_ttft, *m_tokens, *m_hit_tokens, *m_lookups;
    gw_metric_t *m_entries, *m_entry_tokens, *m_expired, *m_worker_up, *m_worker_queue,
        *m_worker_free, *m_routes, *m_billing, *m_inflight, *m_build, *m_ship_lag;
    gw_metric_t *m_tenant_tokens; /* metrics.per_tenant only: bounded by the configured tenants */
};

/* ---- namespaces ------------------------------------------------------------------------- */

static const ns_info_t *ns_lookup(const serve_t *s, uint64_t ns);
static void ns_remember(serve_t *s, uint64_t ns, const char *tenant, uint32_t model);

/* ---- small helpers ----------------------------------------------------------------------- */

static void hex_id(char *out, size_t cap, const char *prefix)
{
    uint8_t b[12];
    randombytes_buf(b, sizeof b);
    size_t k = (size_t)snprintf(out, cap, "%s", prefix);
    for (size_t i = 0; i < sizeof b && k + 2 < cap; i++, k += 2)
        snprintf(out + k, cap - k, "%02x", b[i]);
}

static const char *kind_endpoint(gw_api_kind_t k)
{
    return k == GW_API_OPENAI_CHAT              ? "chat_completions"
           : k == GW_API_ANTHROPIC_COUNT_TOKENS ? "count_tokens"
                                                : "messages";
}

/* The namespace: keyed BLAKE2b of tenant, model and the optional salt (DESIGN.md §3). */
static uint64_t namespace_of(const serve_t *s, const char *tenant, pc_slice_t model, bool has_salt,
                             pc_slice_t salt)
{
    crypto_generichash_state st;
    uint8_t out[16];
    crypto_generichash_init(&st, s->cfg.namespace_secret, sizeof s->cfg.namespace_secret,
                            sizeof out);
    uint32_t n = (uint32_t)strlen(tenant);
    crypto_generichash_update(&st, (const uint8_t *)&n, sizeof n);
    crypto_generichash_update(&st, (const uint8_t *)tenant, n);
    n = (uint32_t)model.len;
    crypto_generichash_update(&st, (const uint8_t *)&n, sizeof n);
    crypto_generichash_update(&st, (const uint8_t *)model.base, model.len);
    uint8_t flag = has_salt ? 1 : 0;
    crypto_generichash_update(&st, &flag, 1);
    if (has_salt)
        crypto_generichash_update(&st, (const uint8_t *)salt.base, salt.len);
    crypto_generichash_final(&st, out, sizeof out);
    uint64_t ns;
    memcpy(&ns, out, sizeof ns);
    return ns ? ns : 1;
}

static const ns_info_t *ns_lookup(const serve_t *s, uint64_t ns)
{
    if (s->ns_cap == 0)
        return NULL;
    for (size_t i = ns & (s->ns_cap - 1);; i = (i + 1) & (s->ns_cap - 1)) {
        if (s->ns_tab[i].ns == ns)
            return &s->ns_tab[i];
        if (s->ns_tab[i].ns == 0)
            return NULL;
    }
}

static void ns_remember(serve_t *s, uint64_t ns, const char *tenant, uint32_t model)
{
    if (ns_lookup(s, ns) != NULL)
        return;
    if (2 * (s->ns_n + 1) > s->ns_cap) {
        size_t cap = s->ns_cap ? 2 * s->ns_cap : 256;
        ns_info_t *t = pc_calloc(cap, sizeof *t);
        if (t == NULL)
            return; /* storage of this namespace is then not metered: logged below */
        for (size_t i = 0; i < s->ns_cap; i++) {
            if (s->ns_tab[i].ns == 0)
                continue;
            size_t j = s->ns_tab[i].ns & (cap - 1);
            while (t[j].ns != 0)
                j = (j + 1) & (cap - 1);
            t[j] = s->ns_tab[i];
        }
        pc_free(s->ns_tab);
        s->ns_tab = t;
        s->ns_cap = cap;
    }
    size_t j = ns & (s->ns_cap - 1);
    while (s->ns_tab[j].ns != 0)
        j = (j + 1) & (s->ns_cap - 1);
    s->ns_tab[j] = (ns_info_t){ns, tenant, model};
    s->ns_n++;
}

static gw_api_kind_t kind_for_path(const char *path)
{
    return strncmp(path, "/v1/chat/", 9) == 0 ? GW_API_OPENAI_CHAT : GW_API_ANTHROPIC_MESSAGES;
}

/* Protocol errors from the HTTP layer, in the API's shape for the path. */
static void format_http_error(const char *path, int status, const char *type, const char *message,
                              pc_buf_t *out, void *ud)
{
    (void)type;
    (void)ud;
    gw_api_kind_t k = kind_for_path(path ? path : "");
    gw_api_error_t e;
    gw_api_error_set(&e, k, status, "%s", message);
    gw_api_error_render(k, &e, NULL, out);
}

/* ---- responses --------------------------------------------------------------------------- */

static void req_unlink_live(req_t *q)
{
    serve_t *s = q->s;
    if (q->prev_live)
        q->prev_live->next_live = q->next_live;
    else if (s->live == q)
        s->live = q->next_live;
    if (q->next_live)
        q->next_live->prev_live = q->prev_live;
    q->next_live = q->prev_live = NULL;
}

static void count_request(req_t *q, int status);

static void req_free(req_t *q)
{
    serve_t *s = q->s;
    if (q->client_gone) /* logged now, with the usage the worker reported */
        count_request(q, 499);
    req_unlink_live(q);
    pc_buf_free(&q->text);
    pc_buf_free(&q->pending);
    pc_buf_free(&q->final);
    pc_arena_close(&q->arena);
    pc_free(q);
    if (s->http_closed && s->live == NULL && s->durable_head == NULL)
        uv_stop(s->loop);
}

static void on_abort(gw_http_req_t *r, void *data);

/* Headers every API response carries. */
static size_t std_headers(req_t *q, gw_http_header_t *h, const char *ctype)
{
    size_t n = 0;
    h[n++] = (gw_http_header_t){"content-type", ctype};
    h[n++] = (gw_http_header_t){"request-id", q->id};
    if (q->kind == GW_API_OPENAI_CHAT)
        h[n++] = (gw_http_header_t){"x-request-id", q->id};
    if (q->cache_hdr[0])
        h[n++] = (gw_http_header_t){"kvgw-cache", q->cache_hdr};
    if (q->phase >= PH_RUNNING)
        h[n++] = (gw_http_header_t){"kvgw-worker", gw_pool_worker(q->s->pool, q->worker)->name};
    return n;
}

static void access_log(req_t *q, int status)
{
    serve_t *s = q->s;
    if (s->access_log == NULL)
        return;
    uint64_t now = pc_time_mono_ms();
    fprintf(s->access_log,
            "{\"ts\":%" PRIu64 ",\"request_id\":\"%s\",\"endpoint\":\"%s\",\"status\":%d,"
            "\"tenant\":\"%s\",\"model\":\"%.*s\",\"input_tokens\":%u,\"cache_read\":%u,"
            "\"cache_write_5m\":%u,\"cache_write_1h\":%u,\"output_tokens\":%u,"
            "\"cache\":\"%s\",\"worker\":%d,\"ttft_ms\":%" PRId64 ",\"duration_ms\":%" PRIu64
            ",\"worker_ttft_us\":%" PRIu64 ",\"worker_total_us\":%" PRIu64
            ",\"physical_hit\":%u}\n",
            pc_time_wall_ms(), q->id, q->endpoint, status, q->key ? q->key->tenant : "",
            q->api ? (int)q->api->model.len : 0, q->api ? q->api->model.base : "",
            q->usage.input_tokens, q->usage.cache_read, q->usage.cache_write_5m,
            q->usage.cache_write_1h, q->usage.output_tokens, q->cache_hdr,
            q->phase >= PH_RUNNING ? (int)q->worker : -1,
            q->t_first_ms ? (int64_t)(q->t_first_ms - q->t0_ms) : (int64_t)-1, now - q->t0_ms,
            q->worker_ttft_us, q->worker_total_us, q->tokens_reused);
    s->access_log_dirty = true;
}

static void count_request(req_t *q, int status)
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

/* A whole response; ends the request's HTTP side (q stays alive if a worker still runs). */
static void respond(req_t *q, int status, const char *ctype, const void *body, size_t len)
{
    if (q->http == NULL)
        return;
    gw_http_header_t h[10];
    size_t n = std_headers(q, h, ctype);
    gw_http_req_on_abort(q->http, NULL);
    gw_http_req_on_drain(q->http, NULL);
    count_request(q, status); /* logged before the client can see the end of the response */
    gw_http_respond(q->http, status, h, n, body, len);
    q->http = NULL;
}

static void respond_error(req_t *q, const gw_api_error_t *e)
{
    pc_buf_t b = {0};
    gw_api_kind_t k =
        q->kind == GW_API_ANTHROPIC_COUNT_TOKENS ? GW_API_ANTHROPIC_MESSAGES : q->kind;
    gw_api_error_render(k, e, q->id, &b);
    respond(q, e->status, "application/json", b.base ? b.base : "", b.len);
    pc_buf_free(&b);
}

static void respond_errorf(req_t *q, int status, const char *fmt, const char *arg)
{
    gw_api_error_t e;
    gw_api_error_set(&e, q->kind, status, fmt, arg);
    respond_error(q, &e);
}

/* Writes SSE bytes, holding them back while the client does not read (bounded: at most one
 * response's worth of output, which max_tokens bounds). */
static void stream_out(req_t *q, const pc_buf_t *b)
{
    if (q->http == NULL || b->len == 0)
        return;
    if (q->pending.len > 0 || gw_http_stream_queued(q->http) >= q->s->cfg.stream_high_water) {
        pc_buf_append(&q->pending, b->base, b->len);
        return;
    }
    gw_http_stream_write(q->http, b->base, b->len);
}

static void on_drain(gw_http_req_t *r, void *data)
{
    req_t *q = data;
    (void)r;
    if (q->pending.len == 0 || q->http == NULL)
        return;
    gw_http_stream_write(q->http, q->pending.base, q->pending.len);
    q->pending.len = 0;
}

/* ---- the cache header -------------------------------------------------------------------- */

/* Where token offset `at` falls in the request: "messages.2.content.0+17", "system.0+3",
 * "tools.1+0", or "generation+N" past the last element. */
static void locate(const req_t *q, uint32_t at, char *out, size_t cap)
{
    const eng_render_out_t *r = &q->r;
    uint32_t prev = 0;
    for (size_t i = 0; i < r->n_marks; i++) {
        const eng_render_mark_t *mk = &r->marks[i];
        if (at < mk->token_end) {
            if (mk->kind == ENG_RENDER_MARK_TOOL)
                snprintf(out, cap, "tools.%u+%u", mk->index, at - prev);
            else if (mk->kind == ENG_RENDER_MARK_SYSTEM)
                snprintf(out, cap, "system.%u+%u", mk->index, at - prev);
            else {
                const eng_chat_block_t *b = &q->api->chat->messages[mk->msg].blocks[mk->index];
                snprintf(out, cap, "messages.%u.content.%u+%u", b->src_msg, b->src_block,
                         at - prev);
            }
            return;
        }
        prev = mk->token_end;
    }
    snprintf(out, cap, "end+%u", at - prev);
}

static void make_cache_header(req_t *q)
{
    const char *outcome = q->read_tokens == 0                  ? "miss"
                          : q->read_tokens >= q->plan.n_prompt ? "hit"
                                                               : "partial";
    uint32_t writes = q->usage.cache_write_5m + q->usage.cache_write_1h;
    int k =
        snprintf(q->cache_hdr, sizeof q->cache_hdr,
                 "outcome=%s; read=%u; write=%u; prompt=%u; matched=%u; worker_cached=%u", outcome,
                 q->read_tokens, writes, q->plan.n_prompt, q->path_tokens, q->phys_tokens);
    if (q->path_tokens < q->plan.n_prompt && k > 0 && (size_t)k < sizeof q->cache_hdr) {
        char where[96];
        locate(q, q->path_tokens, where, sizeof where);
        snprintf(q->cache_hdr + k, sizeof q->cache_hdr - (size_t)k, "; diverged=%s", where);
    }
}

/* ---- billing ----------------------------------------------------------------------------- */

static int bill_request(req_t *q, int status)
{
    serve_t *s = q->s;
    bill_event_t ev;
    bill_event_init(&ev, BILL_EVENT_USAGE);
    ev.status = (uint8_t)status;
    bill_idgen_next(&s->idgen, ev.event_id);
    bill_event_set_str(ev.request_id, q->id);
    bill_event_set_str(ev.tenant, q->key->tenant);
    bill_event_set_str(ev.api_key_id, q->key->id);
    bill_event_set_str(ev.model, q->model->cfg->name);
    snprintf(ev.ns, sizeof ev.ns, "%016" PRIx64, q->ns);
    ev.start_ms = q->wall0_ms;
    ev.end_ms = pc_time_wall_ms();
    if (ev.end_ms < ev.start_ms)
        ev.end_ms = ev.start_ms;
    ev.usage.n_uncached = q->usage.input_tokens;
    ev.usage.n_write_5m = q->usage.cache_write_5m;
    ev.usage.n_write_1h = q->usage.cache_write_1h;
    ev.usage.n_read = q->usage.cache_read;
    ev.usage.n_output = q->usage.output_tokens;
    ev.n_hit_logical = q->usage.cache_read;
    ev.n_hit_physical =
        q->tokens_reused < q->usage.cache_read ? q->tokens_reused : q->usage.cache_read;
    char err[256];
    int rc = bill_event_price(&ev, s->pricing, err, sizeof err);
    if (rc == 0) {
        rc = bill_ledger_append(s->ledger, &ev, &q->ledger_seq);
        if (rc == 1)
            rc = 0; /* already there (an id never repeats; kept for completeness) */
    }
    const char *lv[] = {rc == 0 ? "appended" : "failed"};
    gw_metric_add(s->m_billing, lv, 1);
    if (rc != 0)
        PC_LOG(PC_LOG_ERROR, "billing", "request %s: usage event not written: %s", q->id,
               rc == PC_ERR_NOTFOUND ? err : pc_strerror(rc));
    const char *tl[] = {"uncached"}, *tr[] = {"cache_read"}, *t5[] = {"cache_write_5m"},
               *t1[] = {"cache_write_1h"}, *to[] = {"output"};
    gw_metric_add(s->m_tokens, tl, q->usage.input_tokens);
    gw_metric_add(s->m_tokens, tr, q->usage.cache_read);
    gw_metric_add(s->m_tokens, t5, q->usage.cache_write_5m);
    gw_metric_add(s->m_tokens, t1, q->usage.cache_write_1h);
    gw_metric_add(s->m_tokens, to, q->usage.output_tokens);
    if (s->m_tenant_tokens != NULL) {
        const char *t = q->key->tenant;
        const char *a[] = {t, "uncached"}, *b[] = {t, "cache_read"}, *c5[] = {t, "cache_write_5m"},
                   *c1[] = {t, "cache_write_1h"}, *o[] = {t, "output"};
        gw_metric_add(s->m_tenant_tokens, a, q->usage.input_tokens);
        gw_metric_add(s->m_tenant_tokens, b, q->usage.cache_read);
        gw_metric_add(s->m_tenant_tokens, c5, q->usage.cache_write_5m);
        gw_metric_add(s->m_tenant_tokens, c1, q->usage.cache_write_1h);
        gw_metric_add(s->m_tenant_tokens, o, q->usage.output_tokens);
    }
    const char *hl[] = {"logical"}, *hp[] = {"physical"};
    gw_metric_add(s->m_hit_tokens, hl, (double)ev.n_hit_logical);
    gw_metric_add(s->m_hit_tokens, hp, (double)ev.n_hit_physical);
    return rc;
}

/* Sends what was held for durability and ends the response. */
static void finish_response(req_t *q)
{
    q->phase = PH_FINISHED;
    if (q->http != NULL) {
        if (q->final_is_stream) {
            if (q->pending.len) {
                gw_http_stream_write(q->http, q->pending.base, q->pending.len);
                q->pending.len = 0;
            }
            if (q->final.len)
                gw_http_stream_write(q->http, q->final.base, q->final.len);
            gw_http_req_on_abort(q->http, NULL);
            gw_http_req_on_drain(q->http, NULL);
            count_request(q, 200);
            gw_http_stream_end(q->http);
            q->http = NULL;
        } else {
            respond(q, q->final_status, "application/json", q->final.base ? q->final.base : "",
                    q->final.len);
        }
    }
    req_free(q);
}

/* Queues q until its usage event is durable (or finishes it now when nothing waits). */
static void wait_durable(req_t *q)
{
    serve_t *s = q->s;
    req_unlink_live(q);
    if (bill_ledger_durable_seq(s->ledger) >= q->ledger_seq && s->durable_head == NULL) {
        finish_response(q);
        return;
    }
    q->phase = PH_DURABLE;
    q->next_durable = NULL;
    if (s->durable_tail)
        s->durable_tail->next_durable = q;
    else
        s->durable_head = q;
    s->durable_tail = q;
}

/* q's usage event cannot become durable: replace the held final bytes with an error. */
static void fail_undurable(req_t *q)
{
    gw_api_error_t e;
    gw_api_error_set(&e, q->kind, 503,
                     "the usage of this request could not be recorded (billing ledger: %s); "
                     "the response is withheld",
                     pc_strerror(bill_ledger_status(q->s->ledger)));
    q->final.len = 0;
    if (q->final_is_stream) {
        if (q->kind == GW_API_OPENAI_CHAT)
            gw_openai_sse_error(&q->osse_pre, &e, &q->final);
        else
            gw_anthropic_sse_error(&q->asse_pre, &e, &q->final);
    } else {
        gw_api_error_render(q->kind, &e, q->id, &q->final);
        q->final_status = e.status;
    }
    PC_LOG(PC_LOG_ERROR, "billing", "request %s: usage event not durable: %s", q->id,
           pc_strerror(bill_ledger_status(q->s->ledger)));
    finish_response(q);
}

static void on_ledger_wake(uv_async_t *a)
{
    serve_t *s = a->data;
    if (s->ledger == NULL) /* a wake left over from the ledger's close at teardown */
        return;
    uint64_t durable = bill_ledger_durable_seq(s->ledger);
    if (s->shipper)
        bill_shipper_kick(s->shipper);
    if (bill_ledger_status(s->ledger) != 0) {
        /* The ledger failed (disk full, fsync error): what waits for durability will never get
         * there. Those requests end with an error, never a 200 whose usage may be lost. */
        while (s->durable_head && s->durable_head->ledger_seq > durable) {
            req_t *q = s->durable_head;
            s->durable_head = q->next_durable;
            if (s->durable_head == NULL)
                s->durable_tail = NULL;
            fail_undurable(q);
        }
    }
    while (s->durable_head && s->durable_head->ledger_seq <= durable) {
        req_t *q = s->durable_head;
        s->durable_head = q->next_durable;
        if (s->durable_head == NULL)
            s->durable_tail = NULL;
        finish_response(q);
    }
}

static uint64_t shipper_durable(void *ud)
{
    serve_t *s = ud;
    return bill_ledger_durable_seq(s->ledger);
}

static void ledger_wake_fn(void *ud)
{
    uv_async_send(ud);
}

/* ---- request end ------------------------------------------------------------------------- */

static gw_api_resp_t resp_of(req_t *q)
{
    gw_api_resp_t r = {0};
    r.id = q->resp_id;
    r.model = q->api->model;
    r.created = (int64_t)(q->wall0_ms / 1000);
    r.text = pc_buf_slice(&q->text);
    r.stop_reason = q->stop;
    r.stop_sequence = q->stop_seq;
    r.usage = q->usage;
    r.prewarm =
        q->kind == GW_API_ANTHROPIC_MESSAGES && q->api->has_max_tokens && q->api->max_tokens == 0;
    return r;
}

/* Inserts the plan's entries once the prompt's prefill is done (readable by others now). */
static void insert_entries(req_t *q)
{
    if (q->entries_inserted)
        return;
    q->entries_inserted = true;
    uint64_t now = pc_time_mono_ms();
    /* One walk down the prompt for all of the plan's entries (at most GW_CACHEPLAN_MAX_BPS;
     * a longer plan, which gw_api_parse never makes, goes in several). TTL runs from the start
     * of the request (api-spec §1.7). */
    gw_cindex_point_t pts[GW_CACHEPLAN_MAX_BPS];
    for (size_t i = 0; i < q->plan.n_bps; i += GW_CACHEPLAN_MAX_BPS) {
        size_t n = PC_MIN(q->plan.n_bps - i, (size_t)GW_CACHEPLAN_MAX_BPS);
        for (size_t k = 0; k < n; k++)
            pts[k] = (gw_cindex_point_t){
                q->plan.bps[i + k].n_tokens,
                q->plan.bps[i + k].ttl == ENG_CHAT_TTL_1H ? GW_CINDEX_TTL_1H : GW_CINDEX_TTL_5M};
        gw_cindex_insert_path(q->s->ix, q->ns, q->r.tokens, pts, n, q->t0_ms, now, NULL);
    }
    /* The worker that prefilled the prompt holds its KV. */
    if (q->plan.n_bps > 0 || q->read_tokens > 0)
        gw_cindex_owner_add(q->s->ix, q->ns, q->r.tokens, q->r.n_tokens, q->worker, NULL);
}

/* The worker finished q (DONE), failed it (ERROR, worker down) or it was cancelled. */
static void request_done(req_t *q, int bill_status, const gw_api_error_t *fail)
{
    q->usage.output_tokens = q->n_tokens_out;
    if (bill_status == BILL_STATUS_FAILED && q->t_first_ms == 0 && !q->entries_inserted) {
        /* Nothing was computed that the client can use: only what was produced is billed. */
        q->usage = (gw_usage_t){0};
    }
    int brc = bill_request(q, bill_status);
    gw_api_resp_t r = resp_of(q);
    q->final.len = 0;
    if (q->http == NULL) {
        /* The client is gone: the event is written, nothing to send. */
        req_unlink_live(q);
        req_free(q);
        return;
    }
    if (brc != 0 && fail == NULL) {
        gw_api_error_t e;
        gw_api_error_set(&e, q->kind, 500,
                         "the usage of this request could not be recorded; it is not billed");
        if (q->streaming_started) {
            if (q->kind == GW_API_OPENAI_CHAT)
                gw_openai_sse_error(&q->osse, &e, &q->final);
            else
                gw_anthropic_sse_error(&q->asse, &e, &q->final);
            q->final_is_stream = true;
            req_unlink_live(q);
            finish_response(q);
        } else {
            req_unlink_live(q);
            respond_error(q, &e);
            req_free(q);
        }
        return;
    }
    if (fail != NULL) {
        if (q->streaming_started) {
            if (q->kind == GW_API_OPENAI_CHAT)
                gw_openai_sse_error(&q->osse, fail, &q->final);
            else
                gw_anthropic_sse_error(&q->asse, fail, &q->final);
            q->final_is_stream = true;
        } else {
            gw_api_error_render(q->kind, fail, q->id, &q->final);
            q->final_status = fail->status;
        }
    } else if (q->api->stream) {
        q->asse_pre = q->asse;
        q->osse_pre = q->osse;
        if (q->kind == GW_API_OPENAI_CHAT)
            gw_openai_sse_finish(&q->osse, &r, &q->final);
        else
            gw_anthropic_sse_finish(&q->asse, &r, &q->final);
        q->final_is_stream = true;
    } else {
        if (q->kind == GW_API_OPENAI_CHAT)
            gw_openai_completion_render(&r, &q->final);
        else
            gw_anthropic_message_render(&r, &q->final);
        q->final_status = 200;
    }
    if (brc != 0) {
        req_unlink_live(q);
        finish_response(q);
        return;
    }
    wait_durable(q);
}

/* ---- worker events ----------------------------------------------------------------------- */

static req_t *find_live(serve_t *s, uint64_t wire_id)
{
    for (req_t *q = s->live; q; q = q->next_live)
        if (q->wire_id == wire_id)
            return q;
    return NULL;
}

static void start_stream(req_t *q)
{
    if (q->streaming_started || q->http == NULL || !q->api->stream)
        return;
    gw_http_header_t h[10];
    size_t n = std_headers(q, h, "text/event-stream");
    h[n++] = (gw_http_header_t){"cache-control", "no-cache"};
    if (gw_http_stream_begin(q->http, 200, h, n) != 0)
        return;
    q->streaming_started = true;
    gw_api_resp_t r = resp_of(q);
    pc_buf_t b = {0};
    if (q->kind == GW_API_OPENAI_CHAT) {
        gw_openai_sse_init(&q->osse, q->api->include_usage);
        gw_openai_sse_start(&q->osse, &r, &b);
    } else {
        gw_anthropic_sse_init(&q->asse);
        gw_anthropic_sse_start(&q->asse, &r, &b);
    }
    stream_out(q, &b);
    pc_buf_free(&b);
}

static void on_text(req_t *q, const char *text, size_t len)
{
    if (len == 0)
        return;
    if (!q->api->stream) {
        pc_buf_append(&q->text, text, len);
        return;
    }
    pc_buf_t b = {0};
    gw_api_resp_t r = resp_of(q);
    if (q->kind == GW_API_OPENAI_CHAT)
        gw_openai_sse_text(&q->osse, &r, text, len, &b);
    else
        gw_anthropic_sse_text(&q->asse, text, len, &b);
    stream_out(q, &b);
    pc_buf_free(&b);
}

static void first_token(req_t *q)
{
    if (q->t_first_ms)
        return;
    q->t_first_ms = pc_time_mono_ms();
    const char *outcome = q->read_tokens == 0 ? "miss" : "hit";
    const char *lv[] = {outcome};
    gw_metric_observe(q->s->m_ttft, lv, (double)(q->t_first_ms - q->t0_ms) / 1000.0);
    insert_entries(q);
}

static void pool_event(void *ud, uint32_t worker, const eng_wire_frame_t *ev)
{
    serve_t *s = ud;
    switch (ev->type) {
    case ENG_WIRE_TOKEN: {
        req_t *q = find_live(s, ev->u.token.request_id);
        if (q == NULL)
            return;
        first_token(q);
        q->n_tokens_out++;
        on_text(q, ev->u.token.text.base, ev->u.token.text.len);
        return;
    }
    case ENG_WIRE_DONE: {
        req_t *q = find_live(s, ev->u.done.request_id);
        if (q == NULL)
            return;
        const eng_wire_done_t *d = &ev->u.done;
        first_token(q);
        on_text(q, d->text.base, d->text.len);
        q->n_tokens_out = d->usage.output_tokens;
        q->tokens_reused = d->usage.tokens_reused;
        q->worker_ttft_us = d->timing.queue_us + d->timing.prefill_us;
        q->worker_total_us = q->worker_ttft_us + d->timing.decode_us;
        int st = BILL_STATUS_COMPLETED;
        switch (d->stop_reason) {
        case ENG_WIRE_STOP_MAX_TOKENS:
            q->stop = GW_STOP_MAX_TOKENS;
            break;
        case ENG_WIRE_STOP_SEQUENCE:
            q->stop = GW_STOP_STOP_SEQUENCE;
            if (d->stop_index >= 0 && (size_t)d->stop_index < q->api->n_stop)
                q->stop_seq = q->api->stop[d->stop_index];
            break;
        case ENG_WIRE_STOP_CANCELED:
            st = q->http == NULL ? BILL_STATUS_DISCONNECTED : BILL_STATUS_CANCELLED;
            break;
        default:
            q->stop = GW_STOP_END_TURN;
        }
        request_done(q, st, NULL);
        return;
    }
    case ENG_WIRE_ERROR: {
        req_t *q = find_live(s, ev->u.error.request_id);
        if (q == NULL)
            return;
        gw_api_error_t e;
        int status = ev->u.error.code == PC_ERR_RANGE || ev->u.error.code == PC_ERR_NOSPACE ? 400
                     : ev->u.error.code == PC_ERR_OVERLOADED                                ? 529
                                                                                            : 500;
        gw_api_error_set(&e, q->kind, status, "worker: %.*s", (int)ev->u.error.message.len,
                         ev->u.error.message.base);
        request_done(q, BILL_STATUS_FAILED, &e);
        return;
    }
    case ENG_WIRE_SNAPSHOT: {
        /* After a (re)connect the worker lists what it holds pinned: it owns those again. */
        const eng_wire_snapshot_t *sn = &ev->u.snapshot;
        for (uint32_t i = 0; i < sn->n_entries; i++)
            gw_cindex_owner_add(s->ix, sn->entries[i].ns, sn->entries[i].tokens,
                                sn->entries[i].n_tokens, worker, NULL);
        return;
    }
    case ENG_WIRE_KV_EVENT: {
        const eng_wire_kv_event_t *kv = &ev->u.kv;
        if (kv->kind == ENG_WIRE_KV_RETAINED) {
            req_t *q = find_live(s, kv->request_id);
            if (q != NULL && kv->n_tokens <= q->r.n_tokens)
                gw_cindex_owner_add(s->ix, kv->ns, q->r.tokens, kv->n_tokens, worker, NULL);
        } else if (kv->kind == ENG_WIRE_KV_EVICTED && kv->n_path == kv->n_tokens) {
            gw_cindex_owner_evicted(s->ix, worker, kv->ns, kv->tokens, kv->n_kept, kv->n_tokens);
        } else if (kv->kind == ENG_WIRE_KV_RETAIN_FAILED) {
            const char *lv[] = {"retain_failed"};
            gw_metric_add(s->m_expired, lv, 1);
        }
        return;
    }
    default:
        return;
    }
}

static void route_and_submit(req_t *q);

static void pool_state(void *ud, uint32_t worker, bool up, const char *reason)
{
    serve_t *s = ud;
    if (up)
        return;
    gw_cindex_worker_down(s->ix, worker);
    /* Requests on that worker: not started yet -> another worker; streaming -> an error. */
    req_t *next;
    for (req_t *q = s->live; q; q = next) {
        next = q->next_live;
        if (q->worker != worker || q->phase != PH_RUNNING)
            continue;
        if (q->t_first_ms == 0 && q->http != NULL && !q->streaming_started) {
            req_unlink_live(q);
            route_and_submit(q);
            continue;
        }
        gw_api_error_t e;
        gw_api_error_set(&e, q->kind, 529, "worker %s went away: %s",
                         gw_pool_worker(s->pool, worker)->name, reason);
        request_done(q, BILL_STATUS_FAILED, &e);
    }
}

/* ---- the request path -------------------------------------------------------------------- */

static bool entry_live_cb(uint32_t n_tokens, void *ud)
{
    req_t *q = ud;
    return gw_cindex_entry_live(q->s->ix, q->ns, q->r.tokens, n_tokens, pc_time_mono_ms());
}

static void route_and_submit(req_t *q)
{
    serve_t *s = q->s;
    size_t nw = gw_pool_n_workers(s->pool);
    gw_router_worker_t cand[GW_POOL_MAX_WORKERS];
    uint32_t cached[GW_POOL_MAX_WORKERS];
    gw_cindex_match_t m;
    uint64_t now = pc_time_mono_ms();
    gw_cindex_match(s->ix, q->ns, q->r.tokens, q->r.n_tokens, now, &m);
    q->path_tokens = m.n_matched;
    q->read_tokens = s->cfg.accounting == GW_ACCOUNTING_ANTHROPIC
                         ? gw_cacheplan_anthropic_hit(&q->plan, entry_live_cb, q)
                         : m.n_hit;
    /* A hit shorter than the model's minimum cacheable length (typically the chat template's
     * opening tokens, shared by every prompt of the namespace) is no read: nothing that short
     * is ever written, so it is billed as uncached input. */
    if (q->read_tokens < q->model->cfg->min_cache_tokens)
        q->read_tokens = 0;
    if (q->read_tokens > 0) /* reads refresh the entries they cover, for free */
        gw_cindex_read(s->ix, q->ns, q->r.tokens, q->read_tokens, now, NULL);
    size_t n = 0;
    uint32_t map[GW_POOL_MAX_WORKERS];
    for (uint32_t i = 0; i < nw; i++) {
        const gw_pool_worker_t *w = gw_pool_worker(s->pool, i);
        if (w->model != q->model->index)
            continue;
        gw_router_worker_t *c = &cand[n];
        memset(c, 0, sizeof *c);
        c->up = w->up;
        c->queued_prefill_tokens = w->load.queued_prefill_tokens;
        c->running_seqs = w->load.running_seqs;
        c->free_blocks = w->load.free_blocks;
        c->total_blocks = w->total_blocks;
        c->prefill_tok_s = w->prefill_tok_s;
        c->decode_ms_per_token = w->decode_ms_per_token;
        c->max_prompt_tokens = w->max_prompt_tokens;
        cached[n] = m.held[i];
        map[n++] = i;
    }
    gw_router_choice_t ch;
    if (gw_router_pick(&s->router, cand, n, (uint32_t)q->r.n_tokens, cached, &ch) != 0 ||
        ch.worker < 0) {
        gw_api_error_t e;
        gw_api_error_set(&e, q->kind, 529, "no worker of model %s is available",
                         q->model->cfg->name);
        respond_error(q, &e);
        req_free(q);
        return;
    }
    q->worker = map[ch.worker];
    q->phys_tokens = cached[ch.worker];
    const char *rl[] = {ch.reason};
    gw_metric_add(s->m_routes, rl, 1);
    const char *lk[] = {q->read_tokens == 0                  ? "miss"
                        : q->read_tokens >= q->plan.n_prompt ? "hit"
                                                             : "partial"};
    gw_metric_add(s->m_lookups, lk, 1);

    gw_usage_compute(&q->plan, (uint32_t)q->r.n_tokens, q->read_tokens, &q->usage);
    make_cache_header(q);

    /* Retain the plan's entries and refresh the pin of what was read. */
    eng_wire_retain_t retain[GW_API_MAX_BREAKPOINTS + 1];
    uint32_t n_retain = 0;
    for (size_t i = 0; i < q->plan.n_bps && n_retain < GW_API_MAX_BREAKPOINTS; i++)
        retain[n_retain++] = (eng_wire_retain_t){
            q->plan.bps[i].n_tokens,
            q->plan.bps[i].ttl == ENG_CHAT_TTL_1H ? s->cfg.ttl_1h_ms : s->cfg.ttl_5m_ms};
    if (q->read_tokens > 0)
        retain[n_retain++] = (eng_wire_retain_t){q->read_tokens, s->cfg.ttl_5m_ms};

    eng_wire_submit_t rq = {0};
    q->wire_id = ++s->next_wire_id;
    rq.request_id = q->wire_id;
    rq.ns = q->ns;
    rq.tokens = q->r.tokens;
    rq.n_tokens = (uint32_t)q->r.n_tokens;
    rq.retain = retain;
    rq.n_retain = n_retain;
    rq.sampling = q->api->sampling;
    if (!q->api->has_seed)
        rq.sampling.seed = q->wire_id * 0x9E3779B97F4A7C15ull;
    uint32_t room = q->model->n_ctx > q->r.n_tokens ? q->model->n_ctx - (uint32_t)q->r.n_tokens : 0;
    rq.max_tokens = q->api->has_max_tokens ? q->api->max_tokens : room;
    rq.stops = q->api->stop;
    rq.n_stops = (uint32_t)q->api->n_stop;
    char err[256];
    int rc = gw_pool_submit(s->pool, q->worker, &rq, err, sizeof err);
    if (rc != 0) {
        gw_api_error_t e;
        if (rc == PC_ERR_RANGE)
            gw_api_error_set(&e, q->kind, 400, "prompt is too long: %s", err);
        else if (rc == PC_ERR_OVERLOADED || rc == PC_ERR_UPSTREAM)
            gw_api_error_set(&e, q->kind, 529, "Overloaded");
        else
            gw_api_error_set(&e, q->kind, rc == PC_ERR_INVAL ? 400 : 500, "%s", err);
        respond_error(q, &e);
        req_free(q);
        return;
    }
    q->phase = PH_RUNNING;
    q->next_live = s->live;
    if (s->live)
        s->live->prev_live = q;
    s->live = q;
    q->prev_live = NULL;
    start_stream(q);
}

static void prepare_work(uv_work_t *w)
{
    req_t *q = w->data;
    serve_t *s = q->s;
    pc_slice_t body = gw_http_req_body(q->http);
    int rc = gw_api_parse(q->kind, body.base, body.len, &q->arena, &q->api, &q->err);
    if (rc != 0) {
        q->prep_rc = rc;
        return;
    }
    for (size_t i = 0; i < s->n_models; i++)
        if (pc_slice_eq_cstr(q->api->model, s->models[i].cfg->name))
            q->model = &s->models[i];
    if (q->model == NULL) {
        gw_api_error_set(&q->err, q->kind, 404, "model: %.*s", (int)q->api->model.len,
                         q->api->model.base);
        q->prep_rc = PC_ERR_NOTFOUND;
        return;
    }
    /* The namespace first: it scopes the token cache, so one tenant's prompts never make
     * another's requests faster. */
    q->ns =
        namespace_of(s, q->key->tenant, q->api->model, q->api->has_cache_salt, q->api->cache_salt);
    char err[256];
    rc = eng_render_chat_cached(q->model->render, q->model->tokcache, q->ns, q->api->chat,
                                &q->arena, &q->r, err, sizeof err);
    if (rc != 0) {
        gw_api_error_set(&q->err, q->kind, rc == PC_ERR_NOMEM ? 500 : 400, "%s", err);
        q->prep_rc = rc;
        return;
    }
    eng_chat_ttl_t auto_ttl =
        q->model->cfg->auto_ttl_ms == 3600000 ? ENG_CHAT_TTL_1H : ENG_CHAT_TTL_5M;
    rc = gw_cacheplan_build(q->api->chat, &q->r, q->model->cfg->min_cache_tokens, auto_ttl,
                            &q->arena, &q->plan);
    if (rc != 0) {
        gw_api_error_set(&q->err, q->kind, 500, "cache plan: %s", pc_strerror(rc));
        q->prep_rc = rc;
        return;
    }
}

static void prepare_done(uv_work_t *w, int status)
{
    req_t *q = w->data;
    serve_t *s = q->s;
    (void)status;
    if (q->http == NULL) { /* the client left while we tokenized */
        req_free(q);
        return;
    }
    if (q->prep_rc != 0) {
        respond_error(q, &q->err);
        req_free(q);
        return;
    }
    if (q->kind == GW_API_ANTHROPIC_COUNT_TOKENS) {
        q->usage.input_tokens = (uint32_t)q->r.n_tokens; /* for the access log */
        pc_buf_t b = {0};
        gw_anthropic_count_tokens_render((uint32_t)q->r.n_tokens, &b);
        respond(q, 200, "application/json", b.base, b.len);
        pc_buf_free(&b);
        req_free(q);
        return;
    }
    if (s->stopping) {
        respond_errorf(q, 529, "%s", "the gateway is shutting down");
        req_free(q);
        return;
    }
    const bill_price_t *price;
    if (bill_pricing_lookup(s->pricing, q->model->cfg->name, pc_time_wall_ms(), &price) != 0) {
        respond_errorf(q, 500,
                       "no price is configured for model %s: the request is refused, "
                       "never served unbilled",
                       q->model->cfg->name);
        req_free(q);
        return;
    }
    if (bill_ledger_status(s->ledger) != 0) {
        respond_errorf(q, 503, "%s",
                       "billing is unavailable (the usage ledger cannot be written): "
                       "billable requests are refused");
        req_free(q);
        return;
    }
    ns_remember(s, q->ns, q->key->tenant, q->model->index);
    if (q->kind == GW_API_OPENAI_CHAT)
        hex_id(q->resp_id, sizeof q->resp_id, "chatcmpl-");
    else
        hex_id(q->resp_id, sizeof q->resp_id, "msg_");
    route_and_submit(q);
}

static void on_abort(gw_http_req_t *r, void *data)
{
    req_t *q = data;
    (void)r;
    q->http = NULL;
    q->client_gone = true;
    if (q->phase == PH_RUNNING)
        gw_pool_cancel(q->s->pool, q->worker, q->wire_id);
    /* PH_PREPARE: prepare_done frees it; PH_DURABLE: finish_response sees http == NULL. */
}

/* ---- simple endpoints -------------------------------------------------------------------- */

static void models_list(req_t *q, bool anthropic)
{
    serve_t *s = q->s;
    pc_buf_t b = {0};
    if (anthropic) {
        pc_buf_append_cstr(&b, "{\"data\":[");
        for (size_t i = 0; i < s->n_models; i++) {
            pc_buf_printf(&b, "%s{\"type\":\"model\",\"id\":", i ? "," : "");
            gw_json_string(&b, s->models[i].cfg->name, strlen(s->models[i].cfg->name));
            pc_buf_append_cstr(&b, ",\"display_name\":");
            gw_json_string(&b, s->models[i].cfg->name, strlen(s->models[i].cfg->name));
            pc_buf_append_cstr(&b, ",\"created_at\":\"2026-01-01T00:00:00Z\"}");
        }
        pc_buf_append_cstr(&b, "],\"has_more\":false,\"first_id\":");
        gw_json_string(&b, s->models[0].cfg->name, strlen(s->models[0].cfg->name));
        pc_buf_append_cstr(&b, ",\"last_id\":");
        gw_json_string(&b, s->models[s->n_models - 1].cfg->name,
                       strlen(s->models[s->n_models - 1].cfg->name));
        pc_buf_append_cstr(&b, "}");
    } else {
        pc_buf_append_cstr(&b, "{\"object\":\"list\",\"data\":[");
        for (size_t i = 0; i < s->n_models; i++) {
            pc_buf_printf(&b, "%s{\"id\":", i ? "," : "");
            gw_json_string(&b, s->models[i].cfg->name, strlen(s->models[i].cfg->name));
            pc_buf_append_cstr(&b, ",\"object\":\"model\",\"created\":1767225600,"
                                   "\"owned_by\":\"kvgw\"}");
        }
        pc_buf_append_cstr(&b, "]}");
    }
    respond(q, 200, "application/json", b.base, b.len);
    pc_buf_free(&b);
}

static void update_gauges(serve_t *s);

static void metrics_endpoint(req_t *q)
{
    update_gauges(q->s);
    pc_buf_t b = {0};
    gw_metrics_render(q->s->m, &b);
    respond(q, 200, "text/plain; version=0.0.4; charset=utf-8", b.base ? b.base : "", b.len);
    pc_buf_free(&b);
}

/* ---- GET /admin/v1/usage: the ledger exported, streamed ------------------------------------
 *
 * Query: from, to (RFC 3339 or epoch ms; [from, to) by event start), tenant, format (csv, jsonl,
 * focus; default csv), group (none, day). The export reads ledger files, so each step runs on
 * the thread pool; its output goes to the client between steps, and the next step waits while
 * the client does not read (on_drain). Memory stays bounded by one step's output. */

typedef struct export_job {
    req_t *q;
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
    req_free(j->q);
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
    req_t *q = data;
    export_job_t *j = q->job;
    if (j->waiting_drain)
        export_next(j);
}

static void export_abort(gw_http_req_t *r, void *data)
{
    (void)r;
    req_t *q = data;
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
    req_t *q = j->q;
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
    count_request(q, 200);
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

/* Returns true when the export started (q is then owned by the job). */
static bool admin_usage(req_t *q, const char *query)
{
    serve_t *s = q->s;
    bill_export_params_t xp = bill_export_params_default();
    char v[128], tenant[128];
    uint64_t ms;
    if (query_param(query, "from", v, sizeof v)) {
        if (bill_parse_time_ms(v, &ms) != 0) {
            respond_errorf(q, 400, "from: not a time (RFC 3339 or epoch ms): %s", v);
            return false;
        }
        xp.from_ms = ms;
    }
    if (query_param(query, "to", v, sizeof v)) {
        if (bill_parse_time_ms(v, &ms) != 0) {
            respond_errorf(q, 400, "to: not a time (RFC 3339 or epoch ms): %s", v);
            return false;
        }
        xp.to_ms = ms;
    }
    if (query_param(query, "tenant", tenant, sizeof tenant))
        xp.tenant = tenant;
    if (query_param(query, "format", v, sizeof v) &&
        (xp.format = bill_export_format_parse(v)) < 0) {
        respond_errorf(q, 400, "format: expected csv, jsonl or focus, got %s", v);
        return false;
    }
    if (query_param(query, "group", v, sizeof v) && (xp.group = bill_export_group_parse(v)) < 0) {
        respond_errorf(q, 400, "group: expected none or day, got %s", v);
        return false;
    }
    export_job_t *j = pc_calloc(1, sizeof *j);
    if (j == NULL) {
        respond_errorf(q, 500, "%s", "out of memory");
        return false;
    }
    xp.pricing = s->pricing;
    xp.chunk = export_chunk;
    xp.ud = j;
    char err[256];
    if (bill_export_open(s->cfg.ledger_dir, &xp, &j->x, err, sizeof err) != 0) {
        pc_free(j);
        respond_errorf(q, 400, "%s", err);
        return false;
    }
    j->q = q;
    j->work.data = j;
    q->job = j;
    gw_http_header_t h[4];
    size_t n = 0;
    h[n++] = (gw_http_header_t){"content-type", xp.format == BILL_EXPORT_JSONL
                                                    ? "application/x-ndjson"
                                                    : "text/csv; charset=utf-8"};
    h[n++] = (gw_http_header_t){"request-id", q->id};
    gw_http_req_on_abort(q->http, export_abort);
    gw_http_req_on_drain(q->http, export_drain);
    if (gw_http_stream_begin(q->http, 200, h, n) != 0) {
        bill_export_free(j->x);
        pc_free(j);
        q->job = NULL;
        return false;
    }
    export_next(j);
    return true;
}

/* The client's key: x-api-key, else Authorization: Bearer. */
static const char *client_key(gw_http_req_t *r)
{
    const char *k = gw_http_req_header(r, "x-api-key");
    if (k != NULL)
        return k;
    const char *a = gw_http_req_header(r, "authorization");
    if (a != NULL && strncasecmp(a, "Bearer ", 7) == 0)
        return a + 7;
    return NULL;
}

static void on_request(gw_http_req_t *r, void *ud)
{
    serve_t *s = ud;
    req_t *q = pc_calloc(1, sizeof *q);
    if (q == NULL) {
        gw_http_respond(r, 500, NULL, 0, "", 0);
        return;
    }
    q->s = s;
    q->http = r;
    q->t0_ms = gw_http_req_start_ms(r);
    q->wall0_ms = pc_time_wall_ms();
    pc_arena_init(&q->arena, 64u << 10);
    hex_id(q->id, sizeof q->id, "req_");
    const char *method = gw_http_req_method(r), *path = gw_http_req_path(r);
    q->kind = kind_for_path(path);
    q->endpoint = "other";
    gw_http_req_set_data(r, q);
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    bool post = strcmp(method, "POST") == 0;

    if (get && strcmp(path, "/healthz") == 0) {
        q->endpoint = "health";
        respond(q, 200, "application/json", "{\"status\":\"ok\"}", 15);
    } else if (get && strcmp(path, "/dashboard") == 0) {
        /* The page itself holds no data: it reads /metrics (the admin key is kept in the URL
         * fragment, which never reaches the server). */
        q->endpoint = "dashboard";
        pc_buf_t b = {0};
        if (gw_dashboard_page(&b) == 0)
            respond(q, 200, "text/html; charset=utf-8", b.base, b.len);
        else
            respond_errorf(q, 500, "%s", "out of memory");
        pc_buf_free(&b);
    } else if (get && strcmp(path, "/readyz") == 0) {
        q->endpoint = "health";
        bool ready = !s->stopping && bill_ledger_status(s->ledger) == 0;
        for (size_t i = 0; i < s->n_models; i++)
            ready = ready && gw_pool_model_up(s->pool, (uint32_t)i);
        if (ready)
            respond(q, 200, "application/json", "{\"status\":\"ready\"}", 18);
        else
            respond(q, 503, "application/json", "{\"status\":\"not ready\"}", 22);
    } else if (get && strcmp(path, "/metrics") == 0) {
        q->endpoint = "metrics";
        metrics_endpoint(q);
    } else if (get && strcmp(path, "/v1/models") == 0) {
        q->endpoint = "models";
        const char *key = client_key(r);
        if (key == NULL || gw_config_key_find(&s->cfg, key, strlen(key)) == NULL)
            respond_errorf(q, 401, "%s",
                           key ? "invalid x-api-key" : "x-api-key header is required");
        else
            models_list(q, gw_http_req_header(r, "anthropic-version") != NULL);
    } else if (post && (strcmp(path, "/v1/messages") == 0 ||
                        strcmp(path, "/v1/messages/count_tokens") == 0 ||
                        strcmp(path, "/v1/chat/completions") == 0)) {
        if (strcmp(path, "/v1/messages/count_tokens") == 0)
            q->kind = GW_API_ANTHROPIC_COUNT_TOKENS;
        q->endpoint = kind_endpoint(q->kind);
        const char *key = client_key(r);
        q->key = key ? gw_config_key_find(&s->cfg, key, strlen(key)) : NULL;
        if (q->key == NULL) {
            if (q->kind == GW_API_OPENAI_CHAT)
                respond_errorf(q, 401, "%s",
                               key ? "Incorrect API key provided."
                                   : "You didn't provide an API key. You need to provide your "
                                     "API key in an Authorization header using Bearer auth "
                                     "(i.e. Authorization: Bearer YOUR_KEY).");
            else
                respond_errorf(q, 401, "%s",
                               key ? "invalid x-api-key" : "x-api-key header is required");
        } else {
            gw_http_req_on_abort(r, on_abort);
            gw_http_req_on_drain(r, on_drain);
            q->work.data = q;
            q->phase = PH_PREPARE;
            uv_queue_work(s->loop, &q->work, prepare_work, prepare_done);
            return;
        }
    } else if (get && strncmp(path, "/admin/", 7) == 0) {
        const char *key = client_key(r);
        if (key == NULL || !gw_config_is_admin(&s->cfg, key, strlen(key)))
            respond_errorf(q, key ? 403 : 401, "%s",
                           key ? "this endpoint needs the admin key"
                               : "x-api-key header is required");
        else if (strcmp(path, "/admin/v1/usage") == 0) {
            q->endpoint = "admin_usage";
            if (admin_usage(q, gw_http_req_query(r)))
                return; /* streaming: the export job owns q now */
        } else
            respond_errorf(q, 404, "Not found: %s", path);
    } else if (strcmp(path, "/v1/messages") == 0 || strcmp(path, "/v1/chat/completions") == 0 ||
               strcmp(path, "/v1/models") == 0 || strcmp(path, "/metrics") == 0 ||
               strcmp(path, "/healthz") == 0 || strcmp(path, "/readyz") == 0) {
        respond_errorf(q, 405, "Method %s not allowed", method);
    } else {
        respond_errorf(q, 404, "Not found: %s", path);
    }
    req_free(q);
}

/* ---- timers, metrics, signals ------------------------------------------------------------ */

/* An entry left the index: the workers pinning it may let it go. */
static void on_entry_drop(const gw_cindex_drop_t *ev, void *ud)
{
    serve_t *s = ud;
    static const char *const reasons[] = {"ttl", "capacity", "capacity", "removed"};
    const char *lv[] = {reasons[ev->reason & 3]};
    if (s->m_expired)
        gw_metric_add(s->m_expired, lv, 1);
    if (s->pool == NULL)
        return;
    for (uint32_t w = 0; w < GW_POOL_MAX_WORKERS; w++)
        if (ev->owners & (1ull << w))
            gw_pool_release(s->pool, w, ev->ns, ev->tokens, (uint32_t)ev->n_tokens);
}

typedef struct storage_ctx {
    serve_t *s;
    uint64_t from, to;
} storage_ctx_t;

static void storage_cb(uint64_t ns, uint64_t token_ms, void *ud)
{
    storage_ctx_t *c = ud;
    serve_t *s = c->s;
    const ns_info_t *info = ns_lookup(s, ns);
    if (token_ms == 0 || info == NULL)
        return;
    const char *tenant = info->tenant, *model = s->models[info->model].cfg->name;
    bill_event_t ev;
    bill_event_init(&ev, BILL_EVENT_STORAGE);
    bill_idgen_next(&s->idgen, ev.event_id);
    snprintf(ev.ns, sizeof ev.ns, "%016" PRIx64, ns);
    bill_event_set_str(ev.tenant, tenant);
    bill_event_set_str(ev.model, model);
    ev.start_ms = c->from;
    ev.end_ms = c->to;
    ev.token_ms = token_ms;
    char err[256];
    uint64_t seq;
    if (bill_event_price(&ev, s->pricing, err, sizeof err) == 0)
        bill_ledger_append(s->ledger, &ev, &seq);
}

static void meter_storage(serve_t *s)
{
    uint64_t now = pc_time_wall_ms();
    storage_ctx_t c = {s, s->last_storage_ms, now};
    gw_cindex_storage_take(s->ix, pc_time_mono_ms(), storage_cb, &c);
    s->last_storage_ms = now;
}

static void update_gauges(serve_t *s)
{
    gw_cindex_stats_t st;
    gw_cindex_stats(s->ix, &st);
    gw_metric_set(s->m_entries, NULL, (double)st.n_entries);
    gw_metric_set(s->m_entry_tokens, NULL, (double)st.n_tokens);
    for (uint32_t i = 0; i < gw_pool_n_workers(s->pool); i++) {
        const gw_pool_worker_t *w = gw_pool_worker(s->pool, i);
        const char *lv[] = {w->name};
        gw_metric_set(s->m_worker_up, lv, w->up ? 1 : 0);
        gw_metric_set(s->m_worker_queue, lv, w->load.queued_requests);
        gw_metric_set(s->m_worker_free, lv, w->load.free_blocks);
    }
    size_t inflight = 0;
    for (req_t *q = s->live; q; q = q->next_live)
        inflight++;
    gw_metric_set(s->m_inflight, NULL, (double)inflight);
    if (s->shipper != NULL) {
        bill_shipper_stats_t ss;
        bill_shipper_stats(s->shipper, &ss);
        uint64_t durable = bill_ledger_durable_seq(s->ledger);
        gw_metric_set(s->m_ship_lag, NULL,
                      durable > ss.shipped_seq ? (double)(durable - ss.shipped_seq) : 0);
    }
}

static void on_tick(uv_timer_t *t)
{
    serve_t *s = t->data;
    uint64_t now = pc_time_mono_ms();
    gw_cindex_expire(s->ix, now);
    /* One write per tick instead of one per request on the loop; a crash loses at most the
     * last tick's lines of the access log (never billing data: that is the ledger's). */
    if (s->access_log_dirty) {
        s->access_log_dirty = false;
        fflush(s->access_log);
    }
    if (pc_time_wall_ms() - s->last_storage_ms >= s->cfg.storage_interval_ms)
        meter_storage(s);
}

/* The HTTP server closed after the shutdown: no request can arrive any more. The loop ends
 * once every in-flight request is finished (their durability wait included) and the handles
 * below are stopped. */
static void all_closed(void *ud)
{
    serve_t *s = ud;
    s->http_closed = true;
    PC_LOG(PC_LOG_INFO, "serve", "HTTP closed; %s",
           s->live || s->durable_head ? "finishing requests" : "stopping");
    uv_timer_stop(&s->tick);
    uv_close((uv_handle_t *)&s->tick, NULL);
    uv_close((uv_handle_t *)&s->sig_int, NULL);
    uv_close((uv_handle_t *)&s->sig_term, NULL);
    uv_close((uv_handle_t *)&s->sig_hup, NULL);
    if (s->live == NULL && s->durable_head == NULL)
        uv_stop(s->loop);
}

static void begin_shutdown(serve_t *s)
{
    if (s->stopping)
        return;
    s->stopping = true;
    fprintf(stderr, "kvgw: shutting down (finishing in-flight requests, up to %u ms)\n",
            s->cfg.shutdown_grace_ms);
    gw_http_server_shutdown(s->http, s->cfg.shutdown_grace_ms, all_closed, s);
}

static void on_signal(uv_signal_t *h, int sig)
{
    serve_t *s = h->data;
    if (s->stopping) {
        fprintf(stderr, "kvgw: second signal %d, closing now\n", sig);
        gw_http_server_shutdown(s->http, 0, all_closed, s);
        return;
    }
    begin_shutdown(s);
}

/* Opens the access log file for appending, with a 64 KiB buffer that the tick flushes. */
static FILE *open_access_log(const char *path)
{
    FILE *f = fopen(path, "a");
    if (f != NULL)
        setvbuf(f, NULL, _IOFBF, 64 << 10);
    return f;
}

/* SIGHUP reopens the access log file (log rotation: move the file away, then send SIGHUP).
 * The old file gets every line written before the signal; when the path cannot be opened the
 * old file is kept and the error is logged. stdout and "off" are left as they are. */
static void on_sighup(uv_signal_t *h, int sig)
{
    (void)sig;
    serve_t *s = h->data;
    if (s->access_log == NULL || s->access_log == stdout)
        return;
    FILE *f = open_access_log(s->cfg.access_log);
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
    PC_LOG(PC_LOG_INFO, "serve", "SIGHUP: reopened the access log %s", s->cfg.access_log);
}

static void setup_metrics(serve_t *s)
{
    static const double dur[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                 1,     2.5,  5,     10,   30,  60,   120};
    const char *ep_code[] = {"endpoint", "code"}, *ep[] = {"endpoint"}, *outc[] = {"cache"},
               *typ[] = {"type"}, *kind[] = {"kind"}, *res[] = {"result"}, *wk[] = {"worker"},
               *rea[] = {"reason"}, *state[] = {"state"}, *ver[] = {"version"};
    s->m = gw_metrics_new();
    s->m_build = gw_metrics_gauge(s->m, "kvgw_build_info", "Build information.", 1, ver);
    s->m_requests = gw_metrics_counter(s->m, "kvgw_requests_total",
                                       "HTTP requests by endpoint and status code.", 2, ep_code);
    s->m_duration = gw_metrics_histogram(s->m, "kvgw_request_duration_seconds",
                                         "Request duration, first byte to last byte.", 1, ep, dur,
                                         PC_ARRAY_LEN(dur));
    s->m_ttft = gw_metrics_histogram(s->m, "kvgw_time_to_first_token_seconds",
                                     "Time to first token by cache outcome.", 1, outc, dur,
                                     PC_ARRAY_LEN(dur));
    s->m_tokens =
        gw_metrics_counter(s->m, "kvgw_tokens_total",
                           "Billed tokens by bucket (prompt buckets are disjoint).", 1, typ);
    s->m_hit_tokens = gw_metrics_counter(
        s->m, "kvgw_cache_hit_tokens_total",
        "Prompt tokens read from the cache: logical (billed) and physical (KV reused).", 1, kind);
    s->m_lookups = gw_metrics_counter(s->m, "kvgw_cache_lookups_total",
                                      "Cache lookups by result (hit, partial, miss).", 1, res);
    s->m_entries = gw_metrics_gauge(s->m, "kvgw_cache_entries", "Live cache entries.", 0, NULL);
    s->m_entry_tokens =
        gw_metrics_gauge(s->m, "kvgw_cache_tokens", "Tokens held by live cache entries.", 0, NULL);
    s->m_expired = gw_metrics_counter(s->m, "kvgw_cache_expirations_total",
                                      "Cache entries removed, by reason.", 1, rea);
    s->m_worker_up =
        gw_metrics_gauge(s->m, "kvgw_worker_up", "1 when the worker is usable.", 1, wk);
    s->m_worker_queue = gw_metrics_gauge(s->m, "kvgw_worker_queued_requests",
                                         "Requests waiting for admission on the worker.", 1, wk);
    s->m_worker_free = gw_metrics_gauge(s->m, "kvgw_worker_free_kv_blocks",
                                        "Free KV blocks on the worker.", 1, wk);
    s->m_routes = gw_metrics_counter(s->m, "kvgw_routing_decisions_total",
                                     "Routing decisions by reason.", 1, rea);
    s->m_billing = gw_metrics_counter(s->m, "kvgw_billing_events_total",
                                      "Usage events by ledger outcome.", 1, state);
    s->m_inflight =
        gw_metrics_gauge(s->m, "kvgw_requests_in_flight", "Requests running on a worker.", 0, NULL);
    if (s->cfg.per_tenant_metrics) {
        const char *tt[] = {"tenant", "type"};
        s->m_tenant_tokens = gw_metrics_counter(s->m, "kvgw_tenant_tokens_total",
                                                "Billed tokens by tenant and bucket.", 2, tt);
    }
    s->m_ship_lag = gw_metrics_gauge(s->m, "kvgw_billing_shipper_lag_events",
                                     "Durable ledger records not yet shipped to Redis.", 0, NULL);
    const char *v[] = {KVGW_VERSION};
    gw_metric_set(s->m_build, v, 1);
}

static int load_models(serve_t *s, char *err, size_t err_len)
{
    s->n_models = s->cfg.n_models;
    if (s->n_models > MAX_MODELS)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "at most %d models", MAX_MODELS);
    for (size_t i = 0; i < s->n_models; i++) {
        model_rt_t *m = &s->models[i];
        m->cfg = &s->cfg.models[i];
        m->index = (uint32_t)i;
        eng_gguf_t *g = NULL;
        eng_vocab_t *v = NULL;
        int rc = eng_gguf_open(m->cfg->path, &g, err, err_len);
        if (rc == 0)
            rc = eng_vocab_from_gguf(g, &v, err, err_len);
        if (rc == 0)
            rc = eng_tok_init(v, &m->tok, err, err_len);
        if (rc == 0)
            rc = eng_render_init(m->tok, ENG_RENDER_FAMILY_UNKNOWN, &m->render, err, err_len);
        if (rc == 0 && s->cfg.tokenizer_cache_bytes > 0) {
            eng_tokcache_params_t tp = eng_tokcache_params_default();
            tp.max_bytes = (size_t)s->cfg.tokenizer_cache_bytes;
            if ((rc = eng_tokcache_init(m->tok, &tp, &m->tokcache)) != 0)
                pc_err_setf(err, err_len, rc, "tokenizer cache: %s", pc_strerror(rc));
        }
        if (rc == 0) {
            eng_hparams_t hp;
            if (eng_hparams_from_gguf(g, &hp, NULL, 0) == 0)
                m->n_ctx = hp.n_ctx_train;
        }
        eng_vocab_free(v);
        eng_gguf_free(g);
        if (rc != 0)
            return rc;
        if (m->cfg->context_tokens && (m->n_ctx == 0 || m->cfg->context_tokens < m->n_ctx))
            m->n_ctx = m->cfg->context_tokens;
    }
    return 0;
}

static void usage_line(FILE *f)
{
    fprintf(f, "usage: kvgw serve [--config FILE] [--listen HOST:PORT]\n");
}

static void on_walk_close(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* Creates the parent directories of path (var/ for var/ledger on a fresh checkout); the ledger
 * creates its own last level. */
static int mkdir_parents(const char *path, char *err, size_t err_len)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n >= sizeof buf)
        return pc_err_setf(err, err_len, PC_ERR_RANGE, "path too long: %s", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i < n; i++) {
        if (buf[i] != '/')
            continue;
        buf[i] = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return pc_err_setf(err, err_len, PC_ERR_IO, "cannot create %s: %s", buf,
                               strerror(errno));
        buf[i] = '/';
    }
    return 0;
}

static int serve_run(serve_t *s, const char *listen)
{
    char err[512];
    int rc;
    if (listen != NULL) {
        char *host = NULL;
        const char *colon = strrchr(listen, ':');
        char *end = NULL;
        long port = colon ? strtol(colon + 1, &end, 10) : -1;
        if (colon == NULL || colon == listen || *end != '\0' || port < 0 || port > 65535) {
            fprintf(stderr, "kvgw serve: --listen wants HOST:PORT, got '%s'\n", listen);
            return KVGW_EXIT_USAGE;
        }
        host = pc_strndup(listen, (size_t)(colon - listen));
        pc_free(s->cfg.listen_host);
        s->cfg.listen_host = host;
        s->cfg.listen_port = (int)port;
    }
    int lvl = pc_log_level_parse(s->cfg.log_level);
    if (lvl >= 0)
        pc_log_set_level(lvl);
    if (strcmp(s->cfg.access_log, "off") == 0)
        s->access_log = NULL;
    else if (strcmp(s->cfg.access_log, "-") == 0)
        s->access_log = stdout;
    else if ((s->access_log = open_access_log(s->cfg.access_log)) == NULL) {
        fprintf(stderr, "kvgw serve: cannot open the access log %s\n", s->cfg.access_log);
        return KVGW_EXIT_FAIL;
    }
    if (s->cfg.namespace_secret_is_default)
        fprintf(stderr, "kvgw: warning: cache.namespace_secret is the built-in demo secret; set "
                        "it (env:NAME) in a real deployment\n");
    if ((rc = load_models(s, err, sizeof err)) != 0) {
        fprintf(stderr, "kvgw serve: %s\n", err);
        if (rc == PC_ERR_IO)
            fprintf(stderr, "kvgw serve: generate the demo model with bash scripts/models.sh, or "
                            "point models[].path at a GGUF file\n");
        return KVGW_EXIT_FAIL;
    }
    if ((rc = bill_pricing_load(s->cfg.pricing_path, &s->pricing, err, sizeof err)) != 0) {
        fprintf(stderr, "kvgw serve: %s\n", err);
        return KVGW_EXIT_FAIL;
    }
    for (size_t i = 0; i < s->n_models; i++) {
        const bill_price_t *p;
        if (bill_pricing_lookup(s->pricing, s->models[i].cfg->name, pc_time_wall_ms(), &p) != 0)
            fprintf(stderr,
                    "kvgw: warning: %s has no price for model %s: its requests will be "
                    "refused\n",
                    s->cfg.pricing_path, s->models[i].cfg->name);
    }
    if (bill_idgen_init(&s->idgen) != 0) {
        fprintf(stderr, "kvgw serve: no random source for event ids\n");
        return KVGW_EXIT_FAIL;
    }
    if (mkdir_parents(s->cfg.ledger_dir, err, sizeof err) != 0) {
        fprintf(stderr, "kvgw serve: billing.ledger_dir: %s\n", err);
        return KVGW_EXIT_FAIL;
    }
    uv_async_init(s->loop, &s->ledger_wake, on_ledger_wake);
    s->ledger_wake.data = s;
    bill_ledger_params_t lp = bill_ledger_params_default();
    lp.dir = s->cfg.ledger_dir;
    lp.fsync = s->cfg.fsync == GW_FSYNC_ALWAYS  ? BILL_FSYNC_ALWAYS
               : s->cfg.fsync == GW_FSYNC_BATCH ? BILL_FSYNC_BATCH
                                                : BILL_FSYNC_OFF;
    lp.batch_window_us = s->cfg.fsync_batch_us;
    lp.segment_bytes = s->cfg.segment_bytes;
    lp.open_check = s->cfg.ledger_full_check ? BILL_OPEN_CHECK_FULL : BILL_OPEN_CHECK_INDEX;
    lp.instance = s->cfg.instance_id;
    lp.wake = ledger_wake_fn;
    lp.wake_ud = &s->ledger_wake;
    if ((rc = bill_ledger_open(&lp, &s->ledger, err, sizeof err)) != 0) {
        fprintf(stderr, "kvgw serve: ledger: %s\n", err);
        return KVGW_EXIT_FAIL;
    }
    if (s->cfg.redis_host != NULL) {
        bill_shipper_params_t sp = bill_shipper_params_default();
        sp.ledger_dir = s->cfg.ledger_dir;
        sp.instance = s->cfg.instance_id;
        sp.host = s->cfg.redis_host;
        sp.port = s->cfg.redis_port;
        sp.password = s->cfg.redis_password;
        sp.timeout_ms = s->cfg.redis_timeout_ms;
        sp.durable_seq = shipper_durable;
        sp.durable_ud = s;
        if ((rc = bill_shipper_start(s->loop, &sp, &s->shipper, err, sizeof err)) != 0) {
            fprintf(stderr, "kvgw serve: redis shipper: %s\n", err);
            return KVGW_EXIT_FAIL;
        }
    }
    gw_cindex_params_t ip = gw_cindex_params_default();
    ip.max_tokens = s->cfg.cache_max_tokens;
    ip.ttl_ms[GW_CINDEX_TTL_5M] = s->cfg.ttl_5m_ms;
    ip.ttl_ms[GW_CINDEX_TTL_1H] = s->cfg.ttl_1h_ms;
    ip.on_drop = on_entry_drop;
    ip.ud = s;
    if ((rc = gw_cindex_init(&ip, &s->ix)) != 0) {
        fprintf(stderr, "kvgw serve: cache index: %s\n", pc_strerror(rc));
        return KVGW_EXIT_FAIL;
    }
    gw_router_params_t rp = gw_router_params_default();
    gw_router_init(&s->router, &rp);
    setup_metrics(s);
    gw_pool_cbs_t cbs = {pool_event, pool_state};
    if ((rc = gw_pool_init(s->loop, &s->cfg, &cbs, s, &s->pool, err, sizeof err)) != 0) {
        fprintf(stderr, "kvgw serve: workers: %s\n", err);
        return KVGW_EXIT_FAIL;
    }
    gw_http_params_t hp = gw_http_params_default();
    hp.host = s->cfg.listen_host;
    hp.port = s->cfg.listen_port;
    hp.max_header_bytes = s->cfg.max_header_bytes;
    hp.max_headers = s->cfg.max_headers;
    hp.max_body_bytes = s->cfg.max_body_bytes;
    hp.header_timeout_ms = s->cfg.header_timeout_ms;
    hp.body_timeout_ms = s->cfg.body_timeout_ms;
    hp.idle_timeout_ms = s->cfg.idle_timeout_ms;
    hp.max_connections = s->cfg.max_connections;
    hp.stream_high_water = s->cfg.stream_high_water;
    hp.on_request = on_request;
    hp.format_error = format_http_error;
    hp.ud = s;
    if ((rc = gw_http_server_init(s->loop, &hp, &s->http, err, sizeof err)) != 0) {
        fprintf(stderr, "kvgw serve: %s\n", err);
        return KVGW_EXIT_FAIL;
    }
    uv_timer_init(s->loop, &s->tick);
    s->tick.data = s;
    uv_timer_start(&s->tick, on_tick, TICK_MS, TICK_MS);
    uv_signal_init(s->loop, &s->sig_int);
    uv_signal_init(s->loop, &s->sig_term);
    s->sig_int.data = s->sig_term.data = s;
    uv_signal_start(&s->sig_int, on_signal, SIGINT);
    uv_signal_start(&s->sig_term, on_signal, SIGTERM);
    uv_signal_init(s->loop, &s->sig_hup);
    s->sig_hup.data = s;
    uv_signal_start(&s->sig_hup, on_sighup, SIGHUP);
    s->last_storage_ms = pc_time_wall_ms();

    int port = gw_http_server_port(s->http);
    const char *h = s->cfg.listen_host;
    printf("kvgw %s listening on http://%s:%d (model%s:", KVGW_VERSION, h, port,
           s->n_models > 1 ? "s" : "");
    for (size_t i = 0; i < s->n_models; i++)
        printf(" %s", s->models[i].cfg->name);
    printf(")\n");
    if (s->cfg.n_keys > 0 && strcmp(s->cfg.source, GW_CONFIG_DEFAULT_PATH) == 0) {
        printf("  try:  curl -s http://%s:%d/v1/messages -H 'x-api-key: sk-kvgw-demo' "
               "-H 'anthropic-version: 2023-06-01' -H 'content-type: application/json' "
               "-d '{\"model\":\"%s\",\"max_tokens\":32,\"messages\":[{\"role\":\"user\","
               "\"content\":\"Hello\"}]}'\n",
               h, port, s->models[0].cfg->name);
        printf("  SDKs: Anthropic baseURL http://%s:%d (apiKey sk-kvgw-demo); OpenAI baseURL "
               "http://%s:%d/v1\n",
               h, port, h, port);
    }
    printf("  metrics: http://%s:%d/metrics   Ctrl-C stops it cleanly\n", h, port);
    fflush(stdout);

    uv_run(s->loop, UV_RUN_DEFAULT);
    return s->exit_code;
}

/* libuv's thread pool parses and tokenizes requests, streams usage exports and resolves worker
 * host names. Its default of 4 threads would cap a large machine at 4 cores of request work,
 * and a DNS server that does not answer holds a thread for the resolver's whole timeout: unless
 * the operator set UV_THREADPOOL_SIZE, use one thread per online CPU plus 4. It must be set
 * before the pool's first use, which is why this runs first. */
static void size_threadpool(void)
{
    if (getenv("UV_THREADPOOL_SIZE") != NULL)
        return;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    n = (n < 1 ? 1 : n) + 4;
    char v[16];
    snprintf(v, sizeof v, "%ld", n > 1024 ? 1024 : n);
    setenv("UV_THREADPOOL_SIZE", v, 0);
}

int kvgw_cmd_serve(int argc, char **argv)
{
    size_threadpool();
    const char *config_path = NULL, *listen = NULL;
    static const struct option opts[] = {{"config", required_argument, NULL, 'c'},
                                         {"listen", required_argument, NULL, 'l'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:l:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            config_path = optarg;
            break;
        case 'l':
            listen = optarg;
            break;
        case 'h':
            usage_line(stdout);
            printf("\nRuns the gateway. Without --config it reads %s when that file exists, else "
                   "the built-in\ndefault (the same settings). SIGINT/SIGTERM stop it gracefully: "
                   "no new requests,\nin-flight ones finish (limits.shutdown_grace), the ledger "
                   "is flushed, exit 0.\nSIGHUP reopens the access log file (for log "
                   "rotation).\n",
                   GW_CONFIG_DEFAULT_PATH);
            return KVGW_EXIT_OK;
        default:
            usage_line(stderr);
            return KVGW_EXIT_USAGE;
        }
    }
    if (optind != argc) {
        usage_line(stderr);
        return KVGW_EXIT_USAGE;
    }
    serve_t *s = pc_calloc(1, sizeof *s);
    char err[512];
    int rc;
    if (config_path == NULL && access(GW_CONFIG_DEFAULT_PATH, R_OK) == 0)
        config_path = GW_CONFIG_DEFAULT_PATH;
    rc = config_path ? gw_config_load(config_path, &s->cfg, err, sizeof err)
                     : gw_config_default(&s->cfg);
    if (rc != 0) {
        fprintf(stderr, "kvgw serve: %s\n", config_path ? err : pc_strerror(rc));
        pc_free(s);
        return KVGW_EXIT_FAIL;
    }
    uv_loop_t loop;
    uv_loop_init(&loop);
    s->loop = &loop;
    int code = serve_run(s, listen);

    /* Teardown: the HTTP server is closed (or never opened); stop the workers, flush the
     * ledger with a final storage window, close every handle. */
    if (s->ix && s->ledger && s->pricing)
        meter_storage(s);
    if (s->pool)
        gw_pool_shutdown(s->pool, NULL, NULL);
    if (s->shipper) { /* it resumes from its cursor in Redis at the next start */
        bill_shipper_stop(s->shipper, NULL, NULL);
        s->shipper = NULL;
    }
    if (s->ledger) {
        int lrc = bill_ledger_close(s->ledger);
        s->ledger = NULL;
        if (lrc != 0) {
            fprintf(stderr, "kvgw: ledger: records not durable at exit: %s\n", pc_strerror(lrc));
            code = KVGW_EXIT_FAIL;
        }
    }
    /* The server first (after its shutdown it frees at once; otherwise it closes its own
     * handles), then every handle left (timers, signals, asyncs). */
    gw_http_server_free(s->http);
    uv_run(&loop, UV_RUN_NOWAIT);
    uv_walk(&loop, on_walk_close, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    gw_pool_free(s->pool);
    gw_cindex_free(s->ix);
    bill_pricing_free(s->pricing);
    gw_metrics_free(s->m);
    for (size_t i = 0; i < s->n_models; i++) {
        eng_tokcache_free(s->models[i].tokcache);
        eng_render_free(s->models[i].render);
        eng_tok_free(s->models[i].tok);
    }
    if (s->access_log && s->access_log != stdout)
        fclose(s->access_log);
    uv_loop_close(&loop);
    gw_config_free(&s->cfg);
    pc_free(s->ns_tab);
    pc_free(s);
    if (code == 0)
        fprintf(stderr, "kvgw: stopped cleanly\n");
    return code;
}
