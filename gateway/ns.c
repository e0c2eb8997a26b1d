/*
 * ns.c — see ns.h.
 */
#include "ns.h"

#include <sodium.h>
#include <string.h>

uint64_t gw_namespace_of(const uint8_t key[GW_NS_KEY_BYTES], const char *tenant, pc_slice_t model,
                         bool has_salt, pc_slice_t salt)
{
    crypto_generichash_state st;
    uint8_t out[16];
    crypto_generichash_init(&st, key, GW_NS_KEY_BYTES, sizeof out);
    uint32_t n = (uint32_t)strlen(tenant);
    crypto_generichash_update(&st, (const uint8_t *)&n, sizeof n);
    crypto_generichash_update(&st, (const uint8_t *)tenant, n);
    n = (uint32_t)model.len;
    crypto_generichash_update(&st, (const uint8_t *)&n, sizeof n);
    crypto_generichash_update(&st, (const uint8_t *)model.base, model.len);
    uint8_t flag = has_salt ? 1 : 0;
    crypto_generichash_update(&st, &flag, 1);
    if (has_salt) /* the last part: its end is the message's end */
        crypto_generichash_update(&st, (const uint8_t *)salt.base, salt.len);
    crypto_generichash_final(&st, out, sizeof out);
    uint64_t ns;
    memcpy(&ns, out, sizeof ns);
    return ns ? ns : 1;
}

int gw_ns_tab_ref(gw_ns_tab_t *t, uint64_t ns, const char *tenant, uint32_t model)
{
    gw_ns_info_t *info = pc_u64map_get(&t->map, ns);
    if (info != NULL) {
        info->n_entries++;
        return 0;
    }
    info = pc_malloc(sizeof *info);
    if (info == NULL)
        return PC_ERR_NOMEM;
    *info = (gw_ns_info_t){ns, tenant, model, 1};
    int rc = pc_u64map_put(&t->map, ns, info);
    if (rc != 0)
        pc_free(info);
    return rc;
}

void gw_ns_tab_unref(gw_ns_tab_t *t, uint64_t ns)
{
    gw_ns_info_t *info = pc_u64map_get(&t->map, ns);
    if (info != NULL && PC_ALWAYS(info->n_entries > 0))
        info->n_entries--;
}

const gw_ns_info_t *gw_ns_tab_lookup(const gw_ns_tab_t *t, uint64_t ns)
{
    return pc_u64map_get(&t->map, ns);
}

size_t gw_ns_tab_sweep(gw_ns_tab_t *t)
{
    size_t removed = 0;
    /* A deletion shifts later entries of the run back into slot i: look at i again. Entries
     * that wrap around may be seen twice, which is harmless; a shrink starts over. */
    for (size_t i = 0; i < t->map.cap;) {
        gw_ns_info_t *info = t->map.slots[i].value;
        if (t->map.slots[i].key != 0 && info->n_entries == 0) {
            size_t cap = t->map.cap;
            pc_u64map_del(&t->map, info->ns);
            pc_free(info);
            removed++;
            if (t->map.cap != cap) /* it shrank: the slots moved */
                i = 0;
            continue;
        }
        i++;
    }
    return removed;
}

void gw_ns_tab_free(gw_ns_tab_t *t)
{
    for (size_t i = 0; i < t->map.cap; i++)
        if (t->map.slots[i].key != 0)
            pc_free(t->map.slots[i].value);
    pc_u64map_free(&t->map);
}

void gw_namespace_secret_check(const uint8_t key[GW_NS_KEY_BYTES], uint8_t out[32])
{
    static const char msg[] = "kvgw-registry-secret-check";
    crypto_generichash(out, 32, (const unsigned char *)msg, sizeof msg - 1, key, GW_NS_KEY_BYTES);
}
