/*
 * pc_err.h — the one project error enum.
 *
 * Every fallible function in kvgw returns an int: 0 on success, a negative PC_ERR_* value on
 * failure, and (where documented) a positive value for a soft outcome. Results travel through
 * out-parameters. The enum is generated from PC_ERR_MAP so the names, the values and the
 * messages can never drift apart (libuv's UV_ERRNO_MAP pattern).
 */
#ifndef PC_ERR_H
#define PC_ERR_H

#include <stddef.h>

#define PC_ERR_MAP(XX)                                                                             \
    XX(NOMEM, -1, "out of memory")                                                                 \
    XX(INVAL, -2, "invalid argument")                                                              \
    XX(RANGE, -3, "value out of range")                                                            \
    XX(NOTFOUND, -4, "not found")                                                                  \
    XX(EXISTS, -5, "already exists")                                                               \
    XX(IO, -6, "input/output error")                                                               \
    XX(FORMAT, -7, "malformed data")                                                               \
    XX(UNSUPPORTED, -8, "unsupported")                                                             \
    XX(BUSY, -9, "resource busy")                                                                  \
    XX(OVERLOADED, -10, "overloaded")                                                              \
    XX(NOSPACE, -11, "no space left")                                                              \
    XX(TIMEOUT, -12, "timed out")                                                                  \
    XX(CANCELED, -13, "canceled")                                                                  \
    XX(CLOSED, -14, "connection closed")                                                           \
    XX(UPSTREAM, -15, "upstream unavailable")                                                      \
    XX(PERM, -16, "permission denied")                                                             \
    XX(STATE, -17, "invalid state")                                                                \
    XX(INTERNAL, -18, "internal error")

enum pc_err {
    PC_OK = 0,
#define PC__ERR_ENUM(name, val, msg) PC_ERR_##name = (val),
    PC_ERR_MAP(PC__ERR_ENUM)
#undef PC__ERR_ENUM
};

/* A static, human-readable message for an error code; never NULL. */
const char *pc_strerror(int err);

/* The symbolic name without prefix ("NOMEM"), or "UNKNOWN"; never NULL. */
const char *pc_err_name(int err);

/* Writes a one-line reason (printf-style) into err[err_len] when err is not NULL and err_len is
 * not 0, truncating if needed, and returns code: `return pc_err_setf(err, len, PC_ERR_FORMAT,
 * "gguf: key '%s' missing", key);`. */
int pc_err_setf(char *err, size_t err_len, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* Maps an errno value to the closest project error (ENOMEM -> PC_ERR_NOMEM, ...). */
int pc_err_from_errno(int errnum);

#endif
