/*
 * pool.h — the gateway's workers, in-process and remote, behind one interface on the loop.
 *
 * A worker is either an in-process eng_worker (embedded mode: its events come back through
 * uv_async and eng_worker_poll) or a TCP link to a `kvgw worker` process (lnk_worker_client,
 * reconnected with backoff while the pool lives). Both produce the same events (engine/wire.h
 * frames TOKEN, DONE, ERROR, KV_EVENT, LOAD), delivered to on_event on the loop thread with the
 * worker's index. The pool does not track requests: when a remote worker goes down, on_state
 * says so and the caller fails the requests it had routed there.
 *
 * Worker indexes are stable for the pool's life: the workers of model 0 first (in-process,
 * then remote, in config order), then model 1's, and so on; at most 64 in all.
 */
#ifndef GW_POOL_H
#define GW_POOL_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "wire.h"

#define GW_POOL_MAX_WORKERS 64

typedef struct gw_pool gw_pool_t;

typedef struct gw_pool_worker {
    uint32_t index;
    uint32_t model;   /* index into the config's models */
    char name[272];   /* "local-0" or the remote address as configured (a host name or IP) */
    char address[80]; /* remote: the IP:PORT connected to (a name resolved); "" while down */
    /* remote: the worker's own name from its HELLO_ACK (`kvgw worker --name`, default its host
     * name); "" before the first handshake. Kept while it is down (its identity across
     * gateways, gateway/serve.c gw__serve_worker_id). */
    char node[ENG_WIRE_NAME_MAX + 1];
    bool remote;
    bool up;
    eng_wire_load_t load; /* the latest LOAD (or a fresh eng_worker_load) */
    /* remote: the prefill tokens this gateway submitted since that LOAD (gw_pool_submit's
     * estimate), which the LOAD cannot show yet; the worker's own queue (LOAD) covers every
     * gateway's requests. The router adds the two. In-process: 0 (its load is read afresh
     * after each submit). */
    uint64_t submitted_prefill_tokens;
    uint32_t block_tokens, total_blocks, max_prompt_tokens, n_ctx;
    uint64_t model_fp;
    char kv_dtype[8]; /* in-process: the KV dtype ("f16", "f32", "q8_0"); remote: "" (the
                         handshake does not carry it; its model_fp does) */
    /* moving averages measured by the worker (0 until known) */
    double prefill_tok_s, decode_ms_per_token;
    /* Bytes a token's KV takes in the worker's lower tiers (a record's bytes over its block's
     * tokens, from the LOAD figures of a tier holding blocks; 0 until known): what a load from
     * there reads, the router's input with the tiers' load bandwidths (load.g2, load.g3). */
    double kv_bytes_per_token;
    uint64_t down_since_ms;
    char last_error[256];
} gw_pool_worker_t;

typedef struct gw_pool_cbs {
    void (*on_event)(void *ud, uint32_t worker, const eng_wire_frame_t *ev);
    /* up: the worker became usable (remote handshake done); !up: it went away (reason). */
    void (*on_state)(void *ud, uint32_t worker, bool up, const char *reason);
    /* An in-process worker's model load inside gw_pool_init: (layers done, total) as it goes,
     * then (0, 0) once that load finished or failed. NULL: not reported. */
    void (*on_load)(uint32_t done, uint32_t total, void *ud);
    void *on_load_ud;
} gw_pool_cbs_t;

/* Starts every worker of every model in cfg: loads the in-process ones (blocking, at startup;
 * progress through cbs->on_load) and starts connecting to the remote ones. Returns 0, or the first
 * in-process worker's load error with a reason in err. cfg must outlive the pool. */
int gw_pool_init(uv_loop_t *loop, const gw_config_t *cfg, const gw_pool_cbs_t *cbs, void *ud,
                 gw_pool_t **out, char *err, size_t err_len);

size_t gw_pool_n_workers(const gw_pool_t *p);
const gw_pool_worker_t *gw_pool_worker(const gw_pool_t *p, uint32_t i);
/* Whether any worker of the model is up. */
bool gw_pool_model_up(const gw_pool_t *p, uint32_t model);

/* Queues a request on worker i; prefill_tokens is the caller's estimate of the prompt tokens the
 * worker will prefill (the prompt less what it holds), counted in the worker's
 * submitted_prefill_tokens until its next LOAD. Returns 0, or an error with a reason in err
 * (nothing queued, no event will follow): the worker's refusals (eng_worker_submit),
 * PC_ERR_UPSTREAM (down). */
int gw_pool_submit(gw_pool_t *p, uint32_t i, const eng_wire_submit_t *rq, uint32_t prefill_tokens,
                   char *err, size_t err_len);
/* Cancels a request on worker i (its final event still follows). */
int gw_pool_cancel(gw_pool_t *p, uint32_t i, uint64_t request_id);
/* Asks worker i to unpin a retained prefix (the gateway's entry expired) or to drop a whole
 * namespace. Best effort: a down worker has nothing to release. */
int gw_pool_release(gw_pool_t *p, uint32_t i, uint64_t ns, const uint32_t *tokens, uint32_t n);
int gw_pool_drop_ns(gw_pool_t *p, uint32_t i, uint64_t ns);

/* Closes the links and stops the in-process workers; done(ud) runs on the loop once every
 * handle is closed. In-process workers are freed off the loop thread. */
void gw_pool_shutdown(gw_pool_t *p, void (*done)(void *ud), void *ud);
void gw_pool_free(gw_pool_t *p);

#endif
