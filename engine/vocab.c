/*
 * vocab.c — fills an eng_vocab_t from a GGUF file's tokenizer.ggml.* metadata or from a Hugging
 * Face tokenizer.json (+ tokenizer_config.json).
 *
 * Invariants of a vocab this file returns: model is "gpt2" or "llama"; every tokens[i] is a
 * non-NULL string (ids that a tokenizer.json leaves unassigned become "[PAD<i>]" of type
 * UNUSED, as llama.cpp's converter does); merges are "left right" strings in rank order; special
 * ids are -1 or < n_tokens. Either every array is complete or the function failed and returned
 * nothing.
 *
 * tokenizer.json mapping (what `kvgw mkmodel` writes into a GGUF):
 *   - model "gpt2" when the pre-tokenizer or decoder is ByteLevel; "llama" for a BPE model with
 *     byte_fallback and a U+2581 (Metaspace / Replace) normalizer or pre-tokenizer.
 *   - pre: the Split regex of the pre-tokenizer is compared with the known ones: Llama 3's gives
 *     "llama-bpe", Qwen 2/3's "qwen2"; a bare ByteLevel(use_regex) gives GPT-2's "default".
 *     Anything else is PC_ERR_UNSUPPORTED: a tokenizer we would split differently is refused.
 *   - token_type: added tokens marked special are CONTROL, other added tokens USER_DEFINED,
 *     "<0xNN>" tokens of a "llama" vocab BYTE, the rest NORMAL.
 *   - scores: NULL for "gpt2"; for "llama" the SentencePiece convention "higher merges first":
 *     the token produced by merge rank r scores -r, so a score-driven merge loop reproduces the
 *     merge order of the tokenizer.json exactly.
 */
#include "vocab.h"

#include "common.h"
#include "gguf.h"
#include "tokenizer_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void eng_vocab_free(eng_vocab_t *v)
{
    if (v == NULL)
        return;
    if (v->tokens != NULL)
        for (uint32_t i = 0; i < v->n_tokens; i++)
            pc_free(v->tokens[i]);
    if (v->merges != NULL)
        for (uint32_t i = 0; i < v->n_merges; i++)
            pc_free(v->merges[i]);
    pc_free(v->tokens);
    pc_free(v->merges);
    pc_free(v->scores);
    pc_free(v->token_type);
    pc_free(v->model);
    pc_free(v->pre);
    pc_free(v->chat_template);
    pc_free(v);
}

static eng_vocab_t *vocab_new(void)
{
    eng_vocab_t *v = pc_calloc(1, sizeof *v);
    if (v == NULL)
        return NULL;
    v->bos_id = v->eos_id = v->eot_id = v->eom_id = v->pad_id = v->unk_id = -1;
    return v;
}

/* ---- GGUF ------------------------------------------------------------------------------- */

static int gguf_fail(char *err, size_t err_len, const char *key, const char *why)
{
    return pc_err_setf(err, err_len, PC_ERR_FORMAT, "GGUF key %s: %s", key, why);
}

/* An optional string (required: a missing key is a format error); *out is a new copy. */
static int gguf_str(const struct eng_gguf *g, const char *key, char **out, bool required, char *err,
                    size_t err_len)
{
    pc_slice_t s;
    int rc = eng_gguf_get_str(g, key, &s, NULL, 0);
    if (rc == PC_ERR_NOTFOUND && !required)
        return 0;
    if (rc != 0)
        return gguf_fail(err, err_len, key, rc == PC_ERR_NOTFOUND ? "missing" : "not a string");
    if (memchr(s.base, '\0', s.len) != NULL)
        return gguf_fail(err, err_len, key, "embedded NUL");
    *out = pc_strndup(s.base, s.len);
    return *out == NULL ? PC_ERR_NOMEM : 0;
}

/* An optional special-token id; out of range ids are a format error. */
static int gguf_id(const struct eng_gguf *g, const char *key, uint32_t n_tokens, int32_t *out,
                   char *err, size_t err_len)
{
    uint32_t x = 0;
    int rc = eng_gguf_get_u32(g, key, &x, NULL, 0);
    if (rc == PC_ERR_NOTFOUND)
        return 0;
    if (rc != 0) {
        int32_t neg = 0; /* some writers store -1 for "none" */
        if (eng_gguf_get_i32(g, key, &neg, NULL, 0) == 0 && neg == -1)
            return 0;
        return gguf_fail(err, err_len, key, "not a token id");
    }
    if (x >= n_tokens)
        return gguf_fail(err, err_len, key, "token id out of range");
    *out = (int32_t)x;
    return 0;
}

/* A string array copied into n NUL-terminated strings. A missing optional key leaves *out NULL. */
static int gguf_str_array(const struct eng_gguf *g, const char *key, bool required, char ***out,
                          uint32_t *n_out, char *err, size_t err_len)
{
    const eng_gguf_val_t *arr = NULL;
    int rc = eng_gguf_get_arr(g, key, ENG_GGUF_STRING, &arr, NULL, 0);
    if (rc == PC_ERR_NOTFOUND && !required)
        return 0;
    if (rc != 0)
        return gguf_fail(err, err_len, key,
                         rc == PC_ERR_NOTFOUND ? "missing" : "not an array of strings");
    if (arr->n >= UINT32_MAX)
        return gguf_fail(err, err_len, key, "too many entries");
    char **a = pc_calloc(arr->n ? arr->n : 1, sizeof *a);
    if (a == NULL)
        return PC_ERR_NOMEM;
    for (uint64_t i = 0; i < arr->n; i++) {
        eng_gguf_val_t e;
        pc_slice_t s;
        if (eng_gguf_val_at(arr, i, &e) != 0 || eng_gguf_val_str(&e, &s) != 0 ||
            memchr(s.base, '\0', s.len) != NULL) {
            rc = gguf_fail(err, err_len, key, "bad string element");
            goto fail;
        }
        if ((a[i] = pc_strndup(s.base, s.len)) == NULL) {
            rc = PC_ERR_NOMEM;
            goto fail;
        }
    }
    *out = a;
    *n_out = (uint32_t)arr->n;
    return 0;
fail:
    for (uint64_t i = 0; i < arr->n; i++)
        pc_free(a[i]);
    pc_free(a);
    return rc;
}

int eng_vocab_from_gguf(const struct eng_gguf *g, eng_vocab_t **out, char *err, size_t err_len)
{
    const eng_gguf_val_t *arr = NULL;
    eng_vocab_t *v = vocab_new();
    int rc = PC_ERR_NOMEM;
    if (v == NULL)
        goto fail;
    if ((rc = gguf_str(g, "tokenizer.ggml.model", &v->model, true, err, err_len)) != 0 ||
        (rc = gguf_str(g, "tokenizer.ggml.pre", &v->pre, false, err, err_len)) != 0)
        goto fail;
    if (v->pre == NULL && (v->pre = pc_strdup("default")) == NULL) {
        rc = PC_ERR_NOMEM;
        goto fail;
    }
    rc = gguf_str_array(g, "tokenizer.ggml.tokens", true, &v->tokens, &v->n_tokens, err, err_len);
    if (rc != 0)
        goto fail;
    if (v->n_tokens == 0) {
        rc = gguf_fail(err, err_len, "tokenizer.ggml.tokens", "empty");
        goto fail;
    }
    rc = gguf_str_array(g, "tokenizer.ggml.merges", false, &v->merges, &v->n_merges, err, err_len);
    if (rc != 0)
        goto fail;

    rc = eng_gguf_get_arr(g, "tokenizer.ggml.scores", ENG_GGUF_VTYPE_COUNT, &arr, NULL, 0);
    if (rc == 0) {
        if (arr->n != v->n_tokens) {
            rc = gguf_fail(err, err_len, "tokenizer.ggml.scores", "length differs from tokens");
            goto fail;
        }
        rc = PC_ERR_NOMEM;
        if ((v->scores = pc_malloc(arr->n * sizeof *v->scores)) == NULL)
            goto fail;
        if (eng_gguf_arr_copy_f32(arr, v->scores) != 0) {
            rc = gguf_fail(err, err_len, "tokenizer.ggml.scores", "not an array of floats");
            goto fail;
        }
    } else if (rc != PC_ERR_NOTFOUND) {
        rc = gguf_fail(err, err_len, "tokenizer.ggml.scores", "not an array");
        goto fail;
    }
    rc = eng_gguf_get_arr(g, "tokenizer.ggml.token_type", ENG_GGUF_VTYPE_COUNT, &arr, NULL, 0);
    if (rc == 0) {
        if (arr->n != v->n_tokens) {
            rc = gguf_fail(err, err_len, "tokenizer.ggml.token_type", "length differs from tokens");
            goto fail;
        }
        rc = PC_ERR_NOMEM;
        if ((v->token_type = pc_malloc(arr->n * sizeof *v->token_type)) == NULL)
            goto fail;
        if (eng_gguf_arr_copy_i32(arr, v->token_type) != 0) {
            rc = gguf_fail(err, err_len, "tokenizer.ggml.token_type", "not an array of ints");
            goto fail;
        }
    } else if (rc != PC_ERR_NOTFOUND) {
        rc = gguf_fail(err, err_len, "tokenizer.ggml.token_type", "not an array");
        goto fail;
    }

    static const struct {
        const char *key;
        size_t off;
    } ids[] = {
        {"tokenizer.ggml.bos_token_id", offsetof(eng_vocab_t, bos_id)},
        {"tokenizer.ggml.eos_token_id", offsetof(eng_vocab_t, eos_id)},
        {"tokenizer.ggml.eot_token_id", offsetof(eng_vocab_t, eot_id)},
        {"tokenizer.ggml.eom_token_id", offsetof(eng_vocab_t, eom_id)},
        {"tokenizer.ggml.padding_token_id", offsetof(eng_vocab_t, pad_id)},
        {"tokenizer.ggml.unknown_token_id", offsetof(eng_vocab_t, unk_id)},
    };
    for (size_t i = 0; i < PC_ARRAY_LEN(ids); i++) {
        int32_t *dst = (int32_t *)((char *)v + ids[i].off);
        if ((rc = gguf_id(g, ids[i].key, v->n_tokens, dst, err, err_len)) != 0)
            goto fail;
    }
    bool add_bos = false;
    rc = eng_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos, NULL, 0);
    if (rc != 0 && rc != PC_ERR_NOTFOUND) {
        rc = gguf_fail(err, err_len, "tokenizer.ggml.add_bos_token", "not a bool");
        goto fail;
    }
    v->add_bos = add_bos;
    if ((rc = gguf_str(g, "tokenizer.chat_template", &v->chat_template, false, err, err_len)) != 0)
        goto fail;
    *out = v;
    return 0;
fail:
    if (rc == PC_ERR_NOMEM)
        pc_err_setf(err, err_len, rc, "out of memory reading the GGUF vocab");
    eng_vocab_free(v);
    return rc;
}

/* ---- tokenizer.json ----------------------------------------------------------------------- */

static json_t *load_json(const char *path, size_t flags, int *rc, char *err, size_t err_len)
{
    json_error_t je;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        *rc = pc_err_setf(err, err_len, PC_ERR_IO, "cannot open %s", path);
        return NULL;
    }
    json_t *j = json_loadf(f, flags, &je);
    fclose(f);
    if (j == NULL || !json_is_object(j)) {
        *rc = pc_err_setf(err, err_len, PC_ERR_FORMAT, "%s: %s (line %d)", path,
                          j ? "not a JSON object" : je.text, j ? 0 : je.line);
        json_decref(j);
        return NULL;
    }
    return j;
}

/* True when the JSON value (a pre-tokenizer, decoder or normalizer) or any part of a Sequence
 * of them has "type" == type. */
static bool json_has_type(const json_t *x, const char *type)
{
    if (!json_is_object(x))
        return false;
    const char *t = json_string_value(json_object_get(x, "type"));
    if (t != NULL && strcmp(t, type) == 0)
        return true;
    static const char *const lists[] = {"pretokenizers", "decoders", "normalizers"};
    for (size_t i = 0; i < PC_ARRAY_LEN(lists); i++) {
        const json_t *a = json_object_get(x, lists[i]);
        size_t k;
        const json_t *e;
        json_array_foreach(a, k, e) if (json_has_type(e, type)) return true;
    }
    return false;
}

/* The Split regex of a pre-tokenizer (first one found), or NULL. */
static const char *json_split_regex(const json_t *x)
{
    if (!json_is_object(x))
        return NULL;
    const char *t = json_string_value(json_object_get(x, "type"));
    if (t != NULL && strcmp(t, "Split") == 0)
        return json_string_value(json_object_get(json_object_get(x, "pattern"), "Regex"));
    const json_t *a = json_object_get(x, "pretokenizers");
    size_t k;
    const json_t *e;
    json_array_foreach(a, k, e)
    {
        const char *r = json_split_regex(e);
        if (r != NULL)
            return r;
    }
    return NULL;
}

/* A token spelled in tokenizer_config.json: a string or {"content": ...}; NULL when absent. */
static const char *config_token(const json_t *cfg, const char *key)
{
    const json_t *x = json_object_get(cfg, key);
    if (json_is_object(x))
        x = json_object_get(x, "content");
    return json_string_value(x);
}

static int32_t find_token(const eng_vocab_t *v, const char *s)
{
    if (s == NULL)
        return -1;
    for (uint32_t i = v->n_tokens; i-- > 0;) /* added tokens sit at the end */
        if (v->tokens[i] != NULL && strcmp(v->tokens[i], s) == 0)
            return (int32_t)i;
    return -1;
}

static int put_token(eng_vocab_t *v, json_int_t id, const char *s, int32_t type, char *err,
                     size_t err_len)
{
    if (id < 0 || id >= (json_int_t)v->n_tokens) {
        return pc_err_setf(err, err_len, PC_ERR_FORMAT, "token id %lld out of range",
                           (long long)id);
    }
    if (v->tokens[id] != NULL) {
        if (strcmp(v->tokens[id], s) == 0) { /* added token repeating a vocab entry */
            v->token_type[id] = type;
            return 0;
        }
        return pc_err_setf(err, err_len, PC_ERR_FORMAT, "token id %lld assigned twice",
                           (long long)id);
    }
    if ((v->tokens[id] = pc_strdup(s)) == NULL)
        return PC_ERR_NOMEM;
    v->token_type[id] = type;
    return 0;
}

static bool is_byte_token(const char *s)
{
    return strlen(s) == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' &&
           strchr("0123456789ABCDEF", s[3]) != NULL && strchr("0123456789ABCDEF", s[4]) != NULL;
}

int eng_vocab_from_tokenizer_json(const char *json_path, const char *config_path, eng_vocab_t **out,
                                  char *err, size_t err_len)
{
    int rc = 0;
    json_t *tj = NULL, *cfg = NULL;
    eng_vocab_t *v = NULL;
    char *pair = NULL;

    if ((tj = load_json(json_path, 0, &rc, err, err_len)) == NULL)
        goto fail;
    /* The config's numbers (model_max_length = 1e30) may not fit an integer; only its strings
     * and booleans are read. */
    if (config_path != NULL &&
        (cfg = load_json(config_path, JSON_DECODE_INT_AS_REAL, &rc, err, err_len)) == NULL)
        goto fail;

    const json_t *model = json_object_get(tj, "model");
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *merges = json_object_get(model, "merges");
    const json_t *added = json_object_get(tj, "added_tokens");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (mtype == NULL || strcmp(mtype, "BPE") != 0 || !json_is_object(vocab) ||
        (merges != NULL && !json_is_array(merges)) || (added != NULL && !json_is_array(added))) {
        rc = pc_err_setf(err, err_len,
                         mtype != NULL && strcmp(mtype, "BPE") != 0 ? PC_ERR_UNSUPPORTED
                                                                    : PC_ERR_FORMAT,
                         "%s: model is not BPE with a vocab object (type %s)", json_path,
                         mtype ? mtype : "missing");
        goto fail;
    }

    rc = PC_ERR_NOMEM;
    if ((v = vocab_new()) == NULL)
        goto fail;

    /* Which family: byte-level BPE or SentencePiece-style BPE. */
    const json_t *pre_tok = json_object_get(tj, "pre_tokenizer");
    const json_t *decoder = json_object_get(tj, "decoder");
    const json_t *normalizer = json_object_get(tj, "normalizer");
    const char *pre = NULL;
    if (json_has_type(pre_tok, "ByteLevel") || json_has_type(decoder, "ByteLevel")) {
        v->model = pc_strdup("gpt2");
        const char *re = json_split_regex(pre_tok);
        if (re == NULL) {
            pre = "default";
        } else {
            pre = eng__tok_pre_name(re);
        }
        if (pre == NULL) {
            rc = pc_err_setf(err, err_len, PC_ERR_UNSUPPORTED,
                             "%s: unsupported pre-tokenizer regex %.80s", json_path, re);
            goto fail;
        }
    } else if (json_is_true(json_object_get(model, "byte_fallback")) &&
               (json_has_type(pre_tok, "Metaspace") || json_has_type(normalizer, "Replace") ||
                json_has_type(normalizer, "Prepend"))) {
        v->model = pc_strdup("llama");
        pre = "default";
    } else {
        rc = pc_err_setf(err, err_len, PC_ERR_UNSUPPORTED,
                         "%s: neither byte-level nor SentencePiece-style BPE", json_path);
        goto fail;
    }
    if (v->model == NULL || (v->pre = pc_strdup(pre)) == NULL)
        goto fail;
    bool spm = strcmp(v->model, "llama") == 0;

    /* Size: the largest id over the vocab and the added tokens. */
    json_int_t max_id = -1;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vocab, key, val)
    {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            json_integer_value(val) > INT32_MAX - 1) {
            rc = pc_err_setf(err, err_len, PC_ERR_FORMAT, "%s: vocab entry '%.40s' has a bad id",
                             json_path, key);
            goto fail;
        }
        if (json_integer_value(val) > max_id)
            max_id = json_integer_value(val);
    }
    size_t k;
    json_t *e;
    json_array_foreach(added, k, e)
    {
        json_int_t id = json_integer_value(json_object_get(e, "id"));
        if (!json_is_integer(json_object_get(e, "id")) || id < 0 || id > INT32_MAX - 1 ||
            !json_is_string(json_object_get(e, "content"))) {
            rc = pc_err_setf(err, err_len, PC_ERR_FORMAT,
                             "%s: added_tokens[%zu] lacks an id or content", json_path, k);
            goto fail;
        }
        if (id > max_id)
            max_id = id;
    }
    if (max_id < 0) {
        rc = pc_err_setf(err, err_len, PC_ERR_FORMAT, "%s: empty vocab", json_path);
        goto fail;
    }
    v->n_tokens = (uint32_t)max_id + 1;
    rc = PC_ERR_NOMEM;
    if ((v->tokens = pc_calloc(v->n_tokens, sizeof *v->tokens)) == NULL ||
        (v->token_type = pc_calloc(v->n_tokens, sizeof *v->token_type)) == NULL)
        goto fail;

    json_object_foreach((json_t *)vocab, key, val)
    {
        int32_t type = spm && is_byte_token(key) ? ENG_TOKEN_TYPE_BYTE : ENG_TOKEN_TYPE_NORMAL;
        if ((rc = put_token(v, json_integer_value(val), key, type, err, err_len)) != 0)
            goto fail;
    }
    json_array_foreach(added, k, e)
    {
        int32_t type = json_is_true(json_object_get(e, "special")) ? ENG_TOKEN_TYPE_CONTROL
                                                                   : ENG_TOKEN_TYPE_USER_DEFINED;
        rc = put_token(v, json_integer_value(json_object_get(e, "id")),
                       json_string_value(json_object_get(e, "content")), type, err, err_len);
        if (rc != 0)
            goto fail;
    }
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        if (v->tokens[i] != NULL)
            continue;
        char name[32];
        snprintf(name, sizeof name, "[PAD%u]", i);
        rc = PC_ERR_NOMEM;
        if ((v->tokens[i] = pc_strdup(name)) == NULL)
            goto fail;
        v->token_type[i] = ENG_TOKEN_TYPE_UNUSED;
    }

    /* Merges: "a b" strings or ["a", "b"] pairs, kept in rank order as "a b". */
    size_t n_merges = json_array_size(merges);
    rc = PC_ERR_NOMEM;
    if ((v->merges = pc_calloc(n_merges ? n_merges : 1, sizeof *v->merges)) == NULL)
        goto fail;
    json_array_foreach(merges, k, e)
    {
        const char *s = json_string_value(e);
        if (s != NULL) {
            if (strchr(s + (s[0] != '\0'), ' ') == NULL) {
                rc = pc_err_setf(err, err_len, PC_ERR_FORMAT,
                                 "%s: merges[%zu] is not \"left right\"", json_path, k);
                goto fail;
            }
            pair = pc_strdup(s);
        } else {
            const char *a = json_string_value(json_array_get(e, 0));
            const char *b = json_string_value(json_array_get(e, 1));
            if (json_array_size(e) != 2 || a == NULL || b == NULL || a[0] == '\0' || b[0] == '\0') {
                rc = pc_err_setf(err, err_len, PC_ERR_FORMAT,
                                 "%s: merges[%zu] is not a pair of strings", json_path, k);
                goto fail;
            }
            size_t la = strlen(a), lb = strlen(b);
            if ((pair = pc_malloc(la + lb + 2)) != NULL) {
                memcpy(pair, a, la);
                pair[la] = ' ';
                memcpy(pair + la + 1, b, lb + 1);
            }
        }
        rc = PC_ERR_NOMEM;
        if (pair == NULL)
            goto fail;
        v->merges[v->n_merges++] = pair;
        pair = NULL;
    }

    /* SentencePiece scores: the token made by merge rank r scores -r, others -n_merges. */
    if (spm) {
        rc = PC_ERR_NOMEM;
        if ((v->scores = pc_malloc(v->n_tokens * sizeof *v->scores)) == NULL)
            goto fail;
        for (uint32_t i = 0; i < v->n_tokens; i++)
            v->scores[i] = -(float)v->n_merges - 1.0f;
        for (uint32_t r = 0; r < v->n_merges; r++) {
            char *m = v->merges[r];
            char *sp = strchr(m + 1, ' ');
            size_t la = (size_t)(sp - m), lb = strlen(sp + 1);
            char buf[512];
            if (la + lb >= sizeof buf)
                continue;
            memcpy(buf, m, la);
            memcpy(buf + la, sp + 1, lb + 1);
            json_t *id = json_object_get(vocab, buf);
            if (json_is_integer(id) && v->scores[json_integer_value(id)] < -(float)r)
                continue; /* keep the first (lowest-rank) merge that makes it */
            if (json_is_integer(id))
                v->scores[json_integer_value(id)] = -(float)r;
        }
    }

    /* Special tokens. */
    v->unk_id = find_token(v, json_string_value(json_object_get(model, "unk_token")));
    if (cfg != NULL) {
        v->bos_id = find_token(v, config_token(cfg, "bos_token"));
        v->eos_id = find_token(v, config_token(cfg, "eos_token"));
        v->pad_id = find_token(v, config_token(cfg, "pad_token"));
        if (v->unk_id < 0)
            v->unk_id = find_token(v, config_token(cfg, "unk_token"));
        const json_t *ab = json_object_get(cfg, "add_bos_token");
        v->add_bos = json_is_boolean(ab) ? json_is_true(ab) : v->bos_id >= 0;
        const json_t *tpl = json_object_get(cfg, "chat_template");
        if (json_is_array(tpl)) { /* [{"name": "default", "template": ...}, ...] */
            const json_t *pick = json_array_get(tpl, 0);
            json_array_foreach(tpl, k, e)
            {
                const char *name = json_string_value(json_object_get(e, "name"));
                if (name != NULL && strcmp(name, "default") == 0)
                    pick = e;
            }
            tpl = json_object_get(pick, "template");
        }
        if (json_is_string(tpl) && (v->chat_template = pc_strdup(json_string_value(tpl))) == NULL)
            goto fail;
    }
    /* End-of-turn markers by their well-known spellings (Llama 3, ChatML, Gemma). */
    static const char *const eot_names[] = {"<|eot_id|>", "<|im_end|>", "<end_of_turn>"};
    for (size_t i = 0; i < PC_ARRAY_LEN(eot_names) && v->eot_id < 0; i++)
        v->eot_id = find_token(v, eot_names[i]);
    v->eom_id = find_token(v, "<|eom_id|>");
    if (v->eos_id < 0)
        v->eos_id = v->eot_id;

    json_decref(tj);
    json_decref(cfg);
    *out = v;
    return 0;
fail:
    if (rc == PC_ERR_NOMEM)
        pc_err_setf(err, err_len, rc, "out of memory reading %s", json_path);
    pc_free(pair);
    eng_vocab_free(v);
    json_decref(tj);
    json_decref(cfg);
    return rc;
}

/* ---- writing a vocab into a GGUF ------------------------------------------------------------ */

int eng_vocab_to_gguf(const eng_vocab_t *v, struct eng_gguf_writer *w)
{
    int rc;
    if ((rc = eng_gguf_writer_set_str(w, "tokenizer.ggml.model", v->model)) != 0 ||
        (rc = eng_gguf_writer_set_str(w, "tokenizer.ggml.pre", v->pre ? v->pre : "default")) != 0 ||
        (rc = eng_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens",
                                          (const char *const *)v->tokens, v->n_tokens)) != 0)
        return rc;
    if (v->n_merges > 0 &&
        (rc = eng_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges",
                                          (const char *const *)v->merges, v->n_merges)) != 0)
        return rc;
    if (v->scores != NULL && (rc = eng_gguf_writer_set_arr(w, "tokenizer.ggml.scores", ENG_GGUF_F32,
                                                           v->scores, v->n_tokens)) != 0)
        return rc;
    if (v->token_type != NULL &&
        (rc = eng_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", ENG_GGUF_I32, v->token_type,
                                      v->n_tokens)) != 0)
        return rc;
    const struct {
        const char *key;
        int32_t id;
    } ids[] = {
        {"tokenizer.ggml.bos_token_id", v->bos_id},
        {"tokenizer.ggml.eos_token_id", v->eos_id},
        {"tokenizer.ggml.eot_token_id", v->eot_id},
        {"tokenizer.ggml.eom_token_id", v->eom_id},
        {"tokenizer.ggml.padding_token_id", v->pad_id},
        {"tokenizer.ggml.unknown_token_id", v->unk_id},
    };
    for (size_t i = 0; i < PC_ARRAY_LEN(ids); i++)
        if (ids[i].id >= 0 &&
            (rc = eng_gguf_writer_set_u32(w, ids[i].key, (uint32_t)ids[i].id)) != 0)
            return rc;
    if ((rc = eng_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos)) != 0)
        return rc;
    if (v->chat_template != NULL &&
        (rc = eng_gguf_writer_set_str(w, "tokenizer.chat_template", v->chat_template)) != 0)
        return rc;
    return 0;
}
