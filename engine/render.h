/*
 * render.h — prompt rendering: a neutral chat request (chat.h) into the model's chat format,
 * tokenized segment by segment, with the token offset where every tool definition, system
 * block and content block ends.
 *
 * Four formats (families) are implemented natively, detected from the model's chat template
 * (or named by the model's `chat_format:` in the gateway's config); there is no Jinja engine:
 *
 *   LLAMA3  <|begin_of_text|>
 *           <|start_header_id|>system<|end_header_id|>\n\n  [tool intro, tools]  system text
 *           <|eot_id|><|start_header_id|>user<|end_header_id|>\n\n  text  <|eot_id|>
 *           ...  <|start_header_id|>assistant<|end_header_id|>\n\n        (generation prompt)
 *   CHATML  <|im_start|>system\n  [# Tools ... <tools> ... </tools> ...]  system text
 *           <|im_end|>\n<|im_start|>user\n  text  <|im_end|>\n  ...  <|im_start|>assistant\n
 *   MISTRAL <s>[AVAILABLE_TOOLS] [tools][/AVAILABLE_TOOLS][INST] system\n\nuser[/INST] reply</s>
 *           [TOOL_CALLS] [calls]</s>[TOOL_RESULTS] {...}[/TOOL_RESULTS][INST] user[/INST]
 *           (no generation prompt: the model answers after [/INST] or [/TOOL_RESULTS])
 *   MISTRAL_V1  <s>[INST] system\n\nuser [/INST]reply</s> [INST] user [/INST]   (no tools)
 *
 * Rendering is segment-wise. The request is first turned into a list of segments, each either
 * template scaffolding or client content, and either ordinary TEXT (tokenized on its own with
 * eng_tok_encode), a SPECIAL control token named by its spelling, or an ADDED token (a
 * non-special added token such as Qwen's "<tool_call>": its id when the vocab has it, else
 * ordinary text). The token sequences are concatenated. Every segment depends only on the
 * element it belongs to and the elements before it: scaffolding that depends on what follows
 * (an end-of-turn, the end of the tool list) is emitted when the next element starts, and
 * belongs to that element. Hence the prefix property that prefix caching rests on:
 *
 *   for every mark m of render(R), render(R truncated right after m's element) starts with
 *   exactly tokens[0 .. m.token_end) of render(R).
 *
 * Deviations from the reference Jinja templates, all forced by that property or by the lack
 * of a Jinja engine. The rendered text is otherwise identical: tests/data/render_goldens.json
 * holds requests and what the real templates print for them (generated with @huggingface/jinja
 * from the tokenizer packages' chat_template by tests/node/render_goldens.mjs, which the
 * render_goldens test re-runs), and test_render_golden.c compares eng_render_text byte for byte;
 * a golden that exercises a deviation below carries its name and the template text transformed
 * by exactly that rule.
 *   - Llama 3 trims message content (| trim); we trim each text block on its own (identical
 *     for single-block messages). Blocks of one turn are joined by "\n" in both formats.
 *   - ChatML (Qwen) places the system text before the tool list; we place it after the tool
 *     list's closing text, separated by "\n\n", because the caching order is tools -> system
 *     (golden deviation "system_after_tools").
 *   - Qwen 3's <think></think> handling of the last assistant turn is not reproduced: an
 *     assistant turn is always rendered as "<|im_start|>assistant\n" + content.
 *   - Llama 3 tool use (the packaged Llama 3 template has none, so no golden covers it) follows
 *     Llama 3.1's convention loosely: tool definitions as indented
 *     JSON in the system turn, a call as {"name": ..., "parameters": ...} in an assistant turn,
 *     each tool result as its own "ipython" turn. A tool_result's is_error is not rendered.
 *   - Mistral's templates place the system text in the LAST user turn (v3; v1 has no system
 *     role and refuses it); we place it at the start of the FIRST user turn, followed by
 *     "\n\n" (mistral-common's own choice for v1), because the system text is cached before
 *     the messages (golden deviation "system_in_first_user"; identical for one user turn).
 *   - Mistral v3 places the tool list right before the LAST user turn; we place it right
 *     after <s> (golden deviation "tools_first"; identical for one user turn). Text beside an
 *     assistant's tool calls (which the template drops) is rendered before [TOOL_CALLS]; call
 *     ids are rendered as given (the template wants 9 characters and raises otherwise).
 *   - Mistral v1 has no tool use: a request with tools, tool calls or tool results is
 *     refused (PC_ERR_INVAL, the client's 400). Role order is never refused: where Mistral's
 *     templates raise an exception (two user turns in a row), each turn opens its own [INST].
 *   - A message with no blocks renders nothing.
 *
 * Memory: everything in eng_render_out_t lives in the caller's arena and stays valid until it
 * is cleared; segment text points into the chat (same lifetime rules) or at static strings.
 * An eng_render_t is immutable after init and may be shared by threads.
 */
#ifndef ENG_RENDER_H
#define ENG_RENDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chat.h"
#include "pc_arena.h"
#include "pc_buf.h"
#include "tokcache.h"
#include "tokenizer.h"

typedef enum eng_render_family {
    ENG_RENDER_FAMILY_UNKNOWN = 0,
    ENG_RENDER_FAMILY_LLAMA3 = 1,
    ENG_RENDER_FAMILY_CHATML = 2,
    ENG_RENDER_FAMILY_MISTRAL = 3,    /* Mistral's v3 tokenizer templates (7B v0.3, 8x22B...) */
    ENG_RENDER_FAMILY_MISTRAL_V1 = 4, /* Mistral's v1 templates (7B v0.1/v0.2, 8x7B) */
} eng_render_family_t;

/* The names of the supported families, for error messages: "llama3, chatml, mistral,
 * mistral-v1". */
#define ENG_RENDER_FAMILIES "llama3, chatml, mistral, mistral-v1"

/* The family of a chat template: "<|start_header_id|>" in it means LLAMA3, "<|im_start|>"
 * CHATML, "[INST]" MISTRAL, or MISTRAL_V1 when the template spells its closing tag with a
 * space before it (' [/INST]'). Without a template (NULL) or when none occurs, the GGUF
 * architecture decides: "llama" -> LLAMA3, "qwen*" -> CHATML. Anything else (either may be
 * NULL) is UNKNOWN. */
eng_render_family_t eng_render_family_detect(const char *chat_template, const char *arch);

/* "llama3", "chatml", "mistral", "mistral-v1" or "unknown". */
const char *eng_render_family_name(eng_render_family_t f);

/* Parses a family name as eng_render_family_name spells it ("unknown" excluded). Returns 0 or
 * PC_ERR_INVAL (*out unchanged). */
int eng_render_family_parse(const char *name, eng_render_family_t *out);

typedef enum eng_render_seg_kind {
    ENG_RENDER_SEG_TEXT = 0,    /* ordinary text */
    ENG_RENDER_SEG_SPECIAL = 1, /* a control token spelled by text; must exist in the vocab */
    ENG_RENDER_SEG_ADDED = 2,   /* an added token if the vocab has it, else ordinary text */
} eng_render_seg_kind_t;

typedef struct eng_render_seg {
    eng_render_seg_kind_t kind;
    bool scaffold;   /* template text (true) or client content (false) */
    pc_slice_t text; /* the segment's exact text */
    uint32_t owner;  /* index of the mark this segment leads up to; n_marks = the tail */
} eng_render_seg_t;

typedef enum eng_render_mark_kind {
    ENG_RENDER_MARK_TOOL = 0,   /* index = tool index */
    ENG_RENDER_MARK_SYSTEM = 1, /* index = system block index */
    ENG_RENDER_MARK_BLOCK = 2,  /* msg = message index, index = block index within it */
} eng_render_mark_kind_t;

/* The end of one request element, in request order (tools, system blocks, message blocks). */
typedef struct eng_render_mark {
    eng_render_mark_kind_t kind;
    uint32_t msg, index;
    uint32_t seg_end;   /* segments [0, seg_end) render everything up to the element's end */
    uint32_t token_end; /* tokens [0, token_end) likewise (0 before tokenization) */
    eng_chat_ttl_t ttl; /* the element's cache breakpoint, or ENG_CHAT_TTL_NONE */
} eng_render_mark_t;

typedef struct eng_render_out {
    eng_render_seg_t *segs; /* [n_segs] */
    size_t n_segs;
    eng_render_mark_t *marks; /* [n_marks], one per tool, system block and content block */
    size_t n_marks;
    size_t seg_gen_start; /* the generation prompt is segs [seg_gen_start, n_segs) */
    uint32_t *tokens;     /* [n_tokens]; NULL until tokenized */
    size_t n_tokens;
    /* Tokens [0, tokens_prefix_end) are the cacheable prompt: the last mark's token_end. What
     * follows (end-of-turn scaffolding, the generation prompt) depends on being the end. */
    size_t tokens_prefix_end;
    size_t tokens_gen_start; /* the generation prompt's first token; n_tokens with a prefill */
} eng_render_out_t;

typedef struct eng_render eng_render_t;

/* A renderer for one model. tok may be NULL: such a renderer only produces segments (tests,
 * tools that show the prompt text). family UNKNOWN means: detect it from the tokenizer's
 * vocab chat_template (the arch fallback is the caller's, through eng_render_family_detect).
 * Every SPECIAL token of the family must exist in the vocab. Returns 0, PC_ERR_UNSUPPORTED
 * (unknown family, missing control token; reason in err) or PC_ERR_NOMEM. The tokenizer must
 * outlive the renderer. */
int eng_render_init(const eng_tok_t *tok, eng_render_family_t family, eng_render_t **out, char *err,
                    size_t err_len);
void eng_render_free(eng_render_t *r);
eng_render_family_t eng_render_family(const eng_render_t *r);

/* Renders chat into segments and marks (out->tokens stays NULL). Returns 0, PC_ERR_INVAL
 * (a malformed chat: a tool_use input that is not JSON) with a reason in err, or
 * PC_ERR_NOMEM. *out is zeroed first; on error nothing in it may be used. */
int eng_render_segments(const eng_render_t *r, const eng_chat_t *chat, pc_arena_t *arena,
                        eng_render_out_t *out, char *err, size_t err_len);

/* Tokenizes out's segments, filling tokens, n_tokens and the marks' token_end. Needs a
 * renderer with a tokenizer (PC_ERR_STATE otherwise). Returns 0, PC_ERR_RANGE (more than
 * UINT32_MAX tokens) or PC_ERR_NOMEM. */
int eng_render_tokenize(const eng_render_t *r, eng_render_out_t *out, pc_arena_t *arena, char *err,
                        size_t err_len);

/* eng_render_segments then eng_render_tokenize. */
int eng_render_chat(const eng_render_t *r, const eng_chat_t *chat, pc_arena_t *arena,
                    eng_render_out_t *out, char *err, size_t err_len);

/* eng_render_tokenize with a segment token cache (tokcache.h): TEXT segments (and ADDED ones
 * the vocab lacks) are encoded through eng_tokcache_encode(cache, scope, ...), so the result is
 * identical to eng_render_tokenize's, only faster when segments repeat. cache NULL means no
 * cache. The cache must have been made for the renderer's tokenizer (PC_ERR_INVAL otherwise).
 * scope partitions the cache (the gateway passes the request's namespace). */
int eng_render_tokenize_cached(const eng_render_t *r, eng_tokcache_t *cache, uint64_t scope,
                               eng_render_out_t *out, pc_arena_t *arena, char *err, size_t err_len);

/* eng_render_segments then eng_render_tokenize_cached. */
int eng_render_chat_cached(const eng_render_t *r, eng_tokcache_t *cache, uint64_t scope,
                           const eng_chat_t *chat, pc_arena_t *arena, eng_render_out_t *out,
                           char *err, size_t err_len);

/* Appends the text of segments [seg_begin, seg_end) to b: the prompt exactly as a chat
 * template would print it. Returns 0 or PC_ERR_NOMEM. */
int eng_render_text(const eng_render_out_t *out, size_t seg_begin, size_t seg_end, pc_buf_t *b);

#endif
