/*
 * router.c — cache-aware routing by estimated time to first token (see router.h).
 *
 * Estimates are integer microseconds, so ties are exact and the choice is deterministic for a
 * given input and cursor. Rates are doubles (they are measurements, not money).
 */
#include "router.h"

#include <math.h>
#include <string.h>

#include "common.h"

gw_router_params_t gw_router_params_default(void)
{
    gw_router_params_t p;
    memset(&p, 0, sizeof p);
    p.default_prefill_tok_s = 2000.0;
    p.default_decode_ms_per_token = 20.0;
    p.chunk_tokens = 512;
    p.default_load_bytes_per_s[0] = 10e9;
    p.default_load_bytes_per_s[1] = 1e9;
    return p;
}

int gw_router_init(gw_router_t *r, const gw_router_params_t *params)
{
    if (r == NULL)
        return PC_ERR_INVAL;
    gw_router_params_t p = params != NULL ? *params : gw_router_params_default();
    if (!(isfinite(p.default_prefill_tok_s) && p.default_prefill_tok_s > 0) ||
        !(isfinite(p.default_decode_ms_per_token) && p.default_decode_ms_per_token >= 0) ||
        !(isfinite(p.default_load_bytes_per_s[0]) && p.default_load_bytes_per_s[0] > 0) ||
        !(isfinite(p.default_load_bytes_per_s[1]) && p.default_load_bytes_per_s[1] > 0) ||
        p.chunk_tokens == 0)
        return PC_ERR_INVAL;
    memset(r, 0, sizeof *r);
    r->p = p;
    return 0;
}

/* A usable rate: the measurement when it is a positive finite number, else the default. */
static double rate_or(double v, double dflt)
{
    return isfinite(v) && v > 0 ? v : dflt;
}

/* held cut to the prompt: tokens <= n_prompt, g3 <= tokens, g2 <= tokens - g3. */
static gw_router_held_t held_clamp(const gw_router_held_t *h, uint32_t n_prompt)
{
    gw_router_held_t c;
    c.tokens = PC_MIN(h->tokens, n_prompt);
    c.g3 = PC_MIN(h->g3, c.tokens);
    c.g2 = PC_MIN(h->g2, c.tokens - c.g3);
    return c;
}

uint64_t gw_router_estimate_us(const gw_router_t *r, const gw_router_worker_t *w, uint32_t n_prompt,
                               uint32_t cached)
{
    gw_router_held_t h = {cached, 0, 0};
    return gw_router_estimate_held_us(r, w, n_prompt, &h);
}

uint64_t gw_router_estimate_held_us(const gw_router_t *r, const gw_router_worker_t *w,
                                    uint32_t n_prompt, const gw_router_held_t *held)
{
    double tok_s = rate_or(w->prefill_tok_s, r->p.default_prefill_tok_s);
    double step_ms = rate_or(w->decode_ms_per_token, r->p.default_decode_ms_per_token);
    gw_router_held_t h = held_clamp(held, n_prompt);
    uint64_t uncached = n_prompt - h.tokens;
    uint64_t work = w->queued_prefill_tokens + uncached;
    double us = (double)work * 1e6 / tok_s;
    /* A lower tier's token: its load, or its prefill when that is cheaper (or the size of a
     * token's KV is not known). */
    double prefill_us = 1e6 / tok_s;
    uint32_t low[2] = {h.g2, h.g3};
    for (int t = 0; t < 2; t++) {
        double per = prefill_us;
        if (isfinite(w->kv_bytes_per_token) && w->kv_bytes_per_token > 0)
            per =
                PC_MIN(per, w->kv_bytes_per_token * 1e6 /
                                rate_or(w->load_bytes_per_s[t], r->p.default_load_bytes_per_s[t]));
        us += (double)low[t] * per;
    }
    if (w->running_seqs > 0) {
        uint64_t steps = (work + r->p.chunk_tokens - 1) / r->p.chunk_tokens;
        us += (double)steps * step_ms * 1000.0;
    }
    if (!(us < 1.8e19))
        return UINT64_MAX - 1;
    return (uint64_t)llround(us);
}

/* -1 when a is less loaded than b, 1 when more, 0 when equal. */
static int load_cmp(const gw_router_worker_t *a, const gw_router_worker_t *b)
{
    if (a->queued_prefill_tokens != b->queued_prefill_tokens)
        return a->queued_prefill_tokens < b->queued_prefill_tokens ? -1 : 1;
    if (a->running_seqs != b->running_seqs)
        return a->running_seqs < b->running_seqs ? -1 : 1;
    if (a->free_blocks != b->free_blocks)
        return a->free_blocks > b->free_blocks ? -1 : 1;
    return 0;
}

int gw_router_pick(gw_router_t *r, const gw_router_worker_t *w, size_t n, uint32_t n_prompt,
                   const uint32_t *cached_tokens, gw_router_choice_t *out)
{
    gw_router_held_t held[GW_ROUTER_MAX_WORKERS];
    for (size_t i = 0; cached_tokens != NULL && i < n && i < GW_ROUTER_MAX_WORKERS; i++)
        held[i] = (gw_router_held_t){cached_tokens[i], 0, 0};
    return gw_router_pick_held(r, w, n, n_prompt, cached_tokens != NULL ? held : NULL, out);
}

int gw_router_pick_held(gw_router_t *r, const gw_router_worker_t *w, size_t n, uint32_t n_prompt,
                        const gw_router_held_t *held, gw_router_choice_t *out)
{
    if (out == NULL)
        return PC_ERR_INVAL;
    memset(out, 0, sizeof *out);
    out->worker = -1;
    if (r == NULL || (w == NULL && n > 0) || n > GW_ROUTER_MAX_WORKERS)
        return PC_ERR_INVAL;
    size_t n_up = 0;
    int cold = 1;
    for (size_t i = 0; i < n; i++) {
        out->est[i] = UINT64_MAX;
        if (!w[i].up) {
            out->status[i] = GW_ROUTER_SKIP_DOWN;
            continue;
        }
        n_up++;
        if (w[i].max_prompt_tokens != 0 && n_prompt > w[i].max_prompt_tokens) {
            out->status[i] = GW_ROUTER_SKIP_TOO_BIG;
            continue;
        }
        gw_router_held_t h = held != NULL ? held[i] : (gw_router_held_t){0, 0, 0};
        if (PC_MIN(h.tokens, n_prompt) > 0)
            cold = 0;
        out->status[i] = GW_ROUTER_CANDIDATE;
        out->est[i] = gw_router_estimate_held_us(r, &w[i], n_prompt, &h);
        out->n_candidates++;
    }
    if (n_up == 0)
        return PC_ERR_UPSTREAM;
    if (out->n_candidates == 0)
        return PC_ERR_RANGE;

    /* Visit candidates starting at the round-robin cursor, so that among equals the first one
     * at or after it wins. A cold prompt compares by load alone (its estimates differ only by
     * queued work and interference, which load orders the same way or breaks ties of). */
    int best = -1;
    for (size_t k = 0; k < n; k++) {
        size_t i = (r->rr + k) % n;
        if (out->status[i] != GW_ROUTER_CANDIDATE)
            continue;
        if (best < 0) {
            best = (int)i;
            continue;
        }
        int c;
        if (cold) {
            c = load_cmp(&w[i], &w[best]);
        } else {
            c = out->est[i] < out->est[best] ? -1 : out->est[i] > out->est[best] ? 1 : 0;
            if (c == 0)
                c = load_cmp(&w[i], &w[best]);
        }
        if (c < 0)
            best = (int)i;
    }
    out->worker = best;
    out->est_us = out->est[best];
    if (held != NULL) {
        gw_router_held_t h = held_clamp(&held[best], n_prompt);
        out->cached = h.tokens;
        out->cached_g2 = h.g2;
        out->cached_g3 = h.g3;
    }
    if (out->n_candidates == 1)
        out->reason = "only_up";
    else if (out->cached > 0)
        out->reason = "cache_hit";
    else
        out->reason = "load";
    r->rr = (uint32_t)((best + 1) % n);
    return 0;
}

uint32_t gw_router_max_prompt(const gw_router_worker_t *w, size_t n, uint32_t ctx_tokens)
{
    uint32_t max = 0;
    bool unlimited = false;
    for (size_t i = 0; w != NULL && i < n; i++) {
        uint32_t v = w[i].max_prompt_tokens != 0 ? w[i].max_prompt_tokens : ctx_tokens;
        unlimited = unlimited || v == 0;
        max = PC_MAX(max, v);
    }
    if (unlimited || n == 0)
        max = 0;
    if (ctx_tokens != 0 && (max == 0 || ctx_tokens < max))
        max = ctx_tokens;
    return max;
}
