/*
 * test_http.c — the HTTP server (gateway/http.c) over real loopback sockets.
 *
 * Everything runs on this thread: a real server on 127.0.0.1 port 0 on a private loop, and
 * plain non-blocking client sockets that the test writes and reads while it pumps the loop
 * (pump_until). The handler records each request; depending on the fixture's mode it answers
 * at once (an echo) or leaves the request for the test to answer, so that ordering, streaming,
 * aborts and backpressure are driven step by step.
 */
#define _GNU_SOURCE /* memmem, strcasestr */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "common.h"
#include "http.h"
#include "pc_test.h"

unsigned gw__http_req_lenient_flags(const gw_http_req_t *r);
size_t gw__http_server_unsent_max(const gw_http_server_t *s);

#define MAX_REQS 64

typedef struct fixture {
    uv_loop_t loop;
    gw_http_server_t *srv;
    int port;
    bool hold;        /* leave requests to the test instead of echoing */
    size_t big_reply; /* echo answers with this many bytes instead */
    gw_http_req_t *reqs[MAX_REQS];
    int n_reqs;
    int n_aborts, n_drains;
    gw_http_req_t *aborted[MAX_REQS];
    bool done;
    unsigned lenient_seen;
} fixture_t;

typedef struct client {
    int fd;
    pc_buf_t in;
    bool eof;
} client_t;

static fixture_t F;

static void on_abort(gw_http_req_t *r, void *data)
{
    (void)data;
    F.aborted[F.n_aborts++ % MAX_REQS] = r;
}

static void on_drain(gw_http_req_t *r, void *data)
{
    (void)r, (void)data;
    F.n_drains++;
}

/* The echo: "METHOD path?query|body". */
static void echo(gw_http_req_t *r)
{
    pc_buf_t b = PC_BUF_INIT;
    pc_buf_printf(&b, "%s %s?%s|", gw_http_req_method(r), gw_http_req_path(r),
                  gw_http_req_query(r));
    pc_slice_t body = gw_http_req_body(r);
    pc_buf_append(&b, body.base, body.len);
    gw_http_header_t h[] = {{"Content-Type", "text/plain"}, {"X-Test", "1"}};
    int rc = gw_http_respond(r, 200, h, 2, b.base, b.len);
    if (rc != 0)
        fprintf(stderr, "echo respond: %s\n", pc_strerror(rc));
    pc_buf_free(&b);
}

static void on_request(gw_http_req_t *r, void *ud)
{
    (void)ud;
    F.lenient_seen |= gw__http_req_lenient_flags(r);
    gw_http_req_on_abort(r, on_abort);
    gw_http_req_on_drain(r, on_drain);
    /* "X-Api-Key: good" stands for a valid key, as serve.c's key check. */
    const char *key = gw_http_req_header(r, "x-api-key");
    if (key != NULL && strcmp(key, "good") == 0)
        gw_http_req_set_trusted(r);
    if (F.n_reqs < MAX_REQS)
        F.reqs[F.n_reqs] = r;
    F.n_reqs++;
    if (F.big_reply > 0 && strcmp(gw_http_req_path(r), "/hold") == 0)
        return; /* answered by the test */
    if (F.big_reply > 0) {
        char *b = pc_xmalloc(F.big_reply);
        memset(b, 'r', F.big_reply);
        gw_http_respond(r, 200, NULL, 0, b, F.big_reply);
        pc_free(b);
    } else if (!F.hold) {
        echo(r);
    }
}

static void format_error(const char *path, int status, const char *type, const char *message,
                         const char *request_id, pc_buf_t *out, void *ud)
{
    (void)ud;
    pc_buf_printf(out,
                  "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":\"%s\"},"
                  "\"path\":\"%s\",\"status\":%d,\"request_id\":\"%s\"}",
                  type, message, path, status, request_id);
}

static gw_http_params_t test_params(void)
{
    gw_http_params_t p = gw_http_params_default();
    p.port = 0;
    p.on_request = on_request;
    p.linger_ms = 500;
    return p;
}

static int start(const gw_http_params_t *p)
{
    memset(&F, 0, sizeof F);
    uv_loop_init(&F.loop);
    char err[256];
    int rc = gw_http_server_init(&F.loop, p, &F.srv, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "server init: %s\n", err);
        return rc;
    }
    F.port = gw_http_server_port(F.srv);
    return 0;
}

static void on_done(void *ud)
{
    (void)ud;
    F.done = true;
}

static void stop(void)
{
    if (F.srv == NULL)
        return;
    gw_http_server_free(F.srv);
    F.srv = NULL;
    uv_run(&F.loop, UV_RUN_DEFAULT);
    int rc = uv_loop_close(&F.loop);
    if (rc != 0)
        fprintf(stderr, "uv_loop_close: %s\n", uv_strerror(rc));
}

static void client_connect(client_t *c, int rcvbuf)
{
    memset(c, 0, sizeof *c);
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (rcvbuf > 0)
        setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)F.port);
    a.sin_addr.s_addr = htonl(0x7f000001);
    if (connect(c->fd, (struct sockaddr *)&a, sizeof a) != 0)
        perror("connect");
    fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
}

static void client_close(client_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    pc_buf_free(&c->in);
}

/* Reads what is there without blocking. */
static void client_poll(client_t *c)
{
    char buf[65536];
    while (c->fd >= 0 && !c->eof) {
        ssize_t n = read(c->fd, buf, sizeof buf);
        if (n > 0)
            pc_buf_append(&c->in, buf, (size_t)n);
        else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
            c->eof = true;
        else
            break;
    }
}

static client_t *pumped[8];
static int n_pumped;

/* Runs the loop (and reads every registered client) until cond or ms pass. */
#define PUMP_UNTIL(cond, ms)                                                                       \
    do {                                                                                           \
        uint64_t dl_ = pc_time_mono_ms() + (ms);                                                   \
        for (;;) {                                                                                 \
            uv_run(&F.loop, UV_RUN_NOWAIT);                                                        \
            for (int i_ = 0; i_ < n_pumped; i_++)                                                  \
                client_poll(pumped[i_]);                                                           \
            if ((cond) || pc_time_mono_ms() >= dl_)                                                \
                break;                                                                             \
            usleep(200);                                                                           \
        }                                                                                          \
    } while (0)

static void watch(client_t *c)
{
    pumped[n_pumped++] = c;
}

static void unwatch_all(void)
{
    n_pumped = 0;
}

static void client_send(client_t *c, const void *data, size_t len)
{
    const char *p = data;
    uint64_t dl = pc_time_mono_ms() + 5000;
    while (len > 0 && pc_time_mono_ms() < dl) {
        ssize_t n = write(c->fd, p, len);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else {
            uv_run(&F.loop, UV_RUN_NOWAIT);
            usleep(200);
        }
    }
}

static void client_send_str(client_t *c, const char *s)
{
    client_send(c, s, strlen(s));
}

typedef struct response {
    int status;
    char headers[2048];
    pc_buf_t body;
} response_t;

/* Parses one response at the front of c->in (Content-Length, chunked or up to EOF). Returns
 * the bytes it took, 0 when incomplete. */
static size_t parse_response(client_t *c, response_t *r, bool head_only)
{
    const char *b = c->in.base;
    if (b == NULL)
        return 0;
    const char *end = memmem(b, c->in.len, "\r\n\r\n", 4);
    if (end == NULL)
        return 0;
    size_t hlen = (size_t)(end - b) + 4;
    memset(r, 0, sizeof *r);
    if (sscanf(b, "HTTP/1.1 %d", &r->status) != 1)
        return 0;
    snprintf(r->headers, sizeof r->headers, "%.*s", (int)hlen, b);
    if (head_only || r->status == 100 || r->status == 204 || r->status == 304)
        return hlen;
    const char *cl = strcasestr(r->headers, "\r\nContent-Length: ");
    if (cl != NULL) {
        size_t n = strtoul(cl + 18, NULL, 10);
        if (c->in.len < hlen + n)
            return 0;
        pc_buf_append(&r->body, b + hlen, n);
        return hlen + n;
    }
    if (strcasestr(r->headers, "\r\nTransfer-Encoding: chunked") != NULL) {
        size_t at = hlen;
        for (;;) {
            const char *le = memmem(b + at, c->in.len - at, "\r\n", 2);
            if (le == NULL)
                return 0;
            size_t n = strtoul(b + at, NULL, 16);
            size_t data = (size_t)(le - b) + 2;
            if (c->in.len < data + n + 2)
                return 0;
            if (n == 0) {
                pc_buf_terminate(&r->body);
                return data + 2;
            }
            pc_buf_append(&r->body, b + data, n);
            at = data + n + 2;
        }
    }
    if (!c->eof)
        return 0;
    pc_buf_append(&r->body, b + hlen, c->in.len - hlen);
    return c->in.len;
}

static void consume(client_t *c, size_t n)
{
    memmove(c->in.base, c->in.base + n, c->in.len - n);
    c->in.len -= n;
}

/* Waits for one whole response on c and takes it off the input. */
static bool read_response(client_t *c, response_t *r, bool head_only)
{
    size_t n = 0;
    bool w = false;
    for (int i = 0; i < n_pumped; i++)
        w |= pumped[i] == c;
    if (!w)
        watch(c);
    PUMP_UNTIL((n = parse_response(c, r, head_only)) > 0 || (c->eof && c->in.len == 0), 5000);
    if (n == 0)
        return false;
    pc_buf_terminate(&r->body);
    consume(c, n);
    return true;
}

static bool has_header(const response_t *r, const char *line)
{
    return strcasestr(r->headers, line) != NULL;
}

static void response_free(response_t *r)
{
    pc_buf_free(&r->body);
}

#define REQ_GET(path) "GET " path " HTTP/1.1\r\nHost: t\r\n\r\n"

/* ------------------------------------------------------------------------------------------ */

PC_TEST(keepalive_and_accessors)
{
    gw_http_params_t p = test_params();
    ASSERT_EQ(start(&p), 0);
    client_t c;
    client_connect(&c, 0);
    watch(&c);
    client_send_str(&c, "POST /v1/x?a=1&b=2 HTTP/1.1\r\nHost: t\r\nX-Api-Key: k1\r\n"
                        "Content-Length: 5\r\n\r\nhello");
    response_t r;
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_EQ(r.status, 200);
    ASSERT_STR_EQ(r.body.base, "POST /v1/x?a=1&b=2|hello");
    ASSERT_TRUE(has_header(&r, "\r\nContent-Length: 24\r\n"));
    ASSERT_TRUE(has_header(&r, "\r\nX-Test: 1\r\n"));
    ASSERT_TRUE(has_header(&r, "\r\nDate: "));
    ASSERT_FALSE(has_header(&r, "Connection: close"));
    response_free(&r);
    client_send_str(&c, REQ_GET("/second"));
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_STR_EQ(r.body.base, "GET /second?|");
    response_free(&r);
    ASSERT_FALSE(c.eof);
    gw_http_stats_t st;
    gw_http_server_stats(F.srv, &st);
    ASSERT_EQ(st.conns_accepted, 1);
    ASSERT_EQ(st.requests, 2);
    ASSERT_EQ(F.lenient_seen, 0); /* llhttp strict: no lenient flag ever set */
    client_close(&c);
    unwatch_all();
    stop();
}

PC_TEST(headers_case_insensitive_and_hold)
{
    gw_http_params_t p = test_params();
    ASSERT_EQ(start(&p), 0);
    F.hold = true;
    client_t c;
    client_connect(&c, 0);
    watch(&c);
    client_send_str(&c, "GET / HTTP/1.1\r\nHost: t\r\nX-Api-Key:  k1 \r\nEmpty:\r\n"
                        "x-api-key: second\r\n\r\n");
    PUMP_UNTIL(F.n_reqs == 1, 2000);
    ASSERT_EQ(F.n_reqs, 1);
    gw_http_req_t *q = F.reqs[0];
    ASSERT_STR_EQ(gw_http_req_header(q, "x-API-key"), "k1");
    ASSERT_STR_EQ(gw_http_req_header(q, "empty"), "");
    ASSERT_TRUE(gw_http_req_header(q, "missing") == NULL);
    ASSERT_EQ(gw_http_req_header_count(q), 4);
    ASSERT_STR_EQ(gw_http_req_header_at(q, 3).value, "second");
    ASSERT_EQ(gw_http_req_body(q).len, 0);
    ASSERT_TRUE(strncmp(gw_http_req_peer(q), "127.0.0.1:", 10) == 0);
    /* A bad header is refused and changes nothing; then the real answer goes out. */
    gw_http_header_t bad = {"X-Bad", "a\r\nInjected: 1"};
    ASSERT_EQ(gw_http_respond(q, 200, &bad, 1, "x", 1), PC_ERR_INVAL);
    ASSERT_EQ(gw_http_respond(q, 99, NULL, 0, "x", 1), PC_ERR_INVAL);
    ASSERT_EQ(gw_http_respond(q, 404, NULL, 0, "nope", 4), 0);
    response_t r;
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_EQ(r.status, 404);
    ASSERT_TRUE(has_header(&r, "HTTP/1.1 404 Not Found\r\n"));
    ASSERT_FALSE(has_header(&r, "Injected"));
    ASSERT_STR_EQ(r.body.base, "nope");
    response_free(&r);
    client_close(&c);
    unwatch_all();
    stop();
}

PC_TEST(pipelining_out_of_order_held_in_order)
{
    gw_http_params_t p = test_params();
    ASSERT_EQ(start(&p), 0);
    F.hold = true;
    client_t c;
    client_connect(&c, 0);
    watch(&c);
    client_send_str(&c, REQ_GET("/1") REQ_GET("/2") "POST /3 HTTP/1.1\r\nHost: t\r\n"
                                                    "Content-Length: 3\r\n\r\nabc");
    PUMP_UNTIL(F.n_reqs == 3, 2000);
    ASSERT_EQ(F.n_reqs, 3);
    ASSERT_STR_EQ(gw_http_req_path(F.reqs[2]), "/3");
    echo(F.reqs[2]);
    /* The third one streams, the second answers whole: all held behind the first. */
    ASSERT_EQ(gw_http_stream_begin(F.reqs[1], 200, NULL, 0), 0);
    ASSERT_EQ(gw_http_stream_write(F.reqs[1], "two", 3), 0);
    ASSERT_LE(3 + 5, gw_http_stream_queued(F.reqs[1])); /* held: not the head */
    ASSERT_EQ(gw_http_stream_end(F.reqs[1]), 0);
    PUMP_UNTIL(false, 100);
    ASSERT_EQ(c.in.len, 0);
    echo(F.reqs[0]);
    response_t r;
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_STR_EQ(r.body.base, "GET /1?|");
    response_free(&r);
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_STR_EQ(r.body.base, "two");
    ASSERT_TRUE(has_header(&r, "Transfer-Encoding: chunked"));
    response_free(&r);
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_STR_EQ(r.body.base, "POST /3?|abc");
    response_free(&r);
    client_close(&c);
    unwatch_all();
    stop();
}

PC_TEST(pipeline_limit_parses_ahead_in_steps)
{
    gw_http_params_t p = test_params();
    p.max_pipeline = 2;
    ASSERT_EQ(start(&p), 0);
    F.hold = true;
    client_t c;
    client_connect(&c, 0);
    watch(&c);
    client_send_str(&c, REQ_GET("/a") REQ_GET("/b") REQ_GET("/c") REQ_GET("/d") REQ_GET("/e"));
    PUMP_UNTIL(F.n_reqs == 2, 2000);
    PUMP_UNTIL(false, 50);
    ASSERT_EQ(F.n_reqs, 2); /* the rest waits unparsed */
    for (int i = 0; i < 5; i++) {
        PUMP_UNTIL(F.n_reqs > i, 2000);
        ASSERT_TRUE(F.n_reqs > i);
        echo(F.reqs[i]);
    }
    for (int i = 0; i < 5; i++) {
        response_t r;
        ASSERT_TRUE(read_response(&c, &r, false));
        char want[32];
        snprintf(want, sizeof want, "GET /%c?|", 'a' + i);
        ASSERT_STR_EQ(r.body.base, want);
        response_free(&r);
    }
    client_close(&c);
    unwatch_all();
    stop();
}

PC_TEST(chunked_request_body)
{
    gw_http_params_t p = test_params();
    ASSERT_EQ(start(&p), 0);
    client_t c;
    client_connect(&c, 0);
    client_send_str(&c, "POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                        "5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nTrailer: x\r\n\r\n");
    response_t r;
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_EQ(r.status, 200);
    ASSERT_STR_EQ(r.body.base, "POST /c?|hello, world");
    response_free(&r);
    /* The connection goes on after a chunked body. */
    client_send_str(&c, REQ_GET("/next"));
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_STR_EQ(r.body.base, "GET /next?|");
    response_free(&r);
    client_close(&c);
    unwatch_all();
    stop();
}

PC_TEST(expect_100_continue)
{
    gw_http_params_t p = test_params();
    p.max_body_bytes = 100;
    ASSERT_EQ(start(&p), 0);
    client_t c;
    client_connect(&c, 0);
    client_send_str(&c, "POST /e HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
                        "Content-Length: 4\r\n\r\n");
    response_t r;
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_EQ(r.status, 100);
    ASSERT_STR_EQ(r.headers, "HTTP/1.1 100 Continue\r\n\r\n");
    response_free(&r);
    client_send_str(&c, "body");
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_EQ(r.status, 200);
    ASSERT_STR_EQ(r.body.base, "POST /e?|body");
    response_free(&r);
    /* Over the limit: 413 at once, no 100, and the connection closes. */
    client_send_str(&c, "POST /e HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
                        "Content-Length: 101\r\n\r\n");
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_EQ(r.status, 413);
    ASSERT_TRUE(has_header(&r, "Connection: close"));
    ASSERT_TRUE(strstr(r.body.base, "\"request_too_large\"") != NULL);
    response_free(&r);
    PUMP_UNTIL(c.eof, 2000);
    ASSERT_TRUE(c.eof);
    client_close(&c);
    unwatch_all();
    stop();
}

/* Sends raw bytes on a new connection; expects one response with status, Connection: close
 * and the connection closed after it. */
static void expect_error(const char *raw, size_t len, int status, const char *type)
{
    client_t c;
    client_connect(&c, 0);
    client_send(&c, raw, len);
    response_t r;
    ASSERT_TRUE(read_response(&c, &r, false));
    if (r.status != status)
        fprintf(stderr, "  for %.*s\n", (int)(len < 80 ? len : 80), raw);
    ASSERT_EQ(r.status, status);
    ASSERT_TRUE(has_header(&r, "\r\nConnection: close\r\n"));
    ASSERT_TRUE(has_header(&r, "\r\nContent-Type: application/json\r\n"));
    char want[64];
    snprintf(want, sizeof want, "\"type\":\"%s\"", type);
    if (strstr(r.body.base, want) == NULL)
        fprintf(stderr, "  body: %s\n", r.body.base);
    ASSERT_TRUE(strstr(r.body.base, want) != NULL);
    response_free(&r);
    PUMP_UNTIL(c.eof, 2000);
    ASSERT_TRUE(c.eof);
    client_close(&c);
    unwatch_all();
}

#define EXPECT_ERROR(raw, status, type)                                                            \
    PC_TEST_CALL(expect_error(raw, sizeof raw - 1, status, type))

PC_TEST(smuggling_and_bad_requests_400)
{
    gw_http_params_t p = test_params();
    ASSERT_EQ(start(&p), 0);
    EXPECT_ERROR("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: "
                 "chunked\r\n\r\n0\r\n\r\n",
                 400, "invalid_request_error");
    EXPECT_ERROR("POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nContent-Length: "
                 "5\r\n\r\n0\r\n\r\n",
                 400, "invalid_request_error");
    EXPECT_ERROR("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"
                 "hello!",
                 400, "invalid_request_error");
    EXPECT_ERROR("POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n", 400,
                 "invalid_request_error");
    EXPECT_ERROR("POST / HTTP/1.1\r\nHost: t\r\ntRANSFER-ENCODING: chunked, identity\r\n\r\n"
                 "0\r\n\r\n",
                 400, "invalid_request_error");
    EXPECT_ERROR("GET / HTTP/1.1\rHost: t\r\n\r\n", 400, "invalid_request_error");
    EXPECT_ERROR("GET / HTTP/1.1\r\nHost: t\r\nX: a\rb\r\n\r\n", 400, "invalid_request_error");
    EXPECT_ERROR("\x00\x01\x02garbage\r\n\r\n", 400, "invalid_request_error");
    EXPECT_ERROR("GET / HTTP/1.1\r\nHo\x01st: t\r\n\r\n", 400, "invalid_request_error");
    EXPECT_ERROR("GET / HTTP/9.1\r\nHost: t\r\n\r\n", 400, "invalid_request_error");
    EXPECT_ERROR("GET nopath HTTP/1.1\r\nHost: t\r\n\r\n", 400, "invalid_request_error");
    EXPECT_ERROR("POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400,
                 "invalid_request_error");
    EXPECT_ERROR("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400, "invalid_request_error");
    gw_http_stats_t st;
    gw_http_server_stats(F.srv, &st);
    ASSERT_EQ(st.requests, 0); /* none reached the handler */
    ASSERT_EQ(st.errors_4xx, 13);
    stop();
}

PC_TEST(header_limits_431)
{
    gw_http_params_t p = test_params();
    p.max_header_bytes = 4096;
    p.max_headers = 10;
    ASSERT_EQ(start(&p), 0);
    pc_buf_t b = PC_BUF_INIT;
    pc_buf_append_cstr(&b, "GET /big HTTP/1.1\r\nHost: t\r\nX-Big: ");
    for (int i = 0; i < 5000; i++)
        pc_buf_append(&b, "a", 1);
    pc_buf_append_cstr(&b, "\r\n\r\n");
    PC_TEST_CALL(expect_error(b.base, b.len, 431, "invalid_request_error"));
    b.len = 0;
    pc_buf_append_cstr(&b, "GET /many HTTP/1.1\r\n");
    for (int i = 0; i < 11; i++)
        pc_buf_printf(&b, "X-H%d: v\r\n", i);
    pc_buf_append_cstr(&b, "\r\n");
    PC_TEST_CALL(expect_error(b.base, b.len, 431, "invalid_request_error"));
    /* A long URL counts too. */
    b.len = 0;
    pc_buf_append_cstr(&b, "GET /");
    for (int i = 0; i < 5000; i++)
        pc_buf_append(&b, "u", 1);
    pc_buf_append_cstr(&b, " HTTP/1.1\r\nHost: t\r\n\r\n");
    PC_TEST_CALL(expect_error(b.base, b.len, 431, "invalid_request_error"));
    /* Exactly at the count limit is fine. */
    b.len = 0;
    pc_buf_append_cstr(&b, "GET /ten HTTP/1.1\r\n");
    for (int i = 0; i < 10; i++)
        pc_buf_printf(&b, "X-H%d: v\r\n", i);
    pc_buf_append_cstr(&b, "\r\n");
    client_t c;
    client_connect(&c, 0);
    client_send(&c, b.base, b.len);
    response_t r;
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_EQ(r.status, 200);
    response_free(&r);
    client_close(&c);
    unwatch_all();
    pc_buf_free(&b);
    stop();
}

PC_TEST(body_limit_413_content_length_and_chunked)
{
    gw_http_params_t p = test_params();
    p.max_body_bytes = 1000;
    ASSERT_EQ(start(&p), 0);
    EXPECT_ERROR("POST /v1/messages HTTP/1.1\r\nHost: t\r\nContent-Length: 1001\r\n\r\n", 413,
                 "request_too_large");
    pc_buf_t b = PC_BUF_INIT;
    pc_buf_append_cstr(&b, "POST /v1/messages HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: "
                           "chunked\r\n\r\n");
    for (int i = 0; i < 3; i++) {
        pc_buf_append_cstr(&b, "190\r\n");
        for (int j = 0; j < 400; j++)
            pc_buf_append(&b, "x", 1);
        pc_buf_append_cstr(&b, "\r\n");
    }
    pc_buf_append_cstr(&b, "0\r\n\r\n");
    PC_TEST_CALL(expect_error(b.base, b.len, 413, "request_too_large"));
    pc_buf_free(&b);
    /* Exactly the limit passes. */
    client_t c;
    client_connect(&c, 0);
    pc_buf_t ok = PC_BUF_INIT;
    pc_buf_append_cstr(&ok, "POST /ok HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n");
    for (int j = 0; j < 1000; j++)
        pc_buf_append(&ok, "y", 1);
    client_send(&c, ok.base, ok.len);
    response_t r;
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_EQ(r.status, 200);
    ASSERT_EQ(r.body.len, strlen("POST /ok?|") + 1000);
    response_free(&r);
    pc_buf_free(&ok);
    client_close(&c);
    unwatch_all();
    stop();
}

PC_TEST(format_error_hook_shapes_errors)
{
    gw_http_params_t p = test_params();
    p.max_body_bytes = 10;
    p.format_error = format_error;
    ASSERT_EQ(start(&p), 0);
    client_t c;
    client_connect(&c, 0);
    client_send_str(&c, "POST /v1/messages HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\n");
    response_t r;
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_EQ(r.status, 413);
    /* The request id the hook got is the one in the request-id header: "req_" + 24 hex. */
    const char *hid = strcasestr(r.headers, "\r\nrequest-id: ");
    ASSERT_TRUE(hid != NULL);
    char id[64];
    ASSERT_EQ(sscanf(hid + 14, "%63[^\r]", id), 1);
    ASSERT_EQ(strlen(id), 28);
    ASSERT_EQ(strspn(id + 4, "0123456789abcdef"), 24);
    ASSERT_TRUE(strncmp(id, "req_", 4) == 0);
    char xid[96];
    snprintf(xid, sizeof xid, "\r\nx-request-id: %s\r\n", id);
    ASSERT_TRUE(has_header(&r, xid));
    pc_buf_t want = PC_BUF_INIT;
    pc_buf_printf(&want,
                  "{\"type\":\"error\",\"error\":{\"type\":\"request_too_large\",\"message\":"
                  "\"request body of 11 bytes is larger than the limit of 10 bytes\"},"
                  "\"path\":\"/v1/messages\",\"status\":413,\"request_id\":\"%s\"}",
                  id);
    ASSERT_EQ(pc_buf_terminate(&want), 0);
    ASSERT_STR_EQ(r.body.base, want.base);
    pc_buf_free(&want);
    response_free(&r);
    client_close(&c);
    /* Without the hook: the default body carries it too, and each error has its own id. */
    unwatch_all();
    stop();
    p.format_error = NULL;
    ASSERT_EQ(start(&p), 0);
    client_connect(&c, 0);
    client_send_str(&c, "GET / HTTP/1.1\r\nHost: t\r\nX: a\rb\r\n\r\n");
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_EQ(r.status, 400);
    ASSERT_TRUE(strstr(r.body.base, "\"request_id\":\"req_") != NULL);
    ASSERT_TRUE(strstr(r.body.base, id) == NULL);
    hid = strcasestr(r.headers, "\r\nrequest-id: ");
    ASSERT_TRUE(hid != NULL);
    ASSERT_EQ(sscanf(hid + 14, "%63[^\r]", id), 1);
    ASSERT_TRUE(strstr(r.body.base, id) != NULL);
    response_free(&r);
    client_close(&c);
    unwatch_all();
    stop();
}

PC_TEST(slow_client_408)
{
    gw_http_params_t p = test_params();
    p.header_timeout_ms = 150;
    p.body_timeout_ms = 150;
    ASSERT_EQ(start(&p), 0);
    client_t c;
    client_connect(&c, 0);
    watch(&c);
    /* Headers trickle in, one byte per 40 ms or more: the header timeout is total, not per
     * read. Every byte arrives well within 150 ms of the one before, so a per-read timeout would
     * never fire while they come; the 408 must come before the last one is sent (the 35 bytes
     * take at least 1.4 s, whatever the machine's load). */
    const char *slow = "GET /slow HTTP/1.1\r\nHost: t\r\nX-A: b";
    size_t n_sent = 0;
    for (const char *s = slow; *s && !c.eof && c.in.len == 0; s++) {
        client_send(&c, s, 1);
        n_sent++;
        PUMP_UNTIL(c.in.len > 0, 40);
    }
    response_t r;
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_EQ(r.status, 408);
    ASSERT_TRUE(has_header(&r, "Connection: close"));
    ASSERT_TRUE(strstr(r.body.base, "timeout_error") != NULL);
    ASSERT_TRUE(n_sent < strlen(slow));
    response_free(&r);
    PUMP_UNTIL(c.eof, 2000);
    ASSERT_TRUE(c.eof);
    client_close(&c);
    unwatch_all();
    /* A body that stops: 408 after body_timeout_ms of silence. */
    client_connect(&c, 0);
    client_send_str(&c, "POST /b HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc");
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_EQ(r.status, 408);
    response_free(&r);
    client_close(&c);
    unwatch_all();
    gw_http_stats_t st;
    gw_http_server_stats(F.srv, &st);
    ASSERT_EQ(st.timeouts, 2);
    ASSERT_EQ(st.requests, 0);
    stop();
}

PC_TEST(idle_keepalive_close)
{
    gw_http_params_t p = test_params();
    p.idle_timeout_ms = 150;
    ASSERT_EQ(start(&p), 0);
    client_t c;
    client_connect(&c, 0);
    client_send_str(&c, REQ_GET("/"));
    response_t r;
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_EQ(r.status, 200);
    response_free(&r);
    PUMP_UNTIL(c.eof, 3000);
    ASSERT_TRUE(c.eof);
    ASSERT_EQ(c.in.len, 0); /* closed without a response */
    client_close(&c);
    unwatch_all();
    gw_http_stats_t st;
    PUMP_UNTIL((gw_http_server_stats(F.srv, &st), st.conns_open == 0), 1000);
    ASSERT_EQ(st.conns_open, 0);
    /* The idle timer closed it (a timeout, not a close after the response): no clock read. */
    ASSERT_EQ(st.timeouts, 1);
    ASSERT_EQ(st.requests, 1);
    stop();
}

PC_TEST(max_connections_503)
{
    gw_http_params_t p = test_params();
    p.max_connections = 2;
    ASSERT_EQ(start(&p), 0);
    client_t a, b, c;
    client_connect(&a, 0);
    client_connect(&b, 0);
    watch(&a);
    watch(&b);
    gw_http_stats_t st;
    PUMP_UNTIL((gw_http_server_stats(F.srv, &st), st.conns_open == 2), 2000);
    ASSERT_EQ(st.conns_open, 2);
    client_connect(&c, 0);
    response_t r;
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_EQ(r.status, 503);
    ASSERT_TRUE(strstr(r.body.base, "overloaded_error") != NULL);
    ASSERT_TRUE(has_header(&r, "Connection: close"));
    response_free(&r);
    PUMP_UNTIL(c.eof, 2000);
    ASSERT_TRUE(c.eof);
    /* The two admitted ones are served. */
    client_send_str(&a, REQ_GET("/a"));
    client_send_str(&b, REQ_GET("/b"));
    ASSERT_TRUE(read_response(&a, &r, false));
    ASSERT_EQ(r.status, 200);
    response_free(&r);
    ASSERT_TRUE(read_response(&b, &r, false));
    ASSERT_EQ(r.status, 200);
    response_free(&r);
    gw_http_server_stats(F.srv, &st);
    ASSERT_EQ(st.conns_refused, 1);
    /* A slot frees when one closes. */
    client_close(&a);
    unwatch_all();
    PUMP_UNTIL((gw_http_server_stats(F.srv, &st), st.conns_open == 1), 2000);
    client_t d;
    client_connect(&d, 0);
    client_send_str(&d, REQ_GET("/d"));
    ASSERT_TRUE(read_response(&d, &r, false));
    ASSERT_EQ(r.status, 200);
    response_free(&r);
    client_close(&b);
    client_close(&c);
    client_close(&d);
    unwatch_all();
    stop();
}

PC_TEST(client_abort_mid_stream)
{
    gw_http_params_t p = test_params();
    ASSERT_EQ(start(&p), 0);
    F.hold = true;
    client_t c;
    client_connect(&c, 0);
    watch(&c);
    client_send_str(&c, REQ_GET("/stream"));
    PUMP_UNTIL(F.n_reqs == 1, 2000);
    ASSERT_EQ(F.n_reqs, 1);
    gw_http_req_t *q = F.reqs[0];
    gw_http_header_t h = {"Content-Type", "text/event-stream"};
    ASSERT_EQ(gw_http_stream_begin(q, 200, &h, 1), 0);
    ASSERT_EQ(gw_http_stream_write(q, "data: 1\n\n", 9), 0);
    PUMP_UNTIL(strstr(c.in.base ? c.in.base : "", "data: 1") != NULL, 2000);
    ASSERT_EQ(F.n_aborts, 0);
    client_close(&c);
    unwatch_all();
    PUMP_UNTIL(F.n_aborts == 1, 2000);
    ASSERT_EQ(F.n_aborts, 1);
    ASSERT_TRUE(F.aborted[0] == q);
    gw_http_stats_t st;
    gw_http_server_stats(F.srv, &st);
    ASSERT_EQ(st.requests_aborted, 1);
    ASSERT_EQ(st.conns_open, 0);
    stop();
}

PC_TEST(backpressure_queued_and_drain)
{
    gw_http_params_t p = test_params();
    p.stream_high_water = 64 << 10;
    ASSERT_EQ(start(&p), 0);
    F.hold = true;
    client_t c;
    client_connect(&c, 4096);
    client_send_str(&c, REQ_GET("/big"));
    PUMP_UNTIL(F.n_reqs == 1, 2000);
    ASSERT_EQ(F.n_reqs, 1);
    gw_http_req_t *q = F.reqs[0];
    ASSERT_EQ(gw_http_stream_begin(q, 200, NULL, 0), 0);
    static char chunk[8192];
    memset(chunk, 'z', sizeof chunk);
    size_t written = 0;
    /* The client reads nothing: the kernel buffers fill, then the server's queue grows. */
    while (gw_http_stream_queued(q) < p.stream_high_water && written < (64u << 20)) {
        ASSERT_EQ(gw_http_stream_write(q, chunk, sizeof chunk), 0);
        written += sizeof chunk;
        uv_run(&F.loop, UV_RUN_NOWAIT);
    }
    ASSERT_LE(p.stream_high_water, gw_http_stream_queued(q));
    ASSERT_LE(gw_http_stream_queued(q), p.stream_high_water + sizeof chunk + 16);
    PUMP_UNTIL(false, 50);
    ASSERT_EQ(F.n_drains, 0);
    /* The reader catches up: on_drain fires once the queue is below half the high water. */
    watch(&c);
    PUMP_UNTIL(F.n_drains > 0, 5000);
    ASSERT_EQ(F.n_drains, 1);
    ASSERT_LE(gw_http_stream_queued(q), p.stream_high_water / 2);
    /* What the handler held back goes out in one write, even past 4 × the high water. */
    size_t big_len = 5 * p.stream_high_water;
    char *big = pc_xmalloc(big_len);
    memset(big, 'w', big_len);
    ASSERT_EQ(gw_http_stream_write(q, big, big_len), 0);
    written += big_len;
    pc_free(big);
    ASSERT_EQ(gw_http_stream_end(q), 0);
    response_t r;
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_EQ(r.status, 200);
    ASSERT_EQ(r.body.len, written);
    response_free(&r);
    client_close(&c);
    unwatch_all();
    stop();
}

PC_TEST(backpressure_hard_limit_closes)
{
    gw_http_params_t p = test_params();
    p.stream_high_water = 16 << 10;
    ASSERT_EQ(start(&p), 0);
    F.hold = true;
    client_t c;
    client_connect(&c, 4096);
    client_send_str(&c, REQ_GET("/big"));
    PUMP_UNTIL(F.n_reqs == 1, 2000);
    gw_http_req_t *q = F.reqs[0];
    ASSERT_EQ(gw_http_stream_begin(q, 200, NULL, 0), 0);
    static char chunk[4096];
    int rc = 0;
    for (int i = 0; i < 100000 && rc == 0; i++) {
        rc = gw_http_stream_write(q, chunk, sizeof chunk);
        if (rc == 0)
            uv_run(&F.loop, UV_RUN_NOWAIT);
    }
    ASSERT_EQ(rc, PC_ERR_OVERLOADED);
    ASSERT_EQ(F.n_aborts, 0); /* never from inside the call */
    ASSERT_EQ(gw_http_stream_write(q, chunk, 1), PC_ERR_CLOSED);
    PUMP_UNTIL(F.n_aborts == 1, 2000);
    ASSERT_EQ(F.n_aborts, 1);
    client_close(&c);
    stop();
}

static void respond_on_timer(uv_timer_t *t)
{
    gw_http_req_t *q = t->data;
    gw_http_respond(q, 200, NULL, 0, "late", 4);
}

PC_TEST(graceful_shutdown_finishes_in_flight)
{
    gw_http_params_t p = test_params();
    ASSERT_EQ(start(&p), 0);
    F.hold = true;
    client_t busy, idle, partial;
    client_connect(&busy, 0);
    client_connect(&idle, 0);
    client_connect(&partial, 0);
    watch(&busy);
    watch(&idle);
    watch(&partial);
    client_send_str(&busy, REQ_GET("/slow"));
    client_send_str(&partial, "GET /part HTTP/1.1\r\nHo");
    gw_http_stats_t st;
    PUMP_UNTIL(F.n_reqs == 1 && (gw_http_server_stats(F.srv, &st), st.conns_open == 3), 2000);
    ASSERT_EQ(F.n_reqs, 1);
    uv_timer_t t;
    uv_timer_init(&F.loop, &t);
    t.data = F.reqs[0];
    uv_timer_start(&t, respond_on_timer, 100, 0);
    gw_http_server_shutdown(F.srv, 2000, on_done, NULL);
    PUMP_UNTIL(idle.eof && partial.eof, 1000);
    ASSERT_TRUE(idle.eof);
    ASSERT_TRUE(partial.eof);
    ASSERT_FALSE(busy.eof);
    ASSERT_FALSE(F.done);
    /* New connections are refused. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)F.port)};
    a.sin_addr.s_addr = htonl(0x7f000001);
    PUMP_UNTIL(false, 20);
    ASSERT_NE(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    close(fd);
    response_t r;
    ASSERT_TRUE(read_response(&busy, &r, false));
    ASSERT_EQ(r.status, 200);
    ASSERT_STR_EQ(r.body.base, "late");
    ASSERT_TRUE(has_header(&r, "Connection: close"));
    response_free(&r);
    PUMP_UNTIL(busy.eof, 2000);
    ASSERT_TRUE(busy.eof);
    client_close(&busy);
    client_close(&idle);
    client_close(&partial);
    unwatch_all();
    PUMP_UNTIL(F.done, 2000);
    ASSERT_TRUE(F.done);
    ASSERT_EQ(F.n_aborts, 0);
    uv_close((uv_handle_t *)&t, NULL);
    stop();
}

PC_TEST(shutdown_deadline_aborts)
{
    gw_http_params_t p = test_params();
    ASSERT_EQ(start(&p), 0);
    F.hold = true;
    client_t c;
    client_connect(&c, 0);
    watch(&c);
    client_send_str(&c, REQ_GET("/never"));
    PUMP_UNTIL(F.n_reqs == 1, 2000);
    gw_http_server_shutdown(F.srv, 100, on_done, NULL);
    PUMP_UNTIL(F.done, 2000);
    ASSERT_TRUE(F.done);
    ASSERT_EQ(F.n_aborts, 1);
    PUMP_UNTIL(c.eof, 1000);
    ASSERT_TRUE(c.eof);
    ASSERT_EQ(c.in.len, 0);
    client_close(&c);
    unwatch_all();
    stop();
}

PC_TEST(http10_head_and_connection_close)
{
    gw_http_params_t p = test_params();
    ASSERT_EQ(start(&p), 0);
    client_t c;
    client_connect(&c, 0);
    client_send_str(&c, "GET /old HTTP/1.0\r\n\r\n");
    response_t r;
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_EQ(r.status, 200);
    ASSERT_TRUE(has_header(&r, "Connection: close"));
    ASSERT_STR_EQ(r.body.base, "GET /old?|");
    response_free(&r);
    PUMP_UNTIL(c.eof, 2000);
    ASSERT_TRUE(c.eof);
    client_close(&c);
    unwatch_all();
    /* Connection: close on 1.1: the answer, then the close; later bytes are ignored. */
    client_connect(&c, 0);
    client_send_str(&c, "GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n" REQ_GET("/y"));
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_STR_EQ(r.body.base, "GET /x?|");
    ASSERT_TRUE(has_header(&r, "Connection: close"));
    response_free(&r);
    PUMP_UNTIL(c.eof, 2000);
    ASSERT_TRUE(c.eof);
    ASSERT_EQ(c.in.len, 0);
    client_close(&c);
    unwatch_all();
    /* HEAD: the headers (with the length) and no body. */
    client_connect(&c, 0);
    client_send_str(&c, "HEAD /h HTTP/1.1\r\nHost: t\r\n\r\n" REQ_GET("/after"));
    ASSERT_TRUE(read_response(&c, &r, true));
    ASSERT_TRUE(has_header(&r, "Content-Length: 9\r\n"));
    response_free(&r);
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_STR_EQ(r.body.base, "GET /after?|");
    response_free(&r);
    client_close(&c);
    unwatch_all();
    /* HTTP/1.0 stream: close-delimited, no chunked framing. */
    F.hold = true;
    client_connect(&c, 0);
    watch(&c);
    client_send_str(&c, "GET /s HTTP/1.0\r\n\r\n");
    PUMP_UNTIL(F.n_reqs == 5, 2000);
    ASSERT_EQ(F.n_reqs, 5); /* /old, /x, /h, /after, /s: /y after Connection: close never */
    gw_http_req_t *q = F.reqs[4];
    ASSERT_EQ(gw_http_req_version_minor(q), 0);
    ASSERT_EQ(gw_http_stream_begin(q, 200, NULL, 0), 0);
    ASSERT_EQ(gw_http_stream_write(q, "ab", 2), 0);
    ASSERT_EQ(gw_http_stream_write(q, "cd", 2), 0);
    ASSERT_EQ(gw_http_stream_end(q), 0);
    PUMP_UNTIL(c.eof, 2000);
    ASSERT_TRUE(c.eof);
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_FALSE(has_header(&r, "chunked"));
    ASSERT_STR_EQ(r.body.base, "abcd");
    response_free(&r);
    client_close(&c);
    unwatch_all();
    stop();
}

/* Item 2 of issue 19: pipelined requests whose answers are never read. The server stops
 * parsing (and reading) while the connection's unsent output is at or above stream_high_water,
 * so what it holds stays under that plus one response, instead of every answer. */
PC_TEST(pipelined_unread_output_bounded)
{
    gw_http_params_t p = test_params();
    p.stream_high_water = 16 << 10;
    p.max_pipeline = 1000; /* the pipeline cap alone would not bound this */
    ASSERT_EQ(start(&p), 0);
    F.big_reply = 4096;
    client_t c;
    client_connect(&c, 4096);
    enum { N = 3000 };
    pc_buf_t b = PC_BUF_INIT;
    for (int i = 0; i < N; i++)
        pc_buf_append_cstr(&b, REQ_GET("/dashboard"));
    client_send(&c, b.base, b.len); /* about 100 KB in: the socket buffers take it */
    pc_buf_free(&b);
    size_t worst = 0;
    uint64_t dl = pc_time_mono_ms() + 500;
    while (pc_time_mono_ms() < dl) {
        uv_run(&F.loop, UV_RUN_NOWAIT);
        size_t u = gw__http_server_unsent_max(F.srv);
        worst = u > worst ? u : worst;
        usleep(200);
    }
    size_t bound = p.stream_high_water + F.big_reply + 256;
    fprintf(stderr,
            "  %d requests answered while the client read nothing; most unsent %zu bytes "
            "(bound %zu)\n",
            F.n_reqs, worst, bound);
    ASSERT_LE(worst, bound);
    ASSERT_TRUE(F.n_reqs < N); /* reading stopped */
    gw_http_stats_t st;
    gw_http_server_stats(F.srv, &st);
    ASSERT_LE(1, st.output_pauses);
    /* The client reads: every answer arrives, in order, and the rest gets parsed. */
    watch(&c);
    int got = 0;
    response_t r;
    while (got < N && read_response(&c, &r, false)) {
        if (r.status != 200 || r.body.len != F.big_reply)
            break;
        response_free(&r);
        got++;
    }
    ASSERT_EQ(got, N);
    ASSERT_EQ(F.n_reqs, N);
    client_close(&c);
    unwatch_all();
    stop();
}

/* The output bound counts answers held behind an unanswered head; once the head is answered
 * and everything went out at once (no write callback to wait for), parsing resumes. */
PC_TEST(held_answers_pause_then_resume)
{
    gw_http_params_t p = test_params();
    p.stream_high_water = 16 << 10;
    p.max_pipeline = 100;
    ASSERT_EQ(start(&p), 0);
    F.big_reply = 4096;
    client_t c;
    client_connect(&c, 0);
    watch(&c);
    enum { N = 21 };
    pc_buf_t b = PC_BUF_INIT;
    pc_buf_append_cstr(&b, REQ_GET("/hold"));
    for (int i = 1; i < N; i++)
        pc_buf_append_cstr(&b, REQ_GET("/x"));
    client_send(&c, b.base, b.len);
    pc_buf_free(&b);
    PUMP_UNTIL(false, 100);
    ASSERT_TRUE(F.n_reqs < N); /* paused: the answers behind /hold reached the bound */
    ASSERT_EQ(c.in.len, 0);
    ASSERT_EQ(gw_http_respond(F.reqs[0], 200, NULL, 0, "held", 4), 0);
    int got = 0;
    response_t r;
    while (got < N && read_response(&c, &r, false)) {
        response_free(&r);
        got++;
    }
    ASSERT_EQ(got, N);
    ASSERT_EQ(F.n_reqs, N);
    client_close(&c);
    unwatch_all();
    stop();
}

/* Item 5: a body that keeps coming, one byte at a time below body_min_rate, is cut at its
 * deadline (408) while the bytes still arrive; one at the rate completes. */
PC_TEST(body_trickle_below_min_rate_408)
{
    gw_http_params_t p = test_params();
    p.body_timeout_ms = 200;
    p.body_min_rate = 100; /* bytes per second after the 200 ms grace */
    ASSERT_EQ(start(&p), 0);
    client_t c;
    client_connect(&c, 0);
    watch(&c);
    client_send_str(&c, "POST /b HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n");
    int sent = 0;
    for (; sent < 150 && c.in.len == 0 && !c.eof; sent++) { /* 50 bytes/s: below the rate */
        client_send(&c, "x", 1);
        PUMP_UNTIL(c.in.len > 0, 20);
    }
    fprintf(stderr, "  answered after %d body bytes\n", sent);
    ASSERT_TRUE(c.in.len > 0); /* the answer came while bytes were still arriving */
    ASSERT_TRUE(sent < 150);
    response_t r;
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_EQ(r.status, 408);
    ASSERT_TRUE(strstr(r.body.base, "request body not received in time") != NULL);
    response_free(&r);
    client_close(&c);
    unwatch_all();
    /* 10 bytes per 50 ms (200 bytes/s) for 600 bytes: longer than the grace, served. */
    client_connect(&c, 0);
    client_send_str(&c, "POST /ok HTTP/1.1\r\nHost: t\r\nContent-Length: 600\r\n\r\n");
    for (int i = 0; i < 60; i++) {
        client_send(&c, "0123456789", 10);
        PUMP_UNTIL(false, 50);
    }
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_EQ(r.status, 200);
    ASSERT_EQ(r.body.len, strlen("POST /ok?|") + 600);
    response_free(&r);
    client_close(&c);
    unwatch_all();
    stop();
}

/* Item 5: untrusted connections per client address; a trusted one no longer counts. */
PC_TEST(per_peer_limit_untrusted)
{
    gw_http_params_t p = test_params();
    p.max_connections_per_peer = 2;
    ASSERT_EQ(start(&p), 0);
    client_t a, b, c, d;
    client_connect(&a, 0);
    client_connect(&b, 0);
    gw_http_stats_t st;
    PUMP_UNTIL((gw_http_server_stats(F.srv, &st), st.conns_open == 2), 2000);
    ASSERT_EQ(st.conns_untrusted, 2);
    client_connect(&c, 0);
    response_t r;
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_EQ(r.status, 503);
    ASSERT_TRUE(strstr(r.body.base, "too many connections from your address") != NULL);
    ASSERT_TRUE(has_header(&r, "\r\nrequest-id: req_"));
    response_free(&r);
    PUMP_UNTIL(c.eof, 2000);
    ASSERT_TRUE(c.eof);
    gw_http_server_stats(F.srv, &st);
    ASSERT_EQ(st.conns_refused_peer, 1);
    /* a presents a key: trusted, it leaves the peer's count and a new connection fits. */
    client_send_str(&a, "GET /k HTTP/1.1\r\nHost: t\r\nX-Api-Key: good\r\n\r\n");
    ASSERT_TRUE(read_response(&a, &r, false));
    ASSERT_EQ(r.status, 200);
    response_free(&r);
    gw_http_server_stats(F.srv, &st);
    ASSERT_EQ(st.conns_untrusted, 1);
    client_connect(&d, 0);
    client_send_str(&d, REQ_GET("/d"));
    ASSERT_TRUE(read_response(&d, &r, false));
    ASSERT_EQ(r.status, 200);
    response_free(&r);
    client_close(&a);
    client_close(&b);
    client_close(&c);
    client_close(&d);
    unwatch_all();
    PUMP_UNTIL((gw_http_server_stats(F.srv, &st), st.conns_open == 0), 2000);
    ASSERT_EQ(st.conns_untrusted, 0);
    stop();
}

/* Item 5: keyless sockets fill every slot they may; a client with a key still gets in (and
 * keeps its connection), a keyless health check is answered and closed. */
PC_TEST(keyless_flood_leaves_room_for_trusted)
{
    gw_http_params_t p = test_params();
    p.max_connections = 8;
    p.reserved_connections = 2;
    ASSERT_EQ(start(&p), 0);
    enum { NF = 8 };
    client_t flood[NF];
    gw_http_stats_t st;
    for (int i = 0; i < NF; i++) {
        client_connect(&flood[i], 0);
        client_send_str(&flood[i], "GET /slow HTTP/1.1\r\nHo"); /* and never more */
        PUMP_UNTIL((gw_http_server_stats(F.srv, &st), st.conns_open == (uint32_t)i + 1), 2000);
    }
    ASSERT_EQ(st.conns_open, NF);
    ASSERT_EQ(st.conns_untrusted, NF);
    client_t k;
    client_connect(&k, 0);
    client_send_str(&k, "GET /v1/models HTTP/1.1\r\nHost: t\r\nX-Api-Key: good\r\n\r\n");
    response_t r;
    ASSERT_TRUE(read_response(&k, &r, false));
    ASSERT_EQ(r.status, 200);
    ASSERT_FALSE(has_header(&r, "Connection: close")); /* trusted: it keeps its slot */
    response_free(&r);
    client_send_str(&k, "GET /again HTTP/1.1\r\nHost: t\r\n\r\n");
    ASSERT_TRUE(read_response(&k, &r, false));
    ASSERT_EQ(r.status, 200);
    response_free(&r);
    client_t h;
    client_connect(&h, 0);
    client_send_str(&h, REQ_GET("/healthz"));
    ASSERT_TRUE(read_response(&h, &r, false));
    ASSERT_EQ(r.status, 200);
    ASSERT_TRUE(has_header(&r, "Connection: close")); /* probation: one request */
    response_free(&r);
    PUMP_UNTIL(h.eof, 2000);
    ASSERT_TRUE(h.eof);
    gw_http_server_stats(F.srv, &st);
    ASSERT_EQ(st.conns_evicted, 2); /* the two flood sockets that were on probation */
    ASSERT_EQ(st.conns_refused, 0);
    /* The untrusted share (max_connections - reserved_connections) was not touched. */
    int open = 0;
    for (int i = 0; i < NF; i++) {
        client_poll(&flood[i]);
        open += !flood[i].eof;
    }
    ASSERT_EQ(open, NF - 2);
    for (int i = 0; i < NF; i++)
        client_close(&flood[i]);
    client_close(&k);
    client_close(&h);
    unwatch_all();
    stop();
}

/* Item 12: obs-fold (a header line starting with SP or HTAB) is refused, RFC 9112 §5.2. */
PC_TEST(obs_fold_400)
{
    gw_http_params_t p = test_params();
    ASSERT_EQ(start(&p), 0);
    EXPECT_ERROR("GET / HTTP/1.1\r\nHost: t\r\nX-A: one\r\n two\r\n\r\n", 400,
                 "invalid_request_error");
    EXPECT_ERROR("GET / HTTP/1.1\r\nHost: t\r\nX-A:\r\n two\r\n\r\n", 400, "invalid_request_error");
    EXPECT_ERROR("GET / HTTP/1.1\r\nHost: t\r\nX-A: \r\n\ttwo\r\n\r\n", 400,
                 "invalid_request_error");
    EXPECT_ERROR("POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "0\r\nT: a\r\n b\r\n\r\n",
                 400, "invalid_request_error"); /* in a trailer too */
    /* The fold split from its line across reads. */
    client_t c;
    client_connect(&c, 0);
    watch(&c);
    client_send_str(&c, "GET / HTTP/1.1\r\nHost: t\r\nX-A: one\r\n");
    PUMP_UNTIL(false, 30);
    client_send_str(&c, " two\r\n\r\n");
    response_t r;
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_EQ(r.status, 400);
    ASSERT_TRUE(strstr(r.body.base, "obs-fold") != NULL);
    response_free(&r);
    client_close(&c);
    unwatch_all();
    /* Values split across reads at blanks are not folds. */
    client_connect(&c, 0);
    watch(&c);
    const char *parts[] = {"GET / HTTP/1.1\r\nHost: t\r\nX-A:",
                           " one",
                           " two \t",
                           "\r\nX-B:",
                           "\r\n",
                           "X-C: c\r\n\r\n"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        client_send_str(&c, parts[i]);
        PUMP_UNTIL(false, 20);
    }
    ASSERT_TRUE(read_response(&c, &r, false));
    ASSERT_EQ(r.status, 200);
    response_free(&r);
    client_close(&c);
    unwatch_all();
    gw_http_stats_t st;
    gw_http_server_stats(F.srv, &st);
    ASSERT_EQ(st.requests, 1);
    stop();
}

PC_TEST(bad_params_and_bind_failure)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    gw_http_server_t *s = NULL;
    char err[256];
    gw_http_params_t p = gw_http_params_default();
    p.port = 0;
    ASSERT_EQ(gw_http_server_init(&loop, &p, &s, err, sizeof err), PC_ERR_INVAL); /* no handler */
    p.on_request = on_request;
    p.host = "not-an-ip";
    ASSERT_EQ(gw_http_server_init(&loop, &p, &s, err, sizeof err), PC_ERR_INVAL);
    ASSERT_TRUE(strstr(err, "not-an-ip") != NULL);
    p.host = "127.0.0.1";
    ASSERT_EQ(gw_http_server_init(&loop, &p, &s, err, sizeof err), 0);
    gw_http_params_t q = p;
    q.port = gw_http_server_port(s);
    gw_http_server_t *s2 = NULL;
    ASSERT_EQ(gw_http_server_init(&loop, &q, &s2, err, sizeof err), PC_ERR_IO);
    ASSERT_TRUE(strstr(err, "cannot listen") != NULL);
    ASSERT_TRUE(s2 == NULL);
    gw_http_server_free(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ(uv_loop_close(&loop), 0);
}

PC_TEST_MAIN()
