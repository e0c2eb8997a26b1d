/*
 * test_krn_gpu_xfer.h — the G2 tier's transfers, part of test_krn_gpu.c (label gpu): krn_xfer's
 * copy stream (ordering after the compute stream, fences, the event ring past its size, bad
 * input), the cuda backend's kv_to_host / kv_from_host through the engine (test_xfer_case.h,
 * the same case the cpu backend passes in test_backend_xfer), and the G2 slab's pinned pieces
 * as transfer buffers.
 */
#include "test_xfer_case.h"

PC_TEST(xfer_orders_after_compute_and_recycles_fences)
{
    NEED_GPU();
    kt_rng_t r = {31};
    krn_kv_t kv = {.n_blocks = 12,
                   .n_layer = 3,
                   .n_head_kv = 2,
                   .head_dim = 32,
                   .block_tokens = 16,
                   .dtype = KRN_F16};
    size_t bb = krn_kv_block_bytes(&kv), bytes = bb * (size_t)kv.n_blocks;
    uint8_t *h = malloc(bytes);
    for (size_t i = 0; i < bytes; i++)
        h[i] = (uint8_t)kt_next(&r);
    kv.base = up(h, bytes);
    uint8_t *pin = NULL;
    ASSERT_EQ(krn_host_alloc(g_ctx, 4 * bb, (void **)&pin), 0);
    krn_xfer_t *x = NULL;
    ASSERT_EQ(krn_xfer_init(g_ctx, &x), 0);
    ASSERT_EQ(krn_xfer_last(x), 0);
    ASSERT_EQ(krn_xfer_query(x, 0), 1);
    ASSERT_EQ(krn_xfer_query(x, 1), PC_ERR_INVAL);

    /* Ordered after the compute stream: a memset enqueued there, then at once a transfer of the
     * same block, reads what the memset wrote. */
    int32_t id5 = 5;
    ASSERT_EQ(krn_memset(g_ctx, (uint8_t *)kv.base + 5 * bb, 0x3c, bb), 0);
    uint64_t f = 0;
    ASSERT_EQ(krn_xfer_blocks(x, &kv, &id5, 1, pin, true, &f), 0);
    ASSERT_EQ(f, 1);
    ASSERT_EQ(krn_xfer_wait(x, f), 0);
    for (size_t i = 0; i < bb; i++)
        if (pin[i] != 0x3c)
            PC_TEST__FAIL("byte %zu of the saved block is %#x, not the memset's 0x3c", i, pin[i]);
    memset(h + 5 * bb, 0x3c, bb);

    /* Past the ring: 3 x KRN_XFER_RING transfers of runs and scattered ids; each fence done
     * once waited, every older one done, the contents right. */
    for (int k = 0; k < 3 * KRN_XFER_RING; k++) {
        int32_t ids[4];
        int32_t n = 1 + (int32_t)kt_below(&r, 4);
        int32_t b0 = (int32_t)kt_below(&r, (uint32_t)(kv.n_blocks - 4));
        for (int32_t i = 0; i < n; i++)
            ids[i] = k % 2 ? b0 + i : (int32_t)kt_below(&r, (uint32_t)kv.n_blocks);
        ASSERT_EQ(krn_xfer_blocks(x, &kv, ids, n, pin, true, &f), 0);
        ASSERT_EQ(f, (uint64_t)k + 2);
        if (k % 97 == 0 || k + 1 == 3 * KRN_XFER_RING) {
            ASSERT_EQ(krn_xfer_wait(x, f), 0);
            ASSERT_EQ(krn_xfer_query(x, f), 1);
            ASSERT_EQ(krn_xfer_query(x, f / 2), 1);
            for (int32_t i = 0; i < n; i++)
                ASSERT_MEM_EQ(pin + (size_t)i * bb, h + (size_t)ids[i] * bb, bb);
        }
    }
    ASSERT_EQ(krn_xfer_query(x, f + 1), PC_ERR_INVAL);
    ASSERT_EQ(krn_xfer_wait(x, f + 1), PC_ERR_INVAL);

    /* Into the device, and the compute stream ordered after it: a device-to-host copy on the
     * compute stream then sees the loaded bytes. */
    for (size_t i = 0; i < 2 * bb; i++)
        pin[i] = (uint8_t)kt_next(&r);
    int32_t into[2] = {9, 2};
    ASSERT_EQ(krn_xfer_blocks(x, &kv, into, 2, pin, false, &f), 0);
    ASSERT_EQ(krn_xfer_order(x, f), 0);
    uint8_t *back = malloc(bytes);
    down(back, kv.base, bytes);
    ASSERT_MEM_EQ(back + 9 * bb, pin, bb);
    ASSERT_MEM_EQ(back + 2 * bb, pin + bb, bb);

    /* Bad input enqueues nothing. */
    int32_t bad[2] = {1, kv.n_blocks};
    uint64_t last = krn_xfer_last(x);
    ASSERT_EQ(krn_xfer_blocks(x, &kv, bad, 2, pin, true, &f), PC_ERR_INVAL);
    ASSERT_EQ(krn_xfer_blocks(x, &kv, bad, -1, pin, true, &f), PC_ERR_INVAL);
    ASSERT_EQ(krn_xfer_last(x), last);
    krn_xfer_free(x);
    krn_host_free(g_ctx, pin);
    krn_dev_free(g_ctx, kv.base);
    free(h);
    free(back);
}

PC_TEST(e2e_tier_transfers_overlap_and_match_cold)
{
    NEED_GPU();
    char path[256];
    e2e_model(ENG_ARCH_LLAMA, ENG_GGML_TYPE_F32, path, sizeof path);
    for (int kvt = 0; kvt < 2; kvt++) {
        eng_t *e = e2e_engine(path, "cuda", kvt ? ENG_KV_F32 : ENG_KV_F16);
        ASSERT_TRUE(e != NULL);
        ASSERT_TRUE(eng_backend_has_kv_xfer(e->be));
        xfer_case(e, 1e-3);
        /* The G2 slab's pieces are the backend's pinned memory: a block saved into one and
         * loaded back from another piece's copy round-trips exactly. */
        eng_kvpool_t *kv = eng_kvpool(e);
        size_t bb = eng_kvpool_block_bytes(kv);
        eng_host_slab_t *slab = NULL;
        ASSERT_EQ(eng_host_slab_init(e->be, bb, 8 * bb, &slab), 0);
        uint8_t *a = eng_host_slab_alloc(slab, bb), *b = eng_host_slab_alloc(slab, bb);
        ASSERT_TRUE(a != NULL && b != NULL);
        int32_t tok[48];
        for (int i = 0; i < 48; i++)
            tok[i] = xc_token(eng_n_vocab(e));
        eng_seq_t *s = xc_run(e, tok, 48, NULL);
        ASSERT_TRUE(s != NULL);
        uint32_t blk = s->kv.blocks[1], fresh;
        uint64_t f;
        ASSERT_EQ(eng_backend_kv_to_host(e->be, kv, &blk, 1, a, &f), 0);
        ASSERT_EQ(eng_backend_kv_fence(e->be, f, true), 1);
        ASSERT_EQ(eng_kvpool_alloc(kv, &fresh), 0);
        ASSERT_EQ(eng_backend_kv_from_host(e->be, kv, &fresh, 1, a, &f), 0);
        ASSERT_EQ(eng_backend_kv_to_host(e->be, kv, &fresh, 1, b, &f), 0);
        ASSERT_EQ(eng_backend_kv_fence(e->be, f, true), 1);
        ASSERT_MEM_EQ(a, b, bb);
        eng_kvpool_unref(kv, fresh);
        eng_seq_free(e, s);
        eng_host_slab_release(slab, a, bb);
        eng_host_slab_release(slab, b, bb);
        eng_host_slab_free(slab);
        eng_free(e);
        if (pc_test__state)
            break;
    }
    unlink(path);
}
