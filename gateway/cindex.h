/*
 * cindex.h — the gateway's cache index: live cache entries per namespace, their TTLs, which
 * workers physically hold them, eviction under a memory cap and storage metering.
 *
 * One index per gateway, used on the loop thread only. It is a pure data structure built on
 * radix/ (one tree, one hidden root per namespace): no I/O, no threads, no clock. Every time is
 * passed in, in milliseconds; times are clamped to be non-decreasing (a call with an earlier
 * time than a previous call acts at the latest time seen).
 *
 * Entries (logical, what billing follows). An entry is (namespace, token prefix, expiry, TTL
 * class, created). gw_cindex_insert writes one once the request's prefill is done; its expiry
 * is the request's start + the TTL of its class. An entry is live while now < expiry. Writing
 * a live entry again, or reading it (gw_cindex_read), extends its expiry to max(old, now +
 * TTL) and never shortens it. An entry covers every token up to its length, so in `accounting:
 * token` the read length of a prompt is the longest prefix of it covered by a live entry; for
 * `accounting: anthropic` the gateway probes block boundaries with gw_cindex_entry_live.
 *
 * The tree holds exactly the prefixes of the live entries: a token (a node of the radix tree)
 * lives as long as the longest-lived entry that extends it. Expiry is exact: every call that
 * carries a time first retires the entries whose expiry has passed (cost proportional to what
 * expires: a min-heap of expiries), reports each through params.on_drop, and frees the tokens
 * that no live entry needs any more. gw_cindex_expire is the loop timer's way of doing just that.
 *
 * Physical owners (what routing follows). Workers 0..63 are tracked per node, at entry
 * granularity along a path: gw_cindex_owner_add(tokens, n, w) records that w holds the path up
 * to the longest live entry ending within tokens[0..n); gw_cindex_owner_evicted clears w from
 * the path beyond the longest live entry that ends within what the worker kept;
 * gw_cindex_worker_down clears w everywhere. What w holds of a prompt (gw_cindex_match_t.held)
 * is the longest prefix of the prompt whose every token is held by w. Losing the KV never
 * touches the entries: they stay logically live (billed as reads) while physically lost.
 *
 * Tiers (issue 21). A worker holds a node of a path in one of its KV tiers: G1 its pool, G2
 * host memory, G3 its local disk (engine/wire.h, KV_EVENT and SNAPSHOT tier bytes). An owner
 * holds a node in G1 unless the node carries its G2 or G3 mark (never both; a mark only on a
 * node it owns). gw_cindex_owner_add_tier merges by the best tier (a request that ran the
 * prompt holds all of it in G1; a SNAPSHOT's disk entry never demotes what is known to be in
 * the pool); gw_cindex_owner_demoted moves a worker's nodes down to G2 or G3 over the range
 * gw_cindex_owner_evicted would clear (tier 0 is that eviction). gw_cindex_match_t.held_g2 /
 * held_g3 say how much of held[w] lies in those tiers, which the router prices as loads.
 * Marks are radix owners 64 + w (G2) and 128 + w (G3): they split, copy and account with the
 * nodes, and the first mark on a node allocates its owner bitmap (the only allocation of the
 * owner calls; a failed demotion changes nothing and the caller falls back to the eviction).
 *
 *     entries [1 2 3 4] and [1 2 3 4 5 6], owner_add([1 2 3 4 5 6 7], 7, w=2):
 *
 *     (root ns)                          match([1 2 3 4 5 9]):
 *         |                                n_matched = n_hit = 5
 *     [1 2 3 4] entry  owners {2}          entries: [4] (6 is not within the prompt)
 *         |                                held[2] = 5 (w=2 holds all 5 matched tokens)
 *     [5 6] entry      owners {2}          held[others] = 0
 *
 * Eviction. With params.max_tokens / max_nodes set, an insert that takes the index past a cap
 * evicts whole entries in least-recently-used order (a read or write of an entry uses it and
 * its prefixes), leaves first, reporting each through on_drop with the cap's reason.
 *
 * Storage metering. Per namespace, the index integrates (tokens stored) x (time) exactly, in
 * token-milliseconds with integer arithmetic: each stored token counts once per namespace for
 * as long as it lives (until the expiry of the longest-lived entry that extends it, or its
 * eviction). gw_cindex_storage_take hands out what accumulated since the previous take.
 *
 * Errors and OOM. Fallible functions return 0 (or a documented positive soft outcome) or a
 * negative PC_ERR_*; a failed mutation changes nothing (tested with a failing allocator).
 * Retiring, evicting and dropping never allocate.
 */
#ifndef GW_CINDEX_H
#define GW_CINDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gw_cindex gw_cindex_t;

/* Workers are 0..GW_CINDEX_MAX_WORKERS-1 (a 64-bit set). */
#define GW_CINDEX_MAX_WORKERS 64
/* gw_cindex_match_t keeps the lengths of at most this many entries (the longest ones). */
#define GW_CINDEX_MATCH_ENTRIES 32

/* TTL classes of an entry (Anthropic's "5m" and "1h"). A longer class always wins when an
 * entry is written with both. */
typedef enum gw_cindex_ttl {
    GW_CINDEX_TTL_5M = 0,
    GW_CINDEX_TTL_1H = 1,
} gw_cindex_ttl_t;
#define GW_CINDEX_TTL_COUNT 2

/* Why an entry left the index (gw_cindex_drop_t.reason, stats arrays). */
enum gw_cindex_drop_reason {
    GW_CINDEX_DROP_EXPIRE = 0,       /* its TTL passed */
    GW_CINDEX_DROP_EVICT_TOKENS = 1, /* LRU eviction to stay under params.max_tokens */
    GW_CINDEX_DROP_EVICT_NODES = 2,  /* LRU eviction to stay under params.max_nodes */
    GW_CINDEX_DROP_REMOVE = 3,       /* gw_cindex_drop_ns (tenant deleted, salt rotated) */
};
#define GW_CINDEX_DROP_REASONS 4

/* One entry leaving the index, as passed to params.on_drop. tokens points into the index's
 * scratch memory and is valid during the callback only. */
typedef struct gw_cindex_drop {
    uint64_t ns;
    const uint32_t *tokens; /* [n_tokens] the entry's prefix */
    size_t n_tokens;
    uint64_t owners;     /* workers that held the whole entry (bit w = worker w) */
    uint64_t expiry_ms;  /* its expiry (for EXPIRE: when it passed) */
    uint64_t created_ms; /* when it was first written */
    gw_cindex_ttl_t ttl;
    int reason; /* enum gw_cindex_drop_reason */
} gw_cindex_drop_t;

typedef struct gw_cindex_params {
    /* Token ids are < vocab_size (0: any uint32_t); it sets the radix tree's packed width. */
    uint64_t vocab_size;
    /* Workers are < n_workers (1..64; default 64). */
    uint32_t n_workers;
    /* TTL per class in ms (defaults 300,000 and 3,600,000; must be > 0). */
    uint64_t ttl_ms[GW_CINDEX_TTL_COUNT];
    /* Caps on stored tokens and radix nodes (0: none). */
    uint64_t max_tokens;
    uint64_t max_nodes;
    /* Called for every entry that leaves the index, from inside whichever call retired it
     * (any call that carries a time, an insert that evicted, gw_cindex_drop_ns). It must not
     * call back into the index. May be NULL. */
    void (*on_drop)(const gw_cindex_drop_t *ev, void *ud);
    void *ud;
} gw_cindex_params_t;

/* The result of gw_cindex_match. Lengths are in tokens. */
typedef struct gw_cindex_match {
    uint32_t n_matched; /* longest prefix of the query stored in the index */
    uint32_t n_hit;     /* longest prefix covered by a live entry (accounting: token) */
    /* Live entries that end within the query (prefixes of it), and the lengths of the longest
     * min(n_entries, GW_CINDEX_MATCH_ENTRIES) of them in ascending order. */
    uint32_t n_entries;
    uint32_t entry_len[GW_CINDEX_MATCH_ENTRIES];
    /* Physical: held[w] = the longest prefix of the query whose every token worker w holds
     * (0 for workers >= n_workers); holders = the workers with held[w] > 0. */
    uint64_t holders;
    uint32_t held[GW_CINDEX_MAX_WORKERS];
    /* Of held[w], the tokens w holds only in G2 (host memory) and only in G3 (disk); the rest,
     * held - held_g2 - held_g3, is in its pool (G1). */
    uint32_t held_g2[GW_CINDEX_MAX_WORKERS];
    uint32_t held_g3[GW_CINDEX_MAX_WORKERS];
} gw_cindex_match_t;

typedef struct gw_cindex_stats {
    uint64_t n_entries;    /* live entries */
    uint64_t n_tokens;     /* stored tokens, all namespaces (each once per namespace) */
    uint64_t n_nodes;      /* radix nodes */
    uint64_t n_bytes;      /* the radix tree's bytes plus the index's own tables */
    uint64_t n_namespaces; /* namespaces with at least one stored token */
    uint64_t n_inserts;    /* entries written new */
    uint64_t n_extends;    /* writes and reads that found a live entry (expiry refreshed) */
    /* Tokens the inserts, matches and reads walked down the tree (their cost on the loop):
     * gw_cindex_insert walks its whole prefix twice, gw_cindex_insert_path its longest once. */
    uint64_t n_walk_tokens;
    uint64_t entries_dropped[GW_CINDEX_DROP_REASONS];
    uint64_t tokens_freed[GW_CINDEX_DROP_REASONS]; /* stored tokens that went with them */
} gw_cindex_stats_t;

typedef struct gw_cindex_ns_stats {
    uint64_t n_entries;
    uint64_t n_tokens;
    uint64_t n_nodes;
} gw_cindex_ns_stats_t;

/* ---- lifecycle -------------------------------------------------------------------------- */

/* Defaults: any token id, 64 workers, TTLs 5 min / 1 h, no caps, no callback. */
gw_cindex_params_t gw_cindex_params_default(void);

/* Creates an empty index. Returns 0 and *out, PC_ERR_INVAL (bad params: n_workers not in
 * 1..64, a TTL of 0, vocab_size above 2^32) or PC_ERR_NOMEM. The params are copied. */
int gw_cindex_init(const gw_cindex_params_t *params, gw_cindex_t **out);

/* Frees the index (no on_drop calls). NULL is a no-op. */
void gw_cindex_free(gw_cindex_t *ix);

/* ---- entries ---------------------------------------------------------------------------- */

/* Writes the entry tokens[0..n) of namespace ns, once the prefill of a request that started
 * at start_ms is done at now_ms: expiry = start_ms + ttl_ms[ttl] (a start after now counts as
 * now). A live entry keeps its creation time and gets max(old expiry, new expiry) and the
 * longer TTL class. Retires due entries first and may evict others afterwards (on_drop).
 * Returns 0 (new entry), 1 (a live entry was extended), 2 (the expiry is already past: nothing
 * written), PC_ERR_INVAL (NULL ix or tokens, n == 0, bad ttl), PC_ERR_RANGE (a token >=
 * vocab_size, n above 2^30), PC_ERR_NOSPACE (n alone exceeds max_tokens) or PC_ERR_NOMEM; on
 * error nothing changed (due entries may still have been retired: that is not a change of
 * state, only of its timing). */
int gw_cindex_insert(gw_cindex_t *ix, uint64_t ns, const uint32_t *tokens, size_t n,
                     gw_cindex_ttl_t ttl, uint64_t start_ms, uint64_t now_ms);

/* One entry of a path for gw_cindex_insert_path: the prefix tokens[0..n_tokens) with its TTL. */
typedef struct gw_cindex_point {
    uint32_t n_tokens;
    gw_cindex_ttl_t ttl;
} gw_cindex_point_t;

/* Writes the entries tokens[0..pts[i].n_tokens) of namespace ns, i < n_pts (n_tokens strictly
 * increasing): what gw_cindex_insert for each point in order does (same entries, expiries, TTL
 * classes, storage integral), in one walk down the path, shortest first, so its cost is
 * O(longest prefix + points) instead of O(points x longest prefix). A request's cache plan
 * writes its entries this way (gateway/serve.c, insert_entries). Due entries are retired once
 * first, and the caps are enforced once, after the last point (gw_cindex_insert enforces them
 * after each), so under a cap the same request's shorter entries are never evicted to make
 * room for its longer ones. results[i] (results may be NULL) gets each point's
 * gw_cindex_insert code: 0 new, 1 extended, 2 expiry already past, PC_ERR_NOSPACE. Returns 0,
 * PC_ERR_INVAL (NULL ix, tokens or pts with n_pts > 0, n_tokens 0 or not increasing, bad ttl),
 * PC_ERR_RANGE (as gw_cindex_insert) or PC_ERR_NOMEM: then the points before the failing one
 * are written (results say which; the failing one and those after it get the error) and
 * nothing else changed. */
int gw_cindex_insert_path(gw_cindex_t *ix, uint64_t ns, const uint32_t *tokens,
                          const gw_cindex_point_t *pts, size_t n_pts, uint64_t start_ms,
                          uint64_t now_ms, int *results);

/* Looks tokens[0..n) up at now_ms (after retiring due entries) and fills *out. Does not
 * refresh anything: call gw_cindex_read with the length that is billed as read. Returns 0, or
 * PC_ERR_INVAL (NULL ix or out, NULL tokens with n > 0). */
int gw_cindex_match(gw_cindex_t *ix, uint64_t ns, const uint32_t *tokens, size_t n, uint64_t now_ms,
                    gw_cindex_match_t *out);

/* A read of tokens[0..n_read) at now_ms: every live entry that ends within it (a prefix of
 * length <= n_read) gets expiry max(old, now + its TTL) and counts as used for LRU. Stores in
 * *n_refreshed (may be NULL) how many entries that was. Cannot fail on valid arguments;
 * returns 0 or PC_ERR_INVAL. */
int gw_cindex_read(gw_cindex_t *ix, uint64_t ns, const uint32_t *tokens, size_t n_read,
                   uint64_t now_ms, size_t *n_refreshed);

/* True when a live entry (expiry > now_ms) ends exactly at tokens[0..n) in ns. Read-only: it
 * retires nothing, so it can run in any order with other look-ups (Anthropic's lookback). */
bool gw_cindex_entry_live(const gw_cindex_t *ix, uint64_t ns, const uint32_t *tokens, size_t n,
                          uint64_t now_ms);

/* The lengths of every live entry (expiry > now_ms) of ns that ends within tokens[0..n) (a
 * prefix of it), ascending, found in one walk down the path: the lookback's probes
 * (gw_cacheplan_anthropic_hit_sorted) answered for the cost of one match instead of one match
 * each. Writes the first min(count, cap) lengths to lens and returns the count. Read-only (as
 * gw_cindex_entry_live: it retires nothing). */
size_t gw_cindex_path_entries(const gw_cindex_t *ix, uint64_t ns, const uint32_t *tokens, size_t n,
                              uint64_t now_ms, uint32_t *lens, size_t cap);

/* Retires every entry whose expiry is <= now_ms (reporting each through on_drop with reason
 * EXPIRE) and frees the tokens left without a live entry. Returns how many entries this call
 * retired. Cost proportional to what expires. Cannot fail. */
size_t gw_cindex_expire(gw_cindex_t *ix, uint64_t now_ms);

/* Removes every entry of namespace ns (reason REMOVE). Returns the number of entries removed.
 * Uses the index's current time (no retiring). Cannot fail. */
size_t gw_cindex_drop_ns(gw_cindex_t *ix, uint64_t ns);

/* ---- physical owners -------------------------------------------------------------------- */

/* Worker w holds the KV of tokens[0..n) (it ran or retained that prompt): w becomes an owner
 * of the stored path up to the longest live entry that ends within tokens[0..n). Stores that
 * length in *n_held (may be NULL; 0 when no live entry is a prefix of the tokens, and then
 * nothing changes). Uses the index's current time. Returns 0, PC_ERR_RANGE (w >= n_workers)
 * or PC_ERR_INVAL. Never allocates. */
int gw_cindex_owner_add(gw_cindex_t *ix, uint64_t ns, const uint32_t *tokens, size_t n, uint32_t w,
                        uint32_t *n_held);

/* Where a worker holds KV (engine/wire.h's tier bytes): G1 its pool, G2 host memory, G3 its
 * disk. */
typedef enum gw_cindex_tier {
    GW_CINDEX_TIER_G1 = 1,
    GW_CINDEX_TIER_G2 = 2,
    GW_CINDEX_TIER_G3 = 3,
} gw_cindex_tier_t;

/* gw_cindex_owner_add with the tier w holds the path in: every node of the path that w did not
 * own becomes owned in that tier; a node it owned keeps the better of its tier and this one
 * (G1 < G2 < G3). block_tokens > 0 says the tokens are whole blocks of that many tokens (a
 * lower tier keeps nothing else): a live entry that ends less than a block beyond n, whose
 * whole blocks all lie within tokens[0..n), counts as held too (its holder recomputes the
 * partial last block), and *n_held is then its length. gw_cindex_owner_add is this with
 * GW_CINDEX_TIER_G1 and block_tokens 0 (which never allocates).
 * Returns 0, PC_ERR_RANGE (w >= n_workers), PC_ERR_INVAL (a bad tier, NULL tokens with n > 0)
 * or PC_ERR_NOMEM (G2/G3 only: a node's first mark; no owner or tier changed, though nodes
 * may keep the owner bitmaps given to them before the failure, as a grown table is kept). */
int gw_cindex_owner_add_tier(gw_cindex_t *ix, uint64_t ns, const uint32_t *tokens, size_t n,
                             uint32_t w, gw_cindex_tier_t tier, uint32_t block_tokens,
                             uint32_t *n_held);

/* Worker w moved positions [n_kept, n_tokens) of the path down to a lower tier (an EVICTED
 * event with tier 2 or 3): over the nodes gw_cindex_owner_evicted would clear, w keeps owning
 * those it owns, in the worse of their tier and this one; nodes it does not own stay unowned.
 * tier 0 is gw_cindex_owner_evicted itself. Returns 0, PC_ERR_RANGE, PC_ERR_INVAL (as
 * gw_cindex_owner_evicted, or a tier other than 0, 2, 3) or PC_ERR_NOMEM (a node's first
 * mark; no owner or tier changed, as for gw_cindex_owner_add_tier: the caller may clear the
 * nodes with gw_cindex_owner_evicted instead, which never allocates). */
int gw_cindex_owner_demoted(gw_cindex_t *ix, uint32_t w, uint64_t ns, const uint32_t *tokens,
                            size_t n_kept, size_t n_tokens, int tier);

/* Worker w dropped positions [n_kept, n_tokens) of the path tokens[0..n_tokens) (an EVICTED
 * event): w stops owning every node of that path beyond the longest live entry of length <=
 * n_kept, up to the longest live entry of length <= n_tokens (what it kept between entry
 * boundaries is not tracked). Returns 0, PC_ERR_RANGE (w >= n_workers) or PC_ERR_INVAL
 * (n_kept > n_tokens, NULL tokens with n_tokens > 0). Never allocates. */
int gw_cindex_owner_evicted(gw_cindex_t *ix, uint32_t w, uint64_t ns, const uint32_t *tokens,
                            size_t n_kept, size_t n_tokens);

/* Worker w went down: it holds nothing any more, in no tier (a restarted worker lists what
 * its disk kept in its SNAPSHOT). The entries stay logically live. O(stored nodes). Returns 0,
 * PC_ERR_RANGE or PC_ERR_INVAL. */
int gw_cindex_worker_down(gw_cindex_t *ix, uint32_t w);

/* ---- metering and stats ----------------------------------------------------------------- */

/* Retires due entries at now_ms, then calls cb(ns, token_ms, ud) once per namespace whose
 * integral of stored tokens x time since the previous take (or since its first token) is not
 * zero, and starts the next period. Returns the number of calls. Cannot fail. */
size_t gw_cindex_storage_take(gw_cindex_t *ix, uint64_t now_ms,
                              void (*cb)(uint64_t ns, uint64_t token_ms, void *ud), void *ud);

/* Index-wide figures. */
void gw_cindex_stats(const gw_cindex_t *ix, gw_cindex_stats_t *out);

/* One namespace's figures: 0, or PC_ERR_NOTFOUND (nothing stored; *out zeroed). */
int gw_cindex_ns_stats(const gw_cindex_t *ix, uint64_t ns, gw_cindex_ns_stats_t *out);

/* Tokens of the stored nodes worker w owns, in any tier (0 for a worker out of range). */
uint64_t gw_cindex_worker_tokens(const gw_cindex_t *ix, uint32_t w);

/* Of those, the tokens w holds in one tier (GW_CINDEX_TIER_*; 0 for a bad tier or worker). */
uint64_t gw_cindex_worker_tier_tokens(const gw_cindex_t *ix, uint32_t w, gw_cindex_tier_t tier);

/* Checks every invariant (the radix tree's, the expiry heap, entries against tree nodes,
 * per-namespace counts). Returns 0, or PC_ERR_INTERNAL with the first violation in err. */
int gw_cindex_check(const gw_cindex_t *ix, char *err, size_t len);

#endif
