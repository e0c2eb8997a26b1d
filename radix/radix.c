/*
 * radix.c — the token radix tree (see radix.h for the model and the contracts).
 *
 * Internal invariants, all verified by rdx_tree_check:
 *   - A non-root node has 1 <= len <= cap edge tokens, depth == parent depth + len, and is
 *     found in its parent's child table under its first token. A node with no children has
 *     kids == NULL (an emptied child table is freed at once).
 *   - A non-root leaf is terminal (expiry != 0) or pinned.
 *   - exp heap: exactly the nodes with 0 < expiry < RDX_EXPIRY_NEVER, keyed by expiry.
 *     lru heap: exactly the unpinned non-root leaves, keyed by last_access. Each node stores
 *     its index in each heap (RDX_NOIDX when absent). Both heaps have room for one entry per
 *     node, reserved by insert, so no push on a removal path can need memory.
 *   - last_access of a node >= last_access of each child.
 *   - entries_below == (own entry mark) + sum over children; the entry mark implies terminal.
 *   - Accounting (per namespace, per owner, totals) equals a recount.
 *
 * OOM discipline: rdx_tree_insert walks the tree read-only, allocates everything it may need
 * (namespace, split node, leaf, grown child table, owner bitmap copy, heap room), calls the
 * payload split callback last, and only then changes the tree. Removal paths only free.
 *
 * Memory layout. One node is one allocation: a 104-byte header followed by its edge, packed
 * at the tree's token width, plus RDX_PAD bytes for the vector loads. With 3-byte tokens a
 * 200-token leaf takes 104 + 600 + 8 = 712 bytes (720 with malloc's header), 3.6 bytes per
 * token; long shared prefixes amortise their header to nothing. Child tables, owner bitmaps
 * for owners >= 64 and the two heaps (16 bytes per entry) are separate allocations. A split
 * keeps the lower node's allocation (its identity is what handles point at), so that node
 * may carry unused edge capacity; the accounting counts allocated capacity, not length.
 *
 * Cost model. Lookups and inserts are bound by memory, not instructions: per node on the
 * path one child-table probe and one node header (cache misses on a large tree), then a
 * streaming compare of the edge against the query. That is why the first edge token lives
 * in the header (kids lookups and deletions never touch the edge) and why compares are
 * vectorised over packed tokens instead of unpacking the query.
 *
 * Naming: "terminal" = has its own lifetime (expiry != 0); "entry" = carries the entry mark;
 * "leaf" = no children; "settle" = the bottom-up cleanup after a child went away.
 */
#include "radix.h"

#include "common.h"

#include <inttypes.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RDX_X86 1
#endif

/* The heap index of a node that is not in that heap. */
#define RDX_NOIDX PC_HEAP_NOIDX
/* Bytes allocated past every edge so vector loads of its last tokens stay inside the
 * allocation (the 3-byte compares load 16 bytes to use 12, or 32 to use 24). */
#define RDX_PAD 8
/* Child tables up to this capacity are sorted arrays, above it hash tables. */
#define KIDS_LINEAR_MAX 8

/* Node flags. NF_ENTRY: an entry boundary ends exactly here (implies terminal). */
enum { NF_ENTRY = 1u << 0 };

/* A child table: a header, then ptr[cap], then key[cap] (key = first token of the child's
 * edge). Linear mode (cap <= KIDS_LINEAR_MAX): the first n slots are used, sorted by key.
 * Hash mode: cap is a power of two, linear probing, empty slots have ptr NULL, load <= 3/4. */
typedef struct rdx_kids {
    uint32_t n;
    uint32_t cap;
} rdx_kids_t;

/* A namespace: its id, its accounting and its hidden root. Namespaces are allocated one by
 * one and found through a common/pc_u64map (so a namespace never moves) and are dropped as soon as
 * their root has no children left, which keeps rdx_tree_ns_count meaningful for a gateway
 * with many short-lived tenants. */
typedef struct rdx_ns {
    uint64_t id;
    rdx_stats_t st;   /* non-root nodes; bytes also count the root and its child table */
    rdx_node_t *root; /* len 0, depth 0, parent NULL */
} rdx_ns_t;

/* A node. Field order keeps everything the match loop reads (kids, len, key, flags, edge)
 * within the header's last cache lines next to the edge; the metadata used only by
 * mutations comes first. depth and len are 32-bit: sequences are limited to
 * RDX_MAX_SEQ_TOKENS. */
struct rdx_node {
    rdx_node_t *parent;     /* NULL only for a namespace root */
    rdx_ns_t *ns;           /* for O(1) accounting from nodes reached through the heaps */
    void *payload;          /* the caller's; destroyed with params.payload_free */
    rdx_kids_t *kids;       /* NULL for a leaf */
    uint64_t *owners_ext;   /* owners 64..max_owners-1, NULL until one is added */
    uint64_t owners;        /* owners 0..63 */
    uint64_t expiry;        /* own expiry: 0 non-terminal, RDX_EXPIRY_NEVER never */
    uint64_t last_access;   /* >= every child's (touch refreshes whole paths) */
    uint32_t depth;         /* tokens from the root to the end of the edge */
    uint32_t len;           /* tokens on the edge, >= 1 except for a root */
    uint32_t cap;           /* edge capacity in tokens (allocation size) */
    uint32_t exp_idx;       /* position in the expiry heap, or RDX_NOIDX */
    uint32_t lru_idx;       /* position in the LRU heap, or RDX_NOIDX */
    uint32_t pins;          /* rdx_tree_pin count */
    uint32_t entries_below; /* entry marks in this subtree, this node included */
    uint32_t key;           /* first edge token, the child-table key (saves a cache line) */
    uint32_t flags;
    uint8_t edge[]; /* len packed tokens, then slack up to cap, then RDX_PAD bytes */
};

/* The expiry and LRU heaps are common/pc_heap.h (4-ary, the key in the entry, the position
 * in the node's exp_idx / lru_idx): exactly the heap this file used to carry, moved so the
 * gateway's index shares it. */
typedef pc_heap_t rdx_heap_t;

/* Compares n packed edge tokens with n query tokens; returns the length of the equal run. */
typedef size_t (*rdx_cmp_fn)(const uint8_t *edge, const uint32_t *q, size_t n);

/* The tree: parameters, the CPU-specific compare picked at init, the namespace table, the two
 * heaps and the accounting. The per-owner array is allocated once at init (max_owners
 * entries) so that owner accounting never allocates. */
struct rdx_tree {
    rdx_tree_params_t p;
    int width; /* bytes per packed token: 2, 3 or 4 */
    int ssse3; /* the CPU has SSSE3 (packing 3-byte tokens) */
    rdx_cmp_fn cmp;
    pc_u64map_t ns_map; /* id -> rdx_ns_t*, every namespace but 0 */
    rdx_ns_t *ns0;      /* namespace 0 (pc_u64map cannot key 0), or NULL */
    uint32_t ns_n;
    rdx_heap_t exp, lru;
    rdx_stats_t *owner_st; /* [max_owners] */
    uint32_t ext_words;    /* words of owners_ext */
    rdx_stats_t total;     /* sum over namespaces */
};

/* ---- token packing and comparison ------------------------------------------------------ */

/* Token i of a packed edge (little-endian, w bytes). */
static inline uint32_t tok_get(const uint8_t *e, size_t i, int w)
{
    const uint8_t *p = e + i * (size_t)w;
    switch (w) {
    case 2:
        return (uint32_t)p[0] | (uint32_t)p[1] << 8;
    case 3:
        return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16;
    default: {
        uint32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    }
}

/* Packs n tokens at width w; the caller has checked that they fit (insert validates them
 * against vocab_size, which picked w). Portable version; see edge_pack. */
static void tok_pack(uint8_t *dst, const uint32_t *src, size_t n, int w)
{
    if (w == 4) {
        memcpy(dst, src, n * 4);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t v = src[i];
        dst[0] = (uint8_t)v;
        dst[1] = (uint8_t)(v >> 8);
        if (w == 3)
            dst[2] = (uint8_t)(v >> 16);
        dst += w;
    }
}

/* Each compare returns the number of leading tokens where the packed edge equals q (<= n).
 * The query is never packed: a query token too wide for the edge width simply differs.
 * The vector versions widen packed edge tokens to 32 bits in registers, compare 4 or 8
 * lanes at once against the query, and turn the first unequal lane into an index with
 * movemask + count-trailing-zeros (4 mask bits per 32-bit lane, hence the >> 2). Tails
 * shorter than a vector step fall back to the scalar loop. These scalar loops are also the
 * portable build's compares. */
static size_t cmp2_scalar(const uint8_t *e, const uint32_t *q, size_t n)
{
    size_t i = 0;
    while (i < n && tok_get(e, i, 2) == q[i])
        i++;
    return i;
}

static size_t cmp3_scalar(const uint8_t *e, const uint32_t *q, size_t n)
{
    size_t i = 0;
    while (i < n && tok_get(e, i, 3) == q[i])
        i++;
    return i;
}

static size_t cmp4_scalar(const uint8_t *e, const uint32_t *q, size_t n)
{
    size_t i = 0;
    while (i < n && tok_get(e, i, 4) == q[i])
        i++;
    return i;
}

#ifdef RDX_X86
/* SSE2 is part of x86-64: 8 tokens per step (16 bytes), widened from 2 bytes to 4 with
 * zero unpacks; no read past the 8 tokens. */
static size_t cmp2_sse2(const uint8_t *e, const uint32_t *q, size_t n)
{
    size_t i = 0;
    const __m128i z = _mm_setzero_si128();
    for (; i + 8 <= n; i += 8) {
        __m128i ev = _mm_loadu_si128((const __m128i *)(e + 2 * i));
        __m128i lo = _mm_unpacklo_epi16(ev, z), hi = _mm_unpackhi_epi16(ev, z);
        __m128i q0 = _mm_loadu_si128((const __m128i *)(q + i));
        __m128i q1 = _mm_loadu_si128((const __m128i *)(q + i + 4));
        int m0 = _mm_movemask_epi8(_mm_cmpeq_epi32(lo, q0));
        int m1 = _mm_movemask_epi8(_mm_cmpeq_epi32(hi, q1));
        if ((m0 & m1) != 0xFFFF) {
            if (m0 != 0xFFFF)
                return i + ((unsigned)__builtin_ctz(~m0) >> 2);
            return i + 4 + ((unsigned)__builtin_ctz(~m1) >> 2);
        }
    }
    return i + cmp2_scalar(e + 2 * i, q + i, n - i);
}

/* Width 4 is a plain 32-bit compare, two vectors per step. */
static size_t cmp4_sse2(const uint8_t *e, const uint32_t *q, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i e0 = _mm_loadu_si128((const __m128i *)(e + 4 * i));
        __m128i e1 = _mm_loadu_si128((const __m128i *)(e + 4 * i + 16));
        __m128i q0 = _mm_loadu_si128((const __m128i *)(q + i));
        __m128i q1 = _mm_loadu_si128((const __m128i *)(q + i + 4));
        int m0 = _mm_movemask_epi8(_mm_cmpeq_epi32(e0, q0));
        int m1 = _mm_movemask_epi8(_mm_cmpeq_epi32(e1, q1));
        if ((m0 & m1) != 0xFFFF) {
            if (m0 != 0xFFFF)
                return i + ((unsigned)__builtin_ctz(~m0) >> 2);
            return i + 4 + ((unsigned)__builtin_ctz(~m1) >> 2);
        }
    }
    return i + cmp4_scalar(e + 4 * i, q + i, n - i);
}

/* SSSE3: a byte shuffle widens 4 packed 3-byte tokens (12 of the 16 loaded bytes) to 4
 * uint32s. The 4 bytes read past the last token are inside RDX_PAD. */
__attribute__((target("ssse3"))) static size_t cmp3_ssse3(const uint8_t *e, const uint32_t *q,
                                                          size_t n)
{
    const __m128i shuf = _mm_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i e0 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(e + 3 * i)), shuf);
        __m128i e1 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(e + 3 * i + 12)), shuf);
        __m128i q0 = _mm_loadu_si128((const __m128i *)(q + i));
        __m128i q1 = _mm_loadu_si128((const __m128i *)(q + i + 4));
        int m0 = _mm_movemask_epi8(_mm_cmpeq_epi32(e0, q0));
        int m1 = _mm_movemask_epi8(_mm_cmpeq_epi32(e1, q1));
        if ((m0 & m1) != 0xFFFF) {
            if (m0 != 0xFFFF)
                return i + ((unsigned)__builtin_ctz(~m0) >> 2);
            return i + 4 + ((unsigned)__builtin_ctz(~m1) >> 2);
        }
    }
    return i + cmp3_scalar(e + 3 * i, q + i, n - i);
}

/* AVX2: 8 packed 3-byte tokens (24 of the 32 loaded bytes) per step. A dword permute puts
 * bytes 0..15 in the low lane and 12..27 in the high lane, then the same in-lane shuffle as
 * above widens each lane's 4 tokens. Reads up to 8 bytes past the last token (RDX_PAD). */
__attribute__((target("avx2"))) static size_t cmp3_avx2(const uint8_t *e, const uint32_t *q,
                                                        size_t n)
{
    const __m256i perm = _mm256_setr_epi32(0, 1, 2, 3, 3, 4, 5, 6);
    const __m256i shuf = _mm256_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1, 0,
                                          1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i r0 = _mm256_loadu_si256((const __m256i *)(e + 3 * i));
        __m256i r1 = _mm256_loadu_si256((const __m256i *)(e + 3 * i + 24));
        __m256i e0 = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(r0, perm), shuf);
        __m256i e1 = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(r1, perm), shuf);
        __m256i q0 = _mm256_loadu_si256((const __m256i *)(q + i));
        __m256i q1 = _mm256_loadu_si256((const __m256i *)(q + i + 8));
        unsigned m0 = (unsigned)_mm256_movemask_epi8(_mm256_cmpeq_epi32(e0, q0));
        unsigned m1 = (unsigned)_mm256_movemask_epi8(_mm256_cmpeq_epi32(e1, q1));
        if ((m0 & m1) != 0xFFFFFFFFu) {
            if (m0 != 0xFFFFFFFFu)
                return i + ((unsigned)__builtin_ctz(~m0) >> 2);
            return i + 8 + ((unsigned)__builtin_ctz(~m1) >> 2);
        }
    }
    return i + cmp3_ssse3(e + 3 * i, q + i, n - i);
}

/* Packs 4 tokens per step with one shuffle; each 16-byte store writes 4 bytes past the 12 it
 * means, which the next store or the edge's RDX_PAD absorbs. */
__attribute__((target("ssse3"))) static void pack3_ssse3(uint8_t *dst, const uint32_t *src,
                                                         size_t n)
{
    const __m128i shuf = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m128i v = _mm_loadu_si128((const __m128i *)(src + i));
        _mm_storeu_si128((__m128i *)(dst + 3 * i), _mm_shuffle_epi8(v, shuf));
    }
    for (; i < n; i++) {
        dst[3 * i] = (uint8_t)src[i];
        dst[3 * i + 1] = (uint8_t)(src[i] >> 8);
        dst[3 * i + 2] = (uint8_t)(src[i] >> 16);
    }
}
#endif

/* 1 if the CPU has the feature (1 = SSSE3, 2 = AVX2), checked once at rdx_tree_init. The
 * vector code is compiled with target attributes, so the library itself needs no -m
 * flags and runs on any x86-64. */
static int cpu_has(int feature)
{
#ifdef RDX_X86
    __builtin_cpu_init();
    if (feature == 2)
        return __builtin_cpu_supports("avx2");
    return __builtin_cpu_supports("ssse3");
#else
    (void)feature;
    return 0;
#endif
}

static void edge_pack(const rdx_tree_t *t, uint8_t *dst, const uint32_t *src, size_t n);

/* The fastest compare for width w on this CPU. Widths 2 and 4 need only SSE2 (baseline on
 * x86-64); width 3 needs a byte shuffle. */
static rdx_cmp_fn cmp_pick(int w)
{
#ifdef RDX_X86
    if (w == 2)
        return cmp2_sse2;
    if (w == 4)
        return cmp4_sse2;
    if (cpu_has(2))
        return cmp3_avx2;
    if (cpu_has(1))
        return cmp3_ssse3;
    return cmp3_scalar;
#else
    return w == 2 ? cmp2_scalar : w == 3 ? cmp3_scalar : cmp4_scalar;
#endif
}

/* Packs n tokens into a fresh edge, with the shuffle version for 3-byte tokens. */
static void edge_pack(const rdx_tree_t *t, uint8_t *dst, const uint32_t *src, size_t n)
{
#ifdef RDX_X86
    if (t->width == 3 && t->ssse3) {
        pack3_ssse3(dst, src, n);
        return;
    }
#endif
    tok_pack(dst, src, n, t->width);
}

/* ---- sizes and small helpers ----------------------------------------------------------- */

/* Allocation size of a node with room for cap edge tokens. */
static inline size_t node_bytes(const rdx_tree_t *t, uint32_t cap)
{
    return sizeof(rdx_node_t) + (size_t)cap * (size_t)t->width + RDX_PAD;
}

/* Allocation size of a child table with cap slots. */
static inline size_t kids_bytes(uint32_t cap)
{
    return sizeof(rdx_kids_t) + (size_t)cap * (sizeof(rdx_node_t *) + sizeof(uint32_t));
}

/* The two arrays behind a child table's header: pointers first (8-byte aligned), keys
 * after them. */
static inline rdx_node_t **kids_ptr(const rdx_kids_t *k)
{
    return (rdx_node_t **)(k + 1);
}
static inline uint32_t *kids_key(const rdx_kids_t *k)
{
    return (uint32_t *)(kids_ptr(k) + k->cap);
}

/* A node's child-table key: its first edge token, cached in the header. */
static inline uint32_t first_tok(const rdx_tree_t *t, const rdx_node_t *nd)
{
    (void)t;
    return nd->key;
}

/* Fibonacci hashing: token ids are dense small integers, so the multiply spreads them and
 * the high bits of the product pick the slot. */
static inline uint32_t kid_hash(uint32_t key, uint32_t mask)
{
    return (uint32_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

/* ---- child tables ---------------------------------------------------------------------- */

/* Why child tables are not common/pc_u64map (the namespace table above is): they are the
 * match loop's inner step and most of a tree's non-edge bytes. A table is one allocation of
 * 8 + 12 * cap bytes with 4-byte keys: a node with two children spends 32 bytes on it and
 * finds a child by scanning at most 8 keys in one cache line, inline, with no hashing. A
 * pc_u64map would put 24 bytes in every node (leaves included), 16-byte slots at most half
 * full with 16 of them at least (256 bytes for those two children), and an out-of-line call
 * with a 64-bit finaliser per token step. With these tables `kvgw bench radix` (median of 3
 * runs on the shared 2-core dev machine, load ~2.5, cpu_share 0.77-0.86, so the rates are
 * noisy) gives 0.96 M full-hit lookups/s (2.1 G matched tokens/s), 22 M misses/s, 0.39 M
 * inserts/s and 4.09 bytes per stored token (deterministic; the target is <= 4.5). No A/B
 * run against a pc_u64map variant was made: the figures are the bar such a change must meet. */

/* The child whose edge starts with key, or NULL. Linear mode scans at most 8 keys (one
 * cache line); hash mode probes until an empty slot, which exists because load <= 3/4. */
static rdx_node_t *kids_find(const rdx_kids_t *k, uint32_t key)
{
    if (k == NULL)
        return NULL;
    rdx_node_t *const *ptr = kids_ptr(k);
    const uint32_t *keys = kids_key(k);
    if (k->cap <= KIDS_LINEAR_MAX) {
        for (uint32_t i = 0; i < k->n; i++)
            if (keys[i] == key)
                return ptr[i];
        return NULL;
    }
    uint32_t mask = k->cap - 1;
    for (uint32_t h = kid_hash(key, mask);; h = (h + 1) & mask) {
        if (ptr[h] == NULL)
            return NULL;
        if (keys[h] == key)
            return ptr[h];
    }
}

/* The slot of key, or cap when absent. */
static uint32_t kids_slot(const rdx_kids_t *k, uint32_t key)
{
    rdx_node_t *const *ptr = kids_ptr(k);
    const uint32_t *keys = kids_key(k);
    if (k->cap <= KIDS_LINEAR_MAX) {
        for (uint32_t i = 0; i < k->n; i++)
            if (keys[i] == key)
                return i;
        return k->cap;
    }
    uint32_t mask = k->cap - 1;
    for (uint32_t h = kid_hash(key, mask);; h = (h + 1) & mask) {
        if (ptr[h] == NULL)
            return k->cap;
        if (keys[h] == key)
            return h;
    }
}

/* Number of slots to scan when iterating (used entries are among them). */
static inline uint32_t kids_span(const rdx_kids_t *k)
{
    return k->cap <= KIDS_LINEAR_MAX ? k->n : k->cap;
}

/* The capacity a table needs to hold n children. */
static uint32_t kids_cap_for(uint32_t n)
{
    if (n <= KIDS_LINEAR_MAX) {
        uint32_t c = 2;
        while (c < n)
            c *= 2;
        return c;
    }
    uint32_t c = 16;
    while ((uint64_t)n * 4 > (uint64_t)c * 3)
        c *= 2;
    return c;
}

static rdx_kids_t *kids_alloc(uint32_t cap)
{
    rdx_kids_t *k = pc_malloc(kids_bytes(cap));
    if (k == NULL)
        return NULL;
    k->n = 0;
    k->cap = cap;
    memset(kids_ptr(k), 0, sizeof(rdx_node_t *) * cap);
    return k;
}

/* Adds a child whose key is absent; the table has room. */
/* Insertion keeps linear tables sorted, so iteration and the dump see children in token
 * order for small fan-outs. The caller guarantees room: tables are grown (reallocated and
 * rehashed) only in insert's allocation phase. */
static void kids_add(rdx_kids_t *k, uint32_t key, rdx_node_t *child)
{
    rdx_node_t **ptr = kids_ptr(k);
    uint32_t *keys = kids_key(k);
    PC_ASSERT(k->n < k->cap);
    if (k->cap <= KIDS_LINEAR_MAX) {
        uint32_t i = k->n;
        while (i > 0 && keys[i - 1] > key) {
            keys[i] = keys[i - 1];
            ptr[i] = ptr[i - 1];
            i--;
        }
        keys[i] = key;
        ptr[i] = child;
    } else {
        uint32_t mask = k->cap - 1, h = kid_hash(key, mask);
        while (ptr[h] != NULL)
            h = (h + 1) & mask;
        keys[h] = key;
        ptr[h] = child;
    }
    k->n++;
}

/* Removes the child at slot i (backward-shift deletion in hash mode). */
/* Deletion never leaves tombstones: lookups stay O(1) however many children come and go.
 * Linear mode shifts the tail down. Hash mode uses backward-shift deletion (Knuth's
 * algorithm R): walk the cluster after the hole and move back every entry whose home slot
 * does not lie cyclically in (hole, its position], because such an entry would otherwise
 * become unreachable behind the hole. Tables never shrink; an emptied table is freed by
 * free_node. */
static void kids_del_slot(rdx_kids_t *k, uint32_t i)
{
    rdx_node_t **ptr = kids_ptr(k);
    uint32_t *keys = kids_key(k);
    if (k->cap <= KIDS_LINEAR_MAX) {
        for (uint32_t j = i + 1; j < k->n; j++) {
            keys[j - 1] = keys[j];
            ptr[j - 1] = ptr[j];
        }
        ptr[k->n - 1] = NULL;
    } else {
        uint32_t mask = k->cap - 1, j = i;
        ptr[i] = NULL;
        for (;;) {
            j = (j + 1) & mask;
            if (ptr[j] == NULL)
                break;
            uint32_t h = kid_hash(keys[j], mask);
            /* The entry at j may move to the hole at i unless its home lies cyclically in
             * (i, j]. */
            int stays = i <= j ? (h > i && h <= j) : (h > i || h <= j);
            if (!stays) {
                keys[i] = keys[j];
                ptr[i] = ptr[j];
                ptr[j] = NULL;
                i = j;
            }
        }
    }
    k->n--;
}

/* Moves every child of src into dst (an empty table with room). */
/* Used when a table grows: capacity changes the hash mask, so every entry is re-added. */
static void kids_rehash(rdx_kids_t *dst, const rdx_kids_t *src)
{
    rdx_node_t *const *ptr = kids_ptr(src);
    const uint32_t *keys = kids_key(src);
    for (uint32_t i = 0; i < kids_span(src); i++)
        if (ptr[i] != NULL)
            kids_add(dst, keys[i], ptr[i]);
}

/* The child in the first used slot at or after `from`, or NULL. */
/* Used by the bottom-up subtree walks, which only need some child to descend into. Freeing
 * always takes the first used slot s, and a deletion never moves an entry below s (a sorted
 * array shifts later entries down to s; the hash table's backward shift only moves entries
 * towards their home slot, and the wrapped ones to the end), so a walk that resumes at s
 * visits every slot once and a teardown of a wide node is linear, not quadratic. */
static rdx_node_t *kids_first_from(const rdx_kids_t *k, uint32_t from)
{
    if (k == NULL)
        return NULL;
    rdx_node_t *const *ptr = kids_ptr(k);
    for (uint32_t i = from; i < kids_span(k); i++)
        if (ptr[i] != NULL)
            return ptr[i];
    return NULL;
}

static rdx_node_t *kids_any(const rdx_kids_t *k)
{
    return kids_first_from(k, 0);
}

/* ---- heaps (min-heaps of nodes; each node stores its index) ------------------------------ */

/* Two heaps make expiry and eviction proportional to what they free: the expiry heap holds
 * every terminal node with a finite expiry (keyed by it), the LRU heap every unpinned leaf
 * (keyed by last access). Because each node records its position, a node can leave either
 * heap from anywhere in O(log n), which is what removals and pins need. */

/* The node's index field that mirrors its position in heap h. */
static inline uint32_t *heap_idx(const rdx_heap_t *h, rdx_node_t *nd)
{
    return (uint32_t *)((char *)nd + h->idx_off);
}

/* ---- namespaces ------------------------------------------------------------------------ */

/* The namespace with this id, or NULL. The table is common/pc_u64map (it hashes the id with
 * a 64-bit finaliser: namespace ids are keyed hashes in production, 1, 2, 3... in tests). */
static rdx_ns_t *ns_find(const rdx_tree_t *t, uint64_t id)
{
    return id == 0 ? t->ns0 : pc_u64map_get(&t->ns_map, id);
}

/* ---- owners and accounting ------------------------------------------------------------- */

/* Accounting is maintained incrementally at every change so that reading it is O(1): the
 * gateway meters storage per namespace from it and the router reads per-worker figures.
 * A node counts its len tokens, 1 node and its allocation bytes once in its namespace and
 * once in each owner in its set; changing a set or a length adjusts exactly those. */

/* Adds (d_tokens, d_nodes, d_bytes) to the stats of each owner in nd's set: inline bits
 * first, then the out-of-line bitmap. Cost: O(owners of nd). */
static void owners_account(rdx_tree_t *t, const rdx_node_t *nd, int64_t d_tokens, int64_t d_nodes,
                           int64_t d_bytes)
{
    for (uint64_t bits = nd->owners; bits != 0; bits &= bits - 1) {
        rdx_stats_t *s = &t->owner_st[__builtin_ctzll(bits)];
        s->n_tokens += (uint64_t)d_tokens;
        s->n_nodes += (uint64_t)d_nodes;
        s->n_bytes += (uint64_t)d_bytes;
    }
    if (nd->owners_ext == NULL)
        return;
    for (uint32_t w = 0; w < t->ext_words; w++)
        for (uint64_t bits = nd->owners_ext[w]; bits != 0; bits &= bits - 1) {
            rdx_stats_t *s = &t->owner_st[64 + 64 * w + (uint32_t)__builtin_ctzll(bits)];
            s->n_tokens += (uint64_t)d_tokens;
            s->n_nodes += (uint64_t)d_nodes;
            s->n_bytes += (uint64_t)d_bytes;
        }
}

/* Adds to a namespace's stats and to the tree totals. */
static inline void ns_account(rdx_tree_t *t, rdx_ns_t *s, int64_t d_tokens, int64_t d_nodes,
                              int64_t d_bytes)
{
    s->st.n_tokens += (uint64_t)d_tokens;
    s->st.n_nodes += (uint64_t)d_nodes;
    s->st.n_bytes += (uint64_t)d_bytes;
    t->total.n_tokens += (uint64_t)d_tokens;
    t->total.n_nodes += (uint64_t)d_nodes;
    t->total.n_bytes += (uint64_t)d_bytes;
}

/* Accounts a whole node (header, edge, owner bitmap; not its child table) in or out. */
static void node_account(rdx_tree_t *t, rdx_node_t *nd, int sign)
{
    int64_t nb = (int64_t)node_bytes(t, nd->cap);
    int64_t eb = nd->owners_ext ? (int64_t)t->ext_words * 8 : 0;
    ns_account(t, nd->ns, sign * (int64_t)nd->len, sign, sign * (nb + eb));
    owners_account(t, nd, sign * (int64_t)nd->len, sign, sign * nb);
}

/* 1 if owner o is in nd's set; o < max_owners is the caller's check. */
static inline int owner_bit(const rdx_node_t *nd, uint32_t o)
{
    if (o < 64)
        return (int)((nd->owners >> o) & 1);
    if (nd->owners_ext == NULL)
        return 0;
    o -= 64;
    return (int)((nd->owners_ext[o / 64] >> (o % 64)) & 1);
}

/* ---- node allocation and freeing ------------------------------------------------------- */

/* A zeroed header with room for cap edge tokens, in no heap; NULL on allocation failure.
 * Only the header and the padding are initialised: the caller packs the edge. */
static rdx_node_t *node_alloc(rdx_tree_t *t, uint32_t cap)
{
    rdx_node_t *nd = pc_malloc(node_bytes(t, cap));
    if (nd == NULL)
        return NULL;
    memset(nd, 0, sizeof *nd);
    nd->cap = cap;
    nd->exp_idx = RDX_NOIDX;
    nd->lru_idx = RDX_NOIDX;
    /* The padding is read (never used) by the vector compares; keep it defined. */
    memset(nd->edge + (size_t)cap * (size_t)t->width, 0, RDX_PAD);
    return nd;
}

/* Adds d to entries_below of nd and every ancestor up to the root: O(nodes on the path),
 * paid only when an entry mark appears or goes away. */
static void entries_add(rdx_node_t *nd, int32_t d)
{
    for (; nd != NULL; nd = nd->parent)
        nd->entries_below += (uint32_t)d;
}

/* Removes an empty namespace: out of the table, root and struct freed. Called by settle when a root
 * loses its last child. */
static void ns_drop(rdx_tree_t *t, rdx_ns_t *s)
{
    /* A deletion may shrink the map; a failed shrink keeps it as it was. */
    if (s->id == 0)
        t->ns0 = NULL;
    else
        (void)pc_u64map_del(&t->ns_map, s->id);
    t->ns_n--;
    PC_ASSERT(s->root->kids == NULL && s->st.n_nodes == 0);
    size_t root_bytes = node_bytes(t, 0);
    t->total.n_bytes -= root_bytes + sizeof(rdx_ns_t);
    pc_free(s->root);
    pc_free(s);
}

/* Frees one node with no children: unlinks it from its parent, the heaps and the accounting,
 * reports it, destroys its payload. The parent is left for settle() to look at. */
static void free_node(rdx_tree_t *t, rdx_node_t *nd, int reason)
{
    PC_ASSERT(nd->kids == NULL && nd->parent != NULL);
    if (t->p.on_free != NULL) {
        rdx_free_event_t ev = {nd->ns->id, nd, nd->depth, nd->len, nd->payload, reason};
        t->p.on_free(&ev, t->p.ud);
    }
    if (nd->payload != NULL && t->p.payload_free != NULL)
        t->p.payload_free(nd->payload, t->p.ud);
    rdx_node_t *p = nd->parent;
    rdx_kids_t *k = p->kids;
    kids_del_slot(k, kids_slot(k, first_tok(t, nd)));
    if (k->n == 0) {
        ns_account(t, nd->ns, 0, 0, -(int64_t)kids_bytes(k->cap));
        pc_free(k);
        p->kids = NULL;
    }
    if (nd->exp_idx != RDX_NOIDX)
        pc_heap_del(&t->exp, nd);
    if (nd->lru_idx != RDX_NOIDX)
        pc_heap_del(&t->lru, nd);
    if (nd->flags & NF_ENTRY)
        entries_add(p, -1);
    node_account(t, nd, -1);
    pc_free(nd->owners_ext);
    pc_free(nd);
}

/* Called after a child of p was freed: frees p and its ancestors while they are left with
 * nothing to carry (no children, unpinned, non-terminal), drops an emptied namespace, and
 * puts a node that became an unpinned leaf into the LRU heap. Adds freed tokens to *freed.
 * This is what keeps "every leaf is terminal or pinned" true after any removal, and hence
 * makes the tree hold exactly the prefixes of its terminal and pinned positions. The LRU
 * push cannot need memory: the heap has room for every node. */
static void settle(rdx_tree_t *t, rdx_node_t *p, int reason, size_t *freed)
{
    for (;;) {
        if (p->kids != NULL)
            return;
        if (p->parent == NULL) {
            ns_drop(t, p->ns);
            return;
        }
        if (p->pins > 0)
            return;
        if (p->expiry != 0) {
            pc_heap_push(&t->lru, p, p->last_access);
            return;
        }
        rdx_node_t *up = p->parent;
        *freed += p->len;
        free_node(t, p, reason);
        p = up;
    }
}

/* Frees a childless node, then settles its parent. The common step of expire, evict and
 * unpin. */
static void prune(rdx_tree_t *t, rdx_node_t *nd, int reason, size_t *freed)
{
    rdx_node_t *p = nd->parent;
    *freed += nd->len;
    free_node(t, nd, reason);
    settle(t, p, reason, freed);
}

/* Frees nd's whole subtree, nd included, bottom-up (post-order, no recursion and no stack:
 * descend to any leaf, free it, continue from its parent); does not settle nd's parent.
 * Children are always freed before their parent, so on_free can walk up from each node. */
static void free_subtree(rdx_tree_t *t, rdx_node_t *nd, int reason, size_t *freed)
{
    rdx_node_t *cur = nd;
    uint32_t from = 0; /* where to resume scanning cur's table (see kids_first_from) */
    for (;;) {
        while (cur->kids != NULL) {
            cur = kids_first_from(cur->kids, from);
            from = 0;
        }
        rdx_node_t *up = cur->parent;
        int last = cur == nd;
        uint32_t slot = last ? 0 : kids_slot(up->kids, first_tok(t, cur));
        *freed += cur->len;
        free_node(t, cur, reason);
        if (last)
            return;
        cur = up;
        from = slot;
    }
}

/* Frees every child subtree of a namespace root (the root itself stays). */
static void free_children(rdx_tree_t *t, rdx_node_t *root, int reason, size_t *freed)
{
    uint32_t from = 0;
    while (root->kids != NULL) {
        rdx_node_t *c = kids_first_from(root->kids, from);
        from = kids_slot(root->kids, first_tok(t, c));
        free_subtree(t, c, reason, freed);
    }
}

/* Sets node's own expiry to max(old, expiry) and keeps the expiry heap in step: a node
 * enters the heap when it gets a finite lifetime, moves when the lifetime grows, and leaves
 * it when the lifetime becomes RDX_EXPIRY_NEVER. Lifetimes only grow here; they end in
 * rdx_tree_expire. The push cannot need memory (room for every node). */
static void make_terminal(rdx_tree_t *t, rdx_node_t *nd, uint64_t expiry)
{
    uint64_t e = PC_MAX(nd->expiry, expiry);
    if (e == nd->expiry)
        return;
    nd->expiry = e;
    if (e == RDX_EXPIRY_NEVER) {
        if (nd->exp_idx != RDX_NOIDX)
            pc_heap_del(&t->exp, nd);
    } else if (nd->exp_idx == RDX_NOIDX) {
        pc_heap_push(&t->exp, nd, e);
    } else {
        pc_heap_update(&t->exp, nd, e);
    }
}

/* Raises last access on nd and its ancestors (never lowers it, so out-of-order times from
 * several threads' clocks cannot break "parents are never older than children"). Only nd
 * can be in the LRU heap (its ancestors have children), so only its entry moves. */
static void touch_path(rdx_tree_t *t, rdx_node_t *nd, uint64_t now)
{
    for (rdx_node_t *x = nd; x->parent != NULL; x = x->parent)
        if (x->last_access < now)
            x->last_access = now;
    if (nd->lru_idx != RDX_NOIDX)
        pc_heap_update(&t->lru, nd, nd->last_access);
}

/* ---- lifecycle ------------------------------------------------------------------------- */

rdx_tree_params_t rdx_tree_params_default(void)
{
    rdx_tree_params_t p;
    memset(&p, 0, sizeof p);
    p.vocab_size = 0;
    p.max_owners = 256;
    return p;
}

int rdx_tree_init(const rdx_tree_params_t *params, rdx_tree_t **out)
{
    if (params == NULL || out == NULL)
        return PC_ERR_INVAL;
    *out = NULL;
    if (params->max_owners == 0 || params->max_owners > RDX_MAX_OWNERS ||
        params->vocab_size > ((uint64_t)1 << 32))
        return PC_ERR_INVAL;
    rdx_tree_t *t = pc_calloc(1, sizeof *t);
    if (t == NULL)
        return PC_ERR_NOMEM;
    t->p = *params;
    uint64_t v = params->vocab_size;
    t->width = v != 0 && v <= 65536 ? 2 : v != 0 && v <= (1u << 24) ? 3 : 4;
    t->cmp = cmp_pick(t->width);
    t->ssse3 = cpu_has(1);
    t->exp.idx_off = offsetof(rdx_node_t, exp_idx);
    t->lru.idx_off = offsetof(rdx_node_t, lru_idx);
    t->ext_words = params->max_owners > 64 ? (params->max_owners - 64 + 63) / 64 : 0;
    t->owner_st = pc_calloc(params->max_owners, sizeof *t->owner_st);
    if (t->owner_st == NULL) {
        pc_free(t);
        return PC_ERR_NOMEM;
    }
    *out = t;
    return 0;
}

void rdx_tree_free(rdx_tree_t *t)
{
    if (t == NULL)
        return;
    /* Dropping the last top-level subtree drops the namespace, which changes the map: take
     * the first namespace again each time (a shrink halves the table, so the scans add up to
     * O(namespaces) slots). */
    for (;;) {
        rdx_ns_t *s = t->ns0;
        if (s == NULL) {
            size_t i = pc_u64map_next(&t->ns_map, 0);
            if (i == t->ns_map.cap)
                break;
            s = t->ns_map.slots[i].value;
        }
        size_t freed = 0;
        free_children(t, s->root, RDX_FREE_DESTROY, &freed);
        ns_drop(t, s);
    }
    pc_u64map_free(&t->ns_map);
    pc_heap_free(&t->exp);
    pc_heap_free(&t->lru);
    pc_free(t->owner_st);
    pc_free(t);
}

/* ---- match ----------------------------------------------------------------------------- */

/* The walk: at each node, one child lookup by the next query token, then one vectorised
 * compare of the rest of the child's edge. A mismatch inside an edge ends the walk there
 * (edge_offset < len); reaching the end of an edge continues from that child. The query
 * is read in place: its tokens are never packed, because a token that does not fit the
 * packed width cannot equal a stored one and the widening compare sees that. */
int rdx_tree_match(const rdx_tree_t *t, uint64_t ns, const uint32_t *tok, size_t n,
                   rdx_match_t *out)
{
    if (out == NULL || t == NULL)
        return PC_ERR_INVAL;
    memset(out, 0, sizeof *out);
    if (n == 0)
        return 0;
    if (tok == NULL)
        return PC_ERR_INVAL;
    const rdx_ns_t *s = ns_find(t, ns);
    if (s == NULL)
        return 0;
    const int w = t->width;
    const rdx_node_t *node = s->root;
    rdx_node_t *deep = NULL;
    size_t pos = 0;
    uint32_t off = 0;
    while (pos < n) {
        rdx_node_t *c = kids_find(node->kids, tok[pos]);
        if (c == NULL)
            break;
        size_t lim = PC_MIN((size_t)c->len, n - pos);
        /* The first token is equal by construction of the child lookup. */
        size_t m = 1 + t->cmp(c->edge + w, tok + pos + 1, lim - 1);
        /* deep is the node holding the last matched token, even when the match ends
         * inside its edge; the caller walks the path upward from it. */
        deep = c;
        off = (uint32_t)m;
        pos += m;
        if (m < c->len)
            break;
        /* Only a fully matched edge can end at an entry boundary. */
        if (c->flags & NF_ENTRY) {
            out->last_entry = c;
            out->entry_len = c->depth;
        }
        node = c;
    }
    out->n_matched = pos;
    out->node = deep;
    out->edge_offset = off;
    /* Covered: every position of a node with an entry at or below it is a prefix of that
     * entry. entries_below only grows going up, so the first such node upward decides.
     * Where the walk stopped inside deep's edge, an entry below deep still covers up to
     * pos because it continues along the whole edge. The upward loop runs only when the
     * match went past every live entry, i.e. rarely, and is bounded by the path length. */
    if (deep != NULL) {
        if (deep->entries_below > 0) {
            out->n_covered = pos;
        } else {
            for (const rdx_node_t *x = deep->parent; x->parent != NULL; x = x->parent)
                if (x->entries_below > 0) {
                    out->n_covered = x->depth;
                    break;
                }
        }
    }
    return 0;
}

/* ---- insert ---------------------------------------------------------------------------- */

/* Insert in four phases, so that a failure anywhere leaves the tree untouched:
 *   1. walk read-only to where the sequence leaves the tree: at the end of a node (then a
 *      leaf hangs off it), inside an edge (then that edge splits, and a leaf hangs off the
 *      upper half unless the sequence ends exactly there), or nowhere (already stored);
 *   2. validate the tokens that will be stored;
 *   3. allocate every block the commit needs and reserve heap room, then run the payload
 *      split callback, the only caller code that can fail;
 *   4. commit: link, pack, account, set lifetime, entry mark and last access.
 * At most one edge splits and at most two nodes are created per insert. */
int rdx_tree_insert(rdx_tree_t *t, uint64_t nsid, const uint32_t *tok, size_t n, uint64_t now,
                    uint64_t expiry, unsigned flags, rdx_node_t **out)
{
    return rdx_tree_insert_from(t, nsid, NULL, tok, n, now, expiry, flags, out);
}

/* rdx_tree_insert with the walk started at from (NULL: the namespace's root): step 1 reads
 * only the tokens after from's depth. */
int rdx_tree_insert_from(rdx_tree_t *t, uint64_t nsid, rdx_node_t *from, const uint32_t *tok,
                         size_t n, uint64_t now, uint64_t expiry, unsigned flags, rdx_node_t **out)
{
    if (out != NULL)
        *out = NULL;
    if (t == NULL || tok == NULL || n == 0 || expiry == 0 || (flags & ~RDX_INSERT_ENTRY) != 0)
        return PC_ERR_INVAL;
    if (n > RDX_MAX_SEQ_TOKENS)
        return PC_ERR_RANGE;
    if (from != NULL && (from->ns == NULL || from->ns->id != nsid || from->depth > n))
        return PC_ERR_INVAL;
    const int w = t->width;

    /* 1. Walk read-only: find where the sequence leaves the tree. After the loop, node is
     * the last node whose edge was fully matched (pos = its depth) and, when the sequence
     * diverges or ends inside a child's edge, split is that child and m the tokens of its
     * edge that matched (1 <= m < len). */
    rdx_ns_t *s = from != NULL ? from->ns : ns_find(t, nsid);
    rdx_node_t *node = from != NULL ? from : s != NULL ? s->root : NULL, *split = NULL;
    size_t pos = from != NULL ? from->depth : 0, m = 0;
    while (node != NULL && pos < n) {
        rdx_node_t *c = kids_find(node->kids, tok[pos]);
        if (c == NULL)
            break;
        size_t lim = PC_MIN((size_t)c->len, n - pos);
        size_t mm = 1 + t->cmp(c->edge + w, tok + pos + 1, lim - 1);
        if (mm < c->len) {
            split = c;
            m = mm;
            break;
        }
        node = c;
        pos += mm;
    }
    size_t leaf_pos = split != NULL ? pos + m : pos;
    int need_leaf = leaf_pos < n;

    /* 2. Validate what will be stored. */
    if (need_leaf && t->p.vocab_size != 0) {
        uint32_t mx = 0; /* a branch-free max the compiler vectorises */
        for (size_t i = leaf_pos; i < n; i++)
            mx = tok[i] > mx ? tok[i] : mx;
        if (mx >= t->p.vocab_size)
            return PC_ERR_RANGE;
    }
    if (split != NULL && split->payload != NULL && t->p.payload_split == NULL)
        return PC_ERR_UNSUPPORTED;

    /* 3. Allocate everything. A new namespace needs its struct, a root and maybe a bigger
     * slot array; a split needs the upper node, its 2-slot child table and a copy of the
     * owner bitmap; a new leaf needs itself and maybe a bigger child table for its parent
     * (a split's upper node already has room). */
    int rc = PC_ERR_NOMEM;
    rdx_ns_t *new_ns = NULL;
    rdx_node_t *new_root = NULL, *up = NULL, *leaf = NULL;
    rdx_kids_t *up_kids = NULL, *grown = NULL;
    uint64_t *up_ext = NULL;
    void *tail = NULL;
    if (s == NULL) {
        new_ns = pc_calloc(1, sizeof *new_ns);
        new_root = node_alloc(t, 0);
        if (new_ns == NULL || new_root == NULL)
            goto fail;
        /* Room in the map now, so that the put at the commit cannot fail. */
        if (nsid != 0 && pc_u64map_reserve(&t->ns_map, pc_u64map_count(&t->ns_map) + 1) != 0)
            goto fail;
        node = new_root;
    }
    if (split != NULL) {
        up = node_alloc(t, (uint32_t)m);
        up_kids = kids_alloc(2);
        if (up == NULL || up_kids == NULL)
            goto fail;
        if (split->owners_ext != NULL) {
            up_ext = pc_malloc((size_t)t->ext_words * 8);
            if (up_ext == NULL)
                goto fail;
        }
    }
    if (need_leaf) {
        leaf = node_alloc(t, (uint32_t)(n - leaf_pos));
        if (leaf == NULL)
            goto fail;
        if (split == NULL) {
            uint32_t have = node->kids ? node->kids->n : 0;
            uint32_t cap = kids_cap_for(have + 1);
            if (node->kids == NULL || cap != node->kids->cap) {
                grown = kids_alloc(cap);
                if (grown == NULL)
                    goto fail;
            }
        }
    }
    {
        /* Heap room for every node after this insert, so that later pushes (settle,
         * unpin, touch) never allocate. Growing an array keeps its contents, so a
         * failure after this point leaves no visible change. */
        uint64_t want = t->total.n_nodes + 2;
        if ((rc = pc_heap_reserve(&t->exp, want)) != 0 ||
            (rc = pc_heap_reserve(&t->lru, want)) != 0)
            goto fail;
        rc = PC_ERR_NOMEM;
    }
    /* Last, because the callback's success cannot be undone: the payload now covers only
     * the head and tail covers the rest. */
    if (split != NULL && split->payload != NULL) {
        rc = t->p.payload_split(split->payload, (uint32_t)m, &tail, t->p.ud);
        if (rc != 0)
            goto fail;
    }

    /* 4. Commit: nothing below can fail. */
    if (new_ns != NULL) {
        new_ns->id = nsid;
        new_ns->root = new_root;
        new_root->ns = new_ns;
        new_root->len = 0;
        new_root->depth = 0;
        if (nsid == 0) {
            t->ns0 = new_ns;
        } else {
            int put = pc_u64map_put(&t->ns_map, nsid, new_ns); /* reserved above */
            PC_ASSERT(put == 0);
        }
        t->ns_n++;
        s = new_ns;
        /* The namespace's fixed cost shows in the tree total, not in the namespace. */
        t->total.n_bytes += node_bytes(t, 0) + sizeof(rdx_ns_t);
    }
    rdx_node_t *end;
    /* The split: up takes the first m tokens and c's place under p (same key, so p's
     * table only swaps a pointer); c keeps its object, its lower tokens, its children,
     * its lifetime, pins, heap positions and entry mark, and moves under up. up is
     * non-terminal and inherits what describes the whole path: last access, the entry
     * count below, the owner set and the payload's head. */
    if (split != NULL) {
        rdx_node_t *c = split, *p = c->parent;
        uint32_t key = first_tok(t, c);
        up->parent = p;
        up->ns = s;
        up->len = (uint32_t)m;
        up->depth = c->depth - c->len + (uint32_t)m;
        memcpy(up->edge, c->edge, m * (size_t)w);
        memmove(c->edge, c->edge + m * (size_t)w, (size_t)(c->len - m) * (size_t)w);
        up->key = c->key;
        c->key = tok_get(c->edge, 0, w);
        /* c's tokens move to up: take them off here, node_account(up) adds them back. */
        ns_account(t, s, -(int64_t)m, 0, 0);
        owners_account(t, c, -(int64_t)m, 0, 0);
        c->len -= (uint32_t)m;
        c->parent = up;
        up->last_access = c->last_access;
        up->entries_below = c->entries_below;
        up->owners = c->owners;
        if (up_ext != NULL) {
            memcpy(up_ext, c->owners_ext, (size_t)t->ext_words * 8);
            up->owners_ext = up_ext;
        }
        if (c->payload != NULL) {
            up->payload = c->payload; /* now the head [0, m) */
            c->payload = tail;
        }
        up->kids = up_kids;
        /* c's new first token, which differs from the new leaf's if there is one. */
        kids_add(up_kids, first_tok(t, c), c);
        kids_ptr(p->kids)[kids_slot(p->kids, key)] = up;
        node_account(t, up, +1);
        ns_account(t, s, 0, 0, (int64_t)kids_bytes(up_kids->cap));
        node = up;
    }
    if (need_leaf) {
        if (grown != NULL) {
            int64_t d = (int64_t)kids_bytes(grown->cap);
            if (node->kids != NULL) {
                kids_rehash(grown, node->kids);
                d -= (int64_t)kids_bytes(node->kids->cap);
                pc_free(node->kids);
            }
            node->kids = grown;
            ns_account(t, s, 0, 0, d);
        }
        /* The parent stops being a leaf. */
        if (node->lru_idx != RDX_NOIDX)
            pc_heap_del(&t->lru, node);
        leaf->parent = node;
        leaf->ns = s;
        leaf->len = (uint32_t)(n - leaf_pos);
        leaf->depth = (uint32_t)n;
        edge_pack(t, leaf->edge, tok + leaf_pos, n - leaf_pos);
        leaf->key = tok[leaf_pos];
        kids_add(node->kids, tok[leaf_pos], leaf);
        node_account(t, leaf, +1);
        end = leaf;
    } else {
        end = node;
    }
    /* The end node gets (or extends) its lifetime and maybe the entry mark; the whole path
     * is touched; a new leaf joins the LRU heap with its fresh last access. */
    make_terminal(t, end, expiry);
    if ((flags & RDX_INSERT_ENTRY) && !(end->flags & NF_ENTRY)) {
        end->flags |= NF_ENTRY;
        entries_add(end, +1);
    }
    touch_path(t, end, now);
    if (leaf != NULL)
        pc_heap_push(&t->lru, leaf, leaf->last_access);
    if (out != NULL)
        *out = end;
    return need_leaf ? 0 : 1;

fail:
    /* Nothing was linked: free what phase 3 got (pc_free(NULL) is a no-op). */
    pc_free(new_ns);
    pc_free(new_root);
    pc_free(up);
    pc_free(up_kids);
    pc_free(up_ext);
    pc_free(leaf);
    pc_free(grown);
    return rc;
}

/* ---- other mutations ------------------------------------------------------------------- */

/* A read of a cached prefix: refresh the path for LRU and, when the caller passes a new
 * expiry (a TTL refresh), extend the node's own lifetime. No allocation. */
int rdx_tree_touch(rdx_tree_t *t, rdx_node_t *node, uint64_t now, uint64_t expiry)
{
    if (t == NULL || node == NULL || node->parent == NULL)
        return PC_ERR_INVAL;
    touch_path(t, node, now);
    if (expiry != 0)
        make_terminal(t, node, expiry);
    return 0;
}

/* Pops the expiry heap while its minimum is due. Each popped node loses its lifetime and
 * its entry mark; if nothing keeps it (children or pins) it is pruned, and settle frees the
 * ancestors that were only carrying it. A node whose lifetime ends while it has children
 * stays as a plain interior node: it lives as long as its longest-lived descendant, with
 * no heap entry of its own, and goes when its last child goes. Cost per expired node: one
 * heap pop plus, if freed, O(log n) heap work and the entry-count walk. */
void rdx_tree_expire(rdx_tree_t *t, uint64_t now, size_t *n_freed)
{
    size_t freed = 0;
    while (t->exp.n > 0 && t->exp.a[0].key <= now) {
        rdx_node_t *nd = (rdx_node_t *)t->exp.a[0].item;
        pc_heap_del(&t->exp, nd);
        nd->expiry = 0;
        if (nd->flags & NF_ENTRY) {
            nd->flags &= ~(uint32_t)NF_ENTRY;
            entries_add(nd, -1);
        }
        /* Children keep it alive (they are carried by it); a pin keeps it until unpinned. */
        if (nd->kids == NULL && nd->pins == 0)
            prune(t, nd, RDX_FREE_EXPIRE, &freed);
    }
    if (n_freed != NULL)
        *n_freed = freed;
}

/* Pops the LRU heap (unpinned leaves by last access) until enough tokens are freed. Each
 * prune may cascade to emptied non-terminal ancestors, which count towards the goal, and
 * may turn a terminal parent into a new LRU leaf, which then competes by its own last
 * access (never older than its children's). */
void rdx_tree_evict(rdx_tree_t *t, size_t n_tokens, size_t *n_freed)
{
    size_t freed = 0;
    while (freed < n_tokens && t->lru.n > 0)
        prune(t, (rdx_node_t *)t->lru.a[0].item, RDX_FREE_EVICT, &freed);
    if (n_freed != NULL)
        *n_freed = freed;
}

/* The node after cur in pre-order within the subtree of top (cur included in it), or NULL.
 * Uses parent pointers instead of a stack: after a leaf, climb until a node has a next
 * sibling (the next used slot of its parent's table). Iterating a whole subtree costs
 * O(nodes + table slots). */
static const rdx_node_t *succ(const rdx_tree_t *t, const rdx_node_t *top, const rdx_node_t *cur)
{
    if (cur->kids != NULL)
        return kids_any(cur->kids);
    while (cur != top) {
        const rdx_kids_t *k = cur->parent->kids;
        rdx_node_t *const *ptr = kids_ptr(k);
        for (uint32_t i = kids_slot(k, first_tok(t, cur)) + 1; i < kids_span(k); i++)
            if (ptr[i] != NULL)
                return ptr[i];
        cur = cur->parent;
    }
    return NULL;
}

/* 1 if a node of top's subtree (the root of a namespace excluded) is pinned: O(subtree),
 * which removal pays anyway. */
static int subtree_pinned(const rdx_tree_t *t, const rdx_node_t *top)
{
    for (const rdx_node_t *x = top; x != NULL; x = succ(t, top, x))
        if (x->pins > 0 && x != top->ns->root)
            return 1;
    return 0;
}

/* Removal is all or nothing: pins are checked over the whole subtree before anything is
 * freed. */
int rdx_tree_remove(rdx_tree_t *t, rdx_node_t *node)
{
    if (t == NULL || node == NULL || node->parent == NULL)
        return PC_ERR_INVAL;
    if (subtree_pinned(t, node))
        return PC_ERR_BUSY;
    rdx_node_t *p = node->parent;
    size_t freed = 0;
    free_subtree(t, node, RDX_FREE_REMOVE, &freed);
    settle(t, p, RDX_FREE_REMOVE, &freed);
    return 0;
}

/* The sequences starting with tok[0..n) are exactly the subtree of the node holding
 * position n (a match ending inside an edge still names that node: every sequence through
 * it continues along its whole edge). n == 0 clears the namespace. */
int rdx_tree_remove_prefix(rdx_tree_t *t, uint64_t ns, const uint32_t *tok, size_t n)
{
    if (t == NULL || (n > 0 && tok == NULL))
        return PC_ERR_INVAL;
    if (n == 0) {
        rdx_ns_t *s = ns_find(t, ns);
        if (s == NULL)
            return PC_ERR_NOTFOUND;
        if (subtree_pinned(t, s->root))
            return PC_ERR_BUSY;
        size_t freed = 0;
        rdx_node_t *root = s->root;
        free_children(t, root, RDX_FREE_REMOVE, &freed);
        settle(t, root, RDX_FREE_REMOVE, &freed);
        return 0;
    }
    rdx_match_t m;
    rdx_tree_match(t, ns, tok, n, &m);
    if (m.n_matched < n)
        return PC_ERR_NOTFOUND;
    return rdx_tree_remove(t, m.node);
}

/* A pinned node leaves the LRU heap; its ancestors need nothing: they are not leaves while
 * it exists. Expire may still end its lifetime, but not free it. */
int rdx_tree_pin(rdx_tree_t *t, rdx_node_t *node)
{
    if (t == NULL || node == NULL || node->parent == NULL)
        return PC_ERR_INVAL;
    if (node->pins == UINT32_MAX)
        return PC_ERR_RANGE;
    if (node->pins++ == 0 && node->lru_idx != RDX_NOIDX)
        pc_heap_del(&t->lru, node);
    return 0;
}

/* The last pin gone, a childless node either rejoins the LRU heap (it still has a
 * lifetime) or is pruned at once (its lifetime ended while pinned): leaving it would break
 * "every leaf is terminal or pinned". */
int rdx_tree_unpin(rdx_tree_t *t, rdx_node_t *node)
{
    if (t == NULL || node == NULL || node->parent == NULL)
        return PC_ERR_INVAL;
    if (node->pins == 0)
        return PC_ERR_STATE;
    if (--node->pins > 0 || node->kids != NULL)
        return 0;
    if (node->expiry == 0) {
        size_t freed = 0;
        prune(t, node, RDX_FREE_EXPIRE, &freed);
        return 1;
    }
    pc_heap_push(&t->lru, node, node->last_access);
    return 0;
}

/* No accounting: payload memory is the caller's. */
void *rdx_tree_set_payload(rdx_tree_t *t, rdx_node_t *node, void *payload)
{
    (void)t;
    void *old = node->payload;
    node->payload = payload;
    return old;
}

/* ---- owners ---------------------------------------------------------------------------- */

/* Sets the bit (the bitmap exists when needed); accounts when it was clear. Per-owner bytes
 * count the node's header and edge (not child tables or bitmaps, which would make a
 * table growth an O(owners) update). */
static void owner_set(rdx_tree_t *t, rdx_node_t *nd, uint32_t o)
{
    if (owner_bit(nd, o))
        return;
    if (o < 64) {
        nd->owners |= 1ull << o;
    } else {
        uint32_t b = o - 64;
        nd->owners_ext[b / 64] |= 1ull << (b % 64);
    }
    rdx_stats_t *st = &t->owner_st[o];
    st->n_tokens += nd->len;
    st->n_nodes += 1;
    st->n_bytes += node_bytes(t, nd->cap);
}

/* Gives nd a zeroed owner bitmap it did not have (accounting it in the namespace). The
 * bitmap stays until the node is freed, even if its owners >= 64 go. */
static void ext_attach(rdx_tree_t *t, rdx_node_t *nd, uint64_t *ext)
{
    memset(ext, 0, (size_t)t->ext_words * 8);
    nd->owners_ext = ext;
    ns_account(t, nd->ns, 0, 0, (int64_t)t->ext_words * 8);
}

/* The only allocation is the bitmap for owners >= 64, done before anything changes. */
int rdx_tree_owner_add(rdx_tree_t *t, rdx_node_t *node, uint32_t owner)
{
    if (t == NULL || node == NULL || node->parent == NULL)
        return PC_ERR_INVAL;
    if (owner >= t->p.max_owners)
        return PC_ERR_RANGE;
    if (owner >= 64 && node->owners_ext == NULL) {
        uint64_t *ext = pc_malloc((size_t)t->ext_words * 8);
        if (ext == NULL)
            return PC_ERR_NOMEM;
        ext_attach(t, node, ext);
    }
    owner_set(t, node, owner);
    return 0;
}

int rdx_tree_owner_add_path(rdx_tree_t *t, rdx_node_t *node, uint32_t owner)
{
    if (t == NULL || node == NULL || node->parent == NULL)
        return PC_ERR_INVAL;
    if (owner >= t->p.max_owners)
        return PC_ERR_RANGE;
    size_t need = 0;
    if (owner >= 64)
        for (rdx_node_t *x = node; x->parent != NULL; x = x->parent)
            need += x->owners_ext == NULL;
    if (need > 0) {
        /* All bitmaps first, in one list, so a failure leaves every node as it was. */
        uint64_t **exts = pc_calloc(need, sizeof *exts);
        if (exts == NULL)
            return PC_ERR_NOMEM;
        for (size_t i = 0; i < need; i++) {
            exts[i] = pc_malloc((size_t)t->ext_words * 8);
            if (exts[i] == NULL) {
                for (size_t j = 0; j < i; j++)
                    pc_free(exts[j]);
                pc_free(exts);
                return PC_ERR_NOMEM;
            }
        }
        size_t i = 0;
        for (rdx_node_t *x = node; x->parent != NULL; x = x->parent)
            if (x->owners_ext == NULL)
                ext_attach(t, x, exts[i++]);
        pc_free(exts);
    }
    for (rdx_node_t *x = node; x->parent != NULL; x = x->parent)
        owner_set(t, x, owner);
    return 0;
}

/* Never allocates; the bitmap is kept. */
int rdx_tree_owner_del(rdx_tree_t *t, rdx_node_t *node, uint32_t owner)
{
    if (t == NULL || node == NULL || node->parent == NULL)
        return PC_ERR_INVAL;
    if (owner >= t->p.max_owners)
        return PC_ERR_RANGE;
    if (!owner_bit(node, owner))
        return 0;
    if (owner < 64) {
        node->owners &= ~(1ull << owner);
    } else {
        uint32_t b = owner - 64;
        node->owners_ext[b / 64] &= ~(1ull << (b % 64));
    }
    rdx_stats_t *st = &t->owner_st[owner];
    st->n_tokens -= node->len;
    st->n_nodes -= 1;
    st->n_bytes -= node_bytes(t, node->cap);
    return 0;
}

int rdx_tree_owner_has(const rdx_tree_t *t, const rdx_node_t *node, uint32_t owner)
{
    return owner < t->p.max_owners && owner_bit(node, owner);
}

/* Scans the inline word, then the bitmap a word at a time with count-trailing-zeros. */
int64_t rdx_tree_owner_next(const rdx_tree_t *t, const rdx_node_t *node, uint32_t from)
{
    if (from < 64) {
        uint64_t bits = node->owners & (~0ull << from);
        if (bits != 0)
            return __builtin_ctzll(bits);
        from = 64;
    }
    if (node->owners_ext == NULL)
        return -1;
    for (uint32_t b = from - 64; b < t->ext_words * 64; b = (b / 64 + 1) * 64) {
        uint64_t bits = node->owners_ext[b / 64] & (~0ull << (b % 64));
        if (bits != 0)
            return 64 + (int64_t)(b / 64) * 64 + __builtin_ctzll(bits);
    }
    return -1;
}

/* ---- accessors ------------------------------------------------------------------------- */

/* Read-only views of a node for callers (and for on_free callbacks). The root of a
 * namespace is never handed out: rdx_node_parent stops below it. */

size_t rdx_node_depth(const rdx_node_t *node)
{
    return node->depth;
}
uint32_t rdx_node_len(const rdx_node_t *node)
{
    return node->len;
}
rdx_node_t *rdx_node_parent(const rdx_node_t *node)
{
    return node->parent != NULL && node->parent->parent != NULL ? node->parent : NULL;
}
uint64_t rdx_node_ns(const rdx_node_t *node)
{
    return node->ns->id;
}
void *rdx_node_payload(const rdx_node_t *node)
{
    return node->payload;
}
uint32_t rdx_node_pins(const rdx_node_t *node)
{
    return node->pins;
}
uint64_t rdx_node_expiry(const rdx_node_t *node)
{
    return node->expiry;
}
uint64_t rdx_node_last_access(const rdx_node_t *node)
{
    return node->last_access;
}
int rdx_node_is_entry(const rdx_node_t *node)
{
    return (node->flags & NF_ENTRY) != 0;
}
uint32_t rdx_node_n_children(const rdx_node_t *node)
{
    return node->kids ? node->kids->n : 0;
}

size_t rdx_node_tokens(const rdx_tree_t *t, const rdx_node_t *node, uint32_t *dst)
{
    for (uint32_t i = 0; i < node->len; i++)
        dst[i] = tok_get(node->edge, i, t->width);
    return node->len;
}

size_t rdx_node_prefix(const rdx_tree_t *t, const rdx_node_t *node, uint32_t *dst)
{
    for (const rdx_node_t *x = node; x->parent != NULL; x = x->parent)
        rdx_node_tokens(t, x, dst + (x->depth - x->len));
    return node->depth;
}

/* ---- accounting ------------------------------------------------------------------------ */

int rdx_tree_ns_stats(const rdx_tree_t *t, uint64_t ns, rdx_stats_t *out)
{
    const rdx_ns_t *s = ns_find(t, ns);
    if (s == NULL) {
        memset(out, 0, sizeof *out);
        return PC_ERR_NOTFOUND;
    }
    *out = s->st;
    return 0;
}

int rdx_tree_owner_stats(const rdx_tree_t *t, uint32_t owner, rdx_stats_t *out)
{
    if (owner >= t->p.max_owners) {
        memset(out, 0, sizeof *out);
        return PC_ERR_RANGE;
    }
    *out = t->owner_st[owner];
    return 0;
}

/* Bytes the tree holds outside any namespace: its struct, the namespace map's slots, the heap
 * arrays and the per-owner stats (namespace structs and roots are in t->total already). */
static size_t fixed_bytes(const rdx_tree_t *t)
{
    return sizeof *t + t->ns_map.cap * sizeof(pc_u64map_slot_t) +
           ((size_t)t->exp.cap + t->lru.cap) * sizeof(pc_heap_ent_t) +
           (size_t)t->p.max_owners * sizeof(rdx_stats_t);
}

void rdx_tree_stats(const rdx_tree_t *t, rdx_stats_t *out)
{
    *out = t->total;
    out->n_bytes += fixed_bytes(t);
}

size_t rdx_tree_ns_count(const rdx_tree_t *t)
{
    return t->ns_n;
}
int rdx_tree_token_width(const rdx_tree_t *t)
{
    return t->width;
}

/* ---- iteration ------------------------------------------------------------------------- */

void rdx_iter_init(rdx_iter_t *it, const rdx_tree_t *t, uint64_t ns)
{
    const rdx_ns_t *s = ns_find(t, ns);
    it->_tree = t;
    it->_root = s != NULL ? s->root : NULL;
    it->_next = s != NULL ? kids_any(s->root->kids) : NULL;
}

rdx_node_t *rdx_iter_next(rdx_iter_t *it)
{
    const rdx_node_t *cur = it->_next;
    if (cur == NULL)
        return NULL;
    it->_next = succ(it->_tree, it->_root, cur);
    return (rdx_node_t *)cur;
}

/* ---- dump ------------------------------------------------------------------------------ */

/* The dump is meant for humans and for tests that compare two states of a tree (the
 * failing-allocator test compares dumps before and after a failed mutation), so it prints
 * every field that defines the tree's observable state, in a canonical order. */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* One line per node, then its children sorted by key, recursively (depth of recursion =
 * nodes on the longest path). */
static void dump_node(const rdx_tree_t *t, const rdx_node_t *nd, int level, FILE *f)
{
    if (nd->parent != NULL) {
        fprintf(f, "%*s[d=%" PRIu32 " len=%" PRIu32 "]", level * 2, "", nd->depth, nd->len);
        for (uint32_t i = 0; i < nd->len; i++)
            fprintf(f, " %" PRIu32, tok_get(nd->edge, i, t->width));
        fprintf(f, " | exp=%" PRIu64 " last=%" PRIu64 " pins=%" PRIu32 "%s ent=%" PRIu32 " pl=%p",
                nd->expiry, nd->last_access, nd->pins, (nd->flags & NF_ENTRY) ? " ENTRY" : "",
                nd->entries_below, nd->payload);
        if (nd->owners != 0 || nd->owners_ext != NULL) {
            fprintf(f, " own=");
            for (int64_t o = rdx_tree_owner_next(t, nd, 0); o >= 0;
                 o = rdx_tree_owner_next(t, nd, (uint32_t)o + 1))
                fprintf(f, "%" PRId64 ",", o);
        }
        fputc('\n', f);
    }
    if (nd->kids == NULL)
        return;
    /* Children in key order, so the dump does not depend on hash-table layout. */
    uint32_t nk = nd->kids->n;
    uint64_t *keys = pc_malloc(sizeof(uint64_t) * nk);
    if (keys == NULL) {
        fprintf(f, "%*s(out of memory listing children)\n", level * 2, "");
        return;
    }
    uint32_t j = 0;
    for (uint32_t i = 0; i < kids_span(nd->kids); i++)
        if (kids_ptr(nd->kids)[i] != NULL)
            keys[j++] = kids_key(nd->kids)[i];
    qsort(keys, nk, sizeof *keys, cmp_u64);
    for (uint32_t i = 0; i < nk; i++)
        dump_node(t, kids_find(nd->kids, (uint32_t)keys[i]), level + 1, f);
    pc_free(keys);
}

void rdx_tree_dump(const rdx_tree_t *t, FILE *f)
{
    fprintf(f,
            "rdx tree: width=%d namespaces=%" PRIu32 " nodes=%" PRIu64 " tokens=%" PRIu64
            " bytes=%" PRIu64 " exp_heap=%" PRIu32 " lru_heap=%" PRIu32 "\n",
            t->width, t->ns_n, t->total.n_nodes, t->total.n_tokens, t->total.n_bytes, t->exp.n,
            t->lru.n);
    uint64_t *ids = pc_malloc(sizeof(uint64_t) * (t->ns_n + 1));
    if (ids == NULL) {
        fprintf(f, "(out of memory listing namespaces)\n");
        return;
    }
    uint32_t j = 0;
    if (t->ns0 != NULL)
        ids[j++] = 0;
    for (size_t i = pc_u64map_next(&t->ns_map, 0); i < t->ns_map.cap;
         i = pc_u64map_next(&t->ns_map, i + 1))
        ids[j++] = t->ns_map.slots[i].key;
    qsort(ids, j, sizeof *ids, cmp_u64);
    for (uint32_t i = 0; i < j; i++) {
        const rdx_ns_t *s = ns_find(t, ids[i]);
        fprintf(f, "ns %" PRIu64 ": nodes=%" PRIu64 " tokens=%" PRIu64 " bytes=%" PRIu64 "\n",
                s->id, s->st.n_nodes, s->st.n_tokens, s->st.n_bytes);
        dump_node(t, s->root, 0, f);
    }
    pc_free(ids);
}

/* ---- invariants checker ---------------------------------------------------------------- */

/* rdx_tree_check recomputes everything the tree maintains incrementally and compares: the
 * structure (parents, depths, keys, child tables in both modes), the lifetime rules (leaves
 * terminal or pinned, entry marks on terminal nodes), both heaps (order, membership,
 * positions, keys), last-access monotonicity, entry counts, and the accounting per
 * namespace, per owner and in total. Tests run it after every operation. */

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            if (len > 0)                                                                           \
                snprintf(err, len, __VA_ARGS__);                                                   \
            rc = PC_ERR_INTERNAL;                                                                  \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

/* Heap order and the node-side index of every entry. */
static int check_heap(const rdx_heap_t *h, const char *name, char *err, size_t len)
{
    int rc = 0;
    CHECK(h->n <= h->cap, "%s heap: n %" PRIu32 " > cap %" PRIu32, name, h->n, h->cap);
    for (uint32_t i = 0; i < h->n; i++) {
        CHECK(*heap_idx(h, h->a[i].item) == i, "%s heap: entry %" PRIu32 " has index %" PRIu32,
              name, i, *heap_idx(h, h->a[i].item));
        if (i > 0)
            CHECK(h->a[(i - 1) / PC_HEAP_D].key <= h->a[i].key, "%s heap: order broken at %" PRIu32,
                  name, i);
    }
done:
    return rc;
}

int rdx_tree_check(const rdx_tree_t *t, char *err, size_t len)
{
    int rc = 0;
    rdx_stats_t *own = NULL;
    rdx_stats_t total = {0, 0, 0};
    uint64_t n_exp = 0, n_lru = 0, n_fixed = 0;
    uint32_t ns_seen = 0;
    if (len > 0)
        err[0] = '\0';
    own = pc_calloc(t->p.max_owners, sizeof *own);
    CHECK(own != NULL, "out of memory while checking");
    if ((rc = check_heap(&t->exp, "expiry", err, len)) != 0 ||
        (rc = check_heap(&t->lru, "lru", err, len)) != 0)
        goto done;
    /* Slot "cap" of the walk stands for namespace 0, kept beside the map. */
    for (size_t si = 0; si <= t->ns_map.cap; si++) {
        const rdx_ns_t *s = si < t->ns_map.cap ? t->ns_map.slots[si].value : t->ns0;
        if (s == NULL)
            continue;
        ns_seen++;
        CHECK(ns_find(t, s->id) == s, "ns %" PRIu64 ": not reachable by lookup", s->id);
        const rdx_node_t *root = s->root;
        CHECK(root->parent == NULL && root->len == 0 && root->depth == 0 && root->ns == s,
              "ns %" PRIu64 ": bad root", s->id);
        CHECK(root->kids != NULL && root->kids->n > 0, "ns %" PRIu64 ": empty namespace kept",
              s->id);
        CHECK(root->exp_idx == RDX_NOIDX && root->lru_idx == RDX_NOIDX && root->pins == 0,
              "ns %" PRIu64 ": root in a heap or pinned", s->id);
        rdx_stats_t st = {0, 0, 0};
        n_fixed += node_bytes(t, 0) + sizeof(rdx_ns_t);
        for (const rdx_node_t *x = root; x != NULL; x = succ(t, root, x)) {
            uint64_t entries = (x->flags & NF_ENTRY) ? 1 : 0;
            if (x->kids != NULL) {
                const rdx_kids_t *k = x->kids;
                CHECK(k->n > 0 && k->n <= k->cap,
                      "node d=%" PRIu32 ": child table n %" PRIu32 " cap %" PRIu32, x->depth, k->n,
                      k->cap);
                CHECK(k->cap <= KIDS_LINEAR_MAX || (k->cap & (k->cap - 1)) == 0,
                      "node d=%" PRIu32 ": hash capacity not a power of two", x->depth);
                st.n_bytes += kids_bytes(k->cap);
                uint32_t used = 0;
                for (uint32_t i = 0; i < kids_span(k); i++) {
                    const rdx_node_t *c = kids_ptr(k)[i];
                    if (c == NULL) {
                        CHECK(k->cap > KIDS_LINEAR_MAX,
                              "node d=%" PRIu32 ": hole in sorted "
                              "child array",
                              x->depth);
                        continue;
                    }
                    used++;
                    uint32_t key = kids_key(k)[i];
                    CHECK(c->parent == x, "child of d=%" PRIu32 " has another parent", x->depth);
                    CHECK(c->len >= 1, "child of d=%" PRIu32 " has an empty edge", x->depth);
                    CHECK(key == c->key && key == tok_get(c->edge, 0, t->width),
                          "child key %" PRIu32 " != first token %" PRIu32, key,
                          tok_get(c->edge, 0, t->width));
                    CHECK(kids_find(k, key) == c, "child key %" PRIu32 " not found by lookup", key);
                    if (k->cap <= KIDS_LINEAR_MAX && i > 0)
                        CHECK(kids_key(k)[i - 1] < key, "child array not sorted at %" PRIu32, i);
                    CHECK(c->last_access <= x->last_access || x->parent == NULL,
                          "child d=%" PRIu32 " newer (%" PRIu64 ") than its parent (%" PRIu64 ")",
                          c->depth, c->last_access, x->last_access);
                    entries += c->entries_below;
                }
                CHECK(used == k->n, "node d=%" PRIu32 ": child count %" PRIu32 " != %" PRIu32,
                      x->depth, used, k->n);
            }
            CHECK(x->entries_below == entries,
                  "node d=%" PRIu32 ": entries_below %" PRIu32 " != %" PRIu64, x->depth,
                  x->entries_below, entries);
            if (x == root)
                continue;
            CHECK(x->ns == s, "node d=%" PRIu32 ": wrong namespace", x->depth);
            CHECK(x->len <= x->cap, "node d=%" PRIu32 ": len > cap", x->depth);
            CHECK(x->depth == x->parent->depth + x->len,
                  "node d=%" PRIu32 ": depth != parent "
                  "%" PRIu32 " + len %" PRIu32,
                  x->depth, x->parent->depth, x->len);
            CHECK(x->kids != NULL || x->expiry != 0 || x->pins > 0,
                  "leaf d=%" PRIu32 " is neither terminal nor pinned", x->depth);
            CHECK(!(x->flags & NF_ENTRY) || x->expiry != 0, "entry d=%" PRIu32 " not terminal",
                  x->depth);
            if (t->p.vocab_size != 0)
                for (uint32_t i = 0; i < x->len; i++)
                    CHECK(tok_get(x->edge, i, t->width) < t->p.vocab_size, "token out of range");
            int want_exp = x->expiry != 0 && x->expiry != RDX_EXPIRY_NEVER;
            CHECK(want_exp == (x->exp_idx != RDX_NOIDX),
                  "node d=%" PRIu32 ": expiry heap "
                  "membership wrong",
                  x->depth);
            if (want_exp) {
                CHECK(x->exp_idx < t->exp.n && t->exp.a[x->exp_idx].item == x &&
                          t->exp.a[x->exp_idx].key == x->expiry,
                      "node d=%" PRIu32 ": expiry heap entry wrong", x->depth);
                n_exp++;
            }
            int want_lru = x->kids == NULL && x->pins == 0;
            CHECK(want_lru == (x->lru_idx != RDX_NOIDX),
                  "node d=%" PRIu32 ": lru heap "
                  "membership wrong",
                  x->depth);
            if (want_lru) {
                CHECK(x->lru_idx < t->lru.n && t->lru.a[x->lru_idx].item == x &&
                          t->lru.a[x->lru_idx].key == x->last_access,
                      "node d=%" PRIu32 ": lru heap entry wrong", x->depth);
                n_lru++;
            }
            size_t nb = node_bytes(t, x->cap);
            st.n_tokens += x->len;
            st.n_nodes += 1;
            st.n_bytes += nb + (x->owners_ext ? (size_t)t->ext_words * 8 : 0);
            for (int64_t o = rdx_tree_owner_next(t, x, 0); o >= 0;
                 o = rdx_tree_owner_next(t, x, (uint32_t)o + 1)) {
                CHECK(o < t->p.max_owners, "owner %" PRId64 " out of range", o);
                own[o].n_tokens += x->len;
                own[o].n_nodes += 1;
                own[o].n_bytes += nb;
            }
        }
        CHECK(st.n_tokens == s->st.n_tokens && st.n_nodes == s->st.n_nodes &&
                  st.n_bytes == s->st.n_bytes,
              "ns %" PRIu64 ": stats tokens/nodes/bytes %" PRIu64 "/%" PRIu64 "/%" PRIu64
              " != recount %" PRIu64 "/%" PRIu64 "/%" PRIu64,
              s->id, s->st.n_tokens, s->st.n_nodes, s->st.n_bytes, st.n_tokens, st.n_nodes,
              st.n_bytes);
        total.n_tokens += st.n_tokens;
        total.n_nodes += st.n_nodes;
        total.n_bytes += st.n_bytes;
    }
    CHECK(ns_seen == t->ns_n, "namespace count %" PRIu32 " != %" PRIu32, t->ns_n, ns_seen);
    CHECK(n_exp == t->exp.n, "expiry heap holds %" PRIu32 " entries, %" PRIu64 " expected",
          t->exp.n, n_exp);
    CHECK(n_lru == t->lru.n, "lru heap holds %" PRIu32 " entries, %" PRIu64 " expected", t->lru.n,
          n_lru);
    CHECK(total.n_tokens == t->total.n_tokens && total.n_nodes == t->total.n_nodes &&
              total.n_bytes + n_fixed == t->total.n_bytes,
          "tree totals differ from the namespaces");
    CHECK(t->total.n_nodes <= (uint64_t)t->exp.cap && t->total.n_nodes <= (uint64_t)t->lru.cap,
          "heap room below the node count");
    for (uint32_t o = 0; o < t->p.max_owners; o++)
        CHECK(own[o].n_tokens == t->owner_st[o].n_tokens &&
                  own[o].n_nodes == t->owner_st[o].n_nodes &&
                  own[o].n_bytes == t->owner_st[o].n_bytes,
              "owner %" PRIu32 ": stats differ from recount", o);
done:
    pc_free(own);
    return rc;
}
