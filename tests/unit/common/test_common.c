/* test_common.c — common/: errors, allocator hooks, arena, buffers, logging. */
#include "common.h"
#include "pc_failalloc.h"
#include "pc_test.h"

#include <errno.h>

PC_TEST(err_names_and_messages)
{
    ASSERT_STR_EQ(pc_err_name(PC_ERR_NOMEM), "NOMEM");
    ASSERT_STR_EQ(pc_strerror(PC_ERR_NOMEM), "out of memory");
    ASSERT_STR_EQ(pc_strerror(PC_OK), "ok");
    ASSERT_STR_EQ(pc_err_name(12345), "UNKNOWN");
    ASSERT_EQ(pc_err_from_errno(ENOMEM), PC_ERR_NOMEM);
    ASSERT_EQ(pc_err_from_errno(ENOENT), PC_ERR_NOTFOUND);
    ASSERT_EQ(pc_err_from_errno(EIO), PC_ERR_IO);
}

PC_TEST(allocator_hooks_inject_failure)
{
    pc_failalloc_left = 1;
    pc_allocator_t prev = pc_set_allocator(&pc_failalloc);
    void *p = pc_malloc(16);
    void *q = pc_malloc(16);
    pc_set_allocator(&prev);
    ASSERT_TRUE(p != NULL);
    ASSERT_TRUE(q == NULL);
    pc_free(p);
    pc_free(NULL);
    ASSERT_TRUE(pc_reallocarray(NULL, SIZE_MAX / 2, 4) == NULL);
}

/* tests/pc_failalloc.h, which the out-of-memory tests share: each rule fails exactly the
 * allocations it names, and frees go through. */
PC_TEST(failalloc_rules)
{
    void *p[6] = {NULL};
    pc_allocator_t prev = pc_set_allocator(&pc_failalloc);
    pc_failalloc_left = 2; /* two succeed, then everything fails */
    for (int i = 0; i < 4; i++)
        p[i] = pc_malloc(8);
    pc_failalloc_left = -1;
    pc_failalloc_count = 0;
    pc_failalloc_at = 2; /* only the second fails */
    p[4] = pc_calloc(1, 8);
    void *q = pc_realloc(NULL, 8);
    p[5] = pc_malloc(8);
    pc_failalloc_at = 0;
    pc_failalloc_count = 0;
    pc_failalloc_every = 3; /* the third and sixth fail */
    int failed[6];
    void *r[6];
    for (int i = 0; i < 6; i++) {
        r[i] = pc_malloc(8);
        failed[i] = r[i] == NULL;
    }
    pc_failalloc_every = 0;
    pc_set_allocator(&prev);
    ASSERT_TRUE(p[0] != NULL && p[1] != NULL);
    ASSERT_TRUE(p[2] == NULL && p[3] == NULL);
    ASSERT_TRUE(p[4] != NULL && q == NULL && p[5] != NULL);
    ASSERT_EQ_U64(pc_failalloc_count, 6);
    for (int i = 0; i < 6; i++)
        ASSERT_EQ(failed[i], i == 2 || i == 5);
    for (int i = 0; i < 6; i++) {
        pc_free(p[i]);
        pc_free(r[i]);
    }
}

PC_TEST(arena_alignment_and_clear)
{
    pc_arena_t a;
    pc_arena_init(&a, 64);
    char *s = pc_arena_strndup(&a, "hello world", 5);
    ASSERT_STR_EQ(s, "hello");
    for (int i = 0; i < 100; i++) {
        double *d = pc_arena_new(&a, double, 3);
        ASSERT_TRUE(d != NULL);
        ASSERT_EQ((uintptr_t)d % _Alignof(max_align_t), 0);
        ASSERT_TRUE(d[0] == 0 && d[2] == 0);
        d[2] = i;
    }
    char *big = pc_arena_alloc(&a, 10000);
    ASSERT_TRUE(big != NULL);
    memset(big, 1, 10000);
    ASSERT_STR_EQ(s, "hello");
    pc_arena_clear(&a);
    ASSERT_EQ(a.bytes_used, 0);
    ASSERT_TRUE(pc_arena_alloc(&a, 8) != NULL);
    pc_arena_close(&a);
}

PC_TEST(pages_alignment_chunks_and_release)
{
    pc_pages_t p;
    pc_pages_init(&p, pc_pages_huge_available());
    uint8_t *small[40];
    for (int i = 0; i < 40; i++) { /* 40 x 3 MiB: spills over several 64 MiB chunks */
        small[i] = pc_pages_alloc(&p, ((size_t)3 << 20) + 1);
        ASSERT_TRUE(small[i] != NULL);
        ASSERT_EQ((uintptr_t)small[i] % 64, 0);
        ASSERT_EQ(small[i][0], 0); /* fresh memory reads as zero */
        memset(small[i], i + 1, ((size_t)3 << 20) + 1);
    }
    /* A request larger than a chunk gets its own, 2 MiB aligned, and later small requests go on
     * filling the open chunk. */
    uint8_t *big = pc_pages_alloc(&p, PC_PAGES_CHUNK + 100);
    ASSERT_TRUE(big != NULL);
    ASSERT_EQ((uintptr_t)big % ((size_t)2 << 20), 0);
    big[PC_PAGES_CHUNK + 99] = 7;
    uint8_t *after = pc_pages_alloc(&p, 64);
    ASSERT_TRUE(after != NULL);
    ASSERT_EQ(after - small[39], (ptrdiff_t)(((size_t)3 << 20) + 64));
    for (int i = 0; i < 40; i++) /* nothing overlapped */
        ASSERT_EQ(small[i][(size_t)3 << 20], i + 1);
    ASSERT_EQ_U64(p.bytes_used, 40 * (((size_t)3 << 20) + 64) + PC_PAGES_CHUNK + 128 + 64);
    ASSERT_TRUE(p.bytes_mapped >= p.bytes_used);
    pc_pages_release(&p);
    ASSERT_EQ_U64(p.bytes_used, 0);
    ASSERT_EQ_U64(p.bytes_mapped, 0);
    ASSERT_TRUE(pc_pages_alloc(&p, 1) != NULL);
    pc_pages_release(&p);
}

PC_TEST(buf_reserve_commit_printf)
{
    pc_buf_t b = PC_BUF_INIT;
    ASSERT_EQ(pc_buf_append_cstr(&b, "abc"), PC_OK);
    char *p = pc_buf_reserve(&b, 1000);
    ASSERT_TRUE(p != NULL);
    memset(p, 'x', 1000);
    pc_buf_commit(&b, 1000);
    ASSERT_EQ(b.len, 1003);
    ASSERT_EQ(pc_buf_printf(&b, "%d-%s", 42, "y"), PC_OK);
    char longfmt[600];
    memset(longfmt, 'z', sizeof longfmt - 1);
    longfmt[sizeof longfmt - 1] = '\0';
    ASSERT_EQ(pc_buf_printf(&b, "%s", longfmt), PC_OK);
    ASSERT_EQ(pc_buf_terminate(&b), PC_OK);
    ASSERT_EQ(b.len, 1003 + 4 + 599);
    ASSERT_TRUE(memcmp(b.base + 1003, "42-y", 4) == 0);
    ASSERT_TRUE(pc_slice_eq_cstr(pc_slice(b.base, 3), "abc"));
    pc_buf_free(&b);
    ASSERT_TRUE(b.base == NULL && b.len == 0);
}

static char last_msg[128];
static int last_level = -1;
static void capture(int level, const char *module, const char *msg, void *ud)
{
    (void)module;
    (void)ud;
    last_level = level;
    snprintf(last_msg, sizeof last_msg, "%s", msg);
}

PC_TEST(log_levels_filter_before_formatting)
{
    pc_log_set_sink(capture, NULL);
    pc_log_set_level(PC_LOG_WARN);
    PC_LOG(PC_LOG_INFO, "t", "hidden %d", 1);
    ASSERT_EQ(last_level, -1);
    PC_LOG(PC_LOG_ERROR, "t", "shown %d", 2);
    ASSERT_EQ(last_level, PC_LOG_ERROR);
    ASSERT_STR_EQ(last_msg, "shown 2");
    ASSERT_EQ(pc_log_level_parse("debug"), PC_LOG_DEBUG);
    ASSERT_EQ(pc_log_level_parse("nope"), -1);
    pc_log_set_sink(NULL, NULL);
    pc_log_set_level(PC_LOG_INFO);
}

PC_TEST_MAIN()
