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
 *   2       1     version: ENG_WIRE_VERSION (1)
 *   3       1     type: enum eng_wire_type
 *   4       4     flags: u32, none defined in version 1: must be 0
 *   8       4     payload length: u32, at most the receiver's max_frame (default 64 MiB)
 *   12      ...   payload
 *
 * Payload building blocks:
 *   u8 u16 u32 u64 i32   little-endian integers
 *   f32                  IEEE-754 binary32, little-endian bit pattern (must be finite here)
 *   str                  u32 byte length, then that many bytes of valid UTF-8 (no terminator)
 *   arr<T>               u32 count, then count elements of T back to back
 *
 * Payloads by type (fields in this order, nothing after the last one):
 *
 *   HELLO (1), HELLO_ACK (2): the handshake. The connecting side (the gateway) sends HELLO with
 *     the range of versions it speaks and the model it expects (an empty name, fingerprint 0,
 *     n_vocab 0 mean "any"); the worker answers HELLO_ACK (version_min = version_max = the
 *     version it picked, and its own model identity) or REJECT. No other frame may precede.
 *       u16 version_min, u16 version_max, u8 role (1 gateway, 2 worker),
 *       u32 heartbeat_ms (the sender's heartbeat interval; the peer is dead after 3 missed),
 *       u32 max_frame (the largest payload the sender accepts),
 *       str node (free-form, for logs: host name, worker id; at most 256 bytes),
 *       str model_name (at most 256 bytes), u64 model_fp (a fingerprint of the model file:
 *       XXH3-64 of its GGUF metadata and tensor table, computed by the worker),
 *       u32 n_vocab, u32 n_ctx, u32 block_tokens (KV block size in tokens)
 *   REJECT (3): the handshake failed; the sender closes the connection after it.
 *       i32 code (a PC_ERR_*), str message (at most 4096 bytes)
 *   HEARTBEAT (4): either direction, every heartbeat_ms when nothing else was sent.
 *       u64 time_ms (the sender's monotonic clock; for round-trip estimates)
 *   SUBMIT (5): gateway -> worker, a new request.
 *       u64 request_id (nonzero, unique per connection), u64 ns (namespace id),
 *       i32 priority (higher runs first; 0 default), u32 max_tokens (0: prefill only),
 *       u32 flags (bit 0: ENG_WIRE_SUBMIT_IGNORE_EOG, generate max_tokens even past
 *       end-of-generation tokens; other bits must be 0),
 *       f32 temperature, u32 top_k, f32 top_p, f32 min_p, u64 seed (see sampling.h),
 *       arr<u32> tokens (the prompt, at least 1),
 *       arr<{u32 n_tokens, u64 ttl_ms}> retain (prefixes tokens[0..n_tokens) to pin in the
 *         worker's cache for ttl_ms from the worker's receipt of the frame; 1 <= n_tokens <=
 *         the prompt's, at most 64 entries),
 *       arr<str> stops (stop sequences, at most ENG_STOP_MAX_SEQS of 1..ENG_STOP_MAX_BYTES),
 *       arr<u32> stop_ids (extra stop token ids besides the model's end-of-generation ones,
 *         at most 64)
 *     The codec checks structure and these limits; the semantic ranges of the sampling
 *     parameters (eng_sampling_params_check) and token ids < n_vocab are the worker's to check,
 *     and a bad value there fails the request with ERROR, not the connection.
 *   CANCEL (6): gateway -> worker.
 *       u64 request_id
 *   TOKEN (7): worker -> gateway, one generated token.
 *       u64 request_id, u32 token_id, str text (the text released with this token after the
 *       incremental decoder and the stop matcher: possibly empty, possibly including text of
 *       earlier tokens that was held back)
 *   DONE (8): worker -> gateway, the request finished (its last frame).
 *       u64 request_id, u8 stop_reason (enum eng_wire_stop), i32 stop_index (the stop
 *       sequence that matched, or -1), str text (held-back text released at the end; empty
 *       after a stop sequence), u32 prompt_tokens, u32 tokens_reused (KV found in the worker's
 *       cache: the physical hit), u32 tokens_computed (prompt tokens prefilled, including any
 *       recomputed after preemption), u32 output_tokens
 *   ERROR (9): worker -> gateway: request_id nonzero fails that request (its last frame);
 *     request_id 0 is about the connection, which the sender closes after it.
 *       u64 request_id, i32 code (a PC_ERR_*), str message (at most 4096 bytes)
 *   KV_EVENT (10): worker -> gateway, a change in what the worker's cache holds.
 *       u8 kind (enum eng_wire_kv), u8 reason (enum eng_evict_reason of engine.h for EVICTED,
 *       else 0), u64 ns, u32 n_tokens, u64 prefix_fp, u32 n_kept, u64 request_id, u64 ttl_ms
 *   LOAD (11): worker -> gateway, after every HEARTBEAT it receives and when its load changes
 *     much; the router's input.
 *       u32 queued_requests, u64 queued_prefill_tokens, u32 running_seqs, u32 free_blocks,
 *       u32 cached_blocks, u32 total_blocks
 *
 * What KV_EVENT tells the gateway. The gateway's index must learn which namespace + prefix a
 * worker holds or dropped. Both sides know prefixes as token arrays, so a prefix is named by
 * (ns, n_tokens, prefix_fp) where prefix_fp = eng_wire_prefix_fp(tokens, n_tokens): XXH3-64
 * (seed 0) of the token ids as little-endian u32s. The gateway keeps (n_tokens, fp) for the
 * prefixes it routes and asks to retain, and finds an event's prefix by that pair.
 *   RETAINED  SUBMIT request_id's prefix tokens[0..n_tokens) is computed and pinned for ttl_ms
 *             (n_kept = n_tokens). Sent once the prefill passed n_tokens: from then on the
 *             gateway may route readers of that entry here.
 *   RELEASED  the pin that SUBMIT request_id put on the prefix expired or was released; the KV
 *             stays cached, unpinned (n_kept = n_tokens, ttl_ms 0).
 *   EVICTED   the cache dropped positions [n_kept, n_tokens) of the prefix named by
 *             (ns, n_tokens, prefix_fp); positions below n_kept remain. The gateway clears
 *             this worker from every known prefix of that path longer than n_kept. request_id
 *             and ttl_ms are 0.
 *
 * Frame validity (the decoder rejects everything else, with a reason): magic, version and
 * flags as above; a known type; payload length <= max_frame; every count and length inside the
 * payload (checked before anything is allocated, so a count can never make the decoder
 * allocate more than the payload's size); no bytes left over after the last field; strings
 * valid UTF-8 within their limits; enum fields within range; f32 fields finite; booleans and
 * reserved bits as specified. The encoding is canonical: encoding a decoded frame gives back
 * the exact bytes.
 */
#ifndef ENG_WIRE_H
#define ENG_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pc_buf.h"
#include "sampling.h"

#define ENG_WIRE_VERSION 1
#define ENG_WIRE_HEADER_BYTES 12
#define ENG_WIRE_MAX_FRAME_DEFAULT (64u << 20)
#define ENG_WIRE_NAME_MAX 256
#define ENG_WIRE_MESSAGE_MAX 4096
#define ENG_WIRE_RETAIN_MAX 64
#define ENG_WIRE_STOP_IDS_MAX 64

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
};
#define ENG_WIRE_TYPE_MAX 11

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
};
#define ENG_WIRE_KV_MAX 3

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

typedef struct eng_wire_done {
    uint64_t request_id;
    uint8_t stop_reason; /* enum eng_wire_stop */
    int32_t stop_index;  /* -1 or < ENG_STOP_MAX_SEQS */
    pc_slice_t text;
    eng_wire_usage_t usage;
} eng_wire_done_t;

typedef struct eng_wire_error { /* ERROR (request_id used) and REJECT (request_id ignored) */
    uint64_t request_id;
    int32_t code; /* a negative PC_ERR_* */
    pc_slice_t message;
} eng_wire_error_t;

typedef struct eng_wire_kv_event {
    uint8_t kind;   /* enum eng_wire_kv */
    uint8_t reason; /* enum eng_evict_reason for EVICTED, else 0 */
    uint64_t ns;
    uint32_t n_tokens;
    uint64_t prefix_fp;
    uint32_t n_kept;
    uint64_t request_id;
    uint64_t ttl_ms;
} eng_wire_kv_event_t;

typedef struct eng_wire_load {
    uint32_t queued_requests;
    uint64_t queued_prefill_tokens;
    uint32_t running_seqs;
    uint32_t free_blocks;
    uint32_t cached_blocks;
    uint32_t total_blocks;
} eng_wire_load_t;

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

/* Bytes received but not yet returned as frames. */
size_t eng_wire_decoder_pending(const eng_wire_decoder_t *d);

#endif
