/*
 * fuzz_kvtier.c — libFuzzer target for the KV tier store's on-disk records (engine/kvtier.c):
 * the bytes become a record file, the store's scan opens it, and every record it indexes is
 * read back with a get.
 *
 * Byte 0 picks the store: bit 0 set, sealed (the key below); clear, checksummed. The rest is the
 * file, named after the name field it claims (bytes 16..48), so the scan looks at it as its own.
 * The store is the seeds' (tests/unit/engine/test_kvtier.c corpus_seeds): payload 64 bytes,
 * 8 tokens a block. Properties: the open succeeds; the file is either indexed (one record, its
 * name the file's, at most 8 tokens) or gone (counted corrupt or stale); an indexed record's
 * get either serves it (twice, the same bytes) or answers NOTFOUND, counts it corrupt and
 * removes the file; files on disk = records in the index. Anything else (a crash, a sanitizer
 * report, a broken property) aborts.
 */
#define _GNU_SOURCE /* nftw */
#include "common.h"
#include "kvtier.h"

#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FZ_PAYLOAD 64
#define FZ_BLOCK 8
#define FZ_MAX_FILE (64 * 1024) /* a record of this store is 8192 bytes; larger is junk */

static char dir[256];

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb;
    (void)flag;
    (void)f;
    return remove(p);
}

__attribute__((destructor)) static void remove_dir(void)
{
    if (dir[0] != '\0')
        nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static int n_files;

static int count_one(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb;
    n_files += flag == FTW_F && strcmp(p + f->base, "LOCK") != 0;
    return 0;
}

static int count_files(void)
{
    n_files = 0;
    if (nftw(dir, count_one, 16, FTW_PHYS) != 0)
        abort();
    return n_files;
}

typedef struct seen {
    int n;
    eng_kvtier_rec_t rec;
    int32_t tokens[FZ_BLOCK];
} seen_t;

static int on_rec(void *ud, const eng_kvtier_rec_t *r)
{
    seen_t *s = ud;
    if (s->n++ > 0 || r->n_tokens == 0 || r->n_tokens > FZ_BLOCK)
        abort();
    s->rec = *r;
    memcpy(s->tokens, r->tokens, 4 * (size_t)r->n_tokens);
    s->rec.tokens = s->tokens;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > FZ_MAX_FILE + 1)
        return 0;
    if (dir[0] == '\0') {
        pc_log_set_level(PC_LOG_OFF);
        snprintf(dir, sizeof dir, "%s/kvgw_fuzz_kvtier.%d",
                 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp", (int)getpid());
        remove_dir();
    }
    static const uint8_t key[32] = {0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7,
                                    0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf,
                                    0xb0, 0xb1, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7,
                                    0xb8, 0xb9, 0xba, 0xbb, 0xbc, 0xbd, 0xbe, 0xbf};
    eng_kvtier_params_t p = eng_kvtier_params_default();
    p.dir = dir;
    p.payload_bytes = FZ_PAYLOAD;
    p.block_tokens = FZ_BLOCK;
    p.key = (data[0] & 1) ? key : NULL;
    p.direct_io = 0;
    const uint8_t *file = data + 1;
    size_t len = size - 1;

    /* The store creates DIR; then the file goes where a record of its claimed name lives. */
    eng_kvtier_t *t = NULL;
    char err[256];
    if (eng_kvtier_open(&p, &t, err, sizeof err) != 0)
        abort();
    eng_kvtier_free(t);
    eng_kvtier_name_t name = {{0}};
    if (len >= 48)
        memcpy(name.b, file + 16, 32);
    char hex[65], sub[400], path[500];
    eng_kvtier_name_hex(&name, hex);
    snprintf(sub, sizeof sub, "%s/%.2s", dir, hex);
    snprintf(path, sizeof path, "%s/%s.kvb", sub, hex);
    mkdir(sub, 0700);
    FILE *f = fopen(path, "wb");
    if (f == NULL || (len > 0 && fwrite(file, 1, len, f) != len) || fclose(f) != 0)
        abort();

    if (eng_kvtier_open(&p, &t, err, sizeof err) != 0)
        abort();
    eng_kvtier_stats_t st;
    eng_kvtier_stats(t, &st);
    seen_t s = {0};
    if (eng_kvtier_foreach(t, on_rec, &s) != 0 || (uint64_t)s.n != st.records || st.records > 1)
        abort();
    if (st.records == 0 && (st.corrupt + st.stale != 1 || count_files() != 0))
        abort();
    if (st.records == 1) {
        if (memcmp(s.rec.name.b, name.b, 32) != 0 || count_files() != 1)
            abort();
        uint8_t a[FZ_PAYLOAD], b[FZ_PAYLOAD];
        int rc = eng_kvtier_get(t, &name, s.tokens, s.rec.n_tokens, a, sizeof a);
        if (rc == 0) {
            if (eng_kvtier_get(t, &name, s.tokens, s.rec.n_tokens, b, sizeof b) != 0 ||
                memcmp(a, b, sizeof a) != 0 || count_files() != 1)
                abort();
        } else {
            eng_kvtier_stats(t, &st);
            if (rc != PC_ERR_NOTFOUND || st.corrupt != 1 || st.records != 0 || count_files() != 0)
                abort();
        }
    }
    eng_kvtier_free(t);
    unlink(path);
    return 0;
}
