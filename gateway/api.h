/*
 * api.h — the Anthropic and OpenAI API layer of the gateway: request bodies in, validated
 * requests out; responses, SSE streams and error bodies in each API's exact wire shape.
 *
 * Everything here is pure: no I/O, no clock (the caller passes ids and timestamps), no global
 * state. The HTTP endpoints (the lead's glue) call, per request:
 *
 *   gw_api_parse(kind, body, len, &req->arena, &r, &err)       -> 400 body via gw_api_error_render
 *   render + tokenize r->chat (engine/render.h), gw_cacheplan_build (cacheplan.h)
 *   usage: gw_usage_compute; then one of
 *     gw_anthropic_message_render / gw_anthropic_sse_* / gw_anthropic_count_tokens_render
 *     gw_openai_completion_render / gw_openai_sse_*
 *
 * Errors. Status codes, error types and message texts follow the real APIs (reference:
 * ../shared/reference/api-spec.md). Where the real text is known it is reproduced exactly:
 *   - Anthropic malformed JSON: "The request body is not valid JSON: <reason>: line L column C
 *     (char N)"; OpenAI: "We could not parse the JSON body of your request. (HINT: ...)".
 *   - "A maximum of 4 blocks with cache_control may be provided. Found 5."
 *   - "messages.N.content.M.text: cache_control cannot be set for empty text blocks".
 * Elsewhere the message names the JSON path first, Pydantic style, as the Anthropic API does
 * ("messages.0.content: Field required", "temperature: Input should be less than or equal to
 * 1"). OpenAI errors carry the same message with OpenAI wording where OpenAI's is known
 * ("Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 3
 * instead.") and the offending parameter in param, written OpenAI's way ("messages[0].role").
 * Paths always use the client's own indices (before consecutive same-role Anthropic messages
 * are merged).
 *
 * Unknown top-level keys are ignored (clients send newer fields), as are unknown keys inside
 * known objects; unknown values of known enum fields (roles, block types, tool_choice types)
 * are errors.
 *
 * kvgw extension: "cache_salt" (both APIs), an optional string of 1 to 256 bytes without control
 * characters. Requests with different salts never share cache entries (the gateway mixes the
 * salt into the namespace hash, together with the tenant and the model); the salt never reaches
 * a worker. Absent = the tenant's shared namespace.
 *
 * Memory: a parsed gw_api_req_t and everything it points to live in the arena given to
 * gw_api_parse and stay valid until it is cleared; nothing points into the body bytes.
 */
#ifndef GW_API_H
#define GW_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chat.h"
#include "pc_arena.h"
#include "pc_buf.h"
#include "sampling.h"

typedef enum gw_api_kind {
    GW_API_ANTHROPIC_MESSAGES = 0,     /* POST /v1/messages */
    GW_API_ANTHROPIC_COUNT_TOKENS = 1, /* POST /v1/messages/count_tokens */
    GW_API_OPENAI_CHAT = 2,            /* POST /v1/chat/completions */
} gw_api_kind_t;

/* True for the two Anthropic kinds. */
static inline bool gw_api_is_anthropic(gw_api_kind_t k)
{
    return k != GW_API_OPENAI_CHAT;
}

/* Limits enforced by gw_api_parse (the worker protocol enforces the stop limits too). */
#define GW_API_MAX_STOP 16         /* Anthropic stop_sequences; OpenAI allows 4 */
#define GW_API_MAX_STOP_BYTES 1024 /* per stop sequence */
#define GW_API_MAX_BREAKPOINTS 4
#define GW_API_MAX_SALT_BYTES 256

/* The memory the JSON of a body may cost while gw_api_parse runs (jansson's tree of the fields
 * kvgw reads, the tool-call arguments it decodes, the parser's scratch): at most
 * GW_API_JSON_MEM_PER_BYTE bytes per body byte plus GW_API_JSON_MEM_BASE. The values of
 * top-level fields kvgw ignores are not built at all (they cost nothing). A body over it gets
 * 413 (Anthropic request_too_large; OpenAI invalid_request_error). The factor leaves room for the
 * densest real request: a message list of one-character messages costs about 11 bytes of
 * jansson tree per body byte; a body of 7.5 MB of [{},{},...] inside a read field would cost 75. */
#define GW_API_JSON_MEM_PER_BYTE 16
#define GW_API_JSON_MEM_BASE (1u << 20)

/* An error in the API's own shape. status is the HTTP status; type the API's error type
 * (Anthropic: invalid_request_error, authentication_error, permission_error, not_found_error,
 * request_too_large, rate_limit_error, api_error, overloaded_error, timeout_error; OpenAI:
 * invalid_request_error, server_error, rate_limit_error, see gw_api_error_type); message the
 * text, NUL-terminated. OpenAI only: param (the parameter at fault; "" = null) and code (NULL =
 * null; e.g. "invalid_type", "missing_required_parameter", "invalid_value"). */
typedef struct gw_api_error {
    int status;
    const char *type; /* static string */
    char message[512];
    char param[128];  /* OpenAI; "" = null */
    const char *code; /* OpenAI; static string or NULL */
} gw_api_error_t;

/* The error type the API uses for an HTTP status: Anthropic 400 invalid_request_error, 401
 * authentication_error, 402 billing_error, 403 permission_error, 404 not_found_error, 408/504
 * timeout_error, 413 request_too_large, 429 rate_limit_error, 529/503 overloaded_error, other 5xx
 * api_error, other 4xx invalid_request_error. OpenAI: 429 rate_limit_error, 5xx server_error,
 * every 4xx invalid_request_error (as OpenAI does, e.g. for a bad API key). Never NULL. */
const char *gw_api_error_type(gw_api_kind_t kind, int status);

/* Fills *e: status, the matching type, the formatted message (truncated to fit), param ""
 * and code NULL. For the endpoint glue's own errors (401, 404, 413, 429, 529, ...). */
void gw_api_error_set(gw_api_error_t *e, gw_api_kind_t kind, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* Appends the error body: Anthropic {"type":"error","error":{"type":T,"message":M},
 * "request_id":R} (request_id left out when NULL); OpenAI {"error":{"message":M,"type":T,
 * "param":P|null,"code":C|null}}. Returns 0 or PC_ERR_NOMEM. */
int gw_api_error_render(gw_api_kind_t kind, const gw_api_error_t *e, const char *request_id,
                        pc_buf_t *b);

typedef enum gw_tool_choice {
    GW_TOOL_CHOICE_DEFAULT = 0, /* absent: auto when tools are given */
    GW_TOOL_CHOICE_AUTO = 1,
    GW_TOOL_CHOICE_ANY = 2,  /* Anthropic "any", OpenAI "required" */
    GW_TOOL_CHOICE_TOOL = 3, /* a named tool (tool_choice_name) */
    GW_TOOL_CHOICE_NONE = 4,
} gw_tool_choice_t;

/* A validated request. Fields a request did not give hold the API's default (has_* says
 * whether the client gave them). */
typedef struct gw_api_req {
    gw_api_kind_t kind;
    eng_chat_t *chat; /* tools, system, messages with per-element cache TTLs; see chat.h */
    pc_slice_t model; /* == chat->model */

    /* Anthropic: required for MESSAGES (0 = cache pre-warm: no output, content [], stop_reason
     * max_tokens), ignored for COUNT_TOKENS. OpenAI: max_completion_tokens, else max_tokens
     * (>= 1); has_max_tokens false = up to the model's context. */
    uint32_t max_tokens;
    bool has_max_tokens;
    bool stream;
    bool include_usage; /* OpenAI stream_options.include_usage */

    /* Sampling, ready for the engine (eng_sampling_params_check passes). Defaults: temperature
     * 1, top_p 1, top_k 0. seed: OpenAI "seed" (has_seed); otherwise the caller picks one. */
    eng_sampling_params_t sampling;
    bool has_temperature, has_top_p, has_top_k, has_seed;

    pc_slice_t *stop; /* [n_stop] Anthropic stop_sequences / OpenAI stop; non-empty, valid UTF-8 */
    size_t n_stop;

    gw_tool_choice_t tool_choice;
    pc_slice_t tool_choice_name;    /* GW_TOOL_CHOICE_TOOL: the tool's name (one of chat->tools) */
    bool disable_parallel_tool_use; /* Anthropic tool_choice.disable_parallel_tool_use; OpenAI
                                       parallel_tool_calls: false */

    pc_slice_t user_id;          /* Anthropic metadata.user_id, OpenAI user; len 0 = absent */
    pc_slice_t prompt_cache_key; /* OpenAI prompt_cache_key; len 0 = absent (routing hint) */
    pc_slice_t cache_salt;       /* kvgw "cache_salt"; has_cache_salt says whether given */
    bool has_cache_salt;
} gw_api_req_t;

/* Parses and validates a request body of the given kind into *out (allocated in arena).
 *
 * Checks, in order: the bytes are JSON (jansson; invalid UTF-8 is a JSON error) and an object;
 * the chat (model, messages, system, tools: gateway/api_chat.c); the request fields (max_tokens,
 * stream, temperature, top_p, top_k, stop, tool_choice, metadata, OpenAI n / stream_options /
 * seed / user / prompt_cache_key, cache_salt); for Anthropic the cache_control rules: at most
 * 4 breakpoints counting the automatic one (unless it falls on a block that already has the
 * same TTL), none on empty text blocks, 1h breakpoints before 5m ones in tools -> system ->
 * messages order, and an automatic TTL that agrees with an explicit breakpoint on the block it
 * lands on (the last block; every block kvgw accepts is cacheable).
 *
 * Returns 0; PC_ERR_INVAL (a 400, *err filled); PC_ERR_NOSPACE (a 413: the body's JSON needs
 * more memory than GW_API_JSON_MEM_PER_BYTE allows, *err filled); PC_ERR_UNSUPPORTED (valid for the
 * API but not served by kvgw: images, server tools, n > 1; a 400 too, *err filled); PC_ERR_NOMEM
 * (*err set to a 500 api_error / server_error). On error *out is untouched; what was allocated
 * stays in the arena until it is cleared. */
int gw_api_parse(gw_api_kind_t kind, const void *body, size_t len, pc_arena_t *arena,
                 gw_api_req_t **out, gw_api_error_t *err);

/* ---- usage ------------------------------------------------------------------------------ */

/* The four disjoint prompt buckets (they sum to the prompt's tokens) and the output. */
typedef struct gw_usage {
    uint32_t input_tokens;   /* uncached: after the cached and written part */
    uint32_t cache_read;     /* cache_read_input_tokens */
    uint32_t cache_write_5m; /* cache_creation.ephemeral_5m_input_tokens */
    uint32_t cache_write_1h; /* cache_creation.ephemeral_1h_input_tokens */
    uint32_t output_tokens;
} gw_usage_t;

/* input + read + write_5m + write_1h: the prompt's tokens (OpenAI prompt_tokens). */
static inline uint32_t gw_usage_prompt_tokens(const gw_usage_t *u)
{
    return u->input_tokens + u->cache_read + u->cache_write_5m + u->cache_write_1h;
}

/* ---- responses ---------------------------------------------------------------------------- */

typedef enum gw_stop_reason {
    GW_STOP_END_TURN = 0,      /* Anthropic end_turn, OpenAI stop */
    GW_STOP_MAX_TOKENS = 1,    /* Anthropic max_tokens, OpenAI length */
    GW_STOP_STOP_SEQUENCE = 2, /* Anthropic stop_sequence, OpenAI stop */
} gw_stop_reason_t;

/* "end_turn", "max_tokens", "stop_sequence" / OpenAI "stop", "length". */
const char *gw_stop_reason_name(gw_api_kind_t kind, gw_stop_reason_t r);

/* What a finished (or starting) response says about itself. Strings are borrowed for the call. */
typedef struct gw_api_resp {
    const char *id;   /* "msg_..." (Anthropic) / "chatcmpl-..." (OpenAI), made by the caller */
    pc_slice_t model; /* echoed as the client sent it */
    int64_t created;  /* OpenAI: Unix seconds */
    pc_slice_t text;  /* the whole output text (non-streaming renders) */
    gw_stop_reason_t stop_reason;
    pc_slice_t stop_sequence; /* GW_STOP_STOP_SEQUENCE: the sequence that matched */
    gw_usage_t usage;
    bool prewarm; /* Anthropic max_tokens 0: content [] */
} gw_api_resp_t;

/* Anthropic non-streaming Message:
 * {"id","type":"message","role":"assistant","model","content":[{"type":"text","text"}],
 *  "stop_reason","stop_sequence","usage":{"input_tokens","cache_creation_input_tokens",
 *  "cache_read_input_tokens","cache_creation":{"ephemeral_5m_input_tokens",
 *  "ephemeral_1h_input_tokens"},"output_tokens","service_tier":"standard"}}.
 * content is [] for a pre-warm. Returns 0 or PC_ERR_NOMEM. */
int gw_anthropic_message_render(const gw_api_resp_t *r, pc_buf_t *b);

/* {"input_tokens":N}. Returns 0 or PC_ERR_NOMEM. */
int gw_anthropic_count_tokens_render(uint32_t input_tokens, pc_buf_t *b);

/* The Anthropic SSE stream as a state machine. Each call appends complete events
 * ("event: T\ndata: JSON\n\n") to b and returns 0, PC_ERR_NOMEM (nothing appended) or
 * PC_ERR_STATE (called out of order; nothing appended):
 *   start  -> message_start (usage: the prompt buckets, output_tokens 1, as the API does),
 *             content_block_start (index 0, empty text), ping
 *   text   -> content_block_delta text_delta (empty text appends nothing)
 *   ping   -> ping (any time after start and before finish)
 *   finish -> content_block_stop, message_delta (stop_reason, stop_sequence, cumulative usage:
 *             input_tokens, cache_creation_input_tokens, cache_read_input_tokens,
 *             output_tokens; no cache_creation breakdown, like the API), message_stop
 *   error  -> event: error {"type":"error","error":{"type","message"}}; any time after start
 *             (a failure after the 200); the stream is over afterwards. */
typedef struct gw_anthropic_sse {
    int state; /* internal */
} gw_anthropic_sse_t;

void gw_anthropic_sse_init(gw_anthropic_sse_t *s);
int gw_anthropic_sse_start(gw_anthropic_sse_t *s, const gw_api_resp_t *r, pc_buf_t *b);
int gw_anthropic_sse_text(gw_anthropic_sse_t *s, const char *text, size_t len, pc_buf_t *b);
int gw_anthropic_sse_ping(gw_anthropic_sse_t *s, pc_buf_t *b);
int gw_anthropic_sse_finish(gw_anthropic_sse_t *s, const gw_api_resp_t *r, pc_buf_t *b);
int gw_anthropic_sse_error(gw_anthropic_sse_t *s, const gw_api_error_t *e, pc_buf_t *b);

/* OpenAI chat.completion: {"id","object":"chat.completion","created","model",
 * "choices":[{"index":0,"message":{"role":"assistant","content","refusal":null},
 * "logprobs":null,"finish_reason"}],"usage":{"prompt_tokens" (cached included),
 * "completion_tokens","total_tokens","prompt_tokens_details":{"cached_tokens","audio_tokens":0},
 * "completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,
 * "accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"system_fingerprint":null}.
 * Returns 0 or PC_ERR_NOMEM. */
int gw_openai_completion_render(const gw_api_resp_t *r, pc_buf_t *b);

/* The OpenAI chunk stream ("data: JSON\n\n" frames), same calling rules as the Anthropic one:
 *   start  -> chunk with delta {"role":"assistant","content":""}
 *   text   -> chunk with delta {"content":T}
 *   finish -> chunk with delta {} and finish_reason; with include_usage a chunk with
 *             "choices":[] and the usage; then "data: [DONE]"
 *   error  -> data: {"error":{...}} (a failure after the 200); the stream is over.
 * With include_usage every other chunk carries "usage":null, as the API does. */
typedef struct gw_openai_sse {
    int state; /* internal */
    bool include_usage;
} gw_openai_sse_t;

void gw_openai_sse_init(gw_openai_sse_t *s, bool include_usage);
int gw_openai_sse_start(gw_openai_sse_t *s, const gw_api_resp_t *r, pc_buf_t *b);
int gw_openai_sse_text(gw_openai_sse_t *s, const gw_api_resp_t *r, const char *text, size_t len,
                       pc_buf_t *b);
int gw_openai_sse_finish(gw_openai_sse_t *s, const gw_api_resp_t *r, pc_buf_t *b);
int gw_openai_sse_error(gw_openai_sse_t *s, const gw_api_error_t *e, pc_buf_t *b);

#endif
