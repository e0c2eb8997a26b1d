/*
 * backend.h — the compute backend interface: a table of function pointers (ggml's
 * ggml_backend_i), so the CUDA backend of a later issue plugs in beside the CPU one.
 *
 * A backend runs one forward step of a model over a batch of sequences. Each sequence brings
 * its new tokens, the position of the first one, and its block table in the KV pool; the table
 * already covers every new position (the engine reserved the blocks, copy-on-write included),
 * so a backend never allocates KV blocks: it writes the new tokens' K and V into the blocks and
 * attends over positions [0, pos0 + n_tokens) of each sequence. Logits are produced only for
 * the rows asked for, in batch order.
 *
 * The CPU backend (backend_cpu.c) is always built and is the oracle the others are compared
 * with. A backend object is used by one thread at a time (the engine serializes forward steps);
 * it may run its own worker threads inside a call.
 */
#ifndef ENG_BACKEND_H
#define ENG_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h" /* enum eng_logits_mode, enum eng_kv_dtype */

struct eng_model;      /* model.h */
struct eng_kvpool;     /* kvpool.h */
struct eng_sample_row; /* sampling.h */

/* What supports() can be asked about. */
enum eng_backend_op {
    ENG_BACKEND_OP_FORWARD = 0, /* a whole forward step; `type` is a weight type */
    ENG_BACKEND_OP_MATMUL = 1,  /* a matrix product with weights of type `type` */
    ENG_BACKEND_OP_KV = 2,      /* a KV cache element type (enum eng_kv_dtype) */
};

/* One sequence of a forward step. */
typedef struct eng_fwd_seq {
    const int32_t *tokens;  /* [n_tokens], every id < n_vocab */
    uint32_t n_tokens;      /* >= 1 */
    uint32_t pos0;          /* position of tokens[0]: the tokens already in the KV cache */
    const uint32_t *blocks; /* [n_blocks] block ids covering positions [0, pos0 + n_tokens) */
    uint32_t n_blocks;
    enum eng_logits_mode logits;
} eng_fwd_seq_t;

typedef struct eng_backend eng_backend_t;

typedef struct eng_backend_i {
    /* A static name ("cpu"). */
    const char *(*name)(const eng_backend_t *be);
    /* Releases the backend and everything it allocated. */
    void (*free)(eng_backend_t *be);
    /* True when the backend can compute `op` for element type `type`. */
    bool (*supports)(const eng_backend_t *be, enum eng_backend_op op, uint32_t type);
    /* (optional) Memory the backend computes from (host memory for the CPU backend). Returns 0
     * with *out owned by the caller (release with buf_free), or PC_ERR_NOMEM. */
    int (*buf_alloc)(eng_backend_t *be, size_t n_bytes, void **out);
    void (*buf_free)(eng_backend_t *be, void *buf);
    /* One forward step over seqs[n_seqs]. logits receives [n_rows][n_vocab] floats, rows in
     * batch order (ENG_LOGITS_LAST: one row; ALL: n_tokens rows). The sum of n_tokens must not
     * exceed the max_tokens the backend was created for. Returns 0, PC_ERR_INVAL or
     * PC_ERR_NOMEM; on error the KV contents of the new positions are unspecified (the engine
     * does not advance the sequences then). */
    int (*forward)(eng_backend_t *be, const struct eng_model *model, struct eng_kvpool *kv,
                   const eng_fwd_seq_t *seqs, uint32_t n_seqs, float *logits);
    /* (optional) forward, but the logits rows stay in the backend's memory: row r is sampled
     * there under rows[r] (sampling.h's exact rules with the draw given) and only the token
     * crosses back, to tokens[r] (-1 when no logit of the row is a candidate). rows and tokens
     * have one entry per logits row forward would write. Same returns as forward. NULL when
     * the backend samples nowhere but on the host (the CPU backend). */
    int (*forward_sample)(eng_backend_t *be, const struct eng_model *model, struct eng_kvpool *kv,
                          const eng_fwd_seq_t *seqs, uint32_t n_seqs,
                          const struct eng_sample_row *rows, int32_t *tokens);
    /* (optional) Waits for queued work; the CPU backend is synchronous. */
    void (*synchronize)(eng_backend_t *be);
    /* (optional) KV tier transfers (the G2 host tier), for a backend whose KV blocks live in its
     * own memory: whole blocks between the backend's pool and host memory laid out as
     * [n][block_bytes] (blocks[i] <-> host + i * block_bytes), enqueued on the backend's copy
     * stream without waiting, after the steps enqueued so far; *fence says when they are done
     * (kv_fence). The backend orders its own later work after a transfer that touches its
     * blocks (a step, a copy-on-write copy, a poisoning), so the engine may unreference, reuse
     * or compute with a block right after enqueuing; only the host memory must stay valid (to
     * the device: unchanged) until the fence is done. host should come from host_alloc (pinned)
     * for the copies to overlap. Return 0, PC_ERR_INVAL (a block out of range; nothing
     * enqueued) or PC_ERR_INTERNAL. NULL on the CPU backend, whose blocks are the pool's host
     * memory: eng_backend_kv_to_host copies them there. */
    int (*kv_to_host)(eng_backend_t *be, const uint32_t *blocks, uint32_t n, void *host,
                      uint64_t *fence);
    int (*kv_from_host)(eng_backend_t *be, const uint32_t *blocks, uint32_t n, const void *host,
                        uint64_t *fence);
    /* (optional, with kv_to_host) 1 when every transfer up to fence is done, 0 while one is in
     * flight; with wait, blocks until it is done. PC_ERR_INVAL (a fence not issued) or
     * PC_ERR_INTERNAL (a failed copy). Fence 0 is always done. */
    int (*kv_fence)(eng_backend_t *be, uint64_t fence, bool wait);
    /* (optional) Host memory the transfers run from asynchronously (pinned, cudaHostAlloc): the
     * G2 tier's memory. Returns 0 or PC_ERR_NOMEM; host_free(NULL) is a no-op. */
    int (*host_alloc)(eng_backend_t *be, size_t n_bytes, void **out);
    void (*host_free)(eng_backend_t *be, void *p);
} eng_backend_i;

struct eng_backend {
    const eng_backend_i *iface;
    void *ctx;
};

/* Parameters of the CPU backend. */
typedef struct eng_cpu_params {
    uint32_t n_threads;    /* worker threads including the caller; >= 1 */
    uint32_t max_tokens;   /* the largest batch (sum of n_tokens) a forward step takes */
    uint32_t block_tokens; /* the KV pool's block size */
    bool no_simd;          /* force the portable C kernels (tests compare both paths) */
    bool bf16;             /* BF16 GEMMs for prefill where the path is avx512 and the CPU has
                              AVX512-BF16: the backend packs the layer matrices as BF16 panels
                              at init (its own layout; the model keeps the file's) */
    bool bf16_skip_f32;    /* with bf16: not the matrices stored as F32 in the file */
    uint32_t isa;          /* enum eng_cpu_isa (cpu.h), the kernels' path; 0 (AUTO) is the best
                              this CPU runs, and one it cannot run is lowered to that */
} eng_cpu_params_t;

/* Creates the CPU backend for `model` (scratch sized for p->max_tokens). Sets OpenBLAS to one
 * thread: the backend parallelizes GEMMs itself over its own pool, so the two never
 * oversubscribe the cores. Returns 0, PC_ERR_INVAL or PC_ERR_NOMEM. */
int eng_backend_cpu_init(const struct eng_model *model, const eng_cpu_params_t *p,
                         eng_backend_t **out);
/* True when the CPU backend be packed BF16 panels (its prefill GEMMs run in BF16). */
bool eng_backend_cpu_gemm_bf16(const eng_backend_t *be);

/* Parameters of the CUDA backend (engine/cuda/backend_cuda.c, built only with KVGW_HAVE_CUDA). */
typedef struct eng_cuda_params {
    int device;            /* CUDA device index */
    uint32_t max_tokens;   /* the largest batch (sum of n_tokens) a forward step takes */
    uint32_t block_tokens; /* the KV pool's block size */
    uint32_t split_kv;     /* decode attention: KV positions per split (0: 512) */
    bool kv_poison;        /* fill newly allocated device blocks with NaN (tests) */
} eng_cuda_params_t;

/* Creates the CUDA backend (CUDA builds only): uploads the model's weights (F16 as stored; F32,
 * BF16 and Q8_0 widened to F32 row by row at upload, then converted to F16, or to BF16 where a
 * value exceeds the F16 range), allocates a device KV pool
 * mirroring `kv` block for block (same ids and layout) and installs kv's hooks so block copies
 * and poisoning reach it. The backend must be freed before kv. Returns 0, PC_ERR_UNSUPPORTED
 * (no CUDA device, or a shape the kernels do not take), PC_ERR_INVAL or PC_ERR_NOMEM (device
 * memory), with a one-line reason in err. */
int eng_backend_cuda_init(const struct eng_model *model, struct eng_kvpool *kv,
                          const eng_cuda_params_t *p, eng_backend_t **out, char *err,
                          size_t err_len);

/* eng_cuda_stats_t and eng_cuda_stats_get (what the CUDA backends did): engine.h. */

/*
 * KV tier transfers over every backend (backend_xfer.c): the backend's kv_to_host /
 * kv_from_host where it has them (cuda: the copy stream), else a copy from or to the pool's
 * host memory (cpu: done on return, fence 0). kv is the pool the backend computes with. Same
 * contract and returns as the table's entries: the host memory stays valid until
 * eng_backend_kv_fence(be, *fence, ...) says done. One thread at a time, the engine's (the
 * thread that runs forward steps): the I/O between host memory and disk runs elsewhere.
 */
int eng_backend_kv_to_host(eng_backend_t *be, struct eng_kvpool *kv, const uint32_t *blocks,
                           uint32_t n, void *host, uint64_t *fence);
int eng_backend_kv_from_host(eng_backend_t *be, struct eng_kvpool *kv, const uint32_t *blocks,
                             uint32_t n, const void *host, uint64_t *fence);
/* 1 done, 0 in flight (never with wait), or a negative error; backends without a copy stream:
 * 1 for fence 0, PC_ERR_INVAL otherwise. */
int eng_backend_kv_fence(eng_backend_t *be, uint64_t fence, bool wait);
/* True when the backend keeps KV blocks in its own memory and has a copy stream to host memory
 * (a G2 host tier is worth having); false on the CPU backend, whose pool is host memory. */
bool eng_backend_has_kv_xfer(const eng_backend_t *be);
/* Host memory for the transfers (the G2 tier's): the backend's pinned memory where it has it,
 * else pc_malloc'ed memory aligned to 4096 bytes (so O_DIRECT reads can target it). Returns 0
 * or PC_ERR_NOMEM; eng_backend_host_free(be, NULL) is a no-op. */
int eng_backend_host_alloc(eng_backend_t *be, size_t n_bytes, void **out);
void eng_backend_host_free(eng_backend_t *be, void *p);

/*
 * The G2 tier's memory: fixed-size pieces (one record's payload each) carved from large chunks
 * of eng_backend_host_alloc memory (pinned on cuda), taken as needed up to max_bytes and kept
 * until eng_host_slab_free. Pinning memory costs about a millisecond per call and freeing
 * pinned memory synchronizes the whole device, so a tier that allocated a record at a time
 * would stall every step; pieces go back to the slab's free list instead. Pieces are aligned
 * to 4096 bytes (O_DIRECT reads from the disk tier can land in them). Thread-safe (a mutex):
 * the tier store may take and return pieces from any thread.
 */
typedef struct eng_host_slab eng_host_slab_t;

/* A slab of piece_bytes pieces (rounded up to 4096) over at most max_bytes. Nothing is
 * allocated yet. Returns 0, PC_ERR_INVAL (piece_bytes 0, or max_bytes below one piece) or
 * PC_ERR_NOMEM. be must outlive the slab. */
int eng_host_slab_init(eng_backend_t *be, size_t piece_bytes, uint64_t max_bytes,
                       eng_host_slab_t **out);
/* Returns every chunk to the backend. Every piece must have been put back or be unused from
 * now on. NULL is a no-op. */
void eng_host_slab_free(eng_host_slab_t *s);
/* A piece, or NULL when max_bytes is spent or memory ran out (the caller evicts or goes
 * without). The shape of kvtier.h's host_alloc: bytes above the piece size get NULL. */
void *eng_host_slab_alloc(void *slab, size_t bytes);
/* Puts a piece back (kvtier.h's host_free; bytes unused). NULL is a no-op. */
void eng_host_slab_release(void *slab, void *piece, size_t bytes);
/* Pieces handed out now, and bytes taken from the backend so far. */
void eng_host_slab_usage(eng_host_slab_t *s, uint64_t *pieces_used, uint64_t *bytes_reserved);

/* Convenience wrappers over the table. eng_backend_free(NULL) is a no-op. */
static inline const char *eng_backend_name(const eng_backend_t *be)
{
    return be->iface->name(be);
}
static inline void eng_backend_free(eng_backend_t *be)
{
    if (be != NULL)
        be->iface->free(be);
}

#endif
