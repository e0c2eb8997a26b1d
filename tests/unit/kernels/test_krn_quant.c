/*
 * test_krn_quant.c — the quantized weight types of kernels/ (kernels.h, "Quantized weights") on
 * the CPU: the block decoder the CUDA kernels run (krn_quant_hostdev.h, through
 * krn_ref_dequant) against llama.cpp's own dequantized values bit for bit, against a decoder
 * written here after ggml's dequantize_row_* loops (bit for bit), against the engine's
 * dequantization (engine/quant.h, the CPU backend's oracle: bit for bit) and against the float64
 * value of each element over random blocks with edge cases; krn_ref_qmatmul against double sums;
 * the argument checks; the GEMM path's chunk planning and krn_ref_gemm's row stride.
 *
 * The llama.cpp vectors are ../shared/testdata/quant-vectors.gguf (17 MB, kept outside the
 * repository; tests/data/quant-vectors.gguf is used first when present): without either the
 * test is SKIPPED with the path it looked for.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "kernels.h"
#include "krn_quant_hostdev.h"
#include "krn_testutil.h"
#include "pc_err.h"
#include "pc_test.h"
#include "quant.h" /* the engine's reference dequantization */

static const int32_t k_types[] = {KRN_QT_Q4_0, KRN_QT_Q5_0, KRN_QT_Q5_1, KRN_QT_Q8_0,
                                  KRN_QT_Q4_K, KRN_QT_Q5_K, KRN_QT_Q6_K};
#define N_TYPES 7
/* The types quant-vectors.gguf holds llama.cpp's tensors of (no Q5_0 / Q5_1: those are checked
 * against ggml's loops below and the engine's dequantization, itself ggml's bit for bit). */
static const int32_t k_file_types[] = {KRN_QT_Q4_0, KRN_QT_Q8_0, KRN_QT_Q4_K, KRN_QT_Q5_K,
                                       KRN_QT_Q6_K};
#define N_FILE_TYPES 5

PC_TEST(sizes_match_the_engines_ggml_table)
{
    for (int i = 0; i < N_TYPES; i++) {
        int32_t t = k_types[i];
        ASSERT_EQ(krn_qtype_block_elems(t), eng_ggml_type_block_size((uint32_t)t));
        ASSERT_EQ(krn_qtype_block_bytes(t), eng_ggml_type_block_bytes((uint32_t)t));
        ASSERT_STR_EQ(krn_qtype_name(t), eng_ggml_type_name((uint32_t)t));
        int64_t be = krn_qtype_block_elems(t);
        ASSERT_EQ(krn_qtype_row_bytes(t, 3 * be), 3 * krn_qtype_block_bytes(t));
        ASSERT_EQ(krn_qtype_row_bytes(t, be + 8), 0);
        ASSERT_EQ(krn_qtype_row_bytes(t, 0), 0);
        ASSERT_EQ(krn_qtype_row_bytes(t, -be), 0);
    }
    ASSERT_EQ(krn_qtype_block_elems(KRN_F16), 0); /* F16's id 1 is not a quantized type */
    ASSERT_EQ(krn_qtype_row_bytes(3, 256), 0);    /* Q4_1: not taken */
    ASSERT_STR_EQ(krn_qtype_name(99), "?");
}

/* The vectors file: tests/data first, then ../shared (tests run in the repository root). */
static const char *vectors_path(void)
{
    static const char *paths[] = {"tests/data/quant-vectors.gguf",
                                  "../shared/testdata/quant-vectors.gguf"};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        FILE *f = fopen(paths[i], "rb");
        if (f != NULL) {
            fclose(f);
            return paths[i];
        }
    }
    return NULL;
}

PC_TEST(dequant_reproduces_llama_cpp_vectors_bit_for_bit)
{
    const char *path = vectors_path();
    if (path == NULL)
        PC_SKIP("no quant-vectors.gguf in tests/data/ or ../shared/testdata/ (issue 25's "
                "llama.cpp reference vectors)");
    char err[256];
    eng_gguf_t *g = NULL;
    ASSERT_EQ(eng_gguf_open(path, &g, err, sizeof err), 0);
    int n_per_type[N_FILE_TYPES] = {0};
    for (uint64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor_t *t = eng_gguf_tensor_at(g, i);
        int ti = -1;
        for (int k = 0; k < N_FILE_TYPES; k++)
            ti = (uint32_t)k_file_types[k] == t->type ? k : ti;
        if (ti < 0)
            continue;
        char name[128];
        snprintf(name, sizeof name, "%s.f32", t->name);
        const eng_gguf_tensor_t *ref = eng_gguf_tensor_find(g, name);
        ASSERT_TRUE(ref != NULL);
        ASSERT_EQ(ref->type, ENG_GGML_TYPE_F32);
        ASSERT_EQ(ref->n_elements, t->n_elements);
        int32_t n_in = (int32_t)t->ne[0], n_rows = (int32_t)(t->n_elements / n_in);
        ASSERT_EQ((int64_t)krn_qtype_row_bytes(k_file_types[ti], n_in) * n_rows,
                  (int64_t)t->n_bytes);
        float *y = malloc((size_t)t->n_elements * sizeof(float));
        uint16_t *h = malloc((size_t)t->n_elements * sizeof(uint16_t));
        ASSERT_TRUE(y != NULL && h != NULL);
        krn_dequant_args_t a = {.w = t->data,
                                .y = y,
                                .n_rows = n_rows,
                                .n_wrows = n_rows,
                                .n_in = n_in,
                                .qtype = k_file_types[ti],
                                .dtype = KRN_F32};
        ASSERT_EQ(krn_ref_dequant(&a), 0);
        const float *want = ref->data;
        int64_t bad = -1;
        for (int64_t e = 0; e < t->n_elements && bad < 0; e++)
            bad = memcmp(&y[e], &want[e], sizeof(float)) != 0 ? e : -1;
        if (bad >= 0)
            PC_TEST__FAIL("%s element %lld: got %.9g want %.9g", t->name, (long long)bad,
                          (double)y[bad], (double)want[bad]);
        /* The GEMM path's halves are the same values rounded once. */
        a.y = h;
        a.dtype = KRN_F16;
        ASSERT_EQ(krn_ref_dequant(&a), 0);
        for (int64_t e = 0; e < t->n_elements; e += 97)
            ASSERT_EQ(h[e], krn_f32_to_f16(want[e]));
        a.dtype = KRN_BF16;
        ASSERT_EQ(krn_ref_dequant(&a), 0);
        for (int64_t e = 0; e < t->n_elements; e += 97)
            ASSERT_EQ(h[e], krn_f32_to_bf16(want[e]));
        free(y);
        free(h);
        n_per_type[ti]++;
    }
    eng_gguf_free(g);
    for (int k = 0; k < N_FILE_TYPES; k++)
        if (n_per_type[k] == 0)
            PC_TEST__FAIL("%s has no %s tensor", path, krn_qtype_name(k_file_types[k]));
}

/*
 * An independent decoder, written after ggml's dequantize_row_* loops (whole blocks, in their
 * order), in F32 as ggml computes (want32) and in float64 (want64: the exact value of d * sc *
 * q - dmin * m from the same F16 and integer fields).
 */
static float half_at(const uint8_t *p)
{
    return krn_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}
static void scale_min(int j, const uint8_t *q, int *d, int *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}
static void decode_block(int32_t t, const uint8_t *b, float *want32, double *want64)
{
    switch (t) {
    case KRN_QT_Q4_0: {
        float d = half_at(b);
        for (int j = 0; j < 16; j++) {
            int x0 = (b[2 + j] & 0x0F) - 8, x1 = (b[2 + j] >> 4) - 8;
            want32[j] = x0 * d;
            want32[j + 16] = x1 * d;
            want64[j] = (double)x0 * d;
            want64[j + 16] = (double)x1 * d;
        }
        break;
    }
    case KRN_QT_Q5_0:
    case KRN_QT_Q5_1: { /* dequantize_row_q5_0 / _q5_1 */
        const bool q51 = t == KRN_QT_Q5_1;
        const float d = half_at(b), m = q51 ? half_at(b + 2) : 0.0f;
        const uint8_t *qhp = b + (q51 ? 4 : 2), *qs = qhp + 4;
        uint32_t qh = (uint32_t)qhp[0] | (uint32_t)qhp[1] << 8 | (uint32_t)qhp[2] << 16 |
                      (uint32_t)qhp[3] << 24;
        for (int j = 0; j < 16; j++) {
            const uint8_t xh_0 = ((qh >> (j + 0)) << 4) & 0x10;
            const uint8_t xh_1 = ((qh >> (j + 12))) & 0x10;
            const int32_t x0 = ((qs[j] & 0x0F) | xh_0) - (q51 ? 0 : 16);
            const int32_t x1 = ((qs[j] >> 4) | xh_1) - (q51 ? 0 : 16);
            want32[j] = q51 ? x0 * d + m : x0 * d;
            want32[j + 16] = q51 ? x1 * d + m : x1 * d;
            want64[j] = (double)x0 * d + m;
            want64[j + 16] = (double)x1 * d + m;
        }
        break;
    }
    case KRN_QT_Q8_0: {
        float d = half_at(b);
        for (int j = 0; j < 32; j++) {
            want32[j] = (float)(int8_t)b[2 + j] * d;
            want64[j] = (double)(int8_t)b[2 + j] * d;
        }
        break;
    }
    case KRN_QT_Q4_K:
    case KRN_QT_Q5_K: {
        const bool q5 = t == KRN_QT_Q5_K;
        const float d = half_at(b), min = half_at(b + 2);
        const uint8_t *sc = b + 4, *qh = b + 16, *q = b + (q5 ? 48 : 16);
        int is = 0, sh = 0;
        for (int j = 0; j < 256; j += 64, q += 32, is += 2, sh += 2) {
            for (int half = 0; half < 2; half++) {
                int s, m;
                scale_min(is + half, sc, &s, &m);
                const float d1 = d * s, m1 = min * m;
                for (int l = 0; l < 32; l++) {
                    int v = half ? q[l] >> 4 : q[l] & 0xF;
                    if (q5 && (qh[l] & (1u << (sh + half))))
                        v += 16;
                    want32[j + 32 * half + l] = d1 * v - m1;
                    want64[j + 32 * half + l] = (double)d * s * v - (double)min * m;
                }
            }
        }
        break;
    }
    case KRN_QT_Q6_K: {
        const float d = half_at(b + 208);
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int n = 0; n < 256; n += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = (int8_t)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = (int8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                int qq[4] = {q1, q2, q3, q4};
                for (int k = 0; k < 4; k++) {
                    want32[n + l + 32 * k] = d * sc[is + 2 * k] * qq[k];
                    want64[n + l + 32 * k] = (double)d * sc[is + 2 * k] * qq[k];
                }
            }
        }
        break;
    }
    }
}

PC_TEST(dequant_matches_ggml_loops_and_float64_over_random_and_edge_blocks)
{
    kt_rng_t r = {25};
    enum { NB = 64 };
    for (int ti = 0; ti < N_TYPES; ti++) {
        int32_t t = k_types[ti], be = krn_qtype_block_elems(t), bb = krn_qtype_block_bytes(t);
        uint8_t *w = malloc((size_t)NB * bb);
        float *y = malloc((size_t)NB * be * sizeof(float)), w32[256];
        double w64[256];
        ASSERT_TRUE(w != NULL && y != NULL);
        kt_qblocks(&r, t, NB, w, true);
        /* One row of NB blocks, and NB / 4 rows of 4 blocks read in reverse through `rows`. */
        krn_dequant_args_t a = {
            .w = w, .y = y, .n_rows = 1, .n_wrows = 1, .n_in = NB * be, .qtype = t};
        ASSERT_EQ(krn_ref_dequant(&a), 0);
        int n_zero = 0;
        for (int b = 0; b < NB; b++) {
            decode_block(t, w + (size_t)b * bb, w32, w64);
            for (int e = 0; e < be; e++) {
                float got = y[(size_t)b * be + e];
                if (memcmp(&got, &w32[e], sizeof got) != 0)
                    PC_TEST__FAIL("%s block %d element %d: got %.9g, ggml's loop %.9g",
                                  krn_qtype_name(t), b, e, (double)got, (double)w32[e]);
                /* Each F32 rounding is within half an ulp of its exact operands: at most 3
                 * roundings (d * sc, dmin * m, the difference; d * sc * q for Q6_K). */
                double tol = 4.0 * FLT_EPSILON * fabs(w64[e]) + 1e-30;
                if (t == KRN_QT_Q5_1) /* d * q + m: the sum's rounding is relative to its terms */
                    tol += 4.0 * FLT_EPSILON * fabs((double)half_at(w + (size_t)b * bb + 2));
                if (t == KRN_QT_Q4_K || t == KRN_QT_Q5_K) {
                    int s, m;
                    scale_min(e / 32, w + (size_t)b * bb + 4, &s, &m);
                    tol += 4.0 * FLT_EPSILON * fabs((double)half_at(w + (size_t)b * bb + 2) * m);
                }
                ASSERT_LE(fabs((double)got - w64[e]), tol);
                n_zero += got == 0.0f;
            }
        }
        ASSERT_TRUE(n_zero >= be); /* the all-zero block decoded to zeros */
        int32_t rows[NB / 4];
        for (int i = 0; i < NB / 4; i++)
            rows[i] = NB / 4 - 1 - i;
        float *y2 = malloc((size_t)NB * be * sizeof(float));
        ASSERT_TRUE(y2 != NULL);
        a = (krn_dequant_args_t){.w = w,
                                 .rows = rows,
                                 .y = y2,
                                 .n_rows = NB / 4,
                                 .n_wrows = NB / 4,
                                 .n_in = 4 * be,
                                 .qtype = t};
        ASSERT_EQ(krn_ref_dequant(&a), 0);
        for (int i = 0; i < NB / 4; i++)
            ASSERT_MEM_EQ(y2 + (size_t)i * 4 * be, y + (size_t)rows[i] * 4 * be,
                          (size_t)4 * be * sizeof(float));
        /* A row id outside the table is a NaN row, never a read. */
        rows[1] = NB / 4;
        rows[2] = -1;
        ASSERT_EQ(krn_ref_dequant(&a), 0);
        ASSERT_TRUE(isnan(y2[4 * be]) && isnan(y2[8 * be + 4 * be - 1]));
        free(w);
        free(y);
        free(y2);
    }
}

/* The engine's eng_quant_row_to_f32 (what the CPU backend and the cuda backend's upload
 * statistics read) and the kernels' decoder agree bit for bit, edge blocks included, and the
 * kernels' sizes are the engine's table's. */
PC_TEST(dequant_matches_the_engines_reference)
{
    kt_rng_t r = {26};
    enum { NB = 48 };
    for (int ti = 0; ti < N_TYPES; ti++) {
        int32_t t = k_types[ti], be = krn_qtype_block_elems(t);
        ASSERT_EQ((int64_t)eng_quant_row_bytes((uint32_t)t, (uint64_t)NB * be),
                  krn_qtype_row_bytes(t, (int64_t)NB * be));
        ASSERT_TRUE(eng_quant_type_is_quant((uint32_t)t));
        uint8_t *w = malloc((size_t)krn_qtype_row_bytes(t, (int64_t)NB * be));
        float *got = malloc((size_t)NB * be * sizeof(float)), *want = malloc((size_t)NB * be * 4);
        ASSERT_TRUE(w != NULL && got != NULL && want != NULL);
        kt_qblocks(&r, t, NB, w, true);
        krn_dequant_args_t a = {.w = w,
                                .y = got,
                                .n_rows = 1,
                                .n_wrows = 1,
                                .n_in = NB * be,
                                .qtype = t,
                                .dtype = KRN_F32};
        ASSERT_EQ(krn_ref_dequant(&a), 0);
        eng_quant_row_to_f32((uint32_t)t, w, want, (size_t)NB * be);
        for (int e = 0; e < NB * be; e++)
            if (memcmp(&got[e], &want[e], sizeof(float)) != 0)
                PC_TEST__FAIL("%s element %d: kernels %.9g, engine %.9g", krn_qtype_name(t), e,
                              (double)got[e], (double)want[e]);
        free(w);
        free(got);
        free(want);
    }
}

/* The GEMV kernel emulated on the host: warp-per-row, lane l over groups l, l + 32, ... with
 * krn_q_group8_affine and krn_q_dot8 (the kernel's own code), the warp's xor-shuffle sum; against
 * krn_ref_qmatmul (double sums over the dequantized weights) within 1e-5 of the norm, as the
 * gpu test holds the kernel. Row widths with fewer groups than lanes and with several per lane. */
static void emulate_qgemv(const krn_qmatmul_args_t *a, const float *x)
{
    int64_t rb = krn_qtype_row_bytes(a->qtype, a->K), n_groups = a->K / 8;
    for (int32_t n = 0; n < a->N; n++) {
        const uint8_t *row = (const uint8_t *)a->w + (int64_t)n * rb;
        for (int32_t m = 0; m < a->M; m++) {
            float lanes[32] = {0};
            for (int l = 0; l < 32; l++)
                for (int64_t g = l; g < n_groups; g += 32) {
                    float q[8], scale, offset;
                    krn_q_group8_affine(a->qtype, row, g, q, &scale, &offset);
                    lanes[l] = krn_q_dot8(a->qtype, q, scale, offset, x + (int64_t)m * a->K + g * 8,
                                          lanes[l]);
                }
            for (int off = 16; off > 0; off /= 2) {
                float next[32];
                for (int l = 0; l < 32; l++)
                    next[l] = lanes[l] + lanes[l ^ off];
                memcpy(lanes, next, sizeof lanes);
            }
            float *y = &a->y[(int64_t)m * a->N + n];
            *y = a->accumulate ? *y + lanes[0] : lanes[0];
        }
    }
}

PC_TEST(gemv_emulation_matches_reference)
{
    kt_rng_t r = {28};
    for (int ti = 0; ti < N_TYPES; ti++) {
        int32_t t = k_types[ti], be = krn_qtype_block_elems(t);
        const int32_t widths[] = {3 * be, be == 32 ? 1024 + 96 : 3 * 256 * 5};
        for (int wi = 0; wi < 2; wi++) {
            int32_t K = widths[wi], N = 13, M = KRN_QGEMV_MAX_ROWS;
            int64_t rb = krn_qtype_row_bytes(t, K);
            uint8_t *w = malloc((size_t)(N * rb));
            float *x = malloc((size_t)M * K * 4), want[13 * KRN_QGEMV_MAX_ROWS],
                  got[13 * KRN_QGEMV_MAX_ROWS];
            ASSERT_TRUE(w != NULL && x != NULL);
            kt_qblocks(&r, t, N * rb / krn_qtype_block_bytes(t), w, false);
            for (int i = 0; i < M * K; i++)
                x[i] = kt_unif(&r) * 2;
            for (int i = 0; i < M * N; i++)
                want[i] = got[i] = kt_unif(&r);
            krn_qmatmul_args_t a = {.w = w,
                                    .qtype = t,
                                    .x = x,
                                    .x_dtype = KRN_F32,
                                    .y = want,
                                    .M = M,
                                    .N = N,
                                    .K = K,
                                    .accumulate = wi == 1};
            ASSERT_EQ(krn_ref_qmatmul(&a), 0);
            a.y = got;
            emulate_qgemv(&a, x);
            double err = kt_rel_err_f(got, want, (int64_t)M * N);
            free(w);
            free(x);
            if (!(err <= 1e-5))
                PC_TEST__FAIL("%s K=%d: rel err %.3g", krn_qtype_name(t), K, err);
        }
    }
}

PC_TEST(dequant_and_qmatmul_refuse_bad_arguments)
{
    uint8_t w[KRN_Q4_K_BYTES * 2] = {0};
    float y[512], x[512] = {0};
    krn_dequant_args_t d = {.w = w,
                            .y = y,
                            .n_rows = 1,
                            .n_wrows = 1,
                            .n_in = 256,
                            .qtype = KRN_QT_Q4_K,
                            .dtype = KRN_F32};
    ASSERT_EQ(krn_ref_dequant(&d), 0);
    krn_dequant_args_t b = d;
    b.n_in = 200; /* not a multiple of 256 */
    ASSERT_EQ(krn_ref_dequant(&b), PC_ERR_INVAL);
    b = d;
    b.qtype = (enum krn_qtype)3; /* Q4_1 */
    ASSERT_EQ(krn_ref_dequant(&b), PC_ERR_INVAL);
    b = d;
    b.n_rows = 2; /* more rows than the table without a row list */
    ASSERT_EQ(krn_ref_dequant(&b), PC_ERR_INVAL);
    b = d;
    b.dtype = (enum krn_dtype)7;
    ASSERT_EQ(krn_ref_dequant(&b), PC_ERR_INVAL);
    krn_qmatmul_args_t m = {
        .w = w, .qtype = KRN_QT_Q4_K, .x = x, .x_dtype = KRN_F32, .y = y, .M = 1, .N = 2, .K = 256};
    ASSERT_EQ(krn_ref_qmatmul(&m), 0);
    krn_qmatmul_args_t mb = m;
    mb.K = 128;
    ASSERT_EQ(krn_ref_qmatmul(&mb), PC_ERR_INVAL);
    mb = m;
    mb.N = 0;
    ASSERT_EQ(krn_ref_qmatmul(&mb), PC_ERR_INVAL);
    mb = m;
    mb.M = -1;
    ASSERT_EQ(krn_ref_qmatmul(&mb), PC_ERR_INVAL);
}

PC_TEST(qmatmul_reference_sums_the_dequantized_weights_in_double)
{
    kt_rng_t r = {2025};
    enum { M = 5, N = 7, NB = 3 };
    for (int ti = 0; ti < N_TYPES; ti++) {
        int32_t t = k_types[ti], K = NB * krn_qtype_block_elems(t);
        int64_t rb = krn_qtype_row_bytes(t, K);
        uint8_t *w = malloc((size_t)(N * rb));
        float *wf = malloc((size_t)N * K * sizeof(float)), *x = malloc((size_t)M * K * 4);
        uint16_t *xh = malloc((size_t)M * K * 2);
        ASSERT_TRUE(w != NULL && wf != NULL && x != NULL && xh != NULL);
        kt_qblocks(&r, t, (int64_t)N * NB, w, false);
        krn_dequant_args_t d = {
            .w = w, .y = wf, .n_rows = N, .n_wrows = N, .n_in = K, .qtype = t, .dtype = KRN_F32};
        ASSERT_EQ(krn_ref_dequant(&d), 0);
        for (int i = 0; i < M * K; i++) {
            x[i] = kt_unif(&r);
            xh[i] = krn_f32_to_bf16(x[i]);
        }
        for (int dt = 0; dt < 2; dt++) {
            float y[M * N], y0[M * N];
            for (int i = 0; i < M * N; i++)
                y0[i] = y[i] = kt_unif(&r);
            krn_qmatmul_args_t a = {.w = w,
                                    .qtype = t,
                                    .x = dt ? (const void *)xh : x,
                                    .x_dtype = dt ? KRN_BF16 : KRN_F32,
                                    .y = y,
                                    .M = M,
                                    .N = N,
                                    .K = K,
                                    .accumulate = dt == 1};
            ASSERT_EQ(krn_ref_qmatmul(&a), 0);
            for (int m = 0; m < M; m++) {
                for (int n = 0; n < N; n++) {
                    double s = 0;
                    for (int k = 0; k < K; k++)
                        s += (double)wf[(size_t)n * K + k] *
                             (dt ? krn_bf16_to_f32(xh[m * K + k]) : x[m * K + k]);
                    float want = dt ? y0[m * N + n] + (float)s : (float)s;
                    ASSERT_EQ(memcmp(&y[m * N + n], &want, sizeof want), 0);
                }
            }
        }
        free(w);
        free(wf);
        free(x);
        free(xh);
    }
}

PC_TEST(gemm_path_chunks_fit_the_scratch)
{
    ASSERT_EQ(krn_qmatmul_chunk_rows(100, 256, 2, 512 * 10), 10);
    ASSERT_EQ(krn_qmatmul_chunk_rows(100, 256, 2, 512 * 10 + 511), 10);
    ASSERT_EQ(krn_qmatmul_chunk_rows(100, 256, 2, (size_t)1 << 30), 100); /* at most N */
    ASSERT_EQ(krn_qmatmul_chunk_rows(100, 256, 2, 511), 0);               /* not one row */
    ASSERT_EQ(krn_qmatmul_chunk_rows(0, 256, 2, 1 << 20), 0);
    ASSERT_EQ(krn_qmatmul_chunk_rows(100, 256, 0, 1 << 20), 0);
    /* 152064 rows of 8192 halves: a count that would overflow int32 is capped at N. */
    ASSERT_EQ(krn_qmatmul_chunk_rows(152064, 8192, 2, (size_t)1 << 40), 152064);
}

/* krn_gemm's ldy: a GEMM over a range of W's rows writes its columns of a wider y, and no
 * other column (the GEMM path's chunks). */
PC_TEST(gemm_reference_writes_only_its_columns_with_ldy)
{
    kt_rng_t r = {9};
    enum { M = 3, N = 4, K = 16, LD = 10 };
    uint16_t x[M * K], w[N * K];
    for (int i = 0; i < M * K; i++)
        x[i] = krn_f32_to_f16(kt_unif(&r));
    for (int i = 0; i < N * K; i++)
        w[i] = krn_f32_to_f16(kt_unif(&r));
    float y[M * LD], dense[M * N];
    for (int i = 0; i < M * LD; i++)
        y[i] = 1000.0f + (float)i;
    krn_gemm_args_t g = {.x = x, .w = w, .y = dense, .M = M, .N = N, .K = K, .dtype = KRN_F16};
    ASSERT_EQ(krn_ref_gemm(&g), 0);
    g.y = y + 5;
    g.ldy = LD;
    ASSERT_EQ(krn_ref_gemm(&g), 0);
    for (int m = 0; m < M; m++)
        for (int j = 0; j < LD; j++) {
            float want = j >= 5 && j < 5 + N ? dense[m * N + j - 5] : 1000.0f + (float)(m * LD + j);
            ASSERT_EQ(memcmp(&y[m * LD + j], &want, sizeof want), 0);
        }
    g.ldy = N - 1;
    ASSERT_EQ(krn_ref_gemm(&g), PC_ERR_INVAL);
}

PC_TEST_MAIN()
