/*
 * pc_vec.h — a growable array of one element type.
 *
 *     PC_VEC(uint32_t) v = {0};
 *     if (pc_vec_push(&v, 7) != 0) ... PC_ERR_NOMEM, v unchanged
 *     ... v.base[0 .. v.len) ...
 *     pc_vec_free(&v);
 *
 * Any struct with members `T *base; size_t len, cap;` works with the macros (so a vector can
 * be named and embedded: typedef PC_VEC(foo_t) foo_vec_t;). Capacity doubles from 8; growth
 * goes through pc_reallocarray (the allocator hooks), and a failed growth leaves the vector as
 * it was. Element pointers stay valid until the next reserve or push. Not thread-safe.
 * pc_buf_t is the byte-buffer counterpart (reserve/commit of unformatted bytes).
 */
#ifndef PC_VEC_H
#define PC_VEC_H

#include <stddef.h>

#include "pc_alloc.h"
#include "pc_err.h"

#define PC_VEC(T)                                                                                  \
    struct {                                                                                       \
        T *base;                                                                                   \
        size_t len, cap;                                                                           \
    }

/* Grows *(void **)basep (an array of elem-byte elements with *cap of them) to hold at least
 * want. Returns 0 or PC_ERR_NOMEM (nothing changed); used through pc_vec_reserve. */
int pc__vec_reserve(void *basep, size_t *cap, size_t elem, size_t want);

/* Room for at least want elements in total: 0 or PC_ERR_NOMEM. */
#define pc_vec_reserve(v, want) pc__vec_reserve(&(v)->base, &(v)->cap, sizeof *(v)->base, (want))

/* The same growth for a bare array kept under its owner's names (T **basep, size_t *capp),
 * where a PC_VEC struct would not fit: room for at least want elements, 0 or PC_ERR_NOMEM
 * (nothing changed). The contents are kept. */
#define pc_array_reserve(basep, capp, want)                                                        \
    pc__vec_reserve((basep), (capp), sizeof **(basep), (want))

/* Appends x: 0 or PC_ERR_NOMEM (the vector unchanged). x is evaluated once, after the growth. */
#define pc_vec_push(v, x)                                                                          \
    (pc_vec_reserve((v), (v)->len + 1) != 0 ? (int)PC_ERR_NOMEM : ((v)->base[(v)->len++] = (x), 0))

/* Frees the storage; the vector is empty and usable afterwards. */
#define pc_vec_free(v)                                                                             \
    do {                                                                                           \
        pc_free((v)->base);                                                                        \
        (v)->base = NULL;                                                                          \
        (v)->len = (v)->cap = 0;                                                                   \
    } while (0)

#endif
