/*
 * config.h — the gateway's configuration: one YAML file (conf/kvgw.yaml is the embedded
 * default, conf/kvgw-cluster.yaml the cluster example), validated on load.
 *
 * Every key is documented in conf/README.md with its default. Rules:
 *   - Unknown keys and bad values are errors that name the key path and the file's line
 *     ("conf/kvgw.yaml:12: limits.max_body_bytes: expected a size such as 32MiB").
 *   - Durations are strings with a unit ("250ms", "30s", "5m", "1h") or integer milliseconds;
 *     sizes are "64KiB", "32MiB", "1GiB" or integer bytes.
 *   - A secret (API keys, the namespace secret, the link secret, the Redis password) may be
 *     written as "env:NAME" (the environment variable NAME) or "file:PATH" (the file's
 *     contents, surrounding white space removed); a missing variable or file is an error.
 *   - API keys are kept only as SHA-256 digests (a key may also be given as its digest,
 *     "sha256:<64 hex>"), so the process never holds a client's key after loading.
 *   - Relative paths are taken relative to the directory kvgw was started in.
 *   - Settings that only make sense together are checked together at load, each error naming
 *     the line of the key at fault: redis.address and redis.sentinels exclude each other,
 *     sentinels need master_name; registry.enabled needs redis, cache.namespace_secret (not the
 *     demo secret: every gateway must derive the same namespaces from a real one) and an
 *     explicit billing.instance_id, and registry.timeout must be below registry.claim_ttl and
 *     registry.lease.
 *
 * Memory: a gw_config_t owns all its strings; gw_config_free releases them.
 */
#ifndef GW_CONFIG_H
#define GW_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pc_buf.h"

#define GW_CONFIG_DEFAULT_PATH "conf/kvgw.yaml"
#define GW_CONFIG_MAX_WORKERS 64
#define GW_SHA256_BYTES 32

typedef enum gw_accounting {
    GW_ACCOUNTING_TOKEN = 0,     /* any prefix covered by a live entry is a read */
    GW_ACCOUNTING_ANTHROPIC = 1, /* hits only at entry boundaries by the 20-block lookback */
} gw_accounting_t;

typedef enum gw_fsync_mode {
    GW_FSYNC_ALWAYS = 0,
    GW_FSYNC_BATCH = 1,
    GW_FSYNC_OFF = 2,
} gw_fsync_mode_t;

/* One served model and the workers that serve it. */
typedef struct gw_cfg_model {
    char *name;                /* the API's "model" value */
    char *path;                /* the GGUF file (tokenizer; in-process workers load it) */
    uint32_t min_cache_tokens; /* shorter prefixes are not written (no error) */
    uint32_t auto_ttl_ms;      /* TTL of automatic (OpenAI) cache entries: 5m or 1h */
    uint32_t context_tokens;   /* 0: the model's own; else a cap */
    /* in-process workers (embedded mode) */
    uint32_t in_process;     /* worker count */
    uint32_t threads;        /* CPU threads per worker */
    uint64_t kv_bytes;       /* KV pool per worker; 0 = the engine's default */
    char *backend;           /* "cpu", "cuda" or "auto" */
    int chat_format;         /* an eng_render_family_t (engine/render.h); 0: detect it from
                                the model's chat template */
    uint32_t kv_dtype;       /* the in-process workers' KV element type, an enum eng_kv_dtype
                                (f16 default, f32, q8_0) */
    char **remote;           /* [n_remote] "host:port" of `kvgw worker` processes */
    unsigned long path_line; /* where path was given (0: built-in), for file errors */
    size_t n_remote;
} gw_cfg_model_t;

typedef struct gw_cfg_key {
    uint8_t sha256[GW_SHA256_BYTES];
    char *id;     /* a name for the key (logs, ledger "api key id"); never the key itself */
    char *tenant; /* organization / workspace id */
} gw_cfg_key_t;

/* kv_tiers: the KV tiers below each worker's pool (engine/tier.h), for in-process workers
 * (remote workers take theirs from `kvgw worker`'s flags). Off when dir is NULL (`kv_tiers:
 * null`, and the built-in default, so tests get no tiers unless they ask); conf/kvgw.yaml turns
 * it on under var/kv-tiers. */
typedef struct gw_cfg_tiers {
    char *dir;           /* worker i of model m uses <dir>/<model dir name>/w<i> */
    uint64_t max_bytes;  /* the disk tier's budget per worker */
    uint64_t g2_bytes;   /* host-memory tier per CUDA worker (0 off; CPU workers ignore it) */
    bool write_through;  /* retained prefixes written at retain time */
    uint32_t min_tokens; /* shorter evicted prefixes are not written back */
    char *key_file;      /* the at-rest key's file, or NULL (checksums only) */
    bool has_key;
    uint8_t key[32];        /* read from key_file at load (eng_worker_tier_key_read) */
    unsigned long dir_line; /* where dir was given (0: built-in), for messages */
} gw_cfg_tiers_t;

typedef struct gw_config {
    char *source; /* the file it came from, or "(built-in default)" */
    char *listen_host;
    int listen_port;

    gw_cfg_model_t *models;
    size_t n_models;
    gw_cfg_key_t *keys;
    size_t n_keys;
    bool has_admin_key;
    uint8_t admin_sha256[GW_SHA256_BYTES];
    uint8_t namespace_secret[32]; /* BLAKE2b key of the cache namespaces */
    bool namespace_secret_is_default;
    char *link_secret; /* NULL: remote workers without authentication */
    uint32_t worker_heartbeat_ms;
    uint32_t worker_connect_timeout_ms;

    /* HTTP limits */
    size_t max_body_bytes;
    size_t max_header_bytes;
    uint32_t max_headers;
    uint32_t header_timeout_ms, body_timeout_ms, idle_timeout_ms;
    uint32_t max_connections;
    uint32_t body_min_rate;            /* body bytes/s owed after body_timeout_ms; 0 = none */
    uint32_t reserved_connections;     /* slots keyless connections get only on probation */
    uint32_t max_connections_per_peer; /* keyless connections per client address; 0 = any */
    size_t stream_high_water;
    uint32_t shutdown_grace_ms;

    /* cache */
    gw_accounting_t accounting;
    uint64_t cache_max_tokens; /* index capacity (tokens); LRU beyond */
    uint32_t ttl_5m_ms;        /* the real length of a "5m" entry (default 5 minutes) */
    uint32_t ttl_1h_ms;        /* the real length of a "1h" entry (default 1 hour) */
    /* cache.tokenizer_cache: the byte budget of each model's segment token cache
     * (engine/tokcache.h: long prompt segments -> token ids, per namespace, LRU beyond the
     * budget), which spares re-tokenizing a cached system prompt on every request. Default
     * 64MiB; 0 turns it off. */
    uint64_t tokenizer_cache_bytes;
    bool per_tenant_metrics;
    /* metrics.require_key (default true): GET /metrics answers only to the admin key (x-api-key
     * or Authorization: Bearer, as Prometheus sends a bearer token). */
    bool metrics_require_key;

    /* billing */
    char *ledger_dir;
    gw_fsync_mode_t fsync;
    uint32_t fsync_batch_us; /* group-commit window (fsync: batch) */
    uint64_t segment_bytes;
    bool ledger_full_check; /* billing.verify_on_open: full (every segment read at start) */
    char *pricing_path;
    unsigned long pricing_line; /* 0: built-in */
    uint32_t storage_interval_ms;
    char *instance_id;    /* names this gateway's ledger stream in Redis */
    bool instance_id_set; /* given in the file (a registry needs one per gateway) */

    /* Redis (optional): one address, or Sentinel (sentinels + master_name); never both. */
    char *redis_host; /* NULL: no address (no Redis, or Sentinel) */
    int redis_port;
    char **redis_sentinels; /* [n_redis_sentinels] "HOST:PORT" of the sentinels */
    size_t n_redis_sentinels;
    char *redis_master_name; /* the primary's name at the sentinels; NULL without Sentinel */
    char *redis_password;
    char *redis_prefix; /* every key kvgw writes starts with "PREFIX:" (default "kvgw") */
    uint32_t redis_timeout_ms;

    /* registry: many gateways, one cache (gateway/registry.h). Needs redis, a namespace secret
     * of its own and an explicit billing.instance_id (checked at load with file:line). */
    bool registry_enabled;
    uint32_t registry_timeout_ms;   /* a claim's deadline; past it the decision is local */
    uint32_t registry_claim_ttl_ms; /* a claim's life in Redis (its claimant died: it expires) */
    uint32_t registry_lease_ms;     /* the registration's and the storage meter's lease */
    uint32_t registry_feed_maxlen;  /* the change feed's approximate length (XADD MAXLEN ~) */
    uint32_t registry_replay_max;   /* commits/reads kept while Redis is down, replayed after */
    uint32_t registry_failover_replay_ms; /* commits/reads sent this recently are sent again to
                                             a new primary after a failover (0: off) */

    /* logs */
    char *access_log; /* "-" stdout, "off", or a file path */
    char *log_level;

    /* server.allow_demo_secrets_on_public (default false): see gw_config_check_exposure. */
    bool allow_demo_secrets_on_public;

    gw_cfg_tiers_t kv_tiers;
} gw_config_t;

/* Redis is configured (an address or sentinels). */
static inline bool gw_config_has_redis(const gw_config_t *c)
{
    return c->redis_host != NULL || c->n_redis_sentinels > 0;
}

/* The built-in default (what conf/kvgw.yaml spells out). Returns 0 or PC_ERR_NOMEM. */
int gw_config_default(gw_config_t *out);

/* Loads and validates a YAML file over the built-in defaults, including that the files it
 * names (models[].path, billing.pricing) can be read. Returns 0; PC_ERR_IO (cannot read the
 * file itself), PC_ERR_FORMAT (YAML syntax) or PC_ERR_INVAL (unknown key, bad value, a named
 * file that cannot be read), each with a one-line reason naming the file, line and key path in
 * err. *out is untouched on error. */
int gw_config_load(const char *path, gw_config_t *out, char *err, size_t err_len);

/* Parses the same from a string (tests); name is used in messages. */
int gw_config_parse(const char *name, const char *yaml, size_t len, gw_config_t *out, char *err,
                    size_t err_len);

void gw_config_free(gw_config_t *c);

/* Appends the effective configuration as YAML, secrets shown as "<set>" (check-config). */
int gw_config_print(const gw_config_t *c, pc_buf_t *out);

/* The model with this name, or NULL. */
const gw_cfg_model_t *gw_config_model(const gw_config_t *c, const char *name, size_t len);

/* The key whose SHA-256 equals that of key[0..len), compared in constant time over every
 * configured key; NULL if none. */
const gw_cfg_key_t *gw_config_key_find(const gw_config_t *c, const char *key, size_t len);

/* True when key[0..len) is the admin key (constant time). */
bool gw_config_is_admin(const gw_config_t *c, const char *key, size_t len);

/* Protected mode (after Redis's): the built-in demo secrets (the namespace secret of
 * cache.namespace_secret when none is set, the demo API keys sk-kvgw-demo and sk-kvgw-demo2, the
 * admin key sk-kvgw-admin, whichever of them c still uses, given literally or as their digest)
 * are public, so a gateway that uses one must not listen beyond this machine. listen_host is
 * the address serve will listen on (kvgw serve --listen overrides the config's). Returns 0 when
 * listen_host is a loopback address (127.0.0.0/8, ::1, localhost), when c uses no demo secret,
 * or when c sets server.allow_demo_secrets_on_public: true; else PC_ERR_INVAL with a message
 * naming the address, the demo secrets in use and the fixes in err. */
int gw_config_check_exposure(const gw_config_t *c, const char *listen_host, char *err,
                             size_t err_len);

/* Who may read GET /metrics: 0 when allowed (metrics.require_key is false, or the admin key is
 * given as x_api_key or as the bearer token of authorization; either header may be NULL), else
 * the HTTP status to answer: 401 when no key was given, 403 when the key is not the admin key. */
int gw_config_metrics_auth(const gw_config_t *c, const char *x_api_key, const char *authorization);

/* The tier directory of in-process worker `worker` (0-based within its model) of model m:
 * <kv_tiers.dir>/<name>/w<worker>, where name is the model's name when it is made only of
 * [A-Za-z0-9._-] and does not start with '.', else "m-" and 16 hex digits of its BLAKE2b (so two
 * models, or two workers, never share a directory). Returns 0, or PC_ERR_RANGE when it
 * does not fit out_len, or PC_ERR_STATE when tiers are off. */
int gw_config_tier_dir(const gw_config_t *c, const gw_cfg_model_t *m, uint32_t worker, char *out,
                       size_t out_len);

/* "250ms", "30s", "5m", "1h" or an integer (milliseconds) -> *ms. Returns 0 or PC_ERR_INVAL. */
int gw_config_parse_duration(const char *s, uint64_t *ms);
/* "64KiB", "32MiB", "1GiB", "10MB" or an integer (bytes) -> *bytes. Returns 0 or PC_ERR_INVAL. */
int gw_config_parse_size(const char *s, uint64_t *bytes);

#endif
