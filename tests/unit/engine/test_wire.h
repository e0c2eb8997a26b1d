/*
 * test_wire.h — random valid frames and frame comparison for test_wire.c and the corpus seeds
 * (shared by the unit test and by nothing else; header-only).
 */
#ifndef KVGW_TEST_WIRE_H
#define KVGW_TEST_WIRE_H

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "sampling.h"
#include "stop.h"
#include "wire.h"

/* Backing storage for the strings and arrays of one generated frame. */
typedef struct wire_gen {
    uint32_t tokens[300];
    eng_wire_retain_t retain[8];
    pc_slice_t stops[5];
    char stop_text[5][24];
    uint32_t stop_ids[5];
    char s1[128], s2[128];
    eng_wire_snap_entry_t snap[4];
} wire_gen_t;

static inline uint64_t wg_u64(eng_rng_t *r)
{
    return eng_rng_next(r);
}
static inline uint32_t wg_below(eng_rng_t *r, uint32_t n)
{
    return (uint32_t)(eng_rng_next(r) % n);
}

/* Random valid UTF-8 of at most cap bytes (ASCII, 2-, 3- and 4-byte characters), at least one
 * character when nonempty is set. */
static inline size_t wg_utf8(eng_rng_t *r, char *buf, size_t cap, bool nonempty)
{
    static const char *const chars[] = {"a", "Z", " ", "\n", "é", "ß", "日", "本", "🛑", "\x7f"};
    size_t want = wg_below(r, (uint32_t)cap), len = 0;
    while (len < want || (nonempty && len == 0)) {
        const char *c = chars[wg_below(r, 10)];
        size_t n = strlen(c);
        if (len + n > cap)
            break;
        memcpy(buf + len, c, n);
        len += n;
    }
    return len;
}

static inline float wg_f32(eng_rng_t *r)
{
    float v;
    do {
        uint32_t u = (uint32_t)eng_rng_next(r);
        memcpy(&v, &u, sizeof v);
    } while (!isfinite(v));
    return v;
}

/* A random LOAD tier: off (all zero) a third of the time, else random figures that keep its
 * rules (bytes and blocks both zero or both not). */
static inline void wire_gen_tier_load(eng_rng_t *r, eng_wire_tier_load_t *t)
{
    memset(t, 0, sizeof *t);
    if (wg_below(r, 3) == 0)
        return;
    t->max_bytes = wg_u64(r) | 1;
    t->blocks = wg_below(r, 2) ? (uint32_t)wg_u64(r) | 1 : 0;
    t->bytes = t->blocks != 0 ? wg_u64(r) | 1 : 0;
    t->hits = wg_u64(r);
    t->loads = wg_u64(r);
    t->load_bytes = wg_u64(r);
    t->load_us = wg_u64(r);
    t->tokens_loaded = wg_u64(r);
    t->writes = wg_u64(r);
    t->writes_dropped = wg_u64(r);
    t->evictions = wg_u64(r);
    t->corrupt = wg_u64(r);
    t->load_bytes_per_s = wg_below(r, 3) ? fabsf(wg_f32(r)) : 0.0f;
}

/* A random frame of the given type that every rule of wire.h accepts. */
static inline void wire_gen_frame(eng_rng_t *r, int type, wire_gen_t *g, eng_wire_frame_t *f)
{
    memset(f, 0, sizeof *f);
    f->type = (uint8_t)type;
    switch (type) {
    case ENG_WIRE_HELLO:
    case ENG_WIRE_HELLO_ACK: {
        eng_wire_hello_t *h = &f->u.hello;
        h->version_min = (uint16_t)(1 + wg_below(r, 3));
        h->version_max = (uint16_t)(h->version_min + wg_below(r, 3));
        h->role = (uint8_t)(1 + wg_below(r, 2));
        h->heartbeat_ms = (uint32_t)wg_u64(r);
        h->max_frame = 1 + wg_below(r, 1u << 30);
        h->node = pc_slice(g->s1, wg_utf8(r, g->s1, sizeof g->s1, false));
        h->model_name = pc_slice(g->s2, wg_utf8(r, g->s2, sizeof g->s2, false));
        h->model_fp = wg_u64(r);
        h->n_vocab = (uint32_t)wg_u64(r);
        h->n_ctx = (uint32_t)wg_u64(r);
        h->block_tokens = (uint32_t)wg_u64(r);
        if (type == ENG_WIRE_HELLO_ACK) {
            h->total_blocks = (uint32_t)wg_u64(r);
            h->max_prompt_tokens = (uint32_t)wg_u64(r);
        }
        for (int i = 0; i < ENG_WIRE_AUTH_BYTES; i++)
            h->auth[i] = (uint8_t)wg_u64(r);
        break;
    }
    case ENG_WIRE_REJECT:
    case ENG_WIRE_ERROR:
        f->u.error.request_id = type == ENG_WIRE_ERROR && wg_below(r, 2) ? wg_u64(r) : 0;
        f->u.error.code = -1 - (int32_t)wg_below(r, 1000);
        f->u.error.message = pc_slice(g->s1, wg_utf8(r, g->s1, sizeof g->s1, false));
        break;
    case ENG_WIRE_HEARTBEAT:
        f->u.heartbeat_ms = wg_u64(r);
        break;
    case ENG_WIRE_SUBMIT: {
        eng_wire_submit_t *s = &f->u.submit;
        s->request_id = wg_u64(r) | 1;
        s->ns = wg_u64(r);
        s->priority = (int32_t)wg_u64(r);
        s->max_tokens = (uint32_t)wg_u64(r);
        s->flags = wg_below(r, 2) ? ENG_WIRE_SUBMIT_IGNORE_EOG : 0;
        s->sampling.temperature = wg_f32(r);
        s->sampling.top_k = (uint32_t)wg_u64(r);
        s->sampling.top_p = wg_f32(r);
        s->sampling.min_p = wg_f32(r);
        s->sampling.seed = wg_u64(r);
        s->n_tokens = 1 + wg_below(r, 300);
        for (uint32_t i = 0; i < s->n_tokens; i++)
            g->tokens[i] = (uint32_t)wg_u64(r);
        s->tokens = g->tokens;
        s->n_retain = wg_below(r, 9);
        for (uint32_t i = 0; i < s->n_retain; i++)
            g->retain[i] = (eng_wire_retain_t){1 + wg_below(r, s->n_tokens), wg_u64(r)};
        s->retain = g->retain;
        s->n_stops = wg_below(r, 6);
        for (uint32_t i = 0; i < s->n_stops; i++)
            g->stops[i] = pc_slice(g->stop_text[i],
                                   wg_utf8(r, g->stop_text[i], sizeof g->stop_text[i], true));
        s->stops = g->stops;
        s->n_stop_ids = wg_below(r, 6);
        for (uint32_t i = 0; i < s->n_stop_ids; i++)
            g->stop_ids[i] = (uint32_t)wg_u64(r);
        s->stop_ids = g->stop_ids;
        break;
    }
    case ENG_WIRE_CANCEL:
        f->u.cancel_id = wg_u64(r) | 2;
        break;
    case ENG_WIRE_TOKEN:
        f->u.token.request_id = wg_u64(r) | 1;
        f->u.token.token_id = (uint32_t)wg_u64(r);
        f->u.token.text = pc_slice(g->s1, wg_utf8(r, g->s1, sizeof g->s1, false));
        break;
    case ENG_WIRE_DONE: {
        eng_wire_done_t *d = &f->u.done;
        d->request_id = wg_u64(r) | 1;
        d->stop_reason = (uint8_t)(1 + wg_below(r, ENG_WIRE_STOP_MAX));
        d->stop_index =
            d->stop_reason == ENG_WIRE_STOP_SEQUENCE ? (int32_t)wg_below(r, ENG_STOP_MAX_SEQS) : -1;
        d->text = pc_slice(g->s1, wg_utf8(r, g->s1, sizeof g->s1, false));
        d->usage.prompt_tokens = (uint32_t)wg_u64(r);
        d->usage.tokens_reused = (uint32_t)(wg_u64(r) % ((uint64_t)d->usage.prompt_tokens + 1));
        d->usage.tokens_computed = (uint32_t)wg_u64(r);
        d->usage.output_tokens = (uint32_t)wg_u64(r);
        d->timing.queue_us = wg_u64(r);
        d->timing.prefill_us = wg_u64(r);
        d->timing.decode_us = wg_u64(r);
        break;
    }
    case ENG_WIRE_KV_EVENT: {
        eng_wire_kv_event_t *k = &f->u.kv;
        k->kind = (uint8_t)(1 + wg_below(r, ENG_WIRE_KV_MAX));
        k->ns = wg_u64(r);
        k->n_tokens = 1 + wg_below(r, 1u << 20);
        k->prefix_fp = wg_u64(r);
        switch (k->kind) {
        case ENG_WIRE_KV_EVICTED:
            k->reason = (uint8_t)(1 + wg_below(r, 3));
            k->tier = (uint8_t)(wg_below(r, 3) == 0 ? 0 : 2 + wg_below(r, 2));
            if (wg_below(r, 3) != 0) { /* with its path */
                k->n_tokens = 1 + wg_below(r, 300);
                for (uint32_t i = 0; i < k->n_tokens; i++)
                    g->tokens[i] = (uint32_t)wg_u64(r);
                k->tokens = g->tokens;
                k->n_path = k->n_tokens;
                k->prefix_fp = eng_wire_prefix_fp(g->tokens, k->n_tokens);
            }
            k->n_kept = wg_below(r, k->n_tokens);
            break;
        case ENG_WIRE_KV_RETAINED:
            k->n_kept = k->n_tokens;
            k->request_id = wg_below(r, 4) ? wg_u64(r) : 0;
            k->ttl_ms = wg_u64(r);
            break;
        case ENG_WIRE_KV_RELEASED:
            k->n_kept = k->n_tokens;
            break;
        default: /* RETAIN_FAILED */
            k->request_id = wg_u64(r) | 1;
            k->ttl_ms = wg_u64(r);
            break;
        }
        break;
    }
    case ENG_WIRE_LOAD: {
        eng_wire_load_t *l = &f->u.load;
        l->queued_requests = (uint32_t)wg_u64(r);
        l->queued_prefill_tokens = wg_u64(r);
        l->running_seqs = (uint32_t)wg_u64(r);
        l->total_blocks = (uint32_t)wg_u64(r);
        l->free_blocks = wg_below(r, l->total_blocks / 2 + 1);
        l->cached_blocks = wg_below(r, l->total_blocks - l->free_blocks + 1);
        l->prefill_tokens_per_s = fabsf(wg_f32(r));
        l->decode_ms_per_token = wg_below(r, 3) ? fabsf(wg_f32(r)) : 0.0f;
        wire_gen_tier_load(r, &l->g2);
        wire_gen_tier_load(r, &l->g3);
        l->tokens_recomputed = wg_u64(r);
        break;
    }
    case ENG_WIRE_CHALLENGE:
    case ENG_WIRE_AUTH:
        for (int i = 0; i < ENG_WIRE_AUTH_BYTES; i++)
            f->u.auth.bytes[i] = (uint8_t)wg_u64(r);
        break;
    case ENG_WIRE_RELEASE:
    case ENG_WIRE_DROP:
        f->u.release.ns = wg_u64(r);
        if (type == ENG_WIRE_RELEASE) {
            f->u.release.n_tokens = 1 + wg_below(r, 300);
            for (uint32_t i = 0; i < f->u.release.n_tokens; i++)
                g->tokens[i] = (uint32_t)wg_u64(r);
            f->u.release.tokens = g->tokens;
        }
        break;
    case ENG_WIRE_SNAPSHOT: {
        eng_wire_snapshot_t *x = &f->u.snapshot;
        x->snapshot_id = wg_u64(r);
        x->last = (uint8_t)wg_below(r, 2);
        x->n_entries = wg_below(r, 5);
        uint32_t used = 0;
        for (uint32_t i = 0; i < x->n_entries; i++) {
            uint32_t n = 1 + wg_below(r, 75);
            for (uint32_t k = 0; k < n; k++)
                g->tokens[used + k] = (uint32_t)wg_u64(r);
            g->snap[i] =
                (eng_wire_snap_entry_t){.ns = wg_u64(r),
                                        .prefix_fp = eng_wire_prefix_fp(g->tokens + used, n),
                                        .ttl_ms = wg_u64(r),
                                        .tier = (uint8_t)(1 + wg_below(r, 3)),
                                        .tokens = g->tokens + used,
                                        .n_tokens = n};
            if (g->snap[i].tier != ENG_WIRE_TIER_G1) /* only pins have a TTL */
                g->snap[i].ttl_ms = 0;
            used += n;
        }
        x->entries = g->snap;
        break;
    }
    case ENG_WIRE_PREFILL: {
        eng_wire_prefill_t *p = &f->u.prefill;
        p->request_id = wg_u64(r) | 1;
        p->prompt_tokens = (uint32_t)wg_u64(r);
        uint32_t left = p->prompt_tokens;
        p->tokens_g1 = wg_below(r, 4) ? (uint32_t)(wg_u64(r) % ((uint64_t)left + 1)) : 0;
        left -= p->tokens_g1;
        p->tokens_g2 = wg_below(r, 4) ? (uint32_t)(wg_u64(r) % ((uint64_t)left + 1)) : 0;
        left -= p->tokens_g2;
        p->tokens_g3 = (uint32_t)(wg_u64(r) % ((uint64_t)left + 1));
        left -= p->tokens_g3;
        p->tokens_recomputed = (uint32_t)(wg_u64(r) % ((uint64_t)left + 1));
        break;
    }
    }
}

static inline bool wg_u32s_eq(const uint32_t *a, const uint32_t *b, uint32_t n)
{
    return n == 0 || memcmp(a, b, (size_t)n * sizeof *a) == 0;
}

static inline bool wg_slice_eq(pc_slice_t a, pc_slice_t b)
{
    return pc_slice_eq(a, b);
}

static inline bool wg_f32_same(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

static inline bool wg_tier_load_eq(const eng_wire_tier_load_t *x, const eng_wire_tier_load_t *y)
{
    return x->max_bytes == y->max_bytes && x->bytes == y->bytes && x->blocks == y->blocks &&
           x->hits == y->hits && x->loads == y->loads && x->load_bytes == y->load_bytes &&
           x->load_us == y->load_us && x->tokens_loaded == y->tokens_loaded &&
           x->writes == y->writes && x->writes_dropped == y->writes_dropped &&
           x->evictions == y->evictions && x->corrupt == y->corrupt &&
           wg_f32_same(x->load_bytes_per_s, y->load_bytes_per_s);
}

/* Field-by-field equality (strings and arrays by content, floats by bits). */
static inline bool wire_frame_eq(const eng_wire_frame_t *a, const eng_wire_frame_t *b)
{
    if (a->type != b->type)
        return false;
    switch (a->type) {
    case ENG_WIRE_HELLO:
    case ENG_WIRE_HELLO_ACK: {
        const eng_wire_hello_t *x = &a->u.hello, *y = &b->u.hello;
        return x->version_min == y->version_min && x->version_max == y->version_max &&
               x->role == y->role && x->heartbeat_ms == y->heartbeat_ms &&
               x->max_frame == y->max_frame && wg_slice_eq(x->node, y->node) &&
               wg_slice_eq(x->model_name, y->model_name) && x->model_fp == y->model_fp &&
               x->n_vocab == y->n_vocab && x->n_ctx == y->n_ctx &&
               x->block_tokens == y->block_tokens && x->total_blocks == y->total_blocks &&
               x->max_prompt_tokens == y->max_prompt_tokens &&
               memcmp(x->auth, y->auth, sizeof x->auth) == 0;
    }
    case ENG_WIRE_REJECT:
    case ENG_WIRE_ERROR:
        return a->u.error.request_id == b->u.error.request_id &&
               a->u.error.code == b->u.error.code &&
               wg_slice_eq(a->u.error.message, b->u.error.message);
    case ENG_WIRE_HEARTBEAT:
        return a->u.heartbeat_ms == b->u.heartbeat_ms;
    case ENG_WIRE_SUBMIT: {
        const eng_wire_submit_t *x = &a->u.submit, *y = &b->u.submit;
        if (x->request_id != y->request_id || x->ns != y->ns || x->priority != y->priority ||
            x->max_tokens != y->max_tokens || x->flags != y->flags ||
            !wg_f32_same(x->sampling.temperature, y->sampling.temperature) ||
            x->sampling.top_k != y->sampling.top_k ||
            !wg_f32_same(x->sampling.top_p, y->sampling.top_p) ||
            !wg_f32_same(x->sampling.min_p, y->sampling.min_p) ||
            x->sampling.seed != y->sampling.seed || x->n_tokens != y->n_tokens ||
            x->n_retain != y->n_retain || x->n_stops != y->n_stops ||
            x->n_stop_ids != y->n_stop_ids)
            return false;
        for (uint32_t i = 0; i < x->n_tokens; i++)
            if (x->tokens[i] != y->tokens[i])
                return false;
        for (uint32_t i = 0; i < x->n_retain; i++)
            if (x->retain[i].n_tokens != y->retain[i].n_tokens ||
                x->retain[i].ttl_ms != y->retain[i].ttl_ms)
                return false;
        for (uint32_t i = 0; i < x->n_stops; i++)
            if (!wg_slice_eq(x->stops[i], y->stops[i]))
                return false;
        for (uint32_t i = 0; i < x->n_stop_ids; i++)
            if (x->stop_ids[i] != y->stop_ids[i])
                return false;
        return true;
    }
    case ENG_WIRE_CANCEL:
        return a->u.cancel_id == b->u.cancel_id;
    case ENG_WIRE_TOKEN:
        return a->u.token.request_id == b->u.token.request_id &&
               a->u.token.token_id == b->u.token.token_id &&
               wg_slice_eq(a->u.token.text, b->u.token.text);
    case ENG_WIRE_DONE: {
        const eng_wire_done_t *x = &a->u.done, *y = &b->u.done;
        return x->request_id == y->request_id && x->stop_reason == y->stop_reason &&
               x->stop_index == y->stop_index && wg_slice_eq(x->text, y->text) &&
               memcmp(&x->usage, &y->usage, sizeof x->usage) == 0 &&
               memcmp(&x->timing, &y->timing, sizeof x->timing) == 0;
    }
    case ENG_WIRE_KV_EVENT: {
        const eng_wire_kv_event_t *x = &a->u.kv, *y = &b->u.kv;
        return x->kind == y->kind && x->reason == y->reason && x->tier == y->tier &&
               x->ns == y->ns && x->n_tokens == y->n_tokens && x->prefix_fp == y->prefix_fp &&
               x->n_kept == y->n_kept && x->request_id == y->request_id && x->ttl_ms == y->ttl_ms &&
               x->n_path == y->n_path && wg_u32s_eq(x->tokens, y->tokens, x->n_path);
    }
    case ENG_WIRE_LOAD: {
        const eng_wire_load_t *x = &a->u.load, *y = &b->u.load;
        return x->queued_requests == y->queued_requests &&
               x->queued_prefill_tokens == y->queued_prefill_tokens &&
               x->running_seqs == y->running_seqs && x->free_blocks == y->free_blocks &&
               x->cached_blocks == y->cached_blocks && x->total_blocks == y->total_blocks &&
               wg_f32_same(x->prefill_tokens_per_s, y->prefill_tokens_per_s) &&
               wg_f32_same(x->decode_ms_per_token, y->decode_ms_per_token) &&
               wg_tier_load_eq(&x->g2, &y->g2) && wg_tier_load_eq(&x->g3, &y->g3) &&
               x->tokens_recomputed == y->tokens_recomputed;
    }
    case ENG_WIRE_CHALLENGE:
    case ENG_WIRE_AUTH:
        return memcmp(a->u.auth.bytes, b->u.auth.bytes, ENG_WIRE_AUTH_BYTES) == 0;
    case ENG_WIRE_RELEASE:
        return a->u.release.ns == b->u.release.ns &&
               a->u.release.n_tokens == b->u.release.n_tokens &&
               wg_u32s_eq(a->u.release.tokens, b->u.release.tokens, a->u.release.n_tokens);
    case ENG_WIRE_DROP:
        return a->u.release.ns == b->u.release.ns;
    case ENG_WIRE_SNAPSHOT: {
        const eng_wire_snapshot_t *x = &a->u.snapshot, *y = &b->u.snapshot;
        if (x->snapshot_id != y->snapshot_id || x->last != y->last || x->n_entries != y->n_entries)
            return false;
        for (uint32_t i = 0; i < x->n_entries; i++) {
            const eng_wire_snap_entry_t *p = &x->entries[i], *q = &y->entries[i];
            if (p->ns != q->ns || p->prefix_fp != q->prefix_fp || p->ttl_ms != q->ttl_ms ||
                p->tier != q->tier || p->n_tokens != q->n_tokens ||
                !wg_u32s_eq(p->tokens, q->tokens, p->n_tokens))
                return false;
        }
        return true;
    }
    case ENG_WIRE_PREFILL: {
        const eng_wire_prefill_t *x = &a->u.prefill, *y = &b->u.prefill;
        return x->request_id == y->request_id && x->prompt_tokens == y->prompt_tokens &&
               x->tokens_g1 == y->tokens_g1 && x->tokens_g2 == y->tokens_g2 &&
               x->tokens_g3 == y->tokens_g3 && x->tokens_recomputed == y->tokens_recomputed;
    }
    }
    return false;
}

#endif
