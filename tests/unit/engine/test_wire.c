/*
 * test_wire.c — the worker protocol codec (engine/wire.c): round trips of every frame type with
 * random contents, decoding with the stream split at every byte position, every truncation and
 * bad length a clean error, hostile counts that must not allocate, golden bytes that pin the
 * documented layout, and random mutations of valid streams (a small in-test fuzzer).
 *
 * With KVGW_WIRE_CORPUS=DIR in the environment, test corpus_seeds also writes the seed corpus
 * of the fuzz target (tests/fuzz/corpus/fuzz_wire) into DIR.
 */
#include "pc_test.h"
#include "pc_testutil.h"

#include <math.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common.h"
#include "test_wire.h"

static const char *const names[] = {"",         "hello",    "hello_ack", "reject", "heartbeat",
                                    "submit",   "cancel",   "token",     "done",   "error",
                                    "kv_event", "load",     "challenge", "auth",   "release",
                                    "drop",     "snapshot", "prefill"};

/* Encodes f and checks the header against the documented layout. */
static void encode_ok(const eng_wire_frame_t *f, pc_buf_t *out)
{
    char err[160] = "";
    size_t start = out->len;
    int rc = eng_wire_encode(f, 0, out, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  encode: %s\n", err);
    ASSERT_EQ(rc, 0);
    const uint8_t *h = (const uint8_t *)out->base + start;
    ASSERT_EQ(h[0], 'K');
    ASSERT_EQ(h[1], 'W');
    ASSERT_EQ(h[2], ENG_WIRE_VERSION);
    ASSERT_EQ(h[3], f->type);
    ASSERT_EQ(h[4] | h[5] | h[6] | h[7], 0);
    uint32_t plen =
        (uint32_t)h[8] | (uint32_t)h[9] << 8 | (uint32_t)h[10] << 16 | (uint32_t)h[11] << 24;
    ASSERT_EQ_U64(plen, out->len - start - ENG_WIRE_HEADER_BYTES);
}

PC_TEST(roundtrip_every_type)
{
    eng_rng_t r;
    eng_rng_seed(&r, 1);
    eng_wire_decoder_t *d;
    ASSERT_EQ(eng_wire_decoder_init(0, &d), 0);
    for (int type = 1; type <= ENG_WIRE_TYPE_MAX; type++) {
        ASSERT_STR_EQ(eng_wire_type_name(type) != NULL ? "x" : NULL, "x");
        for (int it = 0; it < 200; it++) {
            wire_gen_t g;
            eng_wire_frame_t f, got;
            wire_gen_frame(&r, type, &g, &f);
            pc_buf_t a = PC_BUF_INIT, b = PC_BUF_INIT;
            PC_TEST_CALL(encode_ok(&f, &a));
            ASSERT_EQ(eng_wire_decoder_feed(d, a.base, a.len), 0);
            ASSERT_EQ(eng_wire_decoder_next(d, &got), 1);
            ASSERT_TRUE(wire_frame_eq(&f, &got));
            /* Canonical: the decoded frame encodes to the same bytes. */
            PC_TEST_CALL(encode_ok(&got, &b));
            ASSERT_EQ(a.len, b.len);
            ASSERT_MEM_EQ(a.base, b.base, a.len);
            ASSERT_EQ(eng_wire_decoder_next(d, &got), 0);
            ASSERT_EQ(eng_wire_decoder_pending(d), 0);
            pc_buf_free(&a);
            pc_buf_free(&b);
        }
    }
    ASSERT_STR_EQ(eng_wire_type_name(0), "UNKNOWN");
    ASSERT_STR_EQ(eng_wire_type_name(ENG_WIRE_TYPE_MAX + 1), "UNKNOWN");
    ASSERT_STR_EQ(eng_wire_decoder_error(d), "");
    eng_wire_decoder_free(d);
}

/* A stream of frames of every type (several of each), and the frames themselves. */
typedef struct stream {
    wire_gen_t g[40];
    eng_wire_frame_t f[40];
    size_t n;
    pc_buf_t bytes;
    size_t end[40]; /* end offset of each frame in bytes */
} stream_t;

static void make_stream(eng_rng_t *r, stream_t *s, size_t n)
{
    s->n = n;
    s->bytes = PC_BUF_INIT;
    for (size_t i = 0; i < n; i++) {
        wire_gen_frame(r, 1 + (int)(i % ENG_WIRE_TYPE_MAX), &s->g[i], &s->f[i]);
        PC_TEST_CALL(encode_ok(&s->f[i], &s->bytes));
        s->end[i] = s->bytes.len;
    }
}

/* Drains d, checking each frame against the next expected one. */
static void drain(eng_wire_decoder_t *d, const stream_t *s, size_t *next)
{
    eng_wire_frame_t got;
    int rc;
    while ((rc = eng_wire_decoder_next(d, &got)) == 1) {
        ASSERT_TRUE(*next < s->n);
        ASSERT_TRUE(wire_frame_eq(&s->f[*next], &got));
        (*next)++;
    }
    if (rc != 0)
        fprintf(stderr, "  %s\n", eng_wire_decoder_error(d));
    ASSERT_EQ(rc, 0);
}

PC_TEST(split_at_every_byte)
{
    eng_rng_t r;
    eng_rng_seed(&r, 2);
    static stream_t s;
    PC_TEST_CALL(make_stream(&r, &s, 2 * ENG_WIRE_TYPE_MAX));
    for (size_t k = 0; k <= s.bytes.len; k++) {
        eng_wire_decoder_t *d;
        ASSERT_EQ(eng_wire_decoder_init(0, &d), 0);
        size_t next = 0;
        ASSERT_EQ(eng_wire_decoder_feed(d, s.bytes.base, k), 0);
        PC_TEST_CALL(drain(d, &s, &next));
        /* Every frame that ended before the split came out, none after it. */
        size_t complete = 0;
        while (complete < s.n && s.end[complete] <= k)
            complete++;
        ASSERT_EQ(next, complete);
        ASSERT_EQ(eng_wire_decoder_pending(d), k - (complete ? s.end[complete - 1] : 0));
        ASSERT_EQ(eng_wire_decoder_feed(d, s.bytes.base + k, s.bytes.len - k), 0);
        PC_TEST_CALL(drain(d, &s, &next));
        ASSERT_EQ(next, s.n);
        ASSERT_EQ(eng_wire_decoder_pending(d), 0);
        eng_wire_decoder_free(d);
    }
    /* One byte at a time, and random chunk sizes. */
    for (int mode = 0; mode < 20; mode++) {
        eng_wire_decoder_t *d;
        ASSERT_EQ(eng_wire_decoder_init(0, &d), 0);
        size_t next = 0;
        for (size_t at = 0; at < s.bytes.len;) {
            size_t n = mode == 0 ? 1 : 1 + wg_below(&r, 200);
            if (n > s.bytes.len - at)
                n = s.bytes.len - at;
            ASSERT_EQ(eng_wire_decoder_feed(d, s.bytes.base + at, n), 0);
            at += n;
            PC_TEST_CALL(drain(d, &s, &next));
        }
        ASSERT_EQ(next, s.n);
        eng_wire_decoder_free(d);
    }
    pc_buf_free(&s.bytes);
}

PC_TEST(truncations_and_bad_lengths)
{
    eng_rng_t r;
    eng_rng_seed(&r, 3);
    pc_buf_t scratch = PC_BUF_INIT;
    for (int type = 1; type <= ENG_WIRE_TYPE_MAX; type++) {
        for (int it = 0; it < 20; it++) {
            wire_gen_t g;
            eng_wire_frame_t f, got;
            wire_gen_frame(&r, type, &g, &f);
            pc_buf_t a = PC_BUF_INIT;
            PC_TEST_CALL(encode_ok(&f, &a));
            const uint8_t *payload = (const uint8_t *)a.base + ENG_WIRE_HEADER_BYTES;
            size_t plen = a.len - ENG_WIRE_HEADER_BYTES;
            char err[160];
            /* Every proper prefix of a payload is malformed, with a reason. */
            for (size_t t = 0; t < plen; t++) {
                err[0] = 0;
                ASSERT_EQ(eng_wire_decode_payload((uint8_t)type, payload, t, &scratch, &got, err,
                                                  sizeof err),
                          PC_ERR_FORMAT);
                ASSERT_TRUE(strncmp(err, eng_wire_type_name(type), 3) == 0);
            }
            /* One byte too many. */
            pc_buf_t longer = PC_BUF_INIT;
            ASSERT_EQ(pc_buf_append(&longer, payload, plen), 0);
            ASSERT_EQ(pc_buf_append(&longer, "\0", 1), 0);
            ASSERT_EQ(eng_wire_decode_payload((uint8_t)type, (const uint8_t *)longer.base,
                                              longer.len, &scratch, &got, err, sizeof err),
                      PC_ERR_FORMAT);
            ASSERT_TRUE(strstr(err, "trailing") != NULL);
            pc_buf_free(&longer);
            /* A truncated frame is just incomplete for the stream decoder: no error. */
            for (size_t t = 0; t < a.len; t++) {
                eng_wire_decoder_t *d;
                ASSERT_EQ(eng_wire_decoder_init(0, &d), 0);
                ASSERT_EQ(eng_wire_decoder_feed(d, a.base, t), 0);
                ASSERT_EQ(eng_wire_decoder_next(d, &got), 0);
                ASSERT_EQ(eng_wire_decoder_pending(d), t);
                eng_wire_decoder_free(d);
            }
            /* A header length one short (the last payload byte then starts the next header)
             * or one long (the next header's first byte joins the payload): both rejected. */
            for (int delta = -1; delta <= 1; delta += 2) {
                if (plen == 0 && delta < 0)
                    continue;
                pc_buf_t bad = PC_BUF_INIT;
                ASSERT_EQ(pc_buf_append(&bad, a.base, a.len), 0);
                ASSERT_EQ(pc_buf_append(&bad, a.base, a.len), 0); /* a second copy follows */
                uint32_t l = (uint32_t)((int64_t)plen + delta);
                for (int i = 0; i < 4; i++)
                    bad.base[8 + i] = (char)(l >> (8 * i));
                eng_wire_decoder_t *d;
                ASSERT_EQ(eng_wire_decoder_init(0, &d), 0);
                ASSERT_EQ(eng_wire_decoder_feed(d, bad.base, bad.len), 0);
                int rc = eng_wire_decoder_next(d, &got);
                if (rc == 1) /* a prefix can't be valid, but the frame can run one byte long */
                    rc = eng_wire_decoder_next(d, &got);
                ASSERT_TRUE(rc < 0);
                ASSERT_TRUE(eng_wire_decoder_error(d)[0] != 0);
                eng_wire_decoder_free(d);
                pc_buf_free(&bad);
            }
            pc_buf_free(&a);
        }
    }
    pc_buf_free(&scratch);
}

static void expect_header_error(const uint8_t *h, size_t n, uint32_t max_frame, int want,
                                const char *needle)
{
    eng_wire_decoder_t *d;
    eng_wire_frame_t f;
    ASSERT_EQ(eng_wire_decoder_init(max_frame, &d), 0);
    ASSERT_EQ(eng_wire_decoder_feed(d, h, n), 0);
    int rc;
    while ((rc = eng_wire_decoder_next(d, &f)) == 1) /* valid frames before the bad one */
        ;
    ASSERT_EQ(rc, want);
    const char *why = eng_wire_decoder_error(d);
    if (strstr(why, needle) == NULL)
        fprintf(stderr, "  reason \"%s\" lacks \"%s\"\n", why, needle);
    ASSERT_TRUE(strstr(why, needle) != NULL);
    /* Sticky: everything after fails the same way. */
    ASSERT_EQ(eng_wire_decoder_next(d, &f), want);
    ASSERT_EQ(eng_wire_decoder_feed(d, h, n), want);
    eng_wire_decoder_free(d);
}

PC_TEST(bad_headers)
{
    uint8_t h[ENG_WIRE_HEADER_BYTES] = {
        'K', 'W', ENG_WIRE_VERSION, ENG_WIRE_HEARTBEAT, 0, 0, 0, 0, 8, 0, 0, 0};
    uint8_t x[ENG_WIRE_HEADER_BYTES];
    /* An HTTP client on the worker port is rejected from its first byte. */
    PC_TEST_CALL(expect_header_error((const uint8_t *)"G", 1, 0, PC_ERR_FORMAT, "bad magic"));
    memcpy(x, h, sizeof x);
    x[1] = 'X';
    PC_TEST_CALL(expect_header_error(x, 2, 0, PC_ERR_FORMAT, "bad magic"));
    memcpy(x, h, sizeof x);
    x[2] = 1; /* version 1 frames are refused, not misread */
    PC_TEST_CALL(expect_header_error(x, 3, 0, PC_ERR_UNSUPPORTED, "protocol version 1"));
    memcpy(x, h, sizeof x);
    x[2] = 2; /* a peer of the unsealed link (version 2) is refused with a reason */
    PC_TEST_CALL(
        expect_header_error(x, 3, 0, PC_ERR_UNSUPPORTED, "protocol version 2, this side speaks 4"));
    memcpy(x, h, sizeof x);
    x[2] = 3; /* a peer without tiers (version 3): its KV_EVENT and LOAD would be misread */
    PC_TEST_CALL(
        expect_header_error(x, 3, 0, PC_ERR_UNSUPPORTED, "protocol version 3, this side speaks 4"));
    for (int t = 0; t < 256; t += 1) {
        if (t >= 1 && t <= ENG_WIRE_TYPE_MAX)
            continue;
        memcpy(x, h, sizeof x);
        x[3] = (uint8_t)t;
        PC_TEST_CALL(expect_header_error(x, 4, 0, PC_ERR_FORMAT, "unknown frame type"));
    }
    memcpy(x, h, sizeof x);
    x[6] = 1;
    PC_TEST_CALL(expect_header_error(x, sizeof x, 0, PC_ERR_FORMAT, "undefined flags"));
    /* Over the limit: rejected from the header, before any payload arrives. */
    memcpy(x, h, sizeof x);
    x[8] = 0x01;
    x[9] = 0x10; /* 4097 */
    PC_TEST_CALL(expect_header_error(x, sizeof x, 4096, PC_ERR_RANGE, "over the limit of 4096"));
    memset(x + 8, 0xFF, 4);
    PC_TEST_CALL(expect_header_error(x, sizeof x, 0, PC_ERR_RANGE, "4294967295 bytes"));
    /* The error names the stream offset of the bad frame. */
    uint8_t two[2 * ENG_WIRE_HEADER_BYTES + 8] = {0};
    memcpy(two, h, sizeof h);
    memcpy(two + 20, (const uint8_t[]){'K', 'W', ENG_WIRE_VERSION, 0x63}, 4);
    PC_TEST_CALL(expect_header_error(two, sizeof two, 0, PC_ERR_FORMAT, "offset 20"));
}

/* Records the largest allocation, to prove that counts cannot size allocations. */
static size_t max_alloc;
static void *rec_malloc(size_t n)
{
    max_alloc = n > max_alloc ? n : max_alloc;
    return malloc(n);
}
static void *rec_calloc(size_t c, size_t n)
{
    max_alloc = c * n > max_alloc ? c * n : max_alloc;
    return calloc(c, n);
}
static void *rec_realloc(void *p, size_t n)
{
    max_alloc = n > max_alloc ? n : max_alloc;
    return realloc(p, n);
}

/* Offsets in a SUBMIT payload (wire.h): the token count follows 52 bytes of fixed fields. */
#define SUBMIT_TOKENS_AT 52

static void expect_payload_error(int type, const pc_buf_t *frame, const char *needle)
{
    pc_buf_t scratch = PC_BUF_INIT;
    eng_wire_frame_t got;
    char err[160] = "";
    int rc = eng_wire_decode_payload(
        (uint8_t)type, (const uint8_t *)frame->base + ENG_WIRE_HEADER_BYTES,
        frame->len - ENG_WIRE_HEADER_BYTES, &scratch, &got, err, sizeof err);
    pc_buf_free(&scratch);
    if (rc != PC_ERR_FORMAT || strstr(err, needle) == NULL)
        fprintf(stderr, "  rc %d, reason \"%s\", wanted \"%s\"\n", rc, err, needle);
    ASSERT_EQ(rc, PC_ERR_FORMAT);
    ASSERT_TRUE(strstr(err, needle) != NULL);
}

static void put32(pc_buf_t *b, size_t payload_off, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b->base[ENG_WIRE_HEADER_BYTES + payload_off + i] = (char)(v >> (8 * i));
}

PC_TEST(hostile_payloads)
{
    eng_rng_t r;
    eng_rng_seed(&r, 4);
    wire_gen_t g;
    eng_wire_frame_t f;
    pc_buf_t a = PC_BUF_INIT;

    /* SUBMIT: a token count far beyond the payload. No allocation may follow it. */
    wire_gen_frame(&r, ENG_WIRE_SUBMIT, &g, &f);
    f.u.submit.n_tokens = 3;
    f.u.submit.n_retain = 0;
    PC_TEST_CALL(encode_ok(&f, &a));
    put32(&a, SUBMIT_TOKENS_AT, 0x40000000u);
    const pc_allocator_t rec = {rec_malloc, rec_calloc, rec_realloc, free};
    pc_allocator_t prev = pc_set_allocator(&rec);
    max_alloc = 0;
    eng_wire_decoder_t *d;
    ASSERT_EQ(eng_wire_decoder_init(0, &d), 0);
    ASSERT_EQ(eng_wire_decoder_feed(d, a.base, a.len), 0);
    ASSERT_EQ(eng_wire_decoder_next(d, &f), PC_ERR_FORMAT);
    eng_wire_decoder_free(d);
    pc_set_allocator(&prev);
    ASSERT_TRUE(max_alloc < 4096);
    PC_TEST_CALL(expect_payload_error(ENG_WIRE_SUBMIT, &a, "tokens count 1073741824 exceeds"));
    put32(&a, SUBMIT_TOKENS_AT, 0);
    PC_TEST_CALL(expect_payload_error(ENG_WIRE_SUBMIT, &a, "no prompt tokens"));

    /* SUBMIT field rules, by patching an encoded frame at documented offsets. */
    a.len = 0;
    wire_gen_frame(&r, ENG_WIRE_SUBMIT, &g, &f);
    f.u.submit.n_tokens = 2;
    f.u.submit.n_retain = 1;
    g.retain[0] = (eng_wire_retain_t){2, 1000};
    f.u.submit.n_stops = 0;
    f.u.submit.n_stop_ids = 0;
    PC_TEST_CALL(encode_ok(&f, &a));
    pc_buf_t b = PC_BUF_INIT;
    ASSERT_EQ(pc_buf_append(&b, a.base, a.len), 0);
    memset(b.base + ENG_WIRE_HEADER_BYTES, 0, 8);
    PC_TEST_CALL(expect_payload_error(ENG_WIRE_SUBMIT, &b, "request_id 0"));
    memcpy(b.base, a.base, a.len);
    put32(&b, 24, 6); /* flags */
    PC_TEST_CALL(expect_payload_error(ENG_WIRE_SUBMIT, &b, "undefined flags 0x6"));
    memcpy(b.base, a.base, a.len);
    put32(&b, 28, 0x7FC00000u); /* temperature NaN */
    PC_TEST_CALL(expect_payload_error(ENG_WIRE_SUBMIT, &b, "temperature is not a finite"));
    memcpy(b.base, a.base, a.len);
    put32(&b, SUBMIT_TOKENS_AT + 4 + 8 + 4, 3); /* retain[0].n_tokens 3 > 2 prompt tokens */
    PC_TEST_CALL(expect_payload_error(ENG_WIRE_SUBMIT, &b, "prefix of 3 tokens"));
    memcpy(b.base, a.base, a.len);
    put32(&b, SUBMIT_TOKENS_AT + 4 + 8 + 4 + 12, ENG_STOP_MAX_SEQS + 1); /* stops count */
    PC_TEST_CALL(expect_payload_error(ENG_WIRE_SUBMIT, &b, "stops count 17 over the limit"));
    pc_buf_free(&b);

    /* TOKEN: invalid UTF-8 text (an overlong '/', a lone continuation, a surrogate). */
    static const char *const bad_utf8[] = {"\xC0\xAF", "a\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80",
                                           "\xE6\x97"};
    for (size_t i = 0; i < PC_ARRAY_LEN(bad_utf8); i++) {
        a.len = 0;
        f = (eng_wire_frame_t){.type = ENG_WIRE_TOKEN};
        f.u.token.request_id = 5;
        f.u.token.text = pc_slice("xxxx", strlen(bad_utf8[i]));
        PC_TEST_CALL(encode_ok(&f, &a));
        memcpy(a.base + ENG_WIRE_HEADER_BYTES + 16, bad_utf8[i], strlen(bad_utf8[i]));
        PC_TEST_CALL(expect_payload_error(ENG_WIRE_TOKEN, &a, "text is not valid UTF-8"));
    }
    /* DONE: stop_index that disagrees with stop_reason. */
    a.len = 0;
    f = (eng_wire_frame_t){.type = ENG_WIRE_DONE};
    f.u.done.request_id = 9;
    f.u.done.stop_reason = ENG_WIRE_STOP_EOG;
    f.u.done.stop_index = -1;
    PC_TEST_CALL(encode_ok(&f, &a));
    put32(&a, 9, 0);
    PC_TEST_CALL(expect_payload_error(ENG_WIRE_DONE, &a, "stop_index 0 with stop_reason 1"));
    a.base[ENG_WIRE_HEADER_BYTES + 8] = 9;
    PC_TEST_CALL(expect_payload_error(ENG_WIRE_DONE, &a, "unknown stop_reason 9"));
    /* KV_EVENT: an eviction that keeps everything. */
    a.len = 0;
    f = (eng_wire_frame_t){.type = ENG_WIRE_KV_EVENT};
    f.u.kv = (eng_wire_kv_event_t){ENG_WIRE_KV_EVICTED, 1, 0, 7, 100, 0x1234, 50, 0, 0, NULL, 0};
    PC_TEST_CALL(encode_ok(&f, &a));
    put32(&a, 3 + 8 + 4 + 8, 100); /* n_kept, after kind, reason, tier, ns, n_tokens, fp */
    PC_TEST_CALL(expect_payload_error(ENG_WIRE_KV_EVENT, &a, "n_kept < n_tokens"));
    /* LOAD: more free and cached blocks than blocks. */
    a.len = 0;
    f = (eng_wire_frame_t){.type = ENG_WIRE_LOAD};
    f.u.load = (eng_wire_load_t){.queued_requests = 1,
                                 .queued_prefill_tokens = 2,
                                 .running_seqs = 3,
                                 .free_blocks = 10,
                                 .cached_blocks = 10,
                                 .total_blocks = 20};
    PC_TEST_CALL(encode_ok(&f, &a));
    put32(&a, 4 + 8 + 4 + 4, 11);
    PC_TEST_CALL(expect_payload_error(ENG_WIRE_LOAD, &a, "free 10 + cached 11 blocks > total 20"));
    /* HELLO: an empty version range. */
    a.len = 0;
    f = (eng_wire_frame_t){.type = ENG_WIRE_HELLO};
    f.u.hello = (eng_wire_hello_t){.version_min = 1, .version_max = 1, .role = 1, .max_frame = 1};
    PC_TEST_CALL(encode_ok(&f, &a));
    a.base[ENG_WIRE_HEADER_BYTES] = 2;
    PC_TEST_CALL(expect_payload_error(ENG_WIRE_HELLO, &a, "bad version range 2..1"));
    pc_buf_free(&a);
}

PC_TEST(encoder_refuses_invalid_frames)
{
    pc_buf_t out = PC_BUF_INIT;
    ASSERT_EQ(pc_buf_append(&out, "keep", 4), 0);
    char err[160];
    static const uint32_t toks[2] = {1, 2};
    static const eng_wire_retain_t ret[1] = {{3, 5}};
    eng_wire_frame_t bad[8];
    memset(bad, 0, sizeof bad);
    bad[0].type = ENG_WIRE_CANCEL; /* request_id 0 */
    bad[1].type = ENG_WIRE_SUBMIT; /* no tokens */
    bad[1].u.submit.request_id = 1;
    bad[2].type = ENG_WIRE_SUBMIT; /* retain longer than the prompt */
    bad[2].u.submit = (eng_wire_submit_t){
        .request_id = 1, .tokens = toks, .n_tokens = 2, .retain = ret, .n_retain = 1};
    bad[2].u.submit.sampling = eng_sampling_params_default();
    bad[3].type = ENG_WIRE_DONE; /* stop sequence without an index */
    bad[3].u.done =
        (eng_wire_done_t){.request_id = 1, .stop_reason = ENG_WIRE_STOP_SEQUENCE, .stop_index = -1};
    bad[4].type = ENG_WIRE_ERROR; /* a non-negative code */
    bad[4].u.error.code = 0;
    bad[5].type = 0;              /* no such type */
    bad[6].type = ENG_WIRE_TOKEN; /* invalid UTF-8 */
    bad[6].u.token = (eng_wire_token_t){.request_id = 1, .text = PC_SLICE_LIT("\xFF")};
    bad[7].type = ENG_WIRE_SUBMIT; /* NaN top_p */
    bad[7].u.submit = (eng_wire_submit_t){.request_id = 1, .tokens = toks, .n_tokens = 2};
    bad[7].u.submit.sampling = eng_sampling_params_default();
    bad[7].u.submit.sampling.top_p = NAN;
    for (size_t i = 0; i < PC_ARRAY_LEN(bad); i++) {
        err[0] = 0;
        ASSERT_EQ(eng_wire_encode(&bad[i], 0, &out, err, sizeof err), PC_ERR_INVAL);
        ASSERT_EQ(out.len, 4);
        ASSERT_TRUE(err[0] != 0);
    }
    /* Over max_frame. */
    eng_wire_frame_t t = {.type = ENG_WIRE_TOKEN};
    t.u.token = (eng_wire_token_t){.request_id = 1, .text = PC_SLICE_LIT("0123456789")};
    ASSERT_EQ(eng_wire_encode(&t, 8 + 4 + 4 + 9, &out, err, sizeof err), PC_ERR_INVAL);
    ASSERT_TRUE(strstr(err, "over max_frame") != NULL);
    ASSERT_EQ(out.len, 4);
    ASSERT_EQ(eng_wire_encode(&t, 8 + 4 + 4 + 10, &out, err, sizeof err), 0);
    ASSERT_EQ(out.len, 4 + ENG_WIRE_HEADER_BYTES + 26);
    pc_buf_free(&out);
}

/* Golden frames, one per type, written from wire.h's table by an independent encoder (a
 * Python script over struct.pack, not this codec); 0xEE x 8 marks a fingerprint that the test
 * fills in with eng_wire_prefix_fp (pinned by prefix_fingerprint). */
static const uint8_t g_hello[] = {
    0x4b, 0x57, 0x04, 0x01, 0x00, 0x00, 0x00, 0x00, 0x54, 0x00, 0x00, 0x00, 0x02, 0x00, 0x02, 0x00,
    0x01, 0xe8, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, 0x67, 0x77, 0x01,
    0x00, 0x00, 0x00, 0x6d, 0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, 0x00, 0x01, 0x00, 0x00,
    0x00, 0x02, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
    0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f};
static const uint8_t g_hello_ack[] = {
    0x4b, 0x57, 0x04, 0x02, 0x00, 0x00, 0x00, 0x00, 0x54, 0x00, 0x00, 0x00, 0x02, 0x00, 0x02, 0x00,
    0x02, 0xe8, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, 0x67, 0x77, 0x01,
    0x00, 0x00, 0x00, 0x6d, 0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, 0x00, 0x01, 0x00, 0x00,
    0x00, 0x02, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00,
    0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa,
    0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa};
static const uint8_t g_reject[] = {0x4b, 0x57, 0x04, 0x03, 0x00, 0x00, 0x00, 0x00, 0x09, 0x00, 0x00,
                                   0x00, 0xf8, 0xff, 0xff, 0xff, 0x01, 0x00, 0x00, 0x00, 0x76};
static const uint8_t g_heartbeat[] = {0x4b, 0x57, 0x04, 0x04, 0x00, 0x00, 0x00, 0x00, 0x08, 0x00,
                                      0x00, 0x00, 0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01};
static const uint8_t g_submit[] = {
    0x4b, 0x57, 0x04, 0x05, 0x00, 0x00, 0x00, 0x00, 0x65, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff,
    0xff, 0xff, 0x03, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x3f, 0x28,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x00, 0x09, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00,
    0x00, 0x03, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0xe0, 0x93,
    0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x0a,
    0x01, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00};
static const uint8_t g_cancel[] = {0x4b, 0x57, 0x04, 0x06, 0x00, 0x00, 0x00, 0x00, 0x08, 0x00,
                                   0x00, 0x00, 0x99, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
static const uint8_t g_token[] = {0x4b, 0x57, 0x04, 0x07, 0x00, 0x00, 0x00, 0x00, 0x12, 0x00,
                                  0x00, 0x00, 0x11, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                  0x55, 0x44, 0x33, 0x22, 0x02, 0x00, 0x00, 0x00, 0xc3, 0xa9};
static const uint8_t g_done[] = {
    0x4b, 0x57, 0x04, 0x08, 0x00, 0x00, 0x00, 0x00, 0x39, 0x00, 0x00, 0x00, 0x01, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x0a, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00, 0x02,
    0x00, 0x00, 0x00, 0x64, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xd0, 0x07, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x30, 0x75, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
static const uint8_t g_error[] = {0x4b, 0x57, 0x04, 0x09, 0x00, 0x00, 0x00, 0x00, 0x13, 0x00, 0x00,
                                  0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xfe, 0xff,
                                  0xff, 0xff, 0x03, 0x00, 0x00, 0x00, 0x62, 0x61, 0x64};
static const uint8_t g_kv_event[] = {
    0x4b, 0x57, 0x04, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x3b, 0x00, 0x00, 0x00, 0x03, 0x01, 0x03,
    0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0xee, 0xee, 0xee,
    0xee, 0xee, 0xee, 0xee, 0xee, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x05,
    0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00};
static const uint8_t g_load[] = {
    0x4b, 0x57, 0x04, 0x0b, 0x00, 0x00, 0x00, 0x00, 0xec, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00,
    0x05, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7a, 0x44, 0x00, 0x00, 0x48, 0x41,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x02, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x0b, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x28, 0x6b, 0xee, 0x4d,
    0x0c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
static const uint8_t g_challenge[] = {
    0x4b, 0x57, 0x04, 0x0c, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02,
    0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11,
    0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f};
static const uint8_t g_auth[] = {0x4b, 0x57, 0x04, 0x0d, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00,
                                 0x00, 0xff, 0xfe, 0xfd, 0xfc, 0xfb, 0xfa, 0xf9, 0xf8, 0xf7, 0xf6,
                                 0xf5, 0xf4, 0xf3, 0xf2, 0xf1, 0xf0, 0xef, 0xee, 0xed, 0xec, 0xeb,
                                 0xea, 0xe9, 0xe8, 0xe7, 0xe6, 0xe5, 0xe4, 0xe3, 0xe2, 0xe1, 0xe0};
static const uint8_t g_release[] = {
    0x4b, 0x57, 0x04, 0x0e, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x42, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x09, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x00};
static const uint8_t g_drop[] = {0x4b, 0x57, 0x04, 0x0f, 0x00, 0x00, 0x00, 0x00, 0x08, 0x00,
                                 0x00, 0x00, 0x42, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
static const uint8_t g_snapshot[] = {
    0x4b, 0x57, 0x04, 0x10, 0x00, 0x00, 0x00, 0x00, 0x5b, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0x88, 0x13, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00,
    0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xdd, 0xdd, 0xdd, 0xdd, 0xdd,
    0xdd, 0xdd, 0xdd, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x03, 0x00, 0x00,
    0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00};
static const uint8_t g_prefill[] = {0x4b, 0x57, 0x04, 0x11, 0x00, 0x00, 0x00, 0x00, 0x1c, 0x00,
                                    0x00, 0x00, 0x21, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                    0x64, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00,
                                    0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00};

/* Encodes f, compares with want (fingerprints fp, fp2 little-endian at fp_at, fp2_at when > 0), and
 * decodes want back into a frame equal to f. */
static void golden(const eng_wire_frame_t *f, const uint8_t *want_in, size_t n, size_t fp_at,
                   uint64_t fp, size_t fp2_at, uint64_t fp2)
{
    uint8_t want[256];
    ASSERT_TRUE(n <= sizeof want);
    memcpy(want, want_in, n);
    for (int b = 0; b < 8; b++) {
        if (fp_at > 0)
            want[fp_at + (size_t)b] = (uint8_t)(fp >> (8 * b));
        if (fp2_at > 0)
            want[fp2_at + (size_t)b] = (uint8_t)(fp2 >> (8 * b));
    }
    pc_buf_t out = PC_BUF_INIT;
    char err[160] = "";
    int rc = eng_wire_encode(f, 0, &out, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  %s: %s\n", eng_wire_type_name(f->type), err);
    ASSERT_EQ(rc, 0);
    if (out.len != n || memcmp(out.base, want, n) != 0)
        fprintf(stderr, "  %s: encoding differs from the golden bytes\n",
                eng_wire_type_name(f->type));
    ASSERT_EQ(out.len, n);
    ASSERT_MEM_EQ(out.base, want, n);
    eng_wire_decoder_t *d;
    ASSERT_EQ(eng_wire_decoder_init(0, &d), 0);
    ASSERT_EQ(eng_wire_decoder_feed(d, want, n), 0);
    eng_wire_frame_t got;
    ASSERT_EQ(eng_wire_decoder_next(d, &got), 1);
    ASSERT_TRUE(wire_frame_eq(f, &got));
    eng_wire_decoder_free(d);
    pc_buf_free(&out);
}

#define GOLDEN(f, g, at, fp) PC_TEST_CALL(golden(&(f), g, sizeof g, at, fp, 0, 0))

PC_TEST(golden_bytes)
{
    /* Pins the layout of wire.h byte by byte, for every frame type. */
    eng_wire_frame_t f = {.type = ENG_WIRE_HELLO};
    f.u.hello = (eng_wire_hello_t){.version_min = 2,
                                   .version_max = 2,
                                   .role = ENG_WIRE_ROLE_GATEWAY,
                                   .heartbeat_ms = 1000,
                                   .max_frame = 65536,
                                   .node = PC_SLICE_LIT("gw"),
                                   .model_name = PC_SLICE_LIT("m"),
                                   .model_fp = 0x0102030405060708ull,
                                   .n_vocab = 256,
                                   .n_ctx = 512,
                                   .block_tokens = 16};
    for (int i = 0; i < ENG_WIRE_AUTH_BYTES; i++)
        f.u.hello.auth[i] = (uint8_t)i;
    GOLDEN(f, g_hello, 0, 0);
    f.type = ENG_WIRE_HELLO_ACK;
    f.u.hello.role = ENG_WIRE_ROLE_WORKER;
    f.u.hello.total_blocks = 64;
    f.u.hello.max_prompt_tokens = 512;
    memset(f.u.hello.auth, 0xAA, ENG_WIRE_AUTH_BYTES);
    GOLDEN(f, g_hello_ack, 0, 0);

    f = (eng_wire_frame_t){.type = ENG_WIRE_REJECT};
    f.u.error = (eng_wire_error_t){.code = PC_ERR_UNSUPPORTED, .message = PC_SLICE_LIT("v")};
    GOLDEN(f, g_reject, 0, 0); /* REJECT carries no request id */
    f = (eng_wire_frame_t){.type = ENG_WIRE_HEARTBEAT};
    f.u.heartbeat_ms = 0x0102030405060708ull;
    GOLDEN(f, g_heartbeat, 0, 0);

    static const uint32_t toks[3] = {1, 2, 3}, stop_ids[1] = {7};
    static const eng_wire_retain_t ret[1] = {{2, 300000}};
    static const pc_slice_t stops[1] = {PC_SLICE_LIT("\n")};
    f = (eng_wire_frame_t){.type = ENG_WIRE_SUBMIT};
    f.u.submit = (eng_wire_submit_t){
        .request_id = 5,
        .ns = 0x10,
        .priority = -1,
        .max_tokens = 3,
        .flags = ENG_WIRE_SUBMIT_IGNORE_EOG,
        .sampling = {.temperature = 0.5f, .top_k = 40, .top_p = 1.0f, .min_p = 0.0f, .seed = 9},
        .tokens = toks,
        .n_tokens = 3,
        .retain = ret,
        .n_retain = 1,
        .stops = stops,
        .n_stops = 1,
        .stop_ids = stop_ids,
        .n_stop_ids = 1};
    GOLDEN(f, g_submit, 0, 0);
    f = (eng_wire_frame_t){.type = ENG_WIRE_CANCEL};
    f.u.cancel_id = 0x99;
    GOLDEN(f, g_cancel, 0, 0);
    f = (eng_wire_frame_t){.type = ENG_WIRE_TOKEN};
    f.u.token =
        (eng_wire_token_t){.request_id = 0x11, .token_id = 0x22334455, .text = PC_SLICE_LIT("é")};
    GOLDEN(f, g_token, 0, 0);
    f = (eng_wire_frame_t){.type = ENG_WIRE_DONE};
    f.u.done = (eng_wire_done_t){.request_id = 1,
                                 .stop_reason = ENG_WIRE_STOP_SEQUENCE,
                                 .stop_index = 0,
                                 .usage = {10, 4, 6, 2},
                                 .timing = {100, 2000, 30000}};
    GOLDEN(f, g_done, 0, 0);
    f = (eng_wire_frame_t){.type = ENG_WIRE_ERROR};
    f.u.error =
        (eng_wire_error_t){.request_id = 3, .code = PC_ERR_INVAL, .message = PC_SLICE_LIT("bad")};
    GOLDEN(f, g_error, 0, 0);

    static const uint32_t path[3] = {5, 6, 7};
    uint64_t fp_path = eng_wire_prefix_fp(path, 3);
    f = (eng_wire_frame_t){.type = ENG_WIRE_KV_EVENT};
    f.u.kv = (eng_wire_kv_event_t){.kind = ENG_WIRE_KV_EVICTED,
                                   .reason = 1,
                                   .tier = ENG_WIRE_TIER_G3,
                                   .ns = 7,
                                   .n_tokens = 3,
                                   .prefix_fp = fp_path,
                                   .n_kept = 1,
                                   .tokens = path,
                                   .n_path = 3};
    GOLDEN(f, g_kv_event, 27, fp_path);
    f = (eng_wire_frame_t){.type = ENG_WIRE_LOAD};
    f.u.load = (eng_wire_load_t){.queued_requests = 1,
                                 .queued_prefill_tokens = 2,
                                 .running_seqs = 3,
                                 .free_blocks = 4,
                                 .cached_blocks = 5,
                                 .total_blocks = 20,
                                 .prefill_tokens_per_s = 1000.0f,
                                 .decode_ms_per_token = 12.5f};
    f.u.load.g3 = (eng_wire_tier_load_t){1u << 30, 65536, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 5e8f};
    f.u.load.tokens_recomputed = 12;
    GOLDEN(f, g_load, 0, 0);
    f = (eng_wire_frame_t){.type = ENG_WIRE_CHALLENGE};
    for (int i = 0; i < ENG_WIRE_AUTH_BYTES; i++)
        f.u.auth.bytes[i] = (uint8_t)i;
    GOLDEN(f, g_challenge, 0, 0);
    f = (eng_wire_frame_t){.type = ENG_WIRE_AUTH};
    for (int i = 0; i < ENG_WIRE_AUTH_BYTES; i++)
        f.u.auth.bytes[i] = (uint8_t)(255 - i);
    GOLDEN(f, g_auth, 0, 0);
    static const uint32_t rel[2] = {9, 10};
    f = (eng_wire_frame_t){.type = ENG_WIRE_RELEASE};
    f.u.release = (eng_wire_release_t){.ns = 0x42, .tokens = rel, .n_tokens = 2};
    GOLDEN(f, g_release, 0, 0);
    f = (eng_wire_frame_t){.type = ENG_WIRE_DROP};
    f.u.release.ns = 0x42;
    GOLDEN(f, g_drop, 0, 0);
    static const uint32_t snap_toks[3] = {1, 2, 3};
    uint64_t fp_snap = eng_wire_prefix_fp(snap_toks, 2),
             fp_snap3 = eng_wire_prefix_fp(snap_toks, 3);
    eng_wire_snap_entry_t ent[2] = {{.ns = 3,
                                     .prefix_fp = fp_snap,
                                     .ttl_ms = 5000,
                                     .tier = ENG_WIRE_TIER_G1,
                                     .tokens = snap_toks,
                                     .n_tokens = 2},
                                    {.ns = 4,
                                     .prefix_fp = fp_snap3,
                                     .tier = ENG_WIRE_TIER_G3,
                                     .tokens = snap_toks,
                                     .n_tokens = 3}};
    f = (eng_wire_frame_t){.type = ENG_WIRE_SNAPSHOT};
    f.u.snapshot =
        (eng_wire_snapshot_t){.snapshot_id = 7, .last = 1, .entries = ent, .n_entries = 2};
    PC_TEST_CALL(golden(&f, g_snapshot, sizeof g_snapshot, 33, fp_snap, 70, fp_snap3));
    f = (eng_wire_frame_t){.type = ENG_WIRE_PREFILL};
    f.u.prefill = (eng_wire_prefill_t){.request_id = 0x21,
                                       .prompt_tokens = 100,
                                       .tokens_g1 = 16,
                                       .tokens_g3 = 64,
                                       .tokens_recomputed = 16};
    GOLDEN(f, g_prefill, 0, 0);
}

PC_TEST(kv_event_and_snapshot_rules)
{
    /* The KV_EVENT table of wire.h and the fingerprints that come with tokens. */
    static const uint32_t path[3] = {5, 6, 7};
    eng_wire_frame_t f = {.type = ENG_WIRE_KV_EVENT};
    pc_buf_t out = PC_BUF_INIT;
    char err[160];
    f.u.kv = (eng_wire_kv_event_t){.kind = ENG_WIRE_KV_EVICTED,
                                   .reason = 1,
                                   .ns = 7,
                                   .n_tokens = 3,
                                   .prefix_fp = 1234, /* not the path's */
                                   .n_kept = 1,
                                   .tokens = path,
                                   .n_path = 3};
    ASSERT_EQ(eng_wire_encode(&f, 0, &out, err, sizeof err), PC_ERR_INVAL);
    ASSERT_TRUE(strstr(err, "prefix_fp does not match") != NULL);
    f.u.kv.prefix_fp = eng_wire_prefix_fp(path, 3);
    f.u.kv.n_path = 2; /* a path shorter than n_tokens */
    ASSERT_EQ(eng_wire_encode(&f, 0, &out, err, sizeof err), PC_ERR_INVAL);
    f.u.kv.n_path = 3;
    f.u.kv.kind = ENG_WIRE_KV_RELEASED; /* only EVICTED carries a path */
    f.u.kv.reason = 0;
    f.u.kv.n_kept = 3;
    ASSERT_EQ(eng_wire_encode(&f, 0, &out, err, sizeof err), PC_ERR_INVAL);
    f.u.kv.n_path = 0;
    ASSERT_EQ(eng_wire_encode(&f, 0, &out, err, sizeof err), 0);
    f.u.kv.request_id = 9; /* RELEASED belongs to no request */
    ASSERT_EQ(eng_wire_encode(&f, 0, &out, err, sizeof err), PC_ERR_INVAL);
    f.u.kv.kind = ENG_WIRE_KV_RETAINED; /* RETAINED: 0 for other gateways' requests */
    f.u.kv.request_id = 0;
    f.u.kv.ttl_ms = 5;
    ASSERT_EQ(eng_wire_encode(&f, 0, &out, err, sizeof err), 0);
    f.u.kv.kind = ENG_WIRE_KV_RETAIN_FAILED;
    f.u.kv.request_id = 9;
    ASSERT_EQ(eng_wire_encode(&f, 0, &out, err, sizeof err), PC_ERR_INVAL); /* n_kept 3 */
    f.u.kv.n_kept = 0;
    ASSERT_EQ(eng_wire_encode(&f, 0, &out, err, sizeof err), 0);
    /* HELLO carries no sizes; LOAD rates are not negative; RELEASE needs tokens. */
    eng_wire_frame_t h = {.type = ENG_WIRE_HELLO};
    h.u.hello = (eng_wire_hello_t){.version_min = 2, .version_max = 2, .role = 1, .max_frame = 1};
    h.u.hello.total_blocks = 1;
    ASSERT_EQ(eng_wire_encode(&h, 0, &out, err, sizeof err), PC_ERR_INVAL);
    eng_wire_frame_t l = {.type = ENG_WIRE_LOAD};
    l.u.load.decode_ms_per_token = -1.0f;
    ASSERT_EQ(eng_wire_encode(&l, 0, &out, err, sizeof err), PC_ERR_INVAL);
    l.u.load.decode_ms_per_token = -0.0f;
    ASSERT_EQ(eng_wire_encode(&l, 0, &out, err, sizeof err), PC_ERR_INVAL);
    eng_wire_frame_t r = {.type = ENG_WIRE_RELEASE};
    ASSERT_EQ(eng_wire_encode(&r, 0, &out, err, sizeof err), PC_ERR_INVAL);
    /* SNAPSHOT: last is a boolean, entries need tokens and their own fingerprint. */
    eng_wire_snap_entry_t e = {
        .ns = 1, .prefix_fp = 5, .ttl_ms = 1, .tier = 1, .tokens = path, .n_tokens = 3};
    eng_wire_frame_t sn = {.type = ENG_WIRE_SNAPSHOT};
    sn.u.snapshot =
        (eng_wire_snapshot_t){.snapshot_id = 1, .last = 1, .entries = &e, .n_entries = 1};
    ASSERT_EQ(eng_wire_encode(&sn, 0, &out, err, sizeof err), PC_ERR_INVAL);
    ASSERT_TRUE(strstr(err, "entry 0: prefix_fp") != NULL);
    e.prefix_fp = eng_wire_prefix_fp(path, 3);
    sn.u.snapshot.last = 2;
    ASSERT_EQ(eng_wire_encode(&sn, 0, &out, err, sizeof err), PC_ERR_INVAL);
    sn.u.snapshot.last = 0;
    size_t before = out.len;
    ASSERT_EQ(eng_wire_encode(&sn, 0, &out, err, sizeof err), 0);
    /* A count that claims more entries than the payload can hold is refused before sizing. */
    uint8_t *cnt = (uint8_t *)out.base + before + ENG_WIRE_HEADER_BYTES + 9;
    cnt[0] = 0xFF;
    cnt[1] = 0xFF;
    cnt[2] = 0xFF;
    cnt[3] = 0x0F;
    eng_wire_frame_t got;
    pc_buf_t scratch = PC_BUF_INIT;
    ASSERT_EQ(eng_wire_decode_payload(
                  ENG_WIRE_SNAPSHOT, (const uint8_t *)out.base + before + ENG_WIRE_HEADER_BYTES,
                  out.len - before - ENG_WIRE_HEADER_BYTES, &scratch, &got, err, sizeof err),
              PC_ERR_FORMAT);
    ASSERT_TRUE(strstr(err, "exceeds the payload") != NULL);
    pc_buf_free(&scratch);
    pc_buf_free(&out);
}

/* Encoding f must fail with a reason containing needle, leaving out unchanged. */
static void expect_refused(const eng_wire_frame_t *f, const char *needle)
{
    pc_buf_t out = PC_BUF_INIT;
    char err[160] = "";
    int rc = eng_wire_encode(f, 0, &out, err, sizeof err);
    if (rc != PC_ERR_INVAL || strstr(err, needle) == NULL)
        fprintf(stderr, "  rc %d, reason \"%s\", wanted \"%s\"\n", rc, err, needle);
    ASSERT_EQ(rc, PC_ERR_INVAL);
    ASSERT_TRUE(strstr(err, needle) != NULL);
    ASSERT_EQ(out.len, 0);
    pc_buf_free(&out);
}

static void expect_encodes(const eng_wire_frame_t *f)
{
    pc_buf_t out = PC_BUF_INIT;
    PC_TEST_CALL(encode_ok(f, &out));
    pc_buf_free(&out);
}

PC_TEST(tier_rules)
{
    /* Version 4's fields: KV_EVENT's tier, SNAPSHOT entries' tier, LOAD's tiers, PREFILL. */
    eng_wire_frame_t f = {.type = ENG_WIRE_KV_EVENT};
    f.u.kv = (eng_wire_kv_event_t){
        .kind = ENG_WIRE_KV_EVICTED, .reason = 1, .ns = 7, .n_tokens = 32, .n_kept = 16};
    for (uint8_t t = 0; t <= 4; t++) {
        f.u.kv.tier = t;
        if (t == 0 || t == ENG_WIRE_TIER_G2 || t == ENG_WIRE_TIER_G3)
            PC_TEST_CALL(expect_encodes(&f));
        else
            PC_TEST_CALL(expect_refused(&f, "with kind 3"));
    }
    f.u.kv.tier = 255;
    PC_TEST_CALL(expect_refused(&f, "tier 255 with kind 3"));
    f.u.kv = (eng_wire_kv_event_t){.kind = ENG_WIRE_KV_RETAINED,
                                   .tier = ENG_WIRE_TIER_G1, /* only EVICTED has a tier */
                                   .ns = 7,
                                   .n_tokens = 32,
                                   .n_kept = 32,
                                   .ttl_ms = 5};
    PC_TEST_CALL(expect_refused(&f, "tier 1 with kind 1"));
    f.u.kv.tier = 0;
    PC_TEST_CALL(expect_encodes(&f));

    static const uint32_t toks[3] = {4, 5, 6};
    eng_wire_snap_entry_t e = {.ns = 1,
                               .prefix_fp = eng_wire_prefix_fp(toks, 3),
                               .ttl_ms = 9,
                               .tier = 0,
                               .tokens = toks,
                               .n_tokens = 3};
    f = (eng_wire_frame_t){.type = ENG_WIRE_SNAPSHOT};
    f.u.snapshot =
        (eng_wire_snapshot_t){.snapshot_id = 1, .last = 1, .entries = &e, .n_entries = 1};
    PC_TEST_CALL(expect_refused(&f, "entry 0: tier 0 is not 1, 2 or 3"));
    e.tier = 4;
    PC_TEST_CALL(expect_refused(&f, "entry 0: tier 4 is not 1, 2 or 3"));
    e.tier = ENG_WIRE_TIER_G1;
    PC_TEST_CALL(expect_encodes(&f));
    e.tier = ENG_WIRE_TIER_G3; /* a disk-held prefix has no pin, so no TTL */
    PC_TEST_CALL(expect_refused(&f, "entry 0: ttl_ms 9 in tier 3"));
    e.ttl_ms = 0;
    PC_TEST_CALL(expect_encodes(&f));

    f = (eng_wire_frame_t){.type = ENG_WIRE_LOAD};
    f.u.load.g3.bytes = 4096; /* figures of a tier that is off */
    f.u.load.g3.blocks = 1;
    PC_TEST_CALL(expect_refused(&f, "g3: figures for a tier that is off"));
    f.u.load.g3.max_bytes = 1u << 20;
    PC_TEST_CALL(expect_encodes(&f));
    f.u.load.g3.blocks = 0;
    PC_TEST_CALL(expect_refused(&f, "g3: 4096 bytes in 0 blocks"));
    f.u.load.g3.blocks = 1;
    f.u.load.g3.load_bytes_per_s = -1.0f;
    PC_TEST_CALL(expect_refused(&f, "g3: negative load_bytes_per_s"));
    f.u.load.g3.load_bytes_per_s = -0.0f;
    PC_TEST_CALL(expect_refused(&f, "g3: negative load_bytes_per_s"));
    f.u.load.g3.load_bytes_per_s = INFINITY;
    PC_TEST_CALL(expect_refused(&f, "load_bytes_per_s is not a finite number"));
    f.u.load.g3.load_bytes_per_s = 1e9f;
    PC_TEST_CALL(expect_encodes(&f));
    f.u.load.g2.corrupt = 1; /* G2 off (the CPU backend) but a counter set */
    PC_TEST_CALL(expect_refused(&f, "g2: figures for a tier that is off"));
    f.u.load.g2.corrupt = 0;
    f.u.load.g2.load_bytes_per_s = 1.0f;
    PC_TEST_CALL(expect_refused(&f, "g2: figures for a tier that is off"));

    f = (eng_wire_frame_t){.type = ENG_WIRE_PREFILL};
    f.u.prefill = (eng_wire_prefill_t){.request_id = 0, .prompt_tokens = 10, .tokens_g3 = 10};
    PC_TEST_CALL(expect_refused(&f, "request_id 0"));
    f.u.prefill.request_id = 3;
    PC_TEST_CALL(expect_encodes(&f));
    f.u.prefill.tokens_recomputed = 1;
    PC_TEST_CALL(
        expect_refused(&f, "g1 0 + g2 0 + g3 10 + recomputed 1 tokens > prompt_tokens 10"));
    /* The sum is taken without wrapping around 2^32. */
    f.u.prefill = (eng_wire_prefill_t){.request_id = 3,
                                       .prompt_tokens = 5,
                                       .tokens_g1 = UINT32_MAX,
                                       .tokens_g2 = UINT32_MAX,
                                       .tokens_g3 = 4,
                                       .tokens_recomputed = 3};
    PC_TEST_CALL(expect_refused(&f, "> prompt_tokens 5"));

    /* The decoder refuses the same bytes (not only the encoder's own check): a PREFILL patched
     * to claim more than its prompt. */
    f.u.prefill = (eng_wire_prefill_t){.request_id = 3, .prompt_tokens = 10, .tokens_g1 = 10};
    pc_buf_t a = PC_BUF_INIT;
    PC_TEST_CALL(encode_ok(&f, &a));
    put32(&a, 8 + 4 + 4, 1); /* tokens_g2 */
    PC_TEST_CALL(expect_payload_error(ENG_WIRE_PREFILL, &a, "> prompt_tokens 10"));
    a.len--; /* truncated */
    PC_TEST_CALL(expect_payload_error(ENG_WIRE_PREFILL, &a, "truncated in tokens_recomputed"));
    pc_buf_free(&a);
}

PC_TEST(prefix_fingerprint)
{
    uint32_t t[5] = {1, 2, 0x01020304, 128000, 7};
    uint8_t le[20];
    for (int i = 0; i < 5; i++)
        for (int b = 0; b < 4; b++)
            le[4 * i + b] = (uint8_t)(t[i] >> (8 * b));
    ASSERT_EQ_U64(eng_wire_prefix_fp(t, 5), XXH3_64bits(le, 20));
    ASSERT_EQ_U64(eng_wire_prefix_fp(t, 3), XXH3_64bits(le, 12));
    ASSERT_EQ_U64(eng_wire_prefix_fp(t, 0), XXH3_64bits(NULL, 0));
    uint32_t swapped[2] = {2, 1};
    ASSERT_NE(eng_wire_prefix_fp(t, 2), eng_wire_prefix_fp(swapped, 2));
}

PC_TEST(mutated_streams)
{
    /* A small in-test fuzzer: flip, insert and delete bytes of valid streams; the decoder must
     * return frames or one clean error, and every frame it returns must re-encode to exactly
     * the bytes it came from. */
    eng_rng_t r;
    eng_rng_seed(&r, 5);
    static stream_t s;
    int iters = (int)(300 * pc_test_scale());
    for (int it = 0; it < iters; it++) {
        PC_TEST_CALL(make_stream(&r, &s, 1 + wg_below(&r, 12)));
        pc_buf_t m = PC_BUF_INIT;
        ASSERT_EQ(pc_buf_append(&m, s.bytes.base, s.bytes.len), 0);
        int n_mut = 1 + (int)wg_below(&r, 4);
        for (int k = 0; k < n_mut && m.len > 0; k++) {
            size_t at = wg_below(&r, (uint32_t)m.len);
            switch (wg_below(&r, 3)) {
            case 0:
                m.base[at] ^= (char)(1 << wg_below(&r, 8));
                break;
            case 1:
                memmove(m.base + at, m.base + at + 1, m.len - at - 1);
                m.len--;
                break;
            default:
                ASSERT_TRUE(pc_buf_reserve(&m, 1) != NULL);
                memmove(m.base + at + 1, m.base + at, m.len - at);
                m.base[at] = (char)wg_u64(&r);
                m.len++;
            }
        }
        eng_wire_decoder_t *d;
        ASSERT_EQ(eng_wire_decoder_init(1u << 16, &d), 0);
        size_t fed = 0, consumed = 0;
        int rc = 0;
        while (fed < m.len && rc >= 0) {
            size_t n = 1 + wg_below(&r, 64);
            n = n < m.len - fed ? n : m.len - fed;
            ASSERT_EQ(eng_wire_decoder_feed(d, m.base + fed, n), 0);
            fed += n;
            eng_wire_frame_t got;
            while ((rc = eng_wire_decoder_next(d, &got)) == 1) {
                pc_buf_t re = PC_BUF_INIT;
                ASSERT_EQ(eng_wire_encode(&got, 1u << 16, &re, NULL, 0), 0);
                ASSERT_TRUE(consumed + re.len <= fed);
                ASSERT_MEM_EQ(re.base, m.base + consumed, re.len);
                consumed += re.len;
                pc_buf_free(&re);
            }
        }
        if (rc < 0)
            ASSERT_TRUE(eng_wire_decoder_error(d)[0] != 0);
        else
            ASSERT_EQ(eng_wire_decoder_pending(d), m.len - consumed);
        eng_wire_decoder_free(d);
        pc_buf_free(&m);
        pc_buf_free(&s.bytes);
    }
}

static void write_file(const char *dir, const char *name, const void *data, size_t len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "wb");
    ASSERT_TRUE(fp != NULL);
    ASSERT_EQ(fwrite(data, 1, len, fp), len);
    fclose(fp);
}

PC_TEST(corpus_seeds)
{
    /* The fuzz target's input: byte 0 picks the mode and chunk size (see fuzz_wire.c), the
     * rest is a stream. Seeds: each frame type alone, a mixed stream, and hostile headers. */
    /* With KVGW_WIRE_CORPUS=DIR the seeds go there (to refresh the committed corpus); without it
     * they go to a temporary directory, so the generation is still checked (every seed frame
     * encodes, every file is written) and the case never skips. */
    const char *dir = getenv("KVGW_WIRE_CORPUS");
    char tmp[512];
    if (dir == NULL) { /* the per-process directory, removed with its files at exit */
        snprintf(tmp, sizeof tmp, "%s", pc_test_tmp_path("."));
        dir = tmp;
    }
    eng_rng_t r;
    eng_rng_seed(&r, 6);
    for (int type = 1; type <= ENG_WIRE_TYPE_MAX; type++) {
        for (int v = 0; v < 2; v++) {
            wire_gen_t g;
            eng_wire_frame_t f;
            wire_gen_frame(&r, type, &g, &f);
            pc_buf_t b = PC_BUF_INIT;
            ASSERT_EQ(pc_buf_append(&b, v == 0 ? "\x00" : "\x0e", 1), 0);
            PC_TEST_CALL(encode_ok(&f, &b));
            char name[64];
            snprintf(name, sizeof name, "%s_%d", names[type], v);
            write_file(dir, name, b.base, b.len);
            if (v == 0) { /* the payload alone, for the payload mode (byte 0 odd) */
                b.base[0] = (char)(2 * type + 1);
                memmove(b.base + 1, b.base + 1 + ENG_WIRE_HEADER_BYTES,
                        b.len - 1 - ENG_WIRE_HEADER_BYTES);
                b.len -= ENG_WIRE_HEADER_BYTES;
                snprintf(name, sizeof name, "payload_%s", names[type]);
                write_file(dir, name, b.base, b.len);
            }
            pc_buf_free(&b);
        }
    }
    static stream_t s;
    PC_TEST_CALL(make_stream(&r, &s, 2 * ENG_WIRE_TYPE_MAX));
    pc_buf_t b = PC_BUF_INIT;
    ASSERT_EQ(pc_buf_append(&b, "\x0c", 1), 0);
    ASSERT_EQ(pc_buf_append(&b, s.bytes.base, s.bytes.len), 0);
    write_file(dir, "stream_mixed", b.base, b.len);
    pc_buf_free(&b);
    pc_buf_free(&s.bytes);
    write_file(dir, "http_get", "\x00GET / HTTP/1.1\r\n\r\n", 19);
    write_file(dir, "version_1", "\x00KW\x01\x04\0\0\0\0\x08\0\0\0\0\0\0\0\0\0\0\0", 21);
    write_file(dir, "huge_length", "\x00KW\x02\x05\0\0\0\0\xff\xff\xff\xff", 13);
    write_file(dir, "flags_set", "\x00KW\x02\x06\x01\0\0\0\x08\0\0\0\1\0\0\0\0\0\0\0", 21);
}

PC_TEST_MAIN()
