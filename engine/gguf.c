/*
 * gguf.c — the GGUF reader (format and guarantees in gguf.h).
 *
 * The parser walks the header once with a cursor that never moves past the end of the bytes:
 * every read first checks that enough bytes remain, every count is compared with what the
 * remaining bytes could hold before anything is allocated, and every product is checked for
 * overflow. Values are not copied: an eng_gguf_val_t points into the mapping. What needs O(1)
 * access but is variable-sized (string array elements, arrays of arrays) gets an index built
 * during the walk, in the reader's arena.
 */
#include "gguf.h"

#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvgw's GGUF reader assumes a little-endian host"
#endif

/* ---------------------------------------------------------------------------------------------
 * Type tables (the tensor types' table is quant.c's)
 * ------------------------------------------------------------------------------------------- */

static const char *const vtype_names[ENG_GGUF_VTYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

/* Encoded size of a fixed-size value type; 0 for STRING and ARRAY. */
static const uint8_t vtype_sizes[ENG_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *eng_gguf_vtype_name(uint32_t vtype)
{
    return vtype < ENG_GGUF_VTYPE_COUNT ? vtype_names[vtype] : "?";
}

/* ---------------------------------------------------------------------------------------------
 * The reader object
 * ------------------------------------------------------------------------------------------- */

typedef struct gguf_kv {
    const char *key; /* NUL-terminated copy in the arena */
    eng_gguf_val_t val;
} gguf_kv_t;

struct eng_gguf {
    const uint8_t *base;
    uint64_t size;
    void *map; /* NULL for eng_gguf_open_mem */
    size_t map_len;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset;
    uint64_t n_kv;
    gguf_kv_t *kv;
    uint64_t n_tensors;
    eng_gguf_tensor_t *tensors;
    pc_strmap_t kv_index;     /* key -> position in kv[] */
    pc_strmap_t tensor_index; /* name -> position in tensors[] */
    pc_arena_t arena;         /* keys, names, kv and tensor arrays, array indexes */
};

/* ---------------------------------------------------------------------------------------------
 * Parser
 * ------------------------------------------------------------------------------------------- */

typedef struct parser {
    eng_gguf_t *g;
    const uint8_t *base;
    uint64_t size;
    uint64_t pos;
    char ctx[160]; /* what is being read, for messages: "metadata key #7 'general.name'" */
    char *err;
    size_t err_len;
} parser_t;

/* Formats "gguf: offset N: <ctx>: <msg>" into the caller's buffer; returns PC_ERR_FORMAT. */
static int PC_PRINTF(3, 4) perr(parser_t *p, uint64_t off, const char *fmt, ...)
{
    if (p->err == NULL || p->err_len == 0)
        return PC_ERR_FORMAT;
    int n = snprintf(p->err, p->err_len, "gguf: offset %" PRIu64 ": %s%s", off, p->ctx,
                     p->ctx[0] != '\0' ? ": " : "");
    if (n >= 0 && (size_t)n < p->err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->err + n, p->err_len - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return PC_ERR_FORMAT;
}

/* Writes a context label; names from the file are clipped and non-printable bytes escaped so a
 * hostile name cannot garble the message. */
static void set_ctx(parser_t *p, const char *what, uint64_t idx, const uint8_t *name,
                    uint64_t name_len)
{
    int n = snprintf(p->ctx, sizeof p->ctx, "%s #%" PRIu64, what, idx);
    if (name == NULL || n < 0)
        return;
    size_t at = (size_t)n;
    const size_t cap = sizeof p->ctx;
    if (at + 3 >= cap)
        return;
    p->ctx[at++] = ' ';
    p->ctx[at++] = '\'';
    for (uint64_t i = 0; i < name_len && at + 6 < cap; i++) {
        uint8_t c = name[i];
        if (c >= 0x20 && c < 0x7f && c != '\'') {
            p->ctx[at++] = (char)c;
        } else {
            snprintf(p->ctx + at, cap - at, "\\x%02x", c);
            at += 4;
        }
        if (i + 1 < name_len && at + 9 >= cap) {
            memcpy(p->ctx + at, "...", 3);
            at += 3;
            break;
        }
    }
    p->ctx[at++] = '\'';
    p->ctx[at] = '\0';
}

static uint64_t remain(const parser_t *p)
{
    return p->size - p->pos;
}

static int need(parser_t *p, uint64_t n, const char *field)
{
    if (remain(p) < n)
        return perr(p, p->pos, "%s truncated: needs %" PRIu64 " bytes, %" PRIu64 " left in file",
                    field, n, remain(p));
    return 0;
}

static uint32_t ld_u32(const uint8_t *s)
{
    uint32_t v;
    memcpy(&v, s, sizeof v);
    return v;
}

static uint64_t ld_u64(const uint8_t *s)
{
    uint64_t v;
    memcpy(&v, s, sizeof v);
    return v;
}

/* Reads the next n bytes into *out, a uint32_t or uint64_t (n = its size): the file is
 * little-endian like the host (gguf.h). 0 or the truncation error. */
static int rd_uint(parser_t *p, void *out, size_t n, const char *field)
{
    int rc = need(p, n, field);
    if (rc != 0)
        return rc;
    memcpy(out, p->base + p->pos, n);
    p->pos += n;
    return 0;
}

/* A string: u64 length then bytes. *s points into the file. */
static int rd_str(parser_t *p, const uint8_t **s, uint64_t *len, const char *field)
{
    uint64_t at = p->pos, n;
    int rc = rd_uint(p, &n, sizeof n, field);
    if (rc != 0)
        return rc;
    if (n > remain(p))
        return perr(p, at,
                    "%s length %" PRIu64 " exceeds file size (%" PRIu64 " bytes left after it)",
                    field, n, remain(p));
    *s = p->base + p->pos;
    *len = n;
    p->pos += n;
    return 0;
}

static int parse_value(parser_t *p, uint32_t type, uint32_t depth, eng_gguf_val_t *v);

static int parse_array(parser_t *p, uint32_t depth, eng_gguf_val_t *v)
{
    uint32_t et;
    uint64_t n, at = p->pos;
    int rc = rd_uint(p, &et, sizeof et, "array element type");
    if (rc != 0)
        return rc;
    if (et >= ENG_GGUF_VTYPE_COUNT)
        return perr(p, at, "unknown array element type %" PRIu32, et);
    at = p->pos;
    if ((rc = rd_uint(p, &n, sizeof n, "array length")) != 0)
        return rc;
    v->elem_type = et;
    v->n = n;
    v->data = p->base + p->pos;
    if (vtype_sizes[et] != 0) {
        uint64_t sz = vtype_sizes[et];
        if (n > remain(p) / sz)
            return perr(p, at, "array of %" PRIu64 " %s exceeds file size (%" PRIu64 " bytes left)",
                        n, vtype_names[et], remain(p));
        if (et == ENG_GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (p->base[p->pos + i] > 1)
                    return perr(p, p->pos + i,
                                "array element %" PRIu64 ": bool byte %u is not 0 or 1", i,
                                p->base[p->pos + i]);
        p->pos += n * sz;
        return 0;
    }
    if (et == ENG_GGUF_STRING) {
        if (n > remain(p) / 8)
            return perr(p, at,
                        "array of %" PRIu64 " strings exceeds file size (%" PRIu64 " bytes left)",
                        n, remain(p));
        uint64_t *offs = n != 0 ? pc_arena_alloc(&p->g->arena, (size_t)n * sizeof *offs) : NULL;
        if (n != 0 && offs == NULL)
            return PC_ERR_NOMEM;
        for (uint64_t i = 0; i < n; i++) {
            const uint8_t *s;
            uint64_t len;
            offs[i] = p->pos;
            if ((rc = rd_str(p, &s, &len, "array string")) != 0)
                return rc;
        }
        v->_index = offs;
        return 0;
    }
    /* An array of arrays: each element is (u32 type, u64 n, elements). */
    if (depth + 1 >= ENG_GGUF_MAX_DEPTH)
        return perr(p, at, "arrays nested deeper than %d levels", ENG_GGUF_MAX_DEPTH);
    if (n > remain(p) / 12)
        return perr(p, at, "array of %" PRIu64 " arrays exceeds file size (%" PRIu64 " bytes left)",
                    n, remain(p));
    eng_gguf_val_t *items = n != 0 ? pc_arena_calloc(&p->g->arena, (size_t)n, sizeof *items) : NULL;
    if (n != 0 && items == NULL)
        return PC_ERR_NOMEM;
    for (uint64_t i = 0; i < n; i++)
        if ((rc = parse_value(p, ENG_GGUF_ARRAY, depth + 1, &items[i])) != 0)
            return rc;
    v->_index = items;
    return 0;
}

static int parse_value(parser_t *p, uint32_t type, uint32_t depth, eng_gguf_val_t *v)
{
    memset(v, 0, sizeof *v);
    v->type = type;
    v->offset = p->pos;
    if (type >= ENG_GGUF_VTYPE_COUNT)
        return perr(p, p->pos - 4, "unknown value type %" PRIu32, type);
    if (type == ENG_GGUF_STRING) {
        const uint8_t *s;
        uint64_t len;
        int rc = rd_str(p, &s, &len, "string");
        if (rc != 0)
            return rc;
        v->data = s;
        v->n = len;
        return 0;
    }
    if (type == ENG_GGUF_ARRAY)
        return parse_array(p, depth, v);
    int rc = need(p, vtype_sizes[type], vtype_names[type]);
    if (rc != 0)
        return rc;
    if (type == ENG_GGUF_BOOL && p->base[p->pos] > 1)
        return perr(p, p->pos, "bool byte %u is not 0 or 1", p->base[p->pos]);
    v->data = p->base + p->pos;
    v->n = 1;
    p->pos += vtype_sizes[type];
    return 0;
}

/* Indexes name as position i of its table: 0, 1 when the name is there already, or
 * PC_ERR_NOMEM. The index grows with the entries parsed, not with the count the file claims. */
static int index_add(pc_strmap_t *ix, const char *name, uint64_t i)
{
    return pc_strmap_insert(ix, name, strlen(name), i, NULL);
}

/* The position of name in the table ix indexes, or UINT64_MAX. */
static uint64_t index_find(const pc_strmap_t *ix, const char *name)
{
    uint64_t i;
    return pc_strmap_get(ix, name, strlen(name), &i) ? i : UINT64_MAX;
}

/* Reads the name of item i, a metadata key or a tensor name (field "key" or "name"): not
 * empty, at most max bytes, no NUL byte; copies it into the arena and points the error
 * context at it. 0, the format error or PC_ERR_NOMEM. */
static int rd_name(parser_t *p, const char *what, uint64_t i, const char *field, uint64_t max,
                   char **out)
{
    const uint8_t *s;
    uint64_t len, at = p->pos;
    set_ctx(p, what, i, NULL, 0);
    int rc = rd_str(p, &s, &len, field);
    if (rc != 0)
        return rc;
    set_ctx(p, what, i, s, len);
    if (len == 0)
        return perr(p, at, "empty %s", field);
    if (len > max)
        return perr(p, at, "%s length %" PRIu64 " exceeds %" PRIu64, field, len, max);
    if (memchr(s, '\0', (size_t)len) != NULL)
        return perr(p, at, "%s contains a NUL byte", field);
    *out = pc_arena_strndup(&p->g->arena, (const char *)s, (size_t)len);
    return *out != NULL ? 0 : PC_ERR_NOMEM;
}

static int parse_kvs(parser_t *p, uint64_t n_kv)
{
    eng_gguf_t *g = p->g;
    /* The smallest pair: a 1-byte key (8 + 1), a type (4) and a u8 value (1). */
    if (n_kv > remain(p) / 14)
        return perr(p, 16, "n_kv %" PRIu64 " exceeds what the file can hold", n_kv);
    g->kv = pc_arena_calloc(&g->arena, (size_t)(n_kv != 0 ? n_kv : 1), sizeof *g->kv);
    if (g->kv == NULL)
        return PC_ERR_NOMEM;
    for (uint64_t i = 0; i < n_kv; i++) {
        uint64_t at = p->pos;
        uint32_t type;
        char *k;
        int rc = rd_name(p, "metadata key", i, "key", 65535, &k);
        if (rc != 0)
            return rc;
        g->kv[i].key = k;
        if ((rc = index_add(&g->kv_index, k, i)) != 0)
            return rc < 0 ? rc : perr(p, at, "duplicate key");
        if ((rc = rd_uint(p, &type, sizeof type, "value type")) != 0)
            return rc;
        if ((rc = parse_value(p, type, 0, &g->kv[i].val)) != 0)
            return rc;
        g->n_kv = i + 1;
    }
    p->ctx[0] = '\0';
    return 0;
}

static int parse_alignment(parser_t *p)
{
    eng_gguf_t *g = p->g;
    g->alignment = ENG_GGUF_DEFAULT_ALIGNMENT;
    const eng_gguf_val_t *v = eng_gguf_get(g, "general.alignment");
    if (v == NULL)
        return 0;
    snprintf(p->ctx, sizeof p->ctx, "metadata key 'general.alignment'");
    if (v->type != ENG_GGUF_U32)
        return perr(p, v->offset, "type %s, expected u32", eng_gguf_vtype_name(v->type));
    uint32_t a = ld_u32(v->data);
    if (a == 0 || (a & (a - 1)) != 0)
        return perr(p, v->offset, "alignment %" PRIu32 " is not a power of two", a);
    g->alignment = a;
    p->ctx[0] = '\0';
    return 0;
}

typedef struct span {
    uint64_t begin, end, idx;
} span_t;

static int span_cmp(const void *a, const void *b)
{
    const span_t *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int parse_tensors(parser_t *p, uint64_t n_tensors)
{
    eng_gguf_t *g = p->g;
    /* The smallest info: a 1-byte name (9), n_dims (4), one dim (8), type (4), offset (8). */
    if (n_tensors > remain(p) / 33)
        return perr(p, 8, "n_tensors %" PRIu64 " exceeds what the file can hold", n_tensors);
    g->tensors =
        pc_arena_calloc(&g->arena, (size_t)(n_tensors != 0 ? n_tensors : 1), sizeof *g->tensors);
    if (g->tensors == NULL)
        return PC_ERR_NOMEM;
    for (uint64_t i = 0; i < n_tensors; i++) {
        eng_gguf_tensor_t *t = &g->tensors[i];
        uint64_t at = p->pos;
        uint32_t n_dims, type;
        char *nm;
        int rc = rd_name(p, "tensor", i, "name", ENG_GGUF_MAX_NAME, &nm);
        if (rc != 0)
            return rc;
        t->name = nm;
        if ((rc = index_add(&g->tensor_index, nm, i)) != 0)
            return rc < 0 ? rc : perr(p, at, "duplicate tensor name");
        at = p->pos;
        if ((rc = rd_uint(p, &n_dims, sizeof n_dims, "n_dims")) != 0)
            return rc;
        if (n_dims < 1 || n_dims > ENG_GGUF_MAX_DIMS)
            return perr(p, at, "n_dims %" PRIu32 " not in 1..%d", n_dims, ENG_GGUF_MAX_DIMS);
        t->n_dims = n_dims;
        int64_t n_el = 1;
        for (uint32_t d = 0; d < ENG_GGUF_MAX_DIMS; d++) {
            t->ne[d] = 1;
            if (d >= n_dims)
                continue;
            uint64_t ne;
            at = p->pos;
            if ((rc = rd_uint(p, &ne, sizeof ne, "dimension")) != 0)
                return rc;
            if (ne < 1 || ne > (uint64_t)INT64_MAX)
                return perr(p, at, "ne[%" PRIu32 "] = %" PRId64 " is not positive", d, (int64_t)ne);
            if ((int64_t)ne > INT64_MAX / n_el)
                return perr(p, at, "element count overflows int64 at ne[%" PRIu32 "]", d);
            t->ne[d] = (int64_t)ne;
            n_el *= (int64_t)ne;
        }
        t->n_elements = n_el;
        at = p->pos;
        if ((rc = rd_uint(p, &type, sizeof type, "type")) != 0)
            return rc;
        uint32_t bs = eng_ggml_type_block_size(type), bb = eng_ggml_type_block_bytes(type);
        if (bs == 0)
            return perr(p, at, "unknown tensor type id %" PRIu32, type);
        t->type = type;
        if (t->ne[0] % bs != 0)
            return perr(p, at,
                        "ne[0] = %" PRId64 " is not a multiple of the %s block size %" PRIu32,
                        t->ne[0], eng_ggml_type_name(type), bs);
        uint64_t n_blocks = (uint64_t)n_el / bs;
        if (n_blocks > UINT64_MAX / bb)
            return perr(p, at, "data size overflows");
        t->n_bytes = n_blocks * bb;
        at = p->pos;
        if ((rc = rd_uint(p, &t->offset, sizeof t->offset, "data offset")) != 0)
            return rc;
        if (t->offset % g->alignment != 0)
            return perr(p, at,
                        "data offset %" PRIu64 " is not a multiple of the alignment %" PRIu32,
                        t->offset, g->alignment);
        g->n_tensors = i + 1;
    }
    p->ctx[0] = '\0';
    return 0;
}

static int check_data(parser_t *p)
{
    eng_gguf_t *g = p->g;
    uint64_t a = g->alignment;
    if (p->pos > UINT64_MAX - (a - 1))
        return perr(p, p->pos, "data section offset overflows");
    g->data_offset = (p->pos + a - 1) / a * a;
    uint64_t data_size = g->data_offset <= g->size ? g->size - g->data_offset : 0;
    span_t *spans = NULL;
    if (g->n_tensors != 0) {
        spans = pc_malloc((size_t)g->n_tensors * sizeof *spans);
        if (spans == NULL)
            return PC_ERR_NOMEM;
    }
    int rc = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        eng_gguf_tensor_t *t = &g->tensors[i];
        if (t->offset > data_size || t->n_bytes > data_size - t->offset) {
            set_ctx(p, "tensor", i, (const uint8_t *)t->name, strlen(t->name));
            rc = perr(p, g->data_offset,
                      "data [%" PRIu64 ", +%" PRIu64 ") extends past the end of the file (data "
                      "section has %" PRIu64 " bytes)",
                      t->offset, t->n_bytes, data_size);
            goto done;
        }
        t->data = g->base + g->data_offset + t->offset;
        spans[i] = (span_t){t->offset, t->offset + t->n_bytes, i};
    }
    if (g->n_tensors > 1)
        qsort(spans, (size_t)g->n_tensors, sizeof *spans, span_cmp);
    for (uint64_t i = 1; i < g->n_tensors; i++) {
        if (spans[i].begin < spans[i - 1].end) {
            const eng_gguf_tensor_t *t = &g->tensors[spans[i].idx];
            set_ctx(p, "tensor", spans[i].idx, (const uint8_t *)t->name, strlen(t->name));
            rc = perr(p, g->data_offset + t->offset, "data overlaps tensor '%s'",
                      g->tensors[spans[i - 1].idx].name);
            goto done;
        }
    }
done:
    pc_free(spans);
    return rc;
}

static int parse(eng_gguf_t *g, char *err, size_t err_len)
{
    parser_t p = {.g = g, .base = g->base, .size = g->size, .err = err, .err_len = err_len};
    uint32_t version;
    uint64_t n_tensors, n_kv;
    int rc;
    snprintf(p.ctx, sizeof p.ctx, "header");
    if ((rc = need(&p, 4, "magic")) != 0)
        return rc;
    if (memcmp(g->base, ENG_GGUF_MAGIC, 4) != 0)
        return perr(&p, 0, "bad magic %02x %02x %02x %02x, expected \"GGUF\"", g->base[0],
                    g->base[1], g->base[2], g->base[3]);
    p.pos = 4;
    if ((rc = rd_uint(&p, &version, sizeof version, "version")) != 0)
        return rc;
    if (version == 1)
        return perr(&p, 4, "GGUF version 1 is not supported (versions 2 and 3 are)");
    if (version != 2 && version != 3) {
        if ((version & 0xffff) == 0 && version != 0)
            return perr(&p, 4,
                        "version 0x%08" PRIx32 " looks byte-swapped: big-endian files "
                        "are not supported",
                        version);
        return perr(&p, 4, "unsupported version %" PRIu32 " (versions 2 and 3 are)", version);
    }
    g->version = version;
    if ((rc = rd_uint(&p, &n_tensors, sizeof n_tensors, "n_tensors")) != 0 ||
        (rc = rd_uint(&p, &n_kv, sizeof n_kv, "n_kv")) != 0)
        return rc;
    p.ctx[0] = '\0';
    if ((rc = parse_kvs(&p, n_kv)) != 0)
        return rc;
    if ((rc = parse_alignment(&p)) != 0)
        return rc;
    if ((rc = parse_tensors(&p, n_tensors)) != 0)
        return rc;
    return check_data(&p);
}

static int open_common(eng_gguf_t *g, eng_gguf_t **out, char *err, size_t err_len)
{
    int rc = parse(g, err, err_len);
    if (rc == PC_ERR_NOMEM && err != NULL && err_len > 0)
        snprintf(err, err_len, "gguf: out of memory while indexing the header");
    if (rc != 0) {
        eng_gguf_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

int eng_gguf_open_mem(const void *data, size_t len, eng_gguf_t **out, char *err, size_t err_len)
{
    *out = NULL;
    if (err != NULL && err_len > 0)
        err[0] = '\0';
    eng_gguf_t *g = pc_calloc(1, sizeof *g);
    if (g == NULL)
        return PC_ERR_NOMEM;
    pc_arena_init(&g->arena, 64 * 1024);
    static const uint8_t empty[1];
    g->base = data != NULL ? data : empty;
    g->size = data != NULL ? len : 0;
    return open_common(g, out, err, err_len);
}

int eng_gguf_open(const char *path, eng_gguf_t **out, char *err, size_t err_len)
{
    *out = NULL;
    if (err != NULL && err_len > 0)
        err[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (err != NULL)
            snprintf(err, err_len, "gguf: cannot open '%s': %s", path, strerror(e));
        return PC_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int e = errno;
        if (err != NULL)
            snprintf(err, err_len, "gguf: '%s': %s", path,
                     S_ISREG(st.st_mode) ? strerror(e) : "not a regular file");
        close(fd);
        return PC_ERR_IO;
    }
    void *map = NULL;
    if (st.st_size > 0) {
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            if (err != NULL)
                snprintf(err, err_len, "gguf: cannot map '%s': %s", path, strerror(e));
            close(fd);
            return PC_ERR_IO;
        }
    }
    close(fd);
    eng_gguf_t *g = pc_calloc(1, sizeof *g);
    if (g == NULL) {
        if (map != NULL)
            munmap(map, (size_t)st.st_size);
        return PC_ERR_NOMEM;
    }
    pc_arena_init(&g->arena, 64 * 1024);
    static const uint8_t empty[1];
    g->map = map;
    g->map_len = (size_t)st.st_size;
    g->base = map != NULL ? map : empty;
    g->size = (uint64_t)st.st_size;
    return open_common(g, out, err, err_len);
}

void eng_gguf_drop_resident(eng_gguf_t *g, const void *p, size_t n)
{
    uintptr_t map = (uintptr_t)g->map, a = (uintptr_t)p;
    if (g->map == NULL || a < map || n > g->map_len || a - map > g->map_len - n)
        return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (a + page - 1) / page * page, hi = (a + n) / page * page;
    if (hi > lo) /* advice: a refusal changes nothing */
        (void)madvise((void *)lo, (size_t)(hi - lo), MADV_DONTNEED);
}

void eng_gguf_free(eng_gguf_t *g)
{
    if (g == NULL)
        return;
    if (g->map != NULL)
        munmap(g->map, g->map_len);
    pc_strmap_free(&g->kv_index);
    pc_strmap_free(&g->tensor_index);
    pc_arena_close(&g->arena);
    pc_free(g);
}

/* ---------------------------------------------------------------------------------------------
 * Accessors
 * ------------------------------------------------------------------------------------------- */

uint32_t eng_gguf_version(const eng_gguf_t *g)
{
    return g->version;
}
uint32_t eng_gguf_alignment(const eng_gguf_t *g)
{
    return g->alignment;
}
uint64_t eng_gguf_data_offset(const eng_gguf_t *g)
{
    return g->data_offset;
}
uint64_t eng_gguf_file_size(const eng_gguf_t *g)
{
    return g->size;
}
const uint8_t *eng_gguf_file_base(const eng_gguf_t *g)
{
    return g->base;
}
uint64_t eng_gguf_n_kv(const eng_gguf_t *g)
{
    return g->n_kv;
}
uint64_t eng_gguf_n_tensors(const eng_gguf_t *g)
{
    return g->n_tensors;
}

const char *eng_gguf_kv_key(const eng_gguf_t *g, uint64_t i)
{
    return i < g->n_kv ? g->kv[i].key : NULL;
}

const eng_gguf_val_t *eng_gguf_kv_val(const eng_gguf_t *g, uint64_t i)
{
    return i < g->n_kv ? &g->kv[i].val : NULL;
}

const eng_gguf_val_t *eng_gguf_get(const eng_gguf_t *g, const char *key)
{
    uint64_t i = index_find(&g->kv_index, key);
    return i < g->n_kv ? &g->kv[i].val : NULL;
}

const eng_gguf_tensor_t *eng_gguf_tensor_at(const eng_gguf_t *g, uint64_t i)
{
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const eng_gguf_tensor_t *eng_gguf_tensor_find(const eng_gguf_t *g, const char *name)
{
    uint64_t i = index_find(&g->tensor_index, name);
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Value conversions
 * ------------------------------------------------------------------------------------------- */

static bool is_int_type(uint32_t t)
{
    return t <= ENG_GGUF_I32 || t == ENG_GGUF_U64 || t == ENG_GGUF_I64;
}

/* An integer value: neg tells its sign; a negative value is exact in i, a non-negative one
 * exact in u (i is then clamped to INT64_MAX, u is 0 for negatives). */
typedef struct gint {
    int64_t i;
    uint64_t u;
    bool neg;
} gint_t;

/* Loads an integer of type t at s: 0, or PC_ERR_FORMAT when t is not an integer type. */
static int ld_int(uint32_t t, const uint8_t *s, gint_t *v)
{
    if (!is_int_type(t))
        return PC_ERR_FORMAT;
    /* The bytes are little-endian, like the host (see gguf.h): copy the width's low bytes,
     * then sign-extend the signed types (an arithmetic shift; 0 for the 64-bit ones). */
    unsigned w = vtype_sizes[t];
    uint64_t raw = 0;
    memcpy(&raw, s, w);
    bool is_signed =
        t == ENG_GGUF_I8 || t == ENG_GGUF_I16 || t == ENG_GGUF_I32 || t == ENG_GGUF_I64;
    if (is_signed) {
        unsigned shift = 64 - 8 * w;
        v->i = (int64_t)(raw << shift) >> shift;
        v->neg = v->i < 0;
        v->u = v->neg ? 0 : (uint64_t)v->i;
    } else {
        v->u = raw;
        v->neg = false;
        v->i = raw > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)raw;
    }
    return 0;
}

/* An integer of type t at s, checked against [lo, hi]: 0, PC_ERR_FORMAT (not an integer type)
 * or PC_ERR_RANGE. */
static int conv_i64(uint32_t t, const uint8_t *s, int64_t lo, int64_t hi, int64_t *out)
{
    gint_t v;
    if (ld_int(t, s, &v) != 0)
        return PC_ERR_FORMAT;
    if (v.neg ? v.i < lo : v.u > (uint64_t)hi)
        return PC_ERR_RANGE;
    *out = v.neg ? v.i : (int64_t)v.u;
    return 0;
}

static int conv_u64(uint32_t t, const uint8_t *s, uint64_t hi, uint64_t *out)
{
    gint_t v;
    if (ld_int(t, s, &v) != 0)
        return PC_ERR_FORMAT;
    if (v.neg || v.u > hi)
        return PC_ERR_RANGE;
    *out = v.u;
    return 0;
}

static int conv_f64(uint32_t t, const uint8_t *s, double *out)
{
    if (t == ENG_GGUF_F32) {
        float f;
        memcpy(&f, s, 4);
        *out = f;
        return 0;
    }
    if (t == ENG_GGUF_F64) {
        memcpy(out, s, 8);
        return 0;
    }
    return PC_ERR_FORMAT;
}

static bool is_scalar(const eng_gguf_val_t *v)
{
    return v != NULL && v->type < ENG_GGUF_VTYPE_COUNT && vtype_sizes[v->type] != 0;
}

int eng_gguf_val_u32(const eng_gguf_val_t *v, uint32_t *out)
{
    uint64_t u;
    if (!is_scalar(v))
        return PC_ERR_FORMAT;
    int rc = conv_u64(v->type, v->data, UINT32_MAX, &u);
    if (rc == 0)
        *out = (uint32_t)u;
    return rc;
}

int eng_gguf_val_u64(const eng_gguf_val_t *v, uint64_t *out)
{
    if (!is_scalar(v))
        return PC_ERR_FORMAT;
    return conv_u64(v->type, v->data, UINT64_MAX, out);
}

int eng_gguf_val_i32(const eng_gguf_val_t *v, int32_t *out)
{
    int64_t i;
    if (!is_scalar(v))
        return PC_ERR_FORMAT;
    int rc = conv_i64(v->type, v->data, INT32_MIN, INT32_MAX, &i);
    if (rc == 0)
        *out = (int32_t)i;
    return rc;
}

int eng_gguf_val_i64(const eng_gguf_val_t *v, int64_t *out)
{
    if (!is_scalar(v))
        return PC_ERR_FORMAT;
    return conv_i64(v->type, v->data, INT64_MIN, INT64_MAX, out);
}

int eng_gguf_val_f64(const eng_gguf_val_t *v, double *out)
{
    if (!is_scalar(v))
        return PC_ERR_FORMAT;
    return conv_f64(v->type, v->data, out);
}

int eng_gguf_val_f32(const eng_gguf_val_t *v, float *out)
{
    double d;
    if (!is_scalar(v))
        return PC_ERR_FORMAT;
    int rc = conv_f64(v->type, v->data, &d);
    if (rc == 0)
        *out = (float)d;
    return rc;
}

int eng_gguf_val_bool(const eng_gguf_val_t *v, bool *out)
{
    if (v == NULL || v->type != ENG_GGUF_BOOL)
        return PC_ERR_FORMAT;
    *out = v->data[0] != 0;
    return 0;
}

int eng_gguf_val_str(const eng_gguf_val_t *v, pc_slice_t *out)
{
    if (v == NULL || v->type != ENG_GGUF_STRING)
        return PC_ERR_FORMAT;
    *out = pc_slice((const char *)v->data, (size_t)v->n);
    return 0;
}

int eng_gguf_val_at(const eng_gguf_val_t *arr, uint64_t i, eng_gguf_val_t *out)
{
    if (arr == NULL || arr->type != ENG_GGUF_ARRAY)
        return PC_ERR_FORMAT;
    if (i >= arr->n)
        return PC_ERR_RANGE;
    uint32_t et = arr->elem_type;
    /* The element encoding starts 12 bytes (type + count) after the array's own offset. */
    const uint8_t *file_base = arr->data - (arr->offset + 12);
    if (et == ENG_GGUF_ARRAY) {
        *out = ((const eng_gguf_val_t *)arr->_index)[i];
        return 0;
    }
    memset(out, 0, sizeof *out);
    out->type = et;
    if (et == ENG_GGUF_STRING) {
        uint64_t off = ((const uint64_t *)arr->_index)[i];
        out->offset = off;
        out->n = ld_u64(file_base + off);
        out->data = file_base + off + 8;
        return 0;
    }
    out->n = 1;
    out->data = arr->data + i * vtype_sizes[et];
    out->offset = arr->offset + 12 + i * vtype_sizes[et];
    return 0;
}

int eng_gguf_arr_copy_i32(const eng_gguf_val_t *arr, int32_t *dst)
{
    if (arr == NULL || arr->type != ENG_GGUF_ARRAY || !is_int_type(arr->elem_type))
        return PC_ERR_FORMAT;
    uint32_t et = arr->elem_type, sz = vtype_sizes[et];
    if (et == ENG_GGUF_I32) {
        memcpy(dst, arr->data, (size_t)arr->n * 4);
        return 0;
    }
    for (uint64_t i = 0; i < arr->n; i++) {
        int64_t v;
        int rc = conv_i64(et, arr->data + i * sz, INT32_MIN, INT32_MAX, &v);
        if (rc != 0)
            return rc;
        dst[i] = (int32_t)v;
    }
    return 0;
}

int eng_gguf_arr_copy_f32(const eng_gguf_val_t *arr, float *dst)
{
    if (arr == NULL || arr->type != ENG_GGUF_ARRAY)
        return PC_ERR_FORMAT;
    if (arr->elem_type == ENG_GGUF_F32) {
        memcpy(dst, arr->data, (size_t)arr->n * 4);
        return 0;
    }
    if (arr->elem_type != ENG_GGUF_F64)
        return PC_ERR_FORMAT;
    for (uint64_t i = 0; i < arr->n; i++) {
        double d;
        memcpy(&d, arr->data + i * 8, 8);
        dst[i] = (float)d;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Typed getters by key
 * ------------------------------------------------------------------------------------------- */

static int get_fail(const char *key, const eng_gguf_val_t *v, int rc, const char *want, char *err,
                    size_t err_len)
{
    if (err == NULL || err_len == 0)
        return rc == PC_ERR_RANGE ? PC_ERR_FORMAT : rc;
    if (v == NULL)
        snprintf(err, err_len, "gguf: key '%s' missing", key);
    else if (rc == PC_ERR_RANGE)
        snprintf(err, err_len, "gguf: offset %" PRIu64 ": key '%s': value out of range for %s",
                 v->offset, key, want);
    else
        snprintf(err, err_len, "gguf: offset %" PRIu64 ": key '%s': type %s, expected %s",
                 v->offset, key, eng_gguf_vtype_name(v->type), want);
    return v == NULL ? PC_ERR_NOTFOUND : PC_ERR_FORMAT;
}

#define GGUF_GETTER(fn, ctype, conv, want)                                                         \
    int fn(const eng_gguf_t *g, const char *key, ctype *out, char *err, size_t err_len)            \
    {                                                                                              \
        const eng_gguf_val_t *v = eng_gguf_get(g, key);                                            \
        ctype tmp;                                                                                 \
        int rc = v != NULL ? conv(v, &tmp) : PC_ERR_NOTFOUND;                                      \
        if (rc != 0)                                                                               \
            return get_fail(key, v, rc, want, err, err_len);                                       \
        *out = tmp;                                                                                \
        return 0;                                                                                  \
    }

GGUF_GETTER(eng_gguf_get_u32, uint32_t, eng_gguf_val_u32, "an unsigned 32-bit integer")
GGUF_GETTER(eng_gguf_get_i32, int32_t, eng_gguf_val_i32, "a signed 32-bit integer")
GGUF_GETTER(eng_gguf_get_u64, uint64_t, eng_gguf_val_u64, "an unsigned 64-bit integer")
GGUF_GETTER(eng_gguf_get_f32, float, eng_gguf_val_f32, "f32 or f64")
GGUF_GETTER(eng_gguf_get_bool, bool, eng_gguf_val_bool, "bool")
GGUF_GETTER(eng_gguf_get_str, pc_slice_t, eng_gguf_val_str, "string")

int eng_gguf_get_arr(const eng_gguf_t *g, const char *key, uint32_t elem_type,
                     const eng_gguf_val_t **out, char *err, size_t err_len)
{
    const eng_gguf_val_t *v = eng_gguf_get(g, key);
    if (v == NULL)
        return get_fail(key, v, PC_ERR_NOTFOUND, "array", err, err_len);
    if (v->type != ENG_GGUF_ARRAY ||
        (elem_type < ENG_GGUF_VTYPE_COUNT && v->elem_type != elem_type)) {
        if (err != NULL && err_len > 0) {
            if (v->type != ENG_GGUF_ARRAY)
                snprintf(err, err_len,
                         "gguf: offset %" PRIu64 ": key '%s': type %s, expected "
                         "array of %s",
                         v->offset, key, eng_gguf_vtype_name(v->type),
                         eng_gguf_vtype_name(elem_type));
            else
                snprintf(err, err_len,
                         "gguf: offset %" PRIu64 ": key '%s': array of %s, "
                         "expected array of %s",
                         v->offset, key, eng_gguf_vtype_name(v->elem_type),
                         eng_gguf_vtype_name(elem_type));
        }
        return PC_ERR_FORMAT;
    }
    *out = v;
    return 0;
}
