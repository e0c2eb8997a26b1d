/*
 * test_backend_xfer.c — engine/backend_xfer.c: KV block transfers between the pool and host
 * memory on the cpu backend (the path the disk tier takes there), the case shared with the
 * cuda backend's copy stream (test_xfer_case.h; the gpu label runs it in test_krn_gpu), and
 * the host buffers: aligned for O_DIRECT, refused cleanly under a failing allocator, and the G2
 * tier's slab of pieces (budget, reuse, out of memory, two threads).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "engine_internal.h"
#include "eng_testmodel.h"
#include "kvpool.h"
#include "pc_err.h"
#include "pc_failalloc.h"
#include "pc_test.h"
#include "test_xfer_case.h"

static eng_t *small_engine(enum eng_kv_dtype kvt, char *path, size_t len)
{
    eng_mkmodel_params_t p = eng_mkmodel_params_default();
    p.n_layer = 2;
    p.n_embd = 128;
    p.n_head = 8;
    p.n_head_kv = 2;
    p.n_ff = 256;
    p.n_ctx = 1024;
    p.dtype = ENG_GGML_TYPE_F32;
    p.seed = 23;
    char err[256];
    if (tm_make(&p, 300, path, len, err, sizeof err) != 0) {
        fprintf(stderr, "mkmodel: %s\n", err);
        return NULL;
    }
    eng_params_t ep = eng_params_default();
    ep.model_path = path;
    ep.kv_dtype = kvt;
    ep.kv_max_tokens = 512;
    ep.kv_poison = true;
    ep.n_threads = 1;
    eng_t *e = NULL;
    if (eng_init(&ep, &e, err, sizeof err) != 0)
        fprintf(stderr, "eng_init: %s\n", err);
    return e;
}

PC_TEST(cpu_roundtrip_gives_cold_logits)
{
    for (int kvt = 0; kvt < 2; kvt++) {
        char path[256];
        eng_t *e = small_engine(kvt ? ENG_KV_F32 : ENG_KV_F16, path, sizeof path);
        ASSERT_TRUE(e != NULL);
        ASSERT_FALSE(eng_backend_has_kv_xfer(e->be)); /* the pool is the backend's memory */
        xfer_case(e, 1e-4);
        eng_free(e);
        unlink(path);
        if (pc_test__state)
            return;
    }
}

PC_TEST(host_buffers_are_aligned_and_fail_cleanly)
{
    char path[256];
    eng_t *e = small_engine(ENG_KV_F16, path, sizeof path);
    ASSERT_TRUE(e != NULL);
    for (size_t n = 1; n < 100000; n = n * 7 + 3) {
        void *p = NULL;
        ASSERT_EQ(eng_backend_host_alloc(e->be, n, &p), 0);
        ASSERT_EQ((uintptr_t)p % 4096, 0);
        memset(p, 0xab, n); /* the whole size is usable (ASan checks the bounds) */
        eng_backend_host_free(e->be, p);
    }
    void *p = (void *)1;
    pc_failalloc_left = 0;
    pc_allocator_t prev = pc_set_allocator(&pc_failalloc);
    int rc = eng_backend_host_alloc(e->be, 4096, &p);
    pc_set_allocator(&prev);
    pc_failalloc_left = -1;
    ASSERT_EQ(rc, PC_ERR_NOMEM);
    ASSERT_TRUE(p == NULL);
    ASSERT_EQ(eng_backend_host_alloc(e->be, SIZE_MAX - 10, &p), PC_ERR_NOMEM);
    eng_backend_host_free(e->be, NULL);
    eng_free(e);
    unlink(path);
}

PC_TEST(slab_hands_out_pieces_up_to_its_budget)
{
    char path[256];
    eng_t *e = small_engine(ENG_KV_F16, path, sizeof path);
    ASSERT_TRUE(e != NULL);
    eng_host_slab_t *s = NULL;
    ASSERT_EQ(eng_host_slab_init(e->be, 0, 1 << 20, &s), PC_ERR_INVAL);
    ASSERT_EQ(eng_host_slab_init(e->be, 5000, 4096, &s), PC_ERR_INVAL); /* below one piece */
    ASSERT_TRUE(s == NULL);
    /* 5000-byte pieces take 8192 each: 40 of them in the budget, no more. */
    enum { N = 40 };
    ASSERT_EQ(eng_host_slab_init(e->be, 5000, (uint64_t)N * 8192 + 100, &s), 0);
    void *p[N + 1];
    for (int i = 0; i < N; i++) {
        p[i] = eng_host_slab_alloc(s, 5000);
        ASSERT_TRUE(p[i] != NULL);
        ASSERT_EQ((uintptr_t)p[i] % 4096, 0);
        memset(p[i], i, 8192); /* the whole rounded piece is usable, and pieces do not overlap */
    }
    for (int i = 0; i < N; i++)
        for (int k = 0; k < 8192; k += 512)
            ASSERT_EQ(((uint8_t *)p[i])[k], i);
    ASSERT_TRUE(eng_host_slab_alloc(s, 5000) == NULL); /* the budget is spent */
    ASSERT_TRUE(eng_host_slab_alloc(s, 8193) == NULL); /* larger than a piece */
    uint64_t used, reserved;
    eng_host_slab_usage(s, &used, &reserved);
    ASSERT_EQ_U64(used, N);
    ASSERT_EQ_U64(reserved, (uint64_t)N * 8192);
    /* A piece put back is handed out again; nothing new is reserved. */
    eng_host_slab_release(s, p[7], 5000);
    eng_host_slab_release(s, NULL, 0);
    p[N] = eng_host_slab_alloc(s, 100);
    ASSERT_TRUE(p[N] == p[7]);
    eng_host_slab_usage(s, &used, &reserved);
    ASSERT_EQ_U64(used, N);
    ASSERT_EQ_U64(reserved, (uint64_t)N * 8192);
    eng_host_slab_free(s);

    /* Out of memory: no piece, nothing changed; the next call grows the slab. */
    ASSERT_EQ(eng_host_slab_init(e->be, 4096, 1 << 20, &s), 0);
    for (long k = 0; k < 4; k++) {
        pc_failalloc_left = k;
        pc_failalloc_count = 0;
        pc_allocator_t prev = pc_set_allocator(&pc_failalloc);
        void *q = eng_host_slab_alloc(s, 4096);
        pc_set_allocator(&prev);
        pc_failalloc_left = -1;
        if (q != NULL) {
            eng_host_slab_release(s, q, 4096);
            break;
        }
        eng_host_slab_usage(s, &used, &reserved);
        ASSERT_EQ_U64(used, 0);
        ASSERT_EQ_U64(reserved, 0);
    }
    void *q = eng_host_slab_alloc(s, 4096);
    ASSERT_TRUE(q != NULL);
    eng_host_slab_release(s, q, 4096);
    eng_host_slab_free(s);
    eng_host_slab_free(NULL);
    eng_free(e);
    unlink(path);
}

/* Two threads taking and returning pieces: every piece is held by one thread at a time. */
typedef struct slab_th {
    eng_host_slab_t *s;
    int id, bad;
} slab_th_t;

static void *slab_thread(void *arg)
{
    slab_th_t *t = arg;
    void *held[8];
    for (int round = 0; round < 2000; round++) {
        int n = 0;
        for (; n < 8; n++) {
            held[n] = eng_host_slab_alloc(t->s, 4096);
            if (held[n] == NULL)
                break;
            memset(held[n], t->id, 64);
        }
        for (int i = 0; i < n; i++) {
            for (int k = 0; k < 64; k++)
                t->bad += ((uint8_t *)held[i])[k] != t->id;
            eng_host_slab_release(t->s, held[i], 4096);
        }
    }
    return NULL;
}

PC_TEST(slab_is_thread_safe)
{
    char path[256];
    eng_t *e = small_engine(ENG_KV_F16, path, sizeof path);
    ASSERT_TRUE(e != NULL);
    eng_host_slab_t *s = NULL;
    ASSERT_EQ(eng_host_slab_init(e->be, 4096, 12 * 4096, &s), 0); /* fewer than 2 x 8 */
    slab_th_t a = {s, 1, 0}, b = {s, 2, 0};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, slab_thread, &a), 0);
    slab_thread(&b);
    pthread_join(th, NULL);
    ASSERT_EQ(a.bad + b.bad, 0);
    uint64_t used, reserved;
    eng_host_slab_usage(s, &used, &reserved);
    ASSERT_EQ_U64(used, 0);
    ASSERT_EQ_U64(reserved, 12 * 4096);
    eng_host_slab_free(s);
    eng_free(e);
    unlink(path);
}

PC_TEST_MAIN()
