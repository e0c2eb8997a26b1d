/*
 * worker_client.h — the gateway's side of a TCP link to `kvgw worker` (worker_server.h), on a
 * libuv loop: connect, handshake, submit, cancel, and the worker's frames through callbacks.
 *
 *   lnk_worker_client_params_t p = lnk_worker_client_params_default();
 *   p.address = "127.0.0.1:7070";
 *   lnk_worker_client_connect(loop, &p, &cbs, ud, &c, err, sizeof err);
 *   ... cbs.on_ready: lnk_worker_client_submit(c, &submit);
 *   ... cbs.on_frame: SNAPSHOT (the worker's pins and tier-held prefixes, first), PREFILL,
 *       TOKEN, DONE, ERROR, KV_EVENT, LOAD, HEARTBEAT, with the ids we chose
 *   ... lnk_worker_client_release / _drop: the gateway's index ends a pin / a namespace
 *   ... lnk_worker_client_close(c)  ->  cbs.on_close(c, 0, "", ud)
 *
 * Addresses: a numeric host is connected to directly. A host name is resolved on libuv's
 * thread pool (uv_getaddrinfo: the loop never blocks) at every lnk_worker_client_connect,
 * nothing cached, and each address it returns (IPv6 and IPv4, in the resolver's order) is tried
 * in turn until one accepts TCP; each TCP connect gets an equal share of the connect timeout
 * left for the untried addresses. lnk_worker_client_peer names the address in use. A name
 * that does not resolve ends the connection with PC_ERR_NOTFOUND and the resolver's error; a
 * name whose every address refuses, with PC_ERR_IO and each address's error in the reason.
 *
 * The client sends HELLO as soon as TCP connects (version range, expected model, heartbeat
 * interval, max_frame, a fresh nonce) and checks the HELLO_ACK: a version in the range, role
 * worker, the model asked for, sane heartbeat and max_frame. With a link secret
 * (params.secret) it answers the worker's CHALLENGE with AUTH and requires the worker's proof
 * in HELLO_ACK (engine/wire.h): a worker without the secret, or one that does not ask for it,
 * ends the connection with PC_ERR_PERM. Without a secret, a worker that asks for one ends it
 * with PC_ERR_PERM too. Connect plus handshake must finish within connect_timeout_ms. After
 * the handshake it sends HEARTBEAT whenever it sent nothing for heartbeat_ms and drops a
 * worker silent for 3 of the worker's intervals.
 *
 * Resync: right after on_ready, on_frame gets the worker's SNAPSHOT frames (one snapshot_id,
 * the last with last = 1): the pins the worker holds, which outlive connections. A gateway
 * that (re)connects replaces its view of this worker's retained prefixes with it; every
 * KV_EVENT after the last SNAPSHOT frame applies on top of it. Pins are the worker's: RELEASED
 * and EVICTED come to every connected gateway, RETAINED with our request id for our requests
 * and with request id 0 for those of other gateways.
 *
 * Request ids are the caller's: nonzero and not reused while the request is live (until its
 * DONE or ERROR frame). The client does not track requests: when the connection ends, every
 * request without a final frame is lost, and on_close says why.
 *
 * Lifetime: on_close runs exactly once, after every handle is closed, whatever ended the
 * connection (a failed connect, REJECT, the worker's ERROR about the connection, a bad frame,
 * a timeout, the peer closing, lnk_worker_client_close); the client's memory is freed when
 * on_close returns. Every function takes the client from the loop's thread only, between
 * lnk_worker_client_connect and on_close; the caller owns what it passes (copied before the
 * call returns).
 */
#ifndef LNK_WORKER_CLIENT_H
#define LNK_WORKER_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "wire.h"

typedef struct lnk_worker_client_params {
    const char *address;    /* "HOST:PORT" of the worker (lnk_addr.h): IPv4, [IPv6] or a
                               host name, resolved afresh at every connect */
    const char *node;       /* our name in HELLO, for the worker's logs; NULL: "gateway" */
    const char *model_name; /* the model expected; NULL or "": any */
    uint64_t model_fp;      /* 0: any */
    uint32_t n_vocab;       /* 0: any */
    uint16_t version_min, version_max; /* default ENG_WIRE_VERSION..ENG_WIRE_VERSION */
    uint32_t heartbeat_ms;             /* default 1000 */
    uint32_t connect_timeout_ms;       /* connect + handshake; default 5000 */
    uint32_t max_frame;                /* largest payload accepted; default 64 MiB */
    size_t max_queue_bytes;            /* output limit; default 64 MiB */
    const uint8_t *secret;             /* the link secret (LNK_SECRET_MIN..LNK_SECRET_MAX
                                          bytes), copied at connect; NULL / 0: none */
    size_t secret_len;
} lnk_worker_client_params_t;

lnk_worker_client_params_t lnk_worker_client_params_default(void);

typedef struct lnk_worker_client lnk_worker_client_t;

typedef struct lnk_worker_client_cbs {
    /* The handshake succeeded; ack (the worker's HELLO_ACK: model identity, n_ctx,
     * block_tokens, total_blocks, max_prompt_tokens for the router) is valid during the call
     * only. */
    void (*on_ready)(lnk_worker_client_t *c, const eng_wire_hello_t *ack, void *ud);
    /* A frame from the worker after the handshake: SNAPSHOT, PREFILL, TOKEN, DONE, ERROR
     * (request_id nonzero), KV_EVENT, LOAD or HEARTBEAT; valid during the call only (copy what you
     * keep). The callback may submit, cancel and close. */
    void (*on_frame)(lnk_worker_client_t *c, const eng_wire_frame_t *f, void *ud);
    /* The connection ended. err: 0 after lnk_worker_client_close; the REJECT's or ERROR's code
     * (reason: "worker: " + its message; PC_ERR_PERM for a wrong or missing secret);
     * PC_ERR_PERM (the link secret check failed on our side); PC_ERR_TIMEOUT (resolve, connect,
     * handshake or heartbeats); PC_ERR_CLOSED (the worker closed); PC_ERR_IO (connect or socket
     * error); PC_ERR_NOTFOUND (the host name did not resolve: the resolver's error);
     * PC_ERR_FORMAT / PC_ERR_UNSUPPORTED (a bad frame or handshake answer); PC_ERR_OVERLOADED (the
     * worker does not read). reason is valid during the call. */
    void (*on_close)(lnk_worker_client_t *c, int err, const char *reason, void *ud);
} lnk_worker_client_cbs_t;

/* Starts connecting. Returns 0 (the outcome comes through on_ready or on_close), or
 * PC_ERR_INVAL (a bad address (lnk_addr_parse's rules: port 1..65535) or parameter, reason in
 * err; no callback will run) or
 * PC_ERR_NOMEM / PC_ERR_IO. */
int lnk_worker_client_connect(uv_loop_t *loop, const lnk_worker_client_params_t *p,
                              const lnk_worker_client_cbs_t *cbs, void *ud,
                              lnk_worker_client_t **out, char *err, size_t err_len);

/* Sends SUBMIT (everything is copied). Returns 0; PC_ERR_STATE (handshake not done or the
 * connection is closing); PC_ERR_INVAL (the frame breaks a protocol limit: nothing sent); or
 * PC_ERR_OVERLOADED / PC_ERR_IO (the connection is now closing). */
int lnk_worker_client_submit(lnk_worker_client_t *c, const eng_wire_submit_t *req);

/* Sends CANCEL; the request still ends with its DONE (stop_reason CANCELED) or, when it had
 * already finished, the final frame already under way. Returns like lnk_worker_client_submit. */
int lnk_worker_client_cancel(lnk_worker_client_t *c, uint64_t request_id);

/* Sends RELEASE: the pin of the retained prefix tokens[0..n_tokens) of namespace ns ends (its
 * TTL ended at the gateway); the worker answers KV_EVENT RELEASED when it was pinned, nothing
 * otherwise. tokens is copied. Returns like lnk_worker_client_submit (PC_ERR_INVAL for
 * n_tokens 0). */
int lnk_worker_client_release(lnk_worker_client_t *c, uint64_t ns, const uint32_t *tokens,
                              uint32_t n_tokens);

/* Sends DROP: everything of namespace ns goes (RELEASED for its pins, EVICTED reason REMOVED
 * for its cached prefixes). Returns like lnk_worker_client_submit. */
int lnk_worker_client_drop(lnk_worker_client_t *c, uint64_t ns);

/* Sends HEARTBEAT now (the worker answers with LOAD). Returns like lnk_worker_client_submit. */
int lnk_worker_client_ping(lnk_worker_client_t *c);

/* Sends raw bytes after the handshake, unchecked: for tests of the worker's decoder. */
int lnk_worker_client_send_raw(lnk_worker_client_t *c, const void *bytes, size_t len);

/* Closes the connection (queued frames are written first, at most 2 s); on_close follows with
 * err 0 unless something else ended it first. */
void lnk_worker_client_close(lnk_worker_client_t *c);

/* The address being connected to or connected to, "IP:PORT" or "[IPv6]:PORT": for a host
 * name, the resolved address; "" while the name is being resolved. Valid until on_close
 * returns (read it in on_ready to log where the worker was found). */
const char *lnk_worker_client_peer(const lnk_worker_client_t *c);

/* The user data given to lnk_worker_client_connect. */
void *lnk_worker_client_data(const lnk_worker_client_t *c);

#endif
