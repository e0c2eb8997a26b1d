/*
 * cpu.h — the CPU backend's building blocks (engine-internal): half-precision conversion, a
 * thread pool, and the compute kernels (cpu_kernels.c).
 *
 * SIMD: kernels with an AVX-512 variant pick it at run time (cpuid); `simd` false forces the
 * portable C code, which the tests run too.
 */
#ifndef ENG_CPU_H
#define ENG_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "half.h"

/* IEEE half <-> float rows: AVX-512/F16C with simd where the CPU has it, else the scalar
 * conversions of half.h (the same results: exact up, round-to-nearest-even down). */
void eng__f16_to_f32_row(const uint16_t *src, float *dst, size_t n, bool simd);
void eng__f32_to_f16_row(const float *src, uint16_t *dst, size_t n, bool simd);

/* True when the CPU has AVX-512F (and F16C/FMA, implied on every AVX-512 CPU). */
bool eng__cpu_has_avx512(void);

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
