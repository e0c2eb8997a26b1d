/*
 * gguf.h — GGUF files: a memory-mapped, bounds-checked reader and a streaming writer.
 *
 * GGUF is llama.cpp's model file format. kvgw reads versions 2 and 3 (identical layouts; v1,
 * with 32-bit counts, is rejected) and writes version 3. Everything is little-endian; a file
 * whose version reads byte-swapped is reported as big-endian and rejected.
 *
 * File layout, byte by byte (offsets from the start of the file):
 *
 *   0   char[4]  magic "GGUF"
 *   4   u32      version (2 or 3)
 *   8   u64      n_tensors
 *   16  u64      n_kv
 *   24  n_kv key/value pairs:
 *         string  key            (a string is: u64 n_bytes, then n_bytes of UTF-8, no NUL)
 *         u32     value type     (enum eng_gguf_vtype)
 *         ...     value          scalars: 1/2/4/8 bytes; bool: 1 byte (0 or 1);
 *                                string: as above;
 *                                array: u32 element type, u64 n, then n elements encoded
 *                                       like values of that type (arrays may nest)
 *       n_tensors tensor infos:
 *         string  name           (at most ENG_GGUF_MAX_NAME bytes, as ggml)
 *         u32     n_dims         (1..4)
 *         i64     ne[n_dims]     elements per dimension, ne[0] varies fastest (for a weight
 *                                matrix ne[0] is the input width: attn_q.weight is
 *                                [n_embd, n_embd], token_embd.weight is [n_embd, n_vocab])
 *         u32     type           (enum eng_ggml_type)
 *         u64     offset         of the tensor's data from the start of the data section; a
 *                                multiple of the alignment
 *       zero padding to the next multiple of the alignment
 *   D   data section: tensor data, each tensor padded with zeros to the alignment.
 *
 * The alignment is the u32 value of key "general.alignment" (a power of two), 32 if absent.
 *
 * Reader guarantees. eng_gguf_open validates the whole header before returning: every length
 * and count against the bytes that remain (overflow-safe), value types, nesting depth
 * (ENG_GGUF_MAX_DEPTH), bool bytes, duplicate keys and tensor names, the alignment, tensor
 * dimensions (n_dims 1..4, each ne >= 1, products within int64), block-size divisibility of
 * ne[0] for block types, known tensor type ids, and that every tensor's data lies inside the
 * file, is aligned and overlaps no other. After a successful open no accessor can read outside
 * the mapping. A bad file yields PC_ERR_FORMAT and one line such as
 *   "gguf: offset 1234: metadata key #7 'general.name': string length 999999 exceeds file size"
 * in the caller's err buffer.
 *
 * Tensor types: every ggml type id is known (name, block size, bytes per block: the table is
 * quant.c's) so any valid file opens, but the engine computes only F32, F16, BF16, Q8_0, Q4_0,
 * Q4_K, Q5_K and Q6_K (eng_ggml_type_supported; the block layouts are in quant.h); the model
 * loader reports the others as "unsupported tensor type Q2_K in tensor blk.0.attn_q.weight".
 *
 * Lifetime: every pointer an accessor returns (values, strings, tensor data, names) points into
 * the eng_gguf_t or its mapping and stays valid until eng_gguf_free. An open eng_gguf_t is
 * immutable, so concurrent readers need no lock.
 */
#ifndef ENG_GGUF_H
#define ENG_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pc_buf.h"

#define ENG_GGUF_MAGIC "GGUF"
#define ENG_GGUF_VERSION 3
#define ENG_GGUF_DEFAULT_ALIGNMENT 32
#define ENG_GGUF_MAX_DIMS 4
#define ENG_GGUF_MAX_NAME 63 /* tensor name bytes (ggml's GGML_MAX_NAME - 1) */
#define ENG_GGUF_MAX_DEPTH 8 /* array nesting: an array of arrays of ... at most this deep */

/* Metadata value types (the u32 type tags of the format). */
enum eng_gguf_vtype {
    ENG_GGUF_U8 = 0,
    ENG_GGUF_I8 = 1,
    ENG_GGUF_U16 = 2,
    ENG_GGUF_I16 = 3,
    ENG_GGUF_U32 = 4,
    ENG_GGUF_I32 = 5,
    ENG_GGUF_F32 = 6,
    ENG_GGUF_BOOL = 7,
    ENG_GGUF_STRING = 8,
    ENG_GGUF_ARRAY = 9,
    ENG_GGUF_U64 = 10,
    ENG_GGUF_I64 = 11,
    ENG_GGUF_F64 = 12,
    ENG_GGUF_VTYPE_COUNT = 13,
};

/* Tensor element types: ggml's enum ggml_type ids (gaps are ids ggml retired). */
enum eng_ggml_type {
    ENG_GGML_TYPE_F32 = 0,
    ENG_GGML_TYPE_F16 = 1,
    ENG_GGML_TYPE_Q4_0 = 2,
    ENG_GGML_TYPE_Q4_1 = 3,
    ENG_GGML_TYPE_Q5_0 = 6,
    ENG_GGML_TYPE_Q5_1 = 7,
    ENG_GGML_TYPE_Q8_0 = 8,
    ENG_GGML_TYPE_Q8_1 = 9,
    ENG_GGML_TYPE_Q2_K = 10,
    ENG_GGML_TYPE_Q3_K = 11,
    ENG_GGML_TYPE_Q4_K = 12,
    ENG_GGML_TYPE_Q5_K = 13,
    ENG_GGML_TYPE_Q6_K = 14,
    ENG_GGML_TYPE_Q8_K = 15,
    ENG_GGML_TYPE_IQ2_XXS = 16,
    ENG_GGML_TYPE_IQ2_XS = 17,
    ENG_GGML_TYPE_IQ3_XXS = 18,
    ENG_GGML_TYPE_IQ1_S = 19,
    ENG_GGML_TYPE_IQ4_NL = 20,
    ENG_GGML_TYPE_IQ3_S = 21,
    ENG_GGML_TYPE_IQ2_S = 22,
    ENG_GGML_TYPE_IQ4_XS = 23,
    ENG_GGML_TYPE_I8 = 24,
    ENG_GGML_TYPE_I16 = 25,
    ENG_GGML_TYPE_I32 = 26,
    ENG_GGML_TYPE_I64 = 27,
    ENG_GGML_TYPE_F64 = 28,
    ENG_GGML_TYPE_IQ1_M = 29,
    ENG_GGML_TYPE_BF16 = 30,
    ENG_GGML_TYPE_TQ1_0 = 34,
    ENG_GGML_TYPE_TQ2_0 = 35,
    ENG_GGML_TYPE_MXFP4 = 39,
    ENG_GGML_TYPE_COUNT = 40,
};

/* Q8_0 block: an F16 scale d then 32 int8 quants; element i = d * qs[i]. 34 bytes. */
#define ENG_QK8_0 32

/* The name of a tensor type ("F16", "Q4_K"), or NULL for an id ggml does not define. */
const char *eng_ggml_type_name(uint32_t type);

/* Elements per block (1 for plain types) and bytes per block; 0 for an unknown id. */
uint32_t eng_ggml_type_block_size(uint32_t type);
uint32_t eng_ggml_type_block_bytes(uint32_t type);

/* True for the types the engine computes with: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K. */
bool eng_ggml_type_supported(uint32_t type);

/* The name of a metadata value type ("u32", "string", "array"), or "?" for an unknown tag. */
const char *eng_gguf_vtype_name(uint32_t vtype);

/* ---------------------------------------------------------------------------------------------
 * Reader
 * ------------------------------------------------------------------------------------------- */

typedef struct eng_gguf eng_gguf_t;

/*
 * A metadata value: a view into the file (no copies). For scalars `data` points at the
 * little-endian bytes (possibly unaligned: read them through the eng_gguf_val_* functions). For
 * a string, `data`/`n` are its bytes and length (not NUL-terminated). For an array, `elem_type`
 * is the element type, `n` the element count, and `data` the first element's encoding;
 * elements are reached with eng_gguf_val_at (any type) or copied out in bulk. The `_index`
 * field is the reader's own (element offsets of string arrays, children of arrays of arrays).
 */
typedef struct eng_gguf_val {
    uint32_t type;      /* enum eng_gguf_vtype */
    uint32_t elem_type; /* for ENG_GGUF_ARRAY, the element type; otherwise unused */
    uint64_t n;         /* array: element count; string: byte length; scalar: 1 */
    const uint8_t *data;
    uint64_t offset;    /* file offset of the value's encoding (for messages) */
    const void *_index; /* private */
} eng_gguf_val_t;

/* One tensor as described by the header; `data` points into the mapping, `n_bytes` long. */
typedef struct eng_gguf_tensor {
    const char *name;              /* NUL-terminated copy owned by the reader */
    uint32_t n_dims;               /* 1..4 */
    uint32_t type;                 /* enum eng_ggml_type */
    int64_t ne[ENG_GGUF_MAX_DIMS]; /* elements per dim; dims past n_dims are 1 */
    int64_t n_elements;
    uint64_t offset;  /* from the start of the data section */
    uint64_t n_bytes; /* exact size of the data (without padding) */
    const void *data; /* file base + data offset + offset; aligned to the file's alignment
                         relative to the (page-aligned) mapping */
} eng_gguf_tensor_t;

/* Maps and validates a file. On success *out owns the mapping (free with eng_gguf_free).
 * Returns 0, PC_ERR_IO (cannot open/stat/map; reason with strerror in err), PC_ERR_FORMAT
 * (invalid file; err names the offset and the field) or PC_ERR_NOMEM. err may be NULL. */
int eng_gguf_open(const char *path, eng_gguf_t **out, char *err, size_t err_len);

/* Same as eng_gguf_open for bytes already in memory. The bytes are not copied: they must stay
 * unchanged until eng_gguf_free. Used by tests and the fuzzer. */
int eng_gguf_open_mem(const void *data, size_t len, eng_gguf_t **out, char *err, size_t err_len);

/* Unmaps and releases everything; every pointer obtained from g becomes invalid. NULL is a
 * no-op. */
void eng_gguf_free(eng_gguf_t *g);

/* Tells the kernel the mapped pages wholly inside [p, p + n) are not needed now (the caller has
 * copied what it reads there); they are read back from the file if touched again. A range
 * outside the mapping, or an in-memory file, is a no-op. */
void eng_gguf_drop_resident(eng_gguf_t *g, const void *p, size_t n);

uint32_t eng_gguf_version(const eng_gguf_t *g);
uint32_t eng_gguf_alignment(const eng_gguf_t *g);
uint64_t eng_gguf_data_offset(const eng_gguf_t *g); /* file offset of the data section */
uint64_t eng_gguf_file_size(const eng_gguf_t *g);
const uint8_t *eng_gguf_file_base(const eng_gguf_t *g); /* the whole mapped file */

/* Metadata in file order. Index i is in [0, eng_gguf_n_kv). Names are NUL-terminated copies
 * (the reader rejects keys that contain a NUL byte). */
uint64_t eng_gguf_n_kv(const eng_gguf_t *g);
const char *eng_gguf_kv_key(const eng_gguf_t *g, uint64_t i);
const eng_gguf_val_t *eng_gguf_kv_val(const eng_gguf_t *g, uint64_t i);

/* The value of `key`, or NULL when the file has no such key. O(1) (hash index). */
const eng_gguf_val_t *eng_gguf_get(const eng_gguf_t *g, const char *key);

/* Typed getters for a key. Each returns 0 with the result in *out, PC_ERR_NOTFOUND when the key
 * is absent (out untouched), or PC_ERR_FORMAT when the value has the wrong type or does not fit
 * (integers convert from any integer type when the value is in range; floats from f32 or f64;
 * get_str gives a view of the bytes). With err not NULL, a failure writes a line naming the
 * key ("gguf: key 'llama.block_count' missing"). */
int eng_gguf_get_u32(const eng_gguf_t *g, const char *key, uint32_t *out, char *err,
                     size_t err_len);
int eng_gguf_get_i32(const eng_gguf_t *g, const char *key, int32_t *out, char *err, size_t err_len);
int eng_gguf_get_u64(const eng_gguf_t *g, const char *key, uint64_t *out, char *err,
                     size_t err_len);
int eng_gguf_get_f32(const eng_gguf_t *g, const char *key, float *out, char *err, size_t err_len);
int eng_gguf_get_bool(const eng_gguf_t *g, const char *key, bool *out, char *err, size_t err_len);
int eng_gguf_get_str(const eng_gguf_t *g, const char *key, pc_slice_t *out, char *err,
                     size_t err_len);
/* An array value whose elements have type elem_type (ENG_GGUF_VTYPE_COUNT = any). */
int eng_gguf_get_arr(const eng_gguf_t *g, const char *key, uint32_t elem_type,
                     const eng_gguf_val_t **out, char *err, size_t err_len);

/* Value conversions, same rules as the getters: 0, or PC_ERR_FORMAT (wrong type) / PC_ERR_RANGE
 * (an integer that does not fit). */
int eng_gguf_val_u32(const eng_gguf_val_t *v, uint32_t *out);
int eng_gguf_val_i32(const eng_gguf_val_t *v, int32_t *out);
int eng_gguf_val_u64(const eng_gguf_val_t *v, uint64_t *out);
int eng_gguf_val_i64(const eng_gguf_val_t *v, int64_t *out);
int eng_gguf_val_f32(const eng_gguf_val_t *v, float *out);
int eng_gguf_val_f64(const eng_gguf_val_t *v, double *out);
int eng_gguf_val_bool(const eng_gguf_val_t *v, bool *out);
int eng_gguf_val_str(const eng_gguf_val_t *v, pc_slice_t *out);

/* Element i of an array as a value of its own (scalar, string or nested array), O(1).
 * Returns 0, PC_ERR_FORMAT (v is not an array) or PC_ERR_RANGE (i >= v->n). */
int eng_gguf_val_at(const eng_gguf_val_t *arr, uint64_t i, eng_gguf_val_t *out);

/* Bulk copies of a whole array into dst[arr->n], converting each element like the scalar
 * conversions (copy_i32: any integer type in range; copy_f32: f32 or f64). Returns 0,
 * PC_ERR_FORMAT or PC_ERR_RANGE (dst contents unspecified then). */
int eng_gguf_arr_copy_i32(const eng_gguf_val_t *arr, int32_t *dst);
int eng_gguf_arr_copy_f32(const eng_gguf_val_t *arr, float *dst);

/* Tensors in file order, or by name (NULL when absent; O(1)). */
uint64_t eng_gguf_n_tensors(const eng_gguf_t *g);
const eng_gguf_tensor_t *eng_gguf_tensor_at(const eng_gguf_t *g, uint64_t i);
const eng_gguf_tensor_t *eng_gguf_tensor_find(const eng_gguf_t *g, const char *name);

/* ---------------------------------------------------------------------------------------------
 * Writer
 *
 * Usage: init; set metadata (any order; keys are written in the order set); declare every
 * tensor (name, type, shape); file_begin writes the header to "<path>.tmp"; then the data of
 * each tensor in declaration order, in as many tensor_write chunks as convenient (the writer
 * pads each tensor to the alignment when its last byte arrives); file_finish flushes, fsyncs
 * and renames onto path. Nothing is held in memory but the header, so multi-GB files stream.
 * A failed or abandoned write (eng_gguf_writer_free before file_finish) removes the temporary
 * file and leaves any existing file at path untouched.
 * ------------------------------------------------------------------------------------------- */

typedef struct eng_gguf_writer eng_gguf_writer_t;

/* A new writer with the given data alignment (a power of two, at least 8; 0 means the default
 * 32). When the alignment is not 32 the writer records "general.alignment" itself, as its
 * first key. Returns 0, PC_ERR_INVAL or PC_ERR_NOMEM. */
int eng_gguf_writer_init(uint32_t alignment, eng_gguf_writer_t **out);

/* Releases the writer; an unfinished output file is closed and removed. NULL is a no-op. */
void eng_gguf_writer_free(eng_gguf_writer_t *w);

/* Scalar and string metadata. Each returns 0, PC_ERR_EXISTS (key already set), PC_ERR_STATE
 * (an array is open, or the header is already written), PC_ERR_INVAL or PC_ERR_NOMEM; on
 * failure the writer is unchanged. */
int eng_gguf_writer_set_u8(eng_gguf_writer_t *w, const char *key, uint8_t v);
int eng_gguf_writer_set_i8(eng_gguf_writer_t *w, const char *key, int8_t v);
int eng_gguf_writer_set_u16(eng_gguf_writer_t *w, const char *key, uint16_t v);
int eng_gguf_writer_set_i16(eng_gguf_writer_t *w, const char *key, int16_t v);
int eng_gguf_writer_set_u32(eng_gguf_writer_t *w, const char *key, uint32_t v);
int eng_gguf_writer_set_i32(eng_gguf_writer_t *w, const char *key, int32_t v);
int eng_gguf_writer_set_u64(eng_gguf_writer_t *w, const char *key, uint64_t v);
int eng_gguf_writer_set_i64(eng_gguf_writer_t *w, const char *key, int64_t v);
int eng_gguf_writer_set_f32(eng_gguf_writer_t *w, const char *key, float v);
int eng_gguf_writer_set_f64(eng_gguf_writer_t *w, const char *key, double v);
int eng_gguf_writer_set_bool(eng_gguf_writer_t *w, const char *key, bool v);
int eng_gguf_writer_set_str(eng_gguf_writer_t *w, const char *key, const char *s);
int eng_gguf_writer_set_strn(eng_gguf_writer_t *w, const char *key, const char *s, size_t len);

/* An array of n fixed-size elements (any type but STRING and ARRAY) in host order, which must
 * be little-endian; bool elements must be 0 or 1. Same returns as the scalar setters. */
int eng_gguf_writer_set_arr(eng_gguf_writer_t *w, const char *key, uint32_t elem_type,
                            const void *elems, uint64_t n);
/* An array of n NUL-terminated strings. */
int eng_gguf_writer_set_arr_str(eng_gguf_writer_t *w, const char *key, const char *const *strs,
                                uint64_t n);

/* Arrays of any shape, nested included: arr_begin opens an array value for `key` (key NULL:
 * the array is the next element of the innermost open array, which must have element type
 * ARRAY); then exactly n elements are pushed with push_scalar (v points at one element of the
 * array's fixed-size type), push_str, or a nested arr_begin. An array closes by itself once its
 * n-th element is pushed. Returns 0, PC_ERR_STATE (wrong element type for the open array, no
 * open array, or too many nesting levels), PC_ERR_EXISTS, PC_ERR_INVAL or PC_ERR_NOMEM. */
int eng_gguf_writer_arr_begin(eng_gguf_writer_t *w, const char *key, uint32_t elem_type,
                              uint64_t n);
int eng_gguf_writer_push_scalar(eng_gguf_writer_t *w, const void *v);
int eng_gguf_writer_push_str(eng_gguf_writer_t *w, const char *s, size_t len);

/* Declares a tensor: its data follows in declaration order. ne[0] must be a multiple of the
 * type's block size; 1 <= n_dims <= 4; each ne >= 1; name at most ENG_GGUF_MAX_NAME bytes and
 * unique. Returns 0, PC_ERR_EXISTS, PC_ERR_INVAL, PC_ERR_STATE or PC_ERR_NOMEM. */
int eng_gguf_writer_tensor_add(eng_gguf_writer_t *w, const char *name, uint32_t type,
                               uint32_t n_dims, const int64_t *ne);

/* Bytes of declared tensor i (exact, without padding); 0 if i is out of range. */
uint64_t eng_gguf_writer_tensor_bytes(const eng_gguf_writer_t *w, uint64_t i);

/* Creates "<path>.tmp" and writes magic, counts, metadata, tensor infos and padding. Returns 0,
 * PC_ERR_STATE (an array is still open or the file is already begun) or PC_ERR_IO (with the
 * reason in err). */
int eng_gguf_writer_file_begin(eng_gguf_writer_t *w, const char *path, char *err, size_t err_len);

/* Appends n bytes of tensor data: the bytes continue the current tensor and may complete it
 * and start the next ones. Returns 0, PC_ERR_RANGE (more bytes than the declared tensors
 * hold), PC_ERR_STATE (no file begun) or PC_ERR_IO. */
int eng_gguf_writer_tensor_write(eng_gguf_writer_t *w, const void *data, size_t n, char *err,
                                 size_t err_len);

/* Checks that every declared tensor is complete, flushes, fsyncs, and renames the temporary
 * file onto path. Returns 0, PC_ERR_STATE (tensors incomplete; the file is removed) or
 * PC_ERR_IO. The writer can only be freed afterwards. */
int eng_gguf_writer_file_finish(eng_gguf_writer_t *w, char *err, size_t err_len);

#endif
