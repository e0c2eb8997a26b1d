/*
 * test_stop.c — the streamed stop-sequence matcher (engine/stop.c): hand-written cases (stops
 * split across pieces, overlapping candidates, a stop at the very start, multi-byte UTF-8,
 * flush), and a differential test against a brute-force reference over random texts, stops and
 * splits: the output must depend only on the text, never on how it was cut into pieces.
 */
#include "pc_test.h"

#include "common.h"
#include "sampling.h"
#include "stop.h"

typedef struct run {
    char out[4096];
    size_t out_len;
    int stopped; /* 1 when a stop matched */
    uint32_t which;
    size_t max_held;
} run_t;

/* Feeds text cut at cuts[0..n_cuts) (increasing offsets) and flushes when no stop matched. */
static void run_pieces(const pc_slice_t *stops, uint32_t n_stops, const char *text, size_t len,
                       const size_t *cuts, size_t n_cuts, run_t *r)
{
    eng_stop_t *m = NULL;
    ASSERT_EQ(eng_stop_init(stops, n_stops, &m, NULL, 0), 0);
    pc_buf_t out = PC_BUF_INIT;
    memset(r, 0, sizeof *r);
    size_t at = 0;
    for (size_t i = 0; i <= n_cuts && !r->stopped; i++) {
        size_t end = i < n_cuts ? cuts[i] : len;
        int rc = eng_stop_feed(m, text + at, end - at, &out, &r->which);
        ASSERT_TRUE(rc == 0 || rc == 1);
        r->stopped = rc;
        if (eng_stop_held(m) > r->max_held)
            r->max_held = eng_stop_held(m);
        at = end;
    }
    if (r->stopped) {
        ASSERT_EQ(eng_stop_held(m), 0);
        ASSERT_EQ(eng_stop_feed(m, "x", 1, &out, NULL), PC_ERR_STATE);
        ASSERT_EQ(eng_stop_flush(m, &out), PC_ERR_STATE);
    } else {
        ASSERT_EQ(eng_stop_flush(m, &out), 0);
        ASSERT_EQ(eng_stop_flush(m, &out), PC_ERR_STATE);
    }
    ASSERT_TRUE(out.len < sizeof r->out);
    if (out.len > 0)
        memcpy(r->out, out.base, out.len);
    r->out_len = out.len;
    pc_buf_free(&out);
    eng_stop_free(m);
}

/* Reference: the first end position at which any stop occurs; among stops ending there the
 * longest, then the lowest index. */
static void run_reference(const pc_slice_t *stops, uint32_t n_stops, const char *text, size_t len,
                          run_t *r)
{
    memset(r, 0, sizeof *r);
    for (size_t end = 1; end <= len; end++) {
        int best = -1;
        for (uint32_t k = 0; k < n_stops; k++) {
            size_t sl = stops[k].len;
            if (sl <= end && memcmp(text + end - sl, stops[k].base, sl) == 0 &&
                (best < 0 || sl > stops[best].len))
                best = (int)k;
        }
        if (best >= 0) {
            r->stopped = 1;
            r->which = (uint32_t)best;
            r->out_len = end - stops[best].len;
            memcpy(r->out, text, r->out_len);
            return;
        }
    }
    r->out_len = len;
    memcpy(r->out, text, len);
}

static void expect(const pc_slice_t *stops, uint32_t n_stops, const char *const *pieces,
                   size_t n_pieces, const char *want, int want_stop, uint32_t want_which)
{
    char text[1024];
    size_t cuts[32], len = 0;
    for (size_t i = 0; i < n_pieces; i++) {
        size_t n = strlen(pieces[i]);
        memcpy(text + len, pieces[i], n);
        len += n;
        cuts[i] = len;
    }
    run_t r;
    PC_TEST_CALL(run_pieces(stops, n_stops, text, len, cuts, n_pieces - 1, &r));
    ASSERT_EQ(r.stopped, want_stop);
    if (want_stop)
        ASSERT_EQ(r.which, want_which);
    ASSERT_EQ(r.out_len, strlen(want));
    ASSERT_MEM_EQ(r.out, want, r.out_len);
}

#define S(x) PC_SLICE_LIT(x)

PC_TEST(header_example)
{
    pc_slice_t stops[] = {S("</a>"), S("STOP")};
    eng_stop_t *m;
    ASSERT_EQ(eng_stop_init(stops, 2, &m, NULL, 0), 0);
    pc_buf_t out = PC_BUF_INIT;
    uint32_t which = 99;
    ASSERT_EQ(eng_stop_feed(m, "x</", 3, &out, &which), 0);
    ASSERT_EQ(out.len, 1);
    ASSERT_EQ(eng_stop_held(m), 2);
    ASSERT_EQ(eng_stop_feed(m, "b", 1, &out, &which), 0);
    ASSERT_EQ(out.len, 4);
    ASSERT_MEM_EQ(out.base, "x</b", 4);
    ASSERT_EQ(eng_stop_held(m), 0);
    ASSERT_EQ(eng_stop_feed(m, "ST", 2, &out, &which), 0);
    ASSERT_EQ(eng_stop_held(m), 2);
    ASSERT_EQ(eng_stop_feed(m, "OPy", 3, &out, &which), 1);
    ASSERT_EQ(which, 1);
    ASSERT_EQ(out.len, 4);
    /* Reset starts over with the same stops. */
    eng_stop_reset(m);
    out.len = 0;
    ASSERT_EQ(eng_stop_feed(m, "a</a>", 5, &out, &which), 1);
    ASSERT_EQ(which, 0);
    ASSERT_EQ(out.len, 1);
    pc_buf_free(&out);
    eng_stop_free(m);
}

PC_TEST(split_across_pieces)
{
    pc_slice_t stops[] = {S("<|end|>")};
    const char *two[] = {"hello <|en", "d|> tail"};
    PC_TEST_CALL(expect(stops, 1, two, 2, "hello ", 1, 0));
    const char *five[] = {"ok <", "|", "en", "d|", ">"};
    PC_TEST_CALL(expect(stops, 1, five, 5, "ok ", 1, 0));
    /* A false start that must be released once it fails. */
    const char *fake[] = {"a <|e", "nx|> <|end", "|>"};
    PC_TEST_CALL(expect(stops, 1, fake, 3, "a <|enx|> ", 1, 0));
    const char *none[] = {"<|en", "d|"};
    PC_TEST_CALL(expect(stops, 1, none, 2, "<|end|", 0, 0));
}

PC_TEST(overlapping_candidates)
{
    pc_slice_t ab_abc[] = {S("ab"), S("abc")};
    const char *abd[] = {"a", "bd"};
    /* "ab" completes on the 'b', before "abc" could. */
    PC_TEST_CALL(expect(ab_abc, 2, abd, 2, "", 1, 0));
    pc_slice_t abc_abd[] = {S("abc"), S("abd")};
    const char *abe[] = {"xa", "b", "e"};
    PC_TEST_CALL(expect(abc_abd, 2, abe, 3, "xabe", 0, 0));
    const char *xabd[] = {"xa", "bd"};
    PC_TEST_CALL(expect(abc_abd, 2, xabd, 2, "x", 1, 1));
    /* Two stops completing on the same byte: the longer one (it started first). */
    pc_slice_t bc_abc[] = {S("bc"), S("abc")};
    const char *abc[] = {"zab", "c"};
    PC_TEST_CALL(expect(bc_abc, 2, abc, 2, "z", 1, 1));
    /* Self-overlapping stop: "aab" inside "aaab". */
    pc_slice_t aab[] = {S("aab")};
    const char *aaab[] = {"a", "a", "a", "b"};
    PC_TEST_CALL(expect(aab, 1, aaab, 4, "a", 1, 0));
}

PC_TEST(stop_at_start)
{
    pc_slice_t stops[] = {S("STOP")};
    const char *one[] = {"STOP and more"};
    PC_TEST_CALL(expect(stops, 1, one, 1, "", 1, 0));
    const char *split[] = {"S", "TOP"};
    PC_TEST_CALL(expect(stops, 1, split, 2, "", 1, 0));
}

PC_TEST(multibyte_utf8)
{
    pc_slice_t stops[] = {S("日本"), S("🛑")};
    const char *p1[] = {"今日", "本は"};
    PC_TEST_CALL(expect(stops, 2, p1, 2, "今", 1, 0));
    const char *p2[] = {"déjà ", "vu 🛑 x"};
    PC_TEST_CALL(expect(stops, 2, p2, 2, "déjà vu ", 1, 1));
    /* "日" alone is held back, then released whole when "本" does not follow. */
    eng_stop_t *m;
    ASSERT_EQ(eng_stop_init(stops, 2, &m, NULL, 0), 0);
    pc_buf_t out = PC_BUF_INIT;
    ASSERT_EQ(eng_stop_feed(m, "a日", strlen("a日"), &out, NULL), 0);
    ASSERT_EQ(out.len, 1);
    ASSERT_EQ(eng_stop_held(m), 3);
    ASSERT_EQ(eng_stop_feed(m, "曜", strlen("曜"), &out, NULL), 0);
    ASSERT_EQ(out.len, strlen("a日曜"));
    ASSERT_MEM_EQ(out.base, "a日曜", out.len);
    pc_buf_free(&out);
    eng_stop_free(m);
}

PC_TEST(flush_releases_held)
{
    pc_slice_t stops[] = {S("</s>")};
    eng_stop_t *m;
    ASSERT_EQ(eng_stop_init(stops, 1, &m, NULL, 0), 0);
    pc_buf_t out = PC_BUF_INIT;
    ASSERT_EQ(eng_stop_feed(m, "hello </", 8, &out, NULL), 0);
    ASSERT_EQ(out.len, 6);
    ASSERT_EQ(eng_stop_held(m), 2);
    ASSERT_EQ(eng_stop_flush(m, &out), 0);
    ASSERT_EQ(out.len, 8);
    ASSERT_MEM_EQ(out.base, "hello </", 8);
    ASSERT_EQ(eng_stop_held(m), 0);
    pc_buf_free(&out);
    eng_stop_free(m);
    /* No stops: everything passes straight through, nothing is held. */
    ASSERT_EQ(eng_stop_init(NULL, 0, &m, NULL, 0), 0);
    ASSERT_EQ(eng_stop_feed(m, "abc", 3, &out, NULL), 0);
    ASSERT_EQ(out.len, 3);
    ASSERT_EQ(eng_stop_held(m), 0);
    ASSERT_EQ(eng_stop_feed(m, "", 0, &out, NULL), 0);
    pc_buf_free(&out);
    eng_stop_free(m);
}

PC_TEST(init_rejects)
{
    char err[128];
    eng_stop_t *m = (eng_stop_t *)1;
    pc_slice_t empty[] = {S("ok"), S("")};
    ASSERT_EQ(eng_stop_init(empty, 2, &m, err, sizeof err), PC_ERR_INVAL);
    ASSERT_TRUE(m == NULL);
    ASSERT_STR_EQ(err, "stop sequence 1: empty");
    pc_slice_t bad_utf8[] = {pc_slice("\xC3(", 2)};
    ASSERT_EQ(eng_stop_init(bad_utf8, 1, &m, err, sizeof err), PC_ERR_INVAL);
    ASSERT_STR_EQ(err, "stop sequence 0: not valid UTF-8");
    char big[ENG_STOP_MAX_BYTES + 1];
    memset(big, 'a', sizeof big);
    pc_slice_t too_long[] = {pc_slice(big, sizeof big)};
    ASSERT_EQ(eng_stop_init(too_long, 1, &m, err, sizeof err), PC_ERR_INVAL);
    pc_slice_t max_len[] = {pc_slice(big, ENG_STOP_MAX_BYTES)};
    ASSERT_EQ(eng_stop_init(max_len, 1, &m, err, sizeof err), 0);
    eng_stop_free(m);
    pc_slice_t many[ENG_STOP_MAX_SEQS + 1];
    for (size_t i = 0; i < PC_ARRAY_LEN(many); i++)
        many[i] = S("x");
    ASSERT_EQ(eng_stop_init(many, ENG_STOP_MAX_SEQS + 1, &m, err, sizeof err), PC_ERR_INVAL);
    ASSERT_EQ(eng_stop_init(many, ENG_STOP_MAX_SEQS, &m, err, sizeof err), 0);
    eng_stop_free(m);
    eng_stop_free(NULL);
}

/* Fails the allocation after `budget` successful ones. */
static int fail_budget;
static void *failing_malloc(size_t n)
{
    return fail_budget-- > 0 ? malloc(n) : NULL;
}
static void *failing_calloc(size_t c, size_t n)
{
    return fail_budget-- > 0 ? calloc(c, n) : NULL;
}
static void *failing_realloc(void *p, size_t n)
{
    return fail_budget-- > 0 ? realloc(p, n) : NULL;
}

PC_TEST(out_of_memory_changes_nothing)
{
    pc_slice_t stops[] = {S("<end>"), S("STOP")};
    const pc_allocator_t failing = {failing_malloc, failing_calloc, failing_realloc, free};
    /* Init under every failure point: an error and no leak (the ASan build checks). */
    for (int budget = 0; budget < 8; budget++) {
        fail_budget = budget;
        pc_allocator_t prev = pc_set_allocator(&failing);
        eng_stop_t *m = NULL;
        int rc = eng_stop_init(stops, 2, &m, NULL, 0);
        pc_set_allocator(&prev);
        ASSERT_TRUE(rc == 0 || rc == PC_ERR_NOMEM);
        ASSERT_EQ(rc == 0, m != NULL);
        eng_stop_free(m);
    }
    eng_stop_t *m;
    ASSERT_EQ(eng_stop_init(stops, 2, &m, NULL, 0), 0);
    pc_buf_t out = PC_BUF_INIT;
    ASSERT_EQ(eng_stop_feed(m, "ab<en", 5, &out, NULL), 0);
    ASSERT_EQ(eng_stop_held(m), 3);
    /* A piece larger than anything reserved so far, with no memory: nothing moves. */
    char big[300];
    memset(big, 'z', sizeof big);
    fail_budget = 0;
    pc_allocator_t prev = pc_set_allocator(&failing);
    int rc = eng_stop_feed(m, big, sizeof big, &out, NULL);
    pc_set_allocator(&prev);
    ASSERT_EQ(rc, PC_ERR_NOMEM);
    ASSERT_EQ(out.len, 2);
    ASSERT_EQ(eng_stop_held(m), 3);
    /* The state is intact: the held "<en" still completes "<end>". */
    uint32_t which = 9;
    ASSERT_EQ(eng_stop_feed(m, "d>x", 3, &out, &which), 1);
    ASSERT_EQ(which, 0);
    ASSERT_EQ(out.len, 2);
    pc_buf_free(&out);
    eng_stop_free(m);
}

PC_TEST(matches_reference_random)
{
    eng_rng_t r;
    eng_rng_seed(&r, 31337);
    int iters = (int)(4000 * pc_test_scale());
    for (int it = 0; it < iters; it++) {
        /* Small alphabets so that partial matches and overlaps are frequent. */
        static const char alpha[] = "abcab";
        int asz = 2 + (int)(eng_rng_next(&r) % 3);
        char stop_text[ENG_STOP_MAX_SEQS][8];
        pc_slice_t stops[ENG_STOP_MAX_SEQS];
        uint32_t n_stops = (uint32_t)(eng_rng_next(&r) % 5);
        for (uint32_t k = 0; k < n_stops; k++) {
            size_t sl = 1 + eng_rng_next(&r) % 6;
            for (size_t i = 0; i < sl; i++)
                stop_text[k][i] = alpha[eng_rng_next(&r) % (uint64_t)asz];
            stops[k] = pc_slice(stop_text[k], sl);
        }
        char text[200];
        size_t len = eng_rng_next(&r) % sizeof text;
        for (size_t i = 0; i < len; i++)
            text[i] = alpha[eng_rng_next(&r) % (uint64_t)asz];
        run_t want, got;
        run_reference(stops, n_stops, text, len, &want);
        size_t longest = 0;
        for (uint32_t k = 0; k < n_stops; k++)
            longest = stops[k].len > longest ? stops[k].len : longest;
        /* Several random splits into 1..6 pieces, plus one byte at a time. */
        for (int split = 0; split < 4; split++) {
            size_t cuts[200], n_cuts = 0;
            if (split == 3) {
                for (size_t i = 1; i < len; i++)
                    cuts[n_cuts++] = i;
            } else {
                size_t n = len > 0 ? eng_rng_next(&r) % 6 : 0;
                size_t at = 0;
                for (size_t i = 0; i < n && at < len; i++) {
                    at += eng_rng_next(&r) % (len - at + 1);
                    cuts[n_cuts++] = at;
                }
            }
            PC_TEST_CALL(run_pieces(stops, n_stops, text, len, cuts, n_cuts, &got));
            ASSERT_EQ(got.stopped, want.stopped);
            if (want.stopped)
                ASSERT_EQ(got.which, want.which);
            ASSERT_EQ(got.out_len, want.out_len);
            ASSERT_MEM_EQ(got.out, want.out, want.out_len);
            ASSERT_TRUE(longest == 0 ? got.max_held == 0 : got.max_held < longest);
        }
    }
}

PC_TEST_MAIN()
