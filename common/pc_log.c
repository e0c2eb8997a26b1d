/* pc_log.c — leveled logging (see pc_log.h). */
#include "pc_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int pc_log_level = PC_LOG_INFO;

static const char *const pc__level_names[] = {"debug", "info", "warn", "error", "off"};

static void pc__log_stderr(int level, const char *module, const char *msg, void *ud)
{
    (void)ud;
    fprintf(stderr, "%-5s %s: %s\n", pc_log_level_name(level), module, msg);
}

static pc_log_sink_fn pc__sink = pc__log_stderr;
static void *pc__sink_ud;

void pc_log_set_sink(pc_log_sink_fn fn, void *ud)
{
    pc__sink = fn != NULL ? fn : pc__log_stderr;
    pc__sink_ud = fn != NULL ? ud : NULL;
}

void pc_log_set_level(int level)
{
    pc_log_level = level;
}

int pc_log_level_parse(const char *s)
{
    for (int i = 0; i < (int)PC_ARRAY_LEN(pc__level_names); i++)
        if (strcmp(s, pc__level_names[i]) == 0)
            return i;
    return -1;
}

const char *pc_log_level_name(int level)
{
    if (level < 0 || level >= (int)PC_ARRAY_LEN(pc__level_names))
        return "?";
    return pc__level_names[level];
}

void pc__log(int level, const char *module, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pc__sink(level, module, msg, pc__sink_ud);
}
