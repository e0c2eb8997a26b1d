/*
 * request.c — the request object (request.h): its body, lifecycle, worker events, responses,
 * billing and the durability wait.
 */
#include "request.h"

#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "outcome.h"

/* ---- states ------------------------------------------------------------------------------ */

static const char *const state_names[] = {"NEW",       "PREPARING", "RUNNING", "DURABLE",
                                          "EXPORTING", "DONE",      "CLAIMING"};

/* allowed[from] has bit `to` set for each edge of the diagram in request.h. */
#define B(x) (1u << (x))
static const unsigned allowed[] = {
    [GW_REQ_NEW] = B(GW_REQ_PREPARING) | B(GW_REQ_EXPORTING) | B(GW_REQ_DONE),
    [GW_REQ_PREPARING] = B(GW_REQ_RUNNING) | B(GW_REQ_CLAIMING) | B(GW_REQ_DONE),
    [GW_REQ_RUNNING] = B(GW_REQ_RUNNING) | B(GW_REQ_DURABLE) | B(GW_REQ_DONE),
    [GW_REQ_DURABLE] = B(GW_REQ_DONE),
    [GW_REQ_EXPORTING] = B(GW_REQ_DONE),
    [GW_REQ_DONE] = 0,
    [GW_REQ_CLAIMING] = B(GW_REQ_RUNNING) | B(GW_REQ_DONE),
};
#undef B

void gw__req_set_state(gw_req_t *q, gw_req_state_t to)
{
    if (!(allowed[q->state] & (1u << to)))
        PC_ABORT("request %s: no transition %s -> %s", q->id, state_names[q->state],
                 state_names[to]);
    q->state = to;
}

/* ---- per-API operations ------------------------------------------------------------------ */

static int a_start(gw_req_t *q, const gw_api_resp_t *r, pc_buf_t *b)
{
    gw_anthropic_sse_init(&q->asse);
    return gw_anthropic_sse_start(&q->asse, r, b);
}
static int a_text(gw_req_t *q, const gw_api_resp_t *r, const char *t, size_t n, pc_buf_t *b)
{
    (void)r;
    return gw_anthropic_sse_text(&q->asse, t, n, b);
}
static int a_finish(gw_req_t *q, const gw_api_resp_t *r, pc_buf_t *b)
{
    q->asse_pre = q->asse;
    return gw_anthropic_sse_finish(&q->asse, r, b);
}
static int a_error(gw_req_t *q, bool pre, const gw_api_error_t *e, pc_buf_t *b)
{
    return gw_anthropic_sse_error(pre ? &q->asse_pre : &q->asse, e, b);
}
static int o_start(gw_req_t *q, const gw_api_resp_t *r, pc_buf_t *b)
{
    gw_openai_sse_init(&q->osse, q->api->include_usage);
    return gw_openai_sse_start(&q->osse, r, b);
}
static int o_text(gw_req_t *q, const gw_api_resp_t *r, const char *t, size_t n, pc_buf_t *b)
{
    return gw_openai_sse_text(&q->osse, r, t, n, b);
}
static int o_finish(gw_req_t *q, const gw_api_resp_t *r, pc_buf_t *b)
{
    q->osse_pre = q->osse;
    return gw_openai_sse_finish(&q->osse, r, b);
}
static int o_error(gw_req_t *q, bool pre, const gw_api_error_t *e, pc_buf_t *b)
{
    return gw_openai_sse_error(pre ? &q->osse_pre : &q->osse, e, b);
}

static const gw_req_ops_t ops_messages = {GW_API_ANTHROPIC_MESSAGES,
                                          "messages",
                                          GW_API_ANTHROPIC_MESSAGES,
                                          "msg_",
                                          a_start,
                                          a_text,
                                          a_finish,
                                          a_error,
                                          gw_anthropic_message_render};
static const gw_req_ops_t ops_count_tokens = {GW_API_ANTHROPIC_COUNT_TOKENS,
                                              "count_tokens",
                                              GW_API_ANTHROPIC_MESSAGES,
                                              NULL,
                                              NULL,
                                              NULL,
                                              NULL,
                                              NULL,
                                              NULL};
static const gw_req_ops_t ops_chat = {GW_API_OPENAI_CHAT,
                                      "chat_completions",
                                      GW_API_OPENAI_CHAT,
                                      "chatcmpl-",
                                      o_start,
                                      o_text,
                                      o_finish,
                                      o_error,
                                      gw_openai_completion_render};

static const gw_req_ops_t *ops_for(gw_api_kind_t k)
{
    return k == GW_API_OPENAI_CHAT              ? &ops_chat
           : k == GW_API_ANTHROPIC_COUNT_TOKENS ? &ops_count_tokens
                                                : &ops_messages;
}

/* ---- small helpers ----------------------------------------------------------------------- */

static void hex_id(char *out, size_t cap, const char *prefix)
{
    uint8_t b[12];
    randombytes_buf(b, sizeof b);
    size_t k = (size_t)snprintf(out, cap, "%s", prefix);
    for (size_t i = 0; i < sizeof b && k + 2 < cap; i++, k += 2)
        snprintf(out + k, cap - k, "%02x", b[i]);
}

gw_req_t *gw__req_new(serve_t *s, gw_http_req_t *r)
{
    gw_req_t *q = pc_calloc(1, sizeof *q);
    if (q == NULL)
        return NULL;
    q->s = s;
    q->http = r;
    q->state = GW_REQ_NEW;
    q->t0_ms = gw_http_req_start_ms(r);
    q->wall0_ms = pc_time_wall_ms();
    pc_arena_init(&q->arena, 64u << 10);
    hex_id(q->id, sizeof q->id, "req_");
    const char *path = gw_http_req_path(r);
    q->kind = strncmp(path, "/v1/chat/", 9) == 0 ? GW_API_OPENAI_CHAT : GW_API_ANTHROPIC_MESSAGES;
    q->endpoint = "other";
    gw_http_req_set_data(r, q);
    return q;
}

/* ---- the live requests ------------------------------------------------------------------- */

static void live_add(gw_req_t *q)
{
    serve_t *s = q->s;
    q->next_live = s->live;
    if (s->live)
        s->live->prev_live = q;
    s->live = q;
    q->prev_live = NULL;
}

/* The request in the live map, if q is there: removed from the map and the list. */
static void live_remove(gw_req_t *q)
{
    serve_t *s = q->s;
    if (q->wire_id != 0 && pc_u64map_get(&s->live_map, q->wire_id) == q)
        pc_u64map_del(&s->live_map, q->wire_id);
    if (q->prev_live)
        q->prev_live->next_live = q->next_live;
    else if (s->live == q)
        s->live = q->next_live;
    if (q->next_live)
        q->next_live->prev_live = q->prev_live;
    q->next_live = q->prev_live = NULL;
}

static gw_req_t *find_live(serve_t *s, uint64_t wire_id)
{
    return pc_u64map_get(&s->live_map, wire_id);
}

/* Our claims of a request that ends without having written its entries (it failed or was
 * cancelled before its first token, or never reached a worker): released, so that another
 * request may write them now instead of after claim_ttl. */
static void release_claims(gw_req_t *q)
{
    if (q->fence == 0 || q->n_mine == 0 || q->s->reg == NULL)
        return;
    int rc = gw_registry_release(q->s->reg, q->ns, q->r.tokens, q->mine, q->n_mine, q->fence);
    if (rc < 0)
        PC_LOG(PC_LOG_WARN, "registry", "request %s: claims not released (%s): they expire", q->id,
               pc_strerror(rc));
    q->fence = 0;
    q->n_mine = 0;
}

void gw__req_free(gw_req_t *q)
{
    serve_t *s = q->s;
    gw__req_set_state(q, GW_REQ_DONE);
    if (q->client_gone) /* logged now, with the usage the worker reported */
        gw__obs_count_request(q, 499);
    release_claims(q);
    live_remove(q);
    pc_buf_free(&q->text);
    pc_buf_free(&q->pending);
    pc_buf_free(&q->final);
    if (q->body.len >= GW_OBS_LARGE_BODY)
        s->freed_large += q->body.len;
    pc_free((void *)q->body.base);
    pc_arena_close(&q->arena);
    pc_free(q);
    if (s->http_closed && s->live == NULL && s->durable_head == NULL && s->n_claiming == 0)
        uv_stop(s->loop);
}

/* ---- responses --------------------------------------------------------------------------- */

/* Headers every API response carries. */
static size_t std_headers(gw_req_t *q, gw_http_header_t *h, const char *ctype)
{
    size_t n = 0;
    h[n++] = (gw_http_header_t){"content-type", ctype};
    h[n++] = (gw_http_header_t){"request-id", q->id};
    if (q->kind == GW_API_OPENAI_CHAT)
        h[n++] = (gw_http_header_t){"x-request-id", q->id};
    if (q->cache_hdr[0])
        h[n++] = (gw_http_header_t){"kvgw-cache", q->cache_hdr};
    if (q->routed)
        h[n++] = (gw_http_header_t){"kvgw-worker", gw_pool_worker(q->s->pool, q->worker)->name};
    return n;
}

void gw__req_respond(gw_req_t *q, int status, const char *ctype, const void *body, size_t len)
{
    if (q->http == NULL)
        return;
    gw_http_header_t h[10];
    size_t n = std_headers(q, h, ctype);
    gw_http_req_on_abort(q->http, NULL);
    gw_http_req_on_drain(q->http, NULL);
    gw__obs_count_request(q, status); /* logged before the client can see the end */
    gw_http_respond(q->http, status, h, n, body, len);
    q->http = NULL;
}

void gw__req_respond_error(gw_req_t *q, const gw_api_error_t *e)
{
    pc_buf_t b = {0};
    gw_api_kind_t k =
        q->kind == GW_API_ANTHROPIC_COUNT_TOKENS ? GW_API_ANTHROPIC_MESSAGES : q->kind;
    if (gw_api_error_render(k, e, q->id, &b) != 0) {
        gw__obs_internal_error(q->s, "error_render", "request %s: error body not rendered", q->id);
        b.len = 0;
    }
    gw__req_respond(q, e->status, "application/json", b.base ? b.base : "", b.len);
    pc_buf_free(&b);
}

void gw__req_respond_errorf(gw_req_t *q, int status, const char *fmt, const char *arg)
{
    gw_api_error_t e;
    gw_api_error_set(&e, q->kind, status, fmt, arg);
    gw__req_respond_error(q, &e);
}

/* The output could not be kept or sent (out of memory): the answer is truncated. The tokens
 * already handed to the client are what is billed; the worker stops; the response ends with an
 * error (request_done). */
static void output_failed(gw_req_t *q, const char *site, int rc)
{
    if (q->out_failed)
        return;
    q->out_failed = true;
    gw__obs_internal_error(q->s, site, "request %s: output lost after %u tokens (%s): truncated",
                           q->id, q->n_tokens_delivered, pc_strerror(rc));
    if (q->state == GW_REQ_RUNNING)
        gw_pool_cancel(q->s->pool, q->worker, q->wire_id);
}

/* Writes SSE bytes, holding them back while the client does not read (bounded: at most one
 * response's worth of output, which max_tokens bounds). Returns 0 or PC_ERR_NOMEM. */
static int stream_out(gw_req_t *q, const pc_buf_t *b)
{
    if (q->http == NULL || b->len == 0)
        return 0;
    if (q->pending.len > 0 || gw_http_stream_queued(q->http) >= q->s->cfg.stream_high_water)
        return pc_buf_append(&q->pending, b->base, b->len) == 0 ? 0 : PC_ERR_NOMEM;
    /* Other failures close the connection: the abort path bills what was produced. */
    return gw_http_stream_write(q->http, b->base, b->len) == PC_ERR_NOMEM ? PC_ERR_NOMEM : 0;
}

static void on_drain(gw_http_req_t *r, void *data)
{
    gw_req_t *q = data;
    (void)r;
    if (q->pending.len == 0 || q->http == NULL)
        return;
    if (gw_http_stream_write(q->http, q->pending.base, q->pending.len) == PC_ERR_NOMEM)
        output_failed(q, "stream_write", PC_ERR_NOMEM);
    q->pending.len = 0;
}

/* ---- the cache header -------------------------------------------------------------------- */

/* Where token offset `at` falls in the request: "messages.2.content.0+17", "system.0+3",
 * "tools.1+0", or "generation+N" past the last element. */
static void locate(const gw_req_t *q, uint32_t at, char *out, size_t cap)
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

/* The kvgw-cache header: the routing decision's part once routed, and where the worker found
 * the prompt's KV (worker_tiers) once its PREFILL arrived; the head is not sent before that
 * (start_stream waits for it, a whole response waits for its end). */
static void make_cache_header(gw_req_t *q)
{
    uint32_t writes = q->usage.cache_write_5m + q->usage.cache_write_1h;
    size_t cap = sizeof q->cache_hdr;
    int k = snprintf(q->cache_hdr, cap,
                     "outcome=%s; read=%u; write=%u; prompt=%u; matched=%u; worker_cached=%u",
                     gw_outcome_name((gw_outcome_t)q->outcome), q->read_tokens, writes,
                     q->plan.n_prompt, q->path_tokens, q->phys_tokens);
    if (q->path_tokens < q->plan.n_prompt && k > 0 && (size_t)k < cap) {
        char where[96];
        locate(q, q->path_tokens, where, sizeof where);
        k += snprintf(q->cache_hdr + k, cap - (size_t)k, "; diverged=%s", where);
    }
    if (q->registry != BILL_REGISTRY_NONE && k > 0 && (size_t)k < cap)
        k += snprintf(q->cache_hdr + k, cap - (size_t)k, "; registry=%s",
                      bill_registry_name(q->registry));
    if (q->has_prefill && k > 0 && (size_t)k < cap) {
        const eng_wire_prefill_t *p = &q->prefill;
        snprintf(q->cache_hdr + k, cap - (size_t)k, "; worker_tiers=g1:%u,g2:%u,g3:%u,recompute:%u",
                 p->tokens_g1, p->tokens_g2, p->tokens_g3, p->tokens_recomputed);
    }
}

/* ---- billing ----------------------------------------------------------------------------- */

static int bill_request(gw_req_t *q, int status)
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
    ev.registry = q->registry;
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
static void finish_response(gw_req_t *q)
{
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
            gw__obs_count_request(q, 200);
            gw_http_stream_end(q->http);
            q->http = NULL;
        } else {
            gw__req_respond(q, q->final_status, "application/json",
                            q->final.base ? q->final.base : "", q->final.len);
        }
    }
    gw__req_free(q);
}

/* Queues q until its usage event is durable (or finishes it now when nothing waits). */
static void wait_durable(gw_req_t *q)
{
    serve_t *s = q->s;
    live_remove(q);
    if (bill_ledger_durable_seq(s->ledger) >= q->ledger_seq && s->durable_head == NULL) {
        finish_response(q);
        return;
    }
    gw__req_set_state(q, GW_REQ_DURABLE);
    q->next_durable = NULL;
    if (s->durable_tail)
        s->durable_tail->next_durable = q;
    else
        s->durable_head = q;
    s->durable_tail = q;
}

/* Renders e as q's final bytes: an error event when the stream started, else an error body. */
static void final_error(gw_req_t *q, bool pre, const gw_api_error_t *e)
{
    q->final.len = 0;
    int rc;
    if (q->streaming_started) {
        rc = q->ops->sse_error(q, pre, e, &q->final);
        q->final_is_stream = true;
    } else {
        rc = gw_api_error_render(q->ops->err_kind, e, q->id, &q->final);
        q->final_status = e->status;
    }
    if (rc != 0) /* the response still ends (without its error event or body) */
        gw__obs_internal_error(q->s, "error_render", "request %s: error not rendered: %s", q->id,
                               pc_strerror(rc));
}

/* q's usage event cannot become durable: replace the held final bytes with an error. */
static void fail_undurable(gw_req_t *q)
{
    gw_api_error_t e;
    gw_api_error_set(&e, q->kind, 503,
                     "the usage of this request could not be recorded (billing ledger: %s); "
                     "the response is withheld",
                     pc_strerror(bill_ledger_status(q->s->ledger)));
    final_error(q, true, &e);
    PC_LOG(PC_LOG_ERROR, "billing", "request %s: usage event not durable: %s", q->id,
           pc_strerror(bill_ledger_status(q->s->ledger)));
    finish_response(q);
}

void gw__req_on_ledger_wake(uv_async_t *a)
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
            gw_req_t *q = s->durable_head;
            s->durable_head = q->next_durable;
            if (s->durable_head == NULL)
                s->durable_tail = NULL;
            fail_undurable(q);
        }
    }
    while (s->durable_head && s->durable_head->ledger_seq <= durable) {
        gw_req_t *q = s->durable_head;
        s->durable_head = q->next_durable;
        if (s->durable_head == NULL)
            s->durable_tail = NULL;
        finish_response(q);
    }
}

/* ---- request end ------------------------------------------------------------------------- */

static gw_api_resp_t resp_of(gw_req_t *q)
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

/* The entries q wrote new (fresh[0..n): claimed by q, or new in the replica), now in Redis for
 * every gateway: written with our claims' fence (the claims go), or with fence 0 after a local
 * decision. An entry q only extended is not committed: it was a read, refreshed in Redis by the
 * decision's `read` (a cached read costs one op, a write two: claim and commit). Claims we hold
 * on points that were not written are released. Fire-and-forget (queued through an outage,
 * replayed). */
static void commit_entries(gw_req_t *q, const gw_cache_bp_t *fresh, size_t n)
{
    serve_t *s = q->s;
    gw_registry_point_t pts[GW_CACHEPLAN_MAX_BPS];
    for (size_t i = 0; i < n; i++)
        pts[i] = (gw_registry_point_t){
            fresh[i].n_tokens,
            fresh[i].ttl == ENG_CHAT_TTL_1H ? GW_CINDEX_TTL_1H : GW_CINDEX_TTL_5M, true};
    char wid[GW_REGISTRY_NAME_MAX + 1];
    int rc = 0;
    if (n > 0)
        rc = gw_registry_commit(s->reg, q->ns, q->key->tenant, q->model->cfg->name, q->r.tokens,
                                pts, n, q->fence, q->wall0_ms,
                                gw__serve_worker_id(s, q->worker, wid, sizeof wid));
    if (rc < 0)
        gw__obs_internal_error(s, "registry_commit",
                               "request %s: %zu cache entries not sent to the registry: %s", q->id,
                               n, pc_strerror(rc));
    /* What the commit covered is no longer ours to release; the rest is. */
    uint32_t left = 0;
    for (uint32_t i = 0; i < q->n_mine; i++) {
        bool written = false;
        for (size_t j = 0; j < n && !written; j++)
            written = rc == 0 && pts[j].n_tokens == q->mine[i].n_tokens;
        if (!written)
            q->mine[left++] = q->mine[i];
    }
    q->n_mine = left;
    release_claims(q);
}

static bool is_mine(const gw_req_t *q, uint32_t n_tokens)
{
    for (uint32_t i = 0; i < q->n_mine; i++)
        if (q->mine[i].n_tokens == n_tokens)
            return true;
    return false;
}

/* Inserts the plan's entries once the prompt's prefill is done (readable by others now). An
 * entry that could not be written is not billed as a write: its tokens are billed as uncached
 * input (the usage is recomputed from the entries that exist). */
static void insert_entries(gw_req_t *q)
{
    if (q->entries_inserted)
        return;
    q->entries_inserted = true;
    serve_t *s = q->s;
    uint64_t now = pc_time_mono_ms();
    /* One walk down the prompt for all of the plan's entries (gw_cindex_insert_path), at most
     * GW_CACHEPLAN_MAX_BPS of them (the plan's cap). TTL runs from the start of the request
     * (api-spec §1.7). The namespace is counted once per entry first: an entry never exists
     * without its owner's record (storage billing), even for the moment an insert's eviction
     * reports it dropped. */
    gw_cindex_point_t pts[GW_CACHEPLAN_MAX_BPS];
    int res[GW_CACHEPLAN_MAX_BPS];
    size_t n = PC_MIN(q->plan.n_bps, (size_t)GW_CACHEPLAN_MAX_BPS);
    size_t n_ref = 0;
    int rc = 0;
    while (n_ref < n && (rc = gw_ns_tab_ref(&s->ns, q->ns, q->key->tenant, q->model->index)) == 0)
        n_ref++;
    for (size_t i = 0; i < n; i++) {
        const gw_cache_bp_t *bp = &q->plan.bps[i];
        pts[i] = (gw_cindex_point_t){bp->n_tokens, bp->ttl == ENG_CHAT_TTL_1H ? GW_CINDEX_TTL_1H
                                                                              : GW_CINDEX_TTL_5M};
        res[i] = rc < 0 ? rc : PC_ERR_NOSPACE; /* not inserted: no namespace record */
    }
    if (n_ref > 0)
        gw_cindex_insert_path(s->ix, q->ns, q->r.tokens, pts, n_ref, q->t0_ms, now, res);
    gw_cache_bp_t kept[GW_CACHEPLAN_MAX_BPS], fresh[GW_CACHEPLAN_MAX_BPS];
    size_t n_kept = 0, n_fresh = 0;
    for (size_t i = 0; i < n; i++) {
        /* 0: new (keeps its count); 1: extended (already counted), 2: nothing written, < 0:
         * failed (those three give their count back) */
        if (i < n_ref && res[i] != 0)
            gw_ns_tab_unref(&s->ns, q->ns);
        if (res[i] < 0)
            gw__obs_internal_error(s, "cindex_insert",
                                   "request %s: cache entry of %u tokens not written: %s", q->id,
                                   pts[i].n_tokens, pc_strerror(res[i]));
        if (res[i] >= 0 && res[i] != 2) {
            kept[n_kept++] = q->plan.bps[i];
            if (res[i] == 0 || is_mine(q, q->plan.bps[i].n_tokens))
                fresh[n_fresh++] = q->plan.bps[i];
        }
    }
    if (n_kept < q->plan.n_bps) {
        gw_cacheplan_t p = q->plan;
        p.bps = kept;
        p.n_bps = n_kept;
        gw_usage_compute(&p, (uint32_t)q->r.n_tokens, q->read_tokens, &q->usage);
    }
    /* The worker that prefilled the prompt holds its KV. */
    if (n_kept > 0 || q->read_tokens > 0)
        gw_cindex_owner_add(s->ix, q->ns, q->r.tokens, q->r.n_tokens, q->worker, NULL);
    if (s->reg != NULL)
        commit_entries(q, fresh, n_fresh);
}

/* The worker finished q (DONE), failed it (ERROR, worker down) or it was cancelled. */
static void request_done(gw_req_t *q, int bill_status, const gw_api_error_t *fail)
{
    gw_api_error_t trunc;
    q->usage.output_tokens = q->n_tokens_out;
    if (q->out_failed) {
        /* Truncated by a failed append: bill what reached the client, end with an error. */
        q->usage.output_tokens = q->n_tokens_delivered;
        bill_status = BILL_STATUS_FAILED;
        if (fail == NULL) {
            gw_api_error_set(&trunc, q->kind, 500,
                             "the response could not be completed (out of memory after %u "
                             "output tokens); only those are billed",
                             q->n_tokens_delivered);
            fail = &trunc;
        }
    }
    if (bill_status == BILL_STATUS_FAILED && q->t_first_ms == 0 && !q->entries_inserted) {
        /* Nothing was computed that the client can use: only what was produced is billed. */
        q->usage = (gw_usage_t){0};
    }
    int brc = bill_request(q, bill_status);
    gw_api_resp_t r = resp_of(q);
    q->final.len = 0;
    live_remove(q);
    if (q->http == NULL) {
        /* The client is gone: the event is written, nothing to send. */
        gw__req_free(q);
        return;
    }
    if (brc != 0 && fail == NULL) {
        gw_api_error_t e;
        gw_api_error_set(&e, q->kind, 500,
                         "the usage of this request could not be recorded; it is not billed");
        final_error(q, false, &e);
        finish_response(q);
        return;
    }
    int rc = 0;
    if (fail != NULL) {
        final_error(q, false, fail);
    } else if (q->api->stream) {
        rc = q->ops->sse_finish(q, &r, &q->final);
        q->final_is_stream = true;
    } else {
        rc = q->ops->render(&r, &q->final);
        q->final_status = 200;
    }
    if (rc != 0) {
        gw__obs_internal_error(q->s, "response_render", "request %s: response not rendered: %s",
                               q->id, pc_strerror(rc));
        gw_api_error_t e;
        gw_api_error_set(&e, q->kind, 500, "the response could not be rendered (%s)",
                         pc_strerror(rc));
        final_error(q, false, &e);
    }
    if (brc != 0) {
        finish_response(q);
        return;
    }
    wait_durable(q);
}

/* ---- worker events ----------------------------------------------------------------------- */

static void start_stream(gw_req_t *q)
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
    int rc = q->ops->sse_start(q, &r, &b);
    if (rc == 0)
        rc = stream_out(q, &b);
    if (rc != 0)
        output_failed(q, "stream_start", rc);
    pc_buf_free(&b);
}

/* Appends the output text of n_tokens tokens. On failure the answer is truncated before them. */
static void on_text(gw_req_t *q, const char *text, size_t len, uint32_t n_tokens)
{
    if (q->out_failed)
        return;
    int rc = 0;
    if (len == 0) {
    } else if (!q->api->stream) {
        if (pc_buf_append(&q->text, text, len) != 0) {
            output_failed(q, "output_append", PC_ERR_NOMEM);
            return;
        }
    } else {
        pc_buf_t b = {0};
        gw_api_resp_t r = resp_of(q);
        rc = q->ops->sse_text(q, &r, text, len, &b);
        if (rc == 0)
            rc = stream_out(q, &b);
        pc_buf_free(&b);
        if (rc != 0) {
            output_failed(q, "stream_out", rc);
            return;
        }
    }
    q->n_tokens_delivered += n_tokens;
}

static void first_token(gw_req_t *q)
{
    if (q->t_first_ms)
        return;
    q->t_first_ms = pc_time_mono_ms();
    const char *lv[] = {gw_outcome_name((gw_outcome_t)q->outcome)};
    gw_metric_observe(q->s->m_ttft, lv, (double)(q->t_first_ms - q->t0_ms) / 1000.0);
    insert_entries(q);
}

static void route_and_submit(gw_req_t *q);

void gw__req_pool_event(void *ud, uint32_t worker, const eng_wire_frame_t *ev)
{
    serve_t *s = ud;
    switch (ev->type) {
    case ENG_WIRE_TOKEN: {
        gw_req_t *q = find_live(s, ev->u.token.request_id);
        if (q == NULL)
            return;
        first_token(q);
        start_stream(q);
        q->n_tokens_out++;
        on_text(q, ev->u.token.text.base, ev->u.token.text.len, 1);
        return;
    }
    case ENG_WIRE_DONE: {
        gw_req_t *q = find_live(s, ev->u.done.request_id);
        if (q == NULL)
            return;
        const eng_wire_done_t *d = &ev->u.done;
        first_token(q);
        start_stream(q);
        uint32_t n_more =
            d->usage.output_tokens > q->n_tokens_out ? d->usage.output_tokens - q->n_tokens_out : 0;
        on_text(q, d->text.base, d->text.len, n_more);
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
        gw_req_t *q = find_live(s, ev->u.error.request_id);
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
    case ENG_WIRE_PREFILL: {
        /* Where the prompt's KV came from: the kvgw-cache header's worker_tiers, and the head
         * of a stream, which waited for it. */
        const eng_wire_prefill_t *pf = &ev->u.prefill;
        gw_req_t *q = find_live(s, pf->request_id);
        if (q == NULL)
            return;
        q->prefill = *pf;
        q->has_prefill = true;
        make_cache_header(q);
        gw__obs_count_prefill(s, worker, pf);
        start_stream(q);
        return;
    }
    case ENG_WIRE_SNAPSHOT: {
        /* After a (re)connect the worker lists what it holds pinned (tier 1) and, after a
         * restart, what it kept only in a lower tier (its disk): it owns those again. */
        const eng_wire_snapshot_t *sn = &ev->u.snapshot;
        uint32_t bt = gw_pool_worker(s->pool, worker)->block_tokens;
        for (uint32_t i = 0; i < sn->n_entries; i++) {
            const eng_wire_snap_entry_t *e = &sn->entries[i];
            gw_cindex_tier_t tier = e->tier == ENG_WIRE_TIER_G2   ? GW_CINDEX_TIER_G2
                                    : e->tier == ENG_WIRE_TIER_G3 ? GW_CINDEX_TIER_G3
                                                                  : GW_CINDEX_TIER_G1;
            /* A lower tier lists whole blocks: an entry it holds all the blocks of is held. */
            if (gw_cindex_owner_add_tier(s->ix, e->ns, e->tokens, e->n_tokens, worker, tier,
                                         tier == GW_CINDEX_TIER_G1 ? 0 : bt, NULL) == PC_ERR_NOMEM)
                PC_LOG(PC_LOG_WARN, "serve", "worker %u: a snapshot entry in G%d not indexed: %s",
                       worker, (int)tier, pc_strerror(PC_ERR_NOMEM));
        }
        return;
    }
    case ENG_WIRE_KV_EVENT: {
        const eng_wire_kv_event_t *kv = &ev->u.kv;
        if (kv->kind == ENG_WIRE_KV_RETAINED) {
            gw_req_t *q = find_live(s, kv->request_id);
            if (q != NULL && kv->n_tokens <= q->r.n_tokens)
                gw_cindex_owner_add(s->ix, kv->ns, q->r.tokens, kv->n_tokens, worker, NULL);
        } else if (kv->kind == ENG_WIRE_KV_EVICTED && kv->n_path == kv->n_tokens) {
            /* tier 2/3: the part went down a tier and is still held there; 0: gone. A
             * demotion the index has no memory for counts as gone (the router then expects a
             * prefill where a load would do: slower, never wrong). */
            if (kv->tier == ENG_WIRE_TIER_NONE ||
                gw_cindex_owner_demoted(s->ix, worker, kv->ns, kv->tokens, kv->n_kept, kv->n_tokens,
                                        kv->tier) != 0)
                gw_cindex_owner_evicted(s->ix, worker, kv->ns, kv->tokens, kv->n_kept,
                                        kv->n_tokens);
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

void gw__req_pool_state(void *ud, uint32_t worker, bool up, const char *reason)
{
    serve_t *s = ud;
    if (up)
        return;
    gw_cindex_worker_down(s->ix, worker);
    /* Requests on that worker: not started yet -> another worker; streaming -> an error. */
    gw_req_t *next;
    for (gw_req_t *q = s->live; q; q = next) {
        next = q->next_live;
        if (q->worker != worker || q->state != GW_REQ_RUNNING)
            continue;
        if (q->t_first_ms == 0 && q->http != NULL && !q->streaming_started) {
            live_remove(q);
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

/* accounting: anthropic. The lookback's probes answered from the live entries along the
 * prompt, found in one walk of the index (a probe per position as an index walk each would be
 * O(tokens^2) on the loop for a turn of many blocks). */
static uint32_t anthropic_hit(gw_req_t *q, uint64_t now)
{
    uint32_t stack[64];
    uint32_t *lens = stack;
    size_t n = gw_cindex_path_entries(q->s->ix, q->ns, q->r.tokens, q->r.n_tokens, now, lens,
                                      PC_ARRAY_LEN(stack));
    if (n > PC_ARRAY_LEN(stack)) {
        lens = pc_arena_alloc(&q->arena, n * sizeof *lens);
        if (lens == NULL) { /* no hit rather than a wrong one: billed as uncached input */
            gw__obs_internal_error(q->s, "lookback", "request %s: %zu live entries not listed",
                                   q->id, n);
            return 0;
        }
        gw_cindex_path_entries(q->s->ix, q->ns, q->r.tokens, q->r.n_tokens, now, lens, n);
    }
    return gw_cacheplan_anthropic_hit_sorted(&q->plan, lens, n);
}

/* The replica's view of q's prompt at now: the match (m) and the logical hit (q->read_tokens,
 * unless the decision was made already). */
static void local_view(gw_req_t *q, uint64_t now, gw_cindex_match_t *m)
{
    serve_t *s = q->s;
    gw_cindex_match(s->ix, q->ns, q->r.tokens, q->r.n_tokens, now, m);
    q->path_tokens = m->n_matched;
    if (q->decided)
        return;
    q->read_tokens =
        s->cfg.accounting == GW_ACCOUNTING_ANTHROPIC ? anthropic_hit(q, now) : m->n_hit;
    /* A hit shorter than the model's minimum cacheable length (typically the chat template's
     * opening tokens, shared by every prompt of the namespace) is no read: nothing that short
     * is ever written, so it is billed as uncached input. */
    if (q->read_tokens < q->model->cfg->min_cache_tokens)
        q->read_tokens = 0;
}

/* Chooses q's worker (q->worker, q->phys_tokens) from the match. Returns false when it answered q
 * with an error and freed it (too long for every worker, none available). */
static bool pick_worker(gw_req_t *q, const gw_cindex_match_t *m)
{
    serve_t *s = q->s;
    size_t nw = gw_pool_n_workers(s->pool);
    gw_router_worker_t cand[GW_POOL_MAX_WORKERS];
    gw_router_held_t held[GW_POOL_MAX_WORKERS];
    size_t n = 0;
    uint32_t map[GW_POOL_MAX_WORKERS];
    for (uint32_t i = 0; i < nw; i++) {
        const gw_pool_worker_t *w = gw_pool_worker(s->pool, i);
        if (w->model != q->model->index)
            continue;
        gw_router_worker_t *c = &cand[n];
        memset(c, 0, sizeof *c);
        c->up = w->up;
        /* The worker's own queue (its LOAD covers every gateway's requests) and what this
         * gateway sent it since that LOAD. */
        c->queued_prefill_tokens = w->load.queued_prefill_tokens + w->submitted_prefill_tokens;
        c->running_seqs = w->load.running_seqs;
        c->free_blocks = w->load.free_blocks;
        c->total_blocks = w->total_blocks;
        c->prefill_tok_s = w->prefill_tok_s;
        c->decode_ms_per_token = w->decode_ms_per_token;
        c->max_prompt_tokens = w->max_prompt_tokens;
        c->kv_bytes_per_token = w->kv_bytes_per_token;
        c->load_bytes_per_s[0] = w->load.g2.load_bytes_per_s;
        c->load_bytes_per_s[1] = w->load.g3.load_bytes_per_s;
        held[n] = (gw_router_held_t){m->held[i], m->held_g2[i], m->held_g3[i]};
        map[n++] = i;
    }
    /* Too long for every worker of the model, up or down: the client's error (400), decided
     * before routing, which would read it as overloaded (529, and SDKs retry). */
    uint32_t max_prompt = gw_router_max_prompt(cand, n, q->model->n_ctx);
    if (max_prompt != 0 && q->r.n_tokens > max_prompt) {
        gw_api_error_t e;
        gw_api_error_set(&e, q->kind, 400, "prompt is too long: %zu tokens > %u maximum",
                         (size_t)q->r.n_tokens, max_prompt);
        if (q->kind == GW_API_OPENAI_CHAT) {
            e.code = "context_length_exceeded";
            snprintf(e.param, sizeof e.param, "messages");
        }
        gw__req_respond_error(q, &e);
        gw__req_free(q);
        return false;
    }
    gw_router_choice_t ch;
    if (gw_router_pick_held(&s->router, cand, n, (uint32_t)q->r.n_tokens, held, &ch) != 0 ||
        ch.worker < 0) {
        gw_api_error_t e;
        gw_api_error_set(&e, q->kind, 529, "no worker of model %s is available",
                         q->model->cfg->name);
        gw__req_respond_error(q, &e);
        gw__req_free(q);
        return false;
    }
    q->worker = map[ch.worker];
    q->routed = true;
    q->phys_tokens = ch.cached;
    const char *rl[] = {ch.reason};
    gw_metric_add(s->m_routes, rl, 1);
    return true;
}

/* Refreshes in Redis the live entries q reads (fire-and-forget): every entry of the replica
 * that ends within the read, in calls of at most GW_REGISTRY_MAX_POINTS (TTL class 5m: Redis
 * keeps the longer class an entry has). The feed carries the read to the other replicas. */
static void registry_read(gw_req_t *q, uint64_t now)
{
    serve_t *s = q->s;
    uint32_t stack[GW_REGISTRY_MAX_POINTS];
    uint32_t *lens = stack;
    size_t n = gw_cindex_path_entries(s->ix, q->ns, q->r.tokens, q->read_tokens, now, lens,
                                      PC_ARRAY_LEN(stack));
    if (n > PC_ARRAY_LEN(stack)) {
        if ((lens = pc_arena_alloc(&q->arena, n * sizeof *lens)) == NULL) {
            gw__obs_internal_error(s, "registry_read", "request %s: read of %zu entries not sent",
                                   q->id, n);
            return;
        }
        gw_cindex_path_entries(s->ix, q->ns, q->r.tokens, q->read_tokens, now, lens, n);
    }
    uint64_t wall = pc_time_wall_ms();
    for (size_t i = 0; i < n; i += GW_REGISTRY_MAX_POINTS) {
        gw_registry_point_t pts[GW_REGISTRY_MAX_POINTS];
        size_t k = PC_MIN(n - i, (size_t)GW_REGISTRY_MAX_POINTS);
        for (size_t j = 0; j < k; j++)
            pts[j] = (gw_registry_point_t){lens[i + j], GW_CINDEX_TTL_5M, false};
        int rc = gw_registry_read(s->reg, q->ns, q->r.tokens, pts[k - 1].n_tokens, pts, k, wall);
        if (rc < 0)
            gw__obs_internal_error(s, "registry_read", "request %s: read not sent: %s", q->id,
                                   pc_strerror(rc));
    }
}

/* The decision, made once: reads refresh the entries they cover (for free), the usage buckets,
 * the outcome. */
static void decide(gw_req_t *q)
{
    serve_t *s = q->s;
    uint64_t now = pc_time_mono_ms();
    if (q->read_tokens > 0) {
        gw_cindex_read(s->ix, q->ns, q->r.tokens, q->read_tokens, now, NULL);
        if (s->reg != NULL)
            registry_read(q, now);
    }
    gw_usage_compute(&q->plan, (uint32_t)q->r.n_tokens, q->read_tokens, &q->usage);
    q->outcome = (int)gw_outcome_classify(q->usage.cache_read,
                                          q->usage.cache_write_5m + q->usage.cache_write_1h);
    q->has_outcome = true;
    const char *lk[] = {gw_outcome_name((gw_outcome_t)q->outcome)};
    gw_metric_add(s->m_lookups, lk, 1);
    if (s->reg != NULL) {
        q->decided = true; /* a resubmission keeps it: the claims were made for it */
        gw__obs_registry_decision(s, q->registry == BILL_REGISTRY_SHARED);
    }
}

/* Submits q to q->worker (state RUNNING, in the live map). On failure it answers and frees q. */
static void submit(gw_req_t *q)
{
    serve_t *s = q->s;
    q->has_prefill = false; /* a resubmission waits for the new worker's */
    q->prefill = (eng_wire_prefill_t){0};
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
    uint32_t prefill =
        q->r.n_tokens > q->phys_tokens ? (uint32_t)q->r.n_tokens - q->phys_tokens : 0;
    int rc = pc_u64map_put(&s->live_map, q->wire_id, q);
    if (rc == 0 && (rc = gw_pool_submit(s->pool, q->worker, &rq, prefill, err, sizeof err)) != 0)
        pc_u64map_del(&s->live_map, q->wire_id);
    else if (rc != 0)
        snprintf(err, sizeof err, "out of memory");
    if (rc != 0) {
        gw_api_error_t e;
        if (rc == PC_ERR_RANGE)
            gw_api_error_set(&e, q->kind, 400, "prompt is too long: %s", err);
        else if (rc == PC_ERR_OVERLOADED || rc == PC_ERR_UPSTREAM)
            gw_api_error_set(&e, q->kind, 529, "Overloaded");
        else
            gw_api_error_set(&e, q->kind, rc == PC_ERR_INVAL ? 400 : 500, "%s", err);
        gw__req_respond_error(q, &e);
        gw__req_free(q);
        return;
    }
    gw__req_set_state(q, GW_REQ_RUNNING);
    live_add(q);
    /* A stream's head waits for the worker's PREFILL (or its first TOKEN or DONE), so that
     * kvgw-cache says where the prompt's KV came from. */
}

/* The registry answered q's claim (or its deadline passed, or it failed): the decision. LIVE
 * points go into the replica and are read from it; a point another request claimed is read
 * (that request writes it, and the worker shares its prefill within the namespace) and q goes
 * to that request's worker when this gateway is connected to it; our own claims (MINE) are
 * committed at the first token or released. Anything but an answer: the local view decides. */
static void on_claim(const gw_registry_claim_result_t *res, void *ud)
{
    gw_req_t *q = ud;
    serve_t *s = q->s;
    q->claim = NULL;
    s->n_claiming--;
    uint64_t now = pc_time_mono_ms();
    uint32_t other_read = 0;
    int other_worker = -1;
    if (res->status == GW_REGISTRY_ST_OK) {
        q->registry = BILL_REGISTRY_SHARED;
        gw_registry_feed_point_t live[GW_REGISTRY_MAX_POINTS];
        size_t n_live = 0;
        for (size_t i = 0; i < res->n_points; i++) {
            const gw_registry_point_result_t *p = &res->points[i];
            if (p->state == GW_REGISTRY_PT_LIVE) {
                live[n_live++] = (gw_registry_feed_point_t){p->n_tokens, p->ttl, p->expiry_wall_ms};
            } else if (p->state == GW_REGISTRY_PT_OTHER) {
                other_read = PC_MAX(other_read, p->n_tokens);
                int w = gw__serve_worker_by_id(s, p->worker, q->model->index);
                if (w >= 0)
                    other_worker = w;
            } else if (p->state == GW_REGISTRY_PT_MINE && q->n_mine < PC_ARRAY_LEN(q->mine)) {
                q->mine[q->n_mine++] = (gw_registry_point_t){p->n_tokens, 0, true};
                q->fence = res->fence;
            }
        }
        for (uint32_t i = 0; i < q->n_mine; i++) /* the TTL class the plan asked for */
            for (size_t j = 0; j < q->plan.n_bps; j++)
                if (q->plan.bps[j].n_tokens == q->mine[i].n_tokens)
                    q->mine[i].ttl =
                        q->plan.bps[j].ttl == ENG_CHAT_TTL_1H ? GW_CINDEX_TTL_1H : GW_CINDEX_TTL_5M;
        if (n_live > 0) {
            int rc = gw__serve_replica_write(s, q->ns, q->key->tenant, q->model->index, q->r.tokens,
                                             live, n_live, now);
            if (rc < 0) /* those points stay unread here: billed as written, never as more */
                gw__obs_internal_error(s, "replica_insert",
                                       "request %s: live entries from the registry not indexed: "
                                       "%s",
                                       q->id, pc_strerror(rc));
        }
    } else {
        q->registry = BILL_REGISTRY_LOCAL;
    }
    gw_cindex_match_t m;
    local_view(q, now, &m);
    if (other_read > q->read_tokens)
        q->read_tokens = other_read;
    const gw_pool_worker_t *ow =
        other_worker >= 0 ? gw_pool_worker(s->pool, (uint32_t)other_worker) : NULL;
    if (ow != NULL && ow->index != q->worker && ow->up &&
        (ow->max_prompt_tokens == 0 || q->r.n_tokens <= ow->max_prompt_tokens)) {
        q->worker = (uint32_t)other_worker;
        q->phys_tokens = m.held[other_worker];
        const char *rl[] = {"claim"};
        gw_metric_add(s->m_routes, rl, 1);
    }
    decide(q);
    submit(q);
}

/* With a registry: claims the points of q's plan that it would write and the replica does not
 * hold (one round trip; q waits in CLAIMING). Returns true when the claim is in flight; false
 * when the decision is q's own to make now (q->registry says how: shared when Redis is up and
 * nothing needs agreeing, local when it is down or the claim could not be sent). */
static bool start_claim(gw_req_t *q)
{
    serve_t *s = q->s;
    q->registry = s->reg_state == GW_REGISTRY_UP ? BILL_REGISTRY_SHARED : BILL_REGISTRY_LOCAL;
    gw_registry_point_t pts[GW_CACHEPLAN_MAX_BPS];
    size_t n = 0;
    for (size_t i = 0; i < q->plan.n_bps && n < PC_ARRAY_LEN(pts); i++)
        if (q->plan.bps[i].n_tokens > q->read_tokens)
            pts[n++] = (gw_registry_point_t){
                q->plan.bps[i].n_tokens,
                q->plan.bps[i].ttl == ENG_CHAT_TTL_1H ? GW_CINDEX_TTL_1H : GW_CINDEX_TTL_5M, true};
    if (n == 0)
        return false;
    char wid[GW_REGISTRY_NAME_MAX + 1];
    int rc = gw_registry_claim(s->reg, q->ns, q->r.tokens, q->r.n_tokens, pts, n,
                               gw__serve_worker_id(s, q->worker, wid, sizeof wid), on_claim, q,
                               &q->claim);
    if (rc != 0) {
        q->registry = BILL_REGISTRY_LOCAL;
        if (rc < 0)
            PC_LOG(PC_LOG_WARN, "registry", "request %s: claim not sent (%s): decided locally",
                   q->id, pc_strerror(rc));
        return false;
    }
    s->n_claiming++;
    gw__req_set_state(q, GW_REQ_CLAIMING);
    return true;
}

static void route_and_submit(gw_req_t *q)
{
    serve_t *s = q->s;
    gw_cindex_match_t m;
    local_view(q, pc_time_mono_ms(), &m);
    if (!pick_worker(q, &m))
        return;
    if (!q->decided) {
        if (s->reg != NULL && start_claim(q))
            return; /* on_claim decides and submits */
        decide(q);
    }
    submit(q);
}

/* The thread pool's part: reads only q's own bytes (body, key, kind) and the gateway's
 * read-only configuration and models, writes only q. Never q->http: the client may be gone. */
static void prepare_work(uv_work_t *w)
{
    gw_req_t *q = w->data;
    const serve_t *s = q->s;
    int rc = gw_api_parse(q->kind, q->body.base, q->body.len, &q->arena, &q->api, &q->err);
    if (rc != 0) {
        q->prep_rc = rc;
        return;
    }
    for (size_t i = 0; i < s->n_models; i++)
        if (pc_slice_eq_cstr(q->api->model, s->models[i].cfg->name))
            q->model = (gw_model_rt_t *)&s->models[i];
    if (q->model == NULL) {
        gw_api_error_set(&q->err, q->kind, 404, "model: %.*s", (int)q->api->model.len,
                         q->api->model.base);
        q->prep_rc = PC_ERR_NOTFOUND;
        return;
    }
    /* The namespace first: it scopes the token cache, so one tenant's prompts never make
     * another's requests faster. */
    q->ns = gw_namespace_of(s->cfg.namespace_secret, q->key->tenant, q->api->model,
                            q->api->has_cache_salt, q->api->cache_salt);
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
    gw_req_t *q = w->data;
    serve_t *s = q->s;
    (void)status;
    if (q->http == NULL) { /* the client left while we tokenized */
        gw__req_free(q);
        return;
    }
    if (q->prep_rc != 0) {
        gw__req_respond_error(q, &q->err);
        gw__req_free(q);
        return;
    }
    if (q->ops->resp_prefix == NULL) {                   /* count_tokens */
        q->usage.input_tokens = (uint32_t)q->r.n_tokens; /* for the access log */
        pc_buf_t b = {0};
        if (gw_anthropic_count_tokens_render((uint32_t)q->r.n_tokens, &b) == 0)
            gw__req_respond(q, 200, "application/json", b.base, b.len);
        else
            gw__req_respond_errorf(q, 500, "%s", "out of memory");
        pc_buf_free(&b);
        gw__req_free(q);
        return;
    }
    if (s->stopping) {
        gw__req_respond_errorf(q, 529, "%s", "the gateway is shutting down");
        gw__req_free(q);
        return;
    }
    const bill_price_t *price;
    if (bill_pricing_lookup(s->pricing, q->model->cfg->name, pc_time_wall_ms(), &price) != 0) {
        gw__req_respond_errorf(q, 500,
                               "no price is configured for model %s: the request is refused, "
                               "never served unbilled",
                               q->model->cfg->name);
        gw__req_free(q);
        return;
    }
    if (bill_ledger_status(s->ledger) != 0) {
        gw__req_respond_errorf(q, 503, "%s",
                               "billing is unavailable (the usage ledger cannot be written): "
                               "billable requests are refused");
        gw__req_free(q);
        return;
    }
    hex_id(q->resp_id, sizeof q->resp_id, q->ops->resp_prefix);
    route_and_submit(q);
}

static void on_abort(gw_http_req_t *r, void *data)
{
    gw_req_t *q = data;
    (void)r;
    q->http = NULL;
    q->client_gone = true;
    if (q->state == GW_REQ_RUNNING)
        gw_pool_cancel(q->s->pool, q->worker, q->wire_id);
    if (q->state == GW_REQ_CLAIMING) {
        /* No callback follows; a claim Redis grants after this is released by the registry. */
        gw_registry_cancel(q->s->reg, q->claim);
        q->claim = NULL;
        q->s->n_claiming--;
        gw__req_free(q);
        return;
    }
    /* PREPARING: prepare_done frees it; DURABLE: finish_response sees http == NULL. */
}

void gw__req_start_api(gw_req_t *q)
{
    q->ops = ops_for(q->kind);
    PC_ASSERT(q->ops->kind == q->kind);
    q->endpoint = q->ops->endpoint;
    /* The body is copied: the pool must never read the connection's memory (the client may
     * close while the prepare work is queued or running, and the HTTP layer frees it then). */
    pc_slice_t body = gw_http_req_body(q->http);
    char *copy = pc_malloc(body.len ? body.len : 1);
    if (copy == NULL) {
        gw__obs_internal_error(q->s, "body_copy", "request %s: body of %zu bytes not copied", q->id,
                               body.len);
        gw__req_respond_errorf(q, 500, "%s", "out of memory");
        gw__req_free(q);
        return;
    }
    if (body.len)
        memcpy(copy, body.base, body.len);
    q->body = (pc_slice_t){copy, body.len};
    gw_http_req_on_abort(q->http, on_abort);
    gw_http_req_on_drain(q->http, on_drain);
    q->work.data = q;
    gw__req_set_state(q, GW_REQ_PREPARING);
    uv_queue_work(q->s->loop, &q->work, prepare_work, prepare_done);
}
