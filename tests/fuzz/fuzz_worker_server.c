/*
 * fuzz_worker_server.c — libFuzzer target for the worker server's connection handling
 * (link/worker_server.c over link/wire_conn.c): whatever a hostile or buggy gateway
 * sends. fuzz_wire covers the codec alone; this target covers what the server does with the
 * frames the codec accepts (the handshake rules, SUBMIT/CANCEL/HEARTBEAT against a real worker,
 * frames out of place, reused ids) and with the ones it rejects.
 *
 * Two servers with a real worker each (the lnk_testmodel.h model) live for the whole process,
 * on a loop in this thread: one without a link secret, one with (its link is sealed after the
 * handshake, link/wire_seal.h). Each input is one loopback TCP connection. Byte 0:
 *   bit 1 clear: the server without a secret; bit 0 set sends a valid HELLO first (so most
 *     inputs get past the handshake), then the rest of the input is written as is;
 *   bit 1 set: the server with a secret; the target does the handshake (HELLO, the worker's
 *     CHALLENGE, the right AUTH), then the rest of the input goes out sealed with the link's
 *     key (bit 2 clear: so it reaches the frame parser behind the record layer, as a gateway's
 *     frames do) or as is (bit 2 set: the record layer's refusals: bytes injected on the path).
 * The connection then stays open until the server has been quiet for a few milliseconds, the
 * client half-closes, and reads until the server closes.
 *
 * Properties (abort otherwise): the server closes the connection; everything it sent decodes
 * as valid frames (a cut at the very end is allowed: the server drops unwritten output when
 * the peer goes away), the first one HELLO_ACK or REJECT (sealed mode: CHALLENGE in the clear,
 * then records that open with the worker's key and hold frames, the first HELLO_ACK); once
 * closed, the server holds no connection and no live request; and no crash or sanitizer
 * report.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "common.h"
#include "unit/link/lnk_testmodel.h"
#include "wire.h"
#include "wire_conn.h"
#include "wire_seal.h"
#include "worker.h"
#include "worker_server.h"
#include "fuzz_peer.h"

#define FZ_SECRET "fuzz-link-secret-0123456789"

typedef struct fz {
    uv_loop_t loop;
    uv_timer_t tick;
    lnk_worker_server_t *srv, *sealed; /* without and with a link secret */
    char model[128];
} fz_t;

static fz_t *g;

static void on_tick(uv_timer_t *t)
{
    (void)t;
}

static void model_unlink(void)
{
    if (g != NULL)
        unlink(g->model);
}

static void setup(void)
{
    g = pc_xcalloc(1, sizeof *g);
    pc_log_set_level(PC_LOG_OFF);
    snprintf(g->model, sizeof g->model, "/tmp/kvgw-fuzz-ws-%d.gguf", (int)getpid());
    char err[256];
    if (lnk_testmodel_write(g->model, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_worker_server: %s\n", err);
        abort();
    }
    atexit(model_unlink);
    uv_loop_init(&g->loop);
    uv_timer_init(&g->loop, &g->tick);
    uv_timer_start(&g->tick, on_tick, 1, 1);
    lnk_worker_server_params_t sp = lnk_worker_server_params_default();
    sp.listen = "127.0.0.1:0";
    sp.handshake_timeout_ms = 200;
    eng_worker_params_t wp = eng_worker_params_default();
    wp.engine.model_path = g->model;
    wp.engine.n_threads = 1;
    wp.engine.kv_max_tokens = 2048;
    wp.load_interval_ms = 50;
    if (lnk_worker_server_init(&g->loop, &sp, &wp, &g->srv, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_worker_server: %s\n", err);
        abort();
    }
    sp.secret = (const uint8_t *)FZ_SECRET;
    sp.secret_len = strlen(FZ_SECRET);
    if (lnk_worker_server_init(&g->loop, &sp, &wp, &g->sealed, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_worker_server: %s\n", err);
        abort();
    }
}

/* Runs the loop until done() or about 2 s; false on the timeout. */
#define RUN(cond)                                                                                  \
    do {                                                                                           \
        uint64_t dl_ = pc_time_mono_ms() + 2000;                                                   \
        while (!(cond) && pc_time_mono_ms() < dl_)                                                 \
            uv_run(&g->loop, UV_RUN_ONCE);                                                         \
    } while (0)

/* What the server sent must be frames, the first a HELLO_ACK or REJECT. */
static void check_frames(const char *bytes, size_t len)
{
    if (len == 0)
        return;
    eng_wire_decoder_t *d;
    if (eng_wire_decoder_init(0, &d) != 0)
        abort();
    eng_wire_decoder_feed(d, bytes, len);
    eng_wire_frame_t f;
    int rc, n = 0;
    while ((rc = eng_wire_decoder_next(d, &f)) == 1) {
        if (n++ == 0 && f.type != ENG_WIRE_HELLO_ACK && f.type != ENG_WIRE_REJECT)
            abort();
    }
    if (rc < 0) {
        fprintf(stderr, "server output: %s\n", eng_wire_decoder_error(d));
        abort();
    }
    eng_wire_decoder_free(d);
}

/* The sealed server's output after its CHALLENGE: records that open with rx (a cut record at
 * the end allowed), whose plaintext is frames. */
static void check_sealed(lnk_seal_t *rx, const uint8_t *bytes, size_t len)
{
    pc_buf_t plain = PC_BUF_INIT;
    size_t off = 0, used = 0;
    int rc;
    char why[256];
    while ((rc = lnk_seal_open(rx, bytes + off, len - off, &used, &plain, why, sizeof why)) == 1)
        off += used;
    if (rc < 0) {
        fprintf(stderr, "server output: %s\n", why);
        abort();
    }
    check_frames(plain.base, plain.len);
    pc_buf_free(&plain);
}

/* The sealed server's handshake: HELLO, its CHALLENGE (aborts without it), our AUTH. */
static void handshake(peer_t *p, lnk_seal_t *tx, lnk_seal_t *rx)
{
    uint8_t gn[ENG_WIRE_AUTH_BYTES], wn[ENG_WIRE_AUTH_BYTES];
    lnk_wire_nonce(gn);
    eng_wire_frame_t h = {.type = ENG_WIRE_HELLO};
    h.u.hello.version_min = h.u.hello.version_max = ENG_WIRE_VERSION;
    h.u.hello.role = ENG_WIRE_ROLE_GATEWAY;
    h.u.hello.heartbeat_ms = 1000;
    h.u.hello.max_frame = ENG_WIRE_MAX_FRAME_DEFAULT;
    h.u.hello.node = PC_SLICE_LIT("fuzz");
    memcpy(h.u.hello.auth, gn, sizeof gn);
    pc_buf_t b = PC_BUF_INIT;
    if (eng_wire_encode(&h, 0, &b, NULL, 0) != 0)
        abort();
    write_bytes(p, b.base, b.len);
    const size_t want = ENG_WIRE_HEADER_BYTES + ENG_WIRE_AUTH_BYTES;
    RUN(p->eof || p->in.len >= want);
    if (p->in.len < want || (uint8_t)p->in.base[3] != ENG_WIRE_CHALLENGE)
        abort(); /* a valid HELLO is answered with CHALLENGE */
    memcpy(wn, p->in.base + ENG_WIRE_HEADER_BYTES, sizeof wn);
    eng_wire_frame_t a = {.type = ENG_WIRE_AUTH};
    lnk_wire_auth_mac((const uint8_t *)FZ_SECRET, strlen(FZ_SECRET), ENG_WIRE_ROLE_GATEWAY, gn, wn,
                      a.u.auth.bytes);
    b.len = 0;
    if (eng_wire_encode(&a, 0, &b, NULL, 0) != 0)
        abort();
    write_bytes(p, b.base, b.len);
    pc_buf_free(&b);
    lnk_seal_derive((const uint8_t *)FZ_SECRET, strlen(FZ_SECRET), gn, wn, tx, rx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (g == NULL)
        setup();
    bool sealed = (data[0] & 2) != 0;
    lnk_worker_server_t *srv = sealed ? g->sealed : g->srv;
    peer_t *p = pc_xcalloc(1, sizeof *p);
    struct sockaddr_storage sa;
    if (lnk_wconn_parse_addr(lnk_worker_server_address(srv), &sa) != 0)
        abort();
    uv_tcp_init(&g->loop, &p->tcp);
    p->tcp.data = p->connect.data = p;
    if (uv_tcp_connect(&p->connect, &p->tcp, (struct sockaddr *)&sa, on_connect) != 0)
        abort();
    RUN(p->connected != 0);
    if (p->connected != 1)
        abort();

    lnk_seal_t tx = {0}, rx = {0};
    if (sealed) {
        handshake(p, &tx, &rx);
        if (data[0] & 4) {
            write_bytes(p, data + 1, size - 1);
        } else {
            pc_buf_t b = PC_BUF_INIT;
            if (lnk_seal_records(&tx, data + 1, size - 1, &b) != 0)
                abort();
            write_bytes(p, b.base, b.len);
            pc_buf_free(&b);
        }
    } else if (data[0] & 1) {
        eng_wire_frame_t h = {.type = ENG_WIRE_HELLO};
        h.u.hello.version_min = h.u.hello.version_max = ENG_WIRE_VERSION;
        h.u.hello.role = ENG_WIRE_ROLE_GATEWAY;
        h.u.hello.heartbeat_ms = 1000;
        h.u.hello.max_frame = ENG_WIRE_MAX_FRAME_DEFAULT;
        h.u.hello.node = PC_SLICE_LIT("fuzz");
        pc_buf_t b = PC_BUF_INIT;
        if (eng_wire_encode(&h, 0, &b, NULL, 0) != 0)
            abort();
        write_bytes(p, b.base, b.len);
        pc_buf_free(&b);
    }
    if (!sealed)
        write_bytes(p, data + 1, size - 1);
    /* Let the requests run a little: until the server is quiet for 5 ms (at most 2 s). */
    p->last_rx_ms = uv_now(&g->loop);
    RUN(p->eof || uv_now(&g->loop) - p->last_rx_ms >= 5);
    if (!p->eof)
        uv_shutdown(&p->shutdown, (uv_stream_t *)&p->tcp, on_shutdown);
    RUN(p->eof);
    if (!p->eof) {
        fprintf(stderr, "the server did not close the connection\n");
        abort();
    }
    const size_t clear = ENG_WIRE_HEADER_BYTES + ENG_WIRE_AUTH_BYTES; /* the CHALLENGE */
    if (sealed)
        check_sealed(&rx, (const uint8_t *)p->in.base + clear, p->in.len - clear);
    else
        check_frames(p->in.base, p->in.len);
    uv_close((uv_handle_t *)&p->tcp, on_closed);
    lnk_worker_server_stats_t st;
    RUN(p->closed && (lnk_worker_server_stats(srv, &st), st.conns_open == 0));
    lnk_worker_server_stats(srv, &st);
    if (!p->closed || st.conns_open != 0 || st.requests_live != 0) {
        fprintf(stderr, "after the connection: %u open, %llu live\n", st.conns_open,
                (unsigned long long)st.requests_live);
        abort();
    }
    if (getenv("KVGW_FUZZ_VERBOSE") != NULL)
        fprintf(stderr,
                "input %zu bytes: %zu bytes back; so far %llu submitted, %llu refused, "
                "%llu orphaned, %llu rejected, %llu bad frames\n",
                size, p->in.len, (unsigned long long)st.requests_submitted,
                (unsigned long long)st.requests_refused, (unsigned long long)st.requests_orphaned,
                (unsigned long long)st.conns_rejected, (unsigned long long)st.conns_bad_frame);
    pc_buf_free(&p->in);
    pc_free(p);
    return 0;
}
