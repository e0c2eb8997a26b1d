/*
 * engine.h — the inference engine core: a model, a paged KV cache and a backend.
 *
 *   eng_params_t p = eng_params_default();
 *   p.model_path = "models/kvgw-demo.gguf";
 *   eng_t *e; eng_init(&p, &e, err, sizeof err);
 *   eng_seq_t *s; eng_seq_create(e, &s);
 *   eng_batch_item_t it = {.seq = s, .tokens = ids, .n_tokens = n, .logits = ENG_LOGITS_LAST};
 *   eng_forward(e, &it, 1, logits);          // logits: [1][n_vocab]
 *   ... eng_seq_free(e, s); eng_free(e);
 *
 * A forward step takes a batch that mixes prefill chunks and single decode tokens of different
 * sequences; each sequence continues at its own position with its own block table. The engine
 * reserves the KV blocks of every item first (evicting cached blocks if needed), and only then
 * computes: a step that does not fit changes nothing.
 *
 * Threads: an eng_t is used by one thread at a time (the worker's); it runs its own compute
 * threads inside eng_forward.
 */
#ifndef ENG_ENGINE_H
#define ENG_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "hparams.h"

struct eng_sample_row; /* sampling.h */

/* The element type of the KV cache. ENG_KV_Q8_0 is ggml's q8_0 block (an F16 scale d and 32
 * int8 quants q, value d * q; 34 bytes per 32 values, 34/64 of F16's bytes), quantized per
 * token along head_dim (kvpool.h has the layout); it needs head_dim % 32 == 0. */
enum eng_kv_dtype {
    ENG_KV_F16 = 0,
    ENG_KV_F32 = 1,
    ENG_KV_Q8_0 = 2,
};

/* "f16", "f32" or "q8_0" (a static string; "?" for a value outside the enum). */
const char *eng_kv_dtype_name(enum eng_kv_dtype t);
/* Parses "f16", "f32" or "q8_0" into *out. Returns 0 or PC_ERR_INVAL (*out unchanged). */
int eng_kv_dtype_parse(const char *s, enum eng_kv_dtype *out);

/* Which logits a sequence of the batch wants. */
enum eng_logits_mode {
    ENG_LOGITS_NONE = 0,
    ENG_LOGITS_LAST = 1, /* one row: the last new token */
    ENG_LOGITS_ALL = 2,  /* one row per new token */
};

/* Load progress: called on the loading thread after each layer, with the layers loaded so far
 * and in all (for a progress display; it must not call back into the model). */
typedef void (*eng_load_progress_fn)(uint32_t done, uint32_t total, void *ud);

/* The precision of the CPU backend's matrix products over 32 or more rows (prefill). BF16
 * GEMMs (VDPBF16PS, F32 accumulation) run at about twice the F32 rate on CPUs with AVX512-BF16;
 * activations and weights are rounded to 8 significant bits, so logits move by about 1e-2
 * relative to the F32 path (F16 weights are already rounded to 11 bits; llama.cpp also computes
 * F16-weight products in reduced precision). Steps of fewer than 32 rows (decode batches)
 * always take the F16/F32 GEMV, which reads the weights as stored. */
enum eng_gemm_mode {
    ENG_GEMM_AUTO = 0, /* BF16 for F16 and BF16 weight matrices when the CPU has AVX512-BF16
                          and SIMD is on; F32 otherwise, so F32 weights always keep the exact F32
                          path. Quantized weights (Q8_0, Q4_0, the K-quants, ...) take integer
                          products on x quantized to 8 bits in every mode, as llama.cpp does */
    ENG_GEMM_F32 = 1,  /* always F32 (sgemm, or F16 tiles converted to F32) */
    ENG_GEMM_BF16 = 2, /* BF16 for every layer matrix, F32 ones included, where the CPU has
                          AVX512-BF16 (F32 elsewhere) */
};

/* The KV tiers below the pool (tier.h). Off unless dir is set. */
typedef struct eng_tier_params {
    const char *dir;      /* the disk tier's directory (created 0700), or NULL / "": no tiers.
                             Not kept past eng_init */
    uint64_t max_bytes;   /* its byte budget (LRU eviction of records); 0 = 1 GiB */
    const uint8_t *key;   /* [32] at-rest key (XChaCha20-Poly1305), or NULL: checksums only;
                             copied at eng_init */
    bool write_through;   /* write retained prefixes at retain time (default true) */
    uint32_t min_tokens;  /* write back evicted prefixes of at least this many tokens
                             (default 64; tier.h says why) */
    uint64_t g2_bytes;    /* the host-memory tier G2 (tier.h), in front of the disk tier
                             (0: off, the default; needs dir). Pinned memory on CUDA; on CPU
                             it only adds a second level of host memory */
    uint64_t queue_bytes; /* staging budget of queued writes and prefetched reads
                             (default 64 MiB) */
    bool load_always;     /* tests, benchmarks: load every tier block the cost model would
                             recompute (default false) */
    uint32_t io_threads;  /* the tiers' I/O threads: reads of one prompt run in parallel
                             (default 8; 0 = 8) */
    /* Orderly shutdown (eng_free): the unpinned prefixes still in the pool are written back
     * (least recently used first, min_tokens applies) for at most shutdown_ms milliseconds
     * and shutdown_bytes bytes (0 = the disk budget), so a clean restart keeps every hit. */
    uint32_t shutdown_ms;    /* default 3000; 0 = write nothing at shutdown */
    uint64_t shutdown_bytes; /* default 0 */
    /* Tests only (NULL otherwise): called before each disk read of a record (on an I/O thread
     * for prefetches, or on the engine's thread), with no tier lock held, so a test can hold a
     * read there and observe what runs while it is pending. */
    void (*before_read)(void *ud);
    void *before_read_ud;
} eng_tier_params_t;

typedef struct eng_params {
    const char *model_path;
    uint32_t n_threads;         /* compute threads, default 2 */
    enum eng_kv_dtype kv_dtype; /* default F16 */
    uint32_t kv_block_tokens;   /* default 16 */
    uint64_t kv_max_tokens;     /* KV budget in tokens (default 65536); 0 = use kv_max_bytes */
    uint64_t kv_max_bytes;      /* KV budget in bytes, or 0; the smaller of the two wins */
    uint32_t max_batch_tokens;  /* tokens per internal forward step (default 512); longer
                                   batches are computed in successive steps */
    bool weights_f32;           /* convert F16 weights to F32 at load */
    enum eng_gemm_mode gemm;    /* the GEMM precision of prefill (default ENG_GEMM_AUTO) */
    bool kv_poison;             /* tests: NaN in unwritten KV slots */
    const char *backend; /* "cpu" (default, also for NULL), "cuda" (an error where the build or
                            the machine has no CUDA), or "auto" (cuda when a GPU is usable,
                            else cpu) */
    int cuda_device;     /* the CUDA device of the cuda backend, default 0 */
    bool host_sampling;  /* never sample on the backend's device (eng_forward_sample refused;
                            tests compare the two), default false */
    bool no_simd;        /* tests: portable kernels only */
    const char *cpu_isa; /* the CPU kernels' path: "avx512", "avx2", "portable" or "auto"; NULL
                            or "" reads KVGW_CPU_ISA, unset means the best this CPU runs (chosen
                            by cpuid at run time). A path the CPU cannot run is refused:
                            eng_init returns PC_ERR_UNSUPPORTED with the reason. Not kept. */
    eng_load_progress_fn load_progress; /* model loading progress; NULL: none */
    void *load_progress_ud;
    eng_tier_params_t tier; /* KV tiers (tier.h); default off */
} eng_params_t;

eng_params_t eng_params_default(void);

typedef struct eng eng_t;
typedef struct eng_seq eng_seq_t;

/* Loads the model and creates the KV pool and the backend p->backend names. Returns 0, PC_ERR_INVAL
 * (bad parameters), PC_ERR_IO / PC_ERR_FORMAT / PC_ERR_UNSUPPORTED (model file) or PC_ERR_NOMEM,
 * with a one-line reason in err. */
int eng_init(const eng_params_t *p, eng_t **out, char *err, size_t err_len);

/* Releases the engine. Every sequence must have been freed. NULL is a no-op. */
void eng_free(eng_t *e);

/* The model's hyper-parameters; valid until eng_free. */
const eng_hparams_t *eng_hparams(const eng_t *e);
uint32_t eng_n_vocab(const eng_t *e);
/* The model file (its metadata: general.name, the tokenizer's vocabulary, the file size), read
 * only; valid until eng_free. */
const eng_gguf_t *eng_model_gguf(const eng_t *e);

/* Bytes of the weight matrices one decode step reads: every layer's attention and FFN matrices
 * and the output head, each at the type the model holds it in (a quantized file's own blocks,
 * F16 or F32 after --weights-f32), the token embedding not counted (one row per token). What
 * bounds decode on a memory-bound machine. */
double eng_decode_weight_bytes(const eng_t *e);

/* The KV pool's geometry and occupancy. */
typedef struct eng_kv_stats {
    uint32_t block_tokens; /* tokens per block */
    uint32_t n_blocks;     /* blocks in the pool */
    uint32_t n_free;       /* blocks no sequence and no cached prefix holds */
    uint32_t n_cached;     /* blocks only the prefix index holds (used by no live sequence):
                              what eviction can free */
    size_t block_bytes;    /* bytes of one block's K and V over every layer */
    enum eng_kv_dtype dtype;
    uint64_t bytes_per_token; /* block_bytes / block_tokens: K and V of one position, every
                                 layer (F16 2 x n_layer x n_head_kv x head_dim x 2 bytes; q8_0
                                 34/64 of that) */
    uint64_t capacity_tokens; /* n_blocks x block_tokens: the positions the pool holds */
} eng_kv_stats_t;

/* Fills *out. O(n_blocks + the live sequences' blocks), for n_cached. */
void eng_kv_stats(eng_t *e, eng_kv_stats_t *out);
const char *eng_backend_name_of(const eng_t *e);
/* Why backend "auto" runs on the CPU ("cuda unavailable: <reason>", for example a driver older
 * than the toolkit, also logged as a warning at eng_init), or "" when it did not fall back.
 * Valid until eng_free. */
const char *eng_backend_note_of(const eng_t *e);
/* "bf16" when the CPU backend computes prefill GEMMs in BF16 (eng_params.gemm resolved against
 * the model and the CPU), else "f32". A static string. */
const char *eng_gemm_name_of(const eng_t *e);
/* The ISA path the CPU backend's kernels run ("avx512", "avx2" or "portable"; "none" for another
 * backend). A static string. */
const char *eng_cpu_isa_name_of(const eng_t *e);
/* The best ISA path this CPU runs (what an engine with cpu_isa "auto" picks), as above. */
const char *eng_cpu_isa_best_name(void);
/* Parses "auto", "f32" or "bf16" into *out. Returns 0 or PC_ERR_INVAL (*out unchanged). */
int eng_gemm_mode_parse(const char *s, enum eng_gemm_mode *out);

/* A new empty sequence. Returns 0 or PC_ERR_NOMEM. */
int eng_seq_create(eng_t *e, eng_seq_t **out);
/* Releases a sequence and its references to KV blocks. NULL is a no-op. */
void eng_seq_free(eng_t *e, eng_seq_t *s);
/* Positions of the sequence that hold KV. */
uint32_t eng_seq_n_tokens(const eng_seq_t *s);
/* The tokens of those positions; valid until the next eng_forward or eng_seq_free. */
const int32_t *eng_seq_tokens(const eng_seq_t *s);

/* One item of a forward batch: new tokens for one sequence. */
typedef struct eng_batch_item {
    eng_seq_t *seq;
    const int32_t *tokens; /* [n_tokens] */
    uint32_t n_tokens;     /* >= 1 */
    enum eng_logits_mode logits;
} eng_batch_item_t;

/* Rows of logits a batch produces (LAST: 1, ALL: n_tokens, NONE: 0). */
uint32_t eng_batch_n_rows(const eng_batch_item_t *items, uint32_t n_items);

/*
 * Computes the new tokens of every item, in one or more internal steps of at most
 * max_batch_tokens tokens, and writes the requested logits to logits[n_rows][n_vocab] (rows in
 * item order; logits may be NULL when no row is asked for). On success each item's sequence
 * grows by its n_tokens.
 *
 * Returns 0; 1 when the KV pool cannot hold the new tokens even after evicting cached blocks
 * (nothing changed); PC_ERR_INVAL (an empty item, a token id out of range, a sequence twice in
 * the batch, a sequence past the model's position limit) with nothing changed; or another
 * negative error, after which the items' sequences are as before the call.
 */
int eng_forward(eng_t *e, const eng_batch_item_t *items, uint32_t n_items, float *logits);

/* True when eng_forward_sample runs: the backend samples on its device (cuda) and the engine
 * was not created with host_sampling. */
bool eng_samples_on_device(const eng_t *e);

/*
 * eng_forward, but the logits stay on the backend's device: each row eng_forward would write
 * (eng_batch_n_rows, in the same order) is sampled there under rows[r] (engine/sampling.h's
 * exact rules, with the draw from eng_sampler_peek), and only tokens[r] comes back; -1 when no
 * logit of the row is a candidate. The pick equals eng_sampler_sample's on the same logits.
 * Returns as eng_forward, or PC_ERR_UNSUPPORTED with nothing changed where
 * eng_samples_on_device is false (the caller then uses eng_forward and samples on the host).
 */
int eng_forward_sample(eng_t *e, const eng_batch_item_t *items, uint32_t n_items,
                       const struct eng_sample_row *rows, int32_t *tokens);

/* Checks KV accounting: every block is free or referenced exactly as many times as live
 * sequences (and the prefix index) hold it. Returns 0 or PC_ERR_INTERNAL with the reason. */
int eng_check(eng_t *e, char *err, size_t err_len);

/* The prefix index (token prefixes -> KV blocks, pins and their expiry). */
#include "prefix.h"
/* The KV tiers below the pool (host memory, disk). */
#include "tier.h"

/* What the CUDA backends of this process did, summed over every backend object since the
 * process started (CUDA builds only; counters only grow, so a benchmark reads them before and
 * after a phase). The step's path is chosen at backend creation from the environment, so a
 * GPU session can bisect: KVGW_CUDA_FUSED=0 runs the unfused kernels and separate GEMMs,
 * KVGW_CUDA_PACKED=0 uploads each per-step list with its own copy, KVGW_CUDA_GRAPHS=0 never
 * captures or replays a CUDA graph (graphs need the packed upload). */
typedef struct eng_cuda_stats {
    uint64_t steps;              /* forward steps */
    uint64_t launches;           /* launching calls the host made: kernel entry points (krn_*),
                                    cuBLAS GEMMs and graph launches, each counted 1 */
    uint64_t device_ops;         /* what the device ran: the nodes of a replayed graph (kernels,
                                    copies, memsets, exact), else the launching calls (an entry
                                    point that launches two kernels counts 1) */
    uint64_t uploads;            /* host-to-device copies of per-step lists */
    uint64_t graph_replays;      /* steps run by replaying a captured graph */
    uint64_t graph_captures;     /* steps captured (then replayed) */
    uint64_t graph_updates;      /* of those, captures that updated an existing graph in place */
    uint64_t graph_failures;     /* captures that failed (the backend then stops capturing) */
    uint64_t host_ns;            /* host time from a step's start to its last enqueue (before
                                    waiting for the device) */
    uint64_t decode_steps;       /* steps whose decode rows (all of a decode step's, a mixed
                                    step's leading ones) ran the split-KV decode kernel
                                    (krn_decode_attention) rather than krn_attention's plan */
    uint64_t weight_bytes_quant; /* device bytes of weight matrices uploaded as their quantized
                                    blocks (the file's bytes, never widened) */
    uint64_t weight_bytes_wide;  /* device bytes of weight matrices uploaded as F16 or BF16 */
} eng_cuda_stats_t;
void eng_cuda_stats_get(eng_cuda_stats_t *out);

#endif
