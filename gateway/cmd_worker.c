/*
 * cmd_worker.c — `kvgw worker`: a remote worker process for cluster mode (DESIGN.md §6). Loads
 * a model and serves the worker API over TCP with the worker protocol (worker_server.h).
 *
 *   kvgw worker --model FILE --listen HOST:PORT [--threads N] [--kv-tokens N] [--name NAME]
 *               [--max-queue N] [--log-level L]
 *
 * Once listening it prints one line on stdout, "listening on HOST:PORT" (the port chosen when
 * --listen asked for 0), so scripts and tests can connect. SIGINT or SIGTERM shut it down
 * gracefully (worker_server.h: stop accepting, cancel, drain, close) and it exits with 0; a
 * second signal during the shutdown kills it.
 */
#include "cli.h"
#include "common.h"
#include "wire_conn.h"
#include "worker_server.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: kvgw worker --model FILE --listen HOST:PORT [--threads N] "
               "[--kv-tokens N] [--name NAME] [--max-queue N] [--log-level L]\n");
}

static void help(void)
{
    usage(stdout);
    printf("\nLoads the model and serves it to gateways over TCP (the worker protocol,\n"
           "engine/wire.h). Prints \"listening on HOST:PORT\" once ready; SIGINT/SIGTERM stop\n"
           "it gracefully.\n\n"
           "  --model FILE     the GGUF model\n"
           "  --listen H:P     address to listen on (numeric IPv4, [IPv6] or localhost; port 0\n"
           "                   picks a free one)\n"
           "  --threads N      compute threads (default 2)\n"
           "  --kv-tokens N    KV cache budget in tokens (default 65536)\n"
           "  --name NAME      this worker's name in the handshake and logs (default: host name)\n"
           "  --max-queue N    requests waiting for admission before \"overloaded\" (default 256)\n"
           "  --log-level L    debug, info (default), warn, error or off\n");
}

static int parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || s[0] == '-' || v > max)
        return -1;
    *out = v;
    return 0;
}

typedef struct worker_main {
    lnk_worker_server_t *server;
    uv_signal_t sigint, sigterm;
} worker_main_t;

static void on_signal(uv_signal_t *h, int signum)
{
    worker_main_t *m = h->data;
    PC_LOG(PC_LOG_INFO, "worker", "%s: shutting down", signum == SIGINT ? "SIGINT" : "SIGTERM");
    lnk_worker_server_shutdown(m->server, NULL, NULL);
    /* Closing the handles restores the default action: a second signal kills the process. */
    uv_close((uv_handle_t *)&m->sigint, NULL);
    uv_close((uv_handle_t *)&m->sigterm, NULL);
}

int kvgw_cmd_worker(int argc, char **argv)
{
    const char *model = NULL, *listen = NULL, *name = NULL;
    uint64_t threads = 2, kv_tokens = 65536, max_queue = 256;
    int level = PC_LOG_INFO;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            help();
            return KVGW_EXIT_OK;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kvgw worker: %s needs a value\n", a);
            usage(stderr);
            return KVGW_EXIT_USAGE;
        }
        const char *v = argv[++i];
        const char *bad = NULL;
        if (strcmp(a, "--model") == 0) {
            model = v;
        } else if (strcmp(a, "--listen") == 0) {
            listen = v;
        } else if (strcmp(a, "--name") == 0) {
            name = v;
            if (strlen(v) == 0 || strlen(v) > ENG_WIRE_NAME_MAX)
                bad = "is not a name of 1..256 bytes";
        } else if (strcmp(a, "--threads") == 0) {
            if (parse_u64(v, 256, &threads) != 0 || threads == 0)
                bad = "is not in 1..256";
        } else if (strcmp(a, "--kv-tokens") == 0) {
            if (parse_u64(v, UINT32_MAX, &kv_tokens) != 0 || kv_tokens == 0)
                bad = "is not a token count";
        } else if (strcmp(a, "--max-queue") == 0) {
            if (parse_u64(v, 1u << 20, &max_queue) != 0 || max_queue == 0)
                bad = "is not in 1..1048576";
        } else if (strcmp(a, "--log-level") == 0) {
            if ((level = pc_log_level_parse(v)) < 0)
                bad = "is not debug, info, warn, error or off";
        } else {
            fprintf(stderr, "kvgw worker: unknown option '%s'\n", a);
            usage(stderr);
            return KVGW_EXIT_USAGE;
        }
        if (bad != NULL) {
            fprintf(stderr, "kvgw worker: %s: '%s' %s\n", a, v, bad);
            usage(stderr);
            return KVGW_EXIT_USAGE;
        }
    }
    if (model == NULL || listen == NULL) {
        fprintf(stderr, "kvgw worker: --model and --listen are required\n");
        usage(stderr);
        return KVGW_EXIT_USAGE;
    }
    struct sockaddr_storage sa;
    if (lnk_wconn_parse_addr(listen, &sa) != 0) {
        fprintf(stderr, "kvgw worker: --listen: '%s' is not HOST:PORT with a numeric host\n",
                listen);
        usage(stderr);
        return KVGW_EXIT_USAGE;
    }
    pc_log_set_level(level);
    signal(SIGPIPE, SIG_IGN); /* a vanished peer is an error return, not a signal */

    eng_worker_params_t wp = eng_worker_params_default();
    wp.engine.model_path = model;
    wp.engine.n_threads = (uint32_t)threads;
    wp.engine.kv_max_tokens = kv_tokens;
    wp.max_queue = (uint32_t)max_queue;
    lnk_worker_server_params_t sp = lnk_worker_server_params_default();
    sp.listen = listen;
    sp.node = name;

    uv_loop_t loop;
    if (uv_loop_init(&loop) != 0) {
        fprintf(stderr, "kvgw worker: cannot create the event loop\n");
        return KVGW_EXIT_FAIL;
    }
    worker_main_t m = {0};
    char err[512] = "";
    if (lnk_worker_server_init(&loop, &sp, &wp, &m.server, err, sizeof err) != 0) {
        fprintf(stderr, "kvgw worker: %s\n", err);
        uv_run(&loop, UV_RUN_DEFAULT); /* the partly built server closes itself */
        uv_loop_close(&loop);
        return KVGW_EXIT_FAIL;
    }
    uv_signal_init(&loop, &m.sigint);
    uv_signal_init(&loop, &m.sigterm);
    m.sigint.data = m.sigterm.data = &m;
    uv_signal_start(&m.sigint, on_signal, SIGINT);
    uv_signal_start(&m.sigterm, on_signal, SIGTERM);
    printf("listening on %s\n", lnk_worker_server_address(m.server));
    fflush(stdout);

    uv_run(&loop, UV_RUN_DEFAULT);
    lnk_worker_server_free(m.server);
    int rc = uv_loop_close(&loop);
    if (rc != 0) {
        fprintf(stderr, "kvgw worker: event loop still busy at exit: %s\n", uv_strerror(rc));
        return KVGW_EXIT_FAIL;
    }
    return KVGW_EXIT_OK;
}
