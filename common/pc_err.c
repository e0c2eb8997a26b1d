/* pc_err.c — messages and names for the project error enum (see pc_err.h). */
#include "pc_err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

const char *pc_strerror(int err)
{
    switch (err) {
    case PC_OK:
        return "ok";
#define PC__ERR_MSG(name, val, msg)                                                                \
    case PC_ERR_##name:                                                                            \
        return msg;
        PC_ERR_MAP(PC__ERR_MSG)
#undef PC__ERR_MSG
    default:
        return "unknown error";
    }
}

const char *pc_err_name(int err)
{
    switch (err) {
    case PC_OK:
        return "OK";
#define PC__ERR_NAME(name, val, msg)                                                               \
    case PC_ERR_##name:                                                                            \
        return #name;
        PC_ERR_MAP(PC__ERR_NAME)
#undef PC__ERR_NAME
    default:
        return "UNKNOWN";
    }
}

int pc_err_from_errno(int errnum)
{
    switch (errnum) {
    case 0:
        return PC_OK;
    case ENOMEM:
        return PC_ERR_NOMEM;
    case EINVAL:
        return PC_ERR_INVAL;
    case ERANGE:
    case EOVERFLOW:
        return PC_ERR_RANGE;
    case ENOENT:
        return PC_ERR_NOTFOUND;
    case EEXIST:
        return PC_ERR_EXISTS;
    case ENOSPC:
    case EDQUOT:
        return PC_ERR_NOSPACE;
    case EACCES:
    case EPERM:
        return PC_ERR_PERM;
    case EBUSY:
    case EAGAIN:
        return PC_ERR_BUSY;
    case ETIMEDOUT:
        return PC_ERR_TIMEOUT;
    case ECANCELED:
        return PC_ERR_CANCELED;
    case EPIPE:
    case ECONNRESET:
        return PC_ERR_CLOSED;
    case ECONNREFUSED:
    case EHOSTUNREACH:
        return PC_ERR_UPSTREAM;
    default:
        return PC_ERR_IO;
    }
}

int pc_err_setf(char *err, size_t err_len, int code, const char *fmt, ...)
{
    if (err != NULL && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return code;
}
