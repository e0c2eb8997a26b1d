/*
 * cpu_isa.c — which ISA path the CPU kernels run (see cpu.h): CPU features from cpuid and the
 * OS's saved register state (xgetbv), the KVGW_CPU_ISA override, and the half-precision row
 * conversions' dispatch.
 *
 * Detection uses cpuid directly: gcc's and clang's __builtin_cpu_supports disagree on feature
 * names, and clang 14 knows neither "f16c" nor "avx512bf16". A feature counts only when the OS
 * also saves its registers: AVX needs XCR0 bits 1 and 2 (SSE, AVX state), AVX-512 also bits 5,
 * 6 and 7 (opmask, upper ZMM halves, ZMM16-31).
 */
#include "cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_simd.h"
#include "pc_err.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define ENG_X86 1
#endif

enum { F_AVX2 = 1, F_AVX512 = 2, F_BF16 = 4, F_VNNI = 8, F_VBMI = 16 };

static unsigned cpu_features_probe(void)
{
#ifdef ENG_X86
    unsigned a, b, c, d, f = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28);
    bool f16c = c & (1u << 29);
    if (!fma || !f16c || !osxsave || !avx || __get_cpuid_max(0, NULL) < 7)
        return 0;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 0x6) != 0x6)
        return 0;
    __cpuid_count(7, 0, a, b, c, d);
    if (!(b & (1u << 5))) /* AVX2 */
        return 0;
    f |= F_AVX2;
    if ((b & (1u << 16)) && (xlo & 0xe6) == 0xe6) /* AVX512F, with the ZMM state saved */
        f |= F_AVX512;
    /* AVX512_VNNI with AVX512BW and AVX512VL: the q8_0 KV scores' VPDPBUSD. */
    if ((f & F_AVX512) && (b & (1u << 30)) && (b & (1u << 31)) && (c & (1u << 11)))
        f |= F_VNNI;
    if ((f & F_VNNI) && (c & (1u << 1))) /* AVX512_VBMI */
        f |= F_VBMI;
    __cpuid_count(7, 1, a, b, c, d);
    if ((f & F_AVX512) && (a & (1u << 5))) /* AVX512_BF16 */
        f |= F_BF16;
    return f;
#else
    return 0;
#endif
}

static unsigned cpu_features(void)
{
    static int cached = -1; /* racing threads compute and store the same value */
    if (cached < 0)
        cached = (int)cpu_features_probe();
    return (unsigned)cached;
}

bool eng__cpu_has_avx2(void)
{
    return (cpu_features() & F_AVX2) != 0;
}

bool eng__cpu_has_avx512(void)
{
    return (cpu_features() & F_AVX512) != 0;
}

bool eng__cpu_has_avx512_vnni(void)
{
    return (cpu_features() & F_VNNI) != 0;
}

bool eng__cpu_has_avx512_vbmi(void)
{
    return (cpu_features() & F_VBMI) != 0;
}

bool eng__cpu_has_bf16(void)
{
    return (cpu_features() & F_BF16) != 0;
}

eng_cpu_isa_t eng__cpu_isa_best(void)
{
    unsigned f = cpu_features();
    if (f & F_AVX512)
        return ENG_CPU_ISA_AVX512;
    if (f & F_AVX2)
        return ENG_CPU_ISA_AVX2;
    return ENG_CPU_ISA_PORTABLE;
}

bool eng__cpu_isa_runs(eng_cpu_isa_t isa)
{
    switch (isa) {
    case ENG_CPU_ISA_AUTO:
    case ENG_CPU_ISA_PORTABLE:
        return true;
    case ENG_CPU_ISA_AVX2:
        return eng__cpu_has_avx2();
    case ENG_CPU_ISA_AVX512:
        return eng__cpu_has_avx512();
    }
    return false;
}

eng_cpu_isa_t eng__cpu_isa_clamp(eng_cpu_isa_t isa)
{
    if (isa == ENG_CPU_ISA_AUTO || !eng__cpu_isa_runs(isa))
        return eng__cpu_isa_best();
    return isa;
}

static const char *const isa_names[] = {"auto", "portable", "avx2", "avx512"};

const char *eng__cpu_isa_name(eng_cpu_isa_t isa)
{
    return (unsigned)isa < sizeof isa_names / sizeof isa_names[0] ? isa_names[isa] : "?";
}

int eng__cpu_isa_parse(const char *s, eng_cpu_isa_t *out)
{
    for (unsigned i = 0; s != NULL && i < sizeof isa_names / sizeof isa_names[0]; i++) {
        if (strcmp(s, isa_names[i]) == 0) {
            *out = (eng_cpu_isa_t)i;
            return 0;
        }
    }
    return PC_ERR_INVAL;
}

int eng__cpu_isa_resolve(const char *request, eng_cpu_isa_t *out, char *err, size_t err_len)
{
    const char *from = "requested";
    if (request == NULL || request[0] == '\0') {
        request = getenv("KVGW_CPU_ISA");
        from = "KVGW_CPU_ISA";
    }
    eng_cpu_isa_t isa = ENG_CPU_ISA_AUTO;
    if (request != NULL && request[0] != '\0' && eng__cpu_isa_parse(request, &isa) != 0) {
        if (err != NULL)
            snprintf(err, err_len, "%s CPU path \"%s\" is not avx512, avx2, portable or auto", from,
                     request);
        return PC_ERR_INVAL;
    }
    if (!eng__cpu_isa_runs(isa)) {
        if (err != NULL)
            snprintf(err, err_len,
                     "%s CPU path \"%s\" cannot run on this CPU (the best it runs is %s)", from,
                     request, eng__cpu_isa_name(eng__cpu_isa_best()));
        return PC_ERR_UNSUPPORTED;
    }
    *out = isa == ENG_CPU_ISA_AUTO ? eng__cpu_isa_best() : isa;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Half-precision rows
 * ------------------------------------------------------------------------------------------- */

void eng__f16_to_f32_row_isa(const uint16_t *src, float *dst, size_t n, eng_cpu_isa_t isa)
{
    switch (eng__cpu_isa_clamp(isa)) {
#ifdef ENG_X86
    case ENG_CPU_ISA_AVX512:
        eng__avx512_f16_to_f32(src, dst, n);
        return;
    case ENG_CPU_ISA_AVX2:
        eng__avx2_f16_to_f32(src, dst, n);
        return;
#endif
    default:
        eng__port_f16_to_f32(src, dst, n);
        return;
    }
}

void eng__f32_to_f16_row_isa(const float *src, uint16_t *dst, size_t n, eng_cpu_isa_t isa)
{
    switch (eng__cpu_isa_clamp(isa)) {
#ifdef ENG_X86
    case ENG_CPU_ISA_AVX512:
        eng__avx512_f32_to_f16(src, dst, n);
        return;
    case ENG_CPU_ISA_AVX2:
        eng__avx2_f32_to_f16(src, dst, n);
        return;
#endif
    default:
        eng__port_f32_to_f16(src, dst, n);
        return;
    }
}

void eng__f16_to_f32_row(const uint16_t *src, float *dst, size_t n, bool simd)
{
    eng__f16_to_f32_row_isa(src, dst, n, simd ? ENG_CPU_ISA_AUTO : ENG_CPU_ISA_PORTABLE);
}

void eng__f32_to_f16_row(const float *src, uint16_t *dst, size_t n, bool simd)
{
    eng__f32_to_f16_row_isa(src, dst, n, simd ? ENG_CPU_ISA_AUTO : ENG_CPU_ISA_PORTABLE);
}
