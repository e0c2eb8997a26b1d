/*
 * export.c — streaming exports of the ledger: CSV, JSON lines and FOCUS 1.0 (FinOps Open Cost
 * and Usage Specification) CSV, per event or grouped per tenant x model x UTC day x bucket.
 *
 * Amounts are the ledger's per-bucket nano-USD values (rounded once, at pricing time) printed as
 * exact decimal USD; grouped amounts are sums of those, so a per-event export and a grouped one
 * of the same range add up to the same total to the nano-dollar. Quantities are exact integers
 * (tokens; storage in token-milliseconds), except FOCUS PricingQuantity for storage (million
 * token-hours), which is a quotient printed to 12 decimals.
 */
#include "billing.h"
#include "common.h"
#include "ledger.h"
#include "usage_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int bill_export_format_parse(const char *s)
{
    if (s == NULL)
        return -1;
    if (strcmp(s, "csv") == 0)
        return BILL_EXPORT_CSV;
    if (strcmp(s, "jsonl") == 0)
        return BILL_EXPORT_JSONL;
    if (strcmp(s, "focus") == 0)
        return BILL_EXPORT_FOCUS;
    return -1;
}

int bill_export_group_parse(const char *s)
{
    if (s == NULL)
        return -1;
    if (strcmp(s, "none") == 0)
        return BILL_GROUP_NONE;
    if (strcmp(s, "day") == 0)
        return BILL_GROUP_DAY;
    return -1;
}

bill_export_params_t bill_export_params_default(void)
{
    return (bill_export_params_t){
        .from_ms = 0,
        .to_ms = UINT64_MAX,
        .format = BILL_EXPORT_CSV,
        .group = BILL_GROUP_NONE,
        .header = true,
        .chunk_bytes = 64u << 10,
        .provider = "kvgw",
    };
}

int bill_totals_add(bill_totals_t *t, const bill_event_t *ev)
{
    bill_totals_t n = *t;
    const uint64_t q[BILL_BUCKET_COUNT] = {ev->usage.n_uncached, ev->usage.n_write_5m,
                                           ev->usage.n_write_1h, ev->usage.n_read,
                                           ev->usage.n_output,   ev->token_ms};
    for (int b = 0; b < BILL_BUCKET_COUNT; b++) {
        if (__builtin_add_overflow(n.quantity[b], q[b], &n.quantity[b]) ||
            __builtin_add_overflow(n.cost_nusd[b], ev->cost_nusd[b], &n.cost_nusd[b]))
            return PC_ERR_RANGE;
    }
    n.n_events++;
    *t = n;
    return 0;
}

/* One group of the day aggregation. */
typedef struct group {
    char tenant[BILL_STR_MAX];
    char model[BILL_STR_MAX];
    uint64_t day_ms;
    bill_totals_t t;
} group_t;

/* One input: a ledger (r) or an instance's shipped stream in Redis (st), each read in seq order.
 * NEED: its next wanted event is to be read; HEAD: that event (ev, seq) is in the heap. */
enum { SRC_NEED, SRC_HEAD, SRC_DONE };
typedef struct source {
    char instance[BILL_STR_MAX];
    const char *where; /* the ledger directory or the stream key, for messages */
    bill_ledger_reader_t *r;
    bill__stream_t st;
    int state;
    bill_event_t ev;
    uint64_t seq;
} source_t;

struct bill_export {
    bill_export_params_t p;
    char tenant[BILL_STR_MAX];
    char provider[BILL_STR_MAX];
    source_t *src;
    size_t n_src;
    char **dirs;         /* copies of the ledger directories */
    redisContext *redis; /* the streams' connection, or NULL */
    size_t *heap;        /* sources in HEAD state, a binary min-heap by (end, instance, seq) */
    size_t n_heap;
    size_t *need; /* sources in NEED state (a stack) */
    size_t n_need;
    uint64_t dup_end_ms; /* the end time of the events whose ids are in dup_ids */
    pc_strmap_t dup_ids; /* event id -> source, of the events emitted with end_ms dup_end_ms */
    pc_buf_t out;
    PC_VEC(group_t) groups;  /* in order of first appearance until group_rows sorts them */
    pc_strmap_t group_index; /* group_key() -> position in groups */
    bool header_done;
    bool done;
};

static int flush(bill_export_t *x, bool force)
{
    if (x->out.len == 0 || (!force && x->out.len < x->p.chunk_bytes))
        return 0;
    int rc = x->p.chunk(x->p.ud, x->out.base, x->out.len) != 0 ? PC_ERR_CANCELED : 0;
    x->out.len = 0;
    return rc;
}

/* A CSV field: quoted when it holds a comma, quote or newline (RFC 4180). */
static int csv_str(pc_buf_t *b, const char *s)
{
    if (strpbrk(s, ",\"\r\n") == NULL)
        return pc_buf_append_cstr(b, s);
    int rc = pc_buf_append(b, "\"", 1);
    for (const char *c = s; rc == 0 && *c; c++)
        rc = *c == '"' ? pc_buf_append(b, "\"\"", 2) : pc_buf_append(b, c, 1);
    return rc != 0 ? rc : pc_buf_append(b, "\"", 1);
}

static const char *kind_name(int kind)
{
    return kind == BILL_EVENT_STORAGE ? "storage" : "usage";
}

static const char *csv_header =
    "event_id,seq,kind,request_id,tenant,api_key_id,model,namespace,start,end,status,"
    "uncached_input_tokens,cache_write_5m_tokens,cache_write_1h_tokens,cache_read_tokens,"
    "output_tokens,logical_hit_tokens,physical_hit_tokens,storage_token_ms,"
    "cost_uncached_input_usd,cost_cache_write_5m_usd,cost_cache_write_1h_usd,cost_cache_read_usd,"
    "cost_output_usd,cost_cache_storage_usd,cost_total_usd,registry,instance\n";

static const char *csv_group_header = "day,tenant,model,bucket,quantity,unit,events,cost_usd\n";

static const char *focus_header =
    "BilledCost,BillingAccountId,BillingAccountName,BillingCurrency,BillingPeriodEnd,"
    "BillingPeriodStart,ChargeCategory,ChargeClass,ChargeDescription,ChargeFrequency,"
    "ChargePeriodEnd,ChargePeriodStart,CommitmentDiscountCategory,CommitmentDiscountId,"
    "CommitmentDiscountName,CommitmentDiscountStatus,CommitmentDiscountType,ConsumedQuantity,"
    "ConsumedUnit,ContractedCost,ContractedUnitPrice,EffectiveCost,InvoiceIssuerName,ListCost,"
    "ListUnitPrice,PricingCategory,PricingQuantity,PricingUnit,ProviderName,PublisherName,"
    "RegionId,RegionName,ResourceId,ResourceName,ResourceType,ServiceCategory,ServiceName,SkuId,"
    "SkuPriceId,SubAccountId,SubAccountName,Tags\n";

static uint64_t event_quantity(const bill_event_t *ev, int b)
{
    switch (b) {
    case BILL_BUCKET_UNCACHED:
        return ev->usage.n_uncached;
    case BILL_BUCKET_WRITE_5M:
        return ev->usage.n_write_5m;
    case BILL_BUCKET_WRITE_1H:
        return ev->usage.n_write_1h;
    case BILL_BUCKET_READ:
        return ev->usage.n_read;
    case BILL_BUCKET_OUTPUT:
        return ev->usage.n_output;
    default:
        return ev->token_ms;
    }
}

static int csv_row(bill_export_t *x, const bill_event_t *ev, uint64_t seq, const char *instance)
{
    pc_buf_t *b = &x->out;
    char t0[32], t1[32], m[BILL_BUCKET_COUNT + 1][32];
    bill_time_str(ev->start_ms, t0);
    bill_time_str(ev->end_ms, t1);
    for (int i = 0; i < BILL_BUCKET_COUNT; i++)
        bill_nusd_str(ev->cost_nusd[i], m[i]);
    bill_nusd_str(bill_event_total_nusd(ev), m[BILL_BUCKET_COUNT]);
    int rc = csv_str(b, ev->event_id);
    rc = rc ? rc : pc_buf_printf(b, ",%" PRIu64 ",%s,", seq, kind_name(ev->kind));
    rc = rc ? rc : csv_str(b, ev->request_id);
    rc = rc ? rc : pc_buf_append(b, ",", 1);
    rc = rc ? rc : csv_str(b, ev->tenant);
    rc = rc ? rc : pc_buf_append(b, ",", 1);
    rc = rc ? rc : csv_str(b, ev->api_key_id);
    rc = rc ? rc : pc_buf_append(b, ",", 1);
    rc = rc ? rc : csv_str(b, ev->model);
    rc = rc ? rc : pc_buf_append(b, ",", 1);
    rc = rc ? rc : csv_str(b, ev->ns);
    rc =
        rc ? rc
           : pc_buf_printf(b,
                           ",%s,%s,%s,%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64
                           ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%s,%s,%s,%s,%s,%s,%s,%s,",
                           t0, t1, ev->kind == BILL_EVENT_USAGE ? bill_status_name(ev->status) : "",
                           ev->usage.n_uncached, ev->usage.n_write_5m, ev->usage.n_write_1h,
                           ev->usage.n_read, ev->usage.n_output, ev->n_hit_logical,
                           ev->n_hit_physical, ev->token_ms, m[0], m[1], m[2], m[3], m[4], m[5],
                           m[6], bill_registry_name(ev->registry));
    rc = rc ? rc : csv_str(b, instance);
    return rc ? rc : pc_buf_append(b, "\n", 1);
}

static int jsonl_row(bill_export_t *x, const bill_event_t *ev, uint64_t seq, const char *instance)
{
    pc_buf_t *b = &x->out;
    char t0[32], t1[32], m[32];
    bill_time_str(ev->start_ms, t0);
    bill_time_str(ev->end_ms, t1);
    int rc = pc_buf_append_cstr(b, "{\"event_id\":");
    rc = rc ? rc : pc_json_cstr(b, ev->event_id, 0);
    rc = rc ? rc
            : pc_buf_printf(b, ",\"seq\":%" PRIu64 ",\"kind\":\"%s\",\"request_id\":", seq,
                            kind_name(ev->kind));
    rc = rc ? rc : pc_json_cstr(b, ev->request_id, 0);
    rc = rc ? rc : pc_buf_append_cstr(b, ",\"tenant\":");
    rc = rc ? rc : pc_json_cstr(b, ev->tenant, 0);
    rc = rc ? rc : pc_buf_append_cstr(b, ",\"api_key_id\":");
    rc = rc ? rc : pc_json_cstr(b, ev->api_key_id, 0);
    rc = rc ? rc : pc_buf_append_cstr(b, ",\"model\":");
    rc = rc ? rc : pc_json_cstr(b, ev->model, 0);
    rc = rc ? rc : pc_buf_append_cstr(b, ",\"namespace\":");
    rc = rc ? rc : pc_json_cstr(b, ev->ns, 0);
    rc =
        rc ? rc
           : pc_buf_printf(
                 b,
                 ",\"start\":\"%s\",\"end\":\"%s\",\"status\":\"%s\",\"usage\":{"
                 "\"uncached_input_tokens\":%" PRIu64 ",\"cache_write_5m_tokens\":%" PRIu64
                 ",\"cache_write_1h_tokens\":%" PRIu64 ",\"cache_read_tokens\":%" PRIu64
                 ",\"output_tokens\":%" PRIu64 ",\"logical_hit_tokens\":%" PRIu64
                 ",\"physical_hit_tokens\":%" PRIu64 ",\"storage_token_ms\":%" PRIu64
                 "},\"cost_usd\":{",
                 t0, t1, ev->kind == BILL_EVENT_USAGE ? bill_status_name(ev->status) : "",
                 ev->usage.n_uncached, ev->usage.n_write_5m, ev->usage.n_write_1h, ev->usage.n_read,
                 ev->usage.n_output, ev->n_hit_logical, ev->n_hit_physical, ev->token_ms);
    for (int i = 0; rc == 0 && i < BILL_BUCKET_COUNT; i++)
        rc = pc_buf_printf(b, "\"%s\":\"%s\",", bill_bucket_name(i),
                           bill_nusd_str(ev->cost_nusd[i], m));
    rc = rc ? rc
            : pc_buf_printf(b, "\"total\":\"%s\"},\"registry\":\"%s\",\"instance\":",
                            bill_nusd_str(bill_event_total_nusd(ev), m),
                            bill_registry_name(ev->registry));
    rc = rc ? rc : pc_json_cstr(b, instance, 0);
    return rc ? rc : pc_buf_append(b, "}\n", 2);
}

/* The first day of the month of ms and of the next month, for FOCUS billing periods. */
static void month_bounds(uint64_t ms, char *start, char *end)
{
    char day[16];
    bill_day_str(ms, day);
    int y = atoi(day), mo = atoi(day + 5);
    snprintf(start, 32, "%04d-%02d-01T00:00:00Z", y, mo);
    snprintf(end, 32, "%04d-%02d-01T00:00:00Z", mo == 12 ? y + 1 : y, mo == 12 ? 1 : mo + 1);
}

/* Exact decimal of q / 10^6 (tokens in millions). */
static void millions_str(uint64_t q, char *buf)
{
    snprintf(buf, 40, "%" PRIu64 ".%06" PRIu64, q / 1000000u, q % 1000000u);
}

/* token_ms in million token-hours: token_ms / 3.6e12, 12 decimals, rounded half-even. */
static void mtokh_str(uint64_t token_ms, char *buf)
{
    uint64_t scaled; /* token_ms x 10^12 / 3.6e12 = token_ms / 3.6 */
    bill_muldiv_round(token_ms, 10, 1, 36, &scaled);
    snprintf(buf, 40, "%" PRIu64 ".%012" PRIu64, scaled / (uint64_t)1000000000000ull,
             scaled % (uint64_t)1000000000000ull);
}

/* One FOCUS row: a bucket of one event (group NULL) or of one group (ev NULL). */
static int focus_row(bill_export_t *x, const char *tenant, const char *model, int bucket,
                     uint64_t start_ms, uint64_t end_ms, uint64_t qty, uint64_t cost,
                     const bill_event_t *ev, const char *instance)
{
    pc_buf_t *b = &x->out;
    char cs[32], ps[32], pe[32], c0[32], c1[32], pq[40], unit_price[40] = "", sku_price[160];
    bill_nusd_str(cost, cs);
    month_bounds(start_ms, ps, pe);
    bill_time_str(start_ms, c0);
    bill_time_str(end_ms, c1);
    bool storage = bucket == BILL_BUCKET_STORAGE;
    if (storage)
        mtokh_str(qty, pq);
    else
        millions_str(qty, pq);
    snprintf(sku_price, sizeof sku_price, "%s:%s", model, bill_bucket_name(bucket));
    const bill_price_t *pr;
    if (ev != NULL && x->p.pricing != NULL &&
        bill_pricing_lookup(x->p.pricing, model, start_ms, &pr) == 0) {
        /* The list price per pricing unit (USD per million tokens or token-hours). */
        uint64_t base = bucket == BILL_BUCKET_OUTPUT    ? pr->output_nusd_per_mtok
                        : bucket == BILL_BUCKET_STORAGE ? pr->storage_nusd_per_mtok_hour
                                                        : pr->input_nusd_per_mtok;
        bill_ratio_t r = bucket == BILL_BUCKET_WRITE_5M   ? pr->write_5m
                         : bucket == BILL_BUCKET_WRITE_1H ? pr->write_1h
                         : bucket == BILL_BUCKET_READ     ? pr->read
                                                          : (bill_ratio_t){1, 1};
        uint64_t up;
        if (bill_muldiv_round(base, r.num, 1, r.den, &up) == 0)
            bill_nusd_str(up, unit_price);
        snprintf(sku_price, sizeof sku_price, "%s:%s:%" PRIu64, model, bill_bucket_name(bucket),
                 pr->effective_ms);
    }
    int rc = pc_buf_printf(b, "%s,", cs);
    rc = rc ? rc : csv_str(b, x->provider);
    rc = rc ? rc : pc_buf_append(b, ",", 1);
    rc = rc ? rc : csv_str(b, x->provider);
    rc = rc ? rc : pc_buf_printf(b, ",USD,%s,%s,Usage,,", pe, ps);
    char desc[200];
    snprintf(desc, sizeof desc, "%s %s", model, bill_bucket_name(bucket));
    rc = rc ? rc : csv_str(b, desc);
    rc = rc ? rc
            : pc_buf_printf(b, ",Usage-Based,%s,%s,,,,,,%" PRIu64 ",%s,%s,%s,%s,", c1, c0, qty,
                            storage ? "Token-Milliseconds" : "Tokens", cs, unit_price, cs);
    rc = rc ? rc : csv_str(b, x->provider);
    rc = rc ? rc
            : pc_buf_printf(b, ",%s,%s,Standard,%s,%s,", cs, unit_price, pq,
                            storage ? "1M Token-Hours" : "1M Tokens");
    rc = rc ? rc : csv_str(b, x->provider);
    rc = rc ? rc : pc_buf_append(b, ",", 1);
    rc = rc ? rc : csv_str(b, x->provider);
    rc = rc ? rc : pc_buf_append(b, ",,,", 3);
    rc = rc ? rc : csv_str(b, storage && ev != NULL ? ev->ns : model);
    rc = rc ? rc : pc_buf_append(b, ",", 1);
    rc = rc ? rc : csv_str(b, model);
    rc = rc ? rc
            : pc_buf_printf(b, ",%s,AI and Machine Learning,kvgw LLM API,",
                            storage ? "Prompt Cache" : "LLM Model");
    char sku[160];
    snprintf(sku, sizeof sku, "%s:%s", model, bill_bucket_name(bucket));
    rc = rc ? rc : csv_str(b, sku);
    rc = rc ? rc : pc_buf_append(b, ",", 1);
    rc = rc ? rc : csv_str(b, sku_price);
    rc = rc ? rc : pc_buf_append(b, ",", 1);
    rc = rc ? rc : csv_str(b, tenant);
    rc = rc ? rc : pc_buf_append(b, ",", 1);
    rc = rc ? rc : csv_str(b, tenant);
    rc = rc ? rc : pc_buf_append(b, ",", 1);
    if (rc == 0 && ev != NULL) {
        pc_buf_t tags = PC_BUF_INIT;
        rc = pc_buf_append_cstr(&tags, "{\"event_id\":");
        rc = rc ? rc : pc_json_cstr(&tags, ev->event_id, 0);
        rc = rc ? rc : pc_buf_append_cstr(&tags, ",\"request_id\":");
        rc = rc ? rc : pc_json_cstr(&tags, ev->request_id, 0);
        rc = rc ? rc : pc_buf_append_cstr(&tags, ",\"api_key_id\":");
        rc = rc ? rc : pc_json_cstr(&tags, ev->api_key_id, 0);
        rc = rc ? rc
                : pc_buf_printf(&tags, ",\"status\":\"%s\",\"registry\":\"%s\",\"instance\":",
                                ev->kind == BILL_EVENT_USAGE ? bill_status_name(ev->status) : "",
                                bill_registry_name(ev->registry));
        rc = rc ? rc : pc_json_cstr(&tags, instance, 0);
        rc = rc ? rc : pc_buf_append(&tags, "}", 1);
        rc = rc ? rc : pc_buf_terminate(&tags);
        rc = rc ? rc : csv_str(b, tags.base);
        pc_buf_free(&tags);
    }
    return rc ? rc : pc_buf_append(b, "\n", 1);
}

static int event_row(bill_export_t *x, const bill_event_t *ev, uint64_t seq, const char *instance)
{
    switch (x->p.format) {
    case BILL_EXPORT_CSV:
        return csv_row(x, ev, seq, instance);
    case BILL_EXPORT_JSONL:
        return jsonl_row(x, ev, seq, instance);
    default:
        for (int bkt = 0; bkt < BILL_BUCKET_COUNT; bkt++) {
            uint64_t q = event_quantity(ev, bkt);
            if (q == 0 && ev->cost_nusd[bkt] == 0)
                continue;
            int rc = focus_row(x, ev->tenant, ev->model, bkt, ev->start_ms, ev->end_ms, q,
                               ev->cost_nusd[bkt], ev, instance);
            if (rc != 0)
                return rc;
        }
        return 0;
    }
}

/* The index key of a group: the day's 8 bytes, then the tenant and the model each with its
 * NUL byte, so ("ab", "c") and ("a", "bc") differ. Returns its length (at most GROUP_KEY_MAX). */
enum { GROUP_KEY_MAX = 8 + 2 * BILL_STR_MAX };
static size_t group_key(const char *tenant, const char *model, uint64_t day, char *out)
{
    size_t lt = strlen(tenant), lm = strlen(model); /* each under BILL_STR_MAX */
    memcpy(out, &day, 8);
    memcpy(out + 8, tenant, lt);
    out[8 + lt] = '\0';
    memcpy(out + 9 + lt, model, lm);
    out[9 + lt + lm] = '\0';
    return 10 + lt + lm;
}

static int group_add(bill_export_t *x, const bill_event_t *ev)
{
    uint64_t day = bill_day_start_ms(ev->start_ms);
    char key[GROUP_KEY_MAX];
    size_t len = group_key(ev->tenant, ev->model, day, key);
    uint64_t i;
    if (!pc_strmap_get(&x->group_index, key, len, &i)) {
        group_t g = {.day_ms = day};
        memcpy(g.tenant, ev->tenant, BILL_STR_MAX);
        memcpy(g.model, ev->model, BILL_STR_MAX);
        int rc = pc_vec_push(&x->groups, g);
        if (rc != 0)
            return rc;
        i = x->groups.len - 1;
        if ((rc = pc_strmap_insert(&x->group_index, key, len, i, NULL)) != 0) {
            x->groups.len--; /* the map is unchanged; so is the list */
            return rc;
        }
    }
    return bill_totals_add(&x->groups.base[i].t, ev);
}

static int cmp_group(const void *a, const void *b)
{
    const group_t *x = a, *y = b;
    if (x->day_ms != y->day_ms)
        return x->day_ms < y->day_ms ? -1 : 1;
    int c = strcmp(x->tenant, y->tenant);
    return c != 0 ? c : strcmp(x->model, y->model);
}

static int group_rows(bill_export_t *x)
{
    /* Sorting moves the groups: the index is done with (group_rows ends the export). */
    pc_strmap_free(&x->group_index);
    if (x->groups.len > 0) /* no groups: base is NULL, which qsort must not get even with 0 */
        qsort(x->groups.base, x->groups.len, sizeof *x->groups.base, cmp_group);
    for (size_t i = 0; i < x->groups.len; i++) {
        const group_t *g = &x->groups.base[i];
        char day[16], cost[32];
        bill_day_str(g->day_ms, day);
        for (int bkt = 0; bkt < BILL_BUCKET_COUNT; bkt++) {
            uint64_t q = g->t.quantity[bkt], c = g->t.cost_nusd[bkt];
            if (q == 0 && c == 0)
                continue;
            const char *unit = bkt == BILL_BUCKET_STORAGE ? "token_ms" : "tokens";
            int rc = 0;
            pc_buf_t *b = &x->out;
            bill_nusd_str(c, cost);
            if (x->p.format == BILL_EXPORT_CSV) {
                rc = pc_buf_printf(b, "%s,", day);
                rc = rc ? rc : csv_str(b, g->tenant);
                rc = rc ? rc : pc_buf_append(b, ",", 1);
                rc = rc ? rc : csv_str(b, g->model);
                rc = rc ? rc
                        : pc_buf_printf(b, ",%s,%" PRIu64 ",%s,%" PRIu64 ",%s\n",
                                        bill_bucket_name(bkt), q, unit, g->t.n_events, cost);
            } else if (x->p.format == BILL_EXPORT_JSONL) {
                rc = pc_buf_printf(b, "{\"day\":\"%s\",\"tenant\":", day);
                rc = rc ? rc : pc_json_cstr(b, g->tenant, 0);
                rc = rc ? rc : pc_buf_append_cstr(b, ",\"model\":");
                rc = rc ? rc : pc_json_cstr(b, g->model, 0);
                rc = rc ? rc
                        : pc_buf_printf(b,
                                        ",\"bucket\":\"%s\",\"quantity\":%" PRIu64
                                        ",\"unit\":\"%s\",\"events\":%" PRIu64
                                        ",\"cost_usd\":\"%s\"}\n",
                                        bill_bucket_name(bkt), q, unit, g->t.n_events, cost);
            } else {
                rc = focus_row(x, g->tenant, g->model, bkt, g->day_ms, g->day_ms + 86400000u, q, c,
                               NULL, NULL);
            }
            if (rc == 0)
                rc = flush(x, false);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Sources and their merge
 * ------------------------------------------------------------------------------------------- */

/* The merged order: end time, then instance, then seq. */
static bool src_less(const bill_export_t *x, size_t a, size_t b)
{
    const source_t *s = &x->src[a], *t = &x->src[b];
    if (s->ev.end_ms != t->ev.end_ms)
        return s->ev.end_ms < t->ev.end_ms;
    int c = strcmp(s->instance, t->instance);
    return c != 0 ? c < 0 : s->seq < t->seq;
}

static void heap_push(bill_export_t *x, size_t i)
{
    size_t k = x->n_heap++;
    x->heap[k] = i;
    while (k > 0 && src_less(x, x->heap[k], x->heap[(k - 1) / 2])) {
        size_t p = (k - 1) / 2, t = x->heap[p];
        x->heap[p] = x->heap[k];
        x->heap[k] = t;
        k = p;
    }
}

static size_t heap_pop(bill_export_t *x)
{
    size_t top = x->heap[0];
    x->heap[0] = x->heap[--x->n_heap];
    for (size_t k = 0;;) {
        size_t l = 2 * k + 1, r = l + 1, m = k;
        if (l < x->n_heap && src_less(x, x->heap[l], x->heap[m]))
            m = l;
        if (r < x->n_heap && src_less(x, x->heap[r], x->heap[m]))
            m = r;
        if (m == k)
            break;
        size_t t = x->heap[m];
        x->heap[m] = x->heap[k];
        x->heap[k] = t;
        k = m;
    }
    return top;
}

/* Reads one record of source i (NEED): a wanted event goes to the heap, an unwanted one is
 * dropped (the source stays NEED), the end makes it DONE. 0 or a read error. */
static int src_read_one(bill_export_t *x, size_t i, char *err, size_t err_len)
{
    source_t *s = &x->src[i];
    int rc = s->r != NULL ? bill_ledger_reader_next(s->r, &s->ev, &s->seq, err, err_len)
                          : bill__stream_next(&s->st, &s->ev, &s->seq, err, err_len);
    if (rc < 0)
        return rc;
    x->n_need--;
    if (rc == 1) {
        s->state = SRC_DONE;
        return 0;
    }
    const bill_event_t *ev = &s->ev;
    if (ev->start_ms < x->p.from_ms || ev->start_ms >= x->p.to_ms ||
        (x->p.tenant != NULL && strcmp(ev->tenant, x->p.tenant) != 0)) {
        x->need[x->n_need++] = i;
        return 0;
    }
    s->state = SRC_HEAD;
    heap_push(x, i);
    return 0;
}

/* An event id seen in two sources among the events of one end time: the same event twice (a
 * ledger copied under another instance id, a stream holding another instance's events). Refused:
 * an export counts every event once or fails. The same event has the same end time wherever it
 * is, so remembering the ids of one end time at a time finds it in bounded memory. */
static int dup_check(bill_export_t *x, size_t i, char *err, size_t err_len)
{
    const source_t *s = &x->src[i];
    if (s->ev.end_ms != x->dup_end_ms) {
        pc_strmap_free(&x->dup_ids);
        memset(&x->dup_ids, 0, sizeof x->dup_ids);
        x->dup_end_ms = s->ev.end_ms;
    }
    uint64_t *at;
    int rc = pc_strmap_insert(&x->dup_ids, s->ev.event_id, strlen(s->ev.event_id), i, &at);
    if (rc < 0)
        return pc_err_setf(err, err_len, rc, "export: %s", pc_strerror(rc));
    if (rc == 0 || *at == i) /* one ledger's own records: its dedup window decided */
        return 0;
    return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                       "export: event %s is in %s (instance %s) and in %s (instance %s): "
                       "refusing to count it twice",
                       s->ev.event_id, x->src[*at].where, x->src[*at].instance, s->where,
                       s->instance);
}

static int source_add(bill_export_t *x, const char *instance, const char *where)
{
    source_t *s = &x->src[x->n_src];
    memset(s, 0, sizeof *s);
    if (bill_event_set_str(s->instance, instance) != 0)
        return PC_ERR_INVAL;
    s->where = where;
    s->state = SRC_NEED;
    x->need[x->n_need++] = x->n_src++;
    return 0;
}

int bill_export_open_sources(const bill_export_sources_t *src, const bill_export_params_t *p,
                             bill_export_t **out, char *err, size_t err_len)
{
    *out = NULL;
    if (src == NULL || (src->n_ledgers > 0 && src->ledger_dirs == NULL) ||
        (src->n_ledgers == 0 && src->redis == NULL) || p == NULL || p->chunk == NULL ||
        p->format < 0 || p->format > BILL_EXPORT_FOCUS || p->group < 0 ||
        p->group > BILL_GROUP_DAY || p->from_ms > p->to_ms || p->chunk_bytes == 0)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "export: bad parameters (a ledger or Redis, format, group, chunk "
                           "callback, from <= to)");
    bill_export_t *x = pc_calloc(1, sizeof *x);
    if (x == NULL)
        return PC_ERR_NOMEM;
    x->p = *p;
    int rc = 0;
    char(*insts)[BILL_STR_MAX] = NULL;
    size_t n_insts = 0;
    if ((p->tenant != NULL && bill_event_set_str(x->tenant, p->tenant) != 0) ||
        bill_event_set_str(x->provider, p->provider != NULL ? p->provider : "kvgw") != 0) {
        rc = pc_err_setf(err, err_len, PC_ERR_INVAL, "export: bad tenant or provider name");
        goto fail;
    }
    x->p.tenant = p->tenant != NULL ? x->tenant : NULL;
    const char *prefix = src->redis_prefix != NULL ? src->redis_prefix : "kvgw";
    if (src->redis != NULL) {
        if ((rc = bill_redis_connect_sync(src->redis, &x->redis, err, err_len)) != 0 ||
            (rc = bill__redis_instances(x->redis, prefix, src->scan_streams, &insts, &n_insts, err,
                                        err_len)) != 0)
            goto fail;
    }
    size_t cap = src->n_ledgers + n_insts;
    x->src = pc_calloc(cap, sizeof *x->src);
    x->heap = pc_calloc(cap, sizeof *x->heap);
    x->need = pc_calloc(cap, sizeof *x->need);
    x->dirs = pc_calloc(src->n_ledgers + 1, sizeof *x->dirs);
    if (x->src == NULL || x->heap == NULL || x->need == NULL || x->dirs == NULL) {
        rc = PC_ERR_NOMEM;
        goto fail;
    }
    bool ranged = !p->scan_all && (p->from_ms != 0 || p->to_ms != UINT64_MAX);
    for (size_t i = 0; i < src->n_ledgers; i++) {
        char inst[BILL_STR_MAX];
        const char *dir = src->ledger_dirs[i];
        if ((x->dirs[i] = pc_strdup(dir)) == NULL) {
            rc = PC_ERR_NOMEM;
            goto fail;
        }
        if (bill_ledger_read_instance(dir, inst) != 0) {
            rc = pc_err_setf(err, err_len, PC_ERR_NOTFOUND,
                             "export: %s is not a ledger (no valid INSTANCE)", dir);
            goto fail;
        }
        for (size_t k = 0; k < x->n_src; k++)
            if (strcmp(x->src[k].instance, inst) == 0) {
                rc = pc_err_setf(err, err_len, PC_ERR_INVAL,
                                 "export: %s and %s are both the ledger of instance %s",
                                 x->src[k].where, dir, inst);
                goto fail;
            }
        if ((rc = source_add(x, inst, x->dirs[i])) != 0 ||
            (rc = bill_ledger_reader_open(dir, 1, &x->src[x->n_src - 1].r, err, err_len)) != 0)
            goto fail;
        /* An unbounded range has nothing to skip (except empty segments): no index look-ups. */
        if (ranged)
            (void)bill_ledger_reader_set_time_range(x->src[x->n_src - 1].r, p->from_ms, p->to_ms);
    }
    /* The streams of the instances whose ledger was not given (a ledger is the record). */
    size_t n_ledgers = x->n_src;
    for (size_t i = 0; i < n_insts; i++) {
        bool given = false;
        for (size_t k = 0; k < n_ledgers; k++)
            given |= strcmp(x->src[k].instance, insts[i]) == 0;
        if (given)
            continue;
        source_t *s = &x->src[x->n_src];
        if ((rc = source_add(x, insts[i], s->st.key)) != 0)
            goto fail;
        bill__stream_init(&s->st, x->redis, prefix, insts[i]);
    }
    pc_free(insts);
    *out = x;
    return 0;
fail:
    pc_free(insts);
    bill_export_free(x);
    return rc;
}

int bill_export_open(const char *dir, const bill_export_params_t *p, bill_export_t **out, char *err,
                     size_t err_len)
{
    bill_export_sources_t src = {.ledger_dirs = &dir, .n_ledgers = dir != NULL ? 1 : 0};
    return bill_export_open_sources(&src, p, out, err, err_len);
}

int bill_export_step(bill_export_t *x, size_t max_records, char *err, size_t err_len)
{
    if (x->done)
        return 1;
    int rc = 0;
    if (!x->header_done) {
        x->header_done = true;
        if (x->p.header && x->p.format != BILL_EXPORT_JSONL)
            rc = pc_buf_append_cstr(&x->out, x->p.format == BILL_EXPORT_FOCUS ? focus_header
                                             : x->p.group == BILL_GROUP_DAY   ? csv_group_header
                                                                              : csv_header);
        if (rc != 0)
            return rc;
    }
    /* Every source's next wanted event is in the heap before the smallest is taken; each record
     * read counts against max_records, so a step is bounded however few records are wanted. */
    size_t budget = max_records;
    while (budget > 0) {
        if (x->n_need > 0) {
            budget--;
            if ((rc = src_read_one(x, x->need[x->n_need - 1], err, err_len)) != 0)
                return rc;
            continue;
        }
        if (x->n_heap == 0)
            break;
        size_t i = heap_pop(x);
        source_t *s = &x->src[i];
        rc = dup_check(x, i, err, err_len);
        if (rc != 0)
            return rc;
        rc = x->p.group == BILL_GROUP_DAY ? group_add(x, &s->ev)
                                          : event_row(x, &s->ev, s->seq, s->instance);
        if (rc == 0)
            rc = flush(x, false);
        if (rc != 0)
            return pc_err_setf(err, err_len, rc, "export: %s", pc_strerror(rc));
        s->state = SRC_NEED;
        x->need[x->n_need++] = i;
    }
    if (x->n_need > 0 || x->n_heap > 0)
        return 0;
    if (x->p.group == BILL_GROUP_DAY)
        rc = group_rows(x);
    if (rc == 0)
        rc = flush(x, true);
    if (rc != 0)
        return pc_err_setf(err, err_len, rc, "export: %s", pc_strerror(rc));
    x->done = true;
    return 1;
}

void bill_export_free(bill_export_t *x)
{
    if (x == NULL)
        return;
    for (size_t i = 0; i < x->n_src; i++) {
        bill_ledger_reader_free(x->src[i].r);
        bill__stream_free(&x->src[i].st);
    }
    for (size_t i = 0; x->dirs != NULL && x->dirs[i] != NULL; i++)
        pc_free(x->dirs[i]);
    pc_free(x->dirs);
    pc_free(x->src);
    pc_free(x->heap);
    pc_free(x->need);
    if (x->redis != NULL)
        redisFree(x->redis);
    pc_strmap_free(&x->dup_ids);
    pc_buf_free(&x->out);
    pc_vec_free(&x->groups);
    pc_strmap_free(&x->group_index);
    pc_free(x);
}

void bill_export_segments(const bill_export_t *x, uint64_t *n_read, uint64_t *n_skipped)
{
    uint64_t r = 0, k = 0;
    for (size_t i = 0; i < x->n_src; i++) {
        if (x->src[i].r == NULL)
            continue;
        bill_ledger_reader_stats_t st;
        bill_ledger_reader_stats(x->src[i].r, &st);
        r += st.n_segments_read;
        k += st.n_segments_skipped;
    }
    if (n_read != NULL)
        *n_read = r;
    if (n_skipped != NULL)
        *n_skipped = k;
}

size_t bill_export_n_sources(const bill_export_t *x)
{
    return x->n_src;
}

const char *bill_export_source(const bill_export_t *x, size_t i, bool *from_redis)
{
    if (i >= x->n_src)
        return NULL;
    if (from_redis != NULL)
        *from_redis = x->src[i].r == NULL;
    return x->src[i].instance;
}

int bill_export_run(const char *dir, const bill_export_params_t *p, char *err, size_t err_len)
{
    bill_export_t *x;
    int rc = bill_export_open(dir, p, &x, err, err_len);
    if (rc != 0)
        return rc;
    while ((rc = bill_export_step(x, 4096, err, err_len)) == 0)
        ;
    bill_export_free(x);
    return rc == 1 ? 0 : rc;
}
