/*
 * test_gguf.c — the GGUF reader and writer: round trips of every metadata type (nested arrays
 * included) and tensor type, alignment, truncation at every byte, hostile headers with their
 * exact messages, typed getters, writer misuse, and hyper-parameters of each architecture.
 */
#include "pc_test.h"
#include "pc_testutil.h"

#include "common.h"
#include "gguf.h"
#include "hparams.h"
#include "mkmodel.h"
#include "vocab.h"

#include <dirent.h>
#include <math.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers -------------------------------------------------------------------------------- */

/* A byte builder for hand-made (hostile) files. */
typedef struct bb {
    uint8_t b[4096];
    size_t n;
} bb_t;

static void bb_raw(bb_t *b, const void *p, size_t n)
{
    memcpy(b->b + b->n, p, n);
    b->n += n;
}
static void bb_u32(bb_t *b, uint32_t v)
{
    bb_raw(b, &v, 4);
}
static void bb_u64(bb_t *b, uint64_t v)
{
    bb_raw(b, &v, 8);
}
static void bb_str(bb_t *b, const char *s)
{
    bb_u64(b, strlen(s));
    bb_raw(b, s, strlen(s));
}
static void bb_header(bb_t *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    b->n = 0;
    bb_raw(b, "GGUF", 4);
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}
static void bb_pad(bb_t *b, size_t a)
{
    while (b->n % a != 0)
        b->b[b->n++] = 0;
}

/* Opens the bytes from an exact-size heap copy (so ASan sees any overread) and expects
 * PC_ERR_FORMAT with `want` inside the message. */
static void expect_bad(const bb_t *b, const char *want)
{
    uint8_t *copy = malloc(b->n > 0 ? b->n : 1);
    memcpy(copy, b->b, b->n);
    eng_gguf_t *g = NULL;
    char err[512];
    int rc = eng_gguf_open_mem(copy, b->n, &g, err, sizeof err);
    free(copy);
    bool none = g == NULL;
    eng_gguf_free(g);
    if (rc != PC_ERR_FORMAT || strstr(err, want) == NULL)
        fprintf(stderr, "  got rc %d: %s\n  want: %s\n", rc, err, want);
    ASSERT_EQ(rc, PC_ERR_FORMAT);
    ASSERT_TRUE(none);
    ASSERT_TRUE(strstr(err, want) != NULL);
}

/* ---- round trip ------------------------------------------------------------------------------ */

/* Writes a file with every metadata type and four tensor types. */
static int write_everything(const char *path, uint32_t alignment)
{
    eng_gguf_writer_t *w = NULL;
    int rc = eng_gguf_writer_init(alignment, &w);
    if (rc != 0)
        return rc;
    rc |= eng_gguf_writer_set_u8(w, "t.u8", 200);
    rc |= eng_gguf_writer_set_i8(w, "t.i8", -100);
    rc |= eng_gguf_writer_set_u16(w, "t.u16", 60000);
    rc |= eng_gguf_writer_set_i16(w, "t.i16", -30000);
    rc |= eng_gguf_writer_set_u32(w, "t.u32", 4000000000u);
    rc |= eng_gguf_writer_set_i32(w, "t.i32", -2000000000);
    rc |= eng_gguf_writer_set_u64(w, "t.u64", UINT64_MAX);
    rc |= eng_gguf_writer_set_i64(w, "t.i64", INT64_MIN);
    rc |= eng_gguf_writer_set_f32(w, "t.f32", 1.5f);
    rc |= eng_gguf_writer_set_f64(w, "t.f64", -2.25);
    rc |= eng_gguf_writer_set_bool(w, "t.bool", true);
    rc |= eng_gguf_writer_set_str(w, "t.str", "héllo");
    rc |= eng_gguf_writer_set_strn(w, "t.str_nul", "a\0b", 3);
    const int32_t ints[] = {1, -2, 3};
    rc |= eng_gguf_writer_set_arr(w, "t.arr_i32", ENG_GGUF_I32, ints, 3);
    const float fl[] = {0.5f, -1.0f};
    rc |= eng_gguf_writer_set_arr(w, "t.arr_f32", ENG_GGUF_F32, fl, 2);
    const uint8_t bools[] = {1, 0, 1};
    rc |= eng_gguf_writer_set_arr(w, "t.arr_bool", ENG_GGUF_BOOL, bools, 3);
    const uint16_t u16s[] = {7, 65535};
    rc |= eng_gguf_writer_set_arr(w, "t.arr_u16", ENG_GGUF_U16, u16s, 2);
    const double f64s[] = {1e100, -3.0};
    rc |= eng_gguf_writer_set_arr(w, "t.arr_f64", ENG_GGUF_F64, f64s, 2);
    const char *strs[] = {"", "x", "longer string"};
    rc |= eng_gguf_writer_set_arr_str(w, "t.arr_str", strs, 3);
    rc |= eng_gguf_writer_set_arr(w, "t.arr_empty", ENG_GGUF_U8, NULL, 0);
    /* [[1, 2], [], [3]] of u32 */
    rc |= eng_gguf_writer_arr_begin(w, "t.nested", ENG_GGUF_ARRAY, 3);
    uint32_t one = 1, two = 2, three = 3;
    rc |= eng_gguf_writer_arr_begin(w, NULL, ENG_GGUF_U32, 2);
    rc |= eng_gguf_writer_push_scalar(w, &one);
    rc |= eng_gguf_writer_push_scalar(w, &two);
    rc |= eng_gguf_writer_arr_begin(w, NULL, ENG_GGUF_U32, 0);
    rc |= eng_gguf_writer_arr_begin(w, NULL, ENG_GGUF_U32, 1);
    rc |= eng_gguf_writer_push_scalar(w, &three);
    /* [[["a", "bc"]]] : three levels, strings at the bottom */
    rc |= eng_gguf_writer_arr_begin(w, "t.deep", ENG_GGUF_ARRAY, 1);
    rc |= eng_gguf_writer_arr_begin(w, NULL, ENG_GGUF_ARRAY, 1);
    rc |= eng_gguf_writer_arr_begin(w, NULL, ENG_GGUF_STRING, 2);
    rc |= eng_gguf_writer_push_str(w, "a", 1);
    rc |= eng_gguf_writer_push_str(w, "bc", 2);
    rc |= eng_gguf_writer_set_u32(w, "t.after_nested", 42);
    /* Tensors: F32 [3, 2], F16 [5], BF16 [2, 2, 2], Q8_0 [64, 3]. */
    int64_t ne_a[] = {3, 2}, ne_b[] = {5}, ne_c[] = {2, 2, 2}, ne_d[] = {64, 3};
    rc |= eng_gguf_writer_tensor_add(w, "a.f32", ENG_GGML_TYPE_F32, 2, ne_a);
    rc |= eng_gguf_writer_tensor_add(w, "b.f16", ENG_GGML_TYPE_F16, 1, ne_b);
    rc |= eng_gguf_writer_tensor_add(w, "c.bf16", ENG_GGML_TYPE_BF16, 3, ne_c);
    rc |= eng_gguf_writer_tensor_add(w, "d.q8_0", ENG_GGML_TYPE_Q8_0, 2, ne_d);
    char err[256];
    if (rc == 0)
        rc = eng_gguf_writer_file_begin(w, path, err, sizeof err);
    /* Data: byte i of tensor k is (k * 50 + i) & 0xff, written in odd-sized chunks. */
    uint8_t data[4 * 34 * 3];
    for (uint64_t k = 0; rc == 0 && k < 4; k++) {
        uint64_t n = eng_gguf_writer_tensor_bytes(w, k);
        for (uint64_t i = 0; i < n; i++)
            data[i] = (uint8_t)(k * 50 + i);
        for (uint64_t at = 0; rc == 0 && at < n; at += 7)
            rc = eng_gguf_writer_tensor_write(w, data + at, (size_t)PC_MIN(7, n - at), err,
                                              sizeof err);
    }
    if (rc == 0)
        rc = eng_gguf_writer_file_finish(w, err, sizeof err);
    eng_gguf_writer_free(w);
    return rc;
}

static void check_everything(const eng_gguf_t *g, uint32_t alignment)
{
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    float f32;
    bool b;
    pc_slice_t s;
    ASSERT_EQ(eng_gguf_version(g), 3);
    ASSERT_EQ(eng_gguf_alignment(g), alignment);
    ASSERT_EQ(eng_gguf_data_offset(g) % alignment, 0);
    ASSERT_EQ(eng_gguf_get_u32(g, "t.u8", &u32, NULL, 0), 0);
    ASSERT_EQ(u32, 200);
    ASSERT_EQ(eng_gguf_get_i32(g, "t.i8", &i32, NULL, 0), 0);
    ASSERT_EQ(i32, -100);
    ASSERT_EQ(eng_gguf_get_u32(g, "t.u16", &u32, NULL, 0), 0);
    ASSERT_EQ(u32, 60000);
    ASSERT_EQ(eng_gguf_get_i32(g, "t.i16", &i32, NULL, 0), 0);
    ASSERT_EQ(i32, -30000);
    ASSERT_EQ(eng_gguf_get_u32(g, "t.u32", &u32, NULL, 0), 0);
    ASSERT_EQ_U64(u32, 4000000000u);
    ASSERT_EQ(eng_gguf_get_i32(g, "t.i32", &i32, NULL, 0), 0);
    ASSERT_EQ(i32, -2000000000);
    ASSERT_EQ(eng_gguf_get_u64(g, "t.u64", &u64, NULL, 0), 0);
    ASSERT_EQ_U64(u64, UINT64_MAX);
    int64_t i64;
    ASSERT_EQ(eng_gguf_val_i64(eng_gguf_get(g, "t.i64"), &i64), 0);
    ASSERT_TRUE(i64 == INT64_MIN);
    ASSERT_EQ(eng_gguf_get_f32(g, "t.f32", &f32, NULL, 0), 0);
    ASSERT_NEAR(f32, 1.5, 0);
    ASSERT_EQ(eng_gguf_get_f32(g, "t.f64", &f32, NULL, 0), 0);
    ASSERT_NEAR(f32, -2.25, 0);
    ASSERT_EQ(eng_gguf_get_bool(g, "t.bool", &b, NULL, 0), 0);
    ASSERT_TRUE(b);
    ASSERT_EQ(eng_gguf_get_str(g, "t.str", &s, NULL, 0), 0);
    ASSERT_TRUE(pc_slice_eq_cstr(s, "héllo"));
    ASSERT_EQ(eng_gguf_get_str(g, "t.str_nul", &s, NULL, 0), 0);
    ASSERT_EQ(s.len, 3);
    ASSERT_MEM_EQ(s.base, "a\0b", 3);

    const eng_gguf_val_t *a;
    eng_gguf_val_t e;
    ASSERT_EQ(eng_gguf_get_arr(g, "t.arr_i32", ENG_GGUF_I32, &a, NULL, 0), 0);
    int32_t ints[3];
    ASSERT_EQ(eng_gguf_arr_copy_i32(a, ints), 0);
    ASSERT_EQ(ints[0], 1);
    ASSERT_EQ(ints[1], -2);
    ASSERT_EQ(ints[2], 3);
    ASSERT_EQ(eng_gguf_get_arr(g, "t.arr_f32", ENG_GGUF_F32, &a, NULL, 0), 0);
    float fl[2];
    ASSERT_EQ(eng_gguf_arr_copy_f32(a, fl), 0);
    ASSERT_NEAR(fl[1], -1.0, 0);
    ASSERT_EQ(eng_gguf_get_arr(g, "t.arr_bool", ENG_GGUF_BOOL, &a, NULL, 0), 0);
    ASSERT_EQ(eng_gguf_val_at(a, 2, &e), 0);
    ASSERT_EQ(eng_gguf_val_bool(&e, &b), 0);
    ASSERT_TRUE(b);
    ASSERT_EQ(eng_gguf_val_at(a, 3, &e), PC_ERR_RANGE);
    ASSERT_EQ(eng_gguf_get_arr(g, "t.arr_u16", ENG_GGUF_U16, &a, NULL, 0), 0);
    ASSERT_EQ(eng_gguf_arr_copy_i32(a, ints), 0);
    ASSERT_EQ(ints[1], 65535);
    ASSERT_EQ(eng_gguf_get_arr(g, "t.arr_f64", ENG_GGUF_F64, &a, NULL, 0), 0);
    double d;
    ASSERT_EQ(eng_gguf_val_at(a, 0, &e), 0);
    ASSERT_EQ(eng_gguf_val_f64(&e, &d), 0);
    ASSERT_NEAR(d, 1e100, 0);
    ASSERT_EQ(eng_gguf_get_arr(g, "t.arr_str", ENG_GGUF_STRING, &a, NULL, 0), 0);
    ASSERT_EQ(a->n, 3);
    ASSERT_EQ(eng_gguf_val_at(a, 0, &e), 0);
    ASSERT_EQ(eng_gguf_val_str(&e, &s), 0);
    ASSERT_EQ(s.len, 0);
    ASSERT_EQ(eng_gguf_val_at(a, 2, &e), 0);
    ASSERT_EQ(eng_gguf_val_str(&e, &s), 0);
    ASSERT_TRUE(pc_slice_eq_cstr(s, "longer string"));
    ASSERT_EQ(eng_gguf_get_arr(g, "t.arr_empty", ENG_GGUF_U8, &a, NULL, 0), 0);
    ASSERT_EQ(a->n, 0);

    /* Nested [[1, 2], [], [3]]. */
    ASSERT_EQ(eng_gguf_get_arr(g, "t.nested", ENG_GGUF_ARRAY, &a, NULL, 0), 0);
    ASSERT_EQ(a->n, 3);
    eng_gguf_val_t inner, x;
    ASSERT_EQ(eng_gguf_val_at(a, 0, &inner), 0);
    ASSERT_EQ(inner.type, ENG_GGUF_ARRAY);
    ASSERT_EQ(inner.elem_type, ENG_GGUF_U32);
    ASSERT_EQ(inner.n, 2);
    ASSERT_EQ(eng_gguf_val_at(&inner, 1, &x), 0);
    ASSERT_EQ(eng_gguf_val_u32(&x, &u32), 0);
    ASSERT_EQ(u32, 2);
    ASSERT_EQ(eng_gguf_val_at(a, 1, &inner), 0);
    ASSERT_EQ(inner.n, 0);
    ASSERT_EQ(eng_gguf_val_at(a, 2, &inner), 0);
    ASSERT_EQ(eng_gguf_val_at(&inner, 0, &x), 0);
    ASSERT_EQ(eng_gguf_val_u32(&x, &u32), 0);
    ASSERT_EQ(u32, 3);
    /* Deep [[["a", "bc"]]]. */
    ASSERT_EQ(eng_gguf_get_arr(g, "t.deep", ENG_GGUF_ARRAY, &a, NULL, 0), 0);
    eng_gguf_val_t l1, l2;
    ASSERT_EQ(eng_gguf_val_at(a, 0, &l1), 0);
    ASSERT_EQ(eng_gguf_val_at(&l1, 0, &l2), 0);
    ASSERT_EQ(l2.elem_type, ENG_GGUF_STRING);
    ASSERT_EQ(eng_gguf_val_at(&l2, 1, &x), 0);
    ASSERT_EQ(eng_gguf_val_str(&x, &s), 0);
    ASSERT_TRUE(pc_slice_eq_cstr(s, "bc"));
    ASSERT_EQ(eng_gguf_get_u32(g, "t.after_nested", &u32, NULL, 0), 0);
    ASSERT_EQ(u32, 42);

    /* Keys in order; general.alignment first when not the default. */
    uint64_t first = alignment != 32 ? 1 : 0;
    ASSERT_STR_EQ(eng_gguf_kv_key(g, first), "t.u8");
    ASSERT_EQ(eng_gguf_n_kv(g), first + 23);

    /* Tensors. */
    ASSERT_EQ(eng_gguf_n_tensors(g), 4);
    static const struct {
        const char *name;
        uint32_t type, n_dims;
        int64_t ne[4];
        uint64_t n_bytes;
    } want[] = {
        {"a.f32", ENG_GGML_TYPE_F32, 2, {3, 2, 1, 1}, 24},
        {"b.f16", ENG_GGML_TYPE_F16, 1, {5, 1, 1, 1}, 10},
        {"c.bf16", ENG_GGML_TYPE_BF16, 3, {2, 2, 2, 1}, 16},
        {"d.q8_0", ENG_GGML_TYPE_Q8_0, 2, {64, 3, 1, 1}, 6 * 34},
    };
    for (uint64_t k = 0; k < 4; k++) {
        const eng_gguf_tensor_t *t = eng_gguf_tensor_find(g, want[k].name);
        ASSERT_TRUE(t != NULL);
        ASSERT_TRUE(t == eng_gguf_tensor_at(g, k));
        ASSERT_EQ(t->type, want[k].type);
        ASSERT_EQ(t->n_dims, want[k].n_dims);
        for (int dim = 0; dim < 4; dim++)
            ASSERT_EQ(t->ne[dim], want[k].ne[dim]);
        ASSERT_EQ_U64(t->n_bytes, want[k].n_bytes);
        ASSERT_EQ(t->offset % alignment, 0);
        ASSERT_EQ(((const uint8_t *)t->data - eng_gguf_file_base(g)) % alignment, 0);
        for (uint64_t i = 0; i < t->n_bytes; i++)
            ASSERT_EQ(((const uint8_t *)t->data)[i], (uint8_t)(k * 50 + i));
    }
    ASSERT_TRUE(eng_gguf_tensor_find(g, "missing") == NULL);
    ASSERT_TRUE(eng_gguf_get(g, "missing") == NULL);
}

PC_TEST(roundtrip_every_type)
{
    const uint32_t aligns[] = {32, 8, 64, 4096};
    for (size_t i = 0; i < PC_ARRAY_LEN(aligns); i++) {
        const char *path = pc_test_tmp_path("all.gguf");
        ASSERT_EQ(write_everything(path, aligns[i]), 0);
        eng_gguf_t *g = NULL;
        char err[256] = "";
        int rc = eng_gguf_open(path, &g, err, sizeof err);
        if (rc != 0)
            fprintf(stderr, "  %s\n", err);
        ASSERT_EQ(rc, 0);
        uint32_t al;
        int has = eng_gguf_get_u32(g, "general.alignment", &al, NULL, 0);
        ASSERT_EQ(has, aligns[i] == 32 ? PC_ERR_NOTFOUND : 0);
        check_everything(g, aligns[i]);
        eng_gguf_free(g);
        if (pc_test__state != 0)
            return;
        /* No temporary left behind. */
        ASSERT_TRUE(access(pc_test_tmp_path("all.gguf.tmp"), F_OK) != 0);
    }
}

/* Every prefix of a valid file is rejected cleanly, except those that lose only the padding
 * after the last tensor. Exact-size heap copies let ASan catch any read past the end. */
PC_TEST(truncation_at_every_byte)
{
    const char *path = pc_test_tmp_path("trunc.gguf");
    ASSERT_EQ(write_everything(path, 32), 0);
    size_t len;
    uint8_t *file = pc_test_slurp(path, &len);
    ASSERT_TRUE(file != NULL);
    eng_gguf_t *g = NULL;
    ASSERT_EQ(eng_gguf_open_mem(file, len, &g, NULL, 0), 0);
    const eng_gguf_tensor_t *last = eng_gguf_tensor_at(g, 3);
    size_t min_ok = (size_t)(eng_gguf_data_offset(g) + last->offset + last->n_bytes);
    eng_gguf_free(g);
    for (size_t n = 0; n < len; n++) {
        uint8_t *copy = malloc(n > 0 ? n : 1);
        memcpy(copy, file, n);
        char err[512] = "";
        g = NULL;
        int rc = eng_gguf_open_mem(copy, n, &g, err, sizeof err);
        eng_gguf_free(g);
        free(copy);
        if (n >= min_ok) {
            ASSERT_EQ(rc, 0);
        } else {
            if (rc != PC_ERR_FORMAT)
                fprintf(stderr, "  length %zu: rc %d\n", n, rc);
            ASSERT_EQ(rc, PC_ERR_FORMAT);
            ASSERT_TRUE(strncmp(err, "gguf: offset ", 13) == 0);
        }
    }
    free(file);
}

/* Flipping any single header byte never crashes and either opens or reports a format error. */
PC_TEST(corruption_of_every_header_byte)
{
    const char *path = pc_test_tmp_path("flip.gguf");
    ASSERT_EQ(write_everything(path, 32), 0);
    size_t len;
    uint8_t *file = pc_test_slurp(path, &len);
    ASSERT_TRUE(file != NULL);
    eng_gguf_t *g = NULL;
    ASSERT_EQ(eng_gguf_open_mem(file, len, &g, NULL, 0), 0);
    size_t header = (size_t)eng_gguf_data_offset(g);
    eng_gguf_free(g);
    const uint8_t flips[] = {0x01, 0x80, 0xff};
    for (size_t i = 0; i < header; i++) {
        for (size_t f = 0; f < PC_ARRAY_LEN(flips); f++) {
            uint8_t *copy = malloc(len);
            memcpy(copy, file, len);
            copy[i] ^= flips[f];
            char err[512];
            g = NULL;
            int rc = eng_gguf_open_mem(copy, len, &g, err, sizeof err);
            eng_gguf_free(g);
            free(copy);
            ASSERT_TRUE(rc == 0 || rc == PC_ERR_FORMAT);
        }
    }
    free(file);
}

/* ---- hostile headers ------------------------------------------------------------------------ */

PC_TEST(hostile_headers)
{
    bb_t b;
    bb_header(&b, 3, 0, 0);
    b.n = 2;
    PC_TEST_CALL(expect_bad(&b, "gguf: offset 0: header: magic truncated"));
    bb_header(&b, 3, 0, 0);
    b.b[0] = 'X';
    PC_TEST_CALL(expect_bad(&b, "bad magic"));
    bb_header(&b, 1, 0, 0);
    PC_TEST_CALL(expect_bad(&b, "GGUF version 1 is not supported"));
    bb_header(&b, 0x03000000u, 0, 0);
    PC_TEST_CALL(expect_bad(&b, "big-endian"));
    bb_header(&b, 7, 0, 0);
    PC_TEST_CALL(expect_bad(&b, "unsupported version 7"));
    bb_header(&b, 3, 0, UINT64_MAX);
    PC_TEST_CALL(expect_bad(&b, "gguf: offset 16: n_kv 18446744073709551615 exceeds"));
    bb_header(&b, 3, UINT64_MAX / 2, 0);
    PC_TEST_CALL(expect_bad(&b, "n_tensors 9223372036854775807 exceeds"));

    /* The example: a string length beyond the file. */
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "general.name");
    bb_u32(&b, ENG_GGUF_STRING);
    bb_u64(&b, 999999);
    bb_raw(&b, "abcd", 4);
    PC_TEST_CALL(expect_bad(&b, "gguf: offset 48: metadata key #0 'general.name': string length "
                                "999999 exceeds file size"));
    bb_header(&b, 3, 0, 1);
    bb_u64(&b, UINT64_MAX);
    bb_u64(&b, 0);
    PC_TEST_CALL(expect_bad(&b, "metadata key #0: key length 18446744073709551615 exceeds"));
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, 13);
    bb_u64(&b, 0);
    PC_TEST_CALL(expect_bad(&b, "'k': unknown value type 13"));
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, ENG_GGUF_BOOL);
    b.b[b.n++] = 2;
    PC_TEST_CALL(expect_bad(&b, "bool byte 2 is not 0 or 1"));
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, ENG_GGUF_ARRAY);
    bb_u32(&b, ENG_GGUF_U32);
    bb_u64(&b, UINT64_MAX / 2);
    PC_TEST_CALL(expect_bad(&b, "array of 9223372036854775807 u32 exceeds file size"));
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, ENG_GGUF_ARRAY);
    bb_u32(&b, ENG_GGUF_STRING);
    bb_u64(&b, 1ull << 40);
    PC_TEST_CALL(expect_bad(&b, "array of 1099511627776 strings exceeds file size"));
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, ENG_GGUF_ARRAY);
    bb_u32(&b, 99);
    PC_TEST_CALL(expect_bad(&b, "unknown array element type 99"));
    /* Arrays nested past the limit. */
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, ENG_GGUF_ARRAY);
    for (int i = 0; i < ENG_GGUF_MAX_DEPTH + 1; i++) {
        bb_u32(&b, ENG_GGUF_ARRAY);
        bb_u64(&b, 1);
    }
    PC_TEST_CALL(expect_bad(&b, "arrays nested deeper than 8 levels"));
    /* Duplicate keys. */
    bb_header(&b, 3, 0, 2);
    for (int i = 0; i < 2; i++) {
        bb_str(&b, "dup");
        bb_u32(&b, ENG_GGUF_U8);
        b.b[b.n++] = 1;
    }
    PC_TEST_CALL(expect_bad(&b, "gguf: offset 40: metadata key #1 'dup': duplicate key"));
    /* A key with a control byte is escaped in the message. */
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "a\nb");
    bb_u32(&b, 77);
    bb_u64(&b, 0);
    PC_TEST_CALL(expect_bad(&b, "'a\\x0ab': unknown value type 77"));
    /* general.alignment of the wrong type and not a power of two. */
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "general.alignment");
    bb_u32(&b, ENG_GGUF_U64);
    bb_u64(&b, 32);
    PC_TEST_CALL(expect_bad(&b, "'general.alignment': type u64, expected u32"));
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "general.alignment");
    bb_u32(&b, ENG_GGUF_U32);
    bb_u32(&b, 48);
    PC_TEST_CALL(expect_bad(&b, "alignment 48 is not a power of two"));
}

/* Appends one tensor info. */
static void bb_tensor(bb_t *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                      uint64_t offset)
{
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++)
        bb_u64(b, ne[d]);
    bb_u32(b, type);
    bb_u64(b, offset);
}

PC_TEST(hostile_tensor_infos)
{
    bb_t b;
    uint64_t ne4[] = {4};
    uint64_t ne5[] = {4, 1, 1, 1, 1};
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "t", 5, ne5, 0, 0);
    PC_TEST_CALL(expect_bad(&b, "tensor #0 't': n_dims 5 not in 1..4"));
    uint64_t ne0[] = {0};
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "t", 1, ne0, 0, 0);
    PC_TEST_CALL(expect_bad(&b, "ne[0] = 0 is not positive"));
    uint64_t big[] = {1ull << 32, 1ull << 32};
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "t", 2, big, 0, 0);
    PC_TEST_CALL(expect_bad(&b, "element count overflows int64 at ne[1]"));
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "t", 1, ne4, 77, 0);
    PC_TEST_CALL(expect_bad(&b, "unknown tensor type id 77"));
    uint64_t ne40[] = {40};
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "t", 1, ne40, ENG_GGML_TYPE_Q8_0, 0);
    PC_TEST_CALL(expect_bad(&b, "ne[0] = 40 is not a multiple of the Q8_0 block size 32"));
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "t", 1, ne4, 0, 16);
    PC_TEST_CALL(expect_bad(&b, "data offset 16 is not a multiple of the alignment 32"));
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "0123456789012345678901234567890123456789012345678901234567890123", 1, ne4, 0, 0);
    PC_TEST_CALL(expect_bad(&b, "name length 64 exceeds 63"));
    bb_header(&b, 3, 2, 0);
    bb_tensor(&b, "t", 1, ne4, 0, 0);
    bb_tensor(&b, "t", 1, ne4, 0, 32);
    PC_TEST_CALL(expect_bad(&b, "tensor #1 't': duplicate tensor name"));
    /* Data past the end: 4 floats declared, 8 bytes present. */
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "t", 1, ne4, 0, 0);
    bb_pad(&b, 32);
    bb_u64(&b, 0);
    PC_TEST_CALL(expect_bad(&b, "tensor #0 't': data [0, +16) extends past the end of the file"));
    /* Overlapping tensors. */
    uint64_t ne16[] = {16};
    bb_header(&b, 3, 2, 0);
    bb_tensor(&b, "x", 1, ne16, 0, 0);
    bb_tensor(&b, "y", 1, ne4, 0, 32);
    bb_pad(&b, 32);
    for (int i = 0; i < 16; i++)
        bb_u32(&b, 0);
    PC_TEST_CALL(expect_bad(&b, "tensor #1 'y': data overlaps tensor 'x'"));
    /* The same two, spaced correctly, open (and GGUF v2 is accepted). */
    bb_header(&b, 2, 2, 0);
    bb_tensor(&b, "x", 1, ne16, 0, 0);
    bb_tensor(&b, "y", 1, ne4, 0, 64);
    bb_pad(&b, 32);
    for (int i = 0; i < 20; i++)
        bb_u32(&b, 0);
    eng_gguf_t *g = NULL;
    char err[256];
    int rc = eng_gguf_open_mem(b.b, b.n, &g, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  %s\n", err);
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(eng_gguf_version(g), 2);
    ASSERT_EQ(eng_gguf_n_tensors(g), 2);
    eng_gguf_free(g);
}

PC_TEST(open_errors)
{
    eng_gguf_t *g = NULL;
    char err[256];
    ASSERT_EQ(eng_gguf_open("/nonexistent/x.gguf", &g, err, sizeof err), PC_ERR_IO);
    ASSERT_TRUE(strstr(err, "cannot open '/nonexistent/x.gguf'") != NULL);
    ASSERT_EQ(eng_gguf_open("/tmp", &g, err, sizeof err), PC_ERR_IO);
    ASSERT_TRUE(strstr(err, "not a regular file") != NULL);
    const char *empty = pc_test_tmp_path("empty.gguf");
    FILE *f = fopen(empty, "wb");
    ASSERT_TRUE(f != NULL);
    fclose(f);
    ASSERT_EQ(eng_gguf_open(empty, &g, err, sizeof err), PC_ERR_FORMAT);
    ASSERT_TRUE(strstr(err, "magic truncated") != NULL);
    ASSERT_TRUE(g == NULL);
}

/* ---- getters -------------------------------------------------------------------------------- */

PC_TEST(getter_conversions_and_messages)
{
    eng_gguf_writer_t *w = NULL;
    ASSERT_EQ(eng_gguf_writer_init(0, &w), 0);
    ASSERT_EQ(eng_gguf_writer_set_i64(w, "neg", -5), 0);
    ASSERT_EQ(eng_gguf_writer_set_u64(w, "big", 1ull << 33), 0);
    ASSERT_EQ(eng_gguf_writer_set_i8(w, "small", 7), 0);
    ASSERT_EQ(eng_gguf_writer_set_str(w, "s", "x"), 0);
    const int64_t wide[] = {1, 1ll << 40};
    ASSERT_EQ(eng_gguf_writer_set_arr(w, "wide", ENG_GGUF_I64, wide, 2), 0);
    const char *path = pc_test_tmp_path("get.gguf");
    char err[256];
    ASSERT_EQ(eng_gguf_writer_file_begin(w, path, err, sizeof err), 0);
    ASSERT_EQ(eng_gguf_writer_file_finish(w, err, sizeof err), 0);
    eng_gguf_writer_free(w);
    eng_gguf_t *g = NULL;
    ASSERT_EQ(eng_gguf_open(path, &g, err, sizeof err), 0);
    uint32_t u;
    int32_t i;
    uint64_t u64;
    float f;
    pc_slice_t s;
    ASSERT_EQ(eng_gguf_get_u32(g, "small", &u, NULL, 0), 0);
    ASSERT_EQ(u, 7);
    ASSERT_EQ(eng_gguf_get_i32(g, "neg", &i, NULL, 0), 0);
    ASSERT_EQ(i, -5);
    ASSERT_EQ(eng_gguf_get_u32(g, "neg", &u, err, sizeof err), PC_ERR_FORMAT);
    ASSERT_TRUE(strstr(err, "key 'neg': value out of range for an unsigned 32-bit") != NULL);
    ASSERT_EQ(eng_gguf_get_u32(g, "big", &u, err, sizeof err), PC_ERR_FORMAT);
    ASSERT_EQ(eng_gguf_get_u64(g, "big", &u64, NULL, 0), 0);
    ASSERT_EQ_U64(u64, 1ull << 33);
    ASSERT_EQ(eng_gguf_get_f32(g, "s", &f, err, sizeof err), PC_ERR_FORMAT);
    ASSERT_TRUE(strstr(err, "key 's': type string, expected f32 or f64") != NULL);
    ASSERT_EQ(eng_gguf_get_str(g, "small", &s, err, sizeof err), PC_ERR_FORMAT);
    ASSERT_EQ(eng_gguf_get_u32(g, "nope", &u, err, sizeof err), PC_ERR_NOTFOUND);
    ASSERT_STR_EQ(err, "gguf: key 'nope' missing");
    const eng_gguf_val_t *a;
    ASSERT_EQ(eng_gguf_get_arr(g, "wide", ENG_GGUF_I32, &a, err, sizeof err), PC_ERR_FORMAT);
    ASSERT_TRUE(strstr(err, "array of i64, expected array of i32") != NULL);
    ASSERT_EQ(eng_gguf_get_arr(g, "wide", ENG_GGUF_VTYPE_COUNT, &a, NULL, 0), 0);
    int32_t out[2];
    ASSERT_EQ(eng_gguf_arr_copy_i32(a, out), PC_ERR_RANGE);
    ASSERT_EQ(eng_gguf_arr_copy_f32(a, (float *)out), PC_ERR_FORMAT);
    ASSERT_EQ(eng_gguf_get_arr(g, "s", ENG_GGUF_VTYPE_COUNT, &a, err, sizeof err), PC_ERR_FORMAT);
    eng_gguf_free(g);
}

/* ---- writer misuse ------------------------------------------------------------------------- */

PC_TEST(writer_rejects_misuse_and_keeps_old_file)
{
    eng_gguf_writer_t *w = NULL;
    ASSERT_EQ(eng_gguf_writer_init(24, &w), PC_ERR_INVAL);
    ASSERT_EQ(eng_gguf_writer_init(4, &w), PC_ERR_INVAL);
    ASSERT_EQ(eng_gguf_writer_init(0, &w), 0);
    ASSERT_EQ(eng_gguf_writer_set_u32(w, "a", 1), 0);
    ASSERT_EQ(eng_gguf_writer_set_u32(w, "a", 2), PC_ERR_EXISTS);
    ASSERT_EQ(eng_gguf_writer_set_u32(w, "", 2), PC_ERR_INVAL);
    ASSERT_EQ(eng_gguf_writer_push_str(w, "x", 1), PC_ERR_STATE);
    uint8_t two = 2;
    ASSERT_EQ(eng_gguf_writer_set_arr(w, "bools", ENG_GGUF_BOOL, &two, 1), PC_ERR_INVAL);
    ASSERT_EQ(eng_gguf_writer_set_arr(w, "strs", ENG_GGUF_STRING, &two, 1), PC_ERR_INVAL);
    ASSERT_EQ(eng_gguf_writer_arr_begin(w, "arr", ENG_GGUF_U16, 2), 0);
    ASSERT_EQ(eng_gguf_writer_set_u32(w, "b", 1), PC_ERR_STATE);
    ASSERT_EQ(eng_gguf_writer_push_str(w, "x", 1), PC_ERR_STATE);
    ASSERT_EQ(eng_gguf_writer_arr_begin(w, NULL, ENG_GGUF_U8, 1), PC_ERR_STATE);
    char err[256];
    ASSERT_EQ(eng_gguf_writer_file_begin(w, pc_test_tmp_path("never.gguf"), err, sizeof err),
              PC_ERR_STATE);
    uint16_t v = 9;
    ASSERT_EQ(eng_gguf_writer_push_scalar(w, &v), 0);
    ASSERT_EQ(eng_gguf_writer_push_scalar(w, &v), 0);
    ASSERT_EQ(eng_gguf_writer_push_scalar(w, &v), PC_ERR_STATE); /* closed after 2 */
    int64_t ne[] = {40};
    ASSERT_EQ(eng_gguf_writer_tensor_add(w, "q", ENG_GGML_TYPE_Q8_0, 1, ne), PC_ERR_INVAL);
    ASSERT_EQ(eng_gguf_writer_tensor_add(w, "q", 999, 1, ne), PC_ERR_INVAL);
    int64_t ne5[] = {1, 1, 1, 1, 1};
    ASSERT_EQ(eng_gguf_writer_tensor_add(w, "q", ENG_GGML_TYPE_F32, 5, ne5), PC_ERR_INVAL);
    ASSERT_EQ(eng_gguf_writer_tensor_add(w, "t", ENG_GGML_TYPE_F32, 1, ne), 0);
    ASSERT_EQ(eng_gguf_writer_tensor_add(w, "t", ENG_GGML_TYPE_F32, 1, ne), PC_ERR_EXISTS);

    /* An existing file survives a write that is abandoned or incomplete. */
    const char *path = pc_test_tmp_path("keep.gguf");
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f != NULL);
    fputs("old", f);
    fclose(f);
    ASSERT_EQ(eng_gguf_writer_file_begin(w, path, err, sizeof err), 0);
    float data[41] = {0};
    ASSERT_EQ(eng_gguf_writer_tensor_write(w, data, sizeof data, err, sizeof err), PC_ERR_RANGE);
    ASSERT_EQ(eng_gguf_writer_tensor_write(w, data, 10 * sizeof(float), err, sizeof err), 0);
    ASSERT_EQ(eng_gguf_writer_file_finish(w, err, sizeof err), PC_ERR_STATE);
    ASSERT_TRUE(strstr(err, "tensor 't' incomplete (40 of 160 bytes)") != NULL);
    eng_gguf_writer_free(w);
    size_t len;
    uint8_t *old = pc_test_slurp(path, &len);
    ASSERT_TRUE(old != NULL);
    ASSERT_EQ(len, 3);
    free(old);
    ASSERT_TRUE(access(pc_test_tmp_path("keep.gguf.tmp"), F_OK) != 0);
    eng_gguf_writer_free(NULL);
}

/* ---- f16 / bf16 ----------------------------------------------------------------------------- */

PC_TEST(half_conversions_round_to_nearest_even)
{
    ASSERT_EQ(eng_f32_to_f16(1.0f), 0x3c00);
    ASSERT_EQ(eng_f32_to_f16(-2.0f), 0xc000);
    ASSERT_EQ(eng_f32_to_f16(65504.0f), 0x7bff);
    ASSERT_EQ(eng_f32_to_f16(65520.0f), 0x7c00);           /* rounds up to infinity */
    ASSERT_EQ(eng_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00); /* tie to even (down) */
    ASSERT_EQ(eng_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02); /* tie to even (up) */
    ASSERT_EQ(eng_f32_to_f16(5.9604645e-8f), 0x0001);      /* smallest subnormal */
    ASSERT_EQ(eng_f32_to_f16(2.9802322e-8f), 0x0000);      /* half of it: tie to even 0 */
    ASSERT_EQ(eng_f32_to_f16(INFINITY), 0x7c00);
    ASSERT_TRUE((eng_f32_to_f16(NAN) & 0x7fff) > 0x7c00);
    ASSERT_EQ(eng_f32_to_bf16(1.0f), 0x3f80);
    ASSERT_EQ(eng_f32_to_bf16(1.00390625f), 0x3f80); /* 1 + 2^-8: tie, to even */
    ASSERT_EQ(eng_f32_to_bf16(1.01171875f), 0x3f82); /* 1 + 3 * 2^-8: tie, to even (up) */
    ASSERT_TRUE((eng_f32_to_bf16(NAN) & 0x7fff) > 0x7f80);
    /* Every half round-trips through f32 exactly. */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0)
            continue; /* NaN payloads */
        ASSERT_EQ(eng_f32_to_f16(eng_f16_to_f32((uint16_t)h)), h);
    }
}

/* ---- hparams -------------------------------------------------------------------------------- */

/* A small synthetic byte-level vocabulary: enough for the generator and the reader. */
static eng_vocab_t *toy_vocab(uint32_t n)
{
    eng_vocab_t *v = pc_xcalloc(1, sizeof *v);
    v->model = pc_xstrdup("gpt2");
    v->pre = pc_xstrdup("llama-bpe");
    v->n_tokens = n;
    v->tokens = pc_xcalloc(n, sizeof *v->tokens);
    v->token_type = pc_xcalloc(n, sizeof *v->token_type);
    for (uint32_t i = 0; i < n; i++) {
        char buf[32];
        snprintf(buf, sizeof buf, "tok%u", i);
        v->tokens[i] = pc_xstrdup(buf);
        v->token_type[i] = ENG_TOKEN_TYPE_NORMAL;
    }
    v->bos_id = 0;
    v->eos_id = 1;
    v->eot_id = v->eom_id = v->pad_id = v->unk_id = -1;
    return v;
}

static void open_model(const eng_mkmodel_params_t *p, const char *name, eng_gguf_t **g,
                       eng_hparams_t *hp)
{
    eng_vocab_t *v = toy_vocab(320);
    char err[512] = "";
    const char *path = pc_test_tmp_path(name);
    int rc = eng_mkmodel_write(p, v, path, err, sizeof err);
    eng_vocab_free(v);
    if (rc != 0)
        fprintf(stderr, "  %s\n", err);
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(eng_gguf_open(path, g, err, sizeof err), 0);
    rc = eng_hparams_from_gguf(*g, hp, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  %s\n", err);
    ASSERT_EQ(rc, 0);
    rc = eng_hparams_check_tensors(*g, hp, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  %s\n", err);
    ASSERT_EQ(rc, 0);
}

PC_TEST(hparams_llama_gqa_untied)
{
    eng_mkmodel_params_t p = eng_mkmodel_params_default();
    p.n_embd = 128;
    p.n_head = 8;
    p.n_head_kv = 2;
    p.n_ff = 320;
    p.n_layer = 3;
    p.n_ctx = 4096;
    p.rope_theta = 500000.0f;
    eng_gguf_t *g = NULL;
    eng_hparams_t hp;
    PC_TEST_CALL(open_model(&p, "llama.gguf", &g, &hp));
    ASSERT_EQ(hp.arch, ENG_ARCH_LLAMA);
    ASSERT_EQ(hp.n_vocab, 320);
    ASSERT_EQ(hp.n_ctx_train, 4096);
    ASSERT_EQ(hp.n_embd, 128);
    ASSERT_EQ(hp.n_layer, 3);
    ASSERT_EQ(hp.n_head, 8);
    ASSERT_EQ(hp.n_head_kv, 2);
    ASSERT_EQ(hp.head_dim, 16);
    ASSERT_EQ(hp.rope_dim, 16);
    ASSERT_EQ(hp.n_ff, 320);
    ASSERT_NEAR(hp.rms_eps, 1e-5, 1e-12);
    ASSERT_NEAR(hp.rope_theta, 500000.0, 0);
    ASSERT_EQ(hp.rope_style, ENG_ROPE_NORM);
    ASSERT_FALSE(hp.tied_embeddings);
    ASSERT_FALSE(hp.has_qkv_bias);
    ASSERT_FALSE(hp.has_qk_norm);
    ASSERT_FALSE(hp.has_rope_freqs);
    const eng_gguf_tensor_t *t = eng_gguf_tensor_find(g, "blk.2.attn_k.weight");
    ASSERT_TRUE(t != NULL);
    ASSERT_EQ(t->ne[0], 128);
    ASSERT_EQ(t->ne[1], 32);
    ASSERT_EQ(eng_gguf_tensor_find(g, "blk.0.attn_norm.weight")->type, ENG_GGML_TYPE_F32);
    eng_gguf_free(g);
}

PC_TEST(hparams_qwen2_bias_tied_f16)
{
    eng_mkmodel_params_t p = eng_mkmodel_params_default();
    p.arch = ENG_ARCH_QWEN2;
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 4;
    p.n_ff = 96;
    p.tied = true;
    p.dtype = ENG_GGML_TYPE_F16;
    p.rope_theta = 1000000.0f;
    eng_gguf_t *g = NULL;
    eng_hparams_t hp;
    PC_TEST_CALL(open_model(&p, "qwen2.gguf", &g, &hp));
    ASSERT_EQ(hp.arch, ENG_ARCH_QWEN2);
    ASSERT_EQ(hp.rope_style, ENG_ROPE_NEOX);
    ASSERT_TRUE(hp.tied_embeddings);
    ASSERT_TRUE(hp.has_qkv_bias);
    ASSERT_FALSE(hp.has_qk_norm);
    ASSERT_TRUE(eng_gguf_tensor_find(g, "output.weight") == NULL);
    ASSERT_EQ(eng_gguf_tensor_find(g, "blk.1.attn_v.bias")->type, ENG_GGML_TYPE_F32);
    ASSERT_EQ(eng_gguf_tensor_find(g, "blk.1.attn_v.weight")->type, ENG_GGML_TYPE_F16);
    eng_gguf_free(g);
}

PC_TEST(hparams_qwen3_qk_norm_key_length_bf16_rope_freqs)
{
    eng_mkmodel_params_t p = eng_mkmodel_params_default();
    p.arch = ENG_ARCH_QWEN3;
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.head_dim = 32; /* n_head * head_dim = 128 != n_embd */
    p.n_ff = 128;
    p.dtype = ENG_GGML_TYPE_BF16;
    p.rope_freqs = true;
    eng_gguf_t *g = NULL;
    eng_hparams_t hp;
    PC_TEST_CALL(open_model(&p, "qwen3.gguf", &g, &hp));
    ASSERT_EQ(hp.arch, ENG_ARCH_QWEN3);
    ASSERT_EQ(hp.head_dim, 32);
    ASSERT_TRUE(hp.has_qk_norm);
    ASSERT_FALSE(hp.has_qkv_bias);
    ASSERT_TRUE(hp.has_rope_freqs);
    const eng_gguf_tensor_t *t = eng_gguf_tensor_find(g, "blk.0.attn_q.weight");
    ASSERT_EQ(t->ne[0], 64);
    ASSERT_EQ(t->ne[1], 128);
    t = eng_gguf_tensor_find(g, "blk.0.attn_output.weight");
    ASSERT_EQ(t->ne[0], 128);
    ASSERT_EQ(t->ne[1], 64);
    t = eng_gguf_tensor_find(g, "rope_freqs.weight");
    ASSERT_EQ(t->ne[0], 16);
    const float *rf = t->data;
    ASSERT_NEAR(rf[0], 1.0, 0);  /* highest frequency untouched */
    ASSERT_NEAR(rf[15], 8.0, 0); /* lowest frequency divided by the factor */
    eng_gguf_free(g);
}

/* Rewrites a generated model's metadata and tensors through the reader and writer, applying
 * one change, to test the hparams checks on files the generator would never produce. */
typedef struct edit {
    const char *drop_key;    /* leave this key out */
    const char *set_u32_key; /* then set it to set_u32 */
    uint32_t set_u32;
    const char *drop_tensor;   /* leave this tensor out */
    const char *retype_tensor; /* declare this tensor as retype (data zero) */
    uint32_t retype;
} edit_t;

static int copy_edited(const eng_gguf_t *g, const edit_t *e, const char *path)
{
    eng_gguf_writer_t *w = NULL;
    int rc = eng_gguf_writer_init(eng_gguf_alignment(g), &w);
    for (uint64_t i = 0; rc == 0 && i < eng_gguf_n_kv(g); i++) {
        const char *k = eng_gguf_kv_key(g, i);
        const eng_gguf_val_t *v = eng_gguf_kv_val(g, i);
        if ((e->drop_key != NULL && strcmp(k, e->drop_key) == 0) ||
            (e->set_u32_key != NULL && strcmp(k, e->set_u32_key) == 0) ||
            strcmp(k, "general.alignment") == 0)
            continue;
        if (v->type == ENG_GGUF_STRING) {
            rc = eng_gguf_writer_set_strn(w, k, (const char *)v->data, (size_t)v->n);
        } else if (v->type == ENG_GGUF_ARRAY && v->elem_type == ENG_GGUF_STRING) {
            rc = eng_gguf_writer_arr_begin(w, k, ENG_GGUF_STRING, v->n);
            for (uint64_t j = 0; rc == 0 && j < v->n; j++) {
                eng_gguf_val_t el;
                pc_slice_t s;
                eng_gguf_val_at(v, j, &el);
                eng_gguf_val_str(&el, &s);
                rc = eng_gguf_writer_push_str(w, s.base, s.len);
            }
        } else if (v->type == ENG_GGUF_ARRAY) {
            rc = eng_gguf_writer_set_arr(w, k, v->elem_type, v->data, v->n);
        } else if (v->type == ENG_GGUF_U32) {
            uint32_t x;
            eng_gguf_val_u32(v, &x);
            rc = eng_gguf_writer_set_u32(w, k, x);
        } else if (v->type == ENG_GGUF_F32) {
            float x;
            eng_gguf_val_f32(v, &x);
            rc = eng_gguf_writer_set_f32(w, k, x);
        } else if (v->type == ENG_GGUF_BOOL) {
            bool x;
            eng_gguf_val_bool(v, &x);
            rc = eng_gguf_writer_set_bool(w, k, x);
        }
    }
    if (rc == 0 && e->set_u32_key != NULL)
        rc = eng_gguf_writer_set_u32(w, e->set_u32_key, e->set_u32);
    for (uint64_t i = 0; rc == 0 && i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor_t *t = eng_gguf_tensor_at(g, i);
        if (e->drop_tensor != NULL && strcmp(t->name, e->drop_tensor) == 0)
            continue;
        uint32_t type = e->retype_tensor != NULL && strcmp(t->name, e->retype_tensor) == 0
                            ? e->retype
                            : t->type;
        rc = eng_gguf_writer_tensor_add(w, t->name, type, t->n_dims, t->ne);
    }
    char err[256];
    if (rc == 0)
        rc = eng_gguf_writer_file_begin(w, path, err, sizeof err);
    static uint8_t zero[1 << 16];
    for (uint64_t i = 0; rc == 0; i++) {
        uint64_t n = eng_gguf_writer_tensor_bytes(w, i);
        if (n == 0)
            break;
        while (rc == 0 && n > 0) {
            size_t k = (size_t)PC_MIN(n, sizeof zero);
            rc = eng_gguf_writer_tensor_write(w, zero, k, err, sizeof err);
            n -= k;
        }
    }
    if (rc == 0)
        rc = eng_gguf_writer_file_finish(w, err, sizeof err);
    eng_gguf_writer_free(w);
    return rc;
}

static void expect_hparams_error(const eng_gguf_t *src, const edit_t *e, int want_rc,
                                 const char *want)
{
    const char *path = pc_test_tmp_path("edited.gguf");
    ASSERT_EQ(copy_edited(src, e, path), 0);
    eng_gguf_t *g = NULL;
    char err[512] = "";
    ASSERT_EQ(eng_gguf_open(path, &g, err, sizeof err), 0);
    eng_hparams_t hp;
    int rc = eng_hparams_from_gguf(g, &hp, err, sizeof err);
    if (rc == 0)
        rc = eng_hparams_check_tensors(g, &hp, err, sizeof err);
    eng_gguf_free(g);
    if (rc != want_rc || strstr(err, want) == NULL)
        fprintf(stderr, "  got rc %d: %s\n  want: %s\n", rc, err, want);
    ASSERT_EQ(rc, want_rc);
    ASSERT_TRUE(strstr(err, want) != NULL);
}

PC_TEST(hparams_errors)
{
    eng_mkmodel_params_t p = eng_mkmodel_params_default();
    p.n_embd = 256;
    p.n_head = 8;
    p.n_head_kv = 2;
    p.n_ff = 256;
    p.n_layer = 1;
    eng_gguf_t *g = NULL;
    eng_hparams_t hp;
    PC_TEST_CALL(open_model(&p, "base.gguf", &g, &hp));
    /* Unchanged copy passes: the editor itself is faithful. */
    edit_t none = {0};
    const char *path = pc_test_tmp_path("edited.gguf");
    ASSERT_EQ(copy_edited(g, &none, path), 0);
    eng_gguf_t *g2 = NULL;
    char err[256];
    ASSERT_EQ(eng_gguf_open(path, &g2, err, sizeof err), 0);
    ASSERT_EQ(eng_hparams_from_gguf(g2, &hp, err, sizeof err), 0);
    ASSERT_EQ(eng_hparams_check_tensors(g2, &hp, err, sizeof err), 0);
    eng_gguf_free(g2);

    edit_t e;
    e = (edit_t){.retype_tensor = "blk.0.attn_q.weight", .retype = ENG_GGML_TYPE_Q2_K};
    PC_TEST_CALL(expect_hparams_error(
        g, &e, PC_ERR_UNSUPPORTED, "unsupported tensor type Q2_K in tensor blk.0.attn_q.weight"));
    e = (edit_t){.retype_tensor = "blk.0.ffn_norm.weight", .retype = ENG_GGML_TYPE_F16};
    PC_TEST_CALL(expect_hparams_error(
        g, &e, PC_ERR_UNSUPPORTED, "unsupported tensor type F16 in tensor blk.0.ffn_norm.weight"));
    e = (edit_t){.drop_tensor = "blk.0.ffn_up.weight"};
    PC_TEST_CALL(expect_hparams_error(g, &e, PC_ERR_FORMAT, "tensor blk.0.ffn_up.weight missing"));
    e = (edit_t){.drop_key = "llama.block_count"};
    PC_TEST_CALL(expect_hparams_error(g, &e, PC_ERR_FORMAT, "key 'llama.block_count' missing"));
    e = (edit_t){.set_u32_key = "llama.attention.head_count_kv", .set_u32 = 3};
    PC_TEST_CALL(expect_hparams_error(g, &e, PC_ERR_FORMAT,
                                      "llama.attention.head_count 8 is not a multiple of "
                                      "llama.attention.head_count_kv 3"));
    e = (edit_t){.set_u32_key = "llama.attention.head_count_kv", .set_u32 = 4};
    PC_TEST_CALL(expect_hparams_error(g, &e, PC_ERR_FORMAT,
                                      "tensor blk.0.attn_k.weight has shape [256, 64], expected "
                                      "[256, 128]"));
    e = (edit_t){.set_u32_key = "llama.feed_forward_length", .set_u32 = 0};
    PC_TEST_CALL(
        expect_hparams_error(g, &e, PC_ERR_FORMAT, "llama.feed_forward_length = 0 not in"));
    e = (edit_t){.set_u32_key = "llama.vocab_size", .set_u32 = 999};
    PC_TEST_CALL(expect_hparams_error(
        g, &e, PC_ERR_FORMAT, "llama.vocab_size 999 differs from token_embd.weight rows 320"));
    e = (edit_t){.set_u32_key = "llama.block_count", .set_u32 = 2};
    PC_TEST_CALL(
        expect_hparams_error(g, &e, PC_ERR_FORMAT, "tensor blk.1.attn_norm.weight missing"));
    e = (edit_t){.drop_tensor = "output.weight", .set_u32_key = "llama.block_count", .set_u32 = 1};
    ASSERT_EQ(copy_edited(g, &e, path), 0); /* dropping output.weight ties the model */
    eng_gguf_free(g);
    ASSERT_EQ(eng_gguf_open(path, &g, err, sizeof err), 0);
    ASSERT_EQ(eng_hparams_from_gguf(g, &hp, err, sizeof err), 0);
    ASSERT_TRUE(hp.tied_embeddings);
    ASSERT_EQ(eng_hparams_check_tensors(g, &hp, err, sizeof err), 0);
    eng_gguf_free(g);

    /* An architecture kvgw does not run. */
    eng_gguf_writer_t *w = NULL;
    ASSERT_EQ(eng_gguf_writer_init(0, &w), 0);
    ASSERT_EQ(eng_gguf_writer_set_str(w, "general.architecture", "gemma"), 0);
    ASSERT_EQ(eng_gguf_writer_file_begin(w, path, err, sizeof err), 0);
    ASSERT_EQ(eng_gguf_writer_file_finish(w, err, sizeof err), 0);
    eng_gguf_writer_free(w);
    ASSERT_EQ(eng_gguf_open(path, &g, err, sizeof err), 0);
    ASSERT_EQ(eng_hparams_from_gguf(g, &hp, err, sizeof err), PC_ERR_UNSUPPORTED);
    ASSERT_STR_EQ(err, "hparams: architecture 'gemma' is not supported (llama, qwen2, qwen3)");
    eng_gguf_free(g);
}

PC_TEST_MAIN()
