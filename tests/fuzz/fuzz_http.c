/*
 * fuzz_http.c — libFuzzer target for the gateway's HTTP server (gateway/http.c): whatever a
 * hostile client sends over one connection.
 *
 * One server lives for the whole process, on a loop in this thread, with small limits so that
 * every limit is reachable (4 KiB of headers, 20 fields, 4 KiB bodies, 4 pipelined requests).
 * The handler answers in three ways chosen by the request path, so that the fuzzer reaches
 * every response path: a path holding 'h' is held and answered only after the input was sent
 * (out of order: the latest first), one holding 's' is streamed in chunks, the rest are echoed
 * at once; HEAD gets a 204 (a response parser cannot tell a HEAD answer's length). A path
 * holding 't' marks the connection trusted. stream_high_water is 4 KiB, so answers held behind a
 * held request reach the output bound and pause parsing until the held one is answered; the
 * per-peer count and the body deadline (with its minimum rate) run on every connection.
 *
 * Each input is one loopback TCP connection: byte 0 bit 0 set splits the rest into two writes
 * 2 ms apart (partial parses); the rest is written as is; the loop runs until the server is
 * quiet for 5 ms, the held requests are answered, the client half-closes and reads until the
 * server closes.
 *
 * Properties (abort otherwise): the server closes the connection; everything it sent parses
 * as a sequence of HTTP/1.1 responses under llhttp (strict, response mode); afterwards it holds
 * no connection, and every request it handed out either ended or was aborted exactly once; no
 * crash or sanitizer report.
 */
#include <llhttp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "common.h"
#include "http.h"
#include "fuzz_peer.h"

#define MAX_HELD 64

typedef struct fz {
    uv_loop_t loop;
    uv_timer_t tick;
    gw_http_server_t *srv;
    gw_http_req_t *held[MAX_HELD];
    int n_held;
    uint64_t handed, ended, aborted;
} fz_t;

static fz_t *g;

static void on_tick(uv_timer_t *t)
{
    (void)t;
}

static void on_abort(gw_http_req_t *r, void *data)
{
    (void)data;
    g->aborted++;
    for (int i = 0; i < g->n_held; i++)
        if (g->held[i] == r) {
            g->held[i] = g->held[--g->n_held];
            break;
        }
}

static void answer(gw_http_req_t *r)
{
    const char *path = gw_http_req_path(r);
    int rc;
    if (strcmp(gw_http_req_method(r), "HEAD") == 0) {
        rc = gw_http_respond(r, 204, NULL, 0, NULL, 0);
    } else if (strchr(path, 's') != NULL) {
        gw_http_header_t h = {"Content-Type", "text/event-stream"};
        rc = gw_http_stream_begin(r, 200, &h, 1);
        pc_slice_t body = gw_http_req_body(r);
        if (rc == 0)
            rc = gw_http_stream_write(r, "data: x\n\n", 9);
        if (rc == 0)
            rc = gw_http_stream_write(r, body.base, body.len);
        if (rc == 0)
            rc = gw_http_stream_end(r);
    } else {
        pc_slice_t body = gw_http_req_body(r);
        gw_http_header_t h[] = {{"Content-Type", "text/plain"}, {"X-Path", "p"}};
        rc = gw_http_respond(r, 200, h, 2, body.base, body.len);
    }
    if (rc == 0)
        g->ended++;
    else if (rc != PC_ERR_CLOSED && rc != PC_ERR_OVERLOADED)
        abort(); /* nothing else may fail for a valid answer */
}

static void on_request(gw_http_req_t *r, void *ud)
{
    (void)ud;
    g->handed++;
    gw_http_req_on_abort(r, on_abort);
    if (strchr(gw_http_req_path(r), 't') != NULL)
        gw_http_req_set_trusted(r);
    if (strchr(gw_http_req_path(r), 'h') != NULL && g->n_held < MAX_HELD) {
        g->held[g->n_held++] = r;
        return;
    }
    answer(r);
}

static void setup(void)
{
    g = pc_xcalloc(1, sizeof *g);
    pc_log_set_level(PC_LOG_OFF);
    uv_loop_init(&g->loop);
    uv_timer_init(&g->loop, &g->tick);
    uv_timer_start(&g->tick, on_tick, 1, 1);
    gw_http_params_t p = gw_http_params_default();
    p.port = 0;
    p.max_header_bytes = 4096;
    p.max_headers = 20;
    p.max_body_bytes = 4096;
    p.max_pipeline = 4;
    p.header_timeout_ms = p.body_timeout_ms = 1000;
    p.body_min_rate = 2048;
    p.max_connections_per_peer = 4;
    p.reserved_connections = 16;
    p.idle_timeout_ms = 2000;
    p.linger_ms = 200;
    p.stream_high_water = 4096;
    p.on_request = on_request;
    char err[256];
    if (gw_http_server_init(&g->loop, &p, &g->srv, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_http: %s\n", err);
        abort();
    }
}

/* Runs the loop until cond or about 3 s. */
#define RUN(cond)                                                                                  \
    do {                                                                                           \
        uint64_t dl_ = pc_time_mono_ms() + 3000;                                                   \
        while (!(cond) && pc_time_mono_ms() < dl_)                                                 \
            uv_run(&g->loop, UV_RUN_ONCE);                                                         \
    } while (0)

static int count_message(llhttp_t *p)
{
    (*(int *)p->data)++;
    return 0;
}

/* What the server sent must be HTTP/1.1 responses (the last one may be cut short only when
 * the connection was dropped mid-stream). */
static void check_output(const pc_buf_t *in)
{
    if (in->len == 0)
        return;
    llhttp_settings_t st;
    llhttp_settings_init(&st);
    st.on_message_complete = count_message;
    llhttp_t p;
    llhttp_init(&p, HTTP_RESPONSE, &st);
    int n = 0;
    p.data = &n;
    llhttp_errno_t e = llhttp_execute(&p, in->base, in->len);
    if (e != HPE_OK) {
        fprintf(stderr, "server output is not HTTP: %s after %d responses\n%.*s\n",
                llhttp_errno_name(e), n, (int)(in->len < 2000 ? in->len : 2000), in->base);
        abort();
    }
    if (memcmp(in->base, "HTTP/1.1 ", 9) != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (g == NULL)
        setup();
    peer_t *p = pc_xcalloc(1, sizeof *p);
    struct sockaddr_in sa;
    uv_ip4_addr("127.0.0.1", gw_http_server_port(g->srv), &sa);
    uv_tcp_init(&g->loop, &p->tcp);
    p->tcp.data = p->connect.data = p;
    if (uv_tcp_connect(&p->connect, &p->tcp, (struct sockaddr *)&sa, on_connect) != 0)
        abort();
    RUN(p->connected != 0);
    if (p->connected != 1)
        abort();

    const uint8_t *body = data + 1;
    size_t n = size - 1;
    if ((data[0] & 1) && n > 1) {
        write_bytes(p, body, n / 2);
        uint64_t until = uv_now(&g->loop) + 2;
        RUN(uv_now(&g->loop) >= until);
        write_bytes(p, body + n / 2, n - n / 2);
    } else {
        write_bytes(p, body, n);
    }
    /* Let the server work until it is quiet for 5 ms, then answer what it holds, latest
     * first (answers behind earlier ones must wait for them). */
    p->last_rx_ms = uv_now(&g->loop);
    RUN(p->eof || uv_now(&g->loop) - p->last_rx_ms >= 5);
    while (g->n_held > 0) {
        gw_http_req_t *r = g->held[--g->n_held];
        answer(r);
        uv_run(&g->loop, UV_RUN_NOWAIT);
    }
    if (!p->eof)
        uv_shutdown(&p->shutdown, (uv_stream_t *)&p->tcp, on_shutdown);
    RUN(p->eof);
    if (!p->eof) {
        fprintf(stderr, "the server did not close the connection\n");
        abort();
    }
    check_output(&p->in);
    uv_close((uv_handle_t *)&p->tcp, on_closed);
    gw_http_stats_t st;
    RUN(p->closed && (gw_http_server_stats(g->srv, &st), st.conns_open == 0));
    gw_http_server_stats(g->srv, &st);
    if (!p->closed || st.conns_open != 0 || st.conns_untrusted != 0 || g->n_held != 0 ||
        g->handed != g->ended + g->aborted || st.requests_aborted != g->aborted) {
        fprintf(stderr,
                "after the connection: %u open, %d held, %llu handed, %llu ended, %llu "
                "aborted (server counted %llu)\n",
                st.conns_open, g->n_held, (unsigned long long)g->handed,
                (unsigned long long)g->ended, (unsigned long long)g->aborted,
                (unsigned long long)st.requests_aborted);
        abort();
    }
    if (getenv("KVGW_FUZZ_VERBOSE") != NULL)
        fprintf(stderr, "input %zu bytes: %zu bytes back; so far %llu requests, %llu errors\n",
                size, p->in.len, (unsigned long long)st.requests,
                (unsigned long long)st.errors_4xx);
    pc_buf_free(&p->in);
    pc_free(p);
    return 0;
}
