/*
 * test_redisconn.c — billing/redisconn.h against a real redis-server started here: the params
 * check, the blocking connect (refused AUTH, unreachable), and the async manager through a
 * paused server (a command's deadline fails every pending command with PC_ERR_TIMEOUT, on_down
 * runs once, the connection comes back and on_up runs again) and a killed one (PC_ERR_CLOSED).
 * The Sentinel failover is covered by tests/unit/gateway/test_registry.c.
 */
#include "common.h"
#include "pc_test.h"
#include "pc_testutil.h"
#include "redis_testutil.h"
#include "redisconn.h"

#include <string.h>
#include <uv.h>

typedef struct ctx {
    int n_up, n_down;
    int n_done, n_ok;
    int last_status;
    long long last_int;
} ctx_t;

static void on_up(bill_redis_t *c, void *ud)
{
    (void)c;
    ((ctx_t *)ud)->n_up++;
}

static void on_down(bill_redis_t *c, const char *reason, void *ud)
{
    (void)c;
    (void)reason;
    ((ctx_t *)ud)->n_down++;
}

static void on_reply(bill_redis_t *c, redisReply *r, int status, void *priv)
{
    ctx_t *x = priv;
    (void)c;
    x->n_done++;
    x->last_status = status;
    if (status == 0) {
        x->n_ok++;
        if (r->type == REDIS_REPLY_INTEGER)
            x->last_int = r->integer;
    }
}

static void on_closed(void *ud)
{
    (*(int *)ud)++;
}

static void spin(uv_loop_t *loop, int *what, int want, uint64_t cap_ms)
{
    uint64_t end = pc_time_mono_ms() + cap_ms;
    while (*what < want && pc_time_mono_ms() < end) {
        uv_run(loop, UV_RUN_NOWAIT);
        usleep(500);
    }
}

static int send_incr(bill_redis_t *c, ctx_t *x)
{
    const char *av[2] = {"INCR", "rc:counter"};
    size_t al[2] = {4, 10};
    return bill_redis_send(c, 0, on_reply, x, 2, av, al);
}

/* The async manager's params: port (0: the defaults' address), its deadline and retry backoff, x
 * counting the ups and downs. */
static bill_redis_params_t async_params(ctx_t *x, int port, uint32_t timeout_ms,
                                        uint32_t retry_min_ms, uint32_t retry_max_ms)
{
    bill_redis_params_t p = bill_redis_params_default();
    if (port != 0)
        p.address.port = port;
    p.timeout_ms = timeout_ms;
    p.retry_min_ms = retry_min_ms;
    p.retry_max_ms = retry_max_ms;
    p.on_up = on_up;
    p.on_down = on_down;
    p.ud = x;
    return p;
}

PC_TEST(params_check)
{
    bill_redis_params_t p = bill_redis_params_default();
    char err[256];
    ASSERT_EQ(bill_redis_params_check(&p, err, sizeof err), 0);
    p.address.port = 0;
    ASSERT_EQ(bill_redis_params_check(&p, err, sizeof err), PC_ERR_INVAL);
    p = bill_redis_params_default();
    bill_redis_addr_t s = {.host = "127.0.0.1", .port = 26379};
    p.sentinels = &s;
    p.n_sentinels = 1;
    ASSERT_EQ(bill_redis_params_check(&p, err, sizeof err), PC_ERR_INVAL); /* no master_name */
    ASSERT_TRUE(strstr(err, "master_name") != NULL);
    p.master_name = "bad name";
    ASSERT_EQ(bill_redis_params_check(&p, err, sizeof err), PC_ERR_INVAL);
    p.master_name = "kvgw";
    ASSERT_EQ(bill_redis_params_check(&p, err, sizeof err), 0);
    p.n_sentinels = BILL_REDIS_MAX_SENTINELS + 1;
    ASSERT_EQ(bill_redis_params_check(&p, err, sizeof err), PC_ERR_INVAL);
    p = bill_redis_params_default();
    p.timeout_ms = 0;
    ASSERT_EQ(bill_redis_params_check(&p, err, sizeof err), PC_ERR_INVAL);
}

PC_TEST(sync_connect_auth_and_unreachable)
{
    if (!rt_installed())
        PC_SKIP("redis-server not installed (scripts/setup.sh installs it)");
    rt_server_t s = {0};
    ASSERT_EQ(rt_start(&s, "auth", "--requirepass sekrit"), 0);
    bill_redis_params_t p = bill_redis_params_default();
    p.address.port = s.port;
    p.timeout_ms = 2000;
    char err[512];
    redisContext *c;
    p.password = "wrong";
    ASSERT_EQ(bill_redis_connect_sync(&p, &c, err, sizeof err), PC_ERR_PERM);
    p.password = "sekrit";
    ASSERT_EQ(bill_redis_connect_sync(&p, &c, err, sizeof err), 0);
    redisReply *r = redisCommand(c, "PING");
    ASSERT_TRUE(r != NULL && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    redisFree(c);
    rt_stop(&s, SIGKILL);
    ASSERT_EQ(bill_redis_connect_sync(&p, &c, err, sizeof err), PC_ERR_UPSTREAM);
    /* No sentinel answers. */
    bill_redis_addr_t sents[2] = {{.host = "127.0.0.1", .port = rt_free_port()},
                                  {.host = "127.0.0.1", .port = rt_free_port()}};
    p.sentinels = sents;
    p.n_sentinels = 2;
    p.master_name = "mymaster";
    ASSERT_EQ(bill_redis_connect_sync(&p, &c, err, sizeof err), PC_ERR_UPSTREAM);
}

PC_TEST(async_deadline_down_up)
{
    if (!rt_installed())
        PC_SKIP("redis-server not installed");
    rt_server_t s = {0};
    ASSERT_EQ(rt_start(&s, "async", NULL), 0);
    uv_loop_t loop;
    uv_loop_init(&loop);
    ctx_t x = {0};
    bill_redis_params_t p = async_params(&x, s.port, 300, 20, 100);
    char err[256];
    bill_redis_t *c;
    ASSERT_EQ(bill_redis_start(&loop, &p, &c, err, sizeof err), 0);
    ASSERT_EQ(send_incr(c, &x), PC_ERR_UPSTREAM); /* not up yet: refused, no callback */
    spin(&loop, &x.n_up, 1, 10000);
    ASSERT_EQ(x.n_up, 1);
    ASSERT_TRUE(bill_redis_is_up(c));
    for (int i = 0; i < 10; i++)
        ASSERT_EQ(send_incr(c, &x), 0);
    ASSERT_EQ(x.n_done, 0); /* never from inside send */
    spin(&loop, &x.n_done, 10, 10000);
    ASSERT_EQ(x.n_ok, 10);
    ASSERT_EQ_I64(x.last_int, 10);

    /* Paused: every pending command fails with TIMEOUT once the deadline passed, on_down once. */
    rt_stop(&s, SIGSTOP);
    for (int i = 0; i < 5; i++)
        ASSERT_EQ(send_incr(c, &x), 0);
    spin(&loop, &x.n_done, 15, 10000);
    ASSERT_EQ(x.n_done, 15);
    ASSERT_EQ(x.last_status, PC_ERR_TIMEOUT);
    spin(&loop, &x.n_down, 1, 10000);
    ASSERT_EQ(x.n_down, 1);
    bill_redis_stats_t st;
    bill_redis_stats(c, &st);
    ASSERT_TRUE(st.n_timeouts >= 1);
    rt_stop(&s, SIGCONT);
    spin(&loop, &x.n_up, 2, 10000);
    ASSERT_EQ(x.n_up, 2);
    ASSERT_EQ(send_incr(c, &x), 0);
    spin(&loop, &x.n_done, 16, 10000);
    ASSERT_EQ(x.last_status, 0);

    /* Killed: the pending command fails with CLOSED; restarted: up again. */
    ASSERT_EQ(send_incr(c, &x), 0);
    rt_stop(&s, SIGKILL);
    spin(&loop, &x.n_done, 17, 10000);
    ASSERT_EQ(x.n_done, 17);
    ASSERT_TRUE(x.last_status == PC_ERR_CLOSED || x.last_status == 0);
    spin(&loop, &x.n_down, 2, 10000);
    ASSERT_EQ(x.n_down, 2);
    ASSERT_EQ(rt_start(&s, "async", NULL), 0);
    spin(&loop, &x.n_up, 3, 20000);
    ASSERT_EQ(x.n_up, 3);
    bill_redis_stats(c, &st);
    ASSERT_EQ_U64(st.n_connects, 3);
    ASSERT_EQ_U64(st.n_failovers, 0); /* the same address */

    /* Stop with a command pending: it fails with CANCELED, on_closed runs. */
    ASSERT_EQ(send_incr(c, &x), 0);
    int closed = 0;
    bill_redis_stop(c, on_closed, &closed);
    ASSERT_EQ(x.last_status, PC_ERR_CANCELED);
    spin(&loop, &closed, 1, 5000);
    ASSERT_EQ(closed, 1);
    ASSERT_EQ(x.n_down, 2); /* not called by stop */
    ASSERT_EQ(uv_loop_close(&loop), 0);
    rt_stop(&s, SIGKILL);
}

/* A refused connect and a reset connection are seen at once, never by a deadline (timeout_ms is
 * far longer than the waits' caps): libuv reports both as an error event, which hiredis's own
 * libuv adapter ignored. The reset: a server frozen with our commands unread in its socket,
 * then killed. */
static bool stats_errors_at_least(bill_redis_t *c, uint64_t n, uint64_t cap_ms, uv_loop_t *loop)
{
    uint64_t end = pc_time_mono_ms() + cap_ms;
    bill_redis_stats_t st;
    for (;;) {
        bill_redis_stats(c, &st);
        if (st.n_errors >= n || pc_time_mono_ms() > end)
            return st.n_errors >= n;
        uv_run(loop, UV_RUN_NOWAIT);
        usleep(500);
    }
}

PC_TEST(refused_and_reset_seen_at_once)
{
    if (!rt_installed())
        PC_SKIP("redis-server not installed");
    uv_loop_t loop;
    uv_loop_init(&loop);
    ctx_t x = {0};
    bill_redis_params_t p = async_params(&x, rt_free_port(), 120000, 10, 20); /* nobody listens */
    char err[256];
    bill_redis_t *c;
    ASSERT_EQ(bill_redis_start(&loop, &p, &c, err, sizeof err), 0);
    ASSERT_TRUE(stats_errors_at_least(c, 3, 30000, &loop)); /* three refused attempts */
    bill_redis_stats_t st;
    bill_redis_stats(c, &st);
    ASSERT_EQ_U64(st.n_timeouts, 0);
    int closed = 0;
    bill_redis_stop(c, on_closed, &closed);
    spin(&loop, &closed, 1, 5000);

    rt_server_t s = {0};
    ASSERT_EQ(rt_start(&s, "reset", NULL), 0);
    p.address.port = s.port;
    ASSERT_EQ(bill_redis_start(&loop, &p, &c, err, sizeof err), 0);
    spin(&loop, &x.n_up, 1, 10000);
    ASSERT_EQ(x.n_up, 1);
    rt_stop(&s, SIGSTOP);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(send_incr(c, &x), 0);
    for (int i = 0; i < 20; i++) { /* the commands leave for the frozen server's socket */
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(5000);
    }
    rt_stop(&s, SIGKILL);
    spin(&loop, &x.n_done, 3, 30000);
    ASSERT_EQ(x.n_done, 3);
    ASSERT_EQ(x.last_status, PC_ERR_CLOSED);
    spin(&loop, &x.n_down, 1, 5000);
    ASSERT_EQ(x.n_down, 1);
    bill_redis_stats(c, &st);
    ASSERT_EQ_U64(st.n_timeouts, 0);
    closed = 0;
    bill_redis_stop(c, on_closed, &closed);
    spin(&loop, &closed, 1, 5000);
    ASSERT_EQ(uv_loop_close(&loop), 0);
}

/* With Sentinel: the connection follows SENTINEL FAILOVER as soon as the sentinels name the new
 * primary (their +switch-master), without waiting for the old primary to be demoted and with no
 * command of ours failing first: ROLE checks are off here and nothing is sent, so before this
 * only a lost connection could have moved it. */
PC_TEST(sentinel_switch_followed_at_once)
{
    if (!rt_installed() || access(RT_SENTINEL_BIN, X_OK) != 0)
        PC_SKIP("redis-server / redis-sentinel not installed");
    rt_server_t pr = {0}, rep = {0}, sen = {0};
    ASSERT_EQ(rt_start(&pr, "swp", NULL), 0);
    ASSERT_EQ(rt_replica(&rep, "swr", &pr), 0); /* in sync before the sentinel looks */
    ASSERT_EQ(rt_sentinel(&sen, "sws", pr.port), 0);
    uv_loop_t loop;
    uv_loop_init(&loop);
    ctx_t x = {0};
    bill_redis_addr_t sents[1] = {{.host = "127.0.0.1", .port = sen.port}};
    bill_redis_params_t p = async_params(&x, 0, 2000, 20, 200);
    p.sentinels = sents;
    p.n_sentinels = 1;
    p.master_name = "mymaster";
    p.role_check_ms = 0;
    char err[256];
    bill_redis_t *c;
    ASSERT_EQ(bill_redis_start(&loop, &p, &c, err, sizeof err), 0);
    spin(&loop, &x.n_up, 1, 10000);
    ASSERT_EQ(x.n_up, 1);
    bill_redis_stats_t st;
    bill_redis_stats(c, &st);
    ASSERT_EQ(st.primary.port, pr.port);
    /* The sentinel must know the replica before it can fail over to it. */
    bool failed_over = false;
    uint64_t end = pc_time_mono_ms() + 60000;
    while (!failed_over && pc_time_mono_ms() < end) {
        redisReply *r = rt_cmd(sen.port, "SENTINEL FAILOVER mymaster");
        failed_over = r != NULL && r->type == REDIS_REPLY_STATUS;
        if (r != NULL)
            freeReplyObject(r);
        for (int i = 0; !failed_over && i < 40; i++) {
            uv_run(&loop, UV_RUN_NOWAIT);
            usleep(5000);
        }
    }
    ASSERT_TRUE(failed_over);
    spin(&loop, &x.n_up, 2, 60000);
    ASSERT_EQ(x.n_up, 2);
    bill_redis_stats(c, &st);
    ASSERT_EQ(st.primary.port, rep.port);
    ASSERT_EQ_U64(st.n_failovers, 1);
    ASSERT_EQ_U64(st.n_timeouts, 0);
    ASSERT_EQ_U64(st.n_demotions, 0); /* not by the old primary's demotion, */
    ASSERT_EQ_U64(st.n_errors, 0);    /* nor by its closing our connection at the demotion */
    ASSERT_EQ(send_incr(c, &x), 0);
    spin(&loop, &x.n_done, 1, 10000);
    ASSERT_EQ(x.last_status, 0);
    int closed = 0;
    bill_redis_stop(c, on_closed, &closed);
    spin(&loop, &closed, 1, 5000);
    ASSERT_EQ(uv_loop_close(&loop), 0);
    rt_stop(&sen, SIGKILL);
    rt_stop(&rep, SIGKILL);
    rt_stop(&pr, SIGKILL);
}

PC_TEST_MAIN()
