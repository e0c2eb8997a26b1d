/*
 * krn_testutil.h — shared pieces of the kernels tests: a seeded PRNG, random attention
 * scenarios on a host paged KV pool, and a dense double-precision attention to check against.
 *
 * A scenario is a batch of sequences with random lengths (one at the maximum length the block
 * tables allow), random non-contiguous block tables drawn from a shuffled pool, every written
 * KV slot random (never zero) and every other slot NaN, so a stray read of an unwritten slot
 * turns an output into NaN and fails the comparison.
 */
#ifndef KRN_TESTUTIL_H
#define KRN_TESTUTIL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "krn_hostdev.h" /* krn_kv_value, the q8_0 steps */

typedef struct kt_rng {
    uint64_t s;
} kt_rng_t;

static inline uint64_t kt_next(kt_rng_t *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* Uniform in [0, n). */
static inline uint32_t kt_below(kt_rng_t *r, uint32_t n)
{
    return (uint32_t)(kt_next(r) % n);
}
/* Uniform in [-1, 1), never exactly 0. */
static inline float kt_unif(kt_rng_t *r)
{
    float f = (float)((double)(kt_next(r) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
    return f == 0 ? 0.5f : f;
}

typedef struct kt_attn {
    krn_kv_t kv; /* host pool */
    int32_t layer, n_head, n_seqs, max_blocks, n_rows;
    int32_t *tables;  /* [n_seqs][max_blocks] */
    int32_t *row_pos; /* [n_rows] */
    int32_t *row_seq; /* [n_rows] */
    krn_plan_seq_t *seqs;
    float *q;   /* [n_rows][n_head * head_dim], scaled */
    float *out; /* [n_rows][n_head * head_dim] */
} kt_attn_t;

static inline void kt_attn_free(kt_attn_t *t)
{
    free(t->kv.base);
    free(t->tables);
    free(t->row_pos);
    free(t->row_seq);
    free(t->seqs);
    free(t->q);
    free(t->out);
    memset(t, 0, sizeof *t);
}

static inline void kt_store(const krn_kv_t *kv, int64_t off, float v)
{
    if (kv->dtype == KRN_F16)
        ((uint16_t *)kv->base)[off] = krn_f32_to_f16(v);
    else
        ((float *)kv->base)[off] = v;
}
static inline float kt_load(const krn_kv_t *kv, int64_t off)
{
    return kv->dtype == KRN_F16 ? krn_f16_to_f32(((const uint16_t *)kv->base)[off])
                                : ((const float *)kv->base)[off];
}

/*
 * A random scenario: n_seqs sequences, each with `new_tokens[s]` rows after a prefix of
 * ctx[s] positions already in the cache (their K/V written at random); sequence 0 ends at the
 * table's last position when at_max. The new rows' K/V are written too (the kernels test
 * attention after kv_write). Layer `layer` of n_layer is the one used.
 */
static inline int kt_attn_make(kt_attn_t *t, kt_rng_t *r, int32_t n_head, int32_t n_head_kv,
                               int32_t head_dim, int32_t bt, enum krn_dtype dt, int32_t n_seqs,
                               const int32_t *ctx, const int32_t *new_tokens, int32_t max_blocks)
{
    memset(t, 0, sizeof *t);
    int32_t n_layer = 2;
    t->layer = 1;
    t->n_head = n_head;
    t->n_seqs = n_seqs;
    t->max_blocks = max_blocks;
    int32_t n_blocks = n_seqs * max_blocks + 3;
    t->kv = (krn_kv_t){.n_blocks = n_blocks,
                       .n_layer = n_layer,
                       .n_head_kv = n_head_kv,
                       .head_dim = head_dim,
                       .block_tokens = bt,
                       .dtype = dt};
    size_t bytes = krn_kv_block_bytes(&t->kv) * (size_t)n_blocks;
    t->kv.base = malloc(bytes);
    memset(t->kv.base, 0xff, bytes); /* NaN everywhere (F16 and F32) */
    /* Shuffled block ids, dealt out to the tables: non-contiguous and in no order. */
    int32_t *ids = malloc(sizeof *ids * (size_t)n_blocks);
    for (int32_t i = 0; i < n_blocks; i++)
        ids[i] = i;
    for (int32_t i = n_blocks - 1; i > 0; i--) {
        int32_t j = (int32_t)kt_below(r, (uint32_t)i + 1), x = ids[i];
        ids[i] = ids[j];
        ids[j] = x;
    }
    t->tables = malloc(sizeof *t->tables * (size_t)n_seqs * max_blocks);
    for (int32_t i = 0; i < n_seqs * max_blocks; i++)
        t->tables[i] = ids[i];
    free(ids);
    t->n_rows = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        if (ctx[s] + new_tokens[s] > max_blocks * bt || new_tokens[s] < 1)
            return -1;
        t->n_rows += new_tokens[s];
    }
    int32_t width = n_head * head_dim;
    t->row_pos = malloc(sizeof *t->row_pos * (size_t)t->n_rows);
    t->row_seq = malloc(sizeof *t->row_seq * (size_t)t->n_rows);
    t->seqs = malloc(sizeof *t->seqs * (size_t)n_seqs);
    t->q = malloc(sizeof *t->q * (size_t)t->n_rows * width);
    t->out = malloc(sizeof *t->out * (size_t)t->n_rows * width);
    for (int64_t i = 0; i < (int64_t)t->n_rows * width; i++) {
        t->q[i] = kt_unif(r) * 2.0f / sqrtf((float)head_dim) * 2.0f;
        t->out[i] = NAN;
    }
    int32_t row = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        t->seqs[s] = (krn_plan_seq_t){.row0 = row, .n_tokens = new_tokens[s], .pos0 = ctx[s]};
        for (int32_t j = 0; j < new_tokens[s]; j++, row++) {
            t->row_pos[row] = ctx[s] + j;
            t->row_seq[row] = s;
        }
        /* K/V of every position up to the last new one, in every layer (q8_0: each row
         * quantized, krn_q8_0_quantize). */
        float kr[KRN_ATTN_MAX_HEAD_DIM], vr[KRN_ATTN_MAX_HEAD_DIM];
        for (int32_t p = 0; p < ctx[s] + new_tokens[s]; p++) {
            int32_t b = t->tables[(int64_t)s * max_blocks + p / bt], slot = p % bt;
            for (int32_t l = 0; l < n_layer; l++)
                for (int32_t h = 0; h < n_head_kv; h++) {
                    for (int32_t d = 0; d < head_dim; d++) {
                        kr[d] = kt_unif(r) * 2;
                        vr[d] = kt_unif(r) * 2;
                    }
                    if (dt == KRN_Q8_0) {
                        uint8_t *sl =
                            (uint8_t *)t->kv.base + krn_kv_slice_byte_offset(&t->kv, b, l, h);
                        size_t rb = krn_kv_row_bytes(&t->kv);
                        krn_q8_0_quantize(kr, head_dim, sl + (size_t)slot * rb);
                        krn_q8_0_quantize(vr, head_dim, sl + (size_t)(bt + slot) * rb);
                        continue;
                    }
                    int64_t base = krn_kv_slice_offset(&t->kv, b, l, h);
                    for (int32_t d = 0; d < head_dim; d++) {
                        kt_store(&t->kv, base + (int64_t)d * bt + slot, kr[d]);
                        kt_store(&t->kv,
                                 base + (int64_t)head_dim * bt + (int64_t)slot * head_dim + d,
                                 vr[d]);
                    }
                }
        }
    }
    return 0;
}

/* K (is_v false) or V of (block, layer, head) at (slot, d), any pool dtype. */
static inline float kt_kv_get(const krn_kv_t *kv, int32_t b, int32_t l, int32_t h, bool is_v,
                              int32_t slot, int32_t d)
{
    return krn_kv_value(kv, (const uint8_t *)kv->base + krn_kv_slice_byte_offset(kv, b, l, h), is_v,
                        slot, d);
}

/* Dense causal softmax attention in double over the scenario's pool: out[n_rows][width]. A
 * q8_0 pool is read as d * q, with each query head quantized to q8_0 first (as the kernels
 * do): the dense result differs from theirs only by F32 rounding. */
static inline void kt_attn_dense(const kt_attn_t *t, double *out)
{
    const krn_kv_t *kv = &t->kv;
    int32_t hd = kv->head_dim, bt = kv->block_tokens, group = t->n_head / kv->n_head_kv;
    int32_t width = t->n_head * hd;
    float qq[KRN_ATTN_MAX_HEAD_DIM];
    for (int32_t row = 0; row < t->n_rows; row++) {
        int32_t pos = t->row_pos[row], s = t->row_seq[row];
        double *sc = malloc(sizeof *sc * (size_t)(pos + 1));
        for (int32_t h = 0; h < t->n_head; h++) {
            int32_t kh = h / group;
            const float *q = t->q + (int64_t)row * width + (int64_t)h * hd;
            if (kv->dtype == KRN_Q8_0) {
                for (int32_t b = 0; b < hd / KRN_QK8_0; b++) {
                    float qd;
                    krn_q8_0_quantize_f(q + b * KRN_QK8_0, qq + b * KRN_QK8_0, &qd);
                    for (int32_t i = 0; i < KRN_QK8_0; i++)
                        qq[b * KRN_QK8_0 + i] *= qd;
                }
                q = qq;
            }
            double mx = -INFINITY, sum = 0;
            for (int32_t p = 0; p <= pos; p++) {
                int32_t b = t->tables[(int64_t)s * t->max_blocks + p / bt];
                double acc = 0;
                for (int32_t d = 0; d < hd; d++)
                    acc += (double)q[d] * kt_kv_get(kv, b, t->layer, kh, false, p % bt, d);
                sc[p] = acc;
                mx = acc > mx ? acc : mx;
            }
            for (int32_t p = 0; p <= pos; p++)
                sum += sc[p] = exp(sc[p] - mx);
            double *o = out + (int64_t)row * width + (int64_t)h * hd;
            for (int32_t d = 0; d < hd; d++)
                o[d] = 0;
            for (int32_t p = 0; p <= pos; p++) {
                int32_t b = t->tables[(int64_t)s * t->max_blocks + p / bt];
                for (int32_t d = 0; d < hd; d++)
                    o[d] += sc[p] / sum * kt_kv_get(kv, b, t->layer, kh, true, p % bt, d);
            }
        }
        free(sc);
    }
}

/* ||a - b|| / ||b||, or INFINITY when a holds a NaN. */
static inline double kt_rel_err_f(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i]))
            return INFINITY;
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}
static inline double kt_rel_err_d(const float *a, const double *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]))
            return INFINITY;
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* The task and merge lists of a scenario (malloc'ed; the caller frees them). */
static inline int kt_attn_plan(const kt_attn_t *t, int32_t split_kv, krn_attn_args_t *a)
{
    krn_plan_params_t pp = {.n_head = t->n_head,
                            .n_head_kv = t->kv.n_head_kv,
                            .head_dim = t->kv.head_dim,
                            .split_kv = split_kv};
    int32_t nt, nm, np;
    int rc = krn_attn_plan(&pp, t->seqs, t->n_seqs, NULL, &nt, NULL, &nm, &np);
    if (rc != 0)
        return rc;
    krn_attn_task_t *tasks = malloc(sizeof *tasks * (size_t)(nt + 1));
    krn_attn_merge_t *merges = malloc(sizeof *merges * (size_t)(nm + 1));
    rc = krn_attn_plan(&pp, t->seqs, t->n_seqs, tasks, &nt, merges, &nm, &np);
    *a = (krn_attn_args_t){.kv = t->kv,
                           .layer = t->layer,
                           .n_head = t->n_head,
                           .q = t->q,
                           .out = t->out,
                           .row_pos = t->row_pos,
                           .block_tables = t->tables,
                           .max_blocks = t->max_blocks,
                           .tasks = tasks,
                           .n_tasks = nt,
                           .merges = merges,
                           .n_merges = nm,
                           .part_o = malloc(sizeof(float) * ((size_t)np * t->kv.head_dim + 1)),
                           .part_ml = malloc(sizeof(float) * ((size_t)np * 2 + 1))};
    return rc;
}
/* The decode-kernel arguments of a scenario whose rows are all single tokens (decode), with
 * splits of split_tokens positions (host pointers; part buffers malloc'ed, the caller frees
 * them with kt_decode_free). */
static inline void kt_decode_args(const kt_attn_t *t, int32_t split_tokens, krn_decode_args_t *a)
{
    int32_t max_pos = 0;
    for (int32_t i = 0; i < t->n_rows; i++)
        max_pos = t->row_pos[i] > max_pos ? t->row_pos[i] : max_pos;
    int32_t max_splits = max_pos / split_tokens + 1;
    size_t slots = (size_t)t->n_rows * t->n_head * max_splits;
    *a = (krn_decode_args_t){.kv = t->kv,
                             .layer = t->layer,
                             .n_head = t->n_head,
                             .q = t->q,
                             .out = t->out,
                             .row_seq = t->row_seq,
                             .row_pos = t->row_pos,
                             .block_tables = t->tables,
                             .max_blocks = t->max_blocks,
                             .n_rows = t->n_rows,
                             .split_tokens = split_tokens,
                             .max_splits = max_splits,
                             .part_o = malloc(sizeof(float) * (slots * t->kv.head_dim + 1)),
                             .part_ml = malloc(sizeof(float) * (slots * 2 + 1))};
}
static inline void kt_decode_free(krn_decode_args_t *a)
{
    free(a->part_o);
    free(a->part_ml);
}

static inline void kt_attn_plan_free(krn_attn_args_t *a)
{
    free((void *)a->tasks);
    free((void *)a->merges);
    free(a->part_o);
    free(a->part_ml);
}

/*
 * Random quantized blocks (kernels.h, "Quantized weights") for the quantized kernels' tests:
 * n_blocks blocks of type t into out (krn_qtype_block_bytes(t) each). Every quant, 6-bit scale
 * and high-bit byte is random; the F16 scales are random normal halves of magnitude 2^-14 ..
 * 2^3, negative half the time (never NaN or inf). With edges, block i % 8 is an edge case:
 * 0 all bytes zero, 1 the largest F16 scales (65504) with every scale and min at its extreme,
 * 2 the smallest subnormal scales, 3 every quant byte 0xff, 4 every quant byte 0; 5..7 random.
 */
static inline uint16_t kt_half_rand(kt_rng_t *r)
{
    uint16_t e = (uint16_t)(1 + kt_below(r, 18)); /* biased exponent 1..18: 2^-14 .. 2^3 */
    return (uint16_t)((kt_below(r, 2) << 15) | (e << 10) | kt_below(r, 1024));
}
/* Byte offsets of the F16 scales of a block of t (*n of them) and of its scale bytes. */
static inline void kt_qlayout(int32_t t, int32_t *half0, int32_t *n_half, int32_t *sc0,
                              int32_t *n_sc)
{
    *half0 = t == KRN_QT_Q6_K ? 208 : 0;
    *n_half = t == KRN_QT_Q4_K || t == KRN_QT_Q5_K || t == KRN_QT_Q5_1 ? 2 : 1;
    *sc0 = t == KRN_QT_Q6_K ? 192 : t == KRN_QT_Q4_K || t == KRN_QT_Q5_K ? 4 : 0;
    *n_sc = t == KRN_QT_Q6_K ? 16 : t == KRN_QT_Q4_K || t == KRN_QT_Q5_K ? 12 : 0;
}
static inline void kt_qblocks(kt_rng_t *r, int32_t t, int64_t n_blocks, uint8_t *out, bool edges)
{
    int32_t bb = krn_qtype_block_bytes(t), h0, nh, s0, ns;
    kt_qlayout(t, &h0, &nh, &s0, &ns);
    for (int64_t b = 0; b < n_blocks; b++) {
        uint8_t *p = out + b * bb;
        int kind = edges ? (int)(b % 8) : 7;
        for (int32_t i = 0; i < bb; i++) {
            bool quant = (i < h0 || i >= h0 + 2 * nh) && (i < s0 || i >= s0 + ns);
            p[i] = kind == 0            ? 0
                   : quant && kind == 3 ? 0xff
                   : quant && kind == 4 ? 0
                                        : (uint8_t)kt_below(r, 256);
            if (!quant && kind == 1)
                p[i] = t == KRN_QT_Q6_K ? 0x80 : 0xff; /* int8 -128; 6-bit 63 */
        }
        for (int32_t k = 0; k < nh && kind != 0; k++) {
            uint16_t h = kind == 1 ? 0x7bff : kind == 2 ? 0x0001 : kt_half_rand(r);
            p[h0 + 2 * k] = (uint8_t)h;
            p[h0 + 2 * k + 1] = (uint8_t)(h >> 8);
        }
    }
}

#endif
