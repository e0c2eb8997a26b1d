/*
 * pc_log.h — leveled logging to a swappable sink.
 *
 * PC_LOG checks the level before formatting, so a disabled debug line costs one comparison.
 * The default sink writes "LEVEL module: message" lines to stderr. The log level and the sink
 * are two of the three pieces of global mutable state kvgw allows (with the allocator hooks).
 */
#ifndef PC_LOG_H
#define PC_LOG_H

#include "pc_assert.h"

enum pc_log_level {
    PC_LOG_DEBUG = 0,
    PC_LOG_INFO = 1,
    PC_LOG_WARN = 2,
    PC_LOG_ERROR = 3,
    PC_LOG_OFF = 4,
};

typedef void (*pc_log_sink_fn)(int level, const char *module, const char *msg, void *ud);

extern int pc_log_level;

/* Replaces the sink (NULL restores stderr). */
void pc_log_set_sink(pc_log_sink_fn fn, void *ud);
void pc_log_set_level(int level);
/* Parses "debug" | "info" | "warn" | "error" | "off"; -1 when unknown. */
int pc_log_level_parse(const char *s);
const char *pc_log_level_name(int level);

void pc__log(int level, const char *module, const char *fmt, ...) PC_PRINTF(3, 4);

#define PC_LOG(level, module, ...)                                                                 \
    do {                                                                                           \
        if ((level) >= pc_log_level)                                                               \
            pc__log((level), (module), __VA_ARGS__);                                               \
    } while (0)

#endif
