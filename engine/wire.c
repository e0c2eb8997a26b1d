/*
 * wire.c — encoder and incremental decoder of the worker protocol (format in wire.h).
 *
 * The decoder never reads past what it was given: every field read goes through rd_need, and
 * every count is checked against the bytes left before anything is sized by it. The encoder
 * checks its own output with the decoder's rules (one decode pass over the new payload), so the
 * two sides can never disagree about what is a valid frame.
 */
#include "wire.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "pc_alloc.h"
#include "pc_err.h"
#include "pc_utf8.h"
#include "stop.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

static const char *const type_names[ENG_WIRE_TYPE_MAX + 1] = {
    [ENG_WIRE_HELLO] = "HELLO",     [ENG_WIRE_HELLO_ACK] = "HELLO_ACK",
    [ENG_WIRE_REJECT] = "REJECT",   [ENG_WIRE_HEARTBEAT] = "HEARTBEAT",
    [ENG_WIRE_SUBMIT] = "SUBMIT",   [ENG_WIRE_CANCEL] = "CANCEL",
    [ENG_WIRE_TOKEN] = "TOKEN",     [ENG_WIRE_DONE] = "DONE",
    [ENG_WIRE_ERROR] = "ERROR",     [ENG_WIRE_KV_EVENT] = "KV_EVENT",
    [ENG_WIRE_LOAD] = "LOAD",       [ENG_WIRE_CHALLENGE] = "CHALLENGE",
    [ENG_WIRE_AUTH] = "AUTH",       [ENG_WIRE_RELEASE] = "RELEASE",
    [ENG_WIRE_DROP] = "DROP",       [ENG_WIRE_SNAPSHOT] = "SNAPSHOT",
    [ENG_WIRE_PREFILL] = "PREFILL",
};

const char *eng_wire_type_name(int type)
{
    if (type < 1 || type > ENG_WIRE_TYPE_MAX)
        return "UNKNOWN";
    return type_names[type];
}

uint64_t eng_wire_prefix_fp(const uint32_t *tokens, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return XXH3_64bits(tokens, n * sizeof *tokens);
#else
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    for (size_t i = 0; i < n; i++) {
        uint8_t b[4] = {(uint8_t)tokens[i], (uint8_t)(tokens[i] >> 8), (uint8_t)(tokens[i] >> 16),
                        (uint8_t)(tokens[i] >> 24)};
        XXH3_64bits_update(&st, b, 4);
    }
    return XXH3_64bits_digest(&st);
#endif
}

/* ---- reading ------------------------------------------------------------------------------- */

typedef struct rd {
    const uint8_t *p;
    size_t len, off;
    const char *frame; /* type name for messages */
    char *err;
    size_t err_len;
} rd_t;

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != 0)                                                                              \
            return rc_;                                                                            \
    } while (0)

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int
rd_fail(rd_t *r, const char *fmt, ...)
{
    if (r->err != NULL && r->err_len > 0) {
        int n = snprintf(r->err, r->err_len, "%s: ", r->frame);
        if (n >= 0 && (size_t)n < r->err_len) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(r->err + n, r->err_len - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return PC_ERR_FORMAT;
}

static int rd_need(rd_t *r, size_t n, const char *field)
{
    if (r->len - r->off < n)
        return rd_fail(r, "truncated in %s (needs %zu bytes at payload offset %zu, %zu left)",
                       field, n, r->off, r->len - r->off);
    return 0;
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static int rd_u8(rd_t *r, const char *field, uint8_t *v)
{
    TRY(rd_need(r, 1, field));
    *v = r->p[r->off++];
    return 0;
}

static int rd_u16(rd_t *r, const char *field, uint16_t *v)
{
    TRY(rd_need(r, 2, field));
    *v = (uint16_t)(r->p[r->off] | r->p[r->off + 1] << 8);
    r->off += 2;
    return 0;
}

static int rd_u32(rd_t *r, const char *field, uint32_t *v)
{
    TRY(rd_need(r, 4, field));
    *v = le32(r->p + r->off);
    r->off += 4;
    return 0;
}

static int rd_i32(rd_t *r, const char *field, int32_t *v)
{
    uint32_t u;
    TRY(rd_u32(r, field, &u));
    memcpy(v, &u, sizeof u);
    return 0;
}

static int rd_u64(rd_t *r, const char *field, uint64_t *v)
{
    TRY(rd_need(r, 8, field));
    *v = le64(r->p + r->off);
    r->off += 8;
    return 0;
}

static int rd_f32(rd_t *r, const char *field, float *v)
{
    uint32_t u;
    TRY(rd_u32(r, field, &u));
    memcpy(v, &u, sizeof u);
    if (!isfinite(*v))
        return rd_fail(r, "%s is not a finite number", field);
    return 0;
}

static int rd_str(rd_t *r, const char *field, size_t max, pc_slice_t *s)
{
    uint32_t n;
    TRY(rd_u32(r, field, &n));
    if (n > max)
        return rd_fail(r, "%s is %u bytes, over the limit of %zu", field, n, max);
    TRY(rd_need(r, n, field));
    if (!pc_utf8_valid(r->p + r->off, n))
        return rd_fail(r, "%s is not valid UTF-8", field);
    *s = pc_slice((const char *)r->p + r->off, n);
    r->off += n;
    return 0;
}

static int rd_b32(rd_t *r, const char *field, uint8_t out[ENG_WIRE_AUTH_BYTES])
{
    TRY(rd_need(r, ENG_WIRE_AUTH_BYTES, field));
    memcpy(out, r->p + r->off, ENG_WIRE_AUTH_BYTES);
    r->off += ENG_WIRE_AUTH_BYTES;
    return 0;
}

/* An array count: at most max, and count * min_elem bytes must still be in the payload. */
static int rd_count(rd_t *r, const char *field, size_t min_elem, uint32_t max, uint32_t *n)
{
    TRY(rd_u32(r, field, n));
    if (*n > max)
        return rd_fail(r, "%s count %u over the limit of %u", field, *n, max);
    if ((uint64_t)*n * min_elem > r->len - r->off)
        return rd_fail(r, "%s count %u exceeds the payload (%zu bytes left)", field, *n,
                       r->len - r->off);
    return 0;
}

static int rd_nonzero_id(rd_t *r, uint64_t *id)
{
    TRY(rd_u64(r, "request_id", id));
    if (*id == 0)
        return rd_fail(r, "request_id 0");
    return 0;
}

static size_t scratch_take(pc_buf_t *s, size_t n);

/* arr<u32>: the ids are copied into scratch (aligned); *off gets their offset there (the caller
 * turns it into a pointer once scratch stopped growing). */
static int rd_tokens(rd_t *r, const char *field, pc_buf_t *scratch, uint32_t *n, size_t *off)
{
    TRY(rd_count(r, field, 4, UINT32_MAX, n));
    *off = scratch_take(scratch, (size_t)*n * sizeof(uint32_t));
    if (*off == SIZE_MAX)
        return PC_ERR_NOMEM;
    for (uint32_t i = 0; i < *n; i++) {
        uint32_t t = le32(r->p + r->off + 4 * (size_t)i);
        memcpy(scratch->base + *off + 4 * (size_t)i, &t, 4);
    }
    r->off += 4 * (size_t)*n;
    return 0;
}

/* Room for n bytes at an 8-aligned offset of scratch (the base is malloc-aligned). Returns the
 * offset, or SIZE_MAX on allocation failure. */
static size_t scratch_take(pc_buf_t *s, size_t n)
{
    size_t off = (s->len + 7) & ~(size_t)7;
    if (pc_buf_reserve(s, off - s->len + n + 1) == NULL) /* + 1: a base even when n is 0 */
        return SIZE_MAX;
    s->len = off + n;
    return off;
}

static int decode_hello(rd_t *r, bool is_hello, eng_wire_hello_t *h)
{
    TRY(rd_u16(r, "version_min", &h->version_min));
    TRY(rd_u16(r, "version_max", &h->version_max));
    if (h->version_min == 0 || h->version_min > h->version_max)
        return rd_fail(r, "bad version range %u..%u", h->version_min, h->version_max);
    TRY(rd_u8(r, "role", &h->role));
    if (h->role != ENG_WIRE_ROLE_GATEWAY && h->role != ENG_WIRE_ROLE_WORKER)
        return rd_fail(r, "unknown role %u", h->role);
    TRY(rd_u32(r, "heartbeat_ms", &h->heartbeat_ms));
    TRY(rd_u32(r, "max_frame", &h->max_frame));
    if (h->max_frame == 0)
        return rd_fail(r, "max_frame 0");
    TRY(rd_str(r, "node", ENG_WIRE_NAME_MAX, &h->node));
    TRY(rd_str(r, "model_name", ENG_WIRE_NAME_MAX, &h->model_name));
    TRY(rd_u64(r, "model_fp", &h->model_fp));
    TRY(rd_u32(r, "n_vocab", &h->n_vocab));
    TRY(rd_u32(r, "n_ctx", &h->n_ctx));
    TRY(rd_u32(r, "block_tokens", &h->block_tokens));
    TRY(rd_u32(r, "total_blocks", &h->total_blocks));
    TRY(rd_u32(r, "max_prompt_tokens", &h->max_prompt_tokens));
    if (is_hello && (h->total_blocks != 0 || h->max_prompt_tokens != 0))
        return rd_fail(r, "total_blocks and max_prompt_tokens must be 0 in HELLO");
    return rd_b32(r, "auth", h->auth);
}

static int decode_submit(rd_t *r, pc_buf_t *scratch, eng_wire_submit_t *s)
{
    TRY(rd_nonzero_id(r, &s->request_id));
    TRY(rd_u64(r, "ns", &s->ns));
    TRY(rd_i32(r, "priority", &s->priority));
    TRY(rd_u32(r, "max_tokens", &s->max_tokens));
    TRY(rd_u32(r, "flags", &s->flags));
    if ((s->flags & ~ENG_WIRE_SUBMIT_IGNORE_EOG) != 0)
        return rd_fail(r, "undefined flags 0x%x", s->flags & ~ENG_WIRE_SUBMIT_IGNORE_EOG);
    TRY(rd_f32(r, "temperature", &s->sampling.temperature));
    TRY(rd_u32(r, "top_k", &s->sampling.top_k));
    TRY(rd_f32(r, "top_p", &s->sampling.top_p));
    TRY(rd_f32(r, "min_p", &s->sampling.min_p));
    TRY(rd_u64(r, "seed", &s->sampling.seed));

    scratch->len = 0;
    size_t tok_off;
    TRY(rd_tokens(r, "tokens", scratch, &s->n_tokens, &tok_off));
    if (s->n_tokens == 0)
        return rd_fail(r, "no prompt tokens");

    TRY(rd_count(r, "retain", 12, ENG_WIRE_RETAIN_MAX, &s->n_retain));
    size_t ret_off = scratch_take(scratch, s->n_retain * sizeof(eng_wire_retain_t));
    if (ret_off == SIZE_MAX)
        return PC_ERR_NOMEM;
    for (uint32_t i = 0; i < s->n_retain; i++) {
        eng_wire_retain_t e;
        TRY(rd_u32(r, "retain n_tokens", &e.n_tokens));
        TRY(rd_u64(r, "retain ttl_ms", &e.ttl_ms));
        if (e.n_tokens == 0 || e.n_tokens > s->n_tokens)
            return rd_fail(r, "retain %u: prefix of %u tokens, the prompt has %u", i, e.n_tokens,
                           s->n_tokens);
        memcpy(scratch->base + ret_off + i * sizeof e, &e, sizeof e);
    }

    TRY(rd_count(r, "stops", 4, ENG_STOP_MAX_SEQS, &s->n_stops));
    size_t stop_off = scratch_take(scratch, s->n_stops * sizeof(pc_slice_t));
    if (stop_off == SIZE_MAX)
        return PC_ERR_NOMEM;
    for (uint32_t i = 0; i < s->n_stops; i++) {
        pc_slice_t st;
        TRY(rd_str(r, "stop sequence", ENG_STOP_MAX_BYTES, &st));
        if (st.len == 0)
            return rd_fail(r, "stop sequence %u is empty", i);
        memcpy(scratch->base + stop_off + i * sizeof st, &st, sizeof st);
    }

    TRY(rd_count(r, "stop_ids", 4, ENG_WIRE_STOP_IDS_MAX, &s->n_stop_ids));
    size_t ids_off = scratch_take(scratch, s->n_stop_ids * sizeof(uint32_t));
    if (ids_off == SIZE_MAX)
        return PC_ERR_NOMEM;
    for (uint32_t i = 0; i < s->n_stop_ids; i++) {
        uint32_t t;
        TRY(rd_u32(r, "stop_ids", &t));
        memcpy(scratch->base + ids_off + i * sizeof t, &t, sizeof t);
    }
    /* Pointers only now: scratch may have moved while it grew. */
    s->tokens = (const uint32_t *)(scratch->base + tok_off);
    s->retain = (const eng_wire_retain_t *)(scratch->base + ret_off);
    s->stops = (const pc_slice_t *)(scratch->base + stop_off);
    s->stop_ids = (const uint32_t *)(scratch->base + ids_off);
    return 0;
}

static int decode_done(rd_t *r, eng_wire_done_t *d)
{
    TRY(rd_nonzero_id(r, &d->request_id));
    TRY(rd_u8(r, "stop_reason", &d->stop_reason));
    if (d->stop_reason < 1 || d->stop_reason > ENG_WIRE_STOP_MAX)
        return rd_fail(r, "unknown stop_reason %u", d->stop_reason);
    TRY(rd_i32(r, "stop_index", &d->stop_index));
    bool is_seq = d->stop_reason == ENG_WIRE_STOP_SEQUENCE;
    if (is_seq ? (d->stop_index < 0 || d->stop_index >= ENG_STOP_MAX_SEQS) : d->stop_index != -1)
        return rd_fail(r, "stop_index %d with stop_reason %u", d->stop_index, d->stop_reason);
    TRY(rd_str(r, "text", UINT32_MAX, &d->text));
    TRY(rd_u32(r, "prompt_tokens", &d->usage.prompt_tokens));
    TRY(rd_u32(r, "tokens_reused", &d->usage.tokens_reused));
    TRY(rd_u32(r, "tokens_computed", &d->usage.tokens_computed));
    TRY(rd_u32(r, "output_tokens", &d->usage.output_tokens));
    if (d->usage.tokens_reused > d->usage.prompt_tokens)
        return rd_fail(r, "tokens_reused %u > prompt_tokens %u", d->usage.tokens_reused,
                       d->usage.prompt_tokens);
    TRY(rd_u64(r, "queue_us", &d->timing.queue_us));
    TRY(rd_u64(r, "prefill_us", &d->timing.prefill_us));
    return rd_u64(r, "decode_us", &d->timing.decode_us);
}

static int decode_kv(rd_t *r, pc_buf_t *scratch, eng_wire_kv_event_t *k)
{
    TRY(rd_u8(r, "kind", &k->kind));
    if (k->kind < 1 || k->kind > ENG_WIRE_KV_MAX)
        return rd_fail(r, "unknown kind %u", k->kind);
    TRY(rd_u8(r, "reason", &k->reason));
    bool evicted = k->kind == ENG_WIRE_KV_EVICTED;
    /* enum eng_evict_reason: 1..3 (engine.h). */
    if (evicted ? (k->reason < 1 || k->reason > 3) : k->reason != 0)
        return rd_fail(r, "reason %u with kind %u", k->reason, k->kind);
    TRY(rd_u8(r, "tier", &k->tier));
    if (evicted ? (k->tier == ENG_WIRE_TIER_G1 || k->tier > ENG_WIRE_TIER_MAX) : k->tier != 0)
        return rd_fail(r, "tier %u with kind %u", k->tier, k->kind);
    TRY(rd_u64(r, "ns", &k->ns));
    TRY(rd_u32(r, "n_tokens", &k->n_tokens));
    if (k->n_tokens == 0)
        return rd_fail(r, "n_tokens 0");
    TRY(rd_u64(r, "prefix_fp", &k->prefix_fp));
    TRY(rd_u32(r, "n_kept", &k->n_kept));
    TRY(rd_u64(r, "request_id", &k->request_id));
    TRY(rd_u64(r, "ttl_ms", &k->ttl_ms));
    switch (k->kind) {
    case ENG_WIRE_KV_RETAINED:
        if (k->n_kept != k->n_tokens)
            return rd_fail(r, "RETAINED needs n_kept == n_tokens");
        break;
    case ENG_WIRE_KV_RELEASED:
        if (k->n_kept != k->n_tokens || k->request_id != 0 || k->ttl_ms != 0)
            return rd_fail(r, "RELEASED needs n_kept == n_tokens, request_id 0 and ttl_ms 0");
        break;
    case ENG_WIRE_KV_EVICTED:
        if (k->n_kept >= k->n_tokens || k->request_id != 0 || k->ttl_ms != 0)
            return rd_fail(r, "EVICTED needs n_kept < n_tokens, request_id 0 and ttl_ms 0");
        break;
    default: /* RETAIN_FAILED */
        if (k->n_kept != 0)
            return rd_fail(r, "RETAIN_FAILED needs n_kept 0");
        break;
    }
    scratch->len = 0;
    size_t off;
    TRY(rd_tokens(r, "tokens", scratch, &k->n_path, &off));
    k->tokens = (const uint32_t *)(scratch->base + off);
    if (k->n_path != 0) {
        if (!evicted || k->n_path != k->n_tokens)
            return rd_fail(r, "%u path tokens with kind %u and n_tokens %u", k->n_path, k->kind,
                           k->n_tokens);
        if (eng_wire_prefix_fp(k->tokens, k->n_path) != k->prefix_fp)
            return rd_fail(r, "prefix_fp does not match the path's tokens");
    }
    return 0;
}

static int decode_release(rd_t *r, pc_buf_t *scratch, eng_wire_release_t *x)
{
    TRY(rd_u64(r, "ns", &x->ns));
    scratch->len = 0;
    size_t off;
    TRY(rd_tokens(r, "tokens", scratch, &x->n_tokens, &off));
    if (x->n_tokens == 0)
        return rd_fail(r, "no tokens");
    x->tokens = (const uint32_t *)(scratch->base + off);
    return 0;
}

static int decode_snapshot(rd_t *r, pc_buf_t *scratch, eng_wire_snapshot_t *x)
{
    TRY(rd_u64(r, "snapshot_id", &x->snapshot_id));
    TRY(rd_u8(r, "last", &x->last));
    if (x->last > 1)
        return rd_fail(r, "last %u is not 0 or 1", x->last);
    /* An entry is at least 8 + 8 + 8 + 1 + 4 + 4 bytes (one token). */
    TRY(rd_count(r, "entries", 33, UINT32_MAX, &x->n_entries));
    scratch->len = 0;
    size_t ent_off = scratch_take(scratch, (size_t)x->n_entries * sizeof(eng_wire_snap_entry_t));
    if (ent_off == SIZE_MAX)
        return PC_ERR_NOMEM;
    for (uint32_t i = 0; i < x->n_entries; i++) {
        eng_wire_snap_entry_t e = {0};
        TRY(rd_u64(r, "entry ns", &e.ns));
        TRY(rd_u64(r, "entry prefix_fp", &e.prefix_fp));
        TRY(rd_u64(r, "entry ttl_ms", &e.ttl_ms));
        TRY(rd_u8(r, "entry tier", &e.tier));
        if (e.tier < ENG_WIRE_TIER_G1 || e.tier > ENG_WIRE_TIER_MAX)
            return rd_fail(r, "entry %u: tier %u is not 1, 2 or 3", i, e.tier);
        if (e.tier != ENG_WIRE_TIER_G1 && e.ttl_ms != 0)
            return rd_fail(r, "entry %u: ttl_ms %llu in tier %u (only pins have one)", i,
                           (unsigned long long)e.ttl_ms, e.tier);
        size_t off;
        TRY(rd_tokens(r, "entry tokens", scratch, &e.n_tokens, &off));
        if (e.n_tokens == 0)
            return rd_fail(r, "entry %u has no tokens", i);
        /* The tokens' offset goes in the pointer field until scratch stops growing. */
        e.tokens = (const uint32_t *)(uintptr_t)off;
        if (eng_wire_prefix_fp((const uint32_t *)(scratch->base + off), e.n_tokens) != e.prefix_fp)
            return rd_fail(r, "entry %u: prefix_fp does not match its tokens", i);
        memcpy(scratch->base + ent_off + i * sizeof e, &e, sizeof e);
    }
    eng_wire_snap_entry_t *ents = (eng_wire_snap_entry_t *)(scratch->base + ent_off);
    for (uint32_t i = 0; i < x->n_entries; i++)
        ents[i].tokens = (const uint32_t *)(scratch->base + (uintptr_t)ents[i].tokens);
    x->entries = ents;
    return 0;
}

/* One tier of LOAD (wire.h): an off tier (max_bytes 0) is all zero; bytes and blocks are both
 * zero or both not. */
static int decode_tier_load(rd_t *r, const char *tier, eng_wire_tier_load_t *t)
{
    TRY(rd_u64(r, "tier max_bytes", &t->max_bytes));
    TRY(rd_u64(r, "tier bytes", &t->bytes));
    TRY(rd_u32(r, "tier blocks", &t->blocks));
    TRY(rd_u64(r, "tier hits", &t->hits));
    TRY(rd_u64(r, "tier loads", &t->loads));
    TRY(rd_u64(r, "tier load_bytes", &t->load_bytes));
    TRY(rd_u64(r, "tier load_us", &t->load_us));
    TRY(rd_u64(r, "tier tokens_loaded", &t->tokens_loaded));
    TRY(rd_u64(r, "tier writes", &t->writes));
    TRY(rd_u64(r, "tier writes_dropped", &t->writes_dropped));
    TRY(rd_u64(r, "tier evictions", &t->evictions));
    TRY(rd_u64(r, "tier corrupt", &t->corrupt));
    TRY(rd_f32(r, "tier load_bytes_per_s", &t->load_bytes_per_s));
    if (signbit(t->load_bytes_per_s))
        return rd_fail(r, "%s: negative load_bytes_per_s", tier);
    if ((t->bytes == 0) != (t->blocks == 0))
        return rd_fail(r, "%s: %llu bytes in %u blocks", tier, (unsigned long long)t->bytes,
                       t->blocks);
    bool any = (t->bytes | t->hits | t->loads | t->load_bytes | t->load_us | t->tokens_loaded |
                t->writes | t->writes_dropped | t->evictions | t->corrupt) != 0 ||
               t->load_bytes_per_s != 0.0f;
    if (t->max_bytes == 0 && any)
        return rd_fail(r, "%s: figures for a tier that is off (max_bytes 0)", tier);
    return 0;
}

static int decode_load(rd_t *r, eng_wire_load_t *l)
{
    TRY(rd_u32(r, "queued_requests", &l->queued_requests));
    TRY(rd_u64(r, "queued_prefill_tokens", &l->queued_prefill_tokens));
    TRY(rd_u32(r, "running_seqs", &l->running_seqs));
    TRY(rd_u32(r, "free_blocks", &l->free_blocks));
    TRY(rd_u32(r, "cached_blocks", &l->cached_blocks));
    TRY(rd_u32(r, "total_blocks", &l->total_blocks));
    if ((uint64_t)l->free_blocks + l->cached_blocks > l->total_blocks)
        return rd_fail(r, "free %u + cached %u blocks > total %u", l->free_blocks, l->cached_blocks,
                       l->total_blocks);
    TRY(rd_f32(r, "prefill_tokens_per_s", &l->prefill_tokens_per_s));
    TRY(rd_f32(r, "decode_ms_per_token", &l->decode_ms_per_token));
    /* signbit: -0.0 would break the canonical bytes of a "zero" too. */
    if (signbit(l->prefill_tokens_per_s) || signbit(l->decode_ms_per_token))
        return rd_fail(r, "negative rate");
    TRY(decode_tier_load(r, "g2", &l->g2));
    TRY(decode_tier_load(r, "g3", &l->g3));
    return rd_u64(r, "tokens_recomputed", &l->tokens_recomputed);
}

static int decode_prefill(rd_t *r, eng_wire_prefill_t *p)
{
    TRY(rd_nonzero_id(r, &p->request_id));
    TRY(rd_u32(r, "prompt_tokens", &p->prompt_tokens));
    TRY(rd_u32(r, "tokens_g1", &p->tokens_g1));
    TRY(rd_u32(r, "tokens_g2", &p->tokens_g2));
    TRY(rd_u32(r, "tokens_g3", &p->tokens_g3));
    TRY(rd_u32(r, "tokens_recomputed", &p->tokens_recomputed));
    uint64_t sum = (uint64_t)p->tokens_g1 + p->tokens_g2 + p->tokens_g3 + p->tokens_recomputed;
    if (sum > p->prompt_tokens)
        return rd_fail(r, "g1 %u + g2 %u + g3 %u + recomputed %u tokens > prompt_tokens %u",
                       p->tokens_g1, p->tokens_g2, p->tokens_g3, p->tokens_recomputed,
                       p->prompt_tokens);
    return 0;
}

static int decode_body(rd_t *r, uint8_t type, pc_buf_t *scratch, eng_wire_frame_t *f)
{
    switch (type) {
    case ENG_WIRE_HELLO:
    case ENG_WIRE_HELLO_ACK:
        return decode_hello(r, type == ENG_WIRE_HELLO, &f->u.hello);
    case ENG_WIRE_REJECT:
    case ENG_WIRE_ERROR:
        f->u.error.request_id = 0;
        if (type == ENG_WIRE_ERROR)
            TRY(rd_u64(r, "request_id", &f->u.error.request_id));
        TRY(rd_i32(r, "code", &f->u.error.code));
        if (f->u.error.code >= 0)
            return rd_fail(r, "error code %d is not negative", f->u.error.code);
        return rd_str(r, "message", ENG_WIRE_MESSAGE_MAX, &f->u.error.message);
    case ENG_WIRE_HEARTBEAT:
        return rd_u64(r, "time_ms", &f->u.heartbeat_ms);
    case ENG_WIRE_SUBMIT:
        return decode_submit(r, scratch, &f->u.submit);
    case ENG_WIRE_CANCEL:
        return rd_nonzero_id(r, &f->u.cancel_id);
    case ENG_WIRE_TOKEN:
        TRY(rd_nonzero_id(r, &f->u.token.request_id));
        TRY(rd_u32(r, "token_id", &f->u.token.token_id));
        return rd_str(r, "text", UINT32_MAX, &f->u.token.text);
    case ENG_WIRE_DONE:
        return decode_done(r, &f->u.done);
    case ENG_WIRE_KV_EVENT:
        return decode_kv(r, scratch, &f->u.kv);
    case ENG_WIRE_LOAD:
        return decode_load(r, &f->u.load);
    case ENG_WIRE_CHALLENGE:
        return rd_b32(r, "nonce", f->u.auth.bytes);
    case ENG_WIRE_AUTH:
        return rd_b32(r, "mac", f->u.auth.bytes);
    case ENG_WIRE_RELEASE:
        return decode_release(r, scratch, &f->u.release);
    case ENG_WIRE_DROP:
        return rd_u64(r, "ns", &f->u.release.ns);
    case ENG_WIRE_SNAPSHOT:
        return decode_snapshot(r, scratch, &f->u.snapshot);
    case ENG_WIRE_PREFILL:
        return decode_prefill(r, &f->u.prefill);
    default:
        return rd_fail(r, "unknown frame type");
    }
}

int eng_wire_decode_payload(uint8_t type, const uint8_t *payload, size_t len, pc_buf_t *scratch,
                            eng_wire_frame_t *f, char *err, size_t err_len)
{
    rd_t r = {payload, len, 0, eng_wire_type_name(type), err, err_len};
    memset(f, 0, sizeof *f);
    f->type = type;
    int rc = decode_body(&r, type, scratch, f);
    if (rc == 0 && r.off != len)
        rc = rd_fail(&r, "%zu trailing bytes after the last field", len - r.off);
    if (rc == PC_ERR_NOMEM && err != NULL && err_len > 0)
        snprintf(err, err_len, "%s: out of memory", r.frame);
    return rc;
}

/* ---- writing ------------------------------------------------------------------------------- */

typedef struct wr {
    pc_buf_t *b;
    bool oom;
    bool too_long; /* a string over 4 GiB */
} wr_t;

static void w_bytes(wr_t *w, const void *p, size_t n)
{
    if (!w->oom && pc_buf_append(w->b, p, n) != 0)
        w->oom = true;
}

static void w_u8(wr_t *w, uint8_t v)
{
    w_bytes(w, &v, 1);
}

static void w_u16(wr_t *w, uint16_t v)
{
    uint8_t b[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    w_bytes(w, b, 2);
}

static void w_u32(wr_t *w, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    w_bytes(w, b, 4);
}

static void w_u64(wr_t *w, uint64_t v)
{
    w_u32(w, (uint32_t)v);
    w_u32(w, (uint32_t)(v >> 32));
}

static void w_i32(wr_t *w, int32_t v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    w_u32(w, u);
}

static void w_f32(wr_t *w, float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    w_u32(w, u);
}

static void w_str(wr_t *w, pc_slice_t s)
{
    if (s.len > UINT32_MAX) {
        w->too_long = true;
        return;
    }
    w_u32(w, (uint32_t)s.len);
    w_bytes(w, s.base, s.len);
}

/* arr<u32>: count, then the ids. */
static void w_tokens(wr_t *w, const uint32_t *t, uint32_t n)
{
    w_u32(w, n);
    if (!w->oom && pc_buf_reserve(w->b, (size_t)n * 4) == NULL)
        w->oom = true;
    for (uint32_t i = 0; i < n && !w->oom; i++)
        w_u32(w, t[i]);
}

static void w_tier_load(wr_t *w, const eng_wire_tier_load_t *t)
{
    w_u64(w, t->max_bytes);
    w_u64(w, t->bytes);
    w_u32(w, t->blocks);
    w_u64(w, t->hits);
    w_u64(w, t->loads);
    w_u64(w, t->load_bytes);
    w_u64(w, t->load_us);
    w_u64(w, t->tokens_loaded);
    w_u64(w, t->writes);
    w_u64(w, t->writes_dropped);
    w_u64(w, t->evictions);
    w_u64(w, t->corrupt);
    w_f32(w, t->load_bytes_per_s);
}

static void encode_body(wr_t *w, const eng_wire_frame_t *f)
{
    switch (f->type) {
    case ENG_WIRE_HELLO:
    case ENG_WIRE_HELLO_ACK: {
        const eng_wire_hello_t *h = &f->u.hello;
        w_u16(w, h->version_min);
        w_u16(w, h->version_max);
        w_u8(w, h->role);
        w_u32(w, h->heartbeat_ms);
        w_u32(w, h->max_frame);
        w_str(w, h->node);
        w_str(w, h->model_name);
        w_u64(w, h->model_fp);
        w_u32(w, h->n_vocab);
        w_u32(w, h->n_ctx);
        w_u32(w, h->block_tokens);
        w_u32(w, h->total_blocks);
        w_u32(w, h->max_prompt_tokens);
        w_bytes(w, h->auth, ENG_WIRE_AUTH_BYTES);
        break;
    }
    case ENG_WIRE_REJECT:
    case ENG_WIRE_ERROR:
        if (f->type == ENG_WIRE_ERROR)
            w_u64(w, f->u.error.request_id);
        w_i32(w, f->u.error.code);
        w_str(w, f->u.error.message);
        break;
    case ENG_WIRE_HEARTBEAT:
        w_u64(w, f->u.heartbeat_ms);
        break;
    case ENG_WIRE_SUBMIT: {
        const eng_wire_submit_t *s = &f->u.submit;
        w_u64(w, s->request_id);
        w_u64(w, s->ns);
        w_i32(w, s->priority);
        w_u32(w, s->max_tokens);
        w_u32(w, s->flags);
        w_f32(w, s->sampling.temperature);
        w_u32(w, s->sampling.top_k);
        w_f32(w, s->sampling.top_p);
        w_f32(w, s->sampling.min_p);
        w_u64(w, s->sampling.seed);
        w_tokens(w, s->tokens, s->n_tokens);
        w_u32(w, s->n_retain);
        for (uint32_t i = 0; i < s->n_retain; i++) {
            w_u32(w, s->retain[i].n_tokens);
            w_u64(w, s->retain[i].ttl_ms);
        }
        w_u32(w, s->n_stops);
        for (uint32_t i = 0; i < s->n_stops; i++)
            w_str(w, s->stops[i]);
        w_u32(w, s->n_stop_ids);
        for (uint32_t i = 0; i < s->n_stop_ids; i++)
            w_u32(w, s->stop_ids[i]);
        break;
    }
    case ENG_WIRE_CANCEL:
        w_u64(w, f->u.cancel_id);
        break;
    case ENG_WIRE_TOKEN:
        w_u64(w, f->u.token.request_id);
        w_u32(w, f->u.token.token_id);
        w_str(w, f->u.token.text);
        break;
    case ENG_WIRE_DONE: {
        const eng_wire_done_t *d = &f->u.done;
        w_u64(w, d->request_id);
        w_u8(w, d->stop_reason);
        w_i32(w, d->stop_index);
        w_str(w, d->text);
        w_u32(w, d->usage.prompt_tokens);
        w_u32(w, d->usage.tokens_reused);
        w_u32(w, d->usage.tokens_computed);
        w_u32(w, d->usage.output_tokens);
        w_u64(w, d->timing.queue_us);
        w_u64(w, d->timing.prefill_us);
        w_u64(w, d->timing.decode_us);
        break;
    }
    case ENG_WIRE_KV_EVENT: {
        const eng_wire_kv_event_t *k = &f->u.kv;
        w_u8(w, k->kind);
        w_u8(w, k->reason);
        w_u8(w, k->tier);
        w_u64(w, k->ns);
        w_u32(w, k->n_tokens);
        w_u64(w, k->prefix_fp);
        w_u32(w, k->n_kept);
        w_u64(w, k->request_id);
        w_u64(w, k->ttl_ms);
        w_tokens(w, k->tokens, k->n_path);
        break;
    }
    case ENG_WIRE_LOAD: {
        const eng_wire_load_t *l = &f->u.load;
        w_u32(w, l->queued_requests);
        w_u64(w, l->queued_prefill_tokens);
        w_u32(w, l->running_seqs);
        w_u32(w, l->free_blocks);
        w_u32(w, l->cached_blocks);
        w_u32(w, l->total_blocks);
        w_f32(w, l->prefill_tokens_per_s);
        w_f32(w, l->decode_ms_per_token);
        w_tier_load(w, &l->g2);
        w_tier_load(w, &l->g3);
        w_u64(w, l->tokens_recomputed);
        break;
    }
    case ENG_WIRE_CHALLENGE:
    case ENG_WIRE_AUTH:
        w_bytes(w, f->u.auth.bytes, ENG_WIRE_AUTH_BYTES);
        break;
    case ENG_WIRE_RELEASE:
        w_u64(w, f->u.release.ns);
        w_tokens(w, f->u.release.tokens, f->u.release.n_tokens);
        break;
    case ENG_WIRE_DROP:
        w_u64(w, f->u.release.ns);
        break;
    case ENG_WIRE_SNAPSHOT: {
        const eng_wire_snapshot_t *x = &f->u.snapshot;
        w_u64(w, x->snapshot_id);
        w_u8(w, x->last);
        w_u32(w, x->n_entries);
        for (uint32_t i = 0; i < x->n_entries && !w->oom; i++) {
            const eng_wire_snap_entry_t *e = &x->entries[i];
            w_u64(w, e->ns);
            w_u64(w, e->prefix_fp);
            w_u64(w, e->ttl_ms);
            w_u8(w, e->tier);
            w_tokens(w, e->tokens, e->n_tokens);
        }
        break;
    }
    case ENG_WIRE_PREFILL: {
        const eng_wire_prefill_t *p = &f->u.prefill;
        w_u64(w, p->request_id);
        w_u32(w, p->prompt_tokens);
        w_u32(w, p->tokens_g1);
        w_u32(w, p->tokens_g2);
        w_u32(w, p->tokens_g3);
        w_u32(w, p->tokens_recomputed);
        break;
    }
    default:
        break;
    }
}

int eng_wire_encode(const eng_wire_frame_t *f, uint32_t max_frame, pc_buf_t *out, char *err,
                    size_t err_len)
{
    if (max_frame == 0)
        max_frame = ENG_WIRE_MAX_FRAME_DEFAULT;
    if (f->type < 1 || f->type > ENG_WIRE_TYPE_MAX) {
        if (err != NULL && err_len > 0)
            snprintf(err, err_len, "unknown frame type %u", f->type);
        return PC_ERR_INVAL;
    }
    size_t start = out->len;
    wr_t w = {out, false, false};
    const uint8_t hdr[8] = {'K', 'W', ENG_WIRE_VERSION, f->type, 0, 0, 0, 0};
    w_bytes(&w, hdr, sizeof hdr);
    w_u32(&w, 0); /* the payload length, patched below */
    encode_body(&w, f);
    int rc = 0;
    pc_buf_t scratch = PC_BUF_INIT;
    size_t plen = out->len - start - ENG_WIRE_HEADER_BYTES;
    if (w.oom) {
        rc = PC_ERR_NOMEM;
        if (err != NULL && err_len > 0)
            snprintf(err, err_len, "%s: out of memory", eng_wire_type_name(f->type));
        goto fail;
    }
    if (w.too_long || plen > max_frame) {
        rc = PC_ERR_INVAL;
        if (err != NULL && err_len > 0)
            snprintf(err, err_len, "%s: payload over max_frame (%u bytes)",
                     eng_wire_type_name(f->type), max_frame);
        goto fail;
    }
    uint8_t *len_at = (uint8_t *)out->base + start + 8;
    len_at[0] = (uint8_t)plen;
    len_at[1] = (uint8_t)(plen >> 8);
    len_at[2] = (uint8_t)(plen >> 16);
    len_at[3] = (uint8_t)(plen >> 24);
    eng_wire_frame_t check;
    rc =
        eng_wire_decode_payload(f->type, (const uint8_t *)out->base + start + ENG_WIRE_HEADER_BYTES,
                                plen, &scratch, &check, err, err_len);
    if (rc == PC_ERR_FORMAT)
        rc = PC_ERR_INVAL;
    if (rc != 0)
        goto fail;
    pc_buf_free(&scratch);
    return 0;
fail:
    pc_buf_free(&scratch);
    out->len = start;
    return rc;
}

/* ---- the incremental decoder --------------------------------------------------------------- */

struct eng_wire_decoder {
    uint32_t max_frame;
    int err;     /* sticky */
    pc_buf_t in; /* received bytes; in.base[off..len) not yet consumed */
    size_t off;
    uint64_t n_consumed; /* stream offset of in.base[off], for messages */
    pc_buf_t scratch;
    char reason[192];
};

void eng_wire_decoder_set_max_frame(eng_wire_decoder_t *d, uint32_t max_frame)
{
    /* Headers are checked when their frame is taken (eng_wire_decoder_next), so the new limit
     * applies to everything not yet returned. */
    d->max_frame = max_frame != 0 ? max_frame : ENG_WIRE_MAX_FRAME_DEFAULT;
}

int eng_wire_decoder_init(uint32_t max_frame, eng_wire_decoder_t **out)
{
    eng_wire_decoder_t *d = pc_calloc(1, sizeof *d);
    *out = d;
    if (d == NULL)
        return PC_ERR_NOMEM;
    d->max_frame = max_frame != 0 ? max_frame : ENG_WIRE_MAX_FRAME_DEFAULT;
    return 0;
}

void eng_wire_decoder_free(eng_wire_decoder_t *d)
{
    if (d == NULL)
        return;
    pc_buf_free(&d->in);
    pc_buf_free(&d->scratch);
    pc_free(d);
}

const char *eng_wire_decoder_error(const eng_wire_decoder_t *d)
{
    return d->reason;
}

size_t eng_wire_decoder_pending(const eng_wire_decoder_t *d)
{
    return d->in.len - d->off;
}

int eng_wire_decoder_take(eng_wire_decoder_t *d, pc_buf_t *out)
{
    if (d->err != 0)
        return d->err;
    size_t n = d->in.len - d->off;
    if (n > 0 && pc_buf_append(out, d->in.base + d->off, n) != 0)
        return PC_ERR_NOMEM;
    d->in.len = d->off; /* the frame returned last (before off) stays valid */
    return 0;
}

int eng_wire_decoder_feed(eng_wire_decoder_t *d, const void *data, size_t len)
{
    if (d->err != 0)
        return d->err;
    if (len == 0)
        return 0;
    /* Drop consumed bytes before growing; frames handed out earlier die here (documented). */
    if (d->off > 0) {
        memmove(d->in.base, d->in.base + d->off, d->in.len - d->off);
        d->in.len -= d->off;
        d->off = 0;
    }
    return pc_buf_append(&d->in, data, len);
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int
dec_fail(eng_wire_decoder_t *d, int err, const char *fmt, ...)
{
    int n = snprintf(d->reason, sizeof d->reason,
                     "frame at stream offset %llu: ", (unsigned long long)d->n_consumed);
    if (n >= 0 && (size_t)n < sizeof d->reason) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(d->reason + n, sizeof d->reason - (size_t)n, fmt, ap);
        va_end(ap);
    }
    d->err = err;
    return err;
}

int eng_wire_decoder_next(eng_wire_decoder_t *d, eng_wire_frame_t *f)
{
    if (d->err != 0)
        return d->err;
    size_t avail = d->in.len - d->off;
    if (avail == 0)
        return 0;
    const uint8_t *p = (const uint8_t *)d->in.base + d->off;
    /* Check each header field as soon as its bytes are in, so garbage (an HTTP client on the
     * worker port) is rejected at once. */
    if (p[0] != 'K' || (avail >= 2 && p[1] != 'W'))
        return dec_fail(d, PC_ERR_FORMAT, "bad magic 0x%02x%02x (not a kvgw worker stream)", p[0],
                        avail >= 2 ? p[1] : 0);
    if (avail >= 3 && p[2] != ENG_WIRE_VERSION)
        return dec_fail(d, PC_ERR_UNSUPPORTED, "protocol version %u, this side speaks %d", p[2],
                        ENG_WIRE_VERSION);
    if (avail >= 4 && (p[3] < 1 || p[3] > ENG_WIRE_TYPE_MAX))
        return dec_fail(d, PC_ERR_FORMAT, "unknown frame type %u", p[3]);
    if (avail < ENG_WIRE_HEADER_BYTES)
        return 0;
    uint32_t flags = le32(p + 4), plen = le32(p + 8);
    if (flags != 0)
        return dec_fail(d, PC_ERR_FORMAT, "%s: undefined flags 0x%x", eng_wire_type_name(p[3]),
                        flags);
    if (plen > d->max_frame)
        return dec_fail(d, PC_ERR_RANGE, "%s: payload of %u bytes over the limit of %u",
                        eng_wire_type_name(p[3]), plen, d->max_frame);
    if (avail - ENG_WIRE_HEADER_BYTES < plen)
        return 0;
    char why[160];
    int rc = eng_wire_decode_payload(p[3], p + ENG_WIRE_HEADER_BYTES, plen, &d->scratch, f, why,
                                     sizeof why);
    if (rc != 0)
        return dec_fail(d, rc, "%s", why);
    d->off += ENG_WIRE_HEADER_BYTES + (size_t)plen;
    d->n_consumed += ENG_WIRE_HEADER_BYTES + (uint64_t)plen;
    return 1;
}
