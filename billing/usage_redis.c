/*
 * usage_redis.c — the shipped usage read back from Redis (usage_internal.h): the instances that
 * shipped, and each one's stream as ledger events, for the merged export and verify.
 */
#include "common.h"
#include "ledger_internal.h"
#include "usage_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Instances
 * ------------------------------------------------------------------------------------------- */

typedef char inst_t[BILL_STR_MAX];

static int inst_cmp(const void *a, const void *b)
{
    return strcmp(a, b);
}

static int inst_add(inst_t **v, size_t *n, size_t *cap, const char *s, size_t len, char *err,
                    size_t err_len)
{
    char id[BILL_STR_MAX];
    if (len == 0 || len >= BILL_STR_MAX || memchr(s, '\0', len) != NULL)
        return pc_err_setf(err, err_len, PC_ERR_FORMAT, "redis: '%.*s' is not an instance id",
                           (int)(len < 80 ? len : 80), s);
    memcpy(id, s, len);
    id[len] = '\0';
    if (!bill__instance_ok(id))
        return pc_err_setf(err, err_len, PC_ERR_FORMAT, "redis: '%s' is not an instance id", id);
    if (*n == BILL__MAX_INSTANCES)
        return pc_err_setf(err, err_len, PC_ERR_RANGE, "redis: more than %d instances",
                           BILL__MAX_INSTANCES);
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 16;
        inst_t *nv = pc_reallocarray(*v, nc, sizeof *nv);
        if (nv == NULL)
            return PC_ERR_NOMEM;
        *v = nv;
        *cap = nc;
    }
    memset((*v)[*n], 0, BILL_STR_MAX);
    memcpy((*v)[(*n)++], id, len + 1);
    return 0;
}

static int reply_err(redisContext *c, redisReply *r, const char *what, char *err, size_t err_len)
{
    int rc = pc_err_setf(err, err_len, PC_ERR_UPSTREAM, "redis: %s: %s", what,
                         r == NULL                      ? c->errstr
                         : r->type == REDIS_REPLY_ERROR ? r->str
                                                        : "unexpected reply");
    if (r != NULL)
        freeReplyObject(r);
    return rc;
}

int bill__redis_instances(redisContext *c, const char *prefix, bool scan_streams,
                          char (**out)[BILL_STR_MAX], size_t *n_out, char *err, size_t err_len)
{
    *out = NULL;
    *n_out = 0;
    inst_t *v = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    char key[300], pattern[320];
    snprintf(key, sizeof key, "%s:gws", prefix);
    redisReply *r = redisCommand(c, "SMEMBERS %s", key);
    if (r == NULL || r->type != REDIS_REPLY_ARRAY)
        return reply_err(c, r, "SMEMBERS", err, err_len);
    for (size_t i = 0; rc == 0 && i < r->elements; i++) {
        redisReply *e = r->element[i];
        rc = e->type == REDIS_REPLY_STRING
                 ? inst_add(&v, &n, &cap, e->str, e->len, err, err_len)
                 : pc_err_setf(err, err_len, PC_ERR_FORMAT, "redis: %s holds a non-string", key);
    }
    freeReplyObject(r);
    /* On request only, the streams themselves (those of a kvgw older than the shipper's SADD).
     * The pattern's prefix is escaped so that glob characters in it match only themselves. */
    size_t pl = 0;
    for (const char *p = prefix; *p && pl + 8 < sizeof pattern - 16; p++) {
        if (strchr("*?[]\\", *p) != NULL)
            pattern[pl++] = '\\';
        pattern[pl++] = *p;
    }
    snprintf(pattern + pl, sizeof pattern - pl, ":ledger:*");
    size_t kpl = strlen(prefix) + 8; /* "PREFIX:ledger:" */
    char cursor[32] = "0";
    do {
        if (rc != 0 || !scan_streams)
            break;
        r = redisCommand(c, "SCAN %s MATCH %s COUNT 1000 TYPE stream", cursor, pattern);
        if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY ||
            r->element[0]->len >= sizeof cursor) {
            rc = reply_err(c, r, "SCAN", err, err_len);
            break;
        }
        memcpy(cursor, r->element[0]->str, r->element[0]->len + 1);
        redisReply *keys = r->element[1];
        for (size_t i = 0; rc == 0 && i < keys->elements; i++) {
            redisReply *k = keys->element[i];
            if (k->type == REDIS_REPLY_STRING && k->len > kpl)
                rc = inst_add(&v, &n, &cap, k->str + kpl, k->len - kpl, err, err_len);
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    if (rc != 0) {
        pc_free(v);
        return rc;
    }
    if (n > 1)
        qsort(v, n, sizeof *v, inst_cmp);
    size_t m = 0; /* each once */
    for (size_t i = 0; i < n; i++)
        if (m == 0 || strcmp(v[m - 1], v[i]) != 0)
            memmove(v[m++], v[i], BILL_STR_MAX);
    *out = v;
    *n_out = m;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * A stream as events
 * ------------------------------------------------------------------------------------------- */

void bill__stream_init(bill__stream_t *s, redisContext *c, const char *prefix, const char *instance)
{
    memset(s, 0, sizeof *s);
    s->c = c;
    snprintf(s->key, sizeof s->key, "%s:ledger:%s", prefix, instance);
}

void bill__stream_free(bill__stream_t *s)
{
    if (s->page != NULL)
        freeReplyObject(s->page);
    s->page = NULL;
}

static bool parse_u64(const char *s, uint64_t *out)
{
    if (*s < '0' || *s > '9' || strlen(s) > 20)
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0' || errno != 0)
        return false;
    *out = v;
    return true;
}

enum {
    F_EVENT_ID,
    F_KIND,
    F_STATUS,
    F_TENANT,
    F_MODEL,
    F_REQUEST_ID,
    F_API_KEY_ID,
    F_START,
    F_END,
    F_COST,
    F_REGISTRY,
    F_NS,
    F_HIT_LOGICAL,
    F_HIT_PHYSICAL,
    F_QTY0, /* + bucket */
    F_COST0 = F_QTY0 + BILL_BUCKET_COUNT,
    F_COUNT = F_COST0 + BILL_BUCKET_COUNT,
};

static const char *const fixed_names[F_QTY0] = {
    "event_id", "kind",   "status",    "tenant",   "model", "request_id",  "api_key_id",
    "start_ms", "end_ms", "cost_nusd", "registry", "ns",    "hit_logical", "hit_physical",
};

static int field_index(const char *k)
{
    for (int i = 0; i < F_QTY0; i++)
        if (strcmp(k, fixed_names[i]) == 0)
            return i;
    for (int b = 0; b < BILL_BUCKET_COUNT; b++) {
        char cn[48];
        if (strcmp(k, bill_bucket_name(b)) == 0)
            return F_QTY0 + b;
        snprintf(cn, sizeof cn, "cost_%s_nusd", bill_bucket_name(b));
        if (strcmp(k, cn) == 0)
            return F_COST0 + b;
    }
    return -1; /* "day" and fields of later versions */
}

/* One entry ([id, [k, v, ...]]) -> the event. */
static int parse_entry(const bill__stream_t *s, redisReply *ent, bill_event_t *ev, uint64_t *seq,
                       char *err, size_t err_len)
{
    if (ent->type != REDIS_REPLY_ARRAY || ent->elements != 2 ||
        ent->element[0]->type != REDIS_REPLY_STRING || ent->element[1]->type != REDIS_REPLY_ARRAY)
        return pc_err_setf(err, err_len, PC_ERR_FORMAT, "redis: %s: odd XRANGE reply", s->key);
    const char *id = ent->element[0]->str;
    char idnum[32];
    size_t il = strcspn(id, "-");
    if (il == 0 || il >= sizeof idnum || strcmp(id + il, "-0") != 0)
        return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                           "redis: %s: entry %.40s is not a shipped record (<seq>-0)", s->key, id);
    memcpy(idnum, id, il);
    idnum[il] = '\0';
    if (!parse_u64(idnum, seq) || *seq == 0)
        return pc_err_setf(err, err_len, PC_ERR_FORMAT, "redis: %s: bad entry id %.40s", s->key,
                           id);
    const char *f[F_COUNT] = {0};
    redisReply *kv = ent->element[1];
    for (size_t i = 0; i + 1 < kv->elements; i += 2) {
        if (kv->element[i]->type != REDIS_REPLY_STRING ||
            kv->element[i + 1]->type != REDIS_REPLY_STRING)
            return pc_err_setf(err, err_len, PC_ERR_FORMAT, "redis: %s %s: odd field", s->key, id);
        int k = field_index(kv->element[i]->str);
        if (k < 0)
            continue;
        if (f[k] != NULL || strlen(kv->element[i + 1]->str) != kv->element[i + 1]->len)
            return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                               "redis: %s %s: field %s twice or with a NUL byte", s->key, id,
                               kv->element[i]->str);
        f[k] = kv->element[i + 1]->str;
    }
    for (int k = 0; k < F_COUNT; k++)
        if (f[k] == NULL)
            return pc_err_setf(
                err, err_len, PC_ERR_FORMAT, "redis: %s %s lacks field %s%s", s->key, id,
                k < F_QTY0    ? fixed_names[k]
                : k < F_COST0 ? bill_bucket_name(k - F_QTY0)
                              : "cost_<bucket>_nusd",
                k >= F_REGISTRY ? " (shipped by a kvgw older than the registry field: export that "
                                  "instance from its ledger with --ledger)"
                                : "");
    memset(ev, 0, sizeof *ev);
    int kind = strcmp(f[F_KIND], "usage") == 0     ? BILL_EVENT_USAGE
               : strcmp(f[F_KIND], "storage") == 0 ? BILL_EVENT_STORAGE
                                                   : -1;
    int status = 0, registry = bill_registry_parse(f[F_REGISTRY]);
    if (kind == BILL_EVENT_USAGE) {
        status = -1;
        for (int i = 0; i < BILL_STATUS_COUNT; i++)
            if (strcmp(f[F_STATUS], bill_status_name(i)) == 0)
                status = i;
    } else if (f[F_STATUS][0] != '\0') {
        status = -1;
    }
    bool ok = kind > 0 && status >= 0 && registry >= 0;
    ev->kind = (uint8_t)(kind > 0 ? kind : 0);
    ev->status = (uint8_t)(status > 0 ? status : 0);
    ev->registry = (uint8_t)(registry > 0 ? registry : 0);
    ok = ok && bill_event_set_str(ev->event_id, f[F_EVENT_ID]) == 0 &&
         bill_event_set_str(ev->request_id, f[F_REQUEST_ID]) == 0 &&
         bill_event_set_str(ev->tenant, f[F_TENANT]) == 0 &&
         bill_event_set_str(ev->api_key_id, f[F_API_KEY_ID]) == 0 &&
         bill_event_set_str(ev->model, f[F_MODEL]) == 0 && bill_event_set_str(ev->ns, f[F_NS]) == 0;
    uint64_t q[BILL_BUCKET_COUNT], total = 0, sum = 0;
    ok = ok && parse_u64(f[F_START], &ev->start_ms) && parse_u64(f[F_END], &ev->end_ms) &&
         parse_u64(f[F_COST], &total) && parse_u64(f[F_HIT_LOGICAL], &ev->n_hit_logical) &&
         parse_u64(f[F_HIT_PHYSICAL], &ev->n_hit_physical);
    for (int b = 0; ok && b < BILL_BUCKET_COUNT; b++)
        ok = parse_u64(f[F_QTY0 + b], &q[b]) && parse_u64(f[F_COST0 + b], &ev->cost_nusd[b]) &&
             !__builtin_add_overflow(sum, ev->cost_nusd[b], &sum);
    if (!ok)
        return pc_err_setf(err, err_len, PC_ERR_FORMAT, "redis: %s %s: a malformed field", s->key,
                           id);
    ev->usage = (bill_usage_t){q[0], q[1], q[2], q[3], q[4]};
    ev->token_ms = q[BILL_BUCKET_STORAGE];
    char why[200];
    if (bill_event_validate(ev, why, sizeof why) != 0)
        return pc_err_setf(err, err_len, PC_ERR_FORMAT, "redis: %s %s: %s", s->key, id, why);
    if (sum != total)
        return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                           "redis: %s %s: bucket costs add up to %" PRIu64
                           ", not cost_nusd %" PRIu64,
                           s->key, id, sum, total);
    return 0;
}

int bill__stream_next(bill__stream_t *s, bill_event_t *ev, uint64_t *seq, char *err, size_t err_len)
{
    for (;;) {
        if (s->page != NULL && s->idx < s->page->elements) {
            int rc = parse_entry(s, s->page->element[s->idx++], ev, seq, err, err_len);
            if (rc != 0)
                return rc;
            if (*seq <= s->last_seq)
                return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                                   "redis: %s: entry %" PRIu64 " after %" PRIu64, s->key, *seq,
                                   s->last_seq);
            s->last_seq = *seq;
            return 0;
        }
        if (s->end)
            return 1;
        bill__stream_free(s);
        char start[40];
        snprintf(start, sizeof start, "(%" PRIu64 "-0", s->last_seq);
        redisReply *r = redisCommand(s->c, "XRANGE %s %s + COUNT %d", s->key,
                                     s->last_seq == 0 ? "-" : start, BILL__STREAM_PAGE);
        if (r == NULL || r->type != REDIS_REPLY_ARRAY)
            return reply_err(s->c, r, "XRANGE", err, err_len);
        s->page = r;
        s->idx = 0;
        s->end = r->elements < BILL__STREAM_PAGE;
    }
}
