/*
 * render.c — the Llama 3, ChatML and Mistral renderers (see render.h for the formats, the segment
 * model and the prefix property).
 *
 * The emitter keeps one piece of state between elements: which turn is open. An element first
 * closes what it cannot continue (end of turn, end of the tool list), opens its turn, emits a
 * separator if it continues a turn that already has content, then its own segments, and
 * finally records its mark. Whatever comes after the last mark (closing the last turn, the
 * generation prompt) is the tail. Because closing happens lazily, the segments up to a mark
 * never depend on the elements after it.
 */
#include "render.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "chat_internal.h"
#include "pc_alloc.h"
#include "pc_assert.h"
#include "pc_err.h"

/* Token spellings the scaffolding uses, per family. SPECIAL ones must be in the vocab. */
typedef struct piece {
    const char *text;
    eng_render_seg_kind_t kind;
} piece_t;

static const piece_t llama3_pieces[] = {
    {"<|begin_of_text|>", ENG_RENDER_SEG_SPECIAL},
    {"<|start_header_id|>", ENG_RENDER_SEG_SPECIAL},
    {"<|end_header_id|>", ENG_RENDER_SEG_SPECIAL},
    {"<|eot_id|>", ENG_RENDER_SEG_SPECIAL},
};

static const piece_t chatml_pieces[] = {
    {"<|im_start|>", ENG_RENDER_SEG_SPECIAL},  {"<|im_end|>", ENG_RENDER_SEG_SPECIAL},
    {"<tool_call>", ENG_RENDER_SEG_ADDED},     {"</tool_call>", ENG_RENDER_SEG_ADDED},
    {"<tool_response>", ENG_RENDER_SEG_ADDED}, {"</tool_response>", ENG_RENDER_SEG_ADDED},
};

/* Mistral v3's control tokens are in its vocab; v1 spells [INST] as ordinary text. */
static const piece_t mistral_pieces[] = {
    {"<s>", ENG_RENDER_SEG_SPECIAL},
    {"</s>", ENG_RENDER_SEG_SPECIAL},
    {"[INST]", ENG_RENDER_SEG_ADDED},
    {"[/INST]", ENG_RENDER_SEG_ADDED},
    {"[TOOL_CALLS]", ENG_RENDER_SEG_ADDED},
    {"[AVAILABLE_TOOLS]", ENG_RENDER_SEG_ADDED},
    {"[/AVAILABLE_TOOLS]", ENG_RENDER_SEG_ADDED},
    {"[TOOL_RESULTS]", ENG_RENDER_SEG_ADDED},
    {"[/TOOL_RESULTS]", ENG_RENDER_SEG_ADDED},
};

#define RENDER_MAX_PIECES 12

struct eng_render {
    const eng_tok_t *tok;
    eng_render_family_t family;
    const piece_t *pieces;
    size_t n_pieces;
    int32_t ids[RENDER_MAX_PIECES]; /* piece ids, -1 for an ADDED piece the vocab lacks */
};

eng_render_family_t eng_render_family_detect(const char *chat_template, const char *arch)
{
    if (chat_template != NULL) {
        if (strstr(chat_template, "<|start_header_id|>") != NULL)
            return ENG_RENDER_FAMILY_LLAMA3;
        if (strstr(chat_template, "<|im_start|>") != NULL)
            return ENG_RENDER_FAMILY_CHATML;
        if (strstr(chat_template, "<<SYS>>") != NULL) /* Llama 2's format: not supported */
            return ENG_RENDER_FAMILY_UNKNOWN;
        if (strstr(chat_template, "' [/INST]'") != NULL ||
            strstr(chat_template, "\" [/INST]\"") != NULL)
            return ENG_RENDER_FAMILY_MISTRAL_V1;
        if (strstr(chat_template, "[INST]") != NULL)
            return ENG_RENDER_FAMILY_MISTRAL;
    }
    if (arch != NULL) {
        if (strcmp(arch, "llama") == 0)
            return ENG_RENDER_FAMILY_LLAMA3;
        if (strncmp(arch, "qwen", 4) == 0)
            return ENG_RENDER_FAMILY_CHATML;
    }
    return ENG_RENDER_FAMILY_UNKNOWN;
}

const char *eng_render_family_name(eng_render_family_t f)
{
    switch (f) {
    case ENG_RENDER_FAMILY_LLAMA3:
        return "llama3";
    case ENG_RENDER_FAMILY_CHATML:
        return "chatml";
    case ENG_RENDER_FAMILY_MISTRAL:
        return "mistral";
    case ENG_RENDER_FAMILY_MISTRAL_V1:
        return "mistral-v1";
    default:
        return "unknown";
    }
}

int eng_render_family_parse(const char *name, eng_render_family_t *out)
{
    for (int f = ENG_RENDER_FAMILY_LLAMA3; f <= ENG_RENDER_FAMILY_MISTRAL_V1; f++)
        if (name != NULL && strcmp(name, eng_render_family_name((eng_render_family_t)f)) == 0) {
            *out = (eng_render_family_t)f;
            return 0;
        }
    return PC_ERR_INVAL;
}

int eng_render_init(const eng_tok_t *tok, eng_render_family_t family, eng_render_t **out, char *err,
                    size_t err_len)
{
    if (family == ENG_RENDER_FAMILY_UNKNOWN && tok != NULL)
        family = eng_render_family_detect(eng_tok_vocab(tok)->chat_template, NULL);
    if (family < ENG_RENDER_FAMILY_LLAMA3 || family > ENG_RENDER_FAMILY_MISTRAL_V1)
        return pc_err_setf(err, err_len, PC_ERR_UNSUPPORTED,
                           "unknown chat format: the model's chat template is none of the "
                           "families supported (" ENG_RENDER_FAMILIES
                           "); name one with chat_format: in the model's config");
    eng_render_t *r = pc_calloc(1, sizeof *r);
    if (r == NULL)
        return PC_ERR_NOMEM;
    r->tok = tok;
    r->family = family;
    if (family == ENG_RENDER_FAMILY_LLAMA3) {
        r->pieces = llama3_pieces;
        r->n_pieces = PC_ARRAY_LEN(llama3_pieces);
    } else if (family == ENG_RENDER_FAMILY_CHATML) {
        r->pieces = chatml_pieces;
        r->n_pieces = PC_ARRAY_LEN(chatml_pieces);
    } else {
        r->pieces = mistral_pieces;
        r->n_pieces = family == ENG_RENDER_FAMILY_MISTRAL ? PC_ARRAY_LEN(mistral_pieces) : 4;
    }
    PC_ASSERT(r->n_pieces <= RENDER_MAX_PIECES);
    for (size_t i = 0; i < r->n_pieces; i++) {
        r->ids[i] = tok != NULL ? eng_tok_piece_id(tok, r->pieces[i].text) : -1;
        if (tok != NULL && r->ids[i] < 0 && r->pieces[i].kind == ENG_RENDER_SEG_SPECIAL) {
            int rc = pc_err_setf(err, err_len, PC_ERR_UNSUPPORTED,
                                 "the vocabulary has no token '%s', which the %s chat format needs",
                                 r->pieces[i].text, eng_render_family_name(family));
            pc_free(r);
            return rc;
        }
    }
    *out = r;
    return 0;
}

void eng_render_free(eng_render_t *r)
{
    pc_free(r);
}

eng_render_family_t eng_render_family(const eng_render_t *r)
{
    return r->family;
}

/* ---- the emitter ---------------------------------------------------------------------- */

typedef enum turn {
    TURN_NONE = 0,
    TURN_SYSTEM,
    TURN_USER,
    TURN_ASSISTANT,
    TURN_TOOL, /* Llama 3: one ipython turn per result; ChatML: a user turn of results */
} turn_t;

typedef struct emitter {
    const eng_render_t *r;
    const eng_chat_t *chat;
    pc_arena_t *arena;
    eng_render_seg_t *segs; /* pc_malloc'ed while rendering, copied into the arena at the end */
    size_t n_segs, cap_segs;
    eng_render_mark_t *marks; /* in the arena, sized up front */
    size_t n_marks;
    turn_t open;
    bool in_tools; /* ChatML, Mistral: the tool list is open (its closing text is pending) */
    bool in_calls; /* Mistral: an assistant's [TOOL_CALLS] list is open */
    bool sys_turn; /* Mistral: the open user turn holds the system text (its first user block
                      is separated by "\n\n") */
    bool need_sep; /* the open turn has content: the next content block is separated */
    pc_buf_t json; /* scratch for tool JSON */
    char *err;
    size_t err_len;
} emitter_t;

static int emit_seg(emitter_t *e, eng_render_seg_kind_t kind, bool scaffold, const char *s,
                    size_t n)
{
    if (e->n_segs == e->cap_segs) {
        size_t cap = e->cap_segs != 0 ? e->cap_segs * 2 : 64;
        eng_render_seg_t *p = pc_reallocarray(e->segs, cap, sizeof *p);
        if (p == NULL)
            return PC_ERR_NOMEM;
        e->segs = p;
        e->cap_segs = cap;
    }
    e->segs[e->n_segs++] = (eng_render_seg_t){kind, scaffold, pc_slice(s, n), (uint32_t)e->n_marks};
    return 0;
}

/* Template text: split into TEXT runs and the family's pieces wherever they are spelled. */
static int scaffold(emitter_t *e, const char *s)
{
    const char *run = s;
    for (const char *p = s; *p != '\0';) {
        const piece_t *hit = NULL;
        if (*p == '<' || *p == '[')
            for (size_t i = 0; i < e->r->n_pieces && hit == NULL; i++)
                if (strncmp(p, e->r->pieces[i].text, strlen(e->r->pieces[i].text)) == 0)
                    hit = &e->r->pieces[i];
        if (hit == NULL) {
            p++;
            continue;
        }
        if (p > run && emit_seg(e, ENG_RENDER_SEG_TEXT, true, run, (size_t)(p - run)) != 0)
            return PC_ERR_NOMEM;
        /* The piece's own static spelling: NUL-terminated, which tokenize relies on. */
        if (emit_seg(e, hit->kind, true, hit->text, strlen(hit->text)) != 0)
            return PC_ERR_NOMEM;
        p += strlen(hit->text);
        run = p;
    }
    if (*run != '\0' && emit_seg(e, ENG_RENDER_SEG_TEXT, true, run, strlen(run)) != 0)
        return PC_ERR_NOMEM;
    return 0;
}

/* Client content: always ordinary text, whatever it spells. Empty content emits nothing. */
static int content(emitter_t *e, pc_slice_t s)
{
    if (s.len == 0)
        return 0;
    return emit_seg(e, ENG_RENDER_SEG_TEXT, false, s.base, s.len);
}

/* A content block of the open turn: "\n" separates it from the turn's previous non-empty
 * block. An empty block emits nothing and leaves need_sep as it was. */
static int sep_content(emitter_t *e, pc_slice_t s)
{
    int rc;
    if (s.len > 0 && e->need_sep && (rc = scaffold(e, "\n")) != 0)
        return rc;
    if ((rc = content(e, s)) != 0)
        return rc;
    e->need_sep |= s.len > 0;
    return 0;
}

static void mark(emitter_t *e, eng_render_mark_kind_t kind, size_t msg, size_t index,
                 eng_chat_ttl_t ttl)
{
    PC_ASSERT(e->marks != NULL);
    e->marks[e->n_marks++] =
        (eng_render_mark_t){kind, (uint32_t)msg, (uint32_t)index, (uint32_t)e->n_segs, 0, ttl};
}

/* Python's str.strip(): ASCII whitespace, \x1c-\x1f and the Unicode White_Space characters. */
static size_t ws_len_at(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f))
        return 1;
    if (n >= 2 && c == 0xC2 && (s[1] == 0x85 || s[1] == 0xA0))
        return 2;
    if (n >= 3 && c == 0xE1 && s[1] == 0x9A && s[2] == 0x80) /* U+1680 */
        return 3;
    if (n >= 3 && c == 0xE2 && s[1] == 0x80 &&
        (s[2] <= 0x8A || s[2] == 0xA8 || s[2] == 0xA9 ||
         s[2] == 0xAF)) /* U+2000-200A, 2028/9, 202F */
        return 3;
    if (n >= 3 && c == 0xE2 && s[1] == 0x81 && s[2] == 0x9F) /* U+205F */
        return 3;
    if (n >= 3 && c == 0xE3 && s[1] == 0x80 && s[2] == 0x80) /* U+3000 */
        return 3;
    return 0;
}

static pc_slice_t trim(pc_slice_t s)
{
    const unsigned char *p = (const unsigned char *)s.base;
    size_t b = 0, e = s.len, w;
    while (b < e && (w = ws_len_at(p + b, e - b)) > 0)
        b += w;
    /* From the end: a whitespace character is 1-3 bytes; try each length that fits. */
    while (e > b) {
        size_t k;
        for (k = 1; k <= 3 && k <= e - b; k++)
            if (ws_len_at(p + e - k, k) == k)
                break;
        if (k > 3 || k > e - b)
            break;
        e -= k;
    }
    return pc_slice(s.base + b, e - b);
}

/* v printed as the templates' tojson prints it (style), copied into the arena. */
static int json_out(emitter_t *e, const json_t *v, enum eng__json_style style, pc_slice_t *out)
{
    e->json.len = 0;
    int rc = eng__json_write(&e->json, v, style);
    if (rc != 0)
        return rc;
    char *p = pc_arena_strndup(e->arena, e->json.base != NULL ? e->json.base : "", e->json.len);
    if (p == NULL)
        return PC_ERR_NOMEM;
    *out = pc_slice(p, e->json.len);
    return 0;
}

/* A tool definition as the templates' `tool | tojson` sees it:
 * {"type": "function", "function": {"name", "description"?, "parameters"?}}. */
static int tool_json(emitter_t *e, const eng_chat_tool_t *t, size_t i, pc_slice_t *out)
{
    json_t *root = json_object(), *fn = json_object(), *params = NULL;
    int rc = PC_ERR_NOMEM;
    if (root == NULL || fn == NULL)
        goto fail;
    if (t->input_schema.len > 0) {
        params = json_loadb(t->input_schema.base, t->input_schema.len, JSON_ALLOW_NUL, NULL);
        if (params == NULL) {
            rc = pc_err_setf(e->err, e->err_len, PC_ERR_INVAL,
                             "tools.%zu: input_schema is not JSON", i);
            goto fail;
        }
    }
    if (json_object_set_new(root, "type", json_string("function")) != 0 ||
        json_object_set_new(fn, "name", json_stringn(t->name.base, t->name.len)) != 0 ||
        (t->has_description &&
         json_object_set_new(fn, "description",
                             json_stringn(t->description.base, t->description.len)) != 0) ||
        (params != NULL && json_object_set(fn, "parameters", params) != 0) ||
        json_object_set(root, "function", fn) != 0)
        goto fail;
    rc = json_out(e, root,
                  e->r->family == ENG_RENDER_FAMILY_LLAMA3 ? ENG__JSON_PY_INDENT4 : ENG__JSON_PY,
                  out);
fail:
    json_decref(params);
    json_decref(fn);
    json_decref(root);
    return rc;
}

/* A tool call's arguments: the client's text verbatim, or our compact JSON respaced the way
 * tojson prints it. */
static int call_args(emitter_t *e, const eng_chat_block_t *b, size_t mi, size_t bi, pc_slice_t *out)
{
    if (b->input_raw) {
        *out = b->input;
        return 0;
    }
    json_t *v = json_loadb(b->input.base, b->input.len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (v == NULL)
        return pc_err_setf(e->err, e->err_len, PC_ERR_INVAL,
                           "messages.%zu.content.%zu: input is not JSON", mi, bi);
    int rc = json_out(e, v, ENG__JSON_PY, out);
    json_decref(v);
    return rc;
}

static turn_t block_turn(const eng_chat_msg_t *m, const eng_chat_block_t *b)
{
    if (b->kind == ENG_CHAT_BLOCK_TOOL_RESULT)
        return TURN_TOOL;
    if (b->kind == ENG_CHAT_BLOCK_TOOL_USE)
        return TURN_ASSISTANT;
    switch (m->role) {
    case ENG_CHAT_ROLE_ASSISTANT:
        return TURN_ASSISTANT;
    case ENG_CHAT_ROLE_SYSTEM:
        return TURN_SYSTEM;
    default:
        return TURN_USER; /* a TEXT block in a tool message cannot be made by the adapters */
    }
}

/* ---- Llama 3 -------------------------------------------------------------------------- */

#define LLAMA3_TOOLS_INTRO                                                                         \
    "You have access to the following functions. To call a function, please respond with JSON "    \
    "for a function call.Respond in the format {\"name\": function name, \"parameters\": "         \
    "dictionary of argument name and its value}.Do not use variables.\n\n"

/* Closes the open turn with `close` and opens turn t with headers[t] (TURN_NONE: user). */
static int open_turn(emitter_t *e, turn_t t, const char *close, const char *const headers[])
{
    int rc;
    if (e->open != TURN_NONE && (rc = scaffold(e, close)) != 0)
        return rc;
    rc = scaffold(e, headers[t == TURN_NONE ? TURN_USER : t]);
    e->open = t;
    e->need_sep = false;
    return rc;
}

static const char *const llama3_headers[] = {
    [TURN_SYSTEM] = "<|start_header_id|>system<|end_header_id|>\n\n",
    [TURN_USER] = "<|start_header_id|>user<|end_header_id|>\n\n",
    [TURN_ASSISTANT] = "<|start_header_id|>assistant<|end_header_id|>\n\n",
    [TURN_TOOL] = "<|start_header_id|>ipython<|end_header_id|>\n\n",
};

static int llama3_open(emitter_t *e, turn_t t)
{
    return open_turn(e, t, "<|eot_id|>", llama3_headers);
}

static int llama3_render(emitter_t *e)
{
    const eng_chat_t *c = e->chat;
    int rc;
    if ((rc = scaffold(e, "<|begin_of_text|>")) != 0)
        return rc;
    if (c->n_tools > 0 || c->n_system > 0) {
        if ((rc = llama3_open(e, TURN_SYSTEM)) != 0)
            return rc;
        if (c->n_tools > 0 && (rc = scaffold(e, LLAMA3_TOOLS_INTRO)) != 0)
            return rc;
        for (size_t i = 0; i < c->n_tools; i++) {
            pc_slice_t js;
            if ((rc = tool_json(e, &c->tools[i], i, &js)) != 0 || (rc = content(e, js)) != 0 ||
                (rc = scaffold(e, "\n\n")) != 0)
                return rc;
            mark(e, ENG_RENDER_MARK_TOOL, 0, i, c->tools[i].cache_ttl);
        }
        for (size_t i = 0; i < c->n_system; i++) {
            pc_slice_t t = trim(c->system[i].text);
            if ((rc = sep_content(e, t)) != 0)
                return rc;
            mark(e, ENG_RENDER_MARK_SYSTEM, 0, i, c->system[i].cache_ttl);
        }
    }
    for (size_t mi = 0; mi < c->n_messages; mi++) {
        const eng_chat_msg_t *m = &c->messages[mi];
        for (size_t bi = 0; bi < m->n_blocks; bi++) {
            const eng_chat_block_t *b = &m->blocks[bi];
            turn_t t = block_turn(m, b);
            if ((bi == 0 || t != e->open || t == TURN_TOOL) && (rc = llama3_open(e, t)) != 0)
                return rc;
            if (b->kind == ENG_CHAT_BLOCK_TEXT) {
                pc_slice_t s = trim(b->text);
                if ((rc = sep_content(e, s)) != 0)
                    return rc;
            } else if (b->kind == ENG_CHAT_BLOCK_TOOL_USE) {
                pc_slice_t args;
                if ((rc = call_args(e, b, mi, bi, &args)) != 0)
                    return rc;
                if ((e->need_sep && (rc = scaffold(e, "\n")) != 0) ||
                    (rc = scaffold(e, "{\"name\": \"")) != 0 || (rc = content(e, b->name)) != 0 ||
                    (rc = scaffold(e, "\", \"parameters\": ")) != 0 ||
                    (rc = content(e, args)) != 0 || (rc = scaffold(e, "}")) != 0)
                    return rc;
                e->need_sep = true;
            } else {
                if ((rc = content(e, b->text)) != 0)
                    return rc;
            }
            mark(e, ENG_RENDER_MARK_BLOCK, mi, bi, b->cache_ttl);
        }
    }
    if (!c->prefill) {
        if (e->open != TURN_NONE && (rc = scaffold(e, "<|eot_id|>")) != 0)
            return rc;
        e->open = TURN_NONE;
    }
    return 0;
}

static int llama3_gen_prompt(emitter_t *e)
{
    return scaffold(e, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* ---- ChatML (Qwen 2.5 / 3) ------------------------------------------------------------ */

#define CHATML_TOOLS_INTRO                                                                         \
    "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user "   \
    "query.\n\nYou are provided with function signatures within <tools></tools> XML "              \
    "tags:\n<tools>"
#define CHATML_TOOLS_OUTRO                                                                         \
    "\n</tools>\n\nFor each function call, return a json object with function name and "           \
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "                 \
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>"

static int chatml_close_tools(emitter_t *e)
{
    if (!e->in_tools)
        return 0;
    e->in_tools = false;
    return scaffold(e, CHATML_TOOLS_OUTRO);
}

static const char *const chatml_headers[] = {
    [TURN_SYSTEM] = "<|im_start|>system\n",
    [TURN_USER] = "<|im_start|>user\n",
    [TURN_ASSISTANT] = "<|im_start|>assistant\n",
    [TURN_TOOL] = "<|im_start|>user", /* each <tool_response> block brings its own newline */
};

static int chatml_open(emitter_t *e, turn_t t)
{
    int rc;
    if ((rc = chatml_close_tools(e)) != 0)
        return rc;
    return open_turn(e, t, "<|im_end|>\n", chatml_headers);
}

static int chatml_render(emitter_t *e)
{
    const eng_chat_t *c = e->chat;
    int rc;
    if (c->n_tools > 0) {
        if ((rc = scaffold(e, CHATML_TOOLS_INTRO)) != 0)
            return rc;
        e->open = TURN_SYSTEM;
        e->in_tools = true;
        for (size_t i = 0; i < c->n_tools; i++) {
            pc_slice_t js;
            if ((rc = scaffold(e, "\n")) != 0 || (rc = tool_json(e, &c->tools[i], i, &js)) != 0 ||
                (rc = content(e, js)) != 0)
                return rc;
            mark(e, ENG_RENDER_MARK_TOOL, 0, i, c->tools[i].cache_ttl);
        }
    }
    for (size_t i = 0; i < c->n_system; i++) {
        pc_slice_t t = c->system[i].text;
        if (i == 0 && e->in_tools) {
            if ((rc = chatml_close_tools(e)) != 0 || (rc = scaffold(e, "\n\n")) != 0)
                return rc;
        } else if (i == 0) {
            if ((rc = chatml_open(e, TURN_SYSTEM)) != 0)
                return rc;
        }
        if ((rc = sep_content(e, t)) != 0)
            return rc;
        mark(e, ENG_RENDER_MARK_SYSTEM, 0, i, c->system[i].cache_ttl);
    }
    for (size_t mi = 0; mi < c->n_messages; mi++) {
        const eng_chat_msg_t *m = &c->messages[mi];
        for (size_t bi = 0; bi < m->n_blocks; bi++) {
            const eng_chat_block_t *b = &m->blocks[bi];
            turn_t t = block_turn(m, b);
            /* Consecutive tool results share one user turn, across messages too. */
            bool cont = t == e->open && !e->in_tools && (bi > 0 || t == TURN_TOOL);
            if (!cont && (rc = chatml_open(e, t)) != 0)
                return rc;
            if (b->kind == ENG_CHAT_BLOCK_TEXT) {
                if ((rc = sep_content(e, b->text)) != 0)
                    return rc;
            } else if (b->kind == ENG_CHAT_BLOCK_TOOL_USE) {
                pc_slice_t args;
                if ((rc = call_args(e, b, mi, bi, &args)) != 0)
                    return rc;
                if ((e->need_sep && (rc = scaffold(e, "\n")) != 0) ||
                    (rc = scaffold(e, "<tool_call>\n{\"name\": \"")) != 0 ||
                    (rc = content(e, b->name)) != 0 ||
                    (rc = scaffold(e, "\", \"arguments\": ")) != 0 ||
                    (rc = content(e, args)) != 0 || (rc = scaffold(e, "}\n</tool_call>")) != 0)
                    return rc;
                e->need_sep = true;
            } else {
                if ((rc = scaffold(e, "\n<tool_response>\n")) != 0 ||
                    (rc = content(e, b->text)) != 0 ||
                    (rc = scaffold(e, "\n</tool_response>")) != 0)
                    return rc;
            }
            mark(e, ENG_RENDER_MARK_BLOCK, mi, bi, b->cache_ttl);
        }
    }
    if (!c->prefill) {
        if ((rc = chatml_close_tools(e)) != 0)
            return rc;
        if (e->open != TURN_NONE && (rc = scaffold(e, "<|im_end|>\n")) != 0)
            return rc;
        e->open = TURN_NONE;
    }
    return 0;
}

static int chatml_gen_prompt(emitter_t *e)
{
    return scaffold(e, "<|im_start|>assistant\n");
}

/* ---- Mistral (v3 and v1) -------------------------------------------------------------- */

/* What tells the two Mistral templates apart. */
typedef struct mistral_style {
    const char *inst_close; /* closes a user turn */
    const char *reply_open; /* before an assistant's text (none before tool calls alone) */
    const char *reply_close;
    bool trim_reply; /* v3 trims the assistant's text */
    bool tools;      /* v3 has tool use */
} mistral_style_t;

static const mistral_style_t mistral_v3 = {"[/INST]", " ", "</s>", true, true};
static const mistral_style_t mistral_v1 = {" [/INST]", "", "</s> ", false, false};

/* Closes whatever is open: the tool list, a list of calls, a user turn or a reply. */
static int mistral_close(emitter_t *e, const mistral_style_t *st)
{
    int rc = 0;
    if (e->in_tools)
        rc = scaffold(e, "][/AVAILABLE_TOOLS]");
    else if (e->in_calls)
        rc = scaffold(e, "]</s>");
    else if (e->open == TURN_USER)
        rc = scaffold(e, st->inst_close);
    else if (e->open == TURN_ASSISTANT)
        rc = scaffold(e, st->reply_close);
    e->in_tools = e->in_calls = e->sys_turn = false;
    e->open = TURN_NONE;
    e->need_sep = false;
    return rc;
}

static int mistral_open(emitter_t *e, const mistral_style_t *st, turn_t t)
{
    int rc;
    if ((rc = mistral_close(e, st)) != 0)
        return rc;
    e->open = t;
    /* A reply's opening text comes with its first text (mistral_block): a reply of tool calls
     * alone has none. */
    return t == TURN_USER ? scaffold(e, "[INST] ") : 0;
}

/* s as the templates' tojson prints a string, in the arena. */
static int json_str(emitter_t *e, pc_slice_t s, pc_slice_t *out)
{
    json_t *v = json_stringn(s.base, s.len);
    if (v == NULL)
        return PC_ERR_NOMEM;
    int rc = json_out(e, v, ENG__JSON_PY, out);
    json_decref(v);
    return rc;
}

/* A tool as the v3 template prints it: string fields raw between quotes, the rest tojson. */
static int mistral_tool(emitter_t *e, const eng_chat_tool_t *t, size_t i)
{
    int rc;
    if ((rc = scaffold(e, i == 0 ? "[AVAILABLE_TOOLS] [" : ", ")) != 0 ||
        (rc = scaffold(e, "{\"type\": \"function\", \"function\": {\"name\": \"")) != 0 ||
        (rc = content(e, t->name)) != 0 || (rc = scaffold(e, "\"")) != 0)
        return rc;
    if (t->has_description &&
        ((rc = scaffold(e, ", \"description\": \"")) != 0 ||
         (rc = content(e, t->description)) != 0 || (rc = scaffold(e, "\"")) != 0))
        return rc;
    if (t->input_schema.len > 0) {
        json_t *v = json_loadb(t->input_schema.base, t->input_schema.len, JSON_ALLOW_NUL, NULL);
        if (v == NULL)
            return pc_err_setf(e->err, e->err_len, PC_ERR_INVAL,
                               "tools.%zu: input_schema is not JSON", i);
        pc_slice_t params;
        rc = json_out(e, v, ENG__JSON_PY, &params);
        json_decref(v);
        if (rc != 0 || (rc = scaffold(e, ", \"parameters\": ")) != 0 ||
            (rc = content(e, params)) != 0)
            return rc;
    }
    return scaffold(e, "}}");
}

/* One call of an assistant's [TOOL_CALLS] list: the template prints the OpenAI function
 * object with tojson (arguments the client's string, or our object) and adds the id. */
static int mistral_call(emitter_t *e, const eng_chat_block_t *b, size_t mi, size_t bi)
{
    pc_slice_t name, args;
    int rc = json_str(e, b->name, &name);
    if (rc == 0)
        rc = b->input_raw ? json_str(e, b->input, &args) : call_args(e, b, mi, bi, &args);
    if (rc != 0)
        return rc;
    if ((rc = scaffold(e, e->in_calls ? ", " : "[TOOL_CALLS] [")) != 0 ||
        (rc = scaffold(e, "{\"name\": ")) != 0 || (rc = content(e, name)) != 0 ||
        (rc = scaffold(e, ", \"arguments\": ")) != 0 || (rc = content(e, args)) != 0 ||
        (rc = scaffold(e, ", \"id\": \"")) != 0 || (rc = content(e, b->id)) != 0)
        return rc;
    e->in_calls = true;
    return scaffold(e, "\"}");
}

static int mistral_block(emitter_t *e, const mistral_style_t *st, const eng_chat_msg_t *m,
                         size_t mi, size_t bi)
{
    const eng_chat_block_t *b = &m->blocks[bi];
    turn_t t = block_turn(m, b);
    int rc;
    if (b->kind != ENG_CHAT_BLOCK_TEXT && !st->tools)
        return pc_err_setf(e->err, e->err_len, PC_ERR_INVAL,
                           "messages.%zu.content.%zu: the model's chat format (mistral-v1) has no "
                           "tool use",
                           mi, bi);
    if (b->kind == ENG_CHAT_BLOCK_TOOL_RESULT) {
        if ((rc = mistral_open(e, st, TURN_TOOL)) != 0 ||
            (rc = scaffold(e, "[TOOL_RESULTS] {\"content\": ")) != 0 ||
            (rc = content(e, b->text)) != 0 || (rc = scaffold(e, ", \"call_id\": \"")) != 0 ||
            (rc = content(e, b->id)) != 0)
            return rc;
        return scaffold(e, "\"}[/TOOL_RESULTS]");
    }
    if (b->kind == ENG_CHAT_BLOCK_TOOL_USE) {
        /* Calls follow the reply's text of the same message without closing it. */
        bool cont = e->in_calls || (e->open == TURN_ASSISTANT && bi > 0);
        if (!cont && (rc = mistral_open(e, st, TURN_ASSISTANT)) != 0)
            return rc;
        return mistral_call(e, b, mi, bi);
    }
    bool cont = t == e->open && !e->in_calls && (bi > 0 || (t == TURN_USER && e->sys_turn));
    if (!cont && (rc = mistral_open(e, st, t)) != 0)
        return rc;
    if (t == TURN_USER && e->sys_turn && b->text.len > 0) {
        e->sys_turn = false;
        if (e->need_sep && (rc = scaffold(e, "\n\n")) != 0)
            return rc;
        e->need_sep = false;
    }
    pc_slice_t text = t == TURN_ASSISTANT && st->trim_reply ? trim(b->text) : b->text;
    if (t == TURN_ASSISTANT && text.len > 0 && !e->need_sep && (rc = scaffold(e, st->reply_open)))
        return rc;
    return sep_content(e, text);
}

static int mistral_render(emitter_t *e)
{
    const eng_chat_t *c = e->chat;
    const mistral_style_t *st =
        e->r->family == ENG_RENDER_FAMILY_MISTRAL ? &mistral_v3 : &mistral_v1;
    int rc;
    if ((rc = scaffold(e, "<s>")) != 0)
        return rc;
    if (c->n_tools > 0 && !st->tools)
        return pc_err_setf(e->err, e->err_len, PC_ERR_INVAL,
                           "tools: the model's chat format (mistral-v1) has no tool use");
    for (size_t i = 0; i < c->n_tools; i++) {
        if ((rc = mistral_tool(e, &c->tools[i], i)) != 0)
            return rc;
        e->in_tools = true;
        mark(e, ENG_RENDER_MARK_TOOL, 0, i, c->tools[i].cache_ttl);
    }
    for (size_t i = 0; i < c->n_system; i++) {
        if (i == 0 && (rc = mistral_open(e, st, TURN_USER)) != 0)
            return rc;
        e->sys_turn = true;
        if ((rc = sep_content(e, c->system[i].text)) != 0)
            return rc;
        mark(e, ENG_RENDER_MARK_SYSTEM, 0, i, c->system[i].cache_ttl);
    }
    for (size_t mi = 0; mi < c->n_messages; mi++) {
        const eng_chat_msg_t *m = &c->messages[mi];
        for (size_t bi = 0; bi < m->n_blocks; bi++) {
            if ((rc = mistral_block(e, st, m, mi, bi)) != 0)
                return rc;
            mark(e, ENG_RENDER_MARK_BLOCK, mi, bi, m->blocks[bi].cache_ttl);
        }
    }
    if (!c->prefill)
        return mistral_close(e, st);
    return 0;
}

/* ---- entry points --------------------------------------------------------------------- */

int eng_render_segments(const eng_render_t *r, const eng_chat_t *chat, pc_arena_t *arena,
                        eng_render_out_t *out, char *err, size_t err_len)
{
    emitter_t e = {0};
    size_t n_marks = chat->n_tools + chat->n_system + eng_chat_n_blocks(chat);
    int rc = PC_ERR_NOMEM;

    memset(out, 0, sizeof *out);
    e.r = r;
    e.chat = chat;
    e.arena = arena;
    e.err = err;
    e.err_len = err_len;
    e.json = PC_BUF_INIT;
    if (n_marks > UINT32_MAX)
        return pc_err_setf(err, err_len, PC_ERR_RANGE, "request has too many elements");
    if (n_marks > 0 && (e.marks = pc_arena_new(arena, eng_render_mark_t, n_marks)) == NULL)
        goto fail;
    switch (r->family) {
    case ENG_RENDER_FAMILY_LLAMA3:
        rc = llama3_render(&e);
        break;
    case ENG_RENDER_FAMILY_CHATML:
        rc = chatml_render(&e);
        break;
    default:
        rc = mistral_render(&e);
        break;
    }
    if (rc != 0)
        goto fail;
    out->seg_gen_start = e.n_segs;
    if (!chat->prefill && r->family == ENG_RENDER_FAMILY_LLAMA3)
        rc = llama3_gen_prompt(&e);
    else if (!chat->prefill && r->family == ENG_RENDER_FAMILY_CHATML)
        rc = chatml_gen_prompt(&e);
    if (rc != 0)
        goto fail;
    PC_ASSERT(e.n_marks == n_marks);
    rc = PC_ERR_NOMEM;
    out->segs = pc_arena_new(arena, eng_render_seg_t, e.n_segs > 0 ? e.n_segs : 1);
    if (out->segs == NULL)
        goto fail;
    memcpy(out->segs, e.segs, e.n_segs * sizeof *e.segs);
    out->n_segs = e.n_segs;
    out->marks = e.marks;
    out->n_marks = e.n_marks;
    rc = 0;
fail:
    pc_free(e.segs);
    pc_buf_free(&e.json);
    if (rc != 0)
        memset(out, 0, sizeof *out);
    return rc;
}

static int32_t piece_id(const eng_render_t *r, const char *text)
{
    for (size_t i = 0; i < r->n_pieces; i++)
        if (r->pieces[i].text == text)
            return r->ids[i];
    return -1;
}

int eng_render_tokenize(const eng_render_t *r, eng_render_out_t *out, pc_arena_t *arena, char *err,
                        size_t err_len)
{
    return eng_render_tokenize_cached(r, NULL, 0, out, arena, err, err_len);
}

int eng_render_tokenize_cached(const eng_render_t *r, eng_tokcache_t *cache, uint64_t scope,
                               eng_render_out_t *out, pc_arena_t *arena, char *err, size_t err_len)
{
    uint32_t *ids = NULL;
    size_t n = 0, cap = 0, mi = 0;
    int rc;

    if (r->tok == NULL)
        return pc_err_setf(err, err_len, PC_ERR_STATE, "renderer has no tokenizer");
    if (cache != NULL && eng_tokcache_tok(cache) != r->tok)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "the token cache belongs to another tokenizer");
    for (size_t s = 0; s <= out->n_segs; s++) {
        /* Marks whose element ends before segment s. */
        while (mi < out->n_marks && out->marks[mi].seg_end == s) {
            if (n > UINT32_MAX) {
                rc = pc_err_setf(err, err_len, PC_ERR_RANGE, "prompt longer than 2^32 tokens");
                goto fail;
            }
            out->marks[mi++].token_end = (uint32_t)n;
        }
        if (s == out->seg_gen_start)
            out->tokens_gen_start = n;
        if (s == out->n_segs)
            break;
        const eng_render_seg_t *g = &out->segs[s];
        int32_t id = g->kind == ENG_RENDER_SEG_TEXT ? -1 : piece_id(r, g->text.base);
        if (id >= 0) {
            if (n == cap) {
                size_t nc = cap != 0 ? cap * 2 : 256;
                uint32_t *p = pc_reallocarray(ids, nc, sizeof *p);
                if (p == NULL) {
                    rc = PC_ERR_NOMEM;
                    goto fail;
                }
                ids = p;
                cap = nc;
            }
            ids[n++] = (uint32_t)id;
        } else if (cache != NULL) {
            if ((rc = eng_tokcache_encode(cache, scope, g->text.base, g->text.len, &ids, &n,
                                          &cap)) != 0)
                goto fail;
        } else if ((rc = eng_tok_encode(r->tok, g->text.base, g->text.len, &ids, &n, &cap)) != 0) {
            goto fail;
        }
    }
    PC_ASSERT(mi == out->n_marks);
    if (n > UINT32_MAX) {
        rc = pc_err_setf(err, err_len, PC_ERR_RANGE, "prompt longer than 2^32 tokens");
        goto fail;
    }
    rc = PC_ERR_NOMEM;
    if ((out->tokens = pc_arena_new(arena, uint32_t, n > 0 ? n : 1)) == NULL)
        goto fail;
    if (n > 0)
        memcpy(out->tokens, ids, n * sizeof *ids);
    out->n_tokens = n;
    out->tokens_prefix_end = out->n_marks > 0 ? out->marks[out->n_marks - 1].token_end : 0;
    rc = 0;
fail:
    pc_free(ids);
    return rc;
}

int eng_render_chat(const eng_render_t *r, const eng_chat_t *chat, pc_arena_t *arena,
                    eng_render_out_t *out, char *err, size_t err_len)
{
    int rc = eng_render_segments(r, chat, arena, out, err, err_len);
    if (rc == 0 && (rc = eng_render_tokenize(r, out, arena, err, err_len)) != 0)
        memset(out, 0, sizeof *out);
    return rc;
}

int eng_render_chat_cached(const eng_render_t *r, eng_tokcache_t *cache, uint64_t scope,
                           const eng_chat_t *chat, pc_arena_t *arena, eng_render_out_t *out,
                           char *err, size_t err_len)
{
    int rc = eng_render_segments(r, chat, arena, out, err, err_len);
    if (rc == 0 &&
        (rc = eng_render_tokenize_cached(r, cache, scope, out, arena, err, err_len)) != 0)
        memset(out, 0, sizeof *out);
    return rc;
}

int eng_render_text(const eng_render_out_t *out, size_t seg_begin, size_t seg_end, pc_buf_t *b)
{
    for (size_t i = seg_begin; i < seg_end && i < out->n_segs; i++)
        if (pc_buf_append(b, out->segs[i].text.base, out->segs[i].text.len) != 0)
            return PC_ERR_NOMEM;
    return 0;
}
