/*
 * test_krn_gpu.c — every CUDA kernel against its CPU reference on random inputs (never zeros),
 * and the cuda engine against the cpu engine end to end. Label gpu: without a CUDA device
 * every test ends SKIPPED (exit code 77) with the reason (krn_device_probe: a driver older
 * than the toolkit is named), never passed; with KVGW_REQUIRE_GPU=1 they fail instead.
 *
 * Tolerances: F32 paths 1e-5 relative norm, F16/BF16 paths 1e-2 (attention over F16 KV reads
 * the same halves as the reference, so it is held to 1e-5 as well, except the tensor-core
 * prefill kernel, which rounds Q and P to F16: 2e-3).
 */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "engine_internal.h" /* eng_kvpool */
#include "kernels.h"
#include "krn_sample_testrows.h"
#include "krn_testutil.h"
#include "pc_assert.h"
#include "pc_err.h"
#include "pc_test.h"
#include "quant.h" /* eng_quant_type_is_quant: the quantized e2e test */

static krn_ctx_t *g_ctx;
static char g_no_gpu[256];

/* KVGW_REQUIRE_GPU=1 (every session on a GPU machine sets it): a missing or unusable device
 * fails the tests instead of skipping them, so a broken driver cannot pass as "no GPU". */
static bool require_gpu(void)
{
    const char *v = getenv("KVGW_REQUIRE_GPU");
    return v != NULL && strcmp(v, "1") == 0;
}

#define NEED_GPU()                                                                                 \
    do {                                                                                           \
        if (g_ctx == NULL && krn_device_probe(g_no_gpu, sizeof g_no_gpu) == 0) {                   \
            if (require_gpu())                                                                     \
                PC_TEST__FAIL("KVGW_REQUIRE_GPU=1 but no usable CUDA device: %s", g_no_gpu);       \
            PC_SKIP(g_no_gpu);                                                                     \
        }                                                                                          \
        if (g_ctx == NULL)                                                                         \
            ASSERT_EQ(krn_ctx_init(0, &g_ctx), 0);                                                 \
    } while (0)

/* A device copy of n bytes of host memory h (never NULL: buffers with nothing to copy come
 * from dev_filled). */
static void *up(const void *h, size_t n)
{
    PC_ASSERT(h != NULL);
    void *d = NULL;
    PC_ASSERT(krn_dev_alloc(g_ctx, n ? n : 1, &d) == 0);
    if (n > 0)
        PC_ASSERT(krn_copy_h2d(g_ctx, d, h, n) == 0);
    return d;
}
/* n bytes of device memory with every byte `fill`: 0xff makes every F16 and F32 element a NaN
 * (scratch a kernel must write before it reads: a stray read poisons the result), 0x7f makes
 * every int32 0x7f7f7f7f (an output no kernel produces: a missing write fails the comparison). */
static void *dev_filled(size_t n, int fill)
{
    void *d = NULL;
    PC_ASSERT(krn_dev_alloc(g_ctx, n ? n : 1, &d) == 0);
    PC_ASSERT(krn_memset(g_ctx, d, fill, n ? n : 1) == 0);
    return d;
}
static void down(void *h, const void *d, size_t n)
{
    PC_ASSERT(krn_copy_d2h(g_ctx, h, d, n) == 0);
    PC_ASSERT(krn_ctx_sync(g_ctx) == 0);
}

PC_TEST(elementwise_kernels_match_references)
{
    NEED_GPU();
    kt_rng_t r = {21};
    enum { R = 37, W = 200, H = 5, HD = 40, V = 50 };
    float x[R * W], w[W], u[R * W], want[R * W], got[R * W];
    for (int i = 0; i < R * W; i++) {
        x[i] = kt_unif(&r) * 4;
        u[i] = kt_unif(&r);
    }
    for (int i = 0; i < W; i++)
        w[i] = kt_unif(&r);
    float *dx = up(x, sizeof x), *dw = up(w, sizeof w), *du = up(u, sizeof u);
    float *dy = up(x, sizeof x);
    /* RMSNorm (out of place) and q/k norm (in place, head-wide rows). */
    krn_rmsnorm_args_t a = {.x = x, .w = w, .y = want, .n_rows = R, .width = W, .eps = 1e-6f};
    ASSERT_EQ(krn_ref_rmsnorm(&a), 0);
    krn_rmsnorm_args_t da = {.x = dx, .w = dw, .y = dy, .n_rows = R, .width = W, .eps = 1e-6f};
    ASSERT_EQ(krn_rmsnorm(g_ctx, &da), 0);
    down(got, dy, sizeof got);
    ASSERT_LE(kt_rel_err_f(got, want, R * W), 1e-5);
    memcpy(want, x, sizeof x);
    a = (krn_rmsnorm_args_t){
        .x = want, .w = w, .y = want, .n_rows = R * 5, .width = 40, .eps = 1e-6f};
    ASSERT_EQ(krn_ref_qk_norm(&a), 0);
    ASSERT_EQ(krn_copy_h2d(g_ctx, dy, x, sizeof x), 0);
    da =
        (krn_rmsnorm_args_t){.x = dy, .w = dw, .y = dy, .n_rows = R * 5, .width = 40, .eps = 1e-6f};
    ASSERT_EQ(krn_qk_norm(g_ctx, &da), 0);
    down(got, dy, sizeof got);
    ASSERT_LE(kt_rel_err_f(got, want, R * W), 1e-5);
    /* RoPE both styles, partial rope_dim, large positions. */
    int32_t pos[R];
    for (int i = 0; i < R; i++)
        pos[i] = (int32_t)kt_below(&r, 200000);
    int32_t *dpos = up(pos, sizeof pos);
    float inv[HD / 2];
    for (int i = 0; i < HD / 2; i++)
        inv[i] = (float)(pow(10000.0, -2.0 * i / HD) / (1 + i % 3));
    float *dinv = up(inv, sizeof inv);
    for (int style = 0; style < 2; style++) {
        int rd = style ? HD : HD - 8;
        memcpy(want, x, sizeof x);
        krn_rope_args_t ra = {.x = want,
                              .pos = pos,
                              .inv_freq = inv,
                              .n_rows = R,
                              .n_heads = H,
                              .head_dim = HD,
                              .rope_dim = rd,
                              .style = style ? KRN_ROPE_NEOX : KRN_ROPE_NORM,
                              .post_scale = 0.125f};
        ASSERT_EQ(krn_ref_rope(&ra), 0);
        ASSERT_EQ(krn_copy_h2d(g_ctx, dy, x, sizeof x), 0);
        ra.x = dy;
        ra.pos = dpos;
        ra.inv_freq = dinv;
        ASSERT_EQ(krn_rope(g_ctx, &ra), 0);
        down(got, dy, sizeof got);
        ASSERT_LE(kt_rel_err_f(got, want, R * W), 1e-5);
    }
    /* SwiGLU, add, bias add. */
    memcpy(want, x, sizeof x);
    krn_swiglu_args_t sg = {.g = want, .u = u, .n = R * W};
    ASSERT_EQ(krn_ref_swiglu(&sg), 0);
    krn_bias_add_args_t ba = {.x = want, .b = w, .n_rows = R, .width = W};
    ASSERT_EQ(krn_ref_bias_add(&ba), 0);
    krn_add_args_t ad = {.x = want, .y = u, .n = R * W};
    ASSERT_EQ(krn_ref_add(&ad), 0);
    ASSERT_EQ(krn_copy_h2d(g_ctx, dy, x, sizeof x), 0);
    sg = (krn_swiglu_args_t){.g = dy, .u = du, .n = R * W};
    ASSERT_EQ(krn_swiglu(g_ctx, &sg), 0);
    ba = (krn_bias_add_args_t){.x = dy, .b = dw, .n_rows = R, .width = W};
    ASSERT_EQ(krn_bias_add(g_ctx, &ba), 0);
    ad = (krn_add_args_t){.x = dy, .y = du, .n = R * W};
    ASSERT_EQ(krn_add(g_ctx, &ad), 0);
    down(got, dy, sizeof got);
    ASSERT_LE(kt_rel_err_f(got, want, R * W), 1e-5);
    /* Embedding gather from each table type, and F16/BF16 conversion (bit exact). */
    uint16_t t16[V * W], h_want[R * W], h_got[R * W];
    int32_t ids[R];
    for (int i = 0; i < R; i++)
        ids[i] = (int32_t)kt_below(&r, V);
    int32_t *dids = up(ids, sizeof ids);
    for (int dt = 0; dt < 3; dt++) {
        float table[V * W];
        for (int i = 0; i < V * W; i++) {
            table[i] = kt_unif(&r);
            t16[i] = dt == 1 ? krn_f32_to_f16(table[i]) : krn_f32_to_bf16(table[i]);
        }
        const void *ht = dt == 0 ? (const void *)table : t16;
        size_t tb = dt == 0 ? sizeof table : sizeof t16;
        void *dt_table = up(ht, tb);
        krn_embed_args_t ea = {.table = ht,
                               .ids = ids,
                               .out = want,
                               .n_rows = R,
                               .width = W,
                               .n_vocab = V,
                               .table_dtype = (enum krn_dtype)dt};
        ASSERT_EQ(krn_ref_embed(&ea), 0);
        ea = (krn_embed_args_t){.table = dt_table,
                                .ids = dids,
                                .out = dy,
                                .n_rows = R,
                                .width = W,
                                .n_vocab = V,
                                .table_dtype = (enum krn_dtype)dt};
        ASSERT_EQ(krn_embed(g_ctx, &ea), 0);
        down(got, dy, sizeof got);
        ASSERT_MEM_EQ(got, want, sizeof got);
        krn_dev_free(g_ctx, dt_table);
        if (dt == 0)
            continue;
        krn_convert_args_t ca = {.x = x, .y = h_want, .n = R * W, .dtype = (enum krn_dtype)dt};
        ASSERT_EQ(krn_ref_convert(&ca), 0);
        ca = (krn_convert_args_t){.x = dx, .y = du, .n = R * W, .dtype = (enum krn_dtype)dt};
        ASSERT_EQ(krn_convert(g_ctx, &ca), 0);
        down(h_got, du, sizeof h_got);
        ASSERT_MEM_EQ(h_got, h_want, sizeof h_got);
    }
    krn_dev_free(g_ctx, dx);
    krn_dev_free(g_ctx, dw);
    krn_dev_free(g_ctx, du);
    krn_dev_free(g_ctx, dy);
    krn_dev_free(g_ctx, dpos);
    krn_dev_free(g_ctx, dinv);
    krn_dev_free(g_ctx, dids);
}

PC_TEST(gemm_matches_reference)
{
    NEED_GPU();
    kt_rng_t r = {22};
    const int32_t shapes[][3] = {{1, 64, 64}, {7, 200, 96}, {128, 512, 256}, {333, 130, 72}};
    for (size_t si = 0; si < PC_ARRAY_LEN(shapes); si++) {
        int32_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        for (int dt = 1; dt < 3; dt++) {
            size_t nx = (size_t)M * K, nw = (size_t)N * K, ny = (size_t)M * N;
            uint16_t *x = malloc(nx * 2), *w = malloc(nw * 2);
            float *y = malloc(ny * 4), *want = malloc(ny * 4);
            for (size_t i = 0; i < nx; i++)
                x[i] = dt == 1 ? krn_f32_to_f16(kt_unif(&r)) : krn_f32_to_bf16(kt_unif(&r));
            for (size_t i = 0; i < nw; i++)
                w[i] = dt == 1 ? krn_f32_to_f16(kt_unif(&r)) : krn_f32_to_bf16(kt_unif(&r));
            for (size_t i = 0; i < ny; i++)
                want[i] = kt_unif(&r);
            void *dx = up(x, nx * 2), *dw = up(w, nw * 2);
            float *dy = up(want, ny * 4);
            krn_gemm_args_t g = {.x = x,
                                 .w = w,
                                 .y = want,
                                 .M = M,
                                 .N = N,
                                 .K = K,
                                 .dtype = (enum krn_dtype)dt,
                                 .accumulate = si % 2 == 1};
            ASSERT_EQ(krn_ref_gemm(&g), 0);
            g.x = dx;
            g.w = dw;
            g.y = dy;
            ASSERT_EQ(krn_gemm(g_ctx, &g), 0);
            down(y, dy, ny * 4);
            double err = kt_rel_err_f(y, want, (int64_t)ny);
            free(x);
            free(w);
            free(y);
            free(want);
            krn_dev_free(g_ctx, dx);
            krn_dev_free(g_ctx, dw);
            krn_dev_free(g_ctx, dy);
            ASSERT_LE(err, 1e-5); /* same rounded inputs, F32 accumulation */
        }
    }
}

/* One attention scenario on the device: kv_write of the new rows (device) vs the reference's
 * pool, then attention vs the reference attention. */
static void attn_case(kt_rng_t *r, int32_t n_head, int32_t n_head_kv, int32_t hd, int32_t bt,
                      enum krn_dtype dt, int32_t n_seqs, int32_t max_blocks, int32_t split_kv,
                      bool decode)
{
    int32_t ctx[8], nt[8];
    for (int32_t s = 0; s < n_seqs; s++) {
        int32_t cap = max_blocks * bt;
        nt[s] = decode ? 1 : 1 + (int32_t)kt_below(r, (uint32_t)(cap < 300 ? cap : 300));
        ctx[s] = (int32_t)kt_below(r, (uint32_t)(cap - nt[s] + 1));
        if (s == 0)
            ctx[s] = cap - nt[s]; /* one sequence at the maximum length */
    }
    kt_attn_t t;
    ASSERT_EQ(kt_attn_make(&t, r, n_head, n_head_kv, hd, bt, dt, n_seqs, ctx, nt, max_blocks), 0);
    krn_attn_args_t a;
    ASSERT_EQ(kt_attn_plan(&t, split_kv, &a), 0);
    /* Device pool = the host pool with the new rows' slots poisoned again; kv_write fills them
     * from k/v rows read back out of the host pool. */
    int32_t wk = n_head_kv * hd;
    float *k = malloc(sizeof(float) * (size_t)t.n_rows * wk),
          *v = malloc(sizeof(float) * (size_t)t.n_rows * wk);
    size_t pool_bytes = krn_kv_block_bytes(&t.kv) * (size_t)t.kv.n_blocks;
    uint8_t *host2 = malloc(pool_bytes);
    memcpy(host2, t.kv.base, pool_bytes);
    krn_kv_t kv2 = t.kv;
    kv2.base = host2;
    for (int32_t i = 0; i < t.n_rows; i++) {
        int32_t p = t.row_pos[i], b = t.tables[(int64_t)t.row_seq[i] * max_blocks + p / bt];
        if (dt == KRN_Q8_0) {
            /* k/v as d * q: quantizing them again gives the same bytes (d * 127 and d * q are
             * exact in F32, so the scale and every quant come back), so the pools compare
             * bit for bit. The rows are poisoned again as whole q8_0 rows. */
            size_t rb = krn_kv_row_bytes(&t.kv);
            for (int32_t h = 0; h < n_head_kv; h++) {
                for (int32_t d = 0; d < hd; d++) {
                    k[(int64_t)i * wk + h * hd + d] =
                        kt_kv_get(&t.kv, b, t.layer, h, false, p % bt, d);
                    v[(int64_t)i * wk + h * hd + d] =
                        kt_kv_get(&t.kv, b, t.layer, h, true, p % bt, d);
                }
                uint8_t *sl = host2 + krn_kv_slice_byte_offset(&t.kv, b, t.layer, h);
                memset(sl + (size_t)(p % bt) * rb, 0xff, rb);
                memset(sl + (size_t)(bt + p % bt) * rb, 0xff, rb);
            }
            continue;
        }
        for (int32_t h = 0; h < n_head_kv; h++) {
            int64_t base = krn_kv_slice_offset(&t.kv, b, t.layer, h);
            for (int32_t d = 0; d < hd; d++) {
                int64_t ko = base + (int64_t)d * bt + p % bt;
                int64_t vo = base + (int64_t)hd * bt + (int64_t)(p % bt) * hd + d;
                k[(int64_t)i * wk + h * hd + d] = kt_load(&t.kv, ko);
                v[(int64_t)i * wk + h * hd + d] = kt_load(&t.kv, vo);
                kt_store(&kv2, ko, NAN);
                kt_store(&kv2, vo, NAN);
            }
        }
    }
    ASSERT_EQ(krn_ref_attention(&a), 0);
    int64_t n_out = (int64_t)t.n_rows * n_head * hd;
    krn_kv_t dkv = t.kv;
    dkv.base = up(host2, pool_bytes);
    float *dk = up(k, sizeof(float) * (size_t)t.n_rows * wk),
          *dv = up(v, sizeof(float) * (size_t)t.n_rows * wk);
    int32_t *dseq = up(t.row_seq, sizeof(int32_t) * (size_t)t.n_rows);
    int32_t *dpos = up(t.row_pos, sizeof(int32_t) * (size_t)t.n_rows);
    int32_t *dtab = up(t.tables, sizeof(int32_t) * (size_t)n_seqs * max_blocks);
    krn_kv_write_args_t kw = {.kv = dkv,
                              .layer = t.layer,
                              .k = dk,
                              .v = dv,
                              .row_seq = dseq,
                              .row_pos = dpos,
                              .block_tables = dtab,
                              .n_rows = t.n_rows,
                              .max_blocks = max_blocks};
    ASSERT_EQ(krn_kv_write(g_ctx, &kw), 0);
    krn_attn_args_t da = a;
    da.kv = dkv;
    da.q = up(t.q, sizeof(float) * (size_t)n_out);
    float *out_nan = malloc(sizeof(float) * (size_t)n_out);
    for (int64_t i = 0; i < n_out; i++)
        out_nan[i] = NAN;
    da.out = up(out_nan, sizeof(float) * (size_t)n_out);
    da.row_pos = dpos;
    da.block_tables = dtab;
    da.tasks = up(a.tasks, sizeof(krn_attn_task_t) * (size_t)a.n_tasks);
    da.merges = up(a.merges, sizeof(krn_attn_merge_t) * (size_t)a.n_merges);
    int32_t n_parts = 0;
    for (int32_t i = 0; i < a.n_merges; i++)
        n_parts += a.merges[i].n_splits * a.merges[i].n_rows * (n_head / n_head_kv);
    da.part_o = dev_filled(sizeof(float) * ((size_t)n_parts * hd + 1), 0xff);
    da.part_ml = dev_filled(sizeof(float) * ((size_t)n_parts * 2 + 1), 0xff);
    ASSERT_EQ(krn_attention(g_ctx, &da), 0);
    float *got = malloc(sizeof(float) * (size_t)n_out);
    down(got, da.out, sizeof(float) * (size_t)n_out);
    /* The written pool equals the reference's (bit exact: same F32 -> F16 rounding). */
    uint8_t *pool_back = malloc(pool_bytes);
    down(pool_back, dkv.base, pool_bytes);
    int pool_same = memcmp(pool_back, t.kv.base, pool_bytes) == 0;
    double err = kt_rel_err_f(got, t.out, n_out);
    krn_dev_free(g_ctx, dkv.base);
    krn_dev_free(g_ctx, dk);
    krn_dev_free(g_ctx, dv);
    krn_dev_free(g_ctx, dseq);
    krn_dev_free(g_ctx, dpos);
    krn_dev_free(g_ctx, dtab);
    krn_dev_free(g_ctx, (void *)da.q);
    krn_dev_free(g_ctx, da.out);
    krn_dev_free(g_ctx, (void *)da.tasks);
    krn_dev_free(g_ctx, (void *)da.merges);
    krn_dev_free(g_ctx, da.part_o);
    krn_dev_free(g_ctx, da.part_ml);
    free(k);
    free(v);
    free(host2);
    free(out_nan);
    free(got);
    free(pool_back);
    /* Multi-token tasks of an F16 pool run on tensor cores (F16 Q and P): 2e-3, see
     * prefill_attention_on_tensor_cores. */
    bool multi = false;
    for (int32_t i = 0; i < a.n_tasks; i++)
        multi = multi || a.tasks[i].n_rows > 1;
    double tol = multi && krn_attn_use_tc(&t.kv, n_head, getenv("KVGW_CUDA_ATTN")) ? 2e-3 : 1e-5;
    kt_attn_plan_free(&a);
    kt_attn_free(&t);
    ASSERT_TRUE(pool_same);
    ASSERT_LE(err, tol);
}

PC_TEST(attention_and_kv_write_match_reference)
{
    NEED_GPU();
    kt_rng_t r = {23};
    const struct {
        int32_t nh, nkv, hd, bt;
    } shapes[] = {{4, 4, 16, 16}, {8, 2, 64, 16},  {32, 8, 128, 16}, {16, 1, 128, 32},
                  {12, 4, 96, 8}, {8, 8, 256, 16}, {64, 1, 64, 64},  {6, 2, 32, 5}};
    for (size_t i = 0; i < PC_ARRAY_LEN(shapes); i++) {
        for (int dt = 0; dt < 3; dt++) {
            enum krn_dtype kd = dt == 2 ? KRN_Q8_0 : dt ? KRN_F16 : KRN_F32;
            if (kd == KRN_Q8_0 && shapes[i].hd % KRN_QK8_0 != 0)
                continue; /* no q8_0 form */
            int32_t bt = shapes[i].bt;
            /* Prefill chunks, then decode with and without splits. */
            PC_TEST_CALL(attn_case(&r, shapes[i].nh, shapes[i].nkv, shapes[i].hd, bt, kd, 3,
                                   1 + 200 / bt, 0, false));
            PC_TEST_CALL(attn_case(&r, shapes[i].nh, shapes[i].nkv, shapes[i].hd, bt, kd, 5,
                                   1 + 600 / bt, 0, true));
            PC_TEST_CALL(attn_case(&r, shapes[i].nh, shapes[i].nkv, shapes[i].hd, bt, kd, 5,
                                   1 + 600 / bt, 4 * bt, true));
        }
    }
}

/* One prefill scenario on an F16 pool (every K/V already written, unwritten slots NaN):
 * krn_attention against krn_ref_attention with KVGW_CUDA_ATTN set to `mode` (NULL: unset).
 * Under "simt" the SIMT kernel runs every task (held to 1e-5); else the multi-token tasks run
 * on tensor cores ("tc64": 4-warp CTAs of one task; default: 8-warp CTAs), held to 2e-3 relative
 * L2 error: Q and P are rounded to F16 (11 significant bits, ~5e-4 relative each; the CPU
 * emulation of the kernel in test_krn_tc measures about 4e-4). Also runs krn_attention_tc
 * alone and checks that it writes exactly the multi-token rows. Returns the error through
 * *err_out. */
static void tc_gpu_case(kt_rng_t *r, int32_t nh, int32_t nkv, int32_t hd, int32_t bt,
                        int32_t n_seqs, const int32_t *ctx, const int32_t *nt, int32_t max_blocks,
                        const char *mode, double *err_out)
{
    kt_attn_t t;
    ASSERT_EQ(kt_attn_make(&t, r, nh, nkv, hd, bt, KRN_F16, n_seqs, ctx, nt, max_blocks), 0);
    ASSERT_EQ(krn_attn_tc_check(&t.kv, nh), 0);
    krn_attn_args_t a;
    ASSERT_EQ(kt_attn_plan(&t, 4 * bt, &a), 0);
    ASSERT_EQ(krn_ref_attention(&a), 0);
    int64_t n_out = (int64_t)t.n_rows * nh * hd;
    size_t pool_bytes = krn_kv_block_bytes(&t.kv) * (size_t)t.kv.n_blocks;
    krn_attn_args_t da = a;
    da.kv.base = up(t.kv.base, pool_bytes);
    da.q = up(t.q, sizeof(float) * (size_t)n_out);
    da.out = dev_filled(sizeof(float) * (size_t)n_out, 0xff);
    da.row_pos = up(t.row_pos, sizeof(int32_t) * (size_t)t.n_rows);
    da.block_tables = up(t.tables, sizeof(int32_t) * (size_t)n_seqs * max_blocks);
    da.tasks = up(a.tasks, sizeof(krn_attn_task_t) * (size_t)a.n_tasks);
    da.merges = up(a.merges, sizeof(krn_attn_merge_t) * (size_t)a.n_merges);
    int32_t n_parts = 0;
    for (int32_t i = 0; i < a.n_merges; i++)
        n_parts += a.merges[i].n_splits * a.merges[i].n_rows * (nh / nkv);
    da.part_o = dev_filled(sizeof(float) * ((size_t)n_parts * hd + 1), 0xff);
    da.part_ml = dev_filled(sizeof(float) * ((size_t)n_parts * 2 + 1), 0xff);
    const char *old = getenv("KVGW_CUDA_ATTN");
    char saved[32] = "";
    if (old != NULL)
        snprintf(saved, sizeof saved, "%s", old);
    bool simt = mode != NULL && strcmp(mode, "simt") == 0;
    if (mode != NULL)
        setenv("KVGW_CUDA_ATTN", mode, 1);
    else
        unsetenv("KVGW_CUDA_ATTN");
    int rc = krn_attention(g_ctx, &da);
    float *got = malloc(sizeof(float) * (size_t)n_out);
    down(got, da.out, sizeof(float) * (size_t)n_out);
    double err = kt_rel_err_f(got, t.out, n_out);
    /* krn_attention_tc alone: the rows of multi-token tasks written, the others left NaN. */
    bool tc_only_ok = true;
    if (!simt) {
        ASSERT_EQ(krn_memset(g_ctx, da.out, 0xff, sizeof(float) * (size_t)n_out), 0);
        if (rc == 0)
            rc = krn_attention_tc(g_ctx, &da);
        down(got, da.out, sizeof(float) * (size_t)n_out);
        int32_t group = nh / nkv;
        for (int32_t i = 0; i < a.n_tasks && tc_only_ok; i++) {
            const krn_attn_task_t *tk = &a.tasks[i];
            for (int32_t tr = 0; tr < tk->n_rows; tr++)
                for (int32_t g = 0; g < group; g++)
                    for (int32_t d = 0; d < hd; d++) {
                        float v = got[(int64_t)(tk->row0 + tr) * nh * hd +
                                      ((int64_t)tk->kv_head * group + g) * hd + d];
                        if ((tk->n_rows > 1) == isnan(v))
                            tc_only_ok = false;
                    }
        }
    }
    krn_dev_free(g_ctx, da.kv.base);
    krn_dev_free(g_ctx, (void *)da.q);
    krn_dev_free(g_ctx, da.out);
    krn_dev_free(g_ctx, (void *)da.row_pos);
    krn_dev_free(g_ctx, (void *)da.block_tables);
    krn_dev_free(g_ctx, (void *)da.tasks);
    krn_dev_free(g_ctx, (void *)da.merges);
    krn_dev_free(g_ctx, da.part_o);
    krn_dev_free(g_ctx, da.part_ml);
    free(got);
    kt_attn_plan_free(&a);
    kt_attn_free(&t);
    if (old != NULL)
        setenv("KVGW_CUDA_ATTN", saved, 1);
    else
        unsetenv("KVGW_CUDA_ATTN");
    *err_out = err;
    ASSERT_EQ(rc, 0);
    ASSERT_TRUE(tc_only_ok);
}

/* The tensor-core prefill kernel (krn_attn_tc.cu) through krn_attention: cached prefix 0 and
 * > 0, GQA 8:1 and 1:1, head_dim 64 and 128 (and 80, 256), several sequences in one batch
 * (with decode rows beside them: those stay on the SIMT kernel), lengths that are no multiple
 * of the 64-position tile or of the 8-token task, block sizes 8 to 128; 8-warp CTAs (the
 * default) and 4-warp ones (KVGW_CUDA_ATTN=tc64). The same scenarios under
 * KVGW_CUDA_ATTN=simt hold the SIMT kernel to 1e-5. */
PC_TEST(prefill_attention_on_tensor_cores)
{
    NEED_GPU();
    kt_rng_t r = {27};
    const struct {
        int32_t nh, nkv, hd, bt;
    } shapes[] = {{32, 4, 128, 16}, {8, 8, 128, 16}, {32, 4, 64, 32},  {8, 8, 64, 16},
                  {16, 2, 80, 8},   {8, 2, 256, 64}, {28, 4, 128, 128}};
    for (size_t i = 0; i < PC_ARRAY_LEN(shapes); i++) {
        int32_t bt = shapes[i].bt, mb = 1 + 500 / bt;
        /* Prompts from position 0 (one ragged, one single token = decode), then after cached
         * prefixes (one ending at the table's last position). */
        const int32_t ctx0[3] = {0, 0, 0}, nt0[3] = {200, 77, 1};
        const int32_t ctx1[4] = {mb * bt - 130, 64, 333, 5}, nt1[4] = {130, 91, 1, 9};
        /* The default (8-warp CTAs), then on some shapes 4-warp CTAs and the SIMT fallback. */
        const char *modes[3] = {NULL, "tc64", "simt"};
        for (int k = 0; k < (i < 3 ? 3 : 1); k++) {
            double e0, e1;
            PC_TEST_CALL(tc_gpu_case(&r, shapes[i].nh, shapes[i].nkv, shapes[i].hd, bt, 3, ctx0,
                                     nt0, mb, modes[k], &e0));
            PC_TEST_CALL(tc_gpu_case(&r, shapes[i].nh, shapes[i].nkv, shapes[i].hd, bt, 4, ctx1,
                                     nt1, mb, modes[k], &e1));
            double tol = k == 2 ? 1e-5 : 2e-3;
            const char *name = modes[k] != NULL ? modes[k] : "tc";
            printf("  %-4s %d/%d heads, head_dim %d, block %d: rel err %.2e (no prefix), %.2e "
                   "(cached prefix)\n",
                   name, shapes[i].nh, shapes[i].nkv, shapes[i].hd, bt, e0, e1);
            if (!(e0 <= tol && e1 <= tol))
                PC_TEST__FAIL("shape %zu (%s): relative error %g / %g (> %g)", i, name, e0, e1,
                              tol);
        }
    }
}

/* The split-KV decode kernel (krn_decode.cu) against its reference: decode rows over
 * NaN-poisoned pools, one split, splits of one block, the plan's splits for this GPU, the cuda
 * backend's launch (krn_decode_step_plan: the grid rounded up to the planned split count, so
 * CTAs past a row's last split exit, and the partials' stride is that count) and its one-split
 * launch (KRN_DECODE_ONE_SPLIT). */
PC_TEST(decode_attention_matches_reference)
{
    NEED_GPU();
    krn_device_info_t info;
    ASSERT_EQ(krn_device_info(0, &info), 0);
    kt_rng_t r = {26};
    const struct {
        int32_t nh, nkv, hd, bt;
        enum krn_dtype dt;
        int32_t n_seqs, max_blocks;
    } cases[] = {{64, 8, 128, 16, KRN_F16, 1, 130},
                 {64, 8, 128, 16, KRN_F16, 9, 40},
                 {32, 8, 128, 16, KRN_F32, 4, 30},
                 {8, 1, 32, 16, KRN_F16, 3, 20},
                 {16, 16, 64, 8, KRN_F32, 5, 25},
                 {32, 2, 256, 16, KRN_F16, 2, 20},
                 {4, 4, 32, 5, KRN_F32, 3, 11},
                 {8, 2, 256, 32, KRN_F32, 2, 6},
                 /* q8_0 pools (the engine's blocks, read in place) */
                 {64, 8, 128, 16, KRN_Q8_0, 1, 130},
                 {64, 8, 128, 16, KRN_Q8_0, 9, 40},
                 {8, 1, 32, 16, KRN_Q8_0, 3, 20},
                 {32, 2, 256, 16, KRN_Q8_0, 2, 20},
                 {16, 16, 64, 8, KRN_Q8_0, 5, 25}};
    for (size_t ci = 0; ci < PC_ARRAY_LEN(cases); ci++) {
        int32_t ctx[16], nt[16], bt = cases[ci].bt, mb = cases[ci].max_blocks;
        for (int32_t s = 0; s < cases[ci].n_seqs; s++) {
            nt[s] = 1;
            ctx[s] = s == 0 ? mb * bt - 1 : (int32_t)kt_below(&r, (uint32_t)(mb * bt));
        }
        kt_attn_t t;
        ASSERT_EQ(kt_attn_make(&t, &r, cases[ci].nh, cases[ci].nkv, cases[ci].hd, bt, cases[ci].dt,
                               cases[ci].n_seqs, ctx, nt, mb),
                  0);
        ASSERT_EQ(krn_decode_check(&t.kv, t.n_head), 0);
        int64_t n_out = (int64_t)t.n_rows * t.n_head * cases[ci].hd;
        size_t pool_bytes = krn_kv_block_bytes(&t.kv) * (size_t)t.kv.n_blocks;
        krn_kv_t dkv = t.kv;
        dkv.base = up(t.kv.base, pool_bytes);
        float *dq = up(t.q, sizeof(float) * (size_t)n_out);
        int32_t *dseq = up(t.row_seq, sizeof(int32_t) * (size_t)t.n_rows);
        int32_t *dpos = up(t.row_pos, sizeof(int32_t) * (size_t)t.n_rows);
        int32_t *dtab = up(t.tables, sizeof(int32_t) * (size_t)t.n_seqs * mb);
        float *got = malloc(sizeof(float) * (size_t)n_out);
        int32_t plan = krn_decode_split_tokens(info.n_sm, t.n_rows, t.kv.n_head_kv, bt, mb * bt, 0);
        int32_t step_split, step_splits, max_len = 0;
        for (int32_t i = 0; i < t.n_rows; i++)
            max_len = t.row_pos[i] + 1 > max_len ? t.row_pos[i] + 1 : max_len;
        ASSERT_EQ(krn_decode_step_plan(info.n_sm, t.n_rows, t.kv.n_head_kv, bt, max_len,
                                       &step_split, &step_splits),
                  0);
        const int32_t splits[5] = {mb * bt, bt, plan, step_split, KRN_DECODE_ONE_SPLIT / bt * bt};
        for (int k = 0; k < 5; k++) {
            krn_decode_args_t a;
            kt_decode_args(&t, splits[k], &a);
            if (k == 3)
                a.max_splits = step_splits; /* >= the splits the rows need (the reference
                                               does not read the partials) */
            ASSERT_EQ(krn_ref_decode_attention(&a), 0);
            size_t slots = (size_t)t.n_rows * t.n_head * a.max_splits;
            krn_decode_args_t da = a;
            da.kv = dkv;
            da.q = dq;
            da.out = dev_filled(sizeof(float) * (size_t)n_out, 0xff);
            da.row_seq = dseq;
            da.row_pos = dpos;
            da.block_tables = dtab;
            da.part_o = dev_filled(sizeof(float) * (slots * cases[ci].hd + 1), 0xff);
            da.part_ml = dev_filled(sizeof(float) * (slots * 2 + 1), 0xff);
            ASSERT_EQ(krn_decode_attention(g_ctx, &da), 0);
            down(got, da.out, sizeof(float) * (size_t)n_out);
            double err = kt_rel_err_f(got, t.out, n_out);
            krn_dev_free(g_ctx, da.out);
            krn_dev_free(g_ctx, da.part_o);
            krn_dev_free(g_ctx, da.part_ml);
            kt_decode_free(&a);
            if (!(err <= 1e-5))
                PC_TEST__FAIL("case %zu, split %d: relative error %g (> 1e-5)", ci, splits[k], err);
        }
        krn_dev_free(g_ctx, dkv.base);
        krn_dev_free(g_ctx, dq);
        krn_dev_free(g_ctx, dseq);
        krn_dev_free(g_ctx, dpos);
        krn_dev_free(g_ctx, dtab);
        free(got);
        kt_attn_free(&t);
    }
}

PC_TEST(block_copies_match_reference)
{
    NEED_GPU();
    kt_rng_t r = {24};
    /* The second shape has more (layer, head) slices than gridDim.y takes (65535). */
    const int32_t shapes[][4] = {{3, 2, 24, 16}, {300, 256, 2, 2}};
    /* q8_0 pools (head_dim a multiple of 32): rows of 34-byte blocks. */
    const int32_t q8_shapes[][4] = {{3, 2, 64, 16}, {300, 256, 32, 1}};
    for (int si = 0; si < 6; si++) {
        int dt = si % 3;
        const int32_t *sh = dt == 2 ? q8_shapes[si / 3] : shapes[si / 3];
        krn_kv_t kv = {.n_blocks = 20,
                       .n_layer = sh[0],
                       .n_head_kv = sh[1],
                       .head_dim = sh[2],
                       .block_tokens = sh[3],
                       .dtype = dt == 2 ? KRN_Q8_0
                                : dt    ? KRN_F16
                                        : KRN_F32};
        size_t bb = krn_kv_block_bytes(&kv), bytes = bb * 20;
        uint8_t *h = malloc(bytes), *back = malloc(bytes);
        for (size_t i = 0; i < bytes; i++)
            h[i] = (uint8_t)kt_next(&r);
        krn_kv_t dkv = kv;
        dkv.base = up(h, bytes);
        kv.base = h;
        int32_t src[6], dst[6], nt[6];
        for (int i = 0; i < 6; i++) {
            src[i] = i;
            dst[i] = 10 + i;
            nt[i] = (int32_t)kt_below(&r, (uint32_t)kv.block_tokens + 1);
        }
        krn_block_copy_args_t c = {.kv = kv, .src = src, .dst = dst, .n_tokens = nt, .n = 6};
        ASSERT_EQ(krn_ref_block_copy(&c), 0);
        c.kv = dkv;
        c.src = up(src, sizeof src);
        c.dst = up(dst, sizeof dst);
        c.n_tokens = up(nt, sizeof nt);
        ASSERT_EQ(krn_block_copy(g_ctx, &c), 0);
        down(back, dkv.base, bytes);
        ASSERT_MEM_EQ(back, h, bytes);
        /* Tiering round trip: blocks out to the host and back into other blocks. */
        int32_t ids[3] = {3, 17, 9}, ids2[3] = {4, 5, 6};
        uint8_t *stage = malloc(3 * bb);
        ASSERT_EQ(krn_blocks_to_host(g_ctx, &dkv, ids, 3, stage), 0);
        ASSERT_EQ(krn_ctx_sync(g_ctx), 0);
        ASSERT_EQ(krn_blocks_from_host(g_ctx, &dkv, ids2, 3, stage), 0);
        down(back, dkv.base, bytes);
        for (int i = 0; i < 3; i++)
            ASSERT_MEM_EQ(back + (size_t)ids2[i] * bb, h + (size_t)ids[i] * bb, bb);
        int32_t badid[1] = {20};
        ASSERT_EQ(krn_blocks_to_host(g_ctx, &dkv, badid, 1, stage), PC_ERR_INVAL);
        krn_dev_free(g_ctx, dkv.base);
        krn_dev_free(g_ctx, (void *)c.src);
        krn_dev_free(g_ctx, (void *)c.dst);
        krn_dev_free(g_ctx, (void *)c.n_tokens);
        free(h);
        free(back);
        free(stage);
    }
}

PC_TEST(sampler_matches_reference)
{
    NEED_GPU();
    kt_rng_t r = {25};
    enum { ROWS = 24, V = 5000 };
    float *logits = malloc(sizeof(float) * ROWS * V);
    double *work = malloc(sizeof(double) * ROWS * V);
    krn_sample_row_t rows[ROWS];
    int32_t want[ROWS], got[ROWS];
    for (int iter = 0; iter < 20; iter++) {
        for (int i = 0; i < ROWS * V; i++) {
            logits[i] = kt_unif(&r) * (iter % 2 ? 10.0f : 3.0f);
            if (iter % 3 == 0)
                logits[i] = (float)(int)(logits[i] * 4);
        }
        for (int i = 0; i < ROWS; i++) {
            if (i % 5 == 1)
                logits[i * V + kt_below(&r, V)] = NAN;
            if (i % 5 == 2)
                logits[i * V + kt_below(&r, V)] = INFINITY;
            if (i % 7 == 3)
                logits[i * V + kt_below(&r, V)] = -INFINITY;
            rows[i] = (krn_sample_row_t){
                .temperature = i % 6 == 0 ? 0.0f : 0.2f + (float)kt_below(&r, 20) / 10,
                .top_k = i % 3 == 0 ? 0 : (int32_t)kt_below(&r, 300),
                .top_p = i % 4 == 0 ? 1.0f : 0.1f + 0.85f * (float)kt_below(&r, 100) / 100,
                .min_p = i % 5 == 4 ? 0.02f * (float)kt_below(&r, 10) : 0.0f,
                .u = (double)(kt_next(&r) >> 11) * 0x1.0p-53};
        }
        krn_sample_args_t a = {.logits = logits,
                               .row = rows,
                               .token = want,
                               .work = work,
                               .n_rows = ROWS,
                               .n_vocab = V};
        ASSERT_EQ(krn_ref_sample(&a), 0);
        a.logits = up(logits, sizeof(float) * ROWS * V);
        a.row = up(rows, sizeof rows);
        a.token = dev_filled(sizeof got, 0x7f);
        a.work = dev_filled(sizeof(double) * ROWS * V, 0xff);
        ASSERT_EQ(krn_sample(g_ctx, &a), 0);
        down(got, a.token, sizeof got);
        krn_dev_free(g_ctx, (void *)a.logits);
        krn_dev_free(g_ctx, (void *)a.row);
        krn_dev_free(g_ctx, a.token);
        krn_dev_free(g_ctx, a.work);
        for (int i = 0; i < ROWS; i++)
            ASSERT_EQ(got[i], want[i]);
    }
    free(logits);
    free(work);
}

#include "test_krn_gpu_fused.h"
/* The multi-pass sampler (krn_sample_radix) and the bitwise one (krn_sample_bitwise) against
 * the reference on edge rows (krn_sample_testrows.h: ties, all-equal rows, NaN / +-inf,
 * top_k 1..V and beyond, top_p near 0 and 1, min_p, temperature extremes, u 0 and near 1) at
 * vocab sizes from 1 to Qwen's 152064, batches of 1 to 70 rows (past the scratch of a first,
 * smaller call). A mismatch prints the row's rules and both kernels' picks. */
static void sampler_case(int32_t V, int32_t rows_n, kt_rng_t *r, bool bitwise_too)
{
    size_t n = (size_t)rows_n * V;
    float *logits = malloc(sizeof(float) * n);
    double *work = malloc(sizeof(double) * n);
    krn_sample_row_t *rows = malloc(sizeof *rows * (size_t)rows_n);
    int32_t *want = malloc(sizeof(int32_t) * (size_t)rows_n);
    int32_t *got = malloc(sizeof(int32_t) * (size_t)rows_n);
    int32_t *got_bw = malloc(sizeof(int32_t) * (size_t)rows_n);
    PC_ASSERT(logits && work && rows && want && got && got_bw);
    for (int32_t i = 0; i < rows_n; i++) {
        int k = (int)kt_below(r, 1000);
        ks_fill_row(logits + (size_t)i * V, V, k, r);
        ks_rand_params(&rows[i], V, k, r);
    }
    krn_sample_args_t a = {
        .logits = logits, .row = rows, .token = want, .work = work, .n_rows = rows_n, .n_vocab = V};
    ASSERT_EQ(krn_ref_sample(&a), 0);
    a.logits = up(logits, sizeof(float) * n);
    a.row = up(rows, sizeof *rows * (size_t)rows_n);
    a.token = dev_filled(sizeof(int32_t) * (size_t)rows_n, 0x7f);
    a.work = dev_filled(sizeof(double) * n, 0xff);
    ASSERT_EQ(krn_sample_radix(g_ctx, &a), 0);
    down(got, a.token, sizeof(int32_t) * (size_t)rows_n);
    /* Again with the batch's plan (fewer launches): the same picks. */
    int32_t *got_plan = malloc(sizeof(int32_t) * (size_t)rows_n);
    PC_ASSERT(got_plan != NULL);
    a.plan = krn_sample_plan_of(rows, rows_n);
    ASSERT_EQ(krn_memset(g_ctx, a.token, 0x7f, sizeof(int32_t) * (size_t)rows_n), 0);
    ASSERT_EQ(krn_sample_radix(g_ctx, &a), 0);
    down(got_plan, a.token, sizeof(int32_t) * (size_t)rows_n);
    a.plan = 0;
    for (int32_t i = 0; i < rows_n; i++)
        got_bw[i] = -3;
    if (bitwise_too) {
        ASSERT_EQ(krn_memset(g_ctx, a.token, 0x7f, sizeof(int32_t) * (size_t)rows_n), 0);
        ASSERT_EQ(krn_sample_bitwise(g_ctx, &a), 0);
        down(got_bw, a.token, sizeof(int32_t) * (size_t)rows_n);
    }
    int bad = 0;
    for (int32_t i = 0; i < rows_n; i++) {
        bool ok =
            got[i] == want[i] && got_plan[i] == want[i] && (!bitwise_too || got_bw[i] == want[i]);
        if (!ok && bad++ < 10)
            fprintf(stderr,
                    "sampler V %d row %d/%d: T %g top_k %d top_p %.9g min_p %g u %.17g: "
                    "radix %d radix with plan 0x%x %d bitwise %d reference %d\n",
                    V, i, rows_n, rows[i].temperature, rows[i].top_k, rows[i].top_p, rows[i].min_p,
                    rows[i].u, got[i], krn_sample_plan_of(rows, rows_n), got_plan[i], got_bw[i],
                    want[i]);
    }
    krn_dev_free(g_ctx, (void *)a.logits);
    krn_dev_free(g_ctx, (void *)a.row);
    krn_dev_free(g_ctx, a.token);
    krn_dev_free(g_ctx, a.work);
    free(logits);
    free(work);
    free(rows);
    free(want);
    free(got);
    free(got_plan);
    free(got_bw);
    ASSERT_EQ(bad, 0);
}

PC_TEST(sampler_radix_matches_reference_on_edge_rows)
{
    NEED_GPU();
    kt_rng_t r = {26};
    const int32_t vs[] = {1, 2, 3, 100, 2047, 2049, 5000, 32773};
    for (size_t k = 0; k < sizeof vs / sizeof vs[0]; k++)
        for (int rep = 0; rep < 3; rep++)
            sampler_case(vs[k], rep == 0 ? 1 : rep == 1 ? 7 : 70, &r, vs[k] <= 5000);
    /* Single rows of every kind, so that plans with flags set are exercised. */
    for (int k = 0; k < 24; k++)
        sampler_case(k % 2 ? 2049 : 152064, 1, &r, k < 4);
    /* Qwen's vocab: batch 1 and a chunk of 64 rows (the bitwise kernel only on the small one:
     * it takes ~1 ms per row). */
    sampler_case(152064, 1, &r, true);
    sampler_case(152064, 64, &r, false);
}

/* Greedy and sampled rows in one batch, twice in a row on the same scratch (the first call must
 * leave nothing behind that the second reads), and through krn_sample (the default). */
PC_TEST(sampler_radix_repeats_and_mixes_rows)
{
    NEED_GPU();
    enum { ROWS = 9, V = 152064 };
    kt_rng_t r = {27};
    size_t n = (size_t)ROWS * V;
    float *logits = malloc(sizeof(float) * n);
    double *work = malloc(sizeof(double) * n);
    krn_sample_row_t rows[ROWS];
    int32_t want[ROWS], got[ROWS];
    for (size_t i = 0; i < n; i++)
        logits[i] = kt_unif(&r) * 6;
    for (int i = 0; i < ROWS; i++)
        rows[i] = (krn_sample_row_t){.temperature = i % 3 == 0 ? 0.0f : 0.9f,
                                     .top_k = i % 2 ? 40 : 0,
                                     .top_p = i % 4 == 1 ? 0.8f : 1.0f,
                                     .min_p = i == 5 ? 0.1f : 0.0f,
                                     .u = (double)(kt_next(&r) >> 11) * 0x1.0p-53};
    krn_sample_args_t a = {
        .logits = logits, .row = rows, .token = want, .work = work, .n_rows = ROWS, .n_vocab = V};
    ASSERT_EQ(krn_ref_sample(&a), 0);
    a.logits = up(logits, sizeof(float) * n);
    a.row = up(rows, sizeof rows);
    a.token = dev_filled(sizeof got, 0x7f);
    a.work = dev_filled(sizeof(double) * n, 0xff);
    ASSERT_EQ(krn_sample_reserve(g_ctx, ROWS), 0);
    for (int rep = 0; rep < 4; rep++) {
        ASSERT_EQ(krn_memset(g_ctx, a.token, 0x7f, sizeof got), 0);
        a.plan = rep == 3 ? krn_sample_plan_of(rows, ROWS) : 0;
        ASSERT_EQ(rep == 2 ? krn_sample(g_ctx, &a) : krn_sample_radix(g_ctx, &a), 0);
        down(got, a.token, sizeof got);
        for (int i = 0; i < ROWS; i++)
            ASSERT_EQ(got[i], want[i]);
    }
    /* A plan that is wrong for the sampled rows (greedy only: one launch) leaves them at -1,
     * never at the previous call's token; the greedy rows are still picked. */
    a.plan = KRN_SAMPLE_GREEDY;
    ASSERT_EQ(krn_sample_radix(g_ctx, &a), 0);
    down(got, a.token, sizeof got);
    for (int i = 0; i < ROWS; i++)
        ASSERT_EQ(got[i], rows[i].temperature == 0.0f ? want[i] : -1);
    krn_dev_free(g_ctx, (void *)a.logits);
    krn_dev_free(g_ctx, (void *)a.row);
    krn_dev_free(g_ctx, a.token);
    krn_dev_free(g_ctx, a.work);
    free(logits);
    free(work);
    ASSERT_EQ(krn_sample_reserve(g_ctx, -1), PC_ERR_INVAL);
}

#include "test_krn_gpu_e2e.h"
#include "test_krn_gpu_quant.h" /* after e2e: it uses eng_testmodel.h */
#include "test_krn_gpu_xfer.h"

PC_TEST_MAIN()
