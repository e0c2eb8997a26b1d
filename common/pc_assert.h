/*
 * pc_assert.h — two tiers of assertions.
 *
 * PC_ASSERT(x) is always on, in every build type: a failed one calls pc__fatal, which logs
 * file:line and aborts (tests can swap the handler). assert() from <assert.h> is for expensive
 * debug-only checks. PC_ALWAYS(x)/PC_NEVER(x) mark "cannot happen, but survive it" branches:
 * they abort in debug builds and evaluate to the condition in release builds.
 */
#ifndef PC_ASSERT_H
#define PC_ASSERT_H

#include <stdarg.h>

#if defined(__GNUC__)
#define PC_NORETURN __attribute__((noreturn))
#define PC_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#define PC_LIKELY(x) __builtin_expect(!!(x), 1)
#define PC_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define PC_NORETURN
#define PC_PRINTF(fmt, args)
#define PC_LIKELY(x) (x)
#define PC_UNLIKELY(x) (x)
#endif

/* The fatal handler: prints "file:line: message" to stderr and aborts. */
typedef void (*pc_fatal_fn)(const char *file, int line, const char *msg);

/* Replaces the handler (NULL restores the default) and returns the previous one. A handler
 * that returns makes pc__fatal abort anyway. */
pc_fatal_fn pc_set_fatal_handler(pc_fatal_fn fn);

PC_NORETURN void pc__fatal(const char *file, int line, const char *fmt, ...) PC_PRINTF(3, 4);

#define PC_ASSERT(x)                                                                               \
    do {                                                                                           \
        if (PC_UNLIKELY(!(x)))                                                                     \
            pc__fatal(__FILE__, __LINE__, "assertion failed: %s", #x);                             \
    } while (0)

#define PC_ABORT(...) pc__fatal(__FILE__, __LINE__, __VA_ARGS__)

#ifdef NDEBUG
#define PC_ALWAYS(x) (x)
#define PC_NEVER(x) (x)
#else
#define PC_ALWAYS(x) ((x) ? 1 : (pc__fatal(__FILE__, __LINE__, "PC_ALWAYS failed: %s", #x), 0))
#define PC_NEVER(x) ((x) ? (pc__fatal(__FILE__, __LINE__, "PC_NEVER failed: %s", #x), 1) : 0)
#endif

#define PC_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define PC_CONTAINER_OF(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))
#define PC_MIN(a, b) ((a) < (b) ? (a) : (b))
#define PC_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
