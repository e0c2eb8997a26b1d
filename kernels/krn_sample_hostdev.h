/*
 * krn_sample_hostdev.h — the multi-pass sampler's steps (kernels/krn_sample_radix.cu), compiled
 * both by nvcc for the device and by the host C compiler, so that the host unit test
 * (tests/unit/kernels/test_krn_sample_radix.c) runs the very code the kernels run, with slices
 * of a row standing in for CTAs.
 *
 * The rules are the engine's (engine/sampling.h) as kernels/ref/krn_ref_sample.c computes
 * them: thresholds on the 64-bit candidate key (krn_hostdev.h: the clamped logit's order bits
 * high, 0xffffffff - id low; a larger key comes first), so that every filter keeps the keys
 * >= one threshold. Instead of the reference's 64 bit-by-bit passes, a threshold is found by
 * radix select over histograms of KRN_SMP_BITS-bit digits of the key, from the top:
 *
 *   digit 0..2   the float's order bits: key bits [53, 64), [42, 53), [32, 42)
 *   digit 3..    the id's bits, only the low idb = bits(n_vocab - 1) of them (the id half's
 *                bits above are 1 for every id < n_vocab): 11-bit digits from bit idb down
 *
 * and a search ends as soon as its bucket decides the threshold (top_k: every key of the
 * bucket is taken; top_p: the bucket holds one key), so ties on the id part cost passes only
 * when the boundary logit is tied. A row is a small state machine (krn_smp_state_t), advanced
 * by one pass per launch:
 *
 *   stats   (one launch) every slice: the largest key (greedy's argmax, the max logit), the
 *           number of candidates, and top_k's digit-0 count histogram. Greedy rows and rows
 *           without a candidate are done here.
 *   TOPK    count histograms of the candidates inside the prefix chosen so far; the bucket is
 *           the one where the count from the top reaches top_k (krn_smp_walk_cnt).
 *   TOPP    count and mass (double weights) histograms of the kept candidates (key >= top_k's
 *           threshold, min_p) inside the prefix; the first pass's total gives the target mass
 *           top_p * total, and the bucket is the one where the mass from the top reaches it
 *           (krn_smp_walk_mass).
 *   PICK    each slice sums its kept positive weights; slice sums in id order, the owner slice
 *           (krn_sample_may_own: unique, and present whenever any mass is), then inside it
 *           per-thread chunks, the owner chunk, and its walk (krn_smp_walk_pick).
 *
 * Each pass is one launch of n_rows x slices CTAs; each CTA builds its histogram in shared
 * memory and adds it to the row's global one; the last CTA of the row to arrive (a counter)
 * chooses the bucket and moves the row's state on. Bucket choices split the bins into
 * KRN_SMP_GROUPS contiguous groups (one per thread): a group's suffix start comes from the
 * groups above it, its walk finds the largest qualifying bin in it, and the largest over the
 * groups wins.
 */
#ifndef KRN_SAMPLE_HOSTDEV_H
#define KRN_SAMPLE_HOSTDEV_H

#include <math.h>

#include "krn_hostdev.h"

/* Threads of one sampler CTA, digit width and bins of a histogram, the most slices (CTAs) of
 * one row, and the bin groups of a bucket choice (one per thread). */
#define KRN_SMP_THREADS 256
#define KRN_SMP_BITS 11
#define KRN_SMP_BINS (1 << KRN_SMP_BITS)
#define KRN_SMP_MAX_SLICES 64
#define KRN_SMP_GROUPS KRN_SMP_THREADS
#define KRN_SMP_GROUP_BINS (KRN_SMP_BINS / KRN_SMP_GROUPS)

enum krn_smp_phase { KRN_SMP_DONE = 0, KRN_SMP_TOPK = 1, KRN_SMP_TOPP = 2, KRN_SMP_PICK = 3 };

/* One row's progress, in device scratch between launches. */
typedef struct krn_smp_state {
    uint64_t prefix; /* the digits chosen so far by the running search (lower bits 0) */
    uint64_t lo;     /* keys >= lo are kept (top_k's threshold, then top_p's; 0: all) */
    uint64_t best;   /* the largest raw key (+inf above FLT_MAX), 0 when no candidate */
    double thr;      /* min_p: a candidate needs (double)clamped logit >= thr */
    double inv_t;    /* 1 / temperature */
    double mx;       /* the largest clamped logit */
    double above;    /* TOPP: kept mass above the prefix (the previous passes' buckets) */
    double want;     /* TOPP: top_p times the kept mass; < 0 until the first TOPP pass */
    double u;        /* the draw */
    float top_p;
    int32_t phase; /* enum krn_smp_phase */
    int32_t pass;  /* the running search's digit index */
    int32_t need;  /* TOPK: keys of the prefix still to take */
    int32_t token; /* DONE: the pick (-1: no candidate) */
    int32_t pad;
} krn_smp_state_t;

/* The histogram and the per-slice sums one row accumulates during a pass. */
typedef struct krn_smp_row {
    krn_smp_state_t st;
    unsigned long long best; /* stats: the largest raw key (atomic max) */
    uint32_t n_valid;        /* stats: candidates before min_p (atomic add) */
    uint32_t arrive;         /* CTAs of the row done with this pass */
    uint32_t cnt[KRN_SMP_BINS];
    double mass[KRN_SMP_BINS];
    double slice[KRN_SMP_MAX_SLICES];
} krn_smp_row_t;

/* Bits of the id part that vary: ids < n_vocab fit in bits(n_vocab - 1). */
KRN_HD int32_t krn_smp_id_bits(int32_t n_vocab)
{
    int32_t b = 0;
    while (b < 31 && ((uint32_t)(n_vocab - 1) >> b) != 0)
        b++;
    return b;
}

/* Digits of a full search: 3 float digits and the id part's 11-bit digits. */
KRN_HD int32_t krn_smp_n_digits(int32_t n_vocab)
{
    return 3 + (krn_smp_id_bits(n_vocab) + KRN_SMP_BITS - 1) / KRN_SMP_BITS;
}

/* Digit p's lowest key bit and width. */
KRN_HD void krn_smp_digit(int32_t p, int32_t n_vocab, int32_t *shift, int32_t *width)
{
    if (p < 3) {
        *shift = p == 0 ? 53 : p == 1 ? 42 : 32;
        *width = p == 2 ? 10 : 11;
        return;
    }
    int32_t hi = krn_smp_id_bits(n_vocab) - KRN_SMP_BITS * (p - 3);
    int32_t lo = hi - KRN_SMP_BITS > 0 ? hi - KRN_SMP_BITS : 0;
    *shift = lo;
    *width = hi - lo;
}

/* Launches of one krn_sample call under plan (krn_sample_args_t.plan): stats, then enough
 * passes for a full top_k search (its first digit came with stats), a full top_p search and
 * the pick, less what the plan says no row needs. */
KRN_HD int32_t krn_smp_n_launches(int32_t n_vocab, uint32_t plan)
{
    if (plan & KRN_SAMPLE_GREEDY)
        return 1;
    int32_t nd = krn_smp_n_digits(n_vocab);
    return 1 + ((plan & KRN_SAMPLE_NO_TOPK) ? 0 : nd - 1) + ((plan & KRN_SAMPLE_NO_TOPP) ? 0 : nd) +
           1;
}

/* The most CTAs of one launch: about one wave on an H100 (132 SMs x 7 resident sampler CTAs).
 * Past that, more CTAs per row only add waves, global histogram flushes and the cost of the
 * launches that rows already done return from; large batches keep the SMs busy with rows. */
#define KRN_SMP_MAX_CTAS 1024

/* Slices (CTAs) per row: about 2048 logits each, at most KRN_SMP_MAX_SLICES, and at most
 * KRN_SMP_MAX_CTAS CTAs in all; never an empty slice. *len receives the slice length. */
KRN_HD int32_t krn_smp_slices(int32_t n_vocab, int32_t n_rows, int32_t *len)
{
    int32_t s = (n_vocab + 2047) / 2048;
    int32_t cap = n_rows > 0 ? KRN_SMP_MAX_CTAS / n_rows : 1;
    if (cap < 1)
        cap = 1;
    s = s > KRN_SMP_MAX_SLICES ? KRN_SMP_MAX_SLICES : s;
    s = s > cap ? cap : s;
    s = s < 1 ? 1 : s;
    int32_t l = (n_vocab + s - 1) / s;
    *len = l;
    return (n_vocab + l - 1) / l;
}

/* True when key shares the prefix's digits above digit (shift, width). */
KRN_HD bool krn_smp_in_prefix(uint64_t key, uint64_t prefix, int32_t shift, int32_t width)
{
    int32_t top = shift + width;
    return top >= 64 || (key >> top) == (prefix >> top);
}

KRN_HD uint32_t krn_smp_digit_of(uint64_t key, int32_t shift, int32_t width)
{
    return (uint32_t)(key >> shift) & ((1u << width) - 1u);
}

/* The candidate key (clamped logit) of logit x at id i; 0 when x is not a candidate (NaN, -inf). */
KRN_HD uint64_t krn_smp_key(float x, int32_t i)
{
    return x > -INFINITY ? krn_sample_key(krn_sample_clamp(x), i) : 0;
}

/* The weight of logit x (key k) if it is kept under st (min_p, key >= st->lo), else -1. */
KRN_HD double krn_smp_weight(const krn_smp_state_t *st, float x, uint64_t k)
{
    double xc = (double)krn_sample_clamp(x);
    if (k == 0 || k < st->lo || !(xc >= st->thr))
        return -1.0;
    return exp((xc - st->mx) * st->inv_t);
}

/* The contribution of logit x at id i to this pass's histogram under st, whose digit is (sh,
 * wd) (krn_smp_digit of st->pass): returns false when it has none, else its bin in *bin and
 * (TOPP) its weight in *w. */
KRN_HD bool krn_smp_contrib(const krn_smp_state_t *st, int32_t sh, int32_t wd, float x, int32_t i,
                            uint32_t *bin, double *w)
{
    uint64_t k = krn_smp_key(x, i);
    if (k == 0)
        return false;
    if (!krn_smp_in_prefix(k, st->prefix, sh, wd))
        return false;
    *w = 0.0;
    if (st->phase == KRN_SMP_TOPP) {
        *w = krn_smp_weight(st, x, k);
        if (*w < 0.0)
            return false;
    }
    *bin = krn_smp_digit_of(k, sh, wd);
    return true;
}

/* TOPK's walk over one group of bins [b0, b1) (taken from the top): `base` is the count of the
 * keys above the group. Returns the largest bin where the count from the top reaches `need`,
 * with the count above that bin in *above_bin, or -1. */
KRN_HD int32_t krn_smp_walk_cnt(const uint32_t *cnt, int32_t b0, int32_t b1, int64_t base,
                                int64_t need, int64_t *above_bin)
{
    int64_t cum = base;
    for (int32_t b = b1 - 1; b >= b0; b--) {
        if (cum + (int64_t)cnt[b] >= need) {
            *above_bin = cum;
            return b;
        }
        cum += cnt[b];
    }
    return -1;
}

/* TOPP's walk over one group of bins [b0, b1): the same with masses against `want`; a bin
 * without a key never qualifies (its mass adds nothing). */
KRN_HD int32_t krn_smp_walk_mass(const double *mass, const uint32_t *cnt, int32_t b0, int32_t b1,
                                 double base, double want, double *above_bin)
{
    double cum = base;
    for (int32_t b = b1 - 1; b >= b0; b--) {
        if (cnt[b] > 0 && cum + mass[b] >= want) {
            *above_bin = cum;
            return b;
        }
        cum += mass[b];
    }
    return -1;
}

/* Enters top_p's search, or the pick when top_p is off. */
KRN_HD void krn_smp_enter_topp(krn_smp_state_t *st)
{
    st->prefix = 0;
    st->pass = 0;
    st->above = 0.0;
    st->want = -1.0;
    st->phase = st->top_p < 1.0f ? KRN_SMP_TOPP : KRN_SMP_PICK;
}

/* After stats: best and n_valid over the row, under the row's rules. Greedy rows and rows
 * without a candidate end (DONE, token set); top_k with 0 < top_k < n_valid starts its search
 * at digit 0 (whose histogram stats built: the caller chooses its bucket next); else top_p's
 * search or the pick. */
KRN_HD void krn_smp_start(krn_smp_state_t *st, const krn_sample_row_t *row, uint64_t best,
                          uint32_t n_valid)
{
    st->best = best;
    st->lo = 0;
    st->u = row->u;
    st->top_p = row->top_p;
    st->token = best == 0 ? -1 : krn_sample_key_id(best);
    if (best == 0 || row->temperature == 0.0f || row->top_k == 1) {
        st->phase = KRN_SMP_DONE;
        return;
    }
    /* The best key's logit is the largest one: clamping is monotone. */
    uint32_t hi = (uint32_t)(best >> 32);
    hi = (hi & 0x80000000u) ? (hi & 0x7fffffffu) : ~hi;
    float fx;
#ifdef __CUDA_ARCH__
    fx = __uint_as_float(hi);
#else
    memcpy(&fx, &hi, sizeof fx);
#endif
    st->mx = (double)krn_sample_clamp(fx);
    st->inv_t = 1.0 / (double)row->temperature;
    st->thr =
        row->min_p > 0.0f ? st->mx + (double)row->temperature * log((double)row->min_p) : -INFINITY;
    if (row->top_k > 0 && (uint32_t)row->top_k < n_valid) {
        st->phase = KRN_SMP_TOPK;
        st->pass = 0;
        st->prefix = 0;
        st->need = row->top_k;
        return;
    }
    krn_smp_enter_topp(st);
}

/* TOPK chose bin b (count cnt_b, count_above keys above it in this pass). */
KRN_HD void krn_smp_topk_chosen(krn_smp_state_t *st, int32_t n_vocab, int32_t b, uint32_t cnt_b,
                                int64_t count_above)
{
    int32_t sh, wd;
    krn_smp_digit(st->pass, n_vocab, &sh, &wd);
    st->prefix |= (uint64_t)b << sh;
    st->need -= (int32_t)count_above;
    if ((int64_t)cnt_b == (int64_t)st->need || st->pass + 1 >= krn_smp_n_digits(n_vocab)) {
        st->lo = st->prefix; /* every key of the bucket is in: the threshold is its bottom */
        krn_smp_enter_topp(st);
        return;
    }
    if (st->pass == 2) /* into the id part: its constant high bits */
        st->prefix |= (((uint64_t)1 << 32) - 1) & ~(((uint64_t)1 << krn_smp_id_bits(n_vocab)) - 1);
    st->pass++;
}

/* TOPP chose bin b (count cnt_b, mass_above kept mass above it); b < 0: no bin reached the
 * target (sums rounded below it), and the whole prefix is kept. */
KRN_HD void krn_smp_topp_chosen(krn_smp_state_t *st, int32_t n_vocab, int32_t b, uint32_t cnt_b,
                                double mass_above)
{
    int32_t sh, wd;
    krn_smp_digit(st->pass, n_vocab, &sh, &wd);
    if (b >= 0)
        st->prefix |= (uint64_t)b << sh;
    if (b < 0 || cnt_b <= 1 || st->pass + 1 >= krn_smp_n_digits(n_vocab)) {
        st->lo = st->prefix > st->lo ? st->prefix : st->lo;
        st->phase = KRN_SMP_PICK;
        return;
    }
    st->above = mass_above;
    if (st->pass == 2)
        st->prefix |= (((uint64_t)1 << 32) - 1) & ~(((uint64_t)1 << krn_smp_id_bits(n_vocab)) - 1);
    st->pass++;
}

/* The pick's walk over [i0, i1) of the owner chunk: the first kept id with a positive weight
 * whose running sum from `before` exceeds the target, else the chunk's last such id; -1 only
 * for a chunk without one. */
KRN_HD int32_t krn_smp_walk_pick(const krn_smp_state_t *st, const float *x, int32_t i0, int32_t i1,
                                 double before, double target)
{
    double cum = before;
    int32_t last = -1;
    for (int32_t i = i0; i < i1; i++) {
        double w = krn_smp_weight(st, x[i], krn_smp_key(x[i], i));
        if (w > 0.0) {
            cum += w;
            last = i;
            if (target < cum)
                return i;
        }
    }
    return last;
}

/* The positive kept weight of [i0, i1), summed in id order. */
KRN_HD double krn_smp_range_mass(const krn_smp_state_t *st, const float *x, int32_t i0, int32_t i1)
{
    double s = 0.0;
    for (int32_t i = i0; i < i1; i++) {
        double w = krn_smp_weight(st, x[i], krn_smp_key(x[i], i));
        if (w > 0.0)
            s += w;
    }
    return s;
}

#endif
