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
 * error exactly when json_loadb fails. The exception is running out of memory (the project
 * allocator or a gw_json_budget_t failing an allocation): then it returns NULL with the text
 * "out of memory" at once instead of trying again with jansson. tests/unit/gateway/test_json_fast.c
 * checks it against jansson on generated documents and mutations of them.
 */
#ifndef GW_JSON_FAST_H
#define GW_JSON_FAST_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* As json_loadb. The fast path handles flags made of JSON_ALLOW_NUL and JSON_REJECT_DUPLICATES
 * (the request parser's); other flags go straight to json_loadb. The returned reference is the
 * caller's (json_decref). */
json_t *gw_json_loadb(const char *buf, size_t len, size_t flags, json_error_t *err);

/* As gw_json_loadb, but the values of top-level object keys not in keep[0..n_keep) are not
 * built: they are checked as JSON and the key maps to null in the result (so a duplicate key
 * is still refused). keep NULL = every key is built (gw_json_loadb). A body of 7.5 MB of
 * [{},{},...] in an ignored field costs nothing then, where jansson's tree takes 75 times the
 * body. */
json_t *gw_json_loadb_keep(const char *buf, size_t len, size_t flags, const char *const *keep,
                           size_t n_keep, json_error_t *err);

/* A per-thread allocation budget for JSON work. Between gw_json_budget_begin and
 * gw_json_budget_end on the same thread, every allocation of jansson (any call: loading,
 * building, dumping) and of this file's parser goes through the project hooks and is taken
 * from max_bytes (bytes requested,
 * cumulated: an upper bound of the peak); the first that does not fit fails, and so does every
 * later one: over is set and stays set. oom says the project allocator itself failed. b must
 * stay valid until gw_json_budget_end. Budgets do not nest. */
typedef struct gw_json_budget {
    size_t max_bytes;
    size_t used; /* bytes taken so far */
    bool over;   /* an allocation did not fit */
    bool oom;    /* pc_malloc failed */
} gw_json_budget_t;

void gw_json_budget_begin(gw_json_budget_t *b, size_t max_bytes);
void gw_json_budget_end(gw_json_budget_t *b);

/* Installs this file's allocator in jansson, once per process: the C library's outside a
 * budget, the project hooks (pc_malloc) counted against the budget inside one; pc_free frees. It
 * runs before main in every program that links this file (a constructor), and gw_json_loadb* and
 * gw_json_budget_begin call it again (a no-op then). */
void gw_json_hooks_install(void);

/* The fast path alone (for tests): the tree, or NULL where gw_json_loadb would hand the body
 * to json_loadb. */
json_t *gw__json_fast_only(const char *buf, size_t len, size_t flags);
json_t *gw__json_fast_only_keep(const char *buf, size_t len, size_t flags, const char *const *keep,
                                size_t n_keep);

#endif
