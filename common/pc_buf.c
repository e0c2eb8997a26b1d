/* pc_buf.c — growable buffers (see pc_buf.h). */
#include "pc_buf.h"

#include "pc_alloc.h"
#include "pc_err.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

void pc_buf_free(pc_buf_t *b)
{
    pc_free(b->base);
    *b = PC_BUF_INIT;
}

char *pc_buf_reserve(pc_buf_t *b, size_t n)
{
    if (b->cap - b->len >= n)
        return b->base + b->len;
    if (n > SIZE_MAX - b->len)
        return NULL;
    size_t want = b->len + n;
    size_t cap = b->cap != 0 ? b->cap : 64;
    while (cap < want)
        cap = cap > SIZE_MAX / 2 ? want : cap * 2;
    char *p = pc_realloc(b->base, cap);
    if (p == NULL)
        return NULL;
    b->base = p;
    b->cap = cap;
    return b->base + b->len;
}

int pc_buf_append(pc_buf_t *b, const void *data, size_t n)
{
    if (n == 0)
        return PC_OK;
    char *p = pc_buf_reserve(b, n);
    if (p == NULL)
        return PC_ERR_NOMEM;
    memcpy(p, data, n);
    pc_buf_commit(b, n);
    return PC_OK;
}

int pc_buf_append_cstr(pc_buf_t *b, const char *s)
{
    return pc_buf_append(b, s, strlen(s));
}

int pc_buf_printf(pc_buf_t *b, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return PC_ERR_INVAL;
    if ((size_t)n < sizeof small)
        return pc_buf_append(b, small, (size_t)n);
    char *p = pc_buf_reserve(b, (size_t)n + 1);
    if (p == NULL)
        return PC_ERR_NOMEM;
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    pc_buf_commit(b, (size_t)n);
    return PC_OK;
}

int pc_buf_terminate(pc_buf_t *b)
{
    char *p = pc_buf_reserve(b, 1);
    if (p == NULL)
        return PC_ERR_NOMEM;
    *p = '\0';
    return PC_OK;
}
