/*
 * outcome.h — what happened to a request's prompt in the cache, defined once.
 *
 * The same classification is printed in the kvgw-cache header (outcome=...), used as the label
 * of kvgw_cache_lookups_total{result} and kvgw_time_to_first_token_seconds{cache}, written in
 * the access log ("outcome") and shown by the dashboard. From the billed tokens only:
 *
 *     read > 0, write == 0   hit      the cached prefix was read; whatever follows it (a new
 *                                     turn) is uncached input
 *     read > 0, write > 0    partial  a cached prefix was read and a longer one written (a
 *                                     conversation that extends its cache)
 *     read == 0, write > 0   write    nothing was read; the prompt's cacheable part was written
 *     read == 0, write == 0  miss     nothing was read or written
 *
 * read is the billed cache read (a prefix shorter than the model's min_cache_tokens is no
 * read); write is cache_write_5m + cache_write_1h.
 */
#ifndef GW_OUTCOME_H
#define GW_OUTCOME_H

#include <stdint.h>

typedef enum gw_outcome {
    GW_OUTCOME_HIT = 0,
    GW_OUTCOME_PARTIAL,
    GW_OUTCOME_WRITE,
    GW_OUTCOME_MISS,
} gw_outcome_t;
#define GW_OUTCOME_COUNT 4

/* The outcome of a request that read read_tokens and wrote write_tokens. */
gw_outcome_t gw_outcome_classify(uint32_t read_tokens, uint32_t write_tokens);

/* "hit", "partial", "write", "miss"; "?" for a value out of range. Static storage. */
const char *gw_outcome_name(gw_outcome_t o);

#endif
