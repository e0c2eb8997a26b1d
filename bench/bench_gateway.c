/*
 * bench_gateway.c — `kvgw bench gateway`: the gateway end to end over HTTP on loopback.
 *
 * Starts `kvgw serve` (this binary) on a temporary config with in-process CPU workers and
 * measures, with a plain blocking HTTP client:
 *   - the headline: time to first token through HTTP of a streamed /v1/messages request whose
 *     ~8,000-token system prompt is cached, against the same request cold (a fresh cache_salt
 *     each time), and the time the gateway adds: HTTP TTFT minus the worker's own time to its
 *     first token. The requests ask for max_tokens 1, so the worker's first token is its last:
 *     its own time is queue + prefill + the first token's sampling (the DONE timings' sum, read
 *     back from the access log by request id);
 *   - the gateway's overhead on /v1/messages with max_tokens 1 on the demo model: total HTTP
 *     latency minus the worker's own time (queue + prefill + decode);
 *   - with wrk (Debian package wrk), count_tokens requests per second and p50/p99 latency on
 *     1 KB prompts (tokenize + JSON through the whole HTTP path).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "common.h"

extern char **environ;

typedef struct gw_proc {
    pid_t pid;
    int port;
    char dir[128];
    char access_log[192];
} gw_proc_t;

static int start_gateway(gw_proc_t *g, const char *model_name, const char *model_path,
                         unsigned workers, unsigned threads)
{
    snprintf(g->dir, sizeof g->dir, "/tmp/kvgw-bench-gw.%d", (int)getpid());
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", g->dir, g->dir);
    if (system(cmd) != 0)
        return -1;
    snprintf(g->access_log, sizeof g->access_log, "%s/access.log", g->dir);
    char cfg_path[192];
    snprintf(cfg_path, sizeof cfg_path, "%s/kvgw.yaml", g->dir);
    FILE *f = fopen(cfg_path, "w");
    if (f == NULL)
        return -1;
    fprintf(f,
            "listen: 127.0.0.1:0\nmodels:\n  - name: %s\n    path: %s\n    min_cache_tokens: 64\n"
            "    workers: %u\n    threads: %u\napi_keys:\n  - {key: sk-bench, id: bench, tenant: "
            "bench}\ncache:\n  namespace_secret: bench-namespace-secret-0123456789\nbilling:\n"
            "  ledger_dir: %s/ledger\n  pricing: conf/pricing.yaml\nlog:\n  access_log: %s\n"
            "  level: warn\n",
            model_name, model_path, workers, threads, g->dir, g->access_log);
    fclose(f);
    char out_path[192];
    snprintf(out_path, sizeof out_path, "%s/stdout", g->dir);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    char self[512];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0)
        return -1;
    self[k] = '\0';
    char *argv[] = {self, "serve", "--config", cfg_path, NULL};
    int rc = posix_spawn(&g->pid, self, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return -1;
    /* The gateway prints "listening on http://127.0.0.1:PORT" once it serves (models loaded). */
    g->port = 0;
    for (int i = 0; i < 1200 && g->port == 0; i++) {
        usleep(50000);
        FILE *o = fopen(out_path, "r");
        char line[1024];
        while (o != NULL && fgets(line, sizeof line, o) != NULL) {
            const char *p = strstr(line, "listening on http://127.0.0.1:");
            if (p != NULL)
                g->port = atoi(p + strlen("listening on http://127.0.0.1:"));
        }
        if (o != NULL)
            fclose(o);
        int st;
        if (waitpid(g->pid, &st, WNOHANG) == g->pid) {
            g->pid = 0;
            return -1;
        }
    }
    return g->port > 0 ? 0 : -1;
}

static void stop_gateway(gw_proc_t *g)
{
    if (g->pid > 0) {
        kill(g->pid, SIGTERM);
        int st;
        waitpid(g->pid, &st, 0);
    }
    char cmd[192];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench gateway: could not remove %s\n", g->dir);
}

/* One request on a fresh connection. Fills the time of the first byte of a text delta
 * (streaming) and of the end, and the request-id header. Returns the status or -1. */
static int http_post(int port, const char *path, const char *body, bool stream, double *t_first,
                     double *t_end, char *rid, size_t rid_cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    pc_buf_t req = {0};
    pc_buf_printf(&req,
                  "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: sk-bench\r\n"
                  "anthropic-version: 2023-06-01\r\ncontent-type: application/json\r\n"
                  "content-length: %zu\r\nconnection: close\r\n\r\n",
                  path, strlen(body));
    pc_buf_append_cstr(&req, body);
    double t0 = bench_now_s();
    size_t off = 0;
    while (off < req.len) {
        ssize_t w = write(fd, req.base + off, req.len - off);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    pc_buf_free(&req);
    pc_buf_t resp = {0};
    char buf[65536];
    *t_first = -1;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0)
            break;
        pc_buf_append(&resp, buf, (size_t)n);
        if (stream && *t_first < 0) {
            pc_buf_terminate(&resp);
            if (strstr(resp.base, "content_block_delta") != NULL ||
                strstr(resp.base, "message_delta") != NULL)
                *t_first = bench_now_s() - t0;
        }
    }
    *t_end = bench_now_s() - t0;
    close(fd);
    int status = -1;
    if (resp.len > 12 && pc_buf_terminate(&resp) == 0) {
        status = atoi(resp.base + 9);
        const char *h = strcasestr(resp.base, "\r\nrequest-id: ");
        if (h != NULL && rid != NULL) {
            h += 14;
            size_t i = 0;
            while (h[i] != '\r' && i + 1 < rid_cap) {
                rid[i] = h[i];
                i++;
            }
            rid[i] = '\0';
        }
    }
    if (!stream)
        *t_first = *t_end;
    pc_buf_free(&resp);
    return status;
}

/* The worker's own times of a request (from the access log), in seconds. */
static int worker_times_once(const char *log, const char *rid, double *ttft, double *total)
{
    FILE *f = fopen(log, "r");
    if (f == NULL)
        return -1;
    char line[4096];
    int rc = -1;
    while (fgets(line, sizeof line, f) != NULL) {
        if (strstr(line, rid) == NULL)
            continue;
        const char *a = strstr(line, "\"worker_ttft_us\":");
        const char *b = strstr(line, "\"worker_total_us\":");
        if (a && b) {
            *ttft = atof(a + 17) / 1e6;
            *total = atof(b + 18) / 1e6;
            rc = 0;
        }
    }
    fclose(f);
    return rc;
}

/* The gateway flushes its access log every quarter second: waits up to 2 s for the line. */
static int worker_times(const char *log, const char *rid, double *ttft, double *total)
{
    for (int i = 0; i < 200; i++) {
        if (worker_times_once(log, rid, ttft, total) == 0)
            return 0;
        usleep(10000);
    }
    return -1;
}

/* A system prompt of about n_tokens tokens (about 1.3 tokens per word of this text). */
static char *long_prompt(size_t n_tokens)
{
    pc_buf_t b = {0};
    size_t i = 0;
    while (b.len < n_tokens * 4) {
        pc_buf_printf(&b,
                      "Section %zu: the service keeps a ledger of every request and bills "
                      "cached tokens at a tenth of the input price. ",
                      i++);
    }
    pc_buf_terminate(&b);
    return b.base;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kvgw bench gateway [--model FILE] [--requests N] [--prompt-tokens N] "
               "[--threads N]\n");
}

int bench_gateway_main(int argc, char **argv)
{
    const char *model = "models/kvgw-bench.gguf";
    int n_req = 8, prompt_tokens = 8000, threads = 2;
    static const struct option opts[] = {{"model", required_argument, NULL, 'm'},
                                         {"requests", required_argument, NULL, 'n'},
                                         {"prompt-tokens", required_argument, NULL, 'p'},
                                         {"threads", required_argument, NULL, 't'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:n:p:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 'n':
            n_req = atoi(optarg);
            break;
        case 'p':
            prompt_tokens = atoi(optarg);
            break;
        case 't':
            threads = atoi(optarg);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (n_req < 2 || prompt_tokens < 64 || threads < 1) {
        usage(stderr);
        return 2;
    }
    bench_report_t rep;
    bench_report_init(&rep, "gateway");

    /* ---- the headline on the benchmark model ---- */
    gw_proc_t g = {0};
    if (start_gateway(&g, "kvgw-bench", model, 1, (unsigned)threads) != 0) {
        fprintf(stderr, "kvgw bench gateway: could not start the gateway on %s\n", model);
        stop_gateway(&g);
        return 1;
    }
    char *sys = long_prompt((size_t)prompt_tokens);
    size_t cap = strlen(sys) + 1024;
    char *body = pc_xmalloc(cap);
    double *cold = pc_xcalloc((size_t)n_req, sizeof *cold),
           *warm = pc_xcalloc((size_t)n_req, sizeof *warm),
           *add_cold = pc_xcalloc((size_t)n_req, sizeof *add_cold),
           *add_warm = pc_xcalloc((size_t)n_req, sizeof *add_warm);
    char rid[96];
    double t1, t2, wt, wtot;
    int ok = 1;
    /* Write the entry once. */
    snprintf(body, cap,
             "{\"model\":\"kvgw-bench\",\"max_tokens\":1,\"stream\":true,\"system\":[{\"type\":"
             "\"text\",\"text\":\"%s\",\"cache_control\":{\"type\":\"ephemeral\"}}],\"messages\":"
             "[{\"role\":\"user\",\"content\":\"warm up\"}]}",
             sys);
    ok &= http_post(g.port, "/v1/messages", body, true, &t1, &t2, rid, sizeof rid) == 200;
    for (int i = 0; i < n_req && ok; i++) {
        /* cold: a fresh salt, so nothing is cached */
        snprintf(body, cap,
                 "{\"model\":\"kvgw-bench\",\"max_tokens\":1,\"stream\":true,\"cache_salt\":"
                 "\"cold-%d\",\"system\":[{\"type\":\"text\",\"text\":\"%s\",\"cache_control\":"
                 "{\"type\":\"ephemeral\"}}],\"messages\":[{\"role\":\"user\",\"content\":"
                 "\"question %d\"}]}",
                 i, sys, i);
        ok &= http_post(g.port, "/v1/messages", body, true, &cold[i], &t2, rid, sizeof rid) == 200;
        add_cold[i] = worker_times(g.access_log, rid, &wt, &wtot) == 0 ? cold[i] - wtot : -1;
        snprintf(body, cap,
                 "{\"model\":\"kvgw-bench\",\"max_tokens\":1,\"stream\":true,\"system\":[{\"type\":"
                 "\"text\",\"text\":\"%s\",\"cache_control\":{\"type\":\"ephemeral\"}}],"
                 "\"messages\":[{\"role\":\"user\",\"content\":\"question %d\"}]}",
                 sys, i);
        ok &= http_post(g.port, "/v1/messages", body, true, &warm[i], &t2, rid, sizeof rid) == 200;
        add_warm[i] = worker_times(g.access_log, rid, &wt, &wtot) == 0 ? warm[i] - wtot : -1;
    }
    stop_gateway(&g);
    if (!ok) {
        fprintf(stderr, "kvgw bench gateway: a request failed\n");
        return 1;
    }
    bench_report_add(&rep, "ttft_ms_cold_median", 1e3 * bench_percentile(cold, n_req, 0.5),
                     "8k-token system prompt, nothing cached");
    bench_report_add(&rep, "ttft_ms_cold_p99", 1e3 * bench_percentile(cold, n_req, 0.99), NULL);
    bench_report_add(&rep, "ttft_ms_cached_median", 1e3 * bench_percentile(warm, n_req, 0.5),
                     "same prompt, system prompt cached");
    bench_report_add(&rep, "ttft_ms_cached_p99", 1e3 * bench_percentile(warm, n_req, 0.99), NULL);
    bench_report_add(&rep, "ttft_cold_over_cached",
                     bench_percentile(cold, n_req, 0.5) / bench_percentile(warm, n_req, 0.5), NULL);
    bench_report_add(&rep, "gateway_added_ms_cold_median",
                     1e3 * bench_percentile(add_cold, n_req, 0.5),
                     "HTTP TTFT minus the worker's own time to its first token");
    bench_report_add(&rep, "gateway_added_ms_cached_median",
                     1e3 * bench_percentile(add_warm, n_req, 0.5), NULL);
    bench_report_add(&rep, "gateway_added_ms_cached_p99",
                     1e3 * bench_percentile(add_warm, n_req, 0.99), NULL);

    /* ---- overhead on the demo model with max_tokens 1 ---- */
    gw_proc_t d = {0};
    if (start_gateway(&d, "kvgw-demo", "models/kvgw-demo.gguf", 1, 1) == 0) {
        int n = 200;
        double *ov = pc_xcalloc((size_t)n, sizeof *ov);
        int m = 0;
        for (int i = 0; i < n; i++) {
            snprintf(body, cap,
                     "{\"model\":\"kvgw-demo\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\","
                     "\"content\":\"ping %d\"}]}",
                     i);
            if (http_post(d.port, "/v1/messages", body, false, &t1, &t2, rid, sizeof rid) == 200 &&
                worker_times(d.access_log, rid, &wt, &wtot) == 0)
                ov[m++] = t2 - wtot;
        }
        if (m > 0) {
            double med = bench_percentile(ov, m, 0.5), p99 = bench_percentile(ov, m, 0.99);
            bench_report_add(&rep, "messages_overhead_ms_median", 1e3 * med,
                             "demo model, max_tokens 1: HTTP total minus the worker's time");
            bench_report_add(&rep, "messages_overhead_ms_p99", 1e3 * p99, NULL);
        }
        pc_free(ov);
        /* count_tokens with wrk, when installed */
        if (system("command -v wrk >/dev/null 2>&1") == 0) {
            char lua[256], cmd[1024];
            snprintf(lua, sizeof lua, "%s/ct.lua", d.dir);
            FILE *f = fopen(lua, "w");
            char *kb = long_prompt(250); /* about 1 KB of text */
            kb[1000] = '\0';
            fprintf(f,
                    "wrk.method = \"POST\"\nwrk.headers[\"x-api-key\"] = \"sk-bench\"\n"
                    "wrk.headers[\"content-type\"] = \"application/json\"\nwrk.body = "
                    "[[{\"model\":\"kvgw-demo\",\"messages\":[{\"role\":\"user\",\"content\":\"%s"
                    "\"}]}]]\n",
                    kb);
            fclose(f);
            pc_free(kb);
            snprintf(
                cmd, sizeof cmd,
                "wrk -t1 -c32 -d5s --latency -s %s http://127.0.0.1:%d/v1/messages/count_tokens",
                lua, d.port);
            FILE *p = popen(cmd, "r");
            char line[512];
            double rps = 0, p50 = 0, p99 = 0;
            while (p && fgets(line, sizeof line, p)) {
                char unit[8] = "";
                double v;
                if (sscanf(line, "Requests/sec: %lf", &v) == 1)
                    rps = v;
                else if (sscanf(line, " 50%% %lf%7s", &v, unit) == 2)
                    p50 = strcmp(unit, "us") == 0 ? v / 1e3 : strcmp(unit, "s") == 0 ? v * 1e3 : v;
                else if (sscanf(line, " 99%% %lf%7s", &v, unit) == 2)
                    p99 = strcmp(unit, "us") == 0 ? v / 1e3 : strcmp(unit, "s") == 0 ? v * 1e3 : v;
            }
            if (p)
                pclose(p);
            bench_report_add(&rep, "count_tokens_req_per_s", rps, "wrk -t1 -c32, ~1 KB prompts");
            bench_report_add(&rep, "count_tokens_ms_p50", p50, NULL);
            bench_report_add(&rep, "count_tokens_ms_p99", p99, NULL);
        } else {
            fprintf(stderr, "kvgw bench gateway: wrk not installed; count_tokens throughput not "
                            "measured (apt-get install wrk)\n");
        }
        stop_gateway(&d);
    }
    pc_free(sys);
    pc_free(body);
    pc_free(cold);
    pc_free(warm);
    pc_free(add_cold);
    pc_free(add_warm);
    bench_report_add(&rep, "link_encrypt_ns_per_token_frame", bench_link_token_frame_ns(100000),
                     "a remote worker's TOKEN frame sealed + opened (kvgw bench link)");
    bench_report_print(&rep);
    return 0;
}
