/*
 * test_cindex.c — gateway/cindex.c: hand-worked cases (hits, TTL refresh, lookback probes,
 * physical owners, eviction, drop reports, exact storage integrals), a differential test
 * against a brute-force model (a list of entries and per-worker sets of held positions) through
 * random operation sequences with a fake clock, and the failing-allocator test.
 *
 * The file includes cindex.c itself, so that the failing-allocator test can dump the whole
 * state (the radix tree, the heap, the namespace table) before and after a failed call.
 */
#include "cindex.c"

#include <stdio.h>
#include <stdlib.h>

#include "pc_failalloc.h"
#include "pc_test.h"

/* ---- helpers ---------------------------------------------------------------------------- */

#define MAX_DROPS 4096
#define MAX_LEN 64

typedef struct drop_rec {
    uint64_t ns;
    uint32_t tok[MAX_LEN];
    size_t n;
    uint64_t owners;
    uint64_t expiry;
    int reason;
} drop_rec_t;

static drop_rec_t drops[MAX_DROPS];
static size_t n_drops;

static void on_drop_rec(const gw_cindex_drop_t *ev, void *ud)
{
    (void)ud;
    if (n_drops >= MAX_DROPS || ev->n_tokens > MAX_LEN)
        abort();
    drop_rec_t *d = &drops[n_drops++];
    memset(d, 0, sizeof *d);
    d->ns = ev->ns;
    memcpy(d->tok, ev->tokens, ev->n_tokens * sizeof *ev->tokens);
    d->n = ev->n_tokens;
    d->owners = ev->owners;
    d->expiry = ev->expiry_ms;
    d->reason = ev->reason;
}

static gw_cindex_params_t test_params(void)
{
    gw_cindex_params_t p = gw_cindex_params_default();
    p.n_workers = 4;
    p.ttl_ms[GW_CINDEX_TTL_5M] = 1000;
    p.ttl_ms[GW_CINDEX_TTL_1H] = 5000;
    p.on_drop = on_drop_rec;
    return p;
}

static gw_cindex_t *mk(const gw_cindex_params_t *p)
{
    gw_cindex_t *ix = NULL;
    if (gw_cindex_init(p, &ix) != 0)
        abort();
    n_drops = 0;
    return ix;
}

/* tokens base, base+1, ... (n of them) */
static const uint32_t *seq(uint32_t base, size_t n)
{
    static uint32_t buf[8][MAX_LEN];
    static int k;
    uint32_t *b = buf[k++ & 7];
    for (size_t i = 0; i < n; i++)
        b[i] = base + (uint32_t)i;
    return b;
}

#define CHECK(ix)                                                                                  \
    do {                                                                                           \
        char err_[256];                                                                            \
        if (gw_cindex_check((ix), err_, sizeof err_) != 0)                                         \
            PC_TEST__FAIL("check: %s", err_);                                                      \
    } while (0)

/* ---- hand-worked cases ------------------------------------------------------------------ */

PC_TEST(header_example)
{
    gw_cindex_params_t p = test_params();
    gw_cindex_t *ix = mk(&p);
    const uint32_t a[7] = {1, 2, 3, 4, 5, 6, 7};
    ASSERT_EQ(gw_cindex_insert(ix, 9, a, 4, GW_CINDEX_TTL_5M, 0, 0), 0);
    ASSERT_EQ(gw_cindex_insert(ix, 9, a, 6, GW_CINDEX_TTL_5M, 0, 0), 0);
    uint32_t held = 0;
    ASSERT_EQ(gw_cindex_owner_add(ix, 9, a, 7, 2, &held), 0);
    ASSERT_EQ(held, 6);
    const uint32_t q[6] = {1, 2, 3, 4, 5, 9};
    gw_cindex_match_t m;
    ASSERT_EQ(gw_cindex_match(ix, 9, q, 6, 10, &m), 0);
    ASSERT_EQ(m.n_matched, 5);
    ASSERT_EQ(m.n_hit, 5);
    ASSERT_EQ(m.n_entries, 1);
    ASSERT_EQ(m.entry_len[0], 4);
    ASSERT_EQ(m.held[2], 5);
    ASSERT_EQ(m.held[0], 0);
    ASSERT_EQ(m.held[1], 0);
    ASSERT_EQ(m.held[3], 0);
    ASSERT_EQ_U64(m.holders, 1u << 2);
    /* Another namespace sees nothing. */
    ASSERT_EQ(gw_cindex_match(ix, 8, q, 6, 10, &m), 0);
    ASSERT_EQ(m.n_matched, 0);
    ASSERT_EQ(m.n_hit, 0);
    ASSERT_EQ_U64(m.holders, 0);
    CHECK(ix);
    gw_cindex_free(ix);
}

PC_TEST(ttl_write_read_refresh_and_expiry)
{
    gw_cindex_params_t p = test_params();
    gw_cindex_t *ix = mk(&p);
    const uint32_t *a = seq(100, 20);
    /* Request started at 100, prefill done at 300: expiry 1100. */
    ASSERT_EQ(gw_cindex_insert(ix, 1, a, 10, GW_CINDEX_TTL_5M, 100, 300), 0);
    ASSERT_TRUE(gw_cindex_entry_live(ix, 1, a, 10, 1099));
    ASSERT_FALSE(gw_cindex_entry_live(ix, 1, a, 10, 1100));
    ASSERT_FALSE(gw_cindex_entry_live(ix, 1, a, 9, 500));
    ASSERT_FALSE(gw_cindex_entry_live(ix, 2, a, 10, 500));
    /* A read at 600 refreshes to 1600; a read at 400 later cannot shorten it. */
    size_t k = 0;
    ASSERT_EQ(gw_cindex_read(ix, 1, a, 15, 600, &k), 0);
    ASSERT_EQ(k, 1);
    ASSERT_TRUE(gw_cindex_entry_live(ix, 1, a, 10, 1599));
    ASSERT_FALSE(gw_cindex_entry_live(ix, 1, a, 10, 1600));
    /* A read shorter than the entry does not refresh it. */
    ASSERT_EQ(gw_cindex_read(ix, 1, a, 9, 700, &k), 0);
    ASSERT_EQ(k, 0);
    /* Writing again with a 1h TTL extends it and upgrades the class: later reads refresh by
     * 5,000 ms. */
    ASSERT_EQ(gw_cindex_insert(ix, 1, a, 10, GW_CINDEX_TTL_1H, 800, 800), 1);
    ASSERT_TRUE(gw_cindex_entry_live(ix, 1, a, 10, 5799));
    ASSERT_FALSE(gw_cindex_entry_live(ix, 1, a, 10, 5800));
    ASSERT_EQ(gw_cindex_read(ix, 1, a, 10, 1000, &k), 0);
    ASSERT_TRUE(gw_cindex_entry_live(ix, 1, a, 10, 5999));
    /* A write whose expiry already passed writes nothing. */
    ASSERT_EQ(gw_cindex_insert(ix, 1, a, 12, GW_CINDEX_TTL_5M, 0, 1000), 2);
    ASSERT_FALSE(gw_cindex_entry_live(ix, 1, a, 12, 1000));
    CHECK(ix);
    /* Nothing expires before 6000; at 6000 the entry goes, reported once. */
    ASSERT_EQ(gw_cindex_expire(ix, 5999), 0);
    ASSERT_EQ(n_drops, 0);
    ASSERT_EQ(gw_cindex_expire(ix, 6000), 1);
    ASSERT_EQ(n_drops, 1);
    ASSERT_EQ(drops[0].reason, GW_CINDEX_DROP_EXPIRE);
    ASSERT_EQ(drops[0].n, 10);
    ASSERT_EQ_U64(drops[0].expiry, 6000);
    ASSERT_MEM_EQ(drops[0].tok, a, 10 * sizeof *a);
    gw_cindex_stats_t st;
    gw_cindex_stats(ix, &st);
    ASSERT_EQ_U64(st.n_entries, 0);
    ASSERT_EQ_U64(st.n_tokens, 0);
    ASSERT_EQ_U64(st.entries_dropped[GW_CINDEX_DROP_EXPIRE], 1);
    ASSERT_EQ_U64(st.tokens_freed[GW_CINDEX_DROP_EXPIRE], 10);
    CHECK(ix);
    gw_cindex_free(ix);
}

PC_TEST(token_accounting_and_lookback_probes)
{
    gw_cindex_params_t p = test_params();
    gw_cindex_t *ix = mk(&p);
    const uint32_t *a = seq(1, 40);
    /* Breakpoints at 10, 20, 30 of one prompt. */
    for (size_t n = 10; n <= 30; n += 10)
        ASSERT_EQ(gw_cindex_insert(ix, 5, a, n, GW_CINDEX_TTL_5M, 0, 0), 0);
    gw_cindex_match_t m;
    /* The same prompt up to 25 then different: covered up to 25 (inside the entry of 30). */
    uint32_t q[40];
    memcpy(q, a, sizeof q);
    q[25] = 999;
    ASSERT_EQ(gw_cindex_match(ix, 5, q, 40, 1, &m), 0);
    ASSERT_EQ(m.n_hit, 25);
    ASSERT_EQ(m.n_matched, 25);
    ASSERT_EQ(m.n_entries, 2);
    ASSERT_EQ(m.entry_len[0], 10);
    ASSERT_EQ(m.entry_len[1], 20);
    /* A prompt shorter than the entries: covered up to its end. */
    ASSERT_EQ(gw_cindex_match(ix, 5, a, 15, 1, &m), 0);
    ASSERT_EQ(m.n_hit, 15);
    ASSERT_EQ(m.n_entries, 1);
    /* Anthropic-style probes: only exact boundaries are entries. */
    ASSERT_TRUE(gw_cindex_entry_live(ix, 5, a, 20, 1));
    ASSERT_FALSE(gw_cindex_entry_live(ix, 5, a, 21, 1));
    ASSERT_FALSE(gw_cindex_entry_live(ix, 5, q, 30, 1));
    /* The entry at 20 expires while 30 is refreshed: 20 stays stored, no longer an entry. */
    ASSERT_EQ(gw_cindex_read(ix, 5, a, 30, 900, NULL), 0);
    ASSERT_EQ(gw_cindex_insert(ix, 5, a, 35, GW_CINDEX_TTL_5M, 950, 950), 0);
    ASSERT_EQ(gw_cindex_match(ix, 5, a, 40, 1900, &m), 0);
    ASSERT_EQ(m.n_hit, 35);
    ASSERT_EQ(m.n_entries, 1); /* only 35: 10, 20, 30 expired at 1900 */
    ASSERT_EQ(m.entry_len[0], 35);
    ASSERT_FALSE(gw_cindex_entry_live(ix, 5, a, 20, 1900));
    ASSERT_EQ(n_drops, 3);
    CHECK(ix);
    gw_cindex_free(ix);
}

PC_TEST(owners_evicted_and_worker_down)
{
    gw_cindex_params_t p = test_params();
    gw_cindex_t *ix = mk(&p);
    const uint32_t *a = seq(1, 40);
    for (size_t n = 10; n <= 30; n += 10)
        ASSERT_EQ(gw_cindex_insert(ix, 5, a, n, GW_CINDEX_TTL_5M, 0, 0), 0);
    uint32_t held;
    /* Worker 1 ran the prompt up to 34: holds up to the entry at 30. Worker 3 up to 25: 20. */
    ASSERT_EQ(gw_cindex_owner_add(ix, 5, a, 34, 1, &held), 0);
    ASSERT_EQ(held, 30);
    ASSERT_EQ(gw_cindex_owner_add(ix, 5, a, 25, 3, &held), 0);
    ASSERT_EQ(held, 20);
    ASSERT_EQ(gw_cindex_owner_add(ix, 5, a, 9, 2, &held), 0);
    ASSERT_EQ(held, 0);
    ASSERT_EQ(gw_cindex_owner_add(ix, 5, a, 9, 4, &held), PC_ERR_RANGE);
    ASSERT_EQ_U64(gw_cindex_worker_tokens(ix, 1), 30);
    ASSERT_EQ_U64(gw_cindex_worker_tokens(ix, 3), 20);
    gw_cindex_match_t m;
    ASSERT_EQ(gw_cindex_match(ix, 5, a, 40, 1, &m), 0);
    ASSERT_EQ(m.held[1], 30);
    ASSERT_EQ(m.held[3], 20);
    ASSERT_EQ(m.held[2], 0);
    ASSERT_EQ_U64(m.holders, (1u << 1) | (1u << 3));
    /* Worker 1 evicts positions [15, 34): it keeps the entry at 10 only. */
    ASSERT_EQ(gw_cindex_owner_evicted(ix, 1, 5, a, 15, 34), 0);
    ASSERT_EQ(gw_cindex_match(ix, 5, a, 40, 1, &m), 0);
    ASSERT_EQ(m.held[1], 10);
    ASSERT_EQ(m.held[3], 20);
    /* Evicting [22, 25) of worker 3 crosses no entry boundary: nothing it holds changes. */
    ASSERT_EQ(gw_cindex_owner_evicted(ix, 3, 5, a, 22, 25), 0);
    ASSERT_EQ(gw_cindex_match(ix, 5, a, 40, 1, &m), 0);
    ASSERT_EQ(m.held[3], 20);
    ASSERT_EQ(gw_cindex_owner_evicted(ix, 3, 5, a, 26, 25), PC_ERR_INVAL);
    /* Expiry reports who held the whole entry. */
    ASSERT_EQ(gw_cindex_owner_add(ix, 5, a, 40, 0, &held), 0);
    ASSERT_EQ(gw_cindex_expire(ix, 1000), 3);
    ASSERT_EQ(n_drops, 3);
    for (size_t i = 0; i < n_drops; i++) {
        uint64_t want = drops[i].n == 10 ? 0xBu : drops[i].n == 20 ? 0x9u : 0x1u;
        ASSERT_EQ_U64(drops[i].owners, want);
    }
    /* Worker down: entries stay logically live, physically lost. */
    ASSERT_EQ(gw_cindex_insert(ix, 5, a, 10, GW_CINDEX_TTL_5M, 1000, 1000), 0);
    ASSERT_EQ(gw_cindex_insert(ix, 6, a, 10, GW_CINDEX_TTL_5M, 1000, 1000), 0);
    ASSERT_EQ(gw_cindex_owner_add(ix, 5, a, 10, 2, &held), 0);
    ASSERT_EQ(gw_cindex_owner_add(ix, 6, a, 10, 2, &held), 0);
    ASSERT_EQ(gw_cindex_owner_add(ix, 6, a, 10, 1, &held), 0);
    ASSERT_EQ(gw_cindex_worker_down(ix, 2), 0);
    ASSERT_EQ(gw_cindex_worker_down(ix, 7), PC_ERR_RANGE);
    ASSERT_EQ(gw_cindex_match(ix, 6, a, 10, 1001, &m), 0);
    ASSERT_EQ(m.n_hit, 10);
    ASSERT_EQ(m.held[2], 0);
    ASSERT_EQ(m.held[1], 10);
    ASSERT_EQ_U64(gw_cindex_worker_tokens(ix, 2), 0);
    CHECK(ix);
    gw_cindex_free(ix);
}

/* Tiers: a worker's nodes move down to G2/G3 (EVICTED tier 2/3), a SNAPSHOT's disk entry adds
 * owners in G3 without demoting what is in the pool, a request that ran the prompt brings it
 * all back to G1, and the match says how much of what each worker holds is in which tier. */
PC_TEST(owner_tiers)
{
    gw_cindex_params_t p = test_params();
    gw_cindex_t *ix = mk(&p);
    const uint32_t *a = seq(1, 40);
    for (size_t n = 10; n <= 30; n += 10)
        ASSERT_EQ(gw_cindex_insert(ix, 5, a, n, GW_CINDEX_TTL_1H, 0, 0), 0);
    uint32_t held;
    gw_cindex_match_t m;
    ASSERT_EQ(gw_cindex_owner_add(ix, 5, a, 34, 1, &held), 0);
    ASSERT_EQ(held, 30);
    /* Worker 1's pool drops [12, 34) to its disk: 20 tokens (10..30) are now in G3. */
    ASSERT_EQ(gw_cindex_owner_demoted(ix, 1, 5, a, 12, 34, GW_CINDEX_TIER_G3), 0);
    ASSERT_EQ(gw_cindex_match(ix, 5, a, 40, 1, &m), 0);
    ASSERT_EQ(m.held[1], 30);
    ASSERT_EQ(m.held_g2[1], 0);
    ASSERT_EQ(m.held_g3[1], 20);
    ASSERT_EQ_U64(gw_cindex_worker_tier_tokens(ix, 1, GW_CINDEX_TIER_G1), 10);
    ASSERT_EQ_U64(gw_cindex_worker_tier_tokens(ix, 1, GW_CINDEX_TIER_G3), 20);
    ASSERT_EQ_U64(gw_cindex_worker_tokens(ix, 1), 30);
    /* A demotion to G2 after G3 does not move it back up; the G1 part may go to G2. */
    ASSERT_EQ(gw_cindex_owner_demoted(ix, 1, 5, a, 0, 30, GW_CINDEX_TIER_G2), 0);
    ASSERT_EQ(gw_cindex_match(ix, 5, a, 40, 1, &m), 0);
    ASSERT_EQ(m.held[1], 30);
    ASSERT_EQ(m.held_g2[1], 10);
    ASSERT_EQ(m.held_g3[1], 20);
    /* A query that stops inside a G3 node counts only the matched part. */
    ASSERT_EQ(gw_cindex_match(ix, 5, a, 25, 1, &m), 0);
    ASSERT_EQ(m.held[1], 25);
    ASSERT_EQ(m.held_g3[1], 15);
    /* Demoting what w does not own adds nothing. */
    ASSERT_EQ(gw_cindex_owner_demoted(ix, 2, 5, a, 0, 30, GW_CINDEX_TIER_G3), 0);
    ASSERT_EQ_U64(gw_cindex_worker_tokens(ix, 2), 0);
    /* A restarted worker 2 lists [0, 20) pinned in G1 and [0, 30) on disk, in either order:
     * the pool's part stays G1. */
    ASSERT_EQ(gw_cindex_owner_add_tier(ix, 5, a, 30, 2, GW_CINDEX_TIER_G3, 0, &held), 0);
    ASSERT_EQ(held, 30);
    ASSERT_EQ(gw_cindex_owner_add_tier(ix, 5, a, 20, 2, GW_CINDEX_TIER_G1, 0, &held), 0);
    ASSERT_EQ(gw_cindex_owner_add_tier(ix, 5, a, 30, 2, GW_CINDEX_TIER_G3, 0, &held), 0);
    ASSERT_EQ(gw_cindex_match(ix, 5, a, 40, 1, &m), 0);
    ASSERT_EQ(m.held[2], 30);
    ASSERT_EQ(m.held_g3[2], 10);
    ASSERT_EQ(m.held_g2[2], 0);
    /* Worker 1 runs the prompt again: all of it back in its pool. */
    ASSERT_EQ(gw_cindex_owner_add(ix, 5, a, 40, 1, &held), 0);
    ASSERT_EQ(gw_cindex_match(ix, 5, a, 40, 1, &m), 0);
    ASSERT_EQ(m.held[1], 30);
    ASSERT_EQ(m.held_g2[1] + m.held_g3[1], 0);
    /* An eviction (tier 0) from G3 clears the worker there, tier marks with it. */
    ASSERT_EQ(gw_cindex_owner_evicted(ix, 2, 5, a, 20, 30), 0);
    ASSERT_EQ(gw_cindex_match(ix, 5, a, 40, 1, &m), 0);
    ASSERT_EQ(m.held[2], 20);
    ASSERT_EQ(m.held_g3[2], 0);
    ASSERT_EQ_U64(gw_cindex_worker_tier_tokens(ix, 2, GW_CINDEX_TIER_G3), 0);
    /* A worker down loses every tier; entries stay. */
    ASSERT_EQ(gw_cindex_owner_demoted(ix, 1, 5, a, 0, 30, GW_CINDEX_TIER_G3), 0);
    ASSERT_EQ(gw_cindex_worker_down(ix, 1), 0);
    ASSERT_EQ_U64(gw_cindex_worker_tier_tokens(ix, 1, GW_CINDEX_TIER_G3), 0);
    ASSERT_EQ(gw_cindex_match(ix, 5, a, 40, 1, &m), 0);
    ASSERT_EQ(m.held[1], 0);
    ASSERT_EQ(m.held_g3[1], 0);
    ASSERT_EQ(m.n_hit, 30);
    /* An insert that splits a node copies its tier marks to both halves. */
    ASSERT_EQ(gw_cindex_owner_add_tier(ix, 5, a, 30, 3, GW_CINDEX_TIER_G2, 0, &held), 0);
    ASSERT_EQ(gw_cindex_insert(ix, 5, a, 25, GW_CINDEX_TTL_1H, 2, 2), 0);
    ASSERT_EQ(gw_cindex_match(ix, 5, a, 40, 2, &m), 0);
    ASSERT_EQ(m.held[3], 30);
    ASSERT_EQ(m.held_g2[3], 30);
    /* A restarted worker's disk lists whole blocks: with 8-token blocks, 16 tokens hold the
     * entry at 20 (its blocks: [0, 16) and the partial [16, 20), which is never on disk), and 24
     * tokens the entry at 25 (the entry whose edge holds the last listed token: the one at 30
     * below it is not looked for). With 4-token blocks, 22 tokens leave the whole block
     * [20, 24) of the entry at 25 out: they hold the entry at 20. Without blocks: exact. */
    ASSERT_EQ(gw_cindex_worker_down(ix, 3), 0);
    ASSERT_EQ(gw_cindex_owner_add_tier(ix, 5, a, 16, 3, GW_CINDEX_TIER_G3, 8, &held), 0);
    ASSERT_EQ(held, 20);
    ASSERT_EQ(gw_cindex_owner_add_tier(ix, 5, a, 24, 3, GW_CINDEX_TIER_G3, 8, &held), 0);
    ASSERT_EQ(held, 25);
    ASSERT_EQ(gw_cindex_match(ix, 5, a, 40, 2, &m), 0);
    ASSERT_EQ(m.held[3], 25);
    ASSERT_EQ(m.held_g3[3], 25);
    ASSERT_EQ(gw_cindex_owner_add_tier(ix, 5, a, 22, 2, GW_CINDEX_TIER_G3, 4, &held), 0);
    ASSERT_EQ(held, 20);
    ASSERT_EQ(gw_cindex_owner_add_tier(ix, 5, a, 24, 1, GW_CINDEX_TIER_G3, 0, &held), 0);
    ASSERT_EQ(held, 20);
    /* Bad arguments. */
    ASSERT_EQ(gw_cindex_owner_add_tier(ix, 5, a, 30, 3, (gw_cindex_tier_t)0, 0, &held),
              PC_ERR_INVAL);
    ASSERT_EQ(gw_cindex_owner_add_tier(ix, 5, a, 30, 3, (gw_cindex_tier_t)4, 0, &held),
              PC_ERR_INVAL);
    ASSERT_EQ(gw_cindex_owner_demoted(ix, 3, 5, a, 0, 30, 1), PC_ERR_INVAL);
    ASSERT_EQ(gw_cindex_owner_demoted(ix, 3, 5, a, 0, 30, 4), PC_ERR_INVAL);
    ASSERT_EQ(gw_cindex_owner_demoted(ix, 4, 5, a, 0, 30, 3), PC_ERR_RANGE);
    ASSERT_EQ_U64(gw_cindex_worker_tier_tokens(ix, 3, (gw_cindex_tier_t)0), 0);
    CHECK(ix);
    gw_cindex_free(ix);
}

PC_TEST(eviction_lru_under_caps)
{
    gw_cindex_params_t p = test_params();
    p.max_tokens = 30;
    gw_cindex_t *ix = mk(&p);
    /* Three disjoint entries of 10 tokens at t = 1, 2, 3; reading the first at 4 makes the
     * second the least recently used. */
    ASSERT_EQ(gw_cindex_insert(ix, 1, seq(100, 10), 10, GW_CINDEX_TTL_5M, 1, 1), 0);
    ASSERT_EQ(gw_cindex_insert(ix, 1, seq(200, 10), 10, GW_CINDEX_TTL_5M, 2, 2), 0);
    ASSERT_EQ(gw_cindex_insert(ix, 2, seq(300, 10), 10, GW_CINDEX_TTL_5M, 3, 3), 0);
    ASSERT_EQ(gw_cindex_read(ix, 1, seq(100, 10), 10, 4, NULL), 0);
    ASSERT_EQ(n_drops, 0);
    ASSERT_EQ(gw_cindex_insert(ix, 2, seq(400, 5), 5, GW_CINDEX_TTL_5M, 5, 5), 0);
    ASSERT_EQ(n_drops, 1);
    ASSERT_EQ(drops[0].reason, GW_CINDEX_DROP_EVICT_TOKENS);
    ASSERT_EQ(drops[0].tok[0], 200);
    ASSERT_EQ(drops[0].n, 10);
    ASSERT_FALSE(gw_cindex_entry_live(ix, 1, seq(200, 10), 10, 5));
    ASSERT_TRUE(gw_cindex_entry_live(ix, 1, seq(100, 10), 10, 5));
    /* An entry larger than the whole cap is refused. */
    ASSERT_EQ(gw_cindex_insert(ix, 1, seq(500, 31), 31, GW_CINDEX_TTL_5M, 6, 6), PC_ERR_NOSPACE);
    gw_cindex_stats_t st;
    gw_cindex_stats(ix, &st);
    ASSERT_EQ_U64(st.n_tokens, 25);
    ASSERT_EQ_U64(st.entries_dropped[GW_CINDEX_DROP_EVICT_TOKENS], 1);
    ASSERT_EQ_U64(st.tokens_freed[GW_CINDEX_DROP_EVICT_TOKENS], 10);
    CHECK(ix);
    gw_cindex_free(ix);

    /* Node cap: a leaf goes first, its parent entry stays until it is the oldest leaf. */
    p = test_params();
    p.max_nodes = 3;
    ix = mk(&p);
    const uint32_t *a = seq(1, 30);
    ASSERT_EQ(gw_cindex_insert(ix, 1, a, 10, GW_CINDEX_TTL_5M, 1, 1), 0);
    ASSERT_EQ(gw_cindex_insert(ix, 1, a, 20, GW_CINDEX_TTL_5M, 2, 2), 0);
    ASSERT_EQ(gw_cindex_insert(ix, 1, seq(50, 5), 5, GW_CINDEX_TTL_5M, 3, 3), 0);
    ASSERT_EQ(n_drops, 0);
    ASSERT_EQ(gw_cindex_insert(ix, 1, seq(60, 5), 5, GW_CINDEX_TTL_5M, 4, 4), 0);
    ASSERT_EQ(n_drops, 1);
    ASSERT_EQ(drops[0].reason, GW_CINDEX_DROP_EVICT_NODES);
    ASSERT_EQ(drops[0].n, 20);
    gw_cindex_stats(ix, &st);
    ASSERT_EQ_U64(st.n_nodes, 3);
    ASSERT_TRUE(gw_cindex_entry_live(ix, 1, a, 10, 4));
    CHECK(ix);
    gw_cindex_free(ix);
}

PC_TEST(drop_namespace)
{
    gw_cindex_params_t p = test_params();
    gw_cindex_t *ix = mk(&p);
    const uint32_t *a = seq(1, 30);
    ASSERT_EQ(gw_cindex_insert(ix, 1, a, 10, GW_CINDEX_TTL_5M, 0, 0), 0);
    ASSERT_EQ(gw_cindex_insert(ix, 1, a, 20, GW_CINDEX_TTL_5M, 0, 0), 0);
    ASSERT_EQ(gw_cindex_insert(ix, 2, a, 20, GW_CINDEX_TTL_5M, 0, 0), 0);
    ASSERT_EQ(gw_cindex_drop_ns(ix, 1), 2);
    ASSERT_EQ(gw_cindex_drop_ns(ix, 1), 0);
    ASSERT_EQ(n_drops, 2);
    ASSERT_EQ(drops[0].reason, GW_CINDEX_DROP_REMOVE);
    gw_cindex_ns_stats_t ns;
    ASSERT_EQ(gw_cindex_ns_stats(ix, 2, &ns), 0);
    ASSERT_EQ_U64(ns.n_entries, 1);
    ASSERT_EQ_U64(ns.n_tokens, 20);
    ASSERT_EQ(gw_cindex_ns_stats(ix, 3, &ns), PC_ERR_NOTFOUND);
    CHECK(ix);
    gw_cindex_free(ix);
}

PC_TEST(bad_inputs_change_nothing)
{
    gw_cindex_params_t p = test_params();
    p.vocab_size = 1000;
    gw_cindex_t *ix = mk(&p);
    const uint32_t bad[3] = {1, 2, 1000};
    ASSERT_EQ(gw_cindex_insert(ix, 1, bad, 3, GW_CINDEX_TTL_5M, 0, 0), PC_ERR_RANGE);
    ASSERT_EQ(gw_cindex_insert(ix, 1, bad, 0, GW_CINDEX_TTL_5M, 0, 0), PC_ERR_INVAL);
    ASSERT_EQ(gw_cindex_insert(ix, 1, NULL, 3, GW_CINDEX_TTL_5M, 0, 0), PC_ERR_INVAL);
    ASSERT_EQ(gw_cindex_insert(ix, 1, bad, 2, (gw_cindex_ttl_t)2, 0, 0), PC_ERR_INVAL);
    gw_cindex_match_t m;
    ASSERT_EQ(gw_cindex_match(ix, 1, NULL, 3, 0, &m), PC_ERR_INVAL);
    ASSERT_EQ(gw_cindex_match(ix, 1, NULL, 0, 0, &m), 0);
    ASSERT_EQ(gw_cindex_match(ix, 1, bad, 3, 0, NULL), PC_ERR_INVAL);
    gw_cindex_stats_t st;
    gw_cindex_stats(ix, &st);
    ASSERT_EQ_U64(st.n_tokens, 0);
    ASSERT_EQ_U64(st.n_namespaces, 0);
    ASSERT_EQ(ix->ns_n, 0);
    CHECK(ix);
    gw_cindex_free(ix);

    gw_cindex_t *x = NULL;
    p = test_params();
    p.n_workers = 0;
    ASSERT_EQ(gw_cindex_init(&p, &x), PC_ERR_INVAL);
    p.n_workers = 65;
    ASSERT_EQ(gw_cindex_init(&p, &x), PC_ERR_INVAL);
    p = test_params();
    p.ttl_ms[1] = 0;
    ASSERT_EQ(gw_cindex_init(&p, &x), PC_ERR_INVAL);
    ASSERT_TRUE(x == NULL);
    gw_cindex_free(NULL);
}

/* ---- storage integrals, worked by hand --------------------------------------------------- */

typedef struct take_rec {
    uint64_t ns[8], tms[8];
    size_t n;
} take_rec_t;

static void on_take(uint64_t ns, uint64_t token_ms, void *ud)
{
    take_rec_t *r = ud;
    r->ns[r->n] = ns;
    r->tms[r->n++] = token_ms;
}

static uint64_t take_of(const take_rec_t *r, uint64_t ns)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->ns[i] == ns)
            return r->tms[i];
    return 0;
}

/* Namespace 0 lives beside the index map (which cannot key 0) and UINT64_MAX at its edge: both
 * meter like any other, and namespaces that go during a take (swap-removes re-index the one
 * moved) stay findable. */
PC_TEST(namespace_zero_and_max_meter_like_others)
{
    gw_cindex_params_t p = test_params();
    gw_cindex_t *ix = mk(&p);
    const uint32_t *a = seq(1, 20);
    take_rec_t r = {0};
    ASSERT_EQ(gw_cindex_insert(ix, 0, a, 10, GW_CINDEX_TTL_5M, 0, 0), 0);
    ASSERT_EQ(gw_cindex_insert(ix, 2, a, 6, GW_CINDEX_TTL_5M, 0, 0), 0);
    ASSERT_EQ(gw_cindex_insert(ix, UINT64_MAX, a, 4, GW_CINDEX_TTL_1H, 50, 50), 0);
    gw_cindex_ns_stats_t ns;
    ASSERT_EQ(gw_cindex_ns_stats(ix, 0, &ns), 0);
    ASSERT_EQ_U64(ns.n_tokens, 10);
    ASSERT_EQ(gw_cindex_ns_stats(ix, UINT64_MAX, &ns), 0);
    ASSERT_EQ_U64(ns.n_tokens, 4);
    CHECK(ix);
    ASSERT_EQ(gw_cindex_storage_take(ix, 200, on_take, &r), 3);
    ASSERT_EQ_U64(take_of(&r, 0), 2000);
    ASSERT_EQ_U64(take_of(&r, UINT64_MAX), 600);
    ASSERT_EQ_U64(take_of(&r, 2), 1200);
    /* 0 and 2 expire at 1000 and leave in this take; UINT64_MAX runs until 5050. */
    r.n = 0;
    ASSERT_EQ(gw_cindex_storage_take(ix, 2000, on_take, &r), 3);
    ASSERT_EQ_U64(take_of(&r, 0), 8000);
    ASSERT_EQ_U64(take_of(&r, 2), 4800);
    ASSERT_EQ_U64(take_of(&r, UINT64_MAX), 7200);
    ASSERT_EQ(ix->ns_n, 1);
    ASSERT_TRUE(ns_find(ix, 0) == NULL && ns_find(ix, 2) == NULL);
    ASSERT_TRUE(ns_find(ix, UINT64_MAX) == &ix->ns[0]);
    ASSERT_EQ(gw_cindex_ns_stats(ix, 0, &ns), PC_ERR_NOTFOUND);
    CHECK(ix);
    r.n = 0;
    ASSERT_EQ(gw_cindex_storage_take(ix, 9000, on_take, &r), 1);
    ASSERT_EQ_U64(take_of(&r, UINT64_MAX), 12200);
    ASSERT_EQ(gw_cindex_storage_take(ix, 9500, on_take, &r), 0);
    ASSERT_EQ(ix->ns_n, 0);
    ASSERT_EQ_U64(pc_u64map_count(&ix->idx), 0);
    CHECK(ix);
    gw_cindex_free(ix);
}

PC_TEST(storage_integral_by_hand)
{
    gw_cindex_params_t p = test_params();
    gw_cindex_t *ix = mk(&p);
    const uint32_t *a = seq(1, 20);
    take_rec_t r = {0};
    /* ns 1: A = 10 tokens at t=0 (expiry 1000), B = A + 5 at t=100 (expiry 1100).
     * ns 2: C = 4 tokens at t=50 with the 1h TTL (expiry 5050); the same tokens as A's
     * first 4, counted separately (once per namespace). */
    ASSERT_EQ(gw_cindex_insert(ix, 1, a, 10, GW_CINDEX_TTL_5M, 0, 0), 0);
    ASSERT_EQ(gw_cindex_insert(ix, 2, a, 4, GW_CINDEX_TTL_1H, 50, 50), 0);
    ASSERT_EQ(gw_cindex_insert(ix, 1, a, 15, GW_CINDEX_TTL_5M, 100, 100), 0);
    /* take at 200: ns1 = 10 x 100 + 15 x 100 = 2500; ns2 = 4 x 150 = 600. */
    ASSERT_EQ(gw_cindex_storage_take(ix, 200, on_take, &r), 2);
    ASSERT_EQ_U64(take_of(&r, 1), 2500);
    ASSERT_EQ_U64(take_of(&r, 2), 600);
    /* A expires at 1000 but its tokens live on in B until 1100: ns1 = 15 x 900 = 13500,
     * even though nothing ran between 200 and 2000. ns2 = 4 x 1800 = 7200. */
    r.n = 0;
    ASSERT_EQ(gw_cindex_storage_take(ix, 2000, on_take, &r), 2);
    ASSERT_EQ_U64(take_of(&r, 1), 13500);
    ASSERT_EQ_U64(take_of(&r, 2), 7200);
    /* ns1 is gone; ns2 runs until 5050: 4 x 3050. */
    r.n = 0;
    ASSERT_EQ(gw_cindex_storage_take(ix, 9000, on_take, &r), 1);
    ASSERT_EQ_U64(take_of(&r, 2), 12200);
    r.n = 0;
    ASSERT_EQ(gw_cindex_storage_take(ix, 9500, on_take, &r), 0);
    ASSERT_EQ(ix->ns_n, 0);
    CHECK(ix);

    /* A read keeps the shorter entry alive after the longer one expires: D = 8 tokens and E =
     * D + 12 written at 10000 (expiry 11000); D read at 10900 (expiry 11900). E's 12 tokens
     * go at 11000, D's 8 at 11900: 20 x 1000 + 8 x 900 = 27200. */
    ASSERT_EQ(gw_cindex_insert(ix, 3, a, 8, GW_CINDEX_TTL_5M, 10000, 10000), 0);
    ASSERT_EQ(gw_cindex_insert(ix, 3, a, 20, GW_CINDEX_TTL_5M, 10000, 10000), 0);
    ASSERT_EQ(gw_cindex_read(ix, 3, a, 10, 10900, NULL), 0);
    r.n = 0;
    ASSERT_EQ(gw_cindex_storage_take(ix, 20000, on_take, &r), 1);
    ASSERT_EQ_U64(take_of(&r, 3), 27200);
    CHECK(ix);

    /* Eviction stops the meter at the eviction: cap 10 tokens, F = 10 at 30000, G = 10 in
     * another namespace at 30400 evicts F: F counts 10 x 400, G 10 x 600 up to 31000. */
    gw_cindex_free(ix);
    p.max_tokens = 10;
    ix = mk(&p);
    ASSERT_EQ(gw_cindex_insert(ix, 4, a, 10, GW_CINDEX_TTL_5M, 30000, 30000), 0);
    ASSERT_EQ(gw_cindex_insert(ix, 5, seq(50, 10), 10, GW_CINDEX_TTL_5M, 30400, 30400), 0);
    r.n = 0;
    ASSERT_EQ(gw_cindex_storage_take(ix, 31000, on_take, &r), 2);
    ASSERT_EQ_U64(take_of(&r, 4), 4000);
    ASSERT_EQ_U64(take_of(&r, 5), 6000);
    CHECK(ix);
    gw_cindex_free(ix);
}

/* ---- the brute-force model -------------------------------------------------------------- */

#define M_LEN 12
#define M_VOCAB 3
#define M_NS 3
#define M_WORKERS 4
#define M_MAX 512

typedef struct mpos {
    uint64_t ns;
    uint32_t n;
    uint32_t tok[M_LEN];
} mpos_t;

typedef struct mentry {
    mpos_t at;
    uint64_t expiry, created, la;
    int ttl;
} mentry_t;

typedef struct model {
    gw_cindex_params_t p;
    uint64_t now;
    mentry_t e[M_MAX];
    size_t n_e;
    mpos_t held[M_WORKERS][M_MAX * M_LEN];
    uint8_t tier[M_WORKERS][M_MAX * M_LEN]; /* the tier of each held position */
    size_t n_held[M_WORKERS];
    struct {
        uint64_t ns, acc, last_t;
    } st[M_NS + 1];
    drop_rec_t drops[MAX_DROPS];
    size_t n_drops;
    gw_cindex_stats_t stats;
} model_t;

static int pos_eq(const mpos_t *a, const mpos_t *b)
{
    return a->ns == b->ns && a->n == b->n && memcmp(a->tok, b->tok, a->n * sizeof a->tok[0]) == 0;
}

static mpos_t pos_of(uint64_t ns, const uint32_t *tok, size_t n)
{
    mpos_t p;
    memset(&p, 0, sizeof p);
    p.ns = ns;
    p.n = (uint32_t)n;
    memcpy(p.tok, tok, n * sizeof *tok);
    return p;
}

/* a is a prefix of b (same namespace). */
static int is_prefix(const mpos_t *a, const mpos_t *b)
{
    return a->ns == b->ns && a->n <= b->n && memcmp(a->tok, b->tok, a->n * sizeof a->tok[0]) == 0;
}

static size_t lcp(const mpos_t *a, const uint32_t *q, size_t n)
{
    size_t i = 0;
    while (i < a->n && i < n && a->tok[i] == q[i])
        i++;
    return i;
}

/* Is position p stored (a prefix of a live entry)? */
static int m_stored(const model_t *m, const mpos_t *p)
{
    for (size_t i = 0; i < m->n_e; i++)
        if (is_prefix(p, &m->e[i].at))
            return 1;
    return 0;
}

static uint64_t m_tokens(const model_t *m, uint64_t ns)
{
    /* Count distinct stored positions of ns: each position once, as the prefix of the first
     * entry (in array order) that has it. */
    uint64_t k = 0;
    for (size_t i = 0; i < m->n_e; i++) {
        if (m->e[i].at.ns != ns)
            continue;
        for (uint32_t len = 1; len <= m->e[i].at.n; len++) {
            mpos_t p = pos_of(ns, m->e[i].at.tok, len);
            int first = 1;
            for (size_t j = 0; j < i && first; j++)
                if (is_prefix(&p, &m->e[j].at))
                    first = 0;
            k += first;
        }
    }
    return k;
}

/* The slot of p among w's held positions, or -1. */
static long m_held_find(const model_t *m, int w, const mpos_t *p)
{
    for (size_t i = 0; i < m->n_held[w]; i++)
        if (pos_eq(&m->held[w][i], p))
            return (long)i;
    return -1;
}

static int m_held_has(const model_t *m, int w, const mpos_t *p)
{
    return m_held_find(m, w, p) >= 0;
}

/* w holds p in tier (or its better tier when it already held p). */
static void m_held_add(model_t *m, int w, const mpos_t *p, int tier)
{
    long i = m_held_find(m, w, p);
    if (i < 0) {
        m->tier[w][m->n_held[w]] = (uint8_t)tier;
        m->held[w][m->n_held[w]++] = *p;
    } else if (tier < m->tier[w][i]) {
        m->tier[w][i] = (uint8_t)tier;
    }
}

static void m_held_remove_at(model_t *m, int w, size_t i)
{
    size_t last = --m->n_held[w];
    m->held[w][i] = m->held[w][last];
    m->tier[w][i] = m->tier[w][last];
}

static void m_held_del(model_t *m, int w, const mpos_t *p)
{
    long i = m_held_find(m, w, p);
    if (i >= 0)
        m_held_remove_at(m, w, (size_t)i);
}

static uint64_t m_tier_tokens(const model_t *m, int w, int tier)
{
    uint64_t k = 0;
    for (size_t i = 0; i < m->n_held[w]; i++)
        k += m->tier[w][i] == tier;
    return k;
}

/* Held positions that are no longer stored go. */
static void m_held_filter(model_t *m)
{
    for (int w = 0; w < M_WORKERS; w++)
        for (size_t i = 0; i < m->n_held[w];)
            if (!m_stored(m, &m->held[w][i]))
                m_held_remove_at(m, w, i);
            else
                i++;
}

static uint64_t m_owners(const model_t *m, const mpos_t *at)
{
    uint64_t o = 0;
    for (int w = 0; w < M_WORKERS; w++) {
        int all = 1;
        for (uint32_t len = 1; len <= at->n && all; len++) {
            mpos_t p = pos_of(at->ns, at->tok, len);
            all = m_held_has(m, w, &p);
        }
        o |= (uint64_t)all << w;
    }
    return o;
}

static void m_charge(model_t *m, uint64_t t)
{
    for (uint64_t ns = 1; ns <= M_NS; ns++) {
        if (t > m->st[ns].last_t)
            m->st[ns].acc += m_tokens(m, ns) * (t - m->st[ns].last_t);
        m->st[ns].last_t = t;
    }
}

static void m_record(model_t *m, const mentry_t *e, int reason)
{
    drop_rec_t *d = &m->drops[m->n_drops++];
    memset(d, 0, sizeof *d);
    d->ns = e->at.ns;
    memcpy(d->tok, e->at.tok, e->at.n * sizeof e->at.tok[0]);
    d->n = e->at.n;
    d->owners = m_owners(m, &e->at);
    d->expiry = e->expiry;
    d->reason = reason;
}

static void m_remove_entry(model_t *m, size_t i, int reason)
{
    uint64_t before = 0, after = 0;
    for (uint64_t ns = 1; ns <= M_NS; ns++)
        before += m_tokens(m, ns);
    m_record(m, &m->e[i], reason);
    m->e[i] = m->e[--m->n_e];
    for (uint64_t ns = 1; ns <= M_NS; ns++)
        after += m_tokens(m, ns);
    m->stats.entries_dropped[reason]++;
    m->stats.tokens_freed[reason] += before - after;
}

static void m_advance(model_t *m, uint64_t t)
{
    if (t < m->now)
        t = m->now;
    for (;;) {
        uint64_t te = UINT64_MAX;
        for (size_t i = 0; i < m->n_e; i++)
            if (m->e[i].expiry <= t && m->e[i].expiry < te)
                te = m->e[i].expiry;
        if (te == UINT64_MAX)
            break;
        m_charge(m, te);
        /* Owners are read before any entry of this batch goes (the index reports the whole
         * batch before it frees anything). */
        mentry_t due[M_MAX];
        uint64_t owners[M_MAX];
        size_t k = 0;
        for (size_t i = 0; i < m->n_e; i++)
            if (m->e[i].expiry == te) {
                owners[k] = m_owners(m, &m->e[i].at);
                due[k++] = m->e[i];
            }
        for (size_t d = 0; d < k; d++)
            for (size_t i = 0; i < m->n_e; i++)
                if (pos_eq(&m->e[i].at, &due[d].at)) {
                    m_remove_entry(m, i, GW_CINDEX_DROP_EXPIRE);
                    m->drops[m->n_drops - 1].owners = owners[d];
                    break;
                }
        m_held_filter(m);
    }
    m_charge(m, t);
    m->now = t;
}

static int m_cmp_drop(const void *a, const void *b)
{
    const drop_rec_t *x = a, *y = b;
    if (x->reason != y->reason)
        return x->reason < y->reason ? -1 : 1;
    if (x->ns != y->ns)
        return x->ns < y->ns ? -1 : 1;
    if (x->n != y->n)
        return x->n < y->n ? -1 : 1;
    return memcmp(x->tok, y->tok, sizeof x->tok);
}

/* ---- model operations (each mirrors one gw_cindex_* call) -------------------------------- */

static uint64_t m_total(const model_t *m)
{
    uint64_t k = 0;
    for (uint64_t ns = 1; ns <= M_NS; ns++)
        k += m_tokens(m, ns);
    return k;
}

static void m_touch(model_t *m, const mpos_t *at)
{
    for (size_t i = 0; i < m->n_e; i++)
        if (is_prefix(&m->e[i].at, at) && m->e[i].la < m->now)
            m->e[i].la = m->now;
}

static int m_insert(model_t *m, uint64_t ns, const uint32_t *q, size_t n, int ttl, uint64_t start,
                    uint64_t t)
{
    m_advance(m, t);
    uint64_t s0 = PC_MIN(start, m->now);
    uint64_t expiry = s0 + m->p.ttl_ms[ttl];
    if (expiry <= m->now)
        return 2;
    if (m->p.max_tokens != 0 && n > m->p.max_tokens)
        return PC_ERR_NOSPACE;
    mpos_t at = pos_of(ns, q, n);
    int rc = 0;
    size_t i;
    for (i = 0; i < m->n_e; i++)
        if (pos_eq(&m->e[i].at, &at))
            break;
    if (i < m->n_e) {
        m->e[i].expiry = PC_MAX(m->e[i].expiry, expiry);
        m->e[i].ttl = PC_MAX(m->e[i].ttl, ttl);
        m->stats.n_extends++;
        rc = 1;
    } else {
        mentry_t *e = &m->e[m->n_e++];
        memset(e, 0, sizeof *e);
        e->at = at;
        e->expiry = expiry;
        e->created = m->now;
        e->ttl = ttl;
        m->stats.n_inserts++;
    }
    m_touch(m, &at);
    if (m->p.max_tokens != 0 && m_total(m) > m->p.max_tokens) {
        uint64_t excess = m_total(m) - m->p.max_tokens, freed = 0;
        while (freed < excess) {
            /* The least recently used leaf entry (no other entry extends it). */
            size_t best = SIZE_MAX;
            for (size_t a = 0; a < m->n_e; a++) {
                int leaf = 1;
                for (size_t b = 0; b < m->n_e && leaf; b++)
                    if (b != a && is_prefix(&m->e[a].at, &m->e[b].at))
                        leaf = 0;
                if (leaf && (best == SIZE_MAX || m->e[a].la < m->e[best].la))
                    best = a;
            }
            if (best == SIZE_MAX)
                break;
            uint64_t before = m_total(m);
            m_remove_entry(m, best, GW_CINDEX_DROP_EVICT_TOKENS);
            freed += before - m_total(m);
        }
        m_held_filter(m);
    }
    return rc;
}

static size_t m_read(model_t *m, uint64_t ns, const uint32_t *q, size_t n, uint64_t t)
{
    m_advance(m, t);
    mpos_t at = pos_of(ns, q, n);
    size_t k = 0;
    for (size_t i = 0; i < m->n_e; i++)
        if (is_prefix(&m->e[i].at, &at)) {
            m->e[i].expiry = PC_MAX(m->e[i].expiry, m->now + m->p.ttl_ms[m->e[i].ttl]);
            m->e[i].la = m->now;
            m->stats.n_extends++;
            k++;
        }
    return k;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static void m_match(model_t *m, uint64_t ns, const uint32_t *q, size_t n, uint64_t t,
                    gw_cindex_match_t *out)
{
    m_advance(m, t);
    memset(out, 0, sizeof *out);
    mpos_t at = pos_of(ns, q, n);
    uint32_t lens[M_MAX];
    size_t k = 0;
    for (size_t i = 0; i < m->n_e; i++) {
        if (m->e[i].at.ns != ns)
            continue;
        size_t l = lcp(&m->e[i].at, q, n);
        if (l > out->n_matched)
            out->n_matched = (uint32_t)l;
        if (is_prefix(&m->e[i].at, &at))
            lens[k++] = m->e[i].at.n;
    }
    out->n_hit = out->n_matched;
    qsort(lens, k, sizeof lens[0], cmp_u32);
    out->n_entries = (uint32_t)k;
    size_t from = k > GW_CINDEX_MATCH_ENTRIES ? k - GW_CINDEX_MATCH_ENTRIES : 0;
    for (size_t i = from; i < k; i++)
        out->entry_len[i - from] = lens[i];
    for (int w = 0; w < M_WORKERS; w++) {
        uint32_t h = 0;
        while (h < out->n_matched) {
            mpos_t pp = pos_of(ns, q, h + 1);
            long i = m_held_find(m, w, &pp);
            if (i < 0)
                break;
            out->held_g2[w] += m->tier[w][i] == GW_CINDEX_TIER_G2;
            out->held_g3[w] += m->tier[w][i] == GW_CINDEX_TIER_G3;
            h++;
        }
        out->held[w] = h;
        if (h > 0)
            out->holders |= 1ull << w;
    }
}

static int m_entry_live(const model_t *m, uint64_t ns, const uint32_t *q, size_t n, uint64_t t)
{
    mpos_t at = pos_of(ns, q, n);
    for (size_t i = 0; i < m->n_e; i++)
        if (pos_eq(&m->e[i].at, &at))
            return m->e[i].expiry > t;
    return 0;
}

/* The longest entry of ns that is a prefix of q[0..n), or 0. */
static uint32_t m_deepest(const model_t *m, uint64_t ns, const uint32_t *q, size_t n)
{
    mpos_t at = pos_of(ns, q, n);
    uint32_t d = 0;
    for (size_t i = 0; i < m->n_e; i++)
        if (is_prefix(&m->e[i].at, &at) && m->e[i].at.n > d)
            d = m->e[i].at.n;
    return d;
}

static uint32_t m_owner_add(model_t *m, uint64_t ns, const uint32_t *q, size_t n, int w, int tier)
{
    uint32_t d = m_deepest(m, ns, q, n);
    for (uint32_t l = 1; l <= d; l++) {
        mpos_t pp = pos_of(ns, q, l);
        m_held_add(m, w, &pp, tier);
    }
    return d;
}

/* tier 0: evicted; 2, 3: held positions move down to it (never up). */
static void m_owner_demoted(model_t *m, int w, uint64_t ns, const uint32_t *q, size_t kept,
                            size_t n, int tier)
{
    uint32_t a = m_deepest(m, ns, q, n), keep = m_deepest(m, ns, q, kept);
    for (uint32_t l = keep + 1; l <= a; l++) {
        mpos_t pp = pos_of(ns, q, l);
        long i = m_held_find(m, w, &pp);
        if (tier == 0)
            m_held_del(m, w, &pp);
        else if (i >= 0 && m->tier[w][i] < tier)
            m->tier[w][i] = (uint8_t)tier;
    }
}

static size_t m_drop_ns(model_t *m, uint64_t ns)
{
    size_t k = 0;
    m_charge(m, m->now);
    for (size_t i = 0; i < m->n_e;)
        if (m->e[i].at.ns == ns) {
            m_remove_entry(m, i, GW_CINDEX_DROP_REMOVE);
            k++;
        } else {
            i++;
        }
    m_held_filter(m);
    return k;
}

/* ---- the differential test -------------------------------------------------------------- */

static uint64_t rng_state;
static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

static take_rec_t real_take, model_take;

static int cmp_take(const take_rec_t *a, const take_rec_t *b)
{
    if (a->n != b->n)
        return 1;
    for (size_t i = 0; i < a->n; i++)
        if (take_of(b, a->ns[i]) != a->tms[i])
            return 1;
    return 0;
}

#define DIFF_FAIL(op, ...)                                                                         \
    do {                                                                                           \
        fprintf(stderr, "  seed %llu op %ld (%s):\n", (unsigned long long)seed, i, op);            \
        PC_TEST__FAIL(__VA_ARGS__);                                                                \
    } while (0)

/* Compares the drop reports of the last operation as multisets. */
static int drops_equal(model_t *m)
{
    if (n_drops != m->n_drops)
        return 0;
    qsort(drops, n_drops, sizeof drops[0], m_cmp_drop);
    qsort(m->drops, m->n_drops, sizeof m->drops[0], m_cmp_drop);
    for (size_t k = 0; k < n_drops; k++)
        if (m_cmp_drop(&drops[k], &m->drops[k]) != 0 || drops[k].owners != m->drops[k].owners ||
            drops[k].expiry != m->drops[k].expiry)
            return 0;
    return 1;
}

static void diff_run(uint64_t seed, long n_ops, uint64_t max_tokens, model_t *m)
{
    rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
    gw_cindex_params_t p = test_params();
    p.n_workers = M_WORKERS;
    p.ttl_ms[0] = 120;
    p.ttl_ms[1] = 400;
    p.max_tokens = max_tokens;
    memset(m, 0, sizeof *m);
    m->p = p;
    gw_cindex_t *ix = mk(&p);
    uint64_t t = 0;
    /* A few base prompts; queries take a prefix of one and maybe change its tail. */
    uint32_t base[6][M_LEN];
    for (int b = 0; b < 6; b++)
        for (int k = 0; k < M_LEN; k++)
            base[b][k] = rnd(M_VOCAB);
    for (long i = 0; i < n_ops; i++) {
        t += 1 + rnd(30);
        uint32_t q[M_LEN];
        size_t n = 1 + rnd(M_LEN);
        memcpy(q, base[rnd(6)], sizeof q);
        if (rnd(3) == 0)
            for (size_t k = rnd((uint32_t)n); k < n; k++)
                q[k] = rnd(M_VOCAB);
        uint64_t ns = 1 + rnd(M_NS);
        int w = (int)rnd(M_WORKERS);
        n_drops = 0;
        m->n_drops = 0;
        uint32_t op = rnd(100);
        const char *name;
        if (op < 35) {
            name = "insert";
            int ttl = (int)rnd(2);
            uint64_t start = t - PC_MIN(t, (uint64_t)rnd(150));
            int a = gw_cindex_insert(ix, ns, q, n, (gw_cindex_ttl_t)ttl, start, t);
            int b = m_insert(m, ns, q, n, ttl, start, t);
            if (a != b)
                DIFF_FAIL(name, "rc %d vs model %d", a, b);
        } else if (op < 55) {
            name = "match";
            gw_cindex_match_t a, b;
            ASSERT_EQ(gw_cindex_match(ix, ns, q, n, t, &a), 0);
            m_match(m, ns, q, n, t, &b);
            if (memcmp(&a, &b, sizeof a) != 0)
                DIFF_FAIL(name,
                          "matched %u/%u hit %u/%u entries %u/%u holders %llx/%llx held0 %u/%u "
                          "g2 %u/%u g3 %u/%u",
                          a.n_matched, b.n_matched, a.n_hit, b.n_hit, a.n_entries, b.n_entries,
                          (unsigned long long)a.holders, (unsigned long long)b.holders, a.held[0],
                          b.held[0], a.held_g2[0], b.held_g2[0], a.held_g3[0], b.held_g3[0]);
        } else if (op < 65) {
            name = "read";
            size_t ka = 0;
            ASSERT_EQ(gw_cindex_read(ix, ns, q, n, t, &ka), 0);
            size_t kb = m_read(m, ns, q, n, t);
            if (ka != kb)
                DIFF_FAIL(name, "refreshed %zu vs model %zu", ka, kb);
        } else if (op < 70) {
            name = "entry_live";
            uint64_t at = t + rnd(200);
            if (gw_cindex_entry_live(ix, ns, q, n, at) != (m_entry_live(m, ns, q, n, at) != 0))
                DIFF_FAIL(name, "differs");
            t -= 1; /* no time passed for the index */
        } else if (op < 80) {
            name = "owner_add";
            uint32_t ha = 0;
            int tier = rnd(3) != 0 ? GW_CINDEX_TIER_G1 : (int)(2 + rnd(2));
            if (tier == GW_CINDEX_TIER_G1)
                ASSERT_EQ(gw_cindex_owner_add(ix, ns, q, n, (uint32_t)w, &ha), 0);
            else
                ASSERT_EQ(gw_cindex_owner_add_tier(ix, ns, q, n, (uint32_t)w,
                                                   (gw_cindex_tier_t)tier, 0, &ha),
                          0);
            uint32_t hb = m_owner_add(m, ns, q, n, w, tier);
            if (ha != hb)
                DIFF_FAIL(name, "held %u vs model %u", ha, hb);
            t -= 1;
        } else if (op < 86) {
            name = "owner_evicted";
            size_t kept = rnd((uint32_t)n + 1);
            int tier = (int)rnd(3);
            tier += tier > 0; /* 0, 2 or 3 */
            if (tier == 0)
                ASSERT_EQ(gw_cindex_owner_evicted(ix, (uint32_t)w, ns, q, kept, n), 0);
            else
                ASSERT_EQ(gw_cindex_owner_demoted(ix, (uint32_t)w, ns, q, kept, n, tier), 0);
            m_owner_demoted(m, w, ns, q, kept, n, tier);
            t -= 1;
        } else if (op < 88) {
            name = "worker_down";
            ASSERT_EQ(gw_cindex_worker_down(ix, (uint32_t)w), 0);
            m->n_held[w] = 0;
            t -= 1;
        } else if (op < 90) {
            name = "drop_ns";
            size_t a = gw_cindex_drop_ns(ix, ns);
            size_t b = m_drop_ns(m, ns);
            if (a != b)
                DIFF_FAIL(name, "dropped %zu vs model %zu", a, b);
            t -= 1;
        } else if (op < 95) {
            name = "expire";
            gw_cindex_expire(ix, t);
            m_advance(m, t);
        } else {
            name = "storage_take";
            real_take.n = model_take.n = 0;
            size_t a = gw_cindex_storage_take(ix, t, on_take, &real_take);
            m_advance(m, t);
            for (uint64_t s = 1; s <= M_NS; s++)
                if (m->st[s].acc != 0) {
                    model_take.ns[model_take.n] = s;
                    model_take.tms[model_take.n++] = m->st[s].acc;
                    m->st[s].acc = 0;
                }
            if (a != model_take.n || cmp_take(&real_take, &model_take) != 0)
                DIFF_FAIL(name, "%zu namespaces vs model %zu (ns1 %llu vs %llu)", a, model_take.n,
                          (unsigned long long)take_of(&real_take, 1),
                          (unsigned long long)take_of(&model_take, 1));
        }
        if (!drops_equal(m))
            DIFF_FAIL(name, "drop reports differ: %zu vs model %zu", n_drops, m->n_drops);
        /* Whole-state comparison. */
        char err[256];
        if (gw_cindex_check(ix, err, sizeof err) != 0)
            DIFF_FAIL(name, "check: %s", err);
        gw_cindex_stats_t st;
        gw_cindex_stats(ix, &st);
        if (st.n_entries != m->n_e || st.n_tokens != m_total(m) ||
            st.n_inserts != m->stats.n_inserts || st.n_extends != m->stats.n_extends ||
            memcmp(st.entries_dropped, m->stats.entries_dropped, sizeof st.entries_dropped) ||
            memcmp(st.tokens_freed, m->stats.tokens_freed, sizeof st.tokens_freed))
            DIFF_FAIL(name, "stats: entries %llu/%zu tokens %llu/%llu",
                      (unsigned long long)st.n_entries, m->n_e, (unsigned long long)st.n_tokens,
                      (unsigned long long)m_total(m));
        for (uint64_t s = 1; s <= M_NS; s++) {
            gw_cindex_ns_stats_t ns_st;
            gw_cindex_ns_stats(ix, s, &ns_st);
            uint64_t me = 0;
            for (size_t k = 0; k < m->n_e; k++)
                me += m->e[k].at.ns == s;
            if (ns_st.n_entries != me || ns_st.n_tokens != m_tokens(m, s))
                DIFF_FAIL(name, "namespace %llu stats", (unsigned long long)s);
        }
        for (int k = 0; k < M_WORKERS; k++) {
            if (gw_cindex_worker_tokens(ix, (uint32_t)k) != m->n_held[k])
                DIFF_FAIL(name, "worker %d tokens %llu vs model %zu", k,
                          (unsigned long long)gw_cindex_worker_tokens(ix, (uint32_t)k),
                          m->n_held[k]);
            for (int tier = GW_CINDEX_TIER_G1; tier <= GW_CINDEX_TIER_G3; tier++)
                if (gw_cindex_worker_tier_tokens(ix, (uint32_t)k, (gw_cindex_tier_t)tier) !=
                    m_tier_tokens(m, k, tier))
                    DIFF_FAIL(name, "worker %d tier %d tokens %llu vs model %llu", k, tier,
                              (unsigned long long)gw_cindex_worker_tier_tokens(
                                  ix, (uint32_t)k, (gw_cindex_tier_t)tier),
                              (unsigned long long)m_tier_tokens(m, k, tier));
        }
    }
    gw_cindex_free(ix);
}

static long diff_ops(void)
{
#if defined(__SANITIZE_ADDRESS__) || !defined(NDEBUG)
    return (long)(10000 * pc_test_scale());
#else
    return (long)(100000 * pc_test_scale());
#endif
}

PC_TEST(differential_no_cap)
{
    model_t *m = calloc(1, sizeof *m);
    for (uint64_t seed = 1; seed <= 6; seed++)
        PC_TEST_CALL(diff_run(seed, diff_ops(), 0, m));
    free(m);
}

PC_TEST(differential_token_cap)
{
    model_t *m = calloc(1, sizeof *m);
    for (uint64_t seed = 100; seed <= 105; seed++)
        PC_TEST_CALL(diff_run(seed, diff_ops(), 25, m));
    free(m);
}

/* ---- failing allocator ------------------------------------------------------------------ */

/* Everything observable: the tree, the namespace states, the heap in slot order. */
static char *dump_state(const gw_cindex_t *ix)
{
    char *s = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&s, &n);
    rdx_tree_dump(ix->t, f);
    for (uint32_t d = 0; d < ix->ns_n; d++)
        fprintf(f, "ns %llu tokens %llu entries %llu last %llu acc %llu\n",
                (unsigned long long)ix->ns[d].id, (unsigned long long)ix->ns[d].n_tokens,
                (unsigned long long)ix->ns[d].n_entries, (unsigned long long)ix->ns[d].last_t,
                (unsigned long long)ix->ns[d].acc);
    for (uint32_t i = 0; i < ix->heap.n; i++) {
        const cix_entry_t *e = ix->heap.a[i].item;
        fprintf(f, "heap %u expiry %llu created %llu ttl %d depth %zu\n", i,
                (unsigned long long)e->expiry, (unsigned long long)e->created, e->ttl,
                rdx_node_depth(e->node));
    }
    fprintf(f, "entries %llu inserts %llu now %llu\n", (unsigned long long)ix->st.n_entries,
            (unsigned long long)ix->st.n_inserts, (unsigned long long)ix->now);
    fclose(f);
    return s;
}

PC_TEST(failing_allocator_every_insert)
{
    gw_cindex_params_t p = test_params();
    p.max_tokens = 200;
    gw_cindex_t *ix = mk(&p);
    rng_state = 77;
    uint64_t t = 0;
    long failures = 0;
    pc_allocator_t fa = pc_failalloc;
    for (int i = 0; i < 600; i++) {
        t += 1 + rnd(20);
        uint32_t q[40];
        size_t n = 1 + rnd(40);
        for (size_t k = 0; k < n; k++)
            q[k] = rnd(4);
        uint64_t ns = 1 + rnd(40); /* many namespaces: the tables grow under failure too */
        gw_cindex_expire(ix, t);
        char *before = dump_state(ix);
        int rc;
        for (long k = 0;; k++) {
            pc_failalloc_left = k;
            pc_allocator_t prev = pc_set_allocator(&fa);
            rc = gw_cindex_insert(ix, ns, q, n, (gw_cindex_ttl_t)rnd(2), t, t);
            pc_set_allocator(&prev);
            if (rc != PC_ERR_NOMEM)
                break;
            failures++;
            char *after = dump_state(ix);
            if (strcmp(before, after) != 0)
                PC_TEST__FAIL("insert %d: failed allocation %ld changed the state:\n%s\n---\n%s", i,
                              k, before, after);
            free(after);
        }
        free(before);
        ASSERT_TRUE(rc == 0 || rc == 1);
        if (rnd(4) == 0) {
            uint32_t held;
            gw_cindex_owner_add(ix, ns, q, n, rnd(4), &held);
        }
        CHECK(ix);
    }
    ASSERT_TRUE(failures > 600);
    gw_cindex_free(ix);

    /* init fails cleanly at every allocation. */
    for (long k = 0;; k++) {
        gw_cindex_t *x = NULL;
        pc_failalloc_left = k;
        pc_allocator_t prev = pc_set_allocator(&fa);
        int rc = gw_cindex_init(&p, &x);
        pc_set_allocator(&prev);
        if (rc == 0) {
            gw_cindex_free(x);
            break;
        }
        ASSERT_EQ(rc, PC_ERR_NOMEM);
        ASSERT_TRUE(x == NULL);
    }
}

/* dump_state without payload addresses (two indexes hold the same entries at different
 * addresses): "pl=0x..." becomes "pl=set". */
static char *dump_cmp(const gw_cindex_t *ix)
{
    char *d = dump_state(ix), *w = d;
    for (const char *r = d; *r != '\0';) {
        if (strncmp(r, "pl=0x", 5) == 0) {
            r += 5; /* at least 12 hex digits follow: the text only shrinks */
            while ((*r >= '0' && *r <= '9') || (*r >= 'a' && *r <= 'f'))
                r++;
            memcpy(w, "pl=set", 6);
            w += 6;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
    return d;
}

/* The first line where two states differ, or NULL when they are the same (static buffer). */
static const char *state_diff(const gw_cindex_t *a, const gw_cindex_t *b)
{
    static char msg[600];
    char *sa = dump_cmp(a), *sb = dump_cmp(b);
    const char *la = sa, *lb = sb;
    const char *res = NULL;
    while (*la != '\0' || *lb != '\0') {
        size_t na = strcspn(la, "\n"), nb = strcspn(lb, "\n");
        if (na != nb || memcmp(la, lb, na) != 0) {
            snprintf(msg, sizeof msg, "\n  %.280s\n  %.280s", la, lb);
            res = msg;
            break;
        }
        la += na + (la[na] != '\0');
        lb += nb + (lb[nb] != '\0');
    }
    free(sa);
    free(sb);
    return res;
}

/* ---- gw_cindex_insert_path -------------------------------------------------------------- */

static size_t copy_drops(drop_rec_t *out)
{
    size_t n = n_drops;
    memcpy(out, drops, n * sizeof *drops);
    n_drops = 0;
    return n;
}

/* One request's entries written in one walk equal the same entries written one by one: the
 * same tree, entries, expiries, TTL classes, drops, insert codes (what is billed as a write)
 * and storage integrals, over random histories that make the path split and branch. */
PC_TEST(insert_path_equals_inserts)
{
    gw_cindex_params_t p = test_params();
    gw_cindex_t *a = mk(&p), *b = mk(&p);
    static drop_rec_t da[MAX_DROPS], db[MAX_DROPS];
    rng_state = 4242;
    uint64_t t = 0;
    for (int it = 0; it < 3000; it++) {
        t += rnd(60);
        uint32_t q[MAX_LEN];
        size_t n = 1 + rnd(MAX_LEN);
        for (size_t k = 0; k < n; k++)
            q[k] = rnd(3);
        uint64_t ns = 1 + rnd(3);
        gw_cindex_point_t pts[12];
        size_t n_pts = 0;
        for (uint32_t at = 1 + rnd(8); at <= n && n_pts < 12; at += 1 + rnd(10))
            pts[n_pts++] = (gw_cindex_point_t){at, (gw_cindex_ttl_t)rnd(2)};
        uint64_t start = t - (t > 0 ? rnd((uint32_t)PC_MIN(t, 2000)) : 0);
        int ra[12], rb[12];
        n_drops = 0;
        for (size_t i = 0; i < n_pts; i++)
            ra[i] = gw_cindex_insert(a, ns, q, pts[i].n_tokens, pts[i].ttl, start, t);
        size_t nda = copy_drops(da);
        ASSERT_EQ(gw_cindex_insert_path(b, ns, q, pts, n_pts, start, t, rb), 0);
        size_t ndb = copy_drops(db);
        for (size_t i = 0; i < n_pts; i++)
            ASSERT_EQ(ra[i], rb[i]);
        ASSERT_EQ(nda, ndb);
        ASSERT_TRUE(memcmp(da, db, nda * sizeof *da) == 0);
        if (rnd(5) == 0) { /* reads and owners interleave as on the loop */
            gw_cindex_read(a, ns, q, n, t, NULL);
            gw_cindex_read(b, ns, q, n, t, NULL);
            uint32_t w = rnd(4);
            gw_cindex_owner_add(a, ns, q, n, w, NULL);
            gw_cindex_owner_add(b, ns, q, n, w, NULL);
        }
        const char *diff = state_diff(a, b);
        if (diff != NULL)
            PC_TEST__FAIL("step %d: states differ:%s", it, diff);
        CHECK(b);
        if (it % 100 == 99) {
            take_rec_t ta = {0}, tb = {0};
            gw_cindex_storage_take(a, t, on_take, &ta);
            gw_cindex_storage_take(b, t, on_take, &tb);
            ASSERT_EQ(ta.n, tb.n);
            for (uint64_t ns2 = 1; ns2 <= 3; ns2++)
                ASSERT_EQ_U64(take_of(&ta, ns2), take_of(&tb, ns2));
        }
    }
    gw_cindex_stats_t sta, stb;
    gw_cindex_stats(a, &sta);
    gw_cindex_stats(b, &stb);
    ASSERT_EQ_U64(sta.n_inserts, stb.n_inserts);
    ASSERT_EQ_U64(sta.n_extends, stb.n_extends);
    ASSERT_TRUE(stb.n_walk_tokens < sta.n_walk_tokens);
    /* Bad points change nothing. */
    gw_cindex_point_t bad[2] = {{5, GW_CINDEX_TTL_5M}, {5, GW_CINDEX_TTL_5M}};
    ASSERT_EQ(gw_cindex_insert_path(b, 1, seq(0, 8), bad, 2, t, t, NULL), PC_ERR_INVAL);
    bad[1].n_tokens = 0;
    ASSERT_EQ(gw_cindex_insert_path(b, 1, seq(0, 8), bad, 2, t, t, NULL), PC_ERR_INVAL);
    ASSERT_EQ(gw_cindex_insert_path(b, 1, NULL, bad, 1, t, t, NULL), PC_ERR_INVAL);
    ASSERT_EQ(gw_cindex_insert_path(b, 1, seq(0, 8), NULL, 0, t, t, NULL), 0);
    gw_cindex_free(a);
    gw_cindex_free(b);
}

/* The loop's share is O(tokens): 20 entries along a 100,000-token prompt walk the prompt once
 * (one entry per message, inserted one by one, walked it twice per entry). */
PC_TEST(insert_path_walks_the_prompt_once)
{
    enum { N = 100000, K = 20 };
    gw_cindex_params_t p = test_params();
    gw_cindex_t *a = mk(&p), *b = mk(&p);
    uint32_t *q = malloc(N * sizeof *q);
    for (size_t i = 0; i < N; i++)
        q[i] = (uint32_t)(i * 2654435761u % 50000);
    gw_cindex_point_t pts[K];
    for (size_t i = 0; i < K; i++)
        pts[i] = (gw_cindex_point_t){(uint32_t)(N - (K - 1 - i) * 50), GW_CINDEX_TTL_5M};
    /* A shorter branch first, so the walk meets a split and existing nodes. */
    ASSERT_EQ(gw_cindex_insert(a, 7, q, N / 2, GW_CINDEX_TTL_1H, 0, 0), 0);
    ASSERT_EQ(gw_cindex_insert(b, 7, q, N / 2, GW_CINDEX_TTL_1H, 0, 0), 0);
    gw_cindex_stats_t s0, s1;
    gw_cindex_stats(a, &s0);
    for (size_t i = 0; i < K; i++)
        ASSERT_EQ(gw_cindex_insert(a, 7, q, pts[i].n_tokens, pts[i].ttl, 1, 1), 0);
    gw_cindex_stats(a, &s1);
    uint64_t one_by_one = s1.n_walk_tokens - s0.n_walk_tokens;
    gw_cindex_stats(b, &s0);
    ASSERT_EQ(gw_cindex_insert_path(b, 7, q, pts, K, 1, 1, NULL), 0);
    gw_cindex_stats(b, &s1);
    uint64_t path = s1.n_walk_tokens - s0.n_walk_tokens;
    printf("  %d entries on a %d-token prompt: %llu tokens walked one by one, %llu in one walk\n",
           K, N, (unsigned long long)one_by_one, (unsigned long long)path);
    ASSERT_EQ_U64(path, (uint64_t)N);
    ASSERT_TRUE(one_by_one >= 2ull * K * (N - K * 50));
    const char *diff = state_diff(a, b);
    if (diff != NULL)
        PC_TEST__FAIL("states differ:%s", diff);
    free(q);
    gw_cindex_free(a);
    gw_cindex_free(b);
}

/* A failed allocation in a path insert leaves the points before it written and nothing else:
 * retrying without failures reaches the state of a clean run. */
PC_TEST(insert_path_failing_allocator)
{
    gw_cindex_params_t p = test_params();
    pc_allocator_t fa = pc_failalloc;
    rng_state = 99;
    for (int it = 0; it < 200; it++) {
        uint32_t q[MAX_LEN];
        size_t n = 8 + rnd(MAX_LEN - 8);
        for (size_t k = 0; k < n; k++)
            q[k] = rnd(3);
        gw_cindex_point_t pts[4] = {{(uint32_t)(n / 4), GW_CINDEX_TTL_1H},
                                    {(uint32_t)(n / 2), GW_CINDEX_TTL_5M},
                                    {(uint32_t)(3 * n / 4), GW_CINDEX_TTL_5M},
                                    {(uint32_t)n, GW_CINDEX_TTL_1H}};
        gw_cindex_t *clean = mk(&p);
        uint32_t pre[MAX_LEN];
        for (size_t k = 0; k < n; k++)
            pre[k] = k < n / 3 ? q[k] : 3 - q[k] % 3;
        gw_cindex_insert(clean, 1, pre, n, GW_CINDEX_TTL_5M, 0, 0);
        ASSERT_EQ(gw_cindex_insert_path(clean, 1, q, pts, 4, 1, 1, NULL), 0);
        char *want = dump_cmp(clean);
        for (long k = 0;; k++) {
            gw_cindex_t *ix = mk(&p);
            gw_cindex_insert(ix, 1, pre, n, GW_CINDEX_TTL_5M, 0, 0);
            int res[4];
            pc_failalloc_left = k;
            pc_allocator_t prev = pc_set_allocator(&fa);
            int rc = gw_cindex_insert_path(ix, 1, q, pts, 4, 1, 1, res);
            pc_set_allocator(&prev);
            CHECK(ix);
            if (rc == 0) {
                gw_cindex_free(ix);
                break;
            }
            ASSERT_EQ(rc, PC_ERR_NOMEM);
            ASSERT_EQ(res[3], PC_ERR_NOMEM);
            ASSERT_EQ(gw_cindex_insert_path(ix, 1, q, pts, 4, 1, 1, NULL), 0);
            char *got = dump_cmp(ix);
            ASSERT_STR_EQ(got, want);
            free(got);
            gw_cindex_free(ix);
        }
        free(want);
        gw_cindex_free(clean);
    }
}

/* gw_cindex_path_entries: every live entry that is a prefix of the query, ascending, the same
 * set gw_cindex_entry_live answers one probe at a time. */
PC_TEST(path_entries_equal_probes)
{
    gw_cindex_params_t p = test_params();
    gw_cindex_t *ix = mk(&p);
    rng_state = 31337;
    uint64_t t = 0;
    for (int it = 0; it < 3000; it++) {
        t += rnd(40);
        uint32_t q[MAX_LEN];
        size_t n = 1 + rnd(MAX_LEN);
        for (size_t k = 0; k < n; k++)
            q[k] = rnd(3);
        uint64_t ns = 1 + rnd(2);
        if (rnd(2) == 0)
            gw_cindex_insert(ix, ns, q, 1 + rnd((uint32_t)n), (gw_cindex_ttl_t)rnd(2), t, t);
        gw_cindex_expire(ix, t);
        uint64_t at = t + rnd(1500); /* probes may look past some expiries */
        uint32_t lens[MAX_LEN], want[MAX_LEN];
        size_t n_want = 0;
        for (size_t k = 1; k <= n; k++)
            if (gw_cindex_entry_live(ix, ns, q, k, at))
                want[n_want++] = (uint32_t)k;
        size_t got = gw_cindex_path_entries(ix, ns, q, n, at, lens, MAX_LEN);
        ASSERT_EQ(got, n_want);
        for (size_t i = 0; i < got; i++)
            ASSERT_EQ(lens[i], want[i]);
        if (got > 1) { /* a short buffer gets the shortest ones */
            ASSERT_EQ(gw_cindex_path_entries(ix, ns, q, n, at, lens, 1), got);
            ASSERT_EQ(lens[0], want[0]);
        }
    }
    gw_cindex_free(ix);
}

PC_TEST_MAIN()

/* Every worker's tier counts of every stored prefix: the observable owner state (the byte
 * counts may differ after a failed demotion: owner bitmaps given to nodes are kept). */
static void tier_state(gw_cindex_t *ix, const uint32_t *q, size_t n, uint64_t ns, uint32_t *out)
{
    for (size_t len = 1; len <= n; len++) {
        gw_cindex_match_t m;
        gw_cindex_match(ix, ns, q, len, ix->now, &m);
        for (int w = 0; w < 4; w++) {
            *out++ = m.held[w];
            *out++ = m.held_g2[w];
            *out++ = m.held_g3[w];
        }
    }
}

PC_TEST(owner_tiers_failing_allocator)
{
    gw_cindex_params_t p = test_params();
    gw_cindex_t *ix = mk(&p);
    rng_state = 91;
    pc_allocator_t fa = pc_failalloc;
    long failures = 0;
    for (int i = 0; i < 400; i++) {
        uint32_t q[24];
        size_t n = 1 + rnd(24);
        for (size_t k = 0; k < n; k++)
            q[k] = rnd(3);
        uint64_t ns = 1 + rnd(2);
        for (size_t e = 1; e <= n; e += 1 + rnd(6))
            ASSERT_TRUE(gw_cindex_insert(ix, ns, q, e, GW_CINDEX_TTL_1H, 0, 0) >= 0);
        uint32_t w = rnd(4);
        if (rnd(2) == 0)
            ASSERT_EQ(gw_cindex_owner_add(ix, ns, q, n, w, NULL), 0);
        static uint32_t before[24 * 12], after[24 * 12];
        tier_state(ix, q, n, ns, before);
        int tier = 2 + (int)rnd(2);
        bool demote = rnd(2) == 0;
        size_t kept = rnd((uint32_t)n);
        int rc;
        for (long k = 0;; k++) {
            pc_failalloc_left = k;
            pc_allocator_t prev = pc_set_allocator(&fa);
            rc = demote ? gw_cindex_owner_demoted(ix, w, ns, q, kept, n, tier)
                        : gw_cindex_owner_add_tier(ix, ns, q, n, w, (gw_cindex_tier_t)tier,
                                                   rnd(2) * 4, NULL);
            pc_set_allocator(&prev);
            if (rc != PC_ERR_NOMEM)
                break;
            failures++;
            tier_state(ix, q, n, ns, after);
            if (memcmp(before, after, n * 12 * sizeof before[0]) != 0)
                PC_TEST__FAIL("op %d: failed allocation %ld changed owners or tiers", i, k);
            CHECK(ix);
        }
        ASSERT_EQ(rc, 0);
        CHECK(ix);
    }
    ASSERT_TRUE(failures > 50);
    gw_cindex_free(ix);
}
