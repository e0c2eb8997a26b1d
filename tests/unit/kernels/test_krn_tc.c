/*
 * test_krn_tc.c — the tensor-core prefill attention kernel (krn_attn_tc.cu) checked on the CPU
 * (label unit): no GPU runs it here, so this test emulates it with the very maps and geometry
 * it is built from (krn_hostdev.h).
 *
 *   - The m16n8k16 fragment maps cover each A, B and C element exactly once; an emulated
 *     ldmatrix (the PTX ISA's definition: lane l addresses row l % 8 of matrix l / 8, register j
 *     receives matrix j's halves (l / 4, 2(l % 4) + {0, 1}), transposed with .trans) fed with
 *     the kernel's lane addresses yields exactly the fragments the maps name; an emulated
 *     mma.sync (D = A B + C elementwise through the maps) over Q K^T, then the C fragments
 *     reused as the A fragment of P V, equals a plain matmul.
 *   - The online softmax's row max and sum over the 4 lanes of a fragment row (shuffle xor 1,
 *     then 2) give every lane its row's value.
 *   - A whole-CTA emulation of the kernel (its loads with the zero-fill rules, double buffer,
 *     tile skipping, mask, F16 rounding of Q and P, the reduction and the output scatter) on
 *     random paged scenarios with NaN-poisoned unwritten slots matches krn_ref_attention
 *     within the GPU test's tolerance (2e-3 relative L2), for ragged tails, block sizes
 *     8/16/32/64/128, GQA 1..8, head dims 16..256 and cached prefixes.
 *   - The tile geometry: every position a row sees lies in exactly one tile of its task, every
 *     copied chunk lies inside one written block, and the shared memory fits sm_80 and sm_90.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "krn_hostdev.h"
#include "krn_softmax_merge.h"
#include "krn_testutil.h"
#include "pc_assert.h"
#include "pc_err.h"
#include "pc_test.h"

/* ---- one warp's registers and instructions ---------------------------------------------- */

static uint32_t pack2(uint16_t lo, uint16_t hi)
{
    return (uint32_t)lo | ((uint32_t)hi << 16);
}
static uint16_t half_of(uint32_t r, int h)
{
    return (uint16_t)(h ? r >> 16 : r & 0xffff);
}
static uint32_t pack_f(float lo, float hi)
{
    return pack2(krn_f32_to_f16(lo), krn_f32_to_f16(hi));
}

/* ldmatrix.x4 (.trans when trans): addr[l] is the element offset in smem of the 8-half row
 * lane l addresses. */
static void emu_ldm_x4(uint32_t r[32][4], const uint16_t *smem, const int64_t addr[32], bool trans)
{
    for (int l = 0; l < 32; l++)
        for (int j = 0; j < 4; j++) {
            const uint16_t *rows[8];
            for (int i = 0; i < 8; i++)
                rows[i] = smem + addr[8 * j + i];
            int g = l / 4, t = l % 4;
            if (!trans)
                r[l][j] = pack2(rows[g][2 * t], rows[g][2 * t + 1]);
            else
                r[l][j] = pack2(rows[2 * t][g], rows[2 * t + 1][g]);
        }
}

/* mma.sync.m16n8k16.row.col.f32.f16.f16.f32: c += a . b, through the fragment maps. */
static void emu_mma(float c[32][4], const uint32_t a[32][4], const uint32_t b[32][2])
{
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
        for (int i = 0; i < 8; i++)
            A[krn_mma_a_row(l, i)][krn_mma_a_col(l, i)] =
                krn_f16_to_f32(half_of(a[l][i / 2], i & 1));
        for (int i = 0; i < 4; i++)
            B[krn_mma_b_row(l, i)][krn_mma_b_col(l, i)] =
                krn_f16_to_f32(half_of(b[l][i / 2], i & 1));
        for (int i = 0; i < 4; i++)
            C[krn_mma_c_row(l, i)][krn_mma_c_col(l, i)] = c[l][i];
    }
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
            float acc = C[r][n];
            for (int k = 0; k < 16; k++)
                acc += A[r][k] * B[k][n];
            C[r][n] = acc;
        }
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < 4; i++)
            c[l][i] = C[krn_mma_c_row(l, i)][krn_mma_c_col(l, i)];
}

/* __shfl_xor_sync over a warp's per-lane values, with max or sum. */
static void emu_xor_reduce(float v[32], bool is_max)
{
    for (int off = 1; off <= 2; off *= 2) {
        float w[32];
        for (int l = 0; l < 32; l++)
            w[l] = is_max ? fmaxf(v[l], v[l ^ off]) : v[l] + v[l ^ off];
        memcpy(v, w, sizeof w);
    }
}

PC_TEST(fragment_maps_cover_each_element_once)
{
    int a[16][16] = {{0}}, b[16][8] = {{0}}, c[16][8] = {{0}}, ld[16][16] = {{0}};
    for (int l = 0; l < 32; l++) {
        for (int i = 0; i < 8; i++)
            a[krn_mma_a_row(l, i)][krn_mma_a_col(l, i)]++;
        for (int i = 0; i < 4; i++) {
            b[krn_mma_b_row(l, i)][krn_mma_b_col(l, i)]++;
            c[krn_mma_c_row(l, i)][krn_mma_c_col(l, i)]++;
        }
        /* ldmatrix.x4 rows: each (row, 8-col half) of a 16x16 tile once. */
        ld[krn_ldm_x4_row(l)][krn_ldm_x4_col(l)]++;
        ASSERT_TRUE(krn_ldm_x4_col(l) == 0 || krn_ldm_x4_col(l) == 8);
    }
    for (int r = 0; r < 16; r++) {
        for (int k = 0; k < 16; k++)
            ASSERT_EQ(a[r][k], 1);
        for (int n = 0; n < 8; n++) {
            ASSERT_EQ(b[r][n], 1);
            ASSERT_EQ(c[r][n], 1);
        }
        ASSERT_EQ(ld[r][0], 1);
        ASSERT_EQ(ld[r][8], 1);
    }
    /* The 4 lanes of a C row are l ^ 1 and l ^ 2 of each other (the softmax's shuffles). */
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < 4; i++) {
            ASSERT_EQ(krn_mma_c_row(l ^ 1, i), krn_mma_c_row(l, i));
            ASSERT_EQ(krn_mma_c_row(l ^ 2, i), krn_mma_c_row(l, i));
            ASSERT_EQ(krn_mma_c_row(l ^ 3, i), krn_mma_c_row(l, i));
        }
}

/* ldmatrix with the kernel's lane addresses yields the maps' fragments: A from a row-major
 * tile, B (two n-tiles) from a [k][n] tile with .trans. */
PC_TEST(ldmatrix_addresses_give_the_fragments)
{
    kt_rng_t rng = {5};
    const int stride = 72; /* a padded row, as the kernel's */
    uint16_t sm[16 * 72];
    for (int i = 0; i < 16 * stride; i++)
        sm[i] = krn_f32_to_f16(kt_unif(&rng));
    int64_t addr[32];
    uint32_t r[32][4];
    for (int col0 = 0; col0 <= 32; col0 += 16) {
        for (int l = 0; l < 32; l++)
            addr[l] = (int64_t)krn_ldm_x4_row(l) * stride + col0 + krn_ldm_x4_col(l);
        emu_ldm_x4(r, sm, addr, false);
        for (int l = 0; l < 32; l++)
            for (int i = 0; i < 8; i++)
                ASSERT_EQ(half_of(r[l][i / 2], i & 1),
                          sm[krn_mma_a_row(l, i) * stride + col0 + krn_mma_a_col(l, i)]);
        emu_ldm_x4(r, sm, addr, true);
        for (int l = 0; l < 32; l++)
            for (int nt = 0; nt < 2; nt++)
                for (int i = 0; i < 4; i++)
                    ASSERT_EQ(
                        half_of(r[l][2 * nt + i / 2], i & 1),
                        sm[krn_mma_b_row(l, i) * stride + col0 + 8 * nt + krn_mma_b_col(l, i)]);
    }
}

/* One warp: S = Q K^T over two k-steps from smem (Q row-major, K as [d][pos] like the pool),
 * then P = S (rounded to F16) reused in registers as the A fragment of P V: equals plain
 * matmuls over the same rounded values. */
PC_TEST(warp_mma_chain_matches_matmul)
{
    kt_rng_t rng = {7};
    enum { HD = 32, BC = 16, QS = HD + 8, KS = BC + 8, VS = HD + 8 };
    uint16_t sq[16 * QS], sk[HD * KS], sv[BC * VS];
    float q[16][HD], k[HD][BC], v[BC][HD];
    for (int r = 0; r < 16; r++)
        for (int d = 0; d < HD; d++)
            q[r][d] = krn_f16_to_f32(sq[r * QS + d] = krn_f32_to_f16(kt_unif(&rng)));
    for (int d = 0; d < HD; d++)
        for (int p = 0; p < BC; p++)
            k[d][p] = krn_f16_to_f32(sk[d * KS + p] = krn_f32_to_f16(kt_unif(&rng)));
    for (int p = 0; p < BC; p++)
        for (int d = 0; d < HD; d++)
            v[p][d] = krn_f16_to_f32(sv[p * VS + d] = krn_f32_to_f16(kt_unif(&rng)));
    float s[BC / 8][32][4];
    memset(s, 0, sizeof s);
    int64_t addr[32];
    for (int kk = 0; kk < HD / 16; kk++) {
        uint32_t af[32][4], bf[32][4], b0[32][2], b1[32][2];
        for (int l = 0; l < 32; l++)
            addr[l] = (int64_t)krn_ldm_x4_row(l) * QS + kk * 16 + krn_ldm_x4_col(l);
        emu_ldm_x4(af, sq, addr, false);
        for (int np = 0; np < BC / 16; np++) {
            for (int l = 0; l < 32; l++)
                addr[l] = (int64_t)(kk * 16 + krn_ldm_x4_row(l)) * KS + np * 16 + krn_ldm_x4_col(l);
            emu_ldm_x4(bf, sk, addr, true);
            for (int l = 0; l < 32; l++) {
                b0[l][0] = bf[l][0], b0[l][1] = bf[l][1];
                b1[l][0] = bf[l][2], b1[l][1] = bf[l][3];
            }
            emu_mma(s[2 * np], af, b0);
            emu_mma(s[2 * np + 1], af, b1);
        }
    }
    float S[16][BC];
    for (int r = 0; r < 16; r++)
        for (int p = 0; p < BC; p++) {
            double acc = 0;
            for (int d = 0; d < HD; d++)
                acc += (double)q[r][d] * k[d][p];
            S[r][p] = (float)acc;
        }
    for (int n = 0; n < BC / 8; n++)
        for (int l = 0; l < 32; l++)
            for (int i = 0; i < 4; i++)
                ASSERT_NEAR(s[n][l][i], S[krn_mma_c_row(l, i)][n * 8 + krn_mma_c_col(l, i)], 1e-5);
    /* P V with P from the C fragments. */
    float o[HD / 8][32][4];
    memset(o, 0, sizeof o);
    for (int kk = 0; kk < BC / 16; kk++) {
        uint32_t pa[32][4], bf[32][4], b0[32][2], b1[32][2];
        for (int l = 0; l < 32; l++) {
            pa[l][0] = pack_f(s[2 * kk][l][0], s[2 * kk][l][1]);
            pa[l][1] = pack_f(s[2 * kk][l][2], s[2 * kk][l][3]);
            pa[l][2] = pack_f(s[2 * kk + 1][l][0], s[2 * kk + 1][l][1]);
            pa[l][3] = pack_f(s[2 * kk + 1][l][2], s[2 * kk + 1][l][3]);
        }
        for (int np = 0; np < HD / 16; np++) {
            for (int l = 0; l < 32; l++)
                addr[l] = (int64_t)(kk * 16 + krn_ldm_x4_row(l)) * VS + np * 16 + krn_ldm_x4_col(l);
            emu_ldm_x4(bf, sv, addr, true);
            for (int l = 0; l < 32; l++) {
                b0[l][0] = bf[l][0], b0[l][1] = bf[l][1];
                b1[l][0] = bf[l][2], b1[l][1] = bf[l][3];
            }
            emu_mma(o[2 * np], pa, b0);
            emu_mma(o[2 * np + 1], pa, b1);
        }
    }
    for (int r = 0; r < 16; r++)
        for (int d = 0; d < HD; d++) {
            double acc = 0;
            for (int p = 0; p < BC; p++)
                acc += (double)krn_f16_to_f32(krn_f32_to_f16(S[r][p])) * v[p][d];
            int n = d / 8, found = 0;
            for (int l = 0; l < 32; l++)
                for (int i = 0; i < 4; i++)
                    if (krn_mma_c_row(l, i) == r && n * 8 + krn_mma_c_col(l, i) == d) {
                        ASSERT_NEAR(o[n][l][i], acc, 2e-3 * (1 + fabs(acc)));
                        found++;
                    }
            ASSERT_EQ(found, 1);
        }
}

PC_TEST(row_reduction_over_four_lanes)
{
    kt_rng_t rng = {11};
    for (int rep = 0; rep < 20; rep++) {
        float c[32][4], mx[32], sm[32];
        float rmax[16], rsum[16];
        for (int r = 0; r < 16; r++)
            rmax[r] = -INFINITY, rsum[r] = 0;
        for (int l = 0; l < 32; l++)
            for (int i = 0; i < 4; i++) {
                c[l][i] = rep % 3 == 0 && (l + i) % 5 == 0 ? -INFINITY : kt_unif(&rng) * 10;
                int r = krn_mma_c_row(l, i);
                rmax[r] = fmaxf(rmax[r], c[l][i]);
            }
        for (int h = 0; h < 2; h++) {
            for (int l = 0; l < 32; l++)
                mx[l] = fmaxf(c[l][2 * h], c[l][2 * h + 1]);
            emu_xor_reduce(mx, true);
            for (int l = 0; l < 32; l++) {
                int r = krn_mma_c_row(l, 2 * h);
                ASSERT_EQ(mx[l], rmax[r]);
                sm[l] = krn_tc_prob(c[l][2 * h], mx[l]) + krn_tc_prob(c[l][2 * h + 1], mx[l]);
            }
            for (int l = 0; l < 32; l++)
                for (int i = 2 * h; i < 2 * h + 2; i++)
                    rsum[krn_mma_c_row(l, i)] += expf(c[l][i] - rmax[krn_mma_c_row(l, i)]);
            emu_xor_reduce(sm, false);
            for (int l = 0; l < 32; l++)
                ASSERT_NEAR(sm[l], rsum[krn_mma_c_row(l, 2 * h)],
                            1e-5 * rsum[krn_mma_c_row(l, 2 * h)]);
        }
    }
    /* krn_tc_prob is exp(s - m), and 0 for a masked score or a row that saw nothing. */
    ASSERT_NEAR(krn_tc_prob(1.5f, 2.0f), expf(-0.5f), 1e-6);
    ASSERT_EQ(krn_tc_prob(-INFINITY, 2.0f), 0.0f);
    ASSERT_EQ(krn_tc_prob(-INFINITY, -INFINITY), 0.0f);
}

/* ---- the whole CTA ------------------------------------------------------------------------ */

/* Runs one task as tc_run<hd_max, warps> (krn_attn_tc.cu) does, warp by warp, lane by
 * lane. */
static void emu_tc_task(const krn_attn_args_t *a, const krn_attn_task_t *t, int32_t HD,
                        int32_t warps)
{
    const int32_t BC = krn_tc_tile_kv(HD), QS = HD + KRN_TC_PAD, KS = BC + KRN_TC_PAD,
                  VS = HD + KRN_TC_PAD, NT = BC / 8, ND = HD / 8;
    size_t smem = krn_tc_smem_bytes(HD, warps);
    const int32_t ROWS = warps * 16;
    uint16_t *sq = malloc(smem);
    memset(sq, 0xff, smem); /* garbage: every element must be written before it is read */
    uint16_t *sk = sq + ROWS * QS, *sv = sk + 2 * HD * KS;
    PC_ASSERT((size_t)(sv + 2 * BC * VS - sq) * 2 == smem);
    const int32_t hd = a->kv.head_dim, bt = a->kv.block_tokens;
    const int32_t group = a->n_head / a->kv.n_head_kv, qw = a->n_head * hd, R = t->n_rows * group;
    PC_ASSERT(t->n_rows > 1 && R <= ROWS && hd <= HD);
    const int32_t nk = hd / 16;
    for (int32_t r = 0; r < ROWS; r++)
        for (int32_t d = 0; d < HD; d++) {
            float x = 0;
            if (r < R && d < hd)
                x = a->q[(int64_t)(t->row0 + r / group) * qw +
                         ((int64_t)t->kv_head * group + r % group) * hd + d];
            sq[r * QS + d] = krn_f32_to_f16(x);
        }
    const int32_t last_pos = a->row_pos[t->row0 + t->n_rows - 1];
    const int32_t kv_end = krn_tc_kv_end(t->kv1, last_pos);
    const int32_t tile0 = krn_tc_first_tile(t->kv0, BC);
    const int32_t n_tiles = kv_end > t->kv0 ? (kv_end - tile0 + BC - 1) / BC : 0;
    const int32_t *table = a->block_tables + (int64_t)t->seq * a->max_blocks;
    const uint16_t *kvb = a->kv.base;
    const int64_t slice = (int64_t)2 * hd * bt;
    /* The warps' state. */
    float(*o)[32][4] = calloc((size_t)warps * ND, sizeof *o); /* [warp * ND + n] */
    float m[KRN_TC_MAX_WARPS][32][2], l[KRN_TC_MAX_WARPS][32][2];
    for (int w = 0; w < warps; w++)
        for (int ln = 0; ln < 32; ln++)
            m[w][ln][0] = m[w][ln][1] = -INFINITY, l[w][ln][0] = l[w][ln][1] = 0;
    float(*s)[32][4] = malloc(sizeof *s * (size_t)NT);
    for (int32_t it = 0; it < n_tiles; it++) {
        const int32_t p0 = tile0 + it * BC;
        uint16_t *dk = sk + (it & 1) * HD * KS, *dv = sv + (it & 1) * BC * VS;
        for (int32_t c = 0; c < HD * (BC / 8); c++) {
            int32_t d = c / (BC / 8), j8 = c % (BC / 8), p = p0 + 8 * j8;
            uint16_t *dst = dk + d * KS + 8 * j8;
            if (d < hd && krn_tc_k_chunk_live(p, t->kv0, kv_end)) {
                int32_t blk = table[p / bt];
                PC_ASSERT(blk >= 0 && blk < a->kv.n_blocks && p % 8 == 0 && bt % 8 == 0);
                int64_t base =
                    (((int64_t)blk * a->kv.n_layer + a->layer) * a->kv.n_head_kv + t->kv_head) *
                    slice;
                int64_t off = krn_tc_k_off(base, d, p, bt);
                PC_ASSERT(off % 8 == 0); /* 16-byte aligned */
                memcpy(dst, kvb + off, 16);
            } else {
                memset(dst, 0, 16);
            }
        }
        for (int32_t c = 0; c < BC * (HD / 8); c++) {
            int32_t j = c / (HD / 8), d = 8 * (c % (HD / 8)), p = p0 + j;
            uint16_t *dst = dv + j * VS + d;
            if (d < hd && krn_tc_v_row_live(p, t->kv0, kv_end)) {
                int32_t blk = table[p / bt];
                PC_ASSERT(blk >= 0 && blk < a->kv.n_blocks);
                int64_t base =
                    (((int64_t)blk * a->kv.n_layer + a->layer) * a->kv.n_head_kv + t->kv_head) *
                    slice;
                int64_t off = krn_tc_v_off(base, d, p, hd, bt);
                PC_ASSERT(off % 8 == 0);
                memcpy(dst, kvb + off, 16);
            } else {
                memset(dst, 0, 16);
            }
        }
        for (int w = 0; w < warps; w++) {
            const int32_t r0w = w * 16;
            if (r0w >= R)
                continue;
            const int32_t warp_last = r0w + 15 < R - 1 ? r0w + 15 : R - 1;
            if (p0 > a->row_pos[t->row0 + warp_last / group])
                continue;
            int32_t pos[32][2];
            for (int ln = 0; ln < 32; ln++)
                for (int h = 0; h < 2; h++) {
                    int32_t r = r0w + krn_mma_c_row(ln, 2 * h);
                    pos[ln][h] = r < R ? a->row_pos[t->row0 + r / group] : -1;
                }
            memset(s, 0, sizeof *s * (size_t)NT);
            int64_t addr[32];
            uint32_t af[32][4], bf[32][4], b0[32][2], b1[32][2];
            for (int kk = 0; kk < nk; kk++) {
                for (int ln = 0; ln < 32; ln++)
                    addr[ln] =
                        (int64_t)(r0w + krn_ldm_x4_row(ln)) * QS + kk * 16 + krn_ldm_x4_col(ln);
                emu_ldm_x4(af, sq, addr, false);
                for (int np = 0; np < NT / 2; np++) {
                    for (int ln = 0; ln < 32; ln++)
                        addr[ln] = (int64_t)(dk - sq) +
                                   (int64_t)(kk * 16 + krn_ldm_x4_row(ln)) * KS + np * 16 +
                                   krn_ldm_x4_col(ln);
                    emu_ldm_x4(bf, sq, addr, true);
                    for (int ln = 0; ln < 32; ln++) {
                        b0[ln][0] = bf[ln][0], b0[ln][1] = bf[ln][1];
                        b1[ln][0] = bf[ln][2], b1[ln][1] = bf[ln][3];
                    }
                    emu_mma(s[2 * np], af, b0);
                    emu_mma(s[2 * np + 1], af, b1);
                }
            }
            float tmax[2][32], corr[32][2], rsum[32][2];
            for (int ln = 0; ln < 32; ln++) {
                tmax[0][ln] = tmax[1][ln] = -INFINITY;
                rsum[ln][0] = rsum[ln][1] = 0;
                for (int n = 0; n < NT; n++)
                    for (int i = 0; i < 4; i++) {
                        int32_t p = p0 + n * 8 + krn_mma_c_col(ln, i);
                        if (!krn_tc_visible(p, t->kv0, kv_end, pos[ln][i >> 1]))
                            s[n][ln][i] = -INFINITY;
                        tmax[i >> 1][ln] = fmaxf(tmax[i >> 1][ln], s[n][ln][i]);
                    }
            }
            for (int h = 0; h < 2; h++) {
                emu_xor_reduce(tmax[h], true);
                for (int ln = 0; ln < 32; ln++) {
                    float mn = krn_sm_max(m[w][ln][h], tmax[h][ln]);
                    corr[ln][h] = krn_sm_scale(m[w][ln][h], mn);
                    m[w][ln][h] = mn;
                }
            }
            for (int ln = 0; ln < 32; ln++) {
                for (int n = 0; n < NT; n++)
                    for (int i = 0; i < 4; i++) {
                        float p = krn_tc_prob(s[n][ln][i], m[w][ln][i >> 1]);
                        s[n][ln][i] = p;
                        rsum[ln][i >> 1] += p;
                    }
                for (int h = 0; h < 2; h++)
                    l[w][ln][h] = l[w][ln][h] * corr[ln][h] + rsum[ln][h];
                for (int n = 0; n < ND; n++)
                    for (int i = 0; i < 4; i++)
                        o[w * ND + n][ln][i] *= corr[ln][i >> 1];
            }
            for (int kk = 0; kk < BC / 16; kk++) {
                uint32_t pa[32][4];
                for (int ln = 0; ln < 32; ln++) {
                    pa[ln][0] = pack_f(s[2 * kk][ln][0], s[2 * kk][ln][1]);
                    pa[ln][1] = pack_f(s[2 * kk][ln][2], s[2 * kk][ln][3]);
                    pa[ln][2] = pack_f(s[2 * kk + 1][ln][0], s[2 * kk + 1][ln][1]);
                    pa[ln][3] = pack_f(s[2 * kk + 1][ln][2], s[2 * kk + 1][ln][3]);
                }
                for (int np = 0; np < nk; np++) {
                    for (int ln = 0; ln < 32; ln++)
                        addr[ln] = (int64_t)(dv - sq) +
                                   (int64_t)(kk * 16 + krn_ldm_x4_row(ln)) * VS + np * 16 +
                                   krn_ldm_x4_col(ln);
                    emu_ldm_x4(bf, sq, addr, true);
                    for (int ln = 0; ln < 32; ln++) {
                        b0[ln][0] = bf[ln][0], b0[ln][1] = bf[ln][1];
                        b1[ln][0] = bf[ln][2], b1[ln][1] = bf[ln][3];
                    }
                    emu_mma(o[w * ND + 2 * np], pa, b0);
                    emu_mma(o[w * ND + 2 * np + 1], pa, b1);
                }
            }
        }
    }
    for (int w = 0; w < warps; w++) {
        const int32_t r0w = w * 16;
        for (int h = 0; h < 2; h++) {
            float v[32];
            for (int ln = 0; ln < 32; ln++)
                v[ln] = l[w][ln][h];
            emu_xor_reduce(v, false);
            for (int ln = 0; ln < 32; ln++)
                l[w][ln][h] = v[ln];
        }
        if (r0w >= R)
            continue;
        for (int ln = 0; ln < 32; ln++)
            for (int n = 0; n < ND; n++)
                for (int i = 0; i < 4; i++) {
                    int32_t r = r0w + krn_mma_c_row(ln, i), d = n * 8 + krn_mma_c_col(ln, i);
                    if (r >= R || d >= hd)
                        continue;
                    if (t->part < 0)
                        a->out[(int64_t)(t->row0 + r / group) * qw +
                               ((int64_t)t->kv_head * group + r % group) * hd + d] =
                            o[w * ND + n][ln][i] * krn_sm_inv(l[w][ln][i >> 1]);
                    else
                        a->part_o[((int64_t)t->part + r) * hd + d] = o[w * ND + n][ln][i];
                }
        if (t->part >= 0)
            for (int ln = 0; ln < 32; ln += 4)
                for (int h = 0; h < 2; h++) {
                    int32_t r = r0w + krn_mma_c_row(ln, 2 * h);
                    if (r < R) {
                        a->part_ml[2 * ((int64_t)t->part + r)] = m[w][ln][h];
                        a->part_ml[2 * ((int64_t)t->part + r) + 1] = l[w][ln][h];
                    }
                }
    }
    free(s);
    free(o);
    free(sq);
}

/* The tensor-core launch: CTA c of krn_tc_ctas as attn_tc_kernel<hd_max, warps> runs it
 * (tasks joined by krn_tc_pair, or one after the other). Counts the joined pairs. */
static void emu_tc_launch(const krn_attn_args_t *a, int32_t warps, int32_t *n_joined)
{
    int32_t HD = krn_tc_hd_class(a->kv.head_dim), group = a->n_head / a->kv.n_head_kv;
    for (int32_t c = 0; c < krn_tc_ctas(a->n_tasks, warps); c++) {
        int32_t hi = a->n_tasks - 1 - c * (warps / 4);
        const krn_attn_task_t *th = &a->tasks[hi];
        if (warps == 4 || hi == 0) {
            if (th->n_rows > 1)
                emu_tc_task(a, th, HD, warps);
            continue;
        }
        const krn_attn_task_t *tl = &a->tasks[hi - 1];
        krn_attn_task_t joined;
        if (tl->n_rows > 1 && th->n_rows > 1 &&
            krn_tc_pair(tl, th, group, a->row_pos[tl->row0 + tl->n_rows - 1],
                        a->row_pos[th->row0 + th->n_rows - 1], warps * 16, &joined)) {
            emu_tc_task(a, &joined, HD, warps);
            ++*n_joined;
        } else {
            if (th->n_rows > 1)
                emu_tc_task(a, th, HD, warps);
            if (tl->n_rows > 1)
                emu_tc_task(a, tl, HD, warps);
        }
    }
}

/* krn_attention's split: the SIMT path (the reference) for single-token tasks and the merges,
 * the emulated tensor-core launch for the others. */
static void emu_attention(const krn_attn_args_t *a, int32_t warps, int32_t *n_joined)
{
    krn_attn_args_t simt = *a;
    krn_attn_task_t *one = malloc(sizeof *one * (size_t)(a->n_tasks + 1));
    int32_t n1 = 0;
    for (int32_t i = 0; i < a->n_tasks; i++)
        if (a->tasks[i].n_rows <= 1)
            one[n1++] = a->tasks[i];
    simt.tasks = one;
    simt.n_tasks = n1;
    emu_tc_launch(a, warps, n_joined);
    PC_ASSERT(krn_ref_attention(&simt) == 0);
    free(one);
}

/* One scenario: emulated kernel (CTAs of `warps` warps) vs krn_ref_attention; returns the
 * relative L2 error. */
static double tc_case(kt_rng_t *r, int32_t nh, int32_t nkv, int32_t hd, int32_t bt, int32_t n_seqs,
                      int32_t max_blocks, int32_t max_new, bool no_prefix, int32_t split_kv,
                      int32_t warps, int32_t *n_joined)
{
    int32_t ctx[8], nt[8];
    for (int32_t s = 0; s < n_seqs; s++) {
        int32_t cap = max_blocks * bt;
        int32_t lim = cap < max_new ? cap : max_new;
        nt[s] = 1 + (int32_t)kt_below(r, (uint32_t)lim);
        if (s == 1 && nt[s] < 2)
            nt[s] = 2; /* at least one multi-token task */
        ctx[s] = no_prefix ? 0 : (int32_t)kt_below(r, (uint32_t)(cap - nt[s] + 1));
        if (s == 0 && !no_prefix)
            ctx[s] = cap - nt[s];
    }
    kt_attn_t t;
    PC_ASSERT(kt_attn_make(&t, r, nh, nkv, hd, bt, KRN_F16, n_seqs, ctx, nt, max_blocks) == 0);
    krn_attn_args_t a;
    PC_ASSERT(kt_attn_plan(&t, split_kv, &a) == 0);
    PC_ASSERT(krn_attn_tc_check(&t.kv, nh) == 0);
    int64_t n_out = (int64_t)t.n_rows * nh * hd;
    PC_ASSERT(krn_ref_attention(&a) == 0);
    float *want = malloc(sizeof(float) * (size_t)n_out);
    memcpy(want, t.out, sizeof(float) * (size_t)n_out);
    for (int64_t i = 0; i < n_out; i++)
        t.out[i] = NAN;
    emu_attention(&a, warps, n_joined);
    double err = kt_rel_err_f(t.out, want, n_out);
    free(want);
    kt_attn_plan_free(&a);
    kt_attn_free(&t);
    return err;
}

PC_TEST(emulated_kernel_matches_reference)
{
    kt_rng_t r = {31};
    const struct {
        int32_t nh, nkv, hd, bt;
    } shapes[] = {{8, 1, 64, 16},   {8, 8, 64, 32},  {32, 4, 128, 16}, {4, 4, 128, 64},
                  {16, 2, 80, 8},   {6, 3, 16, 16},  {8, 2, 256, 16},  {12, 4, 96, 128},
                  {16, 16, 48, 32}, {7, 7, 128, 32}, {14, 2, 64, 64},  {4, 1, 256, 32}};
    double worst = 0;
    int32_t joined = 0;
    for (size_t i = 0; i < PC_ARRAY_LEN(shapes); i++) {
        int32_t bt = shapes[i].bt;
        /* Cached prefixes, then prompts from position 0; several sequences in one batch; CTAs
         * of 8 warps (the default: pairs of tasks) and of 4 (KVGW_CUDA_ATTN=tc64). */
        int32_t warps = i % 3 == 2 ? 4 : 8;
        double e1 = tc_case(&r, shapes[i].nh, shapes[i].nkv, shapes[i].hd, bt, 3, 1 + 150 / bt, 110,
                            false, 0, warps, &joined);
        double e2 = tc_case(&r, shapes[i].nh, shapes[i].nkv, shapes[i].hd, bt, 2, 1 + 120 / bt, 120,
                            true, 4 * bt, 12 - warps, &joined);
        if (e1 > 2e-3 || e2 > 2e-3)
            printf("  shape %zu (%d/%d heads, hd %d, bt %d): rel err %.2e, %.2e\n", i, shapes[i].nh,
                   shapes[i].nkv, shapes[i].hd, bt, e1, e2);
        ASSERT_LE(e1, 2e-3);
        ASSERT_LE(e2, 2e-3);
        worst = e1 > worst ? e1 : worst;
        worst = e2 > worst ? e2 : worst;
    }
    printf("  worst relative L2 error %.2e (tolerance 2e-3), %d joined task pairs\n", worst,
           joined);
    ASSERT_TRUE(joined > 20); /* the 8-warp path joined tasks, not only ran them one by one */
}

/* A split task of several tokens (the plan makes none, the kernel takes them): partial states
 * that the reference's merge turns into the same output. */
PC_TEST(emulated_kernel_split_tasks_merge)
{
    kt_rng_t r = {41};
    int32_t nh = 8, nkv = 2, hd = 64, bt = 16, ctx[1] = {100}, nt[1] = {13};
    kt_attn_t t;
    ASSERT_EQ(kt_attn_make(&t, &r, nh, nkv, hd, bt, KRN_F16, 1, ctx, nt, 8), 0);
    krn_attn_args_t a;
    ASSERT_EQ(kt_attn_plan(&t, 0, &a), 0);
    int64_t n_out = (int64_t)t.n_rows * nh * hd;
    ASSERT_EQ(krn_ref_attention(&a), 0);
    float *want = malloc(sizeof(float) * (size_t)n_out);
    memcpy(want, t.out, sizeof(float) * (size_t)n_out);
    /* Each KV head's 13 rows over [0, 37), [37, 90) and [90, 113): three splits, the first
     * and second ragged against the tile. */
    const int32_t cut[4] = {0, 37, 90, 113};
    int32_t group = nh / nkv, w = 13 * group;
    krn_attn_task_t tasks[2 * 3];
    krn_attn_merge_t merges[2];
    float *po = malloc(sizeof(float) * (size_t)2 * 3 * w * hd),
          *pml = malloc(sizeof(float) * 2 * 3 * w * 2);
    for (int32_t h = 0; h < nkv; h++) {
        merges[h] = (krn_attn_merge_t){
            .row0 = 0, .n_rows = 13, .kv_head = h, .part0 = h * 3 * w, .n_splits = 3};
        for (int32_t k = 0; k < 3; k++)
            tasks[h * 3 + k] = (krn_attn_task_t){.seq = 0,
                                                 .kv_head = h,
                                                 .row0 = 0,
                                                 .n_rows = 13,
                                                 .kv0 = cut[k],
                                                 .kv1 = cut[k + 1],
                                                 .part = h * 3 * w + k * w};
    }
    krn_attn_args_t b = a;
    b.tasks = tasks;
    b.n_tasks = 6;
    b.merges = merges;
    b.n_merges = 2;
    b.part_o = po;
    b.part_ml = pml;
    for (int64_t i = 0; i < n_out; i++)
        t.out[i] = NAN;
    for (int32_t i = 0; i < 6; i++)
        emu_tc_task(&b, &tasks[i], krn_tc_hd_class(hd), 4 + 4 * (i % 2));
    krn_attn_args_t mg = b; /* the merges alone */
    mg.n_tasks = 0;
    ASSERT_EQ(krn_ref_attention(&mg), 0);
    double err = kt_rel_err_f(t.out, want, n_out);
    free(po);
    free(pml);
    free(want);
    kt_attn_plan_free(&a);
    kt_attn_free(&t);
    ASSERT_LE(err, 2e-3);
}

/* ---- geometry and dispatch ---------------------------------------------------------------- */

PC_TEST(tile_geometry_on_many_shapes)
{
    /* Shared memory fits sm_80 (163 KiB) and sm_90 (227 KiB) opt-in limits. */
    for (int32_t hd = 16; hd <= 256; hd += 16) {
        int32_t c = krn_tc_hd_class(hd);
        ASSERT_TRUE(c >= hd && (c == 64 || c == 128 || c == 256));
        ASSERT_LE(krn_tc_smem_bytes(c, 4), (size_t)163 << 10);
        ASSERT_LE(krn_tc_smem_bytes(c, 8), (size_t)163 << 10);
        ASSERT_EQ(krn_tc_tile_kv(c) % 16, 0);
    }
    ASSERT_EQ(krn_tc_smem_bytes(128, 4), (size_t)89088);
    ASSERT_EQ(krn_tc_smem_bytes(128, 8), (size_t)106496);
    kt_rng_t r = {3};
    const int32_t bts[] = {8, 16, 32, 64, 128};
    for (int rep = 0; rep < 400; rep++) {
        int32_t group = 1 + (int32_t)kt_below(&r, 8), nkv = 1 + (int32_t)kt_below(&r, 4);
        int32_t hd = 16 * (1 + (int32_t)kt_below(&r, 16)), bt = bts[kt_below(&r, 5)];
        krn_plan_params_t pp = {.n_head = group * nkv,
                                .n_head_kv = nkv,
                                .head_dim = hd,
                                .split_kv = rep % 2 ? 4 * bt : 0};
        krn_plan_seq_t seqs[4];
        int32_t row = 0;
        for (int s = 0; s < 4; s++) {
            seqs[s] = (krn_plan_seq_t){.row0 = row,
                                       .n_tokens = 1 + (int32_t)kt_below(&r, 300),
                                       .pos0 = rep % 3 ? (int32_t)kt_below(&r, 1000) : 0};
            row += seqs[s].n_tokens;
        }
        int32_t nt, nm, np;
        ASSERT_EQ(krn_attn_plan(&pp, seqs, 4, NULL, &nt, NULL, &nm, &np), 0);
        krn_attn_task_t *tasks = malloc(sizeof *tasks * (size_t)nt);
        krn_attn_merge_t *merges = malloc(sizeof *merges * (size_t)(nm + 1));
        ASSERT_EQ(krn_attn_plan(&pp, seqs, 4, tasks, &nt, merges, &nm, &np), 0);
        const int32_t BC = krn_tc_tile_kv(krn_tc_hd_class(hd));
        for (int32_t i = 0; i < nt; i++) {
            const krn_attn_task_t *t = &tasks[i];
            ASSERT_LE(t->n_rows * group, KRN_TC_ROWS);
            if (t->n_rows <= 1)
                continue;
            ASSERT_EQ(t->part, -1); /* multi-token tasks are never split */
            const krn_plan_seq_t *sq = &seqs[t->seq];
            int32_t last_pos = sq->pos0 + (t->row0 - sq->row0) + t->n_rows - 1;
            int32_t kv_end = krn_tc_kv_end(t->kv1, last_pos), tile0 = krn_tc_first_tile(t->kv0, BC);
            ASSERT_EQ(kv_end, last_pos + 1);
            ASSERT_TRUE(tile0 <= t->kv0 && tile0 % BC == 0 && t->kv0 - tile0 < BC);
            int32_t n_tiles = (kv_end - tile0 + BC - 1) / BC;
            /* Every position a row sees in exactly one tile; the live chunks read written
             * positions' blocks only (the block of their first live position). */
            for (int32_t tr = 0; tr < t->n_rows; tr++) {
                int32_t pos = sq->pos0 + (t->row0 - sq->row0) + tr, seen = 0;
                for (int32_t it = 0; it < n_tiles; it++)
                    for (int32_t j = 0; j < BC; j++)
                        seen += krn_tc_visible(tile0 + it * BC + j, t->kv0, kv_end, pos);
                ASSERT_EQ(seen, pos + 1 - t->kv0);
            }
            for (int32_t it = 0; it < n_tiles; it++)
                for (int32_t j8 = 0; j8 < BC; j8 += 8) {
                    int32_t p = tile0 + it * BC + j8;
                    if (!krn_tc_k_chunk_live(p, t->kv0, kv_end))
                        continue;
                    ASSERT_TRUE(p < kv_end);                     /* the block of p is written */
                    ASSERT_EQ(p / bt, (p + 7) / bt);             /* one block */
                    ASSERT_EQ(krn_tc_k_off(0, 3, p, bt) % 8, 0); /* 16-byte aligned */
                    for (int32_t j = 0; j < 8; j++)
                        ASSERT_EQ(krn_tc_v_row_live(p + j, t->kv0, kv_end), p + j < kv_end);
                }
        }
        /* The 8-warp CTAs' pairs: joined only within one sequence and KV head, rows
         * contiguous, at most 128 row-heads, and every row's range unchanged (full causal). */
        int32_t n_joined = 0, n_pairs = 0;
        for (int32_t c = 0; c < krn_tc_ctas(nt, 8); c++) {
            int32_t hi = nt - 1 - 2 * c;
            ASSERT_TRUE(hi >= 0);
            if (hi == 0)
                continue;
            const krn_attn_task_t *lo = &tasks[hi - 1], *th = &tasks[hi];
            const krn_plan_seq_t *sl = &seqs[lo->seq], *sh = &seqs[th->seq];
            int32_t lo_last = sl->pos0 + (lo->row0 - sl->row0) + lo->n_rows - 1;
            int32_t hi_last = sh->pos0 + (th->row0 - sh->row0) + th->n_rows - 1;
            krn_attn_task_t j;
            bool same = lo->seq == th->seq && lo->kv_head == th->kv_head && lo->n_rows > 1 &&
                        th->n_rows > 1;
            n_pairs += same && (lo->n_rows + th->n_rows) * group <= 128;
            if (!krn_tc_pair(lo, th, group, lo_last, hi_last, 128, &j))
                continue;
            n_joined++;
            ASSERT_TRUE(same);
            ASSERT_EQ(j.row0, lo->row0);
            ASSERT_EQ(j.n_rows, lo->n_rows + th->n_rows);
            ASSERT_LE(j.n_rows * group, 128);
            ASSERT_EQ(j.kv0, 0);
            ASSERT_EQ(krn_tc_kv_end(j.kv1, hi_last), hi_last + 1);
            ASSERT_EQ(j.part, -1);
        }
        ASSERT_EQ(n_joined, n_pairs); /* every joinable pair is joined */
        free(tasks);
        free(merges);
    }
    /* Pairs that must not join: another KV head, a gap in the rows, a split, a range that
     * stops short of a row, too many rows. */
    krn_attn_task_t
        lo = {.seq = 0, .kv_head = 1, .row0 = 0, .n_rows = 8, .kv0 = 0, .kv1 = 108, .part = -1},
        hi = {.seq = 0, .kv_head = 1, .row0 = 8, .n_rows = 8, .kv0 = 0, .kv1 = 116, .part = -1}, j,
        x;
    ASSERT_TRUE(krn_tc_pair(&lo, &hi, 8, 107, 115, 128, &j));
    ASSERT_EQ(j.n_rows, 16);
    ASSERT_EQ(j.kv1, 116);
    x = hi, x.kv_head = 2;
    ASSERT_FALSE(krn_tc_pair(&lo, &x, 8, 107, 115, 128, &j));
    x = hi, x.row0 = 9;
    ASSERT_FALSE(krn_tc_pair(&lo, &x, 8, 107, 116, 128, &j));
    x = hi, x.part = 0;
    ASSERT_FALSE(krn_tc_pair(&lo, &x, 8, 107, 115, 128, &j));
    x = lo, x.kv1 = 100;
    ASSERT_FALSE(krn_tc_pair(&x, &hi, 8, 107, 115, 128, &j));
    ASSERT_FALSE(krn_tc_pair(&lo, &hi, 8, 107, 115, 64, &j));
    ASSERT_FALSE(krn_tc_pair(&lo, &hi, 9, 107, 115, 128, &j));
}

PC_TEST(dispatch_takes_f16_shapes_and_the_env_override)
{
    krn_kv_t kv = {.n_blocks = 4,
                   .n_layer = 1,
                   .n_head_kv = 8,
                   .head_dim = 128,
                   .block_tokens = 16,
                   .dtype = KRN_F16};
    ASSERT_EQ(krn_attn_tc_check(&kv, 32), 0);
    ASSERT_TRUE(krn_attn_use_tc(&kv, 32, NULL));
    ASSERT_TRUE(krn_attn_use_tc(&kv, 32, "tc"));
    ASSERT_FALSE(krn_attn_use_tc(&kv, 32, "simt"));
    ASSERT_EQ(krn_attn_tc_warps(NULL), 8);
    ASSERT_EQ(krn_attn_tc_warps("tc"), 8);
    ASSERT_EQ(krn_attn_tc_warps("tc64"), 4);
    ASSERT_TRUE(krn_attn_use_tc(&kv, 32, "tc64"));
    kv.dtype = KRN_F32; /* F32 pools stay on the SIMT kernel */
    ASSERT_EQ(krn_attn_tc_check(&kv, 32), PC_ERR_INVAL);
    ASSERT_FALSE(krn_attn_use_tc(&kv, 32, NULL));
    kv.dtype = KRN_F16;
    kv.head_dim = 72; /* not a multiple of 16 */
    ASSERT_EQ(krn_attn_tc_check(&kv, 32), PC_ERR_INVAL);
    kv.head_dim = 272;
    ASSERT_EQ(krn_attn_tc_check(&kv, 32), PC_ERR_INVAL);
    kv.head_dim = 256;
    ASSERT_EQ(krn_attn_tc_check(&kv, 32), 0);
    kv.block_tokens = 12; /* chunks of 8 positions would straddle blocks */
    ASSERT_EQ(krn_attn_tc_check(&kv, 32), PC_ERR_INVAL);
    kv.block_tokens = 8;
    ASSERT_EQ(krn_attn_tc_check(&kv, 30), PC_ERR_INVAL); /* 30 heads over 8 KV heads */
    ASSERT_EQ(krn_attn_tc_check(&kv, 8), 0);
}

PC_TEST_MAIN()
