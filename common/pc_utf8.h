/*
 * pc_utf8.h — UTF-8 validation, decoding and encoding (RFC 3629).
 *
 * Valid means shortest forms only, no surrogates (U+D800..U+DFFF) and nothing above U+10FFFF;
 * every function here agrees on it. Lengths are in bytes; inputs are byte ranges (not
 * NUL-terminated). No allocation; no state.
 */
#ifndef PC_UTF8_H
#define PC_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The bytes a sequence starting with lead byte c needs (1-4), or 0 for a byte that cannot
 * start one (a continuation byte, C0, C1, F5..FF). */
size_t pc_utf8_need(unsigned char c);

/* The length (1-4) of the valid sequence at s[0..n), or 0 when s starts an invalid or
 * truncated one (or n is 0). */
size_t pc_utf8_seq_len(const void *s, size_t n);

/* Like pc_utf8_seq_len, and the code point in *cp when the sequence is valid. */
size_t pc_utf8_decode(const void *s, size_t n, uint32_t *cp);

/* Writes cp as UTF-8 to out; returns its length (1-4), or 0 (nothing written) for a surrogate
 * or a value above U+10FFFF. */
size_t pc_utf8_encode(uint32_t cp, unsigned char out[4]);

/* The length of the longest valid prefix of s[0..n): n when all of it is valid. */
size_t pc_utf8_valid_prefix(const void *s, size_t n);

static inline bool pc_utf8_valid(const void *s, size_t n)
{
    return pc_utf8_valid_prefix(s, n) == n;
}

/* Whether s[0..m) could still become a valid sequence with more bytes: m is less than the
 * lead byte's need, and the bytes so far are allowed. */
bool pc_utf8_incomplete(const void *s, size_t m);

/* n less a last character that is cut short: when s[0..n) ends inside a multi-byte sequence
 * (its lead byte in the last three bytes, fewer bytes than it needs after it), the position
 * of that lead byte; else n. For cutting text at a byte limit without splitting a character. */
size_t pc_utf8_trim_partial(const void *s, size_t n);

#endif
