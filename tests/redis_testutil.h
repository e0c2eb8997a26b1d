/*
 * redis_testutil.h — real redis-server and redis-sentinel processes for the tests (header-only,
 * one copy per test binary). Each server runs on a free loopback port in its own directory
 * under the test's temporary directory; every process started here is killed at exit.
 *
 *   rt_server_t s; rt_start(&s, "name", NULL)   a primary (AOF off, no RDB)
 *   rt_start(&s, "name", "--appendonly yes") with extra args (split on spaces; they win)
 *   rt_replica(&s, "name", &primary)              a replica, returned once in sync
 *   rt_reserve(&s, "name")                        a port and directory only (rt_start later)
 *   rt_sentinel(&s, "name", master_port)         a sentinel monitoring "mymaster" (quorum 1)
 *   rt_stop(&s, SIGKILL|SIGSTOP|SIGCONT|SIGTERM), rt_cmd(port, fmt, ...) one blocking command
 */
#ifndef REDIS_TESTUTIL_H
#define REDIS_TESTUTIL_H

#include "pc_testutil.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>

#define RT_REDIS_BIN "/usr/bin/redis-server"
#define RT_SENTINEL_BIN "/usr/bin/redis-sentinel"

typedef struct rt_server {
    int port;
    pid_t pid;
    char dir[512];
} rt_server_t;

static pid_t rt__pids[16];
static int rt__n_pids;

static inline int rt_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

static inline redisContext *rt_connect(int port)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c == NULL || c->err) {
        redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    return c;
}

/* One command on a fresh connection; the reply (free it) or NULL. */
static inline redisReply *rt_cmd(int port, const char *fmt, ...)
{
    redisContext *c = rt_connect(port);
    if (c == NULL)
        return NULL;
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    redisFree(c);
    return r;
}

static inline bool rt_ping(int port)
{
    redisReply *r = rt_cmd(port, "PING"); /* any answer (NOAUTH too): the server is serving */
    bool ok = r != NULL && (r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_ERROR) &&
              (r->type == REDIS_REPLY_STATUS || strncmp(r->str, "LOADING", 7) != 0);
    if (r != NULL)
        freeReplyObject(r);
    return ok;
}

static inline bool rt__wait_ping(int port)
{
    for (int i = 0; i < 400; i++) { /* up to 20 s */
        if (rt_ping(port))
            return true;
        usleep(50000);
    }
    return false;
}

static inline pid_t rt__spawn(const char *bin, char **argv)
{
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execv(bin, argv);
        _exit(127);
    }
    if (pid > 0 && rt__n_pids < 16)
        rt__pids[rt__n_pids++] = pid;
    return pid;
}

/* Gives s a free port and its directory, starting nothing (a server down at first). */
static inline void rt_reserve(rt_server_t *s, const char *name)
{
    s->port = rt_free_port();
    snprintf(s->dir, sizeof s->dir, "%s", pc_test_tmp_path(name));
    mkdir(s->dir, 0700);
}

/* Starts (or restarts, same port and dir when s->port != 0) a redis-server. */
static inline int rt_start(rt_server_t *s, const char *name, const char *extra)
{
    if (s->port == 0)
        rt_reserve(s, name);
    char port[16], ex[256] = "";
    snprintf(port, sizeof port, "%d", s->port);
    char *argv[32] = {RT_REDIS_BIN, "--port",       port,   "--bind",
                      "127.0.0.1",  "--dir",        s->dir, "--save",
                      "",           "--appendonly", "no",   "--protected-mode",
                      "no",         "--daemonize",  "no"};
    int n = 15;
    if (extra != NULL) {
        snprintf(ex, sizeof ex, "%s", extra);
        for (char *t = strtok(ex, " "); t != NULL && n < 30; t = strtok(NULL, " "))
            argv[n++] = t;
    }
    argv[n] = NULL;
    s->pid = rt__spawn(RT_REDIS_BIN, argv);
    return s->pid > 0 && rt__wait_ping(s->port) ? 0 : -1;
}

/* A replica of primary started as s, once in sync with it (master_link_status:up, up to 20 s). */
static inline int rt_replica(rt_server_t *s, const char *name, const rt_server_t *primary)
{
    char ra[64];
    snprintf(ra, sizeof ra, "--replicaof 127.0.0.1 %d", primary->port);
    if (rt_start(s, name, ra) != 0)
        return -1;
    for (int i = 0; i < 400; i++) { /* up to 20 s */
        redisReply *x = rt_cmd(s->port, "INFO replication");
        bool synced = x != NULL && x->type == REDIS_REPLY_STRING &&
                      strstr(x->str, "master_link_status:up") != NULL;
        if (x != NULL)
            freeReplyObject(x);
        if (synced)
            return 0;
        usleep(50000);
    }
    return -1;
}

/* A sentinel monitoring 127.0.0.1:master_port as "mymaster", quorum 1, fast timeouts. */
static inline int rt_sentinel(rt_server_t *s, const char *name, int master_port)
{
    rt_reserve(s, name);
    char conf[600];
    snprintf(conf, sizeof conf, "%s/sentinel.conf", s->dir);
    FILE *f = fopen(conf, "w");
    if (f == NULL)
        return -1;
    fprintf(f,
            "port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\n"
            "sentinel monitor mymaster 127.0.0.1 %d 1\n"
            "sentinel down-after-milliseconds mymaster 1000\n"
            "sentinel failover-timeout mymaster 4000\n"
            "sentinel parallel-syncs mymaster 1\n",
            s->port, s->dir, master_port);
    fclose(f);
    char *argv[4] = {RT_SENTINEL_BIN, conf, NULL};
    s->pid = rt__spawn(RT_SENTINEL_BIN, argv);
    return s->pid > 0 && rt__wait_ping(s->port) ? 0 : -1;
}

static inline void rt_stop(rt_server_t *s, int sig)
{
    if (s->pid <= 0)
        return;
    kill(s->pid, sig);
    if (sig == SIGKILL || sig == SIGTERM) {
        waitpid(s->pid, NULL, 0);
        for (int i = 0; i < rt__n_pids; i++)
            if (rt__pids[i] == s->pid)
                rt__pids[i] = 0;
        s->pid = 0;
    }
}

__attribute__((destructor)) static void rt__cleanup(void)
{
    for (int i = 0; i < rt__n_pids; i++)
        if (rt__pids[i] > 0) {
            kill(rt__pids[i], SIGCONT);
            kill(rt__pids[i], SIGKILL);
            waitpid(rt__pids[i], NULL, 0);
        }
    if (pc_test__tmp_dir[0] != '\0') { /* servers' subdirectories: pc_testutil removes files */
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", pc_test__tmp_dir);
        if (system(cmd) != 0)
            fprintf(stderr, "cannot remove %s\n", pc_test__tmp_dir);
    }
}

static inline bool rt_installed(void)
{
    return access(RT_REDIS_BIN, X_OK) == 0;
}

#endif
