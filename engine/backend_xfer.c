/*
 * backend_xfer.c — KV block transfers between a backend's pool and host memory, over every
 * backend (backend.h, eng_backend_kv_*): the KV tiers move blocks through these.
 *
 * A backend that keeps its blocks in its own memory (cuda) has kv_to_host / kv_from_host on
 * its table and copies on its own stream; the CPU backend computes from the pool's host memory,
 * so a transfer is a memcpy of whole blocks (every layer of a block is contiguous: one region
 * of eng_kvpool_block_bytes), done on return with fence 0.
 */
#include <stdint.h>
#include <string.h>

#include "backend.h"
#include "kvpool.h"
#include "pc_alloc.h"
#include "pc_err.h"

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
