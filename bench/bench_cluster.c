/*
 * bench_cluster.c — `kvgw bench cluster`: many gateways sharing one cache over Redis (issue 22).
 *
 * Starts, on loopback, in a fresh temporary directory: a real redis-server (a free port,
 * noeviction, append-only), two `kvgw worker` processes (this binary, the CPU backend), three
 * `kvgw serve` with the registry on (instance ids gw-a, gw-b, gw-c) and one `kvgw serve` with
 * the same Redis but no registry ("single"), every gateway connected to both workers; waits
 * until every gateway sees both workers up; then measures, with a plain blocking HTTP client
 * (one connection per request, as `kvgw bench gateway`):
 *
 *   - gateway_added_ms_{p50,p99}_{shared,single}: the time a gateway adds to the first token of
 *     a streamed, max_tokens 1 request whose ~prompt-tokens system prompt is cached, measured as
 *     `kvgw bench gateway` measures gateway_added_ms_cached: HTTP TTFT minus the worker's own
 *     time to its first token (queue + prefill + the first token, its DONE timings, read back
 *     from the gateway's access log by request id). --clients threads send the requests at the
 *     same time, alternately to the shared gateways (round robin over the three) and to the
 *     single one, so both figures are taken under the same load. Every measured request must be
 *     billed a read (its kvgw-cache header): the fraction that was is reported
 *     (cached_fraction_shared / _single) and a run where it is not 1 says so.
 *   - registry_ops_per_request: the three gateways' kvgw_registry_op_seconds_count (every op but
 *     the background lease) over that phase, divided by its shared requests, every one a cached
 *     read (design: a cached read costs 1, a write 2); counted from and to moments when no
 *     gateway has a commit or read queued, so the warm-up's ops stay out and the phase's are all
 *     in.
 *   - cross_gateway_visible_ms_{p50,p99}: per round, a new prefix is written through one shared
 *     gateway (A) and another (B) must learn it through the change feed. From the moment the
 *     client receives A's first token, B's /metrics is polled until its count of applied write
 *     events (kvgw_registry_feed_events_total{type="w",result="applied"}) moves; the figure is
 *     the time from that first token to the end of the scrape that showed it (an upper bound:
 *     the event may have been applied during the scrape, or before the first token). Then a
 *     request with the same prefix on B must be billed a read (kvgw-cache read > 0) without B
 *     asking Redis for a claim (its kvgw_registry_claims_total unchanged): B billed it from its
 *     replica. cross_gateway_replica_reads is the fraction of rounds where both held; a round
 *     whose event did not arrive within 5 s counts in cross_gateway_not_visible.
 *   - count_tokens_req_per_s_{1gw,3gw}: wrk (Debian package wrk) on /v1/messages/count_tokens
 *     with ~1 KB prompts: one wrk -t1 -c32 on gateway A, then three wrk -t1 -c11 at once, one
 *     per shared gateway, summed. count_tokens touches no worker and no Redis: this is the
 *     gateways' own CPU, and the figure beside it (cores) says how many the machine has.
 *
 * Every process it starts dies with it: they are killed (SIGTERM, then SIGKILL after 10 s) and
 * the temporary directory removed on every exit path, on SIGINT/SIGTERM/SIGHUP (a thread waits
 * for them), and the children get PR_SET_PDEATHSIG so that even a SIGKILL of the benchmark
 * takes them down (only the directory, /tmp/kvgw-bench-cluster.*, stays then). The table, then
 * one JSON line last (bench.h). Exit status 1 when a phase failed or its premise did not hold
 * (a measured request not billed a read; a round's write not seen by the other gateway's feed
 * within 5 s or not billed a read there): ctest bench_cluster_quick (label bench) runs it small.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "common.h"

#define N_SHARED 3
#define N_GW (N_SHARED + 1) /* the single gateway is the last */
#define N_WORKERS 2
#define MAX_PROCS 16
#define LINK_SECRET "kvgw-bench-cluster-link-secret-0123"

/* ---- processes and cleanup -------------------------------------------------------------- */

/* Every child and the temporary directory, for the cleanup on any exit path (the main thread's
 * or the signal thread's, whichever comes first; the mutex makes it happen once). */
static struct {
    pthread_mutex_t mu;
    bool dying;
    pid_t pid[MAX_PROCS];
    int n;
    char dir[64];
} g_clean = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

/* Forgets a child that has exited (reaped by the caller). */
static void forget_pid(pid_t pid)
{
    pthread_mutex_lock(&g_clean.mu);
    for (int i = 0; i < g_clean.n; i++)
        if (g_clean.pid[i] == pid)
            g_clean.pid[i] = g_clean.pid[--g_clean.n];
    pthread_mutex_unlock(&g_clean.mu);
}

/* Stops every child and removes the directory. The main thread's call, once a signal began the
 * cleanup, waits for the signal thread's _exit instead of going on to print a report. */
static void cleanup_all(bool from_signal)
{
    pthread_mutex_lock(&g_clean.mu);
    if (g_clean.dying && !from_signal) {
        pthread_mutex_unlock(&g_clean.mu);
        for (;;)
            pause();
    }
    g_clean.dying = true;
    for (int i = 0; i < g_clean.n; i++)
        kill(g_clean.pid[i], SIGTERM);
    double deadline = bench_now_s() + 10;
    for (int i = 0; i < g_clean.n; i++) {
        int st;
        while (waitpid(g_clean.pid[i], &st, WNOHANG) == 0) {
            if (bench_now_s() > deadline) {
                kill(g_clean.pid[i], SIGKILL);
                waitpid(g_clean.pid[i], &st, 0);
                break;
            }
            usleep(10000);
        }
    }
    g_clean.n = 0;
    if (g_clean.dir[0] != '\0') {
        nftw(g_clean.dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        g_clean.dir[0] = '\0';
    }
    pthread_mutex_unlock(&g_clean.mu);
}

static void *signal_main(void *arg)
{
    sigset_t *set = arg;
    int sig;
    if (sigwait(set, &sig) == 0) {
        fprintf(stderr, "kvgw bench cluster: signal %d: stopping its processes\n", sig);
        cleanup_all(true);
        _exit(128 + sig);
    }
    return NULL;
}

/* Starts argv (argv[0] found on PATH) with stdout and stderr into out_path; the child dies with
 * this process. */
static pid_t spawn(char *const argv[], const char *out_path)
{
    pthread_mutex_lock(&g_clean.mu);
    if (g_clean.dying || g_clean.n >= MAX_PROCS) {
        pthread_mutex_unlock(&g_clean.mu);
        return -1;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL); /* the parent blocks them for its signal thread */
        int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
            _exit(127);
        execvp(argv[0], argv);
        _exit(127);
    }
    if (pid > 0)
        g_clean.pid[g_clean.n++] = pid;
    pthread_mutex_unlock(&g_clean.mu);
    return pid;
}

static bool alive(pid_t pid)
{
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
        forget_pid(pid);
        return false;
    }
    return true;
}

/* Waits (up to timeout_s) for a line of the file that contains `marker` and returns the number
 * after it, or -1 (the process died, or the time ran out). */
static int wait_marker(pid_t pid, const char *path, const char *marker, double timeout_s)
{
    double end = bench_now_s() + timeout_s;
    while (bench_now_s() < end) {
        FILE *f = fopen(path, "r");
        char line[1024];
        int v = -1;
        while (f != NULL && fgets(line, sizeof line, f) != NULL) {
            const char *p = strstr(line, marker);
            if (p != NULL)
                v = atoi(p + strlen(marker));
        }
        if (f != NULL)
            fclose(f);
        if (v > 0)
            return v;
        if (!alive(pid))
            return -1;
        usleep(20000);
    }
    return -1;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static void print_tail(const char *path)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "tail -n 5 '%s' >&2", path);
    if (system(cmd) != 0)
        fprintf(stderr, "(no output in %s)\n", path);
}

/* ---- a blocking HTTP client ------------------------------------------------------------- */

typedef struct hconn {
    int fd;
    pc_buf_t resp;
} hconn_t;

/* Sends one request (body NULL: a GET) with connection: close. 0 or -1. */
static int h_send(hconn_t *c, int port, const char *path, const char *body)
{
    memset(c, 0, sizeof *c);
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (c->fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct timeval tv = {.tv_sec = 120}; /* a hung gateway fails the run, never hangs it */
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(c->fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(c->fd);
        c->fd = -1;
        return -1;
    }
    pc_buf_t req = PC_BUF_INIT;
    if (body != NULL)
        pc_buf_printf(&req,
                      "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: sk-bench\r\n"
                      "anthropic-version: 2023-06-01\r\ncontent-type: application/json\r\n"
                      "content-length: %zu\r\nconnection: close\r\n\r\n%s",
                      path, strlen(body), body);
    else
        pc_buf_printf(&req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nconnection: close\r\n\r\n",
                      path);
    size_t off = 0;
    while (off < req.len) {
        ssize_t w = write(c->fd, req.base + off, req.len - off);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    int rc = off == req.len ? 0 : -1;
    pc_buf_free(&req);
    return rc;
}

/* Reads until the first token of a stream (its first content or message delta) and returns the
 * time it arrived, or -1 when the response ended (or failed) before one. */
static double h_first_token(hconn_t *c)
{
    char buf[65536];
    for (;;) {
        ssize_t n = read(c->fd, buf, sizeof buf);
        if (n <= 0)
            return -1;
        pc_buf_append(&c->resp, buf, (size_t)n);
        pc_buf_terminate(&c->resp);
        if (strstr(c->resp.base, "content_block_delta") != NULL ||
            strstr(c->resp.base, "message_delta") != NULL)
            return bench_now_s();
    }
}

/* Reads the rest, closes; the status, or -1. The response stays in c->resp (free it). */
static int h_finish(hconn_t *c)
{
    char buf[65536];
    ssize_t n;
    while ((n = read(c->fd, buf, sizeof buf)) > 0)
        pc_buf_append(&c->resp, buf, (size_t)n);
    close(c->fd);
    c->fd = -1;
    if (c->resp.len < 12 || pc_buf_terminate(&c->resp) != 0 ||
        strncmp(c->resp.base, "HTTP/1.1 ", 9) != 0)
        return -1;
    return atoi(c->resp.base + 9);
}

/* A header's value from the head of c->resp ("" when absent). */
static void h_header(const hconn_t *c, const char *name, char *out, size_t cap)
{
    out[0] = '\0';
    if (c->resp.base == NULL)
        return;
    char pat[64];
    snprintf(pat, sizeof pat, "\r\n%s: ", name);
    const char *end = strstr(c->resp.base, "\r\n\r\n");
    const char *h = strcasestr(c->resp.base, pat);
    if (h == NULL || (end != NULL && h > end))
        return;
    h += strlen(pat);
    size_t i = 0;
    while (h[i] != '\r' && h[i] != '\0' && i + 1 < cap) {
        out[i] = h[i];
        i++;
    }
    out[i] = '\0';
}

/* The read=N of a kvgw-cache header, or -1. */
static long cache_read_of(const char *kvgw_cache)
{
    const char *p = strstr(kvgw_cache, "read=");
    return p != NULL ? strtol(p + 5, NULL, 10) : -1;
}

/* GET /metrics into *text; 0 or -1. */
static int get_metrics(int port, pc_buf_t *text)
{
    hconn_t c;
    if (h_send(&c, port, "/metrics", NULL) != 0) {
        if (c.fd >= 0)
            close(c.fd);
        return -1;
    }
    int st = h_finish(&c);
    if (st != 200) {
        pc_buf_free(&c.resp);
        return -1;
    }
    *text = c.resp;
    return 0;
}

/* The sum of a family's samples whose labels contain every `need` and no `skip` (either may be
 * NULL); NAN when the family is not exported at all. */
static double metric_sum(const char *text, const char *name, const char *need1, const char *need2,
                         const char *skip)
{
    char type[128];
    snprintf(type, sizeof type, "# TYPE %s ", name);
    size_t fl = strlen(name); /* a histogram's _count is exported under its family's TYPE */
    if (fl > 6 && strcmp(name + fl - 6, "_count") == 0)
        snprintf(type, sizeof type, "# TYPE %.*s ", (int)(fl - 6), name);
    if (strstr(text, type) == NULL)
        return NAN;
    size_t nl = strlen(name);
    double sum = 0;
    for (const char *l = text; l != NULL && *l != '\0';) {
        const char *e = strchr(l, '\n');
        size_t len = e != NULL ? (size_t)(e - l) : strlen(l);
        if (len > nl && strncmp(l, name, nl) == 0 && (l[nl] == '{' || l[nl] == ' ')) {
            char line[1024];
            size_t k = len < sizeof line - 1 ? len : sizeof line - 1;
            memcpy(line, l, k);
            line[k] = '\0';
            const char *sp = strrchr(line, ' ');
            bool ok = sp != NULL && (need1 == NULL || strstr(line, need1) != NULL) &&
                      (need2 == NULL || strstr(line, need2) != NULL) &&
                      (skip == NULL || strstr(line, skip) == NULL);
            if (ok)
                sum += strtod(sp + 1, NULL);
        }
        l = e != NULL ? e + 1 : NULL;
    }
    return sum;
}

static double metric_of(int port, const char *name, const char *need1, const char *need2,
                        const char *skip)
{
    pc_buf_t t = PC_BUF_INIT;
    if (get_metrics(port, &t) != 0)
        return NAN;
    double v = metric_sum(t.base, name, need1, need2, skip);
    pc_buf_free(&t);
    return v;
}

/* ---- the setup -------------------------------------------------------------------------- */

typedef struct cluster {
    char dir[64];
    char self[512];
    const char *model_path;
    const char *model_name;
    int redis_port;
    pid_t redis_pid;
    int worker_port[N_WORKERS];
    pid_t worker_pid[N_WORKERS];
    int gw_port[N_GW];
    pid_t gw_pid[N_GW];
    char access_log[N_GW][192];
} cluster_t;

static const char *const gw_name[N_GW] = {"gw-a", "gw-b", "gw-c", "single"};

/* PING over a plain socket until +PONG (up to 10 s). */
static int redis_wait(cluster_t *cl)
{
    for (int i = 0; i < 500; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)cl->redis_port)};
        inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
        char buf[16] = "";
        if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
            write(fd, "PING\r\n", 6) == 6 && read(fd, buf, sizeof buf - 1) > 0 &&
            strncmp(buf, "+PONG", 5) == 0) {
            close(fd);
            return 0;
        }
        if (fd >= 0)
            close(fd);
        if (!alive(cl->redis_pid))
            return -1;
        usleep(20000);
    }
    return -1;
}

static int start_redis(cluster_t *cl)
{
    char rdir[128], port[16], out[160];
    snprintf(rdir, sizeof rdir, "%s/redis", cl->dir);
    mkdir(rdir, 0700);
    snprintf(out, sizeof out, "%s/redis.out", cl->dir);
    for (int attempt = 0; attempt < 5; attempt++) { /* the free port may be taken meanwhile */
        cl->redis_port = free_port();
        snprintf(port, sizeof port, "%d", cl->redis_port);
        char *argv[] = {"/usr/bin/redis-server",
                        "--port",
                        port,
                        "--bind",
                        "127.0.0.1",
                        "--dir",
                        rdir,
                        "--save",
                        "",
                        "--appendonly",
                        "yes",
                        "--appendfsync",
                        "everysec",
                        "--maxmemory-policy",
                        "noeviction",
                        "--daemonize",
                        "no",
                        NULL};
        if (access(argv[0], X_OK) != 0)
            argv[0] = "/usr/local/bin/redis-server";
        cl->redis_pid = spawn(argv, out);
        if (cl->redis_pid > 0 && redis_wait(cl) == 0)
            return 0;
    }
    fprintf(stderr, "kvgw bench cluster: redis-server did not start:\n");
    print_tail(out);
    return -1;
}

static int start_workers(cluster_t *cl, int threads)
{
    char th[16];
    snprintf(th, sizeof th, "%d", threads);
    for (int i = 0; i < N_WORKERS; i++) {
        char name[32], out[160];
        snprintf(name, sizeof name, "bench-worker-%d", i + 1);
        snprintf(out, sizeof out, "%s/%s.out", cl->dir, name);
        char *argv[] = {cl->self,      "worker",
                        "--model",     (char *)cl->model_path,
                        "--listen",    "127.0.0.1:0",
                        "--backend",   "cpu",
                        "--threads",   th,
                        "--name",      name,
                        "--log-level", "warn",
                        NULL};
        cl->worker_pid[i] = spawn(argv, out);
        if (cl->worker_pid[i] <= 0)
            return -1;
    }
    for (int i = 0; i < N_WORKERS; i++) {
        char out[160];
        snprintf(out, sizeof out, "%s/bench-worker-%d.out", cl->dir, i + 1);
        cl->worker_port[i] = wait_marker(cl->worker_pid[i], out, "listening on 127.0.0.1:", 300);
        if (cl->worker_port[i] <= 0) {
            fprintf(stderr, "kvgw bench cluster: worker %d did not start:\n", i + 1);
            print_tail(out);
            return -1;
        }
    }
    return 0;
}

static int start_gateway(cluster_t *cl, int i)
{
    bool shared = i < N_SHARED;
    char gdir[96], cfg[128], out[128];
    snprintf(gdir, sizeof gdir, "%s/%s", cl->dir, gw_name[i]);
    mkdir(gdir, 0700);
    snprintf(cfg, sizeof cfg, "%s/kvgw.yaml", gdir);
    snprintf(out, sizeof out, "%s/stdout", gdir);
    snprintf(cl->access_log[i], sizeof cl->access_log[i], "%s/access.log", gdir);
    FILE *f = fopen(cfg, "w");
    if (f == NULL)
        return -1;
    fprintf(f,
            "listen: 127.0.0.1:0\n"
            "models:\n  - name: %s\n    path: %s\n    min_cache_tokens: 64\n"
            "    remote: [127.0.0.1:%d, 127.0.0.1:%d]\n"
            "api_keys:\n  - {key: sk-bench, id: bench, tenant: bench}\n"
            "workers:\n  link_secret: env:KVGW_LINK_SECRET\n  heartbeat: 1s\n"
            "cache:\n  namespace_secret: bench-cluster-namespace-secret-0123456789\n"
            "billing:\n  ledger_dir: %s/ledger\n  pricing: conf/pricing.yaml\n"
            "  instance_id: %s\n"
            "redis:\n  address: 127.0.0.1:%d\n"
            "%s"
            "log:\n  access_log: %s\n  level: warn\n"
            "metrics:\n  require_key: false\n",
            cl->model_name, cl->model_path, cl->worker_port[0], cl->worker_port[1], gdir,
            gw_name[i], cl->redis_port, shared ? "registry:\n  enabled: true\n" : "",
            cl->access_log[i]);
    fclose(f);
    char *argv[] = {cl->self, "serve", "--config", cfg, NULL};
    cl->gw_pid[i] = spawn(argv, out);
    if (cl->gw_pid[i] <= 0)
        return -1;
    cl->gw_port[i] = wait_marker(cl->gw_pid[i], out, "listening on http://127.0.0.1:", 300);
    if (cl->gw_port[i] <= 0) {
        fprintf(stderr, "kvgw bench cluster: gateway %s did not start:\n", gw_name[i]);
        print_tail(out);
        return -1;
    }
    return 0;
}

/* Until every gateway reports both workers up (kvgw_worker_up), up to 120 s. */
static int wait_workers_up(cluster_t *cl)
{
    for (int i = 0; i < N_GW; i++) {
        double end = bench_now_s() + 120, up = 0;
        while (bench_now_s() < end) {
            up = metric_of(cl->gw_port[i], "kvgw_worker_up", NULL, NULL, NULL);
            if (up == N_WORKERS || !alive(cl->gw_pid[i]))
                break;
            usleep(50000);
        }
        if (up != N_WORKERS) {
            fprintf(stderr, "kvgw bench cluster: gateway %s sees %g of %d workers up\n", gw_name[i],
                    up, N_WORKERS);
            return -1;
        }
    }
    return 0;
}

/* ---- requests --------------------------------------------------------------------------- */

/* A system prompt of about n_tokens tokens, starting with `head` (which makes it unique). */
static char *system_text(const char *head, size_t n_tokens)
{
    pc_buf_t b = PC_BUF_INIT;
    pc_buf_append_cstr(&b, head);
    for (size_t i = 0; b.len < n_tokens * 4; i++)
        pc_buf_printf(&b,
                      "Section %zu: the service keeps a ledger of every request and bills "
                      "cached tokens at a tenth of the input price. ",
                      i);
    pc_buf_terminate(&b);
    return b.base;
}

/* A streamed max_tokens 1 request whose system prompt is a cache breakpoint. */
static char *message_body(const char *model, const char *sys, const char *user)
{
    pc_buf_t b = PC_BUF_INIT;
    pc_buf_printf(&b,
                  "{\"model\":\"%s\",\"max_tokens\":1,\"stream\":true,\"system\":[{\"type\":"
                  "\"text\",\"text\":\"%s\",\"cache_control\":{\"type\":\"ephemeral\"}}],"
                  "\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}]}",
                  model, sys, user);
    pc_buf_terminate(&b);
    return b.base;
}

typedef struct result {
    int gw;
    int status;
    double ttft_s; /* HTTP TTFT */
    long read;     /* kvgw-cache read=, -1 when absent */
    char rid[96];
} result_t;

/* One request: fills r (status -1 on a transport failure). */
static void one_request(int port, const char *body, result_t *r)
{
    hconn_t c;
    r->status = -1;
    r->ttft_s = -1;
    r->read = -1;
    r->rid[0] = '\0';
    double t0 = bench_now_s();
    if (h_send(&c, port, "/v1/messages", body) != 0) {
        if (c.fd >= 0)
            close(c.fd);
        return;
    }
    double t1 = h_first_token(&c);
    r->status = h_finish(&c);
    r->ttft_s = t1 > 0 ? t1 - t0 : -1;
    char hdr[512];
    h_header(&c, "kvgw-cache", hdr, sizeof hdr);
    r->read = cache_read_of(hdr);
    h_header(&c, "request-id", r->rid, sizeof r->rid);
    pc_buf_free(&c.resp);
}

typedef struct load {
    cluster_t *cl;
    const char *sys;
    int n;
    atomic_int next;
    result_t *res;
} load_t;

/* A client thread: takes request numbers until n; even ones go to the shared gateways in turn,
 * odd ones to the single gateway. */
static void *client_main(void *arg)
{
    load_t *L = arg;
    for (;;) {
        int i = atomic_fetch_add(&L->next, 1);
        if (i >= L->n)
            break;
        int gw = (i % 2 == 0) ? (i / 2) % N_SHARED : N_SHARED;
        char user[64];
        snprintf(user, sizeof user, "question %d", i);
        char *body = message_body(L->cl->model_name, L->sys, user);
        L->res[i].gw = gw;
        one_request(L->cl->gw_port[gw], body, &L->res[i]);
        pc_free(body);
    }
    return NULL;
}

/* The whole file (NULL when absent). */
static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    pc_buf_t b = PC_BUF_INIT;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        pc_buf_append(&b, buf, n);
    fclose(f);
    pc_buf_terminate(&b);
    return b.base;
}

/* The worker's own time (worker_total_us) of request rid in an access log text, or -1. */
static double worker_total_s(const char *log, const char *rid)
{
    if (log == NULL || rid[0] == '\0')
        return -1;
    char pat[128];
    snprintf(pat, sizeof pat, "\"request_id\":\"%s\"", rid);
    const char *l = strstr(log, pat);
    if (l == NULL)
        return -1;
    const char *e = strchr(l, '\n');
    const char *w = strstr(l, "\"worker_total_us\":");
    if (w == NULL || (e != NULL && w > e))
        return -1;
    return strtod(w + 18, NULL) / 1e6;
}

static const char *const reg_ops[] = {"claim", "commit", "read", "release"};
#define N_REG_OPS 4

/* The registry's ops of the shared gateways so far, by op (the background lease left out);
 * NAN without a registry. Commits and reads are fire-and-forget and counted when Redis answers
 * them: first wait (up to 10 s) until no gateway has any queued, so that the ops of the requests
 * before this moment are all counted, and none of them later. */
static void registry_ops(cluster_t *cl, double out[N_REG_OPS])
{
    for (int o = 0; o < N_REG_OPS; o++)
        out[o] = 0;
    for (int i = 0; i < N_SHARED; i++)
        for (int k = 0; k < 500; k++) {
            double q = metric_of(cl->gw_port[i], "kvgw_registry_replay_pending", NULL, NULL, NULL);
            if (!(q > 0))
                break;
            usleep(20000);
        }
    for (int i = 0; i < N_SHARED; i++) {
        pc_buf_t t = PC_BUF_INIT;
        if (get_metrics(cl->gw_port[i], &t) != 0) {
            for (int o = 0; o < N_REG_OPS; o++)
                out[o] = NAN;
            return;
        }
        for (int o = 0; o < N_REG_OPS; o++) {
            char lab[32];
            snprintf(lab, sizeof lab, "op=\"%s\"", reg_ops[o]);
            out[o] += metric_sum(t.base, "kvgw_registry_op_seconds_count", lab, NULL, NULL);
        }
        pc_buf_free(&t);
    }
}

/* Phase 1: gateway-added latency, shared vs single, and the registry's ops per request. */
static int phase_added(cluster_t *cl, bench_report_t *rep, int n_req, int clients,
                       int prompt_tokens)
{
    char *sys = system_text("You are the benchmark's assistant. ", (size_t)prompt_tokens);
    /* Write the prefix once through gw-a and once through the single gateway, then until each
     * shared gateway bills a read of it (gw-b and gw-c learn it from the feed or a claim). */
    result_t r;
    char *body = message_body(cl->model_name, sys, "warm up");
    one_request(cl->gw_port[0], body, &r);
    int ok = r.status == 200;
    one_request(cl->gw_port[N_SHARED], body, &r);
    ok &= r.status == 200;
    pc_free(body);
    for (int g = 0; g < N_GW && ok; g++) {
        for (int k = 0;; k++) {
            char user[64];
            snprintf(user, sizeof user, "warm up %d", k);
            body = message_body(cl->model_name, sys, user);
            one_request(cl->gw_port[g], body, &r);
            pc_free(body);
            if (r.status != 200 || r.read > 0 || k >= 50)
                break;
            usleep(20000);
        }
        if (r.status != 200 || r.read <= 0) {
            fprintf(stderr,
                    "kvgw bench cluster: gateway %s does not bill a read of the "
                    "written prefix (status %d, read %ld)\n",
                    gw_name[g], r.status, r.read);
            ok = 0;
        }
    }
    if (!ok) {
        pc_free(sys);
        return -1;
    }
    double ops0[N_REG_OPS], ops1[N_REG_OPS];
    registry_ops(cl, ops0);
    load_t L = {
        .cl = cl, .sys = sys, .n = n_req, .res = pc_xcalloc((size_t)n_req, sizeof(result_t))};
    atomic_init(&L.next, 0);
    pthread_t th[64];
    int started = 0;
    for (int i = 0; i < clients; i++)
        if (pthread_create(&th[started], NULL, client_main, &L) == 0)
            started++;
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    registry_ops(cl, ops1);

    /* The worker's own times from the access logs (written out every 250 ms). */
    double *add[2] = {pc_xcalloc((size_t)n_req, sizeof(double)),
                      pc_xcalloc((size_t)n_req, sizeof(double))};
    int n_add[2] = {0, 0}, n_sent[2] = {0, 0}, n_read[2] = {0, 0}, failed = 0;
    char *logs[N_GW] = {0};
    for (int attempt = 0; attempt < 40; attempt++) {
        for (int g = 0; g < N_GW; g++) {
            pc_free(logs[g]);
            logs[g] = read_file(cl->access_log[g]);
        }
        int missing = 0;
        for (int i = 0; i < n_req; i++)
            if (L.res[i].status == 200 && worker_total_s(logs[L.res[i].gw], L.res[i].rid) < 0)
                missing++;
        if (missing == 0)
            break;
        usleep(100000);
    }
    for (int i = 0; i < n_req; i++) {
        const result_t *x = &L.res[i];
        int k = x->gw == N_SHARED; /* 0 shared, 1 single */
        n_sent[k]++;
        if (x->status != 200 || x->ttft_s < 0) {
            failed++;
            continue;
        }
        if (x->read > 0)
            n_read[k]++;
        double w = worker_total_s(logs[x->gw], x->rid);
        if (w >= 0 && x->read > 0)
            add[k][n_add[k]++] = x->ttft_s - w;
    }
    for (int g = 0; g < N_GW; g++)
        pc_free(logs[g]);
    char note[96];
    snprintf(note, sizeof note, "%d cached-prefix requests over 3 gateways, %d clients", n_add[0],
             clients);
    bench_report_add(rep, "gateway_added_ms_p50_shared",
                     1e3 * bench_percentile(add[0], n_add[0], 0.5), note);
    bench_report_add(rep, "gateway_added_ms_p99_shared",
                     1e3 * bench_percentile(add[0], n_add[0], 0.99), NULL);
    snprintf(note, sizeof note, "%d on one gateway without the registry, same time", n_add[1]);
    bench_report_add(rep, "gateway_added_ms_p50_single",
                     1e3 * bench_percentile(add[1], n_add[1], 0.5), note);
    bench_report_add(rep, "gateway_added_ms_p99_single",
                     1e3 * bench_percentile(add[1], n_add[1], 0.99), NULL);
    bench_report_add(rep, "cached_fraction_shared", n_sent[0] ? (double)n_read[0] / n_sent[0] : NAN,
                     "requests billed a read (kvgw-cache), want 1");
    bench_report_add(rep, "cached_fraction_single", n_sent[1] ? (double)n_read[1] / n_sent[1] : NAN,
                     NULL);
    double ops = 0;
    char by_op[96] = "";
    for (int o = 0, k = 0; o < N_REG_OPS; o++) {
        ops += ops1[o] - ops0[o];
        k += snprintf(by_op + k, sizeof by_op - (size_t)k, "%s%s %.0f", o ? ", " : "", reg_ops[o],
                      ops1[o] - ops0[o]);
    }
    /* Over the phase's requests to the shared gateways (each a cached read: design 1 op). */
    bench_report_add(rep, "registry_ops_per_request", n_sent[0] ? ops / n_sent[0] : NAN, by_op);
    pc_free(add[0]);
    pc_free(add[1]);
    pc_free(L.res);
    pc_free(sys);
    /* The figures' premise: every request answered and billed a read of the cached prefix. */
    if (failed > 0 || n_read[0] < n_sent[0] || n_read[1] < n_sent[1]) {
        fprintf(stderr,
                "kvgw bench cluster: %d of %d requests failed; billed a read: %d of %d shared, "
                "%d of %d single\n",
                failed, n_req, n_read[0], n_sent[0], n_read[1], n_sent[1]);
        return -1;
    }
    return 0;
}

/* Phase 2: how soon a write through one gateway reaches another's replica. */
static int phase_visible(cluster_t *cl, bench_report_t *rep, int rounds, int prompt_tokens)
{
    double *vis = pc_xcalloc((size_t)rounds, sizeof(double));
    int n_vis = 0, n_replica = 0, n_lost = 0, n_unread = 0, failed = 0;
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    for (int r = 0; r < rounds; r++) {
        int a = r % N_SHARED, b = (r + 1) % N_SHARED;
        char head[96];
        snprintf(head, sizeof head, "Round %d, nonce %016llx. ", r,
                 (unsigned long long)bench_rand(&seed));
        char *sys = system_text(head, (size_t)prompt_tokens);
        double applied0 = metric_of(cl->gw_port[b], "kvgw_registry_feed_events_total", "type=\"w\"",
                                    "result=\"applied\"", NULL);
        if (isnan(applied0)) {
            fprintf(stderr,
                    "kvgw bench cluster: gateway %s exports no "
                    "kvgw_registry_feed_events_total: no registry in this build\n",
                    gw_name[b]);
            pc_free(sys);
            failed = rounds;
            break;
        }
        char *body = message_body(cl->model_name, sys, "write");
        hconn_t c;
        double t_first = -1;
        if (h_send(&c, cl->gw_port[a], "/v1/messages", body) == 0)
            t_first = h_first_token(&c);
        pc_free(body);
        double t_seen = -1;
        if (t_first > 0) {
            while (bench_now_s() < t_first + 5) {
                double v = metric_of(cl->gw_port[b], "kvgw_registry_feed_events_total",
                                     "type=\"w\"", "result=\"applied\"", NULL);
                if (v > applied0) {
                    t_seen = bench_now_s();
                    break;
                }
            }
        }
        int st = c.fd >= 0 ? h_finish(&c) : -1;
        pc_buf_free(&c.resp);
        if (st != 200 || t_first < 0) {
            failed++;
            pc_free(sys);
            continue;
        }
        if (t_seen < 0) {
            n_lost++;
            pc_free(sys);
            continue;
        }
        vis[n_vis++] = t_seen - t_first;
        /* B bills a read of it from its replica: no claim asked. */
        double claims0 = metric_of(cl->gw_port[b], "kvgw_registry_claims_total", NULL, NULL, NULL);
        result_t x;
        body = message_body(cl->model_name, sys, "read it elsewhere");
        one_request(cl->gw_port[b], body, &x);
        pc_free(body);
        double claims1 = metric_of(cl->gw_port[b], "kvgw_registry_claims_total", NULL, NULL, NULL);
        if (x.status != 200 || x.read <= 0)
            n_unread++;
        else if (claims1 == claims0)
            n_replica++;
        pc_free(sys);
    }
    bench_report_add(rep, "cross_gateway_visible_ms_p50", 1e3 * bench_percentile(vis, n_vis, 0.5),
                     "first token on A until B's replica applied the write");
    bench_report_add(rep, "cross_gateway_visible_ms_p99", 1e3 * bench_percentile(vis, n_vis, 0.99),
                     NULL);
    int done = rounds - failed;
    bench_report_add(rep, "cross_gateway_replica_reads", done > 0 ? (double)n_replica / done : NAN,
                     "then B billed a read without a claim, want 1");
    bench_report_add(rep, "cross_gateway_not_visible", done > 0 ? n_lost : NAN,
                     "rounds not seen within 5 s");
    pc_free(vis);
    /* The figure's premise: every write seen by B's replica and billed as a read there. */
    if (failed > 0 || n_lost > 0 || n_unread > 0)
        fprintf(stderr,
                "kvgw bench cluster: of %d visibility rounds %d failed, %d not seen by the other "
                "gateway's feed within 5 s, %d not billed a read there\n",
                rounds, failed, n_lost, n_unread);
    return failed > 0 || n_lost > 0 || n_unread > 0 ? -1 : 0;
}

/* Phase 3: count_tokens throughput with wrk on one gateway and on the three at once. */
static void phase_count_tokens(cluster_t *cl, bench_report_t *rep, int seconds)
{
    if (system("command -v wrk >/dev/null 2>&1") != 0) {
        fprintf(stderr, "kvgw bench cluster: wrk not installed; count_tokens throughput not "
                        "measured (apt-get install wrk)\n");
        return;
    }
    char lua[160];
    snprintf(lua, sizeof lua, "%s/ct.lua", cl->dir);
    FILE *f = fopen(lua, "w");
    if (f == NULL)
        return;
    char *kb = system_text("", 250); /* about 1 KB of text */
    kb[1000] = '\0';
    fprintf(f,
            "wrk.method = \"POST\"\nwrk.headers[\"x-api-key\"] = \"sk-bench\"\n"
            "wrk.headers[\"content-type\"] = \"application/json\"\nwrk.body = "
            "[[{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}]}]]\n",
            cl->model_name, kb);
    fclose(f);
    pc_free(kb);
    for (int n_gw = 1; n_gw <= N_SHARED; n_gw += N_SHARED - 1) {
        pid_t pid[N_SHARED];
        char out[N_SHARED][160];
        for (int g = 0; g < n_gw; g++) {
            char conns[16], dur[16], url[96];
            snprintf(conns, sizeof conns, "-c%d", n_gw == 1 ? 32 : 11);
            snprintf(dur, sizeof dur, "-d%ds", seconds);
            snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/messages/count_tokens",
                     cl->gw_port[g]);
            snprintf(out[g], sizeof out[g], "%s/wrk-%d-%d.out", cl->dir, n_gw, g);
            char *argv[] = {"wrk", "-t1", conns, dur, "-s", lua, url, NULL};
            pid[g] = spawn(argv, out[g]);
        }
        double rps = 0;
        int got = 0;
        for (int g = 0; g < n_gw; g++) {
            int st;
            if (pid[g] <= 0 || waitpid(pid[g], &st, 0) != pid[g])
                continue;
            forget_pid(pid[g]);
            FILE *o = fopen(out[g], "r");
            char line[512];
            double v;
            while (o != NULL && fgets(line, sizeof line, o) != NULL)
                if (sscanf(line, "Requests/sec: %lf", &v) == 1)
                    rps += v, got++;
            if (o != NULL)
                fclose(o);
        }
        if (got != n_gw)
            rps = NAN;
        if (n_gw == 1)
            bench_report_add(rep, "count_tokens_req_per_s_1gw", rps, "wrk -t1 -c32 on one gateway");
        else
            bench_report_add(rep, "count_tokens_req_per_s_3gw", rps,
                             "three wrk -t1 -c11 at once, one per gateway");
    }
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kvgw bench cluster [--model FILE] [--requests N] [--clients N] "
               "[--prompt-tokens N] [--rounds N] [--threads N] [--seconds N]\n"
               "  --model FILE        GGUF of the workers and gateways (models/kvgw-demo.gguf)\n"
               "  --requests N        cached-prefix requests, half shared, half single (400)\n"
               "  --clients N         concurrent client connections (3)\n"
               "  --prompt-tokens N   the cached system prompt's length (1500)\n"
               "  --rounds N          cross-gateway visibility rounds (50)\n"
               "  --threads N         compute threads per worker (1)\n"
               "  --seconds N         each count_tokens wrk run (5)\n");
}

int bench_cluster_main(int argc, char **argv)
{
    const char *model = "models/kvgw-demo.gguf";
    int n_req = 400, clients = 3, prompt_tokens = 1500, rounds = 50, threads = 1, seconds = 5;
    static const struct option opts[] = {{"model", required_argument, NULL, 'm'},
                                         {"requests", required_argument, NULL, 'n'},
                                         {"clients", required_argument, NULL, 'c'},
                                         {"prompt-tokens", required_argument, NULL, 'p'},
                                         {"rounds", required_argument, NULL, 'r'},
                                         {"threads", required_argument, NULL, 't'},
                                         {"seconds", required_argument, NULL, 's'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:n:c:p:r:t:s:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 'n':
            n_req = atoi(optarg);
            break;
        case 'c':
            clients = atoi(optarg);
            break;
        case 'p':
            prompt_tokens = atoi(optarg);
            break;
        case 'r':
            rounds = atoi(optarg);
            break;
        case 't':
            threads = atoi(optarg);
            break;
        case 's':
            seconds = atoi(optarg);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc || n_req < 2 || n_req > 1000000 || clients < 1 || clients > 64 ||
        prompt_tokens < 100 || prompt_tokens > 100000 || rounds < 1 || rounds > 100000 ||
        threads < 1 || threads > 256 || seconds < 1 || seconds > 3600) {
        usage(stderr);
        return 2;
    }
    if (access(model, R_OK) != 0) {
        fprintf(stderr, "kvgw bench cluster: cannot read %s: %s\n", model, strerror(errno));
        return 1;
    }

    /* SIGINT, SIGTERM, SIGHUP: a thread stops every child and removes the directory. */
    static sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    pthread_t sig_thread;
    if (pthread_create(&sig_thread, NULL, signal_main, &sigs) != 0) {
        fprintf(stderr, "kvgw bench cluster: no signal thread\n");
        return 1;
    }
    pthread_detach(sig_thread);
    signal(SIGPIPE, SIG_IGN);

    cluster_t cl = {.model_path = model,
                    .model_name = strstr(model, "kvgw-demo") ? "kvgw-demo" : "kvgw-bench"};
    ssize_t k = readlink("/proc/self/exe", cl.self, sizeof cl.self - 1);
    snprintf(cl.dir, sizeof cl.dir, "/tmp/kvgw-bench-cluster.XXXXXX");
    if (k <= 0 || mkdtemp(cl.dir) == NULL) {
        fprintf(stderr, "kvgw bench cluster: no temporary directory: %s\n", strerror(errno));
        return 1;
    }
    cl.self[k] = '\0';
    pthread_mutex_lock(&g_clean.mu);
    snprintf(g_clean.dir, sizeof g_clean.dir, "%s", cl.dir);
    pthread_mutex_unlock(&g_clean.mu);
    setenv("KVGW_LINK_SECRET", LINK_SECRET, 1);

    bench_report_t rep;
    bench_report_init(&rep, "cluster");
    fprintf(stderr, "kvgw bench cluster: starting redis-server, %d workers, %d gateways in %s\n",
            N_WORKERS, N_GW, cl.dir);
    if (start_redis(&cl) != 0 || start_workers(&cl, threads) != 0)
        goto out;
    for (int i = 0; i < N_GW; i++)
        if (start_gateway(&cl, i) != 0)
            goto out;
    if (wait_workers_up(&cl) != 0)
        goto out;
    fprintf(stderr,
            "kvgw bench cluster: ready (redis :%d, workers :%d :%d, gateways :%d :%d :%d, "
            "single :%d)\n",
            cl.redis_port, cl.worker_port[0], cl.worker_port[1], cl.gw_port[0], cl.gw_port[1],
            cl.gw_port[2], cl.gw_port[3]);
    /* A phase that fails leaves its figures out (or null) and the exit status 1; the others
     * still run and the report is printed. */
    int failed = 0;
    failed += phase_added(&cl, &rep, n_req, clients, prompt_tokens) != 0;
    failed +=
        phase_visible(&cl, &rep, rounds, prompt_tokens / 4 > 100 ? prompt_tokens / 4 : 100) != 0;
    phase_count_tokens(&cl, &rep, seconds);
    bench_report_add(&rep, "cores", (double)sysconf(_SC_NPROCESSORS_ONLN),
                     "online CPUs (workers, gateways, Redis and the clients share them)");
    cleanup_all(false);
    bench_report_print(&rep);
    if (failed > 0)
        fprintf(stderr, "kvgw bench cluster: %d phase(s) failed\n", failed);
    return failed > 0 ? 1 : 0;
out:
    cleanup_all(false);
    fprintf(stderr, "kvgw bench cluster: the cluster did not start\n");
    return 1;
}
