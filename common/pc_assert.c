/* pc_assert.c — the fatal handler behind PC_ASSERT (see pc_assert.h). */
#include "pc_assert.h"

#include <stdio.h>
#include <stdlib.h>

static void pc__fatal_default(const char *file, int line, const char *msg)
{
    fprintf(stderr, "%s:%d: fatal: %s\n", file, line, msg);
    fflush(stderr);
}

static pc_fatal_fn pc__fatal_handler = pc__fatal_default;

pc_fatal_fn pc_set_fatal_handler(pc_fatal_fn fn)
{
    pc_fatal_fn prev = pc__fatal_handler;
    pc__fatal_handler = fn != NULL ? fn : pc__fatal_default;
    return prev;
}

void pc__fatal(const char *file, int line, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pc__fatal_handler(file, line, msg);
    abort();
}
