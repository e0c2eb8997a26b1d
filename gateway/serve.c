/*
 * serve.c — `kvgw serve` (serve.h): the wiring. Startup and teardown, the dispatch of HTTP
 * requests to their endpoints, signals. The request object is request.c, the usage export
 * admin.c, metrics / access log / tick observe.c (serve_internal.h says who does what).
 */
#include "serve.h"

#include <errno.h>
#include <signal.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api.h"
#include "dashboard.h"
#include "gguf.h"
#include "hparams.h"
#include "lnk_addr.h"
#include "request.h"
#include "vocab.h"

#define SERVE_EXIT_FAIL 1 /* gw_serve's exit status on a failure (0: a clean stop) */

/* ---- protocol errors --------------------------------------------------------------------- */

static gw_api_kind_t kind_for_path(const char *path)
{
    return strncmp(path, "/v1/chat/", 9) == 0 ? GW_API_OPENAI_CHAT : GW_API_ANTHROPIC_MESSAGES;
}

/* Protocol errors from the HTTP layer, in the API's shape for the path. */
static void format_http_error(const char *path, int status, const char *type, const char *message,
                              const char *request_id, pc_buf_t *out, void *ud)
{
    (void)type;
    (void)ud;
    gw_api_kind_t k = kind_for_path(path ? path : "");
    gw_api_error_t e;
    gw_api_error_set(&e, k, status, "%s", message);
    gw_api_error_render(k, &e, request_id, out);
}

/* ---- simple endpoints -------------------------------------------------------------------- */

static void models_list(gw_req_t *q, bool anthropic)
{
    serve_t *s = q->s;
    pc_buf_t b = {0};
    if (anthropic) {
        pc_buf_append_cstr(&b, "{\"data\":[");
        for (size_t i = 0; i < s->n_models; i++) {
            pc_buf_printf(&b, "%s{\"type\":\"model\",\"id\":", i ? "," : "");
            pc_json_string(&b, s->models[i].cfg->name, strlen(s->models[i].cfg->name),
                           PC_JSON_UTF8);
            pc_buf_append_cstr(&b, ",\"display_name\":");
            pc_json_string(&b, s->models[i].cfg->name, strlen(s->models[i].cfg->name),
                           PC_JSON_UTF8);
            pc_buf_append_cstr(&b, ",\"created_at\":\"2026-01-01T00:00:00Z\"}");
        }
        pc_buf_append_cstr(&b, "],\"has_more\":false,\"first_id\":");
        pc_json_string(&b, s->models[0].cfg->name, strlen(s->models[0].cfg->name), PC_JSON_UTF8);
        pc_buf_append_cstr(&b, ",\"last_id\":");
        pc_json_string(&b, s->models[s->n_models - 1].cfg->name,
                       strlen(s->models[s->n_models - 1].cfg->name), PC_JSON_UTF8);
        pc_buf_append_cstr(&b, "}");
    } else {
        pc_buf_append_cstr(&b, "{\"object\":\"list\",\"data\":[");
        for (size_t i = 0; i < s->n_models; i++) {
            pc_buf_printf(&b, "%s{\"id\":", i ? "," : "");
            pc_json_string(&b, s->models[i].cfg->name, strlen(s->models[i].cfg->name),
                           PC_JSON_UTF8);
            pc_buf_append_cstr(&b, ",\"object\":\"model\",\"created\":1767225600,"
                                   "\"owned_by\":\"kvgw\"}");
        }
        pc_buf_append_cstr(&b, "]}");
    }
    gw__req_respond(q, 200, "application/json", b.base, b.len);
    pc_buf_free(&b);
}

static void metrics_endpoint(gw_req_t *q)
{
    /* The admin key (metrics.require_key): per-tenant series name every tenant. */
    int st = gw_config_metrics_auth(&q->s->cfg, gw_http_req_header(q->http, "x-api-key"),
                                    gw_http_req_header(q->http, "authorization"));
    if (st != 0) {
        gw__req_respond_errorf(q, st, "%s",
                               st == 401
                                   ? "/metrics needs the admin key (x-api-key or Authorization: "
                                     "Bearer)"
                                   : "/metrics needs the admin key");
        return;
    }
    gw__obs_update_gauges(q->s);
    pc_buf_t b = {0};
    gw_metrics_render(q->s->m, &b);
    gw__req_respond(q, 200, "text/plain; version=0.0.4; charset=utf-8", b.base ? b.base : "",
                    b.len);
    pc_buf_free(&b);
}

/* The client's key: x-api-key, else Authorization: Bearer. */
static const char *client_key(gw_http_req_t *r)
{
    const char *k = gw_http_req_header(r, "x-api-key");
    if (k != NULL)
        return k;
    const char *a = gw_http_req_header(r, "authorization");
    if (a != NULL && strncasecmp(a, "Bearer ", 7) == 0)
        return a + 7;
    return NULL;
}

static void on_request(gw_http_req_t *r, void *ud)
{
    serve_t *s = ud;
    gw_req_t *q = gw__req_new(s, r);
    if (q == NULL) {
        gw_http_respond(r, 500, NULL, 0, "", 0);
        return;
    }
    const char *method = gw_http_req_method(r), *path = gw_http_req_path(r);
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    bool post = strcmp(method, "POST") == 0;

    if (get && strcmp(path, "/healthz") == 0) {
        q->endpoint = "health";
        if (s->reg != NULL) {
            /* Degraded (Redis down, fenced) still serves: from this gateway's own view. */
            static const char *const st[] = {"down", "up", "fenced"};
            char b[64];
            int n =
                snprintf(b, sizeof b, "{\"status\":\"ok\",\"registry\":\"%s\"}", st[s->reg_state]);
            gw__req_respond(q, 200, "application/json", b, (size_t)n);
        } else {
            gw__req_respond(q, 200, "application/json", "{\"status\":\"ok\"}", 15);
        }
    } else if (get && strcmp(path, "/dashboard") == 0) {
        /* The page itself holds no data: it reads /metrics (the admin key is kept in the URL
         * fragment, which never reaches the server). */
        q->endpoint = "dashboard";
        pc_buf_t b = {0};
        if (gw_dashboard_page(&b) == 0)
            gw__req_respond(q, 200, "text/html; charset=utf-8", b.base, b.len);
        else
            gw__req_respond_errorf(q, 500, "%s", "out of memory");
        pc_buf_free(&b);
    } else if (get && strcmp(path, "/readyz") == 0) {
        q->endpoint = "health";
        bool ready = !s->stopping && bill_ledger_status(s->ledger) == 0;
        for (size_t i = 0; i < s->n_models; i++)
            ready = ready && gw_pool_model_up(s->pool, (uint32_t)i);
        if (ready)
            gw__req_respond(q, 200, "application/json", "{\"status\":\"ready\"}", 18);
        else
            gw__req_respond(q, 503, "application/json", "{\"status\":\"not ready\"}", 22);
    } else if (get && strcmp(path, "/metrics") == 0) {
        q->endpoint = "metrics";
        metrics_endpoint(q);
    } else if (get && strcmp(path, "/v1/models") == 0) {
        q->endpoint = "models";
        const char *key = client_key(r);
        if (key == NULL || gw_config_key_find(&s->cfg, key, strlen(key)) == NULL)
            gw__req_respond_errorf(q, 401, "%s",
                                   key ? "invalid x-api-key" : "x-api-key header is required");
        else {
            gw_http_req_set_trusted(r);
            models_list(q, gw_http_req_header(r, "anthropic-version") != NULL);
        }
    } else if (post && (strcmp(path, "/v1/messages") == 0 ||
                        strcmp(path, "/v1/messages/count_tokens") == 0 ||
                        strcmp(path, "/v1/chat/completions") == 0)) {
        if (strcmp(path, "/v1/messages/count_tokens") == 0)
            q->kind = GW_API_ANTHROPIC_COUNT_TOKENS;
        q->endpoint = q->kind == GW_API_OPENAI_CHAT              ? "chat_completions"
                      : q->kind == GW_API_ANTHROPIC_COUNT_TOKENS ? "count_tokens"
                                                                 : "messages";
        const char *key = client_key(r);
        q->key = key ? gw_config_key_find(&s->cfg, key, strlen(key)) : NULL;
        if (q->key == NULL) {
            if (q->kind == GW_API_OPENAI_CHAT)
                gw__req_respond_errorf(
                    q, 401, "%s",
                    key ? "Incorrect API key provided."
                        : "You didn't provide an API key. You need to provide your "
                          "API key in an Authorization header using Bearer auth "
                          "(i.e. Authorization: Bearer YOUR_KEY).");
            else
                gw__req_respond_errorf(q, 401, "%s",
                                       key ? "invalid x-api-key" : "x-api-key header is required");
        } else {
            gw_http_req_set_trusted(r); /* a valid key: the connection keeps its slot */
            gw__req_start_api(q);       /* the request path owns q now */
            return;
        }
    } else if (get && strncmp(path, "/admin/", 7) == 0) {
        const char *key = client_key(r);
        if (key == NULL || !gw_config_is_admin(&s->cfg, key, strlen(key)))
            gw__req_respond_errorf(q, key ? 403 : 401, "%s",
                                   key ? "this endpoint needs the admin key"
                                       : "x-api-key header is required");
        else if (strcmp(path, "/admin/v1/usage") == 0) {
            gw_http_req_set_trusted(r);
            q->endpoint = "admin_usage";
            if (gw__admin_usage(q, gw_http_req_query(r)))
                return; /* streaming: the export job owns q now */
        } else
            gw__req_respond_errorf(q, 404, "Not found: %s", path);
    } else if (strcmp(path, "/v1/messages") == 0 || strcmp(path, "/v1/chat/completions") == 0 ||
               strcmp(path, "/v1/models") == 0 || strcmp(path, "/metrics") == 0 ||
               strcmp(path, "/healthz") == 0 || strcmp(path, "/readyz") == 0) {
        gw__req_respond_errorf(q, 405, "Method %s not allowed", method);
    } else {
        gw__req_respond_errorf(q, 404, "Not found: %s", path);
    }
    gw__req_free(q);
}

/* ---- the registry (many gateways, one cache) --------------------------------------------- */

/* A worker's own name is usable as its identity when it is printable ASCII without spaces and
 * fits the registry's names. */
static bool node_usable(const char *node)
{
    size_t n = strlen(node);
    if (n == 0 || n > GW_REGISTRY_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)node[i] <= 0x20 || (unsigned char)node[i] >= 0x7f)
            return false;
    return true;
}

const char *gw__serve_worker_id(const serve_t *s, uint32_t i, char *buf, size_t cap)
{
    const gw_pool_worker_t *w = gw_pool_worker(s->pool, i);
    if (!w->remote) {
        snprintf(buf, cap, "%s/%s", s->cfg.instance_id, w->name);
        return buf;
    }
    bool unique = node_usable(w->node);
    for (uint32_t j = 0; unique && j < gw_pool_n_workers(s->pool); j++)
        unique = j == i || strcmp(gw_pool_worker(s->pool, j)->node, w->node) != 0;
    snprintf(buf, cap, "%s", unique ? w->node : w->name);
    return buf;
}

int gw__serve_worker_by_id(const serve_t *s, const char *id, uint32_t model)
{
    char buf[GW_REGISTRY_NAME_MAX + 1];
    for (uint32_t i = 0; s->pool != NULL && i < gw_pool_n_workers(s->pool); i++)
        if (gw_pool_worker(s->pool, i)->model == model &&
            strcmp(gw__serve_worker_id(s, i, buf, sizeof buf), id) == 0)
            return (int)i;
    return -1;
}

bool gw__serve_ns_owner(const serve_t *s, uint64_t ns, const char **tenant, uint32_t *model)
{
    const gw_ns_info_t *info = gw_ns_tab_lookup(&s->ns, ns);
    if (info != NULL) {
        *tenant = info->tenant;
        *model = info->model;
        return true;
    }
    const gw_ns_owner_t *o = pc_u64map_get(&s->ns_owners, ns);
    if (o == NULL)
        return false;
    *tenant = o->tenant;
    *model = o->model;
    return true;
}

/* Every namespace derived without a cache_salt, tenant x model, with its owner (a feed event of
 * a gateway older than t=w's owner fields names a namespace only, and an entry needs its owner
 * for storage billing); and the configured tenants by name, for the events that name theirs. */
static int build_ns_owners(serve_t *s)
{
    for (size_t i = 0; i < s->cfg.n_keys; i++)
        if (pc_strmap_insert(&s->feed_tenants, s->cfg.keys[i].tenant, strlen(s->cfg.keys[i].tenant),
                             (uint64_t)(uintptr_t)s->cfg.keys[i].tenant, NULL) < 0)
            return PC_ERR_NOMEM;
    size_t n = s->cfg.n_keys * s->n_models;
    s->ns_owner_tab = pc_calloc(n ? n : 1, sizeof *s->ns_owner_tab);
    if (s->ns_owner_tab == NULL)
        return PC_ERR_NOMEM;
    size_t k = 0;
    for (size_t i = 0; i < s->cfg.n_keys; i++)
        for (uint32_t m = 0; m < s->n_models; m++) {
            uint64_t ns =
                gw_namespace_of(s->cfg.namespace_secret, s->cfg.keys[i].tenant,
                                pc_slice_cstr(s->models[m].cfg->name), false, (pc_slice_t){0});
            if (pc_u64map_get(&s->ns_owners, ns) != NULL) /* another key of the same tenant */
                continue;
            s->ns_owner_tab[k] = (gw_ns_owner_t){s->cfg.keys[i].tenant, m};
            if (pc_u64map_put(&s->ns_owners, ns, &s->ns_owner_tab[k++]) != 0)
                return PC_ERR_NOMEM;
        }
    return 0;
}

int gw__serve_replica_write(serve_t *s, uint64_t ns, const char *tenant, uint32_t model,
                            const uint32_t *tokens, const gw_registry_feed_point_t *points,
                            size_t n_points, uint64_t now_ms)
{
    size_t i = 0;
    while (i < n_points) {
        /* A run of points with the same start (expiry - TTL: one commit's points share it) in
         * one walk down the path. */
        gw_cindex_point_t pts[GW_REGISTRY_MAX_POINTS];
        int res[GW_REGISTRY_MAX_POINTS];
        size_t n = 0;
        uint64_t start = 0;
        for (; i < n_points && n < PC_ARRAY_LEN(pts); i++) {
            const gw_registry_feed_point_t *p = &points[i];
            if (p->ttl >= GW_CINDEX_TTL_COUNT)
                return PC_ERR_INVAL;
            uint64_t ttl_ms = p->ttl == GW_CINDEX_TTL_1H ? s->cfg.ttl_1h_ms : s->cfg.ttl_5m_ms;
            uint64_t exp = gw__mono_of_wall(p->expiry_wall_ms);
            if (exp <= now_ms)
                continue; /* already past here */
            /* A start after now (a clock ahead of ours) counts as now: never beyond now + TTL. */
            uint64_t st = exp > ttl_ms ? exp - ttl_ms : 0;
            if (n > 0 && st != start)
                break;
            start = st;
            pts[n++] = (gw_cindex_point_t){p->n_tokens, (gw_cindex_ttl_t)p->ttl};
        }
        if (n == 0)
            continue;
        size_t n_ref = 0;
        while (n_ref < n && gw_ns_tab_ref(&s->ns, ns, tenant, model) == 0)
            n_ref++;
        if (n_ref < n) {
            while (n_ref-- > 0)
                gw_ns_tab_unref(&s->ns, ns);
            return PC_ERR_NOMEM;
        }
        int rc = gw_cindex_insert_path(s->ix, ns, tokens, pts, n, start, now_ms, res);
        for (size_t j = 0; j < n; j++)
            if (res[j] != 0) /* 0 new (keeps its count); extended, past or failed: given back */
                gw_ns_tab_unref(&s->ns, ns);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* The tenant string the namespace table will borrow for a tenant named by the feed: the
 * configuration's, else a copy kept until the end (at most GW_SERVE_MAX_FEED_TENANTS; NULL
 * beyond, or out of memory). */
static const char *feed_tenant(serve_t *s, const char *name)
{
    size_t len = strlen(name);
    uint64_t v;
    if (pc_strmap_get(&s->feed_tenants, name, len, &v))
        return (const char *)(uintptr_t)v;
    if (s->n_feed_tenant_copy >= GW_SERVE_MAX_FEED_TENANTS)
        return NULL;
    if (s->n_feed_tenant_copy % 64 == 0) {
        char **nv = pc_reallocarray(s->feed_tenant_copy, s->n_feed_tenant_copy + 64, sizeof *nv);
        if (nv == NULL)
            return NULL;
        s->feed_tenant_copy = nv;
    }
    char *c = pc_strdup(name);
    if (c == NULL ||
        pc_strmap_insert(&s->feed_tenants, name, len, (uint64_t)(uintptr_t)c, NULL) < 0) {
        pc_free(c);
        return NULL;
    }
    s->feed_tenant_copy[s->n_feed_tenant_copy++] = c;
    return c;
}

/* The owner of a t=w event's namespace: the one the event names (every gateway sends it, so the
 * meter's holder can bill a salted namespace it never served), else (an older writer) what this
 * gateway knows. False when it cannot be named here: a model this gateway does not serve (its
 * storage cannot be priced or named here), a tenant beyond GW_SERVE_MAX_FEED_TENANTS, or an
 * older writer's salted namespace this gateway never served. */
static bool feed_owner(serve_t *s, const gw_registry_feed_event_t *ev, const char **tenant,
                       uint32_t *model, bool *bad)
{
    *bad = false;
    if (ev->tenant[0] == '\0')
        return gw__serve_ns_owner(s, ev->ns, tenant, model);
    uint32_t m = 0;
    while (m < s->n_models && strcmp(s->models[m].cfg->name, ev->model) != 0)
        m++;
    if (m == s->n_models) {
        if (!s->warned_feed_model)
            PC_LOG(PC_LOG_WARN, "registry",
                   "gateway %s wrote cache entries of model '%s', which this gateway does not "
                   "serve: they are not in its replica (nor in its storage billing when it "
                   "meters); every gateway of a registry should serve the same models",
                   ev->origin, ev->model);
        s->warned_feed_model = true;
        *bad = true;
        return false;
    }
    *tenant = feed_tenant(s, ev->tenant);
    *model = m;
    *bad = *tenant == NULL;
    return *tenant != NULL;
}

/* Another gateway's event: its entries into the replica (and the worker that holds them, when
 * this gateway has it), or its read (every replica's expiries follow every gateway's reads). The
 * entries go into the namespace table with the owner the event names (feed_owner), so whoever
 * holds the storage meter bills every namespace of the cluster. An entry whose owner cannot be
 * named here is left out (rejected, counted; an older writer's unknown salted namespace is
 * skipped quietly): a request of it here finds the entry through the claim instead. */
static int on_feed(const gw_registry_feed_event_t *ev, void *ud)
{
    serve_t *s = ud;
    uint64_t now = pc_time_mono_ms();
    if (ev->type == 'r')
        return gw_cindex_read(s->ix, ev->ns, ev->tokens, ev->n_tokens,
                              gw__mono_of_wall(ev->now_wall_ms), NULL);
    const char *tenant;
    uint32_t model;
    bool bad;
    if (!feed_owner(s, ev, &tenant, &model, &bad))
        return bad ? PC_ERR_NOTFOUND : 0;
    int rc = gw__serve_replica_write(s, ev->ns, tenant, model, ev->tokens, ev->points, ev->n_points,
                                     now);
    if (rc < 0)
        return rc;
    int w = gw__serve_worker_by_id(s, ev->worker, model);
    if (w >= 0 && gw_pool_worker(s->pool, (uint32_t)w)->up)
        gw_cindex_owner_add(s->ix, ev->ns, ev->tokens, ev->n_tokens, (uint32_t)w, NULL);
    return 0;
}

static void on_registry_state(gw_registry_state_t state, const char *reason, void *ud)
{
    serve_t *s = ud;
    static const char *const names[] = {"down", "up", "fenced"};
    s->reg_state = state;
    PC_LOG(state == GW_REGISTRY_UP ? PC_LOG_INFO : PC_LOG_WARN, "registry", "%s: %s%s",
           names[state], reason,
           state == GW_REGISTRY_UP ? "" : " (billing decisions are local until it is up)");
}

int gw__serve_redis_params(const gw_config_t *c, bill_redis_params_t *p,
                           bill_redis_addr_t sent[BILL_REDIS_MAX_SENTINELS], char *err,
                           size_t err_len)
{
    *p = bill_redis_params_default();
    if (c->redis_host != NULL) {
        snprintf(p->address.host, sizeof p->address.host, "%s", c->redis_host);
        p->address.port = c->redis_port;
    }
    size_t n = PC_MIN(c->n_redis_sentinels, (size_t)BILL_REDIS_MAX_SENTINELS);
    for (size_t i = 0; i < n; i++) {
        lnk_addr_t a;
        if (lnk_addr_parse(c->redis_sentinels[i], 0, &a, err, err_len) != 0)
            return PC_ERR_INVAL;
        snprintf(sent[i].host, sizeof sent[i].host, "%s", a.host);
        sent[i].port = a.port;
    }
    p->sentinels = sent;
    p->n_sentinels = n;
    p->master_name = c->redis_master_name;
    p->password = c->redis_password;
    p->timeout_ms = c->redis_timeout_ms;
    return 0;
}

/* What the gateways of one registry must agree on (PREFIX:settings): every setting that changes
 * what is billed for the same prompt. cache.accounting (which prefixes are reads), the real
 * lengths of the two TTL classes (how long an entry is a read, and its expiry in Redis), and per
 * served model its min_cache_tokens (shorter prefixes are not written) and auto_ttl (the class,
 * hence the price, of an automatic entry): one field per model, so gateways may serve different
 * models. Left out on purpose: prices (billing.pricing: a price change rolls out gateway by
 * gateway, and each event carries its own cost), storage_interval (how often storage is metered,
 * not how much), the namespace secret (its own check, PREFIX:nssecret). */
typedef struct reg_settings {
    gw_registry_setting_t set[3 + GW_SERVE_MAX_MODELS];
    char names[GW_SERVE_MAX_MODELS][GW_REGISTRY_NAME_MAX + 1];
    char values[3 + GW_SERVE_MAX_MODELS][64];
    size_t n;
} reg_settings_t;

static int registry_settings(const serve_t *s, reg_settings_t *o, char *err, size_t err_len)
{
    static const char *const acc[] = {"token", "anthropic"};
    o->n = 0;
    o->set[o->n++] = (gw_registry_setting_t){"cache.accounting", acc[s->cfg.accounting & 1]};
    snprintf(o->values[1], sizeof o->values[1], "%" PRIu32 "ms", s->cfg.ttl_5m_ms);
    o->set[o->n++] = (gw_registry_setting_t){"cache.ttl_5m", o->values[1]};
    snprintf(o->values[2], sizeof o->values[2], "%" PRIu32 "ms", s->cfg.ttl_1h_ms);
    o->set[o->n++] = (gw_registry_setting_t){"cache.ttl_1h", o->values[2]};
    for (size_t m = 0; m < s->n_models; m++) {
        const gw_cfg_model_t *c = s->models[m].cfg;
        int k = snprintf(o->names[m], sizeof o->names[m], "models[%s]", c->name);
        if (k < 0 || (size_t)k >= sizeof o->names[m])
            return pc_err_setf(err, err_len, PC_ERR_INVAL,
                               "model name '%s' is too long for the registry's settings (%d bytes)",
                               c->name, GW_REGISTRY_NAME_MAX - 8);
        snprintf(o->values[3 + m], sizeof o->values[3 + m],
                 "min_cache_tokens=%" PRIu32 " auto_ttl=%s", c->min_cache_tokens,
                 c->auto_ttl_ms == 3600000 ? "1h" : "5m");
        o->set[o->n++] = (gw_registry_setting_t){o->names[m], o->values[3 + m]};
    }
    return 0;
}

/* Starts the registry: the blocking start-up checks (namespace secret, the settings, duplicate
 * instance), then its connections in the background. Returns 0 or SERVE_EXIT_FAIL with the reason
 * printed. */
static int start_registry(serve_t *s)
{
    char err[512];
    reg_settings_t settings;
    bill_redis_addr_t sent[BILL_REDIS_MAX_SENTINELS];
    gw_registry_params_t rp = gw_registry_params_default();
    if (gw__serve_redis_params(&s->cfg, &rp.redis, sent, err, sizeof err) != 0 ||
        registry_settings(s, &settings, err, sizeof err) != 0 || build_ns_owners(s) != 0) {
        fprintf(stderr, "kvgw serve: registry: %s\n", err);
        return SERVE_EXIT_FAIL;
    }
    rp.prefix = s->cfg.redis_prefix;
    rp.instance = s->cfg.instance_id;
    gw_namespace_secret_check(s->cfg.namespace_secret, rp.secret_check);
    rp.timeout_ms = s->cfg.registry_timeout_ms;
    rp.claim_ttl_ms = s->cfg.registry_claim_ttl_ms;
    rp.lease_ms = s->cfg.registry_lease_ms;
    rp.feed_maxlen = s->cfg.registry_feed_maxlen;
    rp.replay_max = s->cfg.registry_replay_max;
    rp.failover_replay_ms = s->cfg.registry_failover_replay_ms;
    /* No prompt here is longer than the largest context of the models (longer ones are refused
     * before a plan), so neither is a call nor an accepted feed event: one XREAD then buffers at
     * most feed_count x that many tokens. A model whose context is unknown keeps the default. */
    uint32_t max_ctx = 0;
    for (size_t i = 0; i < s->n_models && (i == 0 || max_ctx > 0); i++)
        max_ctx = s->models[i].n_ctx == 0 ? 0 : PC_MAX(max_ctx, s->models[i].n_ctx);
    if (max_ctx > 0 && max_ctx < rp.max_event_tokens)
        rp.max_event_tokens = max_ctx;
    rp.ttl_ms[GW_CINDEX_TTL_5M] = s->cfg.ttl_5m_ms;
    rp.ttl_ms[GW_CINDEX_TTL_1H] = s->cfg.ttl_1h_ms;
    rp.settings = settings.set;
    rp.n_settings = settings.n;
    rp.on_feed = on_feed;
    rp.on_state = on_registry_state;
    rp.on_op = gw__obs_registry_op;
    rp.ud = s;
    int rc = gw_registry_start(s->loop, &rp, &s->reg, err, sizeof err);
    if (rc == PC_ERR_PERM) {
        fprintf(stderr,
                "kvgw serve: refusing to start: registry: %s (cache.namespace_secret must be the "
                "same on every gateway that shares redis.prefix %s)\n",
                err, s->cfg.redis_prefix);
        return SERVE_EXIT_FAIL;
    }
    if (rc == PC_ERR_STATE) {
        fprintf(stderr,
                "kvgw serve: refusing to start: %s (every gateway that shares redis.prefix %s "
                "must have the same billing settings)\n",
                err, s->cfg.redis_prefix);
        return SERVE_EXIT_FAIL;
    }
    if (rc == PC_ERR_EXISTS) {
        fprintf(stderr,
                "kvgw serve: refusing to start: registry: %s (billing.instance_id %s is in use "
                "by a live gateway: give each gateway its own)\n",
                err, s->cfg.instance_id);
        return SERVE_EXIT_FAIL;
    }
    if (rc != 0) {
        fprintf(stderr, "kvgw serve: registry: %s\n", err);
        return SERVE_EXIT_FAIL;
    }
    s->reg_state = gw_registry_state(s->reg);
    if (s->reg_state != GW_REGISTRY_UP)
        fprintf(stderr,
                "kvgw: warning: registry: Redis is not reachable; serving from this gateway's "
                "own view (registry: local) until it is\n");
    return 0;
}

static void registry_closed(void *ud)
{
    serve_t *s = ud;
    s->reg = NULL;
}

/* ---- shutdown and signals ---------------------------------------------------------------- */

/* The HTTP server closed after the shutdown: no request can arrive any more. The loop ends
 * once every in-flight request is finished (their durability wait included) and the handles
 * below are stopped. */
static void all_closed(void *ud)
{
    serve_t *s = ud;
    s->http_closed = true;
    PC_LOG(PC_LOG_INFO, "serve", "HTTP closed; %s",
           s->live || s->durable_head || s->n_claiming ? "finishing requests" : "stopping");
    uv_timer_stop(&s->tick);
    uv_close((uv_handle_t *)&s->tick, NULL);
    uv_close((uv_handle_t *)&s->sig_int, NULL);
    uv_close((uv_handle_t *)&s->sig_term, NULL);
    uv_close((uv_handle_t *)&s->sig_hup, NULL);
    if (s->live == NULL && s->durable_head == NULL && s->n_claiming == 0)
        uv_stop(s->loop);
}

static void begin_shutdown(serve_t *s)
{
    if (s->stopping)
        return;
    s->stopping = true;
    fprintf(stderr, "kvgw: shutting down (finishing in-flight requests, up to %u ms)\n",
            s->cfg.shutdown_grace_ms);
    gw_http_server_shutdown(s->http, s->cfg.shutdown_grace_ms, all_closed, s);
}

static void on_signal(uv_signal_t *h, int sig)
{
    serve_t *s = h->data;
    if (s->stopping) {
        fprintf(stderr, "kvgw: second signal %d, closing now\n", sig);
        gw_http_server_shutdown(s->http, 0, all_closed, s);
        return;
    }
    begin_shutdown(s);
}

/* ---- the ledger's wake-ups ---------------------------------------------------------------- */

static uint64_t shipper_durable(void *ud)
{
    serve_t *s = ud;
    return bill_ledger_durable_seq(s->ledger);
}

static void ledger_wake_fn(void *ud)
{
    uv_async_send(ud);
}

/* ---- startup ----------------------------------------------------------------------------- */

static int load_models(serve_t *s, char *err, size_t err_len)
{
    s->n_models = s->cfg.n_models;
    if (s->n_models > GW_SERVE_MAX_MODELS)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "at most %d models", GW_SERVE_MAX_MODELS);
    for (size_t i = 0; i < s->n_models; i++) {
        gw_model_rt_t *m = &s->models[i];
        m->cfg = &s->cfg.models[i];
        m->index = (uint32_t)i;
        eng_gguf_t *g = NULL;
        eng_vocab_t *v = NULL;
        int rc = eng_gguf_open(m->cfg->path, &g, err, err_len);
        if (rc == 0)
            rc = eng_vocab_from_gguf(g, &v, err, err_len);
        if (rc == 0)
            rc = eng_tok_init(v, &m->tok, err, err_len);
        if (rc == 0)
            rc = eng_render_init(m->tok, (eng_render_family_t)m->cfg->chat_format, &m->render, err,
                                 err_len);
        if (rc == 0 && s->cfg.tokenizer_cache_bytes > 0) {
            eng_tokcache_params_t tp = eng_tokcache_params_default();
            tp.max_bytes = (size_t)s->cfg.tokenizer_cache_bytes;
            if ((rc = eng_tokcache_init(m->tok, &tp, &m->tokcache)) != 0)
                pc_err_setf(err, err_len, rc, "tokenizer cache: %s", pc_strerror(rc));
        }
        if (rc == 0) {
            eng_hparams_t hp;
            if (eng_hparams_from_gguf(g, &hp, NULL, 0) == 0)
                m->n_ctx = hp.n_ctx_train;
        }
        eng_vocab_free(v);
        eng_gguf_free(g);
        if (rc != 0)
            return rc;
        if (m->cfg->context_tokens && (m->n_ctx == 0 || m->cfg->context_tokens < m->n_ctx))
            m->n_ctx = m->cfg->context_tokens;
    }
    return 0;
}

static void on_walk_close(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* Creates the parent directories of path (var/ for var/ledger on a fresh checkout); the ledger
 * creates its own last level. */
static int mkdir_parents(const char *path, char *err, size_t err_len)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n >= sizeof buf)
        return pc_err_setf(err, err_len, PC_ERR_RANGE, "path too long: %s", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i < n; i++) {
        if (buf[i] != '/')
            continue;
        buf[i] = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return pc_err_setf(err, err_len, PC_ERR_IO, "cannot create %s: %s", buf,
                               strerror(errno));
        buf[i] = '/';
    }
    return 0;
}

static int serve_run(serve_t *s, const gw_serve_params_t *params)
{
    char err[512];
    int rc;
    if (params->listen_host != NULL) {
        char *host = pc_strdup(params->listen_host);
        if (host == NULL) {
            fprintf(stderr, "kvgw serve: out of memory\n");
            return SERVE_EXIT_FAIL;
        }
        pc_free(s->cfg.listen_host);
        s->cfg.listen_host = host;
        s->cfg.listen_port = params->listen_port;
    }
    /* Protected mode: the demo secrets stay on loopback (--listen included). */
    if (gw_config_check_exposure(&s->cfg, s->cfg.listen_host, err, sizeof err) != 0) {
        fprintf(stderr, "kvgw serve: %s\n", err);
        return SERVE_EXIT_FAIL;
    }
    int lvl = pc_log_level_parse(s->cfg.log_level);
    if (lvl >= 0)
        pc_log_set_level(lvl);
    if (strcmp(s->cfg.access_log, "off") == 0)
        s->access_log = NULL;
    else if (strcmp(s->cfg.access_log, "-") == 0)
        s->access_log = stdout;
    else if ((s->access_log = gw__obs_open_access_log(s->cfg.access_log)) == NULL) {
        fprintf(stderr, "kvgw serve: cannot open the access log %s\n", s->cfg.access_log);
        return SERVE_EXIT_FAIL;
    }
    if (s->cfg.namespace_secret_is_default)
        fprintf(stderr, "kvgw: warning: cache.namespace_secret is the built-in demo secret; set "
                        "it (env:NAME) in a real deployment\n");
    if ((rc = load_models(s, err, sizeof err)) != 0) {
        fprintf(stderr, "kvgw serve: %s\n", err);
        if (rc == PC_ERR_IO)
            fprintf(stderr, "kvgw serve: generate the demo model with bash scripts/models.sh, or "
                            "point models[].path at a GGUF file\n");
        return SERVE_EXIT_FAIL;
    }
    if ((rc = bill_pricing_load(s->cfg.pricing_path, &s->pricing, err, sizeof err)) != 0) {
        fprintf(stderr, "kvgw serve: %s\n", err);
        return SERVE_EXIT_FAIL;
    }
    for (size_t i = 0; i < s->n_models; i++) {
        const bill_price_t *p;
        if (bill_pricing_lookup(s->pricing, s->models[i].cfg->name, pc_time_wall_ms(), &p) != 0)
            fprintf(stderr,
                    "kvgw: warning: %s has no price for model %s: its requests will be "
                    "refused\n",
                    s->cfg.pricing_path, s->models[i].cfg->name);
    }
    if (bill_idgen_init(&s->idgen) != 0) {
        fprintf(stderr, "kvgw serve: no random source for event ids\n");
        return SERVE_EXIT_FAIL;
    }
    if (mkdir_parents(s->cfg.ledger_dir, err, sizeof err) != 0) {
        fprintf(stderr, "kvgw serve: billing.ledger_dir: %s\n", err);
        return SERVE_EXIT_FAIL;
    }
    uv_async_init(s->loop, &s->ledger_wake, gw__req_on_ledger_wake);
    s->ledger_wake.data = s;
    bill_ledger_params_t lp = bill_ledger_params_default();
    lp.dir = s->cfg.ledger_dir;
    lp.fsync = s->cfg.fsync == GW_FSYNC_ALWAYS  ? BILL_FSYNC_ALWAYS
               : s->cfg.fsync == GW_FSYNC_BATCH ? BILL_FSYNC_BATCH
                                                : BILL_FSYNC_OFF;
    lp.batch_window_us = s->cfg.fsync_batch_us;
    lp.segment_bytes = s->cfg.segment_bytes;
    lp.open_check = s->cfg.ledger_full_check ? BILL_OPEN_CHECK_FULL : BILL_OPEN_CHECK_INDEX;
    lp.instance = s->cfg.instance_id;
    lp.wake = ledger_wake_fn;
    lp.wake_ud = &s->ledger_wake;
    if ((rc = bill_ledger_open(&lp, &s->ledger, err, sizeof err)) != 0) {
        fprintf(stderr, "kvgw serve: ledger: %s\n", err);
        return SERVE_EXIT_FAIL;
    }
    if (gw_config_has_redis(&s->cfg)) {
        bill_redis_addr_t sent[BILL_REDIS_MAX_SENTINELS];
        bill_redis_params_t conn;
        if (gw__serve_redis_params(&s->cfg, &conn, sent, err, sizeof err) != 0) {
            fprintf(stderr, "kvgw serve: redis: %s\n", err);
            return SERVE_EXIT_FAIL;
        }
        bill_shipper_params_t sp = bill_shipper_params_default();
        sp.conn = &conn; /* an address or Sentinel */
        sp.ledger_dir = s->cfg.ledger_dir;
        sp.instance = s->cfg.instance_id;
        sp.prefix = s->cfg.redis_prefix;
        sp.durable_seq = shipper_durable;
        sp.durable_ud = s;
        if ((rc = bill_shipper_start(s->loop, &sp, &s->shipper, err, sizeof err)) != 0) {
            fprintf(stderr, "kvgw serve: redis shipper: %s\n", err);
            return SERVE_EXIT_FAIL;
        }
    }
    gw_cindex_params_t ip = gw_cindex_params_default();
    ip.max_tokens = s->cfg.cache_max_tokens;
    ip.ttl_ms[GW_CINDEX_TTL_5M] = s->cfg.ttl_5m_ms;
    ip.ttl_ms[GW_CINDEX_TTL_1H] = s->cfg.ttl_1h_ms;
    ip.on_drop = gw__obs_on_entry_drop;
    ip.ud = s;
    if ((rc = gw_cindex_init(&ip, &s->ix)) != 0) {
        fprintf(stderr, "kvgw serve: cache index: %s\n", pc_strerror(rc));
        return SERVE_EXIT_FAIL;
    }
    gw_router_params_t rp = gw_router_params_default();
    gw_router_init(&s->router, &rp);
    gw__obs_setup_metrics(s);
    gw_pool_cbs_t cbs = {gw__req_pool_event, gw__req_pool_state, params->load_progress,
                         params->load_progress_ud};
    if ((rc = gw_pool_init(s->loop, &s->cfg, &cbs, s, &s->pool, err, sizeof err)) != 0) {
        fprintf(stderr, "kvgw serve: workers: %s\n", err);
        return SERVE_EXIT_FAIL;
    }
    if (s->cfg.registry_enabled && (rc = start_registry(s)) != 0)
        return rc;
    s->usage_cluster_default = s->cfg.registry_enabled; /* /admin/v1/usage: the merged view */
    gw_http_params_t hp = gw_http_params_default();
    hp.host = s->cfg.listen_host;
    hp.port = s->cfg.listen_port;
    hp.max_header_bytes = s->cfg.max_header_bytes;
    hp.max_headers = s->cfg.max_headers;
    hp.max_body_bytes = s->cfg.max_body_bytes;
    hp.header_timeout_ms = s->cfg.header_timeout_ms;
    hp.body_timeout_ms = s->cfg.body_timeout_ms;
    hp.body_min_rate = s->cfg.body_min_rate;
    hp.idle_timeout_ms = s->cfg.idle_timeout_ms;
    hp.max_connections = s->cfg.max_connections;
    hp.reserved_connections = s->cfg.reserved_connections;
    hp.max_connections_per_peer = s->cfg.max_connections_per_peer;
    hp.stream_high_water = s->cfg.stream_high_water;
    hp.on_request = on_request;
    hp.format_error = format_http_error;
    hp.ud = s;
    if ((rc = gw_http_server_init(s->loop, &hp, &s->http, err, sizeof err)) != 0) {
        fprintf(stderr, "kvgw serve: %s\n", err);
        return SERVE_EXIT_FAIL;
    }
    uv_timer_init(s->loop, &s->tick);
    s->tick.data = s;
    uv_timer_start(&s->tick, gw__obs_on_tick, GW_SERVE_TICK_MS, GW_SERVE_TICK_MS);
    uv_signal_init(s->loop, &s->sig_int);
    uv_signal_init(s->loop, &s->sig_term);
    s->sig_int.data = s->sig_term.data = s;
    uv_signal_start(&s->sig_int, on_signal, SIGINT);
    uv_signal_start(&s->sig_term, on_signal, SIGTERM);
    uv_signal_init(s->loop, &s->sig_hup);
    s->sig_hup.data = s;
    uv_signal_start(&s->sig_hup, gw__obs_on_sighup, SIGHUP);
    s->last_storage_ms = pc_time_wall_ms();

    int port = gw_http_server_port(s->http);
    const char *h = s->cfg.listen_host;
    printf("kvgw %s listening on http://%s:%d (model%s:", KVGW_VERSION, h, port,
           s->n_models > 1 ? "s" : "");
    for (size_t i = 0; i < s->n_models; i++)
        printf(" %s", s->models[i].cfg->name);
    printf(")\n");
    if (s->cfg.n_keys > 0 && strcmp(s->cfg.source, GW_CONFIG_DEFAULT_PATH) == 0) {
        printf("  try:  curl -s http://%s:%d/v1/messages -H 'x-api-key: sk-kvgw-demo' "
               "-H 'anthropic-version: 2023-06-01' -H 'content-type: application/json' "
               "-d '{\"model\":\"%s\",\"max_tokens\":32,\"messages\":[{\"role\":\"user\","
               "\"content\":\"Hello\"}]}'\n",
               h, port, s->models[0].cfg->name);
        printf("        (too short to cache: README.md's first example writes the cache, then "
               "reads it)\n");
        printf("  SDKs: Anthropic baseURL http://%s:%d (apiKey sk-kvgw-demo); OpenAI baseURL "
               "http://%s:%d/v1\n",
               h, port, h, port);
        printf("  dashboard: http://%s:%d/dashboard#key=sk-kvgw-admin\n", h, port);
    } else {
        printf("  dashboard: http://%s:%d/dashboard (asks for the admin key)\n", h, port);
    }
    printf("  metrics: http://%s:%d/metrics (admin key)   Ctrl-C stops it cleanly\n", h, port);
    fflush(stdout);

    uv_run(s->loop, UV_RUN_DEFAULT);
    return s->exit_code;
}

/* libuv's thread pool parses and tokenizes requests, streams usage exports and resolves worker
 * host names. Its default of 4 threads would cap a large machine at 4 cores of request work,
 * and a DNS server that does not answer holds a thread for the resolver's whole timeout: unless
 * the operator set UV_THREADPOOL_SIZE, use one thread per online CPU plus 4. It must be set
 * before the pool's first use, which is why this runs first. */
static void size_threadpool(void)
{
    if (getenv("UV_THREADPOOL_SIZE") != NULL)
        return;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    n = (n < 1 ? 1 : n) + 4;
    char v[16];
    snprintf(v, sizeof v, "%ld", n > 1024 ? 1024 : n);
    setenv("UV_THREADPOOL_SIZE", v, 0);
}

gw_serve_params_t gw_serve_params_default(void)
{
    gw_serve_params_t p = {0};
    return p;
}

int gw_serve(const gw_serve_params_t *p)
{
    size_threadpool();
    const char *config_path = p->config_path;
    serve_t *s = pc_calloc(1, sizeof *s);
    char err[512];
    int rc;
    if (config_path == NULL && access(GW_CONFIG_DEFAULT_PATH, R_OK) == 0)
        config_path = GW_CONFIG_DEFAULT_PATH;
    rc = config_path ? gw_config_load(config_path, &s->cfg, err, sizeof err)
                     : gw_config_default(&s->cfg);
    if (rc != 0) {
        fprintf(stderr, "kvgw serve: %s\n", config_path ? err : pc_strerror(rc));
        pc_free(s);
        return SERVE_EXIT_FAIL;
    }
    uv_loop_t loop;
    uv_loop_init(&loop);
    s->loop = &loop;
    int code = serve_run(s, p);

    /* Teardown: the HTTP server is closed (or never opened); stop the workers, flush the
     * ledger with a final storage window, close every handle. */
    if (s->ix && s->ledger && s->pricing)
        gw__obs_meter_storage(s);
    if (s->reg) { /* its registration and meter lease go now, not after a lease */
        gw_registry_stop(s->reg, registry_closed, s);
        while (s->reg != NULL && uv_run(&loop, UV_RUN_ONCE) != 0) {
        }
        s->reg = NULL;
    }
    if (s->pool)
        gw_pool_shutdown(s->pool, NULL, NULL);
    if (s->shipper) { /* it resumes from its cursor in Redis at the next start */
        bill_shipper_stop(s->shipper, NULL, NULL);
        s->shipper = NULL;
    }
    if (s->ledger) {
        int lrc = bill_ledger_close(s->ledger);
        s->ledger = NULL;
        if (lrc != 0) {
            fprintf(stderr, "kvgw: ledger: records not durable at exit: %s\n", pc_strerror(lrc));
            code = SERVE_EXIT_FAIL;
        }
    }
    /* The server first (after its shutdown it frees at once; otherwise it closes its own
     * handles), then every handle left (timers, signals, asyncs). */
    gw_http_server_free(s->http);
    uv_run(&loop, UV_RUN_NOWAIT);
    uv_walk(&loop, on_walk_close, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    gw_pool_free(s->pool);
    gw_cindex_free(s->ix);
    bill_pricing_free(s->pricing);
    gw_metrics_free(s->m);
    for (size_t i = 0; i < s->n_models; i++) {
        eng_tokcache_free(s->models[i].tokcache);
        eng_render_free(s->models[i].render);
        eng_tok_free(s->models[i].tok);
    }
    if (s->access_log && s->access_log != stdout)
        fclose(s->access_log);
    uv_loop_close(&loop);
    gw_config_free(&s->cfg);
    gw_ns_tab_free(&s->ns);
    pc_u64map_free(&s->ns_owners);
    pc_free(s->ns_owner_tab);
    pc_strmap_free(&s->feed_tenants);
    for (size_t i = 0; i < s->n_feed_tenant_copy; i++)
        pc_free(s->feed_tenant_copy[i]);
    pc_free(s->feed_tenant_copy);
    pc_u64map_free(&s->live_map);
    pc_free(s);
    if (code == 0)
        fprintf(stderr, "kvgw: stopped cleanly\n");
    return code;
}
