/* pc_pages.c — anonymous, huge-page-backed buffers (see pc_pages.h). */
#include "pc_pages.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "pc_alloc.h"

#define PC_HUGE_PAGE ((size_t)2 << 20)

struct pc_pages_chunk {
    pc_pages_chunk_t *next;
    uint8_t *base;
    size_t len;  /* mapped bytes at base */
    size_t used; /* bytes handed out from base */
};

bool pc_pages_huge_available(void)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f == NULL)
        return false;
    char line[128] = "";
    bool ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    /* The active setting is the bracketed word: "always [madvise] never". */
    return ok && strstr(line, "[never]") == NULL && strchr(line, '[') != NULL;
}

void pc_pages_init(pc_pages_t *p, bool huge)
{
    *p = (pc_pages_t){.huge = huge};
}

static size_t round_up(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

/* A fresh, unlinked chunk of at least size bytes whose base is 2 MiB aligned, so huge pages can
 * back it from its first byte. */
static pc_pages_chunk_t *chunk_new(pc_pages_t *p, size_t size)
{
    if (size > SIZE_MAX - 2 * PC_HUGE_PAGE)
        return NULL;
    size_t len = round_up(size > PC_PAGES_CHUNK ? size : PC_PAGES_CHUNK, PC_HUGE_PAGE);
    pc_pages_chunk_t *c = pc_malloc(sizeof *c);
    if (c == NULL)
        return NULL;
    /* Over-map by one huge page and trim both ends to the aligned window. */
    size_t span = len + PC_HUGE_PAGE;
    uint8_t *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
        pc_free(c);
        return NULL;
    }
    uint8_t *base = (uint8_t *)round_up((uintptr_t)raw, PC_HUGE_PAGE);
    if (base > raw)
        munmap(raw, (size_t)(base - raw));
    size_t tail = (size_t)(raw + span - (base + len));
    if (tail > 0)
        munmap(base + len, tail);
#ifdef MADV_HUGEPAGE
    if (p->huge)
        (void)madvise(base, len, MADV_HUGEPAGE); /* a hint: refusal leaves 4 KiB pages */
#endif
    *c = (pc_pages_chunk_t){.base = base, .len = len};
    p->bytes_mapped += len;
    return c;
}

void *pc_pages_alloc(pc_pages_t *p, size_t size)
{
    size = round_up(size ? size : 1, 64);
    pc_pages_chunk_t *c = p->_head;
    if (c == NULL || c->len - c->used < size) {
        /* A big request gets its own chunk and keeps the current one open for small ones. */
        pc_pages_chunk_t *n = chunk_new(p, size);
        if (n == NULL)
            return NULL;
        pc_pages_chunk_t **link = c != NULL && size >= PC_PAGES_CHUNK ? &c->next : &p->_head;
        n->next = *link;
        *link = n;
        c = n;
    }
    void *r = c->base + c->used;
    c->used += size;
    p->bytes_used += size;
    return r;
}

void pc_pages_release(pc_pages_t *p)
{
    for (pc_pages_chunk_t *c = p->_head, *next; c != NULL; c = next) {
        next = c->next;
        munmap(c->base, c->len);
        pc_free(c);
    }
    pc_pages_init(p, p->huge);
}
