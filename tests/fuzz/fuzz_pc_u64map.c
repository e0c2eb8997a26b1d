/*
 * fuzz_pc_u64map.c — bytes -> a sequence of put/del/get on common/pc_u64map.c and on a naive
 * array of (key, value) pairs; after every operation the two must agree, and after the run an
 * iteration must visit exactly the naive entries. Each operation is 3 bytes: an opcode and a
 * 16-bit key index spread over keys that collide in the low bits.
 */
#include <stdint.h>
#include <stdlib.h>

#include "common.h"

enum { NK = 512 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char vals[NK];
    void *naive[NK] = {0};
    size_t n = 0;
    pc_u64map_t m = {0};
    for (size_t i = 0; i + 3 <= size; i += 3) {
        uint32_t ki = ((uint32_t)data[i + 1] << 8 | data[i + 2]) % NK;
        /* Odd indexes in the high word: many keys whose low 32 bits are all zero. */
        uint64_t key = (uint64_t)(ki + 1) << (ki & 1 ? 32 : 0);
        uint32_t slot = ki;
        switch (data[i] % 3) {
        case 0:
            PC_ASSERT(pc_u64map_put(&m, key, &vals[slot]) == 0);
            n += naive[slot] == NULL;
            naive[slot] = &vals[slot];
            break;
        case 1:
            PC_ASSERT(pc_u64map_del(&m, key) == naive[slot]);
            n -= naive[slot] != NULL;
            naive[slot] = NULL;
            break;
        default:
            PC_ASSERT(pc_u64map_get(&m, key) == naive[slot]);
            break;
        }
        PC_ASSERT(pc_u64map_count(&m) == n);
        PC_ASSERT(2 * m.n <= m.cap || m.cap == 0);
    }
    size_t seen = 0;
    for (size_t i = pc_u64map_next(&m, 0); i < m.cap; i = pc_u64map_next(&m, i + 1)) {
        size_t slot = (size_t)((char *)m.slots[i].value - vals);
        PC_ASSERT(slot < NK && naive[slot] == m.slots[i].value);
        seen++;
    }
    PC_ASSERT(seen == n);
    pc_u64map_free(&m);
    return 0;
}
