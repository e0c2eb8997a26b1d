/*
 * cli.h — the subcommands of the one kvgw binary (DESIGN.md §6).
 *
 * Each subcommand is a main-like function: argv[0] is the subcommand's name. Exit status 0 on
 * success, 2 on bad usage (with a usage line on stderr), 1 on failure with a one-line reason.
 */
#ifndef KVGW_CLI_H
#define KVGW_CLI_H

#define KVGW_EXIT_OK 0
#define KVGW_EXIT_FAIL 1
#define KVGW_EXIT_USAGE 2

typedef int (*kvgw_cmd_fn)(int argc, char **argv);

typedef struct kvgw_cmd {
    const char *name;
    kvgw_cmd_fn fn;
    const char *summary;
} kvgw_cmd_t;

int kvgw_cmd_bench(int argc, char **argv);
int kvgw_cmd_tokenize(int argc, char **argv);
int kvgw_cmd_mkmodel(int argc, char **argv);
int kvgw_cmd_eval(int argc, char **argv);
int kvgw_cmd_worker(int argc, char **argv);
int kvgw_cmd_billing(int argc, char **argv);
int kvgw_cmd_serve(int argc, char **argv);
int kvgw_cmd_check_config(int argc, char **argv);

#endif
