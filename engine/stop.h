/*
 * stop.h — stop-sequence matching on streamed text (one matcher per request).
 *
 * Part of the worker protocol, not of the engine's state: a request's stop sequences arrive in
 * its wire message (wire.h checks them against the limits below), and the worker (worker.c,
 * over engine.h) runs one matcher per request on the text it decodes. Public for that reason;
 * it depends on common/ only.
 *
 * The worker decodes tokens incrementally (eng_tok_stream_feed gives complete UTF-8 pieces) and
 * passes every piece through the request's matcher. The matcher releases the text that can no
 * longer be part of a stop sequence, holds back the longest suffix that is still the beginning
 * of one, and reports a stop as soon as a stop sequence completes, across any number of pieces.
 * The stop text itself, and anything after it, is never released.
 *
 *   stops "</a>", "STOP"   piece "x</"  -> releases "x", holds "</"
 *                          piece "b"    -> releases "</b", holds ""
 *                          piece "ST"   -> holds "ST"
 *                          piece "OPy"  -> stop 1; nothing more released ("y" is discarded)
 *
 * The result depends only on the concatenated text, never on how it was split into pieces:
 * the text is scanned byte by byte with one KMP automaton per stop sequence, the first byte at
 * which any stop sequence completes ends the stream, and when several complete on that byte the
 * longest wins (it started first), then the lowest index. Held-back text is always the longest
 * suffix of the text seen so far that is a proper prefix of some stop sequence, so at most
 * (longest stop - 1) bytes are held.
 *
 * Stop sequences must be valid UTF-8 (checked at init). Because a stop sequence begins with a
 * character's first byte, released text then always ends on a character boundary: fed complete
 * UTF-8, the matcher releases complete UTF-8.
 *
 * Not thread-safe; a matcher belongs to one request.
 */
#ifndef ENG_STOP_H
#define ENG_STOP_H

#include <stddef.h>
#include <stdint.h>

#include "pc_buf.h"

/* Limits on what a request may ask for (the worker protocol enforces the same). */
#define ENG_STOP_MAX_SEQS 16
#define ENG_STOP_MAX_BYTES 1024

typedef struct eng_stop eng_stop_t;

/* Builds a matcher for stops[0..n_stops) (copied; n_stops 0 gives a pass-through matcher).
 * Returns 0, PC_ERR_INVAL (more than ENG_STOP_MAX_SEQS sequences, an empty one, one longer than
 * ENG_STOP_MAX_BYTES, or one that is not valid UTF-8; a reason goes to err, which may be NULL)
 * or PC_ERR_NOMEM. */
int eng_stop_init(const pc_slice_t *stops, uint32_t n_stops, eng_stop_t **out, char *err,
                  size_t err_len);
void eng_stop_free(eng_stop_t *m);

/* Feeds the next piece of text. Appends the text released by it to out. Returns 0 (no stop),
 * 1 when a stop sequence completed inside this piece (its index goes to *which; the text before
 * it was appended; the matcher is finished and later feeds return PC_ERR_STATE), or
 * PC_ERR_NOMEM (neither the matcher nor out changed). which may be NULL. */
int eng_stop_feed(eng_stop_t *m, const char *piece, size_t len, pc_buf_t *out, uint32_t *which);

/* End of generation without a stop: appends the held-back text to out and finishes the
 * matcher. Returns 0, PC_ERR_STATE (already finished) or PC_ERR_NOMEM (nothing changed). */
int eng_stop_flush(eng_stop_t *m, pc_buf_t *out);

/* Bytes currently held back (0 after a stop or a flush). */
size_t eng_stop_held(const eng_stop_t *m);

/* Forgets all text and starts over with the same stop sequences (a reused matcher). */
void eng_stop_reset(eng_stop_t *m);

#endif
