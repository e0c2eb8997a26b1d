/*
 * kvtier.h — the KV tier store: fixed-size records (one KV block each) below the pool, on local
 * disk (G3, every backend) or in host memory (G2, the CUDA backend). The code is
 * engine/kvtier.c. The store moves bytes: it knows nothing of the pool, the model or sequences
 * (engine.c knows blocks and calls it); it reads a clock only to time its loads (stats).
 *
 * Names. A record is named by a 32-byte BLAKE2b chain over the prompt's blocks:
 *
 *   seed   = H("kvgw-kv-v1" | model_fp | kv_dtype | layout_version | block_tokens | ns)
 *   name_0 = H(seed | tokens of block 0),   name_i = H(name_{i-1} | tokens of block i)
 *
 * (eng_kvtier_seed, eng_kvtier_name_next: the one implementation, shared by the engine and the
 * tests). Everything the KV of a block depends on is in its name: the model file with its
 * weights, the KV dtype and layout, the namespace (so a tier never serves one tenant's KV to
 * another) and every token up to the block's end. A record also keeps its parent's name, its
 * namespace id, its block index and its token ids, so that after a restart the engine can
 * rebuild the prefix chains from the index (eng_kvtier_foreach). The namespace id is the
 * gateway's keyed hash, never a tenant id or salt.
 *
 * The record, byte by byte (little-endian). A record is a head section padded to a multiple of
 * 4096 bytes, then the payload padded to a multiple of 4096 bytes (so O_DIRECT can read it):
 *
 *   off  size  field
 *     0     8  magic "KVGWKVB\0"
 *     8     4  format version (ENG_KVTIER_FORMAT = 1)
 *    12     4  flags: bit 0 = encrypted (the other bits are 0)
 *    16    32  name
 *    48    32  parent name (all zero for block 0)
 *    80     8  namespace id
 *    88     4  block index in its prompt (0 = the first block)
 *    92     4  n_tokens (1 ..= block_tokens; a prompt's last block may be partial)
 *    96     4  payload bytes
 *   100     4  head bytes (128 + 32 + 4 * n_tokens rounded up to 4096)
 *   104     8  key id: the first 8 bytes of H("kvgw-kv-key" | key) when encrypted, else 0
 *   112    16  nonce: the first 16 bytes of XChaCha20's 24 (the other 8 are 0 for the tokens'
 *              message and 1 for the payload's); random per record; 0 when not encrypted
 *   128    16  head check: XXH3-128 of bytes [0, 128) and the token bytes; encrypted: the
 *              AEAD tag of the tokens (associated data bytes [0, 128))
 *   144    16  record check: XXH3-128 of bytes [0, 144), the token bytes and the payload;
 *              encrypted: the AEAD tag of the payload (associated data bytes [0, 144))
 *   160  4*n   token ids (int32; encrypted: their ciphertext)
 *     .     .  zero padding to head bytes
 *   head   pb  payload (encrypted: its ciphertext), then zero padding to a multiple of 4096
 *
 * Encryption (a 32-byte key in the params) is XChaCha20-Poly1305 (libsodium); a file then has
 * no token id or payload byte in the clear. Its cost, measured on this project's build machine
 * (AMD EPYC, one core): 85 us to seal or open a 128 KiB block (1.5 GB/s), against 9 us to check
 * and copy a plain one (XXH3-128, 14 GB/s). A record is checked as a whole on every get: magic,
 * version, the name asked for, the chain (name = H(parent | tokens), or H(seed | tokens) is the
 * caller's business for block 0), the tokens the caller expects, the sizes, the file's length,
 * the checks or tags. A record that fails is deleted, counted in corrupt, and the get answers
 * PC_ERR_NOTFOUND: a bad record is never served.
 *
 * On disk: DIR/xx/<64 hex of the name>.kvb, xx the name's first byte in hex; directories 0700,
 * files 0600. DIR/LOCK is flock'ed while a store is open: one store per directory (a second
 * open answers PC_ERR_BUSY), so give every worker its own. A put writes DIR/xx/.<hex>.<n>.tmp and
 * renames it over the final name; no fsync unless eng_kvtier_put_sync or params.fsync (a worker
 * crash keeps the page cache; a file torn by a machine crash fails its checks). Reads use O_DIRECT
 * where the file system takes it (else plain reads and posix_fadvise DONTNEED, so the page cache
 * does not keep a second copy). eng_kvtier_open rebuilds the index by scanning DIR (each record's
 * head section only): temp files are deleted, so are records whose head fails its checks (corrupt)
 * and records this store cannot serve (stale: another format version, payload size, block size or
 * key); the LRU order is the files' modification times.
 *
 * In memory (G2, params.kind = ENG_KVTIER_HOST): the same API and budget, no files; each
 * record's payload sits in a buffer from params.host_alloc (e.g. cudaHostAlloc, so copies to
 * the device can be asynchronous), which eng_kvtier_host_ref lends out without a copy.
 *
 * Budget: the sum of the records' sizes (on disk, the padded file size; in memory, the
 * payload) stays at most max_bytes; a put evicts the least recently used records (by last get
 * or put) to make room, never one lent out by eng_kvtier_host_ref.
 *
 * Threads: every function may be called from any thread; one mutex guards the index, and file
 * opens, reads and writes run outside it (a get opens the file after looking it up: one an
 * eviction unlinked meanwhile is a miss, and an open file stays whole). Gets from several
 * threads read in parallel: one get is one synchronous preadv of a record (its head into a
 * buffer of the store's, its payload straight into the caller's buffer when that is 4096-aligned
 * and the payload a multiple of 4096, else through the buffer and a copy), bound by the disk's
 * latency, so a reader that wants the disk's bandwidth keeps a few gets in flight, which
 * eng_kvtier_get_many does (measured on 128 KiB blocks, page cache dropped: 1 thread of gets
 * about 0.2 GB/s, 8 threads 0.35-0.55 GB/s, against 0.53 GB/s for a sequential 1 MiB O_DIRECT
 * read of the same disk).
 *
 * Costs: the index holds about 200 bytes and the token ids per record in memory; an open reads
 * every record's head section (4 KiB). After a reopen the LRU order is the files' modification
 * times (last put), not the last gets before the restart.
 */
#ifndef ENG_KVTIER_H
#define ENG_KVTIER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define ENG_KVTIER_NAME_BYTES 32
#define ENG_KVTIER_KEY_BYTES 32
#define ENG_KVTIER_FORMAT 1
#define ENG_KVTIER_MAX_TOKENS 4096        /* most tokens a record (one block) can hold */
#define ENG_KVTIER_MAX_PAYLOAD (1u << 30) /* most payload bytes a record can hold */
#define ENG_KVTIER_MAX_IO_THREADS 16

typedef struct eng_kvtier eng_kvtier_t;

typedef struct eng_kvtier_name {
    uint8_t b[ENG_KVTIER_NAME_BYTES];
} eng_kvtier_name_t;

/* What a chain's seed is made of: everything the KV depends on besides the tokens. */
typedef struct eng_kvtier_ident {
    uint64_t model_fp;       /* XXH3 of the whole model file, weights included */
    uint32_t kv_dtype;       /* enum eng_kv_dtype */
    uint32_t layout_version; /* the pool's block layout; bump it when the layout changes */
    uint32_t block_tokens;   /* tokens per block */
    uint64_t ns;             /* namespace id */
} eng_kvtier_ident_t;

/* The chain's seed for id (name of "block -1"). */
void eng_kvtier_seed(const eng_kvtier_ident_t *id, eng_kvtier_name_t *out);

/* The name of the block after prev holding tokens[n_tokens]; out may alias prev. */
void eng_kvtier_name_next(const eng_kvtier_name_t *prev, const int32_t *tokens, uint32_t n_tokens,
                          eng_kvtier_name_t *out);

/* The names of the blocks of tokens[n_tokens] cut every id->block_tokens tokens (the last block
 * may be partial), at most max_names of them, into names[]; returns how many were written. */
uint32_t eng_kvtier_chain(const eng_kvtier_ident_t *id, const int32_t *tokens, uint32_t n_tokens,
                          eng_kvtier_name_t *names, uint32_t max_names);

/* Lowercase hex of a name into hex[65] (NUL-terminated); returns hex. */
char *eng_kvtier_name_hex(const eng_kvtier_name_t *name, char hex[65]);

enum eng_kvtier_kind {
    ENG_KVTIER_HOST = 2, /* G2: host memory */
    ENG_KVTIER_DISK = 3, /* G3: a local directory */
};

/* The record writer: writes len bytes of buf at off of fd, returns the count written (a short
 * count is retried from there) or -1 with errno set. Default: pwrite. Tests install one that
 * fails or cuts a write at any offset. */
typedef ssize_t (*eng_kvtier_write_fn)(void *ud, int fd, const void *buf, size_t len, uint64_t off);

typedef struct eng_kvtier_params {
    enum eng_kvtier_kind kind; /* default ENG_KVTIER_DISK */
    const char *dir;           /* DISK: the store's directory (created 0700 if absent) */
    uint64_t max_bytes;        /* byte budget (default 1 GiB) */
    uint32_t payload_bytes;    /* every record's payload size (eng_kvpool_block_bytes), > 0 */
    uint32_t block_tokens;     /* most tokens per record (the pool's block_tokens), > 0 */
    const uint8_t *key;        /* NULL, or ENG_KVTIER_KEY_BYTES bytes: encrypt at rest (DISK) */
    int direct_io;             /* 1 (default): read with O_DIRECT where possible; 0: never */
    int fsync;                 /* 1: every put is eng_kvtier_put_sync */
    uint32_t io_threads;       /* reads in flight in eng_kvtier_get_many (default 4, at most 16) */
    eng_kvtier_write_fn write_fn; /* NULL = pwrite */
    void *write_ud;
    /* HOST: a record's payload buffer (NULL = pc_malloc / pc_free); may return NULL. */
    void *(*host_alloc)(void *ud, size_t bytes);
    void (*host_free)(void *ud, void *ptr, size_t bytes);
    void *host_ud;
} eng_kvtier_params_t;

eng_kvtier_params_t eng_kvtier_params_default(void);

/* Opens (DISK: creates, or scans and recovers) a store. Returns 0 and *out, or an error with a
 * reason in err: PC_ERR_INVAL (bad params), PC_ERR_IO / PC_ERR_PERM (the directory),
 * PC_ERR_BUSY (another store has the directory open), PC_ERR_NOMEM. A directory with looser modes
 * than 0700 is tightened. */
int eng_kvtier_open(const eng_kvtier_params_t *p, eng_kvtier_t **out, char *err, size_t err_len);

/* Frees the store's memory (DISK: the files stay). NULL is a no-op. No call may be running. */
void eng_kvtier_free(eng_kvtier_t *t);

/* A record's description. In a put every field is the caller's (tokens read during the call);
 * in eng_kvtier_foreach the pointer is valid during the callback only. */
typedef struct eng_kvtier_rec {
    eng_kvtier_name_t name;
    eng_kvtier_name_t parent; /* all zero for block 0 */
    uint64_t ns;
    uint32_t block_index;
    uint32_t n_tokens;     /* 1 ..= params.block_tokens */
    const int32_t *tokens; /* [n_tokens] */
} eng_kvtier_rec_t;

/* Stores a record: rec's fields and payload[payload_bytes] (payload_bytes must equal
 * params.payload_bytes). Evicts LRU records to stay within the budget. Returns 0, 1 when a
 * record of that name is already held (made most recent, nothing written), PC_ERR_INVAL
 * (sizes, a name that is not H(parent | tokens) for block_index > 0), PC_ERR_NOSPACE (the
 * record alone exceeds the budget, or everything else is lent out), PC_ERR_IO (the write
 * failed: nothing of it stays, on disk or in the index), PC_ERR_NOMEM. */
int eng_kvtier_put(eng_kvtier_t *t, const eng_kvtier_rec_t *rec, const void *payload,
                   size_t payload_bytes);

/* As eng_kvtier_put, and the record is durable before it returns: its file and its directory
 * are fsync'ed (for what a machine crash must not lose, e.g. retained prefixes). */
int eng_kvtier_put_sync(eng_kvtier_t *t, const eng_kvtier_rec_t *rec, const void *payload,
                        size_t payload_bytes);

/* Reads the record `name` into payload[payload_bytes] after checking everything (top of
 * file), including that it holds exactly tokens[n_tokens]; makes it most recent. Returns 0,
 * PC_ERR_NOTFOUND (absent, or bad: deleted and counted corrupt; or holding other tokens: left
 * alone), PC_ERR_INVAL (payload_bytes), PC_ERR_IO, PC_ERR_NOMEM. payload is unspecified after a
 * failure. A 4096-aligned payload buffer is read into directly (no copy; see Threads). */
int eng_kvtier_get(eng_kvtier_t *t, const eng_kvtier_name_t *name, const int32_t *tokens,
                   uint32_t n_tokens, void *payload, size_t payload_bytes);

/* One read of eng_kvtier_get_many. */
typedef struct eng_kvtier_read {
    eng_kvtier_name_t name;
    const int32_t *tokens; /* [n_tokens], the tokens the record must hold */
    uint32_t n_tokens;
    void *payload; /* [params.payload_bytes], written when rc is 0 */
    int rc;        /* out: as eng_kvtier_get */
} eng_kvtier_read_t;

/* The gets of reads[n], with up to params.io_threads of them in flight (threads of this call,
 * joined before it returns; the caller's thread is one): a run of blocks loads at the disk's
 * bandwidth rather than its latency. Returns how many were served; each read's rc says which.
 * load_ns counts this call's wall time once. */
uint32_t eng_kvtier_get_many(eng_kvtier_t *t, eng_kvtier_read_t *reads, uint32_t n);

/* 1 when a record of that name is in the index, else 0. No I/O, no LRU change, no counters. */
int eng_kvtier_contains(eng_kvtier_t *t, const eng_kvtier_name_t *name);

/* Removes a record (DISK: its file). Returns 0 or PC_ERR_NOTFOUND; PC_ERR_BUSY while lent. */
int eng_kvtier_remove(eng_kvtier_t *t, const eng_kvtier_name_t *name);

/* HOST only: lends the payload of `name` (holding tokens[n_tokens]) without a copy: *payload
 * stays valid and the record is neither evicted nor removed until eng_kvtier_host_unref.
 * Counts as a get (hit, load). Returns 0, PC_ERR_NOTFOUND, PC_ERR_UNSUPPORTED (DISK). */
int eng_kvtier_host_ref(eng_kvtier_t *t, const eng_kvtier_name_t *name, const int32_t *tokens,
                        uint32_t n_tokens, const void **payload);
void eng_kvtier_host_unref(eng_kvtier_t *t, const eng_kvtier_name_t *name);

/* Calls fn for every record in the index, least recently used first; fn returns 0 to go on,
 * anything else stops the walk and is returned. The store is locked during the walk: fn must
 * not call the store. */
typedef int (*eng_kvtier_foreach_fn)(void *ud, const eng_kvtier_rec_t *rec);
int eng_kvtier_foreach(eng_kvtier_t *t, eng_kvtier_foreach_fn fn, void *ud);

/* Evictions are reported (with the lock held: fn must not call the store) so the engine can
 * tell the gateway a block left this tier. reason: 1 budget (LRU), 2 corrupt, 3 removed. */
typedef void (*eng_kvtier_evict_fn)(void *ud, const eng_kvtier_rec_t *rec, int reason);
void eng_kvtier_set_evict_cb(eng_kvtier_t *t, eng_kvtier_evict_fn fn, void *ud);

typedef struct eng_kvtier_stats {
    uint64_t bytes; /* held, counted against the budget */
    uint64_t max_bytes;
    uint64_t records;
    uint64_t hits, misses; /* gets (and host refs) found and served / not served */
    uint64_t loads;        /* records read and verified (= hits) */
    uint64_t load_bytes;   /* payload bytes served */
    uint64_t load_ns;      /* wall time of served gets (a get_many once): load_bytes / load_ns */
    uint64_t writes;       /* records written */
    uint64_t write_bytes;  /* payload bytes written */
    uint64_t write_errors; /* puts that failed in I/O */
    uint64_t evictions;    /* records evicted for the budget */
    uint64_t corrupt;      /* bad records found (get or open) and deleted */
    uint64_t stale;        /* unusable records (version, sizes, key) deleted at open */
    int direct_io;         /* 1 when reads bypass the page cache with O_DIRECT */
    int encrypted;
} eng_kvtier_stats_t;

void eng_kvtier_stats(eng_kvtier_t *t, eng_kvtier_stats_t *out);

/* The size a record takes against the budget (DISK: the padded file; HOST: the payload). */
uint64_t eng_kvtier_record_bytes(const eng_kvtier_t *t, uint32_t n_tokens);

#endif
