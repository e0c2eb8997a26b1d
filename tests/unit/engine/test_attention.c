/*
 * test_attention.c — the CPU backend's paged attention (eng__attention): the AVX-512 and AVX2
 * paths (64-key chunks; each one the CPU runs) and the portable path (block by block) against a
 * naive double-precision softmax over the same keys, on sequences long enough for many chunks, with
 * query runs that start mid-block and mid-chunk, several group sizes and head sizes (32 and 48
 * exercise the 16-column tail, 128 two passes of 32), block sizes 8, 16 and 32, F16 and F32 KV, and
 * NaN in every unwritten KV slot so a stray read fails. q8_0 KV: the reference attends with the
 * dequantized K and V and the query quantized to q8_0 and back (what the kernels compute, with
 * integer dot products), and every SIMD path is also compared with the portable one.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "cpu_kernels.h"
#include "kvpool.h"
#include "pc_assert.h"
#include "pc_test.h"

static uint64_t g_rng = 0x853c49e6748fea9bull;

static float unif(void)
{
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) * 0x1.0p-53 * 2 - 1);
}

typedef struct attn_case {
    uint32_t n_head, n_head_kv, head_dim, block_tokens;
    enum eng_kv_dtype dtype;
    uint32_t n_ctx;  /* positions with KV: [0, n_ctx) */
    uint32_t q0, nq; /* query rows at positions [q0, q0 + nq), q0 + nq <= n_ctx */
} attn_case_t;

/* The stored value of x (F16 KV rounds it). */
static float stored(float x, enum eng_kv_dtype dt)
{
    return dt == ENG_KV_F16 ? eng_f16_to_f32(eng_f32_to_f16(x)) : x;
}

static void run_case(const attn_case_t *c)
{
    uint32_t hd = c->head_dim, bt = c->block_tokens, nkv = c->n_head_kv, nh = c->n_head;
    uint32_t group = nh / nkv, layer = 1, n_blocks = (c->n_ctx + bt - 1) / bt;
    eng_kvpool_params_t kp = eng_kvpool_params_default();
    kp.block_tokens = bt;
    kp.dtype = c->dtype;
    kp.max_tokens = (uint64_t)(n_blocks + 2) * bt;
    kp.poison = true;
    eng_kvpool_t *pool = NULL;
    ASSERT_EQ(eng_kvpool_init(&kp, 2, nkv, hd, &pool), 0);
    /* A table in a scrambled order: block ids do not follow positions. */
    uint32_t *table = malloc(n_blocks * sizeof *table), spare;
    ASSERT_EQ(eng_kvpool_alloc(pool, &spare), 0);
    for (uint32_t i = 0; i < n_blocks; i++)
        ASSERT_EQ(eng_kvpool_alloc(pool, &table[i]), 0);
    for (uint32_t i = n_blocks - 1; i > 0; i--) {
        uint32_t j = (uint32_t)((unif() + 1) * 0.5f * (float)(i + 1)) % (i + 1), x = table[i];
        table[i] = table[j];
        table[j] = x;
    }
    /* K and V of every position (as stored), written into the blocks. */
    size_t kv_n = (size_t)c->n_ctx * nkv * hd;
    float *k = malloc(kv_n * sizeof *k), *v = malloc(kv_n * sizeof *v);
    size_t rb = eng_kvpool_row_bytes(pool);
    uint8_t *qrow = malloc(rb);
    for (uint32_t p = 0; p < c->n_ctx; p++) {
        for (uint32_t h = 0; h < nkv; h++) {
            void *dst = eng_kvpool_kv(pool, table[p / bt], layer, h);
            uint32_t slot = p % bt;
            if (c->dtype == ENG_KV_Q8_0) {
                size_t i = ((size_t)p * nkv + h) * hd;
                for (uint32_t d = 0; d < hd; d++) {
                    k[i + d] = unif() * 2;
                    v[i + d] = unif();
                }
                uint8_t *kd = dst;
                eng_kv_q8_0_quantize(k + i, hd, kd + slot * rb);
                eng_kv_q8_0_quantize(v + i, hd, kd + (bt + slot) * rb);
                eng_kv_q8_0_dequantize(kd + slot * rb, hd, k + i);
                eng_kv_q8_0_dequantize(kd + (bt + slot) * rb, hd, v + i);
                continue;
            }
            for (uint32_t d = 0; d < hd; d++) {
                size_t i = ((size_t)p * nkv + h) * hd + d;
                k[i] = stored(unif() * 2, c->dtype);
                v[i] = stored(unif(), c->dtype);
                if (c->dtype == ENG_KV_F16) {
                    ((uint16_t *)dst)[(size_t)d * bt + slot] = eng_f32_to_f16(k[i]);
                    ((uint16_t *)dst)[(size_t)hd * bt + (size_t)slot * hd + d] =
                        eng_f32_to_f16(v[i]);
                } else {
                    ((float *)dst)[(size_t)d * bt + slot] = k[i];
                    ((float *)dst)[(size_t)hd * bt + (size_t)slot * hd + d] = v[i];
                }
            }
        }
    }
    size_t q_n = (size_t)c->nq * nh * hd;
    float *q = malloc(q_n * sizeof *q), *out = malloc(q_n * sizeof *out);
    double *ref = malloc(q_n * sizeof *ref);
    uint32_t *pos = malloc(c->nq * sizeof *pos);
    float *qref = malloc(q_n * sizeof *qref);
    for (size_t i = 0; i < q_n; i++)
        qref[i] = q[i] = unif() * 0.4f;
    if (c->dtype == ENG_KV_Q8_0) /* the kernels quantize each head's query once */
        for (size_t i = 0; i < q_n; i += hd) {
            eng_kv_q8_0_quantize(q + i, hd, qrow);
            eng_kv_q8_0_dequantize(qrow, hd, qref + i);
        }
    for (uint32_t t = 0; t < c->nq; t++)
        pos[t] = c->q0 + t;
    /* The naive reference: a full softmax over positions [0, pos] of each row. */
    double *s = malloc(c->n_ctx * sizeof *s);
    for (uint32_t t = 0; t < c->nq; t++) {
        for (uint32_t h = 0; h < nh; h++) {
            const float *qh = qref + ((size_t)t * nh + h) * hd;
            uint32_t hk = h / group;
            double mx = -INFINITY, sum = 0;
            for (uint32_t p = 0; p <= pos[t]; p++) {
                double acc = 0;
                for (uint32_t d = 0; d < hd; d++)
                    acc += (double)qh[d] * k[((size_t)p * nkv + hk) * hd + d];
                s[p] = acc;
                mx = acc > mx ? acc : mx;
            }
            for (uint32_t p = 0; p <= pos[t]; p++)
                sum += (s[p] = exp(s[p] - mx));
            for (uint32_t d = 0; d < hd; d++) {
                double o = 0;
                for (uint32_t p = 0; p <= pos[t]; p++)
                    o += s[p] * v[((size_t)p * nkv + hk) * hd + d];
                ref[((size_t)t * nh + h) * hd + d] = o / sum;
            }
        }
    }
    const uint32_t *tables[1] = {table};
    uint32_t per = ENG_ATTN_MAX_ROWS / group;
    float *scratch = malloc(eng__attention_scratch_floats(hd, bt, per * group) * sizeof(float));
    /* Every path this CPU runs: avx512, avx2 (64-key chunks), portable (block by block), the
     * portable one first: the others are compared with it too. */
    float *port = malloc(q_n * sizeof *port);
    int isas[] = {ENG_CPU_ISA_PORTABLE, ENG_CPU_ISA_AVX512, ENG_CPU_ISA_AVX2};
    for (size_t ii = 0; ii < PC_ARRAY_LEN(isas); ii++) {
        int isa = isas[ii];
        if (!eng__cpu_isa_runs((eng_cpu_isa_t)isa))
            continue;
        eng_attn_args_t a = {.q = q,
                             .out = out,
                             .pos = pos,
                             .blocks = tables,
                             .kvpool = pool,
                             .layer = layer,
                             .n_head = nh,
                             .n_head_kv = nkv,
                             .head_dim = hd,
                             .block_tokens = bt,
                             .kv_f16 = c->dtype == ENG_KV_F16,
                             .kv_q8_0 = c->dtype == ENG_KV_Q8_0,
                             .simd = true,
                             .isa = (eng_cpu_isa_t)isa};
        for (size_t i = 0; i < q_n; i++)
            out[i] = NAN;
        for (uint32_t h = 0; h < nkv; h++) {
            for (uint32_t t0 = 0; t0 < c->nq; t0 += per) {
                eng_attn_task_t task = {
                    .seq = 0, .kv_head = h, .t0 = t0, .t1 = PC_MIN(c->nq, t0 + per)};
                eng__attention(&a, &task, scratch);
            }
        }
        if (c->dtype == ENG_KV_Q8_0 && group <= 4) {
            /* One token per task (at most four rows: V read in registers) gives the same bits
             * as the long tasks (V staged once per chunk): a row's result never depends on its
             * task's size, so cached prefixes equal cold ones. */
            float *one = malloc(q_n * sizeof *one);
            float *save = a.out;
            a.out = one;
            for (uint32_t h = 0; h < nkv; h++)
                for (uint32_t t0 = 0; t0 < c->nq; t0++) {
                    eng_attn_task_t task = {.seq = 0, .kv_head = h, .t0 = t0, .t1 = t0 + 1};
                    eng__attention(&a, &task, scratch);
                }
            a.out = save;
            ASSERT_TRUE(memcmp(one, out, q_n * sizeof *one) == 0);
            free(one);
        }
        double num = 0, den = 0, pnum = 0;
        for (size_t i = 0; i < q_n; i++) {
            num += (out[i] - ref[i]) * (out[i] - ref[i]);
            pnum += ((double)out[i] - port[i]) * ((double)out[i] - port[i]);
            den += ref[i] * ref[i];
        }
        if (isa == ENG_CPU_ISA_PORTABLE)
            memcpy(port, out, q_n * sizeof *port);
        double rel = sqrt(num / (den > 0 ? den : 1)), prel = sqrt(pnum / (den > 0 ? den : 1));
        if (isa == ENG_CPU_ISA_PORTABLE)
            prel = 0;
        if (!(rel <= 1e-5) || !(prel <= 1e-5))
            fprintf(stderr,
                    "  heads %u/%u hd %u bt %u %s ctx %u rows %u+%u isa %s: rel err %g, vs "
                    "portable %g\n",
                    nh, nkv, hd, bt, eng_kv_dtype_name(c->dtype), c->n_ctx, c->q0, c->nq,
                    eng__cpu_isa_name((eng_cpu_isa_t)isa), rel, prel);
        ASSERT_LE(rel, 1e-5);
        ASSERT_LE(prel, 1e-5);
    }
    free(port);
    free(qref);
    free(qrow);
    free(scratch);
    free(s);
    free(pos);
    free(ref);
    free(out);
    free(q);
    free(v);
    free(k);
    for (uint32_t i = 0; i < n_blocks; i++)
        eng_kvpool_unref(pool, table[i]);
    eng_kvpool_unref(pool, spare);
    free(table);
    eng_kvpool_free(pool);
}

PC_TEST(long_prefill_rows_match_naive_softmax)
{
    /* The whole sequence as query rows (causal prefill): many chunks, every mask shape. */
    attn_case_t c = {.n_head = 16,
                     .n_head_kv = 4,
                     .head_dim = 64,
                     .block_tokens = 16,
                     .dtype = ENG_KV_F16,
                     .n_ctx = 300,
                     .q0 = 0,
                     .nq = 300};
    PC_TEST_CALL(run_case(&c));
    c.dtype = ENG_KV_F32;
    PC_TEST_CALL(run_case(&c));
}

PC_TEST(chunked_rows_start_mid_block_and_mid_chunk)
{
    /* A cached prefix followed by new rows starting at odd positions. */
    attn_case_t c = {.n_head = 8,
                     .n_head_kv = 2,
                     .head_dim = 128,
                     .block_tokens = 16,
                     .dtype = ENG_KV_F16,
                     .n_ctx = 333,
                     .q0 = 197,
                     .nq = 136};
    PC_TEST_CALL(run_case(&c));
    c = (attn_case_t){.n_head = 4,
                      .n_head_kv = 4,
                      .head_dim = 32,
                      .block_tokens = 8,
                      .dtype = ENG_KV_F32,
                      .n_ctx = 150,
                      .q0 = 71,
                      .nq = 79};
    PC_TEST_CALL(run_case(&c));
    c = (attn_case_t){.n_head = 6,
                      .n_head_kv = 2,
                      .head_dim = 48,
                      .block_tokens = 32,
                      .dtype = ENG_KV_F16,
                      .n_ctx = 261,
                      .q0 = 100,
                      .nq = 161};
    PC_TEST_CALL(run_case(&c));
}

PC_TEST(decode_rows_match_naive_softmax)
{
    /* One row per step (decode), at the end of long contexts, including exact chunk ends. */
    uint32_t ctx[] = {1, 63, 64, 65, 129, 500};
    for (size_t i = 0; i < PC_ARRAY_LEN(ctx); i++) {
        attn_case_t c = {.n_head = 16,
                         .n_head_kv = 4,
                         .head_dim = 64,
                         .block_tokens = 16,
                         .dtype = ENG_KV_F16,
                         .n_ctx = ctx[i],
                         .q0 = ctx[i] - 1,
                         .nq = 1};
        PC_TEST_CALL(run_case(&c));
    }
}

PC_TEST(portable_path_takes_any_block_size)
{
    /* Block sizes the chunks do not divide fall back to the portable path. */
    attn_case_t c = {.n_head = 4,
                     .n_head_kv = 2,
                     .head_dim = 32,
                     .block_tokens = 24,
                     .dtype = ENG_KV_F32,
                     .n_ctx = 100,
                     .q0 = 30,
                     .nq = 70};
    PC_TEST_CALL(run_case(&c));
}

PC_TEST(q8_0_kv_matches_the_dequantized_reference)
{
    /* q8_0 K and V read in place on every path: prefill rows over many chunks, rows starting
     * mid-block, decode rows at chunk edges, head sizes 32 (one q8_0 block), 64 and 128, block
     * sizes 8, 16, 32 and 24 (no SIMD chunk path for F16/F32; q8_0 takes it with any size). */
    attn_case_t cs[] = {
        {16, 4, 64, 16, ENG_KV_Q8_0, 300, 0, 300}, {8, 2, 128, 16, ENG_KV_Q8_0, 333, 197, 136},
        {4, 4, 32, 8, ENG_KV_Q8_0, 150, 71, 79},   {6, 2, 64, 32, ENG_KV_Q8_0, 261, 100, 161},
        {4, 2, 32, 24, ENG_KV_Q8_0, 100, 30, 70},  {16, 4, 64, 16, ENG_KV_Q8_0, 1, 0, 1},
        {16, 4, 64, 16, ENG_KV_Q8_0, 64, 63, 1},   {16, 4, 64, 16, ENG_KV_Q8_0, 65, 64, 1},
        {16, 4, 128, 16, ENG_KV_Q8_0, 500, 499, 1}};
    for (size_t i = 0; i < PC_ARRAY_LEN(cs); i++)
        PC_TEST_CALL(run_case(&cs[i]));
}

PC_TEST(q8_0_quantizer_is_ggml_s)
{
    /* ggml's quantize_row_q8_0_ref: d = amax / 127 stored as F16, q = round(x / d), halves away
     * from zero; an all-zero block has d = 0. */
    float x[64];
    for (int i = 0; i < 32; i++)
        x[i] = (float)(i - 16) * 0.25f; /* amax 4 (x[0] = -4): d = 4/127 */
    memset(x + 32, 0, 32 * sizeof(float));
    uint8_t b[2 * ENG_KV_Q8_0_BYTES];
    eng_kv_q8_0_quantize(x, 64, b);
    uint16_t d0, d1;
    memcpy(&d0, b, 2);
    memcpy(&d1, b + ENG_KV_Q8_0_BYTES, 2);
    ASSERT_EQ(d0, eng_f32_to_f16(4.0f / 127.0f));
    ASSERT_EQ(d1, 0);
    const int8_t *q = (const int8_t *)(b + 2);
    for (int i = 0; i < 32; i++) {
        float want = roundf(x[i] * (1.0f / (4.0f / 127.0f)));
        ASSERT_EQ(q[i], (int8_t)want);
    }
    ASSERT_EQ(q[0], -127);
    for (int i = 0; i < 32; i++)
        ASSERT_EQ(((const int8_t *)(b + ENG_KV_Q8_0_BYTES + 2))[i], 0);
    /* Against roundf on random blocks (the quantizer rounds without libm), scales over many
     * magnitudes: every amax element must map to +-127. */
    for (int it = 0; it < 20000; it++) {
        float r[32], sc = ldexpf(1.0f, (int)(unif() * 20));
        for (int i = 0; i < 32; i++)
            r[i] = unif() * sc;
        if (it % 97 == 0) /* NaN, infinities and zeros too: the paths agree on them */
            r[it % 32] = it % 3 == 0 ? NAN : it % 3 == 1 ? 0.0f : r[it % 32];
        uint8_t qb[ENG_KV_Q8_0_BYTES], qs[ENG_KV_Q8_0_BYTES];
        eng_kv_q8_0_quantize(r, 32, qb);
        for (int isa = ENG_CPU_ISA_AVX2; isa <= ENG_CPU_ISA_AVX512; isa++) {
            if (!eng__cpu_isa_runs((eng_cpu_isa_t)isa))
                continue;
            eng__q8_0_quantize_isa(r, 32, qs, (eng_cpu_isa_t)isa);
            ASSERT_TRUE(memcmp(qs, qb, sizeof qb) == 0);
        }
        if (it % 97 == 0)
            continue;
        float amax = 0;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(r[i]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int i = 0; i < 32; i++) {
            int8_t want = (int8_t)roundf(r[i] * id);
            if (((const int8_t *)(qb + 2))[i] != want)
                fprintf(stderr, "  x %.9g id %.9g: q %d, roundf %d\n", r[i], id,
                        ((const int8_t *)(qb + 2))[i], want);
            ASSERT_EQ(((const int8_t *)(qb + 2))[i], want);
        }
    }
    float y[64];
    eng_kv_q8_0_dequantize(b, 64, y);
    for (int i = 0; i < 32; i++)
        ASSERT_LE(fabsf(y[i] - x[i]), 0.5f * eng_f16_to_f32(d0) + 1e-6f);
}

PC_TEST_MAIN()
