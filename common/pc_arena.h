/*
 * pc_arena.h — a bump allocator for everything that dies together (a request, a parse).
 *
 * Memory comes from chunks obtained through the pc_alloc hooks; pc_arena_clear releases all of
 * it at once. Pointers handed out stay valid until pc_arena_clear/pc_arena_free. Allocation is
 * aligned to max_align_t. Nothing that outlives the owner may live in an arena.
 */
#ifndef PC_ARENA_H
#define PC_ARENA_H

#include <stddef.h>

typedef struct pc_arena_chunk pc_arena_chunk_t;

typedef struct pc_arena {
    pc_arena_chunk_t *_head; /* newest chunk first */
    size_t _chunk_size;      /* default chunk payload size */
    size_t bytes_used;       /* bytes handed out since the last clear (read-only) */
} pc_arena_t;

/* Initializes an empty arena; chunk_size 0 picks 4 KiB. Allocates nothing. */
void pc_arena_init(pc_arena_t *a, size_t chunk_size);

/* Releases every chunk; the arena stays usable. */
void pc_arena_clear(pc_arena_t *a);

/* Same as clear; for symmetry with init on caller-allocated arenas. */
void pc_arena_close(pc_arena_t *a);

/* size bytes, aligned; NULL on allocation failure. */
void *pc_arena_alloc(pc_arena_t *a, size_t size);

/* A copy of n bytes plus a terminating NUL; NULL on failure. */
char *pc_arena_strndup(pc_arena_t *a, const char *s, size_t n);

/* Typed allocation: p = pc_arena_new(&req->arena, *p, n). Zero-filled. */
void *pc_arena_calloc(pc_arena_t *a, size_t count, size_t size);
#define pc_arena_new(a, type_expr, n) pc_arena_calloc((a), (n), sizeof(type_expr))

#endif
