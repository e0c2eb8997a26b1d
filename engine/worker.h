/*
 * worker.h — the worker: an engine run as a service. Many concurrent requests share one model
 * and one paged KV cache through a continuous-batching scheduler on the worker's own thread;
 * other threads submit and cancel requests and drain a queue of events (tokens, completions,
 * errors, KV cache changes, load reports).
 *
 *   eng_worker_params_t p = eng_worker_params_default();
 *   p.engine.model_path = "models/kvgw-demo.gguf";
 *   p.wake = on_wake; p.wake_ud = loop_async;      // e.g. a function calling uv_async_send
 *   eng_worker_t *w; eng_worker_init(&p, &w, err, sizeof err);
 *   eng_wire_submit_t rq = {.request_id = 7, .ns = ns, .tokens = ids, .n_tokens = n,
 *                           .max_tokens = 64, .sampling = {.temperature = 0, .top_p = 1}};
 *   eng_worker_submit(w, &rq, err, sizeof err);
 *   ... on wake, on the consumer's thread:
 *   eng_worker_event_t ev[64]; size_t k;
 *   while ((k = eng_worker_poll(w, ev, 64)) > 0) { handle ev[0..k); if (k < 64) break; }
 *   ... eng_worker_free(w);
 *
 * Requests and events are the worker protocol's own structs (engine/wire.h): a request is an
 * eng_wire_submit_t and an event is an eng_wire_frame_t of type PREFILL, TOKEN, DONE, ERROR,
 * KV_EVENT, LOAD or SNAPSHOT, with exactly the field meanings that wire.h documents. The in-process
 * gateway and the TCP worker server (`kvgw worker`) therefore see the same thing, and the server
 * encodes an event with eng_wire_encode as it is.
 *
 * Life of a request. eng_worker_submit checks the request and queues it, or refuses it at once
 * with an error (nothing queued, no event ever follows). An accepted request produces zero or
 * more TOKEN events, then exactly one final event: DONE, or ERROR with the request's id. After
 * the final event the id is free for reuse. KV_EVENT RETAINED and RETAIN_FAILED name the
 * request whose retain entry they answer and come before its final event; DONE carries the
 * request's queue wait, prefill and decode times. Events of one request arrive in order;
 * events of different requests interleave.
 *
 * Life of a retained prefix. Pins belong to the worker, one per (namespace, token prefix),
 * not to the request that asked for them or to a connection. A retain entry whose prefix the
 * prefill passed pins it until ttl_ms after the submit (RETAINED, with the time left); a later
 * retain of the same prefix moves that one pin's expiry to the later of the two (RETAINED
 * again: a TTL refresh that adds no pin). The pin ends at its expiry, on eng_worker_release
 * (the gateway's TTL ended first) or eng_worker_drop_ns (RELEASED each, request_id 0), or
 * under hard memory pressure with its node (EVICTED, reason PRESSURE). eng_worker_snapshot
 * lists the pins (SNAPSHOT events) in the event order, so a gateway that (re)connects rebuilds
 * its view from the snapshot and the events after it. Expiry costs O(log pins) per pin that
 * expires (a heap by expiry) and nothing for the others. The pins and their expiry are kept
 * by the engine's prefix index (engine/prefix.h has their state machine); the worker reports
 * them.
 *
 * The scheduler (one step at a time, on the worker thread):
 *   - Admission is first come, first served within a priority (higher priority first). At most
 *     max_queue requests wait; eng_worker_submit answers PC_ERR_OVERLOADED when the queue is
 *     full. A request starts from the longest prefix of its prompt cached in its namespace
 *     (eng_seq_start_cached); when a longer prefix of its prompt is being prefilled right now by
 *     another request of the same namespace, it waits until that prefill has passed the shared
 *     part and been cached, then starts from it: a shared prefix is computed once.
 *   - Each step runs one decode token of every running sequence plus chunks of pending
 *     prefills, oldest first, up to step_tokens tokens in all (chunked prefill): a long cold
 *     prompt never holds up the decodes and short prefills of the others for more than one
 *     step. New requests join at the next step; finished ones free their blocks at once.
 *   - After a prompt is prefilled, its prefix is cached in the namespace (eng_prefix_insert),
 *     and every retain entry whose length the prefill passed is pinned for ttl_ms counted from
 *     the submit call (eng_prefix_retain), reported by KV_EVENT RETAINED (or RETAIN_FAILED
 *     without memory for it). Expired pins are released (KV_EVENT RELEASED); the KV stays
 *     cached, unpinned.
 *   - When the pool runs out of blocks, the engine evicts unpinned cached prefixes first
 *     (least recently used), each reported by KV_EVENT EVICTED with the dropped path's token
 *     ids; then the scheduler preempts
 *     the youngest running request: its blocks are freed and it goes back to the head of the
 *     queue, to recompute its prompt plus the tokens it already generated (which are kept, not
 *     sent again), so greedy output is the same as without preemption. A request that fits the
 *     pool on its own is never failed for lack of blocks. Retained prefixes are dropped only
 *     when nothing else can make room (ENG_EVICT_PRESSURE).
 *
 * Stopping. Generated tokens go through the incremental detokenizer (never half a UTF-8
 * character) and the request's stop-sequence matcher; a TOKEN event carries the text released
 * with that token (possibly empty while text is held back as a possible stop). A request ends
 * with DONE when:
 *   ENG_WIRE_STOP_EOG         it generated an end-of-generation token (eng_tok_is_eog), unless
 *                             flags has ENG_WIRE_SUBMIT_IGNORE_EOG; the token is counted in
 *                             output_tokens and sent as a TOKEN event with empty text;
 *   ENG_WIRE_STOP_TOKEN       it generated one of its stop_ids (same as EOG otherwise);
 *   ENG_WIRE_STOP_SEQUENCE    a stop sequence completed (stop_index says which); the stop text
 *                             and anything after it is never sent; the token that completed it
 *                             is sent as a TOKEN event carrying the text before the stop;
 *   ENG_WIRE_STOP_MAX_TOKENS  it generated max_tokens tokens (max_tokens 0: the prompt was
 *                             prefilled and cached, nothing generated: pre-warming);
 *   ENG_WIRE_STOP_CANCELED    eng_worker_cancel reached it first.
 * DONE.text carries the text still held back at the end (empty after a stop sequence or a
 * cancellation). DONE.usage: prompt_tokens (the prompt's length), tokens_reused (prompt tokens
 * found in the worker's KV cache at the first admission: the physical hit; never more than
 * prompt_tokens), tokens_computed (prompt tokens prefilled), output_tokens (generated tokens,
 * each sent once as TOKEN). Without preemption tokens_reused + tokens_computed = prompt_tokens;
 * a preempted request is admitted again and tokens_computed then also counts that admission's
 * recomputation (its generated tokens are replayed as prompt); its reuse there counts only in
 * eng_worker_stats.
 *
 * ERROR events (request_id of the failed request) report failures after acceptance: an
 * engine error (PC_ERR_NOMEM, PC_ERR_INTERNAL...) or a sampler without any candidate (all
 * logits NaN: PC_ERR_INVAL). The request's resources are freed before the event is queued.
 *
 * LOAD events come every load_interval_ms while anything runs or waits, and once more when
 * the worker becomes idle; eng_worker_load gives the same figures at any time, with moving
 * averages of the prefill rate and of the decode step time.
 *
 * Threads. eng_worker_submit, eng_worker_cancel, eng_worker_release, eng_worker_drop_ns,
 * eng_worker_snapshot, eng_worker_load and eng_worker_info may be called from any thread,
 * concurrently. eng_worker_poll and eng_worker_poll_wait belong to one
 * consumer thread at a time (the strings of the events they return live until that thread's
 * next poll). eng_worker_free must not race with any other call.
 */
#ifndef ENG_WORKER_H
#define ENG_WORKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "tokenizer.h"
#include "wire.h"

typedef struct eng_worker eng_worker_t;

/* Called by the worker, from its own thread (never with a worker lock held), when events were
 * added to a queue that the consumer had emptied. It must be cheap and must not block: the
 * gateway passes a function that calls uv_async_send. A consumer that polls until a poll
 * returns fewer events than it asked for never misses a wake-up; spurious calls can happen. */
typedef void (*eng_worker_wake_fn)(void *ud);

typedef struct eng_worker_params {
    eng_params_t engine;       /* the model, threads and KV budget (eng_params_default()) */
    uint32_t max_queue;        /* requests waiting for admission; more are refused with
                                  PC_ERR_OVERLOADED. Default 256 */
    uint32_t max_running;      /* requests holding a sequence (prefilling or decoding) at once.
                                  Default 64 */
    uint32_t step_tokens;      /* tokens per scheduler step: every running decode plus prefill
                                  chunks. Default 256; at least 1 */
    uint32_t load_interval_ms; /* periodic LOAD events; 0 = none. Default 1000 */
    eng_worker_wake_fn wake;   /* may be NULL (then poll_wait or periodic polling) */
    void *wake_ud;
    /* Tests only (NULL otherwise): called by the scheduler thread before each step, after the
     * loop took its submits and cancels, with no worker lock held (a test lands a call there). */
    eng_worker_wake_fn before_step;
    void *before_step_ud;
} eng_worker_params_t;

eng_worker_params_t eng_worker_params_default(void);

/* An event: a wire frame of type ENG_WIRE_TOKEN, _DONE, _ERROR, _KV_EVENT, _LOAD or _SNAPSHOT.
 * Its
 * strings point into the worker and stay valid until the consumer's next eng_worker_poll /
 * eng_worker_poll_wait call or eng_worker_free. */
typedef eng_wire_frame_t eng_worker_event_t;

/* The worker's identity and sizes, for the TCP handshake (HELLO_ACK) and the router. Strings
 * stay valid until eng_worker_free. */
typedef struct eng_worker_info {
    const char *model_name; /* the GGUF general.name, or the file's base name */
    uint64_t model_fp;      /* XXH3-64 of the whole GGUF file: header, metadata, tensor
                               table and every tensor's data, so other weights of the same
                               shapes give another fingerprint (computed once at init); with
                               a KV dtype other than f16, XXH3-64 of 16 bytes: that hash (u64
                               LE) and the dtype's name ("q8_0") zero-padded, so workers whose cached KV
                               differs never      pass for one another (f16's stays the file's hash) */
    uint32_t n_vocab;
    uint32_t n_ctx;              /* the longest sequence: prompt + generated tokens */
    uint32_t block_tokens;       /* KV block size */
    uint32_t total_blocks;       /* KV pool size */
    uint32_t max_prompt_tokens;  /* the longest prompt that fits the pool and the context */
    const char *backend;         /* the engine backend that runs: "cpu" or "cuda" */
    const char *kv_dtype;        /* the KV cache's element type: "f16", "f32" or "q8_0" */
    uint64_t kv_bytes_per_token; /* K and V of one position, every layer */
    uint64_t kv_capacity_tokens; /* total_blocks x block_tokens: the positions the pool holds */
    const char *backend_note;    /* why backend "auto" runs on the CPU ("cuda unavailable:
                                    <reason>"), or "" (eng_backend_note_of) */
} eng_worker_info_t;

/* Loads the model (params->engine) and its tokenizer from the same GGUF, and starts the
 * scheduler thread. Returns 0, PC_ERR_INVAL (bad parameters), the engine's load errors
 * (PC_ERR_IO, PC_ERR_FORMAT, PC_ERR_UNSUPPORTED), PC_ERR_NOMEM, or PC_ERR_INTERNAL (the
 * thread could not start), with a one-line reason in err. */
int eng_worker_init(const eng_worker_params_t *params, eng_worker_t **out, char *err,
                    size_t err_len);

/* Stops the scheduler thread and releases everything. Requests still queued or running are
 * dropped without further events; events not yet polled are discarded. NULL is a no-op.
 * Without eng_worker_stop first, this waits for the step in progress (up to a whole step of
 * model math): an event loop calls eng_worker_stop and frees the worker once notified. */
void eng_worker_free(eng_worker_t *w);

/* Asks the scheduler thread to stop after the step in progress and returns at once, without
 * waiting for it. From this call on, eng_worker_submit answers PC_ERR_STATE (as do the control
 * operations), and no step starts. on_stopped(ud) (may be NULL) runs once, on the scheduler
 * thread, as the last thing it does: after its last step and its last wake call, with no
 * worker lock held; like wake, it must be cheap and must not block (e.g. uv_async_send). After
 * it ran, eng_worker_free returns without waiting for model math. Events of the last step are
 * still queued and may be polled until eng_worker_free. A second call does nothing (the first
 * call's on_stopped stands); eng_worker_free without this call stops the thread itself. Any
 * thread may call it, but not concurrently with eng_worker_free. */
void eng_worker_stop(eng_worker_t *w, eng_worker_wake_fn on_stopped, void *ud);

void eng_worker_info(const eng_worker_t *w, eng_worker_info_t *out);

/* The worker's tokenizer (built from the model's GGUF); immutable and safe to use from any
 * thread until eng_worker_free. */
const eng_tok_t *eng_worker_tok(const eng_worker_t *w);

/*
 * Queues a request. Everything req points to is copied: the caller may free it on return.
 * Returns 0 (accepted: its events follow, ending with one DONE or ERROR), or refuses it with
 * nothing queued and a one-line reason in err (may be NULL):
 *   PC_ERR_INVAL       request_id 0, no prompt tokens, a token id >= n_vocab, bad sampling
 *                      parameters (eng_sampling_params_check), bad stop sequences
 *                      (eng_stop_init's rules), unknown flags, a retain entry of length 0 or
 *                      longer than the prompt, more than ENG_WIRE_RETAIN_MAX retain entries
 *                      or ENG_WIRE_STOP_IDS_MAX stop ids;
 *   PC_ERR_RANGE       the prompt plus max_tokens exceeds the model's context (n_ctx), or the
 *                      prompt alone needs more KV blocks than the whole pool has (it could
 *                      never run); the reason gives both sizes;
 *   PC_ERR_EXISTS      a request with this id is still live (its final event not yet queued);
 *   PC_ERR_OVERLOADED  max_queue requests are already waiting for admission;
 *   PC_ERR_STATE       the worker is shutting down;
 *   PC_ERR_NOMEM.
 * A request whose prompt fits but whose prompt plus max_tokens outgrows the pool is accepted:
 * it runs, preempting younger requests as needed, and when it is alone and the pool is full it
 * ends with ERROR PC_ERR_NOSPACE (its tokens so far were sent).
 */
int eng_worker_submit(eng_worker_t *w, const eng_wire_submit_t *req, char *err, size_t err_len);

/* Cancels a live request, wherever it is (queued, waiting for a shared prefix, prefilling,
 * decoding): its sequence and blocks are freed at the scheduler's next step and it ends with
 * DONE, stop_reason ENG_WIRE_STOP_CANCELED, text empty (usage counts what was done), unless
 * it finished on its own in the step that was running when the cancel came: then that final
 * event stands. Either way exactly one final event follows. Returns 0, or PC_ERR_NOTFOUND
 * when no live request has this id (unknown, or its final event is already queued). */
int eng_worker_cancel(eng_worker_t *w, uint64_t request_id);

/* Ends the pin of the retained prefix tokens[0..n) of namespace ns early (the gateway's TTL for
 * it ended): at the scheduler's next loop the pin goes and KV_EVENT RELEASED follows; the KV
 * stays cached, unpinned. A prefix that is not pinned then gets no event. tokens is copied.
 * Returns 0 (queued), PC_ERR_INVAL (n 0), PC_ERR_STATE (shutting down) or PC_ERR_NOMEM. */
int eng_worker_release(eng_worker_t *w, uint64_t ns, const uint32_t *tokens, uint32_t n);

/* Drops everything of namespace ns (tenant deleted, salt rotated): at the scheduler's next loop
 * every pin of ns is released (RELEASED each) and every cached prefix of ns removed (EVICTED,
 * reason ENG_EVICT_REMOVED, with its path). Requests of ns still running go on and cache their
 * prompts in ns again when they finish their prefill. Returns 0 (queued), PC_ERR_STATE or
 * PC_ERR_NOMEM. */
int eng_worker_drop_ns(eng_worker_t *w, uint64_t ns);

/* Queues a snapshot of the retained prefixes: one or more SNAPSHOT events with this
 * snapshot_id (the last one with last = 1; none with entries when nothing is pinned), each
 * entry (ns, prefix_fp, ttl_ms left, tokens). It is taken at the scheduler's next loop, in the
 * order of the other events: every KV_EVENT after the last SNAPSHOT applies on top of it.
 * Returns 0 (queued), PC_ERR_STATE or PC_ERR_NOMEM. */
int eng_worker_snapshot(eng_worker_t *w, uint64_t snapshot_id);

/* Moves up to max queued events into ev[0..max) and returns how many; 0 when none. Never
 * blocks on the scheduler's work (the queue lock is held only to move events). The previous
 * poll's event strings become invalid. */
size_t eng_worker_poll(eng_worker_t *w, eng_worker_event_t *ev, size_t max);

/* As eng_worker_poll, but waits up to timeout_ms (negative: without limit) for at least one
 * event. For tests, benchmarks and embedders without an event loop. */
size_t eng_worker_poll_wait(eng_worker_t *w, eng_worker_event_t *ev, size_t max, int timeout_ms);

/* The current load (what a LOAD event carries): requests waiting for admission and their
 * prompt tokens still to prefill (plus those of admitted requests still prefilling), running
 * sequences, free / cached (held only by the prefix index) / total KV blocks. Updated after
 * every scheduler step. */
void eng_worker_load(eng_worker_t *w, eng_wire_load_t *out);

/* KV tiers (params.engine.tier, engine/tier.h). Every accepted request gets one PREFILL event
 * (where its prompt came from at its first admission: pool, G2, G3, recomputed holes) right
 * before its first TOKEN, or before its DONE when it generates nothing. A queued request whose
 * prompt continues into a lower tier waits out of the queue while the engine's I/O thread reads
 * those blocks (eng_tier_prefetch); the scheduler keeps stepping the others, and the request
 * returns to its place in the queue once they are staged. KV_EVENT EVICTED carries the tier
 * the dropped blocks went to (and blocks the disk tier drops come as EVICTED tier 0); LOAD
 * carries the tiers' figures; SNAPSHOT lists, after the pins, the prefixes held only in a
 * lower tier (a restarted worker's disk). The tier directory's parents are created (0700). */

/* Reads the at-rest key of the KV tiers (eng_tier_params.key) from a file: 64 hexadecimal
 * digits (32 bytes; white space around them is ignored), e.g. written by
 * `openssl rand -hex 32 > key && chmod 600 key`. The file must be a regular file that neither
 * group nor others may read or write: a key readable by every local user protects nothing.
 * Returns 0 with key filled, PC_ERR_IO (cannot open or read it) or PC_ERR_INVAL (permissions,
 * size or contents), with a one-line reason naming the file in err; key is left zeroed on
 * failure and the file's bytes are wiped from memory either way. */
int eng_worker_tier_key_read(const char *path, uint8_t key[32], char *err, size_t err_len);

/* Counters since init, for tests and metrics. */
typedef struct eng_worker_stats {
    uint64_t n_steps;          /* scheduler steps run (eng_forward calls that succeeded) */
    uint64_t n_submitted;      /* requests accepted */
    uint64_t n_finished;       /* final events queued */
    uint64_t n_preempted;      /* preemptions (a request may be preempted several times) */
    uint64_t n_prefix_waits;   /* admissions that waited for another request's prefill */
    uint64_t tokens_prefilled; /* prompt tokens computed (recomputation included) */
    uint64_t tokens_reused;    /* prompt tokens taken from the cache at admission */
    uint64_t tokens_generated; /* sampled tokens */
} eng_worker_stats_t;

void eng_worker_stats(eng_worker_t *w, eng_worker_stats_t *out);

#endif
