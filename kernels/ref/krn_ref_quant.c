/*
 * krn_ref_quant.c — the quantized weight types' sizes, the argument checks krn_quant.cu shares,
 * and the CPU references of krn_dequant and krn_qmatmul (kernels.h, "Quantized weights").
 *
 * krn_ref_dequant decodes with krn_q_group8 (krn_quant_hostdev.h), the kernel's own decoder,
 * so the two agree bit for bit; the unit tests hold that decoder to ggml's reference values
 * (../shared/testdata/quant-vectors.gguf) and to the engine's dequantization. krn_ref_qmatmul
 * sums each dot product in double over the same dequantized weights and the same activation
 * elements, so a kernel's F32 accumulation differs from it by its summation order alone.
 */
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "krn_quant_hostdev.h"
#include "pc_alloc.h"
#include "pc_err.h"

int32_t krn_qtype_block_elems(int32_t t)
{
    return krn_q_block_elems(t);
}

int32_t krn_qtype_block_bytes(int32_t t)
{
    return krn_q_block_bytes(t);
}

int64_t krn_qtype_row_bytes(int32_t t, int64_t n_in)
{
    int32_t be = krn_q_block_elems(t);
    if (be == 0 || n_in <= 0 || n_in % be != 0)
        return 0;
    return n_in / be * krn_q_block_bytes(t);
}

const char *krn_qtype_name(int32_t t)
{
    switch (t) {
    case KRN_QT_Q4_0:
        return "Q4_0";
    case KRN_QT_Q5_0:
        return "Q5_0";
    case KRN_QT_Q5_1:
        return "Q5_1";
    case KRN_QT_Q8_0:
        return "Q8_0";
    case KRN_QT_Q4_K:
        return "Q4_K";
    case KRN_QT_Q5_K:
        return "Q5_K";
    case KRN_QT_Q6_K:
        return "Q6_K";
    default:
        return "?";
    }
}

int32_t krn_qmatmul_chunk_rows(int32_t N, int32_t K, size_t elem_bytes, size_t scratch_bytes)
{
    if (N <= 0 || K <= 0 || elem_bytes == 0)
        return 0;
    size_t row = (size_t)K * elem_bytes, rows = scratch_bytes / row;
    return rows >= (size_t)N ? N : (int32_t)rows;
}

static float load_x(const void *x, int64_t i, enum krn_dtype t)
{
    switch (t) {
    case KRN_F16:
        return krn_f16_to_f32(((const uint16_t *)x)[i]);
    case KRN_BF16:
        return krn_bf16_to_f32(((const uint16_t *)x)[i]);
    default:
        return ((const float *)x)[i];
    }
}

static void store_y(void *y, int64_t i, float v, enum krn_dtype t)
{
    switch (t) {
    case KRN_F16:
        ((uint16_t *)y)[i] = krn_f32_to_f16(v);
        break;
    case KRN_BF16:
        ((uint16_t *)y)[i] = krn_f32_to_bf16(v);
        break;
    default:
        ((float *)y)[i] = v;
        break;
    }
}

static bool dtype_ok(enum krn_dtype t)
{
    return t == KRN_F32 || t == KRN_F16 || t == KRN_BF16;
}

int krn__dequant_check(const krn_dequant_args_t *a)
{
    if (krn_qtype_row_bytes(a->qtype, a->n_in) == 0 || a->n_rows < 0 || a->n_wrows < 0 ||
        !dtype_ok(a->dtype) || (a->rows == NULL && a->n_rows > a->n_wrows) ||
        (a->n_rows > 0 && (a->w == NULL || a->y == NULL)))
        return PC_ERR_INVAL;
    return 0;
}

int krn__qmatmul_check(const krn_qmatmul_args_t *a)
{
    if (krn_qtype_row_bytes(a->qtype, a->K) == 0 || a->M < 0 || a->N <= 0 ||
        !dtype_ok(a->x_dtype) || (a->M > 0 && (a->w == NULL || a->x == NULL || a->y == NULL)))
        return PC_ERR_INVAL;
    return 0;
}

int krn_ref_dequant(const krn_dequant_args_t *a)
{
    if (krn__dequant_check(a) != 0)
        return PC_ERR_INVAL;
    int64_t rb = krn_qtype_row_bytes(a->qtype, a->n_in), n_groups = a->n_in / 8;
    for (int32_t r = 0; r < a->n_rows; r++) {
        int64_t src = a->rows != NULL ? a->rows[r] : r, base = (int64_t)r * a->n_in;
        if (src < 0 || src >= a->n_wrows) {
            for (int32_t i = 0; i < a->n_in; i++)
                store_y(a->y, base + i, NAN, a->dtype);
            continue;
        }
        const uint8_t *row = (const uint8_t *)a->w + src * rb;
        for (int64_t g = 0; g < n_groups; g++) {
            float v[8];
            krn_q_group8(a->qtype, row, g, v);
            for (int i = 0; i < 8; i++)
                store_y(a->y, base + g * 8 + i, v[i], a->dtype);
        }
    }
    return 0;
}

int krn_ref_qmatmul(const krn_qmatmul_args_t *a)
{
    if (krn__qmatmul_check(a) != 0)
        return PC_ERR_INVAL;
    if (a->M == 0)
        return 0;
    float *wrow = pc_malloc((size_t)a->K * sizeof(float));
    if (wrow == NULL)
        return PC_ERR_NOMEM;
    int64_t rb = krn_qtype_row_bytes(a->qtype, a->K);
    for (int32_t n = 0; n < a->N; n++) {
        krn_dequant_args_t d = {.w = (const uint8_t *)a->w + (int64_t)n * rb,
                                .y = wrow,
                                .n_rows = 1,
                                .n_wrows = 1,
                                .n_in = a->K,
                                .qtype = a->qtype,
                                .dtype = KRN_F32};
        krn_ref_dequant(&d);
        for (int32_t m = 0; m < a->M; m++) {
            double acc = 0;
            for (int32_t k = 0; k < a->K; k++)
                acc += (double)wrow[k] * (double)load_x(a->x, (int64_t)m * a->K + k, a->x_dtype);
            float *y = &a->y[(int64_t)m * a->N + n];
            *y = a->accumulate ? *y + (float)acc : (float)acc;
        }
    }
    pc_free(wrow);
    return 0;
}
