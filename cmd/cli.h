/*
 * cli.h — the subcommands of the one kvgw binary (DESIGN.md §6).
 *
 * Each subcommand is a main-like function: argv[0] is the subcommand's name. Exit status 0 on
 * success, 2 on bad usage (with a usage line on stderr), 1 on failure with a one-line reason.
 */
#ifndef KVGW_CLI_H
#define KVGW_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KVGW_EXIT_OK 0
#define KVGW_EXIT_FAIL 1
#define KVGW_EXIT_USAGE 2

typedef int (*kvgw_cmd_fn)(int argc, char **argv);

typedef struct kvgw_cmd {
    const char *name;
    kvgw_cmd_fn fn;
    const char *summary;
} kvgw_cmd_t;

/* Prints one "  NAME  SUMMARY" line per command, the names padded to width columns. */
void kvgw_cli_list(FILE *f, const kvgw_cmd_t *cmds, size_t n, int width);

/* A command that has subcommands (kvgw, kvgw bench, kvgw billing). */
typedef struct kvgw_cmd_group {
    const char *prog; /* "kvgw bench": starts the error line */
    const char *noun; /* "benchmark": what a name names, in the error line */
    const kvgw_cmd_t *cmds;
    size_t n_cmds;
    void (*usage)(FILE *f); /* the usage lines */
    void (*help)(void);     /* prints --help's text; NULL: usage(stdout) */
} kvgw_cmd_group_t;

/* Runs the command of g that argv[1] names with argv shifted by one, returning its exit
 * status. No argv[1]: usage(stderr), KVGW_EXIT_USAGE; "--help" or "-h": the help,
 * KVGW_EXIT_OK; an unknown name: "PROG: unknown NOUN 'NAME'" and usage(stderr),
 * KVGW_EXIT_USAGE. */
int kvgw_cli_dispatch(const kvgw_cmd_group_t *g, int argc, char **argv);

/* The value of the option argv[*i]: argv[*i + 1], with *i advanced to it. When argv[*i] is
 * the last argument: NULL, after "PROG: OPTION needs a value" and usage(stderr). The string
 * is argv's. */
const char *kvgw_cli_value(int argc, char **argv, int *i, const char *prog, void (*usage)(FILE *));

/* Parses s as a decimal integer in [0, max]: digits only (no sign, no blanks, no suffix).
 * Returns 0 with *out set, or -1 with *out unchanged. */
int kvgw_cli_parse_u64(const char *s, uint64_t max, uint64_t *out);

int kvgw_cmd_bench(int argc, char **argv);
int kvgw_cmd_tokenize(int argc, char **argv);
int kvgw_cmd_mkmodel(int argc, char **argv);
int kvgw_cmd_eval(int argc, char **argv);
int kvgw_cmd_worker(int argc, char **argv);
int kvgw_cmd_billing(int argc, char **argv);
int kvgw_cmd_serve(int argc, char **argv);
int kvgw_cmd_check_config(int argc, char **argv);

#endif
