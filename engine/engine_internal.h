/*
 * engine_internal.h — the engine's private structs, shared by engine.c and prefix.c.
 */
#ifndef ENG_ENGINE_INTERNAL_H
#define ENG_ENGINE_INTERNAL_H

#include "backend.h"
#include "engine.h"
#include "kvpool.h"
#include "model.h"

struct eng_prefix; /* prefix.c */

struct eng_seq {
    eng_kvseq_t kv;
    int32_t *tokens; /* [kv.n_tokens] the tokens whose KV the sequence holds */
    size_t tokens_cap;
    eng_seq_t *prev, *next;
    uint32_t mark; /* scratch for duplicate detection in eng_forward */
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
    uint32_t cpu_isa;  /* enum eng_cpu_isa: the CPU backend's path, resolved at init */
    uint8_t *blk_mark; /* [n_blocks] scratch of eng_kv_stats */
};

/* The KV pool (kvpool.h), for the engine's own tests and checks; valid until eng_free. */
eng_kvpool_t *eng_kvpool(eng_t *e);

/* Makes room for n tokens in s->tokens. Returns 0 or PC_ERR_NOMEM. */
int eng__seq_tokens_reserve(eng_seq_t *s, uint32_t n);

/* The prefix index (prefix.c). init returns 0, PC_ERR_NOMEM; free(NULL) is a no-op. The index
 * installs itself as the KV pool's eviction hook. */
int eng__prefix_init(eng_t *e, struct eng_prefix **out);
void eng__prefix_free(struct eng_prefix *px);
/* Adds the references the index holds to refs[n_blocks] (for eng_check). */
void eng__prefix_count_refs(const struct eng_prefix *px, uint32_t *refs);
/* Checks the radix tree's invariants. */
int eng__prefix_check(const struct eng_prefix *px, char *err, size_t err_len);

#endif
