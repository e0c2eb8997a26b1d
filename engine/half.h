/*
 * half.h — scalar conversions between float and the 16-bit formats the engine stores: IEEE
 * half (F16 weights and KV) and bfloat16 (BF16 weights, the BF16 GEMM's panels).
 *
 * Every conversion to 16 bits rounds to nearest even; overflow becomes infinity; NaN stays a
 * quiet NaN. Every conversion to float is exact. These are the engine's one scalar copy (the
 * CPU kernels' SIMD row conversions in cpu.h fall back to them, the model generator writes with
 * them); kernels/ keeps its own (krn_*) on purpose, so that it depends on no engine header.
 */
#ifndef ENG_HALF_H
#define ENG_HALF_H

#include <stdint.h>

uint16_t eng_f32_to_f16(float f);
float eng_f16_to_f32(uint16_t h);
uint16_t eng_f32_to_bf16(float f);
float eng_bf16_to_f32(uint16_t b);

#endif
