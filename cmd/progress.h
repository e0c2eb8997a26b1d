/*
 * progress.h — a one-line progress display for the long operations of the kvgw commands
 * (writing a test model, loading a model), shown only when stderr is a terminal: logs and
 * pipes never get the carriage returns.
 *
 *   kvgw_progress_t pr;
 *   kvgw_progress_begin(&pr, "loading models/kvgw-bench.gguf", "layers");
 *   ... kvgw_progress_update(&pr, done, total);   from one thread at a time
 *   kvgw_progress_end(&pr);                          erases the line
 *
 * The line is redrawn only when the whole percentage changes, so a million updates cost a
 * hundred writes.
 */
#ifndef KVGW_PROGRESS_H
#define KVGW_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct kvgw_progress {
    const char *what; /* e.g. "writing models/x.gguf"; not copied: must outlive the display */
    const char *unit; /* what done/total count, e.g. "layers"; NULL: shown as a percentage only */
    bool on;          /* stderr is a terminal */
    bool drawn;       /* a line is on the screen */
    int last_pct;
} kvgw_progress_t;

/* Starts a display; it stays silent when stderr is not a terminal (or KVGW_NO_PROGRESS is set). */
void kvgw_progress_begin(kvgw_progress_t *p, const char *what, const char *unit);

/* Shows done of total (total 0 is ignored). */
void kvgw_progress_update(kvgw_progress_t *p, uint64_t done, uint64_t total);

/* Erases the line, so the command's own summary takes its place. */
void kvgw_progress_end(kvgw_progress_t *p);

/* Adapters with the callback signatures of eng_model_params_t / eng_params_t (ud is the
 * kvgw_progress_t) and eng_mkmodel_params_t. */
void kvgw_progress_cb_u32(uint32_t done, uint32_t total, void *ud);
void kvgw_progress_cb_u64(uint64_t done, uint64_t total, void *ud);

/* The adapter for gw_serve_params_t.load_progress (gateway/serve.h): (done, total) updates the
 * line, (0, 0) ends one worker's load and erases it; the next load draws it afresh. */
void kvgw_progress_cb_load(uint32_t done, uint32_t total, void *ud);

#endif
