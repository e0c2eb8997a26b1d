/*
 * model.c — loading a decoder's weights from GGUF (see model.h).
 *
 * Tensor names follow llama.cpp: token_embd, output_norm, output, rope_freqs, and per layer
 * blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm, ffn_norm,
 * ffn_gate, ffn_up, ffn_down} with .weight (and .bias for the qwen2 q/k/v projections).
 * eng_hparams_check_tensors has validated every shape and type before this file reads them.
 */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cpu.h"      /* the row conversions to F32 */
#include "cpu_simd.h" /* eng__gemv_row_bytes */
#include "quant.h"
#include "pc_alloc.h"
#include "pc_assert.h"
#include "pc_err.h"

eng_model_params_t eng_model_params_default(void)
{
    return (eng_model_params_t){
        .weights_f32 = false, .copy_weights = true, .progress = NULL, .progress_ud = NULL};
}

static void *model_own(eng_model_t *m, size_t n_bytes)
{
    void *buf = pc_malloc(n_bytes ? n_bytes : 1);
    if (buf == NULL)
        return NULL;
    void **o = pc_reallocarray(m->_owned, m->_n_owned + 1, sizeof *o);
    if (o == NULL) {
        pc_free(buf);
        return NULL;
    }
    m->_owned = o;
    m->_owned[m->_n_owned++] = buf;
    return buf;
}

/* A buffer for weight data: on the model's huge pages when it copies weights, else owned heap. */
static void *model_own_weights(eng_model_t *m, size_t n_bytes)
{
    if (m->_pages.huge)
        return pc_pages_alloc(&m->_pages, n_bytes);
    return model_own(m, n_bytes);
}

/* Converts one tensor's elements to F32. */
static void tensor_to_f32(const eng_gguf_tensor_t *t, float *dst)
{
    int64_t n = t->n_elements;
    switch (t->type) {
    case ENG_GGML_TYPE_F32:
        memcpy(dst, t->data, (size_t)n * 4);
        break;
    case ENG_GGML_TYPE_F16:
        eng__f16_to_f32_row(t->data, dst, (size_t)n, eng__cpu_has_avx512());
        break;
    case ENG_GGML_TYPE_BF16:
        eng__port_bf16_to_f32(t->data, dst, (size_t)n);
        break;
    default:
        PC_ASSERT(eng_quant_type_is_quant(t->type));
        eng_quant_row_to_f32(t->type, t->data, dst, (size_t)n);
        break;
    }
}

static const eng_gguf_tensor_t *find(const eng_model_t *m, const char *fmt, int layer, char *err,
                                     size_t err_len)
{
    char name[ENG_GGUF_MAX_NAME + 1];
    if (layer >= 0)
        snprintf(name, sizeof name, fmt, layer);
    else
        snprintf(name, sizeof name, "%s", fmt);
    const eng_gguf_tensor_t *t = eng_gguf_tensor_find(m->_gguf, name);
    if (t == NULL)
        snprintf(err, err_len, "model: tensor %s missing", name);
    return t;
}

/* A norm or bias vector: F32 in place (hparams checked the type). */
static int load_vec(eng_model_t *m, const char *fmt, int layer, const float **out, char *err,
                    size_t err_len)
{
    const eng_gguf_tensor_t *t = find(m, fmt, layer, err, err_len);
    if (t == NULL)
        return PC_ERR_FORMAT;
    if (t->type != ENG_GGML_TYPE_F32) {
        float *buf = model_own(m, (size_t)t->n_elements * 4);
        if (buf == NULL)
            return PC_ERR_NOMEM;
        tensor_to_f32(t, buf);
        *out = buf;
        return 0;
    }
    *out = t->data;
    return 0;
}

/* Loads one matrix. A streamed one (read whole for every token) goes to the huge-page copies
 * when the model makes them; the embedding table of an untied model is only gathered a row at a
 * time and stays in the mapping. */
static int load_weight(eng_model_t *m, const eng_model_params_t *p, const char *fmt, int layer,
                       bool streamed, eng_weight_t *w, char *err, size_t err_len)
{
    bool copy = m->_pages.huge && streamed;
    const eng_gguf_tensor_t *t = find(m, fmt, layer, err, err_len);
    if (t == NULL)
        return PC_ERR_FORMAT;
    if (t->n_dims != 2 || t->ne[0] > UINT32_MAX || t->ne[1] > UINT32_MAX) {
        snprintf(err, err_len, "model: tensor %s is not a matrix", t->name);
        return PC_ERR_FORMAT;
    }
    w->n_in = (uint32_t)t->ne[0];
    w->n_out = (uint32_t)t->ne[1];
    w->file_type = t->type;
    uint32_t bs = eng_ggml_type_block_size(t->type);
    if (bs > 1 && w->n_in % bs != 0) {
        snprintf(err, err_len, "model: %s tensor %s has rows of %u elements, not whole blocks",
                 eng_ggml_type_name(t->type), t->name, w->n_in);
        return PC_ERR_FORMAT;
    }
    /* Kept as stored (a backend that computes with another layout makes it at its init), unless
     * the parameters ask for F32. */
    bool keep =
        t->type == ENG_GGML_TYPE_F32 || (eng_quant_type_computed(t->type) && !p->weights_f32);
    if (keep) {
        w->type = t->type;
        w->data = t->data;
        if (copy) {
            void *dst = pc_pages_alloc(&m->_pages, t->n_bytes);
            if (dst == NULL)
                return PC_ERR_NOMEM;
            memcpy(dst, t->data, t->n_bytes);
            eng_gguf_drop_resident(m->_gguf, t->data, t->n_bytes);
            w->data = dst;
        }
        m->_weight_bytes += t->n_bytes;
        return 0;
    }
    if (!eng_ggml_type_supported(t->type)) {
        snprintf(err, err_len, "model: unsupported tensor type %s in tensor %s",
                 eng_ggml_type_name(t->type) ? eng_ggml_type_name(t->type) : "?", t->name);
        return PC_ERR_UNSUPPORTED;
    }
    float *buf = model_own_weights(m, (size_t)t->n_elements * 4);
    if (buf == NULL)
        return PC_ERR_NOMEM;
    tensor_to_f32(t, buf);
    eng_gguf_drop_resident(m->_gguf, t->data, t->n_bytes);
    w->type = ENG_GGML_TYPE_F32;
    w->data = buf;
    m->_weight_bytes += (size_t)t->n_elements * 4;
    return 0;
}

int eng_model_load(const char *path, const eng_model_params_t *p, eng_model_t **out, char *err,
                   size_t err_len)
{
    *out = NULL;
    eng_model_t *m = pc_calloc(1, sizeof *m);
    if (m == NULL)
        return PC_ERR_NOMEM;
    int rc = eng_gguf_open(path, &m->_gguf, err, err_len);
    if (rc != 0)
        goto fail;
    rc = eng_hparams_from_gguf(m->_gguf, &m->hp, err, err_len);
    if (rc != 0)
        goto fail;
    rc = eng_hparams_check_tensors(m->_gguf, &m->hp, err, err_len);
    if (rc != 0)
        goto fail;
    const eng_hparams_t *hp = &m->hp;
    pc_pages_init(&m->_pages, p->copy_weights && pc_pages_huge_available());

    rc =
        load_weight(m, p, "token_embd.weight", -1, hp->tied_embeddings, &m->tok_embd, err, err_len);
    if (rc != 0)
        goto fail;
    rc = load_vec(m, "output_norm.weight", -1, &m->out_norm, err, err_len);
    if (rc != 0)
        goto fail;
    if (hp->tied_embeddings)
        m->output = m->tok_embd;
    else if ((rc = load_weight(m, p, "output.weight", -1, true, &m->output, err, err_len)) != 0)
        goto fail;

    uint32_t n_freq = hp->rope_dim / 2;
    m->rope_inv_freq = model_own(m, n_freq * sizeof(float));
    if (m->rope_inv_freq == NULL) {
        rc = PC_ERR_NOMEM;
        goto fail;
    }
    const float *factors = NULL;
    if (hp->has_rope_freqs &&
        (rc = load_vec(m, "rope_freqs.weight", -1, &factors, err, err_len)) != 0)
        goto fail;
    m->rope_theta_scale = powf(hp->rope_theta, -2.0f / (float)hp->rope_dim);
    m->rope_freq_factors = factors;
    for (uint32_t i = 0; i < n_freq; i++) {
        double f = pow((double)hp->rope_theta, -2.0 * i / hp->rope_dim);
        if (factors != NULL)
            f /= factors[i];
        m->rope_inv_freq[i] = (float)f;
    }

    m->layers = model_own(m, hp->n_layer * sizeof *m->layers);
    if (m->layers == NULL) {
        rc = PC_ERR_NOMEM;
        goto fail;
    }
    memset(m->layers, 0, hp->n_layer * sizeof *m->layers);
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        eng_layer_t *L = &m->layers[il];
        int l = (int)il;
        if ((rc = load_vec(m, "blk.%d.attn_norm.weight", l, &L->attn_norm, err, err_len)) ||
            (rc = load_weight(m, p, "blk.%d.attn_q.weight", l, true, &L->wq, err, err_len)) ||
            (rc = load_weight(m, p, "blk.%d.attn_k.weight", l, true, &L->wk, err, err_len)) ||
            (rc = load_weight(m, p, "blk.%d.attn_v.weight", l, true, &L->wv, err, err_len)) ||
            (rc = load_weight(m, p, "blk.%d.attn_output.weight", l, true, &L->wo, err, err_len)) ||
            (rc = load_vec(m, "blk.%d.ffn_norm.weight", l, &L->ffn_norm, err, err_len)) ||
            (rc = load_weight(m, p, "blk.%d.ffn_gate.weight", l, true, &L->w_gate, err, err_len)) ||
            (rc = load_weight(m, p, "blk.%d.ffn_up.weight", l, true, &L->w_up, err, err_len)) ||
            (rc = load_weight(m, p, "blk.%d.ffn_down.weight", l, true, &L->w_down, err, err_len)))
            goto fail;
        if (hp->has_qkv_bias &&
            ((rc = load_vec(m, "blk.%d.attn_q.bias", l, &L->bq, err, err_len)) ||
             (rc = load_vec(m, "blk.%d.attn_k.bias", l, &L->bk, err, err_len)) ||
             (rc = load_vec(m, "blk.%d.attn_v.bias", l, &L->bv, err, err_len))))
            goto fail;
        if (hp->has_qk_norm &&
            ((rc = load_vec(m, "blk.%d.attn_q_norm.weight", l, &L->q_norm, err, err_len)) ||
             (rc = load_vec(m, "blk.%d.attn_k_norm.weight", l, &L->k_norm, err, err_len))))
            goto fail;
        if (p->progress != NULL)
            p->progress(il + 1, hp->n_layer, p->progress_ud);
    }
    *out = m;
    return 0;

fail:
    if (rc == PC_ERR_NOMEM && err != NULL && err_len > 0)
        snprintf(err, err_len, "model: out of memory loading %s", path);
    eng_model_free(m);
    return rc;
}

void eng_model_free(eng_model_t *m)
{
    if (m == NULL)
        return;
    for (size_t i = 0; i < m->_n_owned; i++)
        pc_free(m->_owned[i]);
    pc_free(m->_owned);
    pc_pages_release(&m->_pages);
    eng_gguf_free(m->_gguf);
    pc_free(m);
}

size_t eng_model_weight_bytes(const eng_model_t *m)
{
    return m->_weight_bytes;
}

void eng_weight_row_f32(const eng_weight_t *w, uint32_t row, float *dst)
{
    PC_ASSERT(row < w->n_out);
    const char *src = (const char *)w->data + (size_t)row * eng__gemv_row_bytes(w->type, w->n_in);
    switch (w->type) {
    case ENG_GGML_TYPE_F32:
        memcpy(dst, src, (size_t)w->n_in * 4);
        return;
    case ENG_GGML_TYPE_F16:
        eng__f16_to_f32_row((const uint16_t *)src, dst, w->n_in, eng__cpu_has_avx512());
        return;
    case ENG_GGML_TYPE_BF16:
        eng__port_bf16_to_f32((const uint16_t *)src, dst, w->n_in);
        return;
    default:
        PC_ASSERT(eng_quant_type_is_quant(w->type));
        eng_quant_row_to_f32(w->type, src, dst, w->n_in);
        return;
    }
}
