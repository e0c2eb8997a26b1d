/*
 * test_router.c — gateway/router.c: routing decisions on crafted loads, skips, ties and
 * round-robin, unknown rates, and the estimate formula worked out by hand.
 */
#include <math.h>

#include "common.h"
#include "pc_test.h"
#include "router.h"

static gw_router_worker_t idle(void)
{
    gw_router_worker_t w = {0};
    w.up = true;
    w.free_blocks = 100;
    w.total_blocks = 100;
    w.prefill_tok_s = 1000.0;
    w.decode_ms_per_token = 10.0;
    return w;
}

static gw_router_t router(void)
{
    gw_router_t r;
    gw_router_params_t p = gw_router_params_default();
    p.default_prefill_tok_s = 500.0;
    p.default_decode_ms_per_token = 40.0;
    p.chunk_tokens = 256;
    if (gw_router_init(&r, &p) != 0)
        abort();
    return r;
}

PC_TEST(estimate_by_hand)
{
    gw_router_t r = router();
    gw_router_worker_t w = idle();
    /* 1000 tok/s, nothing queued, 3000 uncached tokens: 3 s. */
    ASSERT_EQ_U64(gw_router_estimate_us(&r, &w, 4000, 1000), 3000000);
    /* Queued 500 more: 3.5 s. */
    w.queued_prefill_tokens = 500;
    ASSERT_EQ_U64(gw_router_estimate_us(&r, &w, 4000, 1000), 3500000);
    /* Running sequences: ceil(3500 / 256) = 14 steps of 10 ms each on top. */
    w.running_seqs = 3;
    ASSERT_EQ_U64(gw_router_estimate_us(&r, &w, 4000, 1000), 3500000 + 140000);
    /* Unknown rates use the defaults: 3500 / 500 = 7 s, 14 steps x 40 ms. */
    w.prefill_tok_s = 0;
    w.decode_ms_per_token = 0;
    ASSERT_EQ_U64(gw_router_estimate_us(&r, &w, 4000, 1000), 7000000 + 560000);
    /* A NaN measurement is treated as unknown; cached above the prompt counts as all. */
    w.prefill_tok_s = NAN;
    w.running_seqs = 0;
    w.queued_prefill_tokens = 0;
    ASSERT_EQ_U64(gw_router_estimate_us(&r, &w, 4000, 9000), 0);
}

PC_TEST(cache_beats_idle_worker)
{
    gw_router_t r = router();
    gw_router_worker_t w[3] = {idle(), idle(), idle()};
    /* Worker 1 holds 7,000 of an 8,000-token prompt but has 2,000 tokens queued: 3 s vs 8 s. */
    w[1].queued_prefill_tokens = 2000;
    uint32_t cached[3] = {0, 7000, 0};
    gw_router_choice_t c;
    ASSERT_EQ(gw_router_pick(&r, w, 3, 8000, cached, &c), 0);
    ASSERT_EQ(c.worker, 1);
    ASSERT_STR_EQ(c.reason, "cache_hit");
    ASSERT_EQ_U64(c.est_us, 3000000);
    ASSERT_EQ_U64(c.est[0], 8000000);
    ASSERT_EQ_U64(c.est[2], 8000000);
    ASSERT_EQ_U64(c.cached, 7000);
    ASSERT_EQ(c.n_candidates, 3);
    /* The same worker with 6,000 queued loses to an idle one: 7 s vs 8 s... */
    w[1].queued_prefill_tokens = 6000;
    ASSERT_EQ(gw_router_pick(&r, w, 3, 8000, cached, &c), 0);
    ASSERT_EQ(c.worker, 1);
    /* ...and with 8,000 queued it is slower (9 s): an idle worker wins, by load. */
    w[1].queued_prefill_tokens = 8000;
    ASSERT_EQ(gw_router_pick(&r, w, 3, 8000, cached, &c), 0);
    ASSERT_TRUE(c.worker == 0 || c.worker == 2);
    ASSERT_STR_EQ(c.reason, "load");
    ASSERT_EQ_U64(c.est_us, 8000000);
}

PC_TEST(faster_worker_wins_cold)
{
    gw_router_t r = router();
    gw_router_worker_t w[2] = {idle(), idle()};
    w[0].queued_prefill_tokens = 100;
    w[1].queued_prefill_tokens = 50;
    gw_router_choice_t c;
    /* Cold prompt: by load (fewest queued tokens). */
    ASSERT_EQ(gw_router_pick(&r, w, 2, 1000, NULL, &c), 0);
    ASSERT_EQ(c.worker, 1);
    ASSERT_STR_EQ(c.reason, "load");
    /* Equal queues: fewer running sequences, then more free blocks. */
    w[1].queued_prefill_tokens = 100;
    w[1].running_seqs = 2;
    ASSERT_EQ(gw_router_pick(&r, w, 2, 1000, NULL, &c), 0);
    ASSERT_EQ(c.worker, 0);
    w[1].running_seqs = 0;
    w[1].free_blocks = 150;
    ASSERT_EQ(gw_router_pick(&r, w, 2, 1000, NULL, &c), 0);
    ASSERT_EQ(c.worker, 1);
}

PC_TEST(ties_round_robin)
{
    gw_router_t r = router();
    gw_router_worker_t w[3] = {idle(), idle(), idle()};
    gw_router_choice_t c;
    int seen[3] = {0, 0, 0};
    for (int i = 0; i < 6; i++) {
        ASSERT_EQ(gw_router_pick(&r, w, 3, 100, NULL, &c), 0);
        ASSERT_EQ(c.worker, i % 3);
        seen[c.worker]++;
    }
    ASSERT_EQ(seen[0], 2);
    ASSERT_EQ(seen[1], 2);
    ASSERT_EQ(seen[2], 2);
    /* Equal estimates with a cache hit on two workers also rotate. */
    uint32_t cached[3] = {50, 50, 0};
    ASSERT_EQ(gw_router_pick(&r, w, 3, 100, cached, &c), 0);
    int first = c.worker;
    ASSERT_TRUE(first == 0 || first == 1);
    ASSERT_EQ(gw_router_pick(&r, w, 3, 100, cached, &c), 0);
    ASSERT_TRUE(c.worker != first && c.worker != 2);
    ASSERT_STR_EQ(c.reason, "cache_hit");
}

PC_TEST(skips_down_and_too_big)
{
    gw_router_t r = router();
    gw_router_worker_t w[3] = {idle(), idle(), idle()};
    uint32_t cached[3] = {900, 900, 0};
    w[0].up = false;
    w[1].max_prompt_tokens = 500;
    gw_router_choice_t c;
    ASSERT_EQ(gw_router_pick(&r, w, 3, 1000, cached, &c), 0);
    ASSERT_EQ(c.worker, 2);
    ASSERT_STR_EQ(c.reason, "only_up");
    ASSERT_EQ(c.status[0], GW_ROUTER_SKIP_DOWN);
    ASSERT_EQ(c.status[1], GW_ROUTER_SKIP_TOO_BIG);
    ASSERT_EQ(c.status[2], GW_ROUTER_CANDIDATE);
    ASSERT_EQ_U64(c.est[0], UINT64_MAX);
    ASSERT_EQ_U64(c.est[1], UINT64_MAX);
    /* None fits: RANGE; none up: UPSTREAM; nothing at all: UPSTREAM. */
    w[2].max_prompt_tokens = 999;
    ASSERT_EQ(gw_router_pick(&r, w, 3, 1000, cached, &c), PC_ERR_RANGE);
    ASSERT_EQ(c.worker, -1);
    for (int i = 0; i < 3; i++)
        w[i].up = false;
    ASSERT_EQ(gw_router_pick(&r, w, 3, 10, cached, &c), PC_ERR_UPSTREAM);
    ASSERT_EQ(gw_router_pick(&r, w, 0, 10, NULL, &c), PC_ERR_UPSTREAM);
    ASSERT_EQ(gw_router_pick(&r, NULL, 1, 10, NULL, &c), PC_ERR_INVAL);
    ASSERT_EQ(gw_router_pick(&r, w, 65, 10, NULL, &c), PC_ERR_INVAL);
    ASSERT_EQ(gw_router_pick(&r, w, 3, 10, NULL, NULL), PC_ERR_INVAL);
}

/* Issue 19 item 9: a prompt longer than the model accepts is the client's error (400), decided
 * before routing from every worker's limit, up or down, capped by the model's context. Routing
 * alone cannot tell it: with the one worker that could take it down, pick says RANGE too. */
PC_TEST(max_prompt_is_the_largest_worker_limit)
{
    gw_router_worker_t w[3] = {idle(), idle(), idle()};
    w[0].max_prompt_tokens = 500;
    w[1].max_prompt_tokens = 2000;
    w[2].max_prompt_tokens = 1000;
    ASSERT_EQ(gw_router_max_prompt(w, 3, 0), 2000u);
    ASSERT_EQ(gw_router_max_prompt(w, 3, 4096), 2000u);
    ASSERT_EQ(gw_router_max_prompt(w, 3, 1500), 1500u); /* context_tokens caps it */
    w[1].up = false; /* a down worker still counts: it takes the prompt when it is back */
    ASSERT_EQ(gw_router_max_prompt(w, 3, 0), 2000u);
    gw_router_t r = router();
    gw_router_choice_t c;
    ASSERT_EQ(gw_router_pick(&r, w, 3, 1500, NULL, &c), PC_ERR_RANGE); /* not the client's fault */
    /* A worker that has not reported (0) counts as the model's context. */
    w[1].max_prompt_tokens = 0;
    ASSERT_EQ(gw_router_max_prompt(w, 3, 4096), 4096u);
    ASSERT_EQ(gw_router_max_prompt(w, 3, 0), 0u); /* no limit known at all */
    ASSERT_EQ(gw_router_max_prompt(w, 0, 0), 0u);
    ASSERT_EQ(gw_router_max_prompt(NULL, 0, 8192), 8192u);
    ASSERT_EQ(gw_router_max_prompt(w, 1, 0), 500u);
}

PC_TEST(interference_prefers_quiet_worker)
{
    gw_router_t r = router();
    gw_router_worker_t w[2] = {idle(), idle()};
    /* Both hold the same 1,000 cached tokens of a 5,000-token prompt; worker 0 decodes 40
     * sequences at 30 ms a step: 4 s + 16 steps x 30 ms vs. 4 s flat. */
    w[0].running_seqs = 40;
    w[0].decode_ms_per_token = 30.0;
    uint32_t cached[2] = {1000, 1000};
    gw_router_choice_t c;
    ASSERT_EQ(gw_router_pick(&r, w, 2, 5000, cached, &c), 0);
    ASSERT_EQ(c.worker, 1);
    ASSERT_EQ_U64(c.est[0], 4000000 + 16 * 30000);
    ASSERT_EQ_U64(c.est[1], 4000000);
}

PC_TEST(params_validated)
{
    gw_router_t r;
    gw_router_params_t p = gw_router_params_default();
    ASSERT_EQ(gw_router_init(&r, &p), 0);
    ASSERT_EQ(gw_router_init(&r, NULL), 0);
    p.default_prefill_tok_s = 0;
    ASSERT_EQ(gw_router_init(&r, &p), PC_ERR_INVAL);
    p = gw_router_params_default();
    p.default_decode_ms_per_token = NAN;
    ASSERT_EQ(gw_router_init(&r, &p), PC_ERR_INVAL);
    p = gw_router_params_default();
    p.chunk_tokens = 0;
    ASSERT_EQ(gw_router_init(&r, &p), PC_ERR_INVAL);
    p = gw_router_params_default();
    p.default_load_bytes_per_s[1] = 0;
    ASSERT_EQ(gw_router_init(&r, &p), PC_ERR_INVAL);
    p = gw_router_params_default();
    p.default_load_bytes_per_s[0] = INFINITY;
    ASSERT_EQ(gw_router_init(&r, &p), PC_ERR_INVAL);
    ASSERT_EQ(gw_router_init(NULL, NULL), PC_ERR_INVAL);
}

/* A worker with a 100 kB KV per token, 1 GB/s from its disk (100 us a token) and 10 GB/s from
 * host memory (10 us), prefilling 1000 tokens/s (1000 us a token). */
static gw_router_worker_t tiered(void)
{
    gw_router_worker_t w = idle();
    w.kv_bytes_per_token = 100e3;
    w.load_bytes_per_s[0] = 10e9;
    w.load_bytes_per_s[1] = 1e9;
    return w;
}

PC_TEST(estimate_by_tier_by_hand)
{
    gw_router_t r = router();
    gw_router_worker_t w = tiered();
    /* 4000-token prompt; it holds 3000: 500 in its pool, 500 in G2, 2000 in G3. 1000 tokens
     * prefilled (1 s) + 500 x 10 us + 2000 x 100 us. */
    gw_router_held_t h = {3000, 500, 2000};
    ASSERT_EQ_U64(gw_router_estimate_held_us(&r, &w, 4000, &h), 1000000 + 5000 + 200000);
    /* All of it in the pool: only the prefill of the rest, as gw_router_estimate_us says. */
    gw_router_held_t g1 = {3000, 0, 0};
    ASSERT_EQ_U64(gw_router_estimate_held_us(&r, &w, 4000, &g1),
                  gw_router_estimate_us(&r, &w, 4000, 3000));
    ASSERT_EQ_U64(gw_router_estimate_held_us(&r, &w, 4000, &g1), 1000000);
    /* A disk slower than the prefill (10 MB/s: 10 ms a token) costs the prefill, which the
     * worker's cost model does instead: 1 s + 5 ms + 2000 x 1 ms. */
    w.load_bytes_per_s[1] = 10e6;
    ASSERT_EQ_U64(gw_router_estimate_held_us(&r, &w, 4000, &h), 1000000 + 5000 + 2000000);
    /* Unmeasured bandwidths take the params' defaults (10 GB/s, 1 GB/s). */
    w.load_bytes_per_s[0] = w.load_bytes_per_s[1] = 0;
    ASSERT_EQ_U64(gw_router_estimate_held_us(&r, &w, 4000, &h), 1000000 + 5000 + 200000);
    /* An unknown KV size prices the lower tiers as prefills: 3.5 s. */
    w.kv_bytes_per_token = 0;
    ASSERT_EQ_U64(gw_router_estimate_held_us(&r, &w, 4000, &h), 3500000);
    w.kv_bytes_per_token = NAN;
    ASSERT_EQ_U64(gw_router_estimate_held_us(&r, &w, 4000, &h), 3500000);
    /* Counts beyond the prompt are cut, G3 first: held 9000 -> 4000, g3 3000, g2 1000. */
    w = tiered();
    gw_router_held_t big = {9000, 7000, 3000};
    ASSERT_EQ_U64(gw_router_estimate_held_us(&r, &w, 4000, &big), 1000 * 10 + 3000 * 100);
    /* Queued work and interference are unchanged by tiers: 300 queued, 2 running, ceil(1300 /
     * 256) = 6 steps x 10 ms. */
    w.queued_prefill_tokens = 300;
    w.running_seqs = 2;
    ASSERT_EQ_U64(gw_router_estimate_held_us(&r, &w, 4000, &h),
                  1300000 + 5000 + 200000 + 6 * 10000);
}

PC_TEST(disk_hit_routing)
{
    gw_router_t r = router();
    gw_router_worker_t w[3] = {tiered(), tiered(), tiered()};
    gw_router_choice_t c;
    /* Worker 2 holds a 4096-token prompt on its disk after a restart; the others hold nothing:
     * 4096 x 100 us = 0.41 s beats a 4.1 s prefill. */
    gw_router_held_t held[3] = {{0, 0, 0}, {0, 0, 0}, {4096, 0, 4096}};
    ASSERT_EQ(gw_router_pick_held(&r, w, 3, 4096, held, &c), 0);
    ASSERT_EQ(c.worker, 2);
    ASSERT_STR_EQ(c.reason, "cache_hit");
    ASSERT_EQ_U64(c.est_us, 409600);
    ASSERT_EQ(c.cached, 4096);
    ASSERT_EQ(c.cached_g3, 4096);
    ASSERT_EQ(c.cached_g2, 0);
    ASSERT_EQ_U64(c.est[0], 4096000);
    /* Worker 0 holds it in its pool: free, it wins over the disk. */
    held[0] = (gw_router_held_t){4096, 0, 0};
    ASSERT_EQ(gw_router_pick_held(&r, w, 3, 4096, held, &c), 0);
    ASSERT_EQ(c.worker, 0);
    ASSERT_EQ_U64(c.est_us, 0);
    ASSERT_EQ(c.cached_g3, 0);
    /* ...until 500 tokens are queued there (0.5 s): the disk (0.41 s) wins. */
    w[0].queued_prefill_tokens = 500;
    ASSERT_EQ(gw_router_pick_held(&r, w, 3, 4096, held, &c), 0);
    ASSERT_EQ(c.worker, 2);
    /* With tiers ignored (gw_router_pick), the disk copy would count as free: the pool wins
     * only by load, and worker 2 looked as fast as a pool hit. */
    uint32_t cached[3] = {4096, 0, 4096};
    ASSERT_EQ(gw_router_pick(&r, w, 3, 4096, cached, &c), 0);
    ASSERT_EQ(c.worker, 2);
    ASSERT_EQ_U64(c.est_us, 0);
    /* A G2 copy (10 us a token: 41 ms) beats the G3 one. */
    w[0].queued_prefill_tokens = 0;
    held[0] = (gw_router_held_t){0, 0, 0};
    held[1] = (gw_router_held_t){4096, 4096, 0};
    ASSERT_EQ(gw_router_pick_held(&r, w, 3, 4096, held, &c), 0);
    ASSERT_EQ(c.worker, 1);
    ASSERT_EQ_U64(c.est_us, 40960);
    ASSERT_EQ(c.cached_g2, 4096);
    /* NULL held: everyone cold, by load. */
    ASSERT_EQ(gw_router_pick_held(&r, w, 3, 4096, NULL, &c), 0);
    ASSERT_STR_EQ(c.reason, "load");
    ASSERT_EQ(c.cached, 0);
}

PC_TEST_MAIN()
