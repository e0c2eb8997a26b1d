/*
 * event.c — usage and storage events: validation, pricing, the binary encoding (ledger.h
 * documents it byte by byte), event ids and CRC32C.
 */
#include "billing.h"
#include "common.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <pthread.h>
#include <sys/random.h>

static const char *const bucket_names[BILL_BUCKET_COUNT] = {
    "uncached_input", "cache_write_5m", "cache_write_1h", "cache_read", "output", "cache_storage",
};

static const char *const status_names[BILL_STATUS_COUNT] = {
    "completed", "stopped", "failed", "cancelled", "disconnected",
};

static const char *const registry_names[BILL_REGISTRY_COUNT] = {"none", "shared", "local"};

const char *bill_registry_name(int registry)
{
    return registry >= 0 && registry < BILL_REGISTRY_COUNT ? registry_names[registry] : NULL;
}

int bill_registry_parse(const char *s)
{
    for (int i = 0; s != NULL && i < BILL_REGISTRY_COUNT; i++)
        if (strcmp(s, registry_names[i]) == 0)
            return i;
    return -1;
}

const char *bill_bucket_name(int bucket)
{
    return bucket >= 0 && bucket < BILL_BUCKET_COUNT ? bucket_names[bucket] : NULL;
}

const char *bill_status_name(int status)
{
    return status >= 0 && status < BILL_STATUS_COUNT ? status_names[status] : NULL;
}

int bill_usage_split_abc(uint64_t a, uint64_t b, uint64_t c, uint64_t n_prompt, bill_usage_t *out)
{
    if (!(a <= b && b <= c && c <= n_prompt))
        return PC_ERR_INVAL;
    out->n_read = a;
    out->n_write_1h = b - a;
    out->n_write_5m = c - b;
    out->n_uncached = n_prompt - c;
    return 0;
}

void bill_usage_openai_view(const bill_usage_t *u, uint64_t *prompt_tokens, uint64_t *cached_tokens,
                            uint64_t *cache_write_tokens)
{
    *prompt_tokens = u->n_uncached + u->n_write_5m + u->n_write_1h + u->n_read;
    *cached_tokens = u->n_read;
    *cache_write_tokens = u->n_write_5m + u->n_write_1h;
}

int bill_usage_from_openai(uint64_t prompt_tokens, uint64_t cached_tokens,
                           uint64_t cache_write_tokens, uint64_t completion_tokens,
                           bill_usage_t *out)
{
    if (cached_tokens > prompt_tokens || cache_write_tokens > prompt_tokens - cached_tokens)
        return PC_ERR_INVAL;
    *out = (bill_usage_t){.n_uncached = prompt_tokens - cached_tokens - cache_write_tokens,
                          .n_write_5m = cache_write_tokens,
                          .n_read = cached_tokens,
                          .n_output = completion_tokens};
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Events
 * ------------------------------------------------------------------------------------------- */

void bill_event_init(bill_event_t *ev, int kind)
{
    memset(ev, 0, sizeof *ev);
    ev->kind = (uint8_t)kind;
}

static bool str_ok(const char *s, size_t max)
{
    size_t n = strnlen(s, max);
    if (n >= max)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return false;
    return true;
}

int bill_event_set_str(char dst[BILL_STR_MAX], const char *s)
{
    if (s == NULL)
        s = "";
    if (!str_ok(s, BILL_STR_MAX))
        return PC_ERR_INVAL;
    size_t n = strlen(s);
    memcpy(dst, s, n + 1);
    memset(dst + n + 1, 0, BILL_STR_MAX - n - 1); /* deterministic bytes: records compare equal */
    return 0;
}

int bill_event_validate(const bill_event_t *ev, char *err, size_t err_len)
{
    const char *names[6] = {"event_id", "request_id", "tenant", "api_key_id", "model", "ns"};
    const char *fields[6] = {ev->event_id,   ev->request_id, ev->tenant,
                             ev->api_key_id, ev->model,      ev->ns};
    for (int i = 0; i < 6; i++)
        if (!str_ok(fields[i], BILL_STR_MAX))
            return pc_err_setf(err, err_len, PC_ERR_INVAL,
                               "billing: event %s is longer than %d bytes or has control "
                               "characters",
                               names[i], BILL_STR_MAX - 1);
    if (ev->event_id[0] == '\0' || ev->tenant[0] == '\0' || ev->model[0] == '\0')
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "billing: event_id, tenant and model are required");
    if (ev->start_ms > ev->end_ms)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "billing: event %s ends before it starts",
                           ev->event_id);
    if (ev->registry >= BILL_REGISTRY_COUNT)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "billing: event %s: bad registry %u",
                           ev->event_id, ev->registry);
    if (ev->kind == BILL_EVENT_USAGE) {
        if (ev->request_id[0] == '\0')
            return pc_err_setf(err, err_len, PC_ERR_INVAL,
                               "billing: usage event %s has no request id", ev->event_id);
        if (ev->status >= BILL_STATUS_COUNT)
            return pc_err_setf(err, err_len, PC_ERR_INVAL, "billing: event %s: bad status %u",
                               ev->event_id, ev->status);
        if (ev->n_hit_physical > ev->n_hit_logical || ev->n_hit_logical > ev->usage.n_read)
            return pc_err_setf(err, err_len, PC_ERR_INVAL,
                               "billing: event %s: physical hits <= logical hits <= cache reads "
                               "must hold",
                               ev->event_id);
        if (ev->token_ms != 0 || ev->cost_nusd[BILL_BUCKET_STORAGE] != 0)
            return pc_err_setf(err, err_len, PC_ERR_INVAL,
                               "billing: usage event %s carries storage", ev->event_id);
    } else if (ev->kind == BILL_EVENT_STORAGE) {
        if (ev->ns[0] == '\0')
            return pc_err_setf(err, err_len, PC_ERR_INVAL,
                               "billing: storage event %s has no namespace", ev->event_id);
        const bill_usage_t *u = &ev->usage;
        if (ev->status != 0 || u->n_uncached || u->n_write_5m || u->n_write_1h || u->n_read ||
            u->n_output || ev->n_hit_logical || ev->n_hit_physical)
            return pc_err_setf(err, err_len, PC_ERR_INVAL,
                               "billing: storage event %s carries token usage", ev->event_id);
        for (int b = 0; b < BILL_BUCKET_STORAGE; b++)
            if (ev->cost_nusd[b] != 0)
                return pc_err_setf(err, err_len, PC_ERR_INVAL,
                                   "billing: storage event %s carries token costs", ev->event_id);
    } else {
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "billing: bad event kind %u", ev->kind);
    }
    uint64_t total = 0;
    for (int b = 0; b < BILL_BUCKET_COUNT; b++) {
        if (total + ev->cost_nusd[b] < total)
            return pc_err_setf(err, err_len, PC_ERR_INVAL, "billing: event %s: cost overflows",
                               ev->event_id);
        total += ev->cost_nusd[b];
    }
    return 0;
}

int bill_event_price(bill_event_t *ev, const bill_pricing_t *p, char *err, size_t err_len)
{
    const bill_price_t *pr;
    if (bill_pricing_lookup(p, ev->model, ev->start_ms, &pr) != 0)
        return pc_err_setf(err, err_len, PC_ERR_NOTFOUND,
                           "billing: no price for model '%s' at this time; refusing rather than "
                           "billing 0",
                           ev->model);
    uint64_t c[BILL_BUCKET_COUNT] = {0};
    const bill_ratio_t one = {1, 1};
    int rc = 0;
    if (ev->kind == BILL_EVENT_STORAGE) {
        rc = bill_cost_storage(ev->token_ms, pr->storage_nusd_per_mtok_hour,
                               &c[BILL_BUCKET_STORAGE]);
    } else {
        uint64_t in = pr->input_nusd_per_mtok;
        rc = bill_cost_tokens(ev->usage.n_uncached, in, one, &c[BILL_BUCKET_UNCACHED]);
        if (rc == 0)
            rc = bill_cost_tokens(ev->usage.n_write_5m, in, pr->write_5m, &c[BILL_BUCKET_WRITE_5M]);
        if (rc == 0)
            rc = bill_cost_tokens(ev->usage.n_write_1h, in, pr->write_1h, &c[BILL_BUCKET_WRITE_1H]);
        if (rc == 0)
            rc = bill_cost_tokens(ev->usage.n_read, in, pr->read, &c[BILL_BUCKET_READ]);
        if (rc == 0)
            rc = bill_cost_tokens(ev->usage.n_output, pr->output_nusd_per_mtok, one,
                                  &c[BILL_BUCKET_OUTPUT]);
    }
    uint64_t total = 0;
    for (int b = 0; rc == 0 && b < BILL_BUCKET_COUNT; b++) {
        if (total + c[b] < total)
            rc = PC_ERR_RANGE;
        total += c[b];
    }
    if (rc != 0)
        return pc_err_setf(err, err_len, rc, "billing: event %s: cost out of range", ev->event_id);
    memcpy(ev->cost_nusd, c, sizeof c);
    return 0;
}

uint64_t bill_event_total_nusd(const bill_event_t *ev)
{
    uint64_t t = 0;
    for (int b = 0; b < BILL_BUCKET_COUNT; b++)
        t += ev->cost_nusd[b];
    return t;
}

uint64_t bill_event_quantity(const bill_event_t *ev)
{
    if (ev->kind == BILL_EVENT_STORAGE)
        return ev->token_ms;
    const bill_usage_t *u = &ev->usage;
    return u->n_uncached + u->n_write_5m + u->n_write_1h + u->n_read + u->n_output;
}

/* ---------------------------------------------------------------------------------------------
 * Encoding (payload of a ledger record; layout in ledger.h)
 * ------------------------------------------------------------------------------------------- */

static uint8_t *put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return p + 8;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static uint8_t *put_str(uint8_t *p, const char *s)
{
    size_t n = strnlen(s, BILL_STR_MAX - 1);
    *p++ = (uint8_t)n;
    memcpy(p, s, n);
    return p + n;
}

size_t bill_event_encode(const bill_event_t *ev, uint8_t *buf)
{
    uint8_t *p = buf;
    *p++ = ev->kind;
    *p++ = ev->status;
    p = put_str(p, ev->event_id);
    p = put_str(p, ev->request_id);
    p = put_str(p, ev->tenant);
    p = put_str(p, ev->api_key_id);
    p = put_str(p, ev->model);
    p = put_str(p, ev->ns);
    p = put_u64(p, ev->start_ms);
    p = put_u64(p, ev->end_ms);
    p = put_u64(p, ev->usage.n_uncached);
    p = put_u64(p, ev->usage.n_write_5m);
    p = put_u64(p, ev->usage.n_write_1h);
    p = put_u64(p, ev->usage.n_read);
    p = put_u64(p, ev->usage.n_output);
    p = put_u64(p, ev->n_hit_logical);
    p = put_u64(p, ev->n_hit_physical);
    p = put_u64(p, ev->token_ms);
    for (int b = 0; b < BILL_BUCKET_COUNT; b++)
        p = put_u64(p, ev->cost_nusd[b]);
    *p++ = ev->registry; /* format 2 */
    return (size_t)(p - buf);
}

static int get_str(const uint8_t **p, const uint8_t *end, char dst[BILL_STR_MAX])
{
    if (*p >= end)
        return PC_ERR_FORMAT;
    size_t n = **p;
    (*p)++;
    if (n >= BILL_STR_MAX || (size_t)(end - *p) < n)
        return PC_ERR_FORMAT;
    memset(dst, 0, BILL_STR_MAX);
    memcpy(dst, *p, n);
    if (strlen(dst) != n) /* an embedded NUL */
        return PC_ERR_FORMAT;
    *p += n;
    return 0;
}

int bill_event_decode(const uint8_t *buf, size_t len, bill_event_t *ev)
{
    return bill_event_decode_format(buf, len, BILL_EVENT_FORMAT, ev);
}

int bill_event_decode_format(const uint8_t *buf, size_t len, int format, bill_event_t *ev)
{
    const uint8_t *p = buf, *end = buf + len;
    memset(ev, 0, sizeof *ev);
    if (len < 2 || format < 1 || format > BILL_EVENT_FORMAT)
        return PC_ERR_FORMAT;
    ev->kind = *p++;
    ev->status = *p++;
    char *strs[6] = {ev->event_id, ev->request_id, ev->tenant, ev->api_key_id, ev->model, ev->ns};
    for (int i = 0; i < 6; i++)
        if (get_str(&p, end, strs[i]) != 0)
            return PC_ERR_FORMAT;
    size_t tail = format >= 2 ? 1 : 0; /* format 2: the registry byte */
    if ((size_t)(end - p) != 16 * 8 + tail)
        return PC_ERR_FORMAT;
    uint64_t *u64s[10] = {&ev->start_ms,         &ev->end_ms,           &ev->usage.n_uncached,
                          &ev->usage.n_write_5m, &ev->usage.n_write_1h, &ev->usage.n_read,
                          &ev->usage.n_output,   &ev->n_hit_logical,    &ev->n_hit_physical,
                          &ev->token_ms};
    for (int i = 0; i < 10; i++, p += 8)
        *u64s[i] = get_u64(p);
    for (int b = 0; b < BILL_BUCKET_COUNT; b++, p += 8)
        ev->cost_nusd[b] = get_u64(p);
    ev->registry = tail ? *p : BILL_REGISTRY_NONE; /* format 1 predates the registry */
    return bill_event_validate(ev, NULL, 0) == 0 ? 0 : PC_ERR_FORMAT;
}

/* ---------------------------------------------------------------------------------------------
 * Ids and CRC32C
 * ------------------------------------------------------------------------------------------- */

int bill_idgen_init(bill_idgen_t *g)
{
    uint64_t r = 0;
    ssize_t n;
    do
        n = getrandom(&r, sizeof r, 0);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof r)
        return PC_ERR_IO;
    g->boot = r;
    g->next = 0;
    return 0;
}

void bill_idgen_next(bill_idgen_t *g, char out[BILL_STR_MAX])
{
    memset(out, 0, BILL_STR_MAX);
    snprintf(out, BILL_STR_MAX, "%016" PRIx64 "-%016" PRIx64, g->boot, g->next++);
}

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

uint32_t bill_crc32c(uint32_t crc, const void *data, size_t len)
{
    pthread_once(&crc_once, crc_init);
    const uint8_t *p = data;
    crc = ~crc;
    while (len >= 8) { /* slicing-by-8 */
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                             (uint32_t)p[3] << 24);
        uint32_t hi =
            (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        crc = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
              crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xff] ^
              crc_table[2][(hi >> 8) & 0xff] ^ crc_table[1][(hi >> 16) & 0xff] ^
              crc_table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}
