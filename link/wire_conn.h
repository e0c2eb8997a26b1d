/*
 * wire_conn.h — one TCP connection that speaks the worker protocol (engine/wire.h): the part
 * that the worker server (worker_server.c) and its client library (worker_client.c) share.
 *
 * A lnk_wconn_t owns a uv_tcp_t, a uv_timer_t, the incremental frame decoder and the output
 * queue. It turns uv_read_cb chunks into decoded frames (ops->on_frame, one call per frame),
 * encodes outgoing frames into a pending buffer that lnk_wconn_flush hands to uv_write in one
 * piece, and runs the liveness rules of the protocol on its timer:
 *
 *   - once the handshake is done (lnk_wconn_set_heartbeat), it sends HEARTBEAT whenever it sent
 *     nothing for heartbeat_ms, and drops a peer silent for longer than the peer timeout (the
 *     protocol's rule: 3 of the peer's intervals) with PC_ERR_TIMEOUT;
 *   - an optional deadline (the handshake) drops the connection when it passes;
 *   - bytes queued for writing (handed to uv_write and not yet written, plus the pending
 *     buffer) never exceed max_queue_bytes: a peer that stops reading is dropped with
 *     PC_ERR_OVERLOADED instead of growing memory without bound (with an error_frame set, the
 *     peer gets that frame with the reason, one small frame past the limit, and the close
 *     drains for at most 2 s).
 *
 * Sealing. On an authenticated link (a link secret), both sides call lnk_wconn_seal at the end
 * of the CHALLENGE / AUTH exchange: from then on every frame sent goes out in sealed records
 * (wire_seal.h) and every byte received after the frame being handled is opened as records
 * before it reaches the frame decoder. A record that does not verify closes the connection
 * with PC_ERR_PERM and the reason (the peer gets the error_frame, sealed).
 *
 * Lifecycle. lnk_wconn_init initializes both handles (the owner then accepts or connects on
 * c->tcp) and lnk_wconn_start begins reading. Every path out goes through lnk_wconn_close, which
 * records the first reason, stops reading and closes both handles; ops->on_closed runs once
 * after both close callbacks, and only then may the owner free the memory that embeds the
 * connection. A connection that was initialized must be closed, even if it never started. A
 * closing connection accepts no more frames (lnk_wconn_send returns PC_ERR_CLOSED) and calls no
 * more on_frame.
 *
 * Threads: everything runs on the loop's thread.
 */
#ifndef LNK_WIRE_CONN_H
#define LNK_WIRE_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "pc_assert.h"
#include "wire.h"
#include "wire_seal.h"

#define LNK_WCONN_READ_BYTES (64u << 10)
#define LNK_WCONN_REASON_MAX 256

typedef struct lnk_wconn lnk_wconn_t;

typedef struct lnk_wconn_ops {
    /* A decoded frame; f and what it points to are valid only during the call. The callback
     * may send frames and may close the connection (later frames of the chunk are dropped). */
    void (*on_frame)(lnk_wconn_t *c, const eng_wire_frame_t *f);
    /* Both handles are closed: the owner may free the memory now. c->close_err and
     * c->close_reason say why the connection ended (0 and "" for an orderly local close). */
    void (*on_closed)(lnk_wconn_t *c);
} lnk_wconn_ops_t;

enum lnk_wconn_state {
    LNK_WCONN_IDLE = 0, /* initialized, not reading yet */
    LNK_WCONN_OPEN,     /* reading and writing */
    LNK_WCONN_DRAINING, /* closing after the queued bytes are written (uv_shutdown) */
    LNK_WCONN_CLOSING,  /* handles closing */
    LNK_WCONN_CLOSED,   /* both close callbacks ran */
};

/* Transparent so that owners embed it; fields with a leading underscore are private. */
struct lnk_wconn {
    uv_tcp_t tcp; /* tcp.data and timer.data are the connection's; use c->data */
    uv_timer_t timer;
    void *data; /* the owner's */
    int state;  /* enum lnk_wconn_state, read-only for the owner */
    int close_err;
    char close_reason[LNK_WCONN_REASON_MAX];
    uint32_t max_frame_out; /* the largest payload the peer accepts (its HELLO's max_frame) */
    uint64_t frames_in, frames_out, bytes_in, bytes_out;
    /* Set by the owner: on a bad frame, send a frame of this type (ENG_WIRE_REJECT during the
     * handshake, ENG_WIRE_ERROR with request 0 after it) with the reason before closing; 0
     * sends nothing (the gateway side: the protocol has no such frame from the gateway). */
    uint8_t error_frame;

    const lnk_wconn_ops_t *_ops;
    eng_wire_decoder_t *_dec;
    pc_buf_t _out;         /* encoded frames not handed to uv_write yet */
    size_t _bytes_writing; /* handed to uv_write, write callback not run yet */
    size_t _max_queue_bytes;
    uint32_t _heartbeat_ms; /* our sending interval, 0 before the handshake */
    uint32_t _peer_timeout_ms;
    uint64_t _last_rx_ms, _last_tx_ms, _deadline_ms;
    const char *_deadline_why;
    int _n_open;   /* handles not closed yet */
    bool _in_read; /* inside the read callback: flush at its end */
    uv_shutdown_t _shutdown;
    bool _tx_sealed, _rx_sealed; /* lnk_wconn_seal was called */
    bool _rx_switch;             /* sealed while a frame was handled: reopen what follows it */
    lnk_seal_t _tx, _rx;
    pc_buf_t _rin;   /* sealed bytes received, not opened yet (at most one partial record) */
    pc_buf_t _plain; /* scratch: a frame encoded before sealing, records opened */
    char _why[LNK_WCONN_REASON_MAX]; /* why opening a record failed */
    char _rbuf[LNK_WCONN_READ_BYTES];
};

/* Initializes the handles and the decoder (max_frame: largest payload accepted, 0 = default;
 * max_queue_bytes: the output limit, 0 = 64 MiB). Returns 0, PC_ERR_NOMEM or PC_ERR_IO; on
 * failure nothing needs closing. */
int lnk_wconn_init(uv_loop_t *loop, lnk_wconn_t *c, const lnk_wconn_ops_t *ops, void *data,
                   uint32_t max_frame, size_t max_queue_bytes);

/* Starts reading and the timer (after uv_accept or a successful connect). Returns 0 or
 * PC_ERR_IO (the connection is then closing with that reason). */
int lnk_wconn_start(lnk_wconn_t *c);

/* Encodes f into the pending output (written by the next lnk_wconn_flush; frames sent from
 * on_frame are flushed when the read callback ends). Returns 0; PC_ERR_CLOSED (the connection
 * is closing: nothing sent); PC_ERR_INVAL (f breaks a protocol rule: nothing sent, connection
 * unchanged); PC_ERR_OVERLOADED (the output limit was hit: the connection is now closing). */
int lnk_wconn_send(lnk_wconn_t *c, const eng_wire_frame_t *f);

/* Appends raw bytes to the pending output, unchecked and never sealed (tests of the peer's
 * decoder, and of its record layer: bytes injected on the path). Returns like lnk_wconn_send. */
int lnk_wconn_send_raw(lnk_wconn_t *c, const void *bytes, size_t len);

/* Hands the pending output to uv_write. Returns 0 or PC_ERR_IO (the connection is closing). */
int lnk_wconn_flush(lnk_wconn_t *c);

/* Turns the heartbeats on (after the handshake; none may precede it): a HEARTBEAT whenever
 * nothing was sent for interval_ms, and a peer silent for peer_timeout_ms is dropped. Either
 * may be 0 (off). Restarts the silence clock. */
void lnk_wconn_set_heartbeat(lnk_wconn_t *c, uint32_t interval_ms, uint32_t peer_timeout_ms);

/* Drops the connection with PC_ERR_TIMEOUT and why (a static string) when it is still open ms
 * from now; 0 clears the deadline. Also works before lnk_wconn_start (a connect in progress). */
void lnk_wconn_set_deadline(lnk_wconn_t *c, uint32_t ms, const char *why);

/* Ends the connection; the first call's err and reason stick (err 0: an orderly close).
 * drain: write what is queued first (uv_shutdown; at most 2 s, then the handles close anyway).
 * Later calls only turn a drain into an immediate close when drain is false. */
void lnk_wconn_close(lnk_wconn_t *c, int err, const char *reason, bool drain);

/* lnk_wconn_close(c, err, reason, false) with the reason formatted (printf), cut to
 * LNK_WCONN_REASON_MAX - 1 bytes. */
void lnk_wconn_closef(lnk_wconn_t *c, int err, const char *fmt, ...) PC_PRINTF(3, 4);

/* Changes the largest payload accepted from the peer (0: ENG_WIRE_MAX_FRAME_DEFAULT) for every
 * frame not decoded yet, e.g. a small limit until the peer's handshake is done. */
void lnk_wconn_set_max_frame_in(lnk_wconn_t *c, uint32_t max_frame);

/* Seals the link from here on (the handshake's end; once): frames sent after this call go out
 * as records sealed with tx, bytes received after the frame being handled (or, outside
 * on_frame, every byte received from now on) are opened with rx. Frames queued before it stay
 * as they are. The states are copied. */
void lnk_wconn_seal(lnk_wconn_t *c, const lnk_seal_t *tx, const lnk_seal_t *rx);

/* Whether frames can still be sent (OPEN). */
static inline bool lnk_wconn_is_open(const lnk_wconn_t *c)
{
    return c->state == LNK_WCONN_OPEN;
}

/* Bytes queued for writing (pending plus in uv_write). */
static inline size_t lnk_wconn_queued_bytes(const lnk_wconn_t *c)
{
    return c->_out.len + c->_bytes_writing;
}

/* The link handshake's proofs (engine/wire.h, CHALLENGE): HMAC-SHA256 keyed with the link
 * secret over the role's label ("kvgw-link-v2 gateway" for AUTH's mac, "kvgw-link-v2 worker"
 * for HELLO_ACK's proof) and then the two nonces: the peer's first (the worker nonce first for
 * the gateway's mac, the gateway nonce first for the worker's proof). Pure; any thread. */
void lnk_wire_auth_mac(const uint8_t *secret, size_t secret_len, uint8_t role,
                       const uint8_t gateway_nonce[ENG_WIRE_AUTH_BYTES],
                       const uint8_t worker_nonce[ENG_WIRE_AUTH_BYTES],
                       uint8_t mac[ENG_WIRE_AUTH_BYTES]);

/* Constant-time equality of two 32-byte tags (libsodium's crypto_verify_32). */
bool lnk_wire_auth_equal(const uint8_t a[ENG_WIRE_AUTH_BYTES],
                         const uint8_t b[ENG_WIRE_AUTH_BYTES]);

/* 32 bytes from the system's CSPRNG (a handshake nonce). */
void lnk_wire_nonce(uint8_t out[ENG_WIRE_AUTH_BYTES]);

/* Parses a numeric "HOST:PORT" ("[v6]:PORT" for IPv6; "localhost" means 127.0.0.1; port 0
 * allowed) into *addr, by lnk_addr_parse's rules. Other host names are PC_ERR_INVAL here: the
 * worker client resolves them (worker_client.h), the worker server at bind. Returns 0 or
 * PC_ERR_INVAL. */
int lnk_wconn_parse_addr(const char *hostport, struct sockaddr_storage *addr);

/* "HOST:PORT" of addr into buf. */
void lnk_wconn_format_addr(const struct sockaddr *addr, char *buf, size_t len);

#endif
