/*
 * pc_failalloc.h — a failing allocator for the out-of-memory tests (header-only, one copy per
 * test binary).
 *
 *     pc_failalloc_left = k;                 // before each attempt: pick the rule
 *     pc_allocator_t prev = pc_set_allocator(&pc_failalloc);
 *     rc = operation_under_test(...);
 *     pc_set_allocator(&prev);
 *
 * The rules, all counted over malloc, calloc and realloc calls (frees always go through):
 *   pc_failalloc_left = k   the next k allocations succeed and every later one fails
 *                           (negative, the default: this rule refuses nothing);
 *   pc_failalloc_at = n     allocation number n fails, the others succeed (0: off);
 *   pc_failalloc_every = n  every n-th allocation fails (0: off).
 * pc_failalloc_count is the number of allocations since it was last set to 0 (the "at" and
 * "every" rules count from there). Not thread-safe: a test that allocates from several
 * threads under it must not rely on which call fails.
 */
#ifndef PC_FAILALLOC_H
#define PC_FAILALLOC_H

#include <stdlib.h>

#include "pc_alloc.h"

static long pc_failalloc_left = -1;
static long pc_failalloc_at;
static long pc_failalloc_every;
static long pc_failalloc_count;

/* 1 when this allocation is to fail; counts it. */
static int pc_failalloc__refuse(void)
{
    long n = ++pc_failalloc_count;
    if (pc_failalloc_at != 0 && n == pc_failalloc_at)
        return 1;
    if (pc_failalloc_every != 0 && n % pc_failalloc_every == 0)
        return 1;
    if (pc_failalloc_left == 0)
        return 1;
    if (pc_failalloc_left > 0)
        pc_failalloc_left--;
    return 0;
}

static void *pc_failalloc__malloc(size_t n)
{
    return pc_failalloc__refuse() ? NULL : malloc(n);
}

static void *pc_failalloc__calloc(size_t c, size_t n)
{
    return pc_failalloc__refuse() ? NULL : calloc(c, n);
}

static void *pc_failalloc__realloc(void *p, size_t n)
{
    return pc_failalloc__refuse() ? NULL : realloc(p, n);
}

static const pc_allocator_t pc_failalloc = {pc_failalloc__malloc, pc_failalloc__calloc,
                                            pc_failalloc__realloc, free};

#endif
