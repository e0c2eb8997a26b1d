/*
 * test_worker.c — the worker (engine/worker.h) end to end on a small generated model with a
 * byte-level vocabulary (256 byte tokens and an end-of-turn control token), so that text,
 * stop sequences and the tokenizer are real.
 *
 * The oracle for greedy output is a plain engine loop with no scheduler: the whole prompt in
 * one forward pass, then one token at a time. The worker must give the same tokens when
 * requests run together in chunked steps, when they are preempted and recomputed, and when
 * they start from another request's cached prefix.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "gguf.h"
#include "mkmodel.h"
#include "pc_alloc.h"
#include "pc_assert.h"
#include "pc_err.h"
#include "pc_test.h"
#include "test_bytemodel.h"
#include "pc_time.h"
#include "sampling.h"
#include "vocab.h"
#include "wire.h"
#include "worker.h"

#define N_VOCAB 257
#define EOT_ID 256
#define MAX_OUT 512

static char g_model[256];

static const char *model_path(void)
{
    if (g_model[0] != '\0')
        return g_model;
    char err[256];
    snprintf(g_model, sizeof g_model, "/tmp/kvgw-worker-test-%d.gguf", (int)getpid());
    if (test_bytemodel_write(g_model, "kvgw-worker-test", 4096, 11, EOT_ID, err, sizeof err) != 0) {
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

static eng_worker_params_t wparams(void)
{
    eng_worker_params_t p = eng_worker_params_default();
    p.engine.model_path = model_path();
    p.engine.kv_dtype = ENG_KV_F32;
    p.engine.kv_max_tokens = 16384;
    p.engine.n_threads = 2;
    p.step_tokens = 64;
    p.load_interval_ms = 0;
    return p;
}

static eng_worker_t *start(const eng_worker_params_t *p)
{
    eng_worker_t *w = NULL;
    char err[256];
    if (eng_worker_init(p, &w, err, sizeof err) != 0)
        fprintf(stderr, "eng_worker_init: %s\n", err);
    return w;
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static void random_prompt(uint32_t *t, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        t[i] = rnd(256);
}

/* Greedy reference: a plain engine, the prompt in one pass, then one token at a time. */
static int reference(const uint32_t *prompt, uint32_t n, uint32_t max_tokens, uint32_t *out)
{
    eng_params_t p = eng_params_default();
    p.model_path = model_path();
    p.kv_dtype = ENG_KV_F32;
    p.kv_max_tokens = 8192;
    p.max_batch_tokens = 4096;
    eng_t *e = NULL;
    char err[256];
    if (eng_init(&p, &e, err, sizeof err) != 0)
        return -1;
    eng_seq_t *s = NULL;
    eng_seq_create(e, &s);
    float *lg = malloc(N_VOCAB * sizeof *lg);
    int32_t *ids = malloc((n + max_tokens) * sizeof *ids);
    for (uint32_t i = 0; i < n; i++)
        ids[i] = (int32_t)prompt[i];
    eng_batch_item_t it = {.seq = s, .tokens = ids, .n_tokens = n, .logits = ENG_LOGITS_LAST};
    int rc = eng_forward(e, &it, 1, lg);
    for (uint32_t k = 0; rc == 0 && k < max_tokens; k++) {
        uint32_t t;
        eng_sample_greedy(lg, N_VOCAB, &t);
        out[k] = t;
        ids[n + k] = (int32_t)t;
        if (k + 1 < max_tokens) {
            it = (eng_batch_item_t){
                .seq = s, .tokens = &ids[n + k], .n_tokens = 1, .logits = ENG_LOGITS_LAST};
            rc = eng_forward(e, &it, 1, lg);
        }
    }
    free(lg);
    free(ids);
    eng_seq_free(e, s);
    eng_free(e);
    return rc;
}

/* ---- collecting events ------------------------------------------------------------------ */

typedef struct result {
    uint64_t id;
    uint32_t tokens[MAX_OUT];
    uint32_t n_tokens;
    char text[8192];
    size_t text_len;
    bool done, failed;
    eng_wire_done_t d; /* text slice not kept */
    eng_wire_prefill_t pf;
    uint32_t n_prefill;
    bool prefill_late; /* a TOKEN or DONE came before its PREFILL: a bug */
    int err_code;
    char err_msg[256];
    bool extra_after_final; /* an event after the final one: a bug */
} result_t;

typedef struct snap_seen {
    uint64_t ns;
    uint8_t tier;
    uint64_t ttl_ms;
    uint32_t n_tokens;
    uint32_t tokens[512];
} snap_seen_t;

typedef struct collector {
    result_t *res;
    uint32_t n_res;
    snap_seen_t snap[16];
    uint32_t n_snap;
    bool snap_last;
    eng_wire_kv_event_t kv[256];
    uint32_t n_kv;
    uint32_t n_load;
    eng_wire_load_t last_load;
} collector_t;

static result_t *find(collector_t *c, uint64_t id)
{
    for (uint32_t i = 0; i < c->n_res; i++)
        if (c->res[i].id == id)
            return &c->res[i];
    return NULL;
}

static void take(collector_t *c, const eng_worker_event_t *ev)
{
    result_t *r;
    switch (ev->type) {
    case ENG_WIRE_PREFILL:
        r = find(c, ev->u.prefill.request_id);
        if (r == NULL)
            return;
        r->pf = ev->u.prefill;
        r->n_prefill++;
        break;
    case ENG_WIRE_SNAPSHOT:
        for (uint32_t i = 0; i < ev->u.snapshot.n_entries && c->n_snap < 16; i++) {
            const eng_wire_snap_entry_t *e = &ev->u.snapshot.entries[i];
            snap_seen_t *x = &c->snap[c->n_snap++];
            x->ns = e->ns;
            x->tier = e->tier;
            x->ttl_ms = e->ttl_ms;
            x->n_tokens = PC_MIN(e->n_tokens, 512);
            memcpy(x->tokens, e->tokens, 4 * (size_t)x->n_tokens);
        }
        c->snap_last = c->snap_last || ev->u.snapshot.last;
        break;
    case ENG_WIRE_TOKEN:
        r = find(c, ev->u.token.request_id);
        if (r == NULL)
            return;
        if (r->n_prefill == 0)
            r->prefill_late = true;
        if (r->done || r->failed)
            r->extra_after_final = true;
        if (r->n_tokens < MAX_OUT)
            r->tokens[r->n_tokens++] = ev->u.token.token_id;
        memcpy(r->text + r->text_len, ev->u.token.text.base, ev->u.token.text.len);
        r->text_len += ev->u.token.text.len;
        break;
    case ENG_WIRE_DONE:
        r = find(c, ev->u.done.request_id);
        if (r == NULL)
            return;
        if (r->n_prefill == 0)
            r->prefill_late = true;
        if (r->done || r->failed)
            r->extra_after_final = true;
        r->done = true;
        r->d = ev->u.done;
        r->d.text = (pc_slice_t){NULL, 0};
        memcpy(r->text + r->text_len, ev->u.done.text.base, ev->u.done.text.len);
        r->text_len += ev->u.done.text.len;
        break;
    case ENG_WIRE_ERROR:
        r = find(c, ev->u.error.request_id);
        if (r == NULL)
            return;
        if (r->done || r->failed)
            r->extra_after_final = true;
        r->failed = true;
        r->err_code = ev->u.error.code;
        snprintf(r->err_msg, sizeof r->err_msg, "%.*s", (int)ev->u.error.message.len,
                 ev->u.error.message.base);
        break;
    case ENG_WIRE_KV_EVENT:
        if (c->n_kv < PC_ARRAY_LEN(c->kv))
            c->kv[c->n_kv++] = ev->u.kv;
        break;
    case ENG_WIRE_LOAD:
        c->n_load++;
        c->last_load = ev->u.load;
        break;
    }
}

static bool all_final(const collector_t *c)
{
    for (uint32_t i = 0; i < c->n_res; i++)
        if (!c->res[i].done && !c->res[i].failed)
            return false;
    return true;
}

/* Polls until every tracked request has its final event, or timeout_ms passes. */
static bool drain(eng_worker_t *w, collector_t *c, int timeout_ms)
{
    uint64_t until = pc_time_mono_ms() + (uint64_t)timeout_ms;
    eng_worker_event_t ev[32];
    while (!all_final(c)) {
        if (pc_time_mono_ms() > until)
            return false;
        size_t n = eng_worker_poll_wait(w, ev, PC_ARRAY_LEN(ev), 100);
        for (size_t i = 0; i < n; i++)
            take(c, &ev[i]);
    }
    return true;
}

/* Polls for up to ms (collecting everything). */
static void drain_for(eng_worker_t *w, collector_t *c, int ms)
{
    uint64_t until = pc_time_mono_ms() + (uint64_t)ms;
    eng_worker_event_t ev[32];
    while (pc_time_mono_ms() < until) {
        size_t n = eng_worker_poll_wait(w, ev, PC_ARRAY_LEN(ev), 20);
        for (size_t i = 0; i < n; i++)
            take(c, &ev[i]);
    }
}

static eng_wire_submit_t greedy_req(uint64_t id, uint64_t ns, const uint32_t *t, uint32_t n,
                                    uint32_t max_tokens)
{
    eng_wire_submit_t q = {.request_id = id,
                           .ns = ns,
                           .max_tokens = max_tokens,
                           .flags = ENG_WIRE_SUBMIT_IGNORE_EOG,
                           .tokens = t,
                           .n_tokens = n};
    q.sampling = eng_sampling_params_default();
    q.sampling.temperature = 0;
    return q;
}

static int submit(eng_worker_t *w, const eng_wire_submit_t *q)
{
    char err[256] = "";
    int rc = eng_worker_submit(w, q, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "submit %llu: %s (%s)\n", (unsigned long long)q->request_id,
                pc_strerror(rc), err);
    return rc;
}

/* The pool is back to free + cached only: nothing leaked by finished requests. */
static void check_idle(eng_worker_t *w)
{
    eng_wire_load_t l;
    uint64_t until = pc_time_mono_ms() + 2000;
    do { /* the load is published after the step that retired the last request */
        eng_worker_load(w, &l);
    } while (l.running_seqs != 0 && pc_time_mono_ms() < until);
    ASSERT_EQ(l.running_seqs, 0);
    ASSERT_EQ(l.queued_requests, 0);
    ASSERT_EQ(l.free_blocks + l.cached_blocks, l.total_blocks);
}

/* ---- tests -------------------------------------------------------------------------------- */

#define N_BATCH 6

PC_TEST(batch_equivalence_greedy)
{
    static const uint32_t lens[N_BATCH] = {5, 17, 64, 100, 150, 33};
    static uint32_t prompts[N_BATCH][160], want[N_BATCH][40];
    for (int i = 0; i < N_BATCH; i++) {
        random_prompt(prompts[i], lens[i]);
        ASSERT_EQ(reference(prompts[i], lens[i], 40, want[i]), 0);
    }
    eng_worker_params_t p = wparams();
    p.step_tokens = 48; /* several chunks per prompt, decodes and prefills mixed */
    eng_worker_t *w = start(&p);
    ASSERT_TRUE(w != NULL);
    static result_t res[N_BATCH];
    memset(res, 0, sizeof res);
    collector_t c = {.res = res, .n_res = N_BATCH};
    for (int i = 0; i < N_BATCH; i++) {
        res[i].id = 100 + (uint64_t)i;
        eng_wire_submit_t q = greedy_req(res[i].id, 7, prompts[i], lens[i], 40);
        ASSERT_EQ(submit(w, &q), 0);
    }
    ASSERT_TRUE(drain(w, &c, 60000));
    for (int i = 0; i < N_BATCH; i++) {
        ASSERT_TRUE(res[i].done);
        ASSERT_FALSE(res[i].extra_after_final);
        ASSERT_EQ(res[i].d.stop_reason, ENG_WIRE_STOP_MAX_TOKENS);
        ASSERT_EQ(res[i].n_tokens, 40);
        ASSERT_MEM_EQ(res[i].tokens, want[i], 40 * sizeof(uint32_t));
        ASSERT_EQ(res[i].d.usage.prompt_tokens, lens[i]);
        ASSERT_EQ(res[i].d.usage.output_tokens, 40);
        ASSERT_EQ(res[i].d.usage.tokens_reused + res[i].d.usage.tokens_computed, lens[i]);
    }
    eng_worker_stats_t st;
    eng_worker_stats(w, &st);
    ASSERT_EQ(st.n_finished, N_BATCH);
    ASSERT_EQ(st.tokens_generated, N_BATCH * 40);
    /* Fewer steps than running them one after another: they were batched. */
    ASSERT_LE(st.n_steps, 40 + 10 + 10);
    PC_TEST_CALL(check_idle(w));
    eng_worker_free(w);
}

PC_TEST(preemption_recompute_same_tokens)
{
    /* 12 blocks of 16 tokens; three requests of 40 + 40 tokens need 15: someone is preempted,
     * recomputes its prompt and what it generated, and carries on with the same tokens. */
    static uint32_t prompts[3][40], want[3][40];
    for (int i = 0; i < 3; i++) {
        random_prompt(prompts[i], 40);
        ASSERT_EQ(reference(prompts[i], 40, 40, want[i]), 0);
    }
    eng_worker_params_t p = wparams();
    p.engine.kv_max_tokens = 12 * 16;
    p.engine.kv_poison = true;
    p.step_tokens = 128;
    eng_worker_t *w = start(&p);
    ASSERT_TRUE(w != NULL);
    static result_t res[3];
    memset(res, 0, sizeof res);
    collector_t c = {.res = res, .n_res = 3};
    for (int i = 0; i < 3; i++) {
        res[i].id = 1 + (uint64_t)i;
        eng_wire_submit_t q = greedy_req(res[i].id, 1 + (uint64_t)i, prompts[i], 40, 40);
        ASSERT_EQ(submit(w, &q), 0);
    }
    ASSERT_TRUE(drain(w, &c, 60000));
    uint32_t recomputed = 0;
    for (int i = 0; i < 3; i++) {
        if (!res[i].done)
            fprintf(stderr, "request %d: %s\n", i, res[i].err_msg);
        ASSERT_TRUE(res[i].done);
        ASSERT_EQ(res[i].n_tokens, 40);
        ASSERT_MEM_EQ(res[i].tokens, want[i], 40 * sizeof(uint32_t));
        ASSERT_EQ(res[i].d.usage.output_tokens, 40);
        ASSERT_TRUE(res[i].d.usage.tokens_reused <= 40); /* the first admission's (wire.h) */
        recomputed += res[i].d.usage.tokens_computed + res[i].d.usage.tokens_reused - 40;
    }
    eng_worker_stats_t st;
    eng_worker_stats(w, &st);
    ASSERT_TRUE(st.n_preempted >= 1);
    ASSERT_TRUE(recomputed > 0); /* the preempted request replayed its tokens */
    PC_TEST_CALL(check_idle(w));
    eng_worker_free(w);
}

PC_TEST(same_seed_same_tokens)
{
    static uint32_t prompt[30], other[50];
    random_prompt(prompt, 30);
    random_prompt(other, 50);
    eng_worker_params_t p = wparams();
    eng_worker_t *w = start(&p);
    ASSERT_TRUE(w != NULL);
    static result_t res[4];
    memset(res, 0, sizeof res);
    collector_t c = {.res = res, .n_res = 4};
    uint64_t seeds[4] = {42, 42, 43, 42};
    for (int i = 0; i < 4; i++) {
        res[i].id = 10 + (uint64_t)i;
        /* 0, 1 and 2 run together; 3 runs later beside a different neighbour. */
        eng_wire_submit_t q = greedy_req(res[i].id, 5 + (uint64_t)i, prompt, 30, 32);
        q.sampling.temperature = 0.9f;
        q.sampling.top_k = 64;
        q.sampling.top_p = 0.95f;
        q.sampling.seed = seeds[i];
        if (i == 3) {
            c.n_res = 3;
            ASSERT_TRUE(drain(w, &c, 60000));
            c.n_res = 4;
            eng_wire_submit_t o = greedy_req(99, 77, other, 50, 20);
            ASSERT_EQ(submit(w, &o), 0);
        }
        ASSERT_EQ(submit(w, &q), 0);
    }
    ASSERT_TRUE(drain(w, &c, 60000));
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(res[i].n_tokens, 32);
    ASSERT_MEM_EQ(res[0].tokens, res[1].tokens, 32 * sizeof(uint32_t));
    ASSERT_MEM_EQ(res[0].tokens, res[3].tokens, 32 * sizeof(uint32_t));
    ASSERT_TRUE(memcmp(res[0].tokens, res[2].tokens, 32 * sizeof(uint32_t)) != 0);
    drain_for(w, &c, 200); /* request 99's events */
    eng_worker_free(w);
}

/* Runs one greedy request alone and returns its result (text and tokens). */
static void run_one(eng_worker_t *w, eng_wire_submit_t *q, result_t *out)
{
    memset(out, 0, sizeof *out);
    out->id = q->request_id;
    collector_t c = {.res = out, .n_res = 1};
    ASSERT_EQ(submit(w, q), 0);
    ASSERT_TRUE(drain(w, &c, 60000));
    ASSERT_FALSE(out->extra_after_final);
}

static bool utf8_boundary(const char *s, size_t i)
{
    return ((unsigned char)s[i] & 0xC0) != 0x80;
}

PC_TEST(stop_sequence_across_tokens)
{
    static uint32_t prompt[20];
    random_prompt(prompt, 20);
    eng_worker_params_t p = wparams();
    eng_worker_t *w = start(&p);
    ASSERT_TRUE(w != NULL);
    static result_t full, stopped;
    eng_wire_submit_t q = greedy_req(1, 3, prompt, 20, 60);
    PC_TEST_CALL(run_one(w, &q, &full));
    ASSERT_TRUE(full.done);
    ASSERT_TRUE(full.text_len >= 12);
    /* A stop sequence from the middle of the text, at least 3 bytes (3 byte tokens at least,
     * so it spans token boundaries), starting and ending on character boundaries. */
    size_t a = full.text_len / 3;
    while (a < full.text_len && !utf8_boundary(full.text, a))
        a++;
    size_t b = a + 3;
    while (b < full.text_len && !utf8_boundary(full.text, b))
        b++;
    ASSERT_TRUE(b <= full.text_len);
    pc_slice_t stops[2] = {pc_slice_cstr("\x01\x02\x03-never"), pc_slice(full.text + a, b - a)};
    /* The expected released text: everything before the first occurrence of the stop. */
    size_t first = 0;
    while (memcmp(full.text + first, full.text + a, b - a) != 0)
        first++;
    q.request_id = 2;
    q.ns = 4;
    q.stops = stops;
    q.n_stops = 2;
    PC_TEST_CALL(run_one(w, &q, &stopped));
    ASSERT_TRUE(stopped.done);
    ASSERT_EQ(stopped.d.stop_reason, ENG_WIRE_STOP_SEQUENCE);
    ASSERT_EQ(stopped.d.stop_index, 1);
    ASSERT_EQ(stopped.text_len, first);
    ASSERT_MEM_EQ(stopped.text, full.text, first);
    /* The tokens up to the one that completed the stop are the full run's. */
    ASSERT_TRUE(stopped.n_tokens < full.n_tokens);
    ASSERT_MEM_EQ(stopped.tokens, full.tokens, stopped.n_tokens * sizeof(uint32_t));
    ASSERT_EQ(stopped.d.usage.output_tokens, stopped.n_tokens);

    /* A stop token id: the run ends at its first occurrence, the token is sent, no text. */
    static result_t by_id;
    uint32_t stop_id = full.tokens[7];
    uint32_t at = 0;
    while (full.tokens[at] != stop_id)
        at++;
    q.request_id = 3;
    q.ns = 5;
    q.stops = NULL;
    q.n_stops = 0;
    q.stop_ids = &stop_id;
    q.n_stop_ids = 1;
    PC_TEST_CALL(run_one(w, &q, &by_id));
    ASSERT_TRUE(by_id.done);
    ASSERT_EQ(by_id.d.stop_reason, ENG_WIRE_STOP_TOKEN);
    ASSERT_EQ(by_id.n_tokens, at + 1);
    ASSERT_EQ(by_id.tokens[at], stop_id);
    eng_worker_free(w);
}

PC_TEST(end_of_generation_token)
{
    /* Without IGNORE_EOG the end-of-turn token ends the request when the model produces it:
     * then it is the last token sent; otherwise max_tokens ends it. */
    static uint32_t prompt[40];
    random_prompt(prompt, 40);
    eng_worker_params_t p = wparams();
    eng_worker_t *w = start(&p);
    ASSERT_TRUE(w != NULL);
    static result_t r;
    eng_wire_submit_t q = greedy_req(1, 1, prompt, 40, 200);
    q.flags = 0;
    PC_TEST_CALL(run_one(w, &q, &r));
    ASSERT_TRUE(r.done);
    uint32_t eot_at = UINT32_MAX;
    for (uint32_t i = 0; i < r.n_tokens && eot_at == UINT32_MAX; i++)
        if (r.tokens[i] == EOT_ID)
            eot_at = i;
    if (eot_at != UINT32_MAX) {
        ASSERT_EQ(r.d.stop_reason, ENG_WIRE_STOP_EOG);
        ASSERT_EQ(eot_at, r.n_tokens - 1);
    } else {
        ASSERT_EQ(r.d.stop_reason, ENG_WIRE_STOP_MAX_TOKENS);
        ASSERT_EQ(r.n_tokens, 200);
    }
    eng_worker_free(w);
}

PC_TEST(max_tokens_zero_prewarms)
{
    static uint32_t prompt[100], want[10];
    random_prompt(prompt, 100);
    ASSERT_EQ(reference(prompt, 100, 10, want), 0);
    eng_worker_params_t p = wparams();
    eng_worker_t *w = start(&p);
    ASSERT_TRUE(w != NULL);
    static result_t warm, hot;
    eng_wire_submit_t q = greedy_req(1, 9, prompt, 100, 0);
    PC_TEST_CALL(run_one(w, &q, &warm));
    ASSERT_TRUE(warm.done);
    ASSERT_EQ(warm.d.stop_reason, ENG_WIRE_STOP_MAX_TOKENS);
    ASSERT_EQ(warm.n_tokens, 0);
    ASSERT_EQ(warm.text_len, 0);
    ASSERT_EQ(warm.d.usage.output_tokens, 0);
    ASSERT_EQ(warm.d.usage.tokens_computed, 100);
    ASSERT_EQ(warm.d.usage.tokens_reused, 0);
    /* PREFILL comes once, before the DONE of a request that generates nothing. */
    ASSERT_EQ(warm.n_prefill, 1);
    ASSERT_FALSE(warm.prefill_late);
    ASSERT_EQ(warm.pf.prompt_tokens, 100);
    ASSERT_EQ(warm.pf.tokens_g1 + warm.pf.tokens_g2 + warm.pf.tokens_g3, 0);
    /* The same prompt again finds it cached (all but the last token) and decodes the same. */
    q = greedy_req(2, 9, prompt, 100, 10);
    PC_TEST_CALL(run_one(w, &q, &hot));
    ASSERT_TRUE(hot.done);
    ASSERT_EQ(hot.d.usage.tokens_reused, 99);
    ASSERT_EQ(hot.d.usage.tokens_computed, 1);
    ASSERT_MEM_EQ(hot.tokens, want, 10 * sizeof(uint32_t));
    /* ... and PREFILL, before the first TOKEN, says the 99 came from the pool. */
    ASSERT_EQ(hot.n_prefill, 1);
    ASSERT_FALSE(hot.prefill_late);
    ASSERT_EQ(hot.pf.prompt_tokens, 100);
    ASSERT_EQ(hot.pf.tokens_g1, 99);
    ASSERT_EQ(hot.pf.tokens_g2 + hot.pf.tokens_g3 + hot.pf.tokens_recomputed, 0);
    PC_TEST_CALL(check_idle(w));
    eng_worker_free(w);
}

PC_TEST(cancel_queued_prefill_decode)
{
    static uint32_t long_prompt[3000], short_prompt[10];
    random_prompt(long_prompt, 3000);
    random_prompt(short_prompt, 10);
    eng_worker_params_t p = wparams();
    p.step_tokens = 32;
    p.max_running = 1;
    eng_worker_t *w = start(&p);
    ASSERT_TRUE(w != NULL);
    static result_t res[3];
    memset(res, 0, sizeof res);
    collector_t c = {.res = res, .n_res = 3};
    res[0].id = 1; /* mid-prefill */
    res[1].id = 2; /* queued behind it (max_running 1) */
    res[2].id = 3; /* mid-decode, later */
    eng_wire_submit_t q = greedy_req(1, 1, long_prompt, 3000, 10);
    ASSERT_EQ(submit(w, &q), 0);
    q = greedy_req(2, 1, short_prompt, 10, 10);
    ASSERT_EQ(submit(w, &q), 0);
    /* Wait until the long prefill ran a few steps, then cancel both. */
    eng_worker_stats_t st;
    uint64_t until = pc_time_mono_ms() + 30000;
    do {
        eng_worker_stats(w, &st);
    } while (st.n_steps < 3 && pc_time_mono_ms() < until);
    ASSERT_TRUE(st.n_steps >= 3);
    ASSERT_EQ(eng_worker_cancel(w, 2), 0);
    ASSERT_EQ(eng_worker_cancel(w, 1), 0);
    ASSERT_EQ(eng_worker_cancel(w, 12345), PC_ERR_NOTFOUND);
    c.n_res = 2;
    ASSERT_TRUE(drain(w, &c, 30000));
    ASSERT_TRUE(res[0].done && res[1].done);
    ASSERT_EQ(res[0].d.stop_reason, ENG_WIRE_STOP_CANCELED);
    ASSERT_EQ(res[0].n_tokens, 0);
    ASSERT_TRUE(res[0].d.usage.tokens_computed > 0);
    ASSERT_TRUE(res[0].d.usage.tokens_computed < 3000);
    ASSERT_EQ(res[1].d.stop_reason, ENG_WIRE_STOP_CANCELED);
    ASSERT_EQ(res[1].d.usage.tokens_computed, 0);
    ASSERT_EQ(eng_worker_cancel(w, 1), PC_ERR_NOTFOUND); /* finished */

    /* Mid-decode: cancel after the first tokens arrived. */
    q = greedy_req(3, 2, short_prompt, 10, 2000);
    ASSERT_EQ(submit(w, &q), 0);
    eng_worker_event_t ev[16];
    c.n_res = 3;
    until = pc_time_mono_ms() + 30000;
    while (res[2].n_tokens < 3 && pc_time_mono_ms() < until) {
        size_t n = eng_worker_poll_wait(w, ev, 16, 100);
        for (size_t i = 0; i < n; i++)
            take(&c, &ev[i]);
    }
    ASSERT_EQ(eng_worker_cancel(w, 3), 0);
    ASSERT_TRUE(drain(w, &c, 30000));
    ASSERT_TRUE(res[2].done);
    ASSERT_EQ(res[2].d.stop_reason, ENG_WIRE_STOP_CANCELED);
    ASSERT_TRUE(res[2].n_tokens >= 3 && res[2].n_tokens < 2000);
    ASSERT_EQ(res[2].d.usage.output_tokens, res[2].n_tokens);
    PC_TEST_CALL(check_idle(w));
    /* The id is free again after its final event. */
    q = greedy_req(3, 2, short_prompt, 10, 1);
    ASSERT_EQ(submit(w, &q), 0);
    eng_worker_free(w); /* with a request in flight: dropped without events */
}

PC_TEST(queue_overflow_overloaded)
{
    static uint32_t long_prompt[2000], prompt[10];
    random_prompt(long_prompt, 2000);
    random_prompt(prompt, 10);
    eng_worker_params_t p = wparams();
    p.max_running = 1;
    p.max_queue = 2;
    p.step_tokens = 16;
    eng_worker_t *w = start(&p);
    ASSERT_TRUE(w != NULL);
    eng_wire_submit_t q = greedy_req(1, 1, long_prompt, 2000, 5);
    ASSERT_EQ(submit(w, &q), 0);
    /* Wait until request 1 is admitted (running), so the queue is empty. */
    eng_wire_load_t l;
    uint64_t until = pc_time_mono_ms() + 30000;
    do {
        eng_worker_load(w, &l);
    } while (l.running_seqs != 1 && pc_time_mono_ms() < until);
    ASSERT_EQ(l.running_seqs, 1);
    q = greedy_req(2, 1, prompt, 10, 5);
    ASSERT_EQ(submit(w, &q), 0);
    q.request_id = 3;
    ASSERT_EQ(submit(w, &q), 0);
    q.request_id = 4;
    char err[256] = "";
    ASSERT_EQ(eng_worker_submit(w, &q, err, sizeof err), PC_ERR_OVERLOADED);
    ASSERT_TRUE(strstr(err, "overloaded") != NULL);
    q.request_id = 2; /* a live id */
    ASSERT_EQ(eng_worker_submit(w, &q, err, sizeof err), PC_ERR_EXISTS);
    eng_worker_load(w, &l);
    static result_t res[3];
    memset(res, 0, sizeof res);
    res[0].id = 1, res[1].id = 2, res[2].id = 3;
    collector_t c = {.res = res, .n_res = 3};
    ASSERT_EQ(eng_worker_cancel(w, 1), 0);
    ASSERT_TRUE(drain(w, &c, 30000));
    ASSERT_TRUE(res[1].done && res[2].done);
    ASSERT_EQ(res[1].n_tokens, 5);
    /* Room again. */
    q.request_id = 4;
    ASSERT_EQ(submit(w, &q), 0);
    eng_worker_free(w);
}

PC_TEST(bad_requests_refused)
{
    eng_worker_params_t p = wparams();
    p.engine.kv_max_tokens = 8 * 16; /* 128 tokens */
    eng_worker_t *w = start(&p);
    ASSERT_TRUE(w != NULL);
    eng_worker_info_t info;
    eng_worker_info(w, &info);
    ASSERT_EQ(info.n_vocab, N_VOCAB);
    ASSERT_EQ(info.n_ctx, 4096);
    ASSERT_EQ(info.block_tokens, 16);
    ASSERT_EQ(info.total_blocks, 8);
    ASSERT_EQ(info.max_prompt_tokens, 128);
    ASSERT_STR_EQ(info.model_name, "kvgw-worker-test");
    ASSERT_TRUE(info.model_fp != 0);
    static uint32_t big[5000];
    random_prompt(big, 5000);
    char err[256];
    /* Larger than the pool. */
    eng_wire_submit_t q = greedy_req(1, 1, big, 129, 1);
    ASSERT_EQ(eng_worker_submit(w, &q, err, sizeof err), PC_ERR_RANGE);
    ASSERT_TRUE(strstr(err, "KV blocks") != NULL);
    /* Longer than the context. */
    q = greedy_req(1, 1, big, 100, 4000);
    ASSERT_EQ(eng_worker_submit(w, &q, err, sizeof err), PC_ERR_RANGE);
    ASSERT_TRUE(strstr(err, "context") != NULL);
    /* A token id out of range. */
    big[3] = N_VOCAB;
    q = greedy_req(1, 1, big, 10, 1);
    ASSERT_EQ(eng_worker_submit(w, &q, err, sizeof err), PC_ERR_INVAL);
    big[3] = 1;
    /* Request id 0, empty prompt, bad sampling, bad flags, bad retain, bad stop. */
    q = greedy_req(0, 1, big, 10, 1);
    ASSERT_EQ(eng_worker_submit(w, &q, err, sizeof err), PC_ERR_INVAL);
    q = greedy_req(1, 1, big, 0, 1);
    ASSERT_EQ(eng_worker_submit(w, &q, err, sizeof err), PC_ERR_INVAL);
    q = greedy_req(1, 1, big, 10, 1);
    q.sampling.top_p = 0;
    ASSERT_EQ(eng_worker_submit(w, &q, err, sizeof err), PC_ERR_INVAL);
    q = greedy_req(1, 1, big, 10, 1);
    q.flags = 2;
    ASSERT_EQ(eng_worker_submit(w, &q, err, sizeof err), PC_ERR_INVAL);
    eng_wire_retain_t rt = {.n_tokens = 11, .ttl_ms = 1000};
    q = greedy_req(1, 1, big, 10, 1);
    q.retain = &rt;
    q.n_retain = 1;
    ASSERT_EQ(eng_worker_submit(w, &q, err, sizeof err), PC_ERR_INVAL);
    pc_slice_t empty = pc_slice("", 0);
    q = greedy_req(1, 1, big, 10, 1);
    q.stops = &empty;
    q.n_stops = 1;
    ASSERT_EQ(eng_worker_submit(w, &q, err, sizeof err), PC_ERR_INVAL);
    /* Nothing was queued: no events, nothing submitted. */
    eng_worker_event_t ev[4];
    ASSERT_EQ(eng_worker_poll_wait(w, ev, 4, 100), 0);
    eng_worker_stats_t st;
    eng_worker_stats(w, &st);
    ASSERT_EQ(st.n_submitted, 0);
    /* Prompt and generation that fill the pool exactly run to the end (the prompt's cached
     * copy in the index gives way); one more token than fits fails cleanly after the tokens
     * that fitted. */
    static result_t r;
    q = greedy_req(5, 1, big, 120, 9); /* KV holds 120 + 8: the last token is never fed */
    PC_TEST_CALL(run_one(w, &q, &r));
    ASSERT_TRUE(r.done);
    ASSERT_EQ(r.n_tokens, 9);
    q = greedy_req(6, 1, big, 120, 40);
    PC_TEST_CALL(run_one(w, &q, &r));
    ASSERT_TRUE(r.failed);
    ASSERT_EQ(r.err_code, PC_ERR_NOSPACE);
    ASSERT_EQ(r.n_tokens, 9);
    PC_TEST_CALL(check_idle(w));
    eng_worker_free(w);
}

PC_TEST(shared_prefix_computed_once)
{
    /* Four requests with a 512-token common prefix arrive together; one computes it, the
     * others wait for it and start from the cache. */
    enum { SHARED = 512, SUFFIX = 12, N = 4 };
    static uint32_t prompts[N][SHARED + SUFFIX], want[N][8];
    random_prompt(prompts[0], SHARED + SUFFIX);
    for (int i = 1; i < N; i++) {
        memcpy(prompts[i], prompts[0], SHARED * sizeof(uint32_t));
        random_prompt(prompts[i] + SHARED, SUFFIX);
        prompts[i][SHARED] = (prompts[0][SHARED] + (uint32_t)i) % 256; /* diverge right there */
    }
    for (int i = 0; i < N; i++)
        ASSERT_EQ(reference(prompts[i], SHARED + SUFFIX, 8, want[i]), 0);
    eng_worker_params_t p = wparams();
    p.step_tokens = 64;
    eng_worker_t *w = start(&p);
    ASSERT_TRUE(w != NULL);
    static result_t res[N];
    memset(res, 0, sizeof res);
    collector_t c = {.res = res, .n_res = N};
    for (int i = 0; i < N; i++) {
        res[i].id = 1 + (uint64_t)i;
        eng_wire_submit_t q = greedy_req(res[i].id, 42, prompts[i], SHARED + SUFFIX, 8);
        ASSERT_EQ(submit(w, &q), 0);
    }
    ASSERT_TRUE(drain(w, &c, 60000));
    uint32_t computed = 0, reused = 0;
    for (int i = 0; i < N; i++) {
        ASSERT_TRUE(res[i].done);
        ASSERT_MEM_EQ(res[i].tokens, want[i], 8 * sizeof(uint32_t));
        computed += res[i].d.usage.tokens_computed;
        reused += res[i].d.usage.tokens_reused;
    }
    /* The shared part once, each suffix once. */
    ASSERT_EQ(computed, SHARED + N * SUFFIX);
    ASSERT_EQ(reused, (N - 1) * SHARED);
    eng_worker_stats_t st;
    eng_worker_stats(w, &st);
    ASSERT_TRUE(st.n_prefix_waits >= N - 1);
    PC_TEST_CALL(check_idle(w));
    eng_worker_free(w);
}

PC_TEST(short_prompt_not_held_up_by_long_prefill)
{
    /* A 3000-token prompt submitted first takes many steps of 64 tokens; a 20-token one
     * submitted right after gets its first token while the long prefill is still running. */
    static uint32_t long_prompt[3000], short_prompt[20];
    random_prompt(long_prompt, 3000);
    random_prompt(short_prompt, 20);
    eng_worker_params_t p = wparams();
    p.step_tokens = 64;
    eng_worker_t *w = start(&p);
    ASSERT_TRUE(w != NULL);
    static result_t res[2];
    memset(res, 0, sizeof res);
    res[0].id = 1, res[1].id = 2;
    collector_t c = {.res = res, .n_res = 2};
    eng_wire_submit_t q = greedy_req(1, 1, long_prompt, 3000, 2);
    ASSERT_EQ(submit(w, &q), 0);
    q = greedy_req(2, 2, short_prompt, 20, 2);
    ASSERT_EQ(submit(w, &q), 0);
    eng_worker_event_t ev[16];
    uint64_t until = pc_time_mono_ms() + 60000;
    bool short_first = false;
    while (!all_final(&c) && pc_time_mono_ms() < until) {
        size_t n = eng_worker_poll_wait(w, ev, 16, 100);
        for (size_t i = 0; i < n; i++) {
            take(&c, &ev[i]);
            if (res[1].n_tokens > 0 && res[0].n_tokens == 0)
                short_first = true;
        }
    }
    ASSERT_TRUE(res[0].done && res[1].done);
    ASSERT_TRUE(short_first);
    eng_worker_free(w);
}

static bool has_kv(const collector_t *c, uint8_t kind, uint64_t ns, uint32_t n, uint64_t fp,
                   uint64_t request_id)
{
    for (uint32_t i = 0; i < c->n_kv; i++) {
        const eng_wire_kv_event_t *k = &c->kv[i];
        if (k->kind == kind && k->ns == ns && k->n_tokens == n && k->prefix_fp == fp &&
            k->request_id == request_id)
            return true;
    }
    return false;
}

PC_TEST(kv_events_retained_released_evicted)
{
    static uint32_t a[100], b[100];
    random_prompt(a, 100);
    random_prompt(b, 100);
    eng_worker_params_t p = wparams();
    p.engine.kv_max_tokens = 10 * 16; /* 160 tokens: b's prefill must evict a's cache */
    eng_worker_t *w = start(&p);
    ASSERT_TRUE(w != NULL);
    static result_t res[2];
    memset(res, 0, sizeof res);
    res[0].id = 1;
    collector_t c = {.res = res, .n_res = 1};
    eng_wire_retain_t rt[2] = {{.n_tokens = 40, .ttl_ms = 150}, {.n_tokens = 100, .ttl_ms = 300}};
    eng_wire_submit_t q = greedy_req(1, 21, a, 100, 4);
    q.retain = rt;
    q.n_retain = 2;
    uint64_t t_submit = pc_time_mono_ms();
    ASSERT_EQ(submit(w, &q), 0);
    ASSERT_TRUE(drain(w, &c, 30000));
    uint64_t waited = pc_time_mono_ms() - t_submit; /* submit to the events' arrival, at most */
    drain_for(w, &c, 50);
    uint64_t fp40 = eng_wire_prefix_fp(a, 40), fp100 = eng_wire_prefix_fp(a, 100);
    ASSERT_TRUE(has_kv(&c, ENG_WIRE_KV_RETAINED, 21, 40, fp40, 1));
    ASSERT_TRUE(has_kv(&c, ENG_WIRE_KV_RETAINED, 21, 100, fp100, 1));
    /* RETAINED's ttl_ms is the time left until the pin's expiry (ttl_ms after the submit):
     * at most the TTL, and at least the TTL less the time from the submit to the events'
     * arrival (a bound that holds however slow the machine is). */
    for (uint32_t i = 0; i < c.n_kv; i++)
        if (c.kv[i].kind == ENG_WIRE_KV_RETAINED) {
            uint64_t want = c.kv[i].n_tokens == 40 ? 150 : 300;
            ASSERT_TRUE(c.kv[i].ttl_ms <= want && c.kv[i].ttl_ms + waited + 1 >= want);
        }
    /* The pins expire (the worker releases them): RELEASED, same names; a pin belongs to the
     * worker, not to the request, so RELEASED carries request id 0. */
    drain_for(w, &c, 600);
    ASSERT_TRUE(has_kv(&c, ENG_WIRE_KV_RELEASED, 21, 40, fp40, 0));
    ASSERT_TRUE(has_kv(&c, ENG_WIRE_KV_RELEASED, 21, 100, fp100, 0));
    /* Another namespace needs the blocks: a's cache is evicted, reported with its path. */
    res[1].id = 2;
    c.n_res = 2;
    q = greedy_req(2, 22, b, 100, 4);
    ASSERT_EQ(submit(w, &q), 0);
    ASSERT_TRUE(drain(w, &c, 30000));
    ASSERT_TRUE(res[1].done);
    uint32_t n_evicted = 0;
    for (uint32_t i = 0; i < c.n_kv; i++) {
        const eng_wire_kv_event_t *k = &c.kv[i];
        if (k->kind != ENG_WIRE_KV_EVICTED)
            continue;
        n_evicted++;
        ASSERT_EQ(k->ns, 21);
        ASSERT_EQ(k->reason, ENG_EVICT_LRU);
        ASSERT_TRUE(k->n_kept < k->n_tokens && k->n_tokens <= 100);
        ASSERT_EQ_U64(k->prefix_fp, eng_wire_prefix_fp(a, k->n_tokens));
        ASSERT_EQ(k->n_path, k->n_tokens); /* the path's ids came with it */
    }
    ASSERT_TRUE(n_evicted >= 1);
    eng_worker_free(w);
}

static atomic_int g_wakes;
static void on_wake(void *ud)
{
    (void)ud;
    atomic_fetch_add(&g_wakes, 1);
}

PC_TEST(load_events_and_wake)
{
    static uint32_t prompt[200];
    random_prompt(prompt, 200);
    eng_worker_params_t p = wparams();
    p.load_interval_ms = 20;
    p.step_tokens = 16;
    p.wake = on_wake;
    eng_worker_t *w = start(&p);
    ASSERT_TRUE(w != NULL);
    eng_wire_load_t l;
    eng_worker_load(w, &l);
    ASSERT_EQ(l.total_blocks, 16384 / 16);
    ASSERT_EQ(l.free_blocks, l.total_blocks);
    static result_t res[1];
    memset(res, 0, sizeof res);
    res[0].id = 1;
    collector_t c = {.res = res, .n_res = 1};
    eng_wire_submit_t q = greedy_req(1, 1, prompt, 200, 60);
    ASSERT_EQ(submit(w, &q), 0);
    /* Wait for wake-ups, then drain with non-blocking polls only. */
    uint64_t until = pc_time_mono_ms() + 30000;
    eng_worker_event_t ev[4]; /* small: several polls per wake */
    while (!all_final(&c) && pc_time_mono_ms() < until) {
        int seen = atomic_load(&g_wakes);
        size_t n;
        while ((n = eng_worker_poll(w, ev, 4)) > 0)
            for (size_t i = 0; i < n; i++)
                take(&c, &ev[i]);
        while (atomic_load(&g_wakes) == seen && !all_final(&c) && pc_time_mono_ms() < until)
            usleep(200);
    }
    ASSERT_TRUE(res[0].done);
    ASSERT_TRUE(atomic_load(&g_wakes) >= 1);
    drain_for(w, &c, 100); /* the idle LOAD */
    ASSERT_TRUE(c.n_load >= 2);
    ASSERT_EQ(c.last_load.running_seqs, 0);
    ASSERT_EQ(c.last_load.total_blocks, 1024);
    ASSERT_TRUE(c.last_load.cached_blocks >= 200 / 16);
    eng_worker_free(w);
}

/* A wake callback that can hold the scheduler thread between a step's flush and its next loop
 * (where it takes new requests and cancels), so that a test decides what the next loop sees.
 * The worker calls wake without its lock held, so the test can submit, cancel and poll while
 * the scheduler waits here. */
static pthread_mutex_t g_gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_gate_cv = PTHREAD_COND_INITIALIZER;
static int g_gate_hold;    /* wake calls still to hold */
static int g_gate_entered; /* wake calls held so far */
static bool g_gate_go;

static void gate_wake(void *ud)
{
    (void)ud;
    pthread_mutex_lock(&g_gate_mu);
    if (g_gate_hold > 0) {
        g_gate_hold--;
        g_gate_entered++;
        pthread_cond_broadcast(&g_gate_cv);
        while (!g_gate_go)
            pthread_cond_wait(&g_gate_cv, &g_gate_mu);
        g_gate_go = false;
    }
    pthread_mutex_unlock(&g_gate_mu);
}

/* Waits (up to 30 s) until the scheduler is held for the n-th time. */
static bool gate_wait(int n)
{
    uint64_t until = pc_time_mono_ms() + 30000;
    pthread_mutex_lock(&g_gate_mu);
    while (g_gate_entered < n && pc_time_mono_ms() < until) {
        pthread_mutex_unlock(&g_gate_mu);
        usleep(200);
        pthread_mutex_lock(&g_gate_mu);
    }
    bool ok = g_gate_entered >= n;
    pthread_mutex_unlock(&g_gate_mu);
    return ok;
}

static void gate_release(void)
{
    pthread_mutex_lock(&g_gate_mu);
    g_gate_go = true;
    pthread_cond_broadcast(&g_gate_cv);
    pthread_mutex_unlock(&g_gate_mu);
}

/* Polls without waiting until id's final event arrived (everything is collected). */
static void poll_until_final(eng_worker_t *w, collector_t *c, result_t *r)
{
    eng_worker_event_t ev[32];
    uint64_t until = pc_time_mono_ms() + 30000;
    while (!r->done && !r->failed && pc_time_mono_ms() < until) {
        size_t n = eng_worker_poll_wait(w, ev, PC_ARRAY_LEN(ev), 20);
        for (size_t i = 0; i < n; i++)
            take(c, &ev[i]);
    }
}

/* The before_step hook of the test below: once armed, cancels request 1 from the scheduler's
 * loop after the loop took its cancels, that is, during the step that follows. */
typedef struct step_cancel {
    eng_worker_t *_Atomic w;
    atomic_bool armed;
    atomic_int rc;
} step_cancel_t;

static void cancel_before_step(void *ud)
{
    step_cancel_t *sc = ud;
    if (atomic_exchange(&sc->armed, false))
        atomic_store(&sc->rc, eng_worker_cancel(atomic_load(&sc->w), 1));
}

PC_TEST(cancel_in_finishing_step_does_not_cancel_reused_id)
{
    /* A cancel that arrives while the step that finishes its request runs comes too late: the
     * request ends on its own. The stale cancel must not survive to cancel the next request
     * that reuses the id (the id is free once the final event is queued). The wake gate holds
     * the scheduler after step 1 (the first token of request 1); the before_step hook then
     * cancels request 1 in the next loop, after that loop took its cancels, so the cancel lands
     * in step 2 (request 1's last token) every time; the gate holds the scheduler after step 2
     * while id 1 is submitted again, before the scheduler's next loop. */
    static uint32_t prompt[10];
    random_prompt(prompt, 10);
    eng_worker_params_t p = wparams();
    step_cancel_t sc = {.rc = 1};
    p.wake = gate_wake;
    p.before_step = cancel_before_step;
    p.before_step_ud = &sc;
    eng_worker_t *w = start(&p);
    ASSERT_TRUE(w != NULL);
    atomic_store(&sc.w, w);
    result_t res[1];
    memset(res, 0, sizeof res);
    collector_t c = {.res = res, .n_res = 1};
    res[0].id = 1; /* the request that finishes in step 2, and later its id's reuse */
    pthread_mutex_lock(&g_gate_mu);
    g_gate_hold = 2;
    g_gate_entered = 0;
    g_gate_go = false;
    pthread_mutex_unlock(&g_gate_mu);

    eng_wire_submit_t q = greedy_req(1, 1, prompt, 10, 2);
    ASSERT_EQ(submit(w, &q), 0);
    ASSERT_TRUE(gate_wait(1)); /* step 1 done: request 1 decodes its last token next */
    eng_worker_event_t ev[8];
    size_t n_ev;
    while ((n_ev = eng_worker_poll(w, ev, PC_ARRAY_LEN(ev))) > 0) /* emptied: wake again */
        for (size_t i = 0; i < n_ev; i++)
            take(&c, &ev[i]);
    ASSERT_EQ(res[0].n_tokens, 1);
    atomic_store(&sc.armed, true);
    gate_release();
    ASSERT_TRUE(gate_wait(2));            /* step 2 flushed; the next loop has not run */
    ASSERT_FALSE(atomic_load(&sc.armed)); /* the hook ran before step 2 */
    ASSERT_EQ(atomic_load(&sc.rc), 0);    /* and found request 1 running: the cancel counts */
    poll_until_final(w, &c, &res[0]);
    ASSERT_TRUE(res[0].done);
    ASSERT_EQ(res[0].d.stop_reason, ENG_WIRE_STOP_MAX_TOKENS);
    ASSERT_EQ(res[0].n_tokens, 2);
    /* The id is free: reuse it while the scheduler is still held. */
    memset(&res[0], 0, sizeof res[0]);
    res[0].id = 1;
    q = greedy_req(1, 1, prompt, 10, 3);
    ASSERT_EQ(submit(w, &q), 0);
    pthread_mutex_lock(&g_gate_mu);
    g_gate_hold = 0;
    pthread_mutex_unlock(&g_gate_mu);
    gate_release();
    bool drained = drain(w, &c, 60000);
    if (!drained)
        fprintf(stderr, "  req 1: done %d failed %d stop %u tokens %u (%s)\n", res[0].done,
                res[0].failed, res[0].d.stop_reason, res[0].n_tokens, res[0].err_msg);
    ASSERT_TRUE(drained);
    ASSERT_TRUE(res[0].done);
    ASSERT_EQ(res[0].d.stop_reason, ENG_WIRE_STOP_MAX_TOKENS);
    ASSERT_EQ(res[0].n_tokens, 3);
    ASSERT_EQ(eng_worker_cancel(w, 1), PC_ERR_NOTFOUND);
    PC_TEST_CALL(check_idle(w));
    eng_worker_free(w);
}

static atomic_int g_stopped;
static void on_stopped(void *ud)
{
    atomic_fetch_add((atomic_int *)ud, 1);
}

PC_TEST(stop_returns_without_waiting_for_the_step)
{
    /* eng_worker_stop asks and returns: the scheduler thread is held (in the wake gate, as if
     * inside a long step) and the call still returns, on_stopped not yet run. Once released,
     * the thread stops on its own and says so; only then is the worker freed. */
    static uint32_t prompt[40];
    random_prompt(prompt, 40);
    eng_worker_params_t p = wparams();
    p.wake = gate_wake;
    eng_worker_t *w = start(&p);
    ASSERT_TRUE(w != NULL);
    pthread_mutex_lock(&g_gate_mu);
    g_gate_hold = 1;
    g_gate_entered = 0;
    g_gate_go = false;
    pthread_mutex_unlock(&g_gate_mu);
    atomic_store(&g_stopped, 0);
    eng_wire_submit_t q = greedy_req(1, 1, prompt, 40, 500);
    ASSERT_EQ(submit(w, &q), 0);
    ASSERT_TRUE(gate_wait(1)); /* the scheduler thread is busy (held) */
    eng_worker_stop(w, on_stopped, &g_stopped);
    eng_worker_stop(w, NULL, NULL); /* a second call does nothing */
    ASSERT_EQ(atomic_load(&g_stopped), 0);
    char err[128] = "";
    ASSERT_EQ(eng_worker_submit(w, &q, err, sizeof err), PC_ERR_STATE);
    q.request_id = 2;
    ASSERT_EQ(eng_worker_submit(w, &q, err, sizeof err), PC_ERR_STATE);
    gate_release();
    uint64_t until = pc_time_mono_ms() + 10000;
    while (atomic_load(&g_stopped) == 0 && pc_time_mono_ms() < until)
        usleep(200);
    ASSERT_EQ(atomic_load(&g_stopped), 1);
    /* The first step's events are still there to poll: request 1's first token. */
    eng_worker_event_t ev[8];
    size_t n = eng_worker_poll(w, ev, PC_ARRAY_LEN(ev));
    ASSERT_TRUE(n >= 2);
    ASSERT_EQ(ev[0].type, ENG_WIRE_PREFILL); /* where its prompt came from, then the token */
    ASSERT_EQ(ev[0].u.prefill.request_id, 1);
    ASSERT_EQ(ev[1].type, ENG_WIRE_TOKEN);
    ASSERT_EQ(ev[1].u.token.request_id, 1);
    eng_worker_free(w);
    ASSERT_EQ(atomic_load(&g_stopped), 1); /* once */
}

/* The fingerprint eng_worker_info reports for the model at path (0 when it does not load). */
static uint64_t model_fp_of(const char *path)
{
    eng_worker_params_t p = wparams();
    p.engine.model_path = path;
    eng_worker_t *w = start(&p);
    if (w == NULL)
        return 0;
    eng_worker_info_t in;
    eng_worker_info(w, &in);
    eng_worker_free(w);
    return in.model_fp;
}

PC_TEST(model_fp_covers_the_weights)
{
    /* Two models that differ only in their weights (the generator's seed) must not pass for
     * one another at the handshake: the fingerprint covers the tensor data, not only the
     * header. The same bytes give the same fingerprint, and one changed byte in the last
     * tensor changes it. */
    char a[128], b[128], c[128], err[256];
    snprintf(a, sizeof a, "/tmp/kvgw-fp-a-%d.gguf", (int)getpid());
    snprintf(b, sizeof b, "/tmp/kvgw-fp-b-%d.gguf", (int)getpid());
    snprintf(c, sizeof c, "/tmp/kvgw-fp-c-%d.gguf", (int)getpid());
    ASSERT_EQ(test_bytemodel_write(a, "kvgw-fp", 4096, 21, EOT_ID, err, sizeof err), 0);
    ASSERT_EQ(test_bytemodel_write(b, "kvgw-fp", 4096, 22, EOT_ID, err, sizeof err), 0);
    /* c: a's bytes with the last byte of the last tensor's data changed. */
    eng_gguf_t *g = NULL;
    ASSERT_EQ(eng_gguf_open(a, &g, err, sizeof err), 0);
    const eng_gguf_tensor_t *t = eng_gguf_tensor_at(g, eng_gguf_n_tensors(g) - 1);
    uint64_t at = eng_gguf_data_offset(g) + t->offset + t->n_bytes - 1;
    size_t size = (size_t)eng_gguf_file_size(g);
    uint8_t *bytes = malloc(size);
    ASSERT_TRUE(bytes != NULL);
    memcpy(bytes, eng_gguf_file_base(g), size);
    eng_gguf_free(g);
    bytes[at] ^= 0x01;
    FILE *out = fopen(c, "wb");
    ASSERT_TRUE(out != NULL);
    ASSERT_EQ(fwrite(bytes, 1, size, out), size);
    fclose(out);
    free(bytes);
    uint64_t fa = model_fp_of(a), fa2 = model_fp_of(a), fb = model_fp_of(b), fc = model_fp_of(c);
    unlink(a);
    unlink(b);
    unlink(c);
    ASSERT_TRUE(fa != 0 && fb != 0 && fc != 0);
    ASSERT_EQ_U64(fa, fa2);
    ASSERT_NE(fa, fb);
    ASSERT_NE(fa, fc);
}

/* ---- KV tiers (engine/tier.h) through the worker ------------------------------------------ */

static void tier_dir(char *out, size_t n, const char *name)
{
    snprintf(out, n, "/tmp/kvgw-worker-tier-%d/%s/w0", (int)getpid(), name);
}

__attribute__((destructor)) static void remove_tier_dirs(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf /tmp/kvgw-worker-tier-%d", (int)getpid());
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove the tier directories\n");
}

static eng_worker_params_t tier_params(const char *dir)
{
    eng_worker_params_t p = wparams();
    p.engine.tier.dir = dir;
    p.engine.tier.max_bytes = 256u << 20;
    p.engine.tier.write_through = true;
    return p;
}

/* Runs prompt[0..n) in namespace ns with a retain entry for all of it (written through to the
 * disk tier). */
static void run_retained(eng_worker_t *w, uint64_t id, uint64_t ns, const uint32_t *prompt,
                         uint32_t n, uint32_t max_tokens, result_t *out)
{
    eng_wire_retain_t keep = {.n_tokens = n, .ttl_ms = 3600000};
    eng_wire_submit_t q = greedy_req(id, ns, prompt, n, max_tokens);
    q.retain = &keep;
    q.n_retain = 1;
    PC_TEST_CALL(run_one(w, &q, out));
}

/* A retained prompt is written through to the disk tier; a worker started again on the same
 * directory lists it in its SNAPSHOT (tier 3, no TTL) and serves the same prompt from disk:
 * PREFILL says g3, DONE reuses it, and the output equals a cold prefill's. */
PC_TEST(tier_restart_serves_from_disk)
{
    enum { N = 200, OUT = 8 };
    static uint32_t prompt[N], want[OUT];
    random_prompt(prompt, N);
    ASSERT_EQ(reference(prompt, N, OUT, want), 0);
    char dir[256];
    tier_dir(dir, sizeof dir, "restart");
    eng_worker_params_t p = tier_params(dir);
    eng_worker_t *w = start(&p);
    ASSERT_TRUE(w != NULL);
    static result_t first, again;
    PC_TEST_CALL(run_retained(w, 1, 77, prompt, N, OUT, &first));
    ASSERT_TRUE(first.done);
    ASSERT_MEM_EQ(first.tokens, want, OUT * sizeof(uint32_t));
    ASSERT_EQ(first.pf.tokens_g3, 0);
    eng_worker_free(w); /* the queued writes finish first */

    w = start(&p);
    ASSERT_TRUE(w != NULL);
    eng_wire_load_t l;
    eng_worker_load(w, &l);
    ASSERT_TRUE(l.g3.max_bytes == 256u << 20);
    ASSERT_TRUE(l.g3.blocks > 0 && l.g3.bytes > 0);
    ASSERT_EQ(l.g2.max_bytes, 0); /* no G2 configured */
    collector_t c = {0};
    ASSERT_EQ(eng_worker_snapshot(w, 5), 0);
    uint64_t until = pc_time_mono_ms() + 10000;
    while (!c.snap_last && pc_time_mono_ms() < until)
        drain_for(w, &c, 50);
    ASSERT_TRUE(c.snap_last);
    ASSERT_EQ(c.n_snap, 1);
    ASSERT_EQ_U64(c.snap[0].ns, 77);
    ASSERT_EQ(c.snap[0].tier, ENG_WIRE_TIER_G3);
    ASSERT_EQ_U64(c.snap[0].ttl_ms, 0);
    ASSERT_TRUE(c.snap[0].n_tokens > 0 && c.snap[0].n_tokens <= N);
    ASSERT_MEM_EQ(c.snap[0].tokens, prompt, 4 * (size_t)c.snap[0].n_tokens);

    eng_wire_submit_t q = greedy_req(2, 77, prompt, N, OUT);
    PC_TEST_CALL(run_one(w, &q, &again));
    ASSERT_TRUE(again.done);
    ASSERT_EQ(again.n_prefill, 1);
    ASSERT_FALSE(again.prefill_late);
    ASSERT_TRUE(again.pf.tokens_g3 > 0);
    ASSERT_EQ(again.pf.tokens_g1, 0); /* nothing in the new pool */
    ASSERT_EQ(again.d.usage.tokens_reused, again.pf.tokens_g3 + again.pf.tokens_recomputed);
    ASSERT_MEM_EQ(again.tokens, want, OUT * sizeof(uint32_t));
    eng_worker_load(w, &l);
    ASSERT_TRUE(l.g3.hits > 0 && l.g3.tokens_loaded >= again.pf.tokens_g3);
    eng_worker_free(w);
}

/* Isolation: the same prompt retained in two namespaces is two sets of records (the namespace
 * is in every record's name), and a third namespace finds nothing of either on disk. */
PC_TEST(tier_namespaces_never_share_records)
{
    enum { N = 160, OUT = 4 };
    static uint32_t prompt[N], want[OUT];
    random_prompt(prompt, N);
    ASSERT_EQ(reference(prompt, N, OUT, want), 0);
    char dir[256];
    tier_dir(dir, sizeof dir, "isolation");
    eng_worker_params_t p = tier_params(dir);
    eng_worker_t *w = start(&p);
    ASSERT_TRUE(w != NULL);
    static result_t r1, r2, r3;
    PC_TEST_CALL(run_retained(w, 1, 1001, prompt, N, OUT, &r1));
    eng_worker_free(w);
    w = start(&p);
    ASSERT_TRUE(w != NULL);
    eng_wire_load_t l;
    eng_worker_load(w, &l);
    uint32_t one_ns = l.g3.blocks;
    ASSERT_TRUE(one_ns > 0);
    PC_TEST_CALL(run_retained(w, 2, 1002, prompt, N, OUT, &r2));
    ASSERT_EQ(r2.pf.tokens_g3, 0); /* ns 1001's records are not ns 1002's */
    ASSERT_EQ(r2.d.usage.tokens_reused, 0);
    eng_worker_free(w);
    w = start(&p);
    ASSERT_TRUE(w != NULL);
    eng_worker_load(w, &l);
    ASSERT_EQ(l.g3.blocks, 2 * one_ns); /* one set of records per namespace */
    eng_wire_submit_t q = greedy_req(3, 1003, prompt, N, OUT);
    PC_TEST_CALL(run_one(w, &q, &r3));
    ASSERT_EQ(r3.pf.tokens_g3, 0);
    ASSERT_EQ(r3.d.usage.tokens_reused, 0);
    ASSERT_MEM_EQ(r3.tokens, want, OUT * sizeof(uint32_t));
    eng_worker_free(w);
}

/* A gate for the tier's disk reads (eng_tier_params.before_read): every read waits there until
 * the test opens it, so "a load is pending" is a state the test holds, not a race it hopes for. */
typedef struct read_gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t entered; /* reads that reached the gate */
    bool open;
} read_gate_t;

static void disk_gate_hold(void *ud)
{
    read_gate_t *g = ud;
    pthread_mutex_lock(&g->mu);
    g->entered++;
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static uint32_t disk_gate_entered(read_gate_t *g)
{
    pthread_mutex_lock(&g->mu);
    uint32_t n = g->entered;
    pthread_mutex_unlock(&g->mu);
    return n;
}

static void disk_gate_open(read_gate_t *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* A request whose prefix is on disk waits (LOADING) while its blocks are read, and the
 * scheduler keeps decoding another request meanwhile: with every disk read held at the gate, the
 * decoding request emits tokens and the loading one emits nothing; once the reads go on, the
 * loaded request starts from G3 and both outputs equal cold runs. A worker that read the blocks
 * on its scheduler thread would stop decoding at the gate (and this test would time out). */
PC_TEST(tier_load_does_not_stall_decoding)
{
    enum { N = 192, OUT = 6, ND = 40, DOUT = 400 };
    static uint32_t prompt[N], want[OUT], dprompt[ND], dwant[DOUT];
    random_prompt(prompt, N);
    random_prompt(dprompt, ND);
    ASSERT_EQ(reference(prompt, N, OUT, want), 0);
    ASSERT_EQ(reference(dprompt, ND, DOUT, dwant), 0);
    char dir[256];
    tier_dir(dir, sizeof dir, "async");
    eng_worker_params_t p = tier_params(dir);
    eng_worker_t *w = start(&p);
    ASSERT_TRUE(w != NULL);
    static result_t first;
    PC_TEST_CALL(run_retained(w, 1, 9, prompt, N, OUT, &first));
    ASSERT_TRUE(first.done);
    eng_worker_free(w); /* the written-through records are on disk */

    static read_gate_t gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, false};
    p.engine.tier.before_read = disk_gate_hold;
    p.engine.tier.before_read_ud = &gate;
    w = start(&p);
    ASSERT_TRUE(w != NULL);
    static result_t res[2];
    memset(res, 0, sizeof res);
    res[0].id = 2;
    res[1].id = 3;
    collector_t c = {.res = res, .n_res = 2};
    /* Both submitted at once: request 2 decodes while request 3's load waits at the gate (waiting
     * for request 2's first token before submitting 3 let this model's fast decode fill the
     * pool first, so that 3 was admitted, and reached the gate, only once 2 was done). */
    eng_wire_submit_t q = greedy_req(2, 9, dprompt, ND, DOUT);
    ASSERT_EQ(submit(w, &q), 0);
    q = greedy_req(3, 9, prompt, N, OUT);
    ASSERT_EQ(submit(w, &q), 0);
    uint64_t until = pc_time_mono_ms() + 20000;
    while (disk_gate_entered(&gate) == 0 && pc_time_mono_ms() < until)
        drain_for(w, &c, 1);
    ASSERT_TRUE(disk_gate_entered(&gate) > 0); /* request 3's load is pending at the gate */
    uint32_t at_gate = res[0].n_tokens;
    ASSERT_FALSE(res[0].done);
    while (res[0].n_tokens < at_gate + 8 && !res[0].done && pc_time_mono_ms() < until)
        drain_for(w, &c, 10);
    ASSERT_TRUE(res[0].n_tokens >= at_gate + 8); /* progress while the load was pending */
    ASSERT_EQ(res[1].n_prefill, 0);              /* and nothing from the loading request */
    ASSERT_EQ(res[1].n_tokens, 0);
    ASSERT_FALSE(res[1].done || res[1].failed);
    eng_wire_load_t l;
    eng_worker_load(w, &l);
    ASSERT_TRUE(l.queued_requests >= 1); /* the loading request counts as waiting */
    disk_gate_open(&gate);
    ASSERT_TRUE(drain(w, &c, 30000));
    ASSERT_TRUE(res[0].done && res[1].done);
    ASSERT_MEM_EQ(res[0].tokens, dwant, DOUT * sizeof(uint32_t));
    ASSERT_MEM_EQ(res[1].tokens, want, OUT * sizeof(uint32_t));
    ASSERT_EQ(res[1].n_prefill, 1);
    ASSERT_FALSE(res[1].prefill_late);
    ASSERT_TRUE(res[1].pf.tokens_g3 > 0);
    ASSERT_EQ(res[1].d.usage.tokens_reused, res[1].pf.tokens_g3 + res[1].pf.tokens_recomputed);
    PC_TEST_CALL(check_idle(w));
    eng_worker_free(w);
}

PC_TEST(kv_dtype_in_info_and_fingerprint)
{
    /* The demo model (head size 32) with F16 and q8_0 KV under the same byte budget: the info
     * names the dtype, the pool holds 64/34 as many tokens, and the fingerprints differ, so KV
     * cached by one never passes for the other's. */
    const char *demo = "models/kvgw-demo.gguf";
    if (access(demo, R_OK) != 0)
        PC_SKIP("models/kvgw-demo.gguf is missing (scripts/models.sh)");
    eng_worker_info_t in[2];
    uint64_t fp[2];
    for (int i = 0; i < 2; i++) {
        eng_worker_params_t p = wparams();
        p.engine.model_path = demo;
        p.engine.kv_dtype = i == 0 ? ENG_KV_F16 : ENG_KV_Q8_0;
        p.engine.kv_max_tokens = 0;
        p.engine.kv_max_bytes = 8u << 20;
        eng_worker_t *w = start(&p);
        ASSERT_TRUE(w != NULL);
        eng_worker_info(w, &in[i]);
        fp[i] = in[i].model_fp;
        ASSERT_EQ_U64(in[i].kv_capacity_tokens, (uint64_t)in[i].total_blocks * in[i].block_tokens);
        eng_worker_free(w);
    }
    ASSERT_STR_EQ(in[0].kv_dtype, "f16");
    ASSERT_STR_EQ(in[1].kv_dtype, "q8_0");
    ASSERT_EQ_U64(in[1].kv_bytes_per_token * 64, in[0].kv_bytes_per_token * 34);
    ASSERT_TRUE(in[1].kv_capacity_tokens * 34 >= in[0].kv_capacity_tokens * 64 - 64 * 16);
    ASSERT_NE(fp[0], fp[1]);
    ASSERT_TRUE(fp[0] != 0 && fp[1] != 0);
}

PC_TEST_MAIN()
