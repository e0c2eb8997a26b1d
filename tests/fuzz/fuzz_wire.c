/*
 * fuzz_wire.c — libFuzzer target for the worker protocol codec (engine/wire.c).
 *
 * Byte 0 picks the mode, the rest is the input:
 *   even: a byte stream for the incremental decoder, fed in chunks of (byte0 / 2 + 1) bytes
 *         (max_frame 1 MiB). Every frame it returns must re-encode to exactly the bytes it was
 *         decoded from (the encoding is canonical), and an error must come with a reason.
 *   odd:  a payload of type (byte0 / 2) % 32 (unknown types included) for
 *         eng_wire_decode_payload, from an exact-size copy so that ASan flags any read past
 *         it; a decoded payload must re-encode to the same bytes.
 * Anything else (a crash, a sanitizer report, a broken property) aborts.
 */
#include "common.h"
#include "wire.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check_reencode(const eng_wire_frame_t *f, const uint8_t *bytes, size_t len)
{
    pc_buf_t out = PC_BUF_INIT;
    if (eng_wire_encode(f, 0, &out, NULL, 0) != 0 || out.len != len ||
        memcmp(out.base, bytes, len) != 0)
        abort();
    pc_buf_free(&out);
}

static void fuzz_payload(uint8_t type, const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size > 0 ? size : 1);
    if (copy == NULL)
        return;
    memcpy(copy, data, size);
    pc_buf_t scratch = PC_BUF_INIT;
    eng_wire_frame_t f;
    char err[160] = "";
    int rc = eng_wire_decode_payload(type, copy, size, &scratch, &f, err, sizeof err);
    if (rc == 0) {
        pc_buf_t framed = PC_BUF_INIT;
        uint8_t hdr[ENG_WIRE_HEADER_BYTES] = {'K', 'W', ENG_WIRE_VERSION, type};
        for (int i = 0; i < 4; i++)
            hdr[8 + i] = (uint8_t)(size >> (8 * i));
        if (pc_buf_append(&framed, hdr, sizeof hdr) != 0 || pc_buf_append(&framed, copy, size) != 0)
            abort();
        check_reencode(&f, (const uint8_t *)framed.base, framed.len);
        pc_buf_free(&framed);
    } else if (rc != PC_ERR_FORMAT || err[0] == 0) {
        abort();
    }
    pc_buf_free(&scratch);
    free(copy);
}

static void fuzz_stream(size_t chunk, const uint8_t *data, size_t size)
{
    eng_wire_decoder_t *d;
    if (eng_wire_decoder_init(1u << 20, &d) != 0)
        return;
    size_t fed = 0, consumed = 0;
    int rc = 0;
    while (fed < size && rc >= 0) {
        size_t n = chunk < size - fed ? chunk : size - fed;
        if (eng_wire_decoder_feed(d, data + fed, n) != 0)
            abort();
        fed += n;
        eng_wire_frame_t f;
        while ((rc = eng_wire_decoder_next(d, &f)) == 1) {
            pc_buf_t out = PC_BUF_INIT;
            if (eng_wire_encode(&f, 1u << 20, &out, NULL, 0) != 0 || consumed + out.len > fed ||
                memcmp(out.base, data + consumed, out.len) != 0)
                abort();
            consumed += out.len;
            pc_buf_free(&out);
        }
    }
    if (rc < 0 ? eng_wire_decoder_error(d)[0] == 0 : eng_wire_decoder_pending(d) != size - consumed)
        abort();
    eng_wire_decoder_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    uint8_t mode = data[0];
    if (mode & 1)
        fuzz_payload((uint8_t)((mode >> 1) & 31), data + 1, size - 1);
    else
        fuzz_stream((size_t)(mode >> 1) + 1, data + 1, size - 1);
    return 0;
}
