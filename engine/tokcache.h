/*
 * tokcache.h — a segment token cache: text -> the token ids eng_tok_encode gives for it.
 *
 * Prompt rendering is segment-wise (render.h): every TEXT segment is tokenized on its own, so
 * its ids depend on its bytes alone and a cache of (text -> ids) is exact. Long system prompts
 * and tool lists repeat from request to request; re-encoding ~32 KB of text costs milliseconds,
 * a cache hit microseconds.
 *
 * Keys. An entry is found by a 128-bit XXH3 of (scope, text) and confirmed by comparing the
 * stored text byte for byte, so a hit is exact whatever the hash does (xxHash is not
 * collision-resistant against adversaries; the comparison makes that irrelevant). `scope` is
 * the caller's partition: the gateway passes the request's cache namespace, so one tenant's
 * prompts never make another tenant's requests faster (no timing side channel through this
 * cache), and a caller without tenants passes 0.
 *
 * Bounds. Entries cost their text, their ids and a fixed header; the total stays at or under
 * max_bytes, the least recently used entries going first. Texts shorter than min_text_bytes
 * are never cached (tiny segments would churn the cache for no gain); an entry larger than
 * max_bytes is not cached either.
 *
 * Threads. Every function may be called from several threads at once. One mutex guards the
 * table; it is held only to look up, copy ids out, link and unlink entries: never while
 * tokenizing, never while allocating an entry. The ids of a miss are computed outside the lock
 * (two threads missing the same text both tokenize it; the second insert is dropped).
 *
 * Memory. A failed allocation inside the cache (an entry, a table resize) only means a miss or
 * an entry not kept; results stay exactly eng_tok_encode's. Allocation goes through pc_ hooks.
 */
#ifndef ENG_TOKCACHE_H
#define ENG_TOKCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

typedef struct eng_tokcache eng_tokcache_t;

typedef struct eng_tokcache_params {
    size_t max_bytes;      /* budget for entries (text + ids + headers); default 64 MiB */
    size_t min_text_bytes; /* shorter texts bypass the cache; default 256 */
} eng_tokcache_params_t;

eng_tokcache_params_t eng_tokcache_params_default(void);

/* A cache over tokenizer tok, which must outlive it. p NULL means the defaults; max_bytes 0 is
 * PC_ERR_INVAL (callers that want no cache keep a NULL cache instead). Returns 0 with *out set,
 * PC_ERR_INVAL or PC_ERR_NOMEM. */
int eng_tokcache_init(const eng_tok_t *tok, const eng_tokcache_params_t *p, eng_tokcache_t **out);

/* Frees every entry; NULL is a no-op. No other call may be running on c. */
void eng_tokcache_free(eng_tokcache_t *c);

/* The tokenizer the cache was made for. */
const eng_tok_t *eng_tokcache_tok(const eng_tokcache_t *c);

/* Exactly eng_tok_encode(eng_tokcache_tok(c), text, len, ids, n_ids, cap): appends the ids of
 * text to the growable array (*ids, *n_ids, *cap), reallocated through pc_realloc, served from
 * the cache when (scope, text) is in it and inserted into it after a miss. Returns 0 or
 * PC_ERR_NOMEM (the array could not grow; *n_ids is then unchanged) or the tokenizer's error. */
int eng_tokcache_encode(eng_tokcache_t *c, uint64_t scope, const char *text, size_t len,
                        uint32_t **ids, size_t *n_ids, size_t *cap);

typedef struct eng_tokcache_stats {
    uint64_t hits, misses; /* encode calls at or above min_text_bytes */
    uint64_t bypassed;     /* encode calls below min_text_bytes */
    uint64_t inserts, evictions;
    uint64_t insert_failures; /* entries not kept for lack of memory */
    size_t n_entries;
    size_t bytes; /* what the entries cost now (<= max_bytes) */
    size_t max_bytes;
} eng_tokcache_stats_t;

/* A consistent snapshot of the counters. */
eng_tokcache_stats_t eng_tokcache_stats(eng_tokcache_t *c);

#endif
