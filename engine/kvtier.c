/*
 * kvtier.c — the KV tier store (kvtier.h has the contract and the record format).
 *
 * Invariants, under t->mu: every indexed record is in the hash (by the first 8 bytes of its
 * name, chained for the rare equal keys) and in the LRU list (head = least recent); t->bytes is
 * the sum of their sizes and stays <= max_bytes after every put; on disk, every indexed record
 * has its final file, written whole before it was renamed there. File reads and writes run
 * without the lock: a put writes its temp file first and takes the lock only to make room and
 * rename; a get opens the file under the lock and reads it after (an eviction may unlink it
 * meanwhile; the open file stays whole), then takes the lock again to count and, for a bad
 * record, to delete it if it is still the same record (its generation).
 */
#define _GNU_SOURCE /* O_DIRECT */
#include "kvtier.h"

#include "common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#define KVT_ALIGN 4096u
#define KVT_FIXED 160u /* the head's fixed fields; the tokens follow */
#define KVT_MAGIC "KVGWKVB"
#define KVT_POOL_BUFS 4 /* aligned record buffers kept for reuse */

typedef struct kvt_ent {
    eng_kvtier_name_t name, parent;
    uint64_t ns;
    uint32_t block_index, n_tokens;
    int32_t *tokens;             /* [n_tokens] */
    uint64_t bytes;              /* against the budget */
    uint64_t gen;                /* distinguishes a record from a later one of the same name */
    uint64_t mtime_ns;           /* open only: the LRU order of a scan */
    void *host;                  /* HOST: the payload */
    uint32_t refs;               /* HOST: eng_kvtier_host_ref loans */
    struct kvt_ent *prev, *next; /* LRU */
    struct kvt_ent *hnext;       /* same hash key */
} kvt_ent_t;

typedef struct kvt_buf {
    void *raw;
    uint8_t *p; /* 4096-aligned, t->rec_max bytes */
} kvt_buf_t;

struct eng_kvtier {
    eng_kvtier_params_t p;
    char *dir;
    uint8_t key[ENG_KVTIER_KEY_BYTES];
    int encrypted;
    uint64_t key_id;
    uint32_t payload_pad; /* payload bytes rounded up to KVT_ALIGN */
    size_t rec_max;       /* the largest record file */
    int direct;
    int lock_fd; /* DISK: DIR/LOCK, flock'ed while open (-1 before) */

    pthread_mutex_t mu;
    pc_u64map_t map;
    kvt_ent_t *lru_head, *lru_tail;
    uint64_t bytes, n_records, next_gen, tmp_seq;
    eng_kvtier_stats_t st;
    eng_kvtier_evict_fn evict_fn;
    void *evict_ud;
    kvt_buf_t bufs[KVT_POOL_BUFS];
    int n_bufs;
};

/* ---- names ---- */

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_le64(const uint8_t *p)
{
    return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32;
}

void eng_kvtier_seed(const eng_kvtier_ident_t *id, eng_kvtier_name_t *out)
{
    static const char dom[] = "kvgw-kv-v1";
    uint8_t m[sizeof dom - 1 + 8 + 4 + 4 + 4 + 8];
    memcpy(m, dom, sizeof dom - 1);
    uint8_t *q = m + sizeof dom - 1;
    put_le64(q, id->model_fp);
    put_le32(q + 8, id->kv_dtype);
    put_le32(q + 12, id->layout_version);
    put_le32(q + 16, id->block_tokens);
    put_le64(q + 20, id->ns);
    crypto_generichash(out->b, sizeof out->b, m, sizeof m, NULL, 0);
}

void eng_kvtier_name_next(const eng_kvtier_name_t *prev, const int32_t *tokens, uint32_t n_tokens,
                          eng_kvtier_name_t *out)
{
    crypto_generichash_state st;
    uint8_t chunk[256];
    crypto_generichash_init(&st, NULL, 0, sizeof out->b);
    crypto_generichash_update(&st, prev->b, sizeof prev->b);
    for (uint32_t i = 0; i < n_tokens;) {
        uint32_t k = 0;
        for (; k < sizeof chunk / 4 && i < n_tokens; k++, i++)
            put_le32(chunk + 4 * k, (uint32_t)tokens[i]);
        crypto_generichash_update(&st, chunk, 4 * (size_t)k);
    }
    crypto_generichash_final(&st, out->b, sizeof out->b);
}

uint32_t eng_kvtier_chain(const eng_kvtier_ident_t *id, const int32_t *tokens, uint32_t n_tokens,
                          eng_kvtier_name_t *names, uint32_t max_names)
{
    eng_kvtier_name_t prev;
    uint32_t n = 0, bt = id->block_tokens;
    if (bt == 0)
        return 0;
    eng_kvtier_seed(id, &prev);
    for (uint32_t at = 0; at < n_tokens && n < max_names; at += bt, n++) {
        uint32_t k = n_tokens - at < bt ? n_tokens - at : bt;
        eng_kvtier_name_next(&prev, tokens + at, k, &names[n]);
        prev = names[n];
    }
    return n;
}

char *eng_kvtier_name_hex(const eng_kvtier_name_t *name, char hex[65])
{
    static const char d[] = "0123456789abcdef";
    for (int i = 0; i < ENG_KVTIER_NAME_BYTES; i++) {
        hex[2 * i] = d[name->b[i] >> 4];
        hex[2 * i + 1] = d[name->b[i] & 15];
    }
    hex[64] = '\0';
    return hex;
}

static int name_is_zero(const eng_kvtier_name_t *n)
{
    static const eng_kvtier_name_t zero;
    return memcmp(n, &zero, sizeof zero) == 0;
}

/* The chain's own rule: block 0 has no parent; a later block is H(parent | tokens). */
static int chain_ok(const eng_kvtier_name_t *name, const eng_kvtier_name_t *parent,
                    uint32_t block_index, const int32_t *tokens, uint32_t n_tokens)
{
    if (block_index == 0)
        return name_is_zero(parent);
    eng_kvtier_name_t want;
    eng_kvtier_name_next(parent, tokens, n_tokens, &want);
    return sodium_memcmp(want.b, name->b, sizeof want.b) == 0;
}

/* ---- sizes ---- */

static size_t align_up(size_t v)
{
    return (v + KVT_ALIGN - 1) / KVT_ALIGN * KVT_ALIGN;
}

static size_t head_bytes(uint32_t n_tokens)
{
    return align_up(KVT_FIXED + 4 * (size_t)n_tokens);
}

uint64_t eng_kvtier_record_bytes(const eng_kvtier_t *t, uint32_t n_tokens)
{
    if (t->p.kind == ENG_KVTIER_HOST)
        return t->p.payload_bytes;
    return head_bytes(n_tokens) + t->payload_pad;
}

/* ---- the record's bytes ---- */

enum { KVT_OK = 0, KVT_CORRUPT = 1, KVT_STALE = 2, KVT_SKIP = 3 /* unreadable now: left alone */ };

typedef struct kvt_head {
    uint32_t flags;
    eng_kvtier_name_t name, parent;
    uint64_t ns;
    uint32_t block_index, n_tokens;
} kvt_head_t;

static void nonce_of(const uint8_t *head, uint8_t which, uint8_t nonce[24])
{
    memcpy(nonce, head + 112, 16);
    memset(nonce + 16, 0, 8);
    nonce[16] = which;
}

static void xxh_canon(XXH128_hash_t h, uint8_t out[16])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    memcpy(out, c.digest, 16);
}

/* The head check: XXH3-128 of bytes [0, 128) and the tb token bytes. */
static void head_sum(const uint8_t *buf, size_t tb, uint8_t out[16])
{
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, buf, 128);
    XXH3_128bits_update(&st, buf + KVT_FIXED, tb);
    xxh_canon(XXH3_128bits_digest(&st), out);
}

/* The record check: XXH3-128 of bytes [0, 144), the token bytes and the payload. */
static void rec_sum(const uint8_t *buf, size_t tb, const uint8_t *payload, size_t pb,
                    uint8_t out[16])
{
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, buf, 144);
    XXH3_128bits_update(&st, buf + KVT_FIXED, tb);
    XXH3_128bits_update(&st, payload, pb);
    xxh_canon(XXH3_128bits_digest(&st), out);
}

/* Writes the whole record (head, tokens, payload, padding) into buf[record size], zeroed by
 * the caller. Cannot fail. */
static void rec_encode(const eng_kvtier_t *t, const eng_kvtier_rec_t *rec, const void *payload,
                       uint8_t *buf)
{
    size_t hb = head_bytes(rec->n_tokens), tb = 4 * (size_t)rec->n_tokens;
    memcpy(buf, KVT_MAGIC, 8);
    put_le32(buf + 8, ENG_KVTIER_FORMAT);
    put_le32(buf + 12, t->encrypted ? 1u : 0u);
    memcpy(buf + 16, rec->name.b, 32);
    memcpy(buf + 48, rec->parent.b, 32);
    put_le64(buf + 80, rec->ns);
    put_le32(buf + 88, rec->block_index);
    put_le32(buf + 92, rec->n_tokens);
    put_le32(buf + 96, t->p.payload_bytes);
    put_le32(buf + 100, (uint32_t)hb);
    for (uint32_t i = 0; i < rec->n_tokens; i++)
        put_le32(buf + KVT_FIXED + 4 * (size_t)i, (uint32_t)rec->tokens[i]);
    if (t->encrypted) {
        uint8_t nonce[24];
        put_le64(buf + 104, t->key_id);
        randombytes_buf(buf + 112, 16);
        nonce_of(buf, 0, nonce);
        crypto_aead_xchacha20poly1305_ietf_encrypt_detached(
            buf + KVT_FIXED, buf + 128, NULL, buf + KVT_FIXED, tb, buf, 128, NULL, nonce, t->key);
        nonce_of(buf, 1, nonce);
        crypto_aead_xchacha20poly1305_ietf_encrypt_detached(
            buf + hb, buf + 144, NULL, payload, t->p.payload_bytes, buf, 144, NULL, nonce, t->key);
        return;
    }
    memcpy(buf + hb, payload, t->p.payload_bytes);
    head_sum(buf, tb, buf + 128);
    rec_sum(buf, tb, buf + hb, t->p.payload_bytes, buf + 144);
}

static int all_zero(const uint8_t *p, size_t n)
{
    uint8_t acc = 0;
    for (size_t i = 0; i < n; i++)
        acc |= p[i];
    return acc == 0;
}

/* Checks a head section buf[len] (len >= its head bytes, or the call says CORRUPT) of a file of
 * file_bytes bytes and writes its fields and its clear tokens (tokens[block_tokens]). Returns
 * KVT_OK, KVT_CORRUPT or KVT_STALE (a sound record this store cannot serve). */
static int head_decode(const eng_kvtier_t *t, const uint8_t *buf, size_t len, uint64_t file_bytes,
                       kvt_head_t *h, int32_t *tokens)
{
    if (len < KVT_FIXED || memcmp(buf, KVT_MAGIC, 8) != 0)
        return KVT_CORRUPT;
    if (get_le32(buf + 8) != ENG_KVTIER_FORMAT)
        return KVT_STALE;
    h->flags = get_le32(buf + 12);
    memcpy(h->name.b, buf + 16, 32);
    memcpy(h->parent.b, buf + 48, 32);
    h->ns = get_le64(buf + 80);
    h->block_index = get_le32(buf + 88);
    h->n_tokens = get_le32(buf + 92);
    uint32_t pb = get_le32(buf + 96), hb = get_le32(buf + 100);
    if (h->flags > 1 || h->n_tokens == 0 || h->n_tokens > ENG_KVTIER_MAX_TOKENS ||
        hb != head_bytes(h->n_tokens) || pb == 0 || pb > ENG_KVTIER_MAX_PAYLOAD ||
        file_bytes != hb + align_up(pb))
        return KVT_CORRUPT;
    size_t tb = 4 * (size_t)h->n_tokens;
    if (len < hb || !all_zero(buf + KVT_FIXED + tb, hb - KVT_FIXED - tb) ||
        (h->flags == 0 && !all_zero(buf + 104, 24)))
        return KVT_CORRUPT; /* every byte of a record is checked, padding included */
    /* A plain record's checksum is checked before deciding it is stale, so that a flipped
     * byte reads as corrupt; a sealed one under another key (or none) cannot be checked. */
    uint8_t clear[4 * ENG_KVTIER_MAX_TOKENS];
    if (h->flags == 0) {
        uint8_t sum[16];
        head_sum(buf, tb, sum);
        if (memcmp(sum, buf + 128, 16) != 0)
            return KVT_CORRUPT;
    }
    if (h->n_tokens > t->p.block_tokens || pb != t->p.payload_bytes ||
        h->flags != (unsigned)t->encrypted || (t->encrypted && get_le64(buf + 104) != t->key_id))
        return KVT_STALE;
    if (t->encrypted) {
        uint8_t nonce[24];
        nonce_of(buf, 0, nonce);
        if (crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
                clear, NULL, buf + KVT_FIXED, tb, buf + 128, buf, 128, nonce, t->key) != 0)
            return KVT_CORRUPT;
    } else {
        memcpy(clear, buf + KVT_FIXED, tb);
    }
    for (uint32_t i = 0; i < h->n_tokens; i++)
        tokens[i] = (int32_t)get_le32(clear + 4 * (size_t)i);
    if (!chain_ok(&h->name, &h->parent, h->block_index, tokens, h->n_tokens))
        return KVT_CORRUPT;
    return KVT_OK;
}

/* Checks a whole record against the name and tokens asked for and leaves its clear payload in
 * payload. head[hb] is the record's head section; src is its payload section: either buf + hb of
 * the same buffer (with its padding, read through a bounce buffer) or payload itself (read there
 * directly: no padding then, and an encrypted payload is opened in place). Returns KVT_OK or
 * KVT_CORRUPT (a record holding other tokens under the right name is corrupt: the name is a
 * hash of its tokens). */
static int rec_decode(const eng_kvtier_t *t, const uint8_t *head, const uint8_t *src,
                      uint64_t file_bytes, const eng_kvtier_name_t *name, const int32_t *tokens,
                      uint32_t n_tokens, void *payload)
{
    kvt_head_t h;
    int32_t got[ENG_KVTIER_MAX_TOKENS];
    size_t hb = head_bytes(n_tokens), tb = 4 * (size_t)n_tokens;
    if (head_decode(t, head, hb, file_bytes, &h, got) != KVT_OK)
        return KVT_CORRUPT;
    if (memcmp(h.name.b, name->b, 32) != 0 || h.n_tokens != n_tokens ||
        memcmp(got, tokens, 4 * (size_t)n_tokens) != 0)
        return KVT_CORRUPT;
    if (src != payload && !all_zero(src + t->p.payload_bytes, t->payload_pad - t->p.payload_bytes))
        return KVT_CORRUPT;
    if (t->encrypted) {
        uint8_t nonce[24];
        nonce_of(head, 1, nonce);
        if (crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
                payload, NULL, src, t->p.payload_bytes, head + 144, head, 144, nonce, t->key) != 0)
            return KVT_CORRUPT;
        return KVT_OK;
    }
    uint8_t sum[16];
    rec_sum(head, tb, src, t->p.payload_bytes, sum);
    if (memcmp(sum, head + 144, 16) != 0)
        return KVT_CORRUPT;
    if (src != payload)
        memcpy(payload, src, t->p.payload_bytes);
    return KVT_OK;
}

/* ---- buffers ---- */

static int buf_take(eng_kvtier_t *t, kvt_buf_t *b)
{
    pthread_mutex_lock(&t->mu);
    if (t->n_bufs > 0) {
        *b = t->bufs[--t->n_bufs];
        pthread_mutex_unlock(&t->mu);
        return 0;
    }
    pthread_mutex_unlock(&t->mu);
    b->raw = pc_malloc(t->rec_max + KVT_ALIGN);
    if (b->raw == NULL)
        return PC_ERR_NOMEM;
    b->p = (uint8_t *)(((uintptr_t)b->raw + KVT_ALIGN - 1) / KVT_ALIGN * KVT_ALIGN);
    return 0;
}

static void buf_give(eng_kvtier_t *t, kvt_buf_t *b)
{
    pthread_mutex_lock(&t->mu);
    if (t->n_bufs < KVT_POOL_BUFS) {
        t->bufs[t->n_bufs++] = *b;
        b->raw = NULL;
    }
    pthread_mutex_unlock(&t->mu);
    pc_free(b->raw);
}

/* ---- the index (t->mu held) ---- */

static uint64_t key_of(const eng_kvtier_name_t *n)
{
    uint64_t k = get_le64(n->b);
    return k != 0 ? k : 1;
}

static kvt_ent_t *idx_find(eng_kvtier_t *t, const eng_kvtier_name_t *n)
{
    for (kvt_ent_t *e = pc_u64map_get(&t->map, key_of(n)); e != NULL; e = e->hnext)
        if (memcmp(e->name.b, n->b, 32) == 0)
            return e;
    return NULL;
}

static void lru_unlink(eng_kvtier_t *t, kvt_ent_t *e)
{
    if (e->prev != NULL)
        e->prev->next = e->next;
    else
        t->lru_head = e->next;
    if (e->next != NULL)
        e->next->prev = e->prev;
    else
        t->lru_tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push(eng_kvtier_t *t, kvt_ent_t *e)
{
    e->prev = t->lru_tail;
    e->next = NULL;
    if (t->lru_tail != NULL)
        t->lru_tail->next = e;
    else
        t->lru_head = e;
    t->lru_tail = e;
}

static void lru_touch(eng_kvtier_t *t, kvt_ent_t *e)
{
    lru_unlink(t, e);
    lru_push(t, e);
}

/* Adds e (fields set) to the hash and as the most recent; 0 or PC_ERR_NOMEM (nothing done). */
static int idx_add(eng_kvtier_t *t, kvt_ent_t *e)
{
    uint64_t k = key_of(&e->name);
    kvt_ent_t *first = pc_u64map_get(&t->map, k);
    if (first != NULL) {
        e->hnext = first->hnext;
        first->hnext = e;
    } else {
        e->hnext = NULL;
        if (pc_u64map_put(&t->map, k, e) != 0)
            return PC_ERR_NOMEM;
    }
    e->gen = ++t->next_gen;
    lru_push(t, e);
    t->bytes += e->bytes;
    t->n_records++;
    return 0;
}

static void ent_free(eng_kvtier_t *t, kvt_ent_t *e)
{
    if (e == NULL)
        return;
    if (e->host != NULL) {
        if (t->p.host_free != NULL)
            t->p.host_free(t->p.host_ud, e->host, t->p.payload_bytes);
        else
            pc_free(e->host);
    }
    pc_free(e->tokens);
    pc_free(e);
}

static void path_of(const eng_kvtier_t *t, const eng_kvtier_name_t *n, char *out, size_t len)
{
    char hex[65];
    eng_kvtier_name_hex(n, hex);
    snprintf(out, len, "%s/%.2s/%s.kvb", t->dir, hex, hex);
}

/* e's description for the callbacks (its tokens valid while e is). */
static eng_kvtier_rec_t ent_rec(const kvt_ent_t *e)
{
    return (eng_kvtier_rec_t){.name = e->name,
                              .parent = e->parent,
                              .ns = e->ns,
                              .block_index = e->block_index,
                              .n_tokens = e->n_tokens,
                              .tokens = e->tokens};
}

/* Removes e from the index (and its file), reports it, frees it. */
static void idx_drop(eng_kvtier_t *t, kvt_ent_t *e, int reason)
{
    uint64_t k = key_of(&e->name);
    kvt_ent_t *first = pc_u64map_get(&t->map, k);
    if (first == e) {
        if (e->hnext != NULL)
            pc_u64map_put(&t->map, k, e->hnext); /* replaces a value: no allocation */
        else
            pc_u64map_del(&t->map, k);
    } else {
        kvt_ent_t *p = first;
        while (p->hnext != e)
            p = p->hnext;
        p->hnext = e->hnext;
    }
    lru_unlink(t, e);
    t->bytes -= e->bytes;
    t->n_records--;
    if (t->p.kind == ENG_KVTIER_DISK) {
        char path[4200];
        path_of(t, &e->name, path, sizeof path);
        if (unlink(path) != 0 && errno != ENOENT)
            PC_LOG(PC_LOG_WARN, "kvtier", "cannot remove %s: %s", path, strerror(errno));
    }
    if (t->evict_fn != NULL) {
        eng_kvtier_rec_t r = ent_rec(e);
        t->evict_fn(t->evict_ud, &r, reason);
    }
    ent_free(t, e);
}

/* Whether need more bytes can fit once unlent records are evicted. */
static int idx_room_possible(const eng_kvtier_t *t, uint64_t need)
{
    if (need > t->p.max_bytes)
        return 0;
    uint64_t room = t->p.max_bytes >= t->bytes ? t->p.max_bytes - t->bytes : 0;
    for (const kvt_ent_t *e = t->lru_head; e != NULL && room < need; e = e->next)
        if (e->refs == 0)
            room += e->bytes;
    return room >= need;
}

/* Evicts least recently used records (never lent ones, never keep) while over the budget. */
static void idx_evict_over(eng_kvtier_t *t, const kvt_ent_t *keep)
{
    kvt_ent_t *e = t->lru_head;
    while (t->bytes > t->p.max_bytes && e != NULL) {
        kvt_ent_t *next = e->next;
        if (e->refs == 0 && e != keep) {
            t->st.evictions++;
            idx_drop(t, e, 1);
        }
        e = next;
    }
}

/* ---- files ---- */

static ssize_t default_write(void *ud, int fd, const void *buf, size_t len, uint64_t off)
{
    (void)ud;
    return pwrite(fd, buf, len, (off_t)off);
}

static int write_all(eng_kvtier_t *t, int fd, const uint8_t *buf, size_t len)
{
    eng_kvtier_write_fn w = t->p.write_fn != NULL ? t->p.write_fn : default_write;
    size_t off = 0;
    while (off < len) {
        ssize_t n = w(t->p.write_ud, fd, buf + off, len - off, off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        off += (size_t)n;
    }
    return 0;
}

static int read_all(int fd, uint8_t *buf, size_t len)
{
    size_t off = 0;
    while (off < len) {
        ssize_t n = pread(fd, buf + off, len - off, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return -EIO; /* shorter than its head says */
        off += (size_t)n;
    }
    return 0;
}

/* Reads a record file of len bytes: its first hb bytes into head and the rest into rest, with
 * one preadv when the two are apart (a short read goes on from where it stopped). Returns 0,
 * -EIO (the file is shorter) or -errno. */
static int read_rec(int fd, uint8_t *head, size_t hb, uint8_t *rest, size_t len)
{
    if (rest == head + hb)
        return read_all(fd, head, len);
    size_t off = 0;
    while (off < len) {
        struct iovec iov[2];
        int n_iov = 0;
        if (off < hb)
            iov[n_iov++] = (struct iovec){head + off, hb - off};
        iov[n_iov++] = (struct iovec){rest + (off > hb ? off - hb : 0), len - PC_MAX(off, hb)};
        ssize_t n = preadv(fd, iov, n_iov, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return -EIO;
        off += (size_t)n;
    }
    return 0;
}

static void fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

/* Creates dir (0700) if absent, and tightens a looser mode. */
static int dir_make(const char *dir, char *err, size_t err_len)
{
    struct stat sb;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return pc_err_setf(err, err_len, pc_err_from_errno(errno), "kv tier: cannot create %s: %s",
                           dir, strerror(errno));
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return pc_err_setf(err, err_len, PC_ERR_IO, "kv tier: %s is not a directory", dir);
    if ((sb.st_mode & 077) != 0 && chmod(dir, 0700) != 0)
        return pc_err_setf(err, err_len, pc_err_from_errno(errno), "kv tier: cannot chmod %s: %s",
                           dir, strerror(errno));
    return 0;
}

/* One store per directory: two would evict each other's files behind each other's index. */
static int dir_lock(eng_kvtier_t *t, char *err, size_t err_len)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/LOCK", t->dir);
    t->lock_fd = open(path, O_CREAT | O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (t->lock_fd < 0)
        return pc_err_setf(err, err_len, pc_err_from_errno(errno), "kv tier: cannot open %s: %s",
                           path, strerror(errno));
    if (flock(t->lock_fd, LOCK_EX | LOCK_NB) != 0)
        return pc_err_setf(err, err_len, errno == EWOULDBLOCK ? PC_ERR_BUSY : PC_ERR_IO,
                           "kv tier: %s is in use by another store (%s)", t->dir, strerror(errno));
    return 0;
}

/* Whether the directory's file system takes O_DIRECT reads (tmpfs does not). */
static int probe_direct(eng_kvtier_t *t)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/.probe.%ld.tmp", t->dir, (long)getpid());
    int ok = 0, fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
    kvt_buf_t b = {0};
    if (fd < 0)
        return 0;
    /* A hole, not written data: an O_DIRECT read of dirty pages would wait for writeback. */
    ok = ftruncate(fd, KVT_ALIGN) == 0 && buf_take(t, &b) == 0;
    close(fd);
    if (ok) {
        fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
        ok = fd >= 0 && pread(fd, b.p, KVT_ALIGN, 0) == (ssize_t)KVT_ALIGN;
        if (fd >= 0)
            close(fd);
    }
    if (b.raw != NULL)
        buf_give(t, &b);
    unlink(path);
    return ok;
}

/* ---- open: the scan ---- */

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static int parse_hex_name(const char *s, eng_kvtier_name_t *n)
{
    for (int i = 0; i < 32; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        n->b[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

/* Reads the head section of path into a new entry: KVT_OK and *out, KVT_CORRUPT, KVT_STALE,
 * KVT_SKIP (cannot be opened now: not ours to judge), or a negative error (memory). */
static int scan_file(eng_kvtier_t *t, const char *path, const eng_kvtier_name_t *fname,
                     uint8_t *buf, kvt_ent_t **out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat sb;
    if (fd < 0)
        return errno == ELOOP ? KVT_CORRUPT : KVT_SKIP; /* a symlink is not ours */
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return KVT_CORRUPT;
    }
    size_t want = head_bytes(t->p.block_tokens);
    if ((uint64_t)sb.st_size < want)
        want = (size_t)sb.st_size;
    int rc = read_all(fd, buf, want);
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    if (rc != 0)
        return KVT_CORRUPT;
    kvt_head_t h;
    int32_t toks[ENG_KVTIER_MAX_TOKENS];
    rc = head_decode(t, buf, want, (uint64_t)sb.st_size, &h, toks);
    if (rc != KVT_OK)
        return rc;
    if (memcmp(h.name.b, fname->b, 32) != 0)
        return KVT_CORRUPT;
    kvt_ent_t *e = pc_calloc(1, sizeof *e);
    int32_t *tk = pc_malloc(4 * (size_t)h.n_tokens);
    if (e == NULL || tk == NULL) {
        pc_free(e);
        pc_free(tk);
        return PC_ERR_NOMEM;
    }
    memcpy(tk, toks, 4 * (size_t)h.n_tokens);
    *e = (kvt_ent_t){.name = h.name,
                     .parent = h.parent,
                     .ns = h.ns,
                     .block_index = h.block_index,
                     .n_tokens = h.n_tokens,
                     .tokens = tk,
                     .bytes = (uint64_t)sb.st_size,
                     .mtime_ns =
                         (uint64_t)sb.st_mtim.tv_sec * 1000000000u + (uint64_t)sb.st_mtim.tv_nsec};
    *out = e;
    return KVT_OK;
}

static int ent_cmp_mtime(const void *a, const void *b)
{
    const kvt_ent_t *x = *(kvt_ent_t *const *)a, *y = *(kvt_ent_t *const *)b;
    if (x->mtime_ns != y->mtime_ns)
        return x->mtime_ns < y->mtime_ns ? -1 : 1;
    return memcmp(x->name.b, y->name.b, 32);
}

/* Scans DIR/xx/ for records; removes temp files and bad records. */
static int scan_dir(eng_kvtier_t *t, char *err, size_t err_len)
{
    DIR *top = opendir(t->dir);
    kvt_ent_t **found = NULL;
    size_t n_found = 0, cap = 0;
    kvt_buf_t b = {0};
    int rc = 0;
    if (top == NULL)
        return pc_err_setf(err, err_len, pc_err_from_errno(errno), "kv tier: cannot read %s: %s",
                           t->dir, strerror(errno));
    if ((rc = buf_take(t, &b)) != 0)
        goto done;
    struct dirent *d;
    while ((d = readdir(top)) != NULL) {
        char sub[4200];
        if (strlen(d->d_name) != 2 || hexval(d->d_name[0]) < 0 || hexval(d->d_name[1]) < 0)
            continue;
        snprintf(sub, sizeof sub, "%s/%s", t->dir, d->d_name);
        struct stat sb;
        if (lstat(sub, &sb) != 0 || !S_ISDIR(sb.st_mode))
            continue;
        if ((sb.st_mode & 077) != 0)
            (void)chmod(sub, 0700);
        DIR *sd = opendir(sub);
        if (sd == NULL)
            continue;
        struct dirent *f;
        while ((f = readdir(sd)) != NULL) {
            char path[4500];
            size_t len = strlen(f->d_name);
            snprintf(path, sizeof path, "%s/%s", sub, f->d_name);
            if (f->d_name[0] == '.' && len > 4 && strcmp(f->d_name + len - 4, ".tmp") == 0) {
                (void)unlink(path); /* a put that never finished */
                continue;
            }
            eng_kvtier_name_t fname;
            if (len != 68 || strcmp(f->d_name + 64, ".kvb") != 0 ||
                parse_hex_name(f->d_name, &fname) != 0 || memcmp(f->d_name, d->d_name, 2) != 0)
                continue; /* not ours */
            kvt_ent_t *e = NULL;
            int r = scan_file(t, path, &fname, b.p, &e);
            if (r < 0) {
                rc = pc_err_setf(err, err_len, r, "kv tier: scanning %s: %s", t->dir,
                                 pc_strerror(r));
                closedir(sd);
                goto done;
            }
            if (r == KVT_SKIP) {
                PC_LOG(PC_LOG_WARN, "kvtier", "cannot read %s: left alone", path);
                continue;
            }
            if (r != KVT_OK) {
                if (r == KVT_CORRUPT)
                    t->st.corrupt++;
                else
                    t->st.stale++;
                (void)unlink(path);
                continue;
            }
            if (n_found == cap) {
                size_t nc = cap != 0 ? 2 * cap : 256;
                kvt_ent_t **g = pc_reallocarray(found, nc, sizeof *g);
                if (g == NULL) {
                    ent_free(t, e);
                    rc = pc_err_setf(err, err_len, PC_ERR_NOMEM, "kv tier: out of memory");
                    closedir(sd);
                    goto done;
                }
                found = g;
                cap = nc;
            }
            found[n_found++] = e;
        }
        closedir(sd);
    }
    if (n_found > 1)
        qsort(found, n_found, sizeof *found, ent_cmp_mtime);
    for (size_t i = 0; i < n_found; i++) {
        if (idx_add(t, found[i]) != 0) {
            rc = pc_err_setf(err, err_len, PC_ERR_NOMEM, "kv tier: out of memory");
            for (; i < n_found; i++)
                ent_free(t, found[i]);
            break;
        }
    }
    n_found = 0;
    while (rc == 0 && t->bytes > t->p.max_bytes && t->lru_head != NULL) {
        t->st.evictions++;
        idx_drop(t, t->lru_head, 1); /* a smaller budget than last time */
    }
done:
    for (size_t i = 0; i < n_found; i++)
        ent_free(t, found[i]);
    pc_free(found);
    if (b.raw != NULL)
        buf_give(t, &b);
    closedir(top);
    return rc;
}

/* ---- the API ---- */

eng_kvtier_params_t eng_kvtier_params_default(void)
{
    return (eng_kvtier_params_t){
        .kind = ENG_KVTIER_DISK, .max_bytes = 1ull << 30, .direct_io = 1, .io_threads = 4};
}

int eng_kvtier_open(const eng_kvtier_params_t *p, eng_kvtier_t **out, char *err, size_t err_len)
{
    *out = NULL;
    if (p->kind != ENG_KVTIER_DISK && p->kind != ENG_KVTIER_HOST)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "kv tier: unknown kind %d", (int)p->kind);
    if (p->payload_bytes == 0 || p->payload_bytes > ENG_KVTIER_MAX_PAYLOAD)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "kv tier: payload_bytes %u not in 1..%u",
                           p->payload_bytes, ENG_KVTIER_MAX_PAYLOAD);
    if (p->block_tokens == 0 || p->block_tokens > ENG_KVTIER_MAX_TOKENS)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "kv tier: block_tokens %u not in 1..%u",
                           p->block_tokens, ENG_KVTIER_MAX_TOKENS);
    if (p->kind == ENG_KVTIER_DISK && (p->dir == NULL || p->dir[0] == '\0'))
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "kv tier: no directory");
    if (p->kind == ENG_KVTIER_DISK && strlen(p->dir) > 4000)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "kv tier: directory path too long");
    if (p->kind == ENG_KVTIER_HOST && p->key != NULL)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "kv tier: encryption at rest is for the disk tier only");
    if (p->io_threads == 0 || p->io_threads > ENG_KVTIER_MAX_IO_THREADS)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "kv tier: io_threads %u not in 1..%d",
                           p->io_threads, ENG_KVTIER_MAX_IO_THREADS);
    if ((p->host_alloc == NULL) != (p->host_free == NULL))
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "kv tier: host_alloc and host_free go together");
    if (sodium_init() < 0)
        return pc_err_setf(err, err_len, PC_ERR_INTERNAL, "kv tier: libsodium failed to start");
    eng_kvtier_t *t = pc_calloc(1, sizeof *t);
    if (t == NULL)
        return pc_err_setf(err, err_len, PC_ERR_NOMEM, "kv tier: out of memory");
    t->p = *p;
    t->payload_pad = (uint32_t)align_up(p->payload_bytes);
    t->rec_max = head_bytes(p->block_tokens) + t->payload_pad;
    pthread_mutex_init(&t->mu, NULL);
    t->lock_fd = -1;
    int rc = 0;
    if (p->key != NULL) {
        static const char dom[] = "kvgw-kv-key";
        uint8_t id[32];
        crypto_generichash_state st;
        memcpy(t->key, p->key, sizeof t->key);
        crypto_generichash_init(&st, NULL, 0, sizeof id);
        crypto_generichash_update(&st, (const uint8_t *)dom, sizeof dom - 1);
        crypto_generichash_update(&st, t->key, sizeof t->key);
        crypto_generichash_final(&st, id, sizeof id);
        t->key_id = get_le64(id);
        t->encrypted = 1;
    }
    t->p.key = NULL; /* our copy is t->key */
    t->p.dir = NULL;
    if (p->kind == ENG_KVTIER_DISK) {
        if ((t->dir = pc_strdup(p->dir)) == NULL) {
            rc = pc_err_setf(err, err_len, PC_ERR_NOMEM, "kv tier: out of memory");
            goto fail;
        }
        if ((rc = dir_make(t->dir, err, err_len)) != 0 || (rc = dir_lock(t, err, err_len)) != 0)
            goto fail;
        t->direct = p->direct_io && probe_direct(t);
        if ((rc = scan_dir(t, err, err_len)) != 0)
            goto fail;
    }
    t->st.direct_io = t->direct;
    t->st.encrypted = t->encrypted;
    *out = t;
    return 0;
fail:
    eng_kvtier_free(t);
    return rc;
}

void eng_kvtier_free(eng_kvtier_t *t)
{
    if (t == NULL)
        return;
    for (kvt_ent_t *e = t->lru_head, *next; e != NULL; e = next) {
        next = e->next;
        ent_free(t, e);
    }
    for (int i = 0; i < t->n_bufs; i++)
        pc_free(t->bufs[i].raw);
    pc_u64map_free(&t->map);
    if (t->lock_fd >= 0)
        close(t->lock_fd); /* and with it the flock */
    pthread_mutex_destroy(&t->mu);
    sodium_memzero(t->key, sizeof t->key);
    pc_free(t->dir);
    pc_free(t);
}

void eng_kvtier_set_evict_cb(eng_kvtier_t *t, eng_kvtier_evict_fn fn, void *ud)
{
    pthread_mutex_lock(&t->mu);
    t->evict_fn = fn;
    t->evict_ud = ud;
    pthread_mutex_unlock(&t->mu);
}

static kvt_ent_t *ent_new(const eng_kvtier_rec_t *rec)
{
    kvt_ent_t *e = pc_calloc(1, sizeof *e);
    int32_t *tk = pc_malloc(4 * (size_t)rec->n_tokens);
    if (e == NULL || tk == NULL) {
        pc_free(e);
        pc_free(tk);
        return NULL;
    }
    memcpy(tk, rec->tokens, 4 * (size_t)rec->n_tokens);
    *e = (kvt_ent_t){.name = rec->name,
                     .parent = rec->parent,
                     .ns = rec->ns,
                     .block_index = rec->block_index,
                     .n_tokens = rec->n_tokens,
                     .tokens = tk};
    return e;
}

/* Under the lock: adds e, or finds a record of its name held already (made most recent). DISK:
 * renames tmp to path first. Evicts only once nothing can fail any more, so a failed put leaves
 * the store as it was. Returns 0, 1, PC_ERR_NOSPACE, PC_ERR_IO or PC_ERR_NOMEM. */
static int put_admit(eng_kvtier_t *t, kvt_ent_t *e, const char *tmp, const char *path)
{
    kvt_ent_t *old = idx_find(t, &e->name);
    if (old != NULL) {
        lru_touch(t, old);
        return 1;
    }
    if (!idx_room_possible(t, e->bytes))
        return PC_ERR_NOSPACE;
    if (tmp != NULL && rename(tmp, path) != 0)
        return PC_ERR_IO;
    if (idx_add(t, e) != 0) {
        if (tmp != NULL)
            (void)unlink(path);
        return PC_ERR_NOMEM;
    }
    idx_evict_over(t, e);
    t->st.writes++;
    t->st.write_bytes += t->p.payload_bytes;
    return 0;
}

static int put_host(eng_kvtier_t *t, kvt_ent_t *e, const void *payload)
{
    e->host = t->p.host_alloc != NULL ? t->p.host_alloc(t->p.host_ud, t->p.payload_bytes)
                                      : pc_malloc(t->p.payload_bytes);
    if (e->host == NULL) {
        ent_free(t, e);
        return PC_ERR_NOMEM;
    }
    memcpy(e->host, payload, t->p.payload_bytes);
    pthread_mutex_lock(&t->mu);
    int rc = put_admit(t, e, NULL, NULL);
    pthread_mutex_unlock(&t->mu);
    if (rc != 0)
        ent_free(t, e);
    return rc;
}

static int put_rec(eng_kvtier_t *t, const eng_kvtier_rec_t *rec, const void *payload,
                   size_t payload_bytes, int sync)
{
    if (payload_bytes != t->p.payload_bytes || rec->n_tokens == 0 ||
        rec->n_tokens > t->p.block_tokens || rec->tokens == NULL || payload == NULL ||
        !chain_ok(&rec->name, &rec->parent, rec->block_index, rec->tokens, rec->n_tokens))
        return PC_ERR_INVAL;
    kvt_ent_t *e = ent_new(rec);
    if (e == NULL)
        return PC_ERR_NOMEM;
    e->bytes = eng_kvtier_record_bytes(t, rec->n_tokens);
    if (t->p.kind == ENG_KVTIER_HOST)
        return put_host(t, e, payload);

    /* Cheap refusals first, then the file, then the index. */
    pthread_mutex_lock(&t->mu);
    kvt_ent_t *old = idx_find(t, &e->name);
    int rc = old != NULL ? 1 : e->bytes > t->p.max_bytes ? PC_ERR_NOSPACE : 0;
    if (old != NULL)
        lru_touch(t, old);
    uint64_t seq = ++t->tmp_seq;
    pthread_mutex_unlock(&t->mu);
    if (rc != 0) {
        ent_free(t, e);
        return rc;
    }
    char hex[65], sub[4100], tmp[4200], path[4200];
    eng_kvtier_name_hex(&e->name, hex);
    snprintf(sub, sizeof sub, "%s/%.2s", t->dir, hex);
    snprintf(tmp, sizeof tmp, "%s/.%s.%ld.%llu.tmp", sub, hex, (long)getpid(),
             (unsigned long long)seq);
    snprintf(path, sizeof path, "%s/%s.kvb", sub, hex);
    kvt_buf_t b = {0};
    int fd = -1;
    if ((rc = buf_take(t, &b)) != 0)
        goto fail;
    memset(b.p, 0, e->bytes);
    rec_encode(t, rec, payload, b.p);
    if (mkdir(sub, 0700) != 0 && errno != EEXIST) {
        rc = pc_err_from_errno(errno);
        goto fail_io;
    }
    fd = open(tmp, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
    if (fd < 0) {
        rc = pc_err_from_errno(errno);
        goto fail_io;
    }
    if (write_all(t, fd, b.p, e->bytes) != 0 || (sync && fsync(fd) != 0)) {
        rc = errno == ENOSPC || errno == EDQUOT ? PC_ERR_NOSPACE : PC_ERR_IO;
        goto fail_io;
    }
    if (close(fd) != 0) {
        fd = -1;
        rc = PC_ERR_IO;
        goto fail_io;
    }
    fd = -1;
    buf_give(t, &b);

    pthread_mutex_lock(&t->mu);
    rc = put_admit(t, e, tmp, path);
    if (rc == PC_ERR_IO)
        t->st.write_errors++;
    pthread_mutex_unlock(&t->mu);
    if (rc != 0) {
        (void)unlink(tmp);
        ent_free(t, e);
        return rc;
    }
    if (sync)
        fsync_dir(sub);
    return 0;
fail_io:
    pthread_mutex_lock(&t->mu);
    t->st.write_errors++;
    pthread_mutex_unlock(&t->mu);
    if (rc != PC_ERR_NOSPACE && rc != PC_ERR_PERM)
        rc = PC_ERR_IO;
fail:
    if (fd >= 0)
        close(fd);
    (void)unlink(tmp);
    if (b.raw != NULL)
        buf_give(t, &b);
    ent_free(t, e);
    return rc;
}

int eng_kvtier_put(eng_kvtier_t *t, const eng_kvtier_rec_t *rec, const void *payload,
                   size_t payload_bytes)
{
    return put_rec(t, rec, payload, payload_bytes, t->p.fsync);
}

int eng_kvtier_put_sync(eng_kvtier_t *t, const eng_kvtier_rec_t *rec, const void *payload,
                        size_t payload_bytes)
{
    return put_rec(t, rec, payload, payload_bytes, 1);
}

/* Under the lock: the record asked for, if it holds exactly those tokens; counts a miss. */
static kvt_ent_t *get_find(eng_kvtier_t *t, const eng_kvtier_name_t *name, const int32_t *tokens,
                           uint32_t n_tokens)
{
    kvt_ent_t *e = idx_find(t, name);
    if (e == NULL || e->n_tokens != n_tokens ||
        memcmp(e->tokens, tokens, 4 * (size_t)n_tokens) != 0) {
        t->st.misses++;
        return NULL;
    }
    return e;
}

static void count_hit(eng_kvtier_t *t, kvt_ent_t *e, uint64_t t0)
{
    t->st.hits++;
    t->st.loads++;
    t->st.load_bytes += t->p.payload_bytes;
    if (t0 != 0)
        t->st.load_ns += pc_time_mono_ns() - t0;
    if (e != NULL)
        lru_touch(t, e);
}

int eng_kvtier_host_ref(eng_kvtier_t *t, const eng_kvtier_name_t *name, const int32_t *tokens,
                        uint32_t n_tokens, const void **payload)
{
    if (t->p.kind != ENG_KVTIER_HOST)
        return PC_ERR_UNSUPPORTED;
    uint64_t t0 = pc_time_mono_ns();
    pthread_mutex_lock(&t->mu);
    kvt_ent_t *e = get_find(t, name, tokens, n_tokens);
    if (e != NULL) {
        e->refs++;
        *payload = e->host;
        count_hit(t, e, t0);
    }
    pthread_mutex_unlock(&t->mu);
    return e != NULL ? 0 : PC_ERR_NOTFOUND;
}

void eng_kvtier_host_unref(eng_kvtier_t *t, const eng_kvtier_name_t *name)
{
    pthread_mutex_lock(&t->mu);
    kvt_ent_t *e = idx_find(t, name);
    PC_ASSERT(e != NULL && e->refs > 0);
    e->refs--;
    pthread_mutex_unlock(&t->mu);
}

static int get_host(eng_kvtier_t *t, const eng_kvtier_name_t *name, const int32_t *tokens,
                    uint32_t n_tokens, void *payload)
{
    const void *src;
    int rc = eng_kvtier_host_ref(t, name, tokens, n_tokens, &src);
    if (rc != 0)
        return rc;
    memcpy(payload, src, t->p.payload_bytes);
    eng_kvtier_host_unref(t, name);
    return 0;
}

/* eng_kvtier_get; timed = 0 leaves load_ns to the caller (eng_kvtier_get_many counts its wall
 * time once, not the sum of its parallel reads). */
static int get_one(eng_kvtier_t *t, const eng_kvtier_name_t *name, const int32_t *tokens,
                   uint32_t n_tokens, void *payload, size_t payload_bytes, int timed)
{
    if (payload_bytes != t->p.payload_bytes || n_tokens == 0 || n_tokens > t->p.block_tokens)
        return payload_bytes != t->p.payload_bytes ? PC_ERR_INVAL : PC_ERR_NOTFOUND;
    if (t->p.kind == ENG_KVTIER_HOST)
        return get_host(t, name, tokens, n_tokens, payload);
    uint64_t t0 = timed ? pc_time_mono_ns() : 0;
    char path[4200];
    path_of(t, name, path, sizeof path);
    pthread_mutex_lock(&t->mu);
    kvt_ent_t *e = get_find(t, name, tokens, n_tokens);
    uint64_t gen = e != NULL ? e->gen : 0, bytes = e != NULL ? e->bytes : 0;
    int direct = t->direct;
    pthread_mutex_unlock(&t->mu);
    if (e == NULL)
        return PC_ERR_NOTFOUND;
    /* The open runs outside the lock (a cold directory lookup is a disk read, and the other
     * readers must not wait for it); a file an eviction unlinked meanwhile is a miss (below). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | (direct ? O_DIRECT : 0));
    int open_errno = fd < 0 ? errno : 0;
    kvt_buf_t b = {0};
    int rc = 0, bad = 0;
    struct stat sb;
    size_t hb = head_bytes(n_tokens);
    /* The payload goes straight into the caller's buffer when it needs no padding and, for
     * O_DIRECT, is aligned: no bounce copy, and the checksum runs over it there. */
    uint8_t *dst = payload;
    int into_caller =
        t->payload_pad == t->p.payload_bytes && (!direct || (uintptr_t)payload % KVT_ALIGN == 0);
    if (fd < 0 && open_errno != ENOENT && open_errno != ELOOP) {
        rc = PC_ERR_IO; /* EMFILE, EACCES, ...: the record may be sound */
    } else if (fd < 0 || fstat(fd, &sb) != 0 || (uint64_t)sb.st_size != bytes) {
        bad = 1; /* the file went, or is not the length the record says */
    } else if ((rc = buf_take(t, &b)) == 0) {
        uint8_t *rest = into_caller ? dst : b.p + hb;
        int r = read_rec(fd, b.p, hb, rest, bytes);
        if (r == -EINVAL && direct) { /* O_DIRECT refused after all: read through the cache */
            pthread_mutex_lock(&t->mu);
            t->direct = t->st.direct_io = 0;
            pthread_mutex_unlock(&t->mu);
            direct = 0;
            PC_LOG(PC_LOG_WARN, "kvtier", "%s refuses O_DIRECT reads: reading through the cache",
                   t->dir);
            close(fd);
            fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
            r = fd >= 0 ? read_rec(fd, b.p, hb, rest, bytes) : -EIO;
        }
        if (fd >= 0 && !direct)
            (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        if (r == -EIO)
            bad = 1;
        else if (r != 0)
            rc = PC_ERR_IO;
        else
            bad = rec_decode(t, b.p, rest, bytes, name, tokens, n_tokens, payload) != KVT_OK;
    }
    if (fd >= 0)
        close(fd);
    if (b.raw != NULL)
        buf_give(t, &b);
    pthread_mutex_lock(&t->mu);
    e = idx_find(t, name);
    if (e != NULL && e->gen != gen)
        e = NULL; /* another record of that name now: not the one we read */
    if (bad && open_errno == ENOENT && e == NULL) {
        bad = 0; /* evicted or removed before our open: a plain miss */
        rc = PC_ERR_NOTFOUND;
    }
    if (bad) {
        t->st.misses++;
        t->st.corrupt++;
        if (e != NULL && e->refs == 0)
            idx_drop(t, e, 2);
        rc = PC_ERR_NOTFOUND;
    } else if (rc == 0) {
        count_hit(t, e, t0);
    } else {
        t->st.misses++;
    }
    pthread_mutex_unlock(&t->mu);
    if (bad)
        PC_LOG(PC_LOG_WARN, "kvtier", "bad record %s: deleted, not served", path);
    return rc;
}

int eng_kvtier_get(eng_kvtier_t *t, const eng_kvtier_name_t *name, const int32_t *tokens,
                   uint32_t n_tokens, void *payload, size_t payload_bytes)
{
    return get_one(t, name, tokens, n_tokens, payload, payload_bytes, 1);
}

typedef struct kvt_many {
    eng_kvtier_t *t;
    eng_kvtier_read_t *reads;
    uint32_t n, next; /* next: the next read to take (atomic) */
} kvt_many_t;

static void *many_run(void *ud)
{
    kvt_many_t *m = ud;
    for (;;) {
        uint32_t i = __atomic_fetch_add(&m->next, 1, __ATOMIC_RELAXED);
        if (i >= m->n)
            return NULL;
        eng_kvtier_read_t *r = &m->reads[i];
        r->rc =
            get_one(m->t, &r->name, r->tokens, r->n_tokens, r->payload, m->t->p.payload_bytes, 0);
    }
}

uint32_t eng_kvtier_get_many(eng_kvtier_t *t, eng_kvtier_read_t *reads, uint32_t n)
{
    uint64_t t0 = pc_time_mono_ns();
    kvt_many_t m = {.t = t, .reads = reads, .n = n};
    pthread_t th[ENG_KVTIER_MAX_IO_THREADS];
    uint32_t want = t->p.kind == ENG_KVTIER_DISK ? t->p.io_threads : 1, n_th = 0;
    if (want > n)
        want = n;
    for (; n_th + 1 < want; n_th++) /* the caller is one of them */
        if (pthread_create(&th[n_th], NULL, many_run, &m) != 0)
            break; /* fewer in flight, same results */
    many_run(&m);
    for (uint32_t i = 0; i < n_th; i++)
        pthread_join(th[i], NULL);
    uint32_t served = 0;
    for (uint32_t i = 0; i < n; i++)
        served += reads[i].rc == 0;
    if (served > 0 && t->p.kind == ENG_KVTIER_DISK) {
        pthread_mutex_lock(&t->mu);
        t->st.load_ns += pc_time_mono_ns() - t0;
        pthread_mutex_unlock(&t->mu);
    }
    return served;
}

int eng_kvtier_contains(eng_kvtier_t *t, const eng_kvtier_name_t *name)
{
    pthread_mutex_lock(&t->mu);
    int r = idx_find(t, name) != NULL;
    pthread_mutex_unlock(&t->mu);
    return r;
}

int eng_kvtier_remove(eng_kvtier_t *t, const eng_kvtier_name_t *name)
{
    pthread_mutex_lock(&t->mu);
    kvt_ent_t *e = idx_find(t, name);
    int rc = e == NULL ? PC_ERR_NOTFOUND : e->refs > 0 ? PC_ERR_BUSY : 0;
    if (rc == 0)
        idx_drop(t, e, 3);
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int eng_kvtier_foreach(eng_kvtier_t *t, eng_kvtier_foreach_fn fn, void *ud)
{
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    for (kvt_ent_t *e = t->lru_head; e != NULL && rc == 0; e = e->next) {
        eng_kvtier_rec_t r = ent_rec(e);
        rc = fn(ud, &r);
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

void eng_kvtier_stats(eng_kvtier_t *t, eng_kvtier_stats_t *out)
{
    pthread_mutex_lock(&t->mu);
    *out = t->st;
    out->bytes = t->bytes;
    out->max_bytes = t->p.max_bytes;
    out->records = t->n_records;
    pthread_mutex_unlock(&t->mu);
}
