/*
 * redisconn.h — one Redis connection that follows Sentinel failover: asynchronous (hiredis async
 * on a libuv loop) for the gateway's shipper and registry, and a blocking one-shot connect for
 * start-up checks and CLIs (`kvgw billing verify`, `export`).
 *
 * Where the primary is. Either a fixed `address` or, with Sentinel, a list of sentinels and a
 * master name: each (re)connect asks the sentinels in turn `SENTINEL get-master-addr-by-name
 * NAME` (the last one that answered first), connects to the address it names, sends AUTH when a
 * password is set, and checks `ROLE`: a server that is not a master is refused and the next
 * sentinel is asked (a sentinel may name a demoted primary for a moment during a failover).
 * Without sentinels the address is used as is and ROLE is not asked.
 *
 * When the connection is given up and made again (the async manager):
 *   - the connection is lost (closed or reset) or refused: seen at once, idle or not (a socket
 *     error event is handled, not left to a deadline), or a connect does not finish within
 *     timeout_ms;
 *   - a command has waited for its reply longer than its deadline (timeout_ms, or the deadline
 *     passed to bill_redis_send: a blocking XREAD passes its block time plus timeout_ms);
 *   - a reply is an error that says this server cannot take writes now: READONLY, LOADING,
 *     MASTERDOWN (the caller still receives that error reply first);
 *   - with sentinels, the periodic ROLE check (every role_check_ms, default 1 s) answers
 *     anything but "master": the primary was demoted by a failover;
 *   - with sentinels, the sentinels name another primary than ours: while up, the manager keeps
 *     a subscription to `+switch-master` on one sentinel and asks that sentinel `SENTINEL
 *     get-master-addr-by-name` at each ROLE check (a failed or silent sentinel is replaced by the
 *     next one). A failover is followed the moment the sentinels promote the new primary, not
 *     when they demote the old one (up to ~10 s later: their INFO period), which would keep
 *     taking writes meanwhile that its resync then throws away. The next attempt goes straight
 *     to the named primary (ROLE still checked), then through the sentinels as usual. With
 *     sentinels each manager holds two more connections (to one sentinel) while up.
 * Reconnects back off from retry_min_ms, doubling to retry_max_ms, reset by a successful connect.
 * A connect whose primary address differs from the previous connection's counts as a failover
 * (bill_redis_stats_t.n_failovers).
 *
 * Commands. bill_redis_send pipelines one command on the current connection and calls its
 * callback exactly once, on the loop: with the reply (status 0; an error reply is a reply), or
 * with no reply and a negative status when the connection went away first (PC_ERR_TIMEOUT: a
 * deadline passed; PC_ERR_CLOSED: lost, refused or a failover; PC_ERR_CANCELED: bill_redis_stop).
 * A command is never resent by this module: after a lost reply the caller decides (scripts that
 * are idempotent, cursors re-read in on_up). The reply is hiredis's and is valid during the
 * callback only. Replies arrive in the order the commands were sent on one connection.
 *
 * Up and down. on_up(c) runs once per connection that reached "ready" (connected, AUTH done, ROLE
 * master where asked): the caller loads its scripts, re-reads its cursors and resumes; commands
 * may be sent from inside it. on_down(c, reason) runs once for each connection that was up, after
 * its pending commands were failed; it is followed by a reconnect (unless stopping). While not up,
 * bill_redis_send refuses with PC_ERR_UPSTREAM and calls nothing. Neither callback runs from inside
 * bill_redis_send or bill_redis_stop; a connection is never freed from inside a hiredis callback
 * (drops run from a timer on the next loop turn).
 *
 * Threads: everything async is on the loop's thread. The blocking connect may run anywhere.
 * Memory: every string of the params is copied at start. hiredis 0.14's async API has no
 * timeouts of its own, so every deadline here is a libuv timer.
 */
#ifndef BILL_REDISCONN_H
#define BILL_REDISCONN_H

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* At most this many sentinels (config.c refuses more). */
#define BILL_REDIS_MAX_SENTINELS 16

/* A host (name or address, NUL-terminated, < 256 bytes) and a port 1..65535. config.c parses
 * HOST:PORT with lnk_addr_parse (the one parser); billing/ takes them parsed. */
typedef struct bill_redis_addr {
    char host[256];
    int port;
} bill_redis_addr_t;

typedef struct bill_redis bill_redis_t;

typedef struct bill_redis_params {
    /* The primary's fixed address (used when n_sentinels is 0). Default 127.0.0.1:6379. */
    bill_redis_addr_t address;
    /* Sentinel: n_sentinels > 0 addresses (copied) and the master's name (required then). */
    const bill_redis_addr_t *sentinels;
    size_t n_sentinels;
    const char *master_name;
    const char *password;          /* NULL: no AUTH (on the primary; sentinels are asked */
    const char *sentinel_password; /* with their own password, NULL: none) */
    /* Deadline of a connect (each step: sentinel query, TCP, AUTH, ROLE) and the default deadline
     * of a command's reply. Default 2000 ms. */
    uint32_t timeout_ms;
    uint32_t retry_min_ms;  /* reconnect backoff, default 100, doubling to retry_max_ms */
    uint32_t retry_max_ms;  /* default 5000 */
    uint32_t role_check_ms; /* with sentinels: ROLE every this often, default 1000; 0 = never */
    /* Log tag (default "redis"); the log lines name it and the address. */
    const char *name;
    /* Loop-thread callbacks (may be NULL); ud is passed back. */
    void (*on_up)(bill_redis_t *c, void *ud);
    void (*on_down)(bill_redis_t *c, const char *reason, void *ud);
    void *ud;
} bill_redis_params_t;

/* 127.0.0.1:6379, no sentinels, timeout 2000 ms, backoff 100..5000 ms, ROLE check 1000 ms. */
bill_redis_params_t bill_redis_params_default(void);

/* Checks params without connecting: PC_ERR_INVAL with a reason (a port out of range, an empty
 * host, sentinels without master_name, more than BILL_REDIS_MAX_SENTINELS, timeout_ms 0). */
int bill_redis_params_check(const bill_redis_params_t *p, char *err, size_t err_len);

typedef struct bill_redis_stats {
    bool up;
    bill_redis_addr_t primary; /* the address of the current (or last) primary; port 0: none yet */
    uint64_t n_connects;       /* connections that reached up */
    uint64_t n_failovers;      /* of those, with a primary address other than the previous one */
    uint64_t n_timeouts;       /* connections dropped for a missed deadline (connect or reply) */
    uint64_t n_errors;         /* refused/lost connections, failed AUTH, sentinel failures */
    uint64_t n_demotions;      /* dropped by ROLE (not master) or READONLY/LOADING/MASTERDOWN */
    uint64_t n_pending;        /* commands sent and not yet answered */
} bill_redis_stats_t;

/* ---- async (loop thread) -------------------------------------------------------------------- */

/* Starts connecting in the background on loop (the caller's thread must be the loop's); Redis
 * need not be up. Returns 0 and *out, PC_ERR_INVAL (bad params, reason in err) or NOMEM. */
int bill_redis_start(uv_loop_t *loop, const bill_redis_params_t *p, bill_redis_t **out, char *err,
                     size_t err_len);

/* A command's completion: reply != NULL with status 0, or reply == NULL with status < 0 (see the
 * top). c is the manager; priv is the caller's. */
typedef void (*bill_redis_cb)(bill_redis_t *c, redisReply *reply, int status, void *priv);

/* Sends argv[0..argc) (binary-safe, lengths in argvlen) on the current connection. deadline_ms:
 * how long its reply may take (0: params.timeout_ms); past it the connection is dropped and every
 * pending command fails with PC_ERR_TIMEOUT. Returns 0 (cb will run exactly once, never from
 * inside this call), PC_ERR_UPSTREAM (not up: cb will not run), PC_ERR_INVAL or PC_ERR_NOMEM. */
int bill_redis_send(bill_redis_t *c, uint32_t deadline_ms, bill_redis_cb cb, void *priv, int argc,
                    const char **argv, const size_t *argvlen);

/* True when a connection is up (ready for commands). */
bool bill_redis_is_up(const bill_redis_t *c);

/* Drops the current connection (if any) and reconnects through the sentinels with backoff, as if
 * it had been lost; its pending commands fail with PC_ERR_CLOSED. reason is logged. */
void bill_redis_reconnect(bill_redis_t *c, const char *reason);

void bill_redis_stats(const bill_redis_t *c, bill_redis_stats_t *out);

/* Stops: pending commands fail with PC_ERR_CANCELED (their callbacks run inside this call),
 * on_down does not run, every handle is closed, and on_closed(ud) runs on the loop once c is
 * freed. NULL is a no-op. */
void bill_redis_stop(bill_redis_t *c, void (*on_closed)(void *ud), void *ud);

/* ---- blocking (start-up checks, CLIs) -------------------------------------------------------- */

/* Connects to the primary as above (sentinels asked in turn, AUTH, ROLE master), each step and
 * every later command on the returned context bounded by p->timeout_ms (redisSetTimeout). Returns
 * 0 and *out (free with redisFree), PC_ERR_UPSTREAM (unreachable, no sentinel knows the master,
 * only replicas found), PC_ERR_PERM (AUTH refused) or PC_ERR_INVAL, with the reason in err. The
 * callbacks of p are not used. Never touches a loop. */
int bill_redis_connect_sync(const bill_redis_params_t *p, redisContext **out, char *err,
                            size_t err_len);

#endif
