/*
 * kvpool.h — the paged KV cache: a fixed pool of fixed-size blocks (engine-internal).
 *
 * A block holds the keys and values of block_tokens consecutive positions of one sequence, for
 * every layer and KV head. All blocks are allocated once, at init, from the memory budget (a
 * number of tokens or of bytes): the pool never allocates KV memory afterwards. A no_storage
 * pool allocates none at all and only does the accounting, for a backend that keeps the
 * blocks' contents in its own memory (the cuda backend, through the hooks). Block layout,
 * for block b, layer l, KV head h, with F16 or F32 elements:
 *
 *   base + ((b * n_layer + l) * n_head_kv + h) * 2 * head_dim * block_tokens * elem_bytes
 *     K:  [head_dim][block_tokens]   transposed: one row holds a dimension of every token, so
 *                                    16 scores are one vector of FMAs over head_dim
 *     V:  [block_tokens][head_dim]   follows K
 *
 * With ENG_KV_Q8_0 (head_dim a multiple of 32), K and V are both per-token rows of head_dim / 32
 * q8_0 blocks (ggml's block_q8_0: F16 scale d, then 32 int8 quants; value = d * q):
 *
 *   base + ((b * n_layer + l) * n_head_kv + h) * 2 * block_tokens * row_bytes,
 *   row_bytes = head_dim / 32 * 34
 *     K:  [block_tokens][head_dim / 32] q8_0 blocks
 *     V:  [block_tokens][head_dim / 32] q8_0 blocks, follows K
 *
 * K is not transposed here, because a q8_0 block must run along one token's head dimensions:
 * (1) each position's row is quantized alone, once, when it is written, so its bytes do not
 * depend on how the prompt was split into steps or which positions came from a cached prefix
 * (cached equals cold, bit for bit), and (2) a score is then an integer dot product of the
 * query, quantized once per step to q8_0 too, with K's int8 quants, 32 products per block and
 * one scale multiply, as ggml's vec_dot_q8_0_q8_0 (llama.cpp's -ctk q8_0 on the CPU). A
 * transposed q8_0 K (blocks of 32 positions of one dimension) would requantize a block at every
 * write into it and make the quantized KV depend on the step boundaries.
 *
 * Blocks are reference-counted. A block is either free (refcount 0, on the free list) or
 * referenced by one or more owners: sequences (eng_kvseq_t block tables) and the prefix index.
 * A sequence writes only into blocks it owns alone: eng_kvseq_reserve copies a shared, partially
 * filled last block before the sequence writes into it (copy-on-write). Full shared blocks are
 * never written again.
 *
 * When the free list is empty, alloc asks the eviction hook (the prefix index) to release cached
 * blocks; if nothing can be released the caller gets PC_ERR_NOSPACE and nothing changed.
 *
 * Not thread-safe: the engine serializes every call.
 */
#ifndef ENG_KVPOOL_H
#define ENG_KVPOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h" /* enum eng_kv_dtype */

#define ENG_KV_BLOCK_TOKENS_DEFAULT 16
/* Bytes of a q8_0 KV block: an F16 scale and ENG_QK8_0 (32) int8 quants. */
#define ENG_KV_Q8_0_BYTES 34

/* Quantizes x[n] (n a multiple of 32) into n / 32 q8_0 blocks at dst, as ggml's
 * quantize_row_q8_0_ref: per block amax = max |x|, d = amax / 127, q = round(x / d) (half away
 * from zero), d stored as F16 (0 for an all-zero block). The one quantizer of the KV cache and of
 * the attention's query on every ISA path, so the bytes never depend on the path. */
void eng_kv_q8_0_quantize(const float *x, uint32_t n, uint8_t *dst);
/* The inverse: n / 32 q8_0 blocks at src into y[n] as d * q (exact in F32). */
void eng_kv_q8_0_dequantize(const uint8_t *src, uint32_t n, float *y);

typedef struct eng_kvpool_params {
    uint32_t block_tokens;   /* tokens per block, default 16 */
    enum eng_kv_dtype dtype; /* default F16 */
    uint64_t max_tokens;     /* budget in tokens (rounded down to whole blocks), or 0 */
    uint64_t max_bytes;      /* budget in bytes, or 0; when both are set the smaller wins */
    bool poison;             /* fill allocated blocks with NaN (tests: stray reads fail) */
    bool no_storage;         /* block accounting only: no host memory for the blocks, whose
                                contents live in a mirror (the cuda backend's device pool);
                                eng_kvpool_kv is then NULL and poisoning and copies reach only
                                the hooks. Default false */
} eng_kvpool_params_t;

eng_kvpool_params_t eng_kvpool_params_default(void);

typedef struct eng_kvpool eng_kvpool_t;

/* The eviction hook: release at least n_blocks blocks if possible (by unreferencing cached
 * blocks). Returns the number of blocks that became free. */
typedef uint32_t (*eng_kvpool_evict_fn)(void *ud, uint32_t n_blocks);

/* Creates a pool for a model shape. The number of blocks is the budget over the dtype's block
 * bytes (a byte budget holds 64/34 as many q8_0 positions as F16 ones). Returns 0, PC_ERR_INVAL
 * (no budget, a budget below one block, an unknown dtype, q8_0 with head_dim % 32 != 0) or
 * PC_ERR_NOMEM. */
int eng_kvpool_init(const eng_kvpool_params_t *p, uint32_t n_layer, uint32_t n_head_kv,
                    uint32_t head_dim, eng_kvpool_t **out);
void eng_kvpool_free(eng_kvpool_t *pool);

void eng_kvpool_set_evict(eng_kvpool_t *pool, eng_kvpool_evict_fn fn, void *ud);

/* A mirror of the pool's memory elsewhere (the cuda backend keeps the blocks in device memory
 * with the same ids and layout) follows the block operations that touch contents: on_alloc runs
 * after a block was taken (and poisoned, in a poisoning pool), on_copy before eng_kvpool_copy
 * copies. The hooks cannot fail; a mirror records its own errors. NULL removes them. */
typedef struct eng_kvpool_hooks {
    void (*on_alloc)(void *ud, uint32_t block);
    void (*on_copy)(void *ud, uint32_t dst, uint32_t src, uint32_t n_tokens);
    /* A whole block's bytes (eng_kvpool_block_bytes, the pool's layout) to host memory dst, and
     * from host memory src into the block (the KV tiers' write-back and loads). Return 0 or a
     * negative error. Needed by a mirror of a no_storage pool for tiers; may be NULL. */
    int (*read_block)(void *ud, uint32_t block, void *dst);
    int (*write_block)(void *ud, uint32_t block, const void *src);
    void *ud;
} eng_kvpool_hooks_t;

void eng_kvpool_set_hooks(eng_kvpool_t *pool, const eng_kvpool_hooks_t *hooks);

/* False for a no_storage pool (its blocks have no host memory). */
bool eng_kvpool_has_storage(const eng_kvpool_t *pool);
uint32_t eng_kvpool_block_tokens(const eng_kvpool_t *pool);
enum eng_kv_dtype eng_kvpool_dtype(const eng_kvpool_t *pool);
uint32_t eng_kvpool_n_blocks(const eng_kvpool_t *pool);
uint32_t eng_kvpool_n_free(const eng_kvpool_t *pool);
size_t eng_kvpool_block_bytes(const eng_kvpool_t *pool);
/* Bytes of one position's K (or V) of one (layer, KV head): head_dim x 2 or 4, or head_dim / 32
 * x 34 for q8_0. */
size_t eng_kvpool_row_bytes(const eng_kvpool_t *pool);
/* Bytes of one block of dtype for a model shape (every layer and KV head, K and V), or 0 when
 * the dtype is unknown or cannot hold the shape (q8_0 with head_dim % 32 != 0). What
 * eng_kvpool_init sizes the pool by. */
size_t eng_kvpool_block_bytes_for(enum eng_kv_dtype dtype, uint32_t block_tokens, uint32_t n_layer,
                                  uint32_t n_head_kv, uint32_t head_dim);

/* Takes a free block (refcount 1), evicting through the hook when none is free. Returns 0,
 * or PC_ERR_NOSPACE (nothing changed). */
int eng_kvpool_alloc(eng_kvpool_t *pool, uint32_t *block);
/* Adds a reference to a referenced block. */
void eng_kvpool_ref(eng_kvpool_t *pool, uint32_t block);
/* Drops a reference; the block returns to the free list at zero. */
void eng_kvpool_unref(eng_kvpool_t *pool, uint32_t block);
uint32_t eng_kvpool_refcount(const eng_kvpool_t *pool, uint32_t block);

/* Copies the first n_tokens positions of src into dst (every layer and head): through the
 * on_copy hook, then in host memory unless the pool is no_storage. */
void eng_kvpool_copy(eng_kvpool_t *pool, uint32_t dst, uint32_t src, uint32_t n_tokens);

/* Copies the whole block b (block_bytes, every layer and head) to host memory dst, or host
 * memory src into it: memcpy with host storage, else through the mirror's read_block /
 * write_block hook. Return 0, or PC_ERR_UNSUPPORTED (no storage and no hook) or the hook's
 * error. */
int eng_kvpool_block_read(const eng_kvpool_t *pool, uint32_t b, void *dst);
int eng_kvpool_block_write(eng_kvpool_t *pool, uint32_t b, const void *src);

/* The K part of (block, layer, kv head): [head_dim][block_tokens]; V follows it:
 * [block_tokens][head_dim] (q8_0: K [block_tokens] rows of eng_kvpool_row_bytes, V the same
 * after it). Valid until eng_kvpool_free. NULL for a no_storage pool. */
void *eng_kvpool_kv(const eng_kvpool_t *pool, uint32_t block, uint32_t layer, uint32_t head);

/* Accounting check: expected_refs[n_blocks] holds the references the owners know of. Returns 0
 * when every block's refcount equals it, the free list holds exactly the blocks at zero (once
 * each) and the counters agree; else PC_ERR_INTERNAL with the first mismatch in err. */
int eng_kvpool_check(const eng_kvpool_t *pool, const uint32_t *expected_refs, char *err,
                     size_t err_len);

/* ---------------------------------------------------------------------------------------------
 * Per-sequence block tables.
 * ------------------------------------------------------------------------------------------- */

/* A sequence's block table: blocks[i] holds positions [i * block_tokens, (i+1) * block_tokens).
 * Caller-allocated; eng_kvseq_init/eng_kvseq_close. */
typedef struct eng_kvseq {
    uint32_t *blocks;
    uint32_t n_blocks;
    uint32_t n_tokens; /* positions holding valid KV */
    size_t cap;        /* of blocks */
} eng_kvseq_t;

void eng_kvseq_init(eng_kvseq_t *s);
/* Unreferences every block and empties the table (the struct can be reused). */
void eng_kvseq_close(eng_kvseq_t *s, eng_kvpool_t *pool);

/* Starts an empty sequence from shared blocks holding n_tokens positions (a cached prefix):
 * references blocks[0 .. ceil(n_tokens / block_tokens)). A partial last block stays shared
 * until the sequence writes into it (copy-on-write in reserve). Returns 0, PC_ERR_STATE (s is
 * not empty) or PC_ERR_NOMEM. */
int eng_kvseq_share(eng_kvseq_t *s, eng_kvpool_t *pool, const uint32_t *blocks, uint32_t n_tokens);

/* Makes positions [n_tokens, n_tokens + n_new) writable by this sequence alone: copies a shared
 * partial last block, then allocates the blocks the new positions need. n_tokens itself does not
 * move (the caller commits with s->n_tokens += n_new after computing). Returns 0, or
 * PC_ERR_NOSPACE / PC_ERR_NOMEM with the table exactly as before. */
int eng_kvseq_reserve(eng_kvseq_t *s, eng_kvpool_t *pool, uint32_t n_new);

/* Drops blocks past what n_tokens positions need (after a failed step or a truncation). */
void eng_kvseq_trim(eng_kvseq_t *s, eng_kvpool_t *pool);

#endif
