/*
 * test_worker_index.c — the worker's cache events are enough for a gateway to keep an exact
 * index of what the worker holds (engine/worker.h, engine/wire.h: KV_EVENT, SNAPSHOT).
 *
 * The test keeps a gateway-side model built only from the worker's events, the way the
 * gateway's index does: the prompts it routed (cached once their first token or DONE came),
 * RETAINED prefixes, and EVICTED paths (every known prefix through the dropped part is cut to
 * n_kept). Through random sequences of submits with retains, TTL refreshes, early releases,
 * namespace drops and evictions under a small KV pool, every request's physical hit
 * (DONE.usage.tokens_reused, the worker's real cache) must equal the model's longest match,
 * and the worker's snapshot of its pins must equal the model's pinned set. Requests run one at
 * a time so that the model's state at each submit is exactly the worker's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "pc_test.h"
#include "pc_time.h"
#include "test_bytemodel.h"
#include "wire.h"
#include "worker.h"

#define EOT_ID 256
#define MAX_ENTRIES 4096
#define MAX_LEN 256

static char g_model[256];

static const char *model_path(void)
{
    if (g_model[0] != '\0')
        return g_model;
    char err[256];
    snprintf(g_model, sizeof g_model, "/tmp/kvgw-worker-index-%d.gguf", (int)getpid());
    if (test_bytemodel_write(g_model, "kvgw-index-test", 4096, 3, EOT_ID, err, sizeof err) != 0) {
        fprintf(stderr, "mkmodel: %s\n", err);
        abort();
    }
    return g_model;
}

__attribute__((destructor)) static void remove_model(void)
{
    if (g_model[0] != '\0')
        unlink(g_model);
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

/* ---- the gateway-side model ---------------------------------------------------------------- */

typedef struct entry {
    uint64_t ns;
    uint32_t n;
    bool pinned;
    uint32_t tokens[MAX_LEN];
} entry_t;

typedef struct model {
    entry_t *e; /* [MAX_ENTRIES] */
    uint32_t n;
    uint64_t n_evicted, n_pressure, n_removed, n_retained, n_released, n_refreshed;
} model_t;

static uint32_t common(const uint32_t *a, uint32_t na, const uint32_t *b, uint32_t nb)
{
    uint32_t i = 0;
    while (i < na && i < nb && a[i] == b[i])
        i++;
    return i;
}

static entry_t *find(model_t *m, uint64_t ns, const uint32_t *t, uint32_t n)
{
    for (uint32_t i = 0; i < m->n; i++)
        if (m->e[i].ns == ns && m->e[i].n == n && common(m->e[i].tokens, n, t, n) == n)
            return &m->e[i];
    return NULL;
}

/* Knows tokens[0..n) as cached (pinned: retained as well). */
static void learn(model_t *m, uint64_t ns, const uint32_t *t, uint32_t n, bool pinned)
{
    if (n == 0)
        return;
    entry_t *e = find(m, ns, t, n);
    if (e == NULL) {
        PC_ASSERT(m->n < MAX_ENTRIES);
        e = &m->e[m->n++];
        e->ns = ns;
        e->n = n;
        e->pinned = false;
        memcpy(e->tokens, t, n * sizeof *t);
    }
    e->pinned |= pinned;
}

/* The worker's physical hit for a prompt: the longest known prefix, at most n - 1 tokens. */
static uint32_t longest(const model_t *m, uint64_t ns, const uint32_t *p, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 0; i < m->n; i++)
        if (m->e[i].ns == ns) {
            uint32_t c = common(m->e[i].tokens, m->e[i].n, p, n - 1);
            best = c > best ? c : best;
        }
    return best;
}

/* EVICTED: every known prefix of ns longer than n_kept that goes through the dropped part of
 * the path is cut to n_kept (its first n_kept tokens stay cached, unpinned). */
static void evicted(model_t *m, const eng_wire_kv_event_t *k)
{
    ASSERT_EQ(k->n_path, k->n_tokens); /* the worker always names the path here */
    for (uint32_t i = 0; i < m->n;) {
        entry_t *e = &m->e[i];
        uint32_t upto = e->n < k->n_path ? e->n : k->n_path;
        if (e->ns != k->ns || e->n <= k->n_kept ||
            common(e->tokens, upto, k->tokens, upto) < upto) {
            i++;
            continue;
        }
        e->n = k->n_kept;
        e->pinned = false;
        entry_t cut = *e;
        m->e[i] = m->e[--m->n];
        if (cut.n > 0)
            learn(m, cut.ns, cut.tokens, cut.n, false);
    }
}

static void kv_event(model_t *m, const eng_wire_kv_event_t *k)
{
    switch (k->kind) {
    case ENG_WIRE_KV_EVICTED:
        m->n_evicted++;
        m->n_pressure += k->reason == ENG_EVICT_PRESSURE;
        m->n_removed += k->reason == ENG_EVICT_REMOVED;
        PC_TEST_CALL(evicted(m, k));
        break;
    case ENG_WIRE_KV_RELEASED: {
        /* The gateway finds the prefix by (ns, n_tokens, fp). */
        entry_t *hit = NULL;
        for (uint32_t i = 0; i < m->n; i++)
            if (m->e[i].ns == k->ns && m->e[i].n == k->n_tokens && m->e[i].pinned &&
                eng_wire_prefix_fp(m->e[i].tokens, m->e[i].n) == k->prefix_fp)
                hit = &m->e[i];
        ASSERT_TRUE(hit != NULL); /* a release of something the gateway knew as pinned */
        hit->pinned = false;
        m->n_released++;
        break;
    }
    default:
        ASSERT_TRUE(false); /* RETAINED and RETAIN_FAILED are handled with their request */
    }
}

/* ---- driving the worker -------------------------------------------------------------------- */

typedef struct run {
    eng_worker_t *w;
    model_t m;
    eng_worker_event_t ev[64];
} run_t;

/* Polls events until pred says stop; every event goes through the model first. */
typedef struct want {
    uint64_t id;            /* the request being run (0: none) */
    const uint32_t *prompt; /* its prompt */
    uint32_t n_prompt;
    uint64_t ns;
    bool seen_first; /* its first TOKEN (or DONE) came: the prompt is cached */
    bool done;
    eng_wire_done_t fin;
    uint32_t n_retained;
    uint64_t snap_id; /* a snapshot being collected (0: none) */
    bool snap_done;
    entry_t *snap; /* [MAX_ENTRIES] */
    uint32_t n_snap;
} want_t;

static void pump(run_t *r, want_t *wt)
{
    uint64_t deadline = pc_time_mono_ms() + 60000;
    while (!(wt->id == 0 || wt->done) || !(wt->snap_id == 0 || wt->snap_done)) {
        ASSERT_TRUE(pc_time_mono_ms() < deadline);
        size_t k = eng_worker_poll_wait(r->w, r->ev, 64, 100);
        for (size_t i = 0; i < k; i++) {
            const eng_worker_event_t *e = &r->ev[i];
            switch (e->type) {
            case ENG_WIRE_TOKEN:
                ASSERT_EQ_U64(e->u.token.request_id, wt->id);
                if (!wt->seen_first)
                    learn(&r->m, wt->ns, wt->prompt, wt->n_prompt, false);
                wt->seen_first = true;
                break;
            case ENG_WIRE_DONE:
                ASSERT_EQ_U64(e->u.done.request_id, wt->id);
                if (!wt->seen_first)
                    learn(&r->m, wt->ns, wt->prompt, wt->n_prompt, false);
                wt->seen_first = true;
                wt->done = true;
                wt->fin = e->u.done;
                break;
            case ENG_WIRE_ERROR:
                fprintf(stderr, "  request %llu failed: %.*s\n",
                        (unsigned long long)e->u.error.request_id, (int)e->u.error.message.len,
                        e->u.error.message.base);
                ASSERT_TRUE(false);
                break;
            case ENG_WIRE_KV_EVENT:
                if (e->u.kv.kind == ENG_WIRE_KV_RETAINED) {
                    ASSERT_EQ_U64(e->u.kv.request_id, wt->id);
                    ASSERT_TRUE(e->u.kv.n_tokens <= wt->n_prompt);
                    ASSERT_EQ_U64(e->u.kv.prefix_fp,
                                  eng_wire_prefix_fp(wt->prompt, e->u.kv.n_tokens));
                    r->m.n_refreshed += find(&r->m, wt->ns, wt->prompt, e->u.kv.n_tokens) != NULL &&
                                        find(&r->m, wt->ns, wt->prompt, e->u.kv.n_tokens)->pinned;
                    learn(&r->m, wt->ns, wt->prompt, e->u.kv.n_tokens, true);
                    r->m.n_retained++;
                    wt->n_retained++;
                } else {
                    ASSERT_TRUE(e->u.kv.kind != ENG_WIRE_KV_RETAIN_FAILED);
                    PC_TEST_CALL(kv_event(&r->m, &e->u.kv));
                }
                break;
            case ENG_WIRE_SNAPSHOT: {
                const eng_wire_snapshot_t *s = &e->u.snapshot;
                ASSERT_EQ_U64(s->snapshot_id, wt->snap_id);
                for (uint32_t j = 0; j < s->n_entries; j++) {
                    const eng_wire_snap_entry_t *x = &s->entries[j];
                    ASSERT_TRUE(x->n_tokens <= MAX_LEN);
                    ASSERT_EQ_U64(x->prefix_fp, eng_wire_prefix_fp(x->tokens, x->n_tokens));
                    entry_t *d = &wt->snap[wt->n_snap++];
                    d->ns = x->ns;
                    d->n = x->n_tokens;
                    d->pinned = true;
                    memcpy(d->tokens, x->tokens, x->n_tokens * sizeof *x->tokens);
                }
                wt->snap_done = s->last != 0;
                break;
            }
            default:
                break;
            }
        }
    }
}

/* Takes a snapshot and checks that it equals the model's pinned set. */
static void check_snapshot(run_t *r, uint64_t id, uint32_t *n_pins)
{
    static entry_t snap[MAX_ENTRIES];
    want_t wt = {.snap_id = id, .snap = snap};
    ASSERT_EQ(eng_worker_snapshot(r->w, id), 0);
    PC_TEST_CALL(pump(r, &wt));
    uint32_t n_model = 0;
    for (uint32_t i = 0; i < r->m.n; i++)
        if (r->m.e[i].pinned) {
            n_model++;
            bool in = false;
            for (uint32_t j = 0; j < wt.n_snap && !in; j++)
                in = snap[j].ns == r->m.e[i].ns && snap[j].n == r->m.e[i].n &&
                     common(snap[j].tokens, snap[j].n, r->m.e[i].tokens, r->m.e[i].n) == snap[j].n;
            if (!in)
                fprintf(stderr, "  pinned in the model, not in the snapshot: ns %llu, %u tokens\n",
                        (unsigned long long)r->m.e[i].ns, r->m.e[i].n);
            ASSERT_TRUE(in);
        }
    ASSERT_EQ(wt.n_snap, n_model);
    *n_pins = n_model;
}

/* A before_step hook: each step starts at least 1 ms after its loop admitted requests (usleep
 * sleeps at least that long), so a prefill lasts at least 1000 us on the worker's clock, and so
 * does the decode of a request with a second token (a step of its own). DONE's durations are
 * checked against these floors, which no machine's speed or load can break. */
static void step_floor(void *ud)
{
    (void)ud;
    usleep(1000);
}

static eng_worker_t *start_worker(uint64_t kv_tokens, eng_worker_wake_fn before_step)
{
    eng_worker_params_t p = eng_worker_params_default();
    p.before_step = before_step;
    p.engine.model_path = model_path();
    p.engine.kv_dtype = ENG_KV_F32;
    p.engine.kv_max_tokens = kv_tokens;
    p.engine.n_threads = 2;
    p.step_tokens = 64;
    p.load_interval_ms = 0;
    eng_worker_t *w = NULL;
    char err[256];
    if (eng_worker_init(&p, &w, err, sizeof err) != 0)
        fprintf(stderr, "eng_worker_init: %s\n", err);
    return w;
}

/* Submits one request and runs it to its end; checks the physical hit against the model. */
static void run_one(run_t *r, uint64_t id, uint64_t ns, const uint32_t *prompt, uint32_t n,
                    uint32_t max_tokens, const eng_wire_retain_t *ret, uint32_t n_ret,
                    eng_wire_done_t *fin)
{
    uint32_t expect = longest(&r->m, ns, prompt, n);
    eng_wire_submit_t q = {.request_id = id,
                           .ns = ns,
                           .max_tokens = max_tokens,
                           .flags = ENG_WIRE_SUBMIT_IGNORE_EOG,
                           .sampling = eng_sampling_params_default(),
                           .tokens = prompt,
                           .n_tokens = n,
                           .retain = ret,
                           .n_retain = n_ret};
    q.sampling.temperature = 0;
    char err[256] = "";
    int rc = eng_worker_submit(r->w, &q, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  submit: %s\n", err);
    ASSERT_EQ(rc, 0);
    want_t wt = {.id = id, .prompt = prompt, .n_prompt = n, .ns = ns};
    PC_TEST_CALL(pump(r, &wt));
    if (wt.fin.usage.tokens_reused != expect)
        fprintf(
            stderr, "  request %llu (ns %llu, %u tokens): worker reused %u, the index says %u\n",
            (unsigned long long)id, (unsigned long long)ns, n, wt.fin.usage.tokens_reused, expect);
    ASSERT_EQ(wt.fin.usage.tokens_reused, expect);
    ASSERT_EQ(wt.n_retained, n_ret);
    *fin = wt.fin;
}

PC_TEST(index_follows_the_worker_cache)
{
    run_t *r = calloc(1, sizeof *r);
    r->m.e = calloc(MAX_ENTRIES, sizeof *r->m.e);
    r->w = start_worker(512, step_floor); /* 32 blocks of 16 tokens: constant eviction */
    ASSERT_TRUE(r->w != NULL);
    /* Prompts share prefixes: a few bases, cut and extended at random. */
    uint32_t bases[4][MAX_LEN];
    for (int b = 0; b < 4; b++)
        for (int i = 0; i < MAX_LEN; i++)
            bases[b][i] = rnd(256);
    uint64_t next_id = 1;
    uint32_t n_pins = 0, max_pins = 0;
    for (int it = 0; it < 400; it++) {
        uint64_t ns = 1 + rnd(2);
        uint32_t op = rnd(20);
        if (op == 0) { /* the gateway ends a pin early */
            entry_t *pinned[MAX_ENTRIES];
            uint32_t k = 0;
            for (uint32_t i = 0; i < r->m.n; i++)
                if (r->m.e[i].pinned)
                    pinned[k++] = &r->m.e[i];
            if (k > 0) {
                entry_t *e = pinned[rnd(k)];
                ASSERT_EQ(eng_worker_release(r->w, e->ns, e->tokens, e->n), 0);
            }
            continue; /* its RELEASED comes with the next request's events */
        }
        if (op == 1 && rnd(4) == 0) { /* a tenant goes */
            ASSERT_EQ(eng_worker_drop_ns(r->w, ns), 0);
            /* The snapshot comes after the drop's events: the model has seen them all before
             * the next request is checked against it. */
            PC_TEST_CALL(check_snapshot(r, 500000 + (uint64_t)it, &n_pins));
            continue;
        }
        if (op == 2) {
            PC_TEST_CALL(check_snapshot(r, 1000 + (uint64_t)it, &n_pins));
            max_pins = n_pins > max_pins ? n_pins : max_pins;
            continue;
        }
        uint32_t prompt[MAX_LEN];
        const uint32_t *base = bases[rnd(4)];
        uint32_t keep = 1 + rnd(200), n = keep + rnd(40) + 1;
        memcpy(prompt, base, keep * sizeof *prompt);
        for (uint32_t i = keep; i < n; i++)
            prompt[i] = rnd(256);
        eng_wire_retain_t ret[2];
        uint32_t n_ret = rnd(3);
        for (uint32_t i = 0; i < n_ret; i++) {
            /* Retain at base boundaries mostly, so that the same prefixes are refreshed. */
            uint32_t at = rnd(2) ? (keep < 64 ? keep : 64) : 1 + rnd(n);
            ret[i] = (eng_wire_retain_t){at, rnd(2) ? 30 + rnd(100) : 5000 + rnd(5000)};
        }
        eng_wire_done_t fin;
        PC_TEST_CALL(
            run_one(r, next_id++, ns, prompt, n, rnd(3) ? 0 : 1 + rnd(8), ret, n_ret, &fin));
        ASSERT_LE(1000, fin.timing.prefill_us); /* step_floor's 1 ms at least */
        /* decode_us runs from the end of prefill to DONE. One output token is only the first
         * sample, taken in the prefill's step (no floor); a second token means a step of its
         * own, after step_floor's 1 ms. */
        if (fin.usage.output_tokens > 1)
            ASSERT_LE(1000, fin.timing.decode_us);
        if (rnd(8) == 0)
            usleep(20000); /* let short pins expire */
    }
    PC_TEST_CALL(check_snapshot(r, 99999, &n_pins));
    fprintf(stderr,
            "  %u known prefixes, %u pinned (at most %u); events: %llu evicted (%llu pressure, "
            "%llu removed), %llu retained (%llu refreshes), %llu released\n",
            r->m.n, n_pins, max_pins, (unsigned long long)r->m.n_evicted,
            (unsigned long long)r->m.n_pressure, (unsigned long long)r->m.n_removed,
            (unsigned long long)r->m.n_retained, (unsigned long long)r->m.n_refreshed,
            (unsigned long long)r->m.n_released);
    ASSERT_TRUE(r->m.n_evicted > 0);
    ASSERT_TRUE(r->m.n_removed > 0);
    ASSERT_TRUE(r->m.n_refreshed > 0);
    ASSERT_TRUE(r->m.n_released > 0);
    eng_wire_load_t load;
    eng_worker_load(r->w, &load);
    ASSERT_TRUE(load.prefill_tokens_per_s > 0.0f);
    ASSERT_TRUE(load.decode_ms_per_token > 0.0f);
    eng_worker_free(r->w);
    free(r->m.e);
    free(r);
}

PC_TEST(refresh_keeps_one_pin)
{
    /* The same retained prefix read again and again: one pin, whose expiry moves. */
    run_t *r = calloc(1, sizeof *r);
    r->m.e = calloc(MAX_ENTRIES, sizeof *r->m.e);
    r->w = start_worker(4096, NULL);
    ASSERT_TRUE(r->w != NULL);
    uint32_t prompt[80];
    for (int i = 0; i < 80; i++)
        prompt[i] = (uint32_t)rnd(256);
    uint64_t last_ttl = 0;
    for (int i = 0; i < 20; i++) {
        eng_wire_retain_t ret = {48, 60000 + 1000 * (uint64_t)i};
        eng_wire_submit_t q = {.request_id = 1 + (uint64_t)i,
                               .ns = 5,
                               .sampling = eng_sampling_params_default(),
                               .tokens = prompt,
                               .n_tokens = 60 + (uint32_t)i,
                               .retain = &ret,
                               .n_retain = 1};
        ASSERT_EQ(eng_worker_submit(r->w, &q, NULL, 0), 0);
        bool done = false;
        while (!done) {
            size_t k = eng_worker_poll_wait(r->w, r->ev, 64, 5000);
            ASSERT_TRUE(k > 0);
            for (size_t j = 0; j < k; j++) {
                if (r->ev[j].type == ENG_WIRE_KV_EVENT) {
                    const eng_wire_kv_event_t *kv = &r->ev[j].u.kv;
                    ASSERT_EQ(kv->kind, ENG_WIRE_KV_RETAINED);
                    ASSERT_EQ(kv->n_tokens, 48);
                    /* ms left until the moved expiry: grows with each longer TTL. */
                    ASSERT_TRUE(kv->ttl_ms + 50 >= last_ttl);
                    ASSERT_TRUE(kv->ttl_ms <= ret.ttl_ms);
                    last_ttl = kv->ttl_ms;
                }
                done |= r->ev[j].type == ENG_WIRE_DONE;
            }
        }
    }
    learn(&r->m, 5, prompt, 48, true);
    uint32_t n_pins = 0;
    PC_TEST_CALL(check_snapshot(r, 1, &n_pins));
    ASSERT_EQ(n_pins, 1);
    /* An early release ends it: RELEASED, and the snapshot is empty. */
    ASSERT_EQ(eng_worker_release(r->w, 5, prompt, 48), 0);
    ASSERT_EQ(eng_worker_release(r->w, 5, prompt, 47), 0); /* not pinned: no event */
    ASSERT_EQ(eng_worker_release(r->w, 5, prompt, 0), PC_ERR_INVAL);
    size_t k = eng_worker_poll_wait(r->w, r->ev, 64, 5000);
    ASSERT_EQ(k, 1);
    ASSERT_EQ(r->ev[0].type, ENG_WIRE_KV_EVENT);
    ASSERT_EQ(r->ev[0].u.kv.kind, ENG_WIRE_KV_RELEASED);
    ASSERT_EQ_U64(r->ev[0].u.kv.prefix_fp, eng_wire_prefix_fp(prompt, 48));
    ASSERT_EQ_U64(r->ev[0].u.kv.request_id, 0);
    r->m.e[0].pinned = false;
    PC_TEST_CALL(check_snapshot(r, 2, &n_pins));
    ASSERT_EQ(n_pins, 0);
    /* Dropping the namespace removes the cached prompt, with its path. */
    ASSERT_EQ(eng_worker_drop_ns(r->w, 5), 0);
    uint32_t n_removed = 0;
    while ((k = eng_worker_poll_wait(r->w, r->ev, 64, 500)) > 0)
        for (size_t j = 0; j < k; j++) {
            ASSERT_EQ(r->ev[j].type, ENG_WIRE_KV_EVENT);
            const eng_wire_kv_event_t *kv = &r->ev[j].u.kv;
            ASSERT_EQ(kv->kind, ENG_WIRE_KV_EVICTED);
            ASSERT_EQ(kv->reason, ENG_EVICT_REMOVED);
            ASSERT_EQ(kv->n_path, kv->n_tokens);
            ASSERT_EQ_U64(kv->prefix_fp, eng_wire_prefix_fp(kv->tokens, kv->n_path));
            ASSERT_TRUE(common(kv->tokens, kv->n_path, prompt, 80) >= kv->n_kept);
            n_removed++;
        }
    ASSERT_TRUE(n_removed > 0);
    eng_worker_free(r->w);
    free(r->m.e);
    free(r);
}

PC_TEST_MAIN()
