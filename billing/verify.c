/*
 * verify.c — `kvgw billing verify`: reconciles ledgers with what the shipper wrote to Redis
 * (key layout in shipper.h). Synchronous hiredis with a timeout on every command: this is a CLI,
 * not the gateway's loop.
 */
#include "common.h"
#include "ledger.h"
#include "shipper.h"
#include "usage_internal.h"

#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

bill_verify_params_t bill_verify_params_default(void)
{
    bill_verify_params_t p = {
        .port = 0, .prefix = "kvgw", .timeout_ms = 5000, .from_ms = 0, .to_ms = UINT64_MAX};
    snprintf(p.host, sizeof p.host, "127.0.0.1");
    return p;
}

typedef struct counter {
    char tenant[BILL_STR_MAX];
    char day[16];
    bill_totals_t t;
} counter_t;

/* The counters the ledgers explain, in order of first appearance, indexed by tenant and day
 * (each with its NUL byte, so ("ab", "c") and ("a", "bc") differ). */
typedef struct counters {
    PC_VEC(counter_t) v;
    pc_strmap_t index; /* key -> position in v */
} counters_t;

/* The counter of (tenant, day); with create, a new zeroed one when missing. NULL when missing
 * (without create) or without memory; valid until the next counter_get with create. */
static counter_t *counter_get(counters_t *m, const char *tenant, const char *day, bool create)
{
    char key[BILL_STR_MAX + 16 + 16 + 2];
    int len = snprintf(key, sizeof key, "%s%c%s", tenant, '\0', day);
    if (len < 0 || (size_t)len >= sizeof key)
        return NULL; /* longer than any counter can be: not there, and cannot be */
    uint64_t i;
    if (pc_strmap_get(&m->index, key, (size_t)len + 1, &i))
        return &m->v.base[i];
    if (!create || pc_vec_reserve(&m->v, m->v.len + 1) != 0 ||
        pc_strmap_insert(&m->index, key, (size_t)len + 1, m->v.len, NULL) != 0)
        return NULL;
    counter_t *c = &m->v.base[m->v.len++];
    memset(c, 0, sizeof *c);
    snprintf(c->tenant, sizeof c->tenant, "%s", tenant);
    snprintf(c->day, sizeof c->day, "%s", day);
    return c;
}

/* Walks a stream page by page (XRANGE with exclusive starts). */
typedef struct stream_iter {
    redisContext *c;
    const char *key;
    redisReply *page;
    size_t idx;
    char last_id[64];
    bool end;
} stream_iter_t;

typedef struct entry {
    uint64_t seq;
    bool id_ok; /* "<seq>-0" */
    char id[64];
    const char *event_id;
    uint64_t cost;
} entry_t;

/* 1 with *e filled, 0 at the end, negative on a Redis error. */
static int stream_next(stream_iter_t *it, entry_t *e, char *err, size_t err_len)
{
    for (;;) {
        if (it->end)
            return 0;
        if (it->page != NULL && it->idx < it->page->elements) {
            redisReply *ent = it->page->element[it->idx++];
            if (ent->type != REDIS_REPLY_ARRAY || ent->elements != 2 ||
                ent->element[0]->type != REDIS_REPLY_STRING ||
                ent->element[1]->type != REDIS_REPLY_ARRAY)
                return pc_err_setf(err, err_len, PC_ERR_FORMAT, "verify: odd XRANGE reply");
            memset(e, 0, sizeof *e);
            snprintf(e->id, sizeof e->id, "%s", ent->element[0]->str);
            snprintf(it->last_id, sizeof it->last_id, "%s", e->id);
            char *end;
            e->seq = strtoull(e->id, &end, 10);
            e->id_ok = strcmp(end, "-0") == 0;
            redisReply *f = ent->element[1];
            for (size_t i = 0; i + 1 < f->elements; i += 2) {
                const char *k = f->element[i]->str, *v = f->element[i + 1]->str;
                if (k == NULL || v == NULL)
                    continue;
                if (strcmp(k, "event_id") == 0)
                    e->event_id = v;
                else if (strcmp(k, "cost_nusd") == 0)
                    e->cost = strtoull(v, NULL, 10);
            }
            return 1;
        }
        if (it->page != NULL)
            freeReplyObject(it->page);
        char start[80];
        if (it->last_id[0] == '\0')
            snprintf(start, sizeof start, "-");
        else
            snprintf(start, sizeof start, "(%s", it->last_id);
        it->page = redisCommand(it->c, "XRANGE %s %s + COUNT 1000", it->key, start);
        it->idx = 0;
        if (it->page == NULL)
            return pc_err_setf(err, err_len, PC_ERR_UPSTREAM, "verify: Redis: %s", it->c->errstr);
        if (it->page->type == REDIS_REPLY_ERROR)
            return pc_err_setf(err, err_len, PC_ERR_UPSTREAM, "verify: XRANGE %s: %s", it->key,
                               it->page->str);
        if (it->page->elements == 0)
            it->end = true;
    }
}

#define DIFF(...)                                                                                  \
    do {                                                                                           \
        rep->n_differences++;                                                                      \
        fprintf(out, "DIFF ");                                                                     \
        fprintf(out, __VA_ARGS__);                                                                 \
        fprintf(out, "\n");                                                                        \
    } while (0)

/* Moves the stream walk to the entries after seq `after` (a ledger reader skipped segments). */
static void stream_seek(stream_iter_t *it, uint64_t after)
{
    if (it->page != NULL)
        freeReplyObject(it->page);
    it->page = NULL;
    it->idx = 0;
    it->end = false;
    snprintf(it->last_id, sizeof it->last_id, "%" PRIu64 "-0", after);
}

static bool ranged(const bill_verify_params_t *p)
{
    return p->from_ms != 0 || p->to_ms != UINT64_MAX;
}

/* The entry to compare next: the one waiting in *e when *have, else the stream's next one.
 * Returns 0 with *have telling whether *e holds one (false at the stream's end), or negative
 * on a Redis error. */
static int stream_peek(stream_iter_t *it, entry_t *e, bool *have, char *err, size_t err_len)
{
    if (*have)
        return 0;
    int sr = stream_next(it, e, err, err_len);
    if (sr < 0)
        return sr;
    *have = sr == 1;
    return 0;
}

static int verify_ledger(redisContext *c, const char *dir, const bill_verify_params_t *p,
                         const char *prefix, counters_t *exp, FILE *out, bill_verify_report_t *rep,
                         char *err, size_t err_len)
{
    char inst[BILL_STR_MAX], stream[256], cursor_key[256];
    if (bill_ledger_read_instance(dir, inst) != 0)
        return pc_err_setf(err, err_len, PC_ERR_NOTFOUND, "verify: %s has no INSTANCE id", dir);
    snprintf(stream, sizeof stream, "%s:ledger:%s", prefix, inst);
    snprintf(cursor_key, sizeof cursor_key, "%s:cursor:%s", prefix, inst);
    redisReply *r = redisCommand(c, "GET %s", cursor_key);
    if (r == NULL || r->type == REDIS_REPLY_ERROR) {
        int rc = pc_err_setf(err, err_len, PC_ERR_UPSTREAM, "verify: GET %s: %s", cursor_key,
                             r != NULL ? r->str : c->errstr);
        if (r != NULL)
            freeReplyObject(r);
        return rc;
    }
    /* The cursor is "SEQ LEDGER_ID" (a cursor written before ledger ids: "SEQ"): one of another
     * ledger (a gateway replaced on a fresh disk under the same id) is a difference. */
    uint64_t cursor = 0;
    char owner[BILL_LEDGER_ID_LEN + 1] = "", mine[BILL_LEDGER_ID_LEN + 1];
    if (r->type == REDIS_REPLY_STRING) {
        char *end;
        cursor = strtoull(r->str, &end, 10);
        if (*end == ' ')
            snprintf(owner, sizeof owner, "%.*s", BILL_LEDGER_ID_LEN, end + 1);
    }
    freeReplyObject(r);
    if (owner[0] != '\0' && bill_ledger_read_id(dir, mine) == 0 && strcmp(owner, mine) != 0)
        DIFF("%s: cursor %s belongs to ledger %s, not to this one (%s): another ledger shipped "
             "under instance id %s",
             dir, cursor_key, owner, mine, inst);

    bill_ledger_reader_t *rd;
    int rc = bill_ledger_reader_open(dir, 1, &rd, err, err_len);
    if (rc != 0)
        return rc;
    if (ranged(p))
        (void)bill_ledger_reader_set_time_range(rd, p->from_ms, p->to_ms); /* checked: from <= to */
    stream_iter_t it = {.c = c, .key = stream};
    entry_t e;
    bool have = false;
    bill_event_t ev;
    bill_ledger_reader_stats_t rs;
    uint64_t seq, last_seq = 0;
    while ((rc = bill_ledger_reader_next(rd, &ev, &seq, err, err_len)) == 0) {
        rep->n_events++;
        rep->n_registry[ev.registry]++;         /* < BILL_REGISTRY_COUNT: the reader validated it */
        if (ranged(p) && seq != last_seq + 1) { /* segments skipped: the stream from here on */
            stream_seek(&it, seq - 1);
            have = false;
        }
        last_seq = seq;
        if (seq > cursor) {
            rep->n_pending++;
            continue;
        }
        rep->n_shipped++;
        if (ev.start_ms >= p->from_ms && ev.start_ms < p->to_ms) {
            char day[16];
            bill_day_str(ev.start_ms, day);
            counter_t *ct = counter_get(exp, ev.tenant, day, true);
            if (ct == NULL || bill_totals_add(&ct->t, &ev) != 0) {
                rc = PC_ERR_NOMEM;
                break;
            }
        }
        /* The stream entry for this seq. */
        for (;;) {
            if ((rc = stream_peek(&it, &e, &have, err, err_len)) < 0)
                goto done;
            if (!have || e.seq > seq) {
                DIFF("%s: stream %s lacks seq %" PRIu64 " (event %s)", dir, stream, seq,
                     ev.event_id);
                break;
            }
            if (e.seq < seq || !e.id_ok) {
                DIFF("%s: stream %s has entry %s that no ledger record explains", dir, stream,
                     e.id);
                have = false;
                if (e.seq < seq)
                    continue;
                break;
            }
            if (e.event_id == NULL || strcmp(e.event_id, ev.event_id) != 0)
                DIFF("%s: stream entry %s is event %s, the ledger's seq %" PRIu64 " is %s", dir,
                     e.id, e.event_id ? e.event_id : "(none)", seq, ev.event_id);
            else if (e.cost != bill_event_total_nusd(&ev))
                DIFF("%s: stream entry %s costs %" PRIu64 " nano-USD, the ledger says %" PRIu64,
                     dir, e.id, e.cost, bill_event_total_nusd(&ev));
            have = false;
            break;
        }
    }
    if (rc < 0)
        goto done;
    rc = 0;
    bill_ledger_reader_stats(rd, &rs);
    if (ranged(p) && rs.next_seq > last_seq + 1) {
        /* The segments after the last record read were skipped: the ledger ends further on. */
        last_seq = rs.next_seq - 1;
        stream_seek(&it, last_seq);
        have = false;
    }
    if (cursor > last_seq)
        DIFF("%s: cursor %s is %" PRIu64 " but the ledger ends at seq %" PRIu64, dir, cursor_key,
             cursor, last_seq);
    for (;;) {
        if ((rc = stream_peek(&it, &e, &have, err, err_len)) < 0)
            goto done;
        if (!have)
            break;
        have = false;
        DIFF("%s: stream %s has entry %s beyond the cursor %" PRIu64, dir, stream, e.id, cursor);
    }
done:
    if (it.page != NULL)
        freeReplyObject(it.page);
    bill_ledger_reader_stats(rd, &rs);
    rep->n_segments_read += rs.n_segments_read;
    rep->n_segments_skipped += rs.n_segments_skipped;
    bill_ledger_reader_free(rd);
    return rc;
}

static uint64_t hash_field(redisReply *h, const char *name)
{
    for (size_t i = 0; h != NULL && i + 1 < h->elements; i += 2)
        if (h->element[i]->str != NULL && strcmp(h->element[i]->str, name) == 0)
            return strtoull(h->element[i + 1]->str, NULL, 10);
    return 0;
}

static void compare_counter(redisContext *c, const char *key, const bill_totals_t *t, redisReply *h,
                            FILE *out, bill_verify_report_t *rep)
{
    uint64_t cost = 0;
    for (int b = 0; b < BILL_BUCKET_COUNT; b++)
        cost += t->cost_nusd[b];
    if (hash_field(h, "events") != t->n_events)
        DIFF("counter %s events: Redis %" PRIu64 ", ledger %" PRIu64, key, hash_field(h, "events"),
             t->n_events);
    if (hash_field(h, "cost_nusd") != cost)
        DIFF("counter %s cost_nusd: Redis %" PRIu64 ", ledger %" PRIu64, key,
             hash_field(h, "cost_nusd"), cost);
    for (int b = 0; b < BILL_BUCKET_COUNT; b++) {
        char f[48];
        snprintf(f, sizeof f, "cost_%s_nusd", bill_bucket_name(b));
        if (hash_field(h, bill_bucket_name(b)) != t->quantity[b])
            DIFF("counter %s %s: Redis %" PRIu64 ", ledger %" PRIu64, key, bill_bucket_name(b),
                 hash_field(h, bill_bucket_name(b)), t->quantity[b]);
        if (hash_field(h, f) != t->cost_nusd[b])
            DIFF("counter %s %s: Redis %" PRIu64 ", ledger %" PRIu64, key, f, hash_field(h, f),
                 t->cost_nusd[b]);
    }
}

/* The instances that shipped to Redis without their ledger among ledger_dirs: one MISSING line
 * each. */
static int missing_instances(redisContext *c, const char *const *ledger_dirs, size_t n,
                             const char *prefix, bool scan_streams, FILE *out,
                             bill_verify_report_t *rep, char *err, size_t err_len)
{
    char(*insts)[BILL_STR_MAX];
    size_t n_insts;
    int rc = bill__redis_instances(c, prefix, scan_streams, &insts, &n_insts, err, err_len);
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < n_insts; i++) {
        bool given = false;
        for (size_t k = 0; k < n && !given; k++) {
            char inst[BILL_STR_MAX];
            given =
                bill_ledger_read_instance(ledger_dirs[k], inst) == 0 && strcmp(inst, insts[i]) == 0;
        }
        if (given)
            continue;
        rep->n_instances_missing++;
        redisReply *r = redisCommand(c, "XLEN %s:ledger:%s", prefix, insts[i]);
        fprintf(out,
                "MISSING instance %s: Redis holds %lld shipped events of it (%s:ledger:%s) but its "
                "ledger was not given (--ledger)\n",
                insts[i], r != NULL && r->type == REDIS_REPLY_INTEGER ? r->integer : 0LL, prefix,
                insts[i]);
        if (r != NULL)
            freeReplyObject(r);
    }
    pc_free(insts);
    return 0;
}

int bill_verify(const char *const *ledger_dirs, size_t n, const bill_verify_params_t *p, FILE *out,
                bill_verify_report_t *rep, char *err, size_t err_len)
{
    memset(rep, 0, sizeof *rep);
    if (p->from_ms > p->to_ms || p->from_ms % 86400000u != 0 ||
        (p->to_ms != UINT64_MAX && p->to_ms % 86400000u != 0))
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "verify: counters are per UTC day: the range must be whole days "
                           "(from <= to, both at 00:00:00Z)");
    struct timeval tv = {(time_t)(p->timeout_ms / 1000),
                         (suseconds_t)(p->timeout_ms % 1000) * 1000};
    redisContext *c = redisConnectWithTimeout(p->host, p->port, tv);
    if (c == NULL || c->err) {
        int rc = pc_err_setf(err, err_len, PC_ERR_UPSTREAM, "verify: cannot connect to %s:%d: %s",
                             p->host, p->port, c != NULL ? c->errstr : "out of memory");
        redisFree(c);
        return rc;
    }
    redisSetTimeout(c, tv);
    int rc = 0;
    counters_t exp = {0};
    redisReply *keys = NULL;
    const char *prefix = p->prefix != NULL ? p->prefix : "kvgw";
    if (p->password != NULL) {
        redisReply *r = redisCommand(c, "AUTH %s", p->password);
        bool ok = r != NULL && r->type != REDIS_REPLY_ERROR;
        if (r != NULL)
            freeReplyObject(r);
        if (!ok) {
            rc = pc_err_setf(err, err_len, PC_ERR_PERM, "verify: Redis AUTH failed");
            goto done;
        }
    }
    for (size_t i = 0; i < n; i++) {
        rc = verify_ledger(c, ledger_dirs[i], p, prefix, &exp, out, rep, err, err_len);
        if (rc != 0)
            goto done;
    }
    if ((rc = missing_instances(c, ledger_dirs, n, prefix, p->scan_streams, out, rep, err,
                                err_len)) != 0)
        goto done;
    /* Every counter the ledgers explain. */
    for (size_t i = 0; i < exp.v.len; i++) {
        const counter_t *ct = &exp.v.base[i];
        char key[512];
        snprintf(key, sizeof key, "%s:usage:%s:%s", prefix, ct->tenant, ct->day);
        redisReply *h = redisCommand(c, "HGETALL %s", key);
        if (h == NULL || h->type == REDIS_REPLY_ERROR) {
            rc = pc_err_setf(err, err_len, PC_ERR_UPSTREAM, "verify: HGETALL %s: %s", key,
                             h != NULL ? h->str : c->errstr);
            if (h != NULL)
                freeReplyObject(h);
            goto done;
        }
        if (h->elements == 0)
            DIFF("counter %s is missing in Redis (ledger: %" PRIu64 " events)", key,
                 ct->t.n_events);
        else
            compare_counter(c, key, &ct->t, h, out, rep);
        freeReplyObject(h);
    }
    /* Counters no ledger explains. */
    char set_key[300], usage_prefix[300];
    snprintf(set_key, sizeof set_key, "%s:usage_keys", prefix);
    snprintf(usage_prefix, sizeof usage_prefix, "%s:usage:", prefix);
    keys = redisCommand(c, "SMEMBERS %s", set_key);
    if (keys == NULL || keys->type == REDIS_REPLY_ERROR) {
        rc = pc_err_setf(err, err_len, PC_ERR_UPSTREAM, "verify: SMEMBERS %s failed", set_key);
        goto done;
    }
    size_t plen = strlen(usage_prefix);
    for (size_t i = 0; i < keys->elements; i++) {
        const char *k = keys->element[i]->str;
        size_t kl = k != NULL ? strlen(k) : 0;
        if (kl < plen + 12 || strncmp(k, usage_prefix, plen) != 0) {
            DIFF("usage key set holds an odd key '%s'", k != NULL ? k : "");
            continue;
        }
        char tenant[BILL_STR_MAX + 16], day[16];
        snprintf(day, sizeof day, "%s", k + kl - 10);
        snprintf(tenant, sizeof tenant, "%.*s", (int)(kl - 11 - plen), k + plen);
        uint64_t day_ms;
        if (ranged(p) &&
            (bill_parse_time_ms(day, &day_ms) != 0 || day_ms < p->from_ms || day_ms >= p->to_ms))
            continue; /* outside the range (or an odd day, reported by a full verify) */
        if (counter_get(&exp, tenant, day, false) == NULL) {
            redisReply *h = redisCommand(c, "HGET %s events", k);
            if (h != NULL && h->type == REDIS_REPLY_STRING)
                DIFF("counter %s has %s events that no ledger holds", k, h->str);
            if (h != NULL)
                freeReplyObject(h);
        }
    }
done:
    if (keys != NULL)
        freeReplyObject(keys);
    pc_vec_free(&exp.v);
    pc_strmap_free(&exp.index);
    redisFree(c);
    return rc;
}
