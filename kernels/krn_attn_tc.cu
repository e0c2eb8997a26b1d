/*
 * krn_attn_tc.cu — prefill attention over the paged KV pool on tensor cores: FlashAttention-2's
 * loop with mma.sync.m16n8k16 (F16 inputs, F32 accumulation), for the tasks of krn_attn_plan
 * that hold more than one token. Runs on sm_80 and later (sm_90 included: mma.sync, ldmatrix
 * and cp.async are all sm_80 instructions).
 *
 * Launch geometry: CTAs of WARPS warps (krn_attn_tc_warps: 8 by default, 4 under
 * KVGW_CUDA_ATTN=tc64) in reverse task order (a sequence's later rows see more positions, so
 * the longest tasks start first). A 4-warp CTA runs one task; an 8-warp CTA runs two
 * consecutive tasks, joined into one of up to 128 rows when krn_tc_pair allows (the plan's
 * tasks of one sequence and KV head: each K/V tile is then read once for twice the rows),
 * else one after the other. Row-head r of the (joined) task (token r / group, query head
 * kv_head * group + r % group: the GQA group's heads packed with the tokens, so every K/V tile
 * is read once for the whole group) is row r of the CTA's query tile; warp w owns rows 16w ..
 * 16w + 15. Shared memory (krn_hostdev.h):
 *
 *   1. Q is converted to F16 into shared memory (zeros past the task's rows and head_dim) and,
 *      for head dims up to 128, kept in registers as A fragments.
 *   2. K/V tiles of krn_tc_tile_kv positions (64; 32 for head_dim > 128) are copied from the
 *      blocks with 16-byte cp.async (K: 8 positions of one dimension; V: 8 dimensions of one
 *      position), double buffered: tile i + 1 is in flight while tile i is computed. Chunks
 *      outside [kv0, kv_end) are zero-filled instead (a V row of an unwritten slot would turn
 *      a zero weight into NaN).
 *   3. Each warp computes S = Q K^T for its 16 rows (ldmatrix .trans of K), masks by position
 *      (row at position p sees [kv0, min(kv1, p + 1)): the cached prefix included), runs the
 *      online softmax on its two rows per lane (the 4 lanes of a row reduce with shuffles),
 *      rescales O, turns P into A fragments in registers (F16) and accumulates O += P V
 *      (ldmatrix .trans of V). A warp skips tiles wholly after its last row's position.
 *   4. O is normalized by the row sum and written to out (or, for a split task, the partial
 *      state to part_o / part_ml as the SIMT kernel writes it).
 *
 * The numerics differ from the F32 SIMT kernel by the F16 rounding of Q and of P (11
 * significant bits each): the GPU tests hold it to 2e-3 relative L2 error.
 */
#include <stdlib.h>

#include "krn_cuda.cuh"
#include "krn_hostdev.h"
#include "krn_softmax_merge.h"

namespace
{

__device__ __forceinline__ uint32_t tc_smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void tc_cp_async16(void *dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(tc_smem_addr(dst)), "l"(src)
                 : "memory");
}
__device__ __forceinline__ void tc_cp_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/* Waits until at most one committed group is still in flight. */
__device__ __forceinline__ void tc_cp_wait1()
{
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}

__device__ __forceinline__ void tc_ldm_x4(uint32_t r[4], const __half *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(tc_smem_addr(p))
                 : "memory");
}
__device__ __forceinline__ void tc_ldm_x4_trans(uint32_t r[4], const __half *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(tc_smem_addr(p))
                 : "memory");
}
/* c += a . b on one m16n8k16 tile (fragments as krn_hostdev.h maps them). */
__device__ __forceinline__ void tc_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* Two floats as one .f16x2 register, lo in the low half (the lower column index). */
__device__ __forceinline__ uint32_t tc_pack(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

/* Runs task t (at most WARPS * 16 row-heads) with the whole CTA; every thread calls it. */
template <int HD, int WARPS>
__device__ __forceinline__ void tc_run(const krn_attn_args_t &a, const krn_attn_task_t t,
                                       unsigned char *tc_smem)
{
    constexpr int THREADS = WARPS * 32, ROWS = WARPS * 16;
    constexpr int BC = KRN_TC_TILE_KV(HD);
    constexpr int QS = HD + KRN_TC_PAD, KS = BC + KRN_TC_PAD, VS = HD + KRN_TC_PAD;
    constexpr int NT = BC / 8; /* n-tiles of S */
    constexpr int ND = HD / 8; /* n-tiles of O */
    constexpr bool QREG = HD <= 128;
    __half *sq = reinterpret_cast<__half *>(tc_smem); /* [ROWS][QS] */
    __half *sk = sq + ROWS * QS;                      /* [2][HD][KS] */
    __half *sv = sk + 2 * HD * KS;                    /* [2][BC][VS] */

    const int32_t hd = a.kv.head_dim, bt = a.kv.block_tokens;
    const int32_t group = a.n_head / a.kv.n_head_kv, qw = a.n_head * hd;
    const int32_t R = t.n_rows * group;
    if (t.n_rows <= 1 || R > ROWS || hd > HD || t.kv1 <= t.kv0)
        return; /* a single-token task (the SIMT kernel's), or not a krn_attn_plan task */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int32_t nk = hd / 16; /* k-steps of S, n-tile pairs of O */

    /* 1. Q to F16. Rows past R and dimensions past hd are zeros. */
    for (int32_t i = tid; i < ROWS * (HD / 2); i += THREADS) {
        int32_t r = i / (HD / 2), d = 2 * (i % (HD / 2));
        float x = 0.0f, y = 0.0f;
        if (r < R && d < hd) {
            const float *q = a.q + (int64_t)(t.row0 + r / group) * qw +
                             ((int64_t)t.kv_head * group + r % group) * hd + d;
            x = q[0];
            y = q[1];
        }
        *reinterpret_cast<__half2 *>(sq + r * QS + d) = __floats2half2_rn(x, y);
    }

    const int32_t last_pos = a.row_pos[t.row0 + t.n_rows - 1];
    const int32_t kv_end = krn_tc_kv_end(t.kv1, last_pos);
    const int32_t tile0 = krn_tc_first_tile(t.kv0, BC);
    const int32_t n_tiles = kv_end > t.kv0 ? (kv_end - tile0 + BC - 1) / BC : 0;
    const int32_t *table = a.block_tables + (int64_t)t.seq * a.max_blocks;
    const __half *kvb = reinterpret_cast<const __half *>(a.kv.base);
    const int64_t slice = (int64_t)2 * hd * bt;

    /* Issues the copies of the tile at position p0 into buffer buf. */
    auto load_tile = [&](int32_t p0, int buf) {
        __half *dk = sk + buf * HD * KS, *dv = sv + buf * BC * VS;
        for (int32_t c = tid; c < HD * (BC / 8); c += THREADS) {
            int32_t d = c / (BC / 8), j8 = c % (BC / 8), p = p0 + 8 * j8;
            __half *dst = dk + d * KS + 8 * j8;
            if (d < hd && krn_tc_k_chunk_live(p, t.kv0, kv_end)) {
                int64_t base = (((int64_t)table[p / bt] * a.kv.n_layer + a.layer) * a.kv.n_head_kv +
                                t.kv_head) *
                               slice;
                tc_cp_async16(dst, kvb + krn_tc_k_off(base, d, p, bt));
            } else {
                *reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
            }
        }
        for (int32_t c = tid; c < BC * (HD / 8); c += THREADS) {
            int32_t j = c / (HD / 8), d = 8 * (c % (HD / 8)), p = p0 + j;
            __half *dst = dv + j * VS + d;
            if (d < hd && krn_tc_v_row_live(p, t.kv0, kv_end)) {
                int64_t base = (((int64_t)table[p / bt] * a.kv.n_layer + a.layer) * a.kv.n_head_kv +
                                t.kv_head) *
                               slice;
                tc_cp_async16(dst, kvb + krn_tc_v_off(base, d, p, hd, bt));
            } else {
                *reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
            }
        }
    };

    if (n_tiles > 0)
        load_tile(tile0, 0);
    tc_cp_commit();
    __syncthreads(); /* sq is written */

    /* This warp's rows: the lane's two rows are ra (c0, c1) and ra + 8 (c2, c3). */
    const int32_t r0w = warp * 16;
    const bool warp_active = r0w < R;
    const int32_t ra = r0w + krn_mma_c_row(lane, 0), rb = r0w + krn_mma_c_row(lane, 2);
    const int32_t pos_a = ra < R ? a.row_pos[t.row0 + ra / group] : -1;
    const int32_t pos_b = rb < R ? a.row_pos[t.row0 + rb / group] : -1;
    const int32_t warp_last = r0w + 15 < R - 1 ? r0w + 15 : R - 1;
    const int32_t warp_max_pos = warp_active ? a.row_pos[t.row0 + warp_last / group] : -1;

    uint32_t qf[QREG ? HD / 16 : 1][4];
    if (QREG) {
#pragma unroll
        for (int kk = 0; kk < (QREG ? HD / 16 : 1); kk++)
            if (kk < nk)
                tc_ldm_x4(qf[kk],
                          sq + (r0w + krn_ldm_x4_row(lane)) * QS + kk * 16 + krn_ldm_x4_col(lane));
    }

    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int32_t it = 0; it < n_tiles; it++) {
        const int32_t p0 = tile0 + it * BC;
        if (it + 1 < n_tiles)
            load_tile(p0 + BC, (it + 1) & 1);
        tc_cp_commit();
        tc_cp_wait1();   /* tile it has landed (this thread's copies) */
        __syncthreads(); /* ... and every thread's */
        if (warp_active && p0 <= warp_max_pos) {
            const __half *ck = sk + (it & 1) * HD * KS, *cv = sv + (it & 1) * BC * VS;
            /* S = Q K^T, [16][BC] per warp. */
            float s[NT][4];
#pragma unroll
            for (int n = 0; n < NT; n++)
                s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                if (kk < nk) {
                    uint32_t af[4];
                    if (QREG) {
                        af[0] = qf[QREG ? kk : 0][0];
                        af[1] = qf[QREG ? kk : 0][1];
                        af[2] = qf[QREG ? kk : 0][2];
                        af[3] = qf[QREG ? kk : 0][3];
                    } else {
                        tc_ldm_x4(af, sq + (r0w + krn_ldm_x4_row(lane)) * QS + kk * 16 +
                                          krn_ldm_x4_col(lane));
                    }
#pragma unroll
                    for (int np = 0; np < NT / 2; np++) {
                        uint32_t bf[4];
                        tc_ldm_x4_trans(bf, ck + (kk * 16 + krn_ldm_x4_row(lane)) * KS + np * 16 +
                                                krn_ldm_x4_col(lane));
                        tc_mma(s[2 * np], af, bf[0], bf[1]);
                        tc_mma(s[2 * np + 1], af, bf[2], bf[3]);
                    }
                }
            }
            /* Mask, then the online softmax of the lane's two rows. */
            float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int32_t p = p0 + n * 8 + krn_mma_c_col(lane, i);
                    if (!krn_tc_visible(p, t.kv0, kv_end, (i & 2) ? pos_b : pos_a))
                        s[n][i] = -INFINITY;
                    tmax[i >> 1] = fmaxf(tmax[i >> 1], s[n][i]);
                }
            float corr[2], rsum[2] = {0.0f, 0.0f};
#pragma unroll
            for (int h = 0; h < 2; h++) {
                tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(0xffffffffu, tmax[h], 1));
                tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(0xffffffffu, tmax[h], 2));
                float mn = krn_sm_max(m[h], tmax[h]);
                corr[h] = krn_sm_scale(m[h], mn);
                m[h] = mn;
            }
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float p = krn_tc_prob(s[n][i], m[i >> 1]);
                    s[n][i] = p;
                    rsum[i >> 1] += p;
                }
#pragma unroll
            for (int h = 0; h < 2; h++)
                l[h] = l[h] * corr[h] + rsum[h]; /* this lane's columns; reduced at the end */
#pragma unroll
            for (int n = 0; n < ND; n++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    o[n][i] *= corr[i >> 1];
                    /* O += P V: the C fragments of S tiles 2kk and 2kk + 1 are the A fragment of
                     * k-step kk (krn_hostdev.h's maps; checked by test_krn_tc). */
#pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) {
                uint32_t pa[4] = {tc_pack(s[2 * kk][0], s[2 * kk][1]),
                                  tc_pack(s[2 * kk][2], s[2 * kk][3]),
                                  tc_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                  tc_pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
                for (int np = 0; np < ND / 2; np++) {
                    if (np < nk) {
                        uint32_t bf[4];
                        tc_ldm_x4_trans(bf, cv + (kk * 16 + krn_ldm_x4_row(lane)) * VS + np * 16 +
                                                krn_ldm_x4_col(lane));
                        tc_mma(o[2 * np], pa, bf[0], bf[1]);
                        tc_mma(o[2 * np + 1], pa, bf[2], bf[3]);
                    }
                }
            }
        }
        __syncthreads(); /* buffer it & 1 is free for tile it + 2 */
    }

    /* 4. The row sums over the 4 lanes of each row, then the output. */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
    if (!warp_active)
        return; /* (a CTA's second task starts after a barrier every thread reaches) */
    const float inv[2] = {krn_sm_inv(l[0]), krn_sm_inv(l[1])};
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int32_t r = r0w + krn_mma_c_row(lane, 2 * h), d = n * 8 + krn_mma_c_col(lane, 2 * h);
            if (r >= R || d >= hd)
                continue;
            if (t.part < 0) {
                float *dst = a.out + (int64_t)(t.row0 + r / group) * qw +
                             ((int64_t)t.kv_head * group + r % group) * hd + d;
                dst[0] = o[n][2 * h] * inv[h];
                dst[1] = o[n][2 * h + 1] * inv[h];
            } else {
                float *dst = a.part_o + ((int64_t)t.part + r) * hd + d;
                dst[0] = o[n][2 * h];
                dst[1] = o[n][2 * h + 1];
            }
        }
    if (t.part >= 0 && (lane & 3) == 0) {
        if (ra < R) {
            a.part_ml[2 * ((int64_t)t.part + ra)] = m[0];
            a.part_ml[2 * ((int64_t)t.part + ra) + 1] = l[0];
        }
        if (rb < R) {
            a.part_ml[2 * ((int64_t)t.part + rb)] = m[1];
            a.part_ml[2 * ((int64_t)t.part + rb) + 1] = l[1];
        }
    }
}

/* CTA c runs task hi = n_tasks - 1 - c * (WARPS / 4) and, with 8 warps, task hi - 1: joined
 * with hi when krn_tc_pair allows, else after it. */
template <int HD, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) attn_tc_kernel(krn_attn_args_t a)
{
    extern __shared__ __align__(16) unsigned char tc_smem[];
    const int32_t hi = a.n_tasks - 1 - (int32_t)blockIdx.x * (WARPS / 4);
    krn_attn_task_t first = a.tasks[hi], second = first;
    int n_run = 1;
    if (WARPS == 8 && hi > 0) {
        const krn_attn_task_t lo = a.tasks[hi - 1];
        const int32_t group = a.n_head / a.kv.n_head_kv;
        krn_attn_task_t joined;
        if (lo.n_rows > 1 && first.n_rows > 1 &&
            krn_tc_pair(&lo, &first, group, a.row_pos[lo.row0 + lo.n_rows - 1],
                        a.row_pos[first.row0 + first.n_rows - 1], WARPS * 16, &joined)) {
            first = joined;
        } else {
            second = lo;
            n_run = 2;
        }
    }
    /* One call site, so the body is inlined once. */
    for (int k = 0; k < n_run; k++) {
        if (k > 0)
            __syncthreads(); /* every warp is done with the first task's shared memory */
        tc_run<HD, WARPS>(a, k == 0 ? first : second, tc_smem);
    }
}

template <int HD, int WARPS> int tc_launch(krn_ctx_t *c, const krn_attn_args_t *a)
{
    size_t smem = krn_tc_smem_bytes(HD, WARPS);
    KRN_CUDA_CHECK(cudaFuncSetAttribute(attn_tc_kernel<HD, WARPS>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    attn_tc_kernel<HD, WARPS>
        <<<(unsigned)krn_tc_ctas(a->n_tasks, WARPS), WARPS * 32, smem, c->stream>>>(*a);
    KRN_CUDA_CHECK(cudaGetLastError());
    return 0;
}

template <int WARPS> int tc_dispatch(krn_ctx_t *c, const krn_attn_args_t *a)
{
    switch (krn_tc_hd_class(a->kv.head_dim)) {
    case 64:
        return tc_launch<64, WARPS>(c, a);
    case 128:
        return tc_launch<128, WARPS>(c, a);
    default:
        return tc_launch<256, WARPS>(c, a);
    }
}

} // namespace

int krn_attention_tc(krn_ctx_t *c, const krn_attn_args_t *a)
{
    const krn_kv_t *kv = &a->kv;
    if (krn_attn_tc_check(kv, a->n_head) != 0 || a->layer < 0 || a->layer >= kv->n_layer ||
        a->n_tasks < 0)
        return PC_ERR_INVAL;
    if (a->n_tasks == 0)
        return 0;
    KRN_ENTER(c);
    if (krn_attn_tc_warps(getenv("KVGW_CUDA_ATTN")) == 4)
        return tc_dispatch<4>(c, a);
    return tc_dispatch<KRN_TC_MAX_WARPS>(c, a);
}
