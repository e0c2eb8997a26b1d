/*
 * cmd_mkmodel.c — `kvgw mkmodel`: write a test model with deterministic random weights and a
 * real tokenizer (DESIGN.md §6). The generator is engine/mkmodel.h; this file parses options.
 *
 *   kvgw mkmodel --arch llama --layers 2 --dim 256 --heads 8 --kv-heads 2 --ff 704 \
 *       --dtype f16 --tokenizer tokenizer.json [--tokenizer-config tokenizer_config.json] \
 *       --seed 1 --out models/kvgw-demo.gguf
 */
#include "cli.h"
#include "common.h"
#include "gguf.h"
#include "hparams.h"
#include "mkmodel.h"
#include "progress.h"
#include "vocab.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: kvgw mkmodel [--arch llama|qwen2|qwen3] [--layers N] [--dim D] [--heads H] "
               "[--kv-heads K] [--ff F] [--dtype "
               "f32|f16|bf16|q8_0|q4_0|q5_0|q5_1|q4_k|q5_k|q6_k|q4_k_m|q5_k_m] "
               "--tokenizer tokenizer.json "
               "[--tokenizer-config tokenizer_config.json] [--seed S] --out FILE\n");
}

static void help(void)
{
    eng_mkmodel_params_t d = eng_mkmodel_params_default();
    usage(stdout);
    printf("\nWrites a GGUF model of the given shape with deterministic pseudo-random weights\n"
           "(same options and tokenizer: identical bytes) and the tokenizer and chat template\n"
           "of a Hugging Face tokenizer.json, following llama.cpp's GGUF conventions.\n\n"
           "  --arch A               llama (default), qwen2 (q/k/v biases), qwen3 (q/k norms)\n"
           "  --layers N             transformer blocks (default %" PRIu32 ")\n"
           "  --dim D                embedding width (default %" PRIu32 ")\n"
           "  --heads H              attention heads (default %" PRIu32 ")\n"
           "  --kv-heads K           key/value heads, dividing H (default %" PRIu32 ")\n"
           "  --ff F                 feed-forward width (default %" PRIu32 ")\n"
           "  --head-dim N           head size when not D / H (written as key_length)\n"
           "  --dtype T              weight matrices: f32 (default), f16, bf16, q8_0, q4_0,\n"
           "                         q5_0, q5_1, q4_k, q5_k, q6_k, or q4_k_m / q5_k_m\n"
           "                         (llama.cpp's mixes: Q6_K for the output head and some\n"
           "                         attn_v / ffn_down, Q4_K / Q5_K else; rows that are not\n"
           "                         whole 256s Q5_0 / Q5_1 / Q8_0 as llama.cpp does);\n"
           "                         norms and biases are always f32\n"
           "  --ctx N                training context length (default %" PRIu32 ")\n"
           "  --rope-theta F         RoPE base frequency (default %g)\n"
           "  --rms-eps F            RMSNorm epsilon (default %g)\n"
           "  --tied                 no output.weight: logits reuse token_embd.weight\n"
           "  --qk-norm              per-head q/k RMSNorm, i.e. --arch qwen3\n"
           "  --rope-freqs           add rope_freqs.weight (Llama 3.1 RoPE scaling)\n"
           "  --seed S               weight seed (default %" PRIu64 ")\n"
           "  --name NAME            general.name (default kvgw-test)\n"
           "  --alignment N          data alignment, a power of two >= 8 (default 32)\n"
           "  --tokenizer FILE       tokenizer.json (required)\n"
           "  --tokenizer-config F   tokenizer_config.json: chat template, bos/eos, add_bos\n"
           "  --out FILE             output path (written via FILE.tmp, then renamed)\n",
           d.n_layer, d.n_embd, d.n_head, d.n_head_kv, d.n_ff, d.n_ctx, (double)d.rope_theta,
           (double)d.rms_eps, d.seed);
}

static int bad(const char *opt, const char *val, const char *why)
{
    fprintf(stderr, "kvgw mkmodel: %s '%s': %s\n", opt, val, why);
    usage(stderr);
    return KVGW_EXIT_USAGE;
}

static bool parse_f32(const char *s, float *out)
{
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v))
        return false;
    *out = (float)v;
    return true;
}

int kvgw_cmd_mkmodel(int argc, char **argv)
{
    eng_mkmodel_params_t p = eng_mkmodel_params_default();
    const char *tokenizer = NULL, *config = NULL, *out = NULL;
    bool qk_norm = false;
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i];
        if (strcmp(opt, "--help") == 0 || strcmp(opt, "-h") == 0) {
            help();
            return KVGW_EXIT_OK;
        }
        if (strcmp(opt, "--tied") == 0) {
            p.tied = true;
            continue;
        }
        if (strcmp(opt, "--qk-norm") == 0) {
            qk_norm = true;
            continue;
        }
        if (strcmp(opt, "--rope-freqs") == 0) {
            p.rope_freqs = true;
            continue;
        }
        const char *val = kvgw_cli_value(argc, argv, &i, "kvgw mkmodel", usage);
        if (val == NULL)
            return KVGW_EXIT_USAGE;
        uint64_t u = 0;
        struct {
            const char *name;
            uint32_t *dst;
        } u32opts[] = {
            {"--layers", &p.n_layer},    {"--dim", &p.n_embd},
            {"--heads", &p.n_head},      {"--kv-heads", &p.n_head_kv},
            {"--ff", &p.n_ff},           {"--ctx", &p.n_ctx},
            {"--head-dim", &p.head_dim}, {"--alignment", &p.alignment},
        };
        bool done = false;
        for (size_t k = 0; k < PC_ARRAY_LEN(u32opts) && !done; k++) {
            if (strcmp(opt, u32opts[k].name) != 0)
                continue;
            if (kvgw_cli_parse_u64(val, UINT32_MAX, &u) != 0)
                return bad(opt, val, "expected an unsigned integer");
            *u32opts[k].dst = (uint32_t)u;
            done = true;
        }
        if (done)
            continue;
        if (strcmp(opt, "--arch") == 0) {
            if (strcmp(val, "llama") == 0)
                p.arch = ENG_ARCH_LLAMA;
            else if (strcmp(val, "qwen2") == 0)
                p.arch = ENG_ARCH_QWEN2;
            else if (strcmp(val, "qwen3") == 0)
                p.arch = ENG_ARCH_QWEN3;
            else
                return bad(opt, val, "expected llama, qwen2 or qwen3");
        } else if (strcmp(opt, "--dtype") == 0) {
            if (eng_mkmodel_dtype_parse(val, &p.dtype) != 0)
                return bad(opt, val, "expected one of " ENG_MKMODEL_DTYPES);
        } else if (strcmp(opt, "--seed") == 0) {
            if (kvgw_cli_parse_u64(val, UINT64_MAX, &p.seed) != 0)
                return bad(opt, val, "expected an unsigned integer");
        } else if (strcmp(opt, "--rope-theta") == 0) {
            if (!parse_f32(val, &p.rope_theta))
                return bad(opt, val, "expected a number");
        } else if (strcmp(opt, "--rms-eps") == 0) {
            if (!parse_f32(val, &p.rms_eps))
                return bad(opt, val, "expected a number");
        } else if (strcmp(opt, "--name") == 0) {
            p.name = val;
        } else if (strcmp(opt, "--tokenizer") == 0) {
            tokenizer = val;
        } else if (strcmp(opt, "--tokenizer-config") == 0) {
            config = val;
        } else if (strcmp(opt, "--out") == 0) {
            out = val;
        } else {
            fprintf(stderr, "kvgw mkmodel: unknown option '%s'\n", opt);
            usage(stderr);
            return KVGW_EXIT_USAGE;
        }
    }
    if (tokenizer == NULL || out == NULL) {
        fprintf(stderr, "kvgw mkmodel: %s is required\n",
                tokenizer == NULL ? "--tokenizer" : "--out");
        usage(stderr);
        return KVGW_EXIT_USAGE;
    }
    if (qk_norm) {
        if (p.arch == ENG_ARCH_LLAMA) {
            fprintf(stderr, "kvgw mkmodel: --qk-norm needs --arch qwen2 or qwen3\n");
            usage(stderr);
            return KVGW_EXIT_USAGE;
        }
        p.arch = ENG_ARCH_QWEN3;
    }
    char err[512];
    if (eng_mkmodel_check(&p, err, sizeof err) != 0) {
        fprintf(stderr, "kvgw %s\n", err);
        usage(stderr);
        return KVGW_EXIT_USAGE;
    }

    uint64_t t0 = pc_time_mono_ns();
    eng_vocab_t *v = NULL;
    int rc = eng_vocab_from_tokenizer_json(tokenizer, config, &v, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "kvgw mkmodel: %s\n", err);
        return KVGW_EXIT_FAIL;
    }
    char what[320];
    snprintf(what, sizeof what, "kvgw mkmodel: writing %s", out);
    kvgw_progress_t pr;
    kvgw_progress_begin(&pr, what, NULL);
    p.progress = kvgw_progress_cb_u64;
    p.progress_ud = &pr;
    rc = eng_mkmodel_write(&p, v, out, err, sizeof err);
    kvgw_progress_end(&pr);
    uint32_t n_vocab = v->n_tokens;
    eng_vocab_free(v);
    if (rc != 0) {
        fprintf(stderr, "kvgw mkmodel: %s\n", err);
        return KVGW_EXIT_FAIL;
    }
    struct stat st;
    double mb = stat(out, &st) == 0 ? (double)st.st_size / (1024.0 * 1024.0) : 0.0;
    double secs = (double)(pc_time_mono_ns() - t0) / 1e9;
    printf("wrote %s: %s, %" PRIu32 " layers, dim %" PRIu32 ", %" PRIu32 "/%" PRIu32
           " heads, ff %" PRIu32 ", vocab %" PRIu32 ", %s%s, %.1f MiB in %.2f s\n",
           out, eng_arch_name(p.arch), p.n_layer, p.n_embd, p.n_head, p.n_head_kv, p.n_ff, n_vocab,
           eng_mkmodel_dtype_name(p.dtype), p.tied ? ", tied" : "", mb, secs);
    return KVGW_EXIT_OK;
}
