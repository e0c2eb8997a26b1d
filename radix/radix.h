/*
 * radix.h — a compressed radix tree over token ids (uint32_t).
 *
 * The gateway uses it to know which cache entries are live and which workers hold them; each
 * worker uses it to know which KV blocks hold which prefix. It is a pure data structure: no
 * I/O, no threads, no clocks (every time is passed in by the caller, in whatever unit the
 * caller picks, usually milliseconds), no knowledge of HTTP or money.
 *
 * Shape. Each namespace (a 64-bit id) has its own hidden root; nothing ever matches across
 * namespaces. Every other node owns an edge: a run of one or more tokens. A node "ends" at
 * depth = the number of tokens from the root to the end of its edge. The children of a node
 * start with distinct tokens. Storing the sequences [1 2 3 4 5] and then [1 2 3 9] splits the
 * first edge after its third token:
 *
 *     before:                          after inserting [1 2 3 9]:
 *
 *     (root ns=7)                      (root ns=7)
 *          |                                |
 *     [1 2 3 4 5]  depth 5             [1 2 3]  depth 3   <- new node (upper half)
 *                                        /      \
 *                                 [4 5] d=5    [9] d=4    <- old node keeps the lower half
 *
 * The node that held [1 2 3 4 5] keeps its identity and becomes [4 5]: handles to it stay
 * valid and still denote the same sequence end. The split node gets a copy of the owner set,
 * the lower node's last access, and (through the caller's split callback) the head of the
 * payload. A split never changes what any match returns.
 *
 * Lifetimes. A node is *terminal* when a sequence was inserted ending exactly there; it then
 * has its own expiry time (RDX_EXPIRY_NEVER for an LRU-only cache). Non-terminal nodes exist
 * only to carry their descendants. Invariant: every leaf is terminal or pinned, so the tree
 * holds exactly the prefixes of the terminal and pinned positions, and a node lives as long as
 * its longest-lived descendant. rdx_tree_expire(now) ends the lifetime of each terminal node
 * whose own expiry has passed (its entry mark goes with it) and removes, bottom-up, the nodes
 * that are left with nothing below them. It pops a min-heap of own expiries, so its cost is
 * proportional to what expires, never to the size of the tree. A pinned node and its
 * ancestors are never removed by expire or evict; a pinned node whose lifetime ended stays
 * until its last pin is released, and rdx_tree_unpin then removes it (reason EXPIRE).
 *
 * LRU. Every operation that goes through a node (insert, touch) raises its last access, and
 * that of all its ancestors, so a parent is never older than its children. Unpinned leaves sit
 * in a min-heap by last access; rdx_tree_evict pops it, frees each leaf and, bottom-up, the
 * non-terminal ancestors left with no children.
 *
 * Nodes are never merged back together after removals (a non-terminal node may keep a single
 * child): merging would need a payload merge callback and an allocation on the removal paths,
 * which must not fail. Matching is unaffected.
 *
 * Storage. Edge tokens are packed at a per-tree width picked from params.vocab_size: 2 bytes
 * up to 65,536 token ids, 3 bytes up to 16,777,216, else 4. A node and its edge are one
 * allocation; children live in a sorted array up to 8 of them, then in an open-addressing hash
 * table keyed by first token. Comparing a query with an edge is vectorised (SSE2, SSSE3 or
 * AVX2, picked at run time), so a lookup costs one child lookup per node plus memory-speed
 * compares: O(matched length + nodes on the path).
 *
 * Pointer validity. A rdx_node_t* stays valid until the node is freed, which only happens in
 * rdx_tree_expire, rdx_tree_evict, rdx_tree_remove, rdx_tree_remove_prefix, rdx_tree_unpin and
 * rdx_tree_free. Insert never frees or moves a node (a split keeps the node object; it only
 * shortens its edge and changes its parent). Pin a node to keep it across those calls.
 *
 * Errors and OOM. Fallible functions return 0 or a negative PC_ERR_* (common/pc_err.h). Every
 * mutation either completes or fails leaving the tree exactly as it was: everything a mutation
 * needs is allocated before the first change (tested with a failing allocator). Removal paths
 * never allocate. Not thread-safe: one tree belongs to one thread at a time.
 */
#ifndef RDX_RADIX_H
#define RDX_RADIX_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct rdx_tree rdx_tree_t;
typedef struct rdx_node rdx_node_t;

/* An expiry time that never passes (LRU-only caches). */
#define RDX_EXPIRY_NEVER UINT64_MAX
/* The longest sequence a tree stores, in tokens. */
#define RDX_MAX_SEQ_TOKENS ((size_t)1 << 30)
/* The most owners a tree can be configured for. */
#define RDX_MAX_OWNERS 65536u

/* Insert flags. */
enum rdx_insert_flags {
    RDX_INSERT_ENTRY = 1u << 0, /* mark the end node as a cache-entry boundary */
};

/* Why a node is being freed (rdx_free_event_t.reason). */
enum rdx_free_reason {
    RDX_FREE_EXPIRE = 1, /* its lifetime ended (TTL passed, or its last pin went after that) */
    RDX_FREE_EVICT = 2,  /* rdx_tree_evict picked it (or it was left empty by that) */
    RDX_FREE_REMOVE = 3, /* rdx_tree_remove / rdx_tree_remove_prefix */
    RDX_FREE_DESTROY = 4 /* rdx_tree_free */
};

/* One node being freed, as passed to params.on_free. The node handle is valid during the
 * callback only (its ancestors too: removal is bottom-up, so rdx_node_prefix works); the
 * payload is destroyed with params.payload_free right after the callback returns. */
typedef struct rdx_free_event {
    uint64_t ns;            /* namespace id */
    const rdx_node_t *node; /* the node (owners can be read with rdx_tree_owner_next) */
    size_t depth;           /* tokens from the root to the end of its edge */
    uint32_t len;           /* tokens on its edge: the tokens this frees */
    void *payload;          /* its payload (may be NULL) */
    int reason;             /* enum rdx_free_reason */
} rdx_free_event_t;

typedef struct rdx_tree_params {
    /* Token ids are < vocab_size; it picks the packed width. 0 means any uint32_t. */
    uint64_t vocab_size;
    /* Owner ids are < max_owners (1..RDX_MAX_OWNERS; default 256). Owners 0..63 are stored
     * inline in each node, higher ones in a bitmap allocated on first use. */
    uint32_t max_owners;
    /* Destroys a node's payload when the node is freed (may be NULL: payloads are not owned). */
    void (*payload_free)(void *payload, void *ud);
    /* Splits a payload that covers a node's edge tokens [0, len) at `at` (0 < at < len): on
     * success the payload now covers [0, at) and *tail_out gets a new payload for [at, len);
     * returns 0, or a negative PC_ERR_* leaving the payload unchanged, and then the insert
     * that needed the split fails with that error and changes nothing. May be NULL, and then
     * an insert that would split an edge whose node has a payload fails with
     * PC_ERR_UNSUPPORTED. */
    int (*payload_split)(void *payload, uint32_t at, void **tail_out, void *ud);
    /* Called once per freed node, bottom-up, before its payload is destroyed (may be NULL).
     * It must not call back into the tree except for the read-only rdx_node_* / owner
     * accessors. */
    void (*on_free)(const rdx_free_event_t *ev, void *ud);
    void *ud; /* passed to the callbacks */
} rdx_tree_params_t;

/* Token, node and byte counts. For a namespace, bytes count node headers, edges (allocated
 * capacity), child tables and owner bitmaps; for an owner, the headers and edges of the nodes
 * it holds; the tree-wide figure (rdx_tree_stats) adds the namespaces' roots, the heaps and
 * the tables. Bytes are computed sizes, not including the allocator's own overhead. */
typedef struct rdx_stats {
    uint64_t n_tokens;
    uint64_t n_nodes;
    uint64_t n_bytes;
} rdx_stats_t;

/* The result of rdx_tree_match. */
typedef struct rdx_match {
    size_t n_matched;       /* length of the longest prefix of the query stored in the tree */
    rdx_node_t *node;       /* node whose edge holds the last matched token; NULL if none */
    uint32_t edge_offset;   /* tokens of node's edge that matched, 1..len (0 if node NULL) */
    size_t n_covered;       /* longest matched prefix that is a prefix of a live entry */
    rdx_node_t *last_entry; /* deepest entry-boundary node fully inside the match, or NULL */
    size_t entry_len;       /* its depth (0 if none) */
} rdx_match_t;

/* A caller-allocated iterator over one namespace, in depth-first pre-order (parents before
 * children; the order of siblings is unspecified). Invalidated by any mutation. */
typedef struct rdx_iter {
    const rdx_tree_t *_tree;
    const rdx_node_t *_root;
    const rdx_node_t *_next;
} rdx_iter_t;

/* ---- lifecycle ---------------------------------------------------------------------- */

/* Defaults: vocab_size 0 (4-byte tokens), max_owners 256, no callbacks. */
rdx_tree_params_t rdx_tree_params_default(void);

/* Creates an empty tree. Returns 0 and *out, PC_ERR_INVAL for bad params (max_owners out of
 * range, vocab_size above 2^32), or PC_ERR_NOMEM. The params are copied. */
int rdx_tree_init(const rdx_tree_params_t *params, rdx_tree_t **out);

/* Frees every node (calling on_free with RDX_FREE_DESTROY and payload_free for each) and the
 * tree. rdx_tree_free(NULL) is a no-op. */
void rdx_tree_free(rdx_tree_t *t);

/* ---- lookups (read-only) ------------------------------------------------------------ */

/* Finds the longest prefix of tok[0..n) stored in namespace ns and fills *out. Returns 0,
 * or PC_ERR_INVAL for a NULL t or out, or a NULL tok with n > 0. An unknown namespace matches
 * nothing; query tokens need not be < vocab_size (such a token simply matches nothing). Does not
 * touch last-access times: call rdx_tree_touch for that. The node pointers in *out are valid until
 * the next call that can free nodes. */
int rdx_tree_match(const rdx_tree_t *t, uint64_t ns, const uint32_t *tok, size_t n,
                   rdx_match_t *out);

/* ---- mutations ---------------------------------------------------------------------- */

/* Stores tok[0..n) in namespace ns, splitting an edge if needed, and sets *out (may be NULL)
 * to the node that ends exactly at position n. The end node becomes terminal with own expiry
 * max(old, expiry); flags RDX_INSERT_ENTRY also marks it as an entry boundary. Every node on
 * the path gets last access max(old, now). Returns 0 when new tokens were stored, 1 when the
 * sequence was already present (possibly ending mid-edge, which is then split), or
 * PC_ERR_INVAL (NULL t or tok, n == 0, expiry == 0, unknown flags), PC_ERR_RANGE (a token >=
 * vocab_size, n > RDX_MAX_SEQ_TOKENS), PC_ERR_UNSUPPORTED (see payload_split), PC_ERR_NOMEM, or the
 * split callback's error; on error the tree is unchanged. */
int rdx_tree_insert(rdx_tree_t *t, uint64_t ns, const uint32_t *tok, size_t n, uint64_t now,
                    uint64_t expiry, unsigned flags, rdx_node_t **out);

/* rdx_tree_insert whose walk starts at from, a live node of namespace ns whose prefix is
 * tok[0..depth(from)) (the caller's promise: it is not checked) and depth(from) <= n; NULL =
 * the root. Only tokens after depth(from) are read, so the entries of one path can be written
 * shortest first in one walk (gateway/cindex.c, gw_cindex_insert_path). Same returns, plus
 * PC_ERR_INVAL when from is of another namespace or deeper than n. */
int rdx_tree_insert_from(rdx_tree_t *t, uint64_t ns, rdx_node_t *from, const uint32_t *tok,
                         size_t n, uint64_t now, uint64_t expiry, unsigned flags, rdx_node_t **out);

/* Refreshes a path: node and all its ancestors get last access max(old, now). When expiry is
 * not 0 the node becomes terminal (if it was not) with own expiry max(old, expiry). Cannot
 * fail (returns 0; PC_ERR_INVAL for NULL). */
int rdx_tree_touch(rdx_tree_t *t, rdx_node_t *node, uint64_t now, uint64_t expiry);

/* Ends the lifetime of every terminal node whose own expiry is <= now and removes what is
 * left with nothing to carry (see the file header). Stores the tokens freed in *n_freed (may
 * be NULL). Cost: O((expired + freed) log n). Cannot fail. */
void rdx_tree_expire(rdx_tree_t *t, uint64_t now, size_t *n_freed);

/* Frees unpinned leaves in least-recently-used order, with their emptied non-terminal
 * ancestors, until at least n_tokens tokens were freed or nothing evictable is left. Stores
 * the tokens freed in *n_freed (may be NULL). Cannot fail. */
void rdx_tree_evict(rdx_tree_t *t, size_t n_tokens, size_t *n_freed);

/* Removes node and its whole subtree (bottom-up, reason REMOVE), then the non-terminal
 * ancestors left empty. Returns 0, PC_ERR_INVAL (NULL), or PC_ERR_BUSY when a node of the
 * subtree is pinned (nothing is removed). */
int rdx_tree_remove(rdx_tree_t *t, rdx_node_t *node);

/* Removes every stored sequence of namespace ns that starts with tok[0..n) (n == 0: the whole
 * namespace). Returns 0, PC_ERR_NOTFOUND when no stored sequence starts with it, PC_ERR_BUSY
 * when one of them is pinned (nothing is removed), or PC_ERR_INVAL. */
int rdx_tree_remove_prefix(rdx_tree_t *t, uint64_t ns, const uint32_t *tok, size_t n);

/* Pins a node: it and its ancestors are never freed by expire or evict while pinned. Returns
 * 0, PC_ERR_INVAL or PC_ERR_RANGE (pin count overflow). */
int rdx_tree_pin(rdx_tree_t *t, rdx_node_t *node);

/* Releases one pin. Returns 0, 1 when this freed the node (its lifetime had ended and it had
 * no children: it is removed with its emptied ancestors, reason EXPIRE, and the handle is
 * dead), PC_ERR_STATE when the node is not pinned, or PC_ERR_INVAL. */
int rdx_tree_unpin(rdx_tree_t *t, rdx_node_t *node);

/* Replaces a node's payload (node must be a live handle) and returns the previous one, which the
 * caller now owns (it is not passed to payload_free). Payloads are not counted in the accounting.
 */
void *rdx_tree_set_payload(rdx_tree_t *t, rdx_node_t *node, void *payload);

/* ---- owner sets --------------------------------------------------------------------- */

/* Adds owner to node's owner set (per-owner accounting counts the node's tokens, the node and
 * its bytes). Returns 0 (also when already present), PC_ERR_RANGE (owner >= max_owners),
 * PC_ERR_NOMEM (first owner >= 64 of this node: the bitmap is allocated), PC_ERR_INVAL. */
int rdx_tree_owner_add(rdx_tree_t *t, rdx_node_t *node, uint32_t owner);

/* Adds owner to node and all its ancestors (a worker that holds a prefix holds all of it).
 * Same returns as rdx_tree_owner_add; on error no node was changed. */
int rdx_tree_owner_add_path(rdx_tree_t *t, rdx_node_t *node, uint32_t owner);

/* Removes owner from node's set. Returns 0 (also when absent), PC_ERR_RANGE, PC_ERR_INVAL. */
int rdx_tree_owner_del(rdx_tree_t *t, rdx_node_t *node, uint32_t owner);

/* 1 if owner is in node's set, else 0. */
int rdx_tree_owner_has(const rdx_tree_t *t, const rdx_node_t *node, uint32_t owner);

/* The smallest owner >= from in node's set, or -1. Loop: for (o = next(t, n, 0); o >= 0;
 * o = next(t, n, o + 1)). */
int64_t rdx_tree_owner_next(const rdx_tree_t *t, const rdx_node_t *node, uint32_t from);

/* ---- node accessors (read-only, O(1) unless stated) --------------------------------- */

size_t rdx_node_depth(const rdx_node_t *node);
uint32_t rdx_node_len(const rdx_node_t *node);
/* The parent, or NULL for a node directly below its namespace root. */
rdx_node_t *rdx_node_parent(const rdx_node_t *node);
uint64_t rdx_node_ns(const rdx_node_t *node);
void *rdx_node_payload(const rdx_node_t *node);
uint32_t rdx_node_pins(const rdx_node_t *node);
/* Own expiry: 0 for a non-terminal node, RDX_EXPIRY_NEVER for one that never expires. */
uint64_t rdx_node_expiry(const rdx_node_t *node);
uint64_t rdx_node_last_access(const rdx_node_t *node);
/* 1 if an entry boundary ends exactly at this node. */
int rdx_node_is_entry(const rdx_node_t *node);
/* Number of children. */
uint32_t rdx_node_n_children(const rdx_node_t *node);
/* Copies the node's edge tokens (rdx_node_len of them) into dst; returns the count. */
size_t rdx_node_tokens(const rdx_tree_t *t, const rdx_node_t *node, uint32_t *dst);
/* Copies the whole prefix root..node (rdx_node_depth tokens) into dst; returns the count.
 * O(depth). */
size_t rdx_node_prefix(const rdx_tree_t *t, const rdx_node_t *node, uint32_t *dst);

/* ---- accounting --------------------------------------------------------------------- */

/* Stats of one namespace: 0, or PC_ERR_NOTFOUND (no such namespace; *out zeroed). */
int rdx_tree_ns_stats(const rdx_tree_t *t, uint64_t ns, rdx_stats_t *out);
/* Stats of the nodes whose owner set holds owner: 0, or PC_ERR_RANGE. */
int rdx_tree_owner_stats(const rdx_tree_t *t, uint32_t owner, rdx_stats_t *out);
/* Totals over all namespaces; n_bytes also counts the tree's own tables and heaps. */
void rdx_tree_stats(const rdx_tree_t *t, rdx_stats_t *out);
/* Number of namespaces with at least one node. */
size_t rdx_tree_ns_count(const rdx_tree_t *t);
/* Bytes per packed token (2, 3 or 4). */
int rdx_tree_token_width(const rdx_tree_t *t);

/* ---- iteration, debugging ----------------------------------------------------------- */

/* Starts an iteration over namespace ns (an unknown one yields nothing). */
void rdx_iter_init(rdx_iter_t *it, const rdx_tree_t *t, uint64_t ns);
/* The next node in pre-order, or NULL at the end. */
rdx_node_t *rdx_iter_next(rdx_iter_t *it);

/* Writes a readable dump of every namespace (one line per node, indented by level) to f. The
 * output is deterministic for a given tree (namespaces and siblings in sorted order). */
void rdx_tree_dump(const rdx_tree_t *t, FILE *f);

/* Checks every invariant (structure, depths, child tables, heaps, lifetimes, entry counts,
 * accounting). Returns 0, or PC_ERR_INTERNAL with a description of the first violation in
 * err (len bytes, may be 0). O(tree size). */
int rdx_tree_check(const rdx_tree_t *t, char *err, size_t len);

#endif
