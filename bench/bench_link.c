/*
 * bench_link.c — `kvgw bench link`: what sealing the worker link (link/wire_seal.h) costs per
 * frame, on one thread of this machine.
 *
 * The frame is the link's most frequent one: a TOKEN (request id, token id, a few bytes of
 * text: 32 bytes on the wire), one per generated token of every request. Figures:
 *   - link_plain_ns_per_token_frame: encode + decode of the frame as it is (the cost of an
 *     unsealed link);
 *   - link_encrypt_ns_per_token_frame: encode, seal into a record, open the record, decode:
 *     what one token costs the worker and the gateway together on a link with a secret;
 *   - link_seal_ns_per_64k_record, link_seal_gb_s: one full record (a big SUBMIT or SNAPSHOT
 *     spans records of 64 KiB), sealed and opened.
 * The best of five passes of each, so a busy moment of a shared machine does not count.
 */
#include "bench.h"
#include "common.h"
#include "wire.h"
#include "wire_seal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PASSES 5

static void usage(FILE *f)
{
    fprintf(f, "usage: kvgw bench link [--frames N]\n");
    fprintf(f, "  --frames  TOKEN frames per pass (default 200000)\n");
}

/* One pass of n frames; returns ns per frame, or -1 when a frame does not come back. */
static double token_pass(uint32_t n, bool sealed)
{
    eng_wire_frame_t f = {.type = ENG_WIRE_TOKEN};
    f.u.token.request_id = 123456;
    f.u.token.text = PC_SLICE_LIT(" the");
    static const uint8_t secret[32] = "bench-link-secret-0123456789abc";
    uint8_t gn[ENG_WIRE_AUTH_BYTES] = {1}, wn[ENG_WIRE_AUTH_BYTES] = {2};
    lnk_seal_t tx, rx, unused;
    lnk_seal_derive(secret, sizeof secret, gn, wn, &unused, &tx);
    rx = tx;
    pc_buf_t plain = PC_BUF_INIT, wire = PC_BUF_INIT, open = PC_BUF_INIT, scratch = PC_BUF_INIT;
    uint64_t sum = 0;
    double t0 = bench_now_s();
    for (uint32_t i = 0; i < n; i++) {
        f.u.token.token_id = i;
        plain.len = wire.len = open.len = 0;
        if (eng_wire_encode(&f, ENG_WIRE_MAX_FRAME_DEFAULT, &plain, NULL, 0) != 0)
            return -1;
        const uint8_t *frame = (const uint8_t *)plain.base;
        size_t len = plain.len;
        if (sealed) {
            size_t used = 0;
            if (lnk_seal_records(&tx, plain.base, plain.len, &wire) != 0 ||
                lnk_seal_open(&rx, (const uint8_t *)wire.base, wire.len, &used, &open, NULL, 0) !=
                    1 ||
                used != wire.len)
                return -1;
            frame = (const uint8_t *)open.base;
            len = open.len;
        }
        eng_wire_frame_t g;
        if (eng_wire_decode_payload(frame[3], frame + ENG_WIRE_HEADER_BYTES,
                                    len - ENG_WIRE_HEADER_BYTES, &scratch, &g, NULL, 0) != 0)
            return -1;
        sum += g.u.token.token_id;
    }
    double dt = bench_now_s() - t0;
    if (sum != (uint64_t)n * (n - 1) / 2)
        return -1;
    pc_buf_free(&plain);
    pc_buf_free(&wire);
    pc_buf_free(&open);
    pc_buf_free(&scratch);
    lnk_seal_wipe(&tx);
    lnk_seal_wipe(&rx);
    return dt * 1e9 / n;
}

static double record_pass(uint32_t n)
{
    static uint8_t data[LNK_SEAL_RECORD_MAX];
    memset(data, 0x5a, sizeof data);
    static const uint8_t secret[32] = "bench-link-secret-0123456789abc";
    uint8_t gn[ENG_WIRE_AUTH_BYTES] = {1}, wn[ENG_WIRE_AUTH_BYTES] = {2};
    lnk_seal_t tx, rx;
    lnk_seal_derive(secret, sizeof secret, gn, wn, &tx, &rx);
    rx = tx;
    pc_buf_t wire = PC_BUF_INIT, open = PC_BUF_INIT;
    double t0 = bench_now_s();
    for (uint32_t i = 0; i < n; i++) {
        wire.len = open.len = 0;
        size_t used = 0;
        if (lnk_seal_records(&tx, data, sizeof data, &wire) != 0 ||
            lnk_seal_open(&rx, (const uint8_t *)wire.base, wire.len, &used, &open, NULL, 0) != 1)
            return -1;
    }
    double dt = bench_now_s() - t0;
    pc_buf_free(&wire);
    pc_buf_free(&open);
    return dt * 1e9 / n;
}

static double best(double a, double b)
{
    return a < 0 ? b : b < 0 ? a : (a < b ? a : b);
}

double bench_link_token_frame_ns(uint32_t n_frames)
{
    double ns = -1;
    for (int p = 0; p < PASSES; p++)
        ns = best(ns, token_pass(n_frames, true));
    return ns;
}

int bench_link_main(int argc, char **argv)
{
    uint32_t n = 200000;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--frames") == 0 && i + 1 < argc) {
            n = (uint32_t)strtoul(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (n == 0)
        n = 1;
    double plain = -1, rec = -1;
    for (int p = 0; p < PASSES; p++) {
        plain = best(plain, token_pass(n, false));
        rec = best(rec, record_pass(n / 64 + 1));
    }
    double sealed = bench_link_token_frame_ns(n);
    if (plain < 0 || sealed < 0 || rec < 0) {
        fprintf(stderr, "kvgw bench link: a frame did not come back\n");
        return 1;
    }
    bench_report_t rep;
    bench_report_init(&rep, "link");
    bench_report_add(&rep, "link_plain_ns_per_token_frame", plain, "encode + decode, unsealed");
    bench_report_add(&rep, "link_encrypt_ns_per_token_frame", sealed,
                     "encode + seal + open + decode");
    bench_report_add(&rep, "link_seal_ns_per_64k_record", rec, "seal + open of 64 KiB");
    bench_report_add(&rep, "link_seal_gb_s", (double)LNK_SEAL_RECORD_MAX / rec, "seal + open");
    bench_report_print(&rep);
    return 0;
}
