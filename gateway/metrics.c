/*
 * metrics.c — the Prometheus registry: families in a list, series in a per-family pc_strmap
 * (label values -> series) plus a creation-order list for rendering, all under one mutex.
 */
#include "metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

enum { MT_COUNTER, MT_GAUGE, MT_HISTOGRAM };

typedef struct series {
    struct series *onext; /* creation order */
    char **values;        /* [n_labels], one allocation with the strings */
    double value;         /* counter or gauge; histogram sum */
    uint64_t count;       /* histogram */
    uint64_t *buckets;    /* [n_bounds] non-cumulative counts of v <= bound[i] (above bound[i-1]) */
} series_t;

struct gw_metric {
    gw_metrics_t *m;
    gw_metric_t *next;
    int type;
    char *name; /* counters: ends in _total */
    char *help;
    size_t n_labels;
    char **labels;
    double *bounds;
    size_t n_bounds;
    pc_strmap_t index; /* values_key() -> series_t * */
    size_t n_series;
    series_t *first, *last;
};

struct gw_metrics {
    pthread_mutex_t mu;
    gw_metric_t *head, *tail;
    uint64_t dropped;
};

gw_metrics_t *gw_metrics_new(void)
{
    gw_metrics_t *m = pc_calloc(1, sizeof *m);
    if (m == NULL)
        return NULL;
    pthread_mutex_init(&m->mu, NULL);
    return m;
}

static void series_free(series_t *s)
{
    pc_free(s->values);
    pc_free(s->buckets);
    pc_free(s);
}

static void family_free(gw_metric_t *f)
{
    if (f == NULL)
        return;
    for (series_t *s = f->first, *n; s != NULL; s = n) {
        n = s->onext;
        series_free(s);
    }
    pc_strmap_free(&f->index);
    pc_free(f->name);
    pc_free(f->help);
    if (f->labels != NULL)
        for (size_t i = 0; i < f->n_labels; i++)
            pc_free(f->labels[i]);
    pc_free(f->labels);
    pc_free(f->bounds);
    pc_free(f);
}

void gw_metrics_free(gw_metrics_t *m)
{
    if (m == NULL)
        return;
    for (gw_metric_t *f = m->head, *n; f != NULL; f = n) {
        n = f->next;
        family_free(f);
    }
    pthread_mutex_destroy(&m->mu);
    pc_free(m);
}

static bool name_ok(const char *s, bool colon)
{
    if (s == NULL || *s == '\0')
        return false;
    for (size_t i = 0; s[i]; i++) {
        char ch = s[i];
        bool alpha = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' ||
                     (colon && ch == ':');
        if (!alpha && !(i > 0 && ch >= '0' && ch <= '9'))
            return false;
    }
    return true;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static gw_metric_t *family_add(gw_metrics_t *m, int type, const char *name, const char *help,
                               size_t n_labels, const char *const *label_names,
                               const double *bounds, size_t n_bounds)
{
    if (m == NULL || !name_ok(name, true) || strncmp(name, "__", 2) == 0 || help == NULL ||
        strncmp(name, "kvgw_metrics_dropped", 20) == 0 || n_labels > GW_METRICS_MAX_LABELS ||
        (n_labels > 0 && label_names == NULL))
        return NULL;
    for (size_t i = 0; i < n_labels; i++) {
        if (!name_ok(label_names[i], false) || strncmp(label_names[i], "__", 2) == 0)
            return NULL;
        if (type == MT_HISTOGRAM && strcmp(label_names[i], "le") == 0)
            return NULL;
        for (size_t j = 0; j < i; j++)
            if (strcmp(label_names[i], label_names[j]) == 0)
                return NULL;
    }
    if (type == MT_HISTOGRAM) {
        if (n_bounds == 0 || bounds == NULL)
            return NULL;
        for (size_t i = 0; i < n_bounds; i++)
            if (!isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1])))
                return NULL;
    }
    gw_metric_t *f = pc_calloc(1, sizeof *f);
    if (f == NULL)
        return NULL;
    f->m = m;
    f->type = type;
    pc_buf_t nb = PC_BUF_INIT;
    int rc = pc_buf_append_cstr(&nb, name);
    if (type == MT_COUNTER && !ends_with(name, "_total"))
        rc |= pc_buf_append_cstr(&nb, "_total");
    rc |= pc_buf_terminate(&nb);
    f->name = nb.base;
    f->help = pc_strdup(help);
    f->n_labels = n_labels;
    f->labels = n_labels > 0 ? pc_calloc(n_labels, sizeof *f->labels) : NULL;
    if (rc != 0 || f->help == NULL || (n_labels > 0 && f->labels == NULL))
        goto fail;
    for (size_t i = 0; i < n_labels; i++)
        if ((f->labels[i] = pc_strdup(label_names[i])) == NULL)
            goto fail;
    if (type == MT_HISTOGRAM) {
        f->bounds = pc_malloc(n_bounds * sizeof *f->bounds);
        if (f->bounds == NULL)
            goto fail;
        memcpy(f->bounds, bounds, n_bounds * sizeof *bounds);
        f->n_bounds = n_bounds;
    }
    pthread_mutex_lock(&m->mu);
    for (gw_metric_t *g = m->head; g != NULL; g = g->next) {
        if (strcmp(g->name, f->name) == 0) {
            pthread_mutex_unlock(&m->mu);
            goto fail;
        }
    }
    if (m->tail != NULL)
        m->tail->next = f;
    else
        m->head = f;
    m->tail = f;
    pthread_mutex_unlock(&m->mu);
    return f;
fail:
    family_free(f);
    return NULL;
}

gw_metric_t *gw_metrics_counter(gw_metrics_t *m, const char *name, const char *help,
                                size_t n_labels, const char *const *label_names)
{
    return family_add(m, MT_COUNTER, name, help, n_labels, label_names, NULL, 0);
}

gw_metric_t *gw_metrics_gauge(gw_metrics_t *m, const char *name, const char *help, size_t n_labels,
                              const char *const *label_names)
{
    return family_add(m, MT_GAUGE, name, help, n_labels, label_names, NULL, 0);
}

gw_metric_t *gw_metrics_histogram(gw_metrics_t *m, const char *name, const char *help,
                                  size_t n_labels, const char *const *label_names,
                                  const double *bounds, size_t n_bounds)
{
    return family_add(m, MT_HISTOGRAM, name, help, n_labels, label_names, bounds, n_bounds);
}

enum { KEY_STACK = 256 };

/* The index key of a series: each label value followed by a NUL byte (values hold none), so
 * ("ab", "c") and ("a", "bc") differ. Written into stack (KEY_STACK bytes) when it fits, else
 * into a block from pc_malloc that the caller frees when the result is not stack; NULL when
 * that allocation fails. */
static char *values_key(const gw_metric_t *f, const char *const *values, char *stack, size_t *len)
{
    size_t n = 0;
    for (size_t i = 0; i < f->n_labels; i++)
        n += strlen(values[i]) + 1;
    char *k = n <= KEY_STACK ? stack : pc_malloc(n);
    if (k == NULL)
        return NULL;
    *len = 0;
    for (size_t i = 0; i < f->n_labels; i++) {
        size_t l = strlen(values[i]) + 1;
        memcpy(k + *len, values[i], l);
        *len += l;
    }
    return k;
}

/* The series for values, or NULL (also when the key did not fit in memory). */
static series_t *series_find(const gw_metric_t *f, const char *const *values)
{
    char stack[KEY_STACK];
    size_t len;
    uint64_t s = 0;
    char *k = values_key(f, values, stack, &len);
    if (k == NULL)
        return NULL;
    bool found = pc_strmap_get(&f->index, k, len, &s);
    if (k != stack)
        pc_free(k);
    return found ? (series_t *)(uintptr_t)s : NULL;
}

/* A new series for values with zeroed figures, not yet indexed; NULL without memory. */
static series_t *series_new(const gw_metric_t *f, const char *const *values)
{
    size_t bytes = f->n_labels * sizeof(char *);
    for (size_t i = 0; i < f->n_labels; i++)
        bytes += strlen(values[i]) + 1;
    series_t *s = pc_calloc(1, sizeof *s);
    char **v = bytes > 0 ? pc_malloc(bytes) : NULL;
    uint64_t *b = f->n_bounds > 0 ? pc_calloc(f->n_bounds, sizeof *b) : NULL;
    if (s == NULL || (bytes > 0 && v == NULL) || (f->n_bounds > 0 && b == NULL)) {
        pc_free(s);
        pc_free(v);
        pc_free(b);
        return NULL;
    }
    char *str = (char *)(v + f->n_labels);
    for (size_t i = 0; i < f->n_labels; i++) {
        size_t l = strlen(values[i]) + 1;
        memcpy(str, values[i], l);
        v[i] = str;
        str += l;
    }
    s->values = v;
    s->buckets = b;
    return s;
}

/* The series for values, created when missing. Called with the mutex held. */
static int series_get(gw_metric_t *f, const char *const *values, series_t **out)
{
    for (size_t i = 0; i < f->n_labels; i++)
        if (values == NULL || values[i] == NULL)
            return PC_ERR_INVAL;
    char stack[KEY_STACK];
    size_t len;
    char *k = values_key(f, values, stack, &len);
    if (k == NULL)
        return PC_ERR_NOMEM;
    uint64_t found;
    int rc = 0;
    series_t *s = NULL;
    if (pc_strmap_get(&f->index, k, len, &found)) {
        s = (series_t *)(uintptr_t)found;
    } else if (f->n_series >= GW_METRICS_MAX_SERIES) {
        f->m->dropped++;
        rc = PC_ERR_RANGE;
    } else if ((s = series_new(f, values)) == NULL) {
        rc = PC_ERR_NOMEM;
    } else if ((rc = pc_strmap_insert(&f->index, k, len, (uintptr_t)s, NULL)) != 0) {
        series_free(s);
    } else {
        if (f->last != NULL)
            f->last->onext = s;
        else
            f->first = s;
        f->last = s;
        f->n_series++;
    }
    if (k != stack)
        pc_free(k);
    *out = rc == 0 ? s : NULL;
    return rc;
}

static int update(gw_metric_t *f, const char *const *values, double v, int op)
{
    if (f == NULL || isnan(v))
        return PC_ERR_INVAL;
    switch (op) {
    case 'a':
        if (f->type == MT_HISTOGRAM || (f->type == MT_COUNTER && v < 0))
            return PC_ERR_INVAL;
        break;
    case 's':
        if (f->type != MT_GAUGE)
            return PC_ERR_INVAL;
        break;
    default:
        if (f->type != MT_HISTOGRAM)
            return PC_ERR_INVAL;
        break;
    }
    pthread_mutex_lock(&f->m->mu);
    series_t *s;
    int rc = series_get(f, values, &s);
    if (rc == 0) {
        if (op == 'a') {
            s->value += v;
        } else if (op == 's') {
            s->value = v;
        } else {
            size_t i = 0;
            while (i < f->n_bounds && v > f->bounds[i])
                i++;
            if (i < f->n_bounds)
                s->buckets[i]++;
            s->count++;
            s->value += v;
        }
    }
    pthread_mutex_unlock(&f->m->mu);
    return rc;
}

int gw_metric_add(gw_metric_t *f, const char *const *label_values, double v)
{
    return update(f, label_values, v, 'a');
}

int gw_metric_set(gw_metric_t *f, const char *const *label_values, double v)
{
    return update(f, label_values, v, 's');
}

int gw_metric_observe(gw_metric_t *f, const char *const *label_values, double v)
{
    return update(f, label_values, v, 'o');
}

double gw_metric_value(gw_metric_t *f, const char *const *label_values)
{
    if (f == NULL)
        return 0;
    for (size_t i = 0; i < f->n_labels; i++)
        if (label_values == NULL || label_values[i] == NULL)
            return 0;
    pthread_mutex_lock(&f->m->mu);
    series_t *s = series_find(f, label_values);
    double v = s != NULL ? s->value : 0;
    pthread_mutex_unlock(&f->m->mu);
    return v;
}

int gw_metric_histogram_stats(gw_metric_t *f, const char *const *label_values,
                              unsigned long long *count, double *sum)
{
    if (f == NULL || f->type != MT_HISTOGRAM)
        return PC_ERR_INVAL;
    for (size_t i = 0; i < f->n_labels; i++)
        if (label_values == NULL || label_values[i] == NULL)
            return PC_ERR_INVAL;
    pthread_mutex_lock(&f->m->mu);
    series_t *s = series_find(f, label_values);
    *count = s != NULL ? s->count : 0;
    *sum = s != NULL ? s->value : 0;
    pthread_mutex_unlock(&f->m->mu);
    return s != NULL ? 0 : PC_ERR_NOTFOUND;
}

/* ------------------------------------------------------------------------------------------ */
/* Rendering */

/* A sample value: integers without a fraction, others with enough digits to round-trip,
 * and Prometheus' spellings of the infinities. */
static int put_number(pc_buf_t *out, double v)
{
    if (isnan(v))
        return pc_buf_append_cstr(out, "NaN");
    if (isinf(v))
        return pc_buf_append_cstr(out, v > 0 ? "+Inf" : "-Inf");
    if (v == floor(v) && fabs(v) < 9007199254740992.0)
        return pc_buf_printf(out, "%.0f", v);
    char tmp[40];
    snprintf(tmp, sizeof tmp, "%.15g", v);
    if (strtod(tmp, NULL) != v)
        snprintf(tmp, sizeof tmp, "%.17g", v);
    return pc_buf_append_cstr(out, tmp);
}

static int put_escaped(pc_buf_t *out, const char *s, bool quote)
{
    int rc = 0;
    for (const char *p = s; *p; p++) {
        if (*p == '\\')
            rc |= pc_buf_append(out, "\\\\", 2);
        else if (*p == '\n')
            rc |= pc_buf_append(out, "\\n", 2);
        else if (quote && *p == '"')
            rc |= pc_buf_append(out, "\\\"", 2);
        else
            rc |= pc_buf_append(out, p, 1);
    }
    return rc;
}

/* "{a="x",b="y"}" with an optional trailing le label; nothing when there are no labels. */
static int put_labels(pc_buf_t *out, const gw_metric_t *f, const series_t *s, const char *le)
{
    if (f->n_labels == 0 && le == NULL)
        return 0;
    int rc = pc_buf_append(out, "{", 1);
    for (size_t i = 0; i < f->n_labels; i++) {
        if (i > 0)
            rc |= pc_buf_append(out, ",", 1);
        rc |= pc_buf_printf(out, "%s=\"", f->labels[i]);
        rc |= put_escaped(out, s != NULL ? s->values[i] : "", true);
        rc |= pc_buf_append(out, "\"", 1);
    }
    if (le != NULL)
        rc |= pc_buf_printf(out, "%sle=\"%s\"", f->n_labels > 0 ? "," : "", le);
    rc |= pc_buf_append(out, "}", 1);
    return rc;
}

static int put_series(pc_buf_t *out, const gw_metric_t *f, const series_t *s)
{
    static const series_t zero;
    const series_t *v = s != NULL ? s : &zero;
    int rc = 0;
    if (f->type != MT_HISTOGRAM) {
        rc |= pc_buf_append_cstr(out, f->name);
        rc |= put_labels(out, f, s, NULL);
        rc |= pc_buf_append(out, " ", 1);
        rc |= put_number(out, v->value);
        rc |= pc_buf_append(out, "\n", 1);
        return rc;
    }
    uint64_t cum = 0;
    for (size_t i = 0; i <= f->n_bounds; i++) {
        char le[40];
        if (i < f->n_bounds) {
            cum += v->buckets != NULL ? v->buckets[i] : 0;
            pc_buf_t lb = PC_BUF_INIT;
            put_number(&lb, f->bounds[i]);
            snprintf(le, sizeof le, "%.*s", (int)lb.len, lb.base != NULL ? lb.base : "");
            pc_buf_free(&lb);
        } else {
            cum = v->count;
            snprintf(le, sizeof le, "+Inf");
        }
        rc |= pc_buf_printf(out, "%s_bucket", f->name);
        rc |= put_labels(out, f, s, le);
        rc |= pc_buf_printf(out, " %llu\n", (unsigned long long)cum);
    }
    rc |= pc_buf_printf(out, "%s_sum", f->name);
    rc |= put_labels(out, f, s, NULL);
    rc |= pc_buf_append(out, " ", 1);
    rc |= put_number(out, v->value);
    rc |= pc_buf_printf(out, "\n%s_count", f->name);
    rc |= put_labels(out, f, s, NULL);
    rc |= pc_buf_printf(out, " %llu\n", (unsigned long long)v->count);
    return rc;
}

int gw_metrics_render(gw_metrics_t *m, pc_buf_t *out)
{
    static const char *type_names[] = {"counter", "gauge", "histogram"};
    int rc = 0;
    pthread_mutex_lock(&m->mu);
    for (const gw_metric_t *f = m->head; f != NULL; f = f->next) {
        rc |= pc_buf_printf(out, "# HELP %s ", f->name);
        rc |= put_escaped(out, f->help, false);
        rc |= pc_buf_printf(out, "\n# TYPE %s %s\n", f->name, type_names[f->type]);
        if (f->n_labels == 0 && f->first == NULL)
            rc |= put_series(out, f, NULL);
        for (const series_t *s = f->first; s != NULL; s = s->onext)
            rc |= put_series(out, f, s);
    }
    rc |= pc_buf_printf(out,
                        "# HELP kvgw_metrics_dropped_total Observations dropped because their "
                        "family reached its series limit.\n"
                        "# TYPE kvgw_metrics_dropped_total counter\n"
                        "kvgw_metrics_dropped_total %llu\n",
                        (unsigned long long)m->dropped);
    pthread_mutex_unlock(&m->mu);
    return rc != 0 ? PC_ERR_NOMEM : 0;
}
