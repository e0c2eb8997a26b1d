/*
 * registry.c — the shared cache registry (contract, keys and feed format in registry.h).
 *
 * Two connections (billing/redisconn.h): the main one carries the scripts (claims, the queue of
 * commits/reads/releases, the leases), the feed one only XINFO + XREAD BLOCK. Both follow
 * Sentinel failovers on their own; the main one reloads the scripts and re-registers on every
 * connect, the feed one resumes from the last id it read.
 *
 * Claims wait in a FIFO (they all have the same timeout, so deadlines are in order) under one
 * timer. A claim op lives until Redis's answer (or the connection's failure) comes back, even
 * after its deadline or a cancel, so that a late win can be released.
 *
 * The queue holds the fire-and-forget ops as complete argument lists (everything but the script's
 * sha): an op is sent while UP (at most QUEUE_INFLIGHT at a time, in order), leaves the queue when
 * Redis answered it, goes back to unsent when the connection failed first or the script answered
 * KVGWFENCED, and is dropped (counted) on any other error reply, so a poisoned op cannot wedge
 * the queue. Ops are idempotent (max expiries, fence-checked deletes), so a resend after a lost
 * reply is harmless.
 */
#include "registry.h"
#include "common.h"

#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#define QUEUE_INFLIGHT 64

/* ---------------------------------------------------------------------------------------------
 * Scripts
 * ------------------------------------------------------------------------------------------- */

enum { SC_CLAIM, SC_COMMIT, SC_READ, SC_RELEASE, SC_REGISTER, SC_METER, SC_UNREGISTER, SC_COUNT };

#define CHECK_REG                                                                                  \
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('KVGWFENCED') end\n"

/* KEYS gw fence; ARGV nonce instance worker claim_ttl eprefix cprefix n {H len ttl write}.
 * Returns {fence, then per point kind a b}: L expiry ttl | O worker instance | M fence '' |
 * - 0 ''. */
static const char sc_claim[] = CHECK_REG
    "local n = tonumber(ARGV[7])\n"
    "local out = {0}\n"
    "local fence = 0\n"
    "for i = 0, n - 1 do\n"
    "  local b = 8 + i * 4\n"
    "  local ek = ARGV[5] .. ARGV[b]\n"
    "  local v = redis.call('GET', ek)\n"
    "  if v then\n"
    "    local _, _, ttl = string.find(v, '^%d+ (%d+)')\n"
    "    out[#out + 1] = 'L'\n"
    "    out[#out + 1] = redis.call('PEXPIRETIME', ek)\n"
    "    out[#out + 1] = tonumber(ttl or '0')\n"
    "  else\n"
    "    local ck = ARGV[6] .. ARGV[b]\n"
    "    local cv = redis.call('GET', ck)\n"
    "    if cv then\n"
    "      local _, _, inst, wk = string.find(cv, '^%d+ (%S+) (.*)$')\n"
    "      out[#out + 1] = 'O'\n"
    "      out[#out + 1] = wk or ''\n"
    "      out[#out + 1] = inst or ''\n"
    "    elseif ARGV[b + 3] == '1' then\n"
    "      if fence == 0 then fence = redis.call('INCR', KEYS[2]) end\n"
    "      redis.call('SET', ck, fence .. ' ' .. ARGV[2] .. ' ' .. ARGV[3], 'PX', ARGV[4])\n"
    "      out[#out + 1] = 'M'\n"
    "      out[#out + 1] = fence\n"
    "      out[#out + 1] = ''\n"
    "    else\n"
    "      out[#out + 1] = '-'\n"
    "      out[#out + 1] = 0\n"
    "      out[#out + 1] = ''\n"
    "    end\n"
    "  end\n"
    "end\n"
    "out[1] = fence\n"
    "return out\n";

/* Shared by commit and read: the TIME of the server in ms, and the XADD of the feed fields that
 * follow the points (ARGV[k] = number of pairs, then the pairs). */
#define LUA_NOW                                                                                    \
    "local t = redis.call('TIME')\n"                                                               \
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
#define LUA_XADD(k)                                                                                \
    "local xa = {'XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*'}\n"                                  \
    "for j = " k " + 1, " k " + 2 * tonumber(ARGV[" k "]) do xa[#xa + 1] = ARGV[j] end\n"          \
    "redis.call(unpack(xa))\n"

/* KEYS gw feed; ARGV nonce instance fence eprefix cprefix maxlen n {H len ttl expiry} m pairs.
 * Returns the number of entries written (expiry still in the future). */
static const char sc_commit[] = CHECK_REG LUA_NOW
    "local n = tonumber(ARGV[7])\n"
    "local mine = ARGV[3] .. ' ' .. ARGV[2] .. ' '\n"
    "local written = 0\n"
    "for i = 0, n - 1 do\n"
    "  local b = 8 + i * 4\n"
    "  local ek = ARGV[4] .. ARGV[b]\n"
    "  local exp = tonumber(ARGV[b + 3])\n"
    "  local ttl = tonumber(ARGV[b + 2])\n"
    "  local tail = now .. ' ' .. ARGV[2]\n"
    "  local old = redis.call('GET', ek)\n"
    "  if old then\n"
    "    local _, _, ottl, otail = string.find(old, '^%d+ (%d+) (.*)$')\n"
    "    if ottl and tonumber(ottl) > ttl then ttl = tonumber(ottl) end\n"
    "    if otail then tail = otail end\n"
    "    local oexp = redis.call('PEXPIRETIME', ek)\n"
    "    if oexp > exp then exp = oexp end\n"
    "  end\n"
    "  if exp > now then\n"
    "    redis.call('SET', ek, ARGV[b + 1] .. ' ' .. ttl .. ' ' .. tail, 'PXAT',\n"
    "               string.format('%.0f', exp))\n"
    "    written = written + 1\n"
    "  end\n"
    "  if ARGV[3] ~= '0' then\n"
    "    local ck = ARGV[5] .. ARGV[b]\n"
    "    local cv = redis.call('GET', ck)\n"
    "    if cv and string.sub(cv, 1, #mine) == mine then redis.call('DEL', ck) end\n"
    "  end\n"
    "end\n"
    "local k = 8 + 4 * n\n"
    "if written > 0 then\n"
    "  local xa = {'XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*'}\n"
    "  for j = k + 1, k + 2 * tonumber(ARGV[k]) do xa[#xa + 1] = ARGV[j] end\n"
    "  redis.call(unpack(xa))\n"
    "end\n"
    "return written\n";

/* KEYS gw feed; ARGV nonce eprefix now ttl0_ms ttl1_ms maxlen n {H ttl} m pairs. Returns the
 * number of entries refreshed (those that still exist). */
static const char sc_read[] =
    CHECK_REG "local n = tonumber(ARGV[7])\n"
              "local now = tonumber(ARGV[3])\n"
              "local done = 0\n"
              "for i = 0, n - 1 do\n"
              "  local b = 8 + i * 2\n"
              "  local ek = ARGV[2] .. ARGV[b]\n"
              "  local v = redis.call('GET', ek)\n"
              "  if v then\n"
              "    local _, _, ottl = string.find(v, '^%d+ (%d+)')\n"
              "    local ttl = tonumber(ARGV[b + 1])\n"
              "    if ottl and tonumber(ottl) > ttl then ttl = tonumber(ottl) end\n"
              "    local exp = now + tonumber(ttl == 1 and ARGV[5] or ARGV[4])\n"
              "    redis.call('PEXPIREAT', ek, string.format('%.0f', exp), 'GT')\n"
              "    done = done + 1\n"
              "  end\n"
              "end\n"
              "local k = 8 + 2 * n\n"
              "if done > 0 then\n"
              "  local xa = {'XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*'}\n"
              "  for j = k + 1, k + 2 * tonumber(ARGV[k]) do xa[#xa + 1] = ARGV[j] end\n"
              "  redis.call(unpack(xa))\n"
              "end\n"
              "return done\n";

/* KEYS gw; ARGV nonce instance fence cprefix H... Returns the number of claims deleted. */
static const char sc_release[] = CHECK_REG "local mine = ARGV[3] .. ' ' .. ARGV[2] .. ' '\n"
                                           "local done = 0\n"
                                           "for i = 5, #ARGV do\n"
                                           "  local ck = ARGV[4] .. ARGV[i]\n"
                                           "  local cv = redis.call('GET', ck)\n"
                                           "  if cv and string.sub(cv, 1, #mine) == mine then\n"
                                           "    redis.call('DEL', ck)\n"
                                           "    done = done + 1\n"
                                           "  end\n"
                                           "end\n"
                                           "return done\n";

/* KEYS gw gws nssecret settings; ARGV nonce lease instance secret {name value}. Returns
 * {'registered'|'renewed', 0} or {'taken', pttl of the holder's key}; the error KVGWSECRET on a
 * different namespace secret, KVGWSETTINGS <i> <stored value> when setting i (0-based) differs
 * from the one stored. The checks come first: a refused gateway writes nothing. */
static const char sc_register[] =
    "local s = redis.call('GET', KEYS[3])\n"
    "if s and s ~= ARGV[4] then return redis.error_reply('KVGWSECRET') end\n"
    "for i = 5, #ARGV - 1, 2 do\n"
    "  local v = redis.call('HGET', KEYS[4], ARGV[i])\n"
    "  if v and v ~= ARGV[i + 1] then\n"
    "    return redis.error_reply('KVGWSETTINGS ' .. ((i - 5) / 2) .. ' ' .. v)\n"
    "  end\n"
    "end\n"
    "if not s then redis.call('SET', KEYS[3], ARGV[4]) end\n"
    "for i = 5, #ARGV - 1, 2 do redis.call('HSETNX', KEYS[4], ARGV[i], ARGV[i + 1]) end\n"
    "local cur = redis.call('GET', KEYS[1])\n"
    "if cur == ARGV[1] then\n"
    "  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
    "  return {'renewed', 0}\n"
    "end\n"
    "if cur then return {'taken', redis.call('PTTL', KEYS[1])} end\n"
    "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])\n"
    "redis.call('SADD', KEYS[2], ARGV[3])\n"
    "return {'registered', 0}\n";

/* KEYS gw meter; ARGV nonce lease. 1: we hold the meter lease (taken or renewed), 0: another. */
static const char sc_meter[] =
    CHECK_REG "local cur = redis.call('GET', KEYS[2])\n"
              "if cur == ARGV[1] then redis.call('PEXPIRE', KEYS[2], ARGV[2]) return 1 end\n"
              "if not cur then redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2]) return 1 end\n"
              "return 0\n";

/* KEYS gw meter; ARGV nonce. Deletes our registration and meter lease (a clean stop). */
static const char sc_unregister[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end\n"
    "if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end\n"
    "return 1\n";

static const char *const scripts[SC_COUNT] = {sc_claim,    sc_commit, sc_read,      sc_release,
                                              sc_register, sc_meter,  sc_unregister};

/* ---------------------------------------------------------------------------------------------
 * Structures
 * ------------------------------------------------------------------------------------------- */

struct gw_registry_op {
    gw_registry_t *r;
    struct gw_registry_op *prev, *next; /* the waiting list while waiting */
    bool waiting;                       /* the callback is owed */
    uint64_t deadline;                  /* uv_now ms */
    uint64_t sent_ns;
    gw_registry_claim_cb cb;
    void *ud;
    uint64_t ns;
    size_t n_points;
    gw_registry_point_t points[GW_REGISTRY_MAX_POINTS];
    char hashes[GW_REGISTRY_MAX_POINTS][33];
};

typedef struct qop {
    struct qop *prev, *next;
    gw_registry_t *r;
    gw_registry_opkind_t kind;
    int script;
    bool sent;
    bool waited; /* queued while not UP: its success counts as replayed */
    uint64_t sent_ns;
    uint64_t done_at; /* in the recent list: when Redis acknowledged it (uv_now) */
    size_t bytes;
    int argc;
    const char **argv; /* [argc] from argv[2] of the EVALSHA: the keys count, keys, args */
    size_t *argvlen;
} qop_t;

/* A list of ops (a ring through head, oldest first) with their count and bytes. */
typedef struct qlist {
    qop_t head;
    uint64_t n, bytes;
} qlist_t;

struct gw_registry {
    uv_loop_t *loop;
    gw_registry_params_t p;
    char instance[GW_REGISTRY_NAME_MAX + 1];
    char prefix[GW_REGISTRY_NAME_MAX + 1];
    char nonce[33];
    char secret_hex[2 * GW_REGISTRY_SECRET_CHECK_BYTES + 1];
    char k_gw[320], k_gws[160], k_fence[160], k_secret[160], k_meter[160], k_feed[160],
        k_settings[160];
    /* The settings (params.settings), copied: names and values back to back in one block. */
    char *settings_blob;
    const char *set_name[GW_REGISTRY_MAX_SETTINGS], *set_value[GW_REGISTRY_MAX_SETTINGS];
    size_t n_settings;
    char lease_str[24], claim_ttl_str[24], maxlen_str[24], ttl_str[2][24];

    bill_redis_t *rc, *fc;
    bill_redis_addr_t *sentinels; /* copies shared by both connections' params */
    char *master_name, *password, *sentinel_password;
    int open_conns;

    gw_registry_state_t state;
    uint64_t state_since; /* uv_now of the last change */
    uint64_t degraded_ms; /* accumulated time not UP before state_since */
    bool secret_refused;  /* permanent FENCED: the namespace secret or a setting differs */
    char sha[SC_COUNT][41];
    int scripts_pending; /* SCRIPT LOADs not answered on this connection */
    bool scripts_ok;
    bool lease_inflight;

    /* Claims waiting for their answer, deadline order. */
    gw_registry_op_t waiting;
    uv_timer_t claim_timer;
    uv_timer_t lease_timer;

    /* The queue. */
    qlist_t q;
    uint32_t q_inflight;
    /* Commits and reads acknowledged in the last failover_replay_ms (oldest first), sent again
     * to a new primary after a failover (seen as a change of the connection's n_failovers). */
    qlist_t recent;
    uint64_t seen_failovers;

    /* Meter lease: held until this uv_now (0: not held). */
    uint64_t meter_until;
    bool meter_confirmed;

    /* Feed. */
    char feed_last[48]; /* "" until known */
    bool feed_inflight;
    uint64_t gap_counted_ms, gap_counted_seq;
    uint32_t *tokbuf;
    size_t tokcap;

    gw_registry_stats_t st;
    bool stopping;
    int handles_open;
    void (*on_closed)(void *ud);
    void *closed_ud;
};

/* ---------------------------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------------------------- */

gw_registry_params_t gw_registry_params_default(void)
{
    gw_registry_params_t p = {
        .redis = bill_redis_params_default(),
        .prefix = "kvgw",
        .timeout_ms = 50,
        .claim_ttl_ms = 30000,
        .lease_ms = 10000,
        .feed_maxlen = 100000,
        .replay_max = 65536,
        .replay_max_bytes = 64ull << 20,
        .failover_replay_ms = 30000,
        .max_event_tokens = 1u << 20,
        .feed_count = 256,
        .feed_block_ms = 1000,
        .ttl_ms = {300000, 3600000},
        .meter = true,
    };
    p.redis.timeout_ms = 500;
    return p;
}

static bool name_ok(const char *s, size_t max)
{
    if (s == NULL || s[0] == '\0')
        return false;
    size_t n = 0;
    for (; s[n] != '\0'; n++)
        if (n >= max || (unsigned char)s[n] <= 0x20 || (unsigned char)s[n] >= 0x7f)
            return false;
    return true;
}

/* A tenant or model name of a t=w event (registry.h: GW_REGISTRY_LABEL_MAX). */
static bool label_ok(const char *s, size_t len)
{
    if (len == 0 || len > GW_REGISTRY_LABEL_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] == 0x7f)
            return false;
    return true;
}

/* A setting's name or value (params.settings): 1-GW_REGISTRY_NAME_MAX bytes, no control
 * character. */
static bool setting_str_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > GW_REGISTRY_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] == 0x7f)
            return false;
    return true;
}

static void hex_bytes(const uint8_t *b, size_t n, char *out)
{
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hx[b[i] >> 4];
        out[2 * i + 1] = hx[b[i] & 15];
    }
    out[2 * n] = '\0';
}

static void digest_hex(const XXH3_state_t *st, char out[33])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
    hex_bytes(c.digest, 16, out);
}

/* Hashes the points' prefixes in one pass: out[i] = key hex of tokens[0..lens[i]). lens strictly
 * increasing. */
static void hash_points(uint64_t ns, const uint32_t *tokens, const gw_registry_point_t *pts,
                        size_t n_pts, char (*out)[33])
{
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    uint8_t nsb[8];
    for (int i = 0; i < 8; i++)
        nsb[i] = (uint8_t)(ns >> (8 * i));
    XXH3_128bits_update(&st, nsb, 8);
    uint8_t buf[4096];
    size_t at = 0;
    for (size_t i = 0; i < n_pts; i++) {
        size_t end = pts[i].n_tokens;
        while (at < end) {
            size_t k = end - at > sizeof buf / 4 ? sizeof buf / 4 : end - at;
            for (size_t j = 0; j < k; j++) {
                uint32_t t = tokens[at + j];
                buf[4 * j] = (uint8_t)t;
                buf[4 * j + 1] = (uint8_t)(t >> 8);
                buf[4 * j + 2] = (uint8_t)(t >> 16);
                buf[4 * j + 3] = (uint8_t)(t >> 24);
            }
            XXH3_128bits_update(&st, buf, 4 * k);
            at += k;
        }
        digest_hex(&st, out[i]);
    }
}

void gw_registry_key_hex(uint64_t ns, const uint32_t *tokens, size_t n, char out[33])
{
    gw_registry_point_t pt = {.n_tokens = (uint32_t)n};
    char h[1][33];
    hash_points(ns, tokens, &pt, 1, h);
    memcpy(out, h[0], 33);
}

static int check_points(const gw_registry_t *r, const gw_registry_point_t *pts, size_t n_pts,
                        size_t n_tokens)
{
    if (pts == NULL || n_pts == 0 || n_pts > GW_REGISTRY_MAX_POINTS)
        return PC_ERR_INVAL;
    uint32_t prev = 0;
    for (size_t i = 0; i < n_pts; i++) {
        if (pts[i].n_tokens <= prev || pts[i].n_tokens > n_tokens || pts[i].ttl > 1 ||
            pts[i].n_tokens > r->p.max_event_tokens)
            return PC_ERR_INVAL;
        prev = pts[i].n_tokens;
    }
    return 0;
}

static uint64_t now_ms(const gw_registry_t *r)
{
    return uv_now(r->loop);
}

static double secs_since(uint64_t ns)
{
    return (double)(pc_time_mono_ns() - ns) / 1e9;
}

static void report_op(gw_registry_t *r, gw_registry_opkind_t op, double s)
{
    if (r->p.on_op != NULL)
        r->p.on_op(op, s, r->p.ud);
}

static void set_state(gw_registry_t *r, gw_registry_state_t s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void pump_queue(gw_registry_t *r);

static void set_state(gw_registry_t *r, gw_registry_state_t s, const char *fmt, ...)
{
    if (r->state == s)
        return;
    char reason[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    uint64_t now = now_ms(r);
    if (r->state != GW_REGISTRY_UP)
        r->degraded_ms += now - r->state_since;
    r->state = s;
    r->state_since = now;
    static const char *const names[] = {"down", "up", "fenced"};
    PC_LOG(s == GW_REGISTRY_UP ? PC_LOG_INFO : PC_LOG_WARN, "registry", "registry %s: %s", names[s],
           reason);
    if (r->p.on_state != NULL && !r->stopping)
        r->p.on_state(s, reason, r->p.ud);
    if (s == GW_REGISTRY_UP)
        pump_queue(r);
}

/* An EVALSHA argument list under construction: args are appended as (ptr, len) copies into one
 * growing blob, fixed up into argv pointers at the end. */
typedef struct argb {
    char *blob;
    size_t len, cap;
    size_t *offs, *lens;
    int n, cap_n;
    bool oom;
} argb_t;

static void ab_add(argb_t *a, const void *p, size_t len)
{
    if (a->oom)
        return;
    if (a->n == a->cap_n) {
        int nc = a->cap_n ? a->cap_n * 2 : 32;
        size_t *o = pc_reallocarray(a->offs, (size_t)nc, sizeof *o);
        if (o == NULL) {
            a->oom = true;
            return;
        }
        a->offs = o;
        size_t *l = pc_reallocarray(a->lens, (size_t)nc, sizeof *l);
        if (l == NULL) {
            a->oom = true;
            return;
        }
        a->lens = l;
        a->cap_n = nc;
    }
    if (a->len + len > a->cap) {
        size_t nc = a->cap ? a->cap : 1024;
        while (nc < a->len + len)
            nc *= 2;
        char *b = pc_realloc(a->blob, nc);
        if (b == NULL) {
            a->oom = true;
            return;
        }
        a->blob = b;
        a->cap = nc;
    }
    if (len > 0)
        memcpy(a->blob + a->len, p, len);
    a->offs[a->n] = a->len;
    a->lens[a->n] = len;
    a->len += len;
    a->n++;
}

static void ab_str(argb_t *a, const char *s)
{
    ab_add(a, s, strlen(s));
}

static void ab_u64(argb_t *a, uint64_t v)
{
    char b[24];
    int n = snprintf(b, sizeof b, "%" PRIu64, v);
    ab_add(a, b, (size_t)n);
}

static void ab_free(argb_t *a)
{
    pc_free(a->blob);
    pc_free(a->offs);
    pc_free(a->lens);
}

/* The tokens as packed little-endian u32 (the feed's tok field). */
static void ab_tokens(argb_t *a, const uint32_t *t, size_t n)
{
    if (a->oom)
        return;
    uint8_t *b = pc_malloc(n * 4 + 1);
    if (b == NULL) {
        a->oom = true;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        b[4 * i] = (uint8_t)t[i];
        b[4 * i + 1] = (uint8_t)(t[i] >> 8);
        b[4 * i + 2] = (uint8_t)(t[i] >> 16);
        b[4 * i + 3] = (uint8_t)(t[i] >> 24);
    }
    ab_add(a, b, n * 4);
    pc_free(b);
}

/* Sends EVALSHA of script with the args of a (from the keys count on). */
static int send_script(gw_registry_t *r, bill_redis_t *c, int script, uint32_t deadline_ms,
                       bill_redis_cb cb, void *priv, int argc, const char **argv,
                       const size_t *argvlen)
{
    const char *av[8 + 4 * GW_REGISTRY_MAX_POINTS + 32];
    size_t al[8 + 4 * GW_REGISTRY_MAX_POINTS + 32];
    if (argc + 2 > (int)(sizeof av / sizeof av[0]))
        return PC_ERR_INVAL;
    av[0] = "EVALSHA";
    al[0] = 7;
    av[1] = r->sha[script];
    al[1] = strlen(r->sha[script]);
    memcpy(av + 2, argv, (size_t)argc * sizeof *argv);
    memcpy(al + 2, argvlen, (size_t)argc * sizeof *argvlen);
    return bill_redis_send(c, deadline_ms, cb, priv, argc + 2, av, al);
}

/* An error reply with our code. Redis 7 puts "ERR " in front of a script's error_reply whose text
 * is not a known code, older versions do not: both are accepted. */
static bool is_error(const redisReply *rp, const char *code)
{
    if (rp->type != REDIS_REPLY_ERROR || rp->str == NULL)
        return false;
    const char *s = strncmp(rp->str, "ERR ", 4) == 0 ? rp->str + 4 : rp->str;
    return strncmp(s, code, strlen(code)) == 0;
}

/* An error reply to a script: FENCED moves the registry to FENCED; NOSCRIPT (someone flushed the
 * scripts) reconnects, which reloads them. Returns the error kind for the stats. */
static int script_error(gw_registry_t *r, const redisReply *rp, const char *what)
{
    if (is_error(rp, "KVGWFENCED")) {
        if (!r->secret_refused)
            set_state(r, GW_REGISTRY_FENCED, "%s: our registration %s is not ours any more", what,
                      r->k_gw);
        return GW_REGISTRY_ERR_FENCED;
    }
    PC_LOG(PC_LOG_WARN, "registry", "%s failed: %.200s", what, rp->str);
    if (is_error(rp, "NOSCRIPT"))
        bill_redis_reconnect(r->rc, "scripts missing (NOSCRIPT)");
    return GW_REGISTRY_ERR_ERROR;
}

/* ---------------------------------------------------------------------------------------------
 * The queue (commit, read, release)
 * ------------------------------------------------------------------------------------------- */

static void ql_unlink(qlist_t *l, qop_t *o)
{
    o->prev->next = o->next;
    o->next->prev = o->prev;
    l->n--;
    l->bytes -= o->bytes;
}

/* Links o at the back of l, or with front in front of it. */
static void ql_push(qlist_t *l, qop_t *o, bool front)
{
    qop_t *at = front ? &l->head : l->head.prev; /* o goes after at */
    o->prev = at;
    o->next = at->next;
    at->next->prev = o;
    at->next = o;
    l->n++;
    l->bytes += o->bytes;
}

static void q_drop_oldest_unsent(gw_registry_t *r)
{
    for (qop_t *o = r->q.head.next; o != &r->q.head; o = o->next)
        if (!o->sent) {
            ql_unlink(&r->q, o);
            pc_free(o);
            r->st.replay_dropped++;
            return;
        }
}

/* The recent list: acknowledged commits and reads, dropped once older than failover_replay_ms or
 * beyond replay_max / replay_max_bytes (the oldest first). */
static void recent_prune(gw_registry_t *r)
{
    uint64_t now = now_ms(r);
    while (r->recent.head.next != &r->recent.head) {
        qop_t *o = r->recent.head.next;
        if (now - o->done_at < r->p.failover_replay_ms && r->recent.n <= r->p.replay_max &&
            r->recent.bytes <= r->p.replay_max_bytes)
            break;
        ql_unlink(&r->recent, o);
        pc_free(o);
    }
}

static void keep_recent(gw_registry_t *r, qop_t *o)
{
    if (r->p.failover_replay_ms == 0 ||
        (o->kind != GW_REGISTRY_OP_COMMIT && o->kind != GW_REGISTRY_OP_READ)) {
        pc_free(o);
        return;
    }
    o->done_at = now_ms(r);
    ql_push(&r->recent, o, false);
    recent_prune(r);
}

/* After a failover: what the old primary acknowledged lately may be lost with it (not yet
 * replicated when the sentinels promoted the new one). The recent ops go back in front of the
 * queue, oldest first, and are sent once registered there; they are idempotent (max expiries,
 * fence-checked deletes; a t=w or t=r event twice changes no replica). What does not fit the
 * queue's bounds is dropped (counted), the oldest first. */
static void resend_recent(gw_registry_t *r)
{
    recent_prune(r);
    uint64_t n = 0;
    while (r->recent.head.prev != &r->recent.head) {
        qop_t *o = r->recent.head.prev; /* the newest first, each in front of the previous */
        ql_unlink(&r->recent, o);
        if (r->q.n + 1 > r->p.replay_max || r->q.bytes + o->bytes > r->p.replay_max_bytes) {
            pc_free(o);
            r->st.replay_dropped++;
            continue;
        }
        o->sent = false;
        o->waited = true;
        ql_push(&r->q, o, true);
        n++;
    }
    r->st.failover_resent += n;
    if (n > 0)
        PC_LOG(PC_LOG_WARN, "registry",
               "Redis primary changed: sending again the %" PRIu64
               " commits and reads of the last %" PRIu64 " ms (the old primary may have lost "
               "them)",
               n, r->p.failover_replay_ms);
}

static void on_qop_reply(bill_redis_t *c, redisReply *rp, int status, void *priv)
{
    qop_t *o = priv;
    gw_registry_t *r = o->r; /* alive: stop waits for the connections, which fail every op */
    (void)c;
    o->sent = false;
    r->q_inflight--;
    if (r->stopping) {
        ql_unlink(&r->q, o);
        pc_free(o);
        return;
    }
    static const char *const what[] = {"claim", "commit", "read", "release", "lease"};
    if (status != 0) { /* the connection went away first: resent after the next registration */
        if (status == PC_ERR_TIMEOUT)
            r->st.errors[o->kind][GW_REGISTRY_ERR_TIMEOUT]++;
        else
            r->st.errors[o->kind][GW_REGISTRY_ERR_ERROR]++;
        o->waited = true;
        return;
    }
    if (rp->type == REDIS_REPLY_ERROR) {
        int kind = script_error(r, rp, what[o->kind]);
        r->st.errors[o->kind][kind]++;
        if (kind == GW_REGISTRY_ERR_FENCED || is_error(rp, "NOSCRIPT")) {
            o->waited = true; /* kept: replayed once registered again */
            return;
        }
        ql_unlink(&r->q, o); /* any other error: this op cannot succeed; do not wedge the queue */
        pc_free(o);
        r->st.replay_dropped++;
        pump_queue(r);
        return;
    }
    r->st.ops[o->kind]++;
    if (o->waited)
        r->st.replayed++;
    report_op(r, o->kind, secs_since(o->sent_ns));
    ql_unlink(&r->q, o);
    keep_recent(r, o);
    pump_queue(r);
}

static void pump_queue(gw_registry_t *r)
{
    if (r->state != GW_REGISTRY_UP || !r->scripts_ok || r->stopping)
        return;
    for (qop_t *o = r->q.head.next; o != &r->q.head && r->q_inflight < QUEUE_INFLIGHT;
         o = o->next) {
        if (o->sent)
            continue;
        o->sent_ns = pc_time_mono_ns();
        if (send_script(r, r->rc, o->script, 0, on_qop_reply, o, o->argc, o->argv, o->argvlen) != 0)
            return; /* not up after all: on_down / the next registration resumes */
        o->sent = true;
        r->q_inflight++;
    }
}

/* Moves a finished argument list into a queued op (one allocation: the op, a back pointer to r,
 * argv, argvlen, the blob). */
static int enqueue(gw_registry_t *r, gw_registry_opkind_t kind, int script, argb_t *a)
{
    if (a->oom) {
        ab_free(a);
        return PC_ERR_NOMEM;
    }
    size_t bytes = sizeof(qop_t) + (size_t)a->n * (sizeof(char *) + sizeof(size_t)) + a->len;
    if (bytes > r->p.replay_max_bytes) {
        ab_free(a);
        r->st.replay_dropped++;
        return 0;
    }
    qop_t *o = pc_malloc(bytes);
    if (o == NULL) {
        ab_free(a);
        return PC_ERR_NOMEM;
    }
    memset(o, 0, sizeof *o);
    o->r = r;
    o->argv = (const char **)(o + 1);
    o->argvlen = (size_t *)(o->argv + a->n);
    char *blob = (char *)(o->argvlen + a->n);
    memcpy(blob, a->blob, a->len);
    for (int i = 0; i < a->n; i++) {
        o->argv[i] = blob + a->offs[i];
        o->argvlen[i] = a->lens[i];
    }
    o->argc = a->n;
    o->kind = kind;
    o->script = script;
    o->bytes = bytes;
    o->waited = r->state != GW_REGISTRY_UP;
    ab_free(a);
    while ((r->q.n + 1 > r->p.replay_max || r->q.bytes + bytes > r->p.replay_max_bytes) &&
           r->q.n > r->q_inflight) {
        uint64_t before = r->q.n;
        q_drop_oldest_unsent(r);
        if (r->q.n == before)
            break;
    }
    if (r->q.n + 1 > r->p.replay_max || r->q.bytes + bytes > r->p.replay_max_bytes) {
        pc_free(o); /* everything queued is in flight: the new one is the one dropped */
        r->st.replay_dropped++;
        return 0;
    }
    ql_push(&r->q, o, false);
    pump_queue(r);
    return 0;
}

static void ab_ns_prefix(argb_t *a, const gw_registry_t *r, char kind, uint64_t ns)
{
    char b[GW_REGISTRY_NAME_MAX + 32];
    int n = snprintf(b, sizeof b, "%s:%c:%016" PRIx64 ":", r->prefix, kind, ns);
    ab_add(a, b, (size_t)n);
}

static void ab_ns(argb_t *a, uint64_t ns)
{
    char b[20];
    snprintf(b, sizeof b, "%016" PRIx64, ns);
    ab_add(a, b, 16);
}

/* The start of the commit and read scripts' arguments: their two keys (our registration, the
 * feed) and our nonce. */
static void ab_feed_keys(argb_t *a, const gw_registry_t *r)
{
    ab_str(a, "2");
    ab_str(a, r->k_gw);
    ab_str(a, r->k_feed);
    ab_str(a, r->nonce);
}

/* A feed event's field count (n_pairs) and its first fields: t (w: a commit, r: a read), o (our
 * instance), ns and tok (the first n_tokens tokens). */
static void ab_event_head(argb_t *a, const gw_registry_t *r, unsigned n_pairs, const char *t,
                          uint64_t ns, const uint32_t *tokens, size_t n_tokens)
{
    ab_u64(a, n_pairs);
    ab_str(a, "t");
    ab_str(a, t);
    ab_str(a, "o");
    ab_str(a, r->instance);
    ab_str(a, "ns");
    ab_ns(a, ns);
    ab_str(a, "tok");
    ab_tokens(a, tokens, n_tokens);
}

int gw_registry_commit(gw_registry_t *r, uint64_t ns, const char *tenant, const char *model,
                       const uint32_t *tokens, const gw_registry_point_t *points, size_t n_points,
                       uint64_t fence, uint64_t start_wall_ms, const char *worker)
{
    if (r == NULL || tokens == NULL || r->stopping || !name_ok(worker, GW_REGISTRY_NAME_MAX) ||
        tenant == NULL || !label_ok(tenant, strlen(tenant)) || model == NULL ||
        !label_ok(model, strlen(model)) ||
        check_points(r, points, n_points,
                     points != NULL && n_points > 0 ? points[n_points - 1].n_tokens : 0) != 0)
        return PC_ERR_INVAL;
    char h[GW_REGISTRY_MAX_POINTS][33];
    hash_points(ns, tokens, points, n_points, h);
    argb_t a = {0};
    ab_feed_keys(&a, r);
    ab_str(&a, r->instance);
    ab_u64(&a, fence);
    ab_ns_prefix(&a, r, 'e', ns);
    ab_ns_prefix(&a, r, 'c', ns);
    ab_str(&a, r->maxlen_str);
    ab_u64(&a, n_points);
    char pts[GW_REGISTRY_MAX_POINTS * 40 + 1];
    size_t pl = 0;
    for (size_t i = 0; i < n_points; i++) {
        uint64_t exp = start_wall_ms + r->p.ttl_ms[points[i].ttl];
        ab_str(&a, h[i]);
        ab_u64(&a, points[i].n_tokens);
        ab_u64(&a, points[i].ttl);
        ab_u64(&a, exp);
        pl += (size_t)snprintf(pts + pl, sizeof pts - pl, "%s%" PRIu32 ":%u:%" PRIu64, i ? "," : "",
                               points[i].n_tokens, (unsigned)points[i].ttl, exp);
    }
    ab_event_head(&a, r, 9, "w", ns, tokens, points[n_points - 1].n_tokens);
    ab_str(&a, "pts");
    ab_add(&a, pts, pl);
    ab_str(&a, "st");
    ab_u64(&a, start_wall_ms);
    ab_str(&a, "wk");
    ab_str(&a, worker);
    ab_str(&a, "tn");
    ab_str(&a, tenant);
    ab_str(&a, "md");
    ab_str(&a, model);
    return enqueue(r, GW_REGISTRY_OP_COMMIT, SC_COMMIT, &a);
}

int gw_registry_read(gw_registry_t *r, uint64_t ns, const uint32_t *tokens, size_t n_read,
                     const gw_registry_point_t *points, size_t n_points, uint64_t now_wall_ms)
{
    if (r == NULL || tokens == NULL || r->stopping || n_read == 0 ||
        n_read > r->p.max_event_tokens || check_points(r, points, n_points, n_read) != 0)
        return PC_ERR_INVAL;
    char h[GW_REGISTRY_MAX_POINTS][33];
    hash_points(ns, tokens, points, n_points, h);
    argb_t a = {0};
    ab_feed_keys(&a, r);
    ab_ns_prefix(&a, r, 'e', ns);
    ab_u64(&a, now_wall_ms);
    ab_str(&a, r->ttl_str[0]);
    ab_str(&a, r->ttl_str[1]);
    ab_str(&a, r->maxlen_str);
    ab_u64(&a, n_points);
    for (size_t i = 0; i < n_points; i++) {
        ab_str(&a, h[i]);
        ab_u64(&a, points[i].ttl);
    }
    ab_event_head(&a, r, 6, "r", ns, tokens, n_read);
    ab_str(&a, "n");
    ab_u64(&a, n_read);
    ab_str(&a, "now");
    ab_u64(&a, now_wall_ms);
    return enqueue(r, GW_REGISTRY_OP_READ, SC_READ, &a);
}

static int release_hashes(gw_registry_t *r, uint64_t ns, char (*h)[33], size_t n, uint64_t fence)
{
    argb_t a = {0};
    ab_str(&a, "1");
    ab_str(&a, r->k_gw);
    ab_str(&a, r->nonce);
    ab_str(&a, r->instance);
    ab_u64(&a, fence);
    ab_ns_prefix(&a, r, 'c', ns);
    for (size_t i = 0; i < n; i++)
        ab_str(&a, h[i]);
    return enqueue(r, GW_REGISTRY_OP_RELEASE, SC_RELEASE, &a);
}

int gw_registry_release(gw_registry_t *r, uint64_t ns, const uint32_t *tokens,
                        const gw_registry_point_t *points, size_t n_points, uint64_t fence)
{
    if (r == NULL || tokens == NULL || r->stopping || fence == 0 ||
        check_points(r, points, n_points,
                     points != NULL && n_points > 0 ? points[n_points - 1].n_tokens : 0) != 0)
        return PC_ERR_INVAL;
    char h[GW_REGISTRY_MAX_POINTS][33];
    hash_points(ns, tokens, points, n_points, h);
    return release_hashes(r, ns, h, n_points, fence);
}

/* ---------------------------------------------------------------------------------------------
 * Claims
 * ------------------------------------------------------------------------------------------- */

static void on_claim_timer(uv_timer_t *t);

static void claim_unwait(gw_registry_t *r, gw_registry_op_t *op)
{
    op->prev->next = op->next;
    op->next->prev = op->prev;
    op->prev = op->next = op;
    op->waiting = false;
    (void)r;
}

static void arm_claim_timer(gw_registry_t *r)
{
    if (r->waiting.next == &r->waiting || r->stopping) {
        uv_timer_stop(&r->claim_timer);
        return;
    }
    uint64_t now = now_ms(r), at = r->waiting.next->deadline;
    uv_timer_start(&r->claim_timer, on_claim_timer, at > now ? at - now : 0, 0);
}

static void claim_answer(gw_registry_t *r, gw_registry_op_t *op, gw_registry_status_t status,
                         int result)
{
    gw_registry_claim_result_t res = {.status = status, .seconds = secs_since(op->sent_ns)};
    r->st.claims[result]++;
    claim_unwait(r, op);
    op->cb(&res, op->ud);
}

static void on_claim_timer(uv_timer_t *t)
{
    gw_registry_t *r = t->data;
    uint64_t now = now_ms(r);
    while (r->waiting.next != &r->waiting && r->waiting.next->deadline <= now) {
        gw_registry_op_t *op = r->waiting.next;
        r->st.errors[GW_REGISTRY_OP_CLAIM][GW_REGISTRY_ERR_TIMEOUT]++;
        report_op(r, GW_REGISTRY_OP_CLAIM, secs_since(op->sent_ns));
        claim_answer(r, op, GW_REGISTRY_ST_TIMEOUT, GW_REGISTRY_CLAIM_TIMEOUT);
    }
    arm_claim_timer(r);
}

static bool reply_u64(const redisReply *e, uint64_t *out)
{
    if (e->type == REDIS_REPLY_INTEGER) {
        if (e->integer < 0)
            return false;
        *out = (uint64_t)e->integer;
        return true;
    }
    if (e->type != REDIS_REPLY_STRING || e->len == 0 || e->len > 20)
        return false;
    char *end;
    *out = strtoull(e->str, &end, 10);
    return end == e->str + e->len && e->str[0] >= '0' && e->str[0] <= '9';
}

static bool reply_name(const redisReply *e)
{
    return e->type == REDIS_REPLY_STRING && e->len <= GW_REGISTRY_NAME_MAX &&
           strlen(e->str) == e->len;
}

static void on_claim_reply(bill_redis_t *c, redisReply *rp, int status, void *priv)
{
    gw_registry_op_t *op = priv;
    gw_registry_t *r = op->r;
    (void)c;
    if (status != 0 || r->stopping) {
        if (op->waiting) {
            r->st.errors[GW_REGISTRY_OP_CLAIM][GW_REGISTRY_ERR_ERROR]++;
            claim_answer(r, op, GW_REGISTRY_ST_ERROR, GW_REGISTRY_CLAIM_ERROR);
            arm_claim_timer(r);
        }
        pc_free(op);
        return;
    }
    if (rp->type == REDIS_REPLY_ERROR) {
        int kind = script_error(r, rp, "claim");
        r->st.errors[GW_REGISTRY_OP_CLAIM][kind]++;
        if (op->waiting) {
            claim_answer(r, op,
                         kind == GW_REGISTRY_ERR_FENCED ? GW_REGISTRY_ST_FENCED
                                                        : GW_REGISTRY_ST_ERROR,
                         GW_REGISTRY_CLAIM_ERROR);
            arm_claim_timer(r);
        }
        pc_free(op);
        return;
    }
    r->st.ops[GW_REGISTRY_OP_CLAIM]++;
    gw_registry_point_result_t res[GW_REGISTRY_MAX_POINTS];
    uint64_t fence = 0;
    bool ok = rp->type == REDIS_REPLY_ARRAY && rp->elements == 1 + 3 * op->n_points &&
              reply_u64(rp->element[0], &fence);
    bool won = false, other = false;
    for (size_t i = 0; ok && i < op->n_points; i++) {
        redisReply **e = rp->element + 1 + 3 * i;
        gw_registry_point_result_t *p = &res[i];
        *p = (gw_registry_point_result_t){
            .n_tokens = op->points[i].n_tokens, .worker = "", .instance = ""};
        if (e[0]->type != REDIS_REPLY_STRING || e[0]->len != 1) {
            ok = false;
            break;
        }
        uint64_t a = 0, b = 0;
        switch (e[0]->str[0]) {
        case 'L':
            ok = reply_u64(e[1], &a) && reply_u64(e[2], &b) && b <= 1;
            p->state = GW_REGISTRY_PT_LIVE;
            p->expiry_wall_ms = a;
            p->ttl = (uint8_t)b;
            break;
        case 'O':
            ok = reply_name(e[1]) && reply_name(e[2]);
            p->state = GW_REGISTRY_PT_OTHER;
            if (ok) {
                p->worker = e[1]->str;
                p->instance = e[2]->str;
            }
            other = true;
            break;
        case 'M':
            ok = reply_u64(e[1], &a) && a == fence && fence != 0 && op->points[i].write;
            p->state = GW_REGISTRY_PT_MINE;
            won = true;
            break;
        case '-':
            p->state = GW_REGISTRY_PT_ABSENT;
            break;
        default:
            ok = false;
        }
    }
    if (!ok) {
        PC_LOG(PC_LOG_WARN, "registry", "claim: malformed reply from Redis");
        r->st.errors[GW_REGISTRY_OP_CLAIM][GW_REGISTRY_ERR_ERROR]++;
        if (op->waiting) {
            claim_answer(r, op, GW_REGISTRY_ST_ERROR, GW_REGISTRY_CLAIM_ERROR);
            arm_claim_timer(r);
        }
        pc_free(op);
        return;
    }
    if (op->waiting) {
        report_op(r, GW_REGISTRY_OP_CLAIM, secs_since(op->sent_ns));
        gw_registry_claim_result_t out = {.status = GW_REGISTRY_ST_OK,
                                          .n_points = op->n_points,
                                          .points = res,
                                          .fence = won ? fence : 0,
                                          .seconds = secs_since(op->sent_ns)};
        r->st.claims[won     ? GW_REGISTRY_CLAIM_WON
                     : other ? GW_REGISTRY_CLAIM_WAITED
                             : GW_REGISTRY_CLAIM_LIVE]++;
        claim_unwait(r, op);
        arm_claim_timer(r);
        op->cb(&out, op->ud);
    } else if (won) {
        /* Too late (deadline or cancel): the request decided without us; give the claims back. */
        char h[GW_REGISTRY_MAX_POINTS][33];
        size_t n = 0;
        for (size_t i = 0; i < op->n_points; i++)
            if (res[i].state == GW_REGISTRY_PT_MINE)
                memcpy(h[n++], op->hashes[i], 33);
        r->st.late_releases++;
        release_hashes(r, op->ns, h, n, fence);
    }
    pc_free(op);
}

int gw_registry_claim(gw_registry_t *r, uint64_t ns, const uint32_t *tokens, size_t n_tokens,
                      const gw_registry_point_t *points, size_t n_points, const char *worker,
                      gw_registry_claim_cb cb, void *ud, gw_registry_op_t **opp)
{
    if (opp != NULL)
        *opp = NULL;
    if (r == NULL || tokens == NULL || cb == NULL || opp == NULL ||
        !name_ok(worker, GW_REGISTRY_NAME_MAX) || check_points(r, points, n_points, n_tokens) != 0)
        return PC_ERR_INVAL;
    if (r->state != GW_REGISTRY_UP || !r->scripts_ok || r->stopping) {
        r->st.claims_refused_down++;
        return GW_REGISTRY_REFUSED_DOWN;
    }
    gw_registry_op_t *op = pc_calloc(1, sizeof *op);
    if (op == NULL)
        return PC_ERR_NOMEM;
    op->r = r;
    op->cb = cb;
    op->ud = ud;
    op->ns = ns;
    op->n_points = n_points;
    memcpy(op->points, points, n_points * sizeof *points);
    hash_points(ns, tokens, points, n_points, op->hashes);

    const char *av[12 + 4 * GW_REGISTRY_MAX_POINTS];
    size_t al[12 + 4 * GW_REGISTRY_MAX_POINTS];
    char nums[GW_REGISTRY_MAX_POINTS][2][24], eprefix[GW_REGISTRY_NAME_MAX + 32],
        cprefix[GW_REGISTRY_NAME_MAX + 32], nstr[24];
    snprintf(eprefix, sizeof eprefix, "%s:e:%016" PRIx64 ":", r->prefix, ns);
    snprintf(cprefix, sizeof cprefix, "%s:c:%016" PRIx64 ":", r->prefix, ns);
    snprintf(nstr, sizeof nstr, "%zu", n_points);
    int n = 0;
#define ARG(s) (av[n] = (s), al[n] = strlen(av[n]), n++)
    ARG("2");
    ARG(r->k_gw);
    ARG(r->k_fence);
    ARG(r->nonce);
    ARG(r->instance);
    ARG(worker);
    ARG(r->claim_ttl_str);
    ARG(eprefix);
    ARG(cprefix);
    ARG(nstr);
    for (size_t i = 0; i < n_points; i++) {
        snprintf(nums[i][0], 24, "%" PRIu32, points[i].n_tokens);
        snprintf(nums[i][1], 24, "%u", (unsigned)points[i].ttl);
        ARG(op->hashes[i]);
        ARG(nums[i][0]);
        ARG(nums[i][1]);
        ARG(points[i].write ? "1" : "0");
    }
#undef ARG
    op->sent_ns = pc_time_mono_ns();
    int rc = send_script(r, r->rc, SC_CLAIM, 0, on_claim_reply, op, n, av, al);
    if (rc != 0) {
        pc_free(op);
        if (rc == PC_ERR_UPSTREAM) {
            r->st.claims_refused_down++;
            return GW_REGISTRY_REFUSED_DOWN;
        }
        return rc;
    }
    op->waiting = true;
    op->deadline = now_ms(r) + r->p.timeout_ms;
    op->prev = r->waiting.prev;
    op->next = &r->waiting;
    r->waiting.prev->next = op;
    r->waiting.prev = op;
    if (op->prev == &r->waiting)
        arm_claim_timer(r);
    *opp = op;
    return 0;
}

void gw_registry_cancel(gw_registry_t *r, gw_registry_op_t *op)
{
    if (r == NULL || op == NULL || !op->waiting)
        return;
    bool head = r->waiting.next == op;
    claim_unwait(r, op);
    if (head)
        arm_claim_timer(r);
}

/* ---------------------------------------------------------------------------------------------
 * Leases: registration, renewal, meter
 * ------------------------------------------------------------------------------------------- */

/* The register script's arguments from its keys count on: 4 keys, nonce lease instance secret,
 * then each setting's name and value. Returns their count. */
#define REGISTER_ARGS (9 + 2 * GW_REGISTRY_MAX_SETTINGS)
static int register_args(const gw_registry_t *r, const char **av, size_t *al)
{
    int n = 0;
    av[n++] = "4";
    av[n++] = r->k_gw;
    av[n++] = r->k_gws;
    av[n++] = r->k_secret;
    av[n++] = r->k_settings;
    av[n++] = r->nonce;
    av[n++] = r->lease_str;
    av[n++] = r->instance;
    av[n++] = r->secret_hex;
    for (size_t i = 0; i < r->n_settings; i++) {
        av[n++] = r->set_name[i];
        av[n++] = r->set_value[i];
    }
    for (int i = 0; i < n; i++)
        al[i] = strlen(av[i]);
    return n;
}

/* The reason of a KVGWSETTINGS refusal ("KVGWSETTINGS <i> <stored value>"), naming the setting,
 * its value here and the one stored. */
static void settings_refusal(const gw_registry_t *r, const redisReply *rp, char *out, size_t len)
{
    const char *s = strstr(rp->str, "KVGWSETTINGS ");
    char *end = NULL;
    unsigned long i = s != NULL ? strtoul(s + 13, &end, 10) : ULONG_MAX;
    if (i >= r->n_settings || end == NULL || *end != ' ') {
        snprintf(out, len, "a setting differs from the ones in %s (%.200s)", r->k_settings,
                 rp->str);
        return;
    }
    snprintf(out, len,
             "setting %s is '%s' here but '%.128s' in %s (written by the first gateway of "
             "this registry): gateways that share a registry must bill alike (to change "
             "it for all of them, stop every gateway and DEL %s)",
             r->set_name[i], r->set_value[i], end + 1, r->k_settings, r->k_settings);
}

static void on_register_reply(bill_redis_t *c, redisReply *rp, int status, void *priv)
{
    gw_registry_t *r = priv;
    (void)c;
    r->lease_inflight = false;
    if (status != 0 || r->stopping) {
        if (status != 0 && !r->stopping)
            r->st.errors[GW_REGISTRY_OP_LEASE][status == PC_ERR_TIMEOUT ? GW_REGISTRY_ERR_TIMEOUT
                                                                        : GW_REGISTRY_ERR_ERROR]++;
        return;
    }
    if (is_error(rp, "KVGWSECRET")) {
        r->secret_refused = true;
        r->st.errors[GW_REGISTRY_OP_LEASE][GW_REGISTRY_ERR_FENCED]++;
        set_state(r, GW_REGISTRY_FENCED,
                  "the namespace secret differs from the one in %s: this gateway would isolate "
                  "its tenants from the others; refusing to use the registry",
                  r->k_secret);
        return;
    }
    if (is_error(rp, "KVGWSETTINGS")) {
        char why[1024];
        settings_refusal(r, rp, why, sizeof why);
        r->secret_refused = true;
        r->st.errors[GW_REGISTRY_OP_LEASE][GW_REGISTRY_ERR_FENCED]++;
        set_state(r, GW_REGISTRY_FENCED, "refusing to use the registry: %s", why);
        return;
    }
    if (rp->type == REDIS_REPLY_ERROR) {
        r->st.errors[GW_REGISTRY_OP_LEASE][script_error(r, rp, "register")]++;
        return;
    }
    if (rp->type != REDIS_REPLY_ARRAY || rp->elements != 2 ||
        rp->element[0]->type != REDIS_REPLY_STRING) {
        r->st.errors[GW_REGISTRY_OP_LEASE][GW_REGISTRY_ERR_ERROR]++;
        return;
    }
    r->st.ops[GW_REGISTRY_OP_LEASE]++;
    const char *what = rp->element[0]->str;
    if (strcmp(what, "taken") == 0) {
        set_state(r, GW_REGISTRY_FENCED, "instance id '%s' is registered by another gateway",
                  r->instance);
        return;
    }
    if (strcmp(what, "registered") == 0)
        r->st.n_registrations++;
    if (!r->secret_refused)
        set_state(r, GW_REGISTRY_UP, "registered as '%s' (%s)", r->instance,
                  strcmp(what, "registered") == 0 ? "new lease" : "lease renewed");
    pump_queue(r); /* the state may have been UP already (the start's registration) */
}

typedef struct meter_ctx {
    gw_registry_t *r;
    uint64_t sent_at; /* uv_now */
    uint64_t sent_ns;
} meter_ctx_t;

static void on_meter_reply(bill_redis_t *c, redisReply *rp, int status, void *priv)
{
    meter_ctx_t *m = priv;
    gw_registry_t *r = m->r;
    (void)c;
    if (status == 0 && !r->stopping) {
        if (rp->type == REDIS_REPLY_INTEGER) {
            r->st.ops[GW_REGISTRY_OP_LEASE]++;
            report_op(r, GW_REGISTRY_OP_LEASE, secs_since(m->sent_ns));
            if (rp->integer == 1) {
                if (r->meter_until == 0)
                    PC_LOG(PC_LOG_INFO, "registry", "this gateway meters storage (%s)", r->k_meter);
                r->meter_until = m->sent_at + r->p.lease_ms;
                r->meter_confirmed = true;
            } else {
                r->meter_until = 0;
                r->meter_confirmed = false;
            }
        } else if (rp->type == REDIS_REPLY_ERROR) {
            r->st.errors[GW_REGISTRY_OP_LEASE][script_error(r, rp, "meter lease")]++;
            r->meter_until = 0;
        }
    }
    pc_free(m);
}

static void send_leases(gw_registry_t *r)
{
    if (!r->scripts_ok || r->stopping || r->lease_inflight || !bill_redis_is_up(r->rc))
        return;
    const char *av[REGISTER_ARGS];
    size_t al[REGISTER_ARGS];
    int n = register_args(r, av, al);
    if (send_script(r, r->rc, SC_REGISTER, 0, on_register_reply, r, n, av, al) != 0)
        return;
    r->lease_inflight = true;
    if (!r->p.meter || r->secret_refused)
        return;
    meter_ctx_t *m = pc_calloc(1, sizeof *m);
    if (m == NULL)
        return;
    m->r = r;
    m->sent_at = now_ms(r);
    m->sent_ns = pc_time_mono_ns();
    const char *mv[5] = {"2", r->k_gw, r->k_meter, r->nonce, r->lease_str};
    size_t ml[5];
    for (int i = 0; i < 5; i++)
        ml[i] = strlen(mv[i]);
    if (send_script(r, r->rc, SC_METER, 0, on_meter_reply, m, 5, mv, ml) != 0)
        pc_free(m);
}

static void on_lease_timer(uv_timer_t *t)
{
    send_leases(t->data);
}

gw_registry_meter_t gw_registry_meter(const gw_registry_t *r)
{
    if (r == NULL || r->meter_until == 0 || uv_now(r->loop) >= r->meter_until)
        return GW_REGISTRY_METER_NONE;
    return r->state == GW_REGISTRY_UP && r->meter_confirmed ? GW_REGISTRY_METER_SHARED
                                                            : GW_REGISTRY_METER_LOCAL;
}

/* ---------------------------------------------------------------------------------------------
 * The main connection
 * ------------------------------------------------------------------------------------------- */

typedef struct load_ctx {
    gw_registry_t *r;
    int script;
} load_ctx_t;

static void on_load_reply(bill_redis_t *c, redisReply *rp, int status, void *priv)
{
    load_ctx_t *l = priv;
    gw_registry_t *r = l->r;
    int idx = l->script;
    pc_free(l);
    if (status != 0 || r->stopping)
        return;
    if (rp->type != REDIS_REPLY_STRING || rp->len != 40) {
        PC_LOG(PC_LOG_ERROR, "registry", "SCRIPT LOAD failed: %.200s",
               rp->type == REDIS_REPLY_ERROR ? rp->str : "bad reply");
        bill_redis_reconnect(c, "SCRIPT LOAD failed");
        return;
    }
    memcpy(r->sha[idx], rp->str, 40);
    r->sha[idx][40] = '\0';
    if (--r->scripts_pending == 0) {
        r->scripts_ok = true;
        send_leases(r);
    }
}

static void on_main_up(bill_redis_t *c, void *ud)
{
    gw_registry_t *r = ud;
    bill_redis_stats_t rs;
    bill_redis_stats(c, &rs);
    if (rs.n_failovers != r->seen_failovers) {
        r->seen_failovers = rs.n_failovers;
        resend_recent(r);
    }
    r->scripts_ok = false;
    r->lease_inflight = false;
    r->scripts_pending = SC_COUNT;
    for (int i = 0; i < SC_COUNT; i++) {
        load_ctx_t *l = pc_calloc(1, sizeof *l);
        const char *av[3] = {"SCRIPT", "LOAD", scripts[i]};
        size_t al[3] = {6, 4, strlen(scripts[i])};
        if (l == NULL) {
            bill_redis_reconnect(c, "out of memory");
            return;
        }
        l->r = r;
        l->script = i;
        if (bill_redis_send(c, 0, on_load_reply, l, 3, av, al) != 0) {
            pc_free(l);
            return;
        }
    }
}

static void on_main_down(bill_redis_t *c, const char *reason, void *ud)
{
    gw_registry_t *r = ud;
    (void)c;
    r->scripts_ok = false;
    r->lease_inflight = false;
    r->meter_confirmed = false;
    if (r->state == GW_REGISTRY_UP)
        set_state(r, GW_REGISTRY_DOWN, "Redis connection lost: %s", reason);
}

/* ---------------------------------------------------------------------------------------------
 * The feed
 * ------------------------------------------------------------------------------------------- */

typedef struct sid {
    uint64_t ms, seq;
} sid_t;

static bool parse_id(const char *s, size_t len, sid_t *out)
{
    char b[48];
    if (len == 0 || len >= sizeof b)
        return false;
    memcpy(b, s, len);
    b[len] = '\0';
    char *end;
    if (b[0] < '0' || b[0] > '9')
        return false;
    out->ms = strtoull(b, &end, 10);
    if (*end != '-' || end[1] < '0' || end[1] > '9')
        return false;
    out->seq = strtoull(end + 1, &end, 10);
    return *end == '\0';
}

static bool id_gt(sid_t a, sid_t b)
{
    return a.ms > b.ms || (a.ms == b.ms && a.seq > b.seq);
}

static void feed_poll(gw_registry_t *r);

static const redisReply *xinfo_field(const redisReply *rp, const char *name)
{
    if (rp->type != REDIS_REPLY_ARRAY)
        return NULL;
    for (size_t i = 0; i + 1 < rp->elements; i += 2) {
        const redisReply *k = rp->element[i];
        if (k->type == REDIS_REPLY_STRING && strcmp(k->str, name) == 0)
            return rp->element[i + 1];
    }
    return NULL;
}

/* XINFO STREAM before the first XREAD: where the feed starts (its end). */
static void on_feed_start(bill_redis_t *c, redisReply *rp, int status, void *priv)
{
    gw_registry_t *r = priv;
    (void)c;
    r->feed_inflight = false;
    if (status != 0 || r->stopping)
        return;
    const redisReply *last = xinfo_field(rp, "last-generated-id");
    sid_t id;
    if (last != NULL && last->type == REDIS_REPLY_STRING && parse_id(last->str, last->len, &id))
        snprintf(r->feed_last, sizeof r->feed_last, "%" PRIu64 "-%" PRIu64, id.ms, id.seq);
    else if (rp->type == REDIS_REPLY_ERROR) /* no stream yet */
        snprintf(r->feed_last, sizeof r->feed_last, "0-0");
    else {
        bill_redis_reconnect(r->fc, "bad XINFO reply");
        return;
    }
    feed_poll(r);
}

/* XINFO STREAM right before each XREAD: entries deleted beyond our last id were trimmed before
 * we read them (a gap). */
static void on_feed_info(bill_redis_t *c, redisReply *rp, int status, void *priv)
{
    gw_registry_t *r = priv;
    (void)c;
    if (status != 0 || r->stopping || rp->type != REDIS_REPLY_ARRAY)
        return;
    const redisReply *md = xinfo_field(rp, "max-deleted-entry-id");
    sid_t del, last, counted = {r->gap_counted_ms, r->gap_counted_seq};
    if (md == NULL || md->type != REDIS_REPLY_STRING || !parse_id(md->str, md->len, &del) ||
        !parse_id(r->feed_last, strlen(r->feed_last), &last))
        return;
    if (id_gt(del, last) && id_gt(del, counted)) {
        r->st.feed_gaps++;
        r->gap_counted_ms = del.ms;
        r->gap_counted_seq = del.seq;
        PC_LOG(PC_LOG_WARN, "registry",
               "feed gap: entries after %s were trimmed before this gateway read them (up to "
               "%" PRIu64 "-%" PRIu64 "); only hits can be lost",
               r->feed_last, del.ms, del.seq);
    }
}

static bool field_is(const redisReply *k, const char *name)
{
    return k->type == REDIS_REPLY_STRING && k->len == strlen(name) &&
           memcmp(k->str, name, k->len) == 0;
}

static bool parse_dec(const char *s, size_t len, uint64_t *out)
{
    if (len == 0 || len > 19)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return true;
}

static bool parse_hex64(const char *s, size_t len, uint64_t *out)
{
    if (len != 16)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < 16; i++) {
        int d = s[i] >= '0' && s[i] <= '9'   ? s[i] - '0'
                : s[i] >= 'a' && s[i] <= 'f' ? s[i] - 'a' + 10
                                             : -1;
        if (d < 0)
            return false;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return true;
}

static bool str_name(const redisReply *v, bool allow_empty)
{
    if (v->type != REDIS_REPLY_STRING || v->len > GW_REGISTRY_NAME_MAX ||
        (!allow_empty && v->len == 0))
        return false;
    for (size_t i = 0; i < v->len; i++)
        if ((unsigned char)v->str[i] <= 0x20 || (unsigned char)v->str[i] >= 0x7f)
            return false;
    return true;
}

/* One stream entry: [id, [f, v, ...]]. Returns 0 applied, 1 skipped (ours), -1 rejected; *type
 * gets 'w' or 'r' when the type field was valid. */
static int feed_entry(gw_registry_t *r, const redisReply *ent, sid_t id, char *type)
{
    *type = 0;
    if (ent->type != REDIS_REPLY_ARRAY || ent->elements != 2 ||
        ent->element[1]->type != REDIS_REPLY_ARRAY || ent->element[1]->elements % 2 != 0 ||
        ent->element[1]->elements > 64)
        return -1;
    const redisReply *f = ent->element[1];
    enum { F_T, F_O, F_NS, F_TOK, F_PTS, F_ST, F_WK, F_TN, F_MD, F_N, F_NOW, F_COUNT };
    static const char *const names[F_COUNT] = {"t",  "o",  "ns", "tok", "pts", "st",
                                               "wk", "tn", "md", "n",   "now"};
    const redisReply *v[F_COUNT] = {0};
    for (size_t i = 0; i < f->elements; i += 2) {
        if (f->element[i + 1]->type != REDIS_REPLY_STRING)
            return -1;
        for (int k = 0; k < F_COUNT; k++)
            if (field_is(f->element[i], names[k])) {
                if (v[k] != NULL)
                    return -1; /* a duplicate field */
                v[k] = f->element[i + 1];
            }
    }
    if (v[F_T] == NULL || v[F_T]->len != 1 || (v[F_T]->str[0] != 'w' && v[F_T]->str[0] != 'r'))
        return -1;
    *type = v[F_T]->str[0];
    gw_registry_feed_event_t ev = {.type = *type, .event_wall_ms = id.ms};
    if (v[F_O] == NULL || !str_name(v[F_O], false))
        return -1;
    ev.origin = v[F_O]->str;
    if (strcmp(ev.origin, r->instance) == 0)
        return 1;
    if (v[F_NS] == NULL || !parse_hex64(v[F_NS]->str, v[F_NS]->len, &ev.ns))
        return -1;
    if (v[F_TOK] == NULL || v[F_TOK]->len == 0 || v[F_TOK]->len % 4 != 0 ||
        v[F_TOK]->len / 4 > r->p.max_event_tokens)
        return -1;
    size_t n = v[F_TOK]->len / 4;
    if (n > r->tokcap) {
        uint32_t *nb = pc_reallocarray(r->tokbuf, n, sizeof *nb);
        if (nb == NULL)
            return -1;
        r->tokbuf = nb;
        r->tokcap = n;
    }
    const uint8_t *tb = (const uint8_t *)v[F_TOK]->str;
    for (size_t i = 0; i < n; i++)
        r->tokbuf[i] = (uint32_t)tb[4 * i] | (uint32_t)tb[4 * i + 1] << 8 |
                       (uint32_t)tb[4 * i + 2] << 16 | (uint32_t)tb[4 * i + 3] << 24;
    ev.tokens = r->tokbuf;
    ev.n_tokens = n;
    gw_registry_feed_point_t pts[GW_REGISTRY_MAX_POINTS];
    if (*type == 'w') {
        if (v[F_PTS] == NULL || v[F_ST] == NULL || v[F_WK] == NULL ||
            !parse_dec(v[F_ST]->str, v[F_ST]->len, &ev.start_wall_ms) || !str_name(v[F_WK], false))
            return -1;
        ev.worker = v[F_WK]->str;
        /* The namespace's owner: both or neither (a gateway older than these fields). */
        if ((v[F_TN] == NULL) != (v[F_MD] == NULL) ||
            (v[F_TN] != NULL &&
             (!label_ok(v[F_TN]->str, v[F_TN]->len) || strlen(v[F_TN]->str) != v[F_TN]->len ||
              !label_ok(v[F_MD]->str, v[F_MD]->len) || strlen(v[F_MD]->str) != v[F_MD]->len)))
            return -1;
        ev.tenant = v[F_TN] != NULL ? v[F_TN]->str : "";
        ev.model = v[F_MD] != NULL ? v[F_MD]->str : "";
        /* pts: "len:ttl:expiry" joined by ',' */
        const char *s = v[F_PTS]->str, *end = s + v[F_PTS]->len;
        size_t np = 0;
        uint64_t prev = 0;
        while (s < end) {
            if (np == GW_REGISTRY_MAX_POINTS)
                return -1;
            const char *c1 = memchr(s, ':', (size_t)(end - s));
            if (c1 == NULL)
                return -1;
            const char *c2 = memchr(c1 + 1, ':', (size_t)(end - c1 - 1));
            if (c2 == NULL)
                return -1;
            const char *c3 = memchr(c2 + 1, ',', (size_t)(end - c2 - 1));
            if (c3 == NULL)
                c3 = end;
            uint64_t len, ttl, exp;
            if (!parse_dec(s, (size_t)(c1 - s), &len) ||
                !parse_dec(c1 + 1, (size_t)(c2 - c1 - 1), &ttl) ||
                !parse_dec(c2 + 1, (size_t)(c3 - c2 - 1), &exp) || len <= prev || len > n ||
                ttl > 1)
                return -1;
            pts[np++] = (gw_registry_feed_point_t){(uint32_t)len, (uint8_t)ttl, exp};
            prev = len;
            s = c3 < end ? c3 + 1 : end;
            if (c3 < end && s == end)
                return -1; /* a trailing comma */
        }
        if (np == 0 || prev != n)
            return -1;
        ev.points = pts;
        ev.n_points = np;
    } else {
        uint64_t nr;
        if (v[F_N] == NULL || v[F_NOW] == NULL || !parse_dec(v[F_N]->str, v[F_N]->len, &nr) ||
            nr != n || !parse_dec(v[F_NOW]->str, v[F_NOW]->len, &ev.now_wall_ms))
            return -1;
        ev.worker = ev.tenant = ev.model = "";
    }
    if (r->p.on_feed != NULL && r->p.on_feed(&ev, r->p.ud) < 0)
        return -1;
    return 0;
}

static void on_feed_read(bill_redis_t *c, redisReply *rp, int status, void *priv)
{
    gw_registry_t *r = priv;
    (void)c;
    r->feed_inflight = false;
    if (status != 0 || r->stopping)
        return; /* redisconn reconnects; on_feed_up resumes from feed_last */
    if (rp->type == REDIS_REPLY_ERROR) {
        PC_LOG(PC_LOG_WARN, "registry", "feed XREAD failed: %.200s", rp->str);
        bill_redis_reconnect(r->fc, "XREAD failed");
        return;
    }
    if (rp->type == REDIS_REPLY_ARRAY) {
        /* [[key, [entry...]]] */
        if (rp->elements != 1 || rp->element[0]->type != REDIS_REPLY_ARRAY ||
            rp->element[0]->elements != 2 ||
            rp->element[0]->element[1]->type != REDIS_REPLY_ARRAY) {
            r->st.feed_rejected_other++;
            bill_redis_reconnect(r->fc, "malformed XREAD reply");
            return;
        }
        const redisReply *ents = rp->element[0]->element[1];
        for (size_t i = 0; i < ents->elements && i < r->p.feed_count; i++) {
            const redisReply *ent = ents->element[i];
            sid_t id, last;
            if (ent->type != REDIS_REPLY_ARRAY || ent->elements < 1 ||
                ent->element[0]->type != REDIS_REPLY_STRING ||
                !parse_id(ent->element[0]->str, ent->element[0]->len, &id) ||
                !parse_id(r->feed_last, strlen(r->feed_last), &last) || !id_gt(id, last)) {
                r->st.feed_rejected_other++;
                bill_redis_reconnect(r->fc, "malformed stream entry id");
                return;
            }
            snprintf(r->feed_last, sizeof r->feed_last, "%" PRIu64 "-%" PRIu64, id.ms, id.seq);
            char type;
            int res = feed_entry(r, ent, id, &type);
            if (type == 0) {
                r->st.feed_rejected_other++;
                continue;
            }
            int ti = type == 'w' ? 0 : 1;
            r->st.feed[ti][res == 0 ? 0 : res == 1 ? 1 : 2]++;
            if (res == 0)
                r->st.feed_last_event_wall_ms = id.ms;
        }
    }
    feed_poll(r);
}

static void feed_poll(gw_registry_t *r)
{
    if (r->stopping || r->feed_inflight || !bill_redis_is_up(r->fc))
        return;
    if (r->feed_last[0] == '\0') {
        const char *av[3] = {"XINFO", "STREAM", r->k_feed};
        size_t al[3] = {5, 6, strlen(r->k_feed)};
        if (bill_redis_send(r->fc, 0, on_feed_start, r, 3, av, al) == 0)
            r->feed_inflight = true;
        return;
    }
    const char *iv[3] = {"XINFO", "STREAM", r->k_feed};
    size_t il[3] = {5, 6, strlen(r->k_feed)};
    char count[24], block[24];
    snprintf(count, sizeof count, "%u", r->p.feed_count);
    snprintf(block, sizeof block, "%u", r->p.feed_block_ms);
    const char *av[8] = {"XREAD", "COUNT",   count,     "BLOCK",
                         block,   "STREAMS", r->k_feed, r->feed_last};
    size_t al[8];
    for (int i = 0; i < 8; i++)
        al[i] = strlen(av[i]);
    if (bill_redis_send(r->fc, 0, on_feed_info, r, 3, iv, il) != 0)
        return;
    if (bill_redis_send(r->fc, r->p.feed_block_ms + r->p.redis.timeout_ms, on_feed_read, r, 8, av,
                        al) == 0)
        r->feed_inflight = true;
}

static void on_feed_up(bill_redis_t *c, void *ud)
{
    gw_registry_t *r = ud;
    (void)c;
    r->feed_inflight = false;
    feed_poll(r);
}

/* ---------------------------------------------------------------------------------------------
 * Start and stop
 * ------------------------------------------------------------------------------------------- */

/* One CONFIG GET value into out (cap bytes): 1 when Redis answered it, 0 when it refused
 * (renamed, an ACL), PC_ERR_UPSTREAM when the connection failed. */
static int config_get(redisContext *ctx, const char *name, char *out, size_t cap)
{
    redisReply *rp = redisCommand(ctx, "CONFIG GET %s", name);
    if (rp == NULL)
        return PC_ERR_UPSTREAM;
    bool ok = rp->type == REDIS_REPLY_ARRAY && rp->elements == 2 &&
              rp->element[1]->type == REDIS_REPLY_STRING;
    if (ok)
        snprintf(out, cap, "%s", rp->element[1]->str);
    freeReplyObject(rp);
    return ok ? 1 : 0;
}

/* The registry's Redis must never evict: an evicted claim bills a second write, an evicted
 * registration fences a live gateway, an evicted entry loses a read. A server with a memory
 * limit and any policy but noeviction is refused (PC_ERR_STATE); one whose CONFIG is not
 * available to us (renamed, an ACL, a managed service) is accepted with a warning. */
static int eviction_check(redisContext *ctx, char *err, size_t err_len)
{
    char policy[64], maxmem[32];
    int a = config_get(ctx, "maxmemory-policy", policy, sizeof policy);
    int b = a == 1 ? config_get(ctx, "maxmemory", maxmem, sizeof maxmem) : a;
    if (a < 0 || b < 0)
        return pc_err_setf(err, err_len, PC_ERR_UPSTREAM, "registry: Redis: %s", ctx->errstr);
    if (a == 0 || b == 0) {
        PC_LOG(PC_LOG_WARN, "registry",
               "Redis refused CONFIG GET maxmemory-policy: make sure it is noeviction, or the "
               "registry's claims and entries can vanish under memory pressure");
        return 0;
    }
    if (strcmp(policy, "noeviction") == 0 || strcmp(maxmem, "0") == 0)
        return 0;
    return pc_err_setf(err, err_len, PC_ERR_STATE,
                       "registry: Redis evicts keys (maxmemory %s, maxmemory-policy %s): the "
                       "registry's entries and claims would vanish under memory pressure; give it "
                       "a Redis with maxmemory-policy noeviction (and persistence)",
                       maxmem, policy);
}

/* The blocking checks at start on a connected context. Returns 0 (registered), PC_ERR_PERM
 * (secret), PC_ERR_EXISTS (live duplicate), PC_ERR_STATE (settings differ, or a Redis that
 * evicts), PC_ERR_UPSTREAM (Redis failed meanwhile). */
static int start_checks(gw_registry_t *r, redisContext *ctx, char *err, size_t err_len)
{
    int erc = eviction_check(ctx, err, err_len);
    if (erc != 0)
        return erc;
    uint64_t poll_ms = r->p.lease_ms / 10;
    if (poll_ms < 10)
        poll_ms = 10;
    if (poll_ms > 500)
        poll_ms = 500;
    uint64_t t0 = pc_time_mono_ms(), prev_pttl = UINT64_MAX;
    const char *av[2 + REGISTER_ARGS];
    size_t al[2 + REGISTER_ARGS];
    av[0] = "EVAL";
    al[0] = 4;
    av[1] = sc_register;
    al[1] = strlen(sc_register);
    int n = 2 + register_args(r, av + 2, al + 2);
    for (;;) {
        redisReply *rp = redisCommandArgv(ctx, n, av, al);
        if (rp == NULL)
            return pc_err_setf(err, err_len, PC_ERR_UPSTREAM, "registry: Redis: %s", ctx->errstr);
        if (is_error(rp, "KVGWSECRET")) {
            freeReplyObject(rp);
            return pc_err_setf(err, err_len, PC_ERR_PERM,
                               "registry: cache.namespace_secret differs from the one the other "
                               "gateways use (%s): refusing to start (tenants would be isolated "
                               "across gateways)",
                               r->k_secret);
        }
        if (is_error(rp, "KVGWSETTINGS")) {
            char why[1024];
            settings_refusal(r, rp, why, sizeof why);
            freeReplyObject(rp);
            return pc_err_setf(err, err_len, PC_ERR_STATE, "registry: %s", why);
        }
        if (rp->type != REDIS_REPLY_ARRAY || rp->elements != 2 ||
            rp->element[0]->type != REDIS_REPLY_STRING ||
            rp->element[1]->type != REDIS_REPLY_INTEGER) {
            int rc = pc_err_setf(err, err_len, PC_ERR_UPSTREAM, "registry: register: %s",
                                 rp->type == REDIS_REPLY_ERROR ? rp->str : "bad reply");
            freeReplyObject(rp);
            return rc;
        }
        bool taken = strcmp(rp->element[0]->str, "taken") == 0;
        bool fresh = strcmp(rp->element[0]->str, "registered") == 0;
        uint64_t pttl = rp->element[1]->integer > 0 ? (uint64_t)rp->element[1]->integer : 0;
        freeReplyObject(rp);
        if (!taken) {
            if (fresh)
                r->st.n_registrations++;
            return 0;
        }
        if (prev_pttl != UINT64_MAX && pttl > prev_pttl)
            return pc_err_setf(err, err_len, PC_ERR_EXISTS,
                               "registry: instance id '%s' is in use by a live gateway (%s is "
                               "being renewed): give each gateway its own billing.instance_id",
                               r->instance, r->k_gw);
        if (pc_time_mono_ms() - t0 > r->p.lease_ms + r->p.redis.timeout_ms + poll_ms)
            return pc_err_setf(err, err_len, PC_ERR_EXISTS,
                               "registry: instance id '%s' stays registered (%s)", r->instance,
                               r->k_gw);
        if (prev_pttl == UINT64_MAX)
            PC_LOG(PC_LOG_WARN, "registry",
                   "instance id '%s' is registered by another process; waiting up to one lease "
                   "to see whether it is alive",
                   r->instance);
        prev_pttl = pttl;
        usleep((useconds_t)poll_ms * 1000);
    }
}

static void registry_free(gw_registry_t *r)
{
    pc_free(r->settings_blob);
    while (r->recent.head.next != NULL && r->recent.head.next != &r->recent.head) {
        qop_t *o = r->recent.head.next;
        ql_unlink(&r->recent, o);
        pc_free(o);
    }
    pc_free(r->sentinels);
    pc_free(r->master_name);
    pc_free(r->password);
    pc_free(r->sentinel_password);
    pc_free(r->tokbuf);
    pc_free(r);
}

static void free_cb(void *ud)
{
    registry_free(ud);
}

static bool copy_opt(const char *s, char **out)
{
    *out = s != NULL ? pc_strdup(s) : NULL;
    return s == NULL || *out != NULL;
}

int gw_registry_start(uv_loop_t *loop, const gw_registry_params_t *p, gw_registry_t **out,
                      char *err, size_t err_len)
{
    *out = NULL;
    if (loop == NULL || p == NULL)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "registry: no loop or params");
    if (!name_ok(p->instance, 64))
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "registry: instance id must be 1-64 printable characters without "
                           "spaces");
    if (!name_ok(p->prefix, 64))
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "registry: bad prefix");
    if (p->timeout_ms == 0 || p->claim_ttl_ms <= p->timeout_ms || p->lease_ms < 40 ||
        p->feed_maxlen == 0 || p->replay_max == 0 || p->replay_max_bytes == 0 ||
        p->max_event_tokens == 0 || p->feed_count == 0 || p->feed_count > 65536 ||
        p->feed_block_ms == 0 || p->ttl_ms[0] == 0 || p->ttl_ms[1] == 0)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "registry: timeout > 0, claim_ttl > timeout, lease >= 40 ms and "
                           "non-zero bounds are needed");
    int rc = bill_redis_params_check(&p->redis, err, err_len);
    if (rc != 0)
        return rc;
    if (p->n_settings > GW_REGISTRY_MAX_SETTINGS || (p->n_settings > 0 && p->settings == NULL))
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "registry: at most %d settings",
                           GW_REGISTRY_MAX_SETTINGS);
    size_t set_bytes = 0;
    for (size_t i = 0; i < p->n_settings; i++) {
        const gw_registry_setting_t *st = &p->settings[i];
        if (st->name == NULL || st->value == NULL || !setting_str_ok(st->name) ||
            !setting_str_ok(st->value))
            return pc_err_setf(err, err_len, PC_ERR_INVAL,
                               "registry: setting %zu: a name and a value of 1-%d bytes without "
                               "control characters are needed",
                               i, GW_REGISTRY_NAME_MAX);
        for (size_t j = 0; j < i; j++)
            if (strcmp(p->settings[j].name, st->name) == 0)
                return pc_err_setf(err, err_len, PC_ERR_INVAL, "registry: setting %s given twice",
                                   st->name);
        set_bytes += strlen(st->name) + strlen(st->value) + 2;
    }
    gw_registry_t *r = pc_calloc(1, sizeof *r);
    if (r == NULL)
        return PC_ERR_NOMEM;
    if (p->n_settings > 0 && (r->settings_blob = pc_malloc(set_bytes)) == NULL) {
        pc_free(r);
        return PC_ERR_NOMEM;
    }
    for (size_t i = 0, at = 0; i < p->n_settings; i++) {
        size_t ln = strlen(p->settings[i].name) + 1, lv = strlen(p->settings[i].value) + 1;
        memcpy(r->settings_blob + at, p->settings[i].name, ln);
        r->set_name[i] = r->settings_blob + at;
        memcpy(r->settings_blob + at + ln, p->settings[i].value, lv);
        r->set_value[i] = r->settings_blob + at + ln;
        at += ln + lv;
    }
    r->n_settings = p->n_settings;
    r->loop = loop;
    r->p = *p;
    r->p.settings = NULL; /* copied above into set_name / set_value */
    r->p.n_settings = 0;
    snprintf(r->instance, sizeof r->instance, "%s", p->instance);
    snprintf(r->prefix, sizeof r->prefix, "%s", p->prefix);
    r->p.instance = r->instance;
    r->p.prefix = r->prefix;
    bool ok = copy_opt(p->redis.master_name, &r->master_name) &&
              copy_opt(p->redis.password, &r->password) &&
              copy_opt(p->redis.sentinel_password, &r->sentinel_password);
    if (ok && p->redis.n_sentinels > 0) {
        r->sentinels = pc_calloc(p->redis.n_sentinels, sizeof *r->sentinels);
        ok = r->sentinels != NULL;
        if (ok)
            memcpy(r->sentinels, p->redis.sentinels, p->redis.n_sentinels * sizeof *r->sentinels);
    }
    if (!ok) {
        registry_free(r);
        return PC_ERR_NOMEM;
    }
    r->p.redis.sentinels = r->sentinels;
    r->p.redis.master_name = r->master_name;
    r->p.redis.password = r->password;
    r->p.redis.sentinel_password = r->sentinel_password;
    uint8_t nb[16];
    if (getrandom(nb, sizeof nb, 0) != (ssize_t)sizeof nb) {
        registry_free(r);
        return pc_err_setf(err, err_len, PC_ERR_IO, "registry: no randomness for the nonce");
    }
    hex_bytes(nb, sizeof nb, r->nonce);
    memcpy(r->st.nonce, r->nonce, sizeof r->nonce);
    hex_bytes(p->secret_check, GW_REGISTRY_SECRET_CHECK_BYTES, r->secret_hex);
    snprintf(r->k_gw, sizeof r->k_gw, "%s:gw:%s", r->prefix, r->instance);
    snprintf(r->k_gws, sizeof r->k_gws, "%s:gws", r->prefix);
    snprintf(r->k_fence, sizeof r->k_fence, "%s:fence", r->prefix);
    snprintf(r->k_secret, sizeof r->k_secret, "%s:nssecret", r->prefix);
    snprintf(r->k_meter, sizeof r->k_meter, "%s:meter", r->prefix);
    snprintf(r->k_feed, sizeof r->k_feed, "%s:feed", r->prefix);
    snprintf(r->k_settings, sizeof r->k_settings, "%s:settings", r->prefix);
    snprintf(r->lease_str, sizeof r->lease_str, "%" PRIu64, p->lease_ms);
    snprintf(r->claim_ttl_str, sizeof r->claim_ttl_str, "%" PRIu64, p->claim_ttl_ms);
    snprintf(r->maxlen_str, sizeof r->maxlen_str, "%" PRIu64, p->feed_maxlen);
    snprintf(r->ttl_str[0], sizeof r->ttl_str[0], "%" PRIu64, p->ttl_ms[0]);
    snprintf(r->ttl_str[1], sizeof r->ttl_str[1], "%" PRIu64, p->ttl_ms[1]);
    r->waiting.prev = r->waiting.next = &r->waiting;
    r->q.head.prev = r->q.head.next = &r->q.head;
    r->recent.head.prev = r->recent.head.next = &r->recent.head;

    /* The blocking step. */
    redisContext *ctx = NULL;
    char why[512] = "";
    rc = bill_redis_connect_sync(&r->p.redis, &ctx, why, sizeof why);
    if (rc == PC_ERR_PERM) {
        registry_free(r);
        return pc_err_setf(err, err_len, rc, "registry: %s", why);
    }
    bool up = false;
    if (rc == 0) {
        rc = start_checks(r, ctx, err, err_len);
        if (rc == PC_ERR_PERM || rc == PC_ERR_EXISTS || rc == PC_ERR_STATE) {
            redisFree(ctx);
            registry_free(r);
            return rc;
        }
        if (rc == 0) {
            up = true;
            redisReply *rp = redisCommand(ctx, "XINFO STREAM %s", r->k_feed);
            const redisReply *last = rp != NULL ? xinfo_field(rp, "last-generated-id") : NULL;
            sid_t id;
            if (last != NULL && last->type == REDIS_REPLY_STRING &&
                parse_id(last->str, last->len, &id))
                snprintf(r->feed_last, sizeof r->feed_last, "%" PRIu64 "-%" PRIu64, id.ms, id.seq);
            else if (rp != NULL && rp->type == REDIS_REPLY_ERROR)
                snprintf(r->feed_last, sizeof r->feed_last, "0-0");
            if (rp != NULL)
                freeReplyObject(rp);
        } else {
            snprintf(why, sizeof why, "%s", err != NULL ? err : "");
        }
        redisFree(ctx);
    }
    if (!up)
        PC_LOG(PC_LOG_WARN, "registry",
               "Redis unreachable at start (%s): serving from the local view (registry: local) "
               "until it answers",
               why);

    /* The background connections. */
    bill_redis_params_t rp = r->p.redis;
    rp.name = "registry";
    rp.on_up = on_main_up;
    rp.on_down = on_main_down;
    rp.ud = r;
    rc = bill_redis_start(loop, &rp, &r->rc, err, err_len);
    if (rc != 0) {
        registry_free(r);
        return rc;
    }
    r->open_conns = 1;
    rp.name = "registry-feed";
    rp.on_up = on_feed_up;
    rp.on_down = NULL;
    rc = bill_redis_start(loop, &rp, &r->fc, err, err_len);
    if (rc != 0) {
        /* The main connection closes asynchronously; free r only after it did. */
        r->stopping = true;
        bill_redis_stop(r->rc, free_cb, r);
        return rc;
    }
    r->open_conns = 2;
    uv_timer_init(loop, &r->claim_timer);
    uv_timer_init(loop, &r->lease_timer);
    r->claim_timer.data = r->lease_timer.data = r;
    r->handles_open = 2;
    uint64_t every = p->lease_ms / 4 ? p->lease_ms / 4 : 1;
    uv_timer_start(&r->lease_timer, on_lease_timer, every, every);
    r->state = up ? GW_REGISTRY_UP : GW_REGISTRY_DOWN;
    r->state_since = uv_now(loop);
    if (up && r->p.meter) /* the first meter lease is asked on the first connect */
        r->meter_until = 0;
    *out = r;
    return 0;
}

gw_registry_state_t gw_registry_state(const gw_registry_t *r)
{
    return r != NULL ? r->state : GW_REGISTRY_DOWN;
}

void gw_registry_stats(const gw_registry_t *r, gw_registry_stats_t *out)
{
    *out = r->st;
    out->state = r->state;
    out->degraded_ms = r->degraded_ms;
    if (r->state != GW_REGISTRY_UP)
        out->degraded_ms += uv_now(r->loop) - r->state_since;
    out->replay_pending = r->q.n;
    out->replay_bytes = r->q.bytes;
    bill_redis_stats_t rs;
    bill_redis_stats(r->rc, &rs);
    out->failovers = rs.n_failovers;
    out->meter_held = gw_registry_meter(r) != GW_REGISTRY_METER_NONE;
}

static void finish_free(gw_registry_t *r)
{
    if (r->handles_open > 0 || r->open_conns > 0)
        return;
    void (*cb)(void *) = r->on_closed;
    void *ud = r->closed_ud;
    registry_free(r);
    if (cb != NULL)
        cb(ud);
}

static void on_conn_closed(void *ud)
{
    gw_registry_t *r = ud;
    r->open_conns--;
    finish_free(r);
}

static void on_handle_closed(uv_handle_t *h)
{
    gw_registry_t *r = h->data;
    r->handles_open--;
    finish_free(r);
}

static void close_all(gw_registry_t *r)
{
    bill_redis_stop(r->rc, on_conn_closed, r);
    bill_redis_stop(r->fc, on_conn_closed, r);
    uv_close((uv_handle_t *)&r->claim_timer, on_handle_closed);
    uv_close((uv_handle_t *)&r->lease_timer, on_handle_closed);
}

static void on_unregistered(bill_redis_t *c, redisReply *rp, int status, void *priv)
{
    (void)c;
    (void)rp;
    (void)status;
    close_all(priv);
}

void gw_registry_stop(gw_registry_t *r, void (*on_closed)(void *ud), void *ud)
{
    if (r == NULL || r->stopping)
        return;
    r->on_closed = on_closed;
    r->closed_ud = ud;
    /* Waiting claims are answered first (the caller decides locally), then nothing more is
     * called back. */
    while (r->waiting.next != &r->waiting) {
        gw_registry_op_t *op = r->waiting.next;
        r->st.errors[GW_REGISTRY_OP_CLAIM][GW_REGISTRY_ERR_ERROR]++;
        claim_answer(r, op, GW_REGISTRY_ST_ERROR, GW_REGISTRY_CLAIM_ERROR);
    }
    r->stopping = true;
    uv_timer_stop(&r->claim_timer);
    uv_timer_stop(&r->lease_timer);
    for (qop_t *o = r->q.head.next, *next; o != &r->q.head; o = next) {
        next = o->next;
        if (!o->sent) {
            ql_unlink(&r->q, o);
            pc_free(o);
            r->st.replay_dropped++;
        }
    }
    if (r->scripts_ok && bill_redis_is_up(r->rc)) {
        const char *av[6] = {"EVALSHA", r->sha[SC_UNREGISTER], "2", r->k_gw, r->k_meter, r->nonce};
        size_t al[6];
        for (int i = 0; i < 6; i++)
            al[i] = strlen(av[i]);
        if (bill_redis_send(r->rc, 0, on_unregistered, r, 6, av, al) == 0)
            return;
    }
    close_all(r);
}
