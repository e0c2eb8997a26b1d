/*
 * ns.h — cache namespaces: the derivation that isolates tenants, and the table of the live ones.
 *
 * A namespace is the scope of every cache look-up and write (DESIGN.md §3): two requests share
 * cached prompts only when they have the same namespace, which is a keyed BLAKE2b of (tenant,
 * model, optional cache_salt) under the gateway's namespace secret. Each part is framed (length
 * prefixes, a flag for the salt's presence), so no two distinct inputs hash the same message:
 * tenant "ab" + salt "c" and tenant "a" + salt "bc" are different namespaces.
 *
 * The table maps a namespace to who it belongs to (tenant, model: what storage billing names)
 * and counts the cache entries it has. A namespace is in the table from its first entry's
 * insertion until it has no entry left and its last storage was metered (gw_ns_tab_sweep, after
 * each storage take): clients choose salts freely, so the table must follow the entries, never
 * the requests.
 */
#ifndef GW_NS_H
#define GW_NS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "pc_u64map.h"

#define GW_NS_KEY_BYTES 32

/* The namespace of (tenant, model, salt) under key. has_salt distinguishes an empty salt from
 * none. Never 0 (0 marks empty slots). Pure: the same inputs give the same namespace. */
uint64_t gw_namespace_of(const uint8_t key[GW_NS_KEY_BYTES], const char *tenant, pc_slice_t model,
                         bool has_salt, pc_slice_t salt);

/* What several gateways compare to know they derive the same namespaces (the registry's
 * PREFIX:nssecret): keyed BLAKE2b-256 of "kvgw-registry-secret-check" under key. It reveals
 * nothing of the key; equal keys give equal checks. */
void gw_namespace_secret_check(const uint8_t key[GW_NS_KEY_BYTES], uint8_t out[32]);

typedef struct gw_ns_info {
    uint64_t ns;
    const char *tenant; /* borrowed: the configuration's string, which outlives the table */
    uint32_t model;     /* index of the configured model */
    uint32_t n_entries; /* cache entries of the namespace in the index */
} gw_ns_info_t;

typedef struct gw_ns_tab {
    pc_u64map_t map; /* ns -> gw_ns_info_t* */
} gw_ns_tab_t;

/* One more cache entry of ns (adds ns with its owner on its first). Returns 0 or PC_ERR_NOMEM
 * (the table is unchanged). */
int gw_ns_tab_ref(gw_ns_tab_t *t, uint64_t ns, const char *tenant, uint32_t model);

/* One entry of ns fewer. The namespace stays (with 0 entries) until gw_ns_tab_sweep, so its
 * last storage can still be billed to its tenant. An unknown ns is ignored. */
void gw_ns_tab_unref(gw_ns_tab_t *t, uint64_t ns);

/* The namespace's record, or NULL. Valid until the next ref/unref/sweep. */
const gw_ns_info_t *gw_ns_tab_lookup(const gw_ns_tab_t *t, uint64_t ns);

/* Removes every namespace with no entry left; returns how many. Call it once their storage was
 * taken (nothing accrues without entries, so nothing is lost). */
size_t gw_ns_tab_sweep(gw_ns_tab_t *t);

static inline size_t gw_ns_tab_count(const gw_ns_tab_t *t)
{
    return pc_u64map_count(&t->map);
}

/* Frees every record. The table is empty and usable afterwards. */
void gw_ns_tab_free(gw_ns_tab_t *t);

#endif
