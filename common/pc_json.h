/*
 * pc_json.h — JSON string literals out.
 *
 * The one escaper every writer of JSON text uses (the API renderers, the chat template's
 * tojson, error bodies, billing exports). Escapes: '"' and '\' with a backslash; \b \f \n \r
 * \t by their short forms; every other byte below 0x20 as \u00XX (lowercase hex). Everything
 * else, DEL and non-ASCII included, is copied (RFC 8259 allows it). With PC_JSON_UTF8 an
 * invalid UTF-8 byte becomes U+FFFD (one per byte), so the output is valid UTF-8 whatever the
 * input; without it the bytes are copied and the caller vouches for them.
 *
 * OOM policy (the one for all of them): a failed append returns PC_ERR_NOMEM with the buffer
 * rolled back to the length it had before the call.
 */
#ifndef PC_JSON_H
#define PC_JSON_H

#include <stddef.h>

#include "pc_buf.h"

enum { PC_JSON_UTF8 = 1u << 0 };

/* Appends s[0..n) to b as a JSON string literal, quotes included. s may be NULL when n is 0.
 * Returns 0 or PC_ERR_NOMEM (b as it was). */
int pc_json_string(pc_buf_t *b, const char *s, size_t n, unsigned flags);

/* pc_json_string of a NUL-terminated string; NULL is written as "". */
int pc_json_cstr(pc_buf_t *b, const char *s, unsigned flags);

#endif
