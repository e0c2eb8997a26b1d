/* pc_rss.c — resident set size from /proc/self/status (see pc_rss.h). */
#include "pc_rss.h"

#include <stdio.h>
#include <string.h>

static size_t pc__status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (f == NULL)
        return 0;
    char line[256];
    size_t kb = 0, klen = strlen(key);
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, key, klen) == 0 && line[klen] == ':') {
            sscanf(line + klen + 1, "%zu", &kb);
            break;
        }
    }
    fclose(f);
    return kb * 1024;
}

size_t pc_rss_current_bytes(void)
{
    return pc__status_kb("VmRSS");
}
size_t pc_rss_peak_bytes(void)
{
    return pc__status_kb("VmHWM");
}
