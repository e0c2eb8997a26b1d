/* pc_time.h — clocks. Monotonic time for durations and TTL arithmetic, wall time for records. */
#ifndef PC_TIME_H
#define PC_TIME_H

#include <stdint.h>
#include <time.h>

static inline uint64_t pc_time_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t pc_time_mono_ms(void)
{
    return pc_time_mono_ns() / 1000000u;
}

static inline uint64_t pc_time_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

#endif
