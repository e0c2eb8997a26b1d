/*
 * pc_pages.h — large, long-lived buffers straight from the kernel, on huge pages where possible.
 *
 * For data that is streamed from memory over and over (a model's weight matrices read once per
 * decoded token): with 4 KiB pages every 4 KiB of the stream costs a TLB miss, and inside a
 * virtual machine each miss is a two-level page walk. Backing the buffers with 2 MiB transparent
 * huge pages measured ~25% more streaming bandwidth on the 2-core Zen 4 machines kvgw is tested
 * on. pc_pages hands out 64-byte-aligned pieces of anonymous mappings (chunks of at least
 * PC_PAGES_CHUNK bytes, 2 MiB aligned, madvise(MADV_HUGEPAGE) when asked) and releases them all
 * at once. Untouched parts of a chunk cost no memory. Not thread-safe; allocation goes around the
 * pc_alloc hooks (it is not small-object memory), except for the chunk list itself.
 */
#ifndef PC_PAGES_H
#define PC_PAGES_H

#include <stdbool.h>
#include <stddef.h>

#define PC_PAGES_CHUNK ((size_t)64 << 20)

typedef struct pc_pages_chunk pc_pages_chunk_t;

typedef struct pc_pages {
    pc_pages_chunk_t *_head; /* newest chunk first */
    bool huge;               /* ask for transparent huge pages */
    size_t bytes_used;       /* bytes handed out (read-only) */
    size_t bytes_mapped;     /* address space held (read-only) */
} pc_pages_t;

/* True when the kernel's transparent huge pages are enabled for madvise'd or all memory. */
bool pc_pages_huge_available(void);

/* An empty set of chunks; huge asks for huge pages. Allocates nothing. */
void pc_pages_init(pc_pages_t *p, bool huge);

/* size bytes, 64-byte aligned, zero-filled (fresh anonymous memory); NULL when the kernel
 * refuses the mapping. */
void *pc_pages_alloc(pc_pages_t *p, size_t size);

/* Unmaps every chunk; the set stays usable. */
void pc_pages_release(pc_pages_t *p);

#endif
