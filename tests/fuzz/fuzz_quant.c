/*
 * fuzz_quant.c — libFuzzer target for quantized tensors (engine/quant.c over engine/gguf.c).
 *
 * An input that opens as a GGUF file (from an exact-size copy, so ASan flags any read past its
 * end) has every tensor of a computed quantized type dequantized whole and each of its rows
 * multiplied with a quantized activation row: sizes come from the header, scale and quant bytes
 * are whatever the input holds. Any other input is raw blocks: its first byte picks the type,
 * the rest is as many whole blocks as fit. Either way the dequantized values are quantized
 * again, which must succeed or refuse (PC_ERR_RANGE) a value no scale of the type can hold, and
 * nothing may read outside the blocks. Tensors are capped at 2^18 elements to bound the time.
 */
#include "common.h"
#include "gguf.h"
#include "quant.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ELEMS (1u << 18)

static volatile float sink;

static const uint32_t types[] = {ENG_GGML_TYPE_Q4_0, ENG_GGML_TYPE_Q8_0, ENG_GGML_TYPE_Q4_K,
                                 ENG_GGML_TYPE_Q5_K, ENG_GGML_TYPE_Q6_K, ENG_GGML_TYPE_Q5_0,
                                 ENG_GGML_TYPE_Q5_1};

/* rows x K elements of type t at data (exactly eng_quant_row_bytes(t, rows * K) bytes). */
static void exercise(uint32_t t, const void *data, size_t rows, size_t K)
{
    size_t n = rows * K;
    float *y = malloc(n * sizeof *y), *x = malloc(K * sizeof *x);
    uint32_t at = eng_quant_dot_type(t);
    void *a = malloc(eng_quant_row_bytes(at, K));
    void *q = malloc(eng_quant_row_bytes(t, n));
    if (y == NULL || x == NULL || a == NULL || q == NULL)
        abort();
    eng_quant_row_to_f32(t, data, y, n);
    for (size_t k = 0; k < K; k++)
        x[k] = (float)((int)(k % 17) - 8) * 0.125f;
    if (at == ENG_GGML_TYPE_Q8_K)
        eng_quant_act_q8_k(x, a, K);
    else
        eng_quant_act_q8_0(x, a, K);
    size_t rb = eng_quant_row_bytes(t, K);
    for (size_t r = 0; r < rows; r++)
        sink += eng_quant_vec_dot(t, (const uint8_t *)data + r * rb, a, K);
    int rc = eng_quantize_row(t, y, q, n);
    if (rc != 0 && rc != PC_ERR_RANGE)
        abort();
    bool finite = true;
    for (size_t i = 0; i < n; i++)
        finite = finite && isfinite(y[i]);
    if (!finite && rc == 0)
        abort(); /* a non-finite value must be refused */
    free(y);
    free(x);
    free(a);
    free(q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size > 0 ? size : 1);
    if (copy == NULL)
        return 0;
    memcpy(copy, data, size);
    eng_gguf_t *g;
    if (eng_gguf_open_mem(copy, size, &g, NULL, 0) == 0) {
        for (uint64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
            const eng_gguf_tensor_t *t = eng_gguf_tensor_at(g, i);
            if (!eng_quant_type_is_quant(t->type) || t->n_elements > (int64_t)MAX_ELEMS)
                continue;
            size_t K = (size_t)t->ne[0], rows = (size_t)t->n_elements / K;
            if (t->n_bytes != eng_quant_row_bytes(t->type, (uint64_t)t->n_elements))
                abort(); /* the reader's size and the type table disagree */
            exercise(t->type, t->data, rows, K);
        }
        eng_gguf_free(g);
    } else if (size >= 1) {
        uint32_t t = types[data[0] % (sizeof types / sizeof types[0])];
        size_t bb = eng_ggml_type_block_bytes(t), bs = eng_ggml_type_block_size(t);
        size_t nb = (size - 1) / bb;
        if (nb > 0 && nb * bs <= MAX_ELEMS) {
            /* The blocks in an exact-size buffer of their own. */
            uint8_t *blocks = malloc(nb * bb);
            if (blocks == NULL)
                abort();
            memcpy(blocks, data + 1, nb * bb);
            exercise(t, blocks, 1, nb * bs);
            free(blocks);
        }
    }
    free(copy);
    return 0;
}
