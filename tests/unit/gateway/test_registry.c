/*
 * test_registry.c — the shared cache registry (gateway/registry.h) against real redis-server
 * processes started here (free loopback ports, temporary directories) and, for the failover, a
 * replica and a redis-sentinel. Registries run on one libuv loop (two gateways as two registries)
 * or, where one must keep renewing while another starts, on a second thread's loop.
 *
 * No timed assertions: waits are "until the condition holds" with generous caps; only the
 * order of events and Redis's state are checked.
 */
#include "common.h"
#include "pc_test.h"
#include "pc_testutil.h"
#include "redis_testutil.h"
#include "registry.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

static rt_server_t g_redis;

static bool need_redis(void)
{
    if (!rt_installed())
        return false;
    if (g_redis.port == 0 || g_redis.pid == 0)
        return rt_start(&g_redis, "redis", NULL) == 0;
    return true;
}

/* ---- a gateway's view, as the callbacks see it ---------------------------------------------- */

typedef struct gw {
    gw_registry_t *r;
    const char *name;
    int n_feed_w, n_feed_r;
    uint64_t last_ns;
    size_t last_n_tokens, last_n_points;
    uint32_t last_tok0, last_tok_end;
    char last_worker[64];
    char last_tenant[64], last_model[64];
    uint64_t last_start;
    int n_state;
    gw_registry_state_t last_state;
    int n_ops[GW_REGISTRY_OPS];
    /* the last claim's answer */
    int claim_done;
    gw_registry_status_t claim_status;
    size_t n_res;
    gw_registry_point_result_t res[8];
    char res_worker[8][64];
    uint64_t fence;
    int closed;
} gw_t;

static int on_feed(const gw_registry_feed_event_t *ev, void *ud)
{
    gw_t *g = ud;
    if (ev->type == 'w')
        g->n_feed_w++;
    else
        g->n_feed_r++;
    g->last_ns = ev->ns;
    g->last_n_tokens = ev->n_tokens;
    g->last_n_points = ev->n_points;
    g->last_tok0 = ev->tokens[0];
    g->last_tok_end = ev->tokens[ev->n_tokens - 1];
    snprintf(g->last_worker, sizeof g->last_worker, "%s", ev->worker);
    if (ev->type == 'w') {
        snprintf(g->last_tenant, sizeof g->last_tenant, "%s", ev->tenant);
        snprintf(g->last_model, sizeof g->last_model, "%s", ev->model);
    }
    g->last_start = ev->start_wall_ms;
    return 0;
}

static void on_state(gw_registry_state_t s, const char *reason, void *ud)
{
    gw_t *g = ud;
    (void)reason;
    g->n_state++;
    g->last_state = s;
}

static void on_op(gw_registry_opkind_t op, double s, void *ud)
{
    gw_t *g = ud;
    (void)s;
    g->n_ops[op]++;
}

static void on_claim(const gw_registry_claim_result_t *res, void *ud)
{
    gw_t *g = ud;
    g->claim_done++;
    g->claim_status = res->status;
    g->n_res = res->n_points;
    g->fence = res->fence;
    for (size_t i = 0; i < res->n_points && i < 8; i++) {
        g->res[i] = res->points[i];
        snprintf(g->res_worker[i], sizeof g->res_worker[i], "%s", res->points[i].worker);
        g->res[i].worker = g->res_worker[i];
        g->res[i].instance = "";
    }
}

static void on_closed(void *ud)
{
    ((gw_t *)ud)->closed = 1;
}

static gw_registry_params_t params(int port, const char *prefix, const char *instance,
                                   uint8_t secret, gw_t *g)
{
    gw_registry_params_t p = gw_registry_params_default();
    p.redis.address.port = port;
    p.redis.timeout_ms = 400;
    p.redis.retry_min_ms = 20;
    p.redis.retry_max_ms = 200;
    p.prefix = prefix;
    p.instance = instance;
    memset(p.secret_check, secret, sizeof p.secret_check);
    p.timeout_ms = 2000; /* a loaded 2-core CI box: claims that must be answered get time */
    p.claim_ttl_ms = 30000;
    p.lease_ms = 800;
    p.feed_block_ms = 100;
    p.on_feed = on_feed;
    p.on_state = on_state;
    p.on_op = on_op;
    p.ud = g;
    return p;
}

static uv_loop_t g_loop;

/* Runs the loop until cond(ud) or cap_ms passed; returns cond's last value. */
static bool run_until(bool (*cond)(void *), void *ud, uint64_t cap_ms)
{
    uint64_t end = pc_time_mono_ms() + cap_ms;
    while (!cond(ud) && pc_time_mono_ms() < end) {
        uv_run(&g_loop, UV_RUN_NOWAIT);
        usleep(500);
    }
    return cond(ud);
}

static void run_for(uint64_t ms)
{
    uint64_t end = pc_time_mono_ms() + ms;
    while (pc_time_mono_ms() < end) {
        uv_run(&g_loop, UV_RUN_NOWAIT);
        usleep(500);
    }
}

static bool is_up(void *ud)
{
    gw_t *g = ud;
    return gw_registry_state(g->r) == GW_REGISTRY_UP && g->n_ops[GW_REGISTRY_OP_LEASE] > 0;
}

static bool claim_done(void *ud)
{
    return ((gw_t *)ud)->claim_done > 0;
}

static bool feed_w_seen(void *ud)
{
    return ((gw_t *)ud)->n_feed_w > 0;
}

static bool queue_empty(void *ud)
{
    gw_registry_stats_t st;
    gw_registry_stats(((gw_t *)ud)->r, &st);
    return st.replay_pending == 0;
}

static void stop2(gw_t *a, gw_t *b)
{
    gw_t *pair[2] = {a, b};
    for (int i = 0; i < 2; i++)
        if (pair[i] != NULL && pair[i]->r != NULL)
            gw_registry_stop(pair[i]->r, on_closed, pair[i]);
        else if (pair[i] != NULL)
            pair[i]->closed = 1;
    uint64_t end = pc_time_mono_ms() + 10000;
    while (!((a == NULL || a->closed) && (b == NULL || b->closed)) && pc_time_mono_ms() < end) {
        uv_run(&g_loop, UV_RUN_NOWAIT);
        usleep(500);
    }
}

static void tokens_fill(uint32_t *t, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        t[i] = (seed * 2654435761u + (uint32_t)i * 40503u) % 128000u;
}

static long long key_pexpiretime(const char *key)
{
    redisReply *r = rt_cmd(g_redis.port, "PEXPIRETIME %s", key);
    long long v = r != NULL && r->type == REDIS_REPLY_INTEGER ? r->integer : -3;
    if (r != NULL)
        freeReplyObject(r);
    return v;
}

static bool key_exists_on(int port, const char *key)
{
    redisReply *r = rt_cmd(port, "EXISTS %s", key);
    bool v = r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    if (r != NULL)
        freeReplyObject(r);
    return v;
}

static bool key_exists(const char *key)
{
    return key_exists_on(g_redis.port, key);
}

static void entry_key(char *out, size_t len, const char *prefix, char kind, uint64_t ns,
                      const uint32_t *t, size_t n)
{
    char h[33];
    gw_registry_key_hex(ns, t, n, h);
    snprintf(out, len, "%s:%c:%016" PRIx64 ":%s", prefix, kind, ns, h);
}

/* ---- tests ----------------------------------------------------------------------------------- */

/* The key hash is XXH3-128 over (ns LE, tokens LE) and the streaming digest at each point equals
 * a one-shot hash of that prefix. */
PC_TEST(key_hash_is_streaming_and_stable)
{
    uint32_t t[5000];
    tokens_fill(t, 5000, 7);
    char a[33], b[33], c[33];
    gw_registry_key_hex(42, t, 4096, a);
    gw_registry_key_hex(42, t, 4096, b);
    ASSERT_STR_EQ(a, b);
    gw_registry_key_hex(43, t, 4096, c);
    ASSERT_TRUE(strcmp(a, c) != 0);
    gw_registry_key_hex(42, t, 4095, c);
    ASSERT_TRUE(strcmp(a, c) != 0);
    ASSERT_EQ_U64(strlen(a), 32);
}

/* Two gateways claim the same new points at the same moment, many times: exactly one wins each
 * time, the other sees OTHER with the winner's worker; after the winner's commit both see LIVE,
 * and the other gateway's feed delivered the write. */
PC_TEST(claim_race_one_winner_then_live_and_feed)
{
    if (!need_redis())
        PC_SKIP("redis-server not installed (scripts/setup.sh installs it)");
    uv_loop_init(&g_loop);
    gw_t A = {.name = "A"}, B = {.name = "B"};
    char err[512];
    gw_registry_params_t pa = params(g_redis.port, "race", "gwA", 1, &A);
    gw_registry_params_t pb = params(g_redis.port, "race", "gwB", 1, &B);
    ASSERT_EQ(gw_registry_start(&g_loop, &pa, &A.r, err, sizeof err), 0);
    ASSERT_EQ(gw_registry_start(&g_loop, &pb, &B.r, err, sizeof err), 0);
    ASSERT_TRUE(run_until(is_up, &A, 10000));
    ASSERT_TRUE(run_until(is_up, &B, 10000));

    int wins_a = 0, wins_b = 0;
    for (uint32_t round = 0; round < 40; round++) {
        uint32_t t[300];
        tokens_fill(t, 300, 1000 + round);
        gw_registry_point_t pts[2] = {{.n_tokens = 100, .ttl = 0, .write = true},
                                      {.n_tokens = 300, .ttl = 1, .write = true}};
        A.claim_done = B.claim_done = 0;
        gw_registry_op_t *oa, *ob;
        /* Alternate who sends first; both are in flight together. */
        if (round % 2 == 0) {
            ASSERT_EQ(gw_registry_claim(A.r, 5, t, 300, pts, 2, "wA", on_claim, &A, &oa), 0);
            ASSERT_EQ(gw_registry_claim(B.r, 5, t, 300, pts, 2, "wB", on_claim, &B, &ob), 0);
        } else {
            ASSERT_EQ(gw_registry_claim(B.r, 5, t, 300, pts, 2, "wB", on_claim, &B, &ob), 0);
            ASSERT_EQ(gw_registry_claim(A.r, 5, t, 300, pts, 2, "wA", on_claim, &A, &oa), 0);
        }
        ASSERT_TRUE(run_until(claim_done, &A, 10000));
        ASSERT_TRUE(run_until(claim_done, &B, 10000));
        ASSERT_EQ(A.claim_status, GW_REGISTRY_ST_OK);
        ASSERT_EQ(B.claim_status, GW_REGISTRY_ST_OK);
        gw_t *win = A.res[0].state == GW_REGISTRY_PT_MINE ? &A : &B;
        gw_t *lose = win == &A ? &B : &A;
        for (int i = 0; i < 2; i++) {
            ASSERT_EQ(win->res[i].state, GW_REGISTRY_PT_MINE);
            ASSERT_EQ(lose->res[i].state, GW_REGISTRY_PT_OTHER);
            ASSERT_STR_EQ(lose->res[i].worker, win == &A ? "wA" : "wB");
        }
        ASSERT_TRUE(win->fence > 0);
        ASSERT_EQ_U64(lose->fence, 0);
        wins_a += win == &A;
        wins_b += win == &B;

        /* The winner commits at its first token: claims gone, entries live, feed to the other. */
        int feed_before = lose->n_feed_w;
        uint64_t start = pc_time_wall_ms();
        ASSERT_EQ(gw_registry_commit(win->r, 5, "tenant-t", "model m", t, pts, 2, win->fence, start,
                                     win == &A ? "wA" : "wB"),
                  0);
        ASSERT_TRUE(run_until(queue_empty, win, 10000));
        char ck[200], ek[200];
        entry_key(ck, sizeof ck, "race", 'c', 5, t, 300);
        entry_key(ek, sizeof ek, "race", 'e', 5, t, 300);
        ASSERT_FALSE(key_exists(ck));
        long long pt = key_pexpiretime(ek);
        ASSERT_EQ_I64(pt, (long long)(start + 3600000)); /* 1h class: start + TTL */
        lose->claim_done = 0;
        ASSERT_EQ(gw_registry_claim(lose->r, 5, t, 300, pts, 2, "wX", on_claim, lose, &oa), 0);
        ASSERT_TRUE(run_until(claim_done, lose, 10000));
        ASSERT_EQ(lose->res[0].state, GW_REGISTRY_PT_LIVE);
        ASSERT_EQ(lose->res[1].state, GW_REGISTRY_PT_LIVE);
        ASSERT_EQ_U64(lose->res[1].expiry_wall_ms, start + 3600000);
        ASSERT_EQ(lose->res[1].ttl, 1);
        ASSERT_EQ_U64(lose->res[0].expiry_wall_ms, start + 300000);
        uint64_t end = pc_time_mono_ms() + 10000;
        while (lose->n_feed_w < feed_before + 1 && pc_time_mono_ms() < end) {
            uv_run(&g_loop, UV_RUN_NOWAIT);
            usleep(500);
        }
        ASSERT_EQ(lose->n_feed_w, feed_before + 1);
        ASSERT_EQ_U64(lose->last_n_tokens, 300);
        ASSERT_EQ_U64(lose->last_n_points, 2);
        ASSERT_EQ_U64(lose->last_tok0, t[0]);
        ASSERT_EQ_U64(lose->last_tok_end, t[299]);
        ASSERT_EQ_U64(lose->last_start, start);
        ASSERT_STR_EQ(lose->last_worker, win == &A ? "wA" : "wB");
        /* The namespace's owner travels with the write (the storage meter's holder bills it). */
        ASSERT_STR_EQ(lose->last_tenant, "tenant-t");
        ASSERT_STR_EQ(lose->last_model, "model m");
    }
    ASSERT_EQ(wins_a + wins_b, 40);
    gw_registry_stats_t sa, sb;
    gw_registry_stats(A.r, &sa);
    gw_registry_stats(B.r, &sb);
    ASSERT_EQ_U64(sa.claims[GW_REGISTRY_CLAIM_WON] + sb.claims[GW_REGISTRY_CLAIM_WON], 40);
    ASSERT_EQ_U64(sa.claims[GW_REGISTRY_CLAIM_WAITED] + sb.claims[GW_REGISTRY_CLAIM_WAITED], 40);
    ASSERT_EQ_U64(sa.claims[GW_REGISTRY_CLAIM_LIVE] + sb.claims[GW_REGISTRY_CLAIM_LIVE], 40);
    /* Each gateway skipped its own writes on the feed and applied the other's. */
    ASSERT_EQ_U64(sa.feed[0][0], (uint64_t)wins_b);
    ASSERT_EQ_U64(sb.feed[0][0], (uint64_t)wins_a);
    ASSERT_TRUE(A.n_ops[GW_REGISTRY_OP_CLAIM] > 0 &&
                A.n_ops[GW_REGISTRY_OP_COMMIT] + B.n_ops[GW_REGISTRY_OP_COMMIT] == 40);
    stop2(&A, &B);
    ASSERT_TRUE(A.closed && B.closed);
    /* A clean stop deletes the registrations. */
    ASSERT_FALSE(key_exists("race:gw:gwA"));
    uv_loop_close(&g_loop);
}

/* Entries expire by Redis's clock; a read extends (never shortens) and goes to the feed; a
 * release needs our fence; a commit never shortens an expiry. */
PC_TEST(expiry_read_release)
{
    if (!need_redis())
        PC_SKIP("redis-server not installed");
    uv_loop_init(&g_loop);
    gw_t A = {.name = "A"}, B = {.name = "B"};
    char err[512];
    gw_registry_params_t pa = params(g_redis.port, "exp", "gwA", 2, &A);
    gw_registry_params_t pb = params(g_redis.port, "exp", "gwB", 2, &B);
    pa.ttl_ms[0] = pb.ttl_ms[0] = 1500; /* a short 5m class for this test */
    ASSERT_EQ(gw_registry_start(&g_loop, &pa, &A.r, err, sizeof err), 0);
    ASSERT_EQ(gw_registry_start(&g_loop, &pb, &B.r, err, sizeof err), 0);
    ASSERT_TRUE(run_until(is_up, &A, 10000));
    ASSERT_TRUE(run_until(is_up, &B, 10000));
    uint32_t t[64];
    tokens_fill(t, 64, 99);
    gw_registry_point_t pt = {.n_tokens = 64, .ttl = 0, .write = true};
    char ek[200], ck[200];
    entry_key(ek, sizeof ek, "exp", 'e', 9, t, 64);
    entry_key(ck, sizeof ck, "exp", 'c', 9, t, 64);

    /* Commit (a local decision: fence 0). */
    uint64_t start = pc_time_wall_ms();
    ASSERT_EQ(gw_registry_commit(A.r, 9, "tenant-t", "model m", t, &pt, 1, 0, start, "wA"), 0);
    ASSERT_TRUE(run_until(queue_empty, &A, 10000));
    ASSERT_EQ_I64(key_pexpiretime(ek), (long long)(start + 1500));
    /* An older commit (a replay) does not shorten it. */
    ASSERT_EQ(gw_registry_commit(B.r, 9, "tenant-t", "model m", t, &pt, 1, 0, start - 1000, "wB"),
              0);
    ASSERT_TRUE(run_until(queue_empty, &B, 10000));
    ASSERT_EQ_I64(key_pexpiretime(ek), (long long)(start + 1500));
    /* A read at now+300 extends to now+300+TTL; a read with an older time does not shorten. */
    int feed_r = A.n_feed_r;
    ASSERT_EQ(gw_registry_read(B.r, 9, t, 64, &pt, 1, start + 300), 0);
    ASSERT_TRUE(run_until(queue_empty, &B, 10000));
    ASSERT_EQ_I64(key_pexpiretime(ek), (long long)(start + 1800));
    ASSERT_EQ(gw_registry_read(B.r, 9, t, 64, &pt, 1, start + 100), 0);
    ASSERT_TRUE(run_until(queue_empty, &B, 10000));
    ASSERT_EQ_I64(key_pexpiretime(ek), (long long)(start + 1800));
    uint64_t end = pc_time_mono_ms() + 10000;
    while (A.n_feed_r < feed_r + 2 && pc_time_mono_ms() < end)
        uv_run(&g_loop, UV_RUN_NOWAIT), usleep(500);
    ASSERT_EQ(A.n_feed_r, feed_r + 2);
    ASSERT_EQ_U64(A.last_n_tokens, 64);

    /* Redis expires it: a claim then wins it again. */
    end = pc_time_mono_ms() + 20000;
    while (key_exists(ek) && pc_time_mono_ms() < end)
        run_for(50);
    ASSERT_FALSE(key_exists(ek));
    gw_registry_op_t *op;
    A.claim_done = 0;
    ASSERT_EQ(gw_registry_claim(A.r, 9, t, 64, &pt, 1, "wA", on_claim, &A, &op), 0);
    ASSERT_TRUE(run_until(claim_done, &A, 10000));
    ASSERT_EQ(A.res[0].state, GW_REGISTRY_PT_MINE);
    ASSERT_TRUE(key_exists(ck));
    /* A release with another fence, or from the other gateway, leaves it. */
    ASSERT_EQ(gw_registry_release(A.r, 9, t, &pt, 1, A.fence + 1), 0);
    ASSERT_EQ(gw_registry_release(B.r, 9, t, &pt, 1, A.fence), 0);
    ASSERT_TRUE(run_until(queue_empty, &A, 10000));
    ASSERT_TRUE(run_until(queue_empty, &B, 10000));
    ASSERT_TRUE(key_exists(ck));
    ASSERT_EQ(gw_registry_release(A.r, 9, t, &pt, 1, A.fence), 0);
    ASSERT_TRUE(run_until(queue_empty, &A, 10000));
    ASSERT_FALSE(key_exists(ck));
    /* A read of an absent entry refreshes nothing and writes no feed event. */
    redisReply *xl = rt_cmd(g_redis.port, "XLEN exp:feed");
    long long before = xl->integer;
    freeReplyObject(xl);
    ASSERT_EQ(gw_registry_read(B.r, 9, t, 64, &pt, 1, pc_time_wall_ms()), 0);
    ASSERT_TRUE(run_until(queue_empty, &B, 10000));
    xl = rt_cmd(g_redis.port, "XLEN exp:feed");
    ASSERT_EQ_I64(xl->integer, before);
    freeReplyObject(xl);
    /* Bad inputs change nothing. */
    gw_registry_point_t bad[2] = {{.n_tokens = 10, .write = true}, {.n_tokens = 10, .write = true}};
    ASSERT_EQ(gw_registry_claim(A.r, 9, t, 64, bad, 2, "wA", on_claim, &A, &op), PC_ERR_INVAL);
    ASSERT_EQ(gw_registry_claim(A.r, 9, t, 64, &pt, 1, "w A", on_claim, &A, &op), PC_ERR_INVAL);
    gw_registry_point_t big = {.n_tokens = 65, .write = true};
    ASSERT_EQ(gw_registry_claim(A.r, 9, t, 64, &big, 1, "wA", on_claim, &A, &op), PC_ERR_INVAL);
    gw_registry_point_t badttl = {.n_tokens = 64, .ttl = 2};
    ASSERT_EQ(gw_registry_commit(A.r, 9, "tenant-t", "model m", t, &badttl, 1, 0, start, "wA"),
              PC_ERR_INVAL);
    /* The owner's names: 1-63 bytes without control characters. */
    char long_name[65];
    memset(long_name, 'm', 64);
    long_name[64] = '\0';
    ASSERT_EQ(gw_registry_commit(A.r, 9, "", "model m", t, &pt, 1, 0, start, "wA"), PC_ERR_INVAL);
    ASSERT_EQ(gw_registry_commit(A.r, 9, "ten\nant", "model m", t, &pt, 1, 0, start, "wA"),
              PC_ERR_INVAL);
    ASSERT_EQ(gw_registry_commit(A.r, 9, "tenant-t", long_name, t, &pt, 1, 0, start, "wA"),
              PC_ERR_INVAL);
    ASSERT_EQ(gw_registry_commit(A.r, 9, NULL, "model m", t, &pt, 1, 0, start, "wA"), PC_ERR_INVAL);
    long_name[63] = '\0';
    ASSERT_EQ(gw_registry_commit(A.r, 9, "tenant-t", long_name, t, &pt, 1, 0, start, "wA"), 0);
    ASSERT_TRUE(run_until(queue_empty, &A, 10000));
    stop2(&A, &B);
    uv_loop_close(&g_loop);
}

/* A gateway whose registration was taken over is fenced: its mutations are refused by every
 * script, it says so, and it re-registers (and replays what it queued) once the key is gone. */
PC_TEST(fenced_instance_refused_then_reregistered)
{
    if (!need_redis())
        PC_SKIP("redis-server not installed");
    uv_loop_init(&g_loop);
    gw_t A = {.name = "A"};
    char err[512];
    gw_registry_params_t pa = params(g_redis.port, "fen", "gwA", 3, &A);
    pa.lease_ms = 4000;
    ASSERT_EQ(gw_registry_start(&g_loop, &pa, &A.r, err, sizeof err), 0);
    ASSERT_TRUE(run_until(is_up, &A, 10000));
    /* A partition: the lease lapsed and another process took the id. */
    redisReply *x = rt_cmd(g_redis.port, "SET fen:gw:gwA someoneelse PX 3000");
    freeReplyObject(x);
    uint32_t t[32];
    tokens_fill(t, 32, 5);
    gw_registry_point_t pt = {.n_tokens = 32, .ttl = 1, .write = true};
    char ek[200];
    entry_key(ek, sizeof ek, "fen", 'e', 1, t, 32);
    ASSERT_EQ(
        gw_registry_commit(A.r, 1, "tenant-t", "model m", t, &pt, 1, 0, pc_time_wall_ms(), "wA"),
        0);
    uint64_t end = pc_time_mono_ms() + 10000;
    while (gw_registry_state(A.r) != GW_REGISTRY_FENCED && pc_time_mono_ms() < end)
        uv_run(&g_loop, UV_RUN_NOWAIT), usleep(500);
    ASSERT_EQ(gw_registry_state(A.r), GW_REGISTRY_FENCED);
    ASSERT_EQ(A.last_state, GW_REGISTRY_FENCED);
    ASSERT_FALSE(key_exists(ek)); /* the stale writer wrote nothing */
    gw_registry_stats_t st;
    gw_registry_stats(A.r, &st);
    ASSERT_TRUE(st.errors[GW_REGISTRY_OP_COMMIT][GW_REGISTRY_ERR_FENCED] >= 1);
    ASSERT_EQ_U64(st.replay_pending, 1);
    gw_registry_op_t *op;
    ASSERT_EQ(gw_registry_claim(A.r, 1, t, 32, &pt, 1, "wA", on_claim, &A, &op),
              GW_REGISTRY_REFUSED_DOWN);
    /* Still held by the other: stays fenced across renewals. */
    run_for(1500);
    ASSERT_EQ(gw_registry_state(A.r), GW_REGISTRY_FENCED);
    ASSERT_FALSE(key_exists(ek));
    /* The other one's key goes away: A registers again and replays its commit once. */
    x = rt_cmd(g_redis.port, "DEL fen:gw:gwA");
    freeReplyObject(x);
    ASSERT_TRUE(run_until(queue_empty, &A, 10000));
    ASSERT_EQ(gw_registry_state(A.r), GW_REGISTRY_UP);
    ASSERT_TRUE(key_exists(ek));
    gw_registry_stats(A.r, &st);
    ASSERT_EQ_U64(st.replayed, 1);
    ASSERT_EQ_U64(st.n_registrations, 2);
    x = rt_cmd(g_redis.port, "XLEN fen:feed");
    ASSERT_EQ_I64(x->integer, 1);
    freeReplyObject(x);
    stop2(&A, NULL);
    uv_loop_close(&g_loop);
}

/* A gateway renewing its lease on another thread, as a live duplicate would. */
typedef struct live {
    uv_loop_t loop;
    gw_registry_t *r;
    gw_t g;
    volatile int stop;
    int started;
} live_t;

static void *live_main(void *arg)
{
    live_t *l = arg;
    while (!l->stop) {
        uv_run(&l->loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    gw_registry_stop(l->r, NULL, NULL);
    for (int i = 0; i < 2000; i++) {
        uv_run(&l->loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    return NULL;
}

PC_TEST(duplicate_instance_and_secret_mismatch_refused_at_start)
{
    if (!need_redis())
        PC_SKIP("redis-server not installed");
    live_t *l = calloc(1, sizeof *l);
    uv_loop_init(&l->loop);
    char err[512];
    gw_registry_params_t pl = params(g_redis.port, "dup", "gw1", 4, &l->g);
    pl.lease_ms = 600;
    ASSERT_EQ(gw_registry_start(&l->loop, &pl, &l->r, err, sizeof err), 0);
    pthread_t th;
    pthread_create(&th, NULL, live_main, l);

    uv_loop_init(&g_loop);
    gw_t D = {.name = "D"};
    gw_registry_params_t pd = params(g_redis.port, "dup", "gw1", 4, &D);
    pd.lease_ms = 600;
    ASSERT_EQ(gw_registry_start(&g_loop, &pd, &D.r, err, sizeof err), PC_ERR_EXISTS);
    ASSERT_TRUE(strstr(err, "gw1") != NULL);
    ASSERT_TRUE(D.r == NULL);
    /* Another instance id with a different namespace secret: refused. */
    gw_registry_params_t ps = params(g_redis.port, "dup", "gw2", 5, &D);
    ASSERT_EQ(gw_registry_start(&g_loop, &ps, &D.r, err, sizeof err), PC_ERR_PERM);
    ASSERT_TRUE(strstr(err, "namespace_secret") != NULL);
    /* The same secret, another id: fine. */
    gw_registry_params_t pok = params(g_redis.port, "dup", "gw2", 4, &D);
    ASSERT_EQ(gw_registry_start(&g_loop, &pok, &D.r, err, sizeof err), 0);
    stop2(&D, NULL);
    l->stop = 1;
    pthread_join(th, NULL);
    uv_loop_close(&l->loop);
    free(l);

    /* A crashed predecessor (its key not renewed): the start waits for it to lapse, then wins. */
    redisReply *x = rt_cmd(g_redis.port, "SET dup:gw:gw3 deadbeef PX 700");
    freeReplyObject(x);
    gw_t C = {.name = "C"};
    gw_registry_params_t pc = params(g_redis.port, "dup", "gw3", 4, &C);
    pc.lease_ms = 600;
    ASSERT_EQ(gw_registry_start(&g_loop, &pc, &C.r, err, sizeof err), 0);
    ASSERT_EQ(gw_registry_state(C.r), GW_REGISTRY_UP);
    x = rt_cmd(g_redis.port, "GET dup:gw:gw3");
    gw_registry_stats_t st;
    gw_registry_stats(C.r, &st);
    ASSERT_STR_EQ(x->str, st.nonce);
    freeReplyObject(x);
    stop2(&C, NULL);
    uv_loop_close(&g_loop);
}

/* A Redis that may evict keys (a memory limit with an LRU policy) is refused at start: its
 * claims and registrations could vanish; with noeviction it is accepted. */
PC_TEST(evicting_redis_refused_at_start)
{
    if (!need_redis())
        PC_SKIP("redis-server not installed");
    rt_server_t ev = {0};
    ASSERT_EQ(rt_start(&ev, "evict", "--maxmemory 64mb --maxmemory-policy allkeys-lru"), 0);
    uv_loop_init(&g_loop);
    char err[512];
    gw_t E = {.name = "E"};
    gw_registry_params_t pe = params(ev.port, "ev", "gw1", 4, &E);
    ASSERT_EQ(gw_registry_start(&g_loop, &pe, &E.r, err, sizeof err), PC_ERR_STATE);
    ASSERT_TRUE(strstr(err, "allkeys-lru") != NULL);
    ASSERT_TRUE(strstr(err, "noeviction") != NULL);
    ASSERT_TRUE(E.r == NULL);
    redisReply *x = rt_cmd(ev.port, "EXISTS ev:gw:gw1");
    ASSERT_EQ(x->integer, 0); /* nothing written */
    freeReplyObject(x);
    x = rt_cmd(ev.port, "CONFIG SET maxmemory-policy noeviction");
    freeReplyObject(x);
    ASSERT_EQ(gw_registry_start(&g_loop, &pe, &E.r, err, sizeof err), 0);
    stop2(&E, NULL);
    uv_loop_close(&g_loop);
    rt_stop(&ev, SIGTERM);
}

static long long hexists(int port, const char *key, const char *field)
{
    redisReply *r = rt_cmd(port, "HEXISTS %s %s", key, field);
    long long v = r != NULL && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r != NULL)
        freeReplyObject(r);
    return v;
}

/* The settings that change billing (PREFIX:settings): a gateway whose value of a setting differs
 * is refused at start with the setting and both values named, and writes nothing; one with the
 * same values and a setting more (a model only it serves) adds it; one that starts while Redis
 * does not answer finds the difference at its first connect and stays fenced. */
PC_TEST(settings_differ_refused_at_start_or_fenced_at_first_connect)
{
    if (!need_redis())
        PC_SKIP("redis-server not installed");
    uv_loop_init(&g_loop);
    gw_t A = {.name = "A"}, B = {.name = "B"};
    char err[1024];
    gw_registry_setting_t sa[] = {{"cache.accounting", "token"},
                                  {"cache.ttl_5m", "300000ms"},
                                  {"models[m one]", "min_cache_tokens=16 auto_ttl=5m"}};
    gw_registry_params_t pa = params(g_redis.port, "set", "gwA", 8, &A);
    pa.settings = sa;
    pa.n_settings = 3;
    ASSERT_EQ(gw_registry_start(&g_loop, &pa, &A.r, err, sizeof err), 0);
    ASSERT_TRUE(run_until(is_up, &A, 10000));

    gw_registry_setting_t sb[] = {{"cache.accounting", "anthropic"},
                                  {"cache.ttl_5m", "300000ms"},
                                  {"models[m2]", "min_cache_tokens=1 auto_ttl=1h"}};
    gw_registry_params_t pb = params(g_redis.port, "set", "gwB", 8, &B);
    pb.settings = sb;
    pb.n_settings = 3;
    ASSERT_EQ(gw_registry_start(&g_loop, &pb, &B.r, err, sizeof err), PC_ERR_STATE);
    ASSERT_TRUE(B.r == NULL);
    ASSERT_TRUE(strstr(err, "setting cache.accounting is 'anthropic' here but 'token' in "
                            "set:settings") != NULL);
    ASSERT_FALSE(key_exists("set:gw:gwB")); /* refused: nothing written */
    ASSERT_EQ_I64(hexists(g_redis.port, "set:settings", "models[m2]"), 0);
    /* A different min_cache_tokens for a model A serves: refused too. */
    sb[0].value = "token";
    sb[2] = (gw_registry_setting_t){"models[m one]", "min_cache_tokens=32 auto_ttl=5m"};
    ASSERT_EQ(gw_registry_start(&g_loop, &pb, &B.r, err, sizeof err), PC_ERR_STATE);
    ASSERT_TRUE(strstr(err, "models[m one]") != NULL && strstr(err, "min_cache_tokens=32") != NULL);
    /* The same values and a model only B serves: started, the new field added. */
    sb[2] = (gw_registry_setting_t){"models[m2]", "min_cache_tokens=1 auto_ttl=1h"};
    ASSERT_EQ(gw_registry_start(&g_loop, &pb, &B.r, err, sizeof err), 0);
    ASSERT_TRUE(run_until(is_up, &B, 10000));
    ASSERT_EQ_I64(hexists(g_redis.port, "set:settings", "models[m2]"), 1);
    /* Bad settings: refused before anything. */
    gw_t X = {.name = "X"};
    gw_registry_setting_t dup[] = {{"cache.ttl_1h", "1ms"}, {"cache.ttl_1h", "1ms"}};
    gw_registry_setting_t ctl[] = {{"cache.ttl_1h", "1\nms"}};
    gw_registry_params_t px = params(g_redis.port, "set", "gwX", 8, &X);
    px.settings = dup;
    px.n_settings = 2;
    ASSERT_EQ(gw_registry_start(&g_loop, &px, &X.r, err, sizeof err), PC_ERR_INVAL);
    px.settings = ctl;
    px.n_settings = 1;
    ASSERT_EQ(gw_registry_start(&g_loop, &px, &X.r, err, sizeof err), PC_ERR_INVAL);
    px.n_settings = GW_REGISTRY_MAX_SETTINGS + 1;
    ASSERT_EQ(gw_registry_start(&g_loop, &px, &X.r, err, sizeof err), PC_ERR_INVAL);
    ASSERT_EQ_I64(hexists(g_redis.port, "set:settings", "cache.ttl_1h"), 0);
    stop2(&A, &B);

    /* Redis not answering at start (paused): the start succeeds degraded; at the first connect
     * the settings differ: fenced, and it stays so through its renewals, writing nothing. */
    redisReply *x = rt_cmd(g_redis.port, "HSET set2:settings cache.ttl_1h 60000ms");
    freeReplyObject(x);
    gw_t C = {.name = "C"};
    gw_registry_setting_t sc[] = {{"cache.ttl_1h", "3600000ms"}};
    gw_registry_params_t pc = params(g_redis.port, "set2", "gwC", 8, &C);
    pc.settings = sc;
    pc.n_settings = 1;
    rt_stop(&g_redis, SIGSTOP);
    int rc = gw_registry_start(&g_loop, &pc, &C.r, err, sizeof err);
    rt_stop(&g_redis, SIGCONT);
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(gw_registry_state(C.r), GW_REGISTRY_DOWN);
    uint64_t end = pc_time_mono_ms() + 20000;
    while (gw_registry_state(C.r) != GW_REGISTRY_FENCED && pc_time_mono_ms() < end)
        run_for(10);
    ASSERT_EQ(gw_registry_state(C.r), GW_REGISTRY_FENCED);
    ASSERT_EQ(C.last_state, GW_REGISTRY_FENCED);
    run_for(1000); /* several renewal periods (lease 800 ms / 4) */
    ASSERT_EQ(gw_registry_state(C.r), GW_REGISTRY_FENCED);
    ASSERT_FALSE(key_exists("set2:gw:gwC"));
    uint32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    gw_registry_point_t pt = {.n_tokens = 8, .write = true};
    gw_registry_op_t *op;
    ASSERT_EQ(gw_registry_claim(C.r, 1, t, 8, &pt, 1, "wC", on_claim, &C, &op),
              GW_REGISTRY_REFUSED_DOWN);
    stop2(&C, NULL);
    uv_loop_close(&g_loop);
}

/* Redis unreachable at start, then paused, then killed and restarted: claims answer at once (down)
 * or by their deadline (paused), nothing blocks the loop, queued commits are replayed once, and a
 * claim won after its deadline is released. */
PC_TEST(redis_down_timeouts_degraded_replay)
{
    if (!rt_installed())
        PC_SKIP("redis-server not installed");
    rt_server_t s = {0};
    s.port = rt_free_port();
    snprintf(s.dir, sizeof s.dir, "%s", pc_test_tmp_path("redis_down"));
    mkdir(s.dir, 0700);
    uv_loop_init(&g_loop);
    gw_t A = {.name = "A"}, B = {.name = "B"};
    char err[512];
    gw_registry_params_t pa = params(s.port, "dn", "gwA", 6, &A);
    pa.timeout_ms = 50;
    pa.redis.timeout_ms = 2000; /* a pause shorter than this keeps the connection */
    ASSERT_EQ(gw_registry_start(&g_loop, &pa, &A.r, err, sizeof err), 0); /* degraded */
    ASSERT_EQ(gw_registry_state(A.r), GW_REGISTRY_DOWN);
    uint32_t t[128];
    tokens_fill(t, 128, 77);
    gw_registry_point_t pts[2] = {{.n_tokens = 64, .ttl = 0, .write = true},
                                  {.n_tokens = 128, .ttl = 0, .write = true}};
    gw_registry_op_t *op;
    ASSERT_EQ(gw_registry_claim(A.r, 3, t, 128, pts, 2, "wA", on_claim, &A, &op),
              GW_REGISTRY_REFUSED_DOWN);
    uint64_t start = pc_time_wall_ms();
    ASSERT_EQ(gw_registry_commit(A.r, 3, "tenant-t", "model m", t, pts, 2, 0, start, "wA"), 0);
    ASSERT_EQ(gw_registry_read(A.r, 3, t, 64, pts, 1, start + 10), 0);
    run_for(300);
    gw_registry_stats_t st;
    gw_registry_stats(A.r, &st);
    ASSERT_EQ_U64(st.replay_pending, 2);
    ASSERT_TRUE(st.degraded_ms > 0);
    /* Redis comes: the checks run on the first connect, then the replay. */
    ASSERT_EQ(rt_start(&s, "redis_down", NULL), 0);
    ASSERT_TRUE(run_until(queue_empty, &A, 20000));
    ASSERT_EQ(gw_registry_state(A.r), GW_REGISTRY_UP);
    char ek[200];
    entry_key(ek, sizeof ek, "dn", 'e', 3, t, 128);
    redisReply *x = rt_cmd(s.port, "PEXPIRETIME %s", ek);
    ASSERT_EQ_I64(x->integer, (long long)(start + 300000));
    freeReplyObject(x);
    x = rt_cmd(s.port, "XLEN dn:feed");
    ASSERT_EQ_I64(x->integer, 2); /* one w, one r: each replayed once */
    freeReplyObject(x);
    gw_registry_stats(A.r, &st);
    ASSERT_EQ_U64(st.replayed, 2);

    /* Paused: the claim answers TIMEOUT by its own deadline; the late win is released. */
    gw_registry_params_t pb = params(s.port, "dn", "gwB", 6, &B);
    ASSERT_EQ(gw_registry_start(&g_loop, &pb, &B.r, err, sizeof err), 0);
    ASSERT_TRUE(run_until(is_up, &B, 10000));
    uint32_t u[16];
    tokens_fill(u, 16, 555);
    gw_registry_point_t pu = {.n_tokens = 16, .ttl = 0, .write = true};
    char ck[200];
    entry_key(ck, sizeof ck, "dn", 'c', 3, u, 16);
    /* Paused: the claim answers TIMEOUT by its own deadline (50 ms); once Redis runs again, the
     * late reply says we won, and the claim is released. */
    A.claim_done = 0;
    rt_stop(&s, SIGSTOP);
    ASSERT_EQ(gw_registry_claim(A.r, 3, u, 16, &pu, 1, "wA", on_claim, &A, &op), 0);
    ASSERT_TRUE(run_until(claim_done, &A, 10000));
    ASSERT_EQ(A.claim_status, GW_REGISTRY_ST_TIMEOUT);
    rt_stop(&s, SIGCONT); /* within the 2 s redis timeout: the same connection */
    uint64_t end = pc_time_mono_ms() + 10000;
    do { /* until the late reply came back */
        run_for(10);
        gw_registry_stats(A.r, &st);
    } while (st.ops[GW_REGISTRY_OP_CLAIM] == 0 && pc_time_mono_ms() < end);
    ASSERT_EQ_U64(st.ops[GW_REGISTRY_OP_CLAIM], 1);
    ASSERT_EQ_U64(st.late_releases, 1);
    ASSERT_TRUE(run_until(queue_empty, &A, 10000));
    ASSERT_FALSE(key_exists_on(s.port, ck));
    gw_registry_stats(A.r, &st);
    ASSERT_EQ_U64(st.claims[GW_REGISTRY_CLAIM_TIMEOUT], 1);

    /* Killed and restarted: DOWN, then UP again; B's claim meanwhile is refused at once. */
    rt_stop(&s, SIGKILL);
    end = pc_time_mono_ms() + 10000;
    while (gw_registry_state(B.r) == GW_REGISTRY_UP && pc_time_mono_ms() < end)
        run_for(10);
    ASSERT_EQ(gw_registry_state(B.r), GW_REGISTRY_DOWN);
    ASSERT_EQ(B.last_state, GW_REGISTRY_DOWN);
    ASSERT_EQ(gw_registry_claim(B.r, 3, u, 16, &pu, 1, "wB", on_claim, &B, &op),
              GW_REGISTRY_REFUSED_DOWN);
    ASSERT_EQ(
        gw_registry_commit(B.r, 3, "tenant-t", "model m", u, &pu, 1, 0, pc_time_wall_ms(), "wB"),
        0);
    ASSERT_EQ(rt_start(&s, "redis_down", NULL), 0); /* empty: no persistence in this test */
    ASSERT_TRUE(run_until(is_up, &B, 20000));
    ASSERT_TRUE(run_until(queue_empty, &B, 20000));
    char eu[200];
    entry_key(eu, sizeof eu, "dn", 'e', 3, u, 16);
    x = rt_cmd(s.port, "EXISTS %s", eu);
    ASSERT_EQ_I64(x->integer, 1);
    freeReplyObject(x);
    /* A's feed resumed after the restart (a fresh stream's ids come from the clock, above A's
     * last id): B's replayed commit reached it. */
    end = pc_time_mono_ms() + 10000;
    while (A.n_feed_w < 1 && pc_time_mono_ms() < end)
        run_for(10);
    ASSERT_EQ(A.n_feed_w, 1);
    stop2(&A, &B);
    rt_stop(&s, SIGKILL);
    uv_loop_close(&g_loop);
}

/* The main connection sees a closed socket at once, idle or not, never by a command's deadline
 * (the redis timeout is far longer than the waits' caps): Redis stopped by SHUTDOWN (a FIN),
 * then restarted and killed while frozen with our lease renewals unread in its socket (the
 * kernel answers with a reset: libuv reports an error event, which hiredis's libuv adapter
 * ignored, so the connection hung until the deadline). */
static bool is_down(void *ud)
{
    return gw_registry_state(((gw_t *)ud)->r) == GW_REGISTRY_DOWN;
}

PC_TEST(redis_closed_socket_noticed_at_once)
{
    if (!rt_installed())
        PC_SKIP("redis-server not installed");
    rt_server_t s = {0};
    ASSERT_EQ(rt_start(&s, "shut", NULL), 0);
    uv_loop_init(&g_loop);
    gw_t A = {.name = "A"};
    char err[512];
    gw_registry_params_t pa = params(s.port, "sh", "gwA", 9, &A);
    pa.redis.timeout_ms = 120000; /* a deadline cannot be what notices */
    pa.lease_ms = 400;            /* renewals every 100 ms */
    ASSERT_EQ(gw_registry_start(&g_loop, &pa, &A.r, err, sizeof err), 0);
    ASSERT_TRUE(run_until(is_up, &A, 10000));
    redisReply *x = rt_cmd(s.port, "SHUTDOWN NOSAVE");
    if (x != NULL)
        freeReplyObject(x);
    rt_stop(&s, SIGKILL); /* reaps it */
    ASSERT_TRUE(run_until(is_down, &A, 60000));

    ASSERT_EQ(rt_start(&s, "shut", NULL), 0);
    A.n_ops[GW_REGISTRY_OP_LEASE] = 0;
    ASSERT_TRUE(run_until(is_up, &A, 20000));
    rt_stop(&s, SIGSTOP);
    run_for(400); /* renewals sent, unread by the frozen server */
    rt_stop(&s, SIGKILL);
    ASSERT_TRUE(run_until(is_down, &A, 60000));
    gw_registry_stats_t st;
    gw_registry_stats(A.r, &st);
    for (int o = 0; o < GW_REGISTRY_OPS; o++)
        ASSERT_EQ_U64(st.errors[o][GW_REGISTRY_ERR_TIMEOUT], 0);
    stop2(&A, NULL);
    uv_loop_close(&g_loop);
}

/* Garbage on the feed (XADD by hand): every malformed entry is rejected and counted, the valid
 * one around them is applied, nothing crashes. */
PC_TEST(feed_malformed_entries_rejected)
{
    if (!need_redis())
        PC_SKIP("redis-server not installed");
    uv_loop_init(&g_loop);
    gw_t A = {.name = "A"};
    char err[512];
    gw_registry_params_t pa = params(g_redis.port, "fm", "gwA", 7, &A);
    pa.max_event_tokens = 1000;
    ASSERT_EQ(gw_registry_start(&g_loop, &pa, &A.r, err, sizeof err), 0);
    ASSERT_TRUE(run_until(is_up, &A, 10000));
    run_for(200); /* the feed connection is reading */
    const char tok8[8] = {1, 0, 0, 0, 2, 0, 0, 0};
    const char *ns = "00000000000000ab";
    struct {
        const char *fmt;
        int binary; /* 1: the tok argument is tok8 with length given */
        size_t toklen;
    } bad[] = {
        {"XADD fm:feed * x y", 0, 0},
        {"XADD fm:feed * t q o gwB ns %s", 0, 0},
        {"XADD fm:feed * t w o gwB ns %s tok %b pts 2:0:5 st 1", 1, 8}, /* no wk */
        {"XADD fm:feed * t w o gwB ns ZZ tok %b pts 2:0:5 st 1 wk w", 3, 8},
        {"XADD fm:feed * t w o gwB ns %s tok %b pts 2:0:5 st 1 wk w", 1, 5},
        {"XADD fm:feed * t w o gwB ns %s tok %b pts 2:0:5,1:0:5 st 1 wk w", 1, 8},
        {"XADD fm:feed * t w o gwB ns %s tok %b pts 1:0:5 st 1 wk w", 1, 8}, /* last != n */
        {"XADD fm:feed * t w o gwB ns %s tok %b pts 2:7:5 st 1 wk w", 1, 8}, /* ttl 7 */
        {"XADD fm:feed * t w o gwB ns %s tok %b pts 2:0:x st 1 wk w", 1, 8},
        {"XADD fm:feed * t w o gwB ns %s tok %b pts 2:0:5, st 1 wk w", 1, 8},
        {"XADD fm:feed * t r o gwB ns %s tok %b n 3 now 1", 1, 8},
        {"XADD fm:feed * t r o gwB o gwC ns %s tok %b n 2 now 1", 1, 8}, /* duplicate */
        {"XADD fm:feed * t r o %s ns %s tok %b n 2 now 1", 2, 8},        /* bad origin */
        /* the owner: both or neither, 1-63 bytes, no control character */
        {"XADD fm:feed * t w o gwB ns %s tok %b pts 2:0:5 st 1 wk w tn ten", 1, 8},
        {"XADD fm:feed * t w o gwB ns %s tok %b pts 2:0:5 st 1 wk w md mod", 1, 8},
        {"XADD fm:feed * t w o gwB ns %s tok %b pts 2:0:5 st 1 wk w tn te\tn md mod", 1, 8},
        {"XADD fm:feed * t w o gwB ns %s tok %b pts 2:0:5 st 1 wk w tn ten md "
         "mmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmm",
         1, 8},
    };
    int n_bad = (int)(sizeof bad / sizeof bad[0]);
    redisContext *c = rt_connect(g_redis.port);
    ASSERT_TRUE(c != NULL);
    for (int i = 0; i < n_bad; i++) {
        redisReply *x;
        if (bad[i].binary == 1)
            x = redisCommand(c, bad[i].fmt, ns, tok8, bad[i].toklen);
        else if (bad[i].binary == 3)
            x = redisCommand(c, bad[i].fmt, tok8, bad[i].toklen);
        else if (bad[i].binary == 2)
            x = redisCommand(c, bad[i].fmt, "g w", ns, tok8, bad[i].toklen);
        else
            x = redisCommand(c, bad[i].fmt, ns);
        ASSERT_TRUE(x != NULL && x->type == REDIS_REPLY_STRING);
        freeReplyObject(x);
    }
    /* Over max_event_tokens (1000): 1001 tokens. */
    char *big = calloc(4004, 1);
    redisReply *x = redisCommand(c, "XADD fm:feed * t r o gwB ns %s tok %b n 1001 now 1", ns, big,
                                 (size_t)4004);
    freeReplyObject(x);
    free(big);
    n_bad++;
    /* Our own origin: skipped. One valid w and one valid r. */
    x = redisCommand(c, "XADD fm:feed * t r o gwA ns %s tok %b n 2 now 1", ns, tok8, (size_t)8);
    freeReplyObject(x);
    x = redisCommand(c, "XADD fm:feed * t w o gwB ns %s tok %b pts 1:0:5,2:1:9 st 4 wk w1", ns,
                     tok8, (size_t)8);
    freeReplyObject(x);
    run_until(feed_w_seen, &A, 10000); /* a writer older than the owner fields: "" for both */
    ASSERT_STR_EQ(A.last_tenant, "");
    ASSERT_STR_EQ(A.last_model, "");
    x = redisCommand(c, "XADD fm:feed * t w o gwB ns %s tok %b pts 2:0:5 st 4 wk w1 tn %s md %s",
                     ns, tok8, (size_t)8, "t\xc3\xa9nant one", "model-1");
    freeReplyObject(x);
    x = redisCommand(c, "XADD fm:feed * t r o gwB ns %s tok %b n 2 now 1 extra ignored", ns, tok8,
                     (size_t)8);
    freeReplyObject(x);
    redisFree(c);
    uint64_t end = pc_time_mono_ms() + 10000;
    while (A.n_feed_r < 1 && pc_time_mono_ms() < end)
        run_for(10);
    run_for(300);
    ASSERT_EQ(A.n_feed_w, 2);
    ASSERT_EQ(A.n_feed_r, 1);
    ASSERT_EQ_U64(A.last_ns, 0xab);
    ASSERT_STR_EQ(A.last_tenant, "t\xc3\xa9nant one");
    ASSERT_STR_EQ(A.last_model, "model-1");
    gw_registry_stats_t st;
    gw_registry_stats(A.r, &st);
    ASSERT_EQ_U64(st.feed[0][2] + st.feed[1][2] + st.feed_rejected_other, (uint64_t)n_bad);
    ASSERT_EQ_U64(st.feed[1][1], 1); /* our own */
    ASSERT_EQ_U64(st.feed[0][0], 2);
    ASSERT_EQ_U64(st.feed[1][0], 1);
    ASSERT_TRUE(st.feed_last_event_wall_ms > 0);
    stop2(&A, NULL);
    uv_loop_close(&g_loop);
}

/* A failover that loses acknowledged writes: the sentinel is made to name another server that
 * never had them (SENTINEL REMOVE + MONITOR: the new "primary" is a standalone server, as a
 * promoted replica is when the old primary's last writes had not reached it). The registry
 * follows it (the periodic sentinel question) and sends its recent commits and reads again: the
 * entries and their feed events are there, with the same expiries. With failover_replay 0, not. */
PC_TEST(failover_resends_recent_writes)
{
    if (!rt_installed() || access(RT_SENTINEL_BIN, X_OK) != 0)
        PC_SKIP("redis-server / redis-sentinel not installed");
    rt_server_t p1 = {0}, p2 = {0}, sen = {0};
    ASSERT_EQ(rt_start(&p1, "fr1", NULL), 0);
    ASSERT_EQ(rt_start(&p2, "fr2", NULL), 0);
    ASSERT_EQ(rt_sentinel(&sen, "frs", p1.port), 0);
    uv_loop_init(&g_loop);
    gw_t A = {.name = "A"}, B = {.name = "B"};
    bill_redis_addr_t sents[1] = {{.host = "127.0.0.1", .port = sen.port}};
    char err[512];
    gw_registry_params_t pa = params(0, "fr", "gwA", 10, &A);
    pa.redis.sentinels = sents;
    pa.redis.n_sentinels = 1;
    pa.redis.master_name = "mymaster";
    pa.redis.role_check_ms = 100;
    gw_registry_params_t pb = pa;
    pb.instance = "gwB";
    pb.ud = &B;
    pb.failover_replay_ms = 0;
    ASSERT_EQ(gw_registry_start(&g_loop, &pa, &A.r, err, sizeof err), 0);
    ASSERT_EQ(gw_registry_start(&g_loop, &pb, &B.r, err, sizeof err), 0);
    ASSERT_TRUE(run_until(is_up, &A, 10000));
    ASSERT_TRUE(run_until(is_up, &B, 10000));
    uint32_t t[40], u[40];
    tokens_fill(t, 40, 11);
    tokens_fill(u, 40, 12);
    gw_registry_point_t pt = {.n_tokens = 40, .ttl = 1, .write = true};
    uint64_t start = pc_time_wall_ms();
    ASSERT_EQ(gw_registry_commit(A.r, 4, "tenant-t", "model m", t, &pt, 1, 0, start, "wA"), 0);
    ASSERT_EQ(gw_registry_read(A.r, 4, t, 40, &pt, 1, start + 5), 0);
    ASSERT_EQ(gw_registry_commit(B.r, 4, "tenant-t", "model m", u, &pt, 1, 0, start, "wB"), 0);
    ASSERT_TRUE(run_until(queue_empty, &A, 10000));
    ASSERT_TRUE(run_until(queue_empty, &B, 10000));
    char ek[200], eu[200];
    entry_key(ek, sizeof ek, "fr", 'e', 4, t, 40);
    entry_key(eu, sizeof eu, "fr", 'e', 4, u, 40);
    ASSERT_TRUE(key_exists_on(p1.port, ek));
    ASSERT_TRUE(key_exists_on(p1.port, eu));

    char cmd[128];
    redisReply *x = rt_cmd(sen.port, "SENTINEL REMOVE mymaster");
    ASSERT_TRUE(x != NULL && x->type == REDIS_REPLY_STATUS);
    freeReplyObject(x);
    snprintf(cmd, sizeof cmd, "SENTINEL MONITOR mymaster 127.0.0.1 %d 1", p2.port);
    x = rt_cmd(sen.port, cmd);
    ASSERT_TRUE(x != NULL && x->type == REDIS_REPLY_STATUS);
    freeReplyObject(x);
    uint64_t end = pc_time_mono_ms() + 30000;
    gw_registry_stats_t sa, sb;
    for (;;) {
        run_for(20);
        gw_registry_stats(A.r, &sa);
        gw_registry_stats(B.r, &sb);
        if ((sa.failovers >= 1 && sb.failovers >= 1 && is_up(&A) && is_up(&B) && queue_empty(&A)) ||
            pc_time_mono_ms() > end)
            break;
    }
    ASSERT_TRUE(sa.failovers >= 1 && sb.failovers >= 1);
    ASSERT_TRUE(is_up(&A) && queue_empty(&A));
    ASSERT_EQ_U64(sa.failover_resent, 2);
    ASSERT_EQ_U64(sb.failover_resent, 0);
    /* A's commit and read are on the new primary with their expiry (the read's: start + 5 + 1h);
     * B's commit (failover_replay 0) is not. */
    ASSERT_TRUE(key_exists_on(p2.port, ek));
    x = rt_cmd(p2.port, "PEXPIRETIME %s", ek);
    ASSERT_EQ_I64(x->integer, (long long)(start + 5 + 3600000));
    freeReplyObject(x);
    ASSERT_FALSE(key_exists_on(p2.port, eu));
    x = rt_cmd(p2.port, "XLEN fr:feed");
    ASSERT_EQ_I64(x->integer, 2); /* the t=w and the t=r again */
    freeReplyObject(x);
    stop2(&A, &B);
    uv_loop_close(&g_loop);
    rt_stop(&sen, SIGKILL);
    rt_stop(&p2, SIGKILL);
    rt_stop(&p1, SIGKILL);
}

/* Sentinel: a primary, a replica and a sentinel (the first sentinel address given is dead, so
 * the second is asked); the registry follows SENTINEL FAILOVER to the promoted replica, writes
 * land there, and its feed resumes. */
PC_TEST(sentinel_failover_followed)
{
    if (!rt_installed() || access(RT_SENTINEL_BIN, X_OK) != 0)
        PC_SKIP("redis-server / redis-sentinel not installed (scripts/setup.sh installs them)");
    rt_server_t p = {0}, rep = {0}, sen = {0};
    ASSERT_EQ(rt_start(&p, "sp", NULL), 0);
    ASSERT_EQ(rt_replica(&rep, "sr", &p), 0); /* in sync before the sentinel looks */
    ASSERT_EQ(rt_sentinel(&sen, "ss", p.port), 0);

    uv_loop_init(&g_loop);
    gw_t A = {.name = "A"}, B = {.name = "B"};
    bill_redis_addr_t sents[2] = {{.host = "127.0.0.1", .port = rt_free_port()},
                                  {.host = "127.0.0.1", .port = sen.port}};
    char err[512];
    gw_registry_params_t pa = params(0, "so", "gwA", 8, &A);
    pa.redis.sentinels = sents;
    pa.redis.n_sentinels = 2;
    pa.redis.master_name = "mymaster";
    pa.redis.role_check_ms = 100;
    gw_registry_params_t pb = pa;
    pb.instance = "gwB";
    pb.ud = &B;
    ASSERT_EQ(gw_registry_start(&g_loop, &pa, &A.r, err, sizeof err), 0);
    ASSERT_EQ(gw_registry_state(A.r), GW_REGISTRY_UP);
    ASSERT_EQ(gw_registry_start(&g_loop, &pb, &B.r, err, sizeof err), 0);
    ASSERT_TRUE(run_until(is_up, &A, 10000));
    ASSERT_TRUE(run_until(is_up, &B, 10000));
    uint32_t t[40];
    tokens_fill(t, 40, 3);
    gw_registry_point_t pt = {.n_tokens = 40, .ttl = 1, .write = true};
    ASSERT_EQ(
        gw_registry_commit(A.r, 2, "tenant-t", "model m", t, &pt, 1, 0, pc_time_wall_ms(), "wA"),
        0);
    ASSERT_TRUE(run_until(queue_empty, &A, 10000));
    uint64_t end = pc_time_mono_ms() + 10000;
    while (B.n_feed_w < 1 && pc_time_mono_ms() < end)
        run_for(10);
    ASSERT_EQ(B.n_feed_w, 1);

    /* The sentinel must know the replica before it can fail over to it. */
    bool failed_over = false;
    end = pc_time_mono_ms() + 60000;
    while (!failed_over && pc_time_mono_ms() < end) {
        redisReply *x = rt_cmd(sen.port, "SENTINEL FAILOVER mymaster");
        failed_over = x != NULL && x->type == REDIS_REPLY_STATUS;
        if (x != NULL)
            freeReplyObject(x);
        if (!failed_over)
            run_for(200);
    }
    ASSERT_TRUE(failed_over);
    /* Wait until the old replica is the primary and both registries are there. */
    end = pc_time_mono_ms() + 60000;
    gw_registry_stats_t sa, sb;
    for (;;) {
        run_for(50);
        gw_registry_stats(A.r, &sa);
        gw_registry_stats(B.r, &sb);
        if ((sa.failovers >= 1 && sb.failovers >= 1 && is_up(&A) && is_up(&B)) ||
            pc_time_mono_ms() > end)
            break;
    }
    ASSERT_TRUE(sa.failovers >= 1);
    ASSERT_TRUE(sb.failovers >= 1);
    ASSERT_EQ(gw_registry_state(A.r), GW_REGISTRY_UP);
    /* A new write lands on the new primary, and B's feed resumes there. */
    uint32_t u[40];
    tokens_fill(u, 40, 4);
    int fw = B.n_feed_w;
    ASSERT_EQ(
        gw_registry_commit(A.r, 2, "tenant-t", "model m", u, &pt, 1, 0, pc_time_wall_ms(), "wA"),
        0);
    ASSERT_TRUE(run_until(queue_empty, &A, 20000));
    char ek[200];
    entry_key(ek, sizeof ek, "so", 'e', 2, u, 40);
    redisReply *x = rt_cmd(rep.port, "EXISTS %s", ek);
    ASSERT_EQ_I64(x->integer, 1);
    freeReplyObject(x);
    x = rt_cmd(rep.port, "ROLE");
    ASSERT_STR_EQ(x->element[0]->str, "master");
    freeReplyObject(x);
    end = pc_time_mono_ms() + 20000;
    while (B.n_feed_w < fw + 1 && pc_time_mono_ms() < end)
        run_for(10);
    ASSERT_EQ(B.n_feed_w, fw + 1);
    /* The blocking connect finds the new primary too. */
    redisContext *ctx;
    ASSERT_EQ(bill_redis_connect_sync(&pa.redis, &ctx, err, sizeof err), 0);
    ASSERT_EQ(ctx->tcp.port, rep.port);
    redisFree(ctx);
    stop2(&A, &B);
    uv_loop_close(&g_loop);
    rt_stop(&sen, SIGKILL);
    rt_stop(&rep, SIGKILL);
    rt_stop(&p, SIGKILL);
}

PC_TEST_MAIN()
