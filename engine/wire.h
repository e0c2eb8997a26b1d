/*
 * wire.h — the worker protocol codec: frames between the gateway and `kvgw worker` over TCP.
 *
 * The protocol is a stream of length-prefixed frames in both directions. This file only
 * encodes and decodes; the connection logic (handshake, heartbeats, cancel on disconnect) lives
 * in the worker server and the gateway's worker link. Every multi-byte integer is little-endian;
 * floats are IEEE-754 binary32 bit patterns, little-endian. There is no padding anywhere.
 *
 * Frame header (12 bytes):
 *
 *   offset  size  field
 *   0       2     magic: the bytes 'K' 'W' (0x4B 0x57)
 *   2       1     version: ENG_WIRE_VERSION (4); a frame of any other version is refused
 *   3       1     type: enum eng_wire_type
 *   4       4     flags: u32, none defined in version 4: must be 0
 *   8       4     payload length: u32, at most the receiver's max_frame (default 64 MiB)
 *   12      ...   payload
 *
 * Payload building blocks:
 *   u8 u16 u32 u64 i32   little-endian integers
 *   f32                  IEEE-754 binary32, little-endian bit pattern (must be finite here)
 *   b32                  32 raw bytes (nonces and HMAC-SHA256 tags)
 *   str                  u32 byte length, then that many bytes of valid UTF-8 (no terminator)
 *   arr<T>               u32 count, then count elements of T back to back
 *
 * Payloads by type (fields in this order, nothing after the last one):
 *
 *   type  name       direction  fields
 *   1     HELLO      gw -> wk   u16 version_min, u16 version_max, u8 role (1 gateway),
 *   2     HELLO_ACK  wk -> gw     u32 heartbeat_ms, u32 max_frame, str node, str model_name,
 *                                 u64 model_fp, u32 n_vocab, u32 n_ctx, u32 block_tokens,
 *                                 u32 total_blocks, u32 max_prompt_tokens, b32 auth
 *   3     REJECT     wk -> gw   i32 code, str message
 *   4     HEARTBEAT  both       u64 time_ms
 *   5     SUBMIT     gw -> wk   u64 request_id, u64 ns, i32 priority, u32 max_tokens, u32 flags,
 *                                 f32 temperature, u32 top_k, f32 top_p, f32 min_p, u64 seed,
 *                                 arr<u32> tokens, arr<{u32 n_tokens, u64 ttl_ms}> retain,
 *                                 arr<str> stops, arr<u32> stop_ids
 *   6     CANCEL     gw -> wk   u64 request_id
 *   7     TOKEN      wk -> gw   u64 request_id, u32 token_id, str text
 *   8     DONE       wk -> gw   u64 request_id, u8 stop_reason, i32 stop_index, str text,
 *                                 u32 prompt_tokens, u32 tokens_reused, u32 tokens_computed,
 *                                 u32 output_tokens, u64 queue_us, u64 prefill_us, u64 decode_us
 *   9     ERROR      wk -> gw   u64 request_id, i32 code, str message
 *   10    KV_EVENT   wk -> gw   u8 kind, u8 reason, u8 tier, u64 ns, u32 n_tokens,
 *                                 u64 prefix_fp, u32 n_kept, u64 request_id, u64 ttl_ms,
 *                                 arr<u32> tokens
 *   11    LOAD       wk -> gw   u32 queued_requests, u64 queued_prefill_tokens,
 *                                 u32 running_seqs, u32 free_blocks, u32 cached_blocks,
 *                                 u32 total_blocks, f32 prefill_tokens_per_s,
 *                                 f32 decode_ms_per_token, tier g2, tier g3,
 *                                 u64 tokens_recomputed
 *                               where tier is: u64 max_bytes, u64 bytes, u32 blocks, u64 hits,
 *                                 u64 loads, u64 load_bytes, u64 load_us, u64 tokens_loaded,
 *                                 u64 writes, u64 writes_dropped, u64 evictions, u64 corrupt,
 *                                 f32 load_bytes_per_s
 *   12    CHALLENGE  wk -> gw   b32 nonce
 *   13    AUTH       gw -> wk   b32 mac
 *   14    RELEASE    gw -> wk   u64 ns, arr<u32> tokens
 *   15    DROP       gw -> wk   u64 ns
 *   16    SNAPSHOT   wk -> gw   u64 snapshot_id, u8 last (0 or 1),
 *                                 arr<{u64 ns, u64 prefix_fp, u64 ttl_ms, u8 tier,
 *                                      arr<u32> tokens}>
 *   17    PREFILL    wk -> gw   u64 request_id, u32 prompt_tokens, u32 tokens_g1,
 *                                 u32 tokens_g2, u32 tokens_g3, u32 tokens_recomputed
 *
 * The fields in detail:
 *
 *   HELLO, HELLO_ACK: the handshake. The connecting side (the gateway) sends HELLO with the
 *     range of versions it speaks and the model it expects (an empty name, fingerprint 0,
 *     n_vocab 0 mean "any"); the worker answers HELLO_ACK (version_min = version_max = the
 *     version it picked, and its own model identity and sizes) or REJECT. With a link secret
 *     configured on the worker, a CHALLENGE / AUTH exchange comes between HELLO and HELLO_ACK
 *     (below). No other frame may precede the handshake's end.
 *       role: 1 gateway, 2 worker (HELLO is sent by role 1, HELLO_ACK by role 2);
 *       heartbeat_ms: the sender's heartbeat interval (the peer is dead after 3 missed);
 *       max_frame: the largest payload the sender accepts;
 *       node: free-form, for logs (host name, worker id; at most 256 bytes);
 *       model_name: at most 256 bytes; model_fp: a fingerprint of the model (worker.h);
 *       n_vocab, n_ctx (the longest sequence), block_tokens (KV block size in tokens);
 *       total_blocks (the KV pool's blocks) and max_prompt_tokens (the longest prompt the
 *         worker can ever run): the router's sizes; 0 in HELLO;
 *       auth: in HELLO the gateway's nonce (32 random bytes when it has a link secret, else
 *         anything); in HELLO_ACK the worker's proof HMAC-SHA256(secret, "kvgw-link-v2 worker"
 *         || gateway nonce || worker nonce) after a CHALLENGE, all zero on a link without a
 *         secret.
 *   CHALLENGE: the worker has a link secret; nonce: 32 random bytes of the worker's. The
 *     gateway answers AUTH with mac = HMAC-SHA256(secret, "kvgw-link-v2 gateway" || worker
 *     nonce || gateway nonce) (the labels are ASCII without a terminator). The worker compares
 *     in constant time (link/wire_conn.h: lnk_wire_auth_mac computes both proofs). A wrong
 *     or missing AUTH closes the connection without a reply: before the peer proved the
 *     secret, the worker sends nothing but CHALLENGE (and REJECT for a HELLO that breaks the
 *     protocol: a version, role, heartbeat or max_frame out of range), never anything about
 *     its model; a model the HELLO asks for and the worker lacks is refused only after AUTH.
 *     The secret itself never crosses the wire; both nonces make a recorded exchange useless
 *     for another connection, in either direction.
 *   Sealing (since version 3). On a link with a secret, every byte after AUTH (gateway -> worker)
 *     and after CHALLENGE (worker -> gateway) travels in sealed records: each direction's
 *     frame stream, from HELLO_ACK or REJECT on, encrypted and authenticated with a key
 *     derived from the secret and both nonces (link/wire_seal.h documents the records byte by
 *     byte). A record that does not verify ends the connection. A link without a secret is
 *     neither authenticated nor sealed (kvgw worker warns about it).
 *   REJECT: the handshake failed; the sender closes the connection after it.
 *       code: a PC_ERR_* (negative); message: at most 4096 bytes
 *   HEARTBEAT: either direction, every heartbeat_ms when nothing else was sent.
 *       time_ms: the sender's monotonic clock (for round-trip estimates)
 *   SUBMIT: a new request.
 *       request_id (nonzero, unique per connection while live), ns (namespace id),
 *       priority (higher runs first; 0 default), max_tokens (0: prefill only),
 *       flags (bit 0: ENG_WIRE_SUBMIT_IGNORE_EOG, generate max_tokens even past
 *       end-of-generation tokens; other bits must be 0), the sampling parameters
 *       (sampling.h), tokens (the prompt, at least 1),
 *       retain: prefixes tokens[0..n_tokens) to pin in the worker's cache until ttl_ms after
 *         the worker's receipt of the frame (1 <= n_tokens <= the prompt's, at most 64
 *         entries); a prefix pinned already keeps its one pin, whose expiry moves to the later
 *         of the two (a TTL refresh: pins do not grow with traffic),
 *       stops (stop sequences, at most ENG_STOP_MAX_SEQS of 1..ENG_STOP_MAX_BYTES),
 *       stop_ids (extra stop token ids besides the model's end-of-generation ones, at most 64)
 *     The codec checks structure and these limits; the semantic ranges of the sampling
 *     parameters (eng_sampling_params_check) and token ids < n_vocab are the worker's to check,
 *     and a bad value there fails the request with ERROR, not the connection.
 *   CANCEL: request_id (nonzero).
 *   TOKEN: one generated token: request_id, token_id, text (the text released with this token
 *     after the incremental decoder and the stop matcher: possibly empty, possibly including
 *     text of earlier tokens that was held back).
 *   DONE: the request finished (its last frame). stop_reason (enum eng_wire_stop),
 *     stop_index (the stop sequence that matched, or -1), text (held-back text released at
 *     the end; empty after a stop sequence), prompt_tokens, tokens_reused (KV found in the
 *     worker's cache: the physical hit), tokens_computed (prompt tokens prefilled, including
 *     any recomputed after preemption), output_tokens; the worker's own timings in
 *     microseconds: queue_us (receipt to first admission), prefill_us (first admission to the
 *     end of the prefill), decode_us (end of the prefill to the final event); so the worker's
 *     time to first token is queue_us + prefill_us.
 *   ERROR: request_id nonzero fails that request (its last frame); request_id 0 is about the
 *     connection, which the sender closes after it. code (a PC_ERR_*), message (<= 4096 bytes).
 *   KV_EVENT: a change in what the worker's cache holds (below).
 *   LOAD: after every HEARTBEAT the worker receives, after the handshake, and periodically
 *     while it works; the router's input. Counts as eng_worker_load documents, and two moving
 *     averages (0 until measured, finite and >= 0): prefill_tokens_per_s (prompt tokens
 *     computed per second of step time) and decode_ms_per_token (the step time a decoding
 *     sequence waits for its next token). Then the KV tiers below the pool (version 4), G2
 *     (host memory, CUDA workers) then G3 (local disk), each: max_bytes (its byte budget; 0:
 *     the tier is off, and then every other field of it is 0), bytes and blocks held now
 *     (both 0 or both nonzero), and counters since the worker started: hits (blocks a lookup
 *     found there), loads, load_bytes and load_us (blocks copied into the pool from there,
 *     their bytes and the time the copies took), tokens_loaded (prompt tokens taken from
 *     there instead of prefilled: the recomputes avoided), writes (blocks written to it),
 *     writes_dropped (blocks not written because the write-behind queue was full), evictions
 *     (blocks its budget dropped), corrupt (records that failed their checks: deleted, never
 *     served); and load_bytes_per_s, the moving average of its load bandwidth (0 until
 *     measured, finite and >= 0): with prefill_tokens_per_s, the inputs of the load versus
 *     recompute cost model. tokens_recomputed: prompt tokens of holes (blocks in no tier
 *     between blocks that were loaded) recomputed since start.
 *   RELEASE: the gateway ends a retained prefix early (its TTL ended at the gateway): the pin
 *     of tokens[0..n) (at least 1 token) in ns goes, the KV stays cached unpinned; KV_EVENT
 *     RELEASED follows when it was pinned, nothing when it was not.
 *   DROP: the gateway drops everything of namespace ns (tenant deleted, salt rotated): every
 *     pin of ns is released (KV_EVENT RELEASED each) and every cached prefix of ns removed
 *     (KV_EVENT EVICTED, reason REMOVED). Requests of ns that are running go on and may cache
 *     their prompts in ns again.
 *   SNAPSHOT: the worker's pinned prefixes, and the prefixes it holds only in a lower tier,
 *     sent after HELLO_ACK (resync of a new or reconnected gateway) in one or more frames with
 *     the same snapshot_id, the last with last = 1 (an empty snapshot is one frame with no
 *     entries). Each entry: ns, prefix_fp (eng_wire_prefix_fp of its tokens; the decoder
 *     checks it), ttl_ms (milliseconds left until its pin expires, at the time the snapshot
 *     was taken), tier (enum eng_wire_tier: 1 pinned in the pool, as in version 3; 2 or 3
 *     held only in G2 or G3, not pinned, ttl_ms 0: what a restarted worker found on its disk),
 *     tokens (at least 1). Every KV_EVENT after the snapshot's last frame applies on top of it.
 *   PREFILL: where a request's prompt came from, sent once per request right before its first
 *     TOKEN (or before its DONE when it generates nothing; never after an ERROR): request_id,
 *     prompt_tokens, and the prompt tokens whose KV was taken from the pool (tokens_g1), loaded
 *     from G2 (tokens_g2) or from G3 (tokens_g3), and tokens_recomputed, the tokens of holes
 *     (blocks in no tier) recomputed exactly between loaded blocks; the rest of the prompt was
 *     prefilled as usual. The four sum to at most prompt_tokens. A request preempted and
 *     admitted again reports its first admission only.
 *
 * What KV_EVENT tells the gateway. The gateway's index must learn which namespace + prefix a
 * worker holds or dropped. Both sides know prefixes as token arrays, so a prefix is named by
 * (ns, n_tokens, prefix_fp) where prefix_fp = eng_wire_prefix_fp(tokens, n_tokens): XXH3-64
 * (seed 0) of the token ids as little-endian u32s.
 *   kind           reason  n_kept     request_id       ttl_ms        tokens
 *   RETAINED (1)   0       n_tokens   the request *    ms left       none
 *   RELEASED (2)   0       n_tokens   0                0             none
 *   EVICTED (3)    1..3    < n_tokens 0                0             the path, or none
 *   RETAIN_FAILED (4) 0    0          the request *    ttl asked     none
 *   (*) the worker's request id in-process; on the wire the connection's own id for the
 *       connection that submitted the request, 0 in the copies other connections get.
 *   RETAINED       tokens[0..n_tokens) of the request's prompt is computed and pinned (or its
 *                  pin's expiry moved, a refresh) until ttl_ms from now. Sent once the prefill
 *                  passed n_tokens: from then on the gateway may route readers here.
 *   RELEASED       the prefix's pin expired or was released (RELEASE, DROP); the KV stays
 *                  cached, unpinned. Pins belong to the worker, not to a request or a
 *                  connection: RELEASED goes to every connected gateway.
 *   EVICTED        the cache dropped positions [n_kept, n_tokens) of the path named by
 *                  (ns, n_tokens, prefix_fp); positions below n_kept remain. tokens carries
 *                  the path's n_tokens ids, so the gateway clears this worker from exactly the
 *                  known prefixes that go through the dropped part: those longer than n_kept
 *                  that agree with the path on its first n_kept + 1 tokens (at most their
 *                  length). Without tokens (count 0: the worker had
 *                  no memory to read the path) the gateway must clear every known prefix of
 *                  ns longer than n_kept. reason: enum eng_evict_reason (engine.h).
 *   RETAIN_FAILED  a retain entry of the request could not be pinned (no memory): the prefix
 *                  may be cached, but is not held; the gateway must not count on it.
 * tier (version 4) is EVICTED's: where positions [n_kept, n_tokens) are now. 0: gone from every
 * tier of the worker (dropped from the pool without a lower tier, or from the lowest tier that
 * held them); 2 or 3: they left the tier above and are now held in G2 or G3 (the gateway keeps
 * this worker as a holder of those prefixes, in that tier). Every other kind has tier 0.
 *
 * Frame validity (the decoder rejects everything else, with a reason): magic, version and
 * flags as above; a known type; payload length <= max_frame; every count and length inside the
 * payload (checked before anything is allocated, so a count can never make the decoder
 * allocate more than the payload's size); no bytes left over after the last field; strings
 * valid UTF-8 within their limits; enum fields within range; f32 fields finite; booleans and
 * reserved bits as specified; the KV_EVENT rules of the table; the tiers of KV_EVENT, SNAPSHOT and
 * LOAD and PREFILL's sum as described above; fingerprints that match the tokens they come with. The
 * encoding is canonical: encoding a decoded frame gives back the exact bytes.
 */
#ifndef ENG_WIRE_H
#define ENG_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pc_buf.h"
#include "sampling.h"

#define ENG_WIRE_VERSION 4
#define ENG_WIRE_HEADER_BYTES 12
#define ENG_WIRE_MAX_FRAME_DEFAULT (64u << 20)
#define ENG_WIRE_NAME_MAX 256
#define ENG_WIRE_MESSAGE_MAX 4096
#define ENG_WIRE_RETAIN_MAX 64
#define ENG_WIRE_STOP_IDS_MAX 64
#define ENG_WIRE_AUTH_BYTES 32

enum eng_wire_type {
    ENG_WIRE_HELLO = 1,
    ENG_WIRE_HELLO_ACK = 2,
    ENG_WIRE_REJECT = 3,
    ENG_WIRE_HEARTBEAT = 4,
    ENG_WIRE_SUBMIT = 5,
    ENG_WIRE_CANCEL = 6,
    ENG_WIRE_TOKEN = 7,
    ENG_WIRE_DONE = 8,
    ENG_WIRE_ERROR = 9,
    ENG_WIRE_KV_EVENT = 10,
    ENG_WIRE_LOAD = 11,
    ENG_WIRE_CHALLENGE = 12,
    ENG_WIRE_AUTH = 13,
    ENG_WIRE_RELEASE = 14,
    ENG_WIRE_DROP = 15,
    ENG_WIRE_SNAPSHOT = 16,
    ENG_WIRE_PREFILL = 17,
};
#define ENG_WIRE_TYPE_MAX 17

enum eng_wire_role {
    ENG_WIRE_ROLE_GATEWAY = 1,
    ENG_WIRE_ROLE_WORKER = 2,
};

#define ENG_WIRE_SUBMIT_IGNORE_EOG 1u

enum eng_wire_stop {
    ENG_WIRE_STOP_EOG = 1,        /* an end-of-generation token (Anthropic end_turn) */
    ENG_WIRE_STOP_MAX_TOKENS = 2, /* max_tokens reached (0: prefill only) */
    ENG_WIRE_STOP_SEQUENCE = 3,   /* a stop sequence matched (stop_index says which) */
    ENG_WIRE_STOP_TOKEN = 4,      /* one of the request's stop_ids */
    ENG_WIRE_STOP_CANCELED = 5,   /* CANCEL arrived */
};
#define ENG_WIRE_STOP_MAX 5

enum eng_wire_kv {
    ENG_WIRE_KV_RETAINED = 1,
    ENG_WIRE_KV_RELEASED = 2,
    ENG_WIRE_KV_EVICTED = 3,
    ENG_WIRE_KV_RETAIN_FAILED = 4,
};
#define ENG_WIRE_KV_MAX 4

/* Where KV is held (KV_EVENT EVICTED's and SNAPSHOT's tier). */
enum eng_wire_tier {
    ENG_WIRE_TIER_NONE = 0, /* in no tier (EVICTED: gone) */
    ENG_WIRE_TIER_G1 = 1,   /* the KV pool (SNAPSHOT: pinned) */
    ENG_WIRE_TIER_G2 = 2,   /* host memory below a device pool (CUDA) */
    ENG_WIRE_TIER_G3 = 3,   /* the local-disk tier */
};
#define ENG_WIRE_TIER_MAX 3

/* Strings (pc_slice_t) and arrays in decoded frames point into the decoder and stay valid until
 * its next eng_wire_decoder_next, _feed or _free call. For encoding, they point to the
 * caller's memory. */

typedef struct eng_wire_hello { /* HELLO and HELLO_ACK */
    uint16_t version_min, version_max;
    uint8_t role; /* enum eng_wire_role */
    uint32_t heartbeat_ms;
    uint32_t max_frame;
    pc_slice_t node;
    pc_slice_t model_name;
    uint64_t model_fp;
    uint32_t n_vocab, n_ctx, block_tokens;
    uint32_t total_blocks, max_prompt_tokens; /* 0 in HELLO */
    uint8_t auth[ENG_WIRE_AUTH_BYTES];        /* HELLO: nonce; HELLO_ACK: the worker's proof */
} eng_wire_hello_t;

typedef struct eng_wire_retain {
    uint32_t n_tokens;
    uint64_t ttl_ms;
} eng_wire_retain_t;

typedef struct eng_wire_submit {
    uint64_t request_id;
    uint64_t ns;
    int32_t priority;
    uint32_t max_tokens;
    uint32_t flags; /* ENG_WIRE_SUBMIT_* */
    eng_sampling_params_t sampling;
    const uint32_t *tokens; /* [n_tokens] */
    uint32_t n_tokens;
    const eng_wire_retain_t *retain; /* [n_retain] */
    uint32_t n_retain;
    const pc_slice_t *stops; /* [n_stops] */
    uint32_t n_stops;
    const uint32_t *stop_ids; /* [n_stop_ids] */
    uint32_t n_stop_ids;
} eng_wire_submit_t;

typedef struct eng_wire_token {
    uint64_t request_id;
    uint32_t token_id;
    pc_slice_t text;
} eng_wire_token_t;

typedef struct eng_wire_usage {
    uint32_t prompt_tokens;
    uint32_t tokens_reused;
    uint32_t tokens_computed;
    uint32_t output_tokens;
} eng_wire_usage_t;

/* The worker's own timings of a request, in microseconds (DONE). */
typedef struct eng_wire_timing {
    uint64_t queue_us;   /* receipt to first admission */
    uint64_t prefill_us; /* first admission to the end of the prefill */
    uint64_t decode_us;  /* end of the prefill to the final event */
} eng_wire_timing_t;

typedef struct eng_wire_done {
    uint64_t request_id;
    uint8_t stop_reason; /* enum eng_wire_stop */
    int32_t stop_index;  /* -1 or < ENG_STOP_MAX_SEQS */
    pc_slice_t text;
    eng_wire_usage_t usage;
    eng_wire_timing_t timing;
} eng_wire_done_t;

typedef struct eng_wire_error { /* ERROR (request_id used) and REJECT (request_id ignored) */
    uint64_t request_id;
    int32_t code; /* a negative PC_ERR_* */
    pc_slice_t message;
} eng_wire_error_t;

typedef struct eng_wire_kv_event {
    uint8_t kind;   /* enum eng_wire_kv */
    uint8_t reason; /* enum eng_evict_reason for EVICTED, else 0 */
    uint8_t tier;   /* EVICTED: enum eng_wire_tier 0, 2 or 3 (where the part is now); else 0 */
    uint64_t ns;
    uint32_t n_tokens;
    uint64_t prefix_fp;
    uint32_t n_kept;
    uint64_t request_id;
    uint64_t ttl_ms;
    const uint32_t *tokens; /* [n_path]: EVICTED's path (n_path == n_tokens), or none (0) */
    uint32_t n_path;
} eng_wire_kv_event_t;

/* One KV tier below the pool in LOAD (all zero when the tier is off). */
typedef struct eng_wire_tier_load {
    uint64_t max_bytes; /* budget; 0: off */
    uint64_t bytes;     /* held now */
    uint32_t blocks;    /* held now */
    uint64_t hits;      /* counters since start, in blocks unless named otherwise */
    uint64_t loads;
    uint64_t load_bytes;
    uint64_t load_us;
    uint64_t tokens_loaded; /* prompt tokens loaded instead of prefilled */
    uint64_t writes;
    uint64_t writes_dropped;
    uint64_t evictions;
    uint64_t corrupt;
    float load_bytes_per_s; /* moving average; 0 until measured */
} eng_wire_tier_load_t;

typedef struct eng_wire_load {
    uint32_t queued_requests;
    uint64_t queued_prefill_tokens;
    uint32_t running_seqs;
    uint32_t free_blocks;
    uint32_t cached_blocks;
    uint32_t total_blocks;
    float prefill_tokens_per_s; /* moving average; 0 until measured */
    float decode_ms_per_token;  /* moving average; 0 until measured */
    eng_wire_tier_load_t g2, g3;
    uint64_t tokens_recomputed; /* hole tokens recomputed since start */
} eng_wire_load_t;

typedef struct eng_wire_auth { /* CHALLENGE (nonce) and AUTH (mac) */
    uint8_t bytes[ENG_WIRE_AUTH_BYTES];
} eng_wire_auth_t;

typedef struct eng_wire_release { /* RELEASE; DROP uses ns only */
    uint64_t ns;
    const uint32_t *tokens; /* [n_tokens] */
    uint32_t n_tokens;
} eng_wire_release_t;

typedef struct eng_wire_snap_entry {
    uint64_t ns;
    uint64_t prefix_fp;     /* eng_wire_prefix_fp(tokens, n_tokens) */
    uint64_t ttl_ms;        /* left until the pin expires, when the snapshot was taken */
    uint8_t tier;           /* enum eng_wire_tier: 1 pinned; 2, 3 held there only (ttl_ms 0) */
    const uint32_t *tokens; /* [n_tokens] */
    uint32_t n_tokens;
} eng_wire_snap_entry_t;

typedef struct eng_wire_snapshot {
    uint64_t snapshot_id;
    uint8_t last;                         /* 1 on the snapshot's last frame */
    const eng_wire_snap_entry_t *entries; /* [n_entries] */
    uint32_t n_entries;
} eng_wire_snapshot_t;

/* Where a request's prompt came from (PREFILL). */
typedef struct eng_wire_prefill {
    uint64_t request_id;
    uint32_t prompt_tokens;
    uint32_t tokens_g1, tokens_g2, tokens_g3; /* KV taken from the pool, loaded from G2, G3 */
    uint32_t tokens_recomputed;               /* hole tokens recomputed between loaded blocks */
} eng_wire_prefill_t;

typedef struct eng_wire_frame {
    uint8_t type; /* enum eng_wire_type */
    union {
        eng_wire_hello_t hello; /* HELLO, HELLO_ACK */
        eng_wire_error_t error; /* ERROR, REJECT */
        uint64_t heartbeat_ms;  /* HEARTBEAT: time_ms */
        eng_wire_submit_t submit;
        uint64_t cancel_id; /* CANCEL: request_id */
        eng_wire_token_t token;
        eng_wire_done_t done;
        eng_wire_kv_event_t kv;
        eng_wire_load_t load;
        eng_wire_auth_t auth;       /* CHALLENGE, AUTH */
        eng_wire_release_t release; /* RELEASE, DROP (ns only) */
        eng_wire_snapshot_t snapshot;
        eng_wire_prefill_t prefill;
    } u;
} eng_wire_frame_t;

/* "SUBMIT", ... or "UNKNOWN"; never NULL. */
const char *eng_wire_type_name(int type);

/* XXH3-64 (seed 0) of tokens[0..n) as little-endian u32s: the prefix fingerprint of KV_EVENT. */
uint64_t eng_wire_prefix_fp(const uint32_t *tokens, size_t n);

/* Appends one encoded frame to out. Returns 0, PC_ERR_INVAL (the frame breaks a rule that the
 * decoder enforces, or its payload would exceed max_frame; a reason goes to err, which may be
 * NULL) or PC_ERR_NOMEM. On failure out is unchanged. */
int eng_wire_encode(const eng_wire_frame_t *f, uint32_t max_frame, pc_buf_t *out, char *err,
                    size_t err_len);

/* Decodes one payload of a given type (without its header) into *f: the core of the decoder,
 * exposed for tests. Arrays are materialized in *scratch (reused, grown as needed; free it with
 * pc_buf_free), strings point into payload. Returns 0, or PC_ERR_FORMAT with a reason. */
int eng_wire_decode_payload(uint8_t type, const uint8_t *payload, size_t len, pc_buf_t *scratch,
                            eng_wire_frame_t *f, char *err, size_t err_len);

/* The incremental decoder: bytes go in as they arrive, complete frames come out. */
typedef struct eng_wire_decoder eng_wire_decoder_t;

/* max_frame: the largest payload accepted (0: ENG_WIRE_MAX_FRAME_DEFAULT). Returns 0 or
 * PC_ERR_NOMEM. */
int eng_wire_decoder_init(uint32_t max_frame, eng_wire_decoder_t **out);
void eng_wire_decoder_free(eng_wire_decoder_t *d);

/* Changes the largest payload accepted (0: ENG_WIRE_MAX_FRAME_DEFAULT) for every frame that
 * eng_wire_decoder_next has not returned yet (bytes already fed included): a worker takes only
 * small frames from a peer before its handshake, then its full max_frame. */
void eng_wire_decoder_set_max_frame(eng_wire_decoder_t *d, uint32_t max_frame);

/* Appends received bytes (copied). Call eng_wire_decoder_next until it returns 0 after every
 * feed: the decoder then buffers at most one partial frame plus the last chunk. Returns 0,
 * PC_ERR_NOMEM (nothing appended), or the sticky error of a failed decoder. */
int eng_wire_decoder_feed(eng_wire_decoder_t *d, const void *data, size_t len);

/* The next complete frame. Returns 1 with *f filled (its strings and arrays valid until the
 * next call on d), 0 when more bytes are needed, or a negative error that is sticky (every
 * later call returns it; the connection must be closed): PC_ERR_FORMAT (bad magic, flags,
 * unknown type, malformed payload), PC_ERR_UNSUPPORTED (another protocol version),
 * PC_ERR_RANGE (payload length over max_frame: rejected from the header alone, before the
 * payload is buffered) or PC_ERR_NOMEM. eng_wire_decoder_error says why. */
int eng_wire_decoder_next(eng_wire_decoder_t *d, eng_wire_frame_t *f);

/* The reason of the sticky error ("" while there is none); valid while d lives. */
const char *eng_wire_decoder_error(const eng_wire_decoder_t *d);

/* Moves the bytes received but not yet returned as frames to the end of out: the stream
 * changes its encoding after the frame returned last (the worker link seals itself after its
 * handshake, link/wire_seal.h). The frame returned last stays valid. Returns 0, PC_ERR_NOMEM
 * (nothing moved) or the sticky error. */
int eng_wire_decoder_take(eng_wire_decoder_t *d, pc_buf_t *out);

/* Bytes received but not yet returned as frames. */
size_t eng_wire_decoder_pending(const eng_wire_decoder_t *d);

#endif
