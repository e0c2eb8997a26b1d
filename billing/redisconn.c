/*
 * redisconn.c — the Sentinel-aware Redis connection (contract in redisconn.h).
 *
 * One attempt = (with sentinels) ask sentinel i for the primary's address on a short-lived
 * context, then connect to the primary and pipeline [AUTH] [ROLE] PING as setup commands; the
 * PING's reply makes the connection up. Every command, setup or user, is an op in one list with a
 * deadline; one timer watches the earliest deadline. Any failure (a missed deadline, a lost or
 * refused connection, an AUTH or ROLE refusal, READONLY/LOADING/MASTERDOWN) marks the connection
 * failing at once (sends are refused) and the drop itself runs from a 0 ms timer, never from
 * inside a hiredis callback: the drop frees the contexts (hiredis calls every pending op back
 * with a NULL reply: the op fails with the drop's status), reports on_down if the connection was
 * up, and schedules the next attempt: the next sentinel at once while this round has untried
 * ones, else after the backoff.
 */
#include "redisconn.h"
#include "common.h"

#include <errno.h>
#include <hiredis/async.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

enum conn_state {
    ST_IDLE,     /* waiting for the next attempt */
    ST_SENTINEL, /* asking a sentinel */
    ST_PRIMARY,  /* connecting to the primary, setup commands in flight */
    ST_UP,
    ST_FAILING, /* a failure is noted; the drop runs from the kick timer */
    ST_STOPPED,
};

typedef struct rc_op {
    struct rc_op *prev, *next;
    bill_redis_t *c;
    bill_redis_cb cb;
    void *priv;
    uint64_t deadline; /* uv_now ms */
} rc_op_t;

struct bill_redis {
    uv_loop_t *loop;
    bill_redis_params_t p;
    bill_redis_addr_t *sentinels;
    char *master_name, *password, *sentinel_password, *name;

    enum conn_state state;
    redisAsyncContext *ac;    /* the primary */
    redisAsyncContext *sac;   /* a sentinel being asked */
    bill_redis_addr_t target; /* the primary of this attempt */
    size_t sentinel_idx;      /* the sentinel to ask next (the last good one first) */
    size_t round_tries;       /* attempts in this round of sentinels */
    bool was_up;              /* this attempt's connection reached up (on_down owed) */
    int drop_status;          /* the status pending ops get while a context is freed */
    int fail_status;
    char fail_reason[256];

    rc_op_t ops; /* sentinel of the list, oldest first */
    uint64_t n_ops;

    /* With sentinels, while up: a subscription to the sentinels' +switch-master (wac) and a
     * connection for the periodic SENTINEL get-master-addr-by-name (qac), both to sentinel
     * watch_idx (the one that named the primary; the next one when it fails). A primary they
     * name that differs from ours is the next attempt's target (hint), ROLE-checked as usual. */
    redisAsyncContext *wac, *qac;
    size_t watch_idx;
    bool q_inflight;
    bill_redis_addr_t hint; /* port 0: none */

    uv_timer_t retry_timer; /* the next attempt (backoff) */
    uv_timer_t kick_timer;  /* the deferred drop */
    uv_timer_t dl_timer;    /* the earliest op deadline */
    uv_timer_t role_timer;  /* periodic ROLE with sentinels */
    uint64_t dl_armed_at;   /* 0: dl_timer not armed */
    uint32_t retry_ms;
    int handles_open;

    bill_redis_stats_t st;
    void (*on_closed)(void *ud);
    void *closed_ud;
};

bill_redis_params_t bill_redis_params_default(void)
{
    bill_redis_params_t p = {
        .timeout_ms = 2000,
        .retry_min_ms = 100,
        .retry_max_ms = 5000,
        .role_check_ms = 1000,
        .name = "redis",
    };
    snprintf(p.address.host, sizeof p.address.host, "127.0.0.1");
    p.address.port = 6379;
    return p;
}

static bool addr_ok(const bill_redis_addr_t *a)
{
    return a->host[0] != '\0' && memchr(a->host, '\0', sizeof a->host) != NULL && a->port > 0 &&
           a->port <= 65535;
}

int bill_redis_params_check(const bill_redis_params_t *p, char *err, size_t err_len)
{
    if (p == NULL)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "redis: no parameters");
    if (p->timeout_ms == 0)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "redis: timeout must be > 0");
    if (p->n_sentinels > BILL_REDIS_MAX_SENTINELS)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "redis: at most %d sentinels",
                           BILL_REDIS_MAX_SENTINELS);
    if (p->n_sentinels > 0) {
        if (p->sentinels == NULL || p->master_name == NULL || p->master_name[0] == '\0')
            return pc_err_setf(err, err_len, PC_ERR_INVAL, "redis: sentinels need a master_name");
        if (strlen(p->master_name) > 255 || strpbrk(p->master_name, " \r\n") != NULL)
            return pc_err_setf(err, err_len, PC_ERR_INVAL, "redis: bad master_name");
        for (size_t i = 0; i < p->n_sentinels; i++)
            if (!addr_ok(&p->sentinels[i]))
                return pc_err_setf(err, err_len, PC_ERR_INVAL, "redis: sentinel %zu: bad address",
                                   i + 1);
    } else if (!addr_ok(&p->address)) {
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "redis: bad address (host:port)");
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Ops and deadlines
 * ------------------------------------------------------------------------------------------- */

static void fail_soon(bill_redis_t *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void on_dl_timer(uv_timer_t *t);
static void start_attempt(bill_redis_t *c);
static void watch_close(bill_redis_t *c);
static void watch_open(bill_redis_t *c);
static void on_retry_timer(uv_timer_t *t)
{
    start_attempt(t->data);
}

static void op_unlink(bill_redis_t *c, rc_op_t *op)
{
    op->prev->next = op->next;
    op->next->prev = op->prev;
    c->n_ops--;
}

static void arm_deadline(bill_redis_t *c, uint64_t at)
{
    if (c->state == ST_STOPPED)
        return;
    if (c->dl_armed_at != 0 && c->dl_armed_at <= at)
        return;
    uint64_t now = uv_now(c->loop);
    c->dl_armed_at = at;
    uv_timer_start(&c->dl_timer, on_dl_timer, at > now ? at - now : 0, 0);
}

static void on_dl_timer(uv_timer_t *t)
{
    bill_redis_t *c = t->data;
    c->dl_armed_at = 0;
    uint64_t now = uv_now(c->loop), next = 0;
    for (rc_op_t *op = c->ops.next; op != &c->ops; op = op->next) {
        if (op->deadline <= now) {
            if (c->state != ST_FAILING)
                c->st.n_timeouts++;
            fail_soon(c, PC_ERR_TIMEOUT, "a command had no reply by its deadline (%s)",
                      c->state == ST_UP ? "connected" : "connecting");
            return;
        }
        if (next == 0 || op->deadline < next)
            next = op->deadline;
    }
    if (next != 0)
        arm_deadline(c, next);
}

static bool is_demotion_error(const redisReply *r)
{
    return r->type == REDIS_REPLY_ERROR && r->str != NULL &&
           (strncmp(r->str, "READONLY", 8) == 0 || strncmp(r->str, "LOADING", 7) == 0 ||
            strncmp(r->str, "MASTERDOWN", 10) == 0);
}

/* Every op's hiredis callback. reply == NULL: its context is being freed (by us: drop_status;
 * by hiredis, the connection lost: CLOSED). */
static void on_op_reply(redisAsyncContext *ac, void *reply, void *privdata)
{
    rc_op_t *op = privdata;
    bill_redis_t *c = op->c;
    redisReply *r = reply;
    op_unlink(c, op);
    int status = 0;
    if (r == NULL) {
        status = c->drop_status != 0 ? c->drop_status : PC_ERR_CLOSED;
        if (ac == c->ac && c->state != ST_FAILING && c->state != ST_STOPPED)
            fail_soon(c, PC_ERR_CLOSED, "connection lost");
    } else if (is_demotion_error(r) && ac == c->ac && c->state == ST_UP) {
        c->st.n_demotions++;
        fail_soon(c, PC_ERR_CLOSED, "the server cannot take writes: %.80s", r->str);
    }
    bill_redis_cb cb = op->cb;
    void *priv = op->priv;
    pc_free(op);
    cb(c, r, status, priv);
}

static int send_on(bill_redis_t *c, redisAsyncContext *ac, uint32_t deadline_ms, bill_redis_cb cb,
                   void *priv, int argc, const char **argv, const size_t *argvlen)
{
    rc_op_t *op = pc_calloc(1, sizeof *op);
    if (op == NULL)
        return PC_ERR_NOMEM;
    op->c = c;
    op->cb = cb;
    op->priv = priv;
    op->deadline = uv_now(c->loop) + (deadline_ms != 0 ? deadline_ms : c->p.timeout_ms);
    if (redisAsyncCommandArgv(ac, on_op_reply, op, argc, argv, argvlen) != REDIS_OK) {
        pc_free(op);
        return PC_ERR_UPSTREAM;
    }
    op->prev = c->ops.prev;
    op->next = &c->ops;
    c->ops.prev->next = op;
    c->ops.prev = op;
    c->n_ops++;
    arm_deadline(c, op->deadline);
    return 0;
}

int bill_redis_send(bill_redis_t *c, uint32_t deadline_ms, bill_redis_cb cb, void *priv, int argc,
                    const char **argv, const size_t *argvlen)
{
    if (c == NULL || cb == NULL || argc <= 0 || argv == NULL || argvlen == NULL)
        return PC_ERR_INVAL;
    if (c->state != ST_UP || c->ac == NULL)
        return PC_ERR_UPSTREAM;
    return send_on(c, c->ac, deadline_ms, cb, priv, argc, argv, argvlen);
}

bool bill_redis_is_up(const bill_redis_t *c)
{
    return c != NULL && c->state == ST_UP;
}

void bill_redis_stats(const bill_redis_t *c, bill_redis_stats_t *out)
{
    *out = c->st;
    out->up = c->state == ST_UP;
    out->n_pending = c->n_ops;
}

/* ---------------------------------------------------------------------------------------------
 * Failing and dropping
 * ------------------------------------------------------------------------------------------- */

static void on_kick(uv_timer_t *t);

static void fail_soon(bill_redis_t *c, int status, const char *fmt, ...)
{
    if (c->state == ST_FAILING || c->state == ST_STOPPED || c->state == ST_IDLE)
        return;
    c->state = ST_FAILING;
    c->fail_status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->fail_reason, sizeof c->fail_reason, fmt, ap);
    va_end(ap);
    uv_timer_start(&c->kick_timer, on_kick, 0, 0);
}

/* Frees a context we own; its pending ops are called back with status. */
static void free_ctx(bill_redis_t *c, redisAsyncContext **slot, int status)
{
    redisAsyncContext *ac = *slot;
    *slot = NULL;
    if (ac == NULL)
        return;
    int saved = c->drop_status;
    c->drop_status = status;
    redisAsyncFree(ac);
    c->drop_status = saved;
}

static void schedule_attempt(bill_redis_t *c)
{
    c->round_tries++;
    size_t n = c->p.n_sentinels > 0 ? c->p.n_sentinels : 1;
    if (c->p.n_sentinels > 0)
        c->sentinel_idx = (c->sentinel_idx + 1) % c->p.n_sentinels;
    uint32_t delay = 0;
    if (c->round_tries >= n) { /* every sentinel (or the one address) failed: back off */
        c->round_tries = 0;
        delay = c->retry_ms;
        c->retry_ms = c->retry_ms * 2 > c->p.retry_max_ms ? c->p.retry_max_ms : c->retry_ms * 2;
    }
    uv_timer_start(&c->retry_timer, on_retry_timer, delay, 0);
}

static void drop(bill_redis_t *c)
{
    bool was_up = c->was_up;
    int status = c->fail_status != 0 ? c->fail_status : PC_ERR_CLOSED;
    c->state = ST_IDLE;
    c->was_up = false;
    uv_timer_stop(&c->role_timer);
    watch_close(c);
    free_ctx(c, &c->sac, status);
    free_ctx(c, &c->ac, status);
    PC_LOG(was_up ? PC_LOG_WARN : PC_LOG_INFO, c->name, "Redis %s:%d: %s%s", c->target.host,
           c->target.port, c->fail_reason, was_up ? "; reconnecting" : "");
    if (was_up && c->p.on_down != NULL)
        c->p.on_down(c, c->fail_reason, c->p.ud);
    if (c->state != ST_IDLE) /* on_down stopped us or asked for something else */
        return;
    if (was_up) { /* a lost connection: ask the same sentinel first, at once */
        c->round_tries = 0;
        uv_timer_start(&c->retry_timer, on_retry_timer, 0, 0);
    } else {
        schedule_attempt(c);
    }
}

static void on_kick(uv_timer_t *t)
{
    bill_redis_t *c = t->data;
    if (c->state == ST_FAILING)
        drop(c);
}

static void side_lost(bill_redis_t *c, const redisAsyncContext *ac, const char *why);

static void on_ctx_disconnect(const redisAsyncContext *ac, int status)
{
    bill_redis_t *c = ac->data;
    (void)status;
    if (ac == c->wac || ac == c->qac) {
        side_lost(c, ac, ac->errstr[0] ? ac->errstr : "closed");
        return;
    }
    if (ac == c->ac)
        c->ac = NULL; /* hiredis frees it after this callback */
    else if (ac == c->sac)
        c->sac = NULL;
    else
        return;
    c->st.n_errors++;
    fail_soon(c, PC_ERR_CLOSED, "connection lost: %s", ac->errstr[0] ? ac->errstr : "closed");
}

static void on_ctx_connect(const redisAsyncContext *ac, int status)
{
    bill_redis_t *c = ac->data;
    if (status == REDIS_OK)
        return;
    if (ac == c->wac || ac == c->qac) {
        side_lost(c, ac, ac->errstr);
        return;
    }
    /* hiredis frees the context after this callback */
    if (ac == c->ac)
        c->ac = NULL;
    else if (ac == c->sac)
        c->sac = NULL;
    else
        return;
    c->st.n_errors++;
    fail_soon(c, PC_ERR_CLOSED, "cannot connect: %s", ac->errstr);
}

/* ---------------------------------------------------------------------------------------------
 * The libuv event adapter
 *
 * hiredis's own (hiredis/adapters/libuv.h, 0.14) returns without a word when libuv reports an
 * error: libuv turns POLLERR (a connection reset: the server closed with our commands unread in
 * its socket; a refused connect) into UV_EBADF after stopping the poll handle, so such a socket
 * went unseen until a command's deadline, while a clean close (FIN) was seen at once. This one is
 * that adapter with the error handled: the connection fails at once with the socket's error.
 * ------------------------------------------------------------------------------------------- */

typedef struct rc_ev {
    redisAsyncContext *ac; /* NULL once hiredis cleaned up (the handle is closing) */
    uv_poll_t handle;
    int events;
} rc_ev_t;

static void ev_poll(uv_poll_t *h, int status, int events)
{
    rc_ev_t *p = h->data;
    if (p->ac == NULL)
        return;
    if (status != 0) {
        bill_redis_t *c = p->ac->data;
        int e = 0;
        socklen_t len = sizeof e;
        if (getsockopt(p->ac->c.fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0 || e == 0)
            e = ECONNRESET;
        if (p->ac == c->wac || p->ac == c->qac) {
            side_lost(c, NULL, strerror(e));
            return;
        }
        if (p->ac != c->ac && p->ac != c->sac)
            return;
        c->st.n_errors++;
        fail_soon(c, PC_ERR_CLOSED, "%s: %s",
                  c->state == ST_UP ? "connection lost" : "cannot connect", strerror(e));
        return;
    }
    if (events & UV_READABLE)
        redisAsyncHandleRead(p->ac);
    if (p->ac != NULL && (events & UV_WRITABLE))
        redisAsyncHandleWrite(p->ac);
}

static void ev_update(rc_ev_t *p, int add, int del)
{
    p->events = (p->events | add) & ~del;
    if (p->events != 0)
        uv_poll_start(&p->handle, p->events, ev_poll);
    else
        uv_poll_stop(&p->handle);
}

static void ev_add_read(void *d)
{
    ev_update(d, UV_READABLE, 0);
}

static void ev_del_read(void *d)
{
    ev_update(d, 0, UV_READABLE);
}

static void ev_add_write(void *d)
{
    ev_update(d, UV_WRITABLE, 0);
}

static void ev_del_write(void *d)
{
    ev_update(d, 0, UV_WRITABLE);
}

static void ev_closed(uv_handle_t *h)
{
    pc_free(h->data);
}

static void ev_cleanup(void *d)
{
    rc_ev_t *p = d;
    p->ac = NULL;
    uv_close((uv_handle_t *)&p->handle, ev_closed);
}

static int ev_attach(redisAsyncContext *ac, uv_loop_t *loop)
{
    if (ac->ev.data != NULL)
        return REDIS_ERR;
    rc_ev_t *p = pc_calloc(1, sizeof *p);
    if (p == NULL)
        return REDIS_ERR;
    if (uv_poll_init(loop, &p->handle, ac->c.fd) != 0) {
        pc_free(p);
        return REDIS_ERR;
    }
    p->handle.data = p;
    p->ac = ac;
    ac->ev.addRead = ev_add_read;
    ac->ev.delRead = ev_del_read;
    ac->ev.addWrite = ev_add_write;
    ac->ev.delWrite = ev_del_write;
    ac->ev.cleanup = ev_cleanup;
    ac->ev.data = p;
    return REDIS_OK;
}

/* Attaches ac (just opened) to c's loop with c's connect and disconnect callbacks; frees it when
 * that fails. */
static int attach_ctx(bill_redis_t *c, redisAsyncContext *ac)
{
    ac->data = c;
    if (ev_attach(ac, c->loop) != REDIS_OK) {
        redisAsyncFree(ac);
        return REDIS_ERR;
    }
    redisAsyncSetConnectCallback(ac, on_ctx_connect);
    redisAsyncSetDisconnectCallback(ac, on_ctx_disconnect);
    return REDIS_OK;
}

/* A sentinel side connection (wac, qac): NULL when it cannot even start (retried at the next
 * check); its failures never touch the primary's connection. */
static redisAsyncContext *open_side(bill_redis_t *c, const bill_redis_addr_t *a)
{
    redisAsyncContext *ac = redisAsyncConnect(a->host, a->port);
    if (ac == NULL || ac->err) {
        if (ac != NULL)
            redisAsyncFree(ac);
        return NULL;
    }
    return attach_ctx(c, ac) == REDIS_OK ? ac : NULL;
}

static redisAsyncContext *open_ctx(bill_redis_t *c, const bill_redis_addr_t *a)
{
    redisAsyncContext *ac = redisAsyncConnect(a->host, a->port);
    if (ac == NULL || ac->err) {
        c->st.n_errors++;
        if (c->state != ST_FAILING)
            fail_soon(c, PC_ERR_CLOSED, "cannot connect to %s:%d: %s", a->host, a->port,
                      ac != NULL ? ac->errstr : "out of memory");
        if (ac != NULL)
            redisAsyncFree(ac);
        return NULL;
    }
    if (attach_ctx(c, ac) != REDIS_OK) {
        fail_soon(c, PC_ERR_NOMEM, "cannot attach to the loop");
        return NULL;
    }
    return ac;
}

/* ---------------------------------------------------------------------------------------------
 * An attempt: sentinel, primary, setup
 * ------------------------------------------------------------------------------------------- */

static void on_role_timer(uv_timer_t *t);

static bool role_is_master(const redisReply *r)
{
    return r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
           r->element[0]->type == REDIS_REPLY_STRING && strcmp(r->element[0]->str, "master") == 0;
}

static void on_setup_reply(bill_redis_t *c, redisReply *r, int status, void *priv)
{
    const char *what = priv;
    if (status != 0 || c->state != ST_PRIMARY)
        return;
    if (r->type == REDIS_REPLY_ERROR) {
        c->st.n_errors++;
        fail_soon(c, strcmp(what, "AUTH") == 0 ? PC_ERR_PERM : PC_ERR_UPSTREAM,
                  "%s refused: %.100s", what, r->str);
        return;
    }
    if (strcmp(what, "ROLE") == 0 && !role_is_master(r)) {
        c->st.n_demotions++;
        fail_soon(c, PC_ERR_UPSTREAM, "not a master (a replica or a demoted primary)");
        return;
    }
    if (strcmp(what, "PING") != 0)
        return;
    /* Up. */
    c->state = ST_UP;
    c->was_up = true;
    c->round_tries = 0;
    c->retry_ms = c->p.retry_min_ms;
    c->st.n_connects++;
    if (c->st.primary.port != 0 &&
        (c->st.primary.port != c->target.port || strcmp(c->st.primary.host, c->target.host) != 0)) {
        c->st.n_failovers++;
        PC_LOG(PC_LOG_WARN, c->name, "Redis primary changed: %s:%d -> %s:%d", c->st.primary.host,
               c->st.primary.port, c->target.host, c->target.port);
    }
    c->st.primary = c->target;
    PC_LOG(PC_LOG_INFO, c->name, "connected to Redis %s:%d", c->target.host, c->target.port);
    if (c->p.n_sentinels > 0) {
        c->watch_idx = c->sentinel_idx;
        watch_open(c);
    }
    if (c->p.n_sentinels > 0 && c->p.role_check_ms > 0)
        uv_timer_start(&c->role_timer, on_role_timer, c->p.role_check_ms, c->p.role_check_ms);
    if (c->p.on_up != NULL)
        c->p.on_up(c, c->p.ud);
}

static void setup_cmd(bill_redis_t *c, const char *what, int argc, const char **argv)
{
    size_t lens[3];
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    if (c->state == ST_PRIMARY && c->ac != NULL &&
        send_on(c, c->ac, 0, on_setup_reply, (void *)what, argc, argv, lens) != 0)
        fail_soon(c, PC_ERR_UPSTREAM, "cannot send %s", what);
}

static void connect_primary(bill_redis_t *c)
{
    c->state = ST_PRIMARY;
    c->ac = open_ctx(c, &c->target);
    if (c->ac == NULL)
        return;
    if (c->password != NULL)
        setup_cmd(c, "AUTH", 2, (const char *[]){"AUTH", c->password});
    if (c->p.n_sentinels > 0)
        setup_cmd(c, "ROLE", 1, (const char *[]){"ROLE"});
    setup_cmd(c, "PING", 1, (const char *[]){"PING"});
}

static void on_sentinel_reply(bill_redis_t *c, redisReply *r, int status, void *priv)
{
    (void)priv;
    if (status != 0 || c->state != ST_SENTINEL)
        return;
    if (r->type == REDIS_REPLY_ERROR) {
        c->st.n_errors++;
        fail_soon(c, PC_ERR_UPSTREAM, "sentinel %s:%d: %.100s", c->sentinels[c->sentinel_idx].host,
                  c->sentinels[c->sentinel_idx].port, r->str);
        return;
    }
    if (r->type == REDIS_REPLY_STATUS) /* the AUTH */
        return;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING ||
        r->element[0]->len == 0 || r->element[0]->len >= sizeof c->target.host) {
        c->st.n_errors++;
        fail_soon(c, PC_ERR_UPSTREAM, "sentinel %s:%d does not know master '%s'",
                  c->sentinels[c->sentinel_idx].host, c->sentinels[c->sentinel_idx].port,
                  c->master_name);
        return;
    }
    char *end;
    long port = strtol(r->element[1]->str, &end, 10);
    if (*end != '\0' || port <= 0 || port > 65535) {
        fail_soon(c, PC_ERR_UPSTREAM, "sentinel gave a bad port");
        return;
    }
    memcpy(c->target.host, r->element[0]->str, r->element[0]->len);
    c->target.host[r->element[0]->len] = '\0';
    c->target.port = (int)port;
    /* Done with the sentinel: free it on the next turn (we are inside its callback; hiredis
     * defers the free to after the callback anyway). */
    redisAsyncContext *sac = c->sac;
    c->sac = NULL;
    redisAsyncFree(sac);
    connect_primary(c);
}

static void start_attempt(bill_redis_t *c)
{
    if (c->state != ST_IDLE)
        return;
    c->fail_status = 0;
    c->fail_reason[0] = '\0';
    if (c->p.n_sentinels == 0) {
        c->target = c->p.address;
        connect_primary(c);
        return;
    }
    if (c->hint.port != 0) { /* the sentinels just named it: straight there (ROLE checked) */
        c->target = c->hint;
        c->hint.port = 0;
        connect_primary(c);
        return;
    }
    const bill_redis_addr_t *s = &c->sentinels[c->sentinel_idx];
    c->state = ST_SENTINEL;
    snprintf(c->target.host, sizeof c->target.host, "%s", s->host);
    c->target.port = s->port;
    c->sac = open_ctx(c, s);
    if (c->sac == NULL)
        return;
    if (c->sentinel_password != NULL) {
        const char *av[2] = {"AUTH", c->sentinel_password};
        size_t al[2] = {4, strlen(c->sentinel_password)};
        if (send_on(c, c->sac, 0, on_sentinel_reply, NULL, 2, av, al) != 0) {
            fail_soon(c, PC_ERR_UPSTREAM, "cannot ask sentinel");
            return;
        }
    }
    const char *av[3] = {"SENTINEL", "get-master-addr-by-name", c->master_name};
    size_t al[3] = {8, 23, strlen(c->master_name)};
    if (send_on(c, c->sac, 0, on_sentinel_reply, NULL, 3, av, al) != 0)
        fail_soon(c, PC_ERR_UPSTREAM, "cannot ask sentinel");
}

/* ---------------------------------------------------------------------------------------------
 * Following the sentinels while up: +switch-master and the periodic question
 * ------------------------------------------------------------------------------------------- */

/* Frees the side connections (their callbacks run with no reply: ignored). */
static void watch_close(bill_redis_t *c)
{
    redisAsyncContext *w = c->wac, *q = c->qac;
    c->wac = c->qac = NULL;
    c->q_inflight = false;
    if (w != NULL)
        redisAsyncFree(w);
    if (q != NULL)
        redisAsyncFree(q);
}

/* A side connection failed (gone is the context hiredis is freeing itself, or NULL): both go,
 * the next sentinel is watched from the next check on. */
static void side_lost(bill_redis_t *c, const redisAsyncContext *gone, const char *why)
{
    if (gone == c->wac)
        c->wac = NULL;
    if (gone == c->qac)
        c->qac = NULL;
    PC_LOG(PC_LOG_INFO, c->name, "sentinel %s:%d (watching the primary): %s",
           c->sentinels[c->watch_idx].host, c->sentinels[c->watch_idx].port, why);
    watch_close(c);
    c->watch_idx = (c->watch_idx + 1) % c->p.n_sentinels;
}

/* The sentinels name primary a (how: where we heard it). Another address than ours: leave now,
 * the next attempt goes to a (still ROLE-checked). */
static void switch_seen(bill_redis_t *c, const char *host, size_t host_len, long port,
                        const char *how)
{
    if (c->state != ST_UP || host_len == 0 || host_len >= sizeof c->hint.host || port <= 0 ||
        port > 65535)
        return;
    if (port == c->st.primary.port && strlen(c->st.primary.host) == host_len &&
        memcmp(c->st.primary.host, host, host_len) == 0)
        return;
    memcpy(c->hint.host, host, host_len);
    c->hint.host[host_len] = '\0';
    c->hint.port = (int)port;
    c->sentinel_idx = c->watch_idx; /* the sentinel that said so is asked first after */
    fail_soon(c, PC_ERR_CLOSED, "the sentinels name another primary, %s:%d (%s)", c->hint.host,
              c->hint.port, how);
}

/* SUBSCRIBE +switch-master: ["message", "+switch-master", "NAME OLDIP OLDPORT NEWIP NEWPORT"]. */
static void on_switch_msg(redisAsyncContext *ac, void *reply, void *priv)
{
    bill_redis_t *c = priv;
    redisReply *r = reply;
    if (r == NULL || ac != c->wac || r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
        r->element[0]->type != REDIS_REPLY_STRING || strcmp(r->element[0]->str, "message") != 0 ||
        r->element[2]->type != REDIS_REPLY_STRING || r->element[2]->len > 1024)
        return;
    const char *f[5];
    size_t fl[5];
    const char *p = r->element[2]->str, *end = p + r->element[2]->len;
    int n = 0;
    while (n < 5 && p < end) {
        const char *sp = memchr(p, ' ', (size_t)(end - p));
        f[n] = p;
        fl[n] = (size_t)((sp != NULL ? sp : end) - p);
        n++;
        p = sp != NULL ? sp + 1 : end;
    }
    if (n != 5 || p != end || fl[0] != strlen(c->master_name) ||
        memcmp(f[0], c->master_name, fl[0]) != 0 || fl[4] == 0 || fl[4] > 5)
        return;
    char port[8];
    memcpy(port, f[4], fl[4]);
    port[fl[4]] = '\0';
    char *pe;
    long v = strtol(port, &pe, 10);
    if (*pe == '\0')
        switch_seen(c, f[3], fl[3], v, "+switch-master");
}

static void on_master_addr(redisAsyncContext *ac, void *reply, void *priv)
{
    bill_redis_t *c = priv;
    redisReply *r = reply;
    if (r == NULL || ac != c->qac)
        return;
    c->q_inflight = false;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[0]->type == REDIS_REPLY_STRING && r->element[1]->type == REDIS_REPLY_STRING &&
        r->element[1]->len <= 5) {
        char *pe;
        long v = strtol(r->element[1]->str, &pe, 10);
        if (*pe == '\0')
            switch_seen(c, r->element[0]->str, r->element[0]->len, v,
                        "SENTINEL get-master-addr-by-name");
    }
}

static void on_side_auth(redisAsyncContext *ac, void *reply, void *priv)
{
    bill_redis_t *c = priv;
    redisReply *r = reply;
    if (r != NULL && (ac == c->wac || ac == c->qac) && r->type == REDIS_REPLY_ERROR)
        side_lost(c, NULL, "AUTH refused");
}

/* Opens the side connections to sentinel watch_idx when they are not open (while up). */
static void watch_open(bill_redis_t *c)
{
    if (c->p.n_sentinels == 0 || c->state != ST_UP || c->wac != NULL)
        return;
    const bill_redis_addr_t *a = &c->sentinels[c->watch_idx];
    c->wac = open_side(c, a);
    c->qac = c->wac != NULL ? open_side(c, a) : NULL;
    if (c->qac == NULL) {
        side_lost(c, NULL, "cannot connect");
        return;
    }
    for (int i = 0; i < 2 && c->sentinel_password != NULL; i++)
        redisAsyncCommand(i == 0 ? c->wac : c->qac, on_side_auth, c, "AUTH %s",
                          c->sentinel_password);
    if (redisAsyncCommand(c->wac, on_switch_msg, c, "SUBSCRIBE %s", "+switch-master") != REDIS_OK)
        side_lost(c, NULL, "cannot subscribe");
}

/* The periodic question: a question unanswered since the last check means a stuck sentinel. */
static void watch_check(bill_redis_t *c)
{
    if (c->p.n_sentinels == 0)
        return;
    if (c->q_inflight)
        side_lost(c, NULL, "no answer within a check period");
    watch_open(c);
    if (c->qac != NULL &&
        redisAsyncCommand(c->qac, on_master_addr, c, "SENTINEL get-master-addr-by-name %s",
                          c->master_name) == REDIS_OK)
        c->q_inflight = true;
}

static void on_role_check(bill_redis_t *c, redisReply *r, int status, void *priv)
{
    (void)priv;
    if (status != 0 || c->state != ST_UP)
        return;
    if (!role_is_master(r)) {
        c->st.n_demotions++;
        fail_soon(c, PC_ERR_CLOSED, "the primary was demoted (ROLE)");
    }
}

static void on_role_timer(uv_timer_t *t)
{
    bill_redis_t *c = t->data;
    if (c->state != ST_UP)
        return;
    const char *av[1] = {"ROLE"};
    size_t al[1] = {4};
    send_on(c, c->ac, 0, on_role_check, NULL, 1, av, al);
    watch_check(c);
}

void bill_redis_reconnect(bill_redis_t *c, const char *reason)
{
    if (c == NULL)
        return;
    fail_soon(c, PC_ERR_CLOSED, "%s", reason != NULL ? reason : "reconnect asked");
}

/* ---------------------------------------------------------------------------------------------
 * Lifecycle
 * ------------------------------------------------------------------------------------------- */

static void conn_free(bill_redis_t *c)
{
    pc_free(c->sentinels);
    pc_free(c->master_name);
    pc_free(c->password);
    pc_free(c->sentinel_password);
    pc_free(c->name);
    pc_free(c);
}

static bool dup_opt(const char *s, char **out)
{
    *out = NULL;
    if (s == NULL)
        return true;
    *out = pc_strdup(s);
    return *out != NULL;
}

int bill_redis_start(uv_loop_t *loop, const bill_redis_params_t *p, bill_redis_t **out, char *err,
                     size_t err_len)
{
    *out = NULL;
    int rc = bill_redis_params_check(p, err, err_len);
    if (rc != 0)
        return rc;
    bill_redis_t *c = pc_calloc(1, sizeof *c);
    if (c == NULL)
        return PC_ERR_NOMEM;
    c->loop = loop;
    c->p = *p;
    bool ok = dup_opt(p->master_name, &c->master_name) && dup_opt(p->password, &c->password) &&
              dup_opt(p->sentinel_password, &c->sentinel_password) &&
              dup_opt(p->name != NULL ? p->name : "redis", &c->name);
    if (ok && p->n_sentinels > 0) {
        c->sentinels = pc_calloc(p->n_sentinels, sizeof *c->sentinels);
        ok = c->sentinels != NULL;
        if (ok)
            memcpy(c->sentinels, p->sentinels, p->n_sentinels * sizeof *c->sentinels);
    }
    if (!ok) {
        conn_free(c);
        return PC_ERR_NOMEM;
    }
    c->p.sentinels = c->sentinels;
    c->p.master_name = c->master_name;
    c->p.password = c->password;
    c->p.sentinel_password = c->sentinel_password;
    c->p.name = c->name;
    if (c->p.retry_min_ms == 0)
        c->p.retry_min_ms = 100;
    if (c->p.retry_max_ms < c->p.retry_min_ms)
        c->p.retry_max_ms = c->p.retry_min_ms;
    c->retry_ms = c->p.retry_min_ms;
    c->ops.prev = c->ops.next = &c->ops;
    uv_timer_t *timers[4] = {&c->retry_timer, &c->kick_timer, &c->dl_timer, &c->role_timer};
    for (int i = 0; i < 4; i++) {
        uv_timer_init(loop, timers[i]);
        timers[i]->data = c;
    }
    c->handles_open = 4;
    c->state = ST_IDLE;
    uv_timer_start(&c->retry_timer, on_retry_timer, 0, 0);
    *out = c;
    return 0;
}

static void on_handle_closed(uv_handle_t *h)
{
    bill_redis_t *c = h->data;
    if (--c->handles_open > 0)
        return;
    void (*cb)(void *) = c->on_closed;
    void *ud = c->closed_ud;
    conn_free(c);
    if (cb != NULL)
        cb(ud);
}

void bill_redis_stop(bill_redis_t *c, void (*on_closed)(void *ud), void *ud)
{
    if (c == NULL || c->state == ST_STOPPED)
        return;
    c->state = ST_STOPPED;
    c->on_closed = on_closed;
    c->closed_ud = ud;
    watch_close(c);
    free_ctx(c, &c->sac, PC_ERR_CANCELED);
    free_ctx(c, &c->ac, PC_ERR_CANCELED);
    uv_close((uv_handle_t *)&c->retry_timer, on_handle_closed);
    uv_close((uv_handle_t *)&c->kick_timer, on_handle_closed);
    uv_close((uv_handle_t *)&c->dl_timer, on_handle_closed);
    uv_close((uv_handle_t *)&c->role_timer, on_handle_closed);
}

/* ---------------------------------------------------------------------------------------------
 * Blocking connect
 * ------------------------------------------------------------------------------------------- */

static redisContext *sync_open(const bill_redis_addr_t *a, uint32_t timeout_ms,
                               const char *password, int *rc, char *err, size_t err_len)
{
    struct timeval tv = {(time_t)(timeout_ms / 1000), (suseconds_t)(timeout_ms % 1000) * 1000};
    redisContext *ctx = redisConnectWithTimeout(a->host, a->port, tv);
    if (ctx == NULL || ctx->err) {
        *rc = pc_err_setf(err, err_len, PC_ERR_UPSTREAM, "redis: cannot connect to %s:%d: %s",
                          a->host, a->port, ctx != NULL ? ctx->errstr : "out of memory");
        redisFree(ctx);
        return NULL;
    }
    redisSetTimeout(ctx, tv);
    if (password != NULL) {
        redisReply *r = redisCommand(ctx, "AUTH %s", password);
        bool ok = r != NULL && r->type != REDIS_REPLY_ERROR;
        if (!ok) {
            *rc = pc_err_setf(err, err_len, r != NULL ? PC_ERR_PERM : PC_ERR_UPSTREAM,
                              "redis: AUTH at %s:%d failed: %s", a->host, a->port,
                              r != NULL ? r->str : ctx->errstr);
            if (r != NULL)
                freeReplyObject(r);
            redisFree(ctx);
            return NULL;
        }
        freeReplyObject(r);
    }
    *rc = 0;
    return ctx;
}

int bill_redis_connect_sync(const bill_redis_params_t *p, redisContext **out, char *err,
                            size_t err_len)
{
    *out = NULL;
    int rc = bill_redis_params_check(p, err, err_len);
    if (rc != 0)
        return rc;
    if (p->n_sentinels == 0) {
        redisContext *ctx = sync_open(&p->address, p->timeout_ms, p->password, &rc, err, err_len);
        if (ctx == NULL)
            return rc;
        *out = ctx;
        return 0;
    }
    rc = pc_err_setf(err, err_len, PC_ERR_UPSTREAM, "redis: no sentinel answered");
    char why[768] = "";
    for (size_t i = 0; i < p->n_sentinels; i++) {
        redisContext *s =
            sync_open(&p->sentinels[i], p->timeout_ms, p->sentinel_password, &rc, why, sizeof why);
        if (s == NULL)
            continue;
        redisReply *r = redisCommand(s, "SENTINEL get-master-addr-by-name %s", p->master_name);
        bill_redis_addr_t a = {.port = 0};
        if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
            r->element[0]->type == REDIS_REPLY_STRING &&
            r->element[1]->type == REDIS_REPLY_STRING && r->element[0]->len > 0 &&
            r->element[0]->len < sizeof a.host) {
            memcpy(a.host, r->element[0]->str, r->element[0]->len);
            a.host[r->element[0]->len] = '\0';
            char *end;
            long port = strtol(r->element[1]->str, &end, 10);
            if (*end == '\0' && port > 0 && port <= 65535)
                a.port = (int)port;
        }
        if (r != NULL)
            freeReplyObject(r);
        redisFree(s);
        if (a.port == 0) {
            snprintf(why, sizeof why, "sentinel %s:%d does not know master '%s'",
                     p->sentinels[i].host, p->sentinels[i].port, p->master_name);
            rc = PC_ERR_UPSTREAM;
            continue;
        }
        redisContext *ctx = sync_open(&a, p->timeout_ms, p->password, &rc, why, sizeof why);
        if (ctx == NULL) {
            if (rc == PC_ERR_PERM)
                break;
            continue;
        }
        r = redisCommand(ctx, "ROLE");
        bool master = role_is_master(r);
        if (r != NULL)
            freeReplyObject(r);
        if (master) {
            *out = ctx;
            return 0;
        }
        redisFree(ctx);
        snprintf(why, sizeof why, "%s:%d (named by sentinel %s:%d) is not a master", a.host, a.port,
                 p->sentinels[i].host, p->sentinels[i].port);
        rc = PC_ERR_UPSTREAM;
    }
    return pc_err_setf(err, err_len, rc != 0 ? rc : PC_ERR_UPSTREAM, "redis: %s",
                       why[0] ? why : "no sentinel answered");
}
