/*
 * cpu_portable.c — the portable path of the CPU kernels (see cpu_simd.h): plain C that any
 * C11 compiler builds for any architecture. Inner loops run in fixed blocks of 8 independent
 * lanes (acc[8], never one running sum), so the compiler's SLP vectorizer turns them into
 * vectors of the build's baseline ISA (SSE2 on x86-64, NEON on aarch64) without reassociating
 * any sum: the results do not depend on the compiler's choices. On aarch64 half rows convert
 * with NEON (vcvt_f32_f16); elsewhere with the scalar conversions of half.h.
 *
 * This path is also what every other path is tested against (together with the tests' naive
 * double-precision references).
 */
#include <math.h>
#include <string.h>

#include "cpu_simd.h"
#include "gguf.h"
#include "half.h"
#include "pc_assert.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#endif

/* One half as a float without branches (Maratos' FP16 method), so that blocks of 8 vectorize
 * on the baseline ISA: a normal half's exponent and mantissa shifted into place and rebased by a
 * multiply by 2^-112 (which also carries infinities and NaN, quieting a signalling NaN); a
 * subnormal one as (0.5 + m 2^-24) - 0.5 in float, which is exact. The same value as
 * eng_f16_to_f32 for every input (NaN payloads aside). */
static inline float f16_to_f32_nobranch(uint16_t h)
{
    uint32_t w = (uint32_t)h << 16, sign = w & 0x80000000u, two_w = w + w;
    uint32_t nb = (two_w >> 4) + (0xe0u << 23), db = (two_w >> 17) | (126u << 23), bits;
    float norm, den;
    memcpy(&norm, &nb, 4);
    memcpy(&den, &db, 4);
    norm *= 0x1.0p-112f;
    den -= 0.5f;
    uint32_t nbits, dbits;
    memcpy(&nbits, &norm, 4);
    memcpy(&dbits, &den, 4);
    uint32_t sub = 0u - (uint32_t)(two_w < (1u << 27)); /* all ones for a subnormal: a mask, not
                                                           a branch, so the loop vectorizes */
    bits = sign | (dbits & sub) | (nbits & ~sub);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

void eng__port_f16_to_f32(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
#if defined(__aarch64__)
    for (; i + 4 <= n; i += 4)
        vst1q_f32(dst + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(src + i))));
#endif
    for (; i + 8 <= n; i += 8)
        for (size_t j = 0; j < 8; j++)
            dst[i + j] = f16_to_f32_nobranch(src[i + j]);
    for (; i < n; i++)
        dst[i] = eng_f16_to_f32(src[i]);
}

void eng__port_f32_to_f16(const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
#if defined(__aarch64__)
    /* FCVTN rounds to nearest even (the default FPCR mode), as eng_f32_to_f16. */
    for (; i + 4 <= n; i += 4)
        vst1_u16(dst + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(src + i))));
#endif
    for (; i < n; i++)
        dst[i] = eng_f32_to_f16(src[i]);
}

void eng__port_bf16_to_f32(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) { /* a shift per lane: vectorized on every target */
        uint32_t b = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &b, 4);
    }
}

/* Weights converted per piece of a row: small enough for the stack and L1, a whole number of
 * blocks of every quantized type (a K-quant super-block is 256). */
#define PORT_KCHUNK 256

float eng__port_dot_q(uint32_t wtype, const void *w, const void *xq, uint32_t K)
{
    return eng_quant_vec_dot(wtype, w, xq, K);
}

void eng__port_gemv(const eng_gemv_t *g, uint32_t n0, uint32_t n1)
{
    uint32_t K = g->K, M = g->M;
    PC_ASSERT(M <= ENG_GEMV_MAX_M);
    if (eng__gemv_int8(g->wtype)) {
        eng__gemv_q(g, n0, n1, eng__port_dot_q);
        return;
    }
    PC_ASSERT(K % eng_ggml_type_block_size(g->wtype) == 0);
    _Static_assert(PORT_KCHUNK % ENG_QK_K == 0, "a chunk holds whole blocks");
    size_t rb = eng__gemv_row_bytes(g->wtype, K);
    float wbuf[PORT_KCHUNK];
    float acc[ENG_GEMV_MAX_M][8];
    for (uint32_t n = n0; n < n1; n++) {
        memset(acc, 0, sizeof acc);
        float tail[ENG_GEMV_MAX_M] = {0};
        for (uint32_t k0 = 0; k0 < K; k0 += PORT_KCHUNK) {
            uint32_t kn = K - k0 < PORT_KCHUNK ? K - k0 : PORT_KCHUNK;
            const float *w = wbuf;
            const char *wr = (const char *)g->w + (size_t)n * rb;
            switch (g->wtype) {
            case ENG_GGML_TYPE_F16:
                eng__port_f16_to_f32((const uint16_t *)wr + k0, wbuf, kn);
                break;
            case ENG_GGML_TYPE_BF16:
                eng__port_bf16_to_f32((const uint16_t *)wr + k0, wbuf, kn);
                break;
            case ENG_GGML_TYPE_F32:
                w = (const float *)wr + k0;
                break;
            default:
                eng_quant_row_to_f32(g->wtype, wr + eng_quant_row_bytes(g->wtype, k0), wbuf, kn);
                break;
            }
            uint32_t k8 = kn & ~7u;
            for (uint32_t m = 0; m < M; m++) {
                const float *x = g->x + (size_t)m * K + k0;
                float a[8];
                memcpy(a, acc[m], sizeof a);
                for (uint32_t k = 0; k < k8; k += 8)
                    for (uint32_t j = 0; j < 8; j++)
                        a[j] += w[k + j] * x[k + j];
                memcpy(acc[m], a, sizeof a);
                for (uint32_t k = k8; k < kn; k++)
                    tail[m] += w[k] * x[k];
            }
        }
        for (uint32_t m = 0; m < M; m++) {
            float s = ((acc[m][0] + acc[m][4]) + (acc[m][1] + acc[m][5])) +
                      ((acc[m][2] + acc[m][6]) + (acc[m][3] + acc[m][7])) + tail[m];
            float *yp = &g->y[(size_t)m * g->ldy + n];
            *yp = g->accumulate ? *yp + s : s;
        }
    }
}

/* The online-softmax step of one row over the raw scores s[0, n_valid) of a block or chunk:
 * s becomes the weights, m and l move on, o is scaled by the correction. */
static void port_softmax_step(eng_attn_row_t *row, float *s, uint32_t n_valid, uint32_t hd)
{
    float bmax = -INFINITY;
    for (uint32_t j = 0; j < n_valid; j++)
        bmax = s[j] > bmax ? s[j] : bmax;
    float m_new = row->m > bmax ? row->m : bmax;
    float corr = expf(row->m - m_new);
    float sum = 0;
    for (uint32_t j = 0; j < n_valid; j++) {
        s[j] = expf(s[j] - m_new);
        sum += s[j];
    }
    row->l = row->l * corr + sum;
    row->m = m_new;
    for (uint32_t d = 0; d < hd; d++)
        row->o[d] *= corr;
}

void eng__port_attn_block(const float *kt, const float *vb, uint32_t hd, uint32_t bt,
                          eng_attn_row_t *row, uint32_t block_start, uint32_t n_slots)
{
    if (row->pos < block_start)
        return;
    uint32_t n_valid = n_slots < row->pos - block_start + 1 ? n_slots : row->pos - block_start + 1;
    /* Scores: dimension-major, so the inner loop runs over independent keys. */
    float s[4096];
    PC_ASSERT(n_valid <= 4096);
    for (uint32_t j = 0; j < n_valid; j++)
        s[j] = 0;
    for (uint32_t d = 0; d < hd; d++) {
        float qd = row->q[d];
        const float *kd = kt + (size_t)d * bt;
        for (uint32_t j = 0; j < n_valid; j++)
            s[j] += qd * kd[j];
    }
    port_softmax_step(row, s, n_valid, hd);
    /* Values: key-major, the inner loop over independent output dimensions. */
    float *o = row->o;
    for (uint32_t j = 0; j < n_valid; j++) {
        float pj = s[j];
        const float *vj = vb + (size_t)j * hd;
        for (uint32_t d = 0; d < hd; d++)
            o[d] += pj * vj[d];
    }
}

void eng__port_rmsnorm(const float *x, const float *w, float *y, uint32_t n, float eps)
{
    /* ggml's rms_norm: squares in F32, their sum in double, the mean in F32. */
    double ss = 0;
    for (uint32_t i = 0; i < n; i++) {
        float sq = x[i] * x[i];
        ss += sq;
    }
    float mean = (float)(ss / n);
    float scale = 1.0f / sqrtf(mean + eps);
    for (uint32_t i = 0; i < n; i++)
        y[i] = x[i] * scale * w[i];
}

void eng__port_swiglu(float *g, const float *u, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        float gv = g[j];
        g[j] = gv / (1.0f + expf(-gv)) * u[j];
    }
}

void eng__port_rope(float *x, const float *cs, const float *sn, uint32_t rope_dim, bool neox)
{
    uint32_t half = rope_dim / 2;
    if (neox) {
        float *xa = x, *xb = x + half;
        for (uint32_t i = 0; i < half; i++) {
            float x0 = xa[i], x1 = xb[i];
            xa[i] = x0 * cs[i] - x1 * sn[i];
            xb[i] = x0 * sn[i] + x1 * cs[i];
        }
        return;
    }
    for (uint32_t i = 0; i < half; i++) {
        float x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = x0 * cs[i] - x1 * sn[i];
        x[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
    }
}

/* The int8 dot product of two q8_0 blocks' quants, exact in int32 (8 independent lanes). */
static inline int32_t dot_q8(const int8_t *x, const int8_t *y)
{
    int32_t a[8] = {0};
    for (uint32_t i = 0; i < ENG_QK8_0; i += 8)
        for (uint32_t j = 0; j < 8; j++)
            a[j] += (int32_t)x[i + j] * (int32_t)y[i + j];
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

static inline float q8_scale(const uint8_t *blk)
{
    uint16_t dh;
    memcpy(&dh, blk, 2);
    return eng_f16_to_f32(dh);
}

void eng__port_attn_q8_chunk(const uint8_t *const *krow, const uint8_t *const *vrow, uint32_t hd,
                             eng_attn_row_t *row, uint32_t start, uint32_t n_keys)
{
    if (row->pos < start)
        return;
    uint32_t nb = hd / ENG_QK8_0;
    uint32_t n_valid = n_keys < row->pos - start + 1 ? n_keys : row->pos - start + 1;
    float s[ENG_ATTN_CHUNK];
    PC_ASSERT(n_valid <= ENG_ATTN_CHUNK);
    for (uint32_t j = 0; j < n_valid; j++) {
        float acc = 0;
        for (uint32_t b = 0; b < nb; b++) {
            const uint8_t *qb = row->qq + (size_t)b * ENG_Q8_0_BYTES;
            const uint8_t *kb = krow[j] + (size_t)b * ENG_Q8_0_BYTES;
            int32_t d = dot_q8((const int8_t *)(qb + 2), (const int8_t *)(kb + 2));
            acc += q8_scale(qb) * q8_scale(kb) * (float)d;
        }
        s[j] = acc;
    }
    port_softmax_step(row, s, n_valid, hd);
    float *o = row->o;
    for (uint32_t j = 0; j < n_valid; j++) {
        for (uint32_t b = 0; b < nb; b++) {
            const uint8_t *vb = vrow[j] + (size_t)b * ENG_Q8_0_BYTES;
            float w = s[j] * q8_scale(vb);
            const int8_t *q = (const int8_t *)(vb + 2);
            float *ob = o + (size_t)b * ENG_QK8_0;
            for (uint32_t d = 0; d < ENG_QK8_0; d++)
                ob[d] += w * (float)q[d];
        }
    }
}
