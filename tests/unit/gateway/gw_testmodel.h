/*
 * gw_testmodel.h — the small model behind the worker-server tests and fuzz target
 * (test_worker_net.c, tests/fuzz/fuzz_worker_server.c); header-only.
 *
 * A real GGUF from the real generator (engine/mkmodel.c): llama, 2 layers, width 64, context
 * 1024, and a byte-level vocabulary of the 256 byte tokens (GPT-2's byte-to-unicode mapping)
 * with no end-of-generation token, so greedy runs always reach max_tokens and token text comes
 * from the real incremental detokenizer.
 */
#ifndef GW_TESTMODEL_H
#define GW_TESTMODEL_H

#include <stdio.h>

#include "common.h"
#include "mkmodel.h"
#include "vocab.h"

#define N_VOCAB 256
#define MODEL_NAME "kvgw-wnet"

/* GPT-2's byte-to-unicode mapping, as UTF-8, for the byte tokens. */
static inline void gw_testmodel_byte_token(int b, char out[8])
{
    int cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
        int n = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255)))
                n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* Writes the model to path. Returns 0 or an error with the reason in err. */
static inline int gw_testmodel_write(const char *path, char *err, size_t err_len)
{
    eng_vocab_t *v = pc_xcalloc(1, sizeof *v);
    v->bos_id = v->eos_id = v->eot_id = v->eom_id = v->pad_id = v->unk_id = -1;
    v->model = pc_strdup("gpt2");
    v->pre = pc_strdup("default");
    v->n_tokens = N_VOCAB;
    v->tokens = pc_xcalloc(N_VOCAB, sizeof *v->tokens);
    v->token_type = pc_xcalloc(N_VOCAB, sizeof *v->token_type);
    for (int i = 0; i < N_VOCAB; i++) {
        char t[8];
        gw_testmodel_byte_token(i, t);
        v->tokens[i] = pc_strdup(t);
        v->token_type[i] = ENG_TOKEN_TYPE_NORMAL;
    }
    eng_mkmodel_params_t p = eng_mkmodel_params_default();
    p.n_layer = 2;
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 128;
    p.n_ctx = 1024;
    p.rope_theta = 10000.0f;
    p.name = MODEL_NAME;
    p.seed = 7;
    int rc = eng_mkmodel_write(&p, v, path, err, err_len);
    eng_vocab_free(v);
    return rc;
}

#endif
