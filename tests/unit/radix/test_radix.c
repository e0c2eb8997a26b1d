/*
 * test_radix.c — radix/radix.c: unit tests for match/insert/split, TTL, LRU with pins, owner
 * sets, payload splitting, iteration and namespaces; the differential test against the naive
 * reference of radix_model.h over millions of random operations (PC_TEST_SCALE scales it;
 * smaller under the sanitizers); and the failing-allocator test.
 *
 * The file includes radix.c itself so the expiry-cost test can read the heap sizes.
 */
#include "../../../radix/radix.c"

#include "pc_test.h"
#include "radix_model.h"

static rdx_tree_t *new_tree(uint64_t vocab)
{
    rdx_tree_params_t p = rdx_tree_params_default();
    p.vocab_size = vocab;
    rdx_tree_t *t = NULL;
    PC_ASSERT(rdx_tree_init(&p, &t) == 0);
    return t;
}

static void check_ok(rdx_tree_t *t)
{
    char err[256];
    int rc = rdx_tree_check(t, err, sizeof err);
    if (rc != 0)
        PC_TEST__FAIL("invariant broken: %s", err);
}

#define CHECK_TREE(t) PC_TEST_CALL(check_ok(t))

PC_TEST(params_and_widths)
{
    rdx_tree_params_t p = rdx_tree_params_default();
    rdx_tree_t *t = NULL;
    p.max_owners = 0;
    ASSERT_EQ(rdx_tree_init(&p, &t), PC_ERR_INVAL);
    p.max_owners = RDX_MAX_OWNERS + 1;
    ASSERT_EQ(rdx_tree_init(&p, &t), PC_ERR_INVAL);
    p = rdx_tree_params_default();
    p.vocab_size = ((uint64_t)1 << 32) + 1;
    ASSERT_EQ(rdx_tree_init(&p, &t), PC_ERR_INVAL);
    ASSERT_TRUE(t == NULL);
    const uint64_t vocab[] = {0, 1000, 65536, 65537, 128256, 1u << 24, (1u << 24) + 1};
    const int width[] = {4, 2, 2, 3, 3, 3, 4};
    for (size_t i = 0; i < PC_ARRAY_LEN(vocab); i++) {
        t = new_tree(vocab[i]);
        ASSERT_EQ(rdx_tree_token_width(t), width[i]);
        rdx_tree_free(t);
    }
    rdx_tree_free(NULL);
}

PC_TEST(split_as_in_the_header)
{
    rdx_tree_t *t = new_tree(0);
    const uint32_t a[] = {1, 2, 3, 4, 5}, b[] = {1, 2, 3, 9};
    rdx_node_t *na = NULL, *nb = NULL;
    ASSERT_EQ(rdx_tree_insert(t, 7, a, 5, 10, 100, RDX_INSERT_ENTRY, &na), 0);
    ASSERT_EQ(rdx_node_depth(na), 5);
    ASSERT_EQ(rdx_node_len(na), 5);
    ASSERT_EQ(rdx_tree_insert(t, 7, b, 4, 11, 100, 0, &nb), 0);
    CHECK_TREE(t);
    /* The old node keeps its identity and the lower half. */
    ASSERT_EQ(rdx_node_len(na), 2);
    ASSERT_EQ(rdx_node_depth(na), 5);
    rdx_node_t *up = rdx_node_parent(na);
    ASSERT_TRUE(up != NULL && up == rdx_node_parent(nb));
    ASSERT_EQ(rdx_node_depth(up), 3);
    ASSERT_EQ(rdx_node_expiry(up), 0);
    ASSERT_EQ(rdx_node_n_children(up), 2);
    ASSERT_TRUE(rdx_node_parent(up) == NULL);
    uint32_t buf[8];
    ASSERT_EQ(rdx_node_prefix(t, na, buf), 5);
    ASSERT_MEM_EQ(buf, a, sizeof a);
    ASSERT_EQ(rdx_node_tokens(t, na, buf), 2);
    ASSERT_EQ(buf[0], 4);
    ASSERT_EQ(buf[1], 5);

    rdx_match_t m;
    const uint32_t q1[] = {1, 2, 3, 4, 5, 6};
    rdx_tree_match(t, 7, q1, 6, &m);
    ASSERT_EQ(m.n_matched, 5);
    ASSERT_TRUE(m.node == na);
    ASSERT_EQ(m.edge_offset, 2);
    ASSERT_TRUE(m.last_entry == na);
    ASSERT_EQ(m.entry_len, 5);
    ASSERT_EQ(m.n_covered, 5);
    const uint32_t q2[] = {1, 2, 3, 9, 9};
    rdx_tree_match(t, 7, q2, 5, &m);
    ASSERT_EQ(m.n_matched, 4);
    ASSERT_TRUE(m.node == nb);
    ASSERT_TRUE(m.last_entry == NULL);
    /* [1 2 3] is a prefix of the entry [1 2 3 4 5]; [1 2 3 9] is not an entry. */
    ASSERT_EQ(m.n_covered, 3);
    const uint32_t q3[] = {1, 2};
    rdx_tree_match(t, 7, q3, 2, &m);
    ASSERT_EQ(m.n_matched, 2);
    ASSERT_TRUE(m.node == up);
    ASSERT_EQ(m.edge_offset, 2);
    /* Other namespaces see nothing. */
    rdx_tree_match(t, 8, q1, 6, &m);
    ASSERT_EQ(m.n_matched, 0);
    ASSERT_TRUE(m.node == NULL);
    /* Inserting an existing sequence or one ending mid-edge adds no tokens (returns 1). */
    rdx_stats_t st;
    ASSERT_EQ(rdx_tree_insert(t, 7, a, 5, 12, 50, 0, NULL), 1);
    ASSERT_EQ(rdx_tree_insert(t, 7, a, 4, 12, 50, 0, NULL), 1);
    rdx_tree_ns_stats(t, 7, &st);
    ASSERT_EQ(st.n_tokens, 6);
    ASSERT_EQ(st.n_nodes, 4);
    CHECK_TREE(t);
    rdx_tree_free(t);
}

PC_TEST(bad_inputs_change_nothing)
{
    rdx_tree_t *t = new_tree(1000);
    const uint32_t ok[] = {1, 2, 3}, bad[] = {1, 2, 1000};
    rdx_node_t *x = NULL;
    ASSERT_EQ(rdx_tree_insert(t, 1, ok, 3, 0, 10, 0, &x), 0);
    ASSERT_EQ(rdx_tree_insert(t, 1, bad, 3, 0, 10, 0, NULL), PC_ERR_RANGE);
    ASSERT_EQ(rdx_tree_insert(t, 1, ok, 0, 0, 10, 0, NULL), PC_ERR_INVAL);
    ASSERT_EQ(rdx_tree_insert(t, 1, ok, 3, 0, 0, 0, NULL), PC_ERR_INVAL);
    ASSERT_EQ(rdx_tree_insert(t, 1, ok, 3, 0, 10, 0x80, NULL), PC_ERR_INVAL);
    ASSERT_EQ(rdx_tree_insert(t, 1, NULL, 3, 0, 10, 0, NULL), PC_ERR_INVAL);
    ASSERT_EQ(rdx_tree_unpin(t, x), PC_ERR_STATE);
    ASSERT_EQ(rdx_tree_remove_prefix(t, 2, ok, 3), PC_ERR_NOTFOUND);
    ASSERT_EQ(rdx_tree_remove_prefix(t, 1, bad, 3), PC_ERR_NOTFOUND);
    ASSERT_EQ(rdx_tree_owner_add(t, x, 256), PC_ERR_RANGE);
    ASSERT_EQ(rdx_tree_remove(t, NULL), PC_ERR_INVAL);
    /* A query token too large for the packed width must not alias a stored token. */
    const uint32_t alias[] = {1, 2, 3 + 65536};
    rdx_match_t m;
    rdx_tree_match(t, 1, alias, 3, &m);
    ASSERT_EQ(m.n_matched, 2);
    rdx_stats_t st;
    rdx_tree_ns_stats(t, 1, &st);
    ASSERT_EQ(st.n_tokens, 3);
    ASSERT_EQ(st.n_nodes, 1);
    CHECK_TREE(t);
    rdx_tree_free(t);
}

PC_TEST(long_edges_every_width)
{
    /* Mismatches at every offset of long edges, through the vector compares. */
    const uint64_t vocabs[] = {60000, 128256, 0};
    for (size_t v = 0; v < PC_ARRAY_LEN(vocabs); v++) {
        rdx_tree_t *t = new_tree(vocabs[v]);
        uint32_t base[300], q[300];
        for (int i = 0; i < 300; i++)
            base[i] = (uint32_t)((i * 7919u + 13u) % (vocabs[v] ? vocabs[v] : 0xFFFFFFFFu));
        ASSERT_EQ(rdx_tree_insert(t, 1, base, 300, 0, RDX_EXPIRY_NEVER, 0, NULL), 0);
        for (size_t at = 1; at < 300; at++) {
            memcpy(q, base, sizeof q);
            q[at] ^= 1u << (at % (8 * (unsigned)rdx_tree_token_width(t)));
            rdx_match_t m;
            rdx_tree_match(t, 1, q, 300, &m);
            ASSERT_EQ(m.n_matched, at);
            rdx_tree_match(t, 1, q, at, &m);
            ASSERT_EQ(m.n_matched, at);
        }
        rdx_match_t m;
        rdx_tree_match(t, 1, base, 300, &m);
        ASSERT_EQ(m.n_matched, 300);
        rdx_tree_free(t);
    }
}

PC_TEST(high_fanout_children)
{
    /* 5000 children under one node: the child table turns into a hash table, survives
     * removals (backward-shift deletion) and keeps every child reachable. */
    rdx_tree_t *t = new_tree(0);
    uint32_t s[3] = {42, 0, 0};
    for (uint32_t i = 0; i < 5000; i++) {
        s[1] = i * 2654435761u;
        s[2] = i;
        ASSERT_EQ(rdx_tree_insert(t, 1, s, 3, i, RDX_EXPIRY_NEVER, 0, NULL), 0);
    }
    CHECK_TREE(t);
    for (uint32_t i = 0; i < 5000; i += 3) {
        s[1] = i * 2654435761u;
        ASSERT_EQ(rdx_tree_remove_prefix(t, 1, s, 2), 0);
    }
    CHECK_TREE(t);
    for (uint32_t i = 0; i < 5000; i++) {
        s[1] = i * 2654435761u;
        s[2] = i;
        rdx_match_t m;
        rdx_tree_match(t, 1, s, 3, &m);
        ASSERT_EQ(m.n_matched, i % 3 == 0 ? 1 : 3);
    }
    rdx_tree_free(t);
}

static uint64_t n_removed_nodes;
static void count_remove(const rdx_free_event_t *ev, void *ud)
{
    (void)ud;
    if (ev->reason == RDX_FREE_REMOVE)
        n_removed_nodes++;
}

PC_TEST(wide_teardown_frees_every_child_once)
{
    /* Tearing down wide nodes resumes its scan of the child table where the previous child
     * was (kids_first_from): every child must still be freed exactly once, whatever the
     * backward-shift deletions moved. A wide node under the root and a wide root. */
    rdx_tree_params_t p = rdx_tree_params_default();
    p.on_free = count_remove;
    rdx_tree_t *t;
    ASSERT_EQ(rdx_tree_init(&p, &t), 0);
    uint32_t s[3] = {7, 0, 0};
    for (uint32_t i = 0; i < 20000; i++) {
        s[1] = i * 2654435761u;
        s[2] = i;
        ASSERT_EQ(rdx_tree_insert(t, 1, s, 3, 1, RDX_EXPIRY_NEVER, 0, NULL), 0);
        uint32_t r[2] = {i, i ^ 0x5555};
        ASSERT_EQ(rdx_tree_insert(t, 2, r, 2, 1, RDX_EXPIRY_NEVER, 0, NULL), 0);
    }
    CHECK_TREE(t);
    n_removed_nodes = 0;
    ASSERT_EQ(rdx_tree_remove_prefix(t, 1, s, 1), 0);
    ASSERT_EQ(n_removed_nodes, 20001);
    n_removed_nodes = 0;
    ASSERT_EQ(rdx_tree_remove_prefix(t, 2, NULL, 0), 0);
    ASSERT_EQ(n_removed_nodes, 20000);
    rdx_stats_t st;
    rdx_tree_stats(t, &st);
    ASSERT_EQ(st.n_nodes, 0);
    ASSERT_EQ(st.n_tokens, 0);
    ASSERT_EQ(rdx_tree_ns_count(t), 0);
    CHECK_TREE(t);
    rdx_tree_free(t);
}

/* ---- TTL ---- */

static uint64_t n_expired_events, n_expired_tokens;
static void count_expire(const rdx_free_event_t *ev, void *ud)
{
    (void)ud;
    if (ev->reason == RDX_FREE_EXPIRE) {
        n_expired_events++;
        n_expired_tokens += ev->len;
    }
}

PC_TEST(ttl_ancestors_outlive_descendants_and_touch_refreshes)
{
    rdx_tree_params_t p = rdx_tree_params_default();
    p.on_free = count_expire;
    rdx_tree_t *t = NULL;
    ASSERT_EQ(rdx_tree_init(&p, &t), 0);
    n_expired_events = n_expired_tokens = 0;
    const uint32_t s[] = {1, 2, 3, 4, 5, 6, 7, 8};
    rdx_node_t *short_e = NULL, *long_e = NULL;
    /* Entry [1..4] lives until 100, entry [1..8] until 200. */
    ASSERT_EQ(rdx_tree_insert(t, 1, s, 4, 0, 100, RDX_INSERT_ENTRY, &short_e), 0);
    ASSERT_EQ(rdx_tree_insert(t, 1, s, 8, 0, 200, RDX_INSERT_ENTRY, &long_e), 0);
    size_t freed = 99;
    rdx_tree_expire(t, 99, &freed);
    ASSERT_EQ(freed, 0);
    rdx_tree_expire(t, 100, &freed);
    /* The short entry's lifetime ended, but its node carries the long one: nothing freed,
     * the entry mark is gone, the prefix is still matched and covered. */
    ASSERT_EQ(freed, 0);
    ASSERT_EQ(rdx_node_expiry(short_e), 0);
    ASSERT_FALSE(rdx_node_is_entry(short_e));
    rdx_match_t m;
    rdx_tree_match(t, 1, s, 4, &m);
    ASSERT_EQ(m.n_matched, 4);
    ASSERT_EQ(m.n_covered, 4);
    ASSERT_TRUE(m.last_entry == NULL);
    CHECK_TREE(t);
    /* A read refreshes the long entry to 300. */
    ASSERT_EQ(rdx_tree_touch(t, long_e, 150, 300), 0);
    ASSERT_EQ(rdx_node_last_access(short_e), 150);
    rdx_tree_expire(t, 250, &freed);
    ASSERT_EQ(freed, 0);
    /* Touch never shortens a lifetime. */
    ASSERT_EQ(rdx_tree_touch(t, long_e, 160, 260), 0);
    ASSERT_EQ(rdx_node_expiry(long_e), 300);
    rdx_tree_expire(t, 300, &freed);
    /* Bottom-up: the long node, then its now-empty non-terminal parent. */
    ASSERT_EQ(freed, 8);
    ASSERT_EQ(n_expired_events, 2);
    ASSERT_EQ(n_expired_tokens, 8);
    ASSERT_EQ(rdx_tree_ns_count(t), 0);
    CHECK_TREE(t);
    /* RDX_EXPIRY_NEVER is never expired. */
    ASSERT_EQ(rdx_tree_insert(t, 1, s, 3, 0, RDX_EXPIRY_NEVER, 0, NULL), 0);
    rdx_tree_expire(t, UINT64_MAX, &freed);
    ASSERT_EQ(freed, 0);
    rdx_tree_free(t);
}

PC_TEST(ttl_pinned_nodes_wait_for_unpin)
{
    rdx_tree_t *t = new_tree(0);
    const uint32_t s[] = {5, 6, 7, 8};
    rdx_node_t *x = NULL;
    ASSERT_EQ(rdx_tree_insert(t, 1, s, 4, 0, 10, RDX_INSERT_ENTRY, &x), 0);
    ASSERT_EQ(rdx_tree_pin(t, x), 0);
    ASSERT_EQ(rdx_tree_pin(t, x), 0);
    size_t freed = 0;
    rdx_tree_expire(t, 50, &freed);
    ASSERT_EQ(freed, 0);
    ASSERT_EQ(rdx_node_expiry(x), 0);
    ASSERT_FALSE(rdx_node_is_entry(x));
    CHECK_TREE(t);
    rdx_tree_evict(t, 100, &freed);
    ASSERT_EQ(freed, 0);
    ASSERT_EQ(rdx_tree_remove(t, x), PC_ERR_BUSY);
    ASSERT_EQ(rdx_tree_unpin(t, x), 0);
    ASSERT_EQ(rdx_tree_unpin(t, x), 1); /* freed: lifetime over, no children */
    ASSERT_EQ(rdx_tree_ns_count(t), 0);
    CHECK_TREE(t);
    /* A pinned node that is still alive goes back to the LRU when unpinned. */
    ASSERT_EQ(rdx_tree_insert(t, 1, s, 4, 0, 100, 0, &x), 0);
    ASSERT_EQ(rdx_tree_pin(t, x), 0);
    ASSERT_EQ(rdx_tree_unpin(t, x), 0);
    rdx_tree_evict(t, 1, &freed);
    ASSERT_EQ(freed, 4);
    rdx_tree_free(t);
}

PC_TEST(ttl_expiry_cost_is_what_expires)
{
    /* 100k entries with distinct expiries: expiring the first k pops exactly k heap entries
     * and frees exactly those entries; nothing due costs nothing. */
    rdx_tree_t *t = new_tree(0);
    uint32_t s[4];
    for (uint32_t i = 0; i < 100000; i++) {
        s[0] = i % 100;
        s[1] = i;
        s[2] = i * 3;
        s[3] = 1;
        ASSERT_EQ(rdx_tree_insert(t, 1, s, 4, 0, 1000 + i, RDX_INSERT_ENTRY, NULL), 0);
    }
    ASSERT_EQ(t->exp.n, 100000);
    size_t freed = 0;
    rdx_tree_expire(t, 999, &freed);
    ASSERT_EQ(freed, 0);
    ASSERT_EQ(t->exp.n, 100000);
    rdx_tree_expire(t, 1000 + 9, &freed);
    ASSERT_EQ(t->exp.n, 100000 - 10);
    ASSERT_EQ(freed, 10 * 3); /* each entry's own 3 tokens below its shared first token */
    CHECK_TREE(t);
    rdx_tree_expire(t, 1000 + 100000, &freed);
    ASSERT_EQ(t->exp.n, 0);
    ASSERT_EQ(rdx_tree_ns_count(t), 0);
    rdx_tree_free(t);
}

/* ---- LRU ---- */

static uint32_t evicted_order[64];
static int n_evicted;
static void record_evict(const rdx_free_event_t *ev, void *ud)
{
    (void)ud;
    if (ev->reason == RDX_FREE_EVICT && n_evicted < 64)
        evicted_order[n_evicted++] = (uint32_t)ev->depth * 1000 + ev->len;
}

PC_TEST(lru_order_with_pins)
{
    rdx_tree_params_t p = rdx_tree_params_default();
    p.on_free = record_evict;
    rdx_tree_t *t = NULL;
    ASSERT_EQ(rdx_tree_init(&p, &t), 0);
    n_evicted = 0;
    /* Leaves A (t=1), B (t=2), C (t=3) under a shared prefix [9 9]; then B is read. */
    const uint32_t a[] = {9, 9, 1}, b[] = {9, 9, 2, 2}, c[] = {9, 9, 3, 3, 3};
    rdx_node_t *na, *nb, *nc;
    ASSERT_EQ(rdx_tree_insert(t, 1, a, 3, 1, RDX_EXPIRY_NEVER, 0, &na), 0);
    ASSERT_EQ(rdx_tree_insert(t, 1, b, 4, 2, RDX_EXPIRY_NEVER, 0, &nb), 0);
    ASSERT_EQ(rdx_tree_insert(t, 1, c, 5, 3, RDX_EXPIRY_NEVER, 0, &nc), 0);
    ASSERT_EQ(rdx_tree_touch(t, nb, 10, 0), 0);
    /* A is pinned: evicting skips it and its ancestors. */
    ASSERT_EQ(rdx_tree_pin(t, na), 0);
    size_t freed = 0;
    rdx_tree_evict(t, 3, &freed); /* C (3 tokens) is the oldest unpinned leaf */
    ASSERT_EQ(freed, 3);
    ASSERT_EQ(n_evicted, 1);
    ASSERT_EQ(evicted_order[0], 5 * 1000 + 3);
    rdx_tree_evict(t, 1, &freed); /* then B */
    ASSERT_EQ(freed, 2);
    rdx_tree_evict(t, 100, &freed); /* only pinned A and its parent are left */
    ASSERT_EQ(freed, 0);
    CHECK_TREE(t);
    ASSERT_EQ(rdx_tree_unpin(t, na), 0);
    rdx_tree_evict(t, 100, &freed);
    /* A, then its non-terminal parent [9 9] emptied by that. */
    ASSERT_EQ(freed, 3);
    ASSERT_EQ(n_evicted, 4);
    ASSERT_EQ(evicted_order[2], 3 * 1000 + 1);
    ASSERT_EQ(evicted_order[3], 2 * 1000 + 2);
    ASSERT_EQ(rdx_tree_ns_count(t), 0);
    CHECK_TREE(t);
    rdx_tree_free(t);
}

PC_TEST(lru_terminal_parent_becomes_evictable_leaf)
{
    rdx_tree_t *t = new_tree(0);
    const uint32_t s[] = {1, 2, 3, 4};
    rdx_node_t *x, *y;
    ASSERT_EQ(rdx_tree_insert(t, 1, s, 2, 5, RDX_EXPIRY_NEVER, 0, &x), 0);
    ASSERT_EQ(rdx_tree_insert(t, 1, s, 4, 1, RDX_EXPIRY_NEVER, 0, &y), 0);
    /* y's insert touched x at time 1 but x was already at 5: last access only grows. */
    ASSERT_EQ(rdx_node_last_access(x), 5);
    size_t freed = 0;
    rdx_tree_evict(t, 1, &freed);
    ASSERT_EQ(freed, 2);
    rdx_match_t m;
    rdx_tree_match(t, 1, s, 4, &m);
    ASSERT_EQ(m.n_matched, 2);
    CHECK_TREE(t);
    rdx_tree_evict(t, 1, &freed);
    ASSERT_EQ(freed, 2);
    ASSERT_EQ(rdx_tree_ns_count(t), 0);
    rdx_tree_free(t);
}

/* ---- owners ---- */

PC_TEST(owner_sets_and_accounting)
{
    rdx_tree_params_t p = rdx_tree_params_default();
    p.max_owners = 300;
    rdx_tree_t *t = NULL;
    ASSERT_EQ(rdx_tree_init(&p, &t), 0);
    const uint32_t s[] = {1, 2, 3, 4, 5, 6}, u[] = {1, 2, 3, 7};
    rdx_node_t *x, *y;
    ASSERT_EQ(rdx_tree_insert(t, 1, s, 6, 0, RDX_EXPIRY_NEVER, 0, &x), 0);
    for (uint32_t o = 0; o < 300; o += 7)
        ASSERT_EQ(rdx_tree_owner_add(t, x, o), 0);
    ASSERT_EQ(rdx_tree_owner_add(t, x, 299), 0);
    ASSERT_EQ(rdx_tree_owner_add(t, x, 300), PC_ERR_RANGE);
    int64_t o = rdx_tree_owner_next(t, x, 0);
    int count = 0;
    for (; o >= 0; o = rdx_tree_owner_next(t, x, (uint32_t)o + 1)) {
        ASSERT_TRUE(o % 7 == 0 || o == 299);
        count++;
    }
    ASSERT_EQ(count, 43 + 1);
    rdx_stats_t st;
    rdx_tree_owner_stats(t, 287, &st);
    ASSERT_EQ(st.n_tokens, 6);
    ASSERT_EQ(st.n_nodes, 1);
    /* A split copies the owner set: tokens stay, the node count grows. */
    ASSERT_EQ(rdx_tree_insert(t, 1, u, 4, 0, RDX_EXPIRY_NEVER, 0, &y), 0);
    rdx_tree_owner_stats(t, 287, &st);
    ASSERT_EQ(st.n_tokens, 6);
    ASSERT_EQ(st.n_nodes, 2);
    ASSERT_TRUE(rdx_tree_owner_has(t, rdx_node_parent(x), 287));
    ASSERT_FALSE(rdx_tree_owner_has(t, y, 287));
    /* Path add: y and its ancestors. */
    ASSERT_EQ(rdx_tree_owner_add_path(t, y, 100), 0);
    rdx_tree_owner_stats(t, 100, &st);
    ASSERT_EQ(st.n_tokens, 4);
    ASSERT_EQ(st.n_nodes, 2);
    ASSERT_EQ(rdx_tree_owner_del(t, x, 287), 0);
    rdx_tree_owner_stats(t, 287, &st);
    ASSERT_EQ(st.n_tokens, 3);
    CHECK_TREE(t);
    ASSERT_EQ(rdx_tree_remove_prefix(t, 1, s, 1), 0);
    rdx_tree_owner_stats(t, 100, &st);
    ASSERT_EQ(st.n_tokens, 0);
    ASSERT_EQ(st.n_nodes, 0);
    ASSERT_EQ(st.n_bytes, 0);
    CHECK_TREE(t);
    rdx_tree_free(t);
}

/* ---- payloads ---- */

typedef struct run {
    uint32_t first, n; /* tokens [first, first + n) of the sequence, e.g. KV block runs */
} run_t;
static int fail_split;
static long runs_live;
static int run_split(void *p, uint32_t at, void **tail, void *ud)
{
    (void)ud;
    if (fail_split)
        return PC_ERR_NOMEM;
    run_t *h = p, *r = malloc(sizeof *r);
    r->first = h->first + at;
    r->n = h->n - at;
    h->n = at;
    *tail = r;
    runs_live++;
    return 0;
}
static void run_free(void *p, void *ud)
{
    (void)ud;
    runs_live--;
    free(p);
}

PC_TEST(payload_split_and_destroy)
{
    rdx_tree_params_t p = rdx_tree_params_default();
    p.payload_split = run_split;
    p.payload_free = run_free;
    rdx_tree_t *t = NULL;
    ASSERT_EQ(rdx_tree_init(&p, &t), 0);
    runs_live = 0;
    uint32_t s[100];
    for (int i = 0; i < 100; i++)
        s[i] = (uint32_t)i;
    rdx_node_t *x;
    ASSERT_EQ(rdx_tree_insert(t, 1, s, 100, 0, RDX_EXPIRY_NEVER, 0, &x), 0);
    run_t *r = malloc(sizeof *r);
    *r = (run_t){0, 100};
    runs_live++;
    ASSERT_TRUE(rdx_tree_set_payload(t, x, r) == NULL);
    /* A failing split callback fails the insert and changes nothing. */
    fail_split = 1;
    ASSERT_EQ(rdx_tree_insert(t, 1, s, 40, 0, RDX_EXPIRY_NEVER, 0, NULL), PC_ERR_NOMEM);
    fail_split = 0;
    ASSERT_EQ(rdx_node_len(x), 100);
    ASSERT_EQ(r->n, 100);
    rdx_node_t *h;
    ASSERT_EQ(rdx_tree_insert(t, 1, s, 40, 0, RDX_EXPIRY_NEVER, 0, &h), 1);
    ASSERT_TRUE(rdx_node_payload(h) == r);
    ASSERT_EQ(r->n, 40);
    const run_t *tail = rdx_node_payload(x);
    ASSERT_EQ(tail->first, 40);
    ASSERT_EQ(tail->n, 60);
    s[70] = 1000;
    ASSERT_EQ(rdx_tree_insert(t, 1, s, 71, 0, RDX_EXPIRY_NEVER, 0, NULL), 0);
    tail = rdx_node_payload(x);
    ASSERT_EQ(tail->first, 70);
    ASSERT_EQ(tail->n, 30);
    ASSERT_EQ(runs_live, 3);
    CHECK_TREE(t);
    rdx_tree_free(t);
    ASSERT_EQ(runs_live, 0);
    /* Without a split callback a payload edge cannot be split. */
    p.payload_split = NULL;
    ASSERT_EQ(rdx_tree_init(&p, &t), 0);
    ASSERT_EQ(rdx_tree_insert(t, 1, s, 50, 0, RDX_EXPIRY_NEVER, 0, &x), 0);
    r = malloc(sizeof *r);
    runs_live++;
    rdx_tree_set_payload(t, x, r);
    ASSERT_EQ(rdx_tree_insert(t, 1, s, 20, 0, RDX_EXPIRY_NEVER, 0, NULL), PC_ERR_UNSUPPORTED);
    rdx_tree_free(t);
    ASSERT_EQ(runs_live, 0);
}

/* ---- iteration, dump, namespaces ---- */

PC_TEST(iteration_dump_namespaces)
{
    rdx_tree_t *t = new_tree(0);
    const uint32_t a[] = {1, 2, 3}, b[] = {1, 2, 4}, c[] = {5};
    for (uint64_t ns = 1; ns <= 40; ns++) {
        ASSERT_EQ(rdx_tree_insert(t, ns, a, 3, 0, 100 + ns, 0, NULL), 0);
        ASSERT_EQ(rdx_tree_insert(t, ns, b, 3, 0, 100 + ns, 0, NULL), 0);
        ASSERT_EQ(rdx_tree_insert(t, ns, c, 1, 0, 100 + ns, 0, NULL), 0);
    }
    ASSERT_EQ(rdx_tree_ns_count(t), 40);
    CHECK_TREE(t);
    rdx_iter_t it;
    rdx_iter_init(&it, t, 17);
    int n = 0;
    size_t tokens = 0;
    for (rdx_node_t *x; (x = rdx_iter_next(&it)) != NULL; n++) {
        if (rdx_node_parent(x) != NULL)
            ASSERT_EQ(rdx_node_depth(rdx_node_parent(x)), 2);
        tokens += rdx_node_len(x);
    }
    ASSERT_EQ(n, 4);
    ASSERT_EQ(tokens, 5);
    rdx_iter_init(&it, t, 999);
    ASSERT_TRUE(rdx_iter_next(&it) == NULL);
    char *s = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&s, &len);
    rdx_tree_dump(t, f);
    fclose(f);
    ASSERT_TRUE(strstr(s, "ns 17: nodes=4 tokens=5") != NULL);
    ASSERT_TRUE(strstr(s, "[d=3 len=1] 4 | exp=117") != NULL);
    free(s);
    /* Expire half the namespaces; the others are untouched. */
    size_t freed;
    rdx_tree_expire(t, 120, &freed);
    ASSERT_EQ(freed, 20 * 5);
    ASSERT_EQ(rdx_tree_ns_count(t), 20);
    rdx_stats_t st;
    ASSERT_EQ(rdx_tree_ns_stats(t, 3, &st), PC_ERR_NOTFOUND);
    ASSERT_EQ(rdx_tree_ns_stats(t, 33, &st), 0);
    ASSERT_EQ(st.n_tokens, 5);
    ASSERT_EQ(rdx_tree_remove_prefix(t, 33, NULL, 0), 0);
    ASSERT_EQ(rdx_tree_ns_count(t), 19);
    CHECK_TREE(t);
    rdx_tree_free(t);
}

/* Namespace 0 is kept beside the namespace map (which cannot key 0); it must behave like any
 * other id, and so must the largest one, through insert, match, stats, dump, removal and free. */
PC_TEST(namespace_zero_and_max_are_ordinary)
{
    rdx_tree_t *t = new_tree(0);
    const uint32_t a[] = {1, 2, 3}, b[] = {7, 8};
    const uint64_t ids[] = {0, UINT64_MAX, 5};
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(rdx_tree_insert(t, ids[i], i == 1 ? b : a, i == 1 ? 2 : 3, 0, 100, 0, NULL), 0);
    ASSERT_EQ(rdx_tree_ns_count(t), 3);
    CHECK_TREE(t);
    rdx_match_t m;
    ASSERT_EQ(rdx_tree_match(t, 0, a, 3, &m), 0);
    ASSERT_EQ(m.n_matched, 3);
    ASSERT_EQ(rdx_tree_match(t, 0, b, 2, &m), 0);
    ASSERT_EQ(m.n_matched, 0);
    ASSERT_EQ(rdx_tree_match(t, UINT64_MAX, b, 2, &m), 0);
    ASSERT_EQ(m.n_matched, 2);
    rdx_stats_t st;
    ASSERT_EQ(rdx_tree_ns_stats(t, 0, &st), 0);
    ASSERT_EQ(st.n_tokens, 3);
    char *s = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&s, &len);
    rdx_tree_dump(t, f);
    fclose(f);
    ASSERT_TRUE(strstr(s, "ns 0: nodes=1 tokens=3") != NULL);
    ASSERT_TRUE(strstr(s, "ns 18446744073709551615: nodes=1 tokens=2") != NULL);
    free(s);
    ASSERT_EQ(rdx_tree_remove_prefix(t, 0, NULL, 0), 0);
    ASSERT_EQ(rdx_tree_ns_stats(t, 0, &st), PC_ERR_NOTFOUND);
    ASSERT_EQ(rdx_tree_match(t, 0, a, 3, &m), 0);
    ASSERT_EQ(m.n_matched, 0);
    ASSERT_EQ(rdx_tree_ns_count(t), 2);
    CHECK_TREE(t);
    /* Back again, then freed with the tree (the free path drops namespace 0 first). */
    ASSERT_EQ(rdx_tree_insert(t, 0, b, 2, 0, 100, 0, NULL), 0);
    ASSERT_EQ(rdx_tree_ns_count(t), 3);
    CHECK_TREE(t);
    rdx_tree_free(t);
}

/* ---- differential and failing-allocator tests ---- */

#if defined(KVGW_SANITIZE) || !defined(NDEBUG)
#define DIFF_OPS 200000.0
#define DIFF_CHECK_EVERY 1
#else
#define DIFF_OPS 3000000.0
#define DIFF_CHECK_EVERY 256
#endif

static void run_diff(uint64_t vocab, uint64_t seed, long n_ops)
{
    mdl_t *m = calloc(1, sizeof *m);
    ASSERT_EQ(mdl_init(m, vocab, NULL, 0, seed), 0);
    for (long i = 0; i < n_ops && !m->failed; i++) {
        m->check = (i % DIFF_CHECK_EVERY) == 0;
        mdl_step(m, (i % 16) == 0 || DIFF_CHECK_EVERY == 1);
        /* Keep the reference small enough for its linear scans. */
        if (m->ref.n > 400) {
            size_t freed;
            m->in_evict = 1;
            rdx_tree_evict(m->t, 2000, &freed);
            m->in_evict = 0;
        }
    }
    if (m->failed) {
        fprintf(stderr, "  vocab %" PRIu64 " seed %" PRIu64 " after %" PRIu64 " ops: %s\n", vocab,
                seed, m->ops, m->why);
        pc_test__state = 1;
    }
    mdl_check(m);
    ASSERT_FALSE(m->failed);
    mdl_free(m);
    ASSERT_EQ(mdl_payloads_live, 0);
    free(m);
}

PC_TEST(differential_vs_naive_reference)
{
    long n = (long)(DIFF_OPS * pc_test_scale());
    const uint64_t vocabs[] = {50000, 128256, 0};
    for (size_t v = 0; v < PC_ARRAY_LEN(vocabs); v++)
        for (uint64_t seed = 1; seed <= 3; seed++)
            PC_TEST_CALL(run_diff(vocabs[v], seed * 7919 + v, n / 9));
    printf("     differential: %ld random operations against the reference\n", n / 9 * 9);
}

PC_TEST(failing_allocator_every_mutation)
{
    long n = (long)(3000 * pc_test_scale());
    const uint64_t vocabs[] = {128256, 0};
    for (size_t v = 0; v < PC_ARRAY_LEN(vocabs); v++) {
        mdl_t *m = calloc(1, sizeof *m);
        ASSERT_EQ(mdl_init(m, vocabs[v], NULL, 0, 99 + v), 0);
        m->oom = 1;
        m->check = 1;
        for (long i = 0; i < n && !m->failed; i++)
            mdl_step(m, 1);
        if (m->failed)
            fprintf(stderr, "  %s\n", m->why);
        ASSERT_FALSE(m->failed);
        mdl_free(m);
        free(m);
    }
    /* init itself fails cleanly. */
    pc_allocator_t fa = pc_failalloc;
    for (long k = 0; k < 2; k++) {
        pc_failalloc_left = k;
        pc_allocator_t prev = pc_set_allocator(&fa);
        rdx_tree_params_t p = rdx_tree_params_default();
        rdx_tree_t *t = NULL;
        int rc = rdx_tree_init(&p, &t);
        pc_set_allocator(&prev);
        ASSERT_EQ(rc, PC_ERR_NOMEM);
        ASSERT_TRUE(t == NULL);
    }
}

PC_TEST_MAIN()
