/*
 * request.h — the request object of `kvgw serve`: one API request from its first byte to its
 * last, with every byte it needs.
 *
 * Ownership. A request owns its body (copied out of the HTTP request before any work is queued)
 * and everything derived from it (its arena: the parsed request, the rendered tokens, the cache
 * plan). Work on the thread pool (prepare: parse, namespace, render, plan) reads only the
 * request and the gateway's read-only configuration and models: never the connection, which a
 * client may close at any time (on_abort then clears q->http; the request lives on until the
 * pool hands it back). q->http is touched on the loop thread only.
 *
 * States (q->state; gw__req_set_state asserts each transition's from-state):
 *
 *      NEW ──────── simple endpoint, auth error, refused ─────────────────────────┐
 *       │ \                                                                        │
 *       │  └── admin export ──► EXPORTING ── export done / client gone ──────────►│
 *       │ body copied, prepare queued                                              │
 *       ▼                                                                          │
 *   PREPARING (thread pool) ── bad request, count_tokens, client gone, ───────────►│
 *       │  \                   no price, no ledger, no worker, too long            │
 *       │   └─ registry, the plan writes what the replica lacks: routed,           │
 *       │      claim sent ──► CLAIMING ── client gone: claim cancelled ───────────►│
 *       │                        │        (a claim granted later is released)      │
 *       │ routed, submitted      │ answer, deadline or error: decided, routed      │
 *       │ (live map, wire id)    │ (to the claimant's worker), submitted;          │
 *       │                        │ submit refused: answered ──────────────────────►│
 *       ▼                        │                                                 │
 *    RUNNING ◄───────────────────┘                                                 ▼
 *       ├─ worker down before the first token: resubmitted (RUNNING)             DONE
 *       ├─ DONE / ERROR / down: billed; client gone or not billed ─────────────►  ▲
 *       │ billed, final bytes held                                                 │
 *       ▼                                                                          │
 *    DURABLE ── the ledger made its usage event durable (or failed: error) ───────┘
 *
 * DONE is the request freed (gw__req_free); nothing refers to it afterwards.
 *
 * With a registry (gateway/registry.h; docs/ARCHITECTURE.md, "Many gateways, one cache") the
 * billing decision is made once, before the submit: from the local replica alone when the plan
 * writes nothing it does not already hold (no Redis on the path; its reads are refreshed in Redis
 * fire-and-forget), else after the claim (CLAIMING: LIVE points are inserted into the replica and
 * read, points claimed by another request are read and the request goes to that request's worker
 * when this gateway has it, our own claims are committed at the first token or released when the
 * request fails before it). The decision is kept through a resubmission. Its usage event says
 * registry: shared (Redis answered, or was up and not needed) or local (Redis down, or past
 * registry.timeout: this gateway's view alone).
 *
 * Per-API behaviour (Anthropic messages, count_tokens, OpenAI chat completions) is a table of
 * operations (gw_req_ops_t), chosen once by the path; every result of its renderers is checked.
 */
#ifndef GW_REQUEST_H
#define GW_REQUEST_H

#include <stdbool.h>
#include <stdint.h>

#include "api.h"
#include "cacheplan.h"
#include "serve_internal.h"

typedef enum gw_req_state {
    GW_REQ_NEW = 0,
    GW_REQ_PREPARING,
    GW_REQ_RUNNING,
    GW_REQ_DURABLE,
    GW_REQ_EXPORTING,
    GW_REQ_DONE,
    GW_REQ_CLAIMING, /* waiting for the registry's claim (q->claim) */
} gw_req_state_t;

/* What differs between the APIs. The stream functions append complete events to b and return 0
 * or a negative PC_ERR_*; pre selects the stream state saved before the finish events (so a
 * failure of durability can still end the stream with an error). */
typedef struct gw_req_ops {
    gw_api_kind_t kind;
    const char *endpoint;    /* metrics / access log label */
    gw_api_kind_t err_kind;  /* the shape of its error bodies */
    const char *resp_prefix; /* response id prefix; NULL: no generation (count_tokens) */
    int (*sse_start)(gw_req_t *q, const gw_api_resp_t *r, pc_buf_t *b);
    int (*sse_text)(gw_req_t *q, const gw_api_resp_t *r, const char *text, size_t len, pc_buf_t *b);
    int (*sse_finish)(gw_req_t *q, const gw_api_resp_t *r, pc_buf_t *b);
    int (*sse_error)(gw_req_t *q, bool pre, const gw_api_error_t *e, pc_buf_t *b);
    int (*render)(const gw_api_resp_t *r, pc_buf_t *b); /* the whole (non-streamed) response */
} gw_req_ops_t;

struct gw_req {
    serve_t *s;
    gw_http_req_t *http; /* NULL once the response ended or the client is gone; loop only */
    pc_arena_t arena;
    gw_api_kind_t kind;
    const gw_req_ops_t *ops; /* API requests only */
    gw_req_state_t state;
    char id[48];      /* request-id header and ledger request id: "req_<hex>" */
    char resp_id[48]; /* "msg_<hex>" / "chatcmpl-<hex>" */
    const gw_cfg_key_t *key;
    uint64_t t0_ms;       /* monotonic, the request's first byte */
    uint64_t wall0_ms;    /* wall clock at arrival */
    const char *endpoint; /* the metrics/log label: messages, count_tokens, chat_completions,
                             models, health, metrics, dashboard, admin_usage, other */
    /* prepare (thread pool): reads body and key, writes the fields below */
    pc_slice_t body; /* owned copy (pc_malloc), kept until the request is freed */
    uv_work_t work;
    int prep_rc;
    gw_api_error_t err;
    gw_api_req_t *api;
    gw_model_rt_t *model;
    eng_render_out_t r;
    gw_cacheplan_t plan;
    uint64_t ns;
    /* routing and the worker */
    bool routed; /* a worker was chosen (kvgw-worker header) */
    uint32_t worker;
    uint64_t wire_id;
    uint32_t read_tokens;       /* logical hit (A) */
    uint32_t path_tokens;       /* longest prefix found in the index (live or not) */
    uint32_t phys_tokens;       /* what the chosen worker was believed to hold (any tier) */
    bool has_prefill;           /* the worker's PREFILL arrived: prefill says where the */
    eng_wire_prefill_t prefill; /* prompt's KV came from (the kvgw-cache header's tiers) */
    gw_usage_t usage;
    bool decided;            /* usage and read_tokens are final (kept on a resubmission) */
    uint8_t registry;        /* enum bill_registry: none, shared or local */
    gw_registry_op_t *claim; /* CLAIMING: the claim in flight */
    uint64_t fence;          /* our claims' fencing value (0: we hold none) */
    uint32_t n_mine;         /* of the plan's breakpoints, those we claimed: mine[0..n) */
    gw_registry_point_t mine[GW_CACHEPLAN_MAX_BPS];
    bool entries_inserted;
    uint32_t n_tokens_out;
    uint32_t tokens_reused;   /* the worker's physical hit (DONE) */
    uint64_t t_first_ms;      /* first token (monotonic) */
    uint64_t worker_ttft_us;  /* the worker's own queue + prefill time (DONE timings) */
    uint64_t worker_total_us; /* queue + prefill + decode */
    /* output */
    bool streaming_started;
    bool out_failed;             /* output could not be kept or sent: the answer is truncated */
    uint32_t n_tokens_delivered; /* with out_failed: the output tokens that reached the client */
    gw_anthropic_sse_t asse;
    gw_openai_sse_t osse;
    gw_anthropic_sse_t asse_pre; /* the streams' states before their finish events, so an */
    gw_openai_sse_t osse_pre;    /* error can still replace them (fail_undurable) */
    pc_buf_t text;               /* whole output (non-streaming) */
    pc_buf_t pending;            /* SSE bytes held back while the client does not read */
    gw_stop_reason_t stop;
    pc_slice_t stop_seq;
    uint64_t ledger_seq;
    pc_buf_t final; /* bytes sent once the usage event is durable */
    bool final_is_stream;
    int final_status;
    bool has_outcome;
    int outcome; /* gw_outcome_t, with has_outcome */
    char cache_hdr[320];
    bool counted;                    /* its metrics and access log line are written */
    bool client_gone;                /* the client left before the response ended (499) */
    void *job;                       /* GET /admin/v1/usage: its export job */
    gw_req_t *next_live, *prev_live; /* the live list (RUNNING) */
    gw_req_t *next_durable;          /* FIFO of requests waiting for the ledger (DURABLE) */
};

/* A new request for the HTTP request r (state NEW; kind from the path). NULL on OOM. */
gw_req_t *gw__req_new(serve_t *s, gw_http_req_t *r);

/* Moves q to state to; aborts (PC_ASSERT) on a transition the diagram above does not have. */
void gw__req_set_state(gw_req_t *q, gw_req_state_t to);

/* Starts an API request (POST /v1/messages, count_tokens, chat/completions) whose key was
 * checked (q->key set): copies the body and queues the prepare work. q is then owned by the
 * request path (the caller must not free it). */
void gw__req_start_api(gw_req_t *q);

/* Ends q (state DONE): writes its 499 line if the client left, frees it. */
void gw__req_free(gw_req_t *q);

/* Responses; each ends the HTTP side of q (a no-op when the client is gone). q stays alive. */
void gw__req_respond(gw_req_t *q, int status, const char *ctype, const void *body, size_t len);
void gw__req_respond_error(gw_req_t *q, const gw_api_error_t *e);
void gw__req_respond_errorf(gw_req_t *q, int status, const char *fmt, const char *arg);

/* The loop's callbacks: the ledger made records durable, the pool's events and state. */
void gw__req_on_ledger_wake(uv_async_t *a);
void gw__req_pool_event(void *ud, uint32_t worker, const eng_wire_frame_t *ev);
void gw__req_pool_state(void *ud, uint32_t worker, bool up, const char *reason);

/* Requests running on a worker (the in-flight gauge). */
static inline size_t gw__req_n_live(const serve_t *s)
{
    return pc_u64map_count(&s->live_map);
}

#endif
