/*
 * lnk_testmodel.h — the small model behind the worker-server tests and fuzz target
 * (test_worker_net.c, tests/fuzz/fuzz_worker_server.c); header-only.
 *
 * A real GGUF from the real generator (engine/mkmodel.c): llama, 2 layers, width 64, context
 * 1024, and a byte-level vocabulary of the 256 byte tokens (GPT-2's byte-to-unicode mapping)
 * with no end-of-generation token, so greedy runs always reach max_tokens and token text comes
 * from the real incremental detokenizer.
 */
#ifndef LNK_TESTMODEL_H
#define LNK_TESTMODEL_H

#include <stdio.h>

#include "test_bytemodel.h"

#define N_VOCAB 256
#define MODEL_NAME "kvgw-wnet"

/* Writes the model to path. Returns 0 or an error with the reason in err. */
static inline int lnk_testmodel_write(const char *path, char *err, size_t err_len)
{
    return test_bytemodel_write(path, MODEL_NAME, 1024, 7, -1, err, err_len);
}

#endif
