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

/* `kvgw serve [--config FILE] [--listen HOST:PORT]` (declared in cli.h as kvgw_cmd_serve). */
int kvgw_cmd_serve(int argc, char **argv);

#endif
