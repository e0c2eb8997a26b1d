/*
 * backend_xfer.c — KV block transfers between a backend's pool and host memory, over every
 * backend (backend.h, eng_backend_kv_*): the KV tiers move blocks through these.
 *
 * A backend that keeps its blocks in its own memory (cuda) has kv_to_host / kv_from_host on
 * its table and copies on its own stream; the CPU backend computes from the pool's host memory,
 * so a transfer is a memcpy of whole blocks (every layer of a block is contiguous: one region
 * of eng_kvpool_block_bytes), done on return with fence 0.
 *
 * The G2 tier's memory is a slab of fixed-size pieces over a few large chunks of the backend's
 * host memory (pinned on cuda), grown on demand up to its budget and never shrunk: pinning is
 * slow and cudaFreeHost synchronizes the device.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "backend.h"
#include "kvpool.h"
#include "pc_alloc.h"
#include "pc_assert.h"
#include "pc_err.h"
#include "pc_vec.h"

/* The host fallback's alignment: what O_DIRECT asks of a buffer on every filesystem. */
#define XFER_HOST_ALIGN 4096

static int check_blocks(const eng_kvpool_t *kv, const uint32_t *blocks, uint32_t n)
{
    uint32_t nb = eng_kvpool_n_blocks(kv);
    for (uint32_t i = 0; i < n; i++)
        if (blocks[i] >= nb)
            return PC_ERR_INVAL;
    return 0;
}

int eng_backend_kv_to_host(eng_backend_t *be, eng_kvpool_t *kv, const uint32_t *blocks, uint32_t n,
                           void *host, uint64_t *fence)
{
    *fence = 0;
    if (be->iface->kv_to_host != NULL)
        return be->iface->kv_to_host(be, blocks, n, host, fence);
    if (!eng_kvpool_has_storage(kv) || check_blocks(kv, blocks, n) != 0)
        return PC_ERR_INVAL;
    size_t bb = eng_kvpool_block_bytes(kv);
    for (uint32_t i = 0; i < n; i++)
        memcpy((uint8_t *)host + (size_t)i * bb, eng_kvpool_kv(kv, blocks[i], 0, 0), bb);
    return 0;
}

int eng_backend_kv_from_host(eng_backend_t *be, eng_kvpool_t *kv, const uint32_t *blocks,
                             uint32_t n, const void *host, uint64_t *fence)
{
    *fence = 0;
    if (be->iface->kv_from_host != NULL)
        return be->iface->kv_from_host(be, blocks, n, host, fence);
    if (!eng_kvpool_has_storage(kv) || check_blocks(kv, blocks, n) != 0)
        return PC_ERR_INVAL;
    size_t bb = eng_kvpool_block_bytes(kv);
    for (uint32_t i = 0; i < n; i++)
        memcpy(eng_kvpool_kv(kv, blocks[i], 0, 0), (const uint8_t *)host + (size_t)i * bb, bb);
    return 0;
}

int eng_backend_kv_fence(eng_backend_t *be, uint64_t fence, bool wait)
{
    if (be->iface->kv_fence != NULL)
        return be->iface->kv_fence(be, fence, wait);
    return fence == 0 ? 1 : PC_ERR_INVAL;
}

bool eng_backend_has_kv_xfer(const eng_backend_t *be)
{
    return be->iface->kv_to_host != NULL && be->iface->kv_from_host != NULL &&
           be->iface->kv_fence != NULL;
}

int eng_backend_host_alloc(eng_backend_t *be, size_t n_bytes, void **out)
{
    *out = NULL;
    if (be->iface->host_alloc != NULL)
        return be->iface->host_alloc(be, n_bytes, out);
    /* pc_malloc'ed (the allocation hooks see it), aligned by hand: the original pointer is kept
     * in the word before the aligned address. */
    if (n_bytes > SIZE_MAX - XFER_HOST_ALIGN - sizeof(void *))
        return PC_ERR_NOMEM;
    uint8_t *raw = pc_malloc(n_bytes + XFER_HOST_ALIGN + sizeof(void *));
    if (raw == NULL)
        return PC_ERR_NOMEM;
    uintptr_t a =
        ((uintptr_t)raw + sizeof(void *) + XFER_HOST_ALIGN - 1) & ~(uintptr_t)(XFER_HOST_ALIGN - 1);
    memcpy((uint8_t *)a - sizeof(void *), &raw, sizeof raw);
    *out = (void *)a;
    return 0;
}

void eng_backend_host_free(eng_backend_t *be, void *p)
{
    if (p == NULL)
        return;
    if (be->iface->host_free != NULL) {
        be->iface->host_free(be, p);
        return;
    }
    void *raw;
    memcpy(&raw, (uint8_t *)p - sizeof(void *), sizeof raw);
    pc_free(raw);
}

/* ---------------------------------------------------------------------------------------------
 * The G2 tier's slab of pinned pieces
 * ------------------------------------------------------------------------------------------- */

/* A chunk holds this many bytes of pieces (at least one piece, at most what is left of
 * max_bytes): few enough pinning calls, little pinned and unused. */
#define SLAB_CHUNK_BYTES ((size_t)32 << 20)

struct eng_host_slab {
    eng_backend_t *be;
    pthread_mutex_t mu;
    size_t piece;       /* bytes per piece, a multiple of XFER_HOST_ALIGN */
    uint64_t max_bytes; /* most bytes of chunks */
    uint64_t reserved;  /* bytes of chunks so far */
    uint64_t used;      /* pieces handed out */
    void **chunks;      /* [n_chunks] */
    size_t n_chunks, cap_chunks;
    void **free_list; /* [n_free] pieces put back or never handed out */
    size_t n_free, cap_free;
};

int eng_host_slab_init(eng_backend_t *be, size_t piece_bytes, uint64_t max_bytes,
                       eng_host_slab_t **out)
{
    *out = NULL;
    if (piece_bytes == 0 || piece_bytes > SIZE_MAX / 2)
        return PC_ERR_INVAL;
    size_t piece = (piece_bytes + XFER_HOST_ALIGN - 1) & ~(size_t)(XFER_HOST_ALIGN - 1);
    if (max_bytes < piece)
        return PC_ERR_INVAL;
    eng_host_slab_t *s = pc_calloc(1, sizeof *s);
    if (s == NULL)
        return PC_ERR_NOMEM;
    s->be = be;
    s->piece = piece;
    s->max_bytes = max_bytes;
    pthread_mutex_init(&s->mu, NULL);
    *out = s;
    return 0;
}

void eng_host_slab_free(eng_host_slab_t *s)
{
    if (s == NULL)
        return;
    for (size_t i = 0; i < s->n_chunks; i++)
        eng_backend_host_free(s->be, s->chunks[i]);
    pthread_mutex_destroy(&s->mu);
    pc_free(s->chunks);
    pc_free(s->free_list);
    pc_free(s);
}

/* Adds a chunk's pieces to the free list. Called with the lock held; 0 or PC_ERR_NOMEM
 * (nothing changed). */
static int slab_grow(eng_host_slab_t *s)
{
    uint64_t left = s->max_bytes - s->reserved;
    size_t n = (size_t)(PC_MIN((uint64_t)SLAB_CHUNK_BYTES, left) / s->piece);
    if (n == 0)
        n = left >= s->piece ? 1 : 0;
    if (n == 0)
        return PC_ERR_NOMEM;
    if (pc_array_reserve(&s->chunks, &s->cap_chunks, s->n_chunks + 1) != 0 ||
        pc_array_reserve(&s->free_list, &s->cap_free, s->n_free + n) != 0)
        return PC_ERR_NOMEM;
    void *chunk;
    if (eng_backend_host_alloc(s->be, n * s->piece, &chunk) != 0)
        return PC_ERR_NOMEM;
    s->chunks[s->n_chunks++] = chunk;
    /* Lowest address last: handed out first. */
    for (size_t i = n; i-- > 0;)
        s->free_list[s->n_free++] = (uint8_t *)chunk + i * s->piece;
    s->reserved += (uint64_t)n * s->piece;
    return 0;
}

void *eng_host_slab_alloc(void *slab, size_t bytes)
{
    eng_host_slab_t *s = slab;
    if (bytes > s->piece)
        return NULL;
    void *p = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->n_free > 0 || slab_grow(s) == 0) {
        p = s->free_list[--s->n_free];
        s->used++;
    }
    pthread_mutex_unlock(&s->mu);
    return p;
}

void eng_host_slab_release(void *slab, void *piece, size_t bytes)
{
    (void)bytes;
    eng_host_slab_t *s = slab;
    if (piece == NULL)
        return;
    pthread_mutex_lock(&s->mu);
    /* Room for every piece ever carved was reserved when its chunk was added. */
    PC_ASSERT(s->n_free < s->cap_free && s->used > 0);
    s->free_list[s->n_free++] = piece;
    s->used--;
    pthread_mutex_unlock(&s->mu);
}

void eng_host_slab_usage(eng_host_slab_t *s, uint64_t *pieces_used, uint64_t *bytes_reserved)
{
    pthread_mutex_lock(&s->mu);
    *pieces_used = s->used;
    *bytes_reserved = s->reserved;
    pthread_mutex_unlock(&s->mu);
}
