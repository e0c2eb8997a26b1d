/*
 * pc_alloc.h — allocation hooks.
 *
 * All allocation in kvgw goes through pc_malloc/pc_calloc/pc_realloc/pc_free so that tests can
 * install a failing allocator (radix/ and the ledger are OOM-safe and are tested that way) and
 * so that libuv and hiredis can be pointed at the same hooks. pc_xmalloc and friends are for
 * setup paths that cannot sensibly recover: they abort with file:line on failure.
 */
#ifndef PC_ALLOC_H
#define PC_ALLOC_H

#include <stddef.h>

typedef struct pc_allocator {
    void *(*malloc_fn)(size_t size);
    void *(*calloc_fn)(size_t count, size_t size);
    void *(*realloc_fn)(void *ptr, size_t size);
    void (*free_fn)(void *ptr);
} pc_allocator_t;

/* Installs a new allocator (NULL restores the C library's) and returns the previous one.
 * Not thread-safe: call it before any other thread allocates. */
pc_allocator_t pc_set_allocator(const pc_allocator_t *a);

void *pc_malloc(size_t size);
void *pc_calloc(size_t count, size_t size);
void *pc_realloc(void *ptr, size_t size);
void pc_free(void *ptr);

/* realloc for an array of count elements of size bytes, failing (NULL) on overflow. */
void *pc_reallocarray(void *ptr, size_t count, size_t size);

/* Copies of strings through the hooks; NULL on allocation failure. */
char *pc_strdup(const char *s);
char *pc_strndup(const char *s, size_t n);

/* Dying variants for setup code: never return NULL. */
#define pc_xmalloc(size) pc__xmalloc((size), __FILE__, __LINE__)
#define pc_xcalloc(count, size) pc__xcalloc((count), (size), __FILE__, __LINE__)
#define pc_xrealloc(ptr, size) pc__xrealloc((ptr), (size), __FILE__, __LINE__)
#define pc_xstrdup(s) pc__xstrdup((s), __FILE__, __LINE__)
void *pc__xmalloc(size_t size, const char *file, int line);
void *pc__xcalloc(size_t count, size_t size, const char *file, int line);
void *pc__xrealloc(void *ptr, size_t size, const char *file, int line);
char *pc__xstrdup(const char *s, const char *file, int line);

#endif
