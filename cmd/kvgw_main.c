/*
 * kvgw_main.c — the kvgw binary: git-style dispatch to subcommands (DESIGN.md §6).
 */
#include "bench.h"
#include "cli.h"

#include <stdio.h>
#include <string.h>

static const kvgw_cmd_t bench_cmds[] = {
    {"radix", bench_radix_main, "token radix tree: inserts, lookups, memory, expiry"},
    {"cindex", bench_cindex_main, "gateway cache index: match, refresh, probes, expiry, memory"},
    {"tokenizer", bench_tokenizer_main, "tokenizer encode throughput on an English/code corpus"},
    {"engine", bench_engine_main, "engine core: prefill, decode, TTFT cold vs cached prefix"},
    {"sampler", bench_sampler_main, "CPU sampler: us per sampled token at 128k/152k vocabularies"},
    {"kernels", bench_kernels_main, "CUDA kernels, cuBLAS GEMMs, engine on the cuda backend"},
    {"worker", bench_worker_main, "worker: concurrent requests, TTFT beside a cold prefill"},
    {"ledger", bench_ledger_main, "usage ledger: durable events/s (fsync=batch), added latency"},
    {"gateway", bench_gateway_main, "gateway over HTTP: cached vs cold TTFT, overhead, wrk"},
    {"link", bench_link_main, "worker link: cost of sealing (encrypt + MAC) per frame"},
    {"tiers", bench_tiers_main, "KV tiers: TTFT from pool, disk, restart, hole; pressure"},
    {"cluster", bench_cluster_main, "3 gateways sharing a cache over Redis: added latency, feed"},
};
#define N_BENCH_CMDS (sizeof bench_cmds / sizeof bench_cmds[0])

static void bench_usage(FILE *f)
{
    fprintf(f, "usage: kvgw bench NAME [options]\n\nbenchmarks:\n");
    kvgw_cli_list(f, bench_cmds, N_BENCH_CMDS, 12);
    fprintf(f, "\nEach prints a table, then one JSON object on its last line.\n");
}

int kvgw_cmd_bench(int argc, char **argv)
{
    static const kvgw_cmd_group_t g = {"kvgw bench", "benchmark", bench_cmds,
                                       N_BENCH_CMDS, bench_usage, NULL};
    return kvgw_cli_dispatch(&g, argc, argv);
}

static const kvgw_cmd_t commands[] = {
    {"serve", kvgw_cmd_serve, "run the gateway (HTTP API; embedded default: conf/kvgw.yaml)"},
    {"check-config", kvgw_cmd_check_config, "validate a config file, print the effective values"},
    {"bench", kvgw_cmd_bench,
     "run a benchmark (radix, tokenizer, engine, worker, kernels, gateway, ...)"},
    {"tokenize", kvgw_cmd_tokenize, "text on stdin -> token ids (JSON); --decode the reverse"},
    {"mkmodel", kvgw_cmd_mkmodel, "write a test model (GGUF) with deterministic random weights"},
    {"eval", kvgw_cmd_eval, "forward pass over token ids; writes every position's logits"},
    {"worker", kvgw_cmd_worker, "serve a model to gateways over TCP (cluster mode)"},
    {"billing", kvgw_cmd_billing, "usage ledger exports (csv, jsonl, focus) and Redis verify"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: kvgw COMMAND [options]\n\ncommands:\n");
    kvgw_cli_list(f, commands, N_COMMANDS, 14);
    fprintf(f, "\n'kvgw COMMAND --help' describes a command.\n");
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return KVGW_EXIT_OK;
    }
    if (argc >= 2 && strcmp(argv[1], "--version") == 0) {
        printf("kvgw %s\n", KVGW_VERSION);
        return KVGW_EXIT_OK;
    }
    static const kvgw_cmd_group_t g = {"kvgw", "command", commands, N_COMMANDS, usage, NULL};
    return kvgw_cli_dispatch(&g, argc, argv);
}
