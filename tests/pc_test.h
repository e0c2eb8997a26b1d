/*
 * pc_test.h — kvgw's tiny unit-test runner (one header, no dependencies beyond libc).
 *
 *   PC_TEST(name) { ... ASSERT_EQ_U64(a, b); ... }
 *   PC_TEST_MAIN()
 *
 * Tests register themselves at load time and run in file order. A failed assertion prints
 * both sides with file:line and ends the current test; PC_SKIP("why") ends it as skipped.
 * The binary prints one line per test and closes with "N passed, N failed, N skipped".
 * Exit status: 1 if any test failed (or the binary registers more than PC_TEST_MAX tests: a
 * hard error, never a silent cut), else 77 (CTest's SKIP_RETURN_CODE, so CTest reports the
 * binary as skipped and scripts/test.sh counts it) if any test skipped, even beside tests that
 * passed, else 0. A skip therefore always shows: a binary that lost part of its coverage (no
 * GPU, node_modules missing) never reads as passed. Arguments filter tests by substring;
 * PC_TEST_SCALE (environment, default 1) lets a long fuzz loop be scaled up or down with
 * pc_test_scale().
 */
#ifndef PC_TEST_H
#define PC_TEST_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*pc_test_fn)(void);

typedef struct pc_test_case {
    const char *name;
    pc_test_fn fn;
} pc_test_case_t;

#define PC_TEST_MAX 512
static pc_test_case_t pc_test__cases[PC_TEST_MAX];
static int pc_test__n;
static int pc_test__overflow; /* tests that did not fit in pc_test__cases */
static int pc_test__state;    /* 0 running/passed, 1 failed, 2 skipped */
static const char *pc_test__skip_reason;

static inline void pc_test__register(const char *name, pc_test_fn fn)
{
    if (pc_test__n < PC_TEST_MAX)
        pc_test__cases[pc_test__n++] = (pc_test_case_t){name, fn};
    else
        pc_test__overflow++;
}

#define PC_TEST(name)                                                                              \
    static void pc_test_##name(void);                                                              \
    __attribute__((constructor)) static void pc_test_reg_##name(void)                              \
    {                                                                                              \
        pc_test__register(#name, pc_test_##name);                                                  \
    }                                                                                              \
    static void pc_test_##name(void)

static inline double pc_test_scale(void)
{
    const char *s = getenv("PC_TEST_SCALE");
    double v = s != NULL ? atof(s) : 1.0;
    return v > 0 ? v : 1.0;
}

#define PC_TEST__FAIL(...)                                                                         \
    do {                                                                                           \
        fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__);                                          \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        pc_test__state = 1;                                                                        \
        return;                                                                                    \
    } while (0)

#define ASSERT_TRUE(x)                                                                             \
    do {                                                                                           \
        if (!(x))                                                                                  \
            PC_TEST__FAIL("expected true: %s", #x);                                                \
    } while (0)

#define ASSERT_FALSE(x)                                                                            \
    do {                                                                                           \
        if (x)                                                                                     \
            PC_TEST__FAIL("expected false: %s", #x);                                               \
    } while (0)

#define ASSERT_EQ_I64(a, b)                                                                        \
    do {                                                                                           \
        int64_t pc_a_ = (int64_t)(a), pc_b_ = (int64_t)(b);                                        \
        if (pc_a_ != pc_b_)                                                                        \
            PC_TEST__FAIL("%s == %s: %" PRId64 " != %" PRId64, #a, #b, pc_a_, pc_b_);              \
    } while (0)

#define ASSERT_EQ_U64(a, b)                                                                        \
    do {                                                                                           \
        uint64_t pc_a_ = (uint64_t)(a), pc_b_ = (uint64_t)(b);                                     \
        if (pc_a_ != pc_b_)                                                                        \
            PC_TEST__FAIL("%s == %s: %" PRIu64 " != %" PRIu64, #a, #b, pc_a_, pc_b_);              \
    } while (0)

#define ASSERT_EQ(a, b) ASSERT_EQ_I64(a, b)

#define ASSERT_NE(a, b)                                                                            \
    do {                                                                                           \
        int64_t pc_a_ = (int64_t)(a), pc_b_ = (int64_t)(b);                                        \
        if (pc_a_ == pc_b_)                                                                        \
            PC_TEST__FAIL("%s != %s: both %" PRId64, #a, #b, pc_a_);                               \
    } while (0)

#define ASSERT_LE(a, b)                                                                            \
    do {                                                                                           \
        double pc_a_ = (double)(a), pc_b_ = (double)(b);                                           \
        if (!(pc_a_ <= pc_b_))                                                                     \
            PC_TEST__FAIL("%s <= %s: %g > %g", #a, #b, pc_a_, pc_b_);                              \
    } while (0)

#define ASSERT_NEAR(a, b, tol)                                                                     \
    do {                                                                                           \
        double pc_a_ = (double)(a), pc_b_ = (double)(b), pc_t_ = (double)(tol);                    \
        if (!(pc_a_ - pc_b_ <= pc_t_ && pc_b_ - pc_a_ <= pc_t_))                                   \
            PC_TEST__FAIL("%s ~= %s: %.9g vs %.9g (tol %g)", #a, #b, pc_a_, pc_b_, pc_t_);         \
    } while (0)

#define ASSERT_STR_EQ(a, b)                                                                        \
    do {                                                                                           \
        const char *pc_a_ = (a), *pc_b_ = (b);                                                     \
        if (pc_a_ == NULL || pc_b_ == NULL || strcmp(pc_a_, pc_b_) != 0)                           \
            PC_TEST__FAIL("%s == %s: \"%s\" != \"%s\"", #a, #b, pc_a_ ? pc_a_ : "(null)",          \
                          pc_b_ ? pc_b_ : "(null)");                                               \
    } while (0)

#define ASSERT_MEM_EQ(a, b, n)                                                                     \
    do {                                                                                           \
        size_t pc_n_ = (size_t)(n);                                                                \
        const unsigned char *pc_a_ = (const unsigned char *)(a),                                   \
                            *pc_b_ = (const unsigned char *)(b);                                   \
        for (size_t pc_i_ = 0; pc_i_ < pc_n_; pc_i_++)                                             \
            if (pc_a_[pc_i_] != pc_b_[pc_i_])                                                      \
                PC_TEST__FAIL("%s == %s: first difference at byte %zu (0x%02x vs 0x%02x)", #a, #b, \
                              pc_i_, pc_a_[pc_i_], pc_b_[pc_i_]);                                  \
    } while (0)

/* Ends the current test as skipped (never as passed). */
#define PC_SKIP(reason)                                                                            \
    do {                                                                                           \
        pc_test__state = 2;                                                                        \
        pc_test__skip_reason = (reason);                                                           \
        return;                                                                                    \
    } while (0)

/* Runs a helper that may fail; returns from the caller when it did. */
#define PC_TEST_CALL(expr)                                                                         \
    do {                                                                                           \
        expr;                                                                                      \
        if (pc_test__state != 0)                                                                   \
            return;                                                                                \
    } while (0)

static inline int pc_test__main(int argc, char **argv)
{
    int passed = 0, failed = 0, skipped = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (pc_test__overflow > 0) {
        fprintf(stderr, "%d tests registered, PC_TEST_MAX is %d: raise it in pc_test.h\n",
                pc_test__n + pc_test__overflow, PC_TEST_MAX);
        printf("FAIL (too many tests)\n");
        return 1;
    }
    for (int i = 0; i < pc_test__n; i++) {
        const pc_test_case_t *tc = &pc_test__cases[i];
        int selected = argc <= 1;
        for (int a = 1; a < argc; a++)
            if (strstr(tc->name, argv[a]) != NULL)
                selected = 1;
        if (!selected)
            continue;
        pc_test__state = 0;
        pc_test__skip_reason = NULL;
        tc->fn();
        fflush(stderr);
        if (pc_test__state == 1) {
            failed++;
            printf("FAIL %s\n", tc->name);
        } else if (pc_test__state == 2) {
            skipped++;
            printf("SKIP %s (%s)\n", tc->name, pc_test__skip_reason);
        } else {
            passed++;
            printf("ok   %s\n", tc->name);
        }
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    if (failed > 0)
        return 1;
    if (skipped > 0)
        return 77;
    return 0;
}

#define PC_TEST_MAIN()                                                                             \
    int main(int argc, char **argv)                                                                \
    {                                                                                              \
        return pc_test__main(argc, argv);                                                          \
    }

#endif
