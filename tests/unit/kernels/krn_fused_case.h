/*
 * krn_fused_case.h — random cases for the fused kernels (kernels.h, "Fused kernels"), shared by
 * test_krn_ref.c (the fused references against the unfused references they replace) and
 * test_krn_gpu.c (the CUDA kernels against the fused references).
 *
 * A QKV case is the output of one fused QKV GEMM, [n_rows][nq + 2 nk] of random values (never
 * zero), for rows of several sequences at distinct positions (consecutive within a sequence,
 * after a random prefix), random biases and per-head norm weights when asked for, random
 * frequencies, and a host KV pool whose every slot is NaN until written, with the sequences'
 * blocks scattered over it.
 */
#ifndef KRN_FUSED_CASE_H
#define KRN_FUSED_CASE_H

#include "krn_testutil.h"

typedef struct kf_case {
    krn_kv_t kv; /* host pool, NaN everywhere */
    int32_t n_rows, n_head, n_seqs, max_blocks, rope_dim;
    enum krn_rope_style style;
    int64_t ld; /* nq + 2 nk */
    float *qkv; /* [n_rows][ld] */
    float *bq, *bk, *bv, *q_norm, *k_norm, *inv_freq;
    int32_t *pos, *seq, *tables; /* [n_rows], [n_rows], [n_seqs][max_blocks] */
} kf_case_t;

static inline float *kf_rand(kt_rng_t *r, size_t n, float scale)
{
    float *p = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++)
        p[i] = kt_unif(r) * scale;
    return p;
}

static inline void kf_make(kf_case_t *c, kt_rng_t *r, int32_t n_rows, int32_t n_head,
                           int32_t n_head_kv, int32_t hd, int32_t bt, enum krn_dtype kv_dtype,
                           bool bias, bool norm, enum krn_rope_style style, int32_t rope_dim)
{
    memset(c, 0, sizeof *c);
    c->n_rows = n_rows;
    c->n_head = n_head;
    c->n_seqs = 3;
    c->style = style;
    c->rope_dim = rope_dim;
    int32_t nq = n_head * hd, nk = n_head_kv * hd;
    c->ld = nq + 2 * nk;
    c->qkv = kf_rand(r, (size_t)n_rows * c->ld, 3.0f);
    if (bias) {
        c->bq = kf_rand(r, (size_t)nq, 1.0f);
        c->bk = kf_rand(r, (size_t)nk, 1.0f);
        c->bv = kf_rand(r, (size_t)nk, 1.0f);
    }
    if (norm) {
        c->q_norm = kf_rand(r, (size_t)hd, 1.5f);
        c->k_norm = kf_rand(r, (size_t)hd, 1.5f);
    }
    c->inv_freq = malloc(sizeof(float) * (size_t)(rope_dim / 2));
    for (int32_t i = 0; i < rope_dim / 2; i++)
        c->inv_freq[i] = (float)(pow(500000.0, -2.0 * i / rope_dim) / (1 + i % 3));
    /* Rows round-robin over the sequences, consecutive positions after a random prefix. */
    int32_t pos0[3], max_pos = 0;
    c->pos = malloc(sizeof(int32_t) * (size_t)n_rows);
    c->seq = malloc(sizeof(int32_t) * (size_t)n_rows);
    for (int s = 0; s < 3; s++)
        pos0[s] = (int32_t)kt_below(r, 5000);
    for (int32_t i = 0; i < n_rows; i++) {
        c->seq[i] = i % 3;
        c->pos[i] = pos0[i % 3] + i / 3;
        max_pos = c->pos[i] > max_pos ? c->pos[i] : max_pos;
    }
    c->max_blocks = max_pos / bt + 1;
    c->kv = (krn_kv_t){.n_blocks = 3 * c->max_blocks,
                       .n_layer = 2,
                       .n_head_kv = n_head_kv,
                       .head_dim = hd,
                       .block_tokens = bt,
                       .dtype = kv_dtype};
    size_t bytes = krn_kv_block_bytes(&c->kv) * (size_t)c->kv.n_blocks;
    c->kv.base = malloc(bytes);
    memset(c->kv.base, 0xff, bytes);
    /* Every block of the pool once, shuffled over the three tables. */
    int32_t nb = c->kv.n_blocks;
    c->tables = malloc(sizeof(int32_t) * (size_t)nb);
    for (int32_t i = 0; i < nb; i++)
        c->tables[i] = i;
    for (int32_t i = nb - 1; i > 0; i--) {
        int32_t j = (int32_t)kt_below(r, (uint32_t)i + 1), t = c->tables[i];
        c->tables[i] = c->tables[j];
        c->tables[j] = t;
    }
}

/* The fused call over the case: strided views of the one QKV output, q into q_out, layer 1. */
static inline krn_qkv_rope_kv_args_t kf_args(const kf_case_t *c, float *q_out)
{
    int32_t nq = c->n_head * c->kv.head_dim, nk = c->kv.n_head_kv * c->kv.head_dim;
    return (krn_qkv_rope_kv_args_t){.kv = c->kv,
                                    .layer = 1,
                                    .n_head = c->n_head,
                                    .q_in = c->qkv,
                                    .k_in = c->qkv + nq,
                                    .v_in = c->qkv + nq + nk,
                                    .ld_q = c->ld,
                                    .ld_kv = c->ld,
                                    .q_out = q_out,
                                    .bq = c->bq,
                                    .bk = c->bk,
                                    .bv = c->bv,
                                    .q_norm = c->q_norm,
                                    .k_norm = c->k_norm,
                                    .eps = 1e-6f,
                                    .inv_freq = c->inv_freq,
                                    .rope_dim = c->rope_dim,
                                    .style = c->style,
                                    .q_scale = 1.0f / sqrtf((float)c->kv.head_dim),
                                    .row_pos = c->pos,
                                    .row_seq = c->seq,
                                    .block_tables = c->tables,
                                    .n_rows = c->n_rows,
                                    .max_blocks = c->max_blocks};
}

static inline size_t kf_pool_bytes(const kf_case_t *c)
{
    return krn_kv_block_bytes(&c->kv) * (size_t)c->kv.n_blocks;
}

static inline void kf_free(kf_case_t *c)
{
    free(c->kv.base);
    free(c->qkv);
    free(c->bq);
    free(c->bk);
    free(c->bv);
    free(c->q_norm);
    free(c->k_norm);
    free(c->inv_freq);
    free(c->pos);
    free(c->seq);
    free(c->tables);
    memset(c, 0, sizeof *c);
}

#endif
