/*
 * router.h — cache-aware routing: which worker should run a prompt.
 *
 * For each candidate worker the router estimates the time to first token of the new prompt:
 *
 *     work_tokens = queued_prefill_tokens + (n_prompt - cached)
 *     load_us     = sum over t in {G2, G3} of cached_t
 *                     * min(kv_bytes_per_token * 1e6 / load_bytes_per_s[t], 1e6 / prefill_tok_s)
 *     ttft_us     = work_tokens * 1e6 / prefill_tok_s + load_us
 *                 + (running_seqs > 0 ? ceil(work_tokens / chunk_tokens) * decode_ms_per_token
 *                    * 1000 : 0)
 *
 * where cached is what the worker already holds of the prompt, in any of its KV tiers
 * (gw_cindex_match_t.held), and cached_t the part of it held only in the lower tier t
 * (held_g2, held_g3): the tokens of its pool (G1) cost nothing, a token in G2 or G3 costs its
 * load at the worker's measured bandwidth for that tier, or its prefill when that is cheaper
 * (the worker's own cost model recomputes such a run instead of loading it), and a token held
 * nowhere costs a prefill. The last term is decode interference: with chunked prefill every
 * prefill step also runs one decode step for the sequences already running. A rate the worker
 * has not measured yet (0) takes the default from the params; a worker whose KV size per token
 * is unknown (0) has its lower-tier tokens priced as prefills. It picks the smallest estimate
 * (integer microseconds); ties, and prompts no worker holds any of ("cold"), go to the least loaded
 * (fewest queued prefill tokens, then fewest running sequences, then most free KV blocks), and
 * remaining ties rotate round-robin. Down workers and workers that cannot fit the prompt
 * (max_prompt_tokens) are skipped.
 *
 * Pure computation apart from the round-robin cursor: no I/O, no clock, no allocation. One
 * router per gateway, used on the loop thread.
 */
#ifndef GW_ROUTER_H
#define GW_ROUTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GW_ROUTER_MAX_WORKERS 64

/* What the gateway knows of one worker (from HELLO_ACK and LOAD frames). */
typedef struct gw_router_worker {
    bool up;                        /* connected and answering heartbeats */
    uint64_t queued_prefill_tokens; /* prompt tokens admitted and not yet prefilled */
    uint32_t running_seqs;          /* sequences decoding */
    uint32_t free_blocks;           /* free KV blocks */
    uint32_t total_blocks;          /* KV blocks in all (0: unknown) */
    double prefill_tok_s;           /* moving average (0: not measured yet) */
    double decode_ms_per_token;     /* moving average per decode step (0: not measured yet) */
    uint32_t max_prompt_tokens;     /* the longest prompt it accepts (0: no limit) */
    double kv_bytes_per_token;      /* bytes of one token's KV in its tiers (0: unknown) */
    double load_bytes_per_s[2];     /* load bandwidth of G2, G3 (moving averages; 0: unknown) */
} gw_router_worker_t;

/* What one worker holds of the prompt (from gw_cindex_match_t): tokens in any tier, and of
 * those, the ones held only in G2 and only in G3. */
typedef struct gw_router_held {
    uint32_t tokens;
    uint32_t g2, g3;
} gw_router_held_t;

typedef struct gw_router_params {
    double default_prefill_tok_s;       /* for workers without a measurement (default 2000) */
    double default_decode_ms_per_token; /* likewise (default 20) */
    uint32_t chunk_tokens;              /* prefill chunk of the workers (default 512) */
    /* Load bandwidth of G2 and G3 for workers without a measurement (defaults 10 GB/s and
     * 1 GB/s: host memory over PCIe, a local SSD). */
    double default_load_bytes_per_s[2];
} gw_router_params_t;

/* Why a worker was or was not a candidate (gw_router_choice_t.status). */
enum gw_router_status {
    GW_ROUTER_CANDIDATE = 0,
    GW_ROUTER_SKIP_DOWN = 1,    /* not up */
    GW_ROUTER_SKIP_TOO_BIG = 2, /* the prompt exceeds its max_prompt_tokens */
};

typedef struct gw_router_choice {
    int worker;            /* the chosen index, or -1 */
    const char *reason;    /* "cache_hit", "load" or "only_up" (static), NULL if none */
    uint64_t est_us;       /* the chosen worker's estimate */
    uint32_t cached;       /* the chosen worker's cached tokens, in any tier */
    uint32_t cached_g2;    /* of those, held only in its G2 */
    uint32_t cached_g3;    /* and only in its G3 */
    uint32_t n_candidates; /* workers that were considered */
    /* Per worker (first n): its estimate (UINT64_MAX when not a candidate) and status. */
    uint64_t est[GW_ROUTER_MAX_WORKERS];
    uint8_t status[GW_ROUTER_MAX_WORKERS];
} gw_router_choice_t;

typedef struct gw_router {
    gw_router_params_t p;
    uint32_t rr; /* round-robin cursor: ties go to the first tied worker at or after it */
} gw_router_t;

/* Defaults as above. */
gw_router_params_t gw_router_params_default(void);

/* Sets up r (caller-allocated). Returns 0, or PC_ERR_INVAL for non-positive or non-finite
 * default rates or bandwidths, or chunk_tokens 0. */
int gw_router_init(gw_router_t *r, const gw_router_params_t *params);

/* Picks a worker for a prompt of n_prompt tokens among w[0..n) given cached_tokens[0..n) (what
 * each worker holds of the prompt, from the index; NULL: nothing) and fills *out. Reason:
 * "only_up" when there was a single candidate, "cache_hit" when the chosen worker holds part
 * of the prompt, else "load". Returns 0; PC_ERR_UPSTREAM when no worker is up; PC_ERR_RANGE
 * when some are up but none accepts a prompt that long; PC_ERR_INVAL (NULL r, w with n > 0,
 * out, or n > GW_ROUTER_MAX_WORKERS). Cached counts above n_prompt count as n_prompt. */
int gw_router_pick(gw_router_t *r, const gw_router_worker_t *w, size_t n, uint32_t n_prompt,
                   const uint32_t *cached_tokens, gw_router_choice_t *out);

/* gw_router_pick with what each worker holds by tier: held[0..n) (NULL: nothing). A held
 * count above n_prompt counts as n_prompt; tier counts above it are cut to it (G3 first). */
int gw_router_pick_held(gw_router_t *r, const gw_router_worker_t *w, size_t n, uint32_t n_prompt,
                        const gw_router_held_t *held, gw_router_choice_t *out);

/* The longest prompt the model of w[0..n) accepts: the largest max_prompt_tokens of its workers,
 * up or down (a worker that is down now takes the prompt when it is back, so a prompt within its
 * limit is not the client's fault), capped by ctx_tokens, the model's context (0: unknown). A
 * worker that has not reported its limit yet (0) counts as ctx_tokens. 0 means no limit is
 * known (no worker and no context, or a worker without a limit and no context). A prompt
 * longer than this can never run: the caller refuses it (400) before routing, instead of
 * letting gw_router_pick find no candidate (which reads as "overloaded", and clients retry). */
uint32_t gw_router_max_prompt(const gw_router_worker_t *w, size_t n, uint32_t ctx_tokens);

/* The estimate for one worker (same formula; the worker need not be up), with everything it
 * holds in its pool (estimate_us) or by tier (estimate_held_us). */
uint64_t gw_router_estimate_us(const gw_router_t *r, const gw_router_worker_t *w, uint32_t n_prompt,
                               uint32_t cached);
uint64_t gw_router_estimate_held_us(const gw_router_t *r, const gw_router_worker_t *w,
                                    uint32_t n_prompt, const gw_router_held_t *held);

#endif
