/*
 * eng_testmodel.h — small generated models for the engine tests, and a deliberately naive
 * double-precision reference forward pass to compare the engine with.
 *
 * The models come from the real generator (engine/mkmodel.c) with a synthetic vocabulary of
 * n_vocab plain tokens, so they are small and fast. The reference reads the GGUF file directly
 * (F32 weights, or any type the engine computes, dequantized by quant.c's reference to the exact
 * values the file holds), keeps no KV cache and recomputes the whole sequence: every position's
 * logits in one pass, with textbook formulas (its own RoPE, softmax, RMSNorm) that share no code
 * with the engine.
 */
#ifndef ENG_TESTMODEL_H
#define ENG_TESTMODEL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "hparams.h"
#include "mkmodel.h"
#include "pc_alloc.h"
#include "quant.h"
#include "vocab.h"

/* Writes a model with arch/shape from p and a synthetic vocabulary into a temporary file whose
 * path is written to path[len]. Returns 0 or an error (reason in err). */
static int tm_make(eng_mkmodel_params_t *p, uint32_t n_vocab, char *path, size_t len, char *err,
                   size_t err_len)
{
    eng_vocab_t *v = pc_calloc(1, sizeof *v);
    if (v == NULL)
        return -1;
    v->bos_id = v->eos_id = v->eot_id = v->eom_id = v->pad_id = v->unk_id = -1;
    v->model = pc_strdup("gpt2");
    v->pre = pc_strdup("default");
    v->n_tokens = n_vocab;
    v->tokens = pc_calloc(n_vocab, sizeof *v->tokens);
    for (uint32_t i = 0; i < n_vocab; i++) {
        char t[32];
        snprintf(t, sizeof t, "tok%u", i);
        v->tokens[i] = pc_strdup(t);
    }
    static int counter;
    snprintf(path, len, "/tmp/kvgw-engtest-%d-%d.gguf", (int)getpid(), counter++);
    int rc = eng_mkmodel_write(p, v, path, err, err_len);
    eng_vocab_free(v);
    return rc;
}

typedef struct tm_ref {
    eng_gguf_t *g;
    eng_hparams_t hp;
} tm_ref_t;

/* A tensor's elements as doubles (its exact values: quantized types through quant.c's reference
 * dequantization, which test_quant checks against llama.cpp's); NULL when absent. Caller frees. */
static double *tm_tensor(const tm_ref_t *r, const char *name)
{
    const eng_gguf_tensor_t *t = eng_gguf_tensor_find(r->g, name);
    if (t == NULL || !eng_quant_type_computed(t->type))
        return NULL;
    double *d = malloc((size_t)t->n_elements * sizeof *d);
    float *f = malloc((size_t)t->n_elements * sizeof *f);
    eng_quant_row_to_f32(t->type, t->data, f, (size_t)t->n_elements);
    for (int64_t i = 0; i < t->n_elements; i++)
        d[i] = f[i];
    free(f);
    return d;
}

static double *tm_layer_tensor(const tm_ref_t *r, int l, const char *suffix)
{
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", l, suffix);
    return tm_tensor(r, name);
}

/* y[n][out] = x[n][in] . W^T (W [out][in]) */
static void tm_matmul(const double *x, int n, int in, const double *w, int out, double *y)
{
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++) {
            double s = 0;
            for (int k = 0; k < in; k++)
                s += x[(size_t)i * in + k] * w[(size_t)o * in + k];
            y[(size_t)i * out + o] = s;
        }
}

static void tm_rmsnorm(double *x, int n, const double *w, double eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        x[i] = x[i] * s * w[i];
}

static void tm_rope(double *x, int pos, const tm_ref_t *r, const double *factors)
{
    int d = (int)r->hp.rope_dim, half = d / 2;
    bool neox = r->hp.rope_style == ENG_ROPE_NEOX;
    for (int i = 0; i < half; i++) {
        double theta = pos * pow(r->hp.rope_theta, -2.0 * i / d);
        if (factors != NULL)
            theta /= factors[i];
        int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        double x0 = x[a], x1 = x[b];
        x[a] = x0 * cos(theta) - x1 * sin(theta);
        x[b] = x0 * sin(theta) + x1 * cos(theta);
    }
}

/* Logits of every position of tokens[n] into out[n][n_vocab] (as float). */
static int tm_reference(const char *path, const int32_t *tokens, int n, float *out)
{
    tm_ref_t r;
    char err[256];
    if (eng_gguf_open(path, &r.g, err, sizeof err) != 0 ||
        eng_hparams_from_gguf(r.g, &r.hp, err, sizeof err) != 0) {
        fprintf(stderr, "reference: %s\n", err);
        return -1;
    }
    const eng_hparams_t *hp = &r.hp;
    int D = (int)hp->n_embd, H = (int)hp->n_head, HK = (int)hp->n_head_kv, hd = (int)hp->head_dim;
    int F = (int)hp->n_ff, V = (int)hp->n_vocab;
    double *emb = tm_tensor(&r, "token_embd.weight");
    double *outw = hp->tied_embeddings ? emb : tm_tensor(&r, "output.weight");
    double *onorm = tm_tensor(&r, "output_norm.weight");
    double *factors = hp->has_rope_freqs ? tm_tensor(&r, "rope_freqs.weight") : NULL;
    double *x = calloc((size_t)n * D, sizeof *x), *h = calloc((size_t)n * D, sizeof *h);
    double *q = calloc((size_t)n * H * hd, sizeof *q), *k = calloc((size_t)n * HK * hd, sizeof *k);
    double *v = calloc((size_t)n * HK * hd, sizeof *v), *att = calloc((size_t)n * H * hd, 8);
    double *o = calloc((size_t)n * D, sizeof *o), *g = calloc((size_t)n * F, sizeof *g);
    double *u = calloc((size_t)n * F, sizeof *u), *sc = calloc((size_t)n, sizeof *sc);
    for (int i = 0; i < n; i++)
        memcpy(x + (size_t)i * D, emb + (size_t)tokens[i] * D, D * sizeof *x);
    for (int l = 0; l < (int)hp->n_layer; l++) {
        double *an = tm_layer_tensor(&r, l, "attn_norm.weight");
        double *wq = tm_layer_tensor(&r, l, "attn_q.weight");
        double *wk = tm_layer_tensor(&r, l, "attn_k.weight");
        double *wv = tm_layer_tensor(&r, l, "attn_v.weight");
        double *wo = tm_layer_tensor(&r, l, "attn_output.weight");
        double *fn = tm_layer_tensor(&r, l, "ffn_norm.weight");
        double *wg = tm_layer_tensor(&r, l, "ffn_gate.weight");
        double *wu = tm_layer_tensor(&r, l, "ffn_up.weight");
        double *wd = tm_layer_tensor(&r, l, "ffn_down.weight");
        double *bq = tm_layer_tensor(&r, l, "attn_q.bias");
        double *bk = tm_layer_tensor(&r, l, "attn_k.bias");
        double *bv = tm_layer_tensor(&r, l, "attn_v.bias");
        double *qn = tm_layer_tensor(&r, l, "attn_q_norm.weight");
        double *kn = tm_layer_tensor(&r, l, "attn_k_norm.weight");
        memcpy(h, x, (size_t)n * D * sizeof *h);
        for (int i = 0; i < n; i++)
            tm_rmsnorm(h + (size_t)i * D, D, an, hp->rms_eps);
        tm_matmul(h, n, D, wq, H * hd, q);
        tm_matmul(h, n, D, wk, HK * hd, k);
        tm_matmul(h, n, D, wv, HK * hd, v);
        for (int i = 0; i < n; i++) {
            for (int j = 0; bq != NULL && j < H * hd; j++)
                q[(size_t)i * H * hd + j] += bq[j];
            for (int j = 0; bk != NULL && j < HK * hd; j++) {
                k[(size_t)i * HK * hd + j] += bk[j];
                v[(size_t)i * HK * hd + j] += bv[j];
            }
            for (int hh = 0; hh < H; hh++) {
                double *qh = q + (size_t)i * H * hd + (size_t)hh * hd;
                if (qn != NULL)
                    tm_rmsnorm(qh, hd, qn, hp->rms_eps);
                tm_rope(qh, i, &r, factors);
            }
            for (int hh = 0; hh < HK; hh++) {
                double *kh = k + (size_t)i * HK * hd + (size_t)hh * hd;
                if (kn != NULL)
                    tm_rmsnorm(kh, hd, kn, hp->rms_eps);
                tm_rope(kh, i, &r, factors);
            }
        }
        /* Causal attention, every query against every earlier key, plain softmax. */
        for (int i = 0; i < n; i++) {
            for (int hh = 0; hh < H; hh++) {
                int kvh = hh / (H / HK);
                const double *qh = q + (size_t)i * H * hd + (size_t)hh * hd;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    const double *kh = k + (size_t)j * HK * hd + (size_t)kvh * hd;
                    double s = 0;
                    for (int d = 0; d < hd; d++)
                        s += qh[d] * kh[d];
                    sc[j] = s / sqrt((double)hd);
                    mx = fmax(mx, sc[j]);
                }
                for (int j = 0; j <= i; j++) {
                    sc[j] = exp(sc[j] - mx);
                    sum += sc[j];
                }
                double *ah = att + (size_t)i * H * hd + (size_t)hh * hd;
                for (int d = 0; d < hd; d++) {
                    double a = 0;
                    for (int j = 0; j <= i; j++)
                        a += sc[j] / sum * v[(size_t)j * HK * hd + (size_t)kvh * hd + d];
                    ah[d] = a;
                }
            }
        }
        tm_matmul(att, n, H * hd, wo, D, o);
        for (size_t i = 0; i < (size_t)n * D; i++)
            x[i] += o[i];
        memcpy(h, x, (size_t)n * D * sizeof *h);
        for (int i = 0; i < n; i++)
            tm_rmsnorm(h + (size_t)i * D, D, fn, hp->rms_eps);
        tm_matmul(h, n, D, wg, F, g);
        tm_matmul(h, n, D, wu, F, u);
        for (size_t i = 0; i < (size_t)n * F; i++)
            g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
        tm_matmul(g, n, F, wd, D, o);
        for (size_t i = 0; i < (size_t)n * D; i++)
            x[i] += o[i];
        free(an), free(wq), free(wk), free(wv), free(wo), free(fn), free(wg), free(wu), free(wd);
        free(bq), free(bk), free(bv), free(qn), free(kn);
    }
    for (int i = 0; i < n; i++) {
        double *xi = x + (size_t)i * D;
        tm_rmsnorm(xi, D, onorm, hp->rms_eps);
        for (int t = 0; t < V; t++) {
            double s = 0;
            for (int d = 0; d < D; d++)
                s += xi[d] * outw[(size_t)t * D + d];
            out[(size_t)i * V + t] = (float)s;
        }
    }
    if (outw != emb)
        free(outw);
    free(emb), free(onorm), free(factors);
    free(x), free(h), free(q), free(k), free(v), free(att), free(o), free(g), free(u), free(sc);
    eng_gguf_free(r.g);
    return 0;
}

/* max |a - b| over rows, relative to the largest |b| of the row; the worst row's value. */
static double tm_rel_err(const float *a, const float *b, size_t n_rows, size_t n_cols)
{
    double worst = 0;
    for (size_t r = 0; r < n_rows; r++) {
        double mx = 0, diff = 0;
        for (size_t c = 0; c < n_cols; c++) {
            mx = fmax(mx, fabs((double)b[r * n_cols + c]));
            double d = fabs((double)a[r * n_cols + c] - (double)b[r * n_cols + c]);
            diff = isnan(d) ? INFINITY : fmax(diff, d);
        }
        worst = fmax(worst, diff / (mx > 0 ? mx : 1));
    }
    return worst;
}

#endif
