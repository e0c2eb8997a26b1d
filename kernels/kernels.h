/*
 * kernels.h — the CUDA kernels of the cuda backend behind a plain C ABI, and their CPU
 * references.
 *
 * Every kernel takes one argument struct of pointers and sizes (no engine headers), and has a
 * CPU reference of the same name with the krn_ref_ prefix that takes the same struct with host
 * pointers: krn_rmsnorm(ctx, &a) on device memory computes what krn_ref_rmsnorm(&a) computes on
 * host memory. The references are always built (kernels/ref/); the CUDA entry points only when
 * nvcc was found (KVGW_HAVE_CUDA), and tests compare the two on random inputs.
 *
 * Conventions
 *   - Activations are row-major F32: a [n_rows][width] matrix is rows of `width` floats.
 *   - Every index that is a block id, a row or a position is int32_t; every product of a block
 *     id (or a row) with a stride is computed in int64_t.
 *   - A CUDA entry point only enqueues work on the context's stream and returns 0, or a
 *     negative PC_ERR_* (common/pc_err.h) value: PC_ERR_INVAL for bad sizes (nothing enqueued),
 *     PC_ERR_INTERNAL for a failed CUDA or cuBLAS call (logged with file and line). Results are
 *     visible after krn_ctx_sync.
 *
 * The paged KV layout is the engine's (engine/kvpool.h), byte for byte, so blocks can move
 * between the host pool and the device pool unchanged. For block b, layer l, KV head h:
 *
 *   base + ((b * n_layer + l) * n_head_kv + h) * 2 * head_dim * block_tokens   elements
 *     K: [head_dim][block_tokens]   (transposed: row d holds dimension d of every slot)
 *     V: [block_tokens][head_dim]   (follows K)
 *
 * Position p of a sequence lives in block block_table[p / block_tokens], slot p % block_tokens.
 *
 * A KRN_Q8_0 pool (head_dim a multiple of 32) holds ggml's q8_0 blocks, as the engine's
 * ENG_KV_Q8_0 pool does: K and V are both per-token rows of head_dim / 32 blocks of 34 bytes
 * (an F16 scale d, then 32 int8 quants q; value = d * q), K not transposed:
 *
 *   base + ((b * n_layer + l) * n_head_kv + h) * 2 * block_tokens * row_bytes   bytes,
 *   row_bytes = head_dim / 32 * 34
 *     K: [block_tokens] rows        V: [block_tokens] rows (follows K)
 *
 * Each row is quantized alone when it is written (krn_q8_0_quantize_block, the bytes of the
 * engine's eng_kv_q8_0_quantize), so the same K/V give the same bytes on the CPU and the GPU,
 * and the blocks move between the host pool, the device pool and the KV tiers unchanged. The
 * attention kernels read the blocks in place (no dequantized copy of the cache) and quantize
 * each query head to q8_0 too, as the CPU attention does: a score is then sum over blocks of
 * d_q * d_k * (exact integer dot of the quants).
 */
#ifndef KRN_KERNELS_H
#define KRN_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of KV blocks, weights and GEMM inputs. */
enum krn_dtype {
    KRN_F32 = 0,
    KRN_F16 = 1,
    KRN_BF16 = 2,
    KRN_Q8_0 = 3, /* KV pools only: ggml's q8_0 blocks (layout above) */
};

/* Bytes of one element of dtype t (4 or 2; not for KRN_Q8_0, whose unit is a 34-byte block
 * of 32 values: krn_kv_row_bytes). */
static inline size_t krn_dtype_size(enum krn_dtype t)
{
    return t == KRN_F32 ? 4 : 2;
}

/* Values of one q8_0 block, and its bytes (F16 scale + 32 int8 quants). */
#define KRN_QK8_0 32
#define KRN_Q8_0_BYTES 34

/* IEEE half and bfloat16 conversions on the host (round to nearest even on the way down; NaN
 * stays NaN). Exact for every half and bfloat16 value on the way up. */
float krn_f16_to_f32(uint16_t h);
uint16_t krn_f32_to_f16(float f);
float krn_bf16_to_f32(uint16_t h);
uint16_t krn_f32_to_bf16(float f);

/* q8_0 on the host (kernels/ref/krn_ref_kv.c): x[n] (n a multiple of 32) into n / 32 blocks at
 * dst, as ggml's quantize_row_q8_0_ref and the engine's eng_kv_q8_0_quantize, byte for byte:
 * per block amax = max |x| (NaN skipped), d = amax / 127, q = round(x / d) half away from
 * zero (x * (1 / d), a NaN or out-of-range product 0), d stored as F16 (0 for an all-zero
 * block). The kernels quantize with the same steps (krn_hostdev.h). The inverse writes d * q
 * (exact in F32). */
void krn_q8_0_quantize(const float *x, int32_t n, uint8_t *dst);
void krn_q8_0_dequantize(const uint8_t *src, int32_t n, float *y);

/* The paged KV pool (layout above). */
typedef struct krn_kv {
    void *base; /* [n_blocks][n_layer][n_head_kv][2][head_dim * block_tokens] of dtype */
    int32_t n_blocks;
    int32_t n_layer;
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t block_tokens;
    enum krn_dtype dtype; /* KRN_F16, KRN_F32 or KRN_Q8_0 */
} krn_kv_t;

/* Bytes of one position's K (or V) row of one (layer, head): head_dim x 2 or 4, or head_dim /
 * 32 x 34 for q8_0. */
static inline size_t krn_kv_row_bytes(const krn_kv_t *kv)
{
    if (kv->dtype == KRN_Q8_0)
        return (size_t)(kv->head_dim / KRN_QK8_0) * KRN_Q8_0_BYTES;
    return (size_t)kv->head_dim * krn_dtype_size(kv->dtype);
}
/* Bytes of one (block, layer, head) slice: K then V, block_tokens rows each. */
static inline size_t krn_kv_slice_bytes(const krn_kv_t *kv)
{
    return (size_t)2 * (size_t)kv->block_tokens * krn_kv_row_bytes(kv);
}
/* Byte offset of the slice of (block, layer, head), every dtype. */
static inline int64_t krn_kv_slice_byte_offset(const krn_kv_t *kv, int32_t block, int32_t layer,
                                               int32_t head)
{
    return (((int64_t)block * kv->n_layer + layer) * kv->n_head_kv + head) *
           (int64_t)krn_kv_slice_bytes(kv);
}

/* Elements of one (block, layer, head) slice of an F16 or F32 pool: K then V. */
static inline int64_t krn_kv_slice_elems(const krn_kv_t *kv)
{
    return (int64_t)2 * kv->head_dim * kv->block_tokens;
}
/* Element offset of the slice of (block, layer, head) of an F16 or F32 pool. */
static inline int64_t krn_kv_slice_offset(const krn_kv_t *kv, int32_t block, int32_t layer,
                                          int32_t head)
{
    return (((int64_t)block * kv->n_layer + layer) * kv->n_head_kv + head) * krn_kv_slice_elems(kv);
}
/* Bytes of one block (every layer and head). */
static inline size_t krn_kv_block_bytes(const krn_kv_t *kv)
{
    return (size_t)kv->n_layer * (size_t)kv->n_head_kv * krn_kv_slice_bytes(kv);
}

/* ---------------------------------------------------------------------------------------------
 * Element-wise kernels
 * ------------------------------------------------------------------------------------------- */

/* out[r][:] = table[ids[r]][:] converted to F32. */
typedef struct krn_embed_args {
    const void *table;  /* [n_vocab][width] of table_dtype */
    const int32_t *ids; /* [n_rows], each in [0, n_vocab) */
    float *out;         /* [n_rows][width] */
    int32_t n_rows, width, n_vocab;
    enum krn_dtype table_dtype;
} krn_embed_args_t;

/* y[r][:] = x[r][:] / sqrt(mean(x[r][:]^2) + eps) * w[:]. y may equal x (in place). Also the
 * per-head q/k norm of qwen3, with rows = tokens * heads and width = head_dim. */
typedef struct krn_rmsnorm_args {
    const float *x; /* [n_rows][width] */
    const float *w; /* [width] */
    float *y;       /* [n_rows][width] */
    int32_t n_rows, width;
    float eps;
} krn_rmsnorm_args_t;

/* RoPE in place over x[n_rows][n_heads * head_dim], then every element times post_scale (the
 * 1/sqrt(head_dim) of q; 1 for k). Row r rotates by angle pos[r] * inv_freq[i] (computed in
 * double, as the CPU backend does; inv_freq already holds Llama 3.1's frequency factors):
 * NORM style rotates (x[2i], x[2i+1]), NEOX style (x[i], x[i + rope_dim/2]), i < rope_dim/2;
 * dimensions past rope_dim are left as they are. */
enum krn_rope_style {
    KRN_ROPE_NORM = 0,
    KRN_ROPE_NEOX = 2,
};
typedef struct krn_rope_args {
    float *x;              /* [n_rows][n_heads * head_dim] */
    const int32_t *pos;    /* [n_rows] */
    const float *inv_freq; /* [rope_dim / 2] */
    int32_t n_rows, n_heads, head_dim, rope_dim;
    enum krn_rope_style style;
    float post_scale;
} krn_rope_args_t;

/* g[i] = silu(g[i]) * u[i] = g / (1 + exp(-g)) * u, over n elements. */
typedef struct krn_swiglu_args {
    float *g;       /* [n] */
    const float *u; /* [n] */
    int64_t n;
} krn_swiglu_args_t;

/* x[i] += y[i] over n elements (the residual stream). */
typedef struct krn_add_args {
    float *x;       /* [n] */
    const float *y; /* [n] */
    int64_t n;
} krn_add_args_t;

/* x[r][j] += b[j]. */
typedef struct krn_bias_add_args {
    float *x;       /* [n_rows][width] */
    const float *b; /* [width] */
    int32_t n_rows, width;
} krn_bias_add_args_t;

/* F32 rows to F16 or BF16 (the GEMM's input type), round to nearest even. */
typedef struct krn_convert_args {
    const float *x; /* [n] */
    void *y;        /* [n] of dtype */
    int64_t n;
    enum krn_dtype dtype; /* KRN_F16 or KRN_BF16 */
} krn_convert_args_t;

/* ---------------------------------------------------------------------------------------------
 * Paged KV
 * ------------------------------------------------------------------------------------------- */

/* Writes the K and V rows of one layer into the pool at each row's position. */
typedef struct krn_kv_write_args {
    krn_kv_t kv;
    int32_t layer;
    const float *k;              /* [n_rows][n_head_kv * head_dim] (roped) */
    const float *v;              /* [n_rows][n_head_kv * head_dim] */
    const int32_t *row_seq;      /* [n_rows] the row's sequence: a row of block_tables */
    const int32_t *row_pos;      /* [n_rows] */
    const int32_t *block_tables; /* [n_seqs][max_blocks] */
    int32_t n_rows, max_blocks;
} krn_kv_write_args_t;

/* Copies blocks inside the pool: for each i, the first n_tokens[i] positions of block src[i]
 * into block dst[i], every layer and head (slots past n_tokens are left as they are, so
 * poisoned slots stay poisoned). n_tokens NULL copies whole blocks. */
typedef struct krn_block_copy_args {
    krn_kv_t kv;
    const int32_t *src;      /* [n] */
    const int32_t *dst;      /* [n] */
    const int32_t *n_tokens; /* [n] or NULL */
    int32_t n;
} krn_block_copy_args_t;

/* ---------------------------------------------------------------------------------------------
 * Paged attention (prefill and decode)
 *
 * One task computes, for the query rows [row0, row0 + n_rows) of one sequence (consecutive
 * positions, ascending) and the `group` query heads of one KV head, the attention over the KV
 * positions [kv0, kv1), causal (a row at position p sees positions <= p). kv1 never exceeds
 * the last row's position + 1, so no slot past the written positions is read.
 *
 * A task with part < 0 covers all of [0, last pos] and writes normalized outputs to out. A
 * split task (decode over a long context) writes its unnormalized partial state (o, m, l) to
 * the partial slots part .. part + n_rows * group - 1; a merge then combines the splits of one
 * (rows, KV head) unit with the online-softmax merge of krn_softmax_merge.h.
 * ------------------------------------------------------------------------------------------- */

/* Most query rows (tokens x heads of a group) one task holds, and the most elements of the
 * task's query tile (rows x head_dim). */
#define KRN_ATTN_MAX_ROWS 64
#define KRN_ATTN_MAX_TILE 8192
/* Largest head_dim the attention kernels take. */
#define KRN_ATTN_MAX_HEAD_DIM 256

typedef struct krn_attn_task {
    int32_t seq;     /* the row of block_tables */
    int32_t kv_head; /* query heads kv_head * group .. + group - 1 */
    int32_t row0;    /* first batch row */
    int32_t n_rows;  /* tokens; n_rows * group <= KRN_ATTN_MAX_ROWS */
    int32_t kv0;     /* KV positions [kv0, kv1) */
    int32_t kv1;
    int32_t part; /* -1: direct output; else the first partial slot */
} krn_attn_task_t;

/* Combines n_splits partial states: split s of row-head i is slot part0 + s * width + i, with
 * width = n_rows * group, in the order of the query layout (token-major, then head). */
typedef struct krn_attn_merge {
    int32_t row0, n_rows, kv_head;
    int32_t part0, n_splits;
} krn_attn_merge_t;

typedef struct krn_attn_args {
    krn_kv_t kv;
    int32_t layer;
    int32_t n_head;              /* query heads; group = n_head / kv.n_head_kv */
    const float *q;              /* [n_rows][n_head * head_dim], roped, times 1/sqrt(head_dim) */
    float *out;                  /* [n_rows][n_head * head_dim] */
    const int32_t *row_pos;      /* [n_rows] */
    const int32_t *block_tables; /* [n_seqs][max_blocks] */
    int32_t max_blocks;
    const krn_attn_task_t *tasks; /* [n_tasks] */
    int32_t n_tasks;
    const krn_attn_merge_t *merges; /* [n_merges] */
    int32_t n_merges;
    float *part_o;  /* [n_parts][head_dim] unnormalized partial outputs */
    float *part_ml; /* [n_parts][2] (running max, running sum) */
} krn_attn_args_t;

/* One sequence of a batch, for planning. */
typedef struct krn_plan_seq {
    int32_t row0;     /* its first batch row */
    int32_t n_tokens; /* rows row0 .. row0 + n_tokens - 1 at positions pos0 .. */
    int32_t pos0;
} krn_plan_seq_t;

/* Planning parameters. Split tasks are made for units whose rows are few (decode) and whose
 * context is long, so the GPU has enough work: a unit of a single token over kv_len positions
 * is cut into ceil(kv_len / split_kv) splits when kv_len > split_kv. */
typedef struct krn_plan_params {
    int32_t n_head, n_head_kv, head_dim;
    int32_t split_kv; /* positions per split, a multiple of the block size; 0 = never split */
} krn_plan_params_t;

/* Builds the task and merge lists of a batch. Counts first: with tasks NULL it only writes
 * *n_tasks, *n_merges and *n_parts (the partial slots needed). Returns 0 or PC_ERR_INVAL (a
 * shape the kernels do not take: head_dim odd or > KRN_ATTN_MAX_HEAD_DIM, group >
 * KRN_ATTN_MAX_ROWS, an empty sequence). Pure host code, shared by the backend and the tests. */
int krn_attn_plan(const krn_plan_params_t *p, const krn_plan_seq_t *seqs, int32_t n_seqs,
                  krn_attn_task_t *tasks, int32_t *n_tasks, krn_attn_merge_t *merges,
                  int32_t *n_merges, int32_t *n_parts);

/* Tensor-core prefill attention (krn_attn_tc.cu, krn_hostdev.h): krn_attention runs the tasks
 * of more than one token on tensor cores (mma.sync m16n8k16, F16 Q and P, F32 accumulation)
 * when the shape allows, and the single-token tasks (decode, splits) and the merges with the
 * SIMT kernel. F32 pools keep the SIMT kernel (their precision is the point of an F32 pool).
 * Untested on a GPU as of this writing (issue 14): the GPU tests compare it with
 * krn_ref_attention within 2e-3 relative L2 error. */

/* Returns 0 when the tensor-core kernel takes this pool and head count: an F16 pool, head_dim
 * a multiple of 16 up to KRN_ATTN_MAX_HEAD_DIM, block_tokens a multiple of 8 (16-byte copies of
 * whole 8-position chunks), n_head a multiple of n_head_kv. Else PC_ERR_INVAL. */
int krn_attn_tc_check(const krn_kv_t *kv, int32_t n_head);
/* Whether krn_attention runs its multi-token tasks on tensor cores: krn_attn_tc_check passes
 * and `env` (the value of KVGW_CUDA_ATTN, or NULL) is not "simt". KVGW_CUDA_ATTN=simt forces
 * the SIMT kernel for every task (the fallback to bisect with; "tc64" keeps the tensor-core
 * kernel at one task per CTA, krn_attn_tc_warps). */
bool krn_attn_use_tc(const krn_kv_t *kv, int32_t n_head, const char *env);
/* Warps per tensor-core CTA for `env` (KVGW_CUDA_ATTN's value, or NULL): 8 (two plan tasks
 * of one sequence and KV head joined into up to 128 rows, so each K/V tile serves twice the
 * rows), or 4 (one task of at most 64 rows per CTA) when env is "tc64", to bisect with. */
int32_t krn_attn_tc_warps(const char *env);

/* ---------------------------------------------------------------------------------------------
 * Split-KV decode attention (FlashDecoding-style), for rows of one token each: row r, at
 * position row_pos[r] of sequence row_seq[r], attends to positions [0, row_pos[r]] with every
 * query head. Its KV range is cut into splits of split_tokens positions (a multiple of the block
 * size, from krn_decode_split_tokens so the grid is about twice the SM count); one CTA per
 * (split, KV head, row) reads each KV block of its split once for all the query heads of the
 * group (GQA), with 16-byte loads of whole block slices, and keeps the online-softmax state per
 * warp; a merge combines the splits. With max_splits 1 the CTA writes the output itself.
 *
 * Shapes it takes (krn_decode_check): head_dim a multiple of 32 up to 256, group <= 16 and
 * group * head_dim <= 2048, a block's K+V slice of at most 64 KiB in a multiple of 16 bytes.
 * Other shapes use krn_attention. Untested on a GPU as of this writing (issue 14): the GPU
 * tests compare it with krn_ref_decode_attention.
 * ------------------------------------------------------------------------------------------- */
typedef struct krn_decode_args {
    krn_kv_t kv;
    int32_t layer;
    int32_t n_head;              /* query heads; group = n_head / kv.n_head_kv */
    const float *q;              /* [n_rows][n_head * head_dim], roped, times 1/sqrt(head_dim) */
    float *out;                  /* [n_rows][n_head * head_dim] */
    const int32_t *row_seq;      /* [n_rows] the row of block_tables */
    const int32_t *row_pos;      /* [n_rows] the row's position (it sees [0, pos]) */
    const int32_t *block_tables; /* [n_seqs][max_blocks] */
    int32_t max_blocks, n_rows;
    int32_t split_tokens; /* positions per split, a multiple of kv.block_tokens */
    int32_t max_splits;   /* at least ceil((max pos + 1) / split_tokens) over the rows (the
                             grid's splits per row and the partials' stride; the CTAs of splits
                             past a row's last exit at once, so a larger value is correct) */
    float *part_o;        /* [n_rows][n_head][max_splits][head_dim] (max_splits > 1) */
    float *part_ml;       /* [n_rows][n_head][max_splits][2] (max_splits > 1) */
} krn_decode_args_t;

/* Returns 0 when the decode kernel takes this pool and head count, else PC_ERR_INVAL. */
int krn_decode_check(const krn_kv_t *kv, int32_t n_head);

/* Positions per split for n_rows decode rows of at most max_kv_len positions: splits of whole
 * blocks, as few as give about 2 * n_sm CTAs (n_rows * n_head_kv * splits), and at least
 * min_blocks blocks each (0: 4) so short contexts are not cut into slivers. Never more than
 * max_kv_len rounded up to a block. Returns the split, or 0 for bad arguments. */
int32_t krn_decode_split_tokens(int32_t n_sm, int32_t n_rows, int32_t n_head_kv,
                                int32_t block_tokens, int32_t max_kv_len, int32_t min_blocks);

/* ---------------------------------------------------------------------------------------------
 * Sampling: one token per row of logits, with the engine's exact rules (engine/sampling.h):
 * candidates are logits that are not NaN or -inf (+inf counts as FLT_MAX), ordered by logit
 * then lowest id; min_p, top_k and top_p keep a prefix of that order; the pick is the first
 * kept token, in increasing id order, whose cumulative weight exp((x - max) / T) (in double)
 * exceeds u * total. temperature 0 or top_k 1 is the argmax (ties to the lowest id).
 * ------------------------------------------------------------------------------------------- */

typedef struct krn_sample_row {
    float temperature;
    int32_t top_k; /* 0 = off */
    float top_p;   /* (0, 1]; 1 = off */
    float min_p;   /* [0, 1]; 0 = off */
    double u;      /* the request's uniform draw in [0, 1) (unused when greedy) */
} krn_sample_row_t;

typedef struct krn_sample_args {
    const float *logits;         /* [n_rows][n_vocab] */
    const krn_sample_row_t *row; /* [n_rows] */
    int32_t *token;              /* [n_rows] out: the pick, or -1 when no logit is a candidate */
    double *work;                /* [n_rows][n_vocab] scratch weights */
    int32_t n_rows, n_vocab;
    uint32_t plan; /* what no row needs (KRN_SAMPLE_*, krn_sample_plan_of the same rows): the
                      multi-pass sampler skips those launches; 0 runs them all */
} krn_sample_args_t;

/* krn_sample_args_t.plan flags. A flag that does not hold for every row leaves that row
 * unfinished, with token -1: compute them with krn_sample_plan_of, from the rows the device
 * gets (a CUDA graph that bakes a plan in must be keyed by it). */
#define KRN_SAMPLE_NO_TOPK 1u /* no row is sampled (temperature > 0) with top_k > 1 */
#define KRN_SAMPLE_NO_TOPP 2u /* no row is sampled with top_k != 1 and top_p < 1 */
#define KRN_SAMPLE_GREEDY 4u  /* every row greedy (temperature 0 or top_k 1): one launch */

static inline uint32_t krn_sample_plan_of(const krn_sample_row_t *rows, int32_t n_rows)
{
    uint32_t plan = KRN_SAMPLE_NO_TOPK | KRN_SAMPLE_NO_TOPP | KRN_SAMPLE_GREEDY;
    for (int32_t i = 0; i < n_rows; i++) {
        if (rows[i].temperature == 0.0f || rows[i].top_k == 1)
            continue;
        plan &= ~KRN_SAMPLE_GREEDY;
        if (rows[i].top_k > 1)
            plan &= ~KRN_SAMPLE_NO_TOPK;
        if (!(rows[i].top_p >= 1.0f))
            plan &= ~KRN_SAMPLE_NO_TOPP;
    }
    return plan;
}

/* ---------------------------------------------------------------------------------------------
 * GEMM: y[M][N] = x[M][K] . w[N][K]^T (+ y when accumulate), F32 accumulation. x is F16 or
 * BF16 like w (the caller converts activations with krn_convert). CUDA: cuBLAS
 * (cublasGemmEx). Reference: a plain triple loop in double.
 * ------------------------------------------------------------------------------------------- */
typedef struct krn_gemm_args {
    const void *x; /* [M][K] of dtype */
    const void *w; /* [N][K] of dtype */
    float *y;      /* [M][N] */
    int32_t M, N, K;
    enum krn_dtype dtype; /* KRN_F16 or KRN_BF16 */
    bool accumulate;
    int32_t ldy; /* y's row stride in floats (>= N), 0 for N: a GEMM over a range of rows of W
                    writes its columns of a wider y (krn_qmatmul's chunks) */
} krn_gemm_args_t;

/* ---------------------------------------------------------------------------------------------
 * Quantized weights (krn_quant.cu, kernels/ref/krn_ref_quant.c, the block decoders in
 * krn_quant_hostdev.h): matrices stored on the device as the GGUF file stores them, row after
 * row of blocks, each row n_in / block_elems blocks (n_in a multiple of block_elems), never
 * widened to F16 at upload. The block layouts are ggml's, byte for byte (F16 little-endian d):
 *
 *   Q4_0   32 elements,  18 bytes: d, qs[16]; element j < 16 = d * ((qs[j] & 15) - 8),
 *          element 16 + j = d * ((qs[j] >> 4) - 8)
 *   Q5_0   32 elements,  22 bytes: d, qh[4] (a little-endian 32-bit word), qs[16]; q_j = the
 *          low (j < 16) or high (j >= 16) nibble of qs[j % 16] with bit j of qh as its fifth
 *          bit; element j = d * (q_j - 16)
 *   Q5_1   32 elements,  24 bytes: d, m, qh[4], qs[16]; q_j as Q5_0's; element j = d * q_j + m
 *   Q8_0   32 elements,  34 bytes: d, int8 qs[32]; element j = d * qs[j]
 *   Q4_K  256 elements, 144 bytes: d, dmin, scales[12] (eight 6-bit scales and mins), qs[128];
 *          sub-block s (elements 32s .. 32s + 31) = (d * sc[s]) * q - (dmin * m[s]) with q the
 *          low (s even) or high (s odd) nibbles of qs[32 (s / 2) .. + 31]
 *   Q5_K  256 elements, 176 bytes: d, dmin, scales[12], qh[32], qs[128]; as Q4_K with bit s of
 *          qh[l] as the fifth bit (+16) of element 32s + l
 *   Q6_K  256 elements, 210 bytes: ql[128], qh[64], int8 scales[16], d; element e = (d *
 *          scales[e / 16]) * (q - 32) with q's low 4 bits from ql and high 2 bits from qh
 *
 * Dequantization reproduces ggml's reference (dequantize_row_*, gguf-py) bit for bit: the same
 * F32 products in the same order, never fused into an FMA (device: __fmul_rn / __fsub_rn).
 * The enum values are ggml's type ids (the GGUF tensor type).
 * ------------------------------------------------------------------------------------------- */
enum krn_qtype {
    KRN_QT_Q4_0 = 2,
    KRN_QT_Q5_0 = 6,
    KRN_QT_Q5_1 = 7,
    KRN_QT_Q8_0 = 8,
    KRN_QT_Q4_K = 12,
    KRN_QT_Q5_K = 13,
    KRN_QT_Q6_K = 14,
};

/* Elements and bytes of one block of t; 0 for a value that is not a krn_qtype. */
int32_t krn_qtype_block_elems(int32_t t);
int32_t krn_qtype_block_bytes(int32_t t);
/* Bytes of one row of n_in elements (n_in a multiple of the block), or 0 when t is unknown or
 * n_in is not a positive multiple of its block. */
int64_t krn_qtype_row_bytes(int32_t t, int64_t n_in);
/* "Q4_K", ...; "?" for an unknown value. */
const char *krn_qtype_name(int32_t t);

/* y[r][:] = dequant(w row rows[r]) (rows NULL: row r) as dtype: the embedding gather of a
 * quantized table (rows = token ids, dtype KRN_F32) and the widening of a range of rows for
 * krn_qmatmul's GEMM path. A row index outside [0, n_wrows) gives a row of NaN (the host
 * checks ids; never a stray read). */
typedef struct krn_dequant_args {
    const void *w;       /* [n_wrows][krn_qtype_row_bytes(qtype, n_in)] bytes */
    const int32_t *rows; /* [n_rows] or NULL */
    void *y;             /* [n_rows][n_in] of dtype */
    int32_t n_rows, n_wrows, n_in;
    enum krn_qtype qtype;
    enum krn_dtype dtype; /* KRN_F32, KRN_F16 or KRN_BF16 */
} krn_dequant_args_t;

/* The most activation rows krn_qmatmul runs on its GEMV kernel (decode): each weight byte is
 * read once for all the rows, dequantized in registers. More rows take the GEMM path. */
#define KRN_QGEMV_MAX_ROWS 8

/* y[M][N] (+)= x[M][K] . dequant(W)[N][K]^T, F32 accumulation. x is F32, F16 or BF16 (the
 * GEMM's input type the backend converted the activations to).
 *   M <= KRN_QGEMV_MAX_ROWS: the GEMV kernel (one warp per weight row, the M dot products of
 *     each dequantized group of 8 in registers), scratch unused.
 *   else (x F16 or BF16): W is dequantized to x's type chunk by chunk into scratch,
 *     krn_qmatmul_chunk_rows rows at a time, each chunk followed by a cuBLAS GEMM writing its
 *     columns of y (krn_gemm with ldy): weights never live widened, and the scratch is the
 *     caller's (allocated once, so a captured graph replays the same addresses).
 * The reference computes every dot product in double from the same dequantized values and
 * the same x elements. */
typedef struct krn_qmatmul_args {
    const void *w; /* [N][krn_qtype_row_bytes(qtype, K)] bytes */
    enum krn_qtype qtype;
    const void *x; /* [M][K] of x_dtype */
    enum krn_dtype x_dtype;
    float *y; /* [M][N] */
    int32_t M, N, K;
    bool accumulate;
    void *scratch; /* device memory for the GEMM path, scratch_bytes long (or NULL, 0 when M
                      never exceeds KRN_QGEMV_MAX_ROWS) */
    size_t scratch_bytes;
} krn_qmatmul_args_t;

/* Rows of W the GEMM path dequantizes per chunk: as many as scratch_bytes holds as elem_bytes
 * elements of K (at most N). Returns 0 when not even one row fits (or for bad arguments). */
int32_t krn_qmatmul_chunk_rows(int32_t N, int32_t K, size_t elem_bytes, size_t scratch_bytes);

/* ---------------------------------------------------------------------------------------------
 * Host-side planning (krn_plan.c, every build): what the cuda backend decides before it
 * launches anything, kept in plain C so CPU-only machines test it.
 * ------------------------------------------------------------------------------------------- */

/* The one-line reason no CUDA device is usable, into buf: err_code is cudaGetDeviceCount's
 * cudaError_t (0 when it succeeded with 0 devices), err_name / err_string its
 * cudaGetErrorName / cudaGetErrorString, driver_version cudaDriverGetVersion's (0: no driver)
 * and runtime_version the runtime's, both as 1000 * major + 10 * minor. A driver older than
 * the runtime is named as such, with both versions, since that is the failure a machine with
 * a working GPU most often shows. */
void krn_describe_cuda_failure(int err_code, const char *err_name, const char *err_string,
                               int driver_version, int runtime_version, char *buf, size_t len);

/* Largest finite F16 value. */
#define KRN_F16_MAX 65504.0
/* A measured activation maximum lets F16 carry the activation only with this much room: the
 * inputs measured are a sample, not a proof. */
#define KRN_F16_MEASURED_HEADROOM 4.0

/* The input type of one GEMM (cublasGemmEx takes the same type for x and w): F16 carries 11
 * significant bits but overflows past 65504, BF16 carries 8 and the F32 range. */
typedef struct krn_gemm_dtype_params {
    enum krn_dtype file_dtype; /* the weight's type in the model file (F32 for F32 and for
                                  quantized types: their dequantized values' range decides) */
    float weight_amax;         /* max |w| over the matrix */
    double act_bound;          /* a proven bound on |x| of the GEMM's input (krn_act_bound_*),
                                  INFINITY when none is known */
    double act_amax_measured;  /* max |x| measured on real inputs (calibration), < 0 if none */
} krn_gemm_dtype_params_t;

/* KRN_BF16 when the weights are BF16 in the file (exact there, and their activations are
 * trained in BF16's range), when a weight exceeds F16's range, or when the activations may:
 * F16 only where act_bound <= KRN_F16_MAX, or a measured amax times
 * KRN_F16_MEASURED_HEADROOM is <= KRN_F16_MAX. Else KRN_F16. */
enum krn_dtype krn_gemm_dtype(const krn_gemm_dtype_params_t *p);

/* Proven bounds on |x| for the inputs of a layer's GEMMs, from the weights alone.
 *   normed: y = rmsnorm(x) * w over `width` elements: |y_i| <= sqrt(width) * max|w|, since
 *           x_i^2 <= sum_j x_j^2 (eps only shrinks it). The q/k/v, gate/up and output GEMMs.
 *   proj:   z = y . W^T + b for such a y: |z_j| <= ||y||_2 * ||W_j||_2 + |b_j| with
 *           ||y||_2 <= sqrt(width) * max|w|; w_row_norm_max is max_j ||W_j||_2, b_amax max|b|
 *           (0 without bias). The attention output, a convex combination of V rows, is
 *           bounded by proj over Wv and bv: the Wo GEMM's input.
 *   swiglu: silu(g) * u with g, u bounded by g_bound, u_bound: |silu(g)| <= |g|, so
 *           g_bound * u_bound. The down projection's input; usually far above F16's range. */
double krn_act_bound_normed(int32_t width, float norm_amax);
double krn_act_bound_proj(int32_t width, float norm_amax, double w_row_norm_max, float b_amax);
double krn_act_bound_swiglu(double g_bound, double u_bound);

/* Device memory for the KV pool: what is free once everything else is allocated, less a
 * headroom for what the CUDA context, cuBLAS and other processes take later. */
typedef struct krn_mem_plan_params {
    size_t free_bytes, total_bytes; /* cudaMemGetInfo before the backend allocates */
    size_t other_bytes;             /* everything the backend allocates besides the pool */
    size_t block_bytes;             /* one KV block */
    int64_t want_blocks;            /* the blocks the engine's pool has */
    double headroom_frac;           /* of total_bytes, default 0.05 */
    size_t headroom_min_bytes;      /* at least this, default 512 MiB */
} krn_mem_plan_params_t;

typedef struct krn_mem_plan {
    size_t headroom_bytes; /* kept free */
    int64_t max_blocks;    /* the most blocks that fit (0 when nothing does) */
    size_t kv_bytes;       /* want_blocks * block_bytes */
} krn_mem_plan_t;

krn_mem_plan_params_t krn_mem_plan_params_default(void);
/* Fills *out. Returns 0 when want_blocks fit, PC_ERR_NOMEM when they do not (*out says how
 * many would), PC_ERR_INVAL for a zero block size or a negative want_blocks. */
int krn_mem_plan(const krn_mem_plan_params_t *p, krn_mem_plan_t *out);

/* Logits rows the cuda backend computes per output GEMM: its logits buffer holds this many
 * rows of n_vocab floats whatever the batch, and a step that wants more logits rows (prefill
 * with every row's logits) computes them in successive chunks. */
#define KRN_LOGITS_CHUNK_ROWS 64

/* ---------------------------------------------------------------------------------------------
 * CPU references (kernels/ref/, always built). Same contracts as the CUDA kernels, on host
 * memory; they return 0 or PC_ERR_INVAL.
 * ------------------------------------------------------------------------------------------- */
int krn_ref_embed(const krn_embed_args_t *a);
int krn_ref_rmsnorm(const krn_rmsnorm_args_t *a);
int krn_ref_qk_norm(const krn_rmsnorm_args_t *a);
int krn_ref_rope(const krn_rope_args_t *a);
int krn_ref_swiglu(const krn_swiglu_args_t *a);
int krn_ref_add(const krn_add_args_t *a);
int krn_ref_bias_add(const krn_bias_add_args_t *a);
int krn_ref_convert(const krn_convert_args_t *a);
int krn_ref_kv_write(const krn_kv_write_args_t *a);
int krn_ref_block_copy(const krn_block_copy_args_t *a);
int krn_ref_attention(const krn_attn_args_t *a);
int krn_ref_sample(const krn_sample_args_t *a);
int krn_ref_gemm(const krn_gemm_args_t *a);
/* The decode kernel's reference: per (row, head, split) the online softmax block by block, then
 * the splits merged in order (part_o / part_ml are not used). */
int krn_ref_decode_attention(const krn_decode_args_t *a);
/* Quantized weights: krn_ref_dequant is bit for bit what the kernel writes; krn_ref_qmatmul
 * sums in double whatever M is (scratch unused). */
int krn_ref_dequant(const krn_dequant_args_t *a);
int krn_ref_qmatmul(const krn_qmatmul_args_t *a);

/* ---------------------------------------------------------------------------------------------
 * CUDA entry points (only with KVGW_HAVE_CUDA). A krn_ctx owns one CUDA stream and one cuBLAS
 * handle on one device; it is used by one thread at a time. Pointers in argument structs are
 * device pointers unless a function says otherwise.
 * ------------------------------------------------------------------------------------------- */
typedef struct krn_ctx krn_ctx_t;

/* The number of usable CUDA devices. When it is 0, `why` (when not NULL) receives a one-line
 * reason to print: cudaGetDeviceCount's error with the driver's and the runtime's CUDA versions
 * (a driver older than the toolkit, no driver at all), or "no CUDA device". Never an error: a
 * machine without a GPU has 0 devices, and the caller decides whether that is acceptable
 * (tests under KVGW_REQUIRE_GPU=1 fail, backend "auto" reports why it used the CPU). */
int krn_device_probe(char *why, size_t why_len);
/* krn_device_probe without the reason. */
int krn_device_count(void);

/* What the benchmarks and the planners need to know about a device. */
typedef struct krn_device_info {
    char name[128];
    int sm_major, sm_minor;
    int n_sm;             /* streaming multiprocessors */
    size_t total_bytes;   /* device memory */
    double peak_gb_per_s; /* DRAM bandwidth from the memory clock and bus width, 0 if unknown */
} krn_device_info_t;

/* Fills *out for device `dev`. Returns 0 or PC_ERR_UNSUPPORTED (no such device). */
int krn_device_info(int dev, krn_device_info_t *out);
/* A one-line description of device `dev` ("NVIDIA H100 80GB HBM3, sm_90, 132 SMs, 79.1 GiB,
 * 3352 GB/s peak"). */
void krn_device_describe(int dev, char *buf, size_t len);

/* Creates a context on device `dev`: a stream and a cuBLAS handle bound to it. Returns 0,
 * PC_ERR_UNSUPPORTED (no such device) or PC_ERR_INTERNAL. */
int krn_ctx_init(int dev, krn_ctx_t **out);
/* Waits for queued work, then releases the stream and the handle; NULL is a no-op. */
void krn_ctx_free(krn_ctx_t *ctx);
/* Waits for every queued kernel and copy. Returns 0 or PC_ERR_INTERNAL (a kernel failed). */
int krn_ctx_sync(krn_ctx_t *ctx);

/* cudaMemGetInfo on the context's device: bytes free now and in all. Returns 0 or
 * PC_ERR_INTERNAL. */
int krn_mem_info(krn_ctx_t *ctx, size_t *free_bytes, size_t *total_bytes);

/* Device memory. krn_dev_alloc returns 0 or PC_ERR_NOMEM; krn_dev_free(NULL) is a no-op. */
int krn_dev_alloc(krn_ctx_t *ctx, size_t n_bytes, void **out);
void krn_dev_free(krn_ctx_t *ctx, void *p);
/* Copies on the context's stream (host memory must stay valid until krn_ctx_sync). */
int krn_copy_h2d(krn_ctx_t *ctx, void *dst, const void *src, size_t n_bytes);
int krn_copy_d2h(krn_ctx_t *ctx, void *dst, const void *src, size_t n_bytes);
int krn_copy_d2d(krn_ctx_t *ctx, void *dst, const void *src, size_t n_bytes);
/* Fills n_bytes with the byte `value` (0xff makes every F16 and F32 element a NaN). */
int krn_memset(krn_ctx_t *ctx, void *dst, int value, size_t n_bytes);

/* Whole blocks between the device pool and host memory laid out as [n][block_bytes]
 * (KV tiering): block ids[i] <-> host + i * block_bytes. */
int krn_blocks_to_host(krn_ctx_t *ctx, const krn_kv_t *kv, const int32_t *ids, int32_t n,
                       void *host);
int krn_blocks_from_host(krn_ctx_t *ctx, const krn_kv_t *kv, const int32_t *ids, int32_t n,
                         const void *host);

/*
 * Block transfers on their own stream (the G2 host tier of KV tiering), overlapped with the
 * context's compute. A krn_xfer owns a copy stream beside the context's stream and a ring of
 * KRN_XFER_RING events. Each transfer is ordered after the work enqueued on the context's stream
 * so far (the copy stream waits on an event recorded there: a block the last step wrote is
 * copied after it was written) and gets a fence: a number that grows by one per transfer,
 * starting at 1 (fence 0 is always done). The context's stream does not wait for transfers
 * unless told to (krn_xfer_order): steps of other sequences run while the copies do.
 *
 * Host memory must be pinned (krn_host_alloc) for the copies to be asynchronous, and must stay
 * valid (and, for a transfer to the device, unchanged) until the fence is done. The caller must
 * not let a step write a block a transfer reads, or read a block a transfer writes, before the
 * fence is done, or order the context's stream after the fence with krn_xfer_order.
 *
 * A krn_xfer is used by one thread at a time (the thread that enqueues the context's steps:
 * an event recorded on a stream another thread is capturing would join that capture).
 */
#define KRN_XFER_RING 256
typedef struct krn_xfer krn_xfer_t;

/* Creates the copy stream and its events on ctx's device. Returns 0, PC_ERR_NOMEM or
 * PC_ERR_INTERNAL. */
int krn_xfer_init(krn_ctx_t *ctx, krn_xfer_t **out);
/* Waits for every transfer, then releases the stream and the events; NULL is a no-op. */
void krn_xfer_free(krn_xfer_t *x);
/* Enqueues the copies of whole blocks between kv's pool and host laid out as [n][block_bytes]
 * (to_host: block ids[i] -> host + i * block_bytes; else the reverse) and sets *fence. Returns
 * 0, PC_ERR_INVAL (a block id out of range, n < 0; nothing enqueued) or PC_ERR_INTERNAL. */
int krn_xfer_blocks(krn_xfer_t *x, const krn_kv_t *kv, const int32_t *ids, int32_t n, void *host,
                    bool to_host, uint64_t *fence);
/* 1 when every transfer up to fence is done, 0 while one is in flight; PC_ERR_INVAL for a fence
 * not issued yet, PC_ERR_INTERNAL for a failed copy. Never blocks. */
int krn_xfer_query(krn_xfer_t *x, uint64_t fence);
/* Blocks the calling thread until every transfer up to fence is done. Returns 0, PC_ERR_INVAL
 * or PC_ERR_INTERNAL. */
int krn_xfer_wait(krn_xfer_t *x, uint64_t fence);
/* Makes the context's stream wait (on the device, the host does not block) until every
 * transfer up to fence is done: the next step reads blocks a transfer wrote, or writes blocks a
 * transfer reads. Returns 0, PC_ERR_INVAL or PC_ERR_INTERNAL. */
int krn_xfer_order(krn_xfer_t *x, uint64_t fence);
/* The last fence issued (0 before the first transfer). */
uint64_t krn_xfer_last(const krn_xfer_t *x);

int krn_embed(krn_ctx_t *ctx, const krn_embed_args_t *a);
int krn_rmsnorm(krn_ctx_t *ctx, const krn_rmsnorm_args_t *a);
int krn_qk_norm(krn_ctx_t *ctx, const krn_rmsnorm_args_t *a);
int krn_rope(krn_ctx_t *ctx, const krn_rope_args_t *a);
int krn_swiglu(krn_ctx_t *ctx, const krn_swiglu_args_t *a);
int krn_add(krn_ctx_t *ctx, const krn_add_args_t *a);
int krn_bias_add(krn_ctx_t *ctx, const krn_bias_add_args_t *a);
int krn_convert(krn_ctx_t *ctx, const krn_convert_args_t *a);
int krn_kv_write(krn_ctx_t *ctx, const krn_kv_write_args_t *a);
/* src, dst and n_tokens are device arrays. */
int krn_block_copy(krn_ctx_t *ctx, const krn_block_copy_args_t *a);
/* tasks and merges are device arrays (from krn_attn_plan, copied up). */
int krn_attention(krn_ctx_t *ctx, const krn_attn_args_t *a);
/* The tensor-core kernel alone over the tasks of more than one token (the others are left
 * untouched; no merge runs): PC_ERR_INVAL when krn_attn_tc_check fails. For benchmarks and
 * tests; krn_attention calls it. */
int krn_attention_tc(krn_ctx_t *ctx, const krn_attn_args_t *a);
/* The multi-pass sampler (krn_sample_radix.cu: radix select over histograms, several CTAs
 * per row, about 2 x (3 + bits(n_vocab - 1) / 11) launches, 11 at V = 152064), or with
 * KVGW_CUDA_SAMPLER=bitwise in the environment the one-CTA-per-row kernel of 128 bit-by-bit
 * passes (krn_sample.cu). Both leave `work` as scratch; the multi-pass one also uses per-row
 * scratch the context owns (krn_sample_reserve), grown on a call with more rows than ever
 * before, which fails with PC_ERR_INVAL while the stream is being captured. n_rows <= 65535. */
int krn_sample(krn_ctx_t *ctx, const krn_sample_args_t *a);
/* Each implementation directly, whatever the environment says (benchmarks, bisecting). */
int krn_sample_radix(krn_ctx_t *ctx, const krn_sample_args_t *a);
int krn_sample_bitwise(krn_ctx_t *ctx, const krn_sample_args_t *a);
/* Allocates the multi-pass sampler's scratch for up to max_rows rows (about 25 KB each) now,
 * so that later calls, a captured CUDA graph's included, allocate nothing. Returns 0,
 * PC_ERR_NOMEM, PC_ERR_INVAL (max_rows < 0, or the stream is being captured and the scratch
 * must grow) or PC_ERR_INTERNAL. */
int krn_sample_reserve(krn_ctx_t *ctx, int32_t max_rows);
int krn_gemm(krn_ctx_t *ctx, const krn_gemm_args_t *a);
/* row_seq, row_pos, block_tables and the part buffers are device arrays. */
int krn_decode_attention(krn_ctx_t *ctx, const krn_decode_args_t *a);
/* w and rows are device arrays; PC_ERR_INVAL for an unknown type, n_in not a multiple of the
 * block, or (krn_qmatmul) M > KRN_QGEMV_MAX_ROWS with F32 x or a scratch too small for one
 * row. */
int krn_dequant(krn_ctx_t *ctx, const krn_dequant_args_t *a);
int krn_qmatmul(krn_ctx_t *ctx, const krn_qmatmul_args_t *a);
/* The GEMV kernel alone, whatever M is up to KRN_QGEMV_MAX_ROWS (tests, benchmarks). */
int krn_qgemv(krn_ctx_t *ctx, const krn_qmatmul_args_t *a);

/* ---------------------------------------------------------------------------------------------
 * Fused kernels of the cuda backend's step (issue 14, host overhead): fewer launches per layer
 * with the numerics of the unfused kernels they replace (same F32 formulas, same roundings),
 * each with a CPU reference of the same contract (kernels/ref/krn_ref_fused.c).
 * ------------------------------------------------------------------------------------------- */

/* y[r][:] = convert(rmsnorm(x[src]) * w) with src = rows[r] (or r when rows is NULL): krn_rmsnorm
 * then krn_convert in one pass, straight into a GEMM's input buffer; with rows, also the
 * gather of the logits rows before the output head. dtype KRN_F32 writes floats. */
typedef struct krn_rmsnorm_convert_args {
    const float *x;      /* [n_src][width] */
    const int32_t *rows; /* [n_rows] rows of x, each in [0, n_src), or NULL (rows 0 ..) */
    const float *w;      /* [width] */
    void *y;             /* [n_rows][width] of dtype */
    int32_t n_rows, n_src, width;
    float eps;
    enum krn_dtype dtype; /* KRN_F32, KRN_F16 or KRN_BF16 */
} krn_rmsnorm_convert_args_t;

/* The QKV GEMM's epilogue for one layer, per row r (position pos[r] of sequence row_seq[r]):
 *   each query head:  q = q_in[r] head (+ bq), rmsnorm by q_norm (when not NULL), RoPE, times
 *                     q_scale, into q_out[r] (krn_bias_add, krn_qk_norm, krn_rope);
 *   each KV head:     k the same with bk, k_norm and scale 1; v = v_in[r] head (+ bv); both
 *                     stored at the row's slot of the pool (krn_kv_write).
 * The inputs are strided views: row r of q_in starts at q_in + r * ld_q, of k_in and v_in at
 * + r * ld_kv, so the three can be column ranges of one fused GEMM's [n_rows][nq + 2 nk]
 * output. q_out may be q_in when ld_q is n_head * head_dim (in place). head_dim is even and at
 * most KRN_ATTN_MAX_HEAD_DIM. A row whose position has no block (negative, past max_blocks,
 * or a table entry outside the pool) stores nothing on the device, as krn_kv_write; the
 * reference refuses such a call (PC_ERR_INVAL, nothing written). */
typedef struct krn_qkv_rope_kv_args {
    krn_kv_t kv;
    int32_t layer;
    int32_t n_head;               /* query heads; kv.n_head_kv KV heads */
    const float *q_in;            /* row r: [n_head * head_dim] at q_in + r * ld_q */
    const float *k_in, *v_in;     /* row r: [n_head_kv * head_dim] at + r * ld_kv */
    int64_t ld_q, ld_kv;          /* row strides, in floats */
    float *q_out;                 /* [n_rows][n_head * head_dim] */
    const float *bq, *bk, *bv;    /* [n_head * head_dim], [n_head_kv * head_dim] x2, or NULL */
    const float *q_norm, *k_norm; /* [head_dim] each, or NULL (no per-head norm) */
    float eps;
    const float *inv_freq; /* [rope_dim / 2] */
    int32_t rope_dim;
    enum krn_rope_style style;
    float q_scale;               /* 1/sqrt(head_dim) */
    const int32_t *row_pos;      /* [n_rows] */
    const int32_t *row_seq;      /* [n_rows] the row of block_tables */
    const int32_t *block_tables; /* [n_seqs][max_blocks] */
    int32_t n_rows, max_blocks;
} krn_qkv_rope_kv_args_t;

/* y[r][:] = convert(silu(g[r][:]) * u[r][:]) (krn_swiglu then krn_convert): the down
 * projection's input. g and u are strided views (row r at g + r * ld, u + r * ld), so they can
 * be the two halves of one fused gate/up GEMM's [n_rows][2 width] output. */
typedef struct krn_swiglu_convert_args {
    const float *g, *u; /* row r: [width] at + r * ld */
    int64_t ld;         /* row stride in floats, >= width */
    void *y;            /* [n_rows][width] of dtype */
    int32_t n_rows, width;
    enum krn_dtype dtype; /* KRN_F32, KRN_F16 or KRN_BF16 */
} krn_swiglu_convert_args_t;

int krn_ref_rmsnorm_convert(const krn_rmsnorm_convert_args_t *a);
int krn_ref_qkv_rope_kv(const krn_qkv_rope_kv_args_t *a);
int krn_ref_swiglu_convert(const krn_swiglu_convert_args_t *a);

/* Packing a step's host-to-device lists into one staging buffer (one copy per step): each
 * section starts at a multiple of KRN_PACK_ALIGN bytes. krn_pack_take returns the offset of a
 * section of n_bytes at *cursor and advances *cursor past it. */
#define KRN_PACK_ALIGN 16
static inline size_t krn_pack_take(size_t *cursor, size_t n_bytes)
{
    size_t off = (*cursor + (KRN_PACK_ALIGN - 1)) & ~(size_t)(KRN_PACK_ALIGN - 1);
    *cursor = off + n_bytes;
    return off;
}

/* Decode batches the cuda backend replays as CUDA graphs: a step whose rows are one token per
 * sequence and at most this many rows. */
#define KRN_GRAPH_MAX_ROWS 256

/* Step lists and graphs (krn_step.c, every build). The shape of one step: what the sizes of its
 * device lists and the arguments of its launches depend on, besides device memory contents. A
 * graph captured for one shape replays only for an equal shape (krn_step_same_shape), so
 * everything a launch's arguments depend on must be a field here. */
typedef struct krn_step_shape {
    int32_t n_rows, n_seqs, max_blocks; /* tables are [n_seqs][max_blocks] */
    int32_t n_tasks, n_merges, n_parts; /* the attention plan (krn_attn_plan) */
    int32_t n_logits;                   /* logits rows */
    bool sample;                        /* the logits rows are sampled on the device */
    uint32_t sample_plan;               /* then krn_sample_plan_of the rows (the sampler's
                                           launches depend on it), else 0 */
    int32_t dec_rows;                   /* rows 0 .. dec_rows - 1 (one token of each of
                                           sequences 0 .. dec_rows - 1) run their attention on
                                           the split-KV decode kernel, the others (when any)
                                           on krn_attention's plan (n_tasks .. n_parts), else 0 */
    int32_t dec_split, dec_splits;      /* then the kernel's split_tokens and max_splits
                                           (krn_decode_step_plan), else 0 and 0 */
} krn_step_shape_t;

/* Byte offsets of the step's lists in the staging buffer, each at a multiple of
 * KRN_PACK_ALIGN, in this order: int32 tokens, positions and row sequences [n_rows], logits
 * rows [n_logits], block tables [n_seqs][max_blocks], krn_attn_task_t [n_tasks],
 * krn_attn_merge_t [n_merges], krn_sample_row_t [n_logits] when sampling (else empty); bytes
 * is the end of the last. A function of the shape alone, so a replayed graph finds each list
 * where its capture did. */
typedef struct krn_step_layout {
    size_t tokens, pos, row_seq, logit_rows, tables, tasks, merges, srows, bytes;
} krn_step_layout_t;

/* Fills *out. Returns 0, or PC_ERR_INVAL for a negative count, more logits rows than rows, or
 * a table of more than INT32_MAX entries. */
int krn_step_layout(const krn_step_shape_t *s, krn_step_layout_t *out);
bool krn_step_same_shape(const krn_step_shape_t *a, const krn_step_shape_t *b);

/* Whether a step may run as a graph: graphs on and the packed upload in use (the graph reads
 * the staging buffer's device twin), a decode step (one row per sequence, 1 ..
 * KRN_GRAPH_MAX_ROWS rows), its logits rows sampled or fitting one output-head chunk
 * (logits_rows: copied to the host after the replay), and the logits rows gathered on the
 * device (fused_head) or rows 0, 1, .. (the unfused head copies each row from an address the
 * graph would bake in). */
typedef struct krn_step_graph_params {
    bool graphs, packed, decode, fused_head, logit_rows_identity;
    int32_t logits_rows;
} krn_step_graph_params_t;
bool krn_step_graphable(const krn_step_shape_t *s, const krn_step_graph_params_t *p);

/* The split-KV decode kernel in the cuda backend's steps (krn_step.c). When krn_decode_use
 * holds, the leading single-token rows of a step (one per sequence: a decode step's rows, or
 * the decode rows the worker puts before the prefill chunks of a mixed step) run their
 * attention with krn_decode_attention, and the rows after them with krn_attention's plan
 * (made over the remaining sequences alone). Single-token rows after a longer one stay on the
 * plan (the kernel reads a contiguous run of rows from row 0).
 *
 * krn_decode_use: krn_decode_check accepts the pool and head count, and `env` (the value of
 * KVGW_CUDA_DECODE, or NULL) is not "attn". KVGW_CUDA_DECODE=attn keeps every decode step on
 * krn_attention's plan (split tasks on the SIMT kernel), the path to bisect with. */
bool krn_decode_use(const krn_kv_t *kv, int32_t n_head, const char *env);

/* The decode kernel's launch for a decode step of n_rows rows whose longest context is
 * max_kv_len positions (largest row position + 1), on a device of n_sm SMs:
 *   - split_tokens: krn_decode_split_tokens's split (about 2 * n_sm CTAs, at least 4 blocks),
 *     rounded up to a number of blocks whose binary form has at most 3 significant bits (at most
 *     25% more positions per split), so the split changes only every ~1/4 octave of context;
 *   - max_splits: the grid's splits per row, ceil(2 * n_sm / (n_rows * n_head_kv)) (the most
 *     splits that split sizing ever gives this row count; CTAs past a row's last split exit at
 *     once), so it does not change while the contexts grow.
 * When the longest context fits one split, max_splits is 1 and split_tokens is
 * KRN_DECODE_ONE_SPLIT rounded down to a block (no partials, no merge, and the same arguments
 * for any context). Both are launch arguments a captured graph bakes in: they are part of the
 * step's shape (dec_split, dec_splits), and the rule above keeps a decode batch's shape, hence
 * its graph, stable over long stretches of steps. Returns 0, or PC_ERR_INVAL for a non-positive
 * argument or a context the int32 split arithmetic cannot carry. */
#define KRN_DECODE_ONE_SPLIT (1 << 30)
int krn_decode_step_plan(int32_t n_sm, int32_t n_rows, int32_t n_head_kv, int32_t block_tokens,
                         int32_t max_kv_len, int32_t *split_tokens, int32_t *max_splits);

/* The partial slots (rows x query heads x splits, each head_dim floats of part_o and 2 of
 * part_ml) that krn_decode_step_plan's launches can need for any decode step of 1 .. max_rows
 * rows and any context: the most n_rows * n_head * max_splits over the row counts whose
 * max_splits exceeds 1 (0 when none does). The backend allocates this once at init, so no
 * step allocates. Returns -1 for a non-positive argument. */
int64_t krn_decode_part_slots(int32_t n_sm, int32_t max_rows, int32_t n_head, int32_t n_head_kv);

/* A step's attention path, for the cuda backend: rows 0 .. n_lead - 1 are one token each of
 * sequences 0 .. n_lead - 1 (n_lead <= s->n_rows, s->n_seqs). Sets s->dec_rows to n_lead and
 * s->dec_split, s->dec_splits from krn_decode_step_plan (over those rows' positions row_pos,
 * n_head_kv KV heads), and returns true, when n_lead >= 1, `use` holds (krn_decode_use) and
 * the plan's partials fit part_slots (the backend's allocation, krn_decode_part_slots); else
 * sets the three to 0 and returns false (every row runs on krn_attention's plan). */
bool krn_step_decode_shape(krn_step_shape_t *s, const int32_t *row_pos, int32_t n_lead, bool use,
                           int32_t n_sm, int32_t n_head, int32_t n_head_kv, int32_t block_tokens,
                           int64_t part_slots);

/* CUDA entry points of this section (CUDA builds). */
int krn_rmsnorm_convert(krn_ctx_t *ctx, const krn_rmsnorm_convert_args_t *a);
int krn_qkv_rope_kv(krn_ctx_t *ctx, const krn_qkv_rope_kv_args_t *a);
int krn_swiglu_convert(krn_ctx_t *ctx, const krn_swiglu_convert_args_t *a);

/* Pinned host memory (cudaMallocHost), for staging copies that run asynchronously and can be
 * part of a captured graph. krn_host_alloc returns 0 or PC_ERR_NOMEM; krn_host_free(NULL) is a
 * no-op. */
int krn_host_alloc(krn_ctx_t *ctx, size_t n_bytes, void **out);
void krn_host_free(krn_ctx_t *ctx, void *p);

/* CUDA graphs of the context's stream. krn_graph_begin starts capturing (thread-local mode):
 * work enqueued on the context until krn_graph_end is recorded, not run. krn_graph_end ends the
 * capture and makes *g executable: a new graph when *g is NULL, else *g updated in place
 * (cudaGraphExecUpdate: same topology, new arguments; *updated set) or, when the update is
 * refused, rebuilt. *n_nodes receives the captured node count (the kernels, copies and memsets
 * one replay runs). Returns 0, or PC_ERR_UNSUPPORTED when the capture failed (something
 * enqueued could not be captured): the stream is out of capture mode then and *g unchanged.
 * krn_graph_abort ends a capture whose recording failed midway. krn_graph_launch enqueues one
 * replay. krn_graph_free(ctx, NULL) is a no-op. */
typedef struct krn_graph krn_graph_t;
int krn_graph_begin(krn_ctx_t *ctx);
int krn_graph_end(krn_ctx_t *ctx, krn_graph_t **g, int32_t *n_nodes, bool *updated);
void krn_graph_abort(krn_ctx_t *ctx);
int krn_graph_launch(krn_ctx_t *ctx, krn_graph_t *g);
void krn_graph_free(krn_ctx_t *ctx, krn_graph_t *g);

#ifdef __cplusplus
}
#endif

#endif
