/*
 * tokenizer.c — byte-level BPE (GPT-2, Llama 3, Qwen 2/3) and SentencePiece-style BPE (Llama 2,
 * Mistral) built from an eng_vocab_t.
 *
 * Byte-level BPE ("gpt2"):
 *   1. The text is cut into maximal runs of valid UTF-8; a byte outside such a run becomes its
 *      own byte token (so any byte string encodes, and decode gives it back).
 *   2. Qwen ("qwen2") normalizes each run to NFC first, as its tokenizer.json does.
 *   3. The run is split by the pre-tokenizer regex (PCRE2, UTF + UCP, JIT) into pieces; text
 *      between matches (never produced by the known regexes) is a piece too.
 *   4. Each piece is BPE-merged: one symbol per byte (the byte's token), then repeatedly the
 *      adjacent pair with the lowest merge rank, leftmost first (Hugging Face's order), with a
 *      heap so a megabyte-long piece costs O(n log n). Llama 3 ("llama-bpe") first looks the
 *      whole piece up in the vocab (tokenizer.json "ignore_merges"), as llama.cpp does.
 *   5. Pieces up to CACHE_MAX_KEY bytes are cached (piece bytes -> ids) in a sharded, bounded
 *      cache; a shard that fills up is cleared.
 * Tokens are matched by the bytes they stand for: the GPT-2 byte-to-unicode mapping of the
 * vocab strings is undone once at init, so encoding never builds mapped strings.
 *
 * SentencePiece-style BPE ("llama"): a non-empty text gets U+2581 prepended and every space
 * replaced by U+2581 (the Llama 2 tokenizer.json normalizer); there is no pre-tokenizer. Each
 * character is a symbol (its token, else its UTF-8 bytes as <0xNN> byte tokens, else unk), then
 * the same heap merge loop runs. With a merges list (tokenizer.json, GGUFs kvgw writes) the pair
 * ranks are the list's, as in Hugging Face; without one (llama.cpp's SentencePiece GGUFs) every
 * split of a token into two tokens is a pair ranked by the token's score, higher first and
 * leftmost on ties (llama.cpp's llm_tokenizer_spm order).
 *
 * Control, user-defined and unused tokens never come out of encode: they are not in the maps
 * encode consults. That is the no-injection contract of tokenizer.h.
 */
#include "tokenizer.h"

#include "common.h"
#include "tokenizer_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <pcre2.h>

#define MAX_TOKEN_BYTES 320 /* longest token text accepted (real vocabs stay under 260) */
#define CACHE_SHARDS 16
#define CACHE_SLOTS 8192          /* per shard, a power of two */
#define CACHE_ARENA (256u * 1024) /* bytes of keys and ids per shard */
#define CACHE_MAX_KEY 64          /* longer pieces are not cached */

static const struct {
    const char *name;
    const char *regex;
} pre_table[] = {
    {"llama-bpe", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                  "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {"qwen2", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
              "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {"default",
     "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"},
};

const char *eng__tok_pre_regex(const char *pre)
{
    for (size_t i = 0; pre != NULL && i < PC_ARRAY_LEN(pre_table); i++)
        if (strcmp(pre, pre_table[i].name) == 0)
            return pre_table[i].regex;
    return NULL;
}

const char *eng__tok_pre_name(const char *regex)
{
    for (size_t i = 0; regex != NULL && i < PC_ARRAY_LEN(pre_table); i++)
        if (strcmp(regex, pre_table[i].regex) == 0)
            return pre_table[i].name;
    return NULL;
}

/* ---- hashing and maps ------------------------------------------------------------------- */

/* Token id -> key bytes, for one map. */
typedef struct keyview {
    const char *blob;
    const uint32_t *off;
    const uint32_t *len;
} keyview_t;

/* The token id under key in m (by_text or by_bytes), or -1. */
static int32_t strmap_id(const pc_strmap_t *m, const void *key, size_t len)
{
    uint64_t id;
    return pc_strmap_get(m, key, len, &id) ? (int32_t)id : -1;
}

/* Indexes every token of kv for which keep() holds under its key; when two tokens share a
 * key, the first id wins. Returns 0 or PC_ERR_NOMEM. */
static int strmap_build(pc_strmap_t *m, const keyview_t *kv, uint32_t n, const struct eng_tok *t,
                        bool (*keep)(const struct eng_tok *, uint32_t))
{
    int rc = pc_strmap_reserve(m, n);
    for (uint32_t i = 0; rc == 0 && i < n; i++)
        if (keep == NULL || keep(t, i))
            rc = pc_strmap_insert(m, kv->blob + kv->off[i], kv->len[i], i, NULL) < 0 ? PC_ERR_NOMEM
                                                                                     : 0;
    return rc;
}

/* The merge table: (left id, right id) -> (rank, merged id), a pc_u64map keyed by the pair
 * packed as left << 32 | right, plus 1 (pc_u64map refuses key 0). The value is not a pointer
 * but (rank + 1) << 32 | merged id, so a lookup touches the table's slot and nothing else;
 * rank + 1 keeps it non-NULL. */
_Static_assert(sizeof(uintptr_t) >= sizeof(uint64_t), "pair values are packed into pointers");

typedef struct pair_val {
    uint32_t rank, id;
} pair_val_t;

static uint64_t pair_key(uint32_t a, uint32_t b)
{
    return ((uint64_t)a << 32 | b) + 1;
}

/* The merge of (a, b); false when there is none. */
static inline bool pairmap_get(const pc_u64map_t *m, uint32_t a, uint32_t b, pair_val_t *out)
{
    uintptr_t v = (uintptr_t)pc_u64map_get(m, pair_key(a, b));
    if (v == 0)
        return false;
    *out = (pair_val_t){(uint32_t)((uint64_t)v >> 32) - 1, (uint32_t)v};
    return true;
}

/* Adds the merge of (a, b) unless there is one (the first stays): 0 or PC_ERR_NOMEM. */
static int pairmap_put(pc_u64map_t *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t id)
{
    if (pc_u64map_get(m, pair_key(a, b)) != NULL)
        return 0;
    uint64_t v = ((uint64_t)rank + 1) << 32 | id;
    return pc_u64map_put(m, pair_key(a, b), (void *)(uintptr_t)v);
}

/* ---- the piece cache ---------------------------------------------------------------------- */

typedef struct cache_shard {
    pthread_mutex_t mu;
    uint64_t slots[CACHE_SLOTS]; /* hash tag << 32 | (arena offset + 1), 0 empty */
    uint32_t n;
    uint32_t used;
    unsigned char arena[CACHE_ARENA]; /* entries: u16 key_len, u16 n_ids, key, pad, u32 ids */
} cache_shard_t;

static size_t cache_entry_size(size_t key_len, size_t n_ids)
{
    return (4 + key_len + 3) / 4 * 4 + 4 * n_ids;
}

/* ---- the tokenizer ------------------------------------------------------------------------ */

enum tok_kind { TOK_BPE, TOK_SPM };

struct eng_tok {
    eng_vocab_t v; /* deep copy */
    enum tok_kind kind;
    bool ignore_merges; /* llama-bpe: a piece that is a token is that token */
    bool nfc;
    pcre2_code *re;

    /* Per token: its text (as stored) and the bytes it decodes to. */
    char *text_blob, *dec_blob;
    uint32_t *text_off, *text_len, *dec_off, *dec_len;
    pc_strmap_t by_text;  /* every token by its stored text -> id */
    pc_strmap_t by_bytes; /* BPE: normal tokens by decoded bytes -> id */
    int32_t byte_id[256]; /* the token of a lone byte, -1 if none */
    pc_u64map_t pairs;
    uint32_t n_pairs;
    int32_t spm_space_id; /* SPM: the token "\u2581" */

    cache_shard_t *cache; /* [CACHE_SHARDS], NULL for SPM */
};

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
 * for U+0100 + k in byte order. Fills cp -> byte for cp < 324 (-1 = no byte). */
static void byte_unicode_tables(uint16_t byte_to_cp[256], int16_t cp_to_byte[324])
{
    for (int i = 0; i < 324; i++)
        cp_to_byte[i] = -1;
    int k = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        byte_to_cp[b] = (uint16_t)(printable ? b : 256 + k++);
        cp_to_byte[byte_to_cp[b]] = (int16_t)b;
    }
}

/* The decoded bytes of token i into out (at most MAX_TOKEN_BYTES + 1). */
static size_t decode_text(const struct eng_tok *t, const int16_t *cp_to_byte, uint32_t i, char *out)
{
    const char *s = t->v.tokens[i];
    size_t n = strlen(s);
    int32_t type = t->v.token_type ? t->v.token_type[i] : ENG_TOKEN_TYPE_NORMAL;
    bool special = type == ENG_TOKEN_TYPE_CONTROL || type == ENG_TOKEN_TYPE_USER_DEFINED ||
                   type == ENG_TOKEN_TYPE_UNUSED;
    if (t->kind == TOK_SPM) {
        unsigned hi, lo;
        if (type == ENG_TOKEN_TYPE_BYTE && n == 6 && sscanf(s, "<0x%1X%1X>", &hi, &lo) == 2) {
            out[0] = (char)(hi << 4 | lo);
            return 1;
        }
        size_t k = 0;
        for (size_t j = 0; j < n;) {
            if (!special && j + 3 <= n && memcmp(s + j, "\xE2\x96\x81", 3) == 0) {
                out[k++] = ' ';
                j += 3;
            } else {
                out[k++] = s[j++];
            }
        }
        return k;
    }
    if (!special) {
        size_t k = 0;
        for (size_t j = 0; j < n;) {
            uint32_t cp;
            size_t l = pc_utf8_decode(s + j, n - j, &cp);
            if (l == 0 || cp >= 324 || cp_to_byte[cp] < 0)
                goto as_is;
            out[k++] = (char)cp_to_byte[cp];
            j += l;
        }
        return k;
    }
as_is:
    memcpy(out, s, n);
    return n;
}

static int vocab_copy(eng_vocab_t *d, const eng_vocab_t *s)
{
    *d = *s;
    d->tokens = NULL;
    d->merges = NULL;
    d->scores = NULL;
    d->token_type = NULL;
    d->model = pc_strdup(s->model);
    d->pre = pc_strdup(s->pre ? s->pre : "default");
    d->chat_template = s->chat_template ? pc_strdup(s->chat_template) : NULL;
    d->n_tokens = 0;
    d->n_merges = 0;
    if (d->model == NULL || d->pre == NULL || (s->chat_template && d->chat_template == NULL))
        return PC_ERR_NOMEM;
    if ((d->tokens = pc_calloc(s->n_tokens ? s->n_tokens : 1, sizeof *d->tokens)) == NULL)
        return PC_ERR_NOMEM;
    for (; d->n_tokens < s->n_tokens; d->n_tokens++)
        if ((d->tokens[d->n_tokens] = pc_strdup(s->tokens[d->n_tokens])) == NULL)
            return PC_ERR_NOMEM;
    if ((d->merges = pc_calloc(s->n_merges ? s->n_merges : 1, sizeof *d->merges)) == NULL)
        return PC_ERR_NOMEM;
    for (; d->n_merges < s->n_merges; d->n_merges++)
        if ((d->merges[d->n_merges] = pc_strdup(s->merges[d->n_merges])) == NULL)
            return PC_ERR_NOMEM;
    if (s->scores != NULL) {
        if ((d->scores = pc_malloc(s->n_tokens * sizeof *d->scores + 1)) == NULL)
            return PC_ERR_NOMEM;
        memcpy(d->scores, s->scores, s->n_tokens * sizeof *d->scores);
    }
    if ((d->token_type = pc_malloc(s->n_tokens * sizeof *d->token_type + 1)) == NULL)
        return PC_ERR_NOMEM;
    for (uint32_t i = 0; i < s->n_tokens; i++)
        d->token_type[i] = s->token_type ? s->token_type[i] : ENG_TOKEN_TYPE_NORMAL;
    return 0;
}

static bool encodable(const struct eng_tok *t, uint32_t id)
{
    int32_t type = t->v.token_type[id];
    return type == ENG_TOKEN_TYPE_NORMAL || type == ENG_TOKEN_TYPE_BYTE ||
           type == ENG_TOKEN_TYPE_UNDEFINED;
}

/* Builds the SPM pair table from scores: every split of a token into two tokens is a merge,
 * ranked by the merged token's score (higher first; equal scores share a rank). */
static int spm_pairs_build(struct eng_tok *t, const keyview_t *kv)
{
    uint32_t n = t->v.n_tokens;
    int rc = PC_ERR_NOMEM;
    uint32_t *order = pc_malloc(n * sizeof *order + 1);
    uint32_t *rank = pc_malloc(n * sizeof *rank + 1);
    if (order == NULL || rank == NULL)
        goto out;
    /* Dense ranks by descending score: insertion into a sorted order via qsort-free counting
     * would need the score range, so sort indices (n log n, n ~ 32k). */
    for (uint32_t i = 0; i < n; i++)
        order[i] = i;
    const float *sc = t->v.scores;
    /* Shell sort on scores, descending (no qsort_r in C11 to pass the scores through). */
    for (uint32_t gap = n / 2; gap > 0; gap /= 2)
        for (uint32_t i = gap; i < n; i++) {
            uint32_t x = order[i];
            uint32_t j = i;
            while (j >= gap && (sc ? sc[order[j - gap]] : 0.0f) < (sc ? sc[x] : 0.0f)) {
                order[j] = order[j - gap];
                j -= gap;
            }
            order[j] = x;
        }
    uint32_t r = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (i > 0 && (sc ? sc[order[i]] : 0.0f) != (sc ? sc[order[i - 1]] : 0.0f))
            r++;
        rank[order[i]] = r;
    }
    size_t n_pairs = 0; /* at most: every split of every token */
    for (uint32_t i = 0; i < n; i++)
        if (encodable(t, i) && t->v.token_type[i] != ENG_TOKEN_TYPE_BYTE)
            n_pairs += kv->len[i] > 1 ? kv->len[i] - 1 : 0;
    if ((rc = pc_u64map_reserve(&t->pairs, n_pairs)) != 0)
        goto out;
    for (uint32_t i = 0; i < n; i++) {
        if (!encodable(t, i) || t->v.token_type[i] == ENG_TOKEN_TYPE_BYTE)
            continue;
        const char *s = kv->blob + kv->off[i];
        for (uint32_t cut = 1; cut < kv->len[i]; cut++) {
            if ((s[cut] & 0xC0) == 0x80)
                continue; /* not a character boundary */
            int32_t a = strmap_id(&t->by_text, s, cut);
            int32_t b = strmap_id(&t->by_text, s + cut, kv->len[i] - cut);
            if (a >= 0 && b >= 0 && encodable(t, (uint32_t)a) && encodable(t, (uint32_t)b)) {
                if ((rc = pairmap_put(&t->pairs, (uint32_t)a, (uint32_t)b, rank[i], i)) != 0)
                    goto out;
                t->n_pairs++;
            }
        }
    }
    rc = 0;
out:
    pc_free(order);
    pc_free(rank);
    return rc;
}

/* The pair table from the merges list: merge r of "a b" makes token ab with rank r. */
static int merges_build(struct eng_tok *t, char *err, size_t err_len)
{
    int rc;
    if ((rc = pc_u64map_reserve(&t->pairs, t->v.n_merges)) != 0)
        return rc;
    for (uint32_t r = 0; r < t->v.n_merges; r++) {
        const char *m = t->v.merges[r];
        const char *sp = m[0] ? strchr(m + 1, ' ') : NULL;
        int32_t a = -1, b = -1, ab = -1;
        if (sp != NULL) {
            size_t la = (size_t)(sp - m), lb = strlen(sp + 1);
            char buf[2 * MAX_TOKEN_BYTES + 2];
            a = strmap_id(&t->by_text, m, la);
            b = strmap_id(&t->by_text, sp + 1, lb);
            if (la + lb <= 2 * MAX_TOKEN_BYTES) {
                memcpy(buf, m, la);
                memcpy(buf + la, sp + 1, lb);
                ab = strmap_id(&t->by_text, buf, la + lb);
            }
        }
        if (a < 0 || b < 0 || ab < 0) {
            rc = pc_err_setf(err, err_len, PC_ERR_FORMAT,
                             "tokenizer: merge %u '%.60s' names unknown tokens", r, m);
            return rc;
        }
        if ((rc = pairmap_put(&t->pairs, (uint32_t)a, (uint32_t)b, r, (uint32_t)ab)) != 0)
            return rc;
        t->n_pairs++;
    }
    return 0;
}

int eng_tok_init(const eng_vocab_t *v, eng_tok_t **out, char *err, size_t err_len)
{
    int rc = PC_ERR_NOMEM;
    struct eng_tok *t = pc_calloc(1, sizeof *t);
    if (t == NULL)
        goto fail;
    if (v->n_tokens == 0 || v->tokens == NULL || v->model == NULL) {
        rc = pc_err_setf(err, err_len, PC_ERR_FORMAT, "tokenizer: empty vocab");
        goto fail;
    }
    if (strcmp(v->model, "gpt2") == 0) {
        t->kind = TOK_BPE;
    } else if (strcmp(v->model, "llama") == 0) {
        t->kind = TOK_SPM;
    } else {
        rc = pc_err_setf(err, err_len, PC_ERR_UNSUPPORTED,
                         "tokenizer: unsupported tokenizer model '%s'", v->model);
        goto fail;
    }
    if ((rc = vocab_copy(&t->v, v)) != 0)
        goto fail;
    const char *regex = NULL;
    if (t->kind == TOK_BPE && (regex = eng__tok_pre_regex(t->v.pre)) == NULL) {
        rc = pc_err_setf(err, err_len, PC_ERR_UNSUPPORTED,
                         "tokenizer: unsupported pre-tokenizer '%s'", t->v.pre);
        goto fail;
    }
    t->ignore_merges = t->kind == TOK_BPE && strcmp(t->v.pre, "llama-bpe") == 0;
    t->nfc = t->kind == TOK_BPE && strcmp(t->v.pre, "qwen2") == 0;
    if (regex != NULL) {
        int ec;
        PCRE2_SIZE eo;
        t->re = pcre2_compile((PCRE2_SPTR)regex, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec,
                              &eo, NULL);
        if (t->re == NULL) {
            rc = pc_err_setf(err, err_len, PC_ERR_INTERNAL,
                             "tokenizer: regex for '%s' does not compile (%d at %zu)", t->v.pre, ec,
                             (size_t)eo);
            goto fail;
        }
        pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE); /* interpreter when JIT is unavailable */
    }

    /* Token texts and decoded bytes. */
    uint32_t n = t->v.n_tokens;
    uint16_t byte_to_cp[256];
    int16_t cp_to_byte[324];
    byte_unicode_tables(byte_to_cp, cp_to_byte);
    size_t text_total = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t l = strlen(t->v.tokens[i]);
        if (l > MAX_TOKEN_BYTES) {
            rc =
                pc_err_setf(err, err_len, PC_ERR_FORMAT,
                            "tokenizer: token %u is %zu bytes (at most %d)", i, l, MAX_TOKEN_BYTES);
            goto fail;
        }
        text_total += l;
    }
    rc = PC_ERR_NOMEM;
    t->text_blob = pc_malloc(text_total + 1);
    t->dec_blob = pc_malloc(text_total + 1); /* decoding never lengthens a token */
    t->text_off = pc_malloc(n * sizeof(uint32_t));
    t->text_len = pc_malloc(n * sizeof(uint32_t));
    t->dec_off = pc_malloc(n * sizeof(uint32_t));
    t->dec_len = pc_malloc(n * sizeof(uint32_t));
    if (t->text_blob == NULL || t->dec_blob == NULL || t->text_off == NULL || t->text_len == NULL ||
        t->dec_off == NULL || t->dec_len == NULL)
        goto fail;
    size_t to = 0, dof = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t l = strlen(t->v.tokens[i]);
        memcpy(t->text_blob + to, t->v.tokens[i], l);
        t->text_off[i] = (uint32_t)to;
        t->text_len[i] = (uint32_t)l;
        to += l;
        char buf[MAX_TOKEN_BYTES + 1];
        size_t dl = decode_text(t, cp_to_byte, i, buf);
        memcpy(t->dec_blob + dof, buf, dl);
        t->dec_off[i] = (uint32_t)dof;
        t->dec_len[i] = (uint32_t)dl;
        dof += dl;
    }
    keyview_t kv_text = {t->text_blob, t->text_off, t->text_len};
    keyview_t kv_bytes = {t->dec_blob, t->dec_off, t->dec_len};
    if ((rc = strmap_build(&t->by_text, &kv_text, n, t, NULL)) != 0)
        goto fail;

    for (int b = 0; b < 256; b++)
        t->byte_id[b] = -1;
    if (t->kind == TOK_BPE) {
        if ((rc = strmap_build(&t->by_bytes, &kv_bytes, n, t, encodable)) != 0)
            goto fail;
        for (int b = 0; b < 256; b++) {
            char c = (char)b;
            t->byte_id[b] = strmap_id(&t->by_bytes, &c, 1);
            if (t->byte_id[b] < 0) {
                rc = pc_err_setf(err, err_len, PC_ERR_FORMAT,
                                 "tokenizer: byte-level vocab lacks the token of byte 0x%02X", b);
                goto fail;
            }
        }
        rc = PC_ERR_NOMEM;
        if ((rc = merges_build(t, err, err_len)) != 0)
            goto fail;
        rc = PC_ERR_NOMEM;
        if ((t->cache = pc_calloc(CACHE_SHARDS, sizeof *t->cache)) == NULL)
            goto fail;
        for (int i = 0; i < CACHE_SHARDS; i++)
            pthread_mutex_init(&t->cache[i].mu, NULL);
    } else {
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->byte_id[b] = strmap_id(&t->by_text, name, 6);
        }
        t->spm_space_id = strmap_id(&t->by_text, "\xE2\x96\x81", 3);
        /* With a merges list (tokenizer.json, GGUFs kvgw writes) the merges decide, exactly as
         * Hugging Face does; without one (llama.cpp's SentencePiece GGUFs) the scores do. */
        rc = t->v.n_merges > 0 ? merges_build(t, err, err_len) : spm_pairs_build(t, &kv_text);
        if (rc != 0)
            goto fail;
    }
    *out = t;
    return 0;
fail:
    if (rc == PC_ERR_NOMEM)
        pc_err_setf(err, err_len, rc, "tokenizer: out of memory");
    eng_tok_free(t);
    return rc;
}

void eng_tok_free(eng_tok_t *t)
{
    if (t == NULL)
        return;
    if (t->cache != NULL) {
        for (int i = 0; i < CACHE_SHARDS; i++)
            pthread_mutex_destroy(&t->cache[i].mu);
        pc_free(t->cache);
    }
    if (t->re != NULL)
        pcre2_code_free(t->re);
    pc_u64map_free(&t->pairs);
    pc_strmap_free(&t->by_text);
    pc_strmap_free(&t->by_bytes);
    pc_free(t->text_blob);
    pc_free(t->dec_blob);
    pc_free(t->text_off);
    pc_free(t->text_len);
    pc_free(t->dec_off);
    pc_free(t->dec_len);
    if (t->v.tokens != NULL)
        for (uint32_t i = 0; i < t->v.n_tokens; i++)
            pc_free(t->v.tokens[i]);
    if (t->v.merges != NULL)
        for (uint32_t i = 0; i < t->v.n_merges; i++)
            pc_free(t->v.merges[i]);
    pc_free(t->v.tokens);
    pc_free(t->v.merges);
    pc_free(t->v.scores);
    pc_free(t->v.token_type);
    pc_free(t->v.model);
    pc_free(t->v.pre);
    pc_free(t->v.chat_template);
    pc_free(t);
}

/* ---- output array ----------------------------------------------------------------------- */

typedef struct out_ids {
    uint32_t **ids;
    size_t *n, *cap;
} out_ids_t;

static int out_reserve(out_ids_t *o, size_t more)
{
    if (*o->n + more <= *o->cap)
        return 0;
    size_t cap = *o->cap ? *o->cap : 64;
    while (cap < *o->n + more)
        cap *= 2;
    uint32_t *p = pc_reallocarray(*o->ids, cap, sizeof *p);
    if (p == NULL)
        return PC_ERR_NOMEM;
    *o->ids = p;
    *o->cap = cap;
    return 0;
}

static inline int out_push(out_ids_t *o, uint32_t id)
{
    if (*o->n == *o->cap && out_reserve(o, 1) != 0)
        return PC_ERR_NOMEM;
    (*o->ids)[(*o->n)++] = id;
    return 0;
}

/* ---- BPE merge loop ----------------------------------------------------------------------- */

typedef struct sym {
    uint32_t id;
    int32_t prev, next; /* -1 at the ends */
    bool dead;
} sym_t;

typedef struct cand {
    uint64_t key; /* rank << 32 | position of the left symbol */
    uint32_t a, b;
} cand_t;

typedef struct work {
    sym_t *sym;
    size_t sym_cap;
    cand_t *heap;
    size_t heap_n, heap_cap;
    sym_t sym_small[64];
    cand_t heap_small[128];
} work_t;

static void work_init(work_t *w)
{
    w->sym = w->sym_small;
    w->sym_cap = PC_ARRAY_LEN(w->sym_small);
    w->heap = w->heap_small;
    w->heap_cap = PC_ARRAY_LEN(w->heap_small);
    w->heap_n = 0;
}

static void work_free(work_t *w)
{
    if (w->sym != w->sym_small)
        pc_free(w->sym);
    if (w->heap != w->heap_small)
        pc_free(w->heap);
}

static int work_reserve(work_t *w, size_t n_sym)
{
    if (n_sym > w->sym_cap) {
        sym_t *s = pc_reallocarray(w->sym == w->sym_small ? NULL : w->sym, n_sym, sizeof *s);
        if (s == NULL)
            return PC_ERR_NOMEM;
        w->sym = s;
        w->sym_cap = n_sym;
    }
    return 0;
}

static int heap_push(work_t *w, uint64_t key, uint32_t a, uint32_t b)
{
    if (w->heap_n == w->heap_cap) {
        size_t cap = w->heap_cap * 2;
        cand_t *h = pc_reallocarray(NULL, cap, sizeof *h);
        if (h == NULL)
            return PC_ERR_NOMEM;
        memcpy(h, w->heap, w->heap_n * sizeof *h);
        if (w->heap != w->heap_small)
            pc_free(w->heap);
        w->heap = h;
        w->heap_cap = cap;
    }
    size_t i = w->heap_n++;
    cand_t c = {key, a, b};
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (w->heap[p].key <= key)
            break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = c;
    return 0;
}

static cand_t heap_pop(work_t *w)
{
    cand_t top = w->heap[0];
    cand_t last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= n)
            break;
        size_t m = l + 1 < n && w->heap[l + 1].key < w->heap[l].key ? l + 1 : l;
        if (w->heap[m].key >= last.key)
            break;
        w->heap[i] = w->heap[m];
        i = m;
    }
    if (n > 0)
        w->heap[i] = last;
    return top;
}

static int try_pair(const struct eng_tok *t, work_t *w, int32_t left)
{
    if (left < 0)
        return 0;
    int32_t right = w->sym[left].next;
    if (right < 0)
        return 0;
    pair_val_t p;
    if (!pairmap_get(&t->pairs, w->sym[left].id, w->sym[right].id, &p))
        return 0;
    return heap_push(w, (uint64_t)p.rank << 32 | (uint32_t)left, w->sym[left].id, w->sym[right].id);
}

/* Merges the n symbols in w->sym (linked in order) and appends the result. */
static int bpe_merge(const struct eng_tok *t, work_t *w, size_t n, out_ids_t *o)
{
    int rc;
    w->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++)
        if ((rc = try_pair(t, w, (int32_t)i)) != 0)
            return rc;
    while (w->heap_n > 0) {
        cand_t c = heap_pop(w);
        int32_t left = (int32_t)(uint32_t)c.key;
        sym_t *l = &w->sym[left];
        if (l->dead || l->id != c.a || l->next < 0)
            continue;
        sym_t *r = &w->sym[l->next];
        if (r->id != c.b)
            continue;
        pair_val_t p;
        bool found = pairmap_get(&t->pairs, c.a, c.b, &p);
        PC_ASSERT(found); /* try_pair found it */
        l->id = p.id;
        r->dead = true;
        l->next = r->next;
        if (r->next >= 0)
            w->sym[r->next].prev = left;
        if ((rc = try_pair(t, w, l->prev)) != 0 || (rc = try_pair(t, w, left)) != 0)
            return rc;
    }
    size_t count = 0;
    for (int32_t i = 0; i >= 0; i = w->sym[i].next)
        count++;
    if ((rc = out_reserve(o, count)) != 0)
        return rc;
    for (int32_t i = 0; i >= 0; i = w->sym[i].next)
        (*o->ids)[(*o->n)++] = w->sym[i].id;
    return 0;
}

/* ---- byte-level BPE ----------------------------------------------------------------------- */

static bool cache_get(const struct eng_tok *t, const char *s, size_t len, uint64_t h, out_ids_t *o,
                      int *rc)
{
    cache_shard_t *sh = &t->cache[h & (CACHE_SHARDS - 1)];
    uint64_t tag = h >> 32;
    bool hit = false;
    pthread_mutex_lock(&sh->mu);
    for (uint64_t i = (h >> 4) & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
        uint64_t slot = sh->slots[i];
        if (slot == 0)
            break;
        if ((slot >> 32) != tag)
            continue;
        const unsigned char *e = sh->arena + (uint32_t)slot - 1;
        uint16_t kl, ni;
        memcpy(&kl, e, 2);
        memcpy(&ni, e + 2, 2);
        if (kl != len || memcmp(e + 4, s, len) != 0)
            continue;
        *rc = out_reserve(o, ni);
        if (*rc == 0) {
            memcpy(*o->ids + *o->n, e + cache_entry_size(kl, 0), ni * sizeof(uint32_t));
            *o->n += ni;
        }
        hit = true;
        break;
    }
    pthread_mutex_unlock(&sh->mu);
    return hit;
}

static void cache_put(const struct eng_tok *t, const char *s, size_t len, uint64_t h,
                      const uint32_t *ids, size_t n_ids)
{
    cache_shard_t *sh = &t->cache[h & (CACHE_SHARDS - 1)];
    size_t sz = cache_entry_size(len, n_ids);
    pthread_mutex_lock(&sh->mu);
    if (sh->used + sz > CACHE_ARENA || sh->n + 1 > CACHE_SLOTS / 2) {
        memset(sh->slots, 0, sizeof sh->slots); /* full: start over */
        sh->used = 0;
        sh->n = 0;
    }
    uint64_t i = (h >> 4) & (CACHE_SLOTS - 1);
    while (sh->slots[i] != 0)
        i = (i + 1) & (CACHE_SLOTS - 1);
    unsigned char *e = sh->arena + sh->used;
    uint16_t kl = (uint16_t)len, ni = (uint16_t)n_ids;
    memcpy(e, &kl, 2);
    memcpy(e + 2, &ni, 2);
    memcpy(e + 4, s, len);
    memcpy(e + cache_entry_size(len, 0), ids, n_ids * sizeof(uint32_t));
    sh->slots[i] = (h >> 32) << 32 | ((uint64_t)sh->used + 1);
    sh->used += (uint32_t)sz;
    sh->n++;
    pthread_mutex_unlock(&sh->mu);
}

/* One pre-token piece of raw bytes. */
static int bpe_piece(const struct eng_tok *t, work_t *w, const char *s, size_t len, out_ids_t *o)
{
    if (len == 1)
        return out_push(o, (uint32_t)t->byte_id[(unsigned char)s[0]]);
    if (t->ignore_merges) {
        int32_t id = strmap_id(&t->by_bytes, s, len);
        if (id >= 0)
            return out_push(o, (uint32_t)id);
    }
    uint64_t h = 0;
    int rc = 0;
    if (len <= CACHE_MAX_KEY) {
        h = pc_hash_bytes(s, len);
        if (cache_get(t, s, len, h, o, &rc))
            return rc;
    }
    if ((rc = work_reserve(w, len)) != 0)
        return rc;
    for (size_t i = 0; i < len; i++)
        w->sym[i] = (sym_t){(uint32_t)t->byte_id[(unsigned char)s[i]], (int32_t)i - 1,
                            i + 1 < len ? (int32_t)i + 1 : -1, false};
    size_t before = *o->n;
    if ((rc = bpe_merge(t, w, len, o)) != 0)
        return rc;
    if (len <= CACHE_MAX_KEY && *o->n - before <= UINT16_MAX)
        cache_put(t, s, len, h, *o->ids + before, *o->n - before);
    return 0;
}

/* A run of valid UTF-8: split by the regex, each piece merged. */
static int bpe_run(const struct eng_tok *t, work_t *w, pcre2_match_data *md, const char *s,
                   size_t len, out_ids_t *o)
{
    size_t pos = 0;
    int rc;
    while (pos < len) {
        int m = pcre2_match(t->re, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        size_t ms = len, me = len;
        if (m >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            ms = ov[0];
            me = ov[1];
        } else if (m != PCRE2_ERROR_NOMATCH) {
            return PC_ERR_INTERNAL; /* resource limits; not reached by the known patterns */
        }
        if (ms > pos && (rc = bpe_piece(t, w, s + pos, ms - pos, o)) != 0)
            return rc;
        if (me > ms && (rc = bpe_piece(t, w, s + ms, me - ms, o)) != 0)
            return rc;
        if (me == ms) { /* an empty match: step over one character */
            if (me >= len)
                break;
            size_t k = pc_utf8_seq_len((const unsigned char *)s + me, len - me);
            if ((rc = bpe_piece(t, w, s + me, k, o)) != 0)
                return rc;
            me += k;
        }
        pos = me;
    }
    return 0;
}

static int bpe_encode(const struct eng_tok *t, const char *text, size_t len, out_ids_t *o)
{
    work_t w;
    work_init(&w);
    pc_buf_t norm = PC_BUF_INIT;
    int rc = 0;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re, NULL);
    if (md == NULL) {
        rc = PC_ERR_NOMEM;
        goto out;
    }
    const unsigned char *u = (const unsigned char *)text;
    size_t pos = 0;
    while (pos < len) {
        size_t v = pc_utf8_valid_prefix(u + pos, len - pos);
        if (v == 0) { /* an invalid byte: its own token */
            if ((rc = out_push(o, (uint32_t)t->byte_id[u[pos]])) != 0)
                goto out;
            pos++;
            continue;
        }
        const char *run = text + pos;
        size_t run_len = v;
        if (t->nfc) {
            bool ascii = true;
            for (size_t i = 0; i < v && ascii; i++)
                ascii = u[pos + i] < 0x80;
            if (!ascii) {
                norm.len = 0;
                if ((rc = eng__utf8_nfc(run, v, &norm)) != 0)
                    goto out;
                run = norm.base;
                run_len = norm.len;
            }
        }
        if ((rc = bpe_run(t, &w, md, run, run_len, o)) != 0)
            goto out;
        pos += v;
    }
out:
    pcre2_match_data_free(md);
    pc_buf_free(&norm);
    work_free(&w);
    return rc;
}

/* ---- SentencePiece-style BPE ---------------------------------------------------------------- */

static int spm_encode(const struct eng_tok *t, const char *text, size_t len, out_ids_t *o)
{
    if (len == 0)
        return 0;
    pc_buf_t norm = PC_BUF_INIT;
    work_t w;
    work_init(&w);
    int rc = PC_ERR_NOMEM;
    if (pc_buf_append(&norm, "\xE2\x96\x81", 3) != 0)
        goto out;
    for (size_t i = 0; i < len; i++) {
        const char *piece = text[i] == ' ' ? "\xE2\x96\x81" : text + i;
        if (pc_buf_append(&norm, piece, text[i] == ' ' ? 3 : 1) != 0)
            goto out;
    }
    /* Symbols: characters that are tokens, else their bytes' tokens, else unk. */
    const unsigned char *s = (const unsigned char *)norm.base;
    if ((rc = work_reserve(&w, norm.len)) != 0)
        goto out;
    size_t n = 0;
    for (size_t i = 0; i < norm.len;) {
        size_t k = pc_utf8_seq_len(s + i, norm.len - i);
        int32_t id = -1;
        if (k > 0) {
            id = strmap_id(&t->by_text, s + i, k);
            if (id >= 0 && !encodable(t, (uint32_t)id))
                id = -1;
        } else {
            k = 1;
        }
        if (id >= 0) {
            w.sym[n++] = (sym_t){(uint32_t)id, 0, 0, false};
        } else {
            for (size_t j = 0; j < k; j++) {
                int32_t b = t->byte_id[s[i + j]];
                if (b < 0 && t->v.unk_id < 0) {
                    rc = PC_ERR_RANGE; /* cannot happen with a vocab that has unk or bytes */
                    goto out;
                }
                if (b < 0 && j > 0)
                    break; /* one unk for the whole character */
                w.sym[n++] = (sym_t){(uint32_t)(b >= 0 ? b : t->v.unk_id), 0, 0, false};
            }
        }
        i += k;
    }
    for (size_t i = 0; i < n; i++) {
        w.sym[i].prev = (int32_t)i - 1;
        w.sym[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    rc = n > 0 ? bpe_merge(t, &w, n, o) : 0;
out:
    pc_buf_free(&norm);
    work_free(&w);
    return rc;
}

int eng_tok_encode(const eng_tok_t *t, const char *text, size_t len, uint32_t **ids, size_t *n_ids,
                   size_t *cap)
{
    size_t n0 = *n_ids;
    out_ids_t o = {ids, n_ids, cap};
    int rc = t->kind == TOK_BPE ? bpe_encode(t, text, len, &o) : spm_encode(t, text, len, &o);
    if (rc != 0)
        *n_ids = n0;
    return rc;
}

/* ---- NFC -------------------------------------------------------------------------------- */

bool eng__tok_nfc(const eng_tok_t *t)
{
    return t->nfc;
}

int eng__utf8_nfc(const char *text, size_t len, pc_buf_t *out)
{
    UErrorCode ec = U_ZERO_ERROR;
    const UNormalizer2 *nfc = unorm2_getNFCInstance(&ec);
    if (U_FAILURE(ec) || len > INT32_MAX / 4)
        return pc_buf_append(out, text, len); /* no ICU data: leave the text as it is */
    const unsigned char *u = (const unsigned char *)text;
    UChar *src = NULL, *dst = NULL;
    int rc = 0;
    size_t pos = 0;
    while (pos < len && rc == 0) {
        size_t v = pc_utf8_valid_prefix(u + pos, len - pos);
        if (v == 0) {
            rc = pc_buf_append(out, text + pos, 1);
            pos++;
            continue;
        }
        int32_t n16 = 0, m16 = 0, n8 = 0;
        ec = U_ZERO_ERROR;
        pc_free(src);
        pc_free(dst);
        src = pc_malloc((v + 1) * sizeof(UChar));
        dst = pc_malloc((3 * v + 8) * sizeof(UChar));
        if (src == NULL || dst == NULL) {
            rc = PC_ERR_NOMEM;
            break;
        }
        u_strFromUTF8(src, (int32_t)v + 1, &n16, text + pos, (int32_t)v, &ec);
        if (!U_FAILURE(ec) && unorm2_quickCheck(nfc, src, n16, &ec) == UNORM_YES) {
            rc = pc_buf_append(out, text + pos, v);
            pos += v;
            continue;
        }
        ec = U_ZERO_ERROR;
        m16 = unorm2_normalize(nfc, src, n16, dst, (int32_t)(3 * v + 8), &ec);
        char *w = U_FAILURE(ec) ? NULL : pc_buf_reserve(out, (size_t)m16 * 3 + 1);
        if (w != NULL)
            u_strToUTF8(w, m16 * 3 + 1, &n8, dst, m16, &ec);
        if (w == NULL || U_FAILURE(ec)) {
            rc = w == NULL && !U_FAILURE(ec) ? PC_ERR_NOMEM : pc_buf_append(out, text + pos, v);
        } else {
            pc_buf_commit(out, (size_t)n8);
        }
        pos += v;
    }
    pc_free(src);
    pc_free(dst);
    return rc;
}

/* ---- lookups and decode ------------------------------------------------------------------- */

int32_t eng_tok_piece_id(const eng_tok_t *t, const char *piece)
{
    return strmap_id(&t->by_text, piece, strlen(piece));
}

uint32_t eng_tok_n_vocab(const eng_tok_t *t)
{
    return t->v.n_tokens;
}

const eng_vocab_t *eng_tok_vocab(const eng_tok_t *t)
{
    return &t->v;
}

bool eng_tok_is_control(const eng_tok_t *t, uint32_t id)
{
    return id < t->v.n_tokens && (t->v.token_type[id] == ENG_TOKEN_TYPE_CONTROL ||
                                  t->v.token_type[id] == ENG_TOKEN_TYPE_UNUSED);
}

bool eng_tok_is_eog(const eng_tok_t *t, uint32_t id)
{
    return (int64_t)id == t->v.eos_id || (int64_t)id == t->v.eot_id || (int64_t)id == t->v.eom_id;
}

size_t eng_tok_decode_token(const eng_tok_t *t, uint32_t id, bool with_special, char *buf,
                            size_t cap)
{
    if (id >= t->v.n_tokens || (!with_special && eng_tok_is_control(t, id)))
        return 0;
    size_t n = t->dec_len[id];
    if (n <= cap)
        memcpy(buf, t->dec_blob + t->dec_off[id], n);
    return n;
}

/* ---- streaming decode --------------------------------------------------------------------- */

void eng_tok_stream_init(eng_tok_stream_t *s, const eng_tok_t *t, bool with_special)
{
    memset(s, 0, sizeof *s);
    s->tok = t;
    s->with_special = with_special;
    s->_leading_space_strip = t->kind == TOK_SPM;
}

/* Moves complete characters from in[0..n) to out, replacing invalid sequences with U+FFFD, and
 * returns how many input bytes were consumed; an incomplete (but so far valid) final sequence
 * is left unconsumed when `final` is false. */
static size_t utf8_sanitize(const unsigned char *in, size_t n, bool final, char *out, size_t cap,
                            size_t *written)
{
    size_t i = 0, w = 0;
    while (i < n) {
        size_t k = pc_utf8_seq_len(in + i, n - i);
        if (k == 0) {
            /* A valid but truncated prefix at the end waits for more bytes. */
            if (!final && pc_utf8_incomplete(in + i, n - i))
                break;
            if (w + 3 > cap)
                break;
            memcpy(out + w, "\xEF\xBF\xBD", 3);
            w += 3;
            i++;
            continue;
        }
        if (w + k > cap)
            break;
        memcpy(out + w, in + i, k);
        w += k;
        i += k;
    }
    *written = w;
    return i;
}

size_t eng_tok_stream_feed(eng_tok_stream_t *s, uint32_t id, char *out, size_t cap)
{
    const eng_tok_t *t = s->tok;
    unsigned char buf[sizeof s->_pending + MAX_TOKEN_BYTES];
    size_t n = s->_n_pending;
    memcpy(buf, s->_pending, n);
    size_t k = eng_tok_decode_token(t, id, s->with_special, (char *)buf + n, MAX_TOKEN_BYTES);
    if (k > MAX_TOKEN_BYTES)
        k = 0;
    if (k > 0 && s->_leading_space_strip) {
        s->_leading_space_strip = false;
        if (buf[n] == ' ') {
            memmove(buf + n, buf + n + 1, k - 1);
            k--;
        }
    }
    n += k;
    size_t w = 0;
    size_t used = utf8_sanitize(buf, n, false, out, cap, &w);
    s->_n_pending = n - used;
    if (s->_n_pending > sizeof s->_pending) { /* out too small: drop what cannot be kept */
        s->_n_pending = 0;
    }
    memcpy(s->_pending, buf + used, s->_n_pending);
    return w;
}

size_t eng_tok_stream_flush(eng_tok_stream_t *s, char *out, size_t cap)
{
    size_t w = 0;
    utf8_sanitize(s->_pending, s->_n_pending, true, out, cap, &w);
    s->_n_pending = 0;
    return w;
}

int eng_tok_decode(const eng_tok_t *t, const uint32_t *ids, size_t n, bool with_special,
                   pc_buf_t *out)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= t->v.n_tokens)
            return PC_ERR_RANGE;
        if (with_special || !eng_tok_is_control(t, ids[i]))
            total += t->dec_len[ids[i]];
    }
    char *w = pc_buf_reserve(out, total + 1);
    if (w == NULL)
        return PC_ERR_NOMEM;
    size_t k = 0;
    bool strip = t->kind == TOK_SPM;
    for (size_t i = 0; i < n; i++) {
        if (!with_special && eng_tok_is_control(t, ids[i]))
            continue;
        const char *src = t->dec_blob + t->dec_off[ids[i]];
        size_t len = t->dec_len[ids[i]];
        if (strip && len > 0) {
            strip = false;
            if (src[0] == ' ') {
                src++;
                len--;
            }
        }
        memcpy(w + k, src, len);
        k += len;
    }
    pc_buf_commit(out, k);
    return 0;
}
