/*
 * tokenizer_internal.h — pieces of the tokenizer shared inside engine/ and with its tests and
 * fuzzer; not part of the public API.
 */
#ifndef ENG_TOKENIZER_INTERNAL_H
#define ENG_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "pc_buf.h"
#include "tokenizer.h"

/* The pre-tokenizer regex (PCRE2 syntax, identical to the tokenizer.json Split regex) for a
 * tokenizer.ggml.pre name, or NULL for an unknown name. "default" is GPT-2's. */
const char *eng__tok_pre_regex(const char *pre);

/* The name of the pre-tokenizer whose regex is exactly `regex`, or NULL. */
const char *eng__tok_pre_name(const char *regex);

/* Whether the tokenizer normalizes text to Unicode NFC before splitting (Qwen's tokenizer.json
 * has an NFC normalizer; tokenizer.ggml.pre "qwen2" implies it). */
bool eng__tok_nfc(const eng_tok_t *t);

/* Appends the NFC form of len bytes of UTF-8 to out (invalid byte sequences pass unchanged).
 * Returns 0 or PC_ERR_NOMEM. */
int eng__utf8_nfc(const char *text, size_t len, pc_buf_t *out);

#endif
