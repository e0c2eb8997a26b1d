/*
 * fuzz_gguf.c — libFuzzer target for the GGUF reader (engine/gguf.c) and hparams.
 *
 * Every input is opened from an exact-size copy (so ASan flags any read past the end). On
 * success, every metadata value is visited through each typed accessor, arrays element by
 * element down to their deepest nesting, every tensor's data is touched at both ends and must
 * lie inside the input, and the hyper-parameter and tensor checks run. On failure the reader
 * must have written a "gguf: ..." message.
 */
#include "common.h"
#include "gguf.h"
#include "hparams.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile uint64_t sink;

static void visit(const eng_gguf_val_t *v, int depth)
{
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    int64_t i64;
    float f;
    double d;
    bool b;
    pc_slice_t s;
    if (eng_gguf_val_u32(v, &u32) == 0)
        sink += u32;
    if (eng_gguf_val_i32(v, &i32) == 0)
        sink += (uint64_t)i32;
    if (eng_gguf_val_u64(v, &u64) == 0)
        sink += u64;
    if (eng_gguf_val_i64(v, &i64) == 0)
        sink += (uint64_t)i64;
    if (eng_gguf_val_f32(v, &f) == 0)
        sink += (uint64_t)(f == f);
    if (eng_gguf_val_f64(v, &d) == 0)
        sink += (uint64_t)(d == d);
    if (eng_gguf_val_bool(v, &b) == 0)
        sink += b;
    if (eng_gguf_val_str(v, &s) == 0 && s.len > 0)
        sink += (uint8_t)s.base[0] + (uint8_t)s.base[s.len - 1];
    if (v->type != ENG_GGUF_ARRAY)
        return;
    if (depth > ENG_GGUF_MAX_DEPTH)
        abort();
    for (uint64_t i = 0; i < v->n; i++) {
        eng_gguf_val_t e;
        if (eng_gguf_val_at(v, i, &e) != 0)
            abort();
        visit(&e, depth + 1);
    }
    if (v->n > 0 && v->n <= 4096) {
        int32_t *ibuf = malloc((size_t)v->n * sizeof *ibuf);
        float *fbuf = malloc((size_t)v->n * sizeof *fbuf);
        if (ibuf != NULL && eng_gguf_arr_copy_i32(v, ibuf) == 0)
            sink += (uint64_t)ibuf[v->n - 1];
        if (fbuf != NULL && eng_gguf_arr_copy_f32(v, fbuf) == 0)
            sink += (uint64_t)(fbuf[0] == fbuf[0]);
        free(ibuf);
        free(fbuf);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size > 0 ? size : 1);
    if (copy == NULL)
        return 0;
    if (size > 0)
        memcpy(copy, data, size);
    eng_gguf_t *g = NULL;
    char err[512] = "";
    int rc = eng_gguf_open_mem(copy, size, &g, err, sizeof err);
    if (rc != 0) {
        if (rc == PC_ERR_FORMAT && strncmp(err, "gguf: ", 6) != 0)
            abort(); /* every format error explains itself */
        free(copy);
        return 0;
    }
    for (uint64_t i = 0; i < eng_gguf_n_kv(g); i++) {
        const char *key = eng_gguf_kv_key(g, i);
        if (eng_gguf_get(g, key) != eng_gguf_kv_val(g, i))
            abort(); /* keys are unique and the index finds each */
        visit(eng_gguf_kv_val(g, i), 0);
    }
    for (uint64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor_t *t = eng_gguf_tensor_at(g, i);
        const uint8_t *p = t->data;
        if (eng_gguf_tensor_find(g, t->name) != t || p < copy || t->n_bytes == 0 ||
            t->n_bytes > size || (uint64_t)(p - copy) > size - t->n_bytes)
            abort();
        sink += p[0] + p[t->n_bytes - 1];
    }
    eng_hparams_t hp;
    if (eng_hparams_from_gguf(g, &hp, err, sizeof err) == 0)
        sink += (uint64_t)eng_hparams_check_tensors(g, &hp, err, sizeof err);
    eng_gguf_free(g);
    free(copy);
    return 0;
}
