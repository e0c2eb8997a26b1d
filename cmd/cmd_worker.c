/*
 * cmd_worker.c — `kvgw worker`: a remote worker process for cluster mode (DESIGN.md §6). Loads
 * a model and serves the worker API over TCP with the worker protocol (worker_server.h).
 *
 *   kvgw worker --model FILE --listen HOST:PORT [--backend cpu|cuda|auto] [--cuda-device N]
 *               [--threads N] [--kv-tokens N] [--kv-dtype f16|f32|q8_0] [--name NAME]
 *               [--max-queue N] [--secret-file F]
 *               [--kv-tier-dir DIR [--kv-tier-bytes SIZE] [--kv-tier-key-file F]]
 *               [--log-level L]
 *
 * KV tiers (engine/tier.h): with --kv-tier-dir, KV blocks leaving the pool are kept in DIR (a
 * byte budget, --kv-tier-bytes, default 4GiB; encrypted at rest with the key of
 * --kv-tier-key-file, 64 hex digits in a file only its owner may read), read back instead of
 * recomputed, and found again after a restart (the SNAPSHOT lists them). One directory per
 * worker process: two workers must not share one.
 *
 * Backend: cpu, cuda (an error where the build or the machine has none usable, with the CUDA
 * error) or auto (the default: cuda where a device is usable, else cpu). Once the model is
 * loaded, one line on stderr says which backend runs and why, e.g. "kvgw worker: backend cpu
 * (auto: cuda unavailable: this build has no CUDA support)".
 *
 * Link authentication: the shared secret comes from --secret-file F (the file's bytes, one
 * trailing newline removed) or else the environment variable KVGW_LINK_SECRET; gateways must
 * then prove it in the handshake (worker_server.h). Without either, every gateway that can
 * reach the port is served and the worker prints a warning.
 *
 * Once listening it prints one line on stdout, "listening on HOST:PORT" (the port chosen when
 * --listen asked for 0), so scripts and tests can connect. SIGINT or SIGTERM shut it down
 * gracefully (worker_server.h: stop accepting, cancel, drain, close) and it exits with 0; a
 * second signal during the shutdown kills it.
 */
#include "cli.h"
#include "common.h"
#include "config.h"
#include "progress.h"
#include "lnk_addr.h"
#include "worker_server.h"

#include <sodium.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: kvgw worker --model FILE --listen HOST:PORT [--backend cpu|cuda|auto] "
               "[--cuda-device N] [--threads N] [--kv-tokens N] [--kv-dtype f16|f32|q8_0] "
               "[--name NAME] [--max-queue N] [--secret-file F] [--kv-tier-dir DIR "
               "[--kv-tier-bytes SIZE] [--kv-tier-key-file F]] [--log-level L]\n");
}

static void help(void)
{
    usage(stdout);
    printf("\nLoads the model and serves it to gateways over TCP (the worker protocol,\n"
           "engine/wire.h). Prints \"listening on HOST:PORT\" once ready; SIGINT/SIGTERM stop\n"
           "it gracefully.\n\n"
           "  --model FILE     the GGUF model\n"
           "  --listen H:P     address to listen on: IPv4 (0.0.0.0: every address), [IPv6]\n"
           "                   ([::]: every address) or a host name such as localhost,\n"
           "                   resolved once at start to its first IPv4 address (else IPv6);\n"
           "                   port 0 picks a free one\n"
           "  --backend B      cpu, cuda, or auto (default): cuda where a GPU is usable, else\n"
           "                   cpu; the choice and its reason are printed on stderr\n"
           "  --cuda-device N  the GPU of the cuda backend (default 0)\n"
           "  --threads N      compute threads (default 2)\n"
           "  --kv-tokens N    KV cache budget in tokens (default 65536)\n"
           "  --kv-dtype T     KV cache element type: f16 (default), f32, or q8_0 (34/64 of\n"
           "                   f16's bytes; the cpu backend; part of the model fingerprint)\n"
           "  --name NAME      this worker's name in the handshake and logs (default: host name)\n"
           "  --max-queue N    requests waiting for admission before \"overloaded\" (default 256)\n"
           "  --secret-file F  the link secret gateways must prove (16..1024 bytes; a trailing\n"
           "                   newline is removed); default: $KVGW_LINK_SECRET; neither = no\n"
           "                   authentication (a warning is printed)\n"
           "  --kv-tier-dir DIR   keep KV blocks that leave the pool in DIR (created 0700),\n"
           "                   read them back instead of recomputing, and after a restart;\n"
           "                   one directory per worker process. Default: no tiers\n"
           "  --kv-tier-bytes SIZE   the directory's budget, e.g. 20GiB (default 4GiB)\n"
           "  --kv-tier-key-file F   encrypt the records at rest with this key: 64 hex digits\n"
           "                   in a file only its owner may read (openssl rand -hex 32)\n"
           "  --log-level L    debug, info (default), warn, error or off\n");
}

/* Reads the link secret from path (one trailing "\n" or "\r\n" removed) into buf. Returns its
 * length, or -1 with the reason on stderr. */
static long read_secret_file(const char *path, uint8_t *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "kvgw worker: --secret-file: cannot open '%s': %s\n", path,
                strerror(errno));
        return -1;
    }
    size_t n = fread(buf, 1, cap, f);
    bool more = fgetc(f) != EOF, bad = ferror(f) != 0;
    fclose(f);
    if (bad) {
        fprintf(stderr, "kvgw worker: --secret-file: cannot read '%s'\n", path);
        return -1;
    }
    if (n > 0 && buf[n - 1] == '\n')
        n--;
    if (n > 0 && buf[n - 1] == '\r')
        n--;
    if (more || n < LNK_SECRET_MIN) {
        fprintf(stderr, "kvgw worker: --secret-file: the secret in '%s' must have %d..%d bytes\n",
                path, LNK_SECRET_MIN, LNK_SECRET_MAX);
        return -1;
    }
    return (long)n;
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
    const char *model = NULL, *listen = NULL, *name = NULL, *secret_file = NULL;
    const char *backend = "auto", *tier_dir = NULL, *tier_key_file = NULL;
    uint64_t threads = 2, kv_tokens = 65536, max_queue = 256, cuda_device = 0;
    uint64_t tier_bytes = 4ull << 30;
    bool tier_bytes_set = false;
    enum eng_kv_dtype kv_dtype = ENG_KV_F16;
    int level = PC_LOG_INFO;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            help();
            return KVGW_EXIT_OK;
        }
        const char *v = kvgw_cli_value(argc, argv, &i, "kvgw worker", usage);
        if (v == NULL)
            return KVGW_EXIT_USAGE;
        const char *bad = NULL;
        if (strcmp(a, "--model") == 0) {
            model = v;
        } else if (strcmp(a, "--listen") == 0) {
            listen = v;
        } else if (strcmp(a, "--backend") == 0) {
            backend = v;
            if (strcmp(v, "cpu") != 0 && strcmp(v, "cuda") != 0 && strcmp(v, "auto") != 0)
                bad = "is not cpu, cuda or auto";
        } else if (strcmp(a, "--cuda-device") == 0) {
            if (kvgw_cli_parse_u64(v, 1024, &cuda_device) != 0)
                bad = "is not a device number";
        } else if (strcmp(a, "--secret-file") == 0) {
            secret_file = v;
        } else if (strcmp(a, "--name") == 0) {
            name = v;
            if (strlen(v) == 0 || strlen(v) > ENG_WIRE_NAME_MAX)
                bad = "is not a name of 1..256 bytes";
        } else if (strcmp(a, "--threads") == 0) {
            if (kvgw_cli_parse_u64(v, 256, &threads) != 0 || threads == 0)
                bad = "is not in 1..256";
        } else if (strcmp(a, "--kv-tokens") == 0) {
            if (kvgw_cli_parse_u64(v, UINT32_MAX, &kv_tokens) != 0 || kv_tokens == 0)
                bad = "is not a token count";
        } else if (strcmp(a, "--kv-dtype") == 0) {
            if (eng_kv_dtype_parse(v, &kv_dtype) != 0)
                bad = "is not f16, f32 or q8_0";
        } else if (strcmp(a, "--max-queue") == 0) {
            if (kvgw_cli_parse_u64(v, 1u << 20, &max_queue) != 0 || max_queue == 0)
                bad = "is not in 1..1048576";
        } else if (strcmp(a, "--kv-tier-dir") == 0) {
            tier_dir = v;
            if (v[0] == '\0')
                bad = "is not a directory";
        } else if (strcmp(a, "--kv-tier-bytes") == 0) {
            tier_bytes_set = true;
            if (gw_config_parse_size(v, &tier_bytes) != 0 || tier_bytes < (16ull << 20))
                bad = "is not a size of at least 16MiB (e.g. 4GiB)";
        } else if (strcmp(a, "--kv-tier-key-file") == 0) {
            tier_key_file = v;
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
    if (tier_dir == NULL && (tier_bytes_set || tier_key_file != NULL)) {
        fprintf(stderr, "kvgw worker: --kv-tier-bytes and --kv-tier-key-file need --kv-tier-dir\n");
        usage(stderr);
        return KVGW_EXIT_USAGE;
    }
    lnk_addr_t la;
    char why[200];
    if (lnk_addr_parse(listen, LNK_ADDR_PORT_ZERO, &la, why, sizeof why) != 0) {
        fprintf(stderr, "kvgw worker: --listen: %s\n", why);
        usage(stderr);
        return KVGW_EXIT_USAGE;
    }
    pc_log_set_level(level);
    signal(SIGPIPE, SIG_IGN); /* a vanished peer is an error return, not a signal */

    eng_worker_params_t wp = eng_worker_params_default();
    wp.engine.model_path = model;
    wp.engine.backend = backend;
    wp.engine.cuda_device = (int)cuda_device;
    wp.engine.n_threads = (uint32_t)threads;
    wp.engine.kv_max_tokens = kv_tokens;
    wp.engine.kv_dtype = kv_dtype;
    wp.max_queue = (uint32_t)max_queue;
    static uint8_t tier_key[32];
    if (tier_dir != NULL) {
        wp.engine.tier.dir = tier_dir;
        wp.engine.tier.max_bytes = tier_bytes;
        char kerr[400];
        if (tier_key_file != NULL) {
            if (eng_worker_tier_key_read(tier_key_file, tier_key, kerr, sizeof kerr) != 0) {
                fprintf(stderr, "kvgw worker: --kv-tier-key-file: %s\n", kerr);
                return KVGW_EXIT_FAIL;
            }
            wp.engine.tier.key = tier_key;
        }
    }
    lnk_worker_server_params_t sp = lnk_worker_server_params_default();
    sp.listen = listen;
    sp.node = name;
    static uint8_t secret[LNK_SECRET_MAX + 1];
    const char *env_secret = getenv("KVGW_LINK_SECRET");
    if (secret_file != NULL) {
        long n = read_secret_file(secret_file, secret, LNK_SECRET_MAX);
        if (n < 0)
            return KVGW_EXIT_FAIL;
        sp.secret = secret;
        sp.secret_len = (size_t)n;
    } else if (env_secret != NULL && env_secret[0] != '\0') {
        size_t n = strlen(env_secret);
        if (n < LNK_SECRET_MIN || n > LNK_SECRET_MAX) {
            fprintf(stderr, "kvgw worker: KVGW_LINK_SECRET must have %d..%d bytes\n",
                    LNK_SECRET_MIN, LNK_SECRET_MAX);
            return KVGW_EXIT_FAIL;
        }
        memcpy(secret, env_secret, n);
        sp.secret = secret;
        sp.secret_len = n;
    } else {
        fprintf(stderr,
                "kvgw worker: warning: no link secret (--secret-file or "
                "KVGW_LINK_SECRET): any gateway that reaches %s is served, "
                "and the link is not encrypted\n",
                listen);
    }

    uv_loop_t loop;
    if (uv_loop_init(&loop) != 0) {
        fprintf(stderr, "kvgw worker: cannot create the event loop\n");
        return KVGW_EXIT_FAIL;
    }
    worker_main_t m = {0};
    char err[512] = "";
    /* Loading a large model takes a while: a progress line on a terminal (layers loaded). */
    char what[320];
    snprintf(what, sizeof what, "kvgw worker: loading %s", model);
    kvgw_progress_t pr;
    kvgw_progress_begin(&pr, what, "layers");
    wp.engine.load_progress = kvgw_progress_cb_u32;
    wp.engine.load_progress_ud = &pr;
    int init_rc = lnk_worker_server_init(&loop, &sp, &wp, &m.server, err, sizeof err);
    kvgw_progress_end(&pr);
    sodium_memzero(tier_key, sizeof tier_key); /* the engine keeps its own copy */
    if (init_rc != 0) {
        fprintf(stderr, "kvgw worker: %s\n", err);
        uv_run(&loop, UV_RUN_DEFAULT); /* the partly built server closes itself */
        uv_loop_close(&loop);
        return KVGW_EXIT_FAIL;
    }
    /* Which backend runs and why: asked for, or auto's choice with the reason it fell back. */
    eng_worker_info_t in;
    eng_worker_info(lnk_worker_server_worker(m.server), &in);
    if (strcmp(backend, "auto") != 0)
        fprintf(stderr, "kvgw worker: backend %s (asked)\n", in.backend);
    else if (in.backend_note[0] != '\0')
        fprintf(stderr, "kvgw worker: backend %s (auto: %s)\n", in.backend, in.backend_note);
    else
        fprintf(stderr, "kvgw worker: backend %s (auto: CUDA device %d is usable)\n", in.backend,
                (int)cuda_device);
    fprintf(stderr, "kvgw worker: KV %s, %llu bytes per token, %llu tokens\n", in.kv_dtype,
            (unsigned long long)in.kv_bytes_per_token, (unsigned long long)in.kv_capacity_tokens);
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
