/* pc_alloc.c — allocation hooks (see pc_alloc.h). */
#include "pc_alloc.h"

#include "pc_assert.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static pc_allocator_t pc__alloc = {malloc, calloc, realloc, free};

pc_allocator_t pc_set_allocator(const pc_allocator_t *a)
{
    pc_allocator_t prev = pc__alloc;
    if (a == NULL) {
        pc__alloc = (pc_allocator_t){malloc, calloc, realloc, free};
    } else {
        pc__alloc = *a;
    }
    return prev;
}

void *pc_malloc(size_t size)
{
    return pc__alloc.malloc_fn(size);
}
void *pc_calloc(size_t count, size_t size)
{
    return pc__alloc.calloc_fn(count, size);
}
void *pc_realloc(void *ptr, size_t size)
{
    return pc__alloc.realloc_fn(ptr, size);
}
void pc_free(void *ptr)
{
    if (ptr != NULL)
        pc__alloc.free_fn(ptr);
}

void *pc_reallocarray(void *ptr, size_t count, size_t size)
{
    if (size != 0 && count > SIZE_MAX / size)
        return NULL;
    return pc_realloc(ptr, count * size);
}

char *pc_strndup(const char *s, size_t n)
{
    char *d = pc_malloc(n + 1);
    if (d == NULL)
        return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

char *pc_strdup(const char *s)
{
    return pc_strndup(s, strlen(s));
}

void *pc__xmalloc(size_t size, const char *file, int line)
{
    void *p = pc_malloc(size == 0 ? 1 : size);
    if (p == NULL)
        pc__fatal(file, line, "out of memory allocating %zu bytes", size);
    return p;
}

void *pc__xcalloc(size_t count, size_t size, const char *file, int line)
{
    void *p = pc_calloc(count == 0 ? 1 : count, size == 0 ? 1 : size);
    if (p == NULL)
        pc__fatal(file, line, "out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

void *pc__xrealloc(void *ptr, size_t size, const char *file, int line)
{
    void *p = pc_realloc(ptr, size == 0 ? 1 : size);
    if (p == NULL)
        pc__fatal(file, line, "out of memory reallocating to %zu bytes", size);
    return p;
}

char *pc__xstrdup(const char *s, const char *file, int line)
{
    char *p = pc_strdup(s);
    if (p == NULL)
        pc__fatal(file, line, "out of memory duplicating a string");
    return p;
}
