/* pc_rss.h — process memory figures for benchmarks (Linux /proc). */
#ifndef PC_RSS_H
#define PC_RSS_H

#include <stddef.h>

/* Current and peak resident set size in bytes, read from /proc/self/status; 0 if unknown. */
size_t pc_rss_current_bytes(void);
size_t pc_rss_peak_bytes(void);

#endif
