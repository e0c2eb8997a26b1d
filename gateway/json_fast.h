/*
 * json_fast.h — a fast path in front of jansson's json_loadb for request bodies.
 *
 * jansson lexes byte by byte through a stream callback and copies every string twice: a 32 KB
 * system prompt costs it about half a millisecond, which is most of what the gateway adds to a
 * cached request's time to first token. gw_json_loadb parses the common case itself (memchr-
 * speed string scanning, strings without escapes copied once) and builds the very same jansson
 * tree; whenever it meets anything it does not handle, or anything jansson would reject
 * (syntax errors, invalid UTF-8, duplicate keys, numbers out of range, deep nesting, a NUL in
 * a key, allocation failure), it throws its partial work away and returns json_loadb's own
 * result, so every error message and every edge case is jansson's.
 *
 * Contract: for every input, gw_json_loadb(buf, len, flags, err) returns a tree equal to
 * json_loadb(buf, len, flags, err)'s (same types, values, key order), or NULL with the same
 * error exactly when json_loadb fails. tests/unit/gateway/test_json_fast.c checks it against
 * jansson on generated documents and mutations of them.
 */
#ifndef GW_JSON_FAST_H
#define GW_JSON_FAST_H

#include <jansson.h>
#include <stddef.h>

/* As json_loadb. The fast path handles flags made of JSON_ALLOW_NUL and JSON_REJECT_DUPLICATES
 * (the request parser's); other flags go straight to json_loadb. The returned reference is the
 * caller's (json_decref). */
json_t *gw_json_loadb(const char *buf, size_t len, size_t flags, json_error_t *err);

/* The fast path alone (for tests): the tree, or NULL where gw_json_loadb would hand the body
 * to json_loadb. */
json_t *gw__json_fast_only(const char *buf, size_t len, size_t flags);

#endif
