/*
 * worker_server.h — `kvgw worker`'s network half: the worker API (engine/worker.h) served over
 * TCP with the worker protocol (engine/wire.h), on a libuv loop.
 *
 * The server owns one eng_worker_t and a listening socket. Each accepted connection goes
 * through:
 *
 *   handshake   the peer's first frame must be HELLO (role gateway); the whole handshake must
 *               end (HELLO_ACK sent) within handshake_timeout_ms of the accept. The server
 *               answers HELLO_ACK (the version it picked, the model's identity and sizes from
 *               eng_worker_info: total_blocks, max_prompt_tokens; its heartbeat interval and
 *               max_frame), or REJECT with a reason and closes: no common protocol version,
 *               role worker, heartbeat_ms outside 1..600000, max_frame below 16 KiB, and (only
 *               once the peer is authenticated, below) a model name / fingerprint / n_vocab
 *               that the HELLO asks for and this worker does not have (empty / 0 mean any), or
 *               max_conns connections past their handshake already. Until the handshake is done
 *               a frame may carry at most LNK_HANDSHAKE_MAX_FRAME bytes, then max_frame.
 *   budget      connections in their handshake (unauthenticated) have their own budget,
 *               max_pending, apart from the max_conns connections past it: when it is full, a
 *               new connection makes room by closing the one that has been in its handshake
 *               longest (logged; stats conns_pending_dropped). Sockets that never finish a
 *               handshake thus cannot keep a real gateway out, whose handshake takes a round
 *               trip or two.
 *   auth        with a link secret (params.secret), HELLO is answered with CHALLENGE (a fresh
 *               random nonce) and the gateway must answer AUTH with HMAC-SHA256 of both nonces
 *               under the secret (engine/wire.h), compared in constant time. A wrong or missing
 *               AUTH closes the connection without a word to the peer (the reason goes to the
 *               worker's log): nothing about the worker or its model reaches a peer that has
 *               not proved the secret. After a good AUTH the link is sealed both ways
 *               (wire_seal.h: every later frame encrypted and authenticated, keys from the
 *               secret and both nonces); HELLO_ACK, sealed, carries the worker's own proof. A
 *               record that does not verify (tampered, replayed, reordered or injected bytes)
 *               closes the connection with PC_ERR_PERM and a logged reason. The secret never
 *               crosses the wire. Without a secret every gateway that can reach the port is
 *               served in the clear (`kvgw worker` warns about it): bind to a private address.
 *   resync      right after HELLO_ACK and the first LOAD, the connection gets a SNAPSHOT of the
 *               worker's pinned prefixes (eng_worker_snapshot), in the worker's event order.
 *               Pins belong to the worker and outlive connections: RELEASED and EVICTED go to
 *               every connection past its handshake, RETAINED to the submitter (its request
 *               id) and to every other connection (request id 0).
 *   requests    SUBMIT goes to eng_worker_submit under a worker-wide id of the server's own
 *               (request ids are only unique per connection); a refusal is answered at once
 *               with ERROR for that request id. CANCEL maps to eng_worker_cancel (an id that
 *               is not live is ignored: its final frame is on the way). HEARTBEAT is answered
 *               with LOAD. RELEASE and DROP go to eng_worker_release / eng_worker_drop_ns.
 *               The worker's events come back through its wake callback (uv_async_send) and go
 *               out with the connection's own request ids: PREFILL, TOKEN, DONE, ERROR and
 *               KV_EVENT RETAIN_FAILED to the connection that submitted the request, the other KV
 * events as under resync, LOAD to every connection past its handshake. A KV_EVENT or SNAPSHOT frame
 * larger than a gateway's max_frame closes its connection. liveness    heartbeats both ways
 * (wire_conn.h): the server sends one every heartbeat_ms of silence and drops a peer silent for 3
 * of the peer's intervals. failure     a bad frame (the decoder's reason), a frame out of place (a
 * second HELLO, a frame only workers send, a SUBMIT reusing a live request id) closes the
 *               connection with ERROR (request 0) and a logged reason; a peer that stops
 *               reading is dropped when its output queue passes max_queue_bytes. Whatever
 *               ends a connection, its live requests are canceled in the worker, and events
 *               that arrive for them afterwards are dropped.
 *
 * Shutdown (lnk_worker_server_shutdown, e.g. on SIGINT/SIGTERM): stop accepting, cancel every
 * live request, send the final frames (DONE canceled) for at most drain_timeout_ms, close every
 * connection after its queued bytes are written, stop the worker without waiting on the loop
 * (eng_worker_stop: its thread finishes the step in progress and says so; only then is the
 * worker freed, so the loop never blocks on model math), close the server's handles;
 * on_closed runs after the last close callback, and uv_run then returns once nothing else is on
 * the loop. Only then may lnk_worker_server_free run.
 *
 * Threads: every function runs on the loop's thread. The worker's thread only calls the wake
 * callback and, once, the stop notification; both take a mutex and call uv_async_send while
 * the async handle is open.
 */
#ifndef LNK_WORKER_SERVER_H
#define LNK_WORKER_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "worker.h"

/* The largest payload taken from a peer before its handshake is done (HELLO, AUTH): an
 * unauthenticated peer cannot make the server buffer max_frame bytes. A frame announcing more
 * is refused from its header (REJECT, connection closed). */
#define LNK_HANDSHAKE_MAX_FRAME (8u << 10)

/* The longest link secret accepted (bytes), by the server and the client (worker_client.h). */
#define LNK_SECRET_MAX 1024
/* The shortest: a shorter secret is refused by the server and client parameters checks. */
#define LNK_SECRET_MIN 16

typedef struct lnk_worker_server_params {
    const char *listen;            /* "HOST:PORT" (lnk_addr.h): IPv4, [IPv6] ("[::]": every
                                      address) or a host name, resolved once at init (its
                                      first IPv4 address, else IPv6); port 0 picks one */
    const char *node;              /* the name sent in HELLO_ACK; NULL: the host name */
    uint32_t heartbeat_ms;         /* our heartbeat interval; default 1000 */
    uint32_t handshake_timeout_ms; /* from accept to the handshake's end; default 3000 */
    uint32_t max_frame;        /* largest payload accepted; default ENG_WIRE_MAX_FRAME_DEFAULT */
    size_t max_queue_bytes;    /* per-connection output limit; default 64 MiB */
    uint32_t max_conns;        /* past their handshake; more are refused (REJECT); default 64 */
    uint32_t max_pending;      /* in their handshake; more drop the oldest; default 16 */
    uint32_t drain_timeout_ms; /* shutdown: wait for final frames; default 5000 */
    const uint8_t *secret;     /* the link secret (LNK_SECRET_MIN..LNK_SECRET_MAX bytes),
                                  copied at init; NULL / secret_len 0: no authentication */
    size_t secret_len;
} lnk_worker_server_params_t;

lnk_worker_server_params_t lnk_worker_server_params_default(void);

typedef struct lnk_worker_server lnk_worker_server_t;

/* Runs once, on the loop, after shutdown closed every handle of the server. */
typedef void (*lnk_worker_server_closed_fn)(lnk_worker_server_t *s, void *ud);

/* Starts the worker (wp; its wake callback is the server's, wp->wake is ignored) and listens on
 * p->listen. Returns 0, PC_ERR_INVAL (bad parameters or address), PC_ERR_NOTFOUND (the listen
 * host name does not resolve; blocking: call before the loop serves anything), the worker's errors
 * (eng_worker_init) or PC_ERR_IO (bind/listen failed), with a one-line reason in err; on
 * failure nothing is left on the loop. */
int lnk_worker_server_init(uv_loop_t *loop, const lnk_worker_server_params_t *p,
                           const eng_worker_params_t *wp, lnk_worker_server_t **out, char *err,
                           size_t err_len);

/* The bound address ("127.0.0.1:40123"), the port chosen when p->listen asked for 0. Valid
 * until lnk_worker_server_free. */
const char *lnk_worker_server_address(const lnk_worker_server_t *s);
uint16_t lnk_worker_server_port(const lnk_worker_server_t *s);

/* The worker, for embedders and tests (eng_worker_info, _load, _stats). Valid until shutdown
 * completes. */
eng_worker_t *lnk_worker_server_worker(lnk_worker_server_t *s);

/* Begins the graceful shutdown described above; on_closed(s, ud) (may be NULL) runs when it
 * is complete. Calling it again does nothing. */
void lnk_worker_server_shutdown(lnk_worker_server_t *s, lnk_worker_server_closed_fn on_closed,
                                void *ud);

/* Releases the server's memory: only after on_closed ran. NULL is a no-op. */
void lnk_worker_server_free(lnk_worker_server_t *s);

typedef struct lnk_worker_server_stats {
    uint32_t conns_open; /* connections not closed yet */
    uint64_t conns_accepted;
    uint64_t conns_rejected;        /* handshake refused (REJECT, or silently: bad AUTH) */
    uint64_t conns_bad_frame;       /* closed for a bad or misplaced frame */
    uint64_t conns_timeout;         /* closed for a missed handshake or heartbeats */
    uint64_t conns_pending_dropped; /* dropped in their handshake to make room (max_pending) */
    uint64_t conns_unsealed;        /* closed for a sealed record that did not verify */
    uint64_t conns_slow;            /* closed for not reading (output queue over the limit) */
    uint64_t requests_submitted;    /* accepted by the worker */
    uint64_t requests_refused;      /* answered ERROR at once */
    uint64_t requests_live;         /* submitted, final event not seen yet */
    uint64_t requests_orphaned;     /* canceled because their connection ended */
    uint64_t events_dropped;        /* events for requests whose connection had ended */
} lnk_worker_server_stats_t;

void lnk_worker_server_stats(const lnk_worker_server_t *s, lnk_worker_server_stats_t *out);

#endif
