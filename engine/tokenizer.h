/*
 * tokenizer.h — the model's own tokenizer: byte-level BPE (GPT-2 style, Llama 3, Qwen) and
 * SentencePiece-style BPE (Llama 2, Mistral), built from an eng_vocab_t.
 *
 * Contract that prefix caching rests on: eng_tok_encode tokenizes *ordinary text only*. Text
 * that spells a special token ("<|eot_id|>") is encoded as ordinary text, never as the control
 * token; control tokens are produced only by the prompt renderer through eng_tok_special_id.
 * The gateway and every worker build the tokenizer from the same GGUF metadata, so their ids
 * agree exactly.
 *
 * Thread safety: an eng_tok_t is immutable after init except for internal caches, which are
 * safe for concurrent eng_tok_encode calls from several threads.
 */
#ifndef ENG_TOKENIZER_H
#define ENG_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pc_buf.h"
#include "vocab.h"

/* The most bytes one eng_tok_stream_feed or _flush call writes (tokens are at most 320 bytes;
 * invalid bytes become 3-byte U+FFFD). */
#define ENG_TOK_STREAM_OUT_MAX 1024

typedef struct eng_tok eng_tok_t;

/* Builds a tokenizer from a vocab (copied; the vocab may be freed afterwards). Returns 0, or
 * PC_ERR_UNSUPPORTED (unknown model / pre-tokenizer), PC_ERR_FORMAT (a byte-level vocab
 * without all 256 byte tokens, a merge naming unknown tokens, a token over 320 bytes),
 * PC_ERR_NOMEM with a one-line reason in err. pre "qwen2" implies NFC normalization and
 * "llama-bpe" whole-piece vocab lookups before merging (both as their tokenizer.json files). */
int eng_tok_init(const eng_vocab_t *v, eng_tok_t **out, char *err, size_t err_len);
void eng_tok_free(eng_tok_t *t);

/* Token ids of ordinary text, appended to *ids (a growable array: *ids may be realloc'ed
 * through the pc_alloc hooks; *n_ids and *cap are updated). len bytes of UTF-8 (invalid bytes
 * are encoded as their byte tokens). Returns 0 or PC_ERR_NOMEM (arrays keep what they had). */
int eng_tok_encode(const eng_tok_t *t, const char *text, size_t len, uint32_t **ids, size_t *n_ids,
                   size_t *cap);

/* The id of a token spelled exactly `piece` (special or not), or -1. */
int32_t eng_tok_piece_id(const eng_tok_t *t, const char *piece);

uint32_t eng_tok_n_vocab(const eng_tok_t *t);
const eng_vocab_t *eng_tok_vocab(const eng_tok_t *t);
bool eng_tok_is_control(const eng_tok_t *t, uint32_t id);
/* True for end-of-generation tokens (eos, eot, eom). */
bool eng_tok_is_eog(const eng_tok_t *t, uint32_t id);

/* The raw bytes a token stands for (byte-level mapping undone, U+2581 turned into spaces,
 * <0xNN> into the byte). Control tokens decode to their text only when with_special.
 * Returns the number of bytes written (at most cap), or the needed size if larger. */
size_t eng_tok_decode_token(const eng_tok_t *t, uint32_t id, bool with_special, char *buf,
                            size_t cap);

/* Appends the text of ids[0..n) to out: the tokens' bytes concatenated, control tokens only when
 * with_special, and for SentencePiece vocabs without the space the encoder put in front (the
 * Llama 2 decoder's Strip). Byte-level output is exactly what was encoded, invalid UTF-8
 * included. Returns 0, PC_ERR_RANGE (an id >= n_vocab; out unchanged) or PC_ERR_NOMEM. */
int eng_tok_decode(const eng_tok_t *t, const uint32_t *ids, size_t n, bool with_special,
                   pc_buf_t *out);

/* Incremental decoder for streaming: feed token ids one at a time; each call returns the bytes
 * that became complete UTF-8 (never half a character). flush returns what is left (invalid
 * trailing bytes become U+FFFD). Caller-allocated. */
typedef struct eng_tok_stream {
    const eng_tok_t *tok;
    bool with_special;
    bool _leading_space_strip; /* SentencePiece: drop the first token's leading space */
    unsigned char _pending[8];
    size_t _n_pending;
} eng_tok_stream_t;

void eng_tok_stream_init(eng_tok_stream_t *s, const eng_tok_t *t, bool with_special);
/* Writes complete UTF-8 to out[cap]; returns bytes written. cap >= ENG_TOK_STREAM_OUT_MAX
 * always suffices (with less, what does not fit is dropped). */
size_t eng_tok_stream_feed(eng_tok_stream_t *s, uint32_t id, char *out, size_t cap);
size_t eng_tok_stream_flush(eng_tok_stream_t *s, char *out, size_t cap);

#endif
