/*
 * wire_conn.c — a worker-protocol TCP connection on libuv (contract in wire_conn.h).
 *
 * Output: frames are encoded into c->_out; a flush steals that buffer into a write request, so
 * one uv_write carries every frame produced since the last flush and nothing is copied twice.
 * The write callback gives the bytes back to the queue accounting. libuv runs every write
 * callback (UV_ECANCELED when closing) before the close callback, so when on_closed runs no
 * write request is left.
 */
#include "wire_conn.h"

#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sodium.h>
#include <string.h>

#include "common.h"
#include "lnk_addr.h"

#define DEFAULT_QUEUE_BYTES ((size_t)64 << 20)
#define DRAIN_MS 2000

typedef struct wreq {
    uv_write_t req;
    lnk_wconn_t *c;
    pc_buf_t buf;
} wreq_t;

static void hard_close(lnk_wconn_t *c);

void lnk_wconn_closef(lnk_wconn_t *c, int err, const char *fmt, ...)
{
    char why[LNK_WCONN_REASON_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    lnk_wconn_close(c, err, why, false);
}

/* The timer's period: fine enough for the shortest interval it watches. */
static uint64_t tick_ms(const lnk_wconn_t *c)
{
    uint64_t t = 1000;
    if (c->_heartbeat_ms > 0)
        t = PC_MIN(t, c->_heartbeat_ms / 4);
    if (c->_peer_timeout_ms > 0)
        t = PC_MIN(t, c->_peer_timeout_ms / 8);
    if (c->_deadline_ms > 0)
        t = PC_MIN(t, 50);
    return PC_MAX(t, 5);
}

static void on_timer(uv_timer_t *t);

static void timer_restart(lnk_wconn_t *c)
{
    if (c->state >= LNK_WCONN_CLOSING)
        return;
    uint64_t ms = tick_ms(c);
    uv_timer_start(&c->timer, on_timer, ms, ms);
}

int lnk_wconn_init(uv_loop_t *loop, lnk_wconn_t *c, const lnk_wconn_ops_t *ops, void *data,
                   uint32_t max_frame, size_t max_queue_bytes)
{
    memset(c, 0, offsetof(lnk_wconn_t, _rbuf));
    c->data = data;
    c->_ops = ops;
    c->_max_queue_bytes = max_queue_bytes > 0 ? max_queue_bytes : DEFAULT_QUEUE_BYTES;
    c->max_frame_out = ENG_WIRE_MAX_FRAME_DEFAULT;
    int rc = eng_wire_decoder_init(max_frame, &c->_dec);
    if (rc != 0)
        return rc;
    if (uv_tcp_init(loop, &c->tcp) != 0) {
        eng_wire_decoder_free(c->_dec);
        c->_dec = NULL;
        return PC_ERR_IO;
    }
    uv_timer_init(loop, &c->timer); /* cannot fail */
    c->tcp.data = c;
    c->timer.data = c;
    c->_n_open = 2;
    c->state = LNK_WCONN_IDLE;
    return 0;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    lnk_wconn_t *c = h->data;
    buf->base = c->_rbuf;
    buf->len = sizeof c->_rbuf;
}

/* Received bytes to the frame decoder: as they are, or (sealed) through the record layer.
 * Returns 0 or a negative error (the reason in c->_why for the record layer's). */
static int ingest(lnk_wconn_t *c, const void *data, size_t len)
{
    if (!c->_rx_sealed)
        return eng_wire_decoder_feed(c->_dec, data, len);
    if (len == 0)
        return 0;
    if (pc_buf_append(&c->_rin, data, len) != 0)
        return PC_ERR_NOMEM;
    c->_plain.len = 0;
    size_t off = 0, used = 0;
    int rc;
    while ((rc = lnk_seal_open(&c->_rx, (const uint8_t *)c->_rin.base + off, c->_rin.len - off,
                               &used, &c->_plain, c->_why, sizeof c->_why)) == 1)
        off += used;
    if (rc < 0)
        return rc;
    memmove(c->_rin.base, c->_rin.base + off, c->_rin.len - off);
    c->_rin.len -= off;
    return eng_wire_decoder_feed(c->_dec, c->_plain.base, c->_plain.len);
}

/* Sealing began while a frame was handled: what the decoder holds after that frame was sealed
 * already, so it goes through the record layer. */
static int reingest(lnk_wconn_t *c)
{
    c->_rx_switch = false;
    pc_buf_t rest = PC_BUF_INIT;
    int rc = eng_wire_decoder_take(c->_dec, &rest);
    if (rc == 0)
        rc = ingest(c, rest.base, rest.len);
    pc_buf_free(&rest);
    return rc;
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    lnk_wconn_t *c = s->data;
    if (n == 0)
        return;
    if (n < 0) {
        if (n == UV_EOF)
            lnk_wconn_close(c, PC_ERR_CLOSED, "peer closed the connection", false);
        else
            lnk_wconn_closef(c, PC_ERR_IO, "read: %s", uv_strerror((int)n));
        return;
    }
    if (c->state != LNK_WCONN_OPEN)
        return;
    c->_last_rx_ms = uv_now(c->tcp.loop);
    c->bytes_in += (uint64_t)n;
    int rc = ingest(c, buf->base, (size_t)n);
    eng_wire_frame_t f;
    c->_in_read = true;
    while (rc == 0 && c->state == LNK_WCONN_OPEN) {
        rc = eng_wire_decoder_next(c->_dec, &f);
        if (rc != 1)
            break;
        c->frames_in++;
        c->_ops->on_frame(c, &f);
        rc = 0;
        if (c->_rx_switch && c->state == LNK_WCONN_OPEN)
            rc = reingest(c);
    }
    c->_in_read = false;
    if (c->state != LNK_WCONN_OPEN)
        return;
    if (rc < 0) {
        const char *why = c->_why[0] != '\0' ? c->_why : eng_wire_decoder_error(c->_dec);
        if (why[0] == '\0')
            why = pc_strerror(rc);
        char reason[LNK_WCONN_REASON_MAX + 16];
        snprintf(reason, sizeof reason, "%s: %s", c->_why[0] != '\0' ? "link" : "bad frame", why);
        if (c->error_frame != 0) {
            eng_wire_frame_t e = {.type = c->error_frame};
            e.u.error.code = rc;
            e.u.error.message = pc_slice_cstr(reason); /* < ENG_WIRE_MESSAGE_MAX */
            lnk_wconn_send(c, &e);
        }
        lnk_wconn_close(c, rc, reason, c->error_frame != 0);
        return;
    }
    lnk_wconn_flush(c);
}

void lnk_wconn_seal(lnk_wconn_t *c, const lnk_seal_t *tx, const lnk_seal_t *rx)
{
    PC_ASSERT(!c->_tx_sealed && !c->_rx_sealed);
    c->_tx = *tx;
    c->_rx = *rx;
    c->_tx_sealed = c->_rx_sealed = true;
    c->_rx_switch = c->_in_read;
    if (!c->_in_read && eng_wire_decoder_pending(c->_dec) > 0 && reingest(c) != 0)
        lnk_wconn_close(c, PC_ERR_PERM, c->_why[0] ? c->_why : "cannot open sealed records", false);
}

void lnk_wconn_set_max_frame_in(lnk_wconn_t *c, uint32_t max_frame)
{
    eng_wire_decoder_set_max_frame(c->_dec, max_frame);
}

int lnk_wconn_start(lnk_wconn_t *c)
{
    PC_ASSERT(c->state == LNK_WCONN_IDLE);
    c->state = LNK_WCONN_OPEN;
    uint64_t now = uv_now(c->tcp.loop);
    c->_last_rx_ms = c->_last_tx_ms = now;
    uv_tcp_nodelay(&c->tcp, 1); /* tokens are small frames that must leave at once */
    int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (rc != 0) {
        lnk_wconn_closef(c, PC_ERR_IO, "read start: %s", uv_strerror(rc));
        return PC_ERR_IO;
    }
    timer_restart(c);
    return 0;
}

/* Appends f to out, sealed when the link is. Returns like eng_wire_encode (out unchanged on
 * failure). */
static int encode_frame(lnk_wconn_t *c, const eng_wire_frame_t *f, pc_buf_t *out, char *why,
                        size_t why_len)
{
    if (!c->_tx_sealed)
        return eng_wire_encode(f, c->max_frame_out, out, why, why_len);
    c->_plain.len = 0;
    int rc = eng_wire_encode(f, c->max_frame_out, &c->_plain, why, why_len);
    if (rc == 0)
        rc = lnk_seal_records(&c->_tx, c->_plain.base, c->_plain.len, out);
    return rc;
}

/* Whether the output may grow by n bytes; otherwise the connection is closed. With an
 * error_frame, the peer is told why in one small frame past the limit and the close drains what
 * is queued (at most DRAIN_MS), so a peer that reads slowly learns why its requests end; one
 * that does not read at all is dropped when the drain times out. */
static int queue_check(lnk_wconn_t *c, size_t n)
{
    size_t queued = lnk_wconn_queued_bytes(c);
    if (queued + n <= c->_max_queue_bytes)
        return 0;
    char why[LNK_WCONN_REASON_MAX];
    snprintf(why, sizeof why, "peer is not reading: %zu bytes queued (limit %zu)", queued + n,
             c->_max_queue_bytes);
    bool tell = c->error_frame != 0;
    if (tell) {
        eng_wire_frame_t e = {.type = c->error_frame};
        e.u.error.code = PC_ERR_OVERLOADED;
        e.u.error.message = pc_slice_cstr(why); /* ASCII, < ENG_WIRE_MESSAGE_MAX */
        tell = encode_frame(c, &e, &c->_out, NULL, 0) == 0;
    }
    lnk_wconn_close(c, PC_ERR_OVERLOADED, why, tell);
    return PC_ERR_OVERLOADED;
}

int lnk_wconn_send(lnk_wconn_t *c, const eng_wire_frame_t *f)
{
    if (c->state != LNK_WCONN_OPEN)
        return PC_ERR_CLOSED;
    size_t before = c->_out.len;
    char why[160];
    int rc = encode_frame(c, f, &c->_out, why, sizeof why);
    if (rc == PC_ERR_INVAL) {
        PC_LOG(PC_LOG_ERROR, "wire", "not sending an invalid %s frame: %s",
               eng_wire_type_name(f->type), why);
        return rc;
    }
    if (rc != 0) {
        lnk_wconn_close(c, rc, "out of memory encoding a frame", false);
        return rc;
    }
    size_t n = c->_out.len - before;
    c->_out.len = before; /* the check counts the new frame as not yet queued */
    if ((rc = queue_check(c, n)) != 0)
        return rc;
    c->_out.len = before + n;
    c->frames_out++;
    return 0;
}

int lnk_wconn_send_raw(lnk_wconn_t *c, const void *bytes, size_t len)
{
    if (c->state != LNK_WCONN_OPEN)
        return PC_ERR_CLOSED;
    int rc = queue_check(c, len);
    if (rc != 0)
        return rc;
    if (pc_buf_append(&c->_out, bytes, len) != 0) {
        lnk_wconn_close(c, PC_ERR_NOMEM, "out of memory queueing bytes", false);
        return PC_ERR_NOMEM;
    }
    return 0;
}

static void on_write(uv_write_t *req, int status)
{
    wreq_t *w = PC_CONTAINER_OF(req, wreq_t, req);
    lnk_wconn_t *c = w->c;
    c->_bytes_writing -= w->buf.len;
    pc_buf_free(&w->buf);
    pc_free(w);
    if (status < 0 && status != UV_ECANCELED)
        lnk_wconn_closef(c, PC_ERR_IO, "write: %s", uv_strerror(status));
}

int lnk_wconn_flush(lnk_wconn_t *c)
{
    if (c->_out.len == 0 || c->state != LNK_WCONN_OPEN || c->_in_read)
        return 0;
    wreq_t *w = pc_malloc(sizeof *w);
    if (w == NULL) {
        lnk_wconn_close(c, PC_ERR_NOMEM, "out of memory writing", false);
        return PC_ERR_NOMEM;
    }
    w->c = c;
    w->buf = c->_out;
    c->_out = PC_BUF_INIT;
    uv_buf_t b = uv_buf_init(w->buf.base, (unsigned)w->buf.len);
    int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_write);
    if (rc != 0) {
        pc_buf_free(&w->buf);
        pc_free(w);
        lnk_wconn_closef(c, PC_ERR_IO, "write: %s", uv_strerror(rc));
        return PC_ERR_IO;
    }
    c->_bytes_writing += b.len;
    c->bytes_out += b.len;
    c->_last_tx_ms = uv_now(c->tcp.loop);
    return 0;
}

void lnk_wconn_set_heartbeat(lnk_wconn_t *c, uint32_t interval_ms, uint32_t peer_timeout_ms)
{
    c->_heartbeat_ms = interval_ms;
    c->_peer_timeout_ms = peer_timeout_ms;
    c->_last_rx_ms = uv_now(c->tcp.loop);
    timer_restart(c);
}

void lnk_wconn_set_deadline(lnk_wconn_t *c, uint32_t ms, const char *why)
{
    c->_deadline_ms = ms > 0 ? uv_now(c->tcp.loop) + ms : 0;
    c->_deadline_why = why;
    timer_restart(c); /* a deadline also bounds a connect in progress (IDLE) */
}

static void on_timer(uv_timer_t *t)
{
    lnk_wconn_t *c = t->data;
    uint64_t now = uv_now(t->loop);
    if (c->state == LNK_WCONN_DRAINING) {
        if (now >= c->_deadline_ms)
            hard_close(c);
        return;
    }
    if (c->state != LNK_WCONN_OPEN && c->state != LNK_WCONN_IDLE)
        return;
    if (c->_deadline_ms > 0 && now >= c->_deadline_ms) {
        lnk_wconn_close(c, PC_ERR_TIMEOUT, c->_deadline_why ? c->_deadline_why : "deadline passed",
                        false);
        return;
    }
    if (c->state != LNK_WCONN_OPEN)
        return;
    if (c->_peer_timeout_ms > 0 && now - c->_last_rx_ms > c->_peer_timeout_ms) {
        lnk_wconn_closef(c, PC_ERR_TIMEOUT, "peer silent for %llu ms (timeout %u ms)",
                         (unsigned long long)(now - c->_last_rx_ms), c->_peer_timeout_ms);
        return;
    }
    if (c->_heartbeat_ms > 0 && now - c->_last_tx_ms >= c->_heartbeat_ms &&
        c->_bytes_writing == 0) {
        eng_wire_frame_t f = {.type = ENG_WIRE_HEARTBEAT};
        f.u.heartbeat_ms = now;
        if (lnk_wconn_send(c, &f) == 0)
            lnk_wconn_flush(c);
    }
}

static void on_handle_closed(uv_handle_t *h)
{
    lnk_wconn_t *c = h->data;
    if (--c->_n_open > 0)
        return;
    eng_wire_decoder_free(c->_dec);
    c->_dec = NULL;
    pc_buf_free(&c->_out);
    pc_buf_free(&c->_rin);
    pc_buf_free(&c->_plain);
    lnk_seal_wipe(&c->_tx);
    lnk_seal_wipe(&c->_rx);
    c->state = LNK_WCONN_CLOSED;
    c->_ops->on_closed(c);
}

static void hard_close(lnk_wconn_t *c)
{
    if (c->state >= LNK_WCONN_CLOSING)
        return;
    c->state = LNK_WCONN_CLOSING;
    uv_read_stop((uv_stream_t *)&c->tcp);
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    lnk_wconn_t *c = req->handle->data;
    if (c->state == LNK_WCONN_DRAINING)
        hard_close(c);
}

void lnk_wconn_close(lnk_wconn_t *c, int err, const char *reason, bool drain)
{
    if (c->state >= LNK_WCONN_CLOSING)
        return;
    if (c->state == LNK_WCONN_DRAINING) {
        if (!drain)
            hard_close(c);
        return;
    }
    c->close_err = err;
    snprintf(c->close_reason, sizeof c->close_reason, "%s", reason ? reason : "");
    if (drain && c->state == LNK_WCONN_OPEN) {
        c->_in_read = false; /* the last flush happens now */
        lnk_wconn_flush(c);
        if (c->state == LNK_WCONN_OPEN) {
            uv_read_stop((uv_stream_t *)&c->tcp);
            if (uv_shutdown(&c->_shutdown, (uv_stream_t *)&c->tcp, on_shutdown) == 0) {
                c->state = LNK_WCONN_DRAINING;
                c->_deadline_ms = uv_now(c->tcp.loop) + DRAIN_MS;
                timer_restart(c);
                return;
            }
        }
    }
    hard_close(c);
}

int lnk_wconn_parse_addr(const char *hostport, struct sockaddr_storage *addr)
{
    lnk_addr_t a;
    if (lnk_addr_parse(hostport, LNK_ADDR_PORT_ZERO, &a, NULL, 0) != 0)
        return PC_ERR_INVAL;
    if (a.kind == LNK_ADDR_NAME) {
        if (strcmp(a.host, "localhost") != 0)
            return PC_ERR_INVAL;
        return uv_ip4_addr("127.0.0.1", a.port, (struct sockaddr_in *)addr) == 0 ? 0 : PC_ERR_INVAL;
    }
    *addr = a.sa;
    return 0;
}

void lnk_wconn_format_addr(const struct sockaddr *addr, char *buf, size_t len)
{
    char ip[64] = "?";
    int port = 0;
    if (addr->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)addr;
        uv_ip4_name(a, ip, sizeof ip);
        port = ntohs(a->sin_port);
        snprintf(buf, len, "%s:%d", ip, port);
    } else if (addr->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)addr;
        uv_ip6_name(a, ip, sizeof ip);
        port = ntohs(a->sin6_port);
        snprintf(buf, len, "[%s]:%d", ip, port);
    } else {
        snprintf(buf, len, "?");
    }
}

/* ---- link authentication ------------------------------------------------------------------- */

#define AUTH_LABEL_GATEWAY "kvgw-link-v2 gateway"
#define AUTH_LABEL_WORKER "kvgw-link-v2 worker"

void lnk_wire_auth_mac(const uint8_t *secret, size_t secret_len, uint8_t role,
                       const uint8_t gateway_nonce[ENG_WIRE_AUTH_BYTES],
                       const uint8_t worker_nonce[ENG_WIRE_AUTH_BYTES],
                       uint8_t mac[ENG_WIRE_AUTH_BYTES])
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, secret, secret_len);
    if (role == ENG_WIRE_ROLE_GATEWAY) {
        crypto_auth_hmacsha256_update(&st, (const uint8_t *)AUTH_LABEL_GATEWAY,
                                      strlen(AUTH_LABEL_GATEWAY));
        crypto_auth_hmacsha256_update(&st, worker_nonce, ENG_WIRE_AUTH_BYTES);
        crypto_auth_hmacsha256_update(&st, gateway_nonce, ENG_WIRE_AUTH_BYTES);
    } else {
        crypto_auth_hmacsha256_update(&st, (const uint8_t *)AUTH_LABEL_WORKER,
                                      strlen(AUTH_LABEL_WORKER));
        crypto_auth_hmacsha256_update(&st, gateway_nonce, ENG_WIRE_AUTH_BYTES);
        crypto_auth_hmacsha256_update(&st, worker_nonce, ENG_WIRE_AUTH_BYTES);
    }
    crypto_auth_hmacsha256_final(&st, mac);
    sodium_memzero(&st, sizeof st);
}

bool lnk_wire_auth_equal(const uint8_t a[ENG_WIRE_AUTH_BYTES], const uint8_t b[ENG_WIRE_AUTH_BYTES])
{
    return crypto_verify_32(a, b) == 0;
}

void lnk_wire_nonce(uint8_t out[ENG_WIRE_AUTH_BYTES])
{
    if (sodium_init() < 0)
        PC_ABORT("libsodium cannot initialize (no system randomness)");
    randombytes_buf(out, ENG_WIRE_AUTH_BYTES);
}
