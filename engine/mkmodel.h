/*
 * mkmodel.h — the test-model generator behind `kvgw mkmodel`.
 *
 * Writes a real GGUF model of a chosen shape whose weights are deterministic pseudo-random
 * numbers, with the tokenizer (tokenizer.ggml.*) and chat template of a real vocabulary, so the
 * whole stack (tokenizer, template, engine, cache) runs on a model llama.cpp can also load.
 *
 * Determinism: the bytes depend only on the parameters and the vocabulary. Every tensor draws
 * from its own generator, seeded from (seed, tensor name), so a tensor's values do not depend on
 * which other tensors exist. Normal-looking values come from sums of integer uniforms (exact
 * integer arithmetic, then one float multiply), so they are identical on every IEEE machine.
 *
 * Scales keep a forward pass in a sane range: projections have std 1/sqrt(fan_in) (output
 * projections attn_output/ffn_down further divided by sqrt(2 * n_layer)), embeddings and the
 * output matrix std 2/sqrt(n_embd) (logits with std about 2), norm weights 1 +- 0.05, biases
 * std 0.1. Norms, biases and rope factors are F32 whatever the dtype (as llama.cpp writes them).
 */
#ifndef ENG_MKMODEL_H
#define ENG_MKMODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "half.h" /* the generator's conversions (eng_f32_to_f16 & co), for its users */
#include "hparams.h"
#include "vocab.h"

typedef struct eng_mkmodel_params {
    enum eng_arch arch; /* llama, qwen2 (q/k/v biases), qwen3 (q/k head norms) */
    uint32_t n_layer;
    uint32_t n_embd;
    uint32_t n_head;
    uint32_t n_head_kv;
    uint32_t n_ff;
    uint32_t head_dim; /* 0: n_embd / n_head; otherwise written as attention.key_length */
    uint32_t n_ctx;    /* <arch>.context_length */
    uint32_t dtype;    /* weight matrices: ENG_GGML_TYPE_F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q5_1,
                          Q4_K, Q5_K, Q6_K, ENG_MKMODEL_Q4_K_M or ENG_MKMODEL_Q5_K_M */
    float rope_theta;
    float rms_eps;
    bool tied;       /* no output.weight: logits use token_embd.weight */
    bool rope_freqs; /* write rope_freqs.weight with Llama 3.1's scaling factors */
    uint64_t seed;
    const char *name;   /* general.name; NULL: "kvgw-test" */
    uint32_t alignment; /* 0: 32 */
    /* Called after each tensor is written with the weights (elements) written so far and in
     * all, for a progress display; NULL (default): none. Runs on the writing thread. */
    void (*progress)(uint64_t done, uint64_t total, void *ud);
    void *progress_ud;
} eng_mkmodel_params_t;

/* The dtype of llama.cpp's Q4_K_M mix: the output head (output.weight, or token_embd.weight when
 * tied) Q6_K; attn_v and ffn_down Q6_K in the first and last eighth of the layers and every third
 * layer between; every other matrix Q4_K (engine/quant.h, eng_quant_mix_type). */
#define ENG_MKMODEL_Q4_K_M 0x10000u
/* llama.cpp's Q5_K_M: the same with Q5_K for Q4_K. Both mixes give a matrix whose rows are not
 * whole super-blocks of 256 llama.cpp's fallback type (Q5_0, Q5_1 or Q8_0:
 * eng_quant_mix_tensor_type), so they need widths that are multiples of 32 only. */
#define ENG_MKMODEL_Q5_K_M 0x10001u

/* The command-line name of a dtype ("f16", "q4_k", "q4_k_m"), NULL for one mkmodel does not
 * write; and the dtype of a name: 0 or PC_ERR_INVAL. The names, in order, are listed in
 * ENG_MKMODEL_DTYPES. */
#define ENG_MKMODEL_DTYPES                                                                         \
    "f32, f16, bf16, q8_0, q4_0, q5_0, q5_1, q4_k, q5_k, q6_k, q4_k_m, q5_k_m"
const char *eng_mkmodel_dtype_name(uint32_t dtype);
int eng_mkmodel_dtype_parse(const char *name, uint32_t *dtype);

/* llama, 2 layers, width 256, 8 heads, 2 KV heads, FFN 704, context 8192, F32, theta 500000,
 * eps 1e-5, untied, seed 1. */
eng_mkmodel_params_t eng_mkmodel_params_default(void);

/* Checks the shape (counts >= 1 and bounded, n_head % n_head_kv, n_embd % n_head unless
 * head_dim is given, even head size, block divisibility of every matrix's input width for a
 * quantized dtype, a supported dtype). Returns 0 or PC_ERR_INVAL with a one-line reason in err. */
int eng_mkmodel_check(const eng_mkmodel_params_t *p, char *err, size_t err_len);

/* Writes the model to path (through "<path>.tmp", renamed at the end, so an existing file is
 * replaced only by a complete one). The vocabulary supplies n_vocab and the tokenizer metadata;
 * it is only read. Returns 0, PC_ERR_INVAL (bad parameters or an empty vocabulary), PC_ERR_IO
 * or PC_ERR_NOMEM, with a one-line reason in err. */
int eng_mkmodel_write(const eng_mkmodel_params_t *p, const eng_vocab_t *vocab, const char *path,
                      char *err, size_t err_len);

#endif
