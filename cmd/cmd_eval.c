/*
 * cmd_eval.c — `kvgw eval`: the logits of every position of a token sequence (DESIGN.md §6),
 * so anyone can compare the engine with another implementation.
 *
 *   kvgw eval --model FILE --tokens FILE --logits OUT [--prefix-cached N] [--threads N]
 *             [--kv-dtype f16|f32|q8_0]
 *
 * --tokens names a JSON array of token ids. OUT receives raw little-endian float32 logits,
 * [n_tokens][n_vocab], row i being the distribution after tokens[0..i]. With --prefix-cached N
 * the same logits go through the cache path: the first N tokens are computed and cached in a
 * namespace, then a second sequence starts from that cache (reusing up to N tokens) and
 * computes the rest; rows 0..N-1 come from the first pass.
 */
#include "cli.h"
#include "common.h"
#include "engine.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Rows computed per forward call: bounds the logits buffer (rows * n_vocab floats). */
#define EVAL_ROWS 64

static void usage(FILE *f)
{
    fprintf(f, "usage: kvgw eval --model FILE --tokens FILE --logits OUT [--prefix-cached N] "
               "[--threads N] [--kv-dtype f16|f32|q8_0] [--gemm auto|f32|bf16]\n");
}

static void help(void)
{
    usage(stdout);
    printf("\nRuns the engine over the token ids in --tokens (a JSON array) and writes the logits\n"
           "of every position to OUT as raw little-endian float32, [n_tokens][n_vocab].\n\n"
           "  --prefix-cached N  compute and cache the first N tokens, then compute the rest\n"
           "                     in a new sequence that reuses them (the cache path)\n"
           "  --threads N        compute threads (default 2)\n"
           "  --kv-dtype T       KV cache element type: f16 (default), f32, or q8_0 (ggml's\n"
           "                     8-bit blocks, 34/64 of f16's bytes; head size a multiple of 32)\n"
           "  --gemm M           prefill GEMM precision: auto (default: bf16 for F16/BF16\n"
           "                     weights on CPUs with AVX512-BF16, logits within ~1e-2 of f32),\n"
           "                     f32 (exact F32 products), or bf16; quantized weights take\n"
           "                     integer products on 8-bit x in every mode, as llama.cpp does\n");
}

/* Reads the JSON array of ids. Returns 0 or 1 with the reason on stderr. */
static int read_tokens(const char *path, uint32_t n_vocab, int32_t **out, uint32_t *n_out)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        fprintf(stderr, "kvgw eval: %s: %s (line %d)\n", path, jerr.text, jerr.line);
        return 1;
    }
    if (!json_is_array(root) || json_array_size(root) == 0 ||
        json_array_size(root) > UINT32_MAX / 2) {
        fprintf(stderr, "kvgw eval: %s: expected a non-empty JSON array of token ids\n", path);
        json_decref(root);
        return 1;
    }
    uint32_t n = (uint32_t)json_array_size(root);
    int32_t *t = pc_xmalloc(n * sizeof *t);
    for (uint32_t i = 0; i < n; i++) {
        json_t *v = json_array_get(root, i);
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (!json_is_integer(v) || id < 0 || (uint64_t)id >= n_vocab) {
            fprintf(stderr, "kvgw eval: %s: element %u is not a token id below %u\n", path, i,
                    n_vocab);
            pc_free(t);
            json_decref(root);
            return 1;
        }
        t[i] = (int32_t)id;
    }
    json_decref(root);
    *out = t;
    *n_out = n;
    return 0;
}

/* Computes tokens[from..to) of s, writing every row's logits to f. */
static int run_rows(eng_t *e, eng_seq_t *s, const int32_t *tokens, uint32_t from, uint32_t to,
                    float *buf, FILE *f)
{
    uint32_t V = eng_n_vocab(e);
    for (uint32_t i = from; i < to; i += EVAL_ROWS) {
        uint32_t n = PC_MIN(EVAL_ROWS, to - i);
        eng_batch_item_t it = {
            .seq = s, .tokens = tokens + i, .n_tokens = n, .logits = ENG_LOGITS_ALL};
        int rc = eng_forward(e, &it, 1, buf);
        if (rc != 0) {
            fprintf(stderr, "kvgw eval: forward failed at position %u: %s\n", i,
                    rc == 1 ? "the KV cache is full" : pc_strerror(rc));
            return 1;
        }
        if (fwrite(buf, sizeof(float), (size_t)n * V, f) != (size_t)n * V) {
            fprintf(stderr, "kvgw eval: write failed: %s\n", strerror(errno));
            return 1;
        }
    }
    return 0;
}

int kvgw_cmd_eval(int argc, char **argv)
{
    const char *model = NULL, *tokens_path = NULL, *out_path = NULL;
    uint32_t prefix = 0, threads = 2;
    bool have_prefix = false;
    enum eng_kv_dtype kv = ENG_KV_F16;
    enum eng_gemm_mode gemm = ENG_GEMM_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            help();
            return KVGW_EXIT_OK;
        }
        const char *v = kvgw_cli_value(argc, argv, &i, "kvgw eval", usage);
        if (v == NULL)
            return KVGW_EXIT_USAGE;
        if (strcmp(a, "--model") == 0) {
            model = v;
        } else if (strcmp(a, "--tokens") == 0) {
            tokens_path = v;
        } else if (strcmp(a, "--logits") == 0) {
            out_path = v;
        } else if (strcmp(a, "--prefix-cached") == 0) {
            uint64_t n;
            if (kvgw_cli_parse_u64(v, UINT32_MAX / 2, &n) != 0) {
                fprintf(stderr, "kvgw eval: --prefix-cached: '%s' is not a count\n", v);
                usage(stderr);
                return KVGW_EXIT_USAGE;
            }
            prefix = (uint32_t)n;
            have_prefix = true;
        } else if (strcmp(a, "--threads") == 0) {
            uint64_t n;
            if (kvgw_cli_parse_u64(v, 256, &n) != 0 || n == 0) {
                fprintf(stderr, "kvgw eval: --threads: '%s' is not in 1..256\n", v);
                usage(stderr);
                return KVGW_EXIT_USAGE;
            }
            threads = (uint32_t)n;
        } else if (strcmp(a, "--kv-dtype") == 0) {
            if (eng_kv_dtype_parse(v, &kv) != 0) {
                fprintf(stderr, "kvgw eval: --kv-dtype: '%s' is not f16, f32 or q8_0\n", v);
                usage(stderr);
                return KVGW_EXIT_USAGE;
            }
        } else if (strcmp(a, "--gemm") == 0) {
            if (eng_gemm_mode_parse(v, &gemm) != 0) {
                fprintf(stderr, "kvgw eval: --gemm: '%s' is not auto, f32 or bf16\n", v);
                usage(stderr);
                return KVGW_EXIT_USAGE;
            }
        } else {
            fprintf(stderr, "kvgw eval: unknown option '%s'\n", a);
            usage(stderr);
            return KVGW_EXIT_USAGE;
        }
    }
    if (model == NULL || tokens_path == NULL || out_path == NULL) {
        fprintf(stderr, "kvgw eval: --model, --tokens and --logits are required\n");
        usage(stderr);
        return KVGW_EXIT_USAGE;
    }

    int ret = KVGW_EXIT_FAIL;
    eng_t *e = NULL;
    eng_seq_t *s = NULL, *s2 = NULL;
    int32_t *tokens = NULL;
    float *buf = NULL;
    FILE *f = NULL;
    uint32_t n = 0;
    char err[512];
    eng_params_t p = eng_params_default();
    p.model_path = model;
    p.n_threads = threads;
    p.kv_dtype = kv;
    p.gemm = gemm;
    p.kv_max_tokens = 0;
    p.kv_max_bytes = 0;
    /* The KV pool holds the sequence twice (the cache path's two sequences); the ids are
     * validated against the vocabulary once the model is loaded. */
    json_error_t jerr;
    json_t *peek = json_load_file(tokens_path, 0, &jerr);
    if (peek == NULL) {
        fprintf(stderr, "kvgw eval: %s: %s (line %d)\n", tokens_path, jerr.text, jerr.line);
        return KVGW_EXIT_FAIL;
    }
    size_t n_peek = json_is_array(peek) ? json_array_size(peek) : 0;
    json_decref(peek);
    p.kv_max_tokens = 2 * (uint64_t)n_peek + 64;
    if (eng_init(&p, &e, err, sizeof err) != 0) {
        fprintf(stderr, "kvgw eval: %s\n", err);
        return KVGW_EXIT_FAIL;
    }
    if (read_tokens(tokens_path, eng_n_vocab(e), &tokens, &n) != 0)
        goto done;
    if (have_prefix && (prefix == 0 || prefix > n)) {
        fprintf(stderr, "kvgw eval: --prefix-cached %u must be in 1..%u (the token count)\n",
                prefix, n);
        goto done;
    }
    if (n > eng_hparams(e)->n_ctx_train) {
        fprintf(stderr, "kvgw eval: %u tokens exceed the model's context length %u\n", n,
                eng_hparams(e)->n_ctx_train);
        goto done;
    }
    buf = pc_xmalloc((size_t)EVAL_ROWS * eng_n_vocab(e) * sizeof(float));
    f = fopen(out_path, "wb");
    if (f == NULL) {
        fprintf(stderr, "kvgw eval: %s: %s\n", out_path, strerror(errno));
        goto done;
    }
    if (eng_seq_create(e, &s) != 0)
        goto done;
    if (!have_prefix) {
        if (run_rows(e, s, tokens, 0, n, buf, f) != 0)
            goto done;
    } else {
        /* Pass 1: the prefix, cached. Pass 2: a fresh sequence reusing it. */
        const uint64_t ns = 1;
        if (run_rows(e, s, tokens, 0, prefix, buf, f) != 0)
            goto done;
        if (eng_prefix_insert(e, s, ns, prefix) != 0 || eng_seq_create(e, &s2) != 0)
            goto done;
        eng_seq_free(e, s);
        s = NULL;
        if (prefix < n) {
            uint32_t reused = 0;
            if (eng_seq_start_cached(e, s2, ns, tokens, n, &reused) != 0)
                goto done;
            if (reused != prefix) {
                fprintf(stderr, "kvgw eval: the cache returned %u of %u prefix tokens\n", reused,
                        prefix);
                goto done;
            }
            if (run_rows(e, s2, tokens, prefix, n, buf, f) != 0)
                goto done;
        }
    }
    if (fflush(f) != 0 || ferror(f)) {
        fprintf(stderr, "kvgw eval: write failed: %s\n", strerror(errno));
        goto done;
    }
    ret = KVGW_EXIT_OK;
done:
    if (f != NULL && fclose(f) != 0 && ret == KVGW_EXIT_OK) {
        fprintf(stderr, "kvgw eval: %s: %s\n", out_path, strerror(errno));
        ret = KVGW_EXIT_FAIL;
    }
    if (ret != KVGW_EXIT_OK && f != NULL)
        remove(out_path);
    eng_seq_free(e, s);
    eng_seq_free(e, s2);
    eng_free(e);
    pc_free(tokens);
    pc_free(buf);
    return ret;
}
