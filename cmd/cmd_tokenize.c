/*
 * cmd_tokenize.c — `kvgw tokenize`: the model's tokenizer on the command line (DESIGN.md §6).
 *
 *   kvgw tokenize --model FILE.gguf            text on stdin -> [ids] (JSON) on stdout
 *   kvgw tokenize --tokenizer tokenizer.json   the same from a Hugging Face tokenizer.json
 *   ... --decode                               [ids] on stdin -> text on stdout
 *
 * Encoding is the gateway's: ordinary text only, so "<|eot_id|>" on stdin is text, not the
 * control token. The text is stdin's bytes exactly (a final newline is part of it).
 */
#include "cli.h"
#include "common.h"
#include "gguf.h"
#include "tokenizer.h"
#include "vocab.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: kvgw tokenize (--model FILE.gguf | --tokenizer tokenizer.json "
               "[--config tokenizer_config.json]) [--decode [--skip-special]]\n");
}

static void help(void)
{
    usage(stdout);
    printf("\nReads text on stdin and prints its token ids as a JSON array. With --decode, reads\n"
           "a JSON array of token ids and prints their text (control tokens included unless\n"
           "--skip-special). Special-token spellings in the input text are tokenized as\n"
           "ordinary text.\n");
}

static int read_all(FILE *f, pc_buf_t *b)
{
    for (;;) {
        char *w = pc_buf_reserve(b, 65536);
        if (w == NULL)
            return PC_ERR_NOMEM;
        size_t n = fread(w, 1, 65536, f);
        pc_buf_commit(b, n);
        if (n < 65536)
            return ferror(f) ? PC_ERR_IO : 0;
    }
}

static int load(const char *model, const char *tj, const char *cfg, eng_tok_t **out, char *err,
                size_t n)
{
    eng_gguf_t *g = NULL;
    eng_vocab_t *v = NULL;
    int rc;
    if (model != NULL) {
        rc = eng_gguf_open(model, &g, err, n);
        if (rc == 0)
            rc = eng_vocab_from_gguf(g, &v, err, n);
    } else {
        rc = eng_vocab_from_tokenizer_json(tj, cfg, &v, err, n);
    }
    if (rc == 0)
        rc = eng_tok_init(v, out, err, n);
    eng_vocab_free(v);
    eng_gguf_free(g);
    return rc;
}

static int encode(const eng_tok_t *t, const pc_buf_t *in)
{
    uint32_t *ids = NULL;
    size_t n = 0, cap = 0;
    int rc = eng_tok_encode(t, in->base ? in->base : "", in->len, &ids, &n, &cap);
    if (rc != 0) {
        fprintf(stderr, "kvgw tokenize: %s\n", pc_strerror(rc));
        return KVGW_EXIT_FAIL;
    }
    putchar('[');
    for (size_t i = 0; i < n; i++)
        printf(i ? ",%u" : "%u", ids[i]);
    printf("]\n");
    pc_free(ids);
    return KVGW_EXIT_OK;
}

static int decode(const eng_tok_t *t, const pc_buf_t *in, bool with_special)
{
    json_error_t je;
    json_t *j = json_loadb(in->base ? in->base : "", in->len, 0, &je);
    uint32_t *ids = NULL;
    pc_buf_t out = PC_BUF_INIT;
    int ret = KVGW_EXIT_FAIL;
    if (j == NULL || !json_is_array(j)) {
        fprintf(stderr, "kvgw tokenize: stdin is not a JSON array of token ids: %s (line %d)\n",
                j ? "not an array" : je.text, j ? 1 : je.line);
        goto out;
    }
    size_t n = json_array_size(j);
    ids = pc_xmalloc((n ? n : 1) * sizeof *ids);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(j, i);
        json_int_t id = json_integer_value(e);
        if (!json_is_integer(e) || id < 0 || id >= (json_int_t)eng_tok_n_vocab(t)) {
            fprintf(stderr, "kvgw tokenize: element %zu is not a token id in [0, %u)\n", i,
                    eng_tok_n_vocab(t));
            goto out;
        }
        ids[i] = (uint32_t)id;
    }
    int rc = eng_tok_decode(t, ids, n, with_special, &out);
    if (rc != 0) {
        fprintf(stderr, "kvgw tokenize: %s\n", pc_strerror(rc));
        goto out;
    }
    if (out.len > 0 && fwrite(out.base, 1, out.len, stdout) != out.len) {
        fprintf(stderr, "kvgw tokenize: write failed\n");
        goto out;
    }
    ret = KVGW_EXIT_OK;
out:
    json_decref(j);
    pc_free(ids);
    pc_buf_free(&out);
    return ret;
}

int kvgw_cmd_tokenize(int argc, char **argv)
{
    const char *model = NULL, *tj = NULL, *cfg = NULL;
    bool do_decode = false, with_special = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            help();
            return KVGW_EXIT_OK;
        } else if (strcmp(a, "--model") == 0 && i + 1 < argc) {
            model = argv[++i];
        } else if (strcmp(a, "--tokenizer") == 0 && i + 1 < argc) {
            tj = argv[++i];
        } else if (strcmp(a, "--config") == 0 && i + 1 < argc) {
            cfg = argv[++i];
        } else if (strcmp(a, "--decode") == 0) {
            do_decode = true;
        } else if (strcmp(a, "--skip-special") == 0) {
            with_special = false;
        } else {
            fprintf(stderr, "kvgw tokenize: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return KVGW_EXIT_USAGE;
        }
    }
    if ((model == NULL) == (tj == NULL) || (cfg != NULL && tj == NULL)) {
        fprintf(stderr, "kvgw tokenize: give exactly one of --model and --tokenizer\n");
        usage(stderr);
        return KVGW_EXIT_USAGE;
    }
    char err[512] = "";
    eng_tok_t *t = NULL;
    int rc = load(model, tj, cfg, &t, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "kvgw tokenize: %s\n", err[0] ? err : pc_strerror(rc));
        return KVGW_EXIT_FAIL;
    }
    pc_buf_t in = PC_BUF_INIT;
    int ret;
    if ((rc = read_all(stdin, &in)) != 0) {
        fprintf(stderr, "kvgw tokenize: reading stdin: %s\n", pc_strerror(rc));
        ret = KVGW_EXIT_FAIL;
    } else {
        ret = do_decode ? decode(t, &in, with_special) : encode(t, &in);
    }
    if (ret == KVGW_EXIT_OK && fflush(stdout) != 0) {
        fprintf(stderr, "kvgw tokenize: write failed\n");
        ret = KVGW_EXIT_FAIL;
    }
    pc_buf_free(&in);
    eng_tok_free(t);
    return ret;
}
