/* pc_arena.c — bump allocator (see pc_arena.h). */
#include "pc_arena.h"

#include "pc_alloc.h"

#include <stdalign.h>
#include <stdint.h>
#include <string.h>

struct pc_arena_chunk {
    pc_arena_chunk_t *next;
    size_t cap;
    size_t used;
    alignas(max_align_t) unsigned char data[];
};

#define PC_ARENA_ALIGN (alignof(max_align_t))

void pc_arena_init(pc_arena_t *a, size_t chunk_size)
{
    a->_head = NULL;
    a->_chunk_size = chunk_size != 0 ? chunk_size : 4096;
    a->bytes_used = 0;
}

void pc_arena_clear(pc_arena_t *a)
{
    pc_arena_chunk_t *c = a->_head;
    while (c != NULL) {
        pc_arena_chunk_t *next = c->next;
        pc_free(c);
        c = next;
    }
    a->_head = NULL;
    a->bytes_used = 0;
}

void pc_arena_close(pc_arena_t *a)
{
    pc_arena_clear(a);
}

void *pc_arena_alloc(pc_arena_t *a, size_t size)
{
    size_t need = (size + PC_ARENA_ALIGN - 1) & ~(PC_ARENA_ALIGN - 1);
    if (need < size)
        return NULL;
    pc_arena_chunk_t *c = a->_head;
    if (c == NULL || c->cap - c->used < need) {
        size_t cap = need > a->_chunk_size ? need : a->_chunk_size;
        if (cap > SIZE_MAX - sizeof(pc_arena_chunk_t))
            return NULL;
        pc_arena_chunk_t *n = pc_malloc(sizeof(pc_arena_chunk_t) + cap);
        if (n == NULL)
            return NULL;
        n->cap = cap;
        n->used = 0;
        /* A big one-off allocation goes behind the current chunk so its free space is kept. */
        if (c != NULL && need > a->_chunk_size) {
            n->next = c->next;
            c->next = n;
        } else {
            n->next = c;
            a->_head = n;
        }
        c = n;
    }
    void *p = c->data + c->used;
    c->used += need;
    a->bytes_used += size;
    return p;
}

void *pc_arena_calloc(pc_arena_t *a, size_t count, size_t size)
{
    if (size != 0 && count > SIZE_MAX / size)
        return NULL;
    void *p = pc_arena_alloc(a, count * size);
    if (p != NULL)
        memset(p, 0, count * size);
    return p;
}

char *pc_arena_strndup(pc_arena_t *a, const char *s, size_t n)
{
    char *d = pc_arena_alloc(a, n + 1);
    if (d == NULL)
        return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}
