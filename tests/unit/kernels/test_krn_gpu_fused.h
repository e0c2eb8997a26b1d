/*
 * test_krn_gpu_fused.h — the part of test_krn_gpu.c for the cuda backend's host-overhead work:
 * the fused kernels against their CPU references (krn_fused_case.h: random QKV GEMM outputs,
 * biases, head norms, scattered blocks of a NaN-poisoned pool), pinned staging memory and CUDA
 * graphs (capture, replay reading pinned memory anew, update in place, rebuild, a failed
 * capture leaving the stream usable).
 */
#include "krn_fused_case.h"

/* Compares two host copies of a pool: the same slots NaN (unwritten) in both, the written
 * ones within a relative norm error returned (INFINITY when the NaN masks differ). */
static double pool_rel_err(const krn_kv_t *kv, const void *got, const void *want)
{
    if (kv->dtype == KRN_Q8_0) {
        /* Dequantized, every value of every row: the device quantizes with the host's steps,
         * but its K comes through rsqrtf and sincos, a few ulps off, which may move a quant
         * that sits on a rounding edge by one. */
        double num = 0, den = 0;
        krn_kv_t g = *kv, w = *kv;
        g.base = (void *)got;
        w.base = (void *)want;
        for (int32_t b = 0; b < kv->n_blocks; b++)
            for (int32_t l = 0; l < kv->n_layer; l++)
                for (int32_t h = 0; h < kv->n_head_kv; h++)
                    for (int32_t i = 0; i < 2 * kv->block_tokens * kv->head_dim; i++) {
                        bool is_v = i >= kv->block_tokens * kv->head_dim;
                        int32_t e = i % (kv->block_tokens * kv->head_dim);
                        int32_t slot = e / kv->head_dim, d = e % kv->head_dim;
                        float a = kt_kv_get(&g, b, l, h, is_v, slot, d);
                        float c = kt_kv_get(&w, b, l, h, is_v, slot, d);
                        if (isnan(a) != isnan(c))
                            return INFINITY;
                        if (!isnan(a)) {
                            num += ((double)a - c) * ((double)a - c);
                            den += (double)c * c;
                        }
                    }
        return sqrt(num / (den > 0 ? den : 1));
    }
    int64_t n = (int64_t)(krn_kv_block_bytes(kv) / krn_dtype_size(kv->dtype)) * kv->n_blocks;
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        float a = kv->dtype == KRN_F16 ? krn_f16_to_f32(((const uint16_t *)got)[i])
                                       : ((const float *)got)[i];
        float b = kv->dtype == KRN_F16 ? krn_f16_to_f32(((const uint16_t *)want)[i])
                                       : ((const float *)want)[i];
        if (isnan(a) != isnan(b))
            return INFINITY;
        if (isnan(a))
            continue;
        num += ((double)a - b) * ((double)a - b);
        den += (double)b * b;
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* Decodes n elements of dtype into floats. */
static void to_floats(const void *src, enum krn_dtype t, int64_t n, float *out)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = t == KRN_F32   ? ((const float *)src)[i]
                 : t == KRN_F16 ? krn_f16_to_f32(((const uint16_t *)src)[i])
                                : krn_bf16_to_f32(((const uint16_t *)src)[i]);
}

PC_TEST(fused_kernels_match_references)
{
    NEED_GPU();
    kt_rng_t r = {51};
    const struct {
        int32_t rows, nh, nkv, hd, bt, rope_dim;
        enum krn_dtype kv;
        bool bias, norm;
        enum krn_rope_style style;
    } cases[] = {{37, 8, 2, 64, 16, 64, KRN_F16, false, false, KRN_ROPE_NORM},
                 {5, 8, 2, 64, 16, 64, KRN_F32, true, false, KRN_ROPE_NEOX},
                 {64, 16, 4, 128, 16, 128, KRN_F16, false, true, KRN_ROPE_NEOX},
                 {300, 32, 8, 128, 16, 128, KRN_F16, true, true, KRN_ROPE_NORM},
                 {9, 6, 6, 32, 5, 24, KRN_F32, true, true, KRN_ROPE_NORM},
                 {3, 4, 1, 256, 32, 256, KRN_F16, true, true, KRN_ROPE_NEOX},
                 {1, 64, 8, 128, 16, 128, KRN_F16, false, false, KRN_ROPE_NEOX},
                 {37, 8, 2, 64, 16, 64, KRN_Q8_0, true, false, KRN_ROPE_NORM},
                 {64, 16, 4, 128, 16, 128, KRN_Q8_0, false, true, KRN_ROPE_NEOX},
                 {3, 4, 1, 256, 32, 256, KRN_Q8_0, true, true, KRN_ROPE_NEOX}};
    for (size_t ci = 0; ci < PC_ARRAY_LEN(cases); ci++) {
        kf_case_t c;
        int32_t R = cases[ci].rows, hd = cases[ci].hd, nh = cases[ci].nh, nkv = cases[ci].nkv;
        kf_make(&c, &r, R, nh, nkv, hd, cases[ci].bt, cases[ci].kv, cases[ci].bias, cases[ci].norm,
                cases[ci].style, cases[ci].rope_dim);
        int32_t nq = nh * hd, nk = nkv * hd;
        size_t pool_bytes = kf_pool_bytes(&c), q_bytes = sizeof(float) * (size_t)R * nq;
        uint8_t *pool0 = malloc(pool_bytes), *pool_got = malloc(pool_bytes);
        memcpy(pool0, c.kv.base, pool_bytes); /* all NaN */
        float *q_want = malloc(q_bytes), *q_got = malloc(q_bytes);
        krn_qkv_rope_kv_args_t a = kf_args(&c, q_want);
        ASSERT_EQ(krn_ref_qkv_rope_kv(&a), 0);
        krn_qkv_rope_kv_args_t d = a;
        d.kv.base = up(pool0, pool_bytes);
        d.q_in = up(c.qkv, sizeof(float) * (size_t)R * c.ld);
        d.k_in = d.q_in + nq;
        d.v_in = d.q_in + nq + nk;
        d.q_out = dev_filled(q_bytes, 0xff);
        d.bq = c.bq ? up(c.bq, sizeof(float) * (size_t)nq) : NULL;
        d.bk = c.bk ? up(c.bk, sizeof(float) * (size_t)nk) : NULL;
        d.bv = c.bv ? up(c.bv, sizeof(float) * (size_t)nk) : NULL;
        d.q_norm = c.q_norm ? up(c.q_norm, sizeof(float) * (size_t)hd) : NULL;
        d.k_norm = c.k_norm ? up(c.k_norm, sizeof(float) * (size_t)hd) : NULL;
        d.inv_freq = up(c.inv_freq, sizeof(float) * (size_t)(c.rope_dim / 2));
        d.row_pos = up(c.pos, sizeof(int32_t) * (size_t)R);
        d.row_seq = up(c.seq, sizeof(int32_t) * (size_t)R);
        d.block_tables = up(c.tables, sizeof(int32_t) * (size_t)c.kv.n_blocks);
        ASSERT_EQ(krn_qkv_rope_kv(g_ctx, &d), 0);
        down(q_got, d.q_out, q_bytes);
        down(pool_got, d.kv.base, pool_bytes);
        double q_err = kt_rel_err_f(q_got, q_want, (int64_t)R * nq);
        double p_err = pool_rel_err(&c.kv, pool_got, c.kv.base);
        /* In place over a q array of its own (the unfused GEMMs' layout): the same q. */
        float *q_sep = malloc(q_bytes);
        for (int32_t i = 0; i < R; i++)
            memcpy(q_sep + (size_t)i * nq, c.qkv + i * c.ld, sizeof(float) * (size_t)nq);
        float *dq = up(q_sep, q_bytes);
        krn_qkv_rope_kv_args_t d2 = d;
        d2.q_in = d2.q_out = dq;
        d2.ld_q = nq;
        ASSERT_EQ(krn_qkv_rope_kv(g_ctx, &d2), 0);
        down(q_sep, dq, q_bytes);
        double q2_err = kt_rel_err_f(q_sep, q_want, (int64_t)R * nq);
        void *ds[] = {d.kv.base,
                      (void *)d.q_in,
                      d.q_out,
                      (void *)d.bq,
                      (void *)d.bk,
                      (void *)d.bv,
                      (void *)d.q_norm,
                      (void *)d.k_norm,
                      (void *)d.inv_freq,
                      (void *)d.row_pos,
                      (void *)d.row_seq,
                      (void *)d.block_tables,
                      dq};
        for (size_t i = 0; i < PC_ARRAY_LEN(ds); i++)
            krn_dev_free(g_ctx, ds[i]);
        free(pool0);
        free(pool_got);
        free(q_want);
        free(q_got);
        free(q_sep);
        kf_free(&c);
        /* q in F32: rsqrtf and the device's sincos against the host's, a few ulps; the pool
         * rounds to F16 on top of that. */
        double p_tol = cases[ci].kv == KRN_F32 ? 1e-5 : 1e-3;
        if (!(q_err <= 1e-5 && q2_err <= 1e-5 && p_err <= p_tol))
            PC_TEST__FAIL("qkv case %zu: q error %g, in-place q error %g (> 1e-5), pool error %g "
                          "(> %g; inf: NaN slots differ, a stray or missing store)",
                          ci, q_err, q2_err, p_err, p_tol);
    }

    /* rmsnorm_convert (row gather or not) and swiglu_convert in each output type. */
    enum { R = 45, W = 1000, N_SRC = 70 };
    float *x = kf_rand(&r, (size_t)N_SRC * W, 4.0f), *w = kf_rand(&r, W, 1.0f);
    float *gu = kf_rand(&r, (size_t)R * 2 * W, 6.0f);
    void *want = malloc(sizeof(float) * R * W), *got = malloc(sizeof(float) * R * W);
    float *fw = malloc(sizeof(float) * R * W), *fg = malloc(sizeof(float) * R * W);
    int32_t rows[R];
    for (int i = 0; i < R; i++)
        rows[i] = (int32_t)kt_below(&r, N_SRC);
    float *dx = up(x, sizeof(float) * N_SRC * W), *dw = up(w, sizeof(float) * W);
    float *dgu = up(gu, sizeof(float) * R * 2 * W);
    int32_t *drows = up(rows, sizeof rows);
    void *dy = dev_filled(sizeof(float) * R * W, 0xff);
    for (int dt = 0; dt < 3; dt++) {
        enum krn_dtype t = (enum krn_dtype)dt;
        size_t out_bytes = krn_dtype_size(t) * R * W;
        double tol = t == KRN_F32 ? 1e-5 : 1e-3;
        for (int gather = 0; gather < 2; gather++) {
            krn_rmsnorm_convert_args_t a = {.x = x,
                                            .rows = gather ? rows : NULL,
                                            .w = w,
                                            .y = want,
                                            .n_rows = R,
                                            .n_src = N_SRC,
                                            .width = W,
                                            .eps = 1e-5f,
                                            .dtype = t};
            ASSERT_EQ(krn_ref_rmsnorm_convert(&a), 0);
            a.x = dx;
            a.rows = gather ? drows : NULL;
            a.w = dw;
            a.y = dy;
            ASSERT_EQ(krn_memset(g_ctx, dy, 0xff, out_bytes), 0);
            ASSERT_EQ(krn_rmsnorm_convert(g_ctx, &a), 0);
            down(got, dy, out_bytes);
            to_floats(want, t, R * W, fw);
            to_floats(got, t, R * W, fg);
            double err = kt_rel_err_f(fg, fw, R * W);
            if (!(err <= tol))
                PC_TEST__FAIL("rmsnorm_convert dtype %d gather %d: error %g (> %g)", dt, gather,
                              err, tol);
        }
        krn_swiglu_convert_args_t s = {
            .g = gu, .u = gu + W, .ld = 2 * W, .y = want, .n_rows = R, .width = W, .dtype = t};
        ASSERT_EQ(krn_ref_swiglu_convert(&s), 0);
        s.g = dgu;
        s.u = dgu + W;
        s.y = dy;
        ASSERT_EQ(krn_memset(g_ctx, dy, 0xff, out_bytes), 0);
        ASSERT_EQ(krn_swiglu_convert(g_ctx, &s), 0);
        down(got, dy, out_bytes);
        to_floats(want, t, R * W, fw);
        to_floats(got, t, R * W, fg);
        double err = kt_rel_err_f(fg, fw, R * W);
        if (!(err <= tol))
            PC_TEST__FAIL("swiglu_convert dtype %d: error %g (> %g)", dt, err, tol);
    }
    /* Bad sizes enqueue nothing. */
    krn_swiglu_convert_args_t bs = {
        .g = dgu, .u = dgu + W, .ld = W - 1, .y = dy, .n_rows = R, .width = W, .dtype = KRN_F16};
    ASSERT_EQ(krn_swiglu_convert(g_ctx, &bs), PC_ERR_INVAL);
    krn_rmsnorm_convert_args_t br = {.x = dx,
                                     .w = dw,
                                     .y = dy,
                                     .n_rows = R,
                                     .n_src = R - 1,
                                     .width = W,
                                     .eps = 1e-5f,
                                     .dtype = KRN_F16};
    ASSERT_EQ(krn_rmsnorm_convert(g_ctx, &br), PC_ERR_INVAL);
    krn_dev_free(g_ctx, dx);
    krn_dev_free(g_ctx, dw);
    krn_dev_free(g_ctx, dgu);
    krn_dev_free(g_ctx, drows);
    krn_dev_free(g_ctx, dy);
    free(x);
    free(w);
    free(gu);
    free(want);
    free(got);
    free(fw);
    free(fg);
}

/* A graph of a pinned upload and two kernels: each replay reads the pinned buffer anew; a
 * capture with other sizes updates the graph in place; one with another topology rebuilds it;
 * a capture that fails (a stream wait inside it) leaves the stream usable and the old graph
 * intact. */
PC_TEST(graphs_replay_update_and_fail_cleanly)
{
    NEED_GPU();
    enum { N = 5000 };
    float *pin = NULL;
    ASSERT_EQ(krn_host_alloc(g_ctx, sizeof(float) * N, (void **)&pin), 0);
    float *x = dev_filled(sizeof(float) * N, 0), *y = dev_filled(sizeof(float) * N, 0);
    float *host = malloc(sizeof(float) * N);
    krn_graph_t *g = NULL;
    int32_t n_nodes = 0;
    bool updated = true;
    /* y = pin; x += y; x += y. */
    krn_add_args_t add = {.x = x, .y = y, .n = N};
    ASSERT_EQ(krn_graph_begin(g_ctx), 0);
    ASSERT_EQ(krn_copy_h2d(g_ctx, y, pin, sizeof(float) * N), 0);
    ASSERT_EQ(krn_add(g_ctx, &add), 0);
    ASSERT_EQ(krn_add(g_ctx, &add), 0);
    ASSERT_EQ(krn_graph_end(g_ctx, &g, &n_nodes, &updated), 0);
    ASSERT_TRUE(g != NULL);
    ASSERT_FALSE(updated);
    ASSERT_EQ(n_nodes, 3);
    /* Nothing ran while capturing: x is still 0. */
    down(host, x, sizeof(float) * N);
    ASSERT_EQ(host[N - 1], 0.0f);
    for (int rep = 1; rep <= 3; rep++) {
        for (int i = 0; i < N; i++)
            pin[i] = (float)(rep * (i % 7));
        ASSERT_EQ(krn_graph_launch(g_ctx, g), 0);
        ASSERT_EQ(krn_ctx_sync(g_ctx), 0);
    }
    down(host, x, sizeof(float) * N);
    for (int i = 0; i < N; i++) /* 2 * (1 + 2 + 3) * (i % 7) */
        ASSERT_EQ(host[i], (float)(12 * (i % 7)));
    /* Same topology, half the elements: updated in place. */
    add.n = N / 2;
    ASSERT_EQ(krn_graph_begin(g_ctx), 0);
    ASSERT_EQ(krn_copy_h2d(g_ctx, y, pin, sizeof(float) * N), 0);
    ASSERT_EQ(krn_add(g_ctx, &add), 0);
    ASSERT_EQ(krn_add(g_ctx, &add), 0);
    ASSERT_EQ(krn_graph_end(g_ctx, &g, &n_nodes, &updated), 0);
    ASSERT_TRUE(updated);
    ASSERT_EQ(krn_graph_launch(g_ctx, g), 0); /* pin holds 3 * (i % 7) */
    down(host, x, sizeof(float) * N);
    for (int i = 0; i < N; i++)
        ASSERT_EQ(host[i], (float)((i < N / 2 ? 18 : 12) * (i % 7)));
    /* Another topology (one more kernel): rebuilt, still right. */
    ASSERT_EQ(krn_graph_begin(g_ctx), 0);
    ASSERT_EQ(krn_add(g_ctx, &add), 0);
    ASSERT_EQ(krn_add(g_ctx, &add), 0);
    ASSERT_EQ(krn_add(g_ctx, &add), 0);
    ASSERT_EQ(krn_add(g_ctx, &add), 0);
    ASSERT_EQ(krn_graph_end(g_ctx, &g, &n_nodes, &updated), 0);
    ASSERT_EQ(n_nodes, 4);
    ASSERT_EQ(krn_graph_launch(g_ctx, g), 0);
    down(host, x, sizeof(float) * N);
    for (int i = 0; i < N; i++)
        ASSERT_EQ(host[i], (float)((i < N / 2 ? 30 : 12) * (i % 7)));
    /* A wait inside a capture is refused and invalidates it: the end reports it, *g stays. */
    krn_graph_t *g_before = g;
    ASSERT_EQ(krn_graph_begin(g_ctx), 0);
    ASSERT_EQ(krn_add(g_ctx, &add), 0);
    ASSERT_NE(krn_ctx_sync(g_ctx), 0);
    ASSERT_EQ(krn_graph_end(g_ctx, &g, &n_nodes, &updated), PC_ERR_UNSUPPORTED);
    ASSERT_TRUE(g == g_before);
    /* And krn_graph_abort after a failed recording: the stream runs work again. */
    ASSERT_EQ(krn_graph_begin(g_ctx), 0);
    krn_graph_abort(g_ctx);
    ASSERT_EQ(krn_add(g_ctx, &add), 0);
    down(host, x, sizeof(float) * N);
    ASSERT_EQ(host[7], 0.0f);  /* i % 7 == 0 */
    ASSERT_EQ(host[8], 33.0f); /* 30 + 3 */
    ASSERT_EQ(krn_graph_launch(g_ctx, NULL), PC_ERR_INVAL);
    krn_graph_free(g_ctx, g);
    krn_graph_free(g_ctx, NULL);
    krn_host_free(g_ctx, pin);
    krn_host_free(g_ctx, NULL);
    krn_dev_free(g_ctx, x);
    krn_dev_free(g_ctx, y);
    free(host);
}
