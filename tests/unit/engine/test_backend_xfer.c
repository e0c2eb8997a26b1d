/*
 * test_backend_xfer.c — engine/backend_xfer.c: KV block transfers between the pool and host
 * memory on the cpu backend (the path the disk tier takes there), the case shared with the
 * cuda backend's copy stream (test_xfer_case.h; the gpu label runs it in test_krn_gpu), and
 * the host buffers: aligned for O_DIRECT, refused cleanly under a failing allocator.
 */
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

PC_TEST_MAIN()
