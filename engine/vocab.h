/*
 * vocab.h — a model's vocabulary as plain arrays: what the tokenizer is built from.
 *
 * Two sources fill it: a GGUF file's tokenizer.ggml.* metadata (what a worker and the gateway
 * use at run time, so both tokenize identically), and a Hugging Face tokenizer.json (+ optional
 * tokenizer_config.json), which `kvgw mkmodel` converts into that GGUF metadata.
 *
 * Field meanings follow GGUF's tokenizer.ggml.* keys:
 *   model        "gpt2" (byte-level BPE) or "llama" (SentencePiece-style BPE)
 *   pre          pre-tokenizer name: "llama-bpe", "qwen2", "default" (GPT-2), ...
 *   tokens       token strings exactly as stored (byte-level BPE uses the GPT-2 byte-to-unicode
 *                mapping; SentencePiece uses U+2581 for spaces and <0xNN> byte tokens)
 *   scores       per-token scores (SentencePiece merge priority), may be NULL
 *   token_type   per-token type (ENG_TOKEN_TYPE_*), may be NULL = all normal
 *   merges       "left right" strings in rank order (byte-level BPE), may be empty
 *   special ids  -1 when absent
 *   chat_template the raw Jinja text (the renderer only detects its family)
 */
#ifndef ENG_VOCAB_H
#define ENG_VOCAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct eng_gguf; /* engine/gguf.h */

enum eng_token_type {
    ENG_TOKEN_TYPE_UNDEFINED = 0,
    ENG_TOKEN_TYPE_NORMAL = 1,
    ENG_TOKEN_TYPE_UNKNOWN = 2,
    ENG_TOKEN_TYPE_CONTROL = 3,
    ENG_TOKEN_TYPE_USER_DEFINED = 4,
    ENG_TOKEN_TYPE_UNUSED = 5,
    ENG_TOKEN_TYPE_BYTE = 6,
};

typedef struct eng_vocab {
    char *model; /* "gpt2" | "llama" */
    char *pre;   /* pre-tokenizer name; "default" when the source names none */
    uint32_t n_tokens;
    char **tokens;       /* [n_tokens] NUL-terminated UTF-8 */
    float *scores;       /* [n_tokens] or NULL */
    int32_t *token_type; /* [n_tokens] or NULL */
    uint32_t n_merges;
    char **merges; /* [n_merges] "left right" */
    int32_t bos_id, eos_id, eot_id, eom_id, pad_id, unk_id;
    bool add_bos;        /* the chat format starts with BOS */
    char *chat_template; /* or NULL */
} eng_vocab_t;

/* Reads tokenizer.ggml.* from an open GGUF file into a newly allocated vocab (*out; free with
 * eng_vocab_free). Returns 0, PC_ERR_FORMAT (with a message in err[err_len] naming the key) or
 * PC_ERR_NOMEM. */
int eng_vocab_from_gguf(const struct eng_gguf *g, eng_vocab_t **out, char *err, size_t err_len);

/* Reads a Hugging Face tokenizer.json (and tokenizer_config.json when config_path is not NULL:
 * chat template, bos/eos/pad tokens, add_bos) into a new vocab. Added tokens marked special
 * become ENG_TOKEN_TYPE_CONTROL, others USER_DEFINED; eot is found by its usual spellings
 * (<|eot_id|>, <|im_end|>), eos falls back to it. Returns 0, PC_ERR_IO, PC_ERR_FORMAT,
 * PC_ERR_UNSUPPORTED (not BPE, or a pre-tokenizer regex kvgw does not implement) or
 * PC_ERR_NOMEM, with a one-line reason in err. The mapping is described in vocab.c. */
int eng_vocab_from_tokenizer_json(const char *json_path, const char *config_path, eng_vocab_t **out,
                                  char *err, size_t err_len);

/* Writes the vocab as tokenizer.ggml.* metadata (and tokenizer.chat_template) into a GGUF
 * writer that has not begun its file: the keys eng_vocab_from_gguf reads, so a round trip gives
 * an identical vocab. Absent special ids and NULL arrays are left out. Returns 0 or the
 * writer's error (PC_ERR_EXISTS if a key is already set, PC_ERR_STATE, PC_ERR_NOMEM). */
struct eng_gguf_writer;
int eng_vocab_to_gguf(const eng_vocab_t *v, struct eng_gguf_writer *w);

void eng_vocab_free(eng_vocab_t *v);

#endif
