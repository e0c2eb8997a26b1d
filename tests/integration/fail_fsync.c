/*
 * fail_fsync.c — an LD_PRELOAD shim for crash_loop.test.mjs: injects ledger I/O failures into
 * a real `kvgw serve` process from outside, the way a full disk or a dying device would.
 *
 * Contract. Nothing changes until the file named by KVGW_FAIL_TRIGGER exists. From then on,
 * for as long as it exists, its first word picks the failure:
 *   "eio"    fsync() and fdatasync() return -1 with errno EIO (a device error on sync);
 *   "enospc" write() to a regular file whose path contains "/ledger-" returns -1 with errno
 *            ENOSPC (a full disk), and fsync()/fdatasync() fail with ENOSPC as well.
 * Every other call goes to libc untouched, so sockets, the access log and the model load are
 * unaffected. The trigger is checked on each call (one stat), which is cheap next to a sync.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

enum mode { MODE_NONE = 0, MODE_EIO, MODE_ENOSPC };

/* The failure in force now: reads the trigger file named by KVGW_FAIL_TRIGGER, if it exists. */
static enum mode current_mode(void)
{
    const char *path = getenv("KVGW_FAIL_TRIGGER");
    if (path == NULL || path[0] == '\0')
        return MODE_NONE;
    int saved = errno;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        errno = saved;
        return MODE_NONE;
    }
    char word[16] = {0};
    ssize_t n = read(fd, word, sizeof word - 1);
    close(fd);
    errno = saved;
    if (n > 0 && strncmp(word, "enospc", 6) == 0)
        return MODE_ENOSPC;
    return MODE_EIO;
}

/* True when fd is a regular file whose path names a ledger segment. */
static int is_ledger_file(int fd)
{
    struct stat st;
    int saved = errno;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        errno = saved;
        return 0;
    }
    char link[64], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    errno = saved;
    if (n <= 0)
        return 0;
    target[n] = '\0';
    return strstr(target, "/ledger-") != NULL;
}

ssize_t write(int fd, const void *buf, size_t len)
{
    static ssize_t (*real_write)(int, const void *, size_t);
    if (real_write == NULL)
        real_write = (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    if (current_mode() == MODE_ENOSPC && is_ledger_file(fd)) {
        errno = ENOSPC;
        return -1;
    }
    return real_write(fd, buf, len);
}

static int fail_sync(void)
{
    enum mode m = current_mode();
    if (m == MODE_NONE)
        return 0;
    errno = m == MODE_ENOSPC ? ENOSPC : EIO;
    return -1;
}

int fsync(int fd)
{
    static int (*real_fsync)(int);
    if (real_fsync == NULL)
        real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return fail_sync() != 0 ? -1 : real_fsync(fd);
}

int fdatasync(int fd)
{
    static int (*real_fdatasync)(int);
    if (real_fdatasync == NULL)
        real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return fail_sync() != 0 ? -1 : real_fdatasync(fd);
}
