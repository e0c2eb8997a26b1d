/*
 * stop.c — the streamed stop-sequence matcher of stop.h: one KMP automaton per stop sequence
 * over a hold buffer.
 *
 * Invariant between calls (while not finished): hold holds exactly the last max_q bytes of the
 * text fed so far, where max_q is the largest automaton state, i.e. the longest suffix of the
 * text that is a proper prefix of some stop sequence. Everything before it has been released.
 */
#include "stop.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "pc_alloc.h"
#include "pc_err.h"
#include "pc_utf8.h"

typedef struct stop_seq {
    unsigned char *s;
    uint32_t len;
    uint32_t *fail; /* [len] fail[i]: the longest proper border of s[0..i] */
    uint32_t q;     /* bytes of s matched by the current suffix of the text */
} stop_seq_t;

struct eng_stop {
    uint32_t n_seqs;
    bool done;
    pc_buf_t hold;
    stop_seq_t seqs[ENG_STOP_MAX_SEQS];
};

static int init_fail(eng_stop_t *m, char *err, size_t err_len, const char *what, uint32_t i)
{
    if (err != NULL && err_len > 0)
        snprintf(err, err_len, "stop sequence %u: %s", i, what);
    eng_stop_free(m);
    return PC_ERR_INVAL;
}

int eng_stop_init(const pc_slice_t *stops, uint32_t n_stops, eng_stop_t **out, char *err,
                  size_t err_len)
{
    *out = NULL;
    if (n_stops > ENG_STOP_MAX_SEQS) {
        if (err != NULL && err_len > 0)
            snprintf(err, err_len, "%u stop sequences, at most %d allowed", n_stops,
                     ENG_STOP_MAX_SEQS);
        return PC_ERR_INVAL;
    }
    eng_stop_t *m = pc_calloc(1, sizeof *m);
    if (m == NULL)
        return PC_ERR_NOMEM;
    for (uint32_t i = 0; i < n_stops; i++) {
        const pc_slice_t st = stops[i];
        if (st.len == 0)
            return init_fail(m, err, err_len, "empty", i);
        if (st.len > ENG_STOP_MAX_BYTES)
            return init_fail(m, err, err_len, "longer than 1024 bytes", i);
        if (pc_utf8_valid_prefix((const unsigned char *)st.base, st.len) != st.len)
            return init_fail(m, err, err_len, "not valid UTF-8", i);
        stop_seq_t *q = &m->seqs[i];
        m->n_seqs = i + 1; /* so that eng_stop_free releases what this one got */
        q->s = pc_malloc(st.len);
        q->fail = pc_malloc(st.len * sizeof *q->fail);
        if (q->s == NULL || q->fail == NULL) {
            eng_stop_free(m);
            return PC_ERR_NOMEM;
        }
        memcpy(q->s, st.base, st.len);
        q->len = (uint32_t)st.len;
        q->fail[0] = 0;
        for (uint32_t j = 1, k = 0; j < q->len; j++) {
            while (k > 0 && q->s[j] != q->s[k])
                k = q->fail[k - 1];
            if (q->s[j] == q->s[k])
                k++;
            q->fail[j] = k;
        }
    }
    m->n_seqs = n_stops;
    *out = m;
    return 0;
}

void eng_stop_free(eng_stop_t *m)
{
    if (m == NULL)
        return;
    for (uint32_t i = 0; i < m->n_seqs; i++) {
        pc_free(m->seqs[i].s);
        pc_free(m->seqs[i].fail);
    }
    pc_buf_free(&m->hold);
    pc_free(m);
}

void eng_stop_reset(eng_stop_t *m)
{
    for (uint32_t i = 0; i < m->n_seqs; i++)
        m->seqs[i].q = 0;
    m->hold.len = 0;
    m->done = false;
}

size_t eng_stop_held(const eng_stop_t *m)
{
    return m->hold.len;
}

/* Advances one automaton by byte c; returns the new state (len = a complete match). */
static inline uint32_t step(const stop_seq_t *q, uint32_t state, unsigned char c)
{
    while (state > 0 && q->s[state] != c)
        state = q->fail[state - 1];
    return q->s[state] == c ? state + 1 : 0;
}

int eng_stop_feed(eng_stop_t *m, const char *piece, size_t len, pc_buf_t *out, uint32_t *which)
{
    if (m->done)
        return PC_ERR_STATE;
    if (len == 0)
        return 0;
    /* Reserve everything first, so that nothing below can fail half-way. */
    if (pc_buf_reserve(&m->hold, len) == NULL || pc_buf_reserve(out, m->hold.len + len) == NULL)
        return PC_ERR_NOMEM;
    const unsigned char *p = (const unsigned char *)piece;
    unsigned char *h = (unsigned char *)m->hold.base;
    for (size_t i = 0; i < len; i++) {
        h[m->hold.len++] = p[i];
        int hit = -1;
        for (uint32_t k = 0; k < m->n_seqs; k++) {
            stop_seq_t *q = &m->seqs[k];
            q->q = step(q, q->q, p[i]);
            if (q->q == q->len && (hit < 0 || q->len > m->seqs[hit].len))
                hit = (int)k;
        }
        if (hit >= 0) {
            /* The match's first byte is still held: its state was len - 1 before this byte. */
            size_t keep = m->hold.len - m->seqs[hit].len;
            memcpy(out->base + out->len, h, keep);
            pc_buf_commit(out, keep);
            m->hold.len = 0;
            m->done = true;
            if (which != NULL)
                *which = (uint32_t)hit;
            return 1;
        }
    }
    uint32_t max_q = 0;
    for (uint32_t k = 0; k < m->n_seqs; k++)
        if (m->seqs[k].q > max_q)
            max_q = m->seqs[k].q;
    size_t release = m->hold.len - max_q;
    memcpy(out->base + out->len, h, release);
    pc_buf_commit(out, release);
    memmove(h, h + release, max_q);
    m->hold.len = max_q;
    return 0;
}

int eng_stop_flush(eng_stop_t *m, pc_buf_t *out)
{
    if (m->done)
        return PC_ERR_STATE;
    if (pc_buf_append(out, m->hold.base, m->hold.len) != 0)
        return PC_ERR_NOMEM;
    m->hold.len = 0;
    m->done = true;
    return 0;
}
