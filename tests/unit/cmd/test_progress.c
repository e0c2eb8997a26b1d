/*
 * test_progress.c — progress of the long operations: eng_mkmodel_write reports every tensor
 * (monotone, ending at the total), eng_model_load / eng_init report every layer (1..n_layer),
 * and the terminal line (cmd/progress.c) is drawn on a terminal only: a pseudo-terminal
 * gets the bar and the erase at the end, a file gets nothing.
 */
#define _XOPEN_SOURCE 600 /* posix_openpt, grantpt, unlockpt, ptsname */
#define _DEFAULT_SOURCE
#include "progress.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"
#include "engine.h"
#include "mkmodel.h"
#include "model.h"
#include "pc_test.h"
#include "test_bytemodel.h"

typedef struct calls {
    uint64_t done[64], total[64];
    int n;
} calls_t;

static void record_u64(uint64_t done, uint64_t total, void *ud)
{
    calls_t *c = ud;
    if (c->n < 64) {
        c->done[c->n] = done;
        c->total[c->n] = total;
    }
    c->n++;
}

static void record_u32(uint32_t done, uint32_t total, void *ud)
{
    record_u64(done, total, ud);
}

static char model_path[64];

static eng_vocab_t *byte_vocab(void)
{
    eng_vocab_t *v = pc_xcalloc(1, sizeof *v);
    v->bos_id = v->eos_id = v->eot_id = v->eom_id = v->pad_id = v->unk_id = -1;
    v->model = pc_xstrdup("gpt2");
    v->pre = pc_xstrdup("default");
    v->n_tokens = 256;
    v->tokens = pc_xcalloc(256, sizeof *v->tokens);
    v->token_type = pc_xcalloc(256, sizeof *v->token_type);
    for (int i = 0; i < 256; i++) {
        char t[8];
        test_byte_token(i, t);
        v->tokens[i] = pc_xstrdup(t);
        v->token_type[i] = ENG_TOKEN_TYPE_NORMAL;
    }
    return v;
}

PC_TEST(mkmodel_reports_every_tensor)
{
    snprintf(model_path, sizeof model_path, "/tmp/kvgw-test-progress-%d.gguf", (int)getpid());
    eng_vocab_t *v = byte_vocab();
    eng_mkmodel_params_t p = eng_mkmodel_params_default();
    p.n_layer = 3;
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 128;
    calls_t c = {0};
    p.progress = record_u64;
    p.progress_ud = &c;
    char err[256] = "";
    int rc = eng_mkmodel_write(&p, v, model_path, err, sizeof err);
    eng_vocab_free(v);
    if (rc != 0)
        fprintf(stderr, "%s\n", err);
    ASSERT_EQ(rc, 0);
    /* token_embd, output_norm, output and 9 tensors per layer (2 norms, q k v o, gate up down). */
    ASSERT_EQ(c.n, 3 + 3 * 9);
    /* Elements: embeddings and output 256 x 64 each, the output norm 64; per layer 2 x 64 of
     * norms, q and o 64 x 64, k and v 32 x 64 (2 KV heads of 16), 3 x 64 x 128 of FFN. */
    uint64_t per_layer = 2 * 64 + 2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 128;
    uint64_t total = 2 * 256 * 64 + 64 + 3 * per_layer;
    for (int i = 0; i < c.n; i++) {
        ASSERT_EQ_U64(c.total[i], total);
        ASSERT_TRUE(c.done[i] > 0 && c.done[i] <= total);
        if (i > 0)
            ASSERT_TRUE(c.done[i] > c.done[i - 1]);
    }
    ASSERT_EQ_U64(c.done[c.n - 1], total);
}

PC_TEST(model_load_reports_every_layer)
{
    eng_model_params_t mp = eng_model_params_default();
    ASSERT_TRUE(mp.progress == NULL);
    calls_t c = {0};
    mp.progress = record_u32;
    mp.progress_ud = &c;
    eng_model_t *m = NULL;
    char err[256] = "";
    int rc = eng_model_load(model_path, &mp, &m, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "%s\n", err);
    ASSERT_EQ(rc, 0);
    eng_model_free(m);
    ASSERT_EQ(c.n, 3);
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ_U64(c.done[i], (uint64_t)i + 1);
        ASSERT_EQ_U64(c.total[i], 3);
    }
    /* The same through the engine's parameters (what `kvgw worker` sets). */
    calls_t c2 = {0};
    eng_params_t ep = eng_params_default();
    ASSERT_TRUE(ep.load_progress == NULL);
    ep.model_path = model_path;
    ep.n_threads = 1;
    ep.kv_max_tokens = 1024;
    ep.load_progress = record_u32;
    ep.load_progress_ud = &c2;
    eng_t *e = NULL;
    rc = eng_init(&ep, &e, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "%s\n", err);
    ASSERT_EQ(rc, 0);
    eng_free(e);
    ASSERT_EQ(c2.n, 3);
    ASSERT_EQ_U64(c2.done[2], 3);
    /* A model that fails to load reports nothing after the failure: no file, no call. */
    calls_t c3 = {0};
    mp.progress_ud = &c3;
    ASSERT_NE(eng_model_load("/nonexistent/kvgw.gguf", &mp, &m, err, sizeof err), 0);
    ASSERT_EQ(c3.n, 0);
    unlink(model_path);
}

/* A begin / 3 updates / end sequence. */
static void draw_updates(void)
{
    kvgw_progress_t pr;
    kvgw_progress_begin(&pr, "loading x", "layers");
    kvgw_progress_update(&pr, 1, 4);
    kvgw_progress_update(&pr, 1, 4); /* same percentage: not redrawn */
    kvgw_progress_update(&pr, 4, 4);
    kvgw_progress_update(&pr, 9, 0); /* total 0: ignored */
    kvgw_progress_end(&pr);
}

/* kvgw serve's loads (gw_serve_params_t.load_progress): two workers through one display. */
static void draw_serve_loads(void)
{
    kvgw_progress_t pr;
    kvgw_progress_begin(&pr, "loading", "layers");
    for (int w = 0; w < 2; w++) {
        kvgw_progress_cb_load(1, 2, &pr);
        kvgw_progress_cb_load(2, 2, &pr);
        kvgw_progress_cb_load(0, 0, &pr);
    }
}

/* Runs draw with stderr on fd; returns what fd's reader got. */
static size_t draw_on(void (*draw)(void), int fd, int read_fd, char *out, size_t cap)
{
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    draw();
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    size_t n = 0;
    ssize_t k;
    while (n + 1 < cap && (k = read(read_fd, out + n, cap - 1 - n)) > 0)
        n += (size_t)k;
    out[n] = '\0';
    return n;
}

/* Runs draw with stderr on a fresh pseudo-terminal; returns the bytes drawn, or -1 where the
 * machine has no pseudo-terminals. */
static long draw_on_pty(void (*draw)(void), char *out, size_t cap)
{
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0)
        return -1;
    int slave = open(ptsname(master), O_RDWR | O_NOCTTY);
    if (slave < 0)
        return -1;
    fcntl(master, F_SETFL, O_NONBLOCK);
    size_t n = draw_on(draw, slave, master, out, cap);
    close(slave);
    close(master);
    return (long)n;
}

PC_TEST(terminal_only)
{
    unsetenv("KVGW_NO_PROGRESS");
    /* A file: nothing at all. */
    char path[64];
    snprintf(path, sizeof path, "/tmp/kvgw-test-progress-%d.txt", (int)getpid());
    int f = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    ASSERT_TRUE(f >= 0);
    int r = open(path, O_RDONLY);
    char buf[1024];
    ASSERT_EQ_U64(draw_on(draw_updates, f, r, buf, sizeof buf), 0);
    close(f);
    close(r);
    unlink(path);

    /* A pseudo-terminal: two lines drawn (25%, 100%), then erased. */
    long n = draw_on_pty(draw_updates, buf, sizeof buf);
    if (n < 0)
        PC_SKIP("no pseudo-terminal on this machine");
    ASSERT_TRUE(n > 0);
    ASSERT_TRUE(strstr(buf, "loading x [#######") != NULL);
    ASSERT_TRUE(strstr(buf, " 25% (1/4 layers)") != NULL);
    ASSERT_TRUE(strstr(buf, "100% (4/4 layers)") != NULL);
    const char *first = strstr(buf, "25%");
    ASSERT_TRUE(strstr(first + 1, "25%") == NULL);     /* drawn once */
    ASSERT_TRUE(strcmp(buf + n - 4, "\r\033[K") == 0); /* erased at the end */

    /* KVGW_NO_PROGRESS silences it on a terminal too. */
    setenv("KVGW_NO_PROGRESS", "1", 1);
    ASSERT_EQ(draw_on_pty(draw_updates, buf, sizeof buf), 0);
    unsetenv("KVGW_NO_PROGRESS");
}

/* (0, 0) erases the line after each worker's load, and the second load is drawn afresh. */
PC_TEST(serve_loads)
{
    unsetenv("KVGW_NO_PROGRESS");
    char buf[2048];
    long n = draw_on_pty(draw_serve_loads, buf, sizeof buf);
    if (n < 0)
        PC_SKIP("no pseudo-terminal on this machine");
    const char *a = strstr(buf, " 50% (1/2 layers)");
    ASSERT_TRUE(a != NULL);
    const char *b = strstr(a + 1, " 50% (1/2 layers)"); /* the second worker's */
    ASSERT_TRUE(b != NULL);
    ASSERT_TRUE(strstr(a, "100% (2/2 layers)\r\033[K\r\033[Kloading") != NULL); /* erased between */
    ASSERT_TRUE(n >= 4 && strcmp(buf + n - 4, "\r\033[K") == 0);                /* and at the end */
}

PC_TEST_MAIN()
