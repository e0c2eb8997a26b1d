/*
 * cmd_billing.c — `kvgw billing export|verify` (DESIGN.md §6): the ledger as CSV, JSON lines or
 * FOCUS for finance, and the reconciliation of the ledger against Redis.
 *
 *   kvgw billing export [--ledger DIR]... [--redis HOST:PORT [--password-env VAR] [--prefix P]
 *                       [--scan-streams]] [--from T] [--to T] [--tenant ID] [--format
 * csv|jsonl|focus]
 *                       [--group none|day] [--pricing FILE] [--out FILE] [--no-index] [--stats]
 *   kvgw billing verify [--ledger DIR]... [--redis HOST:PORT [--password-env VAR] [--prefix P]
 *                       [--scan-streams] [--from DAY] [--to DAY]]
 *
 * Times are RFC 3339 UTC ("2025-06-01", "2025-06-01T12:00:00Z") or epoch milliseconds; --from is
 * inclusive, --to exclusive. Exports read the ledgers, and only the segments that the ledger's
 * time index (ledger.h) says can hold events of the range; --no-index reads them all (the output
 * is the same), --stats tells on stderr how many segments were read and skipped. Several
 * --ledger and --redis give the merged view of several gateways (billing.h, Sources): the
 * instances in PREFIX:gws, plus (--scan-streams) any PREFIX:ledger:* stream found by a SCAN.
 */
#include "billing.h"
#include "cli.h"
#include "common.h"
#include "ledger.h"
#include "redisconn.h"
#include "shipper.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: kvgw billing export [--ledger DIR]... [--redis HOST:PORT "
               "[--password-env VAR] [--prefix P] [--scan-streams]]\n"
               "                           [--from TIME] [--to TIME] [--tenant ID]\n"
               "                           [--format csv|jsonl|focus] [--group none|day]\n"
               "                           [--pricing FILE] [--out FILE] [--no-index] [--stats]\n"
               "       kvgw billing verify [--ledger DIR]... [--redis HOST:PORT "
               "[--password-env VAR] [--prefix P] [--scan-streams]]\n"
               "                           [--from DAY] [--to DAY]\n");
}

static void help(void)
{
    usage(stdout);
    printf("\nexport: writes the usage ledger (default var/ledger) as per-event rows, or with\n"
           "--group day one row per tenant x model x UTC day x bucket. Formats: csv, jsonl and\n"
           "focus (FinOps FOCUS 1.0 columns). Amounts are exact decimal USD. TIME is RFC 3339\n"
           "UTC (2025-06-01, 2025-06-01T12:00:00Z) or epoch milliseconds; --from inclusive, --to\n"
           "exclusive, by each event's start. --pricing fills FOCUS list unit prices.\n"
           "Only the ledger segments whose time index can hold events of the range are read\n"
           "(sealed segments have a small .idx sidecar, rebuilt from the data when missing or\n"
           "wrong); --no-index reads every segment, with the same output; --stats prints the\n"
           "segments read and skipped to stderr.\n"
           "Several --ledger (one per gateway instance) and --redis (the usage every other\n"
           "instance shipped there, listed in PREFIX:gws) give the merged view of a cluster:\n"
           "every event once, ordered by end time, instance and seq;\n"
           "the same event in two sources, or two ledgers of one instance, fail the export.\n"
           "Rows carry the event's registry decision (none, shared, local) and its instance.\n"
           "\nverify: without --from/--to, first reads and checks every record of every segment\n"
           "of each ledger (one --ledger per gateway instance), the seq continuity across\n"
           "segments and each time-index sidecar against its segment, printing each problem as\n"
           "DAMAGE, GAP or INDEX with the file, byte and seq (the gateway's start reads only the\n"
           "recent segments, so damage in old ones shows here). With --redis it then reconciles\n"
           "each ledger with what the shipper wrote to Redis: the instance's stream against the\n"
           "ledger up to its cursor, and the shared per-tenant per-day counters against the sum\n"
           "of every ledger. Prints each difference; exit status 1 when there is a problem or a\n"
           "difference. --from/--to (UTC dates, --to exclusive; need --redis) limit it to the\n"
           "counters of those days and to the ledger segments that can hold their events.\n"
           "Instances that shipped to Redis but whose ledger was not given are printed as\n"
           "MISSING (exit status 1). The events are counted by registry decision.\n"
           "\n--scan-streams (export, verify): also look for PREFIX:ledger:* streams with a SCAN\n"
           "of the whole keyspace, for instances shipped by a kvgw older than the shipper's\n"
           "listing in PREFIX:gws (any kvgw now lists its instance at each connect); slow on a\n"
           "Redis that holds many cache entries.\n");
}

static int write_chunk(void *ud, const char *data, size_t len)
{
    return fwrite(data, 1, len, ud) == len ? 0 : -1;
}

/* HOST:PORT into a Redis address; false (with the message printed) when it is not one. */
static bool parse_redis(const char *cmd, const char *v, bill_redis_addr_t *a)
{
    const char *colon = strrchr(v, ':');
    char *end;
    long port = colon != NULL ? strtol(colon + 1, &end, 10) : 0;
    if (colon == NULL || colon == v || *end != '\0' || port <= 0 || port > 65535 ||
        (size_t)(colon - v) >= sizeof a->host) {
        fprintf(stderr, "%s: --redis wants HOST:PORT, not '%s'\n", cmd, v);
        return false;
    }
    memcpy(a->host, v, (size_t)(colon - v));
    a->host[colon - v] = '\0';
    a->port = (int)port;
    return true;
}

static int cmd_export(int argc, char **argv)
{
    bill_export_params_t xp = bill_export_params_default();
    const char *dirs[64], *out = NULL, *pricing = NULL, *prefix = NULL;
    size_t n_dirs = 0;
    bill_redis_params_t rp = bill_redis_params_default(); /* the address from --redis */
    bool stats = false, redis = false, scan_streams = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            help();
            return KVGW_EXIT_OK;
        }
        if (strcmp(a, "--no-index") == 0) {
            xp.scan_all = true;
            continue;
        }
        if (strcmp(a, "--stats") == 0) {
            stats = true;
            continue;
        }
        if (strcmp(a, "--scan-streams") == 0) {
            scan_streams = true;
            continue;
        }
        const char *v = kvgw_cli_value(argc, argv, &i, "kvgw billing export", usage);
        if (v == NULL)
            return KVGW_EXIT_USAGE;
        if (strcmp(a, "--ledger") == 0) {
            if (n_dirs == sizeof dirs / sizeof dirs[0]) {
                fprintf(stderr, "kvgw billing export: too many --ledger\n");
                return KVGW_EXIT_USAGE;
            }
            dirs[n_dirs++] = v;
        } else if (strcmp(a, "--redis") == 0) {
            if (!parse_redis("kvgw billing export", v, &rp.address))
                return KVGW_EXIT_USAGE;
            redis = true;
        } else if (strcmp(a, "--password-env") == 0) {
            if ((rp.password = getenv(v)) == NULL) {
                fprintf(stderr, "kvgw billing export: environment variable %s is not set\n", v);
                return KVGW_EXIT_USAGE;
            }
        } else if (strcmp(a, "--prefix") == 0) {
            prefix = v;
        } else if (strcmp(a, "--out") == 0) {
            out = v;
        } else if (strcmp(a, "--pricing") == 0) {
            pricing = v;
        } else if (strcmp(a, "--tenant") == 0) {
            xp.tenant = v;
        } else if (strcmp(a, "--from") == 0 || strcmp(a, "--to") == 0) {
            uint64_t ms;
            if (bill_parse_time_ms(v, &ms) != 0) {
                fprintf(stderr, "kvgw billing export: bad time '%s' (RFC 3339 UTC or epoch ms)\n",
                        v);
                return KVGW_EXIT_USAGE;
            }
            *(a[2] == 'f' ? &xp.from_ms : &xp.to_ms) = ms;
        } else if (strcmp(a, "--format") == 0) {
            if ((xp.format = bill_export_format_parse(v)) < 0) {
                fprintf(stderr, "kvgw billing export: unknown format '%s' (csv, jsonl, focus)\n",
                        v);
                return KVGW_EXIT_USAGE;
            }
        } else if (strcmp(a, "--group") == 0) {
            if ((xp.group = bill_export_group_parse(v)) < 0) {
                fprintf(stderr, "kvgw billing export: unknown grouping '%s' (none, day)\n", v);
                return KVGW_EXIT_USAGE;
            }
        } else {
            fprintf(stderr, "kvgw billing export: unknown option '%s'\n", a);
            usage(stderr);
            return KVGW_EXIT_USAGE;
        }
    }
    if (xp.from_ms > xp.to_ms) {
        fprintf(stderr, "kvgw billing export: --from is after --to\n");
        return KVGW_EXIT_USAGE;
    }
    if (!redis && (prefix != NULL || rp.password != NULL || scan_streams)) {
        fprintf(stderr,
                "kvgw billing export: --prefix, --password-env and --scan-streams need --redis\n");
        return KVGW_EXIT_USAGE;
    }
    if (n_dirs == 0 && !redis)
        dirs[n_dirs++] = "var/ledger";
    bill_export_sources_t src = {.ledger_dirs = dirs,
                                 .n_ledgers = n_dirs,
                                 .redis = redis ? &rp : NULL,
                                 .redis_prefix = prefix,
                                 .scan_streams = scan_streams};
    char err[512] = "";
    bill_pricing_t *pr = NULL;
    if (pricing != NULL && bill_pricing_load(pricing, &pr, err, sizeof err) != 0) {
        fprintf(stderr, "kvgw billing export: %s\n", err);
        return KVGW_EXIT_FAIL;
    }
    xp.pricing = pr;
    FILE *f = out != NULL ? fopen(out, "wb") : stdout;
    if (f == NULL) {
        fprintf(stderr, "kvgw billing export: cannot write %s: %s\n", out, strerror(errno));
        bill_pricing_free(pr);
        return KVGW_EXIT_FAIL;
    }
    xp.chunk = write_chunk;
    xp.ud = f;
    bill_export_t *x = NULL;
    int rc = bill_export_open_sources(&src, &xp, &x, err, sizeof err);
    if (rc == 0) {
        while ((rc = bill_export_step(x, 4096, err, sizeof err)) == 0)
            ;
        rc = rc == 1 ? 0 : rc;
        uint64_t n_read, n_skipped;
        bill_export_segments(x, &n_read, &n_skipped);
        if (stats) {
            fprintf(stderr,
                    "kvgw billing export: %llu ledger segments read, %llu skipped by the time "
                    "index\n",
                    (unsigned long long)n_read, (unsigned long long)n_skipped);
            for (size_t i = 0; i < bill_export_n_sources(x); i++) {
                bool from_redis;
                const char *inst = bill_export_source(x, i, &from_redis);
                fprintf(stderr, "kvgw billing export: instance %s from its %s\n", inst,
                        from_redis ? "Redis stream" : "ledger");
            }
        }
        bill_export_free(x);
    }
    if (fflush(f) != 0 && rc == 0)
        rc = PC_ERR_IO;
    if (out != NULL && fclose(f) != 0 && rc == 0)
        rc = PC_ERR_IO;
    bill_pricing_free(pr);
    if (rc != 0) {
        fprintf(stderr, "kvgw billing export: %s\n", err[0] ? err : pc_strerror(rc));
        return KVGW_EXIT_FAIL;
    }
    return KVGW_EXIT_OK;
}

static int cmd_verify(int argc, char **argv)
{
    const char *dirs[64];
    size_t n_dirs = 0;
    bill_verify_params_t vp = bill_verify_params_default();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            help();
            return KVGW_EXIT_OK;
        }
        if (strcmp(a, "--scan-streams") == 0) {
            vp.scan_streams = true;
            continue;
        }
        const char *v = kvgw_cli_value(argc, argv, &i, "kvgw billing verify", usage);
        if (v == NULL)
            return KVGW_EXIT_USAGE;
        if (strcmp(a, "--ledger") == 0) {
            if (n_dirs == sizeof dirs / sizeof dirs[0]) {
                fprintf(stderr, "kvgw billing verify: too many --ledger\n");
                return KVGW_EXIT_USAGE;
            }
            dirs[n_dirs++] = v;
        } else if (strcmp(a, "--redis") == 0) {
            bill_redis_addr_t ra;
            if (!parse_redis("kvgw billing verify", v, &ra))
                return KVGW_EXIT_USAGE;
            snprintf(vp.host, sizeof vp.host, "%s", ra.host);
            vp.port = ra.port;
        } else if (strcmp(a, "--password-env") == 0) {
            vp.password = getenv(v);
            if (vp.password == NULL) {
                fprintf(stderr, "kvgw billing verify: environment variable %s is not set\n", v);
                return KVGW_EXIT_USAGE;
            }
        } else if (strcmp(a, "--prefix") == 0) {
            vp.prefix = v;
        } else if (strcmp(a, "--from") == 0 || strcmp(a, "--to") == 0) {
            uint64_t ms;
            if (bill_parse_time_ms(v, &ms) != 0 || ms % 86400000u != 0) {
                fprintf(stderr,
                        "kvgw billing verify: %s wants a UTC date like 2025-06-01 (counters are "
                        "per day), not '%s'\n",
                        a, v);
                return KVGW_EXIT_USAGE;
            }
            *(a[2] == 'f' ? &vp.from_ms : &vp.to_ms) = ms;
        } else {
            fprintf(stderr, "kvgw billing verify: unknown option '%s'\n", a);
            usage(stderr);
            return KVGW_EXIT_USAGE;
        }
    }
    bool whole = vp.from_ms == 0 && vp.to_ms == UINT64_MAX;
    if (vp.port == 0 && !whole) {
        fprintf(stderr, "kvgw billing verify: --from/--to need --redis HOST:PORT\n");
        usage(stderr);
        return KVGW_EXIT_USAGE;
    }
    if (vp.from_ms > vp.to_ms) {
        fprintf(stderr, "kvgw billing verify: --from is after --to\n");
        return KVGW_EXIT_USAGE;
    }
    if (n_dirs == 0)
        dirs[n_dirs++] = "var/ledger";
    char err[512] = "";
    int rc;
    if (whole) {
        /* Every record of every segment first: the gateway's start reads only the recent ones
         * (ledger.h, Recovery on open), so this is where damage in old segments shows. */
        uint64_t problems = 0;
        for (size_t i = 0; i < n_dirs; i++) {
            bill_ledger_check_t ck;
            rc = bill_ledger_check_all(dirs[i], stdout, &ck, err, sizeof err);
            if (rc != 0) {
                fprintf(stderr, "kvgw billing verify: %s\n", err[0] ? err : pc_strerror(rc));
                return KVGW_EXIT_FAIL;
            }
            printf("verify: %s: %llu segments, %llu records, %.1f MiB read, %llu problems", dirs[i],
                   (unsigned long long)ck.n_segments, (unsigned long long)ck.n_records,
                   (double)ck.n_bytes / 1048576.0, (unsigned long long)ck.n_problems);
            if (ck.n_index_rebuilt > 0)
                printf(", %llu time-index sidecars to rebuild",
                       (unsigned long long)ck.n_index_rebuilt);
            if (ck.tail_bytes > 0)
                printf(", %llu bytes of a partial record at the end (written now, or a torn tail "
                       "the next start cuts)",
                       (unsigned long long)ck.tail_bytes);
            printf("\n");
            problems += ck.n_problems;
        }
        if (problems > 0) {
            printf("verify: the ledger is damaged (%llu problems above)%s\n",
                   (unsigned long long)problems, vp.port != 0 ? "; not reconciled with Redis" : "");
            return KVGW_EXIT_FAIL;
        }
        if (vp.port == 0)
            return KVGW_EXIT_OK;
    }
    bill_verify_report_t rep;
    rc = bill_verify(dirs, n_dirs, &vp, stdout, &rep, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "kvgw billing verify: %s\n", err[0] ? err : pc_strerror(rc));
        return KVGW_EXIT_FAIL;
    }
    printf("verify: %llu ledger events, %llu shipped, %llu not yet shipped, %llu differences\n",
           (unsigned long long)rep.n_events, (unsigned long long)rep.n_shipped,
           (unsigned long long)rep.n_pending, (unsigned long long)rep.n_differences);
    printf("verify: registry decisions: %llu none, %llu shared, %llu local\n",
           (unsigned long long)rep.n_registry[BILL_REGISTRY_NONE],
           (unsigned long long)rep.n_registry[BILL_REGISTRY_SHARED],
           (unsigned long long)rep.n_registry[BILL_REGISTRY_LOCAL]);
    if (rep.n_instances_missing > 0)
        printf("verify: %llu instances shipped to Redis without their ledger given (MISSING "
               "above): not reconciled\n",
               (unsigned long long)rep.n_instances_missing);
    if (vp.from_ms != 0 || vp.to_ms != UINT64_MAX)
        printf("verify: day range: %llu ledger segments read, %llu skipped by the time index\n",
               (unsigned long long)rep.n_segments_read, (unsigned long long)rep.n_segments_skipped);
    return rep.n_differences == 0 && rep.n_instances_missing == 0 ? KVGW_EXIT_OK : KVGW_EXIT_FAIL;
}

int kvgw_cmd_billing(int argc, char **argv)
{
    static const kvgw_cmd_t cmds[] = {
        {"export", cmd_export, "the ledger as CSV, JSON lines or FOCUS"},
        {"verify", cmd_verify, "check the ledger, reconcile it with Redis"},
    };
    static const kvgw_cmd_group_t g = {"kvgw billing", "command", cmds, 2, usage, help};
    return kvgw_cli_dispatch(&g, argc, argv);
}
