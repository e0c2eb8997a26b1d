/*
 * api_internal.h — helpers shared by the API layer's files (api_chat.c, api_parse.c,
 * api_render.c) and their tests; not for the endpoint glue.
 */
#ifndef GW_API_INTERNAL_H
#define GW_API_INTERNAL_H

#include "api.h"

#include <stdbool.h>
#include <stdint.h>

struct json_t; /* <jansson.h> */

/* Work done on this thread by parse -> validate -> plan, for the linearity tests: every step
 * that visits one element (a message, a content block, a tool, a system block) adds 1. A
 * request of n elements must cost O(n) of it (tests/unit/gateway/test_api.c builds 160k
 * messages). Per thread, never reset by the library. */
extern _Thread_local uint64_t gw__work;

/* The chat adapters: a parsed body (a JSON object) into *out, allocated in arena.
 *
 * Anthropic: system is a string or an array of text blocks; content a string or an array of
 * text / tool_use / tool_result blocks (image and document blocks are rejected as unsupported);
 * consecutive messages with the same role merge into one turn; a final assistant message is a
 * prefill (it may not end in whitespace; an empty one is dropped); cache_control is parsed on
 * tools, system blocks, content blocks and the top level (type and ttl checked; an empty text
 * block with cache_control gets Anthropic's "...text: cache_control cannot be set for empty
 * text blocks"). Counting and ordering rules are gw_api_parse's.
 *
 * OpenAI: roles system / developer / user / assistant / tool; content a string, null or an
 * array of text (or refusal) parts; assistant tool_calls (arguments must be a JSON-encoded
 * object, kept verbatim); tools of type "function". A first system/developer message becomes
 * the system blocks; later ones stay in place as SYSTEM messages. Nothing merges; no prefill.
 *
 * Return 0; PC_ERR_INVAL with the reason in err ("<json path>: <problem>", e.g.
 * "messages.1.content.0.type: Input tag 'foo' found using 'type' does not match any of the
 * expected tags: 'text', 'image', 'tool_use', 'tool_result'"); PC_ERR_UNSUPPORTED for valid but
 * unsupported input; or PC_ERR_NOMEM. On error *out is untouched. */
int gw__chat_from_anthropic(const struct json_t *body, pc_arena_t *arena, eng_chat_t **out,
                            char *err, size_t err_len);
int gw__chat_from_openai(const struct json_t *body, pc_arena_t *arena, eng_chat_t **out, char *err,
                         size_t err_len);

/* OpenAI's way of writing a path: "messages.0.content.1" -> "messages[0].content[1]" (the
 * part of msg before ": ", when msg starts with a path). Writes "" when msg names no path. */
void gw__openai_param(const char *msg, char *param, size_t param_len);

/* The name of v's JSON type in error messages ("an object", "a string", "null"...). Numbers
 * are "a number", or with oai OpenAI's "an integer" / "a decimal" ("expected a boolean, but
 * got a string instead"). A static string. */
const char *gw__json_type_name(const struct json_t *v, bool oai);

#endif
