/*
 * pricing.c — the pricing table (YAML, libyaml) and the exact cost arithmetic.
 *
 * Invariants: entries are sorted by (model, effective_ms) with no duplicate pair, so a lookup is
 * a binary search for the model's last entry not after the time. No floating point: amounts are
 * parsed from their decimal text digit by digit, and costs are 128-bit products divided once.
 */
#include "billing.h"
#include "common.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

typedef unsigned __int128 u128;

struct bill_pricing {
    bill_price_t *v;
    size_t n;
};

/* ---------------------------------------------------------------------------------------------
 * Exact arithmetic
 * ------------------------------------------------------------------------------------------- */

int bill_muldiv_round(uint64_t a, uint64_t b, uint64_t num, uint64_t den, uint64_t *out)
{
    if (den == 0)
        return PC_ERR_INVAL;
    u128 p = (u128)a * b; /* two 64-bit factors always fit in 128 bits */
    if (num != 0 && p > (~(u128)0) / num)
        return PC_ERR_RANGE;
    p *= num;
    u128 q = p / den, r = p % den;
    /* Half-to-even: round up above one half, and at exactly one half only when q is odd.
     * den < 2^64, so 2r cannot overflow. */
    if (2 * r > den || (2 * r == den && (q & 1)))
        q++;
    if (q > UINT64_MAX)
        return PC_ERR_RANGE;
    *out = (uint64_t)q;
    return 0;
}

int bill_cost_tokens(uint64_t n_tokens, uint64_t price_nusd_per_mtok, bill_ratio_t mult,
                     uint64_t *cost_nusd)
{
    if (mult.den == 0)
        return PC_ERR_INVAL;
    return bill_muldiv_round(n_tokens, price_nusd_per_mtok, mult.num, (uint64_t)mult.den * 1000000u,
                             cost_nusd);
}

int bill_cost_storage(uint64_t token_ms, uint64_t price_nusd_per_mtok_hour, uint64_t *cost_nusd)
{
    return bill_muldiv_round(token_ms, price_nusd_per_mtok_hour, 1, 3600000ull * 1000000ull,
                             cost_nusd);
}

char *bill_nusd_str(uint64_t nusd, char buf[32])
{
    snprintf(buf, 32, "%" PRIu64 ".%09" PRIu64, nusd / 1000000000u, nusd % 1000000000u);
    return buf;
}

/* ---------------------------------------------------------------------------------------------
 * Exact parsers
 * ------------------------------------------------------------------------------------------- */

/* Parses "123" or "123.456" into an integer scaled by 10^scale (at most `scale` decimals). */
static int parse_decimal(const char *s, unsigned scale, uint64_t *out)
{
    if (s == NULL || *s == '\0')
        return PC_ERR_FORMAT;
    u128 v = 0;
    unsigned frac = 0;
    bool dot = false, digits = false;
    for (const char *c = s; *c; c++) {
        if (*c == '.' && !dot) {
            dot = true;
            continue;
        }
        if (*c == '_' && digits) /* YAML-style digit grouping: 1_000_000 */
            continue;
        if (*c < '0' || *c > '9')
            return PC_ERR_FORMAT;
        if (dot && ++frac > scale)
            return PC_ERR_RANGE; /* more decimals than the unit can hold exactly */
        v = v * 10 + (unsigned)(*c - '0');
        if (v > UINT64_MAX)
            return PC_ERR_RANGE;
        digits = true;
    }
    if (!digits)
        return PC_ERR_FORMAT;
    for (; frac < scale; frac++) {
        v *= 10;
        if (v > UINT64_MAX)
            return PC_ERR_RANGE;
    }
    *out = (uint64_t)v;
    return 0;
}

int bill_parse_usd(const char *s, uint64_t *nusd)
{
    return parse_decimal(s, 9, nusd);
}

static uint64_t gcd_u64(uint64_t a, uint64_t b)
{
    while (b != 0) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

int bill_parse_ratio(const char *s, bill_ratio_t *out)
{
    if (s == NULL)
        return PC_ERR_FORMAT;
    uint64_t num, den;
    const char *slash = strchr(s, '/');
    if (slash != NULL) {
        char a[32];
        size_t n = (size_t)(slash - s);
        if (n == 0 || n >= sizeof a)
            return PC_ERR_FORMAT;
        memcpy(a, s, n);
        a[n] = '\0';
        int rc = parse_decimal(a, 0, &num);
        if (rc == 0)
            rc = parse_decimal(slash + 1, 0, &den);
        if (rc != 0)
            return rc;
        if (den == 0)
            return PC_ERR_RANGE;
    } else {
        /* A decimal d.ddd is exactly ddddd / 10^k; 9 decimals at most. */
        const char *dot = strchr(s, '.');
        unsigned k = dot != NULL ? (unsigned)strlen(dot + 1) : 0;
        if (k > 9)
            return PC_ERR_RANGE;
        int rc = parse_decimal(s, k, &num);
        if (rc != 0)
            return rc;
        den = 1;
        for (unsigned i = 0; i < k; i++)
            den *= 10;
    }
    uint64_t g = gcd_u64(num, den);
    if (g > 1) {
        num /= g;
        den /= g;
    }
    if (num > UINT32_MAX || den > UINT32_MAX)
        return PC_ERR_RANGE;
    *out = (bill_ratio_t){(uint32_t)num, (uint32_t)den};
    return 0;
}

/* Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

static void civil_from_days(int64_t z, int *y, unsigned *m, unsigned *d)
{
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    unsigned doe = (unsigned)(z - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t yy = (int64_t)yoe + era * 400;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = (int)(yy + (*m <= 2));
}

static int read_uint(const char **p, int n_digits, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < n_digits; i++) {
        if (!isdigit((unsigned char)(*p)[i]))
            return PC_ERR_FORMAT;
        v = v * 10 + (unsigned)((*p)[i] - '0');
    }
    *p += n_digits;
    *out = v;
    return 0;
}

int bill_parse_time_ms(const char *s, uint64_t *ms)
{
    if (s == NULL || *s == '\0')
        return PC_ERR_FORMAT;
    bool all_digits = true;
    for (const char *c = s; *c; c++)
        all_digits &= isdigit((unsigned char)*c) != 0;
    if (all_digits)
        return parse_decimal(s, 0, ms);
    const char *p = s;
    unsigned y, mo, d, h = 0, mi = 0, se = 0, frac_ms = 0;
    if (read_uint(&p, 4, &y) || *p++ != '-' || read_uint(&p, 2, &mo) || *p++ != '-' ||
        read_uint(&p, 2, &d))
        return PC_ERR_FORMAT;
    if (*p == 'T' || *p == ' ') {
        p++;
        if (read_uint(&p, 2, &h) || *p++ != ':' || read_uint(&p, 2, &mi) || *p++ != ':' ||
            read_uint(&p, 2, &se))
            return PC_ERR_FORMAT;
        if (*p == '.') {
            p++;
            unsigned scale = 100;
            if (!isdigit((unsigned char)*p))
                return PC_ERR_FORMAT;
            while (isdigit((unsigned char)*p)) {
                frac_ms += (unsigned)(*p - '0') * scale;
                scale /= 10;
                p++;
            }
        }
        if (*p == 'Z' || *p == 'z')
            p++;
        else if (strcmp(p, "+00:00") == 0)
            p += 6;
        else
            return PC_ERR_FORMAT; /* only UTC: a ledger time never depends on a zone */
    }
    if (*p != '\0' || y < 1970 || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 ||
        se > 60)
        return PC_ERR_FORMAT;
    /* Reject dates like 02-30 by a round trip through the calendar. */
    int64_t days = days_from_civil(y, mo, d);
    int cy;
    unsigned cm, cd;
    civil_from_days(days, &cy, &cm, &cd);
    if ((unsigned)cy != y || cm != mo || cd != d)
        return PC_ERR_FORMAT;
    *ms = ((uint64_t)days * 86400u + h * 3600u + mi * 60u + se) * 1000u + frac_ms;
    return 0;
}

void bill_day_str(uint64_t ms, char *buf)
{
    int y;
    unsigned m, d;
    civil_from_days((int64_t)(ms / 86400000u), &y, &m, &d);
    snprintf(buf, 11, "%04d-%02u-%02u", y, m, d);
}

uint64_t bill_day_start_ms(uint64_t ms)
{
    return ms - ms % 86400000u;
}

void bill_time_str(uint64_t ms, char *buf)
{
    int y;
    unsigned m, d;
    civil_from_days((int64_t)(ms / 86400000u), &y, &m, &d);
    uint64_t r = ms % 86400000u;
    snprintf(buf, 25, "%04d-%02u-%02uT%02u:%02u:%02u.%03uZ", y, m, d, (unsigned)(r / 3600000u),
             (unsigned)(r / 60000u % 60), (unsigned)(r / 1000u % 60), (unsigned)(r % 1000u));
}

/* ---------------------------------------------------------------------------------------------
 * The YAML table
 *
 *   models:
 *     <model name>:            a mapping (one price) or a list of them (price changes)
 *       effective: 2025-01-01  optional, default the epoch
 *       input_usd_per_mtok: "3"
 *       output_usd_per_mtok: "15"
 *       cache_write_5m: "5/4"  optional multipliers, defaults 5/4, 2/1, 1/10
 *       cache_write_1h: "2/1"
 *       cache_read: "1/10"
 *       storage_usd_per_mtok_hour: "0"    optional
 * ------------------------------------------------------------------------------------------- */

static int cmp_price(const void *a, const void *b)
{
    const bill_price_t *x = a, *y = b;
    int c = strcmp(x->model, y->model);
    if (c != 0)
        return c;
    return x->effective_ms < y->effective_ms ? -1 : x->effective_ms > y->effective_ms;
}

static const char *scalar(yaml_document_t *doc, yaml_node_t *n)
{
    return n != NULL && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static int parse_entry(yaml_document_t *doc, const char *model, yaml_node_t *m, bill_price_t *out,
                       char *err, size_t err_len)
{
    if (m->type != YAML_MAPPING_NODE)
        return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                           "pricing: model '%s': expected a mapping of prices (line %zu)", model,
                           m->start_mark.line + 1);
    memset(out, 0, sizeof *out);
    if (strlen(model) == 0 || strlen(model) >= sizeof out->model)
        return pc_err_setf(err, err_len, PC_ERR_FORMAT, "pricing: model name '%s' too long", model);
    strcpy(out->model, model);
    out->write_5m = (bill_ratio_t){5, 4};
    out->write_1h = (bill_ratio_t){2, 1};
    out->read = (bill_ratio_t){1, 10};
    bool have_in = false, have_out = false;
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        const char *k = scalar(doc, yaml_document_get_node(doc, p->key));
        const char *v = scalar(doc, yaml_document_get_node(doc, p->value));
        if (k == NULL || v == NULL)
            return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                               "pricing: model '%s': keys and values must be scalars", model);
        int rc = 0;
        if (strcmp(k, "effective") == 0)
            rc = bill_parse_time_ms(v, &out->effective_ms);
        else if (strcmp(k, "input_usd_per_mtok") == 0)
            rc = bill_parse_usd(v, &out->input_nusd_per_mtok), have_in = true;
        else if (strcmp(k, "output_usd_per_mtok") == 0)
            rc = bill_parse_usd(v, &out->output_nusd_per_mtok), have_out = true;
        else if (strcmp(k, "cache_write_5m") == 0)
            rc = bill_parse_ratio(v, &out->write_5m);
        else if (strcmp(k, "cache_write_1h") == 0)
            rc = bill_parse_ratio(v, &out->write_1h);
        else if (strcmp(k, "cache_read") == 0)
            rc = bill_parse_ratio(v, &out->read);
        else if (strcmp(k, "storage_usd_per_mtok_hour") == 0)
            rc = bill_parse_usd(v, &out->storage_nusd_per_mtok_hour);
        else
            return pc_err_setf(err, err_len, PC_ERR_FORMAT, "pricing: model '%s': unknown key '%s'",
                               model, k);
        if (rc != 0)
            return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                               "pricing: model '%s': bad %s '%s' (%s; prices are decimal USD "
                               "with at most 9 decimals, multipliers like 5/4 or 1.25)",
                               model, k, v, pc_strerror(rc));
    }
    if (!have_in || !have_out)
        return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                           "pricing: model '%s': input_usd_per_mtok and output_usd_per_mtok are "
                           "required",
                           model);
    return 0;
}

int bill_pricing_parse(const char *yaml, size_t len, bill_pricing_t **out, char *err,
                       size_t err_len)
{
    yaml_parser_t parser;
    yaml_document_t doc;
    bill_pricing_t *p = NULL;
    int rc = 0;
    bool have_doc = false;
    *out = NULL;
    if (!yaml_parser_initialize(&parser))
        return PC_ERR_NOMEM;
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    if (!yaml_parser_load(&parser, &doc)) {
        rc = pc_err_setf(err, err_len, PC_ERR_FORMAT, "pricing: YAML error at line %zu: %s",
                         parser.problem_mark.line + 1,
                         parser.problem != NULL ? parser.problem : "?");
        goto fail;
    }
    have_doc = true;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    yaml_node_t *models = NULL;
    if (root == NULL || root->type != YAML_MAPPING_NODE) {
        rc = pc_err_setf(err, err_len, PC_ERR_FORMAT, "pricing: expected a mapping with 'models'");
        goto fail;
    }
    for (yaml_node_pair_t *kv = root->data.mapping.pairs.start; kv < root->data.mapping.pairs.top;
         kv++) {
        const char *k = scalar(&doc, yaml_document_get_node(&doc, kv->key));
        if (k != NULL && strcmp(k, "models") == 0) {
            models = yaml_document_get_node(&doc, kv->value);
        } else if (k != NULL && strcmp(k, "currency") == 0) {
            const char *v = scalar(&doc, yaml_document_get_node(&doc, kv->value));
            if (v == NULL || strcmp(v, "USD") != 0) {
                rc = pc_err_setf(err, err_len, PC_ERR_FORMAT,
                                 "pricing: only currency USD is supported");
                goto fail;
            }
        } else {
            rc = pc_err_setf(err, err_len, PC_ERR_FORMAT, "pricing: unknown top-level key '%s'",
                             k != NULL ? k : "?");
            goto fail;
        }
    }
    if (models == NULL || models->type != YAML_MAPPING_NODE) {
        rc = pc_err_setf(err, err_len, PC_ERR_FORMAT,
                         "pricing: 'models' must be a mapping of model name to prices");
        goto fail;
    }
    p = pc_calloc(1, sizeof *p);
    if (p == NULL) {
        rc = PC_ERR_NOMEM;
        goto fail;
    }
    size_t cap = 0;
    for (yaml_node_pair_t *kv = models->data.mapping.pairs.start;
         kv < models->data.mapping.pairs.top; kv++) {
        const char *model = scalar(&doc, yaml_document_get_node(&doc, kv->key));
        yaml_node_t *v = yaml_document_get_node(&doc, kv->value);
        if (model == NULL || v == NULL) {
            rc = pc_err_setf(err, err_len, PC_ERR_FORMAT, "pricing: model names must be scalars");
            goto fail;
        }
        yaml_node_item_t *items = NULL, *items_end = NULL;
        yaml_node_t *single = NULL;
        if (v->type == YAML_SEQUENCE_NODE) {
            items = v->data.sequence.items.start;
            items_end = v->data.sequence.items.top;
        } else {
            single = v;
        }
        for (size_t i = 0; single != NULL ? i < 1 : items + i < items_end; i++) {
            yaml_node_t *m = single != NULL ? single : yaml_document_get_node(&doc, items[i]);
            if (p->n == cap) {
                size_t nc = cap ? cap * 2 : 16;
                bill_price_t *nv = pc_reallocarray(p->v, nc, sizeof *nv);
                if (nv == NULL) {
                    rc = PC_ERR_NOMEM;
                    goto fail;
                }
                p->v = nv;
                cap = nc;
            }
            rc = parse_entry(&doc, model, m, &p->v[p->n], err, err_len);
            if (rc != 0)
                goto fail;
            p->n++;
        }
    }
    if (p->n == 0) {
        rc = pc_err_setf(err, err_len, PC_ERR_FORMAT, "pricing: no model has a price");
        goto fail;
    }
    qsort(p->v, p->n, sizeof *p->v, cmp_price);
    for (size_t i = 1; i < p->n; i++)
        if (cmp_price(&p->v[i - 1], &p->v[i]) == 0) {
            rc = pc_err_setf(err, err_len, PC_ERR_FORMAT,
                             "pricing: model '%s' has two prices with the same effective time",
                             p->v[i].model);
            goto fail;
        }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    *out = p;
    return 0;
fail:
    bill_pricing_free(p);
    if (have_doc)
        yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return rc;
}

int bill_pricing_load(const char *path, bill_pricing_t **out, char *err, size_t err_len)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return pc_err_setf(err, err_len, pc_err_from_errno(errno), "pricing: cannot open %s: %s",
                           path, strerror(errno));
    pc_buf_t b = PC_BUF_INIT;
    int rc = 0;
    for (;;) {
        char *w = pc_buf_reserve(&b, 65536);
        if (w == NULL) {
            rc = PC_ERR_NOMEM;
            break;
        }
        size_t n = fread(w, 1, 65536, f);
        pc_buf_commit(&b, n);
        if (n < 65536) {
            if (ferror(f))
                rc = pc_err_setf(err, err_len, PC_ERR_IO, "pricing: cannot read %s", path);
            break;
        }
    }
    fclose(f);
    if (rc == 0)
        rc = bill_pricing_parse(b.base != NULL ? b.base : "", b.len, out, err, err_len);
    pc_buf_free(&b);
    return rc;
}

void bill_pricing_free(bill_pricing_t *p)
{
    if (p == NULL)
        return;
    pc_free(p->v);
    pc_free(p);
}

int bill_pricing_lookup(const bill_pricing_t *p, const char *model, uint64_t at_ms,
                        const bill_price_t **out)
{
    if (p == NULL || model == NULL)
        return PC_ERR_INVAL;
    /* Upper bound of (model, at_ms) in the sorted table, then step back one entry. */
    size_t lo = 0, hi = p->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(p->v[mid].model, model);
        if (c < 0 || (c == 0 && p->v[mid].effective_ms <= at_ms))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0 || strcmp(p->v[lo - 1].model, model) != 0)
        return PC_ERR_NOTFOUND;
    *out = &p->v[lo - 1];
    return 0;
}

size_t bill_pricing_count(const bill_pricing_t *p)
{
    return p != NULL ? p->n : 0;
}

const bill_price_t *bill_pricing_at(const bill_pricing_t *p, size_t i)
{
    return p != NULL && i < p->n ? &p->v[i] : NULL;
}
