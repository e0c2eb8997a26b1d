/*
 * fuzz_radix.c — libFuzzer target: arbitrary bytes drive a sequence of radix tree operations
 * (insert, touch, expire, evict, remove, pin/unpin, owner sets, refused out-of-range inserts)
 * on the real tree and on the naive reference of tests/unit/radix/radix_model.h, with the
 * invariants checker and the payload check after every operation.
 *
 * Input: byte 0 picks the token width (vocabulary 50,000 / 128,256 / any uint32) and whether
 * the failing-allocator mode is on (every allocating mutation is retried with the k-th
 * allocation failing, for every k, and must leave the tree unchanged); the remaining bytes
 * are consumed two at a time as the driver's decisions. Any divergence aborts.
 */
#include "radix_model.h"

#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint64_t vocabs[] = {50000, 128256, 0};
    if (size < 1)
        return 0;
    mdl_t *m = calloc(1, sizeof *m);
    if (m == NULL)
        return 0;
    if (mdl_init(m, vocabs[data[0] % 3], data + 1, size - 1, 1) != 0) {
        free(m);
        return 0;
    }
    m->oom = (data[0] & 0x80) != 0;
    m->check = 1;
    /* Bounded work per input: at most 2000 operations. */
    for (int i = 0; i < 2000 && mdl_step(m, 1); i++) {
    }
    if (m->failed) {
        fprintf(stderr, "fuzz_radix: %s\n", m->why);
        abort();
    }
    mdl_check(m);
    if (m->failed) {
        fprintf(stderr, "fuzz_radix: %s\n", m->why);
        abort();
    }
    mdl_free(m);
    free(m);
    if (mdl_payloads_live != 0) {
        fprintf(stderr, "fuzz_radix: %ld payloads leaked or double-freed\n", mdl_payloads_live);
        abort();
    }
    return 0;
}
