/*
 * test_kv_q8_0_accuracy.c — what q8_0 KV costs in accuracy on the generated test models
 * (models/kvgw-demo.gguf: llama, head size 32; models/kvgw-qwen-test.gguf: qwen2, head size 32),
 * measured the way the issue asks: per position, the log-probability of the text's next token
 * with q8_0 KV against the same engine with F32 KV (max and mean |delta|), the mean KL
 * divergence of the whole next-token distribution (llama.cpp's measure: PR 7412 reports KLD
 * 0.00098 for q8_0 K and V on wikitext), and the top-1 agreement (the argmax of both runs), over
 * long prompts (the repository's own documentation, tokenized by the model's tokenizer, 2048 tokens
 * each). F16 KV against F32 is printed beside it: the spread the default cache already has. The
 * figures are printed; the bounds asserted are loose (the quantization may move a log-probability
 * by a few hundredths, never flip most of the argmaxes).
 *
 * Skipped when the generated models are missing (scripts/models.sh).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "pc_alloc.h"
#include "pc_assert.h"
#include "pc_err.h"
#include "pc_test.h"
#include "tokenizer.h"
#include "vocab.h"

enum { N_TOK = 2048, STEP = 64 };

/* The three engines of one model (f32, f16, q8_0 KV) run the same tokens in lockstep; per
 * position: the log-probability of the next token under each, each argmax, and the KL
 * divergence of f16's and q8_0's distributions from f32's. */
typedef struct acc {
    double lp_max[3], lp_sum[3], kld_sum[3], kld_max[3];
    uint32_t agree[3], n_pos;
} acc_t;

static const enum eng_kv_dtype dts[3] = {ENG_KV_F32, ENG_KV_F16, ENG_KV_Q8_0};

static int run(const char *path, const uint32_t *toks, uint32_t n, acc_t *acc)
{
    eng_t *e[3] = {NULL, NULL, NULL};
    eng_seq_t *s[3] = {NULL, NULL, NULL};
    float *lg[3] = {NULL, NULL, NULL};
    double *lsm = NULL;
    int rc = 0;
    uint32_t V = 0;
    for (int d = 0; d < 3 && rc == 0; d++) {
        eng_params_t p = eng_params_default();
        p.model_path = path;
        p.kv_dtype = dts[d];
        p.kv_max_tokens = n + 64;
        p.max_batch_tokens = STEP;
        char err[256];
        rc = eng_init(&p, &e[d], err, sizeof err);
        if (rc != 0) {
            fprintf(stderr, "  eng_init: %s\n", err);
            break;
        }
        V = eng_n_vocab(e[d]);
        lg[d] = pc_xmalloc((size_t)STEP * V * sizeof(float));
        rc = eng_seq_create(e[d], &s[d]);
    }
    if (rc == 0)
        lsm = pc_xmalloc(3 * (size_t)V * sizeof *lsm);
    for (uint32_t i = 0; rc == 0 && i + 1 < n; i += STEP) {
        uint32_t k = PC_MIN(STEP, n - 1 - i);
        for (int d = 0; d < 3 && rc == 0; d++) {
            eng_batch_item_t it = {.seq = s[d],
                                   .tokens = (const int32_t *)toks + i,
                                   .n_tokens = k,
                                   .logits = ENG_LOGITS_ALL};
            rc = eng_forward(e[d], &it, 1, lg[d]);
        }
        for (uint32_t j = 0; rc == 0 && j < k; j++) {
            uint32_t top[3];
            for (int d = 0; d < 3; d++) { /* log-softmax of the row, in double */
                const float *row = lg[d] + (size_t)j * V;
                double *ls = lsm + (size_t)d * V, mx = -INFINITY, sum = 0;
                for (uint32_t v = 0; v < V; v++)
                    if (row[v] > mx)
                        mx = row[v], top[d] = v;
                for (uint32_t v = 0; v < V; v++)
                    sum += exp((double)row[v] - mx);
                double lz = mx + log(sum);
                for (uint32_t v = 0; v < V; v++)
                    ls[v] = (double)row[v] - lz;
            }
            uint32_t next = toks[i + j + 1];
            for (int d = 1; d < 3; d++) {
                double dl = fabs(lsm[(size_t)d * V + next] - lsm[next]), kld = 0;
                for (uint32_t v = 0; v < V; v++)
                    kld += exp(lsm[v]) * (lsm[v] - lsm[(size_t)d * V + v]);
                acc->lp_max[d] = PC_MAX(acc->lp_max[d], dl);
                acc->lp_sum[d] += dl;
                acc->kld_max[d] = PC_MAX(acc->kld_max[d], kld);
                acc->kld_sum[d] += kld;
                acc->agree[d] += top[d] == top[0];
            }
            acc->n_pos++;
        }
    }
    for (int d = 0; d < 3; d++) {
        if (e[d] != NULL)
            eng_seq_free(e[d], s[d]);
        eng_free(e[d]);
        pc_free(lg[d]);
    }
    pc_free(lsm);
    return rc;
}

/* The documentation as tokens: n tokens starting at token `from` of the concatenated files. */
static int doc_tokens(const char *model, uint32_t from, uint32_t n, uint32_t *out)
{
    static const char *const files[] = {"README.md", "docs/ARCHITECTURE.md", "conf/README.md"};
    size_t cap = 0, len = 0;
    char *text = NULL;
    for (size_t i = 0; i < PC_ARRAY_LEN(files); i++) {
        FILE *f = fopen(files[i], "rb");
        if (f == NULL)
            continue;
        char buf[65536];
        size_t k;
        while ((k = fread(buf, 1, sizeof buf, f)) > 0) {
            if (len + k > cap) {
                cap = (len + k) * 2;
                text = pc_xrealloc(text, cap);
            }
            memcpy(text + len, buf, k);
            len += k;
        }
        fclose(f);
    }
    eng_gguf_t *g = NULL;
    eng_vocab_t *v = NULL;
    eng_tok_t *t = NULL;
    char err[256];
    uint32_t *ids = NULL;
    size_t n_ids = 0, ids_cap = 0;
    int rc = eng_gguf_open(model, &g, err, sizeof err);
    if (rc == 0)
        rc = eng_vocab_from_gguf(g, &v, err, sizeof err);
    if (rc == 0)
        rc = eng_tok_init(v, &t, err, sizeof err);
    if (rc == 0)
        rc = eng_tok_encode(t, text, len, &ids, &n_ids, &ids_cap);
    if (rc == 0 && n_ids < (size_t)from + n)
        rc = PC_ERR_INVAL;
    if (rc == 0)
        memcpy(out, ids + from, n * sizeof *out);
    else
        fprintf(stderr, "  tokens: %s (%zu)\n", err, n_ids);
    pc_free(ids);
    pc_free(text);
    eng_tok_free(t);
    eng_vocab_free(v);
    eng_gguf_free(g);
    return rc;
}

static void measure(const char *path, const char *arch)
{
    uint32_t *toks = pc_xmalloc(N_TOK * sizeof *toks);
    acc_t acc;
    memset(&acc, 0, sizeof acc);
    /* Two prompts: the first 2048 tokens of the text and the 2048 after them. */
    for (uint32_t pr = 0; pr < 2; pr++) {
        ASSERT_EQ(doc_tokens(path, pr * N_TOK, N_TOK, toks), 0);
        ASSERT_EQ(run(path, toks, N_TOK, &acc), 0);
    }
    for (int d = 1; d < 3; d++) {
        double mean = acc.lp_sum[d] / acc.n_pos, agreement = (double)acc.agree[d] / acc.n_pos;
        fprintf(stderr,
                "  %s %s KV vs f32 KV over %u positions: |delta log-prob| of the next token max "
                "%.4f mean %.5f; KL(f32 || %s) mean %.6f max %.5f; top-1 agreement %.4f\n",
                arch, eng_kv_dtype_name(dts[d]), acc.n_pos, acc.lp_max[d], mean,
                eng_kv_dtype_name(dts[d]), acc.kld_sum[d] / acc.n_pos, acc.kld_max[d], agreement);
        ASSERT_LE(mean, 0.05);
        ASSERT_LE(acc.lp_max[d], 1.0);
        ASSERT_TRUE(agreement >= 0.9);
    }
    pc_free(toks);
}

PC_TEST(q8_0_vs_f32_kv_log_probs)
{
    static const char *const models[][2] = {{"models/kvgw-demo.gguf", "llama (demo)"},
                                            {"models/kvgw-qwen-test.gguf", "qwen2 (qwen test)"}};
    for (size_t i = 0; i < PC_ARRAY_LEN(models); i++)
        if (access(models[i][0], R_OK) != 0)
            PC_SKIP("the generated models are missing (scripts/models.sh)");
    for (size_t i = 0; i < PC_ARRAY_LEN(models); i++)
        PC_TEST_CALL(measure(models[i][0], models[i][1]));
}

PC_TEST_MAIN()
