/*
 * chat.h — the neutral chat request: what the prompt renderer consumes, filled from an Anthropic
 * Messages body or an OpenAI chat-completions body by the gateway's JSON adapters
 * (gateway/api.h, gw_api_parse). The engine knows no API field names and no API error texts.
 *
 * Order is the caching order: tools, then system blocks, then messages, each message a list of
 * content blocks. Every tool, system block and content block may carry a cache breakpoint (its
 * TTL); the request may carry a top-level (automatic) one. The cache *plan* (at most four
 * breakpoints, 1h before 5m, minimum lengths) is the gateway's job; this model only records
 * where breakpoints are and with which TTL.
 *
 * Memory: an eng_chat_t and everything it points to live in the pc_arena_t its producer
 * (the gateway's adapter) allocated it in; all of it stays valid until that arena is cleared.
 * Strings are pc_slice_t views into the arena, NUL-terminated (the NUL is not counted), and may
 * contain NUL bytes (JSON "\u0000"). Nothing points into the jansson body: it may be released as
 * soon as the adapter returns.
 *
 * Invariants after a successful adapter call:
 *   - n_messages >= 1 and every message but a prefill has n_blocks >= 1;
 *   - tool_use and tool_result blocks appear only where the source API allows them;
 *   - JSON fields (input_schema, tool_use input) hold compact JSON text (no spaces between
 *     tokens, object keys in the client's order) unless input_raw says the client's text is
 *     kept verbatim (OpenAI's arguments string).
 * Images are not part of the model: the text models kvgw serves cannot read them (the
 * gateway's adapters reject image content as unsupported).
 */
#ifndef ENG_CHAT_H
#define ENG_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pc_arena.h"
#include "pc_buf.h"

struct json_t; /* <jansson.h> */

/* A cache breakpoint's TTL; NONE = the element carries no breakpoint. */
typedef enum eng_chat_ttl {
    ENG_CHAT_TTL_NONE = 0,
    ENG_CHAT_TTL_5M = 1,
    ENG_CHAT_TTL_1H = 2,
} eng_chat_ttl_t;

/* Which API a request came from (affects nothing in rendering; the gateway reports usage in
 * the matching shape). */
typedef enum eng_chat_api {
    ENG_CHAT_API_ANTHROPIC = 0,
    ENG_CHAT_API_OPENAI = 1,
} eng_chat_api_t;

typedef enum eng_chat_role {
    ENG_CHAT_ROLE_USER = 0,
    ENG_CHAT_ROLE_ASSISTANT = 1,
    ENG_CHAT_ROLE_SYSTEM = 2, /* OpenAI system/developer message after the first message */
    ENG_CHAT_ROLE_TOOL = 3,   /* OpenAI tool message: exactly one TOOL_RESULT block */
} eng_chat_role_t;

typedef enum eng_chat_block_kind {
    ENG_CHAT_BLOCK_TEXT = 0,
    ENG_CHAT_BLOCK_TOOL_USE = 1,
    ENG_CHAT_BLOCK_TOOL_RESULT = 2,
} eng_chat_block_kind_t;

typedef struct eng_chat_block {
    eng_chat_block_kind_t kind;
    eng_chat_ttl_t cache_ttl;
    pc_slice_t text;  /* TEXT: the text. TOOL_RESULT: the result (text parts joined by "\n") */
    pc_slice_t id;    /* TOOL_USE: the call id. TOOL_RESULT: the tool_use_id it answers */
    pc_slice_t name;  /* TOOL_USE: the tool name */
    pc_slice_t input; /* TOOL_USE: the arguments as JSON text (see input_raw) */
    bool input_raw;   /* TOOL_USE: input is the client's own text, rendered verbatim */
    bool is_error;    /* TOOL_RESULT: the client flagged the result as an error */
    uint32_t src_msg, src_block; /* where the block was in the request (before merging) */
} eng_chat_block_t;

typedef struct eng_chat_msg {
    eng_chat_role_t role;
    eng_chat_block_t *blocks; /* [n_blocks] */
    size_t n_blocks;
} eng_chat_msg_t;

typedef struct eng_chat_tool {
    pc_slice_t name;
    pc_slice_t description; /* len 0 and has_description false when absent */
    bool has_description;
    pc_slice_t input_schema; /* compact JSON object text; len 0 when the client gave none */
    eng_chat_ttl_t cache_ttl;
} eng_chat_tool_t;

typedef struct eng_chat {
    eng_chat_api_t api;
    pc_slice_t model;       /* the request's "model" */
    eng_chat_tool_t *tools; /* [n_tools] */
    size_t n_tools;
    eng_chat_block_t *system; /* [n_system], all TEXT */
    size_t n_system;
    eng_chat_msg_t *messages; /* [n_messages] */
    size_t n_messages;
    /* The last message is an assistant turn the model continues (Anthropic prefill): it is
     * rendered without an end-of-turn and no generation prompt follows it. */
    bool prefill;
    eng_chat_ttl_t auto_cache_ttl; /* top-level cache_control (automatic caching) */
} eng_chat_t;

/* Appends the canonical compact JSON text of v to b: no spaces, object keys in their order,
 * strings escaped as Python's json.dumps(ensure_ascii=False) does, reals in Python's shortest
 * round-trip repr. This is the form the adapters store in input_schema and tool_use input.
 * Returns 0, PC_ERR_RANGE (nested deeper than 512 levels) or PC_ERR_NOMEM (b may then hold a
 * partial write). */
int eng_chat_json_compact(pc_buf_t *b, const struct json_t *v);

/* The number of content blocks in all messages (for sizing per-block tables). */
size_t eng_chat_n_blocks(const eng_chat_t *c);

/* "5m", "1h" or "none". */
const char *eng_chat_ttl_name(eng_chat_ttl_t ttl);

#endif
