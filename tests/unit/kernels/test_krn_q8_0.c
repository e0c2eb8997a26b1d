/*
 * test_krn_q8_0.c — the q8_0 KV of kernels/ on the CPU (issue 23, CUDA part): the pieces every
 * q8_0 kernel and reference is built from (krn_hostdev.h) and the references themselves,
 * against the engine's q8_0 pool and CPU attention, which the kernels must agree with byte for
 * byte (the stored blocks) or to rounding (attention outputs):
 *   - krn_q8_0_quantize writes the bytes of eng_kv_q8_0_quantize (scales over many octaves,
 *     zero blocks, NaN and inf, exact halves), and dequantizes as the engine does;
 *   - krn_ref_kv_write and krn_ref_qkv_rope_kv store into the engine's real q8_0 pool the rows
 *     eng_kv_q8_0_quantize makes, at the engine's offsets, touching no other slot;
 *     krn_ref_block_copy copies what eng_kvpool_copy copies;
 *   - krn_ref_attention and krn_ref_decode_attention on a q8_0 pool against a dense double
 *     attention over the dequantized K/V (query quantized as the kernels do), and against the
 *     engine's CPU attention over the same blocks;
 *   - the decode kernel's and the SIMT kernel's q8_0 shapes and shared memory.
 * The CUDA kernels are compared with these references in test_krn_gpu (gpu label).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "engine.h"
#include "engine_internal.h" /* eng_kvpool */
#include "kernels.h"
#include "krn_fused_case.h"
#include "krn_hostdev.h"
#include "krn_testutil.h"
#include "kvpool.h"
#include "pc_assert.h"
#include "pc_err.h"
#include "pc_test.h"

/* Rows of q8_0 blocks that exercise the quantizer's edges: block i of a row gets a scale of
 * 2^(i - 20) .. so the rows span many octaves; some blocks all zero, some with NaN or +-inf, some
 * holding exact multiples of d / 2 (ties). */
static void edge_row(kt_rng_t *r, float *x, int32_t n, int32_t row)
{
    for (int32_t b = 0; b < n / KRN_QK8_0; b++) {
        float scale = ldexpf(1.0f, (int)kt_below(r, 40) - 20);
        int kind = (int)kt_below(r, 8);
        for (int32_t i = 0; i < KRN_QK8_0; i++) {
            float *v = &x[b * KRN_QK8_0 + i];
            *v = kt_unif(r) * scale;
            if (kind == 0)
                *v = 0.0f;
            else if (kind == 1 && i == 7)
                *v = NAN;
            else if (kind == 2 && i == 3)
                *v = (row & 1) ? INFINITY : -INFINITY;
            else if (kind == 3) /* amax 127 * 0.5: every value a multiple of 0.25 = d / 2 */
                *v = i == 0 ? 63.5f : (float)((int32_t)kt_below(r, 255) - 127) * 0.25f;
        }
    }
}

PC_TEST(quantizer_writes_the_engines_bytes)
{
    kt_rng_t r = {91};
    enum { N = 256 };
    float x[N], y1[N], y2[N];
    uint8_t a[N / 32 * 34], b[N / 32 * 34];
    for (int32_t row = 0; row < 4000; row++) {
        edge_row(&r, x, N, row);
        krn_q8_0_quantize(x, N, a);
        eng_kv_q8_0_quantize(x, N, b);
        if (memcmp(a, b, sizeof a) != 0)
            PC_TEST__FAIL("row %d: the kernels' q8_0 bytes differ from the engine's", row);
        krn_q8_0_dequantize(a, N, y1);
        eng_kv_q8_0_dequantize(b, N, y2);
        ASSERT_MEM_EQ(y1, y2, sizeof y1);
        /* The query form: the same quants, as floats, and the stored scale. */
        for (int32_t blk = 0; blk < N / 32; blk++) {
            float qf[32], d;
            krn_q8_0_quantize_f(x + blk * 32, qf, &d);
            ASSERT_EQ(krn_q8_0_d_of(a + blk * 34), d);
            for (int32_t i = 0; i < 32; i++)
                ASSERT_EQ((float)(int8_t)a[blk * 34 + 2 + i], qf[i]);
        }
    }
}

/* An engine q8_0 pool (poisoned) seen as a krn_kv_t. */
static void q8_pool(uint32_t n_head_kv, uint32_t hd, uint32_t bt, eng_kvpool_t **pool, krn_kv_t *kv)
{
    eng_kvpool_params_t kp = eng_kvpool_params_default();
    kp.block_tokens = bt;
    kp.dtype = ENG_KV_Q8_0;
    kp.max_tokens = 40 * bt;
    kp.poison = true;
    PC_ASSERT(eng_kvpool_init(&kp, 2, n_head_kv, hd, pool) == 0);
    *kv = (krn_kv_t){.base = eng_kvpool_kv(*pool, 0, 0, 0),
                     .n_blocks = (int32_t)eng_kvpool_n_blocks(*pool),
                     .n_layer = 2,
                     .n_head_kv = (int32_t)n_head_kv,
                     .head_dim = (int32_t)hd,
                     .block_tokens = (int32_t)bt,
                     .dtype = KRN_Q8_0};
}

PC_TEST(kv_write_fills_the_engines_q8_0_pool)
{
    kt_rng_t r = {92};
    const uint32_t shapes[][3] = {{2, 64, 16}, {4, 128, 16}, {1, 32, 5}, {3, 256, 8}};
    for (size_t si = 0; si < PC_ARRAY_LEN(shapes); si++) {
        uint32_t nkv = shapes[si][0], hd = shapes[si][1], bt = shapes[si][2];
        eng_kvpool_t *pool;
        krn_kv_t kv;
        q8_pool(nkv, hd, bt, &pool, &kv);
        ASSERT_EQ(krn_kv_block_bytes(&kv), eng_kvpool_block_bytes(pool));
        ASSERT_EQ(krn_kv_row_bytes(&kv), eng_kvpool_row_bytes(pool));
        uint32_t nb = eng_kvpool_n_blocks(pool), ids[64];
        for (uint32_t i = 0; i < nb; i++)
            ASSERT_EQ(eng_kvpool_alloc(pool, &ids[i]), 0);
        size_t bytes = (size_t)nb * eng_kvpool_block_bytes(pool);
        uint8_t *before = malloc(bytes);
        memcpy(before, kv.base, bytes);
        /* Rows at scattered positions of two sequences (every slot at most once). */
        enum { MAXB = 4, ROWS = 24 };
        int32_t tables[2 * MAXB], pos[ROWS], seq[ROWS];
        for (int i = 0; i < 2 * MAXB; i++)
            tables[i] = (int32_t)ids[nb - 1 - (uint32_t)i * 3];
        bool used[2 * MAXB * 64] = {false};
        for (int i = 0; i < ROWS; i++) {
            do {
                seq[i] = (int32_t)kt_below(&r, 2);
                pos[i] = (int32_t)kt_below(&r, MAXB * bt);
            } while (used[seq[i] * MAXB * 64 + pos[i]]);
            used[seq[i] * MAXB * 64 + pos[i]] = true;
        }
        int32_t w = (int32_t)(nkv * hd);
        float *k = malloc(sizeof(float) * ROWS * (size_t)w),
              *v = malloc(sizeof(float) * ROWS * (size_t)w);
        for (int i = 0; i < ROWS; i++) {
            edge_row(&r, k + (size_t)i * w, w, i);
            edge_row(&r, v + (size_t)i * w, w, i + 1);
        }
        krn_kv_write_args_t a = {.kv = kv,
                                 .layer = 1,
                                 .k = k,
                                 .v = v,
                                 .row_seq = seq,
                                 .row_pos = pos,
                                 .block_tables = tables,
                                 .n_rows = ROWS,
                                 .max_blocks = MAXB};
        ASSERT_EQ(krn_ref_kv_write(&a), 0);
        /* Every written row is the engine's quantization at the engine's offset; then those
         * rows are put back to their poison and the pool must equal its old bytes. */
        size_t rb = eng_kvpool_row_bytes(pool);
        uint8_t want[8 * 34];
        for (int i = 0; i < ROWS; i++) {
            uint32_t b = (uint32_t)tables[seq[i] * MAXB + pos[i] / (int32_t)bt],
                     slot = (uint32_t)pos[i] % bt;
            for (uint32_t h = 0; h < nkv; h++) {
                uint8_t *s = eng_kvpool_kv(pool, b, 1, h);
                eng_kv_q8_0_quantize(k + (size_t)i * w + h * hd, hd, want);
                ASSERT_MEM_EQ(s + slot * rb, want, rb);
                eng_kv_q8_0_quantize(v + (size_t)i * w + h * hd, hd, want);
                ASSERT_MEM_EQ(s + (bt + slot) * rb, want, rb);
                const uint8_t *old = before + (s - (uint8_t *)kv.base);
                memcpy(s + slot * rb, old + slot * rb, rb);
                memcpy(s + (bt + slot) * rb, old + (bt + slot) * rb, rb);
            }
        }
        ASSERT_MEM_EQ(kv.base, before, bytes);
        /* A row without a block is refused, nothing written. */
        int32_t bad_pos = MAXB * (int32_t)bt;
        a.row_pos = &bad_pos;
        a.n_rows = 1;
        ASSERT_EQ(krn_ref_kv_write(&a), PC_ERR_INVAL);
        ASSERT_MEM_EQ(kv.base, before, bytes);

        /* Block copies: the reference on a shadow of the pool vs eng_kvpool_copy. */
        for (uint32_t i = 0; i < 4; i++) {
            float row[256 * 4];
            for (uint32_t p = 0; p < bt; p++)
                for (uint32_t l = 0; l < 2; l++)
                    for (uint32_t h = 0; h < nkv; h++) {
                        uint8_t *s = eng_kvpool_kv(pool, ids[i], l, h);
                        edge_row(&r, row, (int32_t)(2 * hd), (int32_t)p);
                        eng_kv_q8_0_quantize(row, hd, s + p * rb);
                        eng_kv_q8_0_quantize(row + hd, hd, s + (bt + p) * rb);
                    }
        }
        uint8_t *shadow = malloc(bytes);
        memcpy(shadow, kv.base, bytes);
        krn_kv_t kv2 = kv;
        kv2.base = shadow;
        int32_t src[3] = {(int32_t)ids[0], (int32_t)ids[1], (int32_t)ids[2]},
                dst[3] = {(int32_t)ids[5], (int32_t)ids[6], (int32_t)ids[3]};
        int32_t nt[3] = {(int32_t)bt, (int32_t)kt_below(&r, bt), 1};
        for (int i = 0; i < 3; i++)
            eng_kvpool_copy(pool, (uint32_t)dst[i], (uint32_t)src[i], (uint32_t)nt[i]);
        krn_block_copy_args_t c = {.kv = kv2, .src = src, .dst = dst, .n_tokens = nt, .n = 3};
        ASSERT_EQ(krn_ref_block_copy(&c), 0);
        ASSERT_MEM_EQ(shadow, kv.base, bytes);
        free(shadow);
        free(before);
        free(k);
        free(v);
        for (uint32_t i = 0; i < nb; i++)
            eng_kvpool_unref(pool, ids[i]);
        eng_kvpool_free(pool);
    }
}

/* The fused QKV epilogue into a q8_0 pool stores the quantization of what it stores into an
 * F32 pool, and the same queries. */
PC_TEST(fused_qkv_epilogue_quantizes_its_rows)
{
    kt_rng_t r = {93};
    for (int ci = 0; ci < 4; ci++) {
        int32_t hd = ci % 2 ? 128 : 64, nkv = 1 + ci % 3;
        kf_case_t f32, q8;
        kt_rng_t r2 = r;
        kf_make(&f32, &r, 7, 4 * nkv, nkv, hd, 16, KRN_F32, ci & 1, ci & 2, KRN_ROPE_NEOX, hd);
        kf_make(&q8, &r2, 7, 4 * nkv, nkv, hd, 16, KRN_Q8_0, ci & 1, ci & 2, KRN_ROPE_NEOX, hd);
        size_t nq = (size_t)7 * 4 * nkv * hd;
        float *qa = malloc(sizeof(float) * nq), *qb = malloc(sizeof(float) * nq);
        krn_qkv_rope_kv_args_t a = kf_args(&f32, qa), b = kf_args(&q8, qb);
        ASSERT_EQ(krn_ref_qkv_rope_kv(&a), 0);
        ASSERT_EQ(krn_ref_qkv_rope_kv(&b), 0);
        ASSERT_MEM_EQ(qa, qb, sizeof(float) * nq);
        size_t rb = krn_kv_row_bytes(&q8.kv);
        uint8_t want[4 * 34];
        float row[128];
        for (int32_t i = 0; i < 7; i++) {
            int32_t blk = q8.tables[q8.seq[i] * q8.max_blocks + q8.pos[i] / 16],
                    slot = q8.pos[i] % 16;
            for (int32_t h = 0; h < nkv; h++) {
                const uint8_t *s =
                    (const uint8_t *)q8.kv.base + krn_kv_slice_byte_offset(&q8.kv, blk, 1, h);
                for (int v = 0; v < 2; v++) {
                    for (int32_t d = 0; d < hd; d++)
                        row[d] = kt_kv_get(&f32.kv, blk, 1, h, v == 1, slot, d);
                    krn_q8_0_quantize(row, hd, want);
                    ASSERT_MEM_EQ(s + (size_t)(v * 16 + slot) * rb, want, rb);
                }
            }
        }
        free(qa);
        free(qb);
        kf_free(&f32);
        kf_free(&q8);
    }
}

/* The references on q8_0 scenarios (NaN in every unwritten slot) against the dense double
 * attention, prefill plans with and without splits, and the decode reference. */
PC_TEST(attention_references_read_q8_0_in_place)
{
    kt_rng_t r = {94};
    const struct {
        int32_t nh, nkv, hd, bt;
    } shapes[] = {{8, 2, 64, 16}, {4, 4, 32, 8}, {16, 2, 128, 16}, {8, 8, 256, 16}, {6, 2, 32, 5}};
    for (size_t si = 0; si < PC_ARRAY_LEN(shapes); si++) {
        int32_t bt = shapes[si].bt, mb = 1 + 160 / bt, n_seqs = 3;
        for (int decode = 0; decode < 2; decode++) {
            int32_t ctx[3], nt[3];
            for (int32_t s = 0; s < n_seqs; s++) {
                nt[s] = decode ? 1 : 1 + (int32_t)kt_below(&r, 40);
                ctx[s] =
                    s == 0 ? mb * bt - nt[s] : (int32_t)kt_below(&r, (uint32_t)(mb * bt - nt[s]));
            }
            kt_attn_t t;
            ASSERT_EQ(kt_attn_make(&t, &r, shapes[si].nh, shapes[si].nkv, shapes[si].hd, bt,
                                   KRN_Q8_0, n_seqs, ctx, nt, mb),
                      0);
            int64_t n_out = (int64_t)t.n_rows * t.n_head * shapes[si].hd;
            double *dense = malloc(sizeof(double) * (size_t)n_out);
            kt_attn_dense(&t, dense);
            for (int split = 0; split < 2; split++) {
                krn_attn_args_t a;
                ASSERT_EQ(kt_attn_plan(&t, split ? 2 * bt : 0, &a), 0);
                ASSERT_EQ(krn_ref_attention(&a), 0);
                double err = kt_rel_err_d(t.out, dense, n_out);
                kt_attn_plan_free(&a);
                if (!(err <= 2e-6))
                    PC_TEST__FAIL("shape %zu decode %d split %d: attention error %g", si, decode,
                                  split, err);
            }
            if (decode && krn_decode_check(&t.kv, t.n_head) == 0) {
                krn_decode_args_t d;
                kt_decode_args(&t, 2 * bt, &d);
                ASSERT_EQ(krn_ref_decode_attention(&d), 0);
                double err = kt_rel_err_d(t.out, dense, n_out);
                kt_decode_free(&d);
                if (!(err <= 2e-6))
                    PC_TEST__FAIL("shape %zu: decode error %g", si, err);
            }
            free(dense);
            kt_attn_free(&t);
        }
    }
}

/* The references and the engine's CPU attention (portable and SIMD paths) over the same q8_0
 * blocks of the engine's pool: the same quantized query, the same integer scores. */
PC_TEST(attention_reference_matches_the_engines_q8_0_attention)
{
    kt_rng_t r = {95};
    const uint32_t shapes[][4] = {{8, 2, 64, 16}, {16, 4, 128, 16}, {4, 1, 32, 16}};
    for (size_t si = 0; si < PC_ARRAY_LEN(shapes); si++) {
        uint32_t nh = shapes[si][0], nkv = shapes[si][1], hd = shapes[si][2], bt = shapes[si][3];
        eng_kvpool_t *pool;
        krn_kv_t kv;
        q8_pool(nkv, hd, bt, &pool, &kv);
        uint32_t nb = eng_kvpool_n_blocks(pool), ids[64];
        for (uint32_t i = 0; i < nb; i++)
            ASSERT_EQ(eng_kvpool_alloc(pool, &ids[i]), 0);
        enum { MAXB = 6 };
        int32_t tables[2 * MAXB];
        for (int i = 0; i < 2 * MAXB; i++)
            tables[i] = (int32_t)ids[(uint32_t)(i * 7) % nb];
        int32_t len[2] = {MAXB * (int32_t)bt, 1 + (int32_t)kt_below(&r, MAXB * bt)};
        int32_t n_rows = len[0] + len[1], wk = (int32_t)(nkv * hd), wq = (int32_t)(nh * hd);
        float *k = kf_rand(&r, (size_t)n_rows * wk, 1.0f),
              *v = kf_rand(&r, (size_t)n_rows * wk, 1.0f);
        float *q = kf_rand(&r, (size_t)n_rows * wq, 0.5f);
        float *o1 = malloc(sizeof(float) * (size_t)n_rows * wq),
              *o2 = malloc(sizeof(float) * (size_t)n_rows * wq);
        int32_t *pos = malloc(sizeof(int32_t) * (size_t)n_rows),
                *seq = malloc(sizeof(int32_t) * (size_t)n_rows);
        uint32_t *upos = malloc(sizeof(uint32_t) * (size_t)n_rows);
        for (int32_t i = 0; i < n_rows; i++) {
            seq[i] = i < len[0] ? 0 : 1;
            pos[i] = i < len[0] ? i : i - len[0];
            upos[i] = (uint32_t)pos[i];
        }
        krn_kv_write_args_t w = {.kv = kv,
                                 .layer = 1,
                                 .k = k,
                                 .v = v,
                                 .row_seq = seq,
                                 .row_pos = pos,
                                 .block_tables = tables,
                                 .n_rows = n_rows,
                                 .max_blocks = MAXB};
        ASSERT_EQ(krn_ref_kv_write(&w), 0);
        kt_attn_t t = {.kv = kv,
                       .layer = 1,
                       .n_head = (int32_t)nh,
                       .n_seqs = 2,
                       .max_blocks = MAXB,
                       .n_rows = n_rows,
                       .tables = tables,
                       .row_pos = pos,
                       .row_seq = seq,
                       .q = q,
                       .out = o2};
        krn_plan_seq_t ps[2] = {{0, len[0], 0}, {len[0], len[1], 0}};
        t.seqs = ps;
        krn_attn_args_t a;
        ASSERT_EQ(kt_attn_plan(&t, 0, &a), 0);
        ASSERT_EQ(krn_ref_attention(&a), 0);
        kt_attn_plan_free(&a);
        for (int simd = 0; simd < 2; simd++) {
            const uint32_t *eng_tables[2] = {(const uint32_t *)&tables[0],
                                             (const uint32_t *)&tables[MAXB]};
            eng_attn_args_t ea = {.q = q,
                                  .out = o1,
                                  .pos = upos,
                                  .blocks = eng_tables,
                                  .kvpool = pool,
                                  .layer = 1,
                                  .n_head = nh,
                                  .n_head_kv = nkv,
                                  .head_dim = hd,
                                  .block_tokens = bt,
                                  .kv_q8_0 = true,
                                  .simd = simd == 1};
            uint32_t group = nh / nkv, per = 64 / group > 16 ? 16 : 64 / group;
            float *scratch = malloc(sizeof(float) * eng__attention_scratch_floats(hd, bt, 64));
            for (int32_t s = 0; s < 2; s++) {
                int32_t r0 = s == 0 ? 0 : len[0];
                for (uint32_t h = 0; h < nkv; h++)
                    for (int32_t t0 = 0; t0 < len[s]; t0 += (int32_t)per) {
                        int32_t t1 = t0 + (int32_t)per < len[s] ? t0 + (int32_t)per : len[s];
                        eng_attn_task_t task = {.seq = (uint32_t)s,
                                                .kv_head = h,
                                                .t0 = (uint32_t)(r0 + t0),
                                                .t1 = (uint32_t)(r0 + t1)};
                        eng__attention(&ea, &task, scratch);
                    }
            }
            free(scratch);
            double err = kt_rel_err_f(o2, o1, (int64_t)n_rows * wq);
            if (!(err <= 1e-5))
                PC_TEST__FAIL("shape %zu simd %d: reference vs engine %g", si, simd, err);
        }
        free(k);
        free(v);
        free(q);
        free(o1);
        free(o2);
        free(pos);
        free(seq);
        free(upos);
        for (uint32_t i = 0; i < nb; i++)
            eng_kvpool_unref(pool, ids[i]);
        eng_kvpool_free(pool);
    }
}

PC_TEST(q8_0_kernel_shapes_and_shared_memory)
{
    krn_kv_t kv = {.n_blocks = 1,
                   .n_layer = 1,
                   .n_head_kv = 8,
                   .head_dim = 128,
                   .block_tokens = 16,
                   .dtype = KRN_Q8_0};
    /* 34/64 of F16's bytes per token. */
    ASSERT_EQ(krn_kv_row_bytes(&kv), (size_t)136);
    krn_kv_t f16 = kv;
    f16.dtype = KRN_F16;
    ASSERT_EQ(krn_kv_block_bytes(&kv) * 64, krn_kv_block_bytes(&f16) * 34);
    ASSERT_EQ(krn_decode_check(&kv, 64), 0);
    ASSERT_EQ(krn_decode_slice_bytes(128, 16, KRN_Q8_0), (int64_t)4352);
    ASSERT_EQ(krn_decode_warps_of(4352), 4);
    /* Slices that are not whole 16-byte words (block_tokens 5, head_dim 32: 340 bytes) go to
     * krn_attention; head_dim not a multiple of 32 has no q8_0 form. */
    kv.block_tokens = 5;
    kv.head_dim = 32;
    ASSERT_EQ(krn_decode_check(&kv, 8), PC_ERR_INVAL);
    /* The tensor-core prefill kernel takes F16 pools only. */
    kv.block_tokens = 16;
    ASSERT_EQ(krn_attn_tc_check(&kv, 8), PC_ERR_INVAL);
    for (int32_t hd = 32; hd <= KRN_ATTN_MAX_HEAD_DIM; hd += 32) {
        for (int32_t g = 1; g <= 16 && g * hd <= 2048; g++) {
            /* The staging after q and its scales starts on a 16-byte boundary. */
            size_t head =
                sizeof(float) * ((size_t)g * hd + (size_t)krn_decode_qd_floats(hd, g, KRN_Q8_0));
            ASSERT_EQ(head % 16, (size_t)0);
            ASSERT_TRUE(krn_decode_qd_floats(hd, g, KRN_Q8_0) >= g * hd / 32);
            ASSERT_TRUE(krn_decode_smem_of(hd, 16, KRN_Q8_0, g) <= 163 * 1024);
        }
        /* The SIMT kernel's K tile holds a chunk's raw rows; its scales fit the extra room. */
        int32_t c = krn_attn_chunk(hd);
        ASSERT_TRUE((size_t)c * (size_t)(hd / 32) * 34 <= (size_t)c * (size_t)hd * 4);
        ASSERT_EQ(krn_attn_smem_bytes_of(hd, KRN_Q8_0) - krn_attn_smem_bytes(hd),
                  sizeof(float) * (size_t)krn_attn_max_rows(hd) * (size_t)(hd / 32));
        ASSERT_TRUE(krn_attn_smem_bytes_of(hd, KRN_Q8_0) <= 163 * 1024);
    }
    ASSERT_EQ(krn_attn_smem_bytes_of(128, KRN_F16), krn_attn_smem_bytes(128));
}

PC_TEST_MAIN()
