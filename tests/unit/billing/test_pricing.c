/*
 * test_pricing.c — golden cost tests (Anthropic's worked examples, mixed TTL A/B/C, OpenAI's
 * inclusive counts, a price change at an effective date, huge counts), the exact parsers, the
 * pricing table's errors, and the event encoding.
 */
#include "billing.h"
#include "common.h"
#include "pc_test.h"

#include <string.h>

static const char *table = "currency: USD\n"
                           "models:\n"
                           "  sonnet:\n"
                           "    input_usd_per_mtok: \"3\"\n"
                           "    output_usd_per_mtok: \"15\"\n"
                           "  haiku:\n"
                           "    input_usd_per_mtok: 1\n"
                           "    output_usd_per_mtok: 5\n"
                           "    storage_usd_per_mtok_hour: \"0.5\"\n"
                           "  changing:\n"
                           "    - effective: 2025-01-01\n"
                           "      input_usd_per_mtok: \"15\"\n"
                           "      output_usd_per_mtok: \"75\"\n"
                           "    - effective: 2025-11-24T00:00:00Z\n"
                           "      input_usd_per_mtok: \"5\"\n"
                           "      output_usd_per_mtok: \"25\"\n"
                           "      cache_read: \"0.025\"\n";

static bill_pricing_t *load_table(void)
{
    bill_pricing_t *p = NULL;
    char err[256] = "";
    int rc = bill_pricing_parse(table, strlen(table), &p, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  %s\n", err);
    return p;
}

static void usage_event(bill_event_t *ev, const char *model, uint64_t at_ms)
{
    bill_event_init(ev, BILL_EVENT_USAGE);
    bill_event_set_str(ev->event_id, "ev-1");
    bill_event_set_str(ev->request_id, "req-1");
    bill_event_set_str(ev->tenant, "acme");
    bill_event_set_str(ev->model, model);
    ev->start_ms = at_ms;
    ev->end_ms = at_ms + 1000;
}

PC_TEST(muldiv_rounds_half_to_even_once)
{
    uint64_t v;
    ASSERT_EQ(bill_muldiv_round(1, 1, 1, 2, &v), 0);
    ASSERT_EQ_U64(v, 0); /* 0.5 -> 0 */
    bill_muldiv_round(3, 1, 1, 2, &v);
    ASSERT_EQ_U64(v, 2); /* 1.5 -> 2 */
    bill_muldiv_round(5, 1, 1, 2, &v);
    ASSERT_EQ_U64(v, 2); /* 2.5 -> 2 */
    bill_muldiv_round(7, 1, 1, 2, &v);
    ASSERT_EQ_U64(v, 4); /* 3.5 -> 4 */
    bill_muldiv_round(7, 1, 1, 3, &v);
    ASSERT_EQ_U64(v, 2); /* 2.33 -> 2 */
    bill_muldiv_round(8, 1, 1, 3, &v);
    ASSERT_EQ_U64(v, 3); /* 2.67 -> 3 */
    ASSERT_EQ(bill_muldiv_round(1, 1, 1, 0, &v), PC_ERR_INVAL);
    /* Each bucket rounds once: 1 token of $0.000001/MTok at 5/4 is 1.25e-6 nano-USD -> 0. */
    ASSERT_EQ(bill_cost_tokens(1, 1, (bill_ratio_t){5, 4}, &v), 0);
    ASSERT_EQ_U64(v, 0);
    ASSERT_EQ(bill_cost_tokens(400000, 1, (bill_ratio_t){5, 4}, &v), 0);
    ASSERT_EQ_U64(v, 0); /* exactly 0.5 -> 0 (even) */
    ASSERT_EQ(bill_cost_tokens(1200000, 1, (bill_ratio_t){5, 4}, &v), 0);
    ASSERT_EQ_U64(v, 2); /* exactly 1.5 -> 2 */
}

PC_TEST(anthropic_single_ttl_example)
{
    /* Sonnet 4.5 list prices $3 in / $15 out: a 10,000-token system prompt written to the 5m
     * cache, 50 uncached tokens after the breakpoint, 200 output tokens; then the same prompt
     * read back. 5m write = $3.75/MTok, read = $0.30/MTok (api-spec §1.11). */
    bill_pricing_t *p = load_table();
    ASSERT_TRUE(p != NULL);
    bill_event_t ev;
    usage_event(&ev, "sonnet", 1700000000000ull);
    ev.usage = (bill_usage_t){.n_uncached = 50, .n_write_5m = 10000, .n_output = 200};
    char err[200];
    ASSERT_EQ(bill_event_price(&ev, p, err, sizeof err), 0);
    ASSERT_EQ_U64(ev.cost_nusd[BILL_BUCKET_UNCACHED], 150000);   /* 50 x $3/M */
    ASSERT_EQ_U64(ev.cost_nusd[BILL_BUCKET_WRITE_5M], 37500000); /* 10000 x $3.75/M */
    ASSERT_EQ_U64(ev.cost_nusd[BILL_BUCKET_OUTPUT], 3000000);    /* 200 x $15/M */
    ASSERT_EQ_U64(bill_event_total_nusd(&ev), 40650000);         /* $0.04065 */
    char s[32];
    ASSERT_STR_EQ(bill_nusd_str(bill_event_total_nusd(&ev), s), "0.040650000");

    /* The follow-up: 10,000 read, 60 uncached, 150 output. Disjoint buckets: the read tokens
     * are never also counted as input (LiteLLM #9812, #11789). */
    ev.usage = (bill_usage_t){.n_uncached = 60, .n_read = 10000, .n_output = 150};
    ev.n_hit_logical = 10000;
    ev.n_hit_physical = 9000;
    ASSERT_EQ(bill_event_price(&ev, p, err, sizeof err), 0);
    ASSERT_EQ_U64(ev.cost_nusd[BILL_BUCKET_READ], 3000000); /* 10000 x $0.30/M */
    ASSERT_EQ_U64(ev.cost_nusd[BILL_BUCKET_UNCACHED], 180000);
    ASSERT_EQ_U64(ev.cost_nusd[BILL_BUCKET_WRITE_5M], 0);
    ASSERT_EQ_U64(bill_event_total_nusd(&ev), 3000000 + 180000 + 2250000);
    bill_pricing_free(p);
}

PC_TEST(anthropic_mixed_ttl_abc_example)
{
    /* A = 1000 (cache hit), B = 5000 (last 1h breakpoint), C = 8000 (last breakpoint), prompt
     * 8100: read 1000, 1h write 4000, 5m write 3000, uncached 100. */
    bill_usage_t u;
    ASSERT_EQ(bill_usage_split_abc(1000, 5000, 8000, 8100, &u), 0);
    ASSERT_EQ_U64(u.n_read, 1000);
    ASSERT_EQ_U64(u.n_write_1h, 4000);
    ASSERT_EQ_U64(u.n_write_5m, 3000);
    ASSERT_EQ_U64(u.n_uncached, 100);
    /* No hit, no 1h breakpoint: everything up to C is a 5m write. */
    ASSERT_EQ(bill_usage_split_abc(0, 0, 4000, 4000, &u), 0);
    ASSERT_EQ_U64(u.n_write_5m, 4000);
    ASSERT_EQ_U64(u.n_uncached + u.n_read + u.n_write_1h, 0);
    ASSERT_EQ(bill_usage_split_abc(5, 4, 8, 9, &u), PC_ERR_INVAL);
    ASSERT_EQ(bill_usage_split_abc(1, 2, 10, 9, &u), PC_ERR_INVAL);

    bill_pricing_t *p = load_table();
    bill_event_t ev;
    usage_event(&ev, "sonnet", 1700000000000ull);
    ASSERT_EQ(bill_usage_split_abc(1000, 5000, 8000, 8100, &ev.usage), 0);
    ev.usage.n_output = 0;
    ASSERT_EQ(bill_event_price(&ev, p, NULL, 0), 0);
    ASSERT_EQ_U64(ev.cost_nusd[BILL_BUCKET_READ], 300000);       /* 1000 x $0.30/M */
    ASSERT_EQ_U64(ev.cost_nusd[BILL_BUCKET_WRITE_1H], 24000000); /* 4000 x $6/M */
    ASSERT_EQ_U64(ev.cost_nusd[BILL_BUCKET_WRITE_5M], 11250000); /* 3000 x $3.75/M */
    ASSERT_EQ_U64(ev.cost_nusd[BILL_BUCKET_UNCACHED], 300000);   /* 100 x $3/M */
    ASSERT_EQ_U64(bill_event_total_nusd(&ev), 35850000);
    bill_pricing_free(p);
}

PC_TEST(openai_inclusive_counts)
{
    /* OpenAI's example [api-spec §2.2]: prompt_tokens 2006 INCLUDES 1920 cached. */
    bill_usage_t u;
    ASSERT_EQ(bill_usage_from_openai(2006, 1920, 0, 300, &u), 0);
    ASSERT_EQ_U64(u.n_uncached, 86);
    ASSERT_EQ_U64(u.n_read, 1920);
    ASSERT_EQ_U64(u.n_output, 300);
    uint64_t prompt, cached, wr;
    bill_usage_openai_view(&u, &prompt, &cached, &wr);
    ASSERT_EQ_U64(prompt, 2006);
    ASSERT_EQ_U64(cached, 1920);
    ASSERT_EQ_U64(wr, 0);
    ASSERT_EQ(bill_usage_from_openai(100, 90, 20, 0, &u), PC_ERR_INVAL);
    ASSERT_EQ(bill_usage_from_openai(100, 101, 0, 0, &u), PC_ERR_INVAL);

    bill_pricing_t *p = load_table();
    bill_event_t ev;
    usage_event(&ev, "sonnet", 1700000000000ull);
    ASSERT_EQ(bill_usage_from_openai(2006, 1920, 0, 300, &ev.usage), 0);
    ASSERT_EQ(bill_event_price(&ev, p, NULL, 0), 0);
    /* 86 x $3 + 1920 x $0.30 + 300 x $15, per million: never 2006 x $3 + 1920 x $0.30. */
    ASSERT_EQ_U64(bill_event_total_nusd(&ev), 258000 + 576000 + 4500000);
    bill_pricing_free(p);
}

PC_TEST(price_change_at_effective_date)
{
    bill_pricing_t *p = load_table();
    ASSERT_TRUE(p != NULL);
    uint64_t change;
    ASSERT_EQ(bill_parse_time_ms("2025-11-24T00:00:00Z", &change), 0);
    const bill_price_t *pr;
    ASSERT_EQ(bill_pricing_lookup(p, "changing", change - 1, &pr), 0);
    ASSERT_EQ_U64(pr->input_nusd_per_mtok, 15000000000ull);
    ASSERT_EQ(pr->read.num, 1);
    ASSERT_EQ(pr->read.den, 10);
    ASSERT_EQ(bill_pricing_lookup(p, "changing", change, &pr), 0);
    ASSERT_EQ_U64(pr->input_nusd_per_mtok, 5000000000ull);
    ASSERT_EQ(pr->read.num, 1);
    ASSERT_EQ(pr->read.den, 40);
    uint64_t first;
    ASSERT_EQ(bill_parse_time_ms("2025-01-01", &first), 0);
    ASSERT_EQ(bill_pricing_lookup(p, "changing", first - 1, &pr), PC_ERR_NOTFOUND);
    ASSERT_EQ(bill_pricing_lookup(p, "nope", change, &pr), PC_ERR_NOTFOUND);
    ASSERT_EQ(bill_pricing_lookup(p, "haikus", change, &pr), PC_ERR_NOTFOUND);

    /* The same request an instant before and at the change. */
    bill_event_t ev;
    usage_event(&ev, "changing", change - 1);
    ev.usage = (bill_usage_t){.n_uncached = 1000, .n_read = 1000, .n_output = 1000};
    ASSERT_EQ(bill_event_price(&ev, p, NULL, 0), 0);
    ASSERT_EQ_U64(bill_event_total_nusd(&ev), 15000000 + 1500000 + 75000000);
    ev.start_ms = change;
    ASSERT_EQ(bill_event_price(&ev, p, NULL, 0), 0);
    ASSERT_EQ_U64(bill_event_total_nusd(&ev), 5000000 + 125000 + 25000000);

    /* Unknown model: refused, the event keeps its old costs. */
    bill_event_set_str(ev.model, "gpt-nope");
    char err[200];
    ASSERT_EQ(bill_event_price(&ev, p, err, sizeof err), PC_ERR_NOTFOUND);
    ASSERT_TRUE(strstr(err, "gpt-nope") != NULL);
    ASSERT_EQ_U64(bill_event_total_nusd(&ev), 5000000 + 125000 + 25000000);
    bill_pricing_free(p);
}

PC_TEST(huge_token_counts_are_exact)
{
    uint64_t v;
    /* 10^15 tokens at $3.75/MTok: 3.75e9 USD = 3.75e18 nano-USD, exact; the intermediate
     * 10^15 x 3e9 x 5 = 1.5e25 needs more than 64 bits. */
    ASSERT_EQ(bill_cost_tokens(1000000000000000ull, 3000000000ull, (bill_ratio_t){5, 4}, &v), 0);
    ASSERT_EQ_U64(v, 3750000000000000000ull);
    /* 10^15 + 1 tokens: + 3750 nano-USD exactly. */
    ASSERT_EQ(bill_cost_tokens(1000000000000001ull, 3000000000ull, (bill_ratio_t){5, 4}, &v), 0);
    ASSERT_EQ_U64(v, 3750000000000003750ull);
    /* 2^64 - 1 tokens at 1 nano-USD per MTok x 1/10: exact floor/round of (2^64-1)/10^7. */
    ASSERT_EQ(bill_cost_tokens(UINT64_MAX, 1, (bill_ratio_t){1, 10}, &v), 0);
    ASSERT_EQ_U64(v, 1844674407371ull); /* 1844674407370.9551615 -> ...371 */
    /* Results beyond 64 bits and intermediates beyond 128 bits are errors, never wrong. */
    uint64_t keep = 42;
    v = keep;
    ASSERT_EQ(bill_cost_tokens(UINT64_MAX, UINT64_MAX, (bill_ratio_t){1, 1}, &v), PC_ERR_RANGE);
    ASSERT_EQ(bill_cost_tokens(UINT64_MAX, UINT64_MAX, (bill_ratio_t){UINT32_MAX, 1}, &v),
              PC_ERR_RANGE);
    ASSERT_EQ_U64(v, keep);
    /* Storage: 10^6 tokens cached for one hour at $0.50 per MTok-hour = $0.50. */
    ASSERT_EQ(bill_cost_storage(1000000ull * 3600000ull, 500000000ull, &v), 0);
    ASSERT_EQ_U64(v, 500000000ull);
    ASSERT_EQ(bill_cost_storage(1, 500000000ull, &v), 0);
    ASSERT_EQ_U64(v, 0);
}

PC_TEST(exact_parsers)
{
    uint64_t v;
    ASSERT_EQ(bill_parse_usd("3", &v), 0);
    ASSERT_EQ_U64(v, 3000000000ull);
    ASSERT_EQ(bill_parse_usd("0.30", &v), 0);
    ASSERT_EQ_U64(v, 300000000ull);
    ASSERT_EQ(bill_parse_usd("0.000000001", &v), 0);
    ASSERT_EQ_U64(v, 1);
    ASSERT_EQ(bill_parse_usd("0.0000000001", &v), PC_ERR_RANGE);
    ASSERT_EQ(bill_parse_usd("1e3", &v), PC_ERR_FORMAT);
    ASSERT_EQ(bill_parse_usd("-1", &v), PC_ERR_FORMAT);
    ASSERT_EQ(bill_parse_usd("1.2.3", &v), PC_ERR_FORMAT);
    ASSERT_EQ(bill_parse_usd("", &v), PC_ERR_FORMAT);
    ASSERT_EQ(bill_parse_usd("99999999999999999999", &v), PC_ERR_RANGE);
    bill_ratio_t r;
    ASSERT_EQ(bill_parse_ratio("5/4", &r), 0);
    ASSERT_TRUE(r.num == 5 && r.den == 4);
    ASSERT_EQ(bill_parse_ratio("1.25", &r), 0);
    ASSERT_TRUE(r.num == 5 && r.den == 4);
    ASSERT_EQ(bill_parse_ratio("0.1", &r), 0);
    ASSERT_TRUE(r.num == 1 && r.den == 10);
    ASSERT_EQ(bill_parse_ratio("2", &r), 0);
    ASSERT_TRUE(r.num == 2 && r.den == 1);
    ASSERT_EQ(bill_parse_ratio("6/4", &r), 0);
    ASSERT_TRUE(r.num == 3 && r.den == 2);
    ASSERT_EQ(bill_parse_ratio("1/0", &r), PC_ERR_RANGE);
    ASSERT_EQ(bill_parse_ratio("a/2", &r), PC_ERR_FORMAT);
    ASSERT_EQ(bill_parse_time_ms("1970-01-01", &v), 0);
    ASSERT_EQ_U64(v, 0);
    ASSERT_EQ(bill_parse_time_ms("2024-02-29T12:34:56.789Z", &v), 0);
    ASSERT_EQ_U64(v, 1709210096789ull);
    ASSERT_EQ(bill_parse_time_ms("2023-02-29", &v), PC_ERR_FORMAT);
    ASSERT_EQ(bill_parse_time_ms("2024-01-01T00:00:00+02:00", &v), PC_ERR_FORMAT);
    ASSERT_EQ(bill_parse_time_ms("1709210096789", &v), 0);
    ASSERT_EQ_U64(v, 1709210096789ull);
    char buf[32];
    bill_time_str(1709210096789ull, buf);
    ASSERT_STR_EQ(buf, "2024-02-29T12:34:56.789Z");
    bill_day_str(1709210096789ull, buf);
    ASSERT_STR_EQ(buf, "2024-02-29");
    ASSERT_STR_EQ(bill_nusd_str(1, buf), "0.000000001");
    ASSERT_STR_EQ(bill_nusd_str(18446744073709551615ull, buf), "18446744073.709551615");
}

PC_TEST(pricing_table_errors)
{
    const char *bad[] = {
        "models: {m: {input_usd_per_mtok: 3}}\n",                                 /* no output */
        "models: {m: {input_usd_per_mtok: 3, output_usd_per_mtok: 1, foo: 1}}\n", /* unknown */
        "models: {m: {input_usd_per_mtok: 3.0000000001, output_usd_per_mtok: 1}}\n",
        "models: {m: {input_usd_per_mtok: 3, output_usd_per_mtok: 1, cache_read: x}}\n",
        /* the same effective date twice (one string, split over two lines) */
        ("models: {m: [{input_usd_per_mtok: 3, output_usd_per_mtok: 1},"
         " {input_usd_per_mtok: 4, output_usd_per_mtok: 1}]}\n"),
        "currency: EUR\nmodels: {m: {input_usd_per_mtok: 3, output_usd_per_mtok: 1}}\n",
        "models: {}\n",
        "models: [1, 2]\n",
        "prices: {}\n",
        "models: {m: {input_usd_per_mtok: 3, output_usd_per_mtok: 1, effective: yesterday}}\n",
        "models: {m: {input_usd_per_mtok: 3\n",
        "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        bill_pricing_t *p = (bill_pricing_t *)1;
        char err[256] = "";
        int rc = bill_pricing_parse(bad[i], strlen(bad[i]), &p, err, sizeof err);
        if (rc != PC_ERR_FORMAT)
            fprintf(stderr, "  case %zu: rc %d\n", i, rc);
        ASSERT_EQ(rc, PC_ERR_FORMAT);
        ASSERT_TRUE(p == NULL);
        ASSERT_TRUE(strncmp(err, "pricing: ", 9) == 0);
    }
    /* The shipped table loads and prices the demo model. */
    bill_pricing_t *p = NULL;
    char err[256] = "";
    ASSERT_EQ(bill_pricing_load("conf/pricing.yaml", &p, err, sizeof err), 0);
    const bill_price_t *pr;
    ASSERT_EQ(bill_pricing_lookup(p, "kvgw-demo", pc_time_wall_ms(), &pr), 0);
    ASSERT_EQ_U64(pr->input_nusd_per_mtok, 3000000000ull);
    ASSERT_EQ(bill_pricing_lookup(p, "kvgw-bench", pc_time_wall_ms(), &pr), 0);
    ASSERT_EQ(bill_pricing_lookup(p, "claude-sonnet-4-5", pc_time_wall_ms(), &pr), 0);
    bill_pricing_free(p);
    ASSERT_EQ(bill_pricing_load("conf/no-such-pricing.yaml", &p, err, sizeof err), PC_ERR_NOTFOUND);
}

PC_TEST(event_encoding_round_trip)
{
    bill_event_t ev, back;
    usage_event(&ev, "sonnet", 1700000000000ull);
    bill_event_set_str(ev.api_key_id, "key-7");
    ev.status = BILL_STATUS_DISCONNECTED;
    ev.usage = (bill_usage_t){1, 2, 3, 4, 5};
    ev.n_hit_logical = 4;
    ev.n_hit_physical = 3;
    for (int b = 0; b < BILL_BUCKET_STORAGE; b++)
        ev.cost_nusd[b] = 1000u * (unsigned)(b + 1);
    uint8_t buf[BILL_EVENT_MAX_ENCODED];
    size_t n = bill_event_encode(&ev, buf);
    ASSERT_TRUE(n <= sizeof buf);
    ASSERT_EQ(bill_event_decode(buf, n, &back), 0);
    ASSERT_MEM_EQ(&ev, &back, sizeof ev);
    /* Every truncation is malformed, never a different event. */
    for (size_t k = 0; k < n; k++)
        ASSERT_EQ(bill_event_decode(buf, k, &back), PC_ERR_FORMAT);
    /* A storage event. */
    bill_event_init(&ev, BILL_EVENT_STORAGE);
    bill_event_set_str(ev.event_id, "st-1");
    bill_event_set_str(ev.tenant, "acme");
    bill_event_set_str(ev.model, "haiku");
    bill_event_set_str(ev.ns, "0123abcd");
    ev.start_ms = 0;
    ev.end_ms = 60000;
    ev.token_ms = 7200000000ull;
    n = bill_event_encode(&ev, buf);
    ASSERT_EQ(bill_event_decode(buf, n, &back), 0);
    ASSERT_MEM_EQ(&ev, &back, sizeof ev);
    /* Bad fields. */
    char err[200];
    ASSERT_EQ(bill_event_set_str(ev.tenant, "a\nb"), PC_ERR_INVAL);
    ASSERT_STR_EQ(ev.tenant, "acme");
    char longs[100];
    memset(longs, 'x', 99);
    longs[99] = 0;
    ASSERT_EQ(bill_event_set_str(ev.tenant, longs), PC_ERR_INVAL);
    ev.usage.n_read = 1;
    ASSERT_EQ(bill_event_validate(&ev, err, sizeof err), PC_ERR_INVAL);
    usage_event(&ev, "sonnet", 5);
    ev.n_hit_logical = 1;
    ASSERT_EQ(bill_event_validate(&ev, err, sizeof err), PC_ERR_INVAL);
    usage_event(&ev, "sonnet", 5);
    ev.end_ms = 4;
    ASSERT_EQ(bill_event_validate(&ev, err, sizeof err), PC_ERR_INVAL);
    usage_event(&ev, "sonnet", 5);
    ev.request_id[0] = 0;
    ASSERT_EQ(bill_event_validate(&ev, err, sizeof err), PC_ERR_INVAL);
}

PC_TEST(ids_and_crc)
{
    ASSERT_EQ_U64(bill_crc32c(0, "123456789", 9), 0xE3069283u); /* the standard check value */
    ASSERT_EQ_U64(bill_crc32c(bill_crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
    bill_idgen_t a, b;
    ASSERT_EQ(bill_idgen_init(&a), 0);
    ASSERT_EQ(bill_idgen_init(&b), 0);
    char x[BILL_STR_MAX], y[BILL_STR_MAX], z[BILL_STR_MAX];
    bill_idgen_next(&a, x);
    bill_idgen_next(&a, y);
    bill_idgen_next(&b, z);
    ASSERT_TRUE(strcmp(x, y) != 0);
    ASSERT_TRUE(strcmp(x, z) != 0); /* a restart draws a new random half */
    ASSERT_EQ(strlen(x), 33);
}

PC_TEST_MAIN()
