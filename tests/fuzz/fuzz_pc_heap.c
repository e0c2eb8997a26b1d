/*
 * fuzz_pc_heap.c — bytes -> push/del/update/pop on common/pc_heap.c and on a naive array; the
 * top must be a minimum of the naive keys, every item's index field must point at its entry and
 * the heap order must hold after each operation. Also grows a pc_vec of the popped keys and
 * checks it against a count (the growable vector under the same stream). Each operation is 3
 * bytes: an opcode, an item and a key.
 */
#include <stdint.h>
#include <stdlib.h>

#include "common.h"

enum { NI = 64 };

typedef struct item {
    uint64_t key;
    uint32_t hidx;
    bool in;
} item_t;

static void check(const pc_heap_t *h, const item_t *items)
{
    uint32_t n_in = 0;
    for (size_t i = 0; i < NI; i++) {
        if (!items[i].in) {
            PC_ASSERT(items[i].hidx == PC_HEAP_NOIDX);
            continue;
        }
        n_in++;
        PC_ASSERT(items[i].hidx < h->n && h->a[items[i].hidx].item == &items[i]);
        PC_ASSERT(h->a[items[i].hidx].key == items[i].key);
    }
    PC_ASSERT(n_in == h->n);
    for (uint32_t i = 1; i < h->n; i++)
        PC_ASSERT(h->a[(i - 1) / PC_HEAP_D].key <= h->a[i].key);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    item_t items[NI];
    for (size_t i = 0; i < NI; i++)
        items[i] = (item_t){0, PC_HEAP_NOIDX, false};
    pc_heap_t h = pc_heap_make(offsetof(item_t, hidx));
    PC_VEC(uint64_t) popped = {0};
    size_t n_popped = 0;
    PC_ASSERT(pc_heap_reserve(&h, NI) == 0);
    for (size_t i = 0; i + 3 <= size; i += 3) {
        item_t *it = &items[data[i + 1] % NI];
        uint64_t key = data[i + 2];
        switch (data[i] % 4) {
        case 0:
            if (!it->in) {
                pc_heap_push(&h, it, key);
                it->in = true;
            } else {
                pc_heap_update(&h, it, key);
            }
            it->key = key;
            break;
        case 1:
            if (it->in) {
                pc_heap_del(&h, it);
                it->in = false;
            }
            break;
        case 2:
            if (it->in) {
                pc_heap_update(&h, it, key);
                it->key = key;
            }
            break;
        default:
            if (h.n > 0) {
                const pc_heap_ent_t *top = pc_heap_top(&h);
                for (size_t k = 0; k < NI; k++)
                    PC_ASSERT(!items[k].in || items[k].key >= top->key);
                item_t *t = top->item;
                PC_ASSERT(pc_vec_push(&popped, top->key) == 0);
                n_popped++;
                pc_heap_del(&h, t);
                t->in = false;
            }
            break;
        }
        check(&h, items);
    }
    PC_ASSERT(popped.len == n_popped && popped.len <= popped.cap);
    pc_vec_free(&popped);
    pc_heap_free(&h);
    return 0;
}
