/*
 * test_kvtier.c — the KV tier store (engine/kvtier.c): chained names, records that are served
 * only whole (every flipped byte, every torn or cut write is caught, never served, and
 * removed), the LRU budget, recovery by scan after a crash, file modes, encryption at rest, the
 * host tier's loans, and threads. Each test works in its own fresh directory under /tmp.
 *
 * `KVGW_KVTIER_CORPUS=tests/fuzz/corpus/fuzz_kvtier build/tests/test_kvtier corpus_seeds` writes
 * fuzz_kvtier's seed corpus.
 */
#define _GNU_SOURCE
#include "kvtier.h"

#include "common.h"
#include "pc_failalloc.h"
#include "pc_test.h"
#include "pc_testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define BT 16   /* block tokens */
#define PB 1000 /* payload bytes: not a multiple of 4096, so the payload has padding */

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb;
    (void)flag;
    (void)f;
    return remove(p);
}

static void rm_rf(const char *dir)
{
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* A fresh empty directory path (not created: the store creates it). The loops that write
 * thousands of files run on tmpfs (/dev/shm) where there is one: on a shared machine's disk a
 * file creation, rename or unlink can wait milliseconds for the journal. Tests of the disk
 * path itself (O_DIRECT) ask for /tmp. */
static const char *fresh_dir_on(int on_disk)
{
    static char dir[256];
    static int n;
    struct stat sb;
    const char *base = !on_disk && stat("/dev/shm", &sb) == 0 && access("/dev/shm", W_OK) == 0
                           ? "/dev/shm"
                           : "/tmp";
    snprintf(dir, sizeof dir, "%s/kvgw_kvtier.%d.%d", base, (int)getpid(), n++);
    rm_rf(dir);
    return dir;
}

static const char *fresh_dir(void)
{
    return fresh_dir_on(0);
}

static eng_kvtier_params_t params(const char *dir)
{
    eng_kvtier_params_t p = eng_kvtier_params_default();
    p.dir = dir;
    p.payload_bytes = PB;
    p.block_tokens = BT;
    p.max_bytes = 64ull << 20;
    /* Plain reads: an O_DIRECT read of a file just written waits for its writeback, which
     * the loops below would pay thousands of times. Tests that read directly say so. */
    p.direct_io = 0;
    return p;
}

/* A chain of n blocks of tokens: block i holds BT tokens (the last n_last), values from seed. */
typedef struct chain {
    int n;
    int32_t tokens[32][BT];
    uint32_t n_tokens[32];
    eng_kvtier_name_t names[32];
    uint64_t ns;
} chain_t;

static void chain_make(chain_t *c, int n, uint32_t n_last, uint64_t ns, uint32_t seed)
{
    eng_kvtier_ident_t id = {
        .model_fp = 0x1234, .kv_dtype = 1, .layout_version = 1, .block_tokens = BT, .ns = ns};
    eng_kvtier_name_t prev;
    eng_kvtier_seed(&id, &prev);
    c->n = n;
    c->ns = ns;
    for (int i = 0; i < n; i++) {
        c->n_tokens[i] = i == n - 1 ? n_last : BT;
        for (uint32_t k = 0; k < BT; k++)
            c->tokens[i][k] = (int32_t)(0x7a5b3c00u + seed * 1000u + (uint32_t)i * BT + k);
        eng_kvtier_name_next(&prev, c->tokens[i], c->n_tokens[i], &c->names[i]);
        prev = c->names[i];
    }
}

static void payload_of(const eng_kvtier_name_t *n, uint8_t *p)
{
    for (int i = 0; i < PB; i++)
        p[i] = (uint8_t)(n->b[i % 32] * 31 + i);
}

static eng_kvtier_rec_t rec_of(const chain_t *c, int i)
{
    static const eng_kvtier_name_t zero;
    return (eng_kvtier_rec_t){.name = c->names[i],
                              .parent = i > 0 ? c->names[i - 1] : zero,
                              .ns = c->ns,
                              .block_index = (uint32_t)i,
                              .n_tokens = c->n_tokens[i],
                              .tokens = c->tokens[i]};
}

static int put_block(eng_kvtier_t *t, const chain_t *c, int i)
{
    uint8_t p[PB];
    eng_kvtier_rec_t r = rec_of(c, i);
    payload_of(&c->names[i], p);
    return eng_kvtier_put(t, &r, p, PB);
}

/* 0 when block i is served with its right payload, else the get's error. */
static int get_block(eng_kvtier_t *t, const chain_t *c, int i)
{
    uint8_t p[PB], want[PB];
    int rc = eng_kvtier_get(t, &c->names[i], c->tokens[i], c->n_tokens[i], p, PB);
    if (rc != 0)
        return rc;
    payload_of(&c->names[i], want);
    return memcmp(p, want, PB) == 0 ? 0 : PC_ERR_INTERNAL;
}

static void path_of(const char *dir, const eng_kvtier_name_t *n, char *out, size_t len)
{
    char hex[65];
    eng_kvtier_name_hex(n, hex);
    snprintf(out, len, "%s/%.2s/%s.kvb", dir, hex, hex);
}

static int file_exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

static int n_files_seen;

static int count_one(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb;
    n_files_seen += flag == FTW_F && strcmp(p + f->base, "LOCK") != 0;
    return 0;
}

/* Files under dir (recursively), of any name but the store's LOCK. */
static int count_files(const char *dir)
{
    n_files_seen = 0;
    if (nftw(dir, count_one, 16, FTW_PHYS) != 0)
        return -1;
    return n_files_seen;
}

static void write_file(const char *path, const uint8_t *b, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        abort();
    if (len > 0 && fwrite(b, 1, len, f) != len)
        abort();
    fclose(f);
}

static eng_kvtier_t *open_ok(const eng_kvtier_params_t *p)
{
    eng_kvtier_t *t = NULL;
    char err[256] = "";
    int rc = eng_kvtier_open(p, &t, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "open: %s\n", err);
    return t;
}

PC_TEST(names_chain_over_every_input)
{
    eng_kvtier_ident_t base = {
        .model_fp = 0xabcdef, .kv_dtype = 1, .layout_version = 1, .block_tokens = 16, .ns = 42};
    eng_kvtier_name_t s0, s;
    eng_kvtier_seed(&base, &s0);
    eng_kvtier_seed(&base, &s);
    ASSERT_MEM_EQ(s0.b, s.b, 32);
    eng_kvtier_ident_t v[5];
    for (int i = 0; i < 5; i++)
        v[i] = base;
    v[0].model_fp ^= 1;
    v[1].kv_dtype = 0;
    v[2].layout_version = 2;
    v[3].block_tokens = 32;
    v[4].ns = 43;
    for (int i = 0; i < 5; i++) {
        eng_kvtier_seed(&v[i], &s);
        ASSERT_TRUE(memcmp(s.b, s0.b, 32) != 0);
    }
    int32_t tok[16];
    for (int i = 0; i < 16; i++)
        tok[i] = i * 7 + 1;
    eng_kvtier_name_t n0, n;
    eng_kvtier_name_next(&s0, tok, 16, &n0);
    eng_kvtier_name_next(&s0, tok, 15, &n); /* one token fewer */
    ASSERT_TRUE(memcmp(n.b, n0.b, 32) != 0);
    for (int i = 0; i < 16; i++) { /* every token position */
        tok[i] ^= 0x100;
        eng_kvtier_name_next(&s0, tok, 16, &n);
        ASSERT_TRUE(memcmp(n.b, n0.b, 32) != 0);
        tok[i] ^= 0x100;
    }
    /* A chain: block 1's name depends on block 0's tokens through its parent. */
    eng_kvtier_name_t a1, b0, b1;
    eng_kvtier_name_next(&n0, tok, 16, &a1);
    tok[0]++;
    eng_kvtier_name_next(&s0, tok, 16, &b0);
    tok[0]--;
    eng_kvtier_name_next(&b0, tok, 16, &b1);
    ASSERT_TRUE(memcmp(a1.b, b1.b, 32) != 0);
    /* out may alias prev */
    eng_kvtier_name_t x = n0;
    eng_kvtier_name_next(&x, tok, 16, &x);
    ASSERT_MEM_EQ(x.b, a1.b, 32);
    /* Longer than one hashing chunk (64 tokens) equals itself. */
    int32_t big[200];
    for (int i = 0; i < 200; i++)
        big[i] = i;
    eng_kvtier_name_next(&s0, big, 200, &n);
    eng_kvtier_name_next(&s0, big, 200, &x);
    ASSERT_MEM_EQ(n.b, x.b, 32);
    big[150] = -1;
    eng_kvtier_name_next(&s0, big, 200, &x);
    ASSERT_TRUE(memcmp(n.b, x.b, 32) != 0);
    char hex[65];
    eng_kvtier_name_hex(&n0, hex);
    ASSERT_EQ(strlen(hex), 64);
    /* eng_kvtier_chain is the loop of name_next over the blocks, the last one partial. */
    chain_t c;
    chain_make(&c, 4, 5, 42, 12);
    int32_t flat[3 * BT + 5];
    for (int i = 0; i < 4; i++)
        memcpy(flat + i * BT, c.tokens[i], 4 * c.n_tokens[i]);
    eng_kvtier_ident_t cid = {
        .model_fp = 0x1234, .kv_dtype = 1, .layout_version = 1, .block_tokens = BT, .ns = 42};
    eng_kvtier_name_t got[8];
    ASSERT_EQ(eng_kvtier_chain(&cid, flat, 3 * BT + 5, got, 8), 4);
    for (int i = 0; i < 4; i++)
        ASSERT_MEM_EQ(got[i].b, c.names[i].b, 32);
    ASSERT_EQ(eng_kvtier_chain(&cid, flat, 3 * BT + 5, got, 2), 2);
    ASSERT_EQ(eng_kvtier_chain(&cid, flat, 0, got, 8), 0);
}

PC_TEST(put_get_roundtrip_and_refusals)
{
    const char *dir = fresh_dir_on(1);
    for (int direct = 0; direct < 2; direct++) {
        eng_kvtier_params_t p = params(dir);
        p.direct_io = direct;
        eng_kvtier_t *t = open_ok(&p);
        ASSERT_TRUE(t != NULL);
        eng_kvtier_stats_t st;
        eng_kvtier_stats(t, &st);
        if (!direct)
            ASSERT_EQ(st.direct_io, 0);
        chain_t c;
        chain_make(&c, 3, 5, 7, (uint32_t)direct);
        for (int i = 0; i < 3; i++)
            ASSERT_EQ(put_block(t, &c, i), 0);
        ASSERT_EQ(put_block(t, &c, 1), 1); /* already held */
        {
            /* One store per directory. */
            eng_kvtier_t *t2 = NULL;
            char err[200];
            ASSERT_EQ(eng_kvtier_open(&p, &t2, err, sizeof err), PC_ERR_BUSY);
            ASSERT_TRUE(t2 == NULL);
            ASSERT_TRUE(strstr(err, "in use") != NULL);
        }
        for (int i = 0; i < 3; i++)
            ASSERT_EQ(get_block(t, &c, i), 0);
        ASSERT_TRUE(eng_kvtier_contains(t, &c.names[2]));
        /* Other tokens than the record's: not served, the record stays. */
        uint8_t buf[PB];
        int32_t other[BT];
        memcpy(other, c.tokens[1], sizeof other);
        other[3]++;
        ASSERT_EQ(eng_kvtier_get(t, &c.names[1], other, BT, buf, PB), PC_ERR_NOTFOUND);
        ASSERT_EQ(eng_kvtier_get(t, &c.names[1], c.tokens[1], BT - 1, buf, PB), PC_ERR_NOTFOUND);
        ASSERT_EQ(get_block(t, &c, 1), 0);
        ASSERT_EQ(eng_kvtier_get(t, &c.names[1], c.tokens[1], BT, buf, PB - 1), PC_ERR_INVAL);
        /* A name that is not the chain's, a wrong size, a wrong block 0 parent: refused. */
        eng_kvtier_rec_t r = rec_of(&c, 1);
        r.tokens = other;
        ASSERT_EQ(eng_kvtier_put(t, &r, buf, PB), PC_ERR_INVAL);
        r = rec_of(&c, 1);
        ASSERT_EQ(eng_kvtier_put(t, &r, buf, PB + 1), PC_ERR_INVAL);
        r.n_tokens = BT + 1;
        ASSERT_EQ(eng_kvtier_put(t, &r, buf, PB), PC_ERR_INVAL);
        r = rec_of(&c, 0);
        r.parent = c.names[2];
        ASSERT_EQ(eng_kvtier_put(t, &r, buf, PB), PC_ERR_INVAL);
        eng_kvtier_stats(t, &st);
        ASSERT_EQ(st.records, 3);
        ASSERT_EQ(st.writes, 3);
        ASSERT_EQ(st.hits, 4);
        ASSERT_EQ(st.loads, 4);
        ASSERT_EQ(st.load_bytes, 4 * PB);
        ASSERT_EQ(st.misses, 2);
        ASSERT_EQ(st.bytes, 3 * eng_kvtier_record_bytes(t, BT));
        ASSERT_EQ(eng_kvtier_record_bytes(t, BT), 8192);
        ASSERT_EQ(eng_kvtier_remove(t, &c.names[0]), 0);
        ASSERT_EQ(eng_kvtier_remove(t, &c.names[0]), PC_ERR_NOTFOUND);
        ASSERT_EQ(get_block(t, &c, 0), PC_ERR_NOTFOUND);
        ASSERT_EQ(count_files(dir), 2);
        /* A durable put is a put (its fsyncs cannot be observed here without a machine crash). */
        uint8_t pay[PB];
        payload_of(&c.names[0], pay);
        r = rec_of(&c, 0);
        ASSERT_EQ(eng_kvtier_put_sync(t, &r, pay, PB), 0);
        ASSERT_EQ(eng_kvtier_put_sync(t, &r, pay, PB), 1);
        ASSERT_EQ(get_block(t, &c, 0), 0);
        eng_kvtier_free(t);
        rm_rf(dir);
    }
    /* Bad parameters. */
    eng_kvtier_params_t p = params(dir);
    eng_kvtier_t *t = NULL;
    char err[200];
    p.payload_bytes = 0;
    ASSERT_EQ(eng_kvtier_open(&p, &t, err, sizeof err), PC_ERR_INVAL);
    p = params(NULL);
    ASSERT_EQ(eng_kvtier_open(&p, &t, err, sizeof err), PC_ERR_INVAL);
    p = params(dir);
    p.block_tokens = ENG_KVTIER_MAX_TOKENS + 1;
    ASSERT_EQ(eng_kvtier_open(&p, &t, err, sizeof err), PC_ERR_INVAL);
    p = params("/proc/kvgw-cannot-be-here");
    ASSERT_TRUE(eng_kvtier_open(&p, &t, err, sizeof err) < 0);
    ASSERT_TRUE(t == NULL);
}

/* Flip every byte of a record file, one at a time: the get never serves it, counts it
 * corrupt, and removes the file; a scan at open does the same for every byte of the head. */
static void flip_every_byte(const uint8_t *key)
{
    const char *dir = fresh_dir();
    eng_kvtier_params_t p = params(dir);
    p.key = key;
    pc_log_set_level(PC_LOG_ERROR); /* thousands of "bad record" warnings */
    eng_kvtier_t *t = open_ok(&p);
    ASSERT_TRUE(t != NULL);
    chain_t c;
    chain_make(&c, 2, 9, 3, 1);
    ASSERT_EQ(put_block(t, &c, 0), 0);
    ASSERT_EQ(put_block(t, &c, 1), 0);
    char path[400];
    path_of(dir, &c.names[1], path, sizeof path);
    size_t len;
    uint8_t *good = pc_test_slurp(path, &len);
    ASSERT_TRUE(good != NULL);
    ASSERT_EQ(len, 8192);
    uint64_t corrupt = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t *bad = malloc(len);
        memcpy(bad, good, len);
        bad[i] ^= (uint8_t)(1u << (i % 8));
        write_file(path, bad, len);
        free(bad);
        if (get_block(t, &c, 1) != PC_ERR_NOTFOUND) {
            fprintf(stderr, "a record with byte %zu flipped was served\n", i);
            ASSERT_TRUE(0);
        }
        corrupt++;
        eng_kvtier_stats_t st;
        eng_kvtier_stats(t, &st);
        ASSERT_EQ(st.corrupt, corrupt);
        ASSERT_FALSE(file_exists(path));
        ASSERT_FALSE(eng_kvtier_contains(t, &c.names[1]));
        ASSERT_EQ(put_block(t, &c, 1), 0);
    }
    ASSERT_EQ(get_block(t, &c, 0), 0); /* the other record was never touched */
    ASSERT_EQ(get_block(t, &c, 1), 0);
    free(good);
    good = pc_test_slurp(path, &len); /* the last put's file (a sealed one has a fresh nonce) */
    eng_kvtier_free(t);
    /* At open: a flip in the head is found by the scan (corrupt, or stale for the version and
     * key id fields) and the file removed; a flip in the payload is found by the get. */
    /* Every byte of the fields and tokens, then a stride through padding and payload. */
    for (size_t i = 0; i < len; i += (i < 256 ? 1 : 37)) {
        uint8_t *bad = malloc(len);
        memcpy(bad, good, len);
        bad[i] ^= 0x80;
        write_file(path, bad, len);
        free(bad);
        t = open_ok(&p);
        ASSERT_TRUE(t != NULL);
        eng_kvtier_stats_t st;
        eng_kvtier_stats(t, &st);
        if (i < 4096 && !(i >= 144 && i < 160)) { /* the record check is checked by a get */
            ASSERT_EQ(st.corrupt + st.stale, 1);
            ASSERT_EQ(st.records, 1);
            ASSERT_FALSE(file_exists(path));
        } else {
            ASSERT_EQ(st.records, 2);
            ASSERT_EQ(get_block(t, &c, 1), PC_ERR_NOTFOUND);
            eng_kvtier_stats(t, &st);
            ASSERT_EQ(st.corrupt, 1);
        }
        ASSERT_EQ(get_block(t, &c, 0), 0);
        eng_kvtier_free(t);
    }
    free(good);
    rm_rf(dir);
}

PC_TEST(checksum_every_flipped_byte_is_caught)
{
    PC_TEST_CALL(flip_every_byte(NULL));
}

PC_TEST(aead_every_flipped_byte_is_caught)
{
    uint8_t key[32];
    for (int i = 0; i < 32; i++)
        key[i] = (uint8_t)(i * 5 + 3);
    PC_TEST_CALL(flip_every_byte(key));
}

/* The fault-injecting writer: fails (EIO) once `cut` bytes are written; writes at most `step`
 * bytes per call (short writes that the store must continue). */
typedef struct cutter {
    size_t cut, step, calls;
} cutter_t;

static ssize_t cut_write(void *ud, int fd, const void *buf, size_t len, uint64_t off)
{
    cutter_t *c = ud;
    c->calls++;
    if (off >= c->cut) {
        errno = EIO;
        return -1;
    }
    size_t n = len;
    if (n > c->cut - off)
        n = c->cut - off;
    if (n > c->step)
        n = c->step;
    return pwrite(fd, buf, n, (off_t)off);
}

/* The cut offsets of an 8192-byte record: every byte of the head's fields and tokens and around
 * the section boundaries, a stride of 61 between. */
static size_t next_cut(size_t k)
{
    if (k < 256 || (k >= 4090 && k < 4100) || k >= 8185)
        return k + 1;
    if (k < 4090)
        return k + 61 < 4090 ? k + 61 : 4090;
    return k + 61 < 8185 ? k + 61 : 8185;
}

PC_TEST(torn_writes_leave_nothing_and_torn_files_are_never_served)
{
    const char *dir = fresh_dir();
    char dir_copy[256];
    snprintf(dir_copy, sizeof dir_copy, "%s", dir);
    cutter_t cut = {.cut = SIZE_MAX, .step = 777};
    eng_kvtier_params_t p = params(dir_copy);
    p.write_fn = cut_write;
    p.write_ud = &cut;
    pc_log_set_level(PC_LOG_ERROR);
    eng_kvtier_t *t = open_ok(&p);
    ASSERT_TRUE(t != NULL);
    chain_t c;
    chain_make(&c, 3, BT, 5, 2);
    ASSERT_EQ(put_block(t, &c, 0), 0); /* short writes are continued */
    ASSERT_TRUE(cut.calls > 8192 / 777);
    ASSERT_EQ(get_block(t, &c, 0), 0);
    /* A write that fails at any offset: the put fails, no file stays, the index is as it was. */
    size_t n_cuts = 0;
    for (size_t k = 0; k < 8192; k = next_cut(k)) {
        n_cuts++;
        cut.cut = k;
        ASSERT_EQ(put_block(t, &c, 1), PC_ERR_IO);
        ASSERT_FALSE(eng_kvtier_contains(t, &c.names[1]));
        ASSERT_EQ(count_files(dir_copy), 1);
    }
    eng_kvtier_stats_t st;
    eng_kvtier_stats(t, &st);
    ASSERT_EQ(st.records, 1);
    ASSERT_EQ(st.write_errors, n_cuts);
    cut.cut = SIZE_MAX;
    ASSERT_EQ(put_block(t, &c, 1), 0);
    char path[400], sub[400];
    path_of(dir_copy, &c.names[1], path, sizeof path);
    size_t len;
    uint8_t *good = pc_test_slurp(path, &len);
    ASSERT_TRUE(good != NULL);
    eng_kvtier_free(t);
    /* A machine crash: the record's final file holds only its first k bytes (the page cache
     * was lost after the rename), and a put's temp file was left behind. Reopen: neither is
     * indexed, both are gone, the good record is served. */
    snprintf(sub, sizeof sub, "%s", path);
    *strrchr(sub, '/') = '\0';
    char tmp[500];
    snprintf(tmp, sizeof tmp, "%s/.%s.99.1.tmp", sub, strrchr(path, '/') + 1);
    for (size_t k = 0; k < len; k = next_cut(k)) {
        write_file(path, good, k);
        write_file(tmp, good, len);
        t = open_ok(&p);
        ASSERT_TRUE(t != NULL);
        eng_kvtier_stats(t, &st);
        ASSERT_EQ(st.records, 1);
        ASSERT_EQ(st.corrupt, 1);
        ASSERT_FALSE(file_exists(path));
        ASSERT_FALSE(file_exists(tmp));
        ASSERT_EQ(get_block(t, &c, 1), PC_ERR_NOTFOUND);
        ASSERT_EQ(get_block(t, &c, 0), 0);
        eng_kvtier_free(t);
    }
    /* A file cut after the store opened: the get catches it. */
    t = open_ok(&p);
    ASSERT_EQ(put_block(t, &c, 1), 0);
    write_file(path, good, len - 1);
    ASSERT_EQ(get_block(t, &c, 1), PC_ERR_NOTFOUND);
    ASSERT_FALSE(file_exists(path));
    free(good);
    eng_kvtier_free(t);
    rm_rf(dir_copy);
}

typedef struct evlog {
    int n;
    eng_kvtier_name_t names[64];
    int reasons[64];
} evlog_t;

static void on_evict(void *ud, const eng_kvtier_rec_t *r, int reason)
{
    evlog_t *l = ud;
    if (l->n < 64) {
        l->names[l->n] = r->name;
        l->reasons[l->n++] = reason;
    }
}

PC_TEST(budget_evicts_least_recently_used)
{
    const char *dir = fresh_dir();
    eng_kvtier_params_t p = params(dir);
    p.max_bytes = 4 * 8192 + 100; /* four records */
    eng_kvtier_t *t = open_ok(&p);
    ASSERT_TRUE(t != NULL);
    evlog_t log = {0};
    eng_kvtier_set_evict_cb(t, on_evict, &log);
    chain_t c;
    chain_make(&c, 8, BT, 1, 3);
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(put_block(t, &c, i), 0);
    ASSERT_EQ(get_block(t, &c, 0), 0); /* 0 is now the most recent: 1 goes first */
    ASSERT_EQ(put_block(t, &c, 2), 1); /* a put of a held record refreshes it too */
    ASSERT_EQ(put_block(t, &c, 4), 0);
    ASSERT_EQ(put_block(t, &c, 5), 0);
    ASSERT_EQ(log.n, 2);
    ASSERT_MEM_EQ(log.names[0].b, c.names[1].b, 32);
    ASSERT_MEM_EQ(log.names[1].b, c.names[3].b, 32);
    ASSERT_EQ(log.reasons[0], 1);
    int held[] = {0, 2, 4, 5}, gone[] = {1, 3};
    for (int i = 0; i < 4; i++)
        ASSERT_TRUE(eng_kvtier_contains(t, &c.names[held[i]]));
    for (int i = 0; i < 2; i++) {
        char path[400];
        path_of(dir, &c.names[gone[i]], path, sizeof path);
        ASSERT_FALSE(eng_kvtier_contains(t, &c.names[gone[i]]));
        ASSERT_FALSE(file_exists(path));
    }
    eng_kvtier_stats_t st;
    eng_kvtier_stats(t, &st);
    ASSERT_EQ(st.evictions, 2);
    ASSERT_LE(st.bytes, p.max_bytes);
    ASSERT_EQ(count_files(dir), 4);
    eng_kvtier_free(t);
    /* Reopened under a smaller budget: the oldest files go. */
    p.max_bytes = 2 * 8192;
    t = open_ok(&p);
    ASSERT_TRUE(t != NULL);
    eng_kvtier_stats(t, &st);
    ASSERT_EQ(st.records, 2);
    ASSERT_EQ(count_files(dir), 2);
    /* A record larger than the whole budget. */
    p.max_bytes = 8000;
    eng_kvtier_free(t);
    t = open_ok(&p);
    ASSERT_EQ(put_block(t, &c, 6), PC_ERR_NOSPACE);
    eng_kvtier_free(t);
    rm_rf(dir);
}

typedef struct snap {
    int n;
    eng_kvtier_name_t name[64], parent[64];
    uint64_t ns[64];
    uint32_t idx[64], n_tokens[64];
    int32_t tokens[64][BT];
} snap_t;

static int snap_add(void *ud, const eng_kvtier_rec_t *r)
{
    snap_t *s = ud;
    int i = s->n++;
    s->name[i] = r->name;
    s->parent[i] = r->parent;
    s->ns[i] = r->ns;
    s->idx[i] = r->block_index;
    s->n_tokens[i] = r->n_tokens;
    memcpy(s->tokens[i], r->tokens, 4 * r->n_tokens);
    return 0;
}

static int snap_find(const snap_t *s, const eng_kvtier_name_t *n)
{
    for (int i = 0; i < s->n; i++)
        if (memcmp(s->name[i].b, n->b, 32) == 0)
            return i;
    return -1;
}

static void recovery_rebuilds_index(const uint8_t *key)
{
    const char *dir = fresh_dir_on(1);
    eng_kvtier_params_t p = params(dir);
    p.key = key;
    p.direct_io = 1;
    eng_kvtier_t *t = open_ok(&p);
    ASSERT_TRUE(t != NULL);
    chain_t a, b;
    chain_make(&a, 5, 3, 11, 4);
    chain_make(&b, 4, BT, 12, 4); /* the same tokens in another namespace */
    for (int i = 0; i < 5; i++)
        ASSERT_EQ(put_block(t, &a, i), 0);
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(put_block(t, &b, i), 0);
    snap_t before = {0}, after = {0};
    ASSERT_EQ(eng_kvtier_foreach(t, snap_add, &before), 0);
    ASSERT_EQ(before.n, 9);
    eng_kvtier_stats_t st0, st1;
    eng_kvtier_stats(t, &st0);
    eng_kvtier_free(t); /* as a crash would: nothing flushed, nothing written at close */
    t = open_ok(&p);
    ASSERT_TRUE(t != NULL);
    ASSERT_EQ(eng_kvtier_foreach(t, snap_add, &after), 0);
    eng_kvtier_stats(t, &st1);
    ASSERT_EQ(st1.records, st0.records);
    ASSERT_EQ(st1.bytes, st0.bytes);
    ASSERT_EQ(after.n, before.n);
    for (int i = 0; i < before.n; i++) {
        int j = snap_find(&after, &before.name[i]);
        ASSERT_TRUE(j >= 0);
        ASSERT_MEM_EQ(after.parent[j].b, before.parent[i].b, 32);
        ASSERT_EQ(after.ns[j], before.ns[i]);
        ASSERT_EQ(after.idx[j], before.idx[i]);
        ASSERT_EQ(after.n_tokens[j], before.n_tokens[i]);
        ASSERT_MEM_EQ(after.tokens[j], before.tokens[i], 4 * before.n_tokens[i]);
    }
    for (int i = 0; i < 5; i++)
        ASSERT_EQ(get_block(t, &a, i), 0);
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(get_block(t, &b, i), 0);
    /* The two namespaces share no record although their tokens are equal. */
    for (int i = 0; i < 4; i++)
        ASSERT_TRUE(memcmp(a.names[i].b, b.names[i].b, 32) != 0);
    ASSERT_EQ(eng_kvtier_foreach(t, snap_add, &(snap_t){0}), 0);
    eng_kvtier_free(t);
    rm_rf(dir);
}

PC_TEST(recovery_rebuilds_the_index_exactly)
{
    PC_TEST_CALL(recovery_rebuilds_index(NULL));
}

PC_TEST(recovery_rebuilds_the_index_exactly_sealed)
{
    uint8_t key[32] = {1, 2, 3};
    PC_TEST_CALL(recovery_rebuilds_index(key));
}

PC_TEST(files_0600_in_dirs_0700)
{
    const char *dir = fresh_dir();
    ASSERT_EQ(mkdir(dir, 0755), 0); /* a looser directory is tightened */
    ASSERT_EQ(chmod(dir, 0755), 0);
    mode_t old = umask(0);
    eng_kvtier_params_t p = params(dir);
    eng_kvtier_t *t = open_ok(&p);
    ASSERT_TRUE(t != NULL);
    chain_t c;
    chain_make(&c, 1, BT, 1, 5);
    ASSERT_EQ(put_block(t, &c, 0), 0);
    umask(old);
    char path[400];
    struct stat sb;
    path_of(dir, &c.names[0], path, sizeof path);
    ASSERT_EQ(stat(dir, &sb), 0);
    ASSERT_EQ(sb.st_mode & 0777, 0700);
    ASSERT_EQ(stat(path, &sb), 0);
    ASSERT_EQ(sb.st_mode & 0777, 0600);
    *strrchr(path, '/') = '\0';
    ASSERT_EQ(stat(path, &sb), 0);
    ASSERT_EQ(sb.st_mode & 0777, 0700);
    eng_kvtier_free(t);
    rm_rf(dir);
}

/* needle (n bytes) anywhere in hay? */
static int contains_bytes(const uint8_t *hay, size_t len, const void *needle, size_t n)
{
    for (size_t i = 0; i + n <= len; i++)
        if (memcmp(hay + i, needle, n) == 0)
            return 1;
    return 0;
}

PC_TEST(encryption_at_rest)
{
    const char *dir = fresh_dir();
    uint8_t key[32], key2[32];
    for (int i = 0; i < 32; i++) {
        key[i] = (uint8_t)(200 - i);
        key2[i] = key[i];
    }
    key2[31] ^= 1;
    eng_kvtier_params_t p = params(dir);
    p.key = key;
    eng_kvtier_t *t = open_ok(&p);
    ASSERT_TRUE(t != NULL);
    chain_t c;
    chain_make(&c, 2, BT, 77, 6);
    ASSERT_EQ(put_block(t, &c, 0), 0);
    ASSERT_EQ(put_block(t, &c, 1), 0);
    ASSERT_EQ(get_block(t, &c, 1), 0);
    eng_kvtier_stats_t st;
    eng_kvtier_stats(t, &st);
    ASSERT_EQ(st.encrypted, 1);
    eng_kvtier_free(t);
    /* No token id, and no run of the payload, in the clear. */
    char path[400];
    path_of(dir, &c.names[1], path, sizeof path);
    size_t len;
    uint8_t *f = pc_test_slurp(path, &len);
    ASSERT_TRUE(f != NULL);
    uint8_t pay[PB];
    payload_of(&c.names[1], pay);
    for (int k = 0; k < BT; k++) {
        uint8_t le[4] = {(uint8_t)c.tokens[1][k], (uint8_t)(c.tokens[1][k] >> 8),
                         (uint8_t)(c.tokens[1][k] >> 16), (uint8_t)(c.tokens[1][k] >> 24)};
        ASSERT_FALSE(contains_bytes(f, len, le, 4));
    }
    for (int k = 0; k + 8 <= PB; k += 8)
        ASSERT_FALSE(contains_bytes(f, len, pay + k, 8));
    free(f);
    /* The same record without the key is readable: the test above is not vacuous. */
    const char *dir2 = "/tmp/kvgw_kvtier_plain_check";
    rm_rf(dir2);
    eng_kvtier_params_t pp = params(dir2);
    eng_kvtier_t *tp = open_ok(&pp);
    ASSERT_EQ(put_block(tp, &c, 1), 0);
    char ppath[400];
    path_of(dir2, &c.names[1], ppath, sizeof ppath);
    f = pc_test_slurp(ppath, &len);
    uint8_t le0[4] = {(uint8_t)c.tokens[1][0], (uint8_t)(c.tokens[1][0] >> 8),
                      (uint8_t)(c.tokens[1][0] >> 16), (uint8_t)(c.tokens[1][0] >> 24)};
    ASSERT_TRUE(contains_bytes(f, len, le0, 4));
    free(f);
    eng_kvtier_free(tp);
    rm_rf(dir2);
    /* Another key, or none: nothing is served (the records are stale to it and removed). */
    p.key = key2;
    t = open_ok(&p);
    ASSERT_TRUE(t != NULL);
    eng_kvtier_stats(t, &st);
    ASSERT_EQ(st.records, 0);
    ASSERT_EQ(st.stale, 2);
    ASSERT_EQ(get_block(t, &c, 1), PC_ERR_NOTFOUND);
    eng_kvtier_free(t);
    ASSERT_EQ(count_files(dir), 0);
    /* A sealed record copied under a store with another key, but with the key id patched to
     * match: the tags fail; corrupt, never served. */
    p.key = key;
    t = open_ok(&p);
    ASSERT_EQ(put_block(t, &c, 0), 0);
    eng_kvtier_free(t);
    path_of(dir, &c.names[0], path, sizeof path);
    f = pc_test_slurp(path, &len);
    p.key = key2;
    t = open_ok(&p); /* removes it as stale */
    ASSERT_EQ(put_block(t, &c, 0), 0);
    uint8_t *g = pc_test_slurp(path, &len);
    memcpy(f + 104, g + 104, 8); /* key2's id over key's record */
    write_file(path, f, len);
    free(f);
    free(g);
    ASSERT_EQ(get_block(t, &c, 0), PC_ERR_NOTFOUND);
    eng_kvtier_stats(t, &st);
    ASSERT_EQ(st.corrupt, 1);
    eng_kvtier_free(t);
    p.key = NULL;
    t = open_ok(&p);
    eng_kvtier_stats(t, &st);
    ASSERT_EQ(st.records, 0);
    eng_kvtier_free(t);
    rm_rf(dir);
}

static size_t host_live;

static void *host_alloc(void *ud, size_t n)
{
    (void)ud;
    host_live += n;
    return malloc(n);
}

static void host_free(void *ud, void *ptr, size_t n)
{
    (void)ud;
    host_live -= n;
    free(ptr);
}

PC_TEST(host_tier_budget_and_loans)
{
    eng_kvtier_params_t p = params(NULL);
    p.kind = ENG_KVTIER_HOST;
    p.max_bytes = 3 * PB;
    p.host_alloc = host_alloc;
    p.host_free = host_free;
    eng_kvtier_t *t = open_ok(&p);
    ASSERT_TRUE(t != NULL);
    chain_t c;
    chain_make(&c, 6, BT, 9, 7);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(put_block(t, &c, i), 0);
    ASSERT_EQ(host_live, 3 * PB);
    const void *lent;
    ASSERT_EQ(eng_kvtier_host_ref(t, &c.names[0], c.tokens[0], BT, &lent), 0);
    uint8_t want[PB];
    payload_of(&c.names[0], want);
    ASSERT_MEM_EQ(lent, want, PB);
    ASSERT_EQ(eng_kvtier_remove(t, &c.names[0]), PC_ERR_BUSY);
    ASSERT_EQ(get_block(t, &c, 1), 0);
    ASSERT_EQ(get_block(t, &c, 2), 0); /* 0 is the least recent now, but lent */
    ASSERT_EQ(put_block(t, &c, 3), 0); /* so 1 goes */
    ASSERT_TRUE(eng_kvtier_contains(t, &c.names[0]));
    ASSERT_FALSE(eng_kvtier_contains(t, &c.names[1]));
    ASSERT_EQ(get_block(t, &c, 2), 0);
    ASSERT_EQ(get_block(t, &c, 3), 0);
    ASSERT_MEM_EQ(lent, want, PB); /* still valid */
    eng_kvtier_host_unref(t, &c.names[0]);
    ASSERT_EQ(put_block(t, &c, 4), 0); /* now 0 is the least recent unlent */
    ASSERT_FALSE(eng_kvtier_contains(t, &c.names[0]));
    ASSERT_EQ(host_live, 3 * PB);
    int32_t other[BT] = {0};
    ASSERT_EQ(eng_kvtier_host_ref(t, &c.names[4], other, BT, &lent), PC_ERR_NOTFOUND);
    eng_kvtier_stats_t st;
    eng_kvtier_stats(t, &st);
    ASSERT_EQ(st.records, 3);
    ASSERT_EQ(st.bytes, 3 * PB);
    ASSERT_EQ(st.evictions, 2);
    eng_kvtier_free(t);
    ASSERT_EQ(host_live, 0);
    /* Disk-only features refused. */
    uint8_t key[32] = {0};
    p.key = key;
    char err[100];
    ASSERT_EQ(eng_kvtier_open(&p, &t, err, sizeof err), PC_ERR_INVAL);
}

PC_TEST(out_of_memory_changes_nothing)
{
    const char *dir = fresh_dir();
    eng_kvtier_params_t p = params(dir);
    eng_kvtier_t *t = open_ok(&p);
    ASSERT_TRUE(t != NULL);
    chain_t c;
    chain_make(&c, 6, BT, 4, 10);
    for (int i = 0; i < 5; i++)
        ASSERT_EQ(put_block(t, &c, i), 0);
    eng_kvtier_free(t);
    int opened = 0, put = 0;
    for (long k = 0; k < 40; k++) {
        char err[200];
        pc_failalloc_left = k;
        pc_allocator_t prev = pc_set_allocator(&pc_failalloc);
        int rc = eng_kvtier_open(&p, &t, err, sizeof err);
        int prc = rc == 0 ? put_block(t, &c, 5) : 0;
        int grc = rc == 0 ? get_block(t, &c, 2) : 0;
        pc_set_allocator(&prev);
        pc_failalloc_left = -1;
        if (rc != 0) {
            ASSERT_EQ(rc, PC_ERR_NOMEM);
            ASSERT_TRUE(t == NULL);
            continue;
        }
        opened++;
        ASSERT_TRUE(prc == 0 || prc == 1 || prc == PC_ERR_NOMEM);
        ASSERT_TRUE(grc == 0 || grc == PC_ERR_NOMEM);
        put += prc == 0;
        eng_kvtier_stats_t st;
        eng_kvtier_stats(t, &st);
        ASSERT_EQ(st.records, prc == PC_ERR_NOMEM && put == 0 ? 5 : 6);
        ASSERT_EQ(count_files(dir), (int)st.records); /* a failed put left no file */
        for (int i = 0; i < 5; i++)
            ASSERT_EQ(get_block(t, &c, i), 0);
        eng_kvtier_free(t);
    }
    ASSERT_TRUE(opened > 0 && put == 1);
    rm_rf(dir);
}

PC_TEST(get_many_reads_in_parallel_with_each_get_checked)
{
    const char *dir = fresh_dir();
    for (uint32_t io = 1; io <= 8; io *= 2) {
        eng_kvtier_params_t p = params(dir);
        p.io_threads = io;
        eng_kvtier_t *t = open_ok(&p);
        ASSERT_TRUE(t != NULL);
        chain_t c;
        chain_make(&c, 24, BT, 6, 13);
        for (int i = 0; i < 20; i++) /* 20..23 never stored */
            ASSERT_EQ(put_block(t, &c, i), 0);
        char path[400];
        path_of(dir, &c.names[7], path, sizeof path); /* 7: flipped on disk */
        size_t len;
        uint8_t *f = pc_test_slurp(path, &len);
        f[5000] ^= 1;
        write_file(path, f, len);
        free(f);
        int32_t other[BT];
        memcpy(other, c.tokens[3], sizeof other);
        other[0]++;
        eng_kvtier_read_t r[24];
        static uint8_t out[24][PB];
        for (int i = 0; i < 24; i++)
            r[i] = (eng_kvtier_read_t){.name = c.names[i],
                                       .tokens = i == 3 ? other : c.tokens[i],
                                       .n_tokens = BT,
                                       .payload = out[i],
                                       .rc = 12345};
        ASSERT_EQ(eng_kvtier_get_many(t, r, 24), 18);
        for (int i = 0; i < 24; i++) {
            int want = i == 3 || i == 7 || i >= 20 ? PC_ERR_NOTFOUND : 0;
            ASSERT_EQ(r[i].rc, want);
            if (want == 0) {
                uint8_t pay[PB];
                payload_of(&c.names[i], pay);
                ASSERT_MEM_EQ(out[i], pay, PB);
            }
        }
        eng_kvtier_stats_t st;
        eng_kvtier_stats(t, &st);
        ASSERT_EQ(st.hits, 18);
        ASSERT_EQ(st.misses, 6);
        ASSERT_EQ(st.corrupt, 1);
        ASSERT_EQ(st.load_bytes, 18 * PB);
        ASSERT_TRUE(st.load_ns > 0);
        ASSERT_EQ(eng_kvtier_get_many(t, r, 0), 0);
        eng_kvtier_free(t);
        rm_rf(dir);
    }
    eng_kvtier_params_t p = params(dir);
    p.io_threads = ENG_KVTIER_MAX_IO_THREADS + 1;
    eng_kvtier_t *t = NULL;
    char err[200];
    ASSERT_EQ(eng_kvtier_open(&p, &t, err, sizeof err), PC_ERR_INVAL);
}

PC_TEST(unreadable_is_not_corrupt_and_symlinks_are_not_followed)
{
    const char *dir = fresh_dir();
    eng_kvtier_params_t p = params(dir);
    eng_kvtier_t *t = open_ok(&p);
    ASSERT_TRUE(t != NULL);
    chain_t c;
    chain_make(&c, 2, BT, 1, 11);
    ASSERT_EQ(put_block(t, &c, 0), 0);
    ASSERT_EQ(put_block(t, &c, 1), 0);
    /* Out of file descriptors: the get fails, the record is not judged, and later is served. */
    struct rlimit old, low;
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
    low = old;
    low.rlim_cur = 3;
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
    int rc = get_block(t, &c, 0);
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
    ASSERT_EQ(rc, PC_ERR_IO);
    eng_kvtier_stats_t st;
    eng_kvtier_stats(t, &st);
    ASSERT_EQ(st.corrupt, 0);
    ASSERT_EQ(get_block(t, &c, 0), 0);
    eng_kvtier_free(t);
    /* A record's name that is a symlink (to a sound record elsewhere) is removed at the scan;
     * its target is left alone. */
    char path[400], target[400];
    path_of(dir, &c.names[1], path, sizeof path);
    snprintf(target, sizeof target, "%s.target", dir);
    ASSERT_EQ(rename(path, target), 0);
    ASSERT_EQ(symlink(target, path), 0);
    t = open_ok(&p);
    ASSERT_TRUE(t != NULL);
    eng_kvtier_stats(t, &st);
    ASSERT_EQ(st.records, 1);
    ASSERT_EQ(st.corrupt, 1);
    struct stat sb;
    ASSERT_TRUE(lstat(path, &sb) != 0);
    ASSERT_TRUE(file_exists(target));
    /* And one planted after the open is not followed by a get. */
    ASSERT_EQ(put_block(t, &c, 1), 0);
    ASSERT_EQ(unlink(path), 0);
    ASSERT_EQ(symlink(target, path), 0);
    ASSERT_EQ(get_block(t, &c, 1), PC_ERR_NOTFOUND);
    ASSERT_TRUE(file_exists(target));
    eng_kvtier_free(t);
    unlink(target);
    rm_rf(dir);
}

typedef struct worker_arg {
    eng_kvtier_t *t;
    const chain_t *c;
    int seed, served, bad;
} worker_arg_t;

static void *hammer(void *ud)
{
    worker_arg_t *a = ud;
    unsigned s = (unsigned)a->seed;
    for (int k = 0; k < 400; k++) {
        int i = (int)(rand_r(&s) % (unsigned)a->c->n);
        int op = (int)(rand_r(&s) % 4);
        if (op == 0) {
            int rc = put_block(a->t, a->c, i);
            if (rc < 0)
                a->bad++;
        } else if (op == 3) {
            (void)eng_kvtier_remove(a->t, &a->c->names[i]);
        } else {
            int rc = get_block(a->t, a->c, i);
            if (rc == 0)
                a->served++;
            else if (rc != PC_ERR_NOTFOUND)
                a->bad++;
        }
    }
    return NULL;
}

PC_TEST(threads_share_one_store)
{
    const char *dir = fresh_dir();
    for (int kind = 0; kind < 2; kind++) {
        eng_kvtier_params_t p = params(dir);
        p.max_bytes = 10 * 8192; /* fewer than the names: evictions race with gets */
        if (kind == 1) {
            p.kind = ENG_KVTIER_HOST;
            p.max_bytes = 10 * PB;
        }
        eng_kvtier_t *t = open_ok(&p);
        ASSERT_TRUE(t != NULL);
        chain_t c;
        chain_make(&c, 24, BT, 1, 8);
        pthread_t th[4];
        worker_arg_t a[4];
        for (int i = 0; i < 4; i++) {
            a[i] = (worker_arg_t){.t = t, .c = &c, .seed = i + 1};
            pthread_create(&th[i], NULL, hammer, &a[i]);
        }
        int served = 0;
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            ASSERT_EQ(a[i].bad, 0);
            served += a[i].served;
        }
        ASSERT_TRUE(served > 0);
        eng_kvtier_stats_t st;
        eng_kvtier_stats(t, &st);
        ASSERT_LE(st.bytes, p.max_bytes);
        ASSERT_EQ(st.corrupt, 0);
        if (kind == 0)
            ASSERT_EQ(count_files(dir), (int)st.records);
        eng_kvtier_free(t);
        rm_rf(dir);
    }
}

/* Seeds for fuzz_kvtier: records as its store (params in fuzz_kvtier.c: payload 64, block 8,
 * its key for odd first bytes) writes them, whole, cut, and flipped. Byte 0 = mode. */
PC_TEST(corpus_seeds)
{
    const char *out = getenv("KVGW_KVTIER_CORPUS");
    char tmp[300];
    if (out == NULL) { /* still checked: into a scratch directory */
        snprintf(tmp, sizeof tmp, "%s", pc_test_tmp_path("seeds"));
        ASSERT_EQ(mkdir(tmp, 0700), 0);
        out = tmp;
    }
    for (int sealed = 0; sealed < 2; sealed++) {
        const char *dir = fresh_dir();
        uint8_t key[32];
        for (int i = 0; i < 32; i++)
            key[i] = (uint8_t)(0xa0 + i);
        eng_kvtier_params_t p = eng_kvtier_params_default();
        p.dir = dir;
        p.payload_bytes = 64;
        p.block_tokens = 8;
        p.key = sealed ? key : NULL;
        eng_kvtier_t *t = open_ok(&p);
        ASSERT_TRUE(t != NULL);
        eng_kvtier_name_t seed, n0, n1;
        eng_kvtier_ident_t id = {.model_fp = 1, .block_tokens = 8};
        eng_kvtier_seed(&id, &seed);
        int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        uint8_t pay[64];
        memset(pay, 0x5a, sizeof pay);
        eng_kvtier_name_next(&seed, tok, 8, &n0);
        eng_kvtier_name_next(&n0, tok, 5, &n1);
        eng_kvtier_rec_t r0 = {.name = n0, .ns = 3, .n_tokens = 8, .tokens = tok};
        eng_kvtier_rec_t r1 = {
            .name = n1, .parent = n0, .ns = 3, .block_index = 1, .n_tokens = 5, .tokens = tok};
        ASSERT_EQ(eng_kvtier_put(t, &r0, pay, 64), 0);
        ASSERT_EQ(eng_kvtier_put(t, &r1, pay, 64), 0);
        eng_kvtier_free(t);
        const eng_kvtier_name_t *names[2] = {&n0, &n1};
        for (int r = 0; r < 2; r++) {
            char path[400], o[600];
            path_of(dir, names[r], path, sizeof path);
            size_t len;
            uint8_t *f = pc_test_slurp(path, &len);
            ASSERT_TRUE(f != NULL);
            uint8_t *s = malloc(len + 1);
            s[0] = (uint8_t)sealed;
            memcpy(s + 1, f, len);
            size_t cuts[] = {len, 4096, 100, 160 + 4 * 8};
            for (int k = 0; k < 4; k++) {
                snprintf(o, sizeof o, "%s/seed-%s-%d-cut%zu", out, sealed ? "sealed" : "plain", r,
                         cuts[k]);
                write_file(o, s, cuts[k] + 1);
            }
            s[0] ^= 1; /* read by the other store: stale */
            snprintf(o, sizeof o, "%s/seed-%s-%d-otherstore", out, sealed ? "sealed" : "plain", r);
            write_file(o, s, len + 1);
            s[0] ^= 1;
            s[1 + 4096 + 10] ^= 1; /* in the payload: found by the get */
            snprintf(o, sizeof o, "%s/seed-%s-%d-flippayload", out, sealed ? "sealed" : "plain", r);
            write_file(o, s, len + 1);
            s[1 + 4096 + 10] ^= 1;
            s[1 + 130] ^= 1; /* in the head: found by the scan */
            snprintf(o, sizeof o, "%s/seed-%s-%d-flip", out, sealed ? "sealed" : "plain", r);
            write_file(o, s, len + 1);
            free(s);
            free(f);
        }
        rm_rf(dir);
    }
    ASSERT_EQ(count_files(out), 28);
    if (out == tmp)
        rm_rf(tmp);
}

PC_TEST_MAIN()
