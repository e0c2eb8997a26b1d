/*
 * engine_internal.h — the engine's private structs, shared by engine.c and prefix.c.
 */
#ifndef ENG_ENGINE_INTERNAL_H
#define ENG_ENGINE_INTERNAL_H

#include "backend.h"
#include "engine.h"
#include "kvpool.h"
#include "model.h"

struct eng_prefix;      /* prefix.c */
struct eng_tiers;       /* tier.c */
struct eng_kvtier;      /* kvtier.h */
struct eng_kvtier_name; /* kvtier.h */

struct eng_seq {
    eng_kvseq_t kv;
    int32_t *tokens; /* [kv.n_tokens] the tokens whose KV the sequence holds */
    size_t tokens_cap;
    eng_seq_t *prev, *next;
    uint32_t mark;           /* scratch for duplicate detection in eng_forward */
    eng_seq_origin_t origin; /* where eng_seq_start_cached found its positions */
};

struct eng {
    eng_params_t p;
    eng_model_t *model;
    eng_kvpool_t *kv;
    eng_backend_t *be;
    char backend_note[256]; /* why backend "auto" fell back to the CPU, or "" */
    struct eng_prefix *prefix;
    eng_seq_t *seqs; /* live sequences */
    uint32_t n_seqs;
    uint32_t mark;
    eng_fwd_seq_t *fwd;    /* per-step scratch [fwd_cap] */
    uint32_t *fwd_item;    /* [fwd_cap] the item of each fwd entry */
    uint32_t *orig_tokens; /* [fwd_cap] each item's n_tokens before the call */
    uint32_t fwd_cap;
    uint32_t cpu_isa;       /* enum eng_cpu_isa: the CPU backend's path, resolved at init */
    uint8_t *blk_mark;      /* [n_blocks] scratch of eng_kv_stats */
    struct eng_tiers *tier; /* the KV tiers (tier.c), or NULL without */
    char *model_path;       /* a copy, for the fingerprint */
    uint64_t model_size;    /* the file's size when it was loaded */
    uint64_t model_fp;      /* eng_model_fingerprint, once has_fp */
    bool has_fp;
    double prefill_tps; /* measured prefill rate (EWMA over steps of >= 64 tokens), 0: none */
    double prefill_pos; /* the mean position of those steps' tokens (EWMA alongside) */
};

/* The KV pool (kvpool.h), for the engine's own tests and checks; valid until eng_free. */
eng_kvpool_t *eng_kvpool(eng_t *e);

/* Makes room for n tokens in s->tokens. Returns 0 or PC_ERR_NOMEM. */
int eng__seq_tokens_reserve(eng_seq_t *s, uint32_t n);

/* The prefix index (prefix.c). init returns 0, PC_ERR_NOMEM; free(NULL) is a no-op. The index
 * installs itself as the KV pool's eviction hook. */
int eng__prefix_init(eng_t *e, struct eng_prefix **out);
void eng__prefix_free(struct eng_prefix *px);
/* eng_free's write-back of the unpinned prefixes still in the pool to the disk tier, within
 * the tier's shutdown bounds (eng_tier_params); no eviction events are reported. */
void eng__prefix_shutdown(eng_t *e);
/* Adds the references the index holds to refs[n_blocks] (for eng_check). */
void eng__prefix_count_refs(const struct eng_prefix *px, uint32_t *refs);
/* Checks the radix tree's invariants. */
int eng__prefix_check(const struct eng_prefix *px, char *err, size_t err_len);

/* The longest prefix of tokens[0..n) cached in ns (G1), in tokens, without touching the LRU. */
uint32_t eng__prefix_match_len(eng_t *e, uint64_t ns, const int32_t *tokens, uint32_t n);

/* The KV tiers (tier.c). init opens the store under p->dir and starts the I/O thread: 0, or an
 * error with the reason in err. free(NULL) is a no-op; it waits for queued writes. */
int eng__tier_init(eng_t *e, const eng_tier_params_t *p, struct eng_tiers **out, char *err,
                   size_t err_len);
void eng__tier_free(struct eng_tiers *t);
/* Write-back of a prefix leaving the index: path[depth] its tokens, table[] the blocks of block
 * indices table_first.. (the node's payload). Queues the whole blocks from index table_first
 * on that no tier holds; `filter` applies min_tokens. Returns the enum eng_tier the dropped
 * blocks are now held in (ENG_TIER_NONE when some whole block is not). */
uint8_t eng__tier_write(eng_t *e, uint64_t ns, const int32_t *path, uint32_t depth,
                        const uint32_t *table, uint32_t table_first, bool filter);
/* The cost model: true when loading `blocks` disk blocks (ns_per_block each, measured) is
 * expected to be faster than recomputing their `tokens` at prefill_tps; unknown figures (0)
 * favour the load, which measures them. */
bool eng__tier_load_wins(double ns_per_block, double prefill_tps, uint32_t blocks, uint32_t tokens,
                         double recompute_scale);
/* The attention term of the cost model: a token at position p costs (1 + r * p) units, r the
 * attention's multiply-adds per earlier position over the layer matrices' per token (from the
 * model's shapes). Returns how much dearer tokens around position `pos` are than the measured
 * rate's (prefill_pos): (1 + r * pos) / (1 + r * prefill_pos). */
double eng__tier_attn_ratio(const eng_t *e);
double eng__tier_recompute_scale(const eng_t *e, double pos);
/* Tests: the tier stores, and the name of block i of tokens in ns (tokens holds (i + 1) * bt). */
struct eng_kvtier *eng__tier_store(eng_t *e);
struct eng_kvtier *eng__tier_store_g2(eng_t *e); /* G2's store, or NULL */
void eng__tier_block_name(eng_t *e, uint64_t ns, const int32_t *tokens, uint32_t i,
                          struct eng_kvtier_name *out);
/* Removes every record of namespace ns from the tiers (eng_prefix_drop of a whole namespace).
 * Returns 0 or PC_ERR_NOMEM (some may stay). */
/* Removes the disk records of every prompt of ns that starts with tokens[0..n) (n > 0), and
 * the records before n on that path that no held record continues any more, after the queued
 * writes. Returns 0 or PC_ERR_NOMEM. */
int eng__tier_drop_prefix(eng_t *e, uint64_t ns, const int32_t *tokens, uint32_t n);
/* The shutdown drain: begin sets the deadline and byte bound and makes writes wait for
 * staging room instead of dropping; more says whether both bounds still allow writing; end
 * clears them. */
void eng__tier_drain_begin(eng_t *e);
bool eng__tier_drain_more(eng_t *e);
void eng__tier_drain_end(eng_t *e);
int eng__tier_drop_ns(eng_t *e, uint64_t ns);
/* Continues the sequence s (its G1 match) into the tiers for tokens[0..n) (prefix.h). */
void eng__tier_continue(eng_t *e, eng_seq_t *s, uint64_t ns, const int32_t *tokens, uint32_t n);

#endif
