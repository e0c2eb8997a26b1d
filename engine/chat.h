/*
 * chat.h — the neutral chat request: what the prompt renderer consumes, filled from an Anthropic
 * Messages body or an OpenAI chat-completions body by the two JSON adapters below.
 *
 * Order is the caching order: tools, then system blocks, then messages, each message a list of
 * content blocks. Every tool, system block and content block may carry a cache breakpoint (its
 * TTL); the request may carry a top-level (automatic) one. The cache *plan* (at most four
 * breakpoints, 1h before 5m, minimum lengths) is the gateway's job; this model only records
 * where breakpoints are and with which TTL.
 *
 * Memory: an eng_chat_t and everything it points to live in the pc_arena_t given to the
 * adapter; all of it stays valid until that arena is cleared. Strings are pc_slice_t views into
 * the arena, NUL-terminated (the NUL is not counted), and may contain NUL bytes (JSON "\u0000").
 * Nothing points into the jansson body: it may be released as soon as the adapter returns.
 *
 * Invariants after a successful adapter call:
 *   - n_messages >= 1 and every message but a prefill has n_blocks >= 1;
 *   - tool_use and tool_result blocks appear only where the source API allows them;
 *   - JSON fields (input_schema, tool_use input) hold compact JSON text (no spaces between
 *     tokens, object keys in the client's order) unless input_raw says the client's text is
 *     kept verbatim (OpenAI's arguments string).
 * Images are not part of the model: the text models kvgw serves cannot read them, so both
 * adapters reject image content with "...: image content is not supported by model M".
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

/* Converts an Anthropic Messages request body (a JSON object) into *out, allocated in arena.
 * Follows the API: system is a string or an array of text blocks; content is a string or an
 * array of text / tool_use / tool_result blocks (image blocks are rejected as unsupported);
 * consecutive messages with the same role are merged into one turn; a final assistant
 * message is a prefill (it may not end in whitespace; an empty one is dropped).
 * Returns 0; PC_ERR_INVAL with a message naming the JSON path and the problem in err (e.g.
 * "messages.1.content.0.type: Input tag 'foo' found using 'type' does not match any of the
 * expected tags: 'text', 'image', 'tool_use', 'tool_result'"); PC_ERR_UNSUPPORTED for valid
 * but unsupported input (images, server tools); or PC_ERR_NOMEM. On error *out is untouched
 * and whatever was allocated stays in the arena until it is cleared. */
int eng_chat_from_anthropic_json(const struct json_t *body, pc_arena_t *arena, eng_chat_t **out,
                                 char *err, size_t err_len);

/* Converts an OpenAI chat-completions body: messages with roles system / developer / user /
 * assistant / tool; content a string, null or an array of {"type":"text"} parts; assistant
 * tool_calls (arguments must be a JSON-encoded object, kept verbatim); tools of type
 * "function". A first system/developer message becomes the system blocks; later ones stay in
 * place as SYSTEM messages. Nothing is merged and there is no prefill. Errors and ownership
 * as eng_chat_from_anthropic_json. */
int eng_chat_from_openai_json(const struct json_t *body, pc_arena_t *arena, eng_chat_t **out,
                              char *err, size_t err_len);

/* The number of content blocks in all messages (for sizing per-block tables). */
size_t eng_chat_n_blocks(const eng_chat_t *c);

/* "5m", "1h" or "none". */
const char *eng_chat_ttl_name(eng_chat_ttl_t ttl);

#endif
