/*
 * prefix.h — the engine's prefix index: token prefixes -> KV blocks, per namespace (a radix
 * tree, radix/), and the one owner of retention: which prefixes are pinned and until when.
 * engine.h includes it; the code is engine/prefix.c.
 *
 * A node of the tree covers the positions of its edge and references the KV blocks that hold
 * them. A sequence started from the index shares the blocks of its longest cached prefix (at
 * token granularity: a match ending inside a block shares that block too, and the sequence
 * copies it before writing into it) and computes only the rest. Nothing matches across
 * namespaces.
 *
 * Retention. A cached prefix is opportunistic: when the KV pool runs out of blocks the least
 * recently used unpinned ones are evicted. A retained prefix has one pin, with one expiry, kept
 * here and nowhere else (the worker asks this index; the gateway's own TTL ends a pin early
 * through eng_prefix_release). The life of a prefix (the node ending at its last token):
 *
 *                  insert                     retain(expiry)
 *   (absent) ----------------> CACHED ------------------------------> PINNED --+
 *      ^                       |  ^  ^                                 |  ^     | retain again:
 *      |  evict (LRU leaf),    |  |  |  release, or expire(now) with   |  +-----+ expiry =
 *      |  drop                 |  |  +--- now >= expiry (reported) ----+          max(old, new)
 *      +-----------------------+  |                                    |
 *      |                          |                                    | hard pressure (no
 *      |                          |  release, or expire (reported)     | unpinned leaf left;
 *      |                          +----------------------- LAPSED <----+ earliest expiry first)
 *      |                                                    |  |
 *      |  evict, drop: the pin ends with its node, silently |  |  retain again
 *      +----------------------------------------------------+  +--------------> PINNED
 *
 *   CACHED   in the tree, evictable (LRU), no pin.
 *   PINNED   a pin with its expiry holds the node and its ancestors: never evicted except
 *            under hard pressure. Expiry is a number in whatever clock the caller passes to
 *            eng_prefix_expire; nothing here reads a clock.
 *   LAPSED   still a pin with its expiry (listed by eng_prefix_pin_at, ended and reported by
 *            release and expire like a PINNED one), but it no longer holds the node, which is
 *            evictable like a CACHED one; the pin ends with its node.
 *
 * Costs: a pin is found from its prefix through its node (one match, O(prefix)); pins sit in
 * two min-heaps by expiry (all pins, and the PINNED ones for hard pressure), so retain,
 * release, expiry, and giving up a pin under pressure cost O(log pins) each, and an eviction
 * finds its node's pin in O(1). Nothing scans the pins except eng_prefix_release_ns.
 *
 * Every removal from the index is reported through the eviction callback; every pin that
 * eng_prefix_expire or eng_prefix_release_ns ends is reported through their callback.
 */
#ifndef ENG_PREFIX_H
#define ENG_PREFIX_H

#include <stdint.h>

#include "engine.h"

/* Why cached KV left the index. */
enum eng_evict_reason {
    ENG_EVICT_LRU = 1,      /* the pool needed blocks; an unpinned prefix went */
    ENG_EVICT_PRESSURE = 2, /* the pool needed blocks and only retained prefixes were left */
    ENG_EVICT_REMOVED = 3,  /* eng_prefix_drop */
};

typedef struct eng_evict_event {
    uint64_t ns;           /* namespace */
    uint32_t n_tokens;     /* the prefix length that is no longer cached: positions >= this */
    uint32_t n_dropped;    /* positions dropped by this removal ([n_tokens, n_tokens + n)) */
    int reason;            /* enum eng_evict_reason */
    const int32_t *tokens; /* [n_tokens + n_dropped] the removed prefix's token path (for
                              naming it, e.g. eng_wire_prefix_fp); valid during the callback
                              only; NULL if memory for it ran out */
    uint8_t tier;          /* enum eng_tier (tier.h): where the dropped blocks went:
                              ENG_TIER_G3 (or G2) when every whole block of the dropped part is
                              held or queued there, else ENG_TIER_NONE (gone) */
} eng_evict_event_t;

typedef void (*eng_evict_fn)(const eng_evict_event_t *ev, void *ud);

/* Installs the eviction callback (NULL: none). It runs inside the call that evicted (usually
 * eng_forward) and must not call back into the engine. */
void eng_set_evict_callback(eng_t *e, eng_evict_fn fn, void *ud);

/* Starts the empty sequence s from the longest prefix of tokens[0..n) cached in namespace ns,
 * reusing at most n - 1 tokens (the last token is always computed, for its logits). With tiers
 * (tier.h) the match continues past the pool into G2/G3 block by block: loads, exact hole
 * recompute (an eng_forward inside this call) and the cost model; eng_seq_origin says where the
 * positions came from. Sets *n_reused; the caller then runs eng_forward on
 * tokens[*n_reused .. n). Returns 0, PC_ERR_STATE (s is not empty) or PC_ERR_NOMEM (s stays
 * empty). A tier read or a hole recompute that fails only shortens *n_reused. */
int eng_seq_start_cached(eng_t *e, eng_seq_t *s, uint64_t ns, const int32_t *tokens, uint32_t n,
                         uint32_t *n_reused);

/* Caches the first n positions of s (all computed) in namespace ns, unpinned. Returns 0,
 * PC_ERR_INVAL (n is 0 or more than s holds) or PC_ERR_NOMEM (the index is unchanged). */
int eng_prefix_insert(eng_t *e, eng_seq_t *s, uint64_t ns, uint32_t n);

/* Caches the first n positions of s like eng_prefix_insert and pins them until expiry. A
 * prefix has at most one pin: retaining a pinned (or lapsed) prefix again keeps that pin, holds
 * the node again, and moves its expiry to the later of the two (a TTL refresh). *until (may be
 * NULL) gets the pin's expiry after the call. Returns 0, PC_ERR_INVAL or PC_ERR_NOMEM (no pin
 * changed; the prefix may stay cached). */
int eng_prefix_retain(eng_t *e, eng_seq_t *s, uint64_t ns, uint32_t n, uint64_t expiry,
                      uint64_t *until);

/* Ends the pin (pinned or lapsed) of the prefix tokens[0..n) in ns; the prefix stays cached,
 * unpinned. Returns 0, or PC_ERR_NOTFOUND when that prefix has no pin. */
int eng_prefix_release(eng_t *e, uint64_t ns, const int32_t *tokens, uint32_t n);

/* A pin, as the calls below report it. */
typedef struct eng_prefix_pin {
    uint64_t ns;
    uint64_t expiry;
    uint32_t n_tokens;
    bool held;             /* PINNED (true) or LAPSED (false) */
    const int32_t *tokens; /* [n_tokens] the prefix; see each call for how long it is valid */
} eng_prefix_pin_t;

/* Called for each pin a call ended, after it ended; must not call back into the engine. */
typedef void (*eng_prefix_pin_fn)(const eng_prefix_pin_t *pin, void *ud);

/* Ends every pin whose expiry is <= now, earliest first, calling fn(pin, ud) (fn may be NULL)
 * for each; pin->tokens is valid during the call. Returns how many ended. O(log pins) per pin
 * that ends, nothing for the others. */
uint32_t eng_prefix_expire(eng_t *e, uint64_t now, eng_prefix_pin_fn fn, void *ud);

/* The earliest expiry of any pin, or UINT64_MAX without pins: when eng_prefix_expire next has
 * work. */
uint64_t eng_prefix_next_expiry(const eng_t *e);

/* Ends every pin of namespace ns, calling fn(pin, ud) (may be NULL) for each as
 * eng_prefix_expire does. Returns how many ended. O(pins). */
uint32_t eng_prefix_release_ns(eng_t *e, uint64_t ns, eng_prefix_pin_fn fn, void *ud);

/* The number of pins (pinned and lapsed); eng_prefix_pin_at numbers them 0 .. n - 1, in no
 * particular order, until the index changes. */
uint32_t eng_prefix_n_pins(const eng_t *e);

/* Describes pin i (< eng_prefix_n_pins). tokens (may be NULL) receives the prefix
 * ([out->n_tokens] room) and out->tokens then points to it, else out->tokens is NULL. */
void eng_prefix_pin_at(const eng_t *e, uint32_t i, eng_prefix_pin_t *out, int32_t *tokens);

/* Removes every cached prefix of ns that starts with tokens[0..n) (n = 0: the namespace), in
 * the pool and in the KV tiers (after the queued tier writes): every record of a prompt that
 * starts with tokens[0..n), and the records before n on that path that no other held record
 * continues. Returns 0, PC_ERR_NOTFOUND (nothing in the pool; the tiers' records are removed all
 * the same) or PC_ERR_BUSY (one is pinned; nothing removed). A lapsed pin goes with its prefix. */
int eng_prefix_drop(eng_t *e, uint64_t ns, const int32_t *tokens, uint32_t n);

typedef struct eng_prefix_stats {
    uint64_t n_tokens; /* tokens stored in the tree */
    uint64_t n_nodes;
    uint64_t n_retained;   /* pins that hold their prefix (PINNED) */
    uint64_t n_lookups;    /* eng_seq_start_cached calls */
    uint64_t n_hit_tokens; /* tokens reused by them */
    uint64_t n_evicted;    /* removals reported through the callback */
} eng_prefix_stats_t;

void eng_prefix_stats(const eng_t *e, eng_prefix_stats_t *out);

#endif
