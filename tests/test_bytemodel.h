/*
 * test_bytemodel.h — small real models with a byte-level vocabulary, for the worker tests
 * (tests/unit/engine/test_worker.c, tests/unit/link/test_worker_net.c) and the worker-server
 * fuzz target; header-only.
 *
 * The GGUF comes from the real generator (engine/mkmodel.c): llama, 2 layers, width 64, 4 heads,
 * 2 KV heads, FFN 128, and a vocabulary of the 256 byte tokens in GPT-2's byte-to-unicode
 * alphabet, so any text tokenizes and token text comes from the real incremental detokenizer.
 * With eot_id >= 256 one control token "<|eot|>" follows the bytes (n_vocab = eot_id + 1) and
 * ends generation; with eot_id < 0 there is none, so greedy runs always reach max_tokens.
 */
#ifndef TEST_BYTEMODEL_H
#define TEST_BYTEMODEL_H

#include <stdio.h>

#include "common.h"
#include "mkmodel.h"
#include "vocab.h"

/* GPT-2's byte-to-unicode mapping: byte b as the UTF-8 of its token. */
static inline void test_byte_token(int b, char out[8])
{
#define TBM_PRINTABLE(x) (((x) >= 33 && (x) <= 126) || ((x) >= 161 && (x) <= 172) || ((x) >= 174))
    int cp = b;
    if (!TBM_PRINTABLE(b)) {
        int n = 0;
        for (int x = 0; x < b; x++)
            if (!TBM_PRINTABLE(x))
                n++;
        cp = 256 + n;
    }
#undef TBM_PRINTABLE
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* Writes the model to path (name: general.name; n_ctx: context length; seed: weights).
 * Returns 0 or an error with the reason in err. */
static inline int test_bytemodel_write(const char *path, const char *name, uint32_t n_ctx,
                                       uint64_t seed, int eot_id, char *err, size_t err_len)
{
    uint32_t n_vocab = eot_id >= 256 ? (uint32_t)eot_id + 1 : 256;
    eng_vocab_t *v = pc_xcalloc(1, sizeof *v);
    v->bos_id = v->eos_id = v->eot_id = v->eom_id = v->pad_id = v->unk_id = -1;
    v->model = pc_xstrdup("gpt2");
    v->pre = pc_xstrdup("default");
    v->n_tokens = n_vocab;
    v->tokens = pc_xcalloc(n_vocab, sizeof *v->tokens);
    v->token_type = pc_xcalloc(n_vocab, sizeof *v->token_type);
    for (uint32_t i = 0; i < n_vocab; i++) {
        char t[16];
        if (i < 256)
            test_byte_token((int)i, t);
        else
            snprintf(t, sizeof t, i == (uint32_t)eot_id ? "<|eot|>" : "<|unused%u|>", i);
        v->tokens[i] = pc_xstrdup(t);
        v->token_type[i] = i < 256 ? ENG_TOKEN_TYPE_NORMAL : ENG_TOKEN_TYPE_CONTROL;
    }
    if (eot_id >= 256)
        v->eot_id = eot_id;
    eng_mkmodel_params_t p = eng_mkmodel_params_default();
    p.n_layer = 2;
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 128;
    p.n_ctx = n_ctx;
    p.rope_theta = 10000.0f;
    p.seed = seed;
    p.name = name;
    int rc = eng_mkmodel_write(&p, v, path, err, err_len);
    eng_vocab_free(v);
    return rc;
}

#endif
