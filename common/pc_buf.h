/*
 * pc_buf.h — byte slices and growable buffers.
 *
 * Bytes cross APIs as pc_slice_t {base, len}: a view that owns nothing. pc_buf_t owns its
 * storage and grows through reserve/commit: reserve returns a pointer to at least n writable
 * bytes past the current length (valid until the next reserve), commit makes n of them part of
 * the content. The storage pointer may move on every reserve; never keep one across it.
 */
#ifndef PC_BUF_H
#define PC_BUF_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

typedef struct pc_slice {
    const char *base;
    size_t len;
} pc_slice_t;

#define PC_SLICE_LIT(s) ((pc_slice_t){(s), sizeof(s) - 1})

static inline pc_slice_t pc_slice(const char *base, size_t len)
{
    return (pc_slice_t){base, len};
}
static inline pc_slice_t pc_slice_cstr(const char *s)
{
    return (pc_slice_t){s, strlen(s)};
}
static inline bool pc_slice_eq(pc_slice_t a, pc_slice_t b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.base, b.base, a.len) == 0);
}
static inline bool pc_slice_eq_cstr(pc_slice_t a, const char *s)
{
    return pc_slice_eq(a, pc_slice_cstr(s));
}

typedef struct pc_buf {
    char *base;
    size_t len;
    size_t cap;
} pc_buf_t;

#define PC_BUF_INIT ((pc_buf_t){NULL, 0, 0})

/* Releases the storage; the buffer is empty and reusable afterwards. */
void pc_buf_free(pc_buf_t *b);

/* Pointer to at least n writable bytes after len, or NULL on allocation failure (the buffer
 * is unchanged then). */
char *pc_buf_reserve(pc_buf_t *b, size_t n);

/* Marks n reserved bytes as content. n must not exceed what the last reserve granted. */
static inline void pc_buf_commit(pc_buf_t *b, size_t n)
{
    b->len += n;
}

/* Appends bytes; 0 or PC_ERR_NOMEM (buffer unchanged). */
int pc_buf_append(pc_buf_t *b, const void *data, size_t n);
int pc_buf_append_cstr(pc_buf_t *b, const char *s);
int pc_buf_printf(pc_buf_t *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Makes base a NUL-terminated string (the NUL is not counted in len). 0 or PC_ERR_NOMEM. */
int pc_buf_terminate(pc_buf_t *b);

static inline pc_slice_t pc_buf_slice(const pc_buf_t *b)
{
    return (pc_slice_t){b->base, b->len};
}

#endif
