/*
 * tier.h — KV tiers below the pool: where cached KV goes when it leaves G1 (the KV pool), and
 * how a sequence gets it back. engine.h includes it; the code is engine/tier.c over the tier
 * store (engine/kvtier.h: records, names, the budget).
 *
 *   G1  the KV pool (device memory on CUDA, host memory on CPU): engine/prefix.h's index.
 *   G2  host memory (eng_tier_params.g2_bytes; pinned buffers on CUDA, copied on the backend's
 *       copy stream, overlapped with compute). Meant for the CUDA backend; allowed on the CPU
 *       backend when configured (default 0 there): its pool is host memory already, so G2 only
 *       helps there as a larger second level in front of the disk.
 *   G3  a local directory with a byte budget, every backend. G2 sits in front of it: the
 *       tiers are on when G3's directory is set.
 *
 * Names. A tier holds whole blocks, one record per block, named by a chain: name_0 = H(seed,
 * tokens of block 0), name_i = H(name_{i-1}, tokens of block i), where the seed hashes the model
 * fingerprint (eng_model_fingerprint: the whole file, weights included), the KV dtype, the
 * pool's layout version, block_tokens and the namespace. So a record serves exactly one
 * (model, namespace, token prefix) and nothing matches across namespaces or models.
 *
 * Writes (write-back). When the prefix index evicts a prefix (LRU or pressure), every whole
 * block of it that no tier holds yet is copied to a staging buffer on the calling thread (a
 * memcpy, or the backend's device-to-host copy) and written by the engine's writer thread. The
 * staging queue is bounded (eng_tier_params.queue_bytes): a block that finds it full is not
 * written and is counted (write_dropped), so the scheduler never waits on the disk. Retained
 * prefixes are written through at retain time (write_through), so a crash loses nothing a
 * customer paid to keep. Records land parent first in queue order, except that a prefix-index
 * leaf leaves the pool before its parent node: such a record is linked to its parent when that
 * arrives, so listings and events keep its whole path.
 *
 * G2. With g2_bytes > 0, a block an eviction writes back goes to G2 first: it is copied out of
 * the pool into a pinned staging piece (eng_backend_kv_to_host: the copy stream on CUDA, a
 * memcpy on CPU) and inserted into G2's store once eng_backend_kv_fence says the copy is done,
 * checked without waiting at the engine's next tier call (the scheduler never waits for it).
 * G2 has its own LRU budget: a block it evicts to make room goes down to G3 through the write
 * queue (write-back; the min_tokens filter was applied when it left G1), or vanishes when the
 * queue is full. Write-through (retained prefixes) and the shutdown drain go straight to G3,
 * and the drain also writes G2's blocks down (G2 is memory: nothing of it survives a restart).
 * A read takes a G2 block before a disk copy: the record is lent (eng_kvtier_host_ref), copied
 * into the pool block (eng_backend_kv_from_host; on CUDA the compute stream orders its steps
 * after the copy) and given back once its fence is done. Eviction events say ENG_TIER_G2 when
 * every dropped block went to G2 (ENG_TIER_G3 when each is in G2 or G3); a block G2 drops is
 * reported through eng_tier_poll with the tier it is now in (G3 or none). The cost model's G2
 * figure is the copy time per block: measured exactly on CPU (a memcpy); on CUDA from a
 * start's first copy to its last fence when that is done by the end of the start (an upper
 * bound; never a fence seen later, which would time other steps); untimed counts as unknown,
 * and unknown favours the copy.
 *
 * Shutdown. eng_free (the worker's orderly shutdown) first writes back the unpinned prefixes
 * still in the pool, least recently used first, under the min_tokens filter, waiting for
 * staging room instead of dropping, for at most eng_tier_params.shutdown_ms and shutdown_bytes
 * (then the queued writes finish: at most queue_bytes more). A clean restart so keeps every hit
 * that fit; a crash keeps what was already written (and the retained prefixes).
 *
 * What is worth keeping. A prefix shorter than min_tokens is not written back (retained
 * prefixes always are). We chose the minimum-length rule (HiCache's 256-token prefetch
 * threshold, LMCache's min_retrieve_tokens) over "seen twice" (vLLM's store_threshold, KVBM's
 * disk frequency): the gateway pins what customers ask to keep and write-through covers those,
 * and a "seen twice" rule would lose every long prefix evicted after its first use (the
 * sglang#39444 complaint). Measured on this project's CPU backend (test_tier prints it), a
 * block's disk read costs 0.3-1 ms against 1-3.5 ms to recompute it on the small test models
 * and about 60 ms on kvgw-bench (16 tokens at ~250 tokens/s), so loads win for any length;
 * what a short prefix costs is churn: a record, a file and budget for a prompt that is cheap
 * to recompute. Default 64 tokens (four blocks).
 *
 * Reads. eng_seq_start_cached (prefix.h) continues its G1 match into the tiers block by block
 * along the chain: a run of blocks a tier holds is loaded into fresh pool blocks; a hole (blocks
 * no tier holds, followed by blocks one does) is recomputed exactly (a forward of the hole's
 * tokens at its position, attending to the blocks before it, no logits), and the blocks after
 * it are loaded. The KV of position t depends only on tokens <= t, so the result equals a cold
 * prefill within the backend's tolerance. A block G2 holds is copied from there (G2 before
 * G3, block by block). Per run, a cost model decides load vs recompute (a G2 run at G2's
 * measured time per block, copies one after another; a disk run as follows):
 * load_ns = ceil(blocks / io_threads) * the measured time of one block's read (the I/O threads
 * read a run in parallel), recompute_ns = tokens / the measured prefill rate * (1 + r * p) /
 * (1 + r * p_m): the attention term, with p the run's mean position, p_m the mean position the
 * rate was measured at, and r the attention's work per earlier position over the layer
 * matrices' per token, from the model's shapes (inputs exported in eng_tier_stats). Blocks
 * already staged by a prefetch cost only a copy.
 *
 * Load speed. A read is one preadv per record (head and payload; O_DIRECT where the file
 * system takes it, the open outside the store's lock) straight into the sequence's pool block
 * on a host-memory pool (no bounce copy, the checksum runs there), with io_threads reads in
 * flight while the engine's thread recomputes the holes before them. Measured here on
 * kvgw-bench (128 KiB blocks, page cache dropped; a virtio disk doing 0.53 GB/s of sequential
 * 1 MiB O_DIRECT reads): one read at a time reaches about 0.2 GB/s, eight in flight 0.4-0.55
 * GB/s, so io_threads defaults to 8.
 * A record that fails its checks is deleted, counted (corrupt) and treated as a hole.
 *
 * Async. eng_tier_prefetch starts the reads of a prompt's tier blocks on the I/O threads (in
 * parallel) into host staging buffers; the caller keeps stepping other sequences until
 * eng_tier_ready, then calls eng_seq_start_cached, which finds the staged blocks and only copies
 * them.
 *
 * Restart. The store rebuilds its index from the directory at eng_init; eng_tier_prefixes lists
 * the longest chains it holds per namespace (for the worker's SNAPSHOT).
 *
 * Threads: every call here is made by the engine's thread (the one that calls eng_forward),
 * except eng_tier_ready, which any thread may call. In particular a ticket is freed on the
 * engine's thread (eng_seq_start_cached reads the live tickets without a lock); a thread that
 * waits for eng_tier_ready hands the ticket back to the engine's thread to free it. The I/O
 * threads touch only the store and their queues.
 */
#ifndef ENG_TIER_H
#define ENG_TIER_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"

/* Tiers as the wire reports them (engine/wire.h KV_EVENT and SNAPSHOT tier bytes). */
enum eng_tier {
    ENG_TIER_NONE = 0, /* in no tier */
    ENG_TIER_G1 = 1,   /* the KV pool */
    ENG_TIER_G2 = 2,   /* host memory (CUDA backend) */
    ENG_TIER_G3 = 3,   /* the local disk directory */
};

/* The model's fingerprint: XXH3-64 of the whole model file, tensor data included, so two models
 * with the same shapes and other weights never pass for one another. Computed once (one
 * streaming read of the file, at eng_init when tiers are on, else at the first call) and kept.
 * Returns 0, or PC_ERR_IO (the file cannot be read, or changed since it was loaded) /
 * PC_ERR_NOMEM with the reason in err. */
int eng_model_fingerprint(eng_t *e, uint64_t *out, char *err, size_t err_len);

/* True when the engine was created with a tier (eng_params.tier.dir set). */
bool eng_tier_enabled(const eng_t *e);

/* Where a sequence's cached positions came from, as set by eng_seq_start_cached (all zero for a
 * sequence started otherwise). g1 + g2 + g3 + recomputed is the n_reused it returned. */
typedef struct eng_seq_origin {
    uint32_t g1_tokens;         /* shared from the pool (the prefix index's match) */
    uint32_t g2_tokens;         /* loaded from host memory (CUDA G2) */
    uint32_t g3_tokens;         /* loaded from the disk tier */
    uint32_t recomputed_tokens; /* holes recomputed exactly so that later tier blocks could be
                                   loaded (and runs the cost model chose to recompute) */
} eng_seq_origin_t;

void eng_seq_origin(const eng_seq_t *s, eng_seq_origin_t *out);

/* The tiers' counters (they only grow, except the held bytes/blocks) and the cost model's
 * inputs. All zero without tiers. */
typedef struct eng_tier_stats {
    uint64_t g3_bytes, g3_blocks;          /* held in the disk tier now */
    uint64_t g3_max_bytes;                 /* its budget */
    uint64_t g2_bytes, g2_blocks;          /* held in host memory (G2) now */
    uint64_t hit_blocks_g2, hit_blocks_g3; /* blocks served to sequences from each tier */
    uint64_t miss_blocks;         /* blocks looked for past the G1 match and found nowhere */
    uint64_t load_blocks;         /* blocks read from the disk tier (prefetch included) */
    uint64_t load_bytes, load_ns; /* and their bytes and read time */
    uint64_t write_blocks;        /* records written (write-back and write-through) */
    uint64_t write_bytes, write_ns;
    uint64_t write_dropped;            /* blocks not written: the staging queue was full */
    uint64_t write_filtered;           /* blocks not written: their prefix was below min_tokens */
    uint64_t write_errors;             /* writes the store refused (disk full, I/O error) */
    uint64_t evictions;                /* records the store dropped for its budget */
    uint64_t corrupt;                  /* records found bad (checksum, tag, header) and deleted */
    uint64_t recomputed_tokens;        /* hole tokens recomputed by eng_seq_start_cached */
    uint64_t recompute_avoided_tokens; /* tokens loaded from a tier instead of prefilled */
    uint64_t queue_bytes;              /* staged write bytes waiting for the I/O thread now */
    double load_bytes_per_s;           /* measured (EWMA) load bandwidth: a prompt's blocks read
                                          in parallel over the wall time of their reads (one
                                          block's size over its read time until then) */
    double prefill_tokens_per_s;       /* and the measured (EWMA) prefill rate */
    double prefill_mean_pos;           /* the mean position of the tokens that rate was
                                          measured on (EWMA alongside) */
    double attn_per_pos;               /* r: a token at position p costs (1 + r * p) units of
                                          work (the attention term; from the model's shapes) */
    /* G2 (all zero without it). */
    uint64_t g2_max_bytes;     /* its budget (eng_tier_params.g2_bytes) */
    uint64_t g2_write_blocks;  /* blocks inserted (copied out of the pool) */
    uint64_t g2_write_dropped; /* blocks that could not go to G2 (no staging piece, a failed
                                  copy): they went to G3's queue instead (or were dropped) */
    uint64_t g2_load_blocks;   /* blocks copied from G2 into the pool */
    uint64_t g2_load_bytes, g2_load_ns; /* and their bytes, and the copy time measured (on
                                           CUDA only for a start whose copies were done by its
                                           end: first enqueue to then, an upper bound) */
    double g2_load_bytes_per_s; /* measured (EWMA) G2 copy bandwidth: the cost model's input */
    uint64_t g2_evictions;      /* blocks G2 dropped for its budget */
    uint64_t g2_spilled;        /* of those, blocks queued down to G3 (or already held there) */
} eng_tier_stats_t;

void eng_tier_stats(eng_t *e, eng_tier_stats_t *out);

/* Waits until every write queued so far is on disk (or failed). For tests, benchmarks and an
 * orderly shutdown; the scheduler never calls it. */
void eng_tier_flush(eng_t *e);

/* ---- async reads ---- */

typedef struct eng_tier_ticket eng_tier_ticket_t;

/* Starts reading, on the I/O thread, the tier blocks tokens[0..n) in namespace ns continues
 * into past its G1 match. *out gets a ticket, or NULL when there is nothing to read (no tiers,
 * or no tier block past the match). The ticket owns host staging buffers until
 * eng_tier_ticket_free; eng_seq_start_cached uses the staged blocks of every live ticket.
 * Returns 0, PC_ERR_NOMEM or PC_ERR_BUSY (the staging budget, queue_bytes, is spent by other
 * tickets: start without a prefetch). */
int eng_tier_prefetch(eng_t *e, uint64_t ns, const int32_t *tokens, uint32_t n,
                      eng_tier_ticket_t **out);

/* True once every read of the ticket finished (staged, or failed: a failed block is read again
 * or recomputed by eng_seq_start_cached). Any thread. NULL is ready. */
bool eng_tier_ready(const eng_tier_ticket_t *t);

/* Releases the ticket and its staging buffers (waiting for its reads if they still run). NULL
 * is a no-op. The engine's thread only (see Threads above). */
void eng_tier_ticket_free(eng_t *e, eng_tier_ticket_t *t);

/* ---- what the tiers hold ---- */

/* A prefix held in a lower tier: blocks 0 .. n_tokens / block_tokens - 1 of its chain. */
typedef struct eng_tier_prefix {
    uint64_t ns;
    uint32_t n_tokens;     /* a multiple of block_tokens */
    uint8_t tier;          /* enum eng_tier: the highest tier holding every block of it */
    const int32_t *tokens; /* [n_tokens], valid during the callback only */
} eng_tier_prefix_t;

typedef void (*eng_tier_prefix_fn)(const eng_tier_prefix_t *p, void *ud);

/* Calls fn for each maximal chain the tiers hold (a block no other held block continues), with
 * its whole token path from block 0. A chain whose earlier blocks the store dropped is still
 * listed whole when their tokens are known (the engine keeps the tokens of dropped ancestors of
 * held blocks): a read recomputes such a hole. fn runs under the tiers' lock and must not call
 * the engine. Returns how many, or PC_ERR_NOMEM. O(records). */
int eng_tier_prefixes(eng_t *e, eng_tier_prefix_fn fn, void *ud);

/* A block the disk tier dropped (its budget, a corrupt record found, a removal), as an event
 * the caller drains on the engine's thread: ns, the prefix through the block (tokens NULL when
 * its path is not known), and the tier it is now in (ENG_TIER_NONE: gone from every tier; a
 * block leaving the pool for a tier is reported by the prefix index's eviction event, whose
 * tier byte says where it went). */
typedef struct eng_tier_event {
    uint64_t ns;
    uint32_t n_tokens;
    uint8_t tier;
    const int32_t *tokens; /* [n_tokens] or NULL; valid during the callback only */
} eng_tier_event_t;

typedef void (*eng_tier_event_fn)(const eng_tier_event_t *ev, void *ud);

/* Delivers the pending tier events. Returns how many. */
uint32_t eng_tier_poll(eng_t *e, eng_tier_event_fn fn, void *ud);

#endif
