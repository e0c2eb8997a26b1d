/*
 * worker_server.c — the worker API over TCP (contract in worker_server.h).
 *
 * Request bookkeeping. Request ids are unique per connection only, the worker's are unique per
 * worker, so the server submits every request under an id of its own (a counter, never reused)
 * and keeps one record per request:
 *
 *   s->reqs     worker id -> record, while the request is live (every event that names a
 *               request, KV_EVENT RETAINED and RETAIN_FAILED included, comes before its final
 *               event; pins belong to the worker, not to a request or a connection);
 *   conn->reqs  the connection's request id -> record, while the request is live (CANCEL and
 *               the duplicate-id check), so an id is free for reuse once its final frame left.
 *
 * When a connection ends, its records leave both maps at once and its live requests are
 * canceled; the events that still come for them find no record and are dropped. Nothing else
 * ever points at a connection, so its memory is freed right after its close callbacks.
 */
#include "worker_server.h"

#include <netdb.h>
#include <pthread.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "lnk_addr.h"
#include "wire_conn.h"

#define MIN_PEER_FRAME (16u << 10)
#define MAX_PEER_HEARTBEAT_MS 600000u
#define POLL_BATCH 64

/* Request maps (common/pc_u64map.h) die on allocation failure, like every allocation here
 * (pc_xmalloc): a request the worker accepted must be findable. */
static void map_put(pc_u64map_t *m, uint64_t k, void *v)
{
    if (pc_u64map_put(m, k, v) != 0)
        PC_ABORT("out of memory (request map of %zu entries)", pc_u64map_count(m));
}

/* ---------------------------------------------------------------------------------------------
 * Server state
 * ------------------------------------------------------------------------------------------- */

typedef struct srv_conn srv_conn_t;

typedef struct srv_req {
    uint64_t wid;     /* the worker's id (ours) */
    uint64_t cid;     /* the connection's id */
    srv_conn_t *conn; /* never NULL while in a map */
    bool live;        /* final event not seen yet */
} srv_req_t;

struct srv_conn {
    lnk_worker_server_t *s;
    srv_conn_t *prev, *next;
    pc_u64map_t reqs; /* live requests by the connection's ids */
    bool ready;       /* HELLO_ACK sent */
    bool rejected;    /* REJECT sent */
    bool authing;     /* CHALLENGE sent, AUTH awaited */
    bool pending;     /* counted in s->n_pending: accepted, handshake not done, not closing */
    bool dropped;     /* closed to make room in the pre-authentication budget */
    uint8_t gw_nonce[ENG_WIRE_AUTH_BYTES], wk_nonce[ENG_WIRE_AUTH_BYTES];
    uint32_t peer_heartbeat_ms, peer_max_frame; /* from HELLO, applied at HELLO_ACK */
    /* The model HELLO asked for, checked once the peer proved the secret (nothing about the
     * model is said to a peer before that). */
    char want_model[ENG_WIRE_NAME_MAX + 1];
    uint64_t want_fp;
    uint32_t want_vocab;
    uint64_t snap_id; /* the snapshot under way to this connection, 0 when none */
    char peer[64];
    char node[ENG_WIRE_NAME_MAX + 1];
    lnk_wconn_t w; /* last: it ends with the read buffer */
};

enum { SRV_RUNNING, SRV_DRAINING, SRV_CLOSING, SRV_CLOSED };

struct lnk_worker_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    uv_async_t async;
    uv_timer_t drain_timer;
    int n_open; /* the three handles above that are not closed yet */
    int state;
    bool free_when_closed; /* init failed: free at the last close callback */
    lnk_worker_server_params_t p;
    char node[ENG_WIRE_NAME_MAX + 1];
    char addr[80];
    uint16_t port;
    eng_worker_t *worker;
    eng_worker_info_t info;
    size_t model_name_len; /* info.model_name cut to ENG_WIRE_NAME_MAX on a UTF-8 boundary */
    srv_conn_t *conns;     /* newest first */
    uint32_t n_pending;    /* connections in their handshake (c->pending) */
    uint32_t n_ready;      /* connections past their handshake (c->ready) */
    pc_u64map_t reqs;      /* by worker id */
    uint64_t next_wid;
    uint64_t next_snap_id;
    uint8_t secret[LNK_SECRET_MAX]; /* the link secret; secret_len 0: no authentication */
    size_t secret_len;
    pthread_mutex_t wake_mu;
    bool wake_open;      /* the async handle may be signaled */
    bool worker_stopped; /* under wake_mu: the worker's thread ran its last step */
    lnk_worker_server_stats_t st;
    lnk_worker_server_closed_fn on_closed;
    void *closed_ud;
    eng_worker_event_t ev[POLL_BATCH];
};

lnk_worker_server_params_t lnk_worker_server_params_default(void)
{
    return (lnk_worker_server_params_t){
        .listen = "127.0.0.1:7070",
        .heartbeat_ms = 1000,
        .handshake_timeout_ms = 3000,
        .max_frame = ENG_WIRE_MAX_FRAME_DEFAULT,
        .max_queue_bytes = (size_t)64 << 20,
        .max_conns = 64,
        .max_pending = 16,
        .drain_timeout_ms = 5000,
        .secret = NULL,
        .secret_len = 0,
    };
}

static void check_closed(lnk_worker_server_t *s);
static void finish_drain(lnk_worker_server_t *s);

/* ---------------------------------------------------------------------------------------------
 * Frames out
 * ------------------------------------------------------------------------------------------- */

/* Our messages are short ASCII or UTF-8 reasons, possibly cut by a formatting buffer or the
 * limit: the slice ends before a character that is not whole, so the codec never refuses it. */
static pc_slice_t msg_slice(const char *msg)
{
    size_t n = PC_MIN(strlen(msg), (size_t)ENG_WIRE_MESSAGE_MAX);
    return pc_slice(msg, pc_utf8_trim_partial(msg, n));
}

/* Sends f to c. lnk_wconn_send's PC_ERR_INVAL (a frame this gateway cannot take: over its
 * max_frame, like a long EVICTED path or snapshot entry, or one the codec refuses) sends
 * nothing and leaves the connection open: the gateway would wait forever for a DONE that never
 * comes, or keep a wrong view of the cache. So the connection is closed with the reason (ERROR,
 * request 0, then the close): the gateway's client ends every request of the connection with
 * it. Every other failure means the connection is closing already, with its reason
 * (PC_ERR_OVERLOADED: the gateway is told; PC_ERR_CLOSED: it is ending anyway, and its live
 * requests are canceled when it has closed). Returns whether f was queued. */
static bool send_or_close(srv_conn_t *c, const eng_wire_frame_t *f)
{
    int rc = lnk_wconn_send(&c->w, f);
    if (rc != PC_ERR_INVAL)
        return rc == 0;
    char why[160] = "", reason[256];
    pc_buf_t tmp = PC_BUF_INIT;
    eng_wire_encode(f, c->w.max_frame_out, &tmp, why, sizeof why); /* the codec's reason */
    pc_buf_free(&tmp);
    snprintf(reason, sizeof reason, "cannot send %s: %s", eng_wire_type_name(f->type),
             why[0] != '\0' ? why : "refused by the codec");
    PC_LOG(PC_LOG_WARN, "worker", "conn %s: %s", c->peer, reason);
    eng_wire_frame_t e = {.type = c->ready ? ENG_WIRE_ERROR : ENG_WIRE_REJECT};
    e.u.error.code = PC_ERR_RANGE;
    e.u.error.message = msg_slice(reason);
    lnk_wconn_send(&c->w, &e);
    lnk_wconn_close(&c->w, PC_ERR_RANGE, reason, true);
    return false;
}

static void send_error(srv_conn_t *c, uint64_t cid, int code, const char *msg)
{
    eng_wire_frame_t f = {.type = ENG_WIRE_ERROR};
    f.u.error.request_id = cid;
    f.u.error.code = code;
    f.u.error.message = msg_slice(msg);
    send_or_close(c, &f);
}

static void send_load(srv_conn_t *c)
{
    eng_wire_frame_t f = {.type = ENG_WIRE_LOAD};
    eng_worker_load(c->s->worker, &f.u.load);
    send_or_close(c, &f);
}

/* The connection leaves the pre-authentication budget (handshake done, refused or closing). */
static void unpend(srv_conn_t *c)
{
    if (!c->pending)
        return;
    c->pending = false;
    c->s->n_pending--;
}

/* Refuses the handshake. With tell, REJECT carries the reason to the peer before the close;
 * without it (the peer did not prove the secret) nothing is said and the reason goes to the
 * worker's log only. Either way what was queued (the CHALLENGE, the REJECT) goes out first. */
PC_PRINTF(4, 5)
static void refuse(srv_conn_t *c, bool tell, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (tell)
        PC_LOG(PC_LOG_WARN, "worker", "conn %s: handshake rejected: %s", c->peer, msg);
    else
        PC_LOG(PC_LOG_WARN, "worker", "conn %s: handshake refused (nothing said to the peer): %s",
               c->peer, msg);
    unpend(c);
    if (tell) {
        eng_wire_frame_t f = {.type = ENG_WIRE_REJECT};
        f.u.error.code = code;
        f.u.error.message = msg_slice(msg);
        lnk_wconn_send(&c->w, &f);
    }
    c->rejected = true;
    c->s->st.conns_rejected++;
    lnk_wconn_close(&c->w, code, msg, true);
}

/* A frame the protocol does not allow here: ERROR (request 0) with the reason, then close. */
PC_PRINTF(2, 3)
static void protocol_error(srv_conn_t *c, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    send_error(c, 0, PC_ERR_FORMAT, msg);
    lnk_wconn_close(&c->w, PC_ERR_FORMAT, msg, true);
}

/* ---------------------------------------------------------------------------------------------
 * Frames in
 * ------------------------------------------------------------------------------------------- */

static void finish_handshake(srv_conn_t *c);

/* Whether this worker serves the model HELLO asked for (empty / 0 mean any); REJECT with the
 * reason otherwise. Called once the peer is authenticated (or on a link without a secret). */
static bool model_matches(srv_conn_t *c)
{
    lnk_worker_server_t *s = c->s;
    const eng_worker_info_t *in = &s->info;
    if (c->want_model[0] != '\0' &&
        !pc_slice_eq(pc_slice_cstr(c->want_model), pc_slice(in->model_name, s->model_name_len))) {
        refuse(c, true, PC_ERR_INVAL, "model '%s' asked, this worker serves '%.*s'", c->want_model,
               (int)s->model_name_len, in->model_name);
        return false;
    }
    if (c->want_fp != 0 && c->want_fp != in->model_fp) {
        refuse(c, true, PC_ERR_INVAL, "model fingerprint %016llx asked, this worker's is %016llx",
               (unsigned long long)c->want_fp, (unsigned long long)in->model_fp);
        return false;
    }
    if (c->want_vocab != 0 && c->want_vocab != in->n_vocab) {
        refuse(c, true, PC_ERR_INVAL, "n_vocab %u asked, this worker's model has %u", c->want_vocab,
               in->n_vocab);
        return false;
    }
    return true;
}

static void on_hello(srv_conn_t *c, const eng_wire_hello_t *h)
{
    lnk_worker_server_t *s = c->s;
    if (h->role != ENG_WIRE_ROLE_GATEWAY) {
        refuse(c, true, PC_ERR_INVAL, "role %u: only a gateway (role 1) connects to a worker",
               h->role);
        return;
    }
    if (h->version_min > ENG_WIRE_VERSION || h->version_max < ENG_WIRE_VERSION) {
        refuse(c, true, PC_ERR_UNSUPPORTED, "protocol versions %u..%u asked, this worker speaks %d",
               h->version_min, h->version_max, ENG_WIRE_VERSION);
        return;
    }
    if (h->heartbeat_ms == 0 || h->heartbeat_ms > MAX_PEER_HEARTBEAT_MS) {
        refuse(c, true, PC_ERR_INVAL, "heartbeat_ms %u outside 1..%u", h->heartbeat_ms,
               MAX_PEER_HEARTBEAT_MS);
        return;
    }
    if (h->max_frame < MIN_PEER_FRAME) {
        refuse(c, true, PC_ERR_INVAL, "max_frame %u below the minimum of %u bytes", h->max_frame,
               MIN_PEER_FRAME);
        return;
    }
    snprintf(c->want_model, sizeof c->want_model, "%.*s", (int)h->model_name.len,
             h->model_name.base);
    c->want_fp = h->model_fp;
    c->want_vocab = h->n_vocab;
    snprintf(c->node, sizeof c->node, "%.*s", (int)h->node.len, h->node.base);
    c->peer_heartbeat_ms = h->heartbeat_ms;
    c->peer_max_frame = h->max_frame;
    memcpy(c->gw_nonce, h->auth, ENG_WIRE_AUTH_BYTES);
    if (s->secret_len == 0) {
        if (model_matches(c))
            finish_handshake(c);
        return;
    }
    /* Prove the peer knows the secret before anything else: CHALLENGE, then AUTH. */
    lnk_wire_nonce(c->wk_nonce);
    c->authing = true;
    eng_wire_frame_t f = {.type = ENG_WIRE_CHALLENGE};
    memcpy(f.u.auth.bytes, c->wk_nonce, ENG_WIRE_AUTH_BYTES);
    send_or_close(c, &f);
}

static void on_auth(srv_conn_t *c, const eng_wire_frame_t *f)
{
    lnk_worker_server_t *s = c->s;
    uint8_t want[ENG_WIRE_AUTH_BYTES];
    if (f->type != ENG_WIRE_AUTH) {
        refuse(c, false, PC_ERR_PERM, "link authentication: expected AUTH, got %s",
               eng_wire_type_name(f->type));
        return;
    }
    lnk_wire_auth_mac(s->secret, s->secret_len, ENG_WIRE_ROLE_GATEWAY, c->gw_nonce, c->wk_nonce,
                      want);
    if (!lnk_wire_auth_equal(want, f->u.auth.bytes)) {
        refuse(c, false, PC_ERR_PERM, "link authentication failed (wrong secret)");
        return;
    }
    /* The peer knows the secret: everything from here on is sealed, both ways (wire_seal.h),
     * and only now may it learn why its handshake fails. */
    c->authing = false;
    lnk_seal_t gw_to_wk, wk_to_gw;
    lnk_seal_derive(s->secret, s->secret_len, c->gw_nonce, c->wk_nonce, &gw_to_wk, &wk_to_gw);
    lnk_wconn_seal(&c->w, &wk_to_gw, &gw_to_wk);
    lnk_seal_wipe(&gw_to_wk);
    lnk_seal_wipe(&wk_to_gw);
    if (model_matches(c))
        finish_handshake(c);
}

/* HELLO_ACK (with the worker's proof on an authenticated link), the first LOAD and the
 * snapshot of the pins: the connection is ready. */
static void finish_handshake(srv_conn_t *c)
{
    lnk_worker_server_t *s = c->s;
    const eng_worker_info_t *in = &s->info;
    if (s->n_ready >= s->p.max_conns) {
        refuse(c, true, PC_ERR_OVERLOADED, "too many connections (limit %u)", s->p.max_conns);
        return;
    }
    unpend(c);
    c->ready = true;
    s->n_ready++;
    c->w.error_frame = ENG_WIRE_ERROR;
    c->w.max_frame_out = c->peer_max_frame;
    lnk_wconn_set_max_frame_in(&c->w, s->p.max_frame);
    lnk_wconn_set_deadline(&c->w, 0, NULL);
    lnk_wconn_set_heartbeat(&c->w, s->p.heartbeat_ms, 3 * c->peer_heartbeat_ms);

    eng_wire_frame_t f = {.type = ENG_WIRE_HELLO_ACK};
    eng_wire_hello_t *a = &f.u.hello;
    a->version_min = a->version_max = ENG_WIRE_VERSION;
    a->role = ENG_WIRE_ROLE_WORKER;
    a->heartbeat_ms = s->p.heartbeat_ms;
    a->max_frame = s->p.max_frame;
    a->node = pc_slice_cstr(s->node);
    a->model_name = pc_slice(in->model_name, s->model_name_len);
    a->model_fp = in->model_fp;
    a->n_vocab = in->n_vocab;
    a->n_ctx = in->n_ctx;
    a->block_tokens = in->block_tokens;
    a->total_blocks = in->total_blocks;
    a->max_prompt_tokens = in->max_prompt_tokens;
    if (s->secret_len > 0)
        lnk_wire_auth_mac(s->secret, s->secret_len, ENG_WIRE_ROLE_WORKER, c->gw_nonce, c->wk_nonce,
                          a->auth);
    if (!send_or_close(c, &f))
        return;
    send_load(c); /* the router's first figures */
    /* The pins, in the worker's event order: KV events after it apply on top. */
    c->snap_id = ++s->next_snap_id;
    if (eng_worker_snapshot(s->worker, c->snap_id) != 0)
        c->snap_id = 0;
    PC_LOG(PC_LOG_INFO, "worker", "conn %s: gateway '%s' connected (heartbeat %u ms%s)", c->peer,
           c->node, c->peer_heartbeat_ms, s->secret_len > 0 ? ", authenticated" : "");
}

static void on_submit(srv_conn_t *c, const eng_wire_submit_t *sub)
{
    lnk_worker_server_t *s = c->s;
    uint64_t cid = sub->request_id;
    if (cid == 0) {
        protocol_error(c, "SUBMIT with request id 0");
        return;
    }
    if (pc_u64map_get(&c->reqs, cid) != NULL) {
        protocol_error(c, "SUBMIT reuses request id %llu, which is still live",
                       (unsigned long long)cid);
        return;
    }
    if (s->state != SRV_RUNNING) {
        send_error(c, cid, PC_ERR_STATE, "the worker is shutting down");
        s->st.requests_refused++;
        return;
    }
    eng_wire_submit_t rq = *sub;
    rq.request_id = ++s->next_wid;
    char err[256] = "";
    int rc = eng_worker_submit(s->worker, &rq, err, sizeof err);
    if (rc != 0) {
        PC_LOG(PC_LOG_DEBUG, "worker", "conn %s: request %llu refused: %s", c->peer,
               (unsigned long long)cid, err);
        send_error(c, cid, rc, err[0] ? err : pc_strerror(rc));
        s->st.requests_refused++;
        return;
    }
    srv_req_t *r = pc_xmalloc(sizeof *r);
    *r = (srv_req_t){.wid = rq.request_id, .cid = cid, .conn = c, .live = true};
    map_put(&s->reqs, r->wid, r);
    map_put(&c->reqs, cid, r);
    s->st.requests_submitted++;
    s->st.requests_live++;
}

static void on_cancel(srv_conn_t *c, uint64_t cid)
{
    srv_req_t *r = pc_u64map_get(&c->reqs, cid);
    if (r == NULL) {
        /* Unknown, or its final frame is already on its way: nothing to do. */
        PC_LOG(PC_LOG_DEBUG, "worker", "conn %s: CANCEL of request %llu, which is not live",
               c->peer, (unsigned long long)cid);
        return;
    }
    eng_worker_cancel(c->s->worker, r->wid);
}

static void on_frame(lnk_wconn_t *w, const eng_wire_frame_t *f)
{
    srv_conn_t *c = w->data;
    if (c->authing) {
        on_auth(c, f);
        return;
    }
    if (!c->ready) {
        if (f->type != ENG_WIRE_HELLO)
            refuse(c, true, PC_ERR_FORMAT, "expected HELLO, got %s", eng_wire_type_name(f->type));
        else
            on_hello(c, &f->u.hello);
        return;
    }
    switch (f->type) {
    case ENG_WIRE_SUBMIT:
        on_submit(c, &f->u.submit);
        break;
    case ENG_WIRE_CANCEL:
        on_cancel(c, f->u.cancel_id);
        break;
    case ENG_WIRE_HEARTBEAT:
        send_load(c);
        break;
    case ENG_WIRE_RELEASE: {
        const eng_wire_release_t *x = &f->u.release;
        int rc = eng_worker_release(c->s->worker, x->ns, x->tokens, x->n_tokens);
        if (rc != 0 && rc != PC_ERR_STATE)
            PC_LOG(PC_LOG_WARN, "worker", "conn %s: RELEASE: %s", c->peer, pc_strerror(rc));
        break;
    }
    case ENG_WIRE_DROP: {
        int rc = eng_worker_drop_ns(c->s->worker, f->u.release.ns);
        PC_LOG(rc == 0 ? PC_LOG_INFO : PC_LOG_WARN, "worker",
               "conn %s: DROP of namespace %016llx: %s", c->peer,
               (unsigned long long)f->u.release.ns, rc == 0 ? "queued" : pc_strerror(rc));
        break;
    }
    case ENG_WIRE_HELLO:
        protocol_error(c, "HELLO after the handshake");
        break;
    default:
        protocol_error(c, "%s is not a frame a gateway sends", eng_wire_type_name(f->type));
        break;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Connections
 * ------------------------------------------------------------------------------------------- */

static void on_conn_closed(lnk_wconn_t *w)
{
    srv_conn_t *c = w->data;
    lnk_worker_server_t *s = c->s;
    int err = w->close_err;
    if (!c->rejected) {
        if (err == PC_ERR_FORMAT || err == PC_ERR_UNSUPPORTED || err == PC_ERR_RANGE)
            s->st.conns_bad_frame++;
        else if (err == PC_ERR_TIMEOUT)
            s->st.conns_timeout++;
        else if (err == PC_ERR_OVERLOADED && !c->dropped)
            s->st.conns_slow++;
        else if (err == PC_ERR_PERM)
            s->st.conns_unsealed++;
    }
    bool expected = err == 0 || err == PC_ERR_CLOSED || c->rejected;
    PC_LOG(expected ? PC_LOG_INFO : PC_LOG_WARN, "worker", "conn %s: closed: %s", c->peer,
           w->close_reason[0] ? w->close_reason : "done");

    /* Forget every request of the connection; cancel the live ones. */
    uint32_t n_canceled = 0;
    /* c->reqs holds exactly the connection's requests in s->reqs: both maps gain a request in
     * on_submit and lose it together in dispatch. */
    for (size_t i = pc_u64map_next(&c->reqs, 0); i < c->reqs.cap;
         i = pc_u64map_next(&c->reqs, i + 1)) {
        srv_req_t *r = c->reqs.slots[i].value;
        if (r->live) {
            /* Once the shutdown is closing, the worker is stopping (or freed) and drops what
             * it still holds: nothing to cancel. */
            if (s->state == SRV_RUNNING || s->state == SRV_DRAINING)
                eng_worker_cancel(s->worker, r->wid);
            s->st.requests_live--;
            s->st.requests_orphaned++;
            n_canceled++;
        }
        pc_u64map_del(&s->reqs, r->wid); /* the other map: c->reqs stays as it is */
        pc_free(r);
    }
    if (n_canceled > 0)
        PC_LOG(PC_LOG_INFO, "worker", "conn %s: canceled %u live request(s)", c->peer, n_canceled);
    pc_u64map_free(&c->reqs);
    unpend(c);
    if (c->ready)
        s->n_ready--;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->st.conns_open--;
    pc_free(c);
    if (s->state == SRV_DRAINING && s->st.requests_live == 0)
        finish_drain(s);
    check_closed(s);
}

static const lnk_wconn_ops_t conn_ops = {.on_frame = on_frame, .on_closed = on_conn_closed};

/* Closes the connection that has been in its handshake longest (the list is newest first). */
static void evict_oldest_pending(lnk_worker_server_t *s)
{
    srv_conn_t *old = NULL;
    for (srv_conn_t *c = s->conns; c != NULL; c = c->next)
        if (c->pending)
            old = c;
    if (old == NULL)
        return;
    PC_LOG(PC_LOG_WARN, "worker",
           "conn %s: dropped in its handshake: %u connections are in theirs (the limit)", old->peer,
           s->p.max_pending);
    unpend(old);
    old->dropped = true;
    s->st.conns_pending_dropped++;
    lnk_wconn_close(&old->w, PC_ERR_OVERLOADED, "too many connections in their handshake", false);
}

static void on_connection(uv_stream_t *l, int status)
{
    lnk_worker_server_t *s = l->data;
    if (status < 0) {
        PC_LOG(PC_LOG_WARN, "worker", "accept: %s", uv_strerror(status));
        return;
    }
    srv_conn_t *c = pc_xmalloc(sizeof *c);
    memset(c, 0, offsetof(srv_conn_t, w));
    c->s = s;
    snprintf(c->peer, sizeof c->peer, "?");
    /* Small frames only until the handshake is done (finish_handshake raises the limit). */
    if (lnk_wconn_init(s->loop, &c->w, &conn_ops, c, LNK_HANDSHAKE_MAX_FRAME,
                       s->p.max_queue_bytes) != 0) {
        PC_LOG(PC_LOG_ERROR, "worker", "accept: cannot set up a connection");
        pc_free(c);
        return;
    }
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->st.conns_open++;
    int rc = uv_accept(l, (uv_stream_t *)&c->w.tcp);
    if (rc != 0) {
        PC_LOG(PC_LOG_WARN, "worker", "accept: %s", uv_strerror(rc));
        lnk_wconn_close(&c->w, PC_ERR_IO, "accept failed", false);
        return;
    }
    s->st.conns_accepted++;
    struct sockaddr_storage sa;
    int len = sizeof sa;
    if (uv_tcp_getpeername(&c->w.tcp, (struct sockaddr *)&sa, &len) == 0)
        lnk_wconn_format_addr((struct sockaddr *)&sa, c->peer, sizeof c->peer);
    c->w.error_frame = ENG_WIRE_REJECT;
    if (lnk_wconn_start(&c->w) != 0)
        return;
    PC_LOG(PC_LOG_DEBUG, "worker", "conn %s: accepted", c->peer);
    /* The pre-authentication budget: a full one makes room by dropping its oldest handshake,
     * so sockets that never authenticate cannot keep a real gateway out (its handshake takes
     * a round trip or two; theirs last until the deadline). */
    if (s->n_pending >= s->p.max_pending)
        evict_oldest_pending(s);
    c->pending = true;
    s->n_pending++;
    lnk_wconn_set_deadline(&c->w, s->p.handshake_timeout_ms, "no handshake before the deadline");
}

/* ---------------------------------------------------------------------------------------------
 * Worker events
 * ------------------------------------------------------------------------------------------- */

/* The connection that owns the event's request, with the frame's id rewritten to the
 * connection's; NULL (the event is dropped) when the connection is gone. */
static srv_req_t *route(lnk_worker_server_t *s, uint64_t wid)
{
    srv_req_t *r = pc_u64map_get(&s->reqs, wid);
    if (r == NULL)
        s->st.events_dropped++;
    return r;
}

/* f to every connection past its handshake, with request_id set to 0 in the KV events of
 * connections other than skip (which got its own copy). */
static void broadcast(lnk_worker_server_t *s, const eng_wire_frame_t *f, const srv_conn_t *skip)
{
    for (srv_conn_t *c = s->conns; c != NULL; c = c->next)
        if (c != skip && c->ready && lnk_wconn_is_open(&c->w))
            send_or_close(c, f);
}

static void dispatch(lnk_worker_server_t *s, const eng_worker_event_t *ev)
{
    eng_wire_frame_t f = *ev;
    srv_req_t *r;
    switch (ev->type) {
    case ENG_WIRE_TOKEN:
        if ((r = route(s, ev->u.token.request_id)) == NULL)
            return;
        f.u.token.request_id = r->cid;
        send_or_close(r->conn, &f);
        return;
    case ENG_WIRE_PREFILL:
        if ((r = route(s, ev->u.prefill.request_id)) == NULL)
            return;
        f.u.prefill.request_id = r->cid;
        send_or_close(r->conn, &f);
        return;
    case ENG_WIRE_DONE:
    case ENG_WIRE_ERROR: {
        uint64_t wid = ev->type == ENG_WIRE_DONE ? ev->u.done.request_id : ev->u.error.request_id;
        if ((r = route(s, wid)) == NULL)
            return;
        if (ev->type == ENG_WIRE_DONE)
            f.u.done.request_id = r->cid;
        else
            f.u.error.request_id = r->cid;
        send_or_close(r->conn, &f); /* or the connection ends, with the reason */
        if (r->live) {
            r->live = false;
            pc_u64map_del(&r->conn->reqs, r->cid);
            s->st.requests_live--;
        }
        pc_u64map_del(&s->reqs, r->wid);
        pc_free(r);
        return;
    }
    case ENG_WIRE_KV_EVENT: {
        /* RETAINED: the submitter gets its request id, every other gateway the news with id
         * 0 (its index learns the prefix too); RETAIN_FAILED only concerns the submitter;
         * RELEASED and EVICTED go to everyone. */
        uint8_t kind = ev->u.kv.kind;
        srv_conn_t *owner = NULL;
        if (kind == ENG_WIRE_KV_RETAINED || kind == ENG_WIRE_KV_RETAIN_FAILED) {
            r = pc_u64map_get(&s->reqs, ev->u.kv.request_id);
            if (r != NULL) {
                owner = r->conn;
                f.u.kv.request_id = r->cid;
                send_or_close(owner, &f);
            } else if (kind == ENG_WIRE_KV_RETAIN_FAILED) {
                s->st.events_dropped++;
            }
            if (kind == ENG_WIRE_KV_RETAIN_FAILED)
                return;
            f.u.kv.request_id = 0;
        }
        broadcast(s, &f, owner);
        return;
    }
    case ENG_WIRE_SNAPSHOT:
        for (srv_conn_t *c = s->conns; c != NULL; c = c->next)
            if (c->snap_id != 0 && c->snap_id == ev->u.snapshot.snapshot_id) {
                if (ev->u.snapshot.last)
                    c->snap_id = 0;
                if (lnk_wconn_is_open(&c->w))
                    send_or_close(c, &f);
                return;
            }
        s->st.events_dropped++; /* its connection is gone */
        return;
    case ENG_WIRE_LOAD:
        broadcast(s, &f, NULL);
        return;
    default:
        PC_LOG(PC_LOG_ERROR, "worker", "unexpected event %s from the worker",
               eng_wire_type_name(ev->type));
        return;
    }
}

static void drain_events(lnk_worker_server_t *s)
{
    if (s->worker == NULL)
        return;
    size_t k;
    do {
        k = eng_worker_poll(s->worker, s->ev, POLL_BATCH);
        for (size_t i = 0; i < k; i++)
            dispatch(s, &s->ev[i]);
    } while (k == POLL_BATCH);
    for (srv_conn_t *c = s->conns; c != NULL; c = c->next)
        lnk_wconn_flush(&c->w);
    if (s->state == SRV_DRAINING && s->st.requests_live == 0)
        finish_drain(s);
}

static void free_worker(lnk_worker_server_t *s);

static void on_async(uv_async_t *a)
{
    lnk_worker_server_t *s = a->data;
    pthread_mutex_lock(&s->wake_mu);
    bool stopped = s->worker_stopped;
    pthread_mutex_unlock(&s->wake_mu);
    if (!stopped) {
        drain_events(s);
        return;
    }
    if (s->worker != NULL) {
        free_worker(s); /* its thread is returning: the join does not wait */
        check_closed(s);
    }
}

/* The worker's wake callback, on the worker's thread. */
static void on_wake(void *ud)
{
    lnk_worker_server_t *s = ud;
    pthread_mutex_lock(&s->wake_mu);
    if (s->wake_open)
        uv_async_send(&s->async);
    pthread_mutex_unlock(&s->wake_mu);
}

/* eng_worker_stop's notification, the worker thread's last act: on_async frees the worker. */
static void on_worker_stopped(void *ud)
{
    lnk_worker_server_t *s = ud;
    pthread_mutex_lock(&s->wake_mu);
    s->worker_stopped = true;
    if (s->wake_open)
        uv_async_send(&s->async);
    pthread_mutex_unlock(&s->wake_mu);
}

/* ---------------------------------------------------------------------------------------------
 * Life cycle
 * ------------------------------------------------------------------------------------------- */

static void on_server_handle_closed(uv_handle_t *h)
{
    lnk_worker_server_t *s = h->data;
    s->n_open--;
    check_closed(s);
}

static void check_closed(lnk_worker_server_t *s)
{
    if (s->state != SRV_CLOSING || s->n_open > 0 || s->conns != NULL)
        return;
    s->state = SRV_CLOSED;
    if (s->free_when_closed) {
        lnk_worker_server_free(s);
        return;
    }
    PC_LOG(PC_LOG_INFO, "worker", "stopped");
    if (s->on_closed)
        s->on_closed(s, s->closed_ud);
}

/* Frees the worker and closes the async handle. The worker's thread must be stopped or idle:
 * eng_worker_free joins it. */
static void free_worker(lnk_worker_server_t *s)
{
    pthread_mutex_lock(&s->wake_mu);
    s->wake_open = false;
    pthread_mutex_unlock(&s->wake_mu);
    eng_worker_free(s->worker); /* joins the scheduler thread: no wake after this */
    s->worker = NULL;
    uv_close((uv_handle_t *)&s->async, on_server_handle_closed);
}

/* Closes the drain timer and asks the worker to stop without waiting for its step in progress
 * (the loop never blocks on model math): on_worker_stopped wakes on_async, which frees the
 * worker and closes the async handle. The listener is closed already; connections close on
 * their own. */
static void close_core(lnk_worker_server_t *s)
{
    uv_close((uv_handle_t *)&s->drain_timer, on_server_handle_closed);
    eng_worker_stop(s->worker, on_worker_stopped, s);
}

static void finish_drain(lnk_worker_server_t *s)
{
    if (s->state != SRV_DRAINING)
        return;
    s->state = SRV_CLOSING;
    uv_timer_stop(&s->drain_timer);
    for (srv_conn_t *c = s->conns; c != NULL; c = c->next) {
        if (c->ready && lnk_wconn_is_open(&c->w))
            send_error(c, 0, PC_ERR_CLOSED, "the worker is shutting down");
        lnk_wconn_close(&c->w, 0, "the worker is shutting down", true);
    }
    close_core(s);
    check_closed(s);
}

static void on_drain_timeout(uv_timer_t *t)
{
    lnk_worker_server_t *s = t->data;
    PC_LOG(PC_LOG_WARN, "worker", "shutdown: %llu request(s) still live after %u ms; closing",
           (unsigned long long)s->st.requests_live, s->p.drain_timeout_ms);
    finish_drain(s);
}

void lnk_worker_server_shutdown(lnk_worker_server_t *s, lnk_worker_server_closed_fn on_closed,
                                void *ud)
{
    if (s->state != SRV_RUNNING)
        return;
    s->state = SRV_DRAINING;
    s->on_closed = on_closed;
    s->closed_ud = ud;
    PC_LOG(PC_LOG_INFO, "worker", "shutting down: %llu live request(s), %u connection(s)",
           (unsigned long long)s->st.requests_live, s->st.conns_open);
    uv_close((uv_handle_t *)&s->listener, on_server_handle_closed);
    for (size_t i = pc_u64map_next(&s->reqs, 0); i < s->reqs.cap;
         i = pc_u64map_next(&s->reqs, i + 1)) {
        srv_req_t *r = s->reqs.slots[i].value;
        if (r->live)
            eng_worker_cancel(s->worker, r->wid);
    }
    if (s->st.requests_live == 0) {
        finish_drain(s);
        return;
    }
    uv_timer_start(&s->drain_timer, on_drain_timeout, s->p.drain_timeout_ms, 0);
}

/* The longest prefix of name within n bytes that does not cut a UTF-8 character. */
static size_t utf8_cut(const char *name, size_t n)
{
    size_t len = strlen(name);
    return len <= n ? len : pc_utf8_trim_partial(name, n);
}

/* The address to bind p->listen to: numeric as written; a host name resolved once, here,
 * blocking (startup, before the loop runs), to its first IPv4 address, else its first IPv6
 * one ("localhost" stays 127.0.0.1 where it also resolves to ::1). Returns 0, PC_ERR_INVAL
 * (syntax) or PC_ERR_NOTFOUND (the name does not resolve), with the reason in err. */
static int listen_addr(const char *listen, struct sockaddr_storage *sa, char *err, size_t err_len)
{
    lnk_addr_t a;
    char why[200];
    if (lnk_addr_parse(listen, LNK_ADDR_PORT_ZERO, &a, why, sizeof why) != 0)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "bad listen address: %s", why);
    if (a.kind != LNK_ADDR_NAME) {
        *sa = a.sa;
        return 0;
    }
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_protocol = IPPROTO_TCP;
    hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
    char port[8];
    snprintf(port, sizeof port, "%u", (unsigned)a.port);
    int rc = getaddrinfo(a.host, port, &hints, &res);
    if (rc != 0)
        return pc_err_setf(err, err_len, PC_ERR_NOTFOUND, "cannot resolve listen host '%s': %s",
                           a.host, gai_strerror(rc));
    const struct addrinfo *pick = NULL;
    for (const struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET && ai->ai_addrlen >= sizeof(struct sockaddr_in)) {
            pick = ai;
            break;
        }
        if (pick == NULL && ai->ai_family == AF_INET6 &&
            ai->ai_addrlen >= sizeof(struct sockaddr_in6))
            pick = ai;
    }
    if (pick == NULL) {
        freeaddrinfo(res);
        return pc_err_setf(err, err_len, PC_ERR_NOTFOUND,
                           "listen host '%s' has no IPv4 or IPv6 address", a.host);
    }
    memset(sa, 0, sizeof *sa);
    memcpy(sa, pick->ai_addr,
           pick->ai_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6));
    freeaddrinfo(res);
    return 0;
}

int lnk_worker_server_init(uv_loop_t *loop, const lnk_worker_server_params_t *p,
                           const eng_worker_params_t *wp, lnk_worker_server_t **out, char *err,
                           size_t err_len)
{
    *out = NULL;
    if (p->secret_len > 0 &&
        (p->secret == NULL || p->secret_len < LNK_SECRET_MIN || p->secret_len > LNK_SECRET_MAX)) {
        snprintf(err, err_len, "the link secret must have %d..%d bytes", LNK_SECRET_MIN,
                 LNK_SECRET_MAX);
        return PC_ERR_INVAL;
    }
    if (p->heartbeat_ms == 0 || p->heartbeat_ms > MAX_PEER_HEARTBEAT_MS ||
        p->max_frame < MIN_PEER_FRAME || p->max_conns == 0 || p->max_pending == 0 ||
        p->handshake_timeout_ms == 0) {
        snprintf(err, err_len,
                 "bad server parameters (heartbeat_ms 1..%u, max_frame >= %u, "
                 "max_conns, max_pending and handshake_timeout_ms >= 1)",
                 MAX_PEER_HEARTBEAT_MS, MIN_PEER_FRAME);
        return PC_ERR_INVAL;
    }
    struct sockaddr_storage sa;
    int rc = listen_addr(p->listen, &sa, err, err_len);
    if (rc != 0)
        return rc;
    lnk_worker_server_t *s = pc_xcalloc(1, sizeof *s);
    s->loop = loop;
    s->p = *p;
    s->p.listen = NULL; /* not kept: the caller's string */
    s->p.node = NULL;
    s->p.secret = NULL; /* copied below */
    if (p->secret_len > 0) {
        memcpy(s->secret, p->secret, p->secret_len);
        s->secret_len = p->secret_len;
        if (sodium_init() < 0) {
            snprintf(err, err_len, "libsodium cannot initialize");
            pc_free(s);
            return PC_ERR_INTERNAL;
        }
    }
    if (p->node != NULL)
        snprintf(s->node, sizeof s->node, "%s", p->node);
    else if (gethostname(s->node, sizeof s->node - 1) != 0)
        snprintf(s->node, sizeof s->node, "worker");
    s->node[utf8_cut(s->node, ENG_WIRE_NAME_MAX)] = '\0';
    pthread_mutex_init(&s->wake_mu, NULL);

    eng_worker_params_t w = *wp;
    w.wake = on_wake;
    w.wake_ud = s;
    rc = eng_worker_init(&w, &s->worker, err, err_len);
    if (rc != 0) {
        pthread_mutex_destroy(&s->wake_mu);
        pc_free(s);
        return rc;
    }
    eng_worker_info(s->worker, &s->info);
    s->model_name_len = utf8_cut(s->info.model_name, ENG_WIRE_NAME_MAX);

    /* From here on a failure closes the handles and frees s at the last close callback. */
    uv_async_init(loop, &s->async, on_async);
    uv_timer_init(loop, &s->drain_timer);
    uv_tcp_init(loop, &s->listener);
    s->async.data = s->drain_timer.data = s->listener.data = s;
    s->n_open = 3;
    pthread_mutex_lock(&s->wake_mu);
    s->wake_open = true;
    pthread_mutex_unlock(&s->wake_mu);

    char where[80];
    lnk_wconn_format_addr((struct sockaddr *)&sa, where, sizeof where);
    if ((rc = uv_tcp_bind(&s->listener, (struct sockaddr *)&sa, 0)) != 0 ||
        (rc = uv_listen((uv_stream_t *)&s->listener, 128, on_connection)) != 0) {
        snprintf(err, err_len, "cannot listen on %s: %s", where, uv_strerror(rc));
        goto fail;
    }
    int len = sizeof sa;
    if ((rc = uv_tcp_getsockname(&s->listener, (struct sockaddr *)&sa, &len)) != 0) {
        snprintf(err, err_len, "getsockname: %s", uv_strerror(rc));
        goto fail;
    }
    lnk_wconn_format_addr((struct sockaddr *)&sa, s->addr, sizeof s->addr);
    s->port = sa.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&sa)->sin_port)
                                      : ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
    s->state = SRV_RUNNING;
    PC_LOG(PC_LOG_INFO, "worker", "listening on %s: model '%s' (fp %016llx, n_vocab %u, n_ctx %u)",
           s->addr, s->info.model_name, (unsigned long long)s->info.model_fp, s->info.n_vocab,
           s->info.n_ctx);
    *out = s;
    return 0;

fail:
    s->state = SRV_CLOSING;
    s->free_when_closed = true;
    uv_close((uv_handle_t *)&s->listener, on_server_handle_closed);
    uv_close((uv_handle_t *)&s->drain_timer, on_server_handle_closed);
    free_worker(s); /* idle: nothing was submitted */
    return PC_ERR_IO;
}

const char *lnk_worker_server_address(const lnk_worker_server_t *s)
{
    return s->addr;
}

uint16_t lnk_worker_server_port(const lnk_worker_server_t *s)
{
    return s->port;
}

eng_worker_t *lnk_worker_server_worker(lnk_worker_server_t *s)
{
    return s->worker;
}

void lnk_worker_server_stats(const lnk_worker_server_t *s, lnk_worker_server_stats_t *out)
{
    *out = s->st;
}

void lnk_worker_server_free(lnk_worker_server_t *s)
{
    if (s == NULL)
        return;
    PC_ASSERT(s->state == SRV_CLOSED);
    for (size_t i = pc_u64map_next(&s->reqs, 0); i < s->reqs.cap;
         i = pc_u64map_next(&s->reqs, i + 1))
        pc_free(s->reqs.slots[i].value);
    pc_u64map_free(&s->reqs);
    pthread_mutex_destroy(&s->wake_mu);
    sodium_memzero(s->secret, sizeof s->secret);
    pc_free(s);
}
