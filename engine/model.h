/*
 * model.h — a decoder model's weights, loaded from GGUF (engine-internal; engine.h is the
 * public API).
 *
 * Weight matrices are row-major [n_out][n_in] (GGUF's ne[0] = n_in varies fastest), stored as
 * F32, F16, BF16 or a quantized type of quant.h (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K: rows of whole
 * blocks), each kept as the file has it and used in place from the file mapping (or copied to
 * huge pages, copy_weights), so decode
 * reads each weight's own bytes; with weights_f32 every matrix is converted to F32 at load. Norm
 * weights and biases are F32 (eng_hparams_check_tensors guarantees it). The token embedding
 * table doubles as the output head when the model ties them.
 *
 * The model is backend-neutral: it holds the file's layout only. A backend that computes with
 * another one prepares it at its init from these matrices and owns it (the CPU backend's BF16
 * panels, the cuda backend's device copies).
 *
 * An eng_model_t is immutable after eng_model_load: any number of threads may read it.
 */
#ifndef ENG_MODEL_H
#define ENG_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h" /* eng_load_progress_fn */
#include "gguf.h"
#include "pc_pages.h"
#include "hparams.h"

/* A weight matrix: n_out rows of n_in elements of `type` (ENG_GGML_TYPE_F32, _F16, _BF16 or
 * a quantized type; eng__gemv_row_bytes() gives a row's bytes). */
typedef struct eng_weight {
    uint32_t type;
    uint32_t file_type; /* the tensor's type in the file (enum eng_ggml_type) */
    uint32_t n_in;
    uint32_t n_out;
    const void *data; /* [n_out][n_in]; into the mapping or a buffer the model owns */
} eng_weight_t;

typedef struct eng_layer {
    const float *attn_norm;       /* [n_embd] */
    eng_weight_t wq;              /* [n_head * head_dim][n_embd] */
    eng_weight_t wk;              /* [n_head_kv * head_dim][n_embd] */
    eng_weight_t wv;              /* [n_head_kv * head_dim][n_embd] */
    eng_weight_t wo;              /* [n_embd][n_head * head_dim] */
    const float *bq, *bk, *bv;    /* qwen2 biases, else NULL */
    const float *q_norm, *k_norm; /* qwen3 per-head norms [head_dim], else NULL */
    const float *ffn_norm;        /* [n_embd] */
    eng_weight_t w_gate;          /* [n_ff][n_embd] */
    eng_weight_t w_up;            /* [n_ff][n_embd] */
    eng_weight_t w_down;          /* [n_embd][n_ff] */
} eng_layer_t;

typedef struct eng_model {
    eng_hparams_t hp;
    eng_weight_t tok_embd; /* [n_vocab][n_embd] */
    const float *out_norm; /* [n_embd] */
    eng_weight_t output;   /* [n_vocab][n_embd]; equals tok_embd when tied */
    float *rope_inv_freq;  /* [rope_dim / 2]: theta^(-2i/rope_dim) / rope_freqs[i] */
    /* RoPE's angles as llama.cpp's CPU backend computes them (ggml_rope_cache_init), which the
     * CPU backend follows: for position p, a = (float)p, then per frequency i the angle
     * a / rope_freqs[i] (a alone without the tensor), a *= rope_theta_scale, all in F32. */
    float rope_theta_scale;         /* powf(rope_theta, -2.0f / rope_dim) */
    const float *rope_freq_factors; /* [rope_dim / 2] rope_freqs.weight, or NULL */
    eng_layer_t *layers;            /* [n_layer] */
    eng_gguf_t *_gguf;              /* private: the mapping the weights point into */
    void **_owned;                  /* private: converted buffers */
    pc_pages_t _pages; /* private: weight copies and panels, on huge pages (copy_weights) */
    size_t _n_owned;
    size_t _weight_bytes;
} eng_model_t;

typedef struct eng_model_params {
    bool weights_f32;  /* convert F16, BF16 and quantized weights to F32 at load (default: keep
                          every matrix as stored) */
    bool copy_weights; /* copy the matrices out of the file mapping into anonymous memory
                          on transparent huge pages (when the kernel has them): decode
                          streams every weight once per token, and 2 MiB pages stream
                          ~25% faster than the mapping's 4 KiB ones */
    eng_load_progress_fn progress; /* NULL (default): none */
    void *progress_ud;
} eng_model_params_t;

eng_model_params_t eng_model_params_default(void);

/* Opens path, reads and checks the hyper-parameters and tensors, and builds the model. On
 * success *out owns the file mapping (release with eng_model_free). Returns 0, PC_ERR_IO,
 * PC_ERR_FORMAT, PC_ERR_UNSUPPORTED or PC_ERR_NOMEM with a one-line reason in err. */
int eng_model_load(const char *path, const eng_model_params_t *p, eng_model_t **out, char *err,
                   size_t err_len);

/* Releases the model and its mapping; NULL is a no-op. */
void eng_model_free(eng_model_t *m);

/* Bytes of weights the model computes with (converted buffers and mapped tensors). */
size_t eng_model_weight_bytes(const eng_model_t *m);

/* Row `row` of w (any of its types) as F32 into dst[n_in]. */
void eng_weight_row_f32(const eng_weight_t *w, uint32_t row, float *dst);

#endif
