/*
 * progress.c — the terminal progress line (progress.h).
 */
#include "progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define BAR_WIDTH 30

void kvgw_progress_begin(kvgw_progress_t *p, const char *what, const char *unit)
{
    const char *off = getenv("KVGW_NO_PROGRESS");
    p->what = what;
    p->unit = unit;
    p->on = isatty(STDERR_FILENO) && (off == NULL || off[0] == '\0');
    p->drawn = false;
    p->last_pct = -1;
}

void kvgw_progress_update(kvgw_progress_t *p, uint64_t done, uint64_t total)
{
    if (!p->on || total == 0)
        return;
    if (done > total)
        done = total;
    int pct = (int)(done * 100 / total);
    if (pct == p->last_pct)
        return;
    p->last_pct = pct;
    char bar[BAR_WIDTH + 1];
    int fill = (int)(done * BAR_WIDTH / total);
    for (int i = 0; i < BAR_WIDTH; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[BAR_WIDTH] = '\0';
    /* \r back to the start of the line, \033[K erases what a longer earlier line left. */
    if (p->unit != NULL)
        fprintf(stderr, "\r\033[K%s [%s] %3d%% (%llu/%llu %s)", p->what, bar, pct,
                (unsigned long long)done, (unsigned long long)total, p->unit);
    else
        fprintf(stderr, "\r\033[K%s [%s] %3d%%", p->what, bar, pct);
    fflush(stderr);
    p->drawn = true;
}

void kvgw_progress_end(kvgw_progress_t *p)
{
    if (p->on && p->drawn) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
    p->drawn = false;
    p->last_pct = -1; /* a later update draws again */
}

void kvgw_progress_cb_u32(uint32_t done, uint32_t total, void *ud)
{
    kvgw_progress_update(ud, done, total);
}

void kvgw_progress_cb_u64(uint64_t done, uint64_t total, void *ud)
{
    kvgw_progress_update(ud, done, total);
}

void kvgw_progress_cb_load(uint32_t done, uint32_t total, void *ud)
{
    if (total == 0)
        kvgw_progress_end(ud);
    else
        kvgw_progress_update(ud, done, total);
}
