/*
 * cpu.h — the CPU backend's building blocks (engine-internal): half-precision conversion, a
 * thread pool, and the compute kernels (cpu_kernels.c).
 *
 * SIMD: every kernel has an AVX-512, an AVX2 and a portable variant, picked at run time (see
 * eng_cpu_isa below); the tests run every path the test machine's CPU can execute.
 */
#ifndef ENG_CPU_H
#define ENG_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "half.h"

/* ---------------------------------------------------------------------------------------------
 * ISA paths (cpu_isa.c). Every kernel exists for each path below; the path is chosen at run time
 * from cpuid (never from the build machine), the highest the CPU and the OS can run, unless
 * KVGW_CPU_ISA or a parameter forces a lower one. ENG_CPU_ISA_AUTO (0, what a zeroed struct
 * holds) means "the best this CPU runs".
 *
 *   avx512    AVX-512F (+ BF16 GEMM where AVX512-BF16 exists), F16C, FMA
 *   avx2      AVX2 + FMA + F16C (every x86-64 CPU since Haswell / Zen 1)
 *   portable  plain C in fixed 8-wide blocks that the compiler vectorizes for the build's
 *             baseline (SSE2 on x86-64, NEON on aarch64), scalar half conversions
 * ------------------------------------------------------------------------------------------- */

typedef enum eng_cpu_isa {
    ENG_CPU_ISA_AUTO = 0,
    ENG_CPU_ISA_PORTABLE = 1,
    ENG_CPU_ISA_AVX2 = 2,
    ENG_CPU_ISA_AVX512 = 3,
} eng_cpu_isa_t;

/* The highest path this CPU runs (cached after the first call; any thread). */
eng_cpu_isa_t eng__cpu_isa_best(void);
/* True when this CPU runs isa (AUTO and PORTABLE always). */
bool eng__cpu_isa_runs(eng_cpu_isa_t isa);
/* "avx512", "avx2", "portable" or "auto": a static string. */
const char *eng__cpu_isa_name(eng_cpu_isa_t isa);
/* Parses "avx512", "avx2", "portable" or "auto". Returns 0 or PC_ERR_INVAL (*out unchanged). */
int eng__cpu_isa_parse(const char *s, eng_cpu_isa_t *out);
/* The path to run: `request` ("avx512" | "avx2" | "portable" | "auto"), or when it is NULL or
 * empty the environment variable KVGW_CPU_ISA, or when that is unset the best path. Returns 0
 * with *out set (never AUTO), PC_ERR_INVAL for an unknown name, or PC_ERR_UNSUPPORTED for a path
 * this CPU cannot run; errors leave a one-line reason in err (which may be NULL). */
int eng__cpu_isa_resolve(const char *request, eng_cpu_isa_t *out, char *err, size_t err_len);
/* isa itself, or the best path for AUTO; a path the CPU cannot run is lowered to the best one
 * it can (kernels call this, so a bad argument can never execute an illegal instruction). */
eng_cpu_isa_t eng__cpu_isa_clamp(eng_cpu_isa_t isa);

/* IEEE half <-> float rows on the given path (the same results on every path: exact up,
 * round-to-nearest-even down). */
void eng__f16_to_f32_row_isa(const uint16_t *src, float *dst, size_t n, eng_cpu_isa_t isa);
void eng__f32_to_f16_row_isa(const float *src, uint16_t *dst, size_t n, eng_cpu_isa_t isa);
/* The same with simd true for the best path, false for the portable one. */
void eng__f16_to_f32_row(const uint16_t *src, float *dst, size_t n, bool simd);
void eng__f32_to_f16_row(const float *src, uint16_t *dst, size_t n, bool simd);

/* True when the CPU has AVX-512F (and F16C/FMA, implied on every AVX-512 CPU). */
bool eng__cpu_has_avx512(void);
/* True when the CPU has AVX512-VNNI with AVX512-BW and -VL (the AVX-512 path's q8_0 KV scores
 * then use VPDPBUSD on two keys per vector). */
bool eng__cpu_has_avx512_vnni(void);
/* True when the CPU has AVX2, FMA and F16C. */
bool eng__cpu_has_avx2(void);

/* ---------------------------------------------------------------------------------------------
 * Thread pool: eng__pool_run calls fn(ctx, task, thread) for task in [0, n_tasks) on the
 * caller and n_threads - 1 workers, and returns when every task has run. Tasks are handed out
 * in order through an atomic counter. Not reentrant; one caller at a time.
 * ------------------------------------------------------------------------------------------- */

typedef struct eng_pool eng_pool_t;
typedef void (*eng_pool_fn)(void *ctx, uint32_t task, uint32_t thread);

int eng__pool_init(uint32_t n_threads, eng_pool_t **out);
void eng__pool_free(eng_pool_t *p);
uint32_t eng__pool_n_threads(const eng_pool_t *p);
void eng__pool_run(eng_pool_t *p, eng_pool_fn fn, void *ctx, uint32_t n_tasks);

#endif
