/*
 * test_export.c — exports of a real ledger (CSV, JSON lines, FOCUS; per event and per day) add up
 * to the ledger's total to the nano-dollar, stream in bounded chunks, filter by tenant and time;
 * storage events from bill_storage_emit are priced and refused as the contract says.
 */
#include "common.h"
#include "ledger.h"
#include "pc_test.h"
#include "pc_testutil.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const char *prices = "models:\n"
                            "  m1: {input_usd_per_mtok: \"3\", output_usd_per_mtok: \"15\"}\n"
                            "  m2: {input_usd_per_mtok: \"1\", output_usd_per_mtok: \"5\",\n"
                            "       storage_usd_per_mtok_hour: \"0.5\"}\n";

#define DAY0 1735689600000ull /* 2025-01-01T00:00:00Z */

__attribute__((destructor)) static void remove_ledgers(void)
{
    char cmd[600];
    if (pc_test__tmp_dir[0] != '\0') {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", pc_test__tmp_dir);
        if (system(cmd) != 0)
            fprintf(stderr, "cannot remove %s\n", pc_test__tmp_dir);
    }
}

static uint64_t g_total;        /* nano-USD of every event written */
static uint64_t g_total_acme;   /* of tenant acme */
static uint64_t g_total_day0;   /* of events starting on DAY0 */
static int g_events, g_storage; /* counts */
static char g_dir[512];

static int build_ledger(void)
{
    snprintf(g_dir, sizeof g_dir, "%s", pc_test_tmp_path("exp"));
    bill_pricing_t *p;
    char err[256];
    if (bill_pricing_parse(prices, strlen(prices), &p, err, sizeof err) != 0)
        return -1;
    bill_ledger_params_t lp = bill_ledger_params_default();
    lp.dir = g_dir;
    lp.fsync = BILL_FSYNC_OFF;
    bill_ledger_t *l;
    if (bill_ledger_open(&lp, &l, err, sizeof err) != 0)
        return -1;
    bill_idgen_t ids;
    bill_idgen_init(&ids);
    for (int i = 0; i < 500; i++) {
        bill_event_t ev;
        bill_event_init(&ev, BILL_EVENT_USAGE);
        bill_idgen_next(&ids, ev.event_id);
        snprintf(ev.request_id, BILL_STR_MAX, "req_%d", i);
        bill_event_set_str(ev.tenant, i % 3 == 0 ? "acme" : "te,\"na\"nt"); /* CSV quoting */
        bill_event_set_str(ev.api_key_id, "key");
        bill_event_set_str(ev.model, i % 2 ? "m1" : "m2");
        ev.start_ms = DAY0 + (uint64_t)i * 400000u; /* spans 3 days */
        ev.end_ms = ev.start_ms + 1234;
        ev.status = (uint8_t)(i % BILL_STATUS_COUNT);
        ev.usage = (bill_usage_t){.n_uncached = 1 + (uint64_t)i * 7,
                                  .n_write_5m = (uint64_t)(i % 5) * 333,
                                  .n_write_1h = (uint64_t)(i % 7) * 111,
                                  .n_read = (uint64_t)i * 13,
                                  .n_output = (uint64_t)(i % 11) * 17};
        ev.n_hit_logical = ev.usage.n_read;
        ev.n_hit_physical = ev.usage.n_read / 3;
        if (bill_event_price(&ev, p, NULL, 0) != 0)
            return -1;
        uint64_t seq;
        if (bill_ledger_append(l, &ev, &seq) != 0)
            return -1;
        g_total += bill_event_total_nusd(&ev);
        if (i % 3 == 0)
            g_total_acme += bill_event_total_nusd(&ev);
        if (ev.start_ms < DAY0 + 86400000u)
            g_total_day0 += bill_event_total_nusd(&ev);
        g_events++;
    }
    /* Storage: two namespaces for two windows; one sample with 0 token-ms is skipped. */
    for (int w = 0; w < 2; w++) {
        bill_storage_sample_t s[3] = {
            {"ns01", "acme", "m2", 3600000000ull * (uint64_t)(w + 1)}, /* 1e3 tok-h x (w+1) */
            {"ns02", "globex", "m2", 12345678ull},
            {"ns03", "globex", "m2", 0},
        };
        uint64_t last;
        uint64_t ws = DAY0 + (uint64_t)w * 60000u;
        if (bill_storage_emit(l, p, &ids, s, 3, ws, ws + 60000, &last, err, sizeof err) != 0)
            return -1;
        /* ns01: 1000 (w+1) token-hours at $0.5 / M token-hours = $0.0005 (w+1). */
        g_total += 500000u * (uint64_t)(w + 1) + 1715; /* 12345678 / 3.6e12 x 5e8 = 1714.67 */
        g_total_acme += 500000u * (uint64_t)(w + 1);
        g_total_day0 += 500000u * (uint64_t)(w + 1) + 1715;
        g_storage += 2;
    }
    int rc = bill_ledger_close(l);
    bill_pricing_free(p);
    return rc;
}

typedef struct sink {
    pc_buf_t all;
    size_t n_chunks, max_chunk;
    int fail_after; /* cancel on this chunk (-1 never) */
} sink_t;

static int on_chunk(void *ud, const char *data, size_t len)
{
    sink_t *s = ud;
    if (s->fail_after >= 0 && (int)s->n_chunks == s->fail_after)
        return 1;
    s->n_chunks++;
    if (len > s->max_chunk)
        s->max_chunk = len;
    return pc_buf_append(&s->all, data, len);
}

static int run(int format, int group, const char *tenant, uint64_t from, uint64_t to, size_t chunk,
               sink_t *s)
{
    memset(s, 0, sizeof *s);
    s->fail_after = -1;
    bill_export_params_t xp = bill_export_params_default();
    xp.format = format;
    xp.group = group;
    xp.tenant = tenant;
    xp.from_ms = from;
    xp.to_ms = to;
    xp.chunk = on_chunk;
    xp.ud = s;
    if (chunk)
        xp.chunk_bytes = chunk;
    char err[256];
    int rc = bill_export_run(g_dir, &xp, err, sizeof err);
    pc_buf_terminate(&s->all);
    return rc;
}

/* Parses "123.000000456" USD into nano-USD exactly. */
static uint64_t usd(const char *s)
{
    uint64_t v = 0;
    if (bill_parse_usd(s, &v) != 0)
        fprintf(stderr, "  bad amount '%s'\n", s);
    return v;
}

/* Splits one CSV line (RFC 4180 quoting) into fields, in place; returns the count. */
static int csv_split(char *line, char **f, int max)
{
    int n = 0;
    char *p = line, *w;
    while (n < max) {
        f[n++] = w = p;
        if (*p == '"') {
            p++;
            for (;;) {
                if (*p == '"' && p[1] == '"') {
                    *w++ = '"';
                    p += 2;
                } else if (*p == '"') {
                    p++;
                    break;
                } else {
                    *w++ = *p++;
                }
            }
        } else {
            while (*p && *p != ',')
                *w++ = *p++;
        }
        char c = *p;
        *w = '\0';
        if (c != ',')
            break;
        p++;
    }
    return n;
}

/* Sums column `col` (by header name) of a CSV text; checks every row has the header's width. */
static int csv_sum(char *text, const char *col, uint64_t *sum, int *rows)
{
    char *save, *line = strtok_r(text, "\n", &save);
    char *f[64];
    int width = csv_split(line, f, 64), idx = -1;
    for (int i = 0; i < width; i++)
        if (strcmp(f[i], col) == 0)
            idx = i;
    if (idx < 0)
        return -1;
    *sum = 0;
    *rows = 0;
    while ((line = strtok_r(NULL, "\n", &save)) != NULL) {
        if (csv_split(line, f, 64) != width)
            return -2;
        *sum += usd(f[idx]);
        (*rows)++;
    }
    return width;
}

PC_TEST(csv_per_event_and_per_day_add_up)
{
    ASSERT_EQ(build_ledger(), 0);
    sink_t s;
    uint64_t sum;
    int rows;
    ASSERT_EQ(run(BILL_EXPORT_CSV, BILL_GROUP_NONE, NULL, 0, UINT64_MAX, 0, &s), 0);
    ASSERT_EQ(csv_sum(s.all.base, "cost_total_usd", &sum, &rows), 28);
    ASSERT_EQ(rows, g_events + g_storage);
    ASSERT_EQ_U64(sum, g_total);
    pc_buf_free(&s.all);

    ASSERT_EQ(run(BILL_EXPORT_CSV, BILL_GROUP_DAY, NULL, 0, UINT64_MAX, 0, &s), 0);
    ASSERT_EQ(csv_sum(s.all.base, "cost_usd", &sum, &rows), 8);
    ASSERT_EQ_U64(sum, g_total);
    ASSERT_TRUE(rows > 3 && rows < 80);
    pc_buf_free(&s.all);
}

PC_TEST(focus_rows_have_every_column_and_add_up)
{
    sink_t s;
    uint64_t sum;
    int rows;
    ASSERT_EQ(run(BILL_EXPORT_FOCUS, BILL_GROUP_NONE, NULL, 0, UINT64_MAX, 0, &s), 0);
    ASSERT_TRUE(strncmp(s.all.base, "BilledCost,BillingAccountId,", 28) == 0);
    ASSERT_TRUE(strstr(s.all.base, "Usage-Based") != NULL);
    ASSERT_TRUE(strstr(s.all.base, "m2:cache_storage") != NULL);
    ASSERT_TRUE(strstr(s.all.base, "1M Token-Hours") != NULL);
    ASSERT_EQ(csv_sum(s.all.base, "BilledCost", &sum, &rows), 42);
    ASSERT_EQ_U64(sum, g_total);
    ASSERT_TRUE(rows > g_events); /* one row per event and bucket */
    pc_buf_free(&s.all);
    ASSERT_EQ(run(BILL_EXPORT_FOCUS, BILL_GROUP_DAY, NULL, 0, UINT64_MAX, 0, &s), 0);
    ASSERT_EQ(csv_sum(s.all.base, "EffectiveCost", &sum, &rows), 42);
    ASSERT_EQ_U64(sum, g_total);
    pc_buf_free(&s.all);
}

PC_TEST(jsonl_parses_and_adds_up)
{
    sink_t s;
    for (int group = 0; group < 2; group++) {
        ASSERT_EQ(run(BILL_EXPORT_JSONL, group, NULL, 0, UINT64_MAX, 0, &s), 0);
        uint64_t sum = 0;
        int rows = 0;
        char *save, *line = strtok_r(s.all.base, "\n", &save);
        for (; line != NULL; line = strtok_r(NULL, "\n", &save)) {
            json_error_t je;
            json_t *o = json_loads(line, 0, &je);
            ASSERT_TRUE(o != NULL);
            const char *c =
                group ? json_string_value(json_object_get(o, "cost_usd"))
                      : json_string_value(json_object_get(json_object_get(o, "cost_usd"), "total"));
            ASSERT_TRUE(c != NULL);
            sum += usd(c);
            rows++;
            json_decref(o);
        }
        ASSERT_EQ_U64(sum, g_total);
        if (!group)
            ASSERT_EQ(rows, g_events + g_storage);
        pc_buf_free(&s.all);
    }
}

PC_TEST(filters_by_tenant_and_time)
{
    sink_t s;
    uint64_t sum;
    int rows;
    ASSERT_EQ(run(BILL_EXPORT_CSV, BILL_GROUP_NONE, "acme", 0, UINT64_MAX, 0, &s), 0);
    ASSERT_TRUE(csv_sum(s.all.base, "cost_total_usd", &sum, &rows) > 0);
    ASSERT_EQ_U64(sum, g_total_acme);
    pc_buf_free(&s.all);
    ASSERT_EQ(run(BILL_EXPORT_CSV, BILL_GROUP_DAY, NULL, DAY0, DAY0 + 86400000u, 0, &s), 0);
    ASSERT_TRUE(csv_sum(s.all.base, "cost_usd", &sum, &rows) > 0);
    ASSERT_EQ_U64(sum, g_total_day0);
    pc_buf_free(&s.all);
    ASSERT_EQ(run(BILL_EXPORT_CSV, BILL_GROUP_NONE, "nobody", 0, UINT64_MAX, 0, &s), 0);
    ASSERT_TRUE(csv_sum(s.all.base, "cost_total_usd", &sum, &rows) > 0);
    ASSERT_EQ(rows, 0);
    pc_buf_free(&s.all);
}

PC_TEST(streams_in_bounded_chunks)
{
    sink_t big, small;
    ASSERT_EQ(run(BILL_EXPORT_FOCUS, BILL_GROUP_NONE, NULL, 0, UINT64_MAX, 0, &big), 0);
    ASSERT_EQ(run(BILL_EXPORT_FOCUS, BILL_GROUP_NONE, NULL, 0, UINT64_MAX, 1024, &small), 0);
    ASSERT_EQ_U64(small.all.len, big.all.len);
    ASSERT_MEM_EQ(small.all.base, big.all.base, big.all.len);
    ASSERT_TRUE(small.n_chunks > 50);
    ASSERT_TRUE(small.max_chunk < 1024 + 8 * 1024); /* a chunk plus at most one event's rows */
    pc_buf_free(&big.all);
    pc_buf_free(&small.all);
    /* A consumer that goes away cancels the export. */
    sink_t s = {.fail_after = 2};
    bill_export_params_t xp = bill_export_params_default();
    xp.chunk = on_chunk;
    xp.ud = &s;
    xp.chunk_bytes = 512;
    ASSERT_EQ(bill_export_run(g_dir, &xp, NULL, 0), PC_ERR_CANCELED);
    pc_buf_free(&s.all);
    /* Bad parameters. */
    xp.format = 7;
    ASSERT_EQ(bill_export_run(g_dir, &xp, NULL, 0), PC_ERR_INVAL);
}

PC_TEST(storage_emit_checks_everything_first)
{
    const char *dir = pc_test_tmp_path("st");
    bill_pricing_t *p;
    ASSERT_EQ(bill_pricing_parse(prices, strlen(prices), &p, NULL, 0), 0);
    bill_ledger_params_t lp = bill_ledger_params_default();
    lp.dir = dir;
    bill_ledger_t *l;
    ASSERT_EQ(bill_ledger_open(&lp, &l, NULL, 0), 0);
    bill_idgen_t ids;
    bill_idgen_init(&ids);
    bill_storage_sample_t s[2] = {{"ns1", "acme", "m2", 1000}, {"ns2", "acme", "nope", 1000}};
    char err[256];
    uint64_t last = 99;
    ASSERT_EQ(bill_storage_emit(l, p, &ids, s, 2, 0, 60000, &last, err, sizeof err),
              PC_ERR_NOTFOUND);
    ASSERT_TRUE(strstr(err, "nope") != NULL);
    ASSERT_EQ(bill_storage_emit(l, p, &ids, s, 1, 60000, 0, &last, err, sizeof err), PC_ERR_INVAL);
    s[1].model = "m1"; /* m1 has no storage price: 0, as on Anthropic */
    s[1].ns = "";
    ASSERT_EQ(bill_storage_emit(l, p, &ids, s, 2, 0, 60000, &last, err, sizeof err), PC_ERR_INVAL);
    bill_ledger_stats_t st;
    bill_ledger_stats(l, &st);
    ASSERT_EQ_U64(st.next_seq, 1); /* nothing appended by the refused calls */
    s[1].ns = "ns2";
    ASSERT_EQ(bill_storage_emit(l, p, &ids, s, 2, 0, 60000, &last, err, sizeof err), 0);
    ASSERT_EQ_U64(last, 2);
    ASSERT_EQ(bill_ledger_wait_durable(l, last), 0);
    ASSERT_EQ(bill_ledger_close(l), 0);
    bill_ledger_reader_t *r;
    ASSERT_EQ(bill_ledger_reader_open(dir, 1, &r, NULL, 0), 0);
    bill_event_t ev;
    uint64_t seq;
    ASSERT_EQ(bill_ledger_reader_next(r, &ev, &seq, NULL, 0), 0);
    ASSERT_EQ(ev.kind, BILL_EVENT_STORAGE);
    ASSERT_STR_EQ(ev.ns, "ns1");
    ASSERT_EQ_U64(ev.token_ms, 1000);
    ASSERT_EQ_U64(ev.end_ms, 60000);
    ASSERT_EQ(bill_ledger_reader_next(r, &ev, &seq, NULL, 0), 0);
    ASSERT_EQ_U64(ev.cost_nusd[BILL_BUCKET_STORAGE], 0);
    ASSERT_EQ(bill_ledger_reader_next(r, &ev, &seq, NULL, 0), 1);
    bill_ledger_reader_free(r);
    bill_pricing_free(p);
}

/* ---- the merged view of several gateways' ledgers ---------------------------------------- */

static int merge_append(bill_ledger_t *l, const char *id, const char *inst, int i, uint64_t end)
{
    bill_event_t ev;
    bill_event_init(&ev, BILL_EVENT_USAGE);
    snprintf(ev.event_id, BILL_STR_MAX, "%s", id);
    snprintf(ev.request_id, BILL_STR_MAX, "req-%s-%d", inst, i);
    bill_event_set_str(ev.tenant, "acme");
    bill_event_set_str(ev.model, "m1");
    ev.end_ms = end;
    ev.start_ms = end - 100;
    ev.usage.n_uncached = 10 + (uint64_t)i;
    ev.cost_nusd[BILL_BUCKET_UNCACHED] = 1000 + (uint64_t)i;
    ev.registry = (uint8_t)(i % BILL_REGISTRY_COUNT);
    uint64_t seq;
    return bill_ledger_append(l, &ev, &seq);
}

/* A ledger of instance inst with n events: ids "<inst>-<i>", end times end_of(i); with dup_id,
 * first a copy of another instance's event (its id, end time dup_end). */
static int merge_ledger(const char *dir, const char *inst, int n, uint64_t (*end_of)(int),
                        const char *dup_id, uint64_t dup_end)
{
    bill_ledger_params_t lp = bill_ledger_params_default();
    lp.dir = dir;
    lp.instance = inst;
    lp.fsync = BILL_FSYNC_OFF;
    bill_ledger_t *l;
    char err[256], id[BILL_STR_MAX];
    if (bill_ledger_open(&lp, &l, err, sizeof err) != 0)
        return -1;
    int rc = dup_id != NULL ? merge_append(l, dup_id, inst, 0, dup_end) : 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        snprintf(id, sizeof id, "%s-%d", inst, i);
        rc = merge_append(l, id, inst, i, end_of(i));
    }
    int rc2 = bill_ledger_close(l);
    return rc != 0 ? rc : rc2;
}

/* a: every 3 ms; b: every 2 ms; c: every 5 ms, so end times tie across instances. */
static uint64_t end_a(int i)
{
    return DAY0 + 3 * (uint64_t)i;
}
static uint64_t end_b(int i)
{
    return DAY0 + 2 * (uint64_t)i;
}
static uint64_t end_c(int i)
{
    return DAY0 + 5 * (uint64_t)i;
}
static uint64_t end_d(int i)
{
    return DAY0 + 20 + (uint64_t)i;
}

static int merged_run(const char *const *dirs, size_t n, sink_t *s, char *err, size_t err_len)
{
    memset(s, 0, sizeof *s);
    s->fail_after = -1;
    bill_export_params_t xp = bill_export_params_default();
    xp.format = BILL_EXPORT_JSONL;
    xp.chunk = on_chunk;
    xp.ud = s;
    bill_export_sources_t src = {.ledger_dirs = dirs, .n_ledgers = n};
    bill_export_t *x;
    int rc = bill_export_open_sources(&src, &xp, &x, err, err_len);
    if (rc != 0)
        return rc;
    while ((rc = bill_export_step(x, 7, err, err_len)) == 0) /* small steps: resumed merges */
        ;
    bill_export_free(x);
    pc_buf_terminate(&s->all);
    return rc == 1 ? 0 : rc;
}

PC_TEST(merged_ledgers_every_event_once_in_end_instance_seq_order)
{
    char da[600], db[600], dc[600];
    snprintf(da, sizeof da, "%s", pc_test_tmp_path("merge_a"));
    snprintf(db, sizeof db, "%s", pc_test_tmp_path("merge_b"));
    snprintf(dc, sizeof dc, "%s", pc_test_tmp_path("merge_c"));
    ASSERT_EQ(merge_ledger(da, "gw-a", 40, end_a, NULL, 0), 0);
    ASSERT_EQ(merge_ledger(db, "gw-b", 60, end_b, NULL, 0), 0);
    ASSERT_EQ(merge_ledger(dc, "gw-c", 25, end_c, NULL, 0), 0);
    const char *dirs[3] = {dc, da, db}; /* the order given does not matter */
    sink_t s;
    char err[256] = "";
    ASSERT_EQ(merged_run(dirs, 3, &s, err, sizeof err), 0);
    int n = 0, per[3] = {0}, reg[BILL_REGISTRY_COUNT] = {0};
    uint64_t prev_end = 0, prev_seq = 0;
    char prev_inst[64] = "";
    char *save, *line = strtok_r(s.all.base, "\n", &save);
    for (; line != NULL; line = strtok_r(NULL, "\n", &save), n++) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        ASSERT_TRUE(o != NULL);
        const char *inst = json_string_value(json_object_get(o, "instance"));
        const char *end = json_string_value(json_object_get(o, "end"));
        const char *id = json_string_value(json_object_get(o, "event_id"));
        const char *r = json_string_value(json_object_get(o, "registry"));
        uint64_t seq = (uint64_t)json_integer_value(json_object_get(o, "seq"));
        ASSERT_TRUE(inst != NULL && end != NULL && id != NULL && r != NULL);
        uint64_t end_ms;
        ASSERT_EQ(bill_parse_time_ms(end, &end_ms), 0);
        /* Ordered by (end, instance, seq). */
        int c = strcmp(prev_inst, inst);
        ASSERT_TRUE(end_ms > prev_end ||
                    (end_ms == prev_end && (c < 0 || (c == 0 && seq > prev_seq))));
        /* The event is its instance's event number seq - 1. */
        char want[80];
        snprintf(want, sizeof want, "%s-%" PRIu64, inst, seq - 1);
        ASSERT_STR_EQ(id, want);
        per[inst[3] - 'a']++;
        ASSERT_TRUE(bill_registry_parse(r) == (int)((seq - 1) % BILL_REGISTRY_COUNT));
        reg[bill_registry_parse(r)]++;
        prev_end = end_ms;
        prev_seq = seq;
        snprintf(prev_inst, sizeof prev_inst, "%s", inst);
        json_decref(o);
    }
    ASSERT_EQ(n, 125);
    ASSERT_EQ(per[0], 40);
    ASSERT_EQ(per[1], 60);
    ASSERT_EQ(per[2], 25);
    ASSERT_TRUE(reg[0] > 0 && reg[1] > 0 && reg[2] > 0);
    pc_buf_free(&s.all);

    /* Per-day totals of the merge equal the sum of the three ledgers' own. */
    uint64_t sum = 0;
    for (int i = 0; i < 3; i++) {
        sink_t one;
        ASSERT_EQ(merged_run(&dirs[i], 1, &one, err, sizeof err), 0);
        for (char *p = one.all.base; (p = strstr(p, "\"total\":\"")) != NULL; p += 9) {
            char amount[40];
            snprintf(amount, sizeof amount, "%.*s", (int)strcspn(p + 9, "\""), p + 9);
            sum += usd(amount);
        }
        pc_buf_free(&one.all);
    }
    ASSERT_EQ_U64(sum, 40 * 1000 + 39 * 40 / 2 + 60 * 1000 + 59 * 60 / 2 + 25 * 1000 + 24 * 25 / 2);
}

PC_TEST(merged_ledgers_refuse_duplicates_loudly)
{
    char da[600], dd[600];
    snprintf(da, sizeof da, "%s", pc_test_tmp_path("dup_a"));
    snprintf(dd, sizeof dd, "%s", pc_test_tmp_path("dup_d"));
    ASSERT_EQ(merge_ledger(da, "gw-a", 10, end_a, NULL, 0), 0);
    /* gw-d holds a copy of gw-a's event 4 (same id, same end time). */
    ASSERT_EQ(merge_ledger(dd, "gw-d", 10, end_d, "gw-a-4", end_a(4)), 0);
    sink_t s;
    char err[256] = "";
    const char *dirs[2] = {da, dd};
    ASSERT_EQ(merged_run(dirs, 2, &s, err, sizeof err), PC_ERR_FORMAT);
    ASSERT_TRUE(strstr(err, "gw-a-4") != NULL && strstr(err, "twice") != NULL);
    pc_buf_free(&s.all);
    /* One instance's ledger given twice. */
    const char *twice[2] = {da, da};
    ASSERT_EQ(merged_run(twice, 2, &s, err, sizeof err), PC_ERR_INVAL);
    ASSERT_TRUE(strstr(err, "instance gw-a") != NULL);
    /* Without the copy, both export. */
    const char *one[1] = {dd};
    ASSERT_EQ(merged_run(one, 1, &s, err, sizeof err), 0);
    pc_buf_free(&s.all);
}

PC_TEST_MAIN()
