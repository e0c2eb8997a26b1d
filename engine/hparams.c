/*
 * hparams.c — architecture hyper-parameters and the tensor inventory check (see hparams.h).
 *
 * Keys follow llama.cpp's names (<arch>.embedding_length, <arch>.attention.head_count, ...).
 * The tensor check is driven by one function that maps a tensor name to the shape and type
 * class the architecture expects, used both ways: every tensor in the file must be expected,
 * and every required name must be in the file.
 */
#include "hparams.h"

#include "common.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Upper bounds that keep later size arithmetic (n_embd * n_vocab, KV sizes) far from overflow
 * and reject absurd headers with a clear message. */
#define HP_MAX_EMBD (1u << 16)
#define HP_MAX_LAYER 1024u
#define HP_MAX_HEAD 1024u
#define HP_MAX_FF (1u << 20)
#define HP_MAX_VOCAB (1u << 24)

static const char *const arch_names[] = {"llama", "qwen2", "qwen3"};

const char *eng_arch_name(enum eng_arch arch)
{
    return (unsigned)arch < PC_ARRAY_LEN(arch_names) ? arch_names[arch] : "?";
}

/* Reads "<arch>.<suffix>" as u32. `def` is used when the key is absent and def_ok. */
static int get_u32_key(const eng_gguf_t *g, const char *arch, const char *suffix, bool def_ok,
                       uint32_t def, uint32_t *out, char *err, size_t err_len)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = eng_gguf_get_u32(g, key, out, err, err_len);
    if (rc == PC_ERR_NOTFOUND && def_ok) {
        *out = def;
        return 0;
    }
    return rc != 0 ? PC_ERR_FORMAT : 0;
}

static int get_f32_key(const eng_gguf_t *g, const char *arch, const char *suffix, bool def_ok,
                       float def, float *out, char *err, size_t err_len)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = eng_gguf_get_f32(g, key, out, err, err_len);
    if (rc == PC_ERR_NOTFOUND && def_ok) {
        *out = def;
        return 0;
    }
    return rc != 0 ? PC_ERR_FORMAT : 0;
}

static int check_range(const char *arch, const char *what, uint32_t v, uint32_t max, char *err,
                       size_t err_len)
{
    if (v < 1 || v > max)
        return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                           "hparams: %s.%s = %" PRIu32 " not in 1..%" PRIu32, arch, what, v, max);
    return 0;
}

int eng_hparams_from_gguf(const eng_gguf_t *g, eng_hparams_t *out, char *err, size_t err_len)
{
    eng_hparams_t hp;
    memset(&hp, 0, sizeof hp);
    pc_slice_t arch_s;
    int rc = eng_gguf_get_str(g, "general.architecture", &arch_s, err, err_len);
    if (rc != 0)
        return PC_ERR_FORMAT;
    char arch[32];
    bool known = false;
    for (size_t i = 0; i < PC_ARRAY_LEN(arch_names); i++) {
        if (pc_slice_eq_cstr(arch_s, arch_names[i])) {
            hp.arch = (enum eng_arch)i;
            known = true;
        }
    }
    if (!known)
        return pc_err_setf(err, err_len, PC_ERR_UNSUPPORTED,
                           "hparams: architecture '%.*s' is not supported (llama, qwen2, qwen3)",
                           (int)PC_MIN(arch_s.len, 64), arch_s.base);
    snprintf(arch, sizeof arch, "%s", arch_names[hp.arch]);

    if ((rc = get_u32_key(g, arch, "context_length", false, 0, &hp.n_ctx_train, err, err_len)) ||
        (rc = get_u32_key(g, arch, "embedding_length", false, 0, &hp.n_embd, err, err_len)) ||
        (rc = get_u32_key(g, arch, "block_count", false, 0, &hp.n_layer, err, err_len)) ||
        (rc = get_u32_key(g, arch, "feed_forward_length", false, 0, &hp.n_ff, err, err_len)) ||
        (rc = get_u32_key(g, arch, "attention.head_count", false, 0, &hp.n_head, err, err_len)))
        return rc;
    if ((rc = get_u32_key(g, arch, "attention.head_count_kv", true, hp.n_head, &hp.n_head_kv, err,
                          err_len)) ||
        (rc = get_f32_key(g, arch, "attention.layer_norm_rms_epsilon", false, 0, &hp.rms_eps, err,
                          err_len)) ||
        (rc = get_f32_key(g, arch, "rope.freq_base", true, 10000.0f, &hp.rope_theta, err, err_len)))
        return rc;
    if ((rc = check_range(arch, "context_length", hp.n_ctx_train, UINT32_MAX, err, err_len)) ||
        (rc = check_range(arch, "embedding_length", hp.n_embd, HP_MAX_EMBD, err, err_len)) ||
        (rc = check_range(arch, "block_count", hp.n_layer, HP_MAX_LAYER, err, err_len)) ||
        (rc = check_range(arch, "feed_forward_length", hp.n_ff, HP_MAX_FF, err, err_len)) ||
        (rc = check_range(arch, "attention.head_count", hp.n_head, HP_MAX_HEAD, err, err_len)) ||
        (rc =
             check_range(arch, "attention.head_count_kv", hp.n_head_kv, HP_MAX_HEAD, err, err_len)))
        return rc;
    if (hp.n_head % hp.n_head_kv != 0)
        return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                           "hparams: %s.attention.head_count %" PRIu32
                           " is not a multiple of %s.attention.head_count_kv %" PRIu32,
                           arch, hp.n_head, arch, hp.n_head_kv);
    if (!(hp.rms_eps > 0.0f && hp.rms_eps < 1.0f))
        return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                           "hparams: %s.attention.layer_norm_rms_epsilon %g not in (0, 1)", arch,
                           (double)hp.rms_eps);
    if (!(hp.rope_theta > 0.0f && hp.rope_theta < 1e12f))
        return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                           "hparams: %s.rope.freq_base %g not positive and finite", arch,
                           (double)hp.rope_theta);

    /* Head size: key_length when given (and then value_length must agree), else n_embd/n_head. */
    uint32_t key_len = 0, val_len = 0;
    if ((rc = get_u32_key(g, arch, "attention.key_length", true, 0, &key_len, err, err_len)) ||
        (rc =
             get_u32_key(g, arch, "attention.value_length", true, key_len, &val_len, err, err_len)))
        return rc;
    if (key_len != 0) {
        if (val_len != key_len)
            return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                               "hparams: %s.attention.value_length %" PRIu32
                               " differs from key_length %" PRIu32 " (not supported)",
                               arch, val_len, key_len);
        if ((rc = check_range(arch, "attention.key_length", key_len, 1024, err, err_len)))
            return rc;
        hp.head_dim = key_len;
    } else {
        if (hp.n_embd % hp.n_head != 0)
            return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                               "hparams: %s.embedding_length %" PRIu32 " is not a multiple of "
                               "%s.attention.head_count %" PRIu32 " and no key_length is given",
                               arch, hp.n_embd, arch, hp.n_head);
        hp.head_dim = hp.n_embd / hp.n_head;
    }
    if (hp.head_dim % 2 != 0)
        return pc_err_setf(err, err_len, PC_ERR_FORMAT, "hparams: head size %" PRIu32 " is odd",
                           hp.head_dim);
    if ((rc = get_u32_key(g, arch, "rope.dimension_count", true, hp.head_dim, &hp.rope_dim, err,
                          err_len)))
        return rc;
    if (hp.rope_dim < 2 || hp.rope_dim > hp.head_dim || hp.rope_dim % 2 != 0)
        return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                           "hparams: %s.rope.dimension_count %" PRIu32
                           " must be even and in 2..%" PRIu32,
                           arch, hp.rope_dim, hp.head_dim);

    /* Vocabulary size: the embedding's rows are authoritative; the key, when present, agrees. */
    uint32_t vocab_key = 0;
    if ((rc = get_u32_key(g, arch, "vocab_size", true, 0, &vocab_key, err, err_len)))
        return rc;
    const eng_gguf_tensor_t *emb = eng_gguf_tensor_find(g, "token_embd.weight");
    if (emb != NULL) {
        if (emb->n_dims != 2 || emb->ne[1] > HP_MAX_VOCAB)
            return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                               "hparams: token_embd.weight must be 2-D with at most %u rows",
                               HP_MAX_VOCAB);
        hp.n_vocab = (uint32_t)emb->ne[1];
        if (vocab_key != 0 && vocab_key != hp.n_vocab)
            return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                               "hparams: %s.vocab_size %" PRIu32
                               " differs from token_embd.weight rows %" PRIu32,
                               arch, vocab_key, hp.n_vocab);
    } else if (vocab_key != 0) {
        hp.n_vocab = vocab_key;
    } else {
        const eng_gguf_val_t *toks = eng_gguf_get(g, "tokenizer.ggml.tokens");
        if (toks == NULL || toks->type != ENG_GGUF_ARRAY || toks->n == 0 || toks->n > HP_MAX_VOCAB)
            return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                               "hparams: cannot tell the vocabulary size (no token_embd.weight, "
                               "%s.vocab_size or tokenizer.ggml.tokens)",
                               arch);
        hp.n_vocab = (uint32_t)toks->n;
    }
    if ((rc = check_range(arch, "vocab_size", hp.n_vocab, HP_MAX_VOCAB, err, err_len)))
        return rc;

    hp.rope_style = hp.arch == ENG_ARCH_LLAMA ? ENG_ROPE_NORM : ENG_ROPE_NEOX;
    hp.has_rope_freqs = eng_gguf_tensor_find(g, "rope_freqs.weight") != NULL;
    hp.tied_embeddings = eng_gguf_tensor_find(g, "output.weight") == NULL;
    hp.has_qkv_bias =
        hp.arch == ENG_ARCH_QWEN2 ||
        (hp.arch == ENG_ARCH_LLAMA && eng_gguf_tensor_find(g, "blk.0.attn_q.bias") != NULL);
    hp.has_qk_norm = hp.arch == ENG_ARCH_QWEN3;
    *out = hp;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Tensor inventory
 * ------------------------------------------------------------------------------------------- */

typedef struct tspec {
    uint32_t n_dims;
    int64_t ne[2];
    bool vector;   /* norm, bias or rope factors: F32 only */
    bool required; /* must be in the file */
} tspec_t;

static tspec_t mat(int64_t n_in, int64_t n_out)
{
    return (tspec_t){2, {n_in, n_out}, false, true};
}
static tspec_t vec(int64_t n)
{
    return (tspec_t){1, {n, 1}, true, true};
}

/* The expectation for a per-layer suffix ("attn_q.weight"); false when the architecture has no
 * such tensor. */
static bool layer_spec(const eng_hparams_t *hp, const char *sfx, tspec_t *s)
{
    int64_t e = hp->n_embd, q = (int64_t)hp->n_head * hp->head_dim,
            kv = (int64_t)hp->n_head_kv * hp->head_dim, ff = hp->n_ff;
    if (strcmp(sfx, "attn_norm.weight") == 0 || strcmp(sfx, "ffn_norm.weight") == 0)
        *s = vec(e);
    else if (strcmp(sfx, "attn_q.weight") == 0)
        *s = mat(e, q);
    else if (strcmp(sfx, "attn_k.weight") == 0 || strcmp(sfx, "attn_v.weight") == 0)
        *s = mat(e, kv);
    else if (strcmp(sfx, "attn_output.weight") == 0)
        *s = mat(q, e);
    else if (strcmp(sfx, "ffn_gate.weight") == 0 || strcmp(sfx, "ffn_up.weight") == 0)
        *s = mat(e, ff);
    else if (strcmp(sfx, "ffn_down.weight") == 0)
        *s = mat(ff, e);
    else if (hp->has_qkv_bias && strcmp(sfx, "attn_q.bias") == 0)
        *s = vec(q);
    else if (hp->has_qkv_bias &&
             (strcmp(sfx, "attn_k.bias") == 0 || strcmp(sfx, "attn_v.bias") == 0))
        *s = vec(kv);
    else if (hp->has_qk_norm &&
             (strcmp(sfx, "attn_q_norm.weight") == 0 || strcmp(sfx, "attn_k_norm.weight") == 0))
        *s = vec(hp->head_dim);
    else
        return false;
    return true;
}

static const char *const layer_suffixes[] = {
    "attn_norm.weight",   "attn_q.weight",      "attn_k.weight",   "attn_v.weight",
    "attn_output.weight", "attn_q.bias",        "attn_k.bias",     "attn_v.bias",
    "attn_q_norm.weight", "attn_k_norm.weight", "ffn_norm.weight", "ffn_gate.weight",
    "ffn_up.weight",      "ffn_down.weight",
};

/* The expectation for any tensor name; false when the name is not part of the model. */
static bool name_spec(const eng_hparams_t *hp, const char *name, tspec_t *s)
{
    if (strcmp(name, "token_embd.weight") == 0) {
        *s = mat(hp->n_embd, hp->n_vocab);
        return true;
    }
    if (strcmp(name, "output_norm.weight") == 0) {
        *s = vec(hp->n_embd);
        return true;
    }
    if (strcmp(name, "output.weight") == 0) {
        *s = mat(hp->n_embd, hp->n_vocab);
        s->required = !hp->tied_embeddings;
        return true;
    }
    if (strcmp(name, "rope_freqs.weight") == 0) {
        *s = vec(hp->rope_dim / 2);
        s->required = hp->has_rope_freqs;
        return true;
    }
    if (strncmp(name, "blk.", 4) != 0)
        return false;
    const char *p = name + 4;
    if (*p < '0' || *p > '9' || (*p == '0' && p[1] != '.'))
        return false;
    char *end;
    unsigned long il = strtoul(p, &end, 10);
    if (*end != '.' || il >= hp->n_layer)
        return false;
    return layer_spec(hp, end + 1, s);
}

static void fmt_shape(char *buf, size_t len, uint32_t n_dims, const int64_t *ne)
{
    size_t at = 0;
    at += (size_t)snprintf(buf, len, "[");
    for (uint32_t d = 0; d < n_dims && at < len; d++)
        at += (size_t)snprintf(buf + at, len - at, "%s%" PRId64, d != 0 ? ", " : "", ne[d]);
    if (at < len)
        snprintf(buf + at, len - at, "]");
}

static int check_one(const eng_gguf_tensor_t *t, const tspec_t *s, char *err, size_t err_len)
{
    int64_t want[ENG_GGUF_MAX_DIMS] = {s->ne[0], s->ne[1], 1, 1};
    bool same = true;
    for (int d = 0; d < ENG_GGUF_MAX_DIMS; d++)
        same = same && t->ne[d] == want[d];
    if (!same) {
        char got_s[96], want_s[96];
        fmt_shape(got_s, sizeof got_s, t->n_dims, t->ne);
        fmt_shape(want_s, sizeof want_s, s->n_dims, want);
        return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                           "hparams: tensor %s has shape %s, expected %s", t->name, got_s, want_s);
    }
    bool ok = s->vector ? t->type == ENG_GGML_TYPE_F32 : eng_ggml_type_supported(t->type);
    if (!ok && err != NULL && err_len > 0) {
        snprintf(err, err_len, "unsupported tensor type %s in tensor %s%s",
                 eng_ggml_type_name(t->type), t->name,
                 s->vector && eng_ggml_type_supported(t->type)
                     ? " (norms, biases and rope factors must be F32)"
                     : "");
    }
    return ok ? 0 : PC_ERR_UNSUPPORTED;
}

int eng_hparams_check_tensors(const eng_gguf_t *g, const eng_hparams_t *hp, char *err,
                              size_t err_len)
{
    tspec_t s;
    int rc;
    /* Every tensor in the file belongs to the model and has its shape and a usable type. */
    for (uint64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor_t *t = eng_gguf_tensor_at(g, i);
        if (!name_spec(hp, t->name, &s))
            return pc_err_setf(err, err_len, PC_ERR_FORMAT,
                               "hparams: unexpected tensor %s for a %s model", t->name,
                               eng_arch_name(hp->arch));
        if ((rc = check_one(t, &s, err, err_len)) != 0)
            return rc;
    }
    /* Every required tensor is in the file. */
    static const char *const globals[] = {"token_embd.weight", "output_norm.weight",
                                          "output.weight", "rope_freqs.weight"};
    for (size_t i = 0; i < PC_ARRAY_LEN(globals); i++) {
        if (name_spec(hp, globals[i], &s) && s.required &&
            eng_gguf_tensor_find(g, globals[i]) == NULL)
            return pc_err_setf(err, err_len, PC_ERR_FORMAT, "hparams: tensor %s missing",
                               globals[i]);
    }
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        for (size_t k = 0; k < PC_ARRAY_LEN(layer_suffixes); k++) {
            char name[96];
            if (!layer_spec(hp, layer_suffixes[k], &s))
                continue;
            snprintf(name, sizeof name, "blk.%" PRIu32 ".%s", il, layer_suffixes[k]);
            if (eng_gguf_tensor_find(g, name) == NULL)
                return pc_err_setf(err, err_len, PC_ERR_FORMAT, "hparams: tensor %s missing", name);
        }
    }
    return 0;
}
