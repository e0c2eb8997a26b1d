/*
 * pc_testutil.h — file helpers for the tests (header-only, one copy per test binary).
 *
 * pc_test_tmp_path(name) gives a path inside a per-process directory (/tmp/kvgw_test.<pid>),
 * created on first use and removed with its files when the process exits. The returned string
 * lives in one of four rotating buffers: at most four paths can be held at once.
 * pc_test_slurp(path, &len) reads a whole file into malloc'd memory (NULL on failure).
 */
#ifndef PC_TESTUTIL_H
#define PC_TESTUTIL_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char pc_test__tmp_dir[256];

static const char *pc_test_tmp_path(const char *name)
{
    static char path[4][512];
    static int slot;
    if (pc_test__tmp_dir[0] == '\0') {
        snprintf(pc_test__tmp_dir, sizeof pc_test__tmp_dir, "/tmp/kvgw_test.%d", (int)getpid());
        mkdir(pc_test__tmp_dir, 0700);
    }
    slot = (slot + 1) % 4;
    snprintf(path[slot], sizeof path[slot], "%s/%s", pc_test__tmp_dir, name);
    return path[slot];
}

__attribute__((destructor)) static void pc_test__remove_tmp_dir(void)
{
    if (pc_test__tmp_dir[0] == '\0')
        return;
    DIR *d = opendir(pc_test__tmp_dir);
    if (d != NULL) {
        struct dirent *e;
        char p[800];
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            snprintf(p, sizeof p, "%s/%s", pc_test__tmp_dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(pc_test__tmp_dir);
}

static inline uint8_t *pc_test_slurp(const char *path, size_t *len)
{
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(n > 0 ? (size_t)n : 1);
    if (b != NULL && n > 0 && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *len = n > 0 ? (size_t)n : 0;
    return b;
}

#endif
