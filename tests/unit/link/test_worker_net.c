/*
 * test_worker_net.c — `kvgw worker` over TCP: the worker server (link/worker_server.c) and
 * its client library (link/worker_client.c) on real loopback sockets, with a real worker on
 * a small generated model.
 *
 * Most tests run the server and the clients on one libuv loop in this thread (so the server's
 * counters can be read between loop turns); raw sockets play the misbehaving peers (garbage,
 * silence, not reading). The last tests start the real `kvgw worker` binary and stop it with
 * SIGTERM. Every test ends with a graceful server shutdown and a loop with no handle left.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "common.h"
#include "lnk_testmodel.h"
#include "pc_test.h"
#include "wire.h"
#include "wire_conn.h"
#include "worker.h"
#include "worker_client.h"
#include "worker_client_internal.h"
#include "worker_server.h"

extern char **environ;

static char g_model[256];

static void model_unlink(void)
{
    unlink(g_model);
}

/* The test model (lnk_testmodel.h), written once per process and removed at exit. */
static const char *model_path(void)
{
    if (g_model[0] != '\0')
        return g_model;
    snprintf(g_model, sizeof g_model, "/tmp/kvgw-wnet-%d.gguf", (int)getpid());
    char err[256];
    if (lnk_testmodel_write(g_model, err, sizeof err) != 0) {
        fprintf(stderr, "mkmodel: %s\n", err);
        g_model[0] = '\0';
        return NULL;
    }
    atexit(model_unlink);
    return g_model;
}

static eng_worker_params_t worker_params(void)
{
    eng_worker_params_t wp = eng_worker_params_default();
    wp.engine.model_path = model_path();
    wp.engine.n_threads = 1;
    wp.engine.kv_max_tokens = 4096;
    wp.load_interval_ms = 200;
    return wp;
}

/* ---------------------------------------------------------------------------------------------
 * Fixture: a loop, a 5 ms ticker (so UV_RUN_ONCE returns often), the server.
 * ------------------------------------------------------------------------------------------- */

typedef struct fx {
    uv_loop_t loop;
    uv_timer_t tick;
    lnk_worker_server_t *srv;
    bool srv_closed;
    char addr[80];
} fx_t;

static void on_tick(uv_timer_t *t)
{
    (void)t;
}

static void fx_setup(fx_t *f, const lnk_worker_server_params_t *sp_in)
{
    memset(f, 0, sizeof *f);
    ASSERT_TRUE(model_path() != NULL);
    ASSERT_EQ(uv_loop_init(&f->loop), 0);
    uv_timer_init(&f->loop, &f->tick);
    uv_timer_start(&f->tick, on_tick, 5, 5);
    lnk_worker_server_params_t sp = sp_in ? *sp_in : lnk_worker_server_params_default();
    sp.listen = "127.0.0.1:0";
    eng_worker_params_t wp = worker_params();
    char err[256] = "";
    int rc = lnk_worker_server_init(&f->loop, &sp, &wp, &f->srv, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "server: %s\n", err);
    ASSERT_EQ(rc, 0);
    ASSERT_TRUE(lnk_worker_server_port(f->srv) != 0);
    snprintf(f->addr, sizeof f->addr, "%s", lnk_worker_server_address(f->srv));
}

#define RUN_UNTIL(f, cond, ms)                                                                     \
    do {                                                                                           \
        uint64_t pc_dl_ = pc_time_mono_ms() + (ms);                                                \
        while (!(cond) && pc_time_mono_ms() < pc_dl_)                                              \
            uv_run(&(f)->loop, UV_RUN_ONCE);                                                       \
        if (!(cond))                                                                               \
            PC_TEST__FAIL("timed out after %d ms waiting for %s", (int)(ms), #cond);               \
    } while (0)

static void on_srv_closed(lnk_worker_server_t *s, void *ud)
{
    (void)s;
    ((fx_t *)ud)->srv_closed = true;
}

/* Shuts the server down gracefully and checks that nothing is left on the loop. */
static void fx_teardown(fx_t *f)
{
    lnk_worker_server_shutdown(f->srv, on_srv_closed, f);
    RUN_UNTIL(f, f->srv_closed, 10000);
    lnk_worker_server_free(f->srv);
    f->srv = NULL;
    uv_close((uv_handle_t *)&f->tick, NULL);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    ASSERT_EQ(uv_loop_close(&f->loop), 0);
}

/* ---------------------------------------------------------------------------------------------
 * A client that records everything it receives.
 * ------------------------------------------------------------------------------------------- */

#define MAX_REQ 16
#define MAX_OUT 512

typedef struct rq {
    uint32_t tokens[MAX_OUT];
    uint32_t n_tokens;
    char text[8192];
    size_t text_len;
    bool done, failed;
    uint8_t stop;
    int err;
    eng_wire_usage_t usage;
    eng_wire_timing_t timing;
    uint32_t n_retained;
    eng_wire_prefill_t pf; /* its PREFILL (where the prompt came from) */
    uint32_t n_prefill;
} rq_t;

typedef struct cl {
    lnk_worker_client_t *c;
    bool ready, closed;
    int close_err;
    char close_reason[LNK_WCONN_REASON_MAX];
    char ack_model[ENG_WIRE_NAME_MAX + 1];
    eng_wire_hello_t ack; /* scalars only */
    rq_t rq[MAX_REQ + 1]; /* by request id 1..MAX_REQ */
    eng_wire_load_t load;
    uint32_t n_loads;
    /* Actions: cancel request cancel_id after cancel_at tokens; close after close_at tokens
     * of request 1. */
    uint64_t cancel_id;
    uint32_t cancel_at;
    uint32_t close_at;
    /* The pins and cache events the link reports. */
    uint32_t n_snap_frames, n_snap_entries;
    bool snap_last;
    uint64_t snap_fp, snap_ns, snap_ttl_ms;
    uint32_t snap_n_tokens;
    uint32_t n_retained_other; /* RETAINED with request id 0: another gateway's request */
    uint32_t n_released, n_removed, n_paths_ok;
} cl_t;

static void cl_on_ready(lnk_worker_client_t *c, const eng_wire_hello_t *ack, void *ud)
{
    cl_t *k = ud;
    k->ready = true;
    k->ack = *ack;
    snprintf(k->ack_model, sizeof k->ack_model, "%.*s", (int)ack->model_name.len,
             ack->model_name.base);
}

static void cl_on_frame(lnk_worker_client_t *c, const eng_wire_frame_t *f, void *ud)
{
    cl_t *k = ud;
    uint64_t id = 0;
    switch (f->type) {
    case ENG_WIRE_TOKEN: {
        id = f->u.token.request_id;
        if (id == 0 || id > MAX_REQ)
            break;
        rq_t *r = &k->rq[id];
        if (r->n_tokens < MAX_OUT)
            r->tokens[r->n_tokens++] = f->u.token.token_id;
        size_t n = PC_MIN(f->u.token.text.len, sizeof r->text - 1 - r->text_len);
        memcpy(r->text + r->text_len, f->u.token.text.base, n);
        r->text_len += n;
        if (k->cancel_id == id && r->n_tokens == k->cancel_at)
            lnk_worker_client_cancel(c, id);
        if (id == 1 && k->close_at > 0 && r->n_tokens == k->close_at)
            lnk_worker_client_close(c);
        break;
    }
    case ENG_WIRE_DONE: {
        id = f->u.done.request_id;
        if (id == 0 || id > MAX_REQ)
            break;
        rq_t *r = &k->rq[id];
        r->done = true;
        r->stop = f->u.done.stop_reason;
        r->usage = f->u.done.usage;
        r->timing = f->u.done.timing;
        size_t n = PC_MIN(f->u.done.text.len, sizeof r->text - 1 - r->text_len);
        memcpy(r->text + r->text_len, f->u.done.text.base, n);
        r->text_len += n;
        break;
    }
    case ENG_WIRE_PREFILL:
        id = f->u.prefill.request_id;
        if (id == 0 || id > MAX_REQ)
            break;
        k->rq[id].pf = f->u.prefill;
        k->rq[id].n_prefill++;
        break;
    case ENG_WIRE_ERROR:
        id = f->u.error.request_id;
        if (id == 0 || id > MAX_REQ)
            break;
        k->rq[id].failed = true;
        k->rq[id].err = f->u.error.code;
        break;
    case ENG_WIRE_KV_EVENT:
        if (f->u.kv.kind == ENG_WIRE_KV_RETAINED && f->u.kv.request_id >= 1 &&
            f->u.kv.request_id <= MAX_REQ)
            k->rq[f->u.kv.request_id].n_retained++;
        k->n_retained_other += f->u.kv.kind == ENG_WIRE_KV_RETAINED && f->u.kv.request_id == 0;
        k->n_released += f->u.kv.kind == ENG_WIRE_KV_RELEASED;
        if (f->u.kv.kind == ENG_WIRE_KV_EVICTED && f->u.kv.reason == ENG_EVICT_REMOVED) {
            k->n_removed++;
            k->n_paths_ok +=
                f->u.kv.n_path == f->u.kv.n_tokens &&
                eng_wire_prefix_fp(f->u.kv.tokens, f->u.kv.n_path) == f->u.kv.prefix_fp;
        }
        break;
    case ENG_WIRE_SNAPSHOT:
        k->n_snap_frames++;
        k->n_snap_entries += f->u.snapshot.n_entries;
        k->snap_last = f->u.snapshot.last != 0;
        if (f->u.snapshot.n_entries > 0) {
            k->snap_fp = f->u.snapshot.entries[0].prefix_fp;
            k->snap_ns = f->u.snapshot.entries[0].ns;
            k->snap_ttl_ms = f->u.snapshot.entries[0].ttl_ms;
            k->snap_n_tokens = f->u.snapshot.entries[0].n_tokens;
        }
        break;
    case ENG_WIRE_LOAD:
        k->load = f->u.load;
        k->n_loads++;
        break;
    default:
        break;
    }
}

static void cl_on_close(lnk_worker_client_t *c, int err, const char *reason, void *ud)
{
    cl_t *k = ud;
    k->closed = true;
    k->close_err = err;
    snprintf(k->close_reason, sizeof k->close_reason, "%s", reason);
    k->c = NULL;
}

static const lnk_worker_client_cbs_t cl_cbs = {cl_on_ready, cl_on_frame, cl_on_close};

static void cl_connect(fx_t *f, cl_t *k, const lnk_worker_client_params_t *pp, const char *addr)
{
    memset(k, 0, sizeof *k);
    lnk_worker_client_params_t p = pp ? *pp : lnk_worker_client_params_default();
    p.address = addr ? addr : f->addr;
    p.node = "test-gateway";
    char err[256] = "";
    int rc = lnk_worker_client_connect(&f->loop, &p, &cl_cbs, k, &k->c, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "connect: %s\n", err);
    ASSERT_EQ(rc, 0);
}

/* Connects and waits for the handshake. */
static void cl_open(fx_t *f, cl_t *k)
{
    PC_TEST_CALL(cl_connect(f, k, NULL, NULL));
    RUN_UNTIL(f, k->ready || k->closed, 5000);
    if (k->closed)
        fprintf(stderr, "closed: %s\n", k->close_reason);
    ASSERT_TRUE(k->ready);
}

static void cl_close(fx_t *f, cl_t *k)
{
    if (k->c != NULL)
        lnk_worker_client_close(k->c);
    RUN_UNTIL(f, k->closed, 5000);
}

/* A greedy request for prompt[0..n). */
static eng_wire_submit_t greedy(uint64_t id, const uint32_t *prompt, uint32_t n, uint32_t max)
{
    eng_wire_submit_t s = {.request_id = id, .ns = 42, .max_tokens = max};
    s.sampling = eng_sampling_params_default();
    s.sampling.temperature = 0;
    s.tokens = prompt;
    s.n_tokens = n;
    return s;
}

static void make_prompt(uint32_t *p, uint32_t n, uint32_t seed)
{
    for (uint32_t i = 0; i < n; i++)
        p[i] = (seed * 131 + i * 17 + i * i) % N_VOCAB;
}

/* The same requests run one at a time through an in-process worker: the reference. */
static void inproc_run(const eng_wire_submit_t *s, rq_t *out)
{
    memset(out, 0, sizeof *out);
    eng_worker_params_t wp = worker_params();
    eng_worker_t *w;
    char err[256];
    ASSERT_EQ(eng_worker_init(&wp, &w, err, sizeof err), 0);
    int rc = eng_worker_submit(w, s, err, sizeof err);
    ASSERT_EQ(rc, 0);
    eng_worker_event_t ev[16];
    uint64_t deadline = pc_time_mono_ms() + 20000;
    while (!out->done && !out->failed && pc_time_mono_ms() < deadline) {
        size_t k = eng_worker_poll_wait(w, ev, 16, 100);
        for (size_t i = 0; i < k; i++) {
            if (ev[i].type == ENG_WIRE_TOKEN && out->n_tokens < MAX_OUT) {
                out->tokens[out->n_tokens++] = ev[i].u.token.token_id;
                memcpy(out->text + out->text_len, ev[i].u.token.text.base,
                       PC_MIN(ev[i].u.token.text.len, sizeof out->text - 1 - out->text_len));
                out->text_len +=
                    PC_MIN(ev[i].u.token.text.len, sizeof out->text - 1 - out->text_len);
            } else if (ev[i].type == ENG_WIRE_DONE) {
                size_t n = PC_MIN(ev[i].u.done.text.len, sizeof out->text - 1 - out->text_len);
                memcpy(out->text + out->text_len, ev[i].u.done.text.base, n);
                out->text_len += n;
                out->done = true;
                out->stop = ev[i].u.done.stop_reason;
                out->usage = ev[i].u.done.usage;
            } else if (ev[i].type == ENG_WIRE_ERROR) {
                out->failed = true;
            }
        }
    }
    eng_worker_free(w);
    ASSERT_TRUE(out->done);
}

/* Pings until a LOAD shows nothing running or queued. */
static void wait_idle(fx_t *f, cl_t *k)
{
    uint64_t deadline = pc_time_mono_ms() + 5000;
    while (pc_time_mono_ms() < deadline) {
        uint32_t n0 = k->n_loads;
        ASSERT_EQ(lnk_worker_client_ping(k->c), 0);
        RUN_UNTIL(f, k->n_loads > n0, 2000);
        if (k->load.running_seqs == 0 && k->load.queued_requests == 0)
            return;
        uint64_t t = pc_time_mono_ms() + 20;
        while (pc_time_mono_ms() < t)
            uv_run(&f->loop, UV_RUN_ONCE);
    }
    PC_TEST__FAIL("the worker never became idle: %u running, %u queued", k->load.running_seqs,
                  k->load.queued_requests);
}

/* ---------------------------------------------------------------------------------------------
 * Raw peers: a TCP connection that sends what the test says and collects what comes back.
 * ------------------------------------------------------------------------------------------- */

typedef struct raw {
    uv_tcp_t tcp;
    uv_connect_t connect;
    bool connected, eof, closed, read;
    int status;
    pc_buf_t in;
    uint64_t eof_ms;
    char rbuf[65536];
} raw_t;

typedef struct raw_wr {
    uv_write_t req;
    char data[];
} raw_wr_t;

static void raw_alloc(uv_handle_t *h, size_t n, uv_buf_t *b)
{
    raw_t *r = h->data;
    b->base = r->rbuf;
    b->len = sizeof r->rbuf;
}

static void raw_on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    raw_t *r = s->data;
    if (n > 0) {
        pc_buf_append(&r->in, b->base, (size_t)n);
    } else if (n < 0) {
        r->eof = true;
        r->eof_ms = pc_time_mono_ms();
        uv_read_stop(s);
    }
}

static void raw_on_connect(uv_connect_t *c, int status)
{
    raw_t *r = c->data;
    r->status = status;
    r->connected = status == 0;
    if (r->connected && r->read)
        uv_read_start((uv_stream_t *)&r->tcp, raw_alloc, raw_on_read);
}

/* Connects to addr; read: collect what arrives (otherwise the socket is never read, and its
 * receive buffer is made small). */
static void raw_open(fx_t *f, raw_t *r, const char *addr, bool read)
{
    memset(r, 0, offsetof(raw_t, rbuf));
    r->read = read;
    struct sockaddr_storage sa;
    ASSERT_EQ(lnk_wconn_parse_addr(addr, &sa), 0);
    ASSERT_EQ(uv_tcp_init_ex(&f->loop, &r->tcp, AF_INET), 0);
    r->tcp.data = r;
    r->connect.data = r;
    if (!read) {
        uv_os_fd_t fd;
        ASSERT_EQ(uv_fileno((uv_handle_t *)&r->tcp, &fd), 0);
        int small = 4096;
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    }
    ASSERT_EQ(uv_tcp_connect(&r->connect, &r->tcp, (struct sockaddr *)&sa, raw_on_connect), 0);
    RUN_UNTIL(f, r->connected || r->status < 0, 5000);
    ASSERT_TRUE(r->connected);
}

static void raw_on_write(uv_write_t *w, int status)
{
    (void)status;
    pc_free(PC_CONTAINER_OF(w, raw_wr_t, req));
}

static void raw_send(raw_t *r, const void *bytes, size_t len)
{
    raw_wr_t *w = pc_xmalloc(sizeof *w + len);
    memcpy(w->data, bytes, len);
    uv_buf_t b = uv_buf_init(w->data, (unsigned)len);
    if (uv_write(&w->req, (uv_stream_t *)&r->tcp, &b, 1, raw_on_write) != 0)
        pc_free(w);
}

static void raw_send_frame(raw_t *r, const eng_wire_frame_t *fr)
{
    pc_buf_t b = PC_BUF_INIT;
    char err[128];
    PC_ASSERT(eng_wire_encode(fr, ENG_WIRE_MAX_FRAME_DEFAULT, &b, err, sizeof err) == 0);
    raw_send(r, b.base, b.len);
    pc_buf_free(&b);
}

static eng_wire_frame_t hello_frame(uint32_t heartbeat_ms)
{
    eng_wire_frame_t f = {.type = ENG_WIRE_HELLO};
    f.u.hello.version_min = f.u.hello.version_max = ENG_WIRE_VERSION;
    f.u.hello.role = ENG_WIRE_ROLE_GATEWAY;
    f.u.hello.heartbeat_ms = heartbeat_ms;
    f.u.hello.max_frame = ENG_WIRE_MAX_FRAME_DEFAULT;
    f.u.hello.node = PC_SLICE_LIT("raw");
    return f;
}

static void raw_on_closed(uv_handle_t *h)
{
    ((raw_t *)h->data)->closed = true;
}

static void raw_close(fx_t *f, raw_t *r)
{
    uv_close((uv_handle_t *)&r->tcp, raw_on_closed);
    RUN_UNTIL(f, r->closed, 2000);
    pc_buf_free(&r->in);
}

/* The frames in what a raw peer received: the count of frames of a type, and the message of the
 * last REJECT/ERROR in why. Returns the decoder's state (0 when every byte was a frame). */
static int raw_frames(const raw_t *r, int type, uint32_t *count, char *why, size_t why_len)
{
    eng_wire_decoder_t *d;
    PC_ASSERT(eng_wire_decoder_init(0, &d) == 0);
    eng_wire_decoder_feed(d, r->in.base, r->in.len);
    eng_wire_frame_t f;
    int rc;
    *count = 0;
    while ((rc = eng_wire_decoder_next(d, &f)) == 1) {
        if (f.type == type)
            (*count)++;
        if ((f.type == ENG_WIRE_REJECT || f.type == ENG_WIRE_ERROR) && why != NULL)
            snprintf(why, why_len, "%.*s", (int)f.u.error.message.len, f.u.error.message.base);
    }
    if (rc == 0 && eng_wire_decoder_pending(d) != 0)
        rc = 1;
    eng_wire_decoder_free(d);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Handshake
 * ------------------------------------------------------------------------------------------- */

PC_TEST(handshake_ok)
{
    fx_t f;
    PC_TEST_CALL(fx_setup(&f, NULL));
    cl_t k;
    PC_TEST_CALL(cl_open(&f, &k));
    ASSERT_STR_EQ(k.ack_model, MODEL_NAME);
    ASSERT_EQ(k.ack.version_min, ENG_WIRE_VERSION);
    ASSERT_EQ(k.ack.version_max, ENG_WIRE_VERSION);
    ASSERT_EQ(k.ack.role, ENG_WIRE_ROLE_WORKER);
    ASSERT_EQ(k.ack.n_vocab, N_VOCAB);
    ASSERT_EQ(k.ack.n_ctx, 1024);
    eng_worker_info_t in;
    eng_worker_info(lnk_worker_server_worker(f.srv), &in);
    ASSERT_EQ_U64(k.ack.model_fp, in.model_fp);
    ASSERT_EQ(k.ack.block_tokens, in.block_tokens);
    RUN_UNTIL(&f, k.n_loads >= 1, 2000); /* a LOAD follows the handshake */
    ASSERT_EQ(k.load.running_seqs, 0);

    /* The same identity asked for explicitly is accepted too. */
    cl_t k2;
    lnk_worker_client_params_t p = lnk_worker_client_params_default();
    p.model_name = MODEL_NAME;
    p.model_fp = in.model_fp;
    p.n_vocab = N_VOCAB;
    p.version_max = 9; /* a newer client that also speaks 2 */
    PC_TEST_CALL(cl_connect(&f, &k2, &p, NULL));
    RUN_UNTIL(&f, k2.ready || k2.closed, 5000);
    ASSERT_TRUE(k2.ready);
    PC_TEST_CALL(cl_close(&f, &k));
    PC_TEST_CALL(cl_close(&f, &k2));
    ASSERT_EQ(k.close_err, 0);
    lnk_worker_server_stats_t st;
    lnk_worker_server_stats(f.srv, &st);
    ASSERT_EQ(st.conns_accepted, 2);
    ASSERT_EQ(st.conns_rejected, 0);
    RUN_UNTIL(&f, (lnk_worker_server_stats(f.srv, &st), st.conns_open == 0), 2000);
    PC_TEST_CALL(fx_teardown(&f));
}

PC_TEST(listen_errors)
{
    fx_t f;
    PC_TEST_CALL(fx_setup(&f, NULL));
    lnk_worker_server_params_t sp = lnk_worker_server_params_default();
    eng_worker_params_t wp = worker_params();
    lnk_worker_server_t *s2 = NULL;
    char err[256] = "";
    /* The port is taken: PC_ERR_IO with the reason; the half-built server frees itself. */
    sp.listen = f.addr;
    ASSERT_EQ(lnk_worker_server_init(&f.loop, &sp, &wp, &s2, err, sizeof err), PC_ERR_IO);
    ASSERT_TRUE(s2 == NULL);
    if (strstr(err, "cannot listen on 127.0.0.1:") == NULL)
        PC_TEST__FAIL("err: %s", err);
    sp.listen = "127.0.0.1";
    ASSERT_EQ(lnk_worker_server_init(&f.loop, &sp, &wp, &s2, err, sizeof err), PC_ERR_INVAL);
    sp.listen = "bad_name:80"; /* not a host name (RFC 1123): refused before resolving */
    ASSERT_EQ(lnk_worker_server_init(&f.loop, &sp, &wp, &s2, err, sizeof err), PC_ERR_INVAL);
    if (strstr(err, "bad_name") == NULL)
        PC_TEST__FAIL("err: %s", err);
    /* A valid name that does not resolve (.invalid never does, RFC 6761). */
    sp.listen = "no-such-host.invalid:80";
    ASSERT_EQ(lnk_worker_server_init(&f.loop, &sp, &wp, &s2, err, sizeof err), PC_ERR_NOTFOUND);
    ASSERT_TRUE(s2 == NULL);
    if (strstr(err, "cannot resolve listen host 'no-such-host.invalid'") == NULL)
        PC_TEST__FAIL("err: %s", err);
    sp.listen = "127.0.0.1:0";
    wp.engine.model_path = "/nonexistent.gguf";
    ASSERT_TRUE(lnk_worker_server_init(&f.loop, &sp, &wp, &s2, err, sizeof err) < 0);
    ASSERT_TRUE(s2 == NULL);
    /* The client refuses bad addresses before any callback. */
    lnk_worker_client_params_t cp = lnk_worker_client_params_default();
    cp.address = "127.0.0.1:99999";
    lnk_worker_client_t *c = NULL;
    ASSERT_EQ(lnk_worker_client_connect(&f.loop, &cp, &cl_cbs, NULL, &c, err, sizeof err),
              PC_ERR_INVAL);
    ASSERT_TRUE(c == NULL);
    PC_TEST_CALL(fx_teardown(&f));
}

/* ---------------------------------------------------------------------------------------------
 * Host names: resolved at every connect, each address tried in order (worker_client.h).
 * ------------------------------------------------------------------------------------------- */

/* A TCP socket bound to 127.0.0.1 and not listening: a connect to its port is refused, and the
 * port is not reused while the socket is open (*fd, to close). *port gets the port. */
static void refusing_port(int *fdp, uint16_t *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_TRUE(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ASSERT_EQ(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    ASSERT_EQ(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    *fdp = fd;
}

PC_TEST(host_name_resolved_at_connect)
{
    fx_t f;
    PC_TEST_CALL(fx_setup(&f, NULL));
    uint16_t port = lnk_worker_server_port(f.srv);
    char name[64];
    snprintf(name, sizeof name, "localhost:%u", (unsigned)port);
    /* localhost goes through the system's resolver and reaches the server on 127.0.0.1 (after
     * [::1] refused, where the resolver lists it first). */
    cl_t k;
    PC_TEST_CALL(cl_connect(&f, &k, NULL, name));
    ASSERT_STR_EQ(lnk_worker_client_peer(k.c), ""); /* resolving */
    RUN_UNTIL(&f, k.ready || k.closed, 5000);
    if (!k.ready)
        PC_TEST__FAIL("closed: %s", k.close_reason);
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1:%u", (unsigned)port);
    ASSERT_STR_EQ(lnk_worker_client_peer(k.c), want);
    ASSERT_STR_EQ(k.ack_model, MODEL_NAME);
    /* It serves like any other link. */
    uint32_t prompt[8] = {5, 6, 7, 8, 9, 10, 11, 12};
    eng_wire_submit_t rq = greedy(1, prompt, 8, 3);
    ASSERT_EQ(lnk_worker_client_submit(k.c, &rq), 0);
    RUN_UNTIL(&f, k.rq[1].done || k.rq[1].failed, 10000);
    ASSERT_TRUE(k.rq[1].done);
    PC_TEST_CALL(cl_close(&f, &k));
    ASSERT_EQ(k.close_err, 0);

    /* Closed while resolving: on_close once, with err 0 (the resolver's callback still runs
     * and frees nothing twice: ASan watches). */
    PC_TEST_CALL(cl_connect(&f, &k, NULL, name));
    lnk_worker_client_close(k.c);
    RUN_UNTIL(&f, k.closed, 5000);
    ASSERT_FALSE(k.ready);
    ASSERT_EQ(k.close_err, 0);
    PC_TEST_CALL(fx_teardown(&f));
}

PC_TEST(host_name_that_does_not_resolve)
{
    fx_t f;
    PC_TEST_CALL(fx_setup(&f, NULL));
    /* .invalid never resolves (RFC 6761): PC_ERR_NOTFOUND with the resolver's error, at every
     * attempt (nothing is cached, nothing crashes). */
    for (int i = 0; i < 3; i++) {
        cl_t k;
        PC_TEST_CALL(cl_connect(&f, &k, NULL, "no-such-host.invalid:7001"));
        RUN_UNTIL(&f, k.closed, 10000);
        ASSERT_FALSE(k.ready);
        ASSERT_EQ(k.close_err, PC_ERR_NOTFOUND);
        if (strstr(k.close_reason, "cannot resolve worker host 'no-such-host.invalid': ") == NULL)
            PC_TEST__FAIL("reason: %s", k.close_reason);
    }
    /* Bad names are refused before any callback, with the reason. */
    lnk_worker_client_params_t cp = lnk_worker_client_params_default();
    lnk_worker_client_t *c = NULL;
    char err[256];
    const char *bad[] = {"bad_name:7001", "-worker:7001", "worker:0", "worker",
                         "::1:7001",      "a..b:7001",    ":7001"};
    for (size_t i = 0; i < PC_ARRAY_LEN(bad); i++) {
        cp.address = bad[i];
        ASSERT_EQ(lnk_worker_client_connect(&f.loop, &cp, &cl_cbs, NULL, &c, err, sizeof err),
                  PC_ERR_INVAL);
        ASSERT_TRUE(c == NULL);
        if (strstr(err, "bad worker address: ") == NULL)
            PC_TEST__FAIL("%s: %s", bad[i], err);
    }
    PC_TEST_CALL(fx_teardown(&f));
}

PC_TEST(resolved_addresses_tried_in_order)
{
    fx_t f;
    PC_TEST_CALL(fx_setup(&f, NULL));
    uint16_t dead1, dead2;
    int fd1, fd2;
    PC_TEST_CALL(refusing_port(&fd1, &dead1));
    PC_TEST_CALL(refusing_port(&fd2, &dead2));
    struct sockaddr_storage addrs[3];
    ASSERT_EQ(uv_ip4_addr("127.0.0.1", dead1, (struct sockaddr_in *)&addrs[0]), 0);
    ASSERT_EQ(uv_ip4_addr("127.0.0.1", dead2, (struct sockaddr_in *)&addrs[1]), 0);
    ASSERT_EQ(lnk_wconn_parse_addr(f.addr, &addrs[2]), 0);
    lnk_worker_client_params_t p = lnk_worker_client_params_default();
    p.address = "multi.example:7001"; /* the name the logs and reasons give */
    p.node = "test-gateway";

    /* Two refusing addresses, then the worker: the third one serves. */
    cl_t k;
    memset(&k, 0, sizeof k);
    char err[256] = "";
    ASSERT_EQ(
        lnk__worker_client_connect_addrs(&f.loop, &p, addrs, 3, &cl_cbs, &k, &k.c, err, sizeof err),
        0);
    RUN_UNTIL(&f, k.ready || k.closed, 5000);
    if (!k.ready)
        PC_TEST__FAIL("closed: %s", k.close_reason);
    ASSERT_STR_EQ(lnk_worker_client_peer(k.c), f.addr);
    PC_TEST_CALL(cl_close(&f, &k));

    /* Every address refuses: PC_ERR_IO, one reason naming the name and each address. */
    memset(&k, 0, sizeof k);
    ASSERT_EQ(
        lnk__worker_client_connect_addrs(&f.loop, &p, addrs, 2, &cl_cbs, &k, &k.c, err, sizeof err),
        0);
    RUN_UNTIL(&f, k.closed, 5000);
    ASSERT_FALSE(k.ready);
    ASSERT_EQ(k.close_err, PC_ERR_IO);
    char want[160];
    snprintf(want, sizeof want, "connect to multi.example:7001: 127.0.0.1:%u: ", (unsigned)dead1);
    if (strstr(k.close_reason, want) == NULL)
        PC_TEST__FAIL("reason '%s' lacks '%s'", k.close_reason, want);
    snprintf(want, sizeof want, "; 127.0.0.1:%u: ", (unsigned)dead2);
    if (strstr(k.close_reason, want) == NULL)
        PC_TEST__FAIL("reason '%s' lacks '%s'", k.close_reason, want);

    /* The worker first: the later addresses are never tried. */
    struct sockaddr_storage first[2] = {addrs[2], addrs[0]};
    memset(&k, 0, sizeof k);
    ASSERT_EQ(
        lnk__worker_client_connect_addrs(&f.loop, &p, first, 2, &cl_cbs, &k, &k.c, err, sizeof err),
        0);
    RUN_UNTIL(&f, k.ready || k.closed, 5000);
    ASSERT_TRUE(k.ready);
    ASSERT_STR_EQ(lnk_worker_client_peer(k.c), f.addr);
    PC_TEST_CALL(cl_close(&f, &k));

    /* Closed while the first address is being tried: on_close once, err 0. */
    memset(&k, 0, sizeof k);
    ASSERT_EQ(
        lnk__worker_client_connect_addrs(&f.loop, &p, addrs, 3, &cl_cbs, &k, &k.c, err, sizeof err),
        0);
    lnk_worker_client_close(k.c);
    RUN_UNTIL(&f, k.closed, 5000);
    ASSERT_FALSE(k.ready);
    ASSERT_EQ(k.close_err, 0);
    close(fd1);
    close(fd2);
    PC_TEST_CALL(fx_teardown(&f));
}

/* A listening socket on 127.0.0.1 whose accept queue (backlog 0) is full: further SYNs are
 * dropped, so a connect to it neither succeeds nor fails (a host that black-holes). *lfd and
 * *cfd (the connection that fills the queue) are to close. Returns whether a probe connect
 * really hangs for 300 ms here. */
static bool black_hole(int *lfd, int *cfd, struct sockaddr_storage *sa)
{
    *lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (*lfd < 0 || bind(*lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(*lfd, 0) != 0 ||
        getsockname(*lfd, (struct sockaddr *)&a, &len) != 0)
        return false;
    memcpy(sa, &a, sizeof a);
    *cfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    connect(*cfd, (struct sockaddr *)&a, sizeof a); /* completes into the accept queue */
    usleep(50 * 1000);
    int probe = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    connect(probe, (struct sockaddr *)&a, sizeof a);
    fd_set w;
    FD_ZERO(&w);
    FD_SET(probe, &w);
    struct timeval tv = {0, 300 * 1000};
    bool hangs = select(probe + 1, NULL, &w, NULL, &tv) == 0;
    close(probe);
    return hangs;
}

PC_TEST(connect_timeout_shared_between_addresses)
{
    fx_t f;
    PC_TEST_CALL(fx_setup(&f, NULL));
    int lfd = -1, cfd = -1;
    struct sockaddr_storage addrs[2];
    if (!black_hole(&lfd, &cfd, &addrs[0])) {
        /* Loopback here accepts past a full queue: nothing black-holes, nothing to share. */
        fprintf(stderr, "note: no SYN black hole on this host; the timeout share is untested\n");
        close(lfd);
        close(cfd);
        PC_TEST_CALL(fx_teardown(&f));
        return;
    }
    ASSERT_EQ(lnk_wconn_parse_addr(f.addr, &addrs[1]), 0);
    lnk_worker_client_params_t p = lnk_worker_client_params_default();
    p.address = "slow-first.example:7001";
    p.node = "test-gateway";
    p.connect_timeout_ms = 1000;
    /* The first address hangs: it gets half of the timeout, the worker the rest. */
    cl_t k;
    memset(&k, 0, sizeof k);
    char err[256] = "";
    uint64_t t0 = pc_time_mono_ms();
    ASSERT_EQ(
        lnk__worker_client_connect_addrs(&f.loop, &p, addrs, 2, &cl_cbs, &k, &k.c, err, sizeof err),
        0);
    RUN_UNTIL(&f, k.ready || k.closed, 5000);
    uint64_t took = pc_time_mono_ms() - t0;
    if (!k.ready)
        PC_TEST__FAIL("closed after %llu ms: %s", (unsigned long long)took, k.close_reason);
    ASSERT_STR_EQ(lnk_worker_client_peer(k.c), f.addr);
    /* Ready at all proves the share: the whole 1000 ms on the black hole would have ended the
     * attempt. Not before the share ran out either. */
    if (took < 400)
        PC_TEST__FAIL("ready after %llu ms (the first address's share is 500)",
                      (unsigned long long)took);
    PC_TEST_CALL(cl_close(&f, &k));
    /* Only black holes: PC_ERR_TIMEOUT within the timeout, each address named. */
    struct sockaddr_storage holes[2] = {addrs[0], addrs[0]};
    memset(&k, 0, sizeof k);
    t0 = pc_time_mono_ms();
    ASSERT_EQ(
        lnk__worker_client_connect_addrs(&f.loop, &p, holes, 2, &cl_cbs, &k, &k.c, err, sizeof err),
        0);
    RUN_UNTIL(&f, k.closed, 5000);
    took = pc_time_mono_ms() - t0;
    ASSERT_FALSE(k.ready);
    ASSERT_EQ(k.close_err, PC_ERR_TIMEOUT);
    ASSERT_TRUE(took >= 900 && took <= 3000);
    char hole[80], want[300];
    lnk_wconn_format_addr((struct sockaddr *)&addrs[0], hole, sizeof hole);
    snprintf(want, sizeof want, "connect to slow-first.example:7001: %s: timed out; %s: timed out",
             hole, hole);
    ASSERT_STR_EQ(k.close_reason, want);
    close(cfd);
    close(lfd);
    PC_TEST_CALL(fx_teardown(&f));
}

/* Connects with p and expects a REJECT whose reason contains want. */
static void expect_reject(fx_t *f, const lnk_worker_client_params_t *p, int code, const char *want)
{
    cl_t k;
    PC_TEST_CALL(cl_connect(f, &k, p, NULL));
    RUN_UNTIL(f, k.closed, 5000);
    ASSERT_FALSE(k.ready);
    ASSERT_EQ(k.close_err, code);
    if (strstr(k.close_reason, want) == NULL)
        PC_TEST__FAIL("reason '%s' lacks '%s'", k.close_reason, want);
}

PC_TEST(handshake_mismatch_rejected)
{
    fx_t f;
    PC_TEST_CALL(fx_setup(&f, NULL));
    lnk_worker_client_params_t p = lnk_worker_client_params_default();
    p.version_min = ENG_WIRE_VERSION + 1;
    p.version_max = ENG_WIRE_VERSION + 2;
    PC_TEST_CALL(expect_reject(&f, &p, PC_ERR_UNSUPPORTED, "this worker speaks 4"));
    p = lnk_worker_client_params_default();
    p.model_name = "another-model";
    PC_TEST_CALL(expect_reject(&f, &p, PC_ERR_INVAL, "'another-model' asked"));
    p = lnk_worker_client_params_default();
    p.model_fp = 0x1234;
    PC_TEST_CALL(expect_reject(&f, &p, PC_ERR_INVAL, "fingerprint"));
    p = lnk_worker_client_params_default();
    p.n_vocab = N_VOCAB + 1;
    PC_TEST_CALL(expect_reject(&f, &p, PC_ERR_INVAL, "n_vocab"));

    /* A frame with another version in its header (a gateway of the previous protocol, version 3
     * without the KV tiers' fields, on a link without a secret): REJECT with the decoder's
     * reason. */
    raw_t r;
    PC_TEST_CALL(raw_open(&f, &r, f.addr, true));
    uint8_t v3[ENG_WIRE_HEADER_BYTES] = {'K', 'W', 3, ENG_WIRE_HELLO};
    raw_send(&r, v3, sizeof v3);
    RUN_UNTIL(&f, r.eof, 5000);
    uint32_t n;
    char why[256] = "";
    ASSERT_EQ(raw_frames(&r, ENG_WIRE_REJECT, &n, why, sizeof why), 0);
    ASSERT_EQ(n, 1);
    ASSERT_TRUE(strstr(why, "protocol version 3, this side speaks 4") != NULL);
    PC_TEST_CALL(raw_close(&f, &r));

    /* A SUBMIT before HELLO. */
    PC_TEST_CALL(raw_open(&f, &r, f.addr, true));
    uint32_t prompt[4] = {1, 2, 3, 4};
    eng_wire_frame_t s = {.type = ENG_WIRE_SUBMIT};
    s.u.submit = greedy(1, prompt, 4, 4);
    raw_send_frame(&r, &s);
    RUN_UNTIL(&f, r.eof, 5000);
    ASSERT_EQ(raw_frames(&r, ENG_WIRE_REJECT, &n, why, sizeof why), 0);
    ASSERT_EQ(n, 1);
    ASSERT_TRUE(strstr(why, "expected HELLO") != NULL);
    PC_TEST_CALL(raw_close(&f, &r));

    lnk_worker_server_stats_t st;
    RUN_UNTIL(&f, (lnk_worker_server_stats(f.srv, &st), st.conns_open == 0), 5000);
    ASSERT_EQ(st.conns_rejected, 5);  /* REJECT by the handshake's rules */
    ASSERT_EQ(st.conns_bad_frame, 1); /* REJECT by the decoder (the version-3 header) */
    PC_TEST_CALL(fx_teardown(&f));
}

/* ---------------------------------------------------------------------------------------------
 * Link authentication and resync
 * ------------------------------------------------------------------------------------------- */

#define SECRET "0123456789abcdef"

PC_TEST(auth_mac_golden)
{
    /* HMAC-SHA256 as documented in engine/wire.h, computed independently (Python's hmac). */
    static const uint8_t gw_mac[32] = {0x38, 0x6f, 0x66, 0xe1, 0x56, 0x2b, 0xab, 0x00,
                                       0xd2, 0x0a, 0x88, 0x36, 0xac, 0xe1, 0xbb, 0x1c,
                                       0xa3, 0x88, 0xb6, 0xfc, 0x16, 0x92, 0x8a, 0x6e,
                                       0x9a, 0x5b, 0xb0, 0xba, 0xa9, 0x27, 0x76, 0x94};
    static const uint8_t wk_mac[32] = {0xdc, 0x26, 0x3f, 0xfe, 0x60, 0x17, 0x88, 0xcd,
                                       0xd1, 0x87, 0xbc, 0xbc, 0xf1, 0xbf, 0x72, 0xd1,
                                       0x9c, 0x8b, 0xeb, 0x19, 0xc2, 0x04, 0x96, 0xb4,
                                       0x62, 0x34, 0xc9, 0xfd, 0x4c, 0xaf, 0x28, 0x5b};
    uint8_t gw[32], wk[32], mac[32];
    for (int i = 0; i < 32; i++) {
        gw[i] = (uint8_t)i;
        wk[i] = (uint8_t)(32 + i);
    }
    lnk_wire_auth_mac((const uint8_t *)SECRET, 16, ENG_WIRE_ROLE_GATEWAY, gw, wk, mac);
    ASSERT_MEM_EQ(mac, gw_mac, 32);
    ASSERT_TRUE(lnk_wire_auth_equal(mac, gw_mac));
    lnk_wire_auth_mac((const uint8_t *)SECRET, 16, ENG_WIRE_ROLE_WORKER, gw, wk, mac);
    ASSERT_MEM_EQ(mac, wk_mac, 32);
    mac[31] ^= 1;
    ASSERT_FALSE(lnk_wire_auth_equal(mac, wk_mac));
    /* Nonces are fresh. */
    uint8_t n1[32], n2[32];
    lnk_wire_nonce(n1);
    lnk_wire_nonce(n2);
    ASSERT_TRUE(memcmp(n1, n2, 32) != 0);
}

static lnk_worker_client_params_t secret_params(const char *secret)
{
    lnk_worker_client_params_t p = lnk_worker_client_params_default();
    p.secret = (const uint8_t *)secret;
    p.secret_len = secret ? strlen(secret) : 0;
    return p;
}

PC_TEST(link_auth)
{
    fx_t f;
    lnk_worker_server_params_t sp = lnk_worker_server_params_default();
    sp.secret = (const uint8_t *)SECRET;
    sp.secret_len = 16;
    PC_TEST_CALL(fx_setup(&f, &sp));
    /* No secret, a wrong one: refused, on either side. */
    lnk_worker_client_params_t p = secret_params(NULL);
    PC_TEST_CALL(expect_reject(&f, &p, PC_ERR_PERM, "requires a link secret"));
    p = secret_params("0123456789abcdeX");
    PC_TEST_CALL(expect_reject(&f, &p, PC_ERR_PERM, "link authentication failed"));
    /* A raw peer that skips AUTH after the CHALLENGE is closed without a word. */
    raw_t r;
    PC_TEST_CALL(raw_open(&f, &r, f.addr, true));
    eng_wire_frame_t h = hello_frame(1000), hb = {.type = ENG_WIRE_HEARTBEAT};
    raw_send_frame(&r, &h);
    raw_send_frame(&r, &hb);
    RUN_UNTIL(&f, r.eof, 5000);
    uint32_t n;
    char why[256] = "";
    ASSERT_EQ(raw_frames(&r, ENG_WIRE_CHALLENGE, &n, why, sizeof why), 0);
    ASSERT_EQ(n, 1);
    ASSERT_EQ(raw_frames(&r, ENG_WIRE_REJECT, &n, why, sizeof why), 0);
    ASSERT_EQ(n, 0);
    PC_TEST_CALL(raw_close(&f, &r));
    /* The right secret: served, and the worker proved it too. */
    cl_t k;
    p = secret_params(SECRET);
    PC_TEST_CALL(cl_connect(&f, &k, &p, NULL));
    RUN_UNTIL(&f, k.ready || k.closed, 5000);
    ASSERT_TRUE(k.ready);
    PC_TEST_CALL(cl_close(&f, &k));
    lnk_worker_server_stats_t st;
    RUN_UNTIL(&f, (lnk_worker_server_stats(f.srv, &st), st.conns_open == 0), 5000);
    ASSERT_EQ(st.conns_rejected, 2); /* the wrong secret and the raw peer */
    PC_TEST_CALL(fx_teardown(&f));

    /* A gateway with a secret refuses a worker without one. */
    PC_TEST_CALL(fx_setup(&f, NULL));
    p = secret_params(SECRET);
    PC_TEST_CALL(expect_reject(&f, &p, PC_ERR_PERM, "did not ask for the link secret"));
    /* Short secrets are refused by the parameter checks. */
    p = secret_params("short");
    p.address = f.addr;
    lnk_worker_client_t *c = NULL;
    char err[256];
    ASSERT_EQ(lnk_worker_client_connect(&f.loop, &p, &cl_cbs, NULL, &c, err, sizeof err),
              PC_ERR_INVAL);
    PC_TEST_CALL(fx_teardown(&f));
}

/* ---------------------------------------------------------------------------------------------
 * The sealed link: what an unauthenticated peer learns, the pre-authentication budget, and a
 * man in the middle (a TCP proxy on the test's loop that forwards both ways, records every
 * byte, and can change, replay or inject bytes on their way to the worker).
 * ------------------------------------------------------------------------------------------- */

static bool mem_has(const void *hay, size_t n, const void *needle, size_t k)
{
    const uint8_t *h = hay;
    for (size_t i = 0; k > 0 && i + k <= n; i++)
        if (memcmp(h + i, needle, k) == 0)
            return true;
    return false;
}

/* A worker with the link secret SECRET (and the given handshake deadline; 0: the default). */
static void secret_fx(fx_t *f, uint32_t handshake_timeout_ms)
{
    lnk_worker_server_params_t sp = lnk_worker_server_params_default();
    sp.secret = (const uint8_t *)SECRET;
    sp.secret_len = 16;
    if (handshake_timeout_ms > 0)
        sp.handshake_timeout_ms = handshake_timeout_ms;
    fx_setup(f, &sp);
}

PC_TEST(unauthenticated_peer_learns_nothing)
{
    fx_t f;
    PC_TEST_CALL(secret_fx(&f, 0));
    eng_worker_info_t info;
    eng_worker_info(lnk_worker_server_worker(f.srv), &info);
    uint8_t fp_le[8];
    char fp_hex[24];
    for (int i = 0; i < 8; i++)
        fp_le[i] = (uint8_t)(info.model_fp >> (8 * i));
    snprintf(fp_hex, sizeof fp_hex, "%016llx", (unsigned long long)info.model_fp);

    /* A HELLO that asks for another model, then a wrong AUTH: the peer gets the CHALLENGE
     * (a nonce) and the connection closes; nothing names the model. */
    raw_t r;
    PC_TEST_CALL(raw_open(&f, &r, f.addr, true));
    eng_wire_frame_t h = hello_frame(1000);
    h.u.hello.model_name = PC_SLICE_LIT("another-model");
    h.u.hello.model_fp = 0x1234;
    h.u.hello.n_vocab = N_VOCAB + 1;
    raw_send_frame(&r, &h);
    eng_wire_frame_t a = {.type = ENG_WIRE_AUTH};
    memset(a.u.auth.bytes, 7, sizeof a.u.auth.bytes);
    raw_send_frame(&r, &a);
    RUN_UNTIL(&f, r.eof, 5000);
    uint32_t n;
    ASSERT_EQ(raw_frames(&r, ENG_WIRE_CHALLENGE, &n, NULL, 0), 0);
    ASSERT_EQ(n, 1);
    ASSERT_EQ(r.in.len, ENG_WIRE_HEADER_BYTES + ENG_WIRE_AUTH_BYTES); /* that frame alone */
    ASSERT_FALSE(mem_has(r.in.base, r.in.len, fp_le, sizeof fp_le));
    ASSERT_FALSE(mem_has(r.in.base, r.in.len, fp_hex, strlen(fp_hex)));
    ASSERT_FALSE(mem_has(r.in.base, r.in.len, info.model_name, strlen(info.model_name)));
    PC_TEST_CALL(raw_close(&f, &r));

    /* The same HELLO and no AUTH at all: the same. */
    PC_TEST_CALL(raw_open(&f, &r, f.addr, true));
    raw_send_frame(&r, &h);
    eng_wire_frame_t hb = {.type = ENG_WIRE_HEARTBEAT};
    raw_send_frame(&r, &hb);
    RUN_UNTIL(&f, r.eof, 5000);
    ASSERT_EQ(r.in.len, ENG_WIRE_HEADER_BYTES + ENG_WIRE_AUTH_BYTES);
    ASSERT_FALSE(mem_has(r.in.base, r.in.len, fp_le, sizeof fp_le));
    PC_TEST_CALL(raw_close(&f, &r));

    /* A gateway that proved the secret learns why (in a sealed REJECT). */
    lnk_worker_client_params_t p = secret_params(SECRET);
    p.model_fp = 0x1234;
    PC_TEST_CALL(expect_reject(&f, &p, PC_ERR_INVAL, "fingerprint"));
    lnk_worker_server_stats_t st;
    RUN_UNTIL(&f, (lnk_worker_server_stats(f.srv, &st), st.conns_open == 0), 5000);
    ASSERT_EQ(st.conns_rejected, 3);
    PC_TEST_CALL(fx_teardown(&f));
}

PC_TEST(unauthenticated_sockets_do_not_lock_out_a_gateway)
{
    /* 64 sockets that connect and never authenticate (as many as the authenticated
     * connections allowed) held open, the handshake deadline far away: a real gateway still
     * connects and is served. */
    enum { N_HOLD = 64 };
    fx_t f;
    PC_TEST_CALL(secret_fx(&f, 60000));
    static raw_t hold[N_HOLD];
    for (int i = 0; i < N_HOLD; i++)
        PC_TEST_CALL(raw_open(&f, &hold[i], f.addr, true));
    lnk_worker_server_stats_t st;
    RUN_UNTIL(&f, (lnk_worker_server_stats(f.srv, &st), st.conns_accepted == N_HOLD), 5000);
    cl_t k;
    lnk_worker_client_params_t p = secret_params(SECRET);
    PC_TEST_CALL(cl_connect(&f, &k, &p, NULL));
    RUN_UNTIL(&f, k.ready || k.closed, 5000);
    if (k.closed)
        PC_TEST__FAIL("the gateway was refused: %s", k.close_reason);
    uint32_t prompt[12];
    make_prompt(prompt, 12, 5);
    eng_wire_submit_t sb = greedy(1, prompt, 12, 4);
    ASSERT_EQ(lnk_worker_client_submit(k.c, &sb), 0);
    RUN_UNTIL(&f, k.rq[1].done || k.closed, 10000);
    ASSERT_TRUE(k.rq[1].done);
    ASSERT_EQ(k.rq[1].n_tokens, 4);
    lnk_worker_server_stats(f.srv, &st);
    ASSERT_EQ(st.conns_pending_dropped,
              N_HOLD + 1 - lnk_worker_server_params_default().max_pending);
    PC_TEST_CALL(cl_close(&f, &k));
    for (int i = 0; i < N_HOLD; i++)
        PC_TEST_CALL(raw_close(&f, &hold[i]));
    PC_TEST_CALL(fx_teardown(&f));
}

PC_TEST(silent_pre_auth_socket_closed_at_the_deadline)
{
    fx_t f;
    PC_TEST_CALL(secret_fx(&f, 150));
    /* HELLO, the CHALLENGE comes, then silence: closed when the handshake deadline passes
     * (the deadline covers the whole handshake, not only HELLO). */
    raw_t r;
    PC_TEST_CALL(raw_open(&f, &r, f.addr, true));
    eng_wire_frame_t h = hello_frame(1000);
    raw_send_frame(&r, &h);
    RUN_UNTIL(&f, r.eof, 5000);
    uint32_t n;
    ASSERT_EQ(raw_frames(&r, ENG_WIRE_CHALLENGE, &n, NULL, 0), 0);
    ASSERT_EQ(n, 1);
    PC_TEST_CALL(raw_close(&f, &r));
    /* Nothing at all. */
    PC_TEST_CALL(raw_open(&f, &r, f.addr, true));
    RUN_UNTIL(&f, r.eof, 5000);
    ASSERT_EQ(r.in.len, 0);
    PC_TEST_CALL(raw_close(&f, &r));
    lnk_worker_server_stats_t st;
    RUN_UNTIL(&f, (lnk_worker_server_stats(f.srv, &st), st.conns_open == 0), 5000);
    ASSERT_EQ(st.conns_timeout, 2);
    PC_TEST_CALL(fx_teardown(&f));
}

typedef struct proxy {
    uv_tcp_t l, down, up; /* listener; the gateway's side; the worker's side */
    uv_connect_t conn;
    struct sockaddr_storage target;
    bool accepted, up_connected;
    int n_closed;
    pc_buf_t c2s, s2c; /* every byte forwarded, each way */
    pc_buf_t pend;     /* from the gateway before the worker's side connected */
    size_t flip_at;    /* c2s offset of a byte to change on its way (SIZE_MAX: none) */
    char addr[80];
    char rbuf[65536];
} proxy_t;

static void px_alloc(uv_handle_t *h, size_t n, uv_buf_t *b)
{
    proxy_t *x = h->data;
    b->base = x->rbuf;
    b->len = sizeof x->rbuf;
}

static void px_write(uv_tcp_t *t, const void *bytes, size_t len)
{
    if (uv_is_closing((uv_handle_t *)t))
        return;
    raw_wr_t *w = pc_xmalloc(sizeof *w + len);
    memcpy(w->data, bytes, len);
    uv_buf_t b = uv_buf_init(w->data, (unsigned)len);
    if (uv_write(&w->req, (uv_stream_t *)t, &b, 1, raw_on_write) != 0)
        pc_free(w);
}

static void px_on_closed(uv_handle_t *h)
{
    ((proxy_t *)h->data)->n_closed++;
}

static void px_close_pair(proxy_t *x)
{
    if (!uv_is_closing((uv_handle_t *)&x->down))
        uv_close((uv_handle_t *)&x->down, px_on_closed);
    if (!uv_is_closing((uv_handle_t *)&x->up))
        uv_close((uv_handle_t *)&x->up, px_on_closed);
}

static void px_on_down_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    proxy_t *x = s->data;
    if (n < 0) {
        px_close_pair(x);
        return;
    }
    if (x->flip_at >= x->c2s.len && x->flip_at < x->c2s.len + (size_t)n)
        b->base[x->flip_at - x->c2s.len] ^= 0x01;
    pc_buf_append(&x->c2s, b->base, (size_t)n);
    if (x->up_connected)
        px_write(&x->up, b->base, (size_t)n);
    else
        pc_buf_append(&x->pend, b->base, (size_t)n);
}

static void px_on_up_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    proxy_t *x = s->data;
    if (n < 0) {
        px_close_pair(x);
        return;
    }
    pc_buf_append(&x->s2c, b->base, (size_t)n);
    px_write(&x->down, b->base, (size_t)n);
}

static void px_on_up_connect(uv_connect_t *c, int status)
{
    proxy_t *x = c->data;
    if (status < 0) {
        px_close_pair(x);
        return;
    }
    x->up_connected = true;
    px_write(&x->up, x->pend.base, x->pend.len);
    uv_read_start((uv_stream_t *)&x->up, px_alloc, px_on_up_read);
}

static void px_on_conn(uv_stream_t *l, int status)
{
    proxy_t *x = l->data;
    if (status < 0 || x->accepted)
        return;
    x->accepted = true;
    uv_tcp_init(l->loop, &x->down);
    uv_tcp_init(l->loop, &x->up);
    x->down.data = x->up.data = x->conn.data = x;
    uv_accept(l, (uv_stream_t *)&x->down);
    uv_read_start((uv_stream_t *)&x->down, px_alloc, px_on_down_read);
    uv_tcp_connect(&x->conn, &x->up, (struct sockaddr *)&x->target, px_on_up_connect);
}

/* A proxy for one connection to the worker of f; its address in x->addr. */
static void px_open(fx_t *f, proxy_t *x)
{
    memset(x, 0, offsetof(proxy_t, rbuf));
    x->flip_at = SIZE_MAX;
    ASSERT_EQ(lnk_wconn_parse_addr(f->addr, &x->target), 0);
    struct sockaddr_storage sa;
    ASSERT_EQ(lnk_wconn_parse_addr("127.0.0.1:0", &sa), 0);
    uv_tcp_init(&f->loop, &x->l);
    x->l.data = x;
    ASSERT_EQ(uv_tcp_bind(&x->l, (struct sockaddr *)&sa, 0), 0);
    ASSERT_EQ(uv_listen((uv_stream_t *)&x->l, 4, px_on_conn), 0);
    int len = sizeof sa;
    ASSERT_EQ(uv_tcp_getsockname(&x->l, (struct sockaddr *)&sa, &len), 0);
    lnk_wconn_format_addr((struct sockaddr *)&sa, x->addr, sizeof x->addr);
}

static void px_close(fx_t *f, proxy_t *x)
{
    uv_close((uv_handle_t *)&x->l, px_on_closed);
    int want = 1;
    if (x->accepted) {
        px_close_pair(x);
        want = 3;
    }
    RUN_UNTIL(f, x->n_closed == want, 2000);
    pc_buf_free(&x->c2s);
    pc_buf_free(&x->s2c);
    pc_buf_free(&x->pend);
}

/* A gateway with the secret through the proxy, ready; heartbeats rare, so that what it sends
 * next is what the test makes it send. */
static void px_client(fx_t *f, proxy_t *x, cl_t *k)
{
    PC_TEST_CALL(px_open(f, x));
    lnk_worker_client_params_t p = secret_params(SECRET);
    p.heartbeat_ms = 60000;
    PC_TEST_CALL(cl_connect(f, k, &p, x->addr));
    RUN_UNTIL(f, k->ready || k->closed, 5000);
    if (k->closed)
        PC_TEST__FAIL("closed: %s", k->close_reason);
    RUN_UNTIL(f, k->snap_last, 5000); /* the worker's handshake frames are through */
}

static void expect_link_closed(fx_t *f, cl_t *k, uint64_t submitted)
{
    RUN_UNTIL(f, k->closed, 5000);
    ASSERT_EQ(k->close_err, PC_ERR_PERM);
    if (strstr(k->close_reason, "sealed record") == NULL)
        PC_TEST__FAIL("reason: %s", k->close_reason);
    lnk_worker_server_stats_t st;
    RUN_UNTIL(f, (lnk_worker_server_stats(f->srv, &st), st.conns_open == 0), 5000);
    ASSERT_EQ(st.requests_submitted, submitted);
    ASSERT_EQ(st.conns_unsealed, 1);
}

PC_TEST(sealed_link_serves_and_hides_prompts)
{
    fx_t f;
    PC_TEST_CALL(secret_fx(&f, 0));
    proxy_t x;
    cl_t k;
    PC_TEST_CALL(px_client(&f, &x, &k));
    uint32_t prompt[40];
    make_prompt(prompt, 40, 77);
    eng_wire_submit_t sb = greedy(1, prompt, 40, 16);
    ASSERT_EQ(lnk_worker_client_submit(k.c, &sb), 0);
    RUN_UNTIL(&f, k.rq[1].done || k.closed, 10000);
    ASSERT_TRUE(k.rq[1].done);
    rq_t ref;
    PC_TEST_CALL(inproc_run(&sb, &ref));
    ASSERT_EQ(k.rq[1].n_tokens, ref.n_tokens);
    ASSERT_MEM_EQ(k.rq[1].tokens, ref.tokens, ref.n_tokens * sizeof(uint32_t));
    /* On the path: neither the prompt, nor the output text, nor the model's name. */
    uint8_t le[16];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            le[4 * i + j] = (uint8_t)(prompt[10 + i] >> (8 * j));
    ASSERT_FALSE(mem_has(x.c2s.base, x.c2s.len, le, sizeof le));
    if (k.rq[1].text_len >= 4)
        ASSERT_FALSE(mem_has(x.s2c.base, x.s2c.len, k.rq[1].text, k.rq[1].text_len));
    ASSERT_FALSE(mem_has(x.s2c.base, x.s2c.len, k.ack_model, strlen(k.ack_model)));
    PC_TEST_CALL(cl_close(&f, &k));
    PC_TEST_CALL(px_close(&f, &x));
    PC_TEST_CALL(fx_teardown(&f));
}

PC_TEST(tampered_record_closes_the_link)
{
    fx_t f;
    PC_TEST_CALL(secret_fx(&f, 0));
    proxy_t x;
    cl_t k;
    PC_TEST_CALL(px_client(&f, &x, &k));
    /* One bit of the next thing the gateway sends (a SUBMIT), 20 bytes in, changes. */
    x.flip_at = x.c2s.len + 20;
    uint32_t prompt[40];
    make_prompt(prompt, 40, 78);
    eng_wire_submit_t sb = greedy(1, prompt, 40, 8);
    ASSERT_EQ(lnk_worker_client_submit(k.c, &sb), 0);
    PC_TEST_CALL(expect_link_closed(&f, &k, 0));
    ASSERT_TRUE(strstr(k.close_reason, "does not verify") != NULL);
    PC_TEST_CALL(px_close(&f, &x));
    PC_TEST_CALL(fx_teardown(&f));
}

PC_TEST(injected_plaintext_submit_refused)
{
    fx_t f;
    PC_TEST_CALL(secret_fx(&f, 0));
    proxy_t x;
    cl_t k;
    PC_TEST_CALL(px_client(&f, &x, &k));
    /* Someone on the path writes a well-formed SUBMIT into the gateway's stream. */
    uint32_t prompt[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    eng_wire_frame_t s = {.type = ENG_WIRE_SUBMIT};
    s.u.submit = greedy(9, prompt, 8, 4);
    pc_buf_t b = PC_BUF_INIT;
    ASSERT_EQ(eng_wire_encode(&s, ENG_WIRE_MAX_FRAME_DEFAULT, &b, NULL, 0), 0);
    px_write(&x.up, b.base, b.len);
    pc_buf_free(&b);
    PC_TEST_CALL(expect_link_closed(&f, &k, 0));
    PC_TEST_CALL(px_close(&f, &x));
    PC_TEST_CALL(fx_teardown(&f));
}

PC_TEST(replayed_record_refused)
{
    fx_t f;
    PC_TEST_CALL(secret_fx(&f, 0));
    proxy_t x;
    cl_t k;
    PC_TEST_CALL(px_client(&f, &x, &k));
    size_t mark = x.c2s.len;
    uint32_t prompt[20];
    make_prompt(prompt, 20, 79);
    eng_wire_submit_t sb = greedy(1, prompt, 20, 4);
    ASSERT_EQ(lnk_worker_client_submit(k.c, &sb), 0);
    RUN_UNTIL(&f, k.rq[1].done || k.closed, 10000);
    ASSERT_TRUE(k.rq[1].done);
    /* The request is over (its id is free again); the recorded SUBMIT is sent once more. */
    ASSERT_TRUE(x.c2s.len > mark);
    px_write(&x.up, x.c2s.base + mark, x.c2s.len - mark);
    PC_TEST_CALL(expect_link_closed(&f, &k, 1));
    PC_TEST_CALL(px_close(&f, &x));
    PC_TEST_CALL(fx_teardown(&f));
}

PC_TEST(tampered_record_from_the_worker_closes_the_link)
{
    /* The other direction: a changed byte on its way to the gateway. */
    fx_t f;
    PC_TEST_CALL(secret_fx(&f, 0));
    proxy_t x;
    cl_t k;
    PC_TEST_CALL(px_client(&f, &x, &k));
    /* A record of zeros where the worker's next record would be: length 20 (4 bytes of
     * "plaintext" and a tag). */
    uint8_t junk[24] = {20};
    px_write(&x.down, junk, sizeof junk);
    RUN_UNTIL(&f, k.closed, 5000);
    ASSERT_EQ(k.close_err, PC_ERR_PERM);
    if (strstr(k.close_reason, "does not verify") == NULL)
        PC_TEST__FAIL("reason: %s", k.close_reason);
    PC_TEST_CALL(px_close(&f, &x));
    PC_TEST_CALL(fx_teardown(&f));
}

PC_TEST(pins_resync_release_drop)
{
    fx_t f;
    PC_TEST_CALL(fx_setup(&f, NULL));
    cl_t a, b;
    PC_TEST_CALL(cl_open(&f, &a));
    PC_TEST_CALL(cl_open(&f, &b));
    eng_worker_info_t in;
    eng_worker_info(lnk_worker_server_worker(f.srv), &in);
    ASSERT_EQ(a.ack.total_blocks, in.total_blocks);
    ASSERT_EQ(a.ack.max_prompt_tokens, in.max_prompt_tokens);
    ASSERT_TRUE(a.ack.total_blocks > 0);
    RUN_UNTIL(&f, a.snap_last && b.snap_last, 5000); /* empty snapshots */
    ASSERT_EQ(a.n_snap_entries, 0);

    /* a retains a prefix; b learns it too (request id 0). */
    static uint32_t prompt[64];
    make_prompt(prompt, 64, 9);
    eng_wire_retain_t keep = {32, 600000};
    eng_wire_submit_t q = greedy(1, prompt, 64, 3);
    q.ns = 77;
    q.retain = &keep;
    q.n_retain = 1;
    ASSERT_EQ(lnk_worker_client_submit(a.c, &q), 0);
    RUN_UNTIL(&f, a.rq[1].done && b.n_retained_other == 1, 10000);
    ASSERT_EQ(a.rq[1].n_retained, 1);
    ASSERT_TRUE(a.rq[1].timing.queue_us + a.rq[1].timing.prefill_us > 0);
    ASSERT_TRUE(a.rq[1].timing.decode_us > 0);

    /* a goes away; the pin stays, and a new gateway gets it in its snapshot. */
    PC_TEST_CALL(cl_close(&f, &a));
    cl_t c;
    PC_TEST_CALL(cl_open(&f, &c));
    RUN_UNTIL(&f, c.snap_last, 5000);
    ASSERT_EQ(c.n_snap_entries, 1);
    ASSERT_EQ_U64(c.snap_ns, 77);
    ASSERT_EQ(c.snap_n_tokens, 32);
    ASSERT_EQ_U64(c.snap_fp, eng_wire_prefix_fp(prompt, 32));
    ASSERT_TRUE(c.snap_ttl_ms > 500000 && c.snap_ttl_ms <= 600000);

    /* c ends the pin early: every gateway hears RELEASED. */
    ASSERT_EQ(lnk_worker_client_release(c.c, 77, prompt, 32), 0);
    RUN_UNTIL(&f, b.n_released == 1 && c.n_released == 1, 5000);
    ASSERT_EQ(lnk_worker_client_release(c.c, 77, prompt, 0), PC_ERR_INVAL);
    /* c drops the namespace: the cached prompt goes, named by its path. */
    ASSERT_EQ(lnk_worker_client_drop(c.c, 77), 0);
    RUN_UNTIL(&f, b.n_removed > 0 && c.n_removed == b.n_removed, 5000);
    ASSERT_EQ(c.n_paths_ok, c.n_removed);
    /* Nothing of ns 77 is left to reuse. */
    q = greedy(2, prompt, 64, 1);
    q.ns = 77;
    ASSERT_EQ(lnk_worker_client_submit(c.c, &q), 0);
    RUN_UNTIL(&f, c.rq[2].done, 10000);
    ASSERT_EQ(c.rq[2].usage.tokens_reused, 0);
    /* The router's moving averages are measured by now. */
    ASSERT_EQ(lnk_worker_client_ping(c.c), 0);
    uint32_t loads = c.n_loads;
    RUN_UNTIL(&f, c.n_loads > loads, 5000);
    ASSERT_TRUE(c.load.prefill_tokens_per_s > 0.0f);
    ASSERT_TRUE(c.load.decode_ms_per_token > 0.0f);
    PC_TEST_CALL(cl_close(&f, &b));
    PC_TEST_CALL(cl_close(&f, &c));
    PC_TEST_CALL(fx_teardown(&f));
}

/* ---------------------------------------------------------------------------------------------
 * Requests
 * ------------------------------------------------------------------------------------------- */

PC_TEST(stream_greedy_equals_inprocess)
{
    fx_t f;
    PC_TEST_CALL(fx_setup(&f, NULL));
    cl_t k;
    PC_TEST_CALL(cl_open(&f, &k));
    enum { N = 3, MAXT = 24 };
    static uint32_t prompts[N][64];
    const uint32_t lens[N] = {5, 40, 64};
    eng_wire_submit_t s[N];
    for (int i = 0; i < N; i++) {
        make_prompt(prompts[i], lens[i], (uint32_t)i + 1);
        s[i] = greedy((uint64_t)i + 1, prompts[i], lens[i], MAXT);
    }
    eng_wire_retain_t keep = {.n_tokens = 32, .ttl_ms = 60000};
    s[1].retain = &keep;
    s[1].n_retain = 1;
    for (int i = 0; i < N; i++)
        ASSERT_EQ(lnk_worker_client_submit(k.c, &s[i]), 0);
    RUN_UNTIL(&f, k.rq[1].done && k.rq[2].done && k.rq[3].done, 30000);
    for (int i = 0; i < N; i++) {
        rq_t *got = &k.rq[i + 1], want;
        PC_TEST_CALL(inproc_run(&s[i], &want));
        ASSERT_EQ(got->stop, ENG_WIRE_STOP_MAX_TOKENS);
        ASSERT_EQ(got->n_tokens, MAXT);
        ASSERT_EQ(got->usage.output_tokens, MAXT);
        ASSERT_EQ(got->usage.prompt_tokens, lens[i]);
        ASSERT_EQ(want.n_tokens, got->n_tokens);
        ASSERT_MEM_EQ(got->tokens, want.tokens, MAXT * sizeof(uint32_t));
        ASSERT_EQ(got->text_len, want.text_len);
        ASSERT_MEM_EQ(got->text, want.text, got->text_len);
        ASSERT_TRUE(got->text_len > 0);
    }
    ASSERT_EQ(k.rq[2].n_retained, 1); /* RETAINED came back under the connection's own id */

    /* A request the worker refuses (a token id outside the vocabulary) fails alone. */
    uint32_t bad[2] = {1, N_VOCAB + 5};
    eng_wire_submit_t b = greedy(4, bad, 2, 4);
    ASSERT_EQ(lnk_worker_client_submit(k.c, &b), 0);
    RUN_UNTIL(&f, k.rq[4].failed, 5000);
    ASSERT_EQ(k.rq[4].err, PC_ERR_INVAL);
    /* Ids are per connection: 1 is free again and reusable. */
    memset(&k.rq[1], 0, sizeof k.rq[1]);
    ASSERT_EQ(lnk_worker_client_submit(k.c, &s[0]), 0);
    RUN_UNTIL(&f, k.rq[1].done, 10000);
    ASSERT_EQ(k.rq[1].n_tokens, MAXT);
    ASSERT_FALSE(k.closed);

    lnk_worker_server_stats_t st;
    lnk_worker_server_stats(f.srv, &st);
    ASSERT_EQ(st.requests_submitted, 4);
    ASSERT_EQ(st.requests_refused, 1);
    ASSERT_EQ(st.requests_live, 0);
    PC_TEST_CALL(cl_close(&f, &k));
    PC_TEST_CALL(fx_teardown(&f));
}

PC_TEST(cancel_mid_stream)
{
    fx_t f;
    PC_TEST_CALL(fx_setup(&f, NULL));
    cl_t k;
    PC_TEST_CALL(cl_open(&f, &k));
    uint32_t prompt[16];
    make_prompt(prompt, 16, 9);
    eng_wire_submit_t s = greedy(1, prompt, 16, 900);
    k.cancel_id = 1;
    k.cancel_at = 3;
    ASSERT_EQ(lnk_worker_client_submit(k.c, &s), 0);
    RUN_UNTIL(&f, k.rq[1].done, 20000);
    ASSERT_EQ(k.rq[1].stop, ENG_WIRE_STOP_CANCELED);
    ASSERT_TRUE(k.rq[1].n_tokens >= 3 && k.rq[1].n_tokens < 900);
    ASSERT_EQ(k.rq[1].usage.output_tokens, k.rq[1].n_tokens);
    /* A CANCEL of an id that is not live is ignored; the connection stays. */
    ASSERT_EQ(lnk_worker_client_cancel(k.c, 1), 0);
    ASSERT_EQ(lnk_worker_client_cancel(k.c, 77), 0);
    k.n_loads = 0;
    ASSERT_EQ(lnk_worker_client_ping(k.c), 0);
    RUN_UNTIL(&f, k.n_loads >= 1, 2000);
    ASSERT_EQ(k.load.running_seqs, 0);
    ASSERT_EQ(k.load.queued_requests, 0);
    ASSERT_FALSE(k.closed);
    PC_TEST_CALL(cl_close(&f, &k));
    PC_TEST_CALL(fx_teardown(&f));
}

PC_TEST(client_vanishing_mid_stream_frees_its_requests)
{
    fx_t f;
    PC_TEST_CALL(fx_setup(&f, NULL));
    cl_t a, b;
    PC_TEST_CALL(cl_open(&f, &a));
    PC_TEST_CALL(cl_open(&f, &b));
    uint32_t prompt[3][24];
    for (int i = 0; i < 3; i++)
        make_prompt(prompt[i], 24, 20 + (uint32_t)i);
    eng_wire_submit_t s1 = greedy(1, prompt[0], 24, 900), s2 = greedy(2, prompt[1], 24, 900);
    a.close_at = 2; /* a goes away after 2 tokens of request 1, with 2 requests live */
    ASSERT_EQ(lnk_worker_client_submit(a.c, &s1), 0);
    ASSERT_EQ(lnk_worker_client_submit(a.c, &s2), 0);
    RUN_UNTIL(&f, a.closed, 20000);
    ASSERT_FALSE(a.rq[1].done);

    lnk_worker_server_stats_t st;
    RUN_UNTIL(&f, (lnk_worker_server_stats(f.srv, &st), st.conns_open == 1), 5000);
    ASSERT_EQ(st.requests_orphaned, 2);
    ASSERT_EQ(st.requests_live, 0);
    /* The worker freed them: b's LOAD shows nothing running or queued. */
    PC_TEST_CALL(wait_idle(&f, &b));
    eng_worker_stats_t ws;
    RUN_UNTIL(&f, (eng_worker_stats(lnk_worker_server_worker(f.srv), &ws), ws.n_finished == 2),
              5000);
    /* b is served as before. */
    eng_wire_submit_t s3 = greedy(3, prompt[2], 24, 8);
    ASSERT_EQ(lnk_worker_client_submit(b.c, &s3), 0);
    RUN_UNTIL(&f, b.rq[3].done, 10000);
    ASSERT_EQ(b.rq[3].n_tokens, 8);
    PC_TEST_CALL(cl_close(&f, &b));
    PC_TEST_CALL(fx_teardown(&f));
}

/* ---------------------------------------------------------------------------------------------
 * Misbehaving peers
 * ------------------------------------------------------------------------------------------- */

PC_TEST(garbage_frames_close_only_that_connection)
{
    fx_t f;
    PC_TEST_CALL(fx_setup(&f, NULL));
    cl_t b;
    PC_TEST_CALL(cl_open(&f, &b));
    uint32_t prompt[20];
    make_prompt(prompt, 20, 33);
    eng_wire_submit_t sb = greedy(1, prompt, 20, 120);
    ASSERT_EQ(lnk_worker_client_submit(b.c, &sb), 0); /* b streams while the others misbehave */

    /* Not the protocol at all (an HTTP client on the worker port): REJECT, closed. */
    raw_t r;
    PC_TEST_CALL(raw_open(&f, &r, f.addr, true));
    const char http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    raw_send(&r, http, sizeof http - 1);
    RUN_UNTIL(&f, r.eof, 5000);
    uint32_t n;
    char why[256] = "";
    ASSERT_EQ(raw_frames(&r, ENG_WIRE_REJECT, &n, why, sizeof why), 0);
    ASSERT_EQ(n, 1);
    ASSERT_TRUE(strstr(why, "bad magic") != NULL);
    PC_TEST_CALL(raw_close(&f, &r));

    /* After the handshake: a SUBMIT header over a payload that is cut short, then a valid
     * frame. The worker answers ERROR (request 0) with the decoder's reason and closes. */
    cl_t a;
    PC_TEST_CALL(cl_open(&f, &a));
    uint8_t bad[ENG_WIRE_HEADER_BYTES + 6] = {
        'K', 'W', ENG_WIRE_VERSION, ENG_WIRE_SUBMIT, 0, 0, 0, 0, 6, 0, 0, 0, 1, 2, 3, 4, 5, 6};
    ASSERT_EQ(lnk_worker_client_send_raw(a.c, bad, sizeof bad), 0);
    RUN_UNTIL(&f, a.closed, 5000);
    ASSERT_EQ(a.close_err, PC_ERR_FORMAT);
    if (strstr(a.close_reason, "worker: bad frame") == NULL)
        PC_TEST__FAIL("reason: %s", a.close_reason);

    /* A frame out of place (TOKEN goes worker -> gateway) and an oversized length. */
    PC_TEST_CALL(cl_open(&f, &a));
    eng_wire_frame_t tok = {.type = ENG_WIRE_TOKEN};
    tok.u.token.request_id = 1;
    pc_buf_t enc = PC_BUF_INIT;
    ASSERT_EQ(eng_wire_encode(&tok, ENG_WIRE_MAX_FRAME_DEFAULT, &enc, why, sizeof why), 0);
    ASSERT_EQ(lnk_worker_client_send_raw(a.c, enc.base, enc.len), 0);
    pc_buf_free(&enc);
    RUN_UNTIL(&f, a.closed, 5000);
    ASSERT_EQ(a.close_err, PC_ERR_FORMAT);
    ASSERT_TRUE(strstr(a.close_reason, "TOKEN is not a frame a gateway sends") != NULL);
    PC_TEST_CALL(cl_open(&f, &a));
    uint8_t huge[ENG_WIRE_HEADER_BYTES] = {
        'K', 'W', ENG_WIRE_VERSION, ENG_WIRE_SUBMIT, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f};
    ASSERT_EQ(lnk_worker_client_send_raw(a.c, huge, sizeof huge), 0);
    RUN_UNTIL(&f, a.closed, 5000);
    ASSERT_EQ(a.close_err, PC_ERR_RANGE);

    /* A SUBMIT that reuses a live id. */
    PC_TEST_CALL(cl_open(&f, &a));
    eng_wire_submit_t sa = greedy(5, prompt, 20, 800);
    ASSERT_EQ(lnk_worker_client_submit(a.c, &sa), 0);
    ASSERT_EQ(lnk_worker_client_submit(a.c, &sa), 0);
    RUN_UNTIL(&f, a.closed, 5000);
    ASSERT_EQ(a.close_err, PC_ERR_FORMAT);
    ASSERT_TRUE(strstr(a.close_reason, "still live") != NULL);

    /* b never noticed. */
    RUN_UNTIL(&f, b.rq[1].done, 20000);
    ASSERT_EQ(b.rq[1].n_tokens, 120);
    ASSERT_EQ(b.rq[1].stop, ENG_WIRE_STOP_MAX_TOKENS);
    ASSERT_FALSE(b.closed);
    lnk_worker_server_stats_t st;
    RUN_UNTIL(&f, (lnk_worker_server_stats(f.srv, &st), st.conns_open == 1), 5000);
    ASSERT_EQ(st.conns_rejected, 0);
    ASSERT_EQ(st.conns_bad_frame, 5);   /* bad magic, truncated, TOKEN, oversized, reused id */
    ASSERT_EQ(st.requests_orphaned, 1); /* a's first request with id 5 */
    PC_TEST_CALL(wait_idle(&f, &b));
    PC_TEST_CALL(cl_close(&f, &b));
    PC_TEST_CALL(fx_teardown(&f));
}

PC_TEST(pre_handshake_frames_are_small)
{
    /* Before its handshake a peer is unauthenticated: a frame announcing more than
     * LNK_HANDSHAKE_MAX_FRAME is refused from its header alone (REJECT, closed at once), not
     * buffered up to max_frame while the handshake deadline runs. After the handshake the full
     * max_frame applies. */
    lnk_worker_server_params_t sp = lnk_worker_server_params_default();
    sp.handshake_timeout_ms = 60000; /* the deadline is not what closes it */
    fx_t f;
    PC_TEST_CALL(fx_setup(&f, &sp));
    raw_t r;
    PC_TEST_CALL(raw_open(&f, &r, f.addr, true));
    uint32_t len = LNK_HANDSHAKE_MAX_FRAME + 1;
    uint8_t big[ENG_WIRE_HEADER_BYTES] = {'K',
                                          'W',
                                          ENG_WIRE_VERSION,
                                          ENG_WIRE_HELLO,
                                          0,
                                          0,
                                          0,
                                          0,
                                          (uint8_t)len,
                                          (uint8_t)(len >> 8),
                                          (uint8_t)(len >> 16),
                                          (uint8_t)(len >> 24)};
    raw_send(&r, big, sizeof big);
    RUN_UNTIL(&f, r.eof, 2000);
    uint32_t n;
    char why[256] = "";
    ASSERT_EQ(raw_frames(&r, ENG_WIRE_REJECT, &n, why, sizeof why), 0);
    ASSERT_EQ(n, 1);
    char want[64];
    snprintf(want, sizeof want, "over the limit of %u", LNK_HANDSHAKE_MAX_FRAME);
    if (strstr(why, want) == NULL)
        PC_TEST__FAIL("reason: %s", why);
    PC_TEST_CALL(raw_close(&f, &r));
    lnk_worker_server_stats_t st;
    RUN_UNTIL(&f, (lnk_worker_server_stats(f.srv, &st), st.conns_open == 0), 2000);
    ASSERT_EQ(st.conns_bad_frame, 1);
    ASSERT_EQ(st.conns_timeout, 0);

    /* A HELLO fits; after it, a SUBMIT of 3000 tokens (12 KB, over the handshake limit) is
     * decoded and answered (the prompt is longer than the model's context: ERROR for it). */
    cl_t k;
    PC_TEST_CALL(cl_open(&f, &k));
    static uint32_t prompt[3000];
    make_prompt(prompt, 3000, 9);
    eng_wire_submit_t sb = greedy(1, prompt, 3000, 1);
    ASSERT_EQ(lnk_worker_client_submit(k.c, &sb), 0);
    RUN_UNTIL(&f, k.rq[1].failed || k.closed, 5000);
    ASSERT_FALSE(k.closed);
    ASSERT_EQ(k.rq[1].err, PC_ERR_RANGE);
    PC_TEST_CALL(cl_close(&f, &k));
    PC_TEST_CALL(fx_teardown(&f));
}

PC_TEST(silent_peer_dropped)
{
    lnk_worker_server_params_t sp = lnk_worker_server_params_default();
    sp.handshake_timeout_ms = 150;
    fx_t f;
    PC_TEST_CALL(fx_setup(&f, &sp));

    /* No HELLO at all: dropped at the handshake deadline. */
    raw_t r;
    PC_TEST_CALL(raw_open(&f, &r, f.addr, true));
    uint64_t t0 = pc_time_mono_ms();
    RUN_UNTIL(&f, r.eof, 5000);
    ASSERT_TRUE(r.eof_ms - t0 >= 100);
    PC_TEST_CALL(raw_close(&f, &r));

    /* HELLO with a 50 ms heartbeat, then silence (while reading what the worker sends): gone
     * after 3 missed heartbeats. */
    PC_TEST_CALL(raw_open(&f, &r, f.addr, true));
    eng_wire_frame_t h = hello_frame(50);
    raw_send_frame(&r, &h);
    t0 = pc_time_mono_ms();
    RUN_UNTIL(&f, r.eof, 5000);
    uint64_t dt = r.eof_ms - t0;
    if (dt < 140 || dt > 1500)
        PC_TEST__FAIL("dropped after %llu ms, expected about 150", (unsigned long long)dt);
    uint32_t n;
    ASSERT_EQ(raw_frames(&r, ENG_WIRE_HELLO_ACK, &n, NULL, 0), 0);
    ASSERT_EQ(n, 1);
    PC_TEST_CALL(raw_close(&f, &r));

    /* A client that keeps its heartbeats going stays, well past 3 of its intervals. */
    cl_t k;
    lnk_worker_client_params_t p = lnk_worker_client_params_default();
    p.heartbeat_ms = 30;
    PC_TEST_CALL(cl_connect(&f, &k, &p, NULL));
    RUN_UNTIL(&f, k.ready, 5000);
    uint64_t until = pc_time_mono_ms() + 400;
    while (pc_time_mono_ms() < until)
        uv_run(&f.loop, UV_RUN_ONCE);
    ASSERT_FALSE(k.closed);
    PC_TEST_CALL(cl_close(&f, &k));

    lnk_worker_server_stats_t st;
    RUN_UNTIL(&f, (lnk_worker_server_stats(f.srv, &st), st.conns_open == 0), 5000);
    ASSERT_EQ(st.conns_timeout, 2);
    PC_TEST_CALL(fx_teardown(&f));
}

/* A fake worker for the client's side: answers HELLO with HELLO_ACK (heartbeat 50 ms), then
 * says nothing more. */
typedef struct fake {
    uv_tcp_t l;
    raw_t peer;
    bool accepted, acked;
} fake_t;

static void fake_on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    fake_t *fk = PC_CONTAINER_OF((raw_t *)s->data, fake_t, peer);
    if (n <= 0 || fk->acked)
        return;
    eng_wire_frame_t a = {.type = ENG_WIRE_HELLO_ACK};
    a.u.hello.version_min = a.u.hello.version_max = ENG_WIRE_VERSION;
    a.u.hello.role = ENG_WIRE_ROLE_WORKER;
    a.u.hello.heartbeat_ms = 50;
    a.u.hello.max_frame = ENG_WIRE_MAX_FRAME_DEFAULT;
    a.u.hello.model_name = PC_SLICE_LIT("fake");
    raw_send_frame(&fk->peer, &a);
    fk->acked = true;
}

static void fake_on_conn(uv_stream_t *l, int status)
{
    fake_t *fk = l->data;
    memset(&fk->peer, 0, offsetof(raw_t, rbuf));
    uv_tcp_init(l->loop, &fk->peer.tcp);
    fk->peer.tcp.data = &fk->peer;
    if (status == 0 && uv_accept(l, (uv_stream_t *)&fk->peer.tcp) == 0) {
        fk->accepted = true;
        uv_read_start((uv_stream_t *)&fk->peer.tcp, raw_alloc, fake_on_read);
    }
}

PC_TEST(client_drops_silent_worker)
{
    fx_t f;
    PC_TEST_CALL(fx_setup(&f, NULL));
    fake_t fk = {0};
    struct sockaddr_in sa;
    uv_ip4_addr("127.0.0.1", 0, &sa);
    uv_tcp_init(&f.loop, &fk.l);
    fk.l.data = &fk;
    ASSERT_EQ(uv_tcp_bind(&fk.l, (struct sockaddr *)&sa, 0), 0);
    ASSERT_EQ(uv_listen((uv_stream_t *)&fk.l, 4, fake_on_conn), 0);
    int len = sizeof sa;
    uv_tcp_getsockname(&fk.l, (struct sockaddr *)&sa, &len);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(sa.sin_port));
    cl_t k;
    PC_TEST_CALL(cl_connect(&f, &k, NULL, addr));
    RUN_UNTIL(&f, k.ready || k.closed, 5000);
    ASSERT_TRUE(k.ready);
    ASSERT_STR_EQ(k.ack_model, "fake");
    uint64_t t0 = pc_time_mono_ms();
    RUN_UNTIL(&f, k.closed, 5000);
    uint64_t dt = pc_time_mono_ms() - t0;
    ASSERT_EQ(k.close_err, PC_ERR_TIMEOUT);
    if (dt < 100 || dt > 1500)
        PC_TEST__FAIL("dropped after %llu ms, expected about 150", (unsigned long long)dt);

    /* Connecting where nobody listens: on_close with PC_ERR_IO. */
    uv_close((uv_handle_t *)&fk.l, NULL);
    if (fk.accepted)
        PC_TEST_CALL(raw_close(&f, &fk.peer));
    PC_TEST_CALL(cl_connect(&f, &k, NULL, addr));
    RUN_UNTIL(&f, k.closed, 5000);
    ASSERT_EQ(k.close_err, PC_ERR_IO);
    PC_TEST_CALL(fx_teardown(&f));
}

PC_TEST(slow_reader_dropped)
{
    lnk_worker_server_params_t sp = lnk_worker_server_params_default();
    sp.max_queue_bytes = 64 << 10;
    fx_t f;
    PC_TEST_CALL(fx_setup(&f, &sp));
    cl_t b;
    PC_TEST_CALL(cl_open(&f, &b));

    /* Handshake, then HEARTBEATs (each answered by LOAD) without ever reading. */
    raw_t r;
    PC_TEST_CALL(raw_open(&f, &r, f.addr, false));
    eng_wire_frame_t h = hello_frame(1000);
    raw_send_frame(&r, &h);
    eng_wire_frame_t hb = {.type = ENG_WIRE_HEARTBEAT};
    pc_buf_t burst = PC_BUF_INIT;
    char why[128];
    for (int i = 0; i < 4096; i++)
        ASSERT_EQ(eng_wire_encode(&hb, ENG_WIRE_MAX_FRAME_DEFAULT, &burst, why, sizeof why), 0);
    lnk_worker_server_stats_t st;
    uint64_t deadline = pc_time_mono_ms() + 20000;
    for (;;) {
        lnk_worker_server_stats(f.srv, &st);
        if (st.conns_slow > 0 || pc_time_mono_ms() > deadline)
            break;
        if (r.tcp.write_queue_size < (1u << 20))
            raw_send(&r, burst.base, burst.len);
        uv_run(&f.loop, UV_RUN_ONCE);
    }
    pc_buf_free(&burst);
    ASSERT_EQ(st.conns_slow, 1);
    PC_TEST_CALL(raw_close(&f, &r));
    /* The others are served. */
    uint32_t prompt[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    eng_wire_submit_t s = greedy(1, prompt, 8, 6);
    ASSERT_EQ(lnk_worker_client_submit(b.c, &s), 0);
    RUN_UNTIL(&f, b.rq[1].done, 10000);
    ASSERT_EQ(b.rq[1].n_tokens, 6);
    PC_TEST_CALL(cl_close(&f, &b));
    PC_TEST_CALL(fx_teardown(&f));
}

PC_TEST(unsendable_frames_close_with_a_reason)
{
    /* Frames the server cannot queue for a gateway (here: over the connection's output limit
     * while a burst of requests finishes) end the connection, and the gateway learns why:
     * ERROR (request 0) with the reason, then the close. Its requests are never left waiting
     * for a DONE that was dropped. */
    lnk_worker_server_params_t sp = lnk_worker_server_params_default();
    sp.max_queue_bytes = 512; /* the handshake fits, 16 TOKEN + DONE pairs do not */
    fx_t f;
    PC_TEST_CALL(fx_setup(&f, &sp));
    cl_t k;
    PC_TEST_CALL(cl_open(&f, &k));
    uint32_t prompt[8];
    make_prompt(prompt, 8, 12);
    for (uint64_t id = 1; id <= MAX_REQ; id++) {
        eng_wire_submit_t s = greedy(id, prompt, 8, 1);
        ASSERT_EQ(lnk_worker_client_submit(k.c, &s), 0);
    }
    RUN_UNTIL(&f, k.closed, 10000);
    ASSERT_EQ(k.close_err, PC_ERR_OVERLOADED);
    if (strstr(k.close_reason, "not reading") == NULL)
        PC_TEST__FAIL("reason: %s", k.close_reason);
    uint32_t n_final = 0;
    for (int id = 1; id <= MAX_REQ; id++)
        n_final += k.rq[id].done || k.rq[id].failed;
    ASSERT_TRUE(n_final < MAX_REQ); /* some final frames were dropped: the close covers them */
    lnk_worker_server_stats_t st;
    RUN_UNTIL(&f, (lnk_worker_server_stats(f.srv, &st), st.conns_open == 0), 5000);
    ASSERT_EQ(st.conns_slow, 1);
    ASSERT_EQ(st.requests_live, 0);
    PC_TEST_CALL(fx_teardown(&f));
}

/* ---------------------------------------------------------------------------------------------
 * Shutdown
 * ------------------------------------------------------------------------------------------- */

PC_TEST(shutdown_cancels_and_drains)
{
    fx_t f;
    PC_TEST_CALL(fx_setup(&f, NULL));
    cl_t k;
    PC_TEST_CALL(cl_open(&f, &k));
    uint32_t prompt[12];
    make_prompt(prompt, 12, 5);
    eng_wire_submit_t s = greedy(1, prompt, 12, 1000);
    ASSERT_EQ(lnk_worker_client_submit(k.c, &s), 0);
    RUN_UNTIL(&f, k.rq[1].n_tokens >= 2, 10000);
    lnk_worker_server_shutdown(f.srv, on_srv_closed, &f);
    RUN_UNTIL(&f, f.srv_closed && k.closed, 10000);
    ASSERT_TRUE(k.rq[1].done); /* the final frame was delivered before the close */
    ASSERT_EQ(k.rq[1].stop, ENG_WIRE_STOP_CANCELED);
    ASSERT_EQ(k.close_err, PC_ERR_CLOSED);
    ASSERT_TRUE(strstr(k.close_reason, "shutting down") != NULL);
    lnk_worker_server_free(f.srv);
    uv_close((uv_handle_t *)&f.tick, NULL);
    uv_run(&f.loop, UV_RUN_DEFAULT);
    ASSERT_EQ(uv_loop_close(&f.loop), 0);
}

PC_TEST(shutdown_drain_timeout_with_live_request)
{
    /* drain_timeout_ms 0: the drain ends before the canceled request's final event can come
     * back, so the connections close with the request still live. Closing them must not touch
     * the worker, which is being stopped (this crashed in eng_worker_cancel on a freed worker),
     * and the shutdown completes with the client told why. */
    lnk_worker_server_params_t sp = lnk_worker_server_params_default();
    sp.drain_timeout_ms = 0;
    fx_t f;
    PC_TEST_CALL(fx_setup(&f, &sp));
    cl_t k;
    PC_TEST_CALL(cl_open(&f, &k));
    uint32_t prompt[12];
    make_prompt(prompt, 12, 6);
    eng_wire_submit_t s = greedy(1, prompt, 12, 1000);
    ASSERT_EQ(lnk_worker_client_submit(k.c, &s), 0);
    RUN_UNTIL(&f, k.rq[1].n_tokens >= 2, 10000);
    lnk_worker_server_stats_t st;
    lnk_worker_server_stats(f.srv, &st);
    ASSERT_EQ(st.requests_live, 1);
    lnk_worker_server_shutdown(f.srv, on_srv_closed, &f);
    RUN_UNTIL(&f, f.srv_closed && k.closed, 10000);
    ASSERT_EQ(k.close_err, PC_ERR_CLOSED);
    ASSERT_TRUE(strstr(k.close_reason, "shutting down") != NULL);
    ASSERT_TRUE(lnk_worker_server_worker(f.srv) == NULL); /* stopped and freed */
    lnk_worker_server_stats(f.srv, &st);
    ASSERT_EQ(st.requests_live, 0);
    ASSERT_EQ(st.conns_open, 0);
    lnk_worker_server_free(f.srv);
    uv_close((uv_handle_t *)&f.tick, NULL);
    uv_run(&f.loop, UV_RUN_DEFAULT);
    ASSERT_EQ(uv_loop_close(&f.loop), 0);
}

/* Starts `kvgw worker` on an ephemeral loopback port (with kv_tokens and, when tier_dir is not
 * NULL, a disk tier there); its stdout's first line gives the port. */
static void spawn_worker_with(pid_t *pid, char *addr, size_t addr_len, const char *kv_tokens,
                              const char *tier_dir)
{
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    char *argv[] = {KVGW_BIN,      "worker",    "--model", (char *)model_path(), "--listen",
                    "127.0.0.1:0", "--threads", "1",       "--kv-tokens",        (char *)kv_tokens,
                    "--log-level", "warn",      NULL,      (char *)tier_dir,     NULL};
    if (tier_dir != NULL)
        argv[12] = "--kv-tier-dir";
    int rc = posix_spawn(pid, KVGW_BIN, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    ASSERT_EQ(rc, 0);
    char line[128] = "";
    size_t n = 0;
    while (n + 1 < sizeof line) {
        ssize_t k = read(fds[0], line + n, 1);
        if (k <= 0 || line[n] == '\n')
            break;
        n++;
    }
    line[n] = '\0';
    close(fds[0]);
    if (strncmp(line, "listening on ", 13) != 0)
        PC_TEST__FAIL("kvgw worker printed '%s'", line);
    snprintf(addr, addr_len, "%.64s", line + 13);
}

static void spawn_worker(pid_t *pid, char *addr, size_t addr_len)
{
    spawn_worker_with(pid, addr, addr_len, "4096", NULL);
}

static int wait_exit(pid_t pid, int timeout_ms)
{
    uint64_t deadline = pc_time_mono_ms() + (uint64_t)timeout_ms;
    int status;
    while (pc_time_mono_ms() < deadline) {
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

static pid_t g_child = -1;

static void binary_test(void)
{
    fx_t f;
    PC_TEST_CALL(fx_setup(&f, NULL)); /* the in-process server is unused here, but harmless */
    pid_t pid;
    char addr[80];
    PC_TEST_CALL(spawn_worker(&pid, addr, sizeof addr));
    g_child = pid;
    cl_t k;
    PC_TEST_CALL(cl_connect(&f, &k, NULL, addr));
    RUN_UNTIL(&f, k.ready || k.closed, 10000);
    ASSERT_TRUE(k.ready);
    ASSERT_STR_EQ(k.ack_model, MODEL_NAME);
    uint32_t prompt[30];
    make_prompt(prompt, 30, 3);
    eng_wire_submit_t s = greedy(1, prompt, 30, 16);
    ASSERT_EQ(lnk_worker_client_submit(k.c, &s), 0);
    RUN_UNTIL(&f, k.rq[1].done, 20000);
    rq_t want;
    PC_TEST_CALL(inproc_run(&s, &want));
    ASSERT_EQ(k.rq[1].n_tokens, 16);
    ASSERT_MEM_EQ(k.rq[1].tokens, want.tokens, 16 * sizeof(uint32_t));

    /* SIGTERM with a request streaming: DONE canceled, the connection closed, exit 0. */
    s = greedy(2, prompt, 30, 900);
    ASSERT_EQ(lnk_worker_client_submit(k.c, &s), 0);
    RUN_UNTIL(&f, k.rq[2].n_tokens >= 2, 10000);
    kill(pid, SIGTERM);
    RUN_UNTIL(&f, k.closed, 10000);
    ASSERT_TRUE(k.rq[2].done);
    ASSERT_EQ(k.rq[2].stop, ENG_WIRE_STOP_CANCELED);
    ASSERT_EQ(k.close_err, PC_ERR_CLOSED);
    g_child = -1;
    ASSERT_EQ(wait_exit(pid, 10000), 0);

    /* Bad usage: exit 2. */
    char *bad[] = {KVGW_BIN, "worker", "--model", "x.gguf", "--listen", "nowhere", NULL};
    ASSERT_EQ(posix_spawn(&pid, KVGW_BIN, NULL, NULL, bad, environ), 0);
    ASSERT_EQ(wait_exit(pid, 10000), 2);
    /* A model that does not load: exit 1. */
    char *fail[] = {KVGW_BIN,   "worker",      "--model",     "/nonexistent.gguf",
                    "--listen", "127.0.0.1:0", "--log-level", "off",
                    NULL};
    ASSERT_EQ(posix_spawn(&pid, KVGW_BIN, NULL, NULL, fail, environ), 0);
    ASSERT_EQ(wait_exit(pid, 10000), 1);
    PC_TEST_CALL(fx_teardown(&f));
}

/* Runs `kvgw worker --backend B` (stdout and stderr into one pipe) until it prints its
 * "listening on" line (then SIGTERM) or exits; out gets what it printed. Returns its exit
 * status, or -1. */
static int run_backend(const char *backend, char *out, size_t out_len)
{
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    char *argv[] = {KVGW_BIN,    "worker",      "--model",     (char *)model_path(),
                    "--listen",  "127.0.0.1:0", "--backend",   (char *)backend,
                    "--threads", "1",           "--log-level", "warn",
                    NULL};
    pid_t pid;
    int rc = posix_spawn(&pid, KVGW_BIN, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc != 0) {
        close(fds[0]);
        return -1;
    }
    size_t n = 0;
    bool listening = false;
    while (n + 1 < out_len && !listening) {
        ssize_t k = read(fds[0], out + n, out_len - 1 - n);
        if (k <= 0)
            break;
        n += (size_t)k;
        out[n] = '\0';
        listening = strstr(out, "listening on ") != NULL;
    }
    out[n] = '\0';
    if (listening)
        kill(pid, SIGTERM);
    int status = wait_exit(pid, 10000);
    close(fds[0]);
    return status;
}

PC_TEST(kvgw_worker_backend_choice)
{
    /* auto says which backend it chose and why; cuda either serves (where auto chose it) or
     * fails with the reason; an unknown name is a usage error. */
    static char out[8192];
    ASSERT_EQ(run_backend("auto", out, sizeof out), 0);
    bool on_cpu = strstr(out, "kvgw worker: backend cpu (auto: cuda unavailable: ") != NULL;
    bool on_gpu = strstr(out, "kvgw worker: backend cuda (auto: ") != NULL;
    if (!on_cpu && !on_gpu)
        PC_TEST__FAIL("auto printed: %s", out);
    ASSERT_EQ(run_backend("cpu", out, sizeof out), 0);
    if (strstr(out, "kvgw worker: backend cpu (asked)") == NULL)
        PC_TEST__FAIL("cpu printed: %s", out);
    int rc = run_backend("cuda", out, sizeof out);
    if (on_cpu) { /* no usable GPU: the engine's (CUDA's) reason, exit 1 */
        ASSERT_EQ(rc, 1);
        if (strstr(out, "cuda") == NULL && strstr(out, "CUDA") == NULL)
            PC_TEST__FAIL("cuda printed: %s", out);
    } else {
        ASSERT_EQ(rc, 0);
        if (strstr(out, "kvgw worker: backend cuda (asked)") == NULL)
            PC_TEST__FAIL("cuda printed: %s", out);
    }
    ASSERT_EQ(run_backend("tpu", out, sizeof out), 2);
    if (strstr(out, "is not cpu, cuda or auto") == NULL)
        PC_TEST__FAIL("tpu printed: %s", out);
}

PC_TEST(kvgw_worker_binary_serves_and_stops_on_sigterm)
{
    binary_test();
    if (g_child > 0) { /* failed midway: never leave the process behind */
        kill(g_child, SIGKILL);
        waitpid(g_child, NULL, 0);
        g_child = -1;
    }
}

/* ---------------------------------------------------------------------------------------------
 * `kill -9` of a `kvgw worker` with a disk tier while it writes records, and a restart on the
 * same directory.
 * ------------------------------------------------------------------------------------------- */

#define KILL_ROUNDS 4
#define KILL_FLOOD 12 /* prompts per round, request ids 2 .. KILL_FLOOD + 1 */
#define KILL_KEEP 320 /* the retained prompt's tokens (20 blocks) */
#define KILL_FLOOD_N 256
#define KILL_MAX_FILES 64

static uint64_t g_kill_rng;
static uint32_t kill_rnd(uint32_t n)
{
    g_kill_rng ^= g_kill_rng << 13;
    g_kill_rng ^= g_kill_rng >> 7;
    g_kill_rng ^= g_kill_rng << 17;
    return (uint32_t)(g_kill_rng % n);
}

/* The record files (DIR/xx/<name>.kvb) under dir; returns how many (at most max). */
static uint32_t record_files(const char *dir, char (*out)[512], uint32_t max)
{
    uint32_t n = 0;
    DIR *d = opendir(dir);
    if (d == NULL)
        return 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL && n < max) {
        if (strlen(de->d_name) != 2)
            continue;
        char sub[256];
        snprintf(sub, sizeof sub, "%.240s/%.2s", dir, de->d_name);
        DIR *d2 = opendir(sub);
        if (d2 == NULL)
            continue;
        struct dirent *f;
        while ((f = readdir(d2)) != NULL && n < max) {
            size_t l = strlen(f->d_name);
            if (l > 4 && strcmp(f->d_name + l - 4, ".kvb") == 0)
                snprintf(out[n++], 512, "%s/%.200s", sub, f->d_name);
        }
        closedir(d2);
    }
    closedir(d);
    return n;
}

/* Flips one byte in the middle of a record file (inside its payload): a record that rotted on
 * disk, which every read must refuse. Returns true when a byte was flipped. */
static bool rot_record(const char *path)
{
    int fd = open(path, O_RDWR);
    if (fd < 0)
        return false;
    struct stat st;
    bool ok = false;
    if (fstat(fd, &st) == 0 && st.st_size > 2) {
        off_t at = st.st_size / 2;
        unsigned char b;
        if (pread(fd, &b, 1, at) == 1) {
            b ^= 0x5a;
            ok = pwrite(fd, &b, 1, at) == 1;
        }
    }
    close(fd);
    return ok;
}

/* The block index a record file holds (its head, engine/kvtier.h: u32 at offset 88), or
 * UINT32_MAX when it cannot be read. */
static uint32_t record_block_index(const char *path)
{
    uint8_t b[4];
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return UINT32_MAX;
    ssize_t n = pread(fd, b, sizeof b, 88);
    close(fd);
    return n == 4
               ? (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24
               : UINT32_MAX;
}

static void kill_prompt(uint32_t *p, uint32_t n, uint32_t round, uint32_t j)
{
    make_prompt(p, n, 1000 + round * 100 + j);
    p[0] = (round * 31 + j * 7) % N_VOCAB; /* distinct from the first block on */
}

static pid_t g_kill_child = -1;

static void kill_test(void)
{
    static char dir[256];
    snprintf(dir, sizeof dir, "/tmp/kvgw-wnet-kill-%d/w0", (int)getpid());
    const char *seed_env = getenv("KVGW_KILL_SEED");
    g_kill_rng = seed_env != NULL ? strtoull(seed_env, NULL, 0) : pc_time_mono_ns() | 1;
    fprintf(stderr, "kill test: seed %llu (KVGW_KILL_SEED replays it)\n",
            (unsigned long long)g_kill_rng);

    /* Cold references: a worker without tiers, one request at a time. */
    static uint32_t keep[KILL_KEEP], flood[KILL_ROUNDS][KILL_FLOOD][KILL_FLOOD_N];
    static rq_t keep_want, flood_want[KILL_ROUNDS][KILL_FLOOD];
    make_prompt(keep, KILL_KEEP, 77);
    eng_wire_submit_t s = greedy(1, keep, KILL_KEEP, 8);
    PC_TEST_CALL(inproc_run(&s, &keep_want));
    for (uint32_t r = 0; r < KILL_ROUNDS; r++)
        for (uint32_t j = 0; j < KILL_FLOOD; j++) {
            kill_prompt(flood[r][j], KILL_FLOOD_N, r, j);
            s = greedy(2 + j, flood[r][j], KILL_FLOOD_N, 2);
            PC_TEST_CALL(inproc_run(&s, &flood_want[r][j]));
        }

    fx_t f;
    PC_TEST_CALL(fx_setup(&f, NULL));
    static cl_t k;
    static char keep_files[KILL_MAX_FILES][512];
    uint32_t n_keep_files = 0;
    uint64_t flood_g3 = 0;
    for (uint32_t round = 0; round <= KILL_ROUNDS; round++) {
        pid_t pid;
        char addr[80];
        PC_TEST_CALL(spawn_worker_with(&pid, addr, sizeof addr, "1024", dir));
        g_kill_child = pid;
        PC_TEST_CALL(cl_connect(&f, &k, NULL, addr));
        RUN_UNTIL(&f, k.ready || k.closed, 10000);
        ASSERT_TRUE(k.ready);

        if (round == 0) { /* the retained prompt, written through, on disk before any kill */
            eng_wire_retain_t ret = {.n_tokens = KILL_KEEP, .ttl_ms = 3600000};
            s = greedy(1, keep, KILL_KEEP, 8);
            s.retain = &ret;
            s.n_retain = 1;
            ASSERT_EQ(lnk_worker_client_submit(k.c, &s), 0);
            RUN_UNTIL(&f, k.rq[1].done || k.rq[1].failed, 20000);
            ASSERT_TRUE(k.rq[1].done);
            ASSERT_MEM_EQ(k.rq[1].tokens, keep_want.tokens, 8 * sizeof(uint32_t));
            uint64_t until = pc_time_mono_ms() + 10000;
            while (k.load.g3.blocks < KILL_KEEP / 16 && pc_time_mono_ms() < until) {
                uint32_t n0 = k.n_loads;
                ASSERT_EQ(lnk_worker_client_ping(k.c), 0);
                RUN_UNTIL(&f, k.n_loads > n0, 2000);
            }
            ASSERT_EQ(k.load.g3.blocks, KILL_KEEP / 16);
            n_keep_files = record_files(dir, keep_files, KILL_MAX_FILES);
            ASSERT_EQ(n_keep_files, KILL_KEEP / 16);
        } else { /* after a kill: what was on disk is served, and only good records are */
            memset(k.rq, 0, sizeof k.rq);
            s = greedy(1, keep, KILL_KEEP, 8);
            ASSERT_EQ(lnk_worker_client_submit(k.c, &s), 0);
            for (uint32_t j = 0; j < KILL_FLOOD; j++) {
                s = greedy(2 + j, flood[round - 1][j], KILL_FLOOD_N, 2);
                ASSERT_EQ(lnk_worker_client_submit(k.c, &s), 0);
            }
            for (uint32_t id = 1; id <= KILL_FLOOD + 1; id++) {
                RUN_UNTIL(&f, k.rq[id].done || k.rq[id].failed, 30000);
                ASSERT_TRUE(k.rq[id].done);
                ASSERT_EQ(k.rq[id].n_prefill, 1);
                const rq_t *want = id == 1 ? &keep_want : &flood_want[round - 1][id - 2];
                ASSERT_EQ(k.rq[id].n_tokens, want->n_tokens);
                ASSERT_MEM_EQ(k.rq[id].tokens, want->tokens, want->n_tokens * sizeof(uint32_t));
                ASSERT_EQ(k.rq[id].usage.tokens_reused, k.rq[id].pf.tokens_g1 +
                                                            k.rq[id].pf.tokens_g3 +
                                                            k.rq[id].pf.tokens_recomputed);
                if (id > 1)
                    flood_g3 += k.rq[id].pf.tokens_g3;
            }
            /* The retained prefix cached before the kill is a disk hit after it (one of its
             * blocks was rotted before this start: refused, counted, recomputed). */
            ASSERT_TRUE(k.rq[1].pf.tokens_g3 > 0);
            ASSERT_TRUE(k.rq[1].usage.tokens_reused >= k.rq[1].pf.tokens_g3);
            uint32_t n0 = k.n_loads;
            ASSERT_EQ(lnk_worker_client_ping(k.c), 0);
            RUN_UNTIL(&f, k.n_loads > n0, 2000);
            ASSERT_TRUE(k.load.g3.corrupt >= 1);
            fprintf(stderr,
                    "kill test: start %u: retained prompt g3 %u recomputed %u of %u; the killed "
                    "round's prompts %llu g3 tokens so far; %llu corrupt records refused\n",
                    round, k.rq[1].pf.tokens_g3, k.rq[1].pf.tokens_recomputed, KILL_KEEP,
                    (unsigned long long)flood_g3, (unsigned long long)k.load.g3.corrupt);
            if (round == KILL_ROUNDS) {
                PC_TEST_CALL(cl_close(&f, &k));
                ASSERT_EQ(kill(pid, SIGTERM), 0);
                g_kill_child = -1;
                ASSERT_EQ(wait_exit(pid, 10000), 0);
                break;
            }
        }
        /* Prompts that evict one another (the pool holds 64 blocks): their prefixes are written
         * back while the next ones run; SIGKILL lands after a random number of them. */
        memset(k.rq, 0, sizeof k.rq);
        for (uint32_t j = 0; j < KILL_FLOOD; j++) {
            s = greedy(2 + j, flood[round][j], KILL_FLOOD_N, 2);
            ASSERT_EQ(lnk_worker_client_submit(k.c, &s), 0);
        }
        uint32_t at = 1 + kill_rnd(KILL_FLOOD - 1), done = 0;
        uint64_t until = pc_time_mono_ms() + 30000;
        while (done < at && pc_time_mono_ms() < until) {
            uv_run(&f.loop, UV_RUN_ONCE);
            done = 0;
            for (uint32_t j = 0; j < KILL_FLOOD; j++)
                done += k.rq[2 + j].done;
        }
        ASSERT_TRUE(done >= at);
        usleep(kill_rnd(3000)); /* somewhere inside the next prompt's writes */
        ASSERT_EQ(kill(pid, SIGKILL), 0);
        int status;
        ASSERT_EQ(waitpid(pid, &status, 0), pid);
        g_kill_child = -1;
        ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        RUN_UNTIL(&f, k.closed, 10000);
        /* Rot one record of the retained prompt (a record that went bad on disk): one the next
         * request reads, so not the last block, whose last token is always computed. */
        const char *victim;
        do
            victim = keep_files[kill_rnd(n_keep_files)];
        while (record_block_index(victim) >= KILL_KEEP / 16 - 1);
        ASSERT_TRUE(rot_record(victim));
        fprintf(stderr, "kill test: round %u killed after %u of %u prompts\n", round, done,
                KILL_FLOOD);
    }
    PC_TEST_CALL(fx_teardown(&f));
}

PC_TEST(kvgw_worker_sigkill_keeps_disk_tier)
{
    kill_test();
    if (g_kill_child > 0) {
        kill(g_kill_child, SIGKILL);
        waitpid(g_kill_child, NULL, 0);
        g_kill_child = -1;
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf /tmp/kvgw-wnet-kill-%d", (int)getpid());
    ASSERT_EQ(system(cmd), 0);
}

/* ---------------------------------------------------------------------------------------------
 * The seed corpus of tests/fuzz/fuzz_worker_server.c: checked against the committed files, or
 * written with KVGW_WNET_CORPUS=DIR.
 * ------------------------------------------------------------------------------------------- */

static void seed_frame(pc_buf_t *b, const eng_wire_frame_t *f)
{
    char err[160] = "";
    int rc = eng_wire_encode(f, 0, b, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "encode: %s\n", err);
    ASSERT_EQ(rc, 0);
}

#define SEED_CORPUS "tests/fuzz/corpus/fuzz_worker_server"

/* Writes the seed into dir (a refresh of the corpus), or with dir NULL checks that the committed
 * seed of that name holds exactly these bytes: a change to the wire encoding or to a seed below
 * that was not carried to the committed corpus fails here. */
static void seed_write(const char *dir, const char *name, const pc_buf_t *b)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir != NULL ? dir : SEED_CORPUS, name);
    FILE *fp = fopen(path, dir != NULL ? "wb" : "rb");
    ASSERT_TRUE(fp != NULL);
    if (dir != NULL) {
        ASSERT_EQ(fwrite(b->base, 1, b->len, fp), b->len);
        fclose(fp);
        return;
    }
    char *disk = pc_xmalloc(b->len + 1);
    size_t n = fread(disk, 1, b->len + 1, fp);
    fclose(fp);
    bool same = n == b->len && memcmp(disk, b->base, n) == 0;
    pc_free(disk);
    if (!same)
        PC_TEST__FAIL("%s (%zu bytes) is not the seed generated here (%zu bytes): refresh it with "
                      "KVGW_WNET_CORPUS=" SEED_CORPUS " build/tests/test_worker_net corpus_seeds",
                      path, n, b->len);
}

PC_TEST(corpus_seeds)
{
    /* With KVGW_WNET_CORPUS=DIR the seeds go there (to refresh the committed corpus); without it
     * every seed frame must encode and every seed must equal its committed file byte for byte. */
    const char *dir = getenv("KVGW_WNET_CORPUS");
    static uint32_t prompt[40], toolong[1100];
    make_prompt(prompt, 40, 4);
    make_prompt(toolong, 1100, 5);
    eng_wire_frame_t sub = {.type = ENG_WIRE_SUBMIT}, can = {.type = ENG_WIRE_CANCEL};
    eng_wire_frame_t hb = {.type = ENG_WIRE_HEARTBEAT}, hello = hello_frame(1000);
    pc_buf_t b = PC_BUF_INIT;
    const uint8_t with_hello = 1, raw = 0;

    /* A stream, a heartbeat, a cancel of the first. */
    pc_buf_append(&b, &with_hello, 1);
    sub.u.submit = greedy(1, prompt, 40, 4);
    PC_TEST_CALL(seed_frame(&b, &sub));
    sub.u.submit = greedy(2, prompt, 12, 30);
    PC_TEST_CALL(seed_frame(&b, &sub));
    PC_TEST_CALL(seed_frame(&b, &hb));
    can.u.cancel_id = 2;
    PC_TEST_CALL(seed_frame(&b, &can));
    PC_TEST_CALL(seed_write(dir, "submit_cancel", &b));

    /* Every SUBMIT field used: retain, stops, stop ids, sampling, prefill only, bad token. */
    b.len = 0;
    pc_buf_append(&b, &with_hello, 1);
    eng_wire_retain_t keep[2] = {{8, 1000}, {40, 60000}};
    pc_slice_t stops[2] = {PC_SLICE_LIT("ab"), PC_SLICE_LIT("\n\n")};
    uint32_t stop_ids[2] = {10, 32};
    sub.u.submit = greedy(3, prompt, 40, 6);
    sub.u.submit.retain = keep;
    sub.u.submit.n_retain = 2;
    sub.u.submit.stops = stops;
    sub.u.submit.n_stops = 2;
    sub.u.submit.stop_ids = stop_ids;
    sub.u.submit.n_stop_ids = 2;
    sub.u.submit.sampling.temperature = 0.8f;
    sub.u.submit.sampling.top_k = 5;
    sub.u.submit.sampling.top_p = 0.9f;
    sub.u.submit.sampling.seed = 3;
    sub.u.submit.priority = 2;
    PC_TEST_CALL(seed_frame(&b, &sub));
    sub.u.submit = greedy(4, prompt, 40, 0);
    PC_TEST_CALL(seed_frame(&b, &sub));
    sub.u.submit = greedy(5, toolong, 1100, 1);
    PC_TEST_CALL(seed_frame(&b, &sub));
    uint32_t bad[2] = {1, 999};
    sub.u.submit = greedy(6, bad, 2, 1);
    PC_TEST_CALL(seed_frame(&b, &sub));
    PC_TEST_CALL(seed_write(dir, "submit_fields", &b));

    /* The gateway's index at work: a retained prefix, its early RELEASE, a DROP of the
     * namespace, a RELEASE of something never pinned, and an AUTH nobody asked for. */
    b.len = 0;
    pc_buf_append(&b, &with_hello, 1);
    eng_wire_retain_t keep1 = {16, 60000};
    sub.u.submit = greedy(9, prompt, 40, 2);
    sub.u.submit.ns = 3;
    sub.u.submit.retain = &keep1;
    sub.u.submit.n_retain = 1;
    PC_TEST_CALL(seed_frame(&b, &sub));
    eng_wire_frame_t rel = {.type = ENG_WIRE_RELEASE}, drop = {.type = ENG_WIRE_DROP};
    rel.u.release = (eng_wire_release_t){.ns = 3, .tokens = prompt, .n_tokens = 16};
    PC_TEST_CALL(seed_frame(&b, &rel));
    rel.u.release.n_tokens = 5;
    PC_TEST_CALL(seed_frame(&b, &rel));
    drop.u.release.ns = 3;
    PC_TEST_CALL(seed_frame(&b, &drop));
    eng_wire_frame_t auth = {.type = ENG_WIRE_AUTH};
    PC_TEST_CALL(seed_frame(&b, &auth));
    PC_TEST_CALL(seed_write(dir, "release_drop", &b));

    /* Protocol errors after the handshake: a reused id, a worker's frame, a second HELLO, a
     * truncated payload. */
    b.len = 0;
    pc_buf_append(&b, &with_hello, 1);
    sub.u.submit = greedy(7, prompt, 10, 50);
    PC_TEST_CALL(seed_frame(&b, &sub));
    PC_TEST_CALL(seed_frame(&b, &sub));
    PC_TEST_CALL(seed_write(dir, "reused_id", &b));
    b.len = 1;
    eng_wire_frame_t tok = {.type = ENG_WIRE_TOKEN};
    tok.u.token.request_id = 1;
    PC_TEST_CALL(seed_frame(&b, &tok));
    PC_TEST_CALL(seed_write(dir, "worker_frame", &b));
    b.len = 1;
    PC_TEST_CALL(seed_frame(&b, &hello));
    PC_TEST_CALL(seed_write(dir, "second_hello", &b));
    b.len = 1;
    sub.u.submit = greedy(8, prompt, 10, 5);
    PC_TEST_CALL(seed_frame(&b, &sub));
    b.len -= 7;
    PC_TEST_CALL(seed_write(dir, "truncated_submit", &b));

    /* Handshakes: valid with explicit identity, another version, role worker, SUBMIT first,
     * not the protocol. */
    b.len = 0;
    pc_buf_append(&b, &raw, 1);
    eng_wire_frame_t h2 = hello;
    h2.u.hello.model_name = PC_SLICE_LIT(MODEL_NAME);
    h2.u.hello.n_vocab = N_VOCAB;
    PC_TEST_CALL(seed_frame(&b, &h2));
    sub.u.submit = greedy(1, prompt, 20, 3);
    PC_TEST_CALL(seed_frame(&b, &sub));
    PC_TEST_CALL(seed_write(dir, "hello_model", &b));
    b.len = 1;
    h2 = hello;
    h2.u.hello.version_min = ENG_WIRE_VERSION + 1;
    h2.u.hello.version_max = ENG_WIRE_VERSION + 2;
    PC_TEST_CALL(seed_frame(&b, &h2));
    PC_TEST_CALL(seed_write(dir, "hello_version", &b));
    b.len = 1;
    h2 = hello;
    h2.u.hello.role = ENG_WIRE_ROLE_WORKER;
    PC_TEST_CALL(seed_frame(&b, &h2));
    PC_TEST_CALL(seed_write(dir, "hello_role", &b));
    b.len = 1;
    PC_TEST_CALL(seed_frame(&b, &sub));
    PC_TEST_CALL(seed_write(dir, "submit_first", &b));
    b.len = 1;
    pc_buf_append_cstr(&b, "GET / HTTP/1.1\r\nHost: worker\r\n\r\n");
    PC_TEST_CALL(seed_write(dir, "http", &b));

    /* The sealed server (byte 0 bit 1): frames the target seals after its handshake, and
     * (bit 2) the same frames unsealed, as someone on the path would inject them. */
    const uint8_t sealed = 2, injected = 6;
    b.len = 0;
    pc_buf_append(&b, &sealed, 1);
    sub.u.submit = greedy(1, prompt, 40, 4);
    PC_TEST_CALL(seed_frame(&b, &sub));
    PC_TEST_CALL(seed_frame(&b, &hb));
    can.u.cancel_id = 1;
    PC_TEST_CALL(seed_frame(&b, &can));
    PC_TEST_CALL(seed_write(dir, "sealed_submit_cancel", &b));
    b.base[0] = (char)injected;
    PC_TEST_CALL(seed_write(dir, "injected_submit", &b));
    pc_buf_free(&b);
}

PC_TEST_MAIN()
