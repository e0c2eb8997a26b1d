/*
 * test_metrics.c — the metrics registry (gateway/metrics.c): the exact exposition text of
 * counters, gauges and histograms with and without labels, escaping, number formatting, the
 * registration rules, the series limit and updates from several threads.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "metrics.h"
#include "pc_test.h"

static const char *DROPPED = "# HELP kvgw_metrics_dropped_total Observations dropped because "
                             "their family reached its series limit.\n"
                             "# TYPE kvgw_metrics_dropped_total counter\n"
                             "kvgw_metrics_dropped_total ";

static char *render(gw_metrics_t *m)
{
    pc_buf_t b = PC_BUF_INIT;
    if (gw_metrics_render(m, &b) != 0 || pc_buf_terminate(&b) != 0)
        return NULL;
    return b.base;
}

PC_TEST(exposition_text_exact)
{
    gw_metrics_t *m = gw_metrics_new();
    ASSERT_TRUE(m != NULL);
    const char *req_labels[] = {"endpoint", "status"};
    gw_metric_t *req =
        gw_metrics_counter(m, "kvgw_requests", "Requests by endpoint and status.", 2, req_labels);
    gw_metric_t *up =
        gw_metrics_gauge(m, "kvgw_workers_up", "Workers answering heartbeats.", 0, NULL);
    const double bounds[] = {0.005, 0.1, 1, 2.5};
    const char *out_labels[] = {"cache"};
    gw_metric_t *dur = gw_metrics_histogram(m, "kvgw_request_duration_seconds", "Request duration.",
                                            1, out_labels, bounds, 4);
    gw_metric_t *bytes = gw_metrics_counter(m, "kvgw_body_bytes_total", "Body bytes.", 0, NULL);
    ASSERT_TRUE(req != NULL && up != NULL && dur != NULL && bytes != NULL);

    const char *v1[] = {"messages", "200"}, *v2[] = {"chat", "400"};
    ASSERT_EQ(gw_metric_add(req, v1, 1), 0);
    ASSERT_EQ(gw_metric_add(req, v2, 1), 0);
    ASSERT_EQ(gw_metric_add(req, v1, 2), 0);
    ASSERT_EQ(gw_metric_set(up, NULL, 3), 0);
    ASSERT_EQ(gw_metric_add(up, NULL, -1), 0);
    const char *hit[] = {"hit"}, *miss[] = {"miss"};
    ASSERT_EQ(gw_metric_observe(dur, hit, 0.005), 0); /* le is inclusive */
    ASSERT_EQ(gw_metric_observe(dur, hit, 0.05), 0);
    ASSERT_EQ(gw_metric_observe(dur, hit, 2), 0);
    ASSERT_EQ(gw_metric_observe(dur, hit, 30), 0);
    ASSERT_EQ(gw_metric_observe(dur, miss, 0.25), 0);
    ASSERT_EQ(gw_metric_add(bytes, NULL, 1536), 0);

    char *text = render(m);
    pc_buf_t want = PC_BUF_INIT;
    pc_buf_append_cstr(&want,
                       "# HELP kvgw_requests_total Requests by endpoint and status.\n"
                       "# TYPE kvgw_requests_total counter\n"
                       "kvgw_requests_total{endpoint=\"messages\",status=\"200\"} 3\n"
                       "kvgw_requests_total{endpoint=\"chat\",status=\"400\"} 1\n"
                       "# HELP kvgw_workers_up Workers answering heartbeats.\n"
                       "# TYPE kvgw_workers_up gauge\n"
                       "kvgw_workers_up 2\n"
                       "# HELP kvgw_request_duration_seconds Request duration.\n"
                       "# TYPE kvgw_request_duration_seconds histogram\n"
                       "kvgw_request_duration_seconds_bucket{cache=\"hit\",le=\"0.005\"} 1\n"
                       "kvgw_request_duration_seconds_bucket{cache=\"hit\",le=\"0.1\"} 2\n"
                       "kvgw_request_duration_seconds_bucket{cache=\"hit\",le=\"1\"} 2\n"
                       "kvgw_request_duration_seconds_bucket{cache=\"hit\",le=\"2.5\"} 3\n"
                       "kvgw_request_duration_seconds_bucket{cache=\"hit\",le=\"+Inf\"} 4\n"
                       "kvgw_request_duration_seconds_sum{cache=\"hit\"} 32.055\n"
                       "kvgw_request_duration_seconds_count{cache=\"hit\"} 4\n"
                       "kvgw_request_duration_seconds_bucket{cache=\"miss\",le=\"0.005\"} 0\n"
                       "kvgw_request_duration_seconds_bucket{cache=\"miss\",le=\"0.1\"} 0\n"
                       "kvgw_request_duration_seconds_bucket{cache=\"miss\",le=\"1\"} 1\n"
                       "kvgw_request_duration_seconds_bucket{cache=\"miss\",le=\"2.5\"} 1\n"
                       "kvgw_request_duration_seconds_bucket{cache=\"miss\",le=\"+Inf\"} 1\n"
                       "kvgw_request_duration_seconds_sum{cache=\"miss\"} 0.25\n"
                       "kvgw_request_duration_seconds_count{cache=\"miss\"} 1\n"
                       "# HELP kvgw_body_bytes_total Body bytes.\n"
                       "# TYPE kvgw_body_bytes_total counter\n"
                       "kvgw_body_bytes_total 1536\n");
    pc_buf_append_cstr(&want, DROPPED);
    pc_buf_append_cstr(&want, "0\n");
    pc_buf_terminate(&want);
    ASSERT_STR_EQ(text, want.base);
    ASSERT_NEAR(gw_metric_value(req, v1), 3, 0);
    unsigned long long count;
    double sum;
    ASSERT_EQ(gw_metric_histogram_stats(dur, hit, &count, &sum), 0);
    ASSERT_EQ(count, 4);
    ASSERT_NEAR(sum, 32.055, 1e-12);
    pc_free(text);
    pc_buf_free(&want);
    gw_metrics_free(m);
}

PC_TEST(empty_families_and_escaping)
{
    gw_metrics_t *m = gw_metrics_new();
    const char *l[] = {"path"};
    gw_metric_t *c = gw_metrics_counter(m, "kvgw_x", "Help with \\ and\nnewline \"q\".", 1, l);
    const double b[] = {1};
    gw_metric_t *h = gw_metrics_histogram(m, "kvgw_h_seconds", "H.", 0, NULL, b, 1);
    ASSERT_TRUE(c != NULL && h != NULL);
    char *text = render(m);
    pc_buf_t want = PC_BUF_INIT;
    /* A labelled family without series: HELP and TYPE only; without labels: zero samples. */
    pc_buf_append_cstr(&want, "# HELP kvgw_x_total Help with \\\\ and\\nnewline \"q\".\n"
                              "# TYPE kvgw_x_total counter\n"
                              "# HELP kvgw_h_seconds H.\n"
                              "# TYPE kvgw_h_seconds histogram\n"
                              "kvgw_h_seconds_bucket{le=\"1\"} 0\n"
                              "kvgw_h_seconds_bucket{le=\"+Inf\"} 0\n"
                              "kvgw_h_seconds_sum 0\n"
                              "kvgw_h_seconds_count 0\n");
    pc_buf_append_cstr(&want, DROPPED);
    pc_buf_append_cstr(&want, "0\n");
    pc_buf_terminate(&want);
    ASSERT_STR_EQ(text, want.base);
    pc_free(text);
    const char *v[] = {"a\"b\\c\nd"};
    ASSERT_EQ(gw_metric_add(c, v, 0.5), 0);
    ASSERT_EQ(gw_metric_add(c, v, 1e-7), 0);
    text = render(m);
    ASSERT_TRUE(strstr(text, "kvgw_x_total{path=\"a\\\"b\\\\c\\nd\"} 0.5000001\n") != NULL);
    pc_free(text);
    pc_buf_free(&want);
    gw_metrics_free(m);
}

PC_TEST(numbers)
{
    gw_metrics_t *m = gw_metrics_new();
    gw_metric_t *g = gw_metrics_gauge(m, "g", "G.", 0, NULL);
    struct {
        double v;
        const char *text;
    } cases[] = {{0, "g 0\n"},
                 {-3, "g -3\n"},
                 {1e15, "g 1000000000000000\n"},
                 {0.1, "g 0.1\n"},
                 {1.0 / 3, "g 0.33333333333333331\n"},
                 {1e300, "g 1e+300\n"},
                 {INFINITY, "g +Inf\n"},
                 {-INFINITY, "g -Inf\n"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ASSERT_EQ(gw_metric_set(g, NULL, cases[i].v), 0);
        char *text = render(m);
        if (strstr(text, cases[i].text) == NULL)
            fprintf(stderr, "  %s", text);
        ASSERT_TRUE(strstr(text, cases[i].text) != NULL);
        pc_free(text);
    }
    gw_metrics_free(m);
}

PC_TEST(registration_rules)
{
    gw_metrics_t *m = gw_metrics_new();
    const char *ok[] = {"a"}, *dup[] = {"a", "a"}, *bad[] = {"1a"}, *res[] = {"__x"},
               *le[] = {"le"};
    const double b[] = {1, 2}, unsorted[] = {2, 1}, nan_b[] = {NAN}, inf_b[] = {1, INFINITY};
    ASSERT_TRUE(gw_metrics_counter(m, "kvgw_a", "A.", 1, ok) != NULL);
    ASSERT_TRUE(gw_metrics_counter(m, "kvgw_a_total", "A again.", 0, NULL) == NULL);
    ASSERT_TRUE(gw_metrics_gauge(m, "kvgw_a_total", "A as a gauge.", 0, NULL) == NULL);
    ASSERT_TRUE(gw_metrics_gauge(m, "9bad", "B.", 0, NULL) == NULL);
    ASSERT_TRUE(gw_metrics_gauge(m, "bad-name", "B.", 0, NULL) == NULL);
    ASSERT_TRUE(gw_metrics_gauge(m, "", "B.", 0, NULL) == NULL);
    ASSERT_TRUE(gw_metrics_gauge(m, "__reserved", "B.", 0, NULL) == NULL);
    ASSERT_TRUE(gw_metrics_gauge(m, "kvgw_ok:colon", "B.", 0, NULL) != NULL);
    ASSERT_TRUE(gw_metrics_gauge(m, "kvgw_b", "B.", 2, dup) == NULL);
    ASSERT_TRUE(gw_metrics_gauge(m, "kvgw_b", "B.", 1, bad) == NULL);
    ASSERT_TRUE(gw_metrics_gauge(m, "kvgw_b", "B.", 1, res) == NULL);
    ASSERT_TRUE(gw_metrics_gauge(m, "kvgw_b", "B.", 1, le) != NULL); /* le only on histograms */
    ASSERT_TRUE(gw_metrics_histogram(m, "kvgw_h", "H.", 1, le, b, 2) == NULL);
    ASSERT_TRUE(gw_metrics_histogram(m, "kvgw_h", "H.", 0, NULL, unsorted, 2) == NULL);
    ASSERT_TRUE(gw_metrics_histogram(m, "kvgw_h", "H.", 0, NULL, nan_b, 1) == NULL);
    ASSERT_TRUE(gw_metrics_histogram(m, "kvgw_h", "H.", 0, NULL, inf_b, 2) == NULL);
    ASSERT_TRUE(gw_metrics_histogram(m, "kvgw_h", "H.", 0, NULL, b, 0) == NULL);
    ASSERT_TRUE(gw_metrics_histogram(m, "kvgw_metrics_dropped", "H.", 0, NULL, b, 2) == NULL);
    gw_metric_t *h = gw_metrics_histogram(m, "kvgw_h", "H.", 0, NULL, b, 2);
    ASSERT_TRUE(h != NULL);
    gw_metric_t *c = gw_metrics_counter(m, "kvgw_c", "C.", 1, ok);
    gw_metric_t *g = gw_metrics_gauge(m, "kvgw_g", "G.", 0, NULL);
    /* Wrong updates change nothing. */
    const char *v[] = {"x"}, *nullv[] = {NULL};
    ASSERT_EQ(gw_metric_add(c, v, -1), PC_ERR_INVAL);
    ASSERT_EQ(gw_metric_add(c, v, NAN), PC_ERR_INVAL);
    ASSERT_EQ(gw_metric_set(c, v, 1), PC_ERR_INVAL);
    ASSERT_EQ(gw_metric_observe(c, v, 1), PC_ERR_INVAL);
    ASSERT_EQ(gw_metric_add(c, NULL, 1), PC_ERR_INVAL);
    ASSERT_EQ(gw_metric_add(c, nullv, 1), PC_ERR_INVAL);
    ASSERT_EQ(gw_metric_add(h, NULL, 1), PC_ERR_INVAL);
    ASSERT_EQ(gw_metric_observe(g, NULL, 1), PC_ERR_INVAL);
    char *text = render(m);
    ASSERT_TRUE(strstr(text, "kvgw_c_total{") == NULL);
    ASSERT_TRUE(strstr(text, "kvgw_h_count 0\n") != NULL);
    pc_free(text);
    gw_metrics_free(m);
    gw_metrics_free(NULL);
}

PC_TEST(series_limit_drops_and_counts)
{
    gw_metrics_t *m = gw_metrics_new();
    const char *l[] = {"id"};
    gw_metric_t *c = gw_metrics_counter(m, "kvgw_ids", "Ids.", 1, l);
    char id[32];
    const char *v[] = {id};
    for (int i = 0; i < GW_METRICS_MAX_SERIES; i++) {
        snprintf(id, sizeof id, "%d", i);
        ASSERT_EQ(gw_metric_add(c, v, 1), 0);
    }
    snprintf(id, sizeof id, "one-more");
    ASSERT_EQ(gw_metric_add(c, v, 1), PC_ERR_RANGE);
    snprintf(id, sizeof id, "17");
    ASSERT_EQ(gw_metric_add(c, v, 1), 0); /* existing series still update */
    ASSERT_NEAR(gw_metric_value(c, v), 2, 0);
    char *text = render(m);
    ASSERT_TRUE(strstr(text, "kvgw_metrics_dropped_total 1\n") != NULL);
    ASSERT_TRUE(strstr(text, "one-more") == NULL);
    ASSERT_TRUE(strstr(text, "kvgw_ids_total{id=\"9999\"} 1\n") != NULL);
    pc_free(text);
    gw_metrics_free(m);
}

typedef struct thr {
    gw_metric_t *c, *h;
    int id;
} thr_t;

static void *hammer(void *arg)
{
    thr_t *t = arg;
    const char *v[] = {t->id % 2 ? "odd" : "even"};
    for (int i = 0; i < 20000; i++) {
        gw_metric_add(t->c, v, 1);
        gw_metric_observe(t->h, NULL, (double)(i % 4));
    }
    return NULL;
}

PC_TEST(threads_update_while_rendering)
{
    gw_metrics_t *m = gw_metrics_new();
    const char *l[] = {"kind"};
    const double b[] = {0.5, 1.5, 2.5};
    thr_t t[4];
    pthread_t th[4];
    gw_metric_t *c = gw_metrics_counter(m, "kvgw_n", "N.", 1, l);
    gw_metric_t *h = gw_metrics_histogram(m, "kvgw_v", "V.", 0, NULL, b, 3);
    for (int i = 0; i < 4; i++) {
        t[i] = (thr_t){c, h, i};
        pthread_create(&th[i], NULL, hammer, &t[i]);
    }
    for (int i = 0; i < 20; i++)
        pc_free(render(m));
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    const char *odd[] = {"odd"}, *even[] = {"even"};
    ASSERT_NEAR(gw_metric_value(c, odd), 40000, 0);
    ASSERT_NEAR(gw_metric_value(c, even), 40000, 0);
    char *text = render(m);
    ASSERT_TRUE(strstr(text, "kvgw_v_bucket{le=\"0.5\"} 20000\n") != NULL);
    ASSERT_TRUE(strstr(text, "kvgw_v_bucket{le=\"1.5\"} 40000\n") != NULL);
    ASSERT_TRUE(strstr(text, "kvgw_v_bucket{le=\"2.5\"} 60000\n") != NULL);
    ASSERT_TRUE(strstr(text, "kvgw_v_bucket{le=\"+Inf\"} 80000\n") != NULL);
    ASSERT_TRUE(strstr(text, "kvgw_v_sum 120000\n") != NULL);
    ASSERT_TRUE(strstr(text, "kvgw_v_count 80000\n") != NULL);
    pc_free(text);
    gw_metrics_free(m);
}

PC_TEST_MAIN()
