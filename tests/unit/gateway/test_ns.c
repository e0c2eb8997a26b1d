/*
 * test_ns.c — gateway/ns.c: the namespace derivation (distinct inputs -> distinct namespaces,
 * no ambiguity between the parts), the table's reference counts and sweep, and the table under
 * a failing allocator. The map under it (common/pc_u64map.c) is tested in
 * tests/unit/common/test_pc_u64map.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "ns.h"
#include "pc_failalloc.h"
#include "pc_test.h"

static const uint8_t KEY[GW_NS_KEY_BYTES] = "test-namespace-secret-0123456789";

static uint64_t nsof(const char *tenant, const char *model, const char *salt)
{
    pc_slice_t m = {model, strlen(model)};
    pc_slice_t s = {salt ? salt : "", salt ? strlen(salt) : 0};
    return gw_namespace_of(KEY, tenant, m, salt != NULL, s);
}

PC_TEST(namespace_same_inputs_same_namespace)
{
    ASSERT_EQ_U64(nsof("acme", "m1", NULL), nsof("acme", "m1", NULL));
    ASSERT_EQ_U64(nsof("acme", "m1", "s"), nsof("acme", "m1", "s"));
    ASSERT_NE(nsof("acme", "m1", NULL), 0);
}

PC_TEST(namespace_distinct_inputs_distinct_namespaces)
{
    const char *tenants[] = {"a", "ab", "b", "acme", ""};
    const char *models[] = {"m", "m1", "bc", ""};
    const char *salts[] = {NULL, "", "c", "bc", "abc"};
    uint64_t seen[PC_ARRAY_LEN(tenants) * PC_ARRAY_LEN(models) * PC_ARRAY_LEN(salts)];
    size_t n = 0;
    for (size_t t = 0; t < PC_ARRAY_LEN(tenants); t++)
        for (size_t m = 0; m < PC_ARRAY_LEN(models); m++)
            for (size_t s = 0; s < PC_ARRAY_LEN(salts); s++) {
                uint64_t v = nsof(tenants[t], models[m], salts[s]);
                for (size_t k = 0; k < n; k++)
                    ASSERT_NE(seen[k], v);
                seen[n++] = v;
            }
}

PC_TEST(namespace_parts_are_framed)
{
    /* Moving bytes between parts changes the namespace. */
    ASSERT_NE(nsof("ab", "m", "c"), nsof("a", "m", "bc"));
    ASSERT_NE(nsof("ab", "c", NULL), nsof("a", "bc", NULL));
    ASSERT_NE(nsof("a", "mb", "c"), nsof("a", "m", "bc"));
    /* An empty salt is not no salt. */
    ASSERT_NE(nsof("a", "m", ""), nsof("a", "m", NULL));
    /* The key is part of it. */
    uint8_t k2[GW_NS_KEY_BYTES];
    memcpy(k2, KEY, sizeof k2);
    k2[0] ^= 1;
    pc_slice_t m = {"m", 1}, s = {"", 0};
    ASSERT_NE(gw_namespace_of(k2, "a", m, false, s), gw_namespace_of(KEY, "a", m, false, s));
}

/* The registry's secret check (PREFIX:nssecret): keyed BLAKE2b-256 of a fixed label, the
 * known answer computed independently (Python's hashlib.blake2b(..., key=KEY, digest_size=32));
 * another key, another check. */
PC_TEST(secret_check_known_answer)
{
    static const char want[] = "b7cca2b49cc525ae2075ef73bbdeb5f3829d51fb4883c8237af73a763a817b51";
    uint8_t out[32], other[32];
    gw_namespace_secret_check(KEY, out);
    char hex[65];
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", out[i]);
    ASSERT_STR_EQ(hex, want);
    uint8_t key2[GW_NS_KEY_BYTES];
    memcpy(key2, KEY, sizeof key2);
    key2[GW_NS_KEY_BYTES - 1] ^= 1;
    gw_namespace_secret_check(key2, other);
    ASSERT_TRUE(memcmp(out, other, sizeof out) != 0);
}

PC_TEST(ns_table_follows_entries)
{
    gw_ns_tab_t t = {0};
    /* Many salts, two entries each: one record each while they live. */
    for (uint64_t i = 1; i <= 1000; i++) {
        ASSERT_EQ(gw_ns_tab_ref(&t, i * 7919, "tenant", 0), 0);
        ASSERT_EQ(gw_ns_tab_ref(&t, i * 7919, "tenant", 0), 0);
    }
    ASSERT_EQ_U64(gw_ns_tab_count(&t), 1000);
    const gw_ns_info_t *info = gw_ns_tab_lookup(&t, 7919);
    ASSERT_TRUE(info != NULL);
    ASSERT_STR_EQ(info->tenant, "tenant");
    ASSERT_EQ_U64(info->n_entries, 2);
    /* Entries drop: the records stay until the sweep (their storage is still billed). */
    for (uint64_t i = 1; i <= 1000; i++) {
        gw_ns_tab_unref(&t, i * 7919);
        if (i % 2 == 0)
            gw_ns_tab_unref(&t, i * 7919);
    }
    ASSERT_EQ_U64(gw_ns_tab_count(&t), 1000);
    ASSERT_EQ_U64(gw_ns_tab_lookup(&t, 2 * 7919)->n_entries, 0);
    ASSERT_EQ_U64(gw_ns_tab_sweep(&t), 500);
    ASSERT_EQ_U64(gw_ns_tab_count(&t), 500);
    for (uint64_t i = 1; i <= 1000; i++)
        ASSERT_EQ(gw_ns_tab_lookup(&t, i * 7919) != NULL, i % 2 == 1);
    for (uint64_t i = 1; i <= 1000; i += 2)
        gw_ns_tab_unref(&t, i * 7919);
    ASSERT_EQ_U64(gw_ns_tab_sweep(&t), 500);
    ASSERT_EQ_U64(gw_ns_tab_count(&t), 0);
    ASSERT_EQ_U64(t.map.cap, 0); /* back to its base size: nothing allocated */
    gw_ns_tab_unref(&t, 12345);  /* unknown: ignored */
    gw_ns_tab_free(&t);
}

PC_TEST(failing_allocator_leaves_table_unchanged)
{
    pc_allocator_t fa = pc_failalloc;
    gw_ns_tab_t t = {0};
    long failures = 0;
    for (uint64_t i = 1; i <= 300; i++) {
        int rc;
        for (long k = 0;; k++) {
            pc_failalloc_left = k;
            pc_allocator_t prev = pc_set_allocator(&fa);
            rc = gw_ns_tab_ref(&t, i, "t", 1);
            pc_set_allocator(&prev);
            if (rc != PC_ERR_NOMEM)
                break;
            failures++;
            ASSERT_EQ_U64(gw_ns_tab_count(&t), i - 1);
            ASSERT_TRUE(gw_ns_tab_lookup(&t, i) == NULL);
        }
        ASSERT_EQ(rc, 0);
        ASSERT_EQ_U64(gw_ns_tab_lookup(&t, i)->n_entries, 1);
    }
    ASSERT_TRUE(failures >= 300); /* every first ref allocates its record */
    /* Deleting under a failing allocator: a failed shrink keeps a valid table. */
    pc_failalloc_left = 0;
    pc_allocator_t prev = pc_set_allocator(&fa);
    for (uint64_t i = 1; i <= 300; i++)
        gw_ns_tab_unref(&t, i);
    ASSERT_EQ_U64(gw_ns_tab_sweep(&t), 300);
    pc_set_allocator(&prev);
    ASSERT_EQ_U64(gw_ns_tab_count(&t), 0);
    gw_ns_tab_free(&t);
}

PC_TEST_MAIN()
