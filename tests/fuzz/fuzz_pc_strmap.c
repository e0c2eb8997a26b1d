/*
 * fuzz_pc_strmap.c — bytes -> a sequence of insert/put/get on common/pc_strmap.c and on a
 * naive array of keys; after every operation the two must agree. Each operation is 2 bytes: an
 * opcode and a key index. Key i is the first i % 48 bytes of a fixed string with NUL bytes in
 * it, followed by the byte i / 48, so keys are prefixes of each other, and share lengths.
 */
#include <stdint.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "pc_strmap.h"

enum { NK = 256 };

static size_t key_of(unsigned i, char *out)
{
    static const char base[48] = "tok\0en.\0blk.0.attn_q.weight\0\xE2\x96\x81hello world";
    size_t n = i % 48;
    memcpy(out, base, n);
    out[n++] = (char)(i / 48);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t naive[NK];
    bool have[NK] = {0};
    size_t n = 0;
    char key[64];
    pc_strmap_t m = {0};
    for (size_t i = 0; i + 2 <= size; i += 2) {
        unsigned k = data[i + 1];
        size_t len = key_of(k, key);
        uint64_t v = (uint64_t)i * 0x9E3779B97F4A7C15ull, got = 0;
        uint64_t *at = NULL;
        switch (data[i] % 3) {
        case 0: {
            int rc = pc_strmap_insert(&m, key, len, v, &at);
            PC_ASSERT(rc == (have[k] ? 1 : 0));
            if (!have[k]) {
                naive[k] = v;
                have[k] = true;
                n++;
            }
            PC_ASSERT(*at == naive[k]);
            break;
        }
        case 1:
            PC_ASSERT(pc_strmap_put(&m, key, len, v) == 0);
            n += !have[k];
            naive[k] = v;
            have[k] = true;
            break;
        default:
            PC_ASSERT(pc_strmap_get(&m, key, len, &got) == have[k]);
            PC_ASSERT(!have[k] || got == naive[k]);
            break;
        }
        PC_ASSERT(pc_strmap_count(&m) == n);
        PC_ASSERT(2 * m.n <= m.cap);
    }
    for (unsigned k = 0; k < NK; k++) {
        uint64_t got = 0;
        size_t len = key_of(k, key);
        PC_ASSERT(pc_strmap_get(&m, key, len, &got) == have[k]);
        PC_ASSERT(!have[k] || got == naive[k]);
    }
    pc_strmap_free(&m);
    return 0;
}
