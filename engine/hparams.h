/*
 * hparams.h — a model's architecture hyper-parameters, read from a GGUF file's <arch>.* keys.
 *
 * Supported architectures (general.architecture):
 *   llama  Llama 2/3, Mistral: RMSNorm, SwiGLU FFN, RoPE on adjacent pairs (ENG_ROPE_NORM),
 *          optional per-frequency factors "rope_freqs.weight" (Llama 3.1 RoPE scaling).
 *   qwen2  as llama plus biases on the q/k/v projections; RoPE on halves (ENG_ROPE_NEOX).
 *   qwen3  as qwen2 without q/k/v biases, plus RMSNorm over each head of q and k
 *          (attn_q_norm.weight / attn_k_norm.weight, [head_dim]).
 * The embeddings are tied (logits use token_embd.weight) when output.weight is absent.
 *
 * Invariants after eng_hparams_from_gguf succeeds: every count is >= 1; n_head % n_head_kv == 0;
 * head_dim is even; n_embd == n_head * head_dim unless the file gives attention.key_length
 * (then head_dim is that value, and value_length must equal it); rope_dim <= head_dim.
 */
#ifndef ENG_HPARAMS_H
#define ENG_HPARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

enum eng_arch {
    ENG_ARCH_LLAMA = 0,
    ENG_ARCH_QWEN2 = 1,
    ENG_ARCH_QWEN3 = 2,
};

/* How RoPE pairs dimensions: NORM rotates (x[2i], x[2i+1]) (llama); NEOX rotates
 * (x[i], x[i + rope_dim/2]) (qwen2, qwen3). */
enum eng_rope_style {
    ENG_ROPE_NORM = 0,
    ENG_ROPE_NEOX = 2,
};

typedef struct eng_hparams {
    enum eng_arch arch;
    uint32_t n_vocab;     /* rows of token_embd.weight */
    uint32_t n_ctx_train; /* <arch>.context_length */
    uint32_t n_embd;
    uint32_t n_layer;
    uint32_t n_head;
    uint32_t n_head_kv; /* GQA: n_head / n_head_kv query heads share one KV head */
    uint32_t head_dim;
    uint32_t n_ff;
    uint32_t rope_dim; /* <arch>.rope.dimension_count, default head_dim */
    float rms_eps;
    float rope_theta; /* <arch>.rope.freq_base, default 10000 */
    enum eng_rope_style rope_style;
    bool has_rope_freqs;  /* rope_freqs.weight [rope_dim / 2] present */
    bool tied_embeddings; /* no output.weight */
    bool has_qkv_bias;    /* qwen2 */
    bool has_qk_norm;     /* qwen3 */
} eng_hparams_t;

/* The architecture's name as GGUF spells it ("llama", "qwen2", "qwen3"). */
const char *eng_arch_name(enum eng_arch arch);

/* Reads and checks the hyper-parameters. Returns 0, PC_ERR_UNSUPPORTED (an architecture other
 * than the three above) or PC_ERR_FORMAT (a key missing, of the wrong type or inconsistent),
 * with a one-line reason in err ("hparams: llama.attention.head_count 12 is not a multiple of
 * llama.attention.head_count_kv 5"). */
int eng_hparams_from_gguf(const eng_gguf_t *g, eng_hparams_t *out, char *err, size_t err_len);

/* Checks that every tensor the architecture needs exists with the shape hp implies and a type
 * the engine computes with (weights: F32/F16/BF16/Q8_0/Q4_0/Q4_K/Q5_K/Q6_K; norms and biases: F32),
 * and that the file has no unexpected blk.* tensors. Returns 0, PC_ERR_FORMAT ("tensor
 * blk.3.ffn_up.weight missing", "tensor blk.0.attn_k.weight has shape [256, 256], expected [256,
 * 64]") or PC_ERR_UNSUPPORTED ("unsupported tensor type Q4_K in tensor blk.0.attn_q.weight"). */
int eng_hparams_check_tensors(const eng_gguf_t *g, const eng_hparams_t *hp, char *err,
                              size_t err_len);

#endif
