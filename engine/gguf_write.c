/*
 * gguf_write.c — the streaming GGUF writer (API and format in gguf.h).
 *
 * Metadata is encoded into one growing buffer as it is set, so the header is ready byte for
 * byte when the file begins; tensor data never passes through the writer's memory beyond the
 * caller's chunks. Every setter validates before it appends and appends in one piece, so a
 * failed call leaves the writer as it was. Open arrays (arr_begin) form a small stack of
 * (element type, elements still expected); an array closes when its last element arrives,
 * which may close its parents in turn.
 */
#include "gguf.h"

#include "common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct wtensor {
    char *name;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[ENG_GGUF_MAX_DIMS];
    uint64_t n_bytes;
    uint64_t offset; /* from the start of the data section */
} wtensor_t;

typedef struct wlevel {
    uint32_t elem_type;
    uint64_t left; /* elements still to push */
} wlevel_t;

struct eng_gguf_writer {
    uint32_t alignment;
    pc_buf_t meta; /* encoded key/value pairs */
    uint64_t n_kv;
    char **keys;
    size_t cap_keys;
    wtensor_t *tensors;
    uint64_t n_tensors;
    size_t cap_tensors;
    uint64_t data_size; /* padded size of the data section so far */
    wlevel_t stack[ENG_GGUF_MAX_DEPTH];
    int depth; /* open arrays */
    /* Output state. */
    FILE *f;
    char *path;
    char *tmp_path;
    uint64_t cur;         /* tensor being written */
    uint64_t cur_written; /* bytes of it written */
    bool finished;
};

static uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

int eng_gguf_writer_init(uint32_t alignment, eng_gguf_writer_t **out)
{
    *out = NULL;
    if (alignment == 0)
        alignment = ENG_GGUF_DEFAULT_ALIGNMENT;
    if (alignment < 8 || (alignment & (alignment - 1)) != 0)
        return PC_ERR_INVAL;
    eng_gguf_writer_t *w = pc_calloc(1, sizeof *w);
    if (w == NULL)
        return PC_ERR_NOMEM;
    w->alignment = alignment;
    if (alignment != ENG_GGUF_DEFAULT_ALIGNMENT) {
        int rc = eng_gguf_writer_set_u32(w, "general.alignment", alignment);
        if (rc != 0) {
            eng_gguf_writer_free(w);
            return rc;
        }
    }
    *out = w;
    return 0;
}

void eng_gguf_writer_free(eng_gguf_writer_t *w)
{
    if (w == NULL)
        return;
    if (w->f != NULL) {
        fclose(w->f);
        if (!w->finished && w->tmp_path != NULL)
            unlink(w->tmp_path);
    }
    for (uint64_t i = 0; i < w->n_kv; i++)
        pc_free(w->keys[i]);
    pc_free(w->keys);
    for (uint64_t i = 0; i < w->n_tensors; i++)
        pc_free(w->tensors[i].name);
    pc_free(w->tensors);
    pc_buf_free(&w->meta);
    pc_free(w->path);
    pc_free(w->tmp_path);
    pc_free(w);
}

/* ---------------------------------------------------------------------------------------------
 * Metadata
 * ------------------------------------------------------------------------------------------- */

static int check_key(const eng_gguf_writer_t *w, const char *key)
{
    if (key == NULL || key[0] == '\0' || strlen(key) > 65535)
        return PC_ERR_INVAL;
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0)
            return PC_ERR_EXISTS;
    return 0;
}

/* Appends the pieces in one reservation, so a failure appends nothing. */
typedef struct piece {
    const void *p;
    size_t n;
} piece_t;

static int append(eng_gguf_writer_t *w, const piece_t *pieces, size_t n_pieces)
{
    size_t total = 0;
    for (size_t i = 0; i < n_pieces; i++) {
        if (pieces[i].n > SIZE_MAX - total)
            return PC_ERR_NOMEM;
        total += pieces[i].n;
    }
    char *dst = pc_buf_reserve(&w->meta, total);
    if (dst == NULL)
        return PC_ERR_NOMEM;
    for (size_t i = 0; i < n_pieces; i++) {
        if (pieces[i].n != 0)
            memcpy(dst, pieces[i].p, pieces[i].n);
        dst += pieces[i].n;
    }
    pc_buf_commit(&w->meta, total);
    return 0;
}

/* Records a key (after its bytes are appended). On failure, rewinds the buffer to `mark`. */
static int add_key(eng_gguf_writer_t *w, const char *key, size_t mark)
{
    char *k = NULL;
    if (w->n_kv == w->cap_keys) {
        size_t cap = w->cap_keys != 0 ? w->cap_keys * 2 : 16;
        char **keys = pc_reallocarray(w->keys, cap, sizeof *keys);
        if (keys == NULL)
            goto fail;
        w->keys = keys;
        w->cap_keys = cap;
    }
    if ((k = pc_strdup(key)) == NULL)
        goto fail;
    w->keys[w->n_kv++] = k;
    return 0;
fail:
    w->meta.len = mark;
    return PC_ERR_NOMEM;
}

/* One key/value pair with a fixed payload. */
static int set_kv(eng_gguf_writer_t *w, const char *key, uint32_t type, const void *payload,
                  size_t n)
{
    if (w->depth != 0 || w->f != NULL)
        return PC_ERR_STATE;
    int rc = check_key(w, key);
    if (rc != 0)
        return rc;
    uint64_t key_len = strlen(key);
    size_t mark = w->meta.len;
    piece_t pieces[] = {{&key_len, 8}, {key, (size_t)key_len}, {&type, 4}, {payload, n}};
    if ((rc = append(w, pieces, PC_ARRAY_LEN(pieces))) != 0)
        return rc;
    return add_key(w, key, mark);
}

int eng_gguf_writer_set_u8(eng_gguf_writer_t *w, const char *key, uint8_t v)
{
    return set_kv(w, key, ENG_GGUF_U8, &v, 1);
}
int eng_gguf_writer_set_i8(eng_gguf_writer_t *w, const char *key, int8_t v)
{
    return set_kv(w, key, ENG_GGUF_I8, &v, 1);
}
int eng_gguf_writer_set_u16(eng_gguf_writer_t *w, const char *key, uint16_t v)
{
    return set_kv(w, key, ENG_GGUF_U16, &v, 2);
}
int eng_gguf_writer_set_i16(eng_gguf_writer_t *w, const char *key, int16_t v)
{
    return set_kv(w, key, ENG_GGUF_I16, &v, 2);
}
int eng_gguf_writer_set_u32(eng_gguf_writer_t *w, const char *key, uint32_t v)
{
    return set_kv(w, key, ENG_GGUF_U32, &v, 4);
}
int eng_gguf_writer_set_i32(eng_gguf_writer_t *w, const char *key, int32_t v)
{
    return set_kv(w, key, ENG_GGUF_I32, &v, 4);
}
int eng_gguf_writer_set_u64(eng_gguf_writer_t *w, const char *key, uint64_t v)
{
    return set_kv(w, key, ENG_GGUF_U64, &v, 8);
}
int eng_gguf_writer_set_i64(eng_gguf_writer_t *w, const char *key, int64_t v)
{
    return set_kv(w, key, ENG_GGUF_I64, &v, 8);
}
int eng_gguf_writer_set_f32(eng_gguf_writer_t *w, const char *key, float v)
{
    return set_kv(w, key, ENG_GGUF_F32, &v, 4);
}
int eng_gguf_writer_set_f64(eng_gguf_writer_t *w, const char *key, double v)
{
    return set_kv(w, key, ENG_GGUF_F64, &v, 8);
}
int eng_gguf_writer_set_bool(eng_gguf_writer_t *w, const char *key, bool v)
{
    uint8_t b = v ? 1 : 0;
    return set_kv(w, key, ENG_GGUF_BOOL, &b, 1);
}

int eng_gguf_writer_set_strn(eng_gguf_writer_t *w, const char *key, const char *s, size_t len)
{
    if (s == NULL && len != 0)
        return PC_ERR_INVAL;
    if (w->depth != 0 || w->f != NULL)
        return PC_ERR_STATE;
    int rc = check_key(w, key);
    if (rc != 0)
        return rc;
    uint64_t key_len = strlen(key), n = len;
    uint32_t type = ENG_GGUF_STRING;
    size_t mark = w->meta.len;
    piece_t pieces[] = {{&key_len, 8}, {key, (size_t)key_len}, {&type, 4}, {&n, 8}, {s, len}};
    if ((rc = append(w, pieces, PC_ARRAY_LEN(pieces))) != 0)
        return rc;
    return add_key(w, key, mark);
}

int eng_gguf_writer_set_str(eng_gguf_writer_t *w, const char *key, const char *s)
{
    if (s == NULL)
        return PC_ERR_INVAL;
    return eng_gguf_writer_set_strn(w, key, s, strlen(s));
}

static uint32_t vsize(uint32_t t)
{
    static const uint8_t sizes[ENG_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < ENG_GGUF_VTYPE_COUNT ? sizes[t] : 0;
}

/* Marks one element of the innermost open array as pushed, closing finished arrays. */
static void element_done(eng_gguf_writer_t *w)
{
    w->stack[w->depth - 1].left--;
    while (w->depth > 0 && w->stack[w->depth - 1].left == 0)
        w->depth--;
}

int eng_gguf_writer_arr_begin(eng_gguf_writer_t *w, const char *key, uint32_t elem_type, uint64_t n)
{
    if (elem_type >= ENG_GGUF_VTYPE_COUNT)
        return PC_ERR_INVAL;
    if (w->f != NULL)
        return PC_ERR_STATE;
    int level = w->depth + 1; /* nesting level of the new array */
    if (key != NULL) {
        if (w->depth != 0)
            return PC_ERR_STATE;
        int rc = check_key(w, key);
        if (rc != 0)
            return rc;
        level = 1;
    } else if (w->depth == 0 || w->stack[w->depth - 1].elem_type != ENG_GGUF_ARRAY) {
        return PC_ERR_STATE;
    }
    if (elem_type == ENG_GGUF_ARRAY && level >= ENG_GGUF_MAX_DEPTH)
        return PC_ERR_STATE;
    size_t mark = w->meta.len;
    uint32_t arr_type = ENG_GGUF_ARRAY;
    int rc;
    if (key != NULL) {
        uint64_t key_len = strlen(key);
        piece_t pieces[] = {
            {&key_len, 8}, {key, (size_t)key_len}, {&arr_type, 4}, {&elem_type, 4}, {&n, 8}};
        if ((rc = append(w, pieces, PC_ARRAY_LEN(pieces))) != 0)
            return rc;
        if ((rc = add_key(w, key, mark)) != 0)
            return rc;
    } else {
        piece_t pieces[] = {{&elem_type, 4}, {&n, 8}};
        if ((rc = append(w, pieces, PC_ARRAY_LEN(pieces))) != 0)
            return rc;
        element_done(w); /* the nested array counts as one element of its parent */
    }
    if (n != 0)
        w->stack[w->depth++] = (wlevel_t){elem_type, n};
    return 0;
}

int eng_gguf_writer_push_scalar(eng_gguf_writer_t *w, const void *v)
{
    if (w->depth == 0 || v == NULL)
        return w->depth == 0 ? PC_ERR_STATE : PC_ERR_INVAL;
    uint32_t et = w->stack[w->depth - 1].elem_type, sz = vsize(et);
    if (sz == 0)
        return PC_ERR_STATE;
    if (et == ENG_GGUF_BOOL && *(const uint8_t *)v > 1)
        return PC_ERR_INVAL;
    piece_t piece = {v, sz};
    int rc = append(w, &piece, 1);
    if (rc == 0)
        element_done(w);
    return rc;
}

int eng_gguf_writer_push_str(eng_gguf_writer_t *w, const char *s, size_t len)
{
    if (w->depth == 0 || w->stack[w->depth - 1].elem_type != ENG_GGUF_STRING)
        return PC_ERR_STATE;
    if (s == NULL && len != 0)
        return PC_ERR_INVAL;
    uint64_t n = len;
    piece_t pieces[] = {{&n, 8}, {s, len}};
    int rc = append(w, pieces, PC_ARRAY_LEN(pieces));
    if (rc == 0)
        element_done(w);
    return rc;
}

int eng_gguf_writer_set_arr(eng_gguf_writer_t *w, const char *key, uint32_t elem_type,
                            const void *elems, uint64_t n)
{
    uint32_t sz = vsize(elem_type);
    if (sz == 0 || (elems == NULL && n != 0) || key == NULL || n > SIZE_MAX / sz)
        return PC_ERR_INVAL;
    if (w->depth != 0 || w->f != NULL)
        return PC_ERR_STATE;
    if (elem_type == ENG_GGUF_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (((const uint8_t *)elems)[i] > 1)
                return PC_ERR_INVAL;
    int rc = check_key(w, key);
    if (rc != 0)
        return rc;
    uint64_t key_len = strlen(key);
    uint32_t arr_type = ENG_GGUF_ARRAY;
    size_t mark = w->meta.len;
    piece_t pieces[] = {{&key_len, 8}, {key, (size_t)key_len}, {&arr_type, 4}, {&elem_type, 4},
                        {&n, 8},       {elems, (size_t)n * sz}};
    if ((rc = append(w, pieces, PC_ARRAY_LEN(pieces))) != 0)
        return rc;
    return add_key(w, key, mark);
}

int eng_gguf_writer_set_arr_str(eng_gguf_writer_t *w, const char *key, const char *const *strs,
                                uint64_t n)
{
    if (key == NULL || (strs == NULL && n != 0))
        return PC_ERR_INVAL;
    for (uint64_t i = 0; i < n; i++)
        if (strs[i] == NULL)
            return PC_ERR_INVAL;
    if (w->depth != 0 || w->f != NULL)
        return PC_ERR_STATE;
    size_t mark = w->meta.len;
    uint64_t n_kv = w->n_kv;
    int rc = eng_gguf_writer_arr_begin(w, key, ENG_GGUF_STRING, n);
    for (uint64_t i = 0; rc == 0 && i < n; i++)
        rc = eng_gguf_writer_push_str(w, strs[i], strlen(strs[i]));
    if (rc != 0) {
        /* Roll back a partly pushed array: its key and its bytes. */
        while (w->n_kv > n_kv)
            pc_free(w->keys[--w->n_kv]);
        w->meta.len = mark;
        w->depth = 0;
    }
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Tensors and the file
 * ------------------------------------------------------------------------------------------- */

int eng_gguf_writer_tensor_add(eng_gguf_writer_t *w, const char *name, uint32_t type,
                               uint32_t n_dims, const int64_t *ne)
{
    if (w->f != NULL)
        return PC_ERR_STATE;
    if (name == NULL || name[0] == '\0' || strlen(name) > ENG_GGUF_MAX_NAME || ne == NULL ||
        n_dims < 1 || n_dims > ENG_GGUF_MAX_DIMS)
        return PC_ERR_INVAL;
    uint32_t bs = eng_ggml_type_block_size(type), bb = eng_ggml_type_block_bytes(type);
    if (bs == 0)
        return PC_ERR_INVAL;
    int64_t n_el = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] < 1 || ne[d] > INT64_MAX / n_el)
            return PC_ERR_INVAL;
        n_el *= ne[d];
    }
    if (ne[0] % bs != 0)
        return PC_ERR_INVAL;
    uint64_t n_blocks = (uint64_t)n_el / bs;
    if (n_blocks > UINT64_MAX / bb)
        return PC_ERR_INVAL;
    uint64_t n_bytes = n_blocks * bb;
    uint64_t padded = align_up(n_bytes, w->alignment);
    if (padded < n_bytes || padded > UINT64_MAX - w->data_size)
        return PC_ERR_INVAL;
    for (uint64_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return PC_ERR_EXISTS;
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors != 0 ? w->cap_tensors * 2 : 64;
        wtensor_t *t = pc_reallocarray(w->tensors, cap, sizeof *t);
        if (t == NULL)
            return PC_ERR_NOMEM;
        w->tensors = t;
        w->cap_tensors = cap;
    }
    char *nm = pc_strdup(name);
    if (nm == NULL)
        return PC_ERR_NOMEM;
    wtensor_t *t = &w->tensors[w->n_tensors++];
    memset(t, 0, sizeof *t);
    t->name = nm;
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < ENG_GGUF_MAX_DIMS; d++)
        t->ne[d] = d < n_dims ? ne[d] : 1;
    t->n_bytes = n_bytes;
    t->offset = w->data_size;
    w->data_size += padded;
    return 0;
}

uint64_t eng_gguf_writer_tensor_bytes(const eng_gguf_writer_t *w, uint64_t i)
{
    return i < w->n_tensors ? w->tensors[i].n_bytes : 0;
}

static int io_fail(eng_gguf_writer_t *w, const char *what, char *err, size_t err_len)
{
    int e = errno;
    if (err != NULL && err_len > 0)
        snprintf(err, err_len, "gguf: cannot %s '%s': %s", what,
                 w->tmp_path != NULL ? w->tmp_path : "?", strerror(e));
    return PC_ERR_IO;
}

static const uint8_t zeros[256];

static int write_zeros(FILE *f, uint64_t n)
{
    while (n > 0) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        if (fwrite(zeros, 1, k, f) != k)
            return -1;
        n -= k;
    }
    return 0;
}

int eng_gguf_writer_file_begin(eng_gguf_writer_t *w, const char *path, char *err, size_t err_len)
{
    if (w->depth != 0 || w->f != NULL || w->finished) {
        if (err != NULL && err_len > 0)
            snprintf(err, err_len, "gguf: writer: %s",
                     w->depth != 0 ? "an array is still open" : "file already begun");
        return PC_ERR_STATE;
    }
    size_t plen = strlen(path);
    pc_free(w->path);
    pc_free(w->tmp_path);
    w->path = pc_strdup(path);
    w->tmp_path = pc_malloc(plen + 5);
    if (w->path == NULL || w->tmp_path == NULL)
        return PC_ERR_NOMEM;
    memcpy(w->tmp_path, path, plen);
    memcpy(w->tmp_path + plen, ".tmp", 5);
    w->f = fopen(w->tmp_path, "wb");
    if (w->f == NULL)
        return io_fail(w, "create", err, err_len);
    setvbuf(w->f, NULL, _IOFBF, 1 << 20);
    uint32_t version = ENG_GGUF_VERSION;
    uint64_t counts[2] = {w->n_tensors, w->n_kv};
    uint64_t pos = 24 + w->meta.len;
    bool ok = fwrite(ENG_GGUF_MAGIC, 1, 4, w->f) == 4 && fwrite(&version, 4, 1, w->f) == 1 &&
              fwrite(counts, 8, 2, w->f) == 2 &&
              (w->meta.len == 0 || fwrite(w->meta.base, 1, w->meta.len, w->f) == w->meta.len);
    for (uint64_t i = 0; ok && i < w->n_tensors; i++) {
        const wtensor_t *t = &w->tensors[i];
        uint64_t name_len = strlen(t->name);
        ok = fwrite(&name_len, 8, 1, w->f) == 1 &&
             fwrite(t->name, 1, (size_t)name_len, w->f) == name_len &&
             fwrite(&t->n_dims, 4, 1, w->f) == 1 &&
             fwrite(t->ne, 8, t->n_dims, w->f) == t->n_dims && fwrite(&t->type, 4, 1, w->f) == 1 &&
             fwrite(&t->offset, 8, 1, w->f) == 1;
        pos += 8 + name_len + 4 + 8ull * t->n_dims + 4 + 8;
    }
    ok = ok && write_zeros(w->f, align_up(pos, w->alignment) - pos) == 0;
    if (!ok)
        return io_fail(w, "write", err, err_len);
    w->cur = 0;
    w->cur_written = 0;
    return 0;
}

int eng_gguf_writer_tensor_write(eng_gguf_writer_t *w, const void *data, size_t n, char *err,
                                 size_t err_len)
{
    if (w->f == NULL || w->finished)
        return PC_ERR_STATE;
    /* Check the whole chunk fits before writing any of it. */
    uint64_t room = 0;
    for (uint64_t i = w->cur; i < w->n_tensors && room < n; i++)
        room += w->tensors[i].n_bytes - (i == w->cur ? w->cur_written : 0);
    if (room < n) {
        if (err != NULL && err_len > 0)
            snprintf(err, err_len,
                     "gguf: writer: %zu bytes of tensor data exceed the declared "
                     "tensors",
                     n);
        return PC_ERR_RANGE;
    }
    const uint8_t *p = data;
    while (n > 0) {
        const wtensor_t *t = &w->tensors[w->cur];
        uint64_t left = t->n_bytes - w->cur_written;
        size_t k = n < left ? n : (size_t)left;
        if (fwrite(p, 1, k, w->f) != k)
            return io_fail(w, "write", err, err_len);
        p += k;
        n -= k;
        w->cur_written += k;
        if (w->cur_written == t->n_bytes) {
            if (write_zeros(w->f, align_up(t->n_bytes, w->alignment) - t->n_bytes) != 0)
                return io_fail(w, "write", err, err_len);
            w->cur++;
            w->cur_written = 0;
        }
    }
    return 0;
}

int eng_gguf_writer_file_finish(eng_gguf_writer_t *w, char *err, size_t err_len)
{
    if (w->f == NULL || w->finished)
        return PC_ERR_STATE;
    int rc = 0;
    if (w->cur != w->n_tensors) {
        if (err != NULL && err_len > 0)
            snprintf(err, err_len, "gguf: writer: tensor '%s' incomplete (%llu of %llu bytes)",
                     w->tensors[w->cur].name, (unsigned long long)w->cur_written,
                     (unsigned long long)w->tensors[w->cur].n_bytes);
        rc = PC_ERR_STATE;
        goto fail;
    }
    if (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0) {
        rc = io_fail(w, "write", err, err_len);
        goto fail;
    }
    FILE *f = w->f;
    w->f = NULL;
    if (fclose(f) != 0) {
        rc = io_fail(w, "close", err, err_len);
        unlink(w->tmp_path);
        return rc;
    }
    if (rename(w->tmp_path, w->path) != 0) {
        rc = io_fail(w, "rename", err, err_len);
        unlink(w->tmp_path);
        return rc;
    }
    w->finished = true;
    return 0;
fail:
    fclose(w->f);
    w->f = NULL;
    unlink(w->tmp_path);
    return rc;
}
