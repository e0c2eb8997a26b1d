/*
 * shipper.c — the ledger -> Redis shipper (contract and key layout in shipper.h).
 *
 * One connection (billing/redisconn.h: deadlines, backoff, Sentinel), one batch in flight: a batch
 * of up to `batch` records is read on the thread pool, then sent as pipelined EVALSHA calls of the
 * shipping script, each reply due within timeout_ms. Replies arrive in order; each confirms its
 * record's seq as the cursor. Any error reply, lost connection or missed deadline drops the
 * connection and reconnects with backoff (possibly to a new primary); each connection lists the
 * instance in PREFIX:gws and re-reads the cursor from Redis (on_up) and restarts the reader there,
 * so the script's seq check makes every replay a no-op.
 */
#include "shipper.h"
#include "common.h"
#include "ledger.h"

#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* KEYS: stream, cursor, usage hash, usage key set. ARGV: "seq ledger_id", number of stream field
 * pairs, the pairs, then counter field/increment pairs. The cursor is "seq ledger_id" ("seq" alone
 * when written before ledger ids: bound to the first ledger that ships on it). Returns 1 when
 * applied, 0 when already shipped; the error KVGWLEDGER when the cursor belongs to another
 * ledger (nothing changed). */
static const char ship_script[] =
    "local cs, cid = string.match(redis.call('GET', KEYS[2]) or '0', '^(%d+) ?(%x*)$')\n"
    "local ss, lid = string.match(ARGV[1], '^(%d+) (%x+)$')\n"
    "if not cs or not ss then return redis.error_reply('KVGWCURSOR malformed cursor') end\n"
    "if cid ~= '' and cid ~= lid then\n"
    "  return redis.error_reply('KVGWLEDGER cursor ' .. cs .. ' of ledger ' .. cid)\n"
    "end\n"
    "local cur = tonumber(cs)\n"
    "local seq = tonumber(ss)\n"
    "if seq <= cur then return 0 end\n"
    "if seq ~= cur + 1 then\n"
    "  return redis.error_reply('KVGWGAP cursor ' .. cur .. ' but record ' .. seq)\n"
    "end\n"
    "local n = tonumber(ARGV[2])\n"
    "local xa = {'XADD', KEYS[1], ss .. '-0'}\n"
    "for i = 3, 2 + 2 * n do xa[#xa + 1] = ARGV[i] end\n"
    "redis.call(unpack(xa))\n"
    "for j = 3 + 2 * n, #ARGV, 2 do redis.call('HINCRBY', KEYS[3], ARGV[j], ARGV[j + 1]) end\n"
    "redis.call('SADD', KEYS[4], KEYS[3])\n"
    "redis.call('SET', KEYS[2], ss .. ' ' .. lid)\n"
    "return 1\n";

bill_shipper_params_t bill_shipper_params_default(void)
{
    return (bill_shipper_params_t){
        .host = "127.0.0.1",
        .port = 6379,
        .prefix = "kvgw",
        .timeout_ms = 2000,
        .batch = 256,
        .poll_ms = 100,
        .retry_min_ms = 100,
        .retry_max_ms = 5000,
    };
}

struct bill_shipper {
    uv_loop_t *loop;
    bill_shipper_params_t p;
    char *dir;
    char instance[BILL_STR_MAX];
    char ledger_id[BILL_LEDGER_ID_LEN + 1];
    char stream_key[256], cursor_key[256], keys_key[256], usage_prefix[256], gws_key[256];

    bill_redis_t *rc; /* the connection (redisconn.h): reconnects, deadlines, Sentinel */
    bool ready;       /* connected, script loaded, listed in PREFIX:gws, cursor known */
    bool listed;      /* this connection's SADD PREFIX:gws was answered */
    bool refused;     /* the cursor is another ledger's: re-read every retry_max_ms, never ship */
    char sha[48];
    uint64_t cursor; /* confirmed by Redis */

    uv_timer_t timer; /* poll, or retry after a ledger read error */

    /* The batch: read on the thread pool, then in flight. */
    uv_work_t work;
    bool working;
    bool reader_reset;
    uint64_t work_from, work_limit;
    int work_rc;
    char work_err[256];
    bill_ledger_reader_t *reader;
    uint64_t reader_next; /* seq the reader returns next */
    bill_event_t *evs;
    uint64_t *seqs;
    size_t n_batch, n_acked;

    bill_shipper_stats_t st;
    bool stopping;
    bool rc_open;
    int handles_open;
    void (*on_closed)(void *ud);
    void *closed_ud;
};

static void pump(bill_shipper_t *s);
static void on_timer(uv_timer_t *t);

static void schedule(bill_shipper_t *s, uint32_t ms)
{
    if (!s->stopping)
        uv_timer_start(&s->timer, on_timer, ms, 0);
}

static void on_cursor(bill_redis_t *rc, redisReply *r, int status, void *priv);

static void on_timer(uv_timer_t *t)
{
    bill_shipper_t *s = t->data;
    if (s->refused) { /* read the cursor again: an operator may have resolved it */
        const char *av[2] = {"GET", s->cursor_key};
        size_t al[2] = {3, strlen(s->cursor_key)};
        if (bill_redis_send(s->rc, 0, on_cursor, s, 2, av, al) != 0)
            schedule(s, s->p.retry_max_ms);
        return;
    }
    pump(s);
}

/* Something is wrong with what Redis answered: drop the connection; the reconnect re-reads the
 * cursor (redisconn calls on_down, then on_up). */
static void fail_conn(bill_shipper_t *s, const char *why)
{
    s->ready = false;
    bill_redis_reconnect(s->rc, why);
}

static void on_down(bill_redis_t *rc, const char *reason, void *ud)
{
    bill_shipper_t *s = ud;
    (void)rc;
    (void)reason; /* redisconn logged it */
    s->ready = false;
    s->st.connected = false;
    if (!s->working) /* else the worker thread owns the batch until after_read */
        s->n_batch = s->n_acked = 0;
    s->reader_reset = true;
}

/* A reply to one of the setup commands or a shipping call. status < 0: the connection went away
 * (on_down follows and resets). */
static bool reply_ok(bill_shipper_t *s, redisReply *r, int status, const char *what)
{
    if (status != 0 || s->stopping)
        return false;
    if (r->type == REDIS_REPLY_ERROR) {
        s->st.n_errors++;
        PC_LOG(PC_LOG_WARN, "shipper", "Redis %s failed: %s", what, r->str);
        fail_conn(s, "an error reply");
        return false;
    }
    return true;
}

static void on_script(bill_redis_t *rc, redisReply *r, int status, void *priv)
{
    bill_shipper_t *s = priv;
    (void)rc;
    if (reply_ok(s, r, status, "SCRIPT LOAD") && r->type == REDIS_REPLY_STRING && r->len < 48) {
        memcpy(s->sha, r->str, r->len);
        s->sha[r->len] = '\0';
    }
}

/* SADD PREFIX:gws INSTANCE, answered before the cursor (replies come in order): nothing is
 * shipped on a connection before the instance is listed where exports and verify look. */
static void on_listed(bill_redis_t *rc, redisReply *r, int status, void *priv)
{
    bill_shipper_t *s = priv;
    (void)rc;
    if (reply_ok(s, r, status, "SADD instances") && r->type == REDIS_REPLY_INTEGER)
        s->listed = true;
}

static void on_cursor(bill_redis_t *rc, redisReply *r, int status, void *priv)
{
    bill_shipper_t *s = priv;
    (void)rc;
    if (!reply_ok(s, r, status, "GET cursor"))
        return;
    if (!s->listed) {
        fail_conn(s, "the instance is not listed in PREFIX:gws");
        return;
    }
    uint64_t v = 0;
    const char *owner = NULL; /* the cursor's ledger id; NULL: none (written before ids) */
    if (r->type == REDIS_REPLY_STRING) {
        char *end;
        v = strtoull(r->str, &end, 10);
        if (*end == ' ' && strlen(end + 1) == BILL_LEDGER_ID_LEN)
            owner = end + 1;
        else if (*end != '\0' || r->str[0] < '0' || r->str[0] > '9') {
            PC_LOG(PC_LOG_ERROR, "shipper", "bad cursor '%.100s' in %s", r->str, s->cursor_key);
            fail_conn(s, "a bad cursor");
            return;
        }
    }
    if (s->sha[0] == '\0') {
        fail_conn(s, "no script sha");
        return;
    }
    /* The cursor must be this ledger's: another ledger's (a gateway replaced on a fresh disk
     * under the same instance id) would make us skip our first records, or ship them over the
     * old ones. One beyond our durable end cannot be ours either (or the ledger lost records). */
    uint64_t end_seq = s->p.durable_seq != NULL ? s->p.durable_seq(s->p.durable_ud) : UINT64_MAX;
    bool other = owner != NULL && strcmp(owner, s->ledger_id) != 0;
    if (other || v > end_seq) {
        if (!s->refused)
            PC_LOG(PC_LOG_ERROR, "shipper",
                   "refusing to ship %s: %s is %s, but this ledger (%s, LEDGER_ID %s) %s; nothing "
                   "is shipped until that is resolved: give this gateway a new "
                   "billing.instance_id (a fresh ledger needs its own), or, if this is the "
                   "same ledger restored, check it and its stream in Redis",
                   s->instance, s->cursor_key, r->str, s->dir, s->ledger_id,
                   other ? "is not the ledger that shipped to it"
                         : "ends before it (records lost, or another ledger's cursor)");
        s->refused = true;
        s->st.refused = true;
        s->st.connected = true;
        schedule(s, s->p.retry_max_ms);
        return;
    }
    if (s->refused)
        PC_LOG(PC_LOG_INFO, "shipper", "%s is this ledger's again: shipping", s->cursor_key);
    s->refused = false;
    s->st.refused = false;
    s->cursor = v;
    s->st.shipped_seq = v;
    s->ready = true;
    s->st.connected = true;
    s->st.n_connects++;
    s->reader_reset = true;
    PC_LOG(PC_LOG_INFO, "shipper", "shipping %s from seq %" PRIu64, s->instance, v + 1);
    pump(s);
}

/* A new connection: load the script, list the instance in PREFIX:gws, read the cursor
 * (pipelined). */
static void on_up(bill_redis_t *rc, void *ud)
{
    bill_shipper_t *s = ud;
    s->sha[0] = '\0';
    s->listed = false;
    const char *av1[3] = {"SCRIPT", "LOAD", ship_script};
    size_t al1[3] = {6, 4, sizeof ship_script - 1};
    const char *av3[3] = {"SADD", s->gws_key, s->instance};
    size_t al3[3] = {4, strlen(s->gws_key), strlen(s->instance)};
    const char *av2[2] = {"GET", s->cursor_key};
    size_t al2[2] = {3, strlen(s->cursor_key)};
    if (bill_redis_send(rc, 0, on_script, s, 3, av1, al1) != 0 ||
        bill_redis_send(rc, 0, on_listed, s, 3, av3, al3) != 0 ||
        bill_redis_send(rc, 0, on_cursor, s, 2, av2, al2) != 0)
        fail_conn(s, "cannot send the setup commands");
}

/* ---------------------------------------------------------------------------------------------
 * Reading the ledger (thread pool) and shipping a batch
 * ------------------------------------------------------------------------------------------- */

static void work_read(uv_work_t *w)
{
    bill_shipper_t *s = w->data;
    s->work_rc = 0;
    s->n_batch = 0;
    if (s->reader_reset || s->reader == NULL) {
        bill_ledger_reader_free(s->reader);
        s->reader = NULL;
        s->work_rc = bill_ledger_reader_open(s->dir, s->work_from, &s->reader, s->work_err,
                                             sizeof s->work_err);
        if (s->work_rc != 0)
            return;
        s->reader_next = s->work_from;
    }
    while (s->n_batch < s->p.batch && s->reader_next <= s->work_limit) {
        uint64_t seq;
        int rc = bill_ledger_reader_next(s->reader, &s->evs[s->n_batch], &seq, s->work_err,
                                         sizeof s->work_err);
        if (rc != 0) {
            s->work_rc = rc < 0 ? rc : 0;
            break;
        }
        s->seqs[s->n_batch++] = seq;
        s->reader_next = seq + 1;
    }
}

static void finish_close(bill_shipper_t *s);

static void on_reply(bill_redis_t *rc, redisReply *r, int status, void *priv)
{
    bill_shipper_t *s = priv;
    (void)rc;
    if (!s->ready || !reply_ok(s, r, status, "shipping script"))
        return;
    if (s->n_acked >= s->n_batch)
        return;
    if (r->type == REDIS_REPLY_INTEGER && r->integer == 1)
        s->st.n_shipped++;
    else
        s->st.n_replayed++;
    s->cursor = s->seqs[s->n_acked++];
    s->st.shipped_seq = s->cursor;
    if (s->n_acked == s->n_batch) {
        s->n_batch = s->n_acked = 0;
        pump(s);
    }
}

static void send_event(bill_shipper_t *s, const bill_event_t *ev, uint64_t seq)
{
    char day[16], usage_key[512], nums[48][24], cost_names[BILL_BUCKET_COUNT][40];
    const char *argv[128];
    size_t argl[128];
    int n = 0, k = 0;
#define ARG(str) (argv[n] = (str), argl[n] = strlen(argv[n]), n++)
#define NUM(v) (snprintf(nums[k], sizeof nums[k], "%" PRIu64, (uint64_t)(v)), ARG(nums[k++]))
    bill_day_str(ev->start_ms, day);
    snprintf(usage_key, sizeof usage_key, "%s%s:%s", s->usage_prefix, ev->tenant, day);
    const uint64_t q[BILL_BUCKET_COUNT] = {ev->usage.n_uncached, ev->usage.n_write_5m,
                                           ev->usage.n_write_1h, ev->usage.n_read,
                                           ev->usage.n_output,   ev->token_ms};
    ARG("EVALSHA");
    ARG(s->sha);
    ARG("4");
    ARG(s->stream_key);
    ARG(s->cursor_key);
    ARG(usage_key);
    ARG(s->keys_key);
    for (int b = 0; b < BILL_BUCKET_COUNT; b++)
        snprintf(cost_names[b], sizeof cost_names[b], "cost_%s_nusd", bill_bucket_name(b));
    char seq_id[24 + BILL_LEDGER_ID_LEN];
    snprintf(seq_id, sizeof seq_id, "%" PRIu64 " %s", seq, s->ledger_id);
    ARG(seq_id);
    NUM(14 + 2 * BILL_BUCKET_COUNT + 1);
    ARG("event_id");
    ARG(ev->event_id);
    ARG("kind");
    ARG(ev->kind == BILL_EVENT_STORAGE ? "storage" : "usage");
    ARG("status");
    ARG(ev->kind == BILL_EVENT_USAGE ? bill_status_name(ev->status) : "");
    ARG("tenant");
    ARG(ev->tenant);
    ARG("model");
    ARG(ev->model);
    ARG("day");
    ARG(day);
    ARG("request_id");
    ARG(ev->request_id);
    ARG("api_key_id");
    ARG(ev->api_key_id);
    ARG("start_ms");
    NUM(ev->start_ms);
    ARG("end_ms");
    NUM(ev->end_ms);
    for (int b = 0; b < BILL_BUCKET_COUNT; b++) {
        ARG(bill_bucket_name(b));
        NUM(q[b]);
    }
    ARG("cost_nusd");
    NUM(bill_event_total_nusd(ev));
    /* What a merged export needs to rebuild the event exactly (bill_export over Redis). */
    ARG("registry");
    ARG(bill_registry_name(ev->registry));
    ARG("ns");
    ARG(ev->ns);
    ARG("hit_logical");
    NUM(ev->n_hit_logical);
    ARG("hit_physical");
    NUM(ev->n_hit_physical);
    for (int b = 0; b < BILL_BUCKET_COUNT; b++) {
        ARG(cost_names[b]);
        NUM(ev->cost_nusd[b]);
    }
    /* Counter increments. */
    ARG("events");
    ARG("1");
    ARG("cost_nusd");
    NUM(bill_event_total_nusd(ev));
    for (int b = 0; b < BILL_BUCKET_COUNT; b++) {
        ARG(bill_bucket_name(b));
        NUM(q[b]);
        ARG(cost_names[b]);
        NUM(ev->cost_nusd[b]);
    }
#undef ARG
#undef NUM
    /* Each reply within the batch deadline; a miss drops the connection (redisconn). A refused
     * send means the connection is going down: on_down resets the batch. */
    if (bill_redis_send(s->rc, s->p.timeout_ms, on_reply, s, n, argv, argl) != 0)
        fail_conn(s, "cannot send");
}

static void after_read(uv_work_t *w, int status)
{
    bill_shipper_t *s = w->data;
    s->working = false;
    if (s->stopping) {
        finish_close(s);
        return;
    }
    if (s->work_rc < 0) {
        s->st.n_errors++;
        PC_LOG(PC_LOG_ERROR, "shipper", "cannot read the ledger: %s", s->work_err);
        s->reader_reset = true;
        schedule(s, s->p.retry_max_ms);
        return;
    }
    if (!s->ready) { /* the connection went away meanwhile: the reconnect restarts the reader */
        s->n_batch = 0;
        s->reader_reset = true;
        return;
    }
    s->reader_reset = false;
    if (s->n_batch == 0) {
        schedule(s, s->p.poll_ms);
        return;
    }
    s->n_acked = 0;
    for (size_t i = 0; i < s->n_batch && s->ready; i++)
        send_event(s, &s->evs[i], s->seqs[i]);
}

static void pump(bill_shipper_t *s)
{
    if (!s->ready || s->working || s->n_batch > 0 || s->stopping)
        return;
    uint64_t limit = s->p.durable_seq != NULL ? s->p.durable_seq(s->p.durable_ud) : UINT64_MAX;
    uint64_t from = s->cursor + 1;
    if (!s->reader_reset && s->reader != NULL)
        from = s->reader_next;
    if (from > limit) {
        schedule(s, s->p.poll_ms);
        return;
    }
    s->work_from = s->cursor + 1;
    s->work_limit = limit;
    s->working = true;
    s->work.data = s;
    if (uv_queue_work(s->loop, &s->work, work_read, after_read) != 0) {
        s->working = false;
        schedule(s, s->p.poll_ms);
    }
}

void bill_shipper_kick(bill_shipper_t *s)
{
    if (s != NULL && s->ready && !s->working && s->n_batch == 0)
        pump(s);
}

void bill_shipper_stats(const bill_shipper_t *s, bill_shipper_stats_t *out)
{
    *out = s->st;
    bill_redis_stats_t rs;
    bill_redis_stats(s->rc, &rs);
    out->n_timeouts += rs.n_timeouts;
    out->n_errors += rs.n_errors;
}

/* ---------------------------------------------------------------------------------------------
 * Lifecycle
 * ------------------------------------------------------------------------------------------- */

static void shipper_free(bill_shipper_t *s)
{
    bill_ledger_reader_free(s->reader);
    pc_free(s->evs);
    pc_free(s->seqs);
    pc_free(s->dir);
    pc_free(s);
}

int bill_shipper_start(uv_loop_t *loop, const bill_shipper_params_t *p, bill_shipper_t **out,
                       char *err, size_t err_len)
{
    *out = NULL;
    if (loop == NULL || p == NULL || p->ledger_dir == NULL ||
        (p->conn == NULL && (p->port <= 0 || p->port > 65535 || p->timeout_ms == 0)) ||
        p->batch == 0)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "shipper: ledger_dir, a port, batch > 0 and timeout_ms > 0 are needed");
    bill_redis_params_t rp;
    if (p->conn != NULL) {
        rp = *p->conn;
    } else {
        rp = bill_redis_params_default();
        if (p->host != NULL && snprintf(rp.address.host, sizeof rp.address.host, "%s", p->host) >=
                                   (int)sizeof rp.address.host)
            return pc_err_setf(err, err_len, PC_ERR_INVAL, "shipper: host name too long");
        rp.address.port = p->port;
        rp.password = p->password;
        rp.timeout_ms = p->timeout_ms;
    }
    rp.retry_min_ms = p->retry_min_ms;
    rp.retry_max_ms = p->retry_max_ms;
    rp.name = "shipper";
    int rc = bill_redis_params_check(&rp, err, err_len);
    if (rc != 0)
        return rc;
    bill_shipper_t *s = pc_calloc(1, sizeof *s);
    if (s == NULL)
        return PC_ERR_NOMEM;
    s->loop = loop;
    s->p = *p;
    s->p.conn = NULL;
    s->p.timeout_ms = rp.timeout_ms;
    s->dir = pc_strdup(p->ledger_dir);
    s->evs = pc_calloc(p->batch, sizeof *s->evs);
    s->seqs = pc_calloc(p->batch, sizeof *s->seqs);
    if (s->dir == NULL || s->evs == NULL || s->seqs == NULL) {
        shipper_free(s);
        return PC_ERR_NOMEM;
    }
    if (p->instance != NULL) {
        if (bill_event_set_str(s->instance, p->instance) != 0 || s->instance[0] == '\0') {
            shipper_free(s);
            return pc_err_setf(err, err_len, PC_ERR_INVAL, "shipper: bad instance id");
        }
    } else {
        char inst[BILL_STR_MAX];
        if (bill_ledger_read_instance(p->ledger_dir, inst) != 0) {
            shipper_free(s);
            return pc_err_setf(err, err_len, PC_ERR_NOTFOUND,
                               "shipper: no INSTANCE in %s (open the ledger first)", p->ledger_dir);
        }
        memcpy(s->instance, inst, sizeof s->instance);
    }
    if (bill_ledger_read_id(p->ledger_dir, s->ledger_id) != 0) {
        shipper_free(s);
        return pc_err_setf(err, err_len, PC_ERR_NOTFOUND,
                           "shipper: no LEDGER_ID in %s (open the ledger first)", p->ledger_dir);
    }
    const char *prefix = p->prefix != NULL ? p->prefix : "kvgw";
    snprintf(s->stream_key, sizeof s->stream_key, "%s:ledger:%s", prefix, s->instance);
    snprintf(s->cursor_key, sizeof s->cursor_key, "%s:cursor:%s", prefix, s->instance);
    snprintf(s->keys_key, sizeof s->keys_key, "%s:usage_keys", prefix);
    snprintf(s->gws_key, sizeof s->gws_key, "%s:gws", prefix);
    snprintf(s->usage_prefix, sizeof s->usage_prefix, "%s:usage:", prefix);
    if (s->p.retry_max_ms == 0)
        s->p.retry_max_ms = 5000;
    rp.on_up = on_up;
    rp.on_down = on_down;
    rp.ud = s;
    rc = bill_redis_start(loop, &rp, &s->rc, err, err_len);
    if (rc != 0) {
        shipper_free(s);
        return rc;
    }
    s->rc_open = true;
    uv_timer_init(loop, &s->timer);
    s->timer.data = s;
    s->handles_open = 1;
    s->reader_reset = true;
    *out = s;
    return 0;
}

static void on_rc_closed(void *ud)
{
    bill_shipper_t *s = ud;
    s->rc_open = false;
    finish_close(s);
}

static void on_handle_closed(uv_handle_t *h)
{
    bill_shipper_t *s = h->data;
    if (--s->handles_open == 0)
        finish_close(s);
}

static void finish_close(bill_shipper_t *s)
{
    if (s->handles_open > 0 || s->working || s->rc_open)
        return;
    void (*cb)(void *) = s->on_closed;
    void *ud = s->closed_ud;
    shipper_free(s);
    if (cb != NULL)
        cb(ud);
}

void bill_shipper_stop(bill_shipper_t *s, void (*on_closed)(void *ud), void *ud)
{
    if (s == NULL || s->stopping)
        return;
    s->stopping = true;
    s->on_closed = on_closed;
    s->closed_ud = ud;
    s->ready = false;
    bill_redis_stop(s->rc, on_rc_closed, s);
    uv_timer_stop(&s->timer);
    uv_close((uv_handle_t *)&s->timer, on_handle_closed);
}
