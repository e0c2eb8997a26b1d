/*
 * wire_seal.c — sealed records of the worker link (format in wire_seal.h).
 */
#include "wire_seal.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "common.h"

#define KEYS_LABEL "kvgw-link-v3 keys"
#define KDF_CTX "kvgwlink" /* crypto_kdf_CONTEXTBYTES (8) characters */

void lnk_seal_derive(const uint8_t *secret, size_t secret_len,
                     const uint8_t gateway_nonce[ENG_WIRE_AUTH_BYTES],
                     const uint8_t worker_nonce[ENG_WIRE_AUTH_BYTES], lnk_seal_t *gw_to_wk,
                     lnk_seal_t *wk_to_gw)
{
    _Static_assert(crypto_kdf_KEYBYTES == crypto_auth_hmacsha256_BYTES, "master key size");
    _Static_assert(LNK_SEAL_KEY_BYTES == crypto_aead_chacha20poly1305_ietf_KEYBYTES, "key size");
    _Static_assert(LNK_SEAL_TAG_BYTES == crypto_aead_chacha20poly1305_ietf_ABYTES, "tag size");
    if (sodium_init() < 0)
        PC_ABORT("libsodium cannot initialize");
    uint8_t master[crypto_kdf_KEYBYTES];
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, secret, secret_len);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)KEYS_LABEL, strlen(KEYS_LABEL));
    crypto_auth_hmacsha256_update(&st, gateway_nonce, ENG_WIRE_AUTH_BYTES);
    crypto_auth_hmacsha256_update(&st, worker_nonce, ENG_WIRE_AUTH_BYTES);
    crypto_auth_hmacsha256_final(&st, master);
    crypto_kdf_derive_from_key(gw_to_wk->key, LNK_SEAL_KEY_BYTES, 1, KDF_CTX, master);
    crypto_kdf_derive_from_key(wk_to_gw->key, LNK_SEAL_KEY_BYTES, 2, KDF_CTX, master);
    gw_to_wk->n_records = wk_to_gw->n_records = 0;
    sodium_memzero(master, sizeof master);
    sodium_memzero(&st, sizeof st);
}

static void put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static void record_nonce(uint64_t n, uint8_t nonce[crypto_aead_chacha20poly1305_ietf_NPUBBYTES])
{
    memset(nonce, 0, 4);
    for (int i = 0; i < 8; i++)
        nonce[4 + i] = (uint8_t)(n >> (8 * i));
}

int lnk_seal_records(lnk_seal_t *s, const void *plain, size_t len, pc_buf_t *out)
{
    size_t n_rec = (len + LNK_SEAL_RECORD_MAX - 1) / LNK_SEAL_RECORD_MAX;
    size_t need = len + n_rec * (LNK_SEAL_LEN_BYTES + LNK_SEAL_TAG_BYTES);
    uint8_t *w = (uint8_t *)pc_buf_reserve(out, need);
    if (w == NULL && need > 0)
        return PC_ERR_NOMEM;
    const uint8_t *p = plain;
    for (size_t off = 0; off < len;) {
        size_t k = PC_MIN(len - off, (size_t)LNK_SEAL_RECORD_MAX);
        uint8_t nonce[crypto_aead_chacha20poly1305_ietf_NPUBBYTES];
        record_nonce(s->n_records++, nonce);
        put_le32(w, (uint32_t)(k + LNK_SEAL_TAG_BYTES));
        unsigned long long clen = 0;
        crypto_aead_chacha20poly1305_ietf_encrypt(w + LNK_SEAL_LEN_BYTES, &clen, p + off, k, w,
                                                  LNK_SEAL_LEN_BYTES, NULL, nonce, s->key);
        w += LNK_SEAL_LEN_BYTES + clen;
        off += k;
    }
    pc_buf_commit(out, need);
    return 0;
}

int lnk_seal_open(lnk_seal_t *s, const uint8_t *in, size_t len, size_t *consumed, pc_buf_t *out,
                  char *err, size_t err_len)
{
    if (len < LNK_SEAL_LEN_BYTES)
        return 0;
    uint32_t n =
        (uint32_t)in[0] | (uint32_t)in[1] << 8 | (uint32_t)in[2] << 16 | (uint32_t)in[3] << 24;
    if (n <= LNK_SEAL_TAG_BYTES || n > LNK_SEAL_TAG_BYTES + LNK_SEAL_RECORD_MAX)
        return pc_err_setf(err, err_len, PC_ERR_PERM,
                           "sealed record %llu: length %u out of range (%u..%u): not a sealed "
                           "link stream, or tampered",
                           (unsigned long long)s->n_records, n, LNK_SEAL_TAG_BYTES + 1,
                           LNK_SEAL_TAG_BYTES + LNK_SEAL_RECORD_MAX);
    if (len - LNK_SEAL_LEN_BYTES < n)
        return 0;
    uint8_t *m = (uint8_t *)pc_buf_reserve(out, n - LNK_SEAL_TAG_BYTES);
    if (m == NULL)
        return pc_err_setf(err, err_len, PC_ERR_NOMEM, "out of memory opening a sealed record");
    uint8_t nonce[crypto_aead_chacha20poly1305_ietf_NPUBBYTES];
    record_nonce(s->n_records, nonce);
    unsigned long long mlen = 0;
    if (crypto_aead_chacha20poly1305_ietf_decrypt(m, &mlen, NULL, in + LNK_SEAL_LEN_BYTES, n, in,
                                                  LNK_SEAL_LEN_BYTES, nonce, s->key) != 0)
        return pc_err_setf(err, err_len, PC_ERR_PERM,
                           "sealed record %llu does not verify: bytes changed, replayed, "
                           "reordered or injected on the way, or the link secrets differ",
                           (unsigned long long)s->n_records);
    s->n_records++;
    pc_buf_commit(out, (size_t)mlen);
    *consumed = LNK_SEAL_LEN_BYTES + n;
    return 1;
}

void lnk_seal_wipe(lnk_seal_t *s)
{
    sodium_memzero(s, sizeof *s);
}
