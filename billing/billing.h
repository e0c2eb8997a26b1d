/*
 * billing.h — money: pricing, usage events and their cost, storage metering, exports.
 *
 * The money path has no floating point anywhere (DESIGN.md §4). Prices are integers in nano-USD
 * (1e-9 USD) per million tokens ($3/MTok = 3,000,000,000); cache multipliers are exact rationals
 * (write 5m 5/4, write 1h 2/1, read 1/10). The cost of one bucket of one event is
 *
 *     tokens x price x num / (den x 10^6)              (storage: token_ms x price / (3.6e6 x 10^6))
 *
 * computed in 128-bit integers and rounded half-to-even once, to nano-USD. Totals and exports sum
 * those rounded per-bucket values, so every view of the same events adds up to the same figure.
 *
 *   bill_pricing_t *p;  bill_pricing_load("conf/pricing.yaml", &p, err, sizeof err);
 *   bill_event_t ev;    bill_event_init_usage(&ev, ...); ev.n_read = 1800; ...
 *   bill_event_price(&ev, p, err, sizeof err);   // PC_ERR_NOTFOUND: unknown model -> refuse
 *   bill_ledger_append(ledger, &ev, &seq);       // see ledger.h
 *
 * Usage buckets are disjoint (the LiteLLM double-count bugs are the anti-example): uncached input
 * (Anthropic's input_tokens), cache write 5m, cache write 1h, cache read, output. Their prompt part
 * adds up to every prompt token; OpenAI's inclusive prompt_tokens is derived, never stored.
 */
#ifndef BILL_BILLING_H
#define BILL_BILLING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------------------------------------
 * Pricing
 * ------------------------------------------------------------------------------------------- */

/* An exact non-negative rational; den > 0. */
typedef struct bill_ratio {
    uint32_t num;
    uint32_t den;
} bill_ratio_t;

/* One model's prices from effective_ms (UTC wall ms) until the next entry of the same model. */
typedef struct bill_price {
    char model[64];
    uint64_t effective_ms;
    uint64_t input_nusd_per_mtok;        /* base input price, nano-USD per million tokens */
    uint64_t output_nusd_per_mtok;       /* output price */
    bill_ratio_t write_5m;               /* multiplier on the input price, default 5/4 */
    bill_ratio_t write_1h;               /* default 2/1 */
    bill_ratio_t read;                   /* default 1/10 */
    uint64_t storage_nusd_per_mtok_hour; /* cache storage, per million token-hours, default 0 */
} bill_price_t;

typedef struct bill_pricing bill_pricing_t;

/* Parses a pricing table (YAML, format in conf/pricing.yaml) from a file or from memory. Every
 * price is a decimal USD string with at most 9 decimals ("3", "0.30"), parsed exactly; a
 * multiplier is "5/4" or an exact decimal ("1.25"). Any unknown key, malformed value, duplicate
 * (model, effective) pair or missing price fails with PC_ERR_FORMAT and a one-line reason in err;
 * nothing is allocated then. The table is immutable afterwards and safe to share across threads. */
int bill_pricing_load(const char *path, bill_pricing_t **out, char *err, size_t err_len);
int bill_pricing_parse(const char *yaml, size_t len, bill_pricing_t **out, char *err,
                       size_t err_len);
void bill_pricing_free(bill_pricing_t *p);

/* The price of model in effect at at_ms: the entry with the latest effective_ms <= at_ms.
 * PC_ERR_NOTFOUND when the model is unknown or has no price yet at at_ms: the request must be
 * refused, never billed at 0. *out points into p and lives as long as p. */
int bill_pricing_lookup(const bill_pricing_t *p, const char *model, uint64_t at_ms,
                        const bill_price_t **out);

/* Number of entries and the i-th one (in model, effective order), for listings. */
size_t bill_pricing_count(const bill_pricing_t *p);
const bill_price_t *bill_pricing_at(const bill_pricing_t *p, size_t i);

/* Exact parsers shared with the CLI: a decimal USD amount -> nano-USD ("3.75" -> 3750000000),
 * and a multiplier ("5/4", "2", "0.1") -> a reduced rational. PC_ERR_FORMAT or PC_ERR_RANGE. */
int bill_parse_usd(const char *s, uint64_t *nusd);
int bill_parse_ratio(const char *s, bill_ratio_t *out);

/* An RFC 3339 UTC time ("2025-06-01", "2025-06-01T12:00:00Z", fractional seconds allowed) or
 * integer milliseconds since the epoch -> UTC ms. PC_ERR_FORMAT. */
int bill_parse_time_ms(const char *s, uint64_t *ms);

/* ---------------------------------------------------------------------------------------------
 * Cost arithmetic
 * ------------------------------------------------------------------------------------------- */

/* n_tokens x price x mult.num / (mult.den x 10^6), rounded half-to-even to nano-USD. 0 or
 * PC_ERR_RANGE when an intermediate exceeds 128 bits or the result 64 bits (*cost untouched). */
int bill_cost_tokens(uint64_t n_tokens, uint64_t price_nusd_per_mtok, bill_ratio_t mult,
                     uint64_t *cost_nusd);

/* token_ms x price / (3.6e6 x 10^6): token-milliseconds priced per million token-hours. */
int bill_cost_storage(uint64_t token_ms, uint64_t price_nusd_per_mtok_hour, uint64_t *cost_nusd);

/* The general form: a x b x num / den in 128 bits, rounded half-to-even. PC_ERR_INVAL when
 * den is 0, PC_ERR_RANGE on overflow (*out untouched). */
int bill_muldiv_round(uint64_t a, uint64_t b, uint64_t num, uint64_t den, uint64_t *out);

/* Formats nano-USD as an exact decimal USD string with 9 decimals ("0.000001875"); buf holds at
 * least 32 bytes. Returns buf. Negative amounts never occur on the money path. */
char *bill_nusd_str(uint64_t nusd, char buf[32]);

/* ---------------------------------------------------------------------------------------------
 * Usage buckets and Anthropic's mixed-TTL rule
 * ------------------------------------------------------------------------------------------- */

enum bill_bucket {
    BILL_BUCKET_UNCACHED = 0, /* input tokens neither read from nor written to the cache */
    BILL_BUCKET_WRITE_5M = 1,
    BILL_BUCKET_WRITE_1H = 2,
    BILL_BUCKET_READ = 3,
    BILL_BUCKET_OUTPUT = 4,
    BILL_BUCKET_STORAGE = 5, /* storage events only: quantity in token-ms */
    BILL_BUCKET_COUNT = 6,
};

/* Stable short names ("uncached_input", "cache_write_5m", "cache_write_1h", "cache_read",
 * "output", "cache_storage") used in exports and Redis counters; NULL when out of range. */
const char *bill_bucket_name(int bucket);

typedef struct bill_usage {
    uint64_t n_uncached;
    uint64_t n_write_5m;
    uint64_t n_write_1h;
    uint64_t n_read;
    uint64_t n_output;
} bill_usage_t;

/* Anthropic's mixed-TTL split [api-spec §1.7]: A = prompt tokens at the highest cache hit (0 if
 * none), B = at the highest 1h breakpoint after A (= A if none), C = at the last breakpoint
 * (= B if none), n_prompt = all prompt tokens. read = A, write_1h = B - A, write_5m = C - B,
 * uncached = n_prompt - C. PC_ERR_INVAL unless A <= B <= C <= n_prompt (*out untouched). */
int bill_usage_split_abc(uint64_t a, uint64_t b, uint64_t c, uint64_t n_prompt, bill_usage_t *out);

/* OpenAI's inclusive view [api-spec §2.2]: prompt_tokens = every prompt bucket,
 * cached_tokens = read, cache_write_tokens = both writes. */
void bill_usage_openai_view(const bill_usage_t *u, uint64_t *prompt_tokens, uint64_t *cached_tokens,
                            uint64_t *cache_write_tokens);

/* The inverse: uncached = prompt_tokens - cached - cache_write (all writes billed as 5m writes,
 * OpenAI having no TTL split). PC_ERR_INVAL when cached + write exceed prompt_tokens. */
int bill_usage_from_openai(uint64_t prompt_tokens, uint64_t cached_tokens,
                           uint64_t cache_write_tokens, uint64_t completion_tokens,
                           bill_usage_t *out);

/* ---------------------------------------------------------------------------------------------
 * Events
 * ------------------------------------------------------------------------------------------- */

#define BILL_STR_MAX 64 /* every string field: at most 63 bytes plus the NUL */

enum bill_event_kind {
    BILL_EVENT_USAGE = 1,   /* one per request that reached a worker */
    BILL_EVENT_STORAGE = 2, /* cache storage of one namespace over one window */
};

enum bill_status {
    BILL_STATUS_COMPLETED = 0,    /* ran to its end (end_turn, max_tokens, stop sequence) */
    BILL_STATUS_STOPPED = 1,      /* stopped by the gateway (limit, policy) */
    BILL_STATUS_FAILED = 2,       /* the worker failed mid-request: bill what was computed */
    BILL_STATUS_CANCELLED = 3,    /* cancelled on purpose (admin, shutdown deadline) */
    BILL_STATUS_DISCONNECTED = 4, /* the client went away mid-stream */
    BILL_STATUS_COUNT = 5,
};

/* "completed", "stopped", "failed", "cancelled", "disconnected"; NULL when out of range. */
const char *bill_status_name(int status);

/* How the cache part of a usage event was decided when several gateways share one cache
 * (docs/ARCHITECTURE.md, scale-out): without a registry (one gateway, or records written before
 * the field existed), with the shared registry in Redis, or from this gateway's local view alone
 * because Redis did not answer in time (its reads and writes may differ from what the other
 * gateways saw). Storage events: shared when the meter lease was held with Redis, local while
 * metering on without it, none without a registry. */
enum bill_registry {
    BILL_REGISTRY_NONE = 0,
    BILL_REGISTRY_SHARED = 1,
    BILL_REGISTRY_LOCAL = 2,
    BILL_REGISTRY_COUNT = 3,
};

/* "none", "shared", "local"; NULL when out of range. */
const char *bill_registry_name(int registry);

/* The inverse: the enum value, or -1 when s is none of the names. */
int bill_registry_parse(const char *s);

/* A usage or storage event. Plain data with fixed-size strings, so it is copied by value and the
 * ledger owns its own copy the moment bill_ledger_append returns. Strings are NUL-terminated,
 * printable ASCII or UTF-8 without control characters, at most BILL_STR_MAX - 1 bytes.
 *
 * Usage events: event_id, request_id, tenant, model are required; api_key_id and ns optional.
 * start_ms/end_ms are the request's wall-clock start and end (UTC ms); cost[] follows from the
 * price of model at start_ms (bill_event_price); token_ms is 0.
 * Storage events: event_id, ns, tenant, model required; [start_ms, end_ms) is the metering
 * window, token_ms the cached tokens x time integrated over it; only cost[STORAGE] is set. */
typedef struct bill_event {
    uint8_t kind;     /* enum bill_event_kind */
    uint8_t status;   /* enum bill_status (usage events; 0 for storage) */
    uint8_t registry; /* enum bill_registry */
    char event_id[BILL_STR_MAX];
    char request_id[BILL_STR_MAX];
    char tenant[BILL_STR_MAX];
    char api_key_id[BILL_STR_MAX];
    char model[BILL_STR_MAX];
    char ns[BILL_STR_MAX]; /* cache namespace id (hex), storage events; optional on usage */
    uint64_t start_ms;
    uint64_t end_ms;
    bill_usage_t usage;
    uint64_t n_hit_logical;  /* prompt tokens billed as cache hits (= usage.n_read) */
    uint64_t n_hit_physical; /* of those, tokens whose KV the worker still held */
    uint64_t token_ms;       /* storage events */
    uint64_t cost_nusd[BILL_BUCKET_COUNT];
} bill_event_t;

/* Zeroes ev and sets the kind; strings are copied with bill_event_set_str. */
void bill_event_init(bill_event_t *ev, int kind);

/* Copies s into one of ev's string fields (dst must be a field of an event). PC_ERR_INVAL when
 * s is too long or holds control characters; the field is then left unchanged. */
int bill_event_set_str(char dst[BILL_STR_MAX], const char *s);

/* Checks every field (required strings, kind, status, registry, start <= end, logical >= physical
 * hits, logical hits <= read). 0 or PC_ERR_INVAL with the reason in err. */
int bill_event_validate(const bill_event_t *ev, char *err, size_t err_len);

/* Fills ev->cost_nusd from the price of ev->model at ev->start_ms. PC_ERR_NOTFOUND for an unknown
 * model (the caller refuses the request), PC_ERR_RANGE on overflow; ev unchanged on failure. */
int bill_event_price(bill_event_t *ev, const bill_pricing_t *p, char *err, size_t err_len);

/* Sum of cost_nusd over every bucket. */
uint64_t bill_event_total_nusd(const bill_event_t *ev);

/* Sum of token buckets (prompt + output), or token_ms for storage events. */
uint64_t bill_event_quantity(const bill_event_t *ev);

/* Binary encoding of an event: the ledger record payload, documented byte by byte in ledger.h.
 * The payload has a format version, the ledger record's version byte: 1 (before the registry
 * field), 2 (the current one: format 1 followed by the registry byte). encode writes the current
 * format, at most BILL_EVENT_MAX_ENCODED bytes, and returns the length; decode reads the current
 * format, decode_format the given one (format 1 reads as registry none). Both check every field
 * (as bill_event_validate) and fail with PC_ERR_FORMAT on any malformed input or unknown format. */
#define BILL_EVENT_FORMAT 2
#define BILL_EVENT_MAX_ENCODED (4 + 6 * BILL_STR_MAX + 8 * 16 + 1)
size_t bill_event_encode(const bill_event_t *ev, uint8_t *buf);
int bill_event_decode(const uint8_t *buf, size_t len, bill_event_t *ev);
int bill_event_decode_format(const uint8_t *buf, size_t len, int format, bill_event_t *ev);

/* Unique event ids: "<16 hex random per generator>-<16 hex counter>". The random half is drawn
 * from the kernel (getrandom) at init, so ids never repeat across restarts. Not thread-safe: one
 * generator per thread (the gateway's loop). */
typedef struct bill_idgen {
    uint64_t boot;
    uint64_t next;
} bill_idgen_t;
int bill_idgen_init(bill_idgen_t *g);
void bill_idgen_next(bill_idgen_t *g, char out[BILL_STR_MAX]);

/* CRC32C (Castagnoli), as framed in ledger records. crc starts at 0. */
uint32_t bill_crc32c(uint32_t crc, const void *data, size_t len);

/* UTC calendar helpers: "YYYY-MM-DD" of a time (buf >= 11 bytes), the start of its day in ms,
 * and RFC 3339 "YYYY-MM-DDTHH:MM:SS.mmmZ" (buf >= 25 bytes). */
void bill_day_str(uint64_t ms, char *buf);
uint64_t bill_day_start_ms(uint64_t ms);
void bill_time_str(uint64_t ms, char *buf);

/* ---------------------------------------------------------------------------------------------
 * Exports: usage as CSV, JSON lines or FOCUS 1.0 CSV, per event or grouped per tenant x model x
 * UTC day x bucket. Amounts are exact decimal USD strings with 9 decimals. The writer is
 * streaming: output goes to a chunk callback a chunk at a time (at most chunk_bytes plus one row),
 * memory stays bounded by the number of groups and of sources, never by the number of events.
 * Per-event rows carry the event's registry and the instance (gateway) whose ledger holds it.
 *
 * Sources. One ledger (bill_export_open), or the merged view of several gateways
 * (bill_export_open_sources): ledgers, one per instance, and the streams the shipper wrote to
 * Redis (shipper.h) for every other instance found there (PREFIX:gws; scan_streams also finds
 * PREFIX:ledger:* streams of older shippers); a ledger is the record, so an instance's stream is
 * read only when its ledger is not given. Every event is exported once, in the order of a k-way
 * merge of the sources by (end_ms, instance, seq): each source is read in seq order, which is its
 * end-time order but for a gateway's wall clock stepping back, and only each source's next event is
 * held. The same event id in two sources (at the same end time, as a copy would be) fails the
 * export (PC_ERR_FORMAT), as do two ledgers of one instance (PC_ERR_INVAL). A stream entry is
 * checked as a ledger record is; entries shipped before the registry field lack per-bucket costs
 * and fail the export (export that instance from its ledger). Redis is read with blocking commands,
 * each under the connection's timeout: like ledger reads, open and steps run off the gateway's
 * loop.
 *
 *   bill_export_params_t xp = bill_export_params_default();
 *   xp.format = BILL_EXPORT_FOCUS; xp.chunk = send_chunk; xp.ud = conn;
 *   bill_export_t *x;  bill_export_open("var/ledger", &xp, &x, err, sizeof err);
 *   while ((rc = bill_export_step(x, 1000, err, sizeof err)) == 0) { ... yield ... }
 *   bill_export_free(x);                 // rc == 1: done, every chunk delivered
 *
 * Reading the ledger is file I/O: the gateway runs steps on a worker thread, not on its loop.
 * An event belongs to the time range [from_ms, to_ms) by its start_ms (storage: window start).
 * An export reads only the ledger segments whose time index says they can hold such an event
 * (and the open segment), so a day's export costs about a day of ledger, not the whole ledger.
 * ------------------------------------------------------------------------------------------- */

enum bill_export_format {
    BILL_EXPORT_CSV = 0,
    BILL_EXPORT_JSONL = 1,
    BILL_EXPORT_FOCUS = 2,
};

enum bill_export_group {
    BILL_GROUP_NONE = 0, /* one row per event (FOCUS: per event and bucket) */
    BILL_GROUP_DAY = 1,  /* one row per tenant x model x UTC day x bucket */
};

/* "csv" | "jsonl" | "focus" and "none" | "day"; -1 when unknown. */
int bill_export_format_parse(const char *s);
int bill_export_group_parse(const char *s);

/* Receives the next piece of output; a non-zero return stops the export with PC_ERR_CANCELED. */
typedef int (*bill_export_chunk_fn)(void *ud, const char *data, size_t len);

typedef struct bill_export_params {
    uint64_t from_ms;              /* inclusive, default 0 */
    uint64_t to_ms;                /* exclusive, default UINT64_MAX */
    const char *tenant;            /* only this tenant; NULL: all */
    int format;                    /* enum bill_export_format, default CSV */
    int group;                     /* enum bill_export_group, default NONE */
    bool header;                   /* CSV/FOCUS header line, default true */
    size_t chunk_bytes;            /* default 64 KiB */
    const bill_pricing_t *pricing; /* optional: FOCUS ListUnitPrice/SkuPriceId per event */
    const char *provider;          /* FOCUS ProviderName etc., default "kvgw" */
    bool scan_all;                 /* read every segment, ignoring the ledger's time index
                                      (ledger.h); the output is the same either way. For
                                      benchmarks, tests and doubt. Default false */
    bill_export_chunk_fn chunk;
    void *ud;
} bill_export_params_t;

bill_export_params_t bill_export_params_default(void);

typedef struct bill_export bill_export_t;

/* Opens an export over the ledger in dir. Strings in p are copied. PC_ERR_INVAL for bad params. */
int bill_export_open(const char *dir, const bill_export_params_t *p, bill_export_t **out, char *err,
                     size_t err_len);

struct bill_redis_params; /* redisconn.h */

/* The inputs of a merged export (see Sources). */
typedef struct bill_export_sources {
    const char *const *ledger_dirs; /* [n_ledgers] ledger directories, one per instance */
    size_t n_ledgers;
    const struct bill_redis_params *redis; /* NULL: no Redis; else the primary to read */
    const char *redis_prefix;              /* the shipper's key prefix, default "kvgw" */
    /* The instances read from Redis are PREFIX:gws (every shipper adds its own). true also SCANs
     * the keyspace for PREFIX:ledger:* streams, for streams shipped by a kvgw older than that
     * (slow on a large Redis: it walks the cache entries too). Default false. */
    bool scan_streams;
} bill_export_sources_t;

/* Opens a merged export (at least one ledger or Redis). Connects to Redis and lists its instances
 * now (blocking). PC_ERR_INVAL (bad params, an instance's ledger twice), PC_ERR_NOTFOUND (not a
 * ledger), PC_ERR_UPSTREAM (Redis), PC_ERR_FORMAT (a bad instance id in Redis), with the reason. */
int bill_export_open_sources(const bill_export_sources_t *src, const bill_export_params_t *p,
                             bill_export_t **out, char *err, size_t err_len);

/* The export's sources: their count, and the instance id of the i-th (NULL past the end) with
 * *from_redis (may be NULL) telling whether it is read from its Redis stream. */
size_t bill_export_n_sources(const bill_export_t *x);
const char *bill_export_source(const bill_export_t *x, size_t i, bool *from_redis);

/* Processes up to max_records ledger records. 0: more to do; 1: done, all output delivered;
 * negative: failed (PC_ERR_FORMAT for a damaged ledger, PC_ERR_CANCELED, PC_ERR_NOMEM, ...). */
int bill_export_step(bill_export_t *x, size_t max_records, char *err, size_t err_len);

void bill_export_free(bill_export_t *x);

/* How much of the ledger an export read so far: segment files read and sealed segments skipped
 * because their time index proves they hold no event of the range. Either pointer may be NULL. */
void bill_export_segments(const bill_export_t *x, uint64_t *n_read, uint64_t *n_skipped);

/* Runs an export to the end. */
int bill_export_run(const char *dir, const bill_export_params_t *p, char *err, size_t err_len);

/* Totals over an export's selection (for verify and tests): events, and cost per bucket. */
typedef struct bill_totals {
    uint64_t n_events;
    uint64_t quantity[BILL_BUCKET_COUNT]; /* tokens; storage: token_ms */
    uint64_t cost_nusd[BILL_BUCKET_COUNT];
} bill_totals_t;

/* Adds one event into t; PC_ERR_RANGE on overflow (t unchanged). */
int bill_totals_add(bill_totals_t *t, const bill_event_t *ev);

#endif
