/*
 * serve.h — `kvgw serve`: the gateway process. Wires the HTTP server (http.h), the API layer
 * (api.h, cacheplan.h), the cache index and router (cindex.h, router.h), the workers (pool.h),
 * billing (billing/) and metrics (metrics.h) together on one libuv loop.
 *
 * A request's life (POST /v1/messages, /v1/chat/completions):
 *   1. on the loop: authenticate (x-api-key or Authorization: Bearer -> tenant);
 *   2. on the thread pool: parse + validate the body, render and tokenize the prompt with the
 *      model's own tokenizer, build the cache plan, hash the namespace;
 *   3. on the loop: match the prompt in the cache index (reads refresh their entries), compute
 *      the usage buckets, pick a worker (estimated time to first token), submit with the plan's
 *      entries to retain; stream tokens back (JSON or SSE);
 *   4. when the worker's DONE arrives: the usage event goes to the ledger, and the response's
 *      final bytes are sent once the event is durable (fsync always|batch).
 * A request the client abandons is cancelled on its worker and billed for what was computed.
 */
#ifndef GW_SERVE_H
#define GW_SERVE_H

#include <stdint.h>

/* The gateway library's entry. `kvgw serve` (cmd/cmd_serve.c) parses the command line into these
 * and calls gw_serve; the gateway itself reads no argv. */
typedef struct gw_serve_params {
    const char *config_path; /* NULL: conf/kvgw.yaml when it exists, else the built-in default */
    const char *listen_host; /* NULL: the config's listen; else overrides it (with listen_port) */
    int listen_port;         /* 0..65535 (0: any free port) */
    /* The in-process workers' model loading (blocking, at startup): (layers done, total) for each
     * worker's load, then (0, 0) once that load finished or failed (the binary draws a line on a
     * terminal and erases it there). NULL: not reported. Called on the calling thread. */
    void (*load_progress)(uint32_t done, uint32_t total, void *ud);
    void *load_progress_ud;
} gw_serve_params_t;

gw_serve_params_t gw_serve_params_default(void);

/* Runs the gateway until SIGINT/SIGTERM (graceful stop: no new requests, in-flight ones finish,
 * the ledger is flushed). Returns the process exit status: 0 after a clean stop, 1 on a failure
 * (a one-line reason on stderr, "kvgw serve: ..."). */
int gw_serve(const gw_serve_params_t *p);

#endif
