/*
 * test_shipper.c — the Redis shipper against a real redis-server started here
 * (tests/redis_testutil.h: a free loopback port, a temporary directory; AOF with appendfsync
 * always): two gateway instances' ledgers ship into one Redis; Redis down at start, killed
 * mid-run and restarted, and paused (SIGSTOP, so every command times out) must all end with the
 * streams and the shared counters exactly equal to the ledgers (`verify` finds no difference); a
 * flushed counter key is reported by verify.
 */
#include "common.h"
#include "ledger.h"
#include "pc_test.h"
#include "pc_testutil.h"
#include "redis_testutil.h"
#include "redisconn.h"
#include "shipper.h"

#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

/* Redis with every write on disk before it answers, so a kill -9 loses nothing acknowledged. */
#define AOF_ALWAYS "--appendonly yes --appendfsync always"

static rt_server_t g_redis;

static void fill(const char *dir, uint64_t first, uint64_t n, const char *tag)
{
    bill_ledger_params_t lp = bill_ledger_params_default();
    lp.dir = dir;
    lp.fsync = BILL_FSYNC_OFF;
    lp.segment_bytes = 65536; /* dozens of segments: the shipper crosses them, verify skips them */
    bill_ledger_t *l;
    if (bill_ledger_open(&lp, &l, NULL, 0) != 0)
        return;
    for (uint64_t i = first; i < first + n; i++) {
        bill_event_t ev;
        uint64_t seq;
        bill_event_init(&ev, i % 50 == 49 ? BILL_EVENT_STORAGE : BILL_EVENT_USAGE);
        snprintf(ev.event_id, BILL_STR_MAX, "%s-%" PRIu64, tag, i);
        bill_event_set_str(ev.tenant, i % 3 ? "acme" : "globex");
        bill_event_set_str(ev.model, "kvgw-demo");
        ev.start_ms = 1735689600000ull + i * 20000; /* several UTC days */
        ev.end_ms = ev.start_ms + 10;
        if (ev.kind == BILL_EVENT_USAGE) {
            snprintf(ev.request_id, BILL_STR_MAX, "req-%s-%" PRIu64, tag, i);
            ev.usage = (bill_usage_t){i % 97, i % 13, i % 7, i % 101, 1 + i % 5};
            for (int b = 0; b < BILL_BUCKET_STORAGE; b++)
                ev.cost_nusd[b] = (i * 7919 + (uint64_t)b * 104729) % 1000003;
        } else {
            bill_event_set_str(ev.ns, "ns0");
            ev.token_ms = i * 1000;
            ev.cost_nusd[BILL_BUCKET_STORAGE] = i;
        }
        bill_ledger_append(l, &ev, &seq);
        if (i % 64 == 63) /* batches of 64: segments rotate near 64 KiB (about 2 hours) */
            bill_ledger_wait_durable(l, seq);
    }
    bill_ledger_close(l);
}

typedef struct ctx {
    uv_loop_t loop;
    bill_shipper_t *s[2];
    uint64_t want[2];
} ctx_t;

static bool caught_up(ctx_t *c)
{
    for (int i = 0; i < 2; i++) {
        bill_shipper_stats_t st;
        bill_shipper_stats(c->s[i], &st);
        if (st.shipped_seq < c->want[i])
            return false;
    }
    return true;
}

/* Runs the loop until both shippers reached want[] or timeout. */
static bool run_until_caught_up(ctx_t *c, uint64_t timeout_ms)
{
    uint64_t end = pc_time_mono_ms() + timeout_ms;
    while (!caught_up(c) && pc_time_mono_ms() < end) {
        bill_shipper_kick(c->s[0]);
        bill_shipper_kick(c->s[1]);
        uv_run(&c->loop, UV_RUN_ONCE);
    }
    return caught_up(c);
}

static void run_for(ctx_t *c, uint64_t ms)
{
    uint64_t end = pc_time_mono_ms() + ms;
    while (pc_time_mono_ms() < end)
        uv_run(&c->loop, UV_RUN_NOWAIT), usleep(1000);
}

static uint64_t shipped(ctx_t *c, int i)
{
    bill_shipper_stats_t st;
    bill_shipper_stats(c->s[i], &st);
    return st.shipped_seq;
}

/* bill_verify of the ledgers dirs[0..n) against g_redis over the days [from_ms, to_ms): its
 * report in *text (free it). */
static int verify_dirs(const char *const *dirs, size_t n, uint64_t from_ms, uint64_t to_ms,
                       char **text, bill_verify_report_t *rep)
{
    bill_verify_params_t vp = bill_verify_params_default();
    vp.port = g_redis.port;
    vp.from_ms = from_ms;
    vp.to_ms = to_ms;
    size_t len;
    FILE *f = open_memstream(text, &len);
    char err[256] = "";
    int rc = bill_verify(dirs, n, &vp, f, rep, err, sizeof err);
    fclose(f);
    if (rc != 0)
        fprintf(stderr, "  verify: %s\n", err);
    return rc;
}

/* Ledgers a and b verified, their differences shown. */
static int verify_days(const char *a, const char *b, uint64_t from_ms, uint64_t to_ms, char **text,
                       bill_verify_report_t *rep)
{
    const char *dirs[2] = {a, b};
    int rc = verify_dirs(dirs, 2, from_ms, to_ms, text, rep);
    if (rep->n_differences > 0)
        fprintf(stderr, "%s", *text);
    return rc;
}

static int verify(const char *a, const char *b, char **text, bill_verify_report_t *rep)
{
    return verify_days(a, b, 0, UINT64_MAX, text, rep);
}

static void on_closed(void *ud)
{
    (*(int *)ud)++;
}

PC_TEST(ship_through_outages_and_verify)
{
    if (!rt_installed())
        PC_SKIP("redis-server not installed (scripts/setup.sh installs it)");
    g_redis = (rt_server_t){0};
    rt_reserve(&g_redis, "redis"); /* started later: down at the shippers' start */
    char da[512], db[512];
    snprintf(da, sizeof da, "%s", pc_test_tmp_path("ledgerA"));
    snprintf(db, sizeof db, "%s", pc_test_tmp_path("ledgerB"));
    fill(da, 0, 3000, "a");
    fill(db, 0, 2000, "b");

    ctx_t c = {.want = {3000, 2000}};
    uv_loop_init(&c.loop);
    bill_shipper_params_t sp = bill_shipper_params_default();
    sp.port = g_redis.port;
    sp.timeout_ms = 300;
    sp.poll_ms = 20;
    sp.retry_min_ms = 50;
    sp.retry_max_ms = 400;
    sp.batch = 128;
    char err[256];
    /* Redis down at start: the shippers keep retrying. */
    sp.ledger_dir = da;
    ASSERT_EQ(bill_shipper_start(&c.loop, &sp, &c.s[0], err, sizeof err), 0);
    sp.ledger_dir = db;
    ASSERT_EQ(bill_shipper_start(&c.loop, &sp, &c.s[1], err, sizeof err), 0);
    run_for(&c, 800);
    ASSERT_EQ_U64(shipped(&c, 0), 0);
    bill_shipper_stats_t st;
    bill_shipper_stats(c.s[0], &st);
    ASSERT_TRUE(st.n_errors + st.n_timeouts > 0); /* refused connects */
    ASSERT_FALSE(st.connected);
    ASSERT_EQ(rt_start(&g_redis, "redis", AOF_ALWAYS), 0);
    ASSERT_TRUE(run_until_caught_up(&c, 30000));

    char *text = NULL;
    bill_verify_report_t rep;
    ASSERT_EQ(verify(da, db, &text, &rep), 0);
    ASSERT_EQ_U64(rep.n_differences, 0);
    ASSERT_EQ_U64(rep.n_shipped, 5000);
    free(text);

    /* Killed mid-run: more events, kill -9 once shipping is under way, restart from the AOF. */
    fill(da, 3000, 20000, "a");
    c.want[0] = 23000;
    uint64_t end = pc_time_mono_ms() + 20000;
    while (shipped(&c, 0) < 3500 && pc_time_mono_ms() < end) {
        bill_shipper_kick(c.s[0]);
        uv_run(&c.loop, UV_RUN_ONCE);
    }
    ASSERT_TRUE(shipped(&c, 0) < 23000); /* really mid-run */
    rt_stop(&g_redis, SIGKILL);
    run_for(&c, 400);
    ASSERT_EQ(rt_start(&g_redis, "redis", AOF_ALWAYS), 0);
    ASSERT_TRUE(run_until_caught_up(&c, 60000));
    ASSERT_EQ(verify(da, db, &text, &rep), 0);
    ASSERT_EQ_U64(rep.n_differences, 0);
    ASSERT_EQ_U64(rep.n_shipped, 25000);
    free(text);

    /* Slow: Redis paused, every command times out; the ledger keeps growing meanwhile. */
    fill(db, 2000, 10000, "b");
    c.want[1] = 12000;
    end = pc_time_mono_ms() + 20000;
    while (shipped(&c, 1) < 2500 && pc_time_mono_ms() < end) {
        bill_shipper_kick(c.s[1]);
        uv_run(&c.loop, UV_RUN_ONCE);
    }
    rt_stop(&g_redis, SIGSTOP);
    run_for(&c, 1000);
    fill(da, 23000, 1000, "a");
    c.want[0] = 24000;
    bill_shipper_stats(c.s[1], &st);
    ASSERT_TRUE(st.n_timeouts > 0);
    rt_stop(&g_redis, SIGCONT);
    ASSERT_TRUE(run_until_caught_up(&c, 60000));
    ASSERT_EQ(verify(da, db, &text, &rep), 0);
    ASSERT_EQ_U64(rep.n_differences, 0);
    ASSERT_EQ_U64(rep.n_shipped, 36000);
    free(text);

    /* A counter key flushed behind our back: verify reports it. */
    redisContext *rc = rt_connect(g_redis.port);
    ASSERT_TRUE(rc != NULL);
    redisReply *r = redisCommand(rc, "DEL kvgw:usage:acme:2025-01-02");
    ASSERT_TRUE(r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
    freeReplyObject(r);
    /* And one counter inflated (the LiteLLM re-seed failure). */
    r = redisCommand(rc, "HINCRBY kvgw:usage:globex:2025-01-03 cost_nusd 5");
    freeReplyObject(r);
    redisFree(rc);
    ASSERT_EQ(verify(da, db, &text, &rep), 0);
    ASSERT_TRUE(rep.n_differences >= 2);
    ASSERT_TRUE(strstr(text, "kvgw:usage:acme:2025-01-02 is missing") != NULL);
    ASSERT_TRUE(strstr(text, "kvgw:usage:globex:2025-01-03 cost_nusd") != NULL);
    free(text);

    /* A day range: only those days' counters, and only the segments that can hold their events.
     * Ledger A's event i starts at 2025-01-01 + 20 s x i (days 1-6), B's on days 1-3. */
    const uint64_t day1 = 1735689600000ull, DAY = 86400000ull;
    ASSERT_EQ(verify_days(da, db, day1 + 3 * DAY, day1 + 4 * DAY, &text, &rep), 0);
    ASSERT_EQ_U64(rep.n_differences, 0); /* the damage is on days 2 and 3 */
    ASSERT_TRUE(rep.n_segments_skipped > rep.n_segments_read);
    printf("  one-day verify: %" PRIu64 " segments read, %" PRIu64 " skipped\n",
           rep.n_segments_read, rep.n_segments_skipped);
    free(text);
    ASSERT_EQ(verify_days(da, db, day1 + DAY, day1 + 3 * DAY, &text, &rep), 0);
    ASSERT_EQ_U64(rep.n_differences, 2);
    ASSERT_TRUE(strstr(text, "kvgw:usage:acme:2025-01-02 is missing") != NULL);
    ASSERT_TRUE(strstr(text, "kvgw:usage:globex:2025-01-03 cost_nusd") != NULL);
    free(text);
    /* A stream entry of day 4 deleted: a day-4 verify sees it, a day-5 one does not. */
    char inst[BILL_STR_MAX];
    ASSERT_EQ(bill_ledger_read_instance(da, inst), 0);
    rc = rt_connect(g_redis.port);
    ASSERT_TRUE(rc != NULL);
    r = redisCommand(rc, "XDEL kvgw:ledger:%s 13001-0", inst); /* event a-13000: day 4 */
    ASSERT_TRUE(r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
    freeReplyObject(r);
    redisFree(rc);
    ASSERT_EQ(verify_days(da, db, day1 + 3 * DAY, day1 + 4 * DAY, &text, &rep), 0);
    ASSERT_EQ_U64(rep.n_differences, 1);
    ASSERT_TRUE(strstr(text, "lacks seq 13001 ") != NULL);
    free(text);
    ASSERT_EQ(verify_days(da, db, day1 + 4 * DAY, day1 + 5 * DAY, &text, &rep), 0);
    ASSERT_EQ_U64(rep.n_differences, 0);
    free(text);
    /* Not whole days: refused. */
    ASSERT_EQ(verify_days(da, db, day1 + 5, day1 + DAY, &text, &rep), PC_ERR_INVAL);
    free(text);

    int closed = 0;
    bill_shipper_stop(c.s[0], on_closed, &closed);
    bill_shipper_stop(c.s[1], on_closed, &closed);
    while (closed < 2)
        uv_run(&c.loop, UV_RUN_ONCE);
    uv_run(&c.loop, UV_RUN_DEFAULT);
    ASSERT_EQ(uv_loop_close(&c.loop), 0);
    rt_stop(&g_redis, SIGKILL);
}

static int write_to(void *ud, const char *data, size_t len)
{
    return fwrite(data, 1, len, ud) == len ? 0 : 1;
}

/* ---- the merged export from Redis -------------------------------------------------------- */

static void fill_instance(const char *dir, const char *inst, uint64_t n)
{
    bill_ledger_params_t lp = bill_ledger_params_default();
    lp.dir = dir;
    lp.instance = inst;
    lp.fsync = BILL_FSYNC_OFF;
    bill_ledger_t *l;
    if (bill_ledger_open(&lp, &l, NULL, 0) != 0)
        return;
    for (uint64_t i = 0; i < n; i++) {
        bill_event_t ev;
        uint64_t seq;
        bill_event_init(&ev, i % 25 == 24 ? BILL_EVENT_STORAGE : BILL_EVENT_USAGE);
        snprintf(ev.event_id, BILL_STR_MAX, "%s-%" PRIu64, inst, i);
        bill_event_set_str(ev.tenant, i % 3 ? "acme" : "te,\"na\"nt");
        bill_event_set_str(ev.model, "kvgw-demo");
        bill_event_set_str(ev.ns, "00112233aabbccdd");
        ev.start_ms = 1735689600000ull + i * 7 + (uint64_t)(inst[3] - 'a');
        ev.end_ms = ev.start_ms + 5; /* ties across instances */
        ev.registry = (uint8_t)(i % BILL_REGISTRY_COUNT);
        if (ev.kind == BILL_EVENT_USAGE) {
            snprintf(ev.request_id, BILL_STR_MAX, "req-%" PRIu64, i);
            bill_event_set_str(ev.api_key_id, "key1");
            ev.status = (uint8_t)(i % BILL_STATUS_COUNT);
            ev.usage = (bill_usage_t){i % 97, i % 13, i % 7, i % 101, 1 + i % 5};
            ev.n_hit_logical = ev.usage.n_read;
            ev.n_hit_physical = ev.usage.n_read / 2;
            for (int b = 0; b < BILL_BUCKET_STORAGE; b++)
                ev.cost_nusd[b] = (i * 7919 + (uint64_t)b * 104729) % 1000003;
        } else {
            ev.token_ms = i * 1000;
            ev.cost_nusd[BILL_BUCKET_STORAGE] = i;
        }
        bill_ledger_append(l, &ev, &seq);
    }
    bill_ledger_close(l);
}

static bool g_scan_streams; /* export_all: also SCAN for PREFIX:ledger:* streams */

/* The merged export as one string (NULL on failure, with err). */
static char *export_all(const char *const *dirs, size_t n, bool redis, int format, char *err,
                        size_t err_len, int *rc_out)
{
    char *text = NULL;
    size_t len;
    FILE *f = open_memstream(&text, &len);
    bill_export_params_t xp = bill_export_params_default();
    xp.format = format;
    xp.chunk = write_to;
    xp.ud = f;
    bill_redis_params_t rp = bill_redis_params_default();
    snprintf(rp.address.host, sizeof rp.address.host, "127.0.0.1");
    rp.address.port = g_redis.port;
    bill_export_sources_t src = {.ledger_dirs = dirs,
                                 .n_ledgers = n,
                                 .redis = redis ? &rp : NULL,
                                 .scan_streams = g_scan_streams};
    bill_export_t *x;
    int rc = bill_export_open_sources(&src, &xp, &x, err, err_len);
    if (rc == 0) {
        while ((rc = bill_export_step(x, 50, err, err_len)) == 0)
            ;
        rc = rc == 1 ? 0 : rc;
        bill_export_free(x);
    }
    fclose(f);
    *rc_out = rc;
    if (rc != 0) {
        free(text);
        return NULL;
    }
    return text;
}

PC_TEST(export_from_redis_merges_every_instance)
{
    if (!rt_installed())
        PC_SKIP("redis-server not installed (scripts/setup.sh installs it)");
    g_redis = (rt_server_t){0};
    ASSERT_EQ(rt_start(&g_redis, "redis2", AOF_ALWAYS), 0);
    const char *inst[3] = {"gw-a", "gw-b", "gw-c"};
    const uint64_t n[3] = {300, 200, 120};
    char dir[3][512];
    uv_loop_t loop;
    uv_loop_init(&loop);
    bill_shipper_t *sh[3];
    char err[512] = "";
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "merge-%s", inst[i]);
        snprintf(dir[i], sizeof dir[i], "%s", pc_test_tmp_path(name));
        fill_instance(dir[i], inst[i], n[i]);
        bill_shipper_params_t sp = bill_shipper_params_default();
        sp.port = g_redis.port;
        sp.poll_ms = 10;
        sp.ledger_dir = dir[i];
        ASSERT_EQ(bill_shipper_start(&loop, &sp, &sh[i], err, sizeof err), 0);
    }
    for (bool done = false; !done;) { /* until every record is shipped (ctest's timeout bounds) */
        uv_run(&loop, UV_RUN_ONCE);
        done = true;
        for (int i = 0; i < 3; i++) {
            bill_shipper_stats_t st;
            bill_shipper_stats(sh[i], &st);
            done &= st.shipped_seq == n[i];
        }
    }
    int closed = 0;
    for (int i = 0; i < 3; i++)
        bill_shipper_stop(sh[i], on_closed, &closed);
    while (closed < 3)
        uv_run(&loop, UV_RUN_ONCE);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ(uv_loop_close(&loop), 0);
    /* Every shipper listed its instance in PREFIX:gws (where exports and verify look). */
    redisContext *rc = rt_connect(g_redis.port);
    ASSERT_TRUE(rc != NULL);
    redisReply *r = redisCommand(rc, "SMEMBERS kvgw:gws");
    ASSERT_TRUE(r != NULL && r->type == REDIS_REPLY_ARRAY);
    ASSERT_EQ_U64(r->elements, 3);
    for (size_t i = 0; i < r->elements; i++)
        ASSERT_TRUE(strcmp(r->element[i]->str, "gw-a") == 0 ||
                    strcmp(r->element[i]->str, "gw-b") == 0 ||
                    strcmp(r->element[i]->str, "gw-c") == 0);
    freeReplyObject(r);
    /* A registered gateway that shipped nothing yet: listed, contributes nothing. */
    r = redisCommand(rc, "SADD kvgw:gws gw-z");
    freeReplyObject(r);
    r = redisCommand(rc, "CONFIG RESETSTAT");
    freeReplyObject(r);

    /* The three ledgers merged, from Redis alone, and from one ledger plus Redis: the same bytes,
     * in every format. */
    const char *dirs[3] = {dir[0], dir[1], dir[2]};
    for (int format = BILL_EXPORT_CSV; format <= BILL_EXPORT_FOCUS; format++) {
        int erc;
        char *ledgers = export_all(dirs, 3, false, format, err, sizeof err, &erc);
        ASSERT_TRUE(ledgers != NULL);
        char *from_redis = export_all(NULL, 0, true, format, err, sizeof err, &erc);
        if (from_redis == NULL)
            fprintf(stderr, "  %s\n", err);
        ASSERT_TRUE(from_redis != NULL);
        ASSERT_STR_EQ(from_redis, ledgers);
        char *mixed = export_all(&dirs[1], 1, true, format, err, sizeof err, &erc);
        ASSERT_TRUE(mixed != NULL);
        ASSERT_STR_EQ(mixed, ledgers);
        if (format == BILL_EXPORT_JSONL) {
            ASSERT_TRUE(strstr(ledgers, "\"registry\":\"shared\",\"instance\":\"gw-c\"") != NULL);
            size_t lines = 0;
            for (const char *p = ledgers; (p = strchr(p, '\n')) != NULL; p++)
                lines++;
            ASSERT_EQ_U64(lines, n[0] + n[1] + n[2]);
        }
        free(ledgers);
        free(from_redis);
        free(mixed);
    }

    /* The instances came from PREFIX:gws alone: no SCAN of the keyspace (cache entries too). */
    r = redisCommand(rc, "INFO commandstats");
    ASSERT_TRUE(r != NULL && r->type != REDIS_REPLY_ERROR);
    ASSERT_TRUE(strstr(r->str, "cmdstat_smembers:") != NULL);
    ASSERT_TRUE(strstr(r->str, "cmdstat_scan:") == NULL);
    freeReplyObject(r);

    /* verify with one ledger: the other instances are MISSING; events counted by registry. */
    bill_verify_report_t rep;
    char *text = NULL;
    ASSERT_EQ(verify_dirs(dirs, 1, 0, UINT64_MAX, &text, &rep), 0);
    ASSERT_EQ_U64(rep.n_instances_missing, 3);
    ASSERT_TRUE(strstr(text, "MISSING instance gw-b: Redis holds 200 shipped events") != NULL);
    ASSERT_TRUE(strstr(text, "MISSING instance gw-z: Redis holds 0") != NULL);
    ASSERT_EQ_U64(rep.n_registry[0] + rep.n_registry[1] + rep.n_registry[2], n[0]);
    ASSERT_EQ_U64(rep.n_registry[BILL_REGISTRY_LOCAL], n[0] / 3);
    free(text);
    ASSERT_EQ(verify_dirs(dirs, 3, 0, UINT64_MAX, &text, &rep), 0);
    ASSERT_EQ_U64(rep.n_instances_missing, 1); /* gw-z */
    ASSERT_EQ_U64(rep.n_differences, 0);
    free(text);

    /* Another instance's stream holding a copy of gw-a's first event: refused, loudly. */
    r = redisCommand(rc, "XRANGE kvgw:ledger:gw-a - + COUNT 1");
    ASSERT_TRUE(r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 1);
    redisReply *kv = r->element[0]->element[1];
    const char *argv[80] = {"XADD", "kvgw:ledger:gw-dup", "1-0"};
    size_t argl[80] = {4, 18, 3}, argc = 3;
    for (size_t i = 0; i < kv->elements && argc < 80; i++, argc++) {
        argv[argc] = kv->element[i]->str;
        argl[argc] = kv->element[i]->len;
    }
    redisReply *w = redisCommandArgv(rc, (int)argc, argv, argl);
    ASSERT_TRUE(w != NULL && w->type == REDIS_REPLY_STRING);
    freeReplyObject(w);
    freeReplyObject(r);
    /* Not in PREFIX:gws (as a stream of a shipper older than its listing): only --scan-streams
     * finds it. */
    int erc;
    char *plain = export_all(NULL, 0, true, BILL_EXPORT_CSV, err, sizeof err, &erc);
    ASSERT_TRUE(plain != NULL);
    ASSERT_TRUE(strstr(plain, "gw-dup") == NULL);
    free(plain);
    g_scan_streams = true;
    ASSERT_TRUE(export_all(NULL, 0, true, BILL_EXPORT_CSV, err, sizeof err, &erc) == NULL);
    ASSERT_EQ(erc, PC_ERR_FORMAT);
    ASSERT_TRUE(strstr(err, "gw-a-0") != NULL && strstr(err, "twice") != NULL);
    r = redisCommand(rc, "DEL kvgw:ledger:gw-dup");
    freeReplyObject(r);
    /* An entry that is not a shipped event (an older shipper's fields only, or a forged one). */
    r = redisCommand(rc, "XADD kvgw:ledger:gw-c 9999-0 event_id x kind usage");
    freeReplyObject(r);
    ASSERT_TRUE(export_all(NULL, 0, true, BILL_EXPORT_CSV, err, sizeof err, &erc) == NULL);
    ASSERT_EQ(erc, PC_ERR_FORMAT);
    ASSERT_TRUE(strstr(err, "9999-0 lacks field") != NULL);
    r = redisCommand(rc, "XADD kvgw:ledger:bad:name 1-0 a b");
    freeReplyObject(r);
    ASSERT_TRUE(export_all(NULL, 0, true, BILL_EXPORT_CSV, err, sizeof err, &erc) == NULL);
    ASSERT_EQ(erc, PC_ERR_FORMAT);
    ASSERT_TRUE(strstr(err, "not an instance id") != NULL);
    redisFree(rc);
    rt_stop(&g_redis, SIGKILL);
}

/* The cursor is tied to the ledger's LEDGER_ID: a gateway replaced on a fresh disk under the same
 * instance id (a new ledger, seqs from 1 again) is refused with nothing shipped, instead of taking
 * over the old cursor and never shipping its first records; a cursor from before ledger ids is
 * bound to the first ledger that ships on it, unless it is beyond that ledger's end. */
static uint64_t fixed_durable(void *ud)
{
    return *(uint64_t *)ud;
}

static bool stats_refused(bill_shipper_t *sh)
{
    bill_shipper_stats_t st;
    bill_shipper_stats(sh, &st);
    return st.refused;
}

static char *get_str(redisContext *rc, const char *fmt, const char *arg)
{
    redisReply *r = redisCommand(rc, fmt, arg);
    char *v = r != NULL && r->type == REDIS_REPLY_STRING ? strdup(r->str) : NULL;
    if (r != NULL)
        freeReplyObject(r);
    return v;
}

static long long get_int(redisContext *rc, const char *fmt, const char *arg)
{
    redisReply *r = redisCommand(rc, fmt, arg);
    long long v = r != NULL && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r != NULL)
        freeReplyObject(r);
    return v;
}

PC_TEST(cursor_of_another_ledger_refused)
{
    if (!rt_installed())
        PC_SKIP("redis-server not installed (scripts/setup.sh installs it)");
    g_redis = (rt_server_t){0};
    ASSERT_EQ(rt_start(&g_redis, "redis3", AOF_ALWAYS), 0);
    redisContext *rc = rt_connect(g_redis.port);
    ASSERT_TRUE(rc != NULL);
    uv_loop_t loop;
    uv_loop_init(&loop);
    char old_dir[512], new_dir[512], legacy_dir[512], err[512] = "";
    snprintf(old_dir, sizeof old_dir, "%s", pc_test_tmp_path("cur-old"));
    snprintf(new_dir, sizeof new_dir, "%s", pc_test_tmp_path("cur-new"));
    snprintf(legacy_dir, sizeof legacy_dir, "%s", pc_test_tmp_path("cur-legacy"));
    fill_instance(old_dir, "gw-x", 100);
    char old_id[BILL_LEDGER_ID_LEN + 1], new_id[BILL_LEDGER_ID_LEN + 1];
    ASSERT_EQ(bill_ledger_read_id(old_dir, old_id), 0);

    /* The old ledger ships all of it: the cursor names it. */
    bill_shipper_params_t sp = bill_shipper_params_default();
    sp.port = g_redis.port;
    sp.poll_ms = 10;
    sp.retry_max_ms = 100;
    sp.ledger_dir = old_dir;
    bill_shipper_t *sh;
    bill_shipper_stats_t st;
    ASSERT_EQ(bill_shipper_start(&loop, &sp, &sh, err, sizeof err), 0);
    uint64_t end = pc_time_mono_ms() + 30000;
    do {
        uv_run(&loop, UV_RUN_ONCE);
        bill_shipper_stats(sh, &st);
    } while (st.shipped_seq < 100 && pc_time_mono_ms() < end);
    ASSERT_EQ_U64(st.shipped_seq, 100);
    int closed = 0;
    bill_shipper_stop(sh, on_closed, &closed);
    while (!closed)
        uv_run(&loop, UV_RUN_ONCE);
    char want[64];
    snprintf(want, sizeof want, "100 %s", old_id);
    char *cur = get_str(rc, "GET %s", "kvgw:cursor:gw-x");
    ASSERT_STR_EQ(cur, want);
    free(cur);

    /* Replaced on a fresh disk: a new ledger, the same instance id, more records than shipped. */
    fill_instance(new_dir, "gw-x", 150);
    ASSERT_EQ(bill_ledger_read_id(new_dir, new_id), 0);
    ASSERT_TRUE(strcmp(old_id, new_id) != 0);
    sp.ledger_dir = new_dir;
    ASSERT_EQ(bill_shipper_start(&loop, &sp, &sh, err, sizeof err), 0);
    end = pc_time_mono_ms() + 30000;
    while (!stats_refused(sh) && pc_time_mono_ms() < end)
        uv_run(&loop, UV_RUN_ONCE);
    ASSERT_TRUE(stats_refused(sh));
    end = pc_time_mono_ms() + 500; /* a few re-reads of the cursor: still refused */
    while (pc_time_mono_ms() < end)
        uv_run(&loop, UV_RUN_NOWAIT), usleep(1000);
    bill_shipper_stats(sh, &st);
    ASSERT_TRUE(st.refused);
    ASSERT_EQ_U64(st.n_shipped, 0);
    ASSERT_EQ_I64(get_int(rc, "XLEN %s", "kvgw:ledger:gw-x"), 100); /* nothing skipped or added */
    cur = get_str(rc, "GET %s", "kvgw:cursor:gw-x");
    ASSERT_STR_EQ(cur, want);
    free(cur);
    { /* verify names the cursor's ledger as another one than the ledger given */
        bill_verify_report_t rep;
        char *text = NULL;
        const char *vd[] = {new_dir};
        ASSERT_EQ(verify_dirs(vd, 1, 0, UINT64_MAX, &text, &rep), 0);
        ASSERT_TRUE(rep.n_differences > 0);
        ASSERT_TRUE(strstr(text, "belongs to ledger") != NULL);
        ASSERT_TRUE(strstr(text, old_id) != NULL);
        free(text);
    }
    closed = 0;
    bill_shipper_stop(sh, on_closed, &closed);
    while (!closed)
        uv_run(&loop, UV_RUN_ONCE);

    /* A cursor from before ledger ids ("seq" alone): bound to the first ledger shipping on it; one
     * beyond that ledger's end is refused. */
    fill_instance(legacy_dir, "gw-l", 60);
    char lid[BILL_LEDGER_ID_LEN + 1];
    ASSERT_EQ(bill_ledger_read_id(legacy_dir, lid), 0);
    redisReply *r = redisCommand(rc, "SET kvgw:cursor:gw-l 500");
    freeReplyObject(r);
    uint64_t durable = 60;
    sp.ledger_dir = legacy_dir;
    sp.durable_seq = fixed_durable;
    sp.durable_ud = &durable;
    ASSERT_EQ(bill_shipper_start(&loop, &sp, &sh, err, sizeof err), 0);
    end = pc_time_mono_ms() + 30000;
    while (!stats_refused(sh) && pc_time_mono_ms() < end)
        uv_run(&loop, UV_RUN_ONCE);
    ASSERT_TRUE(stats_refused(sh));
    /* The operator resolves it (here: the old stream's cursor set where this ledger's stream
     * really is, 40, as a restore would): the shipper picks it up at its next look. */
    for (uint64_t i = 1; i <= 40; i++) {
        char id[32];
        snprintf(id, sizeof id, "%" PRIu64 "-0", i);
        r = redisCommand(rc, "XADD kvgw:ledger:gw-l %s event_id x", id);
        freeReplyObject(r);
    }
    r = redisCommand(rc, "SET kvgw:cursor:gw-l 40");
    freeReplyObject(r);
    end = pc_time_mono_ms() + 30000;
    do {
        uv_run(&loop, UV_RUN_ONCE);
        bill_shipper_stats(sh, &st);
    } while (st.shipped_seq < 60 && pc_time_mono_ms() < end);
    ASSERT_EQ_U64(st.shipped_seq, 60);
    ASSERT_FALSE(st.refused);
    ASSERT_EQ_U64(st.n_shipped, 20);
    snprintf(want, sizeof want, "60 %s", lid);
    cur = get_str(rc, "GET %s", "kvgw:cursor:gw-l");
    ASSERT_STR_EQ(cur, want);
    free(cur);
    closed = 0;
    bill_shipper_stop(sh, on_closed, &closed);
    while (!closed)
        uv_run(&loop, UV_RUN_ONCE);
    ASSERT_EQ(uv_loop_close(&loop), 0);
    redisFree(rc);
    rt_stop(&g_redis, SIGKILL);
}

PC_TEST_MAIN()
