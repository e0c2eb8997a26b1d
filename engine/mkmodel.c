/*
 * mkmodel.c — deterministic test-model generator (see mkmodel.h).
 *
 * The file is streamed: metadata and tensor declarations first, then each tensor is generated
 * in chunks of rows into one reusable buffer, converted to the target type and handed to the
 * writer. Peak memory is the vocabulary metadata plus one chunk, whatever the model size.
 */
#include "mkmodel.h"

#include "common.h"
#include "gguf.h"
#include "quant.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* llama.cpp's general.file_type values (enum llama_ftype). */
#define FTYPE_ALL_F32 0
#define FTYPE_MOSTLY_F16 1
#define FTYPE_MOSTLY_Q4_0 2
#define FTYPE_MOSTLY_Q8_0 7
#define FTYPE_MOSTLY_Q5_0 8
#define FTYPE_MOSTLY_Q5_1 9
#define FTYPE_MOSTLY_Q4_K_S 14 /* llama.cpp's names: "mostly Q4_K" files are its Q4_K_S */
#define FTYPE_MOSTLY_Q4_K_M 15
#define FTYPE_MOSTLY_Q5_K_S 16
#define FTYPE_MOSTLY_Q5_K_M 17
#define FTYPE_MOSTLY_Q6_K 18
#define FTYPE_MOSTLY_BF16 32

#define CHUNK_ELEMS (1u << 20) /* elements generated per write */

eng_mkmodel_params_t eng_mkmodel_params_default(void)
{
    return (eng_mkmodel_params_t){
        .arch = ENG_ARCH_LLAMA,
        .n_layer = 2,
        .n_embd = 256,
        .n_head = 8,
        .n_head_kv = 2,
        .n_ff = 704,
        .head_dim = 0,
        .n_ctx = 8192,
        .dtype = ENG_GGML_TYPE_F32,
        .rope_theta = 500000.0f,
        .rms_eps = 1e-5f,
        .tied = false,
        .rope_freqs = false,
        .seed = 1,
        .name = NULL,
        .alignment = 0,
        .progress = NULL,
        .progress_ud = NULL,
    };
}

/* ---------------------------------------------------------------------------------------------
 * Numbers
 * ------------------------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t name_seed(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *c = name; *c != '\0'; c++)
        h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    uint64_t s = seed ^ h;
    return splitmix64(&s);
}

/* Approximately standard normal: the sum of four 16-bit uniforms, centred and scaled to unit
 * variance (Irwin-Hall; tails bounded at +-3.46). All integer until the final multiply. */
static float unit_normal(uint64_t *s)
{
    uint64_t r = splitmix64(s);
    int32_t sum = (int32_t)(r & 0xffff) + (int32_t)((r >> 16) & 0xffff) +
                  (int32_t)((r >> 32) & 0xffff) + (int32_t)(r >> 48);
    /* mean 4 * 32767.5, variance 4 * (65536^2 - 1) / 12 */
    const float inv_sd = 1.0f / 37837.23f;
    return ((float)(2 * sum - 4 * 65535) * 0.5f) * inv_sd;
}

/* ---------------------------------------------------------------------------------------------
 * Tensor plan
 * ------------------------------------------------------------------------------------------- */

enum init_kind { INIT_NORMAL, INIT_NORM, INIT_ROPE_FREQS };

typedef struct tplan {
    char name[64];
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[2];
    enum init_kind init;
    float scale; /* std for INIT_NORMAL */
} tplan_t;

typedef struct plan {
    tplan_t *t;
    size_t n, cap;
} plan_t;

static int plan_add(plan_t *pl, const char *name, uint32_t type, uint32_t n_dims, int64_t ne0,
                    int64_t ne1, enum init_kind init, float scale)
{
    if (pl->n == pl->cap) {
        size_t cap = pl->cap != 0 ? pl->cap * 2 : 64;
        tplan_t *t = pc_reallocarray(pl->t, cap, sizeof *t);
        if (t == NULL)
            return PC_ERR_NOMEM;
        pl->t = t;
        pl->cap = cap;
    }
    tplan_t *t = &pl->t[pl->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = n_dims == 1 ? ENG_GGML_TYPE_F32 : type;
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = n_dims == 2 ? ne1 : 1;
    t->init = init;
    t->scale = scale;
    return 0;
}

static int build_plan(const eng_mkmodel_params_t *p, uint32_t n_vocab, plan_t *pl)
{
    uint32_t hd = p->head_dim != 0 ? p->head_dim : p->n_embd / p->n_head;
    int64_t e = p->n_embd, q = (int64_t)p->n_head * hd, kv = (int64_t)p->n_head_kv * hd,
            ff = p->n_ff;
    float emb_sd = 2.0f / sqrtf((float)e);
    float out_div = sqrtf(2.0f * (float)p->n_layer);
    uint32_t dt = p->dtype;
    int rc = 0;
    char name[64];
#define ADD(...)                                                                                   \
    do {                                                                                           \
        if ((rc = plan_add(pl, __VA_ARGS__)) != 0)                                                 \
            return rc;                                                                             \
    } while (0)
    ADD("token_embd.weight", dt, 2, e, n_vocab, INIT_NORMAL, emb_sd);
    if (p->rope_freqs)
        ADD("rope_freqs.weight", ENG_GGML_TYPE_F32, 1, hd / 2, 1, INIT_ROPE_FREQS, 0);
    for (uint32_t il = 0; il < p->n_layer; il++) {
#define LNAME(sfx) (snprintf(name, sizeof name, "blk.%" PRIu32 "." sfx, il), name)
        ADD(LNAME("attn_norm.weight"), dt, 1, e, 1, INIT_NORM, 0);
        ADD(LNAME("attn_q.weight"), dt, 2, e, q, INIT_NORMAL, 1.0f / sqrtf((float)e));
        ADD(LNAME("attn_k.weight"), dt, 2, e, kv, INIT_NORMAL, 1.0f / sqrtf((float)e));
        ADD(LNAME("attn_v.weight"), dt, 2, e, kv, INIT_NORMAL, 1.0f / sqrtf((float)e));
        if (p->arch == ENG_ARCH_QWEN2) {
            ADD(LNAME("attn_q.bias"), dt, 1, q, 1, INIT_NORMAL, 0.1f);
            ADD(LNAME("attn_k.bias"), dt, 1, kv, 1, INIT_NORMAL, 0.1f);
            ADD(LNAME("attn_v.bias"), dt, 1, kv, 1, INIT_NORMAL, 0.1f);
        }
        if (p->arch == ENG_ARCH_QWEN3) {
            ADD(LNAME("attn_q_norm.weight"), dt, 1, hd, 1, INIT_NORM, 0);
            ADD(LNAME("attn_k_norm.weight"), dt, 1, hd, 1, INIT_NORM, 0);
        }
        ADD(LNAME("attn_output.weight"), dt, 2, q, e, INIT_NORMAL,
            1.0f / sqrtf((float)q) / out_div);
        ADD(LNAME("ffn_norm.weight"), dt, 1, e, 1, INIT_NORM, 0);
        ADD(LNAME("ffn_gate.weight"), dt, 2, e, ff, INIT_NORMAL, 1.0f / sqrtf((float)e));
        ADD(LNAME("ffn_up.weight"), dt, 2, e, ff, INIT_NORMAL, 1.0f / sqrtf((float)e));
        ADD(LNAME("ffn_down.weight"), dt, 2, ff, e, INIT_NORMAL, 1.0f / sqrtf((float)ff) / out_div);
#undef LNAME
    }
    ADD("output_norm.weight", dt, 1, e, 1, INIT_NORM, 0);
    if (!p->tied)
        ADD("output.weight", dt, 2, e, n_vocab, INIT_NORMAL, emb_sd);
#undef ADD
    /* A mix (Q4_K_M, Q5_K_M) picks each matrix's type by its name, layer and row length. */
    for (size_t i = 0; i < pl->n; i++)
        if (pl->t[i].n_dims == 2)
            pl->t[i].type = eng_quant_mix_tensor_type(dt, pl->t[i].name, p->n_layer, p->tied,
                                                      (uint64_t)pl->t[i].ne[0]);
    return 0;
}

_Static_assert(ENG_MKMODEL_Q4_K_M == ENG_QUANT_MIX_Q4_K_M, "one id for the Q4_K_M mix");
_Static_assert(ENG_MKMODEL_Q5_K_M == ENG_QUANT_MIX_Q5_K_M, "one id for the Q5_K_M mix");

static const struct {
    const char *name;
    uint32_t dtype;
} dtypes[] = {
    {"f32", ENG_GGML_TYPE_F32},   {"f16", ENG_GGML_TYPE_F16},     {"bf16", ENG_GGML_TYPE_BF16},
    {"q8_0", ENG_GGML_TYPE_Q8_0}, {"q4_0", ENG_GGML_TYPE_Q4_0},   {"q4_k", ENG_GGML_TYPE_Q4_K},
    {"q5_0", ENG_GGML_TYPE_Q5_0}, {"q5_1", ENG_GGML_TYPE_Q5_1},   {"q5_k", ENG_GGML_TYPE_Q5_K},
    {"q6_k", ENG_GGML_TYPE_Q6_K}, {"q4_k_m", ENG_MKMODEL_Q4_K_M}, {"q5_k_m", ENG_MKMODEL_Q5_K_M},
};

const char *eng_mkmodel_dtype_name(uint32_t dtype)
{
    for (size_t i = 0; i < PC_ARRAY_LEN(dtypes); i++)
        if (dtypes[i].dtype == dtype)
            return dtypes[i].name;
    return NULL;
}

int eng_mkmodel_dtype_parse(const char *name, uint32_t *dtype)
{
    for (size_t i = 0; i < PC_ARRAY_LEN(dtypes); i++)
        if (strcmp(dtypes[i].name, name) == 0) {
            *dtype = dtypes[i].dtype;
            return 0;
        }
    return PC_ERR_INVAL;
}

/* Llama 3.1's RoPE scaling as llama.cpp stores it: per frequency pair, the divisor of the
 * frequency (1 for high frequencies, `factor` for low ones, smooth in between). */
static float rope_factor(uint32_t i, uint32_t rope_dim, float theta)
{
    const float factor = 8.0f, low_freq_factor = 1.0f, high_freq_factor = 4.0f, old_ctx = 8192.0f;
    float freq = 1.0f / powf(theta, (float)(2 * i) / (float)rope_dim);
    float wavelen = 2.0f * (float)M_PI / freq;
    float low_wavelen = old_ctx / low_freq_factor, high_wavelen = old_ctx / high_freq_factor;
    if (wavelen < high_wavelen)
        return 1.0f;
    if (wavelen > low_wavelen)
        return factor;
    float smooth = (old_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
    return 1.0f / ((1.0f - smooth) / factor + smooth);
}

/* Converts n floats (whole rows, so whole blocks of a quantized type) to `type` into dst; the
 * bytes written go to *n_out. Returns 0 or PC_ERR_RANGE (a value the type cannot hold). */
static int convert(uint32_t type, const float *src, size_t n, uint8_t *dst, size_t *n_out)
{
    switch (type) {
    case ENG_GGML_TYPE_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = eng_f32_to_f16(src[i]);
            memcpy(dst + 2 * i, &h, 2);
        }
        *n_out = 2 * n;
        return 0;
    case ENG_GGML_TYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = eng_f32_to_bf16(src[i]);
            memcpy(dst + 2 * i, &h, 2);
        }
        *n_out = 2 * n;
        return 0;
    case ENG_GGML_TYPE_F32:
        memcpy(dst, src, 4 * n);
        *n_out = 4 * n;
        return 0;
    default:
        *n_out = eng_quant_row_bytes(type, n);
        return eng_quantize_row(type, src, dst, n);
    }
}

static int write_tensor(eng_gguf_writer_t *w, const eng_mkmodel_params_t *p, const tplan_t *t,
                        float *fbuf, uint8_t *obuf, char *err, size_t err_len)
{
    uint64_t s = name_seed(p->seed, t->name);
    uint64_t total = (uint64_t)t->ne[0] * (uint64_t)t->ne[1];
    uint64_t done = 0;
    /* Whole rows per chunk keep Q8_0 blocks intact (ne[0] is a multiple of 32). */
    uint64_t rows = CHUNK_ELEMS / (uint64_t)t->ne[0];
    if (rows == 0)
        rows = 1;
    uint32_t hd = p->head_dim != 0 ? p->head_dim : p->n_embd / p->n_head;
    while (done < total) {
        size_t n = (size_t)PC_MIN(total - done, rows * (uint64_t)t->ne[0]);
        for (size_t i = 0; i < n; i++) {
            switch (t->init) {
            case INIT_NORMAL:
                fbuf[i] = t->scale * unit_normal(&s);
                break;
            case INIT_NORM:
                fbuf[i] = 1.0f + 0.05f * unit_normal(&s);
                break;
            case INIT_ROPE_FREQS:
                fbuf[i] = rope_factor((uint32_t)(done + i), hd, p->rope_theta);
                break;
            }
        }
        size_t nb;
        int rc = convert(t->type, fbuf, n, obuf, &nb);
        if (rc != 0)
            return pc_err_setf(err, err_len, rc, "mkmodel: tensor %s: a weight does not fit %s",
                               t->name, eng_ggml_type_name(t->type));
        if ((rc = eng_gguf_writer_tensor_write(w, obuf, nb, err, err_len)) != 0)
            return rc;
        done += n;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Metadata
 * ------------------------------------------------------------------------------------------- */

static int set_hparams(eng_gguf_writer_t *w, const eng_mkmodel_params_t *p, uint32_t n_vocab)
{
    const char *arch = eng_arch_name(p->arch);
    uint32_t hd = p->head_dim != 0 ? p->head_dim : p->n_embd / p->n_head;
    uint32_t ftype = p->dtype == ENG_GGML_TYPE_F16    ? FTYPE_MOSTLY_F16
                     : p->dtype == ENG_GGML_TYPE_BF16 ? FTYPE_MOSTLY_BF16
                     : p->dtype == ENG_GGML_TYPE_Q8_0 ? FTYPE_MOSTLY_Q8_0
                     : p->dtype == ENG_GGML_TYPE_Q4_0 ? FTYPE_MOSTLY_Q4_0
                     : p->dtype == ENG_GGML_TYPE_Q5_0 ? FTYPE_MOSTLY_Q5_0
                     : p->dtype == ENG_GGML_TYPE_Q5_1 ? FTYPE_MOSTLY_Q5_1
                     : p->dtype == ENG_GGML_TYPE_Q4_K ? FTYPE_MOSTLY_Q4_K_S
                     : p->dtype == ENG_GGML_TYPE_Q5_K ? FTYPE_MOSTLY_Q5_K_S
                     : p->dtype == ENG_GGML_TYPE_Q6_K ? FTYPE_MOSTLY_Q6_K
                     : p->dtype == ENG_MKMODEL_Q4_K_M ? FTYPE_MOSTLY_Q4_K_M
                     : p->dtype == ENG_MKMODEL_Q5_K_M ? FTYPE_MOSTLY_Q5_K_M
                                                      : FTYPE_ALL_F32;
    bool mix = p->dtype == ENG_MKMODEL_Q4_K_M || p->dtype == ENG_MKMODEL_Q5_K_M;
    bool quant = mix || eng_quant_type_is_quant(p->dtype);
    char key[96];
    int rc;
#define K(sfx) (snprintf(key, sizeof key, "%s.%s", arch, sfx), key)
    if ((rc = eng_gguf_writer_set_str(w, "general.architecture", arch)) ||
        (rc =
             eng_gguf_writer_set_str(w, "general.name", p->name != NULL ? p->name : "kvgw-test")) ||
        (rc = eng_gguf_writer_set_u32(w, "general.file_type", ftype)) ||
        (quant && (rc = eng_gguf_writer_set_u32(w, "general.quantization_version", 2))) ||
        (rc = eng_gguf_writer_set_u32(w, K("vocab_size"), n_vocab)) ||
        (rc = eng_gguf_writer_set_u32(w, K("context_length"), p->n_ctx)) ||
        (rc = eng_gguf_writer_set_u32(w, K("embedding_length"), p->n_embd)) ||
        (rc = eng_gguf_writer_set_u32(w, K("block_count"), p->n_layer)) ||
        (rc = eng_gguf_writer_set_u32(w, K("feed_forward_length"), p->n_ff)) ||
        (rc = eng_gguf_writer_set_u32(w, K("attention.head_count"), p->n_head)) ||
        (rc = eng_gguf_writer_set_u32(w, K("attention.head_count_kv"), p->n_head_kv)) ||
        (rc = eng_gguf_writer_set_f32(w, K("attention.layer_norm_rms_epsilon"), p->rms_eps)) ||
        (rc = eng_gguf_writer_set_f32(w, K("rope.freq_base"), p->rope_theta)) ||
        (rc = eng_gguf_writer_set_u32(w, K("rope.dimension_count"), hd)))
        return rc;
    if (p->head_dim != 0 && ((rc = eng_gguf_writer_set_u32(w, K("attention.key_length"), hd)) ||
                             (rc = eng_gguf_writer_set_u32(w, K("attention.value_length"), hd))))
        return rc;
#undef K
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Entry points
 * ------------------------------------------------------------------------------------------- */

int eng_mkmodel_check(const eng_mkmodel_params_t *p, char *err, size_t err_len)
{
    if (p->arch != ENG_ARCH_LLAMA && p->arch != ENG_ARCH_QWEN2 && p->arch != ENG_ARCH_QWEN3)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "mkmodel: unknown architecture %d",
                           (int)p->arch);
    const struct {
        const char *what;
        uint32_t v, max;
    } counts[] = {
        {"layers", p->n_layer, 1024},     {"dim", p->n_embd, 1u << 16}, {"heads", p->n_head, 1024},
        {"kv-heads", p->n_head_kv, 1024}, {"ff", p->n_ff, 1u << 20},    {"ctx", p->n_ctx, 1u << 24},
    };
    for (size_t i = 0; i < PC_ARRAY_LEN(counts); i++)
        if (counts[i].v < 1 || counts[i].v > counts[i].max)
            return pc_err_setf(err, err_len, PC_ERR_INVAL,
                               "mkmodel: %s %" PRIu32 " not in 1..%" PRIu32, counts[i].what,
                               counts[i].v, counts[i].max);
    if (p->n_head % p->n_head_kv != 0)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "mkmodel: heads %" PRIu32 " is not a multiple of kv-heads %" PRIu32,
                           p->n_head, p->n_head_kv);
    if (p->head_dim == 0 && p->n_embd % p->n_head != 0)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "mkmodel: dim %" PRIu32 " is not a multiple of heads %" PRIu32,
                           p->n_embd, p->n_head);
    uint32_t hd = p->head_dim != 0 ? p->head_dim : p->n_embd / p->n_head;
    if (hd % 2 != 0 || hd > 1024)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "mkmodel: head size %" PRIu32 " must be even and <= 1024", hd);
    const char *dname = eng_mkmodel_dtype_name(p->dtype);
    if (dname == NULL)
        return pc_err_setf(
            err, err_len, PC_ERR_INVAL, "mkmodel: dtype %s not supported (" ENG_MKMODEL_DTYPES ")",
            eng_ggml_type_name(p->dtype) != NULL ? eng_ggml_type_name(p->dtype) : "?");
    /* Every matrix's input width (ne[0]) holds whole blocks of its type (a mix falls back to
     * blocks of 32 where a width is not whole super-blocks, as llama.cpp's does). */
    bool mix = p->dtype == ENG_MKMODEL_Q4_K_M || p->dtype == ENG_MKMODEL_Q5_K_M;
    uint32_t bs = mix ? ENG_QK4_0 : eng_ggml_type_block_size(p->dtype);
    if (p->n_embd % bs != 0 || p->n_ff % bs != 0 || (p->n_head * hd) % bs != 0)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "mkmodel: %s needs dim, ff and heads * head size to be multiples "
                           "of %" PRIu32,
                           dname, bs);
    if (!(p->rope_theta > 0.0f && p->rope_theta < 1e12f))
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "mkmodel: rope theta %g not in (0, 1e12)",
                           (double)p->rope_theta);
    if (!(p->rms_eps > 0.0f && p->rms_eps < 1.0f))
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "mkmodel: rms eps %g not in (0, 1)",
                           (double)p->rms_eps);
    return 0;
}

int eng_mkmodel_write(const eng_mkmodel_params_t *p, const eng_vocab_t *vocab, const char *path,
                      char *err, size_t err_len)
{
    eng_gguf_writer_t *w = NULL;
    plan_t pl = {0};
    float *fbuf = NULL;
    uint8_t *obuf = NULL;
    int rc = eng_mkmodel_check(p, err, err_len);
    if (rc != 0)
        return rc;
    if (vocab == NULL || vocab->n_tokens == 0 || vocab->tokens == NULL || vocab->model == NULL)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "mkmodel: empty vocabulary");
    if ((rc = eng_gguf_writer_init(p->alignment, &w)) != 0) {
        pc_err_setf(err, err_len, rc, "mkmodel: alignment %" PRIu32 ": %s", p->alignment,
                    pc_strerror(rc));
        goto fail;
    }
    if ((rc = set_hparams(w, p, vocab->n_tokens)) != 0 || (rc = eng_vocab_to_gguf(vocab, w)) != 0) {
        pc_err_setf(err, err_len, rc, "mkmodel: metadata: %s", pc_strerror(rc));
        goto fail;
    }
    if ((rc = build_plan(p, vocab->n_tokens, &pl)) != 0) {
        pc_err_setf(err, err_len, rc, "mkmodel: tensor plan: %s", pc_strerror(rc));
        goto fail;
    }
    for (size_t i = 0; i < pl.n; i++) {
        const tplan_t *t = &pl.t[i];
        int64_t ne[2] = {t->ne[0], t->ne[1]};
        if ((rc = eng_gguf_writer_tensor_add(w, t->name, t->type, t->n_dims, ne)) != 0) {
            pc_err_setf(err, err_len, rc, "mkmodel: tensor %s: %s", t->name, pc_strerror(rc));
            goto fail;
        }
    }
    /* One chunk: at least a full row of the widest tensor. */
    size_t max_row = 0;
    for (size_t i = 0; i < pl.n; i++)
        max_row = PC_MAX(max_row, (size_t)pl.t[i].ne[0]);
    size_t chunk = PC_MAX((size_t)CHUNK_ELEMS, max_row);
    fbuf = pc_malloc(chunk * sizeof *fbuf);
    obuf = pc_malloc(chunk * sizeof *fbuf);
    if (fbuf == NULL || obuf == NULL) {
        rc = pc_err_setf(err, err_len, PC_ERR_NOMEM, "mkmodel: out of memory");
        goto fail;
    }
    if ((rc = eng_gguf_writer_file_begin(w, path, err, err_len)) != 0)
        goto fail;
    uint64_t total = 0, done = 0;
    for (size_t i = 0; i < pl.n; i++)
        total += (uint64_t)(pl.t[i].ne[0] * pl.t[i].ne[1]);
    for (size_t i = 0; i < pl.n; i++) {
        if ((rc = write_tensor(w, p, &pl.t[i], fbuf, obuf, err, err_len)) != 0)
            goto fail;
        done += (uint64_t)(pl.t[i].ne[0] * pl.t[i].ne[1]);
        if (p->progress != NULL)
            p->progress(done, total, p->progress_ud);
    }
    rc = eng_gguf_writer_file_finish(w, err, err_len);
fail:
    pc_free(fbuf);
    pc_free(obuf);
    pc_free(pl.t);
    eng_gguf_writer_free(w);
    return rc;
}
