/*
 * metrics.h — the gateway's Prometheus metrics registry.
 *
 * Families (counters, gauges, histograms) are registered up front, each with a fixed list of
 * label names; every observation gives the values of those labels in the same order, and the
 * first observation of a new combination creates its series. gw_metrics_render writes the
 * whole registry in the Prometheus text exposition format 0.0.4:
 *
 *   # HELP kvgw_requests_total Requests by endpoint and status.
 *   # TYPE kvgw_requests_total counter
 *   kvgw_requests_total{endpoint="messages",status="200"} 3
 *   # HELP kvgw_request_duration_seconds Request duration.
 *   # TYPE kvgw_request_duration_seconds histogram
 *   kvgw_request_duration_seconds_bucket{le="0.1"} 1
 *   kvgw_request_duration_seconds_bucket{le="+Inf"} 2
 *   kvgw_request_duration_seconds_sum 0.35
 *   kvgw_request_duration_seconds_count 2
 *
 * Counter names always end in _total (added when missing). Families render in registration
 * order, series in creation order. A family without labels renders its zero sample before the
 * first observation; a labelled family renders only its HELP and TYPE lines until then. Names
 * follow Prometheus' rules ([a-zA-Z_:][a-zA-Z0-9_:]* for metrics, [a-zA-Z_][a-zA-Z0-9_]* for
 * labels, no leading "__", no "le" label on a histogram); values are in base units (seconds,
 * bytes) by the caller's choice of name.
 *
 * Cardinality: a family holds at most GW_METRICS_MAX_SERIES series; observations of further
 * label combinations are dropped (PC_ERR_RANGE) and counted in kvgw_metrics_dropped_total,
 * which every registry renders last.
 *
 * Threads: updates (add/set/observe) may come from any thread (one mutex per registry, held
 * for a hash lookup and an addition); registration and render too, but registration is meant
 * for startup. gw_metric_t pointers stay valid until gw_metrics_free.
 */
#ifndef GW_METRICS_H
#define GW_METRICS_H

#include <stddef.h>

#include "pc_buf.h"

#define GW_METRICS_MAX_SERIES 10000
#define GW_METRICS_MAX_LABELS 16

typedef struct gw_metrics gw_metrics_t;
typedef struct gw_metric gw_metric_t;

/* A new empty registry, or NULL when out of memory. */
gw_metrics_t *gw_metrics_new(void);

/* Frees the registry and every family in it; NULL is a no-op. */
void gw_metrics_free(gw_metrics_t *m);

/* Registers a family. name and help are copied; label_names (n_labels of them, at most
 * GW_METRICS_MAX_LABELS) too. Returns the family, or NULL when a name is invalid or already
 * registered, the bounds are not strictly increasing finite numbers (histograms; +Inf is
 * implied and must not be given), or memory ran out; nothing is registered then. */
gw_metric_t *gw_metrics_counter(gw_metrics_t *m, const char *name, const char *help,
                                size_t n_labels, const char *const *label_names);
gw_metric_t *gw_metrics_gauge(gw_metrics_t *m, const char *name, const char *help, size_t n_labels,
                              const char *const *label_names);
gw_metric_t *gw_metrics_histogram(gw_metrics_t *m, const char *name, const char *help,
                                  size_t n_labels, const char *const *label_names,
                                  const double *bounds, size_t n_bounds);

/* Updates one series; label_values has the family's n_labels values (NULL when it has none;
 * copied on first use). Return 0, or: PC_ERR_INVAL (a NULL value, a NaN, a negative add to a
 * counter, the wrong kind of update for the family: add on histograms, set on counters,
 * observe on counters and gauges), PC_ERR_RANGE (series limit reached: dropped) or
 * PC_ERR_NOMEM. On error nothing changes. */
int gw_metric_add(gw_metric_t *f, const char *const *label_values, double v);
int gw_metric_set(gw_metric_t *f, const char *const *label_values, double v);
int gw_metric_observe(gw_metric_t *f, const char *const *label_values, double v);

/* The current value of a counter or gauge series (0 when it does not exist yet), and a
 * histogram series' count and sum. For tests and the admin API. */
double gw_metric_value(gw_metric_t *f, const char *const *label_values);
int gw_metric_histogram_stats(gw_metric_t *f, const char *const *label_values,
                              unsigned long long *count, double *sum);

/* Appends the exposition text of every family to out (Content-Type
 * "text/plain; version=0.0.4; charset=utf-8"). Returns 0 or PC_ERR_NOMEM (out may then hold a
 * partial text). */
int gw_metrics_render(gw_metrics_t *m, pc_buf_t *out);

#define GW_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

#endif
