/*
 * cmd_serve.c — `kvgw serve [--config FILE] [--listen HOST:PORT]`: the command line of the
 * gateway. The gateway itself is the gateway library's entry, gw_serve (gateway/serve.h); this
 * file only turns argv into its parameters and draws the model loading's progress line.
 */
#include "cli.h"
#include "config.h"
#include "lnk_addr.h"
#include "progress.h"
#include "serve.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>

static void usage_line(FILE *f)
{
    fprintf(f, "usage: kvgw serve [--config FILE] [--listen HOST:PORT]\n");
}

int kvgw_cmd_serve(int argc, char **argv)
{
    gw_serve_params_t sp = gw_serve_params_default();
    const char *listen = NULL;
    static const struct option opts[] = {{"config", required_argument, NULL, 'c'},
                                         {"listen", required_argument, NULL, 'l'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:l:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            sp.config_path = optarg;
            break;
        case 'l':
            listen = optarg;
            break;
        case 'h':
            usage_line(stdout);
            printf("\nRuns the gateway. Without --config it reads %s when that file exists, else "
                   "the built-in\ndefault (the same settings). SIGINT/SIGTERM stop it gracefully: "
                   "no new requests,\nin-flight ones finish (limits.shutdown_grace), the ledger "
                   "is flushed, exit 0.\nSIGHUP reopens the access log file (for log "
                   "rotation).\n",
                   GW_CONFIG_DEFAULT_PATH);
            return KVGW_EXIT_OK;
        default:
            usage_line(stderr);
            return KVGW_EXIT_USAGE;
        }
    }
    if (optind != argc) {
        usage_line(stderr);
        return KVGW_EXIT_USAGE;
    }
    /* The address syntax of the config's listen: (link/lnk_addr.h); port 0 picks a free one. */
    lnk_addr_t la;
    if (listen != NULL) {
        char why[320];
        if (lnk_addr_parse(listen, LNK_ADDR_PORT_ZERO, &la, why, sizeof why) != 0) {
            fprintf(stderr, "kvgw serve: --listen: %s\n", why);
            return KVGW_EXIT_USAGE;
        }
        sp.listen_host = la.host;
        sp.listen_port = la.port;
    }
    /* A progress line on a terminal while the in-process workers load (nothing otherwise). */
    kvgw_progress_t pr;
    kvgw_progress_begin(&pr, "loading", "layers");
    sp.load_progress = kvgw_progress_cb_load;
    sp.load_progress_ud = &pr;
    /* A client that closed its socket while its response was being written is an error return
     * (EPIPE: the request ends as a 499), never a signal that kills the gateway: a stream whose
     * client left between two tokens used to take the whole process down. */
    signal(SIGPIPE, SIG_IGN);
    return gw_serve(&sp);
}
