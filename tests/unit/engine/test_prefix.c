/*
 * test_prefix.c — the prefix index: reuse is invisible (the logits of a prompt whose prefix
 * came from the cache equal those computed from scratch, for matches ending at a block boundary
 * and inside a block, on diverging branches), namespaces never share, and the KV accounting
 * holds after random mixes of sequences, inserts, retains, releases, expiries and evictions
 * (with every eviction reported through the callback), and the pins with their expiry equal a
 * naive model's under random retain / refresh / release / expire / pressure / evict / drop
 * sequences.
 */
#include "engine.h"
#include "engine_internal.h" /* eng_kvpool */
#include "eng_testmodel.h"
#include "pc_assert.h"
#include "pc_err.h"
#include "pc_test.h"

#define N_VOCAB 256

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static void rand_tokens(int32_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = (int32_t)rnd(N_VOCAB);
}

/* dst[0..len): base's tokens up to a random divergence point, random ones after it. */
static void branch_tokens(int32_t *dst, const int32_t *base, uint32_t len)
{
    uint32_t split = rnd(len);
    for (uint32_t j = 0; j < len; j++)
        dst[j] = j < split ? base[j] : (int32_t)rnd(N_VOCAB);
}

static void make_model(enum eng_arch arch, char *path, size_t len)
{
    eng_mkmodel_params_t p = eng_mkmodel_params_default();
    p.arch = arch;
    p.n_layer = 2;
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 128;
    p.n_ctx = 4096;
    p.rope_theta = 10000.0f;
    p.seed = 3;
    char err[256];
    if (tm_make(&p, N_VOCAB, path, len, err, sizeof err) != 0) {
        fprintf(stderr, "mkmodel: %s\n", err);
        abort();
    }
}

static eng_t *open_engine(const char *path, uint64_t kv_tokens)
{
    eng_params_t p = eng_params_default();
    p.model_path = path;
    p.kv_dtype = ENG_KV_F32;
    p.kv_max_tokens = kv_tokens;
    p.kv_poison = true;
    eng_t *e = NULL;
    char err[256];
    if (eng_init(&p, &e, err, sizeof err) != 0)
        fprintf(stderr, "eng_init: %s\n", err);
    return e;
}

/* Runs tokens[0..n) through the cache path in ns: start from the longest cached prefix, compute
 * the rest with every position's logits into lg[n][V] (rows before the reused count untouched),
 * then cache the whole sequence. Returns the reused count through *reused. */
static void run_cached(eng_t *e, uint64_t ns, const int32_t *tokens, uint32_t n, float *lg,
                       uint32_t *reused, bool insert)
{
    eng_seq_t *s;
    ASSERT_EQ(eng_seq_create(e, &s), 0);
    ASSERT_EQ(eng_seq_start_cached(e, s, ns, tokens, n, reused), 0);
    ASSERT_TRUE(*reused < n);
    ASSERT_EQ(eng_seq_n_tokens(s), *reused);
    eng_batch_item_t it = {
        .seq = s, .tokens = tokens + *reused, .n_tokens = n - *reused, .logits = ENG_LOGITS_ALL};
    ASSERT_EQ(eng_forward(e, &it, 1, lg + (size_t)*reused * N_VOCAB), 0);
    if (insert)
        ASSERT_EQ(eng_prefix_insert(e, s, ns, n), 0);
    eng_seq_free(e, s);
    char err[256];
    int rc = eng_check(e, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  %s\n", err);
    ASSERT_EQ(rc, 0);
}

static void check_rows(const float *lg, const float *ref, uint32_t from, uint32_t to)
{
    for (uint32_t i = from; i < to; i++) {
        double err = tm_rel_err(lg + (size_t)i * N_VOCAB, ref + (size_t)i * N_VOCAB, 1, N_VOCAB);
        if (!(err <= 1e-4))
            fprintf(stderr, "  position %u: rel err %g\n", i, err);
        ASSERT_LE(err, 1e-4);
    }
}

PC_TEST(reuse_is_invisible)
{
    static const enum eng_arch archs[] = {ENG_ARCH_LLAMA, ENG_ARCH_QWEN2, ENG_ARCH_QWEN3};
    for (size_t a = 0; a < PC_ARRAY_LEN(archs); a++) {
        char path[256];
        make_model(archs[a], path, sizeof path);
        eng_t *e = open_engine(path, 2048);
        ASSERT_TRUE(e != NULL);
        enum { N = 70 };
        int32_t base[N];
        for (int i = 0; i < N; i++)
            base[i] = (int32_t)rnd(N_VOCAB);
        float *ref = malloc((size_t)N * N_VOCAB * sizeof *ref);
        float *lg = malloc((size_t)N * N_VOCAB * sizeof *lg);
        uint32_t reused;
        /* Cache the first 32 tokens (a block boundary) of base. */
        eng_seq_t *s;
        ASSERT_EQ(eng_seq_create(e, &s), 0);
        eng_batch_item_t it = {.seq = s, .tokens = base, .n_tokens = 32};
        ASSERT_EQ(eng_forward(e, &it, 1, NULL), 0);
        ASSERT_EQ(eng_prefix_insert(e, s, 1, 32), 0);
        eng_seq_free(e, s);

        /* Variants of base that diverge at `split` (at a boundary, inside a block, never). */
        static const uint32_t splits[] = {70, 32, 40, 45, 17, 1};
        static const uint32_t expect[] = {32, 32, 40, 45, 17, 1};
        for (size_t v = 0; v < PC_ARRAY_LEN(splits); v++) {
            int32_t tok[N];
            memcpy(tok, base, sizeof tok);
            for (uint32_t i = splits[v]; i < N; i++)
                tok[i] = (int32_t)((base[i] + 1 + v) % N_VOCAB);
            ASSERT_EQ(tm_reference(path, tok, N, ref), 0);
            PC_TEST_CALL(run_cached(e, 1, tok, N, lg, &reused, true));
            ASSERT_EQ(reused, expect[v]);
            PC_TEST_CALL(check_rows(lg, ref, reused, N));
        }
        /* Base itself again: now fully cached (all but the last token are reused), through
         * the branch point of several diverging siblings. */
        ASSERT_EQ(tm_reference(path, base, N, ref), 0);
        PC_TEST_CALL(run_cached(e, 1, base, N, lg, &reused, false));
        ASSERT_EQ(reused, N - 1);
        PC_TEST_CALL(check_rows(lg, ref, reused, N));
        /* A prefix of it, ending mid-block: token-granular reuse. */
        PC_TEST_CALL(run_cached(e, 1, base, 43, lg, &reused, false));
        ASSERT_EQ(reused, 42);
        PC_TEST_CALL(check_rows(lg, ref, reused, 43));
        /* Another namespace never sees namespace 1's cache. */
        PC_TEST_CALL(run_cached(e, 2, base, N, lg, &reused, false));
        ASSERT_EQ(reused, 0);
        PC_TEST_CALL(check_rows(lg, ref, 0, N));

        eng_prefix_stats_t st;
        eng_prefix_stats(e, &st);
        ASSERT_TRUE(st.n_tokens > 0 && st.n_hit_tokens > 0);
        ASSERT_EQ(eng_prefix_drop(e, 1, NULL, 0), 0);
        char err[256];
        ASSERT_EQ(eng_check(e, err, sizeof err), 0);
        ASSERT_EQ(eng_kvpool_n_free(eng_kvpool(e)), eng_kvpool_n_blocks(eng_kvpool(e)));
        eng_free(e);
        free(ref);
        free(lg);
        unlink(path);
    }
}

typedef struct evict_log {
    uint32_t n_lru, n_pressure, n_removed;
} evict_log_t;

static void on_evict(const eng_evict_event_t *ev, void *ud)
{
    evict_log_t *log = ud;
    log->n_lru += ev->reason == ENG_EVICT_LRU;
    log->n_pressure += ev->reason == ENG_EVICT_PRESSURE;
    log->n_removed += ev->reason == ENG_EVICT_REMOVED;
}

/* Retained prefixes survive LRU eviction; under hard pressure they go too, reported. */
PC_TEST(retain_evict_expire)
{
    char path[256];
    make_model(ENG_ARCH_LLAMA, path, sizeof path);
    eng_t *e = open_engine(path, 16 * 10); /* 10 blocks */
    ASSERT_TRUE(e != NULL);
    evict_log_t log = {0};
    eng_set_evict_callback(e, on_evict, &log);
    int32_t a[48], b[48], c[64];
    for (int i = 0; i < 48; i++) {
        a[i] = (int32_t)rnd(N_VOCAB);
        b[i] = (int32_t)rnd(N_VOCAB);
    }
    for (int i = 0; i < 64; i++)
        c[i] = (int32_t)rnd(N_VOCAB);
    eng_seq_t *s;
    char err[256];
    /* a: retained (3 blocks) until t=100; b: cached (3 blocks). */
    ASSERT_EQ(eng_seq_create(e, &s), 0);
    eng_batch_item_t it = {.seq = s, .tokens = a, .n_tokens = 48};
    ASSERT_EQ(eng_forward(e, &it, 1, NULL), 0);
    ASSERT_EQ(eng_prefix_retain(e, s, 1, 48, 100, NULL), 0);
    eng_seq_free(e, s);
    ASSERT_EQ(eng_seq_create(e, &s), 0);
    it.seq = s;
    it.tokens = b;
    ASSERT_EQ(eng_forward(e, &it, 1, NULL), 0);
    ASSERT_EQ(eng_prefix_insert(e, s, 1, 48), 0);
    eng_seq_free(e, s);
    ASSERT_EQ(eng_kvpool_n_free(eng_kvpool(e)), 4);
    /* c needs 4 blocks, then 2 more: b is evicted (LRU), a stays. */
    ASSERT_EQ(eng_seq_create(e, &s), 0);
    it = (eng_batch_item_t){.seq = s, .tokens = c, .n_tokens = 64};
    ASSERT_EQ(eng_forward(e, &it, 1, NULL), 0);
    ASSERT_EQ(log.n_lru, 0);
    eng_seq_t *s2;
    ASSERT_EQ(eng_seq_create(e, &s2), 0);
    it = (eng_batch_item_t){.seq = s2, .tokens = b, .n_tokens = 20};
    ASSERT_EQ(eng_forward(e, &it, 1, NULL), 0);
    ASSERT_TRUE(log.n_lru > 0);
    ASSERT_EQ(log.n_pressure, 0);
    ASSERT_EQ(eng_check(e, err, sizeof err), 0);
    uint32_t reused;
    eng_seq_t *s3;
    ASSERT_EQ(eng_seq_create(e, &s3), 0);
    ASSERT_EQ(eng_seq_start_cached(e, s3, 1, a, 48, &reused), 0);
    ASSERT_EQ(reused, 47); /* a survived */
    eng_seq_free(e, s3);
    /* Hard pressure: s2 grows beyond what the unpinned cache can give; a's pin goes. */
    it = (eng_batch_item_t){.seq = s2, .tokens = c, .n_tokens = 44};
    ASSERT_EQ(eng_forward(e, &it, 1, NULL), 0);
    ASSERT_TRUE(log.n_pressure > 0);
    ASSERT_EQ(eng_check(e, err, sizeof err), 0);
    /* Nothing left to evict: a step that does not fit returns 1 and changes nothing. */
    it = (eng_batch_item_t){.seq = s2, .tokens = c, .n_tokens = 64};
    ASSERT_EQ(eng_forward(e, &it, 1, NULL), 1);
    ASSERT_EQ(eng_seq_n_tokens(s2), 64);
    ASSERT_EQ(eng_check(e, err, sizeof err), 0);
    eng_seq_free(e, s);
    eng_seq_free(e, s2);

    /* Expiry: a pin past its expiry is released and the prefix becomes plain cache. */
    ASSERT_EQ(eng_seq_create(e, &s), 0);
    it = (eng_batch_item_t){.seq = s, .tokens = a, .n_tokens = 48};
    ASSERT_EQ(eng_forward(e, &it, 1, NULL), 0);
    ASSERT_EQ(eng_prefix_retain(e, s, 1, 48, 200, NULL), 0);
    ASSERT_EQ(eng_prefix_retain(e, s, 1, 30, 300, NULL), 0);
    eng_seq_free(e, s);
    eng_prefix_stats_t st;
    eng_prefix_stats(e, &st);
    ASSERT_EQ(st.n_retained, 2);
    ASSERT_EQ(eng_prefix_expire(e, 199, NULL, NULL), 0);
    ASSERT_EQ(eng_prefix_expire(e, 200, NULL, NULL), 1);
    ASSERT_EQ(eng_prefix_drop(e, 1, a, 10), PC_ERR_BUSY); /* the 30-token pin holds */
    ASSERT_EQ(eng_prefix_release(e, 1, a, 29), PC_ERR_NOTFOUND);
    ASSERT_EQ(eng_prefix_release(e, 1, a, 30), 0);
    ASSERT_EQ(eng_prefix_release(e, 1, a, 30), PC_ERR_NOTFOUND);
    uint32_t before = log.n_removed;
    ASSERT_EQ(eng_prefix_drop(e, 1, a, 10), 0);
    ASSERT_TRUE(log.n_removed > before);
    ASSERT_EQ(eng_check(e, err, sizeof err), 0);
    ASSERT_EQ(eng_kvpool_n_free(eng_kvpool(e)), 10);
    eng_free(e);
    unlink(path);
}

/* Random mixes: accounting holds after every operation. */
PC_TEST(random_mix_accounting)
{
    char path[256];
    make_model(ENG_ARCH_QWEN2, path, sizeof path);
    eng_t *e = open_engine(path, 16 * 14);
    ASSERT_TRUE(e != NULL);
    evict_log_t log = {0};
    eng_set_evict_callback(e, on_evict, &log);
    enum { NSEQ = 6, NBASE = 4, LEN = 90 };
    int32_t bases[NBASE][LEN];
    for (int b = 0; b < NBASE; b++)
        for (int i = 0; i < LEN; i++)
            bases[b][i] = (int32_t)rnd(N_VOCAB);
    eng_seq_t *seq[NSEQ] = {0};
    int32_t toks[NSEQ][LEN];
    float *ref[NSEQ];
    for (int i = 0; i < NSEQ; i++)
        ref[i] = malloc((size_t)LEN * N_VOCAB * sizeof(float));
    float *lg = malloc(N_VOCAB * sizeof *lg);
    uint64_t now = 0;
    int n_ops = (int)(600 * pc_test_scale());
    uint32_t n_full = 0;
    for (int op = 0; op < n_ops; op++) {
        now++;
        int i = (int)rnd(NSEQ);
        uint64_t ns = 1 + rnd(2);
        switch (rnd(7)) {
        case 0: { /* a new sequence from a base with a random divergence point */
            if (seq[i] != NULL)
                break;
            branch_tokens(toks[i], bases[rnd(NBASE)], LEN);
            ASSERT_EQ(tm_reference(path, toks[i], LEN, ref[i]), 0);
            ASSERT_EQ(eng_seq_create(e, &seq[i]), 0);
            uint32_t reused;
            ASSERT_EQ(eng_seq_start_cached(e, seq[i], ns, toks[i], 1 + rnd(LEN), &reused), 0);
            break;
        }
        case 1:
        case 2: { /* extend */
            if (seq[i] == NULL)
                break;
            uint32_t have = eng_seq_n_tokens(seq[i]);
            if (have >= LEN)
                break;
            uint32_t n = 1 + rnd(PC_MIN(30, LEN - have));
            eng_batch_item_t it = {
                .seq = seq[i], .tokens = toks[i] + have, .n_tokens = n, .logits = ENG_LOGITS_LAST};
            int rc = eng_forward(e, &it, 1, lg);
            ASSERT_TRUE(rc == 0 || rc == 1);
            n_full += rc == 1;
            ASSERT_EQ(eng_seq_n_tokens(seq[i]), rc == 0 ? have + n : have);
            /* Whatever was reused or evicted, the logits are the reference's. */
            if (rc == 0)
                ASSERT_LE(tm_rel_err(lg, ref[i] + (size_t)(have + n - 1) * N_VOCAB, 1, N_VOCAB),
                          1e-4);
            break;
        }
        case 3: /* cache or retain a prefix */
            if (seq[i] != NULL && eng_seq_n_tokens(seq[i]) > 0) {
                uint32_t n = 1 + rnd(eng_seq_n_tokens(seq[i]));
                if (rnd(3) == 0)
                    ASSERT_EQ(eng_prefix_retain(e, seq[i], ns, n, now + rnd(50), NULL), 0);
                else
                    ASSERT_EQ(eng_prefix_insert(e, seq[i], ns, n), 0);
            }
            break;
        case 4:
            eng_seq_free(e, seq[i]);
            seq[i] = NULL;
            break;
        case 5:
            eng_prefix_expire(e, now, NULL, NULL);
            break;
        case 6:
            if (rnd(10) == 0) {
                int rc = eng_prefix_drop(e, ns, bases[rnd(NBASE)], 1 + rnd(20));
                ASSERT_TRUE(rc == 0 || rc == PC_ERR_NOTFOUND || rc == PC_ERR_BUSY);
            }
            break;
        }
        char err[256];
        int rc = eng_check(e, err, sizeof err);
        if (rc != 0)
            fprintf(stderr, "  op %d: %s\n", op, err);
        ASSERT_EQ(rc, 0);
    }
    fprintf(stderr, "  evictions: %u lru, %u pressure, %u removed; %u refusals\n", log.n_lru,
            log.n_pressure, log.n_removed, n_full);
    ASSERT_TRUE(log.n_lru > 0);
    for (int i = 0; i < NSEQ; i++) {
        eng_seq_free(e, seq[i]);
        free(ref[i]);
    }
    free(lg);
    eng_free(e);
    unlink(path);
}

/* ---- pins against a naive model ---------------------------------------------------------
 * The model is a flat list of pins (ns, tokens, expiry, held) searched linearly. Hard pressure
 * is seen through the count of held pins: when eng_forward lowered it by k, the k held pins
 * expiring first lapsed (the index gives them up in expiry order); an eviction event ends the
 * pin of exactly the removed path, which must be a lapsed one. After every operation the
 * index's pins (eng_prefix_pin_at), its next expiry and its reports must equal the model's. */

enum { MP_CAP = 512, MP_LEN = 90, MP_EV_CAP = 1024 };

typedef struct mpin {
    uint64_t ns, expiry;
    uint32_t n;
    bool held;
    int32_t tokens[MP_LEN];
} mpin_t;

typedef struct pin_model {
    mpin_t v[MP_CAP];
    uint32_t n;
    mpin_t ev[MP_EV_CAP]; /* paths removed since the last sync (held unused) */
    uint32_t n_ev;
    mpin_t rep[MP_CAP]; /* pins reported by the last expire / release_ns */
    uint32_t n_rep;
    uint32_t n_lapsed, n_lapsed_evicted, n_lapsed_ended, n_lapsed_rehold;
} pin_model_t;

static bool mpin_is(const mpin_t *p, uint64_t ns, const int32_t *tokens, uint32_t n)
{
    return p->ns == ns && p->n == n && memcmp(p->tokens, tokens, n * sizeof *tokens) == 0;
}

static mpin_t *model_find(pin_model_t *m, uint64_t ns, const int32_t *tokens, uint32_t n)
{
    for (uint32_t i = 0; i < m->n; i++)
        if (mpin_is(&m->v[i], ns, tokens, n))
            return &m->v[i];
    return NULL;
}

static void model_del(pin_model_t *m, mpin_t *p)
{
    *p = m->v[--m->n];
}

static void model_on_evict(const eng_evict_event_t *ev, void *ud)
{
    pin_model_t *m = ud;
    uint32_t n = ev->n_tokens + ev->n_dropped;
    ASSERT_TRUE(ev->tokens != NULL);
    ASSERT_TRUE(m->n_ev < MP_EV_CAP);
    if (n > MP_LEN)
        return; /* longer than any pin */
    mpin_t *e = &m->ev[m->n_ev++];
    e->ns = ev->ns;
    e->n = n;
    memcpy(e->tokens, ev->tokens, n * sizeof *ev->tokens);
}

static void model_on_pin_end(const eng_prefix_pin_t *pin, void *ud)
{
    pin_model_t *m = ud;
    ASSERT_TRUE(m->n_rep < MP_CAP && pin->n_tokens <= MP_LEN);
    mpin_t *r = &m->rep[m->n_rep++];
    *r = (mpin_t){.ns = pin->ns, .expiry = pin->expiry, .n = pin->n_tokens, .held = pin->held};
    memcpy(r->tokens, pin->tokens, pin->n_tokens * sizeof *pin->tokens);
}

/* Applies what eng_forward (or a drop) did: lapses, then removals; then compares everything. */
static void model_sync(pin_model_t *m, eng_t *e)
{
    eng_prefix_stats_t st;
    eng_prefix_stats(e, &st);
    uint32_t held = 0;
    for (uint32_t i = 0; i < m->n; i++)
        held += m->v[i].held;
    ASSERT_LE(st.n_retained, held);
    for (uint32_t k = held - (uint32_t)st.n_retained; k > 0; k--) {
        mpin_t *first = NULL;
        for (uint32_t i = 0; i < m->n; i++)
            if (m->v[i].held && (first == NULL || m->v[i].expiry < first->expiry))
                first = &m->v[i];
        first->held = false;
        m->n_lapsed++;
    }
    for (uint32_t j = 0; j < m->n_ev; j++) {
        mpin_t *p = model_find(m, m->ev[j].ns, m->ev[j].tokens, m->ev[j].n);
        if (p == NULL)
            continue;
        ASSERT_TRUE(!p->held); /* a held pin keeps its node */
        model_del(m, p);
        m->n_lapsed_evicted++;
    }
    m->n_ev = 0;
    ASSERT_EQ(eng_prefix_n_pins(e), m->n);
    uint64_t next = UINT64_MAX;
    int32_t toks[MP_LEN];
    for (uint32_t i = 0; i < m->n; i++) {
        next = PC_MIN(next, m->v[i].expiry);
        eng_prefix_pin_t pin;
        eng_prefix_pin_at(e, i, &pin, toks);
        ASSERT_TRUE(pin.tokens == toks && pin.n_tokens <= MP_LEN);
        mpin_t *p = model_find(m, pin.ns, toks, pin.n_tokens);
        ASSERT_TRUE(p != NULL);
        ASSERT_EQ(pin.expiry, p->expiry);
        ASSERT_EQ(pin.held, p->held);
    }
    ASSERT_EQ(eng_prefix_next_expiry(e), next);
    char err[256];
    int rc = eng_check(e, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  %s\n", err);
    ASSERT_EQ(rc, 0);
}

/* The pins a call reported (m->rep) are exactly the model pins that match: each once, with its
 * expiry and hold, and (expire) earliest first. */
static void model_take_reported(pin_model_t *m, bool (*match)(const mpin_t *, uint64_t),
                                uint64_t arg, bool ordered)
{
    uint32_t want = 0;
    for (uint32_t i = 0; i < m->n; i++)
        want += match(&m->v[i], arg);
    ASSERT_EQ(m->n_rep, want);
    for (uint32_t j = 0; j < m->n_rep; j++) {
        const mpin_t *r = &m->rep[j];
        if (ordered && j > 0)
            ASSERT_LE(m->rep[j - 1].expiry, r->expiry);
        mpin_t *p = model_find(m, r->ns, r->tokens, r->n);
        ASSERT_TRUE(p != NULL && match(p, arg));
        ASSERT_EQ(r->expiry, p->expiry);
        ASSERT_EQ(r->held, p->held);
        m->n_lapsed_ended += !p->held;
        model_del(m, p);
    }
    m->n_rep = 0;
}

static bool due(const mpin_t *p, uint64_t now)
{
    return p->expiry <= now;
}

static bool in_ns(const mpin_t *p, uint64_t ns)
{
    return p->ns == ns;
}

/* Retains tokens[0..n) of s in ns until expiry, in the index and the model; counts a refresh
 * of a pin the model had in *n_refresh. */
static void model_retain(pin_model_t *m, eng_t *e, eng_seq_t *s, uint64_t ns, const int32_t *tokens,
                         uint32_t n, uint64_t expiry, uint32_t *n_refresh)
{
    uint64_t until = 0;
    ASSERT_EQ(eng_prefix_retain(e, s, ns, n, expiry, &until), 0);
    mpin_t *p = model_find(m, ns, tokens, n);
    *n_refresh += p != NULL;
    if (p != NULL) {
        p->expiry = PC_MAX(p->expiry, expiry);
        m->n_lapsed_rehold += !p->held;
        p->held = true;
    } else {
        ASSERT_TRUE(m->n < MP_CAP);
        p = &m->v[m->n++];
        *p = (mpin_t){.ns = ns, .expiry = expiry, .n = n, .held = true};
        memcpy(p->tokens, tokens, n * sizeof *p->tokens);
    }
    ASSERT_EQ(until, p->expiry);
}

PC_TEST(pins_match_naive_model)
{
    char path[256];
    make_model(ENG_ARCH_LLAMA, path, sizeof path);
    eng_t *e = open_engine(path, 16 * 12);
    ASSERT_TRUE(e != NULL);
    static pin_model_t m;
    memset(&m, 0, sizeof m);
    eng_set_evict_callback(e, model_on_evict, &m);
    enum { NSEQ = 5, NBASE = 3, TICK = 1000000 };
    int32_t bases[NBASE][MP_LEN];
    rand_tokens(&bases[0][0], sizeof bases / sizeof bases[0][0]);
    eng_seq_t *seq[NSEQ] = {0};
    int32_t toks[NSEQ][MP_LEN];
    uint64_t seq_ns[NSEQ] = {0};
    int n_ops = (int)(1500 * pc_test_scale());
    uint32_t n_refresh = 0, n_expired = 0, n_released = 0;
    for (int op = 0; op < n_ops; op++) {
        uint64_t now = (uint64_t)op * TICK;
        int i = (int)rnd(NSEQ);
        switch (rnd(9)) {
        case 0: { /* a new sequence from a base with a random divergence point */
            if (seq[i] != NULL)
                break;
            branch_tokens(toks[i], bases[rnd(NBASE)], MP_LEN);
            seq_ns[i] = 1 + rnd(2);
            ASSERT_EQ(eng_seq_create(e, &seq[i]), 0);
            uint32_t reused;
            ASSERT_EQ(eng_seq_start_cached(e, seq[i], seq_ns[i], toks[i], 1 + rnd(MP_LEN), &reused),
                      0);
            break;
        }
        case 1:
        case 2: { /* extend: may evict, and lapse pins under hard pressure */
            if (seq[i] == NULL)
                break;
            uint32_t have = eng_seq_n_tokens(seq[i]);
            if (have >= MP_LEN)
                break;
            eng_batch_item_t it = {.seq = seq[i],
                                   .tokens = toks[i] + have,
                                   .n_tokens = 1 + rnd(PC_MIN(40, MP_LEN - have))};
            int rc = eng_forward(e, &it, 1, NULL);
            ASSERT_TRUE(rc == 0 || rc == 1);
            break;
        }
        case 3:
        case 4: { /* retain (or refresh) a prefix, and maybe a shorter one expiring earlier (a
                   * lapse of that one leaves a pinned node below it); expiries are distinct */
            if (seq[i] == NULL || eng_seq_n_tokens(seq[i]) == 0)
                break;
            uint32_t n = 1 + rnd(eng_seq_n_tokens(seq[i]));
            uint64_t expiry = now + (2 + rnd(60)) * (uint64_t)TICK + (uint64_t)op;
            for (uint32_t j = 0; j < m.n; j++) /* prefer a lapsed pin the sequence holds */
                if (!m.v[j].held && m.v[j].ns == seq_ns[i] &&
                    m.v[j].n <= eng_seq_n_tokens(seq[i]) &&
                    memcmp(m.v[j].tokens, toks[i], m.v[j].n * sizeof *toks[i]) == 0) {
                    n = m.v[j].n;
                    break;
                }
            model_retain(&m, e, seq[i], seq_ns[i], toks[i], n, expiry, &n_refresh);
            if (n > 1 && rnd(2) == 0)
                model_retain(&m, e, seq[i], seq_ns[i], toks[i], 1 + rnd(n - 1),
                             expiry - TICK - rnd(TICK / 2), &n_refresh);
            break;
        }
        case 5:
            eng_seq_free(e, seq[i]);
            seq[i] = NULL;
            break;
        case 6:
            m.n_rep = 0;
            eng_prefix_expire(e, now, model_on_pin_end, &m);
            n_expired += m.n_rep;
            model_take_reported(&m, due, now, true);
            break;
        case 7: { /* release a pin, or a prefix that may have none */
            if (rnd(3) != 0)
                break;
            if (m.n > 0 && rnd(2) != 0) {
                mpin_t *p = &m.v[rnd(m.n)];
                ASSERT_EQ(eng_prefix_release(e, p->ns, p->tokens, p->n), 0);
                m.n_lapsed_ended += !p->held;
                model_del(&m, p);
                n_released++;
            } else {
                const int32_t *b = bases[rnd(NBASE)];
                uint64_t ns = 1 + rnd(2);
                uint32_t n = 1 + rnd(MP_LEN);
                mpin_t *p = model_find(&m, ns, b, n);
                ASSERT_EQ(eng_prefix_release(e, ns, b, n), p != NULL ? 0 : PC_ERR_NOTFOUND);
                if (p != NULL)
                    model_del(&m, p);
            }
            break;
        }
        case 8: {
            uint64_t ns = 1 + rnd(2);
            if (rnd(8) == 0) { /* all pins of a namespace */
                m.n_rep = 0;
                ASSERT_EQ(eng_prefix_release_ns(e, ns, model_on_pin_end, &m), m.n_rep);
                model_take_reported(&m, in_ns, ns, false);
            } else if (rnd(4) == 0) { /* a subtree: refused while a held pin is in it */
                const int32_t *b = bases[rnd(NBASE)];
                uint32_t n = 1 + rnd(20);
                bool busy = false;
                for (uint32_t j = 0; j < m.n; j++)
                    busy |= m.v[j].held && m.v[j].ns == ns && m.v[j].n >= n &&
                            memcmp(m.v[j].tokens, b, n * sizeof *b) == 0;
                int rc = eng_prefix_drop(e, ns, b, n);
                if (busy)
                    ASSERT_EQ(rc, PC_ERR_BUSY);
                else
                    ASSERT_TRUE(rc == 0 || rc == PC_ERR_NOTFOUND);
            }
            break;
        }
        }
        model_sync(&m, e);
        if (pc_test__state != 0)
            break; /* a helper failed: stop at the first difference */
    }
    fprintf(stderr,
            "  pins: %u left, %u refreshed, %u expired, %u released; %u lapsed: %u evicted, %u "
            "released or expired, %u held again\n",
            m.n, n_refresh, n_expired, n_released, m.n_lapsed, m.n_lapsed_evicted, m.n_lapsed_ended,
            m.n_lapsed_rehold);
    /* The sequence is fixed (seeded): these show every transition was exercised. */
    ASSERT_TRUE(n_refresh > 0 && n_expired > 0 && n_released > 0);
    ASSERT_TRUE(m.n_lapsed > 0 && m.n_lapsed_evicted > 0 && m.n_lapsed_ended > 0);
    ASSERT_TRUE(m.n_lapsed_rehold > 0);
    for (int i = 0; i < NSEQ; i++)
        eng_seq_free(e, seq[i]);
    eng_free(e);
    unlink(path);
}

PC_TEST_MAIN()
