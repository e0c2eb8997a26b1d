/*
 * http.h — the gateway's HTTP/1.1 server (libuv + llhttp).
 *
 * One gw_http_server_t listens on one address and owns its connections. Each connection parses
 * requests with llhttp in strict mode (no lenient flag is ever set) and hands every complete
 * request (headers and the whole body, Content-Length or chunked, decoded) to on_request. The
 * handler answers with one whole response (gw_http_respond) or a stream (gw_http_stream_*),
 * now or later from the same loop thread.
 *
 * Ordering. Requests on a connection may be pipelined: up to max_pipeline complete requests
 * are handed out before the earliest is answered, and they may be answered in any order. The
 * bytes of a response reach the socket strictly in request order: a later request's response
 * is held in memory until every earlier one has been written.
 *
 * Protocol errors are answered by the server itself, never seen by on_request: 400 (bad request
 * line or header, a folded header line (obs-fold, RFC 9112 §5.2), Content-Length together with
 * Transfer-Encoding, bad chunk framing), 431 (more than max_header_bytes of request line and
 * headers, or more than max_headers header fields), 413 (body over max_body_bytes: at once from
 * Content-Length, before the body is read, or as chunked bytes arrive), 408 (headers or body
 * past their deadline, see Timeouts) and 503 (no connection slot, see Connection slots). Each
 * carries a fresh request id ("req_" + 24 hex digits, random) in its request-id and
 * x-request-id headers and hands it to format_error for the body. Their body comes from
 * format_error (the API's error shape for the path) and they carry Connection: close: the
 * server stops reading requests on that connection, writes the earlier responses and the error,
 * half-closes and closes once the client closed too or after a short linger.
 *
 * Request lifetime (the contract the handler relies on):
 *   - the server owns every gw_http_req_t. The accessors and the request's data stay valid from
 *     on_request until the response ended (gw_http_respond or gw_http_stream_end returned 0);
 *     after that the handler must not touch the request again;
 *   - the client may go away (EOF, reset, write error) or the server may close the connection
 *     (shutdown deadline, output limit) before the response ended. Then on_abort, when set, is
 *     called once from the loop (never from inside a gw_http_* call) and the request is freed
 *     right after it returns. A handler that keeps a request beyond on_request (answers later)
 *     must set on_abort and drop its references there. Between the connection failing and
 *     on_abort, the response functions return PC_ERR_CLOSED;
 *   - a handler that answers from inside on_request needs no on_abort.
 *
 * Backpressure. A stream's bytes are queued in memory until the socket takes them:
 * gw_http_stream_queued says how many. The handler should stop producing (stop pulling tokens)
 * while the queued bytes are at or above stream_high_water and resume when on_drain fires (the
 * queue fell below stream_high_water / 2 after having reached stream_high_water). Bytes the
 * handler held back meanwhile may go out in one write from on_drain, whatever their size. A
 * write while 4 × stream_high_water or more are already queued is refused with
 * PC_ERR_OVERLOADED and the connection is closed (on_abort follows).
 *
 * The same bound holds the input side: no request is parsed while the connection's unsent
 * output (every response byte not yet taken by the socket) is at or above stream_high_water;
 * reading stops then and resumes once it fell below stream_high_water / 2. So a client that
 * pipelines requests and never reads the answers costs at most, per connection: one read of
 * unparsed input (64 KiB), max_pipeline requests parsed and not answered (each at most
 * max_header_bytes + max_body_bytes), and stream_high_water of output plus the responses of the
 * requests already handed out (one, when the handler answers from on_request). A connection
 * whose output has not moved for idle_timeout_ms while nothing is in flight is closed.
 *
 * Timeouts are deadlines, never restarted by a byte. A new connection must deliver its first
 * request's headers within header_timeout_ms of being accepted (silence until then closes it);
 * a later request's headers, within header_timeout_ms of its first byte. A body must be complete
 * by body_timeout_ms after its headers plus one second per body_min_rate bytes received (a
 * minimum rate after a grace period; body_min_rate 0: body_timeout_ms is the total). Past either
 * deadline: 408 and close. idle_timeout_ms closes a keep-alive connection with nothing in flight
 * and nothing received. No timeout runs while a request is being answered (a long stream is
 * never cut by the server's timers).
 *
 * Connection slots. A connection is untrusted until the handler calls gw_http_req_set_trusted on
 * one of its requests (it presented a valid API key). max_connections bounds all connections;
 * untrusted ones take at most max_connections - reserved_connections slots (the reserve is
 * capped at max_connections / 2) and at most max_connections_per_peer from one client address
 * (IPv4 address or IPv6 /64; 0 = no limit). A connection arriving when the untrusted share is
 * full is admitted into the reserve on probation: it gets one request, answered with
 * Connection: close unless the request made it trusted; and when every slot is taken, a new
 * connection evicts the oldest probation connection that has not finished its first request
 * (closed without an answer). So a flood of keyless sockets holds at most the untrusted share
 * for long, and a client with a key (or a health check, answered and closed) still gets in
 * unless probation connections arrive faster than one request takes. Connections over
 * max_connections_per_peer, or with every slot taken by trusted and dispatched connections, are
 * answered 503 and closed.
 *
 * Threads: every function runs on the loop's thread.
 */
#ifndef GW_HTTP_H
#define GW_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "pc_buf.h"

typedef struct gw_http_server gw_http_server_t;
typedef struct gw_http_req gw_http_req_t; /* one request on a connection */

typedef struct {
    const char *name;
    const char *value;
} gw_http_header_t;

typedef struct {
    const char *host;              /* listen address: an IPv4 or IPv6 literal, or "localhost" */
    int port;                      /* 0 = ephemeral (gw_http_server_port says which) */
    size_t max_header_bytes;       /* request line plus all header bytes of one request: 431 */
    uint32_t max_headers;          /* header field count: 431 */
    size_t max_body_bytes;         /* decoded body bytes: 413 request_too_large */
    uint32_t header_timeout_ms;    /* deadline for a request's headers: 408 then close */
    uint32_t body_timeout_ms;      /* a body's grace period (total deadline at body_min_rate 0) */
    uint32_t body_min_rate;        /* body bytes per second owed after the grace; 0 = none */
    uint32_t idle_timeout_ms;      /* keep-alive with nothing in flight: close */
    uint32_t max_connections;      /* excess: accepted, answered 503 and closed at once */
    uint32_t reserved_connections; /* slots untrusted connections only get on probation */
    uint32_t max_connections_per_peer; /* untrusted connections per client address; 0 = any */
    size_t max_pipeline;      /* complete requests handed out ahead of the earliest response */
    size_t stream_high_water; /* queued bytes per connection before backpressure */
    uint32_t linger_ms; /* after the final response of a closing connection: wait this long for
                           the client's EOF (reading and discarding) before closing */
    /* A complete request (body read). Called from the loop; see the lifetime rules above. */
    void (*on_request)(gw_http_req_t *req, void *ud);
    /* Formats the body of a protocol-level error (400/408/413/431/503) in the API's shape for
     * that path ("" when unknown: a refused connection); request_id is the id the response's
     * request-id header carries. NULL = plain JSON
     * {"error":{"type":...,"message":...},"request_id":...}. Appends to out; the response is
     * sent with Content-Type: application/json. */
    void (*format_error)(const char *path, int status, const char *type, const char *message,
                         const char *request_id, pc_buf_t *out, void *ud);
    void *ud;
} gw_http_params_t;

/* Defaults: 127.0.0.1:8080, 60 KiB / 100 headers, 32 MiB bodies, 10 s header deadline, 30 s
 * body grace then 1 KiB/s, 60 s keep-alive idle, 10 000 connections (no reserve, no per-peer
 * limit), 16 pipelined requests, 64 KiB high water, 2 s linger; on_request must be set by the
 * caller. */
gw_http_params_t gw_http_params_default(void);

/* Binds, listens and starts accepting on loop. p is copied (host too). Returns 0 and *out, or
 * PC_ERR_INVAL (bad parameters), PC_ERR_IO (bind/listen failed: err says why) or PC_ERR_NOMEM;
 * nothing to free on failure. */
int gw_http_server_init(uv_loop_t *loop, const gw_http_params_t *p, gw_http_server_t **out,
                        char *err, size_t err_len);

/* The bound port (the ephemeral one when port 0 was asked). */
int gw_http_server_port(const gw_http_server_t *s);

typedef struct gw_http_stats {
    uint32_t conns_open;         /* accepted and not closed yet (refused ones excluded) */
    uint64_t conns_accepted;     /* served connections since init */
    uint64_t conns_refused;      /* answered 503: no slot, or over the per-peer limit */
    uint64_t conns_refused_peer; /* over max_connections_per_peer */
    uint64_t conns_evicted;      /* probation connections closed to make room */
    uint32_t conns_untrusted;    /* open and not (yet) trusted */
    uint64_t output_pauses;      /* times reading stopped because output was not taken */
    uint64_t requests;           /* requests handed to on_request */
    uint64_t requests_aborted;   /* handed out, connection gone before the response ended */
    uint64_t errors_4xx;         /* protocol errors answered by the server (400/408/413/431) */
    uint64_t timeouts;           /* 408s plus idle closes */
} gw_http_stats_t;

/* A snapshot of the counters. */
void gw_http_server_stats(const gw_http_server_t *s, gw_http_stats_t *out);

/* Graceful: stop accepting now, close idle keep-alive connections (and ones holding only a
 * partial request), let in-flight requests finish until deadline_ms from now (their responses
 * carry Connection: close), then close the rest (their on_abort fires); calls done(ud) once
 * every handle is closed. done may be NULL. A second call only shortens the deadline. */
void gw_http_server_shutdown(gw_http_server_t *s, uint32_t deadline_ms, void (*done)(void *ud),
                             void *ud);

/* Frees the server. After shutdown's done: frees at once. On a live server: closes every
 * connection now (on_abort fires for unfinished requests) and frees once the close callbacks
 * ran, so the caller must run the loop again before uv_loop_close. NULL is a no-op. Must not be
 * called from inside one of the server's callbacks. */
void gw_http_server_free(gw_http_server_t *s);

/* Request accessors, valid until the response ends (or the request is aborted). Strings are
 * NUL-terminated and owned by the request. */
const char *gw_http_req_method(const gw_http_req_t *r); /* "GET", "POST", ... */
const char *gw_http_req_path(const gw_http_req_t *r);   /* raw (not percent-decoded), no query */
const char *gw_http_req_query(const gw_http_req_t *r);  /* after '?', "" if none */
/* The first header with that name (case-insensitive), NULL if absent. */
const char *gw_http_req_header(const gw_http_req_t *r, const char *name);
/* Number of header fields, and the i-th one in arrival order (names as sent). */
size_t gw_http_req_header_count(const gw_http_req_t *r);
gw_http_header_t gw_http_req_header_at(const gw_http_req_t *r, size_t i);
pc_slice_t gw_http_req_body(const gw_http_req_t *r);  /* whole body, decoded; {"" ,0} if none */
const char *gw_http_req_peer(const gw_http_req_t *r); /* "ip:port" of the client */
/* HTTP minor version of the request (0 or 1; major is always 1). */
int gw_http_req_version_minor(const gw_http_req_t *r);
/* Monotonic ms when the request's first byte arrived. */
uint64_t gw_http_req_start_ms(const gw_http_req_t *r);

/* The handler's pointer for this request (NULL at first). */
void gw_http_req_set_data(gw_http_req_t *r, void *data);
void *gw_http_req_data(const gw_http_req_t *r);

/* Marks r's connection as trusted (a request on it presented a valid API key): from now on it
 * no longer counts against the untrusted share or its peer's limit, and a probation connection
 * keeps its slot. Idempotent; call it before answering r. */
void gw_http_req_set_trusted(gw_http_req_t *r);

/* Called once if the client goes away (or the server shuts the connection down) before the
 * response ended; after it the req is gone (no more calls on it). fn gets the data set with
 * gw_http_req_set_data. NULL clears. */
void gw_http_req_on_abort(gw_http_req_t *r, void (*fn)(gw_http_req_t *r, void *data));

/* A whole response with Content-Length; the headers and body are copied. Framing headers in
 * h (Content-Length, Transfer-Encoding, Connection) are ignored: the server sets them. HEAD
 * requests get the headers only; 204 and 304 get no body and no Content-Length. Returns 0 (the
 * response ended: do not touch r again), PC_ERR_INVAL (a header name or value with CR, LF or
 * NUL, an empty name, or a status outside 200..599: nothing sent, r unchanged), PC_ERR_STATE
 * (a response already began) or PC_ERR_CLOSED (the connection is gone: wait for on_abort). */
int gw_http_respond(gw_http_req_t *r, int status, const gw_http_header_t *h, size_t n_h,
                    const void *body, size_t len);

/* Streaming with chunked transfer encoding (close-delimited for HTTP/1.0 clients). begin
 * sends the status and headers; write sends one chunk (len 0 is a no-op); end sends the last
 * chunk and ends the response (do not touch r after it returned 0). Errors as gw_http_respond,
 * plus PC_ERR_OVERLOADED from write when 4 × stream_high_water or more are already queued (the
 * connection is then closing and on_abort follows). */
int gw_http_stream_begin(gw_http_req_t *r, int status, const gw_http_header_t *h, size_t n_h);
int gw_http_stream_write(gw_http_req_t *r, const void *bytes, size_t len);
int gw_http_stream_end(gw_http_req_t *r);

/* Bytes of this request's response not yet written to the socket (held behind earlier
 * responses, or handed to the socket and not yet taken). */
size_t gw_http_stream_queued(const gw_http_req_t *r);

/* Called (from the loop) when the queued bytes fell below stream_high_water / 2 after having
 * reached stream_high_water; fn may write again. NULL clears. */
void gw_http_req_on_drain(gw_http_req_t *r, void (*fn)(gw_http_req_t *r, void *data));

/* The standard reason phrase for a status ("OK", "Not Found"; "Unknown" otherwise). */
const char *gw_http_status_text(int status);

#endif
