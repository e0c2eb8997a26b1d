/*
 * http.c — the HTTP/1.1 server: accept, parse (llhttp, strict), dispatch, respond in order.
 *
 * Invariants:
 *   - a connection's requests form a FIFO queue (q_head .. q_tail) of complete requests in
 *     arrival order; the one being parsed is c->cur and joins the queue when complete (or when
 *     it turns into a protocol error response). Only the queue head writes to the socket; any
 *     other request's response bytes wait in its `held` buffer. A head whose response ended is
 *     popped at once (its bytes belong to the uv_write requests from then on), so popping never
 *     waits for the socket;
 *   - llhttp is paused in on_message_complete, so user code (on_request) never runs inside
 *     llhttp_execute; bytes after the pause point stay in c->pending when parsing must stop
 *     (pipeline full), and reading is stopped while c->pending holds anything;
 *   - no connection memory is freed before both of its handles' close callbacks ran; user
 *     callbacks (on_request, on_abort, on_drain) are only called from loop callbacks, never from
 *     inside a gw_http_* call, so a handler may call any gw_http_* function from them;
 *   - c->no_more: no more requests are parsed on the connection (an error, Connection: close,
 *     HTTP/1.0, an upgrade, shutdown, a probation connection's one request). Once nothing is
 *     queued and every byte is written, the write side is shut down and the connection lingers
 *     (reading and discarding) until the client's EOF or linger_ms, so the client reads the
 *     last response instead of a reset;
 *   - c->out_paused: the unsent output (bytes_writing + held_bytes) reached stream_high_water;
 *     nothing is parsed and reading is stopped until on_write brings it below half of that;
 *   - slots: every served connection counts in s->n_untrusted and its peer's entry until it is
 *     trusted or closes (c->slot_counted); a probation connection sits in the server's
 *     probation list (oldest first) until its first request is dispatched, it is trusted, or it
 *     closes: only listed connections are evicted.
 */
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <llhttp.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

#define HTTP_READ_BYTES (64u << 10)
#define HTTP_HEADER_OVERHEAD 4 /* ": " and CRLF per header field, counted against the limit */
#define HTTP_PEER_BUCKETS 4096 /* per-peer connection counts: hash buckets */
#define HTTP_REQ_ID_LEN 32     /* "req_" + 24 hex digits + NUL, as serve.c's request ids */

typedef struct conn conn_t;

enum req_phase { RQ_HEADERS = 0, RQ_BODY, RQ_COMPLETE };
enum resp_state { RS_NONE = 0, RS_STREAMING, RS_ENDED };
enum timer_kind { TK_NONE = 0, TK_FIRST, TK_IDLE, TK_HEADER, TK_BODY, TK_LINGER, TK_SEND };

/* How many untrusted connections one client address holds (IPv4, or an IPv6 /64). */
typedef struct peer {
    struct peer *next;
    uint8_t addr[16];
    uint32_t n;
} peer_t;

typedef struct hdr_off {
    uint32_t name, value; /* offsets into req->hdr */
} hdr_off_t;

struct gw_http_req {
    conn_t *c;
    gw_http_req_t *next;
    uint8_t phase, resp;
    uint8_t minor;
    bool dispatched, is_error, aborted, keep_alive, is_head, want_continue;
    bool field_open, chunked_out, drain_armed;
    uint64_t start_ms;
    uint64_t header_due_ms; /* deadline of the headers */
    uint64_t body_start_ms; /* the body's grace runs from here */
    char method[24];
    pc_buf_t url;      /* after the headers: "path\0query\0" */
    size_t query_off;  /* offset of the query in url */
    pc_buf_t hdr;      /* "name\0value\0" per field */
    hdr_off_t *hoff;   /* [n_h] */
    size_t n_h, cap_h; /* trailer fields are counted against the limits, never stored */
    pc_buf_t body;
    pc_buf_t held; /* response bytes waiting behind earlier responses (in c->held_bytes) */
    void *data;
    void (*abort_fn)(gw_http_req_t *r, void *data);
    void (*drain_fn)(gw_http_req_t *r, void *data);
};

struct conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_shutdown_t shut;
    gw_http_server_t *s;
    conn_t *prev, *next;           /* the server's list */
    conn_t *resume_next;           /* the server's resume list */
    conn_t *prob_prev, *prob_next; /* the server's probation list (prob_listed) */
    llhttp_t parser;
    gw_http_req_t *cur; /* being parsed */
    gw_http_req_t *q_head, *q_tail;
    size_t n_q;
    size_t header_bytes; /* of cur */
    pc_buf_t pending;    /* unparsed input (pipeline full) */
    size_t pending_off;
    size_t bytes_writing; /* handed to uv_write, callback not run yet */
    size_t held_bytes;    /* sum of the queued requests' held bytes */
    uint64_t accept_ms;
    uint64_t timer_due_ms;  /* when the armed timer fires */
    uint32_t n_begun;       /* requests begun on the connection */
    const char *parse_base; /* start of the bytes llhttp_execute is running on */
    int n_open;             /* handles not closed yet */
    uint8_t timer_kind;
    gw_http_req_t *timer_req;
    bool refused, no_more, closing, shut_sent, eof, reading, in_parse, resume_listed, oom;
    bool continue_pending;
    bool trusted, probation, prob_listed, slot_counted, out_paused;
    bool tail_lf; /* the last non-blank byte parsed was LF (obs-fold across reads) */
    uint8_t peer_addr[16];
    int err_status; /* set by a parser callback before failing the parse */
    const char *err_type;
    char err_msg[160];
    char peer[64];
};

struct gw_http_server {
    uv_loop_t *loop;
    gw_http_params_t p;
    char *host;
    uv_tcp_t listener;
    uv_timer_t shut_timer;
    uv_idle_t resume_idle;
    int port;
    int n_open; /* the server's own handles not closed yet */
    llhttp_settings_t settings;
    conn_t *conns;
    conn_t *resume_head;
    uint32_t n_refused_open;
    uint32_t reserve; /* reserved_connections, capped at max_connections / 2 */
    conn_t *prob_head, *prob_tail;
    peer_t **peers; /* [HTTP_PEER_BUCKETS] when max_connections_per_peer > 0 */
    uint64_t peer_seed;
    bool shutting_down, handles_closing, free_when_done, done_called, idle_active;
    void (*done)(void *ud);
    void *done_ud;
    gw_http_stats_t st;
    time_t date_sec;
    char date[64];
    char rbuf[HTTP_READ_BYTES];
};

typedef struct wreq {
    uv_write_t w;
    conn_t *c;
    size_t len;
    char data[];
} wreq_t;

static void conn_close(conn_t *c);
static void conn_advance(conn_t *c);
static void conn_check_finish(conn_t *c);
static void conn_update_timer(conn_t *c, int activity);
static void on_resume_idle(uv_idle_t *h);
static bool conn_drain_head(conn_t *c);
static void server_resume_schedule(conn_t *c);

/* Response bytes of the connection not taken by the socket yet. */
static size_t conn_unsent(const conn_t *c)
{
    return c->bytes_writing + c->held_bytes;
}

/* Input paused for output (c->out_paused) goes on once the unsent bytes fell below half the
 * bound: after a write callback, or after answers went out at once (no callback follows). */
static void conn_out_resume(conn_t *c)
{
    if (c->out_paused && !c->closing && conn_unsent(c) < c->s->p.stream_high_water / 2) {
        c->out_paused = false;
        server_resume_schedule(c); /* parses what waits, then reads again */
    }
}

/* What restarts a silence timer: bytes read (the idle timer) or written (the final flush, and
 * the send timer). */
enum { ACT_NONE = 0, ACT_READ = 1, ACT_WRITE = 2 };
static void conn_fail(conn_t *c, int status, const char *type, const char *msg);
static void server_maybe_done(gw_http_server_t *s);

/* ------------------------------------------------------------------------------------------ */
/* Parameters and small helpers */

gw_http_params_t gw_http_params_default(void)
{
    gw_http_params_t p;
    memset(&p, 0, sizeof p);
    p.host = "127.0.0.1";
    p.port = 8080;
    p.max_header_bytes = 60u << 10;
    p.max_headers = 100;
    p.max_body_bytes = 32u << 20;
    p.header_timeout_ms = 10000;
    p.body_timeout_ms = 30000;
    p.body_min_rate = 1024;
    p.idle_timeout_ms = 60000;
    p.max_connections = 10000;
    p.max_pipeline = 16;
    p.stream_high_water = 64u << 10;
    p.linger_ms = 2000;
    return p;
}

const char *gw_http_status_text(int status)
{
    switch (status) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 202:
        return "Accepted";
    case 204:
        return "No Content";
    case 206:
        return "Partial Content";
    case 301:
        return "Moved Permanently";
    case 302:
        return "Found";
    case 304:
        return "Not Modified";
    case 307:
        return "Temporary Redirect";
    case 308:
        return "Permanent Redirect";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 402:
        return "Payment Required";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 406:
        return "Not Acceptable";
    case 408:
        return "Request Timeout";
    case 409:
        return "Conflict";
    case 410:
        return "Gone";
    case 411:
        return "Length Required";
    case 413:
        return "Content Too Large";
    case 414:
        return "URI Too Long";
    case 415:
        return "Unsupported Media Type";
    case 417:
        return "Expectation Failed";
    case 422:
        return "Unprocessable Content";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 499:
        return "Client Closed Request";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    case 505:
        return "HTTP Version Not Supported";
    case 529:
        return "Overloaded";
    default:
        return "Unknown";
    }
}

static const char *server_date(gw_http_server_t *s)
{
    time_t now = time(NULL);
    if (now != s->date_sec) {
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(s->date, sizeof s->date, "Date: %a, %d %b %Y %H:%M:%S GMT\r\n", &tm);
        s->date_sec = now;
    }
    return s->date;
}

/* A request id in serve.c's format: "req_" + 24 hex digits of 12 random bytes. */
static void make_request_id(char out[HTTP_REQ_ID_LEN])
{
    static const char hex[] = "0123456789abcdef";
    static uint64_t fallback;
    uint8_t b[12];
    if (uv_random(NULL, NULL, b, sizeof b, 0, NULL) != 0) {
        /* No entropy source (never on Linux): unique within the process is enough for an id. */
        uint64_t x[2] = {uv_hrtime(), ++fallback};
        memcpy(b, x, sizeof b);
    }
    memcpy(out, "req_", 4);
    for (size_t i = 0; i < sizeof b; i++) {
        out[4 + 2 * i] = hex[b[i] >> 4];
        out[5 + 2 * i] = hex[b[i] & 15];
    }
    out[4 + 2 * sizeof b] = '\0';
}

/* ------------------------------------------------------------------------------------------ */
/* Connection slots: untrusted counts per peer, the probation list */

/* The key a peer is counted under: its IPv4 address (v4-mapped), or its IPv6 /64. */
static void peer_key(const struct sockaddr_storage *sa, uint8_t out[16])
{
    memset(out, 0, 16);
    if (sa->ss_family == AF_INET) {
        out[10] = out[11] = 0xff;
        memcpy(out + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    } else if (sa->ss_family == AF_INET6) {
        static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        memcpy(out, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
        if (memcmp(out, v4mapped, sizeof v4mapped) != 0)
            memset(out + 8, 0, 8); /* one host usually holds a whole /64 */
    }
}

static peer_t **peer_slot(gw_http_server_t *s, const uint8_t a[16])
{
    uint64_t h = s->peer_seed ^ 1469598103934665603ull; /* FNV-1a, seeded per server */
    for (int i = 0; i < 16; i++)
        h = (h ^ a[i]) * 1099511628211ull;
    peer_t **pp = &s->peers[(h ^ (h >> 32)) & (HTTP_PEER_BUCKETS - 1)];
    while (*pp != NULL && memcmp((*pp)->addr, a, 16) != 0)
        pp = &(*pp)->next;
    return pp;
}

static uint32_t peer_count(gw_http_server_t *s, const uint8_t a[16])
{
    peer_t *e = *peer_slot(s, a);
    return e != NULL ? e->n : 0;
}

static int peer_add(gw_http_server_t *s, const uint8_t a[16])
{
    peer_t **pp = peer_slot(s, a);
    if (*pp == NULL) {
        peer_t *e = pc_calloc(1, sizeof *e);
        if (e == NULL)
            return PC_ERR_NOMEM;
        memcpy(e->addr, a, 16);
        *pp = e;
    }
    (*pp)->n++;
    return 0;
}

static void peer_del(gw_http_server_t *s, const uint8_t a[16])
{
    peer_t **pp = peer_slot(s, a), *e = *pp;
    if (e != NULL && --e->n == 0) {
        *pp = e->next;
        pc_free(e);
    }
}

static void prob_unlink(conn_t *c)
{
    gw_http_server_t *s = c->s;
    if (!c->prob_listed)
        return;
    if (c->prob_prev != NULL)
        c->prob_prev->prob_next = c->prob_next;
    else
        s->prob_head = c->prob_next;
    if (c->prob_next != NULL)
        c->prob_next->prob_prev = c->prob_prev;
    else
        s->prob_tail = c->prob_prev;
    c->prob_prev = c->prob_next = NULL;
    c->prob_listed = false;
}

static void prob_append(conn_t *c)
{
    gw_http_server_t *s = c->s;
    c->prob_prev = s->prob_tail;
    c->prob_next = NULL;
    if (s->prob_tail != NULL)
        s->prob_tail->prob_next = c;
    else
        s->prob_head = c;
    s->prob_tail = c;
    c->prob_listed = true;
}

/* The connection leaves the untrusted share (trusted, or closing). */
static void slot_release(conn_t *c)
{
    prob_unlink(c);
    if (!c->slot_counted)
        return;
    c->slot_counted = false;
    c->s->st.conns_untrusted--;
    if (c->s->peers != NULL)
        peer_del(c->s, c->peer_addr);
}

void gw_http_req_set_trusted(gw_http_req_t *r)
{
    conn_t *c = r->c;
    if (c->trusted)
        return;
    c->trusted = true;
    c->probation = false;
    slot_release(c);
}

/* ------------------------------------------------------------------------------------------ */
/* Requests */

static gw_http_req_t *req_new(conn_t *c)
{
    gw_http_req_t *r = pc_calloc(1, sizeof *r);
    if (r == NULL)
        return NULL;
    r->c = c;
    r->start_ms = uv_now(c->s->loop);
    return r;
}

static void req_free(gw_http_req_t *r)
{
    r->c->held_bytes -= r->held.len;
    pc_buf_free(&r->url);
    pc_buf_free(&r->hdr);
    pc_buf_free(&r->body);
    pc_buf_free(&r->held);
    pc_free(r->hoff);
    pc_free(r);
}

static void conn_enqueue(conn_t *c, gw_http_req_t *r)
{
    r->next = NULL;
    if (c->q_tail != NULL)
        c->q_tail->next = r;
    else
        c->q_head = r;
    c->q_tail = r;
    c->n_q++;
}

const char *gw_http_req_method(const gw_http_req_t *r)
{
    return r->method;
}

const char *gw_http_req_path(const gw_http_req_t *r)
{
    return r->url.base != NULL ? r->url.base : "";
}

const char *gw_http_req_query(const gw_http_req_t *r)
{
    return r->url.base != NULL && r->query_off < r->url.len ? r->url.base + r->query_off : "";
}

const char *gw_http_req_header(const gw_http_req_t *r, const char *name)
{
    for (size_t i = 0; i < r->n_h; i++)
        if (strcasecmp(r->hdr.base + r->hoff[i].name, name) == 0)
            return r->hdr.base + r->hoff[i].value;
    return NULL;
}

size_t gw_http_req_header_count(const gw_http_req_t *r)
{
    return r->n_h;
}

gw_http_header_t gw_http_req_header_at(const gw_http_req_t *r, size_t i)
{
    if (i >= r->n_h)
        return (gw_http_header_t){NULL, NULL};
    return (gw_http_header_t){r->hdr.base + r->hoff[i].name, r->hdr.base + r->hoff[i].value};
}

pc_slice_t gw_http_req_body(const gw_http_req_t *r)
{
    return r->body.len > 0 ? pc_slice(r->body.base, r->body.len) : pc_slice("", 0);
}

const char *gw_http_req_peer(const gw_http_req_t *r)
{
    return r->c->peer;
}

int gw_http_req_version_minor(const gw_http_req_t *r)
{
    return r->minor;
}

uint64_t gw_http_req_start_ms(const gw_http_req_t *r)
{
    return r->start_ms;
}

void gw_http_req_set_data(gw_http_req_t *r, void *data)
{
    r->data = data;
}

void *gw_http_req_data(const gw_http_req_t *r)
{
    return r->data;
}

void gw_http_req_on_abort(gw_http_req_t *r, void (*fn)(gw_http_req_t *r, void *data))
{
    r->abort_fn = fn;
}

void gw_http_req_on_drain(gw_http_req_t *r, void (*fn)(gw_http_req_t *r, void *data))
{
    r->drain_fn = fn;
}

/* ------------------------------------------------------------------------------------------ */
/* Writing */

static void on_write(uv_write_t *w, int status)
{
    wreq_t *wr = (wreq_t *)w;
    conn_t *c = wr->c;
    c->bytes_writing -= wr->len;
    pc_free(wr);
    if (c->closing)
        return;
    if (status < 0) {
        conn_close(c);
        return;
    }
    if (!conn_drain_head(c))
        return;
    conn_out_resume(c);
    conn_update_timer(c, ACT_WRITE);
    conn_check_finish(c);
}

/* Writes bufs to the socket: what the kernel takes now directly, the rest copied into one
 * uv_write. Returns 0 or PC_ERR_CLOSED (the connection is closing). */
static int conn_write(conn_t *c, const uv_buf_t *bufs, unsigned nbufs)
{
    if (c->closing || c->shut_sent)
        return PC_ERR_CLOSED;
    size_t total = 0;
    for (unsigned i = 0; i < nbufs; i++)
        total += bufs[i].len;
    if (total == 0)
        return 0;
    size_t done = 0;
    if (c->bytes_writing == 0) {
        int n = uv_try_write((uv_stream_t *)&c->tcp, bufs, nbufs);
        if (n > 0) {
            done = (size_t)n;
        } else if (n < 0 && n != UV_EAGAIN) {
            conn_close(c);
            return PC_ERR_CLOSED;
        }
        if (done == total)
            return 0;
    }
    wreq_t *wr = pc_malloc(sizeof *wr + (total - done));
    if (wr == NULL) {
        conn_close(c);
        return PC_ERR_CLOSED;
    }
    wr->c = c;
    wr->len = total - done;
    size_t skip = done, at = 0;
    for (unsigned i = 0; i < nbufs; i++) {
        size_t l = bufs[i].len;
        if (skip >= l) {
            skip -= l;
            continue;
        }
        memcpy(wr->data + at, bufs[i].base + skip, l - skip);
        at += l - skip;
        skip = 0;
    }
    uv_buf_t b = uv_buf_init(wr->data, (unsigned)wr->len);
    if (uv_write(&wr->w, (uv_stream_t *)&c->tcp, &b, 1, on_write) != 0) {
        pc_free(wr);
        conn_close(c);
        return PC_ERR_CLOSED;
    }
    c->bytes_writing += wr->len;
    return 0;
}

/* Response bytes of r: to the socket when r is the queue head, else held. */
static int req_emit(gw_http_req_t *r, const uv_buf_t *bufs, unsigned nbufs)
{
    conn_t *c = r->c;
    if (c->q_head == r)
        return conn_write(c, bufs, nbufs);
    for (unsigned i = 0; i < nbufs; i++) {
        if (pc_buf_append(&r->held, bufs[i].base, bufs[i].len) != 0) {
            conn_close(c);
            return PC_ERR_CLOSED;
        }
        c->held_bytes += bufs[i].len;
    }
    return 0;
}

static bool header_name_ok(const char *s)
{
    if (s == NULL || *s == '\0')
        return false;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p <= 0x20 || *p >= 0x7f || strchr("()<>@,;:\\\"/[]?={}", *p) != NULL)
            return false;
    return true;
}

static bool header_value_ok(const char *s)
{
    if (s == NULL)
        return false;
    for (const char *p = s; *p; p++)
        if (*p == '\r' || *p == '\n')
            return false;
    return true;
}

static bool header_is_framing(const char *name)
{
    return strcasecmp(name, "content-length") == 0 || strcasecmp(name, "transfer-encoding") == 0 ||
           strcasecmp(name, "connection") == 0;
}

/* Whether the connection closes after r's response: the client asked for it, or nothing
 * more is read on the connection and r is the last request. */
static bool req_closes(const gw_http_req_t *r)
{
    const conn_t *c = r->c;
    return !r->keep_alive || (c->no_more && c->cur == NULL && c->q_tail == r) ||
           (c->probation && !c->trusted);
}

/* Builds the status line and headers into out. streaming: chunked (or close-delimited for
 * HTTP/1.0); else Content-Length: len. */
static int build_head(gw_http_req_t *r, int status, const gw_http_header_t *h, size_t n_h,
                      bool streaming, size_t len, pc_buf_t *out)
{
    if (status < 200 || status > 599)
        return PC_ERR_INVAL;
    for (size_t i = 0; i < n_h; i++)
        if (!header_name_ok(h[i].name) || !header_value_ok(h[i].value))
            return PC_ERR_INVAL;
    gw_http_server_t *s = r->c->s;
    int rc = pc_buf_printf(out, "HTTP/1.1 %d %s\r\n", status, gw_http_status_text(status));
    rc |= pc_buf_append_cstr(out, server_date(s));
    for (size_t i = 0; i < n_h; i++) {
        if (header_is_framing(h[i].name))
            continue;
        rc |= pc_buf_append_cstr(out, h[i].name);
        rc |= pc_buf_append(out, ": ", 2);
        rc |= pc_buf_append_cstr(out, h[i].value);
        rc |= pc_buf_append(out, "\r\n", 2);
    }
    if (streaming) {
        if (r->minor >= 1)
            rc |= pc_buf_append_cstr(out, "Transfer-Encoding: chunked\r\n");
    } else if (status != 204 && status != 304) {
        rc |= pc_buf_printf(out, "Content-Length: %zu\r\n", len);
    }
    if (req_closes(r))
        rc |= pc_buf_append_cstr(out, "Connection: close\r\n");
    rc |= pc_buf_append(out, "\r\n", 2);
    return rc != 0 ? PC_ERR_NOMEM : 0;
}

/* Whether r may take its next response call, which needs the response in state want:
 * PC_ERR_CLOSED (the client or the connection went away), PC_ERR_STATE or 0. */
static int req_check(const gw_http_req_t *r, enum resp_state want)
{
    if (r->aborted || r->c->closing || r->c->shut_sent)
        return PC_ERR_CLOSED;
    return r->resp == want ? 0 : PC_ERR_STATE;
}

/* The whole response, for handler requests and the server's own error responses. */
static int req_respond(gw_http_req_t *r, int status, const gw_http_header_t *h, size_t n_h,
                       const void *body, size_t len)
{
    int rc = req_check(r, RS_NONE);
    if (rc != 0)
        return rc;
    pc_buf_t head = PC_BUF_INIT;
    rc = build_head(r, status, h, n_h, false, len, &head);
    if (rc != 0) {
        pc_buf_free(&head);
        return rc;
    }
    bool no_body = r->is_head || status == 204 || status == 304;
    uv_buf_t bufs[2] = {uv_buf_init(head.base, (unsigned)head.len),
                        uv_buf_init((char *)(body != NULL ? body : ""), (unsigned)len)};
    rc = req_emit(r, bufs, no_body || len == 0 ? 1 : 2);
    pc_buf_free(&head);
    if (rc != 0)
        return rc;
    r->resp = RS_ENDED;
    conn_advance(r->c);
    return 0;
}

int gw_http_respond(gw_http_req_t *r, int status, const gw_http_header_t *h, size_t n_h,
                    const void *body, size_t len)
{
    if (r == NULL || (n_h > 0 && h == NULL) || (len > 0 && body == NULL))
        return PC_ERR_INVAL;
    return req_respond(r, status, h, n_h, body, len);
}

int gw_http_stream_begin(gw_http_req_t *r, int status, const gw_http_header_t *h, size_t n_h)
{
    if (r == NULL || (n_h > 0 && h == NULL))
        return PC_ERR_INVAL;
    int rc = req_check(r, RS_NONE);
    if (rc != 0)
        return rc;
    if (r->minor == 0)
        r->keep_alive = false; /* close-delimited: the end of the body is the end of the socket */
    pc_buf_t head = PC_BUF_INIT;
    rc = build_head(r, status, h, n_h, true, 0, &head);
    if (rc != 0) {
        pc_buf_free(&head);
        return rc;
    }
    uv_buf_t b = uv_buf_init(head.base, (unsigned)head.len);
    rc = req_emit(r, &b, 1);
    pc_buf_free(&head);
    if (rc != 0)
        return rc;
    r->resp = RS_STREAMING;
    r->chunked_out = r->minor >= 1;
    return 0;
}

size_t gw_http_stream_queued(const gw_http_req_t *r)
{
    const conn_t *c = r->c;
    return r->held.len + (c->q_head == r ? c->bytes_writing : 0);
}

int gw_http_stream_write(gw_http_req_t *r, const void *bytes, size_t len)
{
    if (r == NULL || (len > 0 && bytes == NULL))
        return PC_ERR_INVAL;
    int rc = req_check(r, RS_STREAMING);
    if (rc != 0)
        return rc;
    if (len == 0 || r->is_head)
        return 0;
    conn_t *c = r->c;
    size_t hw = c->s->p.stream_high_water;
    size_t queued = gw_http_stream_queued(r);
    if (queued >= 4 * hw) {
        PC_LOG(PC_LOG_INFO, "http", "%s: client not reading, %zu bytes queued: closing", c->peer,
               queued);
        conn_close(c);
        return PC_ERR_OVERLOADED;
    }
    char size_line[24];
    int n = snprintf(size_line, sizeof size_line, "%zx\r\n", len);
    uv_buf_t bufs[3] = {uv_buf_init(size_line, (unsigned)n),
                        uv_buf_init((char *)bytes, (unsigned)len), uv_buf_init("\r\n", 2)};
    rc = r->chunked_out ? req_emit(r, bufs, 3) : req_emit(r, bufs + 1, 1);
    if (rc != 0)
        return rc;
    if (gw_http_stream_queued(r) >= hw)
        r->drain_armed = true;
    return 0;
}

int gw_http_stream_end(gw_http_req_t *r)
{
    if (r == NULL)
        return PC_ERR_INVAL;
    int rc = req_check(r, RS_STREAMING);
    if (rc != 0)
        return rc;
    if (r->chunked_out && !r->is_head) {
        uv_buf_t b = uv_buf_init("0\r\n\r\n", 5);
        rc = req_emit(r, &b, 1);
        if (rc != 0)
            return rc;
    }
    r->resp = RS_ENDED;
    conn_advance(r->c);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Connection lifecycle */

static void server_resume_schedule(conn_t *c)
{
    gw_http_server_t *s = c->s;
    if (c->resume_listed || c->closing)
        return;
    c->resume_listed = true;
    c->resume_next = s->resume_head;
    s->resume_head = c;
    if (!s->idle_active && !s->handles_closing) {
        s->idle_active = true;
        uv_idle_start(&s->resume_idle, on_resume_idle);
    }
}

/* The head was told to wait (drain_armed) and its queue is now below half the high water. */
static bool head_can_drain(const conn_t *c)
{
    const gw_http_req_t *h = c->q_head;
    return h != NULL && h->drain_armed && h->resp == RS_STREAMING &&
           c->bytes_writing + h->held.len < c->s->p.stream_high_water / 2;
}

/* Calls the head's on_drain when it is due; false when the connection closed meanwhile. */
static bool conn_drain_head(conn_t *c)
{
    if (!head_can_drain(c))
        return true;
    gw_http_req_t *h = c->q_head;
    h->drain_armed = false;
    if (h->drain_fn != NULL)
        h->drain_fn(h, h->data); /* may end (and free) h */
    return !c->closing;
}

static void send_continue(conn_t *c)
{
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    uv_buf_t b = uv_buf_init((char *)cont, sizeof cont - 1);
    c->continue_pending = false;
    if (c->cur != NULL)
        c->cur->body_start_ms = uv_now(c->s->loop); /* the client starts the body now */
    conn_write(c, &b, 1);
}

/* Pops every ended head and flushes the next head's held bytes; then the 100 Continue a
 * waiting request needs, a parse that can go on, and the close of a finished connection. */
static void conn_advance(conn_t *c)
{
    gw_http_req_t *h;
    while ((h = c->q_head) != NULL && h->resp == RS_ENDED && !c->closing) {
        c->q_head = h->next;
        if (c->q_head == NULL)
            c->q_tail = NULL;
        c->n_q--;
        req_free(h);
        gw_http_req_t *n = c->q_head;
        if (n != NULL && n->held.len > 0) {
            uv_buf_t b = uv_buf_init(n->held.base, (unsigned)n->held.len);
            int rc = conn_write(c, &b, 1);
            c->held_bytes -= n->held.len;
            pc_buf_free(&n->held);
            if (rc != 0)
                return;
        }
    }
    if (c->closing)
        return;
    if (c->q_head == NULL && c->continue_pending && c->cur != NULL && c->cur->want_continue)
        send_continue(c);
    if (c->pending.len > c->pending_off && !c->in_parse && !c->no_more && !c->out_paused &&
        c->n_q < c->s->p.max_pipeline)
        server_resume_schedule(c);
    if (head_can_drain(c))
        server_resume_schedule(c); /* on_drain runs from the loop, not from inside this call */
    conn_out_resume(c);
    conn_check_finish(c);
    conn_update_timer(c, ACT_NONE);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    conn_t *c = req->data;
    if (status < 0 && !c->closing)
        conn_close(c);
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    (void)hint;
    conn_t *c = h->data;
    b->base = c->s->rbuf;
    b->len = sizeof c->s->rbuf;
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b);

static void conn_set_reading(conn_t *c, bool on)
{
    if (c->closing || c->eof || c->reading == on)
        return;
    if (on) {
        if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) {
            conn_close(c);
            return;
        }
    } else {
        uv_read_stop((uv_stream_t *)&c->tcp);
    }
    c->reading = on;
}

static void pending_clear(conn_t *c)
{
    pc_buf_free(&c->pending);
    c->pending_off = 0;
}

/* Nothing more to answer and everything written: half-close and linger for the client's EOF. */
static void conn_check_finish(conn_t *c)
{
    if (c->closing || !c->no_more || c->cur != NULL || c->q_head != NULL || c->bytes_writing > 0)
        return;
    if (c->eof) {
        conn_close(c);
        return;
    }
    if (c->shut_sent)
        return;
    c->shut_sent = true;
    pending_clear(c);
    c->shut.data = c;
    if (uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, on_shutdown) != 0) {
        conn_close(c);
        return;
    }
    conn_set_reading(c, true); /* discard until EOF */
    c->timer_kind = TK_NONE;   /* the linger gets its full time from now */
    conn_update_timer(c, ACT_NONE);
}

static void on_conn_closed(uv_handle_t *h)
{
    conn_t *c = h->data;
    if (--c->n_open > 0)
        return;
    gw_http_server_t *s = c->s;
    /* Detach the requests first: an on_abort callback may call into the server. */
    gw_http_req_t *r = c->q_head;
    c->q_head = c->q_tail = NULL;
    if (c->cur != NULL) {
        req_free(c->cur);
        c->cur = NULL;
    }
    while (r != NULL) {
        gw_http_req_t *next = r->next;
        if (r->dispatched && r->resp != RS_ENDED) {
            s->st.requests_aborted++;
            r->aborted = true;
            if (r->abort_fn != NULL)
                r->abort_fn(r, r->data);
        }
        req_free(r);
        r = next;
    }
    pending_clear(c);
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    if (c->refused)
        s->n_refused_open--;
    else
        s->st.conns_open--;
    pc_free(c);
    server_maybe_done(s);
}

static void conn_close(conn_t *c)
{
    if (c->closing)
        return;
    c->closing = true;
    slot_release(c);
    if (c->reading)
        uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = false;
    uv_timer_stop(&c->timer);
    /* Unlink from the resume list now; it is walked only from the idle callback. */
    if (c->resume_listed) {
        conn_t **pp = &c->s->resume_head;
        while (*pp != NULL && *pp != c)
            pp = &(*pp)->resume_next;
        if (*pp == c)
            *pp = c->resume_next;
        c->resume_listed = false;
    }
    c->n_open = 2;
    uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
    uv_close((uv_handle_t *)&c->timer, on_conn_closed);
}

static void on_timer(uv_timer_t *t)
{
    conn_t *c = t->data;
    int kind = c->timer_kind;
    c->timer_kind = TK_NONE;
    switch (kind) {
    case TK_HEADER:
        c->s->st.timeouts++;
        c->s->st.errors_4xx++;
        conn_fail(c, 408, "timeout_error", "request headers not received in time");
        break;
    case TK_BODY:
        c->s->st.timeouts++;
        c->s->st.errors_4xx++;
        conn_fail(c, 408, "timeout_error", "request body not received in time");
        break;
    case TK_FIRST:
    case TK_IDLE:
    case TK_SEND:
        c->s->st.timeouts++;
        conn_close(c);
        break;
    case TK_LINGER:
        conn_close(c);
        break;
    default:
        break;
    }
}

/* The body's deadline: its grace period, plus one second per body_min_rate bytes received. */
static uint64_t body_due(const conn_t *c, const gw_http_req_t *r)
{
    const gw_http_params_t *p = &c->s->p;
    uint64_t due = r->body_start_ms + p->body_timeout_ms;
    if (p->body_min_rate > 0)
        due += (uint64_t)r->body.len * 1000 / p->body_min_rate;
    return due;
}

/* Arms the timer that the connection's state calls for. Header and body timers are deadlines
 * (a byte never restarts them, it only earns body time at body_min_rate); the idle and send
 * timers measure silence from when the state began; activity: bytes written (restarts the
 * final flush's linger and the send timer). */
static void conn_update_timer(conn_t *c, int activity)
{
    if (c->closing)
        return;
    const gw_http_params_t *p = &c->s->p;
    uint64_t now = uv_now(c->s->loop);
    int kind = TK_NONE;
    uint32_t ms = 0; /* the state's timeout; 0 = none */
    if (c->shut_sent) {
        kind = TK_LINGER, ms = p->linger_ms;
    } else if (c->no_more) {
        /* Closing after the queued responses: once the handler is done with all of them, the
         * client gets linger_ms without write progress before the connection is dropped. */
        kind = TK_LINGER, ms = p->linger_ms;
        for (const gw_http_req_t *r = c->q_head; r != NULL; r = r->next)
            if (r->resp != RS_ENDED)
                kind = TK_NONE;
    } else if (c->cur != NULL && c->cur->phase == RQ_HEADERS) {
        kind = TK_HEADER, ms = p->header_timeout_ms;
    } else if (c->cur != NULL && c->cur->phase == RQ_BODY) {
        kind = TK_BODY, ms = p->body_timeout_ms;
        if (c->cur->want_continue && c->continue_pending)
            kind = TK_NONE; /* the client waits for our 100 Continue */
    } else if (c->out_paused && c->q_head == NULL) {
        kind = TK_SEND, ms = p->idle_timeout_ms; /* answered, and the client does not read */
    } else if (c->cur == NULL && c->q_head == NULL && c->pending.len == 0) {
        kind = TK_IDLE, ms = p->idle_timeout_ms;
        if (c->n_begun == 0) /* a new connection: its first request is due with its headers */
            kind = TK_FIRST, ms = p->header_timeout_ms;
    }
    if (kind == TK_NONE || ms == 0) {
        uv_timer_stop(&c->timer);
        c->timer_kind = TK_NONE;
        return;
    }
    bool same = kind == c->timer_kind;
    uint64_t due;
    switch (kind) {
    case TK_HEADER:
        due = c->cur->header_due_ms;
        break;
    case TK_BODY:
        due = body_due(c, c->cur);
        break;
    case TK_FIRST:
        due = c->accept_ms + ms;
        break;
    case TK_IDLE:
        due = same && !(activity & ACT_READ) ? c->timer_due_ms : now + ms;
        break;
    case TK_SEND:
        due = same && !(activity & ACT_WRITE) ? c->timer_due_ms : now + ms;
        break;
    default: /* TK_LINGER */
        due = same && (c->shut_sent || !(activity & ACT_WRITE)) ? c->timer_due_ms : now + ms;
        break;
    }
    if (same && due == c->timer_due_ms)
        return;
    c->timer_kind = (uint8_t)kind;
    c->timer_due_ms = due;
    uv_timer_start(&c->timer, on_timer, due > now ? due - now : 0, 0);
}

static void default_format_error(const char *type, const char *message, const char *request_id,
                                 pc_buf_t *out)
{
    pc_buf_append_cstr(out, "{\"error\":{\"type\":");
    pc_json_cstr(out, type, 0);
    pc_buf_append_cstr(out, ",\"message\":");
    pc_json_cstr(out, message, 0);
    pc_buf_append_cstr(out, "},\"request_id\":");
    pc_json_cstr(out, request_id, 0);
    pc_buf_append_cstr(out, "}");
}

static void error_body(gw_http_server_t *s, const char *path, int status, const char *type,
                       const char *msg, const char *request_id, pc_buf_t *out)
{
    if (s->p.format_error != NULL)
        s->p.format_error(path, status, type, msg, request_id, out, s->p.ud);
    else
        default_format_error(type, msg, request_id, out);
}

/* A protocol error: the request being parsed (or a new one) becomes the server's error
 * response, queued behind the earlier responses; nothing more is parsed on the connection. */
static void conn_fail(conn_t *c, int status, const char *type, const char *msg)
{
    if (c->closing || c->no_more)
        return;
    gw_http_req_t *r = c->cur;
    c->cur = NULL;
    if (r == NULL && (r = req_new(c)) == NULL) {
        conn_close(c);
        return;
    }
    PC_LOG(PC_LOG_DEBUG, "http", "%s: %d %s", c->peer, status, msg);
    prob_unlink(c); /* answered: no longer evictable */
    c->no_more = true;
    c->continue_pending = false;
    pending_clear(c);
    r->phase = RQ_COMPLETE;
    r->is_error = true;
    r->keep_alive = false;
    r->is_head = false;
    pc_buf_free(&r->body);
    if (pc_buf_terminate(&r->url) != 0) {
        req_free(r);
        conn_close(c);
        return;
    }
    if (r->url.len == 0)
        r->url.base[0] = '\0';
    r->query_off = r->url.len;
    conn_enqueue(c, r);
    char id[HTTP_REQ_ID_LEN];
    make_request_id(id);
    pc_buf_t body = PC_BUF_INIT;
    error_body(c->s, gw_http_req_path(r), status, type, msg, id, &body);
    gw_http_header_t h[] = {
        {"Content-Type", "application/json"}, {"request-id", id}, {"x-request-id", id}};
    if (req_respond(r, status, h, 3, body.base, body.len) != 0)
        conn_close(c);
    pc_buf_free(&body);
    conn_set_reading(c, true); /* read and discard: detect EOF, avoid a reset */
    conn_update_timer(c, ACT_NONE);
}

/* ------------------------------------------------------------------------------------------ */
/* Parsing */

/* Records why the parse fails (the response conn_parse sends) and returns -1 for llhttp. */
static int parse_err(conn_t *c, int status, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int parse_err(conn_t *c, int status, const char *type, const char *fmt, ...)
{
    c->err_status = status;
    c->err_type = type;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err_msg, sizeof c->err_msg, fmt, ap);
    va_end(ap);
    return -1;
}

static int count_header_bytes(conn_t *c, size_t len)
{
    c->header_bytes += len;
    size_t max = c->s->p.max_header_bytes;
    if (c->header_bytes > max)
        return parse_err(c, 431, "invalid_request_error",
                         "request header fields too large: more than %zu bytes", max);
    return 0;
}

/* Appends a parser span to b. Out of memory: marks the connection (c->oom; it is answered
 * once llhttp returns) and returns -1, which stops the parser. */
static int span_append(conn_t *c, pc_buf_t *b, const char *at, size_t len)
{
    if (pc_buf_append(b, at, len) != 0) {
        c->oom = true;
        return -1;
    }
    return 0;
}

static int cb_message_begin(llhttp_t *p)
{
    conn_t *c = p->data;
    if (c->cur != NULL) {
        req_free(c->cur);
        c->cur = NULL;
    }
    c->cur = req_new(c);
    if (c->cur == NULL) {
        c->oom = true;
        return -1;
    }
    c->header_bytes = 0;
    /* A connection's first request is due within header_timeout_ms of the accept. */
    c->cur->header_due_ms =
        (c->n_begun++ == 0 ? c->accept_ms : c->cur->start_ms) + c->s->p.header_timeout_ms;
    return 0;
}

static int cb_url(llhttp_t *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    if (count_header_bytes(c, len) != 0)
        return -1;
    return span_append(c, &c->cur->url, at, len);
}

static int cb_header_field(llhttp_t *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    gw_http_req_t *r = c->cur;
    if (count_header_bytes(c, len) != 0)
        return -1;
    if (!r->field_open) {
        r->field_open = true;
        if (count_header_bytes(c, HTTP_HEADER_OVERHEAD) != 0)
            return -1;
        if (r->n_h >= c->s->p.max_headers)
            return parse_err(c, 431, "invalid_request_error",
                             "too many header fields: more than %u", (unsigned)c->s->p.max_headers);
        if (r->phase == RQ_BODY)
            return 0; /* a trailer: counted, not stored */
        if (r->n_h == r->cap_h) {
            size_t cap = r->cap_h ? r->cap_h * 2 : 16;
            hdr_off_t *n = pc_reallocarray(r->hoff, cap, sizeof *n);
            if (n == NULL) {
                c->oom = true;
                return -1;
            }
            r->hoff = n, r->cap_h = cap;
        }
        r->hoff[r->n_h].name = (uint32_t)r->hdr.len;
        r->hoff[r->n_h].value = (uint32_t)r->hdr.len;
        r->n_h++;
    }
    if (r->phase == RQ_BODY)
        return 0;
    return span_append(c, &r->hdr, at, len);
}

static int cb_header_field_complete(llhttp_t *p)
{
    conn_t *c = p->data;
    gw_http_req_t *r = c->cur;
    if (r->phase == RQ_BODY)
        return 0;
    if (span_append(c, &r->hdr, "", 1) != 0)
        return -1;
    r->hoff[r->n_h - 1].value = (uint32_t)r->hdr.len;
    return 0;
}

/* Whether a header value span at `at` continues a folded line (obs-fold: a line starting with SP
 * or HTAB), which llhttp accepts: the bytes before it, blanks skipped, end in LF. A span at the
 * start of the bytes being parsed looks at what the previous bytes ended with. */
static bool value_is_folded(const conn_t *c, const char *at)
{
    const char *q = at;
    while (q > c->parse_base && (q[-1] == ' ' || q[-1] == '\t'))
        q--;
    return q > c->parse_base ? q[-1] == '\n' : c->tail_lf;
}

static int cb_header_value(llhttp_t *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    if (len > 0 && value_is_folded(c, at))
        return parse_err(c, 400, "invalid_request_error",
                         "folded header lines (obs-fold) are not allowed");
    if (count_header_bytes(c, len) != 0)
        return -1;
    if (c->cur->phase == RQ_BODY)
        return 0;
    return span_append(c, &c->cur->hdr, at, len);
}

static int cb_header_value_complete(llhttp_t *p)
{
    conn_t *c = p->data;
    gw_http_req_t *r = c->cur;
    r->field_open = false;
    if (r->phase == RQ_BODY)
        return 0;
    /* llhttp drops the whitespace before a value, not after it: trim that here. */
    size_t start = r->hoff[r->n_h - 1].value;
    while (r->hdr.len > start &&
           (r->hdr.base[r->hdr.len - 1] == ' ' || r->hdr.base[r->hdr.len - 1] == '\t'))
        r->hdr.len--;
    return span_append(c, &r->hdr, "", 1);
}

/* Turns the request target into "path\0query\0"; origin-form ("/p?q"), absolute-form
 * ("http://host/p?q") and "*" are accepted. */
static int split_target(gw_http_req_t *r)
{
    if (pc_buf_terminate(&r->url) != 0)
        return PC_ERR_NOMEM;
    char *u = r->url.base;
    size_t len = r->url.len;
    if (len == 0)
        return PC_ERR_FORMAT;
    if (u[0] != '/' && strcmp(u, "*") != 0) {
        size_t skip;
        if (strncasecmp(u, "http://", 7) == 0)
            skip = 7;
        else if (strncasecmp(u, "https://", 8) == 0)
            skip = 8;
        else
            return PC_ERR_FORMAT;
        char *slash = strchr(u + skip, '/');
        char *q = strchr(u + skip, '?');
        if (slash == NULL || (q != NULL && q < slash)) {
            /* No path: "http://host" or "http://host?q" means "/" (+ query). */
            size_t qlen = q != NULL ? strlen(q) : 0;
            memmove(u + 1, q != NULL ? q : "", qlen + 1);
            u[0] = '/';
            len = 1 + qlen;
        } else {
            len = strlen(slash);
            memmove(u, slash, len + 1);
        }
        r->url.len = len;
    }
    char *hash = strchr(u, '#');
    if (hash != NULL) {
        *hash = '\0';
        r->url.len = len = (size_t)(hash - u);
    }
    char *q = strchr(u, '?');
    if (q != NULL) {
        *q = '\0';
        r->query_off = (size_t)(q - u) + 1;
    } else {
        r->query_off = len;
    }
    return 0;
}

static int cb_headers_complete(llhttp_t *p)
{
    conn_t *c = p->data;
    gw_http_req_t *r = c->cur;
    const gw_http_params_t *sp = &c->s->p;
    r->field_open = false;
    int rc = split_target(r);
    if (rc == PC_ERR_NOMEM) {
        c->oom = true;
        return -1;
    }
    if (rc != 0)
        return parse_err(c, 400, "invalid_request_error", "invalid request target");
    snprintf(r->method, sizeof r->method, "%s", llhttp_method_name((llhttp_method_t)p->method));
    if (p->http_major != 1)
        return parse_err(c, 400, "invalid_request_error", "unsupported HTTP version");
    r->minor = p->http_minor;
    if ((p->flags & F_CONTENT_LENGTH) && (p->flags & F_TRANSFER_ENCODING))
        return parse_err(c, 400, "invalid_request_error",
                         "request has both Content-Length and Transfer-Encoding");
    r->is_head = p->method == HTTP_HEAD;
    r->keep_alive = r->minor >= 1 && llhttp_should_keep_alive(p) && !p->upgrade;
    if (p->flags & F_CONTENT_LENGTH) {
        if (p->content_length > sp->max_body_bytes)
            return parse_err(c, 413, "request_too_large",
                             "request body of %zu bytes is larger than the limit of %zu bytes",
                             (size_t)p->content_length, sp->max_body_bytes);
        size_t want = (size_t)p->content_length;
        if (want > 0 && pc_buf_reserve(&r->body, want < 65536 ? want : 65536) == NULL) {
            c->oom = true;
            return -1;
        }
    }
    r->phase = RQ_BODY;
    r->body_start_ms = uv_now(c->s->loop);
    const char *expect = gw_http_req_header(r, "expect");
    bool has_body = (p->flags & F_CHUNKED) || p->content_length > 0;
    if (expect != NULL && strcasecmp(expect, "100-continue") == 0 && r->minor >= 1 && has_body) {
        r->want_continue = true;
        if (c->q_head == NULL)
            send_continue(c);
        else
            c->continue_pending = true;
    }
    return 0;
}

static int cb_body(llhttp_t *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    gw_http_req_t *r = c->cur;
    size_t max = c->s->p.max_body_bytes;
    if (r->body.len + len > max)
        return parse_err(c, 413, "request_too_large",
                         "request body larger than the limit of %zu bytes", max);
    return span_append(c, &r->body, at, len);
}

static int cb_message_complete(llhttp_t *p)
{
    conn_t *c = p->data;
    gw_http_req_t *r = c->cur;
    c->cur = NULL;
    r->phase = RQ_COMPLETE;
    r->want_continue = false;
    c->continue_pending = false;
    conn_enqueue(c, r);
    if (!r->keep_alive)
        c->no_more = true;
    return HPE_PAUSED;
}

/* Hands the newest complete request to the handler. */
static void conn_dispatch(conn_t *c)
{
    gw_http_req_t *r = c->q_tail;
    if (r == NULL || r->dispatched || r->is_error)
        return;
    r->dispatched = true;
    gw_http_server_t *s = c->s;
    s->st.requests++;
    prob_unlink(c);              /* its request is in: no longer evictable */
    s->p.on_request(r, s->p.ud); /* may answer (and free) r */
    if (c->probation && !c->trusted && !c->closing && !c->no_more) {
        /* A probation connection gets one request unless it made the connection trusted. */
        c->no_more = true;
        c->continue_pending = false;
        conn_check_finish(c);
        conn_update_timer(c, ACT_NONE);
    }
}

/* Whether the unsent output is over the bound; stops reading when it is. */
static bool conn_out_check(conn_t *c)
{
    if (c->out_paused)
        return true;
    if (c->closing || c->no_more || conn_unsent(c) < c->s->p.stream_high_water)
        return false;
    c->out_paused = true;
    c->s->st.output_pauses++;
    conn_set_reading(c, false);
    return true;
}

/* Remembers whether the parsed bytes [a, b) end, blanks skipped, in LF (see value_is_folded). */
static void tail_update(conn_t *c, const char *a, const char *b)
{
    while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
        b--;
    if (b > a)
        c->tail_lf = b[-1] == '\n';
}

/* Parses data; returns how many bytes were consumed. Stops early when the pipeline is full,
 * the connection fails or no more requests are read. */
static size_t conn_parse(conn_t *c, const char *data, size_t len)
{
    const char *p = data, *end = data + len;
    c->in_parse = true;
    while (p < end && !c->closing && !c->no_more) {
        if (c->n_q >= c->s->p.max_pipeline || conn_out_check(c))
            break;
        c->parse_base = p;
        llhttp_errno_t e = llhttp_execute(&c->parser, p, (size_t)(end - p));
        if (e == HPE_OK) {
            tail_update(c, p, end);
            p = end;
            break;
        }
        if (e == HPE_PAUSED || e == HPE_PAUSED_UPGRADE) {
            const char *at = llhttp_get_error_pos(&c->parser);
            tail_update(c, p, at);
            p = at;
            llhttp_resume(&c->parser);
            conn_dispatch(c);
            continue;
        }
        if (c->oom) {
            conn_close(c);
            break;
        }
        c->s->st.errors_4xx++;
        if (c->err_status != 0) {
            conn_fail(c, c->err_status, c->err_type, c->err_msg);
        } else if (e == HPE_PAUSED_H2_UPGRADE) {
            conn_fail(c, 400, "invalid_request_error", "HTTP/2 is not supported");
        } else {
            char msg[200];
            snprintf(msg, sizeof msg, "malformed HTTP request: %s",
                     llhttp_get_error_reason(&c->parser));
            conn_fail(c, 400, "invalid_request_error", msg);
        }
        break;
    }
    c->in_parse = false;
    if (!c->closing)
        conn_out_check(c);
    return (size_t)(p - data);
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b)
{
    conn_t *c = st->data;
    if (n == 0 || c->closing)
        return;
    if (n < 0) {
        uv_read_stop(st);
        c->reading = false;
        c->eof = true;
        if (n != UV_EOF || c->shut_sent) {
            conn_close(c);
            return;
        }
        /* The client is gone: a partial request is dropped, and a response still being made
         * cannot reach anyone, so the connection closes now (on_abort fires). */
        if (c->cur != NULL) {
            req_free(c->cur);
            c->cur = NULL;
        }
        c->no_more = true;
        for (gw_http_req_t *r = c->q_head; r != NULL; r = r->next)
            if (r->resp != RS_ENDED) {
                conn_close(c);
                return;
            }
        conn_check_finish(c);
        return;
    }
    if (c->no_more || c->shut_sent)
        return; /* lingering or failed: discard */
    size_t used = conn_parse(c, b->base, (size_t)n);
    if (c->closing)
        return;
    if (used < (size_t)n && !c->no_more) {
        if (pc_buf_append(&c->pending, b->base + used, (size_t)n - used) != 0) {
            conn_close(c);
            return;
        }
        conn_set_reading(c, false);
    }
    conn_update_timer(c, ACT_READ);
    conn_check_finish(c);
}

static void conn_resume(conn_t *c)
{
    if (c->closing || !conn_drain_head(c))
        return;
    if (!c->no_more && c->pending.len > c->pending_off) {
        size_t used =
            conn_parse(c, c->pending.base + c->pending_off, c->pending.len - c->pending_off);
        if (c->closing)
            return;
        c->pending_off += used;
    }
    if (c->no_more || c->pending_off >= c->pending.len) {
        pending_clear(c);
        if (!c->out_paused)
            conn_set_reading(c, true);
    }
    conn_update_timer(c, ACT_NONE);
    conn_check_finish(c);
}

static void on_resume_idle(uv_idle_t *h)
{
    gw_http_server_t *s = h->data;
    conn_t *c;
    while ((c = s->resume_head) != NULL) {
        s->resume_head = c->resume_next;
        c->resume_listed = false;
        conn_resume(c);
    }
    uv_idle_stop(h);
    s->idle_active = false;
}

/* ------------------------------------------------------------------------------------------ */
/* Server */

static void format_peer(const struct sockaddr_storage *sa, char *buf, size_t len)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        uv_ip4_name(a, ip, sizeof ip);
        port = ntohs(a->sin_port);
        snprintf(buf, len, "%s:%d", ip, port);
    } else if (sa->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        uv_ip6_name(a, ip, sizeof ip);
        port = ntohs(a->sin6_port);
        snprintf(buf, len, "[%s]:%d", ip, port);
    } else {
        snprintf(buf, len, "?");
    }
}

static void on_refused_closed(uv_handle_t *h)
{
    pc_free(h);
}

/* Over every limit (a flood): accept and close at once, without even a 503. */
static void accept_and_drop(gw_http_server_t *s)
{
    uv_tcp_t *t = pc_malloc(sizeof *t);
    if (t == NULL)
        return;
    uv_tcp_init(s->loop, t);
    if (uv_accept((uv_stream_t *)&s->listener, (uv_stream_t *)t) == 0)
        s->st.conns_refused++;
    uv_close((uv_handle_t *)t, on_refused_closed);
}

static void on_connection(uv_stream_t *ls, int status)
{
    gw_http_server_t *s = ls->data;
    if (status < 0 || s->shutting_down)
        return;
    if (s->n_refused_open >= s->p.max_connections && s->st.conns_open >= s->p.max_connections &&
        s->prob_head == NULL) {
        accept_and_drop(s); /* a flood over every limit: not even a 503 */
        return;
    }
    conn_t *c = pc_calloc(1, sizeof *c);
    if (c == NULL) {
        accept_and_drop(s);
        return;
    }
    c->s = s;
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->next = s->conns;
    if (s->conns != NULL)
        s->conns->prev = c;
    s->conns = c;
    c->accept_ms = uv_now(s->loop);
    c->refused = true; /* counted as refused until admitted */
    s->n_refused_open++;
    if (uv_accept(ls, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c);
        return;
    }
    struct sockaddr_storage sa;
    int sl = sizeof sa;
    memset(&sa, 0, sizeof sa);
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&sa, &sl) == 0)
        format_peer(&sa, c->peer, sizeof c->peer);
    else
        snprintf(c->peer, sizeof c->peer, "?");
    peer_key(&sa, c->peer_addr);
    /* Admission (see "Connection slots" in http.h). */
    uint32_t max = s->p.max_connections;
    bool peer_full =
        s->peers != NULL && peer_count(s, c->peer_addr) >= s->p.max_connections_per_peer;
    if (!peer_full && s->st.conns_open >= max && s->prob_head != NULL) {
        conn_t *v = s->prob_head;
        PC_LOG(PC_LOG_INFO, "http", "%s: every slot taken: closing probation connection %s",
               c->peer, v->peer);
        s->st.conns_evicted++;
        conn_close(v); /* its slot is given to c now, while its handles close */
        s->st.conns_open--;
        v->refused = true; /* counted out already */
        s->n_refused_open++;
    }
    bool refuse = peer_full || s->st.conns_open >= max;
    if (refuse && s->n_refused_open > max) {
        s->st.conns_refused++;
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    llhttp_init(&c->parser, HTTP_REQUEST, &s->settings);
    c->parser.data = c;
    if (refuse) {
        s->st.conns_refused++;
        s->st.conns_refused_peer += peer_full;
        conn_set_reading(c, true);
        if (peer_full) {
            PC_LOG(PC_LOG_WARN, "http", "%s: over %u connections from this address: 503", c->peer,
                   s->p.max_connections_per_peer);
            conn_fail(c, 503, "overloaded_error", "too many connections from your address");
        } else {
            PC_LOG(PC_LOG_WARN, "http", "%s: over %u connections: 503", c->peer, max);
            conn_fail(c, 503, "overloaded_error", "too many connections");
        }
        return;
    }
    c->refused = false;
    s->n_refused_open--;
    s->st.conns_open++;
    s->st.conns_accepted++;
    if (s->peers != NULL && peer_add(s, c->peer_addr) != 0) {
        conn_close(c);
        return;
    }
    c->slot_counted = true;
    if (s->st.conns_untrusted >= max - s->reserve) {
        c->probation = true; /* the untrusted share is full: one request, on probation */
        prob_append(c);
    }
    s->st.conns_untrusted++;
    conn_set_reading(c, true);
    conn_update_timer(c, ACT_NONE);
}

static void on_server_handle_closed(uv_handle_t *h)
{
    gw_http_server_t *s = h->data;
    s->n_open--;
    server_maybe_done(s);
}

static void server_free_now(gw_http_server_t *s)
{
    if (s->peers != NULL) {
        for (size_t i = 0; i < HTTP_PEER_BUCKETS; i++)
            for (peer_t *e = s->peers[i], *n; e != NULL; e = n) {
                n = e->next;
                pc_free(e);
            }
        pc_free(s->peers);
    }
    pc_free(s->host);
    pc_free(s);
}

static void server_maybe_done(gw_http_server_t *s)
{
    if (!s->shutting_down || s->conns != NULL)
        return;
    if (!s->handles_closing) {
        s->handles_closing = true;
        uv_timer_stop(&s->shut_timer);
        uv_idle_stop(&s->resume_idle);
        uv_close((uv_handle_t *)&s->shut_timer, on_server_handle_closed);
        uv_close((uv_handle_t *)&s->resume_idle, on_server_handle_closed);
        return;
    }
    if (s->n_open > 0 || s->done_called)
        return;
    s->done_called = true;
    if (s->done != NULL)
        s->done(s->done_ud);
    if (s->free_when_done)
        server_free_now(s);
}

int gw_http_server_init(uv_loop_t *loop, const gw_http_params_t *p, gw_http_server_t **out,
                        char *err, size_t err_len)
{
    if (loop == NULL || p == NULL || out == NULL)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "http: missing argument");
    if (p->on_request == NULL)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "http: on_request is required");
    if (p->port < 0 || p->port > 65535)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "http: port %d out of range", p->port);
    if (p->max_pipeline == 0 || p->max_connections == 0 || p->stream_high_water == 0 ||
        p->max_headers == 0 || p->max_header_bytes == 0)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "http: max_pipeline, max_connections, stream_high_water, max_headers "
                           "and max_header_bytes must be positive");
    const char *host = p->host != NULL ? p->host : "127.0.0.1";
    if (strcmp(host, "localhost") == 0)
        host = "127.0.0.1";
    struct sockaddr_storage sa;
    memset(&sa, 0, sizeof sa);
    if (uv_ip4_addr(host, p->port, (struct sockaddr_in *)&sa) != 0 &&
        uv_ip6_addr(host, p->port, (struct sockaddr_in6 *)&sa) != 0)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "http: listen host '%s' is not an IP address", host);
    /* Bind with plain sockets first, so a failure leaves no libuv handle to close. */
    int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return pc_err_setf(err, err_len, PC_ERR_IO, "http: socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t sl =
        sa.ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    if (bind(fd, (struct sockaddr *)&sa, sl) != 0 || listen(fd, 511) != 0) {
        int e = errno;
        close(fd);
        return pc_err_setf(err, err_len, PC_ERR_IO, "http: cannot listen on %s:%d: %s", host,
                           p->port, strerror(e));
    }
    struct sockaddr_storage bound;
    sl = sizeof bound;
    getsockname(fd, (struct sockaddr *)&bound, &sl);
    gw_http_server_t *s = pc_calloc(1, sizeof *s);
    char *host_copy = pc_strdup(host);
    peer_t **peers =
        p->max_connections_per_peer > 0 ? pc_calloc(HTTP_PEER_BUCKETS, sizeof *peers) : NULL;
    if (s == NULL || host_copy == NULL || (p->max_connections_per_peer > 0 && peers == NULL)) {
        pc_free(s);
        pc_free(host_copy);
        pc_free(peers);
        close(fd);
        return pc_err_setf(err, err_len, PC_ERR_NOMEM, "http: out of memory");
    }
    s->loop = loop;
    s->p = *p;
    s->host = host_copy;
    s->p.host = host_copy;
    s->peers = peers;
    if (uv_random(NULL, NULL, &s->peer_seed, sizeof s->peer_seed, 0, NULL) != 0)
        s->peer_seed = uv_hrtime();
    s->reserve = p->reserved_connections < p->max_connections / 2 ? p->reserved_connections
                                                                  : p->max_connections / 2;
    if (s->p.stream_high_water < 2)
        s->p.stream_high_water = 2;
    s->port = ntohs(bound.ss_family == AF_INET ? ((struct sockaddr_in *)&bound)->sin_port
                                               : ((struct sockaddr_in6 *)&bound)->sin6_port);
    llhttp_settings_init(&s->settings);
    s->settings.on_message_begin = cb_message_begin;
    s->settings.on_url = cb_url;
    s->settings.on_header_field = cb_header_field;
    s->settings.on_header_field_complete = cb_header_field_complete;
    s->settings.on_header_value = cb_header_value;
    s->settings.on_header_value_complete = cb_header_value_complete;
    s->settings.on_headers_complete = cb_headers_complete;
    s->settings.on_body = cb_body;
    s->settings.on_message_complete = cb_message_complete;
    uv_tcp_init(loop, &s->listener);
    uv_timer_init(loop, &s->shut_timer);
    uv_idle_init(loop, &s->resume_idle);
    s->listener.data = s->shut_timer.data = s->resume_idle.data = s;
    s->n_open = 3;
    int rc = uv_tcp_open(&s->listener, fd);
    if (rc != 0)
        close(fd);
    else
        rc = uv_listen((uv_stream_t *)&s->listener, 511, on_connection);
    if (rc != 0) {
        /* The handles exist now: close them; the memory goes once their callbacks ran (the
         * caller's loop runs them). */
        s->shutting_down = true;
        s->free_when_done = true;
        uv_close((uv_handle_t *)&s->listener, on_server_handle_closed);
        server_maybe_done(s);
        return pc_err_setf(err, err_len, PC_ERR_IO, "http: listen: %s", uv_strerror(rc));
    }
    *out = s;
    return 0;
}

int gw_http_server_port(const gw_http_server_t *s)
{
    return s->port;
}

void gw_http_server_stats(const gw_http_server_t *s, gw_http_stats_t *out)
{
    *out = s->st;
}

static void on_shut_timer(uv_timer_t *t)
{
    gw_http_server_t *s = t->data;
    conn_t *c = s->conns;
    while (c != NULL) {
        conn_t *next = c->next;
        conn_close(c);
        c = next;
    }
}

void gw_http_server_shutdown(gw_http_server_t *s, uint32_t deadline_ms, void (*done)(void *ud),
                             void *ud)
{
    if (s->shutting_down) {
        if (!s->handles_closing && uv_timer_get_due_in(&s->shut_timer) > deadline_ms)
            uv_timer_start(&s->shut_timer, on_shut_timer, deadline_ms, 0);
        return;
    }
    s->shutting_down = true;
    s->done = done;
    s->done_ud = ud;
    uv_close((uv_handle_t *)&s->listener, on_server_handle_closed);
    for (conn_t *c = s->conns, *next; c != NULL; c = next) {
        next = c->next;
        if (c->closing)
            continue;
        if (c->cur != NULL) {
            req_free(c->cur);
            c->cur = NULL;
        }
        c->no_more = true;
        c->continue_pending = false;
        pending_clear(c);
        if (c->q_head == NULL) {
            conn_close(c);
            continue;
        }
        conn_set_reading(c, true);
        conn_update_timer(c, ACT_NONE);
    }
    uv_timer_start(&s->shut_timer, on_shut_timer, deadline_ms, 0);
    server_maybe_done(s);
}

void gw_http_server_free(gw_http_server_t *s)
{
    if (s == NULL)
        return;
    if (s->done_called) {
        server_free_now(s);
        return;
    }
    s->free_when_done = true;
    if (!s->shutting_down)
        gw_http_server_shutdown(s, 0, NULL, NULL);
    on_shut_timer(&s->shut_timer);
    server_maybe_done(s);
}

/* Internal, for the tests: the parser's lenient flags on r's connection (always 0: strict). */
unsigned gw__http_req_lenient_flags(const gw_http_req_t *r);
unsigned gw__http_req_lenient_flags(const gw_http_req_t *r)
{
    return r->c->parser.lenient_flags;
}

/* Internal, for the tests: the most unsent output bytes any connection holds now. */
size_t gw__http_server_unsent_max(const gw_http_server_t *s);
size_t gw__http_server_unsent_max(const gw_http_server_t *s)
{
    size_t m = 0;
    for (const conn_t *c = s->conns; c != NULL; c = c->next)
        if (conn_unsent(c) > m)
            m = conn_unsent(c);
    return m;
}
