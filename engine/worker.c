/*
 * worker.c — the worker: request intake, the continuous-batching scheduler and the event
 * queue. worker.h states the contract; this file explains how it is kept.
 *
 * Threads. Two kinds of threads touch a worker: callers (submit, cancel, poll, load) and the
 * scheduler thread, which alone uses the engine, the requests it has taken in and the event
 * list of the step being built. They meet under one mutex, held only to move lists and copy
 * counters, never across a forward step:
 *   intake   requests accepted by eng_worker_submit, not yet seen by the scheduler;
 *   cancels  request ids eng_worker_cancel asked for; an id leaves it with its final event
 *            (a cancel that came too late never reaches a later request reusing the id);
 *   live     ids of accepted requests whose final event is not yet queued (duplicate check,
 *            cancel's NOTFOUND); an id leaves it in the same critical section that queues its
 *            final event, so a caller never sees an id that is neither live nor finished;
 *   events   the queue the consumer polls, with wake_pending (a wake-up was sent and the
 *            consumer has not emptied the queue since);
 *   load, stats  snapshots published after every step.
 *
 * Scheduler state (scheduler thread only). A request is in exactly one of:
 *   queue    waiting for admission, sorted by priority (higher first) then arrival; preempted
 *            requests come back here with their original arrival number, so they go first;
 *   waiting  admitted in order but parked until another request's prefill passes the prefix
 *            they share (wait_on, wait_len); they hold no sequence;
 *   run      holding a sequence: PREFILL (positions [0, target) being computed in chunks) or
 *            DECODE (the last sampled token is fed at the next step).
 * A request's tokens[] is its prompt followed by what it generated. Its prefill target is the
 * prompt's length, or, after a preemption with tokens generated, every token it has: the
 * prefill then ends with the logits of the next token, exactly where decoding stopped.
 *
 * Blocks. Admission stops (first come, first served: nothing overtakes the head) when the head's
 * prompt needs more blocks than are free or held only by the cache, less one block per running
 * request for its growth; with nothing running the head is always admitted (submit refused
 * prompts larger than the pool). A step that still finds the pool full (eng_forward returns 1)
 * preempts the youngest running request and is retried; a request alone that cannot grow fails
 * with PC_ERR_NOSPACE.
 *
 * Sampling. Where the engine samples on its device (eng_samples_on_device: the cuda backend), a
 * step hands each logits row's rules and next PRNG draw (eng_sampler_peek) to
 * eng_forward_sample and only token ids come back; the draws are consumed once the step
 * succeeded. Otherwise the logits come to the host and eng_sampler_sample picks. Both pick the
 * same token from the same logits under the same seed.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine.h"
#include "gguf.h"
#include "pc_alloc.h"
#include "pc_assert.h"
#include "pc_err.h"
#include "pc_log.h"
#include "pc_time.h"
#include "pc_vec.h"
#include "sampling.h"
#include "stop.h"
#include "worker.h"

enum wk_state {
    WK_QUEUED = 0,
    WK_WAITING = 1,
    WK_PREFILL = 2,
    WK_DECODE = 3,
    WK_LOADING = 4, /* out of the queue while its tier blocks are read (eng_tier_prefetch) */
};

typedef struct wk_retain {
    uint32_t n_tokens;
    uint64_t ttl_ms;
    bool done;
} wk_retain_t;

typedef struct wk_req {
    struct wk_req *next; /* intake list */
    uint64_t id, ns, seqno;
    int32_t priority;
    uint32_t max_tokens, flags;
    uint64_t t_submit_ms;
    uint64_t t_submit_ns, t_admit_ns, t_prefill_ns; /* DONE's timings; 0: not yet */
    eng_sampler_t sampler;
    eng_stop_t *stop;
    uint32_t *stop_ids; /* [n_stop_ids] */
    uint32_t n_stop_ids;
    int32_t *tokens; /* [n_prompt + max_tokens]: prompt, then generated */
    uint32_t n_prompt, n_tokens;
    wk_retain_t *retain; /* [n_retain] */
    uint32_t n_retain;
    eng_seq_t *seq; /* run only */
    uint32_t target;
    int state;
    bool counted; /* counts against max_queue (never admitted yet) */
    bool cached;  /* the prompt is in the prefix index */
    bool sampled; /* the prefill's last chunk wants logits */
    uint64_t admit_order;
    struct wk_req *wait_on; /* WAITING: the request whose prefill it waits for (or NULL) */
    uint32_t wait_len;
    eng_tok_stream_t detok;
    eng_wire_usage_t usage;
    uint32_t n_gen;
    eng_seq_origin_t origin; /* where the prompt came from at the first admission (PREFILL) */
    bool admitted_once;
    bool prefill_sent;         /* PREFILL goes once, before the first TOKEN or the DONE */
    bool load_tried;           /* its tier blocks were asked for (at most once) */
    eng_tier_ticket_t *ticket; /* staged tier blocks, until its admission */
} wk_req_t;

/* A control operation from another thread (eng_worker_release, _drop_ns, _snapshot). */
enum { WK_OP_RELEASE = 1, WK_OP_DROP = 2, WK_OP_SNAPSHOT = 3 };

typedef struct wk_op {
    struct wk_op *next;
    int kind;
    uint64_t ns, snapshot_id;
    uint32_t n_tokens;
    int32_t tokens[]; /* [n_tokens] (RELEASE) */
} wk_op_t;

typedef struct wk_ev {
    struct wk_ev *next;
    eng_wire_frame_t f;
    uint64_t final_id; /* nonzero: the final event of this request */
    uint64_t data[];   /* the frame's text, path or snapshot entries (8-aligned) */
} wk_ev_t;

#define EV_DATA(ev) ((char *)(ev)->data)

typedef struct wk_list {
    wk_req_t **v;
    uint32_t n;
    size_t cap;
} wk_list_t;

struct eng_worker {
    eng_worker_params_t p;
    eng_t *e;
    eng_tok_t *tok;
    eng_sample_ws_t *ws;
    char *model_name;
    uint64_t model_fp;
    enum eng_kv_dtype kv_dtype;
    uint64_t kv_bytes_per_token;
    uint32_t n_vocab, n_ctx, bt, total_blocks;
    uint64_t g2_max_bytes; /* the G2 tier's budget (0: off, and always on the CPU backend) */
    uint64_t block_bytes;  /* one KV block's bytes in the pool (G2 load figures) */

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* the scheduler sleeps on it */
    pthread_cond_t cv_ev;   /* eng_worker_poll_wait sleeps on it */

    /* Shared, under mu. */
    bool stopping;
    eng_worker_wake_fn on_stopped; /* eng_worker_stop's notification */
    void *stopped_ud;
    wk_req_t *in_head, *in_tail;
    wk_op_t *op_head, *op_tail;
    uint32_t n_counted; /* requests counting against max_queue */
    uint64_t *live;
    uint32_t n_live, live_cap;
    uint64_t *cancels;
    uint32_t n_cancels, cancels_cap;
    wk_ev_t *q_head, *q_tail;
    bool wake_pending;
    eng_wire_load_t load;
    eng_worker_stats_t stats;
    uint64_t next_seqno;

    /* The consumer's: events returned by the last poll. */
    wk_ev_t *delivered;

    /* Scheduler thread only. */
    wk_list_t queue, waiting, run;
    wk_list_t loading;          /* requests whose tier blocks are being read, out of the queue */
    wk_ev_t *ev_head, *ev_tail; /* events of the step being built */
    uint32_t uncounted;         /* admissions to subtract from n_counted at the next flush */
    eng_worker_stats_t st;      /* the scheduler's counters (n_submitted excepted) */
    eng_batch_item_t *items;    /* [max_running] */
    wk_req_t **item_req;        /* [max_running] */
    uint32_t *item_take;        /* [max_running] prefill tokens granted this step */
    wk_req_t **order;           /* [max_running] scratch */
    float *logits;              /* [logits_rows][n_vocab] */
    uint32_t logits_rows;
    bool dev_sample;         /* the engine samples on its device (eng_forward_sample) */
    eng_sample_row_t *srows; /* [max_running] with dev_sample: each logits row's rules */
    int32_t *stoks;          /* [max_running] with dev_sample: each row's token */
    float prefill_tps;       /* moving averages for LOAD; 0 until measured */
    float decode_ms;
    uint64_t admit_counter;
    uint64_t last_load_ms;
    bool was_active;
    pc_buf_t text; /* scratch for released text */
    uint64_t *cancel_scratch;
    uint32_t cancel_scratch_cap;
};

/* ---------------------------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------------------------- */

static void set_err(char *err, size_t len, const char *fmt, ...) PC_PRINTF(3, 4);
static void set_err(char *err, size_t len, const char *fmt, ...)
{
    if (err == NULL || len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

static int list_push(wk_list_t *l, wk_req_t *r)
{
    int rc = pc_array_reserve(&l->v, &l->cap, (size_t)l->n + 1);
    if (rc != 0)
        return rc;
    l->v[l->n++] = r;
    return 0;
}

static void list_remove_at(wk_list_t *l, uint32_t i)
{
    memmove(&l->v[i], &l->v[i + 1], (size_t)(l->n - i - 1) * sizeof *l->v);
    l->n--;
}

static bool list_remove(wk_list_t *l, const wk_req_t *r)
{
    for (uint32_t i = 0; i < l->n; i++)
        if (l->v[i] == r) {
            list_remove_at(l, i);
            return true;
        }
    return false;
}

/* Inserts into the queue by priority (higher first), then arrival. The queue's capacity is
 * grown by the caller beforehand when it must not fail (see queue_reserve). */
static int queue_insert(eng_worker_t *w, wk_req_t *r)
{
    wk_list_t *q = &w->queue;
    int rc = list_push(q, r);
    if (rc != 0)
        return rc;
    uint32_t i = q->n - 1;
    while (i > 0 && (q->v[i - 1]->priority < r->priority ||
                     (q->v[i - 1]->priority == r->priority && q->v[i - 1]->seqno > r->seqno))) {
        q->v[i] = q->v[i - 1];
        i--;
    }
    q->v[i] = r;
    r->state = WK_QUEUED;
    return 0;
}

static uint32_t blocks_for(const eng_worker_t *w, uint32_t n_tokens)
{
    return (n_tokens + w->bt - 1) / w->bt;
}

static void req_free(eng_worker_t *w, wk_req_t *r)
{
    if (r == NULL)
        return;
    eng_seq_free(w->e, r->seq);
    eng_tier_ticket_free(w->e, r->ticket);
    eng_stop_free(r->stop);
    pc_free(r->stop_ids);
    pc_free(r->tokens);
    pc_free(r->retain);
    pc_free(r);
}

/* ---------------------------------------------------------------------------------------------
 * Events
 * ------------------------------------------------------------------------------------------- */

/* A new event on the step's list, with room for text_len bytes of text at ev->data. Events are
 * the worker's promise (one final event per request), so running out of memory here is fatal,
 * as for engine setup. */
static wk_ev_t *ev_add(eng_worker_t *w, uint8_t type, const char *text, size_t text_len)
{
    wk_ev_t *ev = pc_xmalloc(sizeof *ev + text_len + 1);
    memset(ev, 0, sizeof *ev);
    ev->f.type = type;
    if (text != NULL && text_len > 0) /* NULL: room only, the caller fills it */
        memcpy(ev->data, text, text_len);
    EV_DATA(ev)[text_len] = '\0';
    ev->next = NULL;
    if (w->ev_tail != NULL)
        w->ev_tail->next = ev;
    else
        w->ev_head = ev;
    w->ev_tail = ev;
    return ev;
}

/* PREFILL (wire.h): once per request, right before its first TOKEN or its DONE. */
static void ev_prefill_once(eng_worker_t *w, wk_req_t *r)
{
    if (r->prefill_sent)
        return;
    r->prefill_sent = true;
    wk_ev_t *ev = ev_add(w, ENG_WIRE_PREFILL, NULL, 0);
    ev->f.u.prefill = (eng_wire_prefill_t){.request_id = r->id,
                                           .prompt_tokens = r->n_prompt,
                                           .tokens_g1 = r->origin.g1_tokens,
                                           .tokens_g2 = r->origin.g2_tokens,
                                           .tokens_g3 = r->origin.g3_tokens,
                                           .tokens_recomputed = r->origin.recomputed_tokens};
}

static void ev_token(eng_worker_t *w, wk_req_t *r, uint32_t token, const char *text, size_t len)
{
    ev_prefill_once(w, r);
    wk_ev_t *ev = ev_add(w, ENG_WIRE_TOKEN, text, len);
    ev->f.u.token = (eng_wire_token_t){
        .request_id = r->id, .token_id = token, .text = pc_slice(EV_DATA(ev), len)};
}

/* A KV_EVENT about tokens[0..n_tokens) (NULL: unknown; then prefix_fp is 0). With_path (an
 * EVICTED event) the event carries the token ids too. */
static void ev_kv(eng_worker_t *w, uint8_t kind, uint8_t reason, uint64_t ns, const int32_t *tokens,
                  uint32_t n_tokens, uint32_t n_kept, uint64_t request_id, uint64_t ttl_ms,
                  bool with_path, uint8_t tier)
{
    size_t path = with_path && tokens != NULL ? (size_t)n_tokens * sizeof(uint32_t) : 0;
    wk_ev_t *ev = ev_add(w, ENG_WIRE_KV_EVENT, (const char *)tokens, path);
    ev->f.u.kv = (eng_wire_kv_event_t){
        .kind = kind,
        .reason = reason,
        .tier = tier,
        .ns = ns,
        .n_tokens = n_tokens,
        .prefix_fp = tokens != NULL ? eng_wire_prefix_fp((const uint32_t *)tokens, n_tokens) : 0,
        .n_kept = n_kept,
        .request_id = request_id,
        .ttl_ms = ttl_ms,
        .tokens = path > 0 ? (const uint32_t *)ev->data : NULL,
        .n_path = path > 0 ? n_tokens : 0};
}

/* The engine's eviction callback: runs on the scheduler thread inside engine calls. The event
 * names the path with its tokens, so the gateway clears exactly the prefixes through the
 * dropped part. A pin the engine gave up under pressure goes with its node (the prefix index
 * ends it; the EVICTED event tells the gateway). */
static void on_evict(const eng_evict_event_t *ev, void *ud)
{
    eng_worker_t *w = ud;
    uint32_t len = ev->n_tokens + ev->n_dropped;
    if (ev->tokens == NULL)
        PC_LOG(PC_LOG_WARN, "worker", "evicted prefix ns=%016llx n=%u reported without its path",
               (unsigned long long)ev->ns, len);
    /* Where the dropped part went: a lower tier, or nowhere. */
    uint8_t tier =
        ev->tier == ENG_TIER_G2 || ev->tier == ENG_TIER_G3 ? ev->tier : ENG_WIRE_TIER_NONE;
    ev_kv(w, ENG_WIRE_KV_EVICTED, (uint8_t)ev->reason, ev->ns, ev->tokens, len, ev->n_tokens, 0, 0,
          true, tier);
}

/* A tier event (tier.h): the block ending at n_tokens went down a tier, or left the last tier
 * that held it. It is KV_EVENT EVICTED of that block's positions, with the tier it is now in. */
static void on_tier_event(const eng_tier_event_t *ev, void *ud)
{
    eng_worker_t *w = ud;
    if (ev->n_tokens < w->bt || ev->n_tokens % w->bt != 0)
        return; /* not a whole block: nothing the gateway could name */
    uint8_t tier =
        ev->tier == ENG_TIER_G2 || ev->tier == ENG_TIER_G3 ? ev->tier : ENG_WIRE_TIER_NONE;
    ev_kv(w, ENG_WIRE_KV_EVICTED, ENG_EVICT_LRU, ev->ns, ev->tokens, ev->n_tokens,
          ev->n_tokens - w->bt, 0, 0, true, tier);
}

/* The G2 and G3 figures of LOAD (wire.h: an off tier is all zero). */
static void tier_load(eng_worker_t *w, eng_wire_load_t *out)
{
    eng_tier_stats_t t;
    eng_tier_stats(w->e, &t);
    if (t.g3_max_bytes > 0) {
        out->g3 = (eng_wire_tier_load_t){
            .max_bytes = t.g3_max_bytes,
            .bytes = t.g3_blocks > 0 ? t.g3_bytes : 0,
            .blocks = t.g3_bytes > 0 ? (uint32_t)PC_MIN(t.g3_blocks, UINT32_MAX) : 0,
            .hits = t.hit_blocks_g3,
            .loads = t.load_blocks,
            .load_bytes = t.load_bytes,
            .load_us = t.load_ns / 1000,
            .tokens_loaded = t.hit_blocks_g3 * w->bt,
            .writes = t.write_blocks,
            .writes_dropped = t.write_dropped,
            .evictions = t.evictions,
            .corrupt = t.corrupt,
            .load_bytes_per_s = isfinite(t.load_bytes_per_s) && t.load_bytes_per_s > 0
                                    ? (float)t.load_bytes_per_s
                                    : 0.0f};
    }
    if (w->g2_max_bytes > 0) {
        out->g2 = (eng_wire_tier_load_t){
            .max_bytes = w->g2_max_bytes,
            .bytes = t.g2_blocks > 0 ? t.g2_bytes : 0,
            .blocks = t.g2_bytes > 0 ? (uint32_t)PC_MIN(t.g2_blocks, UINT32_MAX) : 0,
            .hits = t.hit_blocks_g2,
            .loads = t.g2_load_blocks,
            .load_bytes = t.g2_load_bytes,
            .load_us = t.g2_load_ns / 1000,
            .tokens_loaded = t.hit_blocks_g2 * w->bt,
            .writes = t.g2_write_blocks,
            .writes_dropped = t.g2_write_dropped,
            .evictions = t.g2_evictions,
            .load_bytes_per_s = isfinite(t.g2_load_bytes_per_s) && t.g2_load_bytes_per_s > 0
                                    ? (float)t.g2_load_bytes_per_s
                                    : 0.0f};
    }
    out->tokens_recomputed = t.recomputed_tokens;
}

static void load_compute(eng_worker_t *w, eng_wire_load_t *out)
{
    uint64_t prefill = 0;
    for (uint32_t i = 0; i < w->queue.n; i++)
        prefill += w->queue.v[i]->target;
    for (uint32_t i = 0; i < w->waiting.n; i++)
        prefill += w->waiting.v[i]->target;
    for (uint32_t i = 0; i < w->loading.n; i++)
        prefill += w->loading.v[i]->target;
    for (uint32_t i = 0; i < w->run.n; i++) {
        const wk_req_t *r = w->run.v[i];
        if (r->state == WK_PREFILL)
            prefill += r->target - eng_seq_n_tokens(r->seq);
    }
    eng_kv_stats_t kv;
    eng_kv_stats(w->e, &kv);
    *out = (eng_wire_load_t){.queued_requests = w->queue.n + w->waiting.n + w->loading.n,
                             .queued_prefill_tokens = prefill,
                             .running_seqs = w->run.n,
                             .free_blocks = kv.n_free,
                             .cached_blocks = kv.n_cached,
                             .total_blocks = w->total_blocks,
                             .prefill_tokens_per_s = w->prefill_tps,
                             .decode_ms_per_token = w->decode_ms};
    tier_load(w, out);
}

static void ev_load(eng_worker_t *w, const eng_wire_load_t *l)
{
    wk_ev_t *ev = ev_add(w, ENG_WIRE_LOAD, NULL, 0);
    ev->f.u.load = *l;
}

/* Publishes the step: its events, the load and the counters; wakes the consumer. */
static void flush(eng_worker_t *w, const eng_wire_load_t *load)
{
    bool wake = false;
    pthread_mutex_lock(&w->mu);
    for (wk_ev_t *ev = w->ev_head; ev != NULL; ev = ev->next) {
        if (ev->final_id == 0)
            continue;
        for (uint32_t i = 0; i < w->n_live; i++)
            if (w->live[i] == ev->final_id) {
                w->live[i] = w->live[--w->n_live];
                break;
            }
        /* A cancel that came during the step that finished the request is moot; left in the
         * list, it would cancel the next request that reuses the id. */
        for (uint32_t i = 0; i < w->n_cancels; i++)
            if (w->cancels[i] == ev->final_id) {
                w->cancels[i] = w->cancels[--w->n_cancels];
                break;
            }
        w->st.n_finished++;
    }
    if (w->ev_head != NULL) {
        if (w->q_tail != NULL)
            w->q_tail->next = w->ev_head;
        else
            w->q_head = w->ev_head;
        w->q_tail = w->ev_tail;
        w->ev_head = w->ev_tail = NULL;
        if (!w->wake_pending) {
            w->wake_pending = true;
            wake = true;
        }
        pthread_cond_broadcast(&w->cv_ev);
    }
    PC_ASSERT(w->n_counted >= w->uncounted);
    w->n_counted -= w->uncounted;
    w->uncounted = 0;
    if (load != NULL)
        w->load = *load;
    uint64_t submitted = w->stats.n_submitted;
    w->stats = w->st;
    w->stats.n_submitted = submitted;
    pthread_mutex_unlock(&w->mu);
    if (wake && w->p.wake != NULL)
        w->p.wake(w->p.wake_ud);
}

/* ---------------------------------------------------------------------------------------------
 * Finishing, preempting, waiting
 * ------------------------------------------------------------------------------------------- */

/* Waiters of r go back to the queue (r is leaving the run list or moved on). */
static void release_waiters(eng_worker_t *w, const wk_req_t *r)
{
    for (uint32_t i = 0; i < w->waiting.n;) {
        wk_req_t *q = w->waiting.v[i];
        if (q->wait_on == r) {
            q->wait_on = NULL;
            list_remove_at(&w->waiting, i);
            if (queue_insert(w, q) != 0)
                PC_ABORT("worker: out of memory requeueing a request");
        } else {
            i++;
        }
    }
}

/* Takes r out of whatever list holds it, frees its sequence, queues its final event and frees
 * it. The event must have been built by the caller (so that its text can come from r). */
static void req_retire(eng_worker_t *w, wk_req_t *r, wk_ev_t *final)
{
    final->final_id = r->id;
    switch (r->state) {
    case WK_QUEUED:
        list_remove(&w->queue, r);
        break;
    case WK_WAITING:
        list_remove(&w->waiting, r);
        break;
    case WK_LOADING:
        list_remove(&w->loading, r);
        break;
    default:
        list_remove(&w->run, r);
        break;
    }
    release_waiters(w, r);
    if (r->counted)
        w->uncounted++;
    req_free(w, r);
}

static void finish_done(eng_worker_t *w, wk_req_t *r, uint8_t reason, int32_t stop_index,
                        const char *text, size_t len)
{
    ev_prefill_once(w, r);
    wk_ev_t *ev = ev_add(w, ENG_WIRE_DONE, text, len);
    r->usage.prompt_tokens = r->n_prompt;
    uint64_t now = pc_time_mono_ns();
    uint64_t admit = r->t_admit_ns != 0 ? r->t_admit_ns : now;
    uint64_t prefilled = r->t_prefill_ns != 0 ? r->t_prefill_ns : now;
    eng_wire_timing_t t = {.queue_us = (admit - r->t_submit_ns) / 1000};
    if (r->t_admit_ns != 0)
        t.prefill_us = (prefilled - r->t_admit_ns) / 1000;
    if (r->t_prefill_ns != 0)
        t.decode_us = (now - r->t_prefill_ns) / 1000;
    ev->f.u.done = (eng_wire_done_t){.request_id = r->id,
                                     .stop_reason = reason,
                                     .stop_index = stop_index,
                                     .text = pc_slice(EV_DATA(ev), len),
                                     .usage = r->usage,
                                     .timing = t};
    req_retire(w, r, ev);
}

static void finish_error(eng_worker_t *w, wk_req_t *r, int code, const char *msg)
{
    size_t len = strlen(msg);
    wk_ev_t *ev = ev_add(w, ENG_WIRE_ERROR, msg, len);
    ev->f.u.error = (eng_wire_error_t){
        .request_id = r->id, .code = code, .message = pc_slice(EV_DATA(ev), len)};
    PC_LOG(PC_LOG_WARN, "worker", "req=%llu failed: %s", (unsigned long long)r->id, msg);
    req_retire(w, r, ev);
}

/* Ends generation without a stop sequence: releases what the detokenizer and the stop matcher
 * still hold as DONE.text. */
static void finish_flush(eng_worker_t *w, wk_req_t *r, uint8_t reason)
{
    char piece[ENG_TOK_STREAM_OUT_MAX];
    size_t n = eng_tok_stream_flush(&r->detok, piece, sizeof piece);
    w->text.len = 0;
    uint32_t which = 0;
    int rc = n > 0 ? eng_stop_feed(r->stop, piece, n, &w->text, &which) : 0;
    if (rc == 1) { /* the last bytes completed a stop sequence */
        finish_done(w, r, ENG_WIRE_STOP_SEQUENCE, (int32_t)which, w->text.base, w->text.len);
        return;
    }
    if (rc == 0)
        rc = eng_stop_flush(r->stop, &w->text);
    if (rc != 0) {
        finish_error(w, r, rc, "out of memory releasing text");
        return;
    }
    finish_done(w, r, reason, -1, w->text.base, w->text.len);
}

/* Frees r's sequence and sends it back to the queue; it recomputes what it had. */
static void preempt(eng_worker_t *w, wk_req_t *r)
{
    PC_LOG(PC_LOG_DEBUG, "worker", "req=%llu preempted at %u tokens", (unsigned long long)r->id,
           eng_seq_n_tokens(r->seq));
    list_remove(&w->run, r);
    release_waiters(w, r);
    eng_seq_free(w->e, r->seq);
    r->seq = NULL;
    r->target = r->n_gen == 0 ? r->n_prompt : r->n_tokens;
    if (queue_insert(w, r) != 0)
        PC_ABORT("worker: out of memory requeueing a request");
    w->st.n_preempted++;
}

/* ---------------------------------------------------------------------------------------------
 * Intake, cancellation, pins
 * ------------------------------------------------------------------------------------------- */

static void cancel_one(eng_worker_t *w, uint64_t id)
{
    wk_list_t *lists[] = {&w->run, &w->queue, &w->waiting, &w->loading};
    for (size_t l = 0; l < PC_ARRAY_LEN(lists); l++)
        for (uint32_t i = 0; i < lists[l]->n; i++)
            if (lists[l]->v[i]->id == id) {
                finish_done(w, lists[l]->v[i], ENG_WIRE_STOP_CANCELED, -1, NULL, 0);
                return;
            }
    /* Not found: it finished on its own before the cancel was seen. */
}

/* ---- pins: kept by the engine's prefix index (prefix.h); the worker reports them ---- */

/* A pin the prefix index ended (expiry, release, drop): KV_EVENT RELEASED tells the gateway;
 * the KV stays cached. */
static void on_pin_end(const eng_prefix_pin_t *pin, void *ud)
{
    eng_worker_t *w = ud;
    ev_kv(w, ENG_WIRE_KV_RELEASED, 0, pin->ns, pin->tokens, pin->n_tokens, pin->n_tokens, 0, 0,
          false, ENG_WIRE_TIER_NONE);
}

static uint64_t ttl_left(uint64_t expiry, uint64_t now)
{
    if (expiry == UINT64_MAX)
        return UINT64_MAX;
    return expiry > now ? expiry - now : 0;
}

/* Pins every retain entry of r that its computed positions now cover. A prefix pinned already
 * keeps its one pin, with the later expiry (a refresh). Each entry is reported: RETAINED, or
 * RETAIN_FAILED when there was no memory for it. */
static void apply_retains(eng_worker_t *w, wk_req_t *r)
{
    uint32_t have = eng_seq_n_tokens(r->seq);
    for (uint32_t i = 0; i < r->n_retain; i++) {
        wk_retain_t *rt = &r->retain[i];
        if (rt->done || rt->n_tokens > have)
            continue;
        rt->done = true;
        uint64_t expiry = r->t_submit_ms + rt->ttl_ms;
        if (expiry < r->t_submit_ms)
            expiry = UINT64_MAX;
        /* The prefix index merges a second retain into the prefix's pin (and holds the node
         * again when the pin had lapsed under pressure); until is the pin's expiry after it. */
        uint64_t until;
        if (eng_prefix_retain(w->e, r->seq, r->ns, rt->n_tokens, expiry, &until) != 0)
            goto fail;
        ev_kv(w, ENG_WIRE_KV_RETAINED, 0, r->ns, r->tokens, rt->n_tokens, rt->n_tokens, r->id,
              ttl_left(until, pc_time_mono_ms()), false, ENG_WIRE_TIER_NONE);
        continue;
    fail:
        PC_LOG(PC_LOG_WARN, "worker", "req=%llu: out of memory retaining %u tokens",
               (unsigned long long)r->id, rt->n_tokens);
        ev_kv(w, ENG_WIRE_KV_RETAIN_FAILED, 0, r->ns, r->tokens, rt->n_tokens, 0, r->id, rt->ttl_ms,
              false, ENG_WIRE_TIER_NONE);
    }
}

/* Frame payload size aimed at by one SNAPSHOT event (a bigger entry goes alone). */
#define SNAPSHOT_FRAME_BYTES (64u << 10)

static size_t snap_entry_bytes(uint32_t n_tokens)
{
    return 33 + 4 * (size_t)n_tokens;
}

/* The prefixes the tiers below the pool hold (eng_tier_prefixes), copied for the snapshot:
 * records of {u64 ns, u32 n_tokens, u32 tier, i32 tokens[n_tokens]} back to back. */
typedef struct snap_tiers {
    pc_buf_t rec;
    size_t *at; /* [n] offsets into rec */
    uint32_t n, cap;
    bool oom;
} snap_tiers_t;

static void snap_tier_add(const eng_tier_prefix_t *p, void *ud)
{
    snap_tiers_t *t = ud;
    if (t->oom || p->n_tokens == 0 || (p->tier != ENG_TIER_G2 && p->tier != ENG_TIER_G3))
        return;
    if (t->n == t->cap) {
        uint32_t cap = t->cap ? 2 * t->cap : 64;
        size_t *at = pc_realloc(t->at, (size_t)cap * sizeof *at);
        if (at == NULL) {
            t->oom = true;
            return;
        }
        t->at = at;
        t->cap = cap;
    }
    uint32_t head[4] = {(uint32_t)p->ns, (uint32_t)(p->ns >> 32), p->n_tokens, p->tier};
    size_t off = t->rec.len;
    if (pc_buf_append(&t->rec, head, sizeof head) != 0 ||
        pc_buf_append(&t->rec, p->tokens, 4 * (size_t)p->n_tokens) != 0) {
        t->oom = true;
        return;
    }
    t->at[t->n++] = off;
}

/* Entry i of the snapshot: the pins first, then the tier-held prefixes. Copies its tokens to
 * toks when not NULL. */
static void snap_item(eng_worker_t *w, const snap_tiers_t *t, uint32_t n_pins, uint32_t i,
                      uint64_t now, eng_wire_snap_entry_t *e, uint32_t *toks)
{
    if (i < n_pins) {
        eng_prefix_pin_t pin;
        eng_prefix_pin_at(w->e, i, &pin, (int32_t *)toks);
        *e = (eng_wire_snap_entry_t){.ns = pin.ns,
                                     .ttl_ms = ttl_left(pin.expiry, now),
                                     .tier = ENG_WIRE_TIER_G1,
                                     .n_tokens = pin.n_tokens};
        return;
    }
    uint32_t head[4];
    const char *r = t->rec.base + t->at[i - n_pins];
    memcpy(head, r, sizeof head);
    *e = (eng_wire_snap_entry_t){.ns = (uint64_t)head[0] | (uint64_t)head[1] << 32,
                                 .tier = (uint8_t)head[3],
                                 .n_tokens = head[2]};
    if (toks != NULL)
        memcpy(toks, r + sizeof head, 4 * (size_t)head[2]);
}

/* Queues the SNAPSHOT events of every pin, then of every prefix held only in a lower tier (what
 * a restarted worker found on its disk: tier 2 or 3, ttl_ms 0), in frames of about
 * SNAPSHOT_FRAME_BYTES. A prefix both pinned and on disk is listed as pinned, and also as held
 * on disk: the gateway keeps the better tier while the pin lasts. */
static void snapshot(eng_worker_t *w, uint64_t id)
{
    uint64_t now = pc_time_mono_ms();
    snap_tiers_t tiers = {.rec = PC_BUF_INIT};
    if (eng_tier_enabled(w->e) && (eng_tier_prefixes(w->e, snap_tier_add, &tiers) < 0 || tiers.oom))
        PC_LOG(PC_LOG_WARN, "worker",
               "snapshot %llu: out of memory listing the tiers' prefixes "
               "(the snapshot lists %u of them)",
               (unsigned long long)id, tiers.n);
    uint32_t i = 0, n_pins = eng_prefix_n_pins(w->e), n_all = n_pins + tiers.n;
    eng_wire_snap_entry_t e;
    do {
        uint32_t first = i;
        size_t bytes = 0, tok_bytes = 0;
        for (; i < n_all; i++) {
            snap_item(w, &tiers, n_pins, i, now, &e, NULL);
            if (i > first && bytes + snap_entry_bytes(e.n_tokens) > SNAPSHOT_FRAME_BYTES)
                break;
            bytes += snap_entry_bytes(e.n_tokens);
            tok_bytes += 4 * (size_t)e.n_tokens;
        }
        uint32_t n = i - first;
        size_t ent_bytes = (size_t)n * sizeof(eng_wire_snap_entry_t);
        wk_ev_t *ev = ev_add(w, ENG_WIRE_SNAPSHOT, NULL, ent_bytes + tok_bytes);
        eng_wire_snap_entry_t *ents = (eng_wire_snap_entry_t *)ev->data;
        uint32_t *toks = (uint32_t *)(EV_DATA(ev) + ent_bytes);
        for (uint32_t k = 0; k < n; k++) {
            snap_item(w, &tiers, n_pins, first + k, now, &ents[k], toks);
            ents[k].tokens = toks;
            ents[k].prefix_fp = eng_wire_prefix_fp(toks, ents[k].n_tokens);
            toks += ents[k].n_tokens;
        }
        ev->f.u.snapshot = (eng_wire_snapshot_t){
            .snapshot_id = id, .last = i == n_all, .entries = ents, .n_entries = n};
    } while (i < n_all);
    pc_buf_free(&tiers.rec);
    pc_free(tiers.at);
}

/* Runs a control operation on the scheduler thread. */
static void run_op(eng_worker_t *w, const wk_op_t *op)
{
    switch (op->kind) {
    case WK_OP_RELEASE:
        if (eng_prefix_release(w->e, op->ns, op->tokens, op->n_tokens) == 0)
            ev_kv(w, ENG_WIRE_KV_RELEASED, 0, op->ns, op->tokens, op->n_tokens, op->n_tokens, 0, 0,
                  false, ENG_WIRE_TIER_NONE);
        break;
    case WK_OP_DROP: {
        eng_prefix_release_ns(w->e, op->ns, on_pin_end, w);
        int32_t none = 0;
        int rc = eng_prefix_drop(w->e, op->ns, &none, 0);
        if (rc != 0 && rc != PC_ERR_NOTFOUND)
            PC_LOG(PC_LOG_WARN, "worker", "dropping namespace %016llx: %s",
                   (unsigned long long)op->ns, pc_strerror(rc));
        break;
    }
    default:
        snapshot(w, op->snapshot_id);
        break;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Admission
 * ------------------------------------------------------------------------------------------- */

static uint32_t common_prefix(const int32_t *a, const int32_t *b, uint32_t n)
{
    uint32_t i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* Caches what p computed of its prompt so far, for requests that share it. */
static int cache_computed(eng_worker_t *w, wk_req_t *p)
{
    return eng_prefix_insert(w->e, p->seq, p->ns, PC_MIN(eng_seq_n_tokens(p->seq), p->n_prompt));
}

/* The running prefill of r's namespace that shares the longest prefix with r (beyond what r
 * reuses from the cache by at least a block), or NULL. *len gets the shared length. */
static wk_req_t *prefix_owner(eng_worker_t *w, const wk_req_t *r, uint32_t n_reused, uint32_t *len)
{
    wk_req_t *best = NULL;
    uint32_t best_len = n_reused + w->bt - 1;
    for (uint32_t i = 0; i < w->run.n; i++) {
        wk_req_t *p = w->run.v[i];
        if (p->state != WK_PREFILL || p->ns != r->ns)
            continue;
        /* r reuses at most target - 1 positions; p caches at most its prompt. */
        uint32_t n = PC_MIN(r->target - 1, p->n_prompt);
        uint32_t l = common_prefix(r->tokens, p->tokens, n);
        if (l > best_len) {
            best = p;
            best_len = l;
        }
    }
    *len = best_len;
    return best;
}

/* Admits queued requests, first come first served, while sequences and blocks allow. */
/* Asynchronous tier reads (tier.h). A queued request whose prompt continues past the pool into
 * a lower tier gets its blocks read on the engine's I/O thread while it waits out of the queue
 * (LOADING): the scheduler keeps admitting and stepping the others, and the request goes back
 * to the queue (at its old place: queue order is priority, then arrival) once its blocks are
 * staged, so that its admission only copies them into the pool. A prefetch refused (the staging
 * budget is spent) or with nothing to read leaves the request queued; eng_seq_start_cached then
 * reads what it needs itself. */
static void start_loads(eng_worker_t *w)
{
    if (!eng_tier_enabled(w->e))
        return;
    for (uint32_t i = 0; i < w->queue.n;) {
        wk_req_t *r = w->queue.v[i];
        if (r->load_tried) {
            i++;
            continue;
        }
        r->load_tried = true;
        eng_tier_ticket_t *t = NULL;
        if (eng_tier_prefetch(w->e, r->ns, r->tokens, r->target, &t) != 0 || t == NULL) {
            i++;
            continue;
        }
        r->ticket = t;
        if (eng_tier_ready(t)) {
            i++;
            continue;
        }
        list_remove_at(&w->queue, i);
        if (list_push(&w->loading, r) != 0)
            PC_ABORT("worker: out of memory parking a loading request");
        r->state = WK_LOADING;
    }
}

static void finish_loads(eng_worker_t *w)
{
    for (uint32_t i = 0; i < w->loading.n;) {
        wk_req_t *r = w->loading.v[i];
        if (!eng_tier_ready(r->ticket)) {
            i++;
            continue;
        }
        list_remove_at(&w->loading, i);
        if (queue_insert(w, r) != 0)
            PC_ABORT("worker: out of memory requeueing a loaded request");
    }
}

static void admit(eng_worker_t *w)
{
    if (w->queue.n == 0)
        return;
    eng_kv_stats_t kv;
    eng_kv_stats(w->e, &kv);
    int64_t avail = (int64_t)kv.n_free + kv.n_cached - w->run.n;
    while (w->queue.n > 0 && w->run.n < w->p.max_running) {
        wk_req_t *r = w->queue.v[0];
        eng_seq_t *s = NULL;
        uint32_t reused = 0;
        if (eng_seq_create(w->e, &s) != 0 ||
            eng_seq_start_cached(w->e, s, r->ns, r->tokens, r->target, &reused) != 0) {
            eng_seq_free(w->e, s);
            finish_error(w, r, PC_ERR_NOMEM, "out of memory starting a sequence");
            continue;
        }
        uint32_t need = blocks_for(w, r->target) - reused / w->bt + 1;
        if (w->run.n > 0 && (int64_t)need > avail) {
            eng_seq_free(w->e, s);
            break;
        }
        uint32_t shared = 0;
        wk_req_t *owner = prefix_owner(w, r, reused, &shared);
        if (owner != NULL) {
            eng_seq_free(w->e, s);
            s = NULL;
            if (eng_seq_n_tokens(owner->seq) < shared) { /* park r until the prefill passes */
                list_remove_at(&w->queue, 0);
                if (list_push(&w->waiting, r) != 0)
                    PC_ABORT("worker: out of memory parking a request");
                r->state = WK_WAITING;
                r->wait_on = owner;
                r->wait_len = shared;
                w->st.n_prefix_waits++;
                continue;
            }
            /* The owner computed the shared part already: cache it and start from it. */
            if (cache_computed(w, owner) != 0 || eng_seq_create(w->e, &s) != 0 ||
                eng_seq_start_cached(w->e, s, r->ns, r->tokens, r->target, &reused) != 0) {
                eng_seq_free(w->e, s);
                finish_error(w, r, PC_ERR_NOMEM, "out of memory starting a sequence");
                continue;
            }
        }
        list_remove_at(&w->queue, 0);
        if (list_push(&w->run, r) != 0)
            PC_ABORT("worker: out of memory admitting a request");
        r->seq = s;
        r->state = WK_PREFILL;
        r->admit_order = ++w->admit_counter;
        if (r->t_admit_ns == 0)
            r->t_admit_ns = pc_time_mono_ns();
        w->st.tokens_reused += reused;
        if (!r->admitted_once) { /* PREFILL and DONE's tokens_reused report the first admission */
            r->admitted_once = true;
            r->usage.tokens_reused = reused;
            eng_seq_origin(s, &r->origin);
        }
        eng_tier_ticket_free(w->e, r->ticket); /* its staged blocks are in the pool now */
        r->ticket = NULL;
        if (r->counted) {
            r->counted = false;
            w->uncounted++;
        }
        avail -= need;
        apply_retains(w, r); /* a retained prefix found whole in the cache is pinned now */
    }
}

/* Waiters whose owner's prefill passed the shared part go back to the queue, after the owner's
 * computed prefix is cached for them. */
static void wake_waiters(eng_worker_t *w)
{
    for (uint32_t i = 0; i < w->waiting.n;) {
        wk_req_t *q = w->waiting.v[i];
        wk_req_t *p = q->wait_on;
        if (p != NULL && eng_seq_n_tokens(p->seq) < q->wait_len) {
            i++;
            continue;
        }
        if (p != NULL && cache_computed(w, p) != 0)
            PC_LOG(PC_LOG_WARN, "worker", "req=%llu: out of memory caching a shared prefix",
                   (unsigned long long)p->id);
        q->wait_on = NULL;
        list_remove_at(&w->waiting, i);
        if (queue_insert(w, q) != 0)
            PC_ABORT("worker: out of memory requeueing a request");
    }
}

/* ---------------------------------------------------------------------------------------------
 * The step
 * ------------------------------------------------------------------------------------------- */

static bool is_stop_id(const wk_req_t *r, uint32_t tok)
{
    for (uint32_t i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == tok)
            return true;
    return false;
}

/* Samples r's next token from its logits row (host sampling), or takes dev_tok, the token the
 * device sampled under r's eng_sampler_peek row (row NULL), and emits it; may finish r. */
static void sample_next(eng_worker_t *w, wk_req_t *r, const float *row, int32_t dev_tok)
{
    uint32_t tok;
    int rc = 0;
    if (row != NULL) {
        rc = eng_sampler_sample(&r->sampler, w->ws, row, w->n_vocab, &tok);
    } else {
        eng_sampler_advance(&r->sampler);
        rc = dev_tok >= 0 ? 0 : PC_ERR_INVAL;
        tok = (uint32_t)dev_tok;
    }
    if (rc != 0) {
        finish_error(w, r, PC_ERR_INVAL, "no token to sample: every logit is NaN or -inf");
        return;
    }
    r->tokens[r->n_tokens++] = (int32_t)tok;
    r->n_gen++;
    r->usage.output_tokens++;
    w->st.tokens_generated++;
    bool eog = (r->flags & ENG_WIRE_SUBMIT_IGNORE_EOG) == 0 && eng_tok_is_eog(w->tok, tok);
    if (eog || is_stop_id(r, tok)) {
        ev_token(w, r, tok, NULL, 0);
        finish_flush(w, r, eog ? ENG_WIRE_STOP_EOG : ENG_WIRE_STOP_TOKEN);
        return;
    }
    char piece[ENG_TOK_STREAM_OUT_MAX];
    size_t n = eng_tok_stream_feed(&r->detok, tok, piece, sizeof piece);
    w->text.len = 0;
    uint32_t which = 0;
    rc = n > 0 ? eng_stop_feed(r->stop, piece, n, &w->text, &which) : 0;
    if (rc < 0) {
        finish_error(w, r, rc, "out of memory matching stop sequences");
        return;
    }
    ev_token(w, r, tok, w->text.base, w->text.len);
    if (rc == 1) {
        finish_done(w, r, ENG_WIRE_STOP_SEQUENCE, (int32_t)which, NULL, 0);
        return;
    }
    if (r->n_gen >= r->max_tokens) {
        finish_flush(w, r, ENG_WIRE_STOP_MAX_TOKENS);
        return;
    }
    r->state = WK_DECODE;
}

static int cmp_remaining(const void *a, const void *b)
{
    const wk_req_t *x = *(wk_req_t *const *)a, *y = *(wk_req_t *const *)b;
    uint32_t rx = x->target - eng_seq_n_tokens(x->seq), ry = y->target - eng_seq_n_tokens(y->seq);
    if (rx != ry)
        return rx < ry ? -1 : 1;
    return x->admit_order < y->admit_order ? -1 : x->admit_order > y->admit_order;
}

/* Builds the step's batch: every decode, then prefill chunks within the token budget. The
 * oldest prefill gets a block's worth first (so it always progresses), then the budget left
 * goes to the prefills closest to done first (short work is not held up by a long prompt).
 * Returns the number of items. */
static uint32_t build_batch(eng_worker_t *w)
{
    uint32_t n = 0, n_pre = 0;
    for (uint32_t i = 0; i < w->run.n; i++) {
        wk_req_t *r = w->run.v[i];
        if (r->state == WK_DECODE) {
            w->item_req[n] = r;
            w->item_take[n] = 0;
            w->items[n++] = (eng_batch_item_t){.seq = r->seq,
                                               .tokens = &r->tokens[r->n_tokens - 1],
                                               .n_tokens = 1,
                                               .logits = ENG_LOGITS_LAST};
        } else {
            w->order[n_pre++] = r;
        }
    }
    if (n_pre == 0)
        return n;
    uint32_t budget = w->p.step_tokens > n ? w->p.step_tokens - n : 0;
    budget = PC_MAX(budget, w->bt); /* prefills always progress */
    wk_req_t *oldest = w->order[0];
    for (uint32_t i = 1; i < n_pre; i++)
        if (w->order[i]->admit_order < oldest->admit_order)
            oldest = w->order[i];
    qsort(w->order, n_pre, sizeof *w->order, cmp_remaining);
    uint32_t first = n;
    for (uint32_t i = 0; i < n_pre; i++) {
        w->item_req[n + i] = w->order[i];
        w->item_take[n + i] = 0;
    }
    /* Grants: the oldest's block, then shortest remaining first. */
    uint32_t oldest_at = first;
    while (w->item_req[oldest_at] != oldest)
        oldest_at++;
    uint32_t rem_old = oldest->target - eng_seq_n_tokens(oldest->seq);
    uint32_t g = PC_MIN(PC_MIN(rem_old, w->bt), budget);
    w->item_take[oldest_at] = g;
    budget -= g;
    for (uint32_t i = first; i < first + n_pre && budget > 0; i++) {
        wk_req_t *r = w->item_req[i];
        uint32_t rem = r->target - eng_seq_n_tokens(r->seq) - w->item_take[i];
        uint32_t t = PC_MIN(rem, budget);
        w->item_take[i] += t;
        budget -= t;
    }
    /* A step that completes a prefill (a first token waits on it) carries at most as many
     * tokens of prefills that do not complete (and at least a block), so a short request's
     * first token costs at most about twice its own work beside a long cold prompt. The
     * longest remaining give way first; the oldest keeps its block. */
    uint32_t fin = 0, unfin = 0;
    for (uint32_t i = first; i < first + n_pre; i++) {
        wk_req_t *r = w->item_req[i];
        if (eng_seq_n_tokens(r->seq) + w->item_take[i] == r->target)
            fin += w->item_take[i];
        else
            unfin += w->item_take[i];
    }
    uint32_t cap = PC_MAX(fin, w->bt);
    for (uint32_t i = first + n_pre; fin > 0 && unfin > cap && i-- > first;) {
        wk_req_t *r = w->item_req[i];
        if (eng_seq_n_tokens(r->seq) + w->item_take[i] == r->target)
            continue;
        uint32_t keep = i == oldest_at ? g : 0;
        uint32_t cut = PC_MIN(unfin - cap, w->item_take[i] - keep);
        w->item_take[i] -= cut;
        unfin -= cut;
    }
    /* Items for every grant. */
    for (uint32_t i = first; i < first + n_pre; i++) {
        wk_req_t *r = w->item_req[i];
        uint32_t t = w->item_take[i];
        if (t == 0)
            continue;
        uint32_t have = eng_seq_n_tokens(r->seq);
        bool ends = have + t == r->target;
        r->sampled = ends && (r->n_gen > 0 || r->max_tokens > 0);
        w->item_req[n] = r;
        w->item_take[n] = t;
        w->items[n++] =
            (eng_batch_item_t){.seq = r->seq,
                               .tokens = &r->tokens[have],
                               .n_tokens = t,
                               .logits = r->sampled ? ENG_LOGITS_LAST : ENG_LOGITS_NONE};
    }
    return n;
}

/* The youngest running request (the last admitted). */
static wk_req_t *youngest(eng_worker_t *w)
{
    wk_req_t *y = NULL;
    for (uint32_t i = 0; i < w->run.n; i++)
        if (y == NULL || w->run.v[i]->admit_order > y->admit_order)
            y = w->run.v[i];
    return y;
}

static int logits_reserve(eng_worker_t *w, uint32_t rows)
{
    if (rows <= w->logits_rows)
        return 0;
    float *l = pc_reallocarray(w->logits, (size_t)rows * w->n_vocab, sizeof *l);
    if (l == NULL)
        return PC_ERR_NOMEM;
    w->logits = l;
    w->logits_rows = rows;
    return 0;
}

/* One scheduler step: a forward pass over every running request that has work, then the
 * sampling and the events of its results. */
/* Moving averages of the step times, for the router (LOAD). */
#define EWMA_WEIGHT 0.2f

static void ewma(float *avg, float sample)
{
    *avg = *avg == 0.0f ? sample : *avg + EWMA_WEIGHT * (sample - *avg);
}

static void step(eng_worker_t *w)
{
    uint32_t n;
    int rc;
    uint64_t t0 = 0;
    for (;;) {
        t0 = pc_time_mono_ns();
        n = build_batch(w);
        if (n == 0)
            return;
        uint32_t rows = eng_batch_n_rows(w->items, n);
        if (w->dev_sample) {
            /* Each row's rules and next draw; the draws are consumed only once the step
             * succeeded (sample_next), so a retry after preemption peeks the same ones. */
            uint32_t k = 0;
            for (uint32_t i = 0; i < n; i++)
                if (w->items[i].logits != ENG_LOGITS_NONE)
                    eng_sampler_peek(&w->item_req[i]->sampler, &w->srows[k++]);
            PC_ASSERT(k == rows); /* the worker asks for one row (LAST) at most per item */
            rc = eng_forward_sample(w->e, w->items, n, w->srows, w->stoks);
        } else {
            rc = logits_reserve(w, rows);
            if (rc == 0)
                rc = eng_forward(w->e, w->items, n, rows > 0 ? w->logits : NULL);
        }
        if (rc != 1)
            break;
        /* The pool is full even after evicting the cache: make room by preemption. */
        wk_req_t *y = youngest(w);
        if (w->run.n == 1) {
            char msg[160];
            snprintf(msg, sizeof msg,
                     "the KV pool (%u blocks of %u tokens) cannot hold this request's %u tokens",
                     w->total_blocks, w->bt, eng_seq_n_tokens(y->seq) + 1);
            finish_error(w, y, PC_ERR_NOSPACE, msg);
            return;
        }
        preempt(w, y);
    }
    if (rc != 0) {
        char msg[128];
        snprintf(msg, sizeof msg, "forward step failed: %s", pc_strerror(rc));
        for (uint32_t i = 0; i < n; i++)
            finish_error(w, w->item_req[i], rc, msg);
        return;
    }
    w->st.n_steps++;
    {
        /* A step with decodes costs each decoding sequence its duration per token; its prefill
         * tokens went at tokens / duration (a mixed step counts for both). */
        float dt_s = (float)(pc_time_mono_ns() - t0) * 1e-9f;
        uint32_t n_dec = 0, n_pre = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (w->item_req[i]->state == WK_DECODE)
                n_dec++;
            else
                n_pre += w->item_take[i];
        }
        if (dt_s > 0.0f && n_dec > 0)
            ewma(&w->decode_ms, dt_s * 1000.0f);
        if (dt_s > 0.0f && n_pre > 0)
            ewma(&w->prefill_tps, (float)n_pre / dt_s);
    }
    uint32_t k = 0; /* the next logits row */
    for (uint32_t i = 0; i < n; i++) {
        wk_req_t *r = w->item_req[i];
        if (r->state == WK_DECODE) {
            sample_next(w, r, w->dev_sample ? NULL : w->logits + (size_t)k * w->n_vocab,
                        w->dev_sample ? w->stoks[k] : -1);
            k++;
            continue;
        }
        /* A prefill chunk. */
        uint32_t t = w->item_take[i];
        r->usage.tokens_computed += t;
        w->st.tokens_prefilled += t;
        apply_retains(w, r);
        if (eng_seq_n_tokens(r->seq) < r->target)
            continue;
        if (r->t_prefill_ns == 0)
            r->t_prefill_ns = pc_time_mono_ns();
        if (!r->cached) {
            if (eng_prefix_insert(w->e, r->seq, r->ns, r->n_prompt) != 0)
                PC_LOG(PC_LOG_WARN, "worker", "req=%llu: out of memory caching the prompt",
                       (unsigned long long)r->id);
            r->cached = true;
        }
        if (r->sampled) {
            sample_next(w, r, w->dev_sample ? NULL : w->logits + (size_t)k * w->n_vocab,
                        w->dev_sample ? w->stoks[k] : -1);
            k++;
        } else {
            finish_done(w, r, ENG_WIRE_STOP_MAX_TOKENS, -1, NULL, 0); /* prefill only */
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * The scheduler thread
 * ------------------------------------------------------------------------------------------- */

static void *sched_main(void *arg)
{
    eng_worker_t *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        bool idle = w->in_head == NULL && w->op_head == NULL && w->n_cancels == 0 &&
                    w->queue.n == 0 && w->waiting.n == 0 && w->run.n == 0;
        if (idle && !w->stopping) {
            /* Only tier reads in flight: look again in a millisecond (the I/O thread does not
             * wake this thread; a read takes longer than that). */
            uint64_t now = pc_time_mono_ms();
            uint64_t until = PC_MIN(eng_prefix_next_expiry(w->e), now + (w->loading.n ? 1 : 1000));
            if (until > now) {
                struct timespec ts;
                clock_gettime(CLOCK_MONOTONIC, &ts);
                uint64_t ns = (uint64_t)ts.tv_nsec + (until - now) * 1000000u;
                ts.tv_sec += (time_t)(ns / 1000000000u);
                ts.tv_nsec = (long)(ns % 1000000000u);
                pthread_cond_timedwait(&w->cv_work, &w->mu, &ts);
            }
        }
        if (w->stopping) {
            /* The notification is the thread's last act: once it ran, the owner may free the
             * worker (eng_worker_free then only joins a thread that is returning). */
            eng_worker_wake_fn done = w->on_stopped;
            void *done_ud = w->stopped_ud;
            pthread_mutex_unlock(&w->mu);
            if (done != NULL)
                done(done_ud);
            break;
        }
        wk_req_t *in = w->in_head;
        w->in_head = w->in_tail = NULL;
        wk_op_t *ops = w->op_head;
        w->op_head = w->op_tail = NULL;
        uint32_t n_cancels = w->n_cancels;
        if (n_cancels > w->cancel_scratch_cap) {
            uint64_t *c = pc_xrealloc(w->cancel_scratch, (size_t)n_cancels * sizeof *c);
            w->cancel_scratch = c;
            w->cancel_scratch_cap = n_cancels;
        }
        if (n_cancels > 0)
            memcpy(w->cancel_scratch, w->cancels, (size_t)n_cancels * sizeof *w->cancels);
        w->n_cancels = 0;
        pthread_mutex_unlock(&w->mu);

        while (in != NULL) {
            wk_req_t *next = in->next;
            in->next = NULL;
            if (queue_insert(w, in) != 0)
                PC_ABORT("worker: out of memory queueing a request");
            in = next;
        }
        for (uint32_t i = 0; i < n_cancels; i++)
            cancel_one(w, w->cancel_scratch[i]);
        uint64_t now = pc_time_mono_ms();
        eng_prefix_expire(w->e, now, on_pin_end, w);
        while (ops != NULL) {
            wk_op_t *next = ops->next;
            run_op(w, ops);
            pc_free(ops);
            ops = next;
        }
        finish_loads(w);
        start_loads(w);
        admit(w);
        if (w->p.before_step != NULL)
            w->p.before_step(w->p.before_step_ud);
        step(w);
        wake_waiters(w);
        eng_tier_poll(w->e, on_tier_event, w);

        bool active = w->queue.n + w->waiting.n + w->run.n + w->loading.n > 0;
        bool send_load = false;
        if (w->p.load_interval_ms > 0) {
            now = pc_time_mono_ms();
            if (active && now - w->last_load_ms >= w->p.load_interval_ms)
                send_load = true;
            if (!active && w->was_active)
                send_load = true; /* once more when it becomes idle */
        }
        w->was_active = active;
        eng_wire_load_t load;
        load_compute(w, &load);
        if (send_load) {
            ev_load(w, &load);
            w->last_load_ms = now;
        }
        flush(w, &load);
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Public API
 * ------------------------------------------------------------------------------------------- */

eng_worker_params_t eng_worker_params_default(void)
{
    return (eng_worker_params_t){.engine = eng_params_default(),
                                 .max_queue = 256,
                                 .max_running = 64,
                                 .step_tokens = 256,
                                 .load_interval_ms = 1000};
}

static void on_evict_none(const eng_evict_event_t *ev, void *ud)
{
    (void)ev;
    (void)ud;
}

/* Creates the parent directories of the tier directory (0700: they hold KV of every tenant);
 * the tier store creates the last level itself. NULL or "" (no tiers) does nothing. */
static int tier_dir_parents(const char *dir, char *err, size_t err_len)
{
    if (dir == NULL || dir[0] == '\0')
        return 0;
    char buf[4096];
    size_t n = strlen(dir);
    if (n >= sizeof buf)
        return pc_err_setf(err, err_len, PC_ERR_RANGE,
                           "worker: the tier directory's path is too "
                           "long");
    memcpy(buf, dir, n + 1);
    for (size_t i = 1; i < n; i++) {
        if (buf[i] != '/')
            continue;
        buf[i] = '\0';
        if (mkdir(buf, 0700) != 0 && errno != EEXIST)
            return pc_err_setf(err, err_len, PC_ERR_IO, "worker: cannot create %s: %s", buf,
                               strerror(errno));
        buf[i] = '/';
    }
    return 0;
}

int eng_worker_tier_key_read(const char *path, uint8_t key[32], char *err, size_t err_len)
{
    memset(key, 0, 32);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return pc_err_setf(err, err_len, PC_ERR_IO, "cannot read the key file %s: %s", path,
                           strerror(errno));
    struct stat st;
    char buf[160];
    int rc = 0;
    ssize_t n = 0;
    if (fstat(fd, &st) != 0) {
        rc = pc_err_setf(err, err_len, PC_ERR_IO, "cannot stat the key file %s: %s", path,
                         strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        rc = pc_err_setf(err, err_len, PC_ERR_INVAL, "the key file %s is not a regular file", path);
    } else if ((st.st_mode & 077) != 0) {
        rc = pc_err_setf(err, err_len, PC_ERR_INVAL,
                         "the key file %s may be read or written by group or others (mode %03o): "
                         "chmod 600 it",
                         path, (unsigned)(st.st_mode & 0777));
    } else if ((n = read(fd, buf, sizeof buf)) < 0) {
        rc = pc_err_setf(err, err_len, PC_ERR_IO, "cannot read the key file %s: %s", path,
                         strerror(errno));
    }
    close(fd);
    if (rc == 0) {
        size_t b = 0, e = (size_t)n;
        while (b < e && isspace((unsigned char)buf[b]))
            b++;
        while (e > b && isspace((unsigned char)buf[e - 1]))
            e--;
        if ((size_t)n == sizeof buf || e - b != 64)
            rc = pc_err_setf(err, err_len, PC_ERR_INVAL,
                             "the key file %s must hold 64 hexadecimal digits (32 bytes), not %zu "
                             "bytes",
                             path, (size_t)n == sizeof buf ? (size_t)st.st_size : e - b);
        size_t bin_len = 0;
        if (rc == 0 &&
            (sodium_hex2bin(key, 32, buf + b, 64, NULL, &bin_len, NULL) != 0 || bin_len != 32))
            rc = pc_err_setf(err, err_len, PC_ERR_INVAL,
                             "the key file %s holds something other than hexadecimal digits", path);
    }
    sodium_memzero(buf, sizeof buf); /* the key's text must not linger on the stack */
    if (rc != 0)
        sodium_memzero(key, 32);
    return rc;
}

int eng_worker_init(const eng_worker_params_t *params, eng_worker_t **out, char *err,
                    size_t err_len)
{
    *out = NULL;
    if (params->max_queue == 0 || params->max_running == 0 || params->step_tokens == 0) {
        set_err(err, err_len, "worker: max_queue, max_running and step_tokens must be >= 1");
        return PC_ERR_INVAL;
    }
    eng_worker_t *w = pc_calloc(1, sizeof *w);
    if (w == NULL) {
        set_err(err, err_len, "worker: out of memory");
        return PC_ERR_NOMEM;
    }
    w->p = *params;
    eng_vocab_t *vocab = NULL;
    int rc = tier_dir_parents(params->engine.tier.dir, err, err_len);
    if (rc == 0)
        rc = eng_init(&params->engine, &w->e, err, err_len);
    if (rc != 0)
        goto fail;
    const eng_gguf_t *g = eng_model_gguf(w->e);
    rc = eng_vocab_from_gguf(g, &vocab, err, err_len);
    if (rc == 0)
        rc = eng_tok_init(vocab, &w->tok, err, err_len);
    if (rc != 0)
        goto fail;
    w->n_vocab = eng_n_vocab(w->e);
    if (eng_tok_n_vocab(w->tok) > w->n_vocab) {
        set_err(err, err_len, "worker: the tokenizer has %u tokens, the model only %u",
                eng_tok_n_vocab(w->tok), w->n_vocab);
        rc = PC_ERR_FORMAT;
        goto fail;
    }
    w->n_ctx = eng_hparams(w->e)->n_ctx_train;
    eng_kv_stats_t kv;
    eng_kv_stats(w->e, &kv);
    w->bt = kv.block_tokens;
    w->total_blocks = kv.n_blocks;
    w->block_bytes = kv.block_bytes;
    /* G2 where configured (engine/tier.h: on the CPU backend the pool is host memory already,
     * so G2 there is only a larger second level). */
    if (eng_tier_enabled(w->e))
        w->g2_max_bytes = params->engine.tier.g2_bytes;
    pc_slice_t name;
    char nerr[8];
    if (eng_gguf_get_str(g, "general.name", &name, nerr, sizeof nerr) == 0 && name.len > 0) {
        w->model_name = pc_strndup(name.base, PC_MIN(name.len, ENG_WIRE_NAME_MAX));
    } else {
        const char *base = strrchr(params->engine.model_path, '/');
        base = base != NULL ? base + 1 : params->engine.model_path;
        w->model_name = pc_strndup(base, PC_MIN(strlen(base), ENG_WIRE_NAME_MAX));
    }
    rc = eng_model_fingerprint(w->e, &w->model_fp, err, err_len);
    if (rc != 0)
        goto fail;
    if (kv.dtype != ENG_KV_F16) {
        /* The KV dtype names cached prefixes too: KV of two dtypes never mixes. */
        uint8_t fpb[8 + 8] = {0};
        const char *dn = eng_kv_dtype_name(kv.dtype);
        memcpy(fpb, &w->model_fp, 8);
        memcpy(fpb + 8, dn, PC_MIN(strlen(dn), 8));
        w->model_fp = XXH3_64bits(fpb, sizeof fpb);
    }
    w->kv_dtype = kv.dtype;
    w->kv_bytes_per_token = kv.bytes_per_token;
    PC_LOG(PC_LOG_INFO, "worker",
           "model fingerprint %016llx (with the KV dtype); KV %s, %llu bytes per token, %llu "
           "tokens",
           (unsigned long long)w->model_fp, eng_kv_dtype_name(kv.dtype),
           (unsigned long long)kv.bytes_per_token, (unsigned long long)kv.capacity_tokens);
    rc = eng_sample_ws_init(w->n_vocab, &w->ws);
    uint32_t mr = params->max_running;
    w->items = pc_calloc(mr, sizeof *w->items);
    w->item_req = pc_calloc(mr, sizeof *w->item_req);
    w->item_take = pc_calloc(mr, sizeof *w->item_take);
    w->order = pc_calloc(mr, sizeof *w->order);
    w->dev_sample = eng_samples_on_device(w->e);
    if (w->dev_sample) {
        w->srows = pc_calloc(mr, sizeof *w->srows);
        w->stoks = pc_calloc(mr, sizeof *w->stoks);
    }
    if (rc != 0 || w->model_name == NULL || w->items == NULL || w->item_req == NULL ||
        w->item_take == NULL || w->order == NULL ||
        (w->dev_sample && (w->srows == NULL || w->stoks == NULL))) {
        set_err(err, err_len, "worker: out of memory");
        rc = PC_ERR_NOMEM;
        goto fail;
    }
    eng_set_evict_callback(w->e, on_evict, w);
    load_compute(w, &w->load); /* the load before the first step (a restart's tier figures) */
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv_work, &ca);
    pthread_cond_init(&w->cv_ev, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&w->thread, NULL, sched_main, w) != 0) {
        set_err(err, err_len, "worker: cannot start the scheduler thread");
        rc = PC_ERR_INTERNAL;
        pthread_cond_destroy(&w->cv_ev);
        pthread_cond_destroy(&w->cv_work);
        pthread_mutex_destroy(&w->mu);
        goto fail;
    }
    w->thread_started = true;
    eng_vocab_free(vocab);
    *out = w;
    return 0;

fail:
    eng_vocab_free(vocab);
    if (w->e != NULL)
        eng_set_evict_callback(w->e, on_evict_none, NULL);
    eng_sample_ws_free(w->ws);
    eng_tok_free(w->tok);
    eng_free(w->e);
    pc_free(w->model_name);
    pc_free(w->items);
    pc_free(w->item_req);
    pc_free(w->item_take);
    pc_free(w->order);
    pc_free(w->srows);
    pc_free(w->stoks);
    pc_free(w);
    return rc;
}

static void ev_list_free(wk_ev_t *ev)
{
    while (ev != NULL) {
        wk_ev_t *next = ev->next;
        pc_free(ev);
        ev = next;
    }
}

void eng_worker_stop(eng_worker_t *w, eng_worker_wake_fn on_stopped, void *ud)
{
    pthread_mutex_lock(&w->mu);
    if (!w->stopping) {
        w->stopping = true;
        w->on_stopped = on_stopped;
        w->stopped_ud = ud;
        pthread_cond_broadcast(&w->cv_work);
    }
    pthread_mutex_unlock(&w->mu);
}

void eng_worker_free(eng_worker_t *w)
{
    if (w == NULL)
        return;
    pthread_mutex_lock(&w->mu);
    w->stopping = true;
    pthread_cond_broadcast(&w->cv_work);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    eng_set_evict_callback(w->e, NULL, NULL);

    for (wk_req_t *r = w->in_head, *next; r != NULL; r = next) {
        next = r->next;
        req_free(w, r);
    }
    wk_list_t *lists[] = {&w->run, &w->queue, &w->waiting, &w->loading};
    for (size_t l = 0; l < PC_ARRAY_LEN(lists); l++) {
        for (uint32_t i = 0; i < lists[l]->n; i++)
            req_free(w, lists[l]->v[i]);
        pc_free(lists[l]->v);
    }
    for (wk_op_t *op = w->op_head, *next; op != NULL; op = next) {
        next = op->next;
        pc_free(op);
    }
    ev_list_free(w->ev_head);
    ev_list_free(w->q_head);
    ev_list_free(w->delivered);
    eng_free(w->e);
    eng_tok_free(w->tok);
    eng_sample_ws_free(w->ws);
    pc_free(w->model_name);
    pc_free(w->live);
    pc_free(w->cancels);
    pc_free(w->cancel_scratch);
    pc_free(w->items);
    pc_free(w->item_req);
    pc_free(w->item_take);
    pc_free(w->order);
    pc_free(w->logits);
    pc_free(w->srows);
    pc_free(w->stoks);
    pc_buf_free(&w->text);
    pthread_cond_destroy(&w->cv_ev);
    pthread_cond_destroy(&w->cv_work);
    pthread_mutex_destroy(&w->mu);
    pc_free(w);
}

void eng_worker_info(const eng_worker_t *w, eng_worker_info_t *out)
{
    *out = (eng_worker_info_t){.model_name = w->model_name,
                               .model_fp = w->model_fp,
                               .n_vocab = w->n_vocab,
                               .n_ctx = w->n_ctx,
                               .block_tokens = w->bt,
                               .total_blocks = w->total_blocks,
                               .max_prompt_tokens = PC_MIN(w->n_ctx, w->total_blocks * w->bt),
                               .backend = eng_backend_name_of(w->e),
                               .kv_dtype = eng_kv_dtype_name(w->kv_dtype),
                               .kv_bytes_per_token = w->kv_bytes_per_token,
                               .kv_capacity_tokens = (uint64_t)w->total_blocks * w->bt,
                               .backend_note = eng_backend_note_of(w->e)};
}

const eng_tok_t *eng_worker_tok(const eng_worker_t *w)
{
    return w->tok;
}

/* Checks a request against everything that does not depend on the scheduler's state. */
static int submit_check(const eng_worker_t *w, const eng_wire_submit_t *q, char *err,
                        size_t err_len)
{
    char why[160];
    if (q->request_id == 0) {
        set_err(err, err_len, "request id 0 is reserved");
        return PC_ERR_INVAL;
    }
    if (q->n_tokens == 0 || q->tokens == NULL) {
        set_err(err, err_len, "the prompt has no tokens");
        return PC_ERR_INVAL;
    }
    if ((q->flags & ~ENG_WIRE_SUBMIT_IGNORE_EOG) != 0) {
        set_err(err, err_len, "unknown request flags 0x%x", q->flags);
        return PC_ERR_INVAL;
    }
    for (uint32_t i = 0; i < q->n_tokens; i++)
        if (q->tokens[i] >= w->n_vocab) {
            set_err(err, err_len, "prompt token %u at position %u is not below n_vocab %u",
                    q->tokens[i], i, w->n_vocab);
            return PC_ERR_INVAL;
        }
    if (eng_sampling_params_check(&q->sampling, why, sizeof why) != 0) {
        set_err(err, err_len, "%s", why);
        return PC_ERR_INVAL;
    }
    if (q->n_retain > ENG_WIRE_RETAIN_MAX || (q->n_retain > 0 && q->retain == NULL)) {
        set_err(err, err_len, "at most %d retain entries", ENG_WIRE_RETAIN_MAX);
        return PC_ERR_INVAL;
    }
    for (uint32_t i = 0; i < q->n_retain; i++)
        if (q->retain[i].n_tokens == 0 || q->retain[i].n_tokens > q->n_tokens) {
            set_err(err, err_len, "retain entry %u: %u tokens, the prompt has %u", i,
                    q->retain[i].n_tokens, q->n_tokens);
            return PC_ERR_INVAL;
        }
    if (q->n_stop_ids > ENG_WIRE_STOP_IDS_MAX || (q->n_stop_ids > 0 && q->stop_ids == NULL)) {
        set_err(err, err_len, "at most %d stop token ids", ENG_WIRE_STOP_IDS_MAX);
        return PC_ERR_INVAL;
    }
    for (uint32_t i = 0; i < q->n_stop_ids; i++)
        if (q->stop_ids[i] >= w->n_vocab) {
            set_err(err, err_len, "stop token id %u is not below n_vocab %u", q->stop_ids[i],
                    w->n_vocab);
            return PC_ERR_INVAL;
        }
    if ((uint64_t)q->n_tokens + q->max_tokens > w->n_ctx) {
        set_err(err, err_len,
                "prompt (%u tokens) plus max_tokens (%u) exceeds the model's context of %u "
                "tokens",
                q->n_tokens, q->max_tokens, w->n_ctx);
        return PC_ERR_RANGE;
    }
    if (blocks_for(w, q->n_tokens) > w->total_blocks) {
        set_err(err, err_len,
                "prompt of %u tokens needs %u KV blocks; the worker's pool has %u blocks of %u "
                "tokens",
                q->n_tokens, blocks_for(w, q->n_tokens), w->total_blocks, w->bt);
        return PC_ERR_RANGE;
    }
    return 0;
}

int eng_worker_submit(eng_worker_t *w, const eng_wire_submit_t *q, char *err, size_t err_len)
{
    int rc = submit_check(w, q, err, err_len);
    if (rc != 0)
        return rc;
    char why[160];
    wk_req_t *r = pc_calloc(1, sizeof *r);
    if (r == NULL)
        goto nomem;
    r->id = q->request_id;
    r->ns = q->ns;
    r->priority = q->priority;
    r->max_tokens = q->max_tokens;
    r->flags = q->flags;
    r->t_submit_ns = pc_time_mono_ns();
    r->t_submit_ms = r->t_submit_ns / 1000000u;
    r->n_prompt = r->n_tokens = r->target = q->n_tokens;
    r->counted = true;
    if (eng_sampler_init(&r->sampler, &q->sampling, why, sizeof why) != 0) {
        set_err(err, err_len, "%s", why);
        rc = PC_ERR_INVAL;
        goto fail;
    }
    rc = eng_stop_init(q->stops, q->n_stops, &r->stop, why, sizeof why);
    if (rc != 0) {
        set_err(err, err_len, "%s", rc == PC_ERR_NOMEM ? "out of memory" : why);
        goto fail;
    }
    r->tokens = pc_malloc(((size_t)q->n_tokens + q->max_tokens) * sizeof *r->tokens);
    if (r->tokens == NULL)
        goto nomem;
    memcpy(r->tokens, q->tokens, (size_t)q->n_tokens * sizeof *r->tokens);
    if (q->n_retain > 0) {
        r->retain = pc_calloc(q->n_retain, sizeof *r->retain);
        if (r->retain == NULL)
            goto nomem;
        for (uint32_t i = 0; i < q->n_retain; i++)
            r->retain[i] =
                (wk_retain_t){.n_tokens = q->retain[i].n_tokens, .ttl_ms = q->retain[i].ttl_ms};
        r->n_retain = q->n_retain;
    }
    if (q->n_stop_ids > 0) {
        r->stop_ids = pc_malloc((size_t)q->n_stop_ids * sizeof *r->stop_ids);
        if (r->stop_ids == NULL)
            goto nomem;
        memcpy(r->stop_ids, q->stop_ids, (size_t)q->n_stop_ids * sizeof *r->stop_ids);
        r->n_stop_ids = q->n_stop_ids;
    }
    eng_tok_stream_init(&r->detok, w->tok, false);

    pthread_mutex_lock(&w->mu);
    if (w->stopping) {
        rc = PC_ERR_STATE;
        set_err(err, err_len, "the worker is shutting down");
    } else {
        for (uint32_t i = 0; i < w->n_live && rc == 0; i++)
            if (w->live[i] == r->id) {
                rc = PC_ERR_EXISTS;
                set_err(err, err_len, "request %llu is already running", (unsigned long long)r->id);
            }
    }
    if (rc == 0 && w->n_counted >= w->p.max_queue) {
        rc = PC_ERR_OVERLOADED;
        set_err(err, err_len, "overloaded: %u requests are already waiting", w->n_counted);
    }
    if (rc == 0 && w->n_live == w->live_cap) {
        uint32_t cap = w->live_cap ? w->live_cap * 2 : 64;
        uint64_t *l = pc_reallocarray(w->live, cap, sizeof *l);
        if (l == NULL) {
            rc = PC_ERR_NOMEM;
            set_err(err, err_len, "out of memory");
        } else {
            w->live = l;
            w->live_cap = cap;
        }
    }
    if (rc == 0) {
        w->live[w->n_live++] = r->id;
        r->seqno = ++w->next_seqno;
        if (w->in_tail != NULL)
            w->in_tail->next = r;
        else
            w->in_head = r;
        w->in_tail = r;
        w->n_counted++;
        w->stats.n_submitted++;
        pthread_cond_signal(&w->cv_work);
    }
    pthread_mutex_unlock(&w->mu);
    if (rc != 0)
        goto fail;
    return 0;

nomem:
    rc = PC_ERR_NOMEM;
    set_err(err, err_len, "out of memory");
fail:
    if (r != NULL) {
        r->seq = NULL;
        req_free(w, r);
    }
    return rc;
}

int eng_worker_cancel(eng_worker_t *w, uint64_t request_id)
{
    int rc = PC_ERR_NOTFOUND;
    pthread_mutex_lock(&w->mu);
    for (uint32_t i = 0; i < w->n_live; i++)
        if (w->live[i] == request_id) {
            rc = 0;
            break;
        }
    if (rc == 0) {
        bool dup = false;
        for (uint32_t i = 0; i < w->n_cancels; i++)
            dup |= w->cancels[i] == request_id;
        if (!dup && w->n_cancels == w->cancels_cap) {
            uint32_t cap = w->cancels_cap ? w->cancels_cap * 2 : 16;
            uint64_t *c = pc_reallocarray(w->cancels, cap, sizeof *c);
            if (c == NULL)
                rc = PC_ERR_NOMEM;
            else {
                w->cancels = c;
                w->cancels_cap = cap;
            }
        }
        if (rc == 0 && !dup) {
            w->cancels[w->n_cancels++] = request_id;
            pthread_cond_signal(&w->cv_work);
        }
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

/* Queues a control operation for the scheduler's next loop. */
static int op_queue(eng_worker_t *w, wk_op_t *op)
{
    int rc = 0;
    pthread_mutex_lock(&w->mu);
    if (w->stopping) {
        rc = PC_ERR_STATE;
    } else {
        if (w->op_tail != NULL)
            w->op_tail->next = op;
        else
            w->op_head = op;
        w->op_tail = op;
        pthread_cond_signal(&w->cv_work);
    }
    pthread_mutex_unlock(&w->mu);
    if (rc != 0)
        pc_free(op);
    return rc;
}

int eng_worker_release(eng_worker_t *w, uint64_t ns, const uint32_t *tokens, uint32_t n)
{
    if (n == 0 || tokens == NULL)
        return PC_ERR_INVAL;
    wk_op_t *op = pc_malloc(sizeof *op + (size_t)n * sizeof(int32_t));
    if (op == NULL)
        return PC_ERR_NOMEM;
    *op = (wk_op_t){.kind = WK_OP_RELEASE, .ns = ns, .n_tokens = n};
    memcpy(op->tokens, tokens, (size_t)n * sizeof(int32_t));
    return op_queue(w, op);
}

int eng_worker_drop_ns(eng_worker_t *w, uint64_t ns)
{
    wk_op_t *op = pc_malloc(sizeof *op);
    if (op == NULL)
        return PC_ERR_NOMEM;
    *op = (wk_op_t){.kind = WK_OP_DROP, .ns = ns};
    return op_queue(w, op);
}

int eng_worker_snapshot(eng_worker_t *w, uint64_t snapshot_id)
{
    wk_op_t *op = pc_malloc(sizeof *op);
    if (op == NULL)
        return PC_ERR_NOMEM;
    *op = (wk_op_t){.kind = WK_OP_SNAPSHOT, .snapshot_id = snapshot_id};
    return op_queue(w, op);
}

/* Moves up to max events to ev; mu held. Returns the nodes, linked. */
static size_t take_events(eng_worker_t *w, eng_worker_event_t *ev, size_t max, wk_ev_t **taken)
{
    size_t n = 0;
    wk_ev_t *head = w->q_head, *last = NULL;
    for (wk_ev_t *e = head; e != NULL && n < max; e = e->next) {
        ev[n++] = e->f;
        last = e;
    }
    if (last == NULL) {
        *taken = NULL;
        w->wake_pending = false;
        return 0;
    }
    w->q_head = last->next;
    if (w->q_head == NULL) {
        w->q_tail = NULL;
        w->wake_pending = false;
    }
    last->next = NULL;
    *taken = head;
    return n;
}

size_t eng_worker_poll(eng_worker_t *w, eng_worker_event_t *ev, size_t max)
{
    return eng_worker_poll_wait(w, ev, max, 0);
}

size_t eng_worker_poll_wait(eng_worker_t *w, eng_worker_event_t *ev, size_t max, int timeout_ms)
{
    ev_list_free(w->delivered);
    w->delivered = NULL;
    if (max == 0)
        return 0;
    pthread_mutex_lock(&w->mu);
    if (w->q_head == NULL && timeout_ms != 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        if (timeout_ms > 0) {
            uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)timeout_ms * 1000000u;
            ts.tv_sec += (time_t)(ns / 1000000000u);
            ts.tv_nsec = (long)(ns % 1000000000u);
        }
        while (w->q_head == NULL) {
            if (timeout_ms > 0) {
                if (pthread_cond_timedwait(&w->cv_ev, &w->mu, &ts) != 0)
                    break;
            } else {
                pthread_cond_wait(&w->cv_ev, &w->mu);
            }
        }
    }
    size_t n = take_events(w, ev, max, &w->delivered);
    pthread_mutex_unlock(&w->mu);
    return n;
}

void eng_worker_load(eng_worker_t *w, eng_wire_load_t *out)
{
    pthread_mutex_lock(&w->mu);
    *out = w->load;
    pthread_mutex_unlock(&w->mu);
    if (out->total_blocks == 0) /* before the first step */
        *out = (eng_wire_load_t){.free_blocks = w->total_blocks, .total_blocks = w->total_blocks};
}

void eng_worker_stats(eng_worker_t *w, eng_worker_stats_t *out)
{
    pthread_mutex_lock(&w->mu);
    *out = w->stats;
    pthread_mutex_unlock(&w->mu);
}
