/*
 * test_krn_gpu_quant.h — the part of test_krn_gpu.c for quantized weights (kernels.h,
 * "Quantized weights"; issue 25): krn_dequant against krn_ref_dequant bit for bit (every type,
 * every output type, random and edge blocks, a gathered row list with ids outside the table,
 * aligned and unaligned outputs),
 * and krn_qmatmul on both its paths (the GEMV kernel up to KRN_QGEMV_MAX_ROWS rows, the
 * dequantize-then-cuBLAS chunks beyond) against krn_ref_qmatmul, and the GEMM path also
 * against the reference GEMM over the same dequantized halves it hands cuBLAS.
 */

static const int32_t g_qtypes[] = {KRN_QT_Q4_0, KRN_QT_Q5_0, KRN_QT_Q5_1, KRN_QT_Q8_0,
                                   KRN_QT_Q4_K, KRN_QT_Q5_K, KRN_QT_Q6_K};

/* Element i of a host F32/F16/BF16 array, as F32. */
static float q_elem(const void *p, int64_t i, enum krn_dtype t)
{
    return t == KRN_F16    ? krn_f16_to_f32(((const uint16_t *)p)[i])
           : t == KRN_BF16 ? krn_bf16_to_f32(((const uint16_t *)p)[i])
                           : ((const float *)p)[i];
}

PC_TEST(quant_dequant_matches_reference_bit_for_bit)
{
    NEED_GPU();
    kt_rng_t r = {250};
    enum { WROWS = 13, NB = 3, ROWS = 9 };
    for (size_t ti = 0; ti < PC_ARRAY_LEN(g_qtypes); ti++) {
        int32_t t = g_qtypes[ti], K = NB * krn_qtype_block_elems(t);
        int64_t rb = krn_qtype_row_bytes(t, K);
        uint8_t *w = malloc((size_t)(WROWS * rb));
        kt_qblocks(&r, t, (int64_t)WROWS * NB, w, true);
        /* Rows 0 .. ROWS - 1 gathered at random, two of them outside the table. */
        int32_t rows[ROWS];
        for (int i = 0; i < ROWS; i++)
            rows[i] = (int32_t)kt_below(&r, WROWS);
        rows[2] = WROWS;
        rows[6] = -3;
        void *dw = up(w, (size_t)(WROWS * rb));
        int32_t *drows = up(rows, sizeof rows);
        for (int dt = 0; dt < 3; dt++) {
            for (int gather = 0; gather < 2; gather++) {
                int32_t n = gather ? ROWS : WROWS;
                size_t ny = (size_t)n * K * krn_dtype_size((enum krn_dtype)dt);
                uint8_t *want = malloc(ny), *got = malloc(ny);
                /* The gathered rows land one element past a 16-byte boundary: the kernel's
                 * element-by-element stores; the others its 16-byte ones. */
                size_t shift = gather ? krn_dtype_size((enum krn_dtype)dt) : 0;
                uint8_t *dy0 = dev_filled(ny + 16, 0x7f), *dy = dy0 + shift;
                krn_dequant_args_t a = {.w = w,
                                        .rows = gather ? rows : NULL,
                                        .y = want,
                                        .n_rows = n,
                                        .n_wrows = WROWS,
                                        .n_in = K,
                                        .qtype = t,
                                        .dtype = (enum krn_dtype)dt};
                ASSERT_EQ(krn_ref_dequant(&a), 0);
                a.w = dw;
                a.rows = gather ? drows : NULL;
                a.y = dy;
                ASSERT_EQ(krn_dequant(g_ctx, &a), 0);
                down(got, dy, ny);
                krn_dev_free(g_ctx, dy0);
                for (int32_t i = 0; i < n; i++) {
                    size_t rbytes = (size_t)K * krn_dtype_size((enum krn_dtype)dt);
                    bool outside = gather && (rows[i] < 0 || rows[i] >= WROWS);
                    for (int32_t k = 0; outside && k < K; k++)
                        ASSERT_TRUE(isnan(q_elem(got + i * rbytes, k, (enum krn_dtype)dt)));
                    if (!outside && memcmp(got + i * rbytes, want + i * rbytes, rbytes) != 0)
                        PC_TEST__FAIL("%s to dtype %d, row %d: the kernel differs from the "
                                      "reference (first element %.9g vs %.9g)",
                                      krn_qtype_name(t), dt, (int)i,
                                      (double)q_elem(got + i * rbytes, 0, (enum krn_dtype)dt),
                                      (double)q_elem(want + i * rbytes, 0, (enum krn_dtype)dt));
                }
                free(want);
                free(got);
            }
        }
        /* Bad arguments enqueue nothing. */
        krn_dequant_args_t bad = {.w = dw,
                                  .y = dw,
                                  .n_rows = 1,
                                  .n_wrows = 1,
                                  .n_in = K + 8,
                                  .qtype = t,
                                  .dtype = KRN_F32};
        ASSERT_EQ(krn_dequant(g_ctx, &bad), PC_ERR_INVAL);
        krn_dev_free(g_ctx, dw);
        krn_dev_free(g_ctx, drows);
        free(w);
    }
}

/* One krn_qmatmul case on the device against krn_ref_qmatmul (tol) and, on the GEMM path,
 * against krn_ref_gemm over the weights dequantized to x's type (1e-5: the same halves). */
static void qmatmul_case(kt_rng_t *r, int32_t t, int32_t M, int32_t N, int32_t n_blocks,
                         enum krn_dtype xt, bool acc, size_t scratch_rows)
{
    int32_t K = n_blocks * krn_qtype_block_elems(t);
    int64_t rb = krn_qtype_row_bytes(t, K);
    size_t xs = krn_dtype_size(xt), nx = (size_t)M * K, ny = (size_t)M * N;
    uint8_t *w = malloc((size_t)(N * rb)), *x = malloc(nx * xs);
    float *want = malloc(ny * 4), *got = malloc(ny * 4), *y0 = malloc(ny * 4);
    kt_qblocks(r, t, (int64_t)N * n_blocks, w, false);
    for (size_t i = 0; i < nx; i++) {
        float v = kt_unif(r) * 2;
        if (xt == KRN_F32)
            ((float *)x)[i] = v;
        else
            ((uint16_t *)x)[i] = xt == KRN_F16 ? krn_f32_to_f16(v) : krn_f32_to_bf16(v);
    }
    for (size_t i = 0; i < ny; i++)
        y0[i] = want[i] = kt_unif(r);
    krn_qmatmul_args_t a = {.w = w,
                            .qtype = t,
                            .x = x,
                            .x_dtype = xt,
                            .y = want,
                            .M = M,
                            .N = N,
                            .K = K,
                            .accumulate = acc};
    PC_ASSERT(krn_ref_qmatmul(&a) == 0);
    void *dw = up(w, (size_t)(N * rb)), *dx = up(x, nx * xs);
    float *dy = up(y0, ny * 4);
    size_t sb = scratch_rows * (size_t)K * 2;
    void *ds = scratch_rows ? dev_filled(sb, 0xff) : NULL;
    a.w = dw;
    a.x = dx;
    a.y = dy;
    a.scratch = ds;
    a.scratch_bytes = sb;
    int rc = krn_qmatmul(g_ctx, &a);
    if (rc == 0)
        down(got, dy, ny * 4);
    double err = rc == 0 ? kt_rel_err_f(got, want, (int64_t)ny) : INFINITY, err_gemm = 0;
    if (rc == 0 && M > KRN_QGEMV_MAX_ROWS) {
        /* The halves cuBLAS multiplied: the reference GEMM over them. */
        uint16_t *wh = malloc((size_t)N * K * 2);
        krn_dequant_args_t d = {
            .w = w, .y = wh, .n_rows = N, .n_wrows = N, .n_in = K, .qtype = t, .dtype = xt};
        PC_ASSERT(krn_ref_dequant(&d) == 0);
        memcpy(want, y0, ny * 4);
        krn_gemm_args_t g = {
            .x = x, .w = wh, .y = want, .M = M, .N = N, .K = K, .dtype = xt, .accumulate = acc};
        PC_ASSERT(krn_ref_gemm(&g) == 0);
        err_gemm = kt_rel_err_f(got, want, (int64_t)ny);
        free(wh);
    }
    krn_dev_free(g_ctx, dw);
    krn_dev_free(g_ctx, dx);
    krn_dev_free(g_ctx, dy);
    krn_dev_free(g_ctx, ds);
    free(w);
    free(x);
    free(want);
    free(got);
    free(y0);
    ASSERT_EQ(rc, 0);
    /* GEMV: the same dequantized weights and x as the reference, F32 sums. GEMM path: the
     * weights rounded to x's type (F16: 2^-11, BF16: 2^-8 relative per weight). */
    double tol = M <= KRN_QGEMV_MAX_ROWS ? 1e-5 : xt == KRN_F16 ? 2e-3 : 1e-2;
    if (err > tol || err_gemm > 1e-5)
        PC_TEST__FAIL("%s M=%d N=%d K=%d x dtype %d acc %d: rel err %.3g (tol %.1g), vs the GEMM "
                      "over the same halves %.3g",
                      krn_qtype_name(t), M, N, K, (int)xt, (int)acc, err, tol, err_gemm);
}

PC_TEST(quant_matmul_matches_reference_on_both_paths)
{
    NEED_GPU();
    kt_rng_t r = {251};
    for (size_t ti = 0; ti < PC_ARRAY_LEN(g_qtypes); ti++) {
        int32_t t = g_qtypes[ti];
        /* GEMV: 1, 3 and KRN_QGEMV_MAX_ROWS rows; N not a multiple of the 4 warps of a CTA. */
        PC_TEST_CALL(qmatmul_case(&r, t, 1, 37, 3, KRN_F32, false, 0));
        PC_TEST_CALL(qmatmul_case(&r, t, 3, 130, 2, KRN_F16, true, 0));
        PC_TEST_CALL(qmatmul_case(&r, t, KRN_QGEMV_MAX_ROWS, 257, 5, KRN_BF16, false, 0));
        /* GEMM path: 16-row chunks over 77 rows (the last one short), and one chunk. */
        PC_TEST_CALL(qmatmul_case(&r, t, 37, 77, 2, KRN_F16, true, 16));
        PC_TEST_CALL(qmatmul_case(&r, t, KRN_QGEMV_MAX_ROWS + 1, 64, 3, KRN_BF16, false, 64));
    }
    /* The GEMM path refuses F32 activations and a scratch smaller than one row, enqueueing
     * nothing. */
    float x[9 * 256] = {0}, y[9 * 4];
    uint8_t w[4 * 144] = {0}; /* 4 Q4_K rows of one block */
    void *dx = up(x, sizeof x), *dy = up(y, sizeof y), *dw = up(w, sizeof w),
         *ds = dev_filled(512, 0);
    krn_qmatmul_args_t a = {.w = dw,
                            .qtype = KRN_QT_Q4_K,
                            .x = dx,
                            .x_dtype = KRN_F32,
                            .y = dy,
                            .M = 9,
                            .N = 4,
                            .K = 256,
                            .scratch = ds,
                            .scratch_bytes = 512};
    ASSERT_EQ(krn_qmatmul(g_ctx, &a), PC_ERR_INVAL);
    a.x_dtype = KRN_F16;
    a.scratch_bytes = 511;
    ASSERT_EQ(krn_qmatmul(g_ctx, &a), PC_ERR_INVAL);
    a.scratch_bytes = 512;
    ASSERT_EQ(krn_qmatmul(g_ctx, &a), 0);
    a.M = KRN_QGEMV_MAX_ROWS + 1;
    ASSERT_EQ(krn_qgemv(g_ctx, &a), PC_ERR_INVAL);
    ASSERT_EQ(krn_ctx_sync(g_ctx), 0);
    krn_dev_free(g_ctx, dx);
    krn_dev_free(g_ctx, dy);
    krn_dev_free(g_ctx, dw);
    krn_dev_free(g_ctx, ds);
}

/*
 * End to end (needs eng_testmodel.h, included by test_krn_gpu_e2e.h before this part): the cuda
 * engine on models written by kvgw's quantizer (every type, the Q4_K_M mix with its unfusable
 * Q4_K/Q6_K groups, a tied quantized head that is also the quantized embedding table) against a
 * float64 forward over the same weights dequantized (tm_reference), in prefill (36 rows: the
 * GEMM path), a chunk of KRN_QGEMV_MAX_ROWS rows and single decode steps (the GEMV); and the
 * device holds the file's quantized bytes, nothing widened (eng_cuda_stats_t).
 *
 * Tolerance: the device multiplies the dequantized weights exactly as stored; what it rounds is
 * its activations, to the GEMM type (BF16 at worst: 2^-9 relative at most, rms 2^-9 / sqrt(3)
 * = 1.1e-3) and, on the GEMM path, the dequantized weights to the same type (another 1.1e-3):
 * 1.6e-3 relative rms per product. Two layers put 9 products in series on the residual stream
 * (q/k/v, output, gate/up, down, and the head), whose independent noises add in quadrature:
 * 4.8e-3 of the logits' rms, F16 KV (2^-12) adding little. tm_rel_err is the worst row's max
 * |difference| over its max |logit|, both near 3 rms over 300 logits, so the expected figure is
 * about 5e-3: GPU_QUANT_TOL is four times that. (The CPU backend's 8-bit activations need 0.06,
 * test_forward_quant.c.)
 */
#define GPU_QUANT_TOL 0.02

PC_TEST(cuda_engine_on_quantized_models_matches_float64)
{
    NEED_GPU();
    const struct {
        uint32_t dtype;
        bool tied;
    } cases[] = {{ENG_GGML_TYPE_Q4_0, false}, {ENG_GGML_TYPE_Q8_0, false},
                 {ENG_GGML_TYPE_Q4_K, true},  {ENG_GGML_TYPE_Q5_K, false},
                 {ENG_GGML_TYPE_Q6_K, false}, {ENG_MKMODEL_Q4_K_M, false}};
    kt_rng_t r = {252};
    enum { N = 52, P = 36, C = KRN_QGEMV_MAX_ROWS };
    int32_t toks[N];
    for (int i = 0; i < N; i++)
        toks[i] = (int32_t)kt_below(&r, E2E_VOCAB);
    for (size_t ci = 0; ci < PC_ARRAY_LEN(cases); ci++) {
        /* The wide e2e shape: every row a whole number of K-quant super-blocks (256). */
        char path[256];
        eng_mkmodel_params_t mp = e2e_params(ENG_ARCH_LLAMA, cases[ci].dtype, true);
        mp.tied = cases[ci].tied;
        e2e_make(&mp, path, sizeof path);
        float *ref = malloc((size_t)N * E2E_VOCAB * sizeof(float));
        float *lg = malloc((size_t)N * E2E_VOCAB * sizeof(float));
        ASSERT_EQ(tm_reference(path, toks, N, ref), 0);
        /* Every matrix of these files is quantized: the device holds exactly the file's blocks
         * of them (a tied head once), none widened. */
        uint64_t file_quant = 0;
        char err[256];
        eng_gguf_t *gf = NULL;
        ASSERT_EQ(eng_gguf_open(path, &gf, err, sizeof err), 0);
        for (uint64_t i = 0; i < eng_gguf_n_tensors(gf); i++) {
            const eng_gguf_tensor_t *t = eng_gguf_tensor_at(gf, i);
            file_quant += eng_quant_type_is_quant(t->type) ? t->n_bytes : 0;
        }
        eng_gguf_free(gf);
        eng_cuda_stats_t st0, st1;
        eng_cuda_stats_get(&st0);
        eng_t *e = e2e_engine(path, "cuda", ENG_KV_F16);
        ASSERT_TRUE(e != NULL);
        eng_cuda_stats_get(&st1);
        ASSERT_EQ_U64(st1.weight_bytes_quant - st0.weight_bytes_quant, file_quant);
        ASSERT_EQ_U64(st1.weight_bytes_wide - st0.weight_bytes_wide, 0);
        ASSERT_STR_EQ(eng_backend_name_of(e), "cuda");
        eng_seq_t *s;
        ASSERT_EQ(eng_seq_create(e, &s), 0);
        eng_batch_item_t it = {.seq = s, .tokens = toks, .n_tokens = P, .logits = ENG_LOGITS_ALL};
        ASSERT_EQ(eng_forward(e, &it, 1, lg), 0);
        it = (eng_batch_item_t){
            .seq = s, .tokens = toks + P, .n_tokens = C, .logits = ENG_LOGITS_ALL};
        ASSERT_EQ(eng_forward(e, &it, 1, lg + (size_t)P * E2E_VOCAB), 0);
        for (int i = P + C; i < N; i++) {
            it = (eng_batch_item_t){
                .seq = s, .tokens = toks + i, .n_tokens = 1, .logits = ENG_LOGITS_ALL};
            ASSERT_EQ(eng_forward(e, &it, 1, lg + (size_t)i * E2E_VOCAB), 0);
        }
        char msg[256];
        ASSERT_EQ(eng_check(e, msg, sizeof msg), 0);
        eng_seq_free(e, s);
        eng_free(e);
        double prefill = tm_rel_err(lg, ref, P, E2E_VOCAB);
        double decode =
            tm_rel_err(lg + (size_t)P * E2E_VOCAB, ref + (size_t)P * E2E_VOCAB, N - P, E2E_VOCAB);
        fprintf(stderr, "  %s%s: rel err prefill %.2e, chunk and decode %.2e (tol %.2g)\n",
                eng_mkmodel_dtype_name(cases[ci].dtype), cases[ci].tied ? " tied" : "", prefill,
                decode, GPU_QUANT_TOL);
        free(ref);
        free(lg);
        unlink(path);
        ASSERT_LE(prefill, GPU_QUANT_TOL);
        ASSERT_LE(decode, GPU_QUANT_TOL);
    }
}
