/*
 * config.c — YAML configuration (config.h): libyaml's document API gives a node tree with
 * line numbers; a small schema walker below checks every key and value against what the
 * gateway knows and fills gw_config_t over the built-in defaults.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <yaml.h>

#include "billing.h"
#include "common.h"
#include "engine.h"
#include "lnk_addr.h"
#include "render.h"
#include "worker.h"

/* The namespace secret used when the config gives none: fine for a laptop, never for a
 * deployment (serve prints a warning). */
static const char default_ns_secret[] = "kvgw-demo-namespace-secret-change-me";

static void hash_key(const char *key, size_t len, uint8_t out[GW_SHA256_BYTES])
{
    crypto_hash_sha256(out, (const unsigned char *)key, len);
}

static int add_key(gw_config_t *c, const char *key, const char *id, const char *tenant)
{
    gw_cfg_key_t *k = pc_reallocarray(c->keys, c->n_keys + 1, sizeof *k);
    if (k == NULL)
        return PC_ERR_NOMEM;
    c->keys = k;
    k += c->n_keys;
    memset(k, 0, sizeof *k);
    hash_key(key, strlen(key), k->sha256);
    k->id = pc_strdup(id);
    k->tenant = pc_strdup(tenant);
    c->n_keys++;
    return (k->id && k->tenant) ? 0 : PC_ERR_NOMEM;
}

/* kv_tiers' values when the section is given without them (the tiers stay off: no dir). */
static void tiers_defaults(gw_cfg_tiers_t *t)
{
    t->max_bytes = 4ull << 30;
    t->write_through = true;
    t->min_tokens = 64;
}

static void tiers_free(gw_cfg_tiers_t *t)
{
    pc_free(t->dir);
    pc_free(t->key_file);
    sodium_memzero(t, sizeof *t);
}

int gw_config_default(gw_config_t *c)
{
    if (sodium_init() < 0)
        return PC_ERR_INTERNAL;
    memset(c, 0, sizeof *c);
    c->source = pc_strdup("(built-in default)");
    c->listen_host = pc_strdup("127.0.0.1");
    c->listen_port = 8080;
    c->models = pc_calloc(1, sizeof *c->models);
    if (c->models == NULL)
        goto fail;
    c->n_models = 1;
    gw_cfg_model_t *m = &c->models[0];
    m->name = pc_strdup("kvgw-demo");
    m->path = pc_strdup("models/kvgw-demo.gguf");
    m->min_cache_tokens = 64;
    m->auto_ttl_ms = 5 * 60 * 1000;
    m->in_process = 2;
    m->threads = 1;
    m->backend = pc_strdup("cpu");
    if (add_key(c, "sk-kvgw-demo", "demo-key", "demo") ||
        add_key(c, "sk-kvgw-demo2", "demo2-key", "demo2"))
        goto fail;
    c->has_admin_key = true;
    hash_key("sk-kvgw-admin", strlen("sk-kvgw-admin"), c->admin_sha256);
    crypto_generichash(c->namespace_secret, sizeof c->namespace_secret,
                       (const unsigned char *)default_ns_secret, strlen(default_ns_secret), NULL,
                       0);
    c->namespace_secret_is_default = true;
    c->worker_heartbeat_ms = 1000;
    c->worker_connect_timeout_ms = 3000;
    c->max_body_bytes = 32u << 20;
    c->max_header_bytes = 64u << 10;
    c->max_headers = 100;
    c->header_timeout_ms = 10000;
    c->body_timeout_ms = 30000;
    c->idle_timeout_ms = 60000;
    c->max_connections = 4096;
    c->body_min_rate = 1024;
    c->reserved_connections = 512;
    c->max_connections_per_peer = 256;
    c->stream_high_water = 256u << 10;
    c->shutdown_grace_ms = 10000;
    c->accounting = GW_ACCOUNTING_TOKEN;
    c->cache_max_tokens = 64u << 20;
    c->tokenizer_cache_bytes = 64u << 20;
    c->ttl_5m_ms = 5 * 60000;
    c->ttl_1h_ms = 60 * 60000;
    c->ledger_dir = pc_strdup("var/ledger");
    c->fsync = GW_FSYNC_BATCH;
    c->fsync_batch_us = 500;
    c->segment_bytes = 64u << 20;
    c->pricing_path = pc_strdup("conf/pricing.yaml");
    c->storage_interval_ms = 60000;
    c->instance_id = pc_strdup("gw1");
    c->redis_port = 6379;
    c->redis_timeout_ms = 1000;
    c->redis_prefix = pc_strdup("kvgw");
    c->registry_timeout_ms = 50;
    c->registry_claim_ttl_ms = 30000;
    c->registry_lease_ms = 10000;
    c->registry_feed_maxlen = 100000;
    c->registry_replay_max = 65536;
    c->registry_failover_replay_ms = 30000;
    c->access_log = pc_strdup("-");
    c->log_level = pc_strdup("info");
    c->metrics_require_key = true;
    tiers_defaults(&c->kv_tiers);
    if (!c->source || !c->listen_host || !m->name || !m->path || !m->backend || !c->ledger_dir ||
        !c->pricing_path || !c->instance_id || !c->access_log || !c->log_level || !c->redis_prefix)
        goto fail;
    return 0;
fail:
    gw_config_free(c);
    return PC_ERR_NOMEM;
}

static void free_model(gw_cfg_model_t *m)
{
    pc_free(m->name);
    pc_free(m->path);
    pc_free(m->backend);
    for (size_t i = 0; i < m->n_remote; i++)
        pc_free(m->remote[i]);
    pc_free(m->remote);
}

static void free_keys(gw_config_t *c)
{
    for (size_t i = 0; i < c->n_keys; i++) {
        pc_free(c->keys[i].id);
        pc_free(c->keys[i].tenant);
    }
    pc_free(c->keys);
    c->keys = NULL;
    c->n_keys = 0;
}

void gw_config_free(gw_config_t *c)
{
    if (c == NULL)
        return;
    pc_free(c->source);
    pc_free(c->listen_host);
    for (size_t i = 0; i < c->n_models; i++)
        free_model(&c->models[i]);
    pc_free(c->models);
    free_keys(c);
    if (c->link_secret) {
        sodium_memzero(c->link_secret, strlen(c->link_secret));
        pc_free(c->link_secret);
    }
    pc_free(c->ledger_dir);
    pc_free(c->pricing_path);
    pc_free(c->instance_id);
    pc_free(c->redis_host);
    for (size_t i = 0; i < c->n_redis_sentinels; i++)
        pc_free(c->redis_sentinels[i]);
    pc_free(c->redis_sentinels);
    pc_free(c->redis_master_name);
    pc_free(c->redis_prefix);
    if (c->redis_password) {
        sodium_memzero(c->redis_password, strlen(c->redis_password));
        pc_free(c->redis_password);
    }
    pc_free(c->access_log);
    pc_free(c->log_level);
    sodium_memzero(c->namespace_secret, sizeof c->namespace_secret);
    tiers_free(&c->kv_tiers);
    memset(c, 0, sizeof *c);
}

/* ---- units ---------------------------------------------------------------------------- */

static int parse_scaled(const char *s, uint64_t *out, const char *const *units,
                        const uint64_t *scales, size_t n_units)
{
    if (s == NULL || !isdigit((unsigned char)s[0]))
        return PC_ERR_INVAL;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0)
        return PC_ERR_INVAL;
    while (*end == ' ')
        end++;
    uint64_t scale = 1;
    if (*end != '\0') {
        size_t i = 0;
        while (i < n_units && strcmp(end, units[i]) != 0)
            i++;
        if (i == n_units)
            return PC_ERR_INVAL;
        scale = scales[i];
    }
    if (v > UINT64_MAX / scale)
        return PC_ERR_INVAL;
    *out = (uint64_t)v * scale;
    return 0;
}

int gw_config_parse_duration(const char *s, uint64_t *ms)
{
    static const char *const units[] = {"ms", "s", "m", "h", "d"};
    static const uint64_t scales[] = {1, 1000, 60000, 3600000, 86400000};
    return parse_scaled(s, ms, units, scales, PC_ARRAY_LEN(units));
}

int gw_config_parse_size(const char *s, uint64_t *bytes)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "KB", "MB", "GB"};
    static const uint64_t scales[] = {1,    1ull << 10, 1ull << 20, 1ull << 30,
                                      1000, 1000000,    1000000000};
    return parse_scaled(s, bytes, units, scales, PC_ARRAY_LEN(units));
}

/* ---- the schema walker ------------------------------------------------------------------ */

typedef struct walk {
    yaml_document_t *doc;
    const char *name;
    char *err;
    size_t err_len;
    char path[256];   /* the key path being read, for messages */
    yaml_node_t *key; /* its key node (unknown keys are reported at the key's line) */
} walk_t;

static int fail_at(walk_t *w, yaml_node_t *n, const char *fmt, ...) PC_PRINTF(3, 4);
static int fail_at(walk_t *w, yaml_node_t *n, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return pc_err_setf(w->err, w->err_len, PC_ERR_INVAL, "%s:%lu: %s: %s", w->name,
                       n ? (unsigned long)n->start_mark.line + 1 : 0ul, w->path, msg);
}

static const char *scalar(yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static bool is_null(yaml_node_t *n)
{
    const char *s = scalar(n);
    return s && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           (s[0] == '\0' || strcmp(s, "~") == 0 || strcmp(s, "null") == 0);
}

static int get_str(walk_t *w, yaml_node_t *n, char **out)
{
    const char *s = scalar(n);
    if (s == NULL || is_null(n))
        return fail_at(w, n, "expected a string");
    char *d = pc_strdup(s);
    if (d == NULL)
        return PC_ERR_NOMEM;
    pc_free(*out);
    *out = d;
    return 0;
}

/* A secret: "env:NAME", "file:PATH" or the literal value. */
static int get_secret(walk_t *w, yaml_node_t *n, char **out)
{
    const char *s = scalar(n);
    if (s == NULL || is_null(n))
        return fail_at(w, n, "expected a string (or env:NAME, file:PATH)");
    char *v = NULL;
    if (strncmp(s, "env:", 4) == 0) {
        const char *e = getenv(s + 4);
        if (e == NULL || e[0] == '\0')
            return fail_at(w, n, "environment variable %s is not set", s + 4);
        v = pc_strdup(e);
    } else if (strncmp(s, "file:", 5) == 0) {
        FILE *f = fopen(s + 5, "rb");
        if (f == NULL)
            return fail_at(w, n, "cannot read %s: %s", s + 5, strerror(errno));
        char buf[4096];
        size_t k = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        while (k > 0 && isspace((unsigned char)buf[k - 1]))
            k--;
        size_t b = 0;
        while (b < k && isspace((unsigned char)buf[b]))
            b++;
        if (k == b)
            return fail_at(w, n, "%s is empty", s + 5);
        v = pc_strndup(buf + b, k - b);
        sodium_memzero(buf, sizeof buf);
    } else {
        v = pc_strdup(s);
    }
    if (v == NULL)
        return PC_ERR_NOMEM;
    if (v[0] == '\0') {
        pc_free(v);
        return fail_at(w, n, "must not be empty");
    }
    if (*out)
        sodium_memzero(*out, strlen(*out));
    pc_free(*out);
    *out = v;
    return 0;
}

/* A string that ends up in every ledger record of a request (a tenant, a key id, a model name):
 * what the ledger can store (billing.h: a field is at most BILL_STR_MAX - 1 bytes, with no
 * control character and no NUL), and not empty (an event needs its tenant and model). Refused
 * here, the value fails check-config; accepted, every event of that tenant would fail to record
 * at run time. */
static int get_ledger_str(walk_t *w, yaml_node_t *n, char **out)
{
    const char *s = scalar(n);
    if (s == NULL || is_null(n))
        return fail_at(w, n, "expected a string");
    size_t len = n->data.scalar.length;
    if (len == 0)
        return fail_at(w, n, "must not be empty");
    if (len > BILL_STR_MAX - 1)
        return fail_at(w, n, "is %zu bytes; the billing ledger stores at most %d", len,
                       BILL_STR_MAX - 1);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return fail_at(w, n,
                           "holds a control character (byte 0x%02x), which the billing "
                           "ledger cannot store",
                           (unsigned char)s[i]);
    return get_str(w, n, out);
}

static int get_u64(walk_t *w, yaml_node_t *n, uint64_t lo, uint64_t hi, uint64_t *out)
{
    const char *s = scalar(n);
    uint64_t v = 0;
    if (s == NULL || parse_scaled(s, &v, NULL, NULL, 0) != 0)
        return fail_at(w, n, "expected an integer");
    if (v < lo || v > hi)
        return fail_at(w, n, "%llu is out of range [%llu, %llu]", (unsigned long long)v,
                       (unsigned long long)lo, (unsigned long long)hi);
    *out = v;
    return 0;
}

static int get_u32(walk_t *w, yaml_node_t *n, uint32_t lo, uint32_t hi, uint32_t *out)
{
    uint64_t v = 0;
    int rc = get_u64(w, n, lo, hi, &v);
    if (rc == 0)
        *out = (uint32_t)v;
    return rc;
}

static int get_ms(walk_t *w, yaml_node_t *n, uint64_t lo, uint64_t hi, uint32_t *out)
{
    const char *s = scalar(n);
    uint64_t v = 0;
    if (s == NULL || gw_config_parse_duration(s, &v) != 0)
        return fail_at(w, n, "expected a duration such as 500ms, 30s, 5m or 1h");
    if (v < lo || v > hi)
        return fail_at(w, n, "%s is out of range [%llums, %llums]", s, (unsigned long long)lo,
                       (unsigned long long)hi);
    *out = (uint32_t)v;
    return 0;
}

static int get_size(walk_t *w, yaml_node_t *n, uint64_t lo, uint64_t hi, uint64_t *out)
{
    const char *s = scalar(n);
    uint64_t v = 0;
    if (s == NULL || gw_config_parse_size(s, &v) != 0)
        return fail_at(w, n, "expected a size such as 64KiB or 32MiB");
    if (v < lo || v > hi)
        return fail_at(w, n, "%s is out of range [%llu, %llu] bytes", s, (unsigned long long)lo,
                       (unsigned long long)hi);
    *out = v;
    return 0;
}

static int get_bool(walk_t *w, yaml_node_t *n, bool *out)
{
    const char *s = scalar(n);
    if (s && strcmp(s, "true") == 0)
        *out = true;
    else if (s && strcmp(s, "false") == 0)
        *out = false;
    else
        return fail_at(w, n, "expected true or false");
    return 0;
}

/* "host:port" (or "[v6]:port"). */
/* A HOST:PORT by the link's syntax (link/lnk_addr.h: IPv4, [IPv6], an RFC 1123 host name);
 * flags: LNK_ADDR_PORT_ZERO where port 0 means "any free port". The host is kept without
 * brackets. */
static int get_addr(walk_t *w, yaml_node_t *n, unsigned flags, char **host, int *port)
{
    const char *s = scalar(n);
    lnk_addr_t a;
    char why[320];
    if (s == NULL)
        return fail_at(w, n, "expected HOST:PORT");
    if (lnk_addr_parse(s, flags, &a, why, sizeof why) != 0)
        return fail_at(w, n, "%s", why);
    char *d = pc_strdup(a.host);
    if (d == NULL)
        return PC_ERR_NOMEM;
    pc_free(*host);
    *host = d;
    *port = a.port;
    return 0;
}

/* Iterates a mapping: for each pair, sets w->path to prefix.key and calls fn. */
typedef int (*pair_fn)(walk_t *w, const char *key, yaml_node_t *v, void *ud);

static int each_pair(walk_t *w, yaml_node_t *map, const char *prefix, pair_fn fn, void *ud)
{
    if (map == NULL || map->type != YAML_MAPPING_NODE) {
        snprintf(w->path, sizeof w->path, "%s", prefix[0] ? prefix : "(top level)");
        return fail_at(w, map, "expected a mapping");
    }
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(w->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(w->doc, p->value);
        const char *key = scalar(k);
        snprintf(w->path, sizeof w->path, "%s%s%s", prefix, prefix[0] ? "." : "", key ? key : "?");
        if (key == NULL)
            return fail_at(w, k, "keys must be strings");
        w->key = k;
        int rc = fn(w, key, v, ud);
        if (rc != 0)
            return rc;
        snprintf(w->path, sizeof w->path, "%s%s%s", prefix, prefix[0] ? "." : "", key);
    }
    return 0;
}

static int unknown(walk_t *w, yaml_node_t *v)
{
    return fail_at(w, w->key ? w->key : v, "unknown key");
}

/* ---- sections --------------------------------------------------------------------------- */

/* A name that goes into Redis keys or file names: 1-max of [A-Za-z0-9_.-] (a Sentinel master
 * name, a key prefix, which is followed by ':' in every key, or an instance id). */
static int get_name(walk_t *w, yaml_node_t *v, int max, char **out)
{
    const char *s = scalar(v);
    size_t n = s && !is_null(v) ? strlen(s) : 0;
    bool ok = n >= 1 && n <= (size_t)max;
    for (size_t i = 0; ok && i < n; i++)
        ok = isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == '.' || s[i] == '-';
    if (!ok)
        return fail_at(w, v, "expected 1-%d characters of A-Z a-z 0-9 _ . -", max);
    return get_str(w, v, out);
}

/* Appends the items of sequence v to (*arr)[*n], each a HOST:PORT in the link's own syntax
 * (link/lnk_addr.h: IPv4, [IPv6] or an RFC 1123 host name, port 1..65535; names are resolved
 * by the link at every connect): at most max of what (plural), and, with one (singular) not
 * NULL, none twice. */
static int append_addrs(walk_t *w, yaml_node_t *v, int max, const char *what, const char *one,
                        char ***arr, size_t *n)
{
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top;
         it++) {
        yaml_node_t *e = yaml_document_get_node(w->doc, *it);
        lnk_addr_t a;
        char why[200];
        if (scalar(e) == NULL)
            return fail_at(w, e, "expected HOST:PORT");
        if (lnk_addr_parse(scalar(e), 0, &a, why, sizeof why) != 0)
            return fail_at(w, e, "%s", why);
        if (*n + 1 > (size_t)max)
            return fail_at(w, e, "at most %d %s", max, what);
        for (size_t j = 0; one != NULL && j < *n; j++)
            if (strcmp((*arr)[j], scalar(e)) == 0)
                return fail_at(w, e, "%s %s appears twice", one, scalar(e));
        char **r = pc_reallocarray(*arr, *n + 1, sizeof *r);
        if (r == NULL)
            return PC_ERR_NOMEM;
        *arr = r;
        if ((r[*n] = pc_strdup(scalar(e))) == NULL)
            return PC_ERR_NOMEM;
        (*n)++;
    }
    return 0;
}

static int model_pair(walk_t *w, const char *k, yaml_node_t *v, void *ud)
{
    gw_cfg_model_t *m = ud;
    if (strcmp(k, "name") == 0)
        return get_ledger_str(w, v, &m->name);
    if (strcmp(k, "path") == 0) {
        m->path_line = (unsigned long)v->start_mark.line + 1;
        return get_str(w, v, &m->path);
    }
    if (strcmp(k, "min_cache_tokens") == 0)
        return get_u32(w, v, 1, 1u << 24, &m->min_cache_tokens);
    if (strcmp(k, "auto_cache_ttl") == 0) {
        uint32_t ms;
        int rc = get_ms(w, v, 0, UINT32_MAX, &ms);
        if (rc == 0 && ms != 5 * 60000 && ms != 60 * 60000)
            return fail_at(w, v, "must be 5m or 1h");
        m->auto_ttl_ms = ms;
        return rc;
    }
    if (strcmp(k, "context_tokens") == 0)
        return get_u32(w, v, 0, 1u << 24, &m->context_tokens);
    if (strcmp(k, "workers") == 0)
        return get_u32(w, v, 0, GW_CONFIG_MAX_WORKERS, &m->in_process);
    if (strcmp(k, "threads") == 0)
        return get_u32(w, v, 1, 1024, &m->threads);
    if (strcmp(k, "kv_cache") == 0)
        return get_size(w, v, 0, UINT64_MAX, &m->kv_bytes);
    if (strcmp(k, "kv_dtype") == 0) {
        enum eng_kv_dtype t;
        if (scalar(v) == NULL || eng_kv_dtype_parse(scalar(v), &t) != 0)
            return fail_at(w, v, "expected f16, f32 or q8_0");
        m->kv_dtype = (uint32_t)t;
        return 0;
    }
    if (strcmp(k, "backend") == 0) {
        const char *s = scalar(v);
        if (s == NULL || (strcmp(s, "cpu") && strcmp(s, "cuda") && strcmp(s, "auto")))
            return fail_at(w, v, "expected cpu, cuda or auto");
        return get_str(w, v, &m->backend);
    }
    if (strcmp(k, "chat_format") == 0) {
        eng_render_family_t f;
        if (eng_render_family_parse(scalar(v), &f) != 0)
            return fail_at(w, v, "expected one of %s", ENG_RENDER_FAMILIES);
        m->chat_format = (int)f;
        return 0;
    }
    if (strcmp(k, "remote") == 0) {
        if (v->type != YAML_SEQUENCE_NODE)
            return fail_at(w, v, "expected a list of HOST:PORT");
        return append_addrs(w, v, GW_CONFIG_MAX_WORKERS, "workers", NULL, &m->remote, &m->n_remote);
    }
    return unknown(w, v);
}

static int parse_models(walk_t *w, yaml_node_t *v, gw_config_t *c)
{
    if (v->type != YAML_SEQUENCE_NODE || v->data.sequence.items.start == v->data.sequence.items.top)
        return fail_at(w, v, "expected a non-empty list of models");
    for (size_t i = 0; i < c->n_models; i++)
        free_model(&c->models[i]);
    pc_free(c->models);
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    c->models = pc_calloc(n, sizeof *c->models);
    c->n_models = 0;
    if (c->models == NULL)
        return PC_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *e = yaml_document_get_node(w->doc, v->data.sequence.items.start[i]);
        gw_cfg_model_t *m = &c->models[i];
        c->n_models = i + 1;
        m->min_cache_tokens = 1024;
        m->auto_ttl_ms = 5 * 60000;
        m->threads = 1;
        if ((m->backend = pc_strdup("cpu")) == NULL)
            return PC_ERR_NOMEM;
        char prefix[32];
        snprintf(prefix, sizeof prefix, "models[%zu]", i);
        int rc = each_pair(w, e, prefix, model_pair, m);
        if (rc != 0)
            return rc;
        snprintf(w->path, sizeof w->path, "%s", prefix);
        if (m->name == NULL || m->path == NULL)
            return fail_at(w, e, "needs name and path");
        if (m->in_process == 0 && m->n_remote == 0)
            return fail_at(w, e, "needs workers (in-process count) or remote (HOST:PORT list)");
        if (m->in_process + m->n_remote > GW_CONFIG_MAX_WORKERS)
            return fail_at(w, e, "at most %d workers per model", GW_CONFIG_MAX_WORKERS);
        for (size_t j = 0; j < i; j++)
            if (strcmp(c->models[j].name, m->name) == 0)
                return fail_at(w, e, "model name '%s' appears twice", m->name);
    }
    return 0;
}

typedef struct key_ctx {
    char *key, *id, *tenant;
    bool admin;
} key_ctx_t;

static int key_pair(walk_t *w, const char *k, yaml_node_t *v, void *ud)
{
    key_ctx_t *kc = ud;
    if (strcmp(k, "key") == 0)
        return get_secret(w, v, &kc->key);
    if (strcmp(k, "id") == 0)
        return get_ledger_str(w, v, &kc->id);
    if (strcmp(k, "tenant") == 0)
        return get_ledger_str(w, v, &kc->tenant);
    return unknown(w, v);
}

/* A key as configured -> its digest: "sha256:<hex>" or the key itself. */
static int key_digest(walk_t *w, yaml_node_t *n, const char *key, uint8_t out[GW_SHA256_BYTES])
{
    if (strncmp(key, "sha256:", 7) == 0) {
        size_t bin_len = 0;
        if (strlen(key + 7) != 2 * GW_SHA256_BYTES ||
            sodium_hex2bin(out, GW_SHA256_BYTES, key + 7, 2 * GW_SHA256_BYTES, NULL, &bin_len,
                           NULL) != 0 ||
            bin_len != GW_SHA256_BYTES)
            return fail_at(w, n, "sha256: needs 64 hex digits");
        return 0;
    }
    hash_key(key, strlen(key), out);
    return 0;
}

static int parse_keys(walk_t *w, yaml_node_t *v, gw_config_t *c)
{
    if (v->type != YAML_SEQUENCE_NODE)
        return fail_at(w, v, "expected a list of {key, id, tenant}");
    free_keys(c);
    size_t i = 0;
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top;
         it++, i++) {
        yaml_node_t *e = yaml_document_get_node(w->doc, *it);
        key_ctx_t kc = {0};
        char prefix[32];
        snprintf(prefix, sizeof prefix, "api_keys[%zu]", i);
        int rc = each_pair(w, e, prefix, key_pair, &kc);
        snprintf(w->path, sizeof w->path, "%s", prefix);
        if (rc == 0 && (kc.key == NULL || kc.tenant == NULL))
            rc = fail_at(w, e, "needs key and tenant");
        gw_cfg_key_t *nk = NULL;
        if (rc == 0) {
            nk = pc_reallocarray(c->keys, c->n_keys + 1, sizeof *nk);
            rc = nk ? 0 : PC_ERR_NOMEM;
        }
        if (rc == 0) {
            c->keys = nk;
            nk += c->n_keys;
            memset(nk, 0, sizeof *nk);
            rc = key_digest(w, e, kc.key, nk->sha256);
        }
        if (rc == 0) {
            nk->tenant = kc.tenant;
            kc.tenant = NULL;
            if (kc.id) {
                nk->id = kc.id;
                kc.id = NULL;
            } else {
                char hex[17];
                sodium_bin2hex(hex, sizeof hex, nk->sha256, 8);
                char id[32];
                snprintf(id, sizeof id, "key-%s", hex);
                nk->id = pc_strdup(id);
                rc = nk->id ? 0 : PC_ERR_NOMEM;
            }
            c->n_keys++;
        }
        if (kc.key)
            sodium_memzero(kc.key, strlen(kc.key));
        pc_free(kc.key);
        pc_free(kc.id);
        pc_free(kc.tenant);
        if (rc != 0)
            return rc;
        for (size_t j = 0; j + 1 < c->n_keys; j++)
            if (sodium_memcmp(c->keys[j].sha256, c->keys[c->n_keys - 1].sha256, GW_SHA256_BYTES) ==
                0)
                return fail_at(w, e, "the same key appears twice");
    }
    return 0;
}

static int limits_pair(walk_t *w, const char *k, yaml_node_t *v, void *ud)
{
    gw_config_t *c = ud;
    uint64_t b;
    int rc;
    if (strcmp(k, "max_body_bytes") == 0) {
        if ((rc = get_size(w, v, 1024, 1ull << 32, &b)) == 0)
            c->max_body_bytes = (size_t)b;
        return rc;
    }
    if (strcmp(k, "max_header_bytes") == 0) {
        if ((rc = get_size(w, v, 1024, 16u << 20, &b)) == 0)
            c->max_header_bytes = (size_t)b;
        return rc;
    }
    if (strcmp(k, "stream_buffer_bytes") == 0) {
        if ((rc = get_size(w, v, 4096, 1ull << 30, &b)) == 0)
            c->stream_high_water = (size_t)b;
        return rc;
    }
    if (strcmp(k, "max_headers") == 0)
        return get_u32(w, v, 8, 10000, &c->max_headers);
    if (strcmp(k, "max_connections") == 0)
        return get_u32(w, v, 1, 1000000, &c->max_connections);
    if (strcmp(k, "header_timeout") == 0)
        return get_ms(w, v, 10, 3600000, &c->header_timeout_ms);
    if (strcmp(k, "body_timeout") == 0)
        return get_ms(w, v, 10, 3600000, &c->body_timeout_ms);
    if (strcmp(k, "idle_timeout") == 0)
        return get_ms(w, v, 10, 86400000, &c->idle_timeout_ms);
    if (strcmp(k, "shutdown_grace") == 0)
        return get_ms(w, v, 0, 3600000, &c->shutdown_grace_ms);
    /* Connection slots and the body rate (gateway/http.h: "Timeouts", "Connection slots"). */
    if (strcmp(k, "body_min_rate") == 0) {
        if ((rc = get_size(w, v, 0, 1u << 30, &b)) == 0)
            c->body_min_rate = (uint32_t)b;
        return rc;
    }
    if (strcmp(k, "reserved_connections") == 0)
        return get_u32(w, v, 0, 1000000, &c->reserved_connections);
    if (strcmp(k, "max_connections_per_peer") == 0)
        return get_u32(w, v, 0, 1000000, &c->max_connections_per_peer);
    return unknown(w, v);
}

static int cache_pair(walk_t *w, const char *k, yaml_node_t *v, void *ud)
{
    gw_config_t *c = ud;
    if (strcmp(k, "accounting") == 0) {
        const char *s = scalar(v);
        if (s && strcmp(s, "token") == 0)
            c->accounting = GW_ACCOUNTING_TOKEN;
        else if (s && strcmp(s, "anthropic") == 0)
            c->accounting = GW_ACCOUNTING_ANTHROPIC;
        else
            return fail_at(w, v, "expected token or anthropic");
        return 0;
    }
    if (strcmp(k, "max_tokens") == 0)
        return get_u64(w, v, 1024, UINT64_MAX, &c->cache_max_tokens);
    if (strcmp(k, "tokenizer_cache") == 0)
        return get_size(w, v, 0, (uint64_t)1 << 40, &c->tokenizer_cache_bytes);
    /* The wall-clock length of the two TTL classes. Billing still names them 5m and 1h; tests
     * (and operators who want a longer minimum lifetime) change the clock here. */
    if (strcmp(k, "ttl_5m") == 0)
        return get_ms(w, v, 100, 86400000, &c->ttl_5m_ms);
    if (strcmp(k, "ttl_1h") == 0)
        return get_ms(w, v, 100, 7 * 86400000u, &c->ttl_1h_ms);
    if (strcmp(k, "namespace_secret") == 0) {
        char *s = NULL;
        int rc = get_secret(w, v, &s);
        if (rc != 0)
            return rc;
        if (strlen(s) < 16) {
            sodium_memzero(s, strlen(s));
            pc_free(s);
            return fail_at(w, v, "must be at least 16 characters");
        }
        crypto_generichash(c->namespace_secret, sizeof c->namespace_secret,
                           (const unsigned char *)s, strlen(s), NULL, 0);
        c->namespace_secret_is_default = false;
        sodium_memzero(s, strlen(s));
        pc_free(s);
        return 0;
    }
    return unknown(w, v);
}

static int workers_pair(walk_t *w, const char *k, yaml_node_t *v, void *ud)
{
    gw_config_t *c = ud;
    if (strcmp(k, "link_secret") == 0)
        return get_secret(w, v, &c->link_secret);
    if (strcmp(k, "heartbeat") == 0)
        return get_ms(w, v, 50, 600000, &c->worker_heartbeat_ms);
    if (strcmp(k, "connect_timeout") == 0)
        return get_ms(w, v, 50, 600000, &c->worker_connect_timeout_ms);
    return unknown(w, v);
}

static int billing_pair(walk_t *w, const char *k, yaml_node_t *v, void *ud)
{
    gw_config_t *c = ud;
    if (strcmp(k, "ledger_dir") == 0)
        return get_str(w, v, &c->ledger_dir);
    if (strcmp(k, "pricing") == 0) {
        c->pricing_line = (unsigned long)v->start_mark.line + 1;
        return get_str(w, v, &c->pricing_path);
    }
    if (strcmp(k, "instance_id") == 0) {
        /* The ledger's own rule (billing/ledger.h): it names Redis keys and the ledger's
         * INSTANCE file, so serve would refuse anything else at start. */
        int rc = get_name(w, v, BILL_STR_MAX - 1, &c->instance_id);
        c->instance_id_set = rc == 0;
        return rc;
    }
    if (strcmp(k, "fsync") == 0) {
        const char *s = scalar(v);
        if (s && strcmp(s, "always") == 0)
            c->fsync = GW_FSYNC_ALWAYS;
        else if (s && strcmp(s, "batch") == 0)
            c->fsync = GW_FSYNC_BATCH;
        else if (s && strcmp(s, "off") == 0)
            c->fsync = GW_FSYNC_OFF;
        else
            return fail_at(w, v, "expected always, batch or off");
        return 0;
    }
    if (strcmp(k, "fsync_batch") == 0) {
        /* "500us", or a duration in ms ("2ms"); at most 1 s */
        const char *sv = scalar(v);
        size_t sl = sv ? strlen(sv) : 0;
        uint64_t us = 0;
        if (sl > 2 && strcmp(sv + sl - 2, "us") == 0) {
            char num[32];
            if (sl - 2 >= sizeof num)
                return fail_at(w, v, "expected a duration such as 500us or 2ms");
            memcpy(num, sv, sl - 2);
            num[sl - 2] = '\0';
            if (parse_scaled(num, &us, NULL, NULL, 0) != 0)
                return fail_at(w, v, "expected a duration such as 500us or 2ms");
        } else {
            uint32_t ms;
            int rc = get_ms(w, v, 0, 1000, &ms);
            if (rc != 0)
                return rc;
            us = (uint64_t)ms * 1000;
        }
        if (us > 1000000)
            return fail_at(w, v, "at most 1s");
        c->fsync_batch_us = (uint32_t)us;
        return 0;
    }
    if (strcmp(k, "segment_bytes") == 0)
        return get_size(w, v, 4096, 1ull << 40, &c->segment_bytes);
    if (strcmp(k, "verify_on_open") == 0) {
        const char *s = scalar(v);
        if (s == NULL || (strcmp(s, "index") != 0 && strcmp(s, "full") != 0))
            return fail_at(w, v, "expected index or full");
        c->ledger_full_check = strcmp(s, "full") == 0;
        return 0;
    }
    if (strcmp(k, "storage_interval") == 0)
        return get_ms(w, v, 100, 86400000, &c->storage_interval_ms);
    return unknown(w, v);
}

/* Where the keys checked together were given (0: not given), for the cross-key checks at
 * the end of gw_config_parse. */
typedef struct cfg_lines {
    unsigned long redis, redis_address, redis_sentinels, redis_master_name;
    unsigned long registry, registry_timeout; /* registry: the line of registry.enabled */
} cfg_lines_t;

typedef struct cfg_ctx {
    gw_config_t *c;
    cfg_lines_t lines;
} cfg_ctx_t;

static unsigned long line_of(yaml_node_t *n)
{
    return n ? (unsigned long)n->start_mark.line + 1 : 0;
}

#define GW_CONFIG_MAX_SENTINELS 16
#define REDIS_NAME_MAX 32 /* a Sentinel master name or a key prefix */

static int get_sentinels(walk_t *w, yaml_node_t *v, gw_config_t *c)
{
    if (v->type != YAML_SEQUENCE_NODE || v->data.sequence.items.start == v->data.sequence.items.top)
        return fail_at(w, v, "expected a non-empty list of HOST:PORT");
    for (size_t i = 0; i < c->n_redis_sentinels; i++)
        pc_free(c->redis_sentinels[i]);
    c->n_redis_sentinels = 0;
    return append_addrs(w, v, GW_CONFIG_MAX_SENTINELS, "sentinels", "sentinel", &c->redis_sentinels,
                        &c->n_redis_sentinels);
}

static int redis_pair(walk_t *w, const char *k, yaml_node_t *v, void *ud)
{
    cfg_ctx_t *x = ud;
    gw_config_t *c = x->c;
    if (strcmp(k, "address") == 0) {
        x->lines.redis_address = line_of(v);
        return get_addr(w, v, 0, &c->redis_host, &c->redis_port);
    }
    if (strcmp(k, "sentinels") == 0) {
        x->lines.redis_sentinels = line_of(v);
        return get_sentinels(w, v, c);
    }
    if (strcmp(k, "master_name") == 0) {
        x->lines.redis_master_name = line_of(v);
        return get_name(w, v, REDIS_NAME_MAX, &c->redis_master_name);
    }
    if (strcmp(k, "prefix") == 0)
        return get_name(w, v, REDIS_NAME_MAX, &c->redis_prefix);
    if (strcmp(k, "password") == 0)
        return get_secret(w, v, &c->redis_password);
    if (strcmp(k, "timeout") == 0)
        return get_ms(w, v, 10, 600000, &c->redis_timeout_ms);
    return unknown(w, v);
}

static int registry_pair(walk_t *w, const char *k, yaml_node_t *v, void *ud)
{
    cfg_ctx_t *x = ud;
    gw_config_t *c = x->c;
    if (strcmp(k, "enabled") == 0) {
        x->lines.registry = line_of(v);
        return get_bool(w, v, &c->registry_enabled);
    }
    if (strcmp(k, "timeout") == 0) {
        x->lines.registry_timeout = line_of(v);
        return get_ms(w, v, 1, 10000, &c->registry_timeout_ms);
    }
    if (strcmp(k, "claim_ttl") == 0)
        return get_ms(w, v, 1000, 3600000, &c->registry_claim_ttl_ms);
    if (strcmp(k, "lease") == 0)
        return get_ms(w, v, 1000, 600000, &c->registry_lease_ms);
    if (strcmp(k, "feed_maxlen") == 0)
        return get_u32(w, v, 1000, 100000000, &c->registry_feed_maxlen);
    if (strcmp(k, "replay_max") == 0)
        return get_u32(w, v, 1, 10000000, &c->registry_replay_max);
    if (strcmp(k, "failover_replay") == 0)
        return get_ms(w, v, 0, 600000, &c->registry_failover_replay_ms);
    return unknown(w, v);
}

/* The settings that only make sense together (config.h), after the whole file was read. */
static int check_cluster(const char *name, const gw_config_t *c, const cfg_lines_t *ln, char *err,
                         size_t err_len)
{
    if (c->redis_host != NULL && c->n_redis_sentinels > 0)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "%s:%lu: redis.sentinels: give either redis.address (one server) or "
                           "redis.sentinels (Sentinel finds the primary), not both",
                           name, ln->redis_sentinels);
    if (c->n_redis_sentinels > 0 && c->redis_master_name == NULL)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "%s:%lu: redis.sentinels: needs redis.master_name (the name the "
                           "sentinels monitor the primary under)",
                           name, ln->redis_sentinels);
    if (c->redis_master_name != NULL && c->n_redis_sentinels == 0)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "%s:%lu: redis.master_name: only means something with redis.sentinels",
                           name, ln->redis_master_name);
    if (ln->redis != 0 && !gw_config_has_redis(c))
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "%s:%lu: redis: needs address or sentinels (or redis: null for none)",
                           name, ln->redis);
    if (!c->registry_enabled)
        return 0;
    if (!gw_config_has_redis(c))
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "%s:%lu: registry.enabled: the registry lives in Redis: set "
                           "redis.address or redis.sentinels",
                           name, ln->registry);
    if (c->namespace_secret_is_default)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "%s:%lu: registry.enabled: needs cache.namespace_secret (the built-in "
                           "demo secret is refused with a registry: every gateway must derive "
                           "the same namespaces from the same real secret)",
                           name, ln->registry);
    if (!c->instance_id_set)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "%s:%lu: registry.enabled: needs an explicit billing.instance_id, "
                           "unique per gateway (it names the gateway's registration, claims and "
                           "ledger stream in Redis)",
                           name, ln->registry);
    if (c->registry_timeout_ms >= c->registry_claim_ttl_ms ||
        c->registry_timeout_ms >= c->registry_lease_ms)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "%s:%lu: registry.timeout: %ums must be below registry.claim_ttl "
                           "(%ums) and registry.lease (%ums)",
                           name, ln->registry_timeout ? ln->registry_timeout : ln->registry,
                           c->registry_timeout_ms, c->registry_claim_ttl_ms, c->registry_lease_ms);
    return 0;
}

static int log_pair(walk_t *w, const char *k, yaml_node_t *v, void *ud)
{
    gw_config_t *c = ud;
    if (strcmp(k, "access_log") == 0)
        return get_str(w, v, &c->access_log);
    if (strcmp(k, "level") == 0) {
        const char *s = scalar(v);
        if (s == NULL ||
            (strcmp(s, "debug") && strcmp(s, "info") && strcmp(s, "warn") && strcmp(s, "error")))
            return fail_at(w, v, "expected debug, info, warn or error");
        return get_str(w, v, &c->log_level);
    }
    return unknown(w, v);
}

static int metrics_pair(walk_t *w, const char *k, yaml_node_t *v, void *ud)
{
    gw_config_t *c = ud;
    if (strcmp(k, "per_tenant") == 0)
        return get_bool(w, v, &c->per_tenant_metrics);
    if (strcmp(k, "require_key") == 0)
        return get_bool(w, v, &c->metrics_require_key);
    return unknown(w, v);
}

static int server_pair(walk_t *w, const char *k, yaml_node_t *v, void *ud)
{
    gw_config_t *c = ud;
    if (strcmp(k, "allow_demo_secrets_on_public") == 0)
        return get_bool(w, v, &c->allow_demo_secrets_on_public);
    return unknown(w, v);
}

static int tiers_pair(walk_t *w, const char *k, yaml_node_t *v, void *ud)
{
    gw_cfg_tiers_t *t = ud;
    if (strcmp(k, "dir") == 0) {
        int rc = get_str(w, v, &t->dir);
        if (rc == 0 && t->dir[0] == '\0')
            return fail_at(w, v, "must not be empty (kv_tiers: null turns the tiers off)");
        t->dir_line = (unsigned long)v->start_mark.line + 1;
        return rc;
    }
    if (strcmp(k, "max_bytes") == 0) /* at least a few blocks of any model */
        return get_size(w, v, 16ull << 20, UINT64_MAX, &t->max_bytes);
    if (strcmp(k, "g2_bytes") == 0)
        return get_size(w, v, 0, UINT64_MAX, &t->g2_bytes);
    if (strcmp(k, "write_through") == 0)
        return get_bool(w, v, &t->write_through);
    if (strcmp(k, "min_tokens") == 0)
        return get_u32(w, v, 0, UINT32_MAX, &t->min_tokens);
    if (strcmp(k, "key_file") == 0) {
        sodium_memzero(t->key, sizeof t->key);
        t->has_key = false;
        if (is_null(v)) {
            pc_free(t->key_file);
            t->key_file = NULL;
            return 0;
        }
        int rc = get_str(w, v, &t->key_file);
        char why[320];
        if (rc == 0 && eng_worker_tier_key_read(t->key_file, t->key, why, sizeof why) != 0)
            return fail_at(w, v, "%s", why);
        t->has_key = rc == 0;
        return rc;
    }
    return unknown(w, v);
}

/* kv_tiers: null (off) or a mapping, which needs dir. */
static int parse_tiers(walk_t *w, yaml_node_t *v, gw_config_t *c)
{
    tiers_free(&c->kv_tiers);
    tiers_defaults(&c->kv_tiers);
    if (is_null(v))
        return 0;
    yaml_node_t *at = w->key; /* the line of "kv_tiers:" */
    int rc = each_pair(w, v, "kv_tiers", tiers_pair, &c->kv_tiers);
    if (rc == 0 && c->kv_tiers.dir == NULL) {
        snprintf(w->path, sizeof w->path, "kv_tiers");
        return fail_at(w, at, "needs dir (or kv_tiers: null to turn the tiers off)");
    }
    return rc;
}

static int top_pair(walk_t *w, const char *k, yaml_node_t *v, void *ud)
{
    cfg_ctx_t *x = ud;
    gw_config_t *c = x->c;
    if (strcmp(k, "listen") == 0)
        return get_addr(w, v, LNK_ADDR_PORT_ZERO, &c->listen_host, &c->listen_port);
    if (strcmp(k, "models") == 0)
        return parse_models(w, v, c);
    if (strcmp(k, "api_keys") == 0)
        return parse_keys(w, v, c);
    if (strcmp(k, "admin_key") == 0) {
        if (is_null(v)) {
            c->has_admin_key = false;
            return 0;
        }
        char *s = NULL;
        int rc = get_secret(w, v, &s);
        if (rc == 0)
            rc = key_digest(w, v, s, c->admin_sha256);
        if (s)
            sodium_memzero(s, strlen(s));
        pc_free(s);
        c->has_admin_key = rc == 0;
        return rc;
    }
    if (strcmp(k, "workers") == 0)
        return each_pair(w, v, "workers", workers_pair, c);
    if (strcmp(k, "limits") == 0)
        return each_pair(w, v, "limits", limits_pair, c);
    if (strcmp(k, "cache") == 0)
        return each_pair(w, v, "cache", cache_pair, c);
    if (strcmp(k, "billing") == 0)
        return each_pair(w, v, "billing", billing_pair, c);
    if (strcmp(k, "redis") == 0) {
        if (is_null(v))
            return 0;
        x->lines.redis = line_of(w->key);
        return each_pair(w, v, "redis", redis_pair, x);
    }
    if (strcmp(k, "registry") == 0)
        return is_null(v) ? 0 : each_pair(w, v, "registry", registry_pair, x);
    if (strcmp(k, "log") == 0)
        return each_pair(w, v, "log", log_pair, c);
    if (strcmp(k, "metrics") == 0)
        return each_pair(w, v, "metrics", metrics_pair, c);
    if (strcmp(k, "server") == 0)
        return each_pair(w, v, "server", server_pair, c);
    if (strcmp(k, "kv_tiers") == 0)
        return parse_tiers(w, v, c);
    return unknown(w, v);
}

int gw_config_parse(const char *name, const char *yaml, size_t len, gw_config_t *out, char *err,
                    size_t err_len)
{
    yaml_parser_t parser;
    yaml_document_t doc;
    gw_config_t c;
    int rc = gw_config_default(&c);
    if (rc != 0)
        return pc_err_setf(err, err_len, rc, "%s: out of memory", name);
    if (!yaml_parser_initialize(&parser)) {
        gw_config_free(&c);
        return pc_err_setf(err, err_len, PC_ERR_NOMEM, "%s: out of memory", name);
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    if (!yaml_parser_load(&parser, &doc)) {
        rc = pc_err_setf(err, err_len, PC_ERR_FORMAT, "%s:%lu: YAML: %s", name,
                         (unsigned long)parser.problem_mark.line + 1,
                         parser.problem ? parser.problem : "syntax error");
        yaml_parser_delete(&parser);
        gw_config_free(&c);
        return rc;
    }
    walk_t w = {.doc = &doc, .name = name, .err = err, .err_len = err_len};
    cfg_ctx_t x = {.c = &c};
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root != NULL && !is_null(root))
        rc = each_pair(&w, root, "", top_pair, &x);
    if (rc == 0)
        rc = check_cluster(name, &c, &x.lines, err, err_len);
    if (rc == 0 && c.metrics_require_key && !c.has_admin_key)
        rc = pc_err_setf(err, err_len, PC_ERR_INVAL,
                         "%s: metrics.require_key: /metrics needs the admin key, and admin_key is "
                         "null: set admin_key, or metrics.require_key: false",
                         name);
    if (rc == 0) {
        pc_free(c.source);
        c.source = pc_strdup(name);
        rc = c.source ? 0 : PC_ERR_NOMEM;
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    if (rc != 0) {
        if (rc == PC_ERR_NOMEM)
            pc_err_setf(err, err_len, rc, "%s: out of memory", name);
        gw_config_free(&c);
        return rc;
    }
    *out = c;
    return 0;
}

/* The files a config names must be readable: found by check-config, not at the first request. */
static int check_files(const char *name, const gw_config_t *c, char *err, size_t err_len)
{
    for (size_t i = 0; i < c->n_models; i++)
        if (access(c->models[i].path, R_OK) != 0)
            return pc_err_setf(err, err_len, PC_ERR_INVAL,
                               "%s:%lu: models[%zu].path: cannot read %s: %s", name,
                               c->models[i].path_line, i, c->models[i].path, strerror(errno));
    if (access(c->pricing_path, R_OK) != 0)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "%s:%lu: billing.pricing: cannot read %s: %s", name, c->pricing_line,
                           c->pricing_path, strerror(errno));
    return 0;
}

int gw_config_load(const char *path, gw_config_t *out, char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return pc_err_setf(err, err_len, PC_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    pc_buf_t b = {0};
    char chunk[8192];
    size_t n;
    int rc = 0;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        if ((rc = pc_buf_append(&b, chunk, n)) != 0)
            break;
    bool bad = ferror(f);
    fclose(f);
    if (rc == 0 && bad)
        rc = pc_err_setf(err, err_len, PC_ERR_IO, "cannot read %s", path);
    else if (rc != 0)
        pc_err_setf(err, err_len, rc, "%s: out of memory", path);
    if (rc == 0)
        rc = gw_config_parse(path, b.len ? b.base : "", b.len, out, err, err_len);
    pc_buf_free(&b);
    if (rc == 0 && (rc = check_files(path, out, err, err_len)) != 0)
        gw_config_free(out);
    return rc;
}

/* ---- queries ---------------------------------------------------------------------------- */

const gw_cfg_model_t *gw_config_model(const gw_config_t *c, const char *name, size_t len)
{
    for (size_t i = 0; i < c->n_models; i++)
        if (strlen(c->models[i].name) == len && memcmp(c->models[i].name, name, len) == 0)
            return &c->models[i];
    return NULL;
}

const gw_cfg_key_t *gw_config_key_find(const gw_config_t *c, const char *key, size_t len)
{
    uint8_t h[GW_SHA256_BYTES];
    hash_key(key, len, h);
    const gw_cfg_key_t *found = NULL;
    for (size_t i = 0; i < c->n_keys; i++) /* every key is compared: no early exit */
        if (sodium_memcmp(h, c->keys[i].sha256, GW_SHA256_BYTES) == 0)
            found = &c->keys[i];
    return found;
}

bool gw_config_is_admin(const gw_config_t *c, const char *key, size_t len)
{
    uint8_t h[GW_SHA256_BYTES];
    hash_key(key, len, h);
    return c->has_admin_key && sodium_memcmp(h, c->admin_sha256, GW_SHA256_BYTES) == 0;
}

/* ---- protected mode and /metrics -------------------------------------------------------- */

static bool is_loopback(const char *host)
{
    if (strcmp(host, "localhost") == 0 || strcmp(host, "::1") == 0)
        return true;
    /* 127.0.0.0/8 in dotted-quad form: four decimal parts, the first 127. */
    unsigned a, b, cc, d;
    char tail;
    return sscanf(host, "%u.%u.%u.%u%c", &a, &b, &cc, &d, &tail) == 4 && a == 127 && b <= 255 &&
           cc <= 255 && d <= 255;
}

int gw_config_check_exposure(const gw_config_t *c, const char *listen_host, char *err,
                             size_t err_len)
{
    static const char *const demo_keys[] = {"sk-kvgw-demo", "sk-kvgw-demo2"};
    const char *host = listen_host != NULL ? listen_host : c->listen_host;
    if (is_loopback(host) || c->allow_demo_secrets_on_public)
        return 0;
    char what[256] = "";
    size_t n = 0;
    if (c->namespace_secret_is_default)
        n += (size_t)snprintf(what + n, sizeof what - n, "%sthe built-in cache.namespace_secret",
                              n ? ", " : "");
    for (size_t i = 0; i < PC_ARRAY_LEN(demo_keys) && n < sizeof what; i++)
        if (gw_config_key_find(c, demo_keys[i], strlen(demo_keys[i])) != NULL)
            n += (size_t)snprintf(what + n, sizeof what - n, "%sthe demo API key %s", n ? ", " : "",
                                  demo_keys[i]);
    if (n < sizeof what && gw_config_is_admin(c, "sk-kvgw-admin", strlen("sk-kvgw-admin")))
        n += (size_t)snprintf(what + n, sizeof what - n, "%sthe demo admin_key sk-kvgw-admin",
                              n ? ", " : "");
    if (n == 0)
        return 0;
    return pc_err_setf(err, err_len, PC_ERR_INVAL,
                       "refusing to listen on %s, which is not a loopback address, with %s: "
                       "these are published with kvgw, so anyone who reaches the port could use "
                       "them. Set your own secrets (env:NAME or file:PATH, see conf/README.md), "
                       "listen on 127.0.0.1, or, to accept the risk, set "
                       "server.allow_demo_secrets_on_public: true",
                       host, what);
}

int gw_config_metrics_auth(const gw_config_t *c, const char *x_api_key, const char *authorization)
{
    if (!c->metrics_require_key)
        return 0;
    const char *key = x_api_key;
    if (key == NULL && authorization != NULL && strncasecmp(authorization, "Bearer ", 7) == 0)
        key = authorization + 7;
    if (key == NULL)
        return 401;
    return gw_config_is_admin(c, key, strlen(key)) ? 0 : 403;
}

static const char *ttl_name(uint32_t ms)
{
    return ms == 60 * 60000 ? "1h" : "5m";
}

int gw_config_print(const gw_config_t *c, pc_buf_t *o)
{
    static const char *const acc[] = {"token", "anthropic"};
    static const char *const fs[] = {"always", "batch", "off"};
    int rc = pc_buf_printf(o, "# effective configuration of %s\nlisten: %s:%d\nmodels:\n",
                           c->source, c->listen_host, c->listen_port);
    for (size_t i = 0; rc == 0 && i < c->n_models; i++) {
        const gw_cfg_model_t *m = &c->models[i];
        rc = pc_buf_printf(o,
                           "  - name: %s\n    path: %s\n    min_cache_tokens: %u\n"
                           "    auto_cache_ttl: %s\n    context_tokens: %u\n    workers: %u\n"
                           "    threads: %u\n    kv_cache: %llu\n    kv_dtype: %s\n"
                           "    backend: %s\n    remote: [",
                           m->name, m->path, m->min_cache_tokens, ttl_name(m->auto_ttl_ms),
                           m->context_tokens, m->in_process, m->threads,
                           (unsigned long long)m->kv_bytes,
                           eng_kv_dtype_name((enum eng_kv_dtype)m->kv_dtype), m->backend);
        for (size_t j = 0; rc == 0 && j < m->n_remote; j++)
            rc = pc_buf_printf(o, "%s%s", j ? ", " : "", m->remote[j]);
        if (rc == 0)
            rc = pc_buf_append_cstr(o, "]\n");
        if (rc == 0 && m->chat_format != 0)
            rc = pc_buf_printf(o, "    chat_format: %s\n",
                               eng_render_family_name((eng_render_family_t)m->chat_format));
    }
    if (rc == 0)
        rc = pc_buf_append_cstr(o, "api_keys:\n");
    for (size_t i = 0; rc == 0 && i < c->n_keys; i++)
        rc = pc_buf_printf(o, "  - {id: %s, tenant: %s, key: <set>}\n", c->keys[i].id,
                           c->keys[i].tenant);
    if (rc == 0)
        rc = pc_buf_printf(
            o,
            "admin_key: %s\nworkers:\n  link_secret: %s\n  heartbeat: %ums\n"
            "  connect_timeout: %ums\nlimits:\n  max_body_bytes: %zu\n  max_header_bytes: %zu\n"
            "  max_headers: %u\n  header_timeout: %ums\n  body_timeout: %ums\n"
            "  idle_timeout: %ums\n  max_connections: %u\n  body_min_rate: %u\n"
            "  reserved_connections: %u\n  max_connections_per_peer: %u\n"
            "  stream_buffer_bytes: %zu\n"
            "  shutdown_grace: %ums\ncache:\n  accounting: %s\n  max_tokens: %llu\n"
            "  ttl_5m: %ums\n  ttl_1h: %ums\n  tokenizer_cache: %llu\n"
            "  namespace_secret: %s\nbilling:\n  ledger_dir: %s\n  pricing: %s\n"
            "  instance_id: %s\n  fsync: %s\n  fsync_batch: %uus\n  segment_bytes: %llu\n"
            "  verify_on_open: %s\n  storage_interval: %ums\n",
            c->has_admin_key ? "<set>" : "null", c->link_secret ? "<set>" : "<none>",
            c->worker_heartbeat_ms, c->worker_connect_timeout_ms, c->max_body_bytes,
            c->max_header_bytes, c->max_headers, c->header_timeout_ms, c->body_timeout_ms,
            c->idle_timeout_ms, c->max_connections, c->body_min_rate, c->reserved_connections,
            c->max_connections_per_peer, c->stream_high_water, c->shutdown_grace_ms,
            acc[c->accounting], (unsigned long long)c->cache_max_tokens, c->ttl_5m_ms, c->ttl_1h_ms,
            (unsigned long long)c->tokenizer_cache_bytes,
            c->namespace_secret_is_default ? "<built-in demo secret>" : "<set>", c->ledger_dir,
            c->pricing_path, c->instance_id, fs[c->fsync], c->fsync_batch_us,
            (unsigned long long)c->segment_bytes, c->ledger_full_check ? "full" : "index",
            c->storage_interval_ms);
    if (rc == 0 && c->redis_host)
        rc = pc_buf_printf(o, "redis:\n  address: %s:%d\n", c->redis_host, c->redis_port);
    else if (rc == 0 && c->n_redis_sentinels > 0) {
        rc = pc_buf_append_cstr(o, "redis:\n  sentinels: [");
        for (size_t i = 0; rc == 0 && i < c->n_redis_sentinels; i++)
            rc = pc_buf_printf(o, "%s'%s'", i ? ", " : "", c->redis_sentinels[i]);
        if (rc == 0)
            rc = pc_buf_printf(o, "]\n  master_name: %s\n", c->redis_master_name);
    } else if (rc == 0)
        rc = pc_buf_append_cstr(o, "redis: null\n");
    if (rc == 0 && gw_config_has_redis(c))
        rc = pc_buf_printf(o, "  password: %s\n  prefix: %s\n  timeout: %ums\n",
                           c->redis_password ? "<set>" : "<none>", c->redis_prefix,
                           c->redis_timeout_ms);
    if (rc == 0 && c->registry_enabled)
        rc = pc_buf_printf(o,
                           "registry:\n  enabled: true\n  timeout: %ums\n  claim_ttl: %ums\n"
                           "  lease: %ums\n  feed_maxlen: %u\n  replay_max: %u\n"
                           "  failover_replay: %ums\n",
                           c->registry_timeout_ms, c->registry_claim_ttl_ms, c->registry_lease_ms,
                           c->registry_feed_maxlen, c->registry_replay_max,
                           c->registry_failover_replay_ms);
    else if (rc == 0)
        rc = pc_buf_append_cstr(o, "registry: null\n");
    if (rc == 0)
        rc = pc_buf_printf(o,
                           "log:\n  access_log: %s\n  level: %s\nmetrics:\n  per_tenant: %s\n"
                           "  require_key: %s\nserver:\n  allow_demo_secrets_on_public: %s\n",
                           c->access_log, c->log_level, c->per_tenant_metrics ? "true" : "false",
                           c->metrics_require_key ? "true" : "false",
                           c->allow_demo_secrets_on_public ? "true" : "false");
    const gw_cfg_tiers_t *t = &c->kv_tiers;
    if (rc == 0 && t->dir != NULL)
        rc = pc_buf_printf(o,
                           "kv_tiers:\n  dir: %s\n  max_bytes: %llu\n  g2_bytes: %llu\n"
                           "  write_through: %s\n  min_tokens: %u\n  key_file: %s\n",
                           t->dir, (unsigned long long)t->max_bytes,
                           (unsigned long long)t->g2_bytes, t->write_through ? "true" : "false",
                           t->min_tokens, t->key_file ? t->key_file : "null");
    else if (rc == 0)
        rc = pc_buf_append_cstr(o, "kv_tiers: null\n");
    return rc;
}

int gw_config_tier_dir(const gw_config_t *c, const gw_cfg_model_t *m, uint32_t worker, char *out,
                       size_t out_len)
{
    if (c->kv_tiers.dir == NULL)
        return PC_ERR_STATE;
    bool plain = m->name[0] != '\0' && m->name[0] != '.';
    for (const char *p = m->name; plain && *p; p++)
        plain = isalnum((unsigned char)*p) || *p == '.' || *p == '_' || *p == '-';
    int n;
    if (plain) {
        n = snprintf(out, out_len, "%s/%s/w%u", c->kv_tiers.dir, m->name, worker);
    } else {
        uint8_t h[16];
        char hex[2 * sizeof h + 1];
        crypto_generichash(h, sizeof h, (const unsigned char *)m->name, strlen(m->name), NULL, 0);
        sodium_bin2hex(hex, sizeof hex, h, 8);
        n = snprintf(out, out_len, "%s/m-%s/w%u", c->kv_tiers.dir, hex, worker);
    }
    return n < 0 || (size_t)n >= out_len ? PC_ERR_RANGE : 0;
}
