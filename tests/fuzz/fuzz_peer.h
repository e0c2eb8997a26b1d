/*
 * fuzz_peer.h — a loopback TCP client on a libuv loop for the fuzz targets that drive a real
 * server with hostile bytes (fuzz_http, fuzz_worker_server): connect, write bytes, collect
 * what comes back, notice EOF and the close. Everything runs on the target's loop thread.
 */
#ifndef KVGW_FUZZ_PEER_H
#define KVGW_FUZZ_PEER_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <uv.h>

#include "common.h"

typedef struct peer {
    uv_tcp_t tcp;
    uv_connect_t connect;
    uv_shutdown_t shutdown;
    int connected; /* 0 pending, 1 ok, -1 failed */
    bool eof, closed;
    uint64_t last_rx_ms;
    pc_buf_t in;
    char rbuf[65536];
} peer_t;

static void on_alloc(uv_handle_t *h, size_t n, uv_buf_t *b)
{
    (void)n;
    peer_t *p = h->data;
    b->base = p->rbuf;
    b->len = sizeof p->rbuf;
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    peer_t *p = s->data;
    if (n > 0) {
        pc_buf_append(&p->in, b->base, (size_t)n);
        p->last_rx_ms = uv_now(s->loop);
    } else if (n < 0) {
        p->eof = true;
        uv_read_stop(s);
    }
}

static void on_connect(uv_connect_t *c, int status)
{
    peer_t *p = c->data;
    p->connected = status == 0 ? 1 : -1;
    if (status == 0)
        uv_read_start((uv_stream_t *)&p->tcp, on_alloc, on_read);
}

static void on_write(uv_write_t *w, int status)
{
    (void)status;
    pc_free(w);
}

static void on_shutdown(uv_shutdown_t *r, int status)
{
    (void)r, (void)status;
}

static void on_closed(uv_handle_t *h)
{
    ((peer_t *)h->data)->closed = true;
}

static void write_bytes(peer_t *p, const void *data, size_t len)
{
    if (len == 0)
        return;
    uv_write_t *w = pc_xmalloc(sizeof *w + len);
    memcpy(w + 1, data, len);
    uv_buf_t b = uv_buf_init((char *)(w + 1), (unsigned)len);
    if (uv_write(w, (uv_stream_t *)&p->tcp, &b, 1, on_write) != 0)
        pc_free(w);
}

#endif
