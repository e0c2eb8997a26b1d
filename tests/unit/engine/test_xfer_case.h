/*
 * test_xfer_case.h — the KV tier transfer case shared by test_backend_xfer.c (the cpu backend,
 * every build) and test_krn_gpu.c (the cuda backend's copy stream, label gpu): blocks out of the
 * pool to host memory and back into other blocks, then a sequence continued over the loaded
 * blocks gives the cold run's logits.
 *
 * The order of the calls is the overlap the cuda backend must make safe: the blocks saved are
 * freed and overwritten by another sequence's step right after the transfer is enqueued (the
 * step must wait for the copy, not the host), and the continuation runs right after the load is
 * enqueued, without waiting for its fence (the step must wait for the load on the device).
 * Needs engine_internal.h, kvpool.h, pc_test.h and eng_testmodel.h (tm_rel_err) included first.
 */
#ifndef TEST_XFER_CASE_H
#define TEST_XFER_CASE_H

static uint64_t xc_rng = 0x9E3779B97F4A7C15ull;
static int32_t xc_token(uint32_t n_vocab)
{
    xc_rng ^= xc_rng << 13, xc_rng ^= xc_rng >> 7, xc_rng ^= xc_rng << 17;
    return (int32_t)(xc_rng % n_vocab);
}

/* Runs tokens[0..n) on a new sequence; logits of every row into out (may be NULL: none).
 * Returns the sequence, or NULL. */
static eng_seq_t *xc_run(eng_t *e, const int32_t *tokens, uint32_t n, float *out)
{
    eng_seq_t *s;
    if (eng_seq_create(e, &s) != 0)
        return NULL;
    eng_batch_item_t it = {.seq = s,
                           .tokens = tokens,
                           .n_tokens = n,
                           .logits = out != NULL ? ENG_LOGITS_ALL : ENG_LOGITS_NONE};
    if (eng_forward(e, &it, 1, out) != 0) {
        eng_seq_free(e, s);
        return NULL;
    }
    return s;
}

/* The case on engine e (kv_poison on, room for a few hundred tokens); tol: the relative error
 * allowed between the loaded continuation's logits and the cold run's. */
static void xfer_case(eng_t *e, double tol)
{
    enum { N_PRE = 64, N_NEW = 32, N = N_PRE + N_NEW };
    eng_kvpool_t *kv = eng_kvpool(e);
    uint32_t V = eng_n_vocab(e), bt = eng_kvpool_block_tokens(kv);
    uint32_t nb = N_PRE / bt; /* whole blocks of the prefix */
    size_t bb = eng_kvpool_block_bytes(kv);
    ASSERT_EQ(N_PRE % bt, 0);
    int32_t tok[N], filler[N_PRE];
    for (int i = 0; i < N; i++)
        tok[i] = xc_token(V);
    for (int i = 0; i < N_PRE; i++)
        filler[i] = xc_token(V);
    float *cold = pc_xmalloc((size_t)N * V * sizeof *cold);
    float *got = pc_xmalloc((size_t)N_NEW * V * sizeof *got);
    void *host = NULL, *back = NULL;
    ASSERT_EQ(eng_backend_host_alloc(e->be, nb * bb, &host), 0);
    ASSERT_EQ(eng_backend_host_alloc(e->be, nb * bb, &back), 0);
    ASSERT_EQ((uintptr_t)host % 64, 0);

    eng_seq_t *s = xc_run(e, tok, N, cold);
    ASSERT_TRUE(s != NULL);
    eng_seq_free(e, s);

    /* Out: the prefix's blocks to host memory, then the blocks freed and overwritten. */
    s = xc_run(e, tok, N_PRE, NULL);
    ASSERT_TRUE(s != NULL);
    uint32_t saved[16];
    memcpy(saved, s->kv.blocks, nb * sizeof *saved);
    uint64_t f_out = 0;
    ASSERT_EQ(eng_backend_kv_to_host(e->be, kv, saved, nb, host, &f_out), 0);
    eng_seq_free(e, s);
    eng_seq_t *other = xc_run(e, filler, N_PRE, NULL);
    ASSERT_TRUE(other != NULL);
    ASSERT_EQ(eng_backend_kv_fence(e->be, f_out, true), 1);

    /* Back: into fresh blocks, and the sequence continued at once. */
    uint32_t fresh[16];
    for (uint32_t i = 0; i < nb; i++)
        ASSERT_EQ(eng_kvpool_alloc(kv, &fresh[i]), 0);
    uint64_t f_in = 0;
    ASSERT_EQ(eng_backend_kv_from_host(e->be, kv, fresh, nb, host, &f_in), 0);
    ASSERT_TRUE(eng_backend_kv_fence(e->be, f_in, false) >= 0);
    ASSERT_EQ(eng_seq_create(e, &s), 0);
    ASSERT_EQ(eng_kvseq_share(&s->kv, kv, fresh, N_PRE), 0);
    for (uint32_t i = 0; i < nb; i++)
        eng_kvpool_unref(kv, fresh[i]); /* the sequence holds them now */
    ASSERT_EQ(eng__seq_tokens_reserve(s, N_PRE), 0);
    memcpy(s->tokens, tok, N_PRE * sizeof *tok);
    eng_batch_item_t it = {
        .seq = s, .tokens = tok + N_PRE, .n_tokens = N_NEW, .logits = ENG_LOGITS_ALL};
    ASSERT_EQ(eng_forward(e, &it, 1, got), 0);
    double err = tm_rel_err(got, cold + (size_t)N_PRE * V, N_NEW, V);
    if (err > tol)
        fprintf(stderr, "  loaded continuation vs cold: relative error %g > %g\n", err, tol);
    ASSERT_TRUE(err <= tol);

    /* The loaded blocks hold exactly the bytes saved. */
    uint64_t f_back = 0;
    ASSERT_EQ(eng_backend_kv_to_host(e->be, kv, s->kv.blocks, nb, back, &f_back), 0);
    ASSERT_EQ(eng_backend_kv_fence(e->be, f_back, true), 1);
    ASSERT_MEM_EQ(back, host, nb * bb);

    /* Bad input changes nothing: a block out of range, a fence never issued. */
    uint32_t bad[2] = {fresh[0], eng_kvpool_n_blocks(kv)};
    uint64_t f_bad = 7;
    ASSERT_EQ(eng_backend_kv_to_host(e->be, kv, bad, 2, back, &f_bad), PC_ERR_INVAL);
    ASSERT_EQ(eng_backend_kv_from_host(e->be, kv, bad, 2, host, &f_bad), PC_ERR_INVAL);
    ASSERT_EQ(eng_backend_kv_fence(e->be, 0, false), 1);
    ASSERT_EQ(eng_backend_kv_fence(e->be, f_back + 1000, false), PC_ERR_INVAL);
    char why[256];
    ASSERT_EQ(eng_check(e, why, sizeof why), 0);

    eng_seq_free(e, s);
    eng_seq_free(e, other);
    eng_backend_host_free(e->be, host);
    eng_backend_host_free(e->be, back);
    pc_free(cold);
    pc_free(got);
}

#endif
