/*
 * test_cli.c — the command-line pieces the subcommands share (cmd/cli.c): the decimal parser's
 * edges, an option's value, and a command group's dispatch (help, usage, unknown names).
 */
#include "cli.h"

#include "pc_test.h"

PC_TEST(parse_u64_digits_only)
{
    uint64_t v = 99;
    ASSERT_EQ(kvgw_cli_parse_u64("0", 10, &v), 0);
    ASSERT_EQ_U64(v, 0);
    ASSERT_EQ(kvgw_cli_parse_u64("256", 256, &v), 0);
    ASSERT_EQ_U64(v, 256);
    ASSERT_EQ(kvgw_cli_parse_u64("18446744073709551615", UINT64_MAX, &v), 0);
    ASSERT_EQ_U64(v, UINT64_MAX);
    v = 7;
    const char *bad[] = {"",   "257", "-1",   "+5",  " 5",
                         "5 ", "5x",  "0x10", "1e3", "18446744073709551616"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ASSERT_EQ(kvgw_cli_parse_u64(bad[i], i == 9 ? UINT64_MAX : 256, &v), -1);
        ASSERT_EQ_U64(v, 7); /* unchanged on failure */
    }
}

static int n_usage_err, n_usage_out, n_help;
static void usage(FILE *f)
{
    if (f == stderr)
        n_usage_err++;
    else
        n_usage_out++;
}
static void help(void)
{
    n_help++;
}
static void reset(void)
{
    n_usage_err = n_usage_out = n_help = 0;
}

PC_TEST(option_value)
{
    char *argv[] = {"x", "--model", "m.gguf", "--threads"};
    int i = 1;
    reset();
    const char *v = kvgw_cli_value(4, argv, &i, "kvgw test", usage);
    ASSERT_STR_EQ(v, "m.gguf");
    ASSERT_EQ(i, 2);
    i = 3;
    ASSERT_TRUE(kvgw_cli_value(4, argv, &i, "kvgw test", usage) == NULL);
    ASSERT_EQ(i, 3);
    ASSERT_EQ(n_usage_err, 1);
}

static int seen_argc;
static char *seen_arg0;
static int cmd_a(int argc, char **argv)
{
    seen_argc = argc;
    seen_arg0 = argv[0];
    return 42;
}
static int cmd_b(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return 7;
}

PC_TEST(dispatch)
{
    static const kvgw_cmd_t cmds[] = {{"alpha", cmd_a, "the first"}, {"beta", cmd_b, "the second"}};
    kvgw_cmd_group_t g = {"kvgw test", "command", cmds, 2, usage, NULL};
    char *run_a[] = {"test", "alpha", "--flag"};
    ASSERT_EQ(kvgw_cli_dispatch(&g, 3, run_a), 42);
    ASSERT_EQ(seen_argc, 2);
    ASSERT_STR_EQ(seen_arg0, "alpha");
    char *run_b[] = {"test", "beta"};
    ASSERT_EQ(kvgw_cli_dispatch(&g, 2, run_b), 7);

    reset();
    ASSERT_EQ(kvgw_cli_dispatch(&g, 1, run_a), KVGW_EXIT_USAGE);
    ASSERT_EQ(n_usage_err, 1);
    char *unknown[] = {"test", "gamma"};
    ASSERT_EQ(kvgw_cli_dispatch(&g, 2, unknown), KVGW_EXIT_USAGE);
    ASSERT_EQ(n_usage_err, 2);
    char *h[] = {"test", "-h"}, *lh[] = {"test", "--help"};
    ASSERT_EQ(kvgw_cli_dispatch(&g, 2, h), KVGW_EXIT_OK);
    ASSERT_EQ(kvgw_cli_dispatch(&g, 2, lh), KVGW_EXIT_OK);
    ASSERT_EQ(n_usage_out, 2);
    ASSERT_EQ(n_help, 0);

    /* With a help function, --help calls it instead of usage(stdout). */
    g.help = help;
    reset();
    ASSERT_EQ(kvgw_cli_dispatch(&g, 2, lh), KVGW_EXIT_OK);
    ASSERT_EQ(n_help, 1);
    ASSERT_EQ(n_usage_out, 0);
}

PC_TEST(list)
{
    static const kvgw_cmd_t cmds[] = {{"ab", cmd_a, "first"}, {"c", cmd_b, "second"}};
    FILE *f = tmpfile();
    ASSERT_TRUE(f != NULL);
    kvgw_cli_list(f, cmds, 2, 4);
    char buf[128] = {0};
    rewind(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    ASSERT_EQ(n, strlen("  ab   first\n  c    second\n"));
    ASSERT_STR_EQ(buf, "  ab   first\n  c    second\n");
}

PC_TEST_MAIN()
