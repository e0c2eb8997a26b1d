/*
 * wire_seal.h — the sealed record layer of an authenticated worker link: every byte after the
 * link handshake (engine/wire.h) travels encrypted and authenticated, in records.
 *
 * Keys. After the CHALLENGE / AUTH exchange both sides know the link secret and both nonces
 * (the gateway's from HELLO, the worker's from CHALLENGE). They derive
 *
 *   master  = HMAC-SHA256(secret, "kvgw-link-v3 keys" || gateway nonce || worker nonce)
 *   gw->wk  = crypto_kdf_derive_from_key(32, id 1, ctx "kvgwlink", master)   (BLAKE2b)
 *   wk->gw  = crypto_kdf_derive_from_key(32, id 2, ctx "kvgwlink", master)
 *
 * one key per direction, fresh for every connection (the nonces are), never sent.
 *
 * Records (one direction's byte stream, back to back):
 *
 *   offset  size  field
 *   0       4     n: u32 little-endian, the bytes that follow; LNK_SEAL_TAG_BYTES + 1 ..
 *                 LNK_SEAL_TAG_BYTES + LNK_SEAL_RECORD_MAX
 *   4       n     ChaCha20-Poly1305 (IETF) of the plaintext with the direction's key; nonce:
 *                 4 zero bytes then the record's number as u64 little-endian (0 for the first
 *                 record of the direction, then 1, 2, ...: never sent, both sides count);
 *                 additional data: the 4 bytes of n. The last 16 bytes are the tag.
 *
 * The plaintexts, in order, are the direction's frame stream (engine/wire.h): a record holds
 * any part of it (a frame of more than LNK_SEAL_RECORD_MAX bytes spans records). A record that
 * does not verify (a changed byte, a record replayed, reordered, dropped or injected: each
 * changes its number or its bytes) ends the connection; so does a length out of range. A
 * receiver buffers at most one record (64 KiB) of bytes it has not verified.
 *
 * Pure functions, no I/O; any thread (one lnk_seal_t per direction, used by one thread).
 */
#ifndef LNK_WIRE_SEAL_H
#define LNK_WIRE_SEAL_H

#include <stddef.h>
#include <stdint.h>

#include "pc_buf.h"
#include "wire.h"

#define LNK_SEAL_KEY_BYTES 32
#define LNK_SEAL_TAG_BYTES 16
#define LNK_SEAL_LEN_BYTES 4
#define LNK_SEAL_RECORD_MAX (64u << 10) /* plaintext bytes per record */

/* One direction: its key and the number of its next record. */
typedef struct lnk_seal {
    uint8_t key[LNK_SEAL_KEY_BYTES];
    uint64_t n_records;
} lnk_seal_t;

/* Derives the two directions (above) from the secret and both nonces. */
void lnk_seal_derive(const uint8_t *secret, size_t secret_len,
                     const uint8_t gateway_nonce[ENG_WIRE_AUTH_BYTES],
                     const uint8_t worker_nonce[ENG_WIRE_AUTH_BYTES], lnk_seal_t *gw_to_wk,
                     lnk_seal_t *wk_to_gw);

/* Appends plain[0..len) to out as records of at most LNK_SEAL_RECORD_MAX plaintext bytes
 * (nothing for len 0) and advances s. Returns 0 or PC_ERR_NOMEM (out and s unchanged). */
int lnk_seal_records(lnk_seal_t *s, const void *plain, size_t len, pc_buf_t *out);

/* Opens the record at the front of in[0..len): returns 1 with its plaintext appended to out
 * and *consumed set to the record's size (s advances); 0 when the record is not complete yet
 * (nothing changes); PC_ERR_PERM (a length out of range: not a sealed stream, or bytes
 * changed; or the record does not verify) or PC_ERR_NOMEM, with a reason in err. After an error the
 * stream is unusable. */
int lnk_seal_open(lnk_seal_t *s, const uint8_t *in, size_t len, size_t *consumed, pc_buf_t *out,
                  char *err, size_t err_len);

/* Zeroes the key. */
void lnk_seal_wipe(lnk_seal_t *s);

#endif
