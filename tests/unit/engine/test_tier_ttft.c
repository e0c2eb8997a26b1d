/*
 * test_tier_ttft.c — a small benchmark (label bench): the worker's time to first token of a
 * 2048-token prompt on the demo model (models/kvgw-demo.gguf) cold, from the pool (G1), and from
 * the disk tier (G3) after a restart of the worker on the same directory. It prints the figures
 * (wall time from submit to the first TOKEN event, and the worker's own queue + prefill time
 * from DONE) and checks only what must hold whatever the machine: the restarted worker's prompt
 * came from G3 and its greedy token equals the cold run's. Skipped without the generated models.
 * The full tier benchmark is `kvgw bench tiers`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pc_test.h"
#include "pc_time.h"
#include "sampling.h"
#include "wire.h"
#include "worker.h"

#define MODEL "models/kvgw-demo.gguf"
#define N_PROMPT 2048
#define N_OUT 4

typedef struct ttft {
    double first_ms;        /* submit to the first TOKEN */
    double worker_ms;       /* DONE's queue_us + prefill_us */
    uint32_t tokens[N_OUT]; /* greedy output */
    uint32_t n_tokens;
    eng_wire_prefill_t pf; /* where the prompt came from */
    bool done;
} ttft_t;

static void run(eng_worker_t *w, uint64_t id, const uint32_t *prompt, bool retain, ttft_t *out)
{
    memset(out, 0, sizeof *out);
    eng_wire_retain_t keep = {.n_tokens = N_PROMPT, .ttl_ms = 3600000};
    eng_wire_submit_t q = {.request_id = id,
                           .ns = 5,
                           .max_tokens = N_OUT,
                           .flags = ENG_WIRE_SUBMIT_IGNORE_EOG,
                           .tokens = prompt,
                           .n_tokens = N_PROMPT,
                           .retain = retain ? &keep : NULL,
                           .n_retain = retain ? 1 : 0};
    q.sampling = eng_sampling_params_default();
    q.sampling.temperature = 0;
    char err[256] = "";
    uint64_t t0 = pc_time_mono_ns();
    int rc = eng_worker_submit(w, &q, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "submit: %s\n", err);
    ASSERT_EQ(rc, 0);
    uint64_t until = pc_time_mono_ms() + 120000;
    eng_worker_event_t ev[32];
    while (!out->done && pc_time_mono_ms() < until) {
        size_t n = eng_worker_poll_wait(w, ev, 32, 100);
        for (size_t i = 0; i < n; i++) {
            if (ev[i].type == ENG_WIRE_PREFILL && ev[i].u.prefill.request_id == id) {
                out->pf = ev[i].u.prefill;
            } else if (ev[i].type == ENG_WIRE_TOKEN && ev[i].u.token.request_id == id) {
                if (out->n_tokens == 0)
                    out->first_ms = (double)(pc_time_mono_ns() - t0) / 1e6;
                if (out->n_tokens < N_OUT)
                    out->tokens[out->n_tokens++] = ev[i].u.token.token_id;
            } else if (ev[i].type == ENG_WIRE_DONE && ev[i].u.done.request_id == id) {
                out->done = true;
                out->worker_ms =
                    (double)(ev[i].u.done.timing.queue_us + ev[i].u.done.timing.prefill_us) / 1e3;
            } else if (ev[i].type == ENG_WIRE_ERROR && ev[i].u.error.request_id == id) {
                PC_TEST__FAIL("request failed: %.*s", (int)ev[i].u.error.message.len,
                              ev[i].u.error.message.base);
            }
        }
    }
    ASSERT_TRUE(out->done);
    ASSERT_EQ(out->n_tokens, N_OUT);
}

static void print(const char *what, const ttft_t *t)
{
    printf("ttft %-26s %8.1f ms (worker %8.1f ms)  g1 %4u g3 %4u recomputed %4u\n", what,
           t->first_ms, t->worker_ms, t->pf.tokens_g1, t->pf.tokens_g3, t->pf.tokens_recomputed);
}

PC_TEST(ttft_2048_cold_g1_g3)
{
    if (access(MODEL, R_OK) != 0)
        PC_SKIP("the models/ directory has no generated models");
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/kvgw-tier-ttft-%d/w0", (int)getpid());
    eng_worker_params_t p = eng_worker_params_default();
    p.engine.model_path = MODEL;
    p.engine.kv_max_tokens = 8192;
    p.engine.tier.dir = dir;
    p.engine.tier.max_bytes = 1ull << 30;
    p.engine.tier.write_through = true;
    p.load_interval_ms = 0;
    static uint32_t prompt[N_PROMPT];
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (uint32_t i = 0; i < N_PROMPT; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        prompt[i] = 100 + (uint32_t)(x % 2000);
    }
    char err[256];
    eng_worker_t *w = NULL;
    ASSERT_EQ(eng_worker_init(&p, &w, err, sizeof err), 0);
    eng_worker_info_t info;
    eng_worker_info(w, &info);
    static ttft_t cold, g1, g3;
    PC_TEST_CALL(run(w, 1, prompt, true, &cold)); /* retained: written through to disk */
    PC_TEST_CALL(run(w, 2, prompt, false, &g1));
    eng_worker_free(w); /* waits for the writes */
    ASSERT_EQ(eng_worker_init(&p, &w, err, sizeof err), 0);
    PC_TEST_CALL(run(w, 3, prompt, false, &g3));
    eng_wire_load_t l;
    eng_worker_load(w, &l);
    eng_worker_free(w);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf /tmp/kvgw-tier-ttft-%d", (int)getpid());
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);

    printf("model %s, %u-token prompt, %s backend, KV block %u tokens\n", MODEL, N_PROMPT,
           info.backend, info.block_tokens);
    print("cold (prefill)", &cold);
    print("G1 (pool, same worker)", &g1);
    print("G3 (disk, after restart)", &g3);
    printf("G3 loads: %llu blocks, %.1f MiB in %.1f ms (%.0f MiB/s)\n",
           (unsigned long long)l.g3.loads, (double)l.g3.load_bytes / (1 << 20),
           (double)l.g3.load_us / 1e3,
           l.g3.load_us > 0 ? (double)l.g3.load_bytes / (1 << 20) / ((double)l.g3.load_us / 1e6)
                            : 0.0);
    ASSERT_TRUE(g3.pf.tokens_g3 > 0);
    ASSERT_EQ(g3.pf.tokens_g1, 0);
    ASSERT_MEM_EQ(g3.tokens, cold.tokens, sizeof cold.tokens);
    ASSERT_MEM_EQ(g1.tokens, cold.tokens, sizeof cold.tokens);
}

PC_TEST_MAIN()
