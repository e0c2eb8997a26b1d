/*
 * worker_client.c — the gateway's TCP link to a worker (contract in worker_client.h).
 *
 * Connecting. A numeric address goes straight to uv_tcp_connect. A host name is resolved first
 * (uv_getaddrinfo on libuv's thread pool, never on the loop), afresh at every connect, and the
 * addresses come back in the resolver's order (RFC 6724: IPv6 and IPv4 as the host prefers);
 * each is tried in turn until one accepts TCP. A failed TCP connect leaves its socket unusable,
 * so trying the next address closes the connection's handles and, in on_closed, initializes
 * them again on the same memory (c->w is embedded, both handles are closed at that point).
 * Only TCP-level failures move on to the next address: a worker that answers and then refuses
 * the handshake ends the attempt.
 *
 * The whole attempt (resolve, every TCP connect, the handshake) is bounded by
 * connect_timeout_ms, the contract of the parameters. So that a first address that drops SYNs
 * does not eat the whole budget, each TCP connect gets an equal share of what is left for the
 * addresses still untried.
 *
 * A resolution in flight holds the client: when the connection's handles close first (a
 * timeout, lnk_worker_client_close), the request is canceled and on_close waits for its
 * callback, which runs in every case (UV_EAI_CANCELED when the cancel won).
 */
#include "worker_client.h"

#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "lnk_addr.h"
#include "wire_conn.h"
#include "worker_client_internal.h"
#include "worker_server.h" /* LNK_SECRET_MIN, LNK_SECRET_MAX */

#define MIN_PEER_FRAME (16u << 10)
#define MAX_PEER_HEARTBEAT_MS 600000u
/* The most resolved addresses tried per attempt (a DNS round-robin name rarely has more). */
#define MAX_ADDRS 16

struct lnk_worker_client {
    lnk_worker_client_params_t p; /* strings point into the buffers below */
    char node[ENG_WIRE_NAME_MAX + 1];
    char model_name[ENG_WIRE_NAME_MAX + 1];
    char address[LNK_ADDR_MAX];
    lnk_addr_t addr; /* address, parsed */
    lnk_worker_client_cbs_t cbs;
    void *ud;
    uv_loop_t *loop;
    uv_connect_t connect;
    uv_getaddrinfo_t gai;
    bool resolving;     /* gai in flight: the client lives until its callback */
    bool handles_gone;  /* on_closed ran while resolving: finish in the resolver's callback */
    bool user_closed;   /* lnk_worker_client_close was called */
    bool tcp_connected; /* the current address accepted TCP */
    struct sockaddr_storage addrs[MAX_ADDRS];
    size_t n_addrs, next_addr;
    uint64_t deadline_ms;                 /* uv_now() at which the attempt ends */
    char peer[80];                        /* the address being tried or connected to */
    char tried[LNK_WCONN_REASON_MAX];     /* "ADDR: error; ADDR: error" of failed TCP connects */
    char deadline_why[LNK_ADDR_MAX + 64]; /* lnk_wconn_set_deadline keeps the pointer */
    bool ready;
    bool challenged; /* CHALLENGE answered with AUTH */
    uint8_t gw_nonce[ENG_WIRE_AUTH_BYTES], wk_nonce[ENG_WIRE_AUTH_BYTES];
    uint8_t secret[LNK_SECRET_MAX];
    lnk_wconn_t w; /* last: it ends with the read buffer */
};

lnk_worker_client_params_t lnk_worker_client_params_default(void)
{
    return (lnk_worker_client_params_t){
        .version_min = ENG_WIRE_VERSION,
        .version_max = ENG_WIRE_VERSION,
        .heartbeat_ms = 1000,
        .connect_timeout_ms = 5000,
        .max_frame = ENG_WIRE_MAX_FRAME_DEFAULT,
        .max_queue_bytes = (size_t)64 << 20,
    };
}

/* A REJECT's or connection ERROR's code, if it is one of ours. */
static int peer_code(int32_t code)
{
    return code < 0 && code >= PC_ERR_INTERNAL ? code : PC_ERR_UPSTREAM;
}

static void on_ack(lnk_worker_client_t *c, const eng_wire_hello_t *a)
{
    const lnk_worker_client_params_t *p = &c->p;
    if (a->role != ENG_WIRE_ROLE_WORKER) {
        lnk_wconn_closef(&c->w, PC_ERR_FORMAT, "HELLO_ACK with role %u, not a worker", a->role);
        return;
    }
    if (a->version_min != a->version_max || a->version_min < p->version_min ||
        a->version_min > p->version_max) {
        lnk_wconn_closef(&c->w, PC_ERR_UNSUPPORTED,
                         "the worker picked versions %u..%u, asked %u..%u", a->version_min,
                         a->version_max, p->version_min, p->version_max);
        return;
    }
    if (a->version_min != ENG_WIRE_VERSION) {
        lnk_wconn_closef(&c->w, PC_ERR_UNSUPPORTED,
                         "the worker picked version %u, this side speaks %d", a->version_min,
                         ENG_WIRE_VERSION);
        return;
    }
    if (p->model_name[0] != '\0' && !pc_slice_eq_cstr(a->model_name, p->model_name)) {
        lnk_wconn_closef(&c->w, PC_ERR_INVAL, "the worker serves '%.*s', asked '%s'",
                         (int)a->model_name.len, a->model_name.base, p->model_name);
        return;
    }
    if ((p->model_fp != 0 && a->model_fp != p->model_fp) ||
        (p->n_vocab != 0 && a->n_vocab != p->n_vocab)) {
        lnk_wconn_closef(&c->w, PC_ERR_INVAL,
                         "the worker's model (fp %016llx, n_vocab %u) is not the one asked",
                         (unsigned long long)a->model_fp, a->n_vocab);
        return;
    }
    if (p->secret_len > 0) {
        uint8_t want[ENG_WIRE_AUTH_BYTES];
        if (!c->challenged) {
            lnk_wconn_closef(&c->w, PC_ERR_PERM,
                             "the worker did not ask for the link secret (it has none)");
            return;
        }
        lnk_wire_auth_mac(c->secret, p->secret_len, ENG_WIRE_ROLE_WORKER, c->gw_nonce, c->wk_nonce,
                          want);
        if (!lnk_wire_auth_equal(want, a->auth)) {
            lnk_wconn_closef(&c->w, PC_ERR_PERM, "the worker's proof of the link secret is wrong");
            return;
        }
    }
    if (a->heartbeat_ms == 0 || a->heartbeat_ms > MAX_PEER_HEARTBEAT_MS ||
        a->max_frame < MIN_PEER_FRAME) {
        lnk_wconn_closef(&c->w, PC_ERR_FORMAT, "HELLO_ACK with heartbeat_ms %u, max_frame %u",
                         a->heartbeat_ms, a->max_frame);
        return;
    }
    c->ready = true;
    c->w.max_frame_out = a->max_frame;
    lnk_wconn_set_deadline(&c->w, 0, NULL);
    lnk_wconn_set_heartbeat(&c->w, p->heartbeat_ms, 3 * a->heartbeat_ms);
    if (c->cbs.on_ready)
        c->cbs.on_ready(c, a, c->ud);
}

/* The worker has a link secret: prove ours (AUTH), keep its nonce for its proof. */
static void on_challenge(lnk_worker_client_t *c, const uint8_t nonce[ENG_WIRE_AUTH_BYTES])
{
    if (c->p.secret_len == 0) {
        lnk_wconn_closef(&c->w, PC_ERR_PERM,
                         "the worker requires a link secret and none is configured");
        return;
    }
    c->challenged = true;
    memcpy(c->wk_nonce, nonce, ENG_WIRE_AUTH_BYTES);
    eng_wire_frame_t f = {.type = ENG_WIRE_AUTH};
    lnk_wire_auth_mac(c->secret, c->p.secret_len, ENG_WIRE_ROLE_GATEWAY, c->gw_nonce, c->wk_nonce,
                      f.u.auth.bytes);
    if (lnk_wconn_send(&c->w, &f) != 0)
        return;
    /* AUTH goes out as is; everything after it, both ways, is sealed (wire_seal.h). */
    lnk_seal_t gw_to_wk, wk_to_gw;
    lnk_seal_derive(c->secret, c->p.secret_len, c->gw_nonce, c->wk_nonce, &gw_to_wk, &wk_to_gw);
    lnk_wconn_seal(&c->w, &gw_to_wk, &wk_to_gw);
    lnk_seal_wipe(&gw_to_wk);
    lnk_seal_wipe(&wk_to_gw);
    lnk_wconn_flush(&c->w);
}

static void on_frame(lnk_wconn_t *w, const eng_wire_frame_t *f)
{
    lnk_worker_client_t *c = w->data;
    if (f->type == ENG_WIRE_REJECT || (f->type == ENG_WIRE_ERROR && f->u.error.request_id == 0)) {
        lnk_wconn_closef(&c->w, peer_code(f->u.error.code), "worker: %.*s",
                         (int)f->u.error.message.len, f->u.error.message.base);
        return;
    }
    if (!c->ready) {
        if (f->type == ENG_WIRE_HELLO_ACK)
            on_ack(c, &f->u.hello);
        else if (f->type == ENG_WIRE_CHALLENGE && !c->challenged)
            on_challenge(c, f->u.auth.bytes);
        else
            lnk_wconn_closef(&c->w, PC_ERR_FORMAT, "expected HELLO_ACK, got %s",
                             eng_wire_type_name(f->type));
        return;
    }
    switch (f->type) {
    case ENG_WIRE_TOKEN:
    case ENG_WIRE_PREFILL:
    case ENG_WIRE_DONE:
    case ENG_WIRE_ERROR:
    case ENG_WIRE_KV_EVENT:
    case ENG_WIRE_LOAD:
    case ENG_WIRE_HEARTBEAT:
    case ENG_WIRE_SNAPSHOT:
        if (c->cbs.on_frame)
            c->cbs.on_frame(c, f, c->ud);
        return;
    default:
        lnk_wconn_closef(&c->w, PC_ERR_FORMAT, "%s is not a frame a worker sends",
                         eng_wire_type_name(f->type));
        return;
    }
}

/* Reports the end to the owner and frees the client. */
static void finish(lnk_worker_client_t *c, int err, const char *reason)
{
    if (c->cbs.on_close)
        c->cbs.on_close(c, err, reason, c->ud);
    sodium_memzero(c->secret, sizeof c->secret);
    pc_free(c);
}

/* Appends "what" to c->tried ("; " between entries, truncated at the buffer's end). */
static void note_tried(lnk_worker_client_t *c, const char *what)
{
    size_t n = strlen(c->tried);
    snprintf(c->tried + n, sizeof c->tried - n, "%s%s", n ? "; " : "", what);
}

static void try_next(lnk_worker_client_t *c);
static const lnk_wconn_ops_t client_ops;

static void on_closed(lnk_wconn_t *w)
{
    lnk_worker_client_t *c = w->data;
    uint64_t now = uv_now(c->loop);
    bool connect_phase = !c->user_closed && !c->tcp_connected && !c->resolving;
    if (connect_phase && c->n_addrs > 0 && w->close_err == PC_ERR_TIMEOUT) {
        char what[160];
        snprintf(what, sizeof what, "%s: timed out", c->peer);
        note_tried(c, what);
    }
    if (connect_phase && c->next_addr < c->n_addrs && now < c->deadline_ms &&
        (w->close_err == PC_ERR_IO || w->close_err == PC_ERR_TIMEOUT)) {
        /* The next address, on fresh handles in the same memory (both closed now). */
        int rc =
            lnk_wconn_init(c->loop, &c->w, &client_ops, c, c->p.max_frame, c->p.max_queue_bytes);
        if (rc == 0) {
            try_next(c);
            return;
        }
        char why[LNK_WCONN_REASON_MAX];
        snprintf(why, sizeof why, "cannot set up a connection: %s", pc_strerror(rc));
        finish(c, rc, why);
        return;
    }
    if (c->resolving) {
        c->handles_gone = true;
        uv_cancel((uv_req_t *)&c->gai);
        return;
    }
    if (connect_phase && c->addr.kind == LNK_ADDR_NAME && c->tried[0] != '\0') {
        char why[LNK_ADDR_MAX + LNK_WCONN_REASON_MAX + 16];
        snprintf(why, sizeof why, "connect to %s: %s", c->address, c->tried);
        finish(c, w->close_err, why);
        return;
    }
    if (c->challenged && !c->ready && w->close_err == PC_ERR_CLOSED) {
        /* A worker says nothing to a peer that failed to prove the secret. */
        finish(c, PC_ERR_PERM,
               "link authentication failed: the worker closed the link after our AUTH (the "
               "link secrets differ; the worker's log says why)");
        return;
    }
    finish(c, w->close_err, w->close_reason);
}

static const lnk_wconn_ops_t client_ops = {.on_frame = on_frame, .on_closed = on_closed};

/* TCP to c->peer failed with a libuv status: note it, close; on_closed tries the next one. */
static void connect_failed(lnk_worker_client_t *c, int status)
{
    if (c->addr.kind != LNK_ADDR_NAME) {
        lnk_wconn_closef(&c->w, PC_ERR_IO, "connect to %s: %s", c->address, uv_strerror(status));
        return;
    }
    char what[160];
    snprintf(what, sizeof what, "%s: %s", c->peer, uv_strerror(status));
    note_tried(c, what);
    PC_LOG(PC_LOG_DEBUG, "link", "worker %s: connect to %s: %s", c->address, c->peer,
           uv_strerror(status));
    lnk_wconn_closef(&c->w, PC_ERR_IO, "connect to %s: %s", c->address, what);
}

static void on_connect(uv_connect_t *req, int status)
{
    lnk_worker_client_t *c = req->data;
    if (status == UV_ECANCELED || c->w.state != LNK_WCONN_IDLE)
        return; /* closing already */
    if (status < 0) {
        connect_failed(c, status);
        return;
    }
    c->tcp_connected = true;
    uint64_t now = uv_now(c->loop);
    lnk_wconn_set_deadline(&c->w, c->deadline_ms > now ? (uint32_t)(c->deadline_ms - now) : 1,
                           "no handshake with the worker before the connect timeout");
    if (lnk_wconn_start(&c->w) != 0)
        return;
    eng_wire_frame_t f = {.type = ENG_WIRE_HELLO};
    eng_wire_hello_t *h = &f.u.hello;
    h->version_min = c->p.version_min;
    h->version_max = c->p.version_max;
    h->role = ENG_WIRE_ROLE_GATEWAY;
    h->heartbeat_ms = c->p.heartbeat_ms;
    h->max_frame = c->p.max_frame;
    h->node = pc_slice_cstr(c->node);
    h->model_name = pc_slice_cstr(c->model_name);
    h->model_fp = c->p.model_fp;
    h->n_vocab = c->p.n_vocab;
    memcpy(h->auth, c->gw_nonce, ENG_WIRE_AUTH_BYTES);
    if (lnk_wconn_send(&c->w, &f) != 0) {
        lnk_wconn_closef(&c->w, PC_ERR_INVAL, "cannot encode HELLO");
        return;
    }
    lnk_wconn_flush(&c->w);
}

/* Connects to the next untried address, with its share of the time left. */
static void try_next(lnk_worker_client_t *c)
{
    uint64_t now = uv_now(c->loop);
    if (now >= c->deadline_ms) {
        lnk_wconn_close(&c->w, PC_ERR_TIMEOUT,
                        "no handshake with the worker before the connect timeout", false);
        return;
    }
    uint64_t left_ms = c->deadline_ms - now;
    uint64_t share_ms = left_ms / (c->n_addrs - c->next_addr);
    const struct sockaddr *sa = (const struct sockaddr *)&c->addrs[c->next_addr++];
    lnk_wconn_format_addr(sa, c->peer, sizeof c->peer);
    c->tcp_connected = false;
    int rc = uv_tcp_connect(&c->connect, &c->w.tcp, sa, on_connect);
    if (rc != 0) {
        connect_failed(c, rc);
        return;
    }
    if (share_ms < left_ms) {
        snprintf(c->deadline_why, sizeof c->deadline_why, "connect to %s timed out", c->peer);
        lnk_wconn_set_deadline(&c->w, (uint32_t)PC_MAX(share_ms, 1), c->deadline_why);
    } else {
        lnk_wconn_set_deadline(&c->w, (uint32_t)left_ms,
                               "no handshake with the worker before the connect timeout");
    }
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    lnk_worker_client_t *c = req->data;
    c->resolving = false;
    if (c->handles_gone) { /* closed while resolving: report why now */
        if (res != NULL)
            uv_freeaddrinfo(res);
        finish(c, c->w.close_err, c->w.close_reason);
        return;
    }
    if (c->w.state != LNK_WCONN_IDLE) { /* closing: on_closed finishes */
        if (res != NULL)
            uv_freeaddrinfo(res);
        return;
    }
    if (status < 0) {
        lnk_wconn_closef(&c->w, PC_ERR_NOTFOUND, "cannot resolve worker host '%s': %s",
                         c->addr.host, uv_strerror(status));
        return;
    }
    for (const struct addrinfo *ai = res; ai != NULL && c->n_addrs < MAX_ADDRS; ai = ai->ai_next) {
        size_t len = ai->ai_family == AF_INET    ? sizeof(struct sockaddr_in)
                     : ai->ai_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                 : 0;
        if (len == 0 || ai->ai_addrlen < len)
            continue;
        struct sockaddr_storage sa = {0};
        memcpy(&sa, ai->ai_addr, len);
        bool dup = false;
        for (size_t i = 0; i < c->n_addrs && !dup; i++)
            dup = memcmp(&c->addrs[i], &sa, sizeof sa) == 0;
        if (!dup)
            c->addrs[c->n_addrs++] = sa;
    }
    uv_freeaddrinfo(res);
    if (c->n_addrs == 0) {
        lnk_wconn_closef(&c->w, PC_ERR_NOTFOUND, "worker host '%s' has no IPv4 or IPv6 address",
                         c->addr.host);
        return;
    }
    try_next(c);
}

/* Resolves c->addr.host; on_resolved continues. Fresh at every connect: nothing is cached, so
 * a worker that came back with another address is found at the next attempt. */
static void start_resolve(lnk_worker_client_t *c)
{
    struct addrinfo hints = {0};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_protocol = IPPROTO_TCP;
    hints.ai_flags = AI_NUMERICSERV;
    char port[8];
    snprintf(port, sizeof port, "%u", (unsigned)c->addr.port);
    snprintf(c->peer, sizeof c->peer, "%s", "");
    int rc = uv_getaddrinfo(c->loop, &c->gai, on_resolved, c->addr.host, port, &hints);
    if (rc != 0) {
        lnk_wconn_closef(&c->w, PC_ERR_NOTFOUND, "cannot resolve worker host '%s': %s",
                         c->addr.host, uv_strerror(rc));
        return;
    }
    c->resolving = true;
    snprintf(c->deadline_why, sizeof c->deadline_why,
             "resolving worker host '%s' took longer than the connect timeout", c->addr.host);
    lnk_wconn_set_deadline(&c->w, c->p.connect_timeout_ms, c->deadline_why);
}

static int connect_common(uv_loop_t *loop, const lnk_worker_client_params_t *p,
                          const struct sockaddr_storage *given, size_t n_given,
                          const lnk_worker_client_cbs_t *cbs, void *ud, lnk_worker_client_t **out,
                          char *err, size_t err_len);

int lnk_worker_client_connect(uv_loop_t *loop, const lnk_worker_client_params_t *p,
                              const lnk_worker_client_cbs_t *cbs, void *ud,
                              lnk_worker_client_t **out, char *err, size_t err_len)
{
    return connect_common(loop, p, NULL, 0, cbs, ud, out, err, err_len);
}

int lnk__worker_client_connect_addrs(uv_loop_t *loop, const lnk_worker_client_params_t *p,
                                     const struct sockaddr_storage *addrs, size_t n_addrs,
                                     const lnk_worker_client_cbs_t *cbs, void *ud,
                                     lnk_worker_client_t **out, char *err, size_t err_len)
{
    *out = NULL;
    if (addrs == NULL || n_addrs == 0 || n_addrs > MAX_ADDRS)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "1..%d addresses", MAX_ADDRS);
    return connect_common(loop, p, addrs, n_addrs, cbs, ud, out, err, err_len);
}

static int connect_common(uv_loop_t *loop, const lnk_worker_client_params_t *p,
                          const struct sockaddr_storage *given, size_t n_given,
                          const lnk_worker_client_cbs_t *cbs, void *ud, lnk_worker_client_t **out,
                          char *err, size_t err_len)
{
    *out = NULL;
    lnk_addr_t addr;
    char why[200];
    if (lnk_addr_parse(p->address, 0, &addr, why, sizeof why) != 0) {
        snprintf(err, err_len, "bad worker address: %s", why);
        return PC_ERR_INVAL;
    }
    if (given != NULL)
        addr.kind = LNK_ADDR_NAME; /* as if p->address had resolved to given */
    const char *node = p->node ? p->node : "gateway";
    const char *model = p->model_name ? p->model_name : "";
    if (strlen(node) > ENG_WIRE_NAME_MAX || strlen(model) > ENG_WIRE_NAME_MAX ||
        p->version_min == 0 || p->version_min > p->version_max || p->heartbeat_ms == 0 ||
        p->heartbeat_ms > MAX_PEER_HEARTBEAT_MS || p->max_frame < MIN_PEER_FRAME ||
        p->connect_timeout_ms == 0 ||
        (p->secret_len > 0 &&
         (p->secret == NULL || p->secret_len < LNK_SECRET_MIN || p->secret_len > LNK_SECRET_MAX))) {
        snprintf(err, err_len,
                 "bad worker client parameters (names of at most %d bytes, "
                 "version range, heartbeat_ms 1..%u, max_frame >= %u, a secret of %d..%d "
                 "bytes)",
                 ENG_WIRE_NAME_MAX, MAX_PEER_HEARTBEAT_MS, MIN_PEER_FRAME, LNK_SECRET_MIN,
                 LNK_SECRET_MAX);
        return PC_ERR_INVAL;
    }
    lnk_worker_client_t *c = pc_malloc(sizeof *c);
    if (c == NULL)
        return PC_ERR_NOMEM;
    memset(c, 0, offsetof(lnk_worker_client_t, w));
    c->p = *p;
    c->addr = addr;
    c->loop = loop;
    snprintf(c->node, sizeof c->node, "%s", node);
    snprintf(c->model_name, sizeof c->model_name, "%s", model);
    snprintf(c->address, sizeof c->address, "%s", p->address);
    c->p.node = c->node;
    c->p.model_name = c->model_name;
    c->p.address = c->address;
    c->p.secret = NULL; /* copied: */
    if (p->secret_len > 0)
        memcpy(c->secret, p->secret, p->secret_len);
    lnk_wire_nonce(c->gw_nonce);
    if (cbs)
        c->cbs = *cbs;
    c->ud = ud;
    int rc = lnk_wconn_init(loop, &c->w, &client_ops, c, p->max_frame, p->max_queue_bytes);
    if (rc != 0) {
        pc_free(c);
        snprintf(err, err_len, "cannot set up a connection: %s", pc_strerror(rc));
        return rc;
    }
    c->connect.data = c;
    c->gai.data = c;
    uv_update_time(loop); /* the loop's clock may be stale here: the timeout starts now */
    c->deadline_ms = uv_now(loop) + p->connect_timeout_ms;
    *out = c;
    /* From here on every failure closes the handles and on_close reports it. */
    if (given != NULL) {
        memcpy(c->addrs, given, n_given * sizeof *given);
        c->n_addrs = n_given;
        try_next(c);
        return 0;
    }
    if (addr.kind != LNK_ADDR_NAME) {
        c->addrs[0] = addr.sa;
        c->n_addrs = 1;
        try_next(c);
        return 0;
    }
    start_resolve(c);
    return 0;
}

static int send_frame(lnk_worker_client_t *c, const eng_wire_frame_t *f)
{
    if (!c->ready || !lnk_wconn_is_open(&c->w))
        return PC_ERR_STATE;
    int rc = lnk_wconn_send(&c->w, f);
    if (rc == 0)
        rc = lnk_wconn_flush(&c->w);
    return rc;
}

int lnk_worker_client_submit(lnk_worker_client_t *c, const eng_wire_submit_t *req)
{
    eng_wire_frame_t f = {.type = ENG_WIRE_SUBMIT};
    f.u.submit = *req;
    return send_frame(c, &f);
}

int lnk_worker_client_cancel(lnk_worker_client_t *c, uint64_t request_id)
{
    eng_wire_frame_t f = {.type = ENG_WIRE_CANCEL};
    f.u.cancel_id = request_id;
    return send_frame(c, &f);
}

int lnk_worker_client_release(lnk_worker_client_t *c, uint64_t ns, const uint32_t *tokens,
                              uint32_t n_tokens)
{
    eng_wire_frame_t f = {.type = ENG_WIRE_RELEASE};
    f.u.release = (eng_wire_release_t){.ns = ns, .tokens = tokens, .n_tokens = n_tokens};
    return send_frame(c, &f);
}

int lnk_worker_client_drop(lnk_worker_client_t *c, uint64_t ns)
{
    eng_wire_frame_t f = {.type = ENG_WIRE_DROP};
    f.u.release.ns = ns;
    return send_frame(c, &f);
}

int lnk_worker_client_ping(lnk_worker_client_t *c)
{
    eng_wire_frame_t f = {.type = ENG_WIRE_HEARTBEAT};
    f.u.heartbeat_ms = uv_now(c->w.tcp.loop);
    return send_frame(c, &f);
}

int lnk_worker_client_send_raw(lnk_worker_client_t *c, const void *bytes, size_t len)
{
    if (!c->ready || !lnk_wconn_is_open(&c->w))
        return PC_ERR_STATE;
    int rc = lnk_wconn_send_raw(&c->w, bytes, len);
    if (rc == 0)
        rc = lnk_wconn_flush(&c->w);
    return rc;
}

void lnk_worker_client_close(lnk_worker_client_t *c)
{
    c->user_closed = true;
    lnk_wconn_close(&c->w, 0, "", true);
}

const char *lnk_worker_client_peer(const lnk_worker_client_t *c)
{
    return c->peer;
}

void *lnk_worker_client_data(const lnk_worker_client_t *c)
{
    return c->ud;
}
