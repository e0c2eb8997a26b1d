/*
 * kvpool.c — the paged KV block pool and per-sequence block tables (see kvpool.h).
 *
 * The free list is a stack of block ids; refcount[b] == 0 exactly for the blocks on it. The
 * whole KV memory is one allocation made at init, so the budget is a hard limit; a no_storage
 * pool has none (data is NULL) and only counts.
 */
#include "kvpool.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cpu_simd.h"
#include "half.h"
#include "pc_alloc.h"
#include "pc_assert.h"
#include "pc_err.h"
#include "quant.h"
#include "pc_vec.h"

struct eng_kvpool {
    uint32_t block_tokens;
    enum eng_kv_dtype dtype;
    uint32_t n_layer, n_head_kv, head_dim;
    uint32_t n_blocks;
    size_t row_bytes;   /* one position's K (or V) of one (layer, head) */
    size_t head_bytes;  /* 2 * block_tokens * row_bytes: one (layer, head) slice of a block */
    size_t block_bytes; /* n_layer * n_head_kv * head_bytes */
    bool poison;
    uint8_t *data;      /* [n_blocks][block_bytes], or NULL (no_storage) */
    void *data_raw;     /* the allocation data lies in (data is its first 4096-aligned byte) */
    uint32_t *refcount; /* [n_blocks] */
    uint32_t *free_ids; /* stack [n_blocks] */
    uint32_t n_free;
    eng_kvpool_evict_fn evict;
    void *evict_ud;
    eng_kvpool_hooks_t hooks; /* a mirror's (cuda backend), or all NULL */
};

void eng_kv_q8_0_quantize(const float *x, uint32_t n, uint8_t *dst)
{
    PC_ASSERT(n % ENG_QK8_0 == 0);
    for (uint32_t b = 0; b < n / ENG_QK8_0; b++, x += ENG_QK8_0, dst += ENG_KV_Q8_0_BYTES) {
        float amax = 0;
        for (uint32_t j = 0; j < ENG_QK8_0; j++) {
            float a = fabsf(x[j]);
            amax = a > amax ? a : amax;
        }
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = eng_f32_to_f16(d);
        memcpy(dst, &dh, 2);
        int8_t *q = (int8_t *)(dst + 2);
        /* roundf (halves away from zero) without the libm call, so the loop vectorizes: the
         * truncation and its exact remainder (|v| <= 127 up to the rounding of id: the amax
         * element may land a few ulps above 127). A NaN lane (never from a finite row) becomes
         * 0. */
        for (uint32_t j = 0; j < ENG_QK8_0; j++) {
            float v = x[j] * id;
            v = v >= -128.0f && v <= 128.0f ? v : 0.0f;
            int32_t t = (int32_t)v;
            float fr = v - (float)t;
            q[j] = (int8_t)(t + (fr >= 0.5f) - (fr <= -0.5f));
        }
    }
}

void eng_kv_q8_0_dequantize(const uint8_t *src, uint32_t n, float *y)
{
    PC_ASSERT(n % ENG_QK8_0 == 0);
    eng_dequant_q8_0((const eng_block_q8_0_t *)src, y, n); /* the weights' Q8_0 block */
}

eng_kvpool_params_t eng_kvpool_params_default(void)
{
    return (eng_kvpool_params_t){.block_tokens = ENG_KV_BLOCK_TOKENS_DEFAULT,
                                 .dtype = ENG_KV_F16,
                                 .max_tokens = 0,
                                 .max_bytes = 0,
                                 .poison = false,
                                 .no_storage = false};
}

/* Bytes of one position's K of one head, or 0 for a dtype that cannot hold head_dim. */
static size_t row_bytes_of(enum eng_kv_dtype dtype, uint32_t head_dim)
{
    switch (dtype) {
    case ENG_KV_F16:
        return (size_t)head_dim * 2;
    case ENG_KV_F32:
        return (size_t)head_dim * 4;
    case ENG_KV_Q8_0:
        return head_dim % ENG_QK8_0 == 0 ? (size_t)(head_dim / ENG_QK8_0) * ENG_KV_Q8_0_BYTES : 0;
    }
    return 0;
}

size_t eng_kvpool_block_bytes_for(enum eng_kv_dtype dtype, uint32_t block_tokens, uint32_t n_layer,
                                  uint32_t n_head_kv, uint32_t head_dim)
{
    size_t row = row_bytes_of(dtype, head_dim);
    if (row == 0 || block_tokens == 0 || n_layer == 0 || n_head_kv == 0)
        return 0;
    return (size_t)n_layer * n_head_kv * 2 * block_tokens * row;
}

int eng_kvpool_init(const eng_kvpool_params_t *p, uint32_t n_layer, uint32_t n_head_kv,
                    uint32_t head_dim, eng_kvpool_t **out)
{
    *out = NULL;
    if (p->block_tokens == 0 || p->block_tokens > 4096 || n_layer == 0 || n_head_kv == 0 ||
        head_dim == 0 || head_dim > 65536 || n_layer > 65536 || n_head_kv > 65536)
        return PC_ERR_INVAL;
    size_t row_bytes = row_bytes_of(p->dtype, head_dim);
    if (row_bytes == 0)
        return PC_ERR_INVAL;
    size_t head_bytes = 2 * (size_t)p->block_tokens * row_bytes;
    size_t block_bytes = (size_t)n_layer * n_head_kv * head_bytes;
    uint64_t n_blocks = UINT64_MAX;
    if (p->max_tokens > 0)
        n_blocks = p->max_tokens / p->block_tokens;
    if (p->max_bytes > 0)
        n_blocks = PC_MIN(n_blocks, p->max_bytes / block_bytes);
    if (n_blocks == UINT64_MAX || n_blocks == 0 || n_blocks > UINT32_MAX / 2 ||
        n_blocks > SIZE_MAX / block_bytes)
        return PC_ERR_INVAL;

    eng_kvpool_t *pool = pc_calloc(1, sizeof *pool);
    if (pool == NULL)
        return PC_ERR_NOMEM;
    pool->block_tokens = p->block_tokens;
    pool->dtype = p->dtype;
    pool->n_layer = n_layer;
    pool->n_head_kv = n_head_kv;
    pool->head_dim = head_dim;
    pool->n_blocks = (uint32_t)n_blocks;
    pool->row_bytes = row_bytes;
    pool->head_bytes = head_bytes;
    pool->block_bytes = block_bytes;
    pool->poison = p->poison;
    if (!p->no_storage) {
        /* Page-aligned, so that a block of a 4096-multiple size can be the target of an
         * O_DIRECT read (the disk tier loads straight into the pool). */
        pool->data_raw = pc_malloc((size_t)n_blocks * block_bytes + 4095);
        if (pool->data_raw == NULL) {
            eng_kvpool_free(pool);
            return PC_ERR_NOMEM;
        }
        pool->data = (uint8_t *)(((uintptr_t)pool->data_raw + 4095) & ~(uintptr_t)4095);
    }
    pool->refcount = pc_calloc(n_blocks, sizeof *pool->refcount);
    pool->free_ids = pc_malloc(n_blocks * sizeof *pool->free_ids);
    if (pool->refcount == NULL || pool->free_ids == NULL) {
        eng_kvpool_free(pool);
        return PC_ERR_NOMEM;
    }
    /* Block 0 on top of the stack: allocation order is 0, 1, 2, ... on a fresh pool. */
    for (uint32_t i = 0; i < pool->n_blocks; i++)
        pool->free_ids[i] = pool->n_blocks - 1 - i;
    pool->n_free = pool->n_blocks;
    *out = pool;
    return 0;
}

void eng_kvpool_free(eng_kvpool_t *pool)
{
    if (pool == NULL)
        return;
    pc_free(pool->data_raw);
    pc_free(pool->refcount);
    pc_free(pool->free_ids);
    pc_free(pool);
}

void eng_kvpool_set_evict(eng_kvpool_t *pool, eng_kvpool_evict_fn fn, void *ud)
{
    pool->evict = fn;
    pool->evict_ud = ud;
}

void eng_kvpool_set_hooks(eng_kvpool_t *pool, const eng_kvpool_hooks_t *hooks)
{
    if (hooks != NULL)
        pool->hooks = *hooks;
    else
        memset(&pool->hooks, 0, sizeof pool->hooks);
}

bool eng_kvpool_has_storage(const eng_kvpool_t *pool)
{
    return pool->data != NULL;
}
uint32_t eng_kvpool_block_tokens(const eng_kvpool_t *pool)
{
    return pool->block_tokens;
}
enum eng_kv_dtype eng_kvpool_dtype(const eng_kvpool_t *pool)
{
    return pool->dtype;
}
uint32_t eng_kvpool_n_blocks(const eng_kvpool_t *pool)
{
    return pool->n_blocks;
}
uint32_t eng_kvpool_n_free(const eng_kvpool_t *pool)
{
    return pool->n_free;
}
size_t eng_kvpool_block_bytes(const eng_kvpool_t *pool)
{
    return pool->block_bytes;
}
size_t eng_kvpool_row_bytes(const eng_kvpool_t *pool)
{
    return pool->row_bytes;
}

static void poison_block(eng_kvpool_t *pool, uint32_t b)
{
    uint8_t *p = pool->data + (size_t)b * pool->block_bytes;
    if (pool->dtype == ENG_KV_Q8_0) {
        /* Every q8_0 block's scale a NaN (quants 0): a stray read makes NaN scores. */
        for (size_t i = 0; i < pool->block_bytes; i += ENG_KV_Q8_0_BYTES) {
            uint16_t nan16 = 0x7e00;
            memcpy(p + i, &nan16, 2);
            memset(p + i + 2, 0, ENG_KV_Q8_0_BYTES - 2);
        }
    } else if (pool->dtype == ENG_KV_F16) {
        uint16_t *h = (uint16_t *)p;
        for (size_t i = 0; i < pool->block_bytes / 2; i++)
            h[i] = 0x7e00; /* F16 quiet NaN */
    } else {
        float *f = (float *)p;
        for (size_t i = 0; i < pool->block_bytes / 4; i++)
            f[i] = NAN;
    }
}

int eng_kvpool_alloc(eng_kvpool_t *pool, uint32_t *block)
{
    if (pool->n_free == 0 && pool->evict != NULL)
        pool->evict(pool->evict_ud, 1);
    if (pool->n_free == 0)
        return PC_ERR_NOSPACE;
    uint32_t b = pool->free_ids[--pool->n_free];
    PC_ASSERT(pool->refcount[b] == 0);
    pool->refcount[b] = 1;
    if (pool->poison && pool->data != NULL)
        poison_block(pool, b);
    if (pool->hooks.on_alloc != NULL)
        pool->hooks.on_alloc(pool->hooks.ud, b);
    *block = b;
    return 0;
}

void eng_kvpool_ref(eng_kvpool_t *pool, uint32_t block)
{
    PC_ASSERT(block < pool->n_blocks && pool->refcount[block] > 0);
    pool->refcount[block]++;
}

void eng_kvpool_unref(eng_kvpool_t *pool, uint32_t block)
{
    PC_ASSERT(block < pool->n_blocks && pool->refcount[block] > 0);
    if (--pool->refcount[block] == 0)
        pool->free_ids[pool->n_free++] = block;
}

uint32_t eng_kvpool_refcount(const eng_kvpool_t *pool, uint32_t block)
{
    PC_ASSERT(block < pool->n_blocks);
    return pool->refcount[block];
}

void *eng_kvpool_kv(const eng_kvpool_t *pool, uint32_t block, uint32_t layer, uint32_t head)
{
    if (pool->data == NULL)
        return NULL;
    size_t idx = ((size_t)block * pool->n_layer + layer) * pool->n_head_kv + head;
    return pool->data + idx * pool->head_bytes;
}

int eng_kvpool_block_read(const eng_kvpool_t *pool, uint32_t b, void *dst)
{
    PC_ASSERT(b < pool->n_blocks);
    if (pool->data != NULL) {
        memcpy(dst, pool->data + (size_t)b * pool->block_bytes, pool->block_bytes);
        return 0;
    }
    if (pool->hooks.read_block == NULL)
        return PC_ERR_UNSUPPORTED;
    return pool->hooks.read_block(pool->hooks.ud, b, dst);
}

int eng_kvpool_block_write(eng_kvpool_t *pool, uint32_t b, const void *src)
{
    PC_ASSERT(b < pool->n_blocks);
    if (pool->data != NULL) {
        memcpy(pool->data + (size_t)b * pool->block_bytes, src, pool->block_bytes);
        return 0;
    }
    if (pool->hooks.write_block == NULL)
        return PC_ERR_UNSUPPORTED;
    return pool->hooks.write_block(pool->hooks.ud, b, src);
}

void eng_kvpool_copy(eng_kvpool_t *pool, uint32_t dst, uint32_t src, uint32_t n_tokens)
{
    PC_ASSERT(dst < pool->n_blocks && src < pool->n_blocks && n_tokens <= pool->block_tokens);
    if (pool->hooks.on_copy != NULL)
        pool->hooks.on_copy(pool->hooks.ud, dst, src, n_tokens);
    if (pool->data == NULL)
        return; /* no_storage: the mirror holds the contents */
    if (n_tokens == pool->block_tokens || pool->poison == false) {
        /* Copying whole slices is simpler and copies no more than a block. */
        memcpy(pool->data + (size_t)dst * pool->block_bytes,
               pool->data + (size_t)src * pool->block_bytes, pool->block_bytes);
        return;
    }
    /* Poisoned pools copy only the valid positions, so unwritten slots stay NaN. */
    size_t bt = pool->block_tokens, hd = pool->head_dim, rb = pool->row_bytes;
    size_t e = pool->dtype == ENG_KV_F16 ? 2 : 4;
    for (uint32_t l = 0; l < pool->n_layer; l++) {
        for (uint32_t h = 0; h < pool->n_head_kv; h++) {
            uint8_t *d = eng_kvpool_kv(pool, dst, l, h);
            const uint8_t *s = eng_kvpool_kv(pool, src, l, h);
            if (pool->dtype == ENG_KV_Q8_0) { /* K then V: per-position rows */
                memcpy(d, s, n_tokens * rb);
                memcpy(d + bt * rb, s + bt * rb, n_tokens * rb);
                continue;
            }
            for (size_t i = 0; i < hd; i++) /* K rows: one per dimension */
                memcpy(d + i * bt * e, s + i * bt * e, n_tokens * e);
            memcpy(d + hd * bt * e, s + hd * bt * e, (size_t)n_tokens * hd * e); /* V */
        }
    }
}

int eng_kvpool_check(const eng_kvpool_t *pool, const uint32_t *expected_refs, char *err,
                     size_t err_len)
{
    uint8_t *seen = pc_calloc(pool->n_blocks ? pool->n_blocks : 1, 1);
    if (seen == NULL)
        return PC_ERR_NOMEM;
    int rc = 0;
    uint32_t n_zero = 0;
    for (uint32_t b = 0; b < pool->n_blocks; b++) {
        if (pool->refcount[b] != expected_refs[b]) {
            snprintf(err, err_len, "kvpool: block %u has refcount %u, owners hold %u", b,
                     pool->refcount[b], expected_refs[b]);
            rc = PC_ERR_INTERNAL;
            goto done;
        }
        n_zero += pool->refcount[b] == 0;
    }
    if (n_zero != pool->n_free) {
        snprintf(err, err_len, "kvpool: %u blocks unreferenced but %u on the free list", n_zero,
                 pool->n_free);
        rc = PC_ERR_INTERNAL;
        goto done;
    }
    for (uint32_t i = 0; i < pool->n_free; i++) {
        uint32_t b = pool->free_ids[i];
        if (b >= pool->n_blocks || seen[b] || pool->refcount[b] != 0) {
            snprintf(err, err_len, "kvpool: free list entry %u (block %u) is invalid", i, b);
            rc = PC_ERR_INTERNAL;
            goto done;
        }
        seen[b] = 1;
    }
done:
    pc_free(seen);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Block tables
 * ------------------------------------------------------------------------------------------- */

void eng_kvseq_init(eng_kvseq_t *s)
{
    memset(s, 0, sizeof *s);
}

void eng_kvseq_close(eng_kvseq_t *s, eng_kvpool_t *pool)
{
    for (uint32_t i = 0; i < s->n_blocks; i++)
        eng_kvpool_unref(pool, s->blocks[i]);
    pc_free(s->blocks);
    memset(s, 0, sizeof *s);
}

static int table_grow(eng_kvseq_t *s, uint32_t n)
{
    return pc_array_reserve(&s->blocks, &s->cap, n);
}

int eng_kvseq_share(eng_kvseq_t *s, eng_kvpool_t *pool, const uint32_t *blocks, uint32_t n_tokens)
{
    if (s->n_blocks != 0 || s->n_tokens != 0)
        return PC_ERR_STATE;
    uint32_t n = (n_tokens + pool->block_tokens - 1) / pool->block_tokens;
    int rc = table_grow(s, n);
    if (rc != 0)
        return rc;
    for (uint32_t i = 0; i < n; i++) {
        eng_kvpool_ref(pool, blocks[i]);
        s->blocks[i] = blocks[i];
    }
    s->n_blocks = n;
    s->n_tokens = n_tokens;
    return 0;
}

int eng_kvseq_reserve(eng_kvseq_t *s, eng_kvpool_t *pool, uint32_t n_new)
{
    uint32_t bt = pool->block_tokens;
    uint64_t end = (uint64_t)s->n_tokens + n_new;
    if (end > (uint64_t)UINT32_MAX - bt)
        return PC_ERR_NOSPACE;
    uint32_t need = (uint32_t)((end + bt - 1) / bt);
    int rc = table_grow(s, need);
    if (rc != 0)
        return rc;

    /* Copy-on-write: the partial last block is written next; it must be ours alone. */
    uint32_t cow_idx = UINT32_MAX, cow_old = 0;
    if (n_new > 0 && s->n_tokens % bt != 0) {
        uint32_t i = s->n_tokens / bt;
        PC_ASSERT(i < s->n_blocks);
        if (pool->refcount[s->blocks[i]] > 1) {
            uint32_t nb;
            rc = eng_kvpool_alloc(pool, &nb);
            /* A full pool evicts through the hook, which may drop the other reference (a
             * cached prefix): then the block is ours alone and needs no copy. */
            if (rc != 0 && pool->refcount[s->blocks[i]] > 1)
                return rc;
            if (rc == 0) {
                eng_kvpool_copy(pool, nb, s->blocks[i], s->n_tokens % bt);
                cow_idx = i;
                cow_old = s->blocks[i];
                s->blocks[i] = nb;
            }
        }
    }
    uint32_t n_before = s->n_blocks;
    while (s->n_blocks < need) {
        uint32_t nb;
        rc = eng_kvpool_alloc(pool, &nb);
        if (rc != 0)
            goto fail;
        s->blocks[s->n_blocks++] = nb;
    }
    if (cow_idx != UINT32_MAX)
        eng_kvpool_unref(pool, cow_old);
    return 0;

fail:
    while (s->n_blocks > n_before)
        eng_kvpool_unref(pool, s->blocks[--s->n_blocks]);
    if (cow_idx != UINT32_MAX) {
        eng_kvpool_unref(pool, s->blocks[cow_idx]);
        s->blocks[cow_idx] = cow_old;
    }
    return rc;
}

void eng_kvseq_trim(eng_kvseq_t *s, eng_kvpool_t *pool)
{
    uint32_t need = (s->n_tokens + pool->block_tokens - 1) / pool->block_tokens;
    while (s->n_blocks > need)
        eng_kvpool_unref(pool, s->blocks[--s->n_blocks]);
}
