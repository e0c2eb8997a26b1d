/*
 * cmd_check_config.c — `kvgw check-config [FILE]`: validates a configuration and prints the
 * effective values (secrets shown as <set>). Exit 0 when valid, 1 with the error (file, line,
 * key path) otherwise.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "config.h"

int kvgw_cmd_check_config(int argc, char **argv)
{
    if (argc > 2 || (argc == 2 && argv[1][0] == '-' && strcmp(argv[1], "--help") != 0 &&
                     strcmp(argv[1], "-h") != 0)) {
        fprintf(stderr, "usage: kvgw check-config [FILE]\n");
        return KVGW_EXIT_USAGE;
    }
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: kvgw check-config [FILE]\n\nValidates FILE (default %s) and prints the "
               "effective configuration,\nsecrets shown as <set>. Unknown keys and bad values are "
               "errors naming the file, line\nand key.\n",
               GW_CONFIG_DEFAULT_PATH);
        return KVGW_EXIT_OK;
    }
    const char *path = argc == 2 ? argv[1] : GW_CONFIG_DEFAULT_PATH;
    gw_config_t c;
    char err[512];
    if (gw_config_load(path, &c, err, sizeof err) != 0) {
        fprintf(stderr, "kvgw check-config: %s\n", err);
        return KVGW_EXIT_FAIL;
    }
    /* What kvgw serve would refuse at start (protected mode), for the config's own listen. */
    if (gw_config_check_exposure(&c, c.listen_host, err, sizeof err) != 0) {
        fprintf(stderr, "kvgw check-config: %s: listen: %s\n", path, err);
        gw_config_free(&c);
        return KVGW_EXIT_FAIL;
    }
    pc_buf_t b = {0};
    int rc = gw_config_print(&c, &b);
    if (rc == 0)
        fwrite(b.base, 1, b.len, stdout);
    pc_buf_free(&b);
    gw_config_free(&c);
    if (rc != 0) {
        fprintf(stderr, "kvgw check-config: %s\n", pc_strerror(rc));
        return KVGW_EXIT_FAIL;
    }
    fprintf(stderr, "kvgw check-config: %s is valid\n", path);
    return KVGW_EXIT_OK;
}
