/*
 * cli.c — see cli.h: the command-line pieces every subcommand shares.
 */
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void kvgw_cli_list(FILE *f, const kvgw_cmd_t *cmds, size_t n, int width)
{
    for (size_t i = 0; i < n; i++)
        fprintf(f, "  %-*s %s\n", width, cmds[i].name, cmds[i].summary);
}

int kvgw_cli_dispatch(const kvgw_cmd_group_t *g, int argc, char **argv)
{
    if (argc < 2) {
        g->usage(stderr);
        return KVGW_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        if (g->help != NULL)
            g->help();
        else
            g->usage(stdout);
        return KVGW_EXIT_OK;
    }
    for (size_t i = 0; i < g->n_cmds; i++)
        if (strcmp(argv[1], g->cmds[i].name) == 0)
            return g->cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "%s: unknown %s '%s'\n", g->prog, g->noun, argv[1]);
    g->usage(stderr);
    return KVGW_EXIT_USAGE;
}

const char *kvgw_cli_value(int argc, char **argv, int *i, const char *prog, void (*usage)(FILE *))
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "%s: %s needs a value\n", prog, argv[*i]);
        usage(stderr);
        return NULL;
    }
    return argv[++*i];
}

int kvgw_cli_parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    if (s[0] < '0' || s[0] > '9')
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > max)
        return -1;
    *out = v;
    return 0;
}
