/*
 * test_pc_test.c — the test runner's exit status (tests/pc_test.h): a binary where any case
 * skipped reports SKIPPED to CTest (77), not passed; a binary over PC_TEST_MAX tests fails.
 * The binaries under test are pc_test_child.c, built twice (PC_TEST_CHILD_ONE_SKIP,
 * PC_TEST_CHILD_MANY_BIN); each runs as a child process so that its exit status is seen whole.
 */
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include "pc_test.h"

extern char **environ;

/* Runs path with one optional argument, its output to /dev/null; returns its exit status, or
 * -1. */
static int run_child(const char *path, const char *arg)
{
    char *argv[3] = {(char *)path, (char *)arg, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int rc = posix_spawn(&pid, path, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return -1;
    int st = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
        return -1;
    return WEXITSTATUS(st);
}

PC_TEST(one_skip_reports_skipped)
{
    /* One case passes, one skips: CTest must see the skip (77), not a pass. */
    ASSERT_EQ(run_child(PC_TEST_CHILD_ONE_SKIP, NULL), 77);
}

PC_TEST(no_skip_selected_passes)
{
    /* Only the passing case selected: 0. */
    ASSERT_EQ(run_child(PC_TEST_CHILD_ONE_SKIP, "passes"), 0);
}

PC_TEST(only_skips_reports_skipped)
{
    ASSERT_EQ(run_child(PC_TEST_CHILD_ONE_SKIP, "skips"), 77);
}

PC_TEST(too_many_tests_fail)
{
    /* 514 registered tests, PC_TEST_MAX 512: a hard error, never a silent cut. */
    ASSERT_EQ(run_child(PC_TEST_CHILD_MANY_BIN, NULL), 1);
}

PC_TEST_MAIN()
