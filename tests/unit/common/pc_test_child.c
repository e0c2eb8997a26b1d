/*
 * pc_test_child.c — a test binary that test_pc_test.c runs to check pc_test.h's exit status.
 * Built twice: as is (one test passes, one skips: the binary must exit 77, CTest's skip code)
 * and with PC_TEST_CHILD_MANY (more tests than PC_TEST_MAX: the binary must fail with 1, not
 * run the first PC_TEST_MAX and report success).
 */
#include "pc_test.h"

PC_TEST(passes)
{
    ASSERT_EQ(1 + 1, 2);
}

PC_TEST(skips)
{
    PC_SKIP("a case that cannot run here");
}

#ifdef PC_TEST_CHILD_MANY
/* 8 x 8 x 8 = 512 more tests: 514 in all. */
#define CHILD_T1(a, b, c)                                                                          \
    PC_TEST(many_##a##b##c) {}
#define CHILD_T8(a, b)                                                                             \
    CHILD_T1(a, b, 0)                                                                              \
    CHILD_T1(a, b, 1)                                                                              \
    CHILD_T1(a, b, 2)                                                                              \
    CHILD_T1(a, b, 3)                                                                              \
    CHILD_T1(a, b, 4)                                                                              \
    CHILD_T1(a, b, 5)                                                                              \
    CHILD_T1(a, b, 6)                                                                              \
    CHILD_T1(a, b, 7)
#define CHILD_T64(a)                                                                               \
    CHILD_T8(a, 0)                                                                                 \
    CHILD_T8(a, 1)                                                                                 \
    CHILD_T8(a, 2)                                                                                 \
    CHILD_T8(a, 3)                                                                                 \
    CHILD_T8(a, 4)                                                                                 \
    CHILD_T8(a, 5)                                                                                 \
    CHILD_T8(a, 6)                                                                                 \
    CHILD_T8(a, 7)
CHILD_T64(0)
CHILD_T64(1)
CHILD_T64(2)
CHILD_T64(3)
CHILD_T64(4)
CHILD_T64(5)
CHILD_T64(6)
CHILD_T64(7)
#endif

PC_TEST_MAIN()
